/* api/: squishd's HTTP API: the route table (routes.c) and its handlers,
 * one file per area (inference, complex queries, models, pipelines, Triton's
 * model repository, metrics). The room's public face is the table alone. */
#ifndef GW_API_H
#define GW_API_H

#include "gw_http.h"

/* What squishd's HTTP loops serve (routes.c). */
extern const gw_http_app_t gw_http_app;

/* Request traces, Triton's trace extension (trace.c; the rest of it is
 * internal to the room, trace_int.h). server.c makes the tracer before
 * HTTP serves (gw_server_t.trace) and frees it after HTTP stopped. */

/* A tracer whose lines go to path ("": none; then tracing cannot be turned
 * on). Neither opens the file nor starts the writer (gw_trace_open). */
gw_trace_t *gw_trace_new(const char *path);
/* Opens the file (appending; created 0644 less the umask) and starts the
 * writer thread; 0, or SQ_IO with why. Nothing to do without a path. */
int gw_trace_open(gw_trace_t *t, char *why, size_t len);
/* Writes every line queued, stops the writer and frees it; accepts NULL.
 * After the HTTP loops stopped (no more lines come). */
void gw_trace_free(gw_trace_t *t);

/* Registered system shared-memory regions, Triton's shared-memory extension
 * (shm_regions.c; the rest of it is internal to the room, shm_int.h).
 * server.c makes the table before HTTP serves (gw_server_t.shm) and frees
 * it after HTTP stopped. */
gw_shm_table_t *gw_shm_table_new(void);
/* Unregisters and unmaps every region; accepts NULL. After the HTTP loops
 * stopped (no request uses a region any more). */
void gw_shm_table_free(gw_shm_table_t *t);

#endif
