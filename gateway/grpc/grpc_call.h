/* grpc/: internal to the room, with the gRPC core's types: one call's
 * state from grpc_server_request_call to its last batch (grpc_server.c
 * runs it, grpc_methods.c answers it, grpc_reply.c sends and frees). */
#ifndef GW_GRPC_CALL_H
#define GW_GRPC_CALL_H

#include "gw_grpc.h"
#include "grpc_int.h"

#include <grpc/byte_buffer.h>
#include <grpc/grpc.h>

#include <pthread.h>
#include <stdatomic.h>

/* A call's stage: which batch its tag stands for on the queue. */
enum { GW_GRPC_REQUESTED, GW_GRPC_RECEIVING, GW_GRPC_SENDING };

typedef struct gw_grpc_call gw_grpc_call_t;
typedef struct gw_grpc_stream gw_grpc_stream_t;
/* What a batch is: its stage's; the call's close batch (ModelInfer's and
 * ModelStreamInfer's: RECV_CLOSE_ON_SERVER alone, to learn of a cancel
 * while inferences run); a stream's next message, or an answer sent on
 * it. */
enum { GW_GRPC_TAG_STAGE, GW_GRPC_TAG_CLOSE, GW_GRPC_TAG_STREAM_RECV, GW_GRPC_TAG_STREAM_SEND };
/* A batch's tag on the queue: its call and what the batch is. */
typedef struct {
    gw_grpc_call_t *call;
    int kind;
} gw_grpc_tag_t;

/* An answer a stream is to send, in order. */
typedef struct gw_grpc_out_msg {
    struct gw_grpc_out_msg *next;
    grpc_byte_buffer *buf;
} gw_grpc_out_msg_t;

/* One inference on a stream, from before it starts until its answer is
 * queued (grpc_stream.c). */
typedef struct gw_grpc_entry {
    struct gw_grpc_entry *next, *prev;
    gw_grpc_call_t *c;
    gw_api_infer_t *h; /* set by gw_api_infer_v2 before the request starts */
} gw_grpc_entry_t;

/* A stream's state (ModelStreamInfer, grpc_stream.c), part of its call's
 * and freed with it (gw_grpc_call_unref). What the answer thread and the
 * queue's thread share is under mu. */
struct gw_grpc_stream {
    pthread_mutex_t mu;
    grpc_byte_buffer *recv;         /* the next message's batch fills it */
    int half_closed;                /* the client sent its last (or the call ended) */
    int inflight;                   /* inferences whose answer is not queued yet */
    gw_grpc_out_msg_t *head, *tail; /* answers to send, in order; head is being sent */
    int sending;
    int sent_metadata;
    int finished; /* the status batch is started */
    gw_grpc_entry_t entries;
};

struct gw_grpc_call {
    gw_api_ctx_t *api;
    const char *admin_token;
    atomic_int *calls;     /* the room's calls not yet freed */
    gw_offload_t *answers; /* the room's thread that answers inferences */
    atomic_int refs;       /* its batches under way, and an answer to come */
    gw_grpc_tag_t tag;     /* its stage's batches */
    gw_grpc_tag_t close_tag;
    gw_grpc_tag_t recv_tag, send_tag; /* a stream's */
    gw_grpc_stream_t *stream;         /* ModelStreamInfer's state; NULL otherwise */
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
/* The done inference h's answer (grpc_infer.c; its reference let go): 0
 * with a packed ModelInferResponse in *msg (malloc'd, *len bytes), or the
 * SQ_* error it ended with and why. A unary call and a stream answer it
 * the same way. */
int gw_grpc_infer_answer(gw_api_infer_t *h, uint8_t **msg, size_t *len, char *why, size_t whylen);
/* c's close batch completed (the queue's thread): a cancelled call's
 * inference is withdrawn; the call's reference to it let go. */
void gw_grpc_closed(gw_grpc_call_t *c);

/* ModelStreamInfer (grpc_stream.c): each request on the stream (the first
 * is c's) is inferred as ModelInfer's and answered on it, in the order
 * the answers come, with a ModelStreamInferResponse (error_message on a
 * failure); the stream ends, OK, once the client has sent its last and
 * every answer is sent. */
void gw_grpc_stream_start(gw_grpc_call_t *c);
/* A stream's batch completed (the queue's thread): its next message
 * (kind GW_GRPC_TAG_STREAM_RECV), an answer sent, or its close. */
void gw_grpc_stream_event(gw_grpc_call_t *c, int kind, int ok);

#endif
