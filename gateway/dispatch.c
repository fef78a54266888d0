/* The dispatch thread's data plane: drives the pure dispatcher core
 * (planner/pl_dispatch.h) with real time, loads models onto workers,
 * sends batches as arena offsets, and finishes items from the answers.
 *
 * Routing, until the planner places models: a model is served by every
 * worker of its serving kind, loaded there on its first request; requests
 * that arrive before any worker holds it wait (bounded by their deadline).
 * Sessions are (model, SLO bucket, input kind): one dispatcher queue each.
 * Runs on the workers' loop thread; other threads reach it with
 * sq_loop_post (gw_dispatch_submit and friends). */
#include "gw_dispatch_int.h"
#include "gw_infer.h"
#include "gw_slo.h"

#include <pl_dispatch.h>
#include <wk.h>

#include <assert.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#define TICK_MS 50
#define PROFILE_WARMUP 3
#define PROFILE_REPEATS 8
#define PROFILE_BUDGET_MS 30000

static int64_t now_us(void)
{
    return sq_now_us();
}

/* ---- lookups ----------------------------------------------------------- */

static int has_sha(const ds_worker_t *w, const char *sha)
{
    for (int i = 0; i < w->nshas; i++)
        if (strcmp(w->shas[i], sha) == 0)
            return 1;
    return 0;
}

static ds_model_t *model_find(gw_dispatch_t *ds, int64_t key)
{
    for (int i = 0; i < ds->nmodels; i++)
        if (ds->models[i]->key == key)
            return ds->models[i];
    return NULL;
}

static int kind_usable(gw_server_t *srv, const gw_model_t *m, int kind, int or_coming)
{
    return m->has_profile[kind] && (atomic_load(&srv->kind_up[kind]) > 0 ||
                                    (or_coming && atomic_load(&srv->kind_coming[kind]) > 0));
}

/* The device kind that serves m: one with a worker up, cuda first; else
 * one whose worker is being restarted (its requests wait for it). */
static int kind_of_model(gw_server_t *srv, const gw_model_t *m)
{
    for (int or_coming = 0; or_coming < 2; or_coming++) {
        if (m->emulated) {
            if (kind_usable(srv, m, GW_KIND_EMU, or_coming))
                return GW_KIND_EMU;
            continue;
        }
        if (kind_usable(srv, m, GW_KIND_CUDA, or_coming))
            return GW_KIND_CUDA;
        if (kind_usable(srv, m, GW_KIND_CPU, or_coming))
            return GW_KIND_CPU;
    }
    return -1;
}

int gw_dispatch_serving_kind(gw_server_t *srv, const gw_model_t *m)
{
    return kind_of_model(srv, m);
}

static ds_model_t *model_get(gw_dispatch_t *ds, gw_model_t *m)
{
    ds_model_t *dm = model_find(ds, m->key);
    if (dm != NULL)
        return dm;
    dm = sq_xcalloc(1, sizeof(*dm));
    dm->key = m->key;
    gw_model_ref(m);
    dm->m = m;
    dm->kind = -1;
    dm->profile_worker = -1;
    if (ds->nmodels == ds->capmodels) {
        ds->capmodels = ds->capmodels ? 2 * ds->capmodels : 16;
        ds->models = sq_xrealloc(ds->models, sizeof(*ds->models) * (size_t)ds->capmodels);
    }
    ds->models[ds->nmodels++] = dm;
    return dm;
}

/* ---- handles: the core's names for items -------------------------------- */

static uint64_t handle_new(gw_dispatch_t *ds, gw_item_t *it)
{
    uint32_t i;
    if (ds->free_handle != 0) {
        i = ds->free_handle - 1;
        ds->free_handle = ds->handles[i].next_free;
    } else {
        if (ds->nhandles == ds->caphandles) {
            ds->caphandles = ds->caphandles ? 2 * ds->caphandles : 64;
            ds->handles = sq_xrealloc(ds->handles, sizeof(*ds->handles) * (size_t)ds->caphandles);
        }
        i = ds->nhandles++;
        ds->handles[i] = (ds_handle_t){.gen = 1};
    }
    ds->handles[i].item = it;
    ds->handles[i].next_free = 0;
    it->core_id = (uint64_t)ds->handles[i].gen << 32 | i;
    return it->core_id;
}

/* The item the core's id names, or NULL when it was answered since. */
static gw_item_t *handle_get(const gw_dispatch_t *ds, uint64_t id)
{
    uint32_t i = (uint32_t)id, gen = (uint32_t)(id >> 32);
    if (i >= ds->nhandles || ds->handles[i].gen != gen)
        return NULL;
    return ds->handles[i].item;
}

static void handle_release(gw_dispatch_t *ds, gw_item_t *it)
{
    if (it->core_id == 0)
        return;
    uint32_t i = (uint32_t)it->core_id;
    assert(i < ds->nhandles && ds->handles[i].item == it);
    ds->handles[i].item = NULL;
    ds->handles[i].gen = ds->handles[i].gen + 1 ? ds->handles[i].gen + 1 : 1;
    ds->handles[i].next_free = ds->free_handle;
    ds->free_handle = i + 1;
    it->core_id = 0;
}

/* ---- finishing items --------------------------------------------------- */

static void release_input(gw_dispatch_t *ds, gw_item_t *it)
{
    if (it->in_off >= 0) {
        sq_shm_release(ds->srv->arena, it->in_off);
        it->in_off = -1;
    }
}

/* Answers it: the one place, with on_batch_done's success path, where an
 * item leaves the dispatcher. */
static void fail_item(gw_dispatch_t *ds, gw_item_t *it, int rc, const char *detail)
{
    handle_release(ds, it);
    release_input(ds, it);
    it->done_us = now_us();
    it->finish(it, rc, detail);
}

/* ---- the link to the workers --------------------------------------------- */

static int link_send(gw_dispatch_t *ds, int worker, uint16_t type, uint64_t id, const void *payload,
                     uint32_t len, const gw_region_t *regions, int nregions)
{
    gw_transport_t *t = ds->srv->transport;
    return t != NULL ? t->send(t, worker, type, id, payload, len, regions, nregions) : SQ_NO_WORKER;
}

static int link_send_ref(gw_dispatch_t *ds, int worker, uint16_t type, uint64_t id,
                         sq_bytes_t *bytes, size_t off, uint32_t len)
{
    gw_transport_t *t = ds->srv->transport;
    return t != NULL ? t->send_ref(t, worker, type, id, bytes, off, len) : SQ_NO_WORKER;
}

/* ---- actions of the core ----------------------------------------------- */

static void on_timer(sq_loop_t *loop, uint64_t id, void *data);
static void pump(gw_dispatch_t *ds);
static void on_submit(sq_loop_t *loop, void *arg);
static void update_routes(gw_dispatch_t *ds, ds_model_t *dm);
static void unload(gw_dispatch_t *ds, ds_worker_t *w, ds_load_t *l);

static void send_batch(gw_dispatch_t *ds, int worker, int session, uint64_t batch_id,
                       gw_item_t **items, int count)
{
    ds_worker_t *w = ds_worker_at(ds, worker);
    ds_session_t *se = &ds->sessions[session];
    gw_model_t *m = se->model->m;
    uint64_t stride = ((uint64_t)m->out_elems * sizeof(float) + 63) & ~(uint64_t)63;
    int64_t out_off = sq_shm_alloc(ds->srv->arena, stride * (uint64_t)count);
    if (w == NULL || !w->up || out_off < 0) {
        /* Never sent: the worker is free again and the items fail (no room in
         * the arena means squishd is overloaded). */
        if (out_off >= 0)
            sq_shm_release(ds->srv->arena, out_off);
        for (int i = 0; i < count; i++)
            fail_item(ds, items[i], out_off < 0 ? SQ_OVERLOAD : SQ_WORKER_LOST,
                      out_off < 0 ? "no room for outputs in the shared-memory arena"
                                  : "worker gone");
        free(items);
        pl_dispatch_batch_done(ds->core, now_us(), worker, batch_id);
        pump(ds);
        return;
    }
    ds_load_t *l = ds_load_find(w, m->key, 0);
    if (l == NULL || l->state != LOAD_DONE) {
        /* The worker was told to unload the model after the core chose it
         * (a plan moving the model): the requests go back to their model. */
        SQ_DEBUG("batch not sent: model=%s not loaded on worker=%d", m->name, w->id);
        sq_shm_release(ds->srv->arena, out_off);
        for (int i = 0; i < count; i++) {
            handle_release(ds, items[i]); /* the core let go of it: it enters anew */
            sq_loop_post(ds->loop, on_submit, items[i]);
        }
        free(items);
        pl_dispatch_batch_done(ds->core, now_us(), worker, batch_id);
        update_routes(ds, se->model);
        pump(ds);
        return;
    }
    sq_batch_t *b = sq_xmalloc(sizeof(*b));
    b->has_members = (uint8_t)se->model->is_group;
    if (b->has_members) {
        /* Each member's rows together: one suffix run per member. */
        for (int i = 1; i < count; i++) {
            gw_item_t *x = items[i];
            int j = i;
            for (; j > 0 && items[j - 1]->member > x->member; j--)
                items[j] = items[j - 1];
            items[j] = x;
        }
        for (int i = 0; i < count; i++)
            b->member[i] = (uint16_t)items[i]->member;
    }
    b->model_key = (uint64_t)m->key;
    b->input_kind = se->input_kind;
    b->count = (uint32_t)count;
    b->out_off = (uint64_t)out_off;
    b->out_stride = stride;
    int64_t t = now_us();
    for (int i = 0; i < count; i++) {
        b->in_off[i] = (uint64_t)items[i]->in_off;
        items[i]->sent_us = t;
        items[i]->batch_size = count;
    }
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
    /* The input slots it names: pixels at the model's input size, or a
     * tensor row of its input type. */
    uint64_t elems = (uint64_t)m->c * (uint64_t)m->h * (uint64_t)m->w;
    uint64_t in_bytes = se->input_kind == SQ_INPUT_PIXELS ? (uint64_t)m->h * (uint64_t)m->w * 3
                        : se->input_kind == SQ_INPUT_FP32 ? elems * sizeof(float)
                                                          : elems;
    gw_region_t *in = ds->regions;
    for (int i = 0; i < count; i++)
        in[i] = (gw_region_t){.offset = (uint64_t)items[i]->in_off, .bytes = in_bytes};
    int sent =
        link_send(ds, worker, SQ_MSG_BATCH, batch_id, buf.data, (uint32_t)buf.len, in, count);
    if (sent != 0)
        SQ_WARN("batch send failed worker=%d batch=%llu", worker, (unsigned long long)batch_id);
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
    if (ds->timer)
        sq_loop_timer_cancel(ds->loop, ds->timer);
    ds->timer = 0;
    if (at_us != PL_NEVER)
        ds->timer = sq_loop_timer_at(ds->loop, at_us * 1000, on_timer, ds);
}

