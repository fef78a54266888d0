#include "sq_dial.h"

#include "sq_auth.h"
#include "sq_clock.h"
#include "sq_error.h"
#include "sq_text.h"
#include "sq_tls.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int sq_dial_tcp(const char *addr, int timeout_ms)
{
    char host[256], port[8];
    int portnum;
    if (sq_hostport_split(addr, host, sizeof(host), &portnum) != 0)
        return -EINVAL;
    snprintf(port, sizeof(port), "%d", portnum);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *ai = NULL;
    if (getaddrinfo(host, port, &hints, &ai) != 0)
        return -EHOSTUNREACH;
    int fd = -1, err = ECONNREFUSED;
    for (struct addrinfo *p = ai; p != NULL && fd < 0; p = p->ai_next) {
        fd = socket(p->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) {
            err = errno;
            continue;
        }
        if (connect(fd, p->ai_addr, p->ai_addrlen) != 0 && errno != EINPROGRESS) {
            err = errno;
            close(fd);
            fd = -1;
            continue;
        }
        struct pollfd pf = {.fd = fd, .events = POLLOUT};
        int so = 0;
        socklen_t sl = sizeof(so);
        int n = poll(&pf, 1, timeout_ms);
        if (n <= 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &so, &sl) != 0 || so != 0) {
            err = n == 0 ? ETIMEDOUT : (so != 0 ? so : errno);
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(ai);
    if (fd < 0)
        return -err;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
    return fd;
}

int sq_listen_tcp(const char *spec, char *bound, size_t boundlen, char *err, size_t errlen)
{
    char host[128], port[8];
    int portnum;
    if (sq_hostport_split(spec, host, sizeof(host), &portnum) != 0) {
        snprintf(err, errlen, "%s: expected ADDR:PORT or [IPV6]:PORT", spec);
        return -1;
    }
    snprintf(port, sizeof(port), "%d", portnum);
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICHOST | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    int g = getaddrinfo(host, port, &hints, &ai);
    if (g != 0) {
        snprintf(err, errlen, "%s: %s (a numeric address and port)", spec, gai_strerror(g));
        return -1;
    }
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int one = 1;
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
        bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 128) != 0) {
        snprintf(err, errlen, "%s: %s", spec, strerror(errno));
        if (fd >= 0)
            close(fd);
        freeaddrinfo(ai);
        return -1;
    }
    freeaddrinfo(ai);
    struct sockaddr_storage ss = {0};
    socklen_t sl = sizeof(ss);
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    char name[INET6_ADDRSTRLEN] = "?";
    int bport = 0;
    if (ss.ss_family == AF_INET) {
        inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, name, sizeof(name));
        bport = ntohs(((struct sockaddr_in *)&ss)->sin_port);
    } else if (ss.ss_family == AF_INET6) {
        inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, name, sizeof(name));
        bport = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    }
    snprintf(bound, boundlen, ss.ss_family == AF_INET6 ? "[%s]:%d" : "%s:%d", name, bport);
    return fd;
}

int sq_conn_read_frame(sq_conn_t *c, sq_frame_t *f, int timeout_ms)
{
    int64_t deadline = sq_now_ms() + timeout_ms;
    for (;;) {
        int rc = sq_conn_next(c, f);
        if (rc != 0)
            return rc;
        int left = (int)(deadline - sq_now_ms());
        if (left <= 0)
            return -ETIMEDOUT;
        /* What is queued goes first (over TLS: the handshake, then it). */
        int fl = sq_conn_flush(c);
        if (fl < 0)
            return fl;
        struct pollfd p = {.fd = c->fd, .events = (short)(POLLIN | (fl == 1 ? POLLOUT : 0))};
        if (poll(&p, 1, left) < 0 && errno != EINTR)
            return -errno;
        rc = sq_conn_read(c);
        if (rc == 0)
            return -ECONNRESET;
        if (rc < 0 && rc != -EAGAIN)
            return rc;
    }
}

/* The listener's ERROR, if f is one: its code and its message into why. */
static int refused(const sq_frame_t *f, int *code, char *why, size_t whylen)
{
    if (f->type != SQ_MSG_ERROR)
        return 0;
    sq_ipc_error_t e;
    *code = 0;
    if (sq_ipc_error_decode(f, &e) == 0) {
        *code = e.code;
        snprintf(why, whylen, "refused: %s", e.message);
    } else {
        snprintf(why, whylen, "refused");
    }
    return 1;
}

