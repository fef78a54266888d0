/* 404s that teach (issue 24): what was not found (a model, a version of
 * one, a pipeline), and, where one exists, what would work: the versions a
 * model has, the route that serves a pipeline addressed as a model (or the
 * other way round), or the stored name closest to a typo. */
#include "api_int.h"
#include "gw_catalog.h"
#include "gw_http.h"

#include <sq.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Edit distance of a and b, at most cap + 1 (names are short). */
static int distance(const char *a, const char *b, int cap)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > MDB_NAME_MAX || lb > MDB_NAME_MAX)
        return cap + 1;
    int row[MDB_NAME_MAX + 2];
    for (size_t j = 0; j <= lb; j++)
        row[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        int diag = row[0], best = cap + 1;
        row[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int up = row[j];
            int sub = diag + (a[i - 1] != b[j - 1]);
            int del = row[j] + 1, ins = row[j - 1] + 1;
            row[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
            diag = up;
            if (row[j] < best)
                best = row[j];
        }
        if (best > cap)
            return cap + 1;
    }
    return row[lb];
}

typedef struct {
    const char *name;
    int version;
    char versions[160]; /* name's versions, "1, 2" */
    int nversions;
    int has_version;
    char closest[MDB_NAME_MAX + 1];
    int closest_d;
} look_t;

/* A typo is at most this many edits (and fewer than half the name). */
#define GW_TYPO_EDITS 2

static void consider(look_t *x, const char *other)
{
    int cap = GW_TYPO_EDITS;
    int half = (int)strlen(x->name) / 2;
    if (half < cap)
        cap = half > 0 ? half : 1;
    int d = distance(x->name, other, cap);
    if (d <= cap && d > 0 && (x->closest[0] == '\0' || d < x->closest_d)) {
        snprintf(x->closest, sizeof(x->closest), "%s", other);
        x->closest_d = d;
    }
}

static void look_model(gw_model_t *m, void *arg)
{
    look_t *x = arg;
    if (strcmp(m->name, x->name) != 0) {
        consider(x, m->name);
        return;
    }
    if (m->version == x->version)
        x->has_version = 1;
    size_t used = strlen(x->versions);
    if (used + 16 < sizeof(x->versions))
        snprintf(x->versions + used, sizeof(x->versions) - used, "%s%d", x->nversions ? ", " : "",
                 m->version);
    x->nversions++;
}

static int starts(const char *path, const char *prefix)
{
    return strncmp(path, prefix, strlen(prefix)) == 0;
}

int gw_not_found_why(const gw_api_ctx_t *api, const char *path, const char *name, int version,
                     char *out, size_t len)
{
    look_t x = {.name = name, .version = version};
    gw_registry_foreach(api->registry, look_model, &x);
    gw_pipeline_t *p = gw_pipes_get(api->pipelines, name);
    int pipeline = p != NULL;
    gw_pipeline_unref(p);
    int nps = 0;
    gw_pipeline_t **all = gw_pipes_all(api->pipelines, &nps);
    for (int i = 0; i < nps; i++) {
        if (!pipeline)
            consider(&x, all[i]->name);
        gw_pipeline_unref(all[i]);
    }
    free(all);
    int model = x.nversions > 0;
    if (pipeline && (starts(path, "/v1/models/") || starts(path, "/models/"))) {
        snprintf(out, len, "%s is a pipeline, not a model: use %s /%s/%s%s", name,
                 starts(path, "/v1/") ? "POST" : "GET or DELETE",
                 starts(path, "/v1/") ? "v1/pipelines" : "pipelines", name,
                 starts(path, "/v1/") ? "/infer" : "");
        return SQ_MODEL_NOT_FOUND;
    }
    if (pipeline && version > 1) {
        snprintf(out, len, "%s is a pipeline, whose one version is 1: use /v2/models/%s", name,
                 name);
        return SQ_MODEL_NOT_FOUND;
    }
    if (model && (starts(path, "/v1/pipelines/") || starts(path, "/pipelines/"))) {
        snprintf(out, len, "%s is a model, not a pipeline: use %s /%s/%s%s", name,
                 starts(path, "/v1/") ? "POST" : "GET or DELETE",
                 starts(path, "/v1/") ? "v1/models" : "models", name,
                 starts(path, "/v1/") ? "/infer" : "");
        return SQ_NOT_FOUND;
    }
    if (model && version > 0 && !x.has_version) {
        snprintf(out, len, "model %s has no version %d; its version%s %s %s", name, version,
                 x.nversions > 1 ? "s" : "", x.nversions > 1 ? "are" : "is", x.versions);
        return SQ_MODEL_NOT_FOUND;
    }
    int pipeline_route = starts(path, "/v1/pipelines/") || starts(path, "/pipelines/");
    const char *what = pipeline_route ? "pipeline" : "model or pipeline";
    if (x.closest[0])
        snprintf(out, len, "no %s named %s; did you mean %s? GET /v2/repository/index lists them",
                 what, name, x.closest);
    else
        snprintf(out, len, "no %s named %s; GET /v2/repository/index lists them", what, name);
    return pipeline_route ? SQ_NOT_FOUND : SQ_MODEL_NOT_FOUND;
}

