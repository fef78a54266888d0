/* Dispatcher core (pl_dispatch.h): its public API, over deadline queues,
 * early-drop and deferred batch formation (dispatch_early_drop.c,
 * dispatch_deferred.c) and matchmaking (dispatch_core.c). Pure; see the
 * header for the contract.
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

static void pump_session(pl_dispatch_t *d, int sid, int64_t now_us)
{
    if (!d->sessions[sid].alive)
        return;
    if (d->opts.policy != PL_POLICY_EARLY_DROP)
        pl__pump_session_deferred(d, sid, now_us);
    else
        pl__pump_session_early_drop(d, sid, now_us);
}

static void pump_worker(pl_dispatch_t *d, int wid, int64_t now_us)
{
    if (d->opts.policy != PL_POLICY_EARLY_DROP) {
        pl__pump_worker_deferred(d, wid, now_us);
    } else {
        pl__pump_worker_early_drop(d, wid, now_us);
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
        free(d->sessions[i].route_bits);
        sq_iheap_dispose(&d->sessions[i].busy_heap);
    }
    for (int i = 0; i < d->nworkers; i++) {
        free(d->workers[i].inflight);
        free(d->workers[i].sess);
    }
    free(d->sessions);
    free(d->workers);
    free(d->links);
    free(d->busy_bits);
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
static int build_costs(const pl_dispatch_opts_t *o, const pl_profile_t *profile, int max_batch,
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
        double l = pl_latency_us(profile, b, o->k_std);
        if (l < 0)
            break;
        int64_t c = o->net_delay_us + (int64_t)ceil(l);
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

int64_t pl_dispatch_least_us(const pl_dispatch_opts_t *opts, const pl_profile_t *profile,
                             int max_batch, int n)
{
    pl_dispatch_opts_t o = *opts;
    if (o.net_delay_us < 0) /* as pl_dispatch_new */
        o.net_delay_us = 0;
    int64_t *cost;
    int cap;
    double greedy;
    if (n < 1 || build_costs(&o, profile, max_batch, 0, &cost, &cap, &greedy) != 0)
        return -1;
    int rest = n % cap;
    int64_t run = (int64_t)(n / cap) * (cost[cap] - o.net_delay_us) +
                  (rest > 0 ? cost[rest] - o.net_delay_us : 0);
    free(cost);
    return run + o.net_delay_us;
}

int pl_dispatch_session_add(pl_dispatch_t *d, const pl_session_cfg_t *cfg)
{
    if (cfg == NULL || cfg->profile == NULL || cfg->slo_us < 0 || cfg->priority < 0 ||
        cfg->priority >= PL_PRIORITY_BEST_EFFORT)
        return SQ_INVAL;
    int64_t *cost;
    int usable;
    double greedy;
    if (build_costs(&d->opts, cfg->profile, cfg->max_batch, cfg->slo_us, &cost, &usable, &greedy) !=
        0)
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
    s->best_effort = cfg->best_effort != 0;
    s->priority = s->best_effort ? PL_PRIORITY_BEST_EFFORT + cfg->priority : cfg->priority;
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
        pl__routes_index(d, s);
        session_net_refresh(d, s);
    }
    pl__wake_set(&d->worker_wake, wid, PL_NEVER);
}

int pl_dispatch_session_remove(pl_dispatch_t *d, int64_t now_us, int session)
{
    pl__begin(d);
    session_t *s = pl__session_get(d, session);
    if (s == NULL)
        return SQ_INVAL;
    while (s->q.n > 0) {
        pl__entry_t gone = pl__q_pop(&s->q);
        pl__drop(d, now_us, session, &gone, SQ_NOT_FOUND);
    }
    for (int i = 0; i < s->nroutes; i++)
        worker_forget_session(&d->workers[s->routes[i].worker], session);
    s->nroutes = 0;
    pl__routes_index(d, s);
    s->alive = 0;
    pl__wake_set(&d->session_wake, session, PL_NEVER);
    pl__finish(d);
    return 0;
}

int pl_dispatch_session_profile(pl_dispatch_t *d, int64_t now_us, int session,
                                const pl_profile_t *profile)
{
    pl__begin(d);
    session_t *s = pl__session_get(d, session);
    if (s == NULL || profile == NULL)
        return SQ_INVAL;
    int64_t *cost;
    int usable;
    double greedy;
    if (build_costs(&d->opts, profile, s->max_batch_cfg, s->slo_us, &cost, &usable, &greedy) != 0)
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
                ws->target_batch = pl__default_target(d, s, net_of(d, s, s->routes[i].worker));
            if (ws->target_batch > s->cap)
                ws->target_batch = s->cap;
        }
        if (s->routes[i].target_batch > s->cap)
            s->routes[i].target_batch = s->cap;
    }
    session_net_refresh(d, s);
    pump_session(d, session, now_us);
    pl__finish(d);
    return 0;
}

