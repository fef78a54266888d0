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

typedef struct {
    gw_infer_t *req;
    int index;
    int64_t in_off;     /* arena offset of the item's input; -1 when none yet */
    uint8_t input_kind; /* SQ_INPUT_* */
    int64_t ready_us;   /* preprocessed and handed to the dispatcher */
    int64_t sent_us;    /* its batch went to a worker */
    int64_t done_us;
    int batch_size;
    int member;         /* in a prefix group's batch: its model's index there */
    gw_prep_job_t prep; /* JPEG items */
} gw_item_t;

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

/* Dispatch thread: created with the workers (gw_workers_start). */
typedef struct gw_dispatch gw_dispatch_t;

/* Any thread: the item's input is in the arena; hand it to the dispatcher. */
void gw_dispatch_submit(gw_server_t *srv, gw_item_t *item);
/* Any thread: a model was published (uploaded, profiled) or removed
 * (m == NULL, key given). */
void gw_dispatch_model_changed(gw_server_t *srv, int64_t key);
/* Any thread: profile model key on a worker that can serve it. */
void gw_dispatch_profile(gw_server_t *srv, int64_t key);

/* GET /v1/plan: the current plan (a new reference), or an empty one. */
json_t *gw_dispatch_plan_json(gw_server_t *srv);

/* The serving device kind of a model right now: the kind whose profile it
 * has and that has a worker up (cuda before cpu), emu for emulated models;
 * -1 when none. Thread-safe. */
int gw_dispatch_serving_kind(gw_server_t *srv, const gw_model_t *m);

/* Internal to the dispatch thread, called by workers.c. */
gw_dispatch_t *gw_dispatch_new(gw_server_t *srv, sq_loop_t *loop);
void gw_dispatch_free(gw_dispatch_t *ds);
void gw_dispatch_worker_up(gw_dispatch_t *ds, int worker, const char *device, uint64_t memory);
void gw_dispatch_worker_lost(gw_dispatch_t *ds, int worker);
/* Frames for the dispatcher (model, batch, profile); returns -1 on a
 * protocol error (the worker is then dropped). */
int gw_dispatch_frame(gw_dispatch_t *ds, int worker, const sq_frame_t *f);
/* Shutdown: answers everything still queued with SQ_SHUTTING_DOWN. */
void gw_dispatch_abort_all(gw_dispatch_t *ds);

/* workers.c: sends a frame to worker (dispatch thread only). */
int gw_workers_send(gw_workers_t *ws, int worker, uint16_t type, uint64_t id, const void *payload,
                    uint32_t len);

#endif