/* Takes the core's actions (those produced since the last take: a pump with
 * no call into the core in between has nothing to do) and acts on them. Actions are
 * copied first: acting may call into the core again (a send that fails
 * frees the worker), which replaces the core's arrays; such a handler pumps
 * again itself. A timer is armed as it is taken, not in turn with the
 * others: a nested pump takes (and arms) a newer wake-up, which the older
 * one must not replace afterwards (the core says a wake-up time once).
 * Items are named by handles (handle_get): one answered meanwhile, by a
 * nested pump or a shutdown, is skipped, never answered twice. */
static void pump(gw_dispatch_t *ds)
{
    {
        const pl_action_t *acts;
        size_t n = pl_dispatch_take(ds->core, &acts);
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
                copy[i].items = sq_xcalloc((size_t)a->count, sizeof(gw_item_t *));
                int live = 0;
                for (int k = 0; k < a->count; k++) {
                    gw_item_t *it = handle_get(ds, a->ids[k]);
                    if (it != NULL)
                        copy[i].items[live++] = it;
                }
                copy[i].count = live;
            }
            if (a->kind == PL_ACT_TIMER)
                arm_timer(ds, a->at_us);
        }
        for (size_t i = 0; i < n; i++) {
            act_copy_t *a = &copy[i];
            SQ_DEBUG("dispatch action kind=%d session=%d worker=%d count=%d at_us=%lld reason=%s",
                     a->kind, a->session, a->worker, a->count, (long long)a->at_us,
                     a->kind == PL_ACT_DROP ? sq_err_name(a->reason) : "-");
            switch (a->kind) {
            case PL_ACT_SEND:
                if (a->count == 0 || ds->aborted) {
                    /* Every item answered already (a shutdown): the worker is free. */
                    free(a->items);
                    pl_dispatch_batch_done(ds->core, now_us(), a->worker, a->batch_id);
                    pump(ds);
                    break;
                }
                send_batch(ds, a->worker, a->session, a->batch_id, a->items, a->count);
                break;
            case PL_ACT_DROP: {
                gw_item_t *it = handle_get(ds, a->request_id);
                if (it == NULL)
                    break; /* answered already */
                if (ds->aborted) {
                    fail_item(ds, it, SQ_SHUTTING_DOWN, "squishd is shutting down");
                    break;
                }
                if (a->reason == SQ_NOT_FOUND && a->session >= 0 && a->session < ds->nsessions &&
                    ds->sessions[a->session].model != NULL &&
                    ds->sessions[a->session].model->is_group && !ds->aborted) {
                    /* Its prefix group was retired: the request runs in
                     * its own model's session instead. */
                    handle_release(ds, it);
                    sq_loop_post(ds->loop, on_submit, it);
                    break;
                }
                if (a->reason == SQ_NOT_FOUND) {
                    /* Its session went with its model: a delete, or the
                     * model was marked failed. */
                    const ds_model_t *sm = a->session >= 0 && a->session < ds->nsessions
                                               ? ds->sessions[a->session].model
                                               : NULL;
                    if (sm != NULL && sm->poisoned)
                        fail_item(ds, it, SQ_MODEL_FAILED, sm->failed_why);
                    else
                        fail_item(ds, it, SQ_MODEL_NOT_FOUND, "the model was deleted");
                    break;
                }
                gw__plan_outcome(ds, 0);
                const char *why =
                    a->reason == SQ_DEADLINE      ? "the deadline cannot be met"
                    : a->reason == SQ_OVERLOAD    ? "dropped early to keep batches "
                                                    "within their deadlines"
                    : a->reason == SQ_WORKER_LOST ? "worker lost and no time left to retry"
                    : a->reason == SQ_NO_WORKER   ? "no worker held the model before the deadline"
                                                  : "dropped";
                gw_metrics_drop(ds->srv->metrics, it->model, a->reason);
                fail_item(ds, it, a->reason, why);
                break;
            }
            case PL_ACT_TIMER:
                break; /* armed when taken */
            }
        }
        free(copy);
    }
}

static void on_timer(sq_loop_t *loop, uint64_t id, void *data)
{
    gw_dispatch_t *ds = data;
    (void)loop;
    if (id == ds->timer)
        ds->timer = 0;
    pl_dispatch_timer(ds->core, now_us());
    pump(ds);
}

/* ---- sessions and routes ---------------------------------------------- */

static int ensure_session(gw_dispatch_t *ds, ds_model_t *dm, double bucket, uint8_t input_kind)
{
    for (int i = 0; i < ds->nsessions; i++) {
        ds_session_t *s = &ds->sessions[i];
        if (s->model == dm && s->bucket_ms == bucket && s->input_kind == input_kind)
            return s->id;
    }
    int max_batch = dm->m->max_batch;
    for (int w = 0; w < ds->nworkers; w++) {
        ds_load_t *l = ds->workers[w] ? ds_load_find(ds->workers[w], dm->key, 0) : NULL;
        if (l != NULL && l->state == LOAD_DONE && l->max_batch < max_batch)
            max_batch = l->max_batch;
    }
    pl_session_cfg_t cfg = {.profile = &dm->m->profile[dm->kind],
                            .slo_us = (int64_t)(bucket * 1000.0),
                            .max_batch = max_batch};
    int id = pl_dispatch_session_add(ds->core, &cfg);
    if (id < 0)
        return id;
    if (id >= ds->capsessions) {
        ds->capsessions = ds->capsessions ? 2 * ds->capsessions : 16;
        while (ds->capsessions <= id)
            ds->capsessions *= 2;
        ds->sessions = sq_xrealloc(ds->sessions, sizeof(*ds->sessions) * (size_t)ds->capsessions);
    }
    ds->sessions[id] =
        (ds_session_t){.id = id, .model = dm, .bucket_ms = bucket, .input_kind = input_kind};
    if (id >= ds->nsessions)
        ds->nsessions = id + 1;
    return id;
}

/* The plan's workers that hold the model serve each of its sessions
 * (planning.c decides; before a plan, every worker holding it). */
static void update_routes(gw_dispatch_t *ds, ds_model_t *dm)
{
    pl_route_t *routes = sq_xcalloc((size_t)ds->nworkers + 1, sizeof(*routes));
    for (int s = 0; s < ds->nsessions; s++) {
        if (ds->sessions[s].model != dm)
            continue;
        int n = gw__plan_routes(ds, &ds->sessions[s], routes, ds->nworkers + 1);
        pl_dispatch_route_set(ds->core, now_us(), s, routes, n);
    }
    free(routes);
}

static int loaded_anywhere(gw_dispatch_t *ds, ds_model_t *dm, int *loading)
{
    int loaded = 0;
    *loading = 0;
    for (int i = 0; i < ds->nworkers; i++) {
        ds_worker_t *w = ds->workers[i];
        ds_load_t *l = w && w->up ? ds_load_find(w, dm->key, 0) : NULL;
        if (l == NULL)
            continue;
        loaded += l->state == LOAD_DONE && !w->profiling;
        *loading += l->state == LOAD_WAIT_BYTES || l->state == LOAD_SENT;
    }
    return loaded;
}

/* Whether a worker that holds dm is only out of service while it measures
 * a model (its requests can wait for it). */
static int held_while_profiling(gw_dispatch_t *ds, ds_model_t *dm)
{
    for (int i = 0; i < ds->nworkers; i++) {
        ds_worker_t *w = ds->workers[i];
        ds_load_t *l = w && w->up && w->profiling ? ds_load_find(w, dm->key, 0) : NULL;
        if (l != NULL && l->state == LOAD_DONE)
            return 1;
    }
    return 0;
}

/* Whether a worker of dm's kind being restarted should be back, and run a
 * batch of one, before the item's deadline. */
static int back_in_time(gw_dispatch_t *ds, const ds_model_t *dm, const gw_item_t *it)
{
    if (dm->kind < 0 || atomic_load(&ds->srv->kind_coming[dm->kind]) == 0)
        return 0;
    double l1 = dm->m->has_profile[dm->kind] ? pl_latency_us(&dm->m->profile[dm->kind], 1, 0) : 0;
    int64_t back = atomic_load(&ds->srv->kind_back_at_us[dm->kind]);
    return back != INT64_MAX && back + (int64_t)l1 < it->deadline_us;
}

static void enqueue_item(gw_dispatch_t *ds, ds_model_t *dm, gw_item_t *it)
{
    gw__plan_arrival(ds, dm, gw_slo_bucket_ms(it->slo_ms));
    int s = ensure_session(ds, dm, gw_slo_bucket_ms(it->slo_ms), it->input_kind);
    if (s < 0) {
        fail_item(ds, it, SQ_NOT_READY, "the model has no usable profile");
        return;
    }
    update_routes(ds, dm);
    pl_dispatch_request(ds->core, now_us(), handle_new(ds, it), s, it->arrival_us, it->deadline_us);
}

static void flush_pending(gw_dispatch_t *ds, ds_model_t *dm)
{
    gw_item_t **p = dm->pending;
    int n = dm->npending;
    dm->pending = NULL;
    dm->npending = dm->cappending = 0;
    for (int i = 0; i < n; i++)
        enqueue_item(ds, dm, p[i]);
    free(p);
}

static void fail_pending(gw_dispatch_t *ds, ds_model_t *dm, int rc, const char *why)
{
    for (int i = 0; i < dm->npending; i++)
        fail_item(ds, dm->pending[i], rc, why);
    dm->npending = 0;
}

static void end_profile(gw_dispatch_t *ds, ds_model_t *dm, ds_worker_t *w);

/* Takes dm out of service: its sessions leave the core (which answers
 * what they queued) and every worker holding it unloads it. */
static void withdraw(gw_dispatch_t *ds, ds_model_t *dm)
{
    /* A measurement under way is abandoned: the worker is free for the next
     * one (the unload below follows it on the same connection, and its late
     * answers are ignored, see gw_dispatch_frame). */
    if (dm->profile_worker >= 0)
        end_profile(ds, dm, ds_worker_at(ds, dm->profile_worker));
    for (int s = 0; s < ds->nsessions; s++)
        if (ds->sessions[s].model == dm)
            pl_dispatch_session_remove(ds->core, now_us(), s);
    for (int i = 0; i < ds->nworkers; i++) {
        ds_worker_t *w = ds->workers[i];
        ds_load_t *l = w ? ds_load_find(w, dm->key, 0) : NULL;
        if (l != NULL && w->up && l->state != LOAD_NONE)
            unload(ds, w, l);
    }
}

/* ---- loading models ---------------------------------------------------- */

static void send_load(gw_dispatch_t *ds, ds_model_t *dm, ds_worker_t *w);

typedef struct {
    gw_dispatch_t *ds;
    int64_t key;
    int rc;
    void *bytes;
    size_t len;
} blob_job_t;

