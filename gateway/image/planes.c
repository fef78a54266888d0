/* The YUV planes path of JPEG preprocessing (gw_prep_limits_t.yuv_planes,
 * see gw_image.h): decode to Y, Cb, Cr planes, resize them with the chroma
 * upsampling folded in, and convert to RGB per output pixel. */
#include "image_int.h"

#include <sq.h>

#include <assert.h>
#include <string.h>
#include <turbojpeg.h>

/* JFIF YCbCr (full range) to RGB, in place on a packed row, with
 * libjpeg's integer arithmetic (jdcolor.c: 16-bit coefficients 1.402,
 * 0.34414, 0.71414, 1.772, each term rounded, then clamped). */
static void ycc_to_rgb_row(uint8_t *restrict p, int n)
{
    for (int x = 0; x < n; x++, p += 3) {
        int32_t y = p[0], cb = p[1] - 128, cr = p[2] - 128;
        int32_t r = y + ((91881 * cr + 32768) >> 16);
        int32_t g = y + ((-22554 * cb - 46802 * cr + 32768) >> 16);
        int32_t b = y + ((116130 * cb + 32768) >> 16);
        p[0] = (uint8_t)(r < 0 ? 0 : r > 255 ? 255 : r);
        p[1] = (uint8_t)(g < 0 ? 0 : g > 255 ? 255 : g);
        p[2] = (uint8_t)(b < 0 ? 0 : b > 255 ? 255 : b);
    }
}

/* The vertical axis of a chroma plane of ch rows under 2:1 vertical
 * subsampling: the luma axis ya composed with libjpeg's fancy (triangle)
 * upsampling, luma row 2j = 3/4 C[j] + 1/4 C[j - 1] and 2j + 1 = 3/4 C[j]
 * + 1/4 C[j + 1] (edges replicated), so that the resize reads the chroma
 * plane as libjpeg's upsampled chroma would be read. */
static int chroma_axis_v2(scratch_t *s, const axis_t *ya, int out, int ch, axis_t *a)
{
    a->max_taps = ((ya->max_taps / 2 + 3) + 1) & ~1;
    size_t ints = (size_t)out * 2;
    size_t weights = (size_t)out * (size_t)a->max_taps;
    size_t quarters = (size_t)a->max_taps;
    char *p = gw__prep_scratch_get(s, quarters * sizeof(int32_t) + ints * sizeof(int) +
                                          weights * sizeof(int16_t));
    if (p == NULL)
        return SQ_NOMEM;
    int32_t *q = (int32_t *)(void *)p; /* quarter weights over chroma rows lo.. */
    a->start = (int *)(void *)(p + quarters * sizeof(int32_t));
    a->count = a->start + out;
    a->w = (int16_t *)(void *)(p + quarters * sizeof(int32_t) + ints * sizeof(int));
    for (int i = 0; i < out; i++) {
        int lo = ya->start[i] / 2 - 1, hi = (ya->start[i] + ya->count[i] - 1) / 2 + 1;
        if (lo < 0)
            lo = 0;
        if (hi > ch - 1)
            hi = ch - 1;
        int n = hi - lo + 1;
        assert(n >= 1 && n <= a->max_taps);
        memset(q, 0, sizeof(int32_t) * (size_t)n);
        const int16_t *w = ya->w + (size_t)i * ya->max_taps;
        for (int k = 0; k < ya->count[i]; k++) {
            int r = ya->start[i] + k, j = r / 2;
            int other = r % 2 == 0 ? j - 1 : j + 1;
            if (other < 0)
                other = 0;
            if (other > ch - 1)
                other = ch - 1;
            if (j > ch - 1)
                j = ch - 1;
            q[j - lo] += 3 * w[k];
            q[other - lo] += w[k];
        }
        int first = 0, last = n - 1;
        while (first < last && q[first] == 0)
            first++;
        while (last > first && q[last] == 0)
            last--;
        int16_t *out_w = a->w + (size_t)i * a->max_taps;
        int32_t total = 0;
        int big = 0;
        for (int k = first; k <= last; k++) {
            int32_t v = (q[k] + 2) >> 2;
            out_w[k - first] = (int16_t)v;
            total += v;
            if (v > out_w[big])
                big = k - first;
        }
        out_w[big] = (int16_t)(out_w[big] + WEIGHT_ONE - total);
        out_w[last - first + 1] = 0;
        a->start[i] = lo + first;
        a->count[i] = last - first + 1;
    }
    return 0;
}

/* Whether the planes path takes an image of this colour space and
 * sampling. */
int gw__prep_planes_cover(int cs, int subsamp)
{
    if (cs == TJCS_GRAY)
        return subsamp == TJSAMP_GRAY;
    return cs == TJCS_YCbCr &&
           (subsamp == TJSAMP_444 || subsamp == TJSAMP_422 || subsamp == TJSAMP_420);
}

/* Decodes to Y, Cb, Cr planes at sw x sh (the DCT scale picked), resizes
 * them to out_w x out_h and converts to RGB per output pixel. box: libjpeg
 * upsamples this image's chroma by replication, not with the triangle
 * (4:2:2 at 1/8, where the chroma's DCT scaled size is 1). */
