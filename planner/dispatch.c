/* Dispatcher core (pl_dispatch.h): deadline queues, early-drop and deferred
 * batch formation, matchmaking. Pure; see the header for the contract.
 *
 * Data layout, chosen for the >= 1 M requests/s goal:
 *   - a session queue is a ring buffer kept sorted by deadline; requests of
 *     one session almost always arrive in deadline order, so an insert is an
 *     append and the rare late one shifts a few entries;
 *   - latencies are precomputed per session as integer µs costs cost[b]
 *     (margin and network delay included) so that "the largest batch that
 *     fits this slack" is a binary search over a small array;
 *   - sessions and workers that need a wake-up sit in two indexed min-heaps,
 *     so a timer costs O(log n) and the next wake is the smaller heap top;
 *   - a worker's link (pl_dispatch_worker_net) is not folded into the
 *     arrays: the transfer of b items of session s on worker w is affine in
 *     b, net_w(b) = rtt_w + b * item_bytes_s / bw_w, so it is computed on the
 *     fly in fixed point (net_t: an offset and a slope in 1/65536 µs, one
 *     multiply-add and a shift). While no worker has a link (any_net == 0)
 *     every decision takes the path it took before links existed. */
#include "pl_dispatch.h"

#include "dispatch_int.h"

#include <sq.h>

#include <assert.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

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
    int64_t last_arrival_us; /* PL_NEVER: none yet */
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
    int *order; /* free workers by link cost, matchmaking's (any_net only) */
    int cap_order;
    int any_net; /* workers with a link (remote), ever set and not cleared */
    pl_dispatch_stats_t stats;
};

/* ---- policy names ---- */

const char *pl_policy_name(pl_policy_t policy)
{
    return policy == PL_POLICY_EARLY_DROP ? "early-drop"
           : policy == PL_POLICY_ADAPTIVE ? "adaptive"
                                          : "deferred";
}

int pl_policy_parse(const char *name, pl_policy_t *out)
{
    if (strcmp(name, "deferred") == 0)
        *out = PL_POLICY_DEFERRED;
    else if (strcmp(name, "early-drop") == 0)
        *out = PL_POLICY_EARLY_DROP;
    else if (strcmp(name, "adaptive") == 0)
        *out = PL_POLICY_ADAPTIVE;
    else
        return SQ_INVAL;
    return 0;
}

/* ---- actions ---- */

static void begin(pl_dispatch_t *d)
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
static void finish(pl_dispatch_t *d)
{
    int64_t a = sq_iheap_top_key(&d->session_wake, PL_NEVER),
            b = sq_iheap_top_key(&d->worker_wake, PL_NEVER);
    int64_t wake = a < b ? a : b;
    if (wake != d->armed_us) {
        d->armed_us = wake;
        push_action(d, PL_ACT_TIMER, wake)->at_us = wake;
    }
}

static void drop(pl_dispatch_t *d, int64_t now_us, int sid, const pl__entry_t *e, int reason)
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

/* Largest b <= cap whose cost fits slack_us; 0 when not even one fits. */
static int fit_batch(const session_t *s, int64_t slack_us)
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

/* Nexus's saturated batch: the largest b with 2 l(b) <= SLO (a request that
 * just misses a batch waits one batch, then runs in the next). Behind a link
 * the batch it waits for is l(b) and its own costs l(b) + net(b) (the link
 * carries batch k+1 while batch k runs). */
static int default_target(const pl_dispatch_t *d, const session_t *s, net_t n)
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

static worker_t *worker_get(pl_dispatch_t *d, int wid)
{
    if (wid < 0 || wid >= d->nworkers || !d->workers[wid].present)
        return NULL;
    return &d->workers[wid];
}

static session_t *session_get(pl_dispatch_t *d, int sid)
{
    if (sid < 0 || sid >= d->nsessions || !d->sessions[sid].alive)
        return NULL;
    return &d->sessions[sid];
}

/* Matchmaking's order among workers holding s: the cheaper link for a full
 * batch first (a local device before a remote one), then the lower id. */
static inline int64_t link_key(const session_t *s, net_t n)
{
    return net_cost(n, s->cap);
}

/* The earliest finish of one request of s alone on a worker holding s,
 * started when that worker can start it (PL_NEVER with no worker), and, in
 * *free_worker, the free worker that s's batches go to first (-1: none):
 * the lowest id, or with links the cheapest (link_key), then lowest id. */
static int64_t earliest_finish1_net(const pl_dispatch_t *d, const session_t *s, int64_t now_us,
                                    int *free_worker);

static inline int64_t earliest_finish1(const pl_dispatch_t *d, const session_t *s, int64_t now_us,
                                       int *free_worker)
{
    int64_t best = PL_NEVER;
    *free_worker = -1;
    if (!d->any_net) {
        for (int i = 0; i < s->nroutes; i++) {
            const worker_t *w = &d->workers[s->routes[i].worker];
            if (!w->busy) {
                if (*free_worker < 0)
                    *free_worker = s->routes[i].worker;
                return now_us + s->cost[1];
            }
            int64_t t = w->busy_until > now_us ? w->busy_until : now_us;
            if (t < best)
                best = t;
        }
        return best == PL_NEVER ? PL_NEVER : best + s->cost[1];
    }
    return earliest_finish1_net(d, s, now_us, free_worker);
}

static int64_t earliest_finish1_net(const pl_dispatch_t *d, const session_t *s, int64_t now_us,
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
static int64_t finish1_now(const pl_dispatch_t *d, const session_t *s, int64_t now_us)
{
    if (!d->any_net)
        return now_us + s->cost[1];
    int fw;
    return earliest_finish1(d, s, now_us, &fw);
}

/* Drops head requests that cannot finish by their deadline even alone by
 * finish1_us (earliest_finish1): answered at once, never left to rot. */
static void prune(pl_dispatch_t *d, int sid, session_t *s, int64_t now_us, int64_t finish1_us)
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
        drop(d, now_us, sid, &gone, reason);
    }
}

/* Sends requests [skip, skip + b) of session sid's queue to worker wid.
 * The `skip` heads in front of the window stay queued: they are not lost
 * yet, and a worker that comes free while they can still make it (alone or
 * in a smaller batch) serves them; prune() answers them once they cannot. */
static void send_batch(pl_dispatch_t *d, int64_t now_us, int sid, int wid, int skip, int b)
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
    w->busy = 1;
    w->busy_until = finish_us;
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

/* ---- deferred (Symphony) ---- */

typedef struct {
    int skip;         /* heads left queued in front of the batch */
    int b;            /* batch size */
    int64_t ready_at; /* dispatchable from */
    int64_t valid_until;
} candidate_t;

typedef struct {
    int sid;
    candidate_t c;
    int64_t cost_us;
    int ready;     /* dispatchable now */
    int dependent; /* no other worker can start it by its valid_until */
    int priority;  /* its session's */
    /* What a lower priority leaves it (lower_room): the time of a batch of
     * its target size, and the latest start of that batch. */
    int64_t hold_cost_us;
    int64_t hold_until;
} wcand_t;

static int64_t head_slack(const session_t *s, uint32_t i, int64_t now_us)
{
    return pl__q_at(&s->q, i)->deadline_us - now_us;
}

