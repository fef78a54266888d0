/* squish-sim engine (sim.h): arrivals, emulated devices, the event loop
 * around the real dispatcher core, and the summary. */
#include "sim.h"

#include "sim_rng.h"

#include <pl.h>
#include <pl_loop.h>
#include <sq.h>

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void sim_opts_default(sim_opts_t *o)
{
    memset(o, 0, sizeof(*o));
    o->policy = PL_POLICY_DEFERRED;
    o->rate_scale = 1;
    o->duration_s = 10;
    o->routing = SIM_ROUTE_AUTO;
    o->plan_headroom = 1;
    o->plan_burst_quantile = PL_BURST_QUANTILE;
    o->plan_overflow = 1;
}

/* ---- arrivals ---- */

typedef struct {
    int64_t at_us;
    int session;
    uint32_t seq; /* per session, keeps the sort stable */
} arrival_t;

typedef struct {
    arrival_t *v;
    size_t n, cap;
} arrivals_t;

static void arrivals_push(arrivals_t *a, int64_t at_us, int session, uint32_t seq)
{
    if (a->n == a->cap) {
        a->cap = a->cap ? a->cap * 2 : 4096;
        a->v = sq_xrealloc(a->v, sizeof(*a->v) * a->cap);
    }
    a->v[a->n++] = (arrival_t){.at_us = at_us, .session = session, .seq = seq};
}

static int arrival_cmp(const void *x, const void *y)
{
    const arrival_t *a = x, *b = y;
    if (a->at_us != b->at_us)
        return a->at_us < b->at_us ? -1 : 1;
    if (a->session != b->session)
        return a->session < b->session ? -1 : 1;
    return (a->seq > b->seq) - (a->seq < b->seq);
}

/* Appends the arrivals of session idx (a pipeline's queries: idx past the
 * sessions) with process a and mean rate rate_rps; returns its span in
 * seconds. Gaps are drawn with mean 1 and divided by the rate, so a higher
 * scale replays the same pattern compressed in time (the goodput search
 * stays smooth). */
static double gen_arrivals(arrivals_t *out, const wl_arrivals_t *a, double rate_rps, int idx,
                           unsigned long long seed, const sim_opts_t *o)
{
    sim_rng_t rng;
    uint64_t mix = seed ^ (0xd1b54a32d192ed03ULL * (uint64_t)(idx + 1));
    sim_rng_seed(&rng, sim_splitmix64(&mix));
    uint32_t seq = 0;
    if (a->process == WL_ARRIVALS_TIMES) {
        for (int i = 0; i < a->ntimes; i++)
            arrivals_push(out, llround(a->times_ms[i] * 1000 / o->rate_scale), idx, seq++);
        return a->ntimes ? a->times_ms[a->ntimes - 1] / 1000 / o->rate_scale : 0;
    }
    wl_segment_t only = {.duration_s = o->duration_s, .rate_rps = rate_rps};
    const wl_segment_t *segs = a->process == WL_ARRIVALS_NONE ? &only : a->segments;
    int nsegs = a->process == WL_ARRIVALS_NONE ? 1 : a->nsegments;
    wl_process_t proc = a->process == WL_ARRIVALS_NONE ? WL_ARRIVALS_POISSON : a->process;
    double start_us = 0;
    for (int k = 0; k < nsegs; k++) {
        double end_us = start_us + segs[k].duration_s * 1e6;
        double rate_per_us = segs[k].rate_rps * o->rate_scale / 1e6;
        if (rate_per_us > 0) {
            double t = start_us;
            for (uint64_t i = 0;; i++) {
                double gap;
                if (proc == WL_ARRIVALS_UNIFORM)
                    gap = i == 0 ? 0 : 1;
                else if (proc == WL_ARRIVALS_GAMMA)
                    gap = sim_rng_gamma_mean1(&rng, a->shape);
                else
                    gap = sim_rng_exp(&rng);
                t = proc == WL_ARRIVALS_UNIFORM ? start_us + (double)i / rate_per_us
                                                : t + gap / rate_per_us;
                if (t >= end_us)
                    break;
                arrivals_push(out, llround(t), idx, seq++);
            }
        }
        start_us = end_us;
    }
    return start_us / 1e6;
}

/* ---- devices ---- */

typedef struct {
    int busy;
    uint64_t batch_id;
    size_t record; /* index into res->batches */
    int64_t end_us;
    uint64_t *ids;
    int nids, cap_ids;
    int used;
    pl_link_t link; /* the workload's devices.hosts; 0, 0: local */
} device_t;

typedef struct {
    int64_t end_us;
    int device;
} completion_t;

typedef struct {
    completion_t *v;
    int n;
} cheap_t;

static int c_less(const completion_t *a, const completion_t *b)
{
    return a->end_us < b->end_us || (a->end_us == b->end_us && a->device < b->device);
}

static void cheap_push(cheap_t *h, completion_t c)
{
    int i = h->n++;
    h->v[i] = c;
    while (i > 0) {
        int p = (i - 1) / 2;
        if (!c_less(&h->v[i], &h->v[p]))
            break;
        completion_t t = h->v[i];
        h->v[i] = h->v[p];
        h->v[p] = t;
        i = p;
    }
}

static completion_t cheap_pop(cheap_t *h)
{
    completion_t top = h->v[0];
    h->v[0] = h->v[--h->n];
    int i = 0;
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < h->n && c_less(&h->v[l], &h->v[m]))
            m = l;
        if (r < h->n && c_less(&h->v[r], &h->v[m]))
            m = r;
        if (m == i)
            break;
        completion_t t = h->v[i];
        h->v[i] = h->v[m];
        h->v[m] = t;
        i = m;
    }
    return top;
}

/* ---- the run ---- */

/* A dispatcher session: one of the workload's, or a pipeline's stage (its
 * budget as its SLO, the pipeline's rate times the fan-outs as its rate). */
typedef struct {
    int model;
    double slo_us;
    double rate_rps;               /* planned (mean) rate, before rate_scale */
    const wl_arrivals_t *arrivals; /* the session's, or the pipeline's queries' */
    double arrivals_rate;          /* the mean rate of those arrivals */
    int pipeline, stage;           /* a stage's; -1, -1 for a workload session */
} sim_sess_t;

/* A pipeline's stage in the run: its deadline offset from the query's
 * arrival (the budgets along the longest path up to it, its own included)
 * and its children. */
typedef struct {
    int64_t cum_us;
    int nchildren;
    int *children; /* owned */
} sim_stage_t;

typedef struct {
    const wl_workload_t *w;
    const sim_opts_t *o;
    sim_result_t *res;
    pl_dispatch_t *d;
    device_t *dev;
    cheap_t done;
    int64_t timer_us;
    int64_t **exec_us;  /* per session: the emulated device's l(b), b = 1..max */
    double *item_bytes; /* per session: its model's input + output bytes */
    size_t cap_batches;
    int failed;
    /* Placement routing (SIM_ROUTE_PLAN): squishd's planning loop
     * (pl_loop.h), fed the arrivals; with epochs (sim_opts_t.epoch_s) it
     * takes rates and decides epochs at every tick, as on squishd's
     * dispatch thread. */
    int planning;
    pl_loop_t *loop;
    int64_t next_tick_us, tick_us;
    int64_t *plan_at_us; /* when each plan was applied, and its devices */
    int *plan_devices;
    int nplans, capplans;
    int nss;
    sim_sess_t *ss; /* the dispatcher sessions */
    /* Pipelines: per pipeline its stages; per query its per-stage state at
     * qoff[q] (stage k at qoff[q] + k): items pending (queued or running),
     * items created, fired (every item it will get is created), complete
     * (fired and none pending); its items as a list (qhead, inext). */
    sim_stage_t **stages;
    size_t cap_requests;
    size_t *qoff;
    int *pend;
    size_t *created;
    unsigned char *fired, *complete;
    long *qhead, *inext;
    sim_rng_t *qrng; /* per query: its fan-out draws */
    int *kill;       /* queries to drop once the dispatcher's actions are read */
    size_t nkill, capkill;
    pl_request_t *clump; /* item_push's, handed to the dispatcher together */
    int cap_clump;
} run_t;

