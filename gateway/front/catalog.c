/* What the dispatcher says to a frontend: the catalog (FE_CATALOG, the
 * models) and the state (FE_STATE: readiness, the fleet, the models held
 * and going, the pipelines with their split). */
#include "front_int.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

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

/* FE_CATALOG's models become the registry's entries (built from their
 * records as the dispatcher's DB thread builds them); those the catalog no
 * longer has go. Returns the records that did not parse (skipped). */
int fr_take_catalog(gw_registry_t *reg, const gw_fe_catalog_t *cat)
{
    model_ids_t have = {0};
    gw_registry_foreach(reg, collect_id, &have);
    int bad = 0;
    for (uint32_t i = 0; i < cat->n; i++) {
        const gw_fe_model_t *e = &cat->models[i];
        json_t *rec = json_loadb(e->record.p, e->record.len, 0, NULL);
        json_t *id = json_object_get(rec, "id");
        if (!json_is_integer(id) || json_integer_value(id) != e->key ||
            !json_is_string(json_object_get(rec, "name")) ||
            !json_is_string(json_object_get(rec, "format"))) {
            bad++;
            json_decref(rec);
            continue;
        }
        gw_model_t *m = gw_model_from_record(rec);
        json_decref(rec); /* the entry holds its own reference */
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
    return bad;
}

void fr_on_catalog(gw_front_t *fr, const sq_frame_t *f)
{
    gw_fe_catalog_t cat;
    if (gw_fe_catalog_decode(f, &cat) != 0) {
        SQ_WARN("malformed FE_CATALOG from the dispatcher bytes=%u", f->len);
        return;
    }
    int bad = fr_take_catalog(fr->registry, &cat);
    if (bad > 0)
        SQ_WARN("FE_CATALOG from the dispatcher: %d model records do not parse", bad);
    gw_fe_catalog_dispose(&cat);
}

_Static_assert(GW_PIPE_MAX_STAGES == GW_FE_MAX_STAGES, "FE_STATE carries a pipeline's stages");

/* The dispatcher's pipelines: each spec parsed as its DB thread parses a
 * stored one (a new copy when the spec changed), its split taken as made
 * there, and what this frontend measures of them kept for its reports. */
static void sync_pipelines(gw_pipes_t *pipes, const gw_fe_pipe_t *list, uint32_t n)
{
    int nhave = 0;
    gw_pipeline_t **have = gw_pipes_all(pipes, &nhave);
    for (uint32_t i = 0; i < n; i++) {
        const gw_fe_pipe_t *e = &list[i];
        json_t *spec = json_loadb(e->spec.p, e->spec.len, 0, NULL);
        const char *name = json_string_value(json_object_get(spec, "name"));
        if (name == NULL) {
            json_decref(spec);
            continue;
        }
        gw_pipeline_t *p = gw_pipes_get(pipes, name);
        if (p == NULL || !json_equal(p->spec, spec)) {
            gw_pipeline_unref(p);
            char err[256];
            if (gw_pipeline_parse(spec, NULL, &p, err, sizeof(err)) != 0) {
                SQ_WARN("the dispatcher's pipeline %s does not parse here: %s", name, err);
                json_decref(spec);
                continue;
            }
            gw_pipeline_reporting(p);
            gw_pipeline_ref(p);
            gw_pipes_put(pipes, p); /* takes one reference */
        }
        atomic_store(&p->unloaded, e->unloaded);
        double b[GW_PIPE_MAX_STAGES] = {0}, c[GW_PIPE_MAX_STAGES] = {0};
        for (int k = 0; k < p->nstages && (uint32_t)k < e->nstages; k++) {
            b[k] = e->budget_ms[k];
            c[k] = e->cum_ms[k];
        }
        if (b[0] > 0 && e->nstages == (uint32_t)p->nstages)
            gw_pipeline_set_split(p, b, c);
        for (int k = 0; k < nhave; k++)
            if (have[k] != NULL && strcmp(have[k]->name, p->name) == 0) {
                gw_pipeline_unref(have[k]);
                have[k] = NULL; /* kept */
            }
        gw_pipeline_unref(p);
        json_decref(spec);
    }
    for (int k = 0; k < nhave; k++)
        if (have[k] != NULL) {
            gw_pipes_remove(pipes, have[k]->name);
            gw_pipeline_unref(have[k]);
        }
    free(have);
}

static int64_t *keys_copy(const int64_t *keys, uint32_t n)
{
    int64_t *out = n > 0 ? sq_xmalloc(sizeof(*out) * n) : NULL;
    if (n > 0)
        memcpy(out, keys, sizeof(*out) * n);
    return out;
}

fr_live_t *fr_live_from(const gw_fe_state_t *st, int *n)
{
    fr_live_t *live = st->nlive > 0 ? sq_xcalloc(st->nlive, sizeof(*live)) : NULL;
    *n = 0;
    for (uint32_t i = 0; i < st->nlive; i++) {
        const gw_fe_live_t *e = &st->live[i];
        pl_profile_t p;
        if (e->linear) {
            pl_profile_init_linear(&p, e->alpha_us, e->beta_us, e->max_batch);
        } else {
            pl_profile_row_t *rows = sq_xmalloc(sizeof(*rows) * e->nrows);
            for (uint32_t r = 0; r < e->nrows; r++)
                rows[r] = (pl_profile_row_t){.batch = e->rows[r].batch,
                                             .mean_us = e->rows[r].mean_us,
                                             .std_us = e->rows[r].std_us};
            int rc = pl_profile_init_table(&p, rows, (int)e->nrows);
            free(rows);
            if (rc != 0) {
                SQ_WARN("FE_STATE: the live profile of model %lld does not parse",
                        (long long)e->key);
                continue;
            }
            p.max_batch = e->max_batch;
        }
        p.memory_bytes = e->memory_bytes;
        p.memory_per_item_bytes = e->memory_per_item_bytes;
        live[(*n)++] = (fr_live_t){.key = e->key, .kind = e->kind, .profile = p};
    }
    return live;
}

void fr_live_free(fr_live_t *live, int n)
{
    for (int i = 0; i < n; i++)
        pl_profile_dispose(&live[i].profile);
    free(live);
}

/* FE_STATE, decoded, as of now_us: readiness, and the workers up and
 * coming per kind (what this frontend's admission reads from the server
 * record, as a dispatcher's own HTTP side does). */
void fr_take_state(gw_front_t *fr, const gw_fe_state_t *st, int64_t now_us)
{
    gw_fleet_t fleet = {.workers_up = st->workers_up};
    for (int k = 0; k < SQ_DEV_KIND_COUNT; k++) {
        fleet.up[k] = st->up[k];
        fleet.coming[k] = st->coming[k];
        fleet.back_at_us[k] = st->back_in_us[k] < 0 ? INT64_MAX : now_us + st->back_in_us[k];
    }
    sync_pipelines(fr->pipelines, st->pipes, st->npipes);
    int64_t *held = keys_copy(st->held, st->nheld), *gone = keys_copy(st->gone, st->ngone);
    int nlive;
    fr_live_t *live = fr_live_from(st, &nlive), *old_live;
    pthread_mutex_lock(&fr->lock);
    old_live = fr->live;
    int old_nlive = fr->nlive;
    fr->live = live;
    fr->nlive = nlive;
    fr->fleet = fleet;
    free(fr->held);
    free(fr->gone);
    fr->held = held;
    fr->nheld = (int)st->nheld;
    fr->gone = gone;
    fr->ngone = (int)st->ngone;
    snprintf(fr->why, sizeof(fr->why), "%s", st->why);
    fr->ready = st->why[0] == '\0';
    pthread_mutex_unlock(&fr->lock);
    fr_live_free(old_live, old_nlive);
}

void fr_on_state(gw_front_t *fr, const sq_frame_t *f)
{
    gw_fe_state_t st;
    if (gw_fe_state_decode(f, &st) != 0) {
        SQ_WARN("malformed FE_STATE from the dispatcher bytes=%u", f->len);
        return;
    }
    fr_take_state(fr, &st, sq_now_us());
    gw_fe_state_dispose(&st);
}
