/* JPEG preprocessing (see gw_image.h): format sniffing, bomb limits,
 * libjpeg-turbo decoding with DCT scaling, a fixed-point separable resize,
 * and the thread pool that runs it off the HTTP loop. */
#include "gw_image.h"

#include <sq.h>

#include <assert.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <turbojpeg.h>

/* Resize weights are fixed point with this many fractional bits. 14 bits
 * keep a tap sum (255 * 2^14 at most) far inside int32, and the rounding
 * error of one pass below half a gray level. */
#define WEIGHT_BITS 14
#define WEIGHT_ONE (1 << WEIGHT_BITS)

/* Largest model input side we accept as a target: a bug guard, not a
 * policy (model inputs are a few hundred pixels). */
#define MAX_TARGET_SIDE 16384

typedef struct {
    void *p;
    size_t cap;
} scratch_t;

/* Resize weights of one axis: output i reads count[i] source pixels from
 * start[i] with weights w[i * max_taps + k]. max_taps is even and an odd
 * count is followed by a zero weight, so that the SIMD kernels can take
 * the taps two by two (one 32-bit load per pair). */
typedef struct {
    int *start;
    int *count;
    int16_t *w;
    int max_taps;
} axis_t;

struct gw_prep_ctx {
    tjhandle tj;
    gw_prep_limits_t limits;
    scratch_t pixels; /* the decoded image */
    scratch_t row;    /* one vertically resized row */
    scratch_t xcoef, ycoef;
    scratch_t cycoef; /* the chroma planes' vertical axis (YUV path) */
};

/* ---- small helpers -------------------------------------------------- */

