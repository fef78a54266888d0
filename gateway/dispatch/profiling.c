/* Profiling: a model uploaded as ONNX is measured on a worker of the kind
 * that will serve it (batch sizes 1..max, a few repeats) before it is
 * served. The worker goes on serving the models it holds: the measurement
 * runs in slices, each one foreign work in the dispatcher core
 * (pl_dispatch_worker_foreign) that fills a gap the worker's sessions can
 * spare. Also where a model is loaded (spread_loads) and how it leaves
 * service (withdraw), both of which end a measurement under way. */
#include "placement_int.h"

#define PROFILE_WARMUP 3
#define PROFILE_REPEATS 8
#define PROFILE_BUDGET_MS 30000
/* A slice is at most this long, or its one next batch when that is longer
 * (a worker with no session to serve still answers the dispatcher this
 * often), and at least this long (what it costs to send one is not worth
 * less). */
#define PROFILE_SLICE_MAX_US 200000
#define PROFILE_SLICE_MIN_US 2000
/* A measurement that found no gap waits at least this long before it
 * runs after a batch anyway. */
#define PROFILE_STARVE_US 500000

/* Takes dm out of service: its sessions leave the core (which answers
 * what they queued) and every worker holding it unloads it. */
void ds_withdraw(gw_dispatch_t *ds, ds_model_t *dm)
{
    /* A measurement under way is abandoned: the worker is free for the next
     * one (the unload below follows it on the same connection, and its late
     * answers are ignored, see gw_dispatch_frame). */
    if (dm->profile_worker >= 0)
        ds_end_profile(ds, dm, ds_worker_at(ds, dm->profile_worker));
    for (int s = 0; s < ds->batch.nsessions; s++)
        if (ds->batch.sessions[s].model == dm)
            pl_dispatch_session_remove(ds->batch.core, sq_now_us(), s);
    for (int i = 0; i < ds->nworkers; i++) {
        ds_worker_t *w = ds->workers[i];
        ds_load_t *l = w ? ds_load_find(w, dm->key, 0) : NULL;
        if (l != NULL && w->up && l->state != LOAD_NONE)
            ds_unload(ds, w, l);
    }
}

/* Makes sure every up worker of the model's kind holds it (or is loading). */
void ds_spread_loads(gw_dispatch_t *ds, ds_model_t *dm)
{
    for (int i = 0; i < ds->nworkers; i++) {
        ds_worker_t *w = ds->workers[i];
        if (w == NULL || !w->up || w->kind != dm->kind)
            continue;
        ds_load_t *l = ds_load_find(w, dm->key, 0);
        if (l == NULL || l->state == LOAD_NONE)
            ds_send_load(ds, dm, w);
    }
}

/* ---- profiling ---------------------------------------------------------- */

/* The model w measures, or NULL. */
static ds_model_t *measured_on(gw_dispatch_t *ds, const ds_worker_t *w)
{
    for (int i = 0; i < ds->nmodels; i++)
        if (ds->models[i]->profile_worker == w->id && !ds->models[i]->removed)
            return ds->models[i];
    return NULL;
}

