/* Batches: drives the pure dispatcher core (planner/pl_dispatch.h) with
 * real time. Items enter their session's queue, the core's actions become
 * BATCH frames (arena offsets of the items' inputs) and timers, and a
 * BATCH_DONE finishes the batch's items. Sessions are (model, SLO bucket,
 * input kind): one core queue each; their routes come from planning.c. */
#include "batcher_int.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static void on_timer(sq_loop_t *loop, uint64_t id, void *data);

/* ---- actions of the core ----------------------------------------------- */

/* A batch's rows held by frontends: each frontend is told which of its
 * items are which rows and where the worker takes them (FE_ASSIGN), and
 * sends them there itself. Metadata only: a dozen bytes a row. */
static void send_assignments(gw_dispatch_t *ds, const ds_worker_t *w, uint64_t batch_id,
                             const gw_model_t *m, uint8_t input_kind, uint64_t row_bytes,
                             uint64_t stride, gw_item_t **items, int count)
{
    sq_fe_assign_t *a = sq_xmalloc(sizeof(*a));
    sq_buf_t buf;
    sq_buf_init(&buf);
    uint32_t done_src[SQ_MAX_BATCH_ITEMS];
    int ndone = 0;
    for (int i = 0; i < count; i++) {
        uint32_t src = items[i]->input.src;
        int seen = src == 0;
        for (int k = 0; k < ndone && !seen; k++)
            seen = done_src[k] == src;
        if (seen)
            continue;
        done_src[ndone++] = src;
        a->worker = (uint32_t)w->id;
        snprintf(a->addr, sizeof(a->addr), "%s", w->data_addr);
        a->model_key = m->key;
        a->input_kind = input_kind;
        a->count = (uint32_t)count;
        a->row_bytes = row_bytes;
        a->out_stride = stride;
        a->n = 0;
        for (int j = i; j < count; j++) {
            if (items[j]->input.src != src)
                continue;
            a->slot[a->n] = items[j]->input.fe_slot;
            a->row[a->n++] = (uint32_t)j;
        }
        buf.len = 0;
        sq_fe_assign_encode(&buf, a);
        /* A frontend gone meanwhile: its rows count as absent at the
         * worker (FE_GONE), and its items were failed when it left. */
        ds_fe_send(ds, (int)src - 1, SQ_MSG_FE_ASSIGN, batch_id, buf.data, (uint32_t)buf.len);
    }
    sq_buf_dispose(&buf);
    free(a);
}

