/* The dispatch thread's data plane, its entry points: from other threads
 * (submit, model changes, warm, resume profiling), the tick, and start,
 * stop and abort; freeing what a delete left. Below it: readiness.c
 * publishes what gw_dispatch_ready answers, planning.c places models,
 * batches.c drives the pure dispatcher core with real time, model_loads.c
 * gets models onto workers, profiling.c measures them, prefix_groups.c
 * forms prefix groups and twins, records.c holds lookups and finishes items
 * (gw_dispatch_int.h lists them). Above it, worker_events.c answers the
 * workers' link.
 *
 * Routing, until the planner places models: a model is served by every
 * worker of its serving kind, loaded there on its first request; requests
 * that arrive before any worker holds it wait (bounded by their deadline).
 * Sessions are (model, SLO bucket, input kind): one dispatcher queue each.
 * Runs on the workers' loop thread; other threads reach it with
 * sq_loop_post (gw_sched_submit and friends). */
#include "batcher_int.h"

#include <pl_loop.h>

#include <stdlib.h>
#include <string.h>

#define TICK_MS 50
/* Ready models nothing holds are warmed every this many ticks (250 ms). */
#define WARM_EVERY_TICKS 5

static void post_model_msg(gw_dispatch_t *ds, int64_t key, int profile);

void ds_registry_refresh(mdb_t *db, gw_dispatch_t *ds, int64_t key)
{
    json_t *recs;
    if (mdb_model_records(db, key, &recs) == 0 && json_array_size(recs) == 1)
        gw_registry_put(ds->registry, gw_model_from_record(json_array_get(recs, 0)));
    json_decref(recs);
    gw_dispatch_model_changed(ds, key);
}

typedef struct {
    gw_dispatch_t *ds;
    int64_t from, to;
} profile_copy_job_t;

/* What a model message asks for: nothing but a refresh, a profile (taken
 * from an identical model when there is one), or a measurement. */
enum { PROFILE_NONE, PROFILE_WANTED, PROFILE_MEASURE };

/* DB thread: an identical model's profile becomes this one's; if that fails
 * (the older copy deleted meanwhile), it is measured after all. */
static void profile_copy_job(mdb_t *db, void *arg)
{
    profile_copy_job_t *j = arg;
    int rc = mdb_profile_copy(db, j->from, j->to);
    if (rc == 0) {
        ds_registry_refresh(db, j->ds, j->to);
    } else {
        SQ_INFO("profile not copied, measuring key=%lld reason=\"%s\"", (long long)j->to,
                mdb_errmsg(db));
        post_model_msg(j->ds, j->to, PROFILE_MEASURE);
    }
    free(j);
}

/* The profile of twin (an older ready model with dm's very file) becomes
 * dm's: nothing to measure. */
static void copy_twin_profile(gw_dispatch_t *ds, ds_model_t *dm, gw_model_t *twin)
{
    profile_copy_job_t *j = sq_xcalloc(1, sizeof(*j));
    j->ds = ds;
    j->from = twin->key;
    j->to = dm->key;
    SQ_INFO("profile taken from an identical model model=%s version=%d from=%s:%d", dm->m->name,
            dm->m->version, twin->name, twin->version);
    gw_model_unref(twin);
    gw_db_job(ds->db, profile_copy_job, j);
}

/* Models waiting for a twin's measurement: the profile once it is stored;
 * measured after all when no twin is being measured any more (it failed
 * or was deleted). */
static void twins_waiting(gw_dispatch_t *ds)
{
    for (int i = 0; i < ds->nmodels; i++) {
        ds_model_t *dm = ds->models[i];
        if (!dm->twin_wait || dm->removed)
            continue;
        gw_model_t *twin = ds_twin_find(ds, dm->m);
        if (twin != NULL) {
            dm->twin_wait = 0;
            copy_twin_profile(ds, dm, twin);
        } else if (ds_twin_measuring(ds, dm->m) == 0) {
            dm->twin_wait = 0;
            dm->profile_pending = 1;
            ds_start_profile(ds, dm);
        }
    }
}

/* ---- entry points from other threads --------------------------------------- */

/* gw_sched_ops_t.submit: to the dispatch thread. */
static void sched_submit(gw_sched_t *s, gw_item_t *first)
{
    gw_dispatch_t *ds = (gw_dispatch_t *)s;
    first->held.holder = ds;
    ds_submit_post(ds, first);
}

