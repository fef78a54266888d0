/* Pipeline specs (gw_catalog.h): parsing and checking, their JSON, the
 * measured fan-outs and query rate, the SLO split, and the registry of
 * published pipelines. */
#include "gw_catalog.h"

#include <pl.h>
#include <pl_loop.h>
#include <sq.h>

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* An SLO past this is a typo, not a pipeline. */
#define MAX_SLO_MS 600000.0

static int bad(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int bad(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return SQ_BAD_CONFIG;
}

static int id_ok(const char *s, size_t len)
{
    if (len == 0 || len > GW_PIPE_ID_MAX)
        return 0;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        int alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
        if (!alnum && (i == 0 || (c != '_' && c != '-')))
            return 0;
    }
    return 1;
}

int gw_pipeline_stage(const gw_pipeline_t *p, const char *id)
{
    for (int i = 0; i < p->nstages; i++)
        if (strcmp(p->stages[i].id, id) == 0)
            return i;
    return -1;
}

/* Whether model m can take an image (a JPEG, or a crop): one input of 3
 * channels, height and width known. */
static int takes_images(const gw_model_t *m)
{
    return m->c == 3 && m->h > 0 && m->w > 0;
}

static void pipeline_free(gw_pipeline_t *p)
{
    for (int i = 0; i < GW_PIPE_MAX_STAGES; i++)
        free(p->unreported[i]);
    json_decref(p->spec);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

void gw_pipeline_ref(gw_pipeline_t *p)
{
    atomic_fetch_add(&p->refs, 1);
}

void gw_pipeline_unref(gw_pipeline_t *p)
{
    if (p != NULL && atomic_fetch_sub(&p->refs, 1) == 1)
        pipeline_free(p);
}

/* planner/query.c wants parents before children: stage k of st is
 * p->stages[p->order[k]], its parent numbered likewise (parents[k]). */
static void order_stages(const gw_pipeline_t *p, pl_stage_t *st, int *parents)
{
    int at[GW_PIPE_MAX_STAGES];
    for (int k = 0; k < p->nstages; k++)
        at[p->order[k]] = k;
    for (int k = 0; k < p->nstages; k++) {
        int par = p->stages[p->order[k]].parent;
        parents[k] = par >= 0 ? at[par] : 0;
        st[k] = (pl_stage_t){.nparents = par >= 0 ? 1 : 0, .parents = &parents[k]};
    }
}

/* Budgets (in p->order, µs) become the split: each stage's share and the
 * deadline offsets along its path. */
static void set_budgets(gw_pipeline_t *p, const double *budget_us)
{
    for (int k = 0; k < p->nstages; k++)
        p->budget_ms[p->order[k]] = budget_us[k] / 1000.0;
    for (int k = 0; k < p->nstages; k++) {
        int i = p->order[k];
        int par = p->stages[i].parent;
        p->cum_ms[i] = (par >= 0 ? p->cum_ms[par] : 0) + p->budget_ms[i];
    }
}

/* The even split of planner/query.c (pl_query_even_budgets): each stage
 * the SLO over the most stages on a path through it, so every path fits. */
static void even_split(gw_pipeline_t *p)
{
    pl_stage_t st[GW_PIPE_MAX_STAGES];
    int parents[GW_PIPE_MAX_STAGES];
    double budget_us[GW_PIPE_MAX_STAGES];
    order_stages(p, st, parents);
    if (pl_query_even_budgets(st, p->nstages, p->slo_ms * 1000.0, budget_us) == 0)
        set_budgets(p, budget_us);
    p->split_dp = 0;
}

static int parse_stage(const json_t *s, int i, gw_pipeline_t *p, char *err, size_t errlen)
{
    gw_stage_spec_t *st = &p->stages[i];
    st->parent = -1;
    st->top_k = GW_PIPE_DEFAULT_TOP_K;
    if (!json_is_object(s))
        return bad(err, errlen, "stages[%d]: expected an object", i);
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)s, key, v)
    {
        if (strcmp(key, "id") == 0) {
            if (!json_is_string(v) || !id_ok(json_string_value(v), json_string_length(v)))
                return bad(err, errlen,
                           "stages[%d].id: 1 to %d characters of [A-Za-z0-9_-], starting with a "
                           "letter or digit",
                           i, GW_PIPE_ID_MAX);
            snprintf(st->id, sizeof(st->id), "%s", json_string_value(v));
        } else if (strcmp(key, "model") == 0) {
            if (!json_is_string(v) ||
                !gw_model_name_ok(json_string_value(v), json_string_length(v)))
                return bad(err, errlen, "stages[%d].model: expected a model name", i);
            snprintf(st->model, sizeof(st->model), "%s", json_string_value(v));
        } else if (strcmp(key, "version") == 0) {
            if (!json_is_integer(v) || json_integer_value(v) < 1 ||
                json_integer_value(v) > 1000000000)
                return bad(err, errlen, "stages[%d].version: expected an integer >= 1", i);
            st->version = (int)json_integer_value(v);
        } else if (strcmp(key, "top_k") == 0) {
            if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 1000)
                return bad(err, errlen, "stages[%d].top_k: expected an integer in 1..1000", i);
            st->top_k = (int)json_integer_value(v);
        } else if (strcmp(key, "crops_of") == 0) {
            /* "stage" is read here, the rest by gw_crops_spec_parse. */
            json_t *from = json_object_get(v, "stage");
            if (!json_is_object(v) || !json_is_string(from))
                return bad(err, errlen,
                           "stages[%d].crops_of.stage: required: the id of the stage "
                           "whose detections this stage crops",
                           i);
            json_t *rest = json_deep_copy(v);
            json_object_del(rest, "stage");
            char path[64];
            snprintf(path, sizeof(path), "stages[%d].crops_of", i);
            int rc = gw_crops_spec_parse(rest, path, &st->crops, err, errlen);
            json_decref(rest);
            if (rc != 0)
                return rc;
            st->parent = -2; /* resolved once every id is known */
        } else {
            return bad(err, errlen, "stages[%d].%s: unknown field", i, key);
        }
    }
    if (st->id[0] == '\0')
        return bad(err, errlen, "stages[%d].id: required", i);
    if (st->model[0] == '\0')
        return bad(err, errlen, "stages[%d].model: required", i);
    return 0;
}

