#include <criterion/criterion.h>
#include <math.h>
#include <pl.h>
#include <pl_loop.h>
#include <sq.h>

#define MS 1000.0

static double cost_or_inf(const pl_profile_t *p, double budget_us, double rate)
{
    double c = pl_stage_cost(p, budget_us, rate, 0);
    return c < 0 ? INFINITY : c;
}

Test(query, stage_cost_is_rate_over_saturated_throughput)
{
    pl_profile_t p;
    pl_profile_init_linear(&p, 1 * MS, 10 * MS, 64);
    /* budget 60 ms: 2 (b + 10) <= 60 -> b = 20, 20 / 30 ms = 666.7 req/s */
    cr_assert_float_eq(pl_stage_cost(&p, 60 * MS, 1000, 0), 1000 / (20 / 0.030), 1e-9);
    cr_assert_eq(pl_stage_cost(&p, 21 * MS, 1000, 0), -1, "2 l(1) = 22 ms > 21");
    pl_profile_dispose(&p);
}

Test(query, two_stage_split_matches_brute_force)
{
    pl_profile_t det, rec;
    pl_profile_init_linear(&det, 2.0 * MS, 15 * MS, 64);
    pl_profile_row_t rows[] = {{1, 6 * MS, 0}, {4, 12 * MS, 0}, {16, 30 * MS, 0}, {32, 50 * MS, 0}};
    cr_assert_eq(pl_profile_init_table(&rec, rows, 4), 0);
    int parents[] = {0};
    double gamma[] = {3.0};
    pl_stage_t st[] = {{.profile = &det},
                       {.profile = &rec, .nparents = 1, .parents = parents, .gamma = gamma}};
    for (double slo = 60; slo <= 200; slo += 35) {
        pl_query_result_t r;
        cr_assert_eq(pl_query_split(&r, st, 2, slo * MS, 200, 1 * MS, 0), 0);
        cr_assert_float_eq(r.rate_rps[1], 600, 1e-9);
        double brute = INFINITY;
        for (int t1 = 0; t1 <= (int)slo; t1++) {
            double c = cost_or_inf(&det, t1 * MS, 200) + cost_or_inf(&rec, (slo - t1) * MS, 600);
            if (c < brute)
                brute = c;
        }
        cr_assert(isfinite(brute));
        cr_assert_float_eq(r.cost_devices, brute, 1e-9, "slo %g", slo);
        cr_assert_leq(r.budget_us[0] + r.budget_us[1], slo * MS + 1e-6);
        cr_assert_float_eq(cost_or_inf(&det, r.budget_us[0], 200) +
                               cost_or_inf(&rec, r.budget_us[1], 600),
                           r.cost_devices, 1e-9, "the budgets give the reported cost");
        pl_query_result_dispose(&r);
    }
    pl_profile_dispose(&det);
    pl_profile_dispose(&rec);
}

