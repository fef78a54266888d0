/* squishd's HTTP side: h2o event loops (one per http thread) sharing one
 * listening socket, a route table, and graceful drain on shutdown. */
#include "http_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdlib.h>
#include <strings.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

typedef struct {
    h2o_handler_t super;
    gw_server_t *srv;
    /* Read per request: a standby's table becomes the leader's in place
     * (gw_http_set_app), on the same listening socket. */
    _Atomic(const gw_http_app_t *) app;
} gw_handler_t;

typedef enum { MSG_STOP_ACCEPTING, MSG_EXIT, MSG_ASYNC_DONE } http_msg_kind_t;

typedef struct {
    h2o_multithread_message_t super;
    http_msg_kind_t kind;
} http_msg_t;

typedef struct {
    struct gw_http *http;
    pthread_t thread;
    h2o_multithread_receiver_t async_receiver;
    h2o_context_t ctx;
    h2o_accept_ctx_t accept_ctx;
    h2o_socket_t *listener;
    h2o_multithread_queue_t *queue;
    h2o_multithread_receiver_t receiver;
    int exit;
    int started, start_rc; /* under gw_http.start_lock */
    /* accepting paused: max_connections reached, or no file descriptor left */
    int paused;
    h2o_timeout_entry_t resume_timer;
    /* HTTP/1 jobs whose client may go away (gw_async_watch), looked at
     * every 100 ms while any. */
    h2o_linklist_t watched;
    h2o_timeout_entry_t watch_timer;
} http_thread_t;

struct gw_http {
    gw_server_t *srv;
    gw_handler_t *handler;
    int draining;
    h2o_globalconf_t globalconf;
    int listen_fd;
    int nthreads;
    http_thread_t *threads;
    atomic_int nconns; /* open client connections, every thread */
    pthread_mutex_t start_lock;
    pthread_cond_t start_cond;
};

/* The reason phrases of RFC 9110, for every status squishd answers with and
 * a few more. 413 and 422 go by their older names: h2o itself answers a
 * Content-Length over --max-body-mb with 413 "Request Entity Too Large"
 * before any route sees the request, and a client must read one phrase for
 * one status. */
static const struct {
    int status;
    const char *reason;
} reasons[] = {
    {100, "Continue"},
    {101, "Switching Protocols"},
    {200, "OK"},
    {201, "Created"},
    {202, "Accepted"},
    {204, "No Content"},
    {206, "Partial Content"},
    {301, "Moved Permanently"},
    {302, "Found"},
    {303, "See Other"},
    {304, "Not Modified"},
    {307, "Temporary Redirect"},
    {308, "Permanent Redirect"},
    {400, "Bad Request"},
    {401, "Unauthorized"},
    {403, "Forbidden"},
    {404, "Not Found"},
    {405, "Method Not Allowed"},
    {406, "Not Acceptable"},
    {408, "Request Timeout"},
    {409, "Conflict"},
    {410, "Gone"},
    {411, "Length Required"},
    {412, "Precondition Failed"},
    {413, "Request Entity Too Large"},
    {414, "URI Too Long"},
    {415, "Unsupported Media Type"},
    {416, "Range Not Satisfiable"},
    {417, "Expectation Failed"},
    {421, "Misdirected Request"},
    {422, "Unprocessable Entity"},
    {425, "Too Early"},
    {426, "Upgrade Required"},
    {428, "Precondition Required"},
    {429, "Too Many Requests"},
    {431, "Request Header Fields Too Large"},
    {451, "Unavailable For Legal Reasons"},
    {500, "Internal Server Error"},
    {501, "Not Implemented"},
    {502, "Bad Gateway"},
    {503, "Service Unavailable"},
    {504, "Gateway Timeout"},
    {505, "HTTP Version Not Supported"},
    {507, "Insufficient Storage"},
};

const char *gw_http_reason(int status)
{
    for (size_t i = 0; i < sizeof(reasons) / sizeof(reasons[0]); i++)
        if (reasons[i].status == status)
            return reasons[i].reason;
    /* A status without a phrase here: its class's (RFC 9110 15.1). */
    static const char *const classes[] = {"Informational", "Success", "Redirection", "Client Error",
                                          "Server Error"};
    return status >= 100 && status < 600 ? classes[status / 100 - 1] : "Unknown";
}

void gw_add_header(h2o_req_t *req, const char *name, const char *value)
{
    /* h2o keeps the pointers until the response is sent: the value is often
     * a caller's stack buffer, so it is copied into the request's pool. */
    h2o_iovec_t v = h2o_strdup(&req->pool, value, strlen(value));
    h2o_add_header_by_str(&req->pool, &req->res.headers, name, strlen(name), 1, NULL, v.base,
                          v.len);
}

