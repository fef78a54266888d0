/* POST /v1/pipelines/{p}/infer: a complex query (gw_catalog.h).
 *
 * A query is a tree of nodes: a node is one item (an image or a crop) at
 * one stage. A frame of the request gives one node per root stage; a
 * node of a stage with crop children, once run, gives one node per
 * detection per child stage. Every node is a dispatcher item in its
 * stage's session, due at the query's arrival plus the cumulative budget
 * of its stage (the split, gw_pipeline_deadlines).
 *
 *   HTTP loop:       resolve the stages' models, split the body into
 *                    frames, a decode job per root node
 *   preprocess pool: decode (keeping the original where crops follow),
 *                    and, after a node ran, decode its detections, cut
 *                    and resize each crop into the arena (crop_job)
 *   dispatch thread: the items, like any request's
 *   HTTP loop:       when the last node is done, answer
 *
 * The first node that fails fails the whole query at once: `abandoned`
 * is set, so that its items still queued are not run (batches.c) and no
 * later stage starts for it. Every node finishes exactly once and the
 * query is answered when the last one has. */
#include "gw_dispatch.h"
#include "api_int.h"
#include "gw_codec.h"
#include "gw_catalog.h"

#include <sq.h>

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Detections per node and crop stage at most (a crops_of's max_crops is
 * capped by it). */
#define MAX_DETS GW_DETECT_MAX_CROPS

typedef gw_qnode_t qnode_t;

typedef struct {
    int items;
    double queue_ms, execute_ms, done_ms;
    int batch_size;
} stage_timing_t;

struct gw_query {
    gw_async_t base; /* first */
    gw_pipeline_t *p;
    gw_model_t *models[GW_PIPE_MAX_STAGES];
    gw_crops_spec_t crops[GW_PIPE_MAX_STAGES]; /* bound to the parent's model */
    int kind[GW_PIPE_MAX_STAGES];              /* the serving device kind per stage */
    double cum_ms[GW_PIPE_MAX_STAGES];         /* deadlines from arrival */
    double budget_ms[GW_PIPE_MAX_STAGES];
    int64_t arrival_us;
    double slo_ms;
    int priority;
    char request_id[80];
    int nframes;
    int *frame_w, *frame_h;
    qnode_t **roots; /* nframes * nroots */
    int nroots;
    int root_stage[GW_PIPE_MAX_STAGES];
    atomic_int pending;     /* nodes and crop jobs not finished */
    gw_clump_t roots_clump; /* the frames' roots, handed over together */
    gw_query_fate_t fate;
    int hopeless;       /* refused for an SLO below its least: no retry can help */
    pthread_mutex_t mu; /* nodes list, timings */
    qnode_t *all;
    stage_timing_t timing[GW_PIPE_MAX_STAGES];
    const uint8_t *body;
    size_t body_len;
    uint8_t *body_owned;
    gw_oip_request_t *oip; /* over OIP: the parsed request (its rows are the frames) */
};

/* ---- outcome --------------------------------------------------------------- */

void gw_query_fate_fail(gw_query_fate_t *f, int rc, const char *fmt, ...)
{
    int expected = 0;
    if (atomic_compare_exchange_strong(&f->failed, &expected, 1)) {
        f->err = rc;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(f->detail, sizeof(f->detail), fmt, ap);
        va_end(ap);
    }
    int was = 0; /* a gone client's query stays GW_ABANDONED_GONE */
    atomic_compare_exchange_strong(&f->abandoned, &was, GW_ABANDONED_FAILED);
    if (expected == 0 && f->srv != NULL)
        gw_sched_withdraw(f->srv->sched); /* the first failure */
}

gw_query_outcome_t gw_query_outcome(gw_query_fate_t *f)
{
    return !atomic_load(&f->failed)            ? GW_Q_OK
           : sq_err_http_status(f->err) == 503 ? GW_Q_DROPPED
                                               : GW_Q_FAILED;
}

