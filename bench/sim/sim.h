/* squish-sim: a discrete-event simulator that drives the real dispatcher
 * core (planner/pl_dispatch.h) and, for multi-model workloads, the real
 * placement core (planner/pl.h) with a virtual clock and emulated devices: a
 * batch of b holds a device for exactly the profile's mean l(b), as in the
 * papers' own cluster-scale evaluations. Workload and summary formats:
 * DESIGN.md, "Workload, plan and simulation JSON"; schema
 * schemas/simulation.schema.json.
 *
 * Deterministic: arrivals come from the simulator's own PRNG (sim_rng.h)
 * seeded by the workload's seed (or sim_opts_t.seed) and the session index,
 * and every tie between events at one virtual moment is broken the same way
 * (batch completions, then arrivals, then the dispatcher's timer). */
#ifndef SIM_H
#define SIM_H

#include <pl_dispatch.h>
#include <workload.h>

#include <stddef.h>
#include <stdint.h>

typedef enum {
    SIM_ROUTE_AUTO = 0, /* one model: every device; several: the placement plan */
    SIM_ROUTE_ALL,      /* every session on every device */
    SIM_ROUTE_PLAN,     /* pl_plan at the simulated rates decides */
} sim_routing_t;

/* An epoch of the planning loop in a run (sim_opts_t.on_epoch). */
typedef struct {
    int64_t at_us;
    const struct pl_loop *loop; /* the plan in force: pl_loop_current(loop, 0) */
    int nsessions;              /* dispatcher sessions */
    /* Dispatcher session s's routes: routes[route_off[s] .. route_off[s + 1]). */
    const pl_route_t *routes;
    const int *route_off;
} sim_epoch_t;

typedef struct {
    pl_policy_t policy;
    int seed_given;
    unsigned long long seed; /* overrides the workload's when seed_given */
    double rate_scale;       /* multiplies every arrival rate (times_ms are compressed) */
    /* Seconds of arrivals. 0: the workload's own (its arrival segments;
     * SIM_DEFAULT_DURATION_S of Poisson arrivals for a session given only
     * "rate_rps"). > 0: every stream lasts this long: its segments are
     * stretched or shrunk in proportion (the rates and the shape of a ramp
     * kept), a times_ms trace ends there (no later arrival), a session
     * given only "rate_rps" runs this long. */
    double duration_s;
    int64_t net_delay_us; /* per batch, as in pl_dispatch_opts_t */
    sim_routing_t routing;
    /* pl_plan sees every rate times this: a fluid-rate plan packs devices
     * to ~100% of the mean rate and leaves nothing for Poisson bursts. */
    double plan_headroom;
    /* pl_options_t.burst_quantile: each planned batch covers this quantile
     * of the Poisson count in its duty cycle (0: plan the mean rates). */
    double plan_burst_quantile;
    /* pl_options_t.overflow: spare devices also hold the busiest sessions
     * (routes after the planned ones) and take their overflow. */
    int plan_overflow;
    int plan_overflow_devices; /* pl_options_t.overflow_devices; 0: the planner's rule */
    /* Re-planning epochs (placement routing): squishd's planning loop
     * (pl_loop.h) with epoch_s as its period (squishd's epoch_ms): rates
     * every second (EWMA, or the last second's when higher), an epoch
     * every epoch_s seconds of simulated time, early when a rate leaves
     * [0.8, 1.1] of what the plan serves (no sooner than min(10 s,
     * epoch_s) after the last), after min(1 s, epoch_s) when a rate rose
     * above it; the first plan takes the rates of the workload's first
     * moment. 0: one plan at the workload's mean rates. */
    double epoch_s;
    /* 1: the first plan sees no rate, as squishd's first epoch of a new
     * model (its sessions are there, planned at the minimal batch), and
     * the rates come from the arrivals; 0: the rates of the workload's
     * first moment, as if measured. */
    int plan_cold;
    double eager_load; /* adaptive policy's threshold; 0: PL_DEFAULT_EAGER_LOAD */
    /* How pipelines split their SLO among stages (wl_split_t): the DP of
     * pl_query_split (default) or the even split. */
    int split;
    /* Called at every plan applied (the first included); NULL: none. */
    void (*on_epoch)(void *ctx, const sim_epoch_t *epoch);
    void *on_epoch_ctx;
} sim_opts_t;

#define SIM_DEFAULT_DURATION_S 10.0

/* Defaults: deferred, workload seed, scale 1, the workload's durations, no
 * network delay, auto
 * routing, plan headroom 1, burst quantile PL_BURST_QUANTILE and overflow
 * routes on spare devices (as squishd). */
void sim_opts_default(sim_opts_t *o);

typedef enum {
    SIM_PENDING = 0, /* never answered: a bug; the summary counts them */
    SIM_OK,          /* finished within the deadline */
    SIM_LATE,        /* finished after its deadline */
    SIM_DROPPED,
} sim_outcome_t;

/* The drop reason of a pipeline item taken out of its queue because its
 * query was dropped (another item of it missed its deadline). */
#define SIM_REASON_QUERY 1

/* A dispatcher request: a session's request, or one item of a pipeline
 * query at one stage (query >= 0). Dispatcher sessions: the workload's
 * sessions, then one per stage of every pipeline (pipelines in order). */