Test(query, fork_join_split_matches_brute_force)
{
    /* a -> {b, c} -> d: b and c run side by side, each path a-b-d and a-c-d
     * must fit. d's rate is its busier input: max(2 * 1, 0.5 * 4) R = 2 R. */
    pl_profile_t pa, pb, pc, pd;
    pl_profile_init_linear(&pa, 1.0 * MS, 5 * MS, 32);
    pl_profile_init_linear(&pb, 3.0 * MS, 4 * MS, 32);
    pl_profile_init_linear(&pc, 0.5 * MS, 12 * MS, 32);
    pl_profile_init_linear(&pd, 1.5 * MS, 3 * MS, 32);
    int pb_par[] = {0}, pc_par[] = {0}, pd_par[] = {1, 2};
    double gb[] = {2}, gc[] = {0.5}, gd[] = {1, 4};
    pl_stage_t st[] = {{.profile = &pa},
                       {.profile = &pb, .nparents = 1, .parents = pb_par, .gamma = gb},
                       {.profile = &pc, .nparents = 1, .parents = pc_par, .gamma = gc},
                       {.profile = &pd, .nparents = 2, .parents = pd_par, .gamma = gd}};
    enum { T = 90 };
    const double R = 300;
    pl_query_result_t r;
    cr_assert_eq(pl_query_split(&r, st, 4, T * MS, R, 1 * MS, 0), 0);
    cr_assert_float_eq(r.rate_rps[3], 2 * R, 1e-9);
    double ca[T + 1], cb[T + 1], cc[T + 1], cd[T + 1];
    for (int t = 0; t <= T; t++) {
        ca[t] = cost_or_inf(&pa, t * MS, R);
        cb[t] = cost_or_inf(&pb, t * MS, 2 * R);
        cc[t] = cost_or_inf(&pc, t * MS, 0.5 * R);
        cd[t] = cost_or_inf(&pd, t * MS, 2 * R);
    }
    double brute = INFINITY;
    for (int ta = 0; ta <= T; ta++)
        for (int tb = 0; ta + tb <= T; tb++)
            for (int tc = 0; ta + tc <= T; tc++) {
                int td = T - ta - (tb > tc ? tb : tc);
                double c = ca[ta] + cb[tb] + cc[tc] + cd[td];
                if (c < brute)
                    brute = c;
            }
    cr_assert(isfinite(brute));
    cr_assert_float_eq(r.cost_devices, brute, 1e-9);
    double mid = r.budget_us[1] > r.budget_us[2] ? r.budget_us[1] : r.budget_us[2];
    cr_assert_leq(r.budget_us[0] + mid + r.budget_us[3], T * MS + 1e-6, "every path fits");
    pl_query_result_dispose(&r);
    pl_profile_dispose(&pa);
    pl_profile_dispose(&pb);
    pl_profile_dispose(&pc);
    pl_profile_dispose(&pd);
}

Test(query, bad_pipelines_are_refused)
{
    pl_profile_t p;
    pl_profile_init_linear(&p, 1 * MS, 5 * MS, 32);
    pl_query_result_t r;
    /* The N shape: a -> c, b -> c, b -> d is not series-parallel. */
    int c_par[] = {0, 1}, d_par[] = {1};
    pl_stage_t n[] = {{.profile = &p},
                      {.profile = &p},
                      {.profile = &p, .nparents = 2, .parents = c_par},
                      {.profile = &p, .nparents = 1, .parents = d_par}};
    cr_assert_eq(pl_query_split(&r, n, 4, 100 * MS, 10, 1 * MS, 0), SQ_INVAL);
    /* a parent that is not earlier (a cycle, or an unordered list) */
    int self[] = {1};
    pl_stage_t cyc[] = {{.profile = &p}, {.profile = &p, .nparents = 1, .parents = self}};
    cr_assert_eq(pl_query_split(&r, cyc, 2, 100 * MS, 10, 1 * MS, 0), SQ_INVAL);
    cr_assert_eq(pl_query_split(&r, n, 1, 100 * MS, 10, 0, 0), SQ_INVAL);
    /* 2 l(1) = 12 ms per stage: three in a row need 36 ms */
    int prev1[] = {0}, prev2[] = {1};
    pl_stage_t chain[] = {{.profile = &p},
                          {.profile = &p, .nparents = 1, .parents = prev1},
                          {.profile = &p, .nparents = 1, .parents = prev2}};
    cr_assert_eq(pl_query_split(&r, chain, 3, 35 * MS, 10, 1 * MS, 0), SQ_DEADLINE);
    cr_assert_eq(pl_query_split(&r, chain, 3, 36 * MS, 10, 1 * MS, 0), 0);
    for (int v = 0; v < 3; v++)
        cr_assert_float_eq(r.budget_us[v], 12 * MS, 1e-6);
    pl_query_result_dispose(&r);
    pl_query_result_dispose(NULL);
    pl_profile_dispose(&p);
}

