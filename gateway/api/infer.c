/* Inference routes: POST /v1/models/{m}[/versions/{v}]/infer (raw JPEG or
 * multipart images, top-k JSON answer) and POST /v2/models/{m}[/versions/
 * {v}]/infer (KServe v2 / Open Inference Protocol, JSON or Triton binary).
 *
 * The loop thread validates, stamps arrival and deadline, copies the body,
 * and splits the request into items: JPEG items go to the preprocess pool,
 * tensor rows are copied into the arena here (or on the offload thread for
 * large JSON or large tensors); every item then goes to the dispatch thread. The reply is
 * built back on the loop thread when the last item finishes. A /v2 tensor
 * in a registered shared-memory region (Triton's extension, shm_int.h) is
 * copied from the region into the arena the same way, with no body to
 * read, and an output asked for in one is written there by the reply. */
#include "gw_dispatch.h"
#include "api_int.h"
#include "shm_int.h"
#include "trace_int.h"
#include "gw_codec.h"
#include "gw_http.h"

#include <pl_loop.h>

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <strings.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#define DEFAULT_TOP_K 5
/* JSON above this (a whole JSON body, or the JSON header of a binary
 * one) is parsed on the offload thread, not the loop. */
#define INLINE_PARSE_BYTES (256u << 10)
/* Tensors above this (in the body or in shared memory) are copied into the
 * arena on the offload thread, not the loop: memcpy moves some GB/s, so 4
 * MiB take about what parsing INLINE_PARSE_BYTES of JSON does. Below it,
 * the hop to the offload thread (a wake-up there, and its own wake-up of
 * the dispatcher) costs more than the copy. */
#define INLINE_COPY_BYTES (4u << 20)

static atomic_uint_fast64_t request_counter;
/* A random prefix per squishd run, so ids do not repeat across restarts;
 * set once, before any HTTP thread reads it. */
static uint64_t request_prefix;
static pthread_once_t request_prefix_once = PTHREAD_ONCE_INIT;

static void init_request_prefix(void)
{
    uint64_t r = 0;
    if (getrandom(&r, sizeof(r), GRND_NONBLOCK) != sizeof(r))
        r = (uint64_t)sq_now_ns();
    request_prefix = r | 1;
}

static void make_request_id(char *out, size_t len)
{
    pthread_once(&request_prefix_once, init_request_prefix);
    snprintf(out, len, "%08llx-%llu", (unsigned long long)(request_prefix & 0xffffffffu),
             (unsigned long long)atomic_fetch_add(&request_counter, 1));
}

/* ---- items ---------------------------------------------------------------- */

void gw_item_finish(gw_item_t *item, int rc, const char *detail)
{
    gw_infer_t *req = item->owner.req;
    if (rc != 0) {
        int expected = 0;
        if (atomic_compare_exchange_strong(&req->failed, &expected, GW_ABANDONED_FAILED)) {
            req->err = rc;
            if (req->n_items > 1)
                snprintf(req->err_detail, sizeof(req->err_detail), "image %d: %s",
                         item->owner.index, detail ? detail : sq_err_msg(rc));
            else
                snprintf(req->err_detail, sizeof(req->err_detail), "%s",
                         detail ? detail : sq_err_msg(rc));
            /* Its other items still queued are taken out (refused means
             * withdrawn); the last one pending need not be looked for. */
            if (req->n_items > 1 && atomic_load(&req->pending) > 1)
                gw_sched_withdraw(req->base.srv->sched);
        }
    }
    if (atomic_fetch_sub(&req->pending, 1) == 1)
        gw_async_done(&req->base);
}

/* Answers an item that never reached the dispatcher (any thread). */
static void item_answer_early(gw_server_t *srv, gw_item_t *item, int rc, const char *detail)
{
    if (item->input.in_off >= 0) {
        sq_shm_release(srv->arena, item->input.in_off);
        item->input.in_off = -1;
    }
    gw_item_finish(item, rc, detail);
}

/* The request's ready items, once its last item settled (chain, linked
 * through clump_next): to the dispatcher together, one arrival; or, when
 * another item failed meanwhile, answered at once (the request fails
 * anyway). Touches nothing of the request after the last answer. */
static void hand_over(gw_server_t *srv, gw_item_t *chain)
{
    if (chain == NULL)
        return;
    if (!atomic_load(&chain->owner.req->failed)) {
        gw_sched_submit(srv->sched, chain);
        return;
    }
    for (gw_item_t *it = chain, *next; it != NULL; it = next) {
        next = it->owner.clump_next;
        it->owner.clump_next = NULL;
        item_answer_early(srv, it, SQ_OVERLOAD, NULL);
    }
}

/* Item is ready: it waits for the request's other items (gw_clump_t), and
 * the last to settle hands them all over, with what the dispatcher needs
 * to know of each. */
static void submit(gw_server_t *srv, gw_item_t *item)
{
    gw_infer_t *req = item->owner.req;
    item->ask.model = req->model;
    /* Best effort is planned at PL_LOOP_BEST_EFFORT_MS (gw_item_t). */
    item->ask.best_effort = !(req->slo_ms > 0);
    item->ask.slo_ms = item->ask.best_effort ? PL_LOOP_BEST_EFFORT_MS : req->slo_ms;
    item->ask.priority = (uint8_t)req->priority;
    item->ask.arrival_us = req->arrival_us;
    item->ask.deadline_us = req->deadline_us;
    item->owner.out = req->outputs + (size_t)item->owner.index * (size_t)req->model->out_elems;
    item->owner.finish = gw_item_finish;
    /* Refused or abandoned means withdrawn: once one of its items failed
     * (the request answers that error) or its client went away
     * (infer_gone), the others still queued run no batch. */
    if (item->owner.abandoned == NULL)
        item->owner.abandoned = &req->failed;
    hand_over(srv, gw_clump_settle(&req->clump, item));
}

/* Fails an item that never reached the dispatcher (any thread). Settled
 * first: while the items it completes the clump with are unanswered, the
 * request stays alive for their hand-over. */
