/* Internals of the dispatch thread shared by all its files: the records
 * (workers, models, loads, sessions, handles, frontends, the commands
 * placement emits for the batcher) and records.c's lookups; and the top
 * files' (readiness.c, frontends.c, dispatch.c, worker_events.c). The
 * room's two parts have private headers of their own on this one:
 * placement_int.h (model_loads.c, profiling.c, prefix_groups.c,
 * plan_report.c, epochs.c, planning.c) and batcher_int.h (batches.c,
 * submit.c). Dispatch thread only. */
#ifndef GW_DISPATCH_INT_H
#define GW_DISPATCH_INT_H

#include "gw_catalog.h"
#include "gw_dispatch.h"
#include "gw_server.h"

#include <pl.h>
#include <pl_dispatch.h>

typedef struct ds_plan_state ds_plan_state_t;

enum { LOAD_NONE, LOAD_WAIT_BYTES, LOAD_SENT, LOAD_DONE, LOAD_FAILED };

typedef struct {
    int64_t key;
    int state;
    int max_batch;
    /* Answers still to come for loads this worker was told to unload before
     * it answered: they are not about the model as it is now. */
    int stale;
    uint64_t sent_seq; /* its place in the worker's job order, while LOAD_SENT */
} ds_load_t;

typedef struct ds_batch {
    uint64_t id;
    int64_t model_key;
    int count;
    gw_item_t **items;
    int64_t out_off;
    uint64_t out_stride;
    int64_t sent_us;
    uint64_t seq; /* its place in the worker's job order */
} ds_batch_t;

typedef struct {
    int id;
    int up;
    int kind;
    char device[64];
    int profiling; /* measuring a model in its gaps (profiling.c) */
    /* The measurement's slices: the core's id of the one the worker runs
     * (0: none), the worker's estimate of its next measurement batch, since
     * when it waits for a gap, whether the next one starts over. */
    uint64_t slice_id;
    int64_t slice_next_us;
    int64_t slice_wait_since_us;
    int slice_fresh;
    uint64_t memory_bytes;
    ds_load_t *loads;
    int nloads, caploads;
    char (*shas)[65]; /* model files this connection already received */
    int nshas;
    ds_batch_t *inflight;
    /* The worker runs its jobs (batches, measurement slices) in the order
     * sent, and builds the models it is sent on a loader thread beside
     * them: each outstanding job has a number from job_seq, and when the
     * worker dies the oldest is taken for the one it was running (a load
     * still building when a batch sent after it crashed is blamed instead;
     * its crash count is reset by its next good batch). That model is the
     * suspect until the process's exit status says whether it crashed. */
    uint64_t job_seq;
    int64_t profile_key; /* the model it measures (profile_seq != 0) */
    uint64_t profile_seq;
    int has_suspect;
    int64_t suspect_key;
    char suspect_doing[16]; /* "loading", "measuring", "running" */
    /* A remote worker's link as its connection measured it (addr[0] == 0:
     * local): the core adds rtt + bytes / bandwidth to its batches. */
    char addr[64];
    int64_t rtt_us;
    double bytes_per_us;
    /* Where frontends send it their rows (WORKER_DATA; "" none: it takes
     * no frontend's items). */
    char data_addr[64];
} ds_worker_t;

/* Batch-time ratios a model's live profile keeps (batches.c). */
#define LIVE_SAMPLES 32

