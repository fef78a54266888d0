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

#include <pl_dispatch.h>
#include <wk.h>

#include <stdlib.h>
#include <string.h>

/* SLO buckets (ms): a request joins the session of the largest bucket not
 * above its SLO, so that a session's batches fit every member's SLO and the
 * number of sessions (and metric label values) stays bounded. */
static const double slo_buckets_ms[] = {5,   10,   15,   20,   25,   30,   40,    50,    60,
                                        75,  100,  125,  150,  200,  250,  300,   400,   500,
                                        750, 1000, 1500, 2000, 3000, 5000, 10000, 30000, 60000};
#define NBUCKETS (sizeof(slo_buckets_ms) / sizeof(slo_buckets_ms[0]))

#define TICK_MS 50
#define PROFILE_WARMUP 3
#define PROFILE_REPEATS 8
#define PROFILE_BUDGET_MS 30000

double gw_slo_bucket_ms(double slo_ms)
{
    double b = slo_buckets_ms[0];
    for (size_t i = 0; i < NBUCKETS && slo_buckets_ms[i] <= slo_ms; i++)
        b = slo_buckets_ms[i];
    return b;
}

static int64_t now_us(void)
{
    return sq_now_us();
}

/* ---- lookups ----------------------------------------------------------- */

static ds_worker_t *worker_get(gw_dispatch_t *ds, int id)
{
    return id >= 0 && id < ds->nworkers ? ds->workers[id] : NULL;
}

static ds_load_t *load_of(ds_worker_t *w, int64_t key, int create)
{
    for (int i = 0; i < w->nloads; i++)
        if (w->loads[i].key == key)
            return &w->loads[i];
    if (!create)
        return NULL;
    if (w->nloads == w->caploads) {
        w->caploads = w->caploads ? 2 * w->caploads : 8;
        w->loads = sq_xrealloc(w->loads, sizeof(*w->loads) * (size_t)w->caploads);
    }
    w->loads[w->nloads] = (ds_load_t){.key = key};
    return &w->loads[w->nloads++];
}

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