static void item_fail_early(gw_server_t *srv, gw_item_t *item, int rc, const char *detail)
{
    gw_item_t *chain = gw_clump_settle(&item->owner.req->clump, NULL);
    item_answer_early(srv, item, rc, detail);
    hand_over(srv, chain);
}

static void on_prep_done(gw_prep_job_t *job, int rc)
{
    gw_item_t *item = job->user;
    gw_server_t *srv = item->owner.req->base.srv;
    if (rc != 0) {
        item_fail_early(srv, item, rc, job->err[0] ? job->err : NULL);
        return;
    }
    /* Another image of the request failed (shed, bad): it is answered with
     * that error as soon as its items are done, so this one need not wait
     * for a batch. */
    if (atomic_load(&item->owner.req->failed)) {
        item_fail_early(srv, item, SQ_OVERLOAD, NULL);
        return;
    }
    submit(srv, item);
}

/* Allocates the item's arena slot; 0 or SQ_OVERLOAD. */
static int item_slot(gw_server_t *srv, gw_item_t *item, size_t bytes)
{
    int64_t off = sq_shm_alloc(srv->arena, bytes);
    if (off < 0)
        return SQ_OVERLOAD;
    item->input.in_off = off;
    return 0;
}

/* The latest moment a decoded image is still of use: its deadline less
 * the least that must follow (a batch of one on the serving device, and
 * the dispatch margin). Decoding it later is work for a certain drop. */
static int64_t decode_deadline_ns(gw_server_t *srv, const gw_infer_t *req)
{
    const gw_model_t *m = req->model;
    gw_least_t least;
    gw_sched_least(srv->sched, m, gw_sched_serving_kind(srv->sched, m), 1, &least);
    return (req->deadline_us - least.run_us - least.margin_us) * 1000;
}

/* Starts a JPEG item (any thread). */
static void start_jpeg(gw_server_t *srv, gw_item_t *item, const uint8_t *data, size_t len)
{
    gw_model_t *m = item->owner.req->model;
    item->ask.input_kind = SQ_INPUT_PIXELS;
    /* Not a JPEG: 415 at once, however large, not a wait for a decoder. */
    char why[160];
    int rc = gw_image_type_check(data, len, why, sizeof(why));
    if (rc != 0) {
        item_fail_early(srv, item, rc, why);
        return;
    }
    if (item_slot(srv, item, (size_t)m->h * (size_t)m->w * 3) != 0) {
        item_fail_early(srv, item, SQ_OVERLOAD, "no room in the shared-memory arena");
        return;
    }
    gw_prep_job_t *job = &item->owner.req->preps[item->owner.index];
    memset(job, 0, sizeof(*job));
    job->data = data;
    job->len = len;
    job->out_w = m->w;
    job->out_h = m->h;
    job->mode = m->nearest ? GW_RESIZE_NEAREST : GW_RESIZE_BILINEAR;
    job->dst = sq_shm_arena_base(srv->arena) + item->input.in_off;
    job->deadline_ns = decode_deadline_ns(srv, item->owner.req);
    job->done = on_prep_done;
    job->user = item;
    rc = gw_prep_pool_submit(srv->prep, job);
    if (rc == SQ_DEADLINE)
        item_fail_early(srv, item, rc,
                        "the image decoders cannot start this image in time for its deadline");
    else if (rc != 0)
        item_fail_early(srv, item, rc == SQ_SHUTTING_DOWN ? rc : SQ_OVERLOAD,
                        "the image decoders are saturated");
}

/* Starts a tensor item: the row is copied into the arena as is. */
static void start_tensor(gw_server_t *srv, gw_item_t *item, const uint8_t *data, size_t len,
                         int uint8)
{
    item->ask.input_kind = uint8 ? SQ_INPUT_UINT8 : SQ_INPUT_FP32;
    if (item_slot(srv, item, len) != 0) {
        item_fail_early(srv, item, SQ_OVERLOAD, "no room in the shared-memory arena");
        return;
    }
    memcpy(sq_shm_arena_base(srv->arena) + item->input.in_off, data, len);
    item->times.ready_us = sq_now_us();
    submit(srv, item);
}

/* ---- replies ---------------------------------------------------------------- */

/* A traced request's line: its moments, the first and last of its items'
 * where they differ (trace_int.h). */
static void trace_write(gw_infer_t *req)
{
    gw_trace_record_t r = {.id = req->trace_id,
                           .request_id = req->oip_id != NULL ? req->oip_id : req->request_id,
                           .model = req->model->name,
                           .version = req->model->version,
                           .status = req->reply_status,
                           .items = req->n_items};
    int64_t *at = r.at_us;
    at[GW_TRACE_RECEIVE] = req->arrival_us;
    for (int i = 0; i < req->n_items; i++) {
        const gw_item_t *it = &req->items[i];
        int64_t decode_start = req->preps[i].started_ns / 1000,
                decode_end = req->preps[i].finished_ns / 1000;
        if (decode_start > 0 && decode_end >= decode_start) {
            if (at[GW_TRACE_DECODE_START] == 0 || decode_start < at[GW_TRACE_DECODE_START])
                at[GW_TRACE_DECODE_START] = decode_start;
            if (decode_end > at[GW_TRACE_DECODE_END])
                at[GW_TRACE_DECODE_END] = decode_end;
        }
        if (it->times.ready_us > 0 &&
            (at[GW_TRACE_QUEUE] == 0 || it->times.ready_us < at[GW_TRACE_QUEUE]))
            at[GW_TRACE_QUEUE] = it->times.ready_us;
        if (it->times.sent_us > 0 &&
            (at[GW_TRACE_BATCH] == 0 || it->times.sent_us < at[GW_TRACE_BATCH]))
            at[GW_TRACE_BATCH] = it->times.sent_us;
        if (it->times.exec_start_us > 0 && (at[GW_TRACE_EXECUTE_START] == 0 ||
                                            it->times.exec_start_us < at[GW_TRACE_EXECUTE_START]))
            at[GW_TRACE_EXECUTE_START] = it->times.exec_start_us;
        if (it->times.exec_end_us > at[GW_TRACE_EXECUTE_END])
            at[GW_TRACE_EXECUTE_END] = it->times.exec_end_us;
        r.batch_size = it->times.batch_size > r.batch_size ? it->times.batch_size : r.batch_size;
    }
    at[GW_TRACE_REPLY] = req->reply_us;
    gw_trace_emit(req->base.srv->trace, &r);
}

