/* dispatch/: the dispatch thread: items in, batches out through the link,
 * models loaded, profiled and planned onto workers. */
#ifndef GW_DISPATCH_H
#define GW_DISPATCH_H

#include "gw_image.h"
#include "gw_catalog.h"
#include "gw_server.h"
#include "gw_link.h"
#include "gw_sched.h"

#include <jansson.h>
#include <stdatomic.h>
#include <stdint.h>

/* The dispatch thread's entry points (dispatch.c, worker_events.c and the
 * files below them, see gw_dispatch_int.h): other threads hand it items and
 * model changes. */

/* Any thread: a model was published (uploaded, profiled) or removed
 * (m == NULL, key given). ds is the dispatcher (not NULL). */
void gw_dispatch_model_changed(gw_dispatch_t *ds, int64_t key);
/* Any thread: profile model key on a worker that can serve it. */
void gw_dispatch_profile(gw_dispatch_t *ds, int64_t key);
/* After the dispatcher started: profile again the models whose profiling a
 * restart interrupted. */
void gw_dispatch_resume_profiling(gw_dispatch_t *ds);

/* GET /v1/plan: the current plan (a new reference), or an empty one
 * (also for ds NULL: a process without a dispatcher). */
json_t *gw_dispatch_plan_json(gw_dispatch_t *ds);

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
void gw_dispatch_await_loaded(gw_dispatch_t *ds, struct gw_async *a, const int64_t *keys, int n,
                              int64_t deadline_us,
                              void (*settle)(struct gw_async *a, const gw_await_result_t *r));

/* Any thread: make model key servable without waiting for a request
 * (place it at its default SLO and load it), for a client that polls its
 * readiness before sending. Nothing for ds NULL (a frontend). */
void gw_dispatch_warm(gw_dispatch_t *ds, int64_t key);

/* How far the measuring of a model is (GET /models/{m}). */
typedef struct {
    int64_t key;
    char device[64];
    int done, total;    /* batch sizes measured, and planned */
    int64_t started_us; /* when it started on that worker */
    int64_t updated_us; /* the last progress */
    /* The worker's run time spent on it and still expected, µs (-1: not
     * said yet): an ETA scales what is left by the wall time each run µs
     * took so far, the measurement running between batches. */
    double run_spent_us, run_left_us;
} gw_profile_progress_t;

/* Any thread: model key's measuring progress into *out; 0 when it is not
 * being measured now (or ds is NULL). */
int gw_dispatch_profile_progress(gw_dispatch_t *ds, int64_t key, gw_profile_progress_t *out);

/* Made before the worker link starts (server.c), freed after it stopped.
 * The link's events for it (worker up, frame, lost, exited: a crash of its
 * own counts against the model it was loading, measuring or running, see
 * --model-retries; abort: answers everything held, 503 shutting_down). */
/* The dispatcher's settings (server.c fills them from gw_config_t). */
typedef struct {
    pl_dispatch_opts_t core; /* policy, k_std, eager load, margin, timer slack */
    int epoch_ms, epoch_min_interval_ms, epoch_scale_up_ms;
    double plan_headroom, plan_burst_quantile;
    int plan_thread;        /* plans are computed on the planner thread */
    int configured_devices; /* the workers the groups ask for, in all */
    double default_slo_ms;  /* when neither the request nor the model gives one */
    int prefix_batching;    /* run shared-prefix groups as one */
    int model_retries;      /* crashes a model may cause before it is failed, less one */
    int lax_readiness;      /* 1 (--strict-readiness 0): ready whatever the models' state */
} gw_dispatch_config_t;

/* What the dispatcher is given: its settings and the handles of the rooms
 * it works with (server.c wires them). */
typedef struct {
    gw_dispatch_config_t cfg;
    sq_loop_t *loop; /* the dispatch thread's */
    gw_registry_t *registry;
    gw_pipes_t *pipelines;
    sq_shm_arena_t *arena;
    gw_metrics_t *metrics;
    gw_db_t *db; /* its jobs go to the DB thread (gw_db_job); NULL: no storage (tests) */
    gw_prep_pool_t *prep;
    /* The workers' link, once started (gw_workers_start fills the slot). */
    gw_transport_t *const *transport;
    const atomic_int *db_ready; /* the model DB is open (catalog/store.c writes it) */
} gw_dispatch_deps_t;

/* The dispatcher's settings and handles from srv's (server.c, which
 * wires the rooms; tests build theirs the same way). */
gw_dispatch_deps_t gw_dispatch_deps(gw_server_t *srv, sq_loop_t *loop);
gw_dispatch_t *gw_dispatch_new(const gw_dispatch_deps_t *deps);
void gw_dispatch_free(gw_dispatch_t *ds);
/* The dispatcher as this process's scheduler (gw_sched_t: items
 * submitted to it, readiness, held models, the least latency on the live
 * profiles); server.c picks it for every role but the frontend. */
gw_sched_t *gw_dispatch_sched(gw_dispatch_t *ds);
extern const gw_transport_events_t gw_dispatch_events;

/* Frontends' traffic on the dispatcher's link, counted here (both ways,
 * frame headers included): for /metrics and the link's budget per item. */
typedef struct {
    uint64_t bytes_in, bytes_out;
    uint64_t items; /* items offered by frontends */
    int connected;  /* frontends connected now */
} gw_frontend_traffic_t;
void gw_dispatch_frontend_traffic(gw_dispatch_t *ds, gw_frontend_traffic_t *out);
/* The cluster's one view, any thread: the exposition own with every
 * joined frontend's last one folded in, labelled by frontend
 * (gw_metrics_merge); and a model's statistics (gw_metrics_model_stats's
 * object) with every frontend's of the same name and version added. With
 * ds NULL (no dispatcher here): nothing counted, own as it is. */
void gw_dispatch_frontends_metrics(gw_dispatch_t *ds, const char *own, sq_buf_t *out);
void gw_dispatch_frontends_stats(gw_dispatch_t *ds, json_t *model_stats);

#endif
