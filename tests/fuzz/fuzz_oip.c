/* libFuzzer target for the OIP request decoder and response encoder.
 *
 * Input: byte 0 picks the model (bit 0: one image input, or two inputs) and
 * the Inference-Header-Content-Length (bits 1-2: absent, 0, taken from bytes
 * 1-2, or past the end); the rest is the body. A body that decodes is then
 * checked (every row inside memory the request may read, tensor rows of the
 * exact size) and answered through the encoder with dummy outputs, whose
 * JSON must validate. */
#include <gw_codec.h>
#include <oip_int.h>
#include <sq.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static gw_oip_model_t fuzz_model(int two_inputs)
{
    gw_oip_model_t m;
    memset(&m, 0, sizeof(m));
    m.ninputs = two_inputs ? 2 : 1;
    strcpy(m.inputs[0].name, "input");
    m.inputs[0].datatype = GW_OIP_FP32;
    m.inputs[0].accept = (1u << GW_OIP_FP32) | (1u << GW_OIP_UINT8) | (1u << GW_OIP_BYTES);
    m.inputs[0].item_ndim = 3;
    m.inputs[0].item_shape[0] = 3;
    m.inputs[0].item_shape[1] = 2;
    m.inputs[0].item_shape[2] = 2;
    strcpy(m.inputs[1].name, "scale");
    m.inputs[1].datatype = GW_OIP_UINT8;
    m.inputs[1].item_ndim = 1;
    m.inputs[1].item_shape[0] = 2;
    m.noutputs = 2;
    strcpy(m.outputs[0].name, "logits");
    m.outputs[0].item_ndim = 1;
    m.outputs[0].item_shape[0] = 5;
    strcpy(m.outputs[1].name, "features");
    m.outputs[1].item_ndim = 2;
    m.outputs[1].item_shape[0] = 2;
    m.outputs[1].item_shape[1] = 1;
    m.max_batch = 4;
    m.max_depth = 16;
    m.max_body_bytes = 1 << 20;
    m.max_image_bytes = 4096;
    return m;
}

static void check_rows(const gw_oip_request_t *r, const gw_oip_model_t *m)
{
    volatile uint8_t sink = 0;
    if (r->batch < 1 || r->batch > m->max_batch)
        abort();
    for (int i = 0; i < m->ninputs; i++) {
        const gw_oip_input_t *in = &r->inputs[i];
        size_t item = 1;
        for (int k = 0; k < m->inputs[i].item_ndim; k++)
            item *= (size_t)m->inputs[i].item_shape[k];
        for (int b = 0; b < r->batch; b++) {
            const gw_oip_row_t *row = &in->rows[b];
            if (in->datatype == GW_OIP_BYTES) {
                if (row->len == 0 || row->len > m->max_image_bytes)
                    abort();
            } else if (row->len != item * gw_oip_datatype_size(in->datatype)) {
                abort();
            }
            for (size_t k = 0; k < row->len; k++) /* ASan checks every byte */
                sink ^= row->data[k];
        }
    }
    (void)sink;
}

static void answer(const gw_oip_request_t *r, const gw_oip_model_t *m)
{
    static float logits[4 * 5], features[4 * 2];
    for (int i = 0; i < 4 * 5; i++)
        logits[i] = (float)((i * 7) % 5) - 1.5f;
    logits[3] = 1e30f;
    features[1] = -0.0f;
    features[2] = 3.4028235e38f;
    const float *outs[2] = {logits, features};
    const char *labels[3] = {"cat", "d\"og\n", NULL};
    gw_oip_param_t params[2] = {{"queue_ms", 0.5, NULL}, {"slo_source", 0, "none"}};
    gw_oip_response_t resp = {.model_name = "m",
                              .model_version = "1",
                              .model = m,
                              .request = r,
                              .outputs = outs,
                              .labels = labels,
                              .nlabels = 3,
                              .params = params,
                              .nparams = 2};
    sq_buf_t b;
    sq_buf_init(&b);
    long long hl;
    char err[256];
    if (gw_oip_response_encode(&resp, &b, &hl) != 0)
        abort();
    size_t jl = hl >= 0 ? (size_t)hl : b.len;
    if (jl > b.len || oip_json_validate((const char *)b.data, jl, 8, err, sizeof(err)) != 0)
        abort();
    sq_buf_dispose(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 3)
        return 0;
    gw_oip_model_t m = fuzz_model(data[0] & 1);
    const uint8_t *body = data + 3;
    size_t len = size - 3;
    long long header_len;
    switch ((data[0] >> 1) & 3) {
    case 0:
        header_len = -1;
        break;
    case 1:
        header_len = 0;
        break;
    case 2:
        header_len = len ? (long long)((data[1] | data[2] << 8) % (len + 1)) : 0;
        break;
    default:
        header_len = (long long)len + (data[1] | data[2] << 8);
        break;
    }
    /* A private copy, so that ASan sees a read one byte past the body. */
    uint8_t *copy = malloc(len ? len : 1);
    memcpy(copy, body, len);
    gw_oip_request_t r;
    char err[256];
    m.shared_memory = (data[0] >> 3) & 1;
    int rc = gw_oip_request_parse(copy, len, header_len, &m, &r, err, sizeof(err));
    if (rc != 0 && (err[0] == '\0' || r.batch != 0))
        abort(); /* every failure says why and leaves an empty request */
    /* An input in shared memory takes its bytes from a "region": the body's
     * own tail, as many as its byte size asks for (what the API does with a
     * mapped region once it checked the window). */
    for (int i = 0; rc == 0 && i < m.ninputs; i++) {
        const gw_oip_shm_t *shm = &r.inputs[i].shm;
        if (shm->region[0] == '\0')
            continue;
        if (shm->byte_size > len) {
            rc = SQ_BAD_REQUEST;
            break;
        }
        rc = gw_oip_input_set_bytes(&r, &m, i, copy + len - shm->byte_size, (size_t)shm->byte_size,
                                    err, sizeof(err));
        if (rc != 0 && (err[0] == '\0' || rc == SQ_INVAL))
            abort(); /* says why, and never blames a sound call on its caller */
    }
    if (rc == 0) {
        check_rows(&r, &m);
        answer(&r, &m);
    }
    gw_oip_request_dispose(&r);
    free(copy);
    return 0;
}
