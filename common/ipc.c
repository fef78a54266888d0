#include "sq_ipc.h"
#include "sq_alloc.h"
#include "sq_error.h"

#include <assert.h>
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

const char *sq_msg_name(unsigned type)
{
    switch (type) {
#define SQ_IPC_NAME_(n, v)                                                                         \
    case v:                                                                                        \
        return #n;
        SQ_IPC_MSGS(SQ_IPC_NAME_)
#undef SQ_IPC_NAME_
    }
    return NULL;
}

static void frame_header(uint8_t h[SQ_IPC_HEADER_SIZE], uint16_t type, uint64_t id, uint32_t len)
{
    sq_put_le32(h, len);
    sq_put_le16(h + 4, type);
    sq_put_le16(h + 6, 0);
    sq_put_le64(h + 8, id);
}

void sq_frame_encode(sq_buf_t *out, uint16_t type, uint64_t id, const void *payload, uint32_t len)
{
    uint8_t h[SQ_IPC_HEADER_SIZE];
    frame_header(h, type, id, len);
    sq_buf_put(out, h, sizeof(h));
    sq_buf_put(out, payload, len);
}

int sq_frame_decode(const uint8_t *data, size_t len, sq_frame_t *f, size_t *consumed)
{
    if (len < SQ_IPC_HEADER_SIZE)
        return 0;
    uint32_t plen = sq_le32(data);
    uint16_t type = sq_le16(data + 4);
    uint16_t flags = sq_le16(data + 6);
    if (plen > SQ_IPC_MAX_PAYLOAD || flags != 0 || sq_msg_name(type) == NULL)
        return SQ_PROTOCOL;
    if (len - SQ_IPC_HEADER_SIZE < plen)
        return 0;
    f->type = type;
    f->flags = flags;
    f->id = sq_le64(data + 8);
    f->payload = data + SQ_IPC_HEADER_SIZE;
    f->len = plen;
    *consumed = SQ_IPC_HEADER_SIZE + (size_t)plen;
    return 1;
}

/* Output past this size is given back once written, so that a connection
 * that once queued a large frame does not hold its buffer for life. */
#define OUT_KEEP_BYTES (1u << 20)
/* Most buffer pieces one sendmsg takes. */
#define FLUSH_IOVECS 64

void sq_conn_init(sq_conn_t *c, int fd)
{
    memset(c, 0, sizeof(*c));
    c->fd = fd;
    sq_buf_init(&c->in);
    sq_buf_init(&c->out);
    c->refs_tail = &c->refs;
}

static void drop_refs(sq_conn_t *c)
{
    for (sq_conn_ref_t *r = c->refs, *next; r != NULL; r = next) {
        next = r->next;
        sq_bytes_unref(r->bytes);
        free(r);
    }
    c->refs = NULL;
    c->refs_tail = &c->refs;
}

void sq_conn_dispose(sq_conn_t *c)
{
    if (c->io != NULL && c->io->free != NULL)
        c->io->free(c->io_ctx);
    c->io = NULL;
    c->io_ctx = NULL;
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    for (int i = 0; i < c->nfds; i++)
        close(c->fds[i]);
    c->nfds = 0;
    drop_refs(c);
    sq_buf_dispose(&c->in);
    sq_buf_dispose(&c->out);
}

int sq_conn_read(sq_conn_t *c)
{
    /* Frames handed out are done with: move what is left (at most the
     * frames not yet handed out) to the front, once per read. */
    c->in_off += c->in_consumed;
    c->in_consumed = 0;
    if (c->in_off > 0) {
        memmove(c->in.data, c->in.data + c->in_off, c->in.len - c->in_off);
        c->in.len -= c->in_off;
        c->in_off = 0;
    }
    int total = 0;
    for (;;) {
        sq_buf_reserve(&c->in, 65536);
        struct iovec iov = {.iov_base = c->in.data + c->in.len, .iov_len = c->in.cap - c->in.len};
        if (c->io != NULL) {
            ssize_t n = c->io->read(c->io_ctx, iov.iov_base, iov.iov_len);
            if (n < 0 && errno == EINTR)
                continue;
            if (n < 0)
                return total > 0 ? total : (errno == EAGAIN ? -EAGAIN : -errno);
            if (n == 0)
                return total;
            c->in.len += (size_t)n;
            total += (int)n;
            if ((size_t)n < iov.iov_len || total > (1 << 24))
                return total;
            continue;
        }
        union {
            struct cmsghdr align;
            char buf[CMSG_SPACE(sizeof(int) * SQ_IPC_MAX_FDS)];
        } ctl;
        struct msghdr msg = {.msg_iov = &iov,
                             .msg_iovlen = 1,
                             .msg_control = ctl.buf,
                             .msg_controllen = sizeof(ctl.buf)};
        ssize_t n = recvmsg(c->fd, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return total > 0 ? total : -EAGAIN;
            /* What came before the error (a peer that died: its last
             * frames) is handed out first; the next read reports it. */
            return total > 0 ? total : -errno;
        }
        for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm != NULL; cm = CMSG_NXTHDR(&msg, cm)) {
            if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
                continue;
            size_t nfd = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            for (size_t i = 0; i < nfd; i++) {
                int fd;
                memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
                if (c->nfds < SQ_IPC_MAX_FDS)
                    c->fds[c->nfds++] = fd;
                else
                    close(fd);
            }
        }
        if (n == 0)
            return total > 0 ? total : 0;
        c->in.len += (size_t)n;
        total += (int)n;
        if ((size_t)n < iov.iov_len || total > (1 << 24))
            return total;
    }
}

