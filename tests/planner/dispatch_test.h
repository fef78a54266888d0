/* What the dispatch tests share: the rig, a tiny event loop on a virtual
 * clock that plays the runtime, with devices that hold a batch for exactly
 * the latency the core assumes (margin 0, no network delay), and the
 * helpers that set it up. Times in µs. */
#ifndef DISPATCH_TEST_H
#define DISPATCH_TEST_H

#include <criterion/criterion.h>
#include <pl_dispatch.h>
#include <sq.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAXW 16
#define MAXLOG 20000

typedef struct {
    int64_t at_us;
    int session, worker, count;
    uint64_t ids[64];
    int64_t finish_us;
} sent_t;

typedef struct {
    uint64_t id;
    int reason;
    int64_t at_us;
} dropped_t;

typedef struct {
    pl_dispatch_t *d;
    int64_t timer_us;
    int busy[MAXW];
    int64_t done_at[MAXW];
    uint64_t batch[MAXW];
    sent_t sent[MAXLOG];
    int nsent;
    dropped_t dropped[MAXLOG];
    int ndropped;
    int overlap; /* a worker got a batch while busy */
    /* Links: with `links` set, a device holds a batch for its latency under
     * the profile plus its own transfer, rtt + b * item_bytes / bw (worked
     * out here, not taken from the core's finish_us). */
    int links;
    int64_t rtt_us[MAXW];
    double bytes_per_us[MAXW];
    int64_t item_bytes[4]; /* per session */
    int64_t true_finish[MAXLOG];
} rig_t;

/* The transfer of b items of session s on worker w as the rig's devices
 * take it. */
static inline int64_t rig_net_us(const rig_t *r, int s, int w, int b)
{
    double x =
        r->bytes_per_us[w] > 0 ? (double)b * (double)r->item_bytes[s] / r->bytes_per_us[w] : 0;
    return r->rtt_us[w] + (int64_t)ceil(x);
}

/* Sets worker w's link in the core and in the rig. */
static inline void rig_link(rig_t *r, int64_t now, int w, int64_t rtt_us, double bytes_per_us)
{
    r->links = 1;
    r->rtt_us[w] = rtt_us;
    r->bytes_per_us[w] = bytes_per_us;
    cr_assert_eq(pl_dispatch_worker_net(r->d, now, w, rtt_us, bytes_per_us), 0);
}

static inline void absorb(rig_t *r)
{
    const pl_action_t *a;
    size_t n = pl_dispatch_take(r->d, &a);
    for (size_t i = 0; i < n; i++) {
        if (a[i].kind == PL_ACT_TIMER) {
            r->timer_us = a[i].at_us;
        } else if (a[i].kind == PL_ACT_DROP) {
            cr_assert_lt(r->ndropped, MAXLOG);
            r->dropped[r->ndropped++] =
                (dropped_t){.id = a[i].request_id, .reason = a[i].reason, .at_us = a[i].at_us};
        } else {
            int w = a[i].worker;
            if (r->busy[w])
                r->overlap = 1;
            r->busy[w] = 1;
            r->done_at[w] = a[i].finish_us;
            r->batch[w] = a[i].batch_id;
            cr_assert_lt(r->nsent, MAXLOG);
            if (r->links)
                r->done_at[w] = a[i].at_us +
                                pl_dispatch_batch_cost_us(r->d, a[i].session, a[i].count) +
                                rig_net_us(r, a[i].session, w, a[i].count);
            r->true_finish[r->nsent] = r->done_at[w];
            sent_t *s = &r->sent[r->nsent++];
            s->at_us = a[i].at_us;
            s->session = a[i].session;
            s->worker = w;
            s->count = a[i].count;
            s->finish_us = a[i].finish_us;
            cr_assert_leq(a[i].count, 64);
            memcpy(s->ids, a[i].ids, sizeof(uint64_t) * (size_t)a[i].count);
        }
    }
}

/* pl_dispatch_opts_t.eager_load of the rigs made next (0: the default). */
static double rig_eager_load;

static inline void rig_init(rig_t *r, pl_policy_t policy)
{
    memset(r, 0, sizeof(*r));
    pl_dispatch_opts_t o = {
        .policy = policy, .k_std = 0, .net_delay_us = 0, .eager_load = rig_eager_load};
    r->d = pl_dispatch_new(&o);
    r->timer_us = PL_NEVER;
}

typedef struct {
    int64_t at_us;
    int session;
    int64_t deadline_us;
    /* Not 0: consecutive arrivals with the same clump number (and time and
     * session) are handed over together, pl_dispatch_requests. */
    int clump;
} arrival_t;