static void on_blob(sq_loop_t *loop, void *arg)
{
    blob_job_t *j = arg;
    gw_dispatch_t *ds = j->ds;
    (void)loop;
    ds_model_t *dm = model_find(ds, j->key);
    if (dm == NULL || dm->removed || ds->aborted) {
        free(j->bytes);
        free(j);
        return;
    }
    if (j->rc != 0) {
        dm->blob_state = 3;
        SQ_ERROR("cannot read model bytes key=%lld", (long long)j->key);
    } else {
        dm->blob_state = 2;
        dm->blob = sq_bytes_adopt(j->bytes, j->len);
        dm->blob_len = j->len;
    }
    for (int i = 0; i < ds->nworkers; i++) {
        ds_worker_t *w = ds->workers[i];
        ds_load_t *l = w ? ds_load_find(w, dm->key, 0) : NULL;
        if (l != NULL && l->state == LOAD_WAIT_BYTES) {
            if (dm->blob_state == 2) {
                send_load(ds, dm, w);
            } else {
                l->state = LOAD_FAILED;
            }
        }
    }
    if (dm->blob_state == 3)
        fail_pending(ds, dm, SQ_DB, "the model's bytes cannot be read");
    free(j);
}

static void blob_job(mdb_t *db, void *arg)
{
    blob_job_t *j = arg;
    j->rc = mdb_model_blob(db, j->key, &j->bytes, &j->len);
    sq_loop_post(j->ds->loop, on_blob, j);
}

/* What a MODEL_LOAD says of m's input, preprocessing, output and batch. */
static void spec_from_model(sq_model_load_t *spec, const gw_model_t *m)
{
    spec->max_batch = (uint32_t)(m->max_batch > 0 ? m->max_batch : 1);
    for (int c = 0; c < 3; c++) {
        spec->mean[c] = m->mean[c];
        spec->std[c] = m->std[c];
    }
    spec->bgr = (uint8_t)m->bgr;
    spec->in_chw[0] = (uint32_t)m->c;
    spec->in_chw[1] = (uint32_t)m->h;
    spec->in_chw[2] = (uint32_t)m->w;
    spec->out_classes = (uint32_t)m->out_elems;
}

static int send_spec(gw_dispatch_t *ds, ds_worker_t *w, int64_t key, const sq_model_load_t *spec)
{
    sq_buf_t buf;
    sq_buf_init(&buf);
    sq_model_load_encode(&buf, spec);
    int rc = link_send(ds, w->id, SQ_MSG_MODEL_LOAD, (uint64_t)key, buf.data, (uint32_t)buf.len,
                       NULL, 0);
    sq_buf_dispose(&buf);
    return rc;
}

/* The file's bytes in MODEL_CHUNK frames after its MODEL_LOAD; the worker
 * keeps them by sha256 for the life of the connection. The frames borrow
 * the file (no copy): the loop goes on while the socket drains. */
static int send_chunks(gw_dispatch_t *ds, ds_worker_t *w, int64_t key, const char *sha,
                       sq_bytes_t *bytes)
{
    int rc = 0;
    size_t len = bytes->len;
    for (size_t off = 0; off < len && rc == 0; off += SQ_MODEL_CHUNK_BYTES) {
        size_t n = len - off < SQ_MODEL_CHUNK_BYTES ? len - off : SQ_MODEL_CHUNK_BYTES;
        rc = link_send_ref(ds, w->id, SQ_MSG_MODEL_CHUNK, (uint64_t)key, bytes, off, (uint32_t)n);
    }
    if (rc == 0) {
        w->shas = sq_xrealloc(w->shas, sizeof(*w->shas) * (size_t)(w->nshas + 1));
        snprintf(w->shas[w->nshas++], 65, "%s", sha);
    }
    return rc;
}

static void send_group_load(gw_dispatch_t *ds, ds_model_t *dm, ds_worker_t *w);

static void send_load(gw_dispatch_t *ds, ds_model_t *dm, ds_worker_t *w)
{
    if (dm->is_group) {
        send_group_load(ds, dm, w);
        return;
    }
    gw_model_t *m = dm->m;
    if (dm->poisoned)
        return; /* it crashed its workers: never sent again */
    ds_load_t *l = ds_load_find(w, dm->key, 1);
    int need_bytes = !m->emulated && w->kind != GW_KIND_EMU;
    int cached = need_bytes && has_sha(w, m->sha256);
    if (need_bytes && !cached && dm->blob_state != 2) {
        l->state = LOAD_WAIT_BYTES;
        if (dm->blob_state == 0) {
            dm->blob_state = 1;
            blob_job_t *j = sq_xcalloc(1, sizeof(*j));
            j->ds = ds;
            j->key = dm->key;
            gw_db_post(ds->srv, blob_job, j);
        }
        return;
    }
    sq_model_load_t *spec = sq_xcalloc(1, sizeof(*spec));
    snprintf(spec->sha256, sizeof(spec->sha256), "%s", m->sha256);
    spec->format = m->emulated ? SQ_FORMAT_EMULATED : SQ_FORMAT_ONNX;
    spec->cached = (uint8_t)cached;
    spec->total_bytes = need_bytes ? dm->blob_len : 0;
    spec_from_model(spec, m);
    if (w->kind == GW_KIND_EMU) {
        /* An emulated device holds the batch for l(b) of the model's emu
         * profile (or, for a real model, of its cpu or cuda profile). */
        int k = m->has_profile[GW_KIND_EMU]    ? GW_KIND_EMU
                : m->has_profile[GW_KIND_CUDA] ? GW_KIND_CUDA
                                               : GW_KIND_CPU;
        int n = spec->max_batch > SQ_MAX_EMU_LATENCIES ? SQ_MAX_EMU_LATENCIES : spec->max_batch;
        spec->max_batch = (uint32_t)n;
        spec->n_latency = (uint32_t)n;
        for (int b = 1; b <= n; b++) {
            double lat = m->has_profile[k] ? pl_latency_us(&m->profile[k], b, 0) : -1;
            spec->latency_us[b - 1] = lat > 0 ? (uint64_t)lat : 1000;
        }
        spec->format = SQ_FORMAT_EMULATED;
    }
    int rc = send_spec(ds, w, dm->key, spec);
    free(spec);
    if (rc == 0 && need_bytes && !cached)
        rc = send_chunks(ds, w, dm->key, m->sha256, dm->blob);
    l->state = rc == 0 ? LOAD_SENT : LOAD_FAILED;
    l->sent_seq = ++w->job_seq;
    SQ_INFO("model load sent worker=%d device=%s model=%s version=%d bytes=%zu cached=%d", w->id,
            w->device, m->name, m->version, need_bytes && !cached ? dm->blob_len : 0, cached);
}

/* Makes sure every up worker of the model's kind holds it (or is loading). */
static void spread_loads(gw_dispatch_t *ds, ds_model_t *dm)
{
    for (int i = 0; i < ds->nworkers; i++) {
        ds_worker_t *w = ds->workers[i];
        if (w == NULL || !w->up || w->kind != dm->kind)
            continue;
        ds_load_t *l = ds_load_find(w, dm->key, 0);
        if (l == NULL || l->state == LOAD_NONE)
            send_load(ds, dm, w);
    }
}

/* ---- prefix groups --------------------------------------------------------
 * Models the model DB found to share all but their last layers run as one
 * group (Nexus's prefix batching): a stand-in model whose sessions the core
 * and the planner see like any other, whose batches mix the members'
 * requests, and whose profile the worker measures on the group itself.
 * A group forms once at least two of its models are ready with the same
 * input; until it is loaded and measured, each member runs alone. */

static void start_profile(gw_dispatch_t *ds, ds_model_t *dm);

typedef struct {
    int64_t gid;
    int kind;
    const gw_model_t *like;
    gw_model_t *found[SQ_MAX_GROUP_MEMBERS];
    int n;
} group_scan_t;

static int same_input(const gw_model_t *a, const gw_model_t *b)
{
    if (a->c != b->c || a->h != b->h || a->w != b->w || a->input_uint8 != b->input_uint8 ||
        a->bgr != b->bgr || a->nearest != b->nearest)
        return 0;
    for (int c = 0; c < 3; c++)
        if (a->mean[c] != b->mean[c] || a->std[c] != b->std[c])
            return 0;
    return 1;
}

static void group_scan_one(gw_model_t *m, void *arg)
{
    group_scan_t *g = arg;
    if (m->group_id != g->gid || m->emulated || strcmp(m->status, "ready") != 0 ||
        !m->has_profile[g->kind] || !same_input(m, g->like) || g->n == SQ_MAX_GROUP_MEMBERS)
        return;
    for (int i = 0; i < g->n; i++) {
        /* Twins: one member serves both (see twin_of), the oldest. */
        if (strcmp(g->found[i]->sha256, m->sha256) != 0)
            continue;
        if (g->found[i]->key < m->key)
            return;
        gw_model_unref(g->found[i]);
        memmove(&g->found[i], &g->found[i + 1], sizeof(g->found[0]) * (size_t)(g->n - i - 1));
        g->n--;
        break;
    }
    gw_model_ref(m);
    int i = g->n++;
    while (i > 0 && g->found[i - 1]->key > m->key) {
        g->found[i] = g->found[i - 1];
        i--;
    }
    g->found[i] = m;
}

static int group_member_index(const ds_model_t *g, const gw_model_t *m)
{
    for (int i = 0; i < g->nmembers; i++)
        if (g->members[i]->key == m->key)
            return i;
    return -1;
}

static int group_usable(const ds_model_t *g)
{
    return g != NULL && !g->removed && !g->failed && g->kind >= 0 && g->m->has_profile[g->kind] &&
           g->profile_worker < 0;
}

/* The identity of what a group's profile measured: each member's file and
 * cut, in order, and the largest batch. */
static void group_key(ds_model_t *g)
{
    sq_buf_t b;
    sq_buf_init(&b);
    char line[512];
    for (int i = 0; i < g->nmembers; i++) {
        int n = snprintf(line, sizeof(line), "%s:%s\n", g->members[i]->sha256,
                         g->members[i]->cut_tensor);
        sq_buf_put(&b, line, (size_t)n);
    }
    int n = snprintf(line, sizeof(line), "max_batch=%d", g->m->max_batch);
    sq_buf_put(&b, line, (size_t)n);
    mdb_sha256_hex(b.data, b.len, g->members_key);
    sq_buf_dispose(&b);
}

typedef struct {
    gw_dispatch_t *ds;
    int64_t key;
    int kind;
    char members[65];
    char member_shas[SQ_MAX_GROUP_MEMBERS * 65 + 1];
    char device[64];
    int rc;
    mdb_profile_row_t *rows;
    int nrows;
} group_profile_job_t;

static void group_apply(ds_model_t *g, int kind, const mdb_profile_row_t *rows, int n,
                        const char *how);

static void on_group_profile(sq_loop_t *loop, void *arg)
{
    group_profile_job_t *j = arg;
    gw_dispatch_t *ds = j->ds;
    (void)loop;
    ds_model_t *g = model_find(ds, j->key);
    if (g != NULL && !g->removed && !g->failed && !ds->aborted) {
        if (j->rc == 0) {
            group_apply(g, j->kind, j->rows, j->nrows, "stored");
        } else {
            g->profile_pending = 1;
            start_profile(ds, g);
        }
    }
    free(j->rows);
    free(j);
    pump(ds);
}