void gw_send_json(h2o_req_t *req, int status, json_t *obj)
{
    /* Reals as the shortest text that reads back (sq_json.h): 0.025, not
     * 0.025000000000000001. ?pretty (any value but 0 or false) indents for
     * a reader. */
    char pretty[8];
    int indent = gw_query_param(req, "pretty", pretty, sizeof(pretty)) &&
                 strcmp(pretty, "0") != 0 && strcmp(pretty, "false") != 0;
    sq_buf_t text;
    sq_buf_init(&text);
    if (sq_json_dump_buf(obj, indent ? JSON_INDENT(2) : JSON_COMPACT, &text) != 0)
        sq_buf_put(&text, "{}", 2); /* a reply tree nests a few levels: a bug */
    sq_buf_put_u8(&text, '\n');
    json_decref(obj);
    req->res.status = status;
    req->res.reason = gw_http_reason(status);
    h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE, NULL,
                   H2O_STRLIT("application/json"));
    gw_send_body(req, text.data, text.len);
    sq_buf_dispose(&text);
}

void gw_send_error(h2o_req_t *req, int err, const char *detail)
{
    gw_send_error_retry(req, err, detail, 1);
}

void gw_send_error_retry(h2o_req_t *req, int err, const char *detail, int retry)
{
    int status = sq_err_http_status(err);
    if (status == 503 && retry)
        gw_add_header(req, "retry-after", "1");
    gw_send_json(req, status,
                 json_pack("{s:s, s:s}", "error", detail ? detail : sq_err_msg(err), "code",
                           sq_err_name(err)));
}

/* ---- deferred replies ------------------------------------------------ */

typedef struct {
    gw_async_t *job;
} async_anchor_t;

static void async_release(gw_async_t *a)
{
    if (--a->refs > 0)
        return;
    if (a->dispose != NULL)
        a->dispose(a);
    json_decref(a->body);
    free(a);
}

static void unwatch(gw_async_t *a)
{
    if (h2o_linklist_is_linked(&a->watch_link))
        h2o_linklist_unlink(&a->watch_link);
}

/* Tells the job its client went away, once, before its reply. */
static void tell_gone(gw_async_t *a)
{
    unwatch(a);
    if (!a->answered && !a->gone_told && a->gone != NULL) {
        a->gone_told = 1;
        a->gone(a);
    }
}

/* Runs when h2o frees the request (reply sent or client gone). */
static void on_anchor_dispose(void *p)
{
    async_anchor_t *anchor = p;
    gw_async_t *a = anchor->job;
    a->req = NULL;
    tell_gone(a);
    async_release(a);
}

/* A watched client whose socket reads end of stream or an error has gone:
 * h2o would only find out when it writes the reply. */
static void on_watch_timer(h2o_timeout_entry_t *entry)
{
    http_thread_t *t = H2O_STRUCT_FROM_MEMBER(http_thread_t, watch_timer, entry);
    h2o_linklist_t *node = t->watched.next;
    while (node != &t->watched) {
        gw_async_t *a = H2O_STRUCT_FROM_MEMBER(gw_async_t, watch_link, node);
        node = node->next;
        char c;
        ssize_t n = recv(a->watch_fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            tell_gone(a);
    }
    if (!h2o_linklist_is_empty(&t->watched))
        h2o_timeout_link(t->ctx.loop, &t->ctx.hundred_ms_timeout, &t->watch_timer);
}

void gw_async_watch(gw_async_t *a)
{
    h2o_req_t *req = a->req;
    if (req == NULL || req->version >= 0x200 || req->conn->callbacks->get_socket == NULL)
        return; /* HTTP/2: h2o keeps reading, and disposes a stream that goes */
    h2o_socket_t *sock = req->conn->callbacks->get_socket(req->conn);
    if (sock == NULL)
        return;
    http_thread_t *t = H2O_STRUCT_FROM_MEMBER(http_thread_t, ctx, req->conn->ctx);
    a->watch_fd = h2o_socket_get_fd(sock);
    h2o_linklist_insert(&t->watched, &a->watch_link);
    if (!h2o_timeout_is_linked(&t->watch_timer))
        h2o_timeout_link(t->ctx.loop, &t->ctx.hundred_ms_timeout, &t->watch_timer);
}

gw_async_t *gw_async_new(gw_call_t *call, size_t size)
{
    gw_async_t *a = sq_xcalloc(1, size);
    a->reply_to = call->reply_to;
    a->req = call->req;
    a->srv = call->srv;
    a->refs = 2;
    async_anchor_t *anchor =
        h2o_mem_alloc_shared(&call->req->pool, sizeof(*anchor), on_anchor_dispose);
    anchor->job = a;
    return a;
}

void gw_async_done(gw_async_t *a)
{
    h2o_multithread_send_message(a->reply_to, &a->super);
}

void gw_async_fail(gw_async_t *a, int err, const char *fmt, ...)
{
    a->err = err;
    a->detail[0] = '\0';
    if (fmt != NULL) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(a->detail, sizeof(a->detail), fmt, ap);
        va_end(ap);
    }
}

