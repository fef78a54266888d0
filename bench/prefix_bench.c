/* squish-prefix-bench: prefix-batched execution against separate models.
 *
 *   squish-prefix-bench [--variants N] [--threads N] [--iters N] [--batch B]... MODEL.onnx
 *
 * Makes N variants of MODEL that share every layer but the last (each gets
 * its own final layer: the weights of the model's last node scaled and
 * shifted per variant, as fine-tuning only the classifier would), then
 * serves mixed traffic: each round is B requests whose models are drawn
 * uniformly at random (fixed seed), rows of one model adjacent, as the
 * gateway sorts them. Two ways, alternating round by round so that both see
 * the same machine load:
 *   separate  every variant a full model; each runs its rows of the round
 *             as one batch (the batch the same latency window gives it);
 *   group     one prefix-batched group: the backbone once over all B rows,
 *             then each variant's last layer on its rows.
 * Prints one JSON line per (mode, B) with the median round time, images/s
 * and process CPU time per round, then the memory of each way. */
#include <mdb_graph.h>
#include <sq.h>
#include <wk_exec.h>

#include "bench_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_VARIANTS 64
#define MAX_BATCHES 16

static double now_ms(clockid_t c)
{
    struct timespec t;
    clock_gettime(c, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* Variant k: the last node's float constants scaled by 1 + k/10 and
 * shifted by k/100. */
static void make_variant(mdb_graph_t *g, int k)
{
    const mdb_node_t *last = &g->nodes[g->n_nodes - 1];
    for (int i = 0; i < last->n_inputs; i++) {
        if (last->inputs[i] < 0)
            continue;
        mdb_tensor_t *t = &g->tensors[last->inputs[i]];
        if (t->data == NULL || t->dtype != MDB_DT_FLOAT)
            continue;
        float *w = t->data;
        for (size_t e = 0; e < t->nbytes / sizeof(float); e++)
            w[e] = w[e] * (1.0f + 0.1f * (float)k) + 0.01f * (float)k;
    }
}

int main(int argc, char **argv)
{
    int variants = 8, threads = 0, iters = 9, batches[MAX_BATCHES], n_batches = 0;
    const char *path = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--variants") == 0 && i + 1 < argc)
            variants = atoi(argv[++i]);
        else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc)
            iters = atoi(argv[++i]);
        else if (strcmp(argv[i], "--batch") == 0 && i + 1 < argc && n_batches < MAX_BATCHES)
            batches[n_batches++] = atoi(argv[++i]);
        else if (argv[i][0] != '-')
            path = argv[i];
        else {
            fprintf(stderr, "usage: squish-prefix-bench [--variants N] [--threads N] "
                            "[--iters N] [--batch B]... MODEL.onnx\n");
            return 2;
        }
    }
    if (path == NULL || variants < 1 || variants > MAX_VARIANTS || iters < 1) {
        fprintf(stderr, "squish-prefix-bench: need MODEL.onnx, 1..%d variants\n", MAX_VARIANTS);
        return 2;
    }
    if (n_batches == 0) {
        const int def[] = {8, 16, 32, 64};
        for (n_batches = 0; n_batches < 4; n_batches++)
            batches[n_batches] = def[n_batches];
    }
    int max_batch = 1;
    for (int i = 0; i < n_batches; i++)
        max_batch = batches[i] > max_batch ? batches[i] : max_batch;

    size_t len;
    void *bytes = bench_slurp(path, &len);
    if (bytes == NULL) {
        fprintf(stderr, "cannot read %s\n", path);
        return 1;
    }
    mdb_graph_t *g[MAX_VARIANTS];
    const char *cuts[MAX_VARIANTS];
    for (int k = 0; k < variants; k++) {
        mdb_import_error_t err;
        if (mdb_onnx_import(bytes, len, &g[k], &err) != 0) {
            fprintf(stderr, "%s: import: %s\n", path, err.detail);
            return 1;
        }
        make_variant(g[k], k);
    }
    free(bytes);
    /* The cut: found by the model DB's prefix matcher, as on upload. */
    int cut_tensor = -1;
    if (variants > 1) {
        mdb_prefix_t pre;
        if (mdb_prefix_find(g[0], g[1], &pre) != 0 || !pre.found) {
            fprintf(stderr, "the variants share no prefix\n");
            return 1;
        }
        cut_tensor = pre.tensor_a;
    } else {
        cut_tensor = g[0]->nodes[g[0]->n_nodes - 1].inputs[0];
    }
    for (int k = 0; k < variants; k++)
        cuts[k] = g[k]->tensors[cut_tensor].name;

    wk_plan_opts_t o = wk_plan_opts_default();
    o.max_batch = max_batch;
    o.threads = threads;
    char why[512];
    wk_plan_t *sep[MAX_VARIANTS];
    uint64_t sep_bytes = 0;
    for (int k = 0; k < variants; k++) {
        if (wk_plan_create(g[k], &o, &sep[k], why, sizeof(why)) != 0) {
            fprintf(stderr, "plan: %s\n", why);
            return 1;
        }
        sep_bytes += wk_plan_memory_bytes(sep[k]);
    }
    wk_group_t *grp = NULL;
    if (wk_group_create((const mdb_graph_t *const *)g, cuts, variants, &o, &grp, why,
                        sizeof(why)) != 0) {
        fprintf(stderr, "group: %s\n", why);
        return 1;
    }
    int64_t in_elems = wk_plan_input_elems(sep[0], 0), out_elems = wk_plan_output_elems(sep[0], 0);
    float *in = malloc(sizeof(float) * (size_t)(in_elems * max_batch));
    float *out = malloc(sizeof(float) * (size_t)(out_elems * max_batch));
    for (int64_t i = 0; i < in_elems * max_batch; i++)
        in[i] = (float)((i * 2654435761u) % 1000) / 1000.0f;

    uint32_t seed = 42;
    for (int bi = 0; bi < n_batches; bi++) {
        int B = batches[bi];
        double *t[2] = {calloc((size_t)iters, sizeof(double)),
                        calloc((size_t)iters, sizeof(double))};
        double cpu[2] = {0, 0};
        int member[1024], count[MAX_VARIANTS];
        for (int it = -1; it < iters; it++) { /* it = -1: warm-up */
            memset(count, 0, sizeof(count));
            for (int r = 0; r < B; r++) {
                seed = seed * 1103515245u + 12345u;
                count[(seed >> 16) % (uint32_t)variants]++;
            }
            int r = 0;
            for (int k = 0; k < variants; k++)
                for (int c = 0; c < count[k]; c++)
                    member[r++] = k;
            for (int mode = 0; mode < 2; mode++) {
                double w0 = now_ms(CLOCK_MONOTONIC), c0 = now_ms(CLOCK_PROCESS_CPUTIME_ID);
                if (mode == 0) {
                    int at = 0;
                    for (int k = 0; k < variants; k++) {
                        if (count[k] == 0)
                            continue;
                        const float *ins[1] = {in + (size_t)at * (size_t)in_elems};
                        float *outs[1] = {out + (size_t)at * (size_t)out_elems};
                        if (wk_plan_run(sep[k], count[k], ins, outs) != 0) {
                            fprintf(stderr, "run: %s\n", wk_plan_errmsg(sep[k]));
                            return 1;
                        }
                        at += count[k];
                    }
                } else if (wk_group_run(grp, B, in, member, out, (size_t)out_elems) != 0) {
                    fprintf(stderr, "group run: %s\n", wk_group_errmsg(grp));
                    return 1;
                }
                if (it >= 0) {
                    t[mode][it] = now_ms(CLOCK_MONOTONIC) - w0;
                    cpu[mode] += now_ms(CLOCK_PROCESS_CPUTIME_ID) - c0;
                }
            }
        }
        for (int mode = 0; mode < 2; mode++) {
            qsort(t[mode], (size_t)iters, sizeof(double), bench_cmp_double);
            double med = t[mode][iters / 2];
            printf("{\"mode\": \"%s\", \"variants\": %d, \"batch\": %d, \"median_ms\": %.2f, "
                   "\"min_ms\": %.2f, \"images_per_s\": %.1f, \"cpu_ms\": %.2f}\n",
                   mode == 0 ? "separate" : "group", variants, B, med, t[mode][0], B * 1000.0 / med,
                   cpu[mode] / iters);
            free(t[mode]);
        }
        fflush(stdout);
    }
    printf("{\"memory_mb\": {\"separate\": %.1f, \"group\": %.1f}, \"cut\": \"%s\"}\n",
           (double)sep_bytes / (1 << 20), (double)wk_group_memory_bytes(grp) / (1 << 20), cuts[0]);
    wk_group_free(grp);
    for (int k = 0; k < variants; k++) {
        wk_plan_free(sep[k]);
        mdb_graph_free(g[k]);
    }
    free(in);
    free(out);
    return 0;
}
