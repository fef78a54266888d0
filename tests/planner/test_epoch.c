#include <criterion/criterion.h>
#include <math.h>
#include <pl.h>

Test(epoch, periodic_and_rate_change_triggers)
{
    pl_epoch_config_t c;
    pl_epoch_config_default(&c);
    double planned[] = {100, 50, 0};
    double rate[] = {100, 50, 0};
    cr_assert_eq(pl_epoch_due(&c, 29999, 0, rate, planned, 3), PL_EPOCH_NONE);
    cr_assert_eq(pl_epoch_due(&c, 30000, 0, rate, planned, 3), PL_EPOCH_PERIODIC);
    rate[1] = 56; /* 1.12 x planned */
    cr_assert_eq(pl_epoch_due(&c, 9999, 0, rate, planned, 3), PL_EPOCH_NONE, "not within 10 s");
    cr_assert_eq(pl_epoch_due(&c, 10000, 0, rate, planned, 3), PL_EPOCH_RATE_CHANGE);
    rate[1] = 54; /* within [0.8, 1.1] */
    cr_assert_eq(pl_epoch_due(&c, 15000, 0, rate, planned, 3), PL_EPOCH_NONE);
    rate[0] = 79;
    cr_assert_eq(pl_epoch_due(&c, 15000, 0, rate, planned, 3), PL_EPOCH_RATE_CHANGE);
    rate[0] = 100;
    rate[2] = 0.5; /* traffic for a session the plan does not serve */
    cr_assert_eq(pl_epoch_due(&c, 15000, 0, rate, planned, 3), PL_EPOCH_RATE_CHANGE);
}

Test(epoch, ewma_weighs_by_elapsed_time)
{
    /* one tau of constant 100 req/s from 0 reaches 1 - 1/e of it, in one
     * step or in ten */
    double one = pl_rate_ewma(0, 1000, 10000, 10000);
    double ten = 0;
    for (int i = 0; i < 10; i++)
        ten = pl_rate_ewma(ten, 100, 1000, 10000);
    cr_assert_float_eq(one, 100 * (1 - exp(-1)), 1e-9);
    cr_assert_float_eq(ten, one, 1e-9);
    cr_assert_float_eq(pl_rate_ewma(42, 5, 0, 10000), 42, 1e-12, "no time, no change");
}

Test(epoch, capacity_is_batch_over_duty_cycle)
{
    pl_profile_t p;
    pl_profile_init_linear(&p, 1000, 5000, 64);
    pl_session_t s[] = {{.id = 7, .profile = &p, .slo_us = 100000, .rate_rps = 1000},
                        {.id = 8, .model = 1, .profile = &p, .slo_us = 100000, .rate_rps = 0}};
    pl_options_t o = {0};
    pl_plan_t plan;
    cr_assert_eq(pl_plan(&plan, s, 2, NULL, &o), 0);
    double cap = pl_plan_capacity_rps(&plan, 7);
    cr_assert_geq(cap, 1000 * (1 - 1e-9));
    cr_assert_lt(cap, 1000 * 1.1, "about what was asked, not a device more");
    cr_assert_gt(pl_plan_capacity_rps(&plan, 8), 0, "placed with no traffic");
    cr_assert_eq(pl_plan_capacity_rps(&plan, 9), 0);
    pl_plan_dispose(&plan);
    pl_profile_dispose(&p);
}
