/* squish-conv-kernels: one convolution (3x3 unless asked) in each of the layouts oneDNN
 * offers it on this CPU, timed alone: channel blocks (nChw8c / nChw16c,
 * what the cpu backend's "any" picks), plain NCHW (oneDNN's im2col and
 * GEMM) and channels last. Which kernel is fastest differs by shape; the
 * cpu backend takes one layout for every conv of a net, so this is what a
 * per-layer choice would gain (bench/RESULTS.md, "oneDNN's conv kernels on
 * AVX2, layer by layer").
 *
 *   squish-conv-kernels [--batch B] [--reps N] IC:OC:HW:STRIDE[:K]...
 *
 * K: the kernel's size (3 unless given; pad K / 2).
 * Prints one line per shape and layout: the implementation oneDNN chose,
 * the best of N runs in ms, and GFLOP/s. Threads: OMP_NUM_THREADS. */
#include <oneapi/dnnl/dnnl.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* Times one conv; its layouts are src_tag and dst_tag for the activations
 * and wei_tag for the weights (any: oneDNN's choice). Returns nonzero
 * when oneDNN has no kernel for them. */
static int time_conv(dnnl_engine_t eng, dnnl_stream_t st, int mb, int ic, int oc, int hw,
                     int stride, int k, dnnl_format_tag_t act_tag, dnnl_format_tag_t wei_tag,
                     const char *name, int reps)
{
    int ohw = (hw + 2 * (k / 2) - k) / stride + 1;
    dnnl_dims_t sd = {mb, ic, hw, hw}, wd = {oc, ic, k, k}, dd = {mb, oc, ohw, ohw};
    dnnl_dims_t strides = {stride, stride}, pad = {k / 2, k / 2};
    dnnl_memory_desc_t smd, wmd, dmd;
    dnnl_convolution_desc_t cd;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_t prim = NULL;
    dnnl_memory_t mem[3] = {NULL, NULL, NULL};
    int rc = 1;
    if (dnnl_memory_desc_init_by_tag(&smd, 4, sd, dnnl_f32, act_tag) != dnnl_success ||
        dnnl_memory_desc_init_by_tag(&wmd, 4, wd, dnnl_f32, wei_tag) != dnnl_success ||
        dnnl_memory_desc_init_by_tag(&dmd, 4, dd, dnnl_f32, act_tag) != dnnl_success ||
        dnnl_convolution_forward_desc_init(&cd, dnnl_forward_inference, dnnl_convolution_direct,
                                           &smd, &wmd, NULL, &dmd, strides, pad,
                                           pad) != dnnl_success ||
        dnnl_primitive_desc_create(&pd, &cd, NULL, eng, NULL) != dnnl_success)
        goto out;
    const char *impl = "?";
    dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
    if (strncmp(impl, "ref", 3) == 0) {
        /* oneDNN's reference code: orders of magnitude slower, not timed */
        printf("{\"batch\": %d, \"ic\": %d, \"oc\": %d, \"hw\": %d, \"stride\": %d, "
               "\"layout\": \"%s\", \"impl\": \"%s\", \"best_ms\": null}\n",
               mb, ic, oc, hw, stride, name, impl);
        rc = 0;
        goto out;
    }
    const dnnl_query_t q[3] = {dnnl_query_src_md, dnnl_query_weights_md, dnnl_query_dst_md};
    for (int i = 0; i < 3; i++) {
        const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md(pd, q[i], 0);
        if (dnnl_memory_create(&mem[i], md, eng, DNNL_MEMORY_ALLOCATE) != dnnl_success)
            goto out;
        void *h = NULL;
        dnnl_memory_get_data_handle(mem[i], &h);
        memset(h, 0, dnnl_memory_desc_get_size(md));
    }
    if (dnnl_primitive_create(&prim, pd) != dnnl_success)
        goto out;
    dnnl_exec_arg_t args[3] = {
        {DNNL_ARG_SRC, mem[0]}, {DNNL_ARG_WEIGHTS, mem[1]}, {DNNL_ARG_DST, mem[2]}};
    double best = 1e30;
    for (int r = 0; r < reps + 2; r++) {
        double t0 = now_ms();
        dnnl_primitive_execute(prim, st, 3, args);
        dnnl_stream_wait(st);
        double t = now_ms() - t0;
        if (r >= 2 && t < best)
            best = t;
    }
    double gflop = 2.0 * mb * oc * ohw * ohw * (double)ic * k * k / 1e9;
    printf("{\"batch\": %d, \"ic\": %d, \"oc\": %d, \"hw\": %d, \"stride\": %d, \"layout\": "
           "\"%s\", \"impl\": \"%s\", \"best_ms\": %.3f, \"gflops\": %.1f}\n",
           mb, ic, oc, hw, stride, name, impl, best, gflop / best * 1e3);
    fflush(stdout);
    rc = 0;
out:
    dnnl_primitive_destroy(prim);
    dnnl_primitive_desc_destroy(pd);
    for (int i = 0; i < 3; i++)
        dnnl_memory_destroy(mem[i]);
    return rc;
}

int main(int argc, char **argv)
{
    int mb = 1, reps = 7, n = 0;
    dnnl_engine_t eng;
    dnnl_stream_t st;
    if (dnnl_engine_create(&eng, dnnl_cpu, 0) != dnnl_success ||
        dnnl_stream_create(&st, eng, dnnl_stream_default_flags) != dnnl_success) {
        fprintf(stderr, "no oneDNN cpu engine\n");
        return 1;
    }
    for (int i = 1; i < argc; i++) {
        int ic, oc, hw, s, k = 3;
        if (strcmp(argv[i], "--batch") == 0 && i + 1 < argc) {
            mb = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
            reps = atoi(argv[++i]);
        } else if (sscanf(argv[i], "%d:%d:%d:%d:%d", &ic, &oc, &hw, &s, &k) >= 4 && mb > 0 &&
                   ic > 0 && oc > 0 && hw > 0 && s > 0 && k > 0) {
            struct {
                dnnl_format_tag_t act, wei;
                const char *name;
            } ways[] = {{dnnl_nChw8c, dnnl_format_tag_any, "nChw8c"},
                        {dnnl_nChw16c, dnnl_format_tag_any, "nChw16c"},
                        {dnnl_nchw, dnnl_oihw, "nchw"},
                        {dnnl_nhwc, dnnl_format_tag_any, "nhwc"}};
            for (size_t w = 0; w < sizeof(ways) / sizeof(ways[0]); w++)
                if (time_conv(eng, st, mb, ic, oc, hw, s, k, ways[w].act, ways[w].wei, ways[w].name,
                              reps) != 0)
                    printf("{\"ic\": %d, \"oc\": %d, \"hw\": %d, \"layout\": \"%s\", \"impl\": "
                           "null}\n",
                           ic, oc, hw, ways[w].name);
            n++;
        } else {
            fprintf(stderr,
                    "usage: %s [--batch B] [--reps N] IC:OC:HW:STRIDE[:K]... (a KxK conv, 3 "
                    "unless given, pad K / 2)\n",
                    argv[0]);
            return 2;
        }
    }
    dnnl_stream_destroy(st);
    dnnl_engine_destroy(eng);
    return n > 0 ? 0 : 2;
}
