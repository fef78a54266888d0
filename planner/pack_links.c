/* Devices behind links (pl_options_t.links): which device gets which node
 * when some are remote (a batch's transfer counts in its latency), and
 * overflow routes on spare devices (pl_options_t.overflow). */
#include "pack_int.h"

#include <sq.h>

#include <assert.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- links (pl.h: devices behind a link) ---------------------------------- */

pl_link_t pl__link_of(const pl_options_t *o, int id)
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
                !pl__fits_memory(&c->opt, pl_memory_bytes(s->profile, b)))
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
            int b = pl__share_batch(c, it[i].session, d, it[i].rate_rps);
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
            if (sum > d + TIME_EPS_US ||
                !pl__fits_memory(&c->opt, pl__items_memory(c, it, n->nitems)))
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
void pl__assign_links(ctx_t *c, int *order, int *keep, const char *used, int ids_limit)
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
        double occ = eval_on_link(c, n, pl__link_of(&c->opt, n->id), tmp, &duty, &partial);
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
        pl_link_t l = pl__link_of(&c->opt, id);
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
                pl__add_unplaced(c, n->items[it].session, n->items[it].rate_rps, PL_UNPLACED_LINK);
            n->nitems = 0; /* leaves the plan below */
            continue;
        }
        n->id = cls[pick].ids[cls[pick].next++];
        double duty;
        int partial;
        double occ = eval_on_link(c, n, cls[pick].link, tmp, &duty, &partial);
        if (partial)
            pl__add_unplaced(c, n->items[0].session, n->items[0].rate_rps - tmp[0].rate_rps,
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
        if (!pl__fits_memory(&c->opt, pl_memory_bytes(ss->profile, b)))
            break;
        best = b;
    }
    return best;
}

/* What the overflow passes know of each session: overflow_batch on the last
 * link asked (devices mostly share one link, so it is computed once a
 * session, not once a session and device) and its model as a dense index
 * (model ids are any ints). At 10,000 sessions and 2,000 devices these
 * passes were the whole plan's time. */
typedef struct {
    int *model_ix; /* session -> 0..nmodels-1 */
    int nmodels;
    pl_link_t *link; /* session -> link of its cached batch */
    int *batch;      /* session -> overflow_batch on link[s], -1 none yet */
} ovf_cache_t;