static void infer_dispose(gw_async_t *a)
{
    gw_infer_t *req = (gw_infer_t *)a;
    atomic_fetch_sub(&a->srv->infer_inflight, 1);
    if (req->trace_id != 0)
        trace_write(req);
    if (req->api_dispose != NULL)
        req->api_dispose(req);
    gw_model_unref(req->model);
    free(req->items);
    free(req->preps);
    free(req->outputs);
    free(req->body_owned);
}

typedef struct {
    double queue_ms, preprocess_ms, execute_ms, total_ms;
    int batch_size;
} timing_t;

static timing_t timing_of(const gw_infer_t *req)
{
    timing_t t = {0};
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
static void answer_headers(gw_infer_t *req, h2o_req_t *hreq)
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
    gw_server_t *srv = req->base.srv;
    const gw_model_t *m = req->model;
    gw_least_t least;
    if (gw_sched_least(srv->sched, m, gw_sched_serving_kind(srv->sched, m), req->n_items, &least) !=
        0)
        return 0;
    return (double)(least.run_us + least.margin_us) / 1000.0;
}

/* A failed request's answer. A request refused or dropped for its deadline
 * says the SLO it had and the least one it can meet; a 503 carries
 * Retry-After only where a retry can succeed: not when its SLO is below
 * what its items take alone on an idle worker (issue 23: "Retry-After: 1"
 * on a request no retry could ever serve). */
static void send_failure(gw_infer_t *req, h2o_req_t *hreq)
{
    answer_headers(req, hreq);
    const char *detail = req->err_detail[0] ? req->err_detail : NULL;
    if (req->slo_refused) { /* check_feasible said it all; no retry helps */
        gw_send_error_retry(hreq, req->err, detail, 0);
        return;
    }
    double least = req->err == SQ_DEADLINE && req->slo_ms > 0 ? least_slo_ms(req) : 0;
    if (least <= 0) {
        gw_send_error(hreq, req->err, detail);
        return;
    }
    char why[sizeof(req->err_detail) + 320];
    const char *what = detail != NULL ? detail : sq_err_msg(req->err);
    int hopeless = req->slo_ms < least;
    if (hopeless)
        snprintf(why, sizeof(why),
                 "%s: an SLO of %g ms (%s) cannot be met for %d item%s, which take at least "
                 "%.1f ms alone on an idle worker; ask for %.0f ms or more, or for none (best "
                 "effort)",
                 what, req->slo_ms, req->slo_source ? req->slo_source : "server", req->n_items,
                 req->n_items == 1 ? "" : "s", least, ceil(least));
    else
        snprintf(why, sizeof(why),
                 "%s under the current load: SLO %g ms (%s); alone on an idle worker it takes "
                 "%.1f ms, so a retry can make it, or a larger SLO, or none (best effort)",
                 what, req->slo_ms, req->slo_source ? req->slo_source : "server", least);
    gw_send_error_retry(hreq, req->err, why, !hopeless);
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
static json_t *top_k_json(const gw_model_t *m, const float *row, int k)
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

/* The status of the answer about to be sent, for its trace (answer_v2
 * sets a failure to encode); hreq is not read once the answer is sent. */
static void status_for_trace(gw_infer_t *req)
{
    req->reply_status = atomic_load(&req->failed) ? sq_err_http_status(req->err) : 200;
}

static void answer_v1(gw_infer_t *req, h2o_req_t *hreq);

static void respond_v1(gw_async_t *a, h2o_req_t *hreq)
{
    gw_infer_t *req = (gw_infer_t *)a;
    status_for_trace(req);
    answer_v1(req, hreq);
    req->reply_us = sq_now_us();
}

static void answer_v1(gw_infer_t *req, h2o_req_t *hreq)
{
    gw_metrics_infer_answered(req);
    if (atomic_load(&req->failed)) {
        send_failure(req, hreq);
        return;
    }
    gw_model_t *m = req->model;
    json_t *preds = json_array();
    for (int i = 0; i < req->n_items; i++)
        json_array_append_new(
            preds, top_k_json(m, req->outputs + (size_t)i * (size_t)m->out_elems, req->top_k));
    timing_t t = timing_of(req);
    answer_headers(req, hreq);
    gw_send_json(hreq, 200,
                 json_pack("{s:s, s:i, s:s, s:o, s:i, s:{s:f, s:f, s:f, s:f}}", "model", m->name,
                           "version", m->version, "id", req->request_id, "predictions", preds,
                           "batch_size", t.batch_size, "timing_ms", "queue", t.queue_ms,
                           "preprocess", t.preprocess_ms, "execute", t.execute_ms, "total",
                           t.total_ms));
}

/* ---- request setup shared by both APIs ----------------------------------- */

static int parse_positive(const char *s, double *out)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end != '\0' || !(v > 0) || !isfinite(v))
        return -1;
    *out = v;
    return 0;
}

/* The client went away while the request was in squishd: its items not
 * yet in a batch are withdrawn (gw_sched_withdraw), never run. */
static void infer_gone(gw_async_t *a)
{
    gw_infer_t *req = (gw_infer_t *)a;
    int expected = 0;
    if (atomic_compare_exchange_strong(&req->failed, &expected, GW_ABANDONED_GONE)) {
        req->err = SQ_DEADLINE;
        snprintf(req->err_detail, sizeof(req->err_detail), "the client went away");
    }
    if (atomic_load(&req->pending) > 0)
        gw_sched_withdraw(a->srv->sched);
}

/* Looks the model up and builds the request; replies and returns NULL on
 * an error. */
