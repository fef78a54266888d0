/* ModelStreamInfer: a bidirectional stream of ModelInfer requests, each
 * inferred as ModelInfer's (gw_api_infer_v2) and answered on the stream
 * with a ModelStreamInferResponse as soon as its answer comes (in that
 * order, not the requests'), error_message carrying a failure. Batches
 * under way, each holding a reference to the call: the next message (the
 * queue's thread reads one after another), one answer being sent (the
 * others wait in order), the close batch (a cancel withdraws every
 * inference still running), and at the end the status. The state the
 * answer thread and the queue's thread share is under the stream's lock;
 * an inference's entry is linked there from before it starts until its
 * answer is queued, so that a cancel reaches only live requests. */
#include "grpc_call.h"

#include <grpc/byte_buffer_reader.h>
#include <sq_log.h>

#include <stdlib.h>
#include <string.h>

/* Under the lock: the head answer's batch (the first with the initial
 * metadata). */
static void start_send_locked(gw_grpc_call_t *c)
{
    gw_grpc_stream_t *s = c->stream;
    grpc_op ops[2];
    memset(ops, 0, sizeof(ops));
    size_t n = 0;
    if (!s->sent_metadata) {
        ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
        s->sent_metadata = 1;
    }
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n++].data.send_message.send_message = s->head->buf;
    atomic_fetch_add(&c->refs, 1);
    s->sending = 1;
    if (grpc_call_start_batch(c->call, ops, n, &c->send_tag, NULL) != GRPC_CALL_OK) {
        /* The call is over: what is left is never sent. */
        atomic_fetch_sub(&c->refs, 1);
        s->sending = 0;
        while (s->head != NULL) {
            gw_grpc_out_msg_t *m = s->head;
            s->head = m->next;
            grpc_byte_buffer_destroy(m->buf);
            free(m);
        }
        s->tail = NULL;
    }
}

/* Under the lock: whether the stream is to end now (the client sent its
 * last, every inference is answered and every answer sent); then
 * finished is set, and *metadata says whether the status goes with the
 * initial metadata. */
static int finish_due_locked(gw_grpc_stream_t *s, int *metadata)
{
    if (!s->half_closed || s->inflight > 0 || s->head != NULL || s->sending || s->finished)
        return 0;
    s->finished = 1;
    *metadata = !s->sent_metadata;
    s->sent_metadata = 1;
    return 1;
}

/* The status (OK): the stage's batch, whose completion lets go of the
 * stage's reference (here, when it cannot start). Out of the lock: the
 * call may be freed. */
static void finish(gw_grpc_call_t *c, int metadata)
{
    grpc_op ops[2];
    memset(ops, 0, sizeof(ops));
    size_t n = 0;
    if (metadata)
        ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status = GRPC_STATUS_OK;
    ops[n++].data.send_status_from_server.status_details = &c->status_details;
    c->stage = GW_GRPC_SENDING;
    if (grpc_call_start_batch(c->call, ops, n, &c->tag, NULL) != GRPC_CALL_OK) {
        SQ_WARN("grpc: cannot end a stream");
        gw_grpc_call_unref(c);
    }
}

/* Marks the stream half closed (no more messages come) and ends it if
 * nothing is left. */
static void half_close(gw_grpc_call_t *c)
{
    gw_grpc_stream_t *s = c->stream;
    int metadata = 0;
    pthread_mutex_lock(&s->mu);
    s->half_closed = 1;
    int fin = finish_due_locked(s, &metadata);
    pthread_mutex_unlock(&s->mu);
    if (fin)
        finish(c, metadata);
}

/* Queues a message (any thread); the stream keeps it until sent. */
static void queue_message(gw_grpc_call_t *c, uint8_t *bytes, size_t len)
{
    grpc_slice sl = grpc_slice_from_copied_buffer((const char *)bytes, len);
    gw_grpc_out_msg_t *m = sq_xcalloc(1, sizeof(*m));
    m->buf = grpc_raw_byte_buffer_create(&sl, 1);
    grpc_slice_unref(sl);
    free(bytes);
    gw_grpc_stream_t *s = c->stream;
    pthread_mutex_lock(&s->mu);
    if (s->tail != NULL)
        s->tail->next = m;
    else
        s->head = m;
    s->tail = m;
    if (!s->sending)
        start_send_locked(c);
    pthread_mutex_unlock(&s->mu);
}

static void queue_error(gw_grpc_call_t *c, const char *why)
{
    size_t n;
    uint8_t *msg = gw_grpc_stream_response(why, NULL, 0, &n);
    queue_message(c, msg, n);
}

/* On the answer thread: an inference's answer, queued; its entry
 * unlinked (no cancel reaches it after) and the transport's reference
 * let go. */
static void answer(void *arg)
{
    gw_grpc_entry_t *e = arg;
    gw_grpc_call_t *c = e->c;
    gw_grpc_stream_t *s = c->stream;
    uint8_t *msg, *resp = NULL;
    size_t n = 0, rlen = 0;
    char why[1024];
    if (gw_grpc_infer_answer(e->h, &resp, &rlen, why, sizeof(why)) != 0) {
        msg = gw_grpc_stream_response(why, NULL, 0, &n);
    } else {
        msg = gw_grpc_stream_response(NULL, resp, rlen, &n);
        free(resp);
    }
    queue_message(c, msg, n);
    int metadata = 0;
    pthread_mutex_lock(&s->mu);
    e->prev->next = e->next;
    e->next->prev = e->prev;
    s->inflight--;
    int fin = finish_due_locked(s, &metadata);
    pthread_mutex_unlock(&s->mu);
    if (fin)
        finish(c, metadata);
    gw_api_infer_release(e->h);
    free(e);
    gw_grpc_call_unref(c); /* the inference's reference */
}

