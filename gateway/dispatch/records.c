/* The dispatch thread's records and its lowest layer: lookups of models
 * and workers, the core's handles for items, finishing items, and sending
 * frames through the workers' link. Calls nothing else of the dispatcher. */
#include "gw_dispatch_int.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

/* ---- lookups ----------------------------------------------------------- */

int ds_has_sha(const ds_worker_t *w, const char *sha)
{
    for (int i = 0; i < w->nshas; i++)
        if (strcmp(w->shas[i], sha) == 0)
            return 1;
    return 0;
}

void ds_note_sha(ds_worker_t *w, const char *sha)
{
    if (ds_has_sha(w, sha))
        return;
    w->shas = sq_xrealloc(w->shas, sizeof(*w->shas) * (size_t)(w->nshas + 1));
    snprintf(w->shas[w->nshas++], 65, "%s", sha);
}

ds_model_t *ds_model_find(gw_dispatch_t *ds, int64_t key)
{
    int i = sq_map_get(&ds->model_ix, (uint64_t)key, 0);
    return i >= 0 && i < ds->nmodels && ds->models[i]->key == key ? ds->models[i] : NULL;
}

void ds_model_append(gw_dispatch_t *ds, ds_model_t *dm)
{
    if (ds->nmodels == ds->capmodels) {
        ds->capmodels = ds->capmodels ? 2 * ds->capmodels : 16;
        ds->models = sq_xrealloc(ds->models, sizeof(*ds->models) * (size_t)ds->capmodels);
    }
    /* The first record of a key stays the one found. */
    if (ds_model_find(ds, dm->key) == NULL)
        sq_map_put(&ds->model_ix, (uint64_t)dm->key, 0, ds->nmodels);
    ds->models[ds->nmodels++] = dm;
}

void ds_models_reindex(gw_dispatch_t *ds)
{
    sq_map_clear(&ds->model_ix);
    for (int i = ds->nmodels - 1; i >= 0; i--) /* the first of a key last: it stays */
        sq_map_put(&ds->model_ix, (uint64_t)ds->models[i]->key, 0, i);
}

/* The device kind that serves m: one with a worker up, cuda first; else
 * one whose worker is being restarted (its requests wait for it). */
int ds_kind_of_model(const gw_dispatch_t *ds, const gw_model_t *m)
{
    return gw_fleet_serving_kind(&ds->pub.fleet, m);
}

void ds_sched_fleet(gw_sched_t *s, gw_fleet_t *out)
{
    gw_dispatch_t *ds = (gw_dispatch_t *)s;
    pthread_mutex_lock(&ds->pub.ready_lock);
    *out = ds->pub.fleet;
    pthread_mutex_unlock(&ds->pub.ready_lock);
}

int ds_sched_serving_kind(gw_sched_t *s, const gw_model_t *m)
{
    gw_fleet_t f;
    ds_sched_fleet(s, &f);
    return gw_fleet_serving_kind(&f, m);
}

ds_model_t *ds_model_get(gw_dispatch_t *ds, gw_model_t *m)
{
    ds_model_t *dm = ds_model_find(ds, m->key);
    if (dm != NULL)
        return dm;
    dm = sq_xcalloc(1, sizeof(*dm));
    dm->key = m->key;
    gw_model_ref(m);
    dm->m = m;
    dm->kind = -1;
    dm->profile_worker = -1;
    ds_model_append(ds, dm);
    return dm;
}

/* ---- handles: the core's names for items -------------------------------- */

