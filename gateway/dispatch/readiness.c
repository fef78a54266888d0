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

/* A ready model no worker up can serve makes squishd not ready. */
static void scan_servable(gw_model_t *m, void *arg)
{
    ready_scan_t *x = arg;
    if (x->why[0] || strcmp(m->status, "ready") != 0)
        return;
    int kind = ds_kind_of_model(x->ds->srv, m);
    if (kind < 0 || atomic_load(&x->ds->srv->kind_up[kind]) == 0)
        snprintf(x->why, sizeof(x->why), "no worker that can serve model %s version %d is up%s",
                 m->name, m->version,
                 m->emulated ? " (an emulated model needs an emu worker)"
                 : kind >= 0 ? " (one is being restarted)"
                             : "");
}

static void held_add(gw_dispatch_t *ds, int64_t key)
{
    if (ds->nheld == ds->capheld) {
        ds->capheld = ds->capheld ? 2 * ds->capheld : 16;
        ds->held_keys = sq_xrealloc(ds->held_keys, sizeof(*ds->held_keys) * (size_t)ds->capheld);
    }
    ds->held_keys[ds->nheld++] = key;
}

/* Whether dm is a member of a prefix group (whose loads then serve it). */
static int in_group(const gw_dispatch_t *ds, const ds_model_t *dm)
{
    for (int i = 0; i < ds->nmodels; i++) {
        const ds_model_t *g = ds->models[i];
        for (int k = 0; k < g->nmembers && !g->removed && !g->failed; k++)
            if (g->members[k]->key == dm->key)
                return 1;
    }
    return 0;
}

void ds_publish_ready(gw_dispatch_t *ds)
{
    ready_scan_t x = {.ds = ds};
    if (ds_plan_restoring(ds))
        snprintf(x.why, sizeof(x.why),
                 "reapplying the plan stored before the restart: waiting for its workers");
    if (!x.why[0])
        gw_registry_foreach(ds->srv->registry, scan_servable, &x);
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
        } else if (dm->active && !x.why[0] && dm->nmembers == 0 &&
                   strcmp(dm->m->status, "ready") == 0 && !in_group(ds, dm)) {
            snprintf(x.why, sizeof(x.why), "model %s version %d is %s", dm->m->name, dm->m->version,
                     loading > 0 ? "loading on its workers" : "placed but not loaded yet");
        }
    }
    snprintf(ds->ready_why, sizeof(ds->ready_why), "%s", x.why);
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
