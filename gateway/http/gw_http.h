/* http/: the h2o plumbing: HTTP loops, the route table's type, requests
 * answered from other threads, gzip and deflate bodies both ways, the
 * admin token, the offload thread. */
#ifndef GW_HTTP_H
#define GW_HTTP_H

#include "gw_server.h"

#include <h2o.h>
#include <jansson.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* HTTP plumbing shared by squishd's route files: the request context, the
 * route table and JSON/error response helpers. Everything here runs on an
 * HTTP loop thread and must not block. */

#define GW_MAX_ROUTE_ARGS 4

/* The offload thread (offload.c, below). */
typedef struct gw_offload_ctx gw_offload_t;

/* The HTTP room's settings, copied once from gw_config_t (server.c). */
typedef struct {
    char listen_host[64]; /* bare: "::1" for --listen [::1]:8000 */
    int listen_port;
    char port_file[256]; /* "" = none */
    int http_threads;
    int max_connections;
    int max_header_kb;
    int http_request_timeout_ms;
    int64_t max_body_bytes;
    int frontend; /* --role frontend: GW_TO_DISPATCHER routes are forwarded */
    char admin_token[65];
} gw_http_config_t;

/* What the HTTP room needs of the server, given once at gw_http_start
 * (server.c fills it, gw_http_deps): its settings, the handles it uses,
 * and the flags other rooms own, read through the pointers given. */
typedef struct {
    gw_http_config_t cfg;
    const atomic_int *stopping; /* SIGTERM seen (the server's; any thread) */
    atomic_int *http_port;      /* the bound port, published for others */
    gw_offload_t *offload;      /* inflates large compressed bodies */
    gw_front_t *front;          /* --role frontend: the dispatcher's address (proxy.c); else NULL */
} gw_http_deps_t;

/* The HTTP room's settings and handles from srv's (server.c, which wires
 * the rooms). */
gw_http_deps_t gw_http_deps(gw_server_t *srv);

/* Binds, then runs deps->cfg.http_threads h2o event loops; *out is the
 * room once they all listen (freed by gw_http_stop). */
struct gw_http_app;
int gw_http_start(const gw_http_deps_t *deps, const struct gw_http_app *app, gw_http_t **out,
                  char *err, size_t errlen);
/* Serves app from now on (a standby that came to lead), on the same
 * listener; requests already under way finish with the old table. */
void gw_http_set_app(gw_http_t *http, const struct gw_http_app *app);
/* Stops accepting and waits up to timeout_ms for in-flight requests;
 * accepts NULL. */
void gw_http_drain(gw_http_t *http, int timeout_ms);
/* Stops the loops, joins the threads (after gw_http_drain) and frees the
 * room; accepts NULL. */
void gw_http_stop(gw_http_t *http);

/* What a route handler gets: the request, the context of the app it
 * belongs to (gw_http_app_t.ctx), and the path segments matched by '*' in
 * the route's pattern (borrowed from the request). */
struct gw_http_ctx;
typedef struct {
    h2o_req_t *req;
    void *app; /* the serving app's ctx: what its routes need, given by its maker */
    const struct gw_http_ctx *http; /* the HTTP room's settings (http_int.h) */
    h2o_iovec_t args[GW_MAX_ROUTE_ARGS];
    int nargs;
    h2o_multithread_receiver_t *reply_to; /* the loop thread serving req */
} gw_call_t;

/* Open client connections of the room that serves call (max_connections);
 * its loop thread. */
int gw_http_connections(const gw_call_t *call);

/* A reply computed off the HTTP loop (on the DB thread, a worker...).
 *
 * gw_async_new ties a job to the request: when the job is done, any thread
 * calls gw_async_done, and the loop thread that owns the request sends the
 * reply. If the client went away meanwhile (h2o freed the request), the
 * reply is dropped safely. The job is freed when both the request side and
 * the completion side have let go; both happen on the loop thread. */
typedef struct gw_async gw_async_t;
/* A header of a raw reply: the name static and lower-case, the value
 * malloc'd (the job frees it). */
