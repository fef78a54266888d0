/* The dispatch thread's answers to the workers' link (gw_dispatch_events):
 * a worker up, lost or exited, its frames (batches done, models loaded or
 * failed, measurements' progress, slices and results), the model files it
 * already holds, its link measured. And the models that crash their
 * workers: an exit by a signal of its own counts a crash against the job it
 * was running, and past --model-retries the model is poisoned. The top of
 * dispatch/: it calls dispatch.c (the registry refresh, the abort) and the
 * files below it. */
#include "batcher_int.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

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
    gw_dispatch_t *ds;
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
    /* The precision its plan ran on this kind, and how far from FP32. */
    mdb_precision_t prec = {.runs = sq_precision_name(p->done.precision),
                            .max_abs_deviation = p->done.max_abs_deviation,
                            .max_rel_deviation = p->done.max_rel_deviation};
    int rc = mdb_profile_store(db, p->key, p->device_kind, p->device_name, rows,
                               ok ? (int)p->done.nrows : 0, ok ? "ready" : "failed",
                               ok ? NULL : p->done.message, ok ? &prec : NULL);
    free(rows);
    if (rc == SQ_MODEL_NOT_FOUND)
        SQ_INFO("profile not stored: the model was deleted while it was measured key=%lld",
                (long long)p->key);
    else if (rc != 0)
        SQ_ERROR("cannot store the profile key=%lld error=\"%s\"", (long long)p->key,
                 mdb_errmsg(db));
    ds_registry_refresh(db, p->ds, p->key);
    free(p);
}

/* ---- a device kind that cannot run a model --------------------------------
 * The importer's rules say at upload which device kinds' backends run a
 * model (gw_model_t.not_on); a worker whose backend refuses a load anyway
 * while the model is measured (its lowering refuses an op, the model does
 * not fit the device's memory, the device library finds no engine) tells
 * of a kind that cannot run it: the reason is stored with the model
 * (mdb_model_set_not_on), and the model is measured on the next kind,
 * rather than failing while a cpu worker could serve it. */

typedef struct {
    gw_dispatch_t *ds;
    int64_t key;
    char kind[8];
    char why[192];
} not_on_job_t;

static void not_on_job(mdb_t *db, void *arg)
{
    not_on_job_t *j = arg;
    int rc = mdb_model_set_not_on(db, j->key, j->kind, j->why);
    if (rc != 0 && rc != SQ_MODEL_NOT_FOUND)
        SQ_ERROR("cannot store a device kind that refuses a model key=%lld error=\"%s\"",
                 (long long)j->key, mdb_errmsg(db));
    ds_registry_refresh(db, j->ds, j->key);
    free(j);
}

/* Whether w's refusal e to load dm, which w was to measure, is its kind's
 * backend refusing the model while another kind may run it; if so, the
 * kind is marked (dm->refused_kinds, and in the model DB). */
static int refused_here(gw_dispatch_t *ds, ds_model_t *dm, const ds_worker_t *w,
                        const sq_ipc_error_t *e)
{
    if (e->code != SQ_UNSUPPORTED_MODEL && e->code != SQ_NOMEM && e->code != SQ_DEVICE)
        return 0;
    /* Another kind that may run it, with workers up or coming back: a
     * kind the fleet has none of would leave the model waiting for ever. */
    int other = 0;
    for (int k = 0; k < SQ_DEV_KIND_COUNT; k++)
        other |= k != w->kind && k != SQ_DEV_EMU && dm->m->not_on[k][0] == '\0' &&
                 !(dm->refused_kinds & (1u << k)) &&
                 (ds->pub.fleet.up[k] > 0 || ds->pub.fleet.coming[k] > 0);
    if (!other)
        return 0;
    dm->refused_kinds |= 1u << w->kind;
    SQ_WARN("model measured on another device kind model=%s version=%d refused_by=%s "
            "reason=\"%s\"",
            dm->m->name, dm->m->version, sq_dev_kind_name(w->kind), e->message);
    if (ds->db == NULL)
        return 1; /* a dispatcher without storage (unit tests, benches) */
    not_on_job_t *j = sq_xcalloc(1, sizeof(*j));
    j->ds = ds;
    j->key = dm->key;
    snprintf(j->kind, sizeof(j->kind), "%s", sq_dev_kind_name(w->kind));
    snprintf(j->why, sizeof(j->why), "%s worker %d refused the load: %s", j->kind, w->id,
             e->message);
    gw_db_job(ds->db, not_on_job, j);
    return 1;
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
    gw_dispatch_t *ds;
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
    ds_registry_refresh(db, j->ds, j->key);
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
        ds_plan_invalidate(ds, dm->kind, "model failed");
    sq_bytes_unref(dm->blob);
    dm->blob = NULL;
    dm->blob_state = 0;
    fail_job_t *j = sq_xcalloc(1, sizeof(*j));
    j->ds = ds;
    j->key = dm->key;
    snprintf(j->why, sizeof(j->why), "%s", why);
    gw_db_job(ds->db, fail_job, j);
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
    if (dm->crashes > ds->cfg.model_retries) {
        poison(ds, dm, why);
    } else {
        SQ_WARN("worker crashed model=%s version=%d doing=%s signal=%s crashes=%d retries=%d",
                dm->m->name, dm->m->version, w->suspect_doing, sigabbrev(sig), dm->crashes,
                ds->cfg.model_retries);
    }
    ds_pump(ds);
}

