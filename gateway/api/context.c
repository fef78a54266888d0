/* The API room's context: made once by server.c (gw_api_new, from
 * gw_api_deps) with the room's http app (gw_api_app), whose context it is:
 * the HTTP room hands it to every route (call->app) and job
 * (gw_async_t.app) of the room. The top of the room: none of its files
 * calls it; it takes the route table from routes.c. */
#include "api_int.h"

#include <stdlib.h>

gw_api_ctx_t *gw_api_new(const gw_api_deps_t *deps)
{
    gw_api_ctx_t *api = sq_xcalloc(1, sizeof(*api));
    api->cfg = deps->cfg;
    api->arena = deps->arena;
    api->registry = deps->registry;
    api->pipelines = deps->pipelines;
    api->prep = deps->prep;
    api->metrics = deps->metrics;
    api->trace = deps->trace;
    api->shm = deps->shm;
    api->frontend = deps->frontend;
    api->front = deps->front;
    api->offload = deps->offload;
    api->dispatch = deps->dispatch;
    api->db = deps->db;
    api->stopping = deps->stopping;
    api->db_ready = deps->db_ready;
    api->sched = deps->sched;
    atomic_init(&api->infer_inflight, 0);
    api->app = gw_api_routes(api);
    return api;
}

void gw_api_free(gw_api_ctx_t *api)
{
    free(api);
}

const gw_http_app_t *gw_api_app(const gw_api_ctx_t *api)
{
    return &api->app;
}
