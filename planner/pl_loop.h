/* The planning loop around pl_plan: everything between arrivals and the
 * dispatcher's routes that decides something, written once for squishd's
 * dispatch thread (gateway/dispatch/planning.c) and for squish-sim (bench/sim), so
 * that what the simulator measures is what squishd plans.
 *
 *   - rates: per session (model, SLO bucket) and per pipeline stage, an
 *     EWMA of the arrivals (time constant pl_epoch_config_t.ewma_tau_ms)
 *     taken every rate_interval_ms; the planner uses max(EWMA, the last
 *     interval's rate): up fast, down slow;
 *   - a pipeline stage's rate goes to the session of its model at the SLO
 *     bucket of its current budget, all of it at once when the split moves
 *     the budget to another bucket (that kind then re-plans);
 *   - epochs: per device kind, periodic, early when a rate leaves
 *     [low, high] of the rate the plan was made for, after scale_up_ms when
 *     a rate rose above high of it, and at once for a kind invalidated
 *     (workers came or went, a model arrived);
 *   - the sessions given to pl_plan: headroom, the idle-session filter, the
 *     clump dispersion of stages fed by another stage's crops;
 *   - routes: the planned devices that can serve, else the devices holding
 *     the model, then the overflow devices;
 *   - the stored rate of a placement (what a restart plans again);
 *   - pipeline splits: the DP with the stages' overhead, a rate floor and
 *     the step, the slack shared, the even split as fallback.
 *
 * Pure, like the other planner cores: no I/O, no clock, no threads of its
 * own (pl_loop_job_run may run on another: pl_loop_plan_begin); time is an
 * argument (now_us, any monotonic origin, never going backwards).
 * Devices are named by the caller's keys (a worker id, a simulated device
 * index); plan device ids are indices into the keys of the epoch that made
 * the plan.
 *
 *     l = pl_loop_new(&cfg, now);
 *     pl_loop_model_set(l, key, &model);             // kind, profile, ...
 *     pl_loop_pipeline_set(l, pipe, slo, stages, n); // at every new split
 *     on a request:      pl_loop_arrivals(l, model, slo_ms, 1);
 *     on a stage item:   pl_loop_stage_arrivals(l, pipe, stage, query_slo, model, n);
 *     on a tick:         kinds = pl_loop_advance(l, now);
 *                        for each kind in kinds: pl_loop_plan(l, kind, &devices, now);
 *     routes:            pl_loop_routes(l, model, slo_ms, &env, routes, max);
 */
#ifndef PL_LOOP_H
#define PL_LOOP_H

#include "pl.h"
#include "pl_dispatch.h"

#include <stdint.h>

/* Kinds of devices a loop plans separately (each with its own plan). */
#define PL_LOOP_MAX_KINDS 8

/* Below this rate (requests a second) a session has no traffic to speak
 * of: it is planned only when its model has no session with traffic (so
 * that a model's first requests find it loaded), not beside one that has
 * (its requests are served by the devices holding the model); a pipeline
 * stage's entry this quiet, without an arrival since the last rate step,
 * goes. */
#define PL_LOOP_IDLE_RPS 0.05

/* A best-effort request (nobody asked for an SLO, issue 23) is planned as
 * if its SLO were this: the plan gives its load devices and batches large
 * enough to keep up with it, while the dispatcher sends it as soon as a
 * worker is free, below every SLO, and drops it only at the server's bound
 * on a request's life (pl_session_cfg_t.best_effort). */
#define PL_LOOP_BEST_EFFORT_MS 1000.0

