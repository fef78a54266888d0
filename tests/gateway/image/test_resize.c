/* gateway/image/resize.c: the fixed-point resize's exact integers against
 * a naive reference written from its definition (PIL's triangle filter,
 * 14-bit weights that sum to exactly one, vertical then horizontal pass,
 * each rounded), its axis weights, and its arguments. */
#include "image_int.h"

#include <criterion/criterion.h>
#include <gw_image.h>
#include <sq.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- the naive reference -------------------------------------------- */

/* One output pixel's taps: source pixels first..first+n-1, weights w. */
typedef struct {
    int first, n;
    int32_t w[4096];
} taps_t;

static double tri(double t)
{
    t = fabs(t);
    return t < 1.0 ? 1.0 - t : 0.0;
}

static taps_t naive_taps(int in, int out, int i, gw_resize_t mode)
{
    taps_t t = {0, 1, {16384}};
    if (mode == GW_RESIZE_NEAREST) {
        /* the source pixel whose center (k + 0.5) is closest to the output
         * center (i + 0.5) * in / out, ties to the right */
        int64_t k = ((int64_t)2 * i + 1) * in / ((int64_t)2 * out);
        t.first = k < in ? (int)k : in - 1;
        return t;
    }
    double scale = (double)in / out, support = scale > 1 ? scale : 1;
    double center = (i + 0.5) * scale;
    double w[4096], sum = 0;
    int first = -1, last = -1;
    for (int k = 0; k < in; k++) {
        double v = tri((k + 0.5 - center) / support);
        if (v > 0 && (int)floor(center - support + 0.5) <= k &&
            k < (int)floor(center + support + 0.5)) {
            if (first < 0)
                first = k;
            last = k;
        }
    }
    for (int k = first; k <= last; k++)
        sum += (w[k - first] = tri((k + 0.5 - center) / support));
    int32_t total = 0;
    int big = 0;
    for (int k = 0; k <= last - first; k++) {
        t.w[k] = (int32_t)lround(w[k] / sum * 16384);
        total += t.w[k];
        if (t.w[k] > t.w[big])
            big = k;
    }
    t.w[big] += 16384 - total; /* the residue to the first largest tap */
    t.first = first;
    t.n = last - first + 1;
    return t;
}

static uint8_t round14(int64_t v)
{
    return (uint8_t)((v + 8192) >> 14);
}

static void naive_resize(const uint8_t *src, int sw, int sh, size_t stride, uint8_t *dst, int dw,
                         int dh, gw_resize_t mode)
{
    uint8_t *mid = malloc((size_t)sw * dh * 3); /* after the vertical pass */
    for (int y = 0; y < dh; y++) {
        taps_t t = naive_taps(sh, dh, y, mode);
        for (int x = 0; x < sw * 3; x++) {
            int64_t acc = 0;
            for (int k = 0; k < t.n; k++)
                acc += (int64_t)t.w[k] * src[(size_t)(t.first + k) * stride + (size_t)x];
            mid[(size_t)y * sw * 3 + (size_t)x] = round14(acc);
        }
    }
    for (int x = 0; x < dw; x++) {
        taps_t t = naive_taps(sw, dw, x, mode);
        for (int y = 0; y < dh; y++)
            for (int c = 0; c < 3; c++) {
                int64_t acc = 0;
                for (int k = 0; k < t.n; k++)
                    acc += (int64_t)t.w[k] * mid[((size_t)y * sw + (size_t)(t.first + k)) * 3 + c];
                dst[((size_t)y * dw + x) * 3 + c] = round14(acc);
            }
    }
    free(mid);
}

static uint8_t *noise(int w, int h, uint32_t seed)
{
    uint8_t *p = malloc((size_t)w * h * 3);
    for (size_t i = 0; i < (size_t)w * h * 3; i++) {
        seed = seed * 1103515245u + 12345u;
        p[i] = (uint8_t)(seed >> 23);
    }
    return p;
}

/* ---- exact values ---------------------------------------------------- */

