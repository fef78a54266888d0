/* POST /v2/models/{m}[/versions/{v}]/infer: KServe v2 / Open Inference
 * Protocol, JSON or Triton binary. The model's description is built for the
 * codec, the body parsed (on the offload thread when large), the tensors
 * located (in the body, or in registered shared memory: infer_v2_shm.c),
 * and one item per batch row started: JPEG bytes to the preprocess pool,
 * tensor rows copied into the arena here (or on the offload thread for
 * large tensors). The answer is encoded on the loop thread when the last
 * item finishes. */
#include "infer_int.h"

#include <stdlib.h>
#include <string.h>

/* JSON above this (a whole JSON body, or the JSON header of a binary
 * one) is parsed on the offload thread, not the loop. */
#define INLINE_PARSE_BYTES (256u << 10)
/* Tensors above this (in the body or in shared memory) are copied into the
 * arena on the offload thread, not the loop: memcpy moves some GB/s, so 4
 * MiB take about what parsing INLINE_PARSE_BYTES of JSON does. Below it,
 * the hop to the offload thread (a wake-up there, and its own wake-up of
 * the dispatcher) costs more than the copy. */
#define INLINE_COPY_BYTES (4u << 20)

/* The request's end: after gw_infer_dispose (whose trace line names the
 * body's "id", held by the parsed request), its state. */
void gw_v2_dispose(gw_async_t *a)
{
    gw_infer_t *req = (gw_infer_t *)a;
    gw_infer_dispose(a);
    gw_v2_state_t *st = req->api_state;
    if (st != NULL) {
        gw_oip_request_dispose(&st->parsed);
        for (int i = 0; i < st->nregions; i++)
            gw_shm_release(st->regions[i]);
        free(st);
    }
}

float *gw_v2_gather_outputs(const gw_model_t *m, int n_items, const float *rows,
                            const float **outputs)
{
    /* Output i's slice of a row starts after outputs 0..i-1. */
    if (m->noutputs == 1) {
        outputs[0] = rows;
        return NULL;
    }
    float *gathered = sq_xmalloc((size_t)n_items * (size_t)m->out_elems * sizeof(float) + 1);
    size_t at = 0;
    for (int o = 0; o < m->noutputs; o++) {
        size_t per = (size_t)m->outputs[o].elems;
        float *dst = gathered + at * (size_t)n_items;
        for (int i = 0; i < n_items; i++)
            memcpy(dst + (size_t)i * per, rows + (size_t)i * (size_t)m->out_elems + at,
                   per * sizeof(float));
        outputs[o] = dst;
        at += per;
    }
    return gathered;
}

static void answer_v2(gw_infer_t *req, h2o_req_t *hreq);

static void respond_v2(gw_async_t *a, h2o_req_t *hreq)
{
    gw_infer_t *req = (gw_infer_t *)a;
    gw_infer_settle(req);
    answer_v2(req, hreq);
    req->reply_us = sq_now_us();
}

int gw_v2_encode(gw_infer_t *req, sq_buf_t *out, long long *header_len, char *why, size_t len)
{
    gw_v2_state_t *st = req->api_state;
    gw_model_t *m = req->model;
    gw_infer_timing_t t = gw_infer_timing(req);
    /* The SLO it was served under, and how late it is (0: in time); its
     * source is the x-slo-source header. */
    double late_ms = req->slo_ms > 0 && t.total_ms > req->slo_ms ? t.total_ms - req->slo_ms : 0;
    const char *source = req->slo_source ? req->slo_source : "none";
    gw_oip_param_t params[8] = {
        {"queue_ms", t.queue_ms, NULL},     {"preprocess_ms", t.preprocess_ms, NULL},
        {"execute_ms", t.execute_ms, NULL}, {"total_ms", t.total_ms, NULL},
        {"batch_size", t.batch_size, NULL}, {"slo_source", 0, source},
        {"slo_ms", req->slo_ms, NULL},      {"late_ms", late_ms, NULL}};
    int nparams = req->slo_ms > 0 ? 8 : 6; /* best effort: no SLO to be late for */
    size_t nlabels = json_array_size(m->labels);
    const char **labels = sq_xcalloc(nlabels + 1, sizeof(*labels));
    for (size_t i = 0; i < nlabels; i++)
        labels[i] = json_string_value(json_array_get(m->labels, i));
    const float *outputs[GW_OIP_MAX_OUTPUTS] = {0};
    float *gathered = gw_v2_gather_outputs(m, req->n_items, req->outputs, outputs);
    int rc = gw_v2_write_shm_outputs(req, outputs, why, len);
    if (rc == 0) {
        gw_oip_response_t resp = {.model_name = m->name,
                                  .model_version = st->version,
                                  .model = &st->desc,
                                  .request = &st->parsed,
                                  .outputs = outputs,
                                  .labels = labels,
                                  .nlabels = (int)nlabels,
                                  .params = params,
                                  .nparams = nparams};
        *header_len = -1;
        if (gw_oip_response_encode(&resp, out, header_len) != 0) {
            snprintf(why, len, "cannot encode the response");
            rc = SQ_INTERNAL;
        }
    }
    free(labels);
    free(gathered);
    return rc;
}

