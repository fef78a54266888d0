#include "gw_link.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

enum { R_WAIT_CHALLENGE, R_WAIT_PROOF, R_AUTHED };

/* A batch sent whose outputs are still to come. */
typedef struct {
    uint64_t id;
    uint64_t out_off, out_len, got;
} pending_t;

struct gw_remote {
    int state;
    sq_auth_t auth;
    char addr[64];
    char (*held)[65]; /* model files the worker kept (MODELS_HELD) */
    uint32_t nheld;
    pending_t *pending;
    int npending, cappending;
    sq_batch_t *batch; /* scratch: a batch rewritten for the wire */
    sq_buf_t buf;      /* scratch encoding */
};

/* "host:port", or "[host]:port" for IPv6 ("?:0" for another family). */
static void format_addr(const struct sockaddr_storage *ss, char *out, size_t outlen)
{
    char name[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *s4 = (const struct sockaddr_in *)ss;
        inet_ntop(AF_INET, &s4->sin_addr, name, sizeof(name));
        port = ntohs(s4->sin_port);
    } else if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)ss;
        inet_ntop(AF_INET6, &s6->sin6_addr, name, sizeof(name));
        port = ntohs(s6->sin6_port);
    }
    snprintf(out, outlen, ss->ss_family == AF_INET6 ? "[%s]:%d" : "%s:%d", name, port);
}

int gw_cluster_listen(const char *spec, int *fd_out, char *bound, size_t boundlen, char *err,
                      size_t errlen)
{
    char why[300];
    int fd = sq_listen_tcp(spec, bound, boundlen, why, sizeof(why));
    if (fd < 0) {
        snprintf(err, errlen, "--cluster-listen %s", why);
        return SQ_BAD_CONFIG;
    }
    *fd_out = fd;
    return 0;
}

int gw_cluster_accept(int listen_fd, char *addr, size_t addrlen)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    int fd = accept4(listen_fd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0)
        return -1;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
    format_addr(&ss, addr, addrlen);
    return fd;
}

gw_remote_t *gw_remote_new(const uint8_t *token, size_t token_len, const char *addr)
{
    gw_remote_t *r = sq_xcalloc(1, sizeof(*r));
    snprintf(r->addr, sizeof(r->addr), "%s", addr);
    sq_buf_init(&r->buf);
    if (sq_auth_init(&r->auth, SQ_AUTH_GATEWAY, token, token_len, NULL) != 0) {
        /* No nonce: every handshake on this connection fails (on_challenge
         * refuses in a failed state). */
        SQ_ERROR("cannot start a worker authentication addr=%s", addr);
    }
    return r;
}

void gw_remote_free(gw_remote_t *r)
{
    if (r == NULL)
        return;
    sq_auth_wipe(&r->auth);
    free(r->held);
    free(r->pending);
    free(r->batch);
    sq_buf_dispose(&r->buf);
    free(r);
}

const char *gw_remote_addr(const gw_remote_t *r)
{
    return r->addr;
}

const char (*gw_remote_held(const gw_remote_t *r, int *n))[65]
{
    *n = (int)r->nheld;
    return (const char(*)[65])r->held;
}

static int send_payload(sq_conn_t *c, uint16_t type, const sq_buf_t *b)
{
    return sq_conn_send(c, type, 0, b->data, (uint32_t)b->len);
}

int gw_remote_before_hello(gw_remote_t *r, sq_conn_t *c, const sq_frame_t *f, char *why,
                           size_t whylen)
{
    int rc;
    switch (r->state) {
    case R_WAIT_CHALLENGE:
        if (f->type == SQ_MSG_HELLO) {
            snprintf(why, whylen, "no_token (HELLO without authentication)");
            return SQ_UNAUTHORIZED;
        }
        if (f->type != SQ_MSG_AUTH_CHALLENGE) {
            snprintf(why, whylen, "malformed (expected AUTH_CHALLENGE, got %s)",
                     sq_msg_name(f->type));
            return SQ_UNAUTHORIZED;
        }
        r->buf.len = 0;
        rc = sq_auth_on_challenge(&r->auth, f->payload, f->len, &r->buf);
        if (rc != 0) {
            snprintf(why, whylen, "%s%s", sq_auth_reason(rc),
                     rc == SQ_AUTH_NO_TOKEN ? " (the worker has no --cluster-token-file)" : "");
            return SQ_UNAUTHORIZED;
        }
        r->state = R_WAIT_PROOF;
        return send_payload(c, SQ_MSG_AUTH_REPLY, &r->buf) < 0 ? SQ_IO : 0;
    case R_WAIT_PROOF:
        if (f->type == SQ_MSG_ERROR) {
            sq_ipc_error_t e;
            if (sq_ipc_error_decode(f, &e) == 0)
                snprintf(why, whylen, "the worker refused squishd: %s", e.message);
            else
                snprintf(why, whylen, "refused by the worker");
            return SQ_UNAUTHORIZED;
        }
        if (f->type != SQ_MSG_AUTH_PROOF) {
            snprintf(why, whylen, "malformed (expected AUTH_PROOF, got %s)", sq_msg_name(f->type));
            return SQ_UNAUTHORIZED;
        }
        rc = sq_auth_on_proof(&r->auth, f->payload, f->len);
        if (rc != 0) {
            snprintf(why, whylen, "%s%s", sq_auth_reason(rc),
                     rc == SQ_AUTH_BAD_PROOF ? " (the worker's proof does not verify)" : "");
            return SQ_UNAUTHORIZED;
        }
        r->state = R_AUTHED;
        SQ_INFO("worker authenticated addr=%s", r->addr);
        return 0;
    default:
        if (f->type == SQ_MSG_MODELS_HELD) {
            sq_models_held_t m;
            if (r->held != NULL || sq_models_held_decode(f, &m) != 0) {
                snprintf(why, whylen, "malformed MODELS_HELD");
                return SQ_PROTOCOL;
            }
            r->held = m.sha256;
            r->nheld = m.n;
            return 0;
        }
        if (f->type == SQ_MSG_HELLO)
            return 1;
        if (f->type == SQ_MSG_FE_HELLO && r->held == NULL)
            return 2;
        snprintf(why, whylen, "expected HELLO, got %s", sq_msg_name(f->type));
        return SQ_PROTOCOL;
    }
}

