/* KServe v2 inference for another transport (gw_api.h: gRPC's ModelInfer):
 * the route's request without h2o. The model is looked up and admitted as
 * the route admits it (gw_infer_admit), the body parsed and the items
 * started by the route's own code (gw_v2_start), and the answer encoded
 * by it (gw_v2_encode). The request is told done through ext_done, from
 * the thread that finished it, in place of the HTTP loop; it lives until
 * both the transport (which may cancel it until then) and its answer let
 * go (ext_refs). A pipeline's name starts its query instead, as the
 * route does (gw_query_infer_v2), and its handle's answer, cancel and
 * release are the query's. */
#include "gw_dispatch.h"
#include "infer_int.h"

#include <stdlib.h>
#include <string.h>

int gw_api_infer_v2(gw_api_ctx_t *api, const char *name, int version, uint8_t *body, size_t len,
                    long long header_len, gw_api_infer_fn fn, void *arg, gw_api_infer_t **h,
                    char *why, size_t whylen)
{
    *h = NULL;
    int err = 0;
    gw_model_t *m = NULL;
    gw_pipeline_t *p = NULL;
    if (atomic_load(api->stopping)) {
        snprintf(why, whylen, "squishd is shutting down");
        err = SQ_SHUTTING_DOWN;
    } else if ((version == 0 || version == 1) && (p = gw_pipes_get(api->pipelines, name)) != NULL) {
        /* As the route: a pipeline's name (its one version, 1) is its query. */
        return gw_query_infer_v2(api, p, body, len, header_len, fn, arg, h, why, whylen);
    } else if ((m = gw_registry_find(api->registry, name, strlen(name), version)) == NULL) {
        char path[MDB_NAME_MAX + 32];
        snprintf(path, sizeof(path), "/v2/models/%s/infer", name);
        err = gw_not_found_why(api, path, name, version, why, whylen);
    } else if ((err = gw_infer_admit(api, m, why, whylen)) != 0) {
        gw_model_unref(m);
    }
    if (err != 0) {
        free(body);
        return err;
    }
    gw_infer_t *req = sq_xcalloc(1, sizeof(*req));
    req->base.app = api;
    req->base.dispose = gw_v2_dispose;
    gw_infer_init(req, m, GW_API_V2);
    gw_request_new_id(req->request_id, sizeof(req->request_id));
    req->ext_done = fn;
    req->ext_arg = arg;
    atomic_init(&req->ext_refs, 2);
    gw_v2_state_t *st = sq_xcalloc(1, sizeof(*st));
    req->api_state = st;
    snprintf(st->version, sizeof(st->version), "%d", m->version);
    st->header_slo_ms = -1;
    st->header_priority = -1;
    st->header_len = header_len;
    gw_v2_model_desc(m, &api->cfg, &st->desc);
    req->body = body;
    req->body_len = len;
    req->body_owned = body;
    gw_infer_set_deadline(req, -1, &api->cfg);
    *h = &req->base;
    /* Parsed and its items started here, on the transport's thread: fn
     * may be called before this returns. */
    gw_v2_start(req, 0);
    return 0;
}

static void release(gw_infer_t *req)
{
    if (atomic_fetch_sub(&req->ext_refs, 1) != 1)
        return;
    req->base.dispose(&req->base);
    gw_async_dispose_detail(&req->base);
    free(req);
}

void gw_api_infer_answer(gw_api_infer_t *h, gw_api_infer_answer_t *a)
{
    if (gw_query_is(h)) {
        gw_query_answer(h, a);
        gw_query_release(h);
        return;
    }
    gw_infer_t *req = (gw_infer_t *)h;
    memset(a, 0, sizeof(*a));
    sq_buf_init(&a->body);
    a->header_len = -1;
    /* Cancelled (gw_api_infer_cancel only marks it): its error is written
     * here, by the one thread that reads it. */
    int gone = atomic_load(&req->failed) == GW_ABANDONED_GONE;
    if (gone && req->err == 0) {
        req->err = SQ_DEADLINE;
        snprintf(req->err_detail, sizeof(req->err_detail), "the client went away");
    }
    gw_infer_settle(req);
    /* As HTTP's: a request whose client went away has no answer, neither
     * in the metrics nor in its trace line (status 0); its items count
     * as withdrawn. */
    if (gone)
        req->reply_status = 0;
    else
        gw_metrics_infer_answered(req);
    if (atomic_load(&req->failed)) {
        a->err = req->err;
        const char *detail = req->err_detail[0] ? req->err_detail : sq_err_msg(req->err);
        if (!req->slo_refused && req->least_ms > 0 &&
            (req->err == SQ_DEADLINE || req->err == SQ_SLO_TOO_TIGHT))
            gw_infer_failure_why(req, req->least_ms, a->why, sizeof(a->why));
        else
            snprintf(a->why, sizeof(a->why), "%s", detail);
    } else if ((a->err = gw_v2_encode(req, &a->body, &a->header_len, a->why, sizeof(a->why))) !=
               0) {
        req->reply_status = sq_err_http_status(a->err);
        sq_buf_dispose(&a->body);
        sq_buf_init(&a->body);
    }
    req->reply_us = sq_now_us();
    release(req);
}

void gw_api_infer_cancel(gw_api_infer_t *h)
{
    if (gw_query_is(h)) {
        gw_query_cancel(h);
        return;
    }
    gw_infer_t *req = (gw_infer_t *)h;
    int expected = 0;
    /* Only the mark: err and its detail are written by the answer
     * (gw_api_infer_answer), which may already run on another thread. */
    if (atomic_compare_exchange_strong(&req->failed, &expected, GW_ABANDONED_GONE) &&
        atomic_load(&req->pending) > 0)
        gw_sched_withdraw(gw_api_sched(req->base.app));
}

void gw_api_infer_release(gw_api_infer_t *h)
{
    if (h != NULL && gw_query_is(h))
        gw_query_release(h);
    else if (h != NULL)
        release((gw_infer_t *)h);
}
