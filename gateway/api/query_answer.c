/* A complex query's answers (query_int.h): POST /v1/pipelines/{p}/infer's
 * JSON (per frame, each root stage's result nesting one node per
 * detection under its parent; the split; each stage's timing), and over
 * OIP the same frames as RESULT's JSON texts, sent by HTTP or handed to
 * another transport (gw_query_answer). Each counts the query's outcome
 * for /metrics and the pipeline's own figures. */
#include "query_int.h"

#include <sq.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

json_t *gw_query_node_json(const gw_pipeline_t *p, gw_model_t *const *models, const qnode_t *n)
{
    const gw_stage_spec_t *st = &p->stages[n->stage];
    json_t *o = json_object();
    if (st->nchildren == 0) {
        json_object_set_new(o, "predictions", gw_top_k_json(models[n->stage], n->row, st->top_k));
        return o;
    }
    for (int k = 0; k < st->nchildren; k++) {
        json_t *a = json_array();
        for (int i = 0; i < n->nkids[k]; i++) {
            const qnode_t *kid = n->kids[k][i];
            json_t *d = gw_query_node_json(p, models, kid);
            json_object_set_new(
                d, "box",
                json_pack("[f, f, f, f]", kid->det.x0, kid->det.y0, kid->det.x1, kid->det.y1));
            json_object_set_new(d, "score", json_real(kid->det.score));
            /* The detection's class, and its name from the detector's
             * labels where it has them. */
            json_object_set_new(d, "class", json_integer(kid->det.label));
            const json_t *labels = models[n->stage]->labels;
            const json_t *name = json_is_array(labels) && kid->det.label >= 0
                                     ? json_array_get(labels, (size_t)kid->det.label)
                                     : NULL;
            if (json_is_string(name))
                json_object_set_new(d, "label", json_string(json_string_value(name)));
            json_array_append_new(a, d);
        }
        json_object_set_new(o, p->stages[st->children[k]].id, a);
    }
    return o;
}

static void query_count(gw_query_t *q, int64_t now)
{
    gw_query_outcome_t o = gw_query_outcome(&q->fate);
    gw_pipeline_outcome(q->p, o, now - q->arrival_us);
    gw_api_ctx_t *api = q->base.app;
    gw_metrics_pipeline_query(api->metrics, q->p->name,
                              o == GW_Q_OK        ? "ok"
                              : o == GW_Q_DROPPED ? "dropped"
                                                  : "error",
                              (double)(now - q->arrival_us) / 1e6);
}

static void query_headers(gw_query_t *q, h2o_req_t *hreq)
{
    gw_add_header(hreq, "x-request-id", q->request_id);
    char v[32];
    snprintf(v, sizeof(v), "%g", q->slo_ms);
    gw_add_header(hreq, "x-slo-ms", v);
}

/* Frame f: its size and each root stage's result. */
static json_t *frame_json(const gw_query_t *q, int f)
{
    json_t *fr = json_pack("{s:i, s:i}", "width", q->frame_w[f], "height", q->frame_h[f]);
    for (int r = 0; r < q->nroots; r++) {
        const qnode_t *n = q->roots[f * q->nroots + r];
        json_object_set_new(fr, q->p->stages[n->stage].id, gw_query_node_json(q->p, q->models, n));
    }
    return fr;
}

/* Settles a failed query's code before it is counted: one dropped for its
 * deadline on the way (a stage's items refused or dropped by the
 * dispatcher, a frame's decode that could not start in time, crops too
 * late for their stage) whose SLO is below the least the pipeline can
 * meet now (gw_query_least_slo_us) is slo_too_tight, as one refused at
 * the door (query_route.c): no retry can serve it. A gone client's query
 * stays as it is. */
static void query_settle(gw_query_t *q)
{
    gw_query_fate_t *f = &q->fate;
    if (!atomic_load(&f->failed) || q->hopeless || f->err != SQ_DEADLINE ||
        atomic_load(&f->abandoned) == GW_ABANDONED_GONE)
        return;
    double chain;
    q->least_ms = gw_query_least_slo_us(q->base.app, q, &chain, &q->least_stage) / 1000.0;
    q->least_chain_ms = chain / 1000.0;
    if (q->slo_ms < q->least_ms)
        f->err = SQ_SLO_TOO_TIGHT;
}

/* A failed query's message (after query_settle) into why; returns
 * whether a retry can help. One failed for its deadline says the least
 * SLO that can be met now; where its SLO is below it the answer is 400
 * slo_too_tight, without Retry-After (a retry fails the same way),
 * otherwise 503 deadline with Retry-After. */
static int query_failure_why(const gw_query_t *q, char *why, size_t len)
{
    const gw_query_fate_t *f = &q->fate;
    if (!(q->least_ms > 0)) {
        snprintf(why, len, "%s", f->detail);
        return !q->hopeless;
    }
    int retry = f->err == SQ_DEADLINE;
    if (retry)
        snprintf(why, len,
                 "%s, under the current load: SLO %g ms; alone on idle workers the pipeline can "
                 "meet %.1f ms, so a retry can make it, or a larger SLO",
                 f->detail, q->slo_ms, q->least_ms);
    else if (q->least_stage < 0)
        snprintf(why, len,
                 "%s: an SLO of %g ms cannot be met: a frame's decode and a batch of one of each "
                 "stage after the other take at least %.1f ms; ask for %.0f ms or more",
                 f->detail, q->slo_ms, q->least_chain_ms, ceil(q->least_ms));
    else
        snprintf(why, len,
                 "%s: an SLO of %g ms cannot be met: stage %s's share of it is less than a "
                 "frame's decode and a batch of one of each stage up to it take; ask for %.0f ms "
                 "or more",
                 f->detail, q->slo_ms, q->p->stages[q->least_stage].id, ceil(q->least_ms));
    return retry;
}

