/* gw_main: brings squishd up in order (token, arena, leadership when the
 * model DB is shared, DB thread, dispatch thread and workers, HTTP), waits for SIGTERM/SIGINT, and
 * takes it down in reverse order: stop accepting and drain HTTP, stop workers, close the DB. */
#include "gw_catalog.h"
#include "gw_dispatch.h"
#include "gw_front.h"
#include "gw_api.h"
#include "gw_grpc.h"
#include "gw_http.h"
#include "gw_leader.h"
#include "gw_image.h"
#include "gw_link.h"

#include <errno.h>
#include <libgen.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

/* mkdir -p of the directory part of path. */
static int make_parent_dirs(const char *path, char *err, size_t errlen)
{
    char dir[256];
    snprintf(dir, sizeof(dir), "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash == NULL)
        return 0;
    *slash = '\0';
    for (char *p = dir + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(dir, 0755) != 0 && errno != EEXIST)
            goto fail;
        *p = '/';
    }
    if (dir[0] != '\0' && mkdir(dir, 0755) != 0 && errno != EEXIST)
        goto fail;
    return 0;
fail:
    snprintf(err, errlen, "%s: cannot create directory: %s", dir, strerror(errno));
    return SQ_IO;
}

/* A PostgreSQL model DB has no directory: the files that live next to a
 * sqlite one (the worker socket, the admin token) go where the default
 * sqlite file would be. */
#define GW_STATE_DIR_PG "var/squish.db"

/* The path whose directory holds the DB's neighbours. */
static const char *state_path(const gw_config_t *cfg)
{
    return mdb_is_postgres(cfg->db_path) ? GW_STATE_DIR_PG : cfg->db_path;
}

/* dir of the DB + "/" + name, for files that live next to it. */
static int beside_db(const gw_config_t *cfg, const char *name, char *out, size_t outlen)
{
    char dir[256];
    snprintf(dir, sizeof(dir), "%s", state_path(cfg));
    char *d = dirname(dir);
    int n = snprintf(out, outlen, "%s/%s", d, name);
    return n < 0 || (size_t)n >= outlen ? -1 : 0;
}

/* Raises the soft limit on open files to the hard one: every client
 * connection takes a descriptor, and max_connections should be the limit
 * that bites, not EMFILE. */
static void raise_fd_limit(const gw_config_t *cfg)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return;
    if (rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
        getrlimit(RLIMIT_NOFILE, &rl);
    }
    /* Workers, the DB, the arena and the loops need some more. */
    rlim_t need = (rlim_t)cfg->max_connections + 64;
    for (int i = 0; i < cfg->ngroups; i++)
        need += (rlim_t)cfg->groups[i].count * 2;
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need)
        SQ_WARN("open files limit below what --max-connections needs limit=%llu "
                "max_connections=%d: accept will pause when descriptors run out",
                (unsigned long long)rl.rlim_cur, cfg->max_connections);
}

gw_dispatch_deps_t gw_dispatch_deps(gw_server_t *srv, sq_loop_t *loop)
{
    const gw_config_t *cfg = srv->cfg;
    gw_dispatch_deps_t d = {
        .cfg = {.core = gw_sched_core_opts(cfg),
                .epoch_ms = cfg->epoch_ms,
                .epoch_min_interval_ms = cfg->epoch_min_interval_ms,
                .epoch_scale_up_ms = cfg->epoch_scale_up_ms,
                .plan_headroom = cfg->plan_headroom,
                .plan_burst_quantile = cfg->plan_burst_quantile,
                .plan_thread = cfg->plan_thread,
                .default_slo_ms = cfg->default_slo_ms,
                .prefix_batching = cfg->prefix_batching,
                .model_retries = cfg->model_retries,
                .lax_readiness = !cfg->strict_readiness},
        .loop = loop,
        .registry = srv->registry,
        .pipelines = srv->pipelines,
        .arena = srv->arena,
        .metrics = srv->metrics,
        .db = srv->db,
        .prep = srv->prep,
        .transport = &srv->transport,
        .db_ready = &srv->db_ready,
    };
    for (int g = 0; g < cfg->ngroups; g++)
        d.cfg.configured_devices += cfg->groups[g].count;
    return d;
}