static void kill_query(run_t *r, int q, int outcome, int64_t now);

static void absorb(run_t *r)
{
    const pl_action_t *a;
    size_t n = pl_dispatch_take(r->d, &a);
    sim_result_t *res = r->res;
    int64_t last_at = 0;
    for (size_t i = 0; i < n; i++) {
        if (a[i].kind == PL_ACT_TIMER) {
            r->timer_us = a[i].at_us;
        } else if (a[i].kind == PL_ACT_DROP) {
            sim_request_t *q = &res->requests[a[i].request_id];
            q->outcome = SIM_DROPPED;
            q->reason = a[i].reason;
            q->finish_us = a[i].at_us;
            res->dropped++;
            if (q->query >= 0) {
                /* The whole query goes, once the actions are read (taking
                 * its other items out of their queues is a call into the
                 * dispatcher, which ends this list's life). */
                r->pend[r->qoff[q->query] + (size_t)q->stage]--;
                if (r->capkill == r->nkill) {
                    r->capkill = r->capkill ? 2 * r->capkill : 64;
                    r->kill = sq_xrealloc(r->kill, sizeof(int) * r->capkill);
                }
                r->kill[r->nkill++] = q->query;
                last_at = a[i].at_us;
            }
        } else {
            device_t *dv = &r->dev[a[i].worker];
            if (res->nbatches == r->cap_batches) {
                r->cap_batches = r->cap_batches ? r->cap_batches * 2 : 4096;
                res->batches = sq_xrealloc(res->batches, sizeof(sim_batch_t) * r->cap_batches);
            }
            /* Behind a link the batch goes over and its answer comes back:
             * rtt + b * item_bytes / bandwidth (rounded up to whole µs, as
             * the dispatcher assumes), then l(b). */
            int64_t exec = r->exec_us[a[i].session][a[i].count];
            const pl_link_t *l = &dv->link;
            if (l->rtt_us > 0 || l->bytes_per_us > 0)
                exec +=
                    llround(l->rtt_us) +
                    (l->bytes_per_us > 0
                         ? (int64_t)ceil(a[i].count * r->item_bytes[a[i].session] / l->bytes_per_us)
                         : 0);
            sim_batch_t *b = &res->batches[res->nbatches];
            *b = (sim_batch_t){.device = a[i].worker,
                               .session = a[i].session,
                               .start_us = a[i].at_us,
                               .end_us = a[i].at_us + r->o->net_delay_us + exec,
                               .size = a[i].count};
            if (dv->busy) {
                /* The dispatcher gave a busy device a batch: a real device
                 * could not have run it. Stop; the checker reports it. */
                res->nbatches++;
                r->failed = 1;
                return;
            }
            dv->busy = 1;
            dv->used = 1;
            dv->batch_id = a[i].batch_id;
            dv->record = res->nbatches++;
            dv->end_us = b->end_us;
            if (dv->cap_ids < a[i].count) {
                dv->cap_ids = a[i].count;
                dv->ids = sq_xrealloc(dv->ids, sizeof(uint64_t) * (size_t)dv->cap_ids);
            }
            memcpy(dv->ids, a[i].ids, sizeof(uint64_t) * (size_t)a[i].count);
            dv->nids = a[i].count;
            for (int k = 0; k < a[i].count; k++)
                res->requests[a[i].ids[k]].sent_us = a[i].at_us;
            res->busy_us += (double)(b->end_us - b->start_us);
            cheap_push(&r->done, (completion_t){.end_us = b->end_us, .device = a[i].worker});
        }
    }
    for (size_t k = 0; k < r->nkill; k++)
        kill_query(r, r->kill[k], SIM_DROPPED, last_at);
    r->nkill = 0;
}

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

/* ---- pipelines ---- */

/* Items for one parent item: Poisson with mean `mean` (Knuth's product of
 * uniforms, in parts of at most 30 so that exp(-part) stays well inside a
 * double; a sum of Poissons is Poisson), or mean rounded stochastically. */
static int draw_items(sim_rng_t *g, double mean, wl_gamma_dist_t dist)
{
    if (!(mean > 0))
        return 0;
    if (dist == WL_GAMMA_FIXED) {
        double f = floor(mean);
        return (int)f + (sim_rng_unit(g) < mean - f);
    }
    int n = 0;
    while (mean > 0) {
        double part = mean > 30 ? 30 : mean;
        mean -= part;
        double lim = exp(-part), prod = sim_rng_unit(g);
        while (prod > lim) {
            n++;
            prod *= sim_rng_unit(g);
        }
    }
    return n;
}

/* n new items of query q at stage, ready now (a root, or the items one
 * parent fanned out to: squishd's crops of one detection, cut together and
 * handed to the dispatcher as one clump, pl_dispatch_requests): their
 * deadline is the query's arrival plus the budgets up to their stage. */
static void item_push(run_t *r, int q, int stage, int64_t now, int n)
{
    sim_result_t *res = r->res;
    sim_query_t *qq = &res->queries[q];
    int sess = res->pipelines[qq->pipeline].first_session + stage;
    int64_t deadline = qq->arrival_us + r->stages[qq->pipeline][stage].cum_us;
    if (n < 1)
        return;
    if (n > r->cap_clump) {
        r->cap_clump = n > 2 * r->cap_clump ? n : 2 * r->cap_clump;
        r->clump = sq_xrealloc(r->clump, sizeof(*r->clump) * (size_t)r->cap_clump);
    }
    for (int k = 0; k < n; k++) {
        if (res->nrequests == r->cap_requests) {
            r->cap_requests = r->cap_requests ? 2 * r->cap_requests : 4096;
            res->requests = sq_xrealloc(res->requests, sizeof(*res->requests) * r->cap_requests);
            r->inext = sq_xrealloc(r->inext, sizeof(long) * r->cap_requests);
        }
        size_t id = res->nrequests++;
        res->requests[id] = (sim_request_t){.session = sess,
                                            .arrival_us = now,
                                            .deadline_us = deadline,
                                            .sent_us = -1,
                                            .finish_us = -1,
                                            .query = q,
                                            .stage = stage};
        r->inext[id] = r->qhead[q];
        r->qhead[q] = (long)id;
        r->clump[k] = (pl_request_t){.id = id, .arrival_us = now, .deadline_us = deadline};
    }
    r->pend[r->qoff[q] + (size_t)stage] += n;
    r->created[r->qoff[q] + (size_t)stage] += (size_t)n;
    qq->items += (size_t)n;
    if (r->loop != NULL)
        pl_loop_stage_arrivals(r->loop, qq->pipeline, stage, r->w->pipelines[qq->pipeline].slo_ms,
                               r->ss[sess].model, n);
    pl_dispatch_requests(r->d, now, sess, r->clump, n);
}

