/* squish-cpu-bench: latency and throughput of the cpu backend on ONNX
 * models (torchvision exports of scripts/export_models.py).
 *
 *   squish-cpu-bench [--device SPEC] [--threads N] [--iters N] [--batch B]... MODEL.onnx...
 *
 * For each model and batch size: one plan for the largest batch, warm-up
 * runs, then --iters timed runs; prints one JSON line per (model, batch)
 * with mean/median/min latency in ms, images/s, and the process CPU time
 * per run (cpu_ms: on a loaded machine the work done, apart from the waits
 * for a core). bench/cpu_bench.sh runs it side by side with torch.
 *
 *   squish-cpu-bench --input IN.f32 --output OUT.f32 [--batch B] MODEL.onnx
 *
 * also checks the model as an upload does (import and mdb_model_info),
 * runs IN.f32 (raw float32, B images, B the first --batch) once and writes
 * the outputs, concatenated, to OUT.f32 before timing: what
 * bench/torchvision_all.py compares with torch. --device cuda:0 plans on
 * the CUDA backend instead (the engine field then says "squish-cuda"):
 * its outputs against the cpu's, and its latency, on a GPU machine.
 * --gap-ms G sleeps G ms before each timed run, as a live worker idles
 * between batches (bench/omp_wait.py: what the threads' wait policy costs
 * when they went to sleep); the sleeps are not timed. --trace writes each
 * timed run's ms, in order, to stderr.
 *
 * --precision fp32|tf32|fp16|bf16 asks the plan for that arithmetic (the
 * JSON line's "runs" says what the backend runs); --check B IN.f32 OUT.f32
 * (repeatable, up to 4) runs IN.f32 at batch B and writes the outputs, as
 * --input/--output do, for several batch sizes out of one plan: what
 * bench/gpu/run compares with torch. "backend_median_ms" is the time in
 * the backend alone (wk_plan_last_run_ns: on cuda the copies in and out of
 * its pinned buffers and the compute), without the copy of the caller's
 * input into the plan's input buffer that a served batch never makes.
 *
 * --pixels (a model that takes images): per batch size also runs random
 * uint8 pixels as a served JPEG batch does (wk_plan_run_pixels: on cuda
 * the bytes go over and are normalized on the GPU) and as the host would
 * do it (normalized here, then wk_plan_run), each --iters times, and
 * prints "pixels_median_ms", "pixels_host_median_ms" and "pixels_rel", the
 * largest |device - host| over the largest |host| of the outputs; and the
 * same for a UINT8 tensor's rows (wk_plan_run_u8): "u8_median_ms",
 * "u8_host_median_ms", "u8_rel". */
#include <mdb_graph.h>
#include <sq.h>
#include <wk_exec.h>

#include "bench_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Runs the raw float32 images of in_path at batch and writes every
 * output, one after the other, to out_path. */
static int run_io(wk_plan_t *p, const char *path, int batch, const char *in_path,
                  const char *out_path)
{
    size_t len = 0;
    float *in = bench_slurp(in_path, &len);
    int64_t want = wk_plan_input_elems(p, 0) * batch * (int64_t)sizeof(float);
    if (in == NULL || (int64_t)len != want) {
        fprintf(stderr, "%s: %s holds %zu bytes, not %lld\n", path, in_path, len, (long long)want);
        free(in);
        return 1;
    }
    int n_out = wk_plan_n_outputs(p);
    float *outs[8];
    for (int o = 0; o < n_out; o++)
        outs[o] = malloc((size_t)(wk_plan_output_elems(p, o) * batch) * sizeof(float));
    int rc = wk_plan_run(p, batch, (const float *[]){in}, outs);
    if (rc != 0)
        fprintf(stderr, "%s: run: %s\n", path, wk_plan_errmsg(p));
    FILE *f = rc == 0 ? fopen(out_path, "wb") : NULL;
    for (int o = 0; f != NULL && o < n_out; o++) {
        size_t n = (size_t)(wk_plan_output_elems(p, o) * batch);
        if (fwrite(outs[o], sizeof(float), n, f) != n)
            rc = 1;
    }
    if (rc == 0 && (f == NULL || fclose(f) != 0)) {
        fprintf(stderr, "%s: cannot write %s\n", path, out_path);
        rc = 1;
    }
    for (int o = 0; o < n_out; o++)
        free(outs[o]);
    free(in);
    return rc;
}

/* The largest |a - b| over the largest |b|. */
static double rel_diff(const float *a, const float *b, int64_t n)
{
    double d = 0, m = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = a[i] > b[i] ? (double)a[i] - b[i] : (double)b[i] - a[i];
        double v = b[i] > 0 ? (double)b[i] : -(double)b[i];
        d = e > d ? e : d;
        m = v > m ? v : m;
    }
    return m > 0 ? d / m : d;
}

