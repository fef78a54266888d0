/* Placement core of the planner: which sessions run on which device, with
 * what batch size and duty cycle (Nexus, SOSP'19, section 6.1, squishy bin
 * packing), complex-query latency splitting (section 6.2), prefix-batched
 * groups, incremental epochs and autoscaling advice (Symphony, section 3.5).
 *
 * Pure: no I/O, no clock, no threads, no globals; the same inputs always
 * give the same plan. Times are µs, rates requests per second, memory bytes.
 *
 * A session is (model or prefix group, SLO) with a rate. Every placed share
 * of a session runs on a device that cycles through its sessions once per
 * duty cycle d, running a batch of b = ceil(d * r) for each (r: the share's
 * rate). A placement is valid when, on every device,
 *   - the batches fit the cycle: sum l(b) <= d;
 *   - every session meets its SLO in the worst case: d + l(b) <= L (a request
 *     that just missed a batch waits a whole cycle, then its batch runs);
 *   - the models' memory (weights once per model, activations at the largest
 *     batch of that model there, pl_memory_bytes) fits the device.
 * A saturated device holds a single session running back to back (d = l(b)).
 *
 * Devices behind a link (pl_options_t.links, Symphony's d_data): a batch of
 * b of session s on a device behind link k costs
 *   net_k(b) = rtt_k + b * item_bytes(s) / bytes_per_us_k
 * on top of l(b), in the SLO check (d + l(b) + net(b) <= L) and in the duty
 * cycle (sum (l(b) + net(b)) <= d): the transfer is not taken as overlapped
 * with compute. A link could carry batch k+1 while batch k runs (throughput
 * bounded by max(l(b), transfer(b)), latency adding both), but the dispatcher
 * core keeps one batch in flight per worker and holds the worker busy until
 * the batch's answer is back (pl_dispatch.h: finish_us counts the transfer),
 * so the device's time per batch is l(b) + net(b) and a plan that assumed the
 * overlap would promise throughput the dispatcher does not deliver. Packing
 * itself runs as for local devices; the devices then get ids (so links) most
 * constrained first (fewest ids whose link carries them), each the id whose
 * link carries it at the lowest occupancy (local first), all of its
 * sessions still meeting their SLOs at the rates it serves, its duty cycle
 * shortened (batches shrink) where the transfer needs it. A device that no
 * id left can host is not in the plan: its sessions are unplaced
 * (PL_UNPLACED_LINK). A kept device (incremental plan) that its own link no
 * longer carries is re-assigned like a new one.
 */
#ifndef PL_H
#define PL_H

#include "pl_profile.h"

#include <stddef.h>

typedef struct pl_session {
    int id;                      /* stable across epochs: plans refer to sessions by it */
    int model;                   /* model or prefix-group id: sessions of one model on one
                                    device share its weights, so they must share a profile */
    const char *name;            /* borrowed label, copied into nothing; for output */
    const pl_profile_t *profile; /* borrowed */
    double slo_us;
    double rate_rps;   /* 0: no traffic yet, still placed at the minimal batch */
    double item_bytes; /* input + output bytes of one request: its share of a link */
    /* The count of its requests arriving in a window: variance over mean
     * (the index of dispersion). 0 or 1: Poisson. A pipeline stage on the
     * crops of another gets them in clumps, all of a parent batch's at
     * once: a compound Poisson whose dispersion is E[S^2] / E[S] for the
     * clump size S (pl_clump_dispersion). The burst headroom
     * (pl_options_t.burst_quantile) then covers D times a Poisson count of
     * mean lambda / D instead of a Poisson count of mean lambda. */
    double dispersion;
} pl_session_t;

/* A device's link: rtt_us 0 and bytes_per_us 0 = local (the default);
 * bytes_per_us 0 with a round trip: only the round trip counts. */
typedef struct {
    double rtt_us;
    double bytes_per_us;
} pl_link_t;

