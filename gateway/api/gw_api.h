/* api/: squishd's HTTP API: the route table (routes.c) and its handlers,
 * one file per area (inference, complex queries, models, pipelines, Triton's
 * model repository, metrics). The room's public face is the table alone. */
#ifndef GW_API_H
#define GW_API_H

#include "gw_http.h"

#include <sq_buf.h>
#include <stdatomic.h>

/* The API's settings, copied once from gw_config_t (server.c). */
typedef struct {
    int max_inflight;      /* inference requests inside squishd at most (then 503) */
    double default_slo_ms; /* when neither the request nor the model gives one */
    int max_request_ms;    /* hard upper bound on any request's life (caps the SLO) */
    int max_images;        /* images (or tensor rows) per request */
    int64_t max_body_bytes;
    int access_log; /* one info line per HTTP request */
} gw_api_config_t;

/* What the API needs of the server, given once at creation (server.c
 * fills it, gw_api_deps): its settings, the handles it uses, and the
 * flags and slots other rooms own, read through the pointers given. */
typedef struct {
    gw_api_config_t cfg;
    sq_shm_arena_t *arena;
    gw_registry_t *registry;
    gw_pipes_t *pipelines;
    gw_prep_pool_t *prep;
    gw_metrics_t *metrics;
    gw_trace_t *trace;
    gw_shm_table_t *shm;
    int frontend;               /* --role frontend: a link to a dispatcher (front/) */
    gw_front_t *front;          /* that link (its metrics); NULL otherwise */
    gw_offload_t *offload;      /* parses large bodies off the HTTP loops */
    gw_dispatch_t *dispatch;    /* this process's dispatcher (dispatch/); NULL on a frontend */
    gw_db_t *db;                /* the model DB's thread (gw_db_job); NULL on a frontend */
    const atomic_int *stopping; /* SIGTERM seen: no new work */
    const atomic_int *db_ready; /* the model DB is open */
    /* Who schedules this process's items (the server's slot, gw_sched.h). */
    gw_sched_t *_Atomic const *sched;
} gw_api_deps_t;

/* The API's settings and handles from srv's (server.c, which wires the
 * rooms). */
gw_api_deps_t gw_api_deps(gw_server_t *srv);
/* The room's context, a copy of deps; freed by gw_api_free (accepts NULL)
 * once nothing can call the API any more. */
gw_api_ctx_t *gw_api_new(const gw_api_deps_t *deps);
void gw_api_free(gw_api_ctx_t *api);
/* What squishd's HTTP loops serve (gw_http_start, gw_http_set_app): the
 * API's route table, with api as the context its routes get (call->app).
 * The app is api's: it lives until gw_api_free. */
const gw_http_app_t *gw_api_app(const gw_api_ctx_t *api);

/* The facts the HTTP routes answer from, for another transport (grpc/;
 * facts.c): the same functions, so that both say the same. Any thread.
 * A version 0 is the one the model's policy serves by default; a
 * pipeline is a model of one version (1) to each. */

/* {"name", "version", "extensions"}, as GET /v2. */
json_t *gw_api_server_metadata(void);
/* 0 when ready (GET /v2/health/ready), else SQ_SHUTTING_DOWN or
 * SQ_NOT_READY with why. */
int gw_api_server_ready(gw_api_ctx_t *api, char *why, size_t len);
/* Triton's model configuration, as GET /v2/models/{m}/config, into *out:
 * 0, or SQ_MODEL_NOT_FOUND with why (what would work). */
int gw_api_model_config(gw_api_ctx_t *api, const char *name, int version, json_t **out, char *why,
                        size_t len);
/* Triton's statistics, as GET /v2/models[/{m}[/versions/{v}]]/stats
 * (name NULL: every model and pipeline) into *out: 0, or
 * SQ_MODEL_NOT_FOUND with why. */
int gw_api_model_stats(gw_api_ctx_t *api, const char *name, int version, json_t **out, char *why,
                       size_t len);
/* Triton's system shared memory (the caller checked the admin token, as
 * the routes do): a region's status ([{"name", "key", "offset",
 * "byte_size"}]; name NULL: every region's) into *out, as GET
 * /v2/systemsharedmemory[/region/{r}]/status; registering one, as POST
 * .../region/{r}/register; unregistering it (NULL: all), as POST
 * .../unregister, into *out the names unregistered. 0, or an error with
 * why (SQ_BAD_REQUEST, SQ_NOT_FOUND). */
