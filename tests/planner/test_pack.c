#include "pack_test.h"

/* Nexus section 4.1 (shared/reference/README.md): batch -> latency in ms. */
static const pl_profile_row_t ROWS_A[] = {{4, 50 * MS, 0}, {8, 75 * MS, 0}, {16, 100 * MS, 0}};
static const pl_profile_row_t ROWS_B[] = {{4, 50 * MS, 0}, {8, 90 * MS, 0}, {16, 125 * MS, 0}};
static const pl_profile_row_t ROWS_C[] = {{4, 60 * MS, 0}, {8, 95 * MS, 0}, {16, 125 * MS, 0}};

static pl_profile_t prof[3];

static void nexus_setup(void)
{
    cr_assert_eq(pl_profile_init_table(&prof[0], ROWS_A, 3), 0);
    cr_assert_eq(pl_profile_init_table(&prof[1], ROWS_B, 3), 0);
    cr_assert_eq(pl_profile_init_table(&prof[2], ROWS_C, 3), 0);
}

static void nexus_teardown(void)
{
    for (int i = 0; i < 3; i++)
        pl_profile_dispose(&prof[i]);
}

static void nexus_sessions(pl_session_t s[3], double ra, double rb, double rc)
{
    s[0] = (pl_session_t){
        .id = 10, .model = 0, .name = "A", .profile = &prof[0], .slo_us = 200 * MS, .rate_rps = ra};
    s[1] = (pl_session_t){
        .id = 11, .model = 1, .name = "B", .profile = &prof[1], .slo_us = 250 * MS, .rate_rps = rb};
    s[2] = (pl_session_t){
        .id = 12, .model = 2, .name = "C", .profile = &prof[2], .slo_us = 250 * MS, .rate_rps = rc};
}

Test(pack, nexus_high_load_saturates_at_batch_16, .init = nexus_setup, .fini = nexus_teardown)
{
    int b;
    cr_assert_float_eq(pl_max_throughput_rps(&prof[0], 200 * MS, 0, 0, &b), 160, 1e-9);
    cr_assert_eq(b, 16);
    cr_assert_float_eq(pl_max_throughput_rps(&prof[1], 250 * MS, 0, 0, &b), 128, 1e-9);
    cr_assert_eq(b, 16);
    cr_assert_float_eq(pl_max_throughput_rps(&prof[2], 250 * MS, 0, 0, &b), 128, 1e-9);
    cr_assert_eq(b, 16);

    /* Three whole devices each, nothing left over. */
    pl_session_t s[3];
    nexus_sessions(s, 480, 384, 384);
    pl_options_t opt = {0};
    pl_plan_t p;
    cr_assert_eq(pl_plan(&p, s, 3, NULL, &opt), 0);
    cr_assert_eq(p.ndevices, 9);
    for (int i = 0; i < p.ndevices; i++) {
        const pl_device_t *d = &p.devices[i];
        cr_assert(d->saturated);
        cr_assert_eq(d->nallocs, 1);
        cr_assert_eq(d->allocs[0].batch, 16);
        double per_device = d->allocs[0].session_id == 10 ? 160 : 128;
        cr_assert_float_eq(d->allocs[0].rate_rps, per_device, 1e-9);
        cr_assert_float_eq(d->duty_cycle_us, d->allocs[0].latency_us, 1e-9);
    }
    cr_assert_float_eq(p.lower_bound_devices, 9, 1e-9);
    cr_assert_eq(p.nunplaced, 0);
    pl_plan_dispose(&p);
}

