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
            int b = overflow_batch(c, s, pl__link_of(&c->opt, d->id));
            if (b == 0)
                continue;
            double more = model_there ? 0 : pl_memory_bytes(c->sessions[s].profile, b);
            if (!pl__fits_memory(&c->opt, d->memory_bytes + extra[i] + more))
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
        pl_link_t l = pl__link_of(&c->opt, id);
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
            if (!pl__fits_memory(&c->opt, mem + more))
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
