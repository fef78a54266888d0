/* Observability routes: GET /metrics (Prometheus text exposition) and
 * Triton's statistics extension (GET /v2/models[/{m}[/versions/{v}]]/stats),
 * plus the glue that turns a finished HTTP or inference request into
 * metrics and log lines. Everything here runs on an HTTP loop thread and
 * reads atomics only (no I/O but /proc/self during a scrape). */
#include "api_int.h"
#include "gw_dispatch.h"
#include "gw_front.h"
#include "gw_metrics.h"

#include <stdlib.h>
#include <string.h>

void gw_route_metrics(gw_call_t *call)
{
    gw_api_ctx_t *api = call->app;
    h2o_req_t *req = call->req;
    sq_buf_t out;
    sq_buf_init(&out);
    gw_metrics_write(api->metrics, &out);
    gw_metrics_write_gpus(api->metrics, &out);
    /* Admission: what max_inflight and max_connections bound. */
    char adm[1024];
    int n = snprintf(
        adm, sizeof(adm),
        "# HELP squish_inflight_requests Inference requests inside squishd (admitted, not yet "
        "answered and released).\n# TYPE squish_inflight_requests gauge\n"
        "squish_inflight_requests %ld\n"
        "# HELP squish_max_inflight_requests The admission limit (--max-inflight).\n"
        "# TYPE squish_max_inflight_requests gauge\nsquish_max_inflight_requests %d\n"
        "# HELP squish_http_connections Open client connections.\n"
        "# TYPE squish_http_connections gauge\nsquish_http_connections %d\n",
        atomic_load(&api->infer_inflight), api->cfg.max_inflight, gw_http_connections(call));
    sq_buf_put(&out, adm, (size_t)n);
    if (!api->frontend) {
        /* A leader's (a standby answers its own /metrics: leader.c). */
        static const char lead[] = "# HELP squish_leader 1 when this squishd leads, 0 on a "
                                   "standby.\n# TYPE squish_leader gauge\nsquish_leader 1\n";
        sq_buf_put(&out, lead, sizeof(lead) - 1);
    }
    if (api->dispatch != NULL) {
        /* Frontends' traffic on this dispatcher's link (metadata only: a
         * few dozen bytes an item each way). */
        gw_frontend_traffic_t t;
        gw_dispatch_frontend_traffic(api->dispatch, &t);
        n = snprintf(adm, sizeof(adm),
                     "# HELP squish_frontends Frontends joined to this dispatcher.\n"
                     "# TYPE squish_frontends gauge\nsquish_frontends %d\n"
                     "# HELP squish_frontend_items_total Items frontends offered.\n"
                     "# TYPE squish_frontend_items_total counter\n"
                     "squish_frontend_items_total %llu\n"
                     "# HELP squish_frontend_link_bytes_total Bytes on the frontends' links "
                     "(frame headers included).\n"
                     "# TYPE squish_frontend_link_bytes_total counter\n"
                     "squish_frontend_link_bytes_total{direction=\"in\"} %llu\n"
                     "squish_frontend_link_bytes_total{direction=\"out\"} %llu\n",
                     t.connected, (unsigned long long)t.items, (unsigned long long)t.bytes_in,
                     (unsigned long long)t.bytes_out);
        sq_buf_put(&out, adm, (size_t)n);
    }
    if (api->frontend) /* a frontend's links (not joined: it answers itself) */
        gw_front_metrics_text(api->front, &out);
    gw_frontend_traffic_t fet;
    gw_dispatch_frontend_traffic(api->dispatch, &fet);
    if (fet.connected > 0) {
        /* The cluster's one view: every frontend's series, labelled. */
        sq_buf_t all;
        sq_buf_init(&all);
        sq_buf_put(&out, "", 1);
        gw_dispatch_frontends_metrics(api->dispatch, (const char *)out.data, &all);
        sq_buf_dispose(&out);
        out = all;
    }
    req->res.status = 200;
    req->res.reason = gw_http_reason(200);
    h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE, NULL,
                   H2O_STRLIT(GW_METRICS_CONTENT_TYPE));
    gw_send_body(req, out.data, out.len);
    sq_buf_dispose(&out);
}

/* ---- Triton statistics ----------------------------------------------------- */

typedef struct {
    h2o_iovec_t name; /* empty: every model */
    int version;      /* 0: every version */
    gw_model_t **found;
    int n, cap;
} stats_query_t;