/* The session's candidate batch at now on a worker with link `net`; 0 when
 * no queued request can finish there even alone. Requires a non-empty queue.
 * The heads that cannot make it on this worker (only behind a link: a
 * cheaper worker may still serve them) are left queued in front of the
 * candidate, like the heads a backed-up queue passes over. */
__attribute__((always_inline)) static inline int candidate_on(const session_t *s, net_t net,
                                                              int64_t now_us, double skip_ratio,
                                                              int eager, candidate_t *c)
{
    int base = 0;
    int head_fit = fit_batch_on(s, net, head_slack(s, 0, now_us));
    if (head_fit < 1) {
        /* First request that fits alone here (deadlines only grow). */
        int lo = 1, hi = (int)s->q.n;
        while (lo < hi) {
            int mid = lo + (hi - lo) / 2;
            if (fit_batch_on(s, net, head_slack(s, (uint32_t)mid, now_us)) >= 1)
                hi = mid;
            else
                lo = mid + 1;
        }
        if (lo >= (int)s->q.n)
            return 0;
        base = lo;
        head_fit = fit_batch_on(s, net, head_slack(s, (uint32_t)base, now_us));
    }
    int n = (int)s->q.n - base, cap = s->cap;
    int fill = n < cap ? n : cap; /* the largest batch the queue could give */
    int b = head_fit < fill ? head_fit : fill;
    c->skip = base;
    c->b = b;
    /* Waiting can only help while one more request would still fit the
     * head's deadline and the queue has no more to give right now. */
    if (b == cap || b < n || eager) {
        c->ready_at = now_us;
    } else {
        /* The frontrun moment, but never later than timer_slack_us before
         * the last moment: a live timer that wakes a little late must still
         * find the batch sendable (when l(b+1) = l(b) the two coincide). */
        int64_t d_head = pl__q_at(&s->q, (uint32_t)base)->deadline_us;
        c->ready_at = d_head - cost_on(s, net, b + 1);
        if (c->ready_at > d_head - cost_on(s, net, b) - s->timer_slack_us)
            c->ready_at = d_head - cost_on(s, net, b) - s->timer_slack_us;
    }
    if (b < fill) {
        /* Backed up: the head cannot fill a batch the queue could. Find the
         * window that gives the largest batch now. fit(i) grows with i (later
         * deadlines) while the room behind i, min(n - i, cap), shrinks: the
         * best window starts where they cross. */
        int lo = 1, hi = n - 1;
        while (lo < hi) {
            int mid = lo + (hi - lo) / 2;
            int room = n - mid < cap ? n - mid : cap;
            if (fit_batch_on(s, net, head_slack(s, (uint32_t)(base + mid), now_us)) >= room)
                hi = mid;
            else
                lo = mid + 1;
        }
        int cross = lo;
        int best = n - cross < cap ? n - cross : cap;
        /* Passing the head window over pays when it is much smaller than
         * the best: under overload that keeps batches near full instead of
         * collapsing into stale batches of one or two. */
        if (best > b && b < skip_ratio * best) {
            /* Earliest window that still holds `best`: serve the earliest
             * deadlines we can. */
            int l2 = 1, h2 = cross;
            while (l2 < h2) {
                int mid = l2 + (h2 - l2) / 2;
                if (fit_batch_on(s, net, head_slack(s, (uint32_t)(base + mid), now_us)) >= best)
                    h2 = mid;
                else
                    l2 = mid + 1;
            }
            int fit = fit_batch_on(s, net, head_slack(s, (uint32_t)(base + l2), now_us));
            int can_grow = best < cap && best == n - l2 && fit > best;
            /* A window that is still growing is not a reason to pass the
             * heads over: that is low load, and the head window goes first. */
            if (!can_grow) {
                c->skip = base + l2;
                c->b = best;
                c->ready_at = now_us;
            }
        }
    }
    c->valid_until = pl__q_at(&s->q, (uint32_t)c->skip)->deadline_us - cost_on(s, net, c->b);
    return 1;
}

/* candidate_on compiled twice: for a local worker (the link folded away, the
 * hot path of a cluster without links) and for any link. */
static int deferred_candidate(const session_t *s, net_t net, int64_t now_us, double skip_ratio,
                              int eager, candidate_t *c)
{
    if (net_is_local(net))
        return candidate_on(s, NET_LOCAL, now_us, skip_ratio, eager, c);
    return candidate_on(s, net, now_us, skip_ratio, eager, c);
}

/* The current window's arrival rate (per µs). A window starts at an
 * arrival, so its rate is its gaps: the requests that came after the one
 * that opened it, over the time since. The opening arrival may be a clump
 * (pl_dispatch_requests): its requests came in no time, and counting them
 * as gaps would read one arrival as a burst of the fastest kind. */
static double window_rate_per_us(const session_t *s, int64_t now_us)
{
    int64_t el = now_us - s->win_start_us;
    int64_t after = s->win_count - s->win_first;
    return el > 0 && after > 0 ? (double)after / (double)el : 0;
}

/* Adaptive: whether s's arrivals are sparse enough that its batches go at
 * once (pl_dispatch.h). The rate is the last full window's, or the current
 * one's when that is longer (a lull) or already higher (a burst: two
 * arrivals close together make deferral the choice at once, the safe
 * side). Both count requests, a clump's every one: what loads the workers
 * is the requests, however they come. */
static int eager(const pl_dispatch_t *d, const session_t *s, int64_t now_us)
{
    if (d->opts.policy != PL_POLICY_ADAPTIVE || s->nroutes == 0)
        return 0;
    int64_t el = now_us - s->win_start_us;
    double cur = window_rate_per_us(s, now_us);
    double rate = el >= PL_RATE_WINDOW_US || cur > s->win_rate ? cur : s->win_rate;
    return rate < d->opts.eager_load * s->nroutes * s->greedy_per_us;
}

/* When a worker other than `except` holding s can next start a batch. */
static int64_t next_start_except(const pl_dispatch_t *d, const session_t *s, int64_t now_us,
                                 int except)
{
    int64_t best = PL_NEVER;
    for (int i = 0; i < s->nroutes; i++) {
        const worker_t *w = &d->workers[s->routes[i].worker];
        if (s->routes[i].worker == except)
            continue;
        int64_t t = !w->busy || w->busy_until < now_us ? now_us : w->busy_until;
        if (t < best)
            best = t;
    }
    return best;
}

/* Whether a worker other than `except` holding s can run candidate c (its
 * window: the request at c->skip and c->b behind) by its deadline when it
 * next can start: each on its own link. */
static int others_can_make(const pl_dispatch_t *d, const session_t *s, int64_t now_us, int except,
                           const candidate_t *c)
{
    int64_t deadline = pl__q_at(&s->q, (uint32_t)c->skip)->deadline_us;
    for (int i = 0; i < s->nroutes; i++) {
        const worker_t *w = &d->workers[s->routes[i].worker];
        if (s->routes[i].worker == except)
            continue;
        int64_t t = !w->busy || w->busy_until < now_us ? now_us : w->busy_until;
        if (t + cost_on(s, net_of(d, s, s->routes[i].worker), c->b) <= deadline)
            return 1;
    }
    return 0;
}

/* Whether no worker but `wid` can run candidate c in time (it depends on
 * wid). Without links: no other can start by c's valid_until. */
static inline int depends_on(const pl_dispatch_t *d, const session_t *s, int64_t now_us, int wid,
                             const candidate_t *c)
{
    if (!d->any_net)
        return next_start_except(d, s, now_us, wid) > c->valid_until;
    return !others_can_make(d, s, now_us, wid, c);
}