/* Resolves crops_of ids, refuses cycles, and orders the stages. */
static int link_stages(const json_t *stages, gw_pipeline_t *p, char *err, size_t errlen)
{
    for (int i = 0; i < p->nstages; i++) {
        for (int j = 0; j < i; j++)
            if (strcmp(p->stages[i].id, p->stages[j].id) == 0)
                return bad(err, errlen, "stages[%d].id: '%s' is also stages[%d]'s", i,
                           p->stages[i].id, j);
    }
    for (int i = 0; i < p->nstages; i++) {
        gw_stage_spec_t *st = &p->stages[i];
        if (st->parent != -2)
            continue;
        const char *from = json_string_value(json_object_get(
            json_object_get(json_array_get(stages, (size_t)i), "crops_of"), "stage"));
        st->parent = gw_pipeline_stage(p, from);
        if (st->parent < 0)
            return bad(err, errlen, "stages[%d].crops_of.stage: no stage '%s'", i, from);
    }
    /* A stage's path to the image must end: else it is on a cycle. */
    for (int i = 0; i < p->nstages; i++) {
        int v = i, steps = 0;
        while (v >= 0 && steps <= p->nstages) {
            v = p->stages[v].parent;
            steps++;
        }
        if (v >= 0)
            return bad(err, errlen,
                       "stages[%d].crops_of.stage: a cycle (stage '%s' crops, through its "
                       "parents, its own detections)",
                       i, p->stages[i].id);
        p->stages[i].depth = steps;
    }
    int n = 0;
    for (int d = 1; d <= p->nstages; d++)
        for (int i = 0; i < p->nstages; i++)
            if (p->stages[i].depth == d)
                p->order[n++] = i;
    for (int i = 0; i < p->nstages; i++) {
        int par = p->stages[i].parent;
        if (par >= 0)
            p->stages[par].children[p->stages[par].nchildren++] = i;
    }
    return 0;
}