static void on_async_done(h2o_multithread_receiver_t *receiver, h2o_linklist_t *messages)
{
    (void)receiver;
    while (!h2o_linklist_is_empty(messages)) {
        gw_async_t *a = H2O_STRUCT_FROM_MEMBER(gw_async_t, super.link, messages->next);
        h2o_linklist_unlink(&a->super.link);
        h2o_req_t *req = a->req;
        a->answered = 1;
        unwatch(a);
        if (req != NULL) {
            if (a->respond != NULL) {
                a->respond(a, req);
            } else if (a->err != 0) {
                gw_send_error(req, a->err, a->detail[0] ? a->detail : NULL);
            } else {
                if (a->location != NULL)
                    gw_add_header(req, "location", a->location);
                json_t *body = a->body;
                a->body = NULL;
                gw_send_json(req, a->status ? a->status : 200, body ? body : json_object());
            }
        }
        async_release(a);
    }
}

int gw_request_body(h2o_req_t *req, const uint8_t **data, size_t *len, uint8_t **owned)
{
    *owned = NULL;
    *len = req->entity.len;
    if (req->version < 0x200 || req->entity.len == 0) {
        *data = (const uint8_t *)req->entity.base;
        return 0;
    }
    uint8_t *copy = malloc(req->entity.len);
    if (copy == NULL)
        return SQ_OVERLOAD;
    memcpy(copy, req->entity.base, req->entity.len);
    *data = *owned = copy;
    return 0;
}

h2o_iovec_t gw_header(h2o_req_t *req, const char *name)
{
    ssize_t i = h2o_find_header_by_str(&req->headers, name, strlen(name), -1);
    if (i < 0)
        return h2o_iovec_init(NULL, 0);
    return req->headers.entries[i].value;
}

int gw_require_admin(gw_call_t *call)
{
    h2o_iovec_t v = gw_header(call->req, "authorization");
    static const char bearer[] = "Bearer ";
    if (v.len > sizeof(bearer) - 1 && strncasecmp(v.base, bearer, sizeof(bearer) - 1) == 0 &&
        gw_token_matches(call->srv, v.base + sizeof(bearer) - 1, v.len - (sizeof(bearer) - 1)))
        return 1;
    gw_add_header(call->req, "www-authenticate", "Bearer realm=\"squish\"");
    gw_send_error(call->req, SQ_UNAUTHORIZED,
                  v.len == 0 ? "this route needs 'Authorization: Bearer <admin token>'"
                             : "invalid bearer token");
    return 0;
}

int gw_parse_version(h2o_iovec_t v)
{
    if (v.len == 0 || v.len > 10)
        return -1;
    long long n = 0;
    for (size_t i = 0; i < v.len; i++) {
        if (v.base[i] < '0' || v.base[i] > '9')
            return -1;
        n = n * 10 + (v.base[i] - '0');
    }
    return n >= 1 && n <= 1000000000 ? (int)n : -1;
}

int gw_query_param(h2o_req_t *req, const char *name, char *out, size_t outlen)
{
    if (req->query_at == SIZE_MAX)
        return 0;
    const char *p = req->path.base + req->query_at + 1, *end = req->path.base + req->path.len;
    size_t nlen = strlen(name);
    while (p < end) {
        const char *amp = memchr(p, '&', (size_t)(end - p));
        const char *pe = amp ? amp : end;
        const char *eq = memchr(p, '=', (size_t)(pe - p));
        const char *ke = eq ? eq : pe;
        if ((size_t)(ke - p) == nlen && memcmp(p, name, nlen) == 0) {
            size_t o = 0;
            for (const char *v = eq ? eq + 1 : pe; v < pe && o + 1 < outlen; v++) {
                if (*v == '%' && v + 2 < pe && sq_hexval(v[1]) >= 0 && sq_hexval(v[2]) >= 0) {
                    out[o++] = (char)(sq_hexval(v[1]) * 16 + sq_hexval(v[2]));
                    v += 2;
                } else {
                    out[o++] = *v == '+' ? ' ' : *v;
                }
            }
            out[o] = '\0';
            return 1;
        }
        p = pe + 1;
    }
    return 0;
}

