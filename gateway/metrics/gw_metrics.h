#ifndef GW_METRICS_H
#define GW_METRICS_H

#include "gw_catalog.h"

#include <jansson.h>
#include <sq.h>
#include <stdint.h>

/* Metrics: a small thread-safe store (counters, gauges, histograms with
 * fixed buckets, bounded label sets), its Prometheus text exposition
 * (format 0.0.4), and squishd's own families and per-model statistics
 * (Triton's statistics extension).
 *
 * Hot paths (one call per request or per batch, from HTTP, preprocess and
 * dispatch threads) take one family mutex for an O(1) hash lookup of the
 * label set, then update atomics; series are never freed before the store,
 * so the exposition writer reads them without holding any lock while it
 * formats. Counters live here, in squishd, so they never go backwards when a
 * worker restarts.
 *
 * Cardinality is bounded by construction: a family refuses new label sets
 * past its max_series; the recorders below take model label values from
 * registry entries (gw_model_t), never from request URLs; SLO label values
 * are the dispatcher's buckets (gw_slo_bucket_ms); worker labels are worker
 * ids and device names. */

#define GW_METRICS_MAX_LABELS 4
#define GW_METRICS_MAX_FAMILIES 64
#define GW_METRICS_MAX_BUCKETS 32
/* Per-batch-size statistics are kept for batches up to this size. */
#define GW_METRICS_MAX_BATCH SQ_MAX_BATCH_ITEMS

typedef enum { GW_METRIC_COUNTER, GW_METRIC_GAUGE, GW_METRIC_HISTOGRAM } gw_metric_type_t;

typedef struct gw_metrics gw_metrics_t;
typedef struct gw_metric_family gw_metric_family_t;
typedef struct gw_metric_series gw_metric_series_t;

/* ---- the generic store ----------------------------------------------------- */

/* An empty store: no families, no process metrics. Free with
 * gw_metrics_free. */
gw_metrics_t *gw_metrics_store_new(void);
/* squishd's store: every squish_* family below plus process_* metrics read
 * from /proc/self at each exposition. */
gw_metrics_t *gw_metrics_new(void);
/* Accepts NULL. */
void gw_metrics_free(gw_metrics_t *ms);

/* Registers a family (setup time, any thread). labels: NULL-terminated label
 * names (NULL for none, at most GW_METRICS_MAX_LABELS); buckets: the
 * histogram's upper bounds, strictly increasing, +Inf implied (at most
 * GW_METRICS_MAX_BUCKETS); max_series bounds the label sets (0: 1024).
 * A family without labels has its one series from the start. Names and help
 * are copied. Aborts on a bad definition (a bug). */
gw_metric_family_t *gw_metrics_family(gw_metrics_t *ms, gw_metric_type_t type, const char *name,
                                      const char *help, const char *const *labels,
                                      const double *buckets, int nbuckets, int max_series);
/* The series of a label set (values in the family's label order; copied),
 * created on first use. NULL when the family already holds max_series
 * label sets: the observation is dropped (and counted, see
 * gw_metrics_overflows). Any thread. */
gw_metric_series_t *gw_metrics_series(gw_metric_family_t *f, const char *const *values);
/* Counter: adds v (>= 0). Gauge: adds v (any sign). NULL s is a no-op. */
void gw_metrics_add(gw_metric_series_t *s, double v);
/* Gauge: sets v. NULL s is a no-op. */
void gw_metrics_set(gw_metric_series_t *s, double v);
/* Histogram: counts v in the first bucket whose bound is >= v, adds it to
 * the sum. NULL s is a no-op. */
void gw_metrics_observe(gw_metric_series_t *s, double v);
/* Counter or gauge value; a histogram's observation count. */
double gw_metrics_value(const gw_metric_series_t *s);
/* Hides every series of a gauge family until it is set again: for label
 * sets that stop existing (sessions of a replaced plan). */
void gw_metrics_hide_all(gw_metric_family_t *f);
/* Label sets refused because a family was full, in all. */
uint64_t gw_metrics_overflows(const gw_metrics_t *ms);

/* Appends the Prometheus text exposition (format 0.0.4) of every family:
 * "# HELP" and "# TYPE" for each, label values escaped (backslash, double
 * quote, newline), histograms as cumulative _bucket{le=...} lines ending
 * with le="+Inf", then _sum and _count. The writer holds no lock while it
 * formats. */
void gw_metrics_write(gw_metrics_t *ms, sq_buf_t *out);
/* Triton's nv_gpu_* series for each GPU a cuda worker on this host serves
 * (gw_metrics_worker_up's cuda:N), read from NVML at the call (nvml.c);
 * nothing where NVML is absent. */
void gw_metrics_write_gpus(gw_metrics_t *ms, sq_buf_t *out);
#define GW_METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

/* A cluster's one view (merge.c): the exposition `own` with n others (each
 * frontend's, as it last sent it) folded in, every sample of others[i]
 * labelled frontend="names[i]" (NULL texts are skipped). Each family comes
 * once, its HELP and TYPE from the first text that has it, its samples
 * from every text together, as the format wants. */
void gw_metrics_merge(sq_buf_t *out, const char *own, const char *const *others,
                      const char *const *names, int n);
/* Adds a frontend's statistics of a model (gw_metrics_model_stats's shape)
 * into `into`: counts and times summed, batch_stats by batch size, the
 * later last_inference. */
void gw_metrics_stats_add(json_t *into, const json_t *more);

/* ---- squishd's recorders ---------------------------------------------------- */

/* One HTTP response: the route's name (static string from the route table,
 * or "not_found" / "method_not_allowed") and its status. */
