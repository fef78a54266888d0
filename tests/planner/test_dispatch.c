/* Dispatcher core (planner/dispatch.c) on a virtual clock, on the rig of
 * dispatch_test.h: devices that hold a batch for exactly the latency the core
 * assumes (margin 0, no network delay). Times in µs; the Symphony example's
 * time unit is 1 ms. */
#include "dispatch_test.h"

Test(dispatch, symphony_section_3_3_worked_example)
{
    /* 3 devices, l(b) = b + 5, SLO 12, request i arrives at 0.75 (i - 1). */
    rig_t *r = malloc(sizeof(*r));
    rig_init(r, PL_POLICY_DEFERRED);
    add_workers(r, 3);
    int sid = add_linear_session(r->d, 1000, 5000, 64, 12000);
    cr_assert_eq(sid, 0);
    cr_assert_eq(pl_dispatch_session_max_batch(r->d, sid), 7, "l(7) = 12 fits the SLO, l(8) not");
    route_all(r, sid, 3, 0);
    arrival_t arr[48];
    for (int i = 0; i < 48; i++)
        arr[i] = (arrival_t){.at_us = 750 * i, .session = sid, .deadline_us = 750 * i + 12000};
    rig_run(r, arr, 48, 3);

    cr_assert_eq(r->ndropped, 0, "none dropped");
    cr_assert_eq(r->overlap, 0);
    cr_assert_eq(r->nsent, 12);
    for (int k = 0; k < 12; k++) {
        sent_t *s = &r->sent[k];
        cr_assert_eq(s->count, 4, "batch %d has size %d", k, s->count);
        /* The first batch (requests 1-4) leaves at 2.25 when request 4
         * arrives (its frontrun moment 12 - l(5) = 2 has passed); then every
         * 3 units, on the three devices in turn: staggered, each device
         * busy all the time (a batch of 4 takes 9 = 3 x 3). */
        cr_assert_eq(s->at_us, 2250 + 3000 * k, "batch %d at %lld", k, (long long)s->at_us);
        cr_assert_eq(s->worker, k % 3);
        for (int j = 0; j < 4; j++)
            cr_assert_eq(s->ids[j], (uint64_t)(4 * k + j + 1));
        cr_assert_eq(s->finish_us, s->at_us + 9000);
        cr_assert_leq(s->finish_us, 750 * (4 * k) + 12000);
    }
    pl_dispatch_stats_t st;
    pl_dispatch_stats(r->d, &st);
    cr_assert_eq(st.requests, 48);
    cr_assert_eq(st.sent_requests, 48);
    cr_assert_eq(st.queued, 0);
    pl_dispatch_free(r->d);
    free(r);
}

/* Priorities: one worker, two sessions of l(b) = b + 5 ms, SLO 30 ms, and
 * priorities prio_a and prio_b; session a gets a request every gap_a_us from
 * 0, session b every gap_b_us from 250 µs, for 2 s. Returns the rig (the
 * caller frees it); in served[s] the requests of session s served by their
 * deadline, in offered[s] those it got. */
static rig_t *priority_run(pl_policy_t policy, int prio_a, int prio_b, int64_t gap_a_us,
                           int64_t gap_b_us, int served[2], int offered[2])
{
    const int64_t slo_us = 30000, span_us = 2000000;
    rig_t *r = malloc(sizeof(*r));
    rig_init(r, policy);
    add_workers(r, 1);
    int prio[2] = {prio_a, prio_b};
    for (int k = 0; k < 2; k++) {
        pl_profile_t p;
        pl_profile_init_linear(&p, 1000, 5000, 64);
        pl_session_cfg_t cfg = {.profile = &p, .slo_us = slo_us, .priority = prio[k]};
        cr_assert_eq(pl_dispatch_session_add(r->d, &cfg), k);
        pl_profile_dispose(&p);
        route_all(r, k, 1, 0);
    }
    int cap = (int)(span_us / gap_a_us + span_us / gap_b_us) + 2;
    arrival_t *arr = malloc(sizeof(*arr) * (size_t)cap);
    int64_t *deadline = malloc(sizeof(int64_t) * (size_t)(cap + 1));
    int narr = 0;
    int64_t next[2] = {0, 250};
    const int64_t gap[2] = {gap_a_us, gap_b_us};
    offered[0] = offered[1] = 0;
    for (;;) {
        int k = next[0] <= next[1] ? 0 : 1;
        if (next[k] >= span_us)
            break;
        arr[narr] = (arrival_t){.at_us = next[k], .session = k, .deadline_us = next[k] + slo_us};
        deadline[narr + 1] = arr[narr].deadline_us;
        narr++;
        offered[k]++;
        next[k] += gap[k];
    }
    rig_run(r, arr, narr, 1);
    cr_assert_eq(r->overlap, 0);
    served[0] = served[1] = 0;
    for (int i = 0; i < r->nsent; i++) {
        const sent_t *b = &r->sent[i];
        for (int j = 0; j < b->count; j++)
            served[b->session] += b->finish_us <= deadline[b->ids[j]];
    }
    cr_assert_eq(served[0] + served[1] + r->ndropped, narr, "every request has an outcome");
    free(arr);
    free(deadline);
    return r;
}

