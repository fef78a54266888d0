/* Workers behind links (pl_dispatch_worker_net) on the rig of
 * dispatch_test.h: transfers, local and remote workers. */
#include "dispatch_test.h"

/* ---- links (pl_dispatch_worker_net): Symphony's d_data ---- */

static int add_session_bytes(pl_dispatch_t *d, double alpha_us, double beta_us, int64_t slo_us,
                             int64_t item_bytes)
{
    pl_profile_t p;
    pl_profile_init_linear(&p, alpha_us, beta_us, 32);
    pl_session_cfg_t cfg = {.profile = &p, .slo_us = slo_us, .item_bytes = item_bytes};
    int sid = pl_dispatch_session_add(d, &cfg);
    pl_profile_dispose(&p);
    return sid;
}

/* l(b) = 1000 b + 5000 µs, SLO 20 ms; the only worker is behind a 2 ms
 * round trip at 100 bytes/µs with 10 kB per item: 100 µs per item. Twenty
 * requests due at 20 ms: locally 15 would fit (l(15) = 20 ms), over the link
 * 1100 b + 7000 <= 20000 gives 11, and the SEND's finish counts the
 * transfer. A lone request is sent when waiting for a second one would make
 * even that pair miss over the link: 20000 - (l(2) + 2000 + 200), not at the
 * local moment 20000 - l(2). */
Test(dispatch, remote_worker_runs_smaller_batches_sent_earlier)
{
    for (int pol = 0; pol < 2; pol++) {
        rig_t *r = calloc(1, sizeof(*r));
        rig_init(r, pol ? PL_POLICY_EARLY_DROP : PL_POLICY_DEFERRED);
        add_workers(r, 1);
        int s = add_session_bytes(r->d, 1000, 5000, 20000, 10000);
        rig_link(r, 0, 0, 2000, 100);
        r->item_bytes[s] = 10000;
        route_all(r, s, 1, 0);
        cr_assert_eq(pl_dispatch_worker_batch_cost_us(r->d, s, 0, 11), 16000 + 2000 + 1100);
        cr_assert_eq(pl_dispatch_batch_cost_us(r->d, s, 11), 16000);
        arrival_t arr[20];
        for (int i = 0; i < 20; i++)
            arr[i] = (arrival_t){.at_us = 0, .session = s, .deadline_us = 20000};
        rig_run(r, arr, 20, 1);
        cr_assert_geq(r->nsent, 1);
        if (pol == 0) {
            /* Deferred: the fullest batch the link allows, at once. Early
             * drop runs its target window: 2 l(b) + net(b) <= SLO gives 3
             * (5 without the link). */
            cr_assert_eq(r->sent[0].count, 11);
            cr_assert_eq(r->sent[0].at_us, 0);
        } else {
            /* The first request alone at once (early drop sends what is
             * there), then the window. */
            int maxc = 0;
            for (int k = 0; k < r->nsent; k++)
                maxc = r->sent[k].count > maxc ? r->sent[k].count : maxc;
            cr_assert_eq(maxc, 3);
        }
        for (int k = 0; k < r->nsent; k++) {
            sent_t *b = &r->sent[k];
            int64_t want = b->at_us + 1000 * b->count + 5000 + 2000 + 100 * b->count;
            cr_assert_eq(b->finish_us, want, "finish_us counts the transfer");
            cr_assert_leq(b->finish_us, 20000);
        }
        pl_dispatch_free(r->d);
        free(r);
    }
    /* The lone request. */
    rig_t *r = calloc(1, sizeof(*r));
    rig_init(r, PL_POLICY_DEFERRED);
    add_workers(r, 1);
    int s = add_session_bytes(r->d, 1000, 5000, 20000, 10000);
    rig_link(r, 0, 0, 2000, 100);
    r->item_bytes[s] = 10000;
    route_all(r, s, 1, 0);
    arrival_t one = {.at_us = 0, .session = s, .deadline_us = 20000};
    rig_run(r, &one, 1, 1);
    cr_assert_eq(r->nsent, 1);
    cr_assert_eq(r->sent[0].at_us, 20000 - (7000 + 2000 + 200));
    cr_assert_eq(r->sent[0].finish_us, 20000 - (7000 + 2000 + 200) + 6000 + 2100);
    pl_dispatch_free(r->d);
    free(r);
}

/* Worker 0 sits behind an 8 ms round trip, worker 1 is local; l(b) = 1000 b
 * + 5000, SLO 10 ms. A request due in 10 ms can only make it locally
 * (6 ms there, 15 ms over the link): it goes to worker 1 although worker 0
 * has the lower id, under both policies. With an SLO of 20 ms both could
 * run it; the idle local device still gets it. And when the local device is
 * busy long enough that only the link can make a request, the link takes it. */