Test(pack, nexus_low_load_a_and_b_share_c_alone, .init = nexus_setup, .fini = nexus_teardown)
{
    int b;
    double d, occ;
    cr_assert_eq(pl_residue(&prof[0], 200 * MS, 64, 0, 0, &b, &d, &occ), 0);
    cr_assert_eq(b, 8);
    cr_assert_float_eq(d, 125 * MS, 1e-6);
    cr_assert_float_eq(occ, 0.6, 1e-9);
    /* B: 5 would also fit (156.25 + 90 <= 250) but pads to the 8-row and
     * costs more per request than 4 at 125 ms */
    cr_assert_eq(pl_residue(&prof[1], 250 * MS, 32, 0, 0, &b, &d, &occ), 0);
    cr_assert_eq(b, 4);
    cr_assert_float_eq(d, 125 * MS, 1e-6);
    cr_assert_float_eq(occ, 0.4, 1e-9);
    /* a batch that does not fit memory is not chosen */
    prof[0].memory_bytes = 100;
    prof[0].memory_per_item_bytes = 10;
    cr_assert_eq(pl_residue(&prof[0], 200 * MS, 64, 0, 135, &b, &d, &occ), 0);
    cr_assert_eq(b, 4, "5 items need 140 bytes");
    prof[0].memory_bytes = prof[0].memory_per_item_bytes = 0;

    pl_session_t s[3];
    nexus_sessions(s, 64, 32, 32);
    pl_options_t opt = {0};
    pl_plan_t p;
    cr_assert_eq(pl_plan(&p, s, 3, NULL, &opt), 0);
    cr_assert_eq(p.ndevices, 2);
    const pl_device_t *da = device_of(&p, 10, 0), *dc = device_of(&p, 12, 0);
    cr_assert_not_null(da);
    cr_assert_eq(device_of(&p, 11, 0), da, "B shares A's device");
    cr_assert_neq(dc, da, "C does not fit there");
    cr_assert_float_eq(da->duty_cycle_us, 125 * MS, 1e-6);
    const pl_alloc_t *a = alloc_of(da, 10), *bb = alloc_of(da, 11);
    cr_assert_eq(a->batch, 8);
    cr_assert_float_eq(a->latency_us, 75 * MS, 1e-9);
    cr_assert_eq(bb->batch, 4);
    cr_assert_float_eq(da->duty_cycle_us + bb->latency_us, 175 * MS, 1e-6, "B's worst case");
    cr_assert_float_eq(da->duty_cycle_us + a->latency_us, 200 * MS, 1e-6, "A's worst case");
    cr_assert_float_eq(da->occupancy, 1.0, 1e-9);
    cr_assert_eq(alloc_of(dc, 12)->batch, 4);
    cr_assert_float_eq(dc->occupancy, 60.0 / 125.0, 1e-9);
    pl_plan_dispose(&p);
}

Test(pack, merge_refused_when_memory_does_not_fit, .init = nexus_setup, .fini = nexus_teardown)
{
    /* A and B fit one device by time; with 600 MB of weights each on an
     * 1000 MB device they must not share it. */
    prof[0].memory_bytes = 600e6;
    prof[1].memory_bytes = 600e6;
    prof[2].memory_bytes = 100e6;
    pl_session_t s[3];
    nexus_sessions(s, 64, 32, 32);
    pl_options_t opt = {.device_memory_bytes = 1000e6};
    pl_plan_t p;
    cr_assert_eq(pl_plan(&p, s, 3, NULL, &opt), 0);
    cr_assert_eq(p.ndevices, 2);
    cr_assert_neq(device_of(&p, 10, 0), device_of(&p, 11, 0));
    cr_assert_eq(device_of(&p, 11, 0), device_of(&p, 12, 0), "B goes with C instead");
    for (int i = 0; i < p.ndevices; i++)
        cr_assert_leq(p.devices[i].memory_bytes, 1000e6);
    pl_plan_dispose(&p);

    /* Activations count too: 40 MB per extra item is what breaks B + C. */
    prof[1].memory_bytes = 450e6;
    prof[2].memory_bytes = 450e6;
    prof[1].memory_per_item_bytes = 40e6;
    cr_assert_float_eq(pl_memory_bytes(&prof[1], 4), 570e6, 1);
    cr_assert_eq(pl_plan(&p, s, 3, NULL, &opt), 0);
    cr_assert_eq(p.ndevices, 3);
    pl_plan_dispose(&p);
}

Test(pack, model_larger_than_device_is_unplaced, .init = nexus_setup, .fini = nexus_teardown)
{
    prof[2].memory_bytes = 2000e6;
    pl_session_t s[3];
    nexus_sessions(s, 64, 32, 32);
    pl_options_t opt = {.device_memory_bytes = 1000e6};
    pl_plan_t p;
    cr_assert_eq(pl_plan(&p, s, 3, NULL, &opt), 0);
    cr_assert_eq(p.nunplaced, 1);
    cr_assert_eq(p.unplaced[0].session_id, 12);
    cr_assert_eq(p.unplaced[0].reason, PL_UNPLACED_MEMORY);
    cr_assert_float_eq(p.unplaced[0].rate_rps, 32, 1e-9);
    pl_plan_dispose(&p);
}