/* Checks each stage's model against the registry as it is now. */
static int check_models(gw_pipeline_t *p, gw_registry_t *reg, char *err, size_t errlen)
{
    for (int i = 0; i < p->nstages; i++) {
        gw_stage_spec_t *st = &p->stages[i];
        gw_model_t *m = gw_registry_find(reg, st->model, strlen(st->model), st->version);
        if (m == NULL) {
            if (st->version > 0)
                return bad(err, errlen, "stages[%d].model: no model '%s' version %d", i, st->model,
                           st->version);
            return bad(err, errlen, "stages[%d].model: no model '%s'", i, st->model);
        }
        int rc = 0;
        if (!takes_images(m))
            rc = bad(err, errlen,
                     "stages[%d].model: '%s' does not take images (its input is %dx%dx%d; a "
                     "stage needs 3 channels of a known height and width)",
                     i, st->model, m->c, m->h, m->w);
        gw_model_unref(m);
        if (rc != 0)
            return rc;
    }
    for (int i = 0; i < p->nstages; i++) {
        gw_stage_spec_t *st = &p->stages[i];
        if (st->parent < 0)
            continue;
        const gw_stage_spec_t *par = &p->stages[st->parent];
        gw_model_t *m = gw_registry_find(reg, par->model, strlen(par->model), par->version);
        char path[64];
        snprintf(path, sizeof(path), "stages[%d].crops_of", i);
        int rc = m != NULL ? gw_crops_spec_bind(&st->crops, m->name, m->outputs, m->noutputs, path,
                                                err, errlen)
                           : SQ_BAD_CONFIG;
        gw_model_unref(m);
        if (rc != 0)
            return rc;
    }
    return 0;
}

static json_t *normalized_spec(const gw_pipeline_t *p)
{
    json_t *stages = json_array();
    for (int i = 0; i < p->nstages; i++) {
        const gw_stage_spec_t *st = &p->stages[i];
        json_t *s =
            json_pack("{s:s, s:s, s:i}", "id", st->id, "model", st->model, "top_k", st->top_k);
        if (st->version > 0)
            json_object_set_new(s, "version", json_integer(st->version));
        if (st->parent >= 0) {
            json_t *c = gw_crops_spec_json(&st->crops);
            json_object_set_new(c, "stage", json_string(p->stages[st->parent].id));
            json_object_set_new(s, "crops_of", c);
        }
        json_array_append_new(stages, s);
    }
    return json_pack("{s:s, s:f, s:s, s:o}", "name", p->name, "slo_ms", p->slo_ms, "split",
                     p->split_even_asked ? "even" : "dp", "stages", stages);
}