static void send_batch(gw_dispatch_t *ds, int worker, int session, uint64_t batch_id,
                       gw_item_t **items, int count)
{
    ds_worker_t *w = ds_worker_at(ds, worker);
    ds_session_t *se = &ds->batch.sessions[session];
    gw_model_t *m = se->model->m;
    uint64_t stride = ((uint64_t)m->out_elems * sizeof(float) + 63) & ~(uint64_t)63;
    /* Rows a frontend holds go from it to the worker, and their outputs
     * back to it: the arena holds outputs only for rows of this process. */
    int own = 0, held = 0;
    for (int i = 0; i < count; i++) {
        if (items[i]->input.src != 0)
            held++;
        else
            own++;
    }
    int64_t out_off = own > 0 ? sq_shm_alloc(ds->arena, stride * (uint64_t)count) : -1;
    int no_data = w != NULL && held > 0 && w->data_addr[0] == '\0';
    if (w == NULL || !w->up || (own > 0 && out_off < 0) || no_data) {
        /* Never sent: the worker is free again and the items fail (no room in
         * the arena means squishd is overloaded). */
        if (out_off >= 0)
            sq_shm_release(ds->arena, out_off);
        for (int i = 0; i < count; i++)
            ds_fail_item(ds, items[i],
                         no_data                  ? SQ_NO_WORKER
                         : own > 0 && out_off < 0 ? SQ_OVERLOAD
                                                  : SQ_WORKER_LOST,
                         no_data ? "the worker takes no rows from frontends (start it with "
                                   "--data-listen)"
                         : own > 0 && out_off < 0 ? "no room for outputs in the shared-memory arena"
                                                  : "worker gone");
        free(items);
        pl_dispatch_batch_done(ds->batch.core, sq_now_us(), worker, batch_id);
        ds_pump(ds);
        return;
    }
    ds_load_t *l = ds_load_find(w, m->key, 0);
    if (l == NULL || l->state != LOAD_DONE) {
        /* The worker was told to unload the model after the core chose it
         * (a plan moving the model): the requests go back to their model. */
        SQ_DEBUG("batch not sent: model=%s not loaded on worker=%d", m->name, w->id);
        if (out_off >= 0)
            sq_shm_release(ds->arena, out_off);
        for (int i = 0; i < count; i++) {
            ds_handle_release(ds, items[i]); /* the core let go of it: it enters anew */
            ds_cmd_resubmit(ds, items[i]);
        }
        free(items);
        pl_dispatch_batch_done(ds->batch.core, sq_now_us(), worker, batch_id);
        ds_update_routes(ds, se->model);
        ds_pump(ds);
        return;
    }
    sq_batch_t *b = sq_xmalloc(sizeof(*b));
    b->has_members = (uint8_t)se->model->is_group;
    if (b->has_members) {
        /* Each member's rows together: one suffix run per member. */
        for (int i = 1; i < count; i++) {
            gw_item_t *x = items[i];
            int j = i;
            for (; j > 0 && items[j - 1]->held.member > x->held.member; j--)
                items[j] = items[j - 1];
            items[j] = x;
        }
        for (int i = 0; i < count; i++)
            b->member[i] = (uint16_t)items[i]->held.member;
    }
    b->model_key = (uint64_t)m->key;
    b->input_kind = se->input_kind;
    b->count = (uint32_t)count;
    b->out_off = out_off >= 0 ? (uint64_t)out_off : 0;
    b->out_stride = stride;
    b->has_sources = held > 0;
    int64_t t = sq_now_us();
    for (int i = 0; i < count; i++) {
        b->in_off[i] = items[i]->input.src == 0 ? (uint64_t)items[i]->input.in_off : 0;
        b->src[i] = items[i]->input.src;
        items[i]->times.sent_us = t;
        items[i]->times.batch_size = count;
    }
    uint64_t in_bytes = ds_input_bytes(m, se->input_kind); /* each input slot it names */
    if (held > 0)
        send_assignments(ds, w, batch_id, m, se->input_kind, in_bytes, stride, items, count);
    sq_buf_t buf;
    sq_buf_init(&buf);
    sq_batch_encode(&buf, b);
    free(b);
    ds_batch_t *rec = sq_xcalloc(1, sizeof(*rec));
    *rec = (ds_batch_t){.id = batch_id,
                        .model_key = m->key,
                        .count = count,
                        .items = items,
                        .out_off = out_off,
                        .out_stride = stride,
                        .sent_us = t,
                        .seq = ++w->job_seq};
    w->inflight = rec;
    gw_region_t *in = ds->batch.regions;
    for (int i = 0; i < count; i++)
        in[i] = items[i]->input.src == 0
                    ? (gw_region_t){.offset = (uint64_t)items[i]->input.in_off, .bytes = in_bytes}
                    : (gw_region_t){.offset = 0, .bytes = 0};
    int sent =
        ds_link_send(ds, worker, SQ_MSG_BATCH, batch_id, buf.data, (uint32_t)buf.len, in, count);
    /* A worker that just died (its connection broken, not yet seen as
     * lost) fails the send: expected when workers crash, and its requests
     * are retried when the loss is seen. Anything else is worth a warning. */
    if (sent == -EPIPE || sent == -ECONNRESET || sent == SQ_NO_WORKER)
        SQ_INFO("batch send failed worker=%d batch=%llu reason=\"%s\" (its requests are retried "
                "when the worker is seen lost)",
                worker, (unsigned long long)batch_id,
                sent == SQ_NO_WORKER ? "no such worker" : strerror(-sent));
    else if (sent != 0)
        SQ_WARN("batch send failed worker=%d batch=%llu code=%d", worker,
                (unsigned long long)batch_id, sent);
    sq_buf_dispose(&buf);
}

