/* A frontend's management routes (gw_http.h: gw_proxy_to_dispatcher):
 * uploads, deletes, model lists and metadata, model control, the plan.
 * They belong to the cluster's one model DB and dispatcher, so a frontend
 * forwards them to the dispatcher's HTTP address as they came (method,
 * path and query, the headers that carry meaning, the body) and answers
 * with the dispatcher's answer: the same view from every frontend. Another
 * transport's method that asks what such a route answers (gRPC's
 * ModelMetadata on a frontend) goes the same way (gw_proxy_json), its
 * answer read as JSON.
 *
 * Each forward runs on a thread of its own, blocking: a model load may
 * take two minutes to answer, and nothing on the data path (the HTTP
 * loops, the offload thread) may wait for it. Management traffic is rare;
 * a thread per request is its whole cost. */
#include "http_int.h"
#include "gw_front.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* How long the dispatcher may take to answer (model control's load waits
 * up to 120 s), and the most of its answer this takes. */
#define PROXY_TIMEOUT_MS 150000
#define PROXY_MAX_ANSWER (64u << 20)
#define NOT_JOINED                                                                                 \
    "this frontend has not joined its dispatcher yet, which answers this route; retry"

/* The request headers forwarded: what the dispatcher's routes read. The
 * body is the one h2o gave the route (inflated when it came compressed),
 * so Content-Encoding is not among them. */
static const char *const forwarded[] = {"authorization", "content-type", "x-slo-ms", "x-priority",
                                        "inference-header-content-length"};

/* Answer headers passed back to the client. */
static const char *const returned[] = {"content-type",     "retry-after",
                                       "location",         "allow",
                                       "www-authenticate", "inference-header-content-length"};
#define NRETURNED (sizeof(returned) / sizeof(returned[0]))

_Static_assert(NRETURNED <= GW_ASYNC_MAX_HEADERS, "a raw reply holds every returned header");

/* The dispatcher's answer comes back as the job's raw reply (status,
 * headers, body): data that http.c sends, with no hook of this file's. */
typedef struct {
    gw_async_t a; /* first */
    char addr[128];
    sq_buf_t request; /* disposed by the forwarding thread once written */
} proxy_job_t;

/* Blocking I/O with one deadline. */
static int write_all(int fd, const uint8_t *p, size_t n, int64_t deadline_ms)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
            continue;
        }
        if (w < 0 && errno != EAGAIN && errno != EINTR)
            return -errno;
        int left = (int)(deadline_ms - sq_now_ms());
        struct pollfd pf = {.fd = fd, .events = POLLOUT};
        if (left <= 0 || poll(&pf, 1, left) == 0)
            return -ETIMEDOUT;
    }
    return 0;
}

/* Reads until the dispatcher closes (the request was HTTP/1.0), into
 * *raw (malloc'd, *len bytes; freed by the caller whatever the result). */
static int read_all(int fd, uint8_t **raw, size_t *len, int64_t deadline_ms)
{
    size_t cap = 64 << 10;
    *raw = sq_xmalloc(cap);
    *len = 0;
    for (;;) {
        if (*len == cap) {
            if (cap >= PROXY_MAX_ANSWER)
                return -EFBIG;
            cap *= 2;
            *raw = sq_xrealloc(*raw, cap);
        }
        ssize_t r = read(fd, *raw + *len, cap - *len);
        if (r > 0) {
            *len += (size_t)r;
            continue;
        }
        if (r == 0)
            return 0;
        if (errno != EAGAIN && errno != EINTR)
            return -errno;
        int left = (int)(deadline_ms - sq_now_ms());
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        if (left <= 0 || poll(&pf, 1, left) == 0)
            return -ETIMEDOUT;
    }
}

/* One exchange with the dispatcher's HTTP at addr, blocking: the request
 * written (and disposed), the whole answer read into *raw (*len bytes;
 * the caller frees it). 0, or -errno. */