Test(pack, slo_below_any_batch_is_unplaced, .init = nexus_setup, .fini = nexus_teardown)
{
    pl_session_t s[3];
    nexus_sessions(s, 64, 32, 32);
    s[0].slo_us = 90 * MS; /* 2 l(4) = 100 ms > 90 */
    pl_options_t opt = {0};
    pl_plan_t p;
    cr_assert_eq(pl_plan(&p, s, 3, NULL, &opt), 0);
    cr_assert_eq(p.nunplaced, 1);
    cr_assert_eq(p.unplaced[0].reason, PL_UNPLACED_SLO);
    pl_plan_dispose(&p);
}

Test(pack, max_devices_leaves_the_rest_unplaced, .init = nexus_setup, .fini = nexus_teardown)
{
    pl_session_t s[3];
    nexus_sessions(s, 480, 384, 384);
    pl_options_t opt = {.max_devices = 5};
    pl_plan_t p;
    cr_assert_eq(pl_plan(&p, s, 3, NULL, &opt), 0);
    cr_assert_eq(p.ndevices, 5);
    double left = 0;
    for (int i = 0; i < p.nunplaced; i++) {
        cr_assert_eq(p.unplaced[i].reason, PL_UNPLACED_DEVICES);
        left += p.unplaced[i].rate_rps;
    }
    double served = 0;
    for (int i = 0; i < p.ndevices; i++)
        served += p.devices[i].allocs[0].rate_rps;
    cr_assert_float_eq(served + left, 480 + 384 + 384, 1e-6);
    pl_plan_dispose(&p);
}

Test(pack, zero_rate_session_gets_minimal_batch, .init = nexus_setup, .fini = nexus_teardown)
{
    pl_session_t s[3];
    nexus_sessions(s, 0, 0, 0);
    pl_options_t opt = {0};
    pl_plan_t p;
    cr_assert_eq(pl_plan(&p, s, 3, NULL, &opt), 0);
    cr_assert_eq(p.nunplaced, 0);
    int placed = 0;
    for (int i = 0; i < p.ndevices; i++)
        for (int a = 0; a < p.devices[i].nallocs; a++) {
            cr_assert_eq(p.devices[i].allocs[a].batch, 1);
            placed++;
        }
    cr_assert_eq(placed, 3);
    cr_assert_float_eq(p.lower_bound_devices, 0, 1e-12);
    pl_plan_dispose(&p);
}

Test(pack, bad_input_is_rejected, .init = nexus_setup, .fini = nexus_teardown)
{
    pl_session_t s[3];
    nexus_sessions(s, 64, 32, 32);
    pl_options_t opt = {0};
    pl_plan_t p;
    s[1].id = s[0].id;
    cr_assert_eq(pl_plan(&p, s, 3, NULL, &opt), SQ_INVAL);
    nexus_sessions(s, 64, -1, 32);
    cr_assert_eq(pl_plan(&p, s, 3, NULL, &opt), SQ_INVAL);
    nexus_sessions(s, 64, 32, 32);
    s[2].profile = NULL;
    cr_assert_eq(pl_plan(&p, s, 3, NULL, &opt), SQ_INVAL);
    pl_plan_dispose(&p); /* zeroed by the failed call */
    pl_plan_dispose(NULL);
}

Test(pack, advice_follows_symphony)
{
    cr_assert_float_eq(pl_advice_add(8, 0.2), 2.0, 1e-12);
    cr_assert_float_eq(pl_advice_add(8, 0), 0, 1e-12);
    cr_assert_float_eq(pl_advice_add(10, 0.5), 10, 1e-12);
    cr_assert_float_eq(pl_advice_release(8, 0.25), 2.0, 1e-12);
    cr_assert_float_eq(pl_advice_release(8, 0), 0, 1e-12);
}

/* ---- incremental epochs ---------------------------------------------------- */

static int same_placement(const pl_plan_t *a, const pl_plan_t *b, int skip_session)
{
    /* Every (device, session) of a other than skip_session is in b. */
    for (int i = 0; i < a->ndevices; i++)
        for (int k = 0; k < a->devices[i].nallocs; k++) {
            int sid = a->devices[i].allocs[k].session_id, found = 0;
            if (sid == skip_session)
                continue;
            for (int j = 0; j < b->ndevices; j++)
                if (b->devices[j].id == a->devices[i].id && alloc_of(&b->devices[j], sid))
                    found = 1;
            if (!found)
                return 0;
        }
    return 1;
}