static void on_withdraw(sq_loop_t *loop, void *arg)
{
    gw_dispatch_t *ds = arg;
    (void)loop;
    atomic_store(&ds->withdraw_posted, 0);
    if (!ds->aborted)
        ds_withdraw_abandoned(ds);
}

/* gw_sched_ops_t.withdraw: one look on the dispatch thread. */
static void sched_withdraw(gw_sched_t *s)
{
    gw_dispatch_t *ds = (gw_dispatch_t *)s;
    if (atomic_exchange(&ds->withdraw_posted, 1) == 0)
        sq_loop_post(ds->loop, on_withdraw, ds);
}

static const gw_sched_ops_t ds_sched_ops = {
    .submit = sched_submit,
    .withdraw = sched_withdraw,
    .ready = ds_sched_ready,
    .held = ds_sched_held,
    .unloading = ds_sched_unloading,
    .serving_kind = ds_sched_serving_kind,
    .least = gw_dispatch_least,
    .fleet = ds_sched_fleet,
};

gw_sched_t *gw_dispatch_sched(gw_dispatch_t *ds)
{
    return &ds->sched;
}

typedef struct {
    gw_dispatch_t *ds;
    int64_t key;
    int profile;
} model_msg_t;

static void on_model_changed(sq_loop_t *loop, void *arg)
{
    model_msg_t *msg = arg;
    gw_dispatch_t *ds = msg->ds;
    (void)loop;
    if (ds->aborted) {
        free(msg);
        return;
    }
    gw_model_t *m = gw_registry_get(ds->registry, msg->key);
    ds_model_t *dm = ds_model_find(ds, msg->key);
    /* Unloaded (model control): out of service as if deleted; its record
     * stays in the registry, and a load brings it back. */
    int unloaded = m != NULL && strcmp(m->status, "unloaded") == 0;
    /* Groups: a member gone, or a new model ready to join, makes the next
     * request form the group anew. */
    ds->place.group_epoch++;
    for (int i = 0; i < ds->nmodels; i++) {
        ds_model_t *g = ds->models[i];
        if (!g->is_group || g->removed)
            continue;
        int member = 0;
        for (int k = 0; k < g->nmembers; k++)
            member |= g->members[k]->key == msg->key;
        if (member && (m == NULL || unloaded))
            ds_group_retire(
                ds, g, unloaded ? "a member model was unloaded" : "a member model was deleted");
        else if (!member && m != NULL && m->group_id == g->group_id &&
                 strcmp(m->status, "ready") == 0)
            ds_group_retire(ds, g, "a new model joins the group");
    }
    if (m == NULL || unloaded) {
        if (dm != NULL)
            dm->revive = 0;
        if (dm != NULL && !dm->removed) {
            dm->removed = 1;
            ds->reclaim_due = 1;
            if (unloaded)
                ds_fail_pending(ds, dm, SQ_MODEL_UNLOADED, "the model was unloaded");
            else
                ds_fail_pending(ds, dm, SQ_MODEL_NOT_FOUND, "the model was deleted");
            ds_withdraw(ds, dm);
            sq_bytes_unref(dm->blob);
            dm->blob = NULL;
            dm->blob_state = 0;
            if (dm->kind >= 0)
                ds_plan_invalidate(ds, dm->kind, "model removed");
        }
    } else if (dm != NULL && dm->removed) {
        /* Loaded again while its unload's record waits to be freed. */
        dm->revive = 1 + msg->profile;
        ds->reclaim_due = 1;
    } else {
        if (dm == NULL)
            dm = ds_model_get(ds, m);
        gw_model_unref(dm->m);
        dm->m = m; /* the new entry (profile, status) */
        ds_live_reset(ds, dm);
        m = NULL;
        if (msg->profile != PROFILE_NONE) {
            gw_model_t *twin = msg->profile == PROFILE_WANTED ? ds_twin_find(ds, dm->m) : NULL;
            int64_t measuring =
                msg->profile == PROFILE_WANTED && twin == NULL ? ds_twin_measuring(ds, dm->m) : 0;
            if (twin != NULL) {
                copy_twin_profile(ds, dm, twin);
            } else if (measuring != 0) {
                /* Being measured as an older upload: its profile is this
                 * one's once stored (twins_waiting), not a second run. */
                dm->twin_wait = 1;
                SQ_INFO("profile awaited from an identical model being measured model=%s "
                        "version=%d from_key=%lld",
                        dm->m->name, dm->m->version, (long long)measuring);
            } else {
                dm->profile_pending = 1;
                ds_start_profile(ds, dm);
            }
        }
        /* A model that became ready may complete a group: measure it now,
         * before its traffic comes. */
        ds_group_of(ds, dm);
    }
    gw_model_unref(m);
    twins_waiting(ds);
    ds_pump(ds);
    free(msg);
}

