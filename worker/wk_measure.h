/* What a model's measurement runs next, and the profile it found: a pure
 * state machine (no clock, no model), fed each run's time by
 * serve_profile.c and by its unit tests.
 *
 * Pass 0 finds the batch sizes: every size to 8, then steps of a quarter,
 * each run `warmup` times and then `repeats` times, until throughput has
 * not grown by 3% for three sizes or the next size would not fit the time
 * budget. Further passes run every size found again (one warm-up run, then
 * WK_MEASURE_PASS_RUNS), as many as the budget allows up to
 * WK_MEASURE_PASSES in all. A shared host's speed drifts by tens of
 * percent from one second to the next: measured in one stretch, a size
 * caught the host at one moment (mobilenet_v2's l(2) was 6.5 ms in one
 * measurement and 11.2 ms in the next, while its live batches took 9.6 and
 * 11.2 ms); spread over several passes, each size sees the same moments as
 * the others and more of them. */
#ifndef WK_MEASURE_H
#define WK_MEASURE_H

#include <sq.h>

#include <stdint.h>

#define WK_MEASURE_PASSES 4
#define WK_MEASURE_PASS_RUNS 4
#define WK_MEASURE_MAX_SAMPLES 64

typedef struct {
    int max_b, warmup, repeats;
    int64_t budget_us; /* 0: unbounded */
    int pass;          /* 0: finding the sizes */
    int npasses;       /* the passes in all, once pass 0 is over */
    int complete;
    /* The sizes found, each with every sample so far (µs). */
    int nrows;
    int batch[SQ_MAX_PROFILE_ROWS];
    double *samples[SQ_MAX_PROFILE_ROWS];
    int nsamples[SQ_MAX_PROFILE_ROWS];
    double pass0_mean[SQ_MAX_PROFILE_ROWS];
    int row;                            /* the size being run: batch[row] (pass 0: being added) */
    int b;                              /* its batch size */
    int r;                              /* its runs in this pass, warm-ups first */
    double cur[WK_MEASURE_MAX_SAMPLES]; /* pass 0: this size's samples */
    int ncur;
    double best_tput;
    int stale;
    double spent_us; /* every run so far (the budget's) */
    double next_us;  /* the expected time of the next run */
    uint32_t expect; /* progress: sizes expected in pass 0 */
} wk_measure_t;

void wk_measure_init(wk_measure_t *M, int max_b, int warmup, int repeats, int64_t budget_ms);
void wk_measure_free(wk_measure_t *M);

/* The batch size of the next run, 0 once the measurement is complete. */
int wk_measure_batch(const wk_measure_t *M);

/* Records the time of the run wk_measure_batch asked for. Returns 1 when
 * it ended a size's runs in a pass (a point to report progress at). */
int wk_measure_add(wk_measure_t *M, double us);

/* The run time the measurement still expects to take, in µs (0 once it is
 * complete): the runs left of the size being measured, the sizes pass 0
 * still expects (a batch of n taking n / b times the last one's), and the
 * passes over every size, within what is left of the budget. The time
 * spent so far is M->spent_us. */
double wk_measure_left_us(const wk_measure_t *M);

/* Progress in size-measurements: those done, of those expected in all
 * (each size once per pass; an estimate while pass 0 goes on). */
void wk_measure_progress(const wk_measure_t *M, uint32_t *done, uint32_t *total);

/* The profile, once complete: one row per size (the mean and standard
 * deviation of its samples near the median, from every pass),
 * no size slower than a larger one. Returns the number of rows;
 * peak_memory_bytes is left 0 for the caller. */
int wk_measure_rows(const wk_measure_t *M, sq_profile_row_t *rows);

/* How far n outputs `got` (a plan in a lower precision) are from `ref`
 * (an FP32 plan's on the same input): *max_abs the largest |got - ref|,
 * *max_rel that over the largest |ref| (over all n: one scale for every
 * output, so a value near 0 does not blow it up; 0 when every |ref| is 0
 * and nothing differs). A non-finite got where ref is finite is +inf in
 * both; an output non-finite in ref too counts as none. Never NaN. */
void wk_deviation(const float *got, const float *ref, size_t n, double *max_abs, double *max_rel);

#endif
