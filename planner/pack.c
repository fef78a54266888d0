/* Squishy bin packing (Nexus section 6.1, Algorithm 1) with the merge rule
 * generalized to many sessions per device, a memory check, and incremental
 * re-planning between epochs: pl_plan assembles a plan from the shares of
 * pack_nodes.c, on the devices of pack_links.c. See pl.h for the validity
 * rules. */
#include "pack_int.h"

#include <sq.h>

#include <assert.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* The first share of session s on the cut devices that is not a whole
 * device of its own, or NULL. */
static const item_t *cut_share(const ctx_t *c, int s, const int *cut, int ncut)
{
    for (int k = 0; k < ncut; k++) {
        const node_t *n = &c->nodes[cut[k]];
        for (int i = 0; i < n->nitems && !n->saturated; i++)
            if (n->items[i].session == s)
                return &n->items[i];
    }
    return NULL;
}

/* What blocks u (pl_unplaced_t): its least needs, and for a session the
 * cap cut, the planned device it came closest to sharing. A device with
 * room for its share of a cycle (occupancy) whose cycle, set by the
 * tightest SLO there, cannot hold its batch beside the others makes it
 * DUTY_CYCLE: the devices are not short of time but of a cycle they can
 * share. Only the words change; the packing and the overflow see
 * DEVICES. */
static void explain_unplaced(const ctx_t *c, pl_unplaced_t *u, const int *order, int keep,
                             const int *cut, int ncut)
{
    const pl_session_t *ss = &c->sessions[u->session];
    double k_std = c->opt.k_std;
    u->need_us = pl_latency_us(ss->profile, 1, k_std);
    u->need_bytes = pl_memory_bytes(ss->profile, 1);
    u->device_memory_bytes = c->opt.device_memory_bytes;
    u->device_id = u->blocker_session = u->blocker_session_id = -1;
    if (u->reason != PL_UNPLACED_DEVICES)
        return;
    const item_t *mine = cut_share(c, u->session, cut, ncut);
    if (mine == NULL)
        return; /* whole devices' worth, or its share was never cut */
    int best = -1, best_room = 0, best_blocker = -1;
    double best_cycle = 0, best_reserved = 0;
    for (int k = 0; k < keep; k++) {
        const node_t *n = &c->nodes[order[k]];
        if (n->saturated || n->nitems == 0)
            continue;
        double d = mine->solo_duty_us;
        int blocker = u->session;
        for (int i = 0; i < n->nitems; i++)
            if (n->items[i].solo_duty_us < d) {
                d = n->items[i].solo_duty_us;
                blocker = n->items[i].session;
            }
        double reserved = 0;
        for (int i = 0; i < n->nitems; i++) {
            int si = n->items[i].session;
            int b = pl__share_batch(c, si, d, n->items[i].rate_rps);
            double l = pl_latency_us(c->sessions[si].profile, b, k_std);
            reserved += (l > 0 ? l : 0) + n->items[i].transfer_us;
        }
        int room = n->occupancy + mine->solo_occupancy <= 1 + REL_EPS;
        if (best < 0 || (room && !best_room) ||
            (room == best_room && n->occupancy < c->nodes[order[best]].occupancy)) {
            best = k;
            best_room = room;
            best_cycle = d;
            best_reserved = reserved;
            best_blocker = blocker;
        }
    }
    if (best < 0)
        return;
    const node_t *n = &c->nodes[order[best]];
    const pl_session_t *bs = &c->sessions[best_blocker];
    int b = pl__share_batch(c, u->session, best_cycle, mine->rate_rps);
    double l = pl_latency_us(ss->profile, b, k_std);
    double need = l > u->need_us ? l : u->need_us;
    u->device_id = n->id;
    u->cycle_us = best_cycle;
    u->reserved_us = best_reserved;
    u->free_bytes =
        c->opt.device_memory_bytes > 0 ? c->opt.device_memory_bytes - n->memory_bytes : 0;
    u->blocker_session = best_blocker;
    u->blocker_session_id = bs->id;
    u->blocker_slo_us = bs->slo_us;
    /* The cycle that holds its batch beside the others', and the SLO that
     * lets the blocker run its own batch after such a cycle. */
    double cycle_needed = best_reserved + need;
    double blocker_l =
        best_blocker == u->session
            ? need
            : pl_latency_us(bs->profile,
                            pl__share_batch(c, best_blocker, best_cycle, c->rate[best_blocker]),
                            k_std);
    u->slo_needed_us = cycle_needed + (blocker_l > 0 ? blocker_l : 0);
    if (best_room && best_reserved + need > best_cycle + TIME_EPS_US)
        u->reason = PL_UNPLACED_DUTY_CYCLE;
}