Test(pack, epoch_with_unchanged_rates_moves_nothing, .init = nexus_setup, .fini = nexus_teardown)
{
    pl_session_t s[3];
    nexus_sessions(s, 64 + 160, 32, 32 + 256);
    pl_options_t opt = {0};
    pl_plan_t p1, p2;
    cr_assert_eq(pl_plan(&p1, s, 3, NULL, &opt), 0);
    cr_assert_eq(pl_plan(&p2, s, 3, &p1, &opt), 0);
    cr_assert_eq(p2.moved, 0);
    cr_assert_eq(p2.evicted, 0);
    cr_assert_eq(p2.released, 0);
    cr_assert_eq(p2.ndevices, p1.ndevices);
    cr_assert(same_placement(&p1, &p2, -1));
    cr_assert(same_placement(&p2, &p1, -1));
    for (int i = 0; i < p1.ndevices; i++)
        cr_assert_float_eq(p1.devices[i].duty_cycle_us, p2.devices[i].duty_cycle_us, 1e-9);
    pl_plan_dispose(&p1);
    pl_plan_dispose(&p2);
}

Test(pack, epoch_after_overload_moves_only_the_evicted, .init = nexus_setup, .fini = nexus_teardown)
{
    /* A and B share a device at 125 ms; B doubles to 64 req/s: batch 8 at
     * 90 ms no longer fits next to A's 75 ms. The cheaper of the two (A, solo
     * occupancy 0.6 against B's 0.72) leaves; B and C stay where they were. */
    pl_session_t s[3];
    nexus_sessions(s, 64, 32, 32);
    pl_options_t opt = {0};
    pl_plan_t p1, p2;
    cr_assert_eq(pl_plan(&p1, s, 3, NULL, &opt), 0);
    int shared = device_of(&p1, 10, 0)->id, dev_c = device_of(&p1, 12, 0)->id;
    s[1].rate_rps = 64;
    cr_assert_eq(pl_plan(&p2, s, 3, &p1, &opt), 0);
    cr_assert_eq(p2.evicted, 1);
    cr_assert_eq(p2.moved, 1);
    cr_assert_eq(device_of(&p2, 11, 0)->id, shared);
    cr_assert_eq(alloc_of(device_of(&p2, 11, 0), 11)->batch, 8);
    cr_assert_eq(device_of(&p2, 12, 0)->id, dev_c);
    cr_assert_neq(device_of(&p2, 10, 0)->id, shared);
    cr_assert_neq(device_of(&p2, 10, 0)->id, dev_c, "0.6 + 0.48: A does not fit with C");
    cr_assert(same_placement(&p1, &p2, 10));
    cr_assert_eq(p2.ndevices, 3);
    pl_plan_dispose(&p1);
    pl_plan_dispose(&p2);
}

Test(pack, epoch_releases_devices_when_load_falls, .init = nexus_setup, .fini = nexus_teardown)
{
    pl_session_t s[3];
    nexus_sessions(s, 480, 32, 32);
    pl_options_t opt = {0};
    pl_plan_t p1, p2;
    cr_assert_eq(pl_plan(&p1, s, 3, NULL, &opt), 0);
    cr_assert_eq(p1.ndevices, 4); /* 3 x A saturated, B + C */
    s[0].rate_rps = 160;
    cr_assert_eq(pl_plan(&p2, s, 3, &p1, &opt), 0);
    cr_assert_eq(p2.ndevices, 2);
    cr_assert_eq(p2.released, 2);
    cr_assert_eq(p2.moved, 0);
    pl_plan_dispose(&p1);
    pl_plan_dispose(&p2);
}

/* pl_options_t.overflow: the packing needs 2 of 4 devices; the two spares
 * also hold the sessions, busiest (most planned occupancy) first, as far as
 * memory allows, and the packing itself (what the advice counts) is the
 * same as without. */