typedef struct ds_model {
    int64_t key;
    gw_model_t *m;
    int kind;
    int active;       /* requested: loaded on every worker of its kind */
    int blob_state;   /* 0 none, 1 fetching, 2 have, 3 failed */
    sq_bytes_t *blob; /* the file; connections sending it hold references */
    size_t blob_len;
    int profile_pending; /* wants a profile on a cpu/cuda worker */
    /* Device kinds whose workers refused to load it while it was measured
     * (bit k: kind k), until its entry says so (gw_model_t.not_on): it is
     * measured on the next kind instead. */
    unsigned refused_kinds;
    /* Its very file is being measured as another model (an older upload
     * still profiling): it takes that profile when it is stored, rather
     * than being measured a second time (ds_twin_measuring). */
    int twin_wait;
    int profile_worker;  /* -1 or the worker measuring it */
    gw_item_t **pending; /* waiting for a first load */
    int npending, cappending;
    int removed;
    /* Removed by an unload, then loaded again before it was freed: once
     * reclaim() frees it, a new record takes its key (1 + the profile
     * message its load asked for). */
    int revive;
    /* Its routes may have changed without being made again (a load or
     * unload while inactive, a worker lost): the next enqueue routes it. */
    int routes_stale;
    /* A prefix group (key < 0): m is a stand-in entry owned here (name,
     * input, the widest output, the group's own measured profile); the
     * members run their shared layers as one batch (worker/group.c). */
    int is_group;
    int64_t group_id;
    int nmembers;
    gw_model_t **members;      /* references, ordered by key */
    int failed;                /* could not load or measure: members run alone */
    sq_bytes_t **member_blobs; /* while sending member files to workers */
    size_t *member_lens;
    char members_key[65]; /* its stored profile's key: digest of members' files and cuts */
    /* A model: its group, when one formed, and the group epoch it was
     * last looked for in. */
    struct ds_model *group;
    uint64_t group_checked;
    /* Another model with the very same file and input that serves this
     * one's requests from its own load (one loaded copy for both), and the
     * group epoch it was last looked for in. */
    struct ds_model *twin;
    uint64_t twin_checked;
    /* Worker crashes while it was loaded, measured or run; past
     * --model-retries it is poisoned: marked failed, never sent again. */
    int crashes;
    int poisoned;
    char failed_why[256];
    /* Live profile (batches.c): the last LIVE_SAMPLES ratios of a batch's
     * measured run time to the profile's l(b), and the correction the
     * dispatcher and planner use (0: none, as profiled; else live_profile
     * holds the profile of live_kind times live_scale). */
    float live_ratios[LIVE_SAMPLES];
    int live_n, live_next, live_since;
    double live_scale;
    int live_kind;
    pl_profile_t live_profile;
} ds_model_t;

/* A live correction as other threads see it (under live_lock). */
typedef struct ds_live_pub {
    const struct ds_model *owner;
    int64_t key;
    int kind;
    pl_profile_t profile; /* the corrected one: a copy of live_profile */
} ds_live_pub_t;

/* A frontend joined on the cluster listener (frontends.c): its items by
 * slot index (the low 32 bits of the frontend's slot ids). */
typedef struct ds_frontend {
    int id;
    int up;
    char name[64];
    char addr[64];
    struct ds_fe_item **items;
    uint32_t capitems;
    unsigned long catalog_gen; /* the registry generation last sent (0: none) */
    char *state_sent;          /* the FE_STATE last sent: a 4-byte length, then its bytes */
    /* What it last said of itself (FE_METRICS), under the dispatcher's
     * fe_lock: read by HTTP threads for the cluster's one view. */
    char *metrics;
    json_t *stats;
} ds_frontend_t;

/* A frontend's item here: the dispatcher's record of it (gw_item_t with
 * src and fe_slot), and the flag its withdrawal sets. */
typedef struct ds_fe_item {
    gw_item_t item; /* first */
    atomic_int abandoned;
    /* The frontend frees a slot when the worker's outputs reach it, which
     * may be before the batch's end reaches this side: a slot index can
     * name an item here and, under a newer generation, the frontend's next
     * one. Those of one index are chained. */
    struct ds_fe_item *next_in_slot;
    gw_dispatch_t *ds; /* whose record it is */
} ds_fe_item_t;