Test(dispatch, under_overload_the_lower_priority_session_absorbs_the_drops)
{
    /* 333 + 333 req/s against one worker: overloaded once both sessions
     * batch under their own deadlines, while session a alone (batches of
     * about 6 every 18 ms) fits. With equal priorities both sessions lose
     * requests; with a first (1 before 3) a keeps every one of its own, and
     * b loses what does not fit but still gets some of what a leaves. */
    for (int pol = 0; pol < 2; pol++) {
        pl_policy_t policy = pol ? PL_POLICY_ADAPTIVE : PL_POLICY_DEFERRED;
        int served[2], offered[2];
        rig_t *r = priority_run(policy, 0, 0, 3000, 3000, served, offered);
        cr_assert_lt(served[0], offered[0] * 95 / 100, "policy %d: equal: a served %d of %d", pol,
                     served[0], offered[0]);
        cr_assert_lt(served[1], offered[1] * 95 / 100, "policy %d: equal: b served %d of %d", pol,
                     served[1], offered[1]);
        pl_dispatch_free(r->d);
        free(r);

        r = priority_run(policy, 1, 3, 3000, 3000, served, offered);
        cr_assert_eq(served[0], offered[0], "policy %d: a first: a served %d of %d", pol, served[0],
                     offered[0]);
        cr_assert_lt(served[1], offered[1] * 80 / 100, "policy %d: a first: b served %d of %d", pol,
                     served[1], offered[1]);
        cr_assert_gt(served[1], offered[1] / 20, "policy %d: b still gets the gaps: %d of %d", pol,
                     served[1], offered[1]);
        pl_dispatch_free(r->d);
        free(r);

        /* The other way round: the order is the priority's, not the
         * session id's. */
        r = priority_run(policy, 4, 2, 3000, 3000, served, offered);
        cr_assert_eq(served[1], offered[1], "policy %d: b first: b served %d of %d", pol, served[1],
                     offered[1]);
        cr_assert_lt(served[0], offered[0] * 80 / 100, "policy %d: b first: a served %d of %d", pol,
                     served[0], offered[0]);
        pl_dispatch_free(r->d);
        free(r);
    }
}

/* A session of l(b) = b + 5 ms at priority prio, routed to worker 0. */
static int add_prio_session(rig_t *r, int64_t slo_us, int prio)
{
    pl_profile_t p;
    pl_profile_init_linear(&p, 1000, 5000, 64);
    pl_session_cfg_t cfg = {.profile = &p, .slo_us = slo_us, .priority = prio};
    int sid = pl_dispatch_session_add(r->d, &cfg);
    pl_profile_dispose(&p);
    cr_assert_geq(sid, 0);
    route_all(r, sid, 1, 0);
    return sid;
}

Test(dispatch, a_lower_priority_batch_leaves_an_active_higher_one_its_slo)
{
    /* One worker; h (priority 1, SLO 30 ms, target batch 10: l(10) = 15
     * ms) and lo (priority 3, SLO 60 ms) with 40 requests at once. Alone,
     * lo waits for its frontrun moment and runs all 40 in one batch (45
     * ms). With h active (a request of it just came), a request of h
     * arriving as a batch of lo starts must still make 30 ms after it in a
     * batch of 10: lo runs batches of at most 10 (15 ms). */
    for (int active = 0; active < 2; active++) {
        rig_t *r = malloc(sizeof(*r));
        rig_init(r, PL_POLICY_DEFERRED);
        add_workers(r, 1);
        int h = add_prio_session(r, 30000, 1), lo = add_prio_session(r, 60000, 3);
        arrival_t arr[41];
        int n = 0;
        if (active)
            arr[n++] = (arrival_t){.at_us = 0, .session = h, .deadline_us = 30000};
        for (int i = 0; i < 40; i++)
            arr[n++] = (arrival_t){.at_us = 0, .session = lo, .deadline_us = 60000};
        rig_run(r, arr, n, 1);
        cr_assert_eq(r->overlap, 0);
        int lo_batches = 0, largest = 0, h_served = 0;
        for (int k = 0; k < r->nsent; k++) {
            if (r->sent[k].session == h) {
                h_served += r->sent[k].count;
                continue;
            }
            lo_batches++;
            largest = r->sent[k].count > largest ? r->sent[k].count : largest;
        }
        if (!active) {
            cr_assert_eq(lo_batches, 1);
            cr_assert_eq(largest, 40);
        } else {
            cr_assert_eq(h_served, 1, "h's request is served");
            cr_assert_leq(largest, 10, "a batch of lo of %d while h is active", largest);
            cr_assert_geq(lo_batches, 2);
        }
        pl_dispatch_free(r->d);
        free(r);
    }
}

/* Worker 0 is planned for `big` (l(b) = 20 b + 10 ms, SLO 300 ms), worker
 * 1 for `tight` (l(b) = b + 5 ms, SLO 30 ms, target batch 3) and, unless
 * `planned_on_1`, holds big only for its overflow. Runs arrivals and
 * returns how many of big's requests ran on worker 1; *tight_ok: tight's
 * requests served. */
static int overflow_run(pl_policy_t policy, int planned_on_1, const arrival_t *arr, int narr,
                        int *tight_ok)
{
    rig_t *r = malloc(sizeof(*r));
    rig_init(r, policy);
    add_workers(r, 2);
    int big = add_linear_session(r->d, 20000, 10000, 64, 300000);
    int tight = add_linear_session(r->d, 1000, 5000, 64, 30000);
    cr_assert(big == 0 && tight == 1);
    pl_route_t rb[] = {{.worker = 0, .target_batch = 14},
                       {.worker = 1, .target_batch = 0, .overflow = !planned_on_1}};
    cr_assert_eq(pl_dispatch_route_set(r->d, 0, big, rb, 2), 0);
    pl_route_t rt[] = {{.worker = 1, .target_batch = 3}};
    cr_assert_eq(pl_dispatch_route_set(r->d, 0, tight, rt, 1), 0);
    absorb(r);
    rig_run(r, arr, narr, 2);
    cr_assert_eq(r->overlap, 0);
    int big_on_1 = 0;
    *tight_ok = 0;
    for (int k = 0; k < r->nsent; k++) {
        if (r->sent[k].session == tight)
            *tight_ok += r->sent[k].count;
        else if (r->sent[k].worker == 1)
            big_on_1 += r->sent[k].count;
    }
    pl_dispatch_free(r->d);
    free(r);
    return big_on_1;
}

