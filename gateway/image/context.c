/* JPEG preprocessing's per-thread context (see gw_image.h, image_int.h):
 * the limits, the TurboJPEG handle and the scratch buffers that the decode
 * and the resize keep between calls. */
#include "image_int.h"

#include <sq.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <turbojpeg.h>

int gw__prep_fail(char *err, size_t errlen, int rc, const char *fmt, ...)
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
void *gw__prep_scratch_get(scratch_t *s, size_t n)
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
void gw__prep_scratch_trim(scratch_t *s)
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

/* Reports a decoder error and replaces the handle. TurboJPEG 2.1 leaves a
 * decompressor whose header read failed half-way through a header: the next
 * tjDecompressHeader3 on it then "succeeds" without reading anything, so
 * one corrupt upload would fail the next good image on the same thread. A
 * fresh handle costs microseconds, and only on the error path. */
int gw__prep_decoder_failed(gw_prep_ctx_t *ctx, char *err, size_t errlen)
{
    gw__prep_fail(err, errlen, SQ_BAD_IMAGE, "bad jpeg: %s", tj_reason(ctx->tj));
    tjDestroy(ctx->tj);
    ctx->tj = tjInitDecompress(); /* NULL when out of memory: retried on the next call */
    return SQ_BAD_IMAGE;
}
