/* Devices being built (nodes of items, one per session share) and how they
 * fill: residual shares, the merge of Nexus's Algorithm 1 (best fit
 * decreasing by occupancy, duty cycle the least of the two, memory
 * checked) and incremental re-planning that keeps the previous plan's
 * placements that still fit. */
#include "pack_int.h"

#include <sq.h>

#include <assert.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

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
double pl__items_memory(const ctx_t *c, const item_t *it, int n)
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
int pl__share_batch(const ctx_t *c, int s, double duty_us, double rate_rps)
{
    return c->pooled[s] ? pl__batch_for(duty_us, rate_rps)
                        : pl__burst_batch(&c->burst, duty_us, rate_rps, c->sessions[s].dispersion);
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
        int b = pl__share_batch(c, it[i].session, d, it[i].rate_rps);
        double l = pl_latency_us(s->profile, b, c->opt.k_std);
        if (l <= 0 || d + l > s->slo_us + TIME_EPS_US)
            return -1;
        it[i].batch = b;
        it[i].latency_us = l;
        sum += l;
    }
    if (sum > d + TIME_EPS_US)
        return -1;
    double mem = pl__items_memory(c, it, n);
    if (!pl__fits_memory(&c->opt, mem))
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

void pl__add_unplaced(ctx_t *c, int s, double rate, int reason)
{
    c->unplaced_rate[s] += rate;
    if (!c->unplaced_reason[s])
        c->unplaced_reason[s] = reason;
}

/* Saturate and residue for one share of a session (Algorithm 1, lines 1-9):
 * whole devices at the saturation batch, the rest as one residual item
 * returned in *res (1) or none (0). */
int pl__pack_share(ctx_t *c, int s, double rate, item_t *res)
{
    const pl_session_t *ss = &c->sessions[s];
    const pl_options_t *o = &c->opt;
    int B;
    double thr =
        pl_max_throughput_rps(ss->profile, ss->slo_us, o->k_std, o->device_memory_bytes, &B);
    if (thr <= 0) {
        int b2;
        int slo_ok = pl_max_throughput_rps(ss->profile, ss->slo_us, o->k_std, 0, &b2) > 0;
        pl__add_unplaced(c, s, rate, slo_ok ? PL_UNPLACED_MEMORY : PL_UNPLACED_SLO);
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
    if (pl__residue(share_burst(c, s), ss->dispersion, ss->profile, ss->slo_us, left, o->k_std,
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
void pl__packed_rate(ctx_t *c, int s)
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
    double sat = pl__clumped(ss->dispersion)
                     ? ss->dispersion * pl__poisson_quantile(lambda / ss->dispersion, &c->burst) /
                           ss->slo_us * 1e6
                     : pl__poisson_quantile(lambda, &c->burst) / ss->slo_us * 1e6;
    if (sat >= thr * (1 - REL_EPS)) {
        c->rate[s] = sat;
        c->pooled[s] = 1;
    }
}

double pl__eval_items(const ctx_t *c, item_t *it, int n, double *duty_out, double *mem_out)
{
    return eval_items(c, it, n, duty_out, mem_out);
}

/* ---- merge: best-fit decreasing by occupancy ------------------------------ */

void pl__bins_insert(binlist_t *bl, const ctx_t *c, int node)
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
    pl__bins_insert(bl, c, node);
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
void pl__consolidate(ctx_t *c, binlist_t *bl)
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
            pl__bins_insert(bl, c, undo_node[m]);
        }
        pl__bins_insert(bl, c, src);
    }
    free(order);
    free(undo_node);
    free(undo_count);
}

void pl__place_item(ctx_t *c, binlist_t *bl, const item_t *it)
{
    put_item(c, bl, it, best_bin(c, bl, it));
}

int pl__item_cmp_occ_desc(const void *a, const void *b)
{
    const item_t *x = a, *y = b;
    if (x->solo_occupancy != y->solo_occupancy)
        return x->solo_occupancy < y->solo_occupancy ? 1 : -1;
    return (x->session > y->session) - (x->session < y->session);
}

/* ---- incremental: keep what still fits ------------------------------------ */

int pl__idmap_cmp(const void *a, const void *b)
{
    const idmap_t *x = a, *y = b;
    return (x->id > y->id) - (x->id < y->id);
}

static int idmap_find(const idmap_t *map, int n, int id)
{
    idmap_t key = {.id = id};
    const idmap_t *f = bsearch(&key, map, (size_t)n, sizeof(*map), pl__idmap_cmp);
    return f ? f->index : -1;
}

void pl__pool_add(pool_t *p, int s, double rate)
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
        pl__pool_add(pool, n->items[victim].session, n->items[victim].rate_rps);
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
int pl__keep_previous(ctx_t *c, const pl_plan_t *prev, pool_t *pool)
{
    int ns = c->nsessions;
    idmap_t *map = sq_xmalloc(sizeof(*map) * (size_t)(ns ? ns : 1));
    for (int i = 0; i < ns; i++)
        map[i] = (idmap_t){c->sessions[i].id, i};
    qsort(map, (size_t)ns, sizeof(*map), pl__idmap_cmp);
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
                    pl__pool_add(pool, s, whole * thr);
                left[s] = 0;
                has_residual[s] = 1;
                if (share == 0 && c->rate[s] > 0)
                    continue;
                item_t it = {.session = s, .rate_rps = share};
                int b;
                if (pl__residue(share_burst(c, s), ss->dispersion, ss->profile, ss->slo_us, share,
                                c->opt.k_std, c->opt.device_memory_bytes, &b, &it.solo_duty_us,
                                &it.solo_occupancy) < 0) {
                    pl__pool_add(pool, s, share);
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
            pl__pool_add(pool, s, left[s]);
    }
    free(map);
    free(left);
    free(has_residual);
    return evicted;
}