typedef struct {
    double k_std;               /* latency margin: mean + k_std * std */
    double device_memory_bytes; /* per device; 0 = unlimited */
    int max_devices;            /* devices available; 0 = as many as needed */
    /* Device id k < nlinks sits behind links[k] (borrowed); ids from nlinks
     * on are local. NULL / 0: every device is local. */
    const pl_link_t *links;
    int nlinks;
    /* Burst headroom: 0 plans fluid rates (a batch of ceil(d r) per duty
     * cycle, Nexus's rule and its worked examples); p in (0, 1) sizes for
     * Poisson arrivals instead: a share runs the p-quantile of the count
     * arriving in its duty cycle, q_p(r d), about r d + z_p sqrt(r d), so
     * occupancy counts the bursts (pack.c, packed_rate: a session that
     * fills whole devices is sized pooled over them and over its SLO,
     * q_p(r L) / L; p >= 1 counts as 1 - 1e-9). PL_BURST_QUANTILE is the
     * default of squishd and squish-sim. */
    double burst_quantile;
    /* 1: when the packing leaves devices of max_devices empty, each spare
     * device also holds the sessions with the most planned load (the sum of
     * their shares' occupancy), busiest first, as far as its memory (every
     * model's weights and activations at its saturation batch) and its link
     * (2 (l(b) + net(b)) <= SLO for some b) allow (pl_plan_t.overflow). An
     * idle spare stays idle at low load (the matchmaker breaks ties to the
     * lowest id, and spares take the ids after the packed ones when they
     * can), and takes a busy session's batches when its devices are all
     * busy. When the packing is short of devices (load unplaced,
     * PL_UNPLACED_DEVICES), the planned devices that do not hold such a
     * session also take its overflow, least occupied first, as memory
     * allows. */
    int overflow;
    /* At most this many devices take one session's overflow. 0: as many
     * as keep sessions x devices within PL_OVERFLOW_ROUTES (every device
     * for the clusters of the benches and tests), at least
     * PL_OVERFLOW_DEVICES. With more spares than that, session k of the
     * rank starts at spare k * overflow_devices (mod the spares): they are
     * dealt round, each spare holds a share of the sessions; with fewer,
     * every session is offered every spare as above. The same holds for
     * planned devices taking short sessions' overflow. */
    int overflow_devices;
} pl_options_t;

/* A bounded plan for a large cluster: up to 4,096 sessions, every device
 * up to 65,536 / sessions of them; at 10,000 sessions, 16 each (160,000
 * overflow routes). */
#define PL_OVERFLOW_ROUTES 65536
#define PL_OVERFLOW_DEVICES 16

/* 0.99: one duty cycle in a hundred brings more than its batch; the
 * excess, E[(N - q)+] / (r d) of the requests, is at most 0.44% (at
 * r d ~ 1), 0.2% from r d = 8 on, 0.04% at r d = 100: inside a 99.5% SLO
 * floor even if every excess request missed (most do not: the next cycle
 * or another device has room). */
#define PL_BURST_QUANTILE 0.99

typedef struct {
    int session; /* index into the sessions given to pl_plan */
    int session_id;
    int model;
    int batch;
    double latency_us;  /* l(batch) with the k_std margin */
    double transfer_us; /* net(batch) on the device's link; 0 when local */
    double rate_rps;    /* the share of the session's rate served here (of its packed
                           rate: with burst_quantile, a session that fills devices is
                           packed at q_p(r L) / L, more than its rate) */
} pl_alloc_t;

typedef struct {
    int id;        /* stable across epochs: kept devices keep their id */
    int saturated; /* one session running back to back */
    double duty_cycle_us;
    double occupancy; /* sum of batch latencies (transfers included) / duty cycle */
    double memory_bytes;
    double rtt_us, bytes_per_us; /* its link (pl_options_t.links); 0, 0: local */
    int nallocs;
    pl_alloc_t *allocs; /* owned */
} pl_device_t;