Test(dispatch, an_overflow_batch_leaves_a_tight_session_its_room_while_its_own_worker_can_run_it)
{
    /* Adaptive at low load: 10 of big at once go as one batch to worker 0
     * (210 ms); tight is active (a request at 90 ms); one more of big at
     * 100 ms would go at once to the free worker 1. A batch of big takes
     * at least 30 ms there, and a request of tight arriving as it starts
     * would miss its 30 ms: as overflow it waits for worker 0 (free at 211
     * ms, done by 241, deadline 400); planned on worker 1 it runs there. */
    arrival_t arr[12];
    int n = 0;
    for (int i = 0; i < 10; i++)
        arr[n++] = (arrival_t){.at_us = 0, .session = 0, .deadline_us = 300000, .clump = 1};
    arr[n++] = (arrival_t){.at_us = 90000, .session = 1, .deadline_us = 120000};
    arr[n++] = (arrival_t){.at_us = 100000, .session = 0, .deadline_us = 400000};
    int tight_ok;
    cr_assert_eq(overflow_run(PL_POLICY_ADAPTIVE, 0, arr, n, &tight_ok), 0,
                 "worker 0 can still run it: not on tight's worker");
    cr_assert_eq(tight_ok, 1);
    cr_assert_eq(overflow_run(PL_POLICY_ADAPTIVE, 1, arr, n, &tight_ok), 1,
                 "planned there: at once on the free worker");
    cr_assert_eq(tight_ok, 1);
}

Test(dispatch, an_overflow_batch_runs_where_its_own_workers_cannot_make_it)
{
    /* Overload: 40 of big at once, deadline 301 ms; worker 0 alone runs 14
     * by then. Overflow is for that: worker 1 takes what worker 0 cannot
     * make, batch for batch as when big is planned there (tight's queued
     * request included: the batch that must leave first goes). */
    for (int pol = 0; pol < 2; pol++) {
        pl_policy_t policy = pol == 0 ? PL_POLICY_DEFERRED : PL_POLICY_ADAPTIVE;
        arrival_t arr[41];
        int n = 0;
        arr[n++] = (arrival_t){.at_us = 0, .session = 1, .deadline_us = 30000};
        for (int i = 0; i < 40; i++)
            arr[n++] = (arrival_t){.at_us = 1000, .session = 0, .deadline_us = 301000};
        int tight_as_overflow, tight_planned;
        int as_overflow = overflow_run(policy, 0, arr, n, &tight_as_overflow);
        cr_assert_gt(as_overflow, 0, "policy %d", pol);
        cr_assert_eq(overflow_run(policy, 1, arr, n, &tight_planned), as_overflow);
        cr_assert_eq(tight_as_overflow, tight_planned);
    }
}

Test(dispatch, equal_priorities_change_nothing)
{
    /* Every decision, batch by batch and drop by drop, is the one made
     * without priorities, at low load and under overload. */
    int64_t gaps[3][2] = {{9000, 7000}, {2000, 2000}, {1000, 3000}};
    for (int pol = 0; pol < 3; pol++) {
        for (int g = 0; g < 3; g++) {
            int served[2], offered[2];
            rig_t *none =
                priority_run((pl_policy_t)pol, 0, 0, gaps[g][0], gaps[g][1], served, offered);
            rig_t *same =
                priority_run((pl_policy_t)pol, 3, 3, gaps[g][0], gaps[g][1], served, offered);
            cr_assert_eq(none->nsent, same->nsent, "policy %d gaps %d", pol, g);
            cr_assert_eq(none->ndropped, same->ndropped);
            for (int i = 0; i < none->nsent; i++) {
                const sent_t *x = &none->sent[i], *y = &same->sent[i];
                cr_assert(x->at_us == y->at_us && x->session == y->session &&
                              x->count == y->count &&
                              memcmp(x->ids, y->ids, sizeof(uint64_t) * (size_t)x->count) == 0,
                          "policy %d gaps %d: batch %d differs", pol, g, i);
            }
            for (int i = 0; i < none->ndropped; i++)
                cr_assert(none->dropped[i].id == same->dropped[i].id &&
                          none->dropped[i].at_us == same->dropped[i].at_us &&
                          none->dropped[i].reason == same->dropped[i].reason);
            pl_dispatch_free(none->d);
            free(none);
            pl_dispatch_free(same->d);
            free(same);
        }
    }
}

Test(dispatch, negative_priority_is_refused)
{
    pl_dispatch_opts_t o = {.policy = PL_POLICY_DEFERRED};
    pl_dispatch_t *d = pl_dispatch_new(&o);
    pl_profile_t p;
    pl_profile_init_linear(&p, 1000, 5000, 8);
    pl_session_cfg_t cfg = {.profile = &p, .slo_us = 30000, .priority = -1};
    cr_assert_eq(pl_dispatch_session_add(d, &cfg), SQ_INVAL);
    cfg.priority = 7;
    cr_assert_eq(pl_dispatch_session_add(d, &cfg), 0);
    pl_profile_dispose(&p);
    pl_dispatch_free(d);
}

