/* The dispatch thread's data plane, its top: entry points from other
 * threads (submit, model changes), the workers' link events (up, frames,
 * lost, exited: crashes that poison a model), the tick, and start and
 * stop. The rest is below it: batches.c drives the pure dispatcher core
 * with real time, model_loads.c gets models onto workers, profiling.c measures
 * them, prefix_groups.c forms prefix groups and twins, records.c holds lookups
 * and finishes items (gw_dispatch_int.h lists them).
 *
 * Routing, until the planner places models: a model is served by every
 * worker of its serving kind, loaded there on its first request; requests
 * that arrive before any worker holds it wait (bounded by their deadline).
 * Sessions are (model, SLO bucket, input kind): one dispatcher queue each.
 * Runs on the workers' loop thread; other threads reach it with
 * sq_loop_post (gw_dispatch_submit and friends). */
#include "gw_dispatch_int.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#define TICK_MS 50

static void post_model_msg(gw_server_t *srv, int64_t key, int profile);

/* Whether a worker of dm's kind being restarted should be back, and run a
 * batch of one, before the item's deadline. */
static int back_in_time(gw_dispatch_t *ds, const ds_model_t *dm, const gw_item_t *it)
{
    if (dm->kind < 0 || atomic_load(&ds->srv->kind_coming[dm->kind]) == 0)
        return 0;
    double l1 = dm->m->has_profile[dm->kind] ? pl_latency_us(&dm->m->profile[dm->kind], 1, 0) : 0;
    int64_t back = atomic_load(&ds->srv->kind_back_at_us[dm->kind]);
    return back != INT64_MAX && back + (int64_t)l1 < it->deadline_us;
}

/* DB thread: publishes key's current record (none: it was deleted) and
 * tells the dispatcher. */
static void registry_refresh(mdb_t *db, gw_server_t *srv, int64_t key)
{
    json_t *recs;
    if (mdb_model_records(db, key, &recs) == 0 && json_array_size(recs) == 1)
        gw_registry_put(srv->registry, gw_model_from_record(json_array_get(recs, 0)));
    json_decref(recs);
    gw_dispatch_model_changed(srv, key);
}

static const char *sigabbrev(int sig)
{
    switch (sig) {
    case SIGSEGV:
        return "SIGSEGV";
    case SIGABRT:
        return "SIGABRT";
    case SIGBUS:
        return "SIGBUS";
    case SIGFPE:
        return "SIGFPE";
    case SIGILL:
        return "SIGILL";
    case SIGTRAP:
        return "SIGTRAP";
    case SIGSYS:
        return "SIGSYS";
    default:
        return "a signal";
    }
}

typedef struct {
    gw_server_t *srv;
    int64_t key;
    char device_kind[8];
    char device_name[64];
    sq_profile_done_t done;
} profile_store_t;

/* DB thread: stores the profile, refreshes the registry entry, and tells
 * the dispatcher. */
static void profile_store_job(mdb_t *db, void *arg)
{
    profile_store_t *p = arg;
    mdb_profile_row_t *rows = sq_xcalloc(p->done.nrows + 1, sizeof(*rows));
    for (uint32_t i = 0; i < p->done.nrows; i++)
        rows[i] = (mdb_profile_row_t){.batch = (int)p->done.rows[i].batch,
                                      .mean_us = p->done.rows[i].mean_us,
                                      .std_us = p->done.rows[i].std_us,
                                      .peak_memory_bytes = p->done.rows[i].peak_memory_bytes};
    int ok = p->done.code == 0 && p->done.nrows > 0;
    int rc = mdb_profile_store(db, p->key, p->device_kind, p->device_name, rows,
                               ok ? (int)p->done.nrows : 0, ok ? "ready" : "failed",
                               ok ? NULL : p->done.message);
    free(rows);
    if (rc == SQ_MODEL_NOT_FOUND)
        SQ_INFO("profile not stored: the model was deleted while it was measured key=%lld",
                (long long)p->key);
    else if (rc != 0)
        SQ_ERROR("cannot store the profile key=%lld error=\"%s\"", (long long)p->key,
                 mdb_errmsg(db));
    registry_refresh(db, p->srv, p->key);
    free(p);
}

typedef struct {
    gw_server_t *srv;
    int64_t from, to;
} profile_copy_job_t;

/* What a model message asks for: nothing but a refresh, a profile (taken
 * from an identical model when there is one), or a measurement. */
enum { PROFILE_NONE, PROFILE_WANTED, PROFILE_MEASURE };

/* DB thread: an identical model's profile becomes this one's; if that fails
 * (the older copy deleted meanwhile), it is measured after all. */
static void profile_copy_job(mdb_t *db, void *arg)
{
    profile_copy_job_t *j = arg;
    int rc = mdb_profile_copy(db, j->from, j->to);
    if (rc == 0) {
        registry_refresh(db, j->srv, j->to);
    } else {
        SQ_INFO("profile not copied, measuring key=%lld reason=\"%s\"", (long long)j->to,
                mdb_errmsg(db));
        post_model_msg(j->srv, j->to, PROFILE_MEASURE);
    }
    free(j);
}

/* ---- models that crash their workers -------------------------------------
 * A worker process that dies of a signal of its own (SIGSEGV, SIGABRT,
 * SIGBUS, SIGFPE, SIGILL...) while it loads, measures or runs a model
 * counts a crash against that model: the oldest job it had not answered
 * (it runs them in order). SIGKILL and SIGTERM come from outside (squishd
 * on a missed heartbeat, an operator, the kernel's OOM killer) and count
 * nothing. Past --model-retries crashes the model is marked failed, in the
 * model DB with the reason, and is never sent to a worker again; its
 * waiting requests are answered 409 model_failed. A prefix group that
 * crashes its worker is retired instead (its members run alone). */

