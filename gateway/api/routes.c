/* The HTTP API's routes: the table gw_http_start serves (the app the room's
 * context holds, gw_api_app, which server.c passes), and the handlers of
 * the server's own state (metadata, health, plan). The other handlers live
 * with their area (models_api.c, infer_v1.c, infer_v2.c, query_route.c,
 * metrics_api.c); http.c calls them only through this table. */
#include "api_int.h"
#include "gw_dispatch.h"
#include "gw_http.h"
#include "gw_catalog.h"

#include <jansson.h>
#include <stdatomic.h>
#include <string.h>

/* The Triton protocol extensions squish implements, by Triton's names:
 * binary tensors in the body (oip.c), class labels instead of raw tensors
 * (the classification parameter, oip_response.c), per-model statistics
 * (/v2/models[/{m}[/versions/{v}]]/stats, metrics_api.c), the logging
 * and trace settings (logging_api.c), the model repository with model
 * control (repository_api.c), model configuration (read-only), and
 * tensors in system shared memory (shm_api.c; not CUDA shared memory). */
json_t *gw_api_server_metadata(void)
{
    return json_pack("{s:s, s:s, s:[s, s, s, s, s, s, s, s, s]}", "name", "squish", "version",
                     SQUISH_VERSION, "extensions", "binary_tensor_data", "classification",
                     "statistics", "logging", "trace", "model_repository",
                     "model_repository(unload_dependents)", "model_configuration",
                     "system_shared_memory");
}

static void route_server_metadata(gw_call_t *call)
{
    gw_send_json(call->req, 200, gw_api_server_metadata());
}

static void route_live(gw_call_t *call)
{
    gw_send_json(call->req, 200, json_pack("{s:b}", "live", 1));
}

int gw_server_ready_why(gw_api_ctx_t *api, int *workers, char *why, size_t len)
{
    *workers = 0;
    if (atomic_load(api->stopping)) {
        snprintf(why, len, "squishd is shutting down");
        return SQ_SHUTTING_DOWN;
    }
    if (api->frontend && !gw_sched_ready(gw_api_sched(api), why, len))
        return SQ_NOT_READY; /* a frontend: its dispatcher's word */
    /* A frontend has no model DB of its own: its dispatcher's word
     * (above) covers it. */
    if (!api->frontend && !atomic_load(api->db_ready)) {
        snprintf(why, len, "the model database is not open");
        return SQ_NOT_READY;
    }
    gw_fleet_t fleet;
    gw_sched_fleet(gw_api_sched(api), &fleet);
    if (fleet.workers_up == 0) {
        snprintf(why, len, "no worker is connected");
        return SQ_NOT_READY;
    }
    /* Able to serve every ready model now, not merely up. */
    if (!gw_sched_ready(gw_api_sched(api), why, len))
        return SQ_NOT_READY;
    *workers = fleet.workers_up;
    return 0;
}

static void route_ready(gw_call_t *call)
{
    char why[256];
    int up;
    int rc = gw_server_ready_why(call->app, &up, why, sizeof(why));
    if (rc != 0)
        gw_send_error(call->req, rc, why);
    else
        gw_send_json(call->req, 200, json_pack("{s:b, s:i}", "ready", 1, "workers", up));
}

static void route_plan(gw_call_t *call)
{
    gw_api_ctx_t *api = call->app;
    gw_send_json(call->req, 200, gw_dispatch_plan_json(api->dispatch));
}

/* A pipeline is addressed like a model over OIP (its name can be no
 * model's): these send a pipeline's name to its handler, any other to the
 * model's. */
static gw_pipeline_t *pipeline_of(gw_call_t *call)
{
    gw_api_ctx_t *api = call->app;
    char name[MDB_NAME_MAX + 1];
    h2o_iovec_t a = call->args[0];
    if (call->nargs > 1 && gw_parse_version(call->args[1]) != 1)
        return NULL; /* a pipeline's one version is 1 (as its metadata says) */
    if (a.len == 0 || a.len > MDB_NAME_MAX)
        return NULL;
    memcpy(name, a.base, a.len);
    name[a.len] = '\0';
    return gw_pipes_get(api->pipelines, name);
}

static void route_infer_v2(gw_call_t *call)
{
    gw_pipeline_t *p = pipeline_of(call);
    if (p == NULL) {
        gw_route_infer_v2(call);
        return;
    }
    gw_pipeline_unref(p);
    gw_route_pipeline_infer_v2(call);
}

static void route_kserve_model(gw_call_t *call)
{
    gw_pipeline_t *p = pipeline_of(call);
    if (p == NULL) {
        gw_route_kserve_model(call);
        return;
    }
    gw_send_json(call->req, 200, gw_pipeline_oip_metadata(p));
    gw_pipeline_unref(p);
}

