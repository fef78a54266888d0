/* An inference request's setup and end, for both APIs (infer_int.h): the
 * model looked up and checked servable, admission (--max-inflight), its
 * id, SLO, deadline and priority from the headers or the query string, the
 * refusal of an SLO no request can meet, its body, its items' arrays; and,
 * when it is disposed, its trace line (trace_int.h). gw_request_id and
 * gw_request_slo_ms serve the pipelines' queries too (query.c). */
#include "gw_dispatch.h"
#include "infer_int.h"
#include "trace_int.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#define DEFAULT_TOP_K 5

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

int gw_infer_parse_positive(const char *s, double *out)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end != '\0' || !(v > 0) || !isfinite(v))
        return -1;
    *out = v;
    return 0;
}

int gw_infer_parse_priority(const char *s, int64_t *out)
{
    /* Digits only: no sign, no space, no fraction; at most INT32_MAX, as
     * OIP's parameters.priority. */
    size_t n = strlen(s);
    int64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9' || v > INT32_MAX) {
            v = -1;
            break;
        }
        v = v * 10 + (s[i] - '0');
    }
    if (n == 0 || v < 0 || v > INT32_MAX)
        return -1;
    *out = v;
    return 0;
}

int gw_infer_is_jpeg(const uint8_t *p, size_t n)
{
    return n >= 3 && p[0] == 0xFF && p[1] == 0xD8 && p[2] == 0xFF;
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
    gw_api_ctx_t *api = a->app;
    if (atomic_load(&req->pending) > 0)
        gw_sched_withdraw(gw_api_sched(api));
}

int gw_infer_admit(gw_api_ctx_t *api, gw_model_t *m, char *why, size_t len)
{
    char unserved[MDB_NAME_MAX + 256];
    if (!gw_registry_served(api->registry, m, unserved, sizeof(unserved))) {
        snprintf(why, len, "%s", unserved);
        return SQ_MODEL_NOT_FOUND;
    }
    if (strcmp(m->status, "failed") == 0) {
        /* No retry helps: the operator must upload it again. */
        snprintf(why, len, "model %s version %d failed: %s; upload it again to retry", m->name,
                 m->version, m->error[0] ? m->error : "it could not be measured");
        gw_metrics_infer_rejected(api, m, SQ_MODEL_FAILED);
        return SQ_MODEL_FAILED;
    }
    if (strcmp(m->status, "unloaded") == 0) {
        snprintf(why, len,
                 "model %s is unloaded; POST /v2/repository/models/%s/load serves it again",
                 m->name, m->name);
        gw_metrics_infer_rejected(api, m, SQ_MODEL_UNLOADED);
        return SQ_MODEL_UNLOADED;
    }
    if (strcmp(m->status, "ready") != 0) {
        gw_metrics_infer_rejected(api, m, SQ_NOT_READY);
        snprintf(why, len, "the model is being profiled; retry shortly");
        return SQ_NOT_READY;
    }
    if (gw_sched_serving_kind(gw_api_sched(api), m) < 0) {
        gw_metrics_infer_rejected(api, m, SQ_NO_WORKER);
        snprintf(why, len, "no worker that can run this model is up");
        return SQ_NO_WORKER;
    }
    /* Admission: a request is inside squishd from here until its answer is
     * sent and its items are done (gw_infer_dispose); past max_inflight, new
     * ones are shed at once, before any copy or decode. */
    if (atomic_fetch_add(&api->infer_inflight, 1) >= api->cfg.max_inflight) {
        atomic_fetch_sub(&api->infer_inflight, 1);
        gw_metrics_infer_rejected(api, m, SQ_OVERLOAD);
        snprintf(why, len, "squishd has --max-inflight %d requests in flight; retry shortly",
                 api->cfg.max_inflight);
        return SQ_OVERLOAD;
    }
    return 0;
}