typedef struct {
    gw_server_t *srv;
    int64_t key;
    char why[256];
} fail_job_t;

static void fail_job(mdb_t *db, void *arg)
{
    fail_job_t *j = arg;
    int rc = mdb_model_set_status(db, j->key, "failed", j->why);
    if (rc != 0 && rc != SQ_MODEL_NOT_FOUND)
        SQ_ERROR("cannot mark a model failed key=%lld error=\"%s\"", (long long)j->key,
                 mdb_errmsg(db));
    registry_refresh(db, j->srv, j->key);
    free(j);
}

static void poison(gw_dispatch_t *ds, ds_model_t *dm, const char *why)
{
    if (dm->is_group) {
        dm->failed = 1;
        ds_group_retire(ds, dm, why);
        return;
    }
    dm->poisoned = 1;
    dm->profile_pending = 0;
    snprintf(dm->failed_why, sizeof(dm->failed_why), "model %s version %d failed: %s", dm->m->name,
             dm->m->version, why);
    SQ_ERROR("model marked failed model=%s version=%d crashes=%d reason=\"%s\"", dm->m->name,
             dm->m->version, dm->crashes, why);
    ds_fail_pending(ds, dm, SQ_MODEL_FAILED, dm->failed_why);
    ds_withdraw(ds, dm); /* what its sessions queued comes back as drops: see ds_pump */
    int was_active = dm->active;
    dm->active = 0;
    if (was_active && dm->kind >= 0)
        gw__plan_invalidate(ds, dm->kind, "model failed");
    sq_bytes_unref(dm->blob);
    dm->blob = NULL;
    dm->blob_state = 0;
    fail_job_t *j = sq_xcalloc(1, sizeof(*j));
    j->srv = ds->srv;
    j->key = dm->key;
    snprintf(j->why, sizeof(j->why), "%s", why);
    gw_db_post(ds->srv, fail_job, j);
}

/* The job w was running when its connection ended: its oldest unanswered
 * one. */
static void note_suspect(ds_worker_t *w)
{
    uint64_t oldest = UINT64_MAX;
    w->has_suspect = 0;
    if (w->inflight != NULL) {
        oldest = w->inflight->seq;
        w->suspect_key = w->inflight->model_key;
        snprintf(w->suspect_doing, sizeof(w->suspect_doing), "running");
        w->has_suspect = 1;
    }
    for (int i = 0; i < w->nloads; i++) {
        const ds_load_t *l = &w->loads[i];
        if ((l->state == LOAD_SENT || l->stale > 0) && l->sent_seq != 0 && l->sent_seq < oldest) {
            oldest = l->sent_seq;
            w->suspect_key = l->key;
            snprintf(w->suspect_doing, sizeof(w->suspect_doing), "loading");
            w->has_suspect = 1;
        }
    }
    if (w->profile_seq != 0 && w->profile_seq < oldest) {
        w->suspect_key = w->profile_key;
        snprintf(w->suspect_doing, sizeof(w->suspect_doing), "measuring");
        w->has_suspect = 1;
    }
    w->profile_seq = 0;
}

static void worker_exited(gw_dispatch_t *ds, int worker, int status)
{
    ds_worker_t *w = ds_worker_at(ds, worker);
    if (w == NULL || w->up || !w->has_suspect)
        return;
    w->has_suspect = 0;
    int sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    if (sig == 0 || sig == SIGKILL || sig == SIGTERM || sig == SIGINT || sig == SIGHUP)
        return;
    ds_model_t *dm = ds_model_find(ds, w->suspect_key);
    if (dm == NULL || dm->removed || dm->poisoned)
        return;
    dm->crashes++;
    char why[192];
    snprintf(why, sizeof(why), "its worker (%s) crashed with %s while %s it, %d time%s", w->device,
             sigabbrev(sig), w->suspect_doing, dm->crashes, dm->crashes > 1 ? "s" : "");
    if (dm->crashes > ds->srv->cfg->model_retries) {
        poison(ds, dm, why);
    } else {
        SQ_WARN("worker crashed model=%s version=%d doing=%s signal=%s crashes=%d retries=%d",
                dm->m->name, dm->m->version, w->suspect_doing, sigabbrev(sig), dm->crashes,
                ds->srv->cfg->model_retries);
    }
    ds_pump(ds);
}

