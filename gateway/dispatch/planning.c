/* Live planning: the dispatch thread's epochs. What decides (rates and
 * epoch triggers, the sessions given to the placement core, idle
 * sessions, clump dispersion, routes and their fallbacks, stored rates,
 * pipeline splits) is the planning loop of planner/pl_loop.h, the same
 * code squish-sim runs; this file is its shell: it feeds the loop the
 * models, pipelines, arrivals and workers, and applies each plan (loads
 * before any route points at a model, unloads only after routes moved
 * away, duty cycles), stores it in the model DB (plans and placements,
 * one row set per epoch), serves it by GET /v1/plan and reapplies the
 * stored one after a restart.
 *
 * The loop runs here, on the dispatch thread: well under a millisecond
 * for the sessions one squishd serves (bench: 0.3 ms for 100 sessions);
 * a deployment with thousands of sessions would want it on a thread of
 * its own. */
#include "gw_dispatch_int.h"
#include "gw_catalog.h"
#include "gw_metrics.h"

#include <pl_loop.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* After a restart, the stored plan waits this long after the first worker
 * up for the workers it names and the configured ones; then it is
 * reapplied with those up. */
#define RESTORE_WAIT_US 3000000

typedef struct {
    int moves_pending; /* a model waits to leave a worker until it arrives elsewhere */
} pkind_t;

/* One placement of the plan stored before a restart. */
typedef struct {
    char device[64];
    int kind;
    int64_t key;
    double slo_ms;
    int batch;
    double duty_cycle_us;
    double rate_rps;
    int saturated;
} restore_row_t;

struct ds_plan_state {
    /* Rates, epochs, sessions, plans and routes (planner/pl_loop.h): the
     * same loop squish-sim runs. Devices are named by worker id. */
    pl_loop_t *loop;
    /* The pipelines the loop knows (a reference each): key = the pointer,
     * which the reference keeps from being reused. */
    gw_pipeline_t **pipes;
    int npipes, cappipes;
    pkind_t kinds[SQ_DEV_KIND_COUNT];
    long long epoch;
    /* advice inputs since the last epoch */
    double ok, bad;
    double busy_us;
    int64_t window_start_us;
    /* /v1/plan snapshot, read by HTTP threads */
    pthread_mutex_t lock;
    char *json;
    /* The plan stored before a restart, until it is reapplied. */
    restore_row_t *restore;
    int nrestore;
    long long restored_from; /* its epoch */
    int64_t restore_first_up_us;
};

static void restore_take(ds_plan_state_t *p, gw_server_t *srv);

ds_plan_state_t *ds_plan_new(gw_dispatch_t *ds)
{
    ds_plan_state_t *p = sq_xcalloc(1, sizeof(*p));
    const gw_config_t *cfg = ds->srv->cfg;
    pl_loop_config_t lc;
    pl_loop_config_default(&lc);
    lc.epoch.period_ms = cfg->epoch_ms;
    lc.epoch.min_interval_ms = cfg->epoch_min_interval_ms;
    lc.scale_up_ms = cfg->epoch_scale_up_ms;
    lc.headroom = cfg->plan_headroom;
    lc.burst_quantile = cfg->plan_burst_quantile;
    lc.k_std = cfg->k_std;
    lc.overflow = 1;
    lc.nkinds = SQ_DEV_KIND_COUNT;
    lc.slo_bucket_ms = gw_slo_bucket_ms;
    p->window_start_us = sq_now_us();
    p->loop = pl_loop_new(&lc, p->window_start_us);
    p->epoch = ds->srv->last_epoch;
    pthread_mutex_init(&p->lock, NULL);
    restore_take(p, ds->srv);
    return p;
}

void ds_plan_free(ds_plan_state_t *p)
{
    if (p == NULL)
        return;
    pl_loop_free(p->loop);
    for (int i = 0; i < p->npipes; i++)
        gw_pipeline_unref(p->pipes[i]);
    free(p->pipes);
    free(p->json);
    free(p->restore);
    pthread_mutex_destroy(&p->lock);
    free(p);
}

static int64_t pipe_key(const gw_pipeline_t *pipe)
{
    return (int64_t)(intptr_t)pipe;
}

/* The model record of key (a live one first), or NULL. */
static ds_model_t *model_of_key(gw_dispatch_t *ds, int64_t key)
{
    ds_model_t *any = NULL;
    for (int i = 0; i < ds->nmodels; i++)
        if (ds->models[i]->key == key) {
            if (!ds->models[i]->removed)
                return ds->models[i];
            any = ds->models[i];
        }
    return any;
}

static int same_model(const ds_model_t *dm, const char *name, int version)
{
    return strcmp(dm->m->name, name) == 0 && (version == 0 || dm->m->version == version);
}

/* What the loop knows of each model: its kind, profile (measured when it
 * drifted), and whether it is planned. */