int gw_body_object(gw_call_t *call, const char *what, json_t **out)
{
    const uint8_t *body;
    size_t len;
    uint8_t *owned = NULL;
    if (gw_request_body(call->req, &body, &len, &owned) != 0) {
        gw_send_error(call->req, SQ_OVERLOAD, "no memory for the request body");
        return -1;
    }
    json_error_t jerr;
    json_t *j = len == 0 ? json_object() : json_loadb((const char *)body, len, 0, &jerr);
    free(owned);
    if (j == NULL || !json_is_object(j)) {
        char why[256];
        if (j == NULL)
            snprintf(why, sizeof(why), "invalid JSON at byte %d: %s", jerr.position, jerr.text);
        else
            snprintf(why, sizeof(why), "the body must be a JSON object of %s", what);
        json_decref(j);
        gw_send_error(call->req, SQ_BAD_JSON, why);
        return -1;
    }
    *out = j;
    return 0;
}

void gw_call_path(const gw_call_t *call, char *out, size_t len)
{
    h2o_iovec_t p = call->req->path_normalized;
    size_t n = p.len < len - 1 ? p.len : len - 1;
    memcpy(out, p.base, n);
    out[n] = '\0';
}

void gw_send_bad_version(gw_call_t *call, h2o_iovec_t v)
{
    char why[160];
    snprintf(why, sizeof(why), "'%.*s' is not a version: a version is a whole number from 1",
             (int)(v.len < 32 ? v.len : 32), v.base);
    gw_send_error(call->req, SQ_MODEL_NOT_FOUND, why);
}

int gw_name_not_found_why(const gw_api_ctx_t *api, const char *path, const char *name,
                          size_t name_len, int version, char *out, size_t len)
{
    char cname[MDB_NAME_MAX + 1];
    if (name_len > MDB_NAME_MAX || !gw_model_name_ok(name, name_len)) {
        snprintf(out, len,
                 "not a model or pipeline name: names are 1 to 64 of A-Z a-z 0-9 _ . - "
                 "and start with a letter or digit");
        return SQ_MODEL_NOT_FOUND;
    }
    memcpy(cname, name, name_len);
    cname[name_len] = '\0';
    return gw_not_found_why(api, path, cname, version, out, len);
}

void gw_send_not_found(gw_call_t *call, h2o_iovec_t name, int version)
{
    char path[256], why[512];
    gw_call_path(call, path, sizeof(path));
    int err =
        gw_name_not_found_why(call->app, path, name.base, name.len, version, why, sizeof(why));
    gw_send_error(call->req, err, why);
}