static int on_frame(gw_dispatch_t *ds, int worker, const sq_frame_t *f)
{
    ds_worker_t *w = ds_worker_at(ds, worker);
    if (w == NULL)
        return -1;
    switch (f->type) {
    case SQ_MSG_BATCH_DONE:
        ds_on_batch_done(ds, w, f);
        ds_profile_step(ds, w); /* a measurement waiting for the worker */
        ds_pump(ds);
        return 0;
    case SQ_MSG_MODEL_LOADED:
    case SQ_MSG_MODEL_FAILED: {
        ds_model_t *dm = ds_model_find(ds, (int64_t)f->id);
        ds_load_t *l = ds_load_find(w, (int64_t)f->id, 0);
        if (l != NULL && l->stale > 0) {
            l->stale--; /* the answer to a load withdrawn since */
            return 0;
        }
        if (dm == NULL || l == NULL)
            return 0; /* a model deleted meanwhile */
        if (f->type == SQ_MSG_MODEL_LOADED) {
            sq_model_loaded_t info;
            if (sq_model_loaded_decode(f, &info) != 0)
                return -1;
            l->state = LOAD_DONE;
            l->max_batch = (int)info.max_batch;
            gw__plan_loaded(ds, w->kind);
            SQ_INFO("model loaded worker=%d device=%s model=%s version=%d memory_mb=%llu", w->id,
                    w->device, dm->m->name, dm->m->version,
                    (unsigned long long)(info.memory_bytes >> 20));
            ds_profile_step(ds, w); /* its measurement waited for the load */
            if (dm->active) {
                ds_update_routes(ds, dm);
                ds_flush_pending(ds, dm);
            }
        } else {
            sq_ipc_error_t e;
            if (sq_ipc_error_decode(f, &e) != 0)
                return -1;
            l->state = LOAD_FAILED;
            SQ_WARN("model load failed worker=%d model=%s version=%d code=%s reason=\"%s\"", w->id,
                    dm->m->name, dm->m->version, sq_err_name(e.code), e.message);
            if (dm->is_group) {
                /* Its members run alone; what waited for it runs there. */
                if (dm->profile_worker == w->id)
                    ds_end_profile(ds, dm, w);
                dm->failed = 1;
                ds_group_retire(ds, dm, "the group could not be loaded");
            } else if (dm->profile_worker == w->id) {
                sq_profile_done_t failed = {.code = e.code};
                profile_store_t *p = sq_xcalloc(1, sizeof(*p));
                p->srv = ds->srv;
                p->key = dm->key;
                snprintf(p->device_kind, sizeof(p->device_kind), "%s", sq_dev_kind_name(w->kind));
                snprintf(p->device_name, sizeof(p->device_name), "%s", w->device);
                p->done = failed;
                snprintf(p->done.message, sizeof(p->done.message), "load: %s", e.message);
                ds_end_profile(ds, dm, w);
                gw_db_post(ds->srv, profile_store_job, p);
            }
            int loading;
            if (ds_loaded_anywhere(ds, dm, &loading) == 0 && loading == 0)
                ds_fail_pending(ds, dm, SQ_NO_WORKER, e.message);
        }
        ds_pump(ds);
        return 0;
    }
    case SQ_MSG_PROFILE_PROGRESS: {
        sq_reader_t r;
        sq_reader_init(&r, f->payload, f->len);
        uint32_t b = sq_get_u32(&r), total = sq_get_u32(&r);
        ds_model_t *dm = ds_model_find(ds, (int64_t)f->id);
        if (!r.err && dm != NULL) {
            SQ_INFO("profiling progress model=%s version=%d sizes=%u of=%u", dm->m->name,
                    dm->m->version, b, total);
            if (dm->profile_worker == w->id)
                ds_progress_set(ds, dm, w, (int)b, (int)total);
        }
        return 0;
    }
    case SQ_MSG_PROFILE_SLICE: {
        sq_reader_t r;
        sq_reader_init(&r, f->payload, f->len);
        uint64_t next_us = sq_get_u64(&r);
        if (r.err || r.left != 0)
            return -1;
        ds_slice_over(ds, w, next_us < INT32_MAX ? (int64_t)next_us : INT32_MAX);
        ds_profile_step(ds, w);
        ds_pump(ds);
        return 0;
    }
    case SQ_MSG_PROFILE_DONE: {
        profile_store_t *p = sq_xcalloc(1, sizeof(*p));
        if (sq_profile_done_decode(f, &p->done) != 0) {
            free(p);
            return -1;
        }
        ds_slice_over(ds, w, 0);
        ds_model_t *dm = ds_model_find(ds, (int64_t)f->id);
        SQ_INFO("profiling done key=%lld worker=%d rows=%u code=%s", (long long)f->id, w->id,
                p->done.nrows, sq_err_name(p->done.code));
        if (w->profile_key == (int64_t)f->id)
            w->profile_seq = 0;
        if (dm == NULL || dm->removed || dm->profile_worker != w->id) {
            /* Abandoned (the model deleted, the group retired): nothing is
             * stored; the worker measures the next one, if any. */
            free(p);
            ds_start_profiles(ds);
            ds_profile_step(ds, w);
            ds_pump(ds);
            return 0;
        }
        ds_end_profile(ds, dm, w);
        if (p->done.code == 0)
            dm->crashes = 0;
        if (dm->is_group) {
            ds_group_profiled(ds, dm, w, &p->done);
            free(p);
            ds_pump(ds);
            return 0;
        }
        p->srv = ds->srv;
        p->key = (int64_t)f->id;
        snprintf(p->device_kind, sizeof(p->device_kind), "%s", sq_dev_kind_name(w->kind));
        snprintf(p->device_name, sizeof(p->device_name), "%s", w->device);
        gw_db_post(ds->srv, profile_store_job, p);
        ds_pump(ds);
        return 0;
    }
    default:
        return -1;
    }
}

/* ---- workers come and go -------------------------------------------------- */

typedef struct {
    gw_model_t **m;
    int n;
} grouped_t;

static void collect_grouped(gw_model_t *m, void *arg)
{
    grouped_t *g = arg;
    if (m->group_id <= 0 || m->emulated || strcmp(m->status, "ready") != 0)
        return;
    gw_model_ref(m);
    g->m = sq_xrealloc(g->m, sizeof(*g->m) * (size_t)(g->n + 1));
    g->m[g->n++] = m;
}