typedef struct {
    pl_action_kind_t kind;
    int session, worker, count, reason;
    uint64_t batch_id, request_id;
    int64_t at_us;
    gw_item_t **items;
} act_copy_t;

/* The core's wake-up time: the newest one it asked for. */
static void arm_timer(gw_dispatch_t *ds, int64_t at_us)
{
    if (ds->batch.timer)
        sq_loop_timer_cancel(ds->loop, ds->batch.timer);
    ds->batch.timer = 0;
    if (at_us != PL_NEVER) {
        ds->batch.timer = sq_loop_timer_at(ds->loop, at_us * 1000, on_timer, ds);
        ds->batch.timer_at_us = at_us;
    }
}

/* A drop the core decided: the item answered with its reason (unless it was
 * answered meanwhile, or its prefix group was retired: then it runs in its
 * own model's session). */
static void act_drop(gw_dispatch_t *ds, const act_copy_t *a)
{
    gw_item_t *it = ds_handle_get(ds, a->request_id);
    if (it == NULL)
        return; /* answered already */
    if (ds->aborted) {
        ds_fail_item(ds, it, SQ_SHUTTING_DOWN, "squishd is shutting down");
        return;
    }
    if (a->reason == SQ_NOT_FOUND && a->session >= 0 && a->session < ds->batch.nsessions &&
        ds->batch.sessions[a->session].model != NULL &&
        ds->batch.sessions[a->session].model->is_group && !ds->aborted) {
        /* Its prefix group was retired: the request runs in its own
         * model's session instead. */
        ds_handle_release(ds, it);
        ds_cmd_resubmit(ds, it);
        return;
    }
    if (a->reason == SQ_NOT_FOUND) {
        /* Its session went with its model: a delete, an unload, or the
         * model was marked failed. */
        const ds_model_t *sm = a->session >= 0 && a->session < ds->batch.nsessions
                                   ? ds->batch.sessions[a->session].model
                                   : NULL;
        if (sm != NULL && sm->poisoned)
            ds_fail_item(ds, it, SQ_MODEL_FAILED, sm->failed_why);
        else
            ds_fail_out_of_service(ds, it, 1); /* deleted, unloaded, or coming back */
        return;
    }
    ds_plan_outcome(ds, 0);
    const char *why = a->reason == SQ_DEADLINE      ? "the deadline cannot be met"
                      : a->reason == SQ_OVERLOAD    ? "dropped early to keep batches "
                                                      "within their deadlines"
                      : a->reason == SQ_WORKER_LOST ? "worker lost and no time left to retry"
                      : a->reason == SQ_NO_WORKER   ? "no worker held the model before the deadline"
                                                    : "dropped";
    gw_metrics_drop(ds->metrics, it->ask.model, a->reason);
    ds_fail_item(ds, it, a->reason, why);
}

/* Takes the core's actions (those produced since the last take: a pump with
 * no call into the core in between has nothing to do) and acts on them.
 * Actions are copied first: acting may call into the core again (a send that fails
 * frees the worker), which replaces the core's arrays; such a handler pumps
 * again itself. A timer is armed as it is taken, not in turn with the
 * others: a nested pump takes (and arms) a newer wake-up, which the older
 * one must not replace afterwards (the core says a wake-up time once).
 * Items are named by handles (handle_get): one answered meanwhile, by a
 * nested pump or a shutdown, is skipped, never answered twice. Drops are
 * answered first: an item dropped fails its request, whose other items in
 * a batch of the same take are then withdrawn, not run (issue 23: a
 * request refused for its 8th image ran a batch of the other 7). */