typedef struct {
    int id;
    ds_model_t *model;
    double bucket_ms;
    uint8_t input_kind;
    uint8_t priority;    /* 1..GW_PRIORITY_LEVELS: the core's session priority */
    uint8_t best_effort; /* gw_item_t.best_effort */
} ds_session_t;

/* The dispatcher core names requests by 64-bit ids: a slot index (low 32
 * bits) and the slot's generation (high 32). A slot is freed, and its
 * generation bumped, when its item is answered, so an id the core hands
 * back late resolves to nothing instead of to freed memory. */
typedef struct {
    gw_item_t *item;
    uint32_t gen;
    uint32_t next_free; /* index + 1 of the next free slot; 0: none */
} ds_handle_t;

/* Commands: what placement (model_loads.c .. planning.c) asks of the
 * batcher (batches.c, submit.c), which it never calls. Emitted through
 * ds_cmd_* (records.c) and drained by the batcher at the end of the event
 * that emitted them, or on the loop's next turn (ds_commands_drain); a
 * pump (ds_pump) first routes the models a command marked stale, so no
 * batch goes on routes placement has changed. */
enum {
    DS_CMD_ROUTE,         /* dm's sessions get their routes again */
    DS_CMD_FLUSH_PENDING, /* the items that waited for dm's first load are queued */
    DS_CMD_FAIL_PENDING,  /* ... or failed with rc, why */
    DS_CMD_RESUBMIT,      /* item goes through submission again (its route changed) */
};

typedef struct {
    int kind;
    struct ds_model *dm;
    gw_item_t *item;
    int rc;
    char why[256];
} ds_cmd_t;

/* The batcher's own (batches.c, submit.c; records.c's handles). */
typedef struct {
    pl_dispatch_t *core;
    uint64_t timer;
    int64_t timer_at_us;    /* when it fires (the core's wake-up), while armed */
    ds_session_t *sessions; /* by core session id */
    int nsessions, capsessions;
    gw_region_t regions[SQ_MAX_BATCH_ITEMS]; /* a batch's input slots, for the link */
    ds_handle_t *handles;
    uint32_t nhandles, caphandles, free_handle; /* free_handle: index + 1, 0: none */
    /* The live corrections in use, for other threads under live_lock: a
     * copy of each corrected profile (gw_sched_least). */
    pthread_mutex_t live_lock;
    struct ds_live_pub *live_pub;
    int nlive_pub, caplive_pub;
} ds_batcher_t;

/* Placement's own (model_loads.c .. planning.c). */
typedef struct {
    ds_plan_state_t *plan; /* planning.c */
    /* 1 while many unloads are made at once (epochs.c: settle_moves): each
     * marks its model's routes stale, and the maker routes each model once
     * before it returns (no batch is sent meanwhile). */
    int routes_deferred;
    uint64_t group_epoch; /* bumped on every model change: groups are looked for again */
    uint64_t group_gen;   /* makes each formed group's key unique */
    /* Models being measured, and how far (under ready_lock: other
     * threads read it). */
    gw_profile_progress_t *progress;
    int nprogress, capprogress;
} ds_placement_t;

/* What other threads read, under ready_lock: readiness as the dispatch
 * thread last saw it (every tick: why squishd cannot serve every ready
 * model now, "" when it can; the models a worker up holds; those on their
 * way out), and the fleet, written by the dispatch thread alone
 * (worker_events.c, from the link's events) and read there freely. */
typedef struct {
    pthread_mutex_t ready_lock;
    gw_fleet_t fleet;
    char ready_why[256];
    unsigned long ready_gen; /* the registry generation ready_why was made at */
    int64_t *held_keys;
    int nheld, capheld;
    /* Models unloaded or deleted whose record is not freed yet (a batch
     * of theirs still runs, or items wait): Triton's UNLOADING. */
    int64_t *gone_keys;
    int ngone, capgone;
} ds_published_t;

/* Frontends (frontends.c), by id; their traffic (read by other threads),
 * and the timer that sends them the catalog and state. */