int gw_pipeline_parse(const json_t *body, gw_registry_t *reg, gw_pipeline_t **out, char *err,
                      size_t errlen)
{
    *out = NULL;
    if (!json_is_object(body)) {
        snprintf(err, errlen, "expected a JSON object");
        return SQ_BAD_JSON;
    }
    gw_pipeline_t *p = sq_xcalloc(1, sizeof(*p));
    atomic_init(&p->refs, 1);
    atomic_init(&p->unloaded, 0);
    pthread_mutex_init(&p->mu, NULL);
    int rc = 0;
    const char *key;
    json_t *v, *stages = NULL;
    json_object_foreach((json_t *)body, key, v)
    {
        if (strcmp(key, "name") == 0) {
            if (!json_is_string(v) ||
                !gw_model_name_ok(json_string_value(v), json_string_length(v))) {
                rc = bad(err, errlen,
                         "name: 1 to %d characters of [A-Za-z0-9_.-], starting with "
                         "a letter or digit",
                         MDB_NAME_MAX);
                goto out;
            }
            snprintf(p->name, sizeof(p->name), "%s", json_string_value(v));
        } else if (strcmp(key, "slo_ms") == 0) {
            if (!json_is_number(v) || !(json_number_value(v) > 0) ||
                json_number_value(v) > MAX_SLO_MS) {
                rc = bad(err, errlen, "slo_ms: expected a number in (0, %.0f]", MAX_SLO_MS);
                goto out;
            }
            p->slo_ms = json_number_value(v);
        } else if (strcmp(key, "split") == 0) {
            const char *m = json_string_value(v);
            if (m == NULL || (strcmp(m, "dp") != 0 && strcmp(m, "even") != 0)) {
                rc = bad(err, errlen, "split: expected \"dp\" (the default) or \"even\"");
                goto out;
            }
            p->split_even_asked = strcmp(m, "even") == 0;
        } else if (strcmp(key, "stages") == 0) {
            if (!json_is_array(v) || json_array_size(v) < 1 ||
                json_array_size(v) > GW_PIPE_MAX_STAGES) {
                rc = bad(err, errlen, "stages: expected an array of 1 to %d stages",
                         GW_PIPE_MAX_STAGES);
                goto out;
            }
            stages = v;
        } else {
            rc = bad(err, errlen, "%s: unknown field", key);
            goto out;
        }
    }
    if (p->name[0] == '\0') {
        rc = bad(err, errlen, "name: required");
        goto out;
    }
    if (p->slo_ms <= 0) {
        rc = bad(err, errlen, "slo_ms: required");
        goto out;
    }
    if (stages == NULL) {
        rc = bad(err, errlen, "stages: required");
        goto out;
    }
    p->nstages = (int)json_array_size(stages);
    for (int i = 0; i < p->nstages && rc == 0; i++)
        rc = parse_stage(json_array_get(stages, (size_t)i), i, p, err, errlen);
    if (rc == 0)
        rc = link_stages(stages, p, err, errlen);
    if (rc == 0 && reg != NULL)
        rc = check_models(p, reg, err, errlen);
    if (rc != 0)
        goto out;
    p->spec = normalized_spec(p);
    for (int i = 0; i < p->nstages; i++)
        p->gamma[i] = p->split_gamma[i] = 1.0;
    even_split(p);
    snprintf(p->split_why, sizeof(p->split_why), "no split measured yet");
    *out = p;
    return 0;
out:
    pipeline_free(p);
    return rc;
}

/* ---- measuring and splitting ------------------------------------------- */

void gw_pipeline_arrival(gw_pipeline_t *p)
{
    pthread_mutex_lock(&p->mu);
    p->arrivals++;
    p->unreported_arrivals += p->reporting;
    pthread_mutex_unlock(&p->mu);
}

void gw_pipeline_reporting(gw_pipeline_t *p)
{
    pthread_mutex_lock(&p->mu);
    p->reporting = 1;
    pthread_mutex_unlock(&p->mu);
}

json_t *gw_pipeline_report(gw_pipeline_t *p)
{
    pthread_mutex_lock(&p->mu);
    json_t *fan = json_object();
    int any = p->unreported_arrivals > 0;
    for (int i = 0; i < p->nstages; i++) {
        if (p->nunreported[i] == 0)
            continue;
        json_t *a = json_array();
        for (int k = 0; k < p->nunreported[i]; k++)
            json_array_append_new(a, json_integer(p->unreported[i][k]));
        char key[12];
        snprintf(key, sizeof(key), "%d", i);
        json_object_set_new(fan, key, a);
        p->nunreported[i] = 0;
        any = 1;
    }
    json_t *r = NULL;
    if (any)
        r = json_pack("{s:I, s:o}", "arrivals", (json_int_t)p->unreported_arrivals, "fanout", fan);
    else
        json_decref(fan);
    p->unreported_arrivals = 0;
    pthread_mutex_unlock(&p->mu);
    return r;
}

