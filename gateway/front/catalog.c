/* What the dispatcher says to a frontend: the catalog (FE_CATALOG, the
 * models) and the state (FE_STATE: readiness, the fleet, the models held
 * and going, the pipelines with their split). */
#include "front_int.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

/* ---- what the dispatcher says ----------------------------------------------- */

typedef struct {
    char name[MDB_NAME_MAX + 1];
    int version;
    int64_t key;
} model_id_t;

typedef struct {
    model_id_t *ids;
    int n, cap;
} model_ids_t;

static void collect_id(gw_model_t *m, void *arg)
{
    model_ids_t *ids = arg;
    if (ids->n == ids->cap) {
        ids->cap = ids->cap ? 2 * ids->cap : 16;
        ids->ids = sq_xrealloc(ids->ids, sizeof(*ids->ids) * (size_t)ids->cap);
    }
    model_id_t *x = &ids->ids[ids->n++];
    snprintf(x->name, sizeof(x->name), "%s", m->name);
    x->version = m->version;
    x->key = m->key;
}

/* FE_CATALOG: the registry becomes the dispatcher's (entries built from
 * its records, as its DB thread builds them; those it no longer has go). */
void fr_on_catalog(gw_front_t *fr, const sq_frame_t *f)
{
    json_error_t jerr;
    json_t *cat = json_loadb((const char *)f->payload, f->len, 0, &jerr);
    json_t *models = json_object_get(cat, "models");
    if (!json_is_array(models)) {
        SQ_WARN("malformed FE_CATALOG from the dispatcher: %s", jerr.text);
        json_decref(cat);
        return;
    }
    gw_registry_t *reg = fr->srv->registry;
    model_ids_t have = {0};
    gw_registry_foreach(reg, collect_id, &have);
    size_t i;
    json_t *rec;
    json_array_foreach(models, i, rec)
    {
        if (!json_is_object(rec) || !json_is_integer(json_object_get(rec, "id")))
            continue;
        gw_model_t *m = gw_model_from_record(rec);
        for (int k = 0; k < have.n; k++)
            if (have.ids[k].key == m->key)
                have.ids[k].key = 0; /* kept */
        gw_registry_put(reg, m);
    }
    for (int k = 0; k < have.n; k++) {
        int64_t removed[4];
        if (have.ids[k].key != 0)
            gw_registry_remove(reg, have.ids[k].name, have.ids[k].version, removed, 4);
    }
    free(have.ids);
    json_decref(cat);
}

/* The dispatcher's pipelines: each spec parsed as its DB thread parses a
 * stored one (a new copy when the spec changed), its split taken as made
 * there, and what this frontend measures of them kept for its reports. */
static void sync_pipelines(gw_front_t *fr, json_t *list)
{
    gw_pipes_t *pipes = fr->srv->pipelines;
    int nhave = 0;
    gw_pipeline_t **have = gw_pipes_all(pipes, &nhave);
    size_t i;
    json_t *e;
    json_array_foreach(list, i, e)
    {
        json_t *spec = json_object_get(e, "spec");
        const char *name = json_string_value(json_object_get(spec, "name"));
        if (name == NULL)
            continue;
        gw_pipeline_t *p = gw_pipes_get(pipes, name);
        if (p == NULL || !json_equal(p->spec, spec)) {
            gw_pipeline_unref(p);
            char err[256];
            if (gw_pipeline_parse(spec, NULL, &p, err, sizeof(err)) != 0) {
                SQ_WARN("the dispatcher's pipeline %s does not parse here: %s", name, err);
                continue;
            }
            gw_pipeline_reporting(p);
            gw_pipeline_ref(p);
            gw_pipes_put(pipes, p); /* takes one reference */
        }
        atomic_store(&p->unloaded, json_is_true(json_object_get(e, "unloaded")));
        double b[GW_PIPE_MAX_STAGES] = {0}, c[GW_PIPE_MAX_STAGES] = {0};
        for (int k = 0; k < p->nstages; k++) {
            b[k] = json_number_value(json_array_get(json_object_get(e, "budget_ms"), (size_t)k));
            c[k] = json_number_value(json_array_get(json_object_get(e, "cum_ms"), (size_t)k));
        }
        if (b[0] > 0)
            gw_pipeline_set_split(p, b, c);
        for (int k = 0; k < nhave; k++)
            if (have[k] != NULL && strcmp(have[k]->name, name) == 0) {
                gw_pipeline_unref(have[k]);
                have[k] = NULL; /* kept */
            }
        gw_pipeline_unref(p);
    }
    for (int k = 0; k < nhave; k++)
        if (have[k] != NULL) {
            gw_pipes_remove(pipes, have[k]->name);
            gw_pipeline_unref(have[k]);
        }
    free(have);
}

static int keys_of(json_t *a, int64_t **out)
{
    size_t n = json_array_size(a);
    *out = n > 0 ? sq_xmalloc(sizeof(**out) * n) : NULL;
    for (size_t i = 0; i < n; i++)
        (*out)[i] = json_integer_value(json_array_get(a, i));
    return (int)n;
}

/* FE_STATE: readiness, and the workers up and coming per kind (what this
 * frontend's admission reads from the server record, as a dispatcher's
 * own HTTP side does). */
void fr_on_state(gw_front_t *fr, const sq_frame_t *f)
{
    json_t *st = json_loadb((const char *)f->payload, f->len, 0, NULL);
    if (!json_is_object(st)) {
        SQ_WARN("malformed FE_STATE from the dispatcher");
        json_decref(st);
        return;
    }
    int64_t now = sq_now_us();
    gw_fleet_t fleet = {.workers_up = (int)json_integer_value(json_object_get(st, "workers_up"))};
    for (int k = 0; k < SQ_DEV_KIND_COUNT; k++) {
        fleet.up[k] = (int)json_integer_value(json_array_get(json_object_get(st, "kind_up"), k));
        fleet.coming[k] =
            (int)json_integer_value(json_array_get(json_object_get(st, "kind_coming"), k));
        int64_t back =
            json_integer_value(json_array_get(json_object_get(st, "kind_back_in_us"), k));
        fleet.back_at_us[k] = back < 0 ? INT64_MAX : now + back;
    }
    sync_pipelines(fr, json_object_get(st, "pipelines"));
    int64_t *held, *gone;
    int nheld = keys_of(json_object_get(st, "held"), &held);
    int ngone = keys_of(json_object_get(st, "gone"), &gone);
    const char *why = json_string_value(json_object_get(st, "why"));
    pthread_mutex_lock(&fr->lock);
    fr->fleet = fleet;
    free(fr->held);
    free(fr->gone);
    fr->held = held;
    fr->nheld = nheld;
    fr->gone = gone;
    fr->ngone = ngone;
    snprintf(fr->why, sizeof(fr->why), "%s", why != NULL ? why : "");
    fr->ready = why != NULL && why[0] == '\0';
    pthread_mutex_unlock(&fr->lock);
    json_decref(st);
}
