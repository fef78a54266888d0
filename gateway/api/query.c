/* A complex query's tree (gw_catalog.h; its routes in query_route.c).
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
 * query is answered when the last one has (query_answer.c); its routes,
 * which set it up and start it, are in query_route.c. */
#include "gw_dispatch.h"
#include "query_int.h"

#include <sq.h>

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Detections per node and crop stage at most (a crops_of's max_crops is
 * capped by it). */
#define MAX_DETS GW_DETECT_MAX_CROPS

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
    if (expected == 0 && f->api != NULL)
        gw_sched_withdraw(gw_api_sched(f->api)); /* the first failure */
}

gw_query_outcome_t gw_query_outcome(gw_query_fate_t *f)
{
    return !atomic_load(&f->failed)            ? GW_Q_OK
           : sq_err_http_status(f->err) == 503 ? GW_Q_DROPPED
                                               : GW_Q_FAILED;
}

void gw_query_done(gw_query_t *q)
{
    if (q->ext_done != NULL)
        q->ext_done(q->ext_arg, &q->base);
    else
        gw_async_done(&q->base);
}

/* One node or crop job less; the last answers. */
static void query_release(gw_query_t *q)
{
    if (atomic_fetch_sub(&q->pending, 1) == 1)
        gw_query_done(q);
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

static void node_fail_early(gw_api_ctx_t *api, qnode_t *n, int rc, const char *detail)
{
    if (n->item.input.in_off >= 0) {
        sq_shm_release(api->arena, n->item.input.in_off);
        n->item.input.in_off = -1;
    }
    free(n->original);
    n->original = NULL;
    gw_query_fate_fail(&n->q->fate, rc, "stage %s: %s", n->q->p->stages[n->stage].id, detail);
    query_release(n->q);
}

static void crop_job_start(gw_api_ctx_t *api, qnode_t *n);

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
        crop_job_start(q->base.app, n);
    } else {
        free(n->original);
        n->original = NULL;
    }
    query_release(q);
}

/* Fills in what the dispatcher needs to know of node n's item. */
static void node_ready(gw_api_ctx_t *api, qnode_t *n)
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

static void root_fail(gw_api_ctx_t *api, qnode_t *n, int rc, const char *detail)
{
    gw_item_t *chain = root_settle(n->q, NULL);
    node_fail_early(api, n, rc, detail);
    if (chain != NULL)
        gw_sched_submit(gw_api_sched(api), chain);
}

static void on_root_decoded(gw_prep_job_t *job, int rc)
{
    qnode_t *n = job->user;
    gw_query_t *q = n->q;
    gw_api_ctx_t *api = q->base.app;
    if (rc != 0) {
        root_fail(api, n, rc, job->err[0] ? job->err : sq_err_msg(rc));
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
        root_fail(api, n, SQ_DEADLINE, "its query was dropped");
        return;
    }
    n->item.times.ready_us = sq_now_us();
    node_ready(api, n);
    gw_item_t *chain = root_settle(q, n);
    if (chain != NULL)
        gw_sched_submit(gw_api_sched(api), chain);
}

/* The least a stage's items take once ready: a batch of one on its
 * serving kind, plus the dispatch margin, as the dispatcher plans it
 * (gw_sched_least; the margin alone when unknown). */
int64_t gw_query_stage_least_us(gw_api_ctx_t *api, const gw_query_t *q, int stage)
{
    gw_least_t least;
    gw_sched_least(gw_api_sched(api), q->models[stage], q->kind[stage], 1, &least);
    return least.run_us + least.margin_us;
}

/* What the query's frames' decode is planned to take: the decode's p99,
 * which the split reserves, or more for a frame whose size says so (the
 * largest of its frames; frame_len_max before they are started). The
 * pool's mean, used before, named an SLO that about half the frames then
 * missed. *borrow_us: what that frame's decode moves its stage's deadline
 * by (frame_extra_us, uncapped). */
static double frames_decode_us(gw_api_ctx_t *api, const gw_query_t *q, double *borrow_us)
{
    double us = gw_prep_pool_decode_p99_us(api->prep);
    if (!(us > 0))
        us = gw_prep_pool_decode_us(api->prep);
    size_t len = 0;
    for (int f = 0; q->roots != NULL && f < q->nframes * q->nroots; f++)
        if (q->roots[f] != NULL && q->roots[f]->jpeg_len > len)
            len = q->roots[f]->jpeg_len;
    if (len == 0)
        len = q->frame_len_max;
    double mine = len > 0 ? gw_prep_pool_decode_us_for(api->prep, len) : 0;
    double mean = gw_prep_pool_decode_us(api->prep);
    *borrow_us = mine > mean ? mine - mean : 0;
    return mine > us ? mine : us;
}