/* A best-effort session (no SLO: deadlines 60 s out) of l(b) = b + 5 ms on
 * one worker. */
static int add_best_effort_session(rig_t *r)
{
    pl_profile_t p;
    pl_profile_init_linear(&p, 1000, 5000, 64);
    pl_session_cfg_t cfg = {.profile = &p, .best_effort = 1};
    int sid = pl_dispatch_session_add(r->d, &cfg);
    pl_profile_dispose(&p);
    cr_assert_geq(sid, 0);
    route_all(r, sid, 1, 0);
    return sid;
}

Test(dispatch, best_effort_goes_as_soon_as_the_worker_is_free_under_every_deferring_policy)
{
    /* Bursts of k with no SLO: nothing to fill by waiting, so no policy
     * defers them toward a deadline a minute out (issue 23: a request with
     * no SLO got one imposed). Each burst goes at once, its first request
     * alone and the rest as one batch after it at the latest. */
    pl_policy_t policies[] = {PL_POLICY_DEFERRED, PL_POLICY_ADAPTIVE};
    int ks[] = {1, 4, 16};
    for (int pi = 0; pi < 2; pi++)
        for (int ki = 0; ki < 3; ki++) {
            int k = ks[ki];
            rig_t *r = malloc(sizeof(*r));
            rig_init(r, policies[pi]);
            add_workers(r, 1);
            int sid = add_best_effort_session(r);
            enum { BURSTS = 6 };
            arrival_t arr[16 * BURSTS];
            for (int i = 0; i < k * BURSTS; i++) {
                int64_t at = 500000 * (i / k) + 300 * (i % k);
                arr[i] = (arrival_t){.at_us = at, .session = sid, .deadline_us = at + 60000000};
            }
            rig_run(r, arr, k * BURSTS, 1);
            cr_assert_eq(r->ndropped, 0);
            int64_t bound = 3 * (1000 * k + 5000) + 10000, worst = 0;
            for (int b = 0; b < r->nsent; b++)
                for (int j = 0; j < r->sent[b].count; j++) {
                    int64_t took = r->sent[b].finish_us - arr[r->sent[b].ids[j] - 1].at_us;
                    worst = took > worst ? took : worst;
                }
            cr_assert_leq(worst, bound, "%s, bursts of %d: %lld us, bound %lld",
                          pl_policy_name(policies[pi]), k, (long long)worst, (long long)bound);
            pl_dispatch_free(r->d);
            free(r);
        }
}

Test(dispatch, best_effort_yields_to_slo_traffic_and_is_never_dropped_below_its_bound)
{
    /* One worker: a session with an SLO of 30 ms (a request every 20 ms,
     * so its queue is often empty when the worker comes free), and a flood
     * of best-effort work (300 requests at once, then 50 every 100 ms) for
     * 2 s. SLO traffic keeps its deadlines: while it is active, a
     * best-effort batch is cut to what leaves its next request its SLO
     * (alike, a batch of 64, 69 ms, would make it miss). Best effort is
     * served in full, late but never dropped: its deadline is the server's
     * bound on a request's life, not an SLO. */
    pl_policy_t policies[] = {PL_POLICY_DEFERRED, PL_POLICY_ADAPTIVE};
    for (int pi = 0; pi < 2; pi++) {
        rig_t *r = malloc(sizeof(*r));
        rig_init(r, policies[pi]);
        add_workers(r, 1);
        int tight = add_prio_session(r, 30000, 0);
        int be = add_best_effort_session(r);
        enum { N = 2000 };
        arrival_t *arr = malloc(sizeof(*arr) * N);
        int n = 0, tight_n = 0, be_n = 0;
        int64_t t_tight = 0, t_be = 0;
        int be_left = 300;
        while (t_tight < 2000000 || t_be < 2000000) {
            cr_assert_lt(n, N);
            if (t_be < 2000000 && t_be <= t_tight) {
                arr[n++] =
                    (arrival_t){.at_us = t_be, .session = be, .deadline_us = t_be + 60000000};
                be_n++;
                if (--be_left == 0) {
                    t_be += 100000;
                    be_left = 50;
                }
            } else {
                arr[n++] =
                    (arrival_t){.at_us = t_tight, .session = tight, .deadline_us = t_tight + 30000};
                tight_n++;
                t_tight += 20000;
            }
        }
        rig_run(r, arr, n, 1);
        cr_assert_eq(r->overlap, 0);
        int tight_ok = 0, be_ok = 0;
        for (int b = 0; b < r->nsent; b++) {
            for (int j = 0; j < r->sent[b].count; j++) {
                const arrival_t *a = &arr[r->sent[b].ids[j] - 1];
                cr_assert_leq(r->sent[b].finish_us, a->deadline_us);
            }
            if (r->sent[b].session == tight)
                tight_ok += r->sent[b].count;
            else
                be_ok += r->sent[b].count;
        }
        cr_assert_eq(r->ndropped, 0, "%s: %d dropped", pl_policy_name(policies[pi]), r->ndropped);
        cr_assert_eq(tight_ok, tight_n);
        cr_assert_eq(be_ok, be_n);
        pl_dispatch_free(r->d);
        free(arr);
        free(r);
    }
}

Test(dispatch, a_caller_priority_at_the_best_effort_rank_is_refused)
{
    rig_t *r = malloc(sizeof(*r));
    rig_init(r, PL_POLICY_ADAPTIVE);
    pl_profile_t p;
    pl_profile_init_linear(&p, 1000, 5000, 64);
    pl_session_cfg_t cfg = {.profile = &p, .slo_us = 30000, .priority = PL_PRIORITY_BEST_EFFORT};
    cr_assert_eq(pl_dispatch_session_add(r->d, &cfg), SQ_INVAL);
    pl_profile_dispose(&p);
    pl_dispatch_free(r->d);
    free(r);
}