uint64_t ds_handle_new(gw_dispatch_t *ds, gw_item_t *it)
{
    uint32_t i;
    if (ds->batch.free_handle != 0) {
        i = ds->batch.free_handle - 1;
        ds->batch.free_handle = ds->batch.handles[i].next_free;
    } else {
        if (ds->batch.nhandles == ds->batch.caphandles) {
            ds->batch.caphandles = ds->batch.caphandles ? 2 * ds->batch.caphandles : 64;
            ds->batch.handles = sq_xrealloc(ds->batch.handles, sizeof(*ds->batch.handles) *
                                                                   (size_t)ds->batch.caphandles);
        }
        i = ds->batch.nhandles++;
        ds->batch.handles[i] = (ds_handle_t){.gen = 1};
    }
    ds->batch.handles[i].item = it;
    ds->batch.handles[i].next_free = 0;
    it->held.core_id = (uint64_t)ds->batch.handles[i].gen << 32 | i;
    return it->held.core_id;
}

/* The item the core's id names, or NULL when it was answered since. */
gw_item_t *ds_handle_get(const gw_dispatch_t *ds, uint64_t id)
{
    uint32_t i = (uint32_t)id, gen = (uint32_t)(id >> 32);
    if (i >= ds->batch.nhandles || ds->batch.handles[i].gen != gen)
        return NULL;
    return ds->batch.handles[i].item;
}

void ds_handle_release(gw_dispatch_t *ds, gw_item_t *it)
{
    if (it->held.core_id == 0)
        return;
    uint32_t i = (uint32_t)it->held.core_id;
    assert(i < ds->batch.nhandles && ds->batch.handles[i].item == it);
    ds->batch.handles[i].item = NULL;
    ds->batch.handles[i].gen = ds->batch.handles[i].gen + 1 ? ds->batch.handles[i].gen + 1 : 1;
    ds->batch.handles[i].next_free = ds->batch.free_handle;
    ds->batch.free_handle = i + 1;
    it->held.core_id = 0;
}

/* ---- finishing items --------------------------------------------------- */

void ds_release_input(gw_dispatch_t *ds, gw_item_t *it)
{
    if (it->input.in_off >= 0) {
        sq_shm_release(ds->arena, it->input.in_off);
        it->input.in_off = -1;
    }
}

/* Answers it: the one place, with on_batch_done's success path, where an
 * item leaves the dispatcher. */
void ds_fail_item(gw_dispatch_t *ds, gw_item_t *it, int rc, const char *detail)
{
    ds_handle_release(ds, it);
    ds_release_input(ds, it);
    it->times.done_us = sq_now_us();
    it->owner.finish(it, rc, detail);
}

/* ---- the link to the workers --------------------------------------------- */

int ds_link_send(gw_dispatch_t *ds, int worker, uint16_t type, uint64_t id, const void *payload,
                 uint32_t len, const gw_region_t *regions, int nregions)
{
    gw_transport_t *t = *ds->transport;
    return t != NULL ? t->send(t, worker, type, id, payload, len, regions, nregions) : SQ_NO_WORKER;
}

int ds_link_send_ref(gw_dispatch_t *ds, int worker, uint16_t type, uint64_t id, sq_bytes_t *bytes,
                     size_t off, uint32_t len)
{
    gw_transport_t *t = *ds->transport;
    return t != NULL ? t->send_ref(t, worker, type, id, bytes, off, len) : SQ_NO_WORKER;
}

int ds_fe_send(gw_dispatch_t *ds, int fe, uint16_t type, uint64_t id, const void *payload,
               uint32_t len)
{
    gw_transport_t *t = *ds->transport;
    if (t == NULL || t->send_fe == NULL || ds_frontend_at(ds, fe) == NULL)
        return SQ_NO_WORKER;
    int rc = t->send_fe(t, fe, type, id, payload, len);
    if (rc == 0)
        atomic_fetch_add(&ds->fe.fe_bytes_out, (uint64_t)len + SQ_IPC_HEADER_SIZE);
    return rc;
}

