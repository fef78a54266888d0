/* A frontend's data connections to the workers: FE_ASSIGN's rows go to
 * the worker named (DATA_ROWS, or offsets in this frontend's arena on the
 * worker's local socket), and its DATA_OUTPUT answers the items. */
#include "front_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* ---- the workers' data connections ------------------------------------------ */

/* The bytes of an item's input slot (as the dispatcher reckons them). */
static uint64_t input_bytes(const gw_model_t *m, int input_kind)
{
    uint64_t elems = (uint64_t)m->c * (uint64_t)m->h * (uint64_t)m->w;
    return input_kind == SQ_INPUT_PIXELS ? (uint64_t)m->h * (uint64_t)m->w * 3
           : input_kind == SQ_INPUT_FP32 ? elems * sizeof(float)
                                         : elems;
}

static void assign_free(assign_t *a)
{
    free(a->slot);
    free(a->row);
    free(a);
}

/* A data connection closed: the items whose rows went on it are answered
 * 503 (retryable: the dispatcher runs them again only if it saw the worker
 * lost, and a retry from the client is as good). */
void fr_data_close(gw_front_t *fr, data_conn_t *d, const char *why)
{
    for (data_conn_t **pp = &fr->data; *pp != NULL; pp = &(*pp)->next)
        if (*pp == d) {
            *pp = d->next;
            break;
        }
    char detail[160];
    snprintf(detail, sizeof(detail), "lost the connection to the worker at %s (%s)", d->addr, why);
    int n = 0;
    for (assign_t *a = d->assigns, *next; a != NULL; a = next) {
        next = a->next;
        for (uint32_t k = 0; k < a->n; k++) {
            uint32_t idx;
            if (fr_slot_item(fr, a->slot[k], &idx) != NULL) {
                fr_answer_slot(fr, idx, SQ_WORKER_LOST, detail);
                n++;
            }
        }
        assign_free(a);
    }
    if (d->conn.fd >= 0)
        sq_loop_unwatch(fr->loop, d->conn.fd);
    sq_conn_dispose(&d->conn);
    SQ_LOG(fr->stopping ? SQ_LOG_INFO : SQ_LOG_WARN,
           "worker data connection closed addr=%s "
           "reason=%s items_failed=%d",
           d->addr, why, n);
    free(d);
}

static void on_output(gw_front_t *fr, data_conn_t *d, const sq_frame_t *f)
{
    sq_data_output_t *o = sq_xmalloc(sizeof(*o));
    if (sq_data_output_decode(f, o) != 0) {
        free(o);
        fr_data_close(fr, d, "bad DATA_OUTPUT");
        return;
    }
    assign_t **pa = &d->assigns;
    while (*pa != NULL && (*pa)->batch_id != f->id)
        pa = &(*pa)->next;
    assign_t *a = *pa;
    if (a == NULL) {
        free(o);
        return; /* answered meanwhile (its items failed) */
    }
    int64_t now = sq_now_us();
    for (uint32_t k = 0; k < o->n; k++) {
        uint64_t slot = 0;
        int found = 0;
        for (uint32_t j = 0; j < a->n && !found; j++)
            if (a->row[j] == o->row[k]) {
                slot = a->slot[j];
                found = 1;
            }
        uint32_t idx;
        gw_item_t *it = found ? fr_slot_item(fr, slot, &idx) : NULL;
        if (it == NULL)
            continue;
        if (o->code != 0) {
            /* Rows that never reached the worker: a retry can succeed (503);
             * a run that failed is a device error, as on a dispatcher's own
             * batches. */
            fr_answer_slot(fr, idx, o->code == SQ_IO ? SQ_WORKER_LOST : SQ_DEVICE, o->message);
            continue;
        }
        uint64_t row_bytes = (uint64_t)it->ask.model->out_elems * sizeof(float);
        if (row_bytes > o->out_stride) {
            fr_answer_slot(fr, idx, SQ_PROTOCOL,
                           "the worker's output row is shorter than the model's");
            continue;
        }
        memcpy(it->owner.out, o->bytes + (uint64_t)k * o->out_stride, row_bytes);
        it->times.batch_size = (int)o->count;
        it->times.exec_end_us = now;
        it->times.exec_start_us = now - (int64_t)(o->exec_ns / 1000);
        fr_release_slot(fr, idx);
        fr_finish(fr, it, 0, NULL);
    }
    /* A batch's outputs for this frontend come in one or more frames: the
     * assignment goes when each of its rows has been answered. */
    int left = 0;
    for (uint32_t j = 0; j < a->n && !left; j++) {
        uint32_t idx;
        left = fr_slot_item(fr, a->slot[j], &idx) != NULL;
    }
    if (!left) {
        *pa = a->next;
        assign_free(a);
    }
    free(o);
}

