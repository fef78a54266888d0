/* Live planning: the dispatch thread's epochs. What decides (rates and
 * epoch triggers, the sessions given to the placement core, idle
 * sessions, clump dispersion, routes and their fallbacks, stored rates,
 * pipeline splits) is the planning loop of planner/pl_loop.h, the same
 * code squish-sim runs; this file is its shell's entry points: it makes
 * the loop, hands it arrivals, outcomes and invalidations, runs epochs as
 * the tick and new models call for them, splits pipelines' SLOs again, and
 * reapplies the plan stored before a restart. epochs.c feeds the loop and
 * applies each plan; plan_report.c serves it (GET /v1/plan), stores it in
 * the model DB and publishes its metrics.
 *
 * The loop runs here, on the dispatch thread: well under a millisecond
 * for the sessions one squishd serves (bench: 0.3 ms for 100 sessions);
 * a deployment with thousands of sessions would want it on a thread of
 * its own. */
#include "placement_int.h"
#include "gw_catalog.h"
#include "gw_metrics.h"

#include <pl_loop.h>

#include <stdlib.h>
#include <string.h>

/* After a restart, the stored plan waits this long after the first worker
 * up for the workers it names and the configured ones; then it is
 * reapplied with those up. */
#define RESTORE_WAIT_US 3000000

static void restore_take(ds_plan_state_t *p, gw_registry_t *reg, json_t *plan, json_t *rows);
static int restore_all(gw_dispatch_t *ds);
static int restore_ready(gw_dispatch_t *ds, int64_t now);

ds_plan_state_t *ds_plan_new(gw_dispatch_t *ds)
{
    ds_plan_state_t *p = sq_xcalloc(1, sizeof(*p));
    const gw_dispatch_config_t *cfg = &ds->cfg;
    pl_loop_config_t lc;
    pl_loop_config_default(&lc);
    lc.epoch.period_ms = cfg->epoch_ms;
    lc.epoch.min_interval_ms = cfg->epoch_min_interval_ms;
    lc.scale_up_ms = cfg->epoch_scale_up_ms;
    lc.headroom = cfg->plan_headroom;
    lc.burst_quantile = cfg->plan_burst_quantile;
    lc.k_std = cfg->core.k_std;
    lc.overflow = 1;
    lc.nkinds = SQ_DEV_KIND_COUNT;
    lc.slo_bucket_ms = gw_slo_bucket_ms;
    p->window_start_us = sq_now_us();
    p->loop = pl_loop_new(&lc, p->window_start_us);
    json_t *plan, *rows;
    p->epoch = gw_db_last_plan(ds->db, &plan, &rows);
    pthread_mutex_init(&p->lock, NULL);
    restore_take(p, ds->registry, plan, rows);
    if (cfg->plan_thread)
        ds_plan_thread_start(p);
    return p;
}

void ds_plan_free(ds_plan_state_t *p)
{
    if (p == NULL)
        return;
    ds_plan_thread_stop(p);
    pl_loop_free(p->loop);
    for (int i = 0; i < p->npipes; i++)
        gw_pipeline_unref(p->pipes[i]);
    free(p->pipes);
    free(p->json);
    free(p->restore);
    pthread_mutex_destroy(&p->lock);
    free(p);
}

pl_loop_t *ds_plan_loop(gw_dispatch_t *ds)
{
    return ds->place.plan->loop;
}

void ds_plan_forget(gw_dispatch_t *ds, const ds_model_t *dm)
{
    pl_loop_model_forget(ds->place.plan->loop, dm->key);
}

void ds_plan_arrival(gw_dispatch_t *ds, ds_model_t *dm, double bucket_ms, const gw_item_t *it)
{
    ds_plan_state_t *p = ds->place.plan;
    if (it != NULL && it->pipe.pipeline != NULL) {
        ds_plan_pipeline_known(ds, it->pipe.pipeline);
        pl_loop_stage_arrivals(p->loop, ds_plan_pipe_key(it->pipe.pipeline), it->pipe.stage,
                               it->pipe.query_slo_ms, dm->key, 1);
    } else {
        /* Its SLO, not only its bucket: a session is planned at the least
         * SLO of its requests (pl_loop.h). */
        pl_loop_arrivals(p->loop, dm->key, it != NULL ? it->ask.slo_ms : bucket_ms, 1);
    }
}

void ds_plan_outcome(gw_dispatch_t *ds, int ok)
{
    if (ok)
        ds->place.plan->ok += 1;
    else
        ds->place.plan->bad += 1;
}

void ds_plan_busy(gw_dispatch_t *ds, int worker, int64_t busy_us)
{
    (void)worker;
    ds->place.plan->busy_us += (double)busy_us;
}