static void post_model_msg(gw_dispatch_t *ds, int64_t key, int profile)
{
    model_msg_t *msg = sq_xcalloc(1, sizeof(*msg));
    msg->ds = ds;
    msg->key = key;
    msg->profile = profile;
    sq_loop_post(ds->loop, on_model_changed, msg);
}

void gw_dispatch_model_changed(gw_dispatch_t *ds, int64_t key)
{
    post_model_msg(ds, key, PROFILE_NONE);
}

void gw_dispatch_profile(gw_dispatch_t *ds, int64_t key)
{
    post_model_msg(ds, key, PROFILE_WANTED);
}

static void resume_one(gw_model_t *m, void *arg)
{
    if (strcmp(m->status, "profiling") == 0)
        gw_dispatch_profile(arg, m->key);
}

void gw_dispatch_resume_profiling(gw_dispatch_t *ds)
{
    gw_registry_foreach(ds->registry, resume_one, ds);
}

static void model_free(gw_dispatch_t *ds, ds_model_t *dm)
{
    ds_live_reset(ds, dm);
    gw_model_unref(dm->m);
    for (int k = 0; k < dm->nmembers; k++)
        gw_model_unref(dm->members[k]);
    free(dm->members);
    ds_group_free_blobs(dm);
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
            if (l->state != LOAD_NONE || l->stale > 0 || ds_model_find(ds, l->key) != NULL)
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
        for (int s = 0; s < ds->batch.nsessions; s++)
            if (ds->batch.sessions[s].model == dm)
                ds->batch.sessions[s].model = NULL; /* its core session was removed */
        ds_plan_forget(ds, dm);
        int64_t key = dm->key;
        int revive = dm->revive;
        model_free(ds, dm);
        ds->models[i--] = ds->models[--ds->nmodels];
        ds_models_reindex(ds);
        if (revive > 0)
            post_model_msg(ds, key, revive - 1);
    }
}

typedef struct {
    gw_dispatch_t *ds;
    int64_t key;
} warm_t;

/* Makes model key servable: placed at its default SLO and loaded where
 * nothing holds or loads it yet. */
static void warm_key(gw_dispatch_t *ds, int64_t key)
{
    gw_model_t *m = gw_registry_get(ds->registry, key);
    if (m == NULL)
        return;
    ds_model_t *dm = strcmp(m->status, "ready") == 0 ? ds_model_get(ds, m) : NULL;
    double slo = m->default_slo_ms > 0 ? m->default_slo_ms : ds->cfg.default_slo_ms;
    if (!(slo > 0))
        slo = PL_LOOP_BEST_EFFORT_MS; /* what its best-effort requests are planned at */
    gw_model_unref(m);
    if (dm == NULL || dm->removed || dm->poisoned || ds->aborted)
        return;
    int member;
    if ((dm = ds_serving_record(ds, dm, gw_slo_bucket_ms(slo), NULL, &member)) == NULL)
        return;
    int loading;
    if (ds_loaded_anywhere(ds, dm, &loading) == 0 && loading == 0)
        ds_spread_loads(ds, dm);
}

static void on_warm(sq_loop_t *loop, void *arg)
{
    warm_t *w = arg;
    gw_dispatch_t *ds = w->ds;
    (void)loop;
    int64_t key = w->key;
    free(w);
    if (ds != NULL)
        warm_key(ds, key);
}

typedef struct {
    int64_t *keys;
    int n, cap;
} key_list_t;

static void collect_ready(gw_model_t *m, void *arg)
{
    key_list_t *k = arg;
    if (strcmp(m->status, "ready") != 0)
        return;
    if (k->n == k->cap) {
        k->cap = k->cap ? 2 * k->cap : 16;
        k->keys = sq_xrealloc(k->keys, sizeof(*k->keys) * (size_t)k->cap);
    }
    k->keys[k->n++] = m->key;
}

