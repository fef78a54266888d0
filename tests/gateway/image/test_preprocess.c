/* gateway/image/: JPEG decode + resize, and the preprocess pool, end to
 * end through gw_image.h (decode.c, resize.c, planes.c, pool.c together).
 * Every JPEG is generated here with tjCompress2 (no fixture files), plus
 * Debian's grace_hopper.jpg from python-matplotlib-data when present. */
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

static void blob_free(blob_t *b)
{
    free(b->data);
    b->data = NULL;
}

/* Compresses w x h pixels of format pf into a malloc'ed JPEG. */
static blob_t compress(const uint8_t *pix, int w, int h, int pf, int subsamp, int quality,
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

static uint8_t *solid_rgb(int w, int h, uint8_t r, uint8_t g, uint8_t b)
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
static uint8_t *gradient_rgb(int w, int h)
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
static uint8_t *scene_rgb(int w, int h)
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

static gw_prep_ctx_t *ctx_with(int dct)
{
    gw_prep_limits_t lim = gw_prep_limits_default();
    lim.dct_scaling = dct;
    gw_prep_ctx_t *ctx = gw_prep_ctx_new(&lim);
    cr_assert_not_null(ctx);
    return ctx;
}

static int decode(gw_prep_ctx_t *ctx, blob_t b, int w, int h, gw_resize_t mode, uint8_t *dst,
                  gw_image_info_t *info, char *err)
{
    return gw_image_to_rgb(ctx, b.data, b.len, w, h, mode, dst, info, err, 256);
}

static double mean_abs_diff(const uint8_t *a, const uint8_t *b, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += abs((int)a[i] - (int)b[i]);
    return s / (double)n;
}

static int max_abs_diff(const uint8_t *a, const uint8_t *b, size_t n)
{
    int m = 0;
    for (size_t i = 0; i < n; i++) {
        int d = abs((int)a[i] - (int)b[i]);
        if (d > m)
            m = d;
    }
    return m;
}

static void assert_all_near(const uint8_t *p, int w, int h, const int rgb[3], int tol,
                            const char *what)
{
    for (size_t i = 0; i < (size_t)w * h; i++)
        for (int c = 0; c < 3; c++)
            cr_assert(abs((int)p[3 * i + c] - rgb[c]) <= tol,
                      "%s: pixel %zu channel %d is %d, expected %d +- %d", what, i, c, p[3 * i + c],
                      rgb[c], tol);
}

/* ---- decoding every kind of JPEG ------------------------------------ */

Test(preprocess, solid_color_survives_every_subsampling_and_progressive)
{
    const struct {
        int subsamp, flags;
        const char *name;
    } kinds[] = {
        {TJSAMP_444, 0, "4:4:4"},
        {TJSAMP_422, 0, "4:2:2"},
        {TJSAMP_420, 0, "4:2:0"},
        {TJSAMP_420, TJFLAG_PROGRESSIVE, "progressive 4:2:0"},
        {TJSAMP_444, TJFLAG_PROGRESSIVE, "progressive 4:4:4"},
    };
    const int rgb[3] = {200, 100, 50};
    uint8_t *src = solid_rgb(64, 48, 200, 100, 50);
    gw_prep_ctx_t *ctx = ctx_with(1);
    uint8_t *dst = malloc(224 * 224 * 3);
    for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++) {
        blob_t b = compress(src, 64, 48, TJPF_RGB, kinds[k].subsamp, 95, kinds[k].flags);
        gw_image_info_t info;
        char err[256];
        int sizes[][2] = {{224, 224}, {16, 16}, {64, 48}};
        for (int s = 0; s < 3; s++) {
            cr_assert_eq(
                decode(ctx, b, sizes[s][0], sizes[s][1], GW_RESIZE_BILINEAR, dst, &info, err), 0,
                "%s: %s", kinds[k].name, err);
            assert_all_near(dst, sizes[s][0], sizes[s][1], rgb, 3, kinds[k].name);
        }
        cr_assert_eq(info.width, 64);
        cr_assert_eq(info.height, 48);
        cr_assert_eq(info.subsamp, kinds[k].subsamp, "%s", kinds[k].name);
        cr_assert_eq(info.colorspace, TJCS_YCbCr);
        blob_free(&b);
    }
    free(dst);
    free(src);
    gw_prep_ctx_free(ctx);
}

Test(preprocess, grayscale_comes_out_as_equal_rgb)
{
    uint8_t gray[40 * 30];
    for (int i = 0; i < 40 * 30; i++)
        gray[i] = 77;
    blob_t b = compress(gray, 40, 30, TJPF_GRAY, TJSAMP_GRAY, 95, 0);
    gw_prep_ctx_t *ctx = ctx_with(1);
    uint8_t dst[20 * 20 * 3];
    gw_image_info_t info;
    char err[256];
    cr_assert_eq(decode(ctx, b, 20, 20, GW_RESIZE_BILINEAR, dst, &info, err), 0, "%s", err);
    cr_assert_eq(info.colorspace, TJCS_GRAY);
    cr_assert_eq(info.subsamp, TJSAMP_GRAY);
    for (int i = 0; i < 20 * 20; i++) {
        cr_assert_eq(dst[3 * i], dst[3 * i + 1]);
        cr_assert_eq(dst[3 * i], dst[3 * i + 2]);
        cr_assert(abs(dst[3 * i] - 77) <= 1, "gray %d", dst[3 * i]);
    }
    blob_free(&b);
    gw_prep_ctx_free(ctx);
}

/* Adobe (inverted) CMYK that maps back to r, g, b with R = C * K / 255. */
static void rgb_to_inverted_cmyk(int r, int g, int b, uint8_t out[4])
{
    int k = r > g ? (r > b ? r : b) : (g > b ? g : b);
    out[3] = (uint8_t)k;
    out[0] = k ? (uint8_t)lround(255.0 * r / k) : 255;
    out[1] = k ? (uint8_t)lround(255.0 * g / k) : 255;
    out[2] = k ? (uint8_t)lround(255.0 * b / k) : 255;
}

Test(preprocess, cmyk_jpegs_are_converted_to_rgb)
{
    /* Left half one color, right half another: checks the conversion and
     * that the 4-byte to 3-byte repacking keeps pixels in place. */
    const int w = 64, h = 32;
    uint8_t *cmyk = malloc((size_t)w * h * 4);
    uint8_t left[4], right[4];
    rgb_to_inverted_cmyk(200, 100, 50, left);
    rgb_to_inverted_cmyk(30, 180, 90, right);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            memcpy(cmyk + ((size_t)y * w + x) * 4, x < w / 2 ? left : right, 4);
    blob_t b = compress(cmyk, w, h, TJPF_CMYK, TJSAMP_444, 98, 0);
    gw_prep_ctx_t *ctx = ctx_with(1);
    uint8_t dst[64 * 32 * 3];
    gw_image_info_t info;
    char err[256];
    cr_assert_eq(decode(ctx, b, w, h, GW_RESIZE_BILINEAR, dst, &info, err), 0, "%s", err);
    cr_assert(info.colorspace == TJCS_YCCK || info.colorspace == TJCS_CMYK, "cs %d",
              info.colorspace);
    for (int y = 0; y < h; y++) {
        /* away from the edge, where the JPEG rings */
        const int l[3] = {200, 100, 50}, r[3] = {30, 180, 90};
        assert_all_near(dst + ((size_t)y * w + 4) * 3, 20, 1, l, 4, "cmyk left");
        assert_all_near(dst + ((size_t)y * w + 40) * 3, 20, 1, r, 4, "cmyk right");
    }
    /* And through the resize. */
    uint8_t small[8 * 8 * 3];
    cr_assert_eq(decode(ctx, b, 8, 8, GW_RESIZE_NEAREST, small, &info, err), 0, "%s", err);
    const int l[3] = {200, 100, 50};
    assert_all_near(small + 0, 1, 1, l, 4, "cmyk resized");
    blob_free(&b);
    free(cmyk);
    gw_prep_ctx_free(ctx);
}

/* Decodes a w x h gradient to tw x th and compares the interior with the
 * analytic value at each output pixel's center. */
static void check_gradient(int w, int h, int tw, int th, int dct, int want_num, int want_denom)
{
    uint8_t *src = gradient_rgb(w, h);
    blob_t b = compress(src, w, h, TJPF_RGB, TJSAMP_444, 100, 0);
    gw_prep_ctx_t *ctx = ctx_with(dct);
    uint8_t *dst = malloc((size_t)tw * th * 3);
    gw_image_info_t info;
    char err[256];
    cr_assert_eq(decode(ctx, b, tw, th, GW_RESIZE_BILINEAR, dst, &info, err), 0, "%s", err);
    cr_assert(info.scale_num == want_num && info.scale_denom == want_denom,
              "%dx%d -> %dx%d dct %d: scale %d/%d", w, h, tw, th, dct, info.scale_num,
              info.scale_denom);
    double sx = (double)w / tw, sy = (double)h / th;
    double mx = (sx > 1 ? sx : 1) + 2, my = (sy > 1 ? sy : 1) + 2; /* clipped windows */
    int checked = 0;
    for (int y = 0; y < th; y++) {
        double cy = (y + 0.5) * sy - 0.5;
        if (cy < my || cy > h - 1 - my)
            continue;
        for (int x = 0; x < tw; x++) {
            double cx = (x + 0.5) * sx - 0.5;
            if (cx < mx || cx > w - 1 - mx)
                continue;
            const uint8_t *p = dst + ((size_t)y * tw + x) * 3;
            double r = cx * 255.0 / (w - 1), g = cy * 255.0 / (h - 1);
            cr_assert(fabs(p[0] - r) <= 3.0 && fabs(p[1] - g) <= 3.0 && abs(p[2] - 100) <= 3,
                      "%dx%d -> %dx%d dct %d at (%d,%d): got %d %d %d, want %.1f %.1f 100", w, h,
                      tw, th, dct, x, y, p[0], p[1], p[2], r, g);
            checked++;
        }
    }
    cr_assert_gt(checked, tw * th / 3);
    free(dst);
    free(src);
    blob_free(&b);
    gw_prep_ctx_free(ctx);
}