/* Splits each pipeline's SLO again (the query DP over its stages' current
 * profiles, measured gammas and rate): at every epoch of any kind, when a
 * gamma moved (gw_pipeline_fanout), and at least every
 * PIPELINE_RESPLIT_US. Returns 1 when a split changed. */
#define PIPELINE_RESPLIT_US 10000000
#define PIPELINE_EPSILON_MS 1.0
static int resplit_pipelines(gw_dispatch_t *ds, int64_t now_us, int force)
{
    int changed = 0;
    int n = 0;
    gw_pipeline_t **all = gw_pipes_all(ds->pipelines, &n);
    /* Of a stage's budget, its batches get what the dispatch margin and
     * the decode (or a crop's cut, cheaper) before them leave: a budget
     * the DP finds cheapest on paper but that holds no batch live would
     * drop every query. The decode's 99th percentile, not its mean: with
     * the mean, every frame whose decode took longer than usual (a
     * progressive JPEG, a neighbour on the core) ended past its stage's
     * deadline. */
    double overhead_us = (double)ds->cfg.core.net_delay_us;
    if (n > 0 && ds->prep != NULL)
        overhead_us += gw_prep_pool_decode_p99_us(ds->prep);
    for (int i = 0; i < n; i++) {
        gw_pipeline_t *pl = all[i];
        if (force || gw_pipeline_resplit_due(pl, now_us, PIPELINE_RESPLIT_US)) {
            gw_model_t *m[GW_PIPE_MAX_STAGES] = {0};
            const pl_profile_t *prof[GW_PIPE_MAX_STAGES] = {0};
            for (int s = 0; s < pl->nstages; s++) {
                const gw_stage_spec_t *st = &pl->stages[s];
                m[s] = gw_registry_find(ds->registry, st->model, strlen(st->model), st->version);
                int kind = m[s] != NULL ? ds_kind_of_model(ds, m[s]) : -1;
                if (kind >= 0 && m[s]->has_profile[kind])
                    prof[s] = &m[s]->profile[kind];
            }
            if (gw_pipeline_resplit(pl, prof, ds->cfg.core.k_std, PIPELINE_EPSILON_MS,
                                    overhead_us / 1000.0, now_us)) {
                changed = 1;
                json_t *j = gw_pipeline_json(pl);
                char *txt = sq_json_dumps(json_object_get(j, "split"), JSON_COMPACT);
                SQ_INFO("pipeline split name=%s split=%s", pl->name, txt ? txt : "?");
                free(txt);
                json_decref(j);
            }
            for (int s = 0; s < pl->nstages; s++)
                gw_model_unref(m[s]);
        }
        gw_pipeline_unref(pl);
    }
    free(all);
    return changed;
}

void ds_plan_activate(gw_dispatch_t *ds, ds_model_t *dm, double bucket_ms, const gw_item_t *it,
                      int64_t now_us)
{
    ds_plan_state_t *p = ds->place.plan;
    if (it != NULL && it->pipe.pipeline != NULL) {
        ds_plan_pipeline_known(ds, it->pipe.pipeline);
        pl_loop_stage_arrivals(p->loop, ds_plan_pipe_key(it->pipe.pipeline), it->pipe.stage,
                               it->pipe.query_slo_ms, dm->key, 0);
    }
    pl_loop_session(p->loop, dm->key, it != NULL ? it->ask.slo_ms : bucket_ms, 1);
    /* An epoch before the stored plan was reapplied: reapply it now, with
     * the workers that are up (when that planned dm's kind, no other epoch
     * runs). */
    if (dm->kind >= 0 && !(p->nrestore > 0 && (restore_all(ds) & (1 << dm->kind))))
        ds_plan_epoch(ds, dm->kind, "new model", now_us);
}

void ds_plan_invalidate(gw_dispatch_t *ds, int kind, const char *reason)
{
    if (kind < 0 || kind >= SQ_DEV_KIND_COUNT)
        return;
    pl_loop_invalidate(ds->place.plan->loop, kind, reason);
}

int ds_plan_restoring(const gw_dispatch_t *ds)
{
    return ds->place.plan->nrestore > 0;
}

