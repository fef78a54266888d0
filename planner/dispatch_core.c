/* The dispatcher core's lowest layer (dispatch_int.h): actions, the
 * latency of a batch on a worker (its link included), the earliest finish
 * of a session's head, pruning what cannot make its deadline, sending a
 * batch, and matchmaking's order among free workers. */
#include "dispatch_int.h"

#include <sq.h>

#include <assert.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- actions ---- */

void pl__begin(pl_dispatch_t *d)
{
    if (d->taken) {
        d->nacts = 0;
        d->nids = 0;
        d->taken = 0;
    }
}

static pl_action_t *push_action(pl_dispatch_t *d, pl_action_kind_t kind, int64_t now_us)
{
    if (d->nacts == d->cap_acts) {
        d->cap_acts = d->cap_acts ? d->cap_acts * 2 : 64;
        d->acts = sq_xrealloc(d->acts, sizeof(*d->acts) * d->cap_acts);
        d->act_ids_off = sq_xrealloc(d->act_ids_off, sizeof(size_t) * d->cap_acts);
    }
    pl_action_t *a = &d->acts[d->nacts];
    memset(a, 0, sizeof(*a));
    a->kind = kind;
    a->at_us = now_us;
    a->session = -1;
    a->worker = -1;
    d->act_ids_off[d->nacts] = 0;
    d->nacts++;
    return a;
}

/* Ends every mutating call: the caller's single timer follows the earliest
 * wake of both heaps, and is only re-armed when that moment changes. */
void pl__finish(pl_dispatch_t *d)
{
    int64_t a = sq_iheap_top_key(&d->session_wake, PL_NEVER),
            b = sq_iheap_top_key(&d->worker_wake, PL_NEVER);
    int64_t wake = a < b ? a : b;
    if (wake != d->armed_us) {
        d->armed_us = wake;
        push_action(d, PL_ACT_TIMER, wake)->at_us = wake;
    }
}

void pl__drop(pl_dispatch_t *d, int64_t now_us, int sid, const pl__entry_t *e, int reason)
{
    pl_action_t *a = push_action(d, PL_ACT_DROP, now_us);
    a->session = sid;
    a->request_id = e->id;
    a->deadline_us = e->deadline_us;
    a->reason = reason;
    d->stats.dropped++;
    d->stats.queued--;
}

/* ---- latency helpers ---- */

/* Nexus's saturated batch: the largest b with 2 l(b) <= SLO (a request that
 * just misses a batch waits one batch, then runs in the next). Behind a link
 * the batch it waits for is l(b) and its own costs l(b) + net(b) (the link
 * carries batch k+1 while batch k runs). */
int pl__default_target(const pl_dispatch_t *d, const session_t *s, net_t n)
{
    if (s->slo_us <= 0)
        return s->cap;
    int best = 1;
    for (int b = 1; b <= s->cap; b++) {
        int64_t l = s->cost[b] - d->opts.net_delay_us;
        if (2 * l + d->opts.net_delay_us + net_cost(n, b) <= s->slo_us)
            best = b;
    }
    return best;
}

/* ---- workers and sessions ---- */

void pl__worker_set_busy(pl_dispatch_t *d, int wid, int64_t until_us)
{
    worker_t *w = &d->workers[wid];
    w->busy = 1;
    w->busy_until = until_us;
    d->busy_bits[wid >> 6] |= UINT64_C(1) << (wid & 63);
    if (d->any_net)
        return; /* the heaps serve only a cluster without links */
    for (int k = 0; k < w->nsess; k++) {
        session_t *s = &d->sessions[w->sess[k].session];
        if (s->busy_kept)
            sq_iheap_set(&s->busy_heap, wid, until_us);
    }
}

void pl__worker_set_free(pl_dispatch_t *d, int wid)
{
    worker_t *w = &d->workers[wid];
    w->busy = 0;
    d->busy_bits[wid >> 6] &= ~(UINT64_C(1) << (wid & 63));
    if (d->any_net)
        return;
    for (int k = 0; k < w->nsess; k++) {
        session_t *s = &d->sessions[w->sess[k].session];
        if (s->busy_kept)
            sq_iheap_remove(&s->busy_heap, wid);
    }
}

