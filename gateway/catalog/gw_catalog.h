/* catalog/: what squishd serves: the model registry, published pipelines,
 * SLO buckets, and the DB thread that stores them. */
#ifndef GW_CATALOG_H
#define GW_CATALOG_H

#include "gw_codec.h"
#include "gw_image.h"
#include "gw_server.h"

#include <jansson.h>
#include <mdb.h>
#include <pl_profile.h>
#include <pthread.h>
#include <sq_device.h>
#include <stdatomic.h>
#include <stdint.h>

/* SLO buckets: a request joins the dispatcher session of the largest bucket
 * not above its SLO, so that a session's batches fit every member's SLO and
 * the number of sessions (and of metric label values) stays bounded. */
/* The bucket of slo_ms, in ms (the smallest bucket for anything below it). */
double gw_slo_bucket_ms(double slo_ms);

/* The in-memory model registry: what the data plane needs to know about
 * every stored model version, readable from any thread without touching
 * sqlite. The DB thread fills it at start and after each upload, profile or
 * delete; HTTP threads look models up per request; the dispatch thread
 * reads profiles and load specs.
 *
 * Entries are immutable once published and reference-counted: an update
 * publishes a new entry, and a request keeps the one it started with. */

typedef struct gw_model {
    atomic_int refs;
    int64_t key; /* the models row id: stable, unique per (name, version) */
    char name[MDB_NAME_MAX + 1];
    int version;
    char sha256[65];
    int emulated; /* format "emulated": no ONNX file */
    /* profiling | ready | failed, as measured; "unloaded" while an
     * operator keeps it out of service (model control: the DB keeps its
     * measured status, which comes back with a load). */
    char status[16];
    char error[256]; /* why it failed ("" otherwise) */
    char input_name[128];
    int input_uint8; /* the graph's input is UINT8 (else FP32) */
    int c, h, w;     /* input item: channels, height, width */
    int nhwc;        /* the input is [N,H,W,3] (else [N,C,H,W]) */
    /* Floats of an item's output row: every output of the graph, in its
     * order, each flattened (output i starts after the elems of outputs
     * 0..i-1). outputs[0].elems is output 0's alone (a classifier's
     * classes). */
    int64_t out_elems;
    int det_slots;   /* an emulated detector's boxes per item (gw_codec.h); 0 otherwise */
    double det_mean; /* its mean detections per item */
    /* An ONNX detector (its record's "detector", bound to its outputs):
     * /v1 answers its detections. has_detector 0: none. */
    int has_detector;
    gw_crops_spec_t detector;
    /* A segmenter (its record's "segmenter"): output 0 is [N, C, H, W];
     * /v1 answers its class-map summary. */
    int segmenter;
    char output_name[128]; /* output 0's */
    /* Every output of the graph in its order (outputs[0] is output 0); at
     * most GW_MAX_OUTPUTS are listed. */
    int noutputs;
    gw_output_t outputs[GW_MAX_OUTPUTS];
    double mean[3], std[3]; /* 0..255 pixel scale */
    int bgr;
    int nearest;   /* resize mode */
    int precision; /* asked for (sq_device.h: 0 fp32 .. 3 bf16): the loads say it */
    double default_slo_ms;
    int max_batch;
    uint64_t memory_bytes;
    json_t *labels; /* array of strings; owned */
    /* Why the backend of device kind k cannot run it ("" when it can, as
     * far as is known): the importer's rules at upload, or a load on a
     * worker of that kind refused while it was measured (the record's
     * "not_on"). Such a kind never measures nor serves it. */
    char not_on[SQ_DEV_KIND_COUNT][192];
    /* Profiles per device kind; has_profile[k] says whether one is stored. */
    int has_profile[SQ_DEV_KIND_COUNT];
    pl_profile_t profile[SQ_DEV_KIND_COUNT];
    /* Its shared-prefix group in the model DB (0: none) and where its graph
     * is cut for it (the tensor's name in this model). */
    int64_t group_id;
    char cut_tensor[256];
    /* The version policy its upload gave (has_policy 0: none, i.e. all);
     * the newest version's applies to every version of the name. */
    int has_policy;
    gw_version_policy_t policy;
    /* The record it was built from (gw_model_from_record; NULL for an
     * entry made otherwise): what a dispatcher sends its frontends, who
     * build their entries from it the same way. */
    json_t *record;
} gw_model_t;

void gw_model_ref(gw_model_t *m);
/* Accepts NULL. */
void gw_model_unref(gw_model_t *m);
/* Builds an entry from a record of mdb_model_records (see there). */
gw_model_t *gw_model_from_record(json_t *rec);
/* The label of class i ("i" when out of range) into buf. */
const char *gw_model_label(const gw_model_t *m, int64_t i, char *buf, size_t len);

typedef struct gw_registry gw_registry_t;

gw_registry_t *gw_registry_new(void);
void gw_registry_free(gw_registry_t *r);
/* Publishes m (taking the caller's reference), replacing an entry with the
 * same key. */
void gw_registry_put(gw_registry_t *r, gw_model_t *m);
/* A counter every put and remove bumps: a reader that saw generation g
 * has seen every change before it (readiness: a model just added is not
 * ready before the dispatcher has looked at it). Thread-safe. */
unsigned long gw_registry_generation(gw_registry_t *r);
/* Removes every version of name (version 0) or one version; writes the
 * removed keys (up to max) and returns how many were removed. */
int gw_registry_remove(gw_registry_t *r, const char *name, int version, int64_t *keys, int max);
/* A new reference to name's version, or NULL. Version 0: the newest ready
 * one that the name's version policy serves (a version still profiling, or
 * failed, never takes the traffic of one that is ready), else the newest
 * served, else the newest (gw_registry_served then says why not). */