typedef enum {
    PL_UNPLACED_SLO = 1, /* no batch size meets the SLO even alone on a device */
    PL_UNPLACED_MEMORY,  /* the model does not fit a device's memory */
    PL_UNPLACED_DEVICES, /* feasible, but max_devices were all used, their cycles full */
    PL_UNPLACED_LINK,    /* feasible locally, but no device left whose link meets the SLO */
    /* Feasible, max_devices all used, and a planned device has the time
     * for it (its share of a cycle beside theirs) but not within the duty
     * cycle its sessions' SLOs allow: the cycle is too short for its batch
     * beside the batches there. A longer SLO for the session that sets the
     * cycle (blocker_session), or a device, places it. */
    PL_UNPLACED_DUTY_CYCLE,
} pl_unplaced_reason_t;

typedef struct {
    int session;
    int session_id;
    double rate_rps; /* load left without a device */
    pl_unplaced_reason_t reason;
    /* What blocks it, for a user (pl_unplaced_words says it in words). */
    double need_us;             /* l(1) with the margin: the least of a duty cycle it takes */
    double need_bytes;          /* its model's memory at a batch of one */
    double device_memory_bytes; /* pl_options_t.device_memory_bytes */
    /* DEVICES and DUTY_CYCLE: the planned device it came closest to
     * sharing (-1: none, e.g. it fills whole devices), that device's duty
     * cycle with it (the least its sessions' SLOs allow), what the
     * batches there take of it, its memory left (0: unlimited) and the
     * session (index, id, SLO) whose SLO sets that cycle, itself maybe;
     * slo_needed_us is about the SLO that session would need for the
     * cycle to hold its batch beside the others. */
    int device_id;
    double cycle_us;
    double reserved_us;
    double free_bytes;
    int blocker_session, blocker_session_id;
    double blocker_slo_us;
    double slo_needed_us;
} pl_unplaced_t;

/* The reason's code as the plan's JSON shows it: "slo", "memory",
 * "devices", "link", "duty_cycle". */
const char *pl_unplaced_code(pl_unplaced_reason_t r);
/* What blocks u, in words a user can act on (e.g. "needs 43 ms of a duty
 * cycle, but cpu:0's cycle is at most 10 ms for det (SLO 12 ms), 2 ms of
 * it taken: ask for an SLO of 57 ms or more for det, or add a device"),
 * into buf (truncated to size). slo_us: the session's SLO; ndevices: the
 * devices in use; device and blocker: the names of u->device_id and
 * u->blocker_session (NULL when there is none). Returns buf. */
const char *pl_unplaced_words(char *buf, size_t size, const pl_unplaced_t *u, double slo_us,
                              int ndevices, const char *device, const char *blocker);

/* A device that also holds a session's model without a share of it, so
 * that the dispatcher's matchmaking can give it the session's overflow
 * batches (Symphony: any worker holding the model): a spare device (an id
 * below max_devices that the packing left empty), or, when devices are
 * short, a planned device of other sessions. Not part of the packing: the
 * advice counts ndevices only. */
typedef struct {
    int device_id;
    int session; /* index into the sessions given to pl_plan */
    int session_id;
    int model;
} pl_overflow_t;

typedef struct pl_plan {
    int ndevices;
    pl_device_t *devices; /* owned; ascending id */
    int nunplaced;
    pl_unplaced_t *unplaced;    /* owned */
    double lower_bound_devices; /* sum R_i / T_i over placeable sessions */
    int moved;    /* (session, device) placements not in the previous plan: model loads */
    int evicted;  /* sessions evicted from overloaded kept devices */
    int released; /* previous devices left empty and given back */
    /* Devices holding sessions for their overflow (pl_options_t.overflow):
     * spare devices by id, busiest session first, then planned devices
     * taking unplaced sessions'. */
    int noverflow;
    pl_overflow_t *overflow; /* owned */
} pl_plan_t;

/* Computes a plan for sessions (ids unique). With prev (a plan from an
 * earlier call, possibly for other rates or sessions) the plan is
 * incremental: placements that still fit are kept, the cheapest sessions are
 * evicted from overloaded devices and only those, new sessions and new load
 * are packed (into kept devices when they fit, else new ones), and empty
 * devices are released. Without prev: the full squishy bin packing.
 * Returns 0 (out filled; free with pl_plan_dispose) or SQ_INVAL (bad input:
 * duplicate ids, missing profile, negative rate or item bytes, non-positive
 * SLO, a link with a negative or non-finite field). */
