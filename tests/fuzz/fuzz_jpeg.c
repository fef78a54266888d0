/* libFuzzer target for the JPEG preprocess (gateway/image/decode.c).
 *
 * Input: the image bytes as a client would POST them. Each input goes
 * through gw_image_to_rgb to a small target (at most 64x48) with the default
 * side limits and a 4 Mpixel budget, so that one input never takes more
 * than a few milliseconds. The target size and the resize mode follow from
 * the input length (not from its bytes, which stay a plain JPEG), so that
 * mutations also vary the resize geometry and reach the edge cases of the
 * SIMD kernels (odd tap counts, the last pixels of a row). The
 * result must be one of the documented codes, an error must carry a reason,
 * and a success must report a sane geometry; after an error the same
 * context must still decode a good JPEG (TurboJPEG 2.1 can leave a handle
 * broken after a bad header). ASan checks every byte the decoder and the
 * resize kernels touch. */
#include <gw_image.h>
#include <sq.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <turbojpeg.h>

#define TARGET_W 64
#define TARGET_H 48

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static gw_prep_ctx_t *ctx; /* one per process, as one per pool thread */
    static uint8_t dst[TARGET_W * TARGET_H * 3];
    static unsigned char *good; /* a 16x16 JPEG that must always decode */
    static unsigned long good_len;
    if (ctx == NULL) {
        gw_prep_limits_t lim = gw_prep_limits_default();
        lim.max_pixels = 4u * 1024 * 1024;
        ctx = gw_prep_ctx_new(&lim);
        uint8_t pix[16 * 16 * 3];
        for (size_t i = 0; i < sizeof(pix); i++)
            pix[i] = (uint8_t)(i * 7);
        tjhandle tj = tjInitCompress();
        if (ctx == NULL || tj == NULL ||
            tjCompress2(tj, pix, 16, 0, 16, TJPF_RGB, &good, &good_len, TJSAMP_420, 90, 0) != 0)
            __builtin_trap();
        tjDestroy(tj);
    }
    gw_resize_t mode = size % 2 ? GW_RESIZE_NEAREST : GW_RESIZE_BILINEAR;
    int out_w = 1 + (int)(size / 2 % TARGET_W), out_h = 1 + (int)(size / 2 / TARGET_W % TARGET_H);
    gw_image_info_t info;
    char err[GW_PREP_ERR_MAX];
    int rc = gw_image_to_rgb(ctx, data, size, out_w, out_h, mode, dst, &info, err, sizeof(err));
    switch (rc) {
    case 0:
        if (info.width < 1 || info.height < 1 || info.decoded_width < 1 ||
            info.decoded_height < 1 || info.decoded_width > info.width ||
            info.decoded_height > info.height)
            __builtin_trap();
        break;
    case SQ_BAD_IMAGE:
    case SQ_MEDIA_TYPE:
    case SQ_TOO_LARGE:
    case SQ_NOMEM:
        if (err[0] == '\0')
            __builtin_trap();
        if (gw_image_to_rgb(ctx, good, good_len, 8, 8, GW_RESIZE_BILINEAR, dst, NULL, NULL, 0) != 0)
            __builtin_trap();
        break;
    default:
        __builtin_trap();
    }
    return 0;
}
