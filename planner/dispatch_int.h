/* Internals of the dispatcher core shared between its files: the deadline
 * queue (a ring buffer kept sorted by deadline) and the wake-up times (on
 * common's indexed heap). Not part of the public API (pl_dispatch.h). */
#ifndef PL_DISPATCH_INT_H
#define PL_DISPATCH_INT_H

#include "pl_dispatch.h"

#include <sq_heap.h>

#include <stdint.h>

/* The request came back from a lost worker: a drop then says worker_lost. */
#define PL__ENTRY_RETRIED 1u

typedef struct {
    uint64_t id;
    int64_t deadline_us;
    int64_t arrival_us;
    uint32_t flags;
} pl__entry_t;

/* Ring buffer sorted by deadline, earliest at head. */
typedef struct {
    pl__entry_t *buf;
    uint32_t mask; /* capacity - 1; capacity is a power of two */
    uint32_t head;
    uint32_t n;
} pl__queue_t;

/* The i-th request from the head (earliest deadline); i < q->n. */
static inline pl__entry_t *pl__q_at(const pl__queue_t *q, uint32_t i)
{
    return &q->buf[(q->head + i) & q->mask];
}

/* Inserts in deadline order (equal deadlines keep arrival order). */
void pl__q_insert(pl__queue_t *q, const pl__entry_t *e);
/* Removes and returns the head; q->n > 0. */
pl__entry_t pl__q_pop(pl__queue_t *q);

/* Wake-ups are common/sq_heap.h's indexed heap: sets id's wake time, and
 * PL_NEVER (INT64_MAX) takes it out. */
static inline void pl__wake_set(sq_iheap_t *h, int id, int64_t when_us)
{
    if (when_us == PL_NEVER)
        sq_iheap_remove(h, id);
    else
        sq_iheap_set(h, id, when_us);
}

/* ---- the core's records, shared by its files -------------------------------
 * dispatch_core.c (actions, latencies, sending a batch) is the lowest;
 * dispatch_deferred.c and dispatch_early_drop.c (the two batch-formation
 * policies) call it; dispatch.c (the public API, pl_dispatch.h) calls all
 * three. */

#include <math.h>

/* net_w(b) for one (session, worker): off + ceil(b * slope / 2^NET_QBITS). */
#define NET_QBITS 16
#define NET_QMASK ((INT64_C(1) << NET_QBITS) - 1)
/* Caps that keep b * slope and the sums of costs far from overflow: a
 * transfer of 2^24 µs (16 s) per item or a 2^40 µs round trip is "never". */
#define NET_SLOPE_MAX (INT64_C(1) << 40)
#define NET_OFF_MAX (INT64_C(1) << 40)

typedef struct {
    int64_t off;   /* rtt, µs */
    int64_t slope; /* µs per item, fixed point */
} net_t;

typedef struct {
    int alive;
    int cap;       /* largest batch ever formed */
    int64_t *cost; /* cost[b], b = 1..cap: l(b) with margin + net delay, µs; nondecreasing */
    int64_t timer_slack_us; /* opts.timer_slack_us, for the candidate's ready time */
    int64_t slo_us;
    int64_t item_bytes;
    /* The least net_w(1) over the session's routes (0 with a local one):
     * its head expires at deadline - cost[1] - min_net1. */
    int64_t min_net1;
    pl__queue_t q;
    pl_route_t *routes; /* sorted by worker id; target_batch resolved to 1..cap */
    int nroutes;
    /* Adaptive: what one worker serves of it batching greedily under the
     * SLO (requests per µs), and its arrivals: the current window's start
     * and count, how many of those came with the arrival that opened it
     * (more than one: a clump, pl_dispatch_requests), the last full
     * window's rate (per µs). */
    double greedy_per_us;
    int max_batch_cfg; /* pl_session_cfg_t.max_batch, for a new profile */
    int64_t win_start_us;
    int64_t win_count;
    int64_t win_first; /* of win_count, the opening clump's (pl_dispatch_requests) */
    double win_rate;
    int priority;            /* pl_session_cfg_t.priority: smaller first */
    int best_effort;         /* pl_session_cfg_t.best_effort */
    int64_t last_arrival_us; /* PL_NEVER: none yet */
    /* The routes as an index (pl__routes_index), so that matchmaking
     * without links costs no scan of the routes: bit wid of route_bits[]
     * (nroute_words words) is set iff wid is one of them, and busy_heap
     * holds those of them that are busy, keyed by busy_until (kept only
     * with busy_kept: without links and on many routes, dispatch_int.h). */
    uint64_t *route_bits;
    int nroute_words;
    int busy_kept;
    sq_iheap_t busy_heap;
} session_t;

