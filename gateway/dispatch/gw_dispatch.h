/* dispatch/: the dispatch thread: items in, batches out through the link,
 * models loaded, profiled and planned onto workers. */
#ifndef GW_DISPATCH_H
#define GW_DISPATCH_H

#include "gw_image.h"
#include "gw_catalog.h"
#include "gw_server.h"
#include "gw_link.h"

#include <jansson.h>
#include <stdatomic.h>
#include <stdint.h>

/* One image or tensor row of an inference request: what the HTTP side
 * hands the dispatcher, and how the dispatcher answers it (its finish
 * callback, exactly once). */

typedef struct gw_infer gw_infer_t;

/* Dispatch priority levels, 1 the highest (a dispatcher session per level:
 * pl_session_cfg_t.priority). A request asks with Triton's numbers (OIP
 * parameters.priority, or X-Priority): 0 = the default level, 1 the
 * highest, a larger number lower; numbers past the last level count as the
 * last. The default sits one below the top so that a request can be
 * marked both above and below the traffic that does not say. */
#define GW_PRIORITY_LEVELS 4
#define GW_PRIORITY_DEFAULT 2

/* The level of a requested priority (>= 0). */
static inline int gw_priority_level(int64_t asked)
{
    return asked <= 0                   ? GW_PRIORITY_DEFAULT
           : asked > GW_PRIORITY_LEVELS ? GW_PRIORITY_LEVELS
                                        : (int)asked;
}

typedef struct gw_item gw_item_t;
struct gw_pipeline;

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
    uint8_t priority;   /* 1..GW_PRIORITY_LEVELS; 0 = the default level */
    /* 1: nobody asked for an SLO: slo_ms is only what it is planned at
     * (PL_LOOP_BEST_EFFORT_MS) and deadline_us the server's bound
     * (--max-request-ms); its session is best effort (pl_session_cfg_t). */
    uint8_t best_effort;
    int64_t ready_us; /* preprocessed and handed to the dispatcher */
    int64_t sent_us;  /* its batch went to a worker */
    int64_t done_us;
    /* Its batch's run on the worker, placed on squishd's clock (done, from
     * BATCH_DONE's exec_ns and total_ns): it ends as the worker's reply
     * leaves, half the round trip outside the worker before done_us, and
     * lasts exec_ns. 0 when it did not run. */
    int64_t exec_start_us, exec_end_us;
    int batch_size;
    int member;       /* in a prefix group's batch: its model's index there */
    uint64_t core_id; /* its handle in the dispatcher core (0: none; dispatch thread) */
    /* Not NULL: when it reads non-zero, the item is no longer wanted: its
     * request or pipeline query failed for another item
     * (GW_ABANDONED_FAILED) or its client went away (GW_ABANDONED_GONE).
     * It is taken out of the dispatcher's queues (gw_dispatch_withdraw) or
     * failed instead of being sent, and counted as withdrawn. */
    const atomic_int *abandoned;
    int core_session; /* its dispatcher session while queued (dispatch thread) */
    /* A pipeline query's item: the pipeline (the query holds a reference
     * while the item lives), the item's stage and the query's SLO; NULL
     * otherwise. The planner counts it toward that stage, whose session
     * follows the split when its budget moves (planning.c). */
    struct gw_pipeline *pipeline;
    int stage;
    double query_slo_ms;
    /* The next item of its clump: items ready together (the images of one
     * request, the crops of one detection run) are handed to the
     * dispatcher as one chain (gw_dispatch_submit); NULL: the last, or
     * alone. */
    gw_item_t *clump_next;
    /* Where its input is: 0 in this process's arena (in_off); k > 0 with
     * frontend k - 1, which holds it as fe_slot (a dispatcher's record of
     * a frontend's item: req and out are NULL, and the frontend answers
     * the client). */
    uint32_t src;
    uint64_t fe_slot;
    gw_prep_job_t prep; /* JPEG items */
};

/* Gathers the items of one request that become ready at different times,
 * on any threads (each image's decode), into one clump: the dispatcher
 * then sees them arrive together, as they did (one arrival: at low load
 * one batch at once, not the first alone and the rest read as a burst and
 * deferred). The request is answered when its last item is anyway, so the
 * early ones lose nothing by waiting for it. */
typedef struct {
    atomic_int unsettled;       /* items neither ready nor failed yet */
    _Atomic(gw_item_t *) ready; /* those ready, linked through clump_next */
} gw_clump_t;

static inline void gw_clump_init(gw_clump_t *c, int items)
{
    atomic_init(&c->unsettled, items);
    atomic_init(&c->ready, NULL);
}

/* One item of c is settled: item ready, or NULL for one that failed before
 * the dispatcher saw it. Returns the ready items as a chain, in the order
 * of their index, to the caller that settled the last one (the chain may
 * be NULL when none is ready); NULL to every other caller. Any thread. */
static inline gw_item_t *gw_clump_settle(gw_clump_t *c, gw_item_t *item)
{
    if (item != NULL) {
        gw_item_t *head = atomic_load(&c->ready);
        do
            item->clump_next = head;
        while (!atomic_compare_exchange_weak(&c->ready, &head, item));
    }
    if (atomic_fetch_sub(&c->unsettled, 1) != 1)
        return NULL;
    /* Pushed in the order they settled: sorted back into request order. */
    gw_item_t *chain = NULL, *it = atomic_exchange(&c->ready, NULL);
    while (it != NULL) {
        gw_item_t *next = it->clump_next, **at = &chain;
        while (*at != NULL && (*at)->index < it->index)
            at = &(*at)->clump_next;
        it->clump_next = *at;
        *at = it;
        it = next;
    }
    return chain;
}

