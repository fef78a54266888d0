/* The early-drop policy (planner/dispatch_early_drop.c) on the rig of
 * dispatch_test.h. */
#include "dispatch_test.h"

Test(dispatch, early_drop_slides_window_past_heads_that_would_miss)
{
    rig_t *r = malloc(sizeof(*r));
    rig_init(r, PL_POLICY_EARLY_DROP);
    add_workers(r, 1);
    int sid = add_linear_session(r->d, 1000, 5000, 64, 40000);
    route_all(r, sid, 1, 4);
    const pl_action_t *a;
    /* Request 1 finds the worker free and runs alone until 6.0 ms. */
    cr_assert_eq(pl_dispatch_request(r->d, 0, 1, sid, 0, 30000), 0);
    absorb(r);
    cr_assert_eq(r->nsent, 1);
    cr_assert_eq(r->sent[0].count, 1);
    /* Deadline 11 ms: even alone at 6.0 it ends at 12: dropped at once. */
    cr_assert_eq(pl_dispatch_request(r->d, 100, 2, sid, 100, 11000), 0);
    absorb(r);
    cr_assert_eq(r->ndropped, 1);
    cr_assert_eq(r->dropped[0].id, 2);
    cr_assert_eq(r->dropped[0].reason, SQ_DEADLINE);
    cr_assert_eq(r->dropped[0].at_us, 100);
    /* 3 and 4 could run alone at 6.0 (l(1) = 6 -> 12 <= 12, 14) but not in
     * a window of 4 (l(4) = 9 -> 15). 5..9 have room. */
    int64_t deadlines[] = {12000, 14000, 20000, 20000, 21000, 22000, 23000};
    for (int i = 0; i < 7; i++)
        cr_assert_eq(
            pl_dispatch_request(r->d, 200 + i, (uint64_t)(3 + i), sid, 200 + i, deadlines[i]), 0);
    absorb(r);
    cr_assert_eq(r->nsent, 1, "worker busy, nothing else sent");
    cr_assert_eq(r->ndropped, 1);
    r->busy[0] = 0;
    cr_assert_eq(pl_dispatch_batch_done(r->d, 6000, 0, r->batch[0]), 0);
    absorb(r);
    cr_assert_eq(r->ndropped, 3);
    cr_assert_eq(r->dropped[1].id, 3);
    cr_assert_eq(r->dropped[1].reason, SQ_OVERLOAD);
    cr_assert_eq(r->dropped[2].id, 4);
    cr_assert_eq(r->dropped[2].reason, SQ_OVERLOAD);
    cr_assert_eq(r->nsent, 2);
    cr_assert_eq(r->sent[1].count, 4, "the window stays full");
    for (int j = 0; j < 4; j++)
        cr_assert_eq(r->sent[1].ids[j], (uint64_t)(5 + j));
    cr_assert_eq(r->sent[1].finish_us, 15000);
    cr_assert_eq(pl_dispatch_queued(r->d, sid), 1, "request 9 waits for the next round");
    /* Late batch_done for a batch the worker is not running. */
    cr_assert_eq(pl_dispatch_batch_done(r->d, 7000, 0, r->batch[0] + 7), SQ_INVAL);
    (void)a;
    pl_dispatch_free(r->d);
    free(r);
}

Test(dispatch, early_drop_paces_rounds_by_duty_cycle)
{
    rig_t *r = malloc(sizeof(*r));
    rig_init(r, PL_POLICY_EARLY_DROP);
    cr_assert_eq(pl_dispatch_worker_add(r->d, 0, 0, 20000), 0);
    absorb(r);
    int sid = add_linear_session(r->d, 1000, 5000, 64, 100000);
    route_all(r, sid, 1, 8);
    /* One request every ms: the worker starts a round at 0, 20, 40 ms even
     * though it is free from 6 ms on. */
    arrival_t arr[30];
    for (int i = 0; i < 30; i++)
        arr[i] = (arrival_t){.at_us = 1000 * i, .session = sid, .deadline_us = 1000 * i + 100000};
    rig_run(r, arr, 30, 1);
    cr_assert_eq(r->ndropped, 0);
    cr_assert_geq(r->nsent, 3);
    cr_assert_eq(r->sent[0].at_us, 0);
    cr_assert_eq(r->sent[0].count, 1);
    cr_assert_eq(r->sent[1].at_us, 20000);
    cr_assert_eq(r->sent[1].count, 8, "20 waiting, window of 8");
    cr_assert_eq(r->sent[2].at_us, 40000);
    pl_dispatch_free(r->d);
    free(r);
}
