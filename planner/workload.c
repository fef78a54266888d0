/* The workload JSON loader (see workload.h): models and their profiles,
 * prefix groups, sessions and their arrivals, pipelines and their stages,
 * devices and their hosts' links; wl_load_*, wl_workload_dispose,
 * wl_find_model. Calls the planner core only (pl_profile_*); the planner
 * input and the plan JSON are workload_plan.c's. */
#include "workload.h"

#include <sq.h>

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define US_PER_MS 1000.0

/* A JSON path being parsed, "models[3].profile.batch[2]", kept as a stack of
 * segments so that every error can name where it happened. */
typedef struct {
    wl_workload_t *w;
    char path[192];
} parser_t;

__attribute__((format(printf, 2, 3))) static int fail(parser_t *p, const char *fmt, ...)
{
    char msg[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    snprintf(p->w->error, sizeof(p->w->error), "%s: %s", p->path[0] ? p->path : "(root)", msg);
    return SQ_BAD_CONFIG;
}

/* Appends ".key" or "[i]" to the path; returns the old length for pop(). */
static size_t push_key(parser_t *p, const char *key)
{
    size_t len = strlen(p->path);
    snprintf(p->path + len, sizeof(p->path) - len, "%s%s", len ? "." : "", key);
    return len;
}

static size_t push_index(parser_t *p, int i)
{
    size_t len = strlen(p->path);
    snprintf(p->path + len, sizeof(p->path) - len, "[%d]", i);
    return len;
}

static void pop(parser_t *p, size_t len)
{
    p->path[len] = '\0';
}

/* Number fields: absent -> def (or an error when required); present must be
 * a number within [lo, hi] (excl_lo: strictly above lo). */
static int get_number(parser_t *p, json_t *obj, const char *key, int required, double def,
                      double lo, int excl_lo, double hi, double *out)
{
    json_t *v = json_object_get(obj, key);
    size_t mark = push_key(p, key);
    int rc = 0;
    if (!v) {
        if (required)
            rc = fail(p, "required");
        else
            *out = def;
    } else if (!json_is_number(v)) {
        rc = fail(p, "must be a number");
    } else {
        double x = json_number_value(v);
        if (!isfinite(x) || x < lo || (excl_lo && x <= lo) || x > hi)
            rc = fail(p, "must be %s %g%s", excl_lo ? ">" : ">=", lo,
                      hi < INFINITY ? " and within range" : "");
        else
            *out = x;
    }
    pop(p, mark);
    return rc;
}

static int get_int(parser_t *p, json_t *obj, const char *key, int required, long long def,
                   long long lo, long long hi, long long *out)
{
    json_t *v = json_object_get(obj, key);
    size_t mark = push_key(p, key);
    int rc = 0;
    if (!v) {
        if (required)
            rc = fail(p, "required");
        else
            *out = def;
    } else if (!json_is_integer(v)) {
        rc = fail(p, "must be an integer");
    } else if (json_integer_value(v) < lo || json_integer_value(v) > hi) {
        rc = fail(p, "must be between %lld and %lld", lo, hi);
    } else {
        *out = json_integer_value(v);
    }
    pop(p, mark);
    return rc;
}

static int get_string(parser_t *p, json_t *obj, const char *key, const char **out)
{
    json_t *v = json_object_get(obj, key);
    size_t mark = push_key(p, key);
    int rc = 0;
    if (!v)
        rc = fail(p, "required");
    else if (!json_is_string(v) || json_string_length(v) == 0)
        rc = fail(p, "must be a non-empty string");
    else
        *out = json_string_value(v);
    pop(p, mark);
    return rc;
}

/* Optional array field: NULL when absent, error when not an array. */
static int get_array(parser_t *p, json_t *obj, const char *key, int required, json_t **out)
{
    json_t *v = json_object_get(obj, key);
    *out = NULL;
    if (!v) {
        if (!required)
            return 0;
        size_t mark = push_key(p, key);
        int rc = fail(p, "required");
        pop(p, mark);
        return rc;
    }
    if (!json_is_array(v)) {
        size_t mark = push_key(p, key);
        int rc = fail(p, "must be an array");
        pop(p, mark);
        return rc;
    }
    *out = v;
    return 0;
}

static int parse_profile(parser_t *p, json_t *obj, pl_profile_t *prof, int max_batch_given,
                         long long max_batch)
{
    size_t mark = push_key(p, "profile");
    int rc = 0;
    json_t *batch = NULL, *lat = NULL, *std = NULL;
    if (!json_is_object(obj)) {
        rc = fail(p, "must be an object");
        goto out;
    }
    if (json_object_get(obj, "batch") || json_object_get(obj, "latency_ms")) {
        if ((rc = get_array(p, obj, "batch", 1, &batch)) < 0 ||
            (rc = get_array(p, obj, "latency_ms", 1, &lat)) < 0 ||
            (rc = get_array(p, obj, "latency_std_ms", 0, &std)) < 0)
            goto out;
        size_t n = json_array_size(batch);
        if (n == 0 || n > PL_MAX_BATCH) {
            size_t m = push_key(p, "batch");
            rc = fail(p, "must list 1 to %d batch sizes", PL_MAX_BATCH);
            pop(p, m);
            goto out;
        }
        if (json_array_size(lat) != n || (std && json_array_size(std) != n)) {
            rc = fail(p, "batch, latency_ms and latency_std_ms must have the same length");
            goto out;
        }
        pl_profile_row_t *rows = sq_xmalloc(sizeof(*rows) * n);
        for (size_t i = 0; i < n && rc == 0; i++) {
            json_t *b = json_array_get(batch, i), *l = json_array_get(lat, i);
            json_t *s = std ? json_array_get(std, i) : NULL;
            const char *bad = NULL;
            if (!json_is_integer(b) || json_integer_value(b) < 1 ||
                json_integer_value(b) > PL_MAX_BATCH)
                bad = "batch";
            else if (!json_is_number(l) || !(json_number_value(l) > 0))
                bad = "latency_ms";
            else if (s && (!json_is_number(s) || !(json_number_value(s) >= 0)))
                bad = "latency_std_ms";
            if (bad) {
                size_t m = push_key(p, bad);
                size_t m2 = push_index(p, (int)i);
                rc = fail(p, "%s",
                          strcmp(bad, "batch") == 0        ? "must be an integer between 1 and 1024"
                          : strcmp(bad, "latency_ms") == 0 ? "must be a positive number"
                                                           : "must be >= 0");
                pop(p, m2);
                pop(p, m);
                break;
            }
            rows[i] = (pl_profile_row_t){.batch = (int)json_integer_value(b),
                                         .mean_us = json_number_value(l) * US_PER_MS,
                                         .std_us = s ? json_number_value(s) * US_PER_MS : 0};
        }
        if (rc == 0 && pl_profile_init_table(prof, rows, (int)n) < 0) {
            size_t m = push_key(p, "batch");
            rc = fail(p, "lists a batch size twice");
            pop(p, m);
        }
        free(rows);
        if (rc == 0 && max_batch_given && max_batch < prof->max_batch)
            prof->max_batch = (int)max_batch;
    } else {
        double alpha, beta;
        if ((rc = get_number(p, obj, "alpha_ms", 1, 0, 0, 0, INFINITY, &alpha)) < 0 ||
            (rc = get_number(p, obj, "beta_ms", 1, 0, 0, 0, INFINITY, &beta)) < 0)
            goto out;
        if (alpha + beta <= 0) {
            rc = fail(p, "alpha_ms + beta_ms must be positive");
            goto out;
        }
        pl_profile_init_linear(prof, alpha * US_PER_MS, beta * US_PER_MS,
                               max_batch_given ? (int)max_batch : WL_DEFAULT_MAX_BATCH);
    }
out:
    pop(p, mark);
    return rc;
}

/* The common model fields: max_batch, profile, memory_mb, memory_per_item_mb. */
static int parse_model_like(parser_t *p, json_t *obj, pl_profile_t *prof)
{
    long long max_batch = 0;
    double mem = 0, per_item = 0;
    int rc;
    if ((rc = get_int(p, obj, "max_batch", 0, 0, 1, PL_MAX_BATCH, &max_batch)) < 0 ||
        (rc = get_number(p, obj, "memory_mb", 0, 0, 0, 0, INFINITY, &mem)) < 0 ||
        (rc = get_number(p, obj, "memory_per_item_mb", 0, 0, 0, 0, INFINITY, &per_item)) < 0)
        return rc;
    json_t *prof_json = json_object_get(obj, "profile");
    if (!prof_json) {
        size_t m = push_key(p, "profile");
        rc = fail(p, "required");
        pop(p, m);
        return rc;
    }
    if ((rc = parse_profile(p, prof_json, prof, max_batch > 0, max_batch)) < 0)
        return rc;
    prof->memory_bytes = mem * WL_BYTES_PER_MB;
    prof->memory_per_item_bytes = per_item * WL_BYTES_PER_MB;
    return 0;
}

static int parse_models(parser_t *p, json_t *root)
{
    wl_workload_t *w = p->w;
    json_t *arr;
    int rc = get_array(p, root, "models", 1, &arr);
    if (rc < 0)
        return rc;
    w->models = sq_xcalloc(json_array_size(arr) + 1, sizeof(*w->models));
    for (size_t i = 0; i < json_array_size(arr); i++) {
        json_t *m = json_array_get(arr, i);
        size_t mark = push_key(p, "models");
        push_index(p, (int)i);
        const char *name = NULL;
        wl_model_t *model = &w->models[w->nmodels];
        model->prefix_group = -1;
        if (!json_is_object(m))
            rc = fail(p, "must be an object");
        else if ((rc = get_string(p, m, "name", &name)) == 0) {
            if (wl_find_model(w, name) >= 0) {
                size_t k = push_key(p, "name");
                rc = fail(p, "duplicate model name \"%s\"", name);
                pop(p, k);
            } else if ((rc = parse_model_like(p, m, &model->profile)) == 0) {
                double in = 0, out = 0;
                if ((rc = get_number(p, m, "input_bytes", 0, 0, 0, 0, 1e15, &in)) == 0 &&
                    (rc = get_number(p, m, "output_bytes", 0, 0, 0, 0, 1e15, &out)) == 0) {
                    model->item_bytes = in + out;
                    model->name = sq_xstrdup(name);
                    w->nmodels++;
                } else {
                    pl_profile_dispose(&model->profile);
                }
            } else {
                pl_profile_dispose(&model->profile);
            }
        }
        pop(p, mark);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int parse_prefix_groups(parser_t *p, json_t *root)
{
    wl_workload_t *w = p->w;
    json_t *arr;
    int rc = get_array(p, root, "prefix_groups", 0, &arr);
    if (rc < 0 || !arr)
        return rc;
    w->prefix_groups = sq_xcalloc(json_array_size(arr) + 1, sizeof(*w->prefix_groups));
    for (size_t i = 0; i < json_array_size(arr); i++) {
        json_t *g = json_array_get(arr, i), *members;
        size_t mark = push_key(p, "prefix_groups");
        push_index(p, (int)i);
        const char *name = NULL;
        wl_prefix_group_t *grp = &w->prefix_groups[w->nprefix_groups];
        if (!json_is_object(g)) {
            rc = fail(p, "must be an object");
        } else if ((rc = get_string(p, g, "name", &name)) == 0 &&
                   (rc = get_array(p, g, "models", 1, &members)) == 0) {
            if (json_array_size(members) == 0) {
                size_t k = push_key(p, "models");
                rc = fail(p, "must name at least one model");
                pop(p, k);
            } else if ((rc = parse_model_like(p, g, &grp->prefix)) == 0) {
                grp->name = sq_xstrdup(name);
                grp->models = sq_xcalloc(json_array_size(members), sizeof(int));
                w->nprefix_groups++;
                for (size_t k = 0; k < json_array_size(members) && rc == 0; k++) {
                    json_t *mn = json_array_get(members, k);
                    int idx = json_is_string(mn) ? wl_find_model(w, json_string_value(mn)) : -1;
                    size_t km = push_key(p, "models");
                    push_index(p, (int)k);
                    if (idx < 0)
                        rc = fail(p, "must name a model listed in models");
                    else if (w->models[idx].prefix_group >= 0)
                        rc = fail(p, "model \"%s\" is already in a prefix group",
                                  w->models[idx].name);
                    else {
                        w->models[idx].prefix_group = w->nprefix_groups - 1;
                        grp->models[grp->nmodels++] = idx;
                    }
                    pop(p, km);
                }
            } else {
                pl_profile_dispose(&grp->prefix);
            }
        }
        pop(p, mark);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int double_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int parse_arrivals(parser_t *p, json_t *obj, wl_arrivals_t *a, double *rate)
{
    size_t mark = push_key(p, "arrivals");
    int rc = 0;
    json_t *times, *segs;
    a->shape = 1;
    if (!json_is_object(obj)) {
        rc = fail(p, "must be an object");
        goto out;
    }
    if ((rc = get_array(p, obj, "times_ms", 0, &times)) < 0 ||
        (rc = get_array(p, obj, "segments", 0, &segs)) < 0)
        goto out;
    if (times && segs) {
        rc = fail(p, "give either times_ms or segments, not both");
        goto out;
    }
    if (times) {
        a->process = WL_ARRIVALS_TIMES;
        a->ntimes = (int)json_array_size(times);
        a->times_ms = sq_xcalloc((size_t)a->ntimes + 1, sizeof(double));
        for (int i = 0; i < a->ntimes; i++) {
            json_t *t = json_array_get(times, (size_t)i);
            if (!json_is_number(t) || !(json_number_value(t) >= 0) ||
                !isfinite(json_number_value(t))) {
                size_t k = push_key(p, "times_ms");
                push_index(p, i);
                rc = fail(p, "must be a number >= 0");
                pop(p, k);
                goto out;
            }
            a->times_ms[i] = json_number_value(t);
        }
        qsort(a->times_ms, (size_t)a->ntimes, sizeof(double), double_cmp);
        double span_ms = a->ntimes > 1 ? a->times_ms[a->ntimes - 1] - a->times_ms[0] : 0;
        *rate = span_ms > 0 ? (a->ntimes - 1) / span_ms * 1000.0 : 0;
        goto out;
    }
    if (!segs || json_array_size(segs) == 0) {
        rc = fail(p, "needs times_ms or a non-empty segments list");
        goto out;
    }
    json_t *proc = json_object_get(obj, "process");
    const char *pn = proc && json_is_string(proc) ? json_string_value(proc) : NULL;
    if (!proc || (pn && strcmp(pn, "poisson") == 0))
        a->process = WL_ARRIVALS_POISSON;
    else if (pn && strcmp(pn, "uniform") == 0)
        a->process = WL_ARRIVALS_UNIFORM;
    else if (pn && strcmp(pn, "gamma") == 0)
        a->process = WL_ARRIVALS_GAMMA;
    else {
        size_t k = push_key(p, "process");
        rc = fail(p, "must be \"uniform\", \"poisson\" or \"gamma\"");
        pop(p, k);
        goto out;
    }
    if ((rc = get_number(p, obj, "shape", 0, 1, 0, 1, INFINITY, &a->shape)) < 0)
        goto out;
    a->nsegments = (int)json_array_size(segs);
    a->segments = sq_xcalloc((size_t)a->nsegments, sizeof(*a->segments));
    double total_s = 0, total_req = 0;
    for (int i = 0; i < a->nsegments; i++) {
        json_t *s = json_array_get(segs, (size_t)i);
        size_t k = push_key(p, "segments");
        push_index(p, i);
        if (!json_is_object(s))
            rc = fail(p, "must be an object");
        else if ((rc = get_number(p, s, "duration_s", 1, 0, 0, 1, INFINITY,
                                  &a->segments[i].duration_s)) == 0)
            rc = get_number(p, s, "rate_rps", 1, 0, 0, 0, INFINITY, &a->segments[i].rate_rps);
        pop(p, k);
        if (rc < 0)
            goto out;
        total_s += a->segments[i].duration_s;
        total_req += a->segments[i].duration_s * a->segments[i].rate_rps;
    }
    *rate = total_req / total_s;
out:
    pop(p, mark);
    return rc;
}

static int parse_sessions(parser_t *p, json_t *root)
{
    wl_workload_t *w = p->w;
    json_t *arr;
    int rc = get_array(p, root, "sessions", 0, &arr);
    if (rc < 0 || !arr)
        return rc;
    w->sessions = sq_xcalloc(json_array_size(arr) + 1, sizeof(*w->sessions));
    for (size_t i = 0; i < json_array_size(arr); i++) {
        json_t *s = json_array_get(arr, i);
        size_t mark = push_key(p, "sessions");
        push_index(p, (int)i);
        wl_session_t *ss = &w->sessions[w->nsessions++];
        const char *model = NULL;
        if (!json_is_object(s)) {
            rc = fail(p, "must be an object");
        } else if ((rc = get_string(p, s, "model", &model)) == 0) {
            ss->model = wl_find_model(w, model);
            if (ss->model < 0) {
                size_t k = push_key(p, "model");
                rc = fail(p, "unknown model \"%s\"", model);
                pop(p, k);
            }
        }
        if (rc == 0)
            rc = get_number(p, s, "slo_ms", 1, 0, 0, 1, INFINITY, &ss->slo_ms);
        if (rc == 0) {
            json_t *arrivals = json_object_get(s, "arrivals");
            double arr_rate = 0;
            if (arrivals)
                rc = parse_arrivals(p, arrivals, &ss->arrivals, &arr_rate);
            if (rc == 0 && !arrivals && !json_object_get(s, "rate_rps"))
                rc = fail(p, "needs rate_rps or arrivals");
            if (rc == 0)
                rc = get_number(p, s, "rate_rps", 0, arr_rate, 0, 0, INFINITY, &ss->rate_rps);
        }
        pop(p, mark);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int stage_index(const wl_pipeline_t *pl, int upto, const char *id)
{
    for (int i = 0; i < upto; i++)
        if (strcmp(pl->stages[i].id, id) == 0)
            return i;
    return -1;
}

static int parse_stage(parser_t *p, json_t *st, wl_pipeline_t *pl)
{
    wl_workload_t *w = p->w;
    wl_stage_t *stage = &pl->stages[pl->nstages];
    const char *id = NULL, *model = NULL;
    int rc;
    if (!json_is_object(st))
        return fail(p, "must be an object");
    if ((rc = get_string(p, st, "id", &id)) < 0 || (rc = get_string(p, st, "model", &model)) < 0)
        return rc;
    if (stage_index(pl, pl->nstages, id) >= 0) {
        size_t k = push_key(p, "id");
        rc = fail(p, "duplicate stage id \"%s\"", id);
        pop(p, k);
        return rc;
    }
    stage->model = wl_find_model(w, model);
    if (stage->model < 0) {
        size_t k = push_key(p, "model");
        rc = fail(p, "unknown model \"%s\"", model);
        pop(p, k);
        return rc;
    }
    stage->id = sq_xstrdup(id);
    pl->nstages++;
    json_t *after = json_object_get(st, "after"), *gamma = json_object_get(st, "gamma");
    size_t nafter = !after ? 0 : json_is_array(after) ? json_array_size(after) : 1;
    if (after && !json_is_array(after) && !json_is_string(after)) {
        size_t k = push_key(p, "after");
        rc = fail(p, "must be a stage id or a list of stage ids");
        pop(p, k);
        return rc;
    }
    stage->after = sq_xcalloc(nafter + 1, sizeof(int));
    stage->gamma = sq_xcalloc(nafter + 1, sizeof(double));
    for (size_t i = 0; i < nafter; i++) {
        json_t *a = json_is_array(after) ? json_array_get(after, i) : after;
        int idx = json_is_string(a) ? stage_index(pl, pl->nstages - 1, json_string_value(a)) : -1;
        if (idx < 0) {
            size_t k = push_key(p, "after");
            if (json_is_array(after))
                push_index(p, (int)i);
            rc = fail(p, "must name an earlier stage of this pipeline");
            pop(p, k);
            return rc;
        }
        stage->after[stage->nafter++] = idx;
        stage->gamma[i] = 1;
    }
    if (gamma) {
        int ok = 1;
        if (json_is_number(gamma)) {
            for (size_t i = 0; i < nafter; i++)
                stage->gamma[i] = json_number_value(gamma);
            ok = json_number_value(gamma) >= 0;
        } else if (json_is_array(gamma) && json_array_size(gamma) == nafter) {
            for (size_t i = 0; i < nafter; i++) {
                json_t *g = json_array_get(gamma, i);
                ok &= json_is_number(g) && json_number_value(g) >= 0;
                stage->gamma[i] = ok ? json_number_value(g) : 0;
            }
        } else {
            ok = 0;
        }
        if (!ok) {
            size_t k = push_key(p, "gamma");
            rc = fail(p, "must be a number >= 0, or one per entry of after");
            pop(p, k);
            return rc;
        }
    }
    json_t *dist = json_object_get(st, "gamma_dist");
    if (dist) {
        const char *dn = json_is_string(dist) ? json_string_value(dist) : "";
        if (strcmp(dn, "poisson") == 0) {
            stage->gamma_dist = WL_GAMMA_POISSON;
        } else if (strcmp(dn, "fixed") == 0) {
            stage->gamma_dist = WL_GAMMA_FIXED;
        } else {
            size_t k = push_key(p, "gamma_dist");
            rc = fail(p, "must be \"poisson\" or \"fixed\"");
            pop(p, k);
            return rc;
        }
    }
    return 0;
}

/* "rate_rps", or "arrivals" (as a session's) and its mean rate. */
static int pipeline_rate(parser_t *p, json_t *pj, wl_pipeline_t *pl)
{
    json_t *arrivals = json_object_get(pj, "arrivals");
    double arr_rate = 0;
    int rc = 0;
    if (arrivals)
        rc = parse_arrivals(p, arrivals, &pl->arrivals, &arr_rate);
    if (rc == 0 && !arrivals && !json_object_get(pj, "rate_rps"))
        rc = fail(p, "needs rate_rps or arrivals");
    if (rc == 0)
        rc = get_number(p, pj, "rate_rps", 0, arr_rate, 0, 0, INFINITY, &pl->rate_rps);
    if (rc < 0) { /* the pipeline is not counted yet: nothing else frees these */
        free(pl->arrivals.segments);
        free(pl->arrivals.times_ms);
        memset(&pl->arrivals, 0, sizeof(pl->arrivals));
    }
    return rc;
}

static int parse_pipelines(parser_t *p, json_t *root)
{
    wl_workload_t *w = p->w;
    json_t *arr;
    int rc = get_array(p, root, "pipelines", 0, &arr);
    if (rc < 0 || !arr)
        return rc;
    w->pipelines = sq_xcalloc(json_array_size(arr) + 1, sizeof(*w->pipelines));
    for (size_t i = 0; i < json_array_size(arr); i++) {
        json_t *pj = json_array_get(arr, i), *stages = NULL;
        size_t mark = push_key(p, "pipelines");
        push_index(p, (int)i);
        wl_pipeline_t *pl = &w->pipelines[w->npipelines];
        const char *name = NULL;
        if (!json_is_object(pj))
            rc = fail(p, "must be an object");
        else if ((rc = get_string(p, pj, "name", &name)) == 0 &&
                 (rc = get_number(p, pj, "slo_ms", 1, 0, 0, 1, INFINITY, &pl->slo_ms)) == 0 &&
                 (rc = pipeline_rate(p, pj, pl)) == 0 &&
                 (rc = get_array(p, pj, "stages", 1, &stages)) == 0) {
            pl->name = sq_xstrdup(name);
            w->npipelines++;
            if (json_array_size(stages) == 0) {
                size_t k = push_key(p, "stages");
                rc = fail(p, "must list at least one stage");
                pop(p, k);
            }
            pl->stages = sq_xcalloc(json_array_size(stages) + 1, sizeof(*pl->stages));
            for (size_t k = 0; k < json_array_size(stages) && rc == 0; k++) {
                size_t ks = push_key(p, "stages");
                push_index(p, (int)k);
                rc = parse_stage(p, json_array_get(stages, k), pl);
                pop(p, ks);
            }
        }
        pop(p, mark);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* "devices"."hosts": device links in host order. *count: "count", or the
 * hosts' devices added up when count is absent (0); they must agree. */
static int parse_hosts(parser_t *p, json_t *dev, long long *count)
{
    wl_workload_t *w = p->w;
    json_t *arr;
    int rc = get_array(p, dev, "hosts", 0, &arr);
    if (rc < 0 || !arr)
        return rc;
    long long total = 0;
    size_t mark = push_key(p, "hosts");
    for (size_t i = 0; i < json_array_size(arr) && rc == 0; i++) {
        json_t *h = json_array_get(arr, i);
        size_t m = push_index(p, (int)i);
        long long n = 0;
        double rtt = 0, mbps = 0;
        if (!json_is_object(h))
            rc = fail(p, "must be an object");
        else if ((rc = get_int(p, h, "count", 1, 0, 1, 1000000, &n)) == 0 &&
                 (rc = get_number(p, h, "rtt_ms", 0, 0, 0, 0, 1e6, &rtt)) == 0 &&
                 (rc = get_number(p, h, "bandwidth_mbps", 0, 0, 0, 1, 1e12, &mbps)) == 0) {
            if (total + n > 1000000) {
                rc = fail(p, "too many devices");
            } else {
                w->device_links =
                    sq_xrealloc(w->device_links, sizeof(*w->device_links) * (size_t)(total + n));
                /* Mbit/s: 10^6 bits per s = 1/8 byte per µs. */
                for (long long k = 0; k < n; k++)
                    w->device_links[total + k] =
                        (pl_link_t){.rtt_us = rtt * US_PER_MS, .bytes_per_us = mbps / 8};
                total += n;
                w->ndevice_links = (int)total;
            }
        }
        pop(p, m);
    }
    if (rc == 0 && *count > 0 && *count != total)
        rc = fail(p, "the hosts' counts add up to %lld, not devices.count %lld", total, *count);
    pop(p, mark);
    if (rc == 0)
        *count = total;
    return rc;
}

static int load(wl_workload_t *w, json_t *root)
{
    parser_t p = {.w = w};
    int rc;
    if (!json_is_object(root))
        return fail(&p, "a workload must be a JSON object");
    json_t *dev = json_object_get(root, "devices");
    if (dev) {
        long long count = 0;
        size_t k = push_key(&p, "devices");
        if (!json_is_object(dev))
            rc = fail(&p, "must be an object");
        else if ((rc = get_int(&p, dev, "count", 0, 0, 0, 1000000, &count)) == 0 &&
                 (rc = get_number(&p, dev, "memory_mb", 0, 0, 0, 0, INFINITY,
                                  &w->device_memory_mb)) == 0)
            rc = parse_hosts(&p, dev, &count);
        pop(&p, k);
        if (rc < 0)
            return rc;
        w->device_count = (int)count;
    }
    long long seed = 1;
    if ((rc = get_int(&p, root, "seed", 0, 1, 0, 9007199254740991LL, &seed)) < 0)
        return rc;
    w->seed = (unsigned long long)seed;
    w->k_std = 0;
    w->query_epsilon_ms = 1;
    json_t *planner = json_object_get(root, "planner");
    if (planner) {
        size_t k = push_key(&p, "planner");
        if (!json_is_object(planner))
            rc = fail(&p, "must be an object");
        else if ((rc = get_number(&p, planner, "k_std", 0, 0, 0, 0, INFINITY, &w->k_std)) == 0)
            rc = get_number(&p, planner, "query_epsilon_ms", 0, 1, 0, 1, INFINITY,
                            &w->query_epsilon_ms);
        pop(&p, k);
        if (rc < 0)
            return rc;
    }
    if ((rc = parse_models(&p, root)) < 0 || (rc = parse_prefix_groups(&p, root)) < 0 ||
        (rc = parse_sessions(&p, root)) < 0 || (rc = parse_pipelines(&p, root)) < 0)
        return rc;
    return 0;
}

static int load_json(wl_workload_t *w, json_t *root, const json_error_t *jerr)
{
    if (!root) {
        snprintf(w->error, sizeof(w->error), "line %d column %d: %s", jerr->line, jerr->column,
                 jerr->text);
        return SQ_BAD_JSON;
    }
    int rc = load(w, root);
    json_decref(root);
    if (rc < 0) {
        char keep[sizeof(w->error)];
        memcpy(keep, w->error, sizeof(keep));
        wl_workload_dispose(w);
        memcpy(w->error, keep, sizeof(keep));
    }
    return rc;
}

int wl_load_string(wl_workload_t *w, const char *json)
{
    memset(w, 0, sizeof(*w));
    json_error_t jerr;
    json_t *root = json_loads(json, JSON_REJECT_DUPLICATES, &jerr);
    return load_json(w, root, &jerr);
}

int wl_load_file(wl_workload_t *w, const char *path)
{
    memset(w, 0, sizeof(*w));
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(w->error, sizeof(w->error), "%s: cannot open", path);
        return SQ_IO;
    }
    json_error_t jerr;
    json_t *root = json_loadf(f, JSON_REJECT_DUPLICATES, &jerr);
    fclose(f);
    return load_json(w, root, &jerr);
}

void wl_workload_dispose(wl_workload_t *w)
{
    if (!w)
        return;
    for (int i = 0; i < w->nmodels; i++) {
        free(w->models[i].name);
        pl_profile_dispose(&w->models[i].profile);
    }
    free(w->models);
    free(w->device_links);
    for (int i = 0; i < w->nprefix_groups; i++) {
        free(w->prefix_groups[i].name);
        free(w->prefix_groups[i].models);
        pl_profile_dispose(&w->prefix_groups[i].prefix);
    }
    free(w->prefix_groups);
    for (int i = 0; i < w->nsessions; i++) {
        free(w->sessions[i].arrivals.segments);
        free(w->sessions[i].arrivals.times_ms);
    }
    free(w->sessions);
    for (int i = 0; i < w->npipelines; i++) {
        for (int k = 0; k < w->pipelines[i].nstages; k++) {
            free(w->pipelines[i].stages[k].id);
            free(w->pipelines[i].stages[k].after);
            free(w->pipelines[i].stages[k].gamma);
        }
        free(w->pipelines[i].stages);
        free(w->pipelines[i].name);
        free(w->pipelines[i].arrivals.segments);
        free(w->pipelines[i].arrivals.times_ms);
    }
    free(w->pipelines);
    memset(w, 0, sizeof(*w));
}

int wl_find_model(const wl_workload_t *w, const char *name)
{
    for (int i = 0; i < w->nmodels; i++)
        if (strcmp(w->models[i].name, name) == 0)
            return i;
    return -1;
}
