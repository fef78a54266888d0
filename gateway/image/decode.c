/* JPEG decoding (see gw_image.h): format sniffing, bomb limits,
 * libjpeg-turbo decoding with DCT scaling, then the resize (resize.c) or
 * the YUV planes path (planes.c). */
#include "image_int.h"

#include <sq.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <turbojpeg.h>

/* ---- format sniffing ------------------------------------------------ */

static int has_prefix(const uint8_t *d, size_t len, size_t at, const char *magic, size_t n)
{
    return len >= at + n && memcmp(d + at, magic, n) == 0;
}

/* The name of a non-JPEG format, for the 415 message. */
static const char *sniff_other(const uint8_t *d, size_t len)
{
    if (has_prefix(d, len, 0, "\x89PNG", 4))
        return "png";
    if (has_prefix(d, len, 0, "GIF8", 4))
        return "gif";
    if (has_prefix(d, len, 0, "RIFF", 4) && has_prefix(d, len, 8, "WEBP", 4))
        return "webp";
    if (has_prefix(d, len, 0, "BM", 2))
        return "bmp";
    if (has_prefix(d, len, 0, "II*\0", 4) || has_prefix(d, len, 0, "MM\0*", 4))
        return "tiff";
    if (has_prefix(d, len, 4, "ftypavif", 8))
        return "avif";
    if (has_prefix(d, len, 4, "ftyphei", 7) || has_prefix(d, len, 4, "ftypmif1", 8))
        return "heif";
    if (has_prefix(d, len, 0, "\0\0\0\x0cjP  ", 8))
        return "jpeg2000";
    if (has_prefix(d, len, 0, "\xff\x0a", 2) || has_prefix(d, len, 0, "\0\0\0\x0cJXL ", 8))
        return "jpegxl";
    return "unknown";
}

/* The DCT scaling factor for decoding w x h to feed a tw x th target: 1/1
 * unless the image is at least twice the target in both dimensions, then
 * the smallest factor whose output still covers the target (so the resize
 * only ever reduces by less than 2x after it). */
static tjscalingfactor pick_scale(int w, int h, int tw, int th, int enabled)
{
    tjscalingfactor best = {1, 1};
    if (!enabled || (int64_t)w < (int64_t)2 * tw || (int64_t)h < (int64_t)2 * th)
        return best;
    int n = 0;
    const tjscalingfactor *sf = tjGetScalingFactors(&n);
    for (int i = 0; sf != NULL && i < n; i++) {
        if (sf[i].num >= sf[i].denom)
            continue; /* no enlarging in the decoder */
        if (TJSCALED(w, sf[i]) < tw || TJSCALED(h, sf[i]) < th)
            continue;
        if ((int64_t)sf[i].num * best.denom < (int64_t)best.num * sf[i].denom)
            best = sf[i];
    }
    return best;
}

/* Adobe CMYK (stored inverted: 255 = no ink) to RGB, in place: pixel i
 * moves from 4i to 3i, which never overtakes the reads. */
static void cmyk_to_rgb(uint8_t *p, size_t pixels)
{
    for (size_t i = 0; i < pixels; i++) {
        uint32_t c = p[4 * i], m = p[4 * i + 1], y = p[4 * i + 2], k = p[4 * i + 3];
        uint32_t r = c * k + 128, g = m * k + 128, b = y * k + 128;
        p[3 * i] = (uint8_t)((r + (r >> 8)) >> 8); /* exact round(v / 255) */
        p[3 * i + 1] = (uint8_t)((g + (g >> 8)) >> 8);
        p[3 * i + 2] = (uint8_t)((b + (b >> 8)) >> 8);
    }
}

int gw_image_type_check(const uint8_t *data, size_t len, char *err, size_t errlen)
{
    if (len == 0)
        return gw__prep_fail(err, errlen, SQ_BAD_IMAGE, "empty image");
    if (len < 2 || data[0] != 0xFF || data[1] != 0xD8)
        return gw__prep_fail(err, errlen, SQ_MEDIA_TYPE,
                             "unsupported image type: %s (expected jpeg)", sniff_other(data, len));
    return 0;
}