Test(dispatch, requests_refuses_an_empty_clump_and_an_unknown_session)
{
    int sid;
    rig_t *r = linear_rig(PL_POLICY_ADAPTIVE, 1, &sid);
    pl_request_t one = {.id = 1, .arrival_us = 0, .deadline_us = 12000};
    cr_assert_eq(pl_dispatch_requests(r->d, 0, sid, &one, 0), SQ_INVAL);
    cr_assert_eq(pl_dispatch_requests(r->d, 0, sid + 1, &one, 1), SQ_INVAL);
    cr_assert_eq(pl_dispatch_queued(r->d, sid), 0);
    pl_dispatch_free(r->d);
    free(r);
}

Test(dispatch, a_new_profile_recomputes_every_cost)
{
    /* l(b) = b + 5 ms, SLO 12 ms: batches up to 7. Twice as slow: l(1) = 12
     * ms, only batches of 1 fit, and a request must leave the moment it
     * arrives. */
    int sid;
    rig_t *r = linear_rig(PL_POLICY_DEFERRED, 1, &sid);
    cr_assert_eq(pl_dispatch_session_max_batch(r->d, sid), 7);
    cr_assert_eq(pl_dispatch_batch_cost_us(r->d, sid, 1), 6000);
    pl_profile_t p;
    pl_profile_init_linear(&p, 1000, 5000, 64);
    pl_profile_scale(&p, 2);
    cr_assert_eq(pl_dispatch_session_profile(r->d, 0, sid, &p), 0);
    absorb(r);
    cr_assert_eq(pl_dispatch_session_max_batch(r->d, sid), 1);
    cr_assert_eq(pl_dispatch_batch_cost_us(r->d, sid, 1), 12000);
    pl_profile_dispose(&p);
    cr_assert_eq(pl_dispatch_session_profile(r->d, 0, sid + 7, &p), SQ_INVAL);
    arrival_t arr[1] = {{.at_us = 1000, .session = sid, .deadline_us = 1000 + 12000}};
    rig_run(r, arr, 1, 1);
    cr_assert_eq(r->nsent, 1);
    cr_assert_eq(r->sent[0].at_us, 1000, "l(1) = 12 ms: it must leave at once");
    cr_assert_eq(r->sent[0].finish_us, 13000);
    pl_dispatch_free(r->d);
    free(r);
}

Test(dispatch, removal_reroute_and_late_arrivals)
{
    rig_t *r = malloc(sizeof(*r));
    rig_init(r, PL_POLICY_DEFERRED);
    add_workers(r, 2);
    int a = add_linear_session(r->d, 1000, 5000, 64, 30000);
    int b = add_linear_session(r->d, 1000, 5000, 64, 30000);
    route_all(r, a, 2, 0);
    pl_route_t only1 = {.worker = 1};
    cr_assert_eq(pl_dispatch_route_set(r->d, 0, b, &only1, 1), 0);
    absorb(r);
    /* A request with an earlier deadline that arrives later goes first. */
    cr_assert_eq(pl_dispatch_request(r->d, 0, 1, a, 0, 30000), 0);
    cr_assert_eq(pl_dispatch_request(r->d, 10, 2, a, 10, 20000), 0);
    absorb(r);
    cr_assert_eq(r->timer_us, 20000 - 8000, "frontrun of the earlier deadline: 20 - l(3)");
    r->timer_us = PL_NEVER;
    pl_dispatch_timer(r->d, 12000);
    absorb(r);
    cr_assert_eq(r->nsent, 1);
    cr_assert_eq(r->sent[0].ids[0], 2);
    cr_assert_eq(r->sent[0].ids[1], 1);
    cr_assert_eq(r->sent[0].worker, 0);
    cr_assert_eq(pl_dispatch_next_wake(r->d), PL_NEVER);
    /* Worker 0 leaves gracefully with its batch in flight: the batch still
     * completes, and no new batch goes there. */
    cr_assert_eq(pl_dispatch_worker_remove(r->d, 14000, 0), 0);
    absorb(r);
    cr_assert_eq(pl_dispatch_request(r->d, 15000, 3, a, 15000, 45000), 0);
    cr_assert_eq(pl_dispatch_request(r->d, 15000, 4, a, 15000, 45000), 0);
    absorb(r);
    r->timer_us = PL_NEVER;
    pl_dispatch_timer(r->d, 45000 - 8000);
    absorb(r);
    cr_assert_eq(r->nsent, 2);
    cr_assert_eq(r->sent[1].worker, 1);
    /* Added back while its batch still runs: nothing new goes to it until
     * the batch is done. */
    cr_assert_eq(pl_dispatch_worker_add(r->d, 19000, 0, 0), 0);
    absorb(r);
    cr_assert_eq(r->nsent, 2);
    cr_assert_eq(pl_dispatch_worker_remove(r->d, 19500, 0), 0, "and removed again");
    absorb(r);
    cr_assert_eq(pl_dispatch_batch_done(r->d, 20000, 0, r->batch[0]), 0, "draining batch done");
    cr_assert_eq(pl_dispatch_worker_remove(r->d, 20000, 0), SQ_INVAL, "gone");
    cr_assert_eq(pl_dispatch_worker_add(r->d, 20000, 0, 0), 0, "can come back");
    absorb(r);
    /* Session b loses its only worker to a new routing row; then the
     * session is removed: its queued requests are answered not_found. */
    cr_assert_eq(pl_dispatch_request(r->d, 21000, 5, b, 21000, 51000), 0);
    cr_assert_eq(pl_dispatch_request(r->d, 21000, 6, b, 21000, 51000), 0);
    absorb(r);
    pl_route_t only0 = {.worker = 0};
    cr_assert_eq(pl_dispatch_route_set(r->d, 21000, b, &only0, 1), 0);
    absorb(r);
    cr_assert_eq(pl_dispatch_queued(r->d, b), 2, "waiting for more until 51 - l(3)");
    cr_assert_eq(pl_dispatch_session_remove(r->d, 22000, b), 0);
    absorb(r);
    cr_assert_eq(r->ndropped, 2);
    cr_assert_eq(r->dropped[0].reason, SQ_NOT_FOUND);
    cr_assert_eq(r->dropped[1].reason, SQ_NOT_FOUND);
    cr_assert_eq(pl_dispatch_request(r->d, 22000, 7, b, 22000, 52000), SQ_INVAL);
    cr_assert_eq(pl_dispatch_queued(r->d, b), -1);
    cr_assert_eq(pl_dispatch_session_remove(r->d, 22000, b), SQ_INVAL);
    pl_dispatch_free(r->d);
    free(r);
}