Test(pack, spare_devices_hold_the_busiest_sessions_for_overflow, .init = nexus_setup,
     .fini = nexus_teardown)
{
    pl_session_t s[3];
    nexus_sessions(s, 64, 32, 32);
    pl_options_t plain = {.max_devices = 4}, opt = {.max_devices = 4, .overflow = 1};
    pl_plan_t p0, p;
    cr_assert_eq(pl_plan(&p0, s, 3, NULL, &plain), 0);
    cr_assert_eq(pl_plan(&p, s, 3, NULL, &opt), 0);
    cr_assert_eq(p0.noverflow, 0);
    cr_assert_eq(p.ndevices, p0.ndevices);
    cr_assert_eq(p.ndevices, 2);
    double load[3] = {0};
    for (int i = 0; i < p.ndevices; i++)
        for (int a = 0; a < p.devices[i].nallocs; a++)
            load[p.devices[i].allocs[a].session] +=
                p.devices[i].allocs[a].latency_us / p.devices[i].duty_cycle_us;
    cr_assert_eq(p.noverflow, 6, "every session on both spares");
    for (int i = 0; i < p.noverflow; i++) {
        const pl_overflow_t *o = &p.overflow[i];
        cr_assert(o->device_id == 2 || o->device_id == 3, "spare ids: %d", o->device_id);
        cr_assert_eq(o->session_id, s[o->session].id);
        if (i > 0 && p.overflow[i - 1].device_id == o->device_id)
            cr_assert_geq(load[p.overflow[i - 1].session], load[o->session], "busiest first");
    }
    pl_plan_dispose(&p);
    pl_plan_dispose(&p0);

    /* 600 MB of weights for A and B, 100 for C, 1000 MB devices: a spare
     * holds the busiest of A and B, and C. */
    prof[0].memory_bytes = 600e6;
    prof[1].memory_bytes = 600e6;
    prof[2].memory_bytes = 100e6;
    opt.device_memory_bytes = 1000e6;
    cr_assert_eq(pl_plan(&p, s, 3, NULL, &opt), 0);
    int spares = 4 - p.ndevices;
    cr_assert_eq(p.noverflow, 2 * spares);
    for (int id = 0; id < 4; id++) {
        double mem = 0;
        int big = 0;
        for (int i = 0; i < p.noverflow; i++) {
            if (p.overflow[i].device_id != id)
                continue;
            mem += s[p.overflow[i].session].profile->memory_bytes;
            big += p.overflow[i].session_id != 12;
        }
        cr_assert_leq(mem, 1000e6, "spare %d", id);
        cr_assert_leq(big, 1);
    }
    pl_plan_dispose(&p);
    /* No spare: no overflow. */
    opt.max_devices = p0.ndevices;
    opt.device_memory_bytes = 0;
    cr_assert_eq(pl_plan(&p, s, 3, NULL, &opt), 0);
    cr_assert_eq(p.noverflow, 0);
    pl_plan_dispose(&p);
}

/* pl_options_t.overflow_devices: with more spares than the fan-out, each
 * session takes that many, dealt round (session k of the rank from spare
 * k x fan-out), so the spares share the sessions out; with at least as many
 * as spares, every session is on every spare, as with no fan-out given. */
Test(pack, spares_are_dealt_round_when_the_fanout_caps_them, .init = nexus_setup,
     .fini = nexus_teardown)
{
    pl_session_t s[3];
    nexus_sessions(s, 64, 32, 32);
    pl_options_t opt = {.max_devices = 8, .overflow = 1, .overflow_devices = 2};
    pl_plan_t p;
    cr_assert_eq(pl_plan(&p, s, 3, NULL, &opt), 0);
    int spares = 8 - p.ndevices;
    cr_assert_geq(spares, 6, "%d spares", spares);
    cr_assert_eq(p.noverflow, 3 * 2, "two spares a session");
    int on[8] = {0};
    for (int i = 0; i < p.noverflow; i++) {
        const pl_overflow_t *o = &p.overflow[i];
        for (int k = 0; k < p.ndevices; k++)
            cr_assert_neq(p.devices[k].id, o->device_id, "a spare");
        for (int j = 0; j < i; j++)
            cr_assert(!(p.overflow[j].device_id == o->device_id &&
                        p.overflow[j].session_id == o->session_id),
                      "two distinct spares");
        if (i > 0)
            cr_assert_geq(o->device_id, p.overflow[i - 1].device_id, "listed by spare id");
        on[o->device_id]++;
    }
    for (int id = 0; id < 8; id++)
        cr_assert_leq(on[id], 1, "dealt round: spare %d holds %d sessions", id, on[id]);
    pl_plan_dispose(&p);
    /* A fan-out of the spares or more: every session on every spare. */
    opt.overflow_devices = spares;
    cr_assert_eq(pl_plan(&p, s, 3, NULL, &opt), 0);
    cr_assert_eq(p.noverflow, 3 * spares);
    pl_plan_dispose(&p);
    opt.overflow_devices = 0;
    cr_assert_eq(pl_plan(&p, s, 3, NULL, &opt), 0);
    cr_assert_eq(p.noverflow, 3 * spares, "the default for a small cluster: all");
    pl_plan_dispose(&p);
}

/* Issue 15: after the load stopped, the plan kept one model per device at
 * near-zero rates. Each session fills most of a device of its own; when
 * every rate falls to 1 req/s the incremental epoch empties kept devices
 * too. At 1 req/s each runs b = 1 (the tables round up to the 4-row: 50,
 * 50, 60 ms) at duty cycle L - l(1): 150, 200, 190 ms; all three would
 * need 160 ms of a 150 ms cycle, two fit: two devices, one released. */