static gw_infer_t *infer_new(gw_call_t *call, gw_api_t api)
{
    h2o_req_t *hreq = call->req;
    gw_server_t *srv = call->srv;
    if (atomic_load(&srv->stopping)) {
        gw_send_error(hreq, SQ_SHUTTING_DOWN, "squishd is shutting down");
        return NULL;
    }
    int version = 0;
    if (call->nargs > 1 && (version = gw_parse_version(call->args[1])) < 0) {
        gw_send_bad_version(call, call->args[1]);
        return NULL;
    }
    gw_model_t *m = gw_registry_find(srv->registry, call->args[0].base, call->args[0].len, version);
    if (m == NULL) {
        gw_send_not_found(call, call->args[0], version);
        return NULL;
    }
    char unserved[MDB_NAME_MAX + 256];
    if (!gw_registry_served(srv->registry, m, unserved, sizeof(unserved))) {
        gw_send_error(hreq, SQ_MODEL_NOT_FOUND, unserved);
        gw_model_unref(m);
        return NULL;
    }
    if (strcmp(m->status, "failed") == 0) {
        /* No retry helps: the operator must upload it again. */
        char why[sizeof(m->error) + MDB_NAME_MAX + 96];
        snprintf(why, sizeof(why), "model %s version %d failed: %s; upload it again to retry",
                 m->name, m->version, m->error[0] ? m->error : "it could not be measured");
        gw_metrics_infer_rejected(srv, m, SQ_MODEL_FAILED);
        gw_send_error(hreq, SQ_MODEL_FAILED, why);
        gw_model_unref(m);
        return NULL;
    }
    if (strcmp(m->status, "unloaded") == 0) {
        char why[MDB_NAME_MAX * 2 + 128];
        snprintf(why, sizeof(why),
                 "model %s is unloaded; POST /v2/repository/models/%s/load serves it again",
                 m->name, m->name);
        gw_metrics_infer_rejected(srv, m, SQ_MODEL_UNLOADED);
        gw_send_error(hreq, SQ_MODEL_UNLOADED, why);
        gw_model_unref(m);
        return NULL;
    }
    if (strcmp(m->status, "ready") != 0) {
        gw_metrics_infer_rejected(srv, m, SQ_NOT_READY);
        gw_send_error(hreq, SQ_NOT_READY, "the model is being profiled; retry shortly");
        gw_model_unref(m);
        return NULL;
    }
    if (gw_sched_serving_kind(srv->sched, m) < 0) {
        gw_metrics_infer_rejected(srv, m, SQ_NO_WORKER);
        gw_send_error(hreq, SQ_NO_WORKER, "no worker that can run this model is up");
        gw_model_unref(m);
        return NULL;
    }
    /* Admission: a request is inside squishd from here until its answer is
     * sent and its items are done (infer_dispose); past max_inflight, new
     * ones are shed at once, before any copy or decode. */
    if (atomic_fetch_add(&srv->infer_inflight, 1) >= srv->cfg->max_inflight) {
        atomic_fetch_sub(&srv->infer_inflight, 1);
        gw_metrics_infer_rejected(srv, m, SQ_OVERLOAD);
        char why[128];
        snprintf(why, sizeof(why),
                 "squishd has --max-inflight %d requests in flight; retry shortly",
                 srv->cfg->max_inflight);
        gw_send_error(hreq, SQ_OVERLOAD, why);
        gw_model_unref(m);
        return NULL;
    }
    gw_infer_t *req = (gw_infer_t *)gw_async_new(call, sizeof(gw_infer_t));
    req->base.dispose = infer_dispose;
    req->base.gone = infer_gone;
    gw_async_watch(&req->base);
    req->model = m;
    req->api = api;
    req->arrival_us = sq_now_us();
    req->top_k = DEFAULT_TOP_K;
    /* An SLO only where someone asked for one (issue 23): the model's
     * default_slo_ms, else squishd's --default-slo-ms, else none (0: best
     * effort); the request's own replaces either (set_deadline). */
    req->slo_ms = m->default_slo_ms > 0 ? m->default_slo_ms : srv->cfg->default_slo_ms;
    req->slo_source = m->default_slo_ms > 0 ? "model" : req->slo_ms > 0 ? "server" : "none";
    req->priority = GW_PRIORITY_DEFAULT;
    h2o_iovec_t rid = gw_header(hreq, "x-request-id");
    if (rid.len > 0 && rid.len < sizeof(req->request_id)) {
        memcpy(req->request_id, rid.base, rid.len);
        req->request_id[rid.len] = '\0';
    } else {
        make_request_id(req->request_id, sizeof(req->request_id));
    }
    req->trace_id = gw_trace_sample(srv->trace, m->name);
    return req;
}

/* Applies an SLO (ms; <= 0 keeps the current one), caps it and sets the
 * deadline: without an SLO (best effort), --max-request-ms's. */
static void set_deadline(gw_infer_t *req, double slo_ms, const gw_config_t *cfg)
{
    if (slo_ms > 0) {
        req->slo_ms = slo_ms;
        req->slo_source = "request";
    }
    if (req->slo_ms > cfg->max_request_ms) {
        req->slo_asked_ms = req->slo_ms;
        req->slo_ms = cfg->max_request_ms;
    }
    double life_ms = req->slo_ms > 0 ? req->slo_ms : cfg->max_request_ms;
    req->deadline_us = req->arrival_us + (int64_t)(life_ms * 1000.0);
}

/* Sizes the item and output arrays and marks every item pending; 0, or
 * SQ_OVERLOAD when memory is short (the sizes are the request's). */
static int alloc_items(gw_infer_t *req, int n)
{
    req->items = calloc((size_t)n, sizeof(gw_item_t));
    req->preps = calloc((size_t)n, sizeof(gw_prep_job_t));
    req->outputs = calloc((size_t)n * (size_t)req->model->out_elems, sizeof(float));
    if (req->items == NULL || req->preps == NULL || req->outputs == NULL)
        return SQ_OVERLOAD;
    req->n_items = n;
    atomic_store(&req->pending, n);
    gw_clump_init(&req->clump, n);
    for (int i = 0; i < n; i++) {
        req->items[i].owner.req = req;
        req->items[i].owner.index = i;
        req->items[i].input.in_off = -1;
    }
    return 0;
}