/* --pixels at batch b: the device's way and the host's, timed and
 * compared (see the top); the fields go on the JSON line. */
static int bench_pixels(wk_plan_t *p, const char *path, int b, int iters, char *fields, size_t len)
{
    int h = 0, w = 0, nhwc = 0;
    if (!wk_plan_image_input(p, &h, &w, &nhwc) || wk_plan_n_inputs(p) != 1) {
        snprintf(fields, len, ", \"pixels\": \"the model does not take images\"");
        return 0;
    }
    int64_t per = (int64_t)h * w * 3, row = wk_plan_row_elems(p),
            in_per = wk_plan_input_elems(p, 0);
    uint8_t *px = malloc((size_t)(per * b));
    float *norm = malloc((size_t)(in_per * b) * sizeof(float));
    float *dev = malloc((size_t)(row * b) * sizeof(float));
    float *host = malloc((size_t)(row * b) * sizeof(float));
    double *t_dev = malloc((size_t)iters * sizeof(double) * 4), *t_host = t_dev + iters;
    double *t_u8 = t_host + iters, *t_u8h = t_u8 + iters;
    uint32_t seed = 7;
    for (int64_t i = 0; i < per * b; i++) {
        seed = seed * 1103515245u + 12345u;
        px[i] = (uint8_t)(seed >> 24);
    }
    const wk_pixel_norm_t nm = WK_PIXEL_NORM_IMAGENET;
    double rel = 0, rel_u8 = 0;
    int rc = 0;
    for (int it = 0; it < iters && rc == 0; it++) {
        int64_t s = sq_now_ns();
        rc |= wk_plan_run_pixels(p, b, px, dev);
        t_dev[it] = (double)(sq_now_ns() - s) / 1e6;
        s = sq_now_ns();
        for (int64_t im = 0; im < b; im++)
            for (int64_t q = 0; q < (int64_t)h * w; q++)
                for (int c = 0; c < 3; c++) {
                    float v = ((float)px[im * per + q * 3 + c] / 255.0f - nm.mean[c]) / nm.std[c];
                    norm[im * per + (nhwc ? q * 3 + c : c * (int64_t)h * w + q)] = v;
                }
        rc |= wk_plan_run_rows(p, b, (const float *[]){norm}, host);
        t_host[it] = (double)(sq_now_ns() - s) / 1e6;
        if (it == 0)
            rel = rel_diff(dev, host, row * b);
        /* the same bytes as a UINT8 tensor's rows */
        s = sq_now_ns();
        rc |= wk_plan_run_u8(p, b, px, dev);
        t_u8[it] = (double)(sq_now_ns() - s) / 1e6;
        s = sq_now_ns();
        for (int64_t i = 0; i < in_per * b; i++)
            norm[i] = (float)px[i];
        rc |= wk_plan_run_rows(p, b, (const float *[]){norm}, host);
        t_u8h[it] = (double)(sq_now_ns() - s) / 1e6;
        if (it == 0)
            rel_u8 = rel_diff(dev, host, row * b);
    }
    if (rc != 0)
        fprintf(stderr, "%s: pixels: %s\n", path, wk_plan_errmsg(p));
    double *ts[4] = {t_dev, t_host, t_u8, t_u8h};
    for (int k = 0; k < 4; k++)
        qsort(ts[k], (size_t)iters, sizeof(double), bench_cmp_double);
    snprintf(fields, len,
             ", \"pixels_median_ms\": %.3f, \"pixels_host_median_ms\": %.3f, \"pixels_rel\": "
             "%.3g, \"u8_median_ms\": %.3f, \"u8_host_median_ms\": %.3f, \"u8_rel\": %.3g",
             t_dev[iters / 2], t_host[iters / 2], rel, t_u8[iters / 2], t_u8h[iters / 2], rel_u8);
    free(px);
    free(norm);
    free(dev);
    free(host);
    free(t_dev);
    return rc != 0;
}

/* --trace: each timed run's ms, in order, on stderr (how the host's speed
 * moves through a sustained run). */
static int trace_runs;
/* --pixels */
static int pixels_too;

#define MAX_CHECKS 4

typedef struct {
    int batch;
    const char *in_path, *out_path;
} io_check_t;