/* Whether a free worker other than wid, with a cheaper link for s (link_key,
 * ties to the lower id), can run candidate c now and finish it in time: wid
 * then leaves it to that one (a remote link loses to a local idle device). */
static int cheaper_free_can_make(const pl_dispatch_t *d, const session_t *s, int64_t now_us,
                                 int wid, net_t net, const candidate_t *c)
{
    int64_t key = link_key(s, net);
    int64_t deadline = pl__q_at(&s->q, (uint32_t)c->skip)->deadline_us;
    for (int i = 0; i < s->nroutes; i++) {
        int ow = s->routes[i].worker;
        const worker_t *w = &d->workers[ow];
        if (ow == wid || w->busy)
            continue;
        net_t n = net_of(d, s, ow);
        int64_t k = link_key(s, n);
        if ((k < key || (k == key && ow < wid)) && now_us + cost_on(s, n, c->b) <= deadline)
            return 1;
    }
    return 0;
}

/* Latest start of the first of chain[0..n) (sorted by valid_until) when all
 * run back to back on one worker, each starting by its valid_until, the
 * entry `skip` left out (-1: none), and so are those of a priority below
 * `level` (a number above it); those above `hold_from` (a smaller number)
 * count with their hold (wcand_t). PL_NEVER for an empty chain. */
static int64_t chain_latest_start(const wcand_t *chain, int n, int skip, int level, int hold_from)
{
    int64_t latest = PL_NEVER;
    for (int i = n - 1; i >= 0; i--) {
        if (i == skip || chain[i].priority > level)
            continue;
        int hold = chain[i].priority < hold_from;
        int64_t cost = hold ? chain[i].hold_cost_us : chain[i].cost_us;
        int64_t until = hold ? chain[i].hold_until : chain[i].c.valid_until;
        int64_t by = latest == PL_NEVER ? PL_NEVER : latest - cost;
        latest = until < by ? until : by;
    }
    return latest;
}

/* Priorities: the batch that a higher-priority candidate c of s is held
 * at: what its queue holds at its last moment, the arrivals expected by then
 * at the session's recent rate included, at most its target (and never less
 * than c). */
static int hold_batch(const session_t *s, const candidate_t *c, int target, int64_t now_us)
{
    double cur = window_rate_per_us(s, now_us);
    double rate = cur > s->win_rate ? cur : s->win_rate;
    int64_t ahead = c->valid_until > now_us ? c->valid_until - now_us : 0;
    double expect = (double)(s->q.n - (uint32_t)c->skip) + ceil(rate * (double)ahead);
    int b = expect < (double)target ? (int)expect : target;
    return b > c->b ? b : c->b;
}

/* Priorities: the latest start of the chain of the levels above `prio`,
 * each batch held at least at its target size: a lower-priority batch must
 * end by then, so that the higher ones' queues, still growing, go in the
 * batches they were planned for. PL_NEVER: nothing above. */
static inline int64_t lower_room(const wcand_t *all, int nchain, int prio)
{
    return chain_latest_start(all, nchain, -1, prio - 1, INT_MAX);
}

/* The longest a batch may run on worker wid (PL_NEVER: no limit) so that
 * the sessions it must leave room for still make their SLOs: a batch is
 * not preempted, so a request of such a session that arrives as it starts
 * must still make its SLO after it, in a batch of its target size. Only
 * sessions that had a request in the last PL_RATE_WINDOW_US count: one
 * nobody uses any more does not keep the others in small batches. Which
 * sessions: with overflow 0, those of a priority above `prio` (a smaller
 * number); with overflow 1, those planned on the worker, for a session
 * that only takes its overflow there (pl_route_t.overflow). */
static int64_t room_for(const pl_dispatch_t *d, const worker_t *w, int wid, int prio, int overflow,
                        int64_t now_us)
{
    int64_t budget = PL_NEVER;
    for (int k = 0; k < w->nsess; k++) {
        const session_t *h = &d->sessions[w->sess[k].session];
        int counted = overflow ? !w->sess[k].overflow : h->priority < prio;
        if (!counted || h->slo_us <= 0 || h->last_arrival_us == PL_NEVER ||
            now_us - h->last_arrival_us > PL_RATE_WINDOW_US)
            continue;
        int64_t room = h->slo_us - cost_on(h, net_of(d, h, wid), w->sess[k].target_batch);
        if (room < budget)
            budget = room;
    }
    return budget;
}

/* worker_decide's choice among all[0..n) (the chain: the first nchain), -1
 * for none. Without priorities (one level, hold_from INT_MIN) the rules of
 * worker_decide. With them, one level at a time: the chain of `level` and
 * those above, the above held (lower_room); its first batch when its moment
 * has come, if it is of a level above or leaves room for those; else the
 * ready batch of `level` that must leave first and leaves the chain room.
 * In *wake, the earliest latest start of the chain still ahead. */
static int decide_level(const wcand_t *all, int n, int nchain, int level, int hold_from,
                        int64_t now_us, int64_t *wake)
{
    int first = 0;
    while (first < nchain && all[first].priority > level)
        first++;
    int64_t latest = chain_latest_start(all, nchain, -1, level, hold_from);
    if (latest > now_us && latest < *wake)
        *wake = latest;
    if (first < nchain && latest <= now_us &&
        (hold_from == INT_MIN || all[first].priority < hold_from ||
         now_us + all[first].cost_us <= lower_room(all, nchain, all[first].priority)))
        return first;
    int pick = -1;
    for (int i = 0; i < n; i++) {
        if (!all[i].ready || all[i].priority > level || all[i].priority < hold_from)
            continue;
        int64_t room = chain_latest_start(all, nchain, i < nchain ? i : -1, level, hold_from);
        if (room != PL_NEVER && now_us + all[i].cost_us > room)
            continue;
        if (pick < 0 || all[i].c.valid_until < all[pick].c.valid_until)
            pick = i;
    }
    return pick;
}

/* A free worker chooses what to run now. Candidates that only this worker
 * can serve in time (every other worker holding their session is busy past
 * their valid_until) form a chain: run back to back in deadline order, the
 * first must start by the chain's latest start. Deferring every batch to its
 * own last moment would make batches of sessions sharing the worker collide,
 * so the chain goes first when its moment comes, and a ready batch only goes
 * when it leaves the chain room. Otherwise the ready batch that must leave
 * first (earliest valid_until) goes. With priorities, that choice stands
 * unless it takes a higher level's room (lower_room); then one level at a
 * time decides, highest first (pl_dispatch.h, "Priorities"). Returns 1 if a
 * batch was sent; arms the worker's wake for the chain's latest start. */
