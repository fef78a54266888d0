/* Frontends' data connections (serve_int.h), on the I/O thread: a frontend
 * dials the worker's data address, proves the cluster token as a remote
 * worker does to squishd (sq_auth.h: the frontend dials, so it takes the
 * worker's role and this listener squishd's), says which frontend it is
 * (DATA_HELLO), then sends the rows of its batches (DATA_ROWS, into the
 * rows table) and takes their outputs back (DATA_OUTPUT, posted by the
 * execution thread through send_data). A connection in its handshake may
 * buffer at most DATA_HANDSHAKE_MAX_BYTES and take DATA_HANDSHAKE_MS; at
 * most DATA_MAX_HANDSHAKES are in one at a time (the oldest goes). Any
 * frame out of place drops the connection. */
#include "serve_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define DATA_HANDSHAKE_MAX_BYTES (1u << 20)
#define DATA_HANDSHAKE_MS 10000
#define DATA_MAX_HANDSHAKES 16
#define DATA_TICK_MS 1000

enum { D_WAIT_CHALLENGE, D_WAIT_PROOF, D_WAIT_HELLO, D_READY };

typedef struct dconn {
    struct dconn *next;
    struct data_plane *dp;
    sq_conn_t conn;
    sq_auth_t auth;
    int state;
    int replaced;      /* by a newer connection of its frontend */
    uint32_t frontend; /* D_READY */
    int64_t accepted_ns;
    char addr[64];
    /* On the local data socket: a frontend of this host, whose arena
     * (attached to its DATA_HELLO) is mapped here; its rows name offsets. */
    int local;
    const uint8_t *shm;
    size_t shm_len;
} dconn_t;

struct data_plane {
    server_t *s;
    dconn_t *conns;
    uint64_t tick_timer;
    uint64_t evicted; /* connections closed for DATA_MAX_HANDSHAKES */
    int64_t evicted_logged_ns;
    /* The local data socket: abstract, named SQ_DATA_LOCAL_PREFIX + the
     * advertised address, so that only a frontend that could reach this
     * worker at that address on this host (its network namespace) finds it. */
    int local_fd;
    char local_name[108];
};

/* "host:port", "[host]:port" for IPv6 (an IPv4-mapped one as IPv4). */
static void format_addr(const struct sockaddr_storage *ss, int port_of_ss, int port, char *out,
                        size_t outlen)
{
    char name[INET6_ADDRSTRLEN] = "127.0.0.1";
    int v6 = 0;
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *s4 = (const struct sockaddr_in *)ss;
        inet_ntop(AF_INET, &s4->sin_addr, name, sizeof(name));
        if (port_of_ss)
            port = ntohs(s4->sin_port);
    } else if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)ss;
        if (IN6_IS_ADDR_V4MAPPED(&s6->sin6_addr)) {
            inet_ntop(AF_INET, &s6->sin6_addr.s6_addr[12], name, sizeof(name));
        } else {
            inet_ntop(AF_INET6, &s6->sin6_addr, name, sizeof(name));
            v6 = 1;
        }
        if (port_of_ss)
            port = ntohs(s6->sin6_port);
    } /* else (a UNIX socket to squishd): this host, 127.0.0.1 */
    snprintf(out, outlen, v6 ? "[%s]:%d" : "%s:%d", name, port);
}

static void conn_close(dconn_t *d, const char *why)
{
    struct data_plane *dp = d->dp;
    server_t *s = dp->s;
    for (dconn_t **pd = &dp->conns; *pd != NULL; pd = &(*pd)->next)
        if (*pd == d) {
            *pd = d->next;
            break;
        }
    if (d->state == D_READY) {
        SQ_INFO("frontend data connection closed frontend=%u addr=%s reason=%s", d->frontend,
                d->addr, why);
        if (!d->replaced)
            wk__rows_frontend(s->rows, d->frontend, ROWS_FE_CLOSED);
    } else {
        SQ_WARN("frontend data connection dropped in its handshake addr=%s reason=%s", d->addr,
                why);
    }
    sq_loop_unwatch(s->loop, d->conn.fd);
    sq_conn_dispose(&d->conn);
    sq_auth_wipe(&d->auth);
    if (d->shm != NULL)
        munmap((void *)d->shm, d->shm_len);
    free(d);
}

/* Tells a peer refused in its handshake why (best effort, it is dropped
 * next). */