/* Matches a path against a pattern segment by segment; '*' captures one
 * non-empty segment. */
static int match(const char *pattern, const char *path, size_t len, gw_call_t *call)
{
    const char *p = pattern, *s = path, *end = path + len;
    call->nargs = 0;
    while (*p != '\0' && s < end) {
        if (*p != '/' || *s != '/')
            return 0;
        p++, s++;
        const char *seg = s;
        while (s < end && *s != '/')
            s++;
        size_t seglen = (size_t)(s - seg);
        if (*p == '*') {
            if (seglen == 0 || call->nargs == GW_MAX_ROUTE_ARGS)
                return 0;
            call->args[call->nargs++] = h2o_iovec_init(seg, seglen);
            p++;
        } else {
            const char *pe = p;
            while (*pe != '\0' && *pe != '/')
                pe++;
            if ((size_t)(pe - p) != seglen || memcmp(p, seg, seglen) != 0)
                return 0;
            p = pe;
        }
    }
    return *p == '\0' && s == end;
}

const gw_route_t *gw__route_find(const gw_http_app_t *app, h2o_iovec_t method, h2o_iovec_t path,
                                 gw_call_t *call, char *allow, size_t allowlen)
{
    /* Trailing slashes are not significant ("/v2/" is "/v2"). */
    while (path.len > 1 && path.base[path.len - 1] == '/')
        path.len--;
    allow[0] = '\0';
    const gw_route_t *routes = app->routes;
    for (size_t i = 0; i < app->nroutes; i++) {
        if (!match(routes[i].pattern, path.base, path.len, call))
            continue;
        if (h2o_memis(method.base, method.len, routes[i].method, strlen(routes[i].method)))
            return &routes[i];
        /* ", " and the method, and the NUL, if they fit. */
        size_t used = strlen(allow), mlen = strlen(routes[i].method);
        if (strstr(allow, routes[i].method) == NULL && used + 2 + mlen < allowlen) {
            if (allow[0] != '\0')
                strcat(allow, ", ");
            strcat(allow, routes[i].method);
        }
    }
    return NULL;
}

typedef struct {
    gw_server_t *srv;
    h2o_req_t *req;
    const char *route; /* metrics label */
    int64_t start_ns;
    const gw_http_app_t *app;
} req_done_t;

static void on_req_done(void *p)
{
    req_done_t *d = p;
    if (d->app->done != NULL)
        d->app->done(d->srv, d->req, d->route, d->start_ns);
    atomic_fetch_sub(&d->srv->inflight, 1);
}

/* The request line and header fields as the client sent them, about: h2o
 * has parsed them already (its own cap is H2O_MAX_REQLEN, 408 KiB). */
static size_t header_bytes(const h2o_req_t *req)
{
    size_t n = req->input.method.len + req->input.path.len + req->input.authority.len + 16;
    for (size_t i = 0; i < req->headers.size; i++)
        n += req->headers.entries[i].name->len + req->headers.entries[i].value.len + 4;
    return n;
}

/* Runs the route for req (on its loop thread), or answers 404 or 405. */
static void route_request(gw_server_t *srv, req_done_t *inflight, h2o_req_t *req)
{
    http_thread_t *t = H2O_STRUCT_FROM_MEMBER(http_thread_t, ctx, req->conn->ctx);
    gw_call_t call = {.req = req, .srv = srv, .reply_to = &t->async_receiver};
    const gw_http_app_t *app = inflight->app;
    char allow[64];
    const gw_route_t *route =
        gw__route_find(app, req->method, req->path_normalized, &call, allow, sizeof(allow));
    if (route != NULL) {
        inflight->route = route->name;
        if (srv->front != NULL && !route->on_frontend && app->forward != NULL)
            app->forward(&call);
        else
            route->fn(&call);
        return;
    }
    if (app->fallback != NULL) {
        inflight->route = app->fallback_name;
        app->fallback(&call);
        return;
    }
    if (allow[0] != '\0') {
        inflight->route = "method_not_allowed";
        gw_add_header(req, "allow", allow);
        gw_send_error(req, SQ_METHOD, "method not allowed for this route");
        return;
    }
    gw_send_error(req, SQ_NOT_FOUND, "no such route");
}

/* ---- compressed request bodies ------------------------------------------ */

/* A body sent with Content-Encoding gzip or deflate (Triton's clients'
 * request_compression_algorithm) is inflated in place of the entity
 * before any route reads it; the body limit applies to what it inflates
 * to (a zip bomb is 413, not memory). The HTTP loop inflates the first
 * INLINE_INFLATE_BYTES (about 3 ms): a body that inflates to more goes on
 * on the offload thread, and its route runs when it comes back, so that
 * one large body does not hold every other connection of its thread. */
