/* A complex query's routes (gw_catalog.h): POST /v1/pipelines/{p}/infer
 * (raw JPEG or multipart frames) and POST /v2/models/{pipeline}/infer (the
 * pipeline as an OIP model: input IMAGE, one JPEG per frame). Each admits
 * the query, resolves its stages' models now, refuses an SLO no query can
 * meet, splits the body into frames and starts the tree (query.c). The
 * OIP route's query is also another transport's (gw_query_infer_v2: gRPC's
 * ModelInfer), the body given, answered through ext_done. */
#include "gw_dispatch.h"
#include "query_int.h"

#include <sq.h>

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Replies at once (the query never started). */
static void query_reject(gw_query_t *q, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void query_reject(gw_query_t *q, int err, const char *fmt, ...)
{
    atomic_store(&q->fate.failed, 1);
    q->fate.err = err;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(q->fate.detail, sizeof(q->fate.detail), fmt, ap);
    va_end(ap);
    gw_query_done(q);
}

/* Resolves each stage's model now; 0, or an error with why. */
static int resolve_stages(gw_api_ctx_t *api, gw_query_t *q, char *why, size_t len)
{
    const gw_pipeline_t *p = q->p;
    for (int i = 0; i < p->nstages; i++) {
        const gw_stage_spec_t *st = &p->stages[i];
        gw_model_t *m = gw_registry_find(api->registry, st->model, strlen(st->model), st->version);
        q->models[i] = m;
        if (m == NULL) {
            snprintf(why, len, "stage %s: no model %s", st->id, st->model);
            return SQ_MODEL_NOT_FOUND;
        }
        if (strcmp(m->status, "failed") == 0) {
            snprintf(why, len, "stage %s: model %s version %d failed: %s", st->id, m->name,
                     m->version, m->error);
            return SQ_MODEL_FAILED;
        }
        if (strcmp(m->status, "unloaded") == 0) {
            snprintf(why, len,
                     "stage %s: model %s is unloaded; POST /v2/repository/models/%s/load "
                     "serves it again",
                     st->id, m->name, m->name);
            return SQ_MODEL_UNLOADED;
        }
        if (strcmp(m->status, "ready") != 0) {
            snprintf(why, len, "stage %s: model %s is being profiled; retry shortly", st->id,
                     m->name);
            return SQ_NOT_READY;
        }
        if (m->c != 3 || m->h <= 0 || m->w <= 0) {
            snprintf(why, len, "stage %s: model %s no longer takes images", st->id, m->name);
            return SQ_BAD_CONFIG;
        }
        if ((q->kind[i] = gw_sched_serving_kind(gw_api_sched(api), m)) < 0) {
            snprintf(why, len, "stage %s: no worker that can run model %s is up", st->id, m->name);
            return SQ_NO_WORKER;
        }
    }
    for (int i = 0; i < p->nstages; i++) {
        const gw_stage_spec_t *st = &p->stages[i];
        if (st->parent < 0)
            continue;
        q->crops[i] = st->crops;
        char path[96];
        snprintf(path, sizeof(path), "pipeline %s stage %s crops_of", p->name, st->id);
        int rc = gw_crops_spec_bind(&q->crops[i], q->models[st->parent]->name,
                                    q->models[st->parent]->outputs, q->models[st->parent]->noutputs,
                                    path, why, len);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* Whether pipeline p (found) can take a query now: squishd not stopping,
 * p served, and room under --max-inflight (then it is counted in flight:
 * gw_query_dispose leaves). 0, or the error with why. */
static int query_admit(gw_api_ctx_t *api, gw_pipeline_t *p, char *why, size_t len)
{
    if (atomic_load(api->stopping)) {
        snprintf(why, len, "squishd is shutting down");
        return SQ_SHUTTING_DOWN;
    }
    if (atomic_load(&p->unloaded)) {
        snprintf(why, len,
                 "pipeline %s is unloaded; POST /v2/repository/models/%s/load serves it again",
                 p->name, p->name);
        return SQ_MODEL_UNLOADED;
    }
    if (atomic_fetch_add(&api->infer_inflight, 1) >= api->cfg.max_inflight) {
        atomic_fetch_sub(&api->infer_inflight, 1);
        snprintf(why, len, "squishd has --max-inflight requests in flight");
        return SQ_OVERLOAD;
    }
    return 0;
}

/* An admitted query of p (base.app set), taking the reference on p. */
static void query_init(gw_query_t *q, gw_api_ctx_t *api, gw_pipeline_t *p)
{
    q->base.dispose = gw_query_dispose;
    q->base.gone = gw_query_gone;
    q->fate.api = api;
    q->p = p;
    pthread_mutex_init(&q->mu, NULL);
    q->arrival_us = sq_now_us();
    q->priority = GW_PRIORITY_DEFAULT;
    gw_pipeline_arrival(p);
}

/* A query of the pipeline named by the call's first argument, or NULL
 * after replying 404 or 503. */
static gw_query_t *query_new(gw_call_t *call)
{
    gw_api_ctx_t *api = call->app;
    h2o_req_t *hreq = call->req;
    if (atomic_load(api->stopping)) {
        gw_send_error(hreq, SQ_SHUTTING_DOWN, "squishd is shutting down");
        return NULL;
    }
    char name[MDB_NAME_MAX + 1];
    h2o_iovec_t arg = call->args[0];
    if (!gw_model_name_ok(arg.base, arg.len)) {
        gw_send_not_found(call, arg, 0);
        return NULL;
    }
    memcpy(name, arg.base, arg.len);
    name[arg.len] = '\0';
    gw_pipeline_t *p = gw_pipes_get(api->pipelines, name);
    if (p == NULL) {
        gw_send_not_found(call, arg, 0);
        return NULL;
    }
    char why[2 * MDB_NAME_MAX + 96];
    int rc = query_admit(api, p, why, sizeof(why));
    if (rc != 0) {
        gw_pipeline_unref(p);
        gw_send_error(hreq, rc, why);
        return NULL;
    }
    gw_query_t *q = (gw_query_t *)gw_async_new(call, sizeof(gw_query_t));
    query_init(q, api, p);
    gw_async_watch(&q->base);
    gw_request_id(hreq, q->request_id, sizeof(q->request_id));
    return q;
}

/* The SLO (slo_ms <= 0: the pipeline's), the deadlines and the stages'
 * models; 0, or -1 after rejecting. */
static int query_setup(gw_query_t *q, double slo_ms)
{
    gw_api_ctx_t *api = q->base.app;
    q->slo_ms = gw_query_split(q->p, slo_ms, api->cfg.max_request_ms, q->cum_ms, q->budget_ms);
    char why[512];
    int rc = resolve_stages(api, q, why, sizeof(why));
    if (rc != 0) {
        query_reject(q, rc, "%s", why);
        return -1;
    }
    return 0;
}

/* The least SLO the pipeline can meet for these frames
 * (gw_query_least_slo_us: the largest frame's decode counts, so this runs
 * once they are known). A query asking for less is answered at once, 400
 * slo_too_tight saying what to ask for: no retry can help it. 0, or -1
 * after rejecting. */
static int query_feasible(gw_query_t *q, const gw_part_t *frames, int nframes)
{
    gw_api_ctx_t *api = q->base.app;
    for (int i = 0; i < nframes; i++)
        if (frames[i].len > q->frame_len_max)
            q->frame_len_max = frames[i].len;
    const gw_pipeline_t *p = q->p;
    double chain, least;
    int stage;
    least = gw_query_least_slo_us(api, q, &chain, &stage);
    if (q->slo_ms * 1000.0 >= least)
        return 0;
    q->hopeless = 1;
    char from[192] = "";
    /* Triton's timeout is in microseconds: a client that meant ms asked
     * for a thousandth of it (as a model's request, gw_infer_check_feasible). */
    if (q->slo_from_timeout)
        snprintf(from, sizeof(from),
                 " (from parameters.timeout %.0f, which is in microseconds, as Triton's: send "
                 "timeout %.0f or more, or parameters.slo_ms in ms)",
                 q->slo_ms * 1000.0, ceil(least / 1000.0) * 1000.0);
    if (stage < 0)
        query_reject(q, SQ_SLO_TOO_TIGHT,
                     "an SLO of %g ms%s cannot be met: a frame's decode and a batch of one of "
                     "each stage after the other take at least %.1f ms; ask for %.0f ms or more",
                     q->slo_ms, from, chain / 1000.0, ceil(least / 1000.0));
    else
        query_reject(q, SQ_SLO_TOO_TIGHT,
                     "an SLO of %g ms%s cannot be met: stage %s is due %.1f ms after arrival (its "
                     "share of the split), but a frame's decode and a batch of one of each stage "
                     "up to it take at least %.1f ms; ask for %.0f ms or more",
                     q->slo_ms, from, p->stages[stage].id, q->cum_ms[stage],
                     q->cum_ms[stage] * least / (q->slo_ms * 1000.0), ceil(least / 1000.0));
    return -1;
}

/* Both routes' start: the call's query, answered by respond, and the
 * SLO its headers ask for; NULL when it was refused (answered). */
static gw_query_t *query_open(gw_call_t *call, void (*respond)(gw_async_t *, h2o_req_t *),
                              double *slo)
{
    gw_query_t *q = query_new(call);
    if (q == NULL)
        return NULL;
    q->base.respond = respond;
    char why[512];
    int rc = gw_request_slo_ms(call->req, slo, why, sizeof(why));
    if (rc != 0) {
        query_reject(q, rc, "%s", why);
        return NULL;
    }
    return q;
}

void gw_route_pipeline_infer(gw_call_t *call)
{
    gw_api_ctx_t *api = call->app;
    h2o_req_t *hreq = call->req;
    double slo;
    gw_query_t *q = query_open(call, gw_query_respond, &slo);
    if (q == NULL)
        return;
    if (query_setup(q, slo) != 0)
        return;
    if (hreq->entity.len == 0) {
        query_reject(q, SQ_BAD_IMAGE, "empty body: send a JPEG (image/jpeg) or multipart frames");
        return;
    }
    if (gw_request_body(hreq, &q->body, &q->body_len, &q->body_owned) != 0) {
        query_reject(q, SQ_OVERLOAD, "not enough memory to hold the body; retry shortly");
        return;
    }
    char why[512];
    int rc = 0, max = api->cfg.max_images;
    gw_part_t *parts = sq_xcalloc((size_t)max + 1, sizeof(*parts));
    int nparts = 0;
    h2o_iovec_t ct = gw_header(hreq, "content-type");
    if (ct.len >= 9 && strncasecmp(ct.base, "multipart", 9) == 0) {
        char boundary[GW_MULTIPART_MAX_BOUNDARY + 1];
        rc = gw_multipart_boundary(ct.base, ct.len, boundary, sizeof(boundary));
        if (rc != 0)
            snprintf(why, sizeof(why), "multipart/form-data with a valid boundary expected");
        else
            rc = gw_multipart_parse(q->body, q->body_len, boundary, parts, max, &nparts, why,
                                    sizeof(why));
        if (rc == SQ_TOO_LARGE)
            snprintf(why, sizeof(why), "more than %d frames in one request", max);
        if (rc == 0 && nparts == 0) {
            rc = SQ_BAD_MULTIPART;
            snprintf(why, sizeof(why), "no image parts");
        }
    } else {
        parts[0] = (gw_part_t){.data = q->body, .len = q->body_len};
        nparts = 1;
    }
    for (int i = 0; rc == 0 && i < nparts; i++)
        if ((rc = gw_image_type_check(parts[i].data, parts[i].len, why, sizeof(why))) != 0 &&
            nparts > 1) {
            char part[sizeof(why)];
            snprintf(part, sizeof(part), "frame %d: %s", i, why);
            snprintf(why, sizeof(why), "%s", part);
        }
    if (rc != 0) {
        free(parts);
        query_reject(q, rc, "%s", why);
        return;
    }
    if (query_feasible(q, parts, nparts) != 0) {
        free(parts);
        return;
    }
    gw_query_start(q, parts, nparts);
    free(parts);
}

/* ---- over OIP: the pipeline as a model ------------------------------------- */

/* What OIP sees of a pipeline: input IMAGE (BYTES: one JPEG per frame),
 * output RESULT (BYTES: per frame, the /v1 answer's frame as JSON text). */
static void oip_desc(gw_api_ctx_t *api, gw_oip_model_t *d)
{
    memset(d, 0, sizeof(*d));
    d->ninputs = 1;
    snprintf(d->inputs[0].name, sizeof(d->inputs[0].name), "IMAGE");
    d->inputs[0].datatype = GW_OIP_UINT8;
    d->inputs[0].accept = 1u << GW_OIP_BYTES;
    d->inputs[0].item_ndim = 1;
    d->inputs[0].item_shape[0] = 1;
    d->noutputs = 1;
    snprintf(d->outputs[0].name, sizeof(d->outputs[0].name), "RESULT");
    d->outputs[0].item_ndim = 1;
    d->outputs[0].item_shape[0] = 1;
    d->max_batch = api->cfg.max_images;
    d->max_body_bytes = (size_t)api->cfg.max_body_bytes;
}

json_t *gw_pipeline_oip_metadata(gw_pipeline_t *p)
{
    return json_pack("{s:s, s:[s], s:s, s:[{s:s, s:s, s:[i]}], s:[{s:s, s:s, s:[i, i]}]}", "name",
                     p->name, "versions", "1", "platform", "squish_pipeline", "inputs", "name",
                     "IMAGE", "datatype", "BYTES", "shape", -1, "outputs", "name", "RESULT",
                     "datatype", "BYTES", "shape", -1, 1);
}

/* Over OIP, the query's body (q->body: the route's, Triton's binary
 * extension when header_len >= 0) parsed as the pipeline's model request,
 * its SLO (slo_ms <= 0: the body's parameters', else the pipeline's) and
 * priority taken, and its frames started; or the query rejected. */
static void oip_start(gw_query_t *q, double slo, long long header_len)
{
    gw_api_ctx_t *api = q->base.app;
    char why[512];
    gw_oip_model_t desc;
    oip_desc(api, &desc);
    q->oip = sq_xcalloc(1, sizeof(*q->oip));
    int rc =
        gw_oip_request_parse(q->body, q->body_len, header_len, &desc, q->oip, why, sizeof(why));
    if (rc != 0) {
        query_reject(q, rc, "%s", why);
        return;
    }
    if (q->oip->id != NULL && q->oip->id_len < sizeof(q->request_id) &&
        memchr(q->oip->id, '\0', q->oip->id_len) == NULL)
        snprintf(q->request_id, sizeof(q->request_id), "%s", q->oip->id);
    if (slo <= 0 && q->oip->slo_ms > 0) {
        slo = q->oip->slo_ms;
        q->slo_from_timeout = q->oip->slo_is_timeout;
    }
    if (q->oip->priority > 0)
        q->priority = gw_priority_level(q->oip->priority);
    if (query_setup(q, slo) != 0)
        return;
    int n = q->oip->batch;
    gw_part_t *parts = sq_xcalloc((size_t)n + 1, sizeof(*parts));
    for (int i = 0; i < n; i++) {
        parts[i] = (gw_part_t){.data = q->oip->inputs[0].rows[i].data,
                               .len = q->oip->inputs[0].rows[i].len};
        if ((rc = gw_image_type_check(parts[i].data, parts[i].len, why, sizeof(why))) != 0) {
            free(parts);
            query_reject(q, rc, "inputs[0] row %d: %s", i, why);
            return;
        }
    }
    if (query_feasible(q, parts, n) != 0) {
        free(parts);
        return;
    }
    gw_query_start(q, parts, n);
    free(parts);
}

void gw_route_pipeline_infer_v2(gw_call_t *call)
{
    h2o_req_t *hreq = call->req;
    double slo;
    gw_query_t *q = query_open(call, gw_query_respond_oip, &slo);
    if (q == NULL)
        return;
    long long header_len = -1;
    h2o_iovec_t hl = gw_header(hreq, "inference-header-content-length");
    if (hl.len > 0) {
        char buf[24];
        snprintf(buf, sizeof(buf), "%.*s", (int)(hl.len < 23 ? hl.len : 23), hl.base);
        char *end;
        header_len = strtoll(buf, &end, 10);
        if (*end != '\0' || header_len < 1 || (size_t)header_len > hreq->entity.len) {
            query_reject(q, SQ_BAD_REQUEST, "Inference-Header-Content-Length: expected 1..%zu",
                         hreq->entity.len);
            return;
        }
    }
    if (gw_request_body(hreq, &q->body, &q->body_len, &q->body_owned) != 0) {
        query_reject(q, SQ_OVERLOAD, "not enough memory to hold the body; retry shortly");
        return;
    }
    oip_start(q, slo, header_len);
}

int gw_query_infer_v2(gw_api_ctx_t *api, gw_pipeline_t *p, uint8_t *body, size_t len,
                      long long header_len, gw_api_infer_fn fn, void *arg, gw_api_infer_t **h,
                      char *why, size_t whylen)
{
    *h = NULL;
    int rc = query_admit(api, p, why, whylen);
    if (rc != 0) {
        gw_pipeline_unref(p);
        free(body);
        return rc;
    }
    gw_query_t *q = sq_xcalloc(1, sizeof(*q));
    q->base.app = api;
    query_init(q, api, p);
    gw_request_new_id(q->request_id, sizeof(q->request_id));
    q->ext_done = fn;
    q->ext_arg = arg;
    atomic_init(&q->ext_refs, 2);
    q->body = body;
    q->body_len = len;
    q->body_owned = body;
    *h = &q->base;
    /* Parsed and its frames started here, on the transport's thread: fn
     * may be called before this returns. The route's headers carry no
     * SLO here: the body's parameters do. */
    oip_start(q, -1, header_len);
    return 0;
}