/* Replies at once with err (the request never started). */
static void reject(gw_infer_t *req, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void reject(gw_infer_t *req, int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    atomic_store(&req->failed, 1);
    req->err = err;
    vsnprintf(req->err_detail, sizeof(req->err_detail), fmt, ap);
    va_end(ap);
    gw_async_done(&req->base);
}

/* Points the request at its body (gw_request_body: in place, or a copy
 * for HTTP/2); replies 503 and returns -1 when a copy finds no memory. */
static int take_body(gw_infer_t *req, h2o_req_t *hreq)
{
    if (gw_request_body(hreq, &req->body, &req->body_len, &req->body_owned) != 0) {
        reject(req, SQ_OVERLOAD, "not enough memory to hold a body of %zu bytes; retry shortly",
               hreq->entity.len);
        return -1;
    }
    return 0;
}

/* The SLO a request's header (X-SLO-Ms) or query (?slo_ms=) asks for, in
 * *slo (-1: none); -1 after rejecting a malformed one. */
static int request_slo(gw_infer_t *req, h2o_req_t *hreq, double *slo)
{
    char buf[64];
    *slo = -1;
    h2o_iovec_t hslo = gw_header(hreq, "x-slo-ms");
    if (hslo.len > 0) {
        snprintf(buf, sizeof(buf), "%.*s", (int)(hslo.len < 63 ? hslo.len : 63), hslo.base);
        if (parse_positive(buf, slo) != 0) {
            reject(req, SQ_BAD_REQUEST, "X-SLO-Ms: expected a positive number of ms");
            return -1;
        }
    } else if (gw_query_param(hreq, "slo_ms", buf, sizeof(buf))) {
        if (parse_positive(buf, slo) != 0) {
            reject(req, SQ_BAD_REQUEST, "slo_ms: expected a positive number of ms");
            return -1;
        }
    }
    return 0;
}

/* The priority a request's header (X-Priority) or query (?priority=) asks
 * for, Triton's numbers (gw_priority_level), in *priority (-1: none); -1
 * after rejecting a malformed one. */
static int request_priority(gw_infer_t *req, h2o_req_t *hreq, int64_t *priority)
{
    char buf[64];
    const char *what = "X-Priority";
    *priority = -1;
    h2o_iovec_t h = gw_header(hreq, "x-priority");
    if (h.len > 0) {
        snprintf(buf, sizeof(buf), "%.*s", (int)(h.len < 63 ? h.len : 63), h.base);
    } else if (gw_query_param(hreq, "priority", buf, sizeof(buf))) {
        what = "priority";
    } else {
        return 0;
    }
    /* Digits only: no sign, no space, no fraction; at most INT32_MAX, as
     * OIP's parameters.priority. */
    size_t n = strlen(buf);
    int64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (buf[i] < '0' || buf[i] > '9' || v > INT32_MAX) {
            v = -1;
            break;
        }
        v = v * 10 + (buf[i] - '0');
    }
    if (n == 0 || v < 0 || v > INT32_MAX) {
        reject(req, SQ_BAD_REQUEST,
               "%s: expected an integer >= 0 (0 = the default level, 1 the highest)", what);
        return -1;
    }
    *priority = v;
    return 0;
}

/* The smallest SLO the model can meet: one request alone on its serving
 * kind, l(1) with the margin, plus the dispatch margin, as the dispatcher
 * plans it (gw_sched_least). A request asking for less is answered at
 * once, saying so (a drop by the dispatcher would only say that the
 * deadline cannot be met). Returns -1 after rejecting. */
static int check_feasible(gw_infer_t *req)
{
    gw_server_t *srv = req->base.srv;
    const gw_model_t *m = req->model;
    int kind = gw_sched_serving_kind(srv->sched, m);
    gw_least_t least_us;
    if (gw_sched_least(srv->sched, m, kind, 1, &least_us) != 0)
        return 0;
    double l1 = (double)least_us.run_us / 1000.0;
    double margin = (double)least_us.margin_us / 1000.0;
    if (!(req->slo_ms > 0) || req->slo_ms >= l1 + margin)
        return 0; /* best effort, or feasible */
    req->slo_refused = 1;
    double least = ceil(l1 + margin);
    char from[192] = "";
    /* Triton's timeout is in microseconds: a client that meant ms asked
     * for a thousandth of it. */
    if (req->slo_from_timeout)
        snprintf(from, sizeof(from),
                 " (from parameters.timeout %.0f, which is in microseconds, as Triton's: "
                 "send timeout %.0f or more, or parameters.slo_ms in ms)",
                 req->slo_ms * 1000.0, least * 1000.0);
    reject(req, SQ_DEADLINE,
           "an SLO of %g ms%s cannot be met: one request takes at least %.1f ms on %s (l(1) %.1f "
           "ms + dispatch margin %.1f ms); ask for %.0f ms or more",
           req->slo_ms, from, l1 + margin, sq_dev_kind_name((sq_dev_kind_t)kind), l1, margin,
           least);
    return -1;
}

/* ---- /v1 ---------------------------------------------------------------- */

static int is_jpeg(const uint8_t *p, size_t n)
{
    return n >= 3 && p[0] == 0xFF && p[1] == 0xD8 && p[2] == 0xFF;
}

static int ct_is(h2o_iovec_t ct, const char *type)
{
    size_t n = strlen(type);
    return ct.len >= n && strncasecmp(ct.base, type, n) == 0 &&
           (ct.len == n || ct.base[n] == ';' || ct.base[n] == ' ');
}

/* A body sent the way a common slip sends it, refused with what to send
 * instead (issue 24): a JPEG labelled as JSON, JSON sent to the image
 * route, and a file that `curl -d @photo.jpg` sent (form-encoded, with
 * every CR and LF byte taken out: a JPEG of a few KB without one is all
 * but impossible, about 1 in 10^14). 0, or -1 after rejecting. */