static void infer_done(void *arg, gw_api_infer_t *h)
{
    gw_grpc_entry_t *e = arg;
    (void)h; /* e->h, set before it started */
    gw_offload(e->c->answers, answer, e);
}

/* One request of the stream (the queue's thread): inferred, or answered
 * with why it cannot be. */
static void one_request(gw_grpc_call_t *c, grpc_byte_buffer *bb)
{
    gw_grpc_stream_t *s = c->stream;
    grpc_slice body = grpc_empty_slice();
    grpc_byte_buffer_reader rd;
    if (grpc_byte_buffer_reader_init(&rd, bb)) {
        body = grpc_byte_buffer_reader_readall(&rd);
        grpc_byte_buffer_reader_destroy(&rd);
    }
    gw_grpc_infer_req_t r;
    char why[1024];
    int rc = gw_grpc_decode_infer(GRPC_SLICE_START_PTR(body), GRPC_SLICE_LENGTH(body), &r, why,
                                  sizeof(why));
    grpc_slice_unref(body);
    if (rc != 0) {
        queue_error(c, why);
        return;
    }
    gw_grpc_entry_t *e = sq_xcalloc(1, sizeof(*e));
    e->c = c;
    atomic_fetch_add(&c->refs, 1); /* until its answer is queued */
    pthread_mutex_lock(&s->mu);
    e->next = s->entries.next;
    e->prev = &s->entries;
    e->next->prev = e;
    s->entries.next = e;
    s->inflight++;
    pthread_mutex_unlock(&s->mu);
    rc = gw_api_infer_v2(c->api, r.name, r.version, r.body, r.len, r.header_len, infer_done, e,
                         &e->h, why, sizeof(why));
    if (rc == 0)
        return;
    pthread_mutex_lock(&s->mu);
    e->prev->next = e->next;
    e->next->prev = e->prev;
    s->inflight--;
    pthread_mutex_unlock(&s->mu);
    free(e);
    queue_error(c, why);
    gw_grpc_call_unref(c);
}

/* The stream's next message. */
static void start_recv(gw_grpc_call_t *c)
{
    gw_grpc_stream_t *s = c->stream;
    grpc_op op;
    memset(&op, 0, sizeof(op));
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &s->recv;
    atomic_fetch_add(&c->refs, 1);
    if (grpc_call_start_batch(c->call, &op, 1, &c->recv_tag, NULL) != GRPC_CALL_OK) {
        atomic_fetch_sub(&c->refs, 1);
        half_close(c);
    }
}

void gw_grpc_stream_start(gw_grpc_call_t *c)
{
    gw_grpc_stream_t *s = sq_xcalloc(1, sizeof(*s));
    pthread_mutex_init(&s->mu, NULL);
    s->entries.next = s->entries.prev = &s->entries;
    c->stream = s;
    grpc_op op;
    memset(&op, 0, sizeof(op));
    op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    op.data.recv_close_on_server.cancelled = &c->close_cancelled;
    atomic_fetch_add(&c->refs, 1);
    c->close_started = 1;
    if (grpc_call_start_batch(c->call, &op, 1, &c->close_tag, NULL) != GRPC_CALL_OK) {
        c->close_started = 0;
        atomic_fetch_sub(&c->refs, 1);
    }
    if (c->recv == NULL) { /* the client sent none */
        half_close(c);
        return;
    }
    one_request(c, c->recv);
    start_recv(c);
}

void gw_grpc_stream_event(gw_grpc_call_t *c, int kind, int ok)
{
    gw_grpc_stream_t *s = c->stream;
    if (kind == GW_GRPC_TAG_STREAM_RECV) {
        grpc_byte_buffer *bb = s->recv;
        s->recv = NULL;
        if (ok && bb != NULL) {
            one_request(c, bb);
            grpc_byte_buffer_destroy(bb);
            start_recv(c);
        } else {
            if (bb != NULL)
                grpc_byte_buffer_destroy(bb);
            half_close(c);
        }
    } else if (kind == GW_GRPC_TAG_STREAM_SEND) {
        pthread_mutex_lock(&s->mu);
        gw_grpc_out_msg_t *m = s->head;
        s->head = m->next;
        if (s->head == NULL)
            s->tail = NULL;
        grpc_byte_buffer_destroy(m->buf);
        free(m);
        s->sending = 0;
        int metadata = 0, fin = 0;
        if (s->head != NULL)
            start_send_locked(c);
        else
            fin = finish_due_locked(s, &metadata);
        pthread_mutex_unlock(&s->mu);
        if (fin)
            finish(c, metadata);
    } else if (c->close_cancelled) {
        /* Cancelled: what still runs is withdrawn (answered as failed,
         * its answer going nowhere). */
        pthread_mutex_lock(&s->mu);
        s->half_closed = 1;
        for (gw_grpc_entry_t *e = s->entries.next; e != &s->entries; e = e->next)
            gw_api_infer_cancel(e->h);
        pthread_mutex_unlock(&s->mu);
    }
    gw_grpc_call_unref(c);
}