int ds_loaded_anywhere(gw_dispatch_t *ds, ds_model_t *dm, int *loading)
{
    int loaded = 0;
    *loading = 0;
    for (int i = 0; i < ds->nworkers; i++) {
        ds_worker_t *w = ds->workers[i];
        ds_load_t *l = w && w->up ? ds_load_find(w, dm->key, 0) : NULL;
        if (l == NULL)
            continue;
        loaded += l->state == LOAD_DONE;
        *loading += l->state == LOAD_WAIT_BYTES || l->state == LOAD_SENT;
    }
    return loaded;
}

/* ---- measuring progress (gw_dispatch_profile_progress) ------------------- */

static gw_profile_progress_t *progress_find(gw_dispatch_t *ds, int64_t key)
{
    for (int i = 0; i < ds->place.nprogress; i++)
        if (ds->place.progress[i].key == key)
            return &ds->place.progress[i];
    return NULL;
}

/* dm's measuring on worker w: started (done 0), moved on, or ended
 * (w NULL). */
void ds_progress_set(gw_dispatch_t *ds, const ds_model_t *dm, const ds_worker_t *w, int done,
                     int total)
{
    pthread_mutex_lock(&ds->pub.ready_lock);
    gw_profile_progress_t *p = progress_find(ds, dm->key);
    int64_t now = sq_now_us();
    if (w == NULL) {
        if (p != NULL)
            *p = ds->place.progress[--ds->place.nprogress];
    } else {
        if (p == NULL) {
            if (ds->place.nprogress == ds->place.capprogress) {
                ds->place.capprogress = ds->place.capprogress ? 2 * ds->place.capprogress : 4;
                ds->place.progress =
                    sq_xrealloc(ds->place.progress,
                                sizeof(*ds->place.progress) * (size_t)ds->place.capprogress);
            }
            p = &ds->place.progress[ds->place.nprogress++];
            *p = (gw_profile_progress_t){
                .key = dm->key, .started_us = now, .run_spent_us = -1, .run_left_us = -1};
        }
        if (strcmp(p->device, w->device) != 0) {
            snprintf(p->device, sizeof(p->device), "%s", w->device);
            p->started_us = now; /* on another worker: from the start */
            p->run_spent_us = p->run_left_us = -1;
        }
        p->done = done;
        p->total = total;
        p->updated_us = now;
    }
    pthread_mutex_unlock(&ds->pub.ready_lock);
}

void ds_progress_times(gw_dispatch_t *ds, const ds_model_t *dm, double spent_us, double left_us)
{
    pthread_mutex_lock(&ds->pub.ready_lock);
    gw_profile_progress_t *p = progress_find(ds, dm->key);
    if (p != NULL) {
        p->run_spent_us = spent_us;
        p->run_left_us = left_us;
    }
    pthread_mutex_unlock(&ds->pub.ready_lock);
}

int gw_dispatch_profile_progress(gw_dispatch_t *ds, int64_t key, gw_profile_progress_t *out)
{
    if (ds == NULL)
        return 0;
    pthread_mutex_lock(&ds->pub.ready_lock);
    gw_profile_progress_t *p = progress_find(ds, key);
    if (p != NULL)
        *out = *p;
    pthread_mutex_unlock(&ds->pub.ready_lock);
    return p != NULL;
}

int ds_fail_out_of_service(gw_dispatch_t *ds, gw_item_t *it, int removed)
{
    gw_model_t *cur = gw_registry_get(ds->registry, it->ask.model->key);
    int gone = cur == NULL, unloaded = !gone && strcmp(cur->status, "unloaded") == 0;
    gw_model_unref(cur);
    if (gone)
        ds_fail_item(ds, it, SQ_MODEL_NOT_FOUND, "the model was deleted");
    else if (unloaded)
        ds_fail_item(ds, it, SQ_MODEL_UNLOADED, "the model was unloaded");
    else if (removed)
        ds_fail_item(ds, it, SQ_NOT_READY, "the model is being loaded again; retry shortly");
    return gone || unloaded || removed;
}

/* ---- commands: what placement asks of the batcher ----------------------- */

