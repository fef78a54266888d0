/* The TCP side of the workers' link (workers.c): squishd's cluster
 * listener and, per remote worker, what differs from a local one: the
 * authentication before HELLO (sq_auth.h), the inputs and outputs of a
 * batch carried in frames instead of the shared-memory arena, and the model
 * files the worker kept from an earlier connection (sent as cached, their
 * bytes not again). workers.c calls these; nothing here calls workers.c.
 * Dispatch thread only. */
#ifndef GW_CLUSTER_H
#define GW_CLUSTER_H

#include "gw_transport.h"

#include <sq.h>

#include <stddef.h>
#include <stdint.h>

typedef struct gw_remote gw_remote_t;

/* Listens on "ADDR:PORT" (IPv4, or [IPv6]:PORT; port 0 picks one). Sets
 * *fd and the bound address ("127.0.0.1:40123") in bound. Returns 0 or a
 * negative SQ_* error with a reason in err. */
int gw_cluster_listen(const char *spec, int *fd, char *bound, size_t boundlen, char *err,
                      size_t errlen);
/* Accepts one connection from the listener: a non-blocking fd with
 * TCP_NODELAY and keep-alive, and the peer's address; -1 when none. */
int gw_cluster_accept(int listen_fd, char *addr, size_t addrlen);

/* A remote worker's state; token: squishd's (copied). */
gw_remote_t *gw_remote_new(const uint8_t *token, size_t token_len, const char *addr);
void gw_remote_free(gw_remote_t *r);
const char *gw_remote_addr(const gw_remote_t *r);
/* The model files (sha256 hex) the worker said it holds (MODELS_HELD at
 * its handshake); *n of them, borrowed. */
const char (*gw_remote_held(const gw_remote_t *r, int *n))[65];

/* A frame before HELLO: the authentication and MODELS_HELD. Returns 0 when
 * handled (answers go out on c), 1 for the HELLO of an authenticated
 * worker, or a negative SQ_* error when the worker is refused (reason in
 * why: the caller sends ERROR, logs and closes). */
int gw_remote_before_hello(gw_remote_t *r, sq_conn_t *c, const sq_frame_t *f, char *why,
                           size_t whylen);

/* The link's send for a remote worker: a batch's regions go along in
 * BATCH_INPUT frames (read from arena); other frames as they are (a model
 * file the worker holds is sent as cached by the dispatcher, which knows it
 * from the transport's held event). Returns 0 or a negative errno or SQ_*
 * error. */
int gw_remote_send(gw_remote_t *r, sq_conn_t *c, int worker, const uint8_t *arena,
                   size_t arena_size, uint16_t type, uint64_t id, const void *payload, uint32_t len,
                   const gw_region_t *regions, int nregions);

/* A frame from an authenticated remote worker: BATCH_OUTPUT is written
 * into the arena at the batch's output region (0: consumed); BATCH_DONE is
 * checked against what came (1: hand it to the dispatcher, which reads the
 * outputs from the arena as for a local worker); anything else: 1. A
 * negative SQ_PROTOCOL drops the worker. */
int gw_remote_on_frame(gw_remote_t *r, const sq_frame_t *f, uint8_t *arena, size_t arena_size);

#endif