static void send_error(dconn_t *d, int code, const char *msg)
{
    sq_ipc_error_t e = {.code = code};
    snprintf(e.message, sizeof(e.message), "%s", msg);
    sq_buf_t b;
    sq_buf_init(&b);
    sq_ipc_error_encode(&b, &e);
    if (sq_conn_send(&d->conn, SQ_MSG_ERROR, 0, b.data, (uint32_t)b.len) == 0)
        sq_conn_flush(&d->conn);
    sq_buf_dispose(&b);
}

static dconn_t *ready_conn(struct data_plane *dp, uint32_t frontend)
{
    for (dconn_t *d = dp->conns; d != NULL; d = d->next)
        if (d->state == D_READY && d->frontend == frontend)
            return d;
    return NULL;
}

/* The authentication (squishd's side of gw_remote_before_hello), then
 * DATA_HELLO. Returns 0, or -1 with why set (the connection goes). */
static int on_handshake_frame(dconn_t *d, const sq_frame_t *f, char *why, size_t whylen)
{
    struct data_plane *dp = d->dp;
    sq_buf_t b;
    int rc;
    switch (d->state) {
    case D_WAIT_CHALLENGE:
        if (f->type != SQ_MSG_AUTH_CHALLENGE) {
            snprintf(why, whylen, "malformed (expected AUTH_CHALLENGE, got %s)",
                     sq_msg_name(f->type));
            send_error(d, SQ_UNAUTHORIZED, why);
            return -1;
        }
        sq_buf_init(&b);
        rc = sq_auth_on_challenge(&d->auth, f->payload, f->len, &b);
        if (rc != 0) {
            snprintf(why, whylen, "%s", sq_auth_reason(rc));
            send_error(d, SQ_UNAUTHORIZED, why);
            sq_buf_dispose(&b);
            return -1;
        }
        rc = sq_conn_send(&d->conn, SQ_MSG_AUTH_REPLY, 0, b.data, (uint32_t)b.len);
        sq_buf_dispose(&b);
        d->state = D_WAIT_PROOF;
        if (rc < 0)
            snprintf(why, whylen, "write_error");
        return rc < 0 ? -1 : 0;
    case D_WAIT_PROOF:
        if (f->type != SQ_MSG_AUTH_PROOF) {
            snprintf(why, whylen, "malformed (expected AUTH_PROOF, got %s)", sq_msg_name(f->type));
            return -1;
        }
        rc = sq_auth_on_proof(&d->auth, f->payload, f->len);
        if (rc != 0) {
            snprintf(why, whylen, "%s%s", sq_auth_reason(rc),
                     rc == SQ_AUTH_BAD_PROOF ? " (the frontend's proof does not verify)" : "");
            send_error(d, SQ_UNAUTHORIZED, why);
            return -1;
        }
        sq_auth_wipe(&d->auth);
        d->state = D_WAIT_HELLO;
        return 0;
    case D_WAIT_HELLO: {
        if (f->type != SQ_MSG_DATA_HELLO || f->len != 4) {
            snprintf(why, whylen, "expected DATA_HELLO, got %s", sq_msg_name(f->type));
            return -1;
        }
        uint32_t fe = sq_le32(f->payload);
        if (wk__rows_frontend_gone(dp->s->rows, fe)) {
            snprintf(why, whylen, "frontend %u is gone (squishd said so)", fe);
            send_error(d, SQ_PROTOCOL, why);
            return -1;
        }
        /* A frontend that dials again replaces its older connection (one
         * half-open, say): outputs go to the newest. */
        dconn_t *old;
        while ((old = ready_conn(dp, fe)) != NULL) {
            old->replaced = 1; /* the frontend is not closed: it is here */
            conn_close(old, "replaced");
        }
        /* A frontend of this host attaches its arena: mapped read-only, its
         * rows are read from there. */
        int afd = d->local ? sq_conn_take_fd(&d->conn) : -1;
        if (afd >= 0) {
            struct stat st;
            void *map = fstat(afd, &st) == 0 && st.st_size > 0
                            ? mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, afd, 0)
                            : MAP_FAILED;
            close(afd);
            if (map == MAP_FAILED) {
                snprintf(why, whylen, "cannot map the frontend's arena: %s", strerror(errno));
                send_error(d, SQ_IO, why);
                return -1;
            }
            d->shm = map;
            d->shm_len = (size_t)st.st_size;
        }
        d->state = D_READY;
        d->frontend = fe;
        wk__rows_frontend(dp->s->rows, fe, ROWS_FE_UP);
        SQ_INFO("frontend data connection up frontend=%u addr=%s shared_memory=%s", fe, d->addr,
                d->shm != NULL ? "yes" : "no");
        return 0;
    }
    }
    return -1;
}