static int fail(char *err, size_t errlen, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int fail(char *err, size_t errlen, int rc, const char *fmt, ...)
{
    if (err != NULL && errlen > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return rc;
}

/* Grows a scratch buffer to at least n bytes; NULL when memory is short
 * (pixel buffers are input-sized, so this is an error, not an abort). */
static void *scratch_get(scratch_t *s, size_t n)
{
    if (n <= s->cap)
        return s->p;
    free(s->p);
    s->p = malloc(n);
    s->cap = s->p != NULL ? n : 0;
    return s->p;
}

/* Returns buffers that grew past the keep size to the allocator, so one
 * huge photo does not pin its memory in every thread for good. */
static void scratch_trim(scratch_t *s)
{
    if (s->cap > GW_PREP_SCRATCH_KEEP_BYTES) {
        free(s->p);
        s->p = NULL;
        s->cap = 0;
    }
}

static void scratch_free(scratch_t *s)
{
    free(s->p);
    s->p = NULL;
    s->cap = 0;
}

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

gw_prep_limits_t gw_prep_limits_default(void)
{
    return (gw_prep_limits_t){
        .max_width = GW_PREP_DEFAULT_MAX_SIDE,
        .max_height = GW_PREP_DEFAULT_MAX_SIDE,
        .max_pixels = GW_PREP_DEFAULT_MAX_PIXELS,
        .dct_scaling = 1,
        .yuv_planes = 0, /* off: see gw_image.h */
    };
}

gw_prep_ctx_t *gw_prep_ctx_new(const gw_prep_limits_t *limits)
{
    tjhandle tj = tjInitDecompress();
    if (tj == NULL)
        return NULL;
    gw_prep_ctx_t *ctx = sq_xcalloc(1, sizeof(*ctx));
    ctx->tj = tj;
    ctx->limits = limits != NULL ? *limits : gw_prep_limits_default();
    return ctx;
}

void gw_prep_ctx_free(gw_prep_ctx_t *ctx)
{
    if (ctx == NULL)
        return;
    if (ctx->tj != NULL)
        tjDestroy(ctx->tj);
    scratch_free(&ctx->pixels);
    scratch_free(&ctx->row);
    scratch_free(&ctx->xcoef);
    scratch_free(&ctx->ycoef);
    scratch_free(&ctx->cycoef);
    free(ctx);
}

const gw_prep_limits_t *gw_prep_ctx_limits(const gw_prep_ctx_t *ctx)
{
    return &ctx->limits;
}

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

/* TurboJPEG prefixes its own messages with the function name
 * ("tjDecompress2(): ..."); clients need only the reason. */
static const char *tj_reason(tjhandle tj)
{
    const char *s = tjGetErrorStr2(tj);
    if (s == NULL || *s == '\0')
        return "unknown decoder error";
    const char *p = strstr(s, "(): ");
    return p != NULL && strncmp(s, "tj", 2) == 0 ? p + 4 : s;
}

/* ---- resize --------------------------------------------------------- */

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

static int axis_prepare(scratch_t *s, int in, int out, gw_resize_t mode, axis_t *a)
{
    a->max_taps = axis_taps(in, out, mode);
    size_t ints = (size_t)out * 2;
    size_t weights = (size_t)out * (size_t)a->max_taps;
    char *p = scratch_get(s, ints * sizeof(int) + weights * sizeof(int16_t));
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

static void resize_rows(const uint8_t *src, size_t stride, size_t row_bytes, const int16_t *w,
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
static void resize_cols(const uint8_t *restrict row, int src_w, const axis_t *a, int out_w,
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
static void resize_rows(const uint8_t *src, size_t stride, size_t row_bytes, const int16_t *w,
                        int start, int count, uint8_t *restrict out)
{
    rows_scalar(src, stride, 0, row_bytes, w, start, count, out);
}

static void resize_cols(const uint8_t *restrict row, int src_w, const axis_t *a, int out_w,
                        uint8_t *restrict dst)
{
    for (int x = 0; x < out_w; x++)
        col_scalar(row, a, x, dst + (size_t)x * 3);
}
#endif

static int resize_rgb(gw_prep_ctx_t *ctx, const uint8_t *src, int sw, int sh, size_t stride,
                      uint8_t *dst, int dw, int dh, gw_resize_t mode)
{
    size_t dst_row = (size_t)dw * 3;
    if (sw == dw && sh == dh) {
        for (int y = 0; y < dh; y++)
            memcpy(dst + (size_t)y * dst_row, src + (size_t)y * stride, dst_row);
        return 0;
    }
    axis_t xa, ya;
    int rc = axis_prepare(&ctx->xcoef, sw, dw, mode, &xa);
    if (rc == 0)
        rc = axis_prepare(&ctx->ycoef, sh, dh, mode, &ya);
    if (rc != 0)
        return rc;
    size_t row_bytes = (size_t)sw * 3;
    uint8_t *row = scratch_get(&ctx->row, row_bytes);
    if (row == NULL)
        return SQ_NOMEM;
    for (int y = 0; y < dh; y++) {
        const int16_t *w = ya.w + (size_t)y * ya.max_taps;
        const uint8_t *line;
        if (ya.count[y] == 1) {
            /* A single tap has weight one: read the source row in place. */
            line = src + (size_t)ya.start[y] * stride;
        } else {
            resize_rows(src, stride, row_bytes, w, ya.start[y], ya.count[y], row);
            line = row;
        }
        if (sw == dw)
            memcpy(dst + (size_t)y * dst_row, line, dst_row);
        else
            resize_cols(line, sw, &xa, dw, dst + (size_t)y * dst_row);
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
    int rc = resize_rgb(ctx, src, src_w, src_h, src_stride, dst, dst_w, dst_h, mode);
    scratch_trim(&ctx->row);
    return rc;
}

/* ---- decode --------------------------------------------------------- */

/* Reports a decoder error and replaces the handle. TurboJPEG 2.1 leaves a
 * decompressor whose header read failed half-way through a header: the next
 * tjDecompressHeader3 on it then "succeeds" without reading anything, so
 * one corrupt upload would fail the next good image on the same thread. A
 * fresh handle costs microseconds, and only on the error path. */
static int decoder_failed(gw_prep_ctx_t *ctx, char *err, size_t errlen)
{
    fail(err, errlen, SQ_BAD_IMAGE, "bad jpeg: %s", tj_reason(ctx->tj));
    tjDestroy(ctx->tj);
    ctx->tj = tjInitDecompress(); /* NULL when out of memory: retried on the next call */
    return SQ_BAD_IMAGE;
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
        return fail(err, errlen, SQ_BAD_IMAGE, "empty image");
    if (len < 2 || data[0] != 0xFF || data[1] != 0xD8)
        return fail(err, errlen, SQ_MEDIA_TYPE, "unsupported image type: %s (expected jpeg)",
                    sniff_other(data, len));
    return 0;
}

static int decode_resize(gw_prep_ctx_t *ctx, const uint8_t *data, size_t len, uint8_t *pix, int sw,
                         int sh, size_t pitch, int pf, int cmyk, uint8_t *dst, int out_w, int out_h,
                         gw_resize_t mode, char *err, size_t errlen);
static int planes_cover(int cs, int subsamp);
static int planes_resize(gw_prep_ctx_t *ctx, const uint8_t *data, size_t len, int sw, int sh,
                         int subsamp, int box, uint8_t *dst, int out_w, int out_h, gw_resize_t mode,
                         char *err, size_t errlen);

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
        return fail(err, errlen, SQ_TOO_LARGE, "jpeg of %zu bytes is too large", len);
    if (ctx->tj == NULL && (ctx->tj = tjInitDecompress()) == NULL)
        return fail(err, errlen, SQ_NOMEM, "no memory for a jpeg decoder");

    int w = 0, h = 0, subsamp = 0, cs = 0;
    if (tjDecompressHeader3(ctx->tj, data, (unsigned long)len, &w, &h, &subsamp, &cs) != 0)
        return decoder_failed(ctx, err, errlen);
    info->width = w;
    info->height = h;
    info->subsamp = subsamp;
    info->colorspace = cs;

    /* TurboJPEG 2.1 reports success, leaving the outputs alone, for a
     * stream that ends before its frame header (a tables-only JPEG). */
    if (w < 1 || h < 1)
        return fail(err, errlen, SQ_BAD_IMAGE, "bad jpeg: no frame header (truncated?)");
    /* Bomb check: the header is all that has been read so far. */
    const gw_prep_limits_t *lim = &ctx->limits;
    if ((uint64_t)w > lim->max_width || (uint64_t)h > lim->max_height ||
        (uint64_t)w * (uint64_t)h > lim->max_pixels)
        return fail(err, errlen, SQ_TOO_LARGE,
                    "image %dx%d exceeds the limits (%ux%u, %llu pixels)", w, h, lim->max_width,
                    lim->max_height, (unsigned long long)lim->max_pixels);

    int cover_w = keep != NULL && keep_cover > out_w ? keep_cover : out_w;
    int cover_h = keep != NULL && keep_cover > out_h ? keep_cover : out_h;
    tjscalingfactor sf =
        pick_scale(w, h, cover_w, cover_h, lim->dct_scaling && (keep == NULL || keep_cover > 0));
    int sw = TJSCALED(w, sf), sh = TJSCALED(h, sf);
    info->scale_num = sf.num;
    info->scale_denom = sf.denom;
    info->decoded_width = sw;
    info->decoded_height = sh;

    if (keep == NULL && lim->yuv_planes && planes_cover(cs, subsamp))
        return planes_resize(ctx, data, len, sw, sh, subsamp,
                             subsamp == TJSAMP_422 && sf.num * 8 == sf.denom, dst, out_w, out_h,
                             mode, err, errlen);

    int cmyk = cs == TJCS_CMYK || cs == TJCS_YCCK;
    int pf = cmyk ? TJPF_CMYK : TJPF_RGB;
    size_t pitch = (size_t)sw * (size_t)tjPixelSize[pf];
    uint8_t *pix =
        keep != NULL ? malloc(pitch * (size_t)sh) : scratch_get(&ctx->pixels, pitch * (size_t)sh);
    if (pix == NULL)
        return fail(err, errlen, SQ_NOMEM, "no memory to decode a %dx%d image", sw, sh);
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
        return decoder_failed(ctx, err, errlen);
    if (cmyk)
        cmyk_to_rgb(pix, (size_t)sw * (size_t)sh);
    int rc = resize_rgb(ctx, pix, sw, sh, (size_t)sw * 3, dst, out_w, out_h, mode);
    if (rc != 0)
        return fail(err, errlen, rc, "no memory to resize a %dx%d image", sw, sh);
    return 0;
}

/* ---- YUV planes ------------------------------------------------------ */

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
    char *p =
        scratch_get(s, quarters * sizeof(int32_t) + ints * sizeof(int) + weights * sizeof(int16_t));
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
static int planes_cover(int cs, int subsamp)
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
static int planes_resize(gw_prep_ctx_t *ctx, const uint8_t *data, size_t len, int sw, int sh,
                         int subsamp, int box, uint8_t *dst, int out_w, int out_h, gw_resize_t mode,
                         char *err, size_t errlen)
{
    int nplanes = subsamp == TJSAMP_GRAY ? 1 : 3;
    int pw[3] = {0}, ph[3] = {0};
    size_t off[3] = {0}, total = 0;
    for (int c = 0; c < nplanes; c++) {
        pw[c] = tjPlaneWidth(c, sw, subsamp);
        ph[c] = tjPlaneHeight(c, sh, subsamp);
        if (pw[c] < 1 || ph[c] < 1)
            return fail(err, errlen, SQ_BAD_IMAGE, "bad jpeg: no plane size for %dx%d", sw, sh);
        off[c] = total;
        total += (size_t)pw[c] * (size_t)ph[c];
    }
    uint8_t *buf = scratch_get(&ctx->pixels, total);
    if (buf == NULL)
        return fail(err, errlen, SQ_NOMEM, "no memory to decode a %dx%d image", sw, sh);
    unsigned char *planes[3] = {NULL, NULL, NULL};
    int strides[3] = {0, 0, 0};
    for (int c = 0; c < nplanes; c++) {
        planes[c] = buf + off[c];
        strides[c] = pw[c];
    }
    int flags = TJFLAG_STOPONWARNING | TJFLAG_LIMITSCANS;
    if (tjDecompressToYUVPlanes(ctx->tj, data, (unsigned long)len, planes, sw, strides, sh,
                                flags) != 0)
        return decoder_failed(ctx, err, errlen);

    /* Horizontal: each output row's Y, Cb, Cr lines are packed into one
     * YCbCr row at luma width (chroma upsampled as libjpeg's fancy
     * upsampling does: 3/4 of the nearest sample, 1/4 of the next, rounded
     * alternately down and up), then resized by the RGB path's kernel and
     * converted. Vertical: the luma axis, and for 4:2:0 chroma the same
     * composed with the vertical fancy upsampling. */
    int hsub = nplanes == 3 && subsamp != TJSAMP_444;
    int vsub = nplanes == 3 && subsamp == TJSAMP_420;
    axis_t xa = {0}, ya = {0}, cya = {0};
    int rc = axis_prepare(&ctx->xcoef, sw, out_w, mode, &xa);
    if (rc == 0)
        rc = axis_prepare(&ctx->ycoef, sh, out_h, mode, &ya);
    cya = ya;
    if (rc == 0 && vsub)
        rc = chroma_axis_v2(&ctx->cycoef, &ya, out_h, ph[1], &cya);
    size_t packed_len = (size_t)sw * 3 + (size_t)pw[1] + (size_t)pw[2] + (size_t)pw[0];
    uint8_t *packed = rc == 0 ? scratch_get(&ctx->row, packed_len) : NULL;
    if (packed == NULL)
        return fail(err, errlen, SQ_NOMEM, "no memory to resize a %dx%d image", sw, sh);
    uint8_t *yrow = packed + (size_t)sw * 3, *cbrow = yrow + pw[0], *crrow = cbrow + pw[1];
    for (int y = 0; y < out_h; y++) {
        const uint8_t *line[3] = {NULL, NULL, NULL};
        uint8_t *tmp[3] = {yrow, cbrow, crrow};
        for (int c = 0; c < nplanes; c++) {
            const axis_t *a = c == 0 ? &ya : &cya;
            if (a->count[y] == 1) {
                line[c] = planes[c] + (size_t)a->start[y] * (size_t)pw[c];
            } else {
                resize_rows(planes[c], (size_t)pw[c], (size_t)pw[c], a->w + (size_t)y * a->max_taps,
                            a->start[y], a->count[y], tmp[c]);
                line[c] = tmp[c];
            }
        }
        uint8_t *out = dst + (size_t)y * (size_t)out_w * 3;
        if (nplanes == 1) {
            for (int x = 0; x < sw; x++)
                packed[3 * x] = packed[3 * x + 1] = packed[3 * x + 2] = line[0][x];
            resize_cols(packed, sw, &xa, out_w, out);
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
        resize_cols(packed, sw, &xa, out_w, out);
        ycc_to_rgb_row(out, out_w);
    }
    return 0;
}

static int to_rgb(gw_prep_ctx_t *ctx, const uint8_t *data, size_t len, int out_w, int out_h,
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
        return fail(err, errlen, SQ_INVAL, "invalid preprocessing arguments");
    int rc =
        image_to_rgb(ctx, data, len, out_w, out_h, mode, dst, info, err, errlen, keep, keep_cover);
    scratch_trim(&ctx->pixels);
    scratch_trim(&ctx->row);
    return rc;
}

int gw_image_to_rgb(gw_prep_ctx_t *ctx, const uint8_t *data, size_t len, int out_w, int out_h,
                    gw_resize_t mode, uint8_t *dst, gw_image_info_t *info, char *err, size_t errlen)
{
    return to_rgb(ctx, data, len, out_w, out_h, mode, dst, info, err, errlen, NULL, 0);
}

int gw_image_to_rgb_keep(gw_prep_ctx_t *ctx, const uint8_t *data, size_t len, int out_w, int out_h,
                         gw_resize_t mode, uint8_t *dst, gw_image_info_t *info, uint8_t **original,
                         char *err, size_t errlen)
{
    *original = NULL;
    return to_rgb(ctx, data, len, out_w, out_h, mode, dst, info, err, errlen, original, 0);
}

/* ---- thread pool ---------------------------------------------------- */

struct gw_prep_pool {
    pthread_mutex_t mu;
    pthread_cond_t wake; /* a job arrived, or shutdown began */
    gw_prep_job_t *head, *tail;
    int queued;
    int capacity;
    int stopping; /* no more submits */
    int cancel;   /* queued jobs get SQ_SHUTTING_DOWN */
    int joined;
    int nthreads;
    pthread_t *threads;
    gw_prep_ctx_t **ctxs;
    double svc_ns;  /* EWMA of a decode's duration; 0 before the first */
    double byte_ns; /* EWMA of the time per JPEG byte of large files; 0: none yet */
};

typedef struct {
    gw_prep_pool_t *pool;
    gw_prep_ctx_t *ctx;
} worker_arg_t;

/* Runs a job and calls its callback; returns how long the decode took
 * (0 when it was not decoded). A job that a decode of the usual duration
 * (expect_ns, 0 when none measured yet) would finish past its deadline is
 * not decoded. */
static int64_t run_job(gw_prep_ctx_t *ctx, gw_prep_job_t *job, int cancelled, int64_t expect_ns)
{
    job->started_ns = sq_now_ns();
    int64_t decode_ns = 0;
    int rc;
    if (cancelled) {
        rc = fail(job->err, sizeof(job->err), SQ_SHUTTING_DOWN,
                  "preprocessing cancelled at shutdown");
    } else if (job->deadline_ns != 0 && job->started_ns >= job->deadline_ns) {
        rc = fail(job->err, sizeof(job->err), SQ_DEADLINE,
                  "deadline passed after %.3f ms in the preprocessing queue",
                  (double)(job->started_ns - job->queued_ns) / 1e6);
    } else if (job->deadline_ns != 0 && job->started_ns + expect_ns >= job->deadline_ns) {
        rc = fail(job->err, sizeof(job->err), SQ_DEADLINE,
                  "too close to its deadline to decode (%.3f ms left after %.3f ms in the "
                  "preprocessing queue, decodes take %.3f ms)",
                  (double)(job->deadline_ns - job->started_ns) / 1e6,
                  (double)(job->started_ns - job->queued_ns) / 1e6, (double)expect_ns / 1e6);
    } else if (job->work != NULL) {
        rc = job->work(ctx, job);
    } else {
        rc = to_rgb(ctx, job->data, job->len, job->out_w, job->out_h, job->mode, job->dst,
                    &job->info, job->err, sizeof(job->err),
                    job->keep_original ? &job->original : NULL, job->keep_cover);
        decode_ns = sq_now_ns() - job->started_ns;
    }
    job->finished_ns = sq_now_ns();
    job->done(job, rc);
    return decode_ns;
}

/* What a decode of len bytes is expected to take (pool->mu held): the mean
 * decode, or for a large file (where the time per byte outweighs a
 * decode's fixed cost) the time per byte of large files times len when
 * that is more. Small files' time per byte is mostly their fixed cost: it
 * would make a large file's estimate several times too long. */
static double expect_decode_ns(const gw_prep_pool_t *pool, size_t len)
{
    double by_size = len >= GW_PREP_BYTE_RATE_MIN ? pool->byte_ns * (double)len : 0;
    return by_size > pool->svc_ns ? by_size : pool->svc_ns;
}

static void *pool_thread(void *arg)
{
    gw_prep_pool_t *pool = ((worker_arg_t *)arg)->pool;
    gw_prep_ctx_t *ctx = ((worker_arg_t *)arg)->ctx;
    free(arg);
    pthread_mutex_lock(&pool->mu);
    for (;;) {
        while (pool->head == NULL && !pool->stopping)
            pthread_cond_wait(&pool->wake, &pool->mu);
        gw_prep_job_t *job = pool->head;
        if (job == NULL)
            break; /* stopping and drained */
        pool->head = job->next_;
        if (pool->head == NULL)
            pool->tail = NULL;
        pool->queued--;
        int cancelled = pool->cancel;
        /* A decode's time is planned from its own size (issue 23: a 12 MP
         * photo judged by the mean of small frames); other work by the mean. */
        size_t len = job->work == NULL ? job->len : 0;
        int64_t expect_ns = (int64_t)expect_decode_ns(pool, len);
        pthread_mutex_unlock(&pool->mu);
        job->next_ = NULL;
        int64_t decode_ns = run_job(ctx, job, cancelled, expect_ns); /* job is gone after */
        pthread_mutex_lock(&pool->mu);
        if (decode_ns > 0) {
            pool->svc_ns =
                pool->svc_ns > 0 ? 0.9 * pool->svc_ns + 0.1 * (double)decode_ns : (double)decode_ns;
            if (len >= GW_PREP_BYTE_RATE_MIN) {
                double per = (double)decode_ns / (double)len;
                pool->byte_ns = pool->byte_ns > 0 ? 0.9 * pool->byte_ns + 0.1 * per : per;
            }
        }
    }
    pthread_mutex_unlock(&pool->mu);
    return NULL;
}

static void pool_release(gw_prep_pool_t *pool)
{
    for (int i = 0; i < pool->nthreads; i++)
        gw_prep_ctx_free(pool->ctxs[i]);
    pthread_cond_destroy(&pool->wake);
    pthread_mutex_destroy(&pool->mu);
    free(pool->ctxs);
    free(pool->threads);
    free(pool);
}

int gw_prep_pool_new(const gw_prep_pool_config_t *cfg, gw_prep_pool_t **out)
{
    *out = NULL;
    if (cfg == NULL || cfg->threads < 1 || cfg->threads > 1024 || cfg->queue_capacity < 1)
        return SQ_INVAL;
    gw_prep_pool_t *pool = sq_xcalloc(1, sizeof(*pool));
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->wake, NULL);
    pool->capacity = cfg->queue_capacity;
    pool->nthreads = cfg->threads;
    pool->threads = sq_xcalloc((size_t)cfg->threads, sizeof(pthread_t));
    pool->ctxs = sq_xcalloc((size_t)cfg->threads, sizeof(gw_prep_ctx_t *));
    for (int i = 0; i < cfg->threads; i++) {
        pool->ctxs[i] = gw_prep_ctx_new(&cfg->limits);
        if (pool->ctxs[i] == NULL) {
            pool_release(pool);
            return SQ_NOMEM;
        }
    }
    for (int i = 0; i < cfg->threads; i++) {
        worker_arg_t *arg = sq_xmalloc(sizeof(*arg));
        *arg = (worker_arg_t){.pool = pool, .ctx = pool->ctxs[i]};
        int err = pthread_create(&pool->threads[i], NULL, pool_thread, arg);
        if (err != 0) {
            free(arg);
            SQ_ERROR("preprocess pool: cannot start a thread errno=%d", err);
            pthread_mutex_lock(&pool->mu);
            pool->stopping = 1;
            pthread_cond_broadcast(&pool->wake);
            pthread_mutex_unlock(&pool->mu);
            for (int j = 0; j < i; j++)
                pthread_join(pool->threads[j], NULL);
            pool_release(pool);
            return SQ_INTERNAL;
        }
    }
    *out = pool;
    return 0;
}

int gw_prep_pool_submit(gw_prep_pool_t *pool, gw_prep_job_t *job)
{
    if (pool == NULL || job == NULL || job->done == NULL)
        return SQ_INVAL;
    if (job->work == NULL &&
        (job->dst == NULL || job->out_w < 1 || job->out_h < 1 || job->out_w > MAX_TARGET_SIDE ||
         job->out_h > MAX_TARGET_SIDE || (job->data == NULL && job->len > 0)))
        return SQ_INVAL;
    job->original = NULL;
    job->next_ = NULL;
    job->err[0] = '\0';
    job->queued_ns = sq_now_ns();
    job->started_ns = job->finished_ns = 0;
    pthread_mutex_lock(&pool->mu);
    int rc = 0;
    if (pool->stopping) {
        rc = SQ_SHUTTING_DOWN;
    } else if (pool->queued >= pool->capacity) {
        rc = SQ_OVERLOAD;
    } else if (job->deadline_ns != 0 && pool->queued > 0 &&
               job->queued_ns + (int64_t)((double)(pool->queued + pool->nthreads) * pool->svc_ns /
                                          pool->nthreads) >=
                   job->deadline_ns) {
        /* The jobs ahead of it and its own decode, at the recent decode
         * time, leave it no chance to be done by its deadline: say so now
         * rather than at the deadline. */
        rc = SQ_DEADLINE;
    } else {
        if (pool->tail != NULL)
            pool->tail->next_ = job;
        else
            pool->head = job;
        pool->tail = job;
        pool->queued++;
        pthread_cond_signal(&pool->wake);
    }
    pthread_mutex_unlock(&pool->mu);
    return rc;
}

double gw_prep_pool_decode_us(gw_prep_pool_t *pool)
{
    pthread_mutex_lock(&pool->mu);
    double us = pool->svc_ns / 1000.0;
    pthread_mutex_unlock(&pool->mu);
    return us;
}

double gw_prep_pool_decode_us_for(gw_prep_pool_t *pool, size_t len)
{
    pthread_mutex_lock(&pool->mu);
    double us = expect_decode_ns(pool, len) / 1000.0;
    pthread_mutex_unlock(&pool->mu);
    return us;
}

int gw_prep_pool_queued(gw_prep_pool_t *pool)
{
    pthread_mutex_lock(&pool->mu);
    int n = pool->queued;
    pthread_mutex_unlock(&pool->mu);
    return n;
}

void gw_prep_pool_shutdown(gw_prep_pool_t *pool, gw_prep_shutdown_t how)
{
    if (pool == NULL || pool->joined)
        return;
    pthread_mutex_lock(&pool->mu);
    pool->stopping = 1;
    if (how == GW_PREP_CANCEL)
        pool->cancel = 1;
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->mu);
    for (int i = 0; i < pool->nthreads; i++)
        pthread_join(pool->threads[i], NULL);
    pool->joined = 1;
}

void gw_prep_pool_free(gw_prep_pool_t *pool)
{
    if (pool == NULL)
        return;
    gw_prep_pool_shutdown(pool, GW_PREP_DRAIN);
    pool_release(pool);
}