/* One node or crop job less; the last answers. */
static void query_release(gw_query_t *q)
{
    if (atomic_fetch_sub(&q->pending, 1) == 1)
        gw_async_done(&q->base);
}

static qnode_t *node_new(gw_query_t *q, int frame, int stage, qnode_t *parent)
{
    qnode_t *n = sq_xcalloc(1, sizeof(*n));
    n->q = q;
    n->frame = frame;
    n->stage = stage;
    n->parent = parent;
    n->item.input.in_off = -1;
    n->row = sq_xcalloc((size_t)q->models[stage]->out_elems + 1, sizeof(float));
    pthread_mutex_lock(&q->mu);
    n->next_all = q->all;
    q->all = n;
    pthread_mutex_unlock(&q->mu);
    return n;
}

static void node_fail_early(gw_server_t *srv, qnode_t *n, int rc, const char *detail)
{
    if (n->item.input.in_off >= 0) {
        sq_shm_release(srv->arena, n->item.input.in_off);
        n->item.input.in_off = -1;
    }
    free(n->original);
    n->original = NULL;
    gw_query_fate_fail(&n->q->fate, rc, "stage %s: %s", n->q->p->stages[n->stage].id, detail);
    query_release(n->q);
}

static void crop_job_start(gw_server_t *srv, qnode_t *n);

/* The dispatcher's answer for a node (any thread). */
static void node_finish(gw_item_t *item, int rc, const char *detail)
{
    qnode_t *n = (qnode_t *)item;
    gw_query_t *q = n->q;
    const gw_stage_spec_t *st = &q->p->stages[n->stage];
    pthread_mutex_lock(&q->mu);
    stage_timing_t *t = &q->timing[n->stage];
    t->items++;
    if (rc == 0) {
        double qm = (double)(item->times.sent_us - item->times.ready_us) / 1000.0;
        double em = (double)(item->times.done_us - item->times.sent_us) / 1000.0;
        double dm = (double)(item->times.done_us - q->arrival_us) / 1000.0;
        t->queue_ms = fmax(t->queue_ms, qm);
        t->execute_ms = fmax(t->execute_ms, em);
        t->done_ms = fmax(t->done_ms, dm);
        t->batch_size =
            item->times.batch_size > t->batch_size ? item->times.batch_size : t->batch_size;
    }
    pthread_mutex_unlock(&q->mu);
    if (rc != 0) {
        gw_query_fate_fail(&q->fate, rc, "stage %s: %s", st->id, detail ? detail : sq_err_msg(rc));
        free(n->original);
        n->original = NULL;
        query_release(q);
        return;
    }
    n->ok = 1;
    if (st->nchildren > 0 && !atomic_load(&q->fate.abandoned)) {
        atomic_fetch_add(&q->pending, 1); /* the crop job */
        crop_job_start(q->base.srv, n);
    } else {
        free(n->original);
        n->original = NULL;
    }
    query_release(q);
}

/* Fills in what the dispatcher needs to know of node n's item. */
static void node_ready(gw_server_t *srv, qnode_t *n)
{
    gw_query_t *q = n->q;
    gw_item_t *it = &n->item;
    it->ask.model = q->models[n->stage];
    it->ask.slo_ms = q->budget_ms[n->stage];
    it->ask.priority = (uint8_t)q->priority;
    it->ask.arrival_us = q->arrival_us;
    it->ask.deadline_us = q->arrival_us + (int64_t)(q->cum_ms[n->stage] * 1000.0) + n->extra_us;
    it->owner.out = n->row;
    it->owner.finish = node_finish;
    it->owner.abandoned = &q->fate.abandoned;
    it->pipe.pipeline = q->p;
    it->pipe.stage = n->stage;
    it->pipe.query_slo_ms = q->slo_ms;
    it->ask.input_kind = SQ_INPUT_PIXELS;
    it->owner.clump_next = NULL;
}

/* ---- roots: decode --------------------------------------------------------- */

/* Root n settled: decoded (ready) or failed (NULL). The query's frames
 * reach the dispatcher together, once the last is decoded (gw_clump_t):
 * one arrival per root stage, like a multi-image request's images. Any
 * thread; the caller fails its own root after this, not before (the roots
 * handed over keep the query alive). */
