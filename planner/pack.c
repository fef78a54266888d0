/* Squishy bin packing (Nexus section 6.1, Algorithm 1) with the merge rule
 * generalized to many sessions per device, a memory check, and incremental
 * re-planning between epochs. See pl.h for the validity rules. */
#include "pl.h"

#include <sq.h>

#include <assert.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Float slack for comparisons of times (µs) and of rates that were computed
 * as sums and products: the worked examples sit exactly on their bounds
 * (125 ms duty + 75 ms batch = 200 ms SLO). */
#define TIME_EPS_US 1e-6
#define REL_EPS 1e-9

/* Burst headroom (pl.h, pl_options_t.burst_quantile): the count arriving
 * in a window is Poisson(lambda); a batch of b covers the window when
 * P(N <= b) >= p. lam_max[b] caches the largest such lambda (NAN: not yet
 * computed). p = 0: fluid, batch = ceil(lambda). */
typedef struct {
    double p, z; /* z: the standard normal quantile of p */
    double *lam_max;
    int cap;
} burst_t;

typedef struct {
    int session;
    double rate_rps;
    double solo_duty_us; /* the duty cycle this share would pick alone (pl_residue) */
    double solo_occupancy;
    int batch; /* at the node's duty cycle, filled by eval */
    double latency_us;
    double transfer_us; /* on the node's link, filled by eval_on_link */
} item_t;

typedef struct {
    int id; /* the previous plan's id, or -1 for a new device */
    int saturated;
    double duty_cycle_us;
    double occupancy;
    double memory_bytes;
    int nitems, cap;
    item_t *items;
} node_t;

typedef struct {
    const pl_session_t *sessions;
    int nsessions;
    pl_options_t opt;
    node_t *nodes; /* every device of the plan being built */
    int nnodes, capnodes;
    double *unplaced_rate; /* per session */
    int *unplaced_reason;  /* per session, 0 = none */
    item_t *scratch;       /* room for merged item lists */
    int capscratch;
    burst_t burst;
    double *rate; /* per session: the rate packed (pl.h, burst headroom) */
    char *pooled; /* per session: 1 when rate already holds its bursts (batches fluid) */
} ctx_t;

static int batch_for(double duty_us, double rate_rps)
{
    /* The batch that collects a duty cycle's worth of requests; the slack
     * keeps b / r * r from rounding up to b + 1. */
    double b = ceil(duty_us * rate_rps * 1e-6 - REL_EPS);
    return b < 1 ? 1 : (int)b;
}

/* Exact Poisson sums up to this mean; past it the normal approximation
 * with continuity correction (its error there is far below the margin). */
#define POISSON_EXACT_MAX 200.0
#define BURST_QUANTILE_MAX (1 - 1e-9)

static double poisson_cdf(int b, double lambda)
{
    double term = exp(-lambda), sum = term;
    for (int k = 1; k <= b; k++) {
        term *= lambda / k;
        sum += term;
    }
    return sum;
}

/* The smallest q with P(N <= q) >= p, N ~ Poisson(lambda). */
static int poisson_quantile(double lambda, const burst_t *bt)
{
    if (!(lambda > 0))
        return 0;
    if (lambda > POISSON_EXACT_MAX)
        return (int)ceil(lambda + bt->z * sqrt(lambda) - 0.5 - REL_EPS);
    double term = exp(-lambda), sum = term;
    int q = 0;
    while (sum < bt->p) {
        q++;
        term *= lambda / q;
        sum += term;
    }
    return q;
}

/* The largest lambda whose p-quantile is at most b. */
static double burst_lambda_max(burst_t *bt, int b)
{
    if (b < bt->cap && !isnan(bt->lam_max[b]))
        return bt->lam_max[b];
    double lam;
    if (b + 0.5 > POISSON_EXACT_MAX) {
        double root = (-bt->z + sqrt(bt->z * bt->z + 4 * (b + 0.5))) / 2;
        lam = root * root;
    } else {
        double lo = 0, hi = b + 1; /* P(N <= b) falls as lambda grows */
        for (int i = 0; i < 60; i++) {
            double mid = (lo + hi) / 2;
            if (poisson_cdf(b, mid) >= bt->p)
                lo = mid;
            else
                hi = mid;
        }
        lam = lo;
    }
    if (b >= bt->cap) {
        int cap = b + 64;
        bt->lam_max = sq_xrealloc(bt->lam_max, sizeof(double) * (size_t)cap);
        for (int i = bt->cap; i < cap; i++)
            bt->lam_max[i] = NAN;
        bt->cap = cap;
    }
    bt->lam_max[b] = lam;
    return lam;
}

static void burst_init(burst_t *bt, double p)
{
    memset(bt, 0, sizeof(*bt));
    if (!(p > 0))
        return;
    /* p = 1 would want unbounded batches: the closest finite quantile. */
    bt->p = p < BURST_QUANTILE_MAX ? p : BURST_QUANTILE_MAX;
    double lo = 0, hi = 10; /* Phi(z) = p, p in (0, 1) */
    for (int i = 0; i < 80; i++) {
        double mid = (lo + hi) / 2;
        if (0.5 * erfc(-mid / sqrt(2)) < p)
            lo = mid;
        else
            hi = mid;
    }
    bt->z = hi;
}

/* Clumped arrivals (pl_session_t.dispersion D) are sized as clumps of D
 * arriving as a Poisson stream: D times a Poisson count of mean lambda / D,
 * the compound Poisson with one clump size that has the count's mean and
 * variance. That stands for clumps of several requests; below D = 2 the
 * clumps are mostly single requests (a parent batch of 4 frames with 0.1
 * crops each: D = 1.4), whose count is nearly Poisson, and the one-size
 * approximation would wrongly round a batch down to whole clumps of 1.4
 * (measured live: a classifier of 30 req/s pushed off the planned devices,
 * 6% of queries dropped), so they are sized as Poisson. */
#define CLUMP_MIN_DISPERSION 2.0

static int clumped(double dispersion)
{
    return dispersion >= CLUMP_MIN_DISPERSION;
}

/* The batch a share of rate_rps runs per duty cycle: fluid (batch_for), or
 * the p-quantile of the count over the cycle, Poisson or clumped. */
static int burst_batch(const burst_t *bt, double duty_us, double rate_rps, double dispersion)
{
    if (bt == NULL || !(bt->p > 0))
        return batch_for(duty_us, rate_rps);
    if (clumped(dispersion)) {
        int q = poisson_quantile(duty_us * rate_rps * 1e-6 * (1 - REL_EPS) / dispersion, bt);
        double b = ceil(q * dispersion - REL_EPS);
        return b < 1 ? 1 : b > INT_MAX / 2 ? INT_MAX / 2 : (int)b;
    }
    int q = poisson_quantile(duty_us * rate_rps * 1e-6 * (1 - REL_EPS), bt);
    return q < 1 ? 1 : q;
}

/* The longest duty cycle at which a share of rate_rps needs at most b. */
static double burst_duty_us(burst_t *bt, int b, double rate_rps, double dispersion)
{
    if (bt == NULL || !(bt->p > 0))
        return b / rate_rps * 1e6;
    if (clumped(dispersion))
        return dispersion * burst_lambda_max(bt, (int)floor(b / dispersion + REL_EPS)) / rate_rps *
               1e6;
    return burst_lambda_max(bt, b) / rate_rps * 1e6;
}

static int fits_memory(const pl_options_t *opt, double bytes)
{
    return opt->device_memory_bytes <= 0 || bytes <= opt->device_memory_bytes;
}

