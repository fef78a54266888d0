/* One inference request on its way through squishd, and the dispatch
 * thread's entry points.
 *
 *   HTTP loop:       parse, look the model up, stamp arrival and deadline,
 *                    split into items (one per image or tensor row)
 *   preprocess pool: decode + resize each JPEG item into a shared-memory slot
 *                    (tensor items are copied into a slot on the HTTP side)
 *   dispatch thread: queue the item in its session, batch, send to a worker,
 *                    copy the output row back, release the slots
 *   HTTP loop:       when every item is done, answer (gw_async_t)
 *
 * Every item finishes exactly once (result or error); the request is
 * answered when its last item finishes. */
#ifndef GW_INFER_H
#define GW_INFER_H

#include "gw_http.h"
#include "gw_preprocess.h"
#include "gw_registry.h"

#include <stdatomic.h>

typedef struct gw_infer gw_infer_t;

typedef struct gw_item gw_item_t;

/* One image or tensor row of a request. The fields from srv to finish are
 * set before it is submitted, and are all the dispatcher knows of it: it
 * never reaches into the request. */
struct gw_item {
    gw_infer_t *req;
    int index;
    gw_server_t *srv;
    gw_model_t *model; /* the request's reference */
    double slo_ms;
    int64_t arrival_us, deadline_us;
    float *out; /* its output row (model->out_elems floats) */
    /* Called exactly once, on any thread, with the item's outcome. */
    void (*finish)(gw_item_t *item, int rc, const char *detail);
    int64_t in_off;     /* arena offset of the item's input; -1 when none yet */
    uint8_t input_kind; /* SQ_INPUT_* */
    int64_t ready_us;   /* preprocessed and handed to the dispatcher */
    int64_t sent_us;    /* its batch went to a worker */
    int64_t done_us;
    int batch_size;
    int member;         /* in a prefix group's batch: its model's index there */
    uint64_t core_id;   /* its handle in the dispatcher core (0: none; dispatch thread) */
    gw_prep_job_t prep; /* JPEG items */
};

typedef enum { GW_API_V1, GW_API_V2 } gw_api_t;

struct gw_infer {
    gw_async_t base; /* first: the HTTP side sees a gw_async_t */
    gw_model_t *model;
    gw_api_t api;
    int64_t arrival_us;
    int64_t deadline_us;
    double slo_ms;
    int top_k;
    char request_id[80];
    int n_items;
    gw_item_t *items;
    float *outputs;     /* n_items * model->out_elems, written by the dispatch thread */
    atomic_int pending; /* items not finished */
    atomic_int failed;  /* set once: the first error wins */
    int err;            /* valid when failed */
    char err_detail[256];
    /* The request body (JPEG bytes, tensor rows): h2o's own buffer, or a
     * copy in body_owned (gw_request_body); read only until the last item
     * finishes, which is before the reply. */
    const uint8_t *body;
    size_t body_len;
    uint8_t *body_owned;
    void *api_state; /* v2: the parsed OIP request; freed by api_dispose */
    void (*api_dispose)(gw_infer_t *req);
};

/* Marks item done with rc (0 or an SQ_* error and a detail); the request's
 * last item triggers the reply. Thread-safe. */
void gw_item_finish(gw_item_t *item, int rc, const char *detail);

/* The dispatch thread's state (dispatch.c), on the dispatch loop. */
typedef struct gw_dispatch gw_dispatch_t;

/* Any thread: the item's input is in the arena; hand it to the dispatcher. */
void gw_dispatch_submit(gw_server_t *srv, gw_item_t *item);
/* Any thread: a model was published (uploaded, profiled) or removed
 * (m == NULL, key given). */
void gw_dispatch_model_changed(gw_server_t *srv, int64_t key);
/* Any thread: profile model key on a worker that can serve it. */
void gw_dispatch_profile(gw_server_t *srv, int64_t key);
/* After the dispatcher started: profile again the models whose profiling a
 * restart interrupted. */
void gw_dispatch_resume_profiling(gw_server_t *srv);

/* GET /v1/plan: the current plan (a new reference), or an empty one. */
json_t *gw_dispatch_plan_json(gw_server_t *srv);

/* The serving device kind of a model right now: the kind whose profile it
 * has and that has a worker up (cuda before cpu), emu for emulated models;
 * -1 when none. Thread-safe. */
int gw_dispatch_serving_kind(gw_server_t *srv, const gw_model_t *m);

/* Made before the worker link starts (server.c), freed after it stopped.
 * The link's events for it (worker up, frame, lost, exited: a crash of its
 * own counts against the model it was loading, measuring or running, see
 * --model-retries; abort: answers everything held, 503 shutting_down). */
gw_dispatch_t *gw_dispatch_new(gw_server_t *srv, sq_loop_t *loop);
void gw_dispatch_free(gw_dispatch_t *ds);
extern const gw_transport_events_t gw_dispatch_events;

#endif
