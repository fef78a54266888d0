/* squish-sim's pipelines: the dispatcher sessions (the workload's sessions,
 * then one per pipeline stage at squishd's split of the SLO), and each
 * query's life: its roots' items, items drawn per parent (the fan-outs),
 * joins, a query complete, late or dropped with its queued items. Calls no
 * other file of the engine (sim_int.h); the dispatcher core and the
 * planning loop's stage rates. */
#include "sim_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

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
void sim__query_kill(run_t *r, int q, int outcome, int64_t now)
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
void sim__item_done(run_t *r, size_t id, int64_t now)
{
    sim_result_t *res = r->res;
    int q = res->requests[id].query, stage = res->requests[id].stage;
    int ok = res->requests[id].outcome == SIM_OK;
    r->pend[r->qoff[q] + (size_t)stage]--;
    if (res->queries[q].outcome != SIM_PENDING)
        return; /* its query is gone: it started before, it starts nothing */
    if (!ok) {
        sim__query_kill(r, q, SIM_LATE, now);
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

/* The dispatcher sessions (run_t.ss): the workload's sessions, then one
 * per pipeline stage at the split's budget and rate, and the pipelines'
 * stage tables. Returns 0 or the split's error. */
int sim__sessions_setup(run_t *r)
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

/* Query q of the run arrives at now: its roots (the stages with no
 * parent) fire with one item each. */
void sim__query_arrive(run_t *r, int q, int64_t now)
{
    sim_result_t *res = r->res;
    const wl_workload_t *w = r->w;
    const wl_pipeline_t *pl = &w->pipelines[res->queries[q].pipeline];
    sim_pipeline_result_t *pr = &res->pipelines[res->queries[q].pipeline];
    for (int v = 0; v < pl->nstages; v++) {
        if (pl->stages[v].nafter > 0)
            continue;
        r->fired[r->qoff[q] + (size_t)v] = 1;
        pr->drawn[v] += 1;
        pr->parents[v] += 1;
        item_push(r, q, v, now, 1);
    }
}
