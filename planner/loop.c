/* The planning loop (pl_loop.h): its models and sessions, pipelines'
 * stages, rates and epochs, for squishd and squish-sim alike; the jobs and
 * the plans they adopt are loop_plan.c's, the splits loop_split.c's. */
#include "loop_int.h"

#include <sq.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

void pl__loop_free_copies(pl_profile_t *profiles, int nprofiles, char **names, int nnames)
{
    for (int i = 0; i < nprofiles; i++)
        pl_profile_dispose(&profiles[i]);
    free(profiles);
    for (int i = 0; i < nnames; i++)
        free(names[i]);
    free(names);
}

void pl__loop_kind_clear(lkind_t *K)
{
    if (K->has)
        pl_plan_dispose(&K->plan);
    pl_plan_index_dispose(&K->index);
    free(K->keys);
    free(K->sessions);
    pl__loop_free_copies(K->profiles, K->nprofiles, K->names, K->nnames);
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
        pl__loop_kind_clear(&l->kinds[k]);
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

const pl_loop_model_t *pl__loop_model_of(const pl_loop_t *l, int64_t key)
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
int pl__loop_plannable(const pl_loop_t *l, int64_t key, int kind)
{
    const pl_loop_model_t *m = pl__loop_model_of(l, key);
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

double pl__loop_bucket_of(const pl_loop_t *l, double slo_ms)
{
    return l->cfg.slo_bucket_ms != NULL ? l->cfg.slo_bucket_ms(slo_ms) : slo_ms;
}

/* The session of model at slo_ms's bucket, made (for slo_ms) when create. */
lsess_t *pl__loop_sess(pl_loop_t *l, int64_t model, double slo_ms, int create)
{
    double bucket_ms = pl__loop_bucket_of(l, slo_ms);
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
const lsess_t *pl__loop_sess_by_id(const pl_loop_t *l, int id)
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
    lsess_t *s = pl__loop_sess(l, model, slo_ms, create);
    if (s != NULL && create && slo_ms < s->own_slo_ms)
        s->own_slo_ms = slo_ms;
    return s != NULL ? s->id : -1;
}

void pl_loop_arrivals(pl_loop_t *l, int64_t model, double slo_ms, double n)
{
    lsess_t *s = pl__loop_sess(l, model, slo_ms, 1);
    s->arrivals += n;
    if (n > 0 && slo_ms < s->least_slo_ms)
        s->least_slo_ms = slo_ms;
}

void pl_loop_seed(pl_loop_t *l, int64_t model, double slo_ms, double rate_rps, int add)
{
    lsess_t *s = pl__loop_sess(l, model, slo_ms, 1);
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
    const lsess_t *s = pl__loop_sess_by_id(l, id);
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
    int moved = pl__loop_compose(l);
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
int pl__loop_compose(pl_loop_t *l)
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
        double bucket = pl__loop_bucket_of(l, budget);
        const pl_loop_model_t *m = pl__loop_model_of(l, x->model);
        if (x->bucket_ms != bucket) {
            if (x->bucket_ms != 0 && m != NULL && m->kind >= 0 && m->kind < PL_LOOP_MAX_KINDS)
                moved |= 1 << m->kind;
            x->bucket_ms = bucket;
        }
        lsess_t *s = pl__loop_sess(l, x->model, budget, 1);
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
    int moved = pl__loop_compose(l);
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
            const pl_loop_model_t *m = pl__loop_model_of(l, l->s[i].model);
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