int pl_plan(pl_plan_t *out, const pl_session_t *sessions, int nsessions, const pl_plan_t *prev,
            const pl_options_t *opt);
void pl_plan_dispose(pl_plan_t *plan);
/* A deep copy of src (dispose it with pl_plan_dispose). */
void pl_plan_copy(pl_plan_t *dst, const pl_plan_t *src);

/* Saturation: the largest throughput one device can give a session alone,
 * batch B with 2 l(B) <= L and memory(B) fitting (memory_bytes 0 =
 * unlimited). Returns B / l(B) in req/s and the batch in *batch, or 0 (and
 * *batch 0) when no batch qualifies. */
double pl_max_throughput_rps(const pl_profile_t *p, double slo_us, double k_std,
                             double memory_bytes, int *batch);

/* Residue: the cheapest way to run rate_rps of a session on part of a
 * device: the b with the lowest occupancy l(b) / d among those with
 * b / r + l(b) <= L at duty cycle d = b / r (with l(b)/b non-increasing that
 * is Nexus's largest such b; with a table it skips a b that only pads up to
 * the next row, e.g. B in the section 4.1 example runs 4 at 125 ms, not 5 at
 * 156 ms), or, when the rate is too low for even b = 1 (or zero), b = 1 at
 * duty cycle L - l(1). The batch must fit memory_bytes (0 = unlimited).
 * Returns 0 and fills batch, duty cycle and occupancy, or SQ_DEADLINE when
 * no batch can meet the SLO. */
int pl_residue(const pl_profile_t *p, double slo_us, double rate_rps, double k_std,
               double memory_bytes, int *batch, double *duty_cycle_us, double *occupancy);

/* Lower bound on devices: sum over sessions of R_i / T_i (T_i from
 * pl_max_throughput_rps); sessions that cannot be placed are skipped. */
double pl_lower_bound(const pl_session_t *sessions, int nsessions, const pl_options_t *opt);

/* Autoscaling advice (Symphony section 3.5). With a fraction bad_rate of
 * requests dropped or late over ndevices, ask for ndevices * r / (1 - r)
 * more (the devices that would have served the bad share at the current
 * per-device goodput); bad_rate >= 1 is capped at 0.99. */
double pl_advice_add(int ndevices, double bad_rate);
/* With an average idle fraction f over ndevices, ndevices * f could go. */
double pl_advice_release(int ndevices, double idle_fraction);

/* Epoch triggers (pure: the caller passes the time and keeps the state).
 * An epoch runs every period_ms, or early when a session's rate leaves
 * [low, high] times what the plan serves it, never sooner than
 * min_interval_ms after the last one. */
typedef struct {
    double period_ms;       /* 30000 */
    double min_interval_ms; /* 10000 */
    double low, high;       /* 0.8, 1.1 */
    double ewma_tau_ms;     /* 10000: time constant of the rate estimate */
} pl_epoch_config_t;

typedef enum {
    PL_EPOCH_NONE = 0,
    PL_EPOCH_PERIODIC,
    PL_EPOCH_RATE_CHANGE,
} pl_epoch_reason_t;

void pl_epoch_config_default(pl_epoch_config_t *c);
/* The rate estimate after count arrivals in the last interval_ms: an EWMA
 * with time constant tau_ms, so that uneven tick intervals weigh right. */
double pl_rate_ewma(double prev_rps, double count, double interval_ms, double tau_ms);
/* What plan serves of a session at most: sum over its shares of
 * batch / duty cycle (req/s); 0 when it has no device. */
double pl_plan_capacity_rps(const pl_plan_t *plan, int session_id);

/* A plan read by session: what each session has in it, found by its id in
 * O(1), so that routing, stored rates and reports cost the session's own
 * entries, not a scan of the whole plan (at 10,000 sessions on 2,000
 * devices, a scan per session was seconds an epoch). Built from a plan;
 * read-only after; the plan must outlive it. */