typedef struct {
    int session;
    int target_batch;
    int dflt;     /* target chosen by the core (route target 0): follows the link */
    int overflow; /* pl_route_t.overflow: planned elsewhere, only its overflow here */
} wsess_t;

typedef struct {
    int present;
    int draining; /* removed while a batch was in flight */
    int busy;
    uint64_t batch_id;
    int batch_session;
    int64_t busy_until; /* expected, from the profile */
    /* Foreign work (pl_dispatch_worker_foreign) to run after the batch in
     * flight: its id (0: none) and length. Running, it is the busy batch
     * with batch_session -1 and no requests. */
    uint64_t foreign_next;
    int64_t foreign_next_us;
    pl__entry_t *inflight;
    int ninflight, cap_inflight;
    int64_t duty_cycle_us;
    int64_t round_next_us; /* early-drop: earliest start of the next round */
    int round_open;
    int rr; /* early-drop: next session to visit */
    wsess_t *sess;
    int nsess, cap_sess;
} worker_t;

/* A worker's link, apart from worker_t so that a cluster without links
 * touches none of it. */
typedef struct {
    int remote;         /* rtt_us or us_per_byte non-zero */
    int64_t rtt_us;     /* round trip */
    double us_per_byte; /* 1 / bandwidth; 0 = unlimited */
} link_t;

struct pl_dispatch {
    pl_dispatch_opts_t opts;
    session_t *sessions;
    int nsessions, cap_sessions;
    worker_t *workers;
    int nworkers, cap_workers; /* nworkers: highest id + 1 ever added */
    link_t *links;             /* per worker id, cap_workers */
    sq_iheap_t session_wake, worker_wake;
    pl_action_t *acts;
    size_t *act_ids_off;
    size_t nacts, cap_acts;
    uint64_t *ids;
    size_t nids, cap_ids;
    int taken;
    int64_t armed_us;
    uint64_t next_batch_id;
    void *scratch; /* wcand_t[cap_scratch], worker_decide's */
    int cap_scratch;
    uint64_t *busy_bits; /* bit wid: workers[wid].busy; cap_workers bits */
    int *order;          /* free workers by link cost, matchmaking's (any_net only) */
    int cap_order;
    int any_net; /* workers with a link (remote), ever set and not cleared */
    pl_dispatch_stats_t stats;
};

static const net_t NET_LOCAL = {0, 0};

/* The link of session s on worker wid. */
static inline net_t net_of(const pl_dispatch_t *d, const session_t *s, int wid)
{
    const link_t *w = &d->links[wid];
    if (!w->remote)
        return NET_LOCAL;
    double q = ceil((double)s->item_bytes * w->us_per_byte * (double)(NET_QMASK + 1));
    net_t n = {.off = w->rtt_us, .slope = q < (double)NET_SLOPE_MAX ? (int64_t)q : NET_SLOPE_MAX};
    return n;
}

static inline int64_t net_cost(net_t n, int b)
{
    return n.off + (((int64_t)b * n.slope + NET_QMASK) >> NET_QBITS);
}

/* The cost of a batch of b on a worker with link n. */
static inline int64_t cost_on(const session_t *s, net_t n, int b)
{
    return s->cost[b] + net_cost(n, b);
}

