/* Preprocessing benchmark: JPEG -> model input (uint8 HWC RGB), one core.
 *
 *   squish-preprocess-bench [--iters N] [--size S] [--jpeg FILE]...
 *
 * Inputs: a 640x480 photo-like frame generated in-process (tjCompress2,
 * quality 90, 4:2:0), Debian's grace_hopper.jpg when present, and any
 * --jpeg files. Each is run through gw_image_to_rgb to S x S (224) three
 * ways, A/B in one run: DCT scaling with the YUV planes path (decode to
 * Y/Cb/Cr planes, colour conversion folded into the resize: the default),
 * DCT scaling with the RGB path (decode to packed RGB, then resize), and no
 * DCT scaling (RGB path); its two stages (decode, resize) are timed apart.
 * The reference row is a plain full-size tjDecompress2 to RGB of the same
 * file, and the ratio of each path to it is printed after the table. Prints one markdown table row
 * per case: CPU time per image (the per-core cost, robust on a shared machine: mean, and the best
 * mean of 100 consecutive images, the least disturbed by neighbours) and wall time (mean, p50, p99)
 * over N runs after a warm-up. The goal of issue 5: 640x480 -> 224x224 in <= 1.2 ms per image per
 * core. */
#include "bench_util.h"

#include <gw_image.h>
#include <sq.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <turbojpeg.h>

#define HOPPER "/usr/share/matplotlib/mpl-data/sample_data/grace_hopper.jpg"
#define MAX_INPUTS 8

typedef struct {
    char name[96];
    uint8_t *data;
    size_t len;
} input_t;

/* A frame with smooth gradients, edges and sensor-like noise, so that it
 * compresses like a camera frame (about 60 KB at quality 90). */
static uint8_t *make_frame(int w, int h)
{
    uint8_t *p = sq_xmalloc((size_t)w * h * 3);
    uint32_t seed = 2024;
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            seed = seed * 1664525u + 1013904223u;
            int noise = (int)(seed >> 29) - 4;
            double sx = 60.0 * sin(x * 0.021), sy = 50.0 * cos(y * 0.017);
            int box = ((x / 80) + (y / 60)) % 2 ? 35 : -35;
            int ring = ((int)hypot(x - 320.0, y - 240.0) / 24) % 2 ? 20 : -20;
            int v[3] = {128 + (int)sx + box + noise, 118 + (int)sy + ring + noise,
                        100 + (int)(sx * 0.5 - sy * 0.5) - box / 2 + noise};
            uint8_t *q = p + ((size_t)y * w + x) * 3;
            for (int c = 0; c < 3; c++)
                q[c] = (uint8_t)(v[c] < 0 ? 0 : v[c] > 255 ? 255 : v[c]);
        }
    return p;
}

static int load_file(const char *path, input_t *in)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return -1;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    in->data = sq_xmalloc((size_t)n);
    in->len = fread(in->data, 1, (size_t)n, f);
    fclose(f);
    const char *base = strrchr(path, '/');
    snprintf(in->name, sizeof(in->name), "%s", base != NULL ? base + 1 : path);
    return 0;
}

/* CPU time of this thread: on a shared machine the wall clock also counts
 * the time other processes held the core. */
static int64_t cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

typedef struct {
    double mean_ms, p50_ms, p99_ms;
    double best_batch_ms; /* lowest mean over BATCH consecutive images */
} stats_t;

#define BATCH 100

/* The decoder flags gw_image_to_rgb uses, for the stage timings. */
#define PIPELINE_FLAGS (TJFLAG_STOPONWARNING | TJFLAG_LIMITSCANS)

