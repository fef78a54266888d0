/* The DB thread: opens the model DB off the HTTP loop and runs DB jobs
 * posted to it, one at a time, in order. */
#include "gw_catalog.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct gw_db {
    gw_prep_pool_t *prep; /* whose decode costs it stores (taken at gw_db_start) */
    atomic_int *db_ready; /* the server's flag: set while the DB is open */
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

/* The preprocess pool's decode estimates are stored this often (and at
 * shutdown), on the DB thread, and read at start before anything is
 * planned: a restart plans its first frames as its thousandth. */
#define DECODE_SAVE_NS (30 * 1000000000LL)

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

/* The pool's estimates, by the names they are stored under. */
static const struct {
    const char *what;
    size_t offset;
} decode_names[] = {
    {"decode", offsetof(gw_prep_costs_t, decode)},
    {"frame", offsetof(gw_prep_costs_t, frame)},
    {"per_byte", offsetof(gw_prep_costs_t, per_byte)},
};
#define DECODE_NAMES ((int)(sizeof(decode_names) / sizeof(decode_names[0])))

/* Before the dispatcher splits a pipeline (the main thread at start). A
 * DB without them (a first start) or one that cannot be read leaves the
 * pool to measure from scratch. */
static void load_decode_costs(gw_prep_pool_t *prep, mdb_t *db)
{
    if (prep == NULL)
        return;
    mdb_decode_cost_t rows[8];
    int n = 0;
    if (mdb_decode_costs_read(db, rows, 8, &n) != 0) {
        SQ_WARN("cannot read the decode costs error=\"%s\"", mdb_errmsg(db));
        return;
    }
    gw_prep_costs_t costs = {0};
    for (int i = 0; i < n; i++)
        for (int k = 0; k < DECODE_NAMES; k++)
            if (strcmp(rows[i].what, decode_names[k].what) == 0)
                *(gw_prep_est_t *)((char *)&costs + decode_names[k].offset) = (gw_prep_est_t){
                    .mean_ns = rows[i].mean_ns,
                    .dev_ns = rows[i].dev_ns,
                    .samples = rows[i].samples,
                };
    gw_prep_pool_seed(prep, &costs);
    if (n > 0)
        SQ_INFO("decode costs loaded frame_p99_us=%.0f decode_us=%.0f per_byte_ns=%.2f",
                gw_prep_pool_decode_p99_us(prep), gw_prep_pool_decode_us(prep),
                costs.per_byte.mean_ns);
}

/* On the DB thread: the pool's estimates now, those with samples. */
static void save_decode_costs(struct gw_db *d)
{
    if (d->prep == NULL)
        return;
    gw_prep_costs_t costs;
    gw_prep_pool_costs(d->prep, &costs);
    mdb_decode_cost_t rows[DECODE_NAMES];
    int n = 0;
    for (int k = 0; k < DECODE_NAMES; k++) {
        const gw_prep_est_t *e =
            (const gw_prep_est_t *)((const char *)&costs + decode_names[k].offset);
        if (e->samples <= 0)
            continue;
        rows[n] =
            (mdb_decode_cost_t){.mean_ns = e->mean_ns, .dev_ns = e->dev_ns, .samples = e->samples};
        snprintf(rows[n].what, sizeof(rows[n].what), "%s", decode_names[k].what);
        n++;
    }
    if (mdb_decode_costs_write(d->mdb, rows, n) != 0)
        SQ_WARN("cannot store the decode costs error=\"%s\"", mdb_errmsg(d->mdb));
}

static void decode_save_tick(sq_loop_t *loop, uint64_t timer_id, void *data)
{
    struct gw_db *d = data;
    (void)timer_id;
    check_connection(d);
    save_decode_costs(d);
    sq_loop_timer_at(loop, sq_now_ns() + DECODE_SAVE_NS, decode_save_tick, d);
}

static void decode_save_arm(sq_loop_t *loop, void *arg)
{
    sq_loop_timer_at(loop, sq_now_ns() + DECODE_SAVE_NS, decode_save_tick, arg);
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
static void load_pipelines(gw_pipes_t *pipelines, mdb_t *db)
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
        gw_pipes_put(pipelines, p);
    }
    SQ_INFO("pipelines loaded count=%zu", json_array_size(all));
    json_decref(all);
}

int gw_db_start(const gw_db_deps_t *deps, gw_db_t **out, char *err, size_t errlen)
{
    struct gw_db *d = sq_xcalloc(1, sizeof(*d));
    d->prep = deps->prep;
    d->db_ready = deps->db_ready;
    /* For messages and logs: a PostgreSQL conninfo without its password. */
    char target[512];
    mdb_target_describe(deps->db_path, target, sizeof(target));
    int rc = mdb_open(deps->db_path, &d->mdb);
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
    json_array_foreach(recs, i, r) gw_registry_put(deps->registry, gw_model_from_record(r));
    SQ_INFO("models loaded count=%zu", json_array_size(recs));
    load_pipelines(deps->pipelines, d->mdb);
    load_decode_costs(d->prep, d->mdb);
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
    *out = d;
    sq_loop_post(d->loop, decode_save_arm, d);
    atomic_store(d->db_ready, 1);
    SQ_INFO("model database open backend=%s target=\"%s\" schema_version=%d", mdb_backend(d->mdb),
            target, MDB_SCHEMA_VERSION);
    return 0;
}

void gw_db_job(gw_db_t *db, void (*fn)(mdb_t *db, void *arg), void *arg)
{
    db_job_t *job = sq_xmalloc(sizeof(*job));
    job->d = db;
    job->fn = fn;
    job->arg = arg;
    sq_loop_post(db->loop, run_job, job);
}

static void barrier_job(mdb_t *db, void *arg)
{
    (void)db;
    atomic_store((atomic_int *)arg, 1);
}

static void decode_save_job(mdb_t *db, void *arg)
{
    (void)db;
    save_decode_costs(arg);
}

void gw_db_quiesce(gw_db_t *db)
{
    if (db == NULL)
        return;
    /* The decode estimates as they are at the end, for the next start
     * (the pool is stopped by now, or idle in a test's server). */
    gw_db_job(db, decode_save_job, db);
    atomic_int done = 0;
    gw_db_job(db, barrier_job, &done);
    while (!atomic_load(&done))
        usleep(1000);
}

static void stop_loop(sq_loop_t *loop, void *arg)
{
    (void)arg;
    sq_loop_stop(loop);
}

void gw_db_stop(gw_db_t *d)
{
    if (d == NULL)
        return;
    /* Posted last, so every job already queued runs first. */
    sq_loop_post(d->loop, stop_loop, NULL);
    pthread_join(d->thread, NULL);
    atomic_store(d->db_ready, 0);
    sq_loop_free(d->loop);
    mdb_close(d->mdb);
    json_decref(d->last_plan);
    json_decref(d->last_placements);
    free(d);
}

long long gw_db_last_plan(const gw_db_t *db, json_t **plan, json_t **placements)
{
    *plan = db != NULL && db->last_plan != NULL ? json_deep_copy(db->last_plan) : NULL;
    *placements =
        db != NULL && db->last_placements != NULL ? json_deep_copy(db->last_placements) : NULL;
    return db != NULL ? db->last_epoch : 0;
}
