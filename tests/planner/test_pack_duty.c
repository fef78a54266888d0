/* Duty-cycle sessions (planner/pack.c): the reasons a cycle gives and the
 * devices it takes. */
#include "pack_test.h"

/* Unplaced sessions say what blocks them: a detector stage at a tight
 * budget and a classifier, one device, 1 req/s each. */
static pl_profile_t det_prof, cls_prof;

static void duty_setup(void)
{
    pl_profile_init_linear(&det_prof, 0.5 * MS, 4 * MS, 16); /* l(1) = 4.5 ms */
    pl_profile_init_linear(&cls_prof, 5 * MS, 10 * MS, 16);  /* l(1) = 15 ms */
}

static void duty_teardown(void)
{
    pl_profile_dispose(&det_prof);
    pl_profile_dispose(&cls_prof);
}

static void duty_sessions(pl_session_t s[2], double det_slo_ms)
{
    s[0] = (pl_session_t){.id = 1,
                          .model = 0,
                          .name = "det",
                          .profile = &det_prof,
                          .slo_us = det_slo_ms * MS,
                          .rate_rps = 1};
    s[1] = (pl_session_t){
        .id = 2, .model = 1, .name = "cls", .profile = &cls_prof, .slo_us = 50 * MS, .rate_rps = 1};
}

Test(pack, a_cycle_too_short_to_share_is_duty_cycle_naming_its_blocker, .init = duty_setup,
     .fini = duty_teardown)
{
    /* det at 14.5 ms runs a 10 ms cycle (occupancy 0.45), cls alone a
     * 35 ms one (0.43): the device has the time for both, but cls's 15 ms
     * batch does not fit det's 10 ms cycle. */
    pl_session_t s[2];
    duty_sessions(s, 14.5);
    pl_options_t opt = {.max_devices = 1};
    pl_plan_t p;
    cr_assert_eq(pl_plan(&p, s, 2, NULL, &opt), 0);
    cr_assert_eq(p.ndevices, 1);
    cr_assert_eq(p.nunplaced, 1);
    const pl_unplaced_t *u = &p.unplaced[0];
    cr_assert_eq(u->session_id, 2);
    cr_assert_eq(u->reason, PL_UNPLACED_DUTY_CYCLE);
    cr_assert_str_eq(pl_unplaced_code(u->reason), "duty_cycle");
    cr_assert_eq(u->device_id, p.devices[0].id);
    cr_assert_eq(u->blocker_session_id, 1);
    cr_assert_float_eq(u->need_us, 15 * MS, 1e-6);
    cr_assert_float_eq(u->cycle_us, 10 * MS, 1e-6);
    cr_assert_float_eq(u->reserved_us, 4.5 * MS, 1e-6);
    /* A 19.5 ms cycle holds both batches; det then needs 19.5 + 4.5. */
    cr_assert_float_eq(u->slo_needed_us, 24 * MS, 1e-6);
    char w[512];
    pl_unplaced_words(w, sizeof(w), u, s[1].slo_us, p.ndevices, "cpu:0", "det");
    cr_assert_str_eq(w, "needs 15 ms of a duty cycle, but cpu:0's cycle is at most 10 ms for det "
                        "(SLO 14.5 ms) and its sessions take 4.5 ms of it: ask for an SLO of 24 "
                        "ms or more for det, or add a device");
    pl_plan_dispose(&p);

    /* Its advice holds: at det's SLO of 24 ms both share the device. */
    duty_sessions(s, 24);
    cr_assert_eq(pl_plan(&p, s, 2, NULL, &opt), 0);
    cr_assert_eq(p.nunplaced, 0);
    cr_assert_eq(p.ndevices, 1);
    pl_plan_dispose(&p);
}