static void worker_up(gw_dispatch_t *ds, int worker, const char *device, uint64_t memory)
{
    grouped_t grouped = {0};
    sq_device_t dev;
    if (worker < 0 || sq_device_parse(device, &dev) != 0)
        return;
    if (worker >= ds->nworkers) {
        ds->workers = sq_xrealloc(ds->workers, sizeof(*ds->workers) * (size_t)(worker + 1));
        memset(ds->workers + ds->nworkers, 0,
               sizeof(*ds->workers) * (size_t)(worker + 1 - ds->nworkers));
        ds->nworkers = worker + 1;
    }
    ds_worker_t *w = ds->workers[worker];
    if (w == NULL)
        w = ds->workers[worker] = sq_xcalloc(1, sizeof(*w));
    w->id = worker;
    w->up = 1;
    w->profiling = 0;
    w->kind = dev.kind;
    snprintf(w->device, sizeof(w->device), "%s", device);
    w->nloads = 0;
    w->nshas = 0;
    w->has_suspect = 0;
    w->profile_seq = 0;
    w->slice_id = 0;
    w->memory_bytes = memory;
    atomic_fetch_add(&ds->srv->kind_up[w->kind], 1);
    pl_dispatch_worker_add(ds->core, sq_now_us(), worker, 0);
    ds_start_profiles(ds);
    if (ds->srv->cfg->prefix_batching && (w->kind == SQ_DEV_CPU || w->kind == SQ_DEV_CUDA))
        gw_registry_foreach(ds->srv->registry, collect_grouped, &grouped);
    for (int i = 0; i < grouped.n; i++) {
        ds->group_epoch++;
        ds_group_of(ds, ds_model_get(ds, grouped.m[i]));
        gw_model_unref(grouped.m[i]);
    }
    free(grouped.m);
    /* Requests that waited for a worker of this kind (restarted after a
     * crash, say): it loads their models. */
    for (int i = 0; i < ds->nmodels; i++) {
        ds_model_t *dm = ds->models[i];
        int loading;
        if (dm->npending > 0 && !dm->removed && dm->kind == w->kind &&
            ds_loaded_anywhere(ds, dm, &loading) == 0 && loading == 0)
            ds_spread_loads(ds, dm);
    }
    gw__plan_invalidate(ds, w->kind, "worker up");
    ds_pump(ds);
}

static void worker_lost(gw_dispatch_t *ds, int worker)
{
    ds_worker_t *w = ds_worker_at(ds, worker);
    if (w == NULL || !w->up)
        return;
    w->up = 0;
    atomic_fetch_sub(&ds->srv->kind_up[w->kind], 1);
    note_suspect(w);
    if (w->inflight != NULL) {
        /* The core puts these requests back in their queues (or drops them
         * if their deadline no longer allows a retry). */
        sq_shm_release(ds->srv->arena, w->inflight->out_off);
        free(w->inflight->items);
        free(w->inflight);
        w->inflight = NULL;
    }
    pl_dispatch_worker_lost(ds->core, sq_now_us(), worker);
    w->slice_id = 0; /* ended with the worker, in the core too */
    w->profiling = 0;
    for (int i = 0; i < ds->nmodels; i++) {
        ds_model_t *dm = ds->models[i];
        if (dm->profile_worker == worker) {
            dm->profile_worker = -1;
            w->profiling = 0;
            ds_start_profile(ds, dm); /* on another worker, if any */
        }
    }
    w->nloads = 0;
    w->nshas = 0;
    gw__plan_invalidate(ds, w->kind, "worker lost");
    ds_pump(ds);
}

/* ---- entry points from other threads --------------------------------------- */

/* The record whose loads serve dm's requests (its twin, then the prefix
 * group it runs in, with its index there in *member, -1 when none), made
 * active at SLO bucket_ms the first time: placed by the planner. NULL
 * when no worker that can run it is up. */
static ds_model_t *serving_record(gw_dispatch_t *ds, ds_model_t *dm, double bucket_ms,
                                  const gw_item_t *it, int *member)
{
    ds_model_t *t = ds_twin_of(ds, dm);
    if (t != NULL)
        dm = t;
    ds_model_t *g = ds_group_of(ds, dm);
    *member = g != NULL ? ds_group_member_index(g, dm->m) : -1;
    if (g != NULL)
        dm = g;
    if (!dm->active) {
        dm->kind = ds_kind_of_model(ds->srv, dm->m);
        if (dm->kind < 0)
            return NULL;
        dm->active = 1;
        gw__plan_activate(ds, dm, bucket_ms, it);
    }
    return dm;
}

/* One submitted item on the dispatch thread: the record of the model that
 * serves it when it is to be queued now; NULL when it was answered (failed)
 * or waits for a load (pending). */
static ds_model_t *admit(gw_dispatch_t *ds, gw_item_t *it)
{
    gw_model_t *m = it->model;
    if (ds->aborted) {
        ds_fail_item(ds, it, SQ_SHUTTING_DOWN, "squishd is shutting down");
        return NULL;
    }
    if (it->ready_us >= it->deadline_us) {
        ds_fail_item(ds, it, SQ_DEADLINE, "the deadline passed during preprocessing");
        return NULL;
    }
    if (it->abandoned != NULL && atomic_load(it->abandoned)) {
        ds_fail_item(ds, it, SQ_DEADLINE, "its query was dropped");
        return NULL;
    }
    ds_model_t *dm = ds_model_find(ds, m->key);
    if (dm == NULL) {
        /* New here, or deleted and forgotten (see reclaim) while the item
         * was decoded: only a model still published gets a record. */
        gw_model_t *cur = gw_registry_get(ds->srv->registry, m->key);
        gw_model_unref(cur);
        if (cur == NULL) {
            ds_fail_item(ds, it, SQ_MODEL_NOT_FOUND, "the model was deleted");
            return NULL;
        }
        dm = ds_model_get(ds, m);
    }
    if (dm->removed) {
        ds_fail_item(ds, it, SQ_MODEL_NOT_FOUND, "the model was deleted");
        return NULL;
    }
    if (dm->poisoned) {
        ds_fail_item(ds, it, SQ_MODEL_FAILED, dm->failed_why);
        return NULL;
    }
    int member;
    dm = serving_record(ds, dm, gw_slo_bucket_ms(it->slo_ms), it, &member);
    if (dm == NULL) {
        ds_fail_item(ds, it, SQ_NO_WORKER, "no worker that can run this model is up");
        return NULL;
    }
    if (member >= 0)
        it->member = member;
    int loading;
    if (ds_loaded_anywhere(ds, dm, &loading) > 0)
        return dm;
    if (loading == 0)
        ds_spread_loads(ds, dm); /* the plan placed it nowhere yet: any worker will do */
    ds_loaded_anywhere(ds, dm, &loading);
    if (loading == 0 && !back_in_time(ds, dm, it)) {
        ds_fail_item(ds, it, SQ_NO_WORKER,
                     atomic_load(&ds->srv->kind_coming[dm->kind]) > 0
                         ? "no worker is up, and none is back before the deadline"
                         : "no worker could load the model");
        return NULL;
    }
    /* Waits for the load, for the worker holding it to finish measuring,
     * or for a worker being restarted (bounded by its deadline, see
     * on_tick). */
    if (dm->npending == dm->cappending) {
        dm->cappending = dm->cappending ? 2 * dm->cappending : 16;
        dm->pending = sq_xrealloc(dm->pending, sizeof(*dm->pending) * (size_t)dm->cappending);
    }
    dm->pending[dm->npending++] = it;
    return NULL;
}