/* Marks item done with rc (0 or an SQ_* error and a detail); the request's
 * last item triggers the reply. Thread-safe. */
void gw_item_finish(gw_item_t *item, int rc, const char *detail);

/* The dispatch thread's entry points (dispatch.c, worker_events.c and the
 * files below them, see gw_dispatch_int.h): other threads hand it items and
 * model changes. */

/* Any thread: the item's input is in the arena; hand it to the dispatcher.
 * With items linked from it through clump_next, they are a clump: ready
 * together (a request's images, a detection run's crops), they enter their
 * session as one arrival (pl_dispatch_requests). */
void gw_dispatch_submit(gw_server_t *srv, gw_item_t *item);
/* Why an item is abandoned (gw_item_t.abandoned's values). */
#define GW_ABANDONED_FAILED 1
#define GW_ABANDONED_GONE 2
/* Any thread: some items were abandoned. The dispatcher takes those still
 * queued out of its queues, so that no batch is sized for them, and fails
 * them as withdrawn (issue 23: refused or abandoned means withdrawn).
 * Calls that come before it looks are one look. */
void gw_dispatch_withdraw(gw_server_t *srv);
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

/* The least latency a request can get, as the dispatcher plans it: n
 * items of m alone on an idle worker of kind, in batches of at most the
 * model's max_batch one after the other, each l(b) on the profile the
 * dispatcher uses (corrected by what its workers report, the metric
 * squish_profile_scale) with the k_std margin, and the dispatch margin
 * once (pl_dispatch_least_us). Admission's refusals ("ask for N ms or
 * more") and deadlines are this, so that they say what dispatch will do. */
typedef struct {
    int64_t run_us;    /* the batches' latencies */
    int64_t margin_us; /* the dispatch margin (also when unknown) */
} gw_least_t;
/* 0 with *out; -1 when unknown (kind < 0, no profile of it, n < 1), with
 * out->run_us 0 and the margin. Thread-safe. */
int gw_dispatch_least(gw_server_t *srv, const gw_model_t *m, int kind, int n, gw_least_t *out);

/* GET /v2/health/ready: 1 when squishd can serve every ready model now
 * (the stored plan reapplied after a restart, a worker up for each ready
 * model's device kind, every model in the plan loaded on a worker), else 0
 * with the reason in why. As of the dispatch thread's last tick (50 ms).
 * Thread-safe. */
int gw_dispatch_ready(gw_server_t *srv, char *why, size_t len);
/* Whether a worker that is up holds model key (loaded, or in a loaded
 * prefix group) and can take a batch of it now. Thread-safe. */
int gw_dispatch_model_held(gw_server_t *srv, int64_t key);
/* Whether model key was taken out of service (unloaded or deleted) and a
 * batch or item of it is still on its way out. Thread-safe. */
int gw_dispatch_model_unloading(gw_server_t *srv, int64_t key);

/* Model control's load (POST /v2/repository/models/{m}/load): waits until
 * each of keys is ready to take a batch (a worker up holds it), or cannot
 * be (failed, deleted, unloaded again), or until deadline_us, then calls
 * settle once on the dispatch thread with what it found; settle ends the
 * job (gw_async_done). On shutdown it is called with aborted set. Any
 * thread; keys is copied. */
typedef struct {
    int ready, failed, waiting; /* keys in each state */
    int aborted;
    char why[256]; /* the first failed key's reason, else the first waiting one's */
} gw_await_result_t;
struct gw_async;
void gw_dispatch_await_loaded(gw_server_t *srv, struct gw_async *a, const int64_t *keys, int n,
                              int64_t deadline_us,
                              void (*settle)(struct gw_async *a, const gw_await_result_t *r));

/* Any thread: make model key servable without waiting for a request
 * (place it at its default SLO and load it), for a client that polls its
 * readiness before sending. */
void gw_dispatch_warm(gw_server_t *srv, int64_t key);

/* How far the measuring of a model is (GET /models/{m}). */
typedef struct {
    int64_t key;
    char device[64];
    int done, total;    /* batch sizes measured, and planned */
    int64_t started_us; /* when it started on that worker */
    int64_t updated_us; /* the last progress */
} gw_profile_progress_t;

/* Any thread: model key's measuring progress into *out; 0 when it is not
 * being measured now. */
int gw_dispatch_profile_progress(gw_server_t *srv, int64_t key, gw_profile_progress_t *out);

/* Made before the worker link starts (server.c), freed after it stopped.
 * The link's events for it (worker up, frame, lost, exited: a crash of its
 * own counts against the model it was loading, measuring or running, see
 * --model-retries; abort: answers everything held, 503 shutting_down). */
gw_dispatch_t *gw_dispatch_new(gw_server_t *srv, sq_loop_t *loop);
void gw_dispatch_free(gw_dispatch_t *ds);
extern const gw_transport_events_t gw_dispatch_events;

/* Frontends' traffic on the dispatcher's link, counted here (both ways,
 * frame headers included): for /metrics and the link's budget per item. */
typedef struct {
    uint64_t bytes_in, bytes_out;
    uint64_t items; /* items offered by frontends */
    int connected;  /* frontends connected now */
} gw_frontend_traffic_t;
void gw_dispatch_frontend_traffic(gw_server_t *srv, gw_frontend_traffic_t *out);
/* The cluster's one view, any thread: the exposition own with every
 * joined frontend's last one folded in, labelled by frontend
 * (gw_metrics_merge); and a model's statistics (gw_metrics_model_stats's
 * object) with every frontend's of the same name and version added. */
void gw_dispatch_frontends_metrics(gw_server_t *srv, const char *own, sq_buf_t *out);
void gw_dispatch_frontends_stats(gw_server_t *srv, json_t *model_stats);

#endif