static int on_frame(gw_dispatch_t *ds, int worker, const sq_frame_t *f)
{
    ds_worker_t *w = ds_worker_at(ds, worker);
    if (w == NULL)
        return -1;
    switch (f->type) {
    case SQ_MSG_WORKER_DATA: {
        sq_reader_t r;
        sq_reader_init(&r, f->payload, f->len);
        char addr[sizeof(w->data_addr)];
        sq_get_str(&r, addr, sizeof(addr));
        if (r.err || r.left != 0 || addr[0] == '\0')
            return -1;
        if (strcmp(addr, w->data_addr) != 0)
            SQ_INFO("worker data address id=%d addr=%s", w->id, addr);
        snprintf(w->data_addr, sizeof(w->data_addr), "%s", addr);
        return 0;
    }
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
        if (l == NULL)
            return 0;
        if (dm == NULL || dm->removed) {
            /* Deleted or unloaded meanwhile: a copy that loaded is dropped
             * at once (else it would stay on the worker, and a record
             * loading forever would keep a model loaded again from being
             * sent there). */
            l->state = f->type == SQ_MSG_MODEL_LOADED ? LOAD_DONE : LOAD_NONE;
            if (l->state == LOAD_DONE)
                ds_unload(ds, w, l);
            return 0;
        }
        if (f->type == SQ_MSG_MODEL_LOADED) {
            sq_model_loaded_t info;
            if (sq_model_loaded_decode(f, &info) != 0)
                return -1;
            l->state = LOAD_DONE;
            l->max_batch = (int)info.max_batch;
            ds_plan_loaded(ds, w->kind);
            SQ_INFO("model loaded worker=%d device=%s model=%s version=%d memory_mb=%llu", w->id,
                    w->device, dm->m->name, dm->m->version,
                    (unsigned long long)(info.memory_bytes >> 20));
            ds_profile_step(ds, w); /* its measurement waited for the load */
            if (dm->active) {
                ds_update_routes(ds, dm);
                ds_flush_pending(ds, dm);
            } else {
                dm->routes_stale = 1;
            }
            /* Held from now on, for whoever asks before the next tick: a
             * model just measured on this load is ready at once, and its
             * state must say so (the index said LOADING for up to a tick
             * after its first answer). */
            ds_publish_ready(ds);
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
            } else if (dm->profile_worker == w->id && refused_here(ds, dm, w, &e)) {
                /* Measured on the next kind instead (ds_start_profile). */
                ds_end_profile(ds, dm, w);
                dm->profile_pending = 1;
                ds_start_profile(ds, dm);
            } else if (dm->profile_worker == w->id) {
                sq_profile_done_t failed = {.code = e.code};
                profile_store_t *p = sq_xcalloc(1, sizeof(*p));
                p->ds = ds;
                p->key = dm->key;
                snprintf(p->device_kind, sizeof(p->device_kind), "%s", sq_dev_kind_name(w->kind));
                snprintf(p->device_name, sizeof(p->device_name), "%s", w->device);
                p->done = failed;
                snprintf(p->done.message, sizeof(p->done.message), "load: %s", e.message);
                ds_end_profile(ds, dm, w);
                gw_db_job(ds->db, profile_store_job, p);
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
        uint64_t spent = sq_get_u64(&r), left = sq_get_u64(&r);
        ds_model_t *dm = ds_model_find(ds, (int64_t)f->id);
        if (!r.err && dm != NULL) {
            SQ_INFO("profiling progress model=%s version=%d sizes=%u of=%u run_ms=%.0f "
                    "left_ms=%.0f",
                    dm->m->name, dm->m->version, b, total, (double)spent / 1000.0,
                    (double)left / 1000.0);
            if (dm->profile_worker == w->id) {
                ds_progress_set(ds, dm, w, (int)b, (int)total);
                ds_progress_times(ds, dm, (double)spent, (double)left);
            }
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
        p->ds = ds;
        p->key = (int64_t)f->id;
        snprintf(p->device_kind, sizeof(p->device_kind), "%s", sq_dev_kind_name(w->kind));
        snprintf(p->device_name, sizeof(p->device_name), "%s", w->device);
        gw_db_job(ds->db, profile_store_job, p);
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
    pthread_mutex_lock(&ds->pub.ready_lock);
    ds->pub.fleet.up[w->kind]++;
    ds->pub.fleet.workers_up++;
    pthread_mutex_unlock(&ds->pub.ready_lock);
    pl_dispatch_worker_add(ds->batch.core, sq_now_us(), worker, 0);
    ds_start_profiles(ds);
    if (ds->cfg.prefix_batching && (w->kind == SQ_DEV_CPU || w->kind == SQ_DEV_CUDA))
        gw_registry_foreach(ds->registry, collect_grouped, &grouped);
    for (int i = 0; i < grouped.n; i++) {
        ds->place.group_epoch++;
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
    ds_plan_invalidate(ds, w->kind, "worker up");
    ds_pump(ds);
}

static void worker_lost(gw_dispatch_t *ds, int worker)
{
    ds_worker_t *w = ds_worker_at(ds, worker);
    if (w == NULL || !w->up)
        return;
    w->up = 0;
    w->data_addr[0] = '\0'; /* it says again when it is back */
    pthread_mutex_lock(&ds->pub.ready_lock);
    ds->pub.fleet.up[w->kind]--;
    ds->pub.fleet.workers_up--;
    pthread_mutex_unlock(&ds->pub.ready_lock);
    note_suspect(w);
    if (w->inflight != NULL) {
        /* The core puts these requests back in their queues (or drops them
         * if their deadline no longer allows a retry). */
        if (w->inflight->out_off >= 0)
            sq_shm_release(ds->arena, w->inflight->out_off);
        free(w->inflight->items);
        free(w->inflight);
        w->inflight = NULL;
    }
    pl_dispatch_worker_lost(ds->batch.core, sq_now_us(), worker);
    w->slice_id = 0; /* ended with the worker, in the core too */
    w->profiling = 0;
    for (int i = 0; i < ds->nmodels; i++) {
        ds_model_t *dm = ds->models[i];
        if (dm->kind == w->kind)
            dm->routes_stale = 1; /* its fallback holders may be fewer */
        if (dm->profile_worker == worker) {
            dm->profile_worker = -1;
            w->profiling = 0;
            ds_start_profile(ds, dm); /* on another worker, if any */
        }
    }
    w->nloads = 0;
    w->nshas = 0;
    ds_plan_invalidate(ds, w->kind, "worker lost");
    ds_pump(ds);
    ds_publish_ready(ds); /* what it held is held no more */
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

/* The link's look at the workers being restarted: the fleet's coming
 * part (the dispatch thread is its one writer). */
static void ev_coming(void *ctx, const int *coming, const int64_t *back_at_us)
{
    gw_dispatch_t *ds = ctx;
    pthread_mutex_lock(&ds->pub.ready_lock);
    for (int k = 0; k < SQ_DEV_KIND_COUNT; k++) {
        ds->pub.fleet.coming[k] = coming[k];
        ds->pub.fleet.back_at_us[k] = back_at_us[k];
    }
    pthread_mutex_unlock(&ds->pub.ready_lock);
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
        ds_plan_invalidate(ds, w->kind, "link measured");
    w->rtt_us = rtt_us;
    w->bytes_per_us = bytes_per_us;
    /* The core keeps it for the worker id through its removals (while it
     * measures a model) and additions. */
    if (w->up)
        pl_dispatch_worker_net(ds->batch.core, sq_now_us(), worker, rtt_us, bytes_per_us);
    gw_metrics_worker_link(ds->metrics, worker, w->device, rtt_us, bytes_per_us);
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

static void ev_fe_up(void *ctx, int fe, const char *name, const char *addr)
{
    ds_fe_up(ctx, fe, name, addr);
}

static int ev_fe_frame(void *ctx, int fe, const sq_frame_t *f)
{
    return ds_fe_frame(ctx, fe, f);
}

static void ev_fe_lost(void *ctx, int fe)
{
    ds_fe_lost(ctx, fe);
}

static void ev_abort(void *ctx)
{
    ds_abort_all(ctx);
}

const gw_transport_events_t gw_dispatch_events = {.up = ev_up,
                                                  .frame = ev_frame,
                                                  .lost = ev_lost,
                                                  .exited = ev_exited,
                                                  .abort = ev_abort,
                                                  .held = ev_held,
                                                  .link = ev_link,
                                                  .coming = ev_coming,
                                                  .fe_up = ev_fe_up,
                                                  .fe_frame = ev_fe_frame,
                                                  .fe_lost = ev_fe_lost};