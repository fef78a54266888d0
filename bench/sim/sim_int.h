/* The simulator engine's shared records (sim_run's run_t, its devices, its
 * dispatcher sessions and pipeline stages) and the sim__ functions its
 * files call each other by. Who calls whom, lowest first:
 *   sim_arrivals.c  arrivals, and the run's request and query tables
 *   sim_pipeline.c  the dispatcher sessions, pipelines' queries and items
 *   sim_plan.c      the planning loop's glue: routes, epochs, plans applied
 *   sim_result.c    steps, the checker, result accessors and disposal
 *   sim.c           the event loop (devices, completions), sim_run: all above
 *   sim_search.c    the goodput search: sim.c, sim_result.c
 *   sim_summary.c   the JSON summary: sim_result.c
 * No file calls one listed after it (sim_search.c and sim_summary.c call
 * nothing of each other); scripts/check_calls.py checks it (style/sim-calls). */
#ifndef SIM_INT_H
#define SIM_INT_H

#include "sim.h"

#include "sim_rng.h"

#include <pl.h>
#include <pl_loop.h>
#include <sq.h>

/* ---- devices ---- */

typedef struct {
    int busy;
    uint64_t batch_id;
    size_t record; /* index into res->batches */
    int64_t end_us;
    uint64_t *ids;
    int nids, cap_ids;
    int used;
    pl_link_t link; /* the workload's devices.hosts; 0, 0: local */
} device_t;

/* A dispatcher session: one of the workload's, or a pipeline's stage (its
 * budget as its SLO, the pipeline's rate times the fan-outs as its rate). */
typedef struct {
    int model;
    double slo_us;
    double rate_rps;               /* planned (mean) rate, before rate_scale */
    const wl_arrivals_t *arrivals; /* the session's, or the pipeline's queries' */
    double arrivals_rate;          /* the mean rate of those arrivals */
    int pipeline, stage;           /* a stage's; -1, -1 for a workload session */
} sim_sess_t;

/* A pipeline's stage in the run: its deadline offset from the query's
 * arrival (the budgets along the longest path up to it, its own included)
 * and its children. */
typedef struct {
    int64_t cum_us;
    int nchildren;
    int *children; /* owned */
} sim_stage_t;

typedef struct {
    const wl_workload_t *w;
    const sim_opts_t *o;
    sim_result_t *res;
    pl_dispatch_t *d;
    device_t *dev;
    sq_iheap_t done; /* pending completions: device -> end_us (one each) */
    int64_t timer_us;
    int64_t **exec_us;  /* per session: the emulated device's l(b), b = 1..max */
    double *item_bytes; /* per session: its model's input + output bytes */
    size_t cap_batches;
    int failed;
    /* Placement routing (SIM_ROUTE_PLAN): squishd's planning loop
     * (pl_loop.h), fed the arrivals; with epochs (sim_opts_t.epoch_s) it
     * takes rates and decides epochs at every tick, as on squishd's
     * dispatch thread. */
    int planning;
    pl_loop_t *loop;
    int64_t next_tick_us, tick_us;
    int64_t *plan_at_us; /* when each plan was applied, and its devices */
    int *plan_devices;
    int nplans, capplans;
    int nss;
    sim_sess_t *ss; /* the dispatcher sessions */
    /* Pipelines: per pipeline its stages; per query its per-stage state at
     * qoff[q] (stage k at qoff[q] + k): items pending (queued or running),
     * items created, fired (every item it will get is created), complete
     * (fired and none pending); its items as a list (qhead, inext). */
    sim_stage_t **stages;
    size_t cap_requests;
    size_t *qoff;
    int *pend;
    size_t *created;
    unsigned char *fired, *complete;
    long *qhead, *inext;
    sim_rng_t *qrng; /* per query: its fan-out draws */
    int *kill;       /* queries to drop once the dispatcher's actions are read */
    size_t nkill, capkill;
    pl_request_t *clump; /* item_push's, handed to the dispatcher together */
    int cap_clump;
} run_t;

/* sim_arrivals.c: generates the sessions' and the pipelines' arrivals (each
 * stream seeded by seed and its index) and fills res->requests (the
 * sessions' requests, by arrival), res->queries and the per-query state of
 * r (qoff, qhead, qrng, pend, created, fired, complete, inext,
 * cap_requests). Returns the horizon in seconds; *nsession_requests: how
 * many requests are the sessions'. */
double sim__arrivals_build(run_t *r, unsigned long long seed, size_t *nsession_requests);
/* What a stream's arrival segments' durations are multiplied by in this
 * run (sim_opts_t.duration_s): 1, or the run's duration over their total. */
double sim__segments_stretch(const wl_arrivals_t *a, const sim_opts_t *o);

/* sim_pipeline.c */
int sim__sessions_setup(run_t *r);
void sim__query_arrive(run_t *r, int q, int64_t now);
void sim__query_kill(run_t *r, int q, int outcome, int64_t now);
void sim__item_done(run_t *r, size_t id, int64_t now);

/* sim_plan.c */
int sim__routes_setup(run_t *r, int *ndevices);
int sim__plan_at(run_t *r, int64_t now);

/* sim_result.c */
void sim__steps_fill(const run_t *r, sim_result_t *res);

#endif