static stats_t summarize(double *ms, int n)
{
    stats_t s = {.best_batch_ms = 1e9};
    for (int i = 0; i < n; i++)
        s.mean_ms += ms[i];
    s.mean_ms /= n;
    for (int b = 0; b + BATCH <= n; b += BATCH) {
        double sum = 0;
        for (int i = b; i < b + BATCH; i++)
            sum += ms[i];
        if (sum / BATCH < s.best_batch_ms)
            s.best_batch_ms = sum / BATCH;
    }
    qsort(ms, (size_t)n, sizeof(double), bench_cmp_double);
    s.p50_ms = ms[n / 2];
    s.p99_ms = ms[(int)(n * 0.99)];
    return s;
}

/* Times the whole of gw_image_to_rgb: wall clock per image (mean, p50,
 * p99) and CPU time per image (mean). */
static void time_pipeline(gw_prep_ctx_t *ctx, const input_t *in, int size, int iters, uint8_t *dst,
                          gw_image_info_t *info, stats_t *wall, stats_t *cpu)
{
    double *wall_ms = sq_xmalloc(sizeof(double) * (size_t)iters);
    double *cpu_ms = sq_xmalloc(sizeof(double) * (size_t)iters);
    char err[256];
    for (int i = -iters / 10; i < iters; i++) {
        int64_t t0 = sq_now_ns(), c0 = cpu_ns();
        int rc = gw_image_to_rgb(ctx, in->data, in->len, size, size, GW_RESIZE_BILINEAR, dst, info,
                                 err, sizeof(err));
        int64_t t1 = sq_now_ns(), c1 = cpu_ns();
        if (rc != 0) {
            fprintf(stderr, "%s: %s\n", in->name, err);
            exit(1);
        }
        if (i >= 0) {
            wall_ms[i] = (double)(t1 - t0) / 1e6;
            cpu_ms[i] = (double)(c1 - c0) / 1e6;
        }
    }
    *wall = summarize(wall_ms, iters);
    *cpu = summarize(cpu_ms, iters);
    free(wall_ms);
    free(cpu_ms);
}

/* Times the two stages apart (CPU ms per image): TurboJPEG decode at the
 * scale the pipeline chose, and the resize of that decoded image. */
static void time_stages(gw_prep_ctx_t *ctx, const input_t *in, const gw_image_info_t *info,
                        int size, int iters, uint8_t *dst, int planes, double *decode_ms,
                        double *resize_ms)
{
    tjhandle tj = tjInitDecompress();
    int w = info->decoded_width, h = info->decoded_height;
    uint8_t *pix = sq_xmalloc((size_t)w * h * 4 + 4096);
    int pf = info->colorspace == TJCS_CMYK || info->colorspace == TJCS_YCCK ? TJPF_CMYK : TJPF_RGB;
    /* the planes path's decode: Y, Cb, Cr planes packed one after another */
    unsigned char *yuv[3] = {pix, NULL, NULL};
    int nplanes = info->subsamp == TJSAMP_GRAY ? 1 : 3;
    for (int c = 1; c < nplanes; c++)
        yuv[c] = yuv[c - 1] + (size_t)tjPlaneWidth(c - 1, w, info->subsamp) *
                                  (size_t)tjPlaneHeight(c - 1, h, info->subsamp);
    int64_t total = 0;
    for (int i = -iters / 10; i < iters; i++) {
        int64_t c0 = cpu_ns();
        int rc = planes ? tjDecompressToYUVPlanes(tj, in->data, (unsigned long)in->len, yuv, w,
                                                  NULL, h, PIPELINE_FLAGS)
                        : tjDecompress2(tj, in->data, (unsigned long)in->len, pix, w, 0, h, pf,
                                        PIPELINE_FLAGS);
        if (rc != 0) {
            fprintf(stderr, "%s: %s\n", in->name, tjGetErrorStr2(tj));
            exit(1);
        }
        if (i >= 0)
            total += cpu_ns() - c0;
    }
    *decode_ms = (double)total / iters / 1e6;
    if (planes) {
        *resize_ms = -1; /* fused with the colour conversion: the rest of the pipeline */
        free(pix);
        tjDestroy(tj);
        return;
    }
    total = 0;
    for (int i = -iters / 10; i < iters; i++) {
        int64_t c0 = cpu_ns();
        if (gw_resize_rgb(ctx, pix, w, h, (size_t)w * 3, dst, size, size, GW_RESIZE_BILINEAR) != 0)
            exit(1);
        if (i >= 0)
            total += cpu_ns() - c0;
    }
    *resize_ms = (double)total / iters / 1e6;
    free(pix);
    tjDestroy(tj);
}