/* An item, or a clump (items linked through clump_next, ready together):
 * each is admitted on its own, and those to queue now enter the core
 * together per model (ds_enqueue_items), so that a clump is one arrival
 * there. */
static void on_submit(sq_loop_t *loop, void *arg)
{
    gw_item_t *first = arg;
    gw_dispatch_t *ds = first->srv->dispatch;
    (void)loop;
    int n = 0;
    for (const gw_item_t *it = first; it != NULL; it = it->clump_next)
        n++;
    gw_item_t *one_item, *one_group;
    ds_model_t *one_dm;
    gw_item_t **items = n == 1 ? &one_item : sq_xmalloc(sizeof(*items) * (size_t)n);
    gw_item_t **group = n == 1 ? &one_group : sq_xmalloc(sizeof(*group) * (size_t)n);
    ds_model_t **dms = n == 1 ? &one_dm : sq_xmalloc(sizeof(*dms) * (size_t)n);
    int64_t now = sq_now_us();
    int k = 0;
    for (gw_item_t *it = first, *next; it != NULL; it = next) {
        /* Read before admit: an item answered there may be freed. */
        next = it->clump_next;
        it->clump_next = NULL;
        it->ready_us = now;
        ds_model_t *dm = admit(ds, it);
        if (dm != NULL) {
            items[k] = it;
            dms[k++] = dm;
        }
    }
    /* Per model, in the order submitted (a clump is one model's, but a
     * query's frames may go to several root stages). */
    for (int i = 0; i < k; i++) {
        ds_model_t *dm = dms[i];
        if (dm == NULL)
            continue;
        int g = 0;
        for (int j = i; j < k; j++) {
            if (dms[j] == dm) {
                group[g++] = items[j];
                dms[j] = NULL;
            }
        }
        ds_enqueue_items(ds, dm, group, g);
    }
    if (n > 1) {
        free(items);
        free(group);
        free(dms);
    }
    ds_pump(ds);
}

void gw_dispatch_submit(gw_server_t *srv, gw_item_t *item)
{
    sq_loop_post(srv->dispatch_loop, on_submit, item);
}

typedef struct {
    gw_server_t *srv;
    int64_t key;
    int profile;
} model_msg_t;

static void on_model_changed(sq_loop_t *loop, void *arg)
{
    model_msg_t *msg = arg;
    gw_dispatch_t *ds = msg->srv->dispatch;
    (void)loop;
    if (ds->aborted) {
        free(msg);
        return;
    }
    gw_model_t *m = gw_registry_get(msg->srv->registry, msg->key);
    ds_model_t *dm = ds_model_find(ds, msg->key);
    /* Groups: a member gone, or a new model ready to join, makes the next
     * request form the group anew. */
    ds->group_epoch++;
    for (int i = 0; i < ds->nmodels; i++) {
        ds_model_t *g = ds->models[i];
        if (!g->is_group || g->removed)
            continue;
        int member = 0;
        for (int k = 0; k < g->nmembers; k++)
            member |= g->members[k]->key == msg->key;
        if (member && m == NULL)
            ds_group_retire(ds, g, "a member model was deleted");
        else if (!member && m != NULL && m->group_id == g->group_id &&
                 strcmp(m->status, "ready") == 0)
            ds_group_retire(ds, g, "a new model joins the group");
    }
    if (m == NULL) {
        if (dm != NULL && !dm->removed) {
            dm->removed = 1;
            ds->reclaim_due = 1;
            ds_fail_pending(ds, dm, SQ_MODEL_NOT_FOUND, "the model was deleted");
            ds_withdraw(ds, dm);
            sq_bytes_unref(dm->blob);
            dm->blob = NULL;
            dm->blob_state = 0;
            if (dm->kind >= 0)
                gw__plan_invalidate(ds, dm->kind, "model removed");
        }
    } else {
        if (dm == NULL)
            dm = ds_model_get(ds, m);
        gw_model_unref(dm->m);
        dm->m = m; /* the new entry (profile, status) */
        ds_live_reset(dm);
        m = NULL;
        if (msg->profile != PROFILE_NONE) {
            gw_model_t *twin = msg->profile == PROFILE_WANTED ? ds_twin_find(ds, dm->m) : NULL;
            if (twin != NULL) {
                /* Measured already, as its older copy: nothing to measure. */
                profile_copy_job_t *j = sq_xcalloc(1, sizeof(*j));
                j->srv = ds->srv;
                j->from = twin->key;
                j->to = dm->key;
                SQ_INFO("profile taken from an identical model model=%s version=%d from=%s:%d",
                        dm->m->name, dm->m->version, twin->name, twin->version);
                gw_model_unref(twin);
                gw_db_post(ds->srv, profile_copy_job, j);
            } else {
                dm->profile_pending = 1;
                ds_start_profile(ds, dm);
            }
        }
        /* A model that became ready may complete a group: measure it now,
         * before its traffic comes. */
        ds_group_of(ds, dm);
    }
    gw_model_unref(m);
    ds_pump(ds);
    free(msg);
}

