/* The planning loop (pl_loop.h): rates, epochs, the sessions pl_plan sees,
 * routes and splits, for squishd and squish-sim alike. */
#include "pl_loop.h"

#include <sq.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int64_t key;
    pl_loop_model_t m;
} lmodel_t;

typedef struct {
    int id;
    int64_t model;
    double bucket_ms;
    /* Its own requests (not a pipeline's items: lstage_t counts those). */
    double ewma_rps; /* about epoch.ewma_tau_ms of history */
    double own_rps;  /* max(EWMA, the last interval's) */
    double rate_rps; /* own_rps plus the rates of the stages in its bucket */
    /* The SLO it is planned for: the bucket, or, for a session whose only
     * traffic is pipeline stages', the least of their budgets (at least
     * the bucket: a budget of 355 ms is not planned as 300). */
    double plan_slo_ms;
    double planned_rps;
    double arrivals; /* since the last rate step */
    /* Its own requests' SLO: the least of the last rate interval with
     * any (a bucket holds SLOs from the bucket up to the next one; planned
     * at the bucket, a session of 27 ms requests in bucket 25 may find no
     * batch at all), or the SLO it was made for. */
    double own_slo_ms;
    double least_slo_ms; /* of the arrivals since the last rate step */
} lsess_t;

/* A pipeline stage's items at one query SLO. Their rate is the stage's,
 * not a bucket's: when the split moves the stage's budget to another SLO
 * bucket, the whole rate moves to that bucket's session at once, and the
 * session it left has none of it. Counted per bucket, the old bucket's
 * rate would decay over the EWMA's tau (up fast, down slow) and hold a
 * device meanwhile. */
typedef struct {
    int64_t pipe;
    int stage;
    double query_slo_ms;
    int64_t model;
    double bucket_ms; /* where its rate went at the last compose; 0: nowhere yet */
    double ewma_rps, rate_rps, arrivals;
} lstage_t;

typedef struct {
    int64_t key;
    double slo_ms;
    int nstages;
    pl_loop_stage_t *stages; /* owned */
} lpipe_t;

typedef struct {
    int has;
    pl_plan_t plan;
    int *keys; /* plan device id -> the caller's key */
    int nkeys;
    int64_t last_epoch_us;
    int dirty;
    char reason[48];
    pl_session_t *sessions; /* what the last epoch gave pl_plan (its job's copies) */
    int nsessions;
    pl_profile_t *profiles; /* owned: the sessions' profiles */
    int nprofiles;
    char **names; /* owned: the sessions' names */
    int nnames;
    const pl_loop_job_t *inflight; /* begun, not finished nor freed */
    pl_plan_index_t index;         /* plan read by session */
} lkind_t;

struct pl_loop {
    pl_loop_config_t cfg;
    lmodel_t *models;
    int nmodels, capmodels;
    lsess_t *s;
    int n, cap, next_id;
    lstage_t *st;
    int nst, capst;
    lpipe_t *pipes;
    int npipes, cappipes;
    lkind_t kinds[PL_LOOP_MAX_KINDS];
    sq_map_t model_ix; /* key -> index into models */
    sq_map_t sess_ix;  /* (model, bucket's bits) -> index into s */
    int64_t last_rate_us;
    long long epochs;
};

static const double slo_buckets_ms[] = {5,   10,   15,   20,   25,   30,   40,    50,    60,
                                        75,  100,  125,  150,  200,  250,  300,   400,   500,
                                        750, 1000, 1500, 2000, 3000, 5000, 10000, 30000, 60000};
#define NBUCKETS (sizeof(slo_buckets_ms) / sizeof(slo_buckets_ms[0]))

double pl_loop_slo_bucket_ms(double slo_ms)
{
    double b = slo_buckets_ms[0];
    for (size_t i = 0; i < NBUCKETS && slo_buckets_ms[i] <= slo_ms; i++)
        b = slo_buckets_ms[i];
    return b;
}