Test(pack, epoch_consolidates_kept_devices_when_load_falls, .init = nexus_setup,
     .fini = nexus_teardown)
{
    pl_session_t s[3];
    nexus_sessions(s, 120, 80, 80);
    pl_options_t opt = {.max_devices = 3};
    pl_plan_t p1, p2, p3;
    cr_assert_eq(pl_plan(&p1, s, 3, NULL, &opt), 0);
    cr_assert_eq(p1.ndevices, 3);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(p1.devices[i].nallocs, 1, "one model per device");
    for (int i = 0; i < 3; i++)
        s[i].rate_rps = 1;
    cr_assert_eq(pl_plan(&p2, s, 3, &p1, &opt), 0);
    cr_assert_eq(p2.ndevices, 2);
    cr_assert_eq(p2.released, 1);
    cr_assert_eq(p2.moved, 1, "one session moves to a device kept");
    /* And the next epoch at the same rates moves nothing. */
    cr_assert_eq(pl_plan(&p3, s, 3, &p2, &opt), 0);
    cr_assert_eq(p3.ndevices, 2);
    cr_assert_eq(p3.moved, 0);
    pl_plan_dispose(&p1);
    pl_plan_dispose(&p2);
    pl_plan_dispose(&p3);
}

/* Devices short: A needs 3 saturated devices and a residue, B and C share
 * one; with 3 devices the cut leaves load unplaced (PL_UNPLACED_DEVICES),
 * and the planned devices that do not hold an unplaced session take its
 * overflow instead of losing it, within their memory. */
Test(pack, short_of_devices_planned_devices_take_the_unplaced_overflow, .init = nexus_setup,
     .fini = nexus_teardown)
{
    pl_session_t s[3];
    nexus_sessions(s, 520, 32, 32);
    pl_options_t opt = {.max_devices = 3, .overflow = 1};
    pl_plan_t p;
    cr_assert_eq(pl_plan(&p, s, 3, NULL, &opt), 0);
    cr_assert_eq(p.ndevices, 3);
    int short_sessions = 0;
    for (int u = 0; u < p.nunplaced; u++) {
        if (p.unplaced[u].reason != PL_UNPLACED_DEVICES)
            continue;
        short_sessions++;
        int sid = p.unplaced[u].session_id, routed = 0;
        for (int i = 0; i < p.noverflow; i++) {
            if (p.overflow[i].session_id != sid)
                continue;
            const pl_device_t *d = NULL;
            for (int k = 0; k < p.ndevices; k++)
                if (p.devices[k].id == p.overflow[i].device_id)
                    d = &p.devices[k];
            cr_assert_not_null(d, "a planned device");
            cr_assert_null(alloc_of(d, sid), "not one that holds it already");
            routed++;
        }
        int holders = 0;
        for (int k = 0; k < p.ndevices; k++)
            holders += alloc_of(&p.devices[k], sid) != NULL;
        cr_assert_eq(routed, p.ndevices - holders, "session %d: every other device", sid);
    }
    cr_assert_gt(short_sessions, 0, "the cut left load unplaced");
    pl_plan_dispose(&p);
    /* Memory: 600 MB models on 1000 MB devices: no device takes a second. */
    for (int i = 0; i < 3; i++)
        prof[i].memory_bytes = 600e6;
    opt.device_memory_bytes = 1000e6;
    cr_assert_eq(pl_plan(&p, s, 3, NULL, &opt), 0);
    for (int i = 0; i < p.noverflow; i++) {
        for (int k = 0; k < p.ndevices; k++)
            if (p.devices[k].id == p.overflow[i].device_id)
                for (int a = 0; a < p.devices[k].nallocs; a++)
                    cr_assert_eq(p.devices[k].allocs[a].model, p.overflow[i].model,
                                 "only where its model is already");
    }
    pl_plan_dispose(&p);
}

/* ---- property test ---------------------------------------------------------
 * A checker written from the validity rules in pl.h, not from pack.c: for
 * every device the batches fit the duty cycle, every share meets its SLO in
 * the worst case and collects at least its rate, memory fits; and every
 * session's rate is served or reported unplaced. */

static uint64_t rng_state;
static double rnd(void)
{
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}

