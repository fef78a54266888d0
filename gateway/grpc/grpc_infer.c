/* ModelInfer: the request decoded into the body HTTP's /v2 infer route
 * takes (grpc_infer_codec.c) and inferred by the route's own code
 * (gw_api_infer_v2): the same admission, SLO, batching, deadlines and
 * errors. The call then has two batches under way: its close batch
 * (RECV_CLOSE_ON_SERVER, on the queue's thread: a cancelled call's items
 * are withdrawn, never run), and, once the inference is done (on whichever
 * thread finished it), its answer, encoded and sent from the room's answer
 * thread, off the dispatcher's. Each holds a reference to the call. */
#include "grpc_call.h"

#include <sq_log.h>

#include <stdio.h>
#include <stdlib.h>

int gw_grpc_infer_answer(gw_api_infer_t *h, uint8_t **msg, size_t *len, char *why, size_t whylen)
{
    gw_api_infer_answer_t a;
    gw_api_infer_answer(h, &a);
    int rc = a.err;
    if (rc != 0)
        snprintf(why, whylen, "%s", a.why);
    else
        rc = gw_grpc_encode_infer(a.body.data, a.body.len, a.header_len, msg, len, why, whylen);
    sq_buf_dispose(&a.body);
    return rc;
}

/* On the answer thread: the inference's answer as a ModelInferResponse,
 * or its error as the status Triton gives it. */
static void answer(void *arg)
{
    gw_grpc_call_t *c = arg;
    uint8_t *msg;
    size_t len;
    char why[1024];
    int rc = gw_grpc_infer_answer(c->answer, &msg, &len, why, sizeof(why));
    if (rc != 0) {
        gw_grpc_reply(c, gw_grpc_status_of(rc), why, NULL, 0);
        return;
    }
    gw_grpc_reply(c, 0, NULL, msg, len);
    free(msg);
}

/* The inference is done (any thread): its answer goes to the answer
 * thread, which the room stops only once every call is freed. */
static void infer_done(void *arg, gw_api_infer_t *h)
{
    gw_grpc_call_t *c = arg;
    c->answer = h;
    gw_offload(c->answers, answer, c);
}

void gw_grpc_model_infer(gw_grpc_call_t *c, const uint8_t *body, size_t len)
{
    gw_grpc_infer_req_t r;
    char why[1024];
    int rc = gw_grpc_decode_infer(body, len, &r, why, sizeof(why));
    if (rc != 0) {
        gw_grpc_reply(c, gw_grpc_status_of(rc), why, NULL, 0);
        return;
    }
    /* Its close batch first, so that a cancel from now on is seen; it
     * holds a reference of its own. */
    grpc_op op = {.op = GRPC_OP_RECV_CLOSE_ON_SERVER};
    op.data.recv_close_on_server.cancelled = &c->close_cancelled;
    atomic_fetch_add(&c->refs, 1);
    c->close_started = 1;
    if (grpc_call_start_batch(c->call, &op, 1, &c->close_tag, NULL) != GRPC_CALL_OK) {
        c->close_started = 0;
        atomic_fetch_sub(&c->refs, 1); /* the stage's reference remains */
    }
    gw_api_infer_t *h;
    rc = gw_api_infer_v2(c->api, r.name, r.version, r.body, r.len, r.header_len, infer_done, c, &h,
                         why, sizeof(why));
    r.body = NULL; /* taken */
    if (rc != 0) {
        gw_grpc_reply(c, gw_grpc_status_of(rc), why, NULL, 0);
        return;
    }
    /* This thread also runs the close batch's completion: it cannot
     * come before this. */
    if (c->close_started)
        c->infer = h;
    else
        gw_api_infer_release(h);
}

void gw_grpc_closed(gw_grpc_call_t *c)
{
    if (c->infer != NULL) {
        if (c->close_cancelled)
            gw_api_infer_cancel(c->infer);
        gw_api_infer_release(c->infer);
        c->infer = NULL;
    }
    gw_grpc_call_unref(c);
}