static int bench_model(const char *path, const sq_device_t *dev, const int *batches, int n_batches,
                       int threads, int iters, int warmup, double gap_ms, const io_check_t *checks,
                       int n_checks, wk_precision_t precision)
{
    size_t len;
    void *bytes = bench_slurp(path, &len);
    if (bytes == NULL) {
        fprintf(stderr, "cannot read %s\n", path);
        return 1;
    }
    mdb_graph_t *g = NULL;
    mdb_import_error_t err;
    if (mdb_onnx_import(bytes, len, &g, &err) != 0) {
        fprintf(stderr, "%s: import: %s\n", path, err.detail);
        free(bytes);
        return 1;
    }
    free(bytes);
    mdb_model_info_t info;
    char why[512];
    if (n_checks > 0 && mdb_model_info(g, &info, why, sizeof(why)) != 0) {
        fprintf(stderr, "%s: upload: %s\n", path, why);
        mdb_graph_free(g);
        return 1;
    }
    int max_batch = 1;
    for (int i = 0; i < n_batches; i++)
        max_batch = batches[i] > max_batch ? batches[i] : max_batch;
    for (int i = 0; i < n_checks; i++)
        max_batch = checks[i].batch > max_batch ? checks[i].batch : max_batch;
    wk_plan_opts_t o = wk_plan_opts_default();
    o.precision = precision;
    o.max_batch = max_batch;
    o.threads = threads;
    o.backend = dev->kind;
    o.device_index = dev->index;
    wk_plan_t *p = NULL;
    int64_t t0 = sq_now_ns();
    int rc = wk_plan_create(g, &o, &p, why, sizeof(why));
    double plan_ms = (double)(sq_now_ns() - t0) / 1e6;
    mdb_graph_free(g);
    if (rc != 0) {
        fprintf(stderr, "%s: plan: %s\n", path, why);
        return 1;
    }
    for (int i = 0; i < n_checks; i++) {
        if (run_io(p, path, checks[i].batch, checks[i].in_path, checks[i].out_path) != 0) {
            wk_plan_free(p);
            return 1;
        }
    }
    /* Every output its buffer: a detector's boxes and scores (one buffer
     * for a two-output model had the second written through a stack
     * slot past the array). */
    int64_t in_per = wk_plan_input_elems(p, 0);
    int n_out = wk_plan_n_outputs(p);
    float *in = malloc((size_t)(in_per * max_batch) * sizeof(float));
    float **out = malloc((size_t)n_out * sizeof(float *));
    for (int k = 0; k < n_out; k++)
        out[k] = malloc((size_t)(wk_plan_output_elems(p, k) * max_batch) * sizeof(float));
    for (int64_t i = 0; i < in_per * max_batch; i++)
        in[i] = (float)((i * 2654435761u) % 1000) / 1000.0f;
    double *ms = malloc((size_t)iters * sizeof(double));
    double *backend_ms = malloc((size_t)iters * sizeof(double));
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    for (int bi = 0; bi < n_batches; bi++) {
        int b = batches[bi];
        for (int w = 0; w < warmup; w++)
            wk_plan_run(p, b, (const float *[]){in}, out);
        double sum = 0;
        struct timespec c0, c1,
            gap = {(time_t)(gap_ms / 1e3),
                   (long)((gap_ms - (double)(time_t)(gap_ms / 1e3) * 1e3) * 1e6)};
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
        for (int it = 0; it < iters; it++) {
            if (gap_ms > 0)
                nanosleep(&gap, NULL);
            int64_t s = sq_now_ns();
            if (wk_plan_run(p, b, (const float *[]){in}, out) != 0) {
                fprintf(stderr, "%s: run: %s\n", path, wk_plan_errmsg(p));
                return 1;
            }
            ms[it] = (double)(sq_now_ns() - s) / 1e6;
            backend_ms[it] = (double)wk_plan_last_run_ns(p) / 1e6;
            sum += ms[it];
        }
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
        if (trace_runs) {
            fprintf(stderr, "# runs_ms batch=%d:", b);
            for (int it = 0; it < iters; it++)
                fprintf(stderr, " %.2f", ms[it]);
            fprintf(stderr, "\n");
        }
        double cpu_ms =
            ((double)(c1.tv_sec - c0.tv_sec) * 1e3 + (double)(c1.tv_nsec - c0.tv_nsec) / 1e6) /
            iters;
        qsort(ms, (size_t)iters, sizeof(double), bench_cmp_double);
        qsort(backend_ms, (size_t)iters, sizeof(double), bench_cmp_double);
        double mean = sum / iters;
        char px_fields[512] = "";
        if (pixels_too && bench_pixels(p, path, b, iters, px_fields, sizeof(px_fields)) != 0)
            return 1;
        printf("{\"engine\": \"%s\", \"model\": \"%.*s\", \"batch\": %d, \"threads\": %d, "
               "\"mean_ms\": %.2f, \"median_ms\": %.2f, \"min_ms\": %.2f, \"images_per_s\": %.1f, "
               "\"cpu_ms\": %.2f, \"plan_ms\": %.0f, \"memory_mb\": %.1f, \"backend_median_ms\": "
               "%.3f, \"precision\": \"%s\", "
               "\"runs\": \"%s\"%s}\n",
               dev->kind == SQ_DEV_CPU ? "squish" : "squish-cuda",
               (int)(strlen(base) - (strstr(base, ".onnx") ? 5 : 0)), base, b, threads, mean,
               ms[iters / 2], ms[0], b * 1000.0 / ms[iters / 2], cpu_ms, plan_ms,
               (double)wk_plan_memory_bytes(p) / (1 << 20), backend_ms[iters / 2],
               wk_precision_name(precision), wk_precision_name(wk_plan_precision(p)), px_fields);
        fflush(stdout);
    }
    free(ms);
    free(backend_ms);
    free(in);
    for (int k = 0; k < n_out; k++)
        free(out[k]);
    free(out);
    wk_plan_free(p);
    return 0;
}