typedef struct {
    pl_epoch_config_t epoch;
    /* A rate above high times what the plan serves re-plans after this
     * (scaling up is urgent: requests drop meanwhile); everything else
     * waits for epoch.min_interval_ms. */
    double scale_up_ms;
    double rate_interval_ms; /* how often rates are taken: 1000 */
    double headroom;         /* pl_plan sees every rate times this: 1 */
    double burst_quantile;   /* pl_options_t.burst_quantile: PL_BURST_QUANTILE */
    double k_std;            /* latency margin: 0 */
    int overflow;            /* pl_options_t.overflow: 1 */
    int overflow_devices;    /* pl_options_t.overflow_devices: 0 */
    int nkinds;              /* 1 .. PL_LOOP_MAX_KINDS: 1 */
    /* A session's SLO bucket (squishd's dispatcher sessions are per
     * bucket); NULL: every SLO is its own. */
    double (*slo_bucket_ms)(double slo_ms);
} pl_loop_config_t;

/* squishd's SLO buckets: the largest of 5, 10, 15, 20, 25, 30, 40, 50, 60,
 * 75, 100, 125, 150, 200, 250, 300, 400, 500, 750, 1000, 1500, 2000, 3000,
 * 5000, 10000, 30000, 60000 ms not above slo_ms (the smallest for anything
 * below it): a dispatcher session per bucket keeps the sessions (and
 * metric label values) bounded, and its batches fit every member's SLO. */
double pl_loop_slo_bucket_ms(double slo_ms);

/* squishd's defaults (its configuration's: period 30 s, early epochs at
 * most every 10 s, scale up after 1 s, rates every second). */
void pl_loop_config_default(pl_loop_config_t *c);

typedef struct pl_loop pl_loop_t;

pl_loop_t *pl_loop_new(const pl_loop_config_t *c, int64_t now_us);
void pl_loop_free(pl_loop_t *l);

/* ---- models, sessions and rates ---------------------------------------- */

typedef struct {
    int kind;                    /* the device kind serving it; -1: none */
    const pl_profile_t *profile; /* borrowed, on that kind; NULL: not plannable yet */
    const char *name;            /* borrowed; copied into the plan's sessions */
    double item_bytes;           /* input + output bytes of one request */
    int active;                  /* 0: known but not planned (not loaded anywhere yet, removed) */
} pl_loop_model_t;

/* Sets (or updates) model key's facts; the pointers must live until the
 * next call for key or pl_loop_model_forget. */
void pl_loop_model_set(pl_loop_t *l, int64_t key, const pl_loop_model_t *m);
/* The model is gone: its sessions and stage entries go with it. */
void pl_loop_model_forget(pl_loop_t *l, int64_t key);

/* The id of model's session at slo_ms's bucket, made when create is set
 * (planned at slo_ms until its own requests say otherwise); -1 when there
 * is none. Ids are stable: plans refer to them. */
int pl_loop_session(pl_loop_t *l, int64_t model, double slo_ms, int create);
/* n requests of SLO slo_ms for model arrived (its bucket's session is
 * made). A session is planned at the least SLO of its own requests in the
 * last rate interval that had any (not at its bucket, below every one of
 * them), or at a stage's budget when tighter. */
void pl_loop_arrivals(pl_loop_t *l, int64_t model, double slo_ms, double n);
/* Sets the session's rate estimate to rate_rps (add: adds it), as if
 * measured (requests of slo_ms): a restart's stored rates, a
 * simulation's declared ones. */
void pl_loop_seed(pl_loop_t *l, int64_t model, double slo_ms, double rate_rps, int add);

typedef struct {
    int id;
    int64_t model;
    double bucket_ms;
    double plan_slo_ms; /* the SLO it is planned for (a stage's budget may be tighter) */
    double rate_rps;    /* what the planner uses: its own and its stages' */
    double planned_rps; /* the rate the last plan of its kind was made for */
} pl_loop_session_info_t;

int pl_loop_nsessions(const pl_loop_t *l);
/* The i-th session (0 <= i < pl_loop_nsessions); or by id. 0, or -1. */
int pl_loop_session_at(const pl_loop_t *l, int i, pl_loop_session_info_t *out);
int pl_loop_session_by_id(const pl_loop_t *l, int id, pl_loop_session_info_t *out);