static void group_profile_get_job(mdb_t *db, void *arg)
{
    group_profile_job_t *j = arg;
    j->rc = mdb_group_profile_get(db, j->members, gw_kind_name(j->kind), &j->rows, &j->nrows);
    if (j->rc == SQ_DB)
        SQ_WARN("cannot read a stored group profile error=\"%s\"", mdb_errmsg(db));
    sq_loop_post(j->ds->loop, on_group_profile, j);
}

static void group_profile_store_job(mdb_t *db, void *arg)
{
    group_profile_job_t *j = arg;
    if (mdb_group_profile_store(db, j->members, j->member_shas, gw_kind_name(j->kind), j->device,
                                j->rows, j->nrows) != 0)
        SQ_WARN("cannot store a group profile error=\"%s\"", mdb_errmsg(db));
    free(j->rows);
    free(j);
}

static ds_model_t *group_form(gw_dispatch_t *ds, const gw_model_t *m, int kind)
{
    for (int i = 0; i < ds->nmodels; i++) {
        ds_model_t *g = ds->models[i];
        if (g->is_group && !g->removed && g->group_id == m->group_id && g->kind == kind)
            return group_member_index(g, m) >= 0 ? g : NULL;
    }
    group_scan_t scan = {.gid = m->group_id, .kind = kind, .like = m};
    gw_registry_foreach(ds->srv->registry, group_scan_one, &scan);
    int have_m = 0;
    for (int i = 0; i < scan.n; i++)
        have_m |= scan.found[i]->key == m->key;
    if (scan.n < 2 || !have_m) {
        for (int i = 0; i < scan.n; i++)
            gw_model_unref(scan.found[i]);
        return NULL;
    }
    gw_model_t *gm = sq_xcalloc(1, sizeof(*gm));
    atomic_init(&gm->refs, 1);
    gm->key = -(int64_t)++ds->group_gen; /* never reused: late answers name no other group */
    snprintf(gm->name, sizeof(gm->name), "prefix-group-%lld", (long long)m->group_id);
    snprintf(gm->status, sizeof(gm->status), "ready");
    const gw_model_t *f = scan.found[0];
    gm->input_uint8 = f->input_uint8;
    gm->c = f->c;
    gm->h = f->h;
    gm->w = f->w;
    gm->bgr = f->bgr;
    gm->nearest = f->nearest;
    memcpy(gm->mean, f->mean, sizeof(gm->mean));
    memcpy(gm->std, f->std, sizeof(gm->std));
    gm->max_batch = f->max_batch;
    gm->memory_bytes = f->memory_bytes;
    gm->group_id = m->group_id;
    for (int i = 0; i < scan.n; i++) {
        const gw_model_t *x = scan.found[i];
        if (x->out_elems > gm->out_elems)
            gm->out_elems = x->out_elems;
        if (x->max_batch > 0 && (gm->max_batch <= 0 || x->max_batch < gm->max_batch))
            gm->max_batch = x->max_batch;
    }
    ds_model_t *g = sq_xcalloc(1, sizeof(*g));
    g->key = gm->key;
    g->m = gm;
    g->kind = kind;
    g->profile_worker = -1;
    g->profile_pending = 1;
    g->is_group = 1;
    g->group_id = m->group_id;
    g->nmembers = scan.n;
    g->members = sq_xcalloc((size_t)scan.n, sizeof(*g->members));
    memcpy(g->members, scan.found, sizeof(*g->members) * (size_t)scan.n);
    if (ds->nmodels == ds->capmodels) {
        ds->capmodels = ds->capmodels ? 2 * ds->capmodels : 16;
        ds->models = sq_xrealloc(ds->models, sizeof(*ds->models) * (size_t)ds->capmodels);
    }
    ds->models[ds->nmodels++] = g;
    char names[512] = "";
    for (int i = 0; i < scan.n; i++)
        snprintf(names + strlen(names), sizeof(names) - strlen(names), "%s%s:%d", i ? "," : "",
                 scan.found[i]->name, scan.found[i]->version);
    SQ_INFO("prefix group formed group=%s members=%d models=%s kind=%s", gm->name, scan.n, names,
            gw_kind_name(kind));
    /* Measured before, with these very files and cuts? Else measure it. */
    group_key(g);
    g->profile_pending = 0;
    group_profile_job_t *j = sq_xcalloc(1, sizeof(*j));
    j->ds = ds;
    j->key = g->key;
    j->kind = kind;
    snprintf(j->members, sizeof(j->members), "%s", g->members_key);
    gw_db_post(ds->srv, group_profile_get_job, j);
    return g;
}

/* ---- twins ----------------------------------------------------------------
 * The same file uploaded twice (another version, another name) with the
 * same input and batch limit computes the same thing: the oldest ready copy
 * serves the requests of all of them from its one load, and a newer copy
 * takes the older one's profile instead of being measured. Each keeps its
 * own labels, metrics and answers (they are the request's model's). */

typedef struct {
    const gw_model_t *like;
    gw_model_t *oldest;
} twin_scan_t;

static void twin_scan_one(gw_model_t *m, void *arg)
{
    twin_scan_t *t = arg;
    if (m->key == t->like->key || m->emulated || strcmp(m->status, "ready") != 0 ||
        strcmp(m->sha256, t->like->sha256) != 0 || m->max_batch != t->like->max_batch ||
        !same_input(m, t->like))
        return;
    if (t->oldest != NULL && t->oldest->key < m->key)
        return;
    gw_model_unref(t->oldest);
    gw_model_ref(m);
    t->oldest = m;
}

/* The oldest ready model with m's very file and input, if older than m. */
static gw_model_t *twin_find(gw_dispatch_t *ds, const gw_model_t *m)
{
    twin_scan_t scan = {.like = m};
    if (m->emulated)
        return NULL;
    gw_registry_foreach(ds->srv->registry, twin_scan_one, &scan);
    if (scan.oldest != NULL && scan.oldest->key > m->key) {
        gw_model_unref(scan.oldest);
        scan.oldest = NULL;
    }
    return scan.oldest;
}

/* The model whose load serves dm's requests instead of its own, if any. */
static ds_model_t *twin_of(gw_dispatch_t *ds, ds_model_t *dm)
{
    if (dm->is_group || dm->m->emulated)
        return NULL;
    if (dm->twin != NULL && (dm->twin->removed || dm->twin->poisoned))
        dm->twin = NULL;
    if (dm->twin_checked != ds->group_epoch) {
        dm->twin_checked = ds->group_epoch;
        gw_model_t *t = twin_find(ds, dm->m);
        dm->twin = t != NULL ? model_get(ds, t) : NULL;
        gw_model_unref(t);
    }
    return dm->twin;
}

/* The group member model dm's requests can run in, if one is usable now
 * (forming it, and starting its measurement, when its time has come). */
static ds_model_t *group_of(gw_dispatch_t *ds, ds_model_t *dm)
{
    const gw_model_t *m = dm->m;
    if (!ds->srv->cfg->prefix_batching || m->group_id <= 0 || m->emulated || dm->is_group)
        return NULL;
    if (dm->group != NULL && (dm->group->removed || dm->group->failed))
        dm->group = NULL;
    if (dm->group == NULL && dm->group_checked != ds->group_epoch) {
        dm->group_checked = ds->group_epoch;
        int kind = kind_of_model(ds->srv, m);
        if (kind == GW_KIND_CPU || kind == GW_KIND_CUDA)
            dm->group = group_form(ds, m, kind);
    }
    return group_usable(dm->group) ? dm->group : NULL;
}

static void group_free_blobs(ds_model_t *g)
{
    for (int i = 0; g->member_blobs != NULL && i < g->nmembers; i++)
        sq_bytes_unref(g->member_blobs[i]);
    free(g->member_blobs);
    free(g->member_lens);
    g->member_blobs = NULL;
    g->member_lens = NULL;
    g->blob_state = 0;
}

/* Stops routing to group g: unloads it, removes its sessions (their queued
 * requests are answered by the core) and lets the next request form a new
 * group from the models there are now. */
static void group_retire(gw_dispatch_t *ds, ds_model_t *g, const char *why)
{
    if (g->removed)
        return;
    g->removed = 1;
    ds->reclaim_due = 1;
    SQ_INFO("prefix group retired group=%s reason=\"%s\"", g->m->name, why);
    /* Requests waiting in it run in their own models' sessions instead (the
     * core hands back those queued in its sessions as drops, see pump). */
    for (int i = 0; i < g->npending; i++)
        sq_loop_post(ds->loop, on_submit, g->pending[i]);
    g->npending = 0;
    withdraw(ds, g);
    group_free_blobs(g);
    for (int i = 0; i < ds->nmodels; i++)
        if (ds->models[i]->group == g)
            ds->models[i]->group = NULL;
    if (g->kind >= 0 && g->active)
        gw__plan_invalidate(ds, g->kind, "prefix group retired");
}

typedef struct {
    gw_dispatch_t *ds;
    int64_t key;
    int n, rc;
    int64_t keys[SQ_MAX_GROUP_MEMBERS];
    void *bytes[SQ_MAX_GROUP_MEMBERS];
    size_t lens[SQ_MAX_GROUP_MEMBERS];
} group_blob_t;

static void on_group_blob(sq_loop_t *loop, void *arg)
{
    group_blob_t *j = arg;
    gw_dispatch_t *ds = j->ds;
    (void)loop;
    ds_model_t *g = model_find(ds, j->key);
    if (g == NULL || g->removed || j->rc != 0 || ds->aborted) {
        if (g != NULL && !g->removed && !ds->aborted) {
            SQ_ERROR("cannot read the files of prefix group %s", g->m->name);
            g->failed = 1;
            g->blob_state = 3;
        }
        for (int i = 0; i < j->n; i++)
            free(j->bytes[i]);
        free(j);
        return;
    }
    g->member_blobs = sq_xcalloc((size_t)j->n, sizeof(*g->member_blobs));
    g->member_lens = sq_xcalloc((size_t)j->n, sizeof(*g->member_lens));
    for (int i = 0; i < j->n; i++) {
        g->member_blobs[i] = sq_bytes_adopt(j->bytes[i], j->lens[i]);
        g->member_lens[i] = j->lens[i];
    }
    g->blob_state = 2;
    for (int i = 0; i < ds->nworkers; i++) {
        ds_worker_t *w = ds->workers[i];
        ds_load_t *l = w ? ds_load_find(w, g->key, 0) : NULL;
        if (l != NULL && l->state == LOAD_WAIT_BYTES)
            send_group_load(ds, g, w);
    }
    /* Sent to everyone waiting: the files live in the DB, not here. */
    group_free_blobs(g);
    free(j);
    pump(ds);
}

