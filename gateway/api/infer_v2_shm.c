/* /v2 tensors in registered shared memory (Triton's extension, shm_int.h):
 * an input named in a region is checked against it and its rows pointed
 * into it (copied into the arena as a body's are, with no body to read),
 * and an output asked for in one is written there by the answer. The
 * regions stay held by the request (gw_v2_state_t) until it is disposed. */
#include "infer_int.h"

#include <string.h>

/* Writes the outputs asked for in shared memory into their regions (each
 * output's batch x item floats); 0, or SQ_BAD_REQUEST with why. */
int gw_v2_write_shm_outputs(gw_infer_t *req, const float *const *outputs, char *why, size_t len)
{
    gw_v2_state_t *st = req->api_state;
    const gw_oip_request_t *p = &st->parsed;
    for (int i = 0; i < p->noutputs; i++) {
        const gw_oip_output_req_t *o = &p->outputs[i];
        if (st->out_region[i] == NULL)
            continue;
        size_t bytes = (size_t)req->n_items * (size_t)req->model->outputs[o->model_output].elems *
                       sizeof(float);
        char span[512];
        uint8_t *dst = gw_shm_span(st->out_region[i], o->shm.offset, bytes, span, sizeof(span));
        if (dst == NULL) {
            snprintf(why, len, "outputs[%d].parameters.shared_memory_region: %s", i, span);
            return SQ_BAD_REQUEST;
        }
        memcpy(dst, outputs[o->model_output], bytes);
    }
    return 0;
}

/* A reference to the region a tensor names (held by the request), or NULL
 * after rejecting: path is the tensor's parameter, for the message. */
static gw_shm_region_t *v2_region(gw_infer_t *req, gw_v2_state_t *st, const char *name,
                                  const char *path)
{
    gw_api_ctx_t *api = req->base.app;
    gw_shm_region_t *r = gw_shm_acquire(api->shm, name);
    if (r == NULL) {
        gw_infer_reject(
            req, SQ_BAD_REQUEST,
            "%s: Unable to find shared memory region: '%s' (register it with POST "
            "/v2/systemsharedmemory/region/%s/register; GET /v2/systemsharedmemory/status "
            "lists those registered)",
            path, name, name);
        return NULL;
    }
    st->regions[st->nregions++] = r;
    return r;
}

/* The regions the request's tensors name: each input's window is checked
 * against its region and its rows pointed into it; each output's window is
 * checked (and again when it is written). *copy_bytes gets the bytes the
 * inputs will copy into the arena. 0, or -1 after rejecting. */
int gw_v2_shm_resolve(gw_infer_t *req, gw_v2_state_t *st, size_t *copy_bytes)
{
    gw_oip_request_t *p = &st->parsed;
    char path[64], why[512];
    *copy_bytes = 0;
    for (int i = 0; i < st->desc.ninputs; i++) {
        gw_oip_input_t *in = &p->inputs[i];
        if (in->shm.region[0] == '\0')
            continue;
        snprintf(path, sizeof(path), "inputs[%d].parameters.shared_memory_region", in->position);
        gw_shm_region_t *r = v2_region(req, st, in->shm.region, path);
        if (r == NULL)
            return -1;
        const uint8_t *data = gw_shm_span(r, in->shm.offset, in->shm.byte_size, why, sizeof(why));
        if (data == NULL) {
            gw_infer_reject(req, SQ_BAD_REQUEST, "%s: %s", path, why);
            return -1;
        }
        int rc = gw_oip_input_set_bytes(p, &st->desc, i, data, (size_t)in->shm.byte_size, why,
                                        sizeof(why));
        if (rc != 0) {
            gw_infer_reject(req, rc, "%s", why);
            return -1;
        }
        *copy_bytes += (size_t)in->shm.byte_size;
    }
    for (int i = 0; i < p->noutputs; i++) {
        const gw_oip_output_req_t *o = &p->outputs[i];
        if (o->shm.region[0] == '\0')
            continue;
        snprintf(path, sizeof(path), "outputs[%d].parameters.shared_memory_region", i);
        gw_shm_region_t *r = v2_region(req, st, o->shm.region, path);
        if (r == NULL)
            return -1;
        if (gw_shm_span(r, o->shm.offset, o->shm.byte_size, why, sizeof(why)) == NULL) {
            gw_infer_reject(req, SQ_BAD_REQUEST, "%s: %s", path, why);
            return -1;
        }
        st->out_region[i] = r;
    }
    return 0;
}