int sq_conn_next(sq_conn_t *c, sq_frame_t *f)
{
    c->in_off += c->in_consumed;
    c->in_consumed = 0;
    if (c->in_off == c->in.len) {
        c->in.len = c->in_off = 0;
        return 0;
    }
    size_t used = 0;
    int rc = sq_frame_decode(c->in.data + c->in_off, c->in.len - c->in_off, f, &used);
    if (rc == 1)
        c->in_consumed = used;
    return rc;
}

int sq_conn_pending(const sq_conn_t *c)
{
    return c->out_off < c->out.len || c->refs != NULL ||
           (c->io != NULL && c->io->want_write(c->io_ctx));
}

/* Marks n written bytes as sent: the buffer's up to the next borrowed
 * payload, then that payload, and so on. */
static void advance(sq_conn_t *c, size_t n)
{
    c->bytes_written += n;
    while (n > 0) {
        sq_conn_ref_t *r = c->refs;
        size_t owned_end = r != NULL ? r->at : c->out.len;
        if (c->out_off < owned_end) {
            size_t k = owned_end - c->out_off < n ? owned_end - c->out_off : n;
            c->out_off += k;
            n -= k;
            continue;
        }
        size_t k = r->len < n ? r->len : n;
        r->p += k;
        r->len -= k;
        n -= k;
        if (r->len == 0) {
            c->refs = r->next;
            if (c->refs == NULL)
                c->refs_tail = &c->refs;
            sq_bytes_unref(r->bytes);
            free(r);
        }
    }
}

int sq_conn_flush(sq_conn_t *c)
{
    int rc = 0;
    while (sq_conn_pending(c)) {
        struct iovec iov[FLUSH_IOVECS];
        int n = 0;
        size_t pos = c->out_off;
        const sq_conn_ref_t *r = c->refs;
        for (; r != NULL && n < FLUSH_IOVECS - 1; r = r->next) {
            if (r->at > pos) {
                iov[n++] = (struct iovec){.iov_base = c->out.data + pos, .iov_len = r->at - pos};
                pos = r->at;
            }
            iov[n++] = (struct iovec){.iov_base = (void *)r->p, .iov_len = r->len};
        }
        if (r == NULL && pos < c->out.len && n < FLUSH_IOVECS)
            iov[n++] = (struct iovec){.iov_base = c->out.data + pos, .iov_len = c->out.len - pos};
        struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)n};
        ssize_t w = c->io != NULL ? c->io->writev(c->io_ctx, iov, n)
                                  : sendmsg(c->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                rc = -errno;
            break;
        }
        advance(c, (size_t)w);
    }
    if (!sq_conn_pending(c)) {
        c->out.len = c->out_off = 0;
        if (c->out.cap > OUT_KEEP_BYTES)
            sq_buf_dispose(&c->out);
    }
    return rc < 0 ? rc : sq_conn_pending(c);
}

/* Before appending: once more than half of the buffer is written, move
 * the rest to the front (amortized constant per byte). */
static void out_compact(sq_conn_t *c)
{
    if (c->out_off == 0 || c->out_off < c->out.len / 2)
        return;
    memmove(c->out.data, c->out.data + c->out_off, c->out.len - c->out_off);
    for (sq_conn_ref_t *r = c->refs; r != NULL; r = r->next)
        r->at -= c->out_off;
    c->out.len -= c->out_off;
    c->out_off = 0;
}

int sq_conn_send(sq_conn_t *c, uint16_t type, uint64_t id, const void *payload, uint32_t len)
{
    out_compact(c);
    sq_frame_encode(&c->out, type, id, payload, len);
    int rc = sq_conn_flush(c);
    return rc < 0 ? rc : 0;
}

int sq_conn_send_ref(sq_conn_t *c, uint16_t type, uint64_t id, sq_bytes_t *bytes, size_t off,
                     uint32_t len)
{
    assert(off <= bytes->len && len <= bytes->len - off);
    out_compact(c);
    uint8_t h[SQ_IPC_HEADER_SIZE];
    frame_header(h, type, id, len);
    sq_buf_put(&c->out, h, sizeof(h));
    if (len > 0) {
        sq_conn_ref_t *r = sq_xmalloc(sizeof(*r));
        *r = (sq_conn_ref_t){
            .at = c->out.len, .bytes = sq_bytes_ref(bytes), .p = bytes->data + off, .len = len};
        *c->refs_tail = r;
        c->refs_tail = &r->next;
    }
    int rc = sq_conn_flush(c);
    return rc < 0 ? rc : 0;
}

