/* Complex-query latency split (Nexus section 6.2) for fork-join DAGs.
 *
 * Nexus's DP runs over trees. A fork-join pipeline is a series-parallel
 * DAG: stages in sequence split the budget between them, branches that run
 * side by side each get the whole budget of their span. So the DAG is first
 * reduced to its series-parallel decomposition tree (each stage an edge
 * in -> out, each dependency a free edge, series and parallel reductions
 * until one edge source -> sink is left), then the DP runs bottom-up on that
 * tree over budgets 0, eps, 2 eps, ... L:
 *   stage:     f(t) = min over t' <= t of cost(t')
 *   series:    f(t) = min over t1 of f_a(t1) + f_b(t - t1)
 *   parallel:  f(t) = f_a(t) + f_b(t)
 * which is exact for these DAGs; any root-to-leaf path crosses each series
 * split once, so every path fits the SLO. */
#include "pl.h"

#include <sq.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The series step is O(steps^2) per node: beyond this the DP stops being a
 * planning-time computation. */
#define MAX_STEPS 10000

typedef enum { T_STAGE, T_FREE, T_SERIES, T_PARALLEL } tkind_t;

typedef struct {
    tkind_t kind;
    int stage; /* T_STAGE */
    int a, b;  /* children, T_SERIES / T_PARALLEL */
    double *f; /* f[t], t = 0..steps; INFINITY when infeasible */
    int *arg;  /* series: best t1; stage: best t' */
} tnode_t;

typedef struct {
    int from, to, tree;
    int alive;
} edge_t;

double pl_stage_cost(const pl_profile_t *p, double budget_us, double rate_rps, double k_std)
{
    int b;
    double thr = pl_max_throughput_rps(p, budget_us, k_std, 0, &b);
    if (thr <= 0)
        return -1;
    return rate_rps / thr;
}

/* Of a stage's budget, what its batches get (pl_stage_t.overhead_us). */
static double batch_budget_us(const pl_stage_t *st, double budget_us)
{
    return budget_us - (st->overhead_us > 0 ? st->overhead_us : 0);
}

double pl_stage_cost_in(const pl_stage_t *st, double budget_us, double rate_rps, double k_std)
{
    double usable = batch_budget_us(st, budget_us);
    if (!(usable > 0))
        return -1;
    return pl_stage_cost(st->profile, usable, rate_rps, k_std);
}

double pl_clump_dispersion(double gamma, double gamma_var, double parent_batch)
{
    if (!(gamma > 0) || !(parent_batch > 0))
        return 1;
    double d = gamma_var / gamma + parent_batch * gamma;
    return d > 1 ? d : 1;
}

void pl_query_result_dispose(pl_query_result_t *r)
{
    if (!r)
        return;
    free(r->budget_us);
    free(r->rate_rps);
    free(r->batch);
    memset(r, 0, sizeof(*r));
}

/* Builds the decomposition tree; returns its root or -1 when the DAG is not
 * series-parallel. */
