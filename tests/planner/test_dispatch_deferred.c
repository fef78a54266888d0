/* The deferred policy (planner/dispatch_deferred.c) on the rig of
 * dispatch_test.h: backed up, and sessions sharing a worker. */
#include "dispatch_test.h"

Test(dispatch, deferred_backed_up_takes_fullest_window_and_keeps_the_heads)
{
    rig_t *r = malloc(sizeof(*r));
    rig_init(r, PL_POLICY_DEFERRED);
    add_workers(r, 2);
    int sid = add_linear_session(r->d, 1000, 5000, 64, 25000);
    cr_assert_eq(pl_dispatch_session_max_batch(r->d, sid), 20);
    route_all(r, sid, 2, 0);
    uint64_t id = 1;
    /* Both workers busy: 20 (the cap) leave at once on worker 0 until 25,
     * 20 more on worker 1 until 26 (with 1 ms to spare, so that no batch of
     * 19 is ready before the 20th arrives). */
    for (int i = 0; i < 20; i++)
        cr_assert_eq(pl_dispatch_request(r->d, 0, id++, sid, 0, 26000), 0);
    absorb(r);
    for (int i = 0; i < 20; i++)
        cr_assert_eq(pl_dispatch_request(r->d, 1000, id++, sid, 1000, 27000), 0);
    absorb(r);
    cr_assert_eq(r->nsent, 2);
    cr_assert_eq(r->sent[1].worker, 1);
    cr_assert_eq(r->sent[0].count, 20);
    cr_assert_eq(r->sent[1].count, 20);
    cr_assert_eq(r->sent[1].finish_us, 26000);
    /* Three stale heads (41-43, deadline 33) and 16 fresh (44-59, 41). */
    for (int i = 0; i < 3; i++)
        cr_assert_eq(pl_dispatch_request(r->d, 2000, id++, sid, 2000, 33000), 0);
    for (int i = 0; i < 16; i++)
        cr_assert_eq(pl_dispatch_request(r->d, 16000, id++, sid, 16000, 41000), 0);
    absorb(r);
    cr_assert_eq(r->ndropped, 0, "worker 1 frees at 26, in time for the heads");
    /* At 25 the heads fit a batch of 3 at most, the fresh ones 11: worker 0
     * takes the 11 fresh ones (finishing exactly at 41). */
    r->busy[0] = 0;
    cr_assert_eq(pl_dispatch_batch_done(r->d, 25000, 0, r->batch[0]), 0);
    absorb(r);
    cr_assert_eq(r->nsent, 3);
    cr_assert_eq(r->sent[2].worker, 0);
    cr_assert_eq(r->sent[2].count, 11);
    for (int j = 0; j < 11; j++)
        cr_assert_eq(r->sent[2].ids[j], (uint64_t)(44 + j));
    cr_assert_eq(r->sent[2].finish_us, 41000);
    cr_assert_eq(r->ndropped, 0, "the heads passed over stay queued");
    /* At 26 worker 1 serves two of them (l(2) = 7 -> 33); the third cannot
     * make it on any worker any more and is answered at once. */
    r->busy[1] = 0;
    cr_assert_eq(pl_dispatch_batch_done(r->d, 26000, 1, r->batch[1]), 0);
    absorb(r);
    cr_assert_eq(r->nsent, 4);
    cr_assert_eq(r->sent[3].worker, 1);
    cr_assert_eq(r->sent[3].count, 2);
    cr_assert_eq(r->sent[3].ids[0], 41);
    cr_assert_eq(r->sent[3].ids[1], 42);
    cr_assert_eq(r->ndropped, 1);
    cr_assert_eq(r->dropped[0].id, 43);
    cr_assert_eq(r->dropped[0].reason, SQ_DEADLINE);
    cr_assert_eq(r->dropped[0].at_us, 26000);
    cr_assert_eq(pl_dispatch_queued(r->d, sid), 5);
    pl_dispatch_free(r->d);
    free(r);
}

Test(dispatch, deferred_sessions_sharing_a_worker_do_not_collide)
{
    /* One worker, two models, l(b) = b + 5. A's request (SLO 100) and B's
     * (SLO 20, arriving at 80) share the deadline 100: deferring each to
     * its own last moment (100 - l(2) = 93) would run one and lose the
     * other. The chain A then B must start by 100 - l(1) - l(1) = 88. */
    rig_t *r = malloc(sizeof(*r));
    rig_init(r, PL_POLICY_DEFERRED);
    add_workers(r, 1);
    int a = add_linear_session(r->d, 1000, 5000, 64, 100000);
    int b = add_linear_session(r->d, 1000, 5000, 64, 20000);
    route_all(r, a, 1, 0);
    route_all(r, b, 1, 0);
    arrival_t arr[] = {{.at_us = 0, .session = a, .deadline_us = 100000},
                       {.at_us = 80000, .session = b, .deadline_us = 100000}};
    rig_run(r, arr, 2, 1);
    cr_assert_eq(r->ndropped, 0);
    cr_assert_eq(r->nsent, 2);
    cr_assert_eq(r->sent[0].at_us, 88000);
    cr_assert_eq(r->sent[1].at_us, 94000);
    cr_assert_eq(r->sent[1].finish_us, 100000);
    pl_dispatch_free(r->d);
    free(r);
}