int main(int argc, char **argv)
{
    int batches[16], n_batches = 0, threads = 0, iters = 20, warmup = 3, rc = 0, n_checks = 0;
    double gap_ms = 0;
    const char *in_path = NULL, *out_path = NULL;
    io_check_t checks[MAX_CHECKS + 1];
    wk_precision_t precision = WK_PRECISION_FP32;
    sq_device_t dev;
    sq_device_parse("cpu", &dev);
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (strcmp(argv[i], "--device") == 0 && i + 1 < argc) {
            if (sq_device_parse(argv[++i], &dev) != 0 || dev.kind == SQ_DEV_EMU) {
                fprintf(stderr, "--device: cpu or cuda:N, not %s\n", argv[i]);
                return 2;
            }
        } else if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc)
            iters = atoi(argv[++i]);
        else if (strcmp(argv[i], "--warmup") == 0 && i + 1 < argc)
            warmup = atoi(argv[++i]);
        else if (strcmp(argv[i], "--gap-ms") == 0 && i + 1 < argc)
            gap_ms = atof(argv[++i]);
        else if (strcmp(argv[i], "--pixels") == 0)
            pixels_too = 1;
        else if (strcmp(argv[i], "--trace") == 0)
            trace_runs = 1;
        else if (strcmp(argv[i], "--log-level") == 0 && i + 1 < argc) {
            sq_log_level_t lv;
            if (sq_log_level_parse(argv[++i], &lv) != 0) {
                fprintf(stderr, "--log-level: debug, info, warn or error, not %s\n", argv[i]);
                return 2;
            }
            sq_log_set_level(lv);
        } else if (strcmp(argv[i], "--input") == 0 && i + 1 < argc)
            in_path = argv[++i];
        else if (strcmp(argv[i], "--output") == 0 && i + 1 < argc)
            out_path = argv[++i];
        else if (strcmp(argv[i], "--check") == 0 && i + 3 < argc && n_checks < MAX_CHECKS &&
                 atoi(argv[i + 1]) >= 1) {
            checks[n_checks++] = (io_check_t){atoi(argv[i + 1]), argv[i + 2], argv[i + 3]};
            i += 3;
        } else if (strcmp(argv[i], "--precision") == 0 && i + 1 < argc) {
            int pr = wk_precision_parse(argv[++i]);
            if (pr < 0) {
                fprintf(stderr, "--precision: fp32, tf32, fp16 or bf16, not %s\n", argv[i]);
                return 2;
            }
            precision = (wk_precision_t)pr;
        } else if (strcmp(argv[i], "--batch") == 0 && i + 1 < argc && n_batches < 16)
            batches[n_batches++] = atoi(argv[++i]);
        else {
            fprintf(stderr,
                    "usage: %s [--device SPEC] [--threads N] [--iters N] [--warmup N] [--gap-ms G] "
                    "[--trace] [--log-level L] "
                    "[--batch B]... "
                    "[--precision P] [--input IN.f32 --output OUT.f32] [--check B IN OUT]... "
                    "MODEL.onnx...\n",
                    argv[0]);
            return 2;
        }
    }
    if (n_batches == 0) {
        batches[n_batches++] = 1;
        batches[n_batches++] = 8;
    }
    if (in_path != NULL && out_path != NULL)
        checks[n_checks++] = (io_check_t){batches[0], in_path, out_path};
    if (iters < 1 || i == argc || (in_path == NULL) != (out_path == NULL) ||
        (n_checks > 0 && argc - i != 1)) {
        fprintf(stderr, "usage: %s [--threads N] [--iters N] [--batch B]... MODEL.onnx...\n",
                argv[0]);
        return 2;
    }
    for (; i < argc; i++)
        rc |= bench_model(argv[i], &dev, batches, n_batches, threads, iters, warmup, gap_ms, checks,
                          n_checks, precision);
    return rc;
}