typedef struct {
    const char *name;
    char *value;
} gw_async_header_t;
#define GW_ASYNC_MAX_HEADERS 8
struct gw_async {
    h2o_multithread_message_t super;
    h2o_multithread_receiver_t *reply_to;
    h2o_req_t *req; /* NULL once the client is gone */
    int refs;
    void *app; /* the call's app context (gw_call_t.app), for the job */
    /* Filled by the job: an error (SQ_*) with detail, or a status and body. */
    int err;
    char detail[512];
    /* The detail when it does not fit in detail (malloc'd, freed with the
     * job): an import's refusal names every op missing with its node, 12
     * of a postprocessed detector's took 700 bytes. Read gw_async_detail. */
    char *detail_long;
    int status;
    json_t *body;
    const char *location; /* optional Location header (static or owned by the job) */
    /* Bytes the job owns (malloc'd, freed with it; a respond hook may take
     * them). Without a respond hook, when raw is set and err is 0, they are
     * the reply, sent as they are rather than as JSON (a forwarded answer):
     * the status, raw_headers in their order (values malloc'd, freed with
     * the job), and the bytes of raw from raw_off to raw_len. */
    uint8_t *raw;
    size_t raw_off, raw_len;
    gw_async_header_t raw_headers[GW_ASYNC_MAX_HEADERS];
    int nraw_headers;
    /* Optional: sends a reply other than JSON; called on the loop thread. */
    void (*respond)(gw_async_t *a, h2o_req_t *req);
    /* Optional: frees what the job owns; called once, on the loop thread. */
    void (*dispose)(gw_async_t *a);
    /* Optional: the client went away before the reply was sent (h2o freed
     * the request: the connection closed or reset); called at most once,
     * on the loop thread, while the job is still alive. The job still ends
     * with gw_async_done as usual; its reply goes nowhere. */
    void (*gone)(gw_async_t *a);
    int answered; /* its reply was sent (loop thread) */
    int gone_told;
    /* HTTP/1 only (gw_async_watch): h2o reads nothing more from the
     * connection until the reply, so a client that closes is found by
     * peeking at its socket every 100 ms. */
    h2o_linklist_t watch_link;
    int watch_fd;
    void *watch_thread;
};

/* Allocates a job of `size` bytes (>= sizeof(gw_async_t), zeroed) bound to
 * the call's request. */
gw_async_t *gw_async_new(gw_call_t *call, size_t size);
/* From any thread: the job is done; the loop thread replies. */
void gw_async_done(gw_async_t *a);
/* Loop thread, once its gone hook is set: tells the job when its client
 * goes away before the reply (HTTP/2: a reset stream or a closed
 * connection; HTTP/1: a connection closed, found within about 100 ms). */