static int int_cmp(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

static void ovf_cache_init(ovf_cache_t *oc, const ctx_t *c)
{
    int n = c->nsessions;
    int *ids = sq_xmalloc(sizeof(int) * (size_t)(n ? n : 1));
    for (int s = 0; s < n; s++)
        ids[s] = c->sessions[s].model;
    qsort(ids, (size_t)n, sizeof(int), int_cmp);
    int nm = 0;
    for (int s = 0; s < n; s++)
        if (nm == 0 || ids[nm - 1] != ids[s])
            ids[nm++] = ids[s];
    oc->nmodels = nm;
    oc->model_ix = sq_xmalloc(sizeof(int) * (size_t)(n ? n : 1));
    for (int s = 0; s < n; s++) {
        const int *hit = bsearch(&c->sessions[s].model, ids, (size_t)nm, sizeof(int), int_cmp);
        oc->model_ix[s] = (int)(hit - ids);
    }
    free(ids);
    oc->link = sq_xcalloc((size_t)(n ? n : 1), sizeof(*oc->link));
    oc->batch = sq_xmalloc(sizeof(int) * (size_t)(n ? n : 1));
    for (int s = 0; s < n; s++)
        oc->batch[s] = -1;
}

static void ovf_cache_free(ovf_cache_t *oc)
{
    free(oc->model_ix);
    free(oc->link);
    free(oc->batch);
}

static int ovf_batch(ovf_cache_t *oc, const ctx_t *c, int s, pl_link_t l)
{
    if (oc->batch[s] < 0 || !link_eq(oc->link[s], l)) {
        oc->batch[s] = overflow_batch(c, s, l);
        oc->link[s] = l;
    }
    return oc->batch[s];
}

/* At most this many devices take the overflow of each of n sessions (pl.h:
 * pl_options_t.overflow_devices): every device while n x devices stays
 * within PL_OVERFLOW_ROUTES, else dealt round, at least PL_OVERFLOW_DEVICES
 * a session (at 10,000 sessions on 2,000 devices every spare holding every
 * session made plans of tens of millions of routes). */
static int overflow_fanout(const ctx_t *c, int n)
{
    if (c->opt.overflow_devices > 0)
        return c->opt.overflow_devices;
    int f = n > 0 ? PL_OVERFLOW_ROUTES / n : PL_OVERFLOW_ROUTES;
    return f > PL_OVERFLOW_DEVICES ? f : PL_OVERFLOW_DEVICES;
}

/* Where session k of the rank starts among n devices: 0 while each session
 * takes them all, else dealt round by fan-out. */
static int deal_start(int k, int n, int fanout)
{
    return n <= fanout ? 0 : (int)(((long long)k * fanout) % n);
}

typedef struct {
    int occ_ix;
    double occupancy;
} by_occ_t;

static int by_occ_cmp(const void *a, const void *b)
{
    const by_occ_t *x = a, *y = b;
    if (x->occupancy != y->occupancy)
        return x->occupancy < y->occupancy ? -1 : 1;
    return (x->occ_ix > y->occ_ix) - (x->occ_ix < y->occ_ix);
}

/* Devices short (load left unplaced for want of devices): planned devices
 * that do not hold such a session also take its overflow, least occupied
 * first, as memory allows, at most the fan-out of them a session:
 * Symphony's matchmaking over workers that can hold the model, rather than
 * certain loss. */
static void overflow_onto_planned(const ctx_t *c, pl_plan_t *out, const busy_t *rank,
                                  ovf_cache_t *oc)
{
    int nd = out->ndevices ? out->ndevices : 1;
    by_occ_t *occ = sq_xmalloc(sizeof(*occ) * (size_t)nd);
    for (int i = 0; i < out->ndevices; i++)
        occ[i] = (by_occ_t){.occ_ix = i, .occupancy = out->devices[i].occupancy};
    qsort(occ, (size_t)out->ndevices, sizeof(*occ), by_occ_cmp);
    double *extra = sq_xcalloc((size_t)nd, sizeof(double));
    /* Which models each planned device holds, by its allocations and by the
     * overflow given to it so far (one bit per device and model). */
    size_t words = ((size_t)oc->nmodels + 63) / 64;
    uint64_t *there = NULL;
    int nshort = 0, nall = 0;
    for (int k = 0; k < c->nsessions; k++)
        nall += c->unplaced_reason[k] == PL_UNPLACED_DEVICES;
    int fanout = overflow_fanout(c, nall);
    for (int k = 0; k < c->nsessions; k++) {
        int s = rank[k].session;
        if (c->unplaced_reason[s] != PL_UNPLACED_DEVICES)
            continue;
        if (there == NULL) {
            there = sq_xcalloc((size_t)nd * (words ? words : 1), sizeof(uint64_t));
            for (int i = 0; i < out->ndevices; i++)
                for (int a = 0; a < out->devices[i].nallocs; a++) {
                    int mi = oc->model_ix[out->devices[i].allocs[a].session];
                    there[(size_t)i * words + (size_t)mi / 64] |= 1ull << (mi % 64);
                }
        }
        int mi = oc->model_ix[s], taken = 0;
        int start = deal_start(nshort++, out->ndevices, fanout);
        for (int t = 0; t < out->ndevices && taken < fanout; t++) {
            int i = occ[(start + t) % out->ndevices].occ_ix;
            const pl_device_t *d = &out->devices[i];
            int holds = 0;
            for (int a = 0; a < d->nallocs; a++)
                holds |= d->allocs[a].session == s;
            if (holds)
                continue;
            uint64_t *bits = &there[(size_t)i * words + (size_t)mi / 64];
            int model_there = (*bits >> (mi % 64)) & 1;
            int b = ovf_batch(oc, c, s, pl__link_of(&c->opt, d->id));
            if (b == 0)
                continue;
            double more = model_there ? 0 : pl_memory_bytes(c->sessions[s].profile, b);
            if (!pl__fits_memory(&c->opt, d->memory_bytes + extra[i] + more))
                continue;
            extra[i] += more;
            *bits |= 1ull << (mi % 64);
            taken++;
            out->overflow[out->noverflow++] = (pl_overflow_t){.device_id = d->id,
                                                              .session = s,
                                                              .session_id = c->sessions[s].id,
                                                              .model = c->sessions[s].model};
        }
    }
    free(there);
    free(occ);
    free(extra);
}

/* A spare device's memory as sessions are dealt to it: weights once per
 * model, activations at its largest batch. */
typedef struct {
    double mem;
    int n, cap;
    int *model_ix, *batch;
} spare_t;

typedef struct {
    int device_id;
    int k; /* rank position */
    int s;
} spare_pick_t;

static int spare_pick_cmp(const void *a, const void *b)
{
    const spare_pick_t *x = a, *y = b;
    if (x->device_id != y->device_id)
        return (x->device_id > y->device_id) - (x->device_id < y->device_id);
    return (x->k > y->k) - (x->k < y->k);
}

void pl__add_overflow(const ctx_t *c, pl_plan_t *out)
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
    ovf_cache_t oc;
    ovf_cache_init(&oc, c);
    /* The sessions with planned load, in rank order (sorted: the rest has
     * none). */
    int nloaded = 0;
    while (nloaded < c->nsessions && rank[nloaded].load > 0 &&
           c->sessions[rank[nloaded].session].rate_rps > 0)
        nloaded++;
    char *used = sq_xcalloc((size_t)maxd, 1);
    for (int i = 0; i < out->ndevices; i++)
        if (out->devices[i].id >= 0 && out->devices[i].id < maxd)
            used[out->devices[i].id] = 1;
    int *spare_id = sq_xmalloc(sizeof(int) * (size_t)maxd);
    int nspare = 0;
    for (int id = 0; id < maxd; id++)
        if (!used[id])
            spare_id[nspare++] = id;
    int fanout = overflow_fanout(c, nloaded);
    size_t per = (size_t)(nspare < fanout ? nspare : fanout);
    int nshort = 0;
    for (int s = 0; s < c->nsessions; s++)
        nshort += c->unplaced_reason[s] == PL_UNPLACED_DEVICES;
    int fshort = overflow_fanout(c, nshort);
    size_t cap = per * (size_t)nloaded +
                 (size_t)(out->ndevices < fshort ? out->ndevices : fshort) * (size_t)nshort;
    out->overflow = sq_xcalloc(cap ? cap : 1, sizeof(*out->overflow));
    /* The loaded sessions, busiest first, each dealt up to fan-out spares
     * as their memory allows; then listed by spare id, busiest first. */
    spare_t *sp = sq_xcalloc((size_t)(nspare ? nspare : 1), sizeof(*sp));
    spare_pick_t *pick = sq_xmalloc(sizeof(*pick) * (per * (size_t)nloaded + 1));
    size_t npick = 0;
    for (int k = 0; k < nloaded && nspare > 0; k++) {
        int s = rank[k].session, taken = 0;
        const pl_profile_t *p = c->sessions[s].profile;
        int mi = oc.model_ix[s];
        int start = deal_start(k, nspare, fanout);
        for (int t = 0; t < nspare && taken < fanout; t++) {
            int j = (start + t) % nspare;
            spare_t *d = &sp[j];
            int b = ovf_batch(&oc, c, s, pl__link_of(&c->opt, spare_id[j]));
            if (b == 0)
                continue;
            int m = 0;
            while (m < d->n && d->model_ix[m] != mi)
                m++;
            double more = m < d->n ? (b > d->batch[m]
                                          ? pl_memory_bytes(p, b) - pl_memory_bytes(p, d->batch[m])
                                          : 0)
                                   : pl_memory_bytes(p, b);
            if (!pl__fits_memory(&c->opt, d->mem + more))
                continue;
            d->mem += more;
            if (m == d->n) {
                if (d->n == d->cap) {
                    d->cap = d->cap ? 2 * d->cap : 8;
                    d->model_ix = sq_xrealloc(d->model_ix, sizeof(int) * (size_t)d->cap);
                    d->batch = sq_xrealloc(d->batch, sizeof(int) * (size_t)d->cap);
                }
                d->model_ix[d->n] = mi;
                d->batch[d->n++] = b;
            } else if (b > d->batch[m]) {
                d->batch[m] = b;
            }
            pick[npick++] = (spare_pick_t){.device_id = spare_id[j], .k = k, .s = s};
            taken++;
        }
    }
    qsort(pick, npick, sizeof(*pick), spare_pick_cmp);
    for (size_t i = 0; i < npick; i++)
        out->overflow[out->noverflow++] = (pl_overflow_t){.device_id = pick[i].device_id,
                                                          .session = pick[i].s,
                                                          .session_id = c->sessions[pick[i].s].id,
                                                          .model = c->sessions[pick[i].s].model};
    for (int j = 0; j < nspare; j++) {
        free(sp[j].model_ix);
        free(sp[j].batch);
    }
    free(sp);
    free(pick);
    free(spare_id);
    overflow_onto_planned(c, out, rank, &oc);
    ovf_cache_free(&oc);
    free(used);
    free(rank);
}