Test(preprocess, gradient_lands_on_half_pixel_centers)
{
    check_gradient(320, 240, 100, 60, 0, 1, 1);   /* reduce 3.2x by 4x */
    check_gradient(320, 240, 100, 60, 1, 3, 8);   /* the same from a 120x90 DCT decode */
    check_gradient(320, 240, 640, 480, 1, 1, 1);  /* enlarge */
    check_gradient(300, 200, 224, 224, 1, 1, 1);  /* reduce one axis, enlarge the other */
    check_gradient(1280, 960, 224, 224, 0, 1, 1); /* reduce 5.7x by 4.3x */
    check_gradient(1280, 960, 224, 224, 1, 1, 4); /* from a 320x240 DCT decode */
}

Test(preprocess, dct_scaling_picks_the_smallest_factor_that_covers_the_target)
{
    const struct {
        int w, h, tw, th, num, denom;
    } cases[] = {
        {640, 480, 224, 224, 1, 2},   /* 320x240 */
        {4000, 3000, 224, 224, 1, 8}, /* 500x375 */
        {512, 600, 224, 224, 1, 2},   /* grace hopper's size */
        {447, 448, 224, 224, 1, 1},   /* under twice the target: no scaling */
        {2000, 500, 224, 224, 1, 2},  /* the short side decides */
        {900, 900, 224, 224, 1, 4},   /* 225x225 */
        {1000, 1000, 300, 300, 3, 8}, /* 375x375 */
    };
    gw_prep_ctx_t *ctx = ctx_with(1);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        uint8_t *src = solid_rgb(cases[i].w, cases[i].h, 10, 20, 30);
        blob_t b = compress(src, cases[i].w, cases[i].h, TJPF_RGB, TJSAMP_420, 50, 0);
        uint8_t *dst = malloc((size_t)cases[i].tw * cases[i].th * 3);
        gw_image_info_t info;
        char err[256];
        cr_assert_eq(decode(ctx, b, cases[i].tw, cases[i].th, GW_RESIZE_BILINEAR, dst, &info, err),
                     0, "%s", err);
        cr_assert(info.scale_num == cases[i].num && info.scale_denom == cases[i].denom,
                  "%dx%d -> %dx%d: got %d/%d, want %d/%d", cases[i].w, cases[i].h, cases[i].tw,
                  cases[i].th, info.scale_num, info.scale_denom, cases[i].num, cases[i].denom);
        cr_assert_geq(info.decoded_width, cases[i].tw);
        cr_assert_geq(info.decoded_height, cases[i].th);
        const int rgb[3] = {10, 20, 30};
        assert_all_near(dst, cases[i].tw, cases[i].th, rgb, 3, "scaled solid");
        free(dst);
        free(src);
        blob_free(&b);
    }
    gw_prep_ctx_free(ctx);
}

/* The DCT-scaled path must look like the full decode to a model. */
static void check_dct_vs_full(blob_t b, int tw, int th, double max_mean, const char *what)
{
    gw_prep_ctx_t *fast = ctx_with(1), *full = ctx_with(0);
    size_t n = (size_t)tw * th * 3;
    uint8_t *a = malloc(n), *c = malloc(n);
    gw_image_info_t ia, ic;
    char err[256];
    cr_assert_eq(decode(fast, b, tw, th, GW_RESIZE_BILINEAR, a, &ia, err), 0, "%s: %s", what, err);
    cr_assert_eq(decode(full, b, tw, th, GW_RESIZE_BILINEAR, c, &ic, err), 0, "%s: %s", what, err);
    cr_assert_lt(ia.scale_num * 2, ia.scale_denom + 1, "%s: DCT scaling was used", what);
    cr_assert_eq(ic.scale_denom, 1);
    double mean = mean_abs_diff(a, c, n);
    cr_assert_lt(mean, max_mean, "%s: mean |scaled - full| = %.3f", what, mean);
    cr_assert_gt(mean, 0.0, "%s: the two paths cannot be bit-identical", what);
    free(a);
    free(c);
    gw_prep_ctx_free(fast);
    gw_prep_ctx_free(full);
}

Test(preprocess, dct_scaled_decode_matches_the_full_decode, .timeout = 60)
{
    uint8_t *src = scene_rgb(4000, 3000);
    blob_t b = compress(src, 4000, 3000, TJPF_RGB, TJSAMP_420, 90, 0);
    free(src);
    check_dct_vs_full(b, 224, 224, 2.0, "4000x3000 4:2:0");
    blob_free(&b);
    src = scene_rgb(640, 480);
    b = compress(src, 640, 480, TJPF_RGB, TJSAMP_420, 90, 0);
    free(src);
    check_dct_vs_full(b, 224, 224, 2.0, "640x480 4:2:0");
    blob_free(&b);
}

static blob_t read_file(const char *path)
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

Test(preprocess, a_real_photo_grace_hopper)
{
    blob_t b = read_file(HOPPER);
    if (b.data == NULL)
        cr_skip_test("%s is absent (Debian package python-matplotlib-data)", HOPPER);
    gw_prep_ctx_t *ctx = ctx_with(1);
    uint8_t *dst = malloc(224 * 224 * 3);
    gw_image_info_t info;
    char err[256];
    cr_assert_eq(decode(ctx, b, 224, 224, GW_RESIZE_BILINEAR, dst, &info, err), 0, "%s", err);
    cr_assert_eq(info.width, 512);
    cr_assert_eq(info.height, 600);
    cr_assert_eq(info.decoded_width, 256);
    cr_assert_eq(info.decoded_height, 300);
    /* Full decode with TurboJPEG, then a box-average of each output cell as
     * an independent reference: the resize must be close to it. */
    tjhandle tj = tjInitDecompress();
    uint8_t *full = malloc(512 * 600 * 3);
    cr_assert_eq(tjDecompress2(tj, b.data, b.len, full, 512, 0, 600, TJPF_RGB, 0), 0);
    tjDestroy(tj);
    double total = 0;
    for (int y = 0; y < 224; y++)
        for (int x = 0; x < 224; x++) {
            int x0 = x * 512 / 224, x1 = (x + 1) * 512 / 224;
            int y0 = y * 600 / 224, y1 = (y + 1) * 600 / 224;
            for (int c = 0; c < 3; c++) {
                double s = 0;
                for (int yy = y0; yy < y1; yy++)
                    for (int xx = x0; xx < x1; xx++)
                        s += full[((size_t)yy * 512 + xx) * 3 + c];
                s /= (double)(x1 - x0) * (y1 - y0);
                total += fabs(s - dst[((size_t)y * 224 + x) * 3 + c]);
            }
        }
    double mean = total / (224.0 * 224 * 3);
    cr_assert_lt(mean, 4.0, "mean |resize - box average| = %.3f", mean);
    free(full);
    check_dct_vs_full(b, 224, 224, 2.0, "grace_hopper.jpg");
    free(dst);
    blob_free(&b);
    gw_prep_ctx_free(ctx);
}

Test(preprocess, tiny_and_odd_sizes)
{
    gw_prep_ctx_t *ctx = ctx_with(1);
    uint8_t *dst = malloc(224 * 224 * 3);
    gw_image_info_t info;
    char err[256];
    uint8_t *one = solid_rgb(1, 1, 250, 5, 128);
    blob_t b = compress(one, 1, 1, TJPF_RGB, TJSAMP_444, 100, 0);
    cr_assert_eq(decode(ctx, b, 224, 224, GW_RESIZE_BILINEAR, dst, &info, err), 0, "%s", err);
    const int c1[3] = {250, 5, 128};
    assert_all_near(dst, 224, 224, c1, 3, "1x1 to 224x224");
    /* every output pixel is the same value, whatever it decoded to */
    for (int i = 1; i < 224 * 224; i++)
        cr_assert_eq(memcmp(dst, dst + 3 * i, 3), 0);
    blob_free(&b);
    free(one);

    uint8_t *odd = solid_rgb(7, 13, 40, 90, 160);
    b = compress(odd, 7, 13, TJPF_RGB, TJSAMP_420, 95, 0);
    const int c2[3] = {40, 90, 160};
    cr_assert_eq(decode(ctx, b, 224, 224, GW_RESIZE_BILINEAR, dst, &info, err), 0, "%s", err);
    assert_all_near(dst, 224, 224, c2, 3, "7x13 to 224x224");
    cr_assert_eq(decode(ctx, b, 3, 2, GW_RESIZE_BILINEAR, dst, &info, err), 0, "%s", err);
    assert_all_near(dst, 3, 2, c2, 3, "7x13 to 3x2");
    cr_assert_eq(decode(ctx, b, 1, 1, GW_RESIZE_NEAREST, dst, &info, err), 0, "%s", err);
    assert_all_near(dst, 1, 1, c2, 3, "7x13 to 1x1");
    blob_free(&b);
    free(odd);
    free(dst);
    gw_prep_ctx_free(ctx);
}

