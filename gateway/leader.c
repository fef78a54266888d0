/* Leadership among squishd sharing one PostgreSQL model DB: the standby's
 * wait and HTTP answers, and the leader's watchdog (see gw_leader.h). */
#include "gw_http.h"
#include "gw_leader.h"

#include <mdb.h>

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct gw_leader {
    gw_leader_config_t cfg;
    atomic_int *leading;
    const atomic_int *http_port;
    gw_http_t **http;
    gw_http_app_t standby_app; /* the standby's routes, with this as their context */
    mdb_t *db;                 /* the lock lives with this connection's session; NULL with sqlite */
    int poll_ms;
    pthread_t watch;
    int watching;
    atomic_int stop;
    pthread_mutex_t mu;
    char leader[128]; /* standby: the leader's address, as it announced it */
};

static int poll_ms_of(const gw_leader_config_t *cfg)
{
    int ms = cfg->leader_timeout_ms / 10;
    return ms < 50 ? 50 : ms;
}

/* The address this squishd gives standbys and clients: --advertise, else
 * http://HOST:PORT of its listener (the host name for a wildcard address). */
static void advertise_address(const gw_leader_t *l, char *out, size_t outlen)
{
    const gw_leader_config_t *cfg = &l->cfg;
    if (cfg->advertise[0] != '\0') {
        snprintf(out, outlen, "%s", cfg->advertise);
        return;
    }
    char host[64];
    snprintf(host, sizeof(host), "%s", cfg->listen_host);
    if (strcmp(host, "0.0.0.0") == 0 || strcmp(host, "::") == 0 || host[0] == '\0')
        if (gethostname(host, sizeof(host)) != 0)
            snprintf(host, sizeof(host), "localhost");
    /* An IPv6 address is bracketed in a URL. */
    snprintf(out, outlen, strchr(host, ':') != NULL ? "http://[%s]:%d" : "http://%s:%d", host,
             atomic_load(l->http_port));
}

/* ---- the standby's HTTP -------------------------------------------------- */

static void standby_answer(gw_call_t *call)
{
    gw_leader_t *l = call->app;
    if (atomic_load(l->leading)) {
        /* It took the lock and is starting (reading models, workers). */
        gw_send_error(call->req, SQ_NOT_READY, "squishd leads and is starting");
        return;
    }
    char leader[128];
    pthread_mutex_lock(&l->mu);
    snprintf(leader, sizeof(leader), "%s", l->leader);
    pthread_mutex_unlock(&l->mu);
    char why[256];
    snprintf(why, sizeof(why), "this squishd is a standby; the leader is %s",
             leader[0] ? leader : "unknown");
    gw_add_header(call->req, "retry-after", "1");
    gw_send_json(call->req, 503,
                 json_pack("{s:s, s:s, s:s?}", "error", why, "code", sq_err_name(SQ_STANDBY),
                           "leader", leader[0] ? leader : NULL));
}

static void standby_live(gw_call_t *call)
{
    const gw_leader_t *l = call->app;
    gw_send_json(
        call->req, 200,
        json_pack("{s:b, s:s}", "live", 1, "role", atomic_load(l->leading) ? "leader" : "standby"));
}

static void standby_metrics(gw_call_t *call)
{
    static const char text[] = "# HELP squish_leader 1 when this squishd leads, 0 on a standby.\n"
                               "# TYPE squish_leader gauge\n"
                               "squish_leader 0\n";
    call->req->res.status = 200;
    call->req->res.reason = gw_http_reason(200);
    gw_add_header(call->req, "content-type", "text/plain; version=0.0.4");
    gw_send_body(call->req, text, sizeof(text) - 1);
}

static const gw_route_t standby_routes[] = {
    {"GET", "/v2/health/live", "health_live", standby_live, GW_ON_FRONTEND},
    {"GET", "/metrics", "metrics", standby_metrics, GW_ON_FRONTEND},
};

/* ---- opening -------------------------------------------------------------- */

int gw_leader_open(const gw_leader_deps_t *deps, gw_leader_t **out, char *err, size_t errlen)
{
    gw_leader_t *l = sq_xcalloc(1, sizeof(*l));
    l->cfg = deps->cfg;
    l->leading = deps->leading;
    l->http_port = deps->http_port;
    l->http = deps->http;
    l->standby_app = (gw_http_app_t){.routes = standby_routes,
                                     .nroutes = sizeof(standby_routes) / sizeof(standby_routes[0]),
                                     .ctx = l,
                                     .fallback = standby_answer,
                                     .fallback_name = "standby"};
    l->poll_ms = poll_ms_of(&l->cfg);
    pthread_mutex_init(&l->mu, NULL);
    if (!mdb_is_postgres(l->cfg.db_path)) {
        *out = l; /* sqlite: no lock to hold, squishd leads */
        return 0;
    }
    int rc = mdb_open(l->cfg.db_path, &l->db);
    if (rc == 0)
        rc = mdb_session_timeouts(l->db, l->cfg.leader_timeout_ms / 2);
    if (rc != 0) {
        snprintf(err, errlen, "--db: cannot open the leadership connection: %s",
                 l->db != NULL ? mdb_errmsg(l->db) : sq_err_msg(rc));
        mdb_close(l->db);
        pthread_mutex_destroy(&l->mu);
        free(l);
        return rc;
    }
    *out = l;
    return 0;
}