void pl_loop_config_default(pl_loop_config_t *c)
{
    memset(c, 0, sizeof(*c));
    pl_epoch_config_default(&c->epoch);
    c->scale_up_ms = 1000;
    c->rate_interval_ms = 1000;
    c->headroom = 1;
    c->burst_quantile = PL_BURST_QUANTILE;
    c->overflow = 1;
    c->nkinds = 1;
}

pl_loop_t *pl_loop_new(const pl_loop_config_t *c, int64_t now_us)
{
    pl_loop_t *l = sq_xcalloc(1, sizeof(*l));
    l->cfg = *c;
    if (l->cfg.nkinds < 1)
        l->cfg.nkinds = 1;
    if (l->cfg.nkinds > PL_LOOP_MAX_KINDS)
        l->cfg.nkinds = PL_LOOP_MAX_KINDS;
    if (!(l->cfg.rate_interval_ms > 0))
        l->cfg.rate_interval_ms = 1000;
    if (!(l->cfg.headroom > 0))
        l->cfg.headroom = 1;
    l->last_rate_us = now_us;
    return l;
}

static void free_copies(pl_profile_t *profiles, int nprofiles, char **names, int nnames);

static void kind_clear(lkind_t *K)
{
    if (K->has)
        pl_plan_dispose(&K->plan);
    pl_plan_index_dispose(&K->index);
    free(K->keys);
    free(K->sessions);
    free_copies(K->profiles, K->nprofiles, K->names, K->nnames);
    K->keys = NULL;
    K->sessions = NULL;
    K->profiles = NULL;
    K->names = NULL;
    K->nkeys = K->nsessions = K->has = K->nprofiles = K->nnames = 0;
}

void pl_loop_free(pl_loop_t *l)
{
    if (l == NULL)
        return;
    for (int k = 0; k < PL_LOOP_MAX_KINDS; k++)
        kind_clear(&l->kinds[k]);
    for (int i = 0; i < l->npipes; i++)
        free(l->pipes[i].stages);
    free(l->pipes);
    free(l->models);
    free(l->s);
    sq_map_dispose(&l->model_ix);
    sq_map_dispose(&l->sess_ix);
    free(l->st);
    free(l);
}

/* ---- models and sessions ------------------------------------------------- */

static const pl_loop_model_t *model_of(const pl_loop_t *l, int64_t key)
{
    int i = sq_map_get(&l->model_ix, (uint64_t)key, 0);
    return i >= 0 ? &l->models[i].m : NULL;
}

static uint64_t bits_of(double x)
{
    uint64_t u;
    memcpy(&u, &x, sizeof(u));
    return u;
}

/* The maps again, after the arrays were compacted. */
static void reindex(pl_loop_t *l)
{
    sq_map_clear(&l->model_ix);
    for (int i = 0; i < l->nmodels; i++)
        sq_map_put(&l->model_ix, (uint64_t)l->models[i].key, 0, i);
    sq_map_clear(&l->sess_ix);
    for (int i = 0; i < l->n; i++)
        sq_map_put(&l->sess_ix, (uint64_t)l->s[i].model, bits_of(l->s[i].bucket_ms), i);
}

/* Whether model key is planned on kind (active, with a profile there). */
static int plannable(const pl_loop_t *l, int64_t key, int kind)
{
    const pl_loop_model_t *m = model_of(l, key);
    return m != NULL && m->active && m->kind == kind && m->profile != NULL;
}

void pl_loop_model_set(pl_loop_t *l, int64_t key, const pl_loop_model_t *m)
{
    int i = sq_map_get(&l->model_ix, (uint64_t)key, 0);
    if (i >= 0) {
        l->models[i].m = *m;
        return;
    }
    if (l->nmodels == l->capmodels) {
        l->capmodels = l->capmodels ? 2 * l->capmodels : 16;
        l->models = sq_xrealloc(l->models, sizeof(*l->models) * (size_t)l->capmodels);
    }
    sq_map_put(&l->model_ix, (uint64_t)key, 0, l->nmodels);
    l->models[l->nmodels++] = (lmodel_t){.key = key, .m = *m};
}