int gw_pipeline_take_report(gw_pipeline_t *p, const json_t *report)
{
    json_t *arr = json_object_get(report, "arrivals");
    json_t *fan = json_object_get(report, "fanout");
    if (!json_is_integer(arr) || json_integer_value(arr) < 0 || !json_is_object(fan))
        return -1;
    pthread_mutex_lock(&p->mu);
    p->arrivals += json_integer_value(arr);
    pthread_mutex_unlock(&p->mu);
    const char *key;
    json_t *list;
    json_object_foreach(fan, key, list)
    {
        char *end;
        long stage = strtol(key, &end, 10);
        if (*end != '\0' || stage < 0 || stage >= p->nstages || !json_is_array(list) ||
            json_array_size(list) > GW_PIPE_REPORT_MAX)
            return -1;
        size_t i;
        json_t *n;
        json_array_foreach(list, i, n)
        {
            if (!json_is_integer(n) || json_integer_value(n) < 0 ||
                json_integer_value(n) > (1 << 20))
                return -1;
            gw_pipeline_fanout(p, (int)stage, (int)json_integer_value(n));
        }
    }
    return 0;
}

void gw_pipeline_set_split(gw_pipeline_t *p, const double *budget_ms, const double *cum_ms)
{
    pthread_mutex_lock(&p->mu);
    for (int i = 0; i < p->nstages; i++) {
        p->budget_ms[i] = budget_ms[i];
        p->cum_ms[i] = cum_ms[i];
    }
    pthread_mutex_unlock(&p->mu);
}

void gw_pipeline_outcome(gw_pipeline_t *p, gw_query_outcome_t o, int64_t took_us)
{
    pthread_mutex_lock(&p->mu);
    p->outcomes[o]++;
    p->outcome_us[o] += took_us > 0 ? took_us : 0;
    if (o == GW_Q_OK)
        p->last_ok_ms = (int64_t)(sq_wall_s() * 1e3);
    pthread_mutex_unlock(&p->mu);
}

/* Whether gamma (measured) differs from the gamma a split was made for by
 * more than noise: by GW_PIPE_RESPLIT_FRACTION of it, taken against at
 * least a quarter of an item per parent (a smaller move changes little),
 * and by GW_PIPE_GAMMA_NOISE_SE standard errors of the EWMA (a weight-a
 * EWMA of counts of variance v has variance v a / (2 - a)). Before, a
 * Poisson gamma of 0.1 measured over about 20 frames wandered by half its
 * value, and each wander split the SLO again, moving the stages' sessions
 * to other SLO buckets (live: 3-6% of queries dropped at 90% of the
 * simulator's goodput); in a simulation of 20000 frames of gamma 0.1 or
 * 0.5, this makes 0 to 5 splits. */
static int gamma_moved(const gw_pipeline_t *p, int stage, double was, int by_fraction)
{
    double g = p->gamma[stage];
    double a = GW_PIPE_GAMMA_ALPHA;
    double se = sqrt(p->gamma_var[stage] * a / (2 - a));
    double d = fabs(g - was);
    return d > GW_PIPE_GAMMA_NOISE_SE * se &&
           (!by_fraction || d > GW_PIPE_RESPLIT_FRACTION * fmax(was, 0.25));
}

void gw_pipeline_fanout(gw_pipeline_t *p, int stage, int n)
{
    pthread_mutex_lock(&p->mu);
    double a = p->gamma_n[stage] < 1.0 / GW_PIPE_GAMMA_ALPHA ? 1.0 / (double)(p->gamma_n[stage] + 1)
                                                             : GW_PIPE_GAMMA_ALPHA;
    double dev = n - p->gamma[stage];
    p->gamma[stage] = p->gamma_n[stage] == 0 ? n : (1 - a) * p->gamma[stage] + a * n;
    p->gamma_var[stage] =
        p->gamma_n[stage] == 0 ? 0 : (1 - a) * p->gamma_var[stage] + a * dev * dev;
    p->gamma_n[stage]++;
    if (gamma_moved(p, stage, p->split_gamma[stage], 1))
        p->resplit_wanted = 1;
    if (p->reporting && p->nunreported[stage] < GW_PIPE_REPORT_MAX) {
        if (p->unreported[stage] == NULL)
            p->unreported[stage] = sq_xmalloc(sizeof(int) * GW_PIPE_REPORT_MAX);
        p->unreported[stage][p->nunreported[stage]++] = n;
    }
    pthread_mutex_unlock(&p->mu);
}