/* ---- pipelines ----------------------------------------------------------- */

typedef struct {
    int64_t model;    /* the model serving the stage; -1: unknown */
    int parent;       /* the stage whose items it gets (crops of); -1: a root */
    double gamma;     /* its items per parent item (measured or declared) */
    double budget_ms; /* its share of the pipeline's SLO at the current split */
} pl_loop_stage_t;

/* Pipeline key (the caller's) at its current split, stages in any order
 * (parents by index). The stages' rates move to the sessions of their new
 * budgets' buckets; a kind where one moved re-plans. */
void pl_loop_pipeline_set(pl_loop_t *l, int64_t key, double slo_ms, const pl_loop_stage_t *stages,
                          int nstages);
/* The pipeline is gone: its stage entries go. */
void pl_loop_pipeline_drop(pl_loop_t *l, int64_t key);
/* n items of pipeline key's stage arrived for a query at query_slo_ms (a
 * query may ask for another SLO than the pipeline's: the same shares of
 * it), served by model. */
void pl_loop_stage_arrivals(pl_loop_t *l, int64_t key, int stage, double query_slo_ms,
                            int64_t model, double n);
/* The stage's rate estimate set to rate_rps, as pl_loop_seed. */
void pl_loop_stage_seed(pl_loop_t *l, int64_t key, int stage, double query_slo_ms, int64_t model,
                        double rate_rps);

/* ---- epochs ------------------------------------------------------------- */

/* Kind re-plans at the next pl_loop_advance (the first reason is kept). */
void pl_loop_invalidate(pl_loop_t *l, int kind, const char *reason);
/* The kinds (bits) invalidated and not planned since. */
unsigned pl_loop_dirty(const pl_loop_t *l);
/* Takes the rates when rate_interval_ms passed since the last time (then
 * the stages' rates move to their buckets), and returns the kinds (bits)
 * due an epoch at now_us: invalidated ones, and those with a plan whose
 * rates or period call for one. pl_loop_reason says why. */
unsigned pl_loop_advance(pl_loop_t *l, int64_t now_us);
const char *pl_loop_reason(const pl_loop_t *l, int kind);
/* When rates were last taken (pl_loop_new's now_us before the first). */
int64_t pl_loop_rates_at_us(const pl_loop_t *l);

/* ---- plans -------------------------------------------------------------- */

/* The devices of one kind at an epoch: plan device id j is keys[j]. */
typedef struct {
    int n;
    const int *keys;        /* borrowed; the caller's names, unique */
    double memory_bytes;    /* per device (the least of them); 0 = unlimited */
    const pl_link_t *links; /* borrowed; device j < nlinks behind links[j]; NULL: all local */
    int nlinks;
    /* 1: as many devices as the plan needs (n and keys unused: a device's
     * key is its id), no spare to take overflow. */
    int uncapped;
} pl_loop_devices_t;

/* An epoch of kind at now_us: the sessions of its active models at the
 * rates of now, planned on devices incrementally from the kind's last plan
 * (its devices renamed to their keys' new ids, dropped when their key is
 * gone). Returns 0 (the plan is in force: pl_loop_current), 1 (no device
 * to place sessions on: nothing changes) or pl_plan's error. */
int pl_loop_plan(pl_loop_t *l, int kind, const pl_loop_devices_t *devices, int64_t now_us);