static int decompose(const pl_stage_t *st, int n, tnode_t *tree, int *ntree)
{
    int nchildren_cap = n;
    int *nchildren = sq_xcalloc((size_t)nchildren_cap, sizeof(int));
    int nedges_cap = 3 * n + 2;
    for (int v = 0; v < n; v++)
        nedges_cap += st[v].nparents;
    edge_t *e = sq_xmalloc(sizeof(*e) * (size_t)nedges_cap);
    int ne = 0;
    /* vertices: 0 source, 1 sink, 2 + 2v stage v in, 3 + 2v stage v out */
    for (int v = 0; v < n; v++) {
        tree[*ntree] = (tnode_t){.kind = T_STAGE, .stage = v};
        e[ne++] = (edge_t){2 + 2 * v, 3 + 2 * v, (*ntree)++, 1};
        if (st[v].nparents == 0) {
            tree[*ntree] = (tnode_t){.kind = T_FREE};
            e[ne++] = (edge_t){0, 2 + 2 * v, (*ntree)++, 1};
        }
        for (int k = 0; k < st[v].nparents; k++) {
            int u = st[v].parents[k];
            nchildren[u]++;
            tree[*ntree] = (tnode_t){.kind = T_FREE};
            e[ne++] = (edge_t){3 + 2 * u, 2 + 2 * v, (*ntree)++, 1};
        }
    }
    for (int v = 0; v < n; v++) {
        if (nchildren[v] == 0) {
            tree[*ntree] = (tnode_t){.kind = T_FREE};
            e[ne++] = (edge_t){3 + 2 * v, 1, (*ntree)++, 1};
        }
    }
    int nv = 2 + 2 * n;
    int *indeg = sq_xmalloc(sizeof(int) * (size_t)nv);
    int *outdeg = sq_xmalloc(sizeof(int) * (size_t)nv);
    int alive = ne, changed = 1;
    while (alive > 1 && changed) {
        changed = 0;
        /* parallel reductions */
        for (int i = 0; i < ne; i++) {
            if (!e[i].alive)
                continue;
            for (int j = i + 1; j < ne; j++) {
                if (!e[j].alive || e[j].from != e[i].from || e[j].to != e[i].to)
                    continue;
                tree[*ntree] = (tnode_t){.kind = T_PARALLEL, .a = e[i].tree, .b = e[j].tree};
                e[i].tree = (*ntree)++;
                e[j].alive = 0;
                alive--;
                changed = 1;
            }
        }
        /* series reductions */
        memset(indeg, 0, sizeof(int) * (size_t)nv);
        memset(outdeg, 0, sizeof(int) * (size_t)nv);
        for (int i = 0; i < ne; i++) {
            if (e[i].alive) {
                outdeg[e[i].from]++;
                indeg[e[i].to]++;
            }
        }
        for (int x = 2; x < nv; x++) {
            if (indeg[x] != 1 || outdeg[x] != 1)
                continue;
            int in = -1, out = -1;
            for (int i = 0; i < ne; i++) {
                if (!e[i].alive)
                    continue;
                if (e[i].to == x)
                    in = i;
                if (e[i].from == x)
                    out = i;
            }
            tree[*ntree] = (tnode_t){.kind = T_SERIES, .a = e[in].tree, .b = e[out].tree};
            e[in].tree = (*ntree)++;
            e[in].to = e[out].to;
            e[out].alive = 0;
            alive--;
            indeg[x] = outdeg[x] = 0;
            changed = 1;
        }
    }
    int root = -1;
    if (alive == 1) {
        for (int i = 0; i < ne; i++)
            if (e[i].alive && e[i].from == 0 && e[i].to == 1)
                root = e[i].tree;
    }
    free(indeg);
    free(outdeg);
    free(e);
    free(nchildren);
    return root;
}

static void dp(tnode_t *tree, int node, int steps, double eps_us, const pl_stage_t *st,
               const double *rates, double k_std)
{
    tnode_t *t = &tree[node];
    t->f = sq_xmalloc(sizeof(double) * (size_t)(steps + 1));
    t->arg = sq_xmalloc(sizeof(int) * (size_t)(steps + 1));
    switch (t->kind) {
    case T_FREE:
        for (int i = 0; i <= steps; i++) {
            t->f[i] = 0;
            t->arg[i] = i;
        }
        break;
    case T_STAGE: {
        double best = INFINITY;
        int best_i = 0;
        for (int i = 0; i <= steps; i++) {
            double c = pl_stage_cost_in(&st[t->stage], i * eps_us, rates[t->stage], k_std);
            if (c >= 0 && c <= best) {
                best = c;
                best_i = i;
            }
            t->f[i] = best;
            t->arg[i] = best_i;
        }
        break;
    }
    case T_SERIES: {
        dp(tree, t->a, steps, eps_us, st, rates, k_std);
        dp(tree, t->b, steps, eps_us, st, rates, k_std);
        const double *fa = tree[t->a].f, *fb = tree[t->b].f;
        for (int i = 0; i <= steps; i++) {
            double best = INFINITY;
            int best_j = 0;
            for (int j = 0; j <= i; j++) {
                double c = fa[j] + fb[i - j];
                if (c < best) {
                    best = c;
                    best_j = j;
                }
            }
            t->f[i] = best;
            t->arg[i] = best_j;
        }
        break;
    }
    case T_PARALLEL:
        dp(tree, t->a, steps, eps_us, st, rates, k_std);
        dp(tree, t->b, steps, eps_us, st, rates, k_std);
        for (int i = 0; i <= steps; i++) {
            t->f[i] = tree[t->a].f[i] + tree[t->b].f[i];
            t->arg[i] = i;
        }
        break;
    }
}