static int worker_decide(pl_dispatch_t *d, int wid, int64_t now_us)
{
    worker_t *w = &d->workers[wid];
    pl__wake_set(&d->worker_wake, wid, PL_NEVER);
    if (!w->present || w->busy || w->draining)
        return 0;
    if (d->cap_scratch < w->nsess) {
        d->cap_scratch = w->nsess;
        d->scratch = sq_xrealloc(d->scratch, sizeof(wcand_t) * (size_t)w->nsess);
    }
    wcand_t *all = d->scratch;
    int n = 0;
    /* Sessions of more than one priority on this worker (pl_dispatch.h,
     * "Priorities"); without, every decision is the one made before them. */
    int mixed = 0;
    for (int k = 1; k < w->nsess && !mixed; k++)
        mixed =
            d->sessions[w->sess[k].session].priority != d->sessions[w->sess[0].session].priority;
    int64_t spill = PL_NEVER; /* room_for the planned, once an overflow session has a queue */
    int spill_known = 0;
    for (int k = 0; k < w->nsess; k++) {
        int sid = w->sess[k].session;
        session_t *s = &d->sessions[sid];
        prune(d, sid, s, now_us, finish1_now(d, s, now_us));
        if (s->q.n == 0)
            continue;
        wcand_t *x = &all[n];
        x->sid = sid;
        net_t net = net_of(d, s, wid);
        if (!deferred_candidate(s, net, now_us, d->opts.skip_ratio, eager(d, s, now_us), &x->c))
            continue; /* nothing left that this worker's link can make */
        if (w->sess[k].overflow) {
            /* Planned elsewhere: a batch too long for the room of the
             * sessions planned here is left to the session's other workers
             * while one of them can still run it in time. */
            if (!spill_known) {
                spill = room_for(d, w, wid, 0, 1, now_us);
                spill_known = 1;
            }
            if (spill != PL_NEVER && fit_batch_on(s, net, spill) < x->c.b &&
                others_can_make(d, s, now_us, wid, &x->c))
                continue;
        }
        n++;
        x->priority = s->priority;
        if (mixed) {
            int64_t budget = room_for(d, w, wid, s->priority, 0, now_us);
            int capped = budget != PL_NEVER ? fit_batch_on(s, net, budget) : x->c.b;
            if (capped < 1)
                capped = 1; /* no batch fits: one at a time still moves */
            if (capped < x->c.b) {
                /* Capped: full at that size, so nothing to wait for. */
                x->c.b = capped;
                x->c.ready_at = now_us;
                x->c.valid_until =
                    pl__q_at(&s->q, (uint32_t)x->c.skip)->deadline_us - cost_on(s, net, x->c.b);
            }
            int hold_b = hold_batch(s, &x->c, w->sess[k].target_batch, now_us);
            x->hold_cost_us = cost_on(s, net, hold_b);
            x->hold_until = pl__q_at(&s->q, (uint32_t)x->c.skip)->deadline_us - x->hold_cost_us;
        }
        x->cost_us = cost_on(s, net, x->c.b);
        x->ready = now_us >= x->c.ready_at;
        x->dependent = depends_on(d, s, now_us, wid, &x->c);
        if (d->any_net && x->ready && !x->dependent &&
            cheaper_free_can_make(d, s, now_us, wid, net, &x->c))
            x->ready = 0;
    }
    /* Dependent ones first, each group by valid_until (insertion sort: a
     * worker holds a handful of sessions). */
    for (int i = 1; i < n; i++) {
        wcand_t x = all[i];
        int j = i;
        while (j > 0 && (all[j - 1].dependent < x.dependent ||
                         (all[j - 1].dependent == x.dependent &&
                          all[j - 1].c.valid_until > x.c.valid_until))) {
            all[j] = all[j - 1];
            j--;
        }
        all[j] = x;
    }
    int nchain = 0;
    while (nchain < n && all[nchain].dependent)
        nchain++;
    int lowest = -1; /* the lowest priority level (largest number) */
    for (int i = 0; i < n; i++)
        if (all[i].priority > lowest)
            lowest = all[i].priority;
    int64_t wake = PL_NEVER;
    int pick = decide_level(all, n, nchain, lowest, INT_MIN, now_us, &wake);
    /* With priorities, that choice stands unless it takes the room of the
     * levels above it; then decide one level at a time, highest first. */
    if (mixed && pick >= 0 &&
        now_us + all[pick].cost_us > lower_room(all, nchain, all[pick].priority)) {
        pick = -1;
        wake = PL_NEVER;
        int above = -1;
        while (pick < 0) {
            int level = -1; /* the next level below `above` */
            for (int i = 0; i < n; i++)
                if (all[i].priority > above && (level < 0 || all[i].priority < level))
                    level = all[i].priority;
            if (level < 0)
                break;
            pick = decide_level(all, n, nchain, level, level, now_us, &wake);
            above = level;
        }
    }
    if (pick >= 0) {
        send_batch(d, now_us, all[pick].sid, wid, all[pick].c.skip, all[pick].c.b);
        return 1;
    }
    if (wake != PL_NEVER)
        pl__wake_set(&d->worker_wake, wid, wake);
    return 0;
}

/* The free workers holding s into d->order, cheapest link first (link_key,
 * then lowest id); returns how many. */
static int free_by_link(pl_dispatch_t *d, const session_t *s)
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

/* With links: the first free worker in link order on which s has a
 * candidate, its candidate in *c; -1 when none. */
static int first_candidate(pl_dispatch_t *d, const session_t *s, int64_t now_us, candidate_t *c)
{
    int nfree = free_by_link(d, s);
    for (int i = 0; i < nfree; i++) {
        int wid = d->order[i];
        if (deferred_candidate(s, net_of(d, s, wid), now_us, d->opts.skip_ratio,
                               eager(d, s, now_us), c))
            return wid;
    }
    return -1;
}

static void pump_session_deferred(pl_dispatch_t *d, int sid, int64_t now_us)
{
    session_t *s = &d->sessions[sid];
    for (;;) {
        int free_worker;
        int64_t finish1 = earliest_finish1(d, s, now_us, &free_worker);
        prune(d, sid, s, now_us, finish1);
        if (s->q.n == 0) {
            pl__wake_set(&d->session_wake, sid, PL_NEVER);
            return;
        }
        int64_t wake = pl__q_at(&s->q, 0)->deadline_us - s->cost[1] - s->min_net1 + 1;
        candidate_t c;
        if (free_worker >= 0 && d->any_net)
            free_worker = first_candidate(d, s, now_us, &c);
        else if (free_worker >= 0)
            deferred_candidate(s, NET_LOCAL, now_us, d->opts.skip_ratio, eager(d, s, now_us), &c);
        if (free_worker >= 0) {
            if (now_us >= c.ready_at) {
                /* Matchmaking: the free workers holding the model, lowest id
                 * first (with links: cheapest link first), each choosing
                 * among its own sessions. */
                int sent = 0;
                if (!d->any_net) {
                    for (int i = 0; i < s->nroutes && !sent; i++)
                        if (!d->workers[s->routes[i].worker].busy)
                            sent = worker_decide(d, s->routes[i].worker, now_us);
                } else {
                    int nfree = free_by_link(d, s);
                    for (int i = 0; i < nfree && !sent; i++)
                        sent = worker_decide(d, d->order[i], now_us);
                }
                if (sent)
                    continue; /* more free workers may take more */
            } else {
                /* Not ready, and only this one free worker can take it in
                 * time: the worker's chain may have to start before it. */
                if (depends_on(d, s, now_us, free_worker, &c) &&
                    worker_decide(d, free_worker, now_us))
                    continue;
                if (c.ready_at < wake)
                    wake = c.ready_at;
            }
        }
        pl__wake_set(&d->session_wake, sid, wake);
        return;
    }
}

