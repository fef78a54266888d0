/* The planning loop's epoch split for a planner thread (pl_loop.h:
 * pl_loop_plan_begin, pl_loop_job_run, pl_loop_plan_finish): what the
 * dispatch thread would still pay (begin: the sessions and the copies of
 * everything pl_plan reads; finish: adopting the plan) against what moves
 * to the planner thread (run: pl_plan). Not a test: it prints numbers for
 * bench/RESULTS.md.
 *
 * usage: squish-plan-thread-bench [WORKLOAD.json]
 *   default bench/workloads/symphony_1080ti_zipf.json (run from the source
 *   root). The sessions are squish-plan-bench's synthetic ones over the
 *   workload's models (model i mod M, SLO the paper's times
 *   1 + (i / M mod 5) / 4, Zipf-0.9 rates over shuffled ranks), seeded into
 *   a pl_loop (every SLO its own session: no buckets; no burst headroom, as
 *   squish-plan-bench's pl_plan), planned on as many devices as needed. */
#include "bench_util.h"

#include "pl_loop.h"
#include "workload.h"

#include <sq.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static uint64_t rng = 0x853c49e6748fea9bULL;

/* squish-plan-bench's synth(), as a loop: session i is model i mod M's at
 * its SLO (plus i ns, so that every session is its own). */
static pl_loop_t *synth_loop(const wl_workload_t *w, int n, double mean_rps)
{
    pl_loop_config_t c;
    pl_loop_config_default(&c);
    c.burst_quantile = 0;
    pl_loop_t *l = pl_loop_new(&c, 0);
    for (int m = 0; m < w->nmodels; m++)
        pl_loop_model_set(l, m,
                          &(pl_loop_model_t){.kind = 0,
                                             .profile = &w->models[m].profile,
                                             .name = w->models[m].name,
                                             .active = 1});
    double *share = malloc(sizeof(double) * (size_t)n);
    bench_zipf_shares(n, 0.9, &rng, share);
    for (int i = 0; i < n; i++) {
        int m = i % w->nmodels;
        double slo_ms = 0;
        for (int k = 0; k < w->nsessions && slo_ms == 0; k++)
            if (w->sessions[k].model == m)
                slo_ms = w->sessions[k].slo_ms;
        slo_ms = slo_ms * (1 + ((i / w->nmodels) % 5) / 4.0) + i * 1e-6;
        pl_loop_seed(l, m, slo_ms, mean_rps * share[i], 0);
    }
    free(share);
    return l;
}

typedef struct {
    double *begin, *run, *finish;
} times_t;

static void epoch(pl_loop_t *l, const pl_loop_devices_t *d, int64_t now, times_t *t, int r)
{
    int rc;
    double t0 = now_ms();
    pl_loop_job_t *j = pl_loop_plan_begin(l, 0, d, now, &rc);
    double t1 = now_ms();
    pl_loop_job_run(j);
    double t2 = now_ms();
    rc = pl_loop_plan_finish(l, j);
    double t3 = now_ms();
    if (rc != 0) {
        fprintf(stderr, "planning failed: %d\n", rc);
        exit(1);
    }
    t->begin[r] = t1 - t0;
    t->run[r] = t2 - t1;
    t->finish[r] = t3 - t2;
}

static void row(int n, double total, const char *what, int ndev, times_t *t, int reps)
{
    qsort(t->begin, (size_t)reps, sizeof(double), bench_cmp_double);
    qsort(t->run, (size_t)reps, sizeof(double), bench_cmp_double);
    qsort(t->finish, (size_t)reps, sizeof(double), bench_cmp_double);
    printf("| %d | %.0f | %s | %d | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f |\n", n, total, what,
           ndev, t->begin[reps / 2], t->begin[reps - 1], t->finish[reps / 2], t->finish[reps - 1],
           t->run[reps / 2], t->run[reps - 1]);
}

static void timing(const wl_workload_t *w, int n, int reps, double mean_rps)
{
    times_t fresh, incr;
    int ndev[2] = {0, 0};
    double *buf = calloc((size_t)reps * 6, sizeof(double));
    fresh = (times_t){buf, buf + reps, buf + 2 * reps};
    incr = (times_t){buf + 3 * reps, buf + 4 * reps, buf + 5 * reps};
    pl_loop_devices_t d = {.uncapped = 1, .memory_bytes = w->device_memory_mb * WL_BYTES_PER_MB};
    for (int r = 0; r < reps; r++) {
        uint64_t keep = rng;
        pl_loop_t *l = synth_loop(w, n, mean_rps);
        epoch(l, &d, 1000000, &fresh, r);
        ndev[0] = pl_loop_current(l, 0)->ndevices;
        /* the next epoch: every rate drifts by up to +-10% */
        for (int i = 0; i < pl_loop_nsessions(l); i++) {
            pl_loop_session_info_t si;
            pl_loop_session_at(l, i, &si);
            pl_loop_seed(l, si.model, si.plan_slo_ms, si.rate_rps * (0.9 + 0.2 * bench_rnd(&rng)),
                         0);
        }
        epoch(l, &d, 2000000, &incr, r);
        ndev[1] = pl_loop_current(l, 0)->ndevices;
        pl_loop_free(l);
        rng = keep;
    }
    row(n, mean_rps * n, "first", ndev[0], &fresh, reps);
    row(n, mean_rps * n, "incremental", ndev[1], &incr, reps);
    free(buf);
}

int main(int argc, char **argv)
{
    const char *path = argc > 1 ? argv[1] : "bench/workloads/symphony_1080ti_zipf.json";
    wl_workload_t w;
    if (wl_load_file(&w, path) < 0) {
        fprintf(stderr, "squish-plan-thread-bench: %s: %s\n", path, w.error);
        return 1;
    }
    printf("| sessions | total req/s | epoch | devices | begin ms (median) | begin ms (max) | "
           "finish ms "
           "(median) | finish ms (max) | run ms (median) | run ms (max) |\n"
           "|---|---|---|---|---|---|---|---|---|---|\n");
    timing(&w, 100, 101, 50);
    timing(&w, 100, 101, 500);
    timing(&w, 10000, 5, 50);
    timing(&w, 10000, 5, 500);
    wl_workload_dispose(&w);
    return 0;
}