static int exchange(const char *addr, sq_buf_t *request, uint8_t **raw, size_t *len)
{
    int64_t deadline = sq_now_ms() + PROXY_TIMEOUT_MS;
    int fd = sq_dial_tcp(addr, 2000);
    int rc = fd < 0 ? fd : 0;
    if (rc == 0)
        rc = write_all(fd, request->data, request->len, deadline);
    sq_buf_dispose(request);
    if (rc == 0)
        rc = read_all(fd, raw, len, deadline);
    if (fd >= 0)
        close(fd);
    return rc;
}

/* The answer's status line: its status, and where its body starts in
 * *body_off; the head's end is terminated there. 0, or -1 when it is not
 * HTTP. */
static int status_of(char *p, size_t n, int *status, size_t *body_off)
{
    char *end = memmem(p, n, "\r\n\r\n", 4);
    if (end == NULL || n < 12 || strncmp(p, "HTTP/1.", 7) != 0)
        return -1;
    *body_off = (size_t)(end - p) + 4;
    *end = '\0';
    *status = atoi(p + 9);
    return *status < 100 || *status > 599 ? -1 : 0;
}

/* The status line and the returned headers of the answer (in the order
 * of returned[], the first of each); 0, or -1 when it is not HTTP. */
static int parse_answer(proxy_job_t *j)
{
    gw_async_t *a = &j->a;
    char *p = (char *)a->raw;
    if (status_of(p, a->raw_len, &a->status, &a->raw_off) != 0)
        return -1;
    char *end = p + a->raw_off - 4;
    char *found[NRETURNED] = {NULL};
    for (char *line = strstr(p, "\r\n"); line != NULL && line < end;) {
        line += 2;
        char *next = strstr(line, "\r\n");
        if (next != NULL)
            *next = '\0';
        char *colon = strchr(line, ':');
        if (colon != NULL) {
            *colon = '\0';
            const char *v = colon + 1;
            while (*v == ' ')
                v++;
            for (size_t i = 0; i < NRETURNED; i++)
                if (strcasecmp(line, returned[i]) == 0 && found[i] == NULL)
                    found[i] = strdup(v);
        }
        line = next;
    }
    for (size_t i = 0; i < NRETURNED; i++)
        if (found[i] != NULL)
            a->raw_headers[a->nraw_headers++] = (gw_async_header_t){returned[i], found[i]};
    return 0;
}

static void *proxy_thread(void *arg)
{
    proxy_job_t *j = arg;
    int rc = exchange(j->addr, &j->request, &j->a.raw, &j->a.raw_len);
    if (rc != 0)
        gw_async_fail(&j->a, SQ_NOT_READY,
                      "this frontend could not reach its dispatcher's HTTP at %s (%s); retry",
                      j->addr, strerror(-rc));
    else if (parse_answer(j) != 0)
        gw_async_fail(&j->a, SQ_PROTOCOL, "the dispatcher at %s answered something not HTTP",
                      j->addr);
    gw_async_done(&j->a);
    return NULL;
}

/* The request's head up to its headers: method, path, host, HTTP/1.0
 * with connection close (the answer ends where the connection does). */
static void put_head(sq_buf_t *b, const char *method, size_t mlen, const char *path, size_t plen,
                     const char *addr)
{
    sq_buf_put(b, method, mlen);
    sq_buf_put(b, " ", 1);
    sq_buf_put(b, path, plen);
    char line[160];
    int n = snprintf(line, sizeof(line), " HTTP/1.0\r\nhost: %s\r\nconnection: close\r\n", addr);
    sq_buf_put(b, line, (size_t)n);
}

static void put_header(sq_buf_t *b, const char *name, const char *value, size_t vlen)
{
    sq_buf_put(b, name, strlen(name));
    sq_buf_put(b, ": ", 2);
    sq_buf_put(b, value, vlen);
    sq_buf_put(b, "\r\n", 2);
}

/* Its length, the head's end, and the body. */
static void put_body(sq_buf_t *b, const void *body, size_t len)
{
    char line[64];
    int n = snprintf(line, sizeof(line), "content-length: %zu\r\n\r\n", len);
    sq_buf_put(b, line, (size_t)n);
    if (len > 0)
        sq_buf_put(b, body, len);
}

/* Runs fn(arg) on a detached thread of its own; 0, or -1 when none could
 * start. */
