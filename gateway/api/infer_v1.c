/* POST /v1/models/{m}[/versions/{v}]/infer: raw JPEG or multipart images,
 * a classifier's top-k JSON answer (a detector's detections, a segmenter's
 * class-map summary). The body is checked (a JPEG, not a
 * common slip), split into one item per image and started (infer_item.c);
 * the answer is built on the loop thread when the last item finishes. */
#include "infer_int.h"

#include <math.h>
#include <strings.h>
#include <stdlib.h>
#include <string.h>

static void answer_v1(gw_infer_t *req, h2o_req_t *hreq);

static void respond_v1(gw_async_t *a, h2o_req_t *hreq)
{
    gw_infer_t *req = (gw_infer_t *)a;
    gw_infer_settle(req);
    answer_v1(req, hreq);
    req->reply_us = sq_now_us();
}

static void answer_v1(gw_infer_t *req, h2o_req_t *hreq)
{
    gw_metrics_infer_answered(req);
    if (atomic_load(&req->failed)) {
        gw_infer_send_failure(req, hreq);
        return;
    }
    gw_model_t *m = req->model;
    json_t *preds = req->answer_rows != NULL ? req->answer_rows : gw_v1_rows(req);
    req->answer_rows = NULL;
    gw_infer_timing_t t = gw_infer_timing(req);
    gw_infer_answer_headers(req, hreq);
    gw_send_json(hreq, 200,
                 json_pack("{s:s, s:i, s:s, s:o, s:i, s:{s:f, s:f, s:f, s:f}}", "model", m->name,
                           "version", m->version, "id", req->request_id,
                           m->has_detector ? "detections"
                           : m->segmenter  ? "segments"
                                           : "predictions",
                           preds, "batch_size", t.batch_size, "timing_ms", "queue", t.queue_ms,
                           "preprocess", t.preprocess_ms, "execute", t.execute_ms, "total",
                           t.total_ms));
}

static int ct_is(h2o_iovec_t ct, const char *type)
{
    size_t n = strlen(type);
    return ct.len >= n && strncasecmp(ct.base, type, n) == 0 &&
           (ct.len == n || ct.base[n] == ';' || ct.base[n] == ' ');
}

int gw_v1_body_slip(const uint8_t *b, size_t n, h2o_iovec_t ct, const char *model, char *why,
                    size_t len)
{
    size_t i = 0;
    while (i < n && (b[i] == ' ' || b[i] == '\t' || b[i] == '\r' || b[i] == '\n'))
        i++;
    if (ct_is(ct, "application/json") && gw_infer_is_jpeg(b, n)) {
        snprintf(why, len,
                 "the body is a JPEG but Content-Type says application/json: send "
                 "Content-Type: image/jpeg");
        return SQ_MEDIA_TYPE;
    }
    if (i < n && (b[i] == '{' || b[i] == '[') &&
        (ct_is(ct, "application/json") || !gw_infer_is_jpeg(b, n))) {
        snprintf(why, len,
                 "this route takes images (image/jpeg, or multipart/form-data of JPEGs); JSON "
                 "inference requests (the Open Inference Protocol) go to POST "
                 "/v2/models/%s/infer",
                 model);
        return SQ_MEDIA_TYPE;
    }
    if (ct_is(ct, "application/x-www-form-urlencoded") && n >= 4096 && memchr(b, '\n', n) == NULL &&
        memchr(b, '\r', n) == NULL) {
        snprintf(why, len,
                 "the body has no CR or LF byte, as `curl -d @file` leaves a file (it strips them "
                 "and sends the rest form-encoded): send the image unchanged with `curl "
                 "--data-binary @photo.jpg -H 'Content-Type: image/jpeg'`");
        return SQ_MEDIA_TYPE;
    }
    return 0;
}

int gw_v1_scores_why(const gw_model_t *cm, char *why, size_t len)
{
    if (cm->has_detector || cm->segmenter)
        return 0;
    if (!(cm->det_slots > 0 || cm->noutputs < 1 || cm->outputs[0].ndims != 2))
        return 0;
    char shape[96] = "";
    for (int d = 0; cm->noutputs > 0 && d < cm->outputs[0].ndims; d++)
        snprintf(shape + strlen(shape), sizeof(shape) - strlen(shape), "%s%lld", d ? ", " : "",
                 (long long)cm->outputs[0].dims[d]);
    snprintf(why, len,
             "model %s has no class scores (output 0 '%s' is [%s]%s): /v1 answers a "
             "classifier's top-k labels; POST /v2/models/%s/infer for its outputs%s",
             cm->name, cm->output_name, shape, cm->det_slots > 0 ? ", a detector's boxes" : "",
             cm->name,
             cm->emulated ? ""
                          : " (or give its upload config a \"detector\" block or \"segmenter\": "
                            "true)");
    return SQ_BAD_REQUEST;
}