static inline int net_is_local(net_t n)
{
    return n.off == 0 && n.slope == 0;
}

/* Matchmaking's order among workers holding s: the cheaper link for a full
 * batch first (a local device before a remote one), then the lower id. */
static inline int64_t link_key(const session_t *s, net_t n)
{
    return net_cost(n, s->cap);
}

/* Largest b <= cap whose cost fits slack_us; 0 when not even one fits. */
static inline int fit_batch(const session_t *s, int64_t slack_us)
{
    if (slack_us < s->cost[1])
        return 0;
    int lo = 1, hi = s->cap;
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (s->cost[mid] <= slack_us)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* The same on a worker with link n. */
__attribute__((always_inline)) static inline int fit_batch_on(const session_t *s, net_t n,
                                                              int64_t slack_us)
{
    if (net_is_local(n))
        return fit_batch(s, slack_us);
    if (slack_us < cost_on(s, n, 1))
        return 0;
    int lo = 1, hi = s->cap;
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (cost_on(s, n, mid) <= slack_us)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* ---- the routes' index ------------------------------------------------
 * Without links, matchmaking asks for the lowest-id free worker holding s
 * and for the earliest moment a busy one comes free. Scanning s->routes for
 * them made every event cost O(devices) (issue 25: 1000 devices at 100k
 * req/s); d->busy_bits, s->route_bits and s->busy_heap answer them in a word
 * per 64 workers and a heap top. Every change of a worker's busy state goes
 * through pl__worker_set_busy / pl__worker_set_free, every change of a
 * session's routes ends with pl__routes_index. With links (any_net, never
 * cleared) matchmaking orders workers by link instead: the heaps are left
 * as they were and no longer kept (a worker holds many sessions, and each
 * busy change would pay a heap update per session for nothing). Nor is
 * the heap of a session on fewer than PL__HEAP_MIN_ROUTES routes: there a
 * scan of the routes costs less than a heap update per session at every
 * busy change (a dispatch_bench case: 37 sessions on 8 of 64 workers each). */
#define PL__HEAP_MIN_ROUTES 32

/* The lowest worker id >= from that holds s and is free (not busy); -1:
 * none. In route order, as the routes are sorted by worker id. */
static inline int pl__free_route_from(const pl_dispatch_t *d, const session_t *s, int from)
{
    int wd = from >> 6;
    if (wd >= s->nroute_words)
        return -1;
    uint64_t m = s->route_bits[wd] & ~d->busy_bits[wd] & (~UINT64_C(0) << (from & 63));
    while (m == 0) {
        if (++wd >= s->nroute_words)
            return -1;
        m = s->route_bits[wd] & ~d->busy_bits[wd];
    }
    return (wd << 6) + __builtin_ctzll(m);
}

/* The least busy_until of the busy workers holding s, `except` left out
 * (-1: none); PL_NEVER when there is no other. */
static inline int64_t pl__busy_min_except(const pl_dispatch_t *d, const session_t *s, int except)
{
    if (!s->busy_kept) {
        int64_t best = PL_NEVER;
        for (int i = 0; i < s->nroutes; i++) {
            const worker_t *w = &d->workers[s->routes[i].worker];
            if (w->busy && s->routes[i].worker != except && w->busy_until < best)
                best = w->busy_until;
        }
        return best;
    }
    const sq_iheap_t *h = &s->busy_heap;
    if (h->n == 0)
        return PL_NEVER;
    if (h->heap[0] != except)
        return h->key[h->heap[0]];
    /* The top is left out: the next is one of its two children. */
    int64_t best = PL_NEVER;
    for (int i = 1; i <= 2 && i < h->n; i++)
        if (h->key[h->heap[i]] < best)
            best = h->key[h->heap[i]];
    return best;
}

/* Worker wid starts work that ends at until_us (or runs longer: until_us
 * replaces its busy_until). */
void pl__worker_set_busy(pl_dispatch_t *d, int wid, int64_t until_us);
/* Worker wid is no longer busy. */
void pl__worker_set_free(pl_dispatch_t *d, int wid);
/* Rebuilds s's route_bits and busy_heap from s->routes. */
void pl__routes_index(pl_dispatch_t *d, session_t *s);
/* Whether the index agrees with the workers and routes (tests). */
int pl__index_ok(const pl_dispatch_t *d);

/* The earliest finish of one request of s alone on a worker holding s,
 * started when that worker can start it (PL_NEVER with no worker), and, in
 * *free_worker, the free worker that s's batches go to first (-1: none):
 * the lowest id, or with links the cheapest (link_key), then lowest id. */
int64_t pl__earliest_finish1_net(const pl_dispatch_t *d, const session_t *s, int64_t now_us,
                                 int *free_worker);

static inline int64_t earliest_finish1(const pl_dispatch_t *d, const session_t *s, int64_t now_us,
                                       int *free_worker)
{
    if (!d->any_net) {
        *free_worker = pl__free_route_from(d, s, 0);
        if (*free_worker >= 0)
            return now_us + s->cost[1];
        /* All busy: the first to come free (one overdue starts now). */
        int64_t best = pl__busy_min_except(d, s, -1);
        if (best == PL_NEVER)
            return PL_NEVER;
        return (best > now_us ? best : now_us) + s->cost[1];
    }
    return pl__earliest_finish1_net(d, s, now_us, free_worker);
}

void pl__begin(pl_dispatch_t *d);

/* Ends every mutating call: the caller's single timer follows the earliest
 * wake of both heaps, and is only re-armed when that moment changes. */
void pl__finish(pl_dispatch_t *d);

void pl__drop(pl_dispatch_t *d, int64_t now_us, int sid, const pl__entry_t *e, int reason);

/* Nexus's saturated batch: the largest b with 2 l(b) <= SLO (a request that
 * just misses a batch waits one batch, then runs in the next). Behind a link
 * the batch it waits for is l(b) and its own costs l(b) + net(b) (the link
 * carries batch k+1 while batch k runs). */
int pl__default_target(const pl_dispatch_t *d, const session_t *s, net_t n);

worker_t *pl__worker_get(pl_dispatch_t *d, int wid);

session_t *pl__session_get(pl_dispatch_t *d, int sid);

/* earliest_finish1 when the caller knows a worker holding s is free now. */
int64_t pl__finish1_now(const pl_dispatch_t *d, const session_t *s, int64_t now_us);

/* Drops head requests that cannot finish by their deadline even alone by
 * finish1_us (earliest_finish1): answered at once, never left to rot. */
void pl__prune(pl_dispatch_t *d, int sid, session_t *s, int64_t now_us, int64_t finish1_us);

/* Sends requests [skip, skip + b) of session sid's queue to worker wid.
 * The `skip` heads in front of the window stay queued: they are not lost
 * yet, and a worker that comes free while they can still make it (alone or
 * in a smaller batch) serves them; pl__prune() answers them once they cannot. */
void pl__send_batch(pl_dispatch_t *d, int64_t now_us, int sid, int wid, int skip, int b);

/* The free workers holding s into d->order, cheapest link first (link_key,
 * then lowest id); returns how many. */
int pl__free_by_link(pl_dispatch_t *d, const session_t *s);

void pl__pump_session_deferred(pl_dispatch_t *d, int sid, int64_t now_us);

void pl__pump_worker_deferred(pl_dispatch_t *d, int wid, int64_t now_us);

void pl__pump_worker_early_drop(pl_dispatch_t *d, int wid, int64_t now_us);

/* Sets the session's wake to its head's expiry (early drop forms batches
 * when workers come free, so only expiry needs a timer). */
void pl__pump_session_early_drop(pl_dispatch_t *d, int sid, int64_t now_us);

#endif