void pl_loop_model_forget(pl_loop_t *l, int64_t key)
{
    int k = 0;
    for (int i = 0; i < l->n; i++)
        if (l->s[i].model != key)
            l->s[k++] = l->s[i];
    l->n = k;
    k = 0;
    for (int i = 0; i < l->nst; i++)
        if (l->st[i].model != key)
            l->st[k++] = l->st[i];
    l->nst = k;
    for (int i = 0; i < l->nmodels; i++)
        if (l->models[i].key == key) {
            l->models[i] = l->models[--l->nmodels];
            break;
        }
    reindex(l);
}

static double bucket_of(const pl_loop_t *l, double slo_ms)
{
    return l->cfg.slo_bucket_ms != NULL ? l->cfg.slo_bucket_ms(slo_ms) : slo_ms;
}

/* The session of model at slo_ms's bucket, made (for slo_ms) when create. */
static lsess_t *sess(pl_loop_t *l, int64_t model, double slo_ms, int create)
{
    double bucket_ms = bucket_of(l, slo_ms);
    int i = sq_map_get(&l->sess_ix, (uint64_t)model, bits_of(bucket_ms));
    if (i >= 0)
        return &l->s[i];
    if (!create)
        return NULL;
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 16;
        l->s = sq_xrealloc(l->s, sizeof(*l->s) * (size_t)l->cap);
    }
    sq_map_put(&l->sess_ix, (uint64_t)model, bits_of(bucket_ms), l->n);
    l->s[l->n] = (lsess_t){.id = l->next_id++,
                           .model = model,
                           .bucket_ms = bucket_ms,
                           .plan_slo_ms = slo_ms,
                           .own_slo_ms = slo_ms,
                           .least_slo_ms = INFINITY};
    return &l->s[l->n++];
}

/* Sessions are appended with rising ids and removed in place, so l->s is
 * sorted by id: a binary search. */