Test(dispatch, request_only_a_local_worker_can_meet_goes_local)
{
    for (int pol = 0; pol < 2; pol++) {
        for (int slo = 10000; slo <= 20000; slo += 10000) {
            rig_t *r = calloc(1, sizeof(*r));
            rig_init(r, pol ? PL_POLICY_EARLY_DROP : PL_POLICY_DEFERRED);
            add_workers(r, 2);
            int s = add_session_bytes(r->d, 1000, 5000, slo, 1000);
            rig_link(r, 0, 0, 8000, 1000);
            route_all(r, s, 2, 0);
            arrival_t a[3] = {{.at_us = 0, .session = s, .deadline_us = slo},
                              {.at_us = 100, .session = s, .deadline_us = 100 + slo},
                              {.at_us = 200, .session = s, .deadline_us = 200 + slo}};
            /* At 10 ms the local device can run one at a time only. */
            rig_run(r, a, slo == 10000 ? 1 : 3, 2);
            cr_assert_eq(r->ndropped, 0, "policy %d slo %d", pol, slo);
            cr_assert_geq(r->nsent, 1);
            cr_assert_eq(r->sent[0].worker, 1, "policy %d slo %d: the local worker", pol, slo);
            for (int k = 0; k < r->nsent; k++) {
                cr_assert_leq(r->true_finish[k], r->sent[k].finish_us);
                if (slo == 10000)
                    cr_assert_eq(r->sent[k].worker, 1);
            }
            pl_dispatch_free(r->d);
            free(r);
        }
    }
    /* Local worker 1 busy with a long batch of another session until 30 ms;
     * a request due at 20 ms only the link (1 ms) can make. */
    for (int pol = 0; pol < 2; pol++) {
        rig_t *r = calloc(1, sizeof(*r));
        rig_init(r, pol ? PL_POLICY_EARLY_DROP : PL_POLICY_DEFERRED);
        add_workers(r, 2);
        int slow = add_session_bytes(r->d, 1000, 29000, 40000, 0);
        int s = add_session_bytes(r->d, 1000, 5000, 20000, 1000);
        rig_link(r, 0, 0, 1000, 1000);
        pl_route_t only1 = {.worker = 1};
        cr_assert_eq(pl_dispatch_route_set(r->d, 0, slow, &only1, 1), 0);
        absorb(r);
        route_all(r, s, 2, 0);
        arrival_t a[2] = {{.at_us = 0, .session = slow, .deadline_us = 30000},
                          {.at_us = 10, .session = s, .deadline_us = 20010}};
        rig_run(r, a, 2, 2);
        cr_assert_eq(r->ndropped, 0);
        cr_assert_eq(r->nsent, 2);
        cr_assert_eq(r->sent[0].worker, 1);
        cr_assert_eq(r->sent[1].worker, 0, "policy %d: only the link could make it", pol);
        cr_assert_leq(r->true_finish[1], 20010);
        pl_dispatch_free(r->d);
        free(r);
    }
}

/* A link whose round trip alone exceeds the SLO gets no batch: every
 * request is dropped with SQ_DEADLINE when it arrives, never sent to be late.
 * The same with a link too slow for one item (100 MB at 1 kB/µs: 100 ms). */
Test(dispatch, link_too_slow_for_anything_gets_no_batches)
{
    for (int pol = 0; pol < 2; pol++) {
        for (int kind = 0; kind < 2; kind++) {
            rig_t *r = calloc(1, sizeof(*r));
            rig_init(r, pol ? PL_POLICY_EARLY_DROP : PL_POLICY_DEFERRED);
            add_workers(r, 2);
            int s = add_session_bytes(r->d, 1000, 5000, 20000, kind ? 100000000 : 1000);
            r->item_bytes[s] = kind ? 100000000 : 1000;
            rig_link(r, 0, 0, kind ? 100 : 30000, 1000);
            rig_link(r, 0, 1, kind ? 100 : 30000, 1000);
            route_all(r, s, 2, 0);
            arrival_t a[50];
            for (int i = 0; i < 50; i++)
                a[i] =
                    (arrival_t){.at_us = 1000 * i, .session = s, .deadline_us = 1000 * i + 20000};
            rig_run(r, a, 50, 2);
            cr_assert_eq(r->nsent, 0, "policy %d kind %d", pol, kind);
            cr_assert_eq(r->ndropped, 50);
            for (int k = 0; k < r->ndropped; k++) {
                cr_assert_eq(r->dropped[k].reason, SQ_DEADLINE);
                cr_assert_eq(r->dropped[k].at_us, a[r->dropped[k].id - 1].at_us,
                             "dropped when it arrived");
            }
            pl_dispatch_free(r->d);
            free(r);
        }
    }
}

Test(dispatch, worker_net_bad_input)
{
    pl_dispatch_opts_t o = {.policy = PL_POLICY_DEFERRED};
    pl_dispatch_t *d = pl_dispatch_new(&o);
    cr_assert_eq(pl_dispatch_worker_net(d, 0, 0, 100, 10), SQ_INVAL); /* never added */
    cr_assert_eq(pl_dispatch_worker_add(d, 0, 0, 0), 0);
    cr_assert_eq(pl_dispatch_worker_net(d, 0, 0, -1, 10), SQ_INVAL);
    cr_assert_eq(pl_dispatch_worker_net(d, 0, -1, 0, 0), SQ_INVAL);
    cr_assert_eq(pl_dispatch_worker_net(d, 0, 0, 0, 0), 0); /* local */
    int s = add_session_bytes(d, 1000, 5000, 20000, 4096);
    cr_assert_eq(pl_dispatch_worker_batch_cost_us(d, s, 0, 2), 7000);
    cr_assert_eq(pl_dispatch_worker_net(d, 0, 0, 250, 1024), 0);
    cr_assert_eq(pl_dispatch_worker_batch_cost_us(d, s, 0, 2), 7000 + 250 + 8);
    cr_assert_eq(pl_dispatch_worker_batch_cost_us(d, s, 5, 2), -1);
    pl_dispatch_free(d);
}