void gw_infer_init(gw_infer_t *req, gw_model_t *m, gw_api_t kind)
{
    gw_api_ctx_t *api = req->base.app;
    req->model = m;
    req->api = kind;
    req->arrival_us = sq_now_us();
    req->top_k = DEFAULT_TOP_K;
    /* An SLO only where someone asked for one (issue 23): the model's
     * default_slo_ms, else squishd's --default-slo-ms, else none (0: best
     * effort); the request's own replaces either (gw_infer_set_deadline). */
    req->slo_ms = m->default_slo_ms > 0 ? m->default_slo_ms : api->cfg.default_slo_ms;
    req->slo_source = m->default_slo_ms > 0 ? "model" : req->slo_ms > 0 ? "server" : "none";
    req->priority = GW_PRIORITY_DEFAULT;
    req->trace_id = gw_trace_sample(api->trace, m->name);
}

void gw_infer_done(gw_infer_t *req)
{
    if (req->ext_done != NULL)
        req->ext_done(req->ext_arg, &req->base);
    else
        gw_async_done(&req->base);
}

void gw_request_new_id(char *out, size_t len)
{
    make_request_id(out, len);
}

/* Looks the model up and builds the request; replies and returns NULL on
 * an error. */
gw_infer_t *gw_infer_new(gw_call_t *call, gw_api_t kind)
{
    gw_api_ctx_t *api = call->app;
    h2o_req_t *hreq = call->req;
    if (atomic_load(api->stopping)) {
        gw_send_error(hreq, SQ_SHUTTING_DOWN, "squishd is shutting down");
        return NULL;
    }
    int version = 0;
    if (call->nargs > 1 && (version = gw_parse_version(call->args[1])) < 0) {
        gw_send_bad_version(call, call->args[1]);
        return NULL;
    }
    gw_model_t *m = gw_registry_find(api->registry, call->args[0].base, call->args[0].len, version);
    if (m == NULL) {
        gw_send_not_found(call, call->args[0], version);
        return NULL;
    }
    char why[sizeof(m->error) + MDB_NAME_MAX * 2 + 256];
    int err = gw_infer_admit(api, m, why, sizeof(why));
    if (err != 0) {
        gw_send_error(hreq, err, why);
        gw_model_unref(m);
        return NULL;
    }
    gw_infer_t *req = (gw_infer_t *)gw_async_new(call, sizeof(gw_infer_t));
    req->base.dispose = gw_infer_dispose;
    req->base.gone = infer_gone;
    gw_async_watch(&req->base);
    gw_infer_init(req, m, kind);
    gw_request_id(hreq, req->request_id, sizeof(req->request_id));
    return req;
}

/* Applies an SLO (ms; <= 0 keeps the current one), caps it and sets the
 * deadline: without an SLO (best effort), --max-request-ms's. */
void gw_infer_set_deadline(gw_infer_t *req, double slo_ms, const gw_api_config_t *cfg)
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
int gw_infer_alloc_items(gw_infer_t *req, int n)
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
void gw_infer_reject(gw_infer_t *req, int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    atomic_store(&req->failed, 1);
    req->err = err;
    vsnprintf(req->err_detail, sizeof(req->err_detail), fmt, ap);
    va_end(ap);
    gw_infer_done(req);
}

/* Points the request at its body (gw_request_body: in place, or a copy
 * for HTTP/2); replies 503 and returns -1 when a copy finds no memory. */
int gw_infer_take_body(gw_infer_t *req, h2o_req_t *hreq)
{
    if (gw_request_body(hreq, &req->body, &req->body_len, &req->body_owned) != 0) {
        gw_infer_reject(req, SQ_OVERLOAD,
                        "not enough memory to hold a body of %zu bytes; retry shortly",
                        hreq->entity.len);
        return -1;
    }
    return 0;
}

/* The SLO a request's header (X-SLO-Ms) or query (?slo_ms=) asks for, in
 * *slo (-1: none); -1 after rejecting a malformed one. */
