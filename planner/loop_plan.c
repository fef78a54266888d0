/* The planning loop's plans (pl_loop.h): an epoch's job (its sessions,
 * devices and previous plan copied, pl_plan run on any thread, the plan
 * adopted), and the adopted plan read: devices, routes, capacities and
 * stored rates. */
#include "loop_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- plans -------------------------------------------------------------- */

double pl_loop_stage_dispersion(double gamma, const pl_profile_t *parent, double parent_budget_us,
                                double k_std)
{
    if (parent == NULL)
        return 1;
    int batch = 0;
    pl_max_throughput_rps(parent, parent_budget_us, k_std, 0, &batch);
    return pl_clump_dispersion(gamma, gamma, batch);
}

/* The sessions of stages on another stage's crops get them in clumps, one
 * parent batch's at once: their burst headroom plans for that
 * (pl_session_t.dispersion). ss[k] is the plan session of l->s[index[k]]. */
static void set_clump_dispersion(const pl_loop_t *l, pl_session_t *ss, const int *index, int n)
{
    for (int i = 0; i < l->npipes; i++) {
        const lpipe_t *p = &l->pipes[i];
        for (int v = 0; v < p->nstages; v++) {
            const pl_loop_stage_t *st = &p->stages[v];
            if (st->parent < 0 || st->parent >= p->nstages)
                continue;
            const pl_loop_stage_t *par = &p->stages[st->parent];
            const pl_loop_model_t *pm = pl__loop_model_of(l, par->model);
            if (pm == NULL || pm->profile == NULL)
                continue;
            double disp = pl_loop_stage_dispersion(st->gamma, pm->profile, par->budget_ms * 1000.0,
                                                   l->cfg.k_std);
            double bucket = pl__loop_bucket_of(l, st->budget_ms);
            for (int k = 0; k < n; k++) {
                const lsess_t *s = &l->s[index[k]];
                if (s->model == st->model && s->bucket_ms == bucket && disp > ss[k].dispersion)
                    ss[k].dispersion = disp;
            }
        }
    }
}

static int device_key(const pl_loop_devices_t *d, int j)
{
    return d->uncapped ? j : d->keys[j];
}

static int device_id_cmp(const void *a, const void *b)
{
    const pl_device_t *x = a, *y = b;
    return (x->id > y->id) - (x->id < y->id);
}

/* An epoch's planning, owned whole: pl_plan reads nothing else. */
struct pl_loop_job {
    int kind;
    int64_t now_us;
    pl_session_t *ss; /* owned; their profiles and names point into profiles, names */
    int n;
    pl_profile_t *profiles; /* owned: one copy per distinct profile of the loop's */
    int nprofiles;
    char **names; /* owned: one copy per distinct name */
    int nnames;
    pl_link_t *links; /* owned; opt.links */
    pl_options_t opt;
    int has_prev;
    pl_plan_t prev; /* owned: the previous plan's kept devices (renamed) and their allocs */
    int *keys;      /* owned: plan device id j -> key (capped devices) */
    int nkeys;
    int uncapped;
    int ran, rc;
    pl_plan_t plan; /* pl_loop_job_run's, when ran and rc is 0 */
};

typedef struct {
    uintptr_t p;
    int i;
} ref_t;

static int ref_cmp(const void *a, const void *b)
{
    const ref_t *x = a, *y = b;
    if (x->p != y->p)
        return (x->p > y->p) - (x->p < y->p);
    return (x->i > y->i) - (x->i < y->i);
}

/* The job's own copies of its sessions' profiles and names, one per
 * distinct pointer (sorted by pointer: 10,000 sessions share a few dozen
 * profiles). */
static void job_own_inputs(pl_loop_job_t *j)
{
    ref_t *r = sq_xcalloc((size_t)j->n + 1, sizeof(*r));
    j->profiles = sq_xcalloc((size_t)j->n + 1, sizeof(*j->profiles));
    j->names = sq_xcalloc((size_t)j->n + 1, sizeof(*j->names));
    for (int i = 0; i < j->n; i++)
        r[i] = (ref_t){.p = (uintptr_t)j->ss[i].profile, .i = i};
    qsort(r, (size_t)j->n, sizeof(*r), ref_cmp);
    for (int k = 0; k < j->n; k++) {
        pl_session_t *s = &j->ss[r[k].i];
        if (s->profile == NULL)
            continue;
        if (k == 0 || r[k].p != r[k - 1].p)
            pl_profile_copy(&j->profiles[j->nprofiles++], s->profile);
        s->profile = &j->profiles[j->nprofiles - 1];
    }
    for (int i = 0; i < j->n; i++)
        r[i] = (ref_t){.p = (uintptr_t)j->ss[i].name, .i = i};
    qsort(r, (size_t)j->n, sizeof(*r), ref_cmp);
    for (int k = 0; k < j->n; k++) {
        pl_session_t *s = &j->ss[r[k].i];
        if (s->name == NULL)
            continue;
        if (k == 0 || r[k].p != r[k - 1].p)
            j->names[j->nnames++] = sq_xstrdup(s->name);
        s->name = j->names[j->nnames - 1];
    }
    free(r);
}