static void on_data_io(sq_loop_t *loop, int fd, int events, void *data)
{
    data_conn_t *d = data;
    gw_front_t *fr = d->fr;
    if (events & SQ_EV_WRITE) {
        int rc = sq_conn_flush(&d->conn);
        if (rc < 0) {
            fr_data_close(fr, d, "write_error");
            return;
        }
        sq_loop_modify(loop, fd, SQ_EV_READ | (rc == 1 ? SQ_EV_WRITE : 0));
    }
    if (!(events & SQ_EV_READ))
        return;
    int rc = sq_conn_read(&d->conn);
    if (rc == 0 || (rc < 0 && rc != -EAGAIN)) {
        fr_data_close(fr, d, rc == 0 ? "eof" : "read_error");
        return;
    }
    sq_frame_t f;
    while ((rc = sq_conn_next(&d->conn, &f)) == 1) {
        atomic_fetch_add(&fr->data_in, (uint64_t)f.len + SQ_IPC_HEADER_SIZE);
        if (f.type == SQ_MSG_DATA_OUTPUT) {
            on_output(fr, d, &f);
            /* on_output may have closed d */
            data_conn_t *x = fr->data;
            while (x != NULL && x != d)
                x = x->next;
            if (x == NULL)
                return;
        } else if (f.type == SQ_MSG_PING) {
            sq_conn_send(&d->conn, SQ_MSG_PONG, f.id, f.payload, f.len);
        } else if (f.type != SQ_MSG_PONG) {
            fr_data_close(fr, d, "protocol_error");
            return;
        }
    }
    if (rc < 0) {
        fr_data_close(fr, d, "bad_frame");
        return;
    }
    if (sq_conn_pending(&d->conn))
        sq_loop_modify(loop, fd, SQ_EV_READ | SQ_EV_WRITE);
}

/* The worker's local data socket (SQ_DATA_LOCAL_PREFIX + its address, in
 * the abstract namespace): there only when the worker runs on this host. A
 * connected fd, or -1. */
static int local_dial(const char *addr)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    int n = snprintf(sa.sun_path + 1, sizeof(sa.sun_path) - 1, "%s%s", SQ_DATA_LOCAL_PREFIX, addr);
    if (n <= 0 || (size_t)n >= sizeof(sa.sun_path) - 2)
        return -1;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
    if (connect(fd, (struct sockaddr *)&sa, len) != 0) {
        close(fd);
        return -1;
    }
    int fl = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, fl | O_NONBLOCK);
    return fd;
}

/* The connection to the worker at addr, opened (and authenticated) the
 * first time; NULL with why when it cannot be. */
static data_conn_t *data_conn(gw_front_t *fr, const char *addr, char *why, size_t whylen)
{
    for (data_conn_t *d = fr->data; d != NULL; d = d->next)
        if (strcmp(d->addr, addr) == 0)
            return d;
    /* A worker on this host: its local data socket, and shared memory;
     * else TCP, with the cluster's TLS where workers speak it (on their
     * data listener too). */
    int fd = local_dial(addr);
    int shm = fd >= 0;
    sq_dial_opts_t o = {.tls = shm ? NULL : fr->tls,
                        .token = fr->token,
                        .token_len = fr->token_len,
                        .dial_timeout_ms = DIAL_TIMEOUT_MS,
                        .auth_timeout_ms = HANDSHAKE_TIMEOUT_MS};
    data_conn_t *d = sq_xcalloc(1, sizeof(*d));
    d->fr = fr;
    d->shm = shm;
    snprintf(d->addr, sizeof(d->addr), "%s", addr);
    int rc = sq_dial_open(&d->conn, addr, fd, &o, NULL, why, whylen);
    if (rc != 0) {
        free(d);
        return NULL;
    }
    fd = d->conn.fd;
    sq_buf_t b;
    sq_buf_init(&b);
    sq_buf_put_u32(&b, (uint32_t)fr->fe_id);
    rc = shm ? sq_conn_send_with_fd(&d->conn, SQ_MSG_DATA_HELLO, 0, b.data, (uint32_t)b.len,
                                    sq_shm_arena_fd(fr->arena), HANDSHAKE_TIMEOUT_MS)
             : sq_conn_send(&d->conn, SQ_MSG_DATA_HELLO, 0, b.data, (uint32_t)b.len);
    sq_buf_dispose(&b);
    if (rc != 0)
        snprintf(why, whylen, "cannot send DATA_HELLO: %s", strerror(-rc));
    if (rc == 0 && sq_loop_watch(fr->loop, fd, SQ_EV_READ | SQ_EV_WRITE, on_data_io, d) != 0) {
        snprintf(why, whylen, "cannot watch the connection");
        rc = SQ_IO;
    }
    if (rc != 0) {
        sq_conn_dispose(&d->conn);
        free(d);
        return NULL;
    }
    SQ_INFO("worker data connection addr=%s frontend=%d shared_memory=%s", addr, fr->fe_id,
            shm ? "yes" : "no");
    d->next = fr->data;
    fr->data = d;
    return d;
}