double gw_query_least_slo_us(gw_api_ctx_t *api, const gw_query_t *q, double *chain_us,
                             int *short_stage)
{
    const gw_pipeline_t *p = q->p;
    double upto_us[GW_PIPE_MAX_STAGES], chain = 0, least = 0;
    double borrow_us;
    const double decode_us = frames_decode_us(api, q, &borrow_us);
    /* A frame's stage with children is due by its decode less what the
     * decode borrows from them (root_start, frame_extra_us: what a large
     * frame's decode takes beyond the mean moves the stage's deadline into
     * its children's share); the borrowed part counts in the children's
     * chain below. A 12 MP photo was refused as hopeless at an SLO it was
     * answered within. */
    const double own_decode_us = decode_us > borrow_us ? decode_us - borrow_us : 0;
    *short_stage = -1;
    for (int k = 0; k < p->nstages; k++) {
        int i = p->order[k]; /* parents before children */
        int par = p->stages[i].parent;
        double l1 = (double)gw_query_stage_least_us(api, q, i);
        upto_us[i] = (par >= 0 ? upto_us[par] : decode_us) + l1;
        chain = upto_us[i] > chain ? upto_us[i] : chain;
        double due_us = par < 0 && p->stages[i].nchildren > 0 ? own_decode_us + l1 : upto_us[i];
        /* Stage i is due at cum_ms[i] / slo_ms of the query's SLO. */
        if (q->cum_ms[i] > 0 && q->slo_ms > 0) {
            double need = due_us * q->slo_ms / q->cum_ms[i];
            if (need > least) {
                least = need;
                *short_stage = i;
            }
        }
    }
    *chain_us = chain;
    if (least <= chain * (1 + 1e-9)) {
        *short_stage = -1;
        least = chain;
    }
    return least;
}

/* A frame's decode is planned from its own size (issue 23: a 12 MP photo
 * got a budget sized by the decode pool's mean): what it is expected to
 * take beyond the mean the split reserved moves its stage's deadline
 * later, taken from its children's share while each still fits a batch of
 * one after it. Before a large file's time per byte is known, the
 * estimate errs long (gw_prep_pool_decode_borrow_us_for): borrowing too
 * much costs the children some slack, too little drops the frame. The
 * least SLO (frames_decode_us) counts the plain estimate instead, so that
 * no query is refused as hopeless by a guess. */
static int64_t frame_extra_us(gw_api_ctx_t *api, const gw_query_t *q, const qnode_t *n)
{
    double mean_us = gw_prep_pool_decode_us(api->prep);
    double mine_us = gw_prep_pool_decode_borrow_us_for(api->prep, n->jpeg_len);
    if (!(mine_us > mean_us))
        return 0;
    double extra = mine_us - mean_us;
    const gw_stage_spec_t *st = &q->p->stages[n->stage];
    for (int k = 0; k < st->nchildren; k++) {
        int c = st->children[k];
        double room = (q->cum_ms[c] - q->cum_ms[n->stage]) * 1000.0 -
                      (double)gw_query_stage_least_us(api, q, c);
        if (extra > room)
            extra = room;
    }
    return extra > 0 ? (int64_t)extra : 0;
}