static void job_dispose(pl_loop_job_t *j)
{
    free(j->ss);
    pl__loop_free_copies(j->profiles, j->nprofiles, j->names, j->nnames);
    free(j->links);
    for (int i = 0; i < j->prev.ndevices; i++)
        free(j->prev.devices[i].allocs);
    free(j->prev.devices);
    free(j->keys);
    if (j->ran && j->rc == 0)
        pl_plan_dispose(&j->plan);
    free(j);
}

pl_loop_job_t *pl_loop_plan_begin(pl_loop_t *l, int kind, const pl_loop_devices_t *devices,
                                  int64_t now_us, int *rc)
{
    *rc = 0;
    if (kind < 0 || kind >= l->cfg.nkinds) {
        *rc = SQ_INVAL;
        return NULL;
    }
    lkind_t *K = &l->kinds[kind];
    if (K->inflight != NULL) {
        *rc = SQ_EXISTS; /* one job per kind at a time */
        return NULL;
    }
    K->dirty = 0;
    pl__loop_compose(l);
    /* The sessions of active models served by this kind at the rates of
     * now (a stage's at its current budget); one without traffic beside a
     * session of its model with some is left out (PL_LOOP_IDLE_RPS). */
    pl_session_t *ss = sq_xcalloc((size_t)l->n + 1, sizeof(*ss));
    int *index = sq_xcalloc((size_t)l->n + 1, sizeof(int));
    /* Models with a session at PL_LOOP_IDLE_RPS or more. */
    char *busy = sq_xcalloc((size_t)l->nmodels + 1, 1);
    for (int i = 0; i < l->n; i++) {
        int mi = sq_map_get(&l->model_ix, (uint64_t)l->s[i].model, 0);
        if (mi >= 0 && l->s[i].rate_rps >= PL_LOOP_IDLE_RPS)
            busy[mi] = 1;
    }
    int n = 0;
    for (int i = 0; i < l->n; i++) {
        lsess_t *s = &l->s[i];
        if (!pl__loop_plannable(l, s->model, kind))
            continue;
        s->planned_rps = s->rate_rps;
        int mi = sq_map_get(&l->model_ix, (uint64_t)s->model, 0);
        if (s->rate_rps < PL_LOOP_IDLE_RPS && mi >= 0 && busy[mi])
            continue; /* a busy sibling */
        const pl_loop_model_t *m = pl__loop_model_of(l, s->model);
        index[n] = i;
        ss[n++] = (pl_session_t){.id = s->id,
                                 .model = (int)s->model,
                                 .name = m->name,
                                 .profile = m->profile,
                                 .slo_us = s->plan_slo_ms * 1000.0,
                                 .rate_rps = s->rate_rps * l->cfg.headroom,
                                 .item_bytes = m->item_bytes};
    }
    set_clump_dispersion(l, ss, index, n);
    free(index);
    free(busy);
    if (devices->n == 0 && n > 0 && !devices->uncapped) {
        free(ss);
        *rc = 1; /* nothing to place them on; the next device up re-plans */
        return NULL;
    }
    pl_loop_job_t *j = sq_xcalloc(1, sizeof(*j));
    j->kind = kind;
    j->now_us = now_us;
    j->ss = ss;
    j->n = n;
    job_own_inputs(j);
    int nlinks = devices->links != NULL ? devices->nlinks : 0;
    if (nlinks > 0) {
        j->links = sq_xcalloc((size_t)nlinks, sizeof(*j->links));
        memcpy(j->links, devices->links, sizeof(*j->links) * (size_t)nlinks);
    }
    j->opt = (pl_options_t){.k_std = l->cfg.k_std,
                            .device_memory_bytes = devices->memory_bytes,
                            .max_devices = devices->uncapped ? 0 : devices->n,
                            .links = j->links,
                            .nlinks = nlinks,
                            .burst_quantile = l->cfg.burst_quantile,
                            .overflow = devices->uncapped ? 0 : l->cfg.overflow,
                            .overflow_devices = l->cfg.overflow_devices};
    j->uncapped = devices->uncapped;
    if (!devices->uncapped) {
        j->nkeys = devices->n;
        j->keys = sq_xcalloc((size_t)devices->n + 1, sizeof(int));
        for (int i = 0; i < devices->n; i++)
            j->keys[i] = devices->keys[i];
    }
    /* The previous plan's devices renamed to this epoch's ids (a device
     * keeps its key), dropped when their key is gone. */
    if (K->has) {
        j->has_prev = 1;
        pl_device_t *kept = sq_xcalloc((size_t)K->plan.ndevices + 1, sizeof(*kept));
        int nkept = 0;
        for (int i = 0; i < K->plan.ndevices; i++) {
            int id = K->plan.devices[i].id;
            int key = id >= 0 && id < K->nkeys ? K->keys[id] : -1;
            for (int d = 0; d < devices->n && key >= 0; d++)
                if (device_key(devices, d) == key) {
                    kept[nkept] = K->plan.devices[i];
                    kept[nkept++].id = d;
                }
        }
        qsort(kept, (size_t)nkept, sizeof(*kept), device_id_cmp);
        for (int i = 0; i < nkept; i++) {
            const pl_alloc_t *a = kept[i].allocs;
            kept[i].allocs = sq_xcalloc((size_t)kept[i].nallocs + 1, sizeof(*a));
            memcpy(kept[i].allocs, a, sizeof(*a) * (size_t)kept[i].nallocs);
        }
        j->prev.devices = kept;
        j->prev.ndevices = nkept;
    }
    K->inflight = j;
    return j;
}