static int v1_body_slip(gw_infer_t *req, h2o_iovec_t ct)
{
    const uint8_t *b = req->body;
    size_t n = req->body_len, i = 0;
    while (i < n && (b[i] == ' ' || b[i] == '\t' || b[i] == '\r' || b[i] == '\n'))
        i++;
    if (ct_is(ct, "application/json") && is_jpeg(b, n)) {
        reject(req, SQ_MEDIA_TYPE,
               "the body is a JPEG but Content-Type says application/json: send "
               "Content-Type: image/jpeg");
        return -1;
    }
    if (i < n && (b[i] == '{' || b[i] == '[') &&
        (ct_is(ct, "application/json") || !is_jpeg(b, n))) {
        reject(req, SQ_MEDIA_TYPE,
               "this route takes images (image/jpeg, or multipart/form-data of JPEGs); JSON "
               "inference requests (the Open Inference Protocol) go to POST "
               "/v2/models/%s/infer",
               req->model->name);
        return -1;
    }
    if (ct_is(ct, "application/x-www-form-urlencoded") && n >= 4096 && memchr(b, '\n', n) == NULL &&
        memchr(b, '\r', n) == NULL) {
        reject(req, SQ_MEDIA_TYPE,
               "the body has no CR or LF byte, as `curl -d @file` leaves a file (it strips them "
               "and sends the rest form-encoded): send the image unchanged with `curl "
               "--data-binary @photo.jpg -H 'Content-Type: image/jpeg'`");
        return -1;
    }
    return 0;
}

void gw_route_infer_v1(gw_call_t *call)
{
    gw_server_t *srv = call->srv;
    h2o_req_t *hreq = call->req;
    gw_infer_t *req = infer_new(call, GW_API_V1);
    if (req == NULL)
        return;
    req->base.respond = respond_v1;
    /* /v1 answers a classifier's top-k labels: output 0 is [N, K] class
     * scores. A detector's boxes ranked as classes would be meaningless
     * "predictions": it is sent to /v2 for its outputs instead. */
    const gw_model_t *cm = req->model;
    if (cm->det_slots > 0 || cm->noutputs < 1 || cm->outputs[0].ndims != 2) {
        char shape[96] = "";
        for (int d = 0; cm->noutputs > 0 && d < cm->outputs[0].ndims; d++)
            snprintf(shape + strlen(shape), sizeof(shape) - strlen(shape), "%s%lld", d ? ", " : "",
                     (long long)cm->outputs[0].dims[d]);
        reject(req, SQ_BAD_REQUEST,
               "model %s has no class scores (output 0 '%s' is [%s]%s): /v1 answers a "
               "classifier's top-k labels; POST /v2/models/%s/infer for its outputs",
               cm->name, cm->output_name, shape, cm->det_slots > 0 ? ", a detector's boxes" : "",
               cm->name);
        return;
    }
    char buf[64];
    double slo = -1;
    if (request_slo(req, hreq, &slo) != 0)
        return;
    set_deadline(req, slo, srv->cfg);
    int64_t priority;
    if (request_priority(req, hreq, &priority) != 0)
        return;
    req->priority = gw_priority_level(priority);
    /* top-k ranks output 0's values (a classifier's classes) */
    int64_t classes = req->model->outputs[0].elems;
    if (gw_query_param(hreq, "top_k", buf, sizeof(buf))) {
        double k;
        if (parse_positive(buf, &k) != 0 || k != floor(k) || k > classes) {
            reject(req, SQ_BAD_REQUEST, "top_k: expected an integer in 1..%lld",
                   (long long)classes);
            return;
        }
        req->top_k = (int)k;
    }
    if (req->top_k > classes)
        req->top_k = (int)classes;
    if (hreq->entity.len == 0) {
        reject(req, SQ_BAD_IMAGE, "empty body: send a JPEG (image/jpeg) or multipart images");
        return;
    }
    h2o_iovec_t ct = gw_header(hreq, "content-type");
    if (take_body(req, hreq) != 0)
        return;
    char boundary[GW_MULTIPART_MAX_BOUNDARY + 1];
    if (ct.len >= 9 && strncasecmp(ct.base, "multipart", 9) == 0) {
        int rc = gw_multipart_boundary(ct.base, ct.len, boundary, sizeof(boundary));
        if (rc != 0) {
            reject(req, rc, "multipart/form-data with a valid boundary expected");
            return;
        }
        int max = srv->cfg->max_images;
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
                reject(req, rc, "more than %d images in one request", max);
            else
                reject(req, rc, "%s", err);
            return;
        }
        if (check_feasible(req) != 0) {
            free(parts);
            return;
        }
        if (alloc_items(req, n) != 0) {
            free(parts);
            reject(req, SQ_OVERLOAD, "not enough memory for %d images; retry shortly", n);
            return;
        }
        for (int i = 0; i < n; i++)
            start_jpeg(srv, &req->items[i], parts[i].data, parts[i].len);
        free(parts);
        return;
    }
    /* Any other content type is one image: the decoder sniffs the format
     * (curl --data-binary sends application/x-www-form-urlencoded). Not a
     * JPEG: 415 before anything else, however large. */
    if (v1_body_slip(req, ct) != 0)
        return;
    char why[160];
    int rc = gw_image_type_check(req->body, req->body_len, why, sizeof(why));
    if (rc != 0) {
        reject(req, rc, "%s", why);
        return;
    }
    if (check_feasible(req) != 0)
        return;
    if (alloc_items(req, 1) != 0) {
        reject(req, SQ_OVERLOAD, "not enough memory for this request; retry shortly");
        return;
    }
    start_jpeg(srv, &req->items[0], req->body, req->body_len);
}

/* ---- /v2 ------------------------------------------------------------------ */