static gw_item_t *root_settle(gw_query_t *q, qnode_t *n)
{
    return gw_clump_settle(&q->roots_clump, n != NULL ? &n->item : NULL);
}

static void root_fail(gw_server_t *srv, qnode_t *n, int rc, const char *detail)
{
    gw_item_t *chain = root_settle(n->q, NULL);
    node_fail_early(srv, n, rc, detail);
    if (chain != NULL)
        gw_sched_submit(srv->sched, chain);
}

static void on_root_decoded(gw_prep_job_t *job, int rc)
{
    qnode_t *n = job->user;
    gw_query_t *q = n->q;
    gw_server_t *srv = q->base.srv;
    if (rc != 0) {
        root_fail(srv, n, rc, job->err[0] ? job->err : sq_err_msg(rc));
        return;
    }
    n->original = job->original;
    n->orig_w = job->original != NULL ? job->info.decoded_width : job->info.width;
    n->orig_h = job->original != NULL ? job->info.decoded_height : job->info.height;
    n->sx = (float)job->info.width / (float)n->orig_w;
    n->sy = (float)job->info.height / (float)n->orig_h;
    q->frame_w[n->frame] = job->info.width;
    q->frame_h[n->frame] = job->info.height;
    if (atomic_load(&q->fate.abandoned)) {
        root_fail(srv, n, SQ_DEADLINE, "its query was dropped");
        return;
    }
    n->item.times.ready_us = sq_now_us();
    node_ready(srv, n);
    gw_item_t *chain = root_settle(q, n);
    if (chain != NULL)
        gw_sched_submit(srv->sched, chain);
}

/* A frame's decode is planned from its own size (issue 23: a 12 MP photo
 * got a budget sized by the decode pool's mean): what it is expected to
 * take beyond the mean the split reserved moves its stage's deadline
 * later, taken from its children's share while each still fits a batch of
 * one after it. */
/* The least a stage's items take once ready: a batch of one on its
 * serving kind, plus the dispatch margin, as the dispatcher plans it
 * (gw_sched_least; the margin alone when unknown). */
static int64_t stage_least_us(gw_server_t *srv, const gw_query_t *q, int stage)
{
    gw_least_t least;
    gw_sched_least(srv->sched, q->models[stage], q->kind[stage], 1, &least);
    return least.run_us + least.margin_us;
}

static int64_t frame_extra_us(gw_server_t *srv, const gw_query_t *q, const qnode_t *n)
{
    double mean_us = gw_prep_pool_decode_us(srv->prep);
    double mine_us = gw_prep_pool_decode_us_for(srv->prep, n->jpeg_len);
    if (!(mine_us > mean_us))
        return 0;
    double extra = mine_us - mean_us;
    const gw_stage_spec_t *st = &q->p->stages[n->stage];
    for (int k = 0; k < st->nchildren; k++) {
        int c = st->children[k];
        double room =
            (q->cum_ms[c] - q->cum_ms[n->stage]) * 1000.0 - (double)stage_least_us(srv, q, c);
        if (extra > room)
            extra = room;
    }
    return extra > 0 ? (int64_t)extra : 0;
}

