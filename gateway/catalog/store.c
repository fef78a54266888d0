/* The DB thread: opens the model DB off the HTTP loop and runs DB jobs
 * posted to it, one at a time, in order. */
#include "gw_catalog.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct gw_db {
    gw_server_t *srv;
    sq_loop_t *loop;
    pthread_t thread;
    mdb_t *mdb;
    int64_t checked_us; /* the connection last proved alive (mdb_ping) */
    int down;           /* the last check failed */
    /* The newest plan stored when the DB opened (gw_db_last_plan): read at
     * start, then never written. */
    long long last_epoch;
    json_t *last_plan, *last_placements;
};

typedef struct {
    struct gw_db *d;
    void (*fn)(mdb_t *db, void *arg);
    void *arg;
} db_job_t;

/* A PostgreSQL connection the server dropped (a restart, a failover, a
 * network cut) is reconnected before the next job rather than failing every
 * job from then on: checked before a job when the last check is over a
 * second old (a SELECT 1; sqlite: nothing). */
static void check_connection(struct gw_db *d)
{
    int64_t now = sq_now_us();
    if (now - d->checked_us < 1000000)
        return;
    d->checked_us = now;
    int rc = mdb_ping(d->mdb);
    if (rc == 1)
        SQ_INFO("model database reconnected");
    else if (rc < 0 && !d->down)
        SQ_WARN("model database unreachable: %s", mdb_errmsg(d->mdb));
    d->down = rc < 0;
}

static void run_job(sq_loop_t *loop, void *p)
{
    db_job_t *job = p;
    (void)loop;
    check_connection(job->d);
    job->fn(job->d->mdb, job->arg);
    free(job);
}

static void *db_thread(void *arg)
{
    struct gw_db *d = arg;
    sq_loop_run(d->loop);
    return NULL;
}

/* The stored pipelines, published as they were stored (their models are
 * looked at per query: one deleted since makes its queries fail, not the
 * start). A spec that no longer parses is skipped with a warning. */
static void load_pipelines(gw_server_t *srv, mdb_t *db)
{
    json_t *all;
    if (mdb_pipeline_list(db, &all) != 0) {
        SQ_WARN("cannot read the pipelines error=\"%s\"", mdb_errmsg(db));
        return;
    }
    size_t i;
    json_t *row;
    json_array_foreach(all, i, row)
    {
        char err[512];
        gw_pipeline_t *p;
        if (gw_pipeline_parse(json_object_get(row, "spec"), NULL, &p, err, sizeof(err)) != 0) {
            SQ_WARN("stored pipeline skipped name=%s error=\"%s\"",
                    json_string_value(json_object_get(row, "name")), err);
            continue;
        }
        atomic_store(&p->unloaded, json_is_true(json_object_get(row, "unloaded")));
        gw_pipes_put(srv->pipelines, p);
    }
    SQ_INFO("pipelines loaded count=%zu", json_array_size(all));
    json_decref(all);
}

int gw_db_start(gw_server_t *srv, char *err, size_t errlen)
{
    struct gw_db *d = sq_xcalloc(1, sizeof(*d));
    d->srv = srv;
    /* For messages and logs: a PostgreSQL conninfo without its password. */
    char target[512];
    mdb_target_describe(srv->cfg->db_path, target, sizeof(target));
    int rc = mdb_open(srv->cfg->db_path, &d->mdb);
    if (rc != 0) {
        snprintf(err, errlen, "--db %s: %s", target, mdb_errmsg(d->mdb));
        mdb_close(d->mdb);
        free(d);
        return rc;
    }
    if ((rc = mdb_check(d->mdb)) != 0) {
        snprintf(err, errlen, "--db %s: %s", target, mdb_errmsg(d->mdb));
        mdb_close(d->mdb);
        free(d);
        return rc;
    }
    d->loop = sq_loop_new();
    if (d->loop == NULL) {
        mdb_close(d->mdb);
        free(d);
        snprintf(err, errlen, "cannot create the DB thread's loop");
        return SQ_NOMEM;
    }
    /* The registry is filled before anything serves (this is the main
     * thread at start, not a loop). */
    json_t *recs;
    if ((rc = mdb_model_records(d->mdb, 0, &recs)) != 0) {
        snprintf(err, errlen, "--db %s: %s", target, mdb_errmsg(d->mdb));
        sq_loop_free(d->loop);
        mdb_close(d->mdb);
        free(d);
        return rc;
    }
    size_t i;
    json_t *r;
    json_array_foreach(recs, i, r) gw_registry_put(srv->registry, gw_model_from_record(r));
    SQ_INFO("models loaded count=%zu", json_array_size(recs));
    load_pipelines(srv, d->mdb);
    d->last_epoch = mdb_plan_last_epoch(d->mdb);
    /* The last plan is reapplied once workers are up (planning.c); one that
     * cannot be read is not a reason to refuse to serve. */
    long long epoch;
    if (mdb_plan_last(d->mdb, &epoch, &d->last_plan, &d->last_placements) != 0)
        SQ_WARN("cannot read the last plan; planning from scratch error=\"%s\"",
                mdb_errmsg(d->mdb));
    else if (epoch > 0)
        SQ_INFO("last plan epoch=%lld placements=%zu", epoch, json_array_size(d->last_placements));
    json_decref(recs);
    if (pthread_create(&d->thread, NULL, db_thread, d) != 0) {
        sq_loop_free(d->loop);
        mdb_close(d->mdb);
        free(d);
        snprintf(err, errlen, "cannot start the DB thread");
        return SQ_NOMEM;
    }
    srv->db = d;
    atomic_store(&srv->db_ready, 1);
    SQ_INFO("model database open backend=%s target=\"%s\" schema_version=%d", mdb_backend(d->mdb),
            target, MDB_SCHEMA_VERSION);
    return 0;
}

void gw_db_post(gw_server_t *srv, void (*fn)(mdb_t *db, void *arg), void *arg)
{
    db_job_t *job = sq_xmalloc(sizeof(*job));
    job->d = srv->db;
    job->fn = fn;
    job->arg = arg;
    sq_loop_post(srv->db->loop, run_job, job);
}

static void barrier_job(mdb_t *db, void *arg)
{
    (void)db;
    atomic_store((atomic_int *)arg, 1);
}

void gw_db_quiesce(gw_server_t *srv)
{
    if (srv->db == NULL)
        return;
    atomic_int done = 0;
    gw_db_post(srv, barrier_job, &done);
    while (!atomic_load(&done))
        usleep(1000);
}

static void stop_loop(sq_loop_t *loop, void *arg)
{
    (void)arg;
    sq_loop_stop(loop);
}

void gw_db_stop(gw_server_t *srv)
{
    struct gw_db *d = srv->db;
    if (d == NULL)
        return;
    /* Posted last, so every job already queued runs first. */
    sq_loop_post(d->loop, stop_loop, NULL);
    pthread_join(d->thread, NULL);
    atomic_store(&srv->db_ready, 0);
    sq_loop_free(d->loop);
    mdb_close(d->mdb);
    json_decref(d->last_plan);
    json_decref(d->last_placements);
    free(d);
    srv->db = NULL;
}

long long gw_db_last_plan(const gw_db_t *db, json_t **plan, json_t **placements)
{
    *plan = db != NULL && db->last_plan != NULL ? json_deep_copy(db->last_plan) : NULL;
    *placements =
        db != NULL && db->last_placements != NULL ? json_deep_copy(db->last_placements) : NULL;
    return db != NULL ? db->last_epoch : 0;
}
