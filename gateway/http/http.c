/* squishd's HTTP loops: h2o event loops (one per http thread) sharing one
 * listening socket; each request into its route (its body inflated first
 * when it came compressed), replies computed on other threads delivered
 * back on the request's loop, and graceful drain on shutdown. The route
 * table's lookup is route.c's; answers are reply.c's. */
#include "http_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

typedef struct {
    h2o_handler_t super;
    struct gw_http *http;
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
    gw_http_ctx_t ctx;
    atomic_long inflight; /* requests not yet answered: what drain waits for */
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

/* ---- deferred replies ------------------------------------------------ */

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
            gw__async_tell_gone(a);
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

static void on_async_done(h2o_multithread_receiver_t *receiver, h2o_linklist_t *messages)
{
    (void)receiver;
    while (!h2o_linklist_is_empty(messages)) {
        gw_async_t *a = H2O_STRUCT_FROM_MEMBER(gw_async_t, super.link, messages->next);
        h2o_linklist_unlink(&a->super.link);
        h2o_req_t *req = a->req;
        a->answered = 1;
        gw__async_unwatch(a);
        if (req != NULL) {
            if (a->respond != NULL) {
                a->respond(a, req);
            } else if (a->err != 0) {
                gw_send_error(req, a->err, a->detail[0] ? gw_async_detail(a) : NULL);
            } else if (a->raw != NULL) {
                req->res.status = a->status;
                req->res.reason = gw_http_reason(a->status);
                for (int i = 0; i < a->nraw_headers; i++)
                    gw_add_header(req, a->raw_headers[i].name, a->raw_headers[i].value);
                gw_send_body(req, a->raw + a->raw_off, a->raw_len - a->raw_off);
            } else {
                if (a->location != NULL)
                    gw_add_header(req, "location", a->location);
                json_t *body = a->body;
                a->body = NULL;
                gw_send_json(req, a->status ? a->status : 200, body ? body : json_object());
            }
        }
        gw__async_release(a);
    }
}

typedef struct {
    struct gw_http *http;
    h2o_req_t *req;
    const char *route; /* metrics label */
    int64_t start_ns;
    const gw_http_app_t *app;
} req_done_t;

static void on_req_done(void *p)
{
    req_done_t *d = p;
    if (d->app->done != NULL)
        d->app->done(d->app->ctx, d->req, d->route, d->start_ns);
    atomic_fetch_sub(&d->http->inflight, 1);
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
static void route_request(req_done_t *inflight, h2o_req_t *req)
{
    const gw_http_ctx_t *ctx = &inflight->http->ctx;
    http_thread_t *t = H2O_STRUCT_FROM_MEMBER(http_thread_t, ctx, req->conn->ctx);
    const gw_http_app_t *app = inflight->app;
    gw_call_t call = {.req = req, .app = app->ctx, .http = ctx, .reply_to = &t->async_receiver};
    char allow[64];
    const gw_route_t *route =
        gw__route_find(app, req->method, req->path_normalized, &call, allow, sizeof(allow));
    if (route != NULL) {
        inflight->route = route->name;
        if (ctx->cfg.frontend && !route->on_frontend && app->forward != NULL)
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

/* The job owns its inflate until the offload thread has run it; the body
 * it inflated to is then the job's raw bytes (freed with the job when the
 * client has gone, else taken as the entity), so the job needs no dispose
 * hook. */
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

/* The inflated body (malloc'd) becomes the request's entity, freed with
 * the request. */
static void set_entity(h2o_req_t *req, void *body, size_t len)
{
    void **held = h2o_mem_alloc_shared(&req->pool, sizeof(*held), free_held);
    *held = body;
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
    if (job->rc == 0)
        job->base.raw = gw__inflate_take(job->z, &job->base.raw_len);
    gw__inflate_free(job->z);
    job->z = NULL;
    free(job->in_copy);
    job->in_copy = NULL;
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
    set_entity(req, a->raw, a->raw_len);
    a->raw = NULL;
    route_request(job->inflight, req);
}

/* 1 when the route runs later (the rest of the body inflates on the
 * offload thread), else 0: the body is whole, or an error was answered. */
static int inflate_body(req_done_t *inflight, h2o_req_t *req)
{
    const gw_http_ctx_t *ctx = &inflight->http->ctx;
    char why[160];
    gw_inflate_t *z = NULL;
    int rc = gw__inflate_new(gw_header(req, "content-encoding"), req->entity.base, req->entity.len,
                             ctx->cfg.max_body_bytes, &z, why, sizeof(why));
    if (rc == 0 && z == NULL)
        return 0;
    if (rc == 0)
        rc = gw__inflate_run(z, INLINE_INFLATE_BYTES, why, sizeof(why));
    /* While stopping, the offload thread may be gone: the loop finishes. */
    if (rc == 1 && atomic_load(ctx->stopping))
        rc = gw__inflate_run(z, SIZE_MAX, why, sizeof(why));
    if (rc == 1) {
        http_thread_t *t = H2O_STRUCT_FROM_MEMBER(http_thread_t, ctx, req->conn->ctx);
        gw_call_t call = {.req = req, .http = ctx, .reply_to = &t->async_receiver};
        inflate_job_t *job = (inflate_job_t *)gw_async_new(&call, sizeof(*job));
        job->z = z;
        job->inflight = inflight;
        job->base.respond = inflate_back;
        const uint8_t *data;
        size_t len;
        if (gw_request_body(req, &data, &len, &job->in_copy) != 0) {
            gw__inflate_free(z);
            job->z = NULL;
            job->rc = SQ_NOMEM;
            gw_async_done(&job->base);
            return 1;
        }
        gw__inflate_rebase(z, data);
        gw_offload(ctx->offload, inflate_rest, job);
        return 1;
    }
    if (rc == 0) {
        size_t len;
        void *body = gw__inflate_take(z, &len);
        set_entity(req, body, len);
    } else
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
    *inflight = (req_done_t){h->http, req, "not_found", sq_now_ns(), app};
    atomic_fetch_add(&h->http->inflight, 1);
    int max_header_kb = h->http->ctx.cfg.max_header_kb;
    if (header_bytes(req) > (size_t)max_header_kb * 1024) {
        inflight->route = "headers_too_large";
        char why[128];
        snprintf(why, sizeof(why), "request line and headers over --max-header-kb %d KiB",
                 max_header_kb);
        gw_send_error(req, SQ_HEADERS_TOO_LARGE, why);
        return 0;
    }
    if (inflate_body(inflight, req) == 0)
        route_request(inflight, req);
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
    if (atomic_load(&t->http->nconns) >= t->http->ctx.cfg.max_connections) {
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
        if (atomic_load(&t->http->nconns) >= t->http->ctx.cfg.max_connections) {
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
    const gw_http_config_t *cfg = &http->ctx.cfg;
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
    atomic_store(http->ctx.http_port, bound_port);
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

void gw__http_ctx_fill(gw_http_ctx_t *ctx, const gw_http_deps_t *deps)
{
    *ctx = (gw_http_ctx_t){.cfg = deps->cfg,
                           .stopping = deps->stopping,
                           .http_port = deps->http_port,
                           .offload = deps->offload,
                           .front = deps->front};
}

int gw_http_start(const gw_http_deps_t *deps, const gw_http_app_t *app, gw_http_t **out, char *err,
                  size_t errlen)
{
    struct gw_http *http = sq_xcalloc(1, sizeof(*http));
    gw__http_ctx_fill(&http->ctx, deps);
    http->listen_fd = -1;
    int rc = bind_listener(http, err, errlen);
    if (rc != 0) {
        if (http->listen_fd >= 0)
            close(http->listen_fd);
        free(http);
        return rc;
    }
    h2o_config_init(&http->globalconf);
    http->globalconf.max_request_entity_size = (size_t)http->ctx.cfg.max_body_bytes;
    /* h2o closes a connection whose request (headers and body) has not
     * arrived this long after it began, and an idle keep-alive one. */
    http->globalconf.http1.req_timeout = (uint64_t)http->ctx.cfg.http_request_timeout_ms;
    http->globalconf.http2.idle_timeout = (uint64_t)http->ctx.cfg.http_request_timeout_ms;
    http->globalconf.server_name = h2o_iovec_init(H2O_STRLIT("squish/" SQUISH_VERSION));
    h2o_hostconf_t *host =
        h2o_config_register_host(&http->globalconf, h2o_iovec_init(H2O_STRLIT("default")), 65535);
    gw__http_too_large_filter(host, (long long)http->ctx.cfg.max_body_bytes);
    h2o_pathconf_t *path = h2o_config_register_path(host, "/", 0);
    gw_handler_t *handler = (gw_handler_t *)h2o_create_handler(path, sizeof(*handler));
    handler->super.on_req = on_req;
    handler->http = http;
    atomic_init(&handler->app, app);
    http->handler = handler;

    http->nthreads = http->ctx.cfg.http_threads;
    http->threads = sq_xcalloc((size_t)http->nthreads, sizeof(http_thread_t));
    pthread_mutex_init(&http->start_lock, NULL);
    pthread_cond_init(&http->start_cond, NULL);
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
        gw_http_stop(http);
        return rc;
    }
    *out = http;
    return 0;
}

void gw_http_drain(gw_http_t *http, int timeout_ms)
{
    if (http == NULL)
        return;
    if (!http->draining) {
        http->draining = 1;
        for (int i = 0; i < http->nthreads; i++)
            if (http->threads[i].start_rc == 0)
                send_msg(&http->threads[i], MSG_STOP_ACCEPTING);
    }
    int64_t deadline = sq_now_ms() + timeout_ms;
    while (atomic_load(&http->inflight) > 0 && sq_now_ms() < deadline)
        usleep(5000);
}

int gw_http_connections(const gw_call_t *call)
{
    const struct gw_http *http = H2O_STRUCT_FROM_MEMBER(struct gw_http, ctx, call->http);
    return atomic_load(&http->nconns);
}

void gw_http_set_app(gw_http_t *http, const gw_http_app_t *app)
{
    if (http != NULL)
        atomic_store(&http->handler->app, app);
}

void gw_http_stop(gw_http_t *http)
{
    if (http == NULL)
        return;
    gw_http_drain(http, 0);
    if (atomic_load(&http->inflight) > 0)
        SQ_WARN("drain timed out inflight=%ld", atomic_load(&http->inflight));
    for (int i = 0; i < http->nthreads; i++)
        if (http->threads[i].start_rc == 0)
            send_msg(&http->threads[i], MSG_EXIT);
    for (int i = 0; i < http->nthreads; i++)
        pthread_join(http->threads[i].thread, NULL);
    pthread_cond_destroy(&http->start_cond);
    pthread_mutex_destroy(&http->start_lock);
    free(http->threads);
    free(http);
}