double pl_max_throughput_rps(const pl_profile_t *p, double slo_us, double k_std,
                             double memory_bytes, int *batch)
{
    double best = 0;
    int best_b = 0;
    /* l(b)/b non-increasing is all we assume, so scan rather than solve:
     * tables round up and need not be linear. */
    for (int b = 1; b <= p->max_batch; b++) {
        double l = pl_latency_us(p, b, k_std);
        if (l <= 0 || 2 * l > slo_us + TIME_EPS_US)
            continue;
        if (memory_bytes > 0 && pl_memory_bytes(p, b) > memory_bytes)
            break;
        double thr = b / l * 1e6;
        if (thr >= best * (1 - REL_EPS)) {
            best = thr;
            best_b = b;
        }
    }
    *batch = best_b;
    return best;
}

/* pl_residue with burst sizing (bt NULL: fluid): the duty cycle for b is
 * the longest whose p-quantile count is at most b. */
static int residue(burst_t *bt, double dispersion, const pl_profile_t *p, double slo_us,
                   double rate_rps, double k_std, double memory_bytes, int *batch,
                   double *duty_cycle_us, double *occupancy)
{
    int best_b = 0;
    double best_d = 0, best_occ = INFINITY;
    /* For each b: the duty cycle that collects b requests (b / r), shortened
     * to L - l(b) when that is too long for the SLO (low rates: the batch
     * then collects fewer than b). The lowest occupancy wins; in the usual
     * case that is Nexus's largest b with b / r + l(b) <= L, since
     * r l(b) / b does not grow with b. */
    for (int b = 1; b <= p->max_batch; b++) {
        double l = pl_latency_us(p, b, k_std);
        if (l <= 0)
            continue;
        double d = slo_us - l;
        if (rate_rps > 0 && burst_duty_us(bt, b, rate_rps, dispersion) < d)
            d = burst_duty_us(bt, b, rate_rps, dispersion);
        if (d <= 0)
            continue;
        int eb = burst_batch(bt, d, rate_rps, dispersion);
        double el = pl_latency_us(p, eb, k_std);
        if (el <= 0 || el > d + TIME_EPS_US || d + el > slo_us + TIME_EPS_US)
            continue;
        if (memory_bytes > 0 && pl_memory_bytes(p, eb) > memory_bytes)
            continue;
        double occ = el / d;
        if (occ <= best_occ * (1 + REL_EPS)) {
            best_occ = occ;
            best_b = eb;
            best_d = d;
        }
    }
    if (best_b == 0)
        return SQ_DEADLINE;
    *batch = best_b;
    *duty_cycle_us = best_d;
    *occupancy = best_occ;
    return 0;
}

int pl_residue(const pl_profile_t *p, double slo_us, double rate_rps, double k_std,
               double memory_bytes, int *batch, double *duty_cycle_us, double *occupancy)
{
    return residue(NULL, 1, p, slo_us, rate_rps, k_std, memory_bytes, batch, duty_cycle_us,
                   occupancy);
}

double pl_lower_bound(const pl_session_t *sessions, int nsessions, const pl_options_t *opt)
{
    double sum = 0;
    for (int i = 0; i < nsessions; i++) {
        int b;
        double t = pl_max_throughput_rps(sessions[i].profile, sessions[i].slo_us, opt->k_std,
                                         opt->device_memory_bytes, &b);
        if (t > 0)
            sum += sessions[i].rate_rps / t;
    }
    return sum;
}

double pl_advice_add(int ndevices, double bad_rate)
{
    if (ndevices <= 0 || bad_rate <= 0)
        return 0;
    if (bad_rate > 0.99)
        bad_rate = 0.99;
    return ndevices * bad_rate / (1 - bad_rate);
}

double pl_advice_release(int ndevices, double idle_fraction)
{
    if (ndevices <= 0 || idle_fraction <= 0)
        return 0;
    if (idle_fraction > 1)
        idle_fraction = 1;
    return ndevices * idle_fraction;
}

/* ---- nodes ---------------------------------------------------------------- */

static node_t *node_new(ctx_t *c, int id)
{
    if (c->nnodes == c->capnodes) {
        c->capnodes = c->capnodes ? 2 * c->capnodes : 16;
        c->nodes = sq_xrealloc(c->nodes, sizeof(*c->nodes) * (size_t)c->capnodes);
    }
    node_t *n = &c->nodes[c->nnodes++];
    memset(n, 0, sizeof(*n));
    n->id = id;
    return n;
}

static void node_push(node_t *n, const item_t *it)
{
    if (n->nitems == n->cap) {
        n->cap = n->cap ? 2 * n->cap : 4;
        n->items = sq_xrealloc(n->items, sizeof(*n->items) * (size_t)n->cap);
    }
    n->items[n->nitems++] = *it;
}

/* Weights once per model, activations at the largest batch that model runs
 * at on this device (its batches run one at a time). */
static double items_memory(const ctx_t *c, const item_t *it, int n)
{
    double mem = 0;
    for (int i = 0; i < n; i++) {
        int model = c->sessions[it[i].session].model, first = 1, maxb = it[i].batch;
        for (int j = 0; j < n && first; j++) {
            if (j == i || c->sessions[it[j].session].model != model)
                continue;
            if (j < i)
                first = 0;
            else if (it[j].batch > maxb)
                maxb = it[j].batch;
        }
        if (first)
            mem += pl_memory_bytes(c->sessions[it[i].session].profile, maxb);
    }
    return mem;
}

/* The batch of session s's share at duty cycle d: fluid when its packed
 * rate already holds its bursts (pooled), else the burst quantile. */
static int share_batch(const ctx_t *c, int s, double duty_us, double rate_rps)
{
    return c->pooled[s] ? batch_for(duty_us, rate_rps)
                        : burst_batch(&c->burst, duty_us, rate_rps, c->sessions[s].dispersion);
}

static burst_t *share_burst(ctx_t *c, int s)
{
    return c->pooled[s] ? NULL : &c->burst;
}

/* Evaluates residual items sharing one device: duty cycle = the smallest
 * solo duty cycle, batches shrink to d * r. Fills batch and latency of each
 * item, returns the occupancy or -1 when the node is invalid. */
static double eval_items(const ctx_t *c, item_t *it, int n, double *duty_out, double *mem_out)
{
    double d = INFINITY, sum = 0;
    for (int i = 0; i < n; i++)
        if (it[i].solo_duty_us < d)
            d = it[i].solo_duty_us;
    for (int i = 0; i < n; i++) {
        const pl_session_t *s = &c->sessions[it[i].session];
        int b = share_batch(c, it[i].session, d, it[i].rate_rps);
        double l = pl_latency_us(s->profile, b, c->opt.k_std);
        if (l <= 0 || d + l > s->slo_us + TIME_EPS_US)
            return -1;
        it[i].batch = b;
        it[i].latency_us = l;
        sum += l;
    }
    if (sum > d + TIME_EPS_US)
        return -1;
    double mem = items_memory(c, it, n);
    if (!fits_memory(&c->opt, mem))
        return -1;
    *duty_out = d;
    *mem_out = mem;
    return sum / d;
}

static int node_refresh(const ctx_t *c, node_t *n)
{
    if (n->saturated)
        return 0;
    double occ = eval_items(c, n->items, n->nitems, &n->duty_cycle_us, &n->memory_bytes);
    if (occ < 0)
        return -1;
    n->occupancy = occ;
    return 0;
}

static item_t *scratch(ctx_t *c, int n)
{
    if (n > c->capscratch) {
        c->capscratch = 2 * n;
        c->scratch = sq_xrealloc(c->scratch, sizeof(*c->scratch) * (size_t)c->capscratch);
    }
    return c->scratch;
}

static void add_unplaced(ctx_t *c, int s, double rate, int reason)
{
    c->unplaced_rate[s] += rate;
    if (!c->unplaced_reason[s])
        c->unplaced_reason[s] = reason;
}

