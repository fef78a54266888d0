/* An inference request's answer, the parts both APIs share (infer_int.h):
 * its timing, the headers every answer carries (id, SLO, lateness, the
 * cap's warning), a failure's answer saying what SLO would work, and a
 * classifier's top-k (also a pipeline stage's, query.c). */
#include "gw_dispatch.h"
#include "infer_int.h"

#include <math.h>
#include <stdlib.h>

gw_infer_timing_t gw_infer_timing(const gw_infer_t *req)
{
    gw_infer_timing_t t = {0};
    int64_t now = sq_now_us();
    for (int i = 0; i < req->n_items; i++) {
        const gw_item_t *it = &req->items[i];
        double pre = (double)(it->times.ready_us - req->arrival_us) / 1000.0;
        double q = (double)(it->times.sent_us - it->times.ready_us) / 1000.0;
        double ex = (double)(it->times.done_us - it->times.sent_us) / 1000.0;
        t.preprocess_ms = pre > t.preprocess_ms ? pre : t.preprocess_ms;
        t.queue_ms = q > t.queue_ms ? q : t.queue_ms;
        t.execute_ms = ex > t.execute_ms ? ex : t.execute_ms;
        t.batch_size = it->times.batch_size > t.batch_size ? it->times.batch_size : t.batch_size;
    }
    t.total_ms = (double)(now - req->arrival_us) / 1000.0;
    return t;
}

/* Headers of every inference answer: its id, the SLO it was served under,
 * and a warning when --max-request-ms cut the one asked for. */
void gw_infer_answer_headers(gw_infer_t *req, h2o_req_t *hreq)
{
    char v[160];
    gw_add_header(hreq, "x-request-id", req->request_id);
    gw_add_header(hreq, "x-slo-source", req->slo_source ? req->slo_source : "none");
    if (!(req->slo_ms > 0)) {
        gw_add_header(hreq, "x-slo-ms", "none"); /* best effort */
    } else {
        snprintf(v, sizeof(v), "%g", req->slo_ms);
        gw_add_header(hreq, "x-slo-ms", v);
        /* Late: by how much, on the answer itself (not only in /metrics). */
        double late = (double)(sq_now_us() - req->arrival_us) / 1000.0 - req->slo_ms;
        if (late > 0) {
            snprintf(v, sizeof(v), "%.1f", late);
            gw_add_header(hreq, "x-slo-late-ms", v);
        }
    }
    if (req->slo_asked_ms > 0) {
        snprintf(v, sizeof(v), "199 squish \"SLO of %g ms capped at %g ms (--max-request-ms)\"",
                 req->slo_asked_ms, req->slo_ms);
        gw_add_header(hreq, "warning", v);
    }
}

/* The least SLO the request can meet, in ms: its items alone on one idle
 * worker of the model's serving kind, as the dispatcher plans them
 * (gw_sched_least); 0 when unknown (no profile, no worker of its kind
 * up, no items yet). */
static double least_slo_ms(const gw_infer_t *req)
{
    gw_api_ctx_t *api = req->base.app;
    const gw_model_t *m = req->model;
    gw_least_t least;
    if (gw_sched_least(gw_api_sched(api), m, gw_sched_serving_kind(gw_api_sched(api), m),
                       req->n_items, &least) != 0)
        return 0;
    return (double)(least.run_us + least.margin_us) / 1000.0;
}

int gw_infer_failure_code(const gw_infer_t *req, double least)
{
    if (req->err != SQ_DEADLINE || !(req->slo_ms > 0) || !(least > 0))
        return req->err;
    return req->slo_ms < least ? SQ_SLO_TOO_TIGHT : SQ_DEADLINE;
}