static void collect(gw_model_t *m, void *arg)
{
    stats_query_t *q = arg;
    if (q->name.len > 0 && !h2o_memis(m->name, strlen(m->name), q->name.base, q->name.len))
        return;
    if (q->version > 0 && m->version != q->version)
        return;
    if (q->n == q->cap) {
        q->cap = q->cap ? 2 * q->cap : 16;
        q->found = sq_xrealloc(q->found, sizeof(*q->found) * (size_t)q->cap);
    }
    gw_model_ref(m);
    q->found[q->n++] = m;
}

static int by_name_version(const void *a, const void *b)
{
    const gw_model_t *x = *(gw_model_t *const *)a, *y = *(gw_model_t *const *)b;
    int c = strcmp(x->name, y->name);
    return c != 0 ? c : x->version - y->version;
}

static json_t *duration(json_int_t count, json_int_t ns)
{
    return json_pack("{s:I, s:I}", "count", count, "ns", ns);
}

/* A pipeline's row, as Triton gives an ensemble's: its queries (success
 * and fail, arrival to answer); its queueing and compute are its stages',
 * in their models' rows, so they are 0 here, as are its batches. */
static json_t *pipeline_stats(gw_pipeline_t *p)
{
    pthread_mutex_lock(&p->mu);
    json_int_t ok = p->outcomes[GW_Q_OK];
    json_int_t bad = p->outcomes[GW_Q_DROPPED] + p->outcomes[GW_Q_FAILED];
    json_int_t ok_ns = p->outcome_us[GW_Q_OK] * 1000;
    json_int_t bad_ns = (p->outcome_us[GW_Q_DROPPED] + p->outcome_us[GW_Q_FAILED]) * 1000;
    json_int_t last = p->last_ok_ms;
    pthread_mutex_unlock(&p->mu);
    json_t *stats = json_pack(
        "{s:s, s:s, s:I, s:I, s:I, s:{s:o, s:o, s:o, s:o, s:o, s:o}, s:[]}", "name", p->name,
        "version", "1", "last_inference", last, "inference_count", ok, "execution_count",
        (json_int_t)0, "inference_stats", "success", duration(ok, ok_ns), "fail",
        duration(bad, bad_ns), "queue", duration(0, 0), "compute_input", duration(0, 0),
        "compute_infer", duration(0, 0), "compute_output", duration(0, 0), "batch_stats");
    gw_metrics_stats_triton_rest(stats);
    return stats;
}

/* Triton's statistics (api_int.h): {"model_stats": [...]}. */
int gw_model_stats_json(gw_api_ctx_t *api, const char *name, size_t name_len, int version,
                        json_t **out)
{
    stats_query_t q = {0};
    q.name = h2o_iovec_init(name, name_len);
    q.version = version;
    gw_registry_foreach(api->registry, collect, &q);
    /* Pipelines are models here too (version 1, as their metadata says):
     * every one with every model, or the one asked for by name. */
    int np = 0;
    gw_pipeline_t **ps = NULL;
    if (name == NULL) {
        ps = gw_pipes_all(api->pipelines, &np);
    } else if (q.n == 0 && q.version <= 1 && gw_model_name_ok(name, name_len)) {
        char pname[MDB_NAME_MAX + 1];
        memcpy(pname, name, name_len);
        pname[name_len] = '\0';
        gw_pipeline_t *p = gw_pipes_get(api->pipelines, pname);
        if (p != NULL) {
            ps = sq_xcalloc(1, sizeof(*ps));
            ps[np++] = p;
        }
    }
    if (name != NULL && q.n == 0 && np == 0) {
        free(q.found);
        return SQ_MODEL_NOT_FOUND;
    }
    if (q.n > 1)
        qsort(q.found, (size_t)q.n, sizeof(*q.found), by_name_version);
    json_t *stats = json_array();
    for (int i = 0; i < q.n; i++) {
        json_t *one = gw_metrics_model_stats(api->metrics, q.found[i]);
        gw_dispatch_frontends_stats(api->dispatch, one); /* the requests frontends answered */
        json_array_append_new(stats, one);
        gw_model_unref(q.found[i]);
    }
    for (int i = 0; i < np; i++) {
        json_array_append_new(stats, pipeline_stats(ps[i]));
        gw_pipeline_unref(ps[i]);
    }
    free(q.found);
    free(ps);
    *out = json_pack("{s:o}", "model_stats", stats);
    return 0;
}

