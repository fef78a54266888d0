/* api/: internal to the room: the handlers of the route table (one file per
 * area) and what the inference handlers share. */
#ifndef GW_API_INT_H
#define GW_API_INT_H

#include "gw_http.h"
#include "gw_api.h"
#include "gw_dispatch.h"

#include <stdatomic.h>

/* The room's context (gw_api_new): what every handler and job of the room
 * reads, given to them by the HTTP room as the context of the room's app
 * (a route's call->app, a job's gw_async_t.app). Read-only once made, but
 * for the in-flight count, which the room owns. */
struct gw_api_ctx {
    gw_api_config_t cfg;
    gw_http_app_t app; /* the route table with this as its context (gw_api_app) */
    sq_shm_arena_t *arena;
    gw_registry_t *registry;
    gw_pipes_t *pipelines;
    gw_prep_pool_t *prep;
    gw_metrics_t *metrics;
    gw_trace_t *trace;
    gw_shm_table_t *shm;
    int frontend;
    gw_front_t *front;
    gw_offload_t *offload;
    gw_dispatch_t *dispatch;
    gw_db_t *db;
    const atomic_int *stopping;
    const atomic_int *db_ready;
    gw_sched_t *_Atomic const *sched;
    atomic_long infer_inflight; /* inference requests inside squishd (max_inflight) */
};

/* The room's app (routes.c): its route table, done hook and a frontend's
 * forward, with api as the context they get. */
gw_http_app_t gw_api_routes(gw_api_ctx_t *api);
/* Who schedules the items now (the server's slot, read atomically). */
static inline gw_sched_t *gw_api_sched(const gw_api_ctx_t *api)
{
    return atomic_load(api->sched);
}

/* One inference request on its way through squishd (the infer_*.c files,
 * infer_int.h: infer_request.c sets it up, infer_item.c runs its items,
 * infer_reply.c and its route's file answer it):
 *
 *   HTTP loop:       parse, look the model up, stamp arrival and deadline,
 *                    split into items (one per image or tensor row)
 *   preprocess pool: decode + resize each JPEG item into a shared-memory slot
 *                    (tensor items are copied into a slot on the HTTP side);
 *                    the request's items reach the dispatcher together, once
 *                    the last is ready (one arrival, gw_clump_t)
 *   dispatch thread: queue the items in their session, batch, send to a worker,
 *                    copy the output row back, release the slots
 *   HTTP loop:       when every item is done, answer (gw_async_t)
 *
 * Every item finishes exactly once (result or error); the request is
 * answered when its last item finishes. */

typedef struct gw_infer gw_infer_t;
typedef enum { GW_API_V1, GW_API_V2 } gw_api_t;

/* Marks item done with rc (0 or an SQ_* error and a detail); the request's
 * last item triggers the reply: an inference request's items' finish.
 * Thread-safe. */
void gw_item_finish(gw_item_t *item, int rc, const char *detail);