void gw_async_watch(gw_async_t *a);
/* Sets the job's reply to an error (with optional detail). */
void gw_async_fail(gw_async_t *a, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The job's error detail, whole ("": none). */
const char *gw_async_detail(const gw_async_t *a);
/* Frees the detail that did not fit (a job freed other than by its HTTP
 * reply: another transport's). */
void gw_async_dispose_detail(gw_async_t *a);

/* The request body for work that ends before the reply is sent (parsing,
 * decoding, copying rows into the arena, on any thread). HTTP/1: read in
 * place (*owned NULL): h2o stops reading a connection while its request is
 * processed and keeps the input buffer, body included, until the response
 * is written, so a client that leaves is noticed only then. HTTP/2: a
 * stream reset frees its body at once, so it is copied into *owned (the
 * caller frees it). Returns 0, or SQ_OVERLOAD when memory for the copy is
 * short (never aborts: the size is the client's). */
int gw_request_body(h2o_req_t *req, const uint8_t **data, size_t *len, uint8_t **owned);

/* The value of a request header (lower-case name), or an empty iovec. */
h2o_iovec_t gw_header(h2o_req_t *req, const char *name);
/* Whether the request carries the admin bearer token; if not, replies 401
 * and returns 0. */
int gw_require_admin(gw_call_t *call);
/* A {version} path segment: 1..1000000000, or -1. */
int gw_parse_version(h2o_iovec_t v);
/* The value of query parameter `name` in out (URL-decoded, terminated).
 * Returns 1 when present. */
int gw_query_param(h2o_req_t *req, const char *name, char *out, size_t outlen);

typedef void (*gw_route_fn)(gw_call_t *call);

typedef struct {
    const char *method;  /* "GET", "POST", "DELETE" */
    const char *pattern; /* "/v2/models/ * /ready" without spaces: '*' matches one segment */
    const char *name;    /* route label for logs and metrics */
    gw_route_fn fn;
    /* GW_ON_FRONTEND: a frontend (--role frontend) serves it itself
     * (inference, health, its own settings); GW_TO_DISPATCHER: a frontend
     * forwards it to the dispatcher, whose model DB and plan it is about. */
    int on_frontend;
} gw_route_t;

#define GW_ON_FRONTEND 1
#define GW_TO_DISPATCHER 0

/* A frontend's forward of a management route to its dispatcher's HTTP
 * (proxy.c): the dispatcher's answer goes back as it is. */
void gw_proxy_to_dispatcher(gw_call_t *call);
/* The same forward for another transport (grpc/, through gw_api_forward):
 * method and path (its query included, its segments escaped) to the
 * dispatcher's HTTP of front, with authorization's value as that header
 * (NULL: none) and body as a JSON body (NULL: none). fn is called once,
 * on a thread of its own (or before this returns): err 0 with the
 * answer's status and its body (NULL when it is no JSON; fn decrefs it),
 * or SQ_NOT_READY (not joined, the dispatcher unreachable), SQ_PROTOCOL
 * (no HTTP answer) or SQ_OVERLOAD (no thread) with why. */
typedef void (*gw_proxy_fn)(void *arg, int err, int status, json_t *body, const char *why);
void gw_proxy_json(gw_front_t *front, const char *method, const char *path,
                   const char *authorization, const char *body, gw_proxy_fn fn, void *arg);

/* The standard reason phrase of an HTTP status ("Accepted" for 202, "Not
 * Found" for 404); every response squishd sends carries its status's. */
const char *gw_http_reason(int status);
/* Sends len bytes of body (copied) as the response, with the status,
 * reason and headers the caller has set: every body squishd sends goes
 * out through here. Between 1 KiB and 1 MiB (GW_COMPRESS_*_BYTES), gzip-
 * or deflate-compressed when the request's Accept-Encoding asks for it
 * (q-values and identity honoured) and it comes out smaller, with
 * Content-Encoding; those sizes carry Vary: Accept-Encoding. */
void gw_send_body(h2o_req_t *req, const void *body, size_t len);
/* Sends obj (stolen) as JSON with the status. */
void gw_send_json(h2o_req_t *req, int status, json_t *obj);
/* Sends {"error": detail or the default message, "code": name} with the
 * error's HTTP status; a 503 carries Retry-After. */
void gw_send_error(h2o_req_t *req, int err, const char *detail);
/* The same; a 503 carries Retry-After: 1 only when retry is not 0 (a retry
 * can succeed). */
void gw_send_error_retry(h2o_req_t *req, int err, const char *detail, int retry);
/* Adds a response header (name is lower-case). */
void gw_add_header(h2o_req_t *req, const char *name, const char *value);

/* What the HTTP loops serve: the route table (first match of method and
 * pattern wins; a pattern that matches with another method answers 405
 * with Allow), the context its routes get, and a hook called once per
 * request when h2o frees it. The app is the caller's: it outlives the room
 * that serves it (gw_http_stop). */
typedef struct gw_http_app {
    const gw_route_t *routes;
    size_t nroutes;
    /* Handed to the routes, fallback and forward as gw_call_t.app, to
     * their jobs as gw_async_t.app, and to done; the room never reads it. */
    void *ctx;
    /* Optional: answers every request no route matches (else 404 or 405). */
    void (*fallback)(gw_call_t *call);
    const char *fallback_name;
    /* Optional: on a frontend, answers the routes it does not serve itself
     * (GW_TO_DISPATCHER; gw_proxy_to_dispatcher). */
    void (*forward)(gw_call_t *call);
    /* Optional: h2o is freeing req (its status is final); ctx is the app's. */
    void (*done)(void *ctx, h2o_req_t *req, const char *route, int64_t start_ns);
} gw_http_app_t;

/* Whether a frontend's HTTP loops forward method path (normalized,
 * without its query) to the dispatcher (app->forward, the route's
 * GW_TO_DISPATCHER): another transport on a frontend answers the same
 * question where its HTTP does. 0 for a path no route matches. */
int gw_http_forwarded(const gw_http_app_t *app, const char *method, const char *path);

/* The route table's lookup, as the HTTP loops do it for every request
 * (route.c, exposed for tests/gateway/http/test_route.c; gw__: internal).
 * path is the normalized path; trailing slashes are not significant. The
 * first route whose pattern matches path and whose method is method, with
 * the segments its '*'s matched in call->args; else NULL, and allow holds
 * the methods of the routes whose pattern matches ("GET, DELETE"; empty
 * when none does: then it is a 404, else a 405 with Allow); a method that
 * does not fit in allowlen is left out. */
const gw_route_t *gw__route_find(const gw_http_app_t *app, h2o_iovec_t method, h2o_iovec_t path,
                                 gw_call_t *call, char *allow, size_t allowlen);

/* The admin token (token.c). */

/* Reads it from path into token (65 bytes: 64 hex digits), or creates a
 * random one (mode 0600) on first start. A token file readable by group or
 * others is refused. */
int gw_token_load(const char *path, char token[65], char *err, size_t errlen);
/* Constant-time comparison of a presented bearer token with the admin one. */
int gw_token_matches(const char *admin_token, const char *presented, size_t len);

/* The offload thread (offload.c): slow work off the HTTP loops. Starts it
 * (*out), or returns SQ_NOMEM. */
int gw_offload_start(gw_offload_t **out);
/* Runs fn(arg) on the offload thread. */
void gw_offload(gw_offload_t *o, void (*fn)(void *arg), void *arg);
/* Runs what was posted, stops the thread and frees it; accepts NULL. */
void gw_offload_stop(gw_offload_t *o);

#endif
