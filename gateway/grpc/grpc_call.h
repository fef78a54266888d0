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

typedef struct gw_grpc_call gw_grpc_call_t;
/* A batch's tag on the queue: its call, and whether it is the call's
 * close batch (ModelInfer's: RECV_CLOSE_ON_SERVER alone, to learn of a
 * cancel while the inference runs) or its stage's. */
typedef struct {
    gw_grpc_call_t *call;
    int close;
} gw_grpc_tag_t;

struct gw_grpc_call {
    gw_api_ctx_t *api;
    const char *admin_token;
    atomic_int *calls;     /* the room's calls not yet freed */
    gw_offload_t *answers; /* the room's thread that answers inferences */
    atomic_int refs;       /* its batches under way, and an answer to come */
    gw_grpc_tag_t tag;     /* its stage's batches */
    gw_grpc_tag_t close_tag;
    grpc_call *call;
    grpc_call_details details; /* its method's path */
    grpc_metadata_array md;    /* the client's metadata (authorization) */
    grpc_byte_buffer *recv;    /* the request message; NULL when none came */
    int stage;
    int method; /* gw_grpc_method_t, or -1 */
    int cancelled;
    int close_started;   /* its close batch is its own (ModelInfer) */
    int close_cancelled; /* that batch's answer: the client cancelled */
    /* ModelInfer: the inference, the transport's reference to it, held
     * until the call closes (the queue's thread) ... */
    gw_api_infer_t *infer;
    /* ... and the same, given to the answer (its thread). */
    gw_api_infer_t *answer;
    grpc_byte_buffer *send;
    grpc_slice status_details;
};

/* Answers c (any thread, once, holding a reference that the batch then
 * holds): status code (0: OK, with the message payload of len bytes) and
 * details (the error's message, or NULL). The queue's thread lets go of
 * it when the batch completes; here when it cannot start. */
void gw_grpc_reply(gw_grpc_call_t *c, int code, const char *details, const uint8_t *payload,
                   size_t len);
/* Lets go of one reference to c; the last frees its state and the call
 * (any thread). */
void gw_grpc_call_unref(gw_grpc_call_t *c);

/* Answers c, whose request has come (grpc_methods.c): checks its token,
 * decodes it and answers from the API's facts, now or from the DB
 * thread. */
void gw_grpc_answer(gw_grpc_call_t *c);
/* ModelInfer (grpc_infer.c): decodes the request (body, len), starts the
 * inference and its close batch; answered from the room's answer thread
 * once the inference is done. */
void gw_grpc_model_infer(gw_grpc_call_t *c, const uint8_t *body, size_t len);
/* c's close batch completed (the queue's thread): a cancelled call's
 * inference is withdrawn; the call's reference to it let go. */
void gw_grpc_closed(gw_grpc_call_t *c);

#endif