static void assemble(ctx_t *c, pl_plan_t *out, const pl_plan_t *prev)
{
    int *order = sq_xmalloc(sizeof(*order) * (size_t)(c->nnodes ? c->nnodes : 1));
    int nlive = 0;
    for (int i = 0; i < c->nnodes; i++)
        if (c->nodes[i].nitems > 0)
            order[nlive++] = i;
    int keep = nlive, ncut = 0;
    int *cut = NULL;
    if (c->opt.max_devices > 0 && nlive > c->opt.max_devices) {
        sort_for_cap(c, order, nlive);
        keep = c->opt.max_devices;
        ncut = nlive - keep;
        cut = sq_xmalloc(sizeof(*cut) * (size_t)ncut);
        memcpy(cut, order + keep, sizeof(*cut) * (size_t)ncut);
        for (int k = keep; k < nlive; k++) {
            const node_t *n = &c->nodes[order[k]];
            for (int i = 0; i < n->nitems; i++)
                pl__add_unplaced(c, n->items[i].session, n->items[i].rate_rps, PL_UNPLACED_DEVICES);
        }
    }

    /* New devices take the smallest ids nobody keeps; with links, the ids
     * whose links carry them (assign_links). */
    int idcap = c->nnodes + (prev ? prev->ndevices : 0) + 1;
    if (c->opt.nlinks > 0)
        idcap = c->opt.max_devices > 0 ? c->opt.max_devices : idcap + c->opt.nlinks;
    char *used = sq_xcalloc((size_t)idcap + 1, 1);
    if (c->opt.nlinks > 0) {
        pl__assign_links(c, order, &keep, used, idcap);
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
        pl_link_t link = pl__link_of(&c->opt, n->id);
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
        explain_unplaced(c, &out->unplaced[k - 1], order, keep, cut, ncut);
    }
    free(cut);

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
        qsort(m, (size_t)nsessions, sizeof(*m), pl__idmap_cmp);
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
    pl__burst_init(&c.burst, opt->burst_quantile);
    c.rate = sq_xcalloc(ns, sizeof(*c.rate));
    c.pooled = sq_xcalloc(ns, 1);
    for (int s = 0; s < nsessions; s++)
        pl__packed_rate(&c, s);

    pool_t pool = {0};
    if (prev)
        out->evicted = pl__keep_previous(&c, prev, &pool);
    else
        for (int s = 0; s < nsessions; s++)
            pl__pool_add(&pool, s, c.rate[s]);

    int nkept = c.nnodes;
    item_t *residual = sq_xmalloc(sizeof(*residual) * (size_t)(pool.n ? pool.n : 1));
    int nres = 0;
    for (int i = 0; i < pool.n; i++)
        nres += pl__pack_share(&c, pool.v[i].session, pool.v[i].rate_rps, &residual[nres]);
    qsort(residual, (size_t)nres, sizeof(*residual), pl__item_cmp_occ_desc);

    binlist_t bins = {0};
    for (int i = 0; i < nkept; i++) {
        node_t *n = &c.nodes[i];
        if (!n->saturated && n->nitems > 0)
            pl__bins_insert(&bins, &c, i);
    }
    for (int i = 0; i < nres; i++)
        pl__place_item(&c, &bins, &residual[i]);
    pl__consolidate(&c, &bins);

    assemble(&c, out, prev);
    pl__add_overflow(&c, out);
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

/* memcpy of n items, none from NULL (an empty plan's arrays may be). */
static void *dup_items(const void *src, int n, size_t size)
{
    void *out = sq_xmalloc(size * (size_t)(n + 1));
    if (n > 0)
        memcpy(out, src, size * (size_t)n);
    return out;
}

void pl_plan_copy(pl_plan_t *dst, const pl_plan_t *src)
{
    *dst = *src;
    dst->devices = dup_items(src->devices, src->ndevices, sizeof(*src->devices));
    for (int i = 0; i < src->ndevices; i++)
        dst->devices[i].allocs =
            dup_items(src->devices[i].allocs, src->devices[i].nallocs, sizeof(pl_alloc_t));
    dst->unplaced = dup_items(src->unplaced, src->nunplaced, sizeof(*src->unplaced));
    dst->overflow = dup_items(src->overflow, src->noverflow, sizeof(*src->overflow));
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

/* ---- unplaced sessions in words ------------------------------------------- */

const char *pl_unplaced_code(pl_unplaced_reason_t r)
{
    switch (r) {
    case PL_UNPLACED_SLO:
        return "slo";
    case PL_UNPLACED_MEMORY:
        return "memory";
    case PL_UNPLACED_DEVICES:
        return "devices";
    case PL_UNPLACED_LINK:
        return "link";
    case PL_UNPLACED_DUTY_CYCLE:
        return "duty_cycle";
    }
    return "devices";
}

/* Bytes as "3.1 GB" or "120 MB". */
static const char *bytes_words(char *buf, size_t size, double bytes)
{
    if (bytes >= 1e9)
        snprintf(buf, size, "%.1f GB", bytes / 1e9);
    else
        snprintf(buf, size, "%.0f MB", ceil(bytes / 1e6));
    return buf;
}

const char *pl_unplaced_words(char *buf, size_t size, const pl_unplaced_t *u, double slo_us,
                              int ndevices, const char *device, const char *blocker)
{
    const double ms = 1e-3;
    char need_b[32], free_b[32];
    const char *dev = device != NULL ? device : "a device";
    switch (u->reason) {
    case PL_UNPLACED_SLO:
        if (u->need_us > 0)
            snprintf(buf, size,
                     "a batch of one takes %.3g ms and must run within half its SLO of %.3g ms: "
                     "ask for an SLO of %.0f ms or more",
                     u->need_us * ms, slo_us * ms, ceil(2 * u->need_us * ms));
        else
            snprintf(buf, size, "no batch of its model runs within its SLO of %.3g ms",
                     slo_us * ms);
        break;
    case PL_UNPLACED_MEMORY:
        snprintf(buf, size,
                 "memory: its model takes %s at a batch of one, a device has %s: a device with "
                 "more memory, or a smaller model",
                 bytes_words(need_b, sizeof(need_b), u->need_bytes),
                 bytes_words(free_b, sizeof(free_b), u->device_memory_bytes));
        break;
    case PL_UNPLACED_LINK:
        snprintf(buf, size,
                 "no device left whose link carries its batches within its SLO of %.3g ms: "
                 "a longer SLO, or a device nearer",
                 slo_us * ms);
        break;
    case PL_UNPLACED_DUTY_CYCLE:
        if (u->blocker_session == u->session || blocker == NULL)
            snprintf(buf, size,
                     "needs %.3g ms of a duty cycle beside the %.3g ms the sessions on %s take, "
                     "but its SLO of %.3g ms allows a cycle of %.3g ms: ask for an SLO of %.0f ms "
                     "or more, or add a device",
                     u->need_us * ms, u->reserved_us * ms, dev, slo_us * ms, u->cycle_us * ms,
                     ceil(u->slo_needed_us * ms));
        else
            snprintf(buf, size,
                     "needs %.3g ms of a duty cycle, but %s's cycle is at most %.3g ms for %s "
                     "(SLO %.3g ms) and its sessions take %.3g ms of it: ask for an SLO of %.0f ms "
                     "or more for %s, or add a device",
                     u->need_us * ms, dev, u->cycle_us * ms, blocker, u->blocker_slo_us * ms,
                     u->reserved_us * ms, ceil(u->slo_needed_us * ms), blocker);
        break;
    case PL_UNPLACED_DEVICES:
    default:
        if (u->device_id < 0)
            snprintf(buf, size,
                     "its load needs devices of its own and all %d are in use: add a device",
                     ndevices);
        else if (u->free_bytes > 0 && u->need_bytes > u->free_bytes)
            snprintf(buf, size,
                     "memory: %s of %s free on %s, the other devices in use: add a "
                     "device",
                     bytes_words(need_b, sizeof(need_b), u->need_bytes),
                     bytes_words(free_b, sizeof(free_b), u->free_bytes), dev);
        else
            snprintf(buf, size,
                     "all %d devices are in use: the least busy, %s, has %.3g ms of its %.3g ms "
                     "duty cycle taken and it needs %.3g ms: add a device",
                     ndevices, dev, u->reserved_us * ms, u->cycle_us * ms, u->need_us * ms);
        break;
    }
    return buf;
}