static int decode_resize(gw_prep_ctx_t *ctx, const uint8_t *data, size_t len, uint8_t *pix, int sw,
                         int sh, size_t pitch, int pf, int cmyk, uint8_t *dst, int out_w, int out_h,
                         gw_resize_t mode, char *err, size_t errlen);
/* keep non-NULL: decode into a buffer of its own, handed to the caller in
 * *keep (packed RGB, info->decoded_width x decoded_height) on success: at
 * full size, or with keep_cover > 0 at the smallest DCT scale whose output
 * still covers keep_cover pixels (and the target) on both sides. */
static int image_to_rgb(gw_prep_ctx_t *ctx, const uint8_t *data, size_t len, int out_w, int out_h,
                        gw_resize_t mode, uint8_t *dst, gw_image_info_t *info, char *err,
                        size_t errlen, uint8_t **keep, int keep_cover)
{
    int type = gw_image_type_check(data, len, err, errlen);
    if (type != 0)
        return type;
    if (len > (size_t)0xFFFFFFFFu)
        return gw__prep_fail(err, errlen, SQ_TOO_LARGE, "jpeg of %zu bytes is too large", len);
    if (ctx->tj == NULL && (ctx->tj = tjInitDecompress()) == NULL)
        return gw__prep_fail(err, errlen, SQ_NOMEM, "no memory for a jpeg decoder");

    int w = 0, h = 0, subsamp = 0, cs = 0;
    if (tjDecompressHeader3(ctx->tj, data, (unsigned long)len, &w, &h, &subsamp, &cs) != 0)
        return gw__prep_decoder_failed(ctx, err, errlen);
    info->width = w;
    info->height = h;
    info->subsamp = subsamp;
    info->colorspace = cs;

    /* TurboJPEG 2.1 reports success, leaving the outputs alone, for a
     * stream that ends before its frame header (a tables-only JPEG). */
    if (w < 1 || h < 1)
        return gw__prep_fail(err, errlen, SQ_BAD_IMAGE, "bad jpeg: no frame header (truncated?)");
    /* Bomb check: the header is all that has been read so far. */
    const gw_prep_limits_t *lim = &ctx->limits;
    if ((uint64_t)w > lim->max_width || (uint64_t)h > lim->max_height ||
        (uint64_t)w * (uint64_t)h > lim->max_pixels)
        return gw__prep_fail(err, errlen, SQ_TOO_LARGE,
                             "image %dx%d exceeds the limits (%ux%u, %llu pixels)", w, h,
                             lim->max_width, lim->max_height, (unsigned long long)lim->max_pixels);

    int cover_w = keep != NULL && keep_cover > out_w ? keep_cover : out_w;
    int cover_h = keep != NULL && keep_cover > out_h ? keep_cover : out_h;
    tjscalingfactor sf =
        pick_scale(w, h, cover_w, cover_h, lim->dct_scaling && (keep == NULL || keep_cover > 0));
    int sw = TJSCALED(w, sf), sh = TJSCALED(h, sf);
    info->scale_num = sf.num;
    info->scale_denom = sf.denom;
    info->decoded_width = sw;
    info->decoded_height = sh;

    if (keep == NULL && lim->yuv_planes && gw__prep_planes_cover(cs, subsamp))
        return gw__prep_planes_resize(ctx, data, len, sw, sh, subsamp,
                                      subsamp == TJSAMP_422 && sf.num * 8 == sf.denom, dst, out_w,
                                      out_h, mode, err, errlen);

    int cmyk = cs == TJCS_CMYK || cs == TJCS_YCCK;
    int pf = cmyk ? TJPF_CMYK : TJPF_RGB;
    size_t pitch = (size_t)sw * (size_t)tjPixelSize[pf];
    uint8_t *pix = keep != NULL ? malloc(pitch * (size_t)sh)
                                : gw__prep_scratch_get(&ctx->pixels, pitch * (size_t)sh);
    if (pix == NULL)
        return gw__prep_fail(err, errlen, SQ_NOMEM, "no memory to decode a %dx%d image", sw, sh);
    int rc = decode_resize(ctx, data, len, pix, sw, sh, pitch, pf, cmyk, dst, out_w, out_h, mode,
                           err, errlen);
    if (keep == NULL)
        return rc;
    if (rc != 0)
        free(pix);
    else
        *keep = pix;
    return rc;
}