gw_model_t *gw_registry_find(gw_registry_t *r, const char *name, size_t name_len, int version);
/* Whether the name's version policy serves m (the newest version's policy;
 * latest N counts ready versions); if not, why, in why. */
int gw_registry_served(gw_registry_t *r, const gw_model_t *m, char *why, size_t len);
/* A new reference by key, or NULL. */
gw_model_t *gw_registry_get(gw_registry_t *r, int64_t key);
/* Calls fn for every entry (under the lock: keep it short). */
void gw_registry_foreach(gw_registry_t *r, void (*fn)(gw_model_t *m, void *arg), void *arg);

/* Pipelines (complex queries, Nexus section 4.2): a DAG of stages under one
 * end-to-end SLO. A stage runs a model on the request's image, or on the
 * crops of another stage's detections (crops_of). Each stage is a
 * dispatcher session at its share of the SLO (its budget); the shares come
 * from the query DP (planner/query.c) over measured fan-outs gamma.
 *
 *   pipelines.c       specs: parsing, validation, JSON, the registry of
 *                    published pipelines, their measured state and split
 *   pipelines_api.c  POST/GET/DELETE /pipelines
 *   query.c          POST /v1/pipelines/{p}/infer: a query's items, stage
 *                    by stage, and its answer
 *
 * A spec is immutable once published; its runtime state (measured gamma,
 * query rate, budgets, counts) is guarded by its own mutex. */

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

    /* Unloaded (model control): its queries are refused until a load;
     * stored in the DB, set at start from there. */
    atomic_int unloaded;
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
    int64_t outcome_us[GW_Q_NOUTCOMES]; /* their times, summed */
    int64_t last_ok_ms;                 /* wall clock of the last ok query; 0: none */
    /* A frontend copy (gw_pipeline_report): what it measured since it last
     * told its dispatcher, which splits for every frontend. */
    int reporting;
    long long unreported_arrivals;
    int *unreported[GW_PIPE_MAX_STAGES]; /* fan-outs, GW_PIPE_REPORT_MAX at most */
    int nunreported[GW_PIPE_MAX_STAGES];
} gw_pipeline_t;

/* ---- pipelines on frontends (issue 25) ---- */

/* Fan-outs a frontend keeps for its next report, per stage. */
#define GW_PIPE_REPORT_MAX 4096
/* Starts keeping what p measures for gw_pipeline_report. */
void gw_pipeline_reporting(gw_pipeline_t *p);
/* What p measured since the last report, as {"arrivals": n, "fanout":
 * {"<stage index>": [n, ...]}} (a new reference), then forgotten; NULL
 * when nothing. */
json_t *gw_pipeline_report(gw_pipeline_t *p);
/* The dispatcher side: a frontend report counted as if its queries had
 * arrived here (arrivals, then each fan-out in order). 0, or -1 when the
 * report is malformed. */
int gw_pipeline_take_report(gw_pipeline_t *p, const json_t *report);
/* The split the dispatcher made (a frontend copy follows it): budgets and
 * deadlines per stage, ms. */
void gw_pipeline_set_split(gw_pipeline_t *p, const double *budget_ms, const double *cum_ms);

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
/* A query ended with o after took_us (arrival to answer). */
void gw_pipeline_outcome(gw_pipeline_t *p, gw_query_outcome_t o, int64_t took_us);
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
/* The stored pipelines that use model name (every version when version
 * is 0, else that version): a stage whose model, as the registry resolves
 * it now, is that one. loaded_only leaves out the pipelines unloaded.
 * Their names, comma-separated, into names (truncated to len); the count. */
int gw_pipes_using(gw_pipes_t *ps, gw_registry_t *reg, const char *name, int version,
                   int loaded_only, char *names, size_t len);

/* The DB thread (store.c): owns the model DB handle; the HTTP loops and
 * the dispatch thread post jobs to it and never touch the DB themselves. */

/* What the DB thread needs of the server, given once at gw_db_start
 * (server.c fills it, gw_db_deps). */
typedef struct {
    char db_path[256];       /* --db: a sqlite file or a PostgreSQL conninfo */
    gw_registry_t *registry; /* filled with the stored models at start */
    gw_pipes_t *pipelines;   /* and with the stored pipelines */
    gw_prep_pool_t *prep;    /* whose decode estimates it reads and stores */
    atomic_int *db_ready;    /* the server's flag: set while the DB is open */
} gw_db_deps_t;

/* The DB thread's settings and handles from srv's (server.c, which wires
 * the rooms). */
gw_db_deps_t gw_db_deps(gw_server_t *srv);

/* Opens the model DB, fills the registry and the pipelines from it and
 * starts the thread: 0 with *out set, or an SQ_* error with why in err. */
int gw_db_start(const gw_db_deps_t *deps, gw_db_t **out, char *err, size_t errlen);
/* Runs fn(db, arg) on the DB thread. */
void gw_db_job(gw_db_t *db, void (*fn)(mdb_t *db, void *arg), void *arg);
/* Runs every job posted, stops the thread and closes the DB; accepts
 * NULL. */
void gw_db_stop(gw_db_t *db);
/* Stores the preprocess pool's decode estimates (they are read back at
 * the next gw_db_start, and stored every 30 s meanwhile), then waits until
 * every job posted so far has run (their answers to HTTP requests are on
 * their way before the HTTP loops stop); accepts NULL. */
void gw_db_quiesce(gw_db_t *db);
/* The newest plan stored in the DB when it opened, for the planner to
 * reapply after a restart: its epoch (0: none, or db NULL), and new copies
 * of its JSON and placements (NULL when none). Read once at start and
 * never written after: any thread, while the DB is open. */
long long gw_db_last_plan(const gw_db_t *db, json_t **plan, json_t **placements);

#endif