typedef struct {
    double capacity_rps; /* pl_plan_capacity_rps */
    double packed_rps;   /* sum of its allocations' rate_rps */
    double unplaced_rps; /* sum of its plan->unplaced rate_rps */
    int nallocs;
    int nover;
    int first_alloc; /* into pl_plan_index_t.alloc_device/alloc_ix */
    int first_over;  /* into pl_plan_index_t.over */
} pl_plan_entry_t;

typedef struct {
    int min_id, nids; /* entries for ids min_id .. min_id + nids - 1 */
    pl_plan_entry_t *entry;
    int *alloc_device; /* plan->devices index, ascending within a session */
    int *alloc_ix;     /* index into that device's allocs */
    int *over;         /* plan->overflow index, ascending within a session */
} pl_plan_index_t;

void pl_plan_index_build(pl_plan_index_t *ix, const pl_plan_t *plan);
void pl_plan_index_dispose(pl_plan_index_t *ix);
/* The session's entry, or NULL when the plan has nothing of it. */
const pl_plan_entry_t *pl_plan_index_get(const pl_plan_index_t *ix, int session_id);
/* Whether an epoch is due at now_ms. rate_rps and planned_rps are per
 * session (planned 0 and rate > 0: a session the plan does not serve yet). */
pl_epoch_reason_t pl_epoch_due(const pl_epoch_config_t *c, double now_ms, double last_epoch_ms,
                               const double *rate_rps, const double *planned_rps, int n);

/* Prefix groups: models sharing all but their last layers, one SLO, batched
 * together. Builds the group session's profile as a table for b = 1.. up to
 * the prefix's max batch: l(b) = prefix l(b) + sum_i suffix_i l(ceil(b * s_i))
 * where s_i = rates[i] / sum(rates) is member i's share of the batch (equal
 * shares when every rate is 0; a suffix with no rows in the batch costs 0).
 * std adds up (the parts run back to back on one device, so their jitter is
 * not independent). Memory: every part's weights; per item, the prefix's
 * plus each suffix's weighted by its share. Rows stop at the first b some
 * suffix cannot run. Returns 0 or SQ_INVAL (n < 1, negative rate, or no
 * usable batch). out is initialized by this call. */
int pl_prefix_profile(pl_profile_t *out, const pl_profile_t *prefix,
                      const pl_profile_t *const *suffixes, const double *rates, int n);

/* Complex queries: a pipeline is a DAG of stages, one end-to-end SLO. */
typedef struct {
    const pl_profile_t *profile; /* borrowed */
    int nparents;                /* 0: root, fed by the pipeline's own requests */
    const int *parents;          /* borrowed; indices of earlier stages */
    const double *gamma;         /* borrowed; per parent edge, items per parent item; NULL = 1 */
    /* Of the stage's budget, what its batches cannot use: the dispatcher's
     * margin and the stage's own pre-processing (a frame's decode, a crop's
     * cut). A budget of overhead_us + t plans the batches of budget t; 0
     * (the simulator's devices) plans the whole budget. */
    double overhead_us;
} pl_stage_t;

typedef struct pl_query_result {
    int nstages;
    double *budget_us;   /* owned; each stage's share of the SLO */
    double *rate_rps;    /* owned; each stage's rate (pipeline rate times the fan-outs) */
    int *batch;          /* owned; the saturation batch at that budget */
    double cost_devices; /* sum_v R_v l_v(b_v) / b_v, what the split minimizes */
} pl_query_result_t;

/* Splits slo_us among the stages (Nexus section 6.2) by dynamic programming
 * over budgets in steps of epsilon_us, minimizing sum_v R_v l_v(b_v) / b_v
 * (b_v: the saturation batch within the stage's budget) such that every
 * root-to-leaf path fits the SLO. Stage v's rate is the pipeline rate at a
 * root, else the largest parent rate times that edge's gamma (a join fires
 * once per matched set of inputs, so its rate is that of its busiest input).
 * Handles series-parallel (fork-join) DAGs exactly; other DAGs are refused.
 * Returns 0, SQ_INVAL (a cycle, a parent that is not earlier, a DAG that is
 * not series-parallel, epsilon or SLO not positive, more than 10000 steps)
 * or SQ_DEADLINE (no split meets the SLO). */