/* A pipeline is ready when every stage's model is; when one is not, the
 * reason names the stage and what became of its model (deleted, unloaded,
 * failed, not loaded), as a model's readiness does. */
int gw_pipeline_ready_why(gw_api_ctx_t *api, gw_pipeline_t *p, char *why, size_t len)
{
    why[0] = '\0';
    if (atomic_load(&p->unloaded))
        snprintf(why, len,
                 "pipeline %s is unloaded; POST /v2/repository/models/%s/load serves it again",
                 p->name, p->name);
    for (int i = 0; i < p->nstages && !why[0]; i++) {
        const gw_stage_spec_t *st = &p->stages[i];
        gw_model_t *m = gw_registry_find(api->registry, st->model, strlen(st->model), st->version);
        char version[24] = "";
        if (st->version > 0)
            snprintf(version, sizeof(version), " version %d", st->version);
        if (m == NULL)
            snprintf(why, len,
                     "stage %s: model %s%s is gone (deleted); upload it again (POST /models) or "
                     "store the pipeline without it (POST /pipelines)",
                     st->id, st->model, version);
        else if (strcmp(m->status, "unloaded") == 0)
            snprintf(why, len,
                     "stage %s: model %s is unloaded; POST /v2/repository/models/%s/load serves "
                     "it again",
                     st->id, st->model, st->model);
        else if (strcmp(m->status, "failed") == 0)
            snprintf(why, len, "stage %s: model %s%s failed and cannot be served", st->id,
                     st->model, version);
        else if (strcmp(m->status, "ready") != 0 || !gw_sched_held(gw_api_sched(api), m->key))
            snprintf(why, len, "stage %s: model %s is not ready", st->id, st->model);
        gw_model_unref(m);
    }
    return why[0] ? SQ_NOT_READY : 0;
}

/* A pipeline's readiness: 400 when not ready, as a model's (as Triton). */
static void route_kserve_model_ready(gw_call_t *call)
{
    gw_pipeline_t *p = pipeline_of(call);
    if (p == NULL) {
        gw_route_kserve_model_ready(call);
        return;
    }
    char why[3 * MDB_NAME_MAX + 192];
    if (gw_pipeline_ready_why(call->app, p, why, sizeof(why)) != 0)
        gw_send_json(call->req, 400,
                     json_pack("{s:s, s:b, s:s, s:s}", "name", p->name, "ready", 0, "error", why,
                               "code", sq_err_name(SQ_NOT_READY)));
    else
        gw_send_json(call->req, 200, json_pack("{s:s, s:b}", "name", p->name, "ready", 1));
    gw_pipeline_unref(p);
}

