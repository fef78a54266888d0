/* An inference request's items' life (infer_int.h): each item (an image
 * or a tensor row) gets an arena slot, a JPEG is decoded into it by the
 * preprocess pool (a tensor row is copied), and the request's items reach
 * the dispatcher together once the last is ready (gw_clump_t); each item
 * finishes exactly once, and the last to finish has the request answered.
 * An item that fails before the dispatcher fails the request, and its
 * others are then answered at once. */
#include "gw_dispatch.h"
#include "infer_int.h"

#include <pl_loop.h>

#include <string.h>

static void finish_off_loop(void *arg)
{
    gw_infer_t *req = arg;
    req->finish(req);
    gw_infer_done(req);
}

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
                gw_sched_withdraw(gw_api_sched(req->base.app));
        }
    }
    if (atomic_fetch_sub(&req->pending, 1) != 1)
        return;
    if (req->finish != NULL && !atomic_load(&req->failed))
        gw_offload(((gw_api_ctx_t *)req->base.app)->offload, finish_off_loop, req);
    else
        gw_infer_done(req);
}

/* Answers an item that never reached the dispatcher (any thread). */
static void item_answer_early(gw_api_ctx_t *api, gw_item_t *item, int rc, const char *detail)
{
    if (item->input.in_off >= 0) {
        sq_shm_release(api->arena, item->input.in_off);
        item->input.in_off = -1;
    }
    gw_item_finish(item, rc, detail);
}

/* The request's ready items, once its last item settled (chain, linked
 * through clump_next): to the dispatcher together, one arrival; or, when
 * another item failed meanwhile, answered at once (the request fails
 * anyway). Touches nothing of the request after the last answer. */
static void hand_over(gw_api_ctx_t *api, gw_item_t *chain)
{
    if (chain == NULL)
        return;
    if (!atomic_load(&chain->owner.req->failed)) {
        gw_sched_submit(gw_api_sched(api), chain);
        return;
    }
    for (gw_item_t *it = chain, *next; it != NULL; it = next) {
        next = it->owner.clump_next;
        it->owner.clump_next = NULL;
        item_answer_early(api, it, SQ_OVERLOAD, NULL);
    }
}

/* Item is ready: it waits for the request's other items (gw_clump_t), and
 * the last to settle hands them all over, with what the dispatcher needs
 * to know of each. */
static void submit(gw_api_ctx_t *api, gw_item_t *item)
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
    hand_over(api, gw_clump_settle(&req->clump, item));
}

/* Fails an item that never reached the dispatcher (any thread). Settled
 * first: while the items it completes the clump with are unanswered, the
 * request stays alive for their hand-over. */
static void item_fail_early(gw_api_ctx_t *api, gw_item_t *item, int rc, const char *detail)
{
    gw_item_t *chain = gw_clump_settle(&item->owner.req->clump, NULL);
    item_answer_early(api, item, rc, detail);
    hand_over(api, chain);
}

static void on_prep_done(gw_prep_job_t *job, int rc)
{
    gw_item_t *item = job->user;
    gw_api_ctx_t *api = item->owner.req->base.app;
    if (rc != 0) {
        item_fail_early(api, item, rc, job->err[0] ? job->err : NULL);
        return;
    }
    /* Another image of the request failed (shed, bad): it is answered with
     * that error as soon as its items are done, so this one need not wait
     * for a batch. */
    if (atomic_load(&item->owner.req->failed)) {
        item_fail_early(api, item, SQ_OVERLOAD, NULL);
        return;
    }
    submit(api, item);
}

/* Allocates the item's arena slot; 0 or SQ_OVERLOAD. */
static int item_slot(gw_api_ctx_t *api, gw_item_t *item, size_t bytes)
{
    int64_t off = sq_shm_alloc(api->arena, bytes);
    if (off < 0)
        return SQ_OVERLOAD;
    item->input.in_off = off;
    return 0;
}

/* The latest moment a decoded image is still of use: its deadline less
 * the least that must follow (a batch of one on the serving device, and
 * the dispatch margin). Decoding it later is work for a certain drop. */
static int64_t decode_deadline_ns(gw_api_ctx_t *api, const gw_infer_t *req)
{
    const gw_model_t *m = req->model;
    gw_least_t least;
    gw_sched_least(gw_api_sched(api), m, gw_sched_serving_kind(gw_api_sched(api), m), 1, &least);
    return (req->deadline_us - least.run_us - least.margin_us) * 1000;
}

/* Starts a JPEG item (any thread). */
void gw_infer_start_jpeg(gw_api_ctx_t *api, gw_item_t *item, const uint8_t *data, size_t len)
{
    gw_model_t *m = item->owner.req->model;
    item->ask.input_kind = SQ_INPUT_PIXELS;
    /* Not a JPEG: 415 at once, however large, not a wait for a decoder. */
    char why[160];
    int rc = gw_image_type_check(data, len, why, sizeof(why));
    if (rc != 0) {
        item_fail_early(api, item, rc, why);
        return;
    }
    if (item_slot(api, item, (size_t)m->h * (size_t)m->w * 3) != 0) {
        item_fail_early(api, item, SQ_OVERLOAD, "no room in the shared-memory arena");
        return;
    }
    gw_prep_job_t *job = &item->owner.req->preps[item->owner.index];
    memset(job, 0, sizeof(*job));
    job->data = data;
    job->len = len;
    job->out_w = m->w;
    job->out_h = m->h;
    job->mode = m->nearest ? GW_RESIZE_NEAREST : GW_RESIZE_BILINEAR;
    job->dst = sq_shm_arena_base(api->arena) + item->input.in_off;
    job->deadline_ns = decode_deadline_ns(api, item->owner.req);
    job->done = on_prep_done;
    job->user = item;
    rc = gw_prep_pool_submit(api->prep, job);
    if (rc == SQ_DEADLINE)
        item_fail_early(api, item, rc,
                        "the image decoders cannot start this image in time for its deadline");
    else if (rc != 0)
        item_fail_early(api, item, rc == SQ_SHUTTING_DOWN ? rc : SQ_OVERLOAD,
                        "the image decoders are saturated");
}

/* Starts a tensor item: the row is copied into the arena as is. */
void gw_infer_start_tensor(gw_api_ctx_t *api, gw_item_t *item, const uint8_t *data, size_t len,
                           int uint8)
{
    item->ask.input_kind = uint8 ? SQ_INPUT_UINT8 : SQ_INPUT_FP32;
    if (item_slot(api, item, len) != 0) {
        item_fail_early(api, item, SQ_OVERLOAD, "no room in the shared-memory arena");
        return;
    }
    memcpy(sq_shm_arena_base(api->arena) + item->input.in_off, data, len);
    item->times.ready_us = sq_now_us();
    submit(api, item);
}