int gw__prep_planes_resize(gw_prep_ctx_t *ctx, const uint8_t *data, size_t len, int sw, int sh,
                           int subsamp, int box, uint8_t *dst, int out_w, int out_h,
                           gw_resize_t mode, char *err, size_t errlen)
{
    int nplanes = subsamp == TJSAMP_GRAY ? 1 : 3;
    int pw[3] = {0}, ph[3] = {0};
    size_t off[3] = {0}, total = 0;
    for (int c = 0; c < nplanes; c++) {
        pw[c] = tjPlaneWidth(c, sw, subsamp);
        ph[c] = tjPlaneHeight(c, sh, subsamp);
        if (pw[c] < 1 || ph[c] < 1)
            return gw__prep_fail(err, errlen, SQ_BAD_IMAGE, "bad jpeg: no plane size for %dx%d", sw,
                                 sh);
        off[c] = total;
        total += (size_t)pw[c] * (size_t)ph[c];
    }
    uint8_t *buf = gw__prep_scratch_get(&ctx->pixels, total);
    if (buf == NULL)
        return gw__prep_fail(err, errlen, SQ_NOMEM, "no memory to decode a %dx%d image", sw, sh);
    unsigned char *planes[3] = {NULL, NULL, NULL};
    int strides[3] = {0, 0, 0};
    for (int c = 0; c < nplanes; c++) {
        planes[c] = buf + off[c];
        strides[c] = pw[c];
    }
    int flags = TJFLAG_STOPONWARNING | TJFLAG_LIMITSCANS;
    if (tjDecompressToYUVPlanes(ctx->tj, data, (unsigned long)len, planes, sw, strides, sh,
                                flags) != 0)
        return gw__prep_decoder_failed(ctx, err, errlen);

    /* Horizontal: each output row's Y, Cb, Cr lines are packed into one
     * YCbCr row at luma width (chroma upsampled as libjpeg's fancy
     * upsampling does: 3/4 of the nearest sample, 1/4 of the next, rounded
     * alternately down and up), then resized by the RGB path's kernel and
     * converted. Vertical: the luma axis, and for 4:2:0 chroma the same
     * composed with the vertical fancy upsampling. */
    int hsub = nplanes == 3 && subsamp != TJSAMP_444;
    int vsub = nplanes == 3 && subsamp == TJSAMP_420;
    axis_t xa = {0}, ya = {0}, cya = {0};
    int rc = gw__prep_axis_prepare(&ctx->xcoef, sw, out_w, mode, &xa);
    if (rc == 0)
        rc = gw__prep_axis_prepare(&ctx->ycoef, sh, out_h, mode, &ya);
    cya = ya;
    if (rc == 0 && vsub)
        rc = chroma_axis_v2(&ctx->cycoef, &ya, out_h, ph[1], &cya);
    size_t packed_len = (size_t)sw * 3 + (size_t)pw[1] + (size_t)pw[2] + (size_t)pw[0];
    uint8_t *packed = rc == 0 ? gw__prep_scratch_get(&ctx->row, packed_len) : NULL;
    if (packed == NULL)
        return gw__prep_fail(err, errlen, SQ_NOMEM, "no memory to resize a %dx%d image", sw, sh);
    uint8_t *yrow = packed + (size_t)sw * 3, *cbrow = yrow + pw[0], *crrow = cbrow + pw[1];
    for (int y = 0; y < out_h; y++) {
        const uint8_t *line[3] = {NULL, NULL, NULL};
        uint8_t *tmp[3] = {yrow, cbrow, crrow};
        for (int c = 0; c < nplanes; c++) {
            const axis_t *a = c == 0 ? &ya : &cya;
            if (a->count[y] == 1) {
                line[c] = planes[c] + (size_t)a->start[y] * (size_t)pw[c];
            } else {
                gw__prep_resize_rows(planes[c], (size_t)pw[c], (size_t)pw[c],
                                     a->w + (size_t)y * a->max_taps, a->start[y], a->count[y],
                                     tmp[c]);
                line[c] = tmp[c];
            }
        }
        uint8_t *out = dst + (size_t)y * (size_t)out_w * 3;
        if (nplanes == 1) {
            for (int x = 0; x < sw; x++)
                packed[3 * x] = packed[3 * x + 1] = packed[3 * x + 2] = line[0][x];
            gw__prep_resize_cols(packed, sw, &xa, out_w, out);
            continue;
        }
        const uint8_t *yl = line[0], *cb = line[1], *cr = line[2];
        if (hsub && box) {
            for (int x = 0; x < sw; x++) {
                packed[3 * x] = yl[x];
                packed[3 * x + 1] = cb[x >> 1];
                packed[3 * x + 2] = cr[x >> 1];
            }
        } else if (hsub) {
            /* x = 2j reads C[j - 1], x = 2j + 1 reads C[j + 1]; the edges
             * replicate */
            int cw = pw[1];
            for (int x = 0; x < sw; x++)
                packed[3 * x] = yl[x];
            for (int j = 0; j < cw; j++) {
                int lo = j > 0 ? j - 1 : 0, hi = j + 1 < cw ? j + 1 : j;
                int b3 = 3 * cb[j], r3 = 3 * cr[j];
                uint8_t *q = packed + 6 * (size_t)j;
                q[1] = (uint8_t)((b3 + cb[lo] + 1) >> 2);
                q[2] = (uint8_t)((r3 + cr[lo] + 1) >> 2);
                if (2 * j + 1 < sw) {
                    q[4] = (uint8_t)((b3 + cb[hi] + 2) >> 2);
                    q[5] = (uint8_t)((r3 + cr[hi] + 2) >> 2);
                }
            }
        } else {
            for (int x = 0; x < sw; x++) {
                packed[3 * x] = yl[x];
                packed[3 * x + 1] = cb[x];
                packed[3 * x + 2] = cr[x];
            }
        }
        gw__prep_resize_cols(packed, sw, &xa, out_w, out);
        ycc_to_rgb_row(out, out_w);
    }
    return 0;
}