typedef struct {
    ds_frontend_t **frontends;
    int nfrontends;
    _Atomic uint64_t fe_bytes_in, fe_bytes_out, fe_items;
    atomic_int fe_connected;
    uint64_t fe_timer;
    pthread_mutex_t fe_lock; /* frontends' metrics and stats; the array's growth */
} ds_frontends_t;

/* The dispatcher: the records both parts share (workers, models), each
 * part's own, and the top's (the tick, model control's waits). */
struct gw_dispatch {
    gw_sched_t sched; /* first: the scheduling interface (gw_dispatch_sched) */
    gw_dispatch_config_t cfg;
    gw_registry_t *registry;
    gw_pipes_t *pipelines;
    sq_shm_arena_t *arena;
    gw_metrics_t *metrics;
    gw_db_t *db;
    gw_prep_pool_t *prep;
    gw_transport_t *const *transport;
    const atomic_int *db_ready;
    int aborted;
    atomic_int withdraw_posted; /* a gw_sched_withdraw look is on its way */
    sq_loop_t *loop;
    uint64_t tick;
    unsigned warm_ticks;   /* dispatch.c: ticks, for warm_all's pace */
    int reclaim_due;       /* a model was removed: reclaim() has work until it is freed */
    ds_worker_t **workers; /* by worker id */
    int nworkers;
    ds_model_t **models;
    int nmodels, capmodels;
    sq_map_t model_ix; /* key -> index into models (ds_model_find) */
    /* Commands placement emitted, not drained yet (records.c), a pump
     * asked for, whether a drain is posted to the loop, and the drain
     * (submit.c's ds_commands_on_post, set by gw_dispatch_new). */
    ds_cmd_t *cmds;
    int ncmds, capcmds;
    int pump_due, drain_posted;
    sq_post_fn drain;
    ds_batcher_t batch;
    ds_placement_t place;
    ds_published_t pub;
    ds_frontends_t fe;
    /* Loads that wait for their models (model control), looked at every
     * tick (dispatch thread only). */
    struct ds_await *awaits;
};

/* Fails it, whose model has no live record here, with what the registry
 * says now: deleted (404), unloaded (409), or (removed set) loaded again
 * and not yet back (503 not_ready). Returns whether it failed it; 0 only
 * when removed is 0 and the model is in service. */
int ds_fail_out_of_service(gw_dispatch_t *ds, gw_item_t *it, int removed);

/* Model control's waits (readiness.c): each tick answers those whose
 * models are settled, past their deadline, or (aborted) all; free drops
 * what is left unanswered (none after ds_abort_all). */
void ds_await_tick(gw_dispatch_t *ds);
void ds_await_free(gw_dispatch_t *ds);

/* ---- the dispatcher's files ----------------------------------------------
 * records.c below both parts; placement (placement_int.h) above it; the
 * batcher (batcher_int.h) above placement; then readiness.c, frontends.c,
 * dispatch.c and worker_events.c. Each calls only the files below it;
 * placement asks the batcher through commands (ds_cmd_*).
 * scripts/check_calls.py (test style/call-circles) fails on a circle. */

/* records.c: lookups, the core's handles for items, finishing, sending. */
/* Whether w's connection has received the model file sha. */
int ds_has_sha(const ds_worker_t *w, const char *sha);
/* dm's measuring on worker w: started (done 0), moved on, or ended (w
 * NULL); what gw_dispatch_profile_progress answers. */
void ds_progress_set(gw_dispatch_t *ds, const ds_model_t *dm, const ds_worker_t *w, int done,
                     int total);
/* And the worker's run time spent on it and still expected (µs). */
void ds_progress_times(gw_dispatch_t *ds, const ds_model_t *dm, double spent_us, double left_us);
/* Records that w's connection holds the model file sha. */
void ds_note_sha(ds_worker_t *w, const char *sha);
ds_model_t *ds_model_find(gw_dispatch_t *ds, int64_t key);
/* Appends a record to ds->models (indexed for ds_model_find); after ds->models
 * was compacted, ds_models_reindex. */
