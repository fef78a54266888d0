/* Epochs: what the planning loop (planner/pl_loop.h) is fed (the models,
 * with their profiles, and the pipelines' splits), and each plan applied to
 * the workers: loads before any route points at a model, duty cycles,
 * routes (and their fallbacks while the planned workers load), and
 * unloads only after routes moved away (make before break). */
#include "placement_int.h"
#include "gw_catalog.h"

#include <pl_loop.h>

#include <assert.h>
#include <pthread.h>

#include <stdlib.h>
#include <string.h>

static int same_model(const ds_model_t *dm, const char *name, int version)
{
    return strcmp(dm->m->name, name) == 0 && (version == 0 || dm->m->version == version);
}

void ds_plan_sync_models(gw_dispatch_t *ds)
{
    for (int i = 0; i < ds->nmodels; i++) {
        ds_model_t *dm = ds->models[i];
        int kind = dm->kind;
        int has = kind >= 0 && kind < SQ_DEV_KIND_COUNT && dm->m->has_profile[kind];
        if (has)
            dm->m->profile[kind].memory_bytes = dm->m->profile[kind].memory_bytes > 0
                                                    ? dm->m->profile[kind].memory_bytes
                                                    : (double)dm->m->memory_bytes;
        pl_loop_model_t lm = {.kind = kind,
                              .profile = has ? ds_profile(dm, kind) : NULL,
                              .name = dm->m->name,
                              .item_bytes = ds_item_bytes(dm->m, SQ_INPUT_PIXELS),
                              .active = dm->active && !dm->removed};
        pl_loop_model_set(ds->place.plan->loop, dm->key, &lm);
    }
}

/* Hands the loop pipe's split: each stage's model, parent, measured gamma
 * and budget. */
static void pipeline_to_loop(gw_dispatch_t *ds, gw_pipeline_t *pipe)
{
    pl_loop_stage_t st[GW_PIPE_MAX_STAGES];
    gw_stage_clumps_t cl[GW_PIPE_MAX_STAGES];
    int nc = gw_pipeline_clumps(pipe, cl);
    int c = 0;
    for (int i = 0; i < pipe->nstages; i++) {
        const gw_stage_spec_t *spec = &pipe->stages[i];
        st[i] = (pl_loop_stage_t){.model = -1,
                                  .parent = spec->parent,
                                  .gamma = 1,
                                  .budget_ms = gw_pipeline_budget_ms(pipe, i)};
        for (int m = 0; m < ds->nmodels && st[i].model < 0; m++)
            if (!ds->models[m]->removed && same_model(ds->models[m], spec->model, spec->version))
                st[i].model = ds->models[m]->key;
        /* gw_pipeline_clumps lists the crop stages in stage order. */
        if (spec->parent >= 0 && c < nc)
            st[i].gamma = cl[c++].gamma;
    }
    pl_loop_pipeline_set(ds->place.plan->loop, ds_plan_pipe_key(pipe), pipe->slo_ms, st,
                         pipe->nstages);
}

void ds_plan_sync_pipelines(gw_dispatch_t *ds)
{
    ds_plan_state_t *p = ds->place.plan;
    if (p->npipes == 0)
        return;
    int np = 0;
    gw_pipeline_t **live = gw_pipes_all(ds->pipelines, &np);
    for (int i = p->npipes - 1; i >= 0; i--) {
        int found = 0;
        for (int k = 0; k < np && !found; k++)
            found = live[k] == p->pipes[i];
        if (found) {
            pipeline_to_loop(ds, p->pipes[i]);
            continue;
        }
        pl_loop_pipeline_drop(p->loop, ds_plan_pipe_key(p->pipes[i]));
        gw_pipeline_unref(p->pipes[i]);
        p->pipes[i] = p->pipes[--p->npipes];
    }
    for (int k = 0; k < np; k++)
        gw_pipeline_unref(live[k]);
    free(live);
}