typedef struct {
    gw_oip_model_t desc;
    gw_oip_request_t parsed;
    long long header_len;
    double header_slo_ms;    /* X-SLO-Ms or ?slo_ms=; -1 none */
    int64_t header_priority; /* X-Priority or ?priority=; -1 none */
    char version[16];
    /* The shared-memory regions its inputs and outputs name, held until it
     * is disposed (its items are done by then, and its answer written), so
     * that an unregister meanwhile unmaps nothing under it. */
    gw_shm_region_t *regions[GW_OIP_MAX_INPUTS + GW_OIP_MAX_OUTPUTS];
    int nregions;
    gw_shm_region_t *out_region[GW_OIP_MAX_OUTPUTS]; /* per requested output; NULL: not in one */
} v2_state_t;

static void v2_dispose(gw_infer_t *req)
{
    v2_state_t *st = req->api_state;
    if (st != NULL) {
        gw_oip_request_dispose(&st->parsed);
        for (int i = 0; i < st->nregions; i++)
            gw_shm_release(st->regions[i]);
        free(st);
    }
}

/* Writes the outputs asked for in shared memory into their regions (each
 * output's batch x item floats); 0, or -1 after answering an error. */
static int write_shm_outputs(gw_infer_t *req, h2o_req_t *hreq, const float *const *outputs)
{
    v2_state_t *st = req->api_state;
    const gw_oip_request_t *p = &st->parsed;
    for (int i = 0; i < p->noutputs; i++) {
        const gw_oip_output_req_t *o = &p->outputs[i];
        if (st->out_region[i] == NULL)
            continue;
        size_t bytes = (size_t)req->n_items * (size_t)req->model->outputs[o->model_output].elems *
                       sizeof(float);
        char why[512];
        uint8_t *dst = gw_shm_span(st->out_region[i], o->shm.offset, bytes, why, sizeof(why));
        if (dst == NULL) {
            char msg[600];
            snprintf(msg, sizeof(msg), "outputs[%d].parameters.shared_memory_region: %s", i, why);
            req->reply_status = sq_err_http_status(SQ_BAD_REQUEST);
            answer_headers(req, hreq);
            gw_send_error(hreq, SQ_BAD_REQUEST, msg);
            return -1;
        }
        memcpy(dst, outputs[o->model_output], bytes);
    }
    return 0;
}

static void answer_v2(gw_infer_t *req, h2o_req_t *hreq);

static void respond_v2(gw_async_t *a, h2o_req_t *hreq)
{
    gw_infer_t *req = (gw_infer_t *)a;
    status_for_trace(req);
    answer_v2(req, hreq);
    req->reply_us = sq_now_us();
}