void ds_pump(gw_dispatch_t *ds)
{
    /* Routes placement changed (commands not drained yet) first: no batch
     * goes where a model is no longer, or on routes a plan replaced. */
    for (int i = 0; i < ds->ncmds; i++) {
        ds_model_t *dm = ds->cmds[i].dm;
        if (ds->cmds[i].kind == DS_CMD_ROUTE && dm->routes_stale)
            ds_update_routes(ds, dm);
    }
    const pl_action_t *acts;
    size_t n = pl_dispatch_take(ds->batch.core, &acts);
    if (n == 0)
        return;
    act_copy_t *copy = sq_xcalloc(n, sizeof(*copy));
    for (size_t i = 0; i < n; i++) {
        const pl_action_t *a = &acts[i];
        copy[i] = (act_copy_t){.kind = a->kind,
                               .session = a->session,
                               .worker = a->worker,
                               .count = a->count,
                               .reason = a->reason,
                               .batch_id = a->batch_id,
                               .request_id = a->request_id,
                               .at_us = a->at_us};
        if (a->kind == PL_ACT_SEND) {
            copy[i].items = sq_xcalloc((size_t)(a->count ? a->count : 1), sizeof(gw_item_t *));
            for (int k = 0; k < a->count; k++)
                copy[i].items[k] = ds_handle_get(ds, a->ids[k]);
        }
        if (a->kind == PL_ACT_TIMER)
            arm_timer(ds, a->at_us);
    }
    /* An item is in one action at most, and a request lives until its
     * last item is answered: the items of the sends stay valid across the
     * drops answered here. */
    for (size_t i = 0; i < n; i++)
        if (copy[i].kind == PL_ACT_DROP)
            act_drop(ds, &copy[i]);
    for (size_t i = 0; i < n; i++) {
        act_copy_t *a = &copy[i];
        if (a->kind != PL_ACT_SEND)
            continue;
        int live = 0;
        for (int k = 0; k < a->count; k++) {
            gw_item_t *it = a->items[k];
            if (it != NULL && ds_withdrawn(ds, it))
                continue; /* nothing is run for an answer already lost */
            if (it != NULL)
                a->items[live++] = it;
        }
        a->count = live;
    }
    for (size_t i = 0; i < n; i++) {
        act_copy_t *a = &copy[i];
        SQ_DEBUG("dispatch action kind=%d session=%d worker=%d count=%d at_us=%lld reason=%s",
                 a->kind, a->session, a->worker, a->count, (long long)a->at_us,
                 a->kind == PL_ACT_DROP ? sq_err_name(a->reason) : "-");
        switch (a->kind) {
        case PL_ACT_SEND:
            if (a->count == 0 || ds->aborted) {
                /* Every item answered already (a shutdown, or withdrawn):
                 * the worker is free. */
                free(a->items);
                pl_dispatch_batch_done(ds->batch.core, sq_now_us(), a->worker, a->batch_id);
                ds_pump(ds);
                break;
            }
            send_batch(ds, a->worker, a->session, a->batch_id, a->items, a->count);
            break;
        case PL_ACT_DROP:
            break; /* answered above */
        case PL_ACT_TIMER:
            break; /* armed when taken */
        }
    }
    free(copy);
}

static void on_timer(sq_loop_t *loop, uint64_t id, void *data)
{
    gw_dispatch_t *ds = data;
    (void)loop;
    if (id == ds->batch.timer)
        ds->batch.timer = 0;
    pl_dispatch_timer(ds->batch.core, sq_now_us());
    ds_pump(ds);
}

/* ---- sessions and routes ---------------------------------------------- */

/* The dispatcher session of (model, SLO bucket, input kind, priority
 * level, best effort): its requests batch together; the planner sees the
 * model and the bucket only (every level of one bucket shares its routes,
 * and best effort is planned at the bucket of PL_LOOP_BEST_EFFORT_MS). */
