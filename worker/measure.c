/* The measurement's state machine (wk_measure.h). */
#include "wk_measure.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Mean and std of the samples near the median (within 0.8x-1.25x of it).
 * The typical run is what a live batch takes, so the profile estimates it:
 * the mean of the fastest three quarters, kept here before, came out
 * 4-5% under the mean of the live batches it was compared with (their
 * spread is about +-10% on this kind of host), and a slow stretch that
 * hit fewer than half a size's samples still weighed on its mean; the
 * median's neighbourhood leaves out both a slow stretch and a single
 * spike. The centre is the lower median, a sample itself, so the set is
 * never empty. Sorts a copy. */
#define NEAR_LO 0.8  /* the samples kept: NEAR_LO x median .. NEAR_HI x median */
#define NEAR_HI 1.25 /* (symmetric on a log scale) */

static void central_stats(const double *samples, int n, double *mean, double *sd)
{
    double sorted[WK_MEASURE_MAX_SAMPLES];
    if (n > WK_MEASURE_MAX_SAMPLES)
        n = WK_MEASURE_MAX_SAMPLES;
    for (int i = 0; i < n; i++)
        sorted[i] = samples[i];
    qsort(sorted, (size_t)n, sizeof(*sorted), cmp_double);
    double med = n > 0 ? sorted[(n - 1) / 2] : 0, sum = 0, sumsq = 0;
    int keep = 0;
    for (int i = 0; i < n; i++) {
        if (sorted[i] < NEAR_LO * med || sorted[i] > NEAR_HI * med)
            continue;
        sum += sorted[i];
        sumsq += sorted[i] * sorted[i];
        keep++;
    }
    *mean = keep > 0 ? sum / keep : 0;
    double var = keep > 0 ? sumsq / keep - *mean * *mean : 0;
    *sd = var > 0 ? sqrt(var) : 0;
}

/* The batch sizes pass 0 measures: every size to 8, then steps of a
 * quarter of the current size. Between them the planner rounds a batch up
 * to the next measured size (a batch never runs slower padded). */
static int next_size(int b)
{
    return b < 8 ? b + 1 : b + b / 4;
}

void wk_measure_init(wk_measure_t *M, int max_b, int warmup, int repeats, int64_t budget_ms)
{
    memset(M, 0, sizeof(*M));
    M->max_b = max_b;
    M->warmup = warmup;
    M->repeats = repeats < 1                        ? 1
                 : repeats > WK_MEASURE_MAX_SAMPLES ? WK_MEASURE_MAX_SAMPLES
                                                    : repeats;
    M->budget_us = budget_ms * 1000;
    M->npasses = 1;
    M->b = max_b >= 1 ? 1 : 0;
    M->complete = M->b == 0;
}

void wk_measure_free(wk_measure_t *M)
{
    for (int i = 0; i < M->nrows; i++)
        free(M->samples[i]);
    memset(M, 0, sizeof(*M));
}

int wk_measure_batch(const wk_measure_t *M)
{
    return M->complete ? 0 : M->b;
}

static void keep_sample(wk_measure_t *M, int row, double us)
{
    if (M->samples[row] == NULL)
        M->samples[row] = sq_xcalloc(WK_MEASURE_MAX_SAMPLES, sizeof(double));
    if (M->nsamples[row] < WK_MEASURE_MAX_SAMPLES)
        M->samples[row][M->nsamples[row]++] = us;
}

/* Pass 0 is over: the passes that fit what is left of the budget. */
static void plan_passes(wk_measure_t *M)
{
    double pass_us = 0;
    for (int i = 0; i < M->nrows; i++)
        pass_us += M->pass0_mean[i] * (1 + WK_MEASURE_PASS_RUNS);
    int extra = WK_MEASURE_PASSES - 1;
    if (M->budget_us > 0 && pass_us > 0) {
        double left = (double)M->budget_us - M->spent_us;
        int fit = left > 0 ? (int)(left / pass_us) : 0;
        if (fit < extra)
            extra = fit;
    }
    M->npasses = 1 + (M->nrows > 0 ? extra : 0);
}

/* Pass 0: the size M->b has all its runs. Adds its row, applies the stop
 * rule, and moves to the next size or the next pass. */
static void end_pass0_size(wk_measure_t *M)
{
    int i = M->nrows++;
    M->batch[i] = M->b;
    for (int k = 0; k < M->ncur; k++)
        keep_sample(M, i, M->cur[k]);
    double mean, sd;
    central_stats(M->cur, M->ncur, &mean, &sd);
    M->pass0_mean[i] = mean;
    /* Stop once throughput has not improved by 3% for three sizes, or
     * when the next size would run past the time budget. */
    double tput = mean > 0 ? M->b / mean : 0;
    int stop = 0;
    if (tput > M->best_tput * 1.03) {
        M->best_tput = tput;
        M->stale = 0;
    } else if (++M->stale >= 3) {
        stop = 1;
    }
    int nb = next_size(M->b);
    double next_cost = mean * nb / M->b * (M->warmup + M->repeats);
    if (M->budget_us > 0 && M->spent_us + next_cost > (double)M->budget_us)
        stop = 1;
    if (nb > M->max_b || M->nrows >= SQ_MAX_PROFILE_ROWS)
        stop = 1;
    /* Sizes expected: those up to max_b that fit what is left of the
     * budget at this pace (a batch of n taking n / b times this one's). */
    M->expect = (uint32_t)M->nrows;
    if (!stop) {
        double left = M->budget_us > 0 ? (double)M->budget_us - M->spent_us : 1e300;
        for (int n = nb; n <= M->max_b && M->expect < SQ_MAX_PROFILE_ROWS; n = next_size(n)) {
            left -= mean * n / M->b * (M->warmup + M->repeats);
            if (left < 0)
                break;
            M->expect++;
        }
    }
    M->r = 0;
    M->ncur = 0;
    if (!stop) {
        M->next_us = M->next_us * nb / M->b;
        M->b = nb;
        M->row = M->nrows;
        return;
    }
    plan_passes(M);
    if (M->npasses <= 1) {
        M->complete = 1;
        return;
    }
    M->pass = 1;
    M->row = 0;
    M->b = M->batch[0];
    M->next_us = M->pass0_mean[0];
}

