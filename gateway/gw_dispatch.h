/* The dispatch thread's entry points (dispatch.c and the files below it,
 * see gw_dispatch_int.h): other threads hand it items and model changes. */
#ifndef GW_DISPATCH_H
#define GW_DISPATCH_H

#include "gw_item.h"
#include "gw_transport.h"

#include <jansson.h>

/* Any thread: the item's input is in the arena; hand it to the dispatcher.
 * With items linked from it through clump_next, they are a clump: ready
 * together (a request's images, a detection run's crops), they enter their
 * session as one arrival (pl_dispatch_requests). */
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

/* GET /v2/health/ready: 1 when squishd can serve every ready model now
 * (the stored plan reapplied after a restart, a worker up for each ready
 * model's device kind, every model in the plan loaded on a worker), else 0
 * with the reason in why. As of the dispatch thread's last tick (50 ms).
 * Thread-safe. */
int gw_dispatch_ready(gw_server_t *srv, char *why, size_t len);
/* Whether a worker that is up holds model key (loaded, or in a loaded
 * prefix group) and can take a batch of it now. Thread-safe. */
int gw_dispatch_model_held(gw_server_t *srv, int64_t key);
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

#endif
