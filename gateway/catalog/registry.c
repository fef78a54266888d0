#include "gw_catalog.h"

#include <sq.h>

#include <stdlib.h>
#include <string.h>

void gw_model_ref(gw_model_t *m)
{
    atomic_fetch_add(&m->refs, 1);
}

void gw_model_unref(gw_model_t *m)
{
    if (m == NULL || atomic_fetch_sub(&m->refs, 1) != 1)
        return;
    for (int k = 0; k < SQ_DEV_KIND_COUNT; k++)
        if (m->has_profile[k])
            pl_profile_dispose(&m->profile[k]);
    json_decref(m->labels);
    json_decref(m->record);
    free(m);
}

const char *gw_model_label(const gw_model_t *m, int64_t i, char *buf, size_t len)
{
    const char *s = json_string_value(json_array_get(m->labels, (size_t)i));
    if (s != NULL)
        return s;
    snprintf(buf, len, "%lld", (long long)i);
    return buf;
}

static double num_at(json_t *a, size_t i)
{
    return json_number_value(json_array_get(a, i));
}

gw_model_t *gw_model_from_record(json_t *rec)
{
    gw_model_t *m = sq_xcalloc(1, sizeof(*m));
    atomic_init(&m->refs, 1);
    m->key = json_integer_value(json_object_get(rec, "id"));
    snprintf(m->name, sizeof(m->name), "%s", json_string_value(json_object_get(rec, "name")));
    m->version = (int)json_integer_value(json_object_get(rec, "version"));
    snprintf(m->sha256, sizeof(m->sha256), "%s", json_string_value(json_object_get(rec, "sha256")));
    m->emulated = strcmp(json_string_value(json_object_get(rec, "format")), "emulated") == 0;
    snprintf(m->status, sizeof(m->status), "%s",
             json_is_true(json_object_get(rec, "unloaded"))
                 ? "unloaded"
                 : json_string_value(json_object_get(rec, "status")));
    json_t *vp = json_object_get(rec, "version_policy");
    char vperr[160];
    m->has_policy =
        vp != NULL && gw_version_policy_parse(vp, &m->policy, vperr, sizeof(vperr)) == 0;
    const char *why = json_string_value(json_object_get(rec, "error"));
    snprintf(m->error, sizeof(m->error), "%s", why != NULL ? why : "");
    json_t *in = json_object_get(rec, "input");
    snprintf(m->input_name, sizeof(m->input_name), "%s",
             json_string_value(json_object_get(in, "name")));
    const char *dt = json_string_value(json_object_get(in, "datatype"));
    m->input_uint8 = dt != NULL && strcmp(dt, "UINT8") == 0;
    json_t *shape = json_object_get(in, "shape");
    if (json_array_size(shape) == 4) {
        int d[4];
        for (size_t i = 0; i < 4; i++)
            d[i] = (int)json_integer_value(json_array_get(shape, i));
        /* [N,H,W,3] (NHWC) takes images too; anything else is read NCHW. */
        m->nhwc = d[3] == 3 && d[1] != 3;
        m->c = m->nhwc ? d[3] : d[1];
        m->h = m->nhwc ? d[1] : d[2];
        m->w = m->nhwc ? d[2] : d[3];
    }
    json_t *out0 = json_array_get(json_object_get(rec, "outputs"), 0);
    snprintf(m->output_name, sizeof(m->output_name), "%s",
             json_string_value(json_object_get(out0, "name")));
    size_t oi;
    json_t *o;
    json_array_foreach(json_object_get(rec, "outputs"), oi, o)
    {
        if (m->noutputs == GW_MAX_OUTPUTS)
            break;
        gw_output_t *g = &m->outputs[m->noutputs++];
        snprintf(g->name, sizeof(g->name), "%s", json_string_value(json_object_get(o, "name")));
        json_t *sh = json_object_get(o, "shape");
        g->elems = 1;
        for (size_t d = 0; d < json_array_size(sh) && d < GW_MAX_DIMS; d++) {
            json_t *dim = json_array_get(sh, d);
            g->dims[g->ndims++] = json_is_integer(dim) ? json_integer_value(dim) : -1;
            if (d > 0)
                g->elems *= g->dims[d];
        }
        m->out_elems += g->elems;
    }
    json_t *det = json_object_get(rec, "detections");
    if (m->emulated && json_is_object(det)) {
        json_t *slots = json_object_get(det, "slots");
        m->det_slots = slots != NULL ? (int)json_integer_value(slots) : GW_EMU_DET_DEFAULT_SLOTS;
        m->det_mean = json_number_value(json_object_get(det, "mean"));
    }
    /* Checked at upload; a record that no longer binds answers as a
     * plain model (a warning says why). */
    json_t *detector = json_object_get(rec, "detector");
    if (json_is_object(detector)) {
        char derr[320];
        m->has_detector =
            gw_crops_spec_parse(detector, "detector", &m->detector, derr, sizeof(derr)) == 0 &&
            gw_crops_spec_bind(&m->detector, m->name, m->outputs, m->noutputs, "detector", derr,
                               sizeof(derr)) == 0;
        if (!m->has_detector)
            SQ_WARN("model detector ignored name=%s version=%d why=\"%s\"", m->name, m->version,
                    derr);
    }
    m->segmenter = json_is_true(json_object_get(rec, "segmenter")) && m->noutputs > 0 &&
                   m->outputs[0].ndims == 4;
    json_t *pre = json_object_get(rec, "preprocess");
    for (size_t c = 0; c < 3; c++) {
        m->mean[c] = num_at(json_object_get(pre, "mean"), c);
        m->std[c] = num_at(json_object_get(pre, "std"), c);
    }
    const char *order = json_string_value(json_object_get(pre, "channel_order"));
    m->bgr = order != NULL && strcmp(order, "BGR") == 0;
    /* What the config asked for; a record without one is fp32. */
    int prec = sq_precision_parse(
        json_string_value(json_object_get(json_object_get(rec, "precision"), "asked")));
    m->precision = prec > 0 ? prec : 0;
    const char *resize = json_string_value(json_object_get(pre, "resize"));
    m->nearest = resize != NULL && strcmp(resize, "nearest") == 0;
    m->default_slo_ms = json_number_value(json_object_get(rec, "default_slo_ms"));
    m->max_batch = (int)json_integer_value(json_object_get(rec, "max_batch"));
    m->memory_bytes = (uint64_t)json_integer_value(json_object_get(rec, "memory_bytes"));
    m->labels = json_incref(json_object_get(rec, "labels"));
    const char *kname;
    json_t *reason;
    json_object_foreach(json_object_get(rec, "not_on"), kname, reason)
    {
        int k = sq_dev_kind_parse(kname);
        if (k >= 0 && json_is_string(reason))
            snprintf(m->not_on[k], sizeof(m->not_on[k]), "%s", json_string_value(reason));
    }
    m->record = json_incref(rec);
    json_t *grp = json_object_get(rec, "prefix_group");
    if (json_is_object(grp)) {
        m->group_id = json_integer_value(json_object_get(grp, "id"));
        snprintf(m->cut_tensor, sizeof(m->cut_tensor), "%s",
                 json_string_value(json_object_get(grp, "cut_tensor")));
    }
    size_t i;
    json_t *p;
    json_array_foreach(json_object_get(rec, "profiles"), i, p)
    {
        int k = sq_dev_kind_parse(json_string_value(json_object_get(p, "device_kind")));
        json_t *b = json_object_get(p, "batch"), *l = json_object_get(p, "latency_ms"),
               *sd = json_object_get(p, "latency_std_ms"),
               *mem = json_object_get(p, "peak_memory_bytes");
        size_t n = json_array_size(b);
        if (k < 0 || n == 0 || m->has_profile[k])
            continue;
        pl_profile_row_t *rows = sq_xcalloc(n, sizeof(*rows));
        for (size_t r = 0; r < n; r++)
            rows[r] = (pl_profile_row_t){.batch = (int)json_integer_value(json_array_get(b, r)),
                                         .mean_us = num_at(l, r) * 1000.0,
                                         .std_us = num_at(sd, r) * 1000.0};
        if (pl_profile_init_table(&m->profile[k], rows, (int)n) == 0) {
            m->has_profile[k] = 1;
            m->profile[k].memory_bytes = (double)json_integer_value(json_array_get(mem, 0));
        }
        free(rows);
    }
    return m;
}