Test(resize, matches_the_naive_reference_exactly)
{
    /* Enlarging, reducing, mixed, odd sizes, one-pixel sides, and rows long
     * enough for the SIMD kernels (16 bytes at a time vertically, pixel
     * pairs horizontally) with tails that take the scalar ones. */
    const int sizes[][4] = {{97, 61, 40, 33},     {13, 7, 50, 29},  {640, 480, 224, 224},
                            {320, 240, 224, 224}, {5, 300, 17, 16}, {1, 1, 9, 4},
                            {300, 1, 7, 3},       {33, 17, 33, 5},  {17, 33, 5, 33},
                            {224, 224, 224, 224}};
    gw_prep_ctx_t *ctx = gw_prep_ctx_new(NULL);
    for (int mode = 0; mode < 2; mode++) {
        for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
            int sw = sizes[s][0], sh = sizes[s][1], dw = sizes[s][2], dh = sizes[s][3];
            uint8_t *src = noise(sw, sh, (uint32_t)(7 + s));
            size_t n = (size_t)dw * dh * 3;
            uint8_t *got = malloc(n), *want = malloc(n);
            cr_assert_eq(
                gw_resize_rgb(ctx, src, sw, sh, (size_t)sw * 3, got, dw, dh, (gw_resize_t)mode), 0);
            naive_resize(src, sw, sh, (size_t)sw * 3, want, dw, dh, (gw_resize_t)mode);
            size_t bad = 0;
            while (bad < n && got[bad] == want[bad])
                bad++;
            cr_assert_eq(bad, n, "%s %dx%d -> %dx%d: byte %zu is %d, the reference %d",
                         gw_resize_name((gw_resize_t)mode), sw, sh, dw, dh, bad,
                         bad < n ? got[bad] : 0, bad < n ? want[bad] : 0);
            free(src);
            free(got);
            free(want);
        }
    }
    gw_prep_ctx_free(ctx);
}

Test(resize, worked_examples)
{
    /* One row, so the vertical pass is the identity. 2 -> 4: centers at
     * 0.25, 0.75, 1.25, 1.75: 0, 3/4 * 0 + 1/4 * 100 = 25, 75, 100. */
    gw_prep_ctx_t *ctx = gw_prep_ctx_new(NULL);
    uint8_t two[2 * 3] = {0, 0, 0, 100, 100, 100}, four[4 * 3];
    cr_assert_eq(gw_resize_rgb(ctx, two, 2, 1, 6, four, 4, 1, GW_RESIZE_BILINEAR), 0);
    const int up[4] = {0, 25, 75, 100};
    for (int x = 0; x < 4; x++)
        cr_assert_eq(four[3 * x], up[x], "x=%d: %d", x, four[3 * x]);
    /* 4 -> 2 of 0, 40, 80, 120: the triangle stretched to 2 pixels gives
     * weights 3/7, 3/7, 1/7 -> 7021, 7022, 2341 in 14 bits (the residue of
     * the rounding, -1, on the first largest), so (40 * 7022 + 80 * 2341 +
     * 8192) >> 14 = 29; and 2341, 7021, 7022 on 40, 80, 120 -> 91 (the
     * exact averages are 28.57 and 91.43). */
    uint8_t src[4 * 3], two_out[2 * 3];
    for (int x = 0; x < 4; x++)
        memset(src + 3 * x, 40 * x, 3);
    cr_assert_eq(gw_resize_rgb(ctx, src, 4, 1, 12, two_out, 2, 1, GW_RESIZE_BILINEAR), 0);
    cr_assert_eq(two_out[0], 29);
    cr_assert_eq(two_out[3], 91);
    /* The same along the other axis: a column of 4 rows. */
    cr_assert_eq(gw_resize_rgb(ctx, src, 1, 4, 3, two_out, 1, 2, GW_RESIZE_BILINEAR), 0);
    cr_assert_eq(two_out[0], 29);
    cr_assert_eq(two_out[3], 91);
    gw_prep_ctx_free(ctx);
}

Test(resize, a_source_stride_is_honoured)
{
    /* Rows padded with 255s past their pixels: the padding never reaches
     * the output, which equals the packed source's. */
    const int sw = 37, sh = 23, pad = 13;
    uint8_t *packed = noise(sw, sh, 99);
    size_t stride = (size_t)sw * 3 + pad;
    uint8_t *padded = malloc(stride * sh);
    memset(padded, 255, stride * sh);
    for (int y = 0; y < sh; y++)
        memcpy(padded + (size_t)y * stride, packed + (size_t)y * sw * 3, (size_t)sw * 3);
    gw_prep_ctx_t *ctx = gw_prep_ctx_new(NULL);
    uint8_t a[20 * 31 * 3], b[20 * 31 * 3];
    for (int mode = 0; mode < 2; mode++) {
        cr_assert_eq(gw_resize_rgb(ctx, packed, sw, sh, (size_t)sw * 3, a, 20, 31, mode), 0);
        cr_assert_eq(gw_resize_rgb(ctx, padded, sw, sh, stride, b, 20, 31, mode), 0);
        cr_assert_eq(memcmp(a, b, sizeof(a)), 0, "mode %d", mode);
    }
    free(packed);
    free(padded);
    gw_prep_ctx_free(ctx);
}

/* ---- the axis weights ----------------------------------------------- */

