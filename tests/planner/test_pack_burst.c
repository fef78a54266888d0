/* Batch sizes for bursts (planner/pack.c): the Poisson burst quantile and
 * the headroom of clumped arrivals. */
#include "pack_test.h"

/* P(N <= b), N ~ Poisson(lambda): the test's own sum, not pack.c's. */
static double poisson_cdf_test(int b, double lambda)
{
    double term = exp(-lambda), sum = term;
    for (int k = 1; k <= b; k++) {
        term *= lambda / k;
        sum += term;
    }
    return sum;
}

/* Burst headroom from the arrival variance (pl_options_t.burst_quantile):
 * a small session's batch covers the 99% quantile of the Poisson count in
 * its duty cycle, more than the fluid ceil(r d); a session that fills
 * devices is sized pooled over them and its SLO, q(r L) / L, which costs
 * less than a fixed 1.25 at high rates and more at low ones. */
Test(pack, burst_quantile_sizes_batches_for_poisson_counts)
{
    pl_profile_t lin;
    pl_profile_init_linear(&lin, 1 * MS, 5 * MS, 64);
    pl_session_t s = {.id = 1, .model = 0, .name = "m", .profile = &lin, .slo_us = 50 * MS};
    pl_options_t fluid = {0}, burst = {.burst_quantile = 0.99};
    for (double rate = 20; rate <= 400; rate *= 1.5) {
        s.rate_rps = rate;
        pl_plan_t pf, pb;
        cr_assert_eq(pl_plan(&pf, &s, 1, NULL, &fluid), 0);
        cr_assert_eq(pl_plan(&pb, &s, 1, NULL, &burst), 0);
        cr_assert_eq(pb.ndevices, 1, "rate %.0f", rate);
        const pl_device_t *d = &pb.devices[0];
        const pl_alloc_t *a = &d->allocs[0];
        double lambda = rate * d->duty_cycle_us * 1e-6;
        cr_assert_geq(poisson_cdf_test(a->batch, lambda), 0.99, "rate %.0f: batch %d, mean %.2f",
                      rate, a->batch, lambda);
        cr_assert_gt(a->batch, (int)ceil(lambda), "rate %.0f: more than the mean count", rate);
        cr_assert_leq(d->duty_cycle_us + a->latency_us, s.slo_us + 1e-6);
        cr_assert_gt(d->occupancy, pf.devices[0].occupancy, "rate %.0f", rate);
        pl_plan_dispose(&pf);
        pl_plan_dispose(&pb);
    }
    /* Saturation batch 20 (2 l(20) = 50 ms), 800 req/s a device. 4000
     * req/s: fluid 5 devices; pooled over the 50 ms SLO, the 99% quantile
     * of the count (mean 200) is 234, so 4680 req/s: 6 devices (5
     * saturated and a residue); a quantile per device and cycle (mean
     * ~11.6 for a batch of 20 in 25 ms) would need 9. */
    s.rate_rps = 4000;
    pl_plan_t pf, pb;
    cr_assert_eq(pl_plan(&pf, &s, 1, NULL, &fluid), 0);
    cr_assert_eq(pl_plan(&pb, &s, 1, NULL, &burst), 0);
    cr_assert_eq(pf.ndevices, 5);
    cr_assert_eq(pb.ndevices, 6, "%d devices", pb.ndevices);
    pl_plan_dispose(&pf);
    pl_plan_dispose(&pb);
    pl_profile_dispose(&lin);
}

/* Clumped arrivals (pl_session_t.dispersion D): a batch covers D times the
 * 99% quantile of a Poisson count of mean lambda / D, more than a Poisson
 * count's quantile; D 1 (or 0) plans exactly as Poisson. */
Test(pack, clumped_arrivals_get_more_burst_headroom)
{
    pl_profile_t lin;
    pl_profile_init_linear(&lin, 1 * MS, 5 * MS, 64);
    pl_session_t s = {.id = 1, .model = 0, .name = "m", .profile = &lin, .slo_us = 50 * MS};
    pl_options_t burst = {.burst_quantile = 0.99};
    /* Up to 160 req/s: below the 800 req/s of a saturated device even with
     * clumps (past that the session is sized pooled over its devices, its
     * headroom in its rate). */
    for (double rate = 20; rate <= 160; rate *= 1.5) {
        s.rate_rps = rate;
        pl_plan_t p0, p1, p9;
        s.dispersion = 0;
        cr_assert_eq(pl_plan(&p0, &s, 1, NULL, &burst), 0);
        s.dispersion = 1;
        cr_assert_eq(pl_plan(&p1, &s, 1, NULL, &burst), 0);
        s.dispersion = 9;
        cr_assert_eq(pl_plan(&p9, &s, 1, NULL, &burst), 0);
        cr_assert_eq(p1.ndevices, p0.ndevices);
        cr_assert_eq(p1.devices[0].allocs[0].batch, p0.devices[0].allocs[0].batch);
        cr_assert_float_eq(p1.devices[0].duty_cycle_us, p0.devices[0].duty_cycle_us, 1e-9);
        /* Clumps of 9: a clump must fit whole, so at the same occupancy or
         * more, batches of at least 9 and a duty cycle over which the
         * clump count's 99% quantile fits the batch. */
        const pl_device_t *d = &p9.devices[0];
        const pl_alloc_t *a = &d->allocs[0];
        double clumps = rate * d->duty_cycle_us * 1e-6 / 9;
        cr_assert_geq(a->batch, 9, "rate %.0f: batch %d", rate, a->batch);
        cr_assert_geq(poisson_cdf_test(a->batch / 9, clumps), 0.99,
                      "rate %.0f: batch %d, %.2f clumps", rate, a->batch, clumps);
        cr_assert_geq(d->occupancy, p1.devices[0].occupancy - 1e-9, "rate %.0f", rate);
        cr_assert_leq(d->duty_cycle_us + a->latency_us, s.slo_us + 1e-6);
        pl_plan_dispose(&p0);
        pl_plan_dispose(&p1);
        pl_plan_dispose(&p9);
    }
    /* 4000 req/s in clumps of 9: pooled over the SLO, the count's 99%
     * quantile is 9 q(200 / 9) = 9 x 34 = 306 a SLO against 234 for
     * Poisson: 6120 req/s, 8 devices instead of 6. */
    s.rate_rps = 4000;
    pl_plan_t p1, p9;
    s.dispersion = 1;
    cr_assert_eq(pl_plan(&p1, &s, 1, NULL, &burst), 0);
    s.dispersion = 9;
    cr_assert_eq(pl_plan(&p9, &s, 1, NULL, &burst), 0);
    cr_assert_eq(p1.ndevices, 6, "%d devices", p1.ndevices);
    cr_assert_eq(p9.ndevices, 8, "%d devices", p9.ndevices);
    pl_plan_dispose(&p1);
    pl_plan_dispose(&p9);
    pl_profile_dispose(&lin);
}
