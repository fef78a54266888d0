/* The facts of the HTTP routes for another transport (gw_api.h; grpc/
 * answers from them): each calls the very function its HTTP route does,
 * and a DB fact runs on the DB thread as the route's job does. */
#include "api_int.h"
#include "shm_int.h"
#include "gw_catalog.h"

#include <stdlib.h>
#include <string.h>

int gw_api_server_ready(gw_api_ctx_t *api, char *why, size_t len)
{
    int workers;
    return gw_server_ready_why(api, &workers, why, len);
}

int gw_api_model_config(gw_api_ctx_t *api, const char *name, int version, json_t **out, char *why,
                        size_t len)
{
    char path[MDB_NAME_MAX + 32];
    if (gw_model_config_of(api, name, strlen(name), version, out) == 0)
        return 0;
    snprintf(path, sizeof(path), "/v2/models/%s/config", name);
    return gw_not_found_why(api, path, name, version, why, len);
}

int gw_api_model_stats(gw_api_ctx_t *api, const char *name, int version, json_t **out, char *why,
                       size_t len)
{
    char path[MDB_NAME_MAX + 32];
    if (gw_model_stats_json(api, name, name != NULL ? strlen(name) : 0, version, out) == 0)
        return 0;
    snprintf(path, sizeof(path), "/v2/models/%s/stats", name);
    return gw_not_found_why(api, path, name, version, why, len);
}

int gw_api_shm_status(gw_api_ctx_t *api, const char *name, json_t **out, char *why, size_t len)
{
    int rc = name != NULL ? gw_shm_name_why(name, strlen(name), why, len) : 0;
    return rc != 0 ? rc : gw_shm_status_why(api, name, out, why, len);
}

int gw_api_shm_register(gw_api_ctx_t *api, const char *name, const char *key, uint64_t offset,
                        uint64_t byte_size, char *why, size_t len)
{
    int rc = gw_shm_name_why(name, strlen(name), why, len);
    return rc != 0 ? rc : gw_shm_register(api->shm, name, key, offset, byte_size, why, len);
}

int gw_api_shm_unregister(gw_api_ctx_t *api, const char *name, json_t **out, char *why, size_t len)
{
    int rc = name != NULL ? gw_shm_name_why(name, strlen(name), why, len) : 0;
    if (rc == 0)
        *out = gw_shm_unregister(api->shm, name);
    return rc;
}

int gw_api_cudashm_status(gw_api_ctx_t *api, const char *name, json_t **out, char *why, size_t len)
{
    return gw_cudashm_status_why(api, name, out, why, len);
}

int gw_api_cudashm_register(gw_api_ctx_t *api, const char *name, char *why, size_t len)
{
    (void)api;
    return gw_cudashm_register_why(name, why, len);
}

int gw_api_cudashm_unregister(gw_api_ctx_t *api, const char *name, char *why, size_t len)
{
    (void)api;
    return gw_cudashm_unregister_why(name, why, len);
}

int gw_api_trace_setting(gw_api_ctx_t *api, const char *model, json_t *change, json_t **out,
                         char *why, size_t len)
{
    return gw_trace_setting(api, model, model != NULL ? strlen(model) : 0, change, out, why, len);
}

int gw_api_log_settings(gw_api_ctx_t *api, json_t *change, json_t **out, char *why, size_t len)
{
    (void)api;
    return gw_log_settings(change, out, why, len);
}

json_t *gw_api_repository_index(gw_api_ctx_t *api, int ready_only)
{
    return gw_repository_index_json(api, ready_only);
}

typedef struct {
    gw_api_ctx_t *api;
    char name[MDB_NAME_MAX + 1];
    int version;
    gw_api_fact_fn fact_done;
    void *arg;
} fact_job_t;

/* The pipeline name stands for at version (0 or 1), or NULL. */
static gw_pipeline_t *pipeline_named(gw_api_ctx_t *api, const char *name, int version)
{
    if (version != 0 && version != 1)
        return NULL; /* a pipeline's one version is 1 (as its metadata says) */
    return gw_pipes_get(api->pipelines, name);
}

/* A job for the DB thread, or NULL when it was answered here: a name no
 * model can have, or no model DB in this process (a frontend). */
static fact_job_t *fact_job(gw_api_ctx_t *api, const char *name, int version, gw_api_fact_fn fn,
                            void *arg)
{
    size_t n = strlen(name);
    if (!gw_model_name_ok(name, n)) {
        char why[MDB_NAME_MAX + 160];
        snprintf(why, sizeof(why), "no model or pipeline is named '%.*s'", MDB_NAME_MAX, name);
        fn(arg, SQ_MODEL_NOT_FOUND, NULL, why);
        return NULL;
    }
    if (api->db == NULL) {
        fn(arg, SQ_NOT_READY, NULL, "no model DB in this process (a frontend): ask the dispatcher");
        return NULL;
    }
    fact_job_t *f = sq_xmalloc(sizeof(*f));
    f->api = api;
    memcpy(f->name, name, n + 1);
    f->version = version;
    f->fact_done = fn;
    f->arg = arg;
    return f;
}