static void group_blob_job(mdb_t *db, void *arg)
{
    group_blob_t *j = arg;
    for (int i = 0; i < j->n && j->rc == 0; i++)
        j->rc = mdb_model_blob(db, j->keys[i], &j->bytes[i], &j->lens[i]);
    sq_loop_post(j->ds->loop, on_group_blob, j);
}

/* Sends the members' files this worker lacks (kept there by sha256), then
 * the group load naming them and where each is cut. */
static void send_group_load(gw_dispatch_t *ds, ds_model_t *g, ds_worker_t *w)
{
    ds_load_t *l = ds_load_find(w, g->key, 1);
    int missing = 0;
    for (int i = 0; i < g->nmembers; i++)
        missing += !has_sha(w, g->members[i]->sha256);
    if (missing > 0 && g->blob_state != 2) {
        l->state = LOAD_WAIT_BYTES;
        if (g->blob_state == 0) {
            g->blob_state = 1;
            group_blob_t *j = sq_xcalloc(1, sizeof(*j));
            j->ds = ds;
            j->key = g->key;
            j->n = g->nmembers;
            for (int i = 0; i < g->nmembers; i++)
                j->keys[i] = g->members[i]->key;
            gw_db_post(ds->srv, group_blob_job, j);
        }
        return;
    }
    int rc = 0;
    size_t sent = 0;
    sq_model_load_t *spec = sq_xcalloc(1, sizeof(*spec));
    for (int i = 0; i < g->nmembers && rc == 0; i++) {
        const gw_model_t *mm = g->members[i];
        if (has_sha(w, mm->sha256))
            continue;
        memset(spec, 0, sizeof(*spec));
        snprintf(spec->sha256, sizeof(spec->sha256), "%s", mm->sha256);
        spec->format = SQ_FORMAT_ONNX;
        spec->cache_only = 1;
        spec->total_bytes = g->member_lens[i];
        spec->max_batch = 1;
        rc = send_spec(ds, w, g->key, spec);
        if (rc == 0)
            rc = send_chunks(ds, w, g->key, mm->sha256, g->member_blobs[i]);
        sent += g->member_lens[i];
    }
    const gw_model_t *gm = g->m;
    memset(spec, 0, sizeof(*spec));
    spec_from_model(spec, gm);
    spec->format = SQ_FORMAT_GROUP;
    spec->n_members = (uint32_t)g->nmembers;
    for (int i = 0; i < g->nmembers; i++) {
        snprintf(spec->members[i].sha256, sizeof(spec->members[i].sha256), "%s",
                 g->members[i]->sha256);
        snprintf(spec->members[i].cut, sizeof(spec->members[i].cut), "%s",
                 g->members[i]->cut_tensor);
    }
    if (rc == 0)
        rc = send_spec(ds, w, g->key, spec);
    free(spec);
    l->state = rc == 0 ? LOAD_SENT : LOAD_FAILED;
    l->sent_seq = ++w->job_seq;
    SQ_INFO("prefix group load sent worker=%d device=%s group=%s members=%d bytes=%zu", w->id,
            w->device, gm->name, g->nmembers, sent);
}

/* The group's l(b) (its members sharing each batch evenly): it is usable
 * from now on. */
static void group_apply(ds_model_t *g, int kind, const mdb_profile_row_t *rows, int n,
                        const char *how)
{
    pl_profile_row_t *pr = sq_xcalloc((size_t)n, sizeof(*pr));
    for (int i = 0; i < n; i++)
        pr[i] = (pl_profile_row_t){
            .batch = rows[i].batch, .mean_us = rows[i].mean_us, .std_us = rows[i].std_us};
    gw_model_t *gm = g->m;
    if (gm->has_profile[kind])
        pl_profile_dispose(&gm->profile[kind]);
    gm->has_profile[kind] = pl_profile_init_table(&gm->profile[kind], pr, n) == 0;
    free(pr);
    if (!gm->has_profile[kind]) {
        g->failed = 1;
        SQ_WARN("prefix group not used: its profile is unusable group=%s", gm->name);
        return;
    }
    gm->profile[kind].memory_bytes = (double)rows[0].peak_memory_bytes;
    SQ_INFO("prefix group ready group=%s members=%d profile=%s l1_ms=%.2f lmax_ms=%.2f "
            "max_batch=%d",
            gm->name, g->nmembers, how, rows[0].mean_us / 1000.0, rows[n - 1].mean_us / 1000.0,
            rows[n - 1].batch);
}

static void group_profiled(gw_dispatch_t *ds, ds_model_t *g, ds_worker_t *w,
                           const sq_profile_done_t *done)
{
    if (done->code != 0 || done->nrows == 0) {
        g->failed = 1;
        SQ_WARN("prefix group not used: its measurement failed group=%s code=%s message=\"%s\"",
                g->m->name, sq_err_name(done->code), done->message);
        return;
    }
    group_profile_job_t *j = sq_xcalloc(1, sizeof(*j));
    j->ds = ds;
    j->kind = w->kind;
    snprintf(j->members, sizeof(j->members), "%s", g->members_key);
    size_t at = 0;
    for (int i = 0; i < g->nmembers; i++)
        at += (size_t)snprintf(j->member_shas + at, sizeof(j->member_shas) - at, "%s%s",
                               i ? " " : "", g->members[i]->sha256);
    snprintf(j->device, sizeof(j->device), "%s", w->device);
    j->nrows = (int)done->nrows;
    j->rows = sq_xcalloc(done->nrows, sizeof(*j->rows));
    for (uint32_t i = 0; i < done->nrows; i++)
        j->rows[i] = (mdb_profile_row_t){.batch = (int)done->rows[i].batch,
                                         .mean_us = done->rows[i].mean_us,
                                         .std_us = done->rows[i].std_us,
                                         .peak_memory_bytes = done->rows[i].peak_memory_bytes};
    group_apply(g, w->kind, j->rows, j->nrows, "measured");
    gw_db_post(ds->srv, group_profile_store_job, j);
}

/* ---- profiling ---------------------------------------------------------- */

static void start_profile(gw_dispatch_t *ds, ds_model_t *dm)
{
    if (!dm->profile_pending || dm->profile_worker >= 0 || dm->removed || dm->poisoned)
        return;
    ds_worker_t *pick = NULL;
    for (int pass = 0; pass < 2 && pick == NULL; pass++) {
        int want = pass == 0 ? GW_KIND_CUDA : GW_KIND_CPU;
        for (int i = 0; i < ds->nworkers && pick == NULL; i++) {
            ds_worker_t *w = ds->workers[i];
            if (w != NULL && w->up && !w->profiling && w->kind == want)
                pick = w;
        }
    }
    if (pick == NULL)
        return; /* retried when a cpu or cuda worker comes up */
    dm->profile_worker = pick->id;
    pick->profiling = 1;
    pl_dispatch_worker_remove(ds->core, now_us(), pick->id);
    SQ_INFO("profiling model=%s version=%d worker=%d device=%s", dm->m->name, dm->m->version,
            pick->id, pick->device);
    ds_load_t *l = ds_load_find(pick, dm->key, 0);
    if (l != NULL && l->state == LOAD_DONE) {
        sq_profile_req_t req = {.max_batch = (uint32_t)dm->m->max_batch,
                                .warmup = PROFILE_WARMUP,
                                .repeats = PROFILE_REPEATS,
                                .budget_ms = PROFILE_BUDGET_MS};
        sq_buf_t buf;
        sq_buf_init(&buf);
        sq_profile_req_encode(&buf, &req);
        link_send(ds, pick->id, SQ_MSG_PROFILE, (uint64_t)dm->key, buf.data, (uint32_t)buf.len,
                  NULL, 0);
        sq_buf_dispose(&buf);
        pick->profile_key = dm->key;
        pick->profile_seq = ++pick->job_seq;
    } else if (l == NULL || l->state == LOAD_NONE || l->state == LOAD_FAILED) {
        if (l != NULL)
            l->state = LOAD_NONE;
        send_load(ds, dm, pick);
    }
}

/* Models that asked to be measured while every worker was busy measuring:
 * each takes a free worker, if there is one. */
static void start_profiles(gw_dispatch_t *ds)
{
    for (int i = 0; i < ds->nmodels; i++)
        start_profile(ds, ds->models[i]); /* a no-op for removed ones */
}

static void end_profile(gw_dispatch_t *ds, ds_model_t *dm, ds_worker_t *w)
{
    dm->profile_worker = -1;
    dm->profile_pending = 0;
    if (w != NULL && w->profiling) {
        w->profiling = 0;
        if (w->up) {
            pl_dispatch_worker_add(ds->core, now_us(), w->id, 0);
            for (int i = 0; i < ds->nmodels; i++)
                if (ds->models[i]->active)
                    update_routes(ds, ds->models[i]);
        }
    }
    start_profiles(ds);
    /* Requests that waited for the worker to finish measuring. */
    int loading;
    for (int i = 0; i < ds->nmodels; i++) {
        ds_model_t *m = ds->models[i];
        if (!m->removed && m->npending > 0 && loaded_anywhere(ds, m, &loading) > 0)
            flush_pending(ds, m);
    }
}

/* DB thread: publishes key's current record (none: it was deleted) and
 * tells the dispatcher. */
static void registry_refresh(mdb_t *db, gw_server_t *srv, int64_t key)
{
    json_t *recs;
    if (mdb_model_records(db, key, &recs) == 0 && json_array_size(recs) == 1)
        gw_registry_put(srv->registry, gw_model_from_record(json_array_get(recs, 0)));
    json_decref(recs);
    gw_dispatch_model_changed(srv, key);
}

static const char *sigabbrev(int sig)
{
    switch (sig) {
    case SIGSEGV:
        return "SIGSEGV";
    case SIGABRT:
        return "SIGABRT";
    case SIGBUS:
        return "SIGBUS";
    case SIGFPE:
        return "SIGFPE";
    case SIGILL:
        return "SIGILL";
    case SIGTRAP:
        return "SIGTRAP";
    case SIGSYS:
        return "SIGSYS";
    default:
        return "a signal";
    }
}

typedef struct {
    gw_server_t *srv;
    int64_t key;
    char device_kind[8];
    char device_name[64];
    sq_profile_done_t done;
} profile_store_t;

/* DB thread: stores the profile, refreshes the registry entry, and tells
 * the dispatcher. */
static void profile_store_job(mdb_t *db, void *arg)
{
    profile_store_t *p = arg;
    mdb_profile_row_t *rows = sq_xcalloc(p->done.nrows + 1, sizeof(*rows));
    for (uint32_t i = 0; i < p->done.nrows; i++)
        rows[i] = (mdb_profile_row_t){.batch = (int)p->done.rows[i].batch,
                                      .mean_us = p->done.rows[i].mean_us,
                                      .std_us = p->done.rows[i].std_us,
                                      .peak_memory_bytes = p->done.rows[i].peak_memory_bytes};
    int ok = p->done.code == 0 && p->done.nrows > 0;
    int rc = mdb_profile_store(db, p->key, p->device_kind, p->device_name, rows,
                               ok ? (int)p->done.nrows : 0, ok ? "ready" : "failed",
                               ok ? NULL : p->done.message);
    free(rows);
    if (rc == SQ_MODEL_NOT_FOUND)
        SQ_INFO("profile not stored: the model was deleted while it was measured key=%lld",
                (long long)p->key);
    else if (rc != 0)
        SQ_ERROR("cannot store the profile key=%lld error=\"%s\"", (long long)p->key,
                 mdb_errmsg(db));
    registry_refresh(db, p->srv, p->key);
    free(p);
}