int gw_pipeline_resplit_due(gw_pipeline_t *p, int64_t now_us, int64_t interval_us)
{
    pthread_mutex_lock(&p->mu);
    int due = p->resplit_wanted || p->rate_at_us == 0 || now_us - p->rate_at_us >= interval_us;
    pthread_mutex_unlock(&p->mu);
    return due;
}

int gw_pipeline_clumps(gw_pipeline_t *p, gw_stage_clumps_t *out)
{
    int n = 0;
    pthread_mutex_lock(&p->mu);
    for (int i = 0; i < p->nstages; i++) {
        const gw_stage_spec_t *st = &p->stages[i];
        if (st->parent < 0)
            continue;
        const gw_stage_spec_t *par = &p->stages[st->parent];
        gw_stage_clumps_t *c = &out[n++];
        snprintf(c->model, sizeof(c->model), "%s", st->model);
        snprintf(c->parent_model, sizeof(c->parent_model), "%s", par->model);
        c->version = st->version;
        c->parent_version = par->version;
        c->budget_ms = p->budget_ms[i];
        c->parent_budget_ms = p->budget_ms[st->parent];
        c->gamma = p->gamma[i];
    }
    pthread_mutex_unlock(&p->mu);
    return n;
}

void gw_pipeline_deadlines(gw_pipeline_t *p, double *cum_ms)
{
    pthread_mutex_lock(&p->mu);
    memcpy(cum_ms, p->cum_ms, sizeof(double) * (size_t)p->nstages);
    pthread_mutex_unlock(&p->mu);
}

double gw_pipeline_budget_ms(gw_pipeline_t *p, int stage)
{
    pthread_mutex_lock(&p->mu);
    double b = stage >= 0 && stage < p->nstages ? p->budget_ms[stage] : 0;
    pthread_mutex_unlock(&p->mu);
    return b;
}

int gw_pipeline_resplit(gw_pipeline_t *p, const pl_profile_t *const *profile, double k_std,
                        double epsilon_ms, double overhead_ms, int64_t now_us)
{
    pthread_mutex_lock(&p->mu);
    /* The query rate since the last split (an EWMA over splits). */
    if (p->rate_at_us > 0 && now_us > p->rate_at_us) {
        double r =
            (double)(p->arrivals - p->rate_arrivals) * 1e6 / (double)(now_us - p->rate_at_us);
        p->rate_qps = p->rate_qps > 0 ? 0.5 * p->rate_qps + 0.5 * r : r;
    }
    p->rate_arrivals = p->arrivals;
    p->rate_at_us = now_us;
    p->resplit_wanted = 0;
    int n = p->nstages;
    double before[GW_PIPE_MAX_STAGES];
    memcpy(before, p->budget_ms, sizeof(before));
    pl_stage_t st[GW_PIPE_MAX_STAGES];
    int parents[GW_PIPE_MAX_STAGES];
    double gam[GW_PIPE_MAX_STAGES];
    order_stages(p, st, parents);
    int all_profiles = 1;
    for (int i = 0; i < n; i++)
        all_profiles &= profile[i] != NULL;
    for (int k = 0; k < n; k++) {
        int i = p->order[k];
        /* The gamma the last split was made for, unless the measure moved
         * past its noise (gamma_moved; a move too small to ask for a split
         * of its own is taken when one is made): a split does not follow
         * noise, at an epoch or on the periodic resplit either. */
        if (!p->split_even_asked && all_profiles && gamma_moved(p, i, p->split_gamma[i], 0))
            p->split_gamma[i] = p->gamma[i];
        gam[k] = p->split_gamma[i];
        st[k].profile = profile[i];
        st[k].gamma = &gam[k];
    }
    /* The split's rules (DP with the overhead, rate floor and step, slack
     * shared, even fallback) are the planning loop's, squish-sim's too. */
    pl_loop_split_in_t in = {.stages = st,
                             .nstages = n,
                             .slo_us = p->slo_ms * 1000.0,
                             .rate_qps = p->rate_qps,
                             .epsilon_us = epsilon_ms * 1000.0,
                             .overhead_us = overhead_ms * 1000.0,
                             .k_std = k_std,
                             .even = p->split_even_asked};
    double budget_us[GW_PIPE_MAX_STAGES];
    pl_loop_split_why_t why;
    int missing;
    int rc = pl_loop_split(&in, budget_us, &why, &missing, NULL);
    if (rc == 0)
        set_budgets(p, budget_us);
    p->split_dp = rc == 0 && why == PL_LOOP_SPLIT_DP;
    if (why == PL_LOOP_SPLIT_EVEN_ASKED)
        snprintf(p->split_why, sizeof(p->split_why), "the spec asks for the even split");
    else if (why == PL_LOOP_SPLIT_EVEN_NO_PROFILE)
        snprintf(p->split_why, sizeof(p->split_why), "stage %s: its model has no profile yet",
                 p->stages[p->order[missing]].id);
    else if (why == PL_LOOP_SPLIT_EVEN_NO_DP || rc != 0)
        snprintf(p->split_why, sizeof(p->split_why), "the DP found no split");
    else
        p->split_why[0] = '\0';

    p->split_rate_qps = p->rate_qps;
    int changed = memcmp(before, p->budget_ms, sizeof(before)) != 0;
    pthread_mutex_unlock(&p->mu);
    return changed;
}