#define INLINE_INFLATE_BYTES ((size_t)1 << 20)

typedef struct {
    gw_async_t base;
    gw_inflate_t *z;
    uint8_t *in_copy; /* HTTP/2: the compressed body, which a reset would free */
    req_done_t *inflight;
    int rc;
    char why[160];
} inflate_job_t;

static void free_held(void *p)
{
    free(*(void **)p);
}

/* The inflated body becomes the request's entity, freed with the request. */
static void set_entity(h2o_req_t *req, gw_inflate_t *z)
{
    size_t len;
    void **held = h2o_mem_alloc_shared(&req->pool, sizeof(*held), free_held);
    *held = gw__inflate_take(z, &len);
    req->entity = h2o_iovec_init(*held, len);
}

static void inflate_failed(req_done_t *inflight, h2o_req_t *req, int rc, const char *why)
{
    inflight->route = "bad_encoding";
    gw_send_error(req, rc, rc == SQ_NOMEM ? "not enough memory to inflate the body" : why);
}

/* Offload thread. */
static void inflate_rest(void *arg)
{
    inflate_job_t *job = arg;
    job->rc = gw__inflate_run(job->z, SIZE_MAX, job->why, sizeof(job->why));
    gw_async_done(&job->base);
}

/* Loop thread, the client still there. */
static void inflate_back(gw_async_t *a, h2o_req_t *req)
{
    inflate_job_t *job = (inflate_job_t *)a;
    if (job->rc != 0) {
        inflate_failed(job->inflight, req, job->rc, job->why);
        return;
    }
    set_entity(req, job->z);
    route_request(a->srv, job->inflight, req);
}

static void inflate_dispose(gw_async_t *a)
{
    inflate_job_t *job = (inflate_job_t *)a;
    gw__inflate_free(job->z);
    free(job->in_copy);
}

/* 1 when the route runs later (the rest of the body inflates on the
 * offload thread), else 0: the body is whole, or an error was answered. */
static int inflate_body(gw_server_t *srv, req_done_t *inflight, h2o_req_t *req)
{
    char why[160];
    gw_inflate_t *z = NULL;
    int rc = gw__inflate_new(gw_header(req, "content-encoding"), req->entity.base, req->entity.len,
                             srv->cfg->max_body_bytes, &z, why, sizeof(why));
    if (rc == 0 && z == NULL)
        return 0;
    if (rc == 0)
        rc = gw__inflate_run(z, INLINE_INFLATE_BYTES, why, sizeof(why));
    /* While stopping, the offload thread may be gone: the loop finishes. */
    if (rc == 1 && atomic_load(&srv->stopping))
        rc = gw__inflate_run(z, SIZE_MAX, why, sizeof(why));
    if (rc == 1) {
        http_thread_t *t = H2O_STRUCT_FROM_MEMBER(http_thread_t, ctx, req->conn->ctx);
        gw_call_t call = {.req = req, .srv = srv, .reply_to = &t->async_receiver};
        inflate_job_t *job = (inflate_job_t *)gw_async_new(&call, sizeof(*job));
        job->z = z;
        job->inflight = inflight;
        job->base.respond = inflate_back;
        job->base.dispose = inflate_dispose;
        const uint8_t *data;
        size_t len;
        if (gw_request_body(req, &data, &len, &job->in_copy) != 0) {
            job->rc = SQ_NOMEM;
            gw_async_done(&job->base);
            return 1;
        }
        gw__inflate_rebase(z, data);
        gw_offload(srv, inflate_rest, job);
        return 1;
    }
    if (rc == 0)
        set_entity(req, z);
    else
        inflate_failed(inflight, req, rc, why);
    gw__inflate_free(z);
    return rc == 0 ? 0 : 1;
}

static int on_req(h2o_handler_t *self, h2o_req_t *req)
{
    gw_handler_t *h = (gw_handler_t *)self;
    const gw_http_app_t *app = atomic_load(&h->app);
    /* In flight until h2o frees the request: what SIGTERM's drain waits for. */
    req_done_t *inflight = h2o_mem_alloc_shared(&req->pool, sizeof(*inflight), on_req_done);
    *inflight = (req_done_t){h->srv, req, "not_found", sq_now_ns(), app};
    atomic_fetch_add(&h->srv->inflight, 1);
    if (header_bytes(req) > (size_t)h->srv->cfg->max_header_kb * 1024) {
        inflight->route = "headers_too_large";
        char why[128];
        snprintf(why, sizeof(why), "request line and headers over --max-header-kb %d KiB",
                 h->srv->cfg->max_header_kb);
        gw_send_error(req, SQ_HEADERS_TOO_LARGE, why);
        return 0;
    }
    if (inflate_body(h->srv, inflight, req) == 0)
        route_request(h->srv, inflight, req);
    return 0;
}