struct gw_registry {
    pthread_mutex_t lock;
    gw_model_t **models;
    size_t n, cap;
    atomic_ulong generation; /* bumped by every put and remove */
};

unsigned long gw_registry_generation(gw_registry_t *r)
{
    return atomic_load(&r->generation);
}

gw_registry_t *gw_registry_new(void)
{
    gw_registry_t *r = sq_xcalloc(1, sizeof(*r));
    pthread_mutex_init(&r->lock, NULL);
    return r;
}

void gw_registry_free(gw_registry_t *r)
{
    if (r == NULL)
        return;
    for (size_t i = 0; i < r->n; i++)
        gw_model_unref(r->models[i]);
    free(r->models);
    pthread_mutex_destroy(&r->lock);
    free(r);
}

void gw_registry_put(gw_registry_t *r, gw_model_t *m)
{
    gw_model_t *old = NULL;
    pthread_mutex_lock(&r->lock);
    size_t i = 0;
    while (i < r->n && r->models[i]->key != m->key)
        i++;
    if (i < r->n) {
        old = r->models[i];
        r->models[i] = m;
    } else {
        if (r->n == r->cap) {
            r->cap = r->cap ? r->cap * 2 : 16;
            r->models = sq_xrealloc(r->models, r->cap * sizeof(*r->models));
        }
        r->models[r->n++] = m;
    }
    atomic_fetch_add(&r->generation, 1);
    pthread_mutex_unlock(&r->lock);
    gw_model_unref(old);
}