static int start_thread(void *(*fn)(void *), void *arg)
{
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&t, &attr, fn, arg) != 0 ? -1 : 0;
    pthread_attr_destroy(&attr);
    return rc;
}

void gw_proxy_to_dispatcher(gw_call_t *call)
{
    h2o_req_t *req = call->req;
    char addr[128];
    gw_front_dispatcher_http(call->http->front, addr, sizeof(addr));
    if (addr[0] == '\0') {
        gw_send_error(req, SQ_NOT_READY, NOT_JOINED);
        return;
    }
    const uint8_t *body = NULL;
    size_t body_len = 0;
    uint8_t *owned = NULL;
    if (req->entity.base != NULL && gw_request_body(req, &body, &body_len, &owned) != 0) {
        gw_send_error(req, SQ_OVERLOAD, "no memory to forward the body");
        return;
    }
    proxy_job_t *j = (proxy_job_t *)gw_async_new(call, sizeof(*j));
    snprintf(j->addr, sizeof(j->addr), "%s", addr);
    sq_buf_init(&j->request);
    sq_buf_t *b = &j->request;
    put_head(b, req->method.base, req->method.len, req->path.base, req->path.len, addr);
    for (size_t i = 0; i < sizeof(forwarded) / sizeof(forwarded[0]); i++) {
        h2o_iovec_t v = gw_header(req, forwarded[i]);
        if (v.base != NULL)
            put_header(b, forwarded[i], v.base, v.len);
    }
    put_body(b, body, body_len);
    free(owned);
    if (start_thread(proxy_thread, j) != 0) {
        sq_buf_dispose(&j->request);
        gw_async_fail(&j->a, SQ_OVERLOAD, "no thread to forward the request; retry");
        gw_async_done(&j->a);
    }
}

/* A forward of another transport's (gw_proxy_json), on its thread. */
typedef struct {
    char addr[128];
    sq_buf_t request;
    gw_proxy_fn fn;
    void *arg;
} json_job_t;

static void *json_thread(void *arg)
{
    json_job_t *j = arg;
    uint8_t *raw = NULL;
    size_t len = 0, off = 0;
    int status = 0;
    int rc = exchange(j->addr, &j->request, &raw, &len);
    char why[256];
    if (rc != 0) {
        snprintf(why, sizeof(why),
                 "this frontend could not reach its dispatcher's HTTP at %s (%s); retry", j->addr,
                 strerror(-rc));
        j->fn(j->arg, SQ_NOT_READY, 0, NULL, why);
    } else if (status_of((char *)raw, len, &status, &off) != 0) {
        snprintf(why, sizeof(why), "the dispatcher at %s answered something not HTTP", j->addr);
        j->fn(j->arg, SQ_PROTOCOL, 0, NULL, why);
    } else {
        json_t *body = json_loadb((const char *)raw + off, len - off, 0, NULL);
        j->fn(j->arg, 0, status, body, "");
    }
    free(raw);
    free(j);
    return NULL;
}

void gw_proxy_json(gw_front_t *front, const char *method, const char *path,
                   const char *authorization, const char *body, gw_proxy_fn fn, void *arg)
{
    char addr[128];
    gw_front_dispatcher_http(front, addr, sizeof(addr));
    if (addr[0] == '\0') {
        fn(arg, SQ_NOT_READY, 0, NULL, NOT_JOINED);
        return;
    }
    json_job_t *j = sq_xcalloc(1, sizeof(*j));
    snprintf(j->addr, sizeof(j->addr), "%s", addr);
    j->fn = fn;
    j->arg = arg;
    sq_buf_init(&j->request);
    sq_buf_t *b = &j->request;
    put_head(b, method, strlen(method), path, strlen(path), addr);
    if (authorization != NULL)
        put_header(b, "authorization", authorization, strlen(authorization));
    if (body != NULL)
        put_header(b, "content-type", "application/json", strlen("application/json"));
    put_body(b, body, body != NULL ? strlen(body) : 0);
    if (start_thread(json_thread, j) != 0) {
        sq_buf_dispose(&j->request);
        free(j);
        fn(arg, SQ_OVERLOAD, 0, NULL, "no thread to forward the request; retry");
    }
}