/* ---- connections ------------------------------------------------------- */

/* Accepting pauses at max_connections (new connections wait in the kernel's
 * backlog, bounded by SOMAXCONN) and when accept finds no file descriptor
 * left (the listener would otherwise wake the loop at once, forever). It
 * resumes when a connection of this thread closes, or on a 100 ms timer. */
static void pause_accepting(http_thread_t *t)
{
    if (t->paused || t->listener == NULL)
        return;
    t->paused = 1;
    h2o_socket_read_stop(t->listener);
    h2o_timeout_link(t->ctx.loop, &t->ctx.hundred_ms_timeout, &t->resume_timer);
}

static void on_accept(h2o_socket_t *listener, const char *err);

static void maybe_resume(http_thread_t *t)
{
    if (!t->paused)
        return;
    if (h2o_timeout_is_linked(&t->resume_timer))
        h2o_timeout_unlink(&t->resume_timer);
    if (t->listener == NULL) {
        t->paused = 0;
        return;
    }
    if (atomic_load(&t->http->nconns) >= t->http->srv->cfg->max_connections) {
        h2o_timeout_link(t->ctx.loop, &t->ctx.hundred_ms_timeout, &t->resume_timer);
        return;
    }
    t->paused = 0;
    h2o_socket_read_start(t->listener, on_accept);
}

static void on_resume_timer(h2o_timeout_entry_t *entry)
{
    maybe_resume(H2O_STRUCT_FROM_MEMBER(http_thread_t, resume_timer, entry));
}

static void on_conn_close(void *data)
{
    http_thread_t *t = data;
    atomic_fetch_sub(&t->http->nconns, 1);
    maybe_resume(t);
}

/* Accepts what is waiting, up to a few per wake-up (as h2o's own server
 * does): connections opened in a burst do not each cost a loop turn, and
 * the other threads, woken by the same socket, take their share. */
#define ACCEPTS_PER_WAKEUP 16

static void on_accept(h2o_socket_t *listener, const char *err)
{
    http_thread_t *t = listener->data;
    if (err != NULL)
        return;
    for (int n = 0; n < ACCEPTS_PER_WAKEUP; n++) {
        if (atomic_load(&t->http->nconns) >= t->http->srv->cfg->max_connections) {
            pause_accepting(t);
            return;
        }
        h2o_socket_t *sock = h2o_evloop_socket_accept(listener);
        if (sock == NULL) {
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                SQ_WARN("accept failed, pausing for 100 ms error=\"%s\" connections=%d",
                        strerror(errno), atomic_load(&t->http->nconns));
                pause_accepting(t);
            }
            return; /* EAGAIN: another thread took it, or none is left */
        }
        atomic_fetch_add(&t->http->nconns, 1);
        sock->on_close.cb = on_conn_close;
        sock->on_close.data = t;
        h2o_accept(&t->accept_ctx, sock);
    }
}

static void on_message(h2o_multithread_receiver_t *receiver, h2o_linklist_t *messages)
{
    http_thread_t *t = H2O_STRUCT_FROM_MEMBER(http_thread_t, receiver, receiver);
    while (!h2o_linklist_is_empty(messages)) {
        http_msg_t *m = H2O_STRUCT_FROM_MEMBER(http_msg_t, super.link, messages->next);
        h2o_linklist_unlink(&m->super.link);
        if (m->kind == MSG_STOP_ACCEPTING && t->listener != NULL) {
            if (!t->paused)
                h2o_socket_read_stop(t->listener);
            if (h2o_timeout_is_linked(&t->resume_timer))
                h2o_timeout_unlink(&t->resume_timer);
            t->paused = 0;
            h2o_socket_close(t->listener);
            t->listener = NULL;
        } else if (m->kind == MSG_EXIT) {
            t->exit = 1;
        }
        free(m);
    }
}

/* Everything h2o a loop thread uses is created on that thread: libh2o keeps
 * per-thread state (its socket buffers' recycling lists are __thread and a
 * buffer returns to the list of the thread that created its socket), so a
 * socket or context set up on the main thread and read on a loop thread
 * shares one unlocked list with every other loop thread. With two threads
 * that corrupted the heap under load (connections reset, then squishd
 * aborted). The thread reports to gw_http_start once it is accepting. */
