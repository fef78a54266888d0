/* A call's answer, one batch (gw_grpc_reply), and its state's end. */
#include "grpc_call.h"

#include <sq_log.h>

#include <stdlib.h>
#include <string.h>

void gw_grpc_call_unref(gw_grpc_call_t *c)
{
    if (atomic_fetch_sub(&c->refs, 1) != 1)
        return;
    grpc_call_details_destroy(&c->details);
    grpc_metadata_array_destroy(&c->md);
    if (c->recv != NULL)
        grpc_byte_buffer_destroy(c->recv);
    if (c->send != NULL)
        grpc_byte_buffer_destroy(c->send);
    grpc_slice_unref(c->status_details);
    if (c->stream != NULL) { /* its queue is empty by now, but for a send that could not start */
        for (gw_grpc_out_msg_t *m = c->stream->head, *next; m != NULL; m = next) {
            next = m->next;
            grpc_byte_buffer_destroy(m->buf);
            free(m);
        }
        if (c->stream->recv != NULL)
            grpc_byte_buffer_destroy(c->stream->recv);
        pthread_mutex_destroy(&c->stream->mu);
        free(c->stream);
    }
    if (c->call != NULL)
        grpc_call_unref(c->call);
    atomic_fetch_sub(c->calls, 1);
    free(c);
}

void gw_grpc_reply(gw_grpc_call_t *c, int code, const char *details, const uint8_t *payload,
                   size_t len)
{
    grpc_op ops[4];
    memset(ops, 0, sizeof(ops));
    size_t n = 0;
    ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[n++].data.send_initial_metadata.count = 0;
    if (code == GRPC_STATUS_OK) {
        grpc_slice s = grpc_slice_from_copied_buffer((const char *)payload, len);
        c->send = grpc_raw_byte_buffer_create(&s, 1);
        grpc_slice_unref(s);
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n++].data.send_message.send_message = c->send;
    }
    c->status_details = grpc_slice_from_copied_string(details != NULL ? details : "");
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.trailing_metadata_count = 0;
    ops[n].data.send_status_from_server.status = (grpc_status_code)code;
    ops[n++].data.send_status_from_server.status_details = &c->status_details;
    if (!c->close_started) { /* else its own batch waits for the close */
        ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
        ops[n++].data.recv_close_on_server.cancelled = &c->cancelled;
    }
    c->stage = GW_GRPC_SENDING;
    grpc_call_error e = grpc_call_start_batch(c->call, ops, n, &c->tag, NULL);
    if (e != GRPC_CALL_OK) {
        SQ_WARN("grpc: cannot answer method=%s error=%d", gw_grpc_method_name(c->method), (int)e);
        gw_grpc_call_unref(c);
    }
}