Test(preprocess, same_size_is_the_plain_decode)
{
    uint8_t *src = scene_rgb(224, 224);
    blob_t b = compress(src, 224, 224, TJPF_RGB, TJSAMP_420, 85, 0);
    uint8_t *ref = malloc(224 * 224 * 3), *dst = malloc(224 * 224 * 3);
    tjhandle tj = tjInitDecompress();
    cr_assert_eq(tjDecompress2(tj, b.data, b.len, ref, 224, 0, 224, TJPF_RGB, 0), 0);
    tjDestroy(tj);
    gw_prep_ctx_t *ctx = ctx_with(1);
    for (int mode = 0; mode < 2; mode++) {
        cr_assert_eq(
            gw_image_to_rgb(ctx, b.data, b.len, 224, 224, (gw_resize_t)mode, dst, NULL, NULL, 0),
            0);
        cr_assert_eq(memcmp(ref, dst, 224 * 224 * 3), 0);
    }
    free(ref);
    free(dst);
    free(src);
    blob_free(&b);
    gw_prep_ctx_free(ctx);
}

/* ---- the resize itself ---------------------------------------------- */

/* Straightforward double-precision triangle filter, written apart from the
 * fixed-point code: value at output (x, y) of a separable filter. */
static void reference_resize(const uint8_t *src, int sw, int sh, uint8_t *dst, int dw, int dh)
{
    double *tmp = malloc(sizeof(double) * (size_t)dh * sw * 3);
    /* vertical, then horizontal, both in double */
    for (int pass = 0; pass < 2; pass++) {
        int in = pass == 0 ? sh : sw, out = pass == 0 ? dh : dw;
        double scale = (double)in / out, fs = scale > 1 ? scale : 1;
        for (int o = 0; o < out; o++) {
            double center = (o + 0.5) * scale, wsum = 0;
            double acc[3 * 4096] = {0};
            int other = pass == 0 ? sw : dh;
            for (int i = 0; i < in; i++) {
                double t = fabs((i + 0.5 - center) / fs);
                double wgt = t < 1 ? 1 - t : 0;
                if (wgt == 0)
                    continue;
                wsum += wgt;
                for (int j = 0; j < other; j++)
                    for (int c = 0; c < 3; c++) {
                        double v = pass == 0 ? src[((size_t)i * sw + j) * 3 + c]
                                             : tmp[((size_t)j * sw + i) * 3 + c];
                        acc[j * 3 + c] += wgt * v;
                    }
            }
            for (int j = 0; j < other; j++)
                for (int c = 0; c < 3; c++) {
                    double v = acc[j * 3 + c] / wsum;
                    if (pass == 0)
                        tmp[((size_t)o * sw + j) * 3 + c] = v;
                    else
                        dst[((size_t)j * dw + o) * 3 + c] = (uint8_t)lround(v);
                }
        }
    }
    free(tmp);
}

Test(preprocess, fixed_point_resize_matches_a_double_reference)
{
    const int sizes[][4] = {{97, 61, 40, 33},
                            {13, 7, 50, 29},
                            {640, 480, 224, 224},
                            {320, 240, 224, 224},
                            {5, 300, 17, 16}};
    gw_prep_ctx_t *ctx = ctx_with(1);
    uint32_t seed = 7;
    for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
        int sw = sizes[s][0], sh = sizes[s][1], dw = sizes[s][2], dh = sizes[s][3];
        uint8_t *src = malloc((size_t)sw * sh * 3);
        for (size_t i = 0; i < (size_t)sw * sh * 3; i++) {
            seed = seed * 1103515245u + 12345u;
            src[i] = (uint8_t)(seed >> 23);
        }
        uint8_t *got = malloc((size_t)dw * dh * 3), *want = malloc((size_t)dw * dh * 3);
        cr_assert_eq(
            gw_resize_rgb(ctx, src, sw, sh, (size_t)sw * 3, got, dw, dh, GW_RESIZE_BILINEAR), 0);
        reference_resize(src, sw, sh, want, dw, dh);
        size_t n = (size_t)dw * dh * 3;
        int worst = max_abs_diff(got, want, n);
        double mean = mean_abs_diff(got, want, n);
        cr_assert_leq(worst, 1, "%dx%d -> %dx%d: max error %d", sw, sh, dw, dh, worst);
        cr_assert_lt(mean, 0.3, "%dx%d -> %dx%d: mean error %.3f", sw, sh, dw, dh, mean);
        free(src);
        free(got);
        free(want);
    }
    gw_prep_ctx_free(ctx);
}

Test(preprocess, reducing_averages_instead_of_aliasing)
{
    /* A one-pixel checkerboard reduced 4x is flat gray when every covered
     * pixel counts; point sampling (nearest) keeps only black or white. */
    const int n = 256;
    uint8_t *src = malloc((size_t)n * n * 3);
    for (int y = 0; y < n; y++)
        for (int x = 0; x < n; x++)
            memset(src + ((size_t)y * n + x) * 3, (x + y) % 2 ? 255 : 0, 3);
    gw_prep_ctx_t *ctx = ctx_with(1);
    uint8_t dst[64 * 64 * 3];
    cr_assert_eq(gw_resize_rgb(ctx, src, n, n, (size_t)n * 3, dst, 64, 64, GW_RESIZE_BILINEAR), 0);
    const int gray[3] = {128, 128, 128};
    assert_all_near(dst, 64, 64, gray, 2, "bilinear checkerboard");
    cr_assert_eq(gw_resize_rgb(ctx, src, n, n, (size_t)n * 3, dst, 64, 64, GW_RESIZE_NEAREST), 0);
    for (int i = 0; i < 64 * 64 * 3; i++)
        cr_assert(dst[i] == 0 || dst[i] == 255);
    free(src);
    gw_prep_ctx_free(ctx);
}

Test(preprocess, nearest_picks_the_closest_center)
{
    /* 8 columns with values 0, 10, ..., 70: reduced to 4 the centers fall
     * on source 1.5, 3.5, ... -> pixels 1, 3, 5, 7 (round half up) ; enlarged
     * to 16 each source pixel repeats twice. */
    uint8_t src[8 * 3], dst[16 * 3];
    for (int x = 0; x < 8; x++)
        memset(src + 3 * x, x * 10, 3);
    gw_prep_ctx_t *ctx = ctx_with(1);
    cr_assert_eq(gw_resize_rgb(ctx, src, 8, 1, 24, dst, 4, 1, GW_RESIZE_NEAREST), 0);
    for (int x = 0; x < 4; x++)
        cr_assert_eq(dst[3 * x], (2 * x + 1) * 10, "x=%d: %d", x, dst[3 * x]);
    cr_assert_eq(gw_resize_rgb(ctx, src, 8, 1, 24, dst, 16, 1, GW_RESIZE_NEAREST), 0);
    for (int x = 0; x < 16; x++)
        cr_assert_eq(dst[3 * x], (x / 2) * 10);
    gw_prep_ctx_free(ctx);
}

Test(preprocess, a_flat_image_stays_exactly_flat)
{
    const int dims[][4] = {{123, 77, 31, 200}, {640, 480, 224, 224}, {3, 3, 1000, 2}};
    gw_prep_ctx_t *ctx = ctx_with(1);
    for (size_t d = 0; d < 3; d++) {
        for (int mode = 0; mode < 2; mode++) {
            uint8_t *src = solid_rgb(dims[d][0], dims[d][1], 255, 1, 173);
            uint8_t *dst = malloc((size_t)dims[d][2] * dims[d][3] * 3);
            cr_assert_eq(gw_resize_rgb(ctx, src, dims[d][0], dims[d][1], (size_t)dims[d][0] * 3,
                                       dst, dims[d][2], dims[d][3], (gw_resize_t)mode),
                         0);
            const int c[3] = {255, 1, 173};
            assert_all_near(dst, dims[d][2], dims[d][3], c, 0, "flat");
            free(src);
            free(dst);
        }
    }
    gw_prep_ctx_free(ctx);
}

Test(preprocess, resize_mode_names)
{
    gw_resize_t m;
    cr_assert_eq(gw_resize_parse("bilinear", &m), 0);
    cr_assert_eq(m, GW_RESIZE_BILINEAR);
    cr_assert_eq(gw_resize_parse("nearest", &m), 0);
    cr_assert_eq(m, GW_RESIZE_NEAREST);
    cr_assert_eq(gw_resize_parse("bicubic", &m), SQ_INVAL);
    cr_assert_eq(gw_resize_parse(NULL, &m), SQ_INVAL);
    cr_assert_str_eq(gw_resize_name(GW_RESIZE_NEAREST), "nearest");
    cr_assert_str_eq(gw_resize_name(GW_RESIZE_BILINEAR), "bilinear");
}

/* ---- errors --------------------------------------------------------- */

static blob_t scene_jpeg(int w, int h)
{
    uint8_t *src = scene_rgb(w, h);
    blob_t b = compress(src, w, h, TJPF_RGB, TJSAMP_420, 90, 0);
    free(src);
    return b;
}