/* pl_loop_plan in three steps, so that pl_plan (66-190 ms at 10,000
 * sessions) can run on another thread than the loop's:
 *
 *     j = pl_loop_plan_begin(l, kind, &devices, now, &rc);  // loop's thread
 *     pl_loop_job_run(j);                                   // any thread
 *     rc = pl_loop_plan_finish(l, j);                       // loop's thread
 *
 * pl_loop_plan is exactly that on one thread.
 *
 * begin does all pl_loop_plan does before pl_plan (the kind no longer
 * dirty, the sessions' planned rates set, the sessions given to pl_plan,
 * their clump dispersion, the options, the previous plan's devices renamed
 * to this epoch's ids) and copies everything pl_plan reads into the job:
 * the sessions, one deep copy (pl_profile_copy) per distinct profile and
 * one per distinct name, the links, the devices' keys, the kept devices of
 * the previous plan with their allocs. Nothing of the loop, of the models'
 * profiles and names or of devices is borrowed after it returns: the loop
 * may take arrivals, models set or forgotten, pipelines, other kinds'
 * epochs, even pl_loop_free, while the job runs. Returns the job, or NULL
 * with *rc: 1 where pl_loop_plan returns 1 (no device to place sessions
 * on: nothing to run, the kind's plan unchanged), SQ_INVAL (no such kind),
 * SQ_EXISTS (kind has a job begun and neither finished nor freed: at most
 * one job per kind is in flight; other kinds' may be).
 *
 * run calls pl_plan on the job's own data only: it touches nothing shared
 * and may run on any thread (one at a time per job).
 *
 * finish (on the loop's thread, run or not: it runs a job not run yet)
 * adopts the job's plan as kind's plan in force as pl_loop_plan does (the
 * devices' keys of begin, the planned sessions, the epoch's time now_us of
 * begin, pl_loop_epochs), frees the job and returns 0 or pl_plan's error
 * (then the kind's plan in force is unchanged). What changed meanwhile is
 * not in that plan: it is planned at the next epoch, as what changes
 * between epochs is today. Sessions of a model forgotten meanwhile (their
 * ids never come back: ids are not reused) stay in the adopted plan,
 * stale, as in a plan in force when their model is forgotten:
 * pl_loop_routes finds no session for them, pl_loop_stored_rate gives
 * al->rate_rps, and pl_loop_holders still lists devices for their model
 * key until the next epoch; squishd's planning.c skips allocs whose
 * session id it no longer knows. A device whose key went meanwhile is
 * still named by the plan until the next epoch renames devices again.
 * pl_loop_restore meanwhile is overwritten by the finished plan.
 *
 * pl_loop_job_free: a job never finished (shutdown, or abandoned): frees
 * it, run or not (not while it runs). l (NULL once the loop is freed) gets
 * the kind free for a next begin, and dirty ("plan abandoned"). */
typedef struct pl_loop_job pl_loop_job_t;
pl_loop_job_t *pl_loop_plan_begin(pl_loop_t *l, int kind, const pl_loop_devices_t *devices,
                                  int64_t now_us, int *rc);
void pl_loop_job_run(pl_loop_job_t *j);
int pl_loop_plan_finish(pl_loop_t *l, pl_loop_job_t *j);
void pl_loop_job_free(pl_loop_t *l, pl_loop_job_t *j);

/* Kind's plan in force, or NULL; the sessions given to pl_plan for it:
 * the job's copies, adopted with the plan (their names and profiles are
 * the loop's own copies, not the models' pointers), valid until the next
 * plan of kind is adopted (pl_loop_plan, pl_loop_plan_finish) or
 * pl_loop_restore. */
const pl_plan_t *pl_loop_current(const pl_loop_t *l, int kind);
const pl_session_t *pl_loop_planned_sessions(const pl_loop_t *l, int kind, int *n);
/* Epochs that made a plan so far (any kind). */
long long pl_loop_epochs(const pl_loop_t *l);
/* The caller's key of kind's plan device id, or -1. */
int pl_loop_device_key(const pl_loop_t *l, int kind, int device_id);
/* Installs plan (taken: the loop disposes of it) as kind's plan in force,
 * its device ids indexing keys: a restart's stored plan, planned from
 * again at the next epoch. */
void pl_loop_restore(pl_loop_t *l, int kind, pl_plan_t *plan, const int *keys, int nkeys);

/* The keys of the devices kind's plan puts model on (a share or its
 * overflow), at most max; returns how many. */
int pl_loop_holders(const pl_loop_t *l, int kind, int64_t model, int *keys, int max);

