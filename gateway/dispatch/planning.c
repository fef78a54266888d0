/* Live planning: the dispatch thread's epochs. Sessions are (model, SLO
 * bucket) with an EWMA of their arrival rate; per device kind, the pure
 * placement core (planner/pl.h) packs them onto the workers of that kind
 * (squishy bin packing, incremental from the previous plan); the plan
 * decides which worker loads which model, the dispatcher's routes and
 * target batches, and each worker's duty cycle. Models are loaded before
 * any route points at them and unloaded only after routes moved away.
 *
 * The core runs here, on the dispatch thread: it takes well under a
 * millisecond for the sessions one squishd serves (bench: 0.3 ms for 100
 * sessions); a deployment with thousands of sessions would want it on a
 * thread of its own. Each plan is stored in the model DB (plans and
 * placements, one row set per epoch) and served by GET /v1/plan. */
#include "dispatch_int.h"
#include "gw_catalog.h"
#include "gw_metrics.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define RATE_INTERVAL_US 1000000
/* After a restart, the stored plan waits this long after the first worker
 * up for the workers it names and the configured ones; then it is
 * reapplied with those up. */
#define RESTORE_WAIT_US 3000000

typedef struct {
    int id;
    ds_model_t *dm;
    double bucket_ms;
    /* Its own requests (not a pipeline's items: pstage_t counts those). */
    double ewma_rps; /* about ecfg.ewma_tau_ms of history */
    double own_rps;  /* max(ewma, the last second) */
    /* What the planner uses: own_rps plus the rates of the pipeline stages
     * whose current budget falls in this bucket (compose_rates). */
    double rate_rps;
    /* The SLO the planner packs it for: the bucket, or, for a session
     * whose only traffic is pipeline stages', the least of their budgets
     * (at least the bucket: a budget of 355 ms is not planned as 300). */
    double plan_slo_ms;
    double planned_rps; /* the rate the last plan was made for */
    double arrivals;    /* since the last rate update */
} psess_t;

/* A pipeline stage's items, at one query SLO (a query asking for another
 * SLO than the pipeline's gets the same shares of its own). Their rate is
 * the stage's, not a bucket's: when the split moves the stage's budget to
 * another SLO bucket, the whole rate moves to that bucket's session at
 * once, and the session it left has none of it. Counted per bucket, the
 * old bucket's rate would decay over the EWMA's tau (up fast, down slow)
 * and hold a device meanwhile. */
typedef struct {
    gw_pipeline_t *pipe; /* a reference */
    int stage;
    double query_slo_ms;
    ds_model_t *dm;   /* the record serving its items (as last seen) */
    double bucket_ms; /* where its rate went at the last compose_rates; 0: nowhere yet */
    double ewma_rps, rate_rps, arrivals;
} pstage_t;