static int thread_setup(http_thread_t *t)
{
    struct gw_http *http = t->http;
    int fd = dup(http->listen_fd);
    if (fd < 0)
        return -errno;
    h2o_context_init(&t->ctx, h2o_evloop_create(), &http->globalconf);
    t->accept_ctx.ctx = &t->ctx;
    t->accept_ctx.hosts = http->globalconf.hosts;
    t->resume_timer.cb = on_resume_timer;
    t->watch_timer.cb = on_watch_timer;
    h2o_linklist_init_anchor(&t->watched);
    t->queue = h2o_multithread_create_queue(t->ctx.loop);
    h2o_multithread_register_receiver(t->queue, &t->receiver, on_message);
    h2o_multithread_register_receiver(t->queue, &t->async_receiver, on_async_done);
    t->listener = h2o_evloop_socket_create(t->ctx.loop, fd, H2O_SOCKET_FLAG_DONT_READ);
    t->listener->data = t;
    h2o_socket_read_start(t->listener, on_accept);
    return 0;
}

static void *http_thread(void *arg)
{
    http_thread_t *t = arg;
    struct gw_http *http = t->http;
    int rc = thread_setup(t);
    pthread_mutex_lock(&http->start_lock);
    t->start_rc = rc;
    t->started = 1;
    pthread_cond_broadcast(&http->start_cond);
    pthread_mutex_unlock(&http->start_lock);
    if (rc != 0)
        return NULL;
    /* The items a turn of the loop submits (one per request that arrived,
     * ready connections are served in a row) wake the dispatch thread
     * once, after the turn, not once each: h2o_evloop_run waits first,
     * then serves what is ready, and returns without waiting again. */
    while (!t->exit) {
        sq_loop_defer_wakes();
        h2o_evloop_run(t->ctx.loop, INT32_MAX);
        sq_loop_flush_wakes();
    }
    if (h2o_timeout_is_linked(&t->watch_timer))
        h2o_timeout_unlink(&t->watch_timer);
    /* The queue's socket goes back to this thread's buffer list: while the
     * thread still exists. */
    if (t->listener != NULL)
        h2o_socket_close(t->listener);
    h2o_multithread_unregister_receiver(t->queue, &t->receiver);
    h2o_multithread_unregister_receiver(t->queue, &t->async_receiver);
    h2o_multithread_destroy_queue(t->queue);
    return NULL;
}

static void send_msg(http_thread_t *t, http_msg_kind_t kind)
{
    http_msg_t *m = sq_xcalloc(1, sizeof(*m));
    m->kind = kind;
    h2o_multithread_send_message(&t->receiver, &m->super);
}

static int bind_listener(struct gw_http *http, char *err, size_t errlen)
{
    const gw_config_t *cfg = http->srv->cfg;
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV | AI_PASSIVE};
    struct addrinfo *ai = NULL;
    char port[8];
    snprintf(port, sizeof(port), "%d", cfg->listen_port);
    /* listen_host is bare ("::1" for "--listen [::1]:8000"). */
    int gai = getaddrinfo(cfg->listen_host, port, &hints, &ai);
    if (gai != 0) {
        snprintf(err, errlen, "--listen %s: %s", cfg->listen_host, gai_strerror(gai));
        return SQ_BAD_CONFIG;
    }
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int one = 1;
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
        bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, SOMAXCONN) != 0) {
        snprintf(err, errlen, "--listen %s:%d: %s", cfg->listen_host, cfg->listen_port,
                 strerror(errno));
        if (fd >= 0)
            close(fd);
        freeaddrinfo(ai);
        return SQ_IO;
    }
    freeaddrinfo(ai);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    int bound_port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                    : ((struct sockaddr_in *)&ss)->sin_port);
    http->listen_fd = fd;
    atomic_store(&http->srv->http_port, bound_port);
    printf("listening on %s:%d\n", cfg->listen_host, bound_port);
    fflush(stdout);
    SQ_INFO("listening address=%s port=%d http_threads=%d", cfg->listen_host, bound_port,
            cfg->http_threads);
    if (cfg->port_file[0] != '\0') {
        char tmp[300];
        snprintf(tmp, sizeof(tmp), "%s.tmp", cfg->port_file);
        FILE *f = fopen(tmp, "w");
        if (f == NULL || fprintf(f, "%d\n", bound_port) < 0 || fclose(f) != 0 ||
            rename(tmp, cfg->port_file) != 0) {
            snprintf(err, errlen, "--port-file %s: %s", cfg->port_file, strerror(errno));
            return SQ_IO;
        }
    }
    return 0;
}