Test(preprocess, other_formats_are_415_with_their_name)
{
    const struct {
        const char *bytes;
        size_t len;
        const char *name;
    } cases[] = {
        {"\x89PNG\r\n\x1a\n\0\0\0\rIHDR", 16, "png"},
        {"GIF89a\x01\0\x01\0", 10, "gif"},
        {"RIFF\x24\0\0\0WEBPVP8 ", 16, "webp"},
        {"BM\x36\0\0\0", 6, "bmp"},
        {"II*\0\x08\0\0\0", 8, "tiff"},
        {"\0\0\0\x1c"
         "ftypavif",
         12, "avif"},
        {"hello world", 11, "unknown"},
        {"\xff", 1, "unknown"},
        {"\xd8\xff", 2, "unknown"},
    };
    gw_prep_ctx_t *ctx = ctx_with(1);
    uint8_t dst[4 * 4 * 3];
    char err[256];
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int rc = gw_image_to_rgb(ctx, (const uint8_t *)cases[i].bytes, cases[i].len, 4, 4,
                                 GW_RESIZE_BILINEAR, dst, NULL, err, sizeof(err));
        cr_assert_eq(rc, SQ_MEDIA_TYPE, "%s: rc %d", cases[i].name, rc);
        cr_assert_eq(sq_err_http_status(rc), 415);
        char want[64];
        snprintf(want, sizeof(want), "unsupported image type: %s", cases[i].name);
        cr_assert(strstr(err, want) != NULL, "%s: %s", cases[i].name, err);
    }
    gw_prep_ctx_free(ctx);
}

Test(preprocess, empty_input_is_a_bad_image)
{
    gw_prep_ctx_t *ctx = ctx_with(1);
    uint8_t dst[3];
    char err[256];
    cr_assert_eq(gw_image_to_rgb(ctx, (const uint8_t *)"", 0, 1, 1, GW_RESIZE_BILINEAR, dst, NULL,
                                 err, sizeof(err)),
                 SQ_BAD_IMAGE);
    cr_assert_str_eq(err, "empty image");
    cr_assert_eq(
        gw_image_to_rgb(ctx, NULL, 0, 1, 1, GW_RESIZE_BILINEAR, dst, NULL, err, sizeof(err)),
        SQ_BAD_IMAGE);
    gw_prep_ctx_free(ctx);
}

Test(preprocess, truncated_jpegs_are_400_with_the_decoders_reason)
{
    blob_t b = scene_jpeg(320, 240);
    gw_prep_ctx_t *ctx = ctx_with(1);
    uint8_t *dst = malloc(224 * 224 * 3);
    char err[256];
    size_t cuts[] = {2, 3, 10, 100, 300, b.len / 3, b.len / 2, b.len - 100, b.len - 2};
    for (size_t i = 0; i < sizeof(cuts) / sizeof(cuts[0]); i++) {
        int rc = gw_image_to_rgb(ctx, b.data, cuts[i], 224, 224, GW_RESIZE_BILINEAR, dst, NULL, err,
                                 sizeof(err));
        cr_assert_eq(rc, SQ_BAD_IMAGE, "cut at %zu of %zu: rc %d (%s)", cuts[i], b.len, rc, err);
        cr_assert(strncmp(err, "bad jpeg: ", 10) == 0 && strlen(err) > 12, "cut %zu: '%s'", cuts[i],
                  err);
        /* a bad image must not poison the context for the next good one */
        cr_assert_eq(gw_image_to_rgb(ctx, b.data, b.len, 224, 224, GW_RESIZE_BILINEAR, dst, NULL,
                                     err, sizeof(err)),
                     0, "after the cut at %zu: %s", cuts[i], err);
    }
    /* the context is still good after all those errors */
    cr_assert_eq(gw_image_to_rgb(ctx, b.data, b.len, 224, 224, GW_RESIZE_BILINEAR, dst, NULL, err,
                                 sizeof(err)),
                 0, "%s", err);
    free(dst);
    blob_free(&b);
    gw_prep_ctx_free(ctx);
}

/* Offset of the first byte after marker FF m (its length field). */
static size_t find_marker(blob_t b, uint8_t m)
{
    for (size_t i = 2; i + 1 < b.len; i++)
        if (b.data[i] == 0xFF && b.data[i + 1] == m)
            return i + 2;
    cr_assert_fail("marker FF %02X not found", m);
    return 0;
}

Test(preprocess, corrupt_jpegs_are_400_with_the_decoders_reason)
{
    blob_t good = scene_jpeg(160, 120);
    gw_prep_ctx_t *ctx = ctx_with(1);
    uint8_t *dst = malloc(64 * 64 * 3);
    char err[256];
    size_t sof = find_marker(good, 0xC0); /* len(2) precision(1) h(2) w(2) ncomp(1) */
    size_t sos = find_marker(good, 0xDA);
    size_t dqt = find_marker(good, 0xDB);
    const struct {
        size_t at;
        uint8_t value;
        size_t at2; /* 0: one byte only */
        uint8_t value2;
        const char *what, *reason;
    } cases[] = {
        {sof + 2, 7, 0, 0, "precision 7", "precision"},
        {sof + 7, 0, 0, 0, "no components", NULL},
        {sof + 4, 0, 0, 0, "height 0", NULL},
        {sof + 6, 0, 0, 0, "width 0", NULL},
        {dqt + 1, 2, 0, 0, "DQT length 2", NULL},
        {sos + 12, 0xFF, sos + 13, 0xD9, "EOI inside the scan", NULL},
        {sos + 40, 0xFF, sos + 41, 0xC8, "a reserved marker inside the scan", NULL},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        blob_t b = {.data = malloc(good.len), .len = good.len};
        memcpy(b.data, good.data, good.len);
        b.data[cases[i].at] = cases[i].value;
        if (cases[i].at2 != 0)
            b.data[cases[i].at2] = cases[i].value2;
        int rc = decode(ctx, b, 64, 64, GW_RESIZE_BILINEAR, dst, NULL, err);
        cr_assert_eq(rc, SQ_BAD_IMAGE, "%s: rc %d (%s)", cases[i].what, rc, err);
        cr_assert(strncmp(err, "bad jpeg: ", 10) == 0, "%s: '%s'", cases[i].what, err);
        if (cases[i].reason != NULL)
            cr_assert(strstr(err, cases[i].reason) != NULL, "%s: '%s'", cases[i].what, err);
        cr_assert_eq(decode(ctx, good, 64, 64, GW_RESIZE_BILINEAR, dst, NULL, err), 0,
                     "a good image after '%s': %s", cases[i].what, err);
        blob_free(&b);
    }
    free(dst);
    blob_free(&good);
    gw_prep_ctx_free(ctx);
}

/* A JPEG whose SOF claims w x h; the scan data belongs to a small image,
 * so anything that decoded it would fail or allocate w * h * 3 bytes. */
static blob_t lying_header(int w, int h)
{
    blob_t b = scene_jpeg(16, 16);
    size_t sof = find_marker(b, 0xC0);
    b.data[sof + 3] = (uint8_t)(h >> 8);
    b.data[sof + 4] = (uint8_t)h;
    b.data[sof + 5] = (uint8_t)(w >> 8);
    b.data[sof + 6] = (uint8_t)w;
    return b;
}

Test(preprocess, bombs_are_413_before_anything_is_decoded)
{
    gw_prep_ctx_t *ctx = ctx_with(1);
    uint8_t dst[8 * 8 * 3];
    gw_image_info_t info;
    char err[256];
    blob_t b = lying_header(60000, 60000);
    int rc = decode(ctx, b, 8, 8, GW_RESIZE_BILINEAR, dst, &info, err);
    cr_assert_eq(rc, SQ_TOO_LARGE, "rc %d: %s", rc, err);
    cr_assert_eq(sq_err_http_status(rc), 413);
    cr_assert_eq(info.width, 60000);
    cr_assert_eq(info.height, 60000);
    cr_assert_eq(info.decoded_width, 0, "no decode was attempted");
    cr_assert(strstr(err, "60000x60000") != NULL, "%s", err);
    blob_free(&b);

    /* Under the side limits but over the pixel budget. */
    b = lying_header(10000, 10000);
    cr_assert_eq(decode(ctx, b, 8, 8, GW_RESIZE_BILINEAR, dst, &info, err), SQ_TOO_LARGE, "%s",
                 err);
    blob_free(&b);
    /* Same lie, within the limits: the decoder is reached and fails on the data. */
    b = lying_header(64, 64);
    cr_assert_eq(decode(ctx, b, 8, 8, GW_RESIZE_BILINEAR, dst, &info, err), SQ_BAD_IMAGE, "%s",
                 err);
    blob_free(&b);
    gw_prep_ctx_free(ctx);

    /* Configured limits apply to real images too, truncated right after
     * the header or not. */
    gw_prep_limits_t lim = gw_prep_limits_default();
    lim.max_width = 100;
    lim.max_height = 200;
    lim.max_pixels = 100 * 100;
    ctx = gw_prep_ctx_new(&lim);
    cr_assert_eq(gw_prep_ctx_limits(ctx)->max_pixels, 100 * 100);
    const int ok[][2] = {{100, 100}, {50, 200}};
    const int over[][2] = {{101, 10}, {10, 201}, {100, 101}};
    for (int i = 0; i < 2; i++) {
        b = scene_jpeg(ok[i][0], ok[i][1]);
        cr_assert_eq(decode(ctx, b, 8, 8, GW_RESIZE_BILINEAR, dst, &info, err), 0, "%s", err);
        blob_free(&b);
    }
    for (int i = 0; i < 3; i++) {
        b = scene_jpeg(over[i][0], over[i][1]);
        cr_assert_eq(decode(ctx, b, 8, 8, GW_RESIZE_BILINEAR, dst, &info, err), SQ_TOO_LARGE,
                     "%dx%d", over[i][0], over[i][1]);
        b.len = find_marker(b, 0xDA) + 20;
        cr_assert_eq(decode(ctx, b, 8, 8, GW_RESIZE_BILINEAR, dst, &info, err), SQ_TOO_LARGE,
                     "%dx%d truncated", over[i][0], over[i][1]);
        blob_free(&b);
    }
    gw_prep_ctx_free(ctx);
}