/* Saturate and residue for one share of a session (Algorithm 1, lines 1-9):
 * whole devices at the saturation batch, the rest as one residual item
 * returned in *res (1) or none (0). */
static int pack_share(ctx_t *c, int s, double rate, item_t *res)
{
    const pl_session_t *ss = &c->sessions[s];
    const pl_options_t *o = &c->opt;
    int B;
    double thr =
        pl_max_throughput_rps(ss->profile, ss->slo_us, o->k_std, o->device_memory_bytes, &B);
    if (thr <= 0) {
        int b2;
        int slo_ok = pl_max_throughput_rps(ss->profile, ss->slo_us, o->k_std, 0, &b2) > 0;
        add_unplaced(c, s, rate, slo_ok ? PL_UNPLACED_MEMORY : PL_UNPLACED_SLO);
        return 0;
    }
    double whole = floor(rate / thr + REL_EPS);
    double left = rate - whole * thr;
    if (left < thr * REL_EPS)
        left = 0;
    double lat = pl_latency_us(ss->profile, B, o->k_std);
    for (int k = 0; k < (int)whole; k++) {
        node_t *n = node_new(c, -1);
        n->saturated = 1;
        n->duty_cycle_us = lat;
        n->occupancy = 1;
        n->memory_bytes = pl_memory_bytes(ss->profile, B);
        item_t it = {.session = s,
                     .rate_rps = thr,
                     .solo_duty_us = lat,
                     .solo_occupancy = 1,
                     .batch = B,
                     .latency_us = lat};
        node_push(n, &it);
    }
    if (left == 0 && whole > 0)
        return 0;
    int b;
    double d, occ;
    if (residue(share_burst(c, s), ss->dispersion, ss->profile, ss->slo_us, left, o->k_std,
                o->device_memory_bytes, &b, &d, &occ) < 0) {
        /* The residual rate is below a device's saturated throughput but no
         * cycle serves it within the SLO (a table with an odd shape): give
         * it a device of its own at the saturation batch. */
        node_t *n = node_new(c, -1);
        n->saturated = 1;
        n->duty_cycle_us = lat;
        n->occupancy = 1;
        n->memory_bytes = pl_memory_bytes(ss->profile, B);
        item_t it = {.session = s,
                     .rate_rps = left,
                     .solo_duty_us = lat,
                     .solo_occupancy = 1,
                     .batch = B,
                     .latency_us = lat};
        node_push(n, &it);
        return 0;
    }
    *res = (item_t){.session = s,
                    .rate_rps = left,
                    .solo_duty_us = d,
                    .solo_occupancy = occ,
                    .batch = b,
                    .latency_us = pl_latency_us(ss->profile, b, o->k_std)};
    return 1;
}

/* The rate session s is packed at (c->rate[s]). Fluid: its rate. With
 * burst headroom, a session big enough to fill a device at its saturation
 * throughput is sized pooled over all its devices (the dispatcher's
 * matchmaking lets any of them take any of its batches, so the bursts of
 * its shares do not add up) and over its SLO L: a request may wait up to
 * L - l(B) >= l(B) for a batch, so a burst is absorbed over L, not within
 * one cycle. Its rate is then q_p(r L) / L (the p-quantile of the count
 * arriving in one SLO, spread over it) and its shares run fluid batches.
 * A smaller session keeps its rate, and each of its shares sizes its batch
 * for the p-quantile of the count over its own duty cycle (share_batch):
 * there the cycle is the window, since the batch is fixed per cycle. */
static void packed_rate(ctx_t *c, int s)
{
    const pl_session_t *ss = &c->sessions[s];
    c->rate[s] = ss->rate_rps;
    if (!(c->burst.p > 0) || !(ss->rate_rps > 0))
        return;
    int B;
    double thr = pl_max_throughput_rps(ss->profile, ss->slo_us, c->opt.k_std,
                                       c->opt.device_memory_bytes, &B);
    if (thr <= 0)
        return;
    double lambda = ss->rate_rps * ss->slo_us * 1e-6;
    double sat = clumped(ss->dispersion)
                     ? ss->dispersion * poisson_quantile(lambda / ss->dispersion, &c->burst) /
                           ss->slo_us * 1e6
                     : poisson_quantile(lambda, &c->burst) / ss->slo_us * 1e6;
    if (sat >= thr * (1 - REL_EPS)) {
        c->rate[s] = sat;
        c->pooled[s] = 1;
    }
}

/* ---- merge: best-fit decreasing by occupancy ------------------------------ */

typedef struct {
    int *idx; /* node indices, sorted by occupancy descending */
    int n, cap;
} binlist_t;

static void bins_insert(binlist_t *bl, const ctx_t *c, int node)
{
    if (bl->n == bl->cap) {
        bl->cap = bl->cap ? 2 * bl->cap : 16;
        bl->idx = sq_xrealloc(bl->idx, sizeof(*bl->idx) * (size_t)bl->cap);
    }
    double occ = c->nodes[node].occupancy;
    int lo = 0, hi = bl->n;
    while (lo < hi) { /* first position whose occupancy is below occ */
        int mid = (lo + hi) / 2;
        if (c->nodes[bl->idx[mid]].occupancy >= occ)
            lo = mid + 1;
        else
            hi = mid;
    }
    memmove(bl->idx + lo + 1, bl->idx + lo, sizeof(*bl->idx) * (size_t)(bl->n - lo));
    bl->idx[lo] = node;
    bl->n++;
}

static void bins_remove_at(binlist_t *bl, int pos)
{
    memmove(bl->idx + pos, bl->idx + pos + 1, sizeof(*bl->idx) * (size_t)(bl->n - pos - 1));
    bl->n--;
}

/* The bin an item fills best (highest occupancy after the merge), as a
 * position in bl, or -1. Merging never lowers a node's occupancy (batches
 * shrink, and l(b)/b does not fall as b falls), so a bin above
 * 1 - occ(item) cannot take it and a bin whose occupancy plus the item's
 * cannot beat the best merge found so far need not be tried: the scan over
 * the sorted bins stops there. */
static int best_bin(ctx_t *c, const binlist_t *bl, const item_t *it)
{
    double limit = 1 - it->solo_occupancy + REL_EPS;
    int lo = 0, hi = bl->n;
    while (lo < hi) { /* first bin with occupancy <= limit */
        int mid = (lo + hi) / 2;
        if (c->nodes[bl->idx[mid]].occupancy > limit)
            lo = mid + 1;
        else
            hi = mid;
    }
    int best_pos = -1;
    double best_occ = -1;
    for (int pos = lo; pos < bl->n; pos++) {
        node_t *bin = &c->nodes[bl->idx[pos]];
        if (bin->occupancy + it->solo_occupancy <= best_occ)
            break;
        item_t *tmp = scratch(c, bin->nitems + 1);
        memcpy(tmp, bin->items, sizeof(*tmp) * (size_t)bin->nitems);
        tmp[bin->nitems] = *it;
        double d, mem;
        double occ = eval_items(c, tmp, bin->nitems + 1, &d, &mem);
        if (occ > best_occ) {
            best_occ = occ;
            best_pos = pos;
        }
    }
    return best_pos;
}

/* Adds an item to the bin at pos (re-sorting it) or, with pos -1, to a new
 * device; returns the node. */
static int put_item(ctx_t *c, binlist_t *bl, const item_t *it, int pos)
{
    int node;
    if (pos >= 0) {
        node = bl->idx[pos];
        bins_remove_at(bl, pos);
        node_push(&c->nodes[node], it);
    } else {
        node_t *n = node_new(c, -1);
        node_push(n, it);
        node = (int)(n - c->nodes);
    }
    int rc = node_refresh(c, &c->nodes[node]);
    assert(rc == 0);
    (void)rc;
    bins_insert(bl, c, node);
    return node;
}

