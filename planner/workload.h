/* Workload JSON (DESIGN.md, "Workload, plan and simulation JSON") loaded
 * into plain C structs, and the plan JSON writer. One format feeds
 * squish-plan and squish-sim; schemas/workload.schema.json is its schema.
 *
 * This lives in its own library (sqworkload, dependency workload_dep) so that
 * the pure placement core (sqplanner) never needs jansson.
 *
 * Units: the JSON carries milliseconds, MiB and requests per second in its
 * key names; the structs keep profiles in µs and bytes (pl_profile_t, the
 * same units both pure cores use) and everything else in the JSON's units
 * with the unit in the field name.
 *
 * Ownership: wl_workload_t owns every string, array and profile it holds;
 * wl_workload_dispose() releases them (and accepts a zeroed or half-loaded
 * workload). Indices (wl_session_t.model, wl_stage_t.after) point into the
 * same workload's arrays. */
#ifndef WL_WORKLOAD_H
#define WL_WORKLOAD_H

#include "pl.h"
#include "pl_profile.h"

#include <stddef.h>

/* Linear profiles without "max_batch" are capped here: batches beyond it
 * need memory nobody measured. */
#define WL_DEFAULT_MAX_BATCH 256
/* 1 MiB: "memory_mb" in the JSON means MiB (11264 MB = an 11 GiB 1080Ti). */
#define WL_BYTES_PER_MB 1048576.0

typedef enum {
    WL_ARRIVALS_NONE =
        0, /* only "rate_rps": the caller picks a process (Poisson in the simulator) */
    WL_ARRIVALS_UNIFORM, /* evenly spaced at each segment's rate */
    WL_ARRIVALS_POISSON,
    WL_ARRIVALS_GAMMA, /* gamma inter-arrivals with "shape" (1 = Poisson) */
    WL_ARRIVALS_TIMES, /* explicit "times_ms" list */
} wl_process_t;

typedef struct {
    double duration_s;
    double rate_rps;
} wl_segment_t;

typedef struct {
    wl_process_t process;
    double shape; /* gamma shape; 1 unless given */
    int nsegments;
    wl_segment_t *segments; /* owned; for the uniform/poisson/gamma processes */
    int ntimes;
    double *times_ms; /* owned; sorted ascending, for WL_ARRIVALS_TIMES */
} wl_arrivals_t;

typedef struct {
    char *name;           /* owned */
    pl_profile_t profile; /* µs and bytes; memory from "memory_mb" and "memory_per_item_mb" */
    int prefix_group;     /* index into wl_workload_t.prefix_groups, or -1 */
    /* "input_bytes" + "output_bytes" of one request (default 0): what it
     * moves over a device's link. */
    double item_bytes;
} wl_model_t;

/* Models that share all but their last layers: each member model's profile
 * is its suffix, the group's own profile is the shared prefix. */
typedef struct {
    char *name;          /* owned */
    pl_profile_t prefix; /* the shared prefix's l(b) and memory */
    int nmodels;
    int *models; /* owned; indices into wl_workload_t.models */
} wl_prefix_group_t;

typedef struct {
    int model; /* index into wl_workload_t.models */
    double slo_ms;
    /* "rate_rps", or the duration-weighted mean rate of the arrival
     * segments, or (n - 1) / span of n times_ms: what the planner plans for. */
    double rate_rps;
    wl_arrivals_t arrivals; /* process WL_ARRIVALS_NONE when only rate_rps was given */
} wl_session_t;

/* How many items a stage gets per parent item ("gamma_dist"; the mean is
 * "gamma" either way). Only the simulator draws them; the planner plans the
 * mean, and sizes the stage's burst headroom for the clumps of crops that
 * one parent batch makes (pl_clump_dispersion, from this distribution's
 * variance). */
typedef enum {
    WL_GAMMA_POISSON = 0, /* "poisson" (default): Poisson with mean gamma */
    WL_GAMMA_FIXED,       /* "fixed": gamma rounded stochastically (floor, plus 1 with
                             probability frac(gamma)): exactly gamma when whole */
} wl_gamma_dist_t;

typedef struct {
    char *id;      /* owned */
    int model;     /* index into wl_workload_t.models */
    int nafter;    /* 0 for a root stage */
    int *after;    /* owned; indices of parent stages in the same pipeline */
    double *gamma; /* owned; fan-out per incoming edge (items per parent item), default 1 */
    wl_gamma_dist_t gamma_dist;
} wl_stage_t;

typedef struct {
    char *name;    /* owned */
    double slo_ms; /* end to end */
    /* Of queries entering the pipeline's root stages: "rate_rps", or the
     * mean rate of "arrivals" (as a session's). */
    double rate_rps;
    wl_arrivals_t arrivals; /* process WL_ARRIVALS_NONE when only rate_rps was given */
    int nstages;
    wl_stage_t *stages; /* owned; parents always listed before children */
} wl_pipeline_t;