/* sq_dial_auth; *by_peer set when the listener refused this side (its
 * ERROR), not this side the listener. */
static int dial_auth(sq_conn_t *c, const uint8_t *token, size_t token_len, int timeout_ms,
                     char *why, size_t whylen, int *by_peer)
{
    *by_peer = 0;
    sq_auth_t a;
    sq_buf_t b;
    sq_buf_init(&b);
    int rc = sq_auth_init(&a, SQ_AUTH_WORKER, token, token_len, NULL);
    if (rc == 0)
        rc = sq_auth_challenge(&a, &b);
    if (rc != 0) {
        snprintf(why, whylen, "%s", sq_auth_reason(rc));
        sq_auth_wipe(&a);
        sq_buf_dispose(&b);
        return SQ_UNAUTHORIZED;
    }
    rc = sq_conn_send(c, SQ_MSG_AUTH_CHALLENGE, 0, b.data, (uint32_t)b.len);
    sq_frame_t f;
    if (rc == 0)
        rc = sq_conn_read_frame(c, &f, timeout_ms);
    int code = 0;
    if (rc == 1 && refused(&f, &code, why, whylen)) {
        /* Refused for the token, or for something else (a protocol
         * error, which a retry may get past). */
        rc = code == SQ_UNAUTHORIZED ? SQ_UNAUTHORIZED : SQ_PROTOCOL;
        *by_peer = 1;
    } else if (rc == 1 && f.type != SQ_MSG_AUTH_REPLY) {
        snprintf(why, whylen, "expected AUTH_REPLY, got %s", sq_msg_name(f.type));
        rc = SQ_PROTOCOL;
    } else if (rc == 1) {
        b.len = 0;
        int arc = sq_auth_on_reply(&a, f.payload, f.len, &b);
        if (arc != 0) {
            snprintf(why, whylen, "%s%s", sq_auth_reason(arc),
                     arc == SQ_AUTH_BAD_PROOF
                         ? " (the listener's proof does not verify: wrong token on one side)"
                         : "");
            sq_ipc_error_t e = {.code = SQ_UNAUTHORIZED};
            snprintf(e.message, sizeof(e.message), "%s", why);
            b.len = 0;
            sq_ipc_error_encode(&b, &e);
            sq_conn_send(c, SQ_MSG_ERROR, 0, b.data, (uint32_t)b.len);
            rc = SQ_UNAUTHORIZED;
        } else {
            rc = sq_conn_send(c, SQ_MSG_AUTH_PROOF, 0, b.data, (uint32_t)b.len);
        }
    } else if (rc < 0) {
        snprintf(why, whylen, "%s", rc == -ETIMEDOUT ? "no answer" : strerror(-rc));
    }
    sq_auth_wipe(&a);
    sq_buf_dispose(&b);
    return rc;
}

int sq_dial_auth(sq_conn_t *c, const uint8_t *token, size_t token_len, int timeout_ms, char *why,
                 size_t whylen)
{
    int by_peer;
    return dial_auth(c, token, token_len, timeout_ms, why, whylen, &by_peer);
}

int sq_dial_open(sq_conn_t *c, const char *addr, int fd, const sq_dial_opts_t *o,
                 sq_dial_step_t *failed, char *why, size_t whylen)
{
    sq_dial_step_t step = SQ_DIAL_CONNECT;
    int rc = 0;
    if (fd < 0)
        fd = sq_dial_tcp(addr, o->dial_timeout_ms);
    if (fd < 0) {
        snprintf(why, whylen, "cannot connect: %s", strerror(-fd));
        rc = fd;
    } else {
        sq_conn_init(c, fd);
    }
    if (rc == 0 && o->tls != NULL) {
        step = SQ_DIAL_TLS;
        char host[256];
        int port;
        sq_hostport_split(addr, host, sizeof(host), &port);
        if (sq_tls_attach(o->tls, c, host, addr) != 0) {
            snprintf(why, whylen, "cannot start TLS");
            rc = SQ_IO;
        }
    }
    if (rc == 0) {
        step = SQ_DIAL_AUTH;
        int by_peer;
        rc = dial_auth(c, o->token, o->token_len, o->auth_timeout_ms, why, whylen, &by_peer);
        if (rc != 0 && by_peer)
            step = SQ_DIAL_REFUSED;
    }
    if (rc != 0 && fd >= 0)
        sq_conn_dispose(c);
    if (failed != NULL)
        *failed = rc == 0 ? SQ_DIAL_OK : step;
    return rc;
}