static int bins_find(const binlist_t *bl, int node)
{
    for (int i = 0; i < bl->n; i++)
        if (bl->idx[i] == node)
            return i;
    return -1;
}

/* Best-fit decreasing leaves a tail of lightly filled devices. Try to empty
 * each device, least occupied first, by moving all its sessions into other
 * devices (best fit again); undo when one of them finds no room. Kept
 * devices (an incremental epoch) are emptied too: when load falls, sessions
 * that each kept a device of their own consolidate onto fewer, and the
 * device given back is worth the model loads (squishd moves make before
 * break). At unchanged rates nothing moves: the plan that made them was
 * consolidated already. */
static void consolidate(ctx_t *c, binlist_t *bl)
{
    int n = bl->n;
    int *order = sq_xmalloc(sizeof(*order) * (size_t)(n ? n : 1));
    for (int i = 0; i < n; i++)
        order[i] = bl->idx[n - 1 - i]; /* ascending occupancy */
    int *undo_node = NULL, *undo_count = NULL, cap = 0;
    for (int k = 0; k < n; k++) {
        int src = order[k];
        node_t *sn = &c->nodes[src];
        if (sn->nitems == 0)
            continue;
        int pos = bins_find(bl, src);
        if (pos < 0)
            continue;
        bins_remove_at(bl, pos);
        if (sn->nitems > cap) {
            cap = sn->nitems;
            undo_node = sq_xrealloc(undo_node, sizeof(int) * (size_t)cap);
            undo_count = sq_xrealloc(undo_count, sizeof(int) * (size_t)cap);
        }
        int moved = 0, ok = 1;
        for (int i = 0; i < sn->nitems; i++) {
            int to = best_bin(c, bl, &sn->items[i]);
            if (to < 0) {
                ok = 0;
                break;
            }
            undo_node[moved] = bl->idx[to];
            undo_count[moved] = c->nodes[bl->idx[to]].nitems;
            moved++;
            put_item(c, bl, &sn->items[i], to);
            sn = &c->nodes[src]; /* put_item never adds nodes here, but stay safe */
        }
        if (ok) {
            sn->nitems = 0;
            continue;
        }
        for (int m = moved - 1; m >= 0; m--) {
            node_t *t = &c->nodes[undo_node[m]];
            int tp = bins_find(bl, undo_node[m]);
            bins_remove_at(bl, tp);
            t->nitems = undo_count[m];
            int rc = node_refresh(c, t);
            assert(rc == 0);
            (void)rc;
            bins_insert(bl, c, undo_node[m]);
        }
        bins_insert(bl, c, src);
    }
    free(order);
    free(undo_node);
    free(undo_count);
}

static void place_item(ctx_t *c, binlist_t *bl, const item_t *it)
{
    put_item(c, bl, it, best_bin(c, bl, it));
}

static int item_cmp_occ_desc(const void *a, const void *b)
{
    const item_t *x = a, *y = b;
    if (x->solo_occupancy != y->solo_occupancy)
        return x->solo_occupancy < y->solo_occupancy ? 1 : -1;
    return (x->session > y->session) - (x->session < y->session);
}

/* ---- incremental: keep what still fits ------------------------------------ */

typedef struct {
    int id, index;
} idmap_t;

static int idmap_cmp(const void *a, const void *b)
{
    const idmap_t *x = a, *y = b;
    return (x->id > y->id) - (x->id < y->id);
}

static int idmap_find(const idmap_t *map, int n, int id)
{
    idmap_t key = {.id = id};
    const idmap_t *f = bsearch(&key, map, (size_t)n, sizeof(*map), idmap_cmp);
    return f ? f->index : -1;
}

typedef struct {
    int session;
    double rate_rps;
} share_t;

typedef struct {
    share_t *v;
    int n, cap;
} pool_t;

static void pool_add(pool_t *p, int s, double rate)
{
    if (p->n == p->cap) {
        p->cap = p->cap ? 2 * p->cap : 16;
        p->v = sq_xrealloc(p->v, sizeof(*p->v) * (size_t)p->cap);
    }
    p->v[p->n++] = (share_t){s, rate};
}

/* Makes a kept residual node valid again at the new rates by evicting its
 * cheapest sessions (least solo occupancy: the least load to move): the
 * cheapest one whose departure alone fixes the node if there is one, else
 * the cheapest, and again. Returns how many were evicted into pool. */
static int evict_until_valid(ctx_t *c, node_t *n, pool_t *pool)
{
    int evicted = 0;
    while (n->nitems > 0 && node_refresh(c, n) < 0) {
        int cheapest = -1, fixer = -1;
        for (int i = 0; i < n->nitems; i++) {
            if (cheapest < 0 || n->items[i].solo_occupancy < n->items[cheapest].solo_occupancy)
                cheapest = i;
            item_t *tmp = scratch(c, n->nitems);
            int k = 0;
            for (int j = 0; j < n->nitems; j++)
                if (j != i)
                    tmp[k++] = n->items[j];
            double d, mem;
            if (k > 0 && eval_items(c, tmp, k, &d, &mem) >= 0 &&
                (fixer < 0 || n->items[i].solo_occupancy < n->items[fixer].solo_occupancy))
                fixer = i;
        }
        int victim = fixer >= 0 ? fixer : cheapest;
        pool_add(pool, n->items[victim].session, n->items[victim].rate_rps);
        memmove(n->items + victim, n->items + victim + 1,
                sizeof(*n->items) * (size_t)(n->nitems - victim - 1));
        n->nitems--;
        evicted++;
    }
    return evicted;
}

/* Rebuilds the previous plan's devices at the new rates: saturated devices
 * stay while their session still fills them, a residual share takes what is
 * left of its session's rate. Load that no kept device covers goes to pool. */
