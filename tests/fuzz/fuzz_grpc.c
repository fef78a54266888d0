/* libFuzzer target for the gRPC room's request decoding
 * (gateway/grpc/grpc_codec.c): protobuf-c's unpacking of each method's
 * request, then squish's own checks of what it asks (the name, a version
 * that must be "" or 1..1000000000, the repository's name), and the
 * method a call's path names; TraceSetting's and LogSettings' settings
 * into their route's JSON body. ModelInfer's request goes through its own
 * decoder (grpc_infer_codec.c) into /v2's body, which the OIP codec then
 * parses against a fixed model, as squishd does; the answer encoder is
 * given the same bytes as an HTTP answer.
 *
 * Input: a first byte that picks the method (modulo their count), then
 * the message's bytes as a client sends them, copied into a buffer of
 * their exact size so that ASan reports a read one byte past them. The
 * same bytes are also tried as a call's path. A success must give a
 * terminated name of the room's size and a version in 0..1000000000; a
 * failure must be SQ_BAD_REQUEST with a reason. */
#include "grpc_int.h"
#include "gw_codec.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* ModelInfer: decoded into a body that the OIP codec takes or refuses
 * (never a crash), against input "input" [N,3,2,2] and two outputs. */
static void model_infer(const uint8_t *msg, size_t len)
{
    gw_grpc_infer_req_t q;
    char why[512];
    why[0] = '\0';
    int rc = gw_grpc_decode_infer(msg, len, &q, why, sizeof(why));
    if (rc != 0) {
        if (q.body != NULL || why[0] == '\0' ||
            (rc != SQ_BAD_REQUEST && rc != SQ_BAD_TENSOR && rc != SQ_TOO_LARGE))
            abort();
    } else {
        if (memchr(q.name, '\0', sizeof(q.name)) == NULL || q.version < 0 ||
            q.version > 1000000000 || q.header_len < 0 || (size_t)q.header_len > q.len)
            abort();
        gw_oip_model_t d;
        memset(&d, 0, sizeof(d));
        d.ninputs = 1;
        memcpy(d.inputs[0].name, "input", 6);
        d.inputs[0].datatype = GW_OIP_FP32;
        d.inputs[0].item_ndim = 3;
        d.inputs[0].item_shape[0] = 3;
        d.inputs[0].item_shape[1] = 2;
        d.inputs[0].item_shape[2] = 2;
        d.noutputs = 2;
        memcpy(d.outputs[0].name, "scores", 7);
        d.outputs[0].item_ndim = 1;
        d.outputs[0].item_shape[0] = 5;
        memcpy(d.outputs[1].name, "feat", 5);
        d.outputs[1].item_ndim = 1;
        d.outputs[1].item_shape[0] = 4;
        d.max_batch = 8;
        d.shared_memory = 1;
        gw_oip_request_t p;
        gw_oip_request_parse(q.body, q.len, q.header_len, &d, &p, why, sizeof(why));
        gw_oip_request_dispose(&p);
        gw_grpc_infer_req_dispose(&q);
    }
    /* The same bytes as an answer: encoded or refused. */
    uint8_t *out;
    size_t n;
    size_t hl = len > 0 ? msg[0] : 0;
    rc = gw_grpc_encode_infer(msg, len, hl <= len ? (long long)hl : -1, &out, &n, why, sizeof(why));
    if ((rc == 0) != (out != NULL))
        abort();
    free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    gw_grpc_method_t m = (gw_grpc_method_t)(data[0] % GW_GRPC_METHOD_COUNT);
    size_t len = size - 1;
    uint8_t *msg = malloc(len > 0 ? len : 1);
    if (msg == NULL)
        return 0;
    memcpy(msg, data + 1, len);
    gw_grpc_req_t req;
    char why[256];
    why[0] = '\0';
    int rc = gw_grpc_decode(m, msg, len, &req, why, sizeof(why));
    if (rc == 0) {
        if (memchr(req.name, '\0', sizeof(req.name)) == NULL)
            abort();
        if (req.version < 0 || req.version > 1000000000 || (req.ready != 0 && req.ready != 1))
            abort();
        /* Settings: an object a route reads as its body, or none. */
        if (req.settings != NULL && !json_is_object(req.settings))
            abort();
        char *text = req.settings != NULL ? json_dumps(req.settings, JSON_COMPACT) : NULL;
        if (req.settings != NULL && text == NULL)
            abort();
        free(text);
    } else if (rc != SQ_BAD_REQUEST || why[0] == '\0' || memchr(why, '\0', sizeof(why)) == NULL) {
        abort();
    }
    gw_grpc_req_dispose(&req);
    if (m == GW_GRPC_MODEL_INFER)
        model_infer(msg, len);
    int method = gw_grpc_method_of((const char *)msg, len);
    if (method < -1 || method >= GW_GRPC_METHOD_COUNT)
        abort();
    if (method >= 0 && gw_grpc_method_name((gw_grpc_method_t)method)[0] == '\0')
        abort();
    if (gw_grpc_status_of(rc) < 0 || gw_grpc_status_of(rc) > 16)
        abort();
    free(msg);
    return 0;
}
