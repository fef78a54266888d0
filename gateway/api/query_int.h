/* api/: internal to a pipeline's query files: query.c (the query's tree:
 * its nodes, their decode, crops and finish, its end), query_answer.c (its
 * answers) and query_route.c (its routes, which set it up and start it).
 * The routes call the other two, which call neither the routes nor each
 * other. A query's nodes (gw_qnode_t) and the parts tested without a
 * server are in api_int.h. */
#ifndef GW_QUERY_INT_H
#define GW_QUERY_INT_H

#include "api_int.h"
#include "gw_catalog.h"
#include "gw_codec.h"

#include <pthread.h>

typedef gw_qnode_t qnode_t;

typedef struct {
    int items;
    double queue_ms, execute_ms, done_ms;
    int batch_size;
} stage_timing_t;

struct gw_query {
    gw_async_t base; /* first */
    gw_pipeline_t *p;
    gw_model_t *models[GW_PIPE_MAX_STAGES];
    gw_crops_spec_t crops[GW_PIPE_MAX_STAGES]; /* bound to the parent's model */
    int kind[GW_PIPE_MAX_STAGES];              /* the serving device kind per stage */
    double cum_ms[GW_PIPE_MAX_STAGES];         /* deadlines from arrival */
    double budget_ms[GW_PIPE_MAX_STAGES];
    int64_t arrival_us;
    double slo_ms;
    int slo_from_timeout; /* slo_ms is Triton's parameters.timeout (given in us) */
    int priority;
    char request_id[80];
    int nframes;
    int *frame_w, *frame_h;
    qnode_t **roots; /* nframes * nroots */
    int nroots;
    int root_stage[GW_PIPE_MAX_STAGES];
    atomic_int pending;     /* nodes and crop jobs not finished */
    gw_clump_t roots_clump; /* the frames' roots, handed over together */
    gw_query_fate_t fate;
    int hopeless; /* refused for an SLO below its least: no retry can help */
    /* Failed for its deadline on the way: the least SLO the pipeline can
     * meet then (gw_query_least_slo_us), its chain and the stage that sets
     * it (-1: the chain); least_ms 0 otherwise. */
    double least_ms, least_chain_ms;
    int least_stage;
    pthread_mutex_t mu; /* nodes list, timings */
    qnode_t *all;
    stage_timing_t timing[GW_PIPE_MAX_STAGES];
    const uint8_t *body;
    size_t body_len;
    uint8_t *body_owned;
    size_t frame_len_max;  /* the largest frame's JPEG bytes, once parsed */
    gw_oip_request_t *oip; /* over OIP: the parsed request (its rows are the frames) */
    /* Another transport's query (gw_query_infer_v2; NULL for HTTP's): told
     * when it is done in place of the HTTP loop (gw_query_done), and freed
     * when both it and the transport let go (ext_refs). */
    gw_api_infer_fn ext_done;
    void *ext_arg;
    atomic_int ext_refs;
};

/* ---- the tree (query.c) ---------------------------------------------------- */

/* Starts the query on its frames (JPEG bytes that stay valid until it is
 * answered): a root node per frame per root stage, each decoded, then run,
 * then its crops cut for its child stages. */
void gw_query_start(gw_query_t *q, const gw_part_t *frames, int nframes);
/* The query is done (any thread, once): its transport answers it (the
 * HTTP loop, or ext_done). */
void gw_query_done(gw_query_t *q);
/* The least a stage's items take once ready: a batch of one on its
 * serving kind, plus the dispatch margin, as the dispatcher plans it
 * (gw_sched_least; the margin alone when unknown). */
int64_t gw_query_stage_least_us(gw_api_ctx_t *api, const gw_query_t *q, int stage);
/* The least SLO the query can meet now, in µs: on the longest chain of
 * stages a frame's decode (its p99, or the estimate for the largest
 * frame's size, frame_len_max, when that is more) and a batch of one of
 * each stage (with the
 * dispatch margin), as the dispatcher plans them, into *chain_us; and,
 * since a query gets the pipeline's split scaled to its SLO, the least
 * SLO whose every stage's deadline leaves it that chain (returned; never
 * below *chain_us). *short_stage: the stage that sets it, -1 when the
 * chain does. */
double gw_query_least_slo_us(gw_api_ctx_t *api, const gw_query_t *q, double *chain_us,
                             int *short_stage);
/* The client went away: nothing more runs for the query (its items still
 * queued are withdrawn, no later stage starts). Its gw_async_t gone. */
void gw_query_gone(gw_async_t *a);
/* The query's end (its gw_async_t dispose): its nodes, models, pipeline,
 * body and OIP request freed. */
void gw_query_dispose(gw_async_t *a);

/* ---- its answers (query_answer.c), its gw_async_t respond ----------------- */

/* POST /v1/pipelines/{p}/infer's: per frame, each root stage's result,
 * with the split and each stage's timing. */
void gw_query_respond(gw_async_t *a, h2o_req_t *hreq);
/* Over OIP: output RESULT, per frame the /v1 answer's frame as JSON text. */
void gw_query_respond_oip(gw_async_t *a, h2o_req_t *hreq);

#endif