static int keep_previous(ctx_t *c, const pl_plan_t *prev, pool_t *pool)
{
    int ns = c->nsessions;
    idmap_t *map = sq_xmalloc(sizeof(*map) * (size_t)(ns ? ns : 1));
    for (int i = 0; i < ns; i++)
        map[i] = (idmap_t){c->sessions[i].id, i};
    qsort(map, (size_t)ns, sizeof(*map), idmap_cmp);
    double *left = sq_xmalloc(sizeof(*left) * (size_t)(ns ? ns : 1));
    char *has_residual = sq_xcalloc((size_t)(ns ? ns : 1), 1);
    for (int i = 0; i < ns; i++)
        left[i] = c->rate[i];

    /* Saturated devices first, so that a residual share gets only the rate
     * they leave over. */
    for (int pass = 0; pass < 2; pass++) {
        for (int di = 0; di < prev->ndevices; di++) {
            const pl_device_t *pd = &prev->devices[di];
            if (pd->saturated != (pass == 0))
                continue;
            node_t *n = NULL;
            for (int a = 0; a < pd->nallocs; a++) {
                int s = idmap_find(map, ns, pd->allocs[a].session_id);
                if (s < 0)
                    continue; /* the session is gone */
                const pl_session_t *ss = &c->sessions[s];
                int B;
                double thr = pl_max_throughput_rps(ss->profile, ss->slo_us, c->opt.k_std,
                                                   c->opt.device_memory_bytes, &B);
                if (thr <= 0)
                    continue; /* pack_share reports it unplaced from the pool */
                if (pass == 0) {
                    if (left[s] < thr * (1 - REL_EPS))
                        continue;
                    left[s] -= thr;
                    if (left[s] < thr * REL_EPS)
                        left[s] = 0;
                    double lat = pl_latency_us(ss->profile, B, c->opt.k_std);
                    n = node_new(c, pd->id);
                    n->saturated = 1;
                    n->duty_cycle_us = lat;
                    n->occupancy = 1;
                    n->memory_bytes = pl_memory_bytes(ss->profile, B);
                    item_t it = {.session = s,
                                 .rate_rps = thr,
                                 .solo_duty_us = lat,
                                 .solo_occupancy = 1,
                                 .batch = B,
                                 .latency_us = lat};
                    node_push(n, &it);
                    continue;
                }
                if (has_residual[s] || (left[s] <= 0 && c->rate[s] > 0))
                    continue;
                /* Whole devices' worth of new load goes to new saturated
                 * devices; the residual share stays here. */
                double whole = floor(left[s] / thr + REL_EPS);
                double share = left[s] - whole * thr;
                if (share < thr * REL_EPS)
                    share = 0;
                if (whole > 0)
                    pool_add(pool, s, whole * thr);
                left[s] = 0;
                has_residual[s] = 1;
                if (share == 0 && c->rate[s] > 0)
                    continue;
                item_t it = {.session = s, .rate_rps = share};
                int b;
                if (residue(share_burst(c, s), ss->dispersion, ss->profile, ss->slo_us, share,
                            c->opt.k_std, c->opt.device_memory_bytes, &b, &it.solo_duty_us,
                            &it.solo_occupancy) < 0) {
                    pool_add(pool, s, share);
                    continue;
                }
                if (!n)
                    n = node_new(c, pd->id);
                node_push(n, &it);
            }
        }
    }
    int evicted = 0;
    for (int i = 0; i < c->nnodes; i++)
        if (!c->nodes[i].saturated)
            evicted += evict_until_valid(c, &c->nodes[i], pool);
    for (int s = 0; s < ns; s++) {
        if (left[s] > 0 || (c->rate[s] == 0 && !has_residual[s]))
            pool_add(pool, s, left[s]);
    }
    free(map);
    free(left);
    free(has_residual);
    return evicted;
}

/* ---- links (pl.h: devices behind a link) ---------------------------------- */

static pl_link_t link_of(const pl_options_t *o, int id)
{
    if (o->links && id >= 0 && id < o->nlinks)
        return o->links[id];
    return (pl_link_t){0, 0};
}

static int link_is_local(pl_link_t l)
{
    return !(l.rtt_us > 0) && !(l.bytes_per_us > 0);
}

static int link_eq(pl_link_t a, pl_link_t b)
{
    return a.rtt_us == b.rtt_us && a.bytes_per_us == b.bytes_per_us;
}

/* net(b) of session s on link l. */
static double transfer_us(const pl_session_t *s, pl_link_t l, int b)
{
    if (link_is_local(l))
        return 0;
    return l.rtt_us + (l.bytes_per_us > 0 ? b * s->item_bytes / l.bytes_per_us : 0);
}

/* Node n's items (copied into it) on a device behind link l: a batch holds
 * the device for l(b) + net(b). A saturated node runs the batch with the
 * most throughput such that 2 (l(B) + net(B)) <= L; it serves less than its
 * rate when that throughput is lower (*partial set, it[0].rate_rps what it
 * serves). A shared node keeps its rates and shortens its duty cycle until
 * every d + l(b) + net(b) <= L (the batches shrink with it), then must fit
 * the cycle. Returns the occupancy, with *duty, or -1 when the node cannot
 * run there. */
static double eval_on_link(const ctx_t *c, const node_t *n, pl_link_t l, item_t *it, double *duty,
                           int *partial)
{
    *partial = 0;
    memcpy(it, n->items, sizeof(*it) * (size_t)n->nitems);
    if (link_is_local(l)) {
        for (int i = 0; i < n->nitems; i++)
            it[i].transfer_us = 0;
        *duty = n->duty_cycle_us;
        return n->occupancy;
    }
    if (n->saturated) {
        const pl_session_t *s = &c->sessions[it[0].session];
        int best = 0;
        double best_thr = 0, best_l = 0;
        for (int b = 1; b <= s->profile->max_batch; b++) {
            double lat = pl_latency_us(s->profile, b, c->opt.k_std);
            if (lat <= 0)
                continue;
            double cost = lat + transfer_us(s, l, b);
            if (2 * cost > s->slo_us + TIME_EPS_US ||
                !fits_memory(&c->opt, pl_memory_bytes(s->profile, b)))
                continue;
            if (b / cost > best_thr) {
                best_thr = b / cost;
                best = b;
                best_l = lat;
            }
        }
        if (best == 0)
            return -1;
        if (best_thr * 1e6 < it[0].rate_rps * (1 - REL_EPS)) {
            *partial = 1;
            it[0].rate_rps = best_thr * 1e6;
        }
        it[0].batch = best;
        it[0].latency_us = best_l;
        it[0].transfer_us = transfer_us(s, l, best);
        *duty = best_l + it[0].transfer_us;
        return 1;
    }
    double d = n->duty_cycle_us;
    for (int iter = 0; iter < 64 && d > 0; iter++) {
        double need = d, sum = 0;
        int ok = 1;
        for (int i = 0; i < n->nitems; i++) {
            const pl_session_t *s = &c->sessions[it[i].session];
            int b = share_batch(c, it[i].session, d, it[i].rate_rps);
            double lat = pl_latency_us(s->profile, b, c->opt.k_std);
            if (lat <= 0)
                return -1;
            double x = transfer_us(s, l, b);
            if (d + lat + x > s->slo_us + TIME_EPS_US) {
                ok = 0;
                if (s->slo_us - lat - x < need)
                    need = s->slo_us - lat - x;
            }
            it[i].batch = b;
            it[i].latency_us = lat;
            it[i].transfer_us = x;
            sum += lat + x;
        }
        if (ok) {
            if (sum > d + TIME_EPS_US || !fits_memory(&c->opt, items_memory(c, it, n->nitems)))
                return -1;
            *duty = d;
            return sum / d;
        }
        d = need;
    }
    return -1;
}

/* A class of device ids with one link, and the ids still free in it. */
typedef struct {
    pl_link_t link;
    int *ids; /* ascending */
    int nids, next;
    int beyond; /* the local ids past the links: only when no listed device carries it */
} link_class_t;

/* Gives every new node (id -1) of order[0..*keep) an id, and so a link
 * (pl.h): most constrained first (fewest free ids whose link carries it),
 * each the link that carries it at the lowest occupancy (a local device
 * first), its smallest free id there; the local ids past the listed links
 * (an uncapped plan's extra devices) only when no listed one carries it. Feasibility is nested in
 * practice (a node a worse link carries, a better one does too), and then serving the nodes by
 * increasing room places all of them whenever any assignment does, whichever carrying id each
 * takes. A kept node its link no longer carries is re-assigned too. Nodes take their evaluation on
 * the chosen link; those no free id carries leave order (their sessions unplaced,
 * PL_UNPLACED_LINK). ids_limit: ids run 0..ids_limit-1. */