int ds_session_ensure(gw_dispatch_t *ds, ds_model_t *dm, double bucket, uint8_t input_kind,
                      uint8_t priority, uint8_t best_effort, int *created)
{
    *created = 0;
    for (int i = 0; i < ds->batch.nsessions; i++) {
        ds_session_t *s = &ds->batch.sessions[i];
        if (s->model == dm && s->bucket_ms == bucket && s->input_kind == input_kind &&
            s->priority == priority && s->best_effort == best_effort)
            return s->id;
    }
    int max_batch = dm->m->max_batch;
    for (int w = 0; w < ds->nworkers; w++) {
        ds_load_t *l = ds->workers[w] ? ds_load_find(ds->workers[w], dm->key, 0) : NULL;
        if (l != NULL && l->state == LOAD_DONE && l->max_batch < max_batch)
            max_batch = l->max_batch;
    }
    pl_session_cfg_t cfg = {.profile = ds_profile(dm, dm->kind),
                            .slo_us = best_effort ? 0 : (int64_t)(bucket * 1000.0),
                            .best_effort = best_effort,
                            .max_batch = max_batch,
                            .item_bytes = (int64_t)ds_item_bytes(dm->m, input_kind),
                            .priority = priority};
    int id = pl_dispatch_session_add(ds->batch.core, &cfg);
    if (id < 0)
        return id;
    if (id >= ds->batch.capsessions) {
        ds->batch.capsessions = ds->batch.capsessions ? 2 * ds->batch.capsessions : 16;
        while (ds->batch.capsessions <= id)
            ds->batch.capsessions *= 2;
        ds->batch.sessions = sq_xrealloc(ds->batch.sessions, sizeof(*ds->batch.sessions) *
                                                                 (size_t)ds->batch.capsessions);
    }
    ds->batch.sessions[id] = (ds_session_t){.id = id,
                                            .model = dm,
                                            .bucket_ms = bucket,
                                            .input_kind = input_kind,
                                            .priority = priority,
                                            .best_effort = best_effort};
    if (id >= ds->batch.nsessions)
        ds->batch.nsessions = id + 1;
    *created = 1;
    return id;
}

/* The plan's workers that hold the model serve each of its sessions
 * (planning.c decides; before a plan, every worker holding it). */
void ds_update_routes(gw_dispatch_t *ds, ds_model_t *dm)
{
    dm->routes_stale = 0;
    pl_route_t *routes = sq_xcalloc((size_t)ds->nworkers + 1, sizeof(*routes));
    int *holders = sq_xcalloc((size_t)ds->nworkers + 1, sizeof(*holders));
    int nholders = -1; /* counted at the first session of dm */
    int64_t now = sq_now_us();
    for (int s = 0; s < ds->batch.nsessions; s++) {
        if (ds->batch.sessions[s].model != dm)
            continue;
        if (nholders < 0)
            nholders = ds_plan_holders(ds, dm, holders);
        int n =
            ds_plan_routes(ds, &ds->batch.sessions[s], holders, nholders, routes, ds->nworkers + 1);
        pl_dispatch_route_set(ds->batch.core, now, s, routes, n);
    }
    free(holders);
    free(routes);
}

/* Fails it as withdrawn when it is abandoned; 1 if so. */
int ds_withdrawn(gw_dispatch_t *ds, gw_item_t *it)
{
    int why = it->owner.abandoned != NULL ? atomic_load(it->owner.abandoned) : 0;
    if (why == 0)
        return 0;
    int gone = why == GW_ABANDONED_GONE;
    gw_metrics_withdrawn(ds->metrics, it->ask.model, gone ? "client_gone" : "request_failed");
    ds_fail_item(ds, it, SQ_DEADLINE,
                 gone ? "withdrawn: its client went away"
                      : "withdrawn: another item of its request failed");
    return 1;
}

void ds_withdraw_abandoned(gw_dispatch_t *ds)
{
    int64_t now = sq_now_us();
    int any = 0;
    for (uint32_t i = 0; i < ds->batch.nhandles; i++) {
        gw_item_t *it = ds->batch.handles[i].item;
        if (it == NULL || it->owner.abandoned == NULL || atomic_load(it->owner.abandoned) == 0)
            continue;
        /* Queued, not in a batch already (those are answered as they end). */
        if (pl_dispatch_cancel(ds->batch.core, now, it->held.core_session, it->held.core_id) != 0)
            continue;
        ds_withdrawn(ds, it);
        any = 1;
    }
    for (int m = 0; m < ds->nmodels; m++) {
        ds_model_t *dm = ds->models[m];
        int kept = 0;
        for (int k = 0; k < dm->npending; k++) {
            gw_item_t *it = dm->pending[k];
            if (!ds_withdrawn(ds, it))
                dm->pending[kept++] = it;
        }
        dm->npending = kept;
    }
    if (any)
        ds_pump(ds);
}