typedef struct {
    int device_count;        /* devices available; 0 = as many as the plan needs */
    double device_memory_mb; /* per device; 0 = unlimited */
    /* "devices": {"hosts": [{"count", "rtt_ms", "bandwidth_mbps"}, ...]}:
     * device ids in host order, each behind its host's link (µs and
     * bytes/µs; absent fields 0: local). ndevice_links = the hosts' counts
     * added up (= device_count); 0 without hosts. Owned. */
    int ndevice_links;
    pl_link_t *device_links;
    int nmodels;
    wl_model_t *models;
    int nprefix_groups;
    wl_prefix_group_t *prefix_groups;
    int nsessions;
    wl_session_t *sessions;
    int npipelines;
    wl_pipeline_t *pipelines;
    unsigned long long seed; /* "seed", default 1 */
    double k_std;            /* "planner": {"k_std"}: latency margin mean + k * std, default 0 */
    double query_epsilon_ms; /* "planner": {"query_epsilon_ms"}: DP step, default 1 */
    /* Why the last load failed: "sessions[2].slo_ms: must be a positive
     * number". Empty after success. */
    char error[256];
} wl_workload_t;

/* Parses a workload from a file or from a NUL-terminated string into *w
 * (which need not be initialized). Returns 0, SQ_IO (file unreadable),
 * SQ_BAD_JSON (not JSON) or SQ_BAD_CONFIG (a field missing, mistyped or out
 * of range; unknown model names; a pipeline stage referring to a later or
 * unknown stage). On failure w->error names the JSON path and *w holds
 * nothing that needs freeing beyond wl_workload_dispose(), which is always
 * safe to call. */
int wl_load_file(wl_workload_t *w, const char *path);
int wl_load_string(wl_workload_t *w, const char *json);
void wl_workload_dispose(wl_workload_t *w);

/* Index of the model called name, or -1. */
int wl_find_model(const wl_workload_t *w, const char *name);

/* ---- planning a workload (squish-plan) ---------------------------------- */

typedef enum {
    WL_SOURCE_SESSION = 0, /* one entry of wl_workload_t.sessions */
    WL_SOURCE_GROUP,       /* the sessions of one prefix group at one SLO */
    WL_SOURCE_STAGE,       /* a pipeline stage at its share of the pipeline SLO */
} wl_source_kind_t;

/* Where a planner session came from. */
typedef struct {
    wl_source_kind_t kind;
    const char *name; /* borrowed from the workload: model or prefix-group name */
    int index;        /* session, prefix group or pipeline index */
    int stage;        /* WL_SOURCE_STAGE: stage index in the pipeline */
    int nmembers;     /* WL_SOURCE_GROUP: member sessions */
    int *members;     /* owned; wl session indices */
} wl_source_t;

/* The planner's input for a workload: ordinary sessions first (in workload
 * order), sessions of models in a prefix group merged per (group, SLO) into
 * one session with a pl_prefix_profile, then one session per stage of every
 * pipeline whose SLO could be split (pl_query_split). Session ids are their
 * indices; prefix-group sessions get model ids past the workload's models.
 * Borrows the workload's profiles: dispose before the workload. */
typedef struct {
    int nsessions;
    pl_session_t *sessions; /* owned */
    wl_source_t *sources;   /* owned; one per session */
    int nprofiles;
    pl_profile_t *profiles;    /* owned; the prefix groups' combined profiles */
    int nsplits;               /* = w->npipelines */
    pl_query_result_t *splits; /* owned; nstages 0 where split_rc < 0 */
    int *split_rc;             /* owned; 0 or the pl_query_split error */
    pl_options_t options;      /* k_std, device memory and links (borrowed from the
                                  workload) from the workload; no device cap */
    int split;                 /* wl_split_t the stage budgets came from */
} wl_plan_input_t;

/* How a pipeline's SLO is split among its stages. */
typedef enum {
    WL_SPLIT_DP = 0, /* pl_query_split: Nexus's DP, the cheapest budgets */
    WL_SPLIT_EVEN,   /* pl_query_split_even: equal shares of the longest path */
} wl_split_t;

/* The index of dispersion of stage k's arrivals in pipeline pl split as
 * split (pl_session_t.dispersion): 1 at a root; on a parent's items, the
 * clumps one parent batch makes (pl_clump_dispersion), with the batch the
 * parent's saturation batch at its budget (split->batch: a bound; lighter
 * load runs smaller batches) and the variance of the stage's gamma_dist
 * (a join: its first parent). */
double wl_stage_dispersion(const wl_pipeline_t *pl, int k, const pl_query_result_t *split);

/* Builds the planner input; returns 0 or SQ_INVAL (a prefix group whose
 * combined profile has no usable batch; w->error says which).
 * wl_plan_input_build splits pipelines with WL_SPLIT_DP. */
int wl_plan_input_build(wl_plan_input_t *in, wl_workload_t *w);
int wl_plan_input_build_split(wl_plan_input_t *in, wl_workload_t *w, wl_split_t split);
void wl_plan_input_dispose(wl_plan_input_t *in);

/* The plan JSON of DESIGN.md: {"devices": [{"id", "duty_cycle_ms",
 * "occupancy", "memory_mb", "saturated", "sessions": [{"session", "model",
 * "slo_ms", "rate_rps", "batch", "latency_ms"}]}], "devices_used",
 * "lower_bound_devices", "efficiency", "unplaced": [...], "pipelines":
 * [{"name", "budgets_ms": {stage: ms}}], "advice": {"devices_delta", ...}}.
 * devices_needed: how many devices the plan takes with no cap (the advice
 * compares it with w->device_count). Returns a malloc'd string. */
char *wl_plan_to_json(const wl_workload_t *w, const wl_plan_input_t *in, const pl_plan_t *plan,
                      int devices_needed);

#endif