static void root_start(gw_server_t *srv, qnode_t *n)
{
    gw_query_t *q = n->q;
    const gw_model_t *m = q->models[n->stage];
    int64_t off = sq_shm_alloc(srv->arena, (size_t)m->h * (size_t)m->w * 3);
    if (off < 0) {
        root_fail(srv, n, SQ_OVERLOAD, "no room in the shared-memory arena");
        return;
    }
    n->item.input.in_off = off;
    gw_prep_job_t *job = &n->prep;
    memset(job, 0, sizeof(*job));
    job->data = n->jpeg;
    job->len = n->jpeg_len;
    job->out_w = m->w;
    job->out_h = m->h;
    job->mode = m->nearest ? GW_RESIZE_NEAREST : GW_RESIZE_BILINEAR;
    job->dst = sq_shm_arena_base(srv->arena) + off;
    /* The stage's deadline less the least a batch of one takes. */
    int64_t after_us = stage_least_us(srv, q, n->stage);
    n->extra_us = frame_extra_us(srv, q, n);
    job->deadline_ns =
        (q->arrival_us + (int64_t)(q->cum_ms[n->stage] * 1000.0) + n->extra_us - after_us) * 1000;
    job->keep_original = q->p->stages[n->stage].nchildren > 0;
    /* Crops need no more pixels than the largest input of a stage. */
    for (int s = 0; s < q->p->nstages && job->keep_original; s++) {
        const gw_model_t *sm = q->models[s];
        int side = sm->w > sm->h ? sm->w : sm->h;
        job->keep_cover = side > job->keep_cover ? side : job->keep_cover;
    }
    job->done = on_root_decoded;
    job->user = n;
    int rc = gw_prep_pool_submit(srv->prep, job);
    if (rc != 0)
        root_fail(srv, n, rc == SQ_DEADLINE || rc == SQ_SHUTTING_DOWN ? rc : SQ_OVERLOAD,
                  rc == SQ_DEADLINE ? "the image decoders cannot start this frame in time"
                                    : "the image decoders are saturated");
}

/* ---- crops ----------------------------------------------------------------- */

void gw_query_place_crop(const qnode_t *n, const gw_detection_t *d, gw_rect_t r, qnode_t *kid)
{
    /* The detection in frame pixels: the parent's image sits at its rect
     * in the frame's decoded image, which is sx x sy frame pixels a pixel. */
    float sx = n->sx > 0 ? n->sx : 1, sy = n->sy > 0 ? n->sy : 1;
    kid->det = *d;
    kid->det.x0 = (d->x0 + (float)n->rect_x) * sx;
    kid->det.x1 = (d->x1 + (float)n->rect_x) * sx;
    kid->det.y0 = (d->y0 + (float)n->rect_y) * sy;
    kid->det.y1 = (d->y1 + (float)n->rect_y) * sy;
    kid->rect_x = n->rect_x + r.x;
    kid->rect_y = n->rect_y + r.y;
    kid->sx = n->sx;
    kid->sy = n->sy;
}

typedef struct {
    gw_prep_job_t job;
    qnode_t *n;
} crop_job_t;

/* Cuts child stage c's crops of node n into the arena and submits them,
 * together once all are cut: one arrival in the stage's session, so that at
 * low load they run as one batch at once (handed over one by one, the
 * first would go alone and the rest read as a burst, deferred towards the
 * deadline). Runs on a pool thread. */