void ds_enqueue_items(gw_dispatch_t *ds, ds_model_t *dm, gw_item_t **items, int n)
{
    pl_request_t one;
    int one_sess;
    int *sess = n == 1 ? &one_sess : sq_xmalloc(sizeof(*sess) * (size_t)n);
    pl_request_t *reqs = n == 1 ? &one : sq_xmalloc(sizeof(*reqs) * (size_t)n);
    int queued = 0, created = 0;
    for (int i = 0; i < n; i++) {
        gw_item_t *it = items[i];
        /* The planner counts items: a clump of 8 is 8 requests' work. */
        ds_plan_arrival(ds, dm, gw_slo_bucket_ms(it->ask.slo_ms), it);
        int made;
        sess[i] = ds_session_ensure(ds, dm, gw_slo_bucket_ms(it->ask.slo_ms), it->ask.input_kind,
                                    (uint8_t)gw_priority_level(it->ask.priority),
                                    it->ask.best_effort, &made);
        created |= made;
        if (sess[i] < 0)
            ds_fail_item(ds, it, SQ_NOT_READY, "the model has no usable profile");
        else
            queued++;
    }
    /* A session made for them is routed once all exist (the routes of
     * the others change only with loads, unloads and plans, which route
     * the model themselves). */
    if (queued > 0 && (created || dm->routes_stale))
        ds_update_routes(ds, dm);
    /* Per session (the items of one request or frame share one), together:
     * one arrival in the core. */
    int64_t now = sq_now_us();
    for (int i = 0; i < n; i++) {
        int s = sess[i];
        if (s < 0)
            continue;
        int k = 0;
        for (int j = i; j < n; j++) {
            if (sess[j] != s)
                continue;
            items[j]->held.core_session = s;
            reqs[k++] = (pl_request_t){.id = ds_handle_new(ds, items[j]),
                                       .arrival_us = items[j]->ask.arrival_us,
                                       .deadline_us = items[j]->ask.deadline_us};
            sess[j] = -1;
        }
        pl_dispatch_requests(ds->batch.core, now, s, reqs, k);
    }
    if (n > 1) {
        free(reqs);
        free(sess);
    }
}

void ds_enqueue_item(gw_dispatch_t *ds, ds_model_t *dm, gw_item_t *it)
{
    ds_enqueue_items(ds, dm, &it, 1);
}

void ds_flush_pending(gw_dispatch_t *ds, ds_model_t *dm)
{
    gw_item_t **p = dm->pending;
    int n = dm->npending;
    dm->pending = NULL;
    dm->npending = dm->cappending = 0;
    for (int i = 0; i < n; i++)
        ds_enqueue_item(ds, dm, p[i]);
    free(p);
}

void ds_fail_pending(gw_dispatch_t *ds, ds_model_t *dm, int rc, const char *why)
{
    for (int i = 0; i < dm->npending; i++)
        ds_fail_item(ds, dm->pending[i], rc, why);
    dm->npending = 0;
}

/* ---- live profiles ------------------------------------------------------- */

/* How many new ratios between two looks (LIVE_SAMPLES are kept), and how
 * far their median must move from the correction in use to replace it. */
#define LIVE_EVERY 8
#define LIVE_DRIFT 0.25

/* dm's live correction, as other threads see it: its copy replaced by
 * the one in use (none when live_scale is 0). */