void ds_model_append(gw_dispatch_t *ds, ds_model_t *dm);
void ds_models_reindex(gw_dispatch_t *ds);
/* The record of a registry model, created on first sight. */
ds_model_t *ds_model_get(gw_dispatch_t *ds, gw_model_t *m);
/* The device kind that serves m: one with a worker up, cuda first; else
 * one whose worker is being restarted (its requests wait for it); -1.
 * Dispatch thread (the fleet unlocked). */
int ds_kind_of_model(const gw_dispatch_t *ds, const gw_model_t *m);
/* The dispatcher core's options from the configuration (--policy, --k_std,
 * --dispatch_margin_us, ...): what it plans every batch with. */
/* Workers that hold dm and serve (returned), and *loading that load it. */
int ds_loaded_anywhere(gw_dispatch_t *ds, ds_model_t *dm, int *loading);
/* A generation-checked id for it (also in it->core_id); the item it names,
 * or NULL when that item was answered since; its release on answering. */
uint64_t ds_handle_new(gw_dispatch_t *ds, gw_item_t *it);
gw_item_t *ds_handle_get(const gw_dispatch_t *ds, uint64_t id);
void ds_handle_release(gw_dispatch_t *ds, gw_item_t *it);
/* Gives the item's input slot back to the arena. */
void ds_release_input(gw_dispatch_t *ds, gw_item_t *it);
/* Answers it with an error: the one place, with a batch's success path,
 * where an item leaves the dispatcher. */
void ds_fail_item(gw_dispatch_t *ds, gw_item_t *it, int rc, const char *detail);
/* Commands for the batcher (ds_cmd_t): dm's routes, dm's waiting items
 * queued or failed, it submitted again, a pump. */
void ds_cmd_route(gw_dispatch_t *ds, ds_model_t *dm);
void ds_cmd_flush_pending(gw_dispatch_t *ds, ds_model_t *dm);
void ds_cmd_fail_pending(gw_dispatch_t *ds, ds_model_t *dm, int rc, const char *why);
void ds_cmd_resubmit(gw_dispatch_t *ds, gw_item_t *it);
void ds_cmd_pump(gw_dispatch_t *ds);
/* A frontend's item here (frontends.c makes them): its answer (the
 * item's finish: a failure goes back to the frontend, FE_FAIL), and the
 * link to x (or, x NULL, to the item of slot) in its index's chain. */
void ds_fe_finish(gw_item_t *it, int rc, const char *detail);
ds_fe_item_t **ds_fe_chain_link(ds_frontend_t *f, uint64_t slot, const ds_fe_item_t *x);
/* Frontend fe's record while it is connected, else NULL. */
static inline ds_frontend_t *ds_frontend_at(const gw_dispatch_t *ds, int fe)
{
    return fe >= 0 && fe < ds->fe.nfrontends && ds->fe.frontends[fe] != NULL &&
                   ds->fe.frontends[fe]->up
               ? ds->fe.frontends[fe]
               : NULL;
}
/* A frame to frontend fe (counted in its traffic); SQ_NO_WORKER when it is
 * gone. */
int ds_fe_send(gw_dispatch_t *ds, int fe, uint16_t type, uint64_t id, const void *payload,
               uint32_t len);
/* Through the workers' link (gw_link.h); SQ_NO_WORKER without one. */
int ds_link_send(gw_dispatch_t *ds, int worker, uint16_t type, uint64_t id, const void *payload,
                 uint32_t len, const gw_region_t *regions, int nregions);
int ds_link_send_ref(gw_dispatch_t *ds, int worker, uint16_t type, uint64_t id, sq_bytes_t *bytes,
                     size_t off, uint32_t len);

