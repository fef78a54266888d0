/* libFuzzer target for the typed frontend frames (gateway/codec/
 * front_frames.c): what a frontend does with the dispatcher's FE_CATALOG
 * and FE_STATE, and what the dispatcher does with a frontend's FE_METRICS,
 * when the peer is not to be trusted.
 *
 * Input: a payload. Each decoder is tried on it under its own type, and
 * must refuse it under another's. A message that decodes must encode
 * back to exactly its payload: the encoding is canonical, so a decoder
 * that accepted anything else has missed a check. The payload lives in a
 * heap block of exactly its length, so that ASan sees an overread. */
#include <gw_codec_fe.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(const sq_buf_t *enc, const sq_frame_t *f)
{
    if (enc->len != f->len || (enc->len > 0 && memcmp(enc->data, f->payload, enc->len) != 0))
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > SQ_IPC_MAX_PAYLOAD)
        return 0;
    static const uint16_t types[3] = {SQ_MSG_FE_CATALOG, SQ_MSG_FE_STATE, SQ_MSG_FE_METRICS};
    size_t len = size;
    uint8_t *payload = malloc(len > 0 ? len : 1);
    if (len > 0)
        memcpy(payload, data, len);
    sq_buf_t enc;
    sq_buf_init(&enc);
    for (int t = 0; t < 3; t++) {
        sq_frame_t f = {.type = types[t], .payload = payload, .len = (uint32_t)len};
        sq_frame_t other = f;
        other.type = types[(t + 1) % 3];
        enc.len = 0;
        if (t == 0) {
            gw_fe_catalog_t m;
            if (gw_fe_catalog_decode(&other, &m) == 0)
                abort();
            if (gw_fe_catalog_decode(&f, &m) == 0) {
                gw_fe_catalog_encode(&enc, &m);
                check(&enc, &f);
                gw_fe_catalog_dispose(&m);
            }
        } else if (t == 1) {
            gw_fe_state_t m;
            if (gw_fe_state_decode(&other, &m) == 0)
                abort();
            if (gw_fe_state_decode(&f, &m) == 0) {
                gw_fe_state_encode(&enc, &m);
                check(&enc, &f);
                gw_fe_state_dispose(&m);
            }
        } else {
            gw_fe_metrics_t m;
            if (gw_fe_metrics_decode(&other, &m) == 0)
                abort();
            if (gw_fe_metrics_decode(&f, &m) == 0) {
                gw_fe_metrics_encode(&enc, &m);
                check(&enc, &f);
                gw_fe_metrics_dispose(&m);
            }
        }
    }
    sq_buf_dispose(&enc);
    free(payload);
    return 0;
}
