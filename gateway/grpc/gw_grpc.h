/* grpc/: KServe v2 over gRPC (squishd --grpc-listen): the protocol's
 * service inference.GRPCInferenceService (kserve_v2.proto, the project's
 * own, with protobuf-c codecs made at build time) on Debian's gRPC C core.
 * One thread runs a completion queue; every method is answered from the
 * facts the HTTP routes answer from (gw_api.h), with the same auth (the
 * `authorization` metadata, as the header) and the same errors, mapped to
 * gRPC status codes as Triton maps them. */
#ifndef GW_GRPC_H
#define GW_GRPC_H

#include "gw_api.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

typedef struct gw_grpc gw_grpc_t;

/* The room's settings, copied once from gw_config_t (server.c). */
typedef struct {
    char listen[128];          /* ADDR:PORT or [IPV6]:PORT; port 0 picks a free one */
    char admin_token[65];      /* what `authorization: Bearer ...` must carry */
    int64_t max_message_bytes; /* a request's at most, as an HTTP body's (--max-body-mb) */
} gw_grpc_config_t;

/* What the room needs of the server, given once at gw_grpc_start. */
typedef struct {
    gw_grpc_config_t cfg;
    gw_api_ctx_t *api; /* the facts it answers from; outlives the room */
} gw_grpc_deps_t;

/* The server's settings and handles from srv's (server.c). */
gw_grpc_deps_t gw_grpc_deps(gw_server_t *srv);
/* Binds and starts the serving thread; *out is the room (gw_grpc_stop).
 * 0, or SQ_IO with why (the address cannot be bound). */
int gw_grpc_start(const gw_grpc_deps_t *deps, gw_grpc_t **out, char *err, size_t errlen);
/* The port it listens on. */
int gw_grpc_port(const gw_grpc_t *g);
/* Stops serving: calls under way are cancelled, every call's state is
 * freed (a call waiting on the DB thread is answered there first, so the
 * DB thread must still run), and the room freed. Accepts NULL. */
void gw_grpc_stop(gw_grpc_t *g);

#endif