Test(pack, its_own_slo_setting_the_cycle_names_the_slo_to_ask, .init = duty_setup,
     .fini = duty_teardown)
{
    /* det at 15.5 ms wants an 11 ms cycle (0.41 of it), cls keeps the
     * device (a 35 ms cycle, 0.43): det's 4.5 ms fit a cycle of 19.5 ms
     * beside cls's 15, so det needs 19.5 + 4.5 = 24 ms. */
    pl_session_t s[2];
    duty_sessions(s, 15.5);
    pl_options_t opt = {.max_devices = 1};
    pl_plan_t p;
    cr_assert_eq(pl_plan(&p, s, 2, NULL, &opt), 0);
    cr_assert_eq(p.nunplaced, 1);
    const pl_unplaced_t *u = &p.unplaced[0];
    cr_assert_eq(u->session_id, 1);
    cr_assert_eq(u->reason, PL_UNPLACED_DUTY_CYCLE);
    cr_assert_eq(u->blocker_session_id, 1);
    cr_assert_float_eq(u->slo_needed_us, 24 * MS, 1e-6);
    char w[512];
    pl_unplaced_words(w, sizeof(w), u, s[0].slo_us, p.ndevices, "cpu:0", "det");
    cr_assert_str_eq(w, "needs 4.5 ms of a duty cycle beside the 15 ms the sessions on cpu:0 "
                        "take, but its SLO of 15.5 ms allows a cycle of 11 ms: ask for an SLO of "
                        "24 ms or more, or add a device");
    pl_plan_dispose(&p);
    duty_sessions(s, 24);
    cr_assert_eq(pl_plan(&p, s, 2, NULL, &opt), 0);
    cr_assert_eq(p.nunplaced, 0);
    pl_plan_dispose(&p);
}

/* Unplaced for its cycle, the session still gets the planned device's
 * overflow, as one short of devices does. */
Test(pack, a_duty_cycle_session_takes_the_planned_devices_overflow, .init = duty_setup,
     .fini = duty_teardown)
{
    pl_session_t s[2];
    duty_sessions(s, 14.5);
    pl_options_t opt = {.max_devices = 1, .overflow = 1};
    pl_plan_t p;
    cr_assert_eq(pl_plan(&p, s, 2, NULL, &opt), 0);
    cr_assert_eq(p.nunplaced, 1);
    cr_assert_eq(p.unplaced[0].reason, PL_UNPLACED_DUTY_CYCLE);
    cr_assert_eq(p.noverflow, 1);
    cr_assert_eq(p.overflow[0].session_id, 2);
    cr_assert_eq(p.overflow[0].device_id, p.devices[0].id);
    pl_plan_dispose(&p);
}

Test(pack, full_cycles_are_devices_and_say_how_full, .init = duty_setup, .fini = duty_teardown)
{
    /* Two sessions of one model at 70% of a device each: no device has
     * the time. */
    pl_session_t s[2];
    duty_sessions(s, 14.5);
    s[0].profile = s[1].profile = &cls_prof;
    s[0].model = s[1].model = 1;
    s[0].slo_us = s[1].slo_us = 36.5 * MS; /* 21.5 ms cycles of 15 ms: 0.7 */
    pl_options_t opt = {.max_devices = 1};
    pl_plan_t p;
    cr_assert_eq(pl_plan(&p, s, 2, NULL, &opt), 0);
    cr_assert_eq(p.nunplaced, 1);
    const pl_unplaced_t *u = &p.unplaced[0];
    cr_assert_eq(u->reason, PL_UNPLACED_DEVICES);
    cr_assert_eq(u->device_id, p.devices[0].id);
    cr_assert_float_eq(u->reserved_us, 15 * MS, 1e-6);
    char w[512];
    pl_unplaced_words(w, sizeof(w), u, u->session_id == 1 ? s[0].slo_us : s[1].slo_us, p.ndevices,
                      "cpu:0", "cls");
    cr_assert_str_eq(w, "all 1 devices are in use: the least busy, cpu:0, has 15 ms of its 21.5 ms "
                        "duty cycle taken and it needs 15 ms: add a device");
    pl_plan_dispose(&p);
}