static int wait_writable(int fd, int timeout_ms)
{
    struct pollfd p = {.fd = fd, .events = POLLOUT};
    int rc = poll(&p, 1, timeout_ms);
    if (rc < 0)
        return errno == EINTR ? 0 : -errno;
    return rc == 0 ? -ETIMEDOUT : 0;
}

int sq_conn_send_with_fd(sq_conn_t *c, uint16_t type, uint64_t id, const void *payload,
                         uint32_t len, int fd, int timeout_ms)
{
    int rc;
    while ((rc = sq_conn_flush(c)) == 1) {
        if ((rc = wait_writable(c->fd, timeout_ms)) < 0)
            return rc;
    }
    if (rc < 0)
        return rc;
    sq_buf_t frame;
    sq_buf_init(&frame);
    sq_frame_encode(&frame, type, id, payload, len);
    size_t off = 0;
    int fd_sent = 0;
    while (off < frame.len) {
        struct iovec iov = {.iov_base = frame.data + off, .iov_len = frame.len - off};
        union {
            struct cmsghdr align;
            char buf[CMSG_SPACE(sizeof(int))];
        } ctl;
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
        if (!fd_sent) {
            memset(&ctl, 0, sizeof(ctl));
            msg.msg_control = ctl.buf;
            msg.msg_controllen = sizeof(ctl.buf);
            struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
            cm->cmsg_level = SOL_SOCKET;
            cm->cmsg_type = SCM_RIGHTS;
            cm->cmsg_len = CMSG_LEN(sizeof(int));
            memcpy(CMSG_DATA(cm), &fd, sizeof(int));
        }
        ssize_t n = sendmsg(c->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                if ((rc = wait_writable(c->fd, timeout_ms)) < 0)
                    break;
                continue;
            }
            rc = -errno;
            break;
        }
        fd_sent = 1;
        off += (size_t)n;
    }
    int complete = off == frame.len;
    sq_buf_dispose(&frame);
    return complete && rc >= 0 ? 0 : (rc < 0 ? rc : -EIO);
}

int sq_conn_take_fd(sq_conn_t *c)
{
    if (c->nfds == 0)
        return -1;
    int fd = c->fds[0];
    memmove(c->fds, c->fds + 1, sizeof(int) * (size_t)(c->nfds - 1));
    c->nfds--;
    return fd;
}

void sq_hello_encode(sq_buf_t *b, const sq_hello_t *m)
{
    sq_buf_put_u32(b, m->magic);
    sq_buf_put_u16(b, m->version);
    sq_buf_put_str(b, m->kind);
    sq_buf_put_str(b, m->name);
    sq_buf_put_u64(b, m->memory_bytes);
    sq_buf_put_u32(b, m->pid);
}

int sq_hello_decode(const sq_frame_t *f, sq_hello_t *m)
{
    sq_reader_t r;
    sq_reader_init(&r, f->payload, f->len);
    m->magic = sq_get_u32(&r);
    m->version = sq_get_u16(&r);
    sq_get_str(&r, m->kind, sizeof(m->kind));
    sq_get_str(&r, m->name, sizeof(m->name));
    m->memory_bytes = sq_get_u64(&r);
    m->pid = sq_get_u32(&r);
    if (r.err || f->type != SQ_MSG_HELLO || m->magic != SQ_IPC_MAGIC)
        return SQ_PROTOCOL;
    return 0;
}

void sq_welcome_encode(sq_buf_t *b, const sq_welcome_t *m)
{
    sq_buf_put_u16(b, m->version);
    sq_buf_put_u32(b, m->worker_id);
    sq_buf_put_u32(b, m->heartbeat_ms);
    sq_buf_put_u64(b, m->shm_bytes);
}

int sq_welcome_decode(const sq_frame_t *f, sq_welcome_t *m)
{
    sq_reader_t r;
    sq_reader_init(&r, f->payload, f->len);
    m->version = sq_get_u16(&r);
    m->worker_id = sq_get_u32(&r);
    m->heartbeat_ms = sq_get_u32(&r);
    m->shm_bytes = sq_get_u64(&r);
    return r.err || f->type != SQ_MSG_WELCOME ? SQ_PROTOCOL : 0;
}

void sq_ipc_error_encode(sq_buf_t *b, const sq_ipc_error_t *m)
{
    sq_buf_put_u32(b, (uint32_t)m->code);
    sq_buf_put_str(b, m->message);
}

int sq_ipc_error_decode(const sq_frame_t *f, sq_ipc_error_t *m)
{
    sq_reader_t r;
    sq_reader_init(&r, f->payload, f->len);
    m->code = (int32_t)sq_get_u32(&r);
    sq_get_str(&r, m->message, sizeof(m->message));
    /* The same body says why a load failed (MODEL_FAILED). */
    return r.err || (f->type != SQ_MSG_ERROR && f->type != SQ_MSG_MODEL_FAILED) ? SQ_PROTOCOL : 0;
}
