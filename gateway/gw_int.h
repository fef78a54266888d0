/* gateway internals shared by squishd's source files. */
#ifndef GW_INT_H
#define GW_INT_H

#include "gw_transport.h"
#include "gw.h"
#include "gw_metrics.h"

#include <mdb.h>

#include <pthread.h>
#include <stdatomic.h>

typedef struct gw_http gw_http_t;
typedef struct gw_workers gw_workers_t;
typedef struct gw_db gw_db_t;
typedef struct gw_dispatch gw_dispatch_t;
typedef struct gw_registry gw_registry_t;
typedef struct gw_prep_pool gw_prep_pool_t;

/* The server: one per process, created by gw_main. Fields written by one
 * thread and read by others are atomics; everything else is set before the
 * threads start and then read-only. */
typedef struct gw_server {
    const gw_config_t *cfg;
    char socket_path[108];
    char token_path[256];
    char admin_token[65]; /* hex */
    double start_wall_s;

    atomic_int db_ready;        /* the model DB is open */
    atomic_int workers_up;      /* workers connected and past the handshake */
    atomic_int stopping;        /* SIGTERM seen: no new work */
    atomic_long inflight;       /* HTTP requests not yet answered */
    atomic_long infer_inflight; /* inference requests inside squishd (max_inflight) */

    atomic_int kind_up[3]; /* workers up per device kind (gw_kind_t) */
    /* Supervised workers per kind being restarted (or not yet past their
     * handshake): requests for their models wait for them (within their
     * deadlines) instead of being refused no_worker. */
    atomic_int kind_coming[3];
    _Atomic int64_t kind_back_at_us[3]; /* when the first of them should be up */
    long long last_epoch;               /* the newest plan stored in the DB at start */
    /* That plan (its JSON and placements), read at start for the planner to
     * reapply once workers are up; planning.c takes them (then NULL). */
    json_t *restore_plan;
    json_t *restore_placements;

    sq_shm_arena_t *arena;
    gw_registry_t *registry;
    gw_prep_pool_t *prep;
    gw_db_t *db;
    gw_workers_t *workers;
    gw_transport_t *transport; /* the workers' link (workers.c); dispatch thread */
    gw_dispatch_t *dispatch;   /* lives on the dispatch thread */
    sq_loop_t *dispatch_loop;
    gw_http_t *http;
    struct gw_offload_ctx *offload;
    gw_metrics_t *metrics; /* thread-safe; created first, freed last */
} gw_server_t;

/* The offload thread (offload.c): runs fn(arg) off the HTTP loops. */
int gw_offload_start(gw_server_t *srv);
void gw_offload(gw_server_t *srv, void (*fn)(void *arg), void *arg);
void gw_offload_stop(gw_server_t *srv);

/* DB thread: owns the sqlite handle; the HTTP loop never touches it. */
int gw_db_start(gw_server_t *srv, char *err, size_t errlen);
/* Runs fn(db, arg) on the DB thread. */
void gw_db_post(gw_server_t *srv, void (*fn)(mdb_t *db, void *arg), void *arg);
void gw_db_stop(gw_server_t *srv);
/* Waits until every job posted so far has run (their answers to HTTP
 * requests are on their way before the HTTP loops stop). */
void gw_db_quiesce(gw_server_t *srv);

/* Dispatch thread: the worker socket, handshakes, heartbeats, supervision.
 * gw_workers_start binds the socket (refusing to steal a live one), spawns
 * the configured workers and runs `loop` (the dispatch loop) on a thread of
 * its own; srv->transport is the link, and events go to ev with ctx. */
int gw_workers_start(gw_server_t *srv, sq_loop_t *loop, const gw_transport_events_t *ev, void *ctx,
                     char *err, size_t errlen);
/* Answers every request still queued in the dispatcher (503 shutting
 * down) and waits until that is done. */
void gw_workers_abort(gw_server_t *srv);
/* Asks workers to exit, waits for them (SIGKILL after a grace period) and
 * joins the thread. The dispatch loop stays (the DB thread may still post
 * to it): gw_workers_free, after gw_db_stop, runs what was posted. */
void gw_workers_stop(gw_server_t *srv);
void gw_workers_free(gw_server_t *srv);

/* HTTP: binds, then runs cfg->http_threads h2o event loops. */
struct gw_http_app; /* gw_http.h */
int gw_http_start(gw_server_t *srv, const struct gw_http_app *app, char *err, size_t errlen);
/* Stops accepting and waits up to timeout_ms for in-flight requests. */
void gw_http_drain(gw_server_t *srv, int timeout_ms);
/* Stops the loops and joins the threads (after gw_http_drain). */
void gw_http_stop(gw_server_t *srv);
/* Open client connections (max_connections); any thread. */
int gw_http_connections(gw_server_t *srv);

/* Admin token: reads it, or creates a random one (mode 0600) on first
 * start. A token file readable by group or others is refused. */
int gw_token_load(gw_server_t *srv, char *err, size_t errlen);
/* Constant-time comparison of a presented bearer token with the admin one. */
int gw_token_matches(const gw_server_t *srv, const char *presented, size_t len);

#endif
