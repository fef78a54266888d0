/* squish-sim's planning glue: routes on all devices, or squishd's planning
 * loop (pl_loop.h) set up from the workload, planned at time 0 and at its
 * epochs, each plan applied to the dispatcher (duty cycles, routes) and
 * recorded for the steps. Calls no other file of the engine (sim_int.h). */
#include "sim_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* How many distinct models the dispatcher sessions serve. */
static int count_models(const run_t *r)
{
    int n = 0;
    for (int i = 0; i < r->nss; i++) {
        int seen = 0;
        for (int j = 0; j < i; j++)
            seen |= r->ss[j].model == r->ss[i].model;
        n += !seen;
    }
    return n;
}

/* Session s's rate at t_s: its segment's for segment arrivals, else its
 * mean (rate_rps); a stage's, its pipeline's times the stage's fan-out.
 * Times are not scaled, rates are. */
static double rate_at(const run_t *r, const sim_sess_t *ws, double t_s)
{
    const wl_arrivals_t *a = ws->arrivals;
    double f = ws->arrivals_rate > 0 ? ws->rate_rps / ws->arrivals_rate : 0;
    if (a->process == WL_ARRIVALS_NONE || a->process == WL_ARRIVALS_TIMES)
        return ws->rate_rps;
    double start = 0, stretch = sim__segments_stretch(a, r->o);
    for (int k = 0; k < a->nsegments; k++) {
        start += a->segments[k].duration_s * stretch;
        if (t_s < start)
            return a->segments[k].rate_rps * f;
    }
    return 0;
}

/* The plan in force (the loop's) applied at now: each device's duty cycle
 * (early-drop's pacing), each dispatcher session's routes (pl_loop_routes:
 * planned devices, the devices holding its model as fallback, spare
 * devices for overflow). A simulated device holds what the plan puts on
 * it from the moment the plan is made (loads take no time here), and a
 * model the plan puts nowhere is held by every device, as squishd loads
 * it. */
static void apply_plan(run_t *r, int64_t now)
{
    int n = r->res->ndevices;
    const pl_plan_t *plan = pl_loop_current(r->loop, 0);
    r->res->planned_devices = plan->ndevices;
    if (r->nplans == r->capplans) {
        r->capplans = r->capplans ? 2 * r->capplans : 16;
        r->plan_at_us = sq_xrealloc(r->plan_at_us, sizeof(int64_t) * (size_t)r->capplans);
        r->plan_devices = sq_xrealloc(r->plan_devices, sizeof(int) * (size_t)r->capplans);
    }
    r->plan_at_us[r->nplans] = now;
    r->plan_devices[r->nplans++] = plan->ndevices;
    for (int k = 0; k < n; k++) {
        const pl_device_t *pd = NULL;
        for (int i = 0; i < plan->ndevices; i++)
            if (pl_loop_device_key(r->loop, 0, plan->devices[i].id) == k)
                pd = &plan->devices[i];
        int64_t duty = pd ? llround(pd->duty_cycle_us) : 0;
        /* A saturated device runs back to back: pacing adds nothing. */
        if (pd && pd->saturated)
            duty = 0;
        pl_dispatch_worker_add(r->d, now, k, r->o->policy == PL_POLICY_EARLY_DROP ? duty : 0);
    }
    int maxroutes = plan->ndevices + 2 * n + 1; /* planned, fallback, overflow */
    pl_route_t *routes = sq_xmalloc(sizeof(*routes) * (size_t)maxroutes);
    int *holders = sq_xcalloc((size_t)n + 1, sizeof(*holders));
    int *off = sq_xcalloc((size_t)r->nss + 1, sizeof(int));
    pl_route_t *all = sq_xmalloc(sizeof(*all) * ((size_t)maxroutes * (size_t)r->nss + 1));
    r->res->unplaced_sessions = 0;
    for (int s = 0; s < r->nss; s++) {
        int fell_back = 0;
        pl_loop_route_env_t env = {.holders = holders, .used_fallback = &fell_back};
        env.nholders = pl_loop_holders(r->loop, 0, r->ss[s].model, holders, n);
        /* A model the plan puts on no device: squishd loads it on every
         * worker of its kind at its first request (ds_spread_loads), and
         * those serve it. */
        for (int k = 0; env.nholders == 0 && k < n; k++)
            holders[k] = k;
        if (env.nholders == 0)
            env.nholders = n;
        int nr = pl_loop_routes(r->loop, r->ss[s].model, r->ss[s].slo_us / 1000.0, &env, routes,
                                maxroutes);
        r->res->unplaced_sessions += fell_back;
        pl_dispatch_route_set(r->d, now, s, routes, nr);
        memcpy(all + off[s], routes, sizeof(*routes) * (size_t)nr);
        off[s + 1] = off[s] + nr;
    }
    if (r->o->on_epoch != NULL)
        r->o->on_epoch(r->o->on_epoch_ctx, &(sim_epoch_t){.at_us = now,
                                                          .loop = r->loop,
                                                          .nsessions = r->nss,
                                                          .routes = all,
                                                          .route_off = off});
    free(all);
    free(off);
    free(holders);
    free(routes);
}

/* The planning loop of a run: squishd's rules (its SLO buckets too), the
 * run's options; the workload's models and pipelines, each session seeded
 * at rates (per dispatcher session, already scaled) as if measured, or
 * made without a rate (sim_opts_t.plan_cold). */