Test(dispatch, cancel_takes_a_request_out_of_its_queue)
{
    rig_t *r = malloc(sizeof(*r));
    rig_init(r, PL_POLICY_DEFERRED);
    add_workers(r, 1);
    int sid = add_linear_session(r->d, 1000, 5000, 64, 30000);
    route_all(r, sid, 1, 0);
    for (uint64_t i = 1; i <= 3; i++)
        cr_assert_eq(pl_dispatch_request(r->d, 0, i, sid, 0, 30000 + (int64_t)i), 0);
    absorb(r);
    cr_assert_eq(r->timer_us, 30001 - 9000, "three wait for 30.001 - l(4)");
    cr_assert_eq(pl_dispatch_cancel(r->d, 100, sid, 2), 0);
    absorb(r);
    cr_assert_eq(r->timer_us, 30001 - 8000, "two left: 30.001 - l(3)");
    cr_assert_eq(pl_dispatch_cancel(r->d, 100, sid, 2), SQ_NOT_FOUND);
    cr_assert_eq(pl_dispatch_cancel(r->d, 100, 9, 1), SQ_NOT_FOUND);
    cr_assert_eq(pl_dispatch_cancel(r->d, 100, sid, 1), 0, "the head");
    absorb(r);
    cr_assert_eq(r->timer_us, 30003 - 7000);
    r->timer_us = PL_NEVER;
    pl_dispatch_timer(r->d, 30003 - 7000);
    absorb(r);
    cr_assert_eq(r->nsent, 1);
    cr_assert_eq(r->sent[0].count, 1);
    cr_assert_eq(r->sent[0].ids[0], 3);
    cr_assert_eq(r->ndropped, 0);
    cr_assert_eq(pl_dispatch_cancel(r->d, 23100, sid, 3), SQ_NOT_FOUND, "already sent");
    pl_dispatch_stats_t st;
    pl_dispatch_stats(r->d, &st);
    cr_assert_eq(st.queued, 0);
    pl_dispatch_free(r->d);
    free(r);
}

Test(dispatch, lost_worker_retries_batch_elsewhere_or_drops)
{
    rig_t *r = malloc(sizeof(*r));
    rig_init(r, PL_POLICY_DEFERRED);
    add_workers(r, 2);
    int sid = add_linear_session(r->d, 1000, 5000, 64, 30000);
    route_all(r, sid, 2, 0);
    for (uint64_t i = 1; i <= 4; i++)
        cr_assert_eq(pl_dispatch_request(r->d, 0, i, sid, 0, 30000), 0);
    absorb(r);
    cr_assert_eq(r->nsent, 0, "waits for its frontrun moment 30 - l(5) = 20");
    cr_assert_eq(r->timer_us, 20000);
    r->timer_us = PL_NEVER;
    pl_dispatch_timer(r->d, 20000);
    absorb(r);
    cr_assert_eq(r->nsent, 1);
    cr_assert_eq(r->sent[0].worker, 0);
    cr_assert_eq(r->sent[0].count, 4);
    uint64_t lost_batch = r->batch[0];
    /* Worker 0 dies at 22: 8 ms left, a batch of 3 (l = 8) still fits on
     * worker 1, the fourth request cannot make it any more. */
    r->busy[0] = 0;
    cr_assert_eq(pl_dispatch_worker_lost(r->d, 22000, 0), 0);
    absorb(r);
    cr_assert_eq(r->nsent, 2);
    cr_assert_eq(r->sent[1].worker, 1);
    cr_assert_eq(r->sent[1].count, 3);
    cr_assert_eq(r->sent[1].finish_us, 30000);
    cr_assert_eq(r->ndropped, 1);
    cr_assert_eq(r->dropped[0].id, 4);
    cr_assert_eq(r->dropped[0].reason, SQ_WORKER_LOST);
    cr_assert_eq(pl_dispatch_batch_done(r->d, 23000, 0, lost_batch), SQ_INVAL,
                 "a late answer from the lost worker is refused");
    pl_dispatch_stats_t st;
    pl_dispatch_stats(r->d, &st);
    cr_assert_eq(st.retried, 4);
    pl_dispatch_free(r->d);
    free(r);
}

/* A batch in flight when its session is removed (the model deleted), then
 * its worker lost: the requests come back as drops, not lost. */