static pending_t *pending_find(gw_remote_t *r, uint64_t id)
{
    for (int i = 0; i < r->npending; i++)
        if (r->pending[i].id == id)
            return &r->pending[i];
    return NULL;
}

/* A batch: its regions' bytes in BATCH_INPUT frames, then BATCH naming
 * offsets into them, its outputs expected back for out_off. */
static int send_batch(gw_remote_t *r, sq_conn_t *c, const uint8_t *arena, size_t arena_size,
                      uint64_t id, const void *payload, uint32_t len, const gw_region_t *regions,
                      int nregions)
{
    if (r->batch == NULL)
        r->batch = sq_xmalloc(sizeof(*r->batch));
    sq_batch_t *b = r->batch;
    sq_frame_t f = {.type = SQ_MSG_BATCH, .payload = payload, .len = len};
    if (sq_batch_decode(&f, b) != 0 || nregions != (int)b->count)
        return SQ_INTERNAL;
    uint64_t at = 0;
    for (int i = 0; i < nregions; i++) {
        const gw_region_t *g = &regions[i];
        if (g->offset != b->in_off[i] || g->offset > arena_size ||
            g->bytes > arena_size - g->offset || at + g->bytes > SQ_REMOTE_MAX_BATCH_BYTES)
            return SQ_INTERNAL;
        b->in_off[i] = at;
        for (uint64_t o = 0; o < g->bytes; o += SQ_REMOTE_CHUNK_BYTES) {
            uint64_t n =
                g->bytes - o < SQ_REMOTE_CHUNK_BYTES ? g->bytes - o : SQ_REMOTE_CHUNK_BYTES;
            int rc = sq_conn_send(c, SQ_MSG_BATCH_INPUT, id, arena + g->offset + o, (uint32_t)n);
            if (rc < 0)
                return rc;
        }
        at += g->bytes;
    }
    /* Rows from frontends go to the worker from them, and their outputs
     * back to them: the region comes back only for rows of squishd's own. */
    int own = !b->has_sources;
    for (uint32_t i = 0; i < b->count && !own; i++)
        own = b->src[i] == 0;
    uint64_t out_off = b->out_off, out_len = own ? b->out_stride * b->count : 0;
    if (out_off > arena_size || out_len > arena_size - out_off)
        return SQ_INTERNAL;
    b->out_off = 0;
    r->buf.len = 0;
    sq_batch_encode(&r->buf, b);
    int rc = sq_conn_send(c, SQ_MSG_BATCH, id, r->buf.data, (uint32_t)r->buf.len);
    if (rc < 0)
        return rc;
    pending_t *p = pending_find(r, id);
    if (p == NULL) {
        if (r->npending == r->cappending) {
            r->cappending = r->cappending ? 2 * r->cappending : 4;
            r->pending = sq_xrealloc(r->pending, sizeof(*r->pending) * (size_t)r->cappending);
        }
        p = &r->pending[r->npending++];
    }
    *p = (pending_t){.id = id, .out_off = out_off, .out_len = out_len};
    return 0;
}

int gw_remote_send(gw_remote_t *r, sq_conn_t *c, int worker, const uint8_t *arena,
                   size_t arena_size, uint16_t type, uint64_t id, const void *payload, uint32_t len,
                   const gw_region_t *regions, int nregions)
{
    if (type == SQ_MSG_BATCH)
        return send_batch(r, c, arena, arena_size, id, payload, len, regions, nregions);
    return sq_conn_send(c, type, id, payload, len);
}

int gw_remote_on_frame(gw_remote_t *r, const sq_frame_t *f, uint8_t *arena, size_t arena_size)
{
    if (f->type == SQ_MSG_BATCH_OUTPUT) {
        pending_t *p = pending_find(r, f->id);
        if (p == NULL || f->len > p->out_len - p->got || p->out_off + p->out_len > arena_size)
            return SQ_PROTOCOL;
        memcpy(arena + p->out_off + p->got, f->payload, f->len);
        p->got += f->len;
        return 0;
    }
    if (f->type == SQ_MSG_BATCH_DONE) {
        pending_t *p = pending_find(r, f->id);
        if (p == NULL)
            return 1; /* the dispatcher says what it makes of it */
        sq_batch_done_t done;
        if (sq_batch_done_decode(f, &done) != 0 || (done.code == 0 && p->got != p->out_len))
            return SQ_PROTOCOL;
        *p = r->pending[--r->npending];
        return 1;
    }
    return 1;
}