static void live_publish(gw_dispatch_t *ds, const ds_model_t *dm)
{
    pthread_mutex_lock(&ds->batch.live_lock);
    for (int i = 0; i < ds->batch.nlive_pub; i++) {
        if (ds->batch.live_pub[i].owner == dm) {
            pl_profile_dispose(&ds->batch.live_pub[i].profile);
            ds->batch.live_pub[i--] = ds->batch.live_pub[--ds->batch.nlive_pub];
        }
    }
    if (dm->live_scale > 0) {
        if (ds->batch.nlive_pub == ds->batch.caplive_pub) {
            ds->batch.caplive_pub = ds->batch.caplive_pub ? 2 * ds->batch.caplive_pub : 8;
            ds->batch.live_pub = sq_xrealloc(ds->batch.live_pub, sizeof(*ds->batch.live_pub) *
                                                                     (size_t)ds->batch.caplive_pub);
        }
        ds_live_pub_t *p = &ds->batch.live_pub[ds->batch.nlive_pub++];
        p->owner = dm;
        p->key = dm->key;
        p->kind = dm->live_kind;
        pl_profile_copy(&p->profile, &dm->live_profile);
    }
    pthread_mutex_unlock(&ds->batch.live_lock);
}

void ds_live_reset(gw_dispatch_t *ds, ds_model_t *dm)
{
    int had = dm->live_scale > 0;
    if (had)
        pl_profile_dispose(&dm->live_profile);
    dm->live_scale = 0;
    dm->live_n = dm->live_next = dm->live_since = 0;
    if (had)
        live_publish(ds, dm);
}

void ds_live_set(gw_dispatch_t *ds, ds_model_t *dm, int kind, double scale)
{
    if (dm->live_scale > 0)
        pl_profile_dispose(&dm->live_profile);
    dm->live_scale = 0;
    if (scale != 1) {
        pl_profile_copy(&dm->live_profile, &dm->m->profile[kind]);
        pl_profile_scale(&dm->live_profile, scale);
        dm->live_scale = scale;
        dm->live_kind = kind;
    }
    live_publish(ds, dm);
    gw_metrics_profile_scale(ds->metrics, dm->m, kind, scale);
    int64_t now = sq_now_us();
    for (int s = 0; s < ds->batch.nsessions; s++)
        if (ds->batch.sessions[s].model == dm)
            pl_dispatch_session_profile(ds->batch.core, now, s, ds_profile(dm, kind));
    ds_plan_invalidate(ds, kind, "profile drift");
}

/* The scheduler's least latency: on the live profile (its correction, when
 * one is in use), under live_lock. */
int gw_dispatch_least(gw_sched_t *s, const gw_model_t *m, int kind, int n, gw_least_t *out)
{
    gw_dispatch_t *ds = (gw_dispatch_t *)s;
    pl_dispatch_opts_t o = ds->cfg.core;
    const pl_profile_t *p = NULL;
    pthread_mutex_lock(&ds->batch.live_lock);
    for (int i = 0; i < ds->batch.nlive_pub; i++)
        if (ds->batch.live_pub[i].key == m->key && ds->batch.live_pub[i].kind == kind) {
            p = &ds->batch.live_pub[i].profile;
            break;
        }
    int rc = gw_sched_least_on(&o, p, m, kind, n, out);
    pthread_mutex_unlock(&ds->batch.live_lock);
    return rc;
}

static int float_cmp(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* A batch of b of dm ran exec_us in its worker's backend. The median of the
 * last LIVE_SAMPLES ratios to the profile's mean l(b) (robust: a batch held
 * up by a page fault or a noisy neighbour moves it by one rank, not by its
 * size) replaces the correction in use when it moved more than LIVE_DRIFT
 * from it: the core's sessions of dm get the corrected profile, and the
 * planner re-plans its kind. */