Test(dispatch, lost_worker_of_a_removed_sessions_batch_drops_it)
{
    rig_t *r = malloc(sizeof(*r));
    rig_init(r, PL_POLICY_DEFERRED);
    add_workers(r, 1);
    int sid = add_linear_session(r->d, 1000, 5000, 64, 30000);
    route_all(r, sid, 1, 0);
    for (uint64_t i = 1; i <= 3; i++)
        cr_assert_eq(pl_dispatch_request(r->d, 0, i, sid, 0, 30000), 0);
    absorb(r);
    cr_assert_eq(r->timer_us, 21000, "the frontrun moment 30 - l(4)");
    r->timer_us = PL_NEVER;
    pl_dispatch_timer(r->d, 21000);
    absorb(r);
    cr_assert_eq(r->nsent, 1);
    cr_assert_eq(r->sent[0].count, 3);
    cr_assert_eq(pl_dispatch_session_remove(r->d, 22000, sid), 0);
    absorb(r);
    cr_assert_eq(r->ndropped, 0, "nothing queued: the three are on the worker");
    r->busy[0] = 0;
    cr_assert_eq(pl_dispatch_worker_lost(r->d, 23000, 0), 0);
    absorb(r);
    cr_assert_eq(r->ndropped, 3);
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(r->dropped[i].id, (uint64_t)i + 1);
        cr_assert_eq(r->dropped[i].reason, SQ_NOT_FOUND);
    }
    pl_dispatch_stats_t st;
    pl_dispatch_stats(r->d, &st);
    cr_assert_eq(st.queued, 0);
    pl_dispatch_free(r->d);
    free(r);
}

Test(dispatch, lost_worker_early_drop_retries_whole_batch)
{
    rig_t *r = malloc(sizeof(*r));
    rig_init(r, PL_POLICY_EARLY_DROP);
    add_workers(r, 2);
    int sid = add_linear_session(r->d, 1000, 5000, 64, 30000);
    route_all(r, sid, 2, 0);
    /* Worker 1 busy with request 1; requests 2, 3 go to worker 0. */
    cr_assert_eq(pl_dispatch_request(r->d, 0, 1, sid, 0, 30000), 0);
    absorb(r);
    cr_assert_eq(r->sent[0].worker, 0);
    cr_assert_eq(pl_dispatch_request(r->d, 10, 2, sid, 10, 30000), 0);
    absorb(r);
    cr_assert_eq(r->sent[1].worker, 1);
    r->busy[1] = 0;
    cr_assert_eq(pl_dispatch_worker_lost(r->d, 1000, 1), 0);
    absorb(r);
    /* Worker 0 is busy until 6: request 2 waits for it, not dropped. */
    cr_assert_eq(r->ndropped, 0);
    cr_assert_eq(pl_dispatch_queued(r->d, sid), 1);
    r->busy[0] = 0;
    cr_assert_eq(pl_dispatch_batch_done(r->d, 6000, 0, r->batch[0]), 0);
    absorb(r);
    cr_assert_eq(r->nsent, 3);
    cr_assert_eq(r->sent[2].worker, 0);
    cr_assert_eq(r->sent[2].ids[0], 2);
    pl_dispatch_free(r->d);
    free(r);
}

Test(dispatch, no_worker_and_bad_input)
{
    pl_dispatch_opts_t o = {.policy = PL_POLICY_DEFERRED};
    pl_dispatch_t *d = pl_dispatch_new(&o);
    cr_assert_eq(pl_dispatch_session_add(d, NULL), SQ_INVAL);
    pl_profile_t p;
    pl_profile_init_linear(&p, 1000, 5000, 8);
    pl_session_cfg_t cfg = {.profile = &p, .slo_us = 10000};
    int sid = pl_dispatch_session_add(d, &cfg);
    cr_assert_eq(sid, 0);
    cr_assert_eq(pl_dispatch_session_max_batch(d, sid), 5);
    cr_assert_eq(pl_dispatch_batch_cost_us(d, sid, 5), 10000);
    cr_assert_eq(pl_dispatch_request(d, 0, 1, 7, 0, 1000), SQ_INVAL);
    pl_route_t bad = {.worker = 3};
    cr_assert_eq(pl_dispatch_route_set(d, 0, sid, &bad, 1), SQ_INVAL, "worker 3 not added");
    cr_assert_eq(pl_dispatch_worker_add(d, 0, -1, 0), SQ_INVAL);
    /* No worker holds the model: the request waits while one could still
     * appear in time, then is answered no_worker. */
    cr_assert_eq(pl_dispatch_request(d, 0, 1, sid, 0, 10000), 0);
    const pl_action_t *a;
    size_t n = pl_dispatch_take(d, &a);
    cr_assert_eq(n, 1);
    cr_assert_eq(a[0].kind, PL_ACT_TIMER);
    cr_assert_eq(a[0].at_us, 4001);
    pl_dispatch_timer(d, 4001);
    n = pl_dispatch_take(d, &a);
    cr_assert_eq(n, 2);
    cr_assert_eq(a[0].kind, PL_ACT_DROP);
    cr_assert_eq(a[0].reason, SQ_NO_WORKER);
    cr_assert_eq(a[1].kind, PL_ACT_TIMER);
    cr_assert_eq(a[1].at_us, PL_NEVER);
    /* A second take with no call in between has nothing new: acting on
     * the same drop twice would answer a request twice. */
    cr_assert_eq(pl_dispatch_take(d, &a), 0);
    pl_profile_dispose(&p);
    pl_policy_t pol;
    cr_assert_eq(pl_policy_parse("early-drop", &pol), 0);
    cr_assert_eq(pol, PL_POLICY_EARLY_DROP);
    cr_assert_eq(pl_policy_parse("lazy", &pol), SQ_INVAL);
    cr_assert_str_eq(pl_policy_name(PL_POLICY_DEFERRED), "deferred");
    cr_assert_eq(pl_policy_parse("adaptive", &pol), 0);
    cr_assert_eq(pol, PL_POLICY_ADAPTIVE);
    cr_assert_str_eq(pl_policy_name(PL_POLICY_ADAPTIVE), "adaptive");
    pl_dispatch_free(d);
    pl_dispatch_free(NULL);
}

