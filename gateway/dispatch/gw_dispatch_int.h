/* Internals of the dispatch thread, shared by its files: records.c,
 * batches.c, model_loads.c, profiling.c, prefix_groups.c, plan_report.c,
 * epochs.c and planning.c (the planning loop's shell), readiness.c,
 * dispatch.c (entry points, the tick, start and stop, models coming and
 * going) and worker_events.c (the workers' link's events, poisoned
 * models). Dispatch thread only. */
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
    char *state_sent;          /* the FE_STATE last sent */
    /* What it last said of itself (FE_METRICS), under the dispatcher's
     * fe_lock: read by HTTP threads for the cluster's one view. */
    char *metrics;
    json_t *stats;
} ds_frontend_t;

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

/* What planning.c and the dispatcher's lower files may ask of the files
 * above them: they call back through these (set by dispatch.c) rather than
 * into files that call them. */
typedef struct {
    void (*send_load)(gw_dispatch_t *ds, ds_model_t *dm, ds_worker_t *w);
    /* Tells w to unload l's model (its load state becomes LOAD_NONE). */
    void (*unload)(gw_dispatch_t *ds, ds_worker_t *w, ds_load_t *l);
    void (*update_routes)(gw_dispatch_t *ds, ds_model_t *dm);
    void (*pump)(gw_dispatch_t *ds);
    /* The dispatcher's record of a registry model (created when new). */
    ds_model_t *(*model)(gw_dispatch_t *ds, gw_model_t *m);
    /* The device kind that serves m now (-1: none). */
    int (*serving_kind)(const gw_dispatch_t *ds, const gw_model_t *m);
    /* Up-calls of the dispatcher's lower files (batches.c, model_loads.c,
     * prefix_groups.c) into its top (dispatch.c), which calls them: an item goes
     * through submission again (its route changed: a prefix group retired,
     * a batch could not be sent). */
    void (*resubmit)(gw_dispatch_t *ds, gw_item_t *it);
    /* ds_submit_chain, for frontends.c. */
    void (*submit_chain)(gw_dispatch_t *ds, gw_item_t *first);
} gw_dispatch_ops_t;

