/* The resize of JPEG preprocessing (see gw_image.h, image_int.h): a
 * fixed-point separable triangle filter (PIL's BILINEAR) or nearest, with
 * an SSE2 kernel and a portable scalar one that compute the same integers. */
#include "image_int.h"

#include <sq.h>

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

int gw_resize_parse(const char *name, gw_resize_t *out)
{
    if (name != NULL && strcmp(name, "bilinear") == 0) {
        *out = GW_RESIZE_BILINEAR;
        return 0;
    }
    if (name != NULL && strcmp(name, "nearest") == 0) {
        *out = GW_RESIZE_NEAREST;
        return 0;
    }
    return SQ_INVAL;
}

const char *gw_resize_name(gw_resize_t mode)
{
    return mode == GW_RESIZE_NEAREST ? "nearest" : "bilinear";
}

static int axis_taps(int in, int out, gw_resize_t mode)
{
    if (mode == GW_RESIZE_NEAREST)
        return 2; /* one tap and its zero pad */
    double support = in > out ? (double)in / out : 1.0;
    return ((int)ceil(2.0 * support) + 3) & ~1;
}

static double triangle(double t)
{
    t = fabs(t);
    return t < 1.0 ? 1.0 - t : 0.0;
}

/* Weights for one axis (PIL's precompute_coeffs with a triangle filter):
 * output pixel i covers source coordinates around center (i + 0.5) * in/out;
 * when reducing, the triangle is stretched by the reduction factor so that
 * every source pixel under the output pixel contributes. Taps are trimmed
 * of zero weights, quantized, and the rounding residue goes to the largest
 * tap so that the weights sum to exactly WEIGHT_ONE. */
static void axis_compute(int in, int out, gw_resize_t mode, axis_t *a)
{
    if (mode == GW_RESIZE_NEAREST) {
        for (int i = 0; i < out; i++) {
            int64_t s = ((int64_t)2 * i + 1) * in / ((int64_t)2 * out);
            a->start[i] = s < in ? (int)s : in - 1;
            a->count[i] = 1;
            a->w[(size_t)i * a->max_taps] = WEIGHT_ONE;
            a->w[(size_t)i * a->max_taps + 1] = 0;
        }
        return;
    }
    double scale = (double)in / out;
    double filterscale = scale > 1.0 ? scale : 1.0;
    double support = filterscale;
    double inv = 1.0 / filterscale;
    for (int i = 0; i < out; i++) {
        double center = (i + 0.5) * scale;
        int lo = (int)floor(center - support + 0.5);
        int hi = (int)floor(center + support + 0.5);
        if (lo < 0)
            lo = 0;
        if (hi > in)
            hi = in;
        assert(hi - lo >= 1 && hi - lo <= a->max_taps);
        double sum = 0.0;
        int first = -1, last = -1;
        for (int k = lo; k < hi; k++) {
            double wk = triangle((k + 0.5 - center) * inv);
            if (wk > 0.0) {
                if (first < 0)
                    first = k;
                last = k;
                sum += wk;
            }
        }
        assert(first >= 0 && sum > 0.0);
        int16_t *w = a->w + (size_t)i * a->max_taps;
        int32_t total = 0;
        int big = 0;
        for (int k = first; k <= last; k++) {
            int32_t q = (int32_t)lround(triangle((k + 0.5 - center) * inv) / sum * WEIGHT_ONE);
            w[k - first] = (int16_t)q;
            total += q;
            if (q > w[big])
                big = k - first;
        }
        w[big] = (int16_t)(w[big] + WEIGHT_ONE - total);
        w[last - first + 1] = 0; /* the pad of an odd count (max_taps is even) */
        a->start[i] = first;
        a->count[i] = last - first + 1;
    }
}

int gw__prep_axis_prepare(scratch_t *s, int in, int out, gw_resize_t mode, axis_t *a)
{
    a->max_taps = axis_taps(in, out, mode);
    size_t ints = (size_t)out * 2;
    size_t weights = (size_t)out * (size_t)a->max_taps;
    char *p = gw__prep_scratch_get(s, ints * sizeof(int) + weights * sizeof(int16_t));
    if (p == NULL)
        return SQ_NOMEM;
    a->start = (int *)(void *)p;
    a->count = a->start + out;
    a->w = (int16_t *)(void *)(p + ints * sizeof(int));
    axis_compute(in, out, mode, a);
    return 0;
}

static inline uint8_t unfix(int32_t v)
{
    /* Weights are non-negative and sum to one: the result is in 0..255. */
    return (uint8_t)((v + (WEIGHT_ONE >> 1)) >> WEIGHT_BITS);
}