static void assign(const tnode_t *tree, int node, int t, int *budget_steps)
{
    const tnode_t *n = &tree[node];
    switch (n->kind) {
    case T_FREE:
        break;
    case T_STAGE:
        /* The whole span when it costs no more than the cheapest budget
         * within it: slack left to a stage is slack for its batches. */
        budget_steps[n->stage] = n->f[t] < n->f[n->arg[t]] ? n->arg[t] : t;
        break;
    case T_SERIES:
        assign(tree, n->a, n->arg[t], budget_steps);
        assign(tree, n->b, t - n->arg[t], budget_steps);
        break;
    case T_PARALLEL:
        assign(tree, n->a, t, budget_steps);
        assign(tree, n->b, t, budget_steps);
        break;
    }
}

/* Parents earlier (a topological order, hence no cycle), gammas >= 0. */
static int stages_valid(const pl_stage_t *stages, int nstages)
{
    if (nstages < 1 || !stages)
        return 0;
    for (int v = 0; v < nstages; v++) {
        if (!stages[v].profile || stages[v].nparents < 0 ||
            (stages[v].nparents > 0 && !stages[v].parents))
            return SQ_INVAL;
        for (int k = 0; k < stages[v].nparents; k++) {
            int u = stages[v].parents[k];
            /* parents earlier: a topological order, hence no cycle */
            if (u < 0 || u >= v || (stages[v].gamma && !(stages[v].gamma[k] >= 0)))
                return 0;
        }
    }
    return 1;
}

/* Stage v's rate: the pipeline rate at a root, else the largest parent
 * rate times that edge's gamma. */
static double *stage_rates(const pl_stage_t *stages, int nstages, double rate_rps)
{
    double *rates = sq_xmalloc(sizeof(double) * (size_t)nstages);
    for (int v = 0; v < nstages; v++) {
        if (stages[v].nparents == 0) {
            rates[v] = rate_rps;
            continue;
        }
        rates[v] = 0;
        for (int k = 0; k < stages[v].nparents; k++) {
            double g = stages[v].gamma ? stages[v].gamma[k] : 1;
            double r = rates[stages[v].parents[k]] * g;
            if (r > rates[v])
                rates[v] = r;
        }
    }
    return rates;
}

/* Fills out's arrays from the budgets; SQ_DEADLINE when a budget holds no
 * batch at all. */
static int fill_result(pl_query_result_t *out, const pl_stage_t *stages, int nstages,
                       const double *budget_us, const double *rates, double k_std)
{
    out->nstages = nstages;
    out->budget_us = sq_xmalloc(sizeof(double) * (size_t)nstages);
    out->rate_rps = sq_xmalloc(sizeof(double) * (size_t)nstages);
    out->batch = sq_xmalloc(sizeof(int) * (size_t)nstages);
    out->cost_devices = 0;
    for (int v = 0; v < nstages; v++) {
        out->budget_us[v] = budget_us[v];
        out->rate_rps[v] = rates[v];
        double c = pl_stage_cost_in(&stages[v], budget_us[v], rates[v], k_std);
        if (c < 0) {
            pl_query_result_dispose(out);
            return SQ_DEADLINE;
        }
        pl_max_throughput_rps(stages[v].profile, batch_budget_us(&stages[v], budget_us[v]), k_std,
                              0, &out->batch[v]);
        out->cost_devices += c;
    }
    return 0;
}

int pl_query_even_budgets(const pl_stage_t *stages, int nstages, double slo_us, double *budget_us)
{
    if (!(slo_us > 0) || nstages < 1 || !stages || !budget_us)
        return SQ_INVAL;
    for (int v = 0; v < nstages; v++) {
        if (stages[v].nparents < 0 || (stages[v].nparents > 0 && !stages[v].parents))
            return SQ_INVAL;
        for (int k = 0; k < stages[v].nparents; k++)
            if (stages[v].parents[k] < 0 || stages[v].parents[k] >= v)
                return SQ_INVAL;
    }
    /* up[v]: stages on the longest root-to-v path (v included); down[v]:
     * on the longest v-to-leaf path. A stage's longest root-to-leaf path
     * through it has up + down - 1 stages; any path through it has at most
     * that many, so every path's budgets add up to at most the SLO. */
    int *up = sq_xcalloc((size_t)nstages, sizeof(int));
    int *down = sq_xcalloc((size_t)nstages, sizeof(int));
    for (int v = 0; v < nstages; v++) {
        up[v] = 1;
        for (int k = 0; k < stages[v].nparents; k++)
            if (up[stages[v].parents[k]] + 1 > up[v])
                up[v] = up[stages[v].parents[k]] + 1;
    }
    for (int v = nstages - 1; v >= 0; v--) {
        if (down[v] < 1)
            down[v] = 1;
        for (int k = 0; k < stages[v].nparents; k++)
            if (down[v] + 1 > down[stages[v].parents[k]])
                down[stages[v].parents[k]] = down[v] + 1;
    }
    for (int v = 0; v < nstages; v++)
        budget_us[v] = slo_us / (up[v] + down[v] - 1);
    free(up);
    free(down);
    return 0;
}