/* Drops query q at now (outcome SIM_DROPPED or SIM_LATE): its queued items
 * leave their queues at once; those running finish, and start nothing. */
static void kill_query(run_t *r, int q, int outcome, int64_t now)
{
    sim_query_t *qq = &r->res->queries[q];
    if (qq->outcome != SIM_PENDING)
        return;
    qq->outcome = outcome;
    qq->finish_us = now;
    for (long id = r->qhead[q]; id >= 0; id = r->inext[id]) {
        sim_request_t *it = &r->res->requests[id];
        if (it->outcome != SIM_PENDING || it->sent_us >= 0)
            continue;
        if (pl_dispatch_cancel(r->d, now, it->session, (uint64_t)id) == 0) {
            it->outcome = SIM_DROPPED;
            it->reason = SIM_REASON_QUERY;
            it->finish_us = now;
            r->res->dropped++;
            r->pend[r->qoff[q] + (size_t)it->stage]--;
        }
    }
}

/* Moves query q on at now: a stage fires (gets every item it will get)
 * once its parents are complete (a join draws its items then, from its
 * busiest input), and is complete once fired with nothing pending; the
 * query is good when every stage is complete. */
static void settle(run_t *r, int q, int64_t now)
{
    sim_result_t *res = r->res;
    sim_query_t *qq = &res->queries[q];
    if (qq->outcome != SIM_PENDING)
        return;
    const wl_pipeline_t *pl = &r->w->pipelines[qq->pipeline];
    sim_pipeline_result_t *pr = &res->pipelines[qq->pipeline];
    size_t off = r->qoff[q];
    int all = 1;
    for (int v = 0; v < pl->nstages; v++) {
        const wl_stage_t *st = &pl->stages[v];
        if (!r->fired[off + v]) {
            int ready = 1;
            for (int k = 0; k < st->nafter; k++)
                ready &= r->complete[off + (size_t)st->after[k]];
            if (ready) {
                r->fired[off + v] = 1;
                if (st->nafter > 1) {
                    double mean = -1, base = 0;
                    for (int k = 0; k < st->nafter; k++) {
                        double n = (double)r->created[off + (size_t)st->after[k]];
                        if (n * st->gamma[k] > mean) {
                            mean = n * st->gamma[k];
                            base = n;
                        }
                    }
                    int n = draw_items(&r->qrng[q], mean, st->gamma_dist);
                    pr->drawn[v] += n;
                    pr->parents[v] += base;
                    item_push(r, q, v, now, n);
                }
            }
        }
        r->complete[off + v] = r->fired[off + v] && r->pend[off + v] == 0;
        all &= r->complete[off + v];
    }
    if (all) {
        qq->outcome = now <= qq->deadline_us ? SIM_OK : SIM_LATE;
        qq->finish_us = now;
    }
}

/* Item id (of a query) finished at now with its outcome set: a late one
 * drops its query; an item on time draws its children's items. */
static void item_done(run_t *r, size_t id, int64_t now)
{
    sim_result_t *res = r->res;
    int q = res->requests[id].query, stage = res->requests[id].stage;
    int ok = res->requests[id].outcome == SIM_OK;
    r->pend[r->qoff[q] + (size_t)stage]--;
    if (res->queries[q].outcome != SIM_PENDING)
        return; /* its query is gone: it started before, it starts nothing */
    if (!ok) {
        kill_query(r, q, SIM_LATE, now);
        return;
    }
    int p = res->queries[q].pipeline;
    const wl_pipeline_t *pl = &r->w->pipelines[p];
    const sim_stage_t *sv = &r->stages[p][stage];
    for (int i = 0; i < sv->nchildren; i++) {
        int c = sv->children[i];
        if (pl->stages[c].nafter != 1)
            continue; /* a join draws when all its inputs are in */
        int n = draw_items(&r->qrng[q], pl->stages[c].gamma[0], pl->stages[c].gamma_dist);
        res->pipelines[p].drawn[c] += n;
        res->pipelines[p].parents[c] += 1;
        item_push(r, q, c, now, n);
    }
    settle(r, q, now);
}

/* Session s's rate at t_s: its segment's for segment arrivals, else its
 * mean (rate_rps); a stage's, its pipeline's times the stage's fan-out.
 * Times are not scaled, rates are. */