static int on_frame(dconn_t *d, const sq_frame_t *f, char *why, size_t whylen)
{
    if (d->state != D_READY)
        return on_handshake_frame(d, f, why, whylen);
    switch (f->type) {
    case SQ_MSG_PING:
        return sq_conn_send(&d->conn, SQ_MSG_PONG, f->id, f->payload, f->len) < 0 ? -1 : 0;
    case SQ_MSG_DATA_ROWS: {
        sq_data_rows_t *m = sq_xmalloc(sizeof(*m));
        int rc = sq_data_rows_decode(f, m);
        uint8_t *copy = NULL;
        if (rc == 0 && m->shm) {
            /* Offsets in the frontend's arena: its rows, gathered here. */
            uint64_t present = 0;
            for (uint32_t k = 0; k < m->n; k++)
                present += m->present[k];
            if (d->shm == NULL || present * m->row_bytes > (uint64_t)1 << 32)
                rc = SQ_PROTOCOL;
            else if (present > 0)
                copy = sq_xmalloc(present * m->row_bytes);
            uint64_t at = 0;
            for (uint32_t k = 0; k < m->n && rc == 0; k++) {
                if (!m->present[k])
                    continue;
                if (m->off[k] > d->shm_len || m->row_bytes > d->shm_len - m->off[k]) {
                    rc = SQ_PROTOCOL;
                    break;
                }
                memcpy(copy + at, d->shm + m->off[k], m->row_bytes);
                at += m->row_bytes;
            }
            m->bytes = copy;
            m->nbytes = at;
        }
        if (rc == 0)
            rc = wk__rows_put(d->dp->s->rows, d->frontend, f->id, m, sq_now_ns());
        free(copy);
        if (rc != 0)
            snprintf(why, whylen, "%s DATA_ROWS batch=%llu",
                     rc == SQ_TOO_LARGE ? "too many rows held for" : "bad",
                     (unsigned long long)f->id);
        else
            SQ_DEBUG("frontend rows frontend=%u batch=%llu rows=%u", d->frontend,
                     (unsigned long long)f->id, m->n);
        free(m);
        return rc != 0 ? -1 : 0;
    }
    default:
        snprintf(why, whylen, "unexpected %s", sq_msg_name(f->type) ? sq_msg_name(f->type) : "?");
        return -1;
    }
}

static void on_conn_io(sq_loop_t *loop, int fd, int events, void *data)
{
    dconn_t *d = data;
    if (events & SQ_EV_WRITE) {
        int rc = sq_conn_flush(&d->conn);
        if (rc < 0) {
            conn_close(d, "write_error");
            return;
        }
        sq_loop_modify(loop, fd, SQ_EV_READ | (rc == 1 ? SQ_EV_WRITE : 0));
    }
    if (!(events & SQ_EV_READ))
        return;
    int rc = sq_conn_read(&d->conn);
    if (rc == 0) {
        conn_close(d, "eof");
        return;
    }
    if (rc < 0 && rc != -EAGAIN) {
        conn_close(d, "read_error");
        return;
    }
    if (d->state != D_READY && d->conn.in.len - d->conn.in_off > DATA_HANDSHAKE_MAX_BYTES) {
        conn_close(d, "handshake_too_large");
        return;
    }
    sq_frame_t f;
    while ((rc = sq_conn_next(&d->conn, &f)) == 1) {
        char why[200] = "";
        if (on_frame(d, &f, why, sizeof(why)) != 0) {
            SQ_WARN("frontend data connection: %s addr=%s", why, d->addr);
            conn_close(d, "protocol_error");
            return;
        }
    }
    if (rc < 0) {
        conn_close(d, "bad_frame");
        return;
    }
    if (sq_conn_pending(&d->conn))
        sq_loop_modify(loop, fd, SQ_EV_READ | SQ_EV_WRITE);
}