static void answer_v2(gw_infer_t *req, h2o_req_t *hreq)
{
    gw_metrics_infer_answered(req);
    if (atomic_load(&req->failed)) {
        gw_infer_send_failure(req, hreq);
        return;
    }
    sq_buf_t out;
    sq_buf_init(&out);
    long long header_len = -1;
    char why[640];
    int rc = gw_v2_encode(req, &out, &header_len, why, sizeof(why));
    gw_infer_answer_headers(req, hreq);
    if (rc != 0) {
        sq_buf_dispose(&out);
        req->reply_status = sq_err_http_status(rc);
        gw_send_error(hreq, rc, why);
        return;
    }
    hreq->res.status = 200;
    hreq->res.reason = gw_http_reason(200);
    if (header_len >= 0) {
        char hl[24];
        snprintf(hl, sizeof(hl), "%lld", header_len);
        gw_add_header(hreq, "inference-header-content-length", hl);
        gw_add_header(hreq, "content-type", "application/octet-stream");
    } else {
        gw_add_header(hreq, "content-type", "application/json");
    }
    gw_send_body(hreq, out.data, out.len);
    sq_buf_dispose(&out);
}

/* Splits the parsed request into its items and starts them. */
static void v2_items(gw_infer_t *req)
{
    gw_api_ctx_t *api = req->base.app;
    gw_v2_state_t *st = req->api_state;
    int n = st->parsed.batch;
    if (gw_infer_alloc_items(req, n) != 0) {
        gw_infer_reject(req, SQ_OVERLOAD, "not enough memory for a batch of %d; retry shortly", n);
        return;
    }
    const gw_oip_input_t *in = &st->parsed.inputs[0];
    for (int i = 0; i < n; i++) {
        const gw_oip_row_t *row = &in->rows[i];
        if (in->datatype == GW_OIP_BYTES)
            gw_infer_start_jpeg(api, &req->items[i], row->data, row->len);
        else
            gw_infer_start_tensor(api, &req->items[i], row->data, row->len,
                                  in->datatype == GW_OIP_UINT8);
    }
}

static void v2_items_offloaded(void *arg)
{
    v2_items(arg);
}

void gw_v2_start(gw_infer_t *req, int on_loop)
{
    gw_api_ctx_t *api = req->base.app;
    gw_v2_state_t *st = req->api_state;
    char err[512];
    int rc = gw_oip_request_parse(req->body, req->body_len, st->header_len, &st->desc, &st->parsed,
                                  err, sizeof(err));
    if (rc != 0) {
        gw_infer_reject(req, rc, "%s", err);
        return;
    }
    if (st->parsed.id == NULL)
        gw_oip_request_set_id(&st->parsed, req->request_id, strlen(req->request_id));
    else
        req->oip_id = st->parsed.id;
    /* parameters.slo_ms, then X-SLO-Ms (or ?slo_ms=), then Triton's
     * parameters.timeout, then the model's default. */
    double slo = st->parsed.slo_ms;
    if (st->header_slo_ms > 0 && (!(slo > 0) || st->parsed.slo_is_timeout))
        slo = st->header_slo_ms;
    else
        req->slo_from_timeout = st->parsed.slo_is_timeout;
    gw_infer_set_deadline(req, slo, &api->cfg);
    /* parameters.priority (0 is Triton's "the default"), then X-Priority. */
    req->priority =
        gw_priority_level(st->parsed.priority > 0 ? st->parsed.priority : st->header_priority);
    if (gw_infer_check_feasible(req) != 0)
        return;
    size_t copy_bytes;
    if (gw_v2_shm_resolve(req, st, &copy_bytes) != 0)
        return;
    const gw_oip_input_t *in = &st->parsed.inputs[0];
    if (in->shm.region[0] == '\0' && in->datatype != GW_OIP_BYTES)
        for (int i = 0; i < st->parsed.batch; i++)
            copy_bytes += in->rows[i].len;
    if (on_loop && copy_bytes > INLINE_COPY_BYTES)
        gw_offload(api->offload, v2_items_offloaded, req);
    else
        v2_items(req);
}

