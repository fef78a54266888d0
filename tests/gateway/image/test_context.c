/* gateway/image/context.c: the per-thread context (limits, the decoder
 * handle, scratch buffers kept up to GW_PREP_SCRATCH_KEEP_BYTES). */
#include "image_int.h"

#include <criterion/criterion.h>
#include <gw_image.h>
#include <sq.h>

#include <stdlib.h>
#include <string.h>

Test(context, default_limits)
{
    gw_prep_limits_t l = gw_prep_limits_default();
    cr_assert_eq(l.max_width, GW_PREP_DEFAULT_MAX_SIDE);
    cr_assert_eq(l.max_height, GW_PREP_DEFAULT_MAX_SIDE);
    cr_assert_eq(l.max_pixels, GW_PREP_DEFAULT_MAX_PIXELS);
    cr_assert_eq(l.dct_scaling, 1);
    cr_assert_eq(l.yuv_planes, 0);
}

Test(context, keeps_the_limits_it_was_given)
{
    gw_prep_ctx_t *dflt = gw_prep_ctx_new(NULL);
    cr_assert_not_null(dflt);
    gw_prep_limits_t want = gw_prep_limits_default();
    cr_assert_eq(memcmp(gw_prep_ctx_limits(dflt), &want, sizeof(want)), 0);
    gw_prep_limits_t mine = {.max_width = 10, .max_height = 20, .max_pixels = 150};
    gw_prep_ctx_t *ctx = gw_prep_ctx_new(&mine);
    mine.max_width = 99; /* a copy, not a reference */
    cr_assert_eq(gw_prep_ctx_limits(ctx)->max_width, 10);
    cr_assert_eq(gw_prep_ctx_limits(ctx)->max_height, 20);
    cr_assert_eq(gw_prep_ctx_limits(ctx)->max_pixels, 150);
    cr_assert_eq(gw_prep_ctx_limits(ctx)->dct_scaling, 0);
    gw_prep_ctx_free(ctx);
    gw_prep_ctx_free(dflt);
    gw_prep_ctx_free(NULL);
}

Test(context, scratch_grows_and_is_kept_up_to_the_keep_size)
{
    scratch_t s = {NULL, 0};
    uint8_t *a = gw__prep_scratch_get(&s, 100);
    cr_assert_not_null(a);
    cr_assert_eq(s.cap, 100);
    memset(a, 7, 100);
    /* Smaller or equal: the same buffer, contents untouched. */
    cr_assert_eq(gw__prep_scratch_get(&s, 40), a);
    cr_assert_eq(gw__prep_scratch_get(&s, 100), a);
    cr_assert_eq(a[99], 7);
    cr_assert_not_null(gw__prep_scratch_get(&s, 1000));
    cr_assert_eq(s.cap, 1000);
    /* At most the keep size: kept by a trim. */
    cr_assert_not_null(gw__prep_scratch_get(&s, GW_PREP_SCRATCH_KEEP_BYTES));
    gw__prep_scratch_trim(&s);
    cr_assert_eq(s.cap, GW_PREP_SCRATCH_KEEP_BYTES);
    cr_assert_not_null(s.p);
    /* Past it: released. */
    cr_assert_not_null(gw__prep_scratch_get(&s, GW_PREP_SCRATCH_KEEP_BYTES + 1));
    gw__prep_scratch_trim(&s);
    cr_assert_eq(s.cap, 0);
    cr_assert_null(s.p);
    /* Out of memory is NULL, not an abort, and leaves it empty (not under
     * AddressSanitizer, whose malloc aborts on a size it cannot serve). */
#ifndef __SANITIZE_ADDRESS__
    cr_assert_null(gw__prep_scratch_get(&s, SIZE_MAX / 2));
    cr_assert_eq(s.cap, 0);
#endif
    free(s.p);
}

Test(context, fail_writes_the_reason_and_returns_the_code)
{
    char err[16];
    cr_assert_eq(gw__prep_fail(err, sizeof(err), SQ_BAD_IMAGE, "bad %s %d", "jpeg", 42),
                 SQ_BAD_IMAGE);
    cr_assert_str_eq(err, "bad jpeg 42");
    /* Cut to the buffer, and no buffer at all. */
    cr_assert_eq(gw__prep_fail(err, 5, SQ_INVAL, "%s", "a long reason"), SQ_INVAL);
    cr_assert_str_eq(err, "a lo");
    cr_assert_eq(gw__prep_fail(NULL, 0, SQ_NOMEM, "x"), SQ_NOMEM);
}

Test(context, a_decoder_failure_gives_the_reason_and_a_fresh_handle)
{
    gw_prep_ctx_t *ctx = gw_prep_ctx_new(NULL);
    tjhandle before = ctx->tj;
    static const unsigned char junk[] = {0xFF, 0xD8, 0xFF, 0xC0, 0x00, 0x03, 0x01};
    int w, h, ss, cs;
    cr_assert_neq(tjDecompressHeader3(ctx->tj, junk, sizeof(junk), &w, &h, &ss, &cs), 0);
    char err[GW_PREP_ERR_MAX];
    cr_assert_eq(gw__prep_decoder_failed(ctx, err, sizeof(err)), SQ_BAD_IMAGE);
    cr_assert(strncmp(err, "bad jpeg: ", 10) == 0, "%s", err);
    cr_assert(strstr(err, "(): ") == NULL, "the tj function name is left in: %s", err);
    cr_assert_not_null(ctx->tj);
    (void)before; /* freed: only that a usable handle is there counts */
    gw_prep_ctx_free(ctx);
}