typedef struct {
    gw_server_t *srv;
    int64_t from, to;
} profile_copy_job_t;

/* What a model message asks for: nothing but a refresh, a profile (taken
 * from an identical model when there is one), or a measurement. */
enum { PROFILE_NONE, PROFILE_WANTED, PROFILE_MEASURE };
static void post_model_msg(gw_server_t *srv, int64_t key, int profile);

/* DB thread: an identical model's profile becomes this one's; if that fails
 * (the older copy deleted meanwhile), it is measured after all. */
static void profile_copy_job(mdb_t *db, void *arg)
{
    profile_copy_job_t *j = arg;
    int rc = mdb_profile_copy(db, j->from, j->to);
    if (rc == 0) {
        registry_refresh(db, j->srv, j->to);
    } else {
        SQ_INFO("profile not copied, measuring key=%lld reason=\"%s\"", (long long)j->to,
                mdb_errmsg(db));
        post_model_msg(j->srv, j->to, PROFILE_MEASURE);
    }
    free(j);
}

/* ---- models that crash their workers -------------------------------------
 * A worker process that dies of a signal of its own (SIGSEGV, SIGABRT,
 * SIGBUS, SIGFPE, SIGILL...) while it loads, measures or runs a model
 * counts a crash against that model: the oldest job it had not answered
 * (it runs them in order). SIGKILL and SIGTERM come from outside (squishd
 * on a missed heartbeat, an operator, the kernel's OOM killer) and count
 * nothing. Past --model-retries crashes the model is marked failed, in the
 * model DB with the reason, and is never sent to a worker again; its
 * waiting requests are answered 409 model_failed. A prefix group that
 * crashes its worker is retired instead (its members run alone). */

typedef struct {
    gw_server_t *srv;
    int64_t key;
    char why[256];
} fail_job_t;

static void fail_job(mdb_t *db, void *arg)
{
    fail_job_t *j = arg;
    int rc = mdb_model_set_status(db, j->key, "failed", j->why);
    if (rc != 0 && rc != SQ_MODEL_NOT_FOUND)
        SQ_ERROR("cannot mark a model failed key=%lld error=\"%s\"", (long long)j->key,
                 mdb_errmsg(db));
    registry_refresh(db, j->srv, j->key);
    free(j);
}

static void poison(gw_dispatch_t *ds, ds_model_t *dm, const char *why)
{
    if (dm->is_group) {
        dm->failed = 1;
        group_retire(ds, dm, why);
        return;
    }
    dm->poisoned = 1;
    dm->profile_pending = 0;
    snprintf(dm->failed_why, sizeof(dm->failed_why), "model %s version %d failed: %s", dm->m->name,
             dm->m->version, why);
    SQ_ERROR("model marked failed model=%s version=%d crashes=%d reason=\"%s\"", dm->m->name,
             dm->m->version, dm->crashes, why);
    fail_pending(ds, dm, SQ_MODEL_FAILED, dm->failed_why);
    withdraw(ds, dm); /* what its sessions queued comes back as drops: see pump */
    int was_active = dm->active;
    dm->active = 0;
    if (was_active && dm->kind >= 0)
        gw__plan_invalidate(ds, dm->kind, "model failed");
    sq_bytes_unref(dm->blob);
    dm->blob = NULL;
    dm->blob_state = 0;
    fail_job_t *j = sq_xcalloc(1, sizeof(*j));
    j->srv = ds->srv;
    j->key = dm->key;
    snprintf(j->why, sizeof(j->why), "%s", why);
    gw_db_post(ds->srv, fail_job, j);
}

/* The job w was running when its connection ended: its oldest unanswered
 * one. */
static void note_suspect(ds_worker_t *w)
{
    uint64_t oldest = UINT64_MAX;
    w->has_suspect = 0;
    if (w->inflight != NULL) {
        oldest = w->inflight->seq;
        w->suspect_key = w->inflight->model_key;
        snprintf(w->suspect_doing, sizeof(w->suspect_doing), "running");
        w->has_suspect = 1;
    }
    for (int i = 0; i < w->nloads; i++) {
        const ds_load_t *l = &w->loads[i];
        if ((l->state == LOAD_SENT || l->stale > 0) && l->sent_seq != 0 && l->sent_seq < oldest) {
            oldest = l->sent_seq;
            w->suspect_key = l->key;
            snprintf(w->suspect_doing, sizeof(w->suspect_doing), "loading");
            w->has_suspect = 1;
        }
    }
    if (w->profile_seq != 0 && w->profile_seq < oldest) {
        w->suspect_key = w->profile_key;
        snprintf(w->suspect_doing, sizeof(w->suspect_doing), "measuring");
        w->has_suspect = 1;
    }
    w->profile_seq = 0;
}

static void worker_exited(gw_dispatch_t *ds, int worker, int status)
{
    ds_worker_t *w = ds_worker_at(ds, worker);
    if (w == NULL || w->up || !w->has_suspect)
        return;
    w->has_suspect = 0;
    int sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    if (sig == 0 || sig == SIGKILL || sig == SIGTERM || sig == SIGINT || sig == SIGHUP)
        return;
    ds_model_t *dm = model_find(ds, w->suspect_key);
    if (dm == NULL || dm->removed || dm->poisoned)
        return;
    dm->crashes++;
    char why[192];
    snprintf(why, sizeof(why), "its worker (%s) crashed with %s while %s it, %d time%s", w->device,
             sigabbrev(sig), w->suspect_doing, dm->crashes, dm->crashes > 1 ? "s" : "");
    if (dm->crashes > ds->srv->cfg->model_retries) {
        poison(ds, dm, why);
    } else {
        SQ_WARN("worker crashed model=%s version=%d doing=%s signal=%s crashes=%d retries=%d",
                dm->m->name, dm->m->version, w->suspect_doing, sigabbrev(sig), dm->crashes,
                ds->srv->cfg->model_retries);
    }
    pump(ds);
}

/* ---- worker frames ------------------------------------------------------- */

static void on_batch_done(gw_dispatch_t *ds, ds_worker_t *w, const sq_frame_t *f)
{
    sq_batch_done_t done;
    if (sq_batch_done_decode(f, &done) != 0 || w->inflight == NULL || w->inflight->id != f->id) {
        SQ_LOG(ds->aborted ? SQ_LOG_DEBUG : SQ_LOG_WARN,
               "unexpected BATCH_DONE worker=%d batch=%llu", w->id, (unsigned long long)f->id);
        return;
    }
    ds_batch_t *b = w->inflight;
    w->inflight = NULL;
    int64_t t = now_us();
    gw__plan_busy(ds, w->id, t - b->sent_us);
    gw_metrics_batch(ds->srv->metrics, b->items[0]->model, w->id, w->device, b->count,
                     t - b->sent_us, &done);
    pl_dispatch_batch_done(ds->core, t, w->id, b->id);
    const uint8_t *base = sq_shm_arena_base(ds->srv->arena);
    for (int i = 0; i < b->count; i++) {
        gw_item_t *it = b->items[i];
        if (done.code == 0) {
            gw_model_t *m = it->model;
            memcpy(it->out, base + b->out_off + b->out_stride * (uint64_t)i,
                   (size_t)m->out_elems * sizeof(float));
            handle_release(ds, it);
            release_input(ds, it);
            it->done_us = t;
            gw__plan_outcome(ds, it->done_us <= it->deadline_us);
            it->finish(it, 0, NULL);
        } else {
            fail_item(ds, it, SQ_DEVICE, done.message);
        }
    }
    if (done.code != 0)
        SQ_WARN("batch failed worker=%d code=%s message=\"%s\"", w->id, sq_err_name(done.code),
                done.message);
    ds_model_t *ran = done.code == 0 ? model_find(ds, b->model_key) : NULL;
    if (ran != NULL)
        ran->crashes = 0; /* counted are crashes in a row: a crash blamed on it by a
                             worker that died before its answers left was not its */
    sq_shm_release(ds->srv->arena, b->out_off);
    free(b->items);
    free(b);
    pump(ds);
}