static void post_model_msg(gw_server_t *srv, int64_t key, int profile)
{
    model_msg_t *msg = sq_xcalloc(1, sizeof(*msg));
    msg->srv = srv;
    msg->key = key;
    msg->profile = profile;
    sq_loop_post(srv->dispatch_loop, on_model_changed, msg);
}

void gw_dispatch_model_changed(gw_server_t *srv, int64_t key)
{
    post_model_msg(srv, key, PROFILE_NONE);
}

void gw_dispatch_profile(gw_server_t *srv, int64_t key)
{
    post_model_msg(srv, key, PROFILE_WANTED);
}

static void resume_one(gw_model_t *m, void *arg)
{
    if (strcmp(m->status, "profiling") == 0)
        gw_dispatch_profile(arg, m->key);
}

void gw_dispatch_resume_profiling(gw_server_t *srv)
{
    gw_registry_foreach(srv->registry, resume_one, srv);
}

static void model_free(ds_model_t *dm)
{
    ds_live_reset(dm);
    gw_model_unref(dm->m);
    for (int k = 0; k < dm->nmembers; k++)
        gw_model_unref(dm->members[k]);
    free(dm->members);
    ds_group_free_blobs(dm);
    sq_bytes_unref(dm->blob);
    free(dm->pending);
    free(dm);
}

/* Frees what a delete left: a removed model (or retired group) once nothing
 * waits for it, no batch of it runs, and no other model points to it; and
 * workers' records of loads that are gone with no answer to come. Keeps
 * the tables (and their linear scans) as large as what is live. */
static void reclaim(gw_dispatch_t *ds)
{
    if (!ds->reclaim_due)
        return;
    ds->reclaim_due = 0;
    for (int i = 0; i < ds->nworkers; i++) {
        ds_worker_t *w = ds->workers[i];
        if (w == NULL)
            continue;
        int k = 0;
        for (int j = 0; j < w->nloads; j++) {
            const ds_load_t *l = &w->loads[j];
            if (l->state != LOAD_NONE || l->stale > 0 || ds_model_find(ds, l->key) != NULL)
                w->loads[k++] = *l;
        }
        w->nloads = k;
    }
    for (int i = 0; i < ds->nmodels; i++) {
        ds_model_t *dm = ds->models[i];
        if (!dm->removed)
            continue;
        if (dm->npending > 0 || dm->profile_worker >= 0) {
            ds->reclaim_due = 1;
            continue;
        }
        int busy = 0;
        for (int w = 0; w < ds->nworkers && !busy; w++) {
            const ds_worker_t *wk = ds->workers[w];
            busy = wk != NULL && wk->inflight != NULL && wk->inflight->model_key == dm->key;
        }
        if (busy) {
            ds->reclaim_due = 1; /* again when its batch is back */
            continue;
        }
        for (int j = 0; j < ds->nmodels; j++) {
            if (ds->models[j]->group == dm)
                ds->models[j]->group = NULL;
            if (ds->models[j]->twin == dm)
                ds->models[j]->twin = NULL;
        }
        for (int s = 0; s < ds->nsessions; s++)
            if (ds->sessions[s].model == dm)
                ds->sessions[s].model = NULL; /* its core session was removed */
        gw__plan_forget(ds, dm);
        model_free(dm);
        ds->models[i--] = ds->models[--ds->nmodels];
    }
}

/* ---- readiness (gw_dispatch_ready) ----------------------------------------- */

typedef struct {
    gw_dispatch_t *ds;
    char why[256];
} ready_scan_t;

/* A ready model no worker up can serve makes squishd not ready. */
static void scan_servable(gw_model_t *m, void *arg)
{
    ready_scan_t *x = arg;
    if (x->why[0] || strcmp(m->status, "ready") != 0)
        return;
    int kind = ds_kind_of_model(x->ds->srv, m);
    if (kind < 0 || atomic_load(&x->ds->srv->kind_up[kind]) == 0)
        snprintf(x->why, sizeof(x->why), "no worker that can serve model %s version %d is up%s",
                 m->name, m->version,
                 m->emulated ? " (an emulated model needs an emu worker)"
                 : kind >= 0 ? " (one is being restarted)"
                             : "");
}

static void held_add(gw_dispatch_t *ds, int64_t key)
{
    if (ds->nheld == ds->capheld) {
        ds->capheld = ds->capheld ? 2 * ds->capheld : 16;
        ds->held_keys = sq_xrealloc(ds->held_keys, sizeof(*ds->held_keys) * (size_t)ds->capheld);
    }
    ds->held_keys[ds->nheld++] = key;
}

/* Whether dm is a member of a prefix group (whose loads then serve it). */
static int in_group(const gw_dispatch_t *ds, const ds_model_t *dm)
{
    for (int i = 0; i < ds->nmodels; i++) {
        const ds_model_t *g = ds->models[i];
        for (int k = 0; k < g->nmembers && !g->removed && !g->failed; k++)
            if (g->members[k]->key == dm->key)
                return 1;
    }
    return 0;
}

