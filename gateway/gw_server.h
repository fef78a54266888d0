/* squishd's server record: one per process, created by gw_main (server.c),
 * with the handles of its threads and subsystems. Every room may see the
 * record (it names each room's object by an opaque pointer), so this header
 * includes no room's header. */
#ifndef GW_SERVER_H
#define GW_SERVER_H

#include "gw.h"

#include <mdb.h>

#include <pthread.h>
#include <stdatomic.h>

typedef struct gw_http gw_http_t;
typedef struct gw_workers gw_workers_t;
typedef struct gw_db gw_db_t;
typedef struct gw_dispatch gw_dispatch_t;
typedef struct gw_registry gw_registry_t;
typedef struct gw_pipes gw_pipes_t;
typedef struct gw_prep_pool gw_prep_pool_t;
typedef struct gw_leader gw_leader_t;
typedef struct gw_metrics gw_metrics_t;
typedef struct gw_transport gw_transport_t;
typedef struct gw_trace gw_trace_t;
typedef struct gw_shm_table gw_shm_table_t;
typedef struct gw_front gw_front_t;
typedef struct gw_sched gw_sched_t;
typedef struct gw_api_ctx gw_api_ctx_t;
typedef struct gw_grpc gw_grpc_t;

/* The server: one per process, created by gw_main. Fields written by one
 * thread and read by others are atomics; everything else is set before the
 * threads start and then read-only. */
typedef struct gw_server {
    const gw_config_t *cfg;
    char socket_path[108];
    char token_path[256];
    char admin_token[65]; /* hex */
    double start_wall_s;

    atomic_int db_ready;  /* the model DB is open */
    atomic_int stopping;  /* SIGTERM seen: no new work */
    atomic_int leading;   /* leads (always, with sqlite); else a standby */
    atomic_int http_port; /* the port HTTP listens on, once bound */

    sq_shm_arena_t *arena;
    gw_registry_t *registry;
    gw_pipes_t *pipelines; /* published pipelines (gw_catalog.h) */
    gw_prep_pool_t *prep;
    gw_db_t *db;
    gw_workers_t *workers;
    gw_transport_t *transport; /* the workers' link (workers.c); dispatch thread */
    gw_dispatch_t *dispatch;   /* lives on the dispatch thread */
    sq_loop_t *dispatch_loop;
    gw_http_t *http;
    gw_leader_t *leader; /* leadership (leader.c): the lock's connection with PostgreSQL */
    struct gw_offload_ctx *offload;
    gw_metrics_t *metrics; /* thread-safe; created first, freed last */
    gw_trace_t *trace;     /* request traces (api/trace.c); thread-safe */
    gw_shm_table_t *shm;   /* registered shared-memory regions (api/shm_regions.c); thread-safe */
    gw_api_ctx_t *api;     /* the HTTP API's context (api/; gw_api_new), which holds its app */
    gw_front_t *front; /* --role frontend: the link to the dispatcher (front/); NULL otherwise */
    gw_grpc_t *grpc;   /* --grpc-listen: KServe v2 over gRPC (grpc/); NULL otherwise */
    /* Who schedules this process's items (sched/gw_sched.h): the
     * dispatcher, or a frontend's link to the cluster's; picked once by
     * gw_main; NULL while neither runs (coming up, a standby). */
    gw_sched_t *_Atomic sched;
} gw_server_t;

#endif
