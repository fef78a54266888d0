/* Profiling: a model uploaded as ONNX is measured on a worker of the kind
 * that will serve it (batch sizes 1..max, a few repeats) before it is
 * served; that worker is out of the core meanwhile. Also where a model
 * is loaded (spread_loads) and how it leaves service (withdraw), both of
 * which end a measurement under way. */
#include "gw_dispatch_int.h"

#define PROFILE_WARMUP 3
#define PROFILE_REPEATS 8
#define PROFILE_BUDGET_MS 30000

/* Takes dm out of service: its sessions leave the core (which answers
 * what they queued) and every worker holding it unloads it. */
void ds_withdraw(gw_dispatch_t *ds, ds_model_t *dm)
{
    /* A measurement under way is abandoned: the worker is free for the next
     * one (the unload below follows it on the same connection, and its late
     * answers are ignored, see gw_dispatch_frame). */
    if (dm->profile_worker >= 0)
        ds_end_profile(ds, dm, ds_worker_at(ds, dm->profile_worker));
    for (int s = 0; s < ds->nsessions; s++)
        if (ds->sessions[s].model == dm)
            pl_dispatch_session_remove(ds->core, sq_now_us(), s);
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

void ds_start_profile(gw_dispatch_t *ds, ds_model_t *dm)
{
    if (!dm->profile_pending || dm->profile_worker >= 0 || dm->removed || dm->poisoned)
        return;
    ds_worker_t *pick = NULL;
    for (int pass = 0; pass < 2 && pick == NULL; pass++) {
        int want = pass == 0 ? GW_KIND_CUDA : GW_KIND_CPU;
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
    pl_dispatch_worker_remove(ds->core, sq_now_us(), pick->id);
    SQ_INFO("profiling model=%s version=%d worker=%d device=%s", dm->m->name, dm->m->version,
            pick->id, pick->device);
    ds_progress_set(ds, dm, pick, 0, 0);
    ds_load_t *l = ds_load_find(pick, dm->key, 0);
    if (l != NULL && l->state == LOAD_DONE) {
        sq_profile_req_t req = {.max_batch = (uint32_t)dm->m->max_batch,
                                .warmup = PROFILE_WARMUP,
                                .repeats = PROFILE_REPEATS,
                                .budget_ms = PROFILE_BUDGET_MS};
        sq_buf_t buf;
        sq_buf_init(&buf);
        sq_profile_req_encode(&buf, &req);
        ds_link_send(ds, pick->id, SQ_MSG_PROFILE, (uint64_t)dm->key, buf.data, (uint32_t)buf.len,
                     NULL, 0);
        sq_buf_dispose(&buf);
        pick->profile_key = dm->key;
        pick->profile_seq = ++pick->job_seq;
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
    if (w != NULL && w->profiling) {
        w->profiling = 0;
        if (w->up) {
            pl_dispatch_worker_add(ds->core, sq_now_us(), w->id, 0);
            for (int i = 0; i < ds->nmodels; i++)
                if (ds->models[i]->active)
                    ds_update_routes(ds, ds->models[i]);
        }
    }
    ds_start_profiles(ds);
    /* Requests that waited for the worker to finish measuring. */
    int loading;
    for (int i = 0; i < ds->nmodels; i++) {
        ds_model_t *m = ds->models[i];
        if (!m->removed && m->npending > 0 && ds_loaded_anywhere(ds, m, &loading) > 0)
            ds_flush_pending(ds, m);
    }
}