static void pump_worker_deferred(pl_dispatch_t *d, int wid, int64_t now_us)
{
    worker_t *w = &d->workers[wid];
    worker_decide(d, wid, now_us);
    /* Refresh the wake of every session this worker holds. */
    for (int k = 0; k < w->nsess; k++)
        pump_session_deferred(d, w->sess[k].session, now_us);
}

/* ---- early drop (Nexus) ---- */

/* Tries session k of worker wid: the sliding window of the target batch
 * slides past heads that would make it miss their deadline. 1 if sent. */
static int early_drop_try(pl_dispatch_t *d, int wid, int k, int64_t now_us)
{
    worker_t *w = &d->workers[wid];
    int sid = w->sess[k].session;
    session_t *s = &d->sessions[sid];
    int target = w->sess[k].target_batch;
    net_t net = net_of(d, s, wid);
    prune(d, sid, s, now_us, finish1_now(d, s, now_us));
    /* A head that this worker's link cannot make even alone, another
     * worker (cheaper link) still can: leave the session to it. */
    if (s->q.n > 0 && now_us + cost_on(s, net, 1) > pl__q_at(&s->q, 0)->deadline_us)
        return 0;
    while (s->q.n > 0) {
        int window = (int)s->q.n < target ? (int)s->q.n : target;
        pl__entry_t *e = pl__q_at(&s->q, 0);
        if (now_us + cost_on(s, net, window) <= e->deadline_us)
            break;
        pl__entry_t gone = pl__q_pop(&s->q);
        int reason = (gone.flags & PL__ENTRY_RETRIED)                 ? SQ_WORKER_LOST
                     : now_us + cost_on(s, net, 1) > gone.deadline_us ? SQ_DEADLINE
                                                                      : SQ_OVERLOAD;
        drop(d, now_us, sid, &gone, reason);
    }
    if (s->q.n == 0)
        return 0;
    int b = (int)s->q.n < target ? (int)s->q.n : target;
    send_batch(d, now_us, sid, wid, 0, b);
    return 1;
}

static void pump_worker_early_drop(pl_dispatch_t *d, int wid, int64_t now_us)
{
    worker_t *w = &d->workers[wid];
    pl__wake_set(&d->worker_wake, wid, PL_NEVER);
    if (!w->present || w->busy || w->draining || w->nsess == 0)
        return;
    for (int visited = 0; visited < w->nsess; visited++) {
        if (w->rr >= w->nsess)
            w->rr = 0;
        /* A round over the sessions starts at most once per duty cycle. */
        if (w->rr == 0 && !w->round_open && w->duty_cycle_us > 0 && now_us < w->round_next_us) {
            pl__wake_set(&d->worker_wake, wid, w->round_next_us);
            return;
        }
        int k = w->rr;
        w->rr = k + 1;
        int sent = early_drop_try(d, wid, k, now_us);
        if (sent && !w->round_open) {
            w->round_open = 1;
            w->round_next_us = now_us + w->duty_cycle_us;
        }
        if (w->rr >= w->nsess) {
            w->rr = 0;
            w->round_open = 0;
        }
        if (sent)
            return;
    }
}

/* Sets the session's wake to its head's expiry (early drop forms batches
 * when workers come free, so only expiry needs a timer). */
static void pump_session_early_drop(pl_dispatch_t *d, int sid, int64_t now_us)
{
    session_t *s = &d->sessions[sid];
    if (!d->any_net) {
        for (int i = 0; i < s->nroutes && s->q.n > 0; i++) {
            int wid = s->routes[i].worker;
            if (!d->workers[wid].busy)
                pump_worker_early_drop(d, wid, now_us);
        }
    } else {
        /* Cheapest link first: a local idle device before a remote one. */
        int nfree = free_by_link(d, s);
        for (int i = 0; i < nfree && s->q.n > 0; i++)
            pump_worker_early_drop(d, d->order[i], now_us);
    }
    int free_worker;
    prune(d, sid, s, now_us, earliest_finish1(d, s, now_us, &free_worker));
    pl__wake_set(&d->session_wake, sid,
                 s->q.n ? pl__q_at(&s->q, 0)->deadline_us - s->cost[1] - s->min_net1 + 1
                        : PL_NEVER);
}

static void pump_session(pl_dispatch_t *d, int sid, int64_t now_us)
{
    if (!d->sessions[sid].alive)
        return;
    if (d->opts.policy != PL_POLICY_EARLY_DROP)
        pump_session_deferred(d, sid, now_us);
    else
        pump_session_early_drop(d, sid, now_us);
}

static void pump_worker(pl_dispatch_t *d, int wid, int64_t now_us)
{
    if (d->opts.policy != PL_POLICY_EARLY_DROP) {
        pump_worker_deferred(d, wid, now_us);
    } else {
        pump_worker_early_drop(d, wid, now_us);
        worker_t *w = &d->workers[wid];
        for (int k = 0; k < w->nsess; k++) {
            int sid = w->sess[k].session;
            session_t *s = &d->sessions[sid];
            pl__wake_set(&d->session_wake, sid,
                         s->q.n ? pl__q_at(&s->q, 0)->deadline_us - s->cost[1] - s->min_net1 + 1
                                : PL_NEVER);
        }
    }
}

/* ---- public API ---- */

pl_dispatch_t *pl_dispatch_new(const pl_dispatch_opts_t *opts)
{
    pl_dispatch_t *d = sq_xcalloc(1, sizeof(*d));
    d->opts = *opts;
    if (d->opts.net_delay_us < 0)
        d->opts.net_delay_us = 0;
    if (d->opts.timer_slack_us < 0)
        d->opts.timer_slack_us = 0;
    if (!(d->opts.skip_ratio > 0))
        d->opts.skip_ratio = PL_DEFAULT_SKIP_RATIO;
    if (!(d->opts.eager_load > 0))
        d->opts.eager_load = PL_DEFAULT_EAGER_LOAD;
    if (d->opts.clump_us == 0)
        d->opts.clump_us = PL_DEFAULT_CLUMP_US;
    d->armed_us = PL_NEVER;
    return d;
}

void pl_dispatch_free(pl_dispatch_t *d)
{
    if (d == NULL)
        return;
    for (int i = 0; i < d->nsessions; i++) {
        free(d->sessions[i].cost);
        free(d->sessions[i].q.buf);
        free(d->sessions[i].routes);
    }
    for (int i = 0; i < d->nworkers; i++) {
        free(d->workers[i].inflight);
        free(d->workers[i].sess);
    }
    free(d->sessions);
    free(d->workers);
    free(d->links);
    sq_iheap_dispose(&d->session_wake);
    sq_iheap_dispose(&d->worker_wake);
    free(d->acts);
    free(d->act_ids_off);
    free(d->ids);
    free(d->scratch);
    free(d->order);
    free(d);
}

/* cost[1..cap] of a profile (*cost owned by the caller), the usable cap
 * and the greedy rate (session_t); 0 or SQ_INVAL when no batch is usable. */
