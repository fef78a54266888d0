/* Inside metrics/: the store's records, shared by the store (store.c) and
 * squishd's families and statistics (squishd.c). */
#ifndef GW_METRICS_INT_H
#define GW_METRICS_INT_H

#include "gw_metrics.h"

#include <sq_map.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#define DEFAULT_MAX_SERIES 1024
#define MAX_MODEL_STATS 4096

struct gw_metric_series {
    gw_metric_family_t *family;
    char *values[GW_METRICS_MAX_LABELS];
    uint64_t hash;
    _Atomic uint64_t value;        /* double bits: counter, gauge */
    _Atomic uint64_t sum;          /* double bits: histogram sum */
    atomic_uint_fast64_t *buckets; /* histogram: nbuckets + 1 (+Inf), not cumulative */
    atomic_int hidden;
};

struct gw_metric_family {
    gw_metric_type_t type;
    char *name, *help;
    int nlabels;
    char *labels[GW_METRICS_MAX_LABELS];
    double buckets[GW_METRICS_MAX_BUCKETS];
    int nbuckets;
    int max_series;
    gw_metrics_t *owner;
    pthread_mutex_t lock;        /* appends and the index */
    gw_metric_series_t **series; /* max_series slots */
    atomic_int nseries;          /* published with release */
    int *index;                  /* series numbers, -1 empty; index_mask + 1 slots */
    size_t index_mask;
};

/* Triton statistics of one model version (by registry key). */
typedef struct {
    atomic_uint_fast64_t count, ns;
} duration_t;

typedef struct {
    atomic_uint_fast64_t count, input_ns, infer_ns, output_ns;
} batch_stat_t;

typedef struct {
    int64_t key;
    atomic_uint_fast64_t last_inference_ms, inference_count, execution_count;
    duration_t success, fail, queue, compute_input, compute_infer, compute_output;
    batch_stat_t batch[GW_METRICS_MAX_BATCH + 1];
} model_stats_t;

struct gw_metrics {
    pthread_mutex_t lock; /* family registration */
    gw_metric_family_t *families[GW_METRICS_MAX_FAMILIES];
    atomic_int nfamilies;
    atomic_uint_fast64_t overflows;
    atomic_int overflow_logged;
    int process; /* expose process_* metrics (and the GPUs', nvml.c) */
    /* bit i: a worker on this host serves cuda:i (gw_metrics_worker_up) */
    atomic_uint_fast64_t local_cuda;
    double start_time_s;
    /* squishd's families (NULL in a bare store) */
    gw_metric_family_t *requests, *request_duration, *queue_duration, *preprocess_duration,
        *execute_duration, *batch_size, *batches, *drops, *worker_busy, *worker_up, *worker_rtt,
        *worker_bw, *profile_scale, *worker_restarts, *session_rate, *session_planned, *plan_epoch,
        *plan_devices, *plan_lower_bound, *advice, *models_moved, *http_requests, *uploads,
        *priority_requests, *pipeline_queries, *pipeline_duration, *withdrawn;
    /* per-model statistics, under stats_lock: stats[stats_ix(key)] */
    pthread_mutex_t stats_lock;
    model_stats_t **stats;
    int nstats, stats_cap;
    sq_map_t stats_ix;
};

/* Exposes the process_* families (CPU seconds, resident memory, open files,
 * start time) with the store's own. */
void gw__metrics_expose_process(gw_metrics_t *ms);

/* v as the exposition writes it, shortest round-trip ("100", "0.25",
 * "+Inf"), also for label values such as an SLO bucket. */
void gw__metrics_fmt_double(char *out, size_t len, double v);

#endif