Test(query, even_split_gives_equal_shares_of_the_longest_path)
{
    /* a -> b -> d and a -> c (a leaf): the longest path through a, b and d
     * has 3 stages (SLO / 3 each), through c 2 (SLO / 2). */
    pl_profile_t p;
    pl_profile_init_linear(&p, 1 * MS, 5 * MS, 32);
    int pa[] = {0}, pb[] = {1};
    double g4[] = {4};
    pl_stage_t st[] = {{.profile = &p},
                       {.profile = &p, .nparents = 1, .parents = pa},
                       {.profile = &p, .nparents = 1, .parents = pa, .gamma = g4},
                       {.profile = &p, .nparents = 1, .parents = pb}};
    pl_query_result_t r;
    cr_assert_eq(pl_query_split_even(&r, st, 4, 90 * MS, 10, 0), 0);
    cr_assert_float_eq(r.budget_us[0], 30 * MS, 1e-6);
    cr_assert_float_eq(r.budget_us[1], 30 * MS, 1e-6);
    cr_assert_float_eq(r.budget_us[2], 45 * MS, 1e-6);
    cr_assert_float_eq(r.budget_us[3], 30 * MS, 1e-6);
    cr_assert_float_eq(r.rate_rps[2], 40, 1e-9);
    double cost = 0;
    for (int v = 0; v < 4; v++)
        cost += pl_stage_cost(&p, r.budget_us[v], r.rate_rps[v], 0);
    cr_assert_float_eq(r.cost_devices, cost, 1e-12);
    pl_query_result_dispose(&r);
    /* The DP never costs more than the even split (it may pick it). */
    pl_query_result_t dp;
    cr_assert_eq(pl_query_split(&dp, st, 4, 90 * MS, 10, 1 * MS, 0), 0);
    cr_assert_eq(pl_query_split_even(&r, st, 4, 90 * MS, 10, 0), 0);
    cr_assert_leq(dp.cost_devices, r.cost_devices + 1e-12);
    pl_query_result_dispose(&dp);
    pl_query_result_dispose(&r);
    /* 2 l(1) = 12 ms: three stages in a row at 35 ms get 11.7 ms each. */
    cr_assert_eq(pl_query_split_even(&r, st, 4, 35 * MS, 10, 0), SQ_DEADLINE);
    cr_assert_eq(r.budget_us, NULL);
    int self[] = {1};
    pl_stage_t cyc[] = {{.profile = &p}, {.profile = &p, .nparents = 1, .parents = self}};
    cr_assert_eq(pl_query_split_even(&r, cyc, 2, 100 * MS, 10, 0), SQ_INVAL);
    pl_profile_dispose(&p);
}

Test(query, a_stage_on_crops_gets_the_dispersion_of_a_parent_batch_of_crops)
{
    /* Poisson(gamma) crops per item, a parent batch of b: S ~ Poisson(b
     * gamma), E[S^2] / E[S] = 1 + b gamma. */
    cr_assert_float_eq(pl_clump_dispersion(1, 1, 8), 9, 1e-12);
    cr_assert_float_eq(pl_clump_dispersion(10, 10, 3), 31, 1e-12);
    /* Exactly 2 crops per item, batches of 1: clumps of exactly 2. */
    cr_assert_float_eq(pl_clump_dispersion(2, 0, 1), 2, 1e-12);
    /* No crops, or no batch: Poisson. */
    cr_assert_float_eq(pl_clump_dispersion(0, 0, 8), 1, 1e-12);
    cr_assert_float_eq(pl_clump_dispersion(0.1, 0.1, 0), 1, 1e-12);
}