static int build_costs(const pl_dispatch_t *d, const pl_profile_t *profile, int max_batch,
                       int64_t slo_us, int64_t **cost_out, int *cap_out, double *greedy_per_us)
{
    int cap = profile->max_batch;
    if (max_batch > 0 && max_batch < cap)
        cap = max_batch;
    if (cap < 1)
        return SQ_INVAL;
    int64_t *cost = sq_xcalloc((size_t)cap + 2, sizeof(int64_t));
    int usable = 0;
    for (int b = 1; b <= cap; b++) {
        double l = pl_latency_us(profile, b, d->opts.k_std);
        if (l < 0)
            break;
        int64_t c = d->opts.net_delay_us + (int64_t)ceil(l);
        /* Never assume a bigger batch is faster: keep costs nondecreasing so
         * that "largest batch fitting a slack" is a binary search. */
        cost[b] = b > 1 && cost[b - 1] > c ? cost[b - 1] : c;
        usable = b;
    }
    /* No batch larger than the SLO allows can ever be formed. */
    if (slo_us > 0)
        while (usable > 1 && cost[usable] > slo_us)
            usable--;
    if (usable < 1) {
        free(cost);
        return SQ_INVAL;
    }
    int g = usable;
    while (g > 1 && slo_us > 0 && 2 * cost[g] > slo_us)
        g--;
    *greedy_per_us = cost[g] > 0 ? (double)g / (double)cost[g] : 0;
    *cost_out = cost;
    *cap_out = usable;
    return 0;
}

int pl_dispatch_session_add(pl_dispatch_t *d, const pl_session_cfg_t *cfg)
{
    if (cfg == NULL || cfg->profile == NULL || cfg->slo_us < 0 || cfg->priority < 0)
        return SQ_INVAL;
    int64_t *cost;
    int usable;
    double greedy;
    if (build_costs(d, cfg->profile, cfg->max_batch, cfg->slo_us, &cost, &usable, &greedy) != 0)
        return SQ_INVAL;
    if (d->nsessions == d->cap_sessions) {
        d->cap_sessions = d->cap_sessions ? d->cap_sessions * 2 : 8;
        d->sessions = sq_xrealloc(d->sessions, sizeof(*d->sessions) * (size_t)d->cap_sessions);
    }
    int sid = d->nsessions++;
    session_t *s = &d->sessions[sid];
    memset(s, 0, sizeof(*s));
    s->alive = 1;
    s->cap = usable;
    s->cost = cost;
    s->timer_slack_us = d->opts.timer_slack_us;
    s->slo_us = cfg->slo_us;
    s->item_bytes = cfg->item_bytes > 0 ? cfg->item_bytes : 0;
    s->max_batch_cfg = cfg->max_batch;
    s->greedy_per_us = greedy;
    s->priority = cfg->priority;
    s->last_arrival_us = PL_NEVER;
    sq_iheap_reserve(&d->session_wake, d->nsessions);
    return sid;
}

/* Removes session sid from worker wid's list. */
static void worker_forget_session(worker_t *w, int sid)
{
    for (int k = 0; k < w->nsess; k++) {
        if (w->sess[k].session == sid) {
            memmove(&w->sess[k], &w->sess[k + 1], sizeof(wsess_t) * (size_t)(w->nsess - k - 1));
            w->nsess--;
            if (w->rr > k)
                w->rr--;
            return;
        }
    }
}

/* Recomputes s->min_net1 from its routes. */
static void session_net_refresh(const pl_dispatch_t *d, session_t *s)
{
    int64_t m = PL_NEVER;
    for (int i = 0; i < s->nroutes; i++) {
        int64_t c = net_cost(net_of(d, s, s->routes[i].worker), 1);
        if (c < m)
            m = c;
    }
    s->min_net1 = m == PL_NEVER ? 0 : m;
}

/* Takes worker wid out of every route. */
static void worker_detach(pl_dispatch_t *d, int wid)
{
    worker_t *w = &d->workers[wid];
    for (int k = 0; k < w->nsess; k++) {
        session_t *s = &d->sessions[w->sess[k].session];
        for (int i = 0; i < s->nroutes; i++) {
            if (s->routes[i].worker == wid) {
                memmove(&s->routes[i], &s->routes[i + 1],
                        sizeof(pl_route_t) * (size_t)(s->nroutes - i - 1));
                s->nroutes--;
                break;
            }
        }
        session_net_refresh(d, s);
    }
    pl__wake_set(&d->worker_wake, wid, PL_NEVER);
}

int pl_dispatch_session_remove(pl_dispatch_t *d, int64_t now_us, int session)
{
    begin(d);
    session_t *s = session_get(d, session);
    if (s == NULL)
        return SQ_INVAL;
    while (s->q.n > 0) {
        pl__entry_t gone = pl__q_pop(&s->q);
        drop(d, now_us, session, &gone, SQ_NOT_FOUND);
    }
    for (int i = 0; i < s->nroutes; i++)
        worker_forget_session(&d->workers[s->routes[i].worker], session);
    s->nroutes = 0;
    s->alive = 0;
    pl__wake_set(&d->session_wake, session, PL_NEVER);
    finish(d);
    return 0;
}

int pl_dispatch_session_profile(pl_dispatch_t *d, int64_t now_us, int session,
                                const pl_profile_t *profile)
{
    begin(d);
    session_t *s = session_get(d, session);
    if (s == NULL || profile == NULL)
        return SQ_INVAL;
    int64_t *cost;
    int usable;
    double greedy;
    if (build_costs(d, profile, s->max_batch_cfg, s->slo_us, &cost, &usable, &greedy) != 0)
        return SQ_INVAL;
    free(s->cost);
    s->cost = cost;
    s->cap = usable;
    s->greedy_per_us = greedy;
    for (int i = 0; i < s->nroutes; i++) {
        worker_t *w = &d->workers[s->routes[i].worker];
        for (int k = 0; k < w->nsess; k++) {
            wsess_t *ws = &w->sess[k];
            if (ws->session != session)
                continue;
            if (ws->dflt)
                ws->target_batch = default_target(d, s, net_of(d, s, s->routes[i].worker));
            if (ws->target_batch > s->cap)
                ws->target_batch = s->cap;
        }
        if (s->routes[i].target_batch > s->cap)
            s->routes[i].target_batch = s->cap;
    }
    session_net_refresh(d, s);
    pump_session(d, session, now_us);
    finish(d);
    return 0;
}

int pl_dispatch_worker_add(pl_dispatch_t *d, int64_t now_us, int worker, int64_t duty_cycle_us)
{
    if (worker < 0 || duty_cycle_us < 0)
        return SQ_INVAL;
    begin(d);
    if (worker >= d->cap_workers) {
        int ncap = d->cap_workers ? d->cap_workers : 8;
        while (ncap <= worker)
            ncap *= 2;
        d->workers = sq_xrealloc(d->workers, sizeof(*d->workers) * (size_t)ncap);
        memset(&d->workers[d->cap_workers], 0,
               sizeof(*d->workers) * (size_t)(ncap - d->cap_workers));
        d->links = sq_xrealloc(d->links, sizeof(*d->links) * (size_t)ncap);
        memset(&d->links[d->cap_workers], 0, sizeof(*d->links) * (size_t)(ncap - d->cap_workers));
        d->cap_workers = ncap;
    }
    if (worker >= d->nworkers)
        d->nworkers = worker + 1;
    sq_iheap_reserve(&d->worker_wake, d->nworkers);
    worker_t *w = &d->workers[worker];
    /* Back while its last batch still runs (removed for a measurement that
     * was called off): present again, free once that batch is done. */
    w->draining = 0;
    w->present = 1;
    w->duty_cycle_us = duty_cycle_us;
    pump_worker(d, worker, now_us);
    finish(d);
    return 0;
}