static double rate_at(const sim_sess_t *ws, double t_s)
{
    const wl_arrivals_t *a = ws->arrivals;
    double f = ws->arrivals_rate > 0 ? ws->rate_rps / ws->arrivals_rate : 0;
    if (a->process == WL_ARRIVALS_NONE || a->process == WL_ARRIVALS_TIMES)
        return ws->rate_rps;
    double start = 0;
    for (int k = 0; k < a->nsegments; k++) {
        start += a->segments[k].duration_s;
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
static int plan_at(run_t *r, int64_t now)
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
static int setup_routes(run_t *r, int *ndevices)
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
            (r->o->epoch_s > 0 ? rate_at(&r->ss[s], 0) : r->ss[s].rate_rps) * r->o->rate_scale;
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
    return plan_at(r, 0);
}

static int dbl_less(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The steps (sim_step_t): cut [0, horizon] at every session's segment
 * boundaries; count each step's requests by arrival, its devices' batch
 * time, and the most devices a plan in force used. */
static void fill_steps(const run_t *r, sim_result_t *res)
{
    int cap = 2;
    for (int s = 0; s < r->nss; s++)
        if (r->ss[s].arrivals->process != WL_ARRIVALS_NONE &&
            r->ss[s].arrivals->process != WL_ARRIVALS_TIMES)
            cap += r->ss[s].arrivals->nsegments;
    double *cut = sq_xmalloc(sizeof(double) * (size_t)cap);
    int nc = 0;
    cut[nc++] = 0;
    cut[nc++] = res->horizon_s;
    for (int s = 0; s < r->nss; s++) {
        const wl_arrivals_t *a = r->ss[s].arrivals;
        if (a->process == WL_ARRIVALS_NONE || a->process == WL_ARRIVALS_TIMES)
            continue;
        double t = 0;
        for (int k = 0; k < a->nsegments; k++) {
            t += a->segments[k].duration_s;
            if (t < res->horizon_s)
                cut[nc++] = t;
        }
    }
    qsort(cut, (size_t)nc, sizeof(double), dbl_less);
    res->steps = sq_xcalloc((size_t)nc, sizeof(*res->steps));
    for (int i = 1; i < nc; i++) {
        if (cut[i] <= cut[i - 1])
            continue;
        sim_step_t *st = &res->steps[res->nsteps++];
        st->start_s = cut[i - 1];
        st->end_s = cut[i];
        st->busy_fraction = sq_xcalloc((size_t)(res->ndevices ? res->ndevices : 1), sizeof(double));
    }
    free(cut);
    for (size_t i = 0; i < res->nrequests; i++) {
        const sim_request_t *q = &res->requests[i];
        double t = (double)q->arrival_us / 1e6;
        for (int k = 0; k < res->nsteps; k++) {
            sim_step_t *st = &res->steps[k];
            if (t < st->start_s || (t >= st->end_s && k < res->nsteps - 1))
                continue;
            st->requests++;
            st->ok += q->outcome == SIM_OK;
            st->dropped += q->outcome == SIM_DROPPED;
            st->late += q->outcome == SIM_LATE;
            break;
        }
    }
    for (int k = 0; k < res->nsteps; k++) {
        sim_step_t *st = &res->steps[k];
        int64_t a = llround(st->start_s * 1e6), b = llround(st->end_s * 1e6);
        for (size_t i = 0; i < res->nbatches; i++) {
            const sim_batch_t *bt = &res->batches[i];
            int64_t lo = bt->start_us > a ? bt->start_us : a;
            int64_t hi = bt->end_us < b ? bt->end_us : b;
            if (hi > lo && bt->device >= 0 && bt->device < res->ndevices)
                st->busy_fraction[bt->device] += (double)(hi - lo);
        }
        for (int d = 0; d < res->ndevices; d++)
            st->busy_fraction[d] /= (double)(b - a);
        for (int p = 0; p < r->nplans; p++) {
            int in_force = r->plan_at_us[p] < b && (p + 1 == r->nplans || r->plan_at_us[p + 1] > a);
            if (in_force && r->plan_devices[p] > st->planned_devices)
                st->planned_devices = r->plan_devices[p];
        }
    }
}

double sim_step_ok_fraction(const sim_step_t *step)
{
    return step->requests ? (double)step->ok / (double)step->requests : 1;
}

/* The dispatcher sessions (run_t.ss): the workload's sessions, then one
 * per pipeline stage at the split's budget and rate, and the pipelines'
 * stage tables. Returns 0 or the split's error. */
static int setup_sessions(run_t *r)
{
    const wl_workload_t *w = r->w;
    sim_result_t *res = r->res;
    int nstages = 0;
    for (int p = 0; p < w->npipelines; p++)
        nstages += w->pipelines[p].nstages;
    r->nss = w->nsessions + nstages;
    r->ss = sq_xcalloc((size_t)r->nss + 1, sizeof(*r->ss));
    for (int s = 0; s < w->nsessions; s++)
        r->ss[s] = (sim_sess_t){.model = w->sessions[s].model,
                                .slo_us = w->sessions[s].slo_ms * 1000,
                                .rate_rps = w->sessions[s].rate_rps,
                                .arrivals = &w->sessions[s].arrivals,
                                .arrivals_rate = w->sessions[s].rate_rps,
                                .pipeline = -1,
                                .stage = -1};
    if (w->npipelines == 0)
        return 0;
    int rc = 0;
    res->npipelines = w->npipelines;
    res->pipelines = sq_xcalloc((size_t)w->npipelines, sizeof(*res->pipelines));
    r->stages = sq_xcalloc((size_t)w->npipelines, sizeof(*r->stages));
    int next = w->nsessions;
    for (int p = 0; p < w->npipelines && rc == 0; p++) {
        const wl_pipeline_t *pl = &w->pipelines[p];
        sim_pipeline_result_t *pr = &res->pipelines[p];
        /* squishd's split (pl_loop_split): the DP with its step and rate
         * floor, the slack shared; the devices here have no overhead. The
         * declared gammas and rate are what squishd would measure; the
         * split does not move with the rate (every stage's cost scales
         * with it), so one split serves the whole run. */
        pl_stage_t *pst = sq_xcalloc((size_t)pl->nstages, sizeof(*pst));
        for (int k = 0; k < pl->nstages; k++)
            pst[k] = (pl_stage_t){.profile = &w->models[pl->stages[k].model].profile,
                                  .nparents = pl->stages[k].nafter,
                                  .parents = pl->stages[k].after,
                                  .gamma = pl->stages[k].gamma};
        pl_loop_split_in_t in = {.stages = pst,
                                 .nstages = pl->nstages,
                                 .slo_us = pl->slo_ms * 1000.0,
                                 .rate_qps = pl->rate_rps,
                                 .epsilon_us = w->query_epsilon_ms * 1000.0,
                                 .k_std = w->k_std,
                                 .even = r->o->split == WL_SPLIT_EVEN};
        double *budget = sq_xcalloc((size_t)pl->nstages, sizeof(double));
        pl_loop_split_why_t why;
        int missing;
        pl_query_result_t split;
        rc = pl_loop_split(&in, budget, &why, &missing, &split);
        free(budget);
        free(pst);
        if (rc < 0)
            break;
        pr->nstages = pl->nstages;
        pr->first_session = next;
        pr->cost_devices = split.cost_devices;
        pr->budget_us = sq_xcalloc((size_t)pl->nstages, sizeof(double));
        pr->rate_rps = sq_xcalloc((size_t)pl->nstages, sizeof(double));
        pr->drawn = sq_xcalloc((size_t)pl->nstages, sizeof(double));
        pr->parents = sq_xcalloc((size_t)pl->nstages, sizeof(double));
        r->stages[p] = sq_xcalloc((size_t)pl->nstages, sizeof(sim_stage_t));
        for (int k = 0; k < pl->nstages; k++) {
            const wl_stage_t *st = &pl->stages[k];
            sim_stage_t *sk = &r->stages[p][k];
            pr->budget_us[k] = split.budget_us[k];
            /* The split's rates are at the DP's floor of a query a second. */
            pr->rate_rps[k] = split.rate_rps[k] * pl->rate_rps / fmax(pl->rate_rps, 1);
            int64_t up = 0;
            for (int j = 0; j < st->nafter; j++) {
                sim_stage_t *par = &r->stages[p][st->after[j]];
                if (par->cum_us > up)
                    up = par->cum_us;
                par->children =
                    sq_xrealloc(par->children, sizeof(int) * (size_t)(par->nchildren + 1));
                par->children[par->nchildren++] = k;
            }
            /* Whole µs, rounded down: the path's deadlines stay within the SLO. */
            sk->cum_us = up + (int64_t)floor(pr->budget_us[k] + 1e-6);
            r->ss[next++] = (sim_sess_t){.model = st->model,
                                         .slo_us = pr->budget_us[k],
                                         .rate_rps = pr->rate_rps[k],
                                         .arrivals = &pl->arrivals,
                                         .arrivals_rate = pl->rate_rps,
                                         .pipeline = p,
                                         .stage = k};
        }
        pl_query_result_dispose(&split);
    }
    return rc;
}

int sim_run(const wl_workload_t *w, const sim_opts_t *o, sim_result_t *res)
{
    memset(res, 0, sizeof(*res));
    res->overlap_batch = -1;
    unsigned long long seed = o->seed_given ? o->seed : w->seed;
    run_t r = {.w = w, .o = o, .res = res, .timer_us = PL_NEVER};
    int rc = 0;
    arrivals_t arr = {0}, qarr = {0};

    if ((rc = setup_sessions(&r)) < 0)
        goto out;
    res->nsessions = r.nss;
    res->session_model = sq_xcalloc((size_t)r.nss + 1, sizeof(int));
    for (int s = 0; s < r.nss; s++)
        res->session_model[s] = r.ss[s].model;

    double horizon = 0;
    for (int s = 0; s < w->nsessions; s++) {
        double span =
            gen_arrivals(&arr, &w->sessions[s].arrivals, w->sessions[s].rate_rps, s, seed, o);
        if (span > horizon)
            horizon = span;
    }
    if (arr.n)
        qsort(arr.v, arr.n, sizeof(*arr.v), arrival_cmp);
    /* Pipeline queries: their own streams, seeded past the sessions'. */
    for (int p = 0; p < w->npipelines; p++) {
        double span = gen_arrivals(&qarr, &w->pipelines[p].arrivals, w->pipelines[p].rate_rps,
                                   w->nsessions + p, seed, o);
        if (span > horizon)
            horizon = span;
    }
    if (qarr.n)
        qsort(qarr.v, qarr.n, sizeof(*qarr.v), arrival_cmp);
    res->horizon_s = horizon;
    res->nrequests = arr.n;
    r.cap_requests = arr.n ? arr.n : 1;
    if (qarr.n)
        r.cap_requests += 4 * qarr.n;
    res->requests = sq_xcalloc(r.cap_requests, sizeof(*res->requests));
    r.inext = sq_xcalloc(r.cap_requests, sizeof(long));
    for (size_t i = 0; i < arr.n; i++) {
        const wl_session_t *ws = &w->sessions[arr.v[i].session];
        res->requests[i] =
            (sim_request_t){.session = arr.v[i].session,
                            .arrival_us = arr.v[i].at_us,
                            .deadline_us = arr.v[i].at_us + llround(ws->slo_ms * 1000),
                            .sent_us = -1,
                            .finish_us = -1,
                            .query = -1,
                            .stage = -1};
    }
    res->nqueries = qarr.n;
    res->queries = sq_xcalloc(qarr.n + 1, sizeof(*res->queries));
    r.qoff = sq_xcalloc(qarr.n + 1, sizeof(size_t));
    r.qhead = sq_xcalloc(qarr.n + 1, sizeof(long));
    r.qrng = sq_xcalloc(qarr.n + 1, sizeof(sim_rng_t));
    size_t nstate = 0;
    for (size_t i = 0; i < qarr.n; i++) {
        int p = qarr.v[i].session - w->nsessions; /* gen_arrivals' idx */
        res->queries[i] =
            (sim_query_t){.pipeline = p,
                          .arrival_us = qarr.v[i].at_us,
                          .deadline_us = qarr.v[i].at_us + llround(w->pipelines[p].slo_ms * 1000),
                          .finish_us = -1,
                          .outcome = SIM_PENDING};
        r.qoff[i] = nstate;
        nstate += (size_t)w->pipelines[p].nstages;
        r.qhead[i] = -1;
        /* A query's fan-outs depend on the query (its pipeline and its
         * place in the pipeline's stream), not on the order things finish:
         * a higher scale replays the same queries. */
        uint64_t mix = seed ^ (0x9e6c63d0676a9a99ULL * (uint64_t)(p + 1)) ^
                       (0xd1b54a32d192ed03ULL * (uint64_t)(qarr.v[i].seq + 1));
        sim_rng_seed(&r.qrng[i], sim_splitmix64(&mix));
    }
    r.pend = sq_xcalloc(nstate + 1, sizeof(int));
    r.created = sq_xcalloc(nstate + 1, sizeof(size_t));
    r.fired = sq_xcalloc(nstate + 1, 1);
    r.complete = sq_xcalloc(nstate + 1, 1);

    pl_dispatch_opts_t dopts = {.policy = o->policy,
                                .k_std = w->k_std,
                                .net_delay_us = o->net_delay_us,
                                .eager_load = o->eager_load};
    r.d = pl_dispatch_new(&dopts);
    r.exec_us = sq_xcalloc((size_t)r.nss + 1, sizeof(int64_t *));
    r.item_bytes = sq_xcalloc((size_t)r.nss + 1, sizeof(double));
    for (int s = 0; s < r.nss; s++) {
        const pl_profile_t *p = &w->models[r.ss[s].model].profile;
        r.item_bytes[s] = w->models[r.ss[s].model].item_bytes;
        pl_session_cfg_t cfg = {.profile = p,
                                .slo_us = llround(r.ss[s].slo_us),
                                .item_bytes = llround(r.item_bytes[s])};
        if (pl_dispatch_session_add(r.d, &cfg) != s) {
            rc = SQ_INVAL;
            goto out;
        }
        r.exec_us[s] = sq_xcalloc((size_t)p->max_batch + 1, sizeof(int64_t));
        for (int b = 1; b <= p->max_batch; b++)
            r.exec_us[s][b] = (int64_t)ceil(pl_latency_us(p, b, 0));
    }
    if ((rc = setup_routes(&r, &res->ndevices)) < 0)
        goto out;
    /* Devices behind a link: the dispatcher counts it, the devices pay it. */
    for (int k = 0; k < res->ndevices && k < w->ndevice_links; k++) {
        pl_link_t l = w->device_links[k];
        if (!(l.rtt_us > 0) && !(l.bytes_per_us > 0))
            continue;
        r.dev[k].link = l;
        pl_dispatch_worker_net(r.d, 0, k, llround(l.rtt_us), l.bytes_per_us);
    }
    r.done.v = sq_xmalloc(sizeof(completion_t) * (size_t)res->ndevices);
    absorb(&r);
    /* Epochs: the loop's ticks (its rate steps) while arrivals run. */
    int64_t horizon_us = llround(horizon * 1e6);
    r.next_tick_us = r.planning && o->epoch_s > 0 && r.tick_us > 0 && r.tick_us < horizon_us
                         ? r.tick_us
                         : PL_NEVER;

    size_t next = 0, nextq = 0, nsreq = arr.n;
    while (!r.failed) {
        int64_t t_done = r.done.n ? r.done.v[0].end_us : PL_NEVER;
        int64_t t_arr = next < nsreq ? res->requests[next].arrival_us : PL_NEVER;
        int64_t t_q = nextq < res->nqueries ? res->queries[nextq].arrival_us : PL_NEVER;
        int64_t now = t_done < t_arr ? t_done : t_arr;
        if (t_q < now)
            now = t_q;
        if (r.next_tick_us < now)
            now = r.next_tick_us;
        if (r.timer_us < now)
            now = r.timer_us;
        if (now == PL_NEVER)
            break;
        if (t_done == now) {
            completion_t c = cheap_pop(&r.done);
            device_t *dv = &r.dev[c.device];
            for (int k = 0; k < dv->nids; k++) {
                sim_request_t *q = &res->requests[dv->ids[k]];
                q->finish_us = c.end_us;
                q->outcome = c.end_us <= q->deadline_us ? SIM_OK : SIM_LATE;
                if (q->outcome == SIM_OK)
                    res->ok++;
                else
                    res->late++;
            }
            dv->busy = 0;
            int nids = dv->nids;
            dv->nids = 0;
            pl_dispatch_batch_done(r.d, now, c.device, dv->batch_id);
            /* The batch's pipeline items: their children are ready now
             * (item_push may move res->requests). */
            for (int k = 0; k < nids; k++)
                if (res->requests[dv->ids[k]].query >= 0)
                    item_done(&r, (size_t)dv->ids[k], now);
        } else if (t_arr == now) {
            sim_request_t *q = &res->requests[next];
            pl_dispatch_request(r.d, now, next, q->session, q->arrival_us, q->deadline_us);
            if (r.loop != NULL)
                pl_loop_arrivals(r.loop, r.ss[q->session].model, r.ss[q->session].slo_us / 1000.0,
                                 1);
            next++;
        } else if (t_q == now) {
            int q = (int)nextq++;
            const wl_pipeline_t *pl = &w->pipelines[res->queries[q].pipeline];
            sim_pipeline_result_t *pr = &res->pipelines[res->queries[q].pipeline];
            for (int v = 0; v < pl->nstages; v++) {
                if (pl->stages[v].nafter > 0)
                    continue;
                r.fired[r.qoff[q] + (size_t)v] = 1;
                pr->drawn[v] += 1;
                pr->parents[v] += 1;
                item_push(&r, q, v, now, 1);
            }
        } else if (r.next_tick_us == now) {
            /* The loop's ticks run while arrivals do (ties: after
             * completions and arrivals, before the dispatcher's timer). */
            if (pl_loop_advance(r.loop, now) & 1u) {
                if ((rc = plan_at(&r, now)) < 0)
                    goto out;
                res->epochs++;
            }
            r.next_tick_us += r.tick_us;
            if (r.next_tick_us >= horizon_us)
                r.next_tick_us = PL_NEVER;
        } else {
            r.timer_us = PL_NEVER;
            pl_dispatch_timer(r.d, now);
        }
        absorb(&r);
    }
    res->offered_rps = horizon > 0 ? (double)res->nrequests / horizon : 0;
    for (size_t i = 0; i < res->nrequests; i++) {
        const sim_request_t *q = &res->requests[i];
        res->pending += q->outcome == SIM_PENDING;
        if (q->query < 0) {
            res->session_requests++;
            res->session_ok += q->outcome == SIM_OK;
        }
    }
    for (size_t i = 0; i < res->nqueries; i++) {
        const sim_query_t *q = &res->queries[i];
        sim_pipeline_result_t *pr = &res->pipelines[q->pipeline];
        pr->queries++;
        pr->ok += q->outcome == SIM_OK;
        pr->dropped += q->outcome == SIM_DROPPED;
        pr->late += q->outcome == SIM_LATE;
        pr->pending += q->outcome == SIM_PENDING;
    }
    for (int k = 0; k < res->ndevices; k++)
        res->devices_used += r.dev[k].used;
    res->overlap_batch = sim_check_overlap(res->batches, res->nbatches, res->ndevices);
    fill_steps(&r, res);
    if (r.failed && res->overlap_batch < 0)
        res->overlap_batch = (long)res->nbatches - 1;
    if (r.failed)
        rc = SQ_INTERNAL;
out:
    if (r.exec_us)
        for (int s = 0; s < r.nss; s++)
            free(r.exec_us[s]);
    free(r.exec_us);
    free(r.item_bytes);
    if (r.dev)
        for (int k = 0; k < res->ndevices; k++)
            free(r.dev[k].ids);
    free(r.dev);
    free(r.done.v);
    free(arr.v);
    free(qarr.v);
    free(r.plan_at_us);
    free(r.plan_devices);
    if (r.stages)
        for (int p = 0; p < w->npipelines; p++) {
            if (r.stages[p])
                for (int k = 0; k < w->pipelines[p].nstages; k++)
                    free(r.stages[p][k].children);
            free(r.stages[p]);
        }
    free(r.stages);
    free(r.ss);
    free(r.qoff);
    free(r.pend);
    free(r.created);
    free(r.fired);
    free(r.complete);
    free(r.qhead);
    free(r.inext);
    free(r.qrng);
    free(r.kill);
    free(r.clump);
    pl_loop_free(r.loop);
    pl_dispatch_free(r.d);
    return rc;
}

void sim_result_dispose(sim_result_t *res)
{
    if (res == NULL)
        return;
    free(res->requests);
    free(res->batches);
    for (int k = 0; k < res->nsteps; k++)
        free(res->steps[k].busy_fraction);
    free(res->steps);
    free(res->session_model);
    free(res->queries);
    for (int p = 0; p < res->npipelines; p++) {
        free(res->pipelines[p].budget_us);
        free(res->pipelines[p].rate_rps);
        free(res->pipelines[p].drawn);
        free(res->pipelines[p].parents);
    }
    free(res->pipelines);
    res->requests = NULL;
    res->batches = NULL;
    res->steps = NULL;
    res->nsteps = 0;
    res->session_model = NULL;
    res->queries = NULL;
    res->pipelines = NULL;
    res->npipelines = 0;
}

double sim_ok_fraction(const sim_result_t *res)
{
    if (res->npipelines == 0)
        return res->nrequests ? (double)res->ok / (double)res->nrequests : 1;
    double f = res->session_requests ? (double)res->session_ok / (double)res->session_requests : 1;
    for (int p = 0; p < res->npipelines; p++) {
        const sim_pipeline_result_t *pr = &res->pipelines[p];
        double g = pr->queries ? (double)pr->ok / (double)pr->queries : 1;
        if (g < f)
            f = g;
    }
    return f;
}

int sim_search_goodput(const wl_workload_t *w, const sim_opts_t *opts, double target, double *scale,
                       int *runs, sim_result_t *res)
{
    sim_opts_t o = *opts;
    double base = opts->rate_scale > 0 ? opts->rate_scale : 1;
    double lo = 0, hi = 0;
    int n = 0, rc;
    sim_result_t tmp;
    /* Bracket: double (or halve) until the verdict flips. */
    o.rate_scale = base;
    if ((rc = sim_run(w, &o, &tmp)) < 0)
        goto fail;
    n++;
    int ok = sim_ok_fraction(&tmp) >= target;
    sim_result_dispose(&tmp);
    if (ok) {
        lo = base;
        for (double s = base * 2; s <= base * 1024; s *= 2) {
            o.rate_scale = s;
            if ((rc = sim_run(w, &o, &tmp)) < 0)
                goto fail;
            n++;
            ok = sim_ok_fraction(&tmp) >= target;
            sim_result_dispose(&tmp);
            if (!ok) {
                hi = s;
                break;
            }
            lo = s;
        }
        if (hi == 0)
            hi = lo; /* never saturates within 1024x: report that */
    } else {
        hi = base;
        for (double s = base / 2; s >= base / 1024; s /= 2) {
            o.rate_scale = s;
            if ((rc = sim_run(w, &o, &tmp)) < 0)
                goto fail;
            n++;
            ok = sim_ok_fraction(&tmp) >= target;
            sim_result_dispose(&tmp);
            if (ok) {
                lo = s;
                break;
            }
            hi = s;
        }
    }
    while (lo > 0 && hi > lo && (hi - lo) / hi > 0.002) {
        o.rate_scale = (lo + hi) / 2;
        if ((rc = sim_run(w, &o, &tmp)) < 0)
            goto fail;
        n++;
        if (sim_ok_fraction(&tmp) >= target)
            lo = o.rate_scale;
        else
            hi = o.rate_scale;
        sim_result_dispose(&tmp);
    }
    *scale = lo;
    *runs = n;
    if (lo <= 0) {
        memset(res, 0, sizeof(*res));
        res->overlap_batch = -1;
        return 0;
    }
    o.rate_scale = lo;
    rc = sim_run(w, &o, res);
    (*runs)++;
    return rc;
fail:
    sim_result_dispose(&tmp);
    memset(res, 0, sizeof(*res));
    return rc;
}

/* ---- checker ---- */

typedef struct {
    int device;
    int64_t start_us, end_us;
    size_t index;
} span_t;

static int span_cmp(const void *x, const void *y)
{
    const span_t *a = x, *b = y;
    if (a->device != b->device)
        return a->device < b->device ? -1 : 1;
    if (a->start_us != b->start_us)
        return a->start_us < b->start_us ? -1 : 1;
    return (a->index > b->index) - (a->index < b->index);
}

long sim_check_overlap(const sim_batch_t *batches, size_t nbatches, int ndevices)
{
    if (nbatches == 0)
        return -1;
    span_t *s = sq_xmalloc(sizeof(*s) * nbatches);
    for (size_t i = 0; i < nbatches; i++)
        s[i] = (span_t){.device = batches[i].device,
                        .start_us = batches[i].start_us,
                        .end_us = batches[i].end_us,
                        .index = i};
    qsort(s, nbatches, sizeof(*s), span_cmp);
    long bad = -1;
    for (size_t i = 0; i < nbatches && bad < 0; i++) {
        if (s[i].device < 0 || s[i].device >= ndevices || s[i].end_us < s[i].start_us)
            bad = (long)s[i].index;
        else if (i > 0 && s[i].device == s[i - 1].device && s[i].start_us < s[i - 1].end_us)
            bad = (long)s[i].index;
    }
    free(s);
    return bad;
}

/* ---- summary ---- */

static json_t *num(double x)
{
    /* Three decimals: µs resolution on ms values, and stable text. */
    return json_real(round(x * 1000) / 1000);
}

static int dbl_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static const char *reason_name(int reason)
{
    return reason == SIM_REASON_QUERY ? "query_dropped" : sq_err_name(reason);
}

static const char *outcome_name(int o)
{
    switch (o) {
    case SIM_OK:
        return "ok";
    case SIM_LATE:
        return "late";
    case SIM_DROPPED:
        return "dropped";
    default:
        return "pending";
    }
}

char *sim_summary_json(const wl_workload_t *w, const sim_opts_t *opts, const sim_result_t *res,
                       double search_scale, int search_runs, int dump)
{
    json_t *root = json_object();
    double horizon = res->horizon_s > 0 ? res->horizon_s : 1;
    size_t bad = res->dropped + res->late + res->pending;
    json_object_set_new(root, "policy", json_string(pl_policy_name(opts->policy)));
    json_object_set_new(root, "seed",
                        json_integer((json_int_t)(opts->seed_given ? opts->seed : w->seed)));
    json_object_set_new(root, "devices", json_integer(res->ndevices));
    json_object_set_new(root, "rate_scale",
                        num(search_scale > 0 ? search_scale : opts->rate_scale));
    json_object_set_new(root, "horizon_s", num(res->horizon_s));
    json_object_set_new(root, "request_count", json_integer((json_int_t)res->nrequests));
    json_object_set_new(root, "offered_rps", num(res->offered_rps));
    double goodput = search_scale > 0 ? res->offered_rps : (double)res->ok / horizon;
    json_object_set_new(root, "goodput_rps", num(goodput));
    json_object_set_new(root, "bad_rate",
                        num(res->nrequests ? (double)bad / (double)res->nrequests : 0));
    json_object_set_new(root, "ok", json_integer((json_int_t)res->ok));
    json_object_set_new(root, "dropped", json_integer((json_int_t)res->dropped));
    json_object_set_new(root, "late", json_integer((json_int_t)res->late));
    json_object_set_new(root, "pending", json_integer((json_int_t)res->pending));
    double span_us = res->horizon_s * 1e6;
    for (size_t i = 0; i < res->nbatches; i++)
        if ((double)res->batches[i].end_us > span_us)
            span_us = (double)res->batches[i].end_us;
    json_object_set_new(
        root, "devices_busy_fraction",
        num(span_us > 0 && res->ndevices > 0 ? res->busy_us / (span_us * res->ndevices) : 0));
    json_object_set_new(root, "devices_used", json_integer(res->devices_used));
    if (res->planned_devices > 0)
        json_object_set_new(root, "planned_devices", json_integer(res->planned_devices));
    json_object_set_new(root, "unplaced_sessions", json_integer(res->unplaced_sessions));
    json_object_set_new(root, "batch_count", json_integer((json_int_t)res->nbatches));
    if (opts->epoch_s > 0)
        json_object_set_new(root, "epochs", json_integer(res->epochs));
    if (res->nsteps > 1 || opts->epoch_s > 0) {
        json_t *steps = json_array();
        for (int k = 0; k < res->nsteps; k++) {
            const sim_step_t *st = &res->steps[k];
            json_t *busy = json_array();
            for (int d = 0; d < res->ndevices; d++)
                json_array_append_new(busy, num(st->busy_fraction[d]));
            json_t *so =
                json_pack("{s:o, s:o, s:I, s:o, s:I, s:I, s:o}", "start_s", num(st->start_s),
                          "end_s", num(st->end_s), "requests", (json_int_t)st->requests,
                          "ok_fraction", json_real(round(sim_step_ok_fraction(st) * 1e6) / 1e6),
                          "dropped", (json_int_t)st->dropped, "late", (json_int_t)st->late,
                          "device_busy_fraction", busy);
            if (st->planned_devices > 0)
                json_object_set_new(so, "planned_devices", json_integer(st->planned_devices));
            json_array_append_new(steps, so);
        }
        json_object_set_new(root, "steps", steps);
    }
    json_object_set_new(root, "overlap_batch", json_integer(res->overlap_batch));
    if (search_scale > 0)
        json_object_set_new(root, "search",
                            json_pack("{s:f, s:i, s:f}", "target_ok_fraction", 0.99, "runs",
                                      search_runs, "ok_fraction", sim_ok_fraction(res)));

    json_t *reasons = json_object();
    for (size_t i = 0; i < res->nrequests; i++) {
        if (res->requests[i].outcome != SIM_DROPPED)
            continue;
        const char *name = reason_name(res->requests[i].reason);
        json_t *c = json_object_get(reasons, name);
        json_object_set_new(reasons, name, json_integer(c ? json_integer_value(c) + 1 : 1));
    }
    json_object_set_new(root, "drop_reasons", reasons);

    /* Per model: sessions of one model add up. */
    json_t *models = json_array();
    int nm = w->nmodels;
    size_t *req = sq_xcalloc((size_t)nm, sizeof(size_t)),
           *okc = sq_xcalloc((size_t)nm, sizeof(size_t));
    size_t *nb = sq_xcalloc((size_t)nm, sizeof(size_t)),
           *items = sq_xcalloc((size_t)nm, sizeof(size_t));
    size_t *drp = sq_xcalloc((size_t)nm, sizeof(size_t)),
           *lat = sq_xcalloc((size_t)nm, sizeof(size_t));
    for (size_t i = 0; i < res->nrequests; i++) {
        int m = res->session_model[res->requests[i].session];
        req[m]++;
        okc[m] += res->requests[i].outcome == SIM_OK;
        drp[m] += res->requests[i].outcome == SIM_DROPPED;
        lat[m] += res->requests[i].outcome == SIM_LATE;
    }
    for (size_t i = 0; i < res->nbatches; i++) {
        int m = res->session_model[res->batches[i].session];
        nb[m]++;
        items[m] += (size_t)res->batches[i].size;
    }
    double *qd = sq_xmalloc(sizeof(double) * (res->nrequests ? res->nrequests : 1));
    for (int m = 0; m < nm; m++) {
        int has = 0;
        for (int s = 0; s < res->nsessions; s++)
            has |= res->session_model[s] == m;
        if (!has)
            continue;
        size_t nq = 0;
        for (size_t i = 0; i < res->nrequests; i++)
            if (res->session_model[res->requests[i].session] == m && res->requests[i].sent_us >= 0)
                qd[nq++] = (double)(res->requests[i].sent_us - res->requests[i].arrival_us) / 1000;
        qsort(qd, nq, sizeof(double), dbl_cmp);
        double p99 = nq ? qd[(size_t)ceil(0.99 * (double)nq) - 1] : 0;
        /* Latency of the answered requests (in time or late): arrival to
         * the end of their batch. */
        size_t na = 0;
        for (size_t i = 0; i < res->nrequests; i++)
            if (res->session_model[res->requests[i].session] == m &&
                res->requests[i].outcome != SIM_DROPPED && res->requests[i].sent_us >= 0)
                qd[na++] =
                    (double)(res->requests[i].finish_us - res->requests[i].arrival_us) / 1000;
        qsort(qd, na, sizeof(double), dbl_cmp);
        double l50 = na ? qd[(size_t)ceil(0.50 * (double)na) - 1] : 0;
        double l99 = na ? qd[(size_t)ceil(0.99 * (double)na) - 1] : 0;
        json_t *mo = json_object();
        json_object_set_new(mo, "name", json_string(w->models[m].name));
        json_object_set_new(mo, "requests", json_integer((json_int_t)req[m]));
        json_object_set_new(mo, "offered_rps", num((double)req[m] / horizon));
        json_object_set_new(mo, "goodput_rps", num((double)okc[m] / horizon));
        json_object_set_new(mo, "bad_rate",
                            num(req[m] ? (double)(req[m] - okc[m]) / (double)req[m] : 0));
        json_object_set_new(mo, "dropped", json_integer((json_int_t)drp[m]));
        json_object_set_new(mo, "late", json_integer((json_int_t)lat[m]));
        json_object_set_new(mo, "batches", json_integer((json_int_t)nb[m]));
        json_object_set_new(mo, "batch_size_mean",
                            num(nb[m] ? (double)items[m] / (double)nb[m] : 0));
        json_object_set_new(mo, "queue_ms_p99", num(p99));
        json_object_set_new(mo, "latency_ms_p50", num(l50));
        json_object_set_new(mo, "latency_ms_p99", num(l99));
        json_array_append_new(models, mo);
    }
    free(qd);
    free(req);
    free(okc);
    free(nb);
    free(items);
    free(drp);
    free(lat);
    json_object_set_new(root, "models", models);

    /* Batch size distribution over all batches. */
    json_t *hist = json_object();
    for (size_t i = 0; i < res->nbatches; i++) {
        char key[16];
        snprintf(key, sizeof(key), "%d", res->batches[i].size);
        json_t *c = json_object_get(hist, key);
        json_object_set_new(hist, key, json_integer(c ? json_integer_value(c) + 1 : 1));
    }
    json_object_set_new(root, "batch_sizes", hist);

    if (res->npipelines > 0) {
        json_t *pls = json_array();
        double *ql = sq_xmalloc(sizeof(double) * (res->nqueries ? res->nqueries : 1));
        for (int p = 0; p < res->npipelines; p++) {
            const wl_pipeline_t *pl = &w->pipelines[p];
            const sim_pipeline_result_t *pr = &res->pipelines[p];
            double offered = (double)pr->queries / horizon;
            size_t qbad = pr->dropped + pr->late + pr->pending;
            json_t *po = json_object();
            json_object_set_new(po, "name", json_string(pl->name));
            json_object_set_new(po, "split",
                                json_string(opts->split == WL_SPLIT_EVEN ? "even" : "dp"));
            json_object_set_new(po, "queries", json_integer((json_int_t)pr->queries));
            json_object_set_new(po, "offered_qps", num(offered));
            json_object_set_new(po, "goodput_qps",
                                num(search_scale > 0 ? offered : (double)pr->ok / horizon));
            json_object_set_new(po, "bad_rate",
                                num(pr->queries ? (double)qbad / (double)pr->queries : 0));
            json_object_set_new(po, "ok", json_integer((json_int_t)pr->ok));
            json_object_set_new(po, "dropped", json_integer((json_int_t)pr->dropped));
            json_object_set_new(po, "late", json_integer((json_int_t)pr->late));
            json_object_set_new(po, "pending", json_integer((json_int_t)pr->pending));
            json_t *gm = json_object(), *bm = json_object();
            for (int k = 0; k < pl->nstages && k < pr->nstages; k++) {
                if (pl->stages[k].nafter > 0)
                    json_object_set_new(
                        gm, pl->stages[k].id,
                        num(pr->parents[k] > 0 ? pr->drawn[k] / pr->parents[k] : 0));
                json_object_set_new(bm, pl->stages[k].id, num(pr->budget_us[k] / 1000));
            }
            json_object_set_new(po, "gamma_measured", gm);
            json_object_set_new(po, "budgets_ms", bm);
            json_object_set_new(po, "cost_devices", num(pr->cost_devices));
            /* End-to-end latency of the good queries: arrival to their last
             * item done (at low load, what a user waits; near the SLO when
             * items wait to be batched). */
            size_t nl = 0;
            for (size_t i = 0; i < res->nqueries; i++)
                if (res->queries[i].pipeline == p && res->queries[i].outcome == SIM_OK)
                    ql[nl++] =
                        (double)(res->queries[i].finish_us - res->queries[i].arrival_us) / 1000;
            qsort(ql, nl, sizeof(double), dbl_cmp);
            json_object_set_new(po, "latency_ms_p50",
                                num(nl ? ql[(size_t)ceil(0.50 * (double)nl) - 1] : 0));
            json_object_set_new(po, "latency_ms_p99",
                                num(nl ? ql[(size_t)ceil(0.99 * (double)nl) - 1] : 0));
            json_array_append_new(pls, po);
        }
        free(ql);
        json_object_set_new(root, "pipelines", pls);
    }

    if (dump) {
        json_t *rq = json_array();
        for (size_t i = 0; i < res->nrequests; i++) {
            const sim_request_t *q = &res->requests[i];
            json_t *o = json_object();
            json_object_set_new(o, "model",
                                json_string(w->models[res->session_model[q->session]].name));
            json_object_set_new(o, "arrival_ms", num((double)q->arrival_us / 1000));
            json_object_set_new(o, "outcome", json_string(outcome_name(q->outcome)));
            json_object_set_new(o, "finish_ms",
                                q->finish_us >= 0 ? num((double)q->finish_us / 1000) : json_null());
            if (q->outcome == SIM_DROPPED)
                json_object_set_new(o, "reason", json_string(reason_name(q->reason)));
            if (q->query >= 0) {
                const wl_pipeline_t *pl = &w->pipelines[res->queries[q->query].pipeline];
                json_object_set_new(o, "pipeline", json_string(pl->name));
                json_object_set_new(o, "stage", json_string(pl->stages[q->stage].id));
                json_object_set_new(o, "query", json_integer(q->query));
            }
            json_array_append_new(rq, o);
        }
        json_object_set_new(root, "requests", rq);
        json_t *bs = json_array();
        for (size_t i = 0; i < res->nbatches; i++) {
            const sim_batch_t *b = &res->batches[i];
            json_array_append_new(bs,
                                  json_pack("{s:i, s:s, s:o, s:o, s:i}", "device", b->device,
                                            "model", w->models[res->session_model[b->session]].name,
                                            "start_ms", num((double)b->start_us / 1000), "end_ms",
                                            num((double)b->end_us / 1000), "size", b->size));
        }
        json_object_set_new(root, "batches", bs);
    }
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10));
    json_decref(root);
    return text;
}
