/* Deferred batch formation (Symphony), and the adaptive policy on top of
 * it: per session one candidate batch, dispatchable from its frontrun
 * moment d - l(b+1) and valid until d - l(b); a free worker decides among
 * its sessions' candidates by priority and by what the others leave it. */
#include "dispatch_int.h"

#include <sq.h>

#include <assert.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

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
                                                              int64_t hold_until, candidate_t *c)
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
    if (b == cap || b < n || hold_until <= now_us) {
        c->ready_at = now_us;
    } else {
        /* The frontrun moment, but never later than timer_slack_us before
         * the last moment: a live timer that wakes a little late must still
         * find the batch sendable (when l(b+1) = l(b) the two coincide);
         * nor after hold_until, when the arrivals it waits for stopped. */
        int64_t d_head = pl__q_at(&s->q, (uint32_t)base)->deadline_us;
        c->ready_at = d_head - cost_on(s, net, b + 1);
        if (c->ready_at > d_head - cost_on(s, net, b) - s->timer_slack_us)
            c->ready_at = d_head - cost_on(s, net, b) - s->timer_slack_us;
        if (c->ready_at > hold_until)
            c->ready_at = hold_until;
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
                              int64_t hold_until, candidate_t *c)
{
    if (net_is_local(net))
        return candidate_on(s, NET_LOCAL, now_us, skip_ratio, hold_until, c);
    return candidate_on(s, net, now_us, skip_ratio, hold_until, c);
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
 * window's when that is higher or already a window long: the requests
 * after its opening clump (a clump's every one: what loads the workers is
 * the requests) over the time since, but at least a span of min(window,
 * SLO). A burst of k requests from k clients
 * is k arrivals in that span, not a rate of k per microsecond (issue 23:
 * 8 concurrent requests to an idle device waited for their 2 s SLO): it
 * defers only when k requests an SLO (or a window) are more than the
 * workers serve greedily at eager_load, which is also how soon a load that
 * rose shows. */
static int eager(const pl_dispatch_t *d, const session_t *s, int64_t now_us)
{
    if (s->best_effort)
        return 1; /* no SLO: nothing to wait for (pl_session_cfg_t.best_effort) */
    if (d->opts.policy != PL_POLICY_ADAPTIVE || s->nroutes == 0)
        return 0;
    int64_t el = now_us - s->win_start_us;
    int64_t span = s->slo_us > 0 && s->slo_us < PL_RATE_WINDOW_US ? s->slo_us : PL_RATE_WINDOW_US;
    int64_t after = s->win_count - s->win_first; /* window_rate_per_us's gaps */
    double cur = after > 0 ? (double)after / (double)(el > span ? el : span) : 0;
    double rate = el >= PL_RATE_WINDOW_US || cur > s->win_rate ? cur : s->win_rate;
    return rate < d->opts.eager_load * s->nroutes * s->greedy_per_us;
}

/* Adaptive: the arrivals a deferred batch waits for are expected within
 * this many of the session's mean gaps after the last one; past that the
 * flow has paused and waiting cannot grow the batch (P = e^-4, 2%, for
 * Poisson arrivals). */
#define HOLD_GAPS 4.0

/* The latest moment s's batch may wait for more requests: now when it
 * goes at once (eager, above); PL_NEVER for the deferred and early-drop
 * policies, which wait for the frontrun moment whatever comes (Symphony's
 * rule); for adaptive, HOLD_GAPS mean gaps after the last arrival. A
 * closed-loop client (its next request waits for this answer) at a rate
 * that reads as load was held to its frontrun moment, d - l(b + 1): with a
 * 60 s SLO it waited until the next plan epoch, 1-10 s (bench/
 * omp_live.py's closed loop of 1, p99 9.8 s against a p50 of 5 ms). */
static int64_t hold_until(const pl_dispatch_t *d, const session_t *s, int64_t now_us)
{
    if (eager(d, s, now_us))
        return now_us;
    if (d->opts.policy != PL_POLICY_ADAPTIVE || s->last_arrival_us == PL_NEVER)
        return PL_NEVER;
    double cur = window_rate_per_us(s, now_us);
    double rate = cur > s->win_rate ? cur : s->win_rate;
    if (!(rate > 0))
        return PL_NEVER;
    double gap = HOLD_GAPS / rate;
    return gap < (double)(PL_NEVER - s->last_arrival_us) ? s->last_arrival_us + (int64_t)gap
                                                         : PL_NEVER;
}

/* When a worker other than `except` holding s can next start a batch: now
 * if one is free, else when the first busy one comes free (an overdue one
 * now); PL_NEVER with no other. On the routes' index (dispatch_int.h). */
static int64_t next_start_except(const pl_dispatch_t *d, const session_t *s, int64_t now_us,
                                 int except)
{
    int f = pl__free_route_from(d, s, 0);
    if (f == except && f >= 0)
        f = pl__free_route_from(d, s, except + 1);
    if (f >= 0)
        return now_us;
    int64_t best = pl__busy_min_except(d, s, except);
    return best == PL_NEVER || best > now_us ? best : now_us;
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
        pl__prune(d, sid, s, now_us, pl__finish1_now(d, s, now_us));
        if (s->q.n == 0)
            continue;
        wcand_t *x = &all[n];
        x->sid = sid;
        net_t net = net_of(d, s, wid);
        if (!deferred_candidate(s, net, now_us, d->opts.skip_ratio, hold_until(d, s, now_us),
                                &x->c))
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
        pl__send_batch(d, now_us, all[pick].sid, wid, all[pick].c.skip, all[pick].c.b);
        return 1;
    }
    if (wake != PL_NEVER)
        pl__wake_set(&d->worker_wake, wid, wake);
    return 0;
}