/* The workers' link's settings and handles from srv's: it runs the
 * dispatch loop and tells the dispatcher. */
static gw_workers_deps_t workers_deps(gw_server_t *srv)
{
    const gw_config_t *cfg = srv->cfg;
    gw_workers_deps_t d = {
        .cfg = {.log_level = cfg->log_level,
                .ngroups = cfg->ngroups,
                .heartbeat_ms = cfg->heartbeat_ms,
                .heartbeat_timeout_ms = cfg->heartbeat_timeout_ms,
                .restart_backoff_ms = cfg->restart_backoff_ms,
                .restart_backoff_max_ms = cfg->restart_backoff_max_ms,
                .emu_memory_mb = cfg->emu_memory_mb},
        .loop = srv->dispatch_loop,
        .ev = &gw_dispatch_events,
        .ev_ctx = srv->dispatch,
        .arena = srv->arena,
        .metrics = srv->metrics,
        .http_port = &srv->http_port,
        .transport = &srv->transport,
    };
    _Static_assert(sizeof(d.cfg.socket_path) == sizeof(srv->socket_path), "the worker socket");
    _Static_assert(sizeof(d.cfg.groups) == sizeof(cfg->groups), "--workers");
    memcpy(d.cfg.socket_path, srv->socket_path, sizeof(d.cfg.socket_path));
    memcpy(d.cfg.groups, cfg->groups, sizeof(d.cfg.groups));
#define COPY_STR(field)                                                                            \
    do {                                                                                           \
        _Static_assert(sizeof(d.cfg.field) == sizeof(cfg->field), #field);                         \
        memcpy(d.cfg.field, cfg->field, sizeof(d.cfg.field));                                      \
    } while (0)
    COPY_STR(listen_host);
    COPY_STR(worker_bin);
    COPY_STR(cluster_listen);
    COPY_STR(cluster_token_file);
    COPY_STR(cluster_tls_cert);
    COPY_STR(cluster_tls_key);
    COPY_STR(cluster_tls_ca);
    COPY_STR(worker_data_listen);
#undef COPY_STR
    return d;
}

gw_http_deps_t gw_http_deps(gw_server_t *srv)
{
    const gw_config_t *cfg = srv->cfg;
    gw_http_deps_t d = {
        .cfg = {.listen_port = cfg->listen_port,
                .http_threads = cfg->http_threads,
                .max_connections = cfg->max_connections,
                .max_header_kb = cfg->max_header_kb,
                .http_request_timeout_ms = cfg->http_request_timeout_ms,
                .max_body_bytes = cfg->max_body_bytes,
                .frontend = cfg->role == GW_ROLE_FRONTEND},
        .stopping = &srv->stopping,
        .http_port = &srv->http_port,
        .offload = srv->offload,
        .front = srv->front,
    };
    _Static_assert(sizeof(d.cfg.listen_host) == sizeof(cfg->listen_host), "--listen's host");
    _Static_assert(sizeof(d.cfg.port_file) == sizeof(cfg->port_file), "--port-file");
    _Static_assert(sizeof(d.cfg.admin_token) == sizeof(srv->admin_token), "the admin token");
    memcpy(d.cfg.listen_host, cfg->listen_host, sizeof(d.cfg.listen_host));
    memcpy(d.cfg.port_file, cfg->port_file, sizeof(d.cfg.port_file));
    memcpy(d.cfg.admin_token, srv->admin_token, sizeof(d.cfg.admin_token));
    return d;
}

gw_front_deps_t gw_front_deps(gw_server_t *srv)
{
    const gw_config_t *cfg = srv->cfg;
    gw_front_deps_t d = {
        .cfg = {.core = gw_sched_core_opts(cfg)},
        .registry = srv->registry,
        .pipelines = srv->pipelines,
        .arena = srv->arena,
        .metrics = srv->metrics,
        .http_port = &srv->http_port,
    };
#define COPY_STR(field)                                                                            \
    do {                                                                                           \
        _Static_assert(sizeof(d.cfg.field) == sizeof(cfg->field), #field);                         \
        memcpy(d.cfg.field, cfg->field, sizeof(d.cfg.field));                                      \
    } while (0)
    COPY_STR(dispatcher);
    COPY_STR(cluster_token_file);
    COPY_STR(cluster_tls_cert);
    COPY_STR(cluster_tls_key);
    COPY_STR(cluster_tls_ca);
#undef COPY_STR
    return d;
}

gw_db_deps_t gw_db_deps(gw_server_t *srv)
{
    gw_db_deps_t d = {
        .registry = srv->registry,
        .pipelines = srv->pipelines,
        .prep = srv->prep,
        .db_ready = &srv->db_ready,
    };
    _Static_assert(sizeof(d.db_path) == sizeof(srv->cfg->db_path), "--db");
    memcpy(d.db_path, srv->cfg->db_path, sizeof(d.db_path));
    return d;
}

gw_leader_deps_t gw_leader_deps(gw_server_t *srv)
{
    const gw_config_t *cfg = srv->cfg;
    gw_leader_deps_t d = {
        .cfg = {.leader_timeout_ms = cfg->leader_timeout_ms},
        .leading = &srv->leading,
        .http_port = &srv->http_port,
        .http = &srv->http,
    };
#define COPY_STR(field)                                                                            \
    do {                                                                                           \
        _Static_assert(sizeof(d.cfg.field) == sizeof(cfg->field), #field);                         \
        memcpy(d.cfg.field, cfg->field, sizeof(d.cfg.field));                                      \
    } while (0)
    COPY_STR(db_path);
    COPY_STR(advertise);
    COPY_STR(listen_host);
#undef COPY_STR
    return d;
}

gw_api_deps_t gw_api_deps(gw_server_t *srv)
{
    const gw_config_t *cfg = srv->cfg;
    return (gw_api_deps_t){
        .cfg = {.max_inflight = cfg->max_inflight,
                .default_slo_ms = cfg->default_slo_ms,
                .max_request_ms = cfg->max_request_ms,
                .max_images = cfg->max_images,
                .max_body_bytes = cfg->max_body_bytes,
                .access_log = cfg->access_log},
        .arena = srv->arena,
        .registry = srv->registry,
        .pipelines = srv->pipelines,
        .prep = srv->prep,
        .metrics = srv->metrics,
        .trace = srv->trace,
        .shm = srv->shm,
        .frontend = srv->front != NULL,
        .front = srv->front,
        .offload = srv->offload,
        .dispatch = srv->dispatch,
        .db = srv->db,
        .stopping = &srv->stopping,
        .db_ready = &srv->db_ready,
        .sched = &srv->sched,
    };
}

gw_grpc_deps_t gw_grpc_deps(gw_server_t *srv)
{
    gw_grpc_deps_t d = {.cfg = {.max_message_bytes = srv->cfg->max_body_bytes}, .api = srv->api};
    _Static_assert(sizeof(d.cfg.listen) == sizeof(srv->cfg->grpc_listen), "--grpc-listen");
    _Static_assert(sizeof(d.cfg.admin_token) == sizeof(srv->admin_token), "the admin token");
    memcpy(d.cfg.listen, srv->cfg->grpc_listen, sizeof(d.cfg.listen));
    memcpy(d.cfg.admin_token, srv->admin_token, sizeof(d.cfg.admin_token));
    return d;
}

int gw_main(const gw_config_t *cfg)
{
    gw_server_t srv = {.cfg = cfg, .start_wall_s = sq_wall_s(), .metrics = gw_metrics_new()};
    char err[512] = "";
    int rc;

    sq_log_set_level(cfg->log_level);
    sq_log_set_tag("squishd");
    signal(SIGPIPE, SIG_IGN);
    raise_fd_limit(cfg);
    /* Every thread inherits this mask; the main thread takes the signals
     * with sigwait. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);

    if ((rc = make_parent_dirs(state_path(cfg), err, sizeof(err))) != 0)
        goto fail;
    if (cfg->socket_path[0] != '\0')
        snprintf(srv.socket_path, sizeof(srv.socket_path), "%s", cfg->socket_path);
    else if (beside_db(cfg, "squishd.sock", srv.socket_path, sizeof(srv.socket_path)) != 0) {
        snprintf(err, sizeof(err), "--db: path too long to put the worker socket next to it");
        rc = SQ_BAD_CONFIG;
        goto fail;
    }
    if (cfg->admin_token_file[0] != '\0')
        snprintf(srv.token_path, sizeof(srv.token_path), "%s", cfg->admin_token_file);
    else
        beside_db(cfg, "admin.token", srv.token_path, sizeof(srv.token_path));
    if ((rc = gw_token_load(srv.token_path, srv.admin_token, err, sizeof(err))) != 0)
        goto fail;
    if ((rc = sq_shm_arena_create(&srv.arena, (size_t)cfg->shm_mb << 20, 4096)) != 0) {
        snprintf(err, sizeof(err), "--shm-mb %d: cannot create the shared-memory arena",
                 cfg->shm_mb);
        goto fail;
    }
    srv.registry = gw_registry_new();
    srv.pipelines = gw_pipes_new();
    srv.trace = gw_trace_new(cfg->trace_file);
    srv.shm = gw_shm_table_new();
    if ((rc = gw_trace_open(srv.trace, err, sizeof(err))) != 0)
        goto fail;
    gw_prep_pool_config_t pcfg = {.threads = cfg->prep_threads,
                                  .queue_capacity = cfg->prep_queue,
                                  .limits = gw_prep_limits_default()};
    if ((rc = gw_prep_pool_new(&pcfg, &srv.prep)) != 0) {
        snprintf(err, sizeof(err), "cannot start the preprocess pool");
        goto fail;
    }
    if ((rc = gw_offload_start(&srv.offload)) != 0) {
        snprintf(err, sizeof(err), "cannot start the offload thread");
        goto fail;
    }
    if (cfg->role == GW_ROLE_FRONTEND) {
        /* A frontend: no DB, no workers, no dispatcher of its own; it joins
         * the cluster's (front/) and serves HTTP meanwhile, not ready until
         * it has joined. */
        gw_front_deps_t front_deps = gw_front_deps(&srv);
        if ((rc = gw_front_start(&front_deps, &srv.front, err, sizeof(err))) != 0)
            goto fail;
        srv.sched = gw_front_sched(srv.front);
        gw_api_deps_t api_deps = gw_api_deps(&srv);
        srv.api = gw_api_new(&api_deps);
        gw_http_deps_t http_deps = gw_http_deps(&srv);
        const gw_http_app_t *app = gw_api_app(srv.api);
        if ((rc = gw_http_start(&http_deps, app, &srv.http, err, sizeof(err))) != 0)
            goto fail;
        if (cfg->grpc_listen[0] != '\0') {
            /* Its methods answer as its HTTP routes: forwarded where they are. */
            gw_grpc_deps_t grpc_deps = gw_grpc_deps(&srv);
            if ((rc = gw_grpc_start(&grpc_deps, &srv.grpc, err, sizeof(err))) != 0)
                goto fail;
        }
        goto serve;
    }
    /* With a shared (PostgreSQL) model DB, squishd may be a standby first:
     * it answers HTTP as one until it holds the leader's lock. */
    gw_leader_deps_t leader_deps = gw_leader_deps(&srv);
    if ((rc = gw_leader_open(&leader_deps, &srv.leader, err, sizeof(err))) != 0)
        goto fail;
    gw_http_deps_t standby_http = gw_http_deps(&srv);
    rc = gw_leader_wait(srv.leader, &standby_http, &sigs, err, sizeof(err));
    if (rc == 1) {
        rc = 0; /* stopped while standby */
        goto out;
    }
    if (rc != 0 || (rc = gw_leader_watch(srv.leader)) != 0) {
        if (err[0] == '\0')
            snprintf(err, sizeof(err), "cannot take the lead: %s", sq_err_msg(rc));
        goto fail;
    }
    gw_db_deps_t db_deps = gw_db_deps(&srv);
    if ((rc = gw_db_start(&db_deps, &srv.db, err, sizeof(err))) != 0)
        goto fail;
    /* The dispatcher on its loop, then the worker link that runs it. */
    if ((srv.dispatch_loop = sq_loop_new()) == NULL) {
        snprintf(err, sizeof(err), "cannot create the dispatch loop");
        rc = SQ_NOMEM;
        goto fail;
    }
    gw_dispatch_deps_t deps = gw_dispatch_deps(&srv, srv.dispatch_loop);
    srv.dispatch = gw_dispatch_new(&deps);
    srv.sched = gw_dispatch_sched(srv.dispatch);
    gw_workers_deps_t link_deps = workers_deps(&srv);
    if ((rc = gw_workers_start(&link_deps, &srv.workers, err, sizeof(err))) != 0)
        goto fail;
    gw_dispatch_resume_profiling(srv.dispatch);
    gw_api_deps_t api_deps = gw_api_deps(&srv);
    srv.api = gw_api_new(&api_deps);
    gw_http_deps_t http_deps = gw_http_deps(&srv);
    /* The api's app, which lives until gw_api_free (after gw_http_stop). */
    const gw_http_app_t *app = gw_api_app(srv.api);
    if (srv.http != NULL) /* a standby that came to lead: same listener */
        gw_http_set_app(srv.http, app);
    else if ((rc = gw_http_start(&http_deps, app, &srv.http, err, sizeof(err))) != 0)
        goto fail;
    if (cfg->grpc_listen[0] != '\0') {
        gw_grpc_deps_t grpc_deps = gw_grpc_deps(&srv);
        if ((rc = gw_grpc_start(&grpc_deps, &srv.grpc, err, sizeof(err))) != 0)
            goto fail;
    }
    gw_leader_announce(srv.leader);

serve:;
    int sig = 0;
    sigwait(&sigs, &sig);
    SQ_INFO("signal received signal=%s; draining", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    atomic_store(&srv.stopping, 1);
    /* In-flight requests finish normally; then whatever is left is answered
     * 503 before the loops that would deliver the answers go away. */
    gw_http_drain(srv.http, cfg->drain_timeout_ms);
    gw_prep_pool_shutdown(srv.prep, GW_PREP_CANCEL);
    gw_offload_stop(srv.offload);
    srv.offload = NULL;
    gw_workers_abort(srv.workers);
    gw_front_stop(srv.front);
    gw_http_drain(srv.http, 1000);
    rc = 0;
    goto out;

fail:
    SQ_ERROR("cannot start: %s", err);
    fprintf(stderr, "squishd: %s\n", err);
    rc = 1;
out:
    if (srv.prep != NULL)
        gw_prep_pool_shutdown(srv.prep, GW_PREP_CANCEL);
    gw_offload_stop(srv.offload);
    srv.offload = NULL;
    gw_workers_abort(srv.workers);
    gw_front_stop(srv.front);
    /* gRPC's calls are cancelled and freed; one waiting on the DB thread is
     * answered there first (the DB thread still runs). */
    gw_grpc_stop(srv.grpc);
    srv.grpc = NULL;
    /* Uploads and deletes whose DB job is under way answer before the HTTP
     * loops go; jobs of the dispatcher answer into its loop, which stays
     * until the DB thread has stopped. */
    gw_db_quiesce(srv.db);
    gw_http_stop(srv.http);
    srv.http = NULL;
    gw_workers_stop(srv.workers);
    gw_prep_pool_free(srv.prep);
    gw_db_stop(srv.db);
    srv.db = NULL;
    gw_leader_close(srv.leader); /* the lock goes when all else has stopped */
    srv.leader = NULL;
    gw_workers_free(srv.workers); /* and clears srv.transport */
    srv.workers = NULL;
    srv.sched = NULL;
    gw_front_free(srv.front);
    srv.front = NULL;
    gw_dispatch_free(srv.dispatch);
    srv.dispatch = NULL;
    sq_loop_free(srv.dispatch_loop);
    srv.dispatch_loop = NULL;
    gw_registry_free(srv.registry);
    gw_pipes_free(srv.pipelines);
    sq_shm_arena_free(srv.arena);
    /* Its last lines are written: every request is done by now. */
    gw_trace_free(srv.trace);
    gw_shm_table_free(srv.shm);
    gw_api_free(srv.api); /* nothing calls the API any more */
    gw_metrics_free(srv.metrics);
    if (rc == 0)
        SQ_INFO("stopped");
    return rc;
}