struct gw_infer {
    gw_async_t base; /* first: the HTTP side sees a gw_async_t */
    gw_model_t *model;
    gw_api_t api;
    int64_t arrival_us;
    int64_t deadline_us;
    double slo_ms;
    double slo_asked_ms;  /* what the request asked for when the cap cut it; 0 otherwise */
    int slo_refused;      /* gw_infer_check_feasible refused its SLO, saying why and what works */
    int slo_from_timeout; /* slo_ms is Triton's parameters.timeout (given in us) */
    double least_ms; /* failed for its deadline: the least SLO its items can meet (0: unknown) */
    /* Who set slo_ms: "request" (X-SLO-Ms, ?slo_ms=, parameters.slo_ms or
     * Triton's timeout), "model" (its default_slo_ms) or "server"
     * (--default-slo-ms). Every answer says it (x-slo-source). */
    const char *slo_source;
    int priority; /* 1..GW_PRIORITY_LEVELS (gw_priority_level) */
    int top_k;
    char request_id[80];
    int n_items;
    gw_item_t *items;
    gw_prep_job_t *preps; /* the JPEG decode job of each item (n_items) */
    float *outputs;       /* n_items * model->out_elems, written by the dispatch thread */
    atomic_int pending;   /* items not finished */
    gw_clump_t clump;     /* its items, handed to the dispatcher together */
    atomic_int failed;    /* set once: the first error wins */
    int err;              /* valid when failed */
    char err_detail[256];
    /* The request body (JPEG bytes, tensor rows): h2o's own buffer, or a
     * copy in body_owned (gw_request_body); read only until the last item
     * finishes, which is before the reply. */
    const uint8_t *body;
    size_t body_len;
    uint8_t *body_owned;
    void *api_state; /* v2: the parsed OIP request; freed by its dispose (infer_v2.c) */
    /* Traced (Triton's trace extension): its trace id, else 0; its line is
     * written when it is disposed, with the moment and status of its
     * answer (0: none, the client went away). */
    uint64_t trace_id;
    int64_t reply_us;
    int reply_status;
    const char *oip_id; /* v2: the body's "id" when it gave one (its line names it) */
    /* Work on the outputs too long for an HTTP loop (a segmenter's
     * per-pixel argmax): run on the offload thread once the items are done,
     * before the answer is sent (gw_item_finish); NULL: none. */
    void (*finish)(gw_infer_t *req);
    json_t *answer_rows; /* v1: what finish built, one entry per image; the answer takes it */
    /* Another transport's request (gw_api_infer_v2; NULL for HTTP's):
     * told when it is done, in place of the HTTP loop (gw_infer_done),
     * and freed when both it and the transport let go (ext_refs). */
    gw_api_infer_fn ext_done;
    void *ext_arg;
    atomic_int ext_refs;
};

/* Shared with other request kinds (query.c): infer_reply.c's top-k,
 * infer_request.c's id and SLO. */
/* Top-k of output 0 in row with softmax scores: [{"index", "label", "score"}]. */
json_t *gw_top_k_json(const gw_model_t *m, const float *row, int k);
/* The request's X-Request-Id, or a new id. */
void gw_request_id(h2o_req_t *hreq, char *out, size_t len);
/* A new request id (no X-Request-Id to take it from). */
void gw_request_new_id(char *out, size_t len);
/* The SLO asked by X-SLO-Ms or ?slo_ms= in *slo (-1: none); 0, or
 * SQ_BAD_REQUEST with why. */
int gw_request_slo_ms(h2o_req_t *hreq, double *slo, char *why, size_t len);

/* Complex queries (query.c; the answer's in query_answer.c): the parts of
 * a query's tree that need no server, split out for
 * tests/gateway/api/test_query.c and test_query_answer.c.
 *
 * A query is a tree of nodes: a node is one item (an image or a crop) at
 * one stage. A frame of the request gives one node per root stage (frame
 * f's root r at f * nroots + r); a node of a stage with crop children,
 * once run, gives one node per detection per child stage. */
typedef struct gw_query gw_query_t;
typedef struct gw_qnode gw_qnode_t;
struct gw_qnode {
    gw_item_t item;     /* first: what the dispatcher sees */
    gw_prep_job_t prep; /* a root's JPEG decode */
    gw_query_t *q;
    int frame, stage;
    gw_qnode_t *parent;
    gw_detection_t det; /* a crop: its detection, in frame pixels */
    int rect_x, rect_y; /* where its image sits in the frame (0, 0 for a root) */
    /* Its image at native size, kept while crops are to be cut from it
     * (packed RGB); NULL otherwise. */
    uint8_t *original;
    int orig_w, orig_h;
    /* Frame pixels per pixel of its image (0: 1): a root kept at a DCT
     * scale (gw_prep_job_t.keep_cover) and the crops cut from it. */
    float sx, sy;
    /* A root: what its stage's deadline was moved by for this frame's own
     * decode (root_start), from its children's share. */
    int64_t extra_us;
    float *row; /* its output row */
    int ok;     /* ran */
    /* Its children per child stage (in the stage's children order). */
    int nkids[GW_PIPE_MAX_STAGES];
    gw_qnode_t **kids[GW_PIPE_MAX_STAGES];
    const uint8_t *jpeg; /* a root: its frame's JPEG */
    size_t jpeg_len;
    gw_qnode_t *next_all; /* the query's list of nodes */
};

