/* Early-drop batch formation (Nexus): per worker, round-robin over its
 * sessions within the duty cycle; a sliding window of the target batch
 * drops the requests that would make the window miss its deadline. */
#include "dispatch_int.h"

#include <sq.h>

#include <assert.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Tries session k of worker wid: the sliding window of the target batch
 * slides past heads that would make it miss their deadline. 1 if sent. */
static int early_drop_try(pl_dispatch_t *d, int wid, int k, int64_t now_us)
{
    worker_t *w = &d->workers[wid];
    int sid = w->sess[k].session;
    session_t *s = &d->sessions[sid];
    int target = w->sess[k].target_batch;
    net_t net = net_of(d, s, wid);
    pl__prune(d, sid, s, now_us, pl__finish1_now(d, s, now_us));
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
        pl__drop(d, now_us, sid, &gone, reason);
    }
    if (s->q.n == 0)
        return 0;
    int b = (int)s->q.n < target ? (int)s->q.n : target;
    pl__send_batch(d, now_us, sid, wid, 0, b);
    return 1;
}

void pl__pump_worker_early_drop(pl_dispatch_t *d, int wid, int64_t now_us)
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
void pl__pump_session_early_drop(pl_dispatch_t *d, int sid, int64_t now_us)
{
    session_t *s = &d->sessions[sid];
    if (!d->any_net) {
        /* The free workers holding s in route order (the routes' index);
         * a pump changes no other worker's state. */
        for (int wid = pl__free_route_from(d, s, 0); wid >= 0 && s->q.n > 0;
             wid = pl__free_route_from(d, s, wid + 1))
            pl__pump_worker_early_drop(d, wid, now_us);
    } else {
        /* Cheapest link first: a local idle device before a remote one. */
        int nfree = pl__free_by_link(d, s);
        for (int i = 0; i < nfree && s->q.n > 0; i++)
            pl__pump_worker_early_drop(d, d->order[i], now_us);
    }
    int free_worker;
    pl__prune(d, sid, s, now_us, earliest_finish1(d, s, now_us, &free_worker));
    pl__wake_set(&d->session_wake, sid,
                 s->q.n ? pl__q_at(&s->q, 0)->deadline_us - s->cost[1] - s->min_net1 + 1
                        : PL_NEVER);
}
