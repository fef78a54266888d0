/* squish-loadgen's connections (loadgen.c has the whole story): a pool of
 * non-blocking HTTP/1.1 keep-alive connections on one epoll, a request
 * written on each, and its answer read and classified (status, Retry-After,
 * chunked or sized body). */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "sq_alloc.h"

#include "loadgen_int.h"

/* ---- connections ------------------------------------------------------ */

static void conn_watch(lg_run_t *r, int slot, int want_write, int op)
{
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | (want_write ? EPOLLOUT : 0u),
                             .data.u32 = (uint32_t)slot};
    if (epoll_ctl(r->ep, op, r->conns[slot].fd, &ev) != 0) {
        perror("squish-loadgen: epoll_ctl");
        abort();
    }
}

void lg_conn_close(lg_run_t *r, int slot)
{
    lg_conn_t *c = &r->conns[slot];
    if (c->state == CONN_IDLE) {
        for (int i = 0; i < r->nidle; i++) {
            if (r->idle[i] == slot) {
                r->idle[i] = r->idle[--r->nidle];
                break;
            }
        }
    }
    epoll_ctl(r->ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    c->fd = -1;
    c->state = CONN_FREE;
    c->req = -1;
    c->rlen = 0;
    c->served = 0;
    r->nopen--;
}

/* A new non-blocking connection in CONNECTING state; -1 when none can be
 * opened (the limit, or the kernel refusing). */
int lg_conn_open(lg_run_t *r)
{
    if (r->nopen >= r->o->max_conns)
        return -1;
    int slot = 0;
    while (r->conns[slot].state != CONN_FREE)
        slot++;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (connect(fd, (const struct sockaddr *)&r->o->addr, sizeof(r->o->addr)) != 0 &&
        errno != EINPROGRESS) {
        close(fd);
        return -1;
    }
    lg_conn_t *c = &r->conns[slot];
    c->fd = fd;
    c->state = CONN_CONNECTING;
    c->req = -1;
    c->rlen = 0;
    c->served = 0;
    r->nopen++;
    r->opened++;
    conn_watch(r, slot, 1, EPOLL_CTL_ADD);
    return slot;
}

void lg_finish(lg_run_t *r, long i, outcome_t out, int status)
{
    lg_req_t *q = &r->reqs[i];
    q->done_ns = now_ns() - r->t0;
    q->status = status;
    q->outcome = out;
    r->inflight--;
}

/* Writes what the socket takes of the current request. */
static void conn_write(lg_run_t *r, int slot)
{
    lg_conn_t *c = &r->conns[slot];
    while (c->written < r->o->wire_len) {
        ssize_t n = write(c->fd, r->o->wire + c->written, r->o->wire_len - c->written);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN) {
            if (c->state != CONN_WRITING) {
                c->state = CONN_WRITING;
                conn_watch(r, slot, 1, EPOLL_CTL_MOD);
            }
            return;
        }
        if (n <= 0) {
            long i = c->req;
            lg_conn_close(r, slot);
            lg_finish(r, i, OUT_CONN_ERROR, 0);
            return;
        }
        c->written += (size_t)n;
    }
    int was_writing = c->state == CONN_WRITING;
    c->state = CONN_READING;
    if (was_writing)
        conn_watch(r, slot, 0, EPOLL_CTL_MOD);
}

void lg_conn_start(lg_run_t *r, int slot, long i)
{
    lg_conn_t *c = &r->conns[slot];
    c->req = i;
    c->written = 0;
    c->rlen = 0;
    if (r->reqs[i].sent_ns == 0)
        r->reqs[i].sent_ns = now_ns() - r->t0;
    if (c->state == CONN_CONNECTING)
        return;              /* written once connected */
    c->state = CONN_READING; /* conn_write switches to WRITING on a short write */
    conn_write(r, slot);
}

/* ---- responses -------------------------------------------------------- */

/* 1 when the chunked body starting at p is complete; *end past it. */
static int chunked_complete(const char *p, const char *lim, const char **end)
{
    for (;;) {
        char *e;
        unsigned long n = strtoul(p, &e, 16);
        const char *crlf = memmem(e, (size_t)(lim - e), "\r\n", 2);
        if (crlf == NULL || e == p)
            return 0;
        p = crlf + 2;
        if (n == 0) {
            /* no trailers expected: the final CRLF */
            if (lim - p < 2)
                return 0;
            *end = p + 2;
            return 1;
        }
        if ((unsigned long)(lim - p) < n + 2)
            return 0;
        p += n + 2;
    }
}

static const char *find_header(const char *head, const char *head_end, const char *name)
{
    size_t nl = strlen(name);
    for (const char *p = head; p < head_end;) {
        const char *eol = memmem(p, (size_t)(head_end - p), "\r\n", 2);
        if (eol == NULL)
            eol = head_end;
        if ((size_t)(eol - p) > nl && strncasecmp(p, name, nl) == 0 && p[nl] == ':') {
            const char *v = p + nl + 1;
            while (*v == ' ')
                v++;
            return v;
        }
        p = eol + 2;
    }
    return NULL;
}

/* Parses a complete answer in c->rbuf: 1 complete (status, body), 0 more
 * bytes needed, -1 malformed. */