/* GET /v2/models/stats, /v2/models/{m}/stats, /v2/models/{m}/versions/{v}/stats:
 * the models of the registry that match (a model, or one of its versions,
 * that does not exist is a 404). */
void gw_route_model_stats(gw_call_t *call)
{
    int version = 0;
    if (call->nargs >= 2 && (version = gw_parse_version(call->args[1])) < 0) {
        gw_send_bad_version(call, call->args[1]);
        return;
    }
    json_t *out;
    if (gw_model_stats_json(call->app, call->nargs >= 1 ? call->args[0].base : NULL,
                            call->nargs >= 1 ? call->args[0].len : 0, version, &out) != 0) {
        gw_send_not_found(call, call->args[0], version);
        return;
    }
    gw_send_json(call->req, 200, out);
}

/* ---- glue: finished requests -------------------------------------------------- */

void gw_metrics_http_done(void *app, h2o_req_t *req, const char *route, int64_t start_ns)
{
    const gw_api_ctx_t *api = app;
    /* Status 0: the client went away before an answer; nothing was sent. */
    if (req->res.status == 0)
        return;
    gw_metrics_http(api->metrics, route, req->res.status);
    if (api->cfg.access_log)
        SQ_INFO("access method=%.*s path=\"%.*s\" route=%s status=%d bytes=%zu duration_ms=%.3f",
                (int)req->method.len, req->method.base,
                (int)(req->path.len > 256 ? 256 : req->path.len), req->path.base, route,
                req->res.status, req->bytes_sent, (double)(sq_now_ns() - start_ns) / 1e6);
}

static double seconds_between(int64_t from_us, int64_t to_us)
{
    return to_us > from_us ? (double)(to_us - from_us) / 1e6 : 0;
}

void gw_metrics_infer_answered(struct gw_infer *req)
{
    gw_api_ctx_t *api = req->base.app;
    int64_t now = sq_now_us();
    int failed = atomic_load(&req->failed);
    gw_metrics_request_t r = {.status = failed ? sq_err_http_status(req->err) : 200,
                              .err = failed ? req->err : 0,
                              .slo_ms = req->slo_ms,
                              .priority = req->priority,
                              .items = req->n_items,
                              .total_s = seconds_between(req->arrival_us, now)};
    int batch = 0;
    if (!failed) {
        int64_t last_done = req->arrival_us;
        for (int i = 0; i < req->n_items; i++) {
            const gw_item_t *it = &req->items[i];
            double pre = seconds_between(req->arrival_us, it->times.ready_us);
            double queue = seconds_between(it->times.ready_us, it->times.sent_us);
            double exec = seconds_between(it->times.sent_us, it->times.done_us);
            r.preprocess_s = pre > r.preprocess_s ? pre : r.preprocess_s;
            r.queue_s = queue > r.queue_s ? queue : r.queue_s;
            r.execute_s = exec > r.execute_s ? exec : r.execute_s;
            last_done = it->times.done_us > last_done ? it->times.done_us : last_done;
            batch = it->times.batch_size > batch ? it->times.batch_size : batch;
        }
        r.output_s = seconds_between(last_done, now);
    }
    gw_metrics_request(api->metrics, req->model, &r);
    SQ_DEBUG("request id=%s model=%s version=%d status=%d outcome=%s code=%s slo_ms=%g "
             "priority=%d total_ms=%.3f preprocess_ms=%.3f queue_ms=%.3f execute_ms=%.3f items=%d "
             "batch=%d",
             req->request_id, req->model->name, req->model->version, r.status,
             gw_metrics_outcome(&r), sq_err_name(r.err), r.slo_ms, r.priority, r.total_s * 1e3,
             r.preprocess_s * 1e3, r.queue_s * 1e3, r.execute_s * 1e3, r.items, batch);
}

void gw_metrics_infer_rejected(const struct gw_api_ctx *api, const gw_model_t *m, int err)
{
    gw_metrics_request_t r = {.status = sq_err_http_status(err),
                              .err = err,
                              .slo_ms = m->default_slo_ms > 0 ? m->default_slo_ms
                                                              : api->cfg.default_slo_ms};
    gw_metrics_request(api->metrics, m, &r);
    SQ_DEBUG("request model=%s version=%d status=%d outcome=%s code=%s total_ms=0", m->name,
             m->version, r.status, gw_metrics_outcome(&r), sq_err_name(err));
}