static void sync_models(gw_dispatch_t *ds)
{
    for (int i = 0; i < ds->nmodels; i++) {
        ds_model_t *dm = ds->models[i];
        int kind = dm->kind;
        int has = kind >= 0 && kind < SQ_DEV_KIND_COUNT && dm->m->has_profile[kind];
        if (has)
            dm->m->profile[kind].memory_bytes = dm->m->profile[kind].memory_bytes > 0
                                                    ? dm->m->profile[kind].memory_bytes
                                                    : (double)dm->m->memory_bytes;
        pl_loop_model_t lm = {.kind = kind,
                              .profile = has ? ds_profile(dm, kind) : NULL,
                              .name = dm->m->name,
                              .item_bytes = ds_item_bytes(dm->m, SQ_INPUT_PIXELS),
                              .active = dm->active && !dm->removed};
        pl_loop_model_set(ds->plan->loop, dm->key, &lm);
    }
}

/* Hands the loop pipe's split: each stage's model, parent, measured gamma
 * and budget. */
static void pipeline_to_loop(gw_dispatch_t *ds, gw_pipeline_t *pipe)
{
    pl_loop_stage_t st[GW_PIPE_MAX_STAGES];
    gw_stage_clumps_t cl[GW_PIPE_MAX_STAGES];
    int nc = gw_pipeline_clumps(pipe, cl);
    int c = 0;
    for (int i = 0; i < pipe->nstages; i++) {
        const gw_stage_spec_t *spec = &pipe->stages[i];
        st[i] = (pl_loop_stage_t){.model = -1,
                                  .parent = spec->parent,
                                  .gamma = 1,
                                  .budget_ms = gw_pipeline_budget_ms(pipe, i)};
        for (int m = 0; m < ds->nmodels && st[i].model < 0; m++)
            if (!ds->models[m]->removed && same_model(ds->models[m], spec->model, spec->version))
                st[i].model = ds->models[m]->key;
        /* gw_pipeline_clumps lists the crop stages in stage order. */
        if (spec->parent >= 0 && c < nc)
            st[i].gamma = cl[c++].gamma;
    }
    pl_loop_pipeline_set(ds->plan->loop, pipe_key(pipe), pipe->slo_ms, st, pipe->nstages);
}

/* The loop's pipelines follow the live ones: a deleted one goes, and each
 * live one it knows gets its current split and gammas. */
static void sync_pipelines(gw_dispatch_t *ds)
{
    ds_plan_state_t *p = ds->plan;
    if (p->npipes == 0)
        return;
    int np = 0;
    gw_pipeline_t **live = gw_pipes_all(ds->srv->pipelines, &np);
    for (int i = p->npipes - 1; i >= 0; i--) {
        int found = 0;
        for (int k = 0; k < np && !found; k++)
            found = live[k] == p->pipes[i];
        if (found) {
            pipeline_to_loop(ds, p->pipes[i]);
            continue;
        }
        pl_loop_pipeline_drop(p->loop, pipe_key(p->pipes[i]));
        gw_pipeline_unref(p->pipes[i]);
        p->pipes[i] = p->pipes[--p->npipes];
    }
    for (int k = 0; k < np; k++)
        gw_pipeline_unref(live[k]);
    free(live);
}

/* The loop knows pipe (a reference is taken the first time). */
static void pipeline_known(gw_dispatch_t *ds, gw_pipeline_t *pipe)
{
    ds_plan_state_t *p = ds->plan;
    for (int i = 0; i < p->npipes; i++)
        if (p->pipes[i] == pipe)
            return;
    if (p->npipes == p->cappipes) {
        p->cappipes = p->cappipes ? 2 * p->cappipes : 4;
        p->pipes = sq_xrealloc(p->pipes, sizeof(*p->pipes) * (size_t)p->cappipes);
    }
    gw_pipeline_ref(pipe);
    p->pipes[p->npipes++] = pipe;
    sync_models(ds);
    pipeline_to_loop(ds, pipe);
}

pl_loop_t *ds_plan_loop(gw_dispatch_t *ds)
{
    return ds->plan->loop;
}

void ds_plan_forget(gw_dispatch_t *ds, const ds_model_t *dm)
{
    pl_loop_model_forget(ds->plan->loop, dm->key);
}

void ds_plan_arrival(gw_dispatch_t *ds, ds_model_t *dm, double bucket_ms, const gw_item_t *it)
{
    ds_plan_state_t *p = ds->plan;
    if (it != NULL && it->pipeline != NULL) {
        pipeline_known(ds, it->pipeline);
        pl_loop_stage_arrivals(p->loop, pipe_key(it->pipeline), it->stage, it->query_slo_ms,
                               dm->key, 1);
    } else {
        /* Its SLO, not only its bucket: a session is planned at the least
         * SLO of its requests (pl_loop.h). */
        pl_loop_arrivals(p->loop, dm->key, it != NULL ? it->slo_ms : bucket_ms, 1);
    }
}

void ds_plan_outcome(gw_dispatch_t *ds, int ok)
{
    if (ok)
        ds->plan->ok += 1;
    else
        ds->plan->bad += 1;
}

void ds_plan_busy(gw_dispatch_t *ds, int worker, int64_t busy_us)
{
    (void)worker;
    ds->plan->busy_us += (double)busy_us;
}

