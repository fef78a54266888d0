/* Prefix groups and twins. Models the model DB found to share all but their
 * last layers run as one group (Nexus's prefix batching); identical files
 * (twins) share one loaded copy. */
#include "placement_int.h"

#include <stdlib.h>
#include <string.h>

static void group_apply(ds_model_t *g, int kind, const mdb_profile_row_t *rows, int n,
                        const char *how);

/* ---- prefix groups --------------------------------------------------------
 * Models the model DB found to share all but their last layers run as one
 * group (Nexus's prefix batching): a stand-in model whose sessions the core
 * and the planner see like any other, whose batches mix the members'
 * requests, and whose profile the worker measures on the group itself.
 * A group forms once at least two of its models are ready with the same
 * input; until it is loaded and measured, each member runs alone. */

typedef struct {
    int64_t gid;
    int kind;
    const gw_model_t *like;
    gw_model_t *found[SQ_MAX_GROUP_MEMBERS];
    int n;
} group_scan_t;

static int same_input(const gw_model_t *a, const gw_model_t *b)
{
    if (a->c != b->c || a->h != b->h || a->w != b->w || a->nhwc != b->nhwc ||
        a->input_uint8 != b->input_uint8 || a->bgr != b->bgr || a->nearest != b->nearest ||
        a->precision != b->precision) /* one plan runs in one precision */
        return 0;
    for (int c = 0; c < 3; c++)
        if (a->mean[c] != b->mean[c] || a->std[c] != b->std[c])
            return 0;
    return 1;
}

static void group_scan_one(gw_model_t *m, void *arg)
{
    group_scan_t *g = arg;
    /* A member's row in a group's batch is its one output (the worker's
     * suffixes have one each): a model with several outputs runs alone. */
    if (m->group_id != g->gid || m->emulated || strcmp(m->status, "ready") != 0 ||
        m->noutputs != 1 || !m->has_profile[g->kind] || !same_input(m, g->like) ||
        g->n == SQ_MAX_GROUP_MEMBERS)
        return;
    for (int i = 0; i < g->n; i++) {
        /* Twins: one member serves both (see twin_of), the oldest. */
        if (strcmp(g->found[i]->sha256, m->sha256) != 0)
            continue;
        if (g->found[i]->key < m->key)
            return;
        gw_model_unref(g->found[i]);
        memmove(&g->found[i], &g->found[i + 1], sizeof(g->found[0]) * (size_t)(g->n - i - 1));
        g->n--;
        break;
    }
    gw_model_ref(m);
    int i = g->n++;
    while (i > 0 && g->found[i - 1]->key > m->key) {
        g->found[i] = g->found[i - 1];
        i--;
    }
    g->found[i] = m;
}

int ds_group_member_index(const ds_model_t *g, const gw_model_t *m)
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

static void on_group_profile(sq_loop_t *loop, void *arg)
{
    group_profile_job_t *j = arg;
    gw_dispatch_t *ds = j->ds;
    (void)loop;
    ds_model_t *g = ds_model_find(ds, j->key);
    if (g != NULL && !g->removed && !g->failed && !ds->aborted) {
        if (j->rc == 0) {
            group_apply(g, j->kind, j->rows, j->nrows, "stored");
        } else {
            g->profile_pending = 1;
            ds_start_profile(ds, g);
        }
    }
    free(j->rows);
    free(j);
    ds_cmd_pump(ds);
}

static void group_profile_get_job(mdb_t *db, void *arg)
{
    group_profile_job_t *j = arg;
    j->rc = mdb_group_profile_get(db, j->members, sq_dev_kind_name(j->kind), &j->rows, &j->nrows);
    if (j->rc == SQ_DB)
        SQ_WARN("cannot read a stored group profile error=\"%s\"", mdb_errmsg(db));
    sq_loop_post(j->ds->loop, on_group_profile, j);
}

static void group_profile_store_job(mdb_t *db, void *arg)
{
    group_profile_job_t *j = arg;
    if (mdb_group_profile_store(db, j->members, j->member_shas, sq_dev_kind_name(j->kind),
                                j->device, j->rows, j->nrows) != 0)
        SQ_WARN("cannot store a group profile error=\"%s\"", mdb_errmsg(db));
    free(j->rows);
    free(j);
}

static ds_model_t *group_form(gw_dispatch_t *ds, const gw_model_t *m, int kind)
{
    for (int i = 0; i < ds->nmodels; i++) {
        ds_model_t *g = ds->models[i];
        if (g->is_group && !g->removed && g->group_id == m->group_id && g->kind == kind)
            return ds_group_member_index(g, m) >= 0 ? g : NULL;
    }
    group_scan_t scan = {.gid = m->group_id, .kind = kind, .like = m};
    gw_registry_foreach(ds->registry, group_scan_one, &scan);
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
    gm->key = -(int64_t)++ds->place.group_gen; /* never reused: late answers name no other group */
    snprintf(gm->name, sizeof(gm->name), "prefix-group-%lld", (long long)m->group_id);
    snprintf(gm->status, sizeof(gm->status), "ready");
    const gw_model_t *f = scan.found[0];
    gm->input_uint8 = f->input_uint8;
    gm->c = f->c;
    gm->h = f->h;
    gm->w = f->w;
    gm->nhwc = f->nhwc;
    gm->bgr = f->bgr;
    gm->nearest = f->nearest;
    gm->precision = f->precision;
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
    ds_model_append(ds, g);
    char names[512] = "";
    for (int i = 0; i < scan.n; i++)
        snprintf(names + strlen(names), sizeof(names) - strlen(names), "%s%s:%d", i ? "," : "",
                 scan.found[i]->name, scan.found[i]->version);
    SQ_INFO("prefix group formed group=%s members=%d models=%s kind=%s", gm->name, scan.n, names,
            sq_dev_kind_name(kind));
    /* Measured before, with these very files and cuts? Else measure it. */
    group_key(g);
    g->profile_pending = 0;
    group_profile_job_t *j = sq_xcalloc(1, sizeof(*j));
    j->ds = ds;
    j->key = g->key;
    j->kind = kind;
    snprintf(j->members, sizeof(j->members), "%s", g->members_key);
    gw_db_job(ds->db, group_profile_get_job, j);
    return g;
}