void pl__routes_index(pl_dispatch_t *d, session_t *s)
{
    while (s->busy_heap.n > 0)
        sq_iheap_remove(&s->busy_heap, sq_iheap_top(&s->busy_heap));
    int words = s->nroutes > 0 ? (s->routes[s->nroutes - 1].worker >> 6) + 1 : 0;
    if (words > s->nroute_words)
        s->route_bits = sq_xrealloc(s->route_bits, sizeof(uint64_t) * (size_t)words);
    s->nroute_words = words;
    if (words > 0)
        memset(s->route_bits, 0, sizeof(uint64_t) * (size_t)words);
    s->busy_kept = s->nroutes >= PL__HEAP_MIN_ROUTES;
    if (s->busy_kept)
        sq_iheap_reserve(&s->busy_heap, d->nworkers);
    for (int i = 0; i < s->nroutes; i++) {
        int wid = s->routes[i].worker;
        s->route_bits[wid >> 6] |= UINT64_C(1) << (wid & 63);
        if (d->workers[wid].busy && s->busy_kept && !d->any_net)
            sq_iheap_set(&s->busy_heap, wid, d->workers[wid].busy_until);
    }
}

int pl__index_ok(const pl_dispatch_t *d)
{
    for (int wid = 0; wid < d->nworkers; wid++)
        if (((d->busy_bits[wid >> 6] >> (wid & 63)) & 1) != (uint64_t)(d->workers[wid].busy != 0))
            return 0;
    for (int sid = 0; sid < d->nsessions; sid++) {
        const session_t *s = &d->sessions[sid];
        int nbusy = 0, nbits = 0;
        for (int i = 0; i < s->nroutes; i++) {
            int wid = s->routes[i].worker;
            const worker_t *w = &d->workers[wid];
            if ((wid >> 6) >= s->nroute_words || !((s->route_bits[wid >> 6] >> (wid & 63)) & 1))
                return 0;
            if (d->any_net || !s->busy_kept)
                continue;
            if (w->busy != sq_iheap_has(&s->busy_heap, wid))
                return 0;
            if (w->busy && s->busy_heap.key[wid] != w->busy_until)
                return 0;
            nbusy += w->busy != 0;
        }
        for (int wd = 0; wd < s->nroute_words; wd++)
            nbits += __builtin_popcountll(s->route_bits[wd]);
        if (nbits != s->nroutes || (!d->any_net && s->busy_kept && nbusy != s->busy_heap.n))
            return 0;
    }
    return 1;
}

worker_t *pl__worker_get(pl_dispatch_t *d, int wid)
{
    if (wid < 0 || wid >= d->nworkers || !d->workers[wid].present)
        return NULL;
    return &d->workers[wid];
}

session_t *pl__session_get(pl_dispatch_t *d, int sid)
{
    if (sid < 0 || sid >= d->nsessions || !d->sessions[sid].alive)
        return NULL;
    return &d->sessions[sid];
}

int64_t pl__earliest_finish1_net(const pl_dispatch_t *d, const session_t *s, int64_t now_us,
                                 int *free_worker)
{
    int64_t best = PL_NEVER, best_key = PL_NEVER;
    *free_worker = -1;
    for (int i = 0; i < s->nroutes; i++) {
        const worker_t *w = &d->workers[s->routes[i].worker];
        net_t n = net_of(d, s, s->routes[i].worker);
        int64_t t = !w->busy || w->busy_until < now_us ? now_us : w->busy_until;
        int64_t f = t + cost_on(s, n, 1);
        if (f < best)
            best = f;
        if (!w->busy) {
            int64_t key = link_key(s, n);
            if (*free_worker < 0 || key < best_key) {
                *free_worker = s->routes[i].worker;
                best_key = key;
            }
        }
    }
    return best;
}

/* earliest_finish1 when the caller knows a worker holding s is free now. */
int64_t pl__finish1_now(const pl_dispatch_t *d, const session_t *s, int64_t now_us)
{
    if (!d->any_net)
        return now_us + s->cost[1];
    int fw;
    return earliest_finish1(d, s, now_us, &fw);
}

/* Drops head requests that cannot finish by their deadline even alone by
 * finish1_us (earliest_finish1): answered at once, never left to rot. */