/* The device a worker runs in kind's plan, or NULL. */
static const pl_device_t *device_of(const ds_plan_state_t *p, int kind, int worker)
{
    const pl_plan_t *plan = pl_loop_current(p->loop, kind);
    for (int i = 0; plan != NULL && i < plan->ndevices; i++)
        if (pl_loop_device_key(p->loop, kind, plan->devices[i].id) == worker)
            return &plan->devices[i];
    return NULL;
}

/* Whether the plan has worker hold session_id for its overflow batches
 * (pl_plan_t.overflow: a spare worker, or a planned one when short). */
static int overflow_here(const ds_plan_state_t *p, int kind, int worker, int session_id)
{
    const pl_plan_t *plan = pl_loop_current(p->loop, kind);
    for (int i = 0; plan != NULL && i < plan->noverflow; i++) {
        const pl_overflow_t *o = &plan->overflow[i];
        if (o->session_id == session_id &&
            pl_loop_device_key(p->loop, kind, o->device_id) == worker)
            return 1;
    }
    return 0;
}

static const pl_alloc_t *alloc_of(const pl_device_t *dev, int session_id)
{
    for (int a = 0; dev != NULL && a < dev->nallocs; a++)
        if (dev->allocs[a].session_id == session_id)
            return &dev->allocs[a];
    return NULL;
}

static int usable(ds_worker_t *w, int64_t key)
{
    ds_load_t *l = w != NULL && w->up ? ds_load_find(w, key, 0) : NULL;
    return l != NULL && l->state == LOAD_DONE;
}

static int usable_worker(void *ctx, int worker, int64_t model)
{
    return usable(ds_worker_at(ctx, worker), model);
}

int ds_plan_routes(gw_dispatch_t *ds, const ds_session_t *s, pl_route_t *routes, int max)
{
    ds_model_t *dm = s->model;
    /* No plan covers the session yet, or its planned workers are still
     * loading the model: every worker that holds it serves meanwhile. */
    int *holders = sq_xcalloc((size_t)ds->nworkers + 1, sizeof(*holders));
    int nholders = 0;
    for (int i = 0; i < ds->nworkers; i++)
        if (usable(ds->workers[i], dm->key))
            holders[nholders++] = i;
    pl_loop_route_env_t env = {
        .usable = usable_worker, .ctx = ds, .holders = holders, .nholders = nholders};
    int n = pl_loop_routes(ds->plan->loop, dm->key, s->bucket_ms, &env, routes, max);
    free(holders);
    return n;
}

/* ---- snapshot and storage ---------------------------------------------- */

static const char *unplaced_reason(pl_unplaced_reason_t r)
{
    return r == PL_UNPLACED_SLO      ? "slo"
           : r == PL_UNPLACED_MEMORY ? "memory"
           : r == PL_UNPLACED_LINK   ? "link"
                                     : "devices";
}

/* The share of requests within their SLO below which the advice releases
 * nothing (issue 15: >= 99.5% within SLO). */
#define ADVICE_SLO_FLOOR 0.995

/* A loop session as the snapshot names it: its model record and bucket. */
typedef struct {
    ds_model_t *dm;
    double bucket_ms;
} session_view_t;

static const session_view_t *session_view(gw_dispatch_t *ds, int id, session_view_t *out)
{
    pl_loop_session_info_t si;
    if (pl_loop_session_by_id(ds->plan->loop, id, &si) != 0)
        return NULL;
    out->dm = model_of_key(ds, si.model);
    out->bucket_ms = si.bucket_ms;
    return out->dm != NULL ? out : NULL;
}