static void check_plan(const pl_plan_t *p, const pl_session_t *s, int n, const pl_options_t *o)
{
    double *served = calloc((size_t)n, sizeof(double));
    for (int i = 0; i < p->ndevices; i++) {
        const pl_device_t *d = &p->devices[i];
        cr_assert_gt(d->nallocs, 0, "no empty device");
        cr_assert(i == 0 || p->devices[i - 1].id < d->id, "ids unique and sorted");
        double busy = 0, mem = 0;
        for (int a = 0; a < d->nallocs; a++) {
            const pl_alloc_t *al = &d->allocs[a];
            const pl_session_t *ss = &s[al->session];
            cr_assert_eq(ss->id, al->session_id);
            double l = pl_latency_us(ss->profile, al->batch, o->k_std);
            cr_assert_gt(l, 0, "batch %d usable", al->batch);
            cr_assert_float_eq(l, al->latency_us, 1e-6);
            cr_assert_leq(d->duty_cycle_us + l, ss->slo_us + 1e-3, "worst case within SLO");
            cr_assert_geq(al->batch * 1e6 / d->duty_cycle_us, al->rate_rps * (1 - 1e-9),
                          "the batch collects the share's rate");
            busy += l;
            served[al->session] += al->rate_rps;
            /* weights once per model, activations at its largest batch here */
            int first = 1, maxb = al->batch;
            for (int k = 0; k < d->nallocs; k++) {
                if (d->allocs[k].model != al->model)
                    continue;
                if (k < a)
                    first = 0;
                if (d->allocs[k].batch > maxb)
                    maxb = d->allocs[k].batch;
            }
            if (first)
                mem += ss->profile->memory_bytes + ss->profile->memory_per_item_bytes * (maxb - 1);
        }
        cr_assert_leq(busy, d->duty_cycle_us + 1e-3, "batches fit the duty cycle");
        if (o->device_memory_bytes > 0)
            cr_assert_leq(mem, o->device_memory_bytes * (1 + 1e-12), "memory fits");
        cr_assert_float_eq(mem, d->memory_bytes, 1e-3 * (1 + mem));
    }
    for (int i = 0; i < p->nunplaced; i++)
        served[p->unplaced[i].session] += p->unplaced[i].rate_rps;
    for (int i = 0; i < n; i++)
        cr_assert_float_eq(served[i], s[i].rate_rps, 1e-6 * (1 + s[i].rate_rps),
                           "session %d: rate served or unplaced", i);
    if (o->max_devices > 0)
        cr_assert_leq(p->ndevices, o->max_devices);
    free(served);
}

static void random_profile(pl_profile_t *p)
{
    if (rnd() < 0.5) {
        pl_profile_init_linear(p, (0.2 + 3 * rnd()) * MS, (2 + 20 * rnd()) * MS,
                               8 + (int)(120 * rnd()));
    } else {
        /* l(b)/b non-increasing: a fixed cost plus a per-item cost that
         * shrinks, with a random subset of batch sizes listed. */
        pl_profile_row_t rows[12];
        int n = 0;
        double fixed = (5 + 30 * rnd()) * MS, per = (1 + 5 * rnd()) * MS;
        for (int b = 1; b <= 64 && n < 12; b *= 2)
            if (rnd() < 0.8 || b == 1)
                rows[n++] = (pl_profile_row_t){b, fixed + per * b * (0.6 + 0.4 / b), rnd() * MS};
        cr_assert_eq(pl_profile_init_table(p, rows, n), 0);
    }
    p->memory_bytes = (50 + 500 * rnd()) * 1e6;
    p->memory_per_item_bytes = 10 * rnd() * 1e6;
}