int gw_api_shm_status(gw_api_ctx_t *api, const char *name, json_t **out, char *why, size_t len);
int gw_api_shm_register(gw_api_ctx_t *api, const char *name, const char *key, uint64_t offset,
                        uint64_t byte_size, char *why, size_t len);
int gw_api_shm_unregister(gw_api_ctx_t *api, const char *name, json_t **out, char *why, size_t len);
/* Triton's CUDA shared memory, as GET /v2/cudasharedmemory[/region/{r}]
 * /status, POST .../region/{r}/register and POST .../unregister answer
 * it (the caller checked the admin token): squish has no CUDA IPC, so no
 * region is ever registered: every region's status is [] (name NULL),
 * one's is SQ_NOT_FOUND, a register SQ_BAD_REQUEST, an unregister 0; each
 * with why (what to use instead); a name that is no region's
 * SQ_BAD_REQUEST. */
int gw_api_cudashm_status(gw_api_ctx_t *api, const char *name, json_t **out, char *why, size_t len);
int gw_api_cudashm_register(gw_api_ctx_t *api, const char *name, char *why, size_t len);
int gw_api_cudashm_unregister(gw_api_ctx_t *api, const char *name, char *why, size_t len);
/* Triton's trace and log settings, as GET and POST /v2[/models/{m}]
 * /trace/setting and /v2/logging (the caller checked the admin token):
 * change (the POST's body object; NULL: a GET) applied whole or refused,
 * then the settings now into *out, as the route's JSON; 0, or
 * SQ_BAD_REQUEST (a setting refused) or SQ_MODEL_NOT_FOUND (a model's
 * trace setting, model not NULL, of no model squishd has) with why. */
int gw_api_trace_setting(gw_api_ctx_t *api, const char *model, json_t *change, json_t **out,
                         char *why, size_t len);
int gw_api_log_settings(gw_api_ctx_t *api, json_t *change, json_t **out, char *why, size_t len);
/* The repository index's rows, as POST /v2/repository/index. */
json_t *gw_api_repository_index(gw_api_ctx_t *api, int ready_only);
/* Where a fact read on the model DB's thread is answered, once: err 0
 * with body (fn decrefs it; NULL for readiness), or an SQ_*
 * error with why (SQ_NOT_READY for a model that is not ready). Called
 * on the DB thread, or on the caller's before the call returns. */
typedef void (*gw_api_fact_fn)(void *arg, int err, json_t *body, const char *why);
/* KServe model metadata, as GET /v2/models/{m}[/versions/{v}]. */
void gw_api_model_metadata(gw_api_ctx_t *api, const char *name, int version, gw_api_fact_fn fn,
                           void *arg);
/* KServe model readiness, as GET /v2/models/{m}[/versions/{v}]/ready
 * (on a frontend, from its catalog, as its route). */
void gw_api_model_ready(gw_api_ctx_t *api, const char *name, int version, gw_api_fact_fn fn,
                        void *arg);

/* A frontend's (--role frontend) management routes: whether its HTTP
 * forwards method path (normalized, its segments escaped, no query) to
 * the dispatcher (the route's GW_TO_DISPATCHER; 0 on any other process),
 * and that forward for another transport, so that its method answers
 * what the route on the frontend answers: path (a query included) with
 * authorization's value as that header (NULL: none) and a JSON body
 * (NULL: none) to the dispatcher's HTTP. fn is called once, on a thread
 * of the forward's (or before this returns): err 0 with a 2xx answer's
 * JSON (body), or the error the answer names (its "code"; else its
 * status's) with its message, or SQ_NOT_READY when the dispatcher cannot
 * be reached (not joined yet). */
int gw_api_forwarded(const gw_api_ctx_t *api, const char *method, const char *path);
void gw_api_forward(gw_api_ctx_t *api, const char *method, const char *path,
                    const char *authorization, const char *body, gw_api_fact_fn fn, void *arg);

/* Where a DB job of another transport is answered, once: err 0, or an
 * SQ_* error with why. */