int pl_dispatch_worker_net(pl_dispatch_t *d, int64_t now_us, int worker, int64_t rtt_us,
                           double bytes_per_us)
{
    if (worker < 0 || worker >= d->nworkers || rtt_us < 0 || isnan(bytes_per_us))
        return SQ_INVAL;
    worker_t *w = &d->workers[worker];
    begin(d);
    link_t *l = &d->links[worker];
    l->rtt_us = rtt_us < NET_OFF_MAX ? rtt_us : NET_OFF_MAX;
    l->us_per_byte = bytes_per_us > 0 ? 1.0 / bytes_per_us : 0;
    l->remote = l->rtt_us > 0 || l->us_per_byte > 0;
    if (l->remote)
        d->any_net = 1;
    /* Its sessions' expiry and default window follow the link. */
    for (int k = 0; k < w->nsess; k++) {
        session_t *s = &d->sessions[w->sess[k].session];
        session_net_refresh(d, s);
        if (w->sess[k].dflt) {
            int t = default_target(d, s, net_of(d, s, worker));
            w->sess[k].target_batch = t > s->cap ? s->cap : t;
        }
    }
    for (int k = 0; k < w->nsess; k++)
        pump_session(d, w->sess[k].session, now_us);
    if (!w->busy)
        pump_worker(d, worker, now_us);
    finish(d);
    return 0;
}

int pl_dispatch_worker_remove(pl_dispatch_t *d, int64_t now_us, int worker)
{
    begin(d);
    worker_t *w = worker_get(d, worker);
    if (w == NULL)
        return SQ_INVAL;
    worker_detach(d, worker);
    int nsess = w->nsess;
    int *sids = sq_xmalloc(sizeof(int) * (size_t)(nsess ? nsess : 1));
    for (int k = 0; k < nsess; k++)
        sids[k] = w->sess[k].session;
    w->nsess = 0;
    if (w->busy) {
        w->draining = 1;
    } else {
        w->present = 0;
    }
    /* Its sessions lost a worker: their heads may no longer make it. */
    for (int k = 0; k < nsess; k++)
        pump_session(d, sids[k], now_us);
    free(sids);
    finish(d);
    return 0;
}

int pl_dispatch_worker_lost(pl_dispatch_t *d, int64_t now_us, int worker)
{
    begin(d);
    if (worker < 0 || worker >= d->nworkers ||
        !(d->workers[worker].present || d->workers[worker].draining))
        return SQ_INVAL;
    worker_t *w = &d->workers[worker];
    worker_detach(d, worker);
    int nsess = w->nsess;
    int *sids = sq_xmalloc(sizeof(int) * (size_t)(nsess + 1));
    for (int k = 0; k < nsess; k++)
        sids[k] = w->sess[k].session;
    w->nsess = 0;
    int retry_sid = -1;
    if (w->busy) {
        session_t *s = session_get(d, w->batch_session);
        d->stats.queued += (uint64_t)w->ninflight;
        if (s != NULL) {
            retry_sid = w->batch_session;
            for (int i = 0; i < w->ninflight; i++) {
                pl__entry_t e = w->inflight[i];
                e.flags |= PL__ENTRY_RETRIED;
                pl__q_insert(&s->q, &e);
            }
            d->stats.retried += (uint64_t)w->ninflight;
        } else {
            /* Its session was removed while the batch ran: no queue to go
             * back to, and every request is still answered once. */
            for (int i = 0; i < w->ninflight; i++)
                drop(d, now_us, w->batch_session, &w->inflight[i], SQ_NOT_FOUND);
        }
    }
    w->busy = 0;
    w->ninflight = 0;
    w->foreign_next = 0;
    w->present = 0;
    w->draining = 0;
    w->rr = 0;
    w->round_open = 0;
    if (retry_sid >= 0)
        pump_session(d, retry_sid, now_us);
    for (int k = 0; k < nsess; k++)
        pump_session(d, sids[k], now_us);
    free(sids);
    finish(d);
    return 0;
}

static int route_cmp(const void *a, const void *b)
{
    const pl_route_t *x = a, *y = b;
    return (x->worker > y->worker) - (x->worker < y->worker);
}

int pl_dispatch_route_set(pl_dispatch_t *d, int64_t now_us, int session, const pl_route_t *routes,
                          int nroutes)
{
    begin(d);
    session_t *s = session_get(d, session);
    if (s == NULL || nroutes < 0 || (nroutes > 0 && routes == NULL))
        return SQ_INVAL;
    pl_route_t *copy = sq_xmalloc(sizeof(*copy) * (size_t)(nroutes ? nroutes : 1));
    if (nroutes > 0)
        memcpy(copy, routes, sizeof(*copy) * (size_t)nroutes);
    qsort(copy, (size_t)nroutes, sizeof(*copy), route_cmp);
    int *dflt = sq_xmalloc(sizeof(int) * (size_t)(nroutes ? nroutes : 1));
    for (int i = 0; i < nroutes; i++) {
        worker_t *w = worker_get(d, copy[i].worker);
        if (w == NULL || w->draining || (i > 0 && copy[i].worker == copy[i - 1].worker)) {
            free(copy);
            free(dflt);
            return SQ_INVAL;
        }
        dflt[i] = copy[i].target_batch <= 0;
        int t = copy[i].target_batch > 0 ? copy[i].target_batch
                                         : default_target(d, s, net_of(d, s, copy[i].worker));
        copy[i].target_batch = t > s->cap ? s->cap : t;
    }
    for (int i = 0; i < s->nroutes; i++)
        worker_forget_session(&d->workers[s->routes[i].worker], session);
    for (int i = 0; i < nroutes; i++) {
        worker_t *w = &d->workers[copy[i].worker];
        if (w->nsess == w->cap_sess) {
            w->cap_sess = w->cap_sess ? w->cap_sess * 2 : 4;
            w->sess = sq_xrealloc(w->sess, sizeof(*w->sess) * (size_t)w->cap_sess);
        }
        w->sess[w->nsess++] = (wsess_t){.session = session,
                                        .target_batch = copy[i].target_batch,
                                        .dflt = dflt[i],
                                        .overflow = copy[i].overflow != 0};
    }
    free(dflt);
    free(s->routes);
    s->routes = copy;
    s->nroutes = nroutes;
    session_net_refresh(d, s);
    pump_session(d, session, now_us);
    for (int i = 0; i < nroutes; i++)
        if (!d->workers[copy[i].worker].busy)
            pump_worker(d, copy[i].worker, now_us);
    finish(d);
    return 0;
}

int pl_dispatch_requests(pl_dispatch_t *d, int64_t now_us, int session, const pl_request_t *reqs,
                         int n)
{
    begin(d);
    session_t *s = session_get(d, session);
    if (s == NULL || n < 1 || reqs == NULL)
        return SQ_INVAL;
    /* All queued before the pump: deciding after the first would send it
     * alone and leave the rest to wait for the next batch. */
    for (int i = 0; i < n; i++) {
        pl__entry_t e = {.id = reqs[i].id,
                         .deadline_us = reqs[i].deadline_us,
                         .arrival_us = reqs[i].arrival_us,
                         .flags = 0};
        pl__q_insert(&s->q, &e);
    }
    if (now_us - s->win_start_us >= PL_RATE_WINDOW_US) {
        s->win_rate = (double)s->win_count / (double)(now_us - s->win_start_us);
        s->win_start_us = now_us;
        s->win_count = 0;
        s->win_first = 0;
    }
    /* The window's opening clump: the requests that open it, and those
     * within clump_us of it (items released one by one, e.g. after a
     * model load). Measured from the window's start, not from the request
     * before: a steady stream whose gaps are all shorter would otherwise
     * be one endless clump, with no rate at all. */
    if (s->win_count == 0 || now_us - s->win_start_us < d->opts.clump_us)
        s->win_first += n;
    s->win_count += n;
    s->last_arrival_us = now_us;
    d->stats.requests += (uint64_t)n;
    d->stats.queued += (uint64_t)n;
    pump_session(d, session, now_us);
    finish(d);
    return 0;
}