/* The root stages (those on the request's image) in stage order into
 * root_stage (room for GW_PIPE_MAX_STAGES); returns how many. */
int gw_query_roots(const gw_pipeline_t *p, int *root_stage);
/* A query's SLO: slo_ms (<= 0: the pipeline's), at most max_ms; and, at
 * the pipeline's current split scaled to it, each stage's deadline from
 * the query's arrival (cum_ms) and budget (its deadline less its
 * parent's), in ms. Returns the SLO. */
double gw_query_split(gw_pipeline_t *p, double slo_ms, double max_ms, double *cum_ms,
                      double *budget_ms);
/* Places kid, a crop of node n: its detection d (in pixels of n's image)
 * in frame pixels, and where its image (r, in n's image) sits in the
 * frame. */
void gw_query_place_crop(const gw_qnode_t *n, const gw_detection_t *d, gw_rect_t r,
                         gw_qnode_t *kid);
/* Node n's part of the answer (models: per stage): a stage without crop
 * children gives {"predictions": its top_k}; else, per child stage id,
 * its nodes in detection order, each with its "box" (frame pixels) and
 * "score". */
json_t *gw_query_node_json(const gw_pipeline_t *p, gw_model_t *const *models, const gw_qnode_t *n);

/* How a query ends. The first node that fails fails the whole query at
 * once: abandoned is set, so that its items still queued are not run
 * (batches.c) and no later stage starts for it. */
typedef struct {
    atomic_int abandoned; /* GW_ABANDONED_FAILED or _GONE (gw_item_t) */
    atomic_int failed;    /* set once: the first error wins */
    int err;              /* valid when failed */
    char detail[512]; /* room for a refusal naming a stage, Triton's timeout and the least SLO */
    /* Set: the first failure takes the query's items still queued out of
     * the dispatcher (gw_sched_withdraw). */
    gw_api_ctx_t *api;
} gw_query_fate_t;
/* Fails the query (the first call's error and detail are kept) and
 * abandons it; any thread. */