/* readiness.c: recomputes what the scheduler's ready and held answer
 * (every tick). */
void ds_publish_ready(gw_dispatch_t *ds);
/* The scheduling interface's members (gw_sched_ops_t), any thread: from
 * what ds_publish_ready published (readiness.c), the fleet (records.c),
 * the live profiles (batches.c). */
int ds_sched_ready(gw_sched_t *s, char *why, size_t len);
int ds_sched_held(gw_sched_t *s, int64_t key);
int ds_sched_unloading(gw_sched_t *s, int64_t key);
int ds_sched_serving_kind(gw_sched_t *s, const gw_model_t *m);
void ds_sched_fleet(gw_sched_t *s, gw_fleet_t *out);
int gw_dispatch_least(gw_sched_t *s, const gw_model_t *m, int kind, int n, gw_least_t *out);

/* dispatch.c, what worker_events.c (above it) calls. */
/* DB thread: publishes key's current record (none: it was deleted) and
 * tells the dispatcher. */
void ds_registry_refresh(mdb_t *db, gw_dispatch_t *ds, int64_t key);
/* Answers everything the dispatcher holds 503 shutting_down (the link's
 * abort). Idempotent. */
void ds_abort_all(gw_dispatch_t *ds);

/* frontends.c (below dispatch.c, which frees them): the frontends'
 * events, which worker_events.c hands over. */
void ds_fe_up(gw_dispatch_t *ds, int fe, const char *name, const char *addr);
int ds_fe_frame(gw_dispatch_t *ds, int fe, const sq_frame_t *f);
void ds_fe_lost(gw_dispatch_t *ds, int fe);
/* Frees the records (the dispatcher is freed). */
void ds_frontends_free(gw_dispatch_t *ds);

/* ---- lookups both sides use (data only) --------------------------------- */

static inline ds_worker_t *ds_worker_at(const gw_dispatch_t *ds, int id)
{
    return id >= 0 && id < ds->nworkers ? ds->workers[id] : NULL;
}

/* The profile the dispatcher and planner use for dm on kind: the measured
 * one, corrected by what its workers report (live_scale), when it drifted. */
static inline const pl_profile_t *ds_profile(const ds_model_t *dm, int kind)
{
    return dm->live_scale > 0 && dm->live_kind == kind ? &dm->live_profile : &dm->m->profile[kind];
}

/* The bytes of one request's input slot: pixels (uint8 RGB at the
 * model's input size), or a tensor row of its input type. */
static inline uint64_t ds_input_bytes(const gw_model_t *m, int input_kind)
{
    uint64_t elems = (uint64_t)m->c * (uint64_t)m->h * (uint64_t)m->w;
    return input_kind == SQ_INPUT_PIXELS ? (uint64_t)m->h * (uint64_t)m->w * 3
           : input_kind == SQ_INPUT_FP32 ? elems * sizeof(float)
                                         : elems;
}

/* What one request of m costs on a remote worker's link: its input there,
 * its output row back. */
static inline double ds_item_bytes(const gw_model_t *m, int input_kind)
{
    return (double)(ds_input_bytes(m, input_kind) + (uint64_t)m->out_elems * sizeof(float));
}

/* w's record of the model `key` (made, LOAD_NONE, when create is set). */
static inline ds_load_t *ds_load_find(ds_worker_t *w, int64_t key, int create)
{
    for (int i = 0; i < w->nloads; i++)
        if (w->loads[i].key == key)
            return &w->loads[i];
    if (!create)
        return NULL;
    if (w->nloads == w->caploads) {
        w->caploads = w->caploads ? 2 * w->caploads : 8;
        w->loads = sq_xrealloc(w->loads, sizeof(*w->loads) * (size_t)w->caploads);
    }
    w->loads[w->nloads] = (ds_load_t){.key = key};
    return &w->loads[w->nloads++];
}

#endif