void gw_metrics_http(gw_metrics_t *ms, const char *route, int status);

/* One inference request, when it is answered. */
typedef struct {
    int status;     /* HTTP status of the answer */
    int err;        /* 0, or the SQ_* error it was answered with */
    double slo_ms;  /* the request's SLO (labelled by its dispatcher bucket; 0: "none") */
    int priority;   /* its dispatch priority level; 0: none yet (not counted by level) */
    int items;      /* images or tensor rows */
    double total_s; /* arrival to answer */
    /* When err == 0: the slowest item's share of each stage. */
    double preprocess_s; /* arrival to handed to the dispatcher (decode, resize) */
    double queue_s;      /* in the dispatcher's queue */
    double execute_s;    /* batch sent to its reply */
    double output_s;     /* last item done to answer (copy out, top-k, encode) */
} gw_metrics_request_t;

/* Outcome: ok, late (answered after its deadline: total > SLO), dropped
 * (answered 503: deadline, overload, no worker) or error. Feeds
 * squish_requests_total, the duration histograms and the model's
 * statistics. */
void gw_metrics_request(gw_metrics_t *ms, const gw_model_t *m, const gw_metrics_request_t *r);
const char *gw_metrics_outcome(const gw_metrics_request_t *r);

/* One batch answered by a worker: size, the round trip seen by squishd and
 * the worker's own times (done: its BATCH_DONE). Feeds the batch size
 * histogram, batches, execute time, the worker's busy seconds and the
 * model's per-batch-size statistics. */
void gw_metrics_batch(gw_metrics_t *ms, const gw_model_t *m, int worker, const char *device,
                      int size, int64_t roundtrip_us, const sq_batch_done_t *done);
/* An item the dispatcher dropped (reason: SQ_DEADLINE, SQ_OVERLOAD...). */
void gw_metrics_drop(gw_metrics_t *ms, const gw_model_t *m, int reason);
/* An item withdrawn before it ran: its request (or pipeline query) failed
 * for another item; why: "request_failed". */
void gw_metrics_withdrawn(gw_metrics_t *ms, const gw_model_t *m, const char *why);
/* A pipeline query answered: outcome "ok", "dropped" or "error"; seconds
 * from arrival (observed for "ok"). */
void gw_metrics_pipeline_query(gw_metrics_t *ms, const char *pipeline, const char *outcome,
                               double seconds);

/* Workers: up (1) or down (0); a restart scheduled for a supervised slot. */
void gw_metrics_worker_up(gw_metrics_t *ms, int worker, const char *device, int up);
void gw_metrics_worker_restart(gw_metrics_t *ms, int worker, const char *device);
/* A remote worker's measured link: round trip and bandwidth. */
void gw_metrics_worker_link(gw_metrics_t *ms, int worker, const char *device, int64_t rtt_us,
                            double bytes_per_us);

/* A model's live profile correction (measured / profiled latency). */
void gw_metrics_profile_scale(gw_metrics_t *ms, const gw_model_t *m, int kind, double scale);

/* One model upload finished: 0 (created) or the SQ_* error that rejected it. */
void gw_metrics_upload(gw_metrics_t *ms, int err);

/* The planner's decisions (from the planner thread, once per epoch). */
typedef struct {
    long long epoch;
    int devices;
    double lower_bound_devices;
    double advice_devices; /* signed: more (> 0) or fewer (< 0) devices */
    int models_moved;      /* model loads this epoch caused */
} gw_metrics_plan_t;

typedef struct {
    const char *model; /* its name */
    double slo_ms;
    double rate_rps;    /* the planner's estimate */
    double planned_rps; /* what the plan serves */
} gw_metrics_session_t;

void gw_metrics_plan(gw_metrics_t *ms, const gw_metrics_plan_t *p);
/* Replaces the set of sessions shown (sessions no longer listed vanish). */
void gw_metrics_sessions(gw_metrics_t *ms, const gw_metrics_session_t *s, int n);

/* Triton's statistics of one model version: {"name", "version",
 * "last_inference", "inference_count", "execution_count", "inference_stats":
 * {"success", "fail", "queue", "compute_input", "compute_infer",
 * "compute_output", "cache_hit", "cache_miss"}, "response_stats": {},
 * "batch_stats": [{"batch_size", "compute_input", "compute_infer",
 * "compute_output"}], "memory_usage": []}, durations as {"count", "ns"}.
 * Zeros for a model without traffic. */
json_t *gw_metrics_model_stats(gw_metrics_t *ms, const gw_model_t *m);
/* Adds to a model's statistics (one of the above, or a pipeline's) the
 * members Triton sends that squish has nothing for: inference_stats'
 * cache_hit and cache_miss as {"count": 0, "ns": 0} (there is no response
 * cache), "response_stats": {} (Triton fills it only for the backends that
 * report per-response statistics) and "memory_usage": [] (squish
 * measures no model's memory on load). perf_analyzer reads the cache
 * counters without looking first. */
void gw_metrics_stats_triton_rest(json_t *stats);

/* ---- glue for squishd's request paths (metrics_api.c) ----------------------- */

struct gw_infer;
struct gw_api_ctx;
/* An inference request is being answered (HTTP loop, in its respond
 * callback): records its outcome and stage times and logs one debug line. */
void gw_metrics_infer_answered(struct gw_infer *req);
/* A request for model m refused before it started (not ready, no worker),
 * counted in the metrics of api, the API that refused it. */
void gw_metrics_infer_rejected(const struct gw_api_ctx *api, const gw_model_t *m, int err);

#endif