void pl_loop_job_run(pl_loop_job_t *j)
{
    if (j->ran)
        return;
    j->rc = pl_plan(&j->plan, j->ss, j->n, j->has_prev ? &j->prev : NULL, &j->opt);
    j->ran = 1;
}

int pl_loop_plan_finish(pl_loop_t *l, pl_loop_job_t *j)
{
    lkind_t *K = &l->kinds[j->kind];
    if (K->inflight != j) {
        job_dispose(j);
        return SQ_INVAL; /* not this loop's job in flight */
    }
    K->inflight = NULL;
    pl_loop_job_run(j);
    int rc = j->rc;
    if (rc != 0) {
        job_dispose(j);
        return rc;
    }
    pl__loop_kind_clear(K); /* the plan it replaces */
    K->plan = j->plan;
    K->has = 1;
    pl_plan_index_build(&K->index, &K->plan);
    j->ran = 0; /* the plan is the kind's now */
    int nkeys = j->uncapped ? 0 : j->nkeys;
    for (int i = 0; j->uncapped && i < K->plan.ndevices; i++)
        if (K->plan.devices[i].id + 1 > nkeys)
            nkeys = K->plan.devices[i].id + 1;
    K->keys = sq_xcalloc((size_t)nkeys + 1, sizeof(int));
    for (int d = 0; d < nkeys; d++)
        K->keys[d] = j->uncapped ? d : j->keys[d];
    K->nkeys = nkeys;
    K->sessions = j->ss;
    K->nsessions = j->n;
    K->profiles = j->profiles;
    K->nprofiles = j->nprofiles;
    K->names = j->names;
    K->nnames = j->nnames;
    j->ss = NULL;
    j->profiles = NULL;
    j->names = NULL;
    j->nprofiles = j->nnames = 0;
    K->last_epoch_us = j->now_us;
    l->epochs++;
    job_dispose(j);
    return 0;
}

void pl_loop_job_free(pl_loop_t *l, pl_loop_job_t *j)
{
    if (j == NULL)
        return;
    if (l != NULL && l->kinds[j->kind].inflight == j) {
        l->kinds[j->kind].inflight = NULL;
        pl_loop_invalidate(l, j->kind, "plan abandoned");
    }
    job_dispose(j);
}

int pl_loop_plan(pl_loop_t *l, int kind, const pl_loop_devices_t *devices, int64_t now_us)
{
    int rc;
    pl_loop_job_t *j = pl_loop_plan_begin(l, kind, devices, now_us, &rc);
    if (j == NULL)
        return rc;
    pl_loop_job_run(j);
    return pl_loop_plan_finish(l, j);
}

long long pl_loop_epochs(const pl_loop_t *l)
{
    return l->epochs;
}

const pl_plan_t *pl_loop_current(const pl_loop_t *l, int kind)
{
    return kind >= 0 && kind < l->cfg.nkinds && l->kinds[kind].has ? &l->kinds[kind].plan : NULL;
}