Test(resize, axis_weights_sum_to_one_and_stay_in_the_source)
{
    scratch_t s = {NULL, 0};
    const int pairs[][2] = {{1, 1},     {2, 4},  {4, 2},  {7, 3},   {3, 7},   {640, 224},
                            {224, 640}, {1, 50}, {50, 1}, {999, 7}, {7, 999}, {4000, 3}};
    for (int mode = 0; mode < 2; mode++) {
        for (size_t p = 0; p < sizeof(pairs) / sizeof(pairs[0]); p++) {
            int in = pairs[p][0], out = pairs[p][1];
            axis_t a;
            cr_assert_eq(gw__prep_axis_prepare(&s, in, out, (gw_resize_t)mode, &a), 0);
            cr_assert_eq(a.max_taps % 2, 0, "max_taps %d is odd", a.max_taps);
            for (int i = 0; i < out; i++) {
                const int16_t *w = a.w + (size_t)i * a.max_taps;
                cr_assert(a.count[i] >= 1 && a.count[i] <= a.max_taps);
                cr_assert(a.start[i] >= 0 && a.start[i] + a.count[i] <= in,
                          "%d -> %d, output %d: taps %d..%d", in, out, i, a.start[i],
                          a.start[i] + a.count[i]);
                int32_t sum = 0;
                for (int k = 0; k < a.count[i]; k++) {
                    cr_assert_geq(w[k], 0);
                    sum += w[k];
                }
                cr_assert_eq(sum, WEIGHT_ONE, "%d -> %d, output %d: sum %d", in, out, i, sum);
                if (a.count[i] % 2 == 1)
                    cr_assert_eq(w[a.count[i]], 0, "the pad of an odd count is not zero");
                taps_t t = naive_taps(in, out, i, (gw_resize_t)mode);
                cr_assert_eq(a.start[i], t.first);
                cr_assert_eq(a.count[i], t.n);
                for (int k = 0; k < t.n; k++)
                    cr_assert_eq(w[k], t.w[k], "%d -> %d, output %d, tap %d", in, out, i, k);
            }
        }
    }
    free(s.p);
}

/* ---- arguments -------------------------------------------------------- */

Test(resize, bad_arguments_are_inval)
{
    gw_prep_ctx_t *ctx = gw_prep_ctx_new(NULL);
    uint8_t src[4 * 4 * 3] = {0}, dst[4 * 4 * 3];
    gw_resize_t bi = GW_RESIZE_BILINEAR;
    cr_assert_eq(gw_resize_rgb(NULL, src, 4, 4, 12, dst, 4, 4, bi), SQ_INVAL);
    cr_assert_eq(gw_resize_rgb(ctx, NULL, 4, 4, 12, dst, 4, 4, bi), SQ_INVAL);
    cr_assert_eq(gw_resize_rgb(ctx, src, 4, 4, 12, NULL, 4, 4, bi), SQ_INVAL);
    cr_assert_eq(gw_resize_rgb(ctx, src, 0, 4, 12, dst, 4, 4, bi), SQ_INVAL);
    cr_assert_eq(gw_resize_rgb(ctx, src, 4, 0, 12, dst, 4, 4, bi), SQ_INVAL);
    cr_assert_eq(gw_resize_rgb(ctx, src, 4, 4, 12, dst, 0, 4, bi), SQ_INVAL);
    cr_assert_eq(gw_resize_rgb(ctx, src, 4, 4, 12, dst, 4, -1, bi), SQ_INVAL);
    cr_assert_eq(gw_resize_rgb(ctx, src, 4, 4, 11, dst, 4, 4, bi), SQ_INVAL); /* stride < 4 * 3 */
    cr_assert_eq(gw_resize_rgb(ctx, src, 4, 4, 12, dst, MAX_TARGET_SIDE + 1, 1, bi), SQ_INVAL);
    cr_assert_eq(gw_resize_rgb(ctx, src, 4, 4, 12, dst, 4, 4, (gw_resize_t)2), SQ_INVAL);
    cr_assert_eq(gw_resize_rgb(ctx, src, 4, 4, 12, dst, 4, 4, bi), 0);
    gw_prep_ctx_free(ctx);
}

Test(resize, mode_names_round_trip)
{
    gw_resize_t m;
    cr_assert_eq(gw_resize_parse("bilinear", &m), 0);
    cr_assert_eq(m, GW_RESIZE_BILINEAR);
    cr_assert_eq(gw_resize_parse("nearest", &m), 0);
    cr_assert_eq(m, GW_RESIZE_NEAREST);
    cr_assert_eq(gw_resize_parse(gw_resize_name(GW_RESIZE_NEAREST), &m), 0);
    cr_assert_eq(m, GW_RESIZE_NEAREST);
    cr_assert_eq(gw_resize_parse("Bilinear", &m), SQ_INVAL);
    cr_assert_eq(gw_resize_parse("", &m), SQ_INVAL);
    cr_assert_eq(gw_resize_parse(NULL, &m), SQ_INVAL);
}
