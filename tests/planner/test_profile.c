#include <criterion/criterion.h>
#include <pl_profile.h>
#include <sq.h>

Test(profile, linear_latency_is_alpha_b_plus_beta)
{
    pl_profile_t p;
    pl_profile_init_linear(&p, 1053, 5072, 64);
    cr_assert_float_eq(pl_latency_us(&p, 16, 0), 1053 * 16 + 5072, 1e-9);
    cr_assert_eq(pl_latency_us(&p, 0, 0), -1);
    cr_assert_eq(pl_latency_us(&p, 65, 0), -1);
    pl_profile_dispose(&p);
}

Test(profile, tables_round_up_and_add_k_std)
{
    pl_profile_row_t rows[] = {{16, 100000, 2000}, {4, 50000, 1000}, {8, 75000, 1500}};
    pl_profile_t p;
    cr_assert_eq(pl_profile_init_table(&p, rows, 3), 0);
    cr_assert_eq(p.max_batch, 16);
    cr_assert_float_eq(pl_latency_us(&p, 8, 0), 75000, 1e-9);
    cr_assert_float_eq(pl_latency_us(&p, 5, 0), 75000, 1e-9, "5 runs as 8");
    cr_assert_float_eq(pl_latency_us(&p, 1, 2), 52000, 1e-9);
    cr_assert_eq(pl_latency_us(&p, 17, 0), -1);
    pl_profile_t q;
    pl_profile_copy(&q, &p);
    pl_profile_dispose(&p);
    cr_assert_float_eq(pl_latency_us(&q, 16, 1), 102000, 1e-9);
    pl_profile_dispose(&q);
}

Test(profile, bad_tables_are_rejected)
{
    pl_profile_t p;
    pl_profile_row_t dup[] = {{4, 1, 0}, {4, 2, 0}};
    cr_assert_eq(pl_profile_init_table(&p, dup, 2), SQ_INVAL);
    pl_profile_row_t zero[] = {{0, 1, 0}};
    cr_assert_eq(pl_profile_init_table(&p, zero, 1), SQ_INVAL);
    pl_profile_row_t neg[] = {{2, -1, 0}};
    cr_assert_eq(pl_profile_init_table(&p, neg, 1), SQ_INVAL);
    cr_assert_eq(pl_profile_init_table(&p, NULL, 0), SQ_INVAL);
}
