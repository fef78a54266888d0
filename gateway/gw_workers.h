/* The workers' link (workers.c), on the dispatch thread: the worker
 * socket, handshakes, heartbeats, supervision of the workers squishd
 * spawns; it implements gw_transport.h for the dispatcher. */
#ifndef GW_WORKERS_H
#define GW_WORKERS_H

#include "gw_server.h"
#include "gw_transport.h"

/* gw_workers_start binds the socket (refusing to steal a live one), spawns
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

#endif