static int cut_crops(gw_prep_ctx_t *ctx, gw_query_t *q, qnode_t *n, int k, char *err, size_t errlen)
{
    gw_server_t *srv = q->base.srv;
    const gw_pipeline_t *p = q->p;
    int c = p->stages[n->stage].children[k];
    const gw_model_t *pm = q->models[n->stage], *cm = q->models[c];
    gw_detection_t dets[MAX_DETS];
    int nd = gw_detect(&q->crops[c], n->row, pm->w, pm->h, n->orig_w, n->orig_h, dets, MAX_DETS);
    if (nd < 0) {
        snprintf(err, errlen, "stage %s: cannot decode stage %s's detections", p->stages[c].id,
                 p->stages[n->stage].id);
        return nd;
    }
    gw_pipeline_fanout(q->p, c, nd);
    if (nd == 0)
        return 0;
    /* Too late for even one batch of the child stage: the query is lost. */
    int64_t deadline = q->arrival_us + (int64_t)(q->cum_ms[c] * 1000.0);
    int64_t least = stage_least_us(srv, q, c);
    if (sq_now_us() + least > deadline) {
        snprintf(err, errlen,
                 "stage %s cannot finish in time: %.1f ms of its deadline left, a batch takes "
                 "%.1f ms",
                 p->stages[c].id, (double)(deadline - sq_now_us()) / 1000.0,
                 (double)least / 1000.0);
        return SQ_DEADLINE;
    }
    n->kids[k] = sq_xcalloc((size_t)nd, sizeof(qnode_t *));
    int keep = p->stages[c].nchildren > 0;
    gw_item_t *clump = NULL, **tail = &clump;
    for (int i = 0; i < nd; i++) {
        qnode_t *kid = node_new(q, n->frame, c, n);
        n->kids[k][i] = kid;
        n->nkids[k] = i + 1;
        gw_rect_t r = gw_crop_rect(&q->crops[c], &dets[i], n->orig_w, n->orig_h);
        gw_query_place_crop(n, &dets[i], r, kid);
        atomic_fetch_add(&q->pending, 1);
        int64_t off = sq_shm_alloc(srv->arena, (size_t)cm->h * (size_t)cm->w * 3);
        if (off < 0) {
            node_fail_early(srv, kid, SQ_OVERLOAD, "no room in the shared-memory arena");
            break;
        }
        kid->item.input.in_off = off;
        int rc = gw_crop_resize(ctx, n->original, n->orig_w, n->orig_h, r,
                                sq_shm_arena_base(srv->arena) + off, cm->w, cm->h,
                                cm->nearest ? GW_RESIZE_NEAREST : GW_RESIZE_BILINEAR);
        if (rc == 0 && keep) {
            /* Its own crops come from its region at native size. */
            kid->original = malloc((size_t)r.w * (size_t)r.h * 3);
            if (kid->original == NULL) {
                rc = SQ_NOMEM;
            } else {
                for (int y = 0; y < r.h; y++)
                    memcpy(kid->original + (size_t)y * (size_t)r.w * 3,
                           n->original + ((size_t)(r.y + y) * (size_t)n->orig_w + (size_t)r.x) * 3,
                           (size_t)r.w * 3);
                kid->orig_w = r.w;
                kid->orig_h = r.h;
            }
        }
        if (rc != 0) {
            node_fail_early(srv, kid, rc, "cannot cut a crop");
            break;
        }
        node_ready(srv, kid);
        *tail = &kid->item;
        tail = &kid->item.owner.clump_next;
    }
    /* Those cut, even when one failed: each is answered exactly once (the
     * dispatcher fails them at once, their query being dropped). */
    if (clump != NULL)
        gw_sched_submit(srv->sched, clump);
    return 0;
}

static int crop_work(gw_prep_ctx_t *ctx, gw_prep_job_t *job)
{
    crop_job_t *cj = job->user;
    qnode_t *n = cj->n;
    gw_query_t *q = n->q;
    int rc = 0;
    for (int k = 0; k < q->p->stages[n->stage].nchildren && rc == 0; k++) {
        if (atomic_load(&q->fate.abandoned))
            break;
        rc = cut_crops(ctx, q, n, k, job->err, sizeof(job->err));
    }
    return rc;
}

static void on_crops_done(gw_prep_job_t *job, int rc)
{
    crop_job_t *cj = job->user;
    qnode_t *n = cj->n;
    gw_query_t *q = n->q;
    if (rc != 0)
        gw_query_fate_fail(&q->fate, rc, "%s", job->err[0] ? job->err : sq_err_msg(rc));
    free(n->original);
    n->original = NULL;
    free(cj);
    query_release(q);
}

static void crop_job_start(gw_server_t *srv, qnode_t *n)
{
    crop_job_t *cj = sq_xcalloc(1, sizeof(*cj));
    cj->n = n;
    cj->job.work = crop_work;
    cj->job.done = on_crops_done;
    cj->job.user = cj;
    int rc = gw_prep_pool_submit(srv->prep, &cj->job);
    if (rc != 0) {
        gw_query_fate_fail(&n->q->fate, rc == SQ_SHUTTING_DOWN ? rc : SQ_OVERLOAD,
                           "stage %s: the preprocess pool cannot take its crops",
                           n->q->p->stages[n->stage].id);
        free(n->original);
        n->original = NULL;
        free(cj);
        query_release(n->q);
    }
}