/* Recomputes what gw_dispatch_ready and gw_dispatch_model_held answer. */
static void publish_ready(gw_dispatch_t *ds)
{
    ready_scan_t x = {.ds = ds};
    if (gw__plan_restoring(ds))
        snprintf(x.why, sizeof(x.why),
                 "reapplying the plan stored before the restart: waiting for its workers");
    if (!x.why[0])
        gw_registry_foreach(ds->srv->registry, scan_servable, &x);
    pthread_mutex_lock(&ds->ready_lock);
    ds->nheld = 0;
    for (int i = 0; i < ds->nmodels; i++) {
        ds_model_t *dm = ds->models[i];
        if (dm->removed || dm->poisoned)
            continue;
        int loading;
        int held = ds_loaded_anywhere(ds, dm, &loading) > 0;
        /* The same file under another name or version: its twin's loads
         * serve it (the twin as last resolved, without looking again). */
        ds_model_t *twin = dm->twin;
        if (!held && twin != NULL && !twin->removed && !twin->poisoned) {
            int tl;
            held = ds_loaded_anywhere(ds, twin, &tl) > 0;
        }
        if (held) {
            held_add(ds, dm->key);
            for (int k = 0; k < dm->nmembers; k++)
                held_add(ds, dm->members[k]->key);
        } else if (dm->active && !x.why[0] && dm->nmembers == 0 &&
                   strcmp(dm->m->status, "ready") == 0 && !in_group(ds, dm)) {
            snprintf(x.why, sizeof(x.why), "model %s version %d is %s", dm->m->name, dm->m->version,
                     loading > 0 ? "loading on its workers" : "placed but not loaded yet");
        }
    }
    snprintf(ds->ready_why, sizeof(ds->ready_why), "%s", x.why);
    pthread_mutex_unlock(&ds->ready_lock);
}

int gw_dispatch_ready(gw_server_t *srv, char *why, size_t len)
{
    gw_dispatch_t *ds = srv->dispatch;
    if (ds == NULL) {
        snprintf(why, len, "the dispatcher is starting");
        return 0;
    }
    pthread_mutex_lock(&ds->ready_lock);
    snprintf(why, len, "%s", ds->ready_why);
    pthread_mutex_unlock(&ds->ready_lock);
    return why[0] == '\0';
}

int gw_dispatch_model_held(gw_server_t *srv, int64_t key)
{
    gw_dispatch_t *ds = srv->dispatch;
    int held = 0;
    if (ds == NULL)
        return 0;
    pthread_mutex_lock(&ds->ready_lock);
    for (int i = 0; i < ds->nheld && !held; i++)
        held = ds->held_keys[i] == key;
    pthread_mutex_unlock(&ds->ready_lock);
    return held;
}

typedef struct {
    gw_server_t *srv;
    int64_t key;
} warm_t;

static void on_warm(sq_loop_t *loop, void *arg)
{
    warm_t *w = arg;
    gw_dispatch_t *ds = w->srv->dispatch;
    (void)loop;
    gw_model_t *m = ds != NULL ? gw_registry_get(ds->srv->registry, w->key) : NULL;
    free(w);
    if (m == NULL)
        return;
    ds_model_t *dm = strcmp(m->status, "ready") == 0 ? ds_model_get(ds, m) : NULL;
    double slo = m->default_slo_ms > 0 ? m->default_slo_ms : ds->srv->cfg->default_slo_ms;
    gw_model_unref(m);
    if (dm == NULL || dm->removed || dm->poisoned || ds->aborted)
        return;
    int member;
    if ((dm = serving_record(ds, dm, gw_slo_bucket_ms(slo), NULL, &member)) == NULL)
        return;
    int loading;
    if (ds_loaded_anywhere(ds, dm, &loading) == 0 && loading == 0)
        ds_spread_loads(ds, dm);
}

void gw_dispatch_warm(gw_server_t *srv, int64_t key)
{
    warm_t *w = sq_xmalloc(sizeof(*w));
    *w = (warm_t){.srv = srv, .key = key};
    sq_loop_post(srv->dispatch_loop, on_warm, w);
}

/* Items waiting for a first load are bounded by their deadlines. */
static void on_tick(sq_loop_t *loop, uint64_t id, void *data)
{
    gw_dispatch_t *ds = data;
    (void)id;
    int64_t t = sq_now_us();
    for (int i = 0; i < ds->nmodels; i++) {
        ds_model_t *dm = ds->models[i];
        int k = 0;
        for (int j = 0; j < dm->npending; j++) {
            gw_item_t *it = dm->pending[j];
            if (it->deadline_us <= t)
                ds_fail_item(ds, it, SQ_DEADLINE, "the model was still loading at the deadline");
            else
                dm->pending[k++] = it;
        }
        dm->npending = k;
    }
    gw__plan_tick(ds, t);
    /* Measurements waiting for a gap (or starved long enough). */
    for (int i = 0; i < ds->nworkers; i++)
        ds_profile_step(ds, ds->workers[i]);
    ds_pump(ds);
    reclaim(ds);
    publish_ready(ds);
    ds->tick = sq_loop_timer_at(loop, sq_now_ns() + (int64_t)TICK_MS * 1000000, on_tick, ds);
}

static void resubmit(gw_dispatch_t *ds, gw_item_t *it)
{
    sq_loop_post(ds->loop, on_submit, it);
}

static const gw_dispatch_ops_t dispatch_ops = {
    .send_load = ds_send_load,
    .unload = ds_unload,
    .update_routes = ds_update_routes,
    .pump = ds_pump,
    .model = ds_model_get,
    .serving_kind = ds_kind_of_model,
    .resubmit = resubmit,
};