void pl__prune(pl_dispatch_t *d, int sid, session_t *s, int64_t now_us, int64_t finish1_us)
{
    while (s->q.n > 0) {
        pl__entry_t *e = pl__q_at(&s->q, 0);
        if (finish1_us != PL_NEVER && finish1_us <= e->deadline_us)
            return;
        if (finish1_us == PL_NEVER && now_us + s->cost[1] <= e->deadline_us)
            return; /* no worker yet: keep it while a new one could still make it */
        int reason = (e->flags & PL__ENTRY_RETRIED) ? SQ_WORKER_LOST
                     : s->nroutes == 0              ? SQ_NO_WORKER
                                                    : SQ_DEADLINE;
        pl__entry_t gone = pl__q_pop(&s->q);
        pl__drop(d, now_us, sid, &gone, reason);
    }
}

/* Sends requests [skip, skip + b) of session sid's queue to worker wid.
 * The `skip` heads in front of the window stay queued: they are not lost
 * yet, and a worker that comes free while they can still make it (alone or
 * in a smaller batch) serves them; pl__prune() answers them once they cannot. */
void pl__send_batch(pl_dispatch_t *d, int64_t now_us, int sid, int wid, int skip, int b)
{
    session_t *s = &d->sessions[sid];
    worker_t *w = &d->workers[wid];
    assert(!w->busy && b >= 1 && b <= s->cap && skip >= 0 && (uint32_t)(skip + b) <= s->q.n);
    if (w->cap_inflight < b) {
        w->cap_inflight = b;
        w->inflight = sq_xrealloc(w->inflight, sizeof(pl__entry_t) * (size_t)b);
    }
    if (d->nids + (size_t)b > d->cap_ids) {
        while (d->nids + (size_t)b > d->cap_ids)
            d->cap_ids = d->cap_ids ? d->cap_ids * 2 : 1024;
        d->ids = sq_xrealloc(d->ids, sizeof(uint64_t) * d->cap_ids);
    }
    size_t off = d->nids;
    for (int i = 0; i < b; i++) {
        w->inflight[i] = *pl__q_at(&s->q, (uint32_t)(skip + i));
        d->ids[d->nids++] = w->inflight[i].id;
    }
    /* Close the gap: the skipped heads move up behind the window. */
    for (int i = skip - 1; i >= 0; i--)
        *pl__q_at(&s->q, (uint32_t)(i + b)) = *pl__q_at(&s->q, (uint32_t)i);
    s->q.head = (s->q.head + (uint32_t)b) & s->q.mask;
    s->q.n -= (uint32_t)b;
    w->ninflight = b;
    int64_t finish_us = now_us + cost_on(s, net_of(d, s, wid), b);
    /* The invariant both policies promise: the earliest deadline is met
     * under the profile. */
    assert(finish_us <= w->inflight[0].deadline_us);
    pl__worker_set_busy(d, wid, finish_us);
    w->batch_id = ++d->next_batch_id;
    w->batch_session = sid;
    pl_action_t *a = push_action(d, PL_ACT_SEND, now_us);
    d->act_ids_off[d->nacts - 1] = off;
    a->session = sid;
    a->worker = wid;
    a->count = b;
    a->batch_id = w->batch_id;
    a->deadline_us = w->inflight[0].deadline_us;
    a->finish_us = finish_us;
    d->stats.batches++;
    d->stats.sent_requests += (uint64_t)b;
    d->stats.queued -= (uint64_t)b;
}

/* The free workers holding s into d->order, cheapest link first (link_key,
 * then lowest id); returns how many. */
int pl__free_by_link(pl_dispatch_t *d, const session_t *s)
{
    if (d->cap_order < s->nroutes) {
        d->cap_order = s->nroutes;
        d->order = sq_xrealloc(d->order, sizeof(int) * (size_t)s->nroutes);
    }
    int64_t keys[64];
    int n = 0;
    for (int i = 0; i < s->nroutes; i++) {
        int wid = s->routes[i].worker;
        const worker_t *w = &d->workers[wid];
        if (w->busy)
            continue;
        int64_t key = link_key(s, net_of(d, s, wid));
        /* Insertion by key; routes come by id, so ties keep the lower id
         * first. Past 64 free workers the rest keep route order. */
        int j = n < 64 ? n : 64;
        if (n < 64) {
            while (j > 0 && keys[j - 1] > key) {
                keys[j] = keys[j - 1];
                d->order[j] = d->order[j - 1];
                j--;
            }
            keys[j] = key;
            d->order[j] = wid;
        } else {
            d->order[n] = wid;
        }
        n++;
    }
    return n;
}
