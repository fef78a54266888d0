/* Pipelines (complex queries, Nexus section 4.2): a DAG of stages under one
 * end-to-end SLO. A stage runs a model on the request's image, or on the
 * crops of another stage's detections (crops_of). Each stage is a
 * dispatcher session at its share of the SLO (its budget); the shares come
 * from the query DP (planner/query.c) over measured fan-outs gamma.
 *
 *   pipeline.c       specs: parsing, validation, JSON, the registry of
 *                    published pipelines, their measured state and split
 *   pipelines_api.c  POST/GET/DELETE /pipelines
 *   query.c          POST /v1/pipelines/{p}/infer: a query's items, stage
 *                    by stage, and its answer
 *
 * A spec is immutable once published; its runtime state (measured gamma,
 * query rate, budgets, counts) is guarded by its own mutex. */
#ifndef GW_PIPELINE_H
#define GW_PIPELINE_H

#include "gw_detect.h"
#include "gw_registry.h"

#include <jansson.h>
#include <mdb.h>
#include <pthread.h>
#include <stdatomic.h>

#define GW_PIPE_MAX_STAGES 8
#define GW_PIPE_ID_MAX 63
#define GW_PIPE_DEFAULT_TOP_K 5

typedef struct {
    char id[GW_PIPE_ID_MAX + 1];
    char model[MDB_NAME_MAX + 1];
    int version;           /* 0: the version the model's policy serves */
    int parent;            /* -1: the request's image; else the stage whose detections it crops */
    gw_crops_spec_t crops; /* parent >= 0 (its output names, bound per query) */
    int top_k;             /* predictions per item in the answer (a stage without crop children) */
    int nchildren;
    int children[GW_PIPE_MAX_STAGES];
    int depth; /* stages on the path from the image, itself included (1 for a root) */
} gw_stage_spec_t;

/* Query outcomes, as /metrics counts them. */
typedef enum { GW_Q_OK, GW_Q_DROPPED, GW_Q_FAILED, GW_Q_NOUTCOMES } gw_query_outcome_t;

typedef struct gw_pipeline {
    atomic_int refs;
    char name[MDB_NAME_MAX + 1];
    double slo_ms;
    int split_even_asked; /* the spec's "split": "even" (the baseline of Nexus's figure 17) */
    int nstages;
    gw_stage_spec_t stages[GW_PIPE_MAX_STAGES];
    int order[GW_PIPE_MAX_STAGES]; /* every parent before its children */
    json_t *spec;                  /* the normalized spec: stored, and shown by GET */

    /* Runtime state, under mu. */
    pthread_mutex_t mu;
    double gamma[GW_PIPE_MAX_STAGES];     /* EWMA of items per parent item (1 before any) */
    double gamma_var[GW_PIPE_MAX_STAGES]; /* EWMA of (items - gamma)^2: gamma's noise */
    long long gamma_n[GW_PIPE_MAX_STAGES];
    double budget_ms[GW_PIPE_MAX_STAGES];   /* each stage's share of the SLO */
    double cum_ms[GW_PIPE_MAX_STAGES];      /* the query's arrival to the stage's deadline */
    double split_gamma[GW_PIPE_MAX_STAGES]; /* the gammas the split was made for */
    double split_rate_qps;
    int split_dp;            /* 0: the even split (no profiles yet), 1: the DP's */
    char split_why[96];      /* why the last DP attempt kept the even split */
    int resplit_wanted;      /* gamma moved past GW_PIPE_RESPLIT_FRACTION */
    long long arrivals;      /* queries that arrived, ever */
    long long rate_arrivals; /* at the last rate measure */
    int64_t rate_at_us;
    double rate_qps; /* EWMA of the query rate */
    long long outcomes[GW_Q_NOUTCOMES];
} gw_pipeline_t;

/* A stage on another's crops, as the planner sees its arrivals: they come
 * in clumps, the crops of one parent batch at once (pl_clump_dispersion). */
typedef struct {
    char model[MDB_NAME_MAX + 1];
    int version;      /* 0: the served one */
    double budget_ms; /* its session's SLO */
    char parent_model[MDB_NAME_MAX + 1];
    int parent_version;
    double parent_budget_ms;
    double gamma; /* measured */
} gw_stage_clumps_t;

/* Fills out (room for GW_PIPE_MAX_STAGES) with p's crop stages at the
 * current split; returns how many. */
int gw_pipeline_clumps(gw_pipeline_t *p, gw_stage_clumps_t *out);

