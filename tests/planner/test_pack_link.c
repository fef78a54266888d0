/* Packing with links (planner/pack.c): far devices and the duty cycle a
 * link shortens. */
#include "pack_test.h"

/* ---- devices behind a link (pl_options_t.links) ---- */

/* Two sessions of l(b) = 1 ms b + 5 ms with 150 kB per item: "tight" (SLO
 * 20 ms, 50 req/s) and "loose" (SLO 400 ms, 500 req/s), too big to share a
 * device. Device 0 is behind an 8 ms round trip at 1250 bytes/µs (10
 * Gbit/s), device 1 is local. The tight one cannot pay a cycle, 6 ms and
 * 8.1 ms of transfer within 20 ms: it goes to device 1 although 0 is the
 * lower id; the loose one goes behind the link, its allocation showing the
 * transfer, the device its link, and the SLO and cycle hold with it. */
static void link_sessions(pl_profile_t *p, pl_session_t s[2])
{
    pl_profile_init_linear(p, 1 * MS, 5 * MS, 64);
    s[0] = (pl_session_t){.id = 1,
                          .model = 0,
                          .name = "loose",
                          .profile = p,
                          .slo_us = 400 * MS,
                          .rate_rps = 500,
                          .item_bytes = 150528};
    s[1] = (pl_session_t){.id = 2,
                          .model = 1,
                          .name = "tight",
                          .profile = p,
                          .slo_us = 20 * MS,
                          .rate_rps = 50,
                          .item_bytes = 150528};
}

Test(pack, tight_slo_session_is_not_placed_on_a_far_device)
{
    pl_profile_t p;
    pl_session_t s[2];
    link_sessions(&p, s);
    pl_link_t links[2] = {{.rtt_us = 8 * MS, .bytes_per_us = 1250}, {0, 0}};
    pl_options_t o = {.max_devices = 2, .links = links, .nlinks = 2};
    pl_plan_t plan;
    cr_assert_eq(pl_plan(&plan, s, 2, NULL, &o), 0);
    cr_assert_eq(plan.nunplaced, 0);
    cr_assert_eq(plan.ndevices, 2);
    const pl_device_t *tight = device_of(&plan, 2, 0), *loose = device_of(&plan, 1, 0);
    cr_assert(tight && loose);
    cr_assert_eq(tight->id, 1, "the tight session is on the local device");
    cr_assert_eq(tight->rtt_us, 0);
    cr_assert_eq(loose->id, 0);
    cr_assert_eq(loose->rtt_us, 8 * MS);
    cr_assert_eq(loose->bytes_per_us, 1250);
    const pl_alloc_t *a = alloc_of(loose, 1);
    cr_assert_float_eq(a->transfer_us, 8 * MS + a->batch * 150528 / 1250.0, 1e-6);
    cr_assert_leq(loose->duty_cycle_us + a->latency_us + a->transfer_us, 400 * MS + 1e-6);
    cr_assert_leq(a->latency_us + a->transfer_us, loose->duty_cycle_us + 1e-6);
    cr_assert_geq(a->batch / loose->duty_cycle_us * 1e6, 500 * (1 - 1e-9));
    cr_assert_eq(alloc_of(tight, 2)->transfer_us, 0);
    pl_plan_dispose(&plan);

    /* Only far devices: the tight session has nowhere to go. */
    pl_link_t far[2] = {links[0], links[0]};
    o.links = far;
    cr_assert_eq(pl_plan(&plan, s, 2, NULL, &o), 0);
    cr_assert_eq(plan.nunplaced, 1);
    cr_assert_eq(plan.unplaced[0].session_id, 2);
    cr_assert_eq(plan.unplaced[0].reason, PL_UNPLACED_LINK);
    cr_assert_eq(plan.ndevices, 1);
    cr_assert_eq(plan.devices[0].allocs[0].session_id, 1);
    pl_plan_dispose(&plan);

    /* No links: the same packing, ids in order. */
    o.links = NULL;
    o.nlinks = 0;
    cr_assert_eq(pl_plan(&plan, s, 2, NULL, &o), 0);
    cr_assert_eq(plan.nunplaced, 0);
    for (int i = 0; i < plan.ndevices; i++)
        cr_assert_eq(plan.devices[i].rtt_us, 0);
    pl_plan_dispose(&plan);

    /* Bad links. */
    pl_link_t bad = {.rtt_us = -1};
    o.links = &bad;
    o.nlinks = 1;
    cr_assert_eq(pl_plan(&plan, s, 2, NULL, &o), SQ_INVAL);
    pl_profile_dispose(&p);
}

/* A session that fits behind a link only with a shorter cycle: the device
 * shortens its duty cycle (smaller batches) so that cycle + l(b) + net(b)
 * stays within the SLO. */
Test(pack, link_shortens_the_duty_cycle)
{
    pl_profile_t p;
    pl_profile_init_linear(&p, 1 * MS, 5 * MS, 64);
    pl_session_t s = {.id = 1,
                      .model = 0,
                      .name = "m",
                      .profile = &p,
                      .slo_us = 100 * MS,
                      .rate_rps = 200,
                      .item_bytes = 100000};
    pl_plan_t local, remote;
    pl_options_t o = {0};
    cr_assert_eq(pl_plan(&local, &s, 1, NULL, &o), 0);
    pl_link_t l = {.rtt_us = 10 * MS, .bytes_per_us = 1000};
    o.links = &l;
    o.nlinks = 1;
    o.max_devices = 1;
    cr_assert_eq(pl_plan(&remote, &s, 1, NULL, &o), 0);
    cr_assert_eq(remote.nunplaced, 0);
    const pl_device_t *dl = &local.devices[0], *dr = &remote.devices[0];
    const pl_alloc_t *al = &dl->allocs[0], *ar = &dr->allocs[0];
    cr_assert_lt(dr->duty_cycle_us, dl->duty_cycle_us);
    cr_assert_lt(ar->batch, al->batch);
    cr_assert_leq(dr->duty_cycle_us + ar->latency_us + ar->transfer_us, 100 * MS + 1e-6);
    cr_assert_float_eq(ar->transfer_us, 10 * MS + ar->batch * 100.0, 1e-6);
    pl_plan_dispose(&local);
    pl_plan_dispose(&remote);
    pl_profile_dispose(&p);
}