static void live_sample(gw_dispatch_t *ds, ds_model_t *dm, int b, double exec_us)
{
    int kind = dm->kind;
    if (kind < 0 || !dm->m->has_profile[kind] || exec_us <= 0)
        return;
    double l = pl_latency_us(&dm->m->profile[kind], b, 0);
    if (!(l > 0))
        return;
    dm->live_ratios[dm->live_next] = (float)(exec_us / l);
    dm->live_next = (dm->live_next + 1) % LIVE_SAMPLES;
    if (dm->live_n < LIVE_SAMPLES)
        dm->live_n++;
    if (++dm->live_since < LIVE_EVERY || dm->live_n < LIVE_SAMPLES / 2)
        return;
    dm->live_since = 0;
    float sorted[LIVE_SAMPLES];
    memcpy(sorted, dm->live_ratios, sizeof(float) * (size_t)dm->live_n);
    qsort(sorted, (size_t)dm->live_n, sizeof(float), float_cmp);
    double med = sorted[dm->live_n / 2];
    double cur = dm->live_scale > 0 && dm->live_kind == kind ? dm->live_scale : 1.0;
    if (fabs(med / cur - 1) <= LIVE_DRIFT)
        return;
    double scale = med < 0.1 ? 0.1 : med > 20 ? 20 : med;
    if (fabs(scale - 1) <= LIVE_DRIFT)
        scale = 1; /* back within the margin of the profile: use it as is */
    /* Info, not a warning: it corrects itself (contention on a shared host
     * moves a CPU model's latencies by tens of percent). */
    SQ_INFO("profile drift model=%s version=%d kind=%s measured/profiled=%.2f was=%.2f "
            "samples=%d: re-planning with the measured latencies",
            dm->m->name, dm->m->version, sq_dev_kind_name((sq_dev_kind_t)kind), med, cur,
            dm->live_n);
    ds_live_set(ds, dm, kind, scale);
}

/* ---- worker frames ------------------------------------------------------- */

void ds_on_batch_done(gw_dispatch_t *ds, ds_worker_t *w, const sq_frame_t *f)
{
    sq_batch_done_t done;
    if (sq_batch_done_decode(f, &done) != 0 || w->inflight == NULL || w->inflight->id != f->id) {
        SQ_LOG(ds->aborted ? SQ_LOG_DEBUG : SQ_LOG_WARN,
               "unexpected BATCH_DONE worker=%d batch=%llu", w->id, (unsigned long long)f->id);
        return;
    }
    ds_batch_t *b = w->inflight;
    w->inflight = NULL;
    int64_t t = sq_now_us();
    ds_plan_busy(ds, w->id, t - b->sent_us);
    gw_metrics_batch(ds->metrics, b->items[0]->ask.model, w->id, w->device, b->count,
                     t - b->sent_us, &done);
    pl_dispatch_batch_done(ds->batch.core, t, w->id, b->id);
    const uint8_t *base = sq_shm_arena_base(ds->arena);
    /* Where the worker's run falls on this clock (gw_item_t.exec_*_us). */
    int64_t round_us = t - b->sent_us, worker_us = (int64_t)(done.total_ns / 1000);
    int64_t exec_end_us = t - (round_us > worker_us ? (round_us - worker_us) / 2 : 0);
    int64_t exec_start_us = exec_end_us - (int64_t)(done.exec_ns / 1000);
    if (exec_start_us < b->sent_us)
        exec_start_us = b->sent_us;
    for (int i = 0; i < b->count; i++) {
        gw_item_t *it = b->items[i];
        if (done.code == 0) {
            it->times.exec_start_us = exec_start_us;
            it->times.exec_end_us = exec_end_us;
            gw_model_t *m = it->ask.model;
            if (it->input.src == 0) /* a frontend's row went back to it from the worker */
                memcpy(it->owner.out, base + b->out_off + b->out_stride * (uint64_t)i,
                       (size_t)m->out_elems * sizeof(float));
            ds_handle_release(ds, it);
            ds_release_input(ds, it);
            it->times.done_us = t;
            ds_plan_outcome(ds, it->times.done_us <= it->ask.deadline_us);
            it->owner.finish(it, 0, NULL);
        } else {
            ds_fail_item(ds, it, SQ_DEVICE, done.message);
        }
    }
    if (done.code != 0)
        SQ_WARN("batch failed worker=%d code=%s message=\"%s\"", w->id, sq_err_name(done.code),
                done.message);
    ds_model_t *ran = done.code == 0 ? ds_model_find(ds, b->model_key) : NULL;
    if (ran != NULL) {
        ran->crashes = 0; /* counted are crashes in a row: a crash blamed on it by a
                             worker that died before its answers left was not its */
        live_sample(ds, ran, b->count, (double)done.exec_ns / 1000.0);
    }
    if (b->out_off >= 0)
        sq_shm_release(ds->arena, b->out_off);
    free(b->items);
    free(b);
    ds_pump(ds);
}