Test(preprocess, bad_arguments_are_inval)
{
    blob_t b = scene_jpeg(16, 16);
    gw_prep_ctx_t *ctx = ctx_with(1);
    uint8_t dst[16 * 16 * 3];
    char err[256];
    cr_assert_eq(
        gw_image_to_rgb(NULL, b.data, b.len, 4, 4, GW_RESIZE_BILINEAR, dst, NULL, err, sizeof(err)),
        SQ_INVAL);
    cr_assert_eq(
        gw_image_to_rgb(ctx, b.data, b.len, 0, 4, GW_RESIZE_BILINEAR, dst, NULL, err, sizeof(err)),
        SQ_INVAL);
    cr_assert_eq(
        gw_image_to_rgb(ctx, b.data, b.len, 4, 4, GW_RESIZE_BILINEAR, NULL, NULL, err, sizeof(err)),
        SQ_INVAL);
    cr_assert_eq(
        gw_image_to_rgb(ctx, b.data, b.len, 4, 4, (gw_resize_t)7, dst, NULL, err, sizeof(err)),
        SQ_INVAL);
    cr_assert_eq(gw_resize_rgb(ctx, dst, 4, 4, 11, dst, 2, 2, GW_RESIZE_BILINEAR), SQ_INVAL,
                 "stride shorter than a row");
    gw_prep_ctx_free(NULL);
    blob_free(&b);
    gw_prep_ctx_free(ctx);
}

/* ---- the pool ------------------------------------------------------- */

typedef struct {
    gw_prep_job_t job;
    atomic_int calls;
    int rc;
    pthread_t thread;
} tjob_t;

static pthread_t main_thread;

static void on_done(gw_prep_job_t *job, int rc)
{
    tjob_t *t = (tjob_t *)job;
    t->rc = rc;
    t->thread = pthread_self();
    atomic_fetch_add(&t->calls, 1);
}

static void tjob_init(tjob_t *t, blob_t b, int w, int h, uint8_t *dst, gw_prep_done_fn done)
{
    memset(t, 0, sizeof(*t));
    t->job = (gw_prep_job_t){.data = b.data,
                             .len = b.len,
                             .out_w = w,
                             .out_h = h,
                             .dst = dst,
                             .mode = GW_RESIZE_BILINEAR,
                             .done = done,
                             .user = t};
}

static gw_prep_pool_t *pool_new(int threads, int capacity)
{
    gw_prep_pool_config_t cfg = {
        .threads = threads, .queue_capacity = capacity, .limits = gw_prep_limits_default()};
    gw_prep_pool_t *pool = NULL;
    cr_assert_eq(gw_prep_pool_new(&cfg, &pool), 0);
    return pool;
}

static void wait_for(atomic_int *v, int want)
{
    for (int i = 0; i < 10000 && atomic_load(v) < want; i++)
        usleep(1000);
    cr_assert_geq(atomic_load(v), want, "timed out waiting");
}

Test(prep_pool, every_job_completes_once_on_a_pool_thread, .timeout = 60)
{
    main_thread = pthread_self();
    enum { N = 120 };
    blob_t imgs[3] = {scene_jpeg(640, 480), scene_jpeg(100, 80), {0}};
    imgs[2] = (blob_t){.data = (uint8_t *)"\x89PNG\r\n\x1a\n", .len = 8};
    uint8_t *want[2];
    gw_prep_ctx_t *ctx = ctx_with(1);
    for (int i = 0; i < 2; i++) {
        want[i] = malloc(64 * 48 * 3);
        cr_assert_eq(gw_image_to_rgb(ctx, imgs[i].data, imgs[i].len, 64, 48, GW_RESIZE_BILINEAR,
                                     want[i], NULL, NULL, 0),
                     0);
    }
    gw_prep_ctx_free(ctx);

    gw_prep_pool_t *pool = pool_new(3, N);
    tjob_t *jobs = calloc(N, sizeof(tjob_t));
    uint8_t *dst = malloc((size_t)N * 64 * 48 * 3);
    for (int i = 0; i < N; i++) {
        tjob_init(&jobs[i], imgs[i % 3], 64, 48, dst + (size_t)i * 64 * 48 * 3, on_done);
        cr_assert_eq(gw_prep_pool_submit(pool, &jobs[i].job), 0);
    }
    gw_prep_pool_shutdown(pool, GW_PREP_DRAIN);
    for (int i = 0; i < N; i++) {
        cr_assert_eq(atomic_load(&jobs[i].calls), 1, "job %d called %d times", i,
                     atomic_load(&jobs[i].calls));
        cr_assert(!pthread_equal(jobs[i].thread, main_thread));
        cr_assert_leq(jobs[i].job.queued_ns, jobs[i].job.started_ns);
        cr_assert_leq(jobs[i].job.started_ns, jobs[i].job.finished_ns);
        if (i % 3 == 2) {
            cr_assert_eq(jobs[i].rc, SQ_MEDIA_TYPE);
            cr_assert(strstr(jobs[i].job.err, "png") != NULL, "%s", jobs[i].job.err);
        } else {
            cr_assert_eq(jobs[i].rc, 0, "job %d: %s", i, jobs[i].job.err);
            cr_assert_eq(memcmp(jobs[i].job.dst, want[i % 3], 64 * 48 * 3), 0, "job %d pixels", i);
            cr_assert_eq(jobs[i].job.info.width, i % 3 == 0 ? 640 : 100);
        }
    }
    tjob_t late;
    tjob_init(&late, imgs[0], 64, 48, dst, on_done);
    cr_assert_eq(gw_prep_pool_submit(pool, &late.job), SQ_SHUTTING_DOWN);
    gw_prep_pool_shutdown(pool, GW_PREP_CANCEL); /* a second call does nothing */
    gw_prep_pool_free(pool);
    cr_assert_eq(atomic_load(&late.calls), 0);
    free(jobs);
    free(dst);
    free(want[0]);
    free(want[1]);
    blob_free(&imgs[0]);
    blob_free(&imgs[1]);
}

/* A callback that holds its pool thread until the test opens the gate, so
 * that the queue state is deterministic. */
static atomic_int gate_entered, gate_open;

static void on_done_gated(gw_prep_job_t *job, int rc)
{
    atomic_fetch_add(&gate_entered, 1);
    while (!atomic_load(&gate_open))
        usleep(200);
    on_done(job, rc);
}

Test(prep_pool, a_full_queue_is_overload)
{
    atomic_store(&gate_entered, 0);
    atomic_store(&gate_open, 0);
    blob_t b = scene_jpeg(64, 64);
    uint8_t dst[5][16 * 16 * 3];
    tjob_t jobs[5];
    gw_prep_pool_t *pool = pool_new(1, 2);
    tjob_init(&jobs[0], b, 16, 16, dst[0], on_done_gated);
    cr_assert_eq(gw_prep_pool_submit(pool, &jobs[0].job), 0);
    wait_for(&gate_entered, 1); /* the only thread is busy with job 0 */
    for (int i = 1; i < 5; i++)
        tjob_init(&jobs[i], b, 16, 16, dst[i], on_done);
    cr_assert_eq(gw_prep_pool_submit(pool, &jobs[1].job), 0);
    cr_assert_eq(gw_prep_pool_submit(pool, &jobs[2].job), 0);
    cr_assert_eq(gw_prep_pool_queued(pool), 2);
    cr_assert_eq(gw_prep_pool_submit(pool, &jobs[3].job), SQ_OVERLOAD);
    cr_assert_eq(sq_err_http_status(SQ_OVERLOAD), 503);
    atomic_store(&gate_open, 1);
    wait_for(&jobs[2].calls, 1);
    /* room again */
    cr_assert_eq(gw_prep_pool_submit(pool, &jobs[4].job), 0);
    gw_prep_pool_free(pool);
    for (int i = 0; i < 5; i++)
        cr_assert_eq(atomic_load(&jobs[i].calls), i == 3 ? 0 : 1, "job %d", i);
    cr_assert_eq(jobs[1].rc, 0);
    cr_assert_eq(jobs[4].rc, 0);
    blob_free(&b);
}

static void *shutdown_cancel(void *pool)
{
    gw_prep_pool_shutdown(pool, GW_PREP_CANCEL);
    return NULL;
}

