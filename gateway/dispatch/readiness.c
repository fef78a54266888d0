/* Readiness, as the dispatch thread sees it every tick and other threads
 * ask (gw_dispatch_ready, gw_dispatch_model_held): why squishd cannot serve
 * every ready model now, and the models a worker up holds, published under
 * ready_lock. */
#include "gw_dispatch_int.h"

#include <string.h>

typedef struct {
    gw_dispatch_t *ds;
    char why[256];
} ready_scan_t;

static int held_has(const gw_dispatch_t *ds, int64_t key)
{
    for (int i = 0; i < ds->nheld; i++)
        if (ds->held_keys[i] == key)
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
    int kind = ds_kind_of_model(x->ds->srv, m);
    if (kind < 0 || atomic_load(&x->ds->srv->kind_up[kind]) == 0) {
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
    if (ds->nheld == ds->capheld) {
        ds->capheld = ds->capheld ? 2 * ds->capheld : 16;
        ds->held_keys = sq_xrealloc(ds->held_keys, sizeof(*ds->held_keys) * (size_t)ds->capheld);
    }
    ds->held_keys[ds->nheld++] = key;
}

void ds_publish_ready(gw_dispatch_t *ds)
{
    ready_scan_t x = {.ds = ds};
    /* Read first: a change during the scan makes the next ask wait. */
    unsigned long gen = gw_registry_generation(ds->srv->registry);
    if (ds_plan_restoring(ds))
        snprintf(x.why, sizeof(x.why),
                 "reapplying the plan stored before the restart: waiting for its workers");
    pthread_mutex_lock(&ds->ready_lock);
    ds->nheld = 0;
    for (int i = 0; i < ds->nmodels; i++) {
        ds_model_t *dm = ds->models[i];
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
    if (!x.why[0])
        gw_registry_foreach(ds->srv->registry, scan_servable, &x);
    snprintf(ds->ready_why, sizeof(ds->ready_why), "%s", x.why);
    ds->ready_gen = gen;
    pthread_mutex_unlock(&ds->ready_lock);
}

int gw_dispatch_ready(gw_server_t *srv, char *why, size_t len)
{
    gw_dispatch_t *ds = srv->dispatch;
    if (ds == NULL) {
        snprintf(why, len, "the dispatcher is starting");
        return 0;
    }
    pthread_mutex_lock(&ds->ready_lock);
    snprintf(why, len, "%s", ds->ready_why);
    /* A model added, measured or deleted since the last look: not ready
     * until the dispatch thread has looked (within a tick, 50 ms). */
    if (why[0] == '\0' && ds->ready_gen != gw_registry_generation(srv->registry))
        snprintf(why, len, "a model changed since the last check; retry shortly");
    pthread_mutex_unlock(&ds->ready_lock);
    return why[0] == '\0';
}

int gw_dispatch_model_held(gw_server_t *srv, int64_t key)
{
    gw_dispatch_t *ds = srv->dispatch;
    int held = 0;
    if (ds == NULL)
        return 0;
    pthread_mutex_lock(&ds->ready_lock);
    for (int i = 0; i < ds->nheld && !held; i++)
        held = ds->held_keys[i] == key;
    pthread_mutex_unlock(&ds->ready_lock);
    return held;
}
