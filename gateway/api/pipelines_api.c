/* POST /pipelines, GET /pipelines, GET and DELETE /pipelines/{name}.
 *
 * A spec is checked on the HTTP loop (the registry is thread-safe), stored
 * by the DB thread, and published once stored: what GET shows is what the
 * DB holds. A pipeline is addressed like a model over OIP, so it may not
 * take a model's name. */
#include "api_int.h"
#include "gw_catalog.h"
#include "gw_http.h"

#include <sq.h>

#include <stdio.h>
#include <string.h>

/* A spec is small; a bigger body is a mistake. */
#define MAX_SPEC_BYTES (1u << 20)

typedef struct {
    gw_async_t base;
    gw_pipeline_t *p; /* POST: the checked pipeline */
    char name[MDB_NAME_MAX + 1];
} pipe_job_t;

static void job_dispose(gw_async_t *a)
{
    gw_pipeline_unref(((pipe_job_t *)a)->p);
}

static pipe_job_t *job_new(gw_call_t *call)
{
    pipe_job_t *j = (pipe_job_t *)gw_async_new(call, sizeof(pipe_job_t));
    j->base.dispose = job_dispose;
    return j;
}

static void put_job(mdb_t *db, void *arg)
{
    pipe_job_t *j = arg;
    int rc = mdb_pipeline_put(db, j->p->name, j->p->spec, 0);
    if (rc == SQ_EXISTS) {
        gw_async_fail(&j->base, rc, "a pipeline named %s exists (DELETE it first)", j->p->name);
    } else if (rc != 0) {
        gw_async_fail(&j->base, rc, "%s", mdb_errmsg(db));
    } else {
        gw_api_ctx_t *api = j->base.app;
        SQ_INFO("pipeline stored name=%s stages=%d slo_ms=%.1f", j->p->name, j->p->nstages,
                j->p->slo_ms);
        gw_pipeline_ref(j->p);
        gw_pipes_put(api->pipelines, j->p);
        j->base.status = 201;
        j->base.body = gw_pipeline_json(j->p);
    }
    gw_async_done(&j->base);
}

void gw_route_pipelines_post(gw_call_t *call)
{
    gw_api_ctx_t *api = call->app;
    if (!gw_require_admin(call))
        return;
    h2o_req_t *req = call->req;
    if (req->entity.len > MAX_SPEC_BYTES) {
        gw_send_error(req, SQ_TOO_LARGE, "a pipeline spec is at most 1 MiB");
        return;
    }
    json_error_t jerr;
    json_t *body = json_loadb(req->entity.base, req->entity.len, JSON_REJECT_DUPLICATES, &jerr);
    if (body == NULL) {
        char why[256];
        snprintf(why, sizeof(why), "malformed JSON at line %d: %s", jerr.line, jerr.text);
        gw_send_error(req, SQ_BAD_JSON, why);
        return;
    }
    char err[512];
    gw_pipeline_t *p;
    int rc = gw_pipeline_parse(body, api->registry, &p, err, sizeof(err));
    json_decref(body);
    if (rc != 0) {
        gw_send_error(req, rc, err);
        return;
    }
    gw_model_t *clash = gw_registry_find(api->registry, p->name, strlen(p->name), 0);
    if (clash != NULL) {
        gw_model_unref(clash);
        snprintf(err, sizeof(err),
                 "name: a model is called %s (a pipeline is addressed like a model over OIP)",
                 p->name);
        gw_pipeline_unref(p);
        gw_send_error(req, SQ_EXISTS, err);
        return;
    }
    pipe_job_t *j = job_new(call);
    j->p = p;
    gw_db_job(api->db, put_job, j);
}

void gw_route_pipelines_list(gw_call_t *call)
{
    gw_api_ctx_t *api = call->app;
    if (!gw_require_admin(call)) /* as every management read (GET /models) */
        return;
    int n;
    gw_pipeline_t **all = gw_pipes_all(api->pipelines, &n);
    json_t *list = json_array();
    for (int i = 0; i < n; i++) {
        json_array_append_new(list, gw_pipeline_json(all[i]));
        gw_pipeline_unref(all[i]);
    }
    free(all);
    gw_send_json(call->req, 200, json_pack("{s:o}", "pipelines", list));
}

