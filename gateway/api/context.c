/* The API room's context: made once by server.c (gw_api_new, from
 * gw_api_deps) before the route table is served, reached by every handler
 * and job of the room through the server's api slot (gw_api_of). The
 * bottom of the room: its files call it, it calls none of them. */
#include "api_int.h"

#include <stdlib.h>

gw_api_ctx_t *gw_api_new(const gw_api_deps_t *deps)
{
    gw_api_ctx_t *api = sq_xcalloc(1, sizeof(*api));
    api->cfg = deps->cfg;
    api->srv = deps->srv;
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
    return api;
}

void gw_api_free(gw_api_ctx_t *api)
{
    free(api);
}

/* The one place the room reads the server: its own slot. */
gw_api_ctx_t *gw_api_of(const gw_server_t *srv)
{
    return srv->api;
}
