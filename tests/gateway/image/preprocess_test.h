/* What the test_preprocess, test_resize_jpeg, test_pool and test_planes
 * tests share: JPEGs generated with tjCompress2, synthetic images, and
 * decoding through a preprocess context. */
#ifndef PREPROCESS_TEST_H
#define PREPROCESS_TEST_H

#include <criterion/criterion.h>
#include <gw_image.h>
#include <sq.h>

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <turbojpeg.h>
#include <unistd.h>

#define HOPPER "/usr/share/matplotlib/mpl-data/sample_data/grace_hopper.jpg"

typedef struct {
    uint8_t *data;
    size_t len;
} blob_t;

static inline void blob_free(blob_t *b)
{
    free(b->data);
    b->data = NULL;
}

/* Compresses w x h pixels of format pf into a malloc'ed JPEG. */
static inline blob_t compress(const uint8_t *pix, int w, int h, int pf, int subsamp, int quality,
                              int flags)
{
    tjhandle tj = tjInitCompress();
    cr_assert_not_null(tj);
    unsigned char *out = NULL;
    unsigned long size = 0;
    int rc = tjCompress2(tj, pix, w, 0, h, pf, &out, &size, subsamp, quality, flags);
    cr_assert_eq(rc, 0, "tjCompress2: %s", tjGetErrorStr2(tj));
    blob_t b = {.data = malloc(size), .len = size};
    memcpy(b.data, out, size);
    tjFree(out);
    tjDestroy(tj);
    return b;
}

static inline uint8_t *solid_rgb(int w, int h, uint8_t r, uint8_t g, uint8_t b)
{
    uint8_t *p = malloc((size_t)w * h * 3);
    for (size_t i = 0; i < (size_t)w * h; i++) {
        p[3 * i] = r;
        p[3 * i + 1] = g;
        p[3 * i + 2] = b;
    }
    return p;
}

/* R rises with x, G with y, B constant: a linear image whose resized
 * value at any interior point is known exactly. */
static inline uint8_t *gradient_rgb(int w, int h)
{
    uint8_t *p = malloc((size_t)w * h * 3);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            uint8_t *q = p + ((size_t)y * w + x) * 3;
            q[0] = (uint8_t)lround(x * 255.0 / (w - 1));
            q[1] = (uint8_t)lround(y * 255.0 / (h - 1));
            q[2] = 100;
        }
    return p;
}

/* Something photo-like: smooth waves, edges and deterministic noise. */
static inline uint8_t *scene_rgb(int w, int h)
{
    uint8_t *p = malloc((size_t)w * h * 3);
    double *sx = malloc(sizeof(double) * w), *sy = malloc(sizeof(double) * h);
    for (int x = 0; x < w; x++)
        sx[x] = 60.0 * sin(x * 6.2832 / (w / 3.0 + 1));
    for (int y = 0; y < h; y++)
        sy[y] = 50.0 * cos(y * 6.2832 / (h / 2.0 + 1));
    uint32_t seed = 12345;
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            seed = seed * 1664525u + 1013904223u;
            int noise = (int)(seed >> 28) - 8;
            int box = ((x / (w / 8 + 1)) + (y / (h / 6 + 1))) % 2 ? 40 : -40;
            uint8_t *q = p + ((size_t)y * w + x) * 3;
            int v[3] = {128 + (int)sx[x] + box + noise, 120 + (int)sy[y] + noise,
                        110 + (int)(sx[x] * 0.5 - sy[y] * 0.5) - box / 2 + noise};
            for (int c = 0; c < 3; c++)
                q[c] = (uint8_t)(v[c] < 0 ? 0 : v[c] > 255 ? 255 : v[c]);
        }
    free(sx);
    free(sy);
    return p;
}

static inline gw_prep_ctx_t *ctx_with(int dct)
{
    gw_prep_limits_t lim = gw_prep_limits_default();
    lim.dct_scaling = dct;
    gw_prep_ctx_t *ctx = gw_prep_ctx_new(&lim);
    cr_assert_not_null(ctx);
    return ctx;
}

static inline int decode(gw_prep_ctx_t *ctx, blob_t b, int w, int h, gw_resize_t mode, uint8_t *dst,
                         gw_image_info_t *info, char *err)
{
    return gw_image_to_rgb(ctx, b.data, b.len, w, h, mode, dst, info, err, 256);
}

static inline double mean_abs_diff(const uint8_t *a, const uint8_t *b, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += abs((int)a[i] - (int)b[i]);
    return s / (double)n;
}

static inline int max_abs_diff(const uint8_t *a, const uint8_t *b, size_t n)
{
    int m = 0;
    for (size_t i = 0; i < n; i++) {
        int d = abs((int)a[i] - (int)b[i]);
        if (d > m)
            m = d;
    }
    return m;
}

static inline void assert_all_near(const uint8_t *p, int w, int h, const int rgb[3], int tol,
                                   const char *what)
{
    for (size_t i = 0; i < (size_t)w * h; i++)
        for (int c = 0; c < 3; c++)
            cr_assert(abs((int)p[3 * i + c] - rgb[c]) <= tol,
                      "%s: pixel %zu channel %d is %d, expected %d +- %d", what, i, c, p[3 * i + c],
                      rgb[c], tol);
}

static inline blob_t read_file(const char *path)
{
    blob_t b = {0};
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return b;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    b.data = malloc((size_t)n);
    b.len = fread(b.data, 1, (size_t)n, f);
    fclose(f);
    return b;
}

static inline blob_t scene_jpeg(int w, int h)
{
    uint8_t *src = scene_rgb(w, h);
    blob_t b = compress(src, w, h, TJPF_RGB, TJSAMP_420, 90, 0);
    free(src);
    return b;
}

#endif