/* A split is made again when a measured gamma moves this far (relative)
 * from the one it was made for, and by more than GW_PIPE_GAMMA_NOISE_SE
 * standard errors of the measure (gw_pipeline_fanout). */
#define GW_PIPE_RESPLIT_FRACTION 0.25
#define GW_PIPE_GAMMA_NOISE_SE 4.0
/* Weight of one frame's fan-out in the gamma EWMA (the first 1 / alpha
 * frames: their plain mean). About 100 frames: a Poisson gamma of 1 is
 * known within 0.07 (one standard error), and at 100 frames a second a
 * change shows within a second. */
#define GW_PIPE_GAMMA_ALPHA 0.01

/* Parses and checks a spec body: {"name", "slo_ms", "split"?: "dp" (the
 * default) | "even", "stages": [{"id",
 * "model", "version"?, "crops_of"?: {"stage", ...gw_crops_spec_parse},
 * "top_k"?}]}. Models are looked up in reg (each must exist and take
 * images; a crops_of's outputs must exist in its stage's model; reg NULL:
 * no model is looked at, for a spec read back from the DB). Returns
 * 0 and a new pipeline (one reference), or SQ_BAD_JSON / SQ_BAD_CONFIG with
 * err naming the field ("stages[1].crops_of.stage: a cycle ..."). */
int gw_pipeline_parse(const json_t *body, gw_registry_t *reg, gw_pipeline_t **out, char *err,
                      size_t errlen);
void gw_pipeline_ref(gw_pipeline_t *p);
void gw_pipeline_unref(gw_pipeline_t *p); /* accepts NULL */
/* Index of the stage called id, or -1. */
int gw_pipeline_stage(const gw_pipeline_t *p, const char *id);

/* The pipeline with its runtime state for GET and /v1/plan: {"name",
 * "slo_ms", "spec", "split": {"method": "dp"|"even", "budgets_ms",
 * "deadlines_ms", "gamma", "rates_rps"}, "rate_qps", "queries": {...}}. */
json_t *gw_pipeline_json(gw_pipeline_t *p);

/* ---- measuring and splitting (any thread) ---- */

/* A query arrived (counts toward the rate). */
void gw_pipeline_arrival(gw_pipeline_t *p);
/* A query ended with this outcome. */
void gw_pipeline_outcome(gw_pipeline_t *p, gw_query_outcome_t o);
/* One parent item of stage's parent gave n items of stage. */
void gw_pipeline_fanout(gw_pipeline_t *p, int stage, int n);
/* The deadlines of a query arriving now, from arrival (ms per stage). */
void gw_pipeline_deadlines(gw_pipeline_t *p, double *cum_ms);
/* A stage's budget at the current split (ms). */
double gw_pipeline_budget_ms(gw_pipeline_t *p, int stage);

/* Whether a split is due: a gamma moved, none was made yet, or the last
 * is interval_us old. */
int gw_pipeline_resplit_due(gw_pipeline_t *p, int64_t now_us, int64_t interval_us);
/* Splits the SLO again with the DP (planner/query.c) from the measured
 * gammas and query rate, using profile[stage] (NULL when the stage's model
 * has no profile on its serving kind: then the even split stays). k_std
 * and epsilon_ms as the planner's; overhead_ms: of each stage's budget,
 * what its batches cannot use (pl_stage_t.overhead_us: the dispatch margin
 * and the decode or crop before them). Returns 1 when the budgets
 * changed. */
int gw_pipeline_resplit(gw_pipeline_t *p, const pl_profile_t *const *profile, double k_std,
                        double epsilon_ms, double overhead_ms, int64_t now_us);

/* GET /v2/models/{pipeline}: what OIP sees of it (query.c). */
json_t *gw_pipeline_oip_metadata(gw_pipeline_t *p);

/* ---- the registry of published pipelines (thread-safe) ---- */

typedef struct gw_pipes gw_pipes_t;
gw_pipes_t *gw_pipes_new(void);
void gw_pipes_free(gw_pipes_t *ps); /* accepts NULL */
/* Publishes p (taking the caller's reference); replaces one by that name. */
void gw_pipes_put(gw_pipes_t *ps, gw_pipeline_t *p);
/* A new reference, or NULL. */
gw_pipeline_t *gw_pipes_get(gw_pipes_t *ps, const char *name);
/* 1 when one was removed. */
int gw_pipes_remove(gw_pipes_t *ps, const char *name);
/* New references to every published pipeline, by name; *n set; free the
 * array and unref each. */
gw_pipeline_t **gw_pipes_all(gw_pipes_t *ps, int *n);

#endif