json_t *gw_pipeline_json(gw_pipeline_t *p)
{
    json_t *budgets = json_object(), *deadlines = json_object(), *gammas = json_object(),
           *rates = json_object();
    pthread_mutex_lock(&p->mu);
    for (int k = 0; k < p->nstages; k++) {
        int i = p->order[k];
        const gw_stage_spec_t *st = &p->stages[i];
        json_object_set_new(budgets, st->id, json_real(p->budget_ms[i]));
        json_object_set_new(deadlines, st->id, json_real(p->cum_ms[i]));
        /* The stage's rate: the query rate times the fan-outs on its path. */
        double r = p->rate_qps;
        for (int v = i; v >= 0; v = p->stages[v].parent)
            if (p->stages[v].parent >= 0)
                r *= p->gamma[v];
        json_object_set_new(rates, st->id, json_real(r));
        if (st->parent >= 0)
            json_object_set_new(gammas, st->id,
                                json_pack("{s:f, s:I, s:f}", "measured", p->gamma[i], "frames",
                                          (json_int_t)p->gamma_n[i], "split_for",
                                          p->split_gamma[i]));
    }
    json_t *split =
        json_pack("{s:s, s:o, s:o, s:o, s:o, s:f}", "method", p->split_dp ? "dp" : "even",
                  "budgets_ms", budgets, "deadlines_ms", deadlines, "gamma", gammas, "rates_rps",
                  rates, "rate_qps", p->split_rate_qps);
    if (!p->split_dp)
        json_object_set_new(split, "why", json_string(p->split_why));
    json_t *q = json_pack("{s:I, s:I, s:I, s:I}", "arrived", (json_int_t)p->arrivals, "ok",
                          (json_int_t)p->outcomes[GW_Q_OK], "dropped",
                          (json_int_t)p->outcomes[GW_Q_DROPPED], "failed",
                          (json_int_t)p->outcomes[GW_Q_FAILED]);
    pthread_mutex_unlock(&p->mu);
    return json_pack("{s:s, s:f, s:O, s:o, s:o}", "name", p->name, "slo_ms", p->slo_ms, "spec",
                     p->spec, "split", split, "queries", q);
}

/* ---- registry ------------------------------------------------------------ */

struct gw_pipes {
    pthread_mutex_t mu;
    int n, cap;
    gw_pipeline_t **v;
};

gw_pipes_t *gw_pipes_new(void)
{
    gw_pipes_t *ps = sq_xcalloc(1, sizeof(*ps));
    pthread_mutex_init(&ps->mu, NULL);
    return ps;
}