int gw_infer_request_slo(gw_infer_t *req, h2o_req_t *hreq, double *slo)
{
    char buf[64];
    *slo = -1;
    h2o_iovec_t hslo = gw_header(hreq, "x-slo-ms");
    if (hslo.len > 0) {
        snprintf(buf, sizeof(buf), "%.*s", (int)(hslo.len < 63 ? hslo.len : 63), hslo.base);
        if (gw_infer_parse_positive(buf, slo) != 0) {
            gw_infer_reject(req, SQ_BAD_REQUEST, "X-SLO-Ms: expected a positive number of ms");
            return -1;
        }
    } else if (gw_query_param(hreq, "slo_ms", buf, sizeof(buf))) {
        if (gw_infer_parse_positive(buf, slo) != 0) {
            gw_infer_reject(req, SQ_BAD_REQUEST, "slo_ms: expected a positive number of ms");
            return -1;
        }
    }
    return 0;
}

/* The priority a request's header (X-Priority) or query (?priority=) asks
 * for, Triton's numbers (gw_priority_level), in *priority (-1: none); -1
 * after rejecting a malformed one. */
int gw_infer_request_priority(gw_infer_t *req, h2o_req_t *hreq, int64_t *priority)
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
    if (gw_infer_parse_priority(buf, priority) != 0) {
        gw_infer_reject(req, SQ_BAD_REQUEST,
                        "%s: expected an integer >= 0 (0 = the default level, 1 the highest)",
                        what);
        return -1;
    }
    return 0;
}

/* The smallest SLO the model can meet: one request alone on its serving
 * kind, l(1) with the margin, plus the dispatch margin, as the dispatcher
 * plans it (gw_sched_least). A request asking for less is answered at
 * once, 400 slo_too_tight saying what to ask for (a drop by the dispatcher
 * would only say that the deadline cannot be met). Returns -1 after
 * rejecting. */
int gw_infer_check_feasible(gw_infer_t *req)
{
    gw_api_ctx_t *api = req->base.app;
    const gw_model_t *m = req->model;
    int kind = gw_sched_serving_kind(gw_api_sched(api), m);
    gw_least_t least_us;
    if (gw_sched_least(gw_api_sched(api), m, kind, 1, &least_us) != 0)
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
    gw_infer_reject(
        req, SQ_SLO_TOO_TIGHT,
        "an SLO of %g ms%s cannot be met: one request takes at least %.1f ms on %s (l(1) %.1f "
        "ms + dispatch margin %.1f ms); ask for %.0f ms or more",
        req->slo_ms, from, l1 + margin, sq_dev_kind_name((sq_dev_kind_t)kind), l1, margin, least);
    return -1;
}

/* ---- its end ------------------------------------------------------------- */

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
    gw_api_ctx_t *api = req->base.app;
    gw_trace_emit(api->trace, &r);
}

void gw_infer_dispose(gw_async_t *a)
{
    gw_infer_t *req = (gw_infer_t *)a;
    gw_api_ctx_t *api = a->app;
    atomic_fetch_sub(&api->infer_inflight, 1);
    if (req->trace_id != 0)
        trace_write(req);
    gw_model_unref(req->model);
    free(req->items);
    free(req->preps);
    free(req->outputs);
    free(req->body_owned);
    json_decref(req->answer_rows);
}

/* ---- for other request kinds (query.c) ---------------------------------- */

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
        if (gw_infer_parse_positive(buf, slo) != 0) {
            snprintf(why, len, "X-SLO-Ms: expected a positive number of ms");
            return SQ_BAD_REQUEST;
        }
    } else if (gw_query_param(hreq, "slo_ms", buf, sizeof(buf))) {
        if (gw_infer_parse_positive(buf, slo) != 0) {
            snprintf(why, len, "slo_ms: expected a positive number of ms");
            return SQ_BAD_REQUEST;
        }
    }
    return 0;
}