Test(query, slack_goes_where_the_load_is_and_every_path_fits)
{
    /* Two small models under a long SLO: the DP's least budgets leave most
     * of it. A detector x feeding two stages y (gamma 8) and z (gamma 1). */
    pl_profile_t x, y, z;
    pl_profile_init_linear(&x, 1 * MS, 2 * MS, 64);
    pl_profile_init_linear(&y, 0.5 * MS, 1 * MS, 64);
    pl_profile_init_linear(&z, 0.5 * MS, 1 * MS, 64);
    int parents[] = {0};
    double g8[] = {8.0}, g1[] = {1.0};
    pl_stage_t st[] = {{.profile = &x},
                       {.profile = &y, .nparents = 1, .parents = parents, .gamma = g8},
                       {.profile = &z, .nparents = 1, .parents = parents, .gamma = g1}};
    pl_query_result_t r;
    cr_assert_eq(pl_query_split(&r, st, 3, 400 * MS, 50, 1 * MS, 0), 0);
    double dp[3] = {r.budget_us[0], r.budget_us[1], r.budget_us[2]};
    cr_assert_lt(dp[0] + dp[1], 400 * MS - 10 * MS, "the DP leaves slack: %g + %g", dp[0], dp[1]);
    cr_assert_eq(pl_query_share_slack(&r, st, 3, 400 * MS, 0), 0);
    for (int v = 0; v < 3; v++)
        cr_assert_geq(r.budget_us[v], dp[v], "stage %d only gains", v);
    /* Path x-y (the busier) fills the SLO; x-z fits within it. */
    cr_assert_float_eq(r.budget_us[0] + r.budget_us[1], 400 * MS, 1e-6);
    cr_assert_leq(r.budget_us[0] + r.budget_us[2], 400 * MS + 1e-6);
    /* y carries 8 times the rate of z at the same l(1): its share of the
     * slack is larger, and larger than x's (rate 50 x l(1) 3 ms against
     * 400 x 1.5 ms). */
    cr_assert_gt(r.budget_us[1], r.budget_us[2]);
    cr_assert_gt(r.budget_us[1] - dp[1], r.budget_us[0] - dp[0]);
    /* Batches and cost are the new budgets'. */
    double c = 0;
    for (int v = 0; v < 3; v++)
        c += pl_stage_cost(st[v].profile, r.budget_us[v], r.rate_rps[v], 0);
    cr_assert_float_eq(r.cost_devices, c, 1e-9);
    pl_query_result_dispose(&r);
    pl_profile_dispose(&x);
    pl_profile_dispose(&y);
    pl_profile_dispose(&z);
}

Test(query, every_budget_holds_its_overhead_and_a_batch)
{
    /* The live case that dropped every query: a light detector (l(1) 0.12
     * ms, max batch 15) feeding a classifier 30 times slower at gamma 8.
     * On paper the detector's cheapest budget is 2 l(15), a third of a ms,
     * and its share of the slack (rate x l(1)) a few ms; live, every batch
     * also pays the dispatch margin and the frame's decode first. */
    pl_profile_t det, cls;
    pl_profile_init_linear(&det, 0.003 * MS, 0.115 * MS, 15);
    pl_profile_init_linear(&cls, 0.9 * MS, 1.5 * MS, 15);
    int parents[] = {0};
    double g8[] = {8.0};
    pl_stage_t st[] = {{.profile = &det},
                       {.profile = &cls, .nparents = 1, .parents = parents, .gamma = g8}};
    pl_query_result_t r;
    cr_assert_eq(pl_query_split(&r, st, 2, 400 * MS, 3, 0.4 * MS, 0), 0);
    cr_assert_eq(pl_query_share_slack(&r, st, 2, 400 * MS, 0), 0);
    cr_assert_lt(r.budget_us[0], 3 * MS, "without overheads the detector gets %g us",
                 r.budget_us[0]);
    pl_query_result_dispose(&r);

    const double overhead = 3 * MS; /* a 2 ms margin and a 1 ms decode */
    st[0].overhead_us = st[1].overhead_us = overhead;
    cr_assert_eq(pl_query_split(&r, st, 2, 400 * MS, 3, 0.4 * MS, 0), 0);
    cr_assert_eq(pl_query_share_slack(&r, st, 2, 400 * MS, 0), 0);
    for (int v = 0; v < 2; v++) {
        double l1 = pl_latency_us(st[v].profile, 1, 0);
        cr_assert_geq(r.budget_us[v], overhead + 2 * l1, "stage %d: %g us", v, r.budget_us[v]);
        cr_assert_geq(r.batch[v], 1);
        cr_assert_float_eq(
            pl_stage_cost_in(&st[v], r.budget_us[v], r.rate_rps[v], 0),
            pl_stage_cost(st[v].profile, r.budget_us[v] - overhead, r.rate_rps[v], 0), 1e-12);
    }
    cr_assert_float_eq(r.budget_us[0] + r.budget_us[1], 400 * MS, 1e-6);
    pl_query_result_dispose(&r);
    /* A budget no larger than the overhead holds no batch. */
    cr_assert_eq(pl_stage_cost_in(&st[0], overhead, 1, 0), -1);
    /* The even split plans its shares less the overheads too. */
    cr_assert_eq(pl_query_split_even(&r, st, 2, 400 * MS, 3, 0), 0);
    cr_assert_eq(r.batch[1], 15);
    pl_query_result_dispose(&r);
    cr_assert_eq(pl_query_split_even(&r, st, 2, 2 * overhead, 3, 0), SQ_DEADLINE);
    pl_profile_dispose(&det);
    pl_profile_dispose(&cls);
}

