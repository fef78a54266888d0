/* Crops of a pipeline's detections (see gw_image.h): the rectangle a
 * detection becomes, and its resize into the next stage's input. */
#include "gw_image.h"

#include <sq.h>

#include <math.h>
#include <stddef.h>
#include <stdint.h>

gw_rect_t gw_crop_rect(const gw_crops_spec_t *s, const gw_detection_t *d, int img_w, int img_h)
{
    double x0 = d->x0, y0 = d->y0, x1 = d->x1, y1 = d->y1;
    double w = x1 - x0, h = y1 - y0;
    if (!(w >= 0))
        w = 0;
    if (!(h >= 0))
        h = 0;
    x0 -= s->padding * w, x1 += s->padding * w;
    y0 -= s->padding * h, y1 += s->padding * h;
    if (s->square) {
        double side = fmax(x1 - x0, y1 - y0), cx = (x0 + x1) / 2, cy = (y0 + y1) / 2;
        x0 = cx - side / 2, x1 = cx + side / 2;
        y0 = cy - side / 2, y1 = cy + side / 2;
    }
    /* Outwards to whole pixels, then into the image (NaN goes to 0). */
    double fx0 = floor(x0), fy0 = floor(y0), fx1 = ceil(x1), fy1 = ceil(y1);
    int ix0 = fx0 > 0 ? (fx0 < img_w - 1 ? (int)fx0 : img_w - 1) : 0;
    int iy0 = fy0 > 0 ? (fy0 < img_h - 1 ? (int)fy0 : img_h - 1) : 0;
    int ix1 = fx1 < img_w ? (fx1 > ix0 + 1 ? (int)fx1 : ix0 + 1) : img_w;
    int iy1 = fy1 < img_h ? (fy1 > iy0 + 1 ? (int)fy1 : iy0 + 1) : img_h;
    gw_rect_t r = {ix0, iy0, ix1 - ix0, iy1 - iy0};
    return r;
}

int gw_crop_resize(gw_prep_ctx_t *ctx, const uint8_t *rgb, int img_w, int img_h, gw_rect_t r,
                   uint8_t *dst, int dst_w, int dst_h, gw_resize_t mode)
{
    if (rgb == NULL || img_w < 1 || img_h < 1 || r.x < 0 || r.y < 0 || r.w < 1 || r.h < 1 ||
        r.x > img_w - r.w || r.y > img_h - r.h)
        return SQ_INVAL;
    const uint8_t *src = rgb + ((size_t)r.y * (size_t)img_w + (size_t)r.x) * 3;
    return gw_resize_rgb(ctx, src, r.w, r.h, (size_t)img_w * 3, dst, dst_w, dst_h, mode);
}