/* ---- taking the lead -------------------------------------------------------- */

/* One try: 1 when this squishd leads now, 0 when another does (its address
 * read), negative on a DB error. */
static int try_lead(gw_leader_t *l)
{
    int leading = 0;
    int rc = mdb_leader_try(l->db, GW_LEADER_LOCK_KEY, &leading);
    if (rc != 0)
        return rc;
    if (leading)
        return 1;
    char who[128] = "";
    if (mdb_leader_who(l->db, GW_LEADER_LOCK_KEY, who, sizeof(who)) == 0) {
        pthread_mutex_lock(&l->mu);
        snprintf(l->leader, sizeof(l->leader), "%s", who);
        pthread_mutex_unlock(&l->mu);
    }
    return 0;
}

int gw_leader_wait(gw_leader_t *l, const gw_http_deps_t *http, const sigset_t *sigs, char *err,
                   size_t errlen)
{
    if (l->db == NULL) {
        atomic_store(l->leading, 1);
        return 0;
    }
    int rc = try_lead(l);
    int standby = rc != 1;
    if (standby) {
        /* Serve as a standby until the lock is ours. */
        if ((rc = gw_http_start(http, &l->standby_app, l->http, err, errlen)) != 0)
            return rc;
        SQ_INFO("standby: another squishd leads leader=%s; trying every %d ms",
                l->leader[0] ? l->leader : "unknown", l->poll_ms);
        int db_down = 0;
        for (;;) {
            struct timespec ts = {.tv_sec = l->poll_ms / 1000,
                                  .tv_nsec = (long)(l->poll_ms % 1000) * 1000000};
            if (sigtimedwait(sigs, NULL, &ts) > 0) {
                SQ_INFO("signal received while standby; stopping");
                gw_http_drain(*l->http, 1000);
                gw_http_stop(*l->http);
                *l->http = NULL;
                return 1;
            }
            rc = try_lead(l);
            if (rc == 1)
                break;
            if (rc < 0 && !db_down)
                SQ_WARN("standby: the model DB does not answer: %s", mdb_errmsg(l->db));
            db_down = rc < 0;
        }
    }
    atomic_store(l->leading, 1);
    SQ_INFO("leader: this squishd leads after_standby=%s", standby ? "yes" : "no");
    return 0;
}

/* ---- the leader's watchdog -------------------------------------------------- */

static void *watch_main(void *arg)
{
    gw_leader_t *l = arg;
    sq_log_set_tag("squishd");
    int db_down = 0;
    while (!atomic_load(&l->stop)) {
        struct timespec ts = {.tv_sec = l->poll_ms / 1000,
                              .tv_nsec = (long)(l->poll_ms % 1000) * 1000000};
        nanosleep(&ts, NULL);
        if (atomic_load(&l->stop))
            break;
        int leading = 0;
        int rc = mdb_leader_try(l->db, GW_LEADER_LOCK_KEY, &leading);
        if (rc == 0 && !leading) {
            /* Our session ended (the DB restarted, or the network cut us
             * off long enough) and another squishd took the lock: two
             * leaders would both drive workers and write plans. */
            SQ_ERROR("lost leadership: another squishd holds the lock; exiting");
            _exit(GW_EXIT_LOST_LEADERSHIP);
        }
        if (rc != 0 && !db_down)
            SQ_WARN("leader: the model DB does not answer; serving on: %s", mdb_errmsg(l->db));
        db_down = rc != 0;
    }
    return NULL;
}

void gw_leader_announce(gw_leader_t *l)
{
    if (l->db == NULL)
        return;
    char self[128];
    advertise_address(l, self, sizeof(self));
    if (mdb_leader_announce(l->db, self) != 0)
        SQ_WARN("cannot announce the leader's address: %s", mdb_errmsg(l->db));
    else
        SQ_INFO("leader: standbys send clients to address=%s", self);
}

int gw_leader_watch(gw_leader_t *l)
{
    if (l->db == NULL)
        return 0;
    int rc = pthread_create(&l->watch, NULL, watch_main, l);
    if (rc != 0)
        return SQ_INTERNAL;
    l->watching = 1;
    return 0;
}

void gw_leader_close(gw_leader_t *l)
{
    if (l == NULL)
        return;
    atomic_store(&l->stop, 1);
    if (l->watching)
        pthread_join(l->watch, NULL);
    mdb_close(l->db);
    pthread_mutex_destroy(&l->mu);
    free(l);
}