void gw_pipes_free(gw_pipes_t *ps)
{
    if (ps == NULL)
        return;
    for (int i = 0; i < ps->n; i++)
        gw_pipeline_unref(ps->v[i]);
    free(ps->v);
    pthread_mutex_destroy(&ps->mu);
    free(ps);
}

void gw_pipes_put(gw_pipes_t *ps, gw_pipeline_t *p)
{
    pthread_mutex_lock(&ps->mu);
    for (int i = 0; i < ps->n; i++)
        if (strcmp(ps->v[i]->name, p->name) == 0) {
            gw_pipeline_unref(ps->v[i]);
            ps->v[i] = p;
            pthread_mutex_unlock(&ps->mu);
            return;
        }
    if (ps->n == ps->cap) {
        ps->cap = ps->cap ? 2 * ps->cap : 8;
        ps->v = sq_xrealloc(ps->v, sizeof(*ps->v) * (size_t)ps->cap);
    }
    int at = ps->n++;
    while (at > 0 && strcmp(ps->v[at - 1]->name, p->name) > 0) {
        ps->v[at] = ps->v[at - 1];
        at--;
    }
    ps->v[at] = p;
    pthread_mutex_unlock(&ps->mu);
}

gw_pipeline_t *gw_pipes_get(gw_pipes_t *ps, const char *name)
{
    gw_pipeline_t *p = NULL;
    pthread_mutex_lock(&ps->mu);
    for (int i = 0; i < ps->n && p == NULL; i++)
        if (strcmp(ps->v[i]->name, name) == 0) {
            p = ps->v[i];
            gw_pipeline_ref(p);
        }
    pthread_mutex_unlock(&ps->mu);
    return p;
}

int gw_pipes_remove(gw_pipes_t *ps, const char *name)
{
    int removed = 0;
    pthread_mutex_lock(&ps->mu);
    for (int i = 0; i < ps->n; i++)
        if (strcmp(ps->v[i]->name, name) == 0) {
            gw_pipeline_unref(ps->v[i]);
            memmove(&ps->v[i], &ps->v[i + 1], sizeof(*ps->v) * (size_t)(ps->n - i - 1));
            ps->n--;
            removed = 1;
            break;
        }
    pthread_mutex_unlock(&ps->mu);
    return removed;
}

gw_pipeline_t **gw_pipes_all(gw_pipes_t *ps, int *n)
{
    pthread_mutex_lock(&ps->mu);
    gw_pipeline_t **all = sq_xcalloc((size_t)ps->n + 1, sizeof(*all));
    for (int i = 0; i < ps->n; i++) {
        all[i] = ps->v[i];
        gw_pipeline_ref(all[i]);
    }
    *n = ps->n;
    pthread_mutex_unlock(&ps->mu);
    return all;
}

int gw_pipes_using(gw_pipes_t *ps, gw_registry_t *reg, const char *name, int version,
                   int loaded_only, char *names, size_t len)
{
    int n = 0, count = 0;
    size_t used = 0;
    if (len > 0)
        names[0] = '\0';
    gw_pipeline_t **all = gw_pipes_all(ps, &n);
    for (int i = 0; i < n; i++) {
        gw_pipeline_t *p = all[i];
        int uses = 0;
        for (int k = 0; k < p->nstages && !uses; k++) {
            const gw_stage_spec_t *st = &p->stages[k];
            if (strcmp(st->model, name) != 0)
                continue;
            /* The version the stage runs now: a stage without one takes
             * the name's default, so deleting another version leaves it. */
            gw_model_t *m = gw_registry_find(reg, st->model, strlen(st->model), st->version);
            uses = m != NULL && (version == 0 || m->version == version);
            gw_model_unref(m);
        }
        if (uses && !(loaded_only && atomic_load(&p->unloaded))) {
            if (used < len)
                used +=
                    (size_t)snprintf(names + used, len - used, "%s%s", count ? ", " : "", p->name);
            count++;
        }
        gw_pipeline_unref(p);
    }
    free(all);
    return count;
}