void gw_infer_settle(gw_infer_t *req)
{
    int failed = atomic_load(&req->failed);
    /* A gone client's request was abandoned, not refused: it stays as it
     * is (nobody reads the answer, the metrics count it dropped). */
    if (failed && !req->slo_refused && failed != GW_ABANDONED_GONE && req->err == SQ_DEADLINE &&
        req->slo_ms > 0) {
        req->least_ms = least_slo_ms(req);
        req->err = gw_infer_failure_code(req, req->least_ms);
    }
    req->reply_status = failed ? sq_err_http_status(req->err) : 200;
}

/* A failed request's answer. A request refused or dropped for its deadline
 * says the SLO it had and the least one it can meet; one whose SLO is
 * below what its items take alone on an idle worker is slo_too_tight
 * (400: no retry can serve it, the client must ask for more), one missed
 * under the load is deadline (503 with Retry-After: a retry can make it). */
void gw_infer_send_failure(gw_infer_t *req, h2o_req_t *hreq)
{
    gw_infer_answer_headers(req, hreq);
    const char *detail = req->err_detail[0] ? req->err_detail : NULL;
    if (req->slo_refused) { /* gw_infer_check_feasible said it all; no retry helps */
        gw_send_error_retry(hreq, req->err, detail, 0);
        return;
    }
    if (!(req->least_ms > 0) || (req->err != SQ_DEADLINE && req->err != SQ_SLO_TOO_TIGHT)) {
        gw_send_error(hreq, req->err, detail);
        return;
    }
    char why[sizeof(req->err_detail) + 320];
    int retry = gw_infer_failure_why(req, req->least_ms, why, sizeof(why));
    gw_send_error_retry(hreq, req->err, why, retry);
}

int gw_infer_failure_why(const gw_infer_t *req, double least, char *why, size_t len)
{
    const char *detail = req->err_detail[0] ? req->err_detail : NULL;
    int hopeless = req->slo_ms < least;
    if (hopeless)
        snprintf(why, len,
                 "%s%san SLO of %g ms (%s) cannot be met for %d item%s, which take at least "
                 "%.1f ms alone on an idle worker; ask for %.0f ms or more, or for none (best "
                 "effort)",
                 detail != NULL ? detail : "", detail != NULL ? ": " : "", req->slo_ms,
                 req->slo_source ? req->slo_source : "server", req->n_items,
                 req->n_items == 1 ? "" : "s", least, ceil(least));
    else
        snprintf(why, len,
                 "%s under the current load: SLO %g ms (%s); alone on an idle worker it takes "
                 "%.1f ms, so a retry can make it, or a larger SLO, or none (best effort)",
                 detail != NULL ? detail : sq_err_msg(SQ_DEADLINE), req->slo_ms,
                 req->slo_source ? req->slo_source : "server", least);
    return !hopeless;
}

typedef struct {
    float score;
    int index;
} scored_t;

static int scored_cmp(const void *a, const void *b)
{
    const scored_t *x = a, *y = b;
    if (x->score != y->score)
        return x->score < y->score ? 1 : -1;
    return x->index - y->index;
}

/* Top-k of output 0's logits (the head of an item's row) with softmax
 * scores. */
json_t *gw_top_k_json(const gw_model_t *m, const float *row, int k)
{
    int64_t n = m->outputs[0].elems;
    float mx = -INFINITY;
    for (int64_t i = 0; i < n; i++)
        mx = row[i] > mx ? row[i] : mx;
    double sum = 0;
    for (int64_t i = 0; i < n; i++)
        sum += exp((double)(row[i] - mx));
    scored_t *best = sq_xcalloc((size_t)k, sizeof(*best));
    int nb = 0;
    for (int64_t i = 0; i < n; i++) {
        scored_t c = {.score = row[i], .index = (int)i};
        if (nb < k) {
            best[nb++] = c;
            qsort(best, (size_t)nb, sizeof(*best), scored_cmp);
        } else if (scored_cmp(&c, &best[k - 1]) < 0) {
            best[k - 1] = c;
            qsort(best, (size_t)k, sizeof(*best), scored_cmp);
        }
    }
    json_t *a = json_array();
    for (int i = 0; i < nb; i++) {
        char buf[24];
        json_array_append_new(a,
                              json_pack("{s:i, s:s, s:f}", "index", best[i].index, "label",
                                        gw_model_label(m, best[i].index, buf, sizeof(buf)), "score",
                                        sum > 0 ? exp((double)(best[i].score - mx)) / sum : 0.0));
    }
    free(best);
    return a;
}