struct gw_dispatch {
    gw_sched_t sched; /* first: the scheduling interface (gw_dispatch_sched) */
    gw_server_t *srv;
    const gw_dispatch_ops_t *ops;
    int aborted;
    atomic_int withdraw_posted; /* a gw_sched_withdraw look is on its way */
    sq_loop_t *loop;
    pl_dispatch_t *core;
    uint64_t timer;
    int64_t timer_at_us; /* when it fires (the core's wake-up), while armed */
    uint64_t tick;
    ds_worker_t **workers; /* by worker id */
    int nworkers;
    ds_model_t **models;
    int nmodels, capmodels;
    sq_map_t model_ix; /* key -> index into models (ds_model_find) */
    /* 1 while many unloads are made at once (epochs.c: settle_moves): each
     * marks its model's routes stale, and the maker routes each model once
     * before it returns (no batch is sent meanwhile). */
    int routes_deferred;
    unsigned warm_ticks;     /* dispatch.c: ticks, for warm_all's pace */
    unsigned long ready_gen; /* the registry generation ready_why was made at */
    ds_session_t *sessions;  /* by core session id */
    int nsessions, capsessions;
    ds_plan_state_t *plan;                   /* planning.c */
    gw_region_t regions[SQ_MAX_BATCH_ITEMS]; /* a batch's input slots, for the link */
    ds_handle_t *handles;
    uint32_t nhandles, caphandles, free_handle; /* free_handle: index + 1, 0: none */
    int reclaim_due;      /* a model was removed: reclaim() has work until it is freed */
    uint64_t group_epoch; /* bumped on every model change: groups are looked for again */
    uint64_t group_gen;   /* makes each formed group's key unique */
    /* Readiness, as the dispatch thread last saw it (every tick), for
     * other threads under ready_lock: why squishd cannot serve every ready
     * model now ("" when it can), and the models a worker up holds. */
    pthread_mutex_t ready_lock;
    /* The fleet: written by the dispatch thread alone (worker_events.c,
     * from the link's events) under ready_lock, read there freely and by
     * other threads under ready_lock (the scheduler's serving kind and
     * fleet snapshot). */
    gw_fleet_t fleet;
    char ready_why[256];
    int64_t *held_keys;
    int nheld, capheld;
    /* Models unloaded or deleted whose record is not freed yet (a batch
     * of theirs still runs, or items wait): Triton's UNLOADING. */
    int64_t *gone_keys;
    int ngone, capgone;
    /* Loads that wait for their models (model control), looked at every
     * tick (dispatch thread only). */
    struct ds_await *awaits;
    /* Models being measured, and how far (under ready_lock too). */
    gw_profile_progress_t *progress;
    int nprogress, capprogress;
    /* Frontends (frontends.c), by id; their traffic (read by other
     * threads), and the timer that sends them the catalog and state. */
    ds_frontend_t **frontends;
    int nfrontends;
    _Atomic uint64_t fe_bytes_in, fe_bytes_out, fe_items;
    atomic_int fe_connected;
    uint64_t fe_timer;
    pthread_mutex_t fe_lock; /* frontends' metrics and stats; the array's growth */
    /* The live corrections in use (batches.c), for other threads under
     * live_lock: a copy of each corrected profile (gw_sched_least). */
    pthread_mutex_t live_lock;
    struct ds_live_pub *live_pub;
    int nlive_pub, caplive_pub;
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

/* ---- planning: plan_report.c < epochs.c < planning.c ------------------- */

/* What planning.c (the shell around the planning loop, planner/pl_loop.h)
 * keeps, and epochs.c and plan_report.c read. */
/* A settle of moves under way (epochs.c): the plan's holdings indexed,
 * and the next worker to look at. */
typedef struct {
    int active;
    struct ds_holding *alloc; /* (model key, worker) of each allocation, sorted */
    int na;
    sq_map_t over;       /* (model key, worker) of the overflow */
    char *arrived_at;    /* per model (at its first holding): 0 ?, 1 no, 2 yes */
    int cursor;          /* the next worker id */
    const void *devices; /* the plan it indexed: it was not replaced */
} ds_settle_t;

typedef struct {
    ds_settle_t settle;
    int moves_pending; /* a model waits to leave a worker until it arrives elsewhere */
    int settle_due;    /* a load finished while moves were pending: settle at the tick */
} ds_plan_kind_t;

/* An epoch whose plan is being computed (planner thread): what applying it
 * needs, kept by the dispatch thread. */
typedef struct {
    struct pl_loop_job *job; /* NULL: none in flight */
    int *workers;            /* plan device j is ds->workers[workers[j]] at begin */
    int nworkers;
    char reason[64];
    int64_t begin_ns;
    double plan_ms;
    /* Its plan adopted and being applied (epochs.c: in slices, the
     * planner thread's plans): phase 0 loads worker by worker, phase 1
     * routes model by model; cursor is where the next slice starts. */
    int applying, phase, cursor;
    const void *devices; /* the adopted plan's devices: it was not replaced */
    int *dev_of;         /* workers[j]'s plan device index, -1 none */
    int *ov_first, *ov;  /* overflow entries of device id j: ov[ov_first[j] ..] */
    int64_t *keys;       /* models to route */
    int nkeys;
    int64_t now_us;
} ds_plan_inflight_t;

/* How long one slice of an apply holds the dispatch thread at most (one
 * worker's loads or one model's routes may run over). */
#define DS_APPLY_SLICE_US 2000

/* One placement of the plan stored before a restart. */
typedef struct {
    char device[64];
    int kind;
    int64_t key;
    double slo_ms;
    int batch;
    double duty_cycle_us;
    double rate_rps;
    int saturated;
} ds_plan_restore_t;

struct ds_plan_state {
    /* Rates, epochs, sessions, plans and routes (planner/pl_loop.h): the
     * same loop squish-sim runs. Devices are named by worker id. */
    struct pl_loop *loop;
    /* The pipelines the loop knows (a reference each): key = the pointer,
     * which the reference keeps from being reused. */
    gw_pipeline_t **pipes;
    int npipes, cappipes;
    ds_plan_kind_t kinds[SQ_DEV_KIND_COUNT];
    long long epoch;
    /* advice inputs since the last epoch */
    double ok, bad;
    double busy_us;
    int64_t window_start_us;
    /* /v1/plan snapshot, read by HTTP threads */
    pthread_mutex_t lock;
    char *json;
    /* The plan stored before a restart, until it is reapplied. */
    ds_plan_restore_t *restore;
    int nrestore;
    long long restored_from; /* its epoch */
    int64_t restore_first_up_us;
    /* The planner thread (cfg->plan_thread): it runs pl_loop_job_run on the
     * jobs the dispatch thread hands it (todo) and hands them back (done);
     * the dispatch thread finishes and applies them at its next tick. Both
     * arrays are indexed by kind, under job_lock. */
    int threaded;
    pthread_t thread;
    pthread_mutex_t job_lock;
    pthread_cond_t job_cond;
    struct pl_loop_job *todo[SQ_DEV_KIND_COUNT];
    struct pl_loop_job *done[SQ_DEV_KIND_COUNT];
    int stopping;
    ds_plan_inflight_t inflight[SQ_DEV_KIND_COUNT]; /* dispatch thread only */
    uint64_t apply_timer;                           /* the next slice's, 0: none */
};

/* The loop's key of a pipeline: the pointer, which the loop's reference
 * (ds_plan_state_t.pipes) keeps from being reused. */
static inline int64_t ds_plan_pipe_key(const gw_pipeline_t *pipe)
{
    return (int64_t)(intptr_t)pipe;
}

/* plan_report.c: the plan as /v1/plan, the model DB and /metrics see it. */
/* A loop session as the snapshot names it: its model record and bucket;
 * NULL when the loop has no session id or its model is gone. */
typedef struct {
    ds_model_t *dm;
    double bucket_ms;
} ds_plan_view_t;
const ds_plan_view_t *ds_plan_view(gw_dispatch_t *ds, int id, ds_plan_view_t *out);
/* After an epoch (the plan's epoch counted): its snapshot for /v1/plan
 * and the model DB, and its metrics; moved: models it moved. */
void ds_plan_publish(gw_dispatch_t *ds, const char *reason, int moved);

/* epochs.c: the loop fed, and its plans applied. */
/* What the loop knows of each model: its kind, profile (measured when it
 * drifted), and whether it is planned. */
void ds_plan_sync_models(gw_dispatch_t *ds);
/* The loop's pipelines follow the live ones: a deleted one goes, and each
 * live one it knows gets its current split and gammas. */
void ds_plan_sync_pipelines(gw_dispatch_t *ds);
/* The loop knows pipe (a reference is taken the first time). */
void ds_plan_pipeline_known(gw_dispatch_t *ds, gw_pipeline_t *pipe);
/* Plans kind from the workers up now and applies the plan: loads, duty
 * cycles, routes, then unloads of what moved away (make before break).
 * With the planner thread, the plan is computed there and applied by
 * ds_plan_collect at a later tick; one plan of a kind at a time (a second
 * epoch asked for meanwhile runs after it). */
void ds_plan_epoch(gw_dispatch_t *ds, int kind, const char *reason, int64_t now_us);
/* Applies the plans the planner thread has computed (every tick). */
void ds_plan_collect(gw_dispatch_t *ds);
/* Epochs begun whose plan is not applied yet (computed or being applied). */
int ds_plan_pending(gw_dispatch_t *ds);
/* The next slice of the plans being applied (a timer calls it between
 * the loop's events; benches call it themselves). */
void ds_plan_continue(gw_dispatch_t *ds);
/* Stops applying (the dispatcher is freed): the slices' timer cancelled. */
void ds_plan_apply_stop(gw_dispatch_t *ds);
/* The planner thread: started by ds_plan_new when cfg->plan_thread (-1 if
 * it cannot be: then plans are computed on the dispatch thread); stopped,
 * and plans never applied dropped, by ds_plan_free. */
int ds_plan_thread_start(ds_plan_state_t *p);
void ds_plan_thread_stop(ds_plan_state_t *p);

/* planning.c: the shell's entry points, and the plan stored before a
 * restart reapplied. */

ds_plan_state_t *ds_plan_new(gw_dispatch_t *ds);
void ds_plan_free(ds_plan_state_t *ps);
/* The planning loop (planner/pl_loop.h) the epochs run. */
struct pl_loop *ds_plan_loop(gw_dispatch_t *ds);
/* dm is about to be freed (deleted, and nothing refers to it): its sessions
 * go (a plan still naming their ids skips them). */
void ds_plan_forget(gw_dispatch_t *ds, const ds_model_t *dm);
/* Item it, served by dm at bucket_ms, arrived: counted toward (model,
 * bucket), or a pipeline item toward its stage (gw_item_t.pipeline), whose
 * rate goes to the session of the stage's current budget. */
void ds_plan_arrival(gw_dispatch_t *ds, ds_model_t *dm, double bucket_ms, const gw_item_t *it);
/* A model became active (first request, it): place it now. */
/* now_us: the dispatcher's clock (sq_now_us; a test's virtual one). */
void ds_plan_activate(gw_dispatch_t *ds, ds_model_t *dm, double bucket_ms, const gw_item_t *it,
                      int64_t now_us);
/* Workers came or went, or a model was removed: re-plan that kind. */
void ds_plan_invalidate(gw_dispatch_t *ds, int kind, const char *reason);
/* epochs.c: a load finished on a worker of kind: models waiting to leave
 * their old workers (make before break) can go at the next tick
 * (ds_plan_settle_due, once for all the loads finished meanwhile). */
void ds_plan_loaded(gw_dispatch_t *ds, int kind);
void ds_plan_settle_due(gw_dispatch_t *ds);
/* Whether the plan stored before a restart still waits to be reapplied. */
int ds_plan_restoring(const gw_dispatch_t *ds);
/* Called every tick: rates, epoch triggers. */
void ds_plan_tick(gw_dispatch_t *ds, int64_t now_us);
/* epochs.c: the routes of dispatcher session s: the planned workers that
 * hold the model (or, before any plan covers it, every worker that does). */
int ds_plan_routes(gw_dispatch_t *ds, const ds_session_t *s, const int *holders, int nholders,
                   pl_route_t *routes, int max);
/* The workers that hold dm loaded now (the fallback of ds_plan_routes),
 * into holders (room for ds->nworkers); returns how many. */
int ds_plan_holders(gw_dispatch_t *ds, const ds_model_t *dm, int *holders);
/* Counters for the advice (bad rate, busy time). */
void ds_plan_outcome(gw_dispatch_t *ds, int ok);
void ds_plan_busy(gw_dispatch_t *ds, int worker, int64_t busy_us);

/* ---- the dispatcher's files ----------------------------------------------
 * Each calls only the files listed before it (and the planning files:
 * plan_report.c, epochs.c, planning.c); calls up, from those too, go
 * through ds->ops. scripts/check_calls.py (test style/call-circles) fails
 * on a circle. */

/* records.c: lookups, the core's handles for items, finishing, sending. */
/* Whether w's connection has received the model file sha. */
int ds_has_sha(const ds_worker_t *w, const char *sha);
/* dm's measuring on worker w: started (done 0), moved on, or ended (w
 * NULL); what gw_dispatch_profile_progress answers. */
void ds_progress_set(gw_dispatch_t *ds, const ds_model_t *dm, const ds_worker_t *w, int done,
                     int total);
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
pl_dispatch_opts_t ds_core_opts(const gw_server_t *srv);
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
/* Frontend fe's record while it is connected, else NULL. */
static inline ds_frontend_t *ds_frontend_at(const gw_dispatch_t *ds, int fe)
{
    return fe >= 0 && fe < ds->nfrontends && ds->frontends[fe] != NULL && ds->frontends[fe]->up
               ? ds->frontends[fe]
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

/* batches.c: the core's queues, its actions, and batches' answers. */
/* Acts on the core's new actions (batches, drops, its wake-up). */
void ds_pump(gw_dispatch_t *ds);
/* Gives dm's sessions their routes (planning.c decides which workers). */
void ds_update_routes(gw_dispatch_t *ds, ds_model_t *dm);
/* The dispatcher session of (model, SLO bucket, input kind, priority
 * level, best effort), made (and *created set) the first time; its core
 * id, or < 0. */
int ds_session_ensure(gw_dispatch_t *ds, ds_model_t *dm, double bucket, uint8_t input_kind,
                      uint8_t priority, uint8_t best_effort, int *created);
/* Queues it in dm's session for its SLO bucket and input kind. */
void ds_enqueue_item(gw_dispatch_t *ds, ds_model_t *dm, gw_item_t *it);
/* The same for n items ready together (a clump, gw_sched_submit): those
 * of one session enter it as one arrival (pl_dispatch_requests). */
/* Takes every abandoned item still queued (in the core or waiting for its
 * model's load) out and fails it as withdrawn. */
void ds_withdraw_abandoned(gw_dispatch_t *ds);
/* Fails it as withdrawn (counted by reason) when it is abandoned; 1 if so. */
int ds_withdrawn(gw_dispatch_t *ds, gw_item_t *it);
void ds_enqueue_items(gw_dispatch_t *ds, ds_model_t *dm, gw_item_t **items, int n);
/* The requests that waited for dm's first load: queued, or failed. */
void ds_flush_pending(gw_dispatch_t *ds, ds_model_t *dm);
void ds_fail_pending(gw_dispatch_t *ds, ds_model_t *dm, int rc, const char *why);
/* A BATCH_DONE from w: finishes the batch's items. */
void ds_on_batch_done(gw_dispatch_t *ds, ds_worker_t *w, const sq_frame_t *f);

/* model_loads.c: model files to workers (through the DB thread once), unloads. */
/* Loads dm (a model or a prefix group) on w. */
void ds_send_load(gw_dispatch_t *ds, ds_model_t *dm, ds_worker_t *w);
/* Tells w to unload l's model (see gw_dispatch_ops_t). */
void ds_unload(gw_dispatch_t *ds, ds_worker_t *w, ds_load_t *l);
/* Drops a group's members' files held for sending. */
void ds_group_free_blobs(ds_model_t *g);

/* profiling.c: measuring models; where a model is loaded and how it
 * leaves service. */
/* Loads dm on every up worker of its kind that lacks it. */
void ds_spread_loads(gw_dispatch_t *ds, ds_model_t *dm);
/* Takes dm out of service: its sessions leave the core (which answers what
 * they queued) and every worker holding it unloads it. */
void ds_withdraw(gw_dispatch_t *ds, ds_model_t *dm);
/* Measures dm on a cpu/cuda worker that measures nothing else (it keeps
 * serving), if it wants a profile and one is free; start_profiles tries
 * every model. */
void ds_start_profile(gw_dispatch_t *ds, ds_model_t *dm);
void ds_start_profiles(gw_dispatch_t *ds);
/* Sends w's next measurement slice if a gap in its work allows one now
 * (or it waited long enough); a no-op while a slice runs. */
void ds_profile_step(gw_dispatch_t *ds, ds_worker_t *w);
/* w answered its slice (PROFILE_SLICE, next_us: its next batch's expected
 * µs; or PROFILE_DONE): the core has the worker back. */
void ds_slice_over(gw_dispatch_t *ds, ds_worker_t *w, int64_t next_us);
/* dm's measurement on w ended (done, failed or abandoned): the next model
 * is measured. */
void ds_end_profile(gw_dispatch_t *ds, ds_model_t *dm, ds_worker_t *w);

/* prefix_groups.c: prefix groups (Nexus's prefix batching) and twins. */
/* The index of member m in group g, or -1. */
int ds_group_member_index(const ds_model_t *g, const gw_model_t *m);
/* The group dm's requests can run in, if one is usable now (forming it,
 * and starting its measurement, when its time has come). */
ds_model_t *ds_group_of(gw_dispatch_t *ds, ds_model_t *dm);
/* Stops routing to group g: unloads it, removes its sessions (the core
 * answers what they queued), resubmits what waited for it. */
void ds_group_retire(gw_dispatch_t *ds, ds_model_t *g, const char *why);
/* g's measurement on w came back: stores and applies it. */
void ds_group_profiled(gw_dispatch_t *ds, ds_model_t *g, ds_worker_t *w,
                       const sq_profile_done_t *done);
/* The oldest ready model with m's very file and input, if older than m;
 * and the model whose load serves dm's requests instead of its own. */
gw_model_t *ds_twin_find(gw_dispatch_t *ds, const gw_model_t *m);
/* The key of an older model with m's very file that is being measured now
 * (status profiling), or 0. */
int64_t ds_twin_measuring(gw_dispatch_t *ds, const gw_model_t *m);
ds_model_t *ds_twin_of(gw_dispatch_t *ds, ds_model_t *dm);

/* batches.c: forgets dm's live correction (its profile was measured anew,
 * or dm is freed). */
void ds_live_reset(gw_dispatch_t *ds, ds_model_t *dm);
/* batches.c: dm's profile on kind is corrected by scale (1: none, the
 * profile as measured): its sessions in the core, the planner, the metric
 * and other threads' gw_dispatch_least follow. */
void ds_live_set(gw_dispatch_t *ds, ds_model_t *dm, int kind, double scale);

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
void ds_registry_refresh(mdb_t *db, gw_server_t *srv, int64_t key);
/* Answers everything the dispatcher holds 503 shutting_down (the link's
 * abort). Idempotent. */
void ds_abort_all(gw_dispatch_t *ds);
/* Items handed over on the dispatch thread (a frontend's, linked through
 * clump_next as gw_sched_submit's): admitted and queued. */
void ds_submit_chain(gw_dispatch_t *ds, gw_item_t *first);

/* frontends.c (below dispatch.c, which frees them; it submits items
 * through ds->ops->submit_chain): the frontends' events, which
 * worker_events.c hands over. */
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
