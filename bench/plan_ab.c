/* squish-plan-ab: two cpu plans of one model, made under two settings of
 * one environment variable, timed run by run in turn (A, B, A, B...) in
 * one process, so that a neighbour on the machine slows both alike.
 *
 *   squish-plan-ab [--threads N] [--iters N] [--warmup N] [--batch B]... NAME=A NAME=B MODEL.onnx
 *
 * The variable is read when a plan is made (SQUISH_CPU_OWN_CONV,
 * SQUISH_CPU_DW_FUSE_MB...). Per batch size, one JSON line: each plan's
 * median and minimum ms, its outputs' largest relative difference from
 * the other's, and the median over pairs of B's time over A's (below 1:
 * B faster), which a busy machine moves far less than either median. */
#include <mdb_graph.h>
#include <sq.h>
#include <wk_exec.h>

#include "bench_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static wk_plan_t *plan_with(const char *assign, mdb_graph_t *g, int max_batch, int threads)
{
    char name[128];
    const char *eq = strchr(assign, '=');
    if (eq == NULL || (size_t)(eq - assign) >= sizeof(name)) {
        fprintf(stderr, "not NAME=VALUE: %s\n", assign);
        return NULL;
    }
    memcpy(name, assign, (size_t)(eq - assign));
    name[eq - assign] = '\0';
    setenv(name, eq + 1, 1);
    wk_plan_opts_t o = wk_plan_opts_default();
    o.max_batch = max_batch;
    o.threads = threads;
    wk_plan_t *p = NULL;
    char why[512];
    if (wk_plan_create(g, &o, &p, why, sizeof(why)) != 0) {
        fprintf(stderr, "plan with %s: %s\n", assign, why);
        return NULL;
    }
    unsetenv(name);
    return p;
}

static double timed_run(wk_plan_t *p, int b, const float *in, float **out)
{
    int64_t t0 = sq_now_ns();
    if (wk_plan_run(p, b, (const float *[]){in}, out) != 0) {
        fprintf(stderr, "run: %s\n", wk_plan_errmsg(p));
        exit(1);
    }
    return (double)(sq_now_ns() - t0) / 1e6;
}

int main(int argc, char **argv)
{
    int threads = 2, iters = 20, warmup = 3, batches[16], n_batches = 0, i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc)
            iters = atoi(argv[++i]);
        else if (strcmp(argv[i], "--warmup") == 0 && i + 1 < argc)
            warmup = atoi(argv[++i]);
        else if (strcmp(argv[i], "--batch") == 0 && i + 1 < argc && n_batches < 16)
            batches[n_batches++] = atoi(argv[++i]);
        else
            break;
    }
    if (argc - i != 3 || iters < 1) {
        fprintf(stderr,
                "usage: %s [--threads N] [--iters N] [--warmup N] [--batch B]... NAME=A NAME=B "
                "MODEL.onnx\n",
                argv[0]);
        return 2;
    }
    if (n_batches == 0)
        batches[n_batches++] = 1;
    const char *path = argv[i + 2];
    size_t len;
    void *bytes = bench_slurp(path, &len);
    mdb_graph_t *g = NULL;
    mdb_import_error_t err;
    if (bytes == NULL || mdb_onnx_import(bytes, len, &g, &err) != 0) {
        fprintf(stderr, "%s: cannot import\n", path);
        return 1;
    }
    free(bytes);
    int max_batch = 1;
    for (int k = 0; k < n_batches; k++)
        max_batch = batches[k] > max_batch ? batches[k] : max_batch;
    wk_plan_t *pa = plan_with(argv[i], g, max_batch, threads);
    wk_plan_t *pb = pa != NULL ? plan_with(argv[i + 1], g, max_batch, threads) : NULL;
    mdb_graph_free(g);
    if (pb == NULL)
        return 1;
    int64_t in_per = wk_plan_input_elems(pa, 0);
    int n_out = wk_plan_n_outputs(pa);
    float *in = malloc((size_t)(in_per * max_batch) * sizeof(float));
    float **oa = malloc((size_t)n_out * sizeof(float *)),
          **ob = malloc((size_t)n_out * sizeof(float *));
    for (int k = 0; k < n_out; k++) {
        size_t n = (size_t)(wk_plan_output_elems(pa, k) * max_batch);
        oa[k] = malloc(n * sizeof(float));
        ob[k] = malloc(n * sizeof(float));
    }
    uint64_t seed = 7;
    for (int64_t k = 0; k < in_per * max_batch; k++)
        in[k] = (float)bench_rnd(&seed);
    double *ta = malloc((size_t)iters * sizeof(double)),
           *tb = malloc((size_t)iters * sizeof(double));
    double *ratio = malloc((size_t)iters * sizeof(double));
    for (int bi = 0; bi < n_batches; bi++) {
        int b = batches[bi];
        for (int w = 0; w < warmup; w++) {
            timed_run(pa, b, in, oa);
            timed_run(pb, b, in, ob);
        }
        double diff = 0, scale = 0;
        for (int k = 0; k < n_out; k++)
            for (int64_t e = 0; e < wk_plan_output_elems(pa, k) * b; e++) {
                diff = fmax(diff, fabs((double)oa[k][e] - (double)ob[k][e]));
                scale = fmax(scale, fabs((double)oa[k][e]));
            }
        for (int it = 0; it < iters; it++) {
            /* which goes first alternates too */
            if (it % 2 == 0) {
                ta[it] = timed_run(pa, b, in, oa);
                tb[it] = timed_run(pb, b, in, ob);
            } else {
                tb[it] = timed_run(pb, b, in, ob);
                ta[it] = timed_run(pa, b, in, oa);
            }
            ratio[it] = tb[it] / ta[it];
        }
        qsort(ta, (size_t)iters, sizeof(double), bench_cmp_double);
        qsort(tb, (size_t)iters, sizeof(double), bench_cmp_double);
        qsort(ratio, (size_t)iters, sizeof(double), bench_cmp_double);
        printf("{\"model\": \"%s\", \"batch\": %d, \"threads\": %d, \"a\": \"%s\", \"b\": \"%s\", "
               "\"a_median_ms\": %.2f, \"a_min_ms\": %.2f, \"b_median_ms\": %.2f, \"b_min_ms\": "
               "%.2f, \"b_over_a\": %.3f, \"max_rel_diff\": %.2g}\n",
               strrchr(path, '/') ? strrchr(path, '/') + 1 : path, b, threads, argv[i], argv[i + 1],
               ta[iters / 2], ta[0], tb[iters / 2], tb[0], ratio[iters / 2],
               scale > 0 ? diff / scale : diff);
        fflush(stdout);
    }
    free(ta);
    free(tb);
    free(ratio);
    free(in);
    for (int k = 0; k < n_out; k++) {
        free(oa[k]);
        free(ob[k]);
    }
    free(oa);
    free(ob);
    wk_plan_free(pa);
    wk_plan_free(pb);
    return 0;
}