/* The README's pipeline on a 2-core box (a face detector, l(1) 6 ms, then
 * a classifier of each face, l(1) 30 ms; SLO 300 ms; a 2 ms margin and a
 * 4 ms decode before each batch). Live, the split gave the detector 6-11
 * ms: a frame slower to decode than the mean, or a busy neighbour, and
 * every query of it was refused. At 1 query a second any split runs on
 * the one device the cheapest needs: each stage gets its floor (overhead
 * and 2 l(1)) and an equal share of the rest. At 150 queries a second the
 * split keeps to the allowance, and never goes under a floor. */
Test(query, at_low_load_every_stage_gets_its_floor_and_an_equal_share_of_the_slack)
{
    pl_profile_t det, cls;
    pl_profile_init_linear(&det, 0.4 * MS, 5.6 * MS, 16);
    pl_profile_init_linear(&cls, 2.5 * MS, 27.5 * MS, 16);
    int parents[] = {0};
    double g[] = {1.5};
    pl_stage_t st[] = {
        {.profile = &det, .overhead_us = 6 * MS},
        {.profile = &cls, .nparents = 1, .parents = parents, .gamma = g, .overhead_us = 6 * MS}};
    double floor[2];
    for (int v = 0; v < 2; v++)
        floor[v] = 6 * MS + 2 * pl_latency_us(st[v].profile, 1, 0);
    double rates[] = {1, 150};
    for (int i = 0; i < 2; i++) {
        pl_query_result_t r;
        cr_assert_eq(pl_query_split(&r, st, 2, 300 * MS, rates[i], 1 * MS, 0), 0);
        cr_assert_eq(pl_query_share_slack(&r, st, 2, 300 * MS, 0), 0);
        double cheapest = r.cost_devices, was_det = r.budget_us[0];
        double allowance = pl_loop_split_allowance(cheapest);
        cr_assert_eq(pl_query_most_slack(&r, st, 2, 300 * MS, 0, allowance), 0);
        cr_assert_leq(r.cost_devices, allowance + 1e-9, "rate %g", rates[i]);
        cr_assert_leq(r.budget_us[0] + r.budget_us[1], 300 * MS + 1e-6);
        for (int v = 0; v < 2; v++)
            cr_assert_geq(r.budget_us[v], floor[v] - 1e-6, "rate %g stage %d: %g us", rates[i], v,
                          r.budget_us[v]);
        if (i == 0) {
            double s = (300 * MS - floor[0] - floor[1]) / 2;
            cr_assert_gt(r.budget_us[0], was_det + 50 * MS, "the detector had %g us", was_det);
            cr_assert_float_eq(r.budget_us[0], floor[0] + s, 1e-6, "%g us", r.budget_us[0]);
            cr_assert_float_eq(r.budget_us[1], floor[1] + s, 1e-6);
        }
        pl_query_result_dispose(&r);
    }
    pl_profile_dispose(&det);
    pl_profile_dispose(&cls);
}