typedef struct {
    int has;
    pl_plan_t plan;
    int *dev_worker; /* plan device id -> worker id, -1 none */
    int cap;
    double last_epoch_ms;
    int dirty;
    char dirty_reason[48];
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

struct gw_plan_state {
    psess_t *s;
    int n, cap, next_id;
    pstage_t *st;
    int nst, capst;
    pkind_t kinds[SQ_DEV_KIND_COUNT];
    pl_epoch_config_t ecfg;
    int64_t last_rate_us;
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

static void restore_take(gw_plan_state_t *p, gw_server_t *srv);

static double now_ms(void)
{
    return (double)sq_now_us() / 1000.0;
}

gw_plan_state_t *gw__plan_new(gw_dispatch_t *ds)
{
    gw_plan_state_t *p = sq_xcalloc(1, sizeof(*p));
    pl_epoch_config_default(&p->ecfg);
    p->ecfg.period_ms = ds->srv->cfg->epoch_ms;
    p->ecfg.min_interval_ms = ds->srv->cfg->epoch_min_interval_ms;
    p->last_rate_us = sq_now_us();
    p->window_start_us = p->last_rate_us;
    p->epoch = ds->srv->last_epoch;
    pthread_mutex_init(&p->lock, NULL);
    restore_take(p, ds->srv);
    return p;
}

void gw__plan_free(gw_plan_state_t *p)
{
    if (p == NULL)
        return;
    for (int k = 0; k < SQ_DEV_KIND_COUNT; k++) {
        if (p->kinds[k].has)
            pl_plan_dispose(&p->kinds[k].plan);
        free(p->kinds[k].dev_worker);
    }
    free(p->s);
    for (int i = 0; i < p->nst; i++)
        gw_pipeline_unref(p->st[i].pipe);
    free(p->st);
    free(p->json);
    free(p->restore);
    pthread_mutex_destroy(&p->lock);
    free(p);
}

static psess_t *psess(gw_plan_state_t *p, ds_model_t *dm, double bucket_ms, int create)
{
    for (int i = 0; i < p->n; i++)
        if (p->s[i].dm == dm && p->s[i].bucket_ms == bucket_ms)
            return &p->s[i];
    if (!create)
        return NULL;
    if (p->n == p->cap) {
        p->cap = p->cap ? 2 * p->cap : 16;
        p->s = sq_xrealloc(p->s, sizeof(*p->s) * (size_t)p->cap);
    }
    p->s[p->n] =
        (psess_t){.id = p->next_id++, .dm = dm, .bucket_ms = bucket_ms, .plan_slo_ms = INFINITY};
    return &p->s[p->n++];
}

/* Drops stage entry i (its reference with it). */
static void pstage_drop(gw_plan_state_t *p, int i)
{
    gw_pipeline_unref(p->st[i].pipe);
    p->st[i] = p->st[--p->nst];
}

static pstage_t *pstage(gw_plan_state_t *p, ds_model_t *dm, const gw_item_t *it)
{
    for (int i = 0; i < p->nst; i++) {
        pstage_t *x = &p->st[i];
        if (x->pipe == it->pipeline && x->stage == it->stage &&
            x->query_slo_ms == it->query_slo_ms) {
            x->dm = dm;
            return x;
        }
    }
    if (p->nst == p->capst) {
        p->capst = p->capst ? 2 * p->capst : 8;
        p->st = sq_xrealloc(p->st, sizeof(*p->st) * (size_t)p->capst);
    }
    gw_pipeline_ref(it->pipeline);
    p->st[p->nst] = (pstage_t){
        .pipe = it->pipeline, .stage = it->stage, .query_slo_ms = it->query_slo_ms, .dm = dm};
    return &p->st[p->nst++];
}

void gw__plan_forget(gw_dispatch_t *ds, const ds_model_t *dm)
{
    gw_plan_state_t *p = ds->plan;
    int k = 0;
    for (int i = 0; i < p->n; i++)
        if (p->s[i].dm != dm)
            p->s[k++] = p->s[i];
    p->n = k;
    for (int i = p->nst - 1; i >= 0; i--)
        if (p->st[i].dm == dm)
            pstage_drop(p, i);
}

void gw__plan_arrival(gw_dispatch_t *ds, ds_model_t *dm, double bucket_ms, const gw_item_t *it)
{
    if (it != NULL && it->pipeline != NULL)
        pstage(ds->plan, dm, it)->arrivals += 1;
    else
        psess(ds->plan, dm, bucket_ms, 1)->arrivals += 1;
}

/* Below this rate (requests a second) a session has no traffic to speak
 * of: it is planned only when its model has no session with traffic (so
 * that a model's first requests find it loaded), not beside one that has
 * (its requests are served by the workers holding the model). */
#define IDLE_SESSION_RPS 0.05

/* Each session's rate_rps: its own requests' rate plus the rates of the
 * pipeline stages whose current budget falls in its bucket (a session is
 * made for a bucket none had yet); and its plan_slo_ms. Stage entries of a
 * deleted pipeline, or without traffic (below IDLE_SESSION_RPS and no
 * arrival since the last rate update), go. Returns the kinds (bits) where
 * a stage's rate moved to another bucket since the last call: a split that
 * moved. */
static int compose_rates(gw_dispatch_t *ds)
{
    gw_plan_state_t *p = ds->plan;
    for (int i = 0; i < p->n; i++) {
        psess_t *ps = &p->s[i];
        ps->rate_rps = ps->own_rps;
        /* Its own requests' SLOs are known only by their bucket. */
        ps->plan_slo_ms = ps->own_rps >= IDLE_SESSION_RPS ? ps->bucket_ms : INFINITY;
    }
    int np = 0, moved = 0;
    gw_pipeline_t **live = p->nst > 0 ? gw_pipes_all(ds->srv->pipelines, &np) : NULL;
    for (int i = p->nst - 1; i >= 0; i--) {
        pstage_t *x = &p->st[i];
        int found = 0;
        for (int k = 0; k < np && !found; k++)
            found = live[k] == x->pipe;
        if (!found || x->dm->removed || (x->rate_rps < IDLE_SESSION_RPS && x->arrivals == 0)) {
            pstage_drop(p, i);
            continue;
        }
        double budget =
            gw_pipeline_budget_ms(x->pipe, x->stage) * x->query_slo_ms / x->pipe->slo_ms;
        double bucket = gw_slo_bucket_ms(budget);
        if (x->bucket_ms != bucket) {
            if (x->bucket_ms != 0 && x->dm->kind >= 0)
                moved |= 1 << x->dm->kind;
            x->bucket_ms = bucket;
        }
        psess_t *ps = psess(p, x->dm, bucket, 1);
        ps->rate_rps += x->rate_rps;
        if (budget < ps->plan_slo_ms)
            ps->plan_slo_ms = budget;
    }
    for (int k = 0; k < np; k++)
        gw_pipeline_unref(live[k]);
    free(live);
    for (int i = 0; i < p->n; i++)
        if (!isfinite(p->s[i].plan_slo_ms))
            p->s[i].plan_slo_ms = p->s[i].bucket_ms;
    return moved;
}

/* compose_rates, and a re-plan at the next tick of each kind where a
 * stage's rate moved to another bucket (not at the next rate change). */
static void follow_splits(gw_dispatch_t *ds)
{
    int moved = compose_rates(ds);
    for (int k = 0; k < SQ_DEV_KIND_COUNT; k++)
        if (moved & (1 << k))
            gw__plan_invalidate(ds, k, "pipeline split moved");
}

void gw__plan_outcome(gw_dispatch_t *ds, int ok)
{
    if (ok)
        ds->plan->ok += 1;
    else
        ds->plan->bad += 1;
}

void gw__plan_busy(gw_dispatch_t *ds, int worker, int64_t busy_us)
{
    (void)worker;
    ds->plan->busy_us += (double)busy_us;
}

/* The device a worker runs in kind k's plan, or NULL. */
static const pl_device_t *device_of(const pkind_t *K, int worker)
{
    if (!K->has)
        return NULL;
    for (int i = 0; i < K->plan.ndevices; i++) {
        int id = K->plan.devices[i].id;
        if (id < K->cap && K->dev_worker[id] == worker)
            return &K->plan.devices[i];
    }
    return NULL;
}

/* Whether the plan has worker hold session_id for its overflow batches
 * (pl_plan_t.overflow: a spare worker, or a planned one when short). */
static int overflow_here(const pkind_t *K, int worker, int session_id)
{
    for (int i = 0; K->has && i < K->plan.noverflow; i++) {
        const pl_overflow_t *o = &K->plan.overflow[i];
        if (o->session_id == session_id && o->device_id < K->cap &&
            K->dev_worker[o->device_id] == worker)
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

typedef struct {
    gw_dispatch_t *ds;
    const pkind_t *kind;
    int64_t key;
} route_ctx_t;

static int planned_worker(void *arg, int index, const pl_device_t *dev)
{
    const route_ctx_t *c = arg;
    (void)index;
    int wid = dev->id < c->kind->cap ? c->kind->dev_worker[dev->id] : -1;
    return usable(ds_worker_at(c->ds, wid), c->key) ? wid : -1;
}

int gw__plan_routes(gw_dispatch_t *ds, const ds_session_t *s, pl_route_t *routes, int max)
{
    gw_plan_state_t *p = ds->plan;
    ds_model_t *dm = s->model;
    psess_t *ps = psess(p, dm, s->bucket_ms, 0);
    const pkind_t *K =
        ps != NULL && dm->kind >= 0 && p->kinds[dm->kind].has ? &p->kinds[dm->kind] : NULL;
    /* No plan covers the session yet, or its planned workers are still
     * loading the model: every worker that holds it serves meanwhile. */
    int *holders = sq_xcalloc((size_t)ds->nworkers + 1, sizeof(*holders));
    int nholders = 0;
    for (int i = 0; i < ds->nworkers; i++)
        if (usable(ds->workers[i], dm->key))
            holders[nholders++] = i;
    route_ctx_t ctx = {.ds = ds, .kind = K, .key = dm->key};
    /* A session planned without traffic got the minimal batch: its window
     * is the dispatcher's own choice until a plan sees load. */
    pl_route_rules_t rules = {.worker_of = planned_worker,
                              .ctx = &ctx,
                              .targets = ps != NULL && ps->planned_rps >= 1,
                              .fallback = holders,
                              .nfallback = nholders};
    int n =
        pl_plan_routes(K != NULL ? &K->plan : NULL, ps != NULL ? ps->id : -1, &rules, routes, max);
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

static int device_id_cmp(const void *a, const void *b)
{
    const pl_device_t *x = a, *y = b;
    return (x->id > y->id) - (x->id < y->id);
}

static psess_t *psess_by_id(gw_plan_state_t *p, int id)
{
    for (int i = 0; i < p->n; i++)
        if (p->s[i].id == id)
            return &p->s[i];
    return NULL;
}

/* The share of requests within their SLO below which the advice releases
 * nothing (issue 15: >= 99.5% within SLO). */
#define ADVICE_SLO_FLOOR 0.995

/* What a stored placement row says session ps gets at alloc al: its share
 * of the rate the plan was made for (rate times plan_headroom), not of the
 * packed rate, which holds the burst headroom too (pl_alloc_t.rate_rps)
 * and would be inflated once more when a restart plans the restored rates
 * again. */
static double stored_rate(const gw_dispatch_t *ds, const pl_plan_t *plan, const psess_t *ps,
                          const pl_alloc_t *al)
{
    double packed = 0;
    for (int i = 0; i < plan->ndevices; i++)
        for (int a = 0; a < plan->devices[i].nallocs; a++)
            if (plan->devices[i].allocs[a].session_id == ps->id)
                packed += plan->devices[i].allocs[a].rate_rps;
    for (int u = 0; u < plan->nunplaced; u++)
        if (plan->unplaced[u].session_id == ps->id)
            packed += plan->unplaced[u].rate_rps;
    double input = ps->planned_rps * ds->srv->cfg->plan_headroom;
    return packed > input ? al->rate_rps * input / packed : al->rate_rps;
}

static json_t *plan_json(gw_dispatch_t *ds, const char *reason, json_t **placements)
{
    gw_plan_state_t *p = ds->plan;
    json_t *devices = json_array(), *unplaced = json_array(), *overflow = json_array();
    *placements = json_array();
    double lower = 0;
    int used = 0;
    for (int k = 0; k < SQ_DEV_KIND_COUNT; k++) {
        pkind_t *K = &p->kinds[k];
        if (!K->has)
            continue;
        lower += K->plan.lower_bound_devices;
        for (int i = 0; i < K->plan.ndevices; i++) {
            const pl_device_t *d = &K->plan.devices[i];
            int wid = d->id < K->cap ? K->dev_worker[d->id] : -1;
            ds_worker_t *w = ds_worker_at(ds, wid);
            json_t *sessions = json_array();
            for (int a = 0; a < d->nallocs; a++) {
                const pl_alloc_t *al = &d->allocs[a];
                psess_t *ps = psess_by_id(p, al->session_id);
                if (ps == NULL)
                    continue;
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
                              stored_rate(ds, &K->plan, ps, al)));
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
        for (int o = 0; o < K->plan.noverflow; o++) {
            const pl_overflow_t *ov = &K->plan.overflow[o];
            psess_t *ps = psess_by_id(p, ov->session_id);
            int wid = ov->device_id < K->cap ? K->dev_worker[ov->device_id] : -1;
            if (ps != NULL)
                json_array_append_new(overflow,
                                      json_pack("{s:s, s:i, s:f, s:i}", "model", ps->dm->m->name,
                                                "version", ps->dm->m->version, "slo_ms",
                                                ps->bucket_ms, "worker", wid));
        }
        for (int u = 0; u < K->plan.nunplaced; u++) {
            psess_t *ps = psess_by_id(p, K->plan.unplaced[u].session_id);
            if (ps != NULL)
                json_array_append_new(
                    unplaced, json_pack("{s:s, s:f, s:f, s:s}", "model", ps->dm->m->name, "slo_ms",
                                        ps->bucket_ms, "rate_rps", K->plan.unplaced[u].rate_rps,
                                        "reason", unplaced_reason(K->plan.unplaced[u].reason)));
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
    for (int k = 0; k < SQ_DEV_KIND_COUNT; k++)
        for (int u = 0; p->kinds[k].has && u < p->kinds[k].plan.nunplaced; u++)
            short_of_devices |= p->kinds[k].plan.unplaced[u].reason == PL_UNPLACED_DEVICES;
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
    if (mdb_plan_store(db, j->epoch, j->reason, j->plan, j->placements) != 0)
        SQ_WARN("cannot store plan epoch=%lld error=\"%s\"", j->epoch, mdb_errmsg(db));
    free(j->plan);
    json_decref(j->placements);
    free(j);
}

json_t *gw_dispatch_plan_json(gw_server_t *srv)
{
    gw_plan_state_t *p = srv->dispatch ? srv->dispatch->plan : NULL;
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
    if (n > 0)
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
    gw_plan_state_t *p = ds->plan;
    gw_metrics_plan_t mp = {
        .epoch = p->epoch,
        .devices = (int)json_integer_value(json_object_get(snap, "devices_used")),
        .lower_bound_devices = json_number_value(json_object_get(snap, "lower_bound_devices")),
        .advice_devices =
            json_number_value(json_object_get(json_object_get(snap, "advice"), "devices_delta")),
        .models_moved = moved};
    gw_metrics_plan(ds->srv->metrics, &mp);
    gw_metrics_session_t *ms = sq_xcalloc((size_t)p->n + 1, sizeof(*ms));
    int n = 0;
    for (int i = 0; i < p->n; i++) {
        psess_t *ps = &p->s[i];
        if (ps->dm->removed || !ps->dm->active || ps->dm->kind < 0)
            continue;
        pkind_t *K = &p->kinds[ps->dm->kind];
        ms[n++] = (gw_metrics_session_t){.model = ps->dm->m,
                                         .slo_ms = ps->bucket_ms,
                                         .rate_rps = ps->rate_rps,
                                         .planned_rps =
                                             K->has ? pl_plan_capacity_rps(&K->plan, ps->id) : 0};
    }
    gw_metrics_sessions(ds->srv->metrics, ms, n);
    free(ms);
}

/* ---- epochs ------------------------------------------------------------ */

/* Whether K's plan moved model key away from worker (it places key
 * elsewhere, not there, nor there for overflow), and whether a worker it
 * moved to holds it already (*arrived). A model the plan could not place
 * is not moved. */
static int moved_away(gw_dispatch_t *ds, const pkind_t *K, int worker, int64_t key, int *arrived)
{
    gw_plan_state_t *p = ds->plan;
    const pl_device_t *dev = device_of(K, worker);
    int here = 0, elsewhere = 0;
    *arrived = 0;
    for (int s = 0; s < p->n; s++) {
        if (p->s[s].dm->key != key)
            continue;
        here |= alloc_of(dev, p->s[s].id) != NULL || overflow_here(K, worker, p->s[s].id);
        for (int d = 0; d < K->plan.ndevices; d++) {
            if (alloc_of(&K->plan.devices[d], p->s[s].id) == NULL)
                continue;
            elsewhere = 1;
            int id = K->plan.devices[d].id;
            ds_worker_t *o = ds_worker_at(ds, id < K->cap ? K->dev_worker[id] : -1);
            ds_load_t *ol = o != NULL && o->up ? ds_load_find(o, key, 0) : NULL;
            *arrived |= ol != NULL && ol->state == LOAD_DONE;
        }
    }
    return !here && elsewhere;
}

/* Unloads what the plan of kind moved away from a worker, make before
 * break: once a worker it moved to holds it (until then requests would
 * find it loaded nowhere); the load finishing there runs this again
 * (gw__plan_loaded). */
static void settle_moves(gw_dispatch_t *ds, int kind)
{
    pkind_t *K = &ds->plan->kinds[kind];
    if (!K->has)
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
                !moved_away(ds, K, w->id, l->key, &arrived))
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

static int same_model(const ds_model_t *dm, const char *name, int version)
{
    return strcmp(dm->m->name, name) == 0 && (version == 0 || dm->m->version == version);
}

/* The sessions of pipeline stages on another stage's crops get them in
 * clumps, one parent batch's at once: their burst headroom plans for that
 * (pl_session_t.dispersion), as squish-sim's planner does. The parent's
 * batch is taken as its saturation batch at its budget (a bound), gamma's
 * variance as a Poisson count's (only its mean is measured). sessions[k]
 * is the plan session of p->s[index[k]]. */
static void set_clump_dispersion(gw_dispatch_t *ds, pl_session_t *sessions, const int *index, int n)
{
    gw_server_t *srv = ds->srv;
    gw_plan_state_t *p = ds->plan;
    int np = 0;
    gw_pipeline_t **all = srv->pipelines ? gw_pipes_all(srv->pipelines, &np) : NULL;
    for (int i = 0; i < np; i++) {
        gw_stage_clumps_t cl[GW_PIPE_MAX_STAGES];
        int nc = gw_pipeline_clumps(all[i], cl);
        for (int c = 0; c < nc; c++) {
            const pl_profile_t *parent = NULL;
            for (int j = 0; j < p->n && parent == NULL; j++) {
                ds_model_t *dm = p->s[j].dm;
                if (!dm->removed && same_model(dm, cl[c].parent_model, cl[c].parent_version) &&
                    dm->m->has_profile[dm->kind])
                    parent = ds_profile(dm, dm->kind);
            }
            if (parent == NULL)
                continue;
            int batch = 0;
            pl_max_throughput_rps(parent, cl[c].parent_budget_ms * 1000.0, srv->cfg->k_std, 0,
                                  &batch);
            double disp = pl_clump_dispersion(cl[c].gamma, cl[c].gamma, batch);
            double bucket = gw_slo_bucket_ms(cl[c].budget_ms);
            for (int k = 0; k < n; k++) {
                const psess_t *ps = &p->s[index[k]];
                if (same_model(ps->dm, cl[c].model, cl[c].version) && ps->bucket_ms == bucket &&
                    disp > sessions[k].dispersion)
                    sessions[k].dispersion = disp;
            }
        }
        gw_pipeline_unref(all[i]);
    }
    free(all);
}

static void run_epoch(gw_dispatch_t *ds, int kind, const char *reason)
{
    gw_plan_state_t *p = ds->plan;
    pkind_t *K = &p->kinds[kind];
    /* An epoch before the stored plan was reapplied (a request for a new
     * model): reapply it now, with the workers that are up. */
    if (p->nrestore > 0 && (restore_all(ds) & (1 << kind)))
        return;
    K->dirty = 0;
    /* The devices: up workers of this kind (one measuring a model too: it
     * measures in its gaps). */
    int *workers = sq_xcalloc((size_t)ds->nworkers + 1, sizeof(int));
    int nw = 0;
    double mem = 0;
    for (int i = 0; i < ds->nworkers; i++) {
        ds_worker_t *w = ds->workers[i];
        if (w != NULL && w->up && w->kind == kind) {
            workers[nw++] = i;
            if (mem == 0 || (double)w->memory_bytes < mem)
                mem = (double)w->memory_bytes;
        }
    }
    /* The sessions of active models served by this kind, at the rates of
     * now (a pipeline stage's at its current budget); one without traffic
     * beside a session of its model with some is left out
     * (IDLE_SESSION_RPS). */
    compose_rates(ds);
    pl_session_t *ss = sq_xcalloc((size_t)p->n + 1, sizeof(*ss));
    int *index = sq_xcalloc((size_t)p->n + 1, sizeof(int));
    int n = 0;
    for (int i = 0; i < p->n; i++) {
        psess_t *ps = &p->s[i];
        ds_model_t *dm = ps->dm;
        if (dm->removed || !dm->active || dm->kind != kind || !dm->m->has_profile[kind])
            continue;
        ps->planned_rps = ps->rate_rps;
        int busy_sibling = 0;
        for (int j = 0; j < p->n && ps->rate_rps < IDLE_SESSION_RPS && !busy_sibling; j++)
            busy_sibling = p->s[j].dm == dm && p->s[j].rate_rps >= IDLE_SESSION_RPS;
        if (busy_sibling)
            continue;
        index[n] = i;
        ss[n++] = (pl_session_t){.id = ps->id,
                                 .model = (int)dm->key,
                                 .name = dm->m->name,
                                 .profile = ds_profile(dm, kind),
                                 .slo_us = ps->plan_slo_ms * 1000.0,
                                 .rate_rps = ps->rate_rps * ds->srv->cfg->plan_headroom,
                                 .item_bytes = ds_item_bytes(dm->m, SQ_INPUT_PIXELS)};
        dm->m->profile[kind].memory_bytes = dm->m->profile[kind].memory_bytes > 0
                                                ? dm->m->profile[kind].memory_bytes
                                                : (double)dm->m->memory_bytes;
    }
    set_clump_dispersion(ds, ss, index, n);
    free(index);
    if (nw == 0 && n > 0) {
        free(workers);
        free(ss);
        return; /* nothing to place them on; the next worker up re-plans */
    }
    /* Plan device id j is the worker workers[j], behind its measured link
     * (pl.h: Symphony's d_data); a plan without any remote worker packs as
     * for local devices. The previous plan's devices are renamed to these
     * ids (a device keeps its worker), and dropped when their worker is gone. */
    pl_link_t *links = sq_xcalloc((size_t)nw + 1, sizeof(*links));
    int remote = 0;
    for (int j = 0; j < nw; j++) {
        const ds_worker_t *w = ds->workers[workers[j]];
        if (w->addr[0] && (w->rtt_us > 0 || w->bytes_per_us > 0)) {
            links[j] = (pl_link_t){.rtt_us = (double)w->rtt_us, .bytes_per_us = w->bytes_per_us};
            remote = 1;
        }
    }
    pl_options_t opt = {.k_std = ds->srv->cfg->k_std,
                        .device_memory_bytes = mem,
                        .max_devices = nw,
                        .links = remote ? links : NULL,
                        .nlinks = remote ? nw : 0,
                        .burst_quantile = ds->srv->cfg->plan_burst_quantile,
                        .overflow = 1};
    pl_plan_t prev = {0};
    pl_device_t *kept = NULL;
    if (K->has) {
        prev = K->plan;
        kept = sq_xcalloc((size_t)K->plan.ndevices + 1, sizeof(*kept));
        prev.ndevices = 0;
        for (int i = 0; i < K->plan.ndevices; i++) {
            int id = K->plan.devices[i].id;
            int wid = id < K->cap ? K->dev_worker[id] : -1;
            for (int j = 0; j < nw; j++)
                if (workers[j] == wid) {
                    kept[prev.ndevices] = K->plan.devices[i];
                    kept[prev.ndevices++].id = j;
                }
        }
        qsort(kept, (size_t)prev.ndevices, sizeof(*kept), device_id_cmp);
        prev.devices = kept;
    }
    pl_plan_t plan;
    int64_t t0 = sq_now_ns();
    int rc = pl_plan(&plan, ss, n, K->has ? &prev : NULL, &opt);
    double plan_ms = (double)(sq_now_ns() - t0) / 1e6;
    free(kept);
    free(links);
    if (rc != 0) {
        SQ_WARN("planning failed kind=%s code=%s", sq_dev_kind_name((sq_dev_kind_t)kind),
                sq_err_name(rc));
        free(workers);
        free(ss);
        return;
    }
    /* With at most nw devices, kept ones on their own ids below nw and new
     * ones on the smallest free ids, every id names a worker. */
    int *map = sq_xcalloc((size_t)nw + 1, sizeof(int));
    for (int j = 0; j < nw; j++)
        map[j] = workers[j];
    for (int i = 0; i < plan.ndevices; i++)
        if (plan.devices[i].id < 0 || plan.devices[i].id >= nw)
            SQ_WARN("plan device id=%d has no worker (of=%d)", plan.devices[i].id, nw);
    if (K->has)
        pl_plan_dispose(&K->plan);
    free(K->dev_worker);
    K->plan = plan;
    K->has = 1;
    K->dev_worker = map;
    K->cap = nw;
    K->last_epoch_ms = now_ms();
    p->epoch++;

    /* Apply: load what each worker's device holds, pace it by its duty
     * cycle, route, then unload what moved away. */
    int64_t now = sq_now_us();
    for (int j = 0; j < nw; j++) {
        ds_worker_t *w = ds->workers[workers[j]];
        const pl_device_t *dev = device_of(K, w->id);
        pl_dispatch_worker_add(ds->core, now, w->id,
                               dev != NULL && !dev->saturated ? (int64_t)dev->duty_cycle_us : 0);
        for (int a = 0; dev != NULL && a < dev->nallocs; a++) {
            psess_t *ps = psess_by_id(p, dev->allocs[a].session_id);
            ds_load_t *l = ps ? ds_load_find(w, ps->dm->key, 0) : NULL;
            if (ps != NULL && (l == NULL || l->state == LOAD_NONE || l->state == LOAD_FAILED))
                ds->ops->send_load(ds, ps->dm, w);
        }
        /* A spare device also loads the busiest sessions' models: it takes
         * their overflow once it holds them (routes follow the loads). */
        for (int o = 0; o < plan.noverflow; o++) {
            if (plan.overflow[o].device_id != j)
                continue;
            psess_t *ps = psess_by_id(p, plan.overflow[o].session_id);
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
    gw_db_post(ds->srv, store_job, sj);
    /* The advice window starts again. */
    p->ok = p->bad = p->busy_us = 0;
    p->window_start_us = now;
    free(workers);
    free(ss);
    ds->ops->pump(ds);
}

void gw__plan_activate(gw_dispatch_t *ds, ds_model_t *dm, double bucket_ms, const gw_item_t *it)
{
    psess(ds->plan, dm, bucket_ms, 1);
    if (it != NULL && it->pipeline != NULL)
        pstage(ds->plan, dm, it);
    if (dm->kind >= 0)
        run_epoch(ds, dm->kind, "new model");
}

void gw__plan_invalidate(gw_dispatch_t *ds, int kind, const char *reason)
{
    if (kind < 0 || kind >= SQ_DEV_KIND_COUNT)
        return;
    pkind_t *K = &ds->plan->kinds[kind];
    if (!K->dirty)
        snprintf(K->dirty_reason, sizeof(K->dirty_reason), "%s", reason);
    K->dirty = 1;
}

static int restore_ready(gw_dispatch_t *ds, int64_t now);

void gw__plan_loaded(gw_dispatch_t *ds, int kind)
{
    if (kind < 0 || kind >= SQ_DEV_KIND_COUNT || !ds->plan->kinds[kind].moves_pending)
        return;
    settle_moves(ds, kind);
}

int gw__plan_restoring(const gw_dispatch_t *ds)
{
    return ds->plan->nrestore > 0;
}

/* One rate update: the EWMA takes the arrivals of the last interval_ms
 * (then zeroed); returns the rate the planner uses, max(EWMA, the last
 * interval's). */
static double rate_step(double *ewma_rps, double *arrivals, double interval_ms, double tau_ms)
{
    *ewma_rps = pl_rate_ewma(*ewma_rps, *arrivals, interval_ms, tau_ms);
    double last = *arrivals * 1000.0 / interval_ms;
    *arrivals = 0;
    return last > *ewma_rps ? last : *ewma_rps;
}

void gw__plan_tick(gw_dispatch_t *ds, int64_t now_us)
{
    gw_plan_state_t *p = ds->plan;
    /* After a restart, no epoch runs until the stored plan is reapplied. */
    if (p->nrestore > 0) {
        if (!restore_ready(ds, now_us))
            return;
        restore_all(ds);
    }
    int epochs = 0;
    for (int k = 0; k < SQ_DEV_KIND_COUNT; k++)
        if (p->kinds[k].dirty) {
            run_epoch(ds, k, p->kinds[k].dirty_reason);
            epochs++;
        }
    /* A split that moved a stage's budget to another bucket moves its
     * rate there at once. */
    if (resplit_pipelines(ds, now_us, epochs > 0))
        follow_splits(ds);
    if (now_us - p->last_rate_us < RATE_INTERVAL_US)
        return;
    double interval_ms = (double)(now_us - p->last_rate_us) / 1000.0;
    p->last_rate_us = now_us;
    /* Up fast, down slow: a step up in load is planned for within a second
     * (the EWMA alone would take about tau to see it and drop meanwhile),
     * a dip is smoothed over tau so that devices are not released early. */
    for (int i = 0; i < p->n; i++)
        p->s[i].own_rps =
            rate_step(&p->s[i].ewma_rps, &p->s[i].arrivals, interval_ms, p->ecfg.ewma_tau_ms);
    for (int i = 0; i < p->nst; i++)
        p->st[i].rate_rps =
            rate_step(&p->st[i].ewma_rps, &p->st[i].arrivals, interval_ms, p->ecfg.ewma_tau_ms);
    follow_splits(ds);
    /* Epochs: periodic, or early when a rate leaves [low, high] of the rate
     * the plan was made for (never sooner than min_interval_ms after the
     * last). Rates below one request a second are noise, not a reason. */
    double *rate = sq_xcalloc((size_t)p->n + 1, sizeof(double));
    double *planned = sq_xcalloc((size_t)p->n + 1, sizeof(double));
    for (int k = 0; k < SQ_DEV_KIND_COUNT; k++) {
        pkind_t *K = &p->kinds[k];
        if (!K->has)
            continue;
        int n = 0;
        for (int i = 0; i < p->n; i++) {
            if (p->s[i].dm->kind != k || p->s[i].dm->removed)
                continue;
            rate[n] = p->s[i].rate_rps;
            planned[n] = p->s[i].planned_rps;
            if (rate[n] < 1 && planned[n] < 1)
                rate[n] = planned[n];
            n++;
        }
        pl_epoch_reason_t why =
            pl_epoch_due(&p->ecfg, now_ms(), K->last_epoch_ms, rate, planned, n);
        /* Scaling up is urgent (requests drop meanwhile), scaling down is
         * not: a rate above what the plan serves re-plans after the short
         * epoch_scale_up_ms, everything else waits for the usual interval. */
        int up = 0;
        for (int i = 0; i < n; i++)
            up |= rate[i] >= 1 && rate[i] > p->ecfg.high * planned[i];
        if (why == PL_EPOCH_NONE && up &&
            now_ms() - K->last_epoch_ms >= ds->srv->cfg->epoch_scale_up_ms)
            why = PL_EPOCH_RATE_CHANGE;
        if (why != PL_EPOCH_NONE)
            run_epoch(ds, k, why == PL_EPOCH_PERIODIC ? "periodic" : "rate change");
    }
    free(rate);
    free(planned);
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
static void restore_take(gw_plan_state_t *p, gw_server_t *srv)
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
    gw_plan_state_t *p = ds->plan;
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
static psess_t *restore_session(gw_dispatch_t *ds, const restore_row_t *row, int create)
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
    return psess(ds->plan, dm, gw_slo_bucket_ms(row->slo_ms), create);
}

/* Reapplies the stored plan, kind by kind: its sessions become active at
 * the stored rates, its devices that have their worker up become the
 * previous plan, and an epoch ("restored") plans from there: the same
 * placements when everything is as it was; what no longer fits (fewer
 * devices, a model gone) is placed as the planner can, and the next epochs
 * follow the traffic. Returns the kinds it planned (bits). */
static int restore_all(gw_dispatch_t *ds)
{
    gw_plan_state_t *p = ds->plan;
    restore_row_t *rows = p->restore;
    int nrows = p->nrestore;
    p->restore = NULL;
    p->nrestore = 0;
    int done = 0;
    double headroom = ds->srv->cfg->plan_headroom;
    for (int k = 0; k < SQ_DEV_KIND_COUNT; k++) {
        /* Sessions first (psess may move the array), then their rates. */
        int nsess = 0;
        for (int r = 0; r < nrows; r++)
            if (rows[r].kind == k && restore_session(ds, &rows[r], 1) != NULL)
                nsess++;
        if (nsess == 0)
            continue;
        for (int r = 0; r < nrows; r++) {
            psess_t *ps = rows[r].kind == k ? restore_session(ds, &rows[r], 0) : NULL;
            if (ps != NULL)
                ps->ewma_rps = ps->own_rps = ps->rate_rps = 0;
        }
        pl_plan_t prev = {0};
        prev.devices = sq_xcalloc((size_t)nrows, sizeof(*prev.devices));
        int *dev_worker = sq_xcalloc((size_t)nrows + 1, sizeof(int));
        const char **names = sq_xcalloc((size_t)nrows, sizeof(*names));
        int ndev = 0, placed = 0, dropped = 0;
        for (int r = 0; r < nrows; r++) {
            const restore_row_t *row = &rows[r];
            psess_t *ps = row->kind == k ? restore_session(ds, row, 0) : NULL;
            if (ps == NULL)
                continue;
            ps->own_rps += row->rate_rps / headroom;
            ps->ewma_rps = ps->rate_rps = ps->own_rps;
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
            const pl_profile_t *prof = &ps->dm->m->profile[k];
            pl_alloc_t *a = &dev->allocs[dev->nallocs++];
            *a = (pl_alloc_t){.session_id = ps->id,
                              .model = (int)ps->dm->key,
                              .batch = row->batch,
                              .latency_us = pl_latency_us(prof, row->batch, ds->srv->cfg->k_std),
                              .rate_rps = row->rate_rps};
            dev->occupancy += a->latency_us / dev->duty_cycle_us;
            placed++;
        }
        free(names);
        prev.ndevices = ndev;
        pkind_t *K = &p->kinds[k];
        if (K->has)
            pl_plan_dispose(&K->plan);
        free(K->dev_worker);
        K->plan = prev;
        K->has = 1;
        K->dev_worker = dev_worker;
        K->cap = ndev;
        SQ_INFO("plan restored from_epoch=%lld kind=%s rows=%d devices=%d placements=%d "
                "without_worker=%d",
                p->restored_from, sq_dev_kind_name((sq_dev_kind_t)k), nsess, ndev, placed, dropped);
        run_epoch(ds, k, "restored");
        done |= 1 << k;
    }
    free(rows);
    return done;
}
