/* Readiness, as the dispatch thread sees it every tick and other threads
 * ask (gw_dispatch_ready, gw_dispatch_model_held): why squishd cannot serve
 * every ready model now (--strict-readiness 1; with 0 the models do not
 * count), and the models a worker up holds, published under ready_lock. */
#include "batcher_int.h"

#include <string.h>

typedef struct {
    gw_dispatch_t *ds;
    char why[256];
} ready_scan_t;

static int held_has(const gw_dispatch_t *ds, int64_t key)
{
    for (int i = 0; i < ds->pub.nheld; i++)
        if (ds->pub.held_keys[i] == key)
            return 1;
    return 0;
}

/* Every ready model must answer now (issue 23: ready was said while models
 * loaded): a worker that can serve it is up, and one holds it loaded (or
 * its twin, or its prefix group); one that is not is being loaded (the
 * dispatch thread warms it every tick: gw_dispatch.c's warm_all). */
static void scan_servable(gw_model_t *m, void *arg)
{
    ready_scan_t *x = arg;
    if (x->why[0] || strcmp(m->status, "ready") != 0)
        return;
    int kind = ds_kind_of_model(x->ds, m);
    if (kind < 0 || x->ds->pub.fleet.up[kind] == 0) {
        snprintf(x->why, sizeof(x->why), "no worker that can serve model %s version %d is up%s",
                 m->name, m->version,
                 m->emulated ? " (an emulated model needs an emu worker)"
                 : kind >= 0 ? " (one is being restarted)"
                             : "");
        return;
    }
    if (held_has(x->ds, m->key))
        return;
    ds_model_t *dm = ds_model_find(x->ds, m->key);
    if (dm != NULL && dm->poisoned)
        return; /* failed: not a ready model any more */
    int loading = 0;
    if (dm != NULL)
        ds_loaded_anywhere(x->ds, dm, &loading);
    snprintf(x->why, sizeof(x->why), "model %s version %d is %s", m->name, m->version,
             loading > 0 ? "loading on its workers" : "not loaded on a worker yet");
}

static void held_add(gw_dispatch_t *ds, int64_t key)
{
    if (ds->pub.nheld == ds->pub.capheld) {
        ds->pub.capheld = ds->pub.capheld ? 2 * ds->pub.capheld : 16;
        ds->pub.held_keys =
            sq_xrealloc(ds->pub.held_keys, sizeof(*ds->pub.held_keys) * (size_t)ds->pub.capheld);
    }
    ds->pub.held_keys[ds->pub.nheld++] = key;
}

static void gone_add(gw_dispatch_t *ds, int64_t key)
{
    if (ds->pub.ngone == ds->pub.capgone) {
        ds->pub.capgone = ds->pub.capgone ? 2 * ds->pub.capgone : 16;
        ds->pub.gone_keys =
            sq_xrealloc(ds->pub.gone_keys, sizeof(*ds->pub.gone_keys) * (size_t)ds->pub.capgone);
    }
    ds->pub.gone_keys[ds->pub.ngone++] = key;
}

void ds_publish_ready(gw_dispatch_t *ds)
{
    ready_scan_t x = {.ds = ds};
    /* Read first: a change during the scan makes the next ask wait. */
    unsigned long gen = gw_registry_generation(ds->registry);
    if (ds_plan_restoring(ds))
        snprintf(x.why, sizeof(x.why),
                 "reapplying the plan stored before the restart: waiting for its workers");
    pthread_mutex_lock(&ds->pub.ready_lock);
    ds->pub.nheld = 0;
    ds->pub.ngone = 0;
    for (int i = 0; i < ds->nmodels; i++) {
        ds_model_t *dm = ds->models[i];
        if (dm->removed && !dm->is_group && dm->revive == 0)
            gone_add(ds, dm->key);
        if (dm->removed || dm->poisoned)
            continue;
        int loading;
        int held = ds_loaded_anywhere(ds, dm, &loading) > 0;
        /* The same file under another name or version: its twin's loads
         * serve it (the twin as last resolved, without looking again). */
        ds_model_t *twin = dm->twin;
        if (!held && twin != NULL && !twin->removed && !twin->poisoned) {
            int tl;
            held = ds_loaded_anywhere(ds, twin, &tl) > 0;
        }
        if (held) {
            held_add(ds, dm->key);
            for (int k = 0; k < dm->nmembers; k++)
                held_add(ds, dm->members[k]->key);
        }
    }
    /* --strict-readiness 0: the server's readiness is its own (as
     * Triton's without strict readiness); each model says its own on
     * /v2/models/{m}/ready, so a model no worker up can run (an emulated
     * one without an emu worker) leaves the server ready. */
    if (ds->cfg.lax_readiness)
        x.why[0] = '\0';
    else if (!x.why[0])
        gw_registry_foreach(ds->registry, scan_servable, &x);
    snprintf(ds->pub.ready_why, sizeof(ds->pub.ready_why), "%s", x.why);
    ds->pub.ready_gen = gen;
    pthread_mutex_unlock(&ds->pub.ready_lock);
}

int ds_sched_ready(gw_sched_t *s, char *why, size_t len)
{
    gw_dispatch_t *ds = (gw_dispatch_t *)s;
    pthread_mutex_lock(&ds->pub.ready_lock);
    snprintf(why, len, "%s", ds->pub.ready_why);
    /* A model added, measured or deleted since the last look: not ready
     * until the dispatch thread has looked (within a tick, 50 ms). */
    if (why[0] == '\0' && !ds->cfg.lax_readiness &&
        ds->pub.ready_gen != gw_registry_generation(ds->registry))
        snprintf(why, len, "a model changed since the last check; retry shortly");
    pthread_mutex_unlock(&ds->pub.ready_lock);
    return why[0] == '\0';
}