/* ---- twins ----------------------------------------------------------------
 * The same file uploaded twice (another version, another name) with the
 * same input and batch limit computes the same thing: the oldest ready copy
 * serves the requests of all of them from its one load, and a newer copy
 * takes the older one's profile instead of being measured. Each keeps its
 * own labels, metrics and answers (they are the request's model's). */

typedef struct {
    const gw_model_t *like;
    gw_model_t *oldest;
} twin_scan_t;

static void twin_scan_one(gw_model_t *m, void *arg)
{
    twin_scan_t *t = arg;
    if (m->key == t->like->key || m->emulated || strcmp(m->status, "ready") != 0 ||
        strcmp(m->sha256, t->like->sha256) != 0 || m->max_batch != t->like->max_batch ||
        !same_input(m, t->like))
        return;
    if (t->oldest != NULL && t->oldest->key < m->key)
        return;
    gw_model_unref(t->oldest);
    gw_model_ref(m);
    t->oldest = m;
}

/* The oldest ready model with m's very file and input, if older than m. */
gw_model_t *ds_twin_find(gw_dispatch_t *ds, const gw_model_t *m)
{
    twin_scan_t scan = {.like = m};
    if (m->emulated)
        return NULL;
    gw_registry_foreach(ds->registry, twin_scan_one, &scan);
    if (scan.oldest != NULL && scan.oldest->key > m->key) {
        gw_model_unref(scan.oldest);
        scan.oldest = NULL;
    }
    return scan.oldest;
}

typedef struct {
    const gw_model_t *like;
    int64_t key; /* the oldest match's, 0: none */
} measuring_scan_t;

static void measuring_scan_one(gw_model_t *m, void *arg)
{
    measuring_scan_t *t = arg;
    if (m->key >= t->like->key || m->emulated || strcmp(m->status, "profiling") != 0 ||
        strcmp(m->sha256, t->like->sha256) != 0 || m->max_batch != t->like->max_batch ||
        !same_input(m, t->like))
        return;
    if (t->key == 0 || m->key < t->key)
        t->key = m->key;
}

int64_t ds_twin_measuring(gw_dispatch_t *ds, const gw_model_t *m)
{
    measuring_scan_t scan = {.like = m};
    if (m->emulated)
        return 0;
    gw_registry_foreach(ds->registry, measuring_scan_one, &scan);
    return scan.key;
}

/* The model whose load serves dm's requests instead of its own, if any. */
ds_model_t *ds_twin_of(gw_dispatch_t *ds, ds_model_t *dm)
{
    if (dm->is_group || dm->m->emulated)
        return NULL;
    if (dm->twin != NULL && (dm->twin->removed || dm->twin->poisoned))
        dm->twin = NULL;
    if (dm->twin_checked != ds->place.group_epoch) {
        dm->twin_checked = ds->place.group_epoch;
        gw_model_t *t = ds_twin_find(ds, dm->m);
        dm->twin = t != NULL ? ds_model_get(ds, t) : NULL;
        gw_model_unref(t);
    }
    return dm->twin;
}

/* The group member model dm's requests can run in, if one is usable now
 * (forming it, and starting its measurement, when its time has come). */
ds_model_t *ds_group_of(gw_dispatch_t *ds, ds_model_t *dm)
{
    const gw_model_t *m = dm->m;
    if (!ds->cfg.prefix_batching || m->group_id <= 0 || m->emulated || dm->is_group)
        return NULL;
    if (dm->group != NULL && (dm->group->removed || dm->group->failed))
        dm->group = NULL;
    if (dm->group == NULL && dm->group_checked != ds->place.group_epoch) {
        dm->group_checked = ds->place.group_epoch;
        int kind = ds_kind_of_model(ds, m);
        if (kind == SQ_DEV_CPU || kind == SQ_DEV_CUDA)
            dm->group = group_form(ds, m, kind);
    }
    return group_usable(dm->group) ? dm->group : NULL;
}

/* Stops routing to group g: unloads it, removes its sessions (their queued
 * requests are answered by the core) and lets the next request form a new
 * group from the models there are now. */
void ds_group_retire(gw_dispatch_t *ds, ds_model_t *g, const char *why)
{
    if (g->removed)
        return;
    g->removed = 1;
    ds->reclaim_due = 1;
    SQ_INFO("prefix group retired group=%s reason=\"%s\"", g->m->name, why);
    /* Requests waiting in it run in their own models' sessions instead (the
     * core hands back those queued in its sessions as drops, see pump). */
    for (int i = 0; i < g->npending; i++)
        ds_cmd_resubmit(ds, g->pending[i]);
    g->npending = 0;
    ds_withdraw(ds, g);
    ds_group_free_blobs(g);
    for (int i = 0; i < ds->nmodels; i++)
        if (ds->models[i]->group == g)
            ds->models[i]->group = NULL;
    if (g->kind >= 0 && g->active)
        ds_plan_invalidate(ds, g->kind, "prefix group retired");
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

void ds_group_profiled(gw_dispatch_t *ds, ds_model_t *g, ds_worker_t *w,
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
    gw_db_job(ds->db, group_profile_store_job, j);
}