int pl_query_split(pl_query_result_t *out, const pl_stage_t *stages, int nstages, double slo_us,
                   double rate_rps, double epsilon_us, double k_std);
/* The even split, the baseline Nexus compares its DP with (figure 17):
 * each stage gets slo_us divided by the number of stages on the longest
 * root-to-leaf path through it (a chain of n stages: slo_us / n each), so
 * that every path fits the SLO. Rates, batches and cost as pl_query_split.
 * Any DAG whose parents come earlier. Returns 0, SQ_INVAL (a parent that is
 * not earlier, a negative gamma, SLO not positive) or SQ_DEADLINE (a
 * stage's share holds no batch). */
int pl_query_split_even(pl_query_result_t *out, const pl_stage_t *stages, int nstages,
                        double slo_us, double rate_rps, double k_std);
/* The even split's budgets alone (no profile needed): stage v gets slo_us
 * over the most stages on a root-to-leaf path through it. Only nparents
 * and parents are read. Returns 0 or SQ_INVAL (a parent not earlier, SLO
 * not positive). */
int pl_query_even_budgets(const pl_stage_t *stages, int nstages, double slo_us, double *budget_us);
void pl_query_result_dispose(pl_query_result_t *r);
/* The DP (pl_query_split) gives each stage the least budget at its least
 * cost. This gives what is left of the SLO to where the load is: along
 * each root-to-leaf path, to each stage in proportion to its rate times
 * l(1) (a stage's cost never grows with its budget, and slack absorbs the
 * bursts a fan-out makes), so that the busier stage of a higher gamma gets
 * more of it; a stage on several paths gets the least any of them allows,
 * so every path still fits the SLO. Batches and cost are those of the new
 * budgets. squishd and squish-sim both split this way. A pipeline with a
 * join (a stage of several parents) is left as it is. Returns 0, SQ_INVAL
 * (res not of these stages) or SQ_DEADLINE (as pl_query_split). */
int pl_query_share_slack(pl_query_result_t *res, const pl_stage_t *stages, int nstages,
                         double slo_us, double k_std);
/* The split that leaves every stage the most slack beyond its own costs
 * (its overhead_us and a batch of one, 2 l(1)) among those whose cost is at
 * most allowance_devices: at low load, where any split runs on the one
 * device the cheapest needs, each stage of a path gets its floor plus an
 * equal share of what the floors leave; as the load grows the split moves
 * back toward res (the cheapest, pl_query_split, in PL_SLACK_STEPS steps)
 * until its cost fits. A stage never gets less than its floor where the
 * SLO allows it. Replaces res when a split with more slack fits; a
 * pipeline with a join is left as it is. Returns 0 or SQ_INVAL. */
#define PL_SLACK_STEPS 32
int pl_query_most_slack(pl_query_result_t *res, const pl_stage_t *stages, int nstages,
                        double slo_us, double k_std, double allowance_devices);
/* The index of dispersion (pl_session_t.dispersion) of a stage fed by a
 * parent stage's batches of parent_batch items, each item giving a count
 * X of mean gamma and variance gamma_var: the clump is a batch's crops, S
 * = X_1 + ... + X_b, so E[S^2] / E[S] = gamma_var / gamma + b gamma. 1
 * (Poisson) when gamma is 0. */
double pl_clump_dispersion(double gamma, double gamma_var, double parent_batch);
/* The DP's per-stage cost: rate_rps * l(b) / b in devices with b the
 * saturation batch within budget_us, or -1 when none fits. */
double pl_stage_cost(const pl_profile_t *p, double budget_us, double rate_rps, double k_std);
/* The same for a stage at budget_us, its overhead_us taken off first. */
double pl_stage_cost_in(const pl_stage_t *st, double budget_us, double rate_rps, double k_std);

#endif