typedef void (*gw_api_done_fn)(void *arg, int err, const char *why);
/* Triton's model control, as POST /v2/repository/models/{m}/load and
 * /unload (repository_api.c; the caller checked the admin token): a
 * model's every version (or a pipeline) served again, waiting as the
 * route waits for them to be ready, or unloaded (dependents: a
 * pipeline's stage models too; a model that loaded pipelines use is
 * refused, SQ_IN_USE). Answered through fn on the DB or dispatch thread,
 * or before this returns (not found). */
void gw_api_model_control(gw_api_ctx_t *api, const char *name, int load, int dependents,
                          gw_api_done_fn fn, void *arg);

/* KServe v2 inference for another transport (infer_v2_call.c), with the
 * same admission, SLO, batching, deadlines and errors as POST
 * /v2/models/{m}[/versions/{v}]/infer: the request is that route's body
 * with Triton's binary extension (a JSON header of header_len bytes,
 * then the binary tensors). A pipeline's name starts its query as that
 * route starts it (query_route.c). The handle is the request's job: a
 * model's request or a pipeline's query. */
typedef struct gw_async gw_api_infer_t;
/* The request is done (any thread, once; possibly before
 * gw_api_infer_v2 returns): the transport takes its answer
 * (gw_api_infer_answer) where it likes, then releases it. */
typedef void (*gw_api_infer_fn)(void *arg, gw_api_infer_t *h);
/* Starts a request for model name (version 0: the default one), taking
 * body (malloc'd; freed with the request). 0 with *h, which holds two
 * references: the transport's (gw_api_infer_release once it will not
 * cancel any more) and the answer's (released after fn's
 * gw_api_infer_answer); or, refused before it started, an error with why
 * (the model or pipeline not found or not ready, squishd shutting down
 * or full), body freed and fn never called. *h is set before
 * the request starts, so that fn may find it there. */
int gw_api_infer_v2(gw_api_ctx_t *api, const char *name, int version, uint8_t *body, size_t len,
                    long long header_len, gw_api_infer_fn fn, void *arg, gw_api_infer_t **h,
                    char *why, size_t whylen);
/* A done request's answer, as the route's: err 0 with body (its JSON
 * header header_len bytes, -1: all JSON; sq_buf_dispose it), or the
 * route's error and message (what SLO would work, where one would). */
typedef struct {
    int err;
    char why[1024];
    sq_buf_t body;
    long long header_len;
} gw_api_infer_answer_t;
/* Settles and encodes h's answer into *a (once, after fn, any thread),
 * counting it in the metrics, then releases the answer's reference. */
void gw_api_infer_answer(gw_api_infer_t *h, gw_api_infer_answer_t *a);
/* The transport's client went away (any thread, while its reference is
 * held): the request's items not yet in a batch are withdrawn, never
 * run; it is then done as failed. */
void gw_api_infer_cancel(gw_api_infer_t *h);
/* Lets go of the transport's reference; the last one frees the request. */
void gw_api_infer_release(gw_api_infer_t *h);

/* Request traces, Triton's trace extension (trace.c; the rest of it is
 * internal to the room, trace_int.h). server.c makes the tracer before
 * HTTP serves (gw_server_t.trace) and frees it after HTTP stopped. */

/* A tracer whose lines go to path ("": none; then tracing cannot be turned
 * on). Neither opens the file nor starts the writer (gw_trace_open). */
gw_trace_t *gw_trace_new(const char *path);
/* Opens the file (appending; created 0644 less the umask) and starts the
 * writer thread; 0, or SQ_IO with why. Nothing to do without a path. */
int gw_trace_open(gw_trace_t *t, char *why, size_t len);
/* Writes every line queued, stops the writer and frees it; accepts NULL.
 * After the HTTP loops stopped (no more lines come). */
void gw_trace_free(gw_trace_t *t);

/* Registered system shared-memory regions, Triton's shared-memory extension
 * (shm_regions.c; the rest of it is internal to the room, shm_int.h).
 * server.c makes the table before HTTP serves (gw_server_t.shm) and frees
 * it after HTTP stopped. */
gw_shm_table_t *gw_shm_table_new(void);
/* Unregisters and unmaps every region; accepts NULL. After the HTTP loops
 * stopped (no request uses a region any more). */
void gw_shm_table_free(gw_shm_table_t *t);

#endif