void gw_route_infer_v1(gw_call_t *call)
{
    gw_api_ctx_t *api = call->app;
    h2o_req_t *hreq = call->req;
    gw_infer_t *req = gw_infer_new(call, GW_API_V1);
    if (req == NULL)
        return;
    req->base.respond = respond_v1;
    if (req->model->segmenter)
        req->finish = gw_v1_rows_off_loop;
    /* /v1 answers a classifier's top-k labels: output 0 is [N, K] class
     * scores. A detector's boxes ranked as classes would be meaningless
     * "predictions": it is sent to /v2 for its outputs instead. */
    char refused[512];
    int refuse = gw_v1_scores_why(req->model, refused, sizeof(refused));
    if (refuse != 0) {
        gw_infer_reject(req, refuse, "%s", refused);
        return;
    }
    char buf[64];
    double slo = -1;
    if (gw_infer_request_slo(req, hreq, &slo) != 0)
        return;
    gw_infer_set_deadline(req, slo, &api->cfg);
    int64_t priority;
    if (gw_infer_request_priority(req, hreq, &priority) != 0)
        return;
    req->priority = gw_priority_level(priority);
    /* top-k ranks output 0's values (a classifier's classes); a detector
     * and a segmenter answer every detection or class */
    int64_t classes = req->model->outputs[0].elems;
    if (!req->model->has_detector && !req->model->segmenter &&
        gw_query_param(hreq, "top_k", buf, sizeof(buf))) {
        double k;
        if (gw_infer_parse_positive(buf, &k) != 0 || k != floor(k) || k > classes) {
            gw_infer_reject(req, SQ_BAD_REQUEST, "top_k: expected an integer in 1..%lld",
                            (long long)classes);
            return;
        }
        req->top_k = (int)k;
    }
    if (req->top_k > classes)
        req->top_k = (int)classes;
    if (hreq->entity.len == 0) {
        gw_infer_reject(req, SQ_BAD_IMAGE,
                        "empty body: send a JPEG (image/jpeg) or multipart images");
        return;
    }
    h2o_iovec_t ct = gw_header(hreq, "content-type");
    if (gw_infer_take_body(req, hreq) != 0)
        return;
    char boundary[GW_MULTIPART_MAX_BOUNDARY + 1];
    if (ct.len >= 9 && strncasecmp(ct.base, "multipart", 9) == 0) {
        int rc = gw_multipart_boundary(ct.base, ct.len, boundary, sizeof(boundary));
        if (rc != 0) {
            gw_infer_reject(req, rc, "multipart/form-data with a valid boundary expected");
            return;
        }
        int max = api->cfg.max_images;
        gw_part_t *parts = sq_xcalloc((size_t)max, sizeof(*parts));
        int n = 0;
        char err[256];
        rc = gw_multipart_parse(req->body, req->body_len, boundary, parts, max, &n, err,
                                sizeof(err));
        if (rc == 0 && n == 0) {
            rc = SQ_BAD_MULTIPART;
            snprintf(err, sizeof(err), "no image parts");
        }
        if (rc != 0) {
            free(parts);
            if (rc == SQ_TOO_LARGE)
                gw_infer_reject(req, rc, "more than %d images in one request", max);
            else
                gw_infer_reject(req, rc, "%s", err);
            return;
        }
        if (gw_infer_check_feasible(req) != 0) {
            free(parts);
            return;
        }
        if (gw_infer_alloc_items(req, n) != 0) {
            free(parts);
            gw_infer_reject(req, SQ_OVERLOAD, "not enough memory for %d images; retry shortly", n);
            return;
        }
        for (int i = 0; i < n; i++)
            gw_infer_start_jpeg(api, &req->items[i], parts[i].data, parts[i].len);
        free(parts);
        return;
    }
    /* Any other content type is one image: the decoder sniffs the format
     * (curl --data-binary sends application/x-www-form-urlencoded). Not a
     * JPEG: 415 before anything else, however large. */
    refuse =
        gw_v1_body_slip(req->body, req->body_len, ct, req->model->name, refused, sizeof(refused));
    if (refuse != 0) {
        gw_infer_reject(req, refuse, "%s", refused);
        return;
    }
    char why[160];
    int rc = gw_image_type_check(req->body, req->body_len, why, sizeof(why));
    if (rc != 0) {
        gw_infer_reject(req, rc, "%s", why);
        return;
    }
    if (gw_infer_check_feasible(req) != 0)
        return;
    if (gw_infer_alloc_items(req, 1) != 0) {
        gw_infer_reject(req, SQ_OVERLOAD, "not enough memory for this request; retry shortly");
        return;
    }
    gw_infer_start_jpeg(api, &req->items[0], req->body, req->body_len);
}