static void root_start(gw_api_ctx_t *api, qnode_t *n)
{
    gw_query_t *q = n->q;
    const gw_model_t *m = q->models[n->stage];
    int64_t off = sq_shm_alloc(api->arena, (size_t)m->h * (size_t)m->w * 3);
    if (off < 0) {
        root_fail(api, n, SQ_OVERLOAD, "no room in the shared-memory arena");
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
    job->dst = sq_shm_arena_base(api->arena) + off;
    /* The stage's deadline less the least a batch of one takes. */
    int64_t after_us = gw_query_stage_least_us(api, q, n->stage);
    n->extra_us = frame_extra_us(api, q, n);
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
    int rc = gw_prep_pool_submit(api->prep, job);
    if (rc != 0)
        root_fail(api, n, rc == SQ_DEADLINE || rc == SQ_SHUTTING_DOWN ? rc : SQ_OVERLOAD,
                  rc == SQ_DEADLINE ? "the image decoders cannot start this frame in time"
                                    : "the image decoders are saturated");
}

/* ---- crops ----------------------------------------------------------------- */

/* v within [0, hi]; as it is where hi is not known (0). */
static float clamp_to(float v, int hi)
{
    return hi <= 0 ? v : v > 0 ? (v < (float)hi ? v : (float)hi) : 0;
}

void gw_query_place_crop(const qnode_t *n, const gw_detection_t *d, gw_rect_t r, qnode_t *kid)
{
    /* The detection in frame pixels: the parent's image sits at its rect
     * in the frame's decoded image, which is sx x sy frame pixels a pixel.
     * Clamped to the parent's image first, as /v1 answers a detector's
     * boxes: a box the model drew past the image's edge is the same box
     * on both routes. */
    float sx = n->sx > 0 ? n->sx : 1, sy = n->sy > 0 ? n->sy : 1;
    kid->det = *d;
    kid->det.x0 = (clamp_to(d->x0, n->orig_w) + (float)n->rect_x) * sx;
    kid->det.x1 = (clamp_to(d->x1, n->orig_w) + (float)n->rect_x) * sx;
    kid->det.y0 = (clamp_to(d->y0, n->orig_h) + (float)n->rect_y) * sy;
    kid->det.y1 = (clamp_to(d->y1, n->orig_h) + (float)n->rect_y) * sy;
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
    gw_api_ctx_t *api = q->base.app;
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
    int64_t least = gw_query_stage_least_us(api, q, c);
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
        int64_t off = sq_shm_alloc(api->arena, (size_t)cm->h * (size_t)cm->w * 3);
        if (off < 0) {
            node_fail_early(api, kid, SQ_OVERLOAD, "no room in the shared-memory arena");
            break;
        }
        kid->item.input.in_off = off;
        int rc = gw_crop_resize(ctx, n->original, n->orig_w, n->orig_h, r,
                                sq_shm_arena_base(api->arena) + off, cm->w, cm->h,
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
            node_fail_early(api, kid, rc, "cannot cut a crop");
            break;
        }
        node_ready(api, kid);
        *tail = &kid->item;
        tail = &kid->item.owner.clump_next;
    }
    /* Those cut, even when one failed: each is answered exactly once (the
     * dispatcher fails them at once, their query being dropped). */
    if (clump != NULL)
        gw_sched_submit(gw_api_sched(api), clump);
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

static void crop_job_start(gw_api_ctx_t *api, qnode_t *n)
{
    crop_job_t *cj = sq_xcalloc(1, sizeof(*cj));
    cj->n = n;
    cj->job.work = crop_work;
    cj->job.done = on_crops_done;
    cj->job.user = cj;
    int rc = gw_prep_pool_submit(api->prep, &cj->job);
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

/* ---- its start and end ---------------------------------------------------- */

void gw_query_dispose(gw_async_t *a)
{
    gw_query_t *q = (gw_query_t *)a;
    gw_api_ctx_t *api = a->app;
    atomic_fetch_sub(&api->infer_inflight, 1);
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
void gw_query_start(gw_query_t *q, const gw_part_t *frames, int nframes)
{
    gw_api_ctx_t *api = q->base.app;
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
        root_start(api, q->roots[i]);
    query_release(q);
}
/* The client went away: nothing more runs for the query (its items still
 * queued are withdrawn, no later stage starts). */
void gw_query_gone(gw_async_t *a)
{
    gw_query_t *q = (gw_query_t *)a;
    int was = 0;
    atomic_compare_exchange_strong(&q->fate.abandoned, &was, GW_ABANDONED_GONE);
    gw_query_fate_fail(&q->fate, SQ_DEADLINE, "the client went away");
}

int gw_query_is(const gw_api_infer_t *h)
{
    return h->dispose == gw_query_dispose;
}

/* Another transport's client went away: only the mark (as
 * gw_api_infer_cancel's), its items still queued withdrawn; the answer,
 * which may already run on another thread, writes the error
 * (gw_query_answer). */
void gw_query_cancel(gw_api_infer_t *h)
{
    gw_query_t *q = (gw_query_t *)h;
    int was = 0;
    if (atomic_compare_exchange_strong(&q->fate.abandoned, &was, GW_ABANDONED_GONE) &&
        atomic_load(&q->pending) > 0)
        gw_sched_withdraw(gw_api_sched(q->base.app));
}

void gw_query_release(gw_api_infer_t *h)
{
    gw_query_t *q = (gw_query_t *)h;
    if (atomic_fetch_sub(&q->ext_refs, 1) != 1)
        return;
    gw_query_dispose(&q->base);
    gw_async_dispose_detail(&q->base);
    free(q);
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