const pl_session_t *pl_loop_planned_sessions(const pl_loop_t *l, int kind, int *n)
{
    *n = 0;
    if (kind < 0 || kind >= l->cfg.nkinds)
        return NULL;
    *n = l->kinds[kind].nsessions;
    return l->kinds[kind].sessions;
}

int pl_loop_device_key(const pl_loop_t *l, int kind, int device_id)
{
    if (kind < 0 || kind >= l->cfg.nkinds)
        return -1;
    const lkind_t *K = &l->kinds[kind];
    return K->has && device_id >= 0 && device_id < K->nkeys ? K->keys[device_id] : -1;
}

void pl_loop_restore(pl_loop_t *l, int kind, pl_plan_t *plan, const int *keys, int nkeys)
{
    if (kind < 0 || kind >= l->cfg.nkinds) {
        pl_plan_dispose(plan);
        return;
    }
    lkind_t *K = &l->kinds[kind];
    pl__loop_kind_clear(K);
    K->plan = *plan;
    K->has = 1;
    pl_plan_index_build(&K->index, &K->plan);
    K->keys = sq_xcalloc((size_t)nkeys + 1, sizeof(int));
    memcpy(K->keys, keys, sizeof(int) * (size_t)nkeys);
    K->nkeys = nkeys;
    memset(plan, 0, sizeof(*plan));
}

int pl_loop_holders(const pl_loop_t *l, int kind, int64_t model, int *keys, int max)
{
    const pl_plan_t *plan = pl_loop_current(l, kind);
    int n = 0;
    for (int i = 0; plan != NULL && i < l->kinds[kind].nkeys && n < max; i++) {
        int holds = 0;
        for (int d = 0; d < plan->ndevices && !holds; d++)
            if (plan->devices[d].id == i)
                for (int a = 0; a < plan->devices[d].nallocs; a++)
                    holds |= plan->devices[d].allocs[a].model == (int)model;
        for (int o = 0; o < plan->noverflow && !holds; o++)
            holds = plan->overflow[o].device_id == i && plan->overflow[o].model == (int)model;
        if (holds)
            keys[n++] = l->kinds[kind].keys[i];
    }
    return n;
}

int pl_loop_routes(const pl_loop_t *l, int64_t model, double slo_ms, const pl_loop_route_env_t *env,
                   pl_route_t *routes, int max)
{
    const lsess_t *s = pl__loop_sess((pl_loop_t *)l, model, slo_ms, 0);
    const pl_loop_model_t *m = pl__loop_model_of(l, model);
    const lkind_t *K =
        s != NULL && m != NULL && m->kind >= 0 && m->kind < l->cfg.nkinds && l->kinds[m->kind].has
            ? &l->kinds[m->kind]
            : NULL;
    /* Plan device ids index the kind's keys; a session planned without
     * traffic got the minimal batch: its window is the dispatcher's own
     * choice until a plan sees load. */
    pl_route_rules_t rules = {.workers = K != NULL ? K->keys : NULL,
                              .nworkers = K != NULL ? K->nkeys : 0,
                              .usable = env->usable,
                              .ctx = env->ctx,
                              .model = model,
                              .targets = s != NULL && s->planned_rps >= 1,
                              .fallback = (int *)env->holders,
                              .nfallback = env->nholders,
                              .used_fallback = env->used_fallback,
                              .index = K != NULL ? &K->index : NULL};
    return pl_plan_routes(K != NULL ? &K->plan : NULL, s != NULL ? s->id : -1, &rules, routes, max);
}

double pl_loop_capacity_rps(const pl_loop_t *l, int kind, int session_id)
{
    if (pl_loop_current(l, kind) == NULL)
        return 0;
    const pl_plan_entry_t *e = pl_plan_index_get(&l->kinds[kind].index, session_id);
    return e != NULL ? e->capacity_rps : 0;
}

double pl_loop_stored_rate(const pl_loop_t *l, int kind, int session_id, const pl_alloc_t *al)
{
    const pl_plan_t *plan = pl_loop_current(l, kind);
    const lsess_t *s = pl__loop_sess_by_id(l, session_id);
    if (plan == NULL || s == NULL)
        return al->rate_rps;
    const pl_plan_entry_t *e = pl_plan_index_get(&l->kinds[kind].index, session_id);
    double packed = e != NULL ? e->packed_rps + e->unplaced_rps : 0;
    double input = s->planned_rps * l->cfg.headroom;
    return packed > input ? al->rate_rps * input / packed : al->rate_rps;
}