void gw_query_fate_fail(gw_query_fate_t *f, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Its outcome for /metrics: a failure with a 503 error is a drop. */
gw_query_outcome_t gw_query_outcome(gw_query_fate_t *f);

/* A pipeline's query for another transport (gw_api_infer_v2), as POST
 * /v2/models/{pipeline}/infer runs it (query_route.c): the same
 * admission, SLO and priority parameters, refusals and answer, the body
 * (Triton's binary extension, taken; freed with the query) in place of
 * the route's. 0 with *h (two references, as gw_api_infer_v2's), or
 * refused before it started: an error with why, body freed, fn never
 * called. */
int gw_query_infer_v2(gw_api_ctx_t *api, gw_pipeline_t *p, uint8_t *body, size_t len,
                      long long header_len, gw_api_infer_fn fn, void *arg, gw_api_infer_t **h,
                      char *why, size_t whylen);
/* Whether another transport's handle is a query's (else a model's request). */
int gw_query_is(const gw_api_infer_t *h);
/* A query's gw_api_infer_answer (query_answer.c), less the release: its
 * route's answer, the JSON whole (header_len -1), or its error and
 * message, counted as the route counts it. */
void gw_query_answer(gw_api_infer_t *h, gw_api_infer_answer_t *a);
/* A query's gw_api_infer_cancel and gw_api_infer_release (query.c). */
void gw_query_cancel(gw_api_infer_t *h);
void gw_query_release(gw_api_infer_t *h);

/* The facts of the KServe model routes, on the DB thread (models_api.c),
 * for the HTTP routes and for other transports (facts.c). Both answer
 * for name's version (0: the one the registry serves by default) and
 * return 0 or an error with why (a not found's says what would work for
 * path's route, as gw_not_found_why). gw_kserve_metadata: {"name",
 * "versions", "platform", "inputs", "outputs"} into *body.
 * gw_kserve_ready: 0 when the version can take a batch now, else
 * SQ_NOT_READY with the reason (a measured version no worker up holds is
 * loaded on the way). */
int gw_kserve_metadata(mdb_t *db, gw_api_ctx_t *api, const char *name, int version,
                       const char *path, json_t **body, char *why, size_t len);
int gw_kserve_ready(mdb_t *db, gw_api_ctx_t *api, const char *name, int version, const char *path,
                    char *why, size_t len);
/* A model's readiness on a frontend (models_api.c; no DB there): from the
 * catalog its dispatcher sent it and the dispatcher's word on which
 * models a worker holds, so 0 means this frontend serves name's version
 * (0: the default) now; else SQ_NOT_READY with the reason, or not found
 * (not in the catalog yet, for path's route) with what would work. Any
 * thread. */
int gw_frontend_ready_why(gw_api_ctx_t *api, const char *name, size_t name_len, int version,
                          const char *path, char *why, size_t len);
/* A pipeline's readiness (routes.c): 0 when every stage's model is ready,
 * else SQ_NOT_READY with the stage and what became of its model. */
int gw_pipeline_ready_why(gw_api_ctx_t *api, gw_pipeline_t *p, char *why, size_t len);
/* Model configuration and the repository index (repository_api.c), from
 * the registry (any thread): name's version (0: the default; a pipeline's
 * is 1) into *out, 0 or SQ_MODEL_NOT_FOUND; every model version and
 * pipeline by name, or those that can serve now. */
int gw_model_config_of(gw_api_ctx_t *api, const char *name, size_t name_len, int version,
                       json_t **out);
json_t *gw_repository_index_json(gw_api_ctx_t *api, int ready_only);
/* Triton's statistics (metrics_api.c), from the registry and the metric
 * store (any thread): {"model_stats": [...]} of every model version and
 * pipeline (name NULL), or of name's versions (version 0) or one; 0, or
 * SQ_MODEL_NOT_FOUND when none matches. */
int gw_model_stats_json(gw_api_ctx_t *api, const char *name, size_t name_len, int version,
                        json_t **out);
/* The server's readiness (routes.c): 0 with the workers up, or
 * SQ_SHUTTING_DOWN or SQ_NOT_READY with why. */
int gw_server_ready_why(gw_api_ctx_t *api, int *workers, char *why, size_t len);

/* 404s that say what was not found and what would work (not_found.c).
 * The reason for name (version 0: any) not being found at path (the
 * request's, which decides the hint: a pipeline asked for on a model's
 * route gets the pipeline's route) into out; returns the error code.
 * Any thread. */
int gw_not_found_why(const gw_api_ctx_t *api, const char *path, const char *name, int version,
                     char *out, size_t len);
/* The same for a name of name_len bytes, not terminated (a malformed one
 * says so). */
int gw_name_not_found_why(const gw_api_ctx_t *api, const char *path, const char *name,
                          size_t name_len, int version, char *out, size_t len);
/* The same, sent as the call's answer (a malformed name says so). */
void gw_send_not_found(gw_call_t *call, h2o_iovec_t name, int version);
/* A {version} segment that is no version (gw_parse_version < 0). */
void gw_send_bad_version(gw_call_t *call, h2o_iovec_t v);
/* The request's body as a JSON object into *out (an empty body: {}); on
 * anything else replies 400 bad_json naming what the object holds
 * ("settings") and returns -1. */
int gw_body_object(gw_call_t *call, const char *what, json_t **out);
/* The call's normalized path, terminated (cut at len - 1). */
void gw_call_path(const gw_call_t *call, char *out, size_t len);

/* Routes (one file per area). */
void gw_route_models_post(gw_call_t *call);
void gw_route_repository_load(gw_call_t *call);
void gw_route_repository_unload(gw_call_t *call);
void gw_route_models_list(gw_call_t *call);
void gw_route_models_get(gw_call_t *call);
void gw_route_models_delete(gw_call_t *call);
void gw_route_models_delete_version(gw_call_t *call);
void gw_route_kserve_model(gw_call_t *call);
void gw_route_kserve_model_ready(gw_call_t *call);
void gw_route_infer_v1(gw_call_t *call);
void gw_route_infer_v2(gw_call_t *call);
void gw_route_metrics(gw_call_t *call);
void gw_route_model_stats(gw_call_t *call);
void gw_route_model_config(gw_call_t *call);
void gw_route_repository_index(gw_call_t *call);
void gw_route_repository_index_get(gw_call_t *call);
/* The log and trace settings (logging_api.c), for the routes and other
 * transports (facts.c): change (an object as the POST body; NULL: none)
 * applied whole or not at all, then the settings now into *out, as the
 * GET answers them; 0, or SQ_BAD_REQUEST with why (what is refused and
 * why). A trace setting is model's (model_len bytes, not terminated; NULL:
 * the global one), which must be a model squishd has, else
 * SQ_MODEL_NOT_FOUND. */
int gw_log_settings(json_t *change, json_t **out, char *why, size_t len);
int gw_trace_setting(gw_api_ctx_t *api, const char *model, size_t model_len, json_t *change,
                     json_t **out, char *why, size_t len);
void gw_route_logging_get(gw_call_t *call);
void gw_route_logging_post(gw_call_t *call);
/* /v2/trace/setting, and /v2/models/{m}/trace/setting with m in args[0]. */
void gw_route_trace_get(gw_call_t *call);
void gw_route_trace_post(gw_call_t *call);
/* Triton's shared-memory extension (shm_api.c): /v2/systemsharedmemory
 * [/region/{r}]/status|register|unregister with r in args[0] when given,
 * and the same under /v2/cudasharedmemory (no CUDA IPC: never a region). */
void gw_route_shm_status(gw_call_t *call);
void gw_route_shm_register(gw_call_t *call);
void gw_route_shm_unregister(gw_call_t *call);
void gw_route_cudashm_status(gw_call_t *call);
void gw_route_cudashm_register(gw_call_t *call);
void gw_route_cudashm_unregister(gw_call_t *call);
void gw_route_pipelines_post(gw_call_t *call);
void gw_route_pipelines_list(gw_call_t *call);
void gw_route_pipelines_get(gw_call_t *call);
void gw_route_pipelines_delete(gw_call_t *call);
/* ?force=true (or 1): a delete or unload of a model that stored
 * pipelines use goes ahead anyway. */
int gw_force_param(gw_call_t *call);
/* A delete (unload 0) or an unload (1) of model name (version 0: every
 * version) that stored pipelines use (loaded ones, for an unload) is
 * refused: a fails 409 in_use naming them and how to go on; 1 then, else
 * 0. Any thread (the registries are thread-safe). */
int gw_refuse_in_use(gw_async_t *a, int unload, const char *name, int version);
void gw_route_pipeline_infer(gw_call_t *call);
/* POST /v2/models/{pipeline}/infer (routes.c sends a name that is a
 * pipeline's here). */
void gw_route_pipeline_infer_v2(gw_call_t *call);
/* metrics_api.c: a request h2o is freeing (its status is final): counts it
 * by route and status, and writes the access log line when enabled; app is
 * the API's context (the app's done hook). */
void gw_metrics_http_done(void *app, h2o_req_t *req, const char *route, int64_t start_ns);

#endif