/* The reference: a plain full-size decode to packed RGB (no scaling, no
 * resize), CPU ms per image. */
static stats_t time_plain_decode(const input_t *in, int iters, int *w_out, int *h_out)
{
    tjhandle tj = tjInitDecompress();
    int w = 0, h = 0, ss = 0, cs = 0;
    if (tjDecompressHeader3(tj, in->data, (unsigned long)in->len, &w, &h, &ss, &cs) != 0) {
        fprintf(stderr, "%s: %s\n", in->name, tjGetErrorStr2(tj));
        exit(1);
    }
    int pf = cs == TJCS_CMYK || cs == TJCS_YCCK ? TJPF_CMYK : TJPF_RGB;
    uint8_t *pix = sq_xmalloc((size_t)w * h * 4);
    double *ms = sq_xmalloc(sizeof(double) * (size_t)iters);
    for (int i = -iters / 10; i < iters; i++) {
        int64_t c0 = cpu_ns();
        if (tjDecompress2(tj, in->data, (unsigned long)in->len, pix, w, 0, h, pf, 0) != 0) {
            fprintf(stderr, "%s: %s\n", in->name, tjGetErrorStr2(tj));
            exit(1);
        }
        if (i >= 0)
            ms[i] = (double)(cpu_ns() - c0) / 1e6;
    }
    stats_t st = summarize(ms, iters);
    free(ms);
    free(pix);
    tjDestroy(tj);
    *w_out = w;
    *h_out = h;
    return st;
}