/* Foreign work (a measurement in a worker's idle gaps): how long a worker
 * may be taken follows its sessions' slack; taken, it gets no batch until
 * the work is done; taken after a batch, it stays busy from that batch's
 * end to the work's. */
Test(dispatch, foreign_work_takes_only_the_gap_and_holds_the_worker)
{
    rig_t *r = malloc(sizeof(*r));
    rig_init(r, PL_POLICY_DEFERRED);
    add_workers(r, 1);
    cr_assert_eq(pl_dispatch_worker_gap_us(r->d, 0, 0), PL_NEVER, "no session: any length");
    int sid = add_linear_session(r->d, 1000, 5000, 64, 30000);
    route_all(r, sid, 1, 0);
    /* Idle (no request yet): its SLO bounds nothing (issue 23: an idle
     * model slowed a measurement 4x). */
    cr_assert_eq(pl_dispatch_worker_gap_us(r->d, 0, 0), PL_NEVER);
    /* Two queued (deadline 30, l(2) = 7): 23 ms of slack, but half of what
     * a request arriving now could wait, (30 - 6) / 2, is less. At 15 they
     * have 8 left. */
    cr_assert_eq(pl_dispatch_request(r->d, 0, 1, sid, 0, 30000), 0);
    cr_assert_eq(pl_dispatch_request(r->d, 0, 2, sid, 0, 30000), 0);
    absorb(r);
    cr_assert_eq(pl_dispatch_worker_gap_us(r->d, 0, 0), 12000);
    cr_assert_eq(pl_dispatch_worker_gap_us(r->d, 15000, 0), 8000);
    /* Taken at 15 for 6 ms: the batch (due at 30 - l(3) = 22) waits for
     * the work's end, 21, and leaves when the core is told. */
    uint64_t f = pl_dispatch_worker_foreign(r->d, 15000, 0, 6000, 0);
    cr_assert_neq(f, 0);
    absorb(r);
    cr_assert_eq(pl_dispatch_worker_gap_us(r->d, 15000, 0), 0, "busy");
    cr_assert_eq(pl_dispatch_worker_foreign(r->d, 15000, 0, 1000, 1), 0, "one at a time");
    pl_dispatch_timer(r->d, 22000);
    absorb(r);
    cr_assert_eq(r->nsent, 0, "no batch while the foreign work runs");
    cr_assert_eq(pl_dispatch_batch_done(r->d, 22000, 0, f), 0);
    absorb(r);
    cr_assert_eq(r->nsent, 1);
    cr_assert_eq(r->sent[0].count, 2);
    cr_assert_eq(r->sent[0].at_us, 22000);
    cr_assert_eq(r->ndropped, 0);
    /* After a batch: refused without after_batch; with it, the worker
     * stays busy when the batch ends, until the work is done. */
    cr_assert_eq(pl_dispatch_worker_foreign(r->d, 23000, 0, 2000, 0), 0);
    uint64_t g = pl_dispatch_worker_foreign(r->d, 23000, 0, 2000, 1);
    cr_assert_neq(g, 0);
    cr_assert_eq(pl_dispatch_request(r->d, 23000, 3, sid, 23000, 40000), 0);
    absorb(r);
    r->timer_us = PL_NEVER;
    cr_assert_eq(pl_dispatch_batch_done(r->d, 29000, 0, r->batch[0]), 0);
    absorb(r);
    cr_assert_eq(r->nsent, 1, "the worker runs the foreign work next");
    cr_assert_eq(pl_dispatch_batch_done(r->d, 31000, 0, g), 0);
    pl_dispatch_timer(r->d, 34000); /* 40 - l(2) */
    absorb(r);
    cr_assert_eq(r->nsent, 2);
    cr_assert_eq(r->sent[1].ids[0], 3);
    cr_assert_eq(pl_dispatch_batch_done(r->d, 35000, 0, g), SQ_INVAL, "answered once");
    /* The batch answered, nothing queued: while a request came within
     * PL_GAP_IDLE_US, a request arriving now keeps its half; after, none. */
    cr_assert_eq(pl_dispatch_batch_done(r->d, 35000, 0, r->batch[0]), 0);
    absorb(r);
    cr_assert_eq(pl_dispatch_worker_gap_us(r->d, 35000, 0), 12000);
    cr_assert_eq(pl_dispatch_worker_gap_us(r->d, 23000 + PL_GAP_IDLE_US + 1, 0), PL_NEVER);
    /* A lost worker ends its foreign work. */
    uint64_t h = pl_dispatch_worker_foreign(r->d, 35000, 0, 1000, 1);
    cr_assert_neq(h, 0);
    cr_assert_eq(pl_dispatch_worker_lost(r->d, 35500, 0), 0);
    cr_assert_eq(pl_dispatch_batch_done(r->d, 36000, 0, h), SQ_INVAL);
    cr_assert_eq(pl_dispatch_worker_foreign(r->d, 36000, 0, 1000, 0), 0, "absent");
    pl_dispatch_free(r->d);
    free(r);
}