Test(pack, random_workloads_satisfy_every_slo_and_memory_limit)
{
    for (int seed = 1; seed <= 60; seed++) {
        rng_state = (uint64_t)seed * 0x9E3779B97F4A7C15ULL;
        int nmodels = 1 + (int)(12 * rnd()), n = 1 + (int)(40 * rnd());
        pl_profile_t *profs = calloc((size_t)nmodels, sizeof(*profs));
        for (int m = 0; m < nmodels; m++)
            random_profile(&profs[m]);
        pl_session_t *s = calloc((size_t)n, sizeof(*s));
        for (int i = 0; i < n; i++) {
            int m = (int)(nmodels * rnd());
            double r = rnd();
            s[i] = (pl_session_t){.id = 1000 + 7 * i,
                                  .model = m,
                                  .profile = &profs[m],
                                  .slo_us = (20 + 400 * rnd()) * MS,
                                  .rate_rps = r < 0.1 ? 0 : 3000 * pow(r, 3)};
        }
        pl_options_t o = {.k_std = rnd() < 0.5 ? 0 : 2,
                          .device_memory_bytes = rnd() < 0.3 ? 0 : (600 + 3000 * rnd()) * 1e6,
                          .max_devices = rnd() < 0.2 ? 1 + (int)(10 * rnd()) : 0};
        pl_plan_t p, q;
        cr_assert_eq(pl_plan(&p, s, n, NULL, &o), 0);
        check_plan(&p, s, n, &o);
        cr_assert_geq(p.ndevices + p.nunplaced * 1e9 + 1e-9, p.lower_bound_devices,
                      "never below the lower bound");

        /* Next epoch: rates drift, a session goes away, one arrives. */
        for (int i = 0; i < n; i++)
            s[i].rate_rps *= 0.5 + rnd();
        s[n - 1].id = 99999;
        cr_assert_eq(pl_plan(&q, s, n, &p, &o), 0);
        check_plan(&q, s, n, &o);
        pl_plan_t q2;
        cr_assert_eq(pl_plan(&q2, s, n, &q, &o), 0);
        check_plan(&q2, s, n, &o);
        cr_assert_eq(q2.moved, 0, "seed %d: a second epoch at the same rates moves nothing", seed);
        pl_plan_dispose(&p);
        pl_plan_dispose(&q);
        pl_plan_dispose(&q2);
        for (int m = 0; m < nmodels; m++)
            pl_profile_dispose(&profs[m]);
        free(profs);
        free(s);
    }
}

/* pl_plan_copy: a deep copy (the epoch report keeps one while the loop
 * moves on), an empty plan's included (NULL arrays: UBSan caught a memcpy
 * from NULL there at the first epoch of every squishd). */
Test(pack, a_plan_copy_is_deep_and_an_empty_one_copies, .init = nexus_setup, .fini = nexus_teardown)
{
    pl_plan_t empty = {0}, e2;
    pl_plan_copy(&e2, &empty);
    cr_assert_eq(e2.ndevices + e2.noverflow + e2.nunplaced, 0);
    pl_plan_dispose(&e2);
    pl_session_t s[3];
    nexus_sessions(s, 64, 32, 32);
    pl_options_t opt = {.max_devices = 4, .overflow = 1};
    pl_plan_t p, c;
    cr_assert_eq(pl_plan(&p, s, 3, NULL, &opt), 0);
    pl_plan_copy(&c, &p);
    cr_assert_eq(c.ndevices, p.ndevices);
    cr_assert_eq(c.noverflow, p.noverflow);
    for (int i = 0; i < p.ndevices; i++) {
        cr_assert_neq(c.devices[i].allocs, p.devices[i].allocs, "its own allocations");
        cr_assert_arr_eq(c.devices[i].allocs, p.devices[i].allocs,
                         sizeof(pl_alloc_t) * (size_t)p.devices[i].nallocs);
    }
    cr_assert_arr_eq(c.overflow, p.overflow, sizeof(pl_overflow_t) * (size_t)p.noverflow);
    pl_plan_dispose(&p);
    cr_assert_eq(c.devices[0].allocs[0].session_id, s[c.devices[0].allocs[0].session].id,
                 "readable after the original went");
    pl_plan_dispose(&c);
}

Test(pack, slo_and_memory_reasons_say_what_to_ask, .init = nexus_setup, .fini = nexus_teardown)
{
    prof[2].memory_bytes = 3.1e9;
    pl_session_t s[3];
    nexus_sessions(s, 64, 32, 32);
    s[0].slo_us = 90 * MS; /* 2 l(4) = 100 ms > 90 */
    pl_options_t opt = {.device_memory_bytes = 2e9};
    pl_plan_t p;
    cr_assert_eq(pl_plan(&p, s, 3, NULL, &opt), 0);
    cr_assert_eq(p.nunplaced, 2);
    char w[512];
    for (int i = 0; i < 2; i++) {
        const pl_unplaced_t *u = &p.unplaced[i];
        pl_unplaced_words(w, sizeof(w), u, s[u->session].slo_us, p.ndevices, NULL, NULL);
        if (u->session_id == 10) {
            cr_assert_str_eq(pl_unplaced_code(u->reason), "slo");
            cr_assert_str_eq(w, "a batch of one takes 50 ms and must run within half its SLO of "
                                "90 ms: ask for an SLO of 100 ms or more");
        } else {
            cr_assert_str_eq(pl_unplaced_code(u->reason), "memory");
            cr_assert_str_eq(w, "memory: its model takes 3.1 GB at a batch of one, a device has "
                                "2.0 GB: a device with more memory, or a smaller model");
        }
    }
    pl_plan_dispose(&p);
}
