/* grpc/: internal to the room, with the gRPC core's types: one call's
 * state from grpc_server_request_call to its last batch (grpc_server.c
 * runs it, grpc_methods.c answers it, grpc_reply.c sends and frees). */
#ifndef GW_GRPC_CALL_H
#define GW_GRPC_CALL_H

#include "gw_grpc.h"
#include "grpc_int.h"

#include <grpc/byte_buffer.h>
#include <grpc/grpc.h>

#include <stdatomic.h>

/* A call's stage: which batch its tag stands for on the queue. */
enum { GW_GRPC_REQUESTED, GW_GRPC_RECEIVING, GW_GRPC_SENDING };

typedef struct {
    gw_api_ctx_t *api;
    const char *admin_token;
    atomic_int *calls; /* the room's calls not yet freed */
    grpc_call *call;
    grpc_call_details details; /* its method's path */
    grpc_metadata_array md;    /* the client's metadata (authorization) */
    grpc_byte_buffer *recv;    /* the request message; NULL when none came */
    int stage;
    int method; /* gw_grpc_method_t, or -1 */
    int cancelled;
    grpc_byte_buffer *send;
    grpc_slice status_details;
} gw_grpc_call_t;

/* Answers c (any thread, once): status code (0: OK, with the message
 * payload of len bytes) and details (the error's message, or NULL). The
 * queue's thread frees c when the batch completes; c is freed here when
 * it cannot start. */
void gw_grpc_reply(gw_grpc_call_t *c, int code, const char *details, const uint8_t *payload,
                   size_t len);
/* Frees c's state and the call (the queue's thread, or gw_grpc_reply). */
void gw_grpc_call_free(gw_grpc_call_t *c);

/* Answers c, whose request has come (grpc_methods.c): checks its token,
 * decodes it and answers from the API's facts, now or from the DB
 * thread. */
void gw_grpc_answer(gw_grpc_call_t *c);

#endif