int ds_sched_held(gw_sched_t *s, int64_t key)
{
    gw_dispatch_t *ds = (gw_dispatch_t *)s;
    int held = 0;
    pthread_mutex_lock(&ds->pub.ready_lock);
    for (int i = 0; i < ds->pub.nheld && !held; i++)
        held = ds->pub.held_keys[i] == key;
    pthread_mutex_unlock(&ds->pub.ready_lock);
    return held;
}

int ds_sched_unloading(gw_sched_t *s, int64_t key)
{
    gw_dispatch_t *ds = (gw_dispatch_t *)s;
    int gone = 0;
    pthread_mutex_lock(&ds->pub.ready_lock);
    for (int i = 0; i < ds->pub.ngone && !gone; i++)
        gone = ds->pub.gone_keys[i] == key;
    pthread_mutex_unlock(&ds->pub.ready_lock);
    return gone;
}

/* ---- model control: loads that wait ------------------------------------ */

typedef struct ds_await {
    gw_dispatch_t *ds;
    struct gw_async *a;
    int64_t *keys;
    int n;
    int64_t deadline_us;
    void (*settle)(struct gw_async *a, const gw_await_result_t *r);
    struct ds_await *next;
} ds_await_t;

/* Where each key stands now (as of this tick's ds_publish_ready). */
static void await_look(gw_dispatch_t *ds, const ds_await_t *w, gw_await_result_t *r)
{
    char waiting_why[256] = "";
    memset(r, 0, sizeof(*r));
    for (int i = 0; i < w->n; i++) {
        gw_model_t *m = gw_registry_get(ds->registry, w->keys[i]);
        ds_model_t *dm = m != NULL ? ds_model_find(ds, m->key) : NULL;
        const char *failed = NULL;
        char buf[sizeof(m->error) + MDB_NAME_MAX + 64];
        if (m == NULL) {
            failed = "a version was deleted";
        } else if (strcmp(m->status, "failed") == 0 || (dm != NULL && dm->poisoned)) {
            snprintf(buf, sizeof(buf), "model %s version %d failed: %s", m->name, m->version,
                     dm != NULL && dm->poisoned ? dm->failed_why
                     : m->error[0]              ? m->error
                                                : "it could not be measured");
            failed = buf;
        } else if (strcmp(m->status, "unloaded") == 0) {
            snprintf(buf, sizeof(buf), "model %s was unloaded again", m->name);
            failed = buf;
        }
        if (failed != NULL) {
            if (r->failed++ == 0)
                snprintf(r->why, sizeof(r->why), "%s", failed);
        } else if (strcmp(m->status, "ready") == 0 && held_has(ds, m->key)) {
            r->ready++;
        } else {
            r->waiting++;
            if (!waiting_why[0]) {
                int kind = ds_kind_of_model(ds, m);
                snprintf(waiting_why, sizeof(waiting_why), "model %s version %d is %s", m->name,
                         m->version,
                         strcmp(m->status, "profiling") == 0 ? "still being measured"
                         : kind < 0 || ds->pub.fleet.up[kind] == 0
                             ? "waiting for a worker that can serve it"
                             : "still loading on a worker");
            }
        }
        gw_model_unref(m);
    }
    if (r->failed == 0)
        snprintf(r->why, sizeof(r->why), "%s", waiting_why);
}

void ds_await_tick(gw_dispatch_t *ds)
{
    int64_t now = sq_now_us();
    ds_await_t **pp = &ds->awaits;
    while (*pp != NULL) {
        ds_await_t *w = *pp;
        gw_await_result_t r;
        await_look(ds, w, &r);
        r.aborted = ds->aborted;
        if (r.waiting > 0 && now < w->deadline_us && !ds->aborted) {
            pp = &w->next;
            continue;
        }
        *pp = w->next;
        w->settle(w->a, &r);
        free(w->keys);
        free(w);
    }
}

void ds_await_free(gw_dispatch_t *ds)
{
    while (ds->awaits != NULL) {
        ds_await_t *w = ds->awaits;
        ds->awaits = w->next;
        free(w->keys);
        free(w);
    }
}

static void on_await(sq_loop_t *loop, void *arg)
{
    ds_await_t *w = arg;
    gw_dispatch_t *ds = w->ds;
    (void)loop;
    w->next = ds->awaits;
    ds->awaits = w;
    if (ds->aborted)
        ds_await_tick(ds); /* answered at once: shutting down */
    /* Looked at from the next tick, once the models' changes posted
     * before this are seen (the same loop, in order). */
}

void gw_dispatch_await_loaded(gw_dispatch_t *ds, struct gw_async *a, const int64_t *keys, int n,
                              int64_t deadline_us,
                              void (*settle)(struct gw_async *a, const gw_await_result_t *r))
{
    ds_await_t *w = sq_xcalloc(1, sizeof(*w));
    w->ds = ds;
    w->a = a;
    w->n = n;
    w->keys = sq_xcalloc((size_t)(n > 0 ? n : 1), sizeof(*w->keys));
    if (n > 0)
        memcpy(w->keys, keys, sizeof(*keys) * (size_t)n);
    w->deadline_us = deadline_us;
    w->settle = settle;
    sq_loop_post(ds->loop, on_await, w);
}