static void assign_links(ctx_t *c, int *order, int *keep, const char *used, int ids_limit)
{
    int nk = *keep;
    int maxitems = 1;
    for (int k = 0; k < nk; k++)
        if (c->nodes[order[k]].nitems > maxitems)
            maxitems = c->nodes[order[k]].nitems;
    item_t *tmp = sq_xmalloc(sizeof(*tmp) * (size_t)maxitems);
    /* Kept nodes first: each stays on its id when its link still carries it. */
    char *taken = sq_xcalloc((size_t)ids_limit + 1, 1);
    for (int k = 0; k < nk; k++) {
        node_t *n = &c->nodes[order[k]];
        if (n->id < 0)
            continue;
        double duty;
        int partial;
        double occ = eval_on_link(c, n, link_of(&c->opt, n->id), tmp, &duty, &partial);
        if (occ < 0 || partial) {
            n->id = -1; /* moves */
            continue;
        }
        if (n->id < ids_limit)
            taken[n->id] = 1;
        memcpy(n->items, tmp, sizeof(*tmp) * (size_t)n->nitems);
        n->duty_cycle_us = duty;
        n->occupancy = occ;
    }
    /* Classes of the free ids. */
    link_class_t *cls = sq_xcalloc((size_t)c->opt.nlinks + 2, sizeof(*cls));
    int ncls = 0;
    for (int id = 0; id < ids_limit; id++) {
        if (taken[id] || used[id])
            continue;
        pl_link_t l = link_of(&c->opt, id);
        int k = 0;
        while (k < ncls && (!link_eq(cls[k].link, l) || cls[k].beyond != (id >= c->opt.nlinks)))
            k++;
        if (k == ncls) {
            cls[ncls].link = l;
            cls[ncls].ids = sq_xmalloc(sizeof(int) * (size_t)ids_limit);
            cls[ncls].beyond = id >= c->opt.nlinks;
            ncls++;
        }
        cls[k].ids[cls[k].nids++] = id;
        if (id >= c->opt.nlinks && id + 1 < ids_limit) {
            /* Every id from here on is local, in this same class. */
            for (int j = id + 1; j < ids_limit; j++)
                if (!taken[j] && !used[j])
                    cls[k].ids[cls[k].nids++] = j;
            break;
        }
    }
    /* Which classes carry each new node, and how many ids that is. */
    int *newn = sq_xmalloc(sizeof(int) * (size_t)(nk ? nk : 1));
    int *room = sq_xmalloc(sizeof(int) * (size_t)(nk ? nk : 1));
    char *fits = sq_xcalloc((size_t)(nk ? nk : 1) * (size_t)(ncls ? ncls : 1), 1);
    double *cost = sq_xcalloc((size_t)(nk ? nk : 1) * (size_t)(ncls ? ncls : 1), sizeof(double));
    int nnew = 0;
    for (int k = 0; k < nk; k++) {
        node_t *n = &c->nodes[order[k]];
        if (n->id >= 0)
            continue;
        room[nnew] = 0;
        for (int q = 0; q < ncls; q++) {
            double duty;
            int partial;
            double occ = eval_on_link(c, n, cls[q].link, tmp, &duty, &partial);
            if (occ < 0)
                continue;
            fits[nnew * ncls + q] = 1;
            /* Serving only part of the rate: the last resort, the most
             * served first. */
            cost[nnew * ncls + q] = partial ? 2 - tmp[0].rate_rps / n->items[0].rate_rps : occ;
            if (!partial)
                room[nnew] += 2 * cls[q].nids;
            else
                room[nnew] |= 1;
        }
        newn[nnew++] = order[k];
    }
    /* Most constrained first: the fewest ids at full rate (room / 2), and
     * among equals those with no partial way out (room & 1) before those
     * with one (stable: insertion sort keeps the order's
     * saturated-then-fullest ranking among equals). */
    int *rank = sq_xmalloc(sizeof(int) * (size_t)(nnew ? nnew : 1));
    for (int i = 0; i < nnew; i++) {
        int j = i;
        while (j > 0 && room[rank[j - 1]] > room[i]) {
            rank[j] = rank[j - 1];
            j--;
        }
        rank[j] = i;
    }
    for (int r = 0; r < nnew; r++) {
        int i = rank[r];
        node_t *n = &c->nodes[newn[i]];
        /* Full rate before part of it, listed devices before the ones past
         * the links, then the lowest occupancy, then the smallest id. */
        int pick = -1, pick_tier = 0;
        for (int q = 0; q < ncls; q++) {
            if (!fits[i * ncls + q] || cls[q].next >= cls[q].nids)
                continue;
            int tier = 2 * (cost[i * ncls + q] > 1 + REL_EPS) + cls[q].beyond;
            if (pick < 0 || tier < pick_tier ||
                (tier == pick_tier &&
                 (cost[i * ncls + q] < cost[i * ncls + pick] ||
                  (cost[i * ncls + q] == cost[i * ncls + pick] &&
                   cls[q].ids[cls[q].next] < cls[pick].ids[cls[pick].next])))) {
                pick = q;
                pick_tier = tier;
            }
        }
        if (pick < 0) {
            for (int it = 0; it < n->nitems; it++)
                add_unplaced(c, n->items[it].session, n->items[it].rate_rps, PL_UNPLACED_LINK);
            n->nitems = 0; /* leaves the plan below */
            continue;
        }
        n->id = cls[pick].ids[cls[pick].next++];
        double duty;
        int partial;
        double occ = eval_on_link(c, n, cls[pick].link, tmp, &duty, &partial);
        if (partial)
            add_unplaced(c, n->items[0].session, n->items[0].rate_rps - tmp[0].rate_rps,
                         PL_UNPLACED_LINK);
        memcpy(n->items, tmp, sizeof(*tmp) * (size_t)n->nitems);
        n->duty_cycle_us = duty;
        n->occupancy = occ;
    }
    int w = 0;
    for (int k = 0; k < nk; k++)
        if (c->nodes[order[k]].nitems > 0)
            order[w++] = order[k];
    *keep = w;
    for (int q = 0; q < ncls; q++)
        free(cls[q].ids);
    free(cls);
    free(newn);
    free(room);
    free(fits);
    free(cost);
    free(rank);
    free(taken);
    free(tmp);
}

/* ---- overflow routes on spare devices (pl_options_t.overflow) ------------ */

typedef struct {
    int session;
    double load; /* sum of its shares' l(b) / d: devices' worth of planned work */
} busy_t;

static int busy_cmp(const void *a, const void *b)
{
    const busy_t *x = a, *y = b;
    if (x->load != y->load)
        return x->load < y->load ? 1 : -1;
    return (x->session > y->session) - (x->session < y->session);
}

/* Whether session s can run on a device behind link l at all: some batch
 * with 2 (l(b) + net(b)) <= L (a spare device serves it back to back), and
 * that batch's memory fits. Returns the largest such batch, or 0. */
static int overflow_batch(const ctx_t *c, int s, pl_link_t l)
{
    const pl_session_t *ss = &c->sessions[s];
    int best = 0;
    for (int b = 1; b <= ss->profile->max_batch; b++) {
        double lat = pl_latency_us(ss->profile, b, c->opt.k_std);
        if (lat <= 0 || 2 * (lat + transfer_us(ss, l, b)) > ss->slo_us + TIME_EPS_US)
            continue;
        if (!fits_memory(&c->opt, pl_memory_bytes(ss->profile, b)))
            break;
        best = b;
    }
    return best;
}

/* Devices short (load left unplaced for want of devices): the planned
 * devices that do not hold such a session also take its overflow, least
 * occupied first, as memory allows: Symphony's matchmaking over every
 * worker that can hold the model, rather than certain loss. */