static json_t *plan_json(gw_dispatch_t *ds, const char *reason, json_t **placements)
{
    ds_plan_state_t *p = ds->plan;
    json_t *devices = json_array(), *unplaced = json_array(), *overflow = json_array();
    *placements = json_array();
    double lower = 0;
    int used = 0;
    for (int k = 0; k < SQ_DEV_KIND_COUNT; k++) {
        const pl_plan_t *plan = pl_loop_current(p->loop, k);
        if (plan == NULL)
            continue;
        lower += plan->lower_bound_devices;
        for (int i = 0; i < plan->ndevices; i++) {
            const pl_device_t *d = &plan->devices[i];
            int wid = pl_loop_device_key(p->loop, k, d->id);
            ds_worker_t *w = ds_worker_at(ds, wid);
            json_t *sessions = json_array();
            for (int a = 0; a < d->nallocs; a++) {
                const pl_alloc_t *al = &d->allocs[a];
                pl_loop_session_info_t si;
                ds_model_t *dm = pl_loop_session_by_id(p->loop, al->session_id, &si) == 0
                                     ? model_of_key(ds, si.model)
                                     : NULL;
                if (dm == NULL)
                    continue;
                const session_view_t view = {.dm = dm, .bucket_ms = si.bucket_ms};
                const session_view_t *ps = &view;
                json_t *so =
                    json_pack("{s:s, s:i, s:f, s:f, s:i, s:f}", "model", ps->dm->m->name, "version",
                              ps->dm->m->version, "slo_ms", ps->bucket_ms, "rate_rps", al->rate_rps,
                              "batch", al->batch, "latency_ms", al->latency_us / 1000.0);
                if (al->transfer_us > 0) /* the batch's round trip and bytes on the link */
                    json_object_set_new(so, "transfer_ms", json_real(al->transfer_us / 1000.0));
                if (ps->dm->live_scale > 0) /* planned with the measured latencies */
                    json_object_set_new(so, "profile_scale", json_real(ps->dm->live_scale));
                json_array_append_new(sessions, so);
                json_array_append_new(
                    *placements,
                    json_pack("{s:s, s:I, s:f, s:i, s:f, s:f}", "device", w ? w->device : "?",
                              "model_id", (json_int_t)ps->dm->key, "slo_ms", ps->bucket_ms, "batch",
                              al->batch, "duty_cycle_us", d->duty_cycle_us, "rate_rps",
                              pl_loop_stored_rate(p->loop, k, al->session_id, al)));
            }
            used++;
            json_t *dj = json_pack(
                "{s:i, s:s, s:i, s:s, s:f, s:f, s:f, s:b, s:o}", "id",
                (int)json_array_size(devices), "kind", sq_dev_kind_name((sq_dev_kind_t)k), "worker",
                wid, "device", w ? w->device : "?", "duty_cycle_ms", d->duty_cycle_us / 1000.0,
                "occupancy", d->occupancy, "memory_mb", d->memory_bytes / 1048576.0, "saturated",
                d->saturated, "sessions", sessions);
            if (d->rtt_us > 0 || d->bytes_per_us > 0) { /* behind a link (pl.h) */
                json_object_set_new(dj, "rtt_ms", json_real(d->rtt_us / 1000.0));
                json_object_set_new(dj, "bandwidth_mbps", json_real(d->bytes_per_us * 8.0));
            }
            json_array_append_new(devices, dj);
        }
        for (int o = 0; o < plan->noverflow; o++) {
            const pl_overflow_t *ov = &plan->overflow[o];
            session_view_t view;
            const session_view_t *ps = session_view(ds, ov->session_id, &view);
            int wid = pl_loop_device_key(p->loop, k, ov->device_id);
            if (ps != NULL)
                json_array_append_new(overflow,
                                      json_pack("{s:s, s:i, s:f, s:i}", "model", ps->dm->m->name,
                                                "version", ps->dm->m->version, "slo_ms",
                                                ps->bucket_ms, "worker", wid));
        }
        for (int u = 0; u < plan->nunplaced; u++) {
            session_view_t view;
            const session_view_t *ps = session_view(ds, plan->unplaced[u].session_id, &view);
            if (ps != NULL)
                json_array_append_new(
                    unplaced, json_pack("{s:s, s:f, s:f, s:s}", "model", ps->dm->m->name, "slo_ms",
                                        ps->bucket_ms, "rate_rps", plan->unplaced[u].rate_rps,
                                        "reason", unplaced_reason(plan->unplaced[u].reason)));
        }
    }
    /* Advice (Symphony section 3.5): with bad rate r over N devices ask for
     * N r / (1 - r) more; with idle fraction f release N f. */
    double window_s = (double)(sq_now_us() - p->window_start_us) / 1e6;
    double total = p->ok + p->bad;
    double bad_rate = total > 0 ? p->bad / total : 0;
    int nworkers = 0;
    for (int i = 0; i < ds->nworkers; i++)
        nworkers += ds->workers[i] != NULL && ds->workers[i]->up;
    double idle = nworkers > 0 && window_s > 0 ? 1.0 - p->busy_us / 1e6 / (window_s * nworkers) : 0;
    idle = idle < 0 ? 0 : idle;
    double add = pl_advice_add(nworkers, bad_rate);
    double release = pl_advice_release(nworkers, idle);
    double delta = add >= 1 ? ceil(add) : -floor(release);
    /* Requests missing their SLO beyond the floor: never advise a release,
     * however idle the devices look on average. */
    if (bad_rate > 1 - ADVICE_SLO_FLOOR && delta < 0)
        delta = 0;
    /* The advice and the plan agree: load left without a device asks for
     * devices, however idle the others look, and a device the plan uses is
     * never one to release. */
    int short_of_devices = 0;
    for (int k = 0; k < SQ_DEV_KIND_COUNT; k++) {
        const pl_plan_t *plan = pl_loop_current(p->loop, k);
        for (int u = 0; plan != NULL && u < plan->nunplaced; u++)
            short_of_devices |= plan->unplaced[u].reason == PL_UNPLACED_DEVICES;
    }
    if (short_of_devices && delta < 1)
        delta = lower - used >= 1 ? ceil(lower - used) : 1;
    if (delta < 0 && -delta > nworkers - used)
        delta = -(double)(nworkers - used > 0 ? nworkers - used : 0);
    json_t *snap =
        json_pack("{s:I, s:f, s:s, s:o, s:i, s:f, s:o, s:[], s:{s:f, s:f, s:f, s:f, s:f}}", "epoch",
                  (json_int_t)p->epoch, "created_at", sq_wall_s(), "reason", reason, "devices",
                  devices, "devices_used", used, "lower_bound_devices", lower, "unplaced", unplaced,
                  "pipelines", "advice", "devices_delta", delta, "bad_rate", bad_rate,
                  "idle_fraction", idle, "add", add, "release", release);
    /* Where each worker is: remote ones with their measured link. */
    json_t *ws = json_array();
    for (int i = 0; i < ds->nworkers; i++) {
        const ds_worker_t *w = ds->workers[i];
        if (w == NULL || !w->up)
            continue;
        json_t *o = json_pack("{s:i, s:s, s:s}", "worker", w->id, "device", w->device, "host",
                              w->addr[0] ? w->addr : "local");
        if (w->addr[0] && w->bytes_per_us > 0) {
            json_object_set_new(o, "rtt_ms", json_real((double)w->rtt_us / 1000.0));
            json_object_set_new(o, "bandwidth_mbps", json_real(w->bytes_per_us * 8.0));
        }
        json_array_append_new(ws, o);
    }
    json_object_set_new(snap, "workers", ws);
    /* Workers that also hold sessions for their overflow (pl_plan_t.overflow). */
    json_object_set_new(snap, "overflow", overflow);
    if (strcmp(reason, "restored") == 0) {
        json_object_set_new(snap, "restored", json_true());
        json_object_set_new(snap, "restored_from_epoch", json_integer(p->restored_from));
    }
    return snap;
}