int pl_query_split_even(pl_query_result_t *out, const pl_stage_t *stages, int nstages,
                        double slo_us, double rate_rps, double k_std)
{
    memset(out, 0, sizeof(*out));
    if (!(slo_us > 0) || !(rate_rps >= 0) || !stages_valid(stages, nstages))
        return SQ_INVAL;
    double *budget = sq_xmalloc(sizeof(double) * (size_t)nstages);
    int rc = pl_query_even_budgets(stages, nstages, slo_us, budget);
    if (rc == 0) {
        double *rates = stage_rates(stages, nstages, rate_rps);
        rc = fill_result(out, stages, nstages, budget, rates, k_std);
        free(rates);
    }
    free(budget);
    return rc;
}

int pl_query_split(pl_query_result_t *out, const pl_stage_t *stages, int nstages, double slo_us,
                   double rate_rps, double epsilon_us, double k_std)
{
    memset(out, 0, sizeof(*out));
    if (!(slo_us > 0) || !(epsilon_us > 0) || !(rate_rps >= 0) || !stages_valid(stages, nstages))
        return SQ_INVAL;
    double steps_f = floor(slo_us / epsilon_us + 1e-9);
    if (steps_f > MAX_STEPS || steps_f < 1)
        return SQ_INVAL;
    int steps = (int)steps_f;
    double *rates = stage_rates(stages, nstages, rate_rps);

    int nedges = 3 * nstages + 2;
    for (int v = 0; v < nstages; v++)
        nedges += stages[v].nparents;
    /* every reduction removes an edge and adds a tree node */
    tnode_t *tree = sq_xcalloc((size_t)(2 * nedges), sizeof(*tree));
    int ntree = 0;
    int root = decompose(stages, nstages, tree, &ntree);
    int rc = 0;
    if (root < 0) {
        rc = SQ_INVAL;
        goto done;
    }
    dp(tree, root, steps, epsilon_us, stages, rates, k_std);
    if (!isfinite(tree[root].f[steps])) {
        rc = SQ_DEADLINE;
        goto done;
    }
    int *budget_steps = sq_xcalloc((size_t)nstages, sizeof(int));
    assign(tree, root, steps, budget_steps);
    double *budget = sq_xmalloc(sizeof(double) * (size_t)nstages);
    for (int v = 0; v < nstages; v++)
        budget[v] = budget_steps[v] * epsilon_us;
    rc = fill_result(out, stages, nstages, budget, rates, k_std);
    free(budget);
    free(budget_steps);
done:
    for (int i = 0; i < ntree; i++) {
        free(tree[i].f);
        free(tree[i].arg);
    }
    free(tree);
    free(rates);
    return rc;
}