int gw_http_start(gw_server_t *srv, const gw_http_app_t *app, char *err, size_t errlen)
{
    struct gw_http *http = sq_xcalloc(1, sizeof(*http));
    http->srv = srv;
    http->listen_fd = -1;
    int rc = bind_listener(http, err, errlen);
    if (rc != 0) {
        if (http->listen_fd >= 0)
            close(http->listen_fd);
        free(http);
        return rc;
    }
    h2o_config_init(&http->globalconf);
    http->globalconf.max_request_entity_size = (size_t)srv->cfg->max_body_bytes;
    /* h2o closes a connection whose request (headers and body) has not
     * arrived this long after it began, and an idle keep-alive one. */
    http->globalconf.http1.req_timeout = (uint64_t)srv->cfg->http_request_timeout_ms;
    http->globalconf.http2.idle_timeout = (uint64_t)srv->cfg->http_request_timeout_ms;
    http->globalconf.server_name = h2o_iovec_init(H2O_STRLIT("squish/" SQUISH_VERSION));
    h2o_hostconf_t *host =
        h2o_config_register_host(&http->globalconf, h2o_iovec_init(H2O_STRLIT("default")), 65535);
    h2o_pathconf_t *path = h2o_config_register_path(host, "/", 0);
    gw_handler_t *handler = (gw_handler_t *)h2o_create_handler(path, sizeof(*handler));
    handler->super.on_req = on_req;
    handler->srv = srv;
    atomic_init(&handler->app, app);
    http->handler = handler;

    http->nthreads = srv->cfg->http_threads;
    http->threads = sq_xcalloc((size_t)http->nthreads, sizeof(http_thread_t));
    pthread_mutex_init(&http->start_lock, NULL);
    pthread_cond_init(&http->start_cond, NULL);
    srv->http = http;
    /* Each thread sets up its loop, context and listener itself (see
     * thread_setup) and accepts on its own dup of the one listening socket:
     * the kernel hands each connection to one of the threads that wait. */
    int started = 0;
    rc = 0;
    for (; started < http->nthreads; started++) {
        http_thread_t *t = &http->threads[started];
        t->http = http;
        int e = pthread_create(&t->thread, NULL, http_thread, t);
        if (e != 0) {
            snprintf(err, errlen, "--http-threads %d: cannot start thread %d: %s", http->nthreads,
                     started, strerror(e));
            rc = SQ_INTERNAL;
            break;
        }
    }
    pthread_mutex_lock(&http->start_lock);
    for (int i = 0; i < started; i++) {
        http_thread_t *t = &http->threads[i];
        while (!t->started)
            pthread_cond_wait(&http->start_cond, &http->start_lock);
        if (t->start_rc != 0 && rc == 0) {
            snprintf(err, errlen, "--http-threads: thread %d cannot listen: %s", i,
                     strerror(-t->start_rc));
            rc = SQ_IO;
        }
    }
    pthread_mutex_unlock(&http->start_lock);
    /* The threads hold their own descriptors: once they all close theirs
     * (drain), the socket closes and new connections are refused. */
    close(http->listen_fd);
    http->listen_fd = -1;
    if (rc != 0) {
        /* Stop what did start; gw_http_stop joins the threads. */
        http->nthreads = started;
        gw_http_stop(srv);
    }
    return rc;
}

void gw_http_drain(gw_server_t *srv, int timeout_ms)
{
    struct gw_http *http = srv->http;
    if (http == NULL)
        return;
    if (!http->draining) {
        http->draining = 1;
        for (int i = 0; i < http->nthreads; i++)
            if (http->threads[i].start_rc == 0)
                send_msg(&http->threads[i], MSG_STOP_ACCEPTING);
    }
    int64_t deadline = sq_now_ms() + timeout_ms;
    while (atomic_load(&srv->inflight) > 0 && sq_now_ms() < deadline)
        usleep(5000);
}

int gw_http_connections(gw_server_t *srv)
{
    return srv->http != NULL ? atomic_load(&srv->http->nconns) : 0;
}

void gw_http_set_app(gw_server_t *srv, const gw_http_app_t *app)
{
    if (srv->http != NULL)
        atomic_store(&srv->http->handler->app, app);
}

void gw_http_stop(gw_server_t *srv)
{
    struct gw_http *http = srv->http;
    if (http == NULL)
        return;
    gw_http_drain(srv, 0);
    if (atomic_load(&srv->inflight) > 0)
        SQ_WARN("drain timed out inflight=%ld", atomic_load(&srv->inflight));
    for (int i = 0; i < http->nthreads; i++)
        if (http->threads[i].start_rc == 0)
            send_msg(&http->threads[i], MSG_EXIT);
    for (int i = 0; i < http->nthreads; i++)
        pthread_join(http->threads[i].thread, NULL);
    pthread_cond_destroy(&http->start_cond);
    pthread_mutex_destroy(&http->start_lock);
    free(http->threads);
    free(http);
    srv->http = NULL;
}
