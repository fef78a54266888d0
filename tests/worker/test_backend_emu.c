/* The emulated backend: holds each batch for exactly l(b) (sleeping to an
 * absolute deadline), deterministic outputs of the right shape. Timing
 * checks run alone (is_parallel: false): a wake-up on a core that other
 * tests keep busy comes late. */
#include <criterion/criterion.h>
#include <math.h>
#include <sq.h>
#include <stdlib.h>
#include <string.h>
#include <wk_exec_int.h>

Test(emu, emulated_device_holds_each_batch_for_its_profile)
{
    int64_t lat_us[4] = {100000, 130000, 160000, 190000};
    wk_plan_opts_t o = wk_plan_opts_default();
    o.backend = SQ_DEV_EMU;
    o.max_batch = 4;
    o.emu_latency_us = lat_us;
    o.emu_n_latency = 4;
    wk_plan_t *p;
    char why[256];
    int64_t chw[3] = {3, 8, 8};
    cr_assert_eq(wk_plan_create_emulated(chw, 10, &o, &p, why, sizeof(why)), 0, "%s", why);
    uint8_t px[4 * 8 * 8 * 3];
    for (size_t i = 0; i < sizeof(px); i++)
        px[i] = (uint8_t)(i % 7 == 0 ? 200 : i);
    memcpy(px + 3 * 192, px, 192); /* image 3 equals image 0 */
    float a[40], b[40];
    /* The fastest of three runs: a loaded 2-core machine delays wake-ups
     * (a median of three came 10% late at a load average of 11), but a
     * device that is systematically late is late every time. */
    for (int batch = 1; batch <= 4; batch++) {
        double ms[3], want = (double)lat_us[batch - 1] / 1e3;
        for (int r = 0; r < 3; r++) {
            int64_t t0 = sq_now_ns();
            cr_assert_eq(wk_plan_run_pixels(p, batch, px, a), 0);
            ms[r] = (double)(sq_now_ns() - t0) / 1e6;
            cr_assert_geq(ms[r], want * 0.999, "b=%d returned early: %.2f ms", batch, ms[r]);
        }
        double best = fmin(ms[0], fmin(ms[1], ms[2]));
        cr_assert_leq(best, want * 1.05, "b=%d took %.2f ms (fastest of 3) for l(b) %.2f ms", batch,
                      best, want);
    }
    cr_assert_eq(wk_plan_run_pixels(p, 4, px, b), 0);
    cr_assert_eq(memcmp(a, b, sizeof(a)), 0, "deterministic");
    cr_assert_eq(memcmp(a, a + 30, 10 * sizeof(float)), 0, "equal images, equal outputs");
    cr_assert_neq(memcmp(a, a + 10, 10 * sizeof(float)), 0, "distinct images differ");
    cr_assert_eq(wk_plan_output_elems(p, 0), 10);
    wk_plan_free(p);
}

Test(emu, emulated_plan_needs_a_profile_for_every_batch)
{
    int64_t lat_us[2] = {1000, 2000};
    wk_plan_opts_t o = wk_plan_opts_default();
    o.backend = SQ_DEV_EMU;
    o.max_batch = 4;
    o.emu_latency_us = lat_us;
    o.emu_n_latency = 2;
    wk_plan_t *p;
    char why[256];
    int64_t chw[3] = {3, 8, 8};
    cr_assert_eq(wk_plan_create_emulated(chw, 10, &o, &p, why, sizeof(why)), SQ_INVAL);
    cr_assert(strstr(why, "l(b)") != NULL, "%s", why);
}

Test(emu, an_nhwc_emulated_model_takes_pixels)
{
    /* squishd sends an NHWC model's item shape as {H, W, 3}: its emulated
     * plan takes images in that layout, one output of the whole row. */
    int64_t lat_us[2] = {100, 100};
    wk_plan_opts_t o = wk_plan_opts_default();
    o.backend = SQ_DEV_EMU;
    o.max_batch = 2;
    o.emu_latency_us = lat_us;
    o.emu_n_latency = 2;
    wk_plan_t *p;
    char why[256];
    int64_t hwc[3] = {4, 5, 3};
    cr_assert_eq(wk_plan_create_emulated(hwc, 7, &o, &p, why, sizeof(why)), 0, "%s", why);
    int h, w, nhwc;
    cr_assert(wk_plan_image_input(p, &h, &w, &nhwc));
    cr_assert(h == 4 && w == 5 && nhwc == 1);
    cr_assert_eq(wk_plan_row_elems(p), 7);
    uint8_t px[2 * 60];
    for (size_t i = 0; i < 60; i++)
        px[i] = px[60 + i] = (uint8_t)(i * 13);
    float a[14];
    cr_assert_eq(wk_plan_run_pixels(p, 2, px, a), 0, "%s", wk_plan_errmsg(p));
    cr_assert_eq(memcmp(a, a + 7, 7 * sizeof(float)), 0, "equal images, equal rows");
    wk_plan_free(p);
}