/* FE_ASSIGN: the rows go to the worker, each present while this frontend
 * still holds its item (absent otherwise: the batch does not wait for it). */
void fr_on_assign(gw_front_t *fr, const sq_frame_t *f)
{
    sq_fe_assign_t *a = sq_xmalloc(sizeof(*a));
    if (sq_fe_assign_decode(f, a) != 0) {
        SQ_WARN("malformed FE_ASSIGN from the dispatcher");
        free(a);
        return;
    }
    char why[256] = "";
    data_conn_t *d = data_conn(fr, a->addr, why, sizeof(why));
    if (d == NULL) {
        char detail[400];
        snprintf(detail, sizeof(detail), "cannot reach the worker at %s: %s", a->addr, why);
        SQ_WARN("%s", detail);
        for (uint32_t k = 0; k < a->n; k++) {
            uint32_t idx;
            if (fr_slot_item(fr, a->slot[k], &idx) != NULL)
                fr_answer_slot(fr, idx, SQ_WORKER_LOST, detail);
        }
        free(a);
        return;
    }
    const uint8_t *base = sq_shm_arena_base(fr->arena);
    sq_data_rows_t *r = sq_xmalloc(sizeof(*r));
    assign_t *rec = sq_xcalloc(1, sizeof(*rec));
    rec->batch_id = f->id;
    rec->slot = sq_xmalloc(sizeof(*rec->slot) * a->n);
    rec->row = sq_xmalloc(sizeof(*rec->row) * a->n);
    int rc = 0;
    uint32_t k = 0;
    while (k < a->n && rc == 0) {
        /* As many rows as fit one frame (at least one). */
        r->count = a->count;
        r->input_kind = a->input_kind;
        r->row_bytes = a->row_bytes;
        r->shm = (uint8_t)d->shm;
        r->n = 0;
        uint64_t bytes = 0;
        uint32_t first = k;
        for (; k < a->n; k++) {
            uint32_t idx;
            gw_item_t *it = fr_slot_item(fr, a->slot[k], &idx);
            int present = it != NULL && it->input.in_off >= 0 &&
                          input_bytes(it->ask.model, it->ask.input_kind) == a->row_bytes;
            if (present && !d->shm && bytes + a->row_bytes > ROWS_FRAME_BYTES && r->n > 0)
                break;
            r->row[r->n] = a->row[k];
            r->off[r->n] = present ? (uint64_t)it->input.in_off : 0;
            r->present[r->n++] = (uint8_t)present;
            bytes += present && !d->shm ? a->row_bytes : 0;
            if (present && d->shm)
                atomic_fetch_add(&fr->data_shm, a->row_bytes);
            if (present) {
                fr->slots[idx].state = SLOT_ASSIGNED;
                it->times.sent_us = sq_now_us(); /* its rows leave for the worker */
                rec->slot[rec->n] = a->slot[k];
                rec->row[rec->n++] = a->row[k];
            }
        }
        fr->scratch.len = 0;
        sq_data_rows_encode(&fr->scratch, r);
        for (uint32_t j = 0; j < r->n && !d->shm; j++) {
            if (!r->present[j])
                continue;
            uint32_t idx;
            gw_item_t *it = fr_slot_item(fr, a->slot[first + j], &idx);
            sq_buf_put(&fr->scratch, base + it->input.in_off, a->row_bytes);
        }
        rc = sq_conn_send(&d->conn, SQ_MSG_DATA_ROWS, f->id, fr->scratch.data,
                          (uint32_t)fr->scratch.len);
        atomic_fetch_add(&fr->data_out, fr->scratch.len + SQ_IPC_HEADER_SIZE);
    }
    free(r);
    free(a);
    if (rec->n > 0) {
        rec->next = d->assigns;
        d->assigns = rec;
    } else {
        assign_free(rec);
    }
    if (rc < 0)
        fr_data_close(fr, d, "write_error");
    else if (sq_conn_pending(&d->conn))
        sq_loop_modify(fr->loop, d->conn.fd, SQ_EV_READ | SQ_EV_WRITE);
}