/* Runs arrivals [first, narr) (sorted by time; request id = index + 1) and
 * every event up to until_us (PL_NEVER: to the end): at one moment,
 * completions first, then arrivals, then the timer. */
static inline void rig_run_from(rig_t *r, const arrival_t *arr, int first, int narr, int nworkers,
                                int64_t until_us)
{
    int next = first;
    for (;;) {
        int64_t t_done = PL_NEVER;
        for (int w = 0; w < nworkers; w++)
            if (r->busy[w] && r->done_at[w] < t_done)
                t_done = r->done_at[w];
        int64_t t_arr = next < narr ? arr[next].at_us : PL_NEVER;
        int64_t now = t_done;
        if (t_arr < now)
            now = t_arr;
        if (r->timer_us < now)
            now = r->timer_us;
        if (now == PL_NEVER || now > until_us)
            break;
        if (t_done == now) {
            for (int w = 0; w < nworkers; w++) {
                if (r->busy[w] && r->done_at[w] == now) {
                    r->busy[w] = 0;
                    cr_assert_eq(pl_dispatch_batch_done(r->d, now, w, r->batch[w]), 0);
                    absorb(r);
                }
            }
        } else if (t_arr == now && arr[next].clump != 0) {
            pl_request_t reqs[64];
            int n = 0;
            const arrival_t *a = &arr[next];
            while (next < narr && arr[next].clump == a->clump && arr[next].at_us == now) {
                cr_assert_lt(n, 64);
                cr_assert_eq(arr[next].session, a->session);
                reqs[n++] = (pl_request_t){.id = (uint64_t)next + 1,
                                           .arrival_us = now,
                                           .deadline_us = arr[next].deadline_us};
                next++;
            }
            cr_assert_eq(pl_dispatch_requests(r->d, now, a->session, reqs, n), 0);
            absorb(r);
        } else if (t_arr == now) {
            const arrival_t *a = &arr[next];
            cr_assert_eq(
                pl_dispatch_request(r->d, now, (uint64_t)next + 1, a->session, now, a->deadline_us),
                0);
            next++;
            absorb(r);
        } else {
            r->timer_us = PL_NEVER;
            pl_dispatch_timer(r->d, now);
            absorb(r);
        }
    }
}

static inline void rig_run(rig_t *r, const arrival_t *arr, int narr, int nworkers)
{
    rig_run_from(r, arr, 0, narr, nworkers, PL_NEVER);
}

static inline int add_linear_session(pl_dispatch_t *d, double alpha_us, double beta_us,
                                     int max_batch, int64_t slo_us)
{
    pl_profile_t p;
    pl_profile_init_linear(&p, alpha_us, beta_us, max_batch);
    pl_session_cfg_t cfg = {.profile = &p, .slo_us = slo_us, .max_batch = 0};
    int sid = pl_dispatch_session_add(d, &cfg);
    pl_profile_dispose(&p);
    return sid;
}

static inline void route_all(rig_t *r, int sid, int nworkers, int target)
{
    pl_route_t routes[MAXW];
    for (int w = 0; w < nworkers; w++)
        routes[w] = (pl_route_t){.worker = w, .target_batch = target};
    cr_assert_eq(pl_dispatch_route_set(r->d, 0, sid, routes, nworkers), 0);
    absorb(r);
}

static inline void add_workers(rig_t *r, int n)
{
    for (int w = 0; w < n; w++)
        cr_assert_eq(pl_dispatch_worker_add(r->d, 0, w, 0), 0);
    absorb(r);
}

/* A rig with n workers and one session of l(b) = b + 5 ms, SLO 12 ms (the
 * Symphony section 3.3 profile), routed to every worker; its id in *sid. */
static inline rig_t *linear_rig(pl_policy_t policy, int nworkers, int *sid)
{
    rig_t *r = malloc(sizeof(*r));
    rig_init(r, policy);
    add_workers(r, nworkers);
    *sid = add_linear_session(r->d, 1000, 5000, 64, 12000);
    route_all(r, *sid, nworkers, 0);
    return r;
}

/* n requests of session sid, one every gap_us from 0, each with the 12 ms
 * SLO of linear_rig. */
static inline void run_every(rig_t *r, int sid, int64_t gap_us, int n, int nworkers)
{
    arrival_t *arr = malloc(sizeof(*arr) * (size_t)n);
    for (int i = 0; i < n; i++)
        arr[i] =
            (arrival_t){.at_us = gap_us * i, .session = sid, .deadline_us = gap_us * i + 12000};
    rig_run(r, arr, n, nworkers);
    free(arr);
}

#endif