/* Ready means ready (issue 23): every ready model that a worker up could
 * serve is loaded on one (the least loaded of its kind), whether a request
 * came for it or not, so that /v2/health/ready says 200 only once each
 * answers now. It is not placed: the plan takes it up with its first
 * request (served meanwhile by the worker that holds it). A copy of a
 * file is held through its twin. A restart's stored plan places and loads
 * its own first (ds_plan_restoring). */
static void warm_all(gw_dispatch_t *ds)
{
    if (ds->aborted || ds_plan_restoring(ds))
        return;
    key_list_t k = {0};
    gw_registry_foreach(ds->registry, collect_ready, &k);
    for (int i = 0; i < k.n; i++) {
        gw_model_t *m = gw_registry_get(ds->registry, k.keys[i]);
        int kind = m != NULL ? ds_kind_of_model(ds, m) : -1;
        if (kind < 0 || ds->pub.fleet.up[kind] == 0) {
            gw_model_unref(m);
            continue;
        }
        ds_model_t *dm = ds_model_get(ds, m);
        gw_model_unref(m);
        if (dm->removed || dm->poisoned)
            continue;
        ds_model_t *t = ds_twin_of(ds, dm);
        if (t != NULL)
            dm = t;
        int loading = 0;
        if (ds_loaded_anywhere(ds, dm, &loading) > 0 || loading > 0)
            continue;
        if (dm->kind < 0)
            dm->kind = kind;
        ds_worker_t *best = NULL;
        int best_n = 0;
        for (int w = 0; w < ds->nworkers; w++) {
            ds_worker_t *wk = ds->workers[w];
            if (wk == NULL || !wk->up || wk->kind != dm->kind)
                continue;
            int n = 0;
            for (int l = 0; l < wk->nloads; l++)
                n += wk->loads[l].state == LOAD_DONE || wk->loads[l].state == LOAD_SENT;
            if (best == NULL || n < best_n) {
                best = wk;
                best_n = n;
            }
        }
        if (best != NULL)
            ds_send_load(ds, dm, best);
    }
    free(k.keys);
}

void gw_dispatch_warm(gw_dispatch_t *ds, int64_t key)
{
    if (ds == NULL)
        return; /* a frontend: its dispatcher warms what its clients ask for */
    warm_t *w = sq_xmalloc(sizeof(*w));
    *w = (warm_t){.ds = ds, .key = key};
    sq_loop_post(ds->loop, on_warm, w);
}

/* Items waiting for a first load are bounded by their deadlines. */
static void on_tick(sq_loop_t *loop, uint64_t id, void *data)
{
    gw_dispatch_t *ds = data;
    (void)id;
    int64_t t = sq_now_us();
    for (int i = 0; i < ds->nmodels; i++) {
        ds_model_t *dm = ds->models[i];
        int k = 0;
        for (int j = 0; j < dm->npending; j++) {
            gw_item_t *it = dm->pending[j];
            if (it->ask.deadline_us <= t)
                ds_fail_item(ds, it, SQ_DEADLINE, "the model was still loading at the deadline");
            else
                dm->pending[k++] = it;
        }
        dm->npending = k;
    }
    ds_plan_tick(ds, t);
    if (++ds->warm_ticks % WARM_EVERY_TICKS == 0)
        warm_all(ds);
    /* Measurements waiting for a gap (or starved long enough). */
    for (int i = 0; i < ds->nworkers; i++)
        ds_profile_step(ds, ds->workers[i]);
    ds_pump(ds);
    /* Commands name model records: drained before any is freed. */
    ds_commands_drain(ds);
    reclaim(ds);
    ds_publish_ready(ds);
    ds_await_tick(ds);
    ds->tick = sq_loop_timer_at(loop, sq_now_ns() + (int64_t)TICK_MS * 1000000, on_tick, ds);
}