static const lsess_t *sess_by_id(const pl_loop_t *l, int id)
{
    int lo = 0, hi = l->n;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (l->s[mid].id < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < l->n && l->s[lo].id == id ? &l->s[lo] : NULL;
}

int pl_loop_session(pl_loop_t *l, int64_t model, double slo_ms, int create)
{
    lsess_t *s = sess(l, model, slo_ms, create);
    if (s != NULL && create && slo_ms < s->own_slo_ms)
        s->own_slo_ms = slo_ms;
    return s != NULL ? s->id : -1;
}

void pl_loop_arrivals(pl_loop_t *l, int64_t model, double slo_ms, double n)
{
    lsess_t *s = sess(l, model, slo_ms, 1);
    s->arrivals += n;
    if (n > 0 && slo_ms < s->least_slo_ms)
        s->least_slo_ms = slo_ms;
}

void pl_loop_seed(pl_loop_t *l, int64_t model, double slo_ms, double rate_rps, int add)
{
    lsess_t *s = sess(l, model, slo_ms, 1);
    if (slo_ms < s->own_slo_ms)
        s->own_slo_ms = slo_ms;
    s->own_rps = (add ? s->own_rps : 0) + rate_rps;
    s->ewma_rps = s->rate_rps = s->own_rps;
}

static void info_of(const lsess_t *s, pl_loop_session_info_t *out)
{
    *out = (pl_loop_session_info_t){.id = s->id,
                                    .model = s->model,
                                    .bucket_ms = s->bucket_ms,
                                    .plan_slo_ms = s->plan_slo_ms,
                                    .rate_rps = s->rate_rps,
                                    .planned_rps = s->planned_rps};
}

int pl_loop_nsessions(const pl_loop_t *l)
{
    return l->n;
}

int pl_loop_session_at(const pl_loop_t *l, int i, pl_loop_session_info_t *out)
{
    if (i < 0 || i >= l->n)
        return -1;
    info_of(&l->s[i], out);
    return 0;
}

int pl_loop_session_by_id(const pl_loop_t *l, int id, pl_loop_session_info_t *out)
{
    const lsess_t *s = sess_by_id(l, id);
    if (s == NULL)
        return -1;
    info_of(s, out);
    return 0;
}

/* ---- pipelines ----------------------------------------------------------- */

static lpipe_t *pipe_of(const pl_loop_t *l, int64_t key)
{
    for (int i = 0; i < l->npipes; i++)
        if (l->pipes[i].key == key)
            return &l->pipes[i];
    return NULL;
}

static int compose(pl_loop_t *l);

void pl_loop_pipeline_set(pl_loop_t *l, int64_t key, double slo_ms, const pl_loop_stage_t *stages,
                          int nstages)
{
    lpipe_t *p = pipe_of(l, key);
    if (p == NULL) {
        if (l->npipes == l->cappipes) {
            l->cappipes = l->cappipes ? 2 * l->cappipes : 4;
            l->pipes = sq_xrealloc(l->pipes, sizeof(*l->pipes) * (size_t)l->cappipes);
        }
        p = &l->pipes[l->npipes++];
        *p = (lpipe_t){.key = key};
    }
    p->slo_ms = slo_ms;
    p->nstages = nstages;
    p->stages = sq_xrealloc(p->stages, sizeof(*p->stages) * (size_t)(nstages > 0 ? nstages : 1));
    memcpy(p->stages, stages, sizeof(*stages) * (size_t)nstages);
    /* A split that moved a stage's budget to another bucket moves its
     * rate there at once (compose), and its kind re-plans. */
    int moved = compose(l);
    for (int k = 0; k < l->cfg.nkinds; k++)
        if (moved & (1 << k))
            pl_loop_invalidate(l, k, "pipeline split moved");
}

void pl_loop_pipeline_drop(pl_loop_t *l, int64_t key)
{
    lpipe_t *p = pipe_of(l, key);
    if (p == NULL)
        return;
    free(p->stages);
    *p = l->pipes[--l->npipes];
    int k = 0;
    for (int i = 0; i < l->nst; i++)
        if (l->st[i].pipe != key)
            l->st[k++] = l->st[i];
    l->nst = k;
}

static lstage_t *stage_entry(pl_loop_t *l, int64_t key, int stage, double query_slo_ms,
                             int64_t model)
{
    for (int i = 0; i < l->nst; i++) {
        lstage_t *x = &l->st[i];
        if (x->pipe == key && x->stage == stage && x->query_slo_ms == query_slo_ms) {
            x->model = model;
            return x;
        }
    }
    if (l->nst == l->capst) {
        l->capst = l->capst ? 2 * l->capst : 8;
        l->st = sq_xrealloc(l->st, sizeof(*l->st) * (size_t)l->capst);
    }
    l->st[l->nst] =
        (lstage_t){.pipe = key, .stage = stage, .query_slo_ms = query_slo_ms, .model = model};
    return &l->st[l->nst++];
}

void pl_loop_stage_arrivals(pl_loop_t *l, int64_t key, int stage, double query_slo_ms,
                            int64_t model, double n)
{
    stage_entry(l, key, stage, query_slo_ms, model)->arrivals += n;
}

void pl_loop_stage_seed(pl_loop_t *l, int64_t key, int stage, double query_slo_ms, int64_t model,
                        double rate_rps)
{
    lstage_t *x = stage_entry(l, key, stage, query_slo_ms, model);
    x->ewma_rps = x->rate_rps = rate_rps;
}

/* Each session's rate_rps: its own requests' rate plus the rates of the
 * stages whose current budget falls in its bucket (a session is made for
 * a bucket none had yet); and its plan_slo_ms. Stage entries of a pipeline
 * not (or no longer) set, or without traffic (below PL_LOOP_IDLE_RPS and
 * no arrival since the last rate step), go. Returns the kinds (bits)
 * where a stage's rate moved to another bucket since the last call. */
static int compose(pl_loop_t *l)
{
    for (int i = 0; i < l->n; i++) {
        lsess_t *s = &l->s[i];
        s->rate_rps = s->own_rps;
        s->plan_slo_ms = s->own_rps >= PL_LOOP_IDLE_RPS ? s->own_slo_ms : INFINITY;
    }
    int moved = 0;
    /* In order, the entries that go taken out in place: sessions a stage
     * makes get their ids in stage order. */
    int kept = 0;
    for (int i = 0; i < l->nst; i++) {
        lstage_t *x = &l->st[i];
        const lpipe_t *p = pipe_of(l, x->pipe);
        if (p == NULL || x->stage < 0 || x->stage >= p->nstages ||
            (x->rate_rps < PL_LOOP_IDLE_RPS && x->arrivals == 0))
            continue;
        l->st[kept] = *x;
        x = &l->st[kept++];
        double budget = p->stages[x->stage].budget_ms * x->query_slo_ms / p->slo_ms;
        double bucket = bucket_of(l, budget);
        const pl_loop_model_t *m = model_of(l, x->model);
        if (x->bucket_ms != bucket) {
            if (x->bucket_ms != 0 && m != NULL && m->kind >= 0 && m->kind < PL_LOOP_MAX_KINDS)
                moved |= 1 << m->kind;
            x->bucket_ms = bucket;
        }
        lsess_t *s = sess(l, x->model, budget, 1);
        s->rate_rps += x->rate_rps;
        if (budget < s->plan_slo_ms)
            s->plan_slo_ms = budget;
    }
    l->nst = kept;
    for (int i = 0; i < l->n; i++)
        if (!isfinite(l->s[i].plan_slo_ms))
            l->s[i].plan_slo_ms = l->s[i].own_slo_ms;
    return moved;
}

/* ---- epochs ------------------------------------------------------------- */

void pl_loop_invalidate(pl_loop_t *l, int kind, const char *reason)
{
    if (kind < 0 || kind >= l->cfg.nkinds)
        return;
    lkind_t *K = &l->kinds[kind];
    if (!K->dirty)
        snprintf(K->reason, sizeof(K->reason), "%s", reason);
    K->dirty = 1;
}

unsigned pl_loop_dirty(const pl_loop_t *l)
{
    unsigned d = 0;
    for (int k = 0; k < l->cfg.nkinds; k++)
        if (l->kinds[k].dirty)
            d |= 1u << k;
    return d;
}

int64_t pl_loop_rates_at_us(const pl_loop_t *l)
{
    return l->last_rate_us;
}

const char *pl_loop_reason(const pl_loop_t *l, int kind)
{
    return kind >= 0 && kind < l->cfg.nkinds ? l->kinds[kind].reason : "";
}

/* One rate step: the EWMA takes the arrivals of the last interval_ms (then
 * zeroed); returns what the planner uses, max(EWMA, the last interval's).
 * Up fast, down slow: a step up in load is planned for within an interval
 * (the EWMA alone would take about tau to see it and drop meanwhile), a
 * dip is smoothed over tau so that devices are not released early. */
static double rate_step(double *ewma_rps, double *arrivals, double interval_ms, double tau_ms)
{
    *ewma_rps = pl_rate_ewma(*ewma_rps, *arrivals, interval_ms, tau_ms);
    double last = *arrivals * 1000.0 / interval_ms;
    *arrivals = 0;
    return last > *ewma_rps ? last : *ewma_rps;
}

unsigned pl_loop_advance(pl_loop_t *l, int64_t now_us)
{
    unsigned due = pl_loop_dirty(l);
    if ((double)(now_us - l->last_rate_us) < l->cfg.rate_interval_ms * 1000.0)
        return due;
    double interval_ms = (double)(now_us - l->last_rate_us) / 1000.0;
    l->last_rate_us = now_us;
    for (int i = 0; i < l->n; i++) {
        lsess_t *s = &l->s[i];
        s->own_rps = rate_step(&s->ewma_rps, &s->arrivals, interval_ms, l->cfg.epoch.ewma_tau_ms);
        if (isfinite(s->least_slo_ms))
            s->own_slo_ms = s->least_slo_ms;
        s->least_slo_ms = INFINITY;
    }
    for (int i = 0; i < l->nst; i++)
        l->st[i].rate_rps = rate_step(&l->st[i].ewma_rps, &l->st[i].arrivals, interval_ms,
                                      l->cfg.epoch.ewma_tau_ms);
    int moved = compose(l);
    for (int k = 0; k < l->cfg.nkinds; k++)
        if (moved & (1 << k))
            pl_loop_invalidate(l, k, "pipeline split moved");
    due |= pl_loop_dirty(l);
    /* Epochs: periodic, or early when a rate leaves [low, high] of the rate
     * the plan was made for (never sooner than min_interval_ms after the
     * last). Rates below one request a second are noise, not a reason. */
    double *rate = sq_xcalloc((size_t)l->n + 1, sizeof(double));
    double *planned = sq_xcalloc((size_t)l->n + 1, sizeof(double));
    double now_ms = (double)now_us / 1000.0;
    for (int k = 0; k < l->cfg.nkinds; k++) {
        lkind_t *K = &l->kinds[k];
        if (!K->has || K->dirty)
            continue;
        int n = 0;
        for (int i = 0; i < l->n; i++) {
            const pl_loop_model_t *m = model_of(l, l->s[i].model);
            if (m == NULL || m->kind != k)
                continue;
            rate[n] = l->s[i].rate_rps;
            planned[n] = l->s[i].planned_rps;
            if (rate[n] < 1 && planned[n] < 1)
                rate[n] = planned[n];
            n++;
        }
        double last_ms = (double)K->last_epoch_us / 1000.0;
        pl_epoch_reason_t why = pl_epoch_due(&l->cfg.epoch, now_ms, last_ms, rate, planned, n);
        int up = 0;
        for (int i = 0; i < n; i++)
            up |= rate[i] >= 1 && rate[i] > l->cfg.epoch.high * planned[i];
        if (why == PL_EPOCH_NONE && up && now_ms - last_ms >= l->cfg.scale_up_ms)
            why = PL_EPOCH_RATE_CHANGE;
        if (why != PL_EPOCH_NONE) {
            snprintf(K->reason, sizeof(K->reason), "%s",
                     why == PL_EPOCH_PERIODIC ? "periodic" : "rate change");
            due |= 1u << k;
        }
    }
    free(rate);
    free(planned);
    return due;
}

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
            const pl_loop_model_t *pm = model_of(l, par->model);
            if (pm == NULL || pm->profile == NULL)
                continue;
            double disp = pl_loop_stage_dispersion(st->gamma, pm->profile, par->budget_ms * 1000.0,
                                                   l->cfg.k_std);
            double bucket = bucket_of(l, st->budget_ms);
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

static void free_copies(pl_profile_t *profiles, int nprofiles, char **names, int nnames)
{
    for (int i = 0; i < nprofiles; i++)
        pl_profile_dispose(&profiles[i]);
    free(profiles);
    for (int i = 0; i < nnames; i++)
        free(names[i]);
    free(names);
}

static void job_dispose(pl_loop_job_t *j)
{
    free(j->ss);
    free_copies(j->profiles, j->nprofiles, j->names, j->nnames);
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
    compose(l);
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
        if (!plannable(l, s->model, kind))
            continue;
        s->planned_rps = s->rate_rps;
        int mi = sq_map_get(&l->model_ix, (uint64_t)s->model, 0);
        if (s->rate_rps < PL_LOOP_IDLE_RPS && mi >= 0 && busy[mi])
            continue; /* a busy sibling */
        const pl_loop_model_t *m = model_of(l, s->model);
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
    if (K->has)
        pl_plan_dispose(&K->plan);
    pl_plan_index_dispose(&K->index);
    free(K->keys);
    free(K->sessions);
    free_copies(K->profiles, K->nprofiles, K->names, K->nnames);
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
    kind_clear(K);
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

typedef struct {
    const lkind_t *kind;
    const pl_loop_route_env_t *env;
    int64_t model;
} route_ctx_t;

static int planned_worker(void *arg, int index, const pl_device_t *dev)
{
    const route_ctx_t *c = arg;
    (void)index;
    int key = dev->id >= 0 && dev->id < c->kind->nkeys ? c->kind->keys[dev->id] : -1;
    if (key < 0)
        return -1;
    return c->env->usable == NULL || c->env->usable(c->env->ctx, key, c->model) ? key : -1;
}

int pl_loop_routes(const pl_loop_t *l, int64_t model, double slo_ms, const pl_loop_route_env_t *env,
                   pl_route_t *routes, int max)
{
    const lsess_t *s = sess((pl_loop_t *)l, model, slo_ms, 0);
    const pl_loop_model_t *m = model_of(l, model);
    const lkind_t *K =
        s != NULL && m != NULL && m->kind >= 0 && m->kind < l->cfg.nkinds && l->kinds[m->kind].has
            ? &l->kinds[m->kind]
            : NULL;
    route_ctx_t ctx = {.kind = K, .env = env, .model = model};
    /* A session planned without traffic got the minimal batch: its window
     * is the dispatcher's own choice until a plan sees load. */
    pl_route_rules_t rules = {.worker_of = planned_worker,
                              .ctx = &ctx,
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
    const lsess_t *s = sess_by_id(l, session_id);
    if (plan == NULL || s == NULL)
        return al->rate_rps;
    const pl_plan_entry_t *e = pl_plan_index_get(&l->kinds[kind].index, session_id);
    double packed = e != NULL ? e->packed_rps + e->unplaced_rps : 0;
    double input = s->planned_rps * l->cfg.headroom;
    return packed > input ? al->rate_rps * input / packed : al->rate_rps;
}

/* ---- splits ------------------------------------------------------------- */

int pl_loop_split(const pl_loop_split_in_t *in, double *budget_us, pl_loop_split_why_t *why,
                  int *missing, pl_query_result_t *res)
{
    int n = in->nstages;
    *missing = -1;
    if (res != NULL)
        memset(res, 0, sizeof(*res));
    if (n < 1 || in->stages == NULL || !(in->slo_us > 0))
        return SQ_INVAL;
    for (int v = 0; v < n; v++)
        if (in->stages[v].profile == NULL)
            *missing = v;
    /* Of a stage's budget, its batches get what the overhead leaves: a
     * budget the DP finds cheapest on paper but that holds no batch live
     * would drop every query. */
    pl_stage_t *st = sq_xmalloc(sizeof(*st) * (size_t)n);
    for (int v = 0; v < n; v++) {
        st[v] = in->stages[v];
        st[v].overhead_us = in->overhead_us;
    }
    /* The DP minimizes devices at the rate: a rate of 0 makes every split
     * free, so at least one query a second is assumed. */
    double rate = in->rate_qps > 1 ? in->rate_qps : 1;
    int rc = 0;
    *why = in->even        ? PL_LOOP_SPLIT_EVEN_ASKED
           : *missing >= 0 ? PL_LOOP_SPLIT_EVEN_NO_PROFILE
                           : PL_LOOP_SPLIT_DP;
    if (*why == PL_LOOP_SPLIT_DP) {
        pl_query_result_t dp;
        /* 1000 steps over the SLO, or epsilon when that is finer (the DP's
         * series step is quadratic in the steps). */
        double eps = fmin(in->epsilon_us, in->slo_us / 1000.0);
        rc = pl_query_split(&dp, st, n, in->slo_us, rate, eps, in->k_std);
        /* The slack to where the load is (pl_query_share_slack). */
        if (rc == 0)
            rc = pl_query_share_slack(&dp, st, n, in->slo_us, in->k_std);
        if (rc == 0) {
            memcpy(budget_us, dp.budget_us, sizeof(double) * (size_t)n);
            if (res != NULL)
                *res = dp;
            else
                pl_query_result_dispose(&dp);
        } else {
            pl_query_result_dispose(&dp);
            *why = PL_LOOP_SPLIT_EVEN_NO_DP;
        }
    }
    if (*why != PL_LOOP_SPLIT_DP) {
        rc = pl_query_even_budgets(st, n, in->slo_us, budget_us);
        if (rc == 0 && res != NULL)
            rc = *missing >= 0 ? SQ_DEADLINE
                               : pl_query_split_even(res, st, n, in->slo_us, rate, in->k_std);
    }
    free(st);
    return rc;
}
