/* image/'s insides, shared by the files of JPEG preprocessing (the public
 * side is gw_image.h): context.c (the per-thread context, its scratch
 * buffers and the decoder handle), resize.c (the fixed-point separable
 * resize), planes.c (the YUV planes path), decode.c (sniffing, bomb
 * limits, the decode and gw_image_to_rgb) and pool.c (the thread pool).
 * Each file calls only those before it; crops.c and detect.c call the
 * public side only. */
#ifndef GW_IMAGE_INT_H
#define GW_IMAGE_INT_H

#include "gw_image.h"

#include <stddef.h>
#include <stdint.h>
#include <turbojpeg.h>

/* Resize weights are fixed point with this many fractional bits. 14 bits
 * keep a tap sum (255 * 2^14 at most) far inside int32, and the rounding
 * error of one pass below half a gray level. */
#define WEIGHT_BITS 14
#define WEIGHT_ONE (1 << WEIGHT_BITS)

/* Largest model input side we accept as a target: a bug guard, not a
 * policy (model inputs are a few hundred pixels). */
#define MAX_TARGET_SIDE 16384

/* A buffer kept between calls and grown on demand. */
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

/* ---- context.c ------------------------------------------------------ */

/* Writes the message to err (when not NULL) and returns rc. */
int gw__prep_fail(char *err, size_t errlen, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Grows a scratch buffer to at least n bytes; NULL when memory is short
 * (pixel buffers are input-sized, so this is an error, not an abort). */
void *gw__prep_scratch_get(scratch_t *s, size_t n);
/* Returns buffers that grew past GW_PREP_SCRATCH_KEEP_BYTES to the
 * allocator, so one huge photo does not pin its memory in every thread for
 * good. */
void gw__prep_scratch_trim(scratch_t *s);
/* SQ_BAD_IMAGE with the decoder's reason in err, after replacing ctx's
 * TurboJPEG handle (see context.c for why). */
int gw__prep_decoder_failed(gw_prep_ctx_t *ctx, char *err, size_t errlen);

/* ---- resize.c ------------------------------------------------------- */

/* Weights of one axis, in to out pixels, in scratch s: 0 or SQ_NOMEM. */
int gw__prep_axis_prepare(scratch_t *s, int in, int out, gw_resize_t mode, axis_t *a);
/* Vertical pass: row_bytes bytes of one output row from count source rows
 * of stride bytes from row start, weights w. */
void gw__prep_resize_rows(const uint8_t *src, size_t stride, size_t row_bytes, const int16_t *w,
                          int start, int count, uint8_t *restrict out);
/* Horizontal pass: one packed RGB row of src_w pixels to out_w pixels. */
void gw__prep_resize_cols(const uint8_t *restrict row, int src_w, const axis_t *a, int out_w,
                          uint8_t *restrict dst);
/* gw_resize_rgb without the argument checks and the trim. */
int gw__prep_resize_rgb(gw_prep_ctx_t *ctx, const uint8_t *src, int sw, int sh, size_t stride,
                        uint8_t *dst, int dw, int dh, gw_resize_t mode);

/* ---- planes.c ------------------------------------------------------- */

/* Whether the YUV planes path takes an image of this TJCS_* colour space
 * and TJSAMP_* sampling. */
int gw__prep_planes_cover(int cs, int subsamp);
/* Decodes to Y, Cb, Cr planes at sw x sh (the DCT scale picked), resizes
 * them to out_w x out_h and converts to RGB per output pixel. box: libjpeg
 * upsamples this image's chroma by replication, not with the triangle
 * (4:2:2 at 1/8, where the chroma's DCT scaled size is 1). */
int gw__prep_planes_resize(gw_prep_ctx_t *ctx, const uint8_t *data, size_t len, int sw, int sh,
                           int subsamp, int box, uint8_t *dst, int out_w, int out_h,
                           gw_resize_t mode, char *err, size_t errlen);

/* ---- decode.c ------------------------------------------------------- */

/* gw_image_to_rgb (keep NULL) and gw_image_to_rgb_keep (keep non-NULL; with
 * keep_cover > 0 at the smallest DCT scale that covers keep_cover pixels),
 * for the pool's decode jobs. */
int gw__prep_to_rgb(gw_prep_ctx_t *ctx, const uint8_t *data, size_t len, int out_w, int out_h,
                    gw_resize_t mode, uint8_t *dst, gw_image_info_t *info, char *err, size_t errlen,
                    uint8_t **keep, int keep_cover);

#endif
