/* The frames between a frontend and its dispatcher that tell it what to
 * serve (FE_CATALOG, FE_STATE) and that tell the dispatcher what the
 * frontend measured (FE_METRICS), as typed messages: a struct per frame,
 * encoded with common/'s buffer helpers as common/msgs.c encodes the
 * worker frames (little-endian integers, u32-length strings), and decoded
 * with every length checked: a malformed frame is SQ_PROTOCOL, never an
 * overread. The other frontend frames (FE_HELLO, FE_ITEMS, FE_ASSIGN, ...)
 * are in common/sq_ipc.h.
 *
 * Documents that another room defines and parses travel as they are, as
 * opaque bytes (gw_fe_doc_t): a model's record (the catalog's, which the
 * model routes serve as stored), a pipeline's spec (as it was posted), a
 * model's statistics and a pipeline's report (the metrics' and the
 * catalog's shapes). Everything the link itself reads is typed.
 *
 * Decoding: the decoded struct's documents point into the frame's payload
 * (valid while it is); its arrays are allocated, sized only after the
 * payload was seen to hold that many elements, and released by its
 * *_dispose (which accepts a zeroed struct, and runs on failure too). */
#ifndef GW_CODEC_FE_H
#define GW_CODEC_FE_H

#include <sq.h>
#include <sq_ipc.h>

#include <stdint.h>

/* The frontend frames' version, with the worker protocol's: FE_HELLO's
 * version (GW_FE_HELLO_VERSION) is both, and a dispatcher refuses a
 * frontend whose version differs. 2: these typed frames (1 was JSON). */
#define GW_FE_VERSION 2
#define GW_FE_HELLO_VERSION (((uint32_t)GW_FE_VERSION << 16) | (uint32_t)SQ_IPC_VERSION)

/* A pipeline's stages (the catalog's GW_PIPE_MAX_STAGES: front/ asserts
 * they are the same). */
#define GW_FE_MAX_STAGES 8
/* A profile's table rows (the planner's PL_MAX_BATCH). */
#define GW_FE_MAX_PROFILE_ROWS 1024
/* FE_STATE's why (the dispatcher's readiness reason). */
#define GW_FE_WHY_MAX 256

/* Bytes of a document another room parses (not NUL-terminated). */
typedef struct {
    const char *p;
    uint32_t len;
} gw_fe_doc_t;

/* ---- FE_CATALOG: the models -------------------------------------------- */

typedef struct {
    int64_t key;        /* the model's id; its record's "id" */
    gw_fe_doc_t record; /* its record (JSON), as the catalog keeps it */
} gw_fe_model_t;

typedef struct {
    uint32_t n;
    gw_fe_model_t *models;
} gw_fe_catalog_t;

void gw_fe_catalog_encode(sq_buf_t *b, const gw_fe_catalog_t *m);
int gw_fe_catalog_decode(const sq_frame_t *f, gw_fe_catalog_t *m);
void gw_fe_catalog_dispose(gw_fe_catalog_t *m);

/* ---- FE_STATE: readiness, the fleet, pipelines, live profiles ---------- */

/* A pipeline with the split the dispatcher made for it. */
typedef struct {
    gw_fe_doc_t spec; /* its spec (JSON), as posted */
    uint8_t unloaded;
    uint32_t nstages;
    double budget_ms[GW_FE_MAX_STAGES]; /* each stage's budget */
    double cum_ms[GW_FE_MAX_STAGES];    /* each stage's deadline from the query's start */
} gw_fe_pipe_t;

typedef struct {
    int32_t batch;
    double mean_us, std_us;
} gw_fe_profile_row_t;

/* The profile the dispatcher plans model key on kind with, corrected by
 * what its batches took (pl_profile_t's fields): a frontend's least
 * latency is this one's. */
typedef struct {
    int64_t key;
    uint8_t kind; /* sq_dev_kind_t */
    uint8_t linear;
    double alpha_us, beta_us;
    int32_t max_batch;
    double memory_bytes, memory_per_item_bytes;
    uint32_t nrows; /* table form: 1..GW_FE_MAX_PROFILE_ROWS; linear: 0 */
    gw_fe_profile_row_t *rows;
} gw_fe_live_t;

typedef struct {
    char why[GW_FE_WHY_MAX]; /* "" when ready */
    int32_t workers_up;
    uint8_t db_ready, stopping;
    int32_t up[SQ_DEV_KIND_COUNT], coming[SQ_DEV_KIND_COUNT];
    /* when the first coming worker of each kind should be up, from when it
     * was sent; -1 unknown */
    int64_t back_in_us[SQ_DEV_KIND_COUNT];
    uint32_t nheld, ngone;
    int64_t *held; /* the models a worker up holds */
    int64_t *gone; /* the models on their way out */
    uint32_t npipes;
    gw_fe_pipe_t *pipes;
    uint32_t nlive;
    gw_fe_live_t *live;
} gw_fe_state_t;

void gw_fe_state_encode(sq_buf_t *b, const gw_fe_state_t *m);
int gw_fe_state_decode(const sq_frame_t *f, gw_fe_state_t *m);
void gw_fe_state_dispose(gw_fe_state_t *m);

/* ---- FE_METRICS: what a frontend measured ------------------------------ */

typedef struct {
    char name[128];    /* the model's name */
    char version[32];  /* the model's version (the statistics' "version") */
    gw_fe_doc_t stats; /* the model's statistics (JSON) */
} gw_fe_model_stats_t;

typedef struct {
    char name[SQ_MAX_PIPELINE_NAME];
    gw_fe_doc_t report; /* what it measured of the pipeline's queries (JSON) */
} gw_fe_pipe_report_t;

typedef struct {
    gw_fe_doc_t text; /* its metrics' exposition text */
    uint32_t nstats;
    gw_fe_model_stats_t *stats;
    uint32_t nreports;
    gw_fe_pipe_report_t *reports;
} gw_fe_metrics_t;

void gw_fe_metrics_encode(sq_buf_t *b, const gw_fe_metrics_t *m);
int gw_fe_metrics_decode(const sq_frame_t *f, gw_fe_metrics_t *m);
void gw_fe_metrics_dispose(gw_fe_metrics_t *m);

#endif