static void answer_v2(gw_infer_t *req, h2o_req_t *hreq)
{
    gw_metrics_infer_answered(req);
    if (atomic_load(&req->failed)) {
        send_failure(req, hreq);
        return;
    }
    v2_state_t *st = req->api_state;
    gw_model_t *m = req->model;
    timing_t t = timing_of(req);
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
    /* Each output's batch x item floats, gathered from the items' rows
     * (output i's slice of a row starts after outputs 0..i-1). */
    const float *outputs[GW_OIP_MAX_OUTPUTS] = {0};
    float *gathered = NULL;
    if (m->noutputs == 1) {
        outputs[0] = req->outputs;
    } else {
        gathered = sq_xmalloc((size_t)req->n_items * (size_t)m->out_elems * sizeof(float) + 1);
        size_t at = 0;
        for (int o = 0; o < m->noutputs; o++) {
            size_t per = (size_t)m->outputs[o].elems;
            float *dst = gathered + at * (size_t)req->n_items;
            for (int i = 0; i < req->n_items; i++)
                memcpy(dst + (size_t)i * per, req->outputs + (size_t)i * (size_t)m->out_elems + at,
                       per * sizeof(float));
            outputs[o] = dst;
            at += per;
        }
    }
    if (write_shm_outputs(req, hreq, outputs) != 0) {
        free(labels);
        free(gathered);
        return;
    }
    gw_oip_response_t resp = {.model_name = m->name,
                              .model_version = st->version,
                              .model = &st->desc,
                              .request = &st->parsed,
                              .outputs = outputs,
                              .labels = labels,
                              .nlabels = (int)nlabels,
                              .params = params,
                              .nparams = nparams};
    sq_buf_t out;
    sq_buf_init(&out);
    long long header_len = -1;
    int rc = gw_oip_response_encode(&resp, &out, &header_len);
    free(labels);
    free(gathered);
    answer_headers(req, hreq);
    if (rc != 0) {
        sq_buf_dispose(&out);
        req->reply_status = sq_err_http_status(SQ_INTERNAL);
        gw_send_error(hreq, SQ_INTERNAL, "cannot encode the response");
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

/* A reference to the region a tensor names (held by the request), or NULL
 * after rejecting: path is the tensor's parameter, for the message. */
static gw_shm_region_t *v2_region(gw_infer_t *req, v2_state_t *st, const char *name,
                                  const char *path)
{
    gw_shm_region_t *r = gw_shm_acquire(req->base.srv->shm, name);
    if (r == NULL) {
        reject(req, SQ_BAD_REQUEST,
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
static int v2_shm_resolve(gw_infer_t *req, v2_state_t *st, size_t *copy_bytes)
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
            reject(req, SQ_BAD_REQUEST, "%s: %s", path, why);
            return -1;
        }
        int rc = gw_oip_input_set_bytes(p, &st->desc, i, data, (size_t)in->shm.byte_size, why,
                                        sizeof(why));
        if (rc != 0) {
            reject(req, rc, "%s", why);
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
            reject(req, SQ_BAD_REQUEST, "%s: %s", path, why);
            return -1;
        }
        st->out_region[i] = r;
    }
    return 0;
}

/* Splits the parsed request into its items and starts them. */
static void v2_items(gw_infer_t *req)
{
    gw_server_t *srv = req->base.srv;
    v2_state_t *st = req->api_state;
    int n = st->parsed.batch;
    if (alloc_items(req, n) != 0) {
        reject(req, SQ_OVERLOAD, "not enough memory for a batch of %d; retry shortly", n);
        return;
    }
    const gw_oip_input_t *in = &st->parsed.inputs[0];
    for (int i = 0; i < n; i++) {
        const gw_oip_row_t *row = &in->rows[i];
        if (in->datatype == GW_OIP_BYTES)
            start_jpeg(srv, &req->items[i], row->data, row->len);
        else
            start_tensor(srv, &req->items[i], row->data, row->len, in->datatype == GW_OIP_UINT8);
    }
}

static void v2_items_offloaded(void *arg)
{
    v2_items(arg);
}

/* Parses the body and starts the items; on the loop (on_loop) or the
 * offload thread. */
static void v2_start(gw_infer_t *req, int on_loop)
{
    gw_server_t *srv = req->base.srv;
    v2_state_t *st = req->api_state;
    char err[512];
    int rc = gw_oip_request_parse(req->body, req->body_len, st->header_len, &st->desc, &st->parsed,
                                  err, sizeof(err));
    if (rc != 0) {
        reject(req, rc, "%s", err);
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
    set_deadline(req, slo, srv->cfg);
    /* parameters.priority (0 is Triton's "the default"), then X-Priority. */
    req->priority =
        gw_priority_level(st->parsed.priority > 0 ? st->parsed.priority : st->header_priority);
    if (check_feasible(req) != 0)
        return;
    size_t copy_bytes;
    if (v2_shm_resolve(req, st, &copy_bytes) != 0)
        return;
    const gw_oip_input_t *in = &st->parsed.inputs[0];
    if (in->shm.region[0] == '\0' && in->datatype != GW_OIP_BYTES)
        for (int i = 0; i < st->parsed.batch; i++)
            copy_bytes += in->rows[i].len;
    if (on_loop && copy_bytes > INLINE_COPY_BYTES)
        gw_offload(srv, v2_items_offloaded, req);
    else
        v2_items(req);
}

static void v2_start_offloaded(void *arg)
{
    v2_start(arg, 0);
}

void gw_route_infer_v2(gw_call_t *call)
{
    gw_server_t *srv = call->srv;
    h2o_req_t *hreq = call->req;
    gw_infer_t *req = infer_new(call, GW_API_V2);
    if (req == NULL)
        return;
    req->base.respond = respond_v2;
    gw_model_t *m = req->model;
    v2_state_t *st = sq_xcalloc(1, sizeof(*st));
    req->api_state = st;
    req->api_dispose = v2_dispose;
    snprintf(st->version, sizeof(st->version), "%d", m->version);
    if (request_slo(req, hreq, &st->header_slo_ms) != 0 ||
        request_priority(req, hreq, &st->header_priority) != 0)
        return;
    st->desc.ninputs = 1;
    gw_oip_input_desc_t *in = &st->desc.inputs[0];
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
    st->desc.noutputs = m->noutputs;
    for (int i = 0; i < m->noutputs; i++) {
        const gw_output_t *o = &m->outputs[i];
        gw_oip_output_desc_t *d = &st->desc.outputs[i];
        snprintf(d->name, sizeof(d->name), "%s", o->name);
        d->item_ndim = 0;
        for (int k = 1; k < o->ndims && d->item_ndim < GW_OIP_MAX_DIMS; k++)
            d->item_shape[d->item_ndim++] = o->dims[k];
        if (d->item_ndim == 0) /* [N]: one value per item */
            d->item_shape[d->item_ndim++] = 1;
    }
    st->desc.max_batch = srv->cfg->max_images;
    st->desc.max_body_bytes = (size_t)srv->cfg->max_body_bytes;
    st->desc.shared_memory = 1;
    st->header_len = -1;
    h2o_iovec_t hl = gw_header(hreq, "inference-header-content-length");
    if (hl.len > 0) {
        char buf[24];
        snprintf(buf, sizeof(buf), "%.*s", (int)(hl.len < 23 ? hl.len : 23), hl.base);
        char *end;
        long long v = strtoll(buf, &end, 10);
        if (*end != '\0' || v < 0 || (size_t)v > hreq->entity.len) {
            reject(req, SQ_BAD_REQUEST, "Inference-Header-Content-Length: expected 0..%zu",
                   hreq->entity.len);
            return;
        }
        st->header_len = v;
    }
    set_deadline(req, -1, srv->cfg);
    if (take_body(req, hreq) != 0)
        return;
    if (st->header_len < 0 && is_jpeg(req->body, req->body_len)) {
        reject(req, SQ_MEDIA_TYPE,
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
        gw_offload(srv, v2_start_offloaded, req);
    else
        v2_start(req, 1);
}

/* ---- for other request kinds (query.c) ---------------------------------- */

json_t *gw_top_k_json(const gw_model_t *m, const float *row, int k)
{
    return top_k_json(m, row, k);
}

void gw_request_id(h2o_req_t *hreq, char *out, size_t len)
{
    h2o_iovec_t rid = gw_header(hreq, "x-request-id");
    if (rid.len > 0 && rid.len < len) {
        memcpy(out, rid.base, rid.len);
        out[rid.len] = '\0';
    } else {
        make_request_id(out, len);
    }
}

int gw_request_slo_ms(h2o_req_t *hreq, double *slo, char *why, size_t len)
{
    char buf[64];
    *slo = -1;
    h2o_iovec_t hslo = gw_header(hreq, "x-slo-ms");
    if (hslo.len > 0) {
        snprintf(buf, sizeof(buf), "%.*s", (int)(hslo.len < 63 ? hslo.len : 63), hslo.base);
        if (parse_positive(buf, slo) != 0) {
            snprintf(why, len, "X-SLO-Ms: expected a positive number of ms");
            return SQ_BAD_REQUEST;
        }
    } else if (gw_query_param(hreq, "slo_ms", buf, sizeof(buf))) {
        if (parse_positive(buf, slo) != 0) {
            snprintf(why, len, "slo_ms: expected a positive number of ms");
            return SQ_BAD_REQUEST;
        }
    }
    return 0;
}
