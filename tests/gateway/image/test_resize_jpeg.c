/* gateway/image/resize.c end to end: decoded JPEGs resized by the
 * fixed-point filter, against a double-precision reference. */
#include "preprocess_test.h"

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