void ds_plan_pipeline_known(gw_dispatch_t *ds, gw_pipeline_t *pipe)
{
    ds_plan_state_t *p = ds->place.plan;
    for (int i = 0; i < p->npipes; i++)
        if (p->pipes[i] == pipe)
            return;
    if (p->npipes == p->cappipes) {
        p->cappipes = p->cappipes ? 2 * p->cappipes : 4;
        p->pipes = sq_xrealloc(p->pipes, sizeof(*p->pipes) * (size_t)p->cappipes);
    }
    gw_pipeline_ref(pipe);
    p->pipes[p->npipes++] = pipe;
    ds_plan_sync_models(ds);
    pipeline_to_loop(ds, pipe);
}

static int usable(ds_worker_t *w, int64_t key)
{
    ds_load_t *l = w != NULL && w->up ? ds_load_find(w, key, 0) : NULL;
    return l != NULL && l->state == LOAD_DONE;
}

static int usable_worker(void *ctx, int worker, int64_t model)
{
    return usable(ds_worker_at(ctx, worker), model);
}

int ds_plan_holders(gw_dispatch_t *ds, const ds_model_t *dm, int *holders)
{
    int n = 0;
    for (int i = 0; i < ds->nworkers; i++)
        if (usable(ds->workers[i], dm->key))
            holders[n++] = i;
    return n;
}

int ds_plan_routes(gw_dispatch_t *ds, const ds_session_t *s, const int *holders, int nholders,
                   pl_route_t *routes, int max)
{
    /* No plan covers the session yet, or its planned workers are still
     * loading the model: every worker that holds it serves meanwhile. */
    pl_loop_route_env_t env = {
        .usable = usable_worker, .ctx = ds, .holders = holders, .nholders = nholders};
    return pl_loop_routes(ds->place.plan->loop, s->model->key, s->bucket_ms, &env, routes, max);
}

/* Who holds what in kind's plan: (model key, worker) of every allocation,
 * or of every overflow route, sorted by key then worker. */
typedef struct ds_holding {
    int64_t key;
    int worker;
} holding_t;

static int holding_cmp(const void *a, const void *b)
{
    const holding_t *x = a, *y = b;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    return (x->worker > y->worker) - (x->worker < y->worker);
}