int pl_query_share_slack(pl_query_result_t *res, const pl_stage_t *stages, int nstages,
                         double slo_us, double k_std)
{
    if (res->nstages != nstages || !stages_valid(stages, nstages) || !(slo_us > 0))
        return SQ_INVAL;
    for (int v = 0; v < nstages; v++)
        if (stages[v].nparents > 1)
            return 0; /* a join: its paths are not one chain per leaf */
    double *cum = sq_xmalloc(sizeof(double) * (size_t)nstages);
    double *weight = sq_xmalloc(sizeof(double) * (size_t)nstages);
    double *extra = sq_xmalloc(sizeof(double) * (size_t)nstages);
    int *leaf = sq_xcalloc((size_t)nstages, sizeof(int));
    for (int v = 0; v < nstages; v++) {
        int par = stages[v].nparents ? stages[v].parents[0] : -1;
        cum[v] = (par >= 0 ? cum[par] : 0) + res->budget_us[v];
        weight[v] = res->rate_rps[v] * pl_latency_us(stages[v].profile, 1, k_std);
        extra[v] = INFINITY;
        leaf[v] = 1;
    }
    for (int v = 0; v < nstages; v++)
        if (stages[v].nparents)
            leaf[stages[v].parents[0]] = 0;
    for (int l = 0; l < nstages; l++) {
        if (!leaf[l])
            continue;
        double wsum = 0, left = slo_us - cum[l];
        int depth = 0;
        for (int v = l; v >= 0; v = stages[v].nparents ? stages[v].parents[0] : -1) {
            wsum += weight[v];
            depth++;
        }
        for (int v = l; v >= 0; v = stages[v].nparents ? stages[v].parents[0] : -1) {
            double share = wsum > 0 ? weight[v] / wsum : 1.0 / depth;
            double e = left > 0 ? left * share : 0;
            extra[v] = e < extra[v] ? e : extra[v];
        }
    }
    double *budget = sq_xmalloc(sizeof(double) * (size_t)nstages);
    double *rates = sq_xmalloc(sizeof(double) * (size_t)nstages);
    for (int v = 0; v < nstages; v++) {
        budget[v] = res->budget_us[v] + extra[v];
        rates[v] = res->rate_rps[v];
    }
    pl_query_result_t shared;
    memset(&shared, 0, sizeof(shared));
    int rc = fill_result(&shared, stages, nstages, budget, rates, k_std);
    if (rc == 0) {
        pl_query_result_dispose(res);
        *res = shared;
    }
    free(budget);
    free(rates);
    free(cum);
    free(weight);
    free(extra);
    free(leaf);
    return rc;
}

int pl_query_most_slack(pl_query_result_t *res, const pl_stage_t *stages, int nstages,
                        double slo_us, double k_std, double allowance_devices)
{
    if (res->nstages != nstages || !stages_valid(stages, nstages) || !(slo_us > 0))
        return SQ_INVAL;
    for (int v = 0; v < nstages; v++)
        if (stages[v].nparents > 1)
            return 0; /* a join: its paths are not one chain per leaf */
    /* floor[v]: what a stage needs at the least, its overhead (margin,
     * decode) and a batch of one waited for and run; cum[v]: the floors of
     * its path from the root; depth[v]: that path's stages. */
    double *floor_us = sq_xmalloc(sizeof(double) * (size_t)nstages);
    double *cum = sq_xmalloc(sizeof(double) * (size_t)nstages);
    int *depth = sq_xmalloc(sizeof(int) * (size_t)nstages);
    int *leaf = sq_xmalloc(sizeof(int) * (size_t)nstages);
    for (int v = 0; v < nstages; v++) {
        int par = stages[v].nparents ? stages[v].parents[0] : -1;
        double ov = stages[v].overhead_us > 0 ? stages[v].overhead_us : 0;
        floor_us[v] = ov + 2 * pl_latency_us(stages[v].profile, 1, k_std);
        cum[v] = (par >= 0 ? cum[par] : 0) + floor_us[v];
        depth[v] = (par >= 0 ? depth[par] : 0) + 1;
        leaf[v] = 1;
    }
    for (int v = 0; v < nstages; v++)
        if (stages[v].nparents)
            leaf[stages[v].parents[0]] = 0;
    /* The equal slack every path allows: each stage its floor plus s. */
    double s = INFINITY;
    for (int v = 0; v < nstages; v++)
        if (leaf[v] && (slo_us - cum[v]) / depth[v] < s)
            s = (slo_us - cum[v]) / depth[v];
    if (s > 0 && isfinite(s)) {
        double *cand = sq_xmalloc(sizeof(double) * (size_t)nstages);
        /* From the equal slack back toward the cheapest split, the first
         * whose cost the allowance holds (the cheapest itself at the end,
         * left as it is). */
        for (int k = PL_SLACK_STEPS; k > 0; k--) {
            double lam = (double)k / PL_SLACK_STEPS;
            for (int v = 0; v < nstages; v++)
                cand[v] = res->budget_us[v] + lam * (floor_us[v] + s - res->budget_us[v]);
            pl_query_result_t c;
            memset(&c, 0, sizeof(c));
            if (fill_result(&c, stages, nstages, cand, res->rate_rps, k_std) != 0)
                continue;
            if (c.cost_devices <= allowance_devices + 1e-9) {
                pl_query_result_dispose(res);
                *res = c;
                break;
            }
            pl_query_result_dispose(&c);
        }
        free(cand);
    }
    free(floor_us);
    free(cum);
    free(depth);
    free(leaf);
    return 0;
}