static void on_accept(sq_loop_t *loop, int fd, int events, void *data)
{
    struct data_plane *dp = data;
    server_t *s = dp->s;
    (void)events;
    for (;;) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        int cfd = accept4(fd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (cfd < 0)
            return;
        int local = fd == dp->local_fd;
        int one = 1;
        if (!local) {
            setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
            setsockopt(cfd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
        }
        /* Too many in their handshake: the oldest goes. */
        dconn_t *oldest = NULL;
        int n = 0;
        for (dconn_t *d = dp->conns; d != NULL; d = d->next)
            if (d->state != D_READY) {
                n++;
                if (oldest == NULL || d->accepted_ns <= oldest->accepted_ns)
                    oldest = d;
            }
        if (n >= DATA_MAX_HANDSHAKES) {
            int64_t now = sq_now_ns();
            dp->evicted++;
            if (now - dp->evicted_logged_ns > 1000000000) {
                SQ_WARN("too many data connections in their handshake (max=%d): closing the "
                        "oldest evicted=%llu",
                        DATA_MAX_HANDSHAKES, (unsigned long long)dp->evicted);
                dp->evicted_logged_ns = now;
            }
            conn_close(oldest, "too_many_handshakes");
        }
        dconn_t *d = sq_xcalloc(1, sizeof(*d));
        d->dp = dp;
        d->accepted_ns = sq_now_ns();
        d->local = local;
        if (local)
            snprintf(d->addr, sizeof(d->addr), "local");
        else
            format_addr(&ss, 1, 0, d->addr, sizeof(d->addr));
        sq_conn_init(&d->conn, cfd);
        const char *why = NULL;
        if (sq_auth_init(&d->auth, SQ_AUTH_GATEWAY, s->o.token, s->o.token_len, NULL) != 0)
            why = "cannot start its authentication";
        else if (!local && s->o.data_tls != NULL &&
                 sq_tls_attach(s->o.data_tls, &d->conn, NULL, d->addr) != 0)
            why = "cannot start TLS";
        else if (sq_loop_watch(loop, cfd, SQ_EV_READ, on_conn_io, d) != 0)
            why = "cannot watch it";
        if (why != NULL) {
            SQ_WARN("frontend data connection dropped addr=%s: %s", d->addr, why);
            sq_conn_dispose(&d->conn);
            sq_auth_wipe(&d->auth);
            free(d);
            continue;
        }
        d->next = dp->conns;
        dp->conns = d;
    }
}

/* Every DATA_TICK_MS: handshakes that take too long go; rows nobody
 * claimed are dropped. */
static void on_tick(sq_loop_t *loop, uint64_t id, void *data)
{
    struct data_plane *dp = data;
    (void)id;
    int64_t now = sq_now_ns();
    for (dconn_t *d = dp->conns, *n; d != NULL; d = n) {
        n = d->next;
        if (d->state != D_READY && now - d->accepted_ns > (int64_t)DATA_HANDSHAKE_MS * 1000000)
            conn_close(d, "handshake_timeout");
    }
    wk__rows_expire(dp->s->rows, now);
    dp->tick_timer = sq_loop_timer_at(loop, now + (int64_t)DATA_TICK_MS * 1000000, on_tick, dp);
}

/* send_data: a reply the execution thread posted for a frontend. */
static void send_data(server_t *s, uint32_t frontend, uint16_t type, uint64_t id,
                      const sq_buf_t *payload)
{
    dconn_t *d = s->data != NULL ? ready_conn(s->data, frontend) : NULL;
    if (d == NULL) {
        SQ_DEBUG("no data connection for frontend=%u: %s dropped batch=%llu", frontend,
                 sq_msg_name(type), (unsigned long long)id);
        return;
    }
    if (sq_conn_send(&d->conn, type, id, payload->data, (uint32_t)payload->len) < 0) {
        conn_close(d, "write_error");
        return;
    }
    if (sq_conn_pending(&d->conn))
        sq_loop_modify(s->loop, d->conn.fd, SQ_EV_READ | SQ_EV_WRITE);
}

int wk__data_start(server_t *s)
{
    if (s->o.data_bound[0] == '\0')
        return 0;
    struct data_plane *dp = sq_xcalloc(1, sizeof(*dp));
    dp->s = s;
    dp->local_fd = -1;
    int rc = sq_loop_watch(s->loop, s->o.data_fd, SQ_EV_READ, on_accept, dp);
    if (rc != 0) {
        SQ_ERROR("cannot watch the data listener error=\"%s\"", strerror(-rc));
        free(dp);
        return rc;
    }
    dp->tick_timer =
        sq_loop_timer_at(s->loop, sq_now_ns() + (int64_t)DATA_TICK_MS * 1000000, on_tick, dp);
    s->data = dp;
    s->send_data = send_data;
    SQ_INFO("data listener addr=%s tls=%s", s->o.data_bound, s->o.data_tls != NULL ? "yes" : "no");
    return 0;
}

void wk__data_stop(server_t *s)
{
    struct data_plane *dp = s->data;
    if (dp == NULL)
        return;
    while (dp->conns != NULL)
        conn_close(dp->conns, "stopping");
    sq_loop_unwatch(s->loop, s->o.data_fd);
    if (dp->local_fd >= 0) {
        sq_loop_unwatch(s->loop, dp->local_fd);
        close(dp->local_fd);
    }
    sq_loop_timer_cancel(s->loop, dp->tick_timer);
    s->send_data = NULL;
    s->data = NULL;
    free(dp);
}

/* The address frontends are to dial: --data-advertise, or the bound one
 * with a wildcard host replaced by this end of the link to squishd (the
 * interface squishd reaches this host on). */
static void advertised(server_t *s, char *out, size_t outlen)
{
    char host[128];
    int port = 0;
    if (s->o.data_advertise[0] != '\0' ||
        sq_hostport_split(s->o.data_bound, host, sizeof(host), &port) != 0 ||
        (strcmp(host, "0.0.0.0") != 0 && strcmp(host, "::") != 0)) {
        snprintf(out, outlen, "%s",
                 s->o.data_advertise[0] != '\0' ? s->o.data_advertise : s->o.data_bound);
        return;
    }
    struct sockaddr_storage ss = {0};
    socklen_t sl = sizeof(ss);
    if (s->conn == NULL || getsockname(s->conn->fd, (struct sockaddr *)&ss, &sl) != 0)
        ss.ss_family = AF_UNIX; /* 127.0.0.1 */
    format_addr(&ss, 0, port, out, outlen);
}

/* The local data socket for the address told (made again when it changes):
 * a frontend on this host dials SQ_DATA_LOCAL_PREFIX + that address in the
 * abstract namespace before TCP. */
static void local_listen(struct data_plane *dp, const char *addr)
{
    char name[108];
    int n = snprintf(name, sizeof(name), "%s%s", SQ_DATA_LOCAL_PREFIX, addr);
    if (n <= 0 || (size_t)n >= sizeof(name) - 1 ||
        (dp->local_fd >= 0 && strcmp(name, dp->local_name) == 0))
        return;
    if (dp->local_fd >= 0) {
        sq_loop_unwatch(dp->s->loop, dp->local_fd);
        close(dp->local_fd);
        dp->local_fd = -1;
    }
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    memcpy(sa.sun_path + 1, name, (size_t)n); /* sun_path[0] == 0: abstract */
    socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, len) != 0 || listen(fd, 64) != 0 ||
        sq_loop_watch(dp->s->loop, fd, SQ_EV_READ, on_accept, dp) != 0) {
        SQ_WARN("no local data socket name=%s error=\"%s\": frontends on this host use TCP", name,
                strerror(errno));
        if (fd >= 0)
            close(fd);
        return;
    }
    dp->local_fd = fd;
    snprintf(dp->local_name, sizeof(dp->local_name), "%s", name);
    SQ_INFO("local data socket name=@%s", name);
}

void wk__data_announce(server_t *s)
{
    if (s->data == NULL || s->conn == NULL)
        return;
    char addr[128];
    advertised(s, addr, sizeof(addr));
    local_listen(s->data, addr);
    sq_buf_t b;
    sq_buf_init(&b);
    sq_buf_put_str(&b, addr);
    int rc = sq_conn_send(s->conn, SQ_MSG_WORKER_DATA, 0, b.data, (uint32_t)b.len);
    sq_buf_dispose(&b);
    if (rc == 0 && sq_conn_pending(s->conn))
        sq_loop_modify(s->loop, s->conn->fd, SQ_EV_READ | SQ_EV_WRITE);
    SQ_INFO("data address told to squishd addr=%s", addr);
}