void ds_plan_tick(gw_dispatch_t *ds, int64_t now_us)
{
    ds_plan_state_t *p = ds->place.plan;
    ds_plan_collect(ds);
    ds_plan_settle_due(ds);
    /* After a restart, no epoch runs until the stored plan is reapplied. */
    if (p->nrestore > 0) {
        if (!restore_ready(ds, now_us))
            return;
        restore_all(ds);
    }
    ds_plan_sync_models(ds);
    /* A kind whose plan is still being computed (the planner thread) keeps
     * what calls for an epoch (dirty, due) until it is applied. */
    unsigned busy = 0;
    for (int k = 0; k < SQ_DEV_KIND_COUNT; k++)
        busy |= (p->inflight[k].job != NULL) << k;
    unsigned dirty = pl_loop_dirty(p->loop) & ~busy;
    for (int k = 0; k < SQ_DEV_KIND_COUNT; k++)
        if (dirty & (1u << k))
            ds_plan_epoch(ds, k, pl_loop_reason(p->loop, k), now_us);
    /* A split made again (at every epoch, when a gamma moved, and at least
     * every PIPELINE_RESPLIT_US) goes to the loop: a stage whose budget
     * moved to another bucket moves its rate there at once. */
    resplit_pipelines(ds, now_us, dirty != 0);
    ds_plan_sync_pipelines(ds);
    /* Rates every second; epochs where they, the period or an
     * invalidation call for one (pl_loop.h). */
    for (int k = 0; k < SQ_DEV_KIND_COUNT; k++) /* and those begun just above */
        busy |= (p->inflight[k].job != NULL) << k;
    unsigned due = pl_loop_advance(p->loop, now_us) & ~busy;
    for (int k = 0; k < SQ_DEV_KIND_COUNT; k++)
        if (due & (1u << k))
            ds_plan_epoch(ds, k, pl_loop_reason(p->loop, k), now_us);
}

/* ---- restart: the last stored plan, reapplied --------------------------- */

/* Whether the stored plan's device ran one session back to back. */
static int stored_saturated(json_t *plan, const char *device)
{
    size_t i;
    json_t *d;
    json_array_foreach(json_object_get(plan, "devices"), i, d)
    {
        const char *name = json_string_value(json_object_get(d, "device"));
        if (name != NULL && strcmp(name, device) == 0)
            return json_is_true(json_object_get(d, "saturated"));
    }
    return 0;
}

/* Takes the plan stored before a restart (gw_db_last_plan's copies, freed
 * here): its placements of models that still exist become restore rows. */
static void restore_take(ds_plan_state_t *p, gw_registry_t *reg, json_t *plan, json_t *rows)
{
    size_t n = json_array_size(rows), i;
    json_t *r;
    p->restore = n > 0 ? sq_xcalloc(n, sizeof(*p->restore)) : NULL;
    p->restored_from = p->epoch;
    int skipped = 0;
    json_array_foreach(rows, i, r)
    {
        ds_plan_restore_t *x = &p->restore[p->nrestore];
        const char *dev = json_string_value(json_object_get(r, "device"));
        char kind[16];
        x->key = json_integer_value(json_object_get(r, "model_id"));
        x->slo_ms = json_number_value(json_object_get(r, "slo_ms"));
        x->batch = (int)json_integer_value(json_object_get(r, "batch"));
        x->duty_cycle_us = json_number_value(json_object_get(r, "duty_cycle_us"));
        x->rate_rps = json_number_value(json_object_get(r, "rate_rps"));
        if (dev == NULL || strlen(dev) >= sizeof(x->device) || sscanf(dev, "%15[a-z]", kind) != 1 ||
            (x->kind = sq_dev_kind_parse(kind)) < 0 || x->batch < 1 || !(x->slo_ms > 0) ||
            !(x->rate_rps >= 0) || !(x->duty_cycle_us > 0)) {
            skipped++;
            continue;
        }
        gw_model_t *m = gw_registry_get(reg, x->key);
        if (m == NULL) {
            skipped++; /* deleted since */
            continue;
        }
        gw_model_unref(m);
        snprintf(x->device, sizeof(x->device), "%s", dev);
        x->saturated = stored_saturated(plan, dev);
        p->nrestore++;
    }
    if (n > 0)
        SQ_INFO("plan to reapply epoch=%lld placements=%d skipped=%d", p->restored_from,
                p->nrestore, skipped);
    json_decref(plan);
    json_decref(rows);
}

/* The up worker that runs a stored device now, or NULL. */
static ds_worker_t *restore_worker(gw_dispatch_t *ds, const ds_plan_restore_t *row)
{
    for (int i = 0; i < ds->nworkers; i++) {
        ds_worker_t *w = ds->workers[i];
        if (w != NULL && w->up && w->kind == row->kind && strcmp(w->device, row->device) == 0)
            return w;
    }
    return NULL;
}

/* Every stored device has its worker up and so has every configured
 * worker (else each late one would re-plan at once), or the wait is over. */
static int restore_ready(gw_dispatch_t *ds, int64_t now)
{
    ds_plan_state_t *p = ds->place.plan;
    int up = 0, configured = 0;
    for (int i = 0; i < ds->nworkers; i++)
        up += ds->workers[i] != NULL && ds->workers[i]->up;
    if (up == 0)
        return 0;
    configured = ds->cfg.configured_devices;
    if (p->restore_first_up_us == 0)
        p->restore_first_up_us = now;
    if (now - p->restore_first_up_us >= RESTORE_WAIT_US)
        return 1;
    if (up < configured)
        return 0;
    for (int r = 0; r < p->nrestore; r++)
        if (restore_worker(ds, &p->restore[r]) == NULL)
            return 0;
    return 1;
}