/* The two passes have an SSE2 kernel (x86-64 always has SSE2) and a
 * portable scalar one; both compute exactly the same integers:
 * sum(w_k * p_k) + 1/2 in 14-bit fixed point, shifted down. The SSE2 ones
 * pair taps so that one pmaddwd does two multiply-adds per lane. */

/* Vertical pass, bytes [from, row_bytes) of one output row. */
static void rows_scalar(const uint8_t *src, size_t stride, size_t from, size_t row_bytes,
                        const int16_t *w, int start, int count, uint8_t *restrict out)
{
    const uint8_t *base = src + (size_t)start * stride;
    for (size_t i = from; i < row_bytes; i++) {
        int32_t sum = 0;
        for (int k = 0; k < count; k++)
            sum += w[k] * base[(size_t)k * stride + i];
        out[i] = unfix(sum);
    }
}

/* Horizontal pass of output pixel x (3 bytes at dst). */
static inline void col_scalar(const uint8_t *row, const axis_t *a, int x, uint8_t *dst)
{
    const uint8_t *p = row + (size_t)a->start[x] * 3;
    const int16_t *w = a->w + (size_t)x * a->max_taps;
    int32_t r = 0, g = 0, b = 0;
    for (int k = 0; k < a->count[x]; k++, p += 3) {
        r += w[k] * p[0];
        g += w[k] * p[1];
        b += w[k] * p[2];
    }
    dst[0] = unfix(r);
    dst[1] = unfix(g);
    dst[2] = unfix(b);
}

#if defined(__SSE2__)
#include <emmintrin.h>

/* Weights k and k + 1 as the int16 pair that pmaddwd multiplies by. */
static inline __m128i weight_pair(const int16_t *w)
{
    int32_t pair;
    memcpy(&pair, w, 4);
    return _mm_set1_epi32(pair);
}

void gw__prep_resize_rows(const uint8_t *src, size_t stride, size_t row_bytes, const int16_t *w,
                          int start, int count, uint8_t *restrict out)
{
    const __m128i zero = _mm_setzero_si128();
    const __m128i half = _mm_set1_epi32(WEIGHT_ONE >> 1);
    const uint8_t *base = src + (size_t)start * stride;
    size_t i = 0;
    for (; i + 16 <= row_bytes; i += 16) {
        __m128i s0 = half, s1 = half, s2 = half, s3 = half;
        for (int k = 0; k < count; k += 2) {
            const uint8_t *r0 = base + (size_t)k * stride + i;
            __m128i p0 = _mm_loadu_si128((const __m128i *)(const void *)r0);
            /* an odd last tap pairs with itself; its pad weight is zero */
            __m128i p1 =
                k + 1 < count ? _mm_loadu_si128((const __m128i *)(const void *)(r0 + stride)) : p0;
            __m128i wp = weight_pair(w + k);
            __m128i lo = _mm_unpacklo_epi8(p0, p1), hi = _mm_unpackhi_epi8(p0, p1);
            s0 = _mm_add_epi32(s0, _mm_madd_epi16(_mm_unpacklo_epi8(lo, zero), wp));
            s1 = _mm_add_epi32(s1, _mm_madd_epi16(_mm_unpackhi_epi8(lo, zero), wp));
            s2 = _mm_add_epi32(s2, _mm_madd_epi16(_mm_unpacklo_epi8(hi, zero), wp));
            s3 = _mm_add_epi32(s3, _mm_madd_epi16(_mm_unpackhi_epi8(hi, zero), wp));
        }
        s0 = _mm_srai_epi32(s0, WEIGHT_BITS);
        s1 = _mm_srai_epi32(s1, WEIGHT_BITS);
        s2 = _mm_srai_epi32(s2, WEIGHT_BITS);
        s3 = _mm_srai_epi32(s3, WEIGHT_BITS);
        __m128i v = _mm_packus_epi16(_mm_packs_epi32(s0, s1), _mm_packs_epi32(s2, s3));
        _mm_storeu_si128((__m128i *)(void *)(out + i), v);
    }
    rows_scalar(src, stride, i, row_bytes, w, start, count, out);
}

/* Two neighbouring pixels as r0 r1 g0 g1 b0 b1 s0 s1 (int16), s being
 * the spare fourth byte of each 4-byte load, which lands in a lane that
 * is dropped. */
static inline __m128i pixel_pair(const uint8_t *p)
{
    uint32_t a, b;
    memcpy(&a, p, 4);
    memcpy(&b, p + 3, 4);
    __m128i q = _mm_unpacklo_epi8(_mm_cvtsi32_si128((int)a), _mm_cvtsi32_si128((int)b));
    return _mm_unpacklo_epi8(q, _mm_setzero_si128());
}