/* ---- /v1's rows ---------------------------------------------------------- */

static double clampd(double v, double hi)
{
    return v > 0 ? (v < hi ? v : hi) : 0;
}

json_t *gw_v1_detections_json(const gw_model_t *m, const float *row, int img_w, int img_h)
{
    gw_detection_t d[GW_DETECT_MAX_CROPS];
    json_t *a = json_array();
    int n = gw_detect(&m->detector, row, m->w, m->h, img_w, img_h, d, GW_DETECT_MAX_CROPS);
    for (int i = 0; i < n; i++) {
        char buf[24];
        const char *label = gw_model_label(m, d[i].label, buf, sizeof(buf));
        json_array_append_new(
            a, json_pack("{s:[f, f, f, f], s:i, s:s, s:f}", "box", clampd(d[i].x0, img_w),
                         clampd(d[i].y0, img_h), clampd(d[i].x1, img_w), clampd(d[i].y1, img_h),
                         "index", d[i].label, "label", label, "score", (double)d[i].score));
    }
    return a;
}

json_t *gw_v1_segments_json(const gw_model_t *m, const float *row)
{
    const gw_output_t *o = &m->outputs[0];
    int64_t c = o->dims[1], plane = o->dims[2] * o->dims[3];
    json_t *a = json_array();
    if (c < 1 || plane < 1)
        return a;
    int64_t *count = sq_xcalloc((size_t)c, sizeof(*count));
    /* argmax over the classes per pixel (ties: the lower class) */
    for (int64_t p = 0; p < plane; p++) {
        int64_t best = 0;
        float bv = row[p];
        for (int64_t k = 1; k < c; k++) {
            float v = row[k * plane + p];
            if (v > bv || bv != bv)
                bv = v, best = k;
        }
        count[best]++;
    }
    /* by share, then class */
    for (;;) {
        int64_t top = -1;
        for (int64_t k = 0; k < c; k++) {
            if (count[k] > 0 && (top < 0 || count[k] > count[top]))
                top = k;
        }
        if (top < 0)
            break;
        char buf[24];
        json_array_append_new(a, json_pack("{s:I, s:s, s:f}", "index", (json_int_t)top, "label",
                                           gw_model_label(m, top, buf, sizeof(buf)), "share",
                                           (double)count[top] / (double)plane));
        count[top] = 0;
    }
    free(count);
    return a;
}

/* A classifier's top-k "predictions", a detector's "detections" or a
 * segmenter's "segments", one list per image. */
json_t *gw_v1_rows(const gw_infer_t *req)
{
    const gw_model_t *m = req->model;
    json_t *rows = json_array();
    for (int i = 0; i < req->n_items; i++) {
        const float *row = req->outputs + (size_t)i * (size_t)m->out_elems;
        const gw_image_info_t *info = &req->preps[i].info;
        json_array_append_new(rows, m->has_detector
                                        ? gw_v1_detections_json(m, row, info->width, info->height)
                                    : m->segmenter ? gw_v1_segments_json(m, row)
                                                   : gw_top_k_json(m, row, req->top_k));
    }
    return rows;
}

/* A segmenter's summary is an argmax over every pixel of every image
 * (21 classes x 520 x 520 floats an image for torchvision's): built on
 * the offload thread, not the HTTP loop (gw_infer_t.finish). */
void gw_v1_rows_off_loop(gw_infer_t *req)
{
    req->answer_rows = gw_v1_rows(req);
}
