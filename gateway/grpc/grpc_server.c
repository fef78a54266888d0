/* The gRPC server: Debian's gRPC C core, one completion queue and the
 * thread that runs it. Every method is taken as an unregistered call
 * (grpc_server_request_call); a call then goes through two batches, each
 * its tag on the queue (gw_grpc_call_t.stage): its request message
 * (RECEIVING), then its answer (SENDING: initial metadata, the message,
 * the status, the close), after which it is freed. An answer may be sent
 * from the DB thread (grpc_methods.c) or the room's answer thread
 * (inferences); ModelInfer and ModelStreamInfer have batches of their own
 * besides (the close, a stream's messages: grpc_infer.c, grpc_stream.c),
 * each holding a reference to the call, whose last frees it. */
#include "grpc_call.h"

#include <grpc/grpc_security.h>
#include <sq_log.h>

#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct gw_grpc {
    gw_grpc_config_t cfg;
    gw_api_ctx_t *api;
    grpc_server *server;
    grpc_completion_queue *cq;
    pthread_t thread;
    gw_offload_t *answers; /* answers inferences: encodes and sends them */
    int port;
    atomic_int calls;    /* gw_grpc_call_t not yet freed, the one waiting for a call included */
    atomic_int stopping; /* gw_grpc_stop: request no new call */
    int shutdown_tag;    /* its address is the tag of the server's shutdown */
};

/* Asks the server for the next call. */
static void request_call(gw_grpc_t *g)
{
    gw_grpc_call_t *c = sq_xcalloc(1, sizeof(*c));
    c->api = g->api;
    c->admin_token = g->cfg.admin_token;
    c->calls = &g->calls;
    c->answers = g->answers;
    atomic_init(&c->refs, 1);
    c->tag.call = c;
    c->close_tag.call = c;
    c->close_tag.kind = GW_GRPC_TAG_CLOSE;
    c->recv_tag.call = c;
    c->recv_tag.kind = GW_GRPC_TAG_STREAM_RECV;
    c->send_tag.call = c;
    c->send_tag.kind = GW_GRPC_TAG_STREAM_SEND;
    c->method = -1;
    c->stage = GW_GRPC_REQUESTED;
    c->status_details = grpc_empty_slice();
    grpc_call_details_init(&c->details);
    grpc_metadata_array_init(&c->md);
    atomic_fetch_add(&g->calls, 1);
    grpc_call_error e =
        grpc_server_request_call(g->server, &c->call, &c->details, &c->md, g->cq, g->cq, &c->tag);
    if (e != GRPC_CALL_OK) {
        SQ_ERROR("grpc: cannot ask for a call error=%d", (int)e);
        gw_grpc_call_unref(c);
    }
}

/* Its request message: one batch (the answer waits for it). */
static void receive(gw_grpc_call_t *c)
{
    grpc_op op;
    memset(&op, 0, sizeof(op));
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &c->recv;
    c->stage = GW_GRPC_RECEIVING;
    if (grpc_call_start_batch(c->call, &op, 1, &c->tag, NULL) != GRPC_CALL_OK)
        gw_grpc_call_unref(c);
}

static void on_event(gw_grpc_t *g, gw_grpc_call_t *c, int ok)
{
    switch (c->stage) {
    case GW_GRPC_REQUESTED:
        if (!atomic_load(&g->stopping))
            request_call(g); /* the next one, before this one is served */
        if (!ok) {
            gw_grpc_call_unref(c); /* the server is shutting down */
            return;
        }
        c->method = gw_grpc_method_of((const char *)GRPC_SLICE_START_PTR(c->details.method),
                                      GRPC_SLICE_LENGTH(c->details.method));
        receive(c);
        return;
    case GW_GRPC_RECEIVING:
        if (!ok) {
            gw_grpc_call_unref(c); /* cancelled before its request came */
            return;
        }
        gw_grpc_answer(c);
        return;
    default: /* GW_GRPC_SENDING: answered (or cancelled) */
        gw_grpc_call_unref(c);
        return;
    }
}

/* Runs the queue until the server has shut down and every call is freed
 * (one answered from the DB thread after the shutdown began included). */