Test(prep_pool, shutdown_cancel_answers_queued_jobs_with_shutting_down)
{
    atomic_store(&gate_entered, 0);
    atomic_store(&gate_open, 0);
    blob_t b = scene_jpeg(64, 64);
    enum { N = 8 };
    static uint8_t dst[N][16 * 16 * 3];
    static tjob_t jobs[N];
    gw_prep_pool_t *pool = pool_new(1, N - 1);
    tjob_init(&jobs[0], b, 16, 16, dst[0], on_done_gated);
    cr_assert_eq(gw_prep_pool_submit(pool, &jobs[0].job), 0);
    wait_for(&gate_entered, 1);
    for (int i = 1; i < N; i++) {
        tjob_init(&jobs[i], b, 16, 16, dst[i], on_done);
        cr_assert_eq(gw_prep_pool_submit(pool, &jobs[i].job), 0);
    }
    pthread_t t;
    pthread_create(&t, NULL, shutdown_cancel, pool);
    /* wait until shutdown has begun: submits are refused */
    tjob_t probe;
    tjob_init(&probe, b, 16, 16, dst[0], on_done);
    int refused = 0;
    for (int i = 0; i < 5000 && !refused; i++) {
        int rc = gw_prep_pool_submit(pool, &probe.job);
        cr_assert(rc == SQ_OVERLOAD || rc == SQ_SHUTTING_DOWN, "rc %d", rc);
        refused = rc == SQ_SHUTTING_DOWN;
        if (!refused)
            usleep(1000);
    }
    cr_assert(refused);
    atomic_store(&gate_open, 1);
    pthread_join(t, NULL);
    cr_assert_eq(jobs[0].rc, 0, "the running job finishes");
    for (int i = 1; i < N; i++) {
        cr_assert_eq(atomic_load(&jobs[i].calls), 1);
        cr_assert_eq(jobs[i].rc, SQ_SHUTTING_DOWN, "job %d rc %d", i, jobs[i].rc);
    }
    cr_assert_eq(atomic_load(&probe.calls), 0);
    gw_prep_pool_free(pool);
    blob_free(&b);
}

Test(prep_pool, a_job_that_cannot_start_in_time_is_refused_at_submit)
{
    atomic_store(&gate_entered, 0);
    atomic_store(&gate_open, 0);
    enum { N = 20 };
    blob_t b = scene_jpeg(640, 480);
    static uint8_t dst[N + 4][32 * 32 * 3];
    tjob_t seed, gated, jobs[N], tight, loose;
    gw_prep_pool_t *pool = pool_new(1, 64);
    /* With no decode measured yet, nothing is predicted. */
    tjob_init(&seed, b, 32, 32, dst[0], on_done);
    cr_assert_eq(gw_prep_pool_submit(pool, &seed.job), 0);
    wait_for(&seed.calls, 1);
    cr_assert_eq(seed.rc, 0, "%s", seed.job.err);
    /* The only thread is held; N jobs wait behind it. */
    tjob_init(&gated, b, 32, 32, dst[1], on_done_gated);
    cr_assert_eq(gw_prep_pool_submit(pool, &gated.job), 0);
    wait_for(&gate_entered, 1);
    for (int i = 0; i < N; i++) {
        tjob_init(&jobs[i], b, 32, 32, dst[2], on_done);
        cr_assert_eq(gw_prep_pool_submit(pool, &jobs[i].job), 0);
    }
    /* N decodes of a 640x480 JPEG take far more than 2 us: refused now,
     * not answered at its deadline; one with a minute to spare waits. */
    tjob_init(&tight, b, 32, 32, dst[3], on_done);
    tight.job.deadline_ns = sq_now_ns() + 2000;
    cr_assert_eq(gw_prep_pool_submit(pool, &tight.job), SQ_DEADLINE);
    cr_assert_eq(sq_err_http_status(SQ_DEADLINE), 503);
    tjob_init(&loose, b, 32, 32, dst[4], on_done);
    loose.job.deadline_ns = sq_now_ns() + 60ll * 1000000000;
    cr_assert_eq(gw_prep_pool_submit(pool, &loose.job), 0);
    cr_assert_eq(gw_prep_pool_queued(pool), N + 1);
    atomic_store(&gate_open, 1);
    gw_prep_pool_free(pool);
    cr_assert_eq(atomic_load(&tight.calls), 0, "a refused job is never called back");
    cr_assert_eq(atomic_load(&loose.calls), 1);
    cr_assert_eq(loose.rc, 0, "%s", loose.job.err);
    blob_free(&b);
}

Test(prep_pool, a_job_too_close_to_its_deadline_for_a_decode_is_not_decoded)
{
    atomic_store(&gate_entered, 0);
    atomic_store(&gate_open, 0);
    blob_t b = scene_jpeg(2000, 1500);
    static uint8_t dst[3][224 * 224 * 3];
    tjob_t seed, gated, close;
    gw_prep_pool_t *pool = pool_new(1, 8);
    tjob_init(&seed, b, 224, 224, dst[0], on_done);
    cr_assert_eq(gw_prep_pool_submit(pool, &seed.job), 0);
    wait_for(&seed.calls, 1);
    int64_t decode_ns = seed.job.finished_ns - seed.job.started_ns;
    cr_assert_gt(decode_ns, 2000000, "a 2000x1500 decode takes over 2 ms (%lld ns)",
                 (long long)decode_ns);
    tjob_init(&gated, b, 224, 224, dst[1], on_done_gated);
    cr_assert_eq(gw_prep_pool_submit(pool, &gated.job), 0);
    wait_for(&gate_entered, 1);
    /* Nothing waits ahead of it, so it is accepted; when it reaches the
     * thread, half a decode is left before its deadline. */
    tjob_init(&close, b, 224, 224, dst[2], on_done);
    close.job.deadline_ns = sq_now_ns() + decode_ns / 2;
    cr_assert_eq(gw_prep_pool_submit(pool, &close.job), 0);
    atomic_store(&gate_open, 1);
    gw_prep_pool_free(pool);
    cr_assert_eq(atomic_load(&close.calls), 1);
    cr_assert_eq(close.rc, SQ_DEADLINE);
    cr_assert(strstr(close.job.err, "too close to its deadline") != NULL, "%s", close.job.err);
    cr_assert_lt(close.job.finished_ns - close.job.started_ns, decode_ns / 2, "not decoded");
    blob_free(&b);
}

Test(prep_pool, a_job_past_its_deadline_is_not_decoded)
{
    blob_t b = scene_jpeg(64, 64);
    uint8_t dst[16 * 16 * 3];
    memset(dst, 0xAB, sizeof(dst));
    tjob_t late, fine;
    tjob_init(&late, b, 16, 16, dst, on_done);
    late.job.deadline_ns = sq_now_ns() - 1;
    uint8_t dst2[16 * 16 * 3];
    tjob_init(&fine, b, 16, 16, dst2, on_done);
    fine.job.deadline_ns = sq_now_ns() + 60ll * 1000000000;
    gw_prep_pool_t *pool = pool_new(2, 4);
    cr_assert_eq(gw_prep_pool_submit(pool, &late.job), 0);
    cr_assert_eq(gw_prep_pool_submit(pool, &fine.job), 0);
    gw_prep_pool_free(pool);
    cr_assert_eq(late.rc, SQ_DEADLINE);
    cr_assert(strstr(late.job.err, "deadline") != NULL, "%s", late.job.err);
    for (size_t i = 0; i < sizeof(dst); i++)
        cr_assert_eq(dst[i], 0xAB, "dst untouched");
    cr_assert_eq(fine.rc, 0, "%s", fine.job.err);
    blob_free(&b);
}

Test(prep_pool, bad_configs_and_jobs_are_inval)
{
    gw_prep_pool_t *pool = (gw_prep_pool_t *)1;
    gw_prep_pool_config_t cfg = {
        .threads = 0, .queue_capacity = 4, .limits = gw_prep_limits_default()};
    cr_assert_eq(gw_prep_pool_new(&cfg, &pool), SQ_INVAL);
    cr_assert_null(pool);
    cfg.threads = 1;
    cfg.queue_capacity = 0;
    cr_assert_eq(gw_prep_pool_new(&cfg, &pool), SQ_INVAL);
    pool = pool_new(1, 1);
    uint8_t dst[3];
    tjob_t t;
    blob_t b = {.data = (uint8_t *)"x", .len = 1};
    tjob_init(&t, b, 1, 1, dst, NULL);
    cr_assert_eq(gw_prep_pool_submit(pool, &t.job), SQ_INVAL, "no callback");
    tjob_init(&t, b, 0, 1, dst, on_done);
    cr_assert_eq(gw_prep_pool_submit(pool, &t.job), SQ_INVAL, "no size");
    tjob_init(&t, b, 1, 1, NULL, on_done);
    cr_assert_eq(gw_prep_pool_submit(pool, &t.job), SQ_INVAL, "no dst");
    gw_prep_pool_free(pool);
    gw_prep_pool_free(NULL);
}