int wk_measure_add(wk_measure_t *M, double us)
{
    if (M->complete)
        return 0;
    M->spent_us += us;
    M->next_us = us;
    M->r++;
    if (M->pass == 0) {
        if (M->r > M->warmup && M->ncur < WK_MEASURE_MAX_SAMPLES)
            M->cur[M->ncur++] = us;
        if (M->r < M->warmup + M->repeats)
            return 0;
        end_pass0_size(M);
        return 1;
    }
    /* A later pass: one warm-up run (the switch from another size), then
     * its runs. */
    if (M->r > 1)
        keep_sample(M, M->row, us);
    if (M->r < 1 + WK_MEASURE_PASS_RUNS)
        return 0;
    M->r = 0;
    if (++M->row == M->nrows) {
        M->row = 0;
        if (++M->pass == M->npasses) {
            M->complete = 1;
            return 1;
        }
    }
    M->b = M->batch[M->row];
    M->next_us = M->pass0_mean[M->row];
    return 1;
}

void wk_measure_progress(const wk_measure_t *M, uint32_t *done, uint32_t *total)
{
    if (M->pass == 0 && !M->complete) {
        *done = (uint32_t)M->nrows;
        *total = M->expect * WK_MEASURE_PASSES;
        if (*total < *done)
            *total = *done;
        return;
    }
    uint32_t n = (uint32_t)M->nrows;
    *total = n * (uint32_t)M->npasses;
    *done = M->complete ? *total : n * (uint32_t)M->pass + (uint32_t)M->row;
}

double wk_measure_left_us(const wk_measure_t *M)
{
    if (M->complete)
        return 0;
    double left = 0;
    if (M->pass == 0) {
        /* This size's runs left, then the sizes expected after it, each a
         * batch of n taking n / b times this one's (as end_pass0_size
         * expects them), then the passes over every size found. */
        double run = M->next_us > 0 ? M->next_us : 0;
        int runs = M->warmup + M->repeats - M->r;
        left += run * (runs > 0 ? runs : 0);
        double sizes_us = 0; /* one run of each size, for the later passes */
        for (int i = 0; i < M->nrows; i++)
            sizes_us += M->pass0_mean[i];
        sizes_us += run;
        int n = M->b;
        for (uint32_t k = (uint32_t)M->nrows + 1; k < M->expect && n <= M->max_b; k++) {
            n = n < 8 ? n + 1 : n + n / 4;
            if (n > M->max_b)
                break;
            double one = M->b > 0 ? run * n / M->b : 0;
            left += one * (M->warmup + M->repeats);
            sizes_us += one;
        }
        left += sizes_us * (1 + WK_MEASURE_PASS_RUNS) * (WK_MEASURE_PASSES - 1);
    } else {
        /* The rest of this pass, then the passes left. */
        double pass_us = 0;
        for (int i = 0; i < M->nrows; i++)
            pass_us += M->pass0_mean[i] * (1 + WK_MEASURE_PASS_RUNS);
        for (int i = M->row; i < M->nrows; i++)
            left += M->pass0_mean[i] * (1 + WK_MEASURE_PASS_RUNS);
        left -= M->pass0_mean[M->row] * M->r;
        left += pass_us * (M->npasses - M->pass - 1);
    }
    if (left < 0)
        left = 0;
    /* The budget bounds it: no size or pass starts past it. */
    if (M->budget_us > 0 && M->spent_us + left > (double)M->budget_us) {
        double cap = (double)M->budget_us - M->spent_us;
        left = cap > 0 ? cap : 0;
    }
    return left;
}

int wk_measure_rows(const wk_measure_t *M, sq_profile_row_t *rows)
{
    for (int i = 0; i < M->nrows; i++) {
        double mean, sd;
        central_stats(M->samples[i], M->nsamples[i], &mean, &sd);
        rows[i] = (sq_profile_row_t){.batch = (uint32_t)M->batch[i], .mean_us = mean, .std_us = sd};
    }
    /* A smaller batch can always run padded to a larger one, so l(b) is at
     * most any larger size's latency: the envelope removes the noise that a
     * busy host puts into small batches (and keeps l(b)/b meaningful). */
    for (int i = M->nrows - 2; i >= 0; i--) {
        if (rows[i].mean_us > rows[i + 1].mean_us) {
            rows[i].mean_us = rows[i + 1].mean_us;
            rows[i].std_us = rows[i + 1].std_us;
        }
    }
    return M->nrows;
}

void wk_deviation(const float *got, const float *ref, size_t n, double *max_abs, double *max_rel)
{
    double dmax = 0, rmax = 0;
    int overflow = 0;
    for (size_t i = 0; i < n; i++) {
        double r = ref[i], g = got[i];
        if (!isfinite(r))
            continue; /* the reference overflows too: nothing to compare */
        if (!isfinite(g)) {
            overflow = 1;
            continue;
        }
        double d = fabs(g - r);
        if (d > dmax)
            dmax = d;
        if (fabs(r) > rmax)
            rmax = fabs(r);
    }
    if (overflow) {
        *max_abs = *max_rel = INFINITY;
        return;
    }
    *max_abs = dmax;
    *max_rel = rmax > 0 ? dmax / rmax : dmax > 0 ? INFINITY : 0;
}
