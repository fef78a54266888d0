/* gateway/image/decode.c through gw_image.h: JPEG decode + resize end to
 * end, and its errors. Every JPEG is generated here with tjCompress2 (no
 * fixture files), plus Debian's grace_hopper.jpg from
 * python-matplotlib-data when present. */
#include "preprocess_test.h"

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
/* ---- errors --------------------------------------------------------- */

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
