#include <criterion/criterion.h>
#include <pl.h>
#include <sq.h>

#define MS 1000.0

Test(prefix, group_latency_is_prefix_plus_suffix_shares)
{
    pl_profile_t prefix, s1, s2, g;
    pl_profile_init_linear(&prefix, 2 * MS, 10 * MS, 32);
    pl_profile_init_linear(&s1, 1 * MS, 1 * MS, 32);
    pl_profile_row_t rows[] = {{2, 3 * MS, 0.5 * MS}, {8, 6 * MS, 1 * MS}};
    cr_assert_eq(pl_profile_init_table(&s2, rows, 2), 0);
    prefix.memory_bytes = 100e6;
    prefix.memory_per_item_bytes = 4e6;
    s1.memory_bytes = 10e6;
    s1.memory_per_item_bytes = 1e6;
    s2.memory_bytes = 20e6;
    const pl_profile_t *suffixes[] = {&s1, &s2};
    double rates[] = {30, 10};
    cr_assert_eq(pl_prefix_profile(&g, &prefix, suffixes, rates, 2), 0);
    /* b = 8: prefix 26 ms; s1 gets ceil(6) = 6 rows, 7 ms; s2 ceil(2) = 2, 3 ms */
    cr_assert_float_eq(pl_latency_us(&g, 8, 0), 36 * MS, 1e-6);
    cr_assert_float_eq(pl_latency_us(&g, 8, 2), 37 * MS, 1e-6, "std adds: 0.5 ms from s2");
    /* b = 1: both suffixes get one row (ceil of a share > 0) */
    cr_assert_float_eq(pl_latency_us(&g, 1, 0), (12 + 2 + 3) * MS, 1e-6);
    /* s2 runs at most 8: its share of b stays within 8 up to b = 32 */
    cr_assert_eq(g.max_batch, 32);
    cr_assert_float_eq(g.memory_bytes, 130e6, 1);
    cr_assert_float_eq(g.memory_per_item_bytes, 4e6 + 0.75e6, 1);
    pl_profile_dispose(&g);

    /* one suffix capped at 8 rows alone: the group stops at b = 8 */
    double solo[] = {0, 5};
    cr_assert_eq(pl_prefix_profile(&g, &prefix, suffixes, solo, 2), 0);
    cr_assert_eq(g.max_batch, 8);
    cr_assert_float_eq(pl_latency_us(&g, 4, 0), 18 * MS + 6 * MS, 1e-6, "s1 idle costs 0");
    pl_profile_dispose(&g);

    double neg[] = {-1, 5};
    cr_assert_eq(pl_prefix_profile(&g, &prefix, suffixes, neg, 2), SQ_INVAL);
    cr_assert_eq(pl_prefix_profile(&g, &prefix, suffixes, rates, 0), SQ_INVAL);
    pl_profile_dispose(&prefix);
    pl_profile_dispose(&s1);
    pl_profile_dispose(&s2);
}

Test(prefix, group_shares_one_device_cheaper_than_apart)
{
    /* Two variants at 40 req/s each: batched on the shared prefix they need
     * less device time than two separate sessions. */
    pl_profile_t prefix, s1, s2, whole, g;
    pl_profile_init_linear(&prefix, 1.5 * MS, 8 * MS, 64);
    pl_profile_init_linear(&s1, 0.1 * MS, 1 * MS, 64);
    pl_profile_init_linear(&s2, 0.1 * MS, 1 * MS, 64);
    pl_profile_init_linear(&whole, 1.6 * MS, 9 * MS, 64);
    const pl_profile_t *suffixes[] = {&s1, &s2};
    double rates[] = {40, 40};
    cr_assert_eq(pl_prefix_profile(&g, &prefix, suffixes, rates, 2), 0);
    pl_session_t apart[] = {
        {.id = 1, .model = 0, .profile = &whole, .slo_us = 50 * MS, .rate_rps = 40},
        {.id = 2, .model = 1, .profile = &whole, .slo_us = 50 * MS, .rate_rps = 40}};
    pl_session_t together[] = {
        {.id = 1, .model = 0, .profile = &g, .slo_us = 50 * MS, .rate_rps = 80}};
    pl_options_t o = {0};
    pl_plan_t pa, pt;
    cr_assert_eq(pl_plan(&pa, apart, 2, NULL, &o), 0);
    cr_assert_eq(pl_plan(&pt, together, 1, NULL, &o), 0);
    cr_assert_eq(pa.ndevices, 1);
    cr_assert_eq(pt.ndevices, 1);
    cr_assert_lt(pt.devices[0].occupancy, pa.devices[0].occupancy);
    pl_plan_dispose(&pa);
    pl_plan_dispose(&pt);
    pl_profile_dispose(&g);
    pl_profile_dispose(&prefix);
    pl_profile_dispose(&s1);
    pl_profile_dispose(&s2);
    pl_profile_dispose(&whole);
}