/* ---- the answer ------------------------------------------------------------ */

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
    gw_metrics_pipeline_query(q->base.srv->metrics, q->p->name,
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

static void query_respond(gw_async_t *a, h2o_req_t *hreq)
{
    gw_query_t *q = (gw_query_t *)a;
    int64_t now = sq_now_us();
    query_count(q, now);
    query_headers(q, hreq);
    if (atomic_load(&q->fate.failed)) {
        gw_send_error_retry(hreq, q->fate.err, q->fate.detail, !q->hopeless);
        return;
    }
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

static void query_dispose(gw_async_t *a)
{
    gw_query_t *q = (gw_query_t *)a;
    atomic_fetch_sub(&a->srv->infer_inflight, 1);
    for (qnode_t *n = q->all, *next; n != NULL; n = next) {
        next = n->next_all;
        for (int k = 0; k < GW_PIPE_MAX_STAGES; k++)
            free(n->kids[k]);
        free(n->original);
        free(n->row);
        free(n);
    }
    for (int i = 0; i < GW_PIPE_MAX_STAGES; i++)
        gw_model_unref(q->models[i]);
    gw_pipeline_unref(q->p);
    free(q->roots);
    free(q->frame_w);
    free(q->frame_h);
    free(q->body_owned);
    if (q->oip != NULL) {
        gw_oip_request_dispose(q->oip);
        free(q->oip);
    }
    pthread_mutex_destroy(&q->mu);
}

/* ---- the route ------------------------------------------------------------- */

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
    gw_async_done(&q->base);
}

/* Resolves each stage's model now; 0, or an error with why. */
static int resolve_stages(gw_server_t *srv, gw_query_t *q, char *why, size_t len)
{
    const gw_pipeline_t *p = q->p;
    for (int i = 0; i < p->nstages; i++) {
        const gw_stage_spec_t *st = &p->stages[i];
        gw_model_t *m = gw_registry_find(srv->registry, st->model, strlen(st->model), st->version);
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
        if ((q->kind[i] = gw_sched_serving_kind(srv->sched, m)) < 0) {
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

int gw_query_roots(const gw_pipeline_t *p, int *root_stage)
{
    int n = 0;
    for (int i = 0; i < p->nstages; i++)
        if (p->stages[i].parent < 0)
            root_stage[n++] = i;
    return n;
}

/* Starts the query on its frames (JPEG bytes that stay valid until it is
 * answered). */
static void query_start(gw_query_t *q, const gw_part_t *frames, int nframes)
{
    gw_server_t *srv = q->base.srv;
    const gw_pipeline_t *p = q->p;
    q->nframes = nframes;
    q->nroots = gw_query_roots(p, q->root_stage);
    q->frame_w = sq_xcalloc((size_t)nframes, sizeof(int));
    q->frame_h = sq_xcalloc((size_t)nframes, sizeof(int));
    q->roots = sq_xcalloc((size_t)(nframes * q->nroots), sizeof(qnode_t *));
    /* Every root counts before any starts: one that fails at once must
     * not answer while others are still to start. */
    atomic_store(&q->pending, nframes * q->nroots + 1);
    gw_clump_init(&q->roots_clump, nframes * q->nroots);
    for (int f = 0; f < nframes; f++)
        for (int r = 0; r < q->nroots; r++) {
            qnode_t *n = node_new(q, f, q->root_stage[r], NULL);
            n->jpeg = frames[f].data;
            n->jpeg_len = frames[f].len;
            n->item.owner.index = f * q->nroots + r; /* the clump's order */
            q->roots[f * q->nroots + r] = n;
        }
    for (int i = 0; i < nframes * q->nroots; i++)
        root_start(srv, q->roots[i]);
    query_release(q);
}

/* A query of the pipeline named by the call's first argument, or NULL
 * after replying 404 or 503. */
/* The client went away: nothing more runs for the query (its items still
 * queued are withdrawn, no later stage starts). */
static void query_gone(gw_async_t *a)
{
    gw_query_t *q = (gw_query_t *)a;
    int was = 0;
    atomic_compare_exchange_strong(&q->fate.abandoned, &was, GW_ABANDONED_GONE);
    gw_query_fate_fail(&q->fate, SQ_DEADLINE, "the client went away");
}

static gw_query_t *query_new(gw_call_t *call)
{
    gw_server_t *srv = call->srv;
    h2o_req_t *hreq = call->req;
    if (atomic_load(&srv->stopping)) {
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
    gw_pipeline_t *p = gw_pipes_get(srv->pipelines, name);
    if (p == NULL) {
        gw_send_not_found(call, arg, 0);
        return NULL;
    }
    if (atomic_load(&p->unloaded)) {
        char why[2 * MDB_NAME_MAX + 96];
        snprintf(why, sizeof(why),
                 "pipeline %s is unloaded; POST /v2/repository/models/%s/load serves it again",
                 name, name);
        gw_pipeline_unref(p);
        gw_send_error(hreq, SQ_MODEL_UNLOADED, why);
        return NULL;
    }
    if (atomic_fetch_add(&srv->infer_inflight, 1) >= srv->cfg->max_inflight) {
        atomic_fetch_sub(&srv->infer_inflight, 1);
        gw_pipeline_unref(p);
        gw_send_error(hreq, SQ_OVERLOAD, "squishd has --max-inflight requests in flight");
        return NULL;
    }
    gw_query_t *q = (gw_query_t *)gw_async_new(call, sizeof(gw_query_t));
    q->base.dispose = query_dispose;
    q->base.gone = query_gone;
    gw_async_watch(&q->base);
    q->fate.srv = srv;
    q->p = p;
    pthread_mutex_init(&q->mu, NULL);
    q->arrival_us = sq_now_us();
    q->priority = GW_PRIORITY_DEFAULT;
    gw_request_id(hreq, q->request_id, sizeof(q->request_id));
    gw_pipeline_arrival(p);
    return q;
}

double gw_query_split(gw_pipeline_t *p, double slo_ms, double max_ms, double *cum_ms,
                      double *budget_ms)
{
    double slo = slo_ms > 0 ? slo_ms : p->slo_ms;
    if (slo > max_ms)
        slo = max_ms;
    /* The split is the pipeline's; a query asking for another SLO gets the
     * same shares of its own. */
    gw_pipeline_deadlines(p, cum_ms);
    double scale = slo / p->slo_ms;
    for (int i = 0; i < p->nstages; i++) {
        cum_ms[i] *= scale;
        int par = p->stages[i].parent;
        budget_ms[i] = cum_ms[i] - (par >= 0 ? cum_ms[par] : 0);
    }
    return slo;
}

/* The SLO (slo_ms <= 0: the pipeline's), the deadlines and the stages'
 * models; 0, or -1 after rejecting. */
static int query_setup(gw_query_t *q, double slo_ms)
{
    gw_server_t *srv = q->base.srv;
    q->slo_ms = gw_query_split(q->p, slo_ms, srv->cfg->max_request_ms, q->cum_ms, q->budget_ms);
    char why[512];
    int rc = resolve_stages(srv, q, why, sizeof(why));
    if (rc != 0) {
        query_reject(q, rc, "%s", why);
        return -1;
    }
    /* The least SLO the pipeline can meet: a frame's decode, then on the
     * longest chain of stages a batch of one each (with the dispatch
     * margin). A query asking for less is answered at once, saying so,
     * without Retry-After (issue 23: no retry can help it). */
    const gw_pipeline_t *p = q->p;
    double least_us[GW_PIPE_MAX_STAGES], least = 0;
    for (int k = 0; k < p->nstages; k++) {
        int i = p->order[k]; /* parents before children */
        int par = p->stages[i].parent;
        least_us[i] = (par >= 0 ? least_us[par] : gw_prep_pool_decode_us(srv->prep)) +
                      (double)stage_least_us(srv, q, i);
        least = least_us[i] > least ? least_us[i] : least;
    }
    if (q->slo_ms * 1000.0 < least) {
        q->hopeless = 1;
        query_reject(q, SQ_DEADLINE,
                     "an SLO of %g ms cannot be met: a frame's decode and a batch of one of each "
                     "stage after the other take at least %.1f ms; ask for %.0f ms or more",
                     q->slo_ms, least / 1000.0, ceil(least / 1000.0));
        return -1;
    }
    return 0;
}

void gw_route_pipeline_infer(gw_call_t *call)
{
    gw_server_t *srv = call->srv;
    h2o_req_t *hreq = call->req;
    gw_query_t *q = query_new(call);
    if (q == NULL)
        return;
    q->base.respond = query_respond;
    char why[512];
    double slo;
    int rc = gw_request_slo_ms(hreq, &slo, why, sizeof(why));
    if (rc != 0) {
        query_reject(q, rc, "%s", why);
        return;
    }
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
    int max = srv->cfg->max_images;
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
    query_start(q, parts, nparts);
    free(parts);
}

/* ---- over OIP: the pipeline as a model ------------------------------------- */

/* What OIP sees of a pipeline: input IMAGE (BYTES: one JPEG per frame),
 * output RESULT (BYTES: per frame, the /v1 answer's frame as JSON text). */
static void oip_desc(gw_server_t *srv, gw_oip_model_t *d)
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
    d->max_batch = srv->cfg->max_images;
    d->max_body_bytes = (size_t)srv->cfg->max_body_bytes;
}

json_t *gw_pipeline_oip_metadata(gw_pipeline_t *p)
{
    return json_pack("{s:s, s:[s], s:s, s:[{s:s, s:s, s:[i]}], s:[{s:s, s:s, s:[i, i]}]}", "name",
                     p->name, "versions", "1", "platform", "squish_pipeline", "inputs", "name",
                     "IMAGE", "datatype", "BYTES", "shape", -1, "outputs", "name", "RESULT",
                     "datatype", "BYTES", "shape", -1, 1);
}

static void query_respond_oip(gw_async_t *a, h2o_req_t *hreq)
{
    gw_query_t *q = (gw_query_t *)a;
    int64_t now = sq_now_us();
    query_count(q, now);
    query_headers(q, hreq);
    if (atomic_load(&q->fate.failed)) {
        gw_send_error_retry(hreq, q->fate.err, q->fate.detail, !q->hopeless);
        return;
    }
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
    gw_send_json(hreq, 200,
                 json_pack("{s:s, s:s, s:s, s:o, s:[{s:s, s:s, s:[i, i], s:o}]}", "model_name",
                           q->p->name, "model_version", "1", "id", q->request_id, "parameters",
                           params, "outputs", "name", "RESULT", "datatype", "BYTES", "shape",
                           q->nframes, 1, "data", data));
}

void gw_route_pipeline_infer_v2(gw_call_t *call)
{
    gw_server_t *srv = call->srv;
    h2o_req_t *hreq = call->req;
    gw_query_t *q = query_new(call);
    if (q == NULL)
        return;
    q->base.respond = query_respond_oip;
    char why[512];
    double slo;
    int rc = gw_request_slo_ms(hreq, &slo, why, sizeof(why));
    if (rc != 0) {
        query_reject(q, rc, "%s", why);
        return;
    }
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
    gw_oip_model_t desc;
    oip_desc(srv, &desc);
    q->oip = sq_xcalloc(1, sizeof(*q->oip));
    rc = gw_oip_request_parse(q->body, q->body_len, header_len, &desc, q->oip, why, sizeof(why));
    if (rc != 0) {
        query_reject(q, rc, "%s", why);
        return;
    }
    if (q->oip->id != NULL && q->oip->id_len < sizeof(q->request_id) &&
        memchr(q->oip->id, '\0', q->oip->id_len) == NULL)
        snprintf(q->request_id, sizeof(q->request_id), "%s", q->oip->id);
    if (slo <= 0 && q->oip->slo_ms > 0)
        slo = q->oip->slo_ms;
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
    query_start(q, parts, n);
    free(parts);
}