static void *serve(void *arg)
{
    gw_grpc_t *g = arg;
    int shut = 0;
    for (;;) {
        gpr_timespec until =
            gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(100, GPR_TIMESPAN));
        grpc_event ev = grpc_completion_queue_next(g->cq, until, NULL);
        if (ev.type == GRPC_OP_COMPLETE) {
            gw_grpc_tag_t *tag = ev.tag;
            if (ev.tag == &g->shutdown_tag)
                shut = 1;
            else if (tag->kind == GW_GRPC_TAG_STAGE)
                on_event(g, tag->call, ev.success);
            else if (tag->call->stream != NULL)
                gw_grpc_stream_event(tag->call, tag->kind, ev.success);
            else
                gw_grpc_closed(tag->call);
        } else if (ev.type == GRPC_QUEUE_SHUTDOWN) {
            break;
        }
        if (shut && atomic_load(&g->calls) == 0)
            break;
    }
    return NULL;
}

/* Shuts the queue down, drains and destroys it (the server destroyed). */
static void queue_free(grpc_completion_queue *cq)
{
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(cq);
}

int gw_grpc_start(const gw_grpc_deps_t *deps, gw_grpc_t **out, char *err, size_t errlen)
{
    *out = NULL;
    gw_grpc_t *g = sq_xcalloc(1, sizeof(*g));
    g->cfg = deps->cfg;
    g->api = deps->api;
    if (gw_offload_start(&g->answers) != 0) {
        snprintf(err, errlen, "grpc: cannot start its answer thread");
        free(g);
        return SQ_NOMEM;
    }
    grpc_init();
    g->cq = grpc_completion_queue_create_for_next(NULL);
    /* A request as large as an HTTP body may be (--max-body-mb; the core
     * refuses a larger one with RESOURCE_EXHAUSTED before it is buffered
     * whole); answers of any size. */
    int64_t max = g->cfg.max_message_bytes;
    grpc_arg args[] = {
        {.type = GRPC_ARG_INTEGER,
         .key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
         .value.integer = max > 0 && max < INT_MAX ? (int)max : INT_MAX},
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, .value.integer = -1},
    };
    grpc_channel_args cargs = {.num_args = sizeof(args) / sizeof(args[0]), .args = args};
    g->server = grpc_server_create(&cargs, NULL);
    grpc_server_register_completion_queue(g->server, g->cq, NULL);
    grpc_server_credentials *creds = grpc_insecure_server_credentials_create();
    g->port = grpc_server_add_http2_port(g->server, g->cfg.listen, creds);
    grpc_server_credentials_release(creds);
    if (g->port <= 0) {
        snprintf(err, errlen, "grpc_listen %s: cannot listen there (in use, or no such address)",
                 g->cfg.listen);
        grpc_server_destroy(g->server);
        queue_free(g->cq);
        grpc_shutdown_blocking();
        gw_offload_stop(g->answers);
        free(g);
        return SQ_IO;
    }
    grpc_server_start(g->server);
    request_call(g);
    if (pthread_create(&g->thread, NULL, serve, g) != 0) {
        snprintf(err, errlen, "grpc: cannot start its thread");
        atomic_store(&g->stopping, 1);
        grpc_server_shutdown_and_notify(g->server, g->cq, &g->shutdown_tag);
        grpc_server_cancel_all_calls(g->server);
        serve(g); /* here: no call has come to wait on anything */
        grpc_server_destroy(g->server);
        queue_free(g->cq);
        grpc_shutdown_blocking();
        gw_offload_stop(g->answers);
        free(g);
        return SQ_IO;
    }
    SQ_INFO("grpc listening address=%s port=%d service=inference.GRPCInferenceService",
            g->cfg.listen, g->port);
    *out = g;
    return 0;
}

int gw_grpc_port(const gw_grpc_t *g)
{
    return g->port;
}

void gw_grpc_stop(gw_grpc_t *g)
{
    if (g == NULL)
        return;
    atomic_store(&g->stopping, 1);
    grpc_server_shutdown_and_notify(g->server, g->cq, &g->shutdown_tag);
    grpc_server_cancel_all_calls(g->server);
    pthread_join(g->thread, NULL);
    gw_offload_stop(g->answers); /* idle: every call was answered */
    grpc_server_destroy(g->server);
    queue_free(g->cq);
    /* The library's own state freed before this returns, not on a thread
     * of its own that may outlive squishd's exit (LSan would see it). */
    grpc_shutdown_blocking();
    free(g);
}