static int on_frame(gw_dispatch_t *ds, int worker, const sq_frame_t *f)
{
    ds_worker_t *w = ds_worker_at(ds, worker);
    if (w == NULL)
        return -1;
    switch (f->type) {
    case SQ_MSG_BATCH_DONE:
        on_batch_done(ds, w, f);
        return 0;
    case SQ_MSG_MODEL_LOADED:
    case SQ_MSG_MODEL_FAILED: {
        ds_model_t *dm = model_find(ds, (int64_t)f->id);
        ds_load_t *l = ds_load_find(w, (int64_t)f->id, 0);
        if (l != NULL && l->stale > 0) {
            l->stale--; /* the answer to a load withdrawn since */
            return 0;
        }
        if (dm == NULL || l == NULL)
            return 0; /* a model deleted meanwhile */
        if (f->type == SQ_MSG_MODEL_LOADED) {
            sq_model_loaded_t info;
            if (sq_model_loaded_decode(f, &info) != 0)
                return -1;
            l->state = LOAD_DONE;
            l->max_batch = (int)info.max_batch;
            SQ_INFO("model loaded worker=%d device=%s model=%s version=%d memory_mb=%llu", w->id,
                    w->device, dm->m->name, dm->m->version,
                    (unsigned long long)(info.memory_bytes >> 20));
            if (dm->profile_worker == w->id) {
                dm->profile_worker = -1;
                w->profiling = 0;
                pl_dispatch_worker_add(ds->core, now_us(), w->id, 0);
                start_profile(ds, dm);
                start_profiles(ds); /* measured elsewhere after all: w is free */
            }
            if (dm->active) {
                update_routes(ds, dm);
                flush_pending(ds, dm);
            }
        } else {
            sq_ipc_error_t e;
            if (sq_ipc_error_decode(f, &e) != 0)
                return -1;
            l->state = LOAD_FAILED;
            SQ_WARN("model load failed worker=%d model=%s version=%d code=%s reason=\"%s\"", w->id,
                    dm->m->name, dm->m->version, sq_err_name(e.code), e.message);
            if (dm->is_group) {
                /* Its members run alone; what waited for it runs there. */
                if (dm->profile_worker == w->id)
                    end_profile(ds, dm, w);
                dm->failed = 1;
                group_retire(ds, dm, "the group could not be loaded");
            } else if (dm->profile_worker == w->id) {
                sq_profile_done_t failed = {.code = e.code};
                profile_store_t *p = sq_xcalloc(1, sizeof(*p));
                p->srv = ds->srv;
                p->key = dm->key;
                snprintf(p->device_kind, sizeof(p->device_kind), "%s", gw_kind_name(w->kind));
                snprintf(p->device_name, sizeof(p->device_name), "%s", w->device);
                p->done = failed;
                snprintf(p->done.message, sizeof(p->done.message), "load: %s", e.message);
                end_profile(ds, dm, w);
                gw_db_post(ds->srv, profile_store_job, p);
            }
            int loading;
            if (loaded_anywhere(ds, dm, &loading) == 0 && loading == 0)
                fail_pending(ds, dm, SQ_NO_WORKER, e.message);
        }
        pump(ds);
        return 0;
    }
    case SQ_MSG_PROFILE_PROGRESS: {
        sq_reader_t r;
        sq_reader_init(&r, f->payload, f->len);
        uint32_t b = sq_get_u32(&r), total = sq_get_u32(&r);
        ds_model_t *dm = model_find(ds, (int64_t)f->id);
        if (!r.err && dm != NULL)
            SQ_INFO("profiling progress model=%s version=%d batch=%u of=%u", dm->m->name,
                    dm->m->version, b, total);
        return 0;
    }
    case SQ_MSG_PROFILE_DONE: {
        profile_store_t *p = sq_xcalloc(1, sizeof(*p));
        if (sq_profile_done_decode(f, &p->done) != 0) {
            free(p);
            return -1;
        }
        ds_model_t *dm = model_find(ds, (int64_t)f->id);
        SQ_INFO("profiling done key=%lld worker=%d rows=%u code=%s", (long long)f->id, w->id,
                p->done.nrows, sq_err_name(p->done.code));
        if (w->profile_key == (int64_t)f->id)
            w->profile_seq = 0;
        if (dm == NULL || dm->removed || dm->profile_worker != w->id) {
            /* Abandoned (the model deleted, the group retired): the worker
             * was released then, and nothing is stored. */
            free(p);
            return 0;
        }
        end_profile(ds, dm, w);
        if (p->done.code == 0)
            dm->crashes = 0;
        if (dm->is_group) {
            group_profiled(ds, dm, w, &p->done);
            free(p);
            pump(ds);
            return 0;
        }
        p->srv = ds->srv;
        p->key = (int64_t)f->id;
        snprintf(p->device_kind, sizeof(p->device_kind), "%s", gw_kind_name(w->kind));
        snprintf(p->device_name, sizeof(p->device_name), "%s", w->device);
        gw_db_post(ds->srv, profile_store_job, p);
        pump(ds);
        return 0;
    }
    default:
        return -1;
    }
}

/* ---- workers come and go -------------------------------------------------- */

typedef struct {
    gw_model_t **m;
    int n;
} grouped_t;

static void collect_grouped(gw_model_t *m, void *arg)
{
    grouped_t *g = arg;
    if (m->group_id <= 0 || m->emulated || strcmp(m->status, "ready") != 0)
        return;
    gw_model_ref(m);
    g->m = sq_xrealloc(g->m, sizeof(*g->m) * (size_t)(g->n + 1));
    g->m[g->n++] = m;
}

static void worker_up(gw_dispatch_t *ds, int worker, const char *device, uint64_t memory)
{
    grouped_t grouped = {0};
    wk_device_t dev;
    if (worker < 0 || wk_device_parse(device, &dev) != 0)
        return;
    if (worker >= ds->nworkers) {
        ds->workers = sq_xrealloc(ds->workers, sizeof(*ds->workers) * (size_t)(worker + 1));
        memset(ds->workers + ds->nworkers, 0,
               sizeof(*ds->workers) * (size_t)(worker + 1 - ds->nworkers));
        ds->nworkers = worker + 1;
    }
    ds_worker_t *w = ds->workers[worker];
    if (w == NULL)
        w = ds->workers[worker] = sq_xcalloc(1, sizeof(*w));
    w->id = worker;
    w->up = 1;
    w->profiling = 0;
    w->kind = dev.kind == WK_DEV_CUDA  ? GW_KIND_CUDA
              : dev.kind == WK_DEV_EMU ? GW_KIND_EMU
                                       : GW_KIND_CPU;
    snprintf(w->device, sizeof(w->device), "%s", device);
    w->nloads = 0;
    w->nshas = 0;
    w->has_suspect = 0;
    w->profile_seq = 0;
    w->memory_bytes = memory;
    atomic_fetch_add(&ds->srv->kind_up[w->kind], 1);
    pl_dispatch_worker_add(ds->core, now_us(), worker, 0);
    start_profiles(ds);
    if (ds->srv->cfg->prefix_batching && (w->kind == GW_KIND_CPU || w->kind == GW_KIND_CUDA))
        gw_registry_foreach(ds->srv->registry, collect_grouped, &grouped);
    for (int i = 0; i < grouped.n; i++) {
        ds->group_epoch++;
        group_of(ds, model_get(ds, grouped.m[i]));
        gw_model_unref(grouped.m[i]);
    }
    free(grouped.m);
    /* Requests that waited for a worker of this kind (restarted after a
     * crash, say): it loads their models. */
    for (int i = 0; i < ds->nmodels; i++) {
        ds_model_t *dm = ds->models[i];
        int loading;
        if (dm->npending > 0 && !dm->removed && dm->kind == w->kind &&
            loaded_anywhere(ds, dm, &loading) == 0 && loading == 0)
            spread_loads(ds, dm);
    }
    gw__plan_invalidate(ds, w->kind, "worker up");
    pump(ds);
}

static void worker_lost(gw_dispatch_t *ds, int worker)
{
    ds_worker_t *w = ds_worker_at(ds, worker);
    if (w == NULL || !w->up)
        return;
    w->up = 0;
    atomic_fetch_sub(&ds->srv->kind_up[w->kind], 1);
    note_suspect(w);
    if (w->inflight != NULL) {
        /* The core puts these requests back in their queues (or drops them
         * if their deadline no longer allows a retry). */
        sq_shm_release(ds->srv->arena, w->inflight->out_off);
        free(w->inflight->items);
        free(w->inflight);
        w->inflight = NULL;
    }
    pl_dispatch_worker_lost(ds->core, now_us(), worker);
    for (int i = 0; i < ds->nmodels; i++) {
        ds_model_t *dm = ds->models[i];
        if (dm->profile_worker == worker) {
            dm->profile_worker = -1;
            w->profiling = 0;
            start_profile(ds, dm); /* on another worker, if any */
        }
    }
    w->nloads = 0;
    w->nshas = 0;
    gw__plan_invalidate(ds, w->kind, "worker lost");
    pump(ds);
}

/* ---- entry points from other threads --------------------------------------- */

static void on_submit(sq_loop_t *loop, void *arg)
{
    gw_item_t *it = arg;
    gw_dispatch_t *ds = it->srv->dispatch;
    (void)loop;
    gw_model_t *m = it->model;
    it->ready_us = now_us();
    if (ds->aborted) {
        fail_item(ds, it, SQ_SHUTTING_DOWN, "squishd is shutting down");
        return;
    }
    if (it->ready_us >= it->deadline_us) {
        fail_item(ds, it, SQ_DEADLINE, "the deadline passed during preprocessing");
        return;
    }
    ds_model_t *dm = model_find(ds, m->key);
    if (dm == NULL) {
        /* New here, or deleted and forgotten (see reclaim) while the item
         * was decoded: only a model still published gets a record. */
        gw_model_t *cur = gw_registry_get(ds->srv->registry, m->key);
        gw_model_unref(cur);
        if (cur == NULL) {
            fail_item(ds, it, SQ_MODEL_NOT_FOUND, "the model was deleted");
            return;
        }
        dm = model_get(ds, m);
    }
    if (dm->removed) {
        fail_item(ds, it, SQ_MODEL_NOT_FOUND, "the model was deleted");
        return;
    }
    if (dm->poisoned) {
        fail_item(ds, it, SQ_MODEL_FAILED, dm->failed_why);
        return;
    }
    ds_model_t *t = twin_of(ds, dm);
    if (t != NULL)
        dm = t;
    ds_model_t *g = group_of(ds, dm);
    if (g != NULL) {
        it->member = group_member_index(g, dm->m);
        dm = g;
    }
    if (!dm->active) {
        dm->kind = kind_of_model(ds->srv, dm->m);
        if (dm->kind < 0) {
            fail_item(ds, it, SQ_NO_WORKER, "no worker that can run this model is up");
            return;
        }
        dm->active = 1;
        gw__plan_activate(ds, dm, gw_slo_bucket_ms(it->slo_ms));
    }
    int loading;
    if (loaded_anywhere(ds, dm, &loading) > 0) {
        enqueue_item(ds, dm, it);
        pump(ds);
        return;
    }
    if (loading == 0)
        spread_loads(ds, dm); /* the plan placed it nowhere yet: any worker will do */
    loaded_anywhere(ds, dm, &loading);
    if (loading == 0 && !held_while_profiling(ds, dm) && !back_in_time(ds, dm, it)) {
        fail_item(ds, it, SQ_NO_WORKER,
                  atomic_load(&ds->srv->kind_coming[dm->kind]) > 0
                      ? "no worker is up, and none is back before the deadline"
                      : "no worker could load the model");
        return;
    }
    /* Waits for the load, for the worker holding it to finish measuring,
     * or for a worker being restarted (bounded by its deadline, see
     * on_tick). */
    if (dm->npending == dm->cappending) {
        dm->cappending = dm->cappending ? 2 * dm->cappending : 16;
        dm->pending = sq_xrealloc(dm->pending, sizeof(*dm->pending) * (size_t)dm->cappending);
    }
    dm->pending[dm->npending++] = it;
}

void gw_dispatch_submit(gw_server_t *srv, gw_item_t *item)
{
    sq_loop_post(srv->dispatch_loop, on_submit, item);
}

typedef struct {
    gw_server_t *srv;
    int64_t key;
    int profile;
} model_msg_t;