/* The stored session of row, made active and planned again: NULL when its
 * model is gone, not ready, or served by another kind now. */
static ds_model_t *restore_session(gw_dispatch_t *ds, const ds_plan_restore_t *row)
{
    gw_model_t *m = gw_registry_get(ds->registry, row->key);
    if (m == NULL)
        return NULL;
    int ok = strcmp(m->status, "ready") == 0 && m->has_profile[row->kind] &&
             ds_kind_of_model(ds, m) == row->kind;
    ds_model_t *dm = ok ? ds_model_get(ds, m) : NULL;
    gw_model_unref(m);
    if (dm == NULL || dm->removed || dm->poisoned || (dm->active && dm->kind != row->kind))
        return NULL;
    if (!dm->active) {
        dm->kind = row->kind;
        dm->active = 1;
    }
    pl_loop_session(ds->place.plan->loop, dm->key, row->slo_ms, 1);
    return dm;
}

/* Reapplies the stored plan, kind by kind: its sessions become active at
 * the stored rates, its devices that have their worker up become the
 * previous plan, and an epoch ("restored") plans from there: the same
 * placements when everything is as it was; what no longer fits (fewer
 * devices, a model gone) is placed as the planner can, and the next epochs
 * follow the traffic. Returns the kinds it planned (bits). */
static int restore_all(gw_dispatch_t *ds)
{
    ds_plan_state_t *p = ds->place.plan;
    ds_plan_restore_t *rows = p->restore;
    int nrows = p->nrestore;
    p->restore = NULL;
    p->nrestore = 0;
    int done = 0;
    double headroom = ds->cfg.plan_headroom;
    for (int k = 0; k < SQ_DEV_KIND_COUNT; k++) {
        /* The sessions at no rate, then each at the sum of its rows'. */
        int nsess = 0;
        for (int r = 0; r < nrows; r++) {
            ds_model_t *dm = rows[r].kind == k ? restore_session(ds, &rows[r]) : NULL;
            if (dm != NULL) {
                pl_loop_seed(p->loop, dm->key, rows[r].slo_ms, 0, 0);
                nsess++;
            }
        }
        if (nsess == 0)
            continue;
        pl_plan_t prev = {0};
        prev.devices = sq_xcalloc((size_t)nrows, sizeof(*prev.devices));
        int *dev_worker = sq_xcalloc((size_t)nrows + 1, sizeof(int));
        const char **names = sq_xcalloc((size_t)nrows, sizeof(*names));
        int ndev = 0, placed = 0, dropped = 0;
        for (int r = 0; r < nrows; r++) {
            const ds_plan_restore_t *row = &rows[r];
            ds_model_t *dm = row->kind == k ? restore_session(ds, row) : NULL;
            if (dm == NULL)
                continue;
            pl_loop_seed(p->loop, dm->key, row->slo_ms, row->rate_rps / headroom, 1);
            ds_worker_t *w = restore_worker(ds, row);
            if (w == NULL) {
                dropped++; /* its load is placed elsewhere, as it fits */
                continue;
            }
            int d = 0;
            while (d < ndev && strcmp(names[d], row->device) != 0)
                d++;
            pl_device_t *dev = &prev.devices[d];
            if (d == ndev) {
                names[ndev] = row->device;
                dev_worker[ndev] = w->id;
                *dev = (pl_device_t){.id = ndev,
                                     .saturated = row->saturated,
                                     .duty_cycle_us = row->duty_cycle_us,
                                     .allocs = sq_xcalloc((size_t)nrows, sizeof(pl_alloc_t))};
                ndev++;
            }
            const pl_profile_t *prof = &dm->m->profile[k];
            pl_alloc_t *a = &dev->allocs[dev->nallocs++];
            *a = (pl_alloc_t){.session_id = pl_loop_session(p->loop, dm->key, row->slo_ms, 0),
                              .model = (int)dm->key,
                              .batch = row->batch,
                              .latency_us = pl_latency_us(prof, row->batch, ds->cfg.core.k_std),
                              .rate_rps = row->rate_rps};
            dev->occupancy += a->latency_us / dev->duty_cycle_us;
            placed++;
        }
        free(names);
        prev.ndevices = ndev;
        pl_loop_restore(p->loop, k, &prev, dev_worker, ndev);
        free(dev_worker);
        SQ_INFO("plan restored from_epoch=%lld kind=%s rows=%d devices=%d placements=%d "
                "without_worker=%d",
                p->restored_from, sq_dev_kind_name((sq_dev_kind_t)k), nsess, ndev, placed, dropped);
        ds_plan_epoch(ds, k, "restored", sq_now_us());
        done |= 1 << k;
    }
    free(rows);
    return done;
}