int pl_dispatch_worker_add(pl_dispatch_t *d, int64_t now_us, int worker, int64_t duty_cycle_us)
{
    if (worker < 0 || duty_cycle_us < 0)
        return SQ_INVAL;
    pl__begin(d);
    if (worker >= d->cap_workers) {
        int ncap = d->cap_workers ? d->cap_workers : 8;
        while (ncap <= worker)
            ncap *= 2;
        d->workers = sq_xrealloc(d->workers, sizeof(*d->workers) * (size_t)ncap);
        memset(&d->workers[d->cap_workers], 0,
               sizeof(*d->workers) * (size_t)(ncap - d->cap_workers));
        d->links = sq_xrealloc(d->links, sizeof(*d->links) * (size_t)ncap);
        memset(&d->links[d->cap_workers], 0, sizeof(*d->links) * (size_t)(ncap - d->cap_workers));
        /* ncap is a power of two >= 8: whole words from 64 workers on. */
        size_t oldw = ((size_t)d->cap_workers + 63) / 64, neww = ((size_t)ncap + 63) / 64;
        d->busy_bits = sq_xrealloc(d->busy_bits, sizeof(uint64_t) * neww);
        memset(&d->busy_bits[oldw], 0, sizeof(uint64_t) * (neww - oldw));
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
    pl__finish(d);
    return 0;
}

int pl_dispatch_worker_net(pl_dispatch_t *d, int64_t now_us, int worker, int64_t rtt_us,
                           double bytes_per_us)
{
    if (worker < 0 || worker >= d->nworkers || rtt_us < 0 || isnan(bytes_per_us))
        return SQ_INVAL;
    worker_t *w = &d->workers[worker];
    pl__begin(d);
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
            int t = pl__default_target(d, s, net_of(d, s, worker));
            w->sess[k].target_batch = t > s->cap ? s->cap : t;
        }
    }
    for (int k = 0; k < w->nsess; k++)
        pump_session(d, w->sess[k].session, now_us);
    if (!w->busy)
        pump_worker(d, worker, now_us);
    pl__finish(d);
    return 0;
}

int pl_dispatch_worker_remove(pl_dispatch_t *d, int64_t now_us, int worker)
{
    pl__begin(d);
    worker_t *w = pl__worker_get(d, worker);
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
    pl__finish(d);
    return 0;
}

int pl_dispatch_worker_lost(pl_dispatch_t *d, int64_t now_us, int worker)
{
    pl__begin(d);
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
        session_t *s = pl__session_get(d, w->batch_session);
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
                pl__drop(d, now_us, w->batch_session, &w->inflight[i], SQ_NOT_FOUND);
        }
    }
    pl__worker_set_free(d, worker);
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
    pl__finish(d);
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
    pl__begin(d);
    session_t *s = pl__session_get(d, session);
    if (s == NULL || nroutes < 0 || (nroutes > 0 && routes == NULL))
        return SQ_INVAL;
    pl_route_t *copy = sq_xmalloc(sizeof(*copy) * (size_t)(nroutes ? nroutes : 1));
    if (nroutes > 0)
        memcpy(copy, routes, sizeof(*copy) * (size_t)nroutes);
    qsort(copy, (size_t)nroutes, sizeof(*copy), route_cmp);
    int *dflt = sq_xmalloc(sizeof(int) * (size_t)(nroutes ? nroutes : 1));
    for (int i = 0; i < nroutes; i++) {
        worker_t *w = pl__worker_get(d, copy[i].worker);
        if (w == NULL || w->draining || (i > 0 && copy[i].worker == copy[i - 1].worker)) {
            free(copy);
            free(dflt);
            return SQ_INVAL;
        }
        dflt[i] = copy[i].target_batch <= 0;
        int t = copy[i].target_batch > 0 ? copy[i].target_batch
                                         : pl__default_target(d, s, net_of(d, s, copy[i].worker));
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
    pl__routes_index(d, s);
    session_net_refresh(d, s);
    pump_session(d, session, now_us);
    for (int i = 0; i < nroutes; i++)
        if (!d->workers[copy[i].worker].busy)
            pump_worker(d, copy[i].worker, now_us);
    pl__finish(d);
    return 0;
}

int pl_dispatch_requests(pl_dispatch_t *d, int64_t now_us, int session, const pl_request_t *reqs,
                         int n)
{
    pl__begin(d);
    session_t *s = pl__session_get(d, session);
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
    pl__finish(d);
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
    pl__begin(d);
    session_t *s = pl__session_get(d, session);
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
        pl__finish(d);
        return 0;
    }
    pl__finish(d);
    return SQ_NOT_FOUND;
}

void pl_dispatch_timer(pl_dispatch_t *d, int64_t now_us)
{
    pl__begin(d);
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
    pl__finish(d);
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
        /* Without an SLO, or idle, only its queue's deadlines bound the gap. */
        int idle = s->last_arrival_us == PL_NEVER || now_us - s->last_arrival_us > PL_GAP_IDLE_US;
        int64_t g = s->slo_us > 0 && !idle ? (s->slo_us - cost_on(s, n, 1)) / 2 : PL_NEVER;
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
    pl__begin(d);
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
        pl__worker_set_busy(d, worker, w->busy_until + duration_us);
    } else {
        pl__worker_set_busy(d, worker, now_us + duration_us);
        w->batch_id = id;
        w->batch_session = -1;
        w->ninflight = 0;
        pl__wake_set(&d->worker_wake, worker, PL_NEVER);
    }
    /* Its sessions' candidates see the worker busy for longer. */
    for (int k = 0; k < w->nsess; k++)
        pump_session(d, w->sess[k].session, now_us);
    pl__finish(d);
    return id;
}

int pl_dispatch_batch_done(pl_dispatch_t *d, int64_t now_us, int worker, uint64_t batch_id)
{
    pl__begin(d);
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
        pl__worker_set_busy(d, worker, now_us + w->foreign_next_us);
        w->foreign_next = 0;
        pl__finish(d);
        return 0;
    }
    pl__worker_set_free(d, worker);
    if (w->draining) {
        w->draining = 0;
        w->present = 0;
    } else {
        pump_worker(d, worker, now_us);
    }
    pl__finish(d);
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