static int kind_of_model(gw_server_t *srv, const gw_model_t *m)
{
    if (m->emulated)
        return m->has_profile[GW_KIND_EMU] && atomic_load(&srv->kind_up[GW_KIND_EMU]) > 0
                   ? GW_KIND_EMU
                   : -1;
    if (m->has_profile[GW_KIND_CUDA] && atomic_load(&srv->kind_up[GW_KIND_CUDA]) > 0)
        return GW_KIND_CUDA;
    if (m->has_profile[GW_KIND_CPU] && atomic_load(&srv->kind_up[GW_KIND_CPU]) > 0)
        return GW_KIND_CPU;
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

/* ---- finishing items --------------------------------------------------- */

static void release_input(gw_dispatch_t *ds, gw_item_t *it)
{
    if (it->in_off >= 0) {
        sq_shm_release(ds->srv->arena, it->in_off);
        it->in_off = -1;
    }
}

static void fail_item(gw_dispatch_t *ds, gw_item_t *it, int rc, const char *detail)
{
    release_input(ds, it);
    it->done_us = now_us();
    gw_item_finish(it, rc, detail);
}

/* ---- actions of the core ----------------------------------------------- */

static void on_timer(sq_loop_t *loop, uint64_t id, void *data);
static void pump(gw_dispatch_t *ds);
static void on_submit(sq_loop_t *loop, void *arg);
static void update_routes(gw_dispatch_t *ds, ds_model_t *dm);

static void send_batch(gw_dispatch_t *ds, int worker, int session, uint64_t batch_id,
                       gw_item_t **items, int count)
{
    ds_worker_t *w = worker_get(ds, worker);
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
    ds_load_t *l = load_of(w, m->key, 0);
    if (l == NULL || l->state != LOAD_DONE) {
        /* The worker was told to unload the model after the core chose it
         * (a plan moving the model): the requests go back to their model. */
        SQ_DEBUG("batch not sent: model=%s not loaded on worker=%d", m->name, w->id);
        sq_shm_release(ds->srv->arena, out_off);
        for (int i = 0; i < count; i++)
            sq_loop_post(ds->loop, on_submit, items[i]);
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
                        .sent_us = t};
    w->inflight = rec;
    if (gw_workers_send(ds->srv->workers, worker, SQ_MSG_BATCH, batch_id, buf.data,
                        (uint32_t)buf.len) != 0)
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

/* Takes the core's actions (those produced since the last take: a pump with
 * no call into the core in between has nothing to do) and acts on them. Actions are
 * copied first: acting may call into the core again (a send that fails
 * frees the worker), which replaces the core's arrays; such a handler pumps
 * again itself. */
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
                for (int k = 0; k < a->count; k++)
                    copy[i].items[k] = (gw_item_t *)(uintptr_t)a->ids[k];
            }
        }
        for (size_t i = 0; i < n; i++) {
            act_copy_t *a = &copy[i];
            SQ_DEBUG("dispatch action kind=%d session=%d worker=%d count=%d at_us=%lld reason=%s",
                     a->kind, a->session, a->worker, a->count, (long long)a->at_us,
                     a->kind == PL_ACT_DROP ? sq_err_name(a->reason) : "-");
            switch (a->kind) {
            case PL_ACT_SEND:
                send_batch(ds, a->worker, a->session, a->batch_id, a->items, a->count);
                break;
            case PL_ACT_DROP: {
                gw_item_t *it = (gw_item_t *)(uintptr_t)a->request_id;
                if (a->reason == SQ_NOT_FOUND && a->session >= 0 && a->session < ds->nsessions &&
                    ds->sessions[a->session].model->is_group && !ds->aborted) {
                    /* Its prefix group was retired: the request runs in
                     * its own model's session instead. */
                    sq_loop_post(ds->loop, on_submit, it);
                    break;
                }
                if (a->reason == SQ_NOT_FOUND) {
                    /* Its session went with its model (a delete). */
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
                gw_metrics_drop(ds->srv->metrics, it->req->model, a->reason);
                fail_item(ds, it, a->reason, why);
                break;
            }
            case PL_ACT_TIMER:
                if (ds->timer)
                    sq_loop_timer_cancel(ds->loop, ds->timer);
                ds->timer = 0;
                if (a->at_us != PL_NEVER)
                    ds->timer = sq_loop_timer_at(ds->loop, a->at_us * 1000, on_timer, ds);
                break;
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
        ds_load_t *l = ds->workers[w] ? load_of(ds->workers[w], dm->key, 0) : NULL;
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
        ds_load_t *l = w && w->up ? load_of(w, dm->key, 0) : NULL;
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
        ds_load_t *l = w && w->up && w->profiling ? load_of(w, dm->key, 0) : NULL;
        if (l != NULL && l->state == LOAD_DONE)
            return 1;
    }
    return 0;
}

static void enqueue_item(gw_dispatch_t *ds, ds_model_t *dm, gw_item_t *it)
{
    gw_infer_t *req = it->req;
    gw__plan_arrival(ds, dm, gw_slo_bucket_ms(req->slo_ms));
    int s = ensure_session(ds, dm, gw_slo_bucket_ms(req->slo_ms), it->input_kind);
    if (s < 0) {
        fail_item(ds, it, SQ_NOT_READY, "the model has no usable profile");
        return;
    }
    update_routes(ds, dm);
    pl_dispatch_request(ds->core, now_us(), (uint64_t)(uintptr_t)it, s, req->arrival_us,
                        req->deadline_us);
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
        end_profile(ds, dm, worker_get(ds, dm->profile_worker));
    for (int s = 0; s < ds->nsessions; s++)
        if (ds->sessions[s].model == dm)
            pl_dispatch_session_remove(ds->core, now_us(), s);
    for (int i = 0; i < ds->nworkers; i++) {
        ds_worker_t *w = ds->workers[i];
        ds_load_t *l = w ? load_of(w, dm->key, 0) : NULL;
        if (l != NULL && w->up && l->state != LOAD_NONE)
            gw__ds_unload(ds, w, l);
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
    if (dm == NULL || dm->removed) {
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
        ds_load_t *l = w ? load_of(w, dm->key, 0) : NULL;
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
    int rc = gw_workers_send(ds->srv->workers, w->id, SQ_MSG_MODEL_LOAD, (uint64_t)key, buf.data,
                             (uint32_t)buf.len);
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
        rc = gw_workers_send_ref(ds->srv->workers, w->id, SQ_MSG_MODEL_CHUNK, (uint64_t)key, bytes,
                                 off, (uint32_t)n);
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
    ds_load_t *l = load_of(w, dm->key, 1);
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
        ds_load_t *l = load_of(w, dm->key, 0);
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
    if (g != NULL && !g->removed && !g->failed) {
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
    gm->key = -(int64_t)(((uint64_t)m->group_id << 20) | (++ds->group_gen & 0xfffff));
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
    if (g == NULL || g->removed || j->rc != 0) {
        if (g != NULL && !g->removed) {
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
        ds_load_t *l = w ? load_of(w, g->key, 0) : NULL;
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
    ds_load_t *l = load_of(w, g->key, 1);
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
    if (!dm->profile_pending || dm->profile_worker >= 0 || dm->removed)
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
    ds_load_t *l = load_of(pick, dm->key, 0);
    if (l != NULL && l->state == LOAD_DONE) {
        sq_profile_req_t req = {.max_batch = (uint32_t)dm->m->max_batch,
                                .warmup = PROFILE_WARMUP,
                                .repeats = PROFILE_REPEATS,
                                .budget_ms = PROFILE_BUDGET_MS};
        sq_buf_t buf;
        sq_buf_init(&buf);
        sq_profile_req_encode(&buf, &req);
        gw_workers_send(ds->srv->workers, pick->id, SQ_MSG_PROFILE, (uint64_t)dm->key, buf.data,
                        (uint32_t)buf.len);
        sq_buf_dispose(&buf);
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
    if (rc != 0)
        SQ_ERROR("cannot store the profile key=%lld error=\"%s\"", (long long)p->key,
                 mdb_errmsg(db));
    json_t *recs;
    if (mdb_model_records(db, p->key, &recs) == 0 && json_array_size(recs) == 1)
        gw_registry_put(p->srv->registry, gw_model_from_record(json_array_get(recs, 0)));
    json_decref(recs);
    gw_dispatch_model_changed(p->srv, p->key);
    free(p);
}

/* ---- worker frames ------------------------------------------------------- */

static void on_batch_done(gw_dispatch_t *ds, ds_worker_t *w, const sq_frame_t *f)
{
    sq_batch_done_t done;
    if (sq_batch_done_decode(f, &done) != 0 || w->inflight == NULL || w->inflight->id != f->id) {
        SQ_WARN("unexpected BATCH_DONE worker=%d batch=%llu", w->id, (unsigned long long)f->id);
        return;
    }
    ds_batch_t *b = w->inflight;
    w->inflight = NULL;
    int64_t t = now_us();
    gw__plan_busy(ds, w->id, t - b->sent_us);
    gw_metrics_batch(ds->srv->metrics, b->items[0]->req->model, w->id, w->device, b->count,
                     t - b->sent_us, &done);
    pl_dispatch_batch_done(ds->core, t, w->id, b->id);
    const uint8_t *base = sq_shm_arena_base(ds->srv->arena);
    for (int i = 0; i < b->count; i++) {
        gw_item_t *it = b->items[i];
        if (done.code == 0) {
            gw_model_t *m = it->req->model;
            memcpy(it->req->outputs + (size_t)it->index * (size_t)m->out_elems,
                   base + b->out_off + b->out_stride * (uint64_t)i,
                   (size_t)m->out_elems * sizeof(float));
            release_input(ds, it);
            it->done_us = t;
            gw__plan_outcome(ds, it->done_us <= it->req->deadline_us);
            gw_item_finish(it, 0, NULL);
        } else {
            fail_item(ds, it, SQ_DEVICE, done.message);
        }
    }
    if (done.code != 0)
        SQ_WARN("batch failed worker=%d code=%s message=\"%s\"", w->id, sq_err_name(done.code),
                done.message);
    sq_shm_release(ds->srv->arena, b->out_off);
    free(b->items);
    free(b);
    pump(ds);
}

int gw_dispatch_frame(gw_dispatch_t *ds, int worker, const sq_frame_t *f)
{
    ds_worker_t *w = worker_get(ds, worker);
    if (w == NULL)
        return -1;
    switch (f->type) {
    case SQ_MSG_BATCH_DONE:
        on_batch_done(ds, w, f);
        return 0;
    case SQ_MSG_MODEL_LOADED:
    case SQ_MSG_MODEL_FAILED: {
        ds_model_t *dm = model_find(ds, (int64_t)f->id);
        ds_load_t *l = load_of(w, (int64_t)f->id, 0);
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
        if (dm == NULL || dm->removed || dm->profile_worker != w->id) {
            /* Abandoned (the model deleted, the group retired): the worker
             * was released then, and nothing is stored. */
            free(p);
            return 0;
        }
        end_profile(ds, dm, w);
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

void gw_dispatch_worker_up(gw_dispatch_t *ds, int worker, const char *device, uint64_t memory)
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
    gw__plan_invalidate(ds, w->kind, "worker up");
    pump(ds);
}

void gw_dispatch_worker_lost(gw_dispatch_t *ds, int worker)
{
    ds_worker_t *w = worker_get(ds, worker);
    if (w == NULL || !w->up)
        return;
    w->up = 0;
    atomic_fetch_sub(&ds->srv->kind_up[w->kind], 1);
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
    gw_dispatch_t *ds = it->req->base.srv->dispatch;
    (void)loop;
    gw_model_t *m = it->req->model;
    it->ready_us = now_us();
    if (ds->aborted) {
        fail_item(ds, it, SQ_SHUTTING_DOWN, "squishd is shutting down");
        return;
    }
    if (it->ready_us >= it->req->deadline_us) {
        fail_item(ds, it, SQ_DEADLINE, "the deadline passed during preprocessing");
        return;
    }
    ds_model_t *dm = model_get(ds, m);
    if (dm->removed) {
        fail_item(ds, it, SQ_MODEL_NOT_FOUND, "the model was deleted");
        return;
    }
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
        gw__plan_activate(ds, dm, gw_slo_bucket_ms(it->req->slo_ms));
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
    if (loading == 0 && !held_while_profiling(ds, dm)) {
        fail_item(ds, it, SQ_NO_WORKER, "no worker could load the model");
        return;
    }
    /* Waits for the load, or for the worker holding it to finish measuring
     * (bounded by its deadline, see on_tick). */
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
        if (msg->profile) {
            dm->profile_pending = 1;
            start_profile(ds, dm);
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
    post_model_msg(srv, key, 0);
}

void gw_dispatch_profile(gw_server_t *srv, int64_t key)
{
    post_model_msg(srv, key, 1);
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
            if (it->req->deadline_us <= t)
                fail_item(ds, it, SQ_DEADLINE, "the model was still loading at the deadline");
            else
                dm->pending[k++] = it;
        }
        dm->npending = k;
    }
    gw__plan_tick(ds, t);
    ds->tick = sq_loop_timer_at(loop, sq_now_ns() + (int64_t)TICK_MS * 1000000, on_tick, ds);
}

gw_dispatch_t *gw_dispatch_new(gw_server_t *srv, sq_loop_t *loop)
{
    gw_dispatch_t *ds = sq_xcalloc(1, sizeof(*ds));
    ds->srv = srv;
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

void gw_dispatch_abort_all(gw_dispatch_t *ds)
{
    ds->aborted = 1;
    for (int i = 0; i < ds->nmodels; i++)
        fail_pending(ds, ds->models[i], SQ_SHUTTING_DOWN, "squishd is shutting down");
    for (int s = 0; s < ds->nsessions; s++)
        pl_dispatch_session_remove(ds->core, now_us(), s);
    /* Queued requests come back as drops; answer them as a shutdown. */
    const pl_action_t *acts;
    size_t n = pl_dispatch_take(ds->core, &acts);
    for (size_t i = 0; i < n; i++)
        if (acts[i].kind == PL_ACT_DROP)
            fail_item(ds, (gw_item_t *)(uintptr_t)acts[i].request_id, SQ_SHUTTING_DOWN,
                      "squishd is shutting down");
    for (int i = 0; i < ds->nworkers; i++) {
        ds_worker_t *w = ds->workers[i];
        if (w != NULL && w->inflight != NULL) {
            for (int k = 0; k < w->inflight->count; k++)
                fail_item(ds, w->inflight->items[k], SQ_SHUTTING_DOWN, "squishd is shutting down");
            sq_shm_release(ds->srv->arena, w->inflight->out_off);
            free(w->inflight->items);
            free(w->inflight);
            w->inflight = NULL;
        }
    }
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
    for (int i = 0; i < ds->nmodels; i++) {
        ds_model_t *dm = ds->models[i];
        gw_model_unref(dm->m);
        for (int k = 0; k < dm->nmembers; k++)
            gw_model_unref(dm->members[k]);
        free(dm->members);
        group_free_blobs(dm);
        sq_bytes_unref(dm->blob);
        free(dm->pending);
        free(dm);
    }
    free(ds->workers);
    free(ds->models);
    free(ds->sessions);
    gw__plan_free(ds->plan);
    pl_dispatch_free(ds->core);
    free(ds);
}

/* ---- for planning.c ---------------------------------------------------- */

ds_worker_t *gw__ds_worker(gw_dispatch_t *ds, int id)
{
    return worker_get(ds, id);
}

void gw__ds_unload(gw_dispatch_t *ds, ds_worker_t *w, ds_load_t *l)
{
    /* A load waiting for its bytes was never sent: nothing to unload. */
    if (l->state != LOAD_WAIT_BYTES)
        gw_workers_send(ds->srv->workers, w->id, SQ_MSG_MODEL_UNLOAD, (uint64_t)l->key, NULL, 0);
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

ds_load_t *gw__ds_load_of(ds_worker_t *w, int64_t key, int create)
{
    return load_of(w, key, create);
}

void gw__ds_send_load(gw_dispatch_t *ds, ds_model_t *dm, ds_worker_t *w)
{
    send_load(ds, dm, w);
}

void gw__ds_update_routes(gw_dispatch_t *ds, ds_model_t *dm)
{
    update_routes(ds, dm);
}

void gw__ds_pump(gw_dispatch_t *ds)
{
    pump(ds);
}

ds_model_t *gw__ds_model(gw_dispatch_t *ds, gw_model_t *m)
{
    return model_get(ds, m);
}