static void query_send_failure(gw_query_t *q, h2o_req_t *hreq)
{
    char why[sizeof(q->fate.detail) + 384];
    int retry = query_failure_why(q, why, sizeof(why));
    gw_send_error_retry(hreq, q->fate.err, why, retry);
}

/* What both answers do first: the query settled and counted, its
 * headers set, and a failure sent. Returns 0 when the answer is the
 * caller's to send. */
static int query_answer_begin(gw_query_t *q, h2o_req_t *hreq, int64_t now)
{
    query_settle(q);
    query_count(q, now);
    query_headers(q, hreq);
    if (!atomic_load(&q->fate.failed))
        return 0;
    query_send_failure(q, hreq);
    return -1;
}

void gw_query_respond(gw_async_t *a, h2o_req_t *hreq)
{
    gw_query_t *q = (gw_query_t *)a;
    int64_t now = sq_now_us();
    if (query_answer_begin(q, hreq, now) != 0)
        return;
    json_t *frames = json_array();
    for (int f = 0; f < q->nframes; f++)
        json_array_append_new(frames, frame_json(q, f));
    json_t *timing = json_object(), *budgets = json_object(), *deadlines = json_object();
    for (int i = 0; i < q->p->nstages; i++) {
        const stage_timing_t *t = &q->timing[i];
        const char *id = q->p->stages[i].id;
        json_object_set_new(timing, id,
                            json_pack("{s:s, s:i, s:i, s:f, s:f, s:f, s:i}", "model",
                                      q->models[i]->name, "version", q->models[i]->version, "items",
                                      t->items, "queue_ms", t->queue_ms, "execute_ms",
                                      t->execute_ms, "done_ms", t->done_ms, "batch_size",
                                      t->batch_size));
        json_object_set_new(budgets, id, json_real(q->budget_ms[i]));
        json_object_set_new(deadlines, id, json_real(q->cum_ms[i]));
    }
    gw_send_json(hreq, 200,
                 json_pack("{s:s, s:s, s:f, s:f, s:o, s:{s:o, s:o}, s:o}", "pipeline", q->p->name,
                           "id", q->request_id, "slo_ms", q->slo_ms, "latency_ms",
                           (double)(now - q->arrival_us) / 1000.0, "frames", frames, "split",
                           "budgets_ms", budgets, "deadlines_ms", deadlines, "stages", timing));
}

/* Over OIP, a query's answer: output RESULT, per frame the /v1 answer's
 * frame as JSON text. */
static json_t *oip_answer(gw_query_t *q, int64_t now)
{
    json_t *data = json_array();
    for (int f = 0; f < q->nframes; f++) {
        json_t *fr = frame_json(q, f);
        char *txt = sq_json_dumps(fr, JSON_COMPACT);
        json_array_append_new(data, json_string(txt != NULL ? txt : "{}"));
        free(txt);
        json_decref(fr);
    }
    json_t *params = json_pack("{s:f, s:f}", "slo_ms", q->slo_ms, "total_ms",
                               (double)(now - q->arrival_us) / 1000.0);
    for (int i = 0; i < q->p->nstages; i++) {
        char key[GW_PIPE_ID_MAX + 16];
        snprintf(key, sizeof(key), "%s_budget_ms", q->p->stages[i].id);
        json_object_set_new(params, key, json_real(q->budget_ms[i]));
    }
    return json_pack("{s:s, s:s, s:s, s:o, s:[{s:s, s:s, s:[i, i], s:o}]}", "model_name",
                     q->p->name, "model_version", "1", "id", q->request_id, "parameters", params,
                     "outputs", "name", "RESULT", "datatype", "BYTES", "shape", q->nframes, 1,
                     "data", data);
}

void gw_query_respond_oip(gw_async_t *a, h2o_req_t *hreq)
{
    gw_query_t *q = (gw_query_t *)a;
    int64_t now = sq_now_us();
    if (query_answer_begin(q, hreq, now) != 0)
        return;
    gw_send_json(hreq, 200, oip_answer(q, now));
}

void gw_query_answer(gw_api_infer_t *h, gw_api_infer_answer_t *a)
{
    gw_query_t *q = (gw_query_t *)h;
    int64_t now = sq_now_us();
    memset(a, 0, sizeof(*a));
    sq_buf_init(&a->body);
    a->header_len = -1;
    /* Cancelled (gw_query_cancel only marks it): its error is written
     * here, by the one thread that reads it. As HTTP's, a query whose
     * client went away is not counted: it has no answer. */
    gw_query_fate_t *f = &q->fate;
    int gone = atomic_load(&f->abandoned) == GW_ABANDONED_GONE;
    if (gone && !atomic_load(&f->failed)) {
        f->err = SQ_DEADLINE;
        snprintf(f->detail, sizeof(f->detail), "the client went away");
        atomic_store(&f->failed, 1);
    }
    query_settle(q);
    if (!gone)
        query_count(q, now);
    if (atomic_load(&f->failed)) {
        a->err = f->err;
        query_failure_why(q, a->why, sizeof(a->why));
    } else {
        json_t *j = oip_answer(q, now);
        char *txt = sq_json_dumps(j, JSON_COMPACT);
        json_decref(j);
        if (txt == NULL) {
            a->err = SQ_INTERNAL;
            snprintf(a->why, sizeof(a->why), "the answer could not be written");
        } else {
            sq_buf_put(&a->body, txt, strlen(txt));
            free(txt);
        }
    }
}