static int parse_answer(lg_conn_t *c, int *status, const char **body, size_t *body_len,
                        int *close_after)
{
    const char *buf = c->rbuf, *lim = c->rbuf + c->rlen;
    const char *hend = memmem(buf, c->rlen, "\r\n\r\n", 4);
    if (hend == NULL)
        return c->rlen > 65536 ? -1 : 0;
    if (c->rlen < 12 || strncmp(buf, "HTTP/1.", 7) != 0)
        return -1;
    *status = atoi(buf + 9);
    const char *conn = find_header(buf, hend, "connection");
    *close_after = conn != NULL && strncasecmp(conn, "close", 5) == 0;
    const char *start = hend + 4;
    const char *cl = find_header(buf, hend, "content-length");
    const char *te = find_header(buf, hend, "transfer-encoding");
    if (cl != NULL) {
        size_t n = strtoul(cl, NULL, 10);
        if ((size_t)(lim - start) < n)
            return 0;
        *body = start;
        *body_len = n;
        return 1;
    }
    if (te != NULL && strncasecmp(te, "chunked", 7) == 0) {
        const char *end;
        if (!chunked_complete(start, lim, &end))
            return 0;
        *body = start;
        *body_len = (size_t)(end - start);
        return 1;
    }
    return -1; /* no length: this loadgen does not read to EOF */
}

static void conn_read(lg_run_t *r, int slot)
{
    lg_conn_t *c = &r->conns[slot];
    for (;;) {
        if (c->rcap - c->rlen < 4096) {
            c->rcap = c->rcap ? c->rcap * 2 : 16384;
            c->rbuf = sq_xrealloc(c->rbuf, c->rcap + 1);
        }
        ssize_t n = read(c->fd, c->rbuf + c->rlen, c->rcap - c->rlen);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            break;
        if (n <= 0) {
            long i = c->req;
            int retry = i >= 0 && c->rlen == 0 && c->served > 0;
            lg_conn_close(r, slot);
            if (i < 0)
                return; /* an idle connection the server closed */
            if (retry) {
                /* The server closed a keep-alive connection as we reused
                 * it (its idle timeout): not an answer; send again. */
                r->retries++;
                int s = lg_conn_open(r);
                if (s >= 0) {
                    lg_conn_start(r, s, i);
                    return;
                }
            }
            lg_finish(r, i, OUT_CONN_ERROR, 0);
            return;
        }
        c->rlen += (size_t)n;
    }
    if (c->req < 0) {
        /* bytes on an idle connection: the server is confused; drop it */
        r->stray++;
        lg_conn_close(r, slot);
        return;
    }
    int status = 0, close_after = 0;
    const char *body = NULL;
    size_t body_len = 0;
    int rc = parse_answer(c, &status, &body, &body_len, &close_after);
    if (rc == 0)
        return;
    long i = c->req;
    if (rc < 0) {
        lg_conn_close(r, slot);
        lg_finish(r, i, OUT_CONN_ERROR, 0);
        return;
    }
    outcome_t out;
    /* The SLO clock starts at the first byte written (what squishd can
     * see); the loadgen's own lag before it is reported apart. */
    int64_t latency_ns = now_ns() - r->t0 - r->reqs[i].sent_ns;
    c->rbuf[(body - c->rbuf) + (long)body_len] = '\0';
    const char *hend = memmem(c->rbuf, c->rlen, "\r\n\r\n", 4);
    int retry_after = find_header(c->rbuf, hend, "retry-after") != NULL;
    if (status == 200)
        out = latency_ns <= (int64_t)(r->o->late_ms * 1e6) ? OUT_GOOD : OUT_LATE;
    else if (status == 503 && retry_after &&
             (memmem(body, body_len, "\"deadline\"", 10) != NULL ||
              memmem(body, body_len, "\"overloaded\"", 12) != NULL))
        out = OUT_DROPPED; /* shed for the SLO: too late, or early-drop's window */
    else
        out = OUT_ERROR;
    if (status == 503 && !retry_after)
        r->no_retry_after++;
    if (out == OUT_ERROR && r->errors_logged++ < 5)
        fprintf(stderr, "squish-loadgen: status %d: %.*s\n", status,
                (int)(body_len < 300 ? body_len : 300), body);
    lg_finish(r, i, out, status);
    c->served++;
    c->req = -1;
    c->rlen = 0;
    if (close_after) {
        lg_conn_close(r, slot);
        return;
    }
    c->state = CONN_IDLE;
    r->idle[r->nidle++] = slot;
}

void lg_on_event(lg_run_t *r, int slot, uint32_t events)
{
    lg_conn_t *c = &r->conns[slot];
    if (c->state == CONN_CONNECTING) {
        int err = 0;
        socklen_t el = sizeof(err);
        getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &el);
        if (err != 0 || (events & (EPOLLERR | EPOLLHUP))) {
            long i = c->req;
            lg_conn_close(r, slot);
            if (i >= 0)
                lg_finish(r, i, OUT_CONN_ERROR, 0);
            return;
        }
        if (!(events & EPOLLOUT))
            return;
        if (c->req >= 0) {
            c->state = CONN_WRITING;
            conn_write(r, slot);
        } else {
            c->state = CONN_IDLE;
            conn_watch(r, slot, 0, EPOLL_CTL_MOD);
            r->idle[r->nidle++] = slot;
        }
        return;
    }
    if (c->state == CONN_WRITING && (events & EPOLLOUT))
        conn_write(r, slot);
    if (c->state != CONN_FREE && (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)))
        conn_read(r, slot);
}