static void v2_start_offloaded(void *arg)
{
    gw_v2_start(arg, 0);
}

void gw_v2_model_desc(const gw_model_t *m, const gw_api_config_t *cfg, gw_oip_model_t *d)
{
    d->ninputs = 1;
    gw_oip_input_desc_t *in = &d->inputs[0];
    snprintf(in->name, sizeof(in->name), "%s", m->input_name);
    in->datatype = m->input_uint8 ? GW_OIP_UINT8 : GW_OIP_FP32;
    /* FP32 models also take UINT8 tensors (converted by the worker). */
    in->accept = (1u << GW_OIP_FP32) | (1u << GW_OIP_UINT8) | (1u << GW_OIP_BYTES);
    in->item_ndim = 3;
    in->item_shape[0] = m->nhwc ? m->h : m->c;
    in->item_shape[1] = m->nhwc ? m->w : m->h;
    in->item_shape[2] = m->nhwc ? m->c : m->w;
    /* Every output of the graph, in its order, with its dims after the
     * batch (the items' rows hold them one after the other). */
    d->noutputs = m->noutputs;
    for (int i = 0; i < m->noutputs; i++) {
        const gw_output_t *o = &m->outputs[i];
        gw_oip_output_desc_t *od = &d->outputs[i];
        snprintf(od->name, sizeof(od->name), "%s", o->name);
        od->item_ndim = 0;
        for (int k = 1; k < o->ndims && od->item_ndim < GW_OIP_MAX_DIMS; k++)
            od->item_shape[od->item_ndim++] = o->dims[k];
        if (od->item_ndim == 0) /* [N]: one value per item */
            od->item_shape[od->item_ndim++] = 1;
    }
    d->max_batch = cfg->max_images;
    d->max_body_bytes = (size_t)cfg->max_body_bytes;
    d->shared_memory = 1;
}

void gw_route_infer_v2(gw_call_t *call)
{
    gw_api_ctx_t *api = call->app;
    h2o_req_t *hreq = call->req;
    gw_infer_t *req = gw_infer_new(call, GW_API_V2);
    if (req == NULL)
        return;
    req->base.respond = respond_v2;
    gw_model_t *m = req->model;
    gw_v2_state_t *st = sq_xcalloc(1, sizeof(*st));
    req->api_state = st;
    req->base.dispose = gw_v2_dispose;
    snprintf(st->version, sizeof(st->version), "%d", m->version);
    if (gw_infer_request_slo(req, hreq, &st->header_slo_ms) != 0 ||
        gw_infer_request_priority(req, hreq, &st->header_priority) != 0)
        return;
    gw_v2_model_desc(m, &api->cfg, &st->desc);
    st->header_len = -1;
    h2o_iovec_t hl = gw_header(hreq, "inference-header-content-length");
    if (hl.len > 0) {
        char buf[24];
        snprintf(buf, sizeof(buf), "%.*s", (int)(hl.len < 23 ? hl.len : 23), hl.base);
        char *end;
        long long v = strtoll(buf, &end, 10);
        if (*end != '\0' || v < 0 || (size_t)v > hreq->entity.len) {
            gw_infer_reject(req, SQ_BAD_REQUEST, "Inference-Header-Content-Length: expected 0..%zu",
                            hreq->entity.len);
            return;
        }
        st->header_len = v;
    }
    gw_infer_set_deadline(req, -1, &api->cfg);
    if (gw_infer_take_body(req, hreq) != 0)
        return;
    if (st->header_len < 0 && gw_infer_is_jpeg(req->body, req->body_len)) {
        gw_infer_reject(
            req, SQ_MEDIA_TYPE,
            "the body is a JPEG image, not an inference request: POST it to "
            "/v1/models/%s/infer (Content-Type: image/jpeg), or send it here as a BYTES input "
            "with the binary data extension (Inference-Header-Content-Length)",
            m->name);
        return;
    }
    /* What the parse reads is the JSON: the binary tensors after it are
     * only pointed at (and copied by v2_items, on the loop up to
     * INLINE_COPY_BYTES). */
    size_t json_bytes = st->header_len >= 0 ? (size_t)st->header_len : req->body_len;
    if (json_bytes > INLINE_PARSE_BYTES)
        gw_offload(api->offload, v2_start_offloaded, req);
    else
        gw_v2_start(req, 1);
}