int main(int argc, char **argv)
{
    int iters = 3000, size = 224, ninputs = 0;
    input_t inputs[MAX_INPUTS];
    const char *extra[MAX_INPUTS];
    int nextra = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc) {
            iters = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--size") == 0 && i + 1 < argc) {
            size = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--jpeg") == 0 && i + 1 < argc && nextra < MAX_INPUTS - 2) {
            extra[nextra++] = argv[++i];
        } else {
            fprintf(stderr, "usage: %s [--iters N] [--size S] [--jpeg FILE]...\n", argv[0]);
            return 2;
        }
    }
    if (iters < 10 || size < 1 || size > 4096) {
        fprintf(stderr, "--iters must be >= 10 and --size in 1..4096\n");
        return 2;
    }

    /* the generated frame */
    uint8_t *frame = make_frame(640, 480);
    tjhandle tjc = tjInitCompress();
    unsigned char *jpeg = NULL;
    unsigned long jpeg_len = 0;
    if (tjCompress2(tjc, frame, 640, 0, 480, TJPF_RGB, &jpeg, &jpeg_len, TJSAMP_420, 90, 0) != 0) {
        fprintf(stderr, "tjCompress2: %s\n", tjGetErrorStr2(tjc));
        return 1;
    }
    input_t *gen = &inputs[ninputs++];
    gen->data = sq_xmalloc(jpeg_len);
    memcpy(gen->data, jpeg, jpeg_len);
    gen->len = jpeg_len;
    snprintf(gen->name, sizeof(gen->name), "generated 640x480 q90 4:2:0");
    tjFree(jpeg);
    tjDestroy(tjc);
    free(frame);
    if (load_file(HOPPER, &inputs[ninputs]) == 0)
        ninputs++;
    else
        fprintf(stderr, "note: %s absent, skipped\n", HOPPER);
    for (int i = 0; i < nextra; i++) {
        if (load_file(extra[i], &inputs[ninputs]) != 0) {
            fprintf(stderr, "cannot read %s\n", extra[i]);
            return 1;
        }
        ninputs++;
    }

    gw_prep_limits_t lim = gw_prep_limits_default();
    lim.yuv_planes = 1;
    gw_prep_ctx_t *planes_dct = gw_prep_ctx_new(&lim);
    lim.yuv_planes = 0;
    gw_prep_ctx_t *rgb_dct = gw_prep_ctx_new(&lim);
    lim.dct_scaling = 0;
    gw_prep_ctx_t *rgb_full = gw_prep_ctx_new(&lim);
    gw_prep_ctx_t *ctxs[3] = {planes_dct, rgb_dct, rgb_full};
    const char *paths[3] = {"YUV planes", "RGB", "RGB"};
    uint8_t *dst = sq_xmalloc((size_t)size * size * 3);
    double ratio[MAX_INPUTS][3];
    printf("| input | bytes | path | DCT scaling | decoded | CPU ms/image | best %d | wall mean | "
           "wall p50 | wall p99 | decode CPU ms | resize CPU ms |\n",
           BATCH);
    printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int i = 0; i < ninputs; i++) {
        int pw, ph;
        stats_t plain = time_plain_decode(&inputs[i], iters, &pw, &ph);
        printf("| %s (%dx%d) | %zu | plain full decode to RGB (reference) | - | %dx%d | %.3f | "
               "%.3f | - | - | - | %.3f | - |\n",
               inputs[i].name, pw, ph, inputs[i].len, pw, ph, plain.mean_ms, plain.best_batch_ms,
               plain.mean_ms);
        for (int k = 0; k < 3; k++) {
            gw_prep_ctx_t *ctx = ctxs[k];
            int dct = k < 2;
            gw_image_info_t info;
            stats_t wall, cpu;
            time_pipeline(ctx, &inputs[i], size, iters, dst, &info, &wall, &cpu);
            int planes = k == 0 && (info.colorspace == TJCS_YCbCr || info.colorspace == TJCS_GRAY);
            double dec_ms, res_ms;
            time_stages(ctx, &inputs[i], &info, size, iters, dst, planes, &dec_ms, &res_ms);
            if (res_ms < 0)
                res_ms = cpu.mean_ms - dec_ms;
            ratio[i][k] = cpu.mean_ms / plain.mean_ms;
            printf("| %s (%dx%d) | %zu | %s | %s | %dx%d | %.3f | %.3f | %.3f | %.3f | %.3f | "
                   "%.3f | %.3f%s |\n",
                   inputs[i].name, info.width, info.height, inputs[i].len,
                   planes ? paths[0] : paths[k == 0 ? 1 : k],
                   dct ? (info.scale_denom > 1 ? "on" : "on (not used)") : "off",
                   info.decoded_width, info.decoded_height, cpu.mean_ms, cpu.best_batch_ms,
                   wall.mean_ms, wall.p50_ms, wall.p99_ms, dec_ms, res_ms,
                   planes ? " (resize + convert)" : "");
            fflush(stdout);
        }
    }
    printf("\n%d images per case after %d warm-up, %dx%d bilinear, one thread\n", iters, iters / 10,
           size, size);
    printf("\nCPU time per image / plain full decode to RGB of the same file:\n\n");
    printf("| input | YUV planes + DCT | RGB + DCT | RGB, no DCT |\n|---|---|---|---|\n");
    for (int i = 0; i < ninputs; i++)
        printf("| %s | %.2fx | %.2fx | %.2fx |\n", inputs[i].name, ratio[i][0], ratio[i][1],
               ratio[i][2]);
    free(dst);
    for (int k = 0; k < 3; k++)
        gw_prep_ctx_free(ctxs[k]);
    for (int i = 0; i < ninputs; i++)
        free(inputs[i].data);
    return 0;
}