/* With links: the first free worker in link order on which s has a
 * candidate, its candidate in *c; -1 when none. */
static int first_candidate(pl_dispatch_t *d, const session_t *s, int64_t now_us, candidate_t *c)
{
    int nfree = pl__free_by_link(d, s);
    for (int i = 0; i < nfree; i++) {
        int wid = d->order[i];
        if (deferred_candidate(s, net_of(d, s, wid), now_us, d->opts.skip_ratio,
                               hold_until(d, s, now_us), c))
            return wid;
    }
    return -1;
}

void pl__pump_session_deferred(pl_dispatch_t *d, int sid, int64_t now_us)
{
    session_t *s = &d->sessions[sid];
    for (;;) {
        int free_worker;
        int64_t finish1 = earliest_finish1(d, s, now_us, &free_worker);
        pl__prune(d, sid, s, now_us, finish1);
        if (s->q.n == 0) {
            pl__wake_set(&d->session_wake, sid, PL_NEVER);
            return;
        }
        int64_t wake = pl__q_at(&s->q, 0)->deadline_us - s->cost[1] - s->min_net1 + 1;
        candidate_t c;
        if (free_worker >= 0 && d->any_net)
            free_worker = first_candidate(d, s, now_us, &c);
        else if (free_worker >= 0)
            deferred_candidate(s, NET_LOCAL, now_us, d->opts.skip_ratio, hold_until(d, s, now_us),
                               &c);
        if (free_worker >= 0) {
            if (now_us >= c.ready_at) {
                /* Matchmaking: the free workers holding the model, lowest id
                 * first (with links: cheapest link first), each choosing
                 * among its own sessions. */
                int sent = 0;
                if (!d->any_net) {
                    /* Deciding changes no other worker's state: the next
                     * free one after wid is the next in route order. */
                    for (int wid = free_worker; wid >= 0 && !sent;
                         wid = pl__free_route_from(d, s, wid + 1))
                        sent = worker_decide(d, wid, now_us);
                } else {
                    int nfree = pl__free_by_link(d, s);
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

void pl__pump_worker_deferred(pl_dispatch_t *d, int wid, int64_t now_us)
{
    worker_t *w = &d->workers[wid];
    worker_decide(d, wid, now_us);
    /* Refresh the wake of every session this worker holds. */
    for (int k = 0; k < w->nsess; k++)
        pl__pump_session_deferred(d, w->sess[k].session, now_us);
}