int pl_dispatch_request(pl_dispatch_t *d, int64_t now_us, uint64_t id, int session,
                        int64_t arrival_us, int64_t deadline_us)
{
    pl_request_t r = {.id = id, .arrival_us = arrival_us, .deadline_us = deadline_us};
    return pl_dispatch_requests(d, now_us, session, &r, 1);
}

int pl_dispatch_cancel(pl_dispatch_t *d, int64_t now_us, int session, uint64_t id)
{
    begin(d);
    session_t *s = session_get(d, session);
    if (s == NULL)
        return SQ_NOT_FOUND;
    for (uint32_t i = 0; i < s->q.n; i++) {
        if (pl__q_at(&s->q, i)->id != id)
            continue;
        /* Close the gap from the head side: entries before i move back one. */
        for (uint32_t j = i; j > 0; j--)
            *pl__q_at(&s->q, j) = *pl__q_at(&s->q, j - 1);
        pl__q_pop(&s->q);
        d->stats.queued--;
        /* The head may have changed: its wake time with it. */
        pump_session(d, session, now_us);
        finish(d);
        return 0;
    }
    finish(d);
    return SQ_NOT_FOUND;
}

void pl_dispatch_timer(pl_dispatch_t *d, int64_t now_us)
{
    begin(d);
    while (sq_iheap_top_key(&d->session_wake, PL_NEVER) <= now_us) {
        int sid = sq_iheap_top(&d->session_wake);
        pl__wake_set(&d->session_wake, sid, PL_NEVER);
        pump_session(d, sid, now_us);
    }
    while (sq_iheap_top_key(&d->worker_wake, PL_NEVER) <= now_us) {
        int wid = sq_iheap_top(&d->worker_wake);
        pl__wake_set(&d->worker_wake, wid, PL_NEVER);
        pump_worker(d, wid, now_us);
    }
    finish(d);
}

int64_t pl_dispatch_worker_gap_us(const pl_dispatch_t *d, int64_t now_us, int worker)
{
    if (worker < 0 || worker >= d->nworkers)
        return 0;
    const worker_t *w = &d->workers[worker];
    if (!w->present || w->draining || w->busy)
        return 0;
    int64_t gap = PL_NEVER;
    for (int k = 0; k < w->nsess; k++) {
        const session_t *s = &d->sessions[w->sess[k].session];
        if (!s->alive)
            continue;
        net_t n = net_of(d, s, worker);
        int64_t g = (s->slo_us - cost_on(s, n, 1)) / 2;
        if (s->q.n > 0) {
            int b = s->q.n < (uint32_t)s->cap ? (int)s->q.n : s->cap;
            int64_t h = pl__q_at((pl__queue_t *)&s->q, 0)->deadline_us - now_us - cost_on(s, n, b);
            if (h < g)
                g = h;
        }
        if (g < gap)
            gap = g;
    }
    return gap > 0 ? gap : 0;
}

uint64_t pl_dispatch_worker_foreign(pl_dispatch_t *d, int64_t now_us, int worker,
                                    int64_t duration_us, int after_batch)
{
    begin(d);
    if (worker < 0 || worker >= d->nworkers || duration_us < 1)
        return 0;
    worker_t *w = &d->workers[worker];
    if (!w->present || w->draining || w->foreign_next != 0 ||
        (w->busy && (!after_batch || w->batch_session < 0)))
        return 0;
    uint64_t id = ++d->next_batch_id;
    if (w->busy) {
        w->foreign_next = id;
        w->foreign_next_us = duration_us;
        w->busy_until += duration_us;
    } else {
        w->busy = 1;
        w->batch_id = id;
        w->batch_session = -1;
        w->ninflight = 0;
        w->busy_until = now_us + duration_us;
        pl__wake_set(&d->worker_wake, worker, PL_NEVER);
    }
    /* Its sessions' candidates see the worker busy for longer. */
    for (int k = 0; k < w->nsess; k++)
        pump_session(d, w->sess[k].session, now_us);
    finish(d);
    return id;
}

int pl_dispatch_batch_done(pl_dispatch_t *d, int64_t now_us, int worker, uint64_t batch_id)
{
    begin(d);
    if (worker < 0 || worker >= d->nworkers)
        return SQ_INVAL;
    worker_t *w = &d->workers[worker];
    if (!(w->present || w->draining) || !w->busy || w->batch_id != batch_id)
        return SQ_INVAL;
    w->ninflight = 0;
    if (w->foreign_next != 0) {
        /* Foreign work queued behind this batch runs now. */
        w->batch_id = w->foreign_next;
        w->batch_session = -1;
        w->busy_until = now_us + w->foreign_next_us;
        w->foreign_next = 0;
        finish(d);
        return 0;
    }
    w->busy = 0;
    if (w->draining) {
        w->draining = 0;
        w->present = 0;
    } else {
        pump_worker(d, worker, now_us);
    }
    finish(d);
    return 0;
}

size_t pl_dispatch_take(pl_dispatch_t *d, const pl_action_t **out)
{
    *out = d->acts;
    if (d->taken)
        return 0; /* nothing new since the last take: acting twice would send twice */
    for (size_t i = 0; i < d->nacts; i++)
        if (d->acts[i].kind == PL_ACT_SEND)
            d->acts[i].ids = d->ids + d->act_ids_off[i];
    *out = d->acts;
    d->taken = 1;
    return d->nacts;
}

int64_t pl_dispatch_next_wake(const pl_dispatch_t *d)
{
    return d->armed_us;
}

int64_t pl_dispatch_batch_cost_us(const pl_dispatch_t *d, int session, int b)
{
    if (session < 0 || session >= d->nsessions || !d->sessions[session].alive)
        return -1;
    const session_t *s = &d->sessions[session];
    return b >= 1 && b <= s->cap ? s->cost[b] : -1;
}

int64_t pl_dispatch_worker_batch_cost_us(const pl_dispatch_t *d, int session, int worker, int b)
{
    if (pl_dispatch_batch_cost_us(d, session, b) < 0 || worker < 0 || worker >= d->nworkers)
        return -1;
    const session_t *s = &d->sessions[session];
    return cost_on(s, net_of(d, s, worker), b);
}

int pl_dispatch_session_max_batch(const pl_dispatch_t *d, int session)
{
    if (session < 0 || session >= d->nsessions || !d->sessions[session].alive)
        return -1;
    return d->sessions[session].cap;
}

int pl_dispatch_queued(const pl_dispatch_t *d, int session)
{
    if (session < 0 || session >= d->nsessions || !d->sessions[session].alive)
        return -1;
    return (int)d->sessions[session].q.n;
}

void pl_dispatch_stats(const pl_dispatch_t *d, pl_dispatch_stats_t *out)
{
    *out = d->stats;
}