/* How routes meet the devices now. */
typedef struct {
    /* Whether device key can serve model now (it holds it); NULL: all can. */
    int (*usable)(void *ctx, int key, int64_t model);
    void *ctx;
    /* The devices holding the model: they serve when no planned device
     * can (no plan covers the session yet, its planned devices are still
     * loading the model, or the planner could not place it). */
    const int *holders;
    int nholders;
    int *used_fallback; /* out, optional */
} pl_loop_route_env_t;

/* The routes of model's session at slo_ms (pl_plan_routes under its
 * kind's plan; targets only once a plan saw a rate of one request a
 * second), workers named by their keys. At most max; returns how many. */
int pl_loop_routes(const pl_loop_t *l, int64_t model, double slo_ms, const pl_loop_route_env_t *env,
                   pl_route_t *routes, int max);

/* What kind's current plan serves of session_id at most
 * (pl_plan_capacity_rps), from its index: O(1). */
double pl_loop_capacity_rps(const pl_loop_t *l, int kind, int session_id);

/* What a stored placement says session_id gets at alloc al of kind's plan:
 * its share of the rate the plan was made for (times headroom), not of the
 * packed rate, which holds the burst headroom too and would be inflated
 * again when a restart plans the stored rates. */
double pl_loop_stored_rate(const pl_loop_t *l, int kind, int session_id, const pl_alloc_t *al);

/* ---- splits ------------------------------------------------------------- */

/* The index of dispersion of a stage fed by a parent stage's crops: each
 * parent item gives a Poisson count of mean gamma (only the mean is
 * known), in clumps of the parent's saturation batch at its budget (a
 * bound on its batches). 1 for a root (parent NULL). */
double pl_loop_stage_dispersion(double gamma, const pl_profile_t *parent, double parent_budget_us,
                                double k_std);

typedef enum {
    PL_LOOP_SPLIT_DP = 0,     /* the DP's, slack shared */
    PL_LOOP_SPLIT_EVEN_ASKED, /* even: asked for */
    PL_LOOP_SPLIT_EVEN_NO_PROFILE,
    PL_LOOP_SPLIT_EVEN_NO_DP, /* even: the DP found no split */
} pl_loop_split_why_t;

typedef struct {
    const pl_stage_t *stages; /* parents before children; a NULL profile: none yet */
    int nstages;
    double slo_us;
    double rate_qps;    /* the query rate; the DP assumes at least 1 (0 makes every split free) */
    double epsilon_us;  /* the DP's step, at most slo_us / 1000 */
    double overhead_us; /* of every stage's budget, what its batches cannot use */
    double k_std;
    int even; /* the even split asked for */
} pl_loop_split_in_t;

/* A pipeline's split: budget_us (nstages) always filled: the DP's with
 * the slack shared, or the even split (pl_query_even_budgets) when asked,
 * when a profile is missing or when the DP finds none. *why says which,
 * *missing the stage without a profile (else -1). res, when not NULL,
 * gets the split's rates, batches and cost (free with
 * pl_query_result_dispose). Returns 0; SQ_DEADLINE when res was asked for
 * and cannot be had (a profile missing, a budget holding no batch: the
 * budgets are filled all the same); SQ_INVAL on bad input (no stages, a
 * parent not earlier, SLO not positive). */
int pl_loop_split(const pl_loop_split_in_t *in, double *budget_us, pl_loop_split_why_t *why,
                  int *missing, pl_query_result_t *res);
/* What a pipeline's split may cost, in devices, when the cheapest costs
 * cheapest_devices: at low load, up to twice that within one device (where
 * any split runs on the device the cheapest needs, and its slack costs
 * nothing), at high load PL_SPLIT_ALLOWANCE times it, so that the slack
 * never takes from the other sessions what their goodput needs. */
#define PL_SPLIT_ALLOWANCE 1.02
double pl_loop_split_allowance(double cheapest_devices);

#endif