typedef struct {
    long long epoch;
    char reason[48];
    char *plan;
    json_t *placements;
} store_job_t;

static void store_job(mdb_t *db, void *arg)
{
    store_job_t *j = arg;
    if (db != NULL && mdb_plan_store(db, j->epoch, j->reason, j->plan, j->placements) != 0)
        SQ_WARN("cannot store plan epoch=%lld error=\"%s\"", j->epoch, mdb_errmsg(db));
    free(j->plan);
    json_decref(j->placements);
    free(j);
}

json_t *gw_dispatch_plan_json(gw_server_t *srv)
{
    ds_plan_state_t *p = srv->dispatch ? srv->dispatch->plan : NULL;
    json_t *out = NULL;
    if (p != NULL) {
        pthread_mutex_lock(&p->lock);
        if (p->json != NULL)
            out = json_loads(p->json, 0, NULL);
        pthread_mutex_unlock(&p->lock);
    }
    if (out == NULL)
        out = json_pack("{s:i, s:n, s:s, s:[], s:i, s:f, s:[], s:[], s:{s:f}}", "epoch", 0,
                        "created_at", "reason", "no plan yet", "devices", "devices_used", 0,
                        "lower_bound_devices", 0.0, "unplaced", "pipelines", "advice",
                        "devices_delta", 0.0);
    /* Pipelines as of now: their split, measured gammas and rates. */
    json_t *pipes = json_array();
    int n = 0;
    gw_pipeline_t **all = srv->pipelines ? gw_pipes_all(srv->pipelines, &n) : NULL;
    for (int i = 0; i < n; i++) {
        json_t *j = gw_pipeline_json(all[i]);
        json_t *split = json_object_get(j, "split");
        json_object_set(j, "budgets_ms", json_object_get(split, "budgets_ms"));
        json_object_set(j, "rates_rps", json_object_get(split, "rates_rps"));
        json_object_del(j, "spec");
        json_array_append_new(pipes, j);
        gw_pipeline_unref(all[i]);
    }
    free(all);
    json_object_set_new(out, "pipelines", pipes);
    return out;
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
    gw_server_t *srv = ds->srv;
    int n = 0;
    gw_pipeline_t **all = gw_pipes_all(srv->pipelines, &n);
    /* Of a stage's budget, its batches get what the dispatch margin and
     * the decode (or a crop's cut, cheaper) before them leave: a budget
     * the DP finds cheapest on paper but that holds no batch live would
     * drop every query. */
    double overhead_us = (double)srv->cfg->dispatch_margin_us;
    if (n > 0 && srv->prep != NULL)
        overhead_us += gw_prep_pool_decode_us(srv->prep);
    for (int i = 0; i < n; i++) {
        gw_pipeline_t *pl = all[i];
        if (force || gw_pipeline_resplit_due(pl, now_us, PIPELINE_RESPLIT_US)) {
            gw_model_t *m[GW_PIPE_MAX_STAGES] = {0};
            const pl_profile_t *prof[GW_PIPE_MAX_STAGES] = {0};
            for (int s = 0; s < pl->nstages; s++) {
                const gw_stage_spec_t *st = &pl->stages[s];
                m[s] = gw_registry_find(srv->registry, st->model, strlen(st->model), st->version);
                int kind = m[s] != NULL ? gw_dispatch_serving_kind(srv, m[s]) : -1;
                if (kind >= 0 && m[s]->has_profile[kind])
                    prof[s] = &m[s]->profile[kind];
            }
            if (gw_pipeline_resplit(pl, prof, srv->cfg->k_std, PIPELINE_EPSILON_MS,
                                    overhead_us / 1000.0, now_us)) {
                changed = 1;
                json_t *j = gw_pipeline_json(pl);
                char *txt = json_dumps(json_object_get(j, "split"), JSON_COMPACT);
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

/* The plan's gauges and the sessions' rates for /metrics. */
static void publish_metrics(gw_dispatch_t *ds, json_t *snap, int moved)
{
    ds_plan_state_t *p = ds->plan;
    gw_metrics_plan_t mp = {
        .epoch = p->epoch,
        .devices = (int)json_integer_value(json_object_get(snap, "devices_used")),
        .lower_bound_devices = json_number_value(json_object_get(snap, "lower_bound_devices")),
        .advice_devices =
            json_number_value(json_object_get(json_object_get(snap, "advice"), "devices_delta")),
        .models_moved = moved};
    gw_metrics_plan(ds->srv->metrics, &mp);
    int nsess = pl_loop_nsessions(p->loop);
    gw_metrics_session_t *ms = sq_xcalloc((size_t)nsess + 1, sizeof(*ms));
    int n = 0;
    for (int i = 0; i < nsess; i++) {
        pl_loop_session_info_t si;
        pl_loop_session_at(p->loop, i, &si);
        ds_model_t *dm = model_of_key(ds, si.model);
        if (dm == NULL || dm->removed || !dm->active || dm->kind < 0)
            continue;
        const pl_plan_t *plan = pl_loop_current(p->loop, dm->kind);
        ms[n++] = (gw_metrics_session_t){.model = dm->m,
                                         .slo_ms = si.bucket_ms,
                                         .rate_rps = si.rate_rps,
                                         .planned_rps =
                                             plan != NULL ? pl_plan_capacity_rps(plan, si.id) : 0};
    }
    gw_metrics_sessions(ds->srv->metrics, ms, n);
    free(ms);
}

/* ---- epochs ------------------------------------------------------------ */

/* Whether kind's plan moved model key away from worker (it places key
 * elsewhere, not there, nor there for overflow), and whether a worker it
 * moved to holds it already (*arrived). A model the plan could not place
 * is not moved. */
static int moved_away(gw_dispatch_t *ds, int kind, int worker, int64_t key, int *arrived)
{
    ds_plan_state_t *p = ds->plan;
    const pl_plan_t *plan = pl_loop_current(p->loop, kind);
    const pl_device_t *dev = device_of(p, kind, worker);
    int here = 0, elsewhere = 0;
    *arrived = 0;
    int nsess = pl_loop_nsessions(p->loop);
    for (int s = 0; s < nsess; s++) {
        pl_loop_session_info_t si;
        pl_loop_session_at(p->loop, s, &si);
        if (si.model != key)
            continue;
        here |= alloc_of(dev, si.id) != NULL || overflow_here(p, kind, worker, si.id);
        for (int d = 0; d < plan->ndevices; d++) {
            if (alloc_of(&plan->devices[d], si.id) == NULL)
                continue;
            elsewhere = 1;
            ds_worker_t *o =
                ds_worker_at(ds, pl_loop_device_key(p->loop, kind, plan->devices[d].id));
            ds_load_t *ol = o != NULL && o->up ? ds_load_find(o, key, 0) : NULL;
            *arrived |= ol != NULL && ol->state == LOAD_DONE;
        }
    }
    return !here && elsewhere;
}

/* Unloads what the plan of kind moved away from a worker, make before
 * break: once a worker it moved to holds it (until then requests would
 * find it loaded nowhere); the load finishing there runs this again
 * (ds_plan_loaded). */
static void settle_moves(gw_dispatch_t *ds, int kind)
{
    pkind_t *K = &ds->plan->kinds[kind];
    if (pl_loop_current(ds->plan->loop, kind) == NULL)
        return;
    K->moves_pending = 0;
    for (int i = 0; i < ds->nworkers; i++) {
        ds_worker_t *w = ds->workers[i];
        if (w == NULL || !w->up || w->kind != kind)
            continue;
        for (int li = 0; li < w->nloads; li++) {
            ds_load_t *l = &w->loads[li];
            int arrived;
            if ((l->state != LOAD_DONE && l->state != LOAD_SENT) ||
                !moved_away(ds, kind, w->id, l->key, &arrived))
                continue;
            int profiling = 0;
            for (int m = 0; m < ds->nmodels; m++)
                profiling |= ds->models[m]->key == l->key && ds->models[m]->profile_worker == w->id;
            if (profiling)
                continue;
            if (arrived)
                ds->ops->unload(ds, w, l);
            else
                K->moves_pending = 1;
        }
    }
}

static int restore_all(gw_dispatch_t *ds);

static void run_epoch(gw_dispatch_t *ds, int kind, const char *reason, int64_t now_us)
{
    ds_plan_state_t *p = ds->plan;
    /* An epoch before the stored plan was reapplied (a request for a new
     * model): reapply it now, with the workers that are up. */
    if (p->nrestore > 0 && (restore_all(ds) & (1 << kind)))
        return;
    /* The devices: up workers of this kind (one measuring a model too: it
     * measures in its gaps), each behind its measured link (pl.h:
     * Symphony's d_data); a plan without any remote worker packs as for
     * local devices. */
    int *workers = sq_xcalloc((size_t)ds->nworkers + 1, sizeof(int));
    pl_link_t *links = sq_xcalloc((size_t)ds->nworkers + 1, sizeof(*links));
    int nw = 0, remote = 0;
    double mem = 0;
    for (int i = 0; i < ds->nworkers; i++) {
        ds_worker_t *w = ds->workers[i];
        if (w == NULL || !w->up || w->kind != kind)
            continue;
        if (mem == 0 || (double)w->memory_bytes < mem)
            mem = (double)w->memory_bytes;
        if (w->addr[0] && (w->rtt_us > 0 || w->bytes_per_us > 0)) {
            links[nw] = (pl_link_t){.rtt_us = (double)w->rtt_us, .bytes_per_us = w->bytes_per_us};
            remote = 1;
        }
        workers[nw++] = i;
    }
    sync_models(ds);
    sync_pipelines(ds);
    pl_loop_devices_t devs = {.n = nw,
                              .keys = workers,
                              .memory_bytes = mem,
                              .links = remote ? links : NULL,
                              .nlinks = remote ? nw : 0};
    int64_t t0 = sq_now_ns();
    int rc = pl_loop_plan(p->loop, kind, &devs, now_us);
    double plan_ms = (double)(sq_now_ns() - t0) / 1e6;
    free(links);
    if (rc != 0) {
        /* 1: nothing to place them on; the next worker up re-plans. */
        if (rc < 0)
            SQ_WARN("planning failed kind=%s code=%s", sq_dev_kind_name((sq_dev_kind_t)kind),
                    sq_err_name(rc));
        free(workers);
        return;
    }
    const pl_plan_t plan = *pl_loop_current(p->loop, kind);
    int n = 0;
    pl_loop_planned_sessions(p->loop, kind, &n);
    /* With at most nw devices, kept ones on their own ids below nw and new
     * ones on the smallest free ids, every id names a worker. */
    for (int i = 0; i < plan.ndevices; i++)
        if (plan.devices[i].id < 0 || plan.devices[i].id >= nw)
            SQ_WARN("plan device id=%d has no worker (of=%d)", plan.devices[i].id, nw);
    p->epoch++;

    /* Apply: load what each worker's device holds, pace it by its duty
     * cycle, route, then unload what moved away. */
    int64_t now = sq_now_us();
    for (int j = 0; j < nw; j++) {
        ds_worker_t *w = ds->workers[workers[j]];
        const pl_device_t *dev = device_of(p, kind, w->id);
        pl_dispatch_worker_add(ds->core, now, w->id,
                               dev != NULL && !dev->saturated ? (int64_t)dev->duty_cycle_us : 0);
        for (int a = 0; dev != NULL && a < dev->nallocs; a++) {
            session_view_t view;
            const session_view_t *ps = session_view(ds, dev->allocs[a].session_id, &view);
            ds_load_t *l = ps ? ds_load_find(w, ps->dm->key, 0) : NULL;
            if (ps != NULL && (l == NULL || l->state == LOAD_NONE || l->state == LOAD_FAILED))
                ds->ops->send_load(ds, ps->dm, w);
        }
        /* A spare device also loads the busiest sessions' models: it takes
         * their overflow once it holds them (routes follow the loads). */
        for (int o = 0; o < plan.noverflow; o++) {
            if (plan.overflow[o].device_id != j)
                continue;
            session_view_t view;
            const session_view_t *ps = session_view(ds, plan.overflow[o].session_id, &view);
            ds_load_t *l = ps ? ds_load_find(w, ps->dm->key, 0) : NULL;
            if (ps != NULL && (l == NULL || l->state == LOAD_NONE || l->state == LOAD_FAILED))
                ds->ops->send_load(ds, ps->dm, w);
        }
    }
    for (int i = 0; i < ds->nmodels; i++)
        if (ds->models[i]->kind == kind && ds->models[i]->active)
            ds->ops->update_routes(ds, ds->models[i]);
    settle_moves(ds, kind);
    SQ_INFO("epoch=%lld kind=%s reason=\"%s\" sessions=%d devices=%d of=%d lower_bound=%.2f "
            "moved=%d unplaced=%d plan_ms=%.3f",
            p->epoch, sq_dev_kind_name((sq_dev_kind_t)kind), reason, n, plan.ndevices, nw,
            plan.lower_bound_devices, plan.moved, plan.nunplaced, plan_ms);

    json_t *placements;
    json_t *snap = plan_json(ds, reason, &placements);
    publish_metrics(ds, snap, plan.moved);
    char *txt = json_dumps(snap, JSON_COMPACT | JSON_REAL_PRECISION(13));
    json_decref(snap);
    pthread_mutex_lock(&p->lock);
    free(p->json);
    p->json = sq_xstrdup(txt);
    pthread_mutex_unlock(&p->lock);
    store_job_t *sj = sq_xcalloc(1, sizeof(*sj));
    sj->epoch = p->epoch;
    snprintf(sj->reason, sizeof(sj->reason), "%s", reason);
    sj->plan = txt;
    sj->placements = placements;
    if (ds->srv->db != NULL)
        gw_db_post(ds->srv, store_job, sj);
    else /* a dispatcher without storage (unit tests): nothing to keep */
        store_job(NULL, sj);
    /* The advice window starts again. */
    p->ok = p->bad = p->busy_us = 0;
    p->window_start_us = now;
    free(workers);
    ds->ops->pump(ds);
}

void ds_plan_activate(gw_dispatch_t *ds, ds_model_t *dm, double bucket_ms, const gw_item_t *it)
{
    ds_plan_state_t *p = ds->plan;
    if (it != NULL && it->pipeline != NULL) {
        pipeline_known(ds, it->pipeline);
        pl_loop_stage_arrivals(p->loop, pipe_key(it->pipeline), it->stage, it->query_slo_ms,
                               dm->key, 0);
    }
    pl_loop_session(p->loop, dm->key, it != NULL ? it->slo_ms : bucket_ms, 1);
    if (dm->kind >= 0)
        run_epoch(ds, dm->kind, "new model", sq_now_us());
}

void ds_plan_invalidate(gw_dispatch_t *ds, int kind, const char *reason)
{
    if (kind < 0 || kind >= SQ_DEV_KIND_COUNT)
        return;
    pl_loop_invalidate(ds->plan->loop, kind, reason);
}

static int restore_ready(gw_dispatch_t *ds, int64_t now);

void ds_plan_loaded(gw_dispatch_t *ds, int kind)
{
    if (kind < 0 || kind >= SQ_DEV_KIND_COUNT || !ds->plan->kinds[kind].moves_pending)
        return;
    settle_moves(ds, kind);
}

int ds_plan_restoring(const gw_dispatch_t *ds)
{
    return ds->plan->nrestore > 0;
}

void ds_plan_tick(gw_dispatch_t *ds, int64_t now_us)
{
    ds_plan_state_t *p = ds->plan;
    /* After a restart, no epoch runs until the stored plan is reapplied. */
    if (p->nrestore > 0) {
        if (!restore_ready(ds, now_us))
            return;
        restore_all(ds);
    }
    sync_models(ds);
    unsigned dirty = pl_loop_dirty(p->loop);
    for (int k = 0; k < SQ_DEV_KIND_COUNT; k++)
        if (dirty & (1u << k))
            run_epoch(ds, k, pl_loop_reason(p->loop, k), now_us);
    /* A split made again (at every epoch, when a gamma moved, and at least
     * every PIPELINE_RESPLIT_US) goes to the loop: a stage whose budget
     * moved to another bucket moves its rate there at once. */
    resplit_pipelines(ds, now_us, dirty != 0);
    sync_pipelines(ds);
    /* Rates every second; epochs where they, the period or an
     * invalidation call for one (pl_loop.h). */
    unsigned due = pl_loop_advance(p->loop, now_us);
    for (int k = 0; k < SQ_DEV_KIND_COUNT; k++)
        if (due & (1u << k))
            run_epoch(ds, k, pl_loop_reason(p->loop, k), now_us);
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

/* Takes the plan read at start (store.c): its placements of models that
 * still exist become restore rows. */
static void restore_take(ds_plan_state_t *p, gw_server_t *srv)
{
    json_t *plan = srv->restore_plan, *rows = srv->restore_placements;
    srv->restore_plan = srv->restore_placements = NULL;
    size_t n = json_array_size(rows), i;
    json_t *r;
    p->restore = n > 0 ? sq_xcalloc(n, sizeof(*p->restore)) : NULL;
    p->restored_from = srv->last_epoch;
    int skipped = 0;
    json_array_foreach(rows, i, r)
    {
        restore_row_t *x = &p->restore[p->nrestore];
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
        gw_model_t *m = gw_registry_get(srv->registry, x->key);
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
static ds_worker_t *restore_worker(gw_dispatch_t *ds, const restore_row_t *row)
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
    ds_plan_state_t *p = ds->plan;
    int up = 0, configured = 0;
    for (int i = 0; i < ds->nworkers; i++)
        up += ds->workers[i] != NULL && ds->workers[i]->up;
    if (up == 0)
        return 0;
    for (int g = 0; g < ds->srv->cfg->ngroups; g++)
        configured += ds->srv->cfg->groups[g].count;
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
static ds_model_t *restore_session(gw_dispatch_t *ds, const restore_row_t *row)
{
    gw_model_t *m = gw_registry_get(ds->srv->registry, row->key);
    if (m == NULL)
        return NULL;
    int ok = strcmp(m->status, "ready") == 0 && m->has_profile[row->kind] &&
             ds->ops->serving_kind(ds->srv, m) == row->kind;
    ds_model_t *dm = ok ? ds->ops->model(ds, m) : NULL;
    gw_model_unref(m);
    if (dm == NULL || dm->removed || dm->poisoned || (dm->active && dm->kind != row->kind))
        return NULL;
    if (!dm->active) {
        dm->kind = row->kind;
        dm->active = 1;
    }
    pl_loop_session(ds->plan->loop, dm->key, row->slo_ms, 1);
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
    ds_plan_state_t *p = ds->plan;
    restore_row_t *rows = p->restore;
    int nrows = p->nrestore;
    p->restore = NULL;
    p->nrestore = 0;
    int done = 0;
    double headroom = ds->srv->cfg->plan_headroom;
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
            const restore_row_t *row = &rows[r];
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
                              .latency_us = pl_latency_us(prof, row->batch, ds->srv->cfg->k_std),
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
        run_epoch(ds, k, "restored", sq_now_us());
        done |= 1 << k;
    }
    free(rows);
    return done;
}
