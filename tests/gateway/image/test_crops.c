/* gateway/image/crops.c: the rectangle a detection becomes (padding,
 * square, rounding outwards, clipping) and its resize into the next
 * stage's input. */
#include <criterion/criterion.h>
#include <gw_image.h>
#include <sq.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static gw_crops_spec_t spec(double padding, int square)
{
    gw_crops_spec_t s;
    memset(&s, 0, sizeof(s));
    s.padding = padding;
    s.square = square;
    return s;
}

static void assert_rect(gw_rect_t r, int x, int y, int w, int h)
{
    cr_assert(r.x == x && r.y == y && r.w == w && r.h == h,
              "got (%d, %d, %d, %d), expected (%d, %d, %d, %d)", r.x, r.y, r.w, r.h, x, y, w, h);
}

static void assert_inside(gw_rect_t r, int img_w, int img_h, const char *what)
{
    cr_assert(r.x >= 0 && r.y >= 0 && r.w >= 1 && r.h >= 1 && r.x + r.w <= img_w &&
                  r.y + r.h <= img_h,
              "%s: (%d, %d, %d, %d) not inside %dx%d", what, r.x, r.y, r.w, r.h, img_w, img_h);
}

Test(crops, rect_padding_square_and_borders)
{
    gw_crops_spec_t s = spec(0, 0);
    gw_detection_t d = {10, 20, 30, 60, 1, 0, 0};
    assert_rect(gw_crop_rect(&s, &d, 100, 100), 10, 20, 20, 40);
    /* Fractional edges round outwards. */
    gw_detection_t f = {10.2f, 20.7f, 30.1f, 40.0f, 1, 0, 0};
    assert_rect(gw_crop_rect(&s, &f, 100, 100), 10, 20, 21, 20);
    /* Padding: a quarter of the width (20) and height (40) on each side. */
    s.padding = 0.25;
    assert_rect(gw_crop_rect(&s, &d, 100, 100), 5, 10, 30, 60);
    /* Square: the larger side (60) around the center (20, 40), cut at the
     * left border. */
    s.square = 1;
    assert_rect(gw_crop_rect(&s, &d, 100, 100), 0, 10, 50, 60);
    /* Clamped at the bottom right. */
    s.padding = 0, s.square = 0;
    gw_detection_t br = {80, 90, 130, 140, 1, 0, 0};
    assert_rect(gw_crop_rect(&s, &br, 100, 100), 80, 90, 20, 10);
    /* At least 1x1: an empty box, one outside the image on either side. */
    gw_detection_t e = {99.5f, 99.5f, 99.5f, 99.5f, 1, 0, 0};
    assert_rect(gw_crop_rect(&s, &e, 100, 100), 99, 99, 1, 1);
    gw_detection_t out1 = {200, 200, 300, 300, 1, 0, 0};
    assert_rect(gw_crop_rect(&s, &out1, 100, 100), 99, 99, 1, 1);
    gw_detection_t out2 = {-50, -50, -10, -10, 1, 0, 0};
    assert_rect(gw_crop_rect(&s, &out2, 100, 100), 0, 0, 1, 1);
    gw_detection_t nan = {NAN, NAN, NAN, NAN, 1, 0, 0};
    assert_inside(gw_crop_rect(&s, &nan, 100, 100), 100, 100, "NaN box");
}

Test(crops, an_inverted_box_is_a_one_pixel_crop_at_its_first_corner)
{
    /* x1 < x0: the width counts as 0 (no negative padding), and the crop
     * is the pixel under (x0, y0) grown to 1x1. */
    gw_crops_spec_t s = spec(0.5, 0);
    gw_detection_t d = {40, 30, 20, 10, 1, 0, 0};
    gw_rect_t r = gw_crop_rect(&s, &d, 100, 100);
    assert_inside(r, 100, 100, "inverted");
    assert_rect(r, 40, 30, 1, 1);
}

Test(crops, whole_image_and_beyond_is_the_whole_image)
{
    gw_crops_spec_t s = spec(0, 0);
    gw_detection_t all = {0, 0, 64, 48, 1, 0, 0};
    assert_rect(gw_crop_rect(&s, &all, 64, 48), 0, 0, 64, 48);
    s.padding = 4; /* the most a spec allows */
    s.square = 1;
    assert_rect(gw_crop_rect(&s, &all, 64, 48), 0, 0, 64, 48);
    gw_detection_t huge = {-1e30f, -1e30f, 1e30f, 1e30f, 1, 0, 0};
    assert_rect(gw_crop_rect(&s, &huge, 64, 48), 0, 0, 64, 48);
    gw_detection_t inf = {-INFINITY, -INFINITY, INFINITY, INFINITY, 1, 0, 0};
    assert_inside(gw_crop_rect(&s, &inf, 64, 48), 64, 48, "infinite box");
}