gw_dispatch_t *gw_dispatch_new(const gw_dispatch_deps_t *deps)
{
    gw_dispatch_t *ds = sq_xcalloc(1, sizeof(*ds));
    ds->sched.ops = &ds_sched_ops;
    ds->cfg = deps->cfg;
    ds->registry = deps->registry;
    ds->pipelines = deps->pipelines;
    ds->arena = deps->arena;
    ds->metrics = deps->metrics;
    ds->db = deps->db;
    ds->prep = deps->prep;
    ds->transport = deps->transport;
    ds->db_ready = deps->db_ready;
    for (int k = 0; k < SQ_DEV_KIND_COUNT; k++)
        ds->pub.fleet.back_at_us[k] = INT64_MAX;
    ds->drain = ds_commands_on_post;
    sq_loop_t *loop = ds->loop = deps->loop;
    ds->batch.core = pl_dispatch_new(&ds->cfg.core);
    ds->place.plan = ds_plan_new(ds);
    ds->place.group_epoch = 1;
    pthread_mutex_init(&ds->pub.ready_lock, NULL);
    pthread_mutex_init(&ds->fe.fe_lock, NULL);
    pthread_mutex_init(&ds->batch.live_lock, NULL);
    snprintf(ds->pub.ready_why, sizeof(ds->pub.ready_why), "the dispatcher is starting");
    ds->tick = sq_loop_timer_at(loop, sq_now_ns() + (int64_t)TICK_MS * 1000000, on_tick, ds);
    return ds;
}

/* Answers everything the dispatcher holds 503 shutting_down: requests
 * waiting for a load, queued in the core, and in batches still running
 * (whose late BATCH_DONE then finds nothing, and whose worker's loss later
 * hands the core's ids back as stale handles). Idempotent. */
void ds_abort_all(gw_dispatch_t *ds)
{
    static const char why[] = "squishd is shutting down";
    ds->aborted = 1;
    for (int i = 0; i < ds->nmodels; i++)
        ds_fail_pending(ds, ds->models[i], SQ_SHUTTING_DOWN, why);
    for (int i = 0; i < ds->nworkers; i++) {
        ds_worker_t *w = ds->workers[i];
        if (w == NULL || w->inflight == NULL)
            continue;
        ds_batch_t *b = w->inflight;
        w->inflight = NULL;
        for (int k = 0; k < b->count; k++)
            ds_fail_item(ds, b->items[k], SQ_SHUTTING_DOWN, why);
        /* The worker may still write into the outputs: the region stays
         * allocated until the arena goes (squishd is exiting). The core
         * forgets the batch. */
        pl_dispatch_batch_done(ds->batch.core, sq_now_us(), w->id, b->id);
        free(b->items);
        free(b);
    }
    for (int s = 0; s < ds->batch.nsessions; s++)
        pl_dispatch_session_remove(ds->batch.core, sq_now_us(), s);
    /* Queued requests come back as drops: pump answers them (aborted). */
    ds_pump(ds);
    /* Whatever still has a handle (none should) is answered too. */
    for (uint32_t i = 0; i < ds->batch.nhandles; i++)
        if (ds->batch.handles[i].item != NULL)
            ds_fail_item(ds, ds->batch.handles[i].item, SQ_SHUTTING_DOWN, why);
    if (ds->batch.timer)
        sq_loop_timer_cancel(ds->loop, ds->batch.timer);
    ds->batch.timer = 0;
    ds_await_tick(ds); /* loads waiting: answered, shutting down */
}

void gw_dispatch_free(gw_dispatch_t *ds)
{
    if (ds == NULL)
        return;
    ds_frontends_free(ds);
    free(ds->cmds); /* not drained: the loop is not run again */
    for (int i = 0; i < ds->nworkers; i++) {
        ds_worker_t *w = ds->workers[i];
        if (w == NULL)
            continue;
        free(w->loads);
        free(w->shas);
        free(w);
    }
    for (int i = 0; i < ds->nmodels; i++)
        model_free(ds, ds->models[i]);
    free(ds->workers);
    free(ds->models);
    sq_map_dispose(&ds->model_ix);
    free(ds->batch.sessions);
    free(ds->batch.handles);
    ds_plan_apply_stop(ds);
    ds_plan_free(ds->place.plan);
    pl_dispatch_free(ds->batch.core);
    pthread_mutex_destroy(&ds->pub.ready_lock);
    pthread_mutex_destroy(&ds->fe.fe_lock);
    pthread_mutex_destroy(&ds->batch.live_lock);
    for (int i = 0; i < ds->batch.nlive_pub; i++)
        pl_profile_dispose(&ds->batch.live_pub[i].profile);
    free(ds->batch.live_pub);
    ds_await_free(ds);
    free(ds->pub.held_keys);
    free(ds->pub.gone_keys);
    free(ds->place.progress);
    free(ds);
}