/* The first holding of key in h[0..n), or n. */
static int holding_first(const holding_t *h, int n, int64_t key)
{
    int lo = 0, hi = n;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (h[mid].key < key)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static int holds(const holding_t *h, int n, int64_t key, int worker)
{
    holding_t want = {key, worker};
    return bsearch(&want, h, (size_t)n, sizeof(*h), holding_cmp) != NULL;
}

/* Unloads what the plan moved away from a worker once it arrived where the
 * plan put it (make before break); until then the kind has moves pending.
 * A load has moved away when the worker holds none of the model's sessions
 * (nor their overflow) and another worker holds one; it has arrived when
 * one of those finished loading it. Indexed once a settle: the plan's
 * holdings sorted by model (a scan per load was O(loads x sessions x
 * devices), seconds at a thousand sessions), the overflow's in a set; then
 * worker by worker, in slices (settle_step). */
static void settle_free(ds_settle_t *st)
{
    free(st->alloc);
    free(st->arrived_at);
    sq_map_dispose(&st->over);
    memset(st, 0, sizeof(*st));
}

static void settle_begin(gw_dispatch_t *ds, int kind)
{
    ds_plan_kind_t *K = &ds->place.plan->kinds[kind];
    pl_loop_t *loop = ds->place.plan->loop;
    const pl_plan_t *plan = pl_loop_current(loop, kind);
    settle_free(&K->settle);
    if (plan == NULL)
        return;
    ds_settle_t *st = &K->settle;
    K->moves_pending = 0;
    int nallocs = 0;
    for (int d = 0; d < plan->ndevices; d++)
        nallocs += plan->devices[d].nallocs;
    /* The plan names each session's model by its key (pl_session_t.model). */
    st->alloc = sq_xcalloc((size_t)nallocs + 1, sizeof(*st->alloc));
    for (int d = 0; d < plan->ndevices; d++) {
        int worker = pl_loop_device_key(loop, kind, plan->devices[d].id);
        for (int a = 0; a < plan->devices[d].nallocs; a++)
            st->alloc[st->na++] = (holding_t){plan->devices[d].allocs[a].model, worker};
    }
    qsort(st->alloc, (size_t)st->na, sizeof(*st->alloc), holding_cmp);
    for (int o = 0; o < plan->noverflow; o++)
        sq_map_put(&st->over, (uint64_t)plan->overflow[o].model,
                   (uint64_t)pl_loop_device_key(loop, kind, plan->overflow[o].device_id), 0);
    st->arrived_at = sq_xcalloc((size_t)st->na + 1, 1);
    st->devices = plan->devices;
    st->active = 1;
}

/* Settles worker by worker until deadline_ns (0: to the end); the models
 * it unloaded are routed again before it returns. Returns 1 when done. */
static int settle_step(gw_dispatch_t *ds, int kind, int64_t deadline_ns)
{
    ds_plan_kind_t *K = &ds->place.plan->kinds[kind];
    ds_settle_t *st = &K->settle;
    const pl_plan_t *plan = pl_loop_current(ds->place.plan->loop, kind);
    if (!st->active || plan == NULL || plan->devices != st->devices) {
        settle_free(st); /* a plan adopted since settles itself */
        return 1;
    }
    ds->place.routes_deferred = 1;
    while (st->cursor < ds->nworkers) {
        ds_worker_t *w = ds->workers[st->cursor++];
        if (w == NULL || !w->up || w->kind != kind)
            continue;
        for (int li = 0; li < w->nloads; li++) {
            ds_load_t *l = &w->loads[li];
            if (l->state != LOAD_DONE && l->state != LOAD_SENT)
                continue;
            if (holds(st->alloc, st->na, l->key, w->id) ||
                sq_map_get(&st->over, (uint64_t)l->key, (uint64_t)w->id) == 0)
                continue; /* still planned here */
            int first = holding_first(st->alloc, st->na, l->key);
            if (first == st->na || st->alloc[first].key != l->key)
                continue; /* planned nowhere: it stays where it is */
            /* Whether it arrived: asked once a model and settle (kept at
             * its first holding; 0 unknown, 1 no, 2 yes). */
            if (st->arrived_at[first] == 0) {
                int yes = 0;
                for (int h = first; h < st->na && st->alloc[h].key == l->key && !yes; h++) {
                    ds_worker_t *o = ds_worker_at(ds, st->alloc[h].worker);
                    ds_load_t *ol = o != NULL && o->up ? ds_load_find(o, l->key, 0) : NULL;
                    yes = ol != NULL && ol->state == LOAD_DONE;
                }
                st->arrived_at[first] = (char)(1 + yes);
            }
            int arrived = st->arrived_at[first] == 2;
            ds_model_t *dm = ds_model_find(ds, l->key);
            if (dm != NULL && dm->profile_worker == w->id)
                continue; /* measuring there */
            if (arrived)
                ds_unload(ds, w, l);
            else
                K->moves_pending = 1;
        }
        if (deadline_ns > 0 && sq_now_ns() > deadline_ns)
            break;
    }
    ds->place.routes_deferred = 0;
    for (int m = 0; m < ds->nmodels; m++) {
        ds_model_t *dm = ds->models[m];
        if (dm->routes_stale && dm->active && !dm->removed)
            ds_cmd_route(ds, dm);
    }
    if (st->cursor < ds->nworkers)
        return 0;
    settle_free(st);
    return 1;
}

/* What an epoch in flight holds, freed. */
static void apply_free(ds_plan_inflight_t *in)
{
    free(in->workers);
    free(in->dev_of);
    free(in->ov_first);
    free(in->ov);
    free(in->keys);
    in->workers = in->dev_of = in->ov_first = in->ov = NULL;
    in->keys = NULL;
    in->applying = 0;
}

/* ---- the planner thread ------------------------------------------------- */

static void *planner_thread(void *arg)
{
    ds_plan_state_t *p = arg;
    pthread_mutex_lock(&p->job_lock);
    for (;;) {
        pl_loop_job_t *job = NULL;
        int kind = -1;
        for (int k = 0; k < SQ_DEV_KIND_COUNT && job == NULL; k++)
            if (p->todo[k] != NULL) {
                job = p->todo[k];
                kind = k;
                p->todo[k] = NULL;
            }
        if (job == NULL) {
            if (p->stopping)
                break;
            pthread_cond_wait(&p->job_cond, &p->job_lock);
            continue;
        }
        pthread_mutex_unlock(&p->job_lock);
        pl_loop_job_run(job); /* the job owns all it reads (pl_loop.h) */
        pthread_mutex_lock(&p->job_lock);
        p->done[kind] = job;
    }
    pthread_mutex_unlock(&p->job_lock);
    return NULL;
}

int ds_plan_thread_start(ds_plan_state_t *p)
{
    pthread_mutex_init(&p->job_lock, NULL);
    pthread_cond_init(&p->job_cond, NULL);
    if (pthread_create(&p->thread, NULL, planner_thread, p) != 0) {
        SQ_WARN("cannot start the planner thread: plans are computed on the dispatch thread");
        return -1;
    }
    p->threaded = 1;
    return 0;
}

void ds_plan_thread_stop(ds_plan_state_t *p)
{
    if (!p->threaded)
        return;
    pthread_mutex_lock(&p->job_lock);
    p->stopping = 1;
    pthread_cond_signal(&p->job_cond);
    pthread_mutex_unlock(&p->job_lock);
    pthread_join(p->thread, NULL);
    for (int k = 0; k < SQ_DEV_KIND_COUNT; k++) {
        /* Jobs never applied: each is todo, done or (none) in flight. */
        pl_loop_job_free(p->loop, p->inflight[k].job);
        apply_free(&p->inflight[k]);
        p->inflight[k] = (ds_plan_inflight_t){0};
        p->todo[k] = p->done[k] = NULL;
    }
    pthread_mutex_destroy(&p->job_lock);
    pthread_cond_destroy(&p->job_cond);
    p->threaded = 0;
}

/* ---- epochs --------------------------------------------------------------- */

/* The plan of kind's epoch is computed: adopt it (pl_loop_plan_finish) and
 * begin applying it. Workers are those up when the epoch began; one gone
 * since is passed over (its loss invalidated the kind: the next epoch plans
 * without it). Returns 0 when there is something to apply. */
static int apply_begin(gw_dispatch_t *ds, int kind, ds_plan_inflight_t *in)
{
    ds_plan_state_t *p = ds->place.plan;
    int rc = pl_loop_plan_finish(p->loop, in->job);
    in->job = NULL;
    in->plan_ms = (double)(sq_now_ns() - in->begin_ns) / 1e6;
    if (rc != 0) {
        SQ_WARN("planning failed kind=%s code=%s", sq_dev_kind_name((sq_dev_kind_t)kind),
                sq_err_name(rc));
        free(in->workers);
        in->workers = NULL;
        return -1;
    }
    const pl_plan_t *plan = pl_loop_current(p->loop, kind);
    int nw = in->nworkers;
    /* With at most nw devices, kept ones on their own ids below nw and new
     * ones on the smallest free ids, every id names a worker. */
    for (int i = 0; i < plan->ndevices; i++)
        if (plan->devices[i].id < 0 || plan->devices[i].id >= nw)
            SQ_WARN("plan device id=%d has no worker (of=%d)", plan->devices[i].id, nw);
    p->epoch++;
    /* The plan read by worker: its device, and the overflow entries of
     * each device id (they name indices into workers[]), in plan order. */
    in->dev_of = sq_xmalloc(sizeof(int) * ((size_t)nw + 1));
    for (int j = 0; j < nw; j++)
        in->dev_of[j] = -1;
    for (int i = 0; i < plan->ndevices; i++)
        if (plan->devices[i].id >= 0 && plan->devices[i].id < nw)
            in->dev_of[plan->devices[i].id] = i;
    in->ov_first = sq_xcalloc((size_t)nw + 2, sizeof(int));
    in->ov = sq_xmalloc(sizeof(int) * ((size_t)plan->noverflow + 1));
    for (int o = 0; o < plan->noverflow; o++)
        if (plan->overflow[o].device_id >= 0 && plan->overflow[o].device_id < nw)
            in->ov_first[plan->overflow[o].device_id + 1]++;
    for (int j = 0; j < nw; j++)
        in->ov_first[j + 1] += in->ov_first[j];
    int *fill = sq_xcalloc((size_t)nw + 1, sizeof(int));
    for (int o = 0; o < plan->noverflow; o++) {
        int d = plan->overflow[o].device_id;
        if (d >= 0 && d < nw)
            in->ov[in->ov_first[d] + fill[d]++] = o;
    }
    free(fill);
    in->devices = plan->devices;
    in->applying = 1;
    in->phase = 0;
    in->cursor = 0;
    in->now_us = sq_now_us();
    return 0;
}

/* Loads worker j needs for its device's sessions and its overflow. */
static void apply_worker(gw_dispatch_t *ds, int kind, ds_plan_inflight_t *in, const pl_plan_t *plan,
                         int j)
{
    ds_worker_t *w = ds_worker_at(ds, in->workers[j]);
    if (w == NULL || !w->up || w->kind != kind)
        return;
    const pl_device_t *dev = in->dev_of[j] >= 0 ? &plan->devices[in->dev_of[j]] : NULL;
    pl_dispatch_worker_add(ds->batch.core, in->now_us, w->id,
                           dev != NULL && !dev->saturated ? (int64_t)dev->duty_cycle_us : 0);
    for (int a = 0; dev != NULL && a < dev->nallocs; a++) {
        ds_plan_view_t view;
        const ds_plan_view_t *ps = ds_plan_view(ds, dev->allocs[a].session_id, &view);
        ds_load_t *l = ps ? ds_load_find(w, ps->dm->key, 0) : NULL;
        if (ps != NULL && (l == NULL || l->state == LOAD_NONE || l->state == LOAD_FAILED))
            ds_send_load(ds, ps->dm, w);
    }
    /* A spare device also loads the busiest sessions' models: it takes
     * their overflow once it holds them (routes follow the loads). */
    for (int k = in->ov_first[j]; k < in->ov_first[j + 1]; k++) {
        ds_plan_view_t view;
        const ds_plan_view_t *ps = ds_plan_view(ds, plan->overflow[in->ov[k]].session_id, &view);
        ds_load_t *l = ps ? ds_load_find(w, ps->dm->key, 0) : NULL;
        if (ps != NULL && (l == NULL || l->state == LOAD_NONE || l->state == LOAD_FAILED))
            ds_send_load(ds, ps->dm, w);
    }
}

/* Applies kind's adopted plan until deadline_ns (0: to the end): loads
 * worker by worker (each paced by its duty cycle), routes model by model,
 * then unloads what moved away (make before break) and the report. Returns
 * 1 when the apply is over. */
static int apply_step(gw_dispatch_t *ds, int kind, ds_plan_inflight_t *in, int64_t deadline_ns)
{
    ds_plan_state_t *p = ds->place.plan;
    const pl_plan_t *plan = pl_loop_current(p->loop, kind);
    if (plan == NULL || plan->devices != in->devices) {
        /* Replaced meanwhile (a stored plan reapplied): that one applies. */
        apply_free(in);
        return 1;
    }
    if (in->phase == 0) {
        while (in->cursor < in->nworkers) {
            apply_worker(ds, kind, in, plan, in->cursor++);
            if (deadline_ns > 0 && sq_now_ns() > deadline_ns)
                return 0;
        }
        /* The models to route, by key: records may go meanwhile. */
        in->keys = sq_xmalloc(sizeof(int64_t) * ((size_t)ds->nmodels + 1));
        in->nkeys = 0;
        for (int i = 0; i < ds->nmodels; i++)
            if (ds->models[i]->kind == kind && ds->models[i]->active)
                in->keys[in->nkeys++] = ds->models[i]->key;
        in->phase = 1;
        in->cursor = 0;
    }
    if (in->phase == 1) {
        while (in->cursor < in->nkeys) {
            ds_model_t *dm = ds_model_find(ds, in->keys[in->cursor++]);
            if (dm != NULL && dm->kind == kind && dm->active)
                ds_cmd_route(ds, dm);
            if (deadline_ns > 0 && sq_now_ns() > deadline_ns)
                return 0;
        }
        in->phase = 2;
        settle_begin(ds, kind);
        if (deadline_ns > 0 && sq_now_ns() > deadline_ns)
            return 0;
    }
    if (in->phase == 2) {
        if (!settle_step(ds, kind, deadline_ns))
            return 0;
        in->phase = 3;
        if (deadline_ns > 0 && sq_now_ns() > deadline_ns)
            return 0; /* the report in a slice of its own */
    }
    int n = 0;
    pl_loop_planned_sessions(p->loop, kind, &n);
    SQ_INFO("epoch=%lld kind=%s reason=\"%s\" sessions=%d devices=%d of=%d lower_bound=%.2f "
            "moved=%d unplaced=%d plan_ms=%.3f",
            p->epoch, sq_dev_kind_name((sq_dev_kind_t)kind), in->reason, n, plan->ndevices,
            in->nworkers, plan->lower_bound_devices, plan->moved, plan->nunplaced, in->plan_ms);
    ds_plan_publish(ds, in->reason, plan->moved);
    /* The advice window starts again. */
    p->ok = p->bad = p->busy_us = 0;
    p->window_start_us = sq_now_us();
    apply_free(in);
    ds_cmd_pump(ds);
    return 1;
}

static void apply_more(sq_loop_t *loop, uint64_t timer_id, void *arg);

/* Applies what is adopted for another slice (DS_APPLY_SLICE_US), and
 * comes back after the loop's other events while some is left. */
static void apply_slices(gw_dispatch_t *ds)
{
    ds_plan_state_t *p = ds->place.plan;
    int64_t deadline = sq_now_ns() + (int64_t)DS_APPLY_SLICE_US * 1000;
    int more = 0;
    for (int k = 0; k < SQ_DEV_KIND_COUNT; k++) {
        if (p->inflight[k].applying) {
            more |= !apply_step(ds, k, &p->inflight[k], deadline);
        } else {
            /* Loads finished since the last settle: one more, in slices. */
            if (p->kinds[k].settle_due && !p->kinds[k].settle.active) {
                p->kinds[k].settle_due = 0;
                settle_begin(ds, k);
            }
            if (p->kinds[k].settle.active)
                more |= !settle_step(ds, k, deadline);
        }
    }
    if (more && p->apply_timer == 0 && ds->loop != NULL)
        p->apply_timer = sq_loop_timer_at(ds->loop, sq_now_ns(), apply_more, ds);
}

static void apply_more(sq_loop_t *loop, uint64_t timer_id, void *arg)
{
    gw_dispatch_t *ds = arg;
    (void)loop, (void)timer_id;
    ds->place.plan->apply_timer = 0;
    apply_slices(ds);
}

void ds_plan_continue(gw_dispatch_t *ds)
{
    apply_slices(ds);
}

void ds_plan_apply_stop(gw_dispatch_t *ds)
{
    ds_plan_state_t *p = ds->place.plan;
    if (p->apply_timer != 0 && ds->loop != NULL)
        sq_loop_timer_cancel(ds->loop, p->apply_timer);
    p->apply_timer = 0;
    for (int k = 0; k < SQ_DEV_KIND_COUNT; k++) {
        if (p->inflight[k].applying)
            apply_free(&p->inflight[k]);
        settle_free(&p->kinds[k].settle);
    }
}

void ds_plan_epoch(gw_dispatch_t *ds, int kind, const char *reason, int64_t now_us)
{
    ds_plan_state_t *p = ds->place.plan;
    ds_plan_inflight_t *in = &p->inflight[kind];
    if (in->job != NULL || in->applying) {
        /* One plan of a kind at a time: this one is planned after it. */
        pl_loop_invalidate(p->loop, kind, reason);
        return;
    }
    /* The devices: up workers of this kind (one measuring a model too: it
     * measures in its gaps), each behind its measured link (pl.h:
     * Symphony's d_data); a plan without any remote worker packs as for
     * local devices. */
    int *workers = sq_xcalloc((size_t)ds->nworkers + 1, sizeof(int));
    pl_link_t *links = sq_xcalloc((size_t)ds->nworkers + 1, sizeof(*links));
    int nw = 0, remote = 0;
    double mem = 0;
    for (int i = 0; i < ds->nworkers; i++) {
        ds_worker_t *w = ds->workers[i];
        if (w == NULL || !w->up || w->kind != kind)
            continue;
        if (mem == 0 || (double)w->memory_bytes < mem)
            mem = (double)w->memory_bytes;
        if (w->addr[0] && (w->rtt_us > 0 || w->bytes_per_us > 0)) {
            links[nw] = (pl_link_t){.rtt_us = (double)w->rtt_us, .bytes_per_us = w->bytes_per_us};
            remote = 1;
        }
        workers[nw++] = i;
    }
    ds_plan_sync_models(ds);
    ds_plan_sync_pipelines(ds);
    pl_loop_devices_t devs = {.n = nw,
                              .keys = workers,
                              .memory_bytes = mem,
                              .links = remote ? links : NULL,
                              .nlinks = remote ? nw : 0};
    int64_t begin_ns = sq_now_ns();
    int rc = 0;
    pl_loop_job_t *job = pl_loop_plan_begin(p->loop, kind, &devs, now_us, &rc);
    free(links); /* the job holds copies */
    if (job == NULL) {
        /* 1: nothing to place them on; the next worker up re-plans. */
        if (rc < 0)
            SQ_WARN("planning failed kind=%s code=%s", sq_dev_kind_name((sq_dev_kind_t)kind),
                    sq_err_name(rc));
        free(workers);
        return;
    }
    *in =
        (ds_plan_inflight_t){.job = job, .workers = workers, .nworkers = nw, .begin_ns = begin_ns};
    snprintf(in->reason, sizeof(in->reason), "%s", reason);
    if (!p->threaded) {
        pl_loop_job_run(job);
        if (apply_begin(ds, kind, in) == 0)
            apply_step(ds, kind, in, 0);
        return;
    }
    pthread_mutex_lock(&p->job_lock);
    p->todo[kind] = job;
    pthread_cond_signal(&p->job_cond);
    pthread_mutex_unlock(&p->job_lock);
}

void ds_plan_collect(gw_dispatch_t *ds)
{
    ds_plan_state_t *p = ds->place.plan;
    if (!p->threaded)
        return;
    pl_loop_job_t *done[SQ_DEV_KIND_COUNT];
    pthread_mutex_lock(&p->job_lock);
    for (int k = 0; k < SQ_DEV_KIND_COUNT; k++) {
        done[k] = p->done[k];
        p->done[k] = NULL;
    }
    pthread_mutex_unlock(&p->job_lock);
    for (int k = 0; k < SQ_DEV_KIND_COUNT; k++)
        if (done[k] != NULL) {
            assert(done[k] == p->inflight[k].job);
            apply_begin(ds, k, &p->inflight[k]);
        }
    /* Applied in slices, between the loop's other events: at 10,000
     * sessions an apply is ~100 ms of loads and routes. */
    apply_slices(ds);
}

int ds_plan_pending(gw_dispatch_t *ds)
{
    int n = 0;
    for (int k = 0; k < SQ_DEV_KIND_COUNT; k++)
        n += ds->place.plan->inflight[k].job != NULL || ds->place.plan->inflight[k].applying;
    return n;
}

void ds_plan_loaded(gw_dispatch_t *ds, int kind)
{
    if (kind < 0 || kind >= SQ_DEV_KIND_COUNT || !ds->place.plan->kinds[kind].moves_pending)
        return;
    /* At the next tick, once for every load finished meanwhile: a plan of
     * 10,000 sessions finishes tens of thousands of loads. */
    ds->place.plan->kinds[kind].settle_due = 1;
}

void ds_plan_settle_due(gw_dispatch_t *ds)
{
    ds_plan_state_t *p = ds->place.plan;
    for (int k = 0; k < SQ_DEV_KIND_COUNT; k++) {
        ds_plan_kind_t *K = &p->kinds[k];
        if (!K->settle_due || p->inflight[k].applying || K->settle.active)
            continue;
        K->settle_due = 0;
        settle_begin(ds, k);
        if (!p->threaded) /* at once, as the whole apply */
            settle_step(ds, k, 0);
    }
    if (p->threaded)
        apply_slices(ds);
}