Test(crops, every_rect_lies_inside_the_image)
{
    /* Random boxes, many outside, tiny images included: a crop is always
     * at least 1x1 and inside, whatever the box, padding and square. */
    uint32_t seed = 12345;
    for (int i = 0; i < 20000; i++) {
        double v[7];
        for (int k = 0; k < 7; k++) {
            seed = seed * 1664525u + 1013904223u;
            v[k] = (double)(seed >> 8) / (double)(1u << 24);
        }
        int img_w = 1 + (int)(v[0] * 200), img_h = 1 + (int)(v[1] * 200);
        gw_detection_t d = {(float)(v[2] * 400 - 100),
                            (float)(v[3] * 400 - 100),
                            (float)(v[4] * 400 - 100),
                            (float)(v[5] * 400 - 100),
                            1,
                            i,
                            0};
        gw_crops_spec_t s = spec(v[6] * 4, i % 2);
        gw_rect_t r = gw_crop_rect(&s, &d, img_w, img_h);
        assert_inside(r, img_w, img_h, "random box");
        /* Inside the image, the crop covers the (unpadded) box. */
        if (d.x0 >= 0 && d.y0 >= 0 && d.x1 <= img_w && d.y1 <= img_h && d.x1 > d.x0 && d.y1 > d.y0)
            cr_assert(r.x <= d.x0 && r.y <= d.y0 && r.x + r.w >= d.x1 && r.y + r.h >= d.y1,
                      "box %d not covered", i);
    }
}

Test(crops, resize_equals_resize_of_the_region)
{
    enum { W = 64, H = 48 };
    uint8_t *img = malloc(W * H * 3);
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++)
            for (int c = 0; c < 3; c++)
                img[(y * W + x) * 3 + c] = (uint8_t)((x * 7 + y * 13 + c * 50 + x * y) & 255);
    gw_rect_t r = {7, 5, 30, 20};
    uint8_t region[30 * 20 * 3];
    for (int y = 0; y < r.h; y++)
        memcpy(region + y * r.w * 3, img + ((r.y + y) * W + r.x) * 3, (size_t)r.w * 3);
    gw_prep_ctx_t *ctx = gw_prep_ctx_new(NULL);
    cr_assert_not_null(ctx);
    gw_resize_t modes[2] = {GW_RESIZE_BILINEAR, GW_RESIZE_NEAREST};
    int sizes[3][2] = {{16, 16}, {45, 31}, {30, 20}};
    for (int mi = 0; mi < 2; mi++) {
        for (int si = 0; si < 3; si++) {
            int dw = sizes[si][0], dh = sizes[si][1];
            uint8_t got[45 * 31 * 3], want[45 * 31 * 3];
            cr_assert_eq(gw_crop_resize(ctx, img, W, H, r, got, dw, dh, modes[mi]), 0);
            cr_assert_eq(
                gw_resize_rgb(ctx, region, r.w, r.h, (size_t)r.w * 3, want, dw, dh, modes[mi]), 0);
            cr_assert(memcmp(got, want, (size_t)dw * dh * 3) == 0, "mode %d size %dx%d", mi, dw,
                      dh);
        }
    }
    /* Same size: the region itself. */
    uint8_t same[30 * 20 * 3];
    cr_assert_eq(gw_crop_resize(ctx, img, W, H, r, same, 30, 20, GW_RESIZE_NEAREST), 0);
    cr_assert(memcmp(same, region, sizeof(same)) == 0);
    gw_prep_ctx_free(ctx);
    free(img);
}

Test(crops, resize_refuses_a_rect_not_inside_the_image)
{
    enum { W = 64, H = 48 };
    uint8_t *img = calloc(W * H, 3);
    gw_prep_ctx_t *ctx = gw_prep_ctx_new(NULL);
    uint8_t dst[3 * 16 * 16];
    gw_rect_t outside[] = {{-1, 0, 4, 4},  {0, -1, 4, 4}, {0, 0, 0, 4},  {0, 0, 4, 0},
                           {60, 0, 5, 4},  {0, 45, 4, 4}, {64, 0, 1, 1}, {0, 48, 1, 1},
                           {1, 0, 64, 48}, {0, 1, 64, 48}};
    for (size_t i = 0; i < sizeof(outside) / sizeof(outside[0]); i++)
        cr_assert_eq(gw_crop_resize(ctx, img, W, H, outside[i], dst, 16, 16, GW_RESIZE_BILINEAR),
                     SQ_INVAL, "rect %zu", i);
    /* The edges themselves are inside: the last pixel, the whole image. */
    gw_rect_t edges[] = {{63, 47, 1, 1}, {0, 0, 64, 48}, {60, 44, 4, 4}};
    for (size_t i = 0; i < sizeof(edges) / sizeof(edges[0]); i++)
        cr_assert_eq(gw_crop_resize(ctx, img, W, H, edges[i], dst, 16, 16, GW_RESIZE_BILINEAR), 0,
                     "edge rect %zu", i);
    /* No image, no size, no destination size. */
    gw_rect_t r = {0, 0, 4, 4};
    cr_assert_eq(gw_crop_resize(ctx, NULL, W, H, r, dst, 16, 16, GW_RESIZE_BILINEAR), SQ_INVAL);
    cr_assert_eq(gw_crop_resize(ctx, img, 0, H, r, dst, 16, 16, GW_RESIZE_BILINEAR), SQ_INVAL);
    cr_assert_eq(gw_crop_resize(ctx, img, W, H, r, dst, 0, 16, GW_RESIZE_BILINEAR), SQ_INVAL);
    gw_prep_ctx_free(ctx);
    free(img);
}