/* Output pixels whose (even-padded) taps end at least one pixel before the
 * end of the row take the SIMD path, which reads 4 bytes per pixel; the
 * last few go through the scalar kernel so that nothing past the row is
 * read, and so does the last output pixel, whose 4-byte store would spill
 * out of dst. */
void gw__prep_resize_cols(const uint8_t *restrict row, int src_w, const axis_t *a, int out_w,
                          uint8_t *restrict dst)
{
    const __m128i half = _mm_set1_epi32(WEIGHT_ONE >> 1);
    for (int x = 0; x < out_w; x++, dst += 3) {
        int n = a->count[x];
        if (a->start[x] + ((n + 1) & ~1) >= src_w || x == out_w - 1) {
            col_scalar(row, a, x, dst);
            continue;
        }
        const uint8_t *p = row + (size_t)a->start[x] * 3;
        const int16_t *w = a->w + (size_t)x * a->max_taps;
        __m128i sum = half;
        for (int k = 0; k < n; k += 2)
            sum = _mm_add_epi32(sum, _mm_madd_epi16(pixel_pair(p + 3 * k), weight_pair(w + k)));
        sum = _mm_srai_epi32(sum, WEIGHT_BITS);
        __m128i v = _mm_packus_epi16(_mm_packs_epi32(sum, sum), sum);
        uint32_t rgbx = (uint32_t)_mm_cvtsi128_si32(v);
        memcpy(dst, &rgbx, 4); /* the fourth byte is overwritten by pixel x + 1 */
    }
}
#else
void gw__prep_resize_rows(const uint8_t *src, size_t stride, size_t row_bytes, const int16_t *w,
                          int start, int count, uint8_t *restrict out)
{
    rows_scalar(src, stride, 0, row_bytes, w, start, count, out);
}

void gw__prep_resize_cols(const uint8_t *restrict row, int src_w, const axis_t *a, int out_w,
                          uint8_t *restrict dst)
{
    for (int x = 0; x < out_w; x++)
        col_scalar(row, a, x, dst + (size_t)x * 3);
}
#endif

int gw__prep_resize_rgb(gw_prep_ctx_t *ctx, const uint8_t *src, int sw, int sh, size_t stride,
                        uint8_t *dst, int dw, int dh, gw_resize_t mode)
{
    size_t dst_row = (size_t)dw * 3;
    if (sw == dw && sh == dh) {
        for (int y = 0; y < dh; y++)
            memcpy(dst + (size_t)y * dst_row, src + (size_t)y * stride, dst_row);
        return 0;
    }
    axis_t xa, ya;
    int rc = gw__prep_axis_prepare(&ctx->xcoef, sw, dw, mode, &xa);
    if (rc == 0)
        rc = gw__prep_axis_prepare(&ctx->ycoef, sh, dh, mode, &ya);
    if (rc != 0)
        return rc;
    size_t row_bytes = (size_t)sw * 3;
    uint8_t *row = gw__prep_scratch_get(&ctx->row, row_bytes);
    if (row == NULL)
        return SQ_NOMEM;
    for (int y = 0; y < dh; y++) {
        const int16_t *w = ya.w + (size_t)y * ya.max_taps;
        const uint8_t *line;
        if (ya.count[y] == 1) {
            /* A single tap has weight one: read the source row in place. */
            line = src + (size_t)ya.start[y] * stride;
        } else {
            gw__prep_resize_rows(src, stride, row_bytes, w, ya.start[y], ya.count[y], row);
            line = row;
        }
        if (sw == dw)
            memcpy(dst + (size_t)y * dst_row, line, dst_row);
        else
            gw__prep_resize_cols(line, sw, &xa, dw, dst + (size_t)y * dst_row);
    }
    return 0;
}

int gw_resize_rgb(gw_prep_ctx_t *ctx, const uint8_t *src, int src_w, int src_h, size_t src_stride,
                  uint8_t *dst, int dst_w, int dst_h, gw_resize_t mode)
{
    if (ctx == NULL || src == NULL || dst == NULL || src_w < 1 || src_h < 1 || dst_w < 1 ||
        dst_h < 1 || dst_w > MAX_TARGET_SIDE || dst_h > MAX_TARGET_SIDE ||
        src_stride < (size_t)src_w * 3 || (mode != GW_RESIZE_BILINEAR && mode != GW_RESIZE_NEAREST))
        return SQ_INVAL;
    int rc = gw__prep_resize_rgb(ctx, src, src_w, src_h, src_stride, dst, dst_w, dst_h, mode);
    gw__prep_scratch_trim(&ctx->row);
    return rc;
}