static int decode_resize(gw_prep_ctx_t *ctx, const uint8_t *data, size_t len, uint8_t *pix, int sw,
                         int sh, size_t pitch, int pf, int cmyk, uint8_t *dst, int out_w, int out_h,
                         gw_resize_t mode, char *err, size_t errlen)
{
    /* Warnings are errors (a truncated file decodes to a gray bottom half
     * otherwise), and a progressive file gets at most 500 scans, the
     * guard against scan-count bombs. */
    int flags = TJFLAG_STOPONWARNING | TJFLAG_LIMITSCANS;
    if (tjDecompress2(ctx->tj, data, (unsigned long)len, pix, sw, (int)pitch, sh, pf, flags) != 0)
        return gw__prep_decoder_failed(ctx, err, errlen);
    if (cmyk)
        cmyk_to_rgb(pix, (size_t)sw * (size_t)sh);
    int rc = gw__prep_resize_rgb(ctx, pix, sw, sh, (size_t)sw * 3, dst, out_w, out_h, mode);
    if (rc != 0)
        return gw__prep_fail(err, errlen, rc, "no memory to resize a %dx%d image", sw, sh);
    return 0;
}

int gw__prep_to_rgb(gw_prep_ctx_t *ctx, const uint8_t *data, size_t len, int out_w, int out_h,
                    gw_resize_t mode, uint8_t *dst, gw_image_info_t *info, char *err, size_t errlen,
                    uint8_t **keep, int keep_cover)
{
    gw_image_info_t scratch_info;
    if (info == NULL)
        info = &scratch_info;
    memset(info, 0, sizeof(*info));
    if (err != NULL && errlen > 0)
        err[0] = '\0';
    if (ctx == NULL || (data == NULL && len > 0) || dst == NULL || out_w < 1 || out_h < 1 ||
        out_w > MAX_TARGET_SIDE || out_h > MAX_TARGET_SIDE ||
        (mode != GW_RESIZE_BILINEAR && mode != GW_RESIZE_NEAREST))
        return gw__prep_fail(err, errlen, SQ_INVAL, "invalid preprocessing arguments");
    int rc =
        image_to_rgb(ctx, data, len, out_w, out_h, mode, dst, info, err, errlen, keep, keep_cover);
    gw__prep_scratch_trim(&ctx->pixels);
    gw__prep_scratch_trim(&ctx->row);
    return rc;
}

int gw_image_to_rgb(gw_prep_ctx_t *ctx, const uint8_t *data, size_t len, int out_w, int out_h,
                    gw_resize_t mode, uint8_t *dst, gw_image_info_t *info, char *err, size_t errlen)
{
    return gw__prep_to_rgb(ctx, data, len, out_w, out_h, mode, dst, info, err, errlen, NULL, 0);
}

int gw_image_to_rgb_keep(gw_prep_ctx_t *ctx, const uint8_t *data, size_t len, int out_w, int out_h,
                         gw_resize_t mode, uint8_t *dst, gw_image_info_t *info, uint8_t **original,
                         char *err, size_t errlen)
{
    *original = NULL;
    return gw__prep_to_rgb(ctx, data, len, out_w, out_h, mode, dst, info, err, errlen, original, 0);
}