static void overflow_onto_planned(const ctx_t *c, pl_plan_t *out, const busy_t *rank)
{
    int *order = sq_xmalloc(sizeof(int) * (size_t)(out->ndevices ? out->ndevices : 1));
    for (int i = 0; i < out->ndevices; i++) {
        int j = i;
        while (j > 0 && out->devices[order[j - 1]].occupancy > out->devices[i].occupancy) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = i;
    }
    double *extra = sq_xcalloc((size_t)(out->ndevices ? out->ndevices : 1), sizeof(double));
    for (int k = 0; k < c->nsessions; k++) {
        int s = rank[k].session;
        if (c->unplaced_reason[s] != PL_UNPLACED_DEVICES)
            continue;
        for (int oi = 0; oi < out->ndevices; oi++) {
            int i = order[oi];
            const pl_device_t *d = &out->devices[i];
            int holds = 0, model_there = 0;
            for (int a = 0; a < d->nallocs; a++) {
                holds |= d->allocs[a].session == s;
                model_there |= d->allocs[a].model == c->sessions[s].model;
            }
            for (int o = 0; o < out->noverflow; o++)
                model_there |= out->overflow[o].device_id == d->id &&
                               out->overflow[o].model == c->sessions[s].model;
            if (holds)
                continue;
            int b = overflow_batch(c, s, link_of(&c->opt, d->id));
            if (b == 0)
                continue;
            double more = model_there ? 0 : pl_memory_bytes(c->sessions[s].profile, b);
            if (!fits_memory(&c->opt, d->memory_bytes + extra[i] + more))
                continue;
            extra[i] += more;
            out->overflow[out->noverflow++] = (pl_overflow_t){.device_id = d->id,
                                                              .session = s,
                                                              .session_id = c->sessions[s].id,
                                                              .model = c->sessions[s].model};
        }
    }
    free(order);
    free(extra);
}

static void add_overflow(const ctx_t *c, pl_plan_t *out)
{
    int maxd = c->opt.max_devices;
    if (!c->opt.overflow || maxd <= 0 || c->nsessions == 0)
        return;
    busy_t *rank = sq_xcalloc((size_t)c->nsessions, sizeof(*rank));
    for (int s = 0; s < c->nsessions; s++) {
        rank[s].session = s;
        /* Load the plan could not place counts first: a device's worth of
         * its saturated throughput. */
        int B;
        double thr = pl_max_throughput_rps(c->sessions[s].profile, c->sessions[s].slo_us,
                                           c->opt.k_std, c->opt.device_memory_bytes, &B);
        if (c->unplaced_reason[s] == PL_UNPLACED_DEVICES && thr > 0)
            rank[s].load += c->unplaced_rate[s] / thr;
    }
    for (int i = 0; i < out->ndevices; i++) {
        const pl_device_t *d = &out->devices[i];
        for (int a = 0; a < d->nallocs; a++)
            rank[d->allocs[a].session].load +=
                (d->allocs[a].latency_us + d->allocs[a].transfer_us) / d->duty_cycle_us;
    }
    qsort(rank, (size_t)c->nsessions, sizeof(*rank), busy_cmp);
    int cap = (maxd > out->ndevices ? maxd : out->ndevices) * c->nsessions;
    out->overflow = sq_xcalloc((size_t)(cap ? cap : 1), sizeof(*out->overflow));
    char *used = sq_xcalloc((size_t)maxd, 1);
    for (int i = 0; i < out->ndevices; i++)
        if (out->devices[i].id >= 0 && out->devices[i].id < maxd)
            used[out->devices[i].id] = 1;
    int *models = sq_xmalloc(sizeof(int) * (size_t)c->nsessions);
    int *batches = sq_xmalloc(sizeof(int) * (size_t)c->nsessions);
    for (int id = 0; id < maxd; id++) {
        if (used[id])
            continue;
        pl_link_t l = link_of(&c->opt, id);
        int nm = 0;
        double mem = 0;
        for (int k = 0; k < c->nsessions; k++) {
            int s = rank[k].session;
            if (!(rank[k].load > 0) || !(c->sessions[s].rate_rps > 0))
                break; /* sorted: the rest has no planned load */
            int b = overflow_batch(c, s, l);
            if (b == 0)
                continue;
            /* Weights once per model, activations at its largest batch. */
            const pl_profile_t *p = c->sessions[s].profile;
            int m = 0;
            while (m < nm && models[m] != c->sessions[s].model)
                m++;
            double more =
                m < nm
                    ? (b > batches[m] ? pl_memory_bytes(p, b) - pl_memory_bytes(p, batches[m]) : 0)
                    : pl_memory_bytes(p, b);
            if (!fits_memory(&c->opt, mem + more))
                continue;
            mem += more;
            if (m == nm) {
                models[nm] = c->sessions[s].model;
                batches[nm++] = b;
            } else if (b > batches[m]) {
                batches[m] = b;
            }
            out->overflow[out->noverflow++] = (pl_overflow_t){.device_id = id,
                                                              .session = s,
                                                              .session_id = c->sessions[s].id,
                                                              .model = c->sessions[s].model};
        }
    }
    overflow_onto_planned(c, out, rank);
    free(models);
    free(batches);
    free(used);
    free(rank);
}

/* ---- assembling the plan -------------------------------------------------- */

typedef struct {
    int device_id, session_id;
} pair_t;

static int pair_cmp(const void *a, const void *b)
{
    const pair_t *x = a, *y = b;
    if (x->device_id != y->device_id)
        return (x->device_id > y->device_id) - (x->device_id < y->device_id);
    return (x->session_id > y->session_id) - (x->session_id < y->session_id);
}

static int node_keep_cmp(const void *a, const void *b, const ctx_t *c)
{
    const node_t *x = &c->nodes[*(const int *)a], *y = &c->nodes[*(const int *)b];
    if ((x->id >= 0) != (y->id >= 0))
        return x->id >= 0 ? -1 : 1;
    if (x->saturated != y->saturated)
        return x->saturated ? -1 : 1;
    if (x->occupancy != y->occupancy)
        return x->occupancy < y->occupancy ? 1 : -1;
    return (*(const int *)a > *(const int *)b) - (*(const int *)a < *(const int *)b);
}

static int device_id_cmp(const void *a, const void *b)
{
    const pl_device_t *x = a, *y = b;
    return (x->id > y->id) - (x->id < y->id);
}

/* Orders node indices for the max_devices cut: kept devices first, then
 * saturated, then fullest. Insertion sort: qsort has no context argument in
 * C11 and this runs only when the cap bites. */
static void sort_for_cap(const ctx_t *c, int *order, int n)
{
    for (int i = 1; i < n; i++) {
        int v = order[i], j = i;
        while (j > 0 && node_keep_cmp(&v, &order[j - 1], c) < 0) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = v;
    }
}