void ds_profile_step(gw_dispatch_t *ds, ds_worker_t *w)
{
    if (w == NULL || !w->up || !w->profiling || w->slice_id != 0)
        return;
    ds_model_t *dm = measured_on(ds, w);
    ds_load_t *l = dm != NULL ? ds_load_find(w, dm->key, 0) : NULL;
    if (l == NULL || l->state != LOAD_DONE)
        return; /* the load's answer steps again */
    /* Nor while the worker builds another model (on its loader thread):
     * should the worker crash, the measurement alone is the suspect. */
    for (int i = 0; i < w->nloads; i++)
        if (w->loads[i].state == LOAD_SENT || w->loads[i].stale > 0)
            return;
    int64_t now = sq_now_us();
    int64_t need =
        w->slice_next_us > PROFILE_SLICE_MIN_US ? w->slice_next_us : PROFILE_SLICE_MIN_US;
    int64_t gap = pl_dispatch_worker_gap_us(ds->batch.core, now, w->id);
    /* A slice holds at least the next batch: capped below it, a batch
     * longer than the cap (resnet18 from batch ~20 on a 2-vCPU box) never
     * fitted even an idle worker's unbounded gap, and each of its runs
     * waited nine times its length first (resnet18 measured in 2 min 17 s
     * instead of its 30 s budget, sizes 12-15 taking 14-46 s each). */
    int64_t cap = need > PROFILE_SLICE_MAX_US ? need : PROFILE_SLICE_MAX_US;
    int64_t slice = gap < cap ? gap : cap;
    int after = 0;
    if (slice < need) {
        /* No gap fits its next batch: once it has waited nine times that
         * batch's length it runs after the batch in flight anyway, so a
         * measurement takes at most a tenth of a busy worker's time (and
         * is never starved). */
        int64_t wait = 9 * need > PROFILE_STARVE_US ? 9 * need : PROFILE_STARVE_US;
        if (now - w->slice_wait_since_us < wait)
            return;
        slice = need;
        after = 1;
    }
    uint64_t id = pl_dispatch_worker_foreign(ds->batch.core, now, w->id, slice, after);
    if (id == 0)
        return;
    sq_profile_req_t req = {.max_batch = (uint32_t)dm->m->max_batch,
                            .warmup = PROFILE_WARMUP,
                            .repeats = PROFILE_REPEATS,
                            .budget_ms = PROFILE_BUDGET_MS,
                            .slice_us = (uint32_t)(slice < UINT32_MAX ? slice : UINT32_MAX),
                            .flags = w->slice_fresh ? SQ_PROFILE_FRESH : 0};
    sq_buf_t buf;
    sq_buf_init(&buf);
    sq_profile_req_encode(&buf, &req);
    ds_link_send(ds, w->id, SQ_MSG_PROFILE, (uint64_t)dm->key, buf.data, (uint32_t)buf.len, NULL,
                 0);
    sq_buf_dispose(&buf);
    w->slice_id = id;
    w->slice_fresh = 0;
    w->profile_key = dm->key;
    w->profile_seq = ++w->job_seq;
}

void ds_slice_over(gw_dispatch_t *ds, ds_worker_t *w, int64_t next_us)
{
    if (w->slice_id != 0) {
        pl_dispatch_batch_done(ds->batch.core, sq_now_us(), w->id, w->slice_id);
        w->slice_id = 0;
    }
    w->slice_next_us = next_us;
    w->slice_wait_since_us = sq_now_us();
    w->profile_seq = 0;
}

void ds_start_profile(gw_dispatch_t *ds, ds_model_t *dm)
{
    if (!dm->profile_pending || dm->profile_worker >= 0 || dm->removed || dm->poisoned)
        return;
    ds_worker_t *pick = NULL;
    for (int pass = 0; pass < 2 && pick == NULL; pass++) {
        int want = pass == 0 ? SQ_DEV_CUDA : SQ_DEV_CPU;
        /* Not on a kind whose backend cannot run it: the importer's rules
         * said so at upload, or a worker of that kind refused its load. */
        if (dm->m->not_on[want][0] != '\0' || (dm->refused_kinds & (1u << want)))
            continue;
        for (int i = 0; i < ds->nworkers && pick == NULL; i++) {
            ds_worker_t *w = ds->workers[i];
            if (w != NULL && w->up && !w->profiling && w->kind == want)
                pick = w;
        }
    }
    if (pick == NULL)
        return; /* retried when a cpu or cuda worker comes up */
    dm->profile_worker = pick->id;
    pick->profiling = 1;
    pick->slice_fresh = 1;
    pick->slice_next_us = 0;
    pick->slice_wait_since_us = sq_now_us();
    SQ_INFO("profiling model=%s version=%d worker=%d device=%s", dm->m->name, dm->m->version,
            pick->id, pick->device);
    ds_progress_set(ds, dm, pick, 0, 0);
    ds_load_t *l = ds_load_find(pick, dm->key, 0);
    if (l != NULL && l->state == LOAD_DONE) {
        ds_profile_step(ds, pick);
    } else if (l == NULL || l->state == LOAD_NONE || l->state == LOAD_FAILED) {
        if (l != NULL)
            l->state = LOAD_NONE;
        ds_send_load(ds, dm, pick);
    }
}

/* Models that asked to be measured while every worker was busy measuring:
 * each takes a free worker, if there is one. */
void ds_start_profiles(gw_dispatch_t *ds)
{
    for (int i = 0; i < ds->nmodels; i++)
        ds_start_profile(ds, ds->models[i]); /* a no-op for removed ones */
}

void ds_end_profile(gw_dispatch_t *ds, ds_model_t *dm, ds_worker_t *w)
{
    ds_progress_set(ds, dm, NULL, 0, 0);
    dm->profile_worker = -1;
    dm->profile_pending = 0;
    /* A slice still running keeps the worker in the core until its answer
     * (ds_slice_over). */
    if (w != NULL)
        w->profiling = 0;
    ds_start_profiles(ds);
}