static void loop_setup(run_t *r, const double *rates)
{
    const wl_workload_t *w = r->w;
    pl_loop_config_t c;
    pl_loop_config_default(&c);
    c.headroom = r->o->plan_headroom;
    c.burst_quantile = r->o->plan_burst_quantile;
    c.k_std = w->k_std;
    c.overflow = r->o->plan_overflow;
    c.overflow_devices = r->o->plan_overflow_devices;
    c.slo_bucket_ms = pl_loop_slo_bucket_ms;
    if (r->o->epoch_s > 0) {
        /* squishd's epoch_ms; early epochs and rate steps no further apart
         * than the period. */
        c.epoch.period_ms = r->o->epoch_s * 1000.0;
        c.epoch.min_interval_ms = fmin(c.epoch.min_interval_ms, c.epoch.period_ms);
        c.scale_up_ms = fmin(c.scale_up_ms, c.epoch.period_ms);
        c.rate_interval_ms = fmin(c.rate_interval_ms, c.epoch.period_ms);
    }
    r->loop = pl_loop_new(&c, 0);
    r->tick_us = llround(c.rate_interval_ms * 1000.0);
    for (int m = 0; m < w->nmodels; m++)
        pl_loop_model_set(r->loop, m,
                          &(pl_loop_model_t){.kind = 0,
                                             .profile = &w->models[m].profile,
                                             .name = w->models[m].name,
                                             .item_bytes = w->models[m].item_bytes,
                                             .active = 1});
    const sim_result_t *res = r->res;
    for (int p = 0; p < res->npipelines; p++) {
        const wl_pipeline_t *pl = &w->pipelines[p];
        pl_loop_stage_t *st = sq_xcalloc((size_t)pl->nstages, sizeof(*st));
        for (int k = 0; k < pl->nstages; k++)
            st[k] =
                (pl_loop_stage_t){.model = pl->stages[k].model,
                                  .parent = pl->stages[k].nafter > 0 ? pl->stages[k].after[0] : -1,
                                  .gamma = pl->stages[k].nafter > 0 ? pl->stages[k].gamma[0] : 1,
                                  .budget_ms = res->pipelines[p].budget_us[k] / 1000.0};
        pl_loop_pipeline_set(r->loop, p, pl->slo_ms, st, pl->nstages);
        free(st);
    }
    for (int s = 0; s < r->nss; s++) {
        const sim_sess_t *ws = &r->ss[s];
        if (r->o->plan_cold) /* as squishd makes it at its first request */
            pl_loop_session(r->loop, ws->model, ws->slo_us / 1000.0, 1);
        else if (ws->pipeline >= 0)
            pl_loop_stage_seed(r->loop, ws->pipeline, ws->stage, w->pipelines[ws->pipeline].slo_ms,
                               ws->model, rates[s]);
        else
            pl_loop_seed(r->loop, ws->model, ws->slo_us / 1000.0, rates[s], 1);
    }
}

/* An epoch of the loop at now on the run's devices. */
int sim__plan_at(run_t *r, int64_t now)
{
    int n = r->res->ndevices;
    int *keys = sq_xcalloc((size_t)n + 1, sizeof(int));
    for (int k = 0; k < n; k++)
        keys[k] = k;
    pl_loop_devices_t devs = {.n = n,
                              .keys = keys,
                              .memory_bytes = r->w->device_memory_mb * WL_BYTES_PER_MB,
                              .links = r->w->device_links,
                              .nlinks = r->w->ndevice_links};
    int rc = pl_loop_plan(r->loop, 0, &devs, now);
    free(keys);
    if (rc < 0)
        return rc;
    if (rc == 0)
        apply_plan(r, now);
    return 0;
}

/* Routes every session: on all devices, or as the placement plan says (at
 * the rates of the first moment: the workload's, as if declared). */
int sim__routes_setup(run_t *r, int *ndevices)
{
    const wl_workload_t *w = r->w;
    sim_routing_t mode = r->o->routing;
    if (mode == SIM_ROUTE_AUTO)
        mode = count_models(r) > 1 ? SIM_ROUTE_PLAN : SIM_ROUTE_ALL;
    if (mode == SIM_ROUTE_ALL) {
        int n = w->device_count;
        if (n < 1)
            return SQ_INVAL;
        *ndevices = n;
        r->dev = sq_xcalloc((size_t)n, sizeof(*r->dev));
        pl_route_t *routes = sq_xmalloc(sizeof(*routes) * (size_t)n);
        for (int k = 0; k < n; k++) {
            pl_dispatch_worker_add(r->d, 0, k, 0);
            routes[k] = (pl_route_t){.worker = k, .target_batch = 0};
        }
        for (int s = 0; s < r->nss; s++)
            pl_dispatch_route_set(r->d, 0, s, routes, n);
        free(routes);
        return 0;
    }
    double *rates = sq_xcalloc((size_t)r->nss + 1, sizeof(*rates));
    for (int s = 0; s < r->nss; s++)
        rates[s] =
            (r->o->epoch_s > 0 ? rate_at(r, &r->ss[s], 0) : r->ss[s].rate_rps) * r->o->rate_scale;
    loop_setup(r, rates);
    free(rates);
    int n = w->device_count;
    if (n < 1) {
        /* Uncapped: as many devices as the plan at these rates asks for
         * (re-planning needs a fixed count: the workload's). */
        if (r->o->epoch_s > 0)
            return SQ_INVAL;
        pl_loop_devices_t devs = {.uncapped = 1,
                                  .memory_bytes = w->device_memory_mb * WL_BYTES_PER_MB,
                                  .links = w->device_links,
                                  .nlinks = w->ndevice_links};
        int rc = pl_loop_plan(r->loop, 0, &devs, 0);
        if (rc < 0)
            return rc;
        n = rc == 0 ? pl_loop_current(r->loop, 0)->ndevices : 0;
        if (n < 1)
            return SQ_INVAL;
    }
    *ndevices = n;
    r->dev = sq_xcalloc((size_t)n, sizeof(*r->dev));
    r->planning = 1;
    return sim__plan_at(r, 0);
}