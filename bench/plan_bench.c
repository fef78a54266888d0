/* Planner benchmark: packing quality (devices used against the lower bound
 * sum R_i / T_i) and planning time. Not a test: it prints numbers for
 * bench/RESULTS.md.
 *
 * usage: squish-plan-bench [WORKLOAD.json]
 *   default bench/workloads/symphony_1080ti_zipf.json (run from the source
 *   root). Quality is measured on the workload at several total loads (its
 *   rates scaled); timing on synthetic sessions built from its models:
 *   100 and 10,000 sessions, Zipf-0.9 rates, SLOs 1x-2x the paper's. */
#include "bench_util.h"

#include "pl.h"
#include "workload.h"

#include <sq.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* What the residual shares would cost packed perfectly at their solo
 * occupancy: the best any merge order could do under the duty-cycle model. */
static double residual_bound(const pl_plan_t *p, const pl_session_t *s, const pl_options_t *o)
{
    double sum = 0;
    for (int i = 0; i < p->ndevices; i++) {
        const pl_device_t *d = &p->devices[i];
        if (d->saturated) {
            sum += 1;
            continue;
        }
        for (int a = 0; a < d->nallocs; a++) {
            const pl_session_t *ss = &s[d->allocs[a].session];
            int b;
            double duty, occ;
            if (pl_residue(ss->profile, ss->slo_us, d->allocs[a].rate_rps, o->k_std,
                           o->device_memory_bytes, &b, &duty, &occ) == 0)
                sum += occ;
        }
    }
    return sum;
}

static void quality(wl_workload_t *w, const char *path)
{
    wl_plan_input_t in;
    if (wl_plan_input_build(&in, w) < 0) {
        fprintf(stderr, "plan input: %s\n", w->error);
        exit(1);
    }
    double base = 0;
    for (int i = 0; i < in.nsessions; i++)
        base += in.sessions[i].rate_rps;
    double *orig = malloc(sizeof(double) * (size_t)in.nsessions);
    for (int i = 0; i < in.nsessions; i++)
        orig[i] = in.sessions[i].rate_rps;
    printf("## packing quality: %s (%d sessions, %d models)\n\n", path, in.nsessions, w->nmodels);
    printf("| total req/s | lower bound | devices | efficiency | saturated | residual-limited "
           "bound | plan ms |\n|---|---|---|---|---|---|---|\n");
    const double totals[] = {700, 2000, 7000, 20000, 50000, 200000};
    for (size_t t = 0; t < sizeof(totals) / sizeof(totals[0]); t++) {
        for (int i = 0; i < in.nsessions; i++)
            in.sessions[i].rate_rps = orig[i] * totals[t] / base;
        pl_plan_t p;
        double t0 = now_ms();
        if (pl_plan(&p, in.sessions, in.nsessions, NULL, &in.options) < 0) {
            fprintf(stderr, "pl_plan failed\n");
            exit(1);
        }
        double ms = now_ms() - t0;
        int nsat = 0;
        for (int i = 0; i < p.ndevices; i++)
            nsat += p.devices[i].saturated;
        printf("| %.0f | %.1f | %d | %.1f%% | %d | %.1f | %.2f |\n", totals[t],
               p.lower_bound_devices, p.ndevices, 100 * p.lower_bound_devices / p.ndevices, nsat,
               residual_bound(&p, in.sessions, &in.options), ms);
        if (p.nunplaced)
            printf("(%d sessions unplaced)\n", p.nunplaced);
        pl_plan_dispose(&p);
    }
    free(orig);
    wl_plan_input_dispose(&in);
}

static uint64_t rng = 0x853c49e6748fea9bULL;

/* n sessions over the workload's models: model i mod M, SLO the paper's
 * (the workload's first session of that model) times 1 + (i / M mod 5) / 4,
 * Zipf-0.9 rates over shuffled ranks, mean_rps per session on average. */
static pl_session_t *synth(const wl_workload_t *w, int n, double mean_rps)
{
    pl_session_t *s = calloc((size_t)n, sizeof(*s));
    double *share = malloc(sizeof(double) * (size_t)n);
    bench_zipf_shares(n, 0.9, &rng, share);
    for (int i = 0; i < n; i++) {
        int m = i % w->nmodels;
        double slo_ms = 0;
        for (int k = 0; k < w->nsessions && slo_ms == 0; k++)
            if (w->sessions[k].model == m)
                slo_ms = w->sessions[k].slo_ms;
        s[i] = (pl_session_t){.id = i,
                              .model = m,
                              .name = w->models[m].name,
                              .profile = &w->models[m].profile,
                              .slo_us = slo_ms * 1000 * (1 + ((i / w->nmodels) % 5) / 4.0),
                              .rate_rps = mean_rps * share[i]};
    }
    free(share);
    return s;
}

static void timing(const wl_workload_t *w, int n, int reps, double mean_rps)
{
    pl_session_t *s = synth(w, n, mean_rps);
    pl_options_t opt = {.device_memory_bytes = w->device_memory_mb * WL_BYTES_PER_MB};
    double *t = malloc(sizeof(double) * (size_t)reps), *ti = malloc(sizeof(double) * (size_t)reps);
    int ndev = 0, moved = 0;
    double lb = 0;
    for (int r = 0; r < reps; r++) {
        pl_plan_t p, q;
        double t0 = now_ms();
        pl_plan(&p, s, n, NULL, &opt);
        t[r] = now_ms() - t0;
        ndev = p.ndevices;
        lb = p.lower_bound_devices;
        /* the next epoch: every rate drifts by up to +-10% */
        uint64_t keep = rng;
        for (int i = 0; i < n; i++)
            s[i].rate_rps *= 0.9 + 0.2 * bench_rnd(&rng);
        t0 = now_ms();
        pl_plan(&q, s, n, &p, &opt);
        ti[r] = now_ms() - t0;
        moved = q.moved;
        rng = keep;
        pl_session_t *fresh = synth(w, n, mean_rps); /* restore the rates */
        for (int i = 0; i < n; i++)
            s[i].rate_rps = fresh[i].rate_rps;
        free(fresh);
        pl_plan_dispose(&p);
        pl_plan_dispose(&q);
    }
    qsort(t, (size_t)reps, sizeof(double), bench_cmp_double);
    qsort(ti, (size_t)reps, sizeof(double), bench_cmp_double);
    printf("| %d | %.0f | %d | %.1f | %.1f%% | %.3f | %.3f | %.3f | %d |\n", n, mean_rps * n, ndev,
           lb, 100 * lb / ndev, t[reps / 2], t[reps - 1], ti[reps / 2], moved);
    free(t);
    free(ti);
    free(s);
}

int main(int argc, char **argv)
{
    const char *path = argc > 1 ? argv[1] : "bench/workloads/symphony_1080ti_zipf.json";
    wl_workload_t w;
    if (wl_load_file(&w, path) < 0) {
        fprintf(stderr, "squish-plan-bench: %s: %s\n", path, w.error);
        return 1;
    }
    quality(&w, path);
    printf("\n## planning time (synthetic sessions over the same models, Zipf-0.9 rates)\n\n");
    printf("| sessions | total req/s | devices | lower bound | efficiency | plan ms (median) | "
           "plan ms (max) | incremental epoch ms (median, rates +-10%%) | moved |\n"
           "|---|---|---|---|---|---|---|---|---|\n");
    timing(&w, 100, 101, 50);
    timing(&w, 100, 101, 500);
    timing(&w, 10000, 5, 50);
    timing(&w, 10000, 5, 500);
    wl_workload_dispose(&w);
    return 0;
}
