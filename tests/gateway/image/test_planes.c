/* gateway/image/planes.c: the YUV planes path against the RGB path. */
#include "preprocess_test.h"

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