static void assemble(ctx_t *c, pl_plan_t *out, const pl_plan_t *prev)
{
    int *order = sq_xmalloc(sizeof(*order) * (size_t)(c->nnodes ? c->nnodes : 1));
    int nlive = 0;
    for (int i = 0; i < c->nnodes; i++)
        if (c->nodes[i].nitems > 0)
            order[nlive++] = i;
    int keep = nlive;
    if (c->opt.max_devices > 0 && nlive > c->opt.max_devices) {
        sort_for_cap(c, order, nlive);
        keep = c->opt.max_devices;
        for (int k = keep; k < nlive; k++) {
            const node_t *n = &c->nodes[order[k]];
            for (int i = 0; i < n->nitems; i++)
                add_unplaced(c, n->items[i].session, n->items[i].rate_rps, PL_UNPLACED_DEVICES);
        }
    }

    /* New devices take the smallest ids nobody keeps; with links, the ids
     * whose links carry them (assign_links). */
    int idcap = c->nnodes + (prev ? prev->ndevices : 0) + 1;
    if (c->opt.nlinks > 0)
        idcap = c->opt.max_devices > 0 ? c->opt.max_devices : idcap + c->opt.nlinks;
    char *used = sq_xcalloc((size_t)idcap + 1, 1);
    if (c->opt.nlinks > 0) {
        assign_links(c, order, &keep, used, idcap);
    }
    for (int k = 0; k < keep; k++) {
        int id = c->nodes[order[k]].id;
        if (id >= 0 && id < idcap)
            used[id] = 1;
    }
    int next_id = 0;
    out->ndevices = keep;
    out->devices = sq_xcalloc((size_t)(keep ? keep : 1), sizeof(*out->devices));
    for (int k = 0; k < keep; k++) {
        node_t *n = &c->nodes[order[k]];
        pl_device_t *d = &out->devices[k];
        if (n->id < 0) {
            while (used[next_id])
                next_id++;
            n->id = next_id++;
        }
        d->id = n->id;
        d->saturated = n->saturated;
        d->duty_cycle_us = n->duty_cycle_us;
        d->occupancy = n->occupancy;
        d->memory_bytes = n->memory_bytes;
        pl_link_t link = link_of(&c->opt, n->id);
        d->rtt_us = link.rtt_us;
        d->bytes_per_us = link.bytes_per_us;
        d->nallocs = n->nitems;
        d->allocs = sq_xmalloc(sizeof(*d->allocs) * (size_t)n->nitems);
        for (int i = 0; i < n->nitems; i++) {
            const item_t *it = &n->items[i];
            d->allocs[i] = (pl_alloc_t){.session = it->session,
                                        .session_id = c->sessions[it->session].id,
                                        .model = c->sessions[it->session].model,
                                        .batch = it->batch,
                                        .latency_us = it->latency_us,
                                        .transfer_us = it->transfer_us,
                                        .rate_rps = it->rate_rps};
        }
    }
    qsort(out->devices, (size_t)keep, sizeof(*out->devices), device_id_cmp);

    int nun = 0;
    for (int s = 0; s < c->nsessions; s++)
        nun += c->unplaced_reason[s] != 0;
    out->nunplaced = nun;
    out->unplaced = sq_xcalloc((size_t)(nun ? nun : 1), sizeof(*out->unplaced));
    for (int s = 0, k = 0; s < c->nsessions; s++) {
        if (!c->unplaced_reason[s])
            continue;
        out->unplaced[k++] = (pl_unplaced_t){.session = s,
                                             .session_id = c->sessions[s].id,
                                             .rate_rps = c->unplaced_rate[s],
                                             .reason = c->unplaced_reason[s]};
    }

    if (prev) {
        int np = 0;
        for (int i = 0; i < prev->ndevices; i++)
            np += prev->devices[i].nallocs;
        pair_t *pairs = sq_xmalloc(sizeof(*pairs) * (size_t)(np ? np : 1));
        for (int i = 0, k = 0; i < prev->ndevices; i++)
            for (int a = 0; a < prev->devices[i].nallocs; a++)
                pairs[k++] = (pair_t){prev->devices[i].id, prev->devices[i].allocs[a].session_id};
        qsort(pairs, (size_t)np, sizeof(*pairs), pair_cmp);
        for (int i = 0; i < out->ndevices; i++) {
            for (int a = 0; a < out->devices[i].nallocs; a++) {
                pair_t key = {out->devices[i].id, out->devices[i].allocs[a].session_id};
                if (!bsearch(&key, pairs, (size_t)np, sizeof(*pairs), pair_cmp))
                    out->moved++;
            }
        }
        free(pairs);
        for (int i = 0; i < prev->ndevices; i++) {
            pl_device_t key = {.id = prev->devices[i].id};
            if (!bsearch(&key, out->devices, (size_t)out->ndevices, sizeof(*out->devices),
                         device_id_cmp))
                out->released++;
        }
    } else {
        out->moved = 0;
        for (int i = 0; i < out->ndevices; i++)
            out->moved += out->devices[i].nallocs;
    }
    free(used);
    free(order);
}

int pl_plan(pl_plan_t *out, const pl_session_t *sessions, int nsessions, const pl_plan_t *prev,
            const pl_options_t *opt)
{
    memset(out, 0, sizeof(*out));
    if (nsessions < 0 || (nsessions > 0 && !sessions) || !opt)
        return SQ_INVAL;
    for (int i = 0; i < nsessions; i++) {
        const pl_session_t *s = &sessions[i];
        if (!s->profile || !(s->slo_us > 0) || !(s->rate_rps >= 0) || !isfinite(s->rate_rps) ||
            !(s->item_bytes >= 0) || !isfinite(s->item_bytes))
            return SQ_INVAL;
    }
    if (opt->nlinks < 0 || (opt->nlinks > 0 && !opt->links))
        return SQ_INVAL;
    for (int k = 0; k < opt->nlinks; k++) {
        pl_link_t l = opt->links[k];
        if (!(l.rtt_us >= 0) || !isfinite(l.rtt_us) || !(l.bytes_per_us >= 0) ||
            !isfinite(l.bytes_per_us))
            return SQ_INVAL;
    }
    if (nsessions > 1) {
        idmap_t *m = sq_xmalloc(sizeof(*m) * (size_t)nsessions);
        for (int i = 0; i < nsessions; i++)
            m[i] = (idmap_t){sessions[i].id, i};
        qsort(m, (size_t)nsessions, sizeof(*m), idmap_cmp);
        int dup = 0;
        for (int i = 1; i < nsessions; i++)
            dup |= m[i].id == m[i - 1].id;
        free(m);
        if (dup)
            return SQ_INVAL;
    }

    ctx_t c = {.sessions = sessions, .nsessions = nsessions, .opt = *opt};
    size_t ns = (size_t)(nsessions ? nsessions : 1);
    c.unplaced_rate = sq_xcalloc(ns, sizeof(*c.unplaced_rate));
    c.unplaced_reason = sq_xcalloc(ns, sizeof(*c.unplaced_reason));
    burst_init(&c.burst, opt->burst_quantile);
    c.rate = sq_xcalloc(ns, sizeof(*c.rate));
    c.pooled = sq_xcalloc(ns, 1);
    for (int s = 0; s < nsessions; s++)
        packed_rate(&c, s);

    pool_t pool = {0};
    if (prev)
        out->evicted = keep_previous(&c, prev, &pool);
    else
        for (int s = 0; s < nsessions; s++)
            pool_add(&pool, s, c.rate[s]);

    int nkept = c.nnodes;
    item_t *residual = sq_xmalloc(sizeof(*residual) * (size_t)(pool.n ? pool.n : 1));
    int nres = 0;
    for (int i = 0; i < pool.n; i++)
        nres += pack_share(&c, pool.v[i].session, pool.v[i].rate_rps, &residual[nres]);
    qsort(residual, (size_t)nres, sizeof(*residual), item_cmp_occ_desc);

    binlist_t bins = {0};
    for (int i = 0; i < nkept; i++) {
        node_t *n = &c.nodes[i];
        if (!n->saturated && n->nitems > 0)
            bins_insert(&bins, &c, i);
    }
    for (int i = 0; i < nres; i++)
        place_item(&c, &bins, &residual[i]);
    consolidate(&c, &bins);

    assemble(&c, out, prev);
    add_overflow(&c, out);
    out->lower_bound_devices = pl_lower_bound(sessions, nsessions, opt);

    free(bins.idx);
    free(residual);
    free(pool.v);
    for (int i = 0; i < c.nnodes; i++)
        free(c.nodes[i].items);
    free(c.nodes);
    free(c.scratch);
    free(c.unplaced_rate);
    free(c.unplaced_reason);
    free(c.rate);
    free(c.pooled);
    free(c.burst.lam_max);
    return 0;
}

void pl_plan_dispose(pl_plan_t *plan)
{
    if (!plan)
        return;
    for (int i = 0; i < plan->ndevices; i++)
        free(plan->devices[i].allocs);
    free(plan->devices);
    free(plan->unplaced);
    free(plan->overflow);
    memset(plan, 0, sizeof(*plan));
}