static ds_cmd_t *cmd_push(gw_dispatch_t *ds, int kind)
{
    if (ds->ncmds == ds->capcmds) {
        ds->capcmds = ds->capcmds ? 2 * ds->capcmds : 16;
        ds->cmds = sq_xrealloc(ds->cmds, sizeof(*ds->cmds) * (size_t)ds->capcmds);
    }
    ds_cmd_t *c = &ds->cmds[ds->ncmds++];
    *c = (ds_cmd_t){.kind = kind};
    /* Drained at the end of the event that emitted it, or (an event of
     * placement's own: a file fetched, a slice of a plan) on the loop's
     * next turn. */
    if (!ds->drain_posted && ds->drain != NULL) {
        ds->drain_posted = 1;
        sq_loop_post(ds->loop, ds->drain, ds);
    }
    return c;
}

void ds_cmd_route(gw_dispatch_t *ds, ds_model_t *dm)
{
    dm->routes_stale = 1;
    cmd_push(ds, DS_CMD_ROUTE)->dm = dm;
}

void ds_cmd_flush_pending(gw_dispatch_t *ds, ds_model_t *dm)
{
    cmd_push(ds, DS_CMD_FLUSH_PENDING)->dm = dm;
}

void ds_cmd_fail_pending(gw_dispatch_t *ds, ds_model_t *dm, int rc, const char *why)
{
    ds_cmd_t *c = cmd_push(ds, DS_CMD_FAIL_PENDING);
    c->dm = dm;
    c->rc = rc;
    snprintf(c->why, sizeof(c->why), "%s", why);
}

void ds_cmd_resubmit(gw_dispatch_t *ds, gw_item_t *it)
{
    cmd_push(ds, DS_CMD_RESUBMIT)->item = it;
}

void ds_cmd_pump(gw_dispatch_t *ds)
{
    ds->pump_due = 1;
    if (!ds->drain_posted && ds->drain != NULL) {
        ds->drain_posted = 1;
        sq_loop_post(ds->loop, ds->drain, ds);
    }
}

/* ---- frontends' items ------------------------------------------------------ */

/* The link to x in its index's chain, or NULL. */
ds_fe_item_t **ds_fe_chain_link(ds_frontend_t *f, uint64_t slot, const ds_fe_item_t *x)
{
    uint32_t idx = (uint32_t)slot;
    if (idx >= f->capitems)
        return NULL;
    for (ds_fe_item_t **pp = &f->items[idx]; *pp != NULL; pp = &(*pp)->next_in_slot)
        if (x != NULL ? *pp == x : (*pp)->item.input.fe_slot == slot)
            return pp;
    return NULL;
}

/* Its answer here: nothing to send for a success (the frontend has the
 * outputs from the worker), nor for an item the frontend withdrew. */
void ds_fe_finish(gw_item_t *it, int rc, const char *detail)
{
    ds_fe_item_t *x = (ds_fe_item_t *)it;
    gw_dispatch_t *ds = x->ds;
    int fe = (int)it->input.src - 1;
    ds_frontend_t *f = ds_frontend_at(ds, fe);
    if (f != NULL) {
        ds_fe_item_t **pp = ds_fe_chain_link(f, it->input.fe_slot, x);
        if (pp != NULL)
            *pp = x->next_in_slot;
        if (rc != 0 && atomic_load(&x->abandoned) == 0) {
            sq_fe_fail_t fail = {.code = rc};
            snprintf(fail.detail, sizeof(fail.detail), "%s", detail != NULL ? detail : "");
            sq_buf_t b;
            sq_buf_init(&b);
            sq_fe_fail_encode(&b, &fail);
            ds_fe_send(ds, fe, SQ_MSG_FE_FAIL, it->input.fe_slot, b.data, (uint32_t)b.len);
            sq_buf_dispose(&b);
        }
    }
    gw_model_unref(it->ask.model);
    gw_pipeline_unref(it->pipe.pipeline);
    free(x);
}