/* The {name} segment, or a 404 sent. */
static int name_arg(gw_call_t *call, char *out)
{
    h2o_iovec_t name = call->args[0];
    if (!gw_model_name_ok(name.base, name.len)) {
        gw_send_not_found(call, name, 0);
        return 0;
    }
    memcpy(out, name.base, name.len);
    out[name.len] = '\0';
    return 1;
}

void gw_route_pipelines_get(gw_call_t *call)
{
    gw_api_ctx_t *api = call->app;
    if (!gw_require_admin(call))
        return;
    char name[MDB_NAME_MAX + 1];
    if (!name_arg(call, name))
        return;
    gw_pipeline_t *p = gw_pipes_get(api->pipelines, name);
    if (p == NULL) {
        gw_send_not_found(call, call->args[0], 0);
        return;
    }
    gw_send_json(call->req, 200, gw_pipeline_json(p));
    gw_pipeline_unref(p);
}

static void delete_job(mdb_t *db, void *arg)
{
    pipe_job_t *j = arg;
    int rc = mdb_pipeline_delete(db, j->name);
    if (rc == SQ_NOT_FOUND) {
        char why[512];
        gw_async_fail(&j->base,
                      gw_not_found_why(j->base.app, "/pipelines/", j->name, 0, why, sizeof(why)),
                      "%s", why);
    } else if (rc != 0) {
        gw_async_fail(&j->base, rc, "%s", mdb_errmsg(db));
    } else {
        gw_api_ctx_t *api = j->base.app;
        SQ_INFO("pipeline deleted name=%s", j->name);
        gw_pipes_remove(api->pipelines, j->name);
        j->base.body = json_pack("{s:s, s:b}", "name", j->name, "deleted", 1);
    }
    gw_async_done(&j->base);
}

void gw_route_pipelines_delete(gw_call_t *call)
{
    gw_api_ctx_t *api = call->app;
    if (!gw_require_admin(call))
        return;
    char name[MDB_NAME_MAX + 1];
    if (!name_arg(call, name))
        return;
    pipe_job_t *j = job_new(call);
    snprintf(j->name, sizeof(j->name), "%s", name);
    gw_db_job(api->db, delete_job, j);
}

int gw_force_param(gw_call_t *call)
{
    char v[8];
    return gw_query_param(call->req, "force", v, sizeof(v)) &&
           (strcmp(v, "true") == 0 || strcmp(v, "1") == 0);
}

int gw_refuse_in_use(gw_async_t *a, int unload, const char *name, int version)
{
    gw_api_ctx_t *api = a->app;
    char names[512], what[MDB_NAME_MAX + 32];
    int n =
        gw_pipes_using(api->pipelines, api->registry, name, version, unload, names, sizeof(names));
    if (n == 0)
        return 0;
    if (version > 0)
        snprintf(what, sizeof(what), "model %s version %d", name, version);
    else
        snprintf(what, sizeof(what), "model %s", name);
    /* Triton unloads a model its ensembles use and they stop answering;
     * squish says so first, and how to go on. */
    if (unload)
        gw_async_fail(a, SQ_IN_USE,
                      "%s is used by pipeline%s %s, which would stop answering; unload %s "
                      "first (POST /v2/repository/models/{pipeline}/unload, with "
                      "{\"parameters\": {\"unload_dependents\": true}} to unload its models "
                      "too), or add ?force=true to unload it anyway",
                      what, n == 1 ? "" : "s", names, n == 1 ? "it" : "them");
    else
        gw_async_fail(a, SQ_IN_USE,
                      "%s is used by pipeline%s %s, which would stop answering; delete %s first "
                      "(DELETE /pipelines/{name}), or add ?force=true to delete it anyway (%s "
                      "then answer 404 naming the stage until the model is back)",
                      what, n == 1 ? "" : "s", names, n == 1 ? "it" : "them",
                      n == 1 ? "it would" : "they would");
    return 1;
}