Test(prep_pool, a_kept_frame_is_decoded_at_the_smallest_scale_that_covers_keep_cover)
{
    /* Issue 23: a 12 MP frame kept for a pipeline's crops was decoded at
     * full size. 2048 x 1536 kept to cover 224 px: 1/4 (512 x 384; 1/8
     * gives 192 rows); without keep_cover, at full size. Its pixels are
     * what the same DCT scale gives without keeping it. */
    blob_t img = scene_jpeg(2048, 1536);
    gw_prep_pool_t *pool = pool_new(1, 4);
    uint8_t *dst = malloc(128 * 128 * 3 * 2);
    tjob_t jobs[2];
    for (int i = 0; i < 2; i++) {
        tjob_init(&jobs[i], img, 128, 128, dst + i * 128 * 128 * 3, on_done);
        jobs[i].job.keep_original = 1;
        jobs[i].job.keep_cover = i == 0 ? 224 : 0;
        cr_assert_eq(gw_prep_pool_submit(pool, &jobs[i].job), 0);
    }
    gw_prep_pool_shutdown(pool, GW_PREP_DRAIN);
    cr_assert_eq(jobs[0].rc, 0, "%s", jobs[0].job.err);
    cr_assert_eq(jobs[1].rc, 0, "%s", jobs[1].job.err);
    const gw_image_info_t *a = &jobs[0].job.info, *b = &jobs[1].job.info;
    cr_assert_eq(a->width, 2048);
    cr_assert_eq(a->decoded_width, 512);
    cr_assert_eq(a->decoded_height, 384);
    cr_assert_eq(b->decoded_width, 2048);
    cr_assert_eq(b->decoded_height, 1536);
    cr_assert_not_null(jobs[0].job.original);
    /* The target is the kept image resized. */
    gw_prep_ctx_t *ctx = ctx_with(1);
    uint8_t *want = malloc(128 * 128 * 3);
    cr_assert_eq(gw_resize_rgb(ctx, jobs[0].job.original, 512, 384, 512 * 3, want, 128, 128,
                               GW_RESIZE_BILINEAR),
                 0);
    cr_assert_eq(memcmp(want, dst, 128 * 128 * 3), 0);
    /* The pool plans a large file's decode from its size: one twice as
     * large is expected to take about twice as long; a small one, the mean
     * (a small file's time is mostly a decode's fixed cost). */
    cr_assert_geq(img.len, GW_PREP_BYTE_RATE_MIN, "%zu bytes", img.len);
    double mean = gw_prep_pool_decode_us(pool);
    double one = gw_prep_pool_decode_us_for(pool, 4 * img.len);
    double two = gw_prep_pool_decode_us_for(pool, 8 * img.len);
    cr_assert_gt(one, mean);
    cr_assert_float_eq(two, 2 * one, 1e-6 * one);
    cr_assert_float_eq(gw_prep_pool_decode_us_for(pool, 1000), mean, 1e-9);
    gw_prep_ctx_free(ctx);
    free(want);
    free(jobs[0].job.original);
    free(jobs[1].job.original);
    gw_prep_pool_free(pool);
    free(dst);
    blob_free(&img);
}

/* A decode estimate: the first sample is the mean; then the mean and the
 * mean absolute deviation move by GW_PREP_EST_WEIGHT, the deviation taken
 * from the mean before the sample; the p99 is the mean plus
 * GW_PREP_EST_P99_DEVS deviations. */
Test(prep_pool, a_decode_estimate_follows_its_mean_and_its_spread)
{
    gw_prep_est_t e = {0};
    cr_assert_float_eq(gw_prep_est_p99(&e), 0, 1e-12);
    gw_prep_est_add(&e, 1000);
    cr_assert_eq(e.samples, 1);
    cr_assert_float_eq(e.mean_ns, 1000, 1e-9);
    cr_assert_float_eq(e.dev_ns, 0, 1e-9);
    cr_assert_float_eq(gw_prep_est_p99(&e), 1000, 1e-9);
    gw_prep_est_add(&e, 3000); /* 2000 above the mean */
    cr_assert_eq(e.samples, 2);
    cr_assert_float_eq(e.mean_ns, 0.9 * 1000 + 0.1 * 3000, 1e-9);
    cr_assert_float_eq(e.dev_ns, 0.1 * 2000, 1e-9);
    cr_assert_float_eq(gw_prep_est_p99(&e), 1200 + GW_PREP_EST_P99_DEVS * 200, 1e-9);
    gw_prep_est_add(&e, 200); /* 1000 below the mean */
    cr_assert_float_eq(e.mean_ns, 0.9 * 1200 + 0.1 * 200, 1e-9);
    cr_assert_float_eq(e.dev_ns, 0.9 * 200 + 0.1 * 1000, 1e-9);
    /* Steady samples: the deviation decays, the p99 comes to the mean. */
    for (int i = 0; i < 300; i++)
        gw_prep_est_add(&e, 1000);
    cr_assert_float_eq(gw_prep_est_p99(&e), 1000, 1e-6);
    /* Samples that alternate 1000 and 3000 (a decode that loses its core
     * every other time): the mean near 2000, the deviation near 1000, the
     * p99 above the slow ones, where the mean is below them. */
    for (int i = 0; i < 400; i++)
        gw_prep_est_add(&e, i % 2 ? 3000 : 1000);
    cr_assert_float_eq(e.mean_ns, 2000, 150);
    cr_assert_float_eq(e.dev_ns, 1000, 150);
    cr_assert_gt(gw_prep_est_p99(&e), 3000);
}

/* The split reserves a small frame's p99: the large files' decodes (planned
 * from their size) count in the per-byte estimate, not in it; before any
 * small frame, the p99 of every decode. The mean submit and the "too close"
 * check use stays every decode's mean. */
Test(prep_pool, the_split_reserves_the_p99_of_small_frames, .timeout = 60)
{
    blob_t big = scene_jpeg(2048, 1536);
    blob_t small = scene_jpeg(320, 240);
    cr_assert_geq(big.len, GW_PREP_BYTE_RATE_MIN);
    cr_assert_lt(small.len, GW_PREP_BYTE_RATE_MIN);
    gw_prep_pool_t *pool = pool_new(1, 4);
    cr_assert_float_eq(gw_prep_pool_decode_p99_us(pool), 0, 1e-12, "nothing measured yet");
    static uint8_t dst[224 * 224 * 3];
    tjob_t t;
    tjob_init(&t, big, 224, 224, dst, on_done);
    cr_assert_eq(gw_prep_pool_submit(pool, &t.job), 0);
    wait_for(&t.calls, 1);
    double big_us = (double)(t.job.finished_ns - t.job.started_ns) / 1e3;
    gw_prep_costs_t c;
    gw_prep_pool_costs(pool, &c);
    cr_assert_eq(c.decode.samples, 1);
    cr_assert_eq(c.per_byte.samples, 1);
    cr_assert_eq(c.frame.samples, 0);
    cr_assert_float_eq(c.per_byte.mean_ns * (double)big.len, c.decode.mean_ns, 1e-6 * big_us);
    /* Only a large file so far: its decode. */
    cr_assert_float_eq(gw_prep_pool_decode_p99_us(pool), c.decode.mean_ns / 1e3, 1e-9);
    for (int i = 0; i < 8; i++) {
        tjob_init(&t, small, 224, 224, dst, on_done);
        cr_assert_eq(gw_prep_pool_submit(pool, &t.job), 0);
        wait_for(&t.calls, 1);
    }
    gw_prep_pool_costs(pool, &c);
    cr_assert_eq(c.frame.samples, 8);
    cr_assert_eq(c.decode.samples, 9);
    cr_assert_eq(c.per_byte.samples, 1);
    double p99 = gw_prep_pool_decode_p99_us(pool);
    cr_assert_float_eq(p99, gw_prep_est_p99(&c.frame) / 1e3, 1e-9);
    cr_assert_geq(p99, c.frame.mean_ns / 1e3);
    cr_assert_lt(p99, big_us, "a small frame's p99 (%.0f us) is not the large decode (%.0f us)",
                 p99, big_us);
    cr_assert_float_eq(gw_prep_pool_decode_us(pool), c.decode.mean_ns / 1e3, 1e-9);
    gw_prep_pool_free(pool);
    blob_free(&big);
    blob_free(&small);
}

/* Estimates stored by an earlier run seed a pool that has none: its first
 * frame is planned from them (the split's p99, the per-size estimate of
 * the "too close" check); a decode then moves them as one more sample.
 * An estimate measured here is never replaced, and junk is ignored. */
Test(prep_pool, stored_estimates_seed_a_new_pool_and_only_a_new_one, .timeout = 60)
{
    gw_prep_pool_t *pool = pool_new(1, 4);
    gw_prep_costs_t stored = {
        .decode = {.mean_ns = 6e6, .dev_ns = 1e6, .samples = 1000},
        .frame = {.mean_ns = 5e6, .dev_ns = 2e6, .samples = 900},
        .per_byte = {.mean_ns = 40, .dev_ns = 4, .samples = 100},
    };
    gw_prep_pool_seed(pool, &stored);
    cr_assert_float_eq(gw_prep_pool_decode_p99_us(pool), (5e6 + GW_PREP_EST_P99_DEVS * 2e6) / 1e3,
                       1e-9);
    cr_assert_float_eq(gw_prep_pool_decode_us(pool), 6000, 1e-9);
    cr_assert_float_eq(gw_prep_pool_decode_us_for(pool, 1000000), 40000, 1e-9);
    cr_assert_float_eq(gw_prep_pool_decode_us_for(pool, 1000), 6000, 1e-9);
    blob_t small = scene_jpeg(320, 240);
    static uint8_t dst[224 * 224 * 3];
    tjob_t t;
    tjob_init(&t, small, 224, 224, dst, on_done);
    cr_assert_eq(gw_prep_pool_submit(pool, &t.job), 0);
    wait_for(&t.calls, 1);
    double took_ns = (double)(t.job.finished_ns - t.job.started_ns);
    gw_prep_costs_t c;
    gw_prep_pool_costs(pool, &c);
    cr_assert_eq(c.frame.samples, 901);
    cr_assert_float_eq(c.frame.mean_ns, 0.9 * 5e6 + 0.1 * took_ns, 0.02 * 5e6);
    /* A second seed changes nothing measured or seeded. */
    gw_prep_costs_t other = {.frame = {.mean_ns = 1, .dev_ns = 0, .samples = 5}};
    gw_prep_pool_seed(pool, &other);
    gw_prep_costs_t after;
    gw_prep_pool_costs(pool, &after);
    cr_assert_eq(memcmp(&after, &c, sizeof(c)), 0);
    gw_prep_pool_free(pool);
    /* Junk (not finite, negative, no samples) seeds nothing. */
    pool = pool_new(1, 4);
    gw_prep_costs_t junk = {
        .decode = {.mean_ns = NAN, .dev_ns = 1, .samples = 3},
        .frame = {.mean_ns = 1e6, .dev_ns = -1, .samples = 3},
        .per_byte = {.mean_ns = 40, .dev_ns = 4, .samples = 0},
    };
    gw_prep_pool_seed(pool, &junk);
    gw_prep_pool_costs(pool, &c);
    cr_assert_eq(c.decode.samples + c.frame.samples + c.per_byte.samples, 0);
    cr_assert_float_eq(gw_prep_pool_decode_p99_us(pool), 0, 1e-12);
    gw_prep_pool_free(pool);
    blob_free(&small);
}