static void metadata_job(mdb_t *db, void *arg)
{
    fact_job_t *f = arg;
    char path[MDB_NAME_MAX + 16], why[512] = "";
    json_t *body = NULL;
    snprintf(path, sizeof(path), "/v2/models/%s", f->name);
    int rc = gw_kserve_metadata(db, f->api, f->name, f->version, path, &body, why, sizeof(why));
    f->fact_done(f->arg, rc, body, why);
    free(f);
}

void gw_api_model_metadata(gw_api_ctx_t *api, const char *name, int version, gw_api_fact_fn fn,
                           void *arg)
{
    gw_pipeline_t *p = pipeline_named(api, name, version);
    if (p != NULL) {
        json_t *body = gw_pipeline_oip_metadata(p);
        gw_pipeline_unref(p);
        fn(arg, 0, body, "");
        return;
    }
    fact_job_t *f = fact_job(api, name, version, fn, arg);
    if (f != NULL)
        gw_db_job(api->db, metadata_job, f);
}

static void ready_job(mdb_t *db, void *arg)
{
    fact_job_t *f = arg;
    char path[MDB_NAME_MAX + 16], why[MDB_NAME_MAX + 512] = "";
    snprintf(path, sizeof(path), "/v2/models/%s/ready", f->name);
    int rc = gw_kserve_ready(db, f->api, f->name, f->version, path, why, sizeof(why));
    f->fact_done(f->arg, rc, NULL, why);
    free(f);
}

void gw_api_model_ready(gw_api_ctx_t *api, const char *name, int version, gw_api_fact_fn fn,
                        void *arg)
{
    gw_pipeline_t *p = pipeline_named(api, name, version);
    if (p != NULL) {
        char why[3 * MDB_NAME_MAX + 192] = "";
        int rc = gw_pipeline_ready_why(api, p, why, sizeof(why));
        gw_pipeline_unref(p);
        fn(arg, rc, NULL, why);
        return;
    }
    if (api->frontend) {
        /* As the frontend's HTTP route answers: from its own catalog. */
        char path[MDB_NAME_MAX + 16], why[MDB_NAME_MAX + 512];
        snprintf(path, sizeof(path), "/v2/models/%s/ready", name);
        int rc = gw_frontend_ready_why(api, name, strlen(name), version, path, why, sizeof(why));
        fn(arg, rc, NULL, why);
        return;
    }
    fact_job_t *f = fact_job(api, name, version, fn, arg);
    if (f != NULL)
        gw_db_job(api->db, ready_job, f);
}

int gw_api_forwarded(const gw_api_ctx_t *api, const char *method, const char *path)
{
    return api->frontend && gw_http_forwarded(&api->app, method, path);
}

/* The error a forwarded answer of status is, when its body names none
 * squish knows (not squish's JSON error). */
static int error_of_status(int status)
{
    switch (status) {
    case 400:
        return SQ_BAD_REQUEST;
    case 401:
        return SQ_UNAUTHORIZED;
    case 404:
        return SQ_NOT_FOUND;
    case 405:
        return SQ_METHOD;
    case 409:
        return SQ_EXISTS;
    case 413:
        return SQ_TOO_LARGE;
    case 503:
        return SQ_NOT_READY;
    default:
        return SQ_INTERNAL;
    }
}

typedef struct {
    gw_api_fact_fn fn;
    void *arg;
} forward_t;

/* The dispatcher's answer (gw_proxy_fn), on the forward's thread: a 2xx's
 * JSON, or the error its body names, with its message. */
static void forwarded(void *arg, int err, int status, json_t *body, const char *why)
{
    forward_t f = *(forward_t *)arg;
    free(arg);
    if (err != 0) {
        f.fn(f.arg, err, NULL, why);
    } else if (status >= 200 && status < 300) {
        if (body != NULL)
            f.fn(f.arg, 0, body, "");
        else
            f.fn(f.arg, SQ_PROTOCOL, NULL, "the dispatcher's answer is not JSON");
    } else {
        int e = sq_err_of_name(json_string_value(json_object_get(body, "code")));
        const char *msg = json_string_value(json_object_get(body, "error"));
        f.fn(f.arg, e != 0 ? e : error_of_status(status), NULL,
             msg != NULL ? msg : sq_err_msg(e != 0 ? e : error_of_status(status)));
        json_decref(body);
    }
}

void gw_api_forward(gw_api_ctx_t *api, const char *method, const char *path,
                    const char *authorization, const char *body, gw_api_fact_fn fn, void *arg)
{
    forward_t *f = sq_xmalloc(sizeof(*f));
    f->fn = fn;
    f->arg = arg;
    gw_proxy_json(api->front, method, path, authorization, body, forwarded, f);
}