typedef struct {
    int session;
    int64_t arrival_us, deadline_us;
    int64_t sent_us;   /* -1 when never sent */
    int64_t finish_us; /* answer time: batch end or drop */
    int outcome;       /* sim_outcome_t */
    int reason;        /* SQ_* drop reason, or SIM_REASON_QUERY */
    int query;         /* index into sim_result_t.queries, or -1 for a session's request */
    int stage;         /* the item's stage in its pipeline; -1 for a session's request */
} sim_request_t;

/* One pipeline query: good (SIM_OK) when every item of it finished by its
 * stage's deadline (so the query by arrival + the pipeline's SLO). At the
 * first item dropped or late, the whole query is dropped (SIM_DROPPED) or
 * late (SIM_LATE): its queued items leave their queues and no later stage
 * runs for it. */
typedef struct {
    int pipeline;
    int64_t arrival_us, deadline_us; /* deadline: arrival + the end-to-end SLO */
    int64_t finish_us;               /* last item done, or when it was dropped */
    int outcome;                     /* sim_outcome_t */
    size_t items;                    /* items created */
} sim_query_t;

typedef struct {
    size_t queries, ok, dropped, late, pending;
    int nstages;
    int first_session;   /* dispatcher session of stage 0; stage k is first_session + k */
    double *budget_us;   /* owned; per stage, from the split (sim_opts_t.split) */
    double cost_devices; /* the split's planned cost (pl_query_result_t) at the workload's rate */
    double *rate_rps;    /* owned; per stage, the planned rate (before rate_scale) */
    /* owned; per stage: items drawn and parent items they were drawn for
     * (a root: one per query; a join: its busiest input's items) */
    double *drawn, *parents;
} sim_pipeline_result_t;

typedef struct {
    int device;
    int session;
    int64_t start_us, end_us;
    int size;
} sim_batch_t;

/* One step of the workload's rates: the time between two consecutive
 * segment boundaries of any session (a ramp's steps). */
typedef struct {
    double start_s, end_s;
    size_t requests, ok, dropped, late; /* requests arriving in the step */
    int planned_devices;                /* the most any plan in force in the step used */
    double *busy_fraction;              /* owned, per device: batch time in the step / its length */
} sim_step_t;

typedef struct {
    int nsessions;      /* dispatcher sessions: the workload's, then the pipelines' stages */
    int *session_model; /* owned; per dispatcher session, its model */
    int ndevices;
    double horizon_s; /* the arrival window */
    double offered_rps;
    size_t nrequests;
    sim_request_t *requests; /* sorted by arrival; the dispatcher's request id is the index */
    size_t nbatches;
    sim_batch_t *batches; /* in dispatch order */
    size_t ok, late, dropped, pending;
    double busy_us;        /* device time spent on batches */
    int devices_used;      /* devices that ran at least one batch */
    long overlap_batch;    /* first batch that overlapped another on its device, or -1 */
    int planned_devices;   /* devices the placement plan used (0 without a plan) */
    int unplaced_sessions; /* sessions the plan left without a device */
    int epochs;            /* re-plans after the first (sim_opts_t.epoch_s) */
    int nsteps;
    sim_step_t *steps; /* owned */
    size_t nqueries;
    sim_query_t *queries; /* owned; sorted by arrival */
    int npipelines;
    sim_pipeline_result_t *pipelines;    /* owned; one per workload pipeline */
    size_t session_requests, session_ok; /* the sessions' requests (not pipeline items) */
    /* CPU time of the run on its thread: the dispatcher core's work with
     * the simulation's bookkeeping and plans around it (an upper bound on
     * the core's own cost; arrivals are drawn before it starts). */
    double cpu_s;
} sim_result_t;

/* Runs one simulation. Returns 0, SQ_INVAL (a session's model has no usable
 * batch for its SLO, or no devices) or the pl_plan error. *res is filled
 * either way enough for sim_result_dispose. */
int sim_run(const wl_workload_t *w, const sim_opts_t *opts, sim_result_t *res);
void sim_result_dispose(sim_result_t *res);

/* Fraction of a step's requests that finished within their SLO (1 when
 * none arrived in it). */
double sim_step_ok_fraction(const sim_step_t *step);

/* Fraction of requests that finished within their SLO (1 when none). With
 * pipelines: the least of the sessions' requests' fraction (when there are
 * any) and each pipeline's fraction of good queries. */
double sim_ok_fraction(const sim_result_t *res);

/* Symphony's goodput: the highest offered load (scaling every rate of the
 * workload, pipelines' too) at which at least `target` (0.99) of requests
 * finish within SLO (sim_ok_fraction: with pipelines, of queries good);
 * exponential bracketing then bisection to 0.2%. Leaves in *res the run at
 * that load and in *scale its factor; *runs counts simulations. */
int sim_search_goodput(const wl_workload_t *w, const sim_opts_t *opts, double target, double *scale,
                       int *runs, sim_result_t *res);

/* The no-overlap checker: batches on one device must not run at the same
 * time (half-open [start, end) intervals). Returns the index (into batches)
 * of the first batch found overlapping another, or -1. */
long sim_check_overlap(const sim_batch_t *batches, size_t nbatches, int ndevices);

/* The summary JSON of DESIGN.md (malloc'd, pretty-printed). search_scale > 0
 * marks a goodput search (goodput_rps is then the offered rate at that
 * scale); dump adds every request and batch. */
char *sim_summary_json(const wl_workload_t *w, const sim_opts_t *opts, const sim_result_t *res,
                       double search_scale, int search_runs, int dump);

#endif