/* ---- the YUV planes path against the RGB path ------------------------ */

static gw_prep_ctx_t *ctx_planes(int planes)
{
    gw_prep_limits_t lim = gw_prep_limits_default();
    lim.yuv_planes = planes;
    gw_prep_ctx_t *ctx = gw_prep_ctx_new(&lim);
    cr_assert_not_null(ctx);
    return ctx;
}

/* Runs b through both paths to w x h and returns the max and mean
 * absolute difference per channel value. */
static void planes_vs_rgb(blob_t b, int w, int h, gw_resize_t mode, const char *what, int *max_out,
                          double *mean_out, int *scaled)
{
    gw_prep_ctx_t *yuv = ctx_planes(1), *rgb = ctx_planes(0);
    size_t n = (size_t)w * h * 3;
    uint8_t *a = malloc(n), *c = malloc(n);
    gw_image_info_t ia, ic;
    char err[256];
    cr_assert_eq(decode(yuv, b, w, h, mode, a, &ia, err), 0, "%s: %s", what, err);
    cr_assert_eq(decode(rgb, b, w, h, mode, c, &ic, err), 0, "%s: %s", what, err);
    cr_assert_eq(ia.decoded_width, ic.decoded_width, "%s", what);
    cr_assert_eq(ia.decoded_height, ic.decoded_height, "%s", what);
    *max_out = max_abs_diff(a, c, n);
    *mean_out = mean_abs_diff(a, c, n);
    *scaled = ia.scale_denom > ia.scale_num;
    cr_log_info("planes vs rgb: %s -> %dx%d %s: max %d mean %.3f", what, w, h, gw_resize_name(mode),
                *max_out, *mean_out);
    free(a);
    free(c);
    gw_prep_ctx_free(yuv);
    gw_prep_ctx_free(rgb);
}

Test(preprocess, yuv_planes_path_matches_the_rgb_path, .timeout = 60)
{
    struct {
        int w, h, subsamp, flags, gray;
        const char *what;
    } cases[] = {
        {640, 480, TJSAMP_420, 0, 0, "640x480 4:2:0"},
        {640, 480, TJSAMP_422, 0, 0, "640x480 4:2:2"},
        {640, 480, TJSAMP_444, 0, 0, "640x480 4:4:4"},
        {640, 480, TJSAMP_420, TJFLAG_PROGRESSIVE, 0, "640x480 progressive 4:2:0"},
        {640, 480, TJSAMP_GRAY, 0, 1, "640x480 gray"},
        {333, 251, TJSAMP_420, 0, 0, "333x251 4:2:0"},
        {1001, 777, TJSAMP_422, 0, 0, "1001x777 4:2:2"},
        {7, 13, TJSAMP_420, 0, 0, "7x13 4:2:0"},
        /* too narrow for DCT scaling: a 2000 -> 61 row reduction, many taps */
        {40, 2000, TJSAMP_420, 0, 0, "40x2000 4:2:0"},
    };
    int targets[][2] = {{224, 224}, {97, 61}, {300, 260}};
    int worst = 0;
    double worst_mean = 0;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        uint8_t *src = scene_rgb(cases[i].w, cases[i].h);
        blob_t b;
        if (cases[i].gray) {
            uint8_t *g = malloc((size_t)cases[i].w * cases[i].h);
            for (size_t k = 0; k < (size_t)cases[i].w * cases[i].h; k++)
                g[k] = src[3 * k + 1];
            b = compress(g, cases[i].w, cases[i].h, TJPF_GRAY, TJSAMP_GRAY, 90, 0);
            free(g);
        } else {
            b = compress(src, cases[i].w, cases[i].h, TJPF_RGB, cases[i].subsamp, 90,
                         cases[i].flags);
        }
        for (size_t t = 0; t < sizeof(targets) / sizeof(targets[0]); t++)
            for (int m = 0; m < 2; m++) {
                int mx, scaled;
                double mean;
                planes_vs_rgb(b, targets[t][0], targets[t][1],
                              m ? GW_RESIZE_NEAREST : GW_RESIZE_BILINEAR, cases[i].what, &mx, &mean,
                              &scaled);
                /* Tolerances. Gray: the same resize of the same Y plane,
                 * exact. Colour: the same linear resize of Y, Cb, Cr (chroma
                 * upsampled the way libjpeg's fancy upsampling does), with
                 * the conversion after the resize instead of before it: the
                 * resized Y, Cb, Cr are rounded to levels before the
                 * conversion, which scales a half-level error in Cb by 1.772
                 * and clamps differently near 0 and 255: within 4 levels,
                 * mean under 0.75 (measured 0.6 at most). Except 4:2:0 under DCT scaling: there
                 * libjpeg decodes chroma at luma size by IDCT scaling of the
                 * chroma blocks (no upsampling), which the planes API cannot
                 * give; the triangle upsampling moves sharp colour edges by
                 * tens of levels (measured max 27 bilinear), the mean by 2 at
                 * most. The 7x13 image (a 4x7 chroma plane) stays exact
                 * within the same bounds. */
                if (cases[i].gray) {
                    cr_assert_eq(mx, 0, "%s: gray is the same resize of the same Y", cases[i].what);
                } else if (cases[i].subsamp == TJSAMP_420 && scaled) {
                    cr_assert(mean < 4.0, "%s: mean %.3f", cases[i].what, mean);
                } else {
                    cr_assert(mx <= 4 && mean < 0.75, "%s: max %d mean %.3f", cases[i].what, mx,
                              mean);
                }
                if (mx > worst)
                    worst = mx;
                if (mean > worst_mean)
                    worst_mean = mean;
            }
        blob_free(&b);
        free(src);
    }
    FILE *f = fopen(HOPPER, "rb");
    if (f != NULL) {
        blob_t b = {.data = malloc(1 << 20)};
        b.len = fread(b.data, 1, 1 << 20, f);
        fclose(f);
        for (int m = 0; m < 2; m++) {
            int mx, scaled;
            double mean;
            planes_vs_rgb(b, 224, 224, m ? GW_RESIZE_NEAREST : GW_RESIZE_BILINEAR,
                          "grace_hopper.jpg", &mx, &mean, &scaled);
            cr_assert(mean < 1.5, "grace_hopper: mean %.3f", mean);
            if (mx > worst)
                worst = mx;
            if (mean > worst_mean)
                worst_mean = mean;
        }
        blob_free(&b);
    }
    cr_log_info("planes vs rgb: worst max %d, worst mean %.3f", worst, worst_mean);
}

Test(preprocess, yuv_planes_path_errors_and_fallbacks)
{
    gw_prep_ctx_t *ctx = ctx_planes(1);
    uint8_t *src = scene_rgb(320, 240);
    blob_t b = compress(src, 320, 240, TJPF_RGB, TJSAMP_420, 90, 0);
    uint8_t *dst = malloc(64 * 64 * 3);
    gw_image_info_t info;
    char err[256];
    /* truncated: the decoder's warning is an error, as on the RGB path */
    blob_t cut = {.data = b.data, .len = b.len / 2};
    cr_assert_eq(decode(ctx, cut, 64, 64, GW_RESIZE_BILINEAR, dst, &info, err), SQ_BAD_IMAGE);
    cr_assert(strstr(err, "bad jpeg") != NULL, "%s", err);
    /* the same context decodes the next good image */
    cr_assert_eq(decode(ctx, b, 64, 64, GW_RESIZE_BILINEAR, dst, &info, err), 0, "%s", err);
    blob_free(&b);
    /* CMYK is not covered by the planes path: the RGB path takes it */
    uint8_t *cmyk = malloc(32 * 32 * 4);
    memset(cmyk, 200, 32 * 32 * 4);
    b = compress(cmyk, 32, 32, TJPF_CMYK, TJSAMP_444, 95, 0);
    cr_assert_eq(decode(ctx, b, 16, 16, GW_RESIZE_BILINEAR, dst, &info, err), 0, "%s", err);
    cr_assert(info.colorspace == TJCS_YCCK || info.colorspace == TJCS_CMYK);
    blob_free(&b);
    free(cmyk);
    free(dst);
    free(src);
    gw_prep_ctx_free(ctx);
}