static const gw_route_t routes[] = {
    {"GET", "/v2", "server_metadata", route_server_metadata, GW_ON_FRONTEND},
    {"GET", "/v2/health/live", "health_live", route_live, GW_ON_FRONTEND},
    {"GET", "/v2/health/ready", "health_ready", route_ready, GW_ON_FRONTEND},
    {"POST", "/models", "models_upload", gw_route_models_post, GW_TO_DISPATCHER},
    {"GET", "/models", "models_list", gw_route_models_list, GW_TO_DISPATCHER},
    {"GET", "/models/*", "models_get", gw_route_models_get, GW_TO_DISPATCHER},
    {"DELETE", "/models/*", "models_delete", gw_route_models_delete, GW_TO_DISPATCHER},
    {"DELETE", "/models/*/versions/*", "models_delete_version", gw_route_models_delete_version,
     GW_TO_DISPATCHER},
    {"POST", "/pipelines", "pipelines_post", gw_route_pipelines_post, GW_TO_DISPATCHER},
    {"GET", "/pipelines", "pipelines_list", gw_route_pipelines_list, GW_TO_DISPATCHER},
    {"GET", "/pipelines/*", "pipelines_get", gw_route_pipelines_get, GW_TO_DISPATCHER},
    {"DELETE", "/pipelines/*", "pipelines_delete", gw_route_pipelines_delete, GW_TO_DISPATCHER},
    {"POST", "/v1/pipelines/*/infer", "pipeline_infer", gw_route_pipeline_infer, GW_ON_FRONTEND},
    {"GET", "/metrics", "metrics", gw_route_metrics, GW_TO_DISPATCHER},
    {"GET", "/v2/logging", "logging", gw_route_logging_get, GW_ON_FRONTEND},
    {"POST", "/v2/logging", "logging", gw_route_logging_post, GW_ON_FRONTEND},
    {"GET", "/v2/trace/setting", "trace_setting", gw_route_trace_get, GW_ON_FRONTEND},
    {"POST", "/v2/trace/setting", "trace_setting", gw_route_trace_post, GW_ON_FRONTEND},
    {"GET", "/v2/models/*/trace/setting", "trace_setting", gw_route_trace_get, GW_ON_FRONTEND},
    {"POST", "/v2/models/*/trace/setting", "trace_setting", gw_route_trace_post, GW_ON_FRONTEND},
    {"GET", "/v2/systemsharedmemory/status", "shm_status", gw_route_shm_status, GW_ON_FRONTEND},
    {"GET", "/v2/systemsharedmemory/region/*/status", "shm_status", gw_route_shm_status,
     GW_ON_FRONTEND},
    {"POST", "/v2/systemsharedmemory/region/*/register", "shm_register", gw_route_shm_register,
     GW_ON_FRONTEND},
    {"POST", "/v2/systemsharedmemory/unregister", "shm_unregister", gw_route_shm_unregister,
     GW_ON_FRONTEND},
    {"POST", "/v2/systemsharedmemory/region/*/unregister", "shm_unregister",
     gw_route_shm_unregister, GW_ON_FRONTEND},
    {"GET", "/v2/cudasharedmemory/status", "cudashm_status", gw_route_cudashm_status,
     GW_ON_FRONTEND},
    {"GET", "/v2/cudasharedmemory/region/*/status", "cudashm_status", gw_route_cudashm_status,
     GW_ON_FRONTEND},
    {"POST", "/v2/cudasharedmemory/region/*/register", "cudashm_register",
     gw_route_cudashm_register, GW_ON_FRONTEND},
    {"POST", "/v2/cudasharedmemory/unregister", "cudashm_unregister", gw_route_cudashm_unregister,
     GW_ON_FRONTEND},
    {"POST", "/v2/cudasharedmemory/region/*/unregister", "cudashm_unregister",
     gw_route_cudashm_unregister, GW_ON_FRONTEND},
    {"GET", "/v2/models/stats", "model_stats", gw_route_model_stats,
     GW_TO_DISPATCHER}, /* before kserve_model */
    {"GET", "/v2/models/*/stats", "model_stats", gw_route_model_stats, GW_TO_DISPATCHER},
    {"GET", "/v2/models/*/versions/*/stats", "model_stats", gw_route_model_stats, GW_TO_DISPATCHER},
    {"GET", "/v2/models/*", "kserve_model", route_kserve_model, GW_TO_DISPATCHER},
    {"GET", "/v2/models/*/versions/*", "kserve_model", route_kserve_model, GW_TO_DISPATCHER},
    {"GET", "/v2/models/*/ready", "kserve_model_ready", route_kserve_model_ready, GW_ON_FRONTEND},
    {"GET", "/v2/models/*/config", "model_config", gw_route_model_config, GW_TO_DISPATCHER},
    {"GET", "/v2/models/*/versions/*/config", "model_config", gw_route_model_config,
     GW_TO_DISPATCHER},
    {"POST", "/v2/repository/index", "repository_index", gw_route_repository_index,
     GW_TO_DISPATCHER},
    {"GET", "/v2/repository/index", "repository_index", gw_route_repository_index_get,
     GW_TO_DISPATCHER},
    {"POST", "/v2/repository/models/*/load", "repository_load", gw_route_repository_load,
     GW_TO_DISPATCHER},
    {"POST", "/v2/repository/models/*/unload", "repository_unload", gw_route_repository_unload,
     GW_TO_DISPATCHER},
    {"GET", "/v2/models/*/versions/*/ready", "kserve_model_ready", route_kserve_model_ready,
     GW_ON_FRONTEND},
    {"GET", "/v1/plan", "plan", route_plan, GW_TO_DISPATCHER},
    {"POST", "/v1/models/*/infer", "infer_v1", gw_route_infer_v1, GW_ON_FRONTEND},
    {"POST", "/v1/models/*/versions/*/infer", "infer_v1", gw_route_infer_v1, GW_ON_FRONTEND},
    {"POST", "/v2/models/*/infer", "infer_v2", route_infer_v2, GW_ON_FRONTEND},
    {"POST", "/v2/models/*/versions/*/infer", "infer_v2", route_infer_v2, GW_ON_FRONTEND},
};

gw_http_app_t gw_api_routes(gw_api_ctx_t *api)
{
    return (gw_http_app_t){.routes = routes,
                           .nroutes = sizeof(routes) / sizeof(routes[0]),
                           .ctx = api,
                           .done = gw_metrics_http_done,
                           .forward = gw_proxy_to_dispatcher};
}