static void on_model_changed(sq_loop_t *loop, void *arg)
{
    model_msg_t *msg = arg;
    gw_dispatch_t *ds = msg->srv->dispatch;
    (void)loop;
    if (ds->aborted) {
        free(msg);
        return;
    }
    gw_model_t *m = gw_registry_get(msg->srv->registry, msg->key);
    ds_model_t *dm = model_find(ds, msg->key);
    /* Groups: a member gone, or a new model ready to join, makes the next
     * request form the group anew. */
    ds->group_epoch++;
    for (int i = 0; i < ds->nmodels; i++) {
        ds_model_t *g = ds->models[i];
        if (!g->is_group || g->removed)
            continue;
        int member = 0;
        for (int k = 0; k < g->nmembers; k++)
            member |= g->members[k]->key == msg->key;
        if (member && m == NULL)
            group_retire(ds, g, "a member model was deleted");
        else if (!member && m != NULL && m->group_id == g->group_id &&
                 strcmp(m->status, "ready") == 0)
            group_retire(ds, g, "a new model joins the group");
    }
    if (m == NULL) {
        if (dm != NULL && !dm->removed) {
            dm->removed = 1;
            ds->reclaim_due = 1;
            fail_pending(ds, dm, SQ_MODEL_NOT_FOUND, "the model was deleted");
            withdraw(ds, dm);
            sq_bytes_unref(dm->blob);
            dm->blob = NULL;
            dm->blob_state = 0;
            if (dm->kind >= 0)
                gw__plan_invalidate(ds, dm->kind, "model removed");
        }
    } else {
        if (dm == NULL)
            dm = model_get(ds, m);
        gw_model_unref(dm->m);
        dm->m = m; /* the new entry (profile, status) */
        m = NULL;
        if (msg->profile != PROFILE_NONE) {
            gw_model_t *twin = msg->profile == PROFILE_WANTED ? twin_find(ds, dm->m) : NULL;
            if (twin != NULL) {
                /* Measured already, as its older copy: nothing to measure. */
                profile_copy_job_t *j = sq_xcalloc(1, sizeof(*j));
                j->srv = ds->srv;
                j->from = twin->key;
                j->to = dm->key;
                SQ_INFO("profile taken from an identical model model=%s version=%d from=%s:%d",
                        dm->m->name, dm->m->version, twin->name, twin->version);
                gw_model_unref(twin);
                gw_db_post(ds->srv, profile_copy_job, j);
            } else {
                dm->profile_pending = 1;
                start_profile(ds, dm);
            }
        }
        /* A model that became ready may complete a group: measure it now,
         * before its traffic comes. */
        group_of(ds, dm);
    }
    gw_model_unref(m);
    pump(ds);
    free(msg);
}

static void post_model_msg(gw_server_t *srv, int64_t key, int profile)
{
    model_msg_t *msg = sq_xcalloc(1, sizeof(*msg));
    msg->srv = srv;
    msg->key = key;
    msg->profile = profile;
    sq_loop_post(srv->dispatch_loop, on_model_changed, msg);
}

void gw_dispatch_model_changed(gw_server_t *srv, int64_t key)
{
    post_model_msg(srv, key, PROFILE_NONE);
}

void gw_dispatch_profile(gw_server_t *srv, int64_t key)
{
    post_model_msg(srv, key, PROFILE_WANTED);
}

static void resume_one(gw_model_t *m, void *arg)
{
    if (strcmp(m->status, "profiling") == 0)
        gw_dispatch_profile(arg, m->key);
}

void gw_dispatch_resume_profiling(gw_server_t *srv)
{
    gw_registry_foreach(srv->registry, resume_one, srv);
}

static void model_free(ds_model_t *dm)
{
    gw_model_unref(dm->m);
    for (int k = 0; k < dm->nmembers; k++)
        gw_model_unref(dm->members[k]);
    free(dm->members);
    group_free_blobs(dm);
    sq_bytes_unref(dm->blob);
    free(dm->pending);
    free(dm);
}

/* Frees what a delete left: a removed model (or retired group) once nothing
 * waits for it, no batch of it runs, and no other model points to it; and
 * workers' records of loads that are gone with no answer to come. Keeps
 * the tables (and their linear scans) as large as what is live. */
static void reclaim(gw_dispatch_t *ds)
{
    if (!ds->reclaim_due)
        return;
    ds->reclaim_due = 0;
    for (int i = 0; i < ds->nworkers; i++) {
        ds_worker_t *w = ds->workers[i];
        if (w == NULL)
            continue;
        int k = 0;
        for (int j = 0; j < w->nloads; j++) {
            const ds_load_t *l = &w->loads[j];
            if (l->state != LOAD_NONE || l->stale > 0 || model_find(ds, l->key) != NULL)
                w->loads[k++] = *l;
        }
        w->nloads = k;
    }
    for (int i = 0; i < ds->nmodels; i++) {
        ds_model_t *dm = ds->models[i];
        if (!dm->removed)
            continue;
        if (dm->npending > 0 || dm->profile_worker >= 0) {
            ds->reclaim_due = 1;
            continue;
        }
        int busy = 0;
        for (int w = 0; w < ds->nworkers && !busy; w++) {
            const ds_worker_t *wk = ds->workers[w];
            busy = wk != NULL && wk->inflight != NULL && wk->inflight->model_key == dm->key;
        }
        if (busy) {
            ds->reclaim_due = 1; /* again when its batch is back */
            continue;
        }
        for (int j = 0; j < ds->nmodels; j++) {
            if (ds->models[j]->group == dm)
                ds->models[j]->group = NULL;
            if (ds->models[j]->twin == dm)
                ds->models[j]->twin = NULL;
        }
        for (int s = 0; s < ds->nsessions; s++)
            if (ds->sessions[s].model == dm)
                ds->sessions[s].model = NULL; /* its core session was removed */
        gw__plan_forget(ds, dm);
        model_free(dm);
        ds->models[i--] = ds->models[--ds->nmodels];
    }
}

/* Items waiting for a first load are bounded by their deadlines. */
static void on_tick(sq_loop_t *loop, uint64_t id, void *data)
{
    gw_dispatch_t *ds = data;
    (void)id;
    int64_t t = now_us();
    for (int i = 0; i < ds->nmodels; i++) {
        ds_model_t *dm = ds->models[i];
        int k = 0;
        for (int j = 0; j < dm->npending; j++) {
            gw_item_t *it = dm->pending[j];
            if (it->deadline_us <= t)
                fail_item(ds, it, SQ_DEADLINE, "the model was still loading at the deadline");
            else
                dm->pending[k++] = it;
        }
        dm->npending = k;
    }
    gw__plan_tick(ds, t);
    reclaim(ds);
    ds->tick = sq_loop_timer_at(loop, sq_now_ns() + (int64_t)TICK_MS * 1000000, on_tick, ds);
}

/* Tells w to unload l's model (see gw_dispatch_ops_t). */
static void unload(gw_dispatch_t *ds, ds_worker_t *w, ds_load_t *l)
{
    /* A load waiting for its bytes was never sent: nothing to unload. */
    if (l->state != LOAD_WAIT_BYTES)
        link_send(ds, w->id, SQ_MSG_MODEL_UNLOAD, (uint64_t)l->key, NULL, 0, NULL, 0);
    if (l->state == LOAD_SENT)
        l->stale++;
    int was_done = l->state == LOAD_DONE;
    l->state = LOAD_NONE;
    /* No batch of it may go to w from now on (the routes before a plan
     * covers a model are every worker that holds it). */
    ds_model_t *dm = was_done ? model_find(ds, l->key) : NULL;
    if (dm != NULL && !dm->removed && dm->active)
        update_routes(ds, dm);
}

static const gw_dispatch_ops_t dispatch_ops = {
    .send_load = send_load,
    .unload = unload,
    .update_routes = update_routes,
    .pump = pump,
    .model = model_get,
    .serving_kind = kind_of_model,
};

gw_dispatch_t *gw_dispatch_new(gw_server_t *srv, sq_loop_t *loop)
{
    gw_dispatch_t *ds = sq_xcalloc(1, sizeof(*ds));
    ds->srv = srv;
    ds->ops = &dispatch_ops;
    ds->loop = loop;
    pl_dispatch_opts_t opts = {.policy = srv->cfg->policy,
                               .k_std = srv->cfg->k_std,
                               .net_delay_us = srv->cfg->dispatch_margin_us,
                               .timer_slack_us = srv->cfg->timer_slack_us};
    ds->core = pl_dispatch_new(&opts);
    ds->plan = gw__plan_new(ds);
    ds->group_epoch = 1;
    ds->tick = sq_loop_timer_at(loop, sq_now_ns() + (int64_t)TICK_MS * 1000000, on_tick, ds);
    return ds;
}

/* Answers everything the dispatcher holds 503 shutting_down: requests
 * waiting for a load, queued in the core, and in batches still running
 * (whose late BATCH_DONE then finds nothing, and whose worker's loss later
 * hands the core's ids back as stale handles). Idempotent. */
static void abort_all(gw_dispatch_t *ds)
{
    static const char why[] = "squishd is shutting down";
    ds->aborted = 1;
    for (int i = 0; i < ds->nmodels; i++)
        fail_pending(ds, ds->models[i], SQ_SHUTTING_DOWN, why);
    for (int i = 0; i < ds->nworkers; i++) {
        ds_worker_t *w = ds->workers[i];
        if (w == NULL || w->inflight == NULL)
            continue;
        ds_batch_t *b = w->inflight;
        w->inflight = NULL;
        for (int k = 0; k < b->count; k++)
            fail_item(ds, b->items[k], SQ_SHUTTING_DOWN, why);
        /* The worker may still write into the outputs: the region stays
         * allocated until the arena goes (squishd is exiting). The core
         * forgets the batch. */
        pl_dispatch_batch_done(ds->core, now_us(), w->id, b->id);
        free(b->items);
        free(b);
    }
    for (int s = 0; s < ds->nsessions; s++)
        pl_dispatch_session_remove(ds->core, now_us(), s);
    /* Queued requests come back as drops: pump answers them (aborted). */
    pump(ds);
    /* Whatever still has a handle (none should) is answered too. */
    for (uint32_t i = 0; i < ds->nhandles; i++)
        if (ds->handles[i].item != NULL)
            fail_item(ds, ds->handles[i].item, SQ_SHUTTING_DOWN, why);
    if (ds->timer)
        sq_loop_timer_cancel(ds->loop, ds->timer);
    ds->timer = 0;
}

void gw_dispatch_free(gw_dispatch_t *ds)
{
    if (ds == NULL)
        return;
    for (int i = 0; i < ds->nworkers; i++) {
        ds_worker_t *w = ds->workers[i];
        if (w == NULL)
            continue;
        free(w->loads);
        free(w->shas);
        free(w);
    }
    for (int i = 0; i < ds->nmodels; i++)
        model_free(ds->models[i]);
    free(ds->workers);
    free(ds->models);
    free(ds->sessions);
    free(ds->handles);
    gw__plan_free(ds->plan);
    pl_dispatch_free(ds->core);
    free(ds);
}

/* ---- the link's events ------------------------------------------------------ */

static void ev_up(void *ctx, int worker, const char *device, uint64_t memory_bytes)
{
    worker_up(ctx, worker, device, memory_bytes);
}

static int ev_frame(void *ctx, int worker, const sq_frame_t *f)
{
    return on_frame(ctx, worker, f);
}

static void ev_lost(void *ctx, int worker)
{
    worker_lost(ctx, worker);
}

static void ev_exited(void *ctx, int worker, int status)
{
    worker_exited(ctx, worker, status);
}

static void ev_abort(void *ctx)
{
    abort_all(ctx);
}

const gw_transport_events_t gw_dispatch_events = {
    .up = ev_up, .frame = ev_frame, .lost = ev_lost, .exited = ev_exited, .abort = ev_abort};
