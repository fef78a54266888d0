/* Placement, the dispatch room's lower part: model files to workers and
 * unloads (model_loads.c), measuring models (profiling.c), prefix groups
 * and twins (prefix_groups.c), and the shell around the planning loop
 * (plan_report.c < epochs.c < planning.c). Placement never calls the
 * batcher: what it needs of it (routes, a pump, items queued, failed or
 * submitted again) it emits as commands (ds_cmd_*, gw_dispatch_int.h).
 * Dispatch thread only. */
#ifndef GW_PLACEMENT_INT_H
#define GW_PLACEMENT_INT_H

#include "gw_dispatch_int.h"

/* model_loads.c: model files to workers (through the DB thread once), unloads. */
/* Loads dm (a model or a prefix group) on w. */
void ds_send_load(gw_dispatch_t *ds, ds_model_t *dm, ds_worker_t *w);
/* Tells w to unload l's model (its load state becomes LOAD_NONE; its
 * routes are made again, by command, when it was loaded). */
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

#endif