int gw_registry_remove(gw_registry_t *r, const char *name, int version, int64_t *keys, int max)
{
    int n = 0;
    pthread_mutex_lock(&r->lock);
    for (size_t i = 0; i < r->n;) {
        gw_model_t *m = r->models[i];
        if (strcmp(m->name, name) == 0 && (version == 0 || m->version == version)) {
            if (n < max)
                keys[n] = m->key;
            n++;
            r->models[i] = r->models[--r->n];
            atomic_fetch_add(&r->generation, 1);
            gw_model_unref(m);
        } else {
            i++;
        }
    }
    pthread_mutex_unlock(&r->lock);
    return n;
}

static int same_name(const gw_model_t *m, const char *name, size_t name_len)
{
    return strlen(m->name) == name_len && memcmp(m->name, name, name_len) == 0;
}

/* The policy of a name: its newest version's (any status); all when that
 * one gave none. Under the lock. */
static const gw_version_policy_t *policy_locked(gw_registry_t *r, const char *name, size_t name_len)
{
    static const gw_version_policy_t all = {.kind = GW_VP_ALL};
    const gw_model_t *newest = NULL;
    for (size_t i = 0; i < r->n; i++)
        if (same_name(r->models[i], name, name_len) &&
            (newest == NULL || r->models[i]->version > newest->version))
            newest = r->models[i];
    return newest != NULL && newest->has_policy ? &newest->policy : &all;
}

/* Whether the policy serves m. Under the lock. */
static int served_locked(gw_registry_t *r, const gw_version_policy_t *p, const gw_model_t *m)
{
    if (p->kind == GW_VP_SPECIFIC) {
        for (int i = 0; i < p->nversions; i++)
            if (p->versions[i] == m->version)
                return 1;
        return 0;
    }
    if (p->kind == GW_VP_LATEST) {
        if (strcmp(m->status, "ready") != 0)
            return 0;
        int newer = 0; /* ready versions newer than m */
        for (size_t i = 0; i < r->n; i++) {
            const gw_model_t *o = r->models[i];
            newer += same_name(o, m->name, strlen(m->name)) && o->version > m->version &&
                     strcmp(o->status, "ready") == 0;
        }
        return newer < p->latest;
    }
    return 1;
}

gw_model_t *gw_registry_find(gw_registry_t *r, const char *name, size_t name_len, int version)
{
    gw_model_t *best = NULL;
    int best_rank = 0;
    pthread_mutex_lock(&r->lock);
    const gw_version_policy_t *p = version == 0 ? policy_locked(r, name, name_len) : NULL;
    for (size_t i = 0; i < r->n; i++) {
        gw_model_t *m = r->models[i];
        if (!same_name(m, name, name_len))
            continue;
        if (version != 0) {
            if (m->version == version)
                best = m;
            continue;
        }
        /* The newest ready served version; the newest served while none is
         * ready; the newest of all while none is served (its state, or the
         * policy, is then the answer). */
        int served = served_locked(r, p, m);
        int rank = 2 * served + (served && strcmp(m->status, "ready") == 0);
        if (best == NULL || rank > best_rank || (rank == best_rank && m->version > best->version)) {
            best = m;
            best_rank = rank;
        }
    }
    if (best != NULL)
        gw_model_ref(best);
    pthread_mutex_unlock(&r->lock);
    return best;
}

int gw_registry_served(gw_registry_t *r, const gw_model_t *m, char *why, size_t len)
{
    pthread_mutex_lock(&r->lock);
    const gw_version_policy_t *p = policy_locked(r, m->name, strlen(m->name));
    int served = served_locked(r, p, m);
    gw_version_policy_t copy = *p;
    pthread_mutex_unlock(&r->lock);
    if (!served && why != NULL) {
        char d[160];
        gw_version_policy_describe(&copy, d, sizeof(d));
        snprintf(why, len, "version %d of model %s is not served: its version_policy serves %s",
                 m->version, m->name, d);
    }
    return served;
}

gw_model_t *gw_registry_get(gw_registry_t *r, int64_t key)
{
    gw_model_t *found = NULL;
    pthread_mutex_lock(&r->lock);
    for (size_t i = 0; i < r->n && found == NULL; i++)
        if (r->models[i]->key == key)
            found = r->models[i];
    if (found != NULL)
        gw_model_ref(found);
    pthread_mutex_unlock(&r->lock);
    return found;
}

void gw_registry_foreach(gw_registry_t *r, void (*fn)(gw_model_t *m, void *arg), void *arg)
{
    pthread_mutex_lock(&r->lock);
    for (size_t i = 0; i < r->n; i++)
        fn(r->models[i], arg);
    pthread_mutex_unlock(&r->lock);
}