gw_dispatch_t *gw_dispatch_new(gw_server_t *srv, sq_loop_t *loop)
{
    gw_dispatch_t *ds = sq_xcalloc(1, sizeof(*ds));
    ds->srv = srv;
    ds->ops = &dispatch_ops;
    ds->loop = loop;
    pl_dispatch_opts_t opts = {.policy = srv->cfg->policy,
                               .k_std = srv->cfg->k_std,
                               .eager_load = srv->cfg->eager_load,
                               .net_delay_us = srv->cfg->dispatch_margin_us,
                               .timer_slack_us = srv->cfg->timer_slack_us};
    ds->core = pl_dispatch_new(&opts);
    ds->plan = gw__plan_new(ds);
    ds->group_epoch = 1;
    pthread_mutex_init(&ds->ready_lock, NULL);
    snprintf(ds->ready_why, sizeof(ds->ready_why), "the dispatcher is starting");
    ds->tick = sq_loop_timer_at(loop, sq_now_ns() + (int64_t)TICK_MS * 1000000, on_tick, ds);
    return ds;
}

/* Answers everything the dispatcher holds 503 shutting_down: requests
 * waiting for a load, queued in the core, and in batches still running
 * (whose late BATCH_DONE then finds nothing, and whose worker's loss later
 * hands the core's ids back as stale handles). Idempotent. */
static void abort_all(gw_dispatch_t *ds)
{
    static const char why[] = "squishd is shutting down";
    ds->aborted = 1;
    for (int i = 0; i < ds->nmodels; i++)
        ds_fail_pending(ds, ds->models[i], SQ_SHUTTING_DOWN, why);
    for (int i = 0; i < ds->nworkers; i++) {
        ds_worker_t *w = ds->workers[i];
        if (w == NULL || w->inflight == NULL)
            continue;
        ds_batch_t *b = w->inflight;
        w->inflight = NULL;
        for (int k = 0; k < b->count; k++)
            ds_fail_item(ds, b->items[k], SQ_SHUTTING_DOWN, why);
        /* The worker may still write into the outputs: the region stays
         * allocated until the arena goes (squishd is exiting). The core
         * forgets the batch. */
        pl_dispatch_batch_done(ds->core, sq_now_us(), w->id, b->id);
        free(b->items);
        free(b);
    }
    for (int s = 0; s < ds->nsessions; s++)
        pl_dispatch_session_remove(ds->core, sq_now_us(), s);
    /* Queued requests come back as drops: pump answers them (aborted). */
    ds_pump(ds);
    /* Whatever still has a handle (none should) is answered too. */
    for (uint32_t i = 0; i < ds->nhandles; i++)
        if (ds->handles[i].item != NULL)
            ds_fail_item(ds, ds->handles[i].item, SQ_SHUTTING_DOWN, why);
    if (ds->timer)
        sq_loop_timer_cancel(ds->loop, ds->timer);
    ds->timer = 0;
}

void gw_dispatch_free(gw_dispatch_t *ds)
{
    if (ds == NULL)
        return;
    for (int i = 0; i < ds->nworkers; i++) {
        ds_worker_t *w = ds->workers[i];
        if (w == NULL)
            continue;
        free(w->loads);
        free(w->shas);
        free(w);
    }
    for (int i = 0; i < ds->nmodels; i++)
        model_free(ds->models[i]);
    free(ds->workers);
    free(ds->models);
    free(ds->sessions);
    free(ds->handles);
    gw__plan_free(ds->plan);
    pl_dispatch_free(ds->core);
    pthread_mutex_destroy(&ds->ready_lock);
    free(ds->held_keys);
    free(ds->progress);
    free(ds);
}

/* ---- the link's events ------------------------------------------------------ */

static void ev_up(void *ctx, int worker, const char *device, uint64_t memory_bytes)
{
    worker_up(ctx, worker, device, memory_bytes);
}

static int ev_frame(void *ctx, int worker, const sq_frame_t *f)
{
    return on_frame(ctx, worker, f);
}

static void ev_lost(void *ctx, int worker)
{
    worker_lost(ctx, worker);
}

static void ev_exited(void *ctx, int worker, int status)
{
    worker_exited(ctx, worker, status);
}

static void ev_link(void *ctx, int worker, const char *addr, int64_t rtt_us, double bytes_per_us)
{
    gw_dispatch_t *ds = ctx;
    ds_worker_t *w = ds_worker_at(ds, worker);
    if (w == NULL)
        return;
    snprintf(w->addr, sizeof(w->addr), "%s", addr);
    /* The first measure of a link re-plans at once (the worker came up as
     * if local); later drifts wait for the next periodic epoch. */
    if (w->up && w->rtt_us == 0 && w->bytes_per_us <= 0)
        gw__plan_invalidate(ds, w->kind, "link measured");
    w->rtt_us = rtt_us;
    w->bytes_per_us = bytes_per_us;
    /* The core keeps it for the worker id through its removals (while it
     * measures a model) and additions. */
    if (w->up)
        pl_dispatch_worker_net(ds->core, sq_now_us(), worker, rtt_us, bytes_per_us);
    gw_metrics_worker_link(ds->srv->metrics, worker, w->device, rtt_us, bytes_per_us);
}

static void ev_held(void *ctx, int worker, const char (*sha256)[65], int n)
{
    gw_dispatch_t *ds = ctx;
    ds_worker_t *w = ds_worker_at(ds, worker);
    if (w == NULL || !w->up)
        return;
    for (int i = 0; i < n; i++)
        ds_note_sha(w, sha256[i]);
    SQ_INFO("worker holds model files id=%d device=%s files=%d", worker, w->device, n);
}

static void ev_abort(void *ctx)
{
    abort_all(ctx);
}

const gw_transport_events_t gw_dispatch_events = {.up = ev_up,
                                                  .frame = ev_frame,
                                                  .lost = ev_lost,
                                                  .exited = ev_exited,
                                                  .abort = ev_abort,
                                                  .held = ev_held,
                                                  .link = ev_link};