Test(emu, an_emulated_detector_draws_a_poisson_count_of_disjoint_boxes_per_item)
{
    enum { SLOTS = 16, BATCH = 8, RUNS = 500 };
    int64_t lat_us[BATCH];
    for (int b = 0; b < BATCH; b++)
        lat_us[b] = 0;
    wk_plan_opts_t o = wk_plan_opts_default();
    o.backend = SQ_DEV_EMU;
    o.max_batch = BATCH;
    o.emu_latency_us = lat_us;
    o.emu_n_latency = BATCH;
    o.emu_det_slots = SLOTS;
    o.emu_det_mean = 2.5;
    wk_plan_t *p;
    char why[256];
    int64_t chw[3] = {3, 8, 8};
    cr_assert_eq(wk_plan_create_emulated(chw, 5 * SLOTS, &o, &p, why, sizeof(why)), 0, "%s", why);
    cr_assert_eq(wk_plan_output_elems(p, 0), 4 * SLOTS);
    cr_assert_eq(wk_plan_output_elems(p, 1), SLOTS);
    /* Every item the same image: the count still varies, with the mean and
     * the variance of a Poisson(2.5). */
    uint8_t px[BATCH * 8 * 8 * 3];
    memset(px, 90, sizeof(px));
    static float rows[BATCH * 5 * SLOTS];
    double sum = 0, sum2 = 0;
    int counts[SLOTS + 1] = {0};
    for (int r = 0; r < RUNS; r++) {
        cr_assert_eq(wk_plan_run_pixels(p, BATCH, px, rows), 0);
        for (int b = 0; b < BATCH; b++) {
            const float *boxes = rows + b * 5 * SLOTS, *scores = boxes + 4 * SLOTS;
            int n = 0;
            for (int k = 0; k < SLOTS; k++) {
                cr_assert(scores[k] == 0.9f || scores[k] == 0.05f, "score %g", scores[k]);
                n += scores[k] == 0.9f;
                const float *bx = boxes + 4 * k;
                cr_assert(bx[0] >= 0 && bx[0] < bx[2] && bx[2] <= 1 && bx[1] >= 0 &&
                          bx[1] < bx[3] && bx[3] <= 1);
                for (int j = 0; j < k; j++) { /* no two boxes overlap */
                    const float *by = boxes + 4 * j;
                    cr_assert(bx[2] <= by[0] || by[2] <= bx[0] || bx[3] <= by[1] || by[3] <= bx[1]);
                }
            }
            sum += n;
            sum2 += (double)n * n;
            counts[n]++;
        }
    }
    double items = (double)RUNS * BATCH, mean = sum / items, var = sum2 / items - mean * mean;
    /* 4000 draws: the mean's standard error is 0.025, the variance's about 0.07. */
    cr_assert(fabs(mean - 2.5) < 0.1, "mean %.3f", mean);
    cr_assert(fabs(var - 2.5) < 0.35, "variance %.3f", var);
    /* P(0) = e^-2.5 = 8.2% */
    cr_assert(fabs(counts[0] / items - 0.0821) < 0.02, "P(0) %.3f", counts[0] / items);
    wk_plan_free(p);

    /* The row must be 5 floats a slot, the mean within the slots. */
    cr_assert_eq(wk_plan_create_emulated(chw, 5 * SLOTS + 1, &o, &p, why, sizeof(why)), SQ_INVAL);
    o.emu_det_mean = SLOTS + 1;
    cr_assert_eq(wk_plan_create_emulated(chw, 5 * SLOTS, &o, &p, why, sizeof(why)), SQ_INVAL);
}
