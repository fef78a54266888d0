/* The metrics store, its Prometheus text exposition, and squishd's families
 * and per-model statistics (see gw_metrics.h).
 *
 * A family owns a fixed array of max_series series pointers and an
 * open-addressing index over it, both allocated when it is registered:
 * writers append under the family's mutex and publish the new count with a
 * release store; the exposition writer loads the count and reads the series
 * without any lock. Values are atomics (doubles as their bit patterns,
 * updated by compare-and-swap), so a scrape never stalls a request. */
#include "gw_metrics.h"
#include "gw_slo.h"

#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

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
    int process; /* expose process_* metrics */
    double start_time_s;
    /* squishd's families (NULL in a bare store) */
    gw_metric_family_t *requests, *request_duration, *queue_duration, *preprocess_duration,
        *execute_duration, *batch_size, *batches, *drops, *worker_busy, *worker_up, *worker_rtt,
        *worker_bw, *profile_scale, *worker_restarts, *session_rate, *session_planned, *plan_epoch,
        *plan_devices, *plan_lower_bound, *advice, *models_moved, *http_requests, *uploads,
        *priority_requests, *pipeline_queries, *pipeline_duration;
    /* per-model statistics: open addressing by key, under stats_lock */
    pthread_mutex_t stats_lock;
    model_stats_t **stats;
    size_t stats_mask;
    int nstats;
};

/* ---- atomics on doubles ------------------------------------------------------ */

static double bits_to_double(uint64_t b)
{
    double d;
    memcpy(&d, &b, sizeof(d));
    return d;
}

static uint64_t double_to_bits(double d)
{
    uint64_t b;
    memcpy(&b, &d, sizeof(b));
    return b;
}

static void atomic_add_double(_Atomic uint64_t *p, double v)
{
    uint64_t old = atomic_load_explicit(p, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(p, &old, double_to_bits(bits_to_double(old) + v),
                                                  memory_order_relaxed, memory_order_relaxed)) {
    }
}

/* ---- families and series ------------------------------------------------------ */

static uint64_t hash_values(const char *const *values, int n)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (int i = 0; i < n; i++) {
        for (const unsigned char *p = (const unsigned char *)values[i]; *p; p++)
            h = (h ^ *p) * 1099511628211ull;
        h = (h ^ 0xffu) * 1099511628211ull; /* separator: ("a","b") != ("ab","") */
    }
    return h;
}

static int name_ok(const char *s)
{
    if (s == NULL || !((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || *s == '_'))
        return 0;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || *s == '_' ||
              (*s >= '0' && *s <= '9')))
            return 0;
    return 1;
}

static void family_fail(const char *name, const char *why)
{
    SQ_ERROR("bad metric family name=%s reason=\"%s\"", name ? name : "(null)", why);
    abort();
}

gw_metric_family_t *gw_metrics_family(gw_metrics_t *ms, gw_metric_type_t type, const char *name,
                                      const char *help, const char *const *labels,
                                      const double *buckets, int nbuckets, int max_series)
{
    if (!name_ok(name))
        family_fail(name, "invalid name");
    gw_metric_family_t *f = sq_xcalloc(1, sizeof(*f));
    f->type = type;
    f->name = sq_xstrdup(name);
    f->help = sq_xstrdup(help ? help : "");
    f->owner = ms;
    for (; labels != NULL && labels[f->nlabels] != NULL; f->nlabels++) {
        if (f->nlabels == GW_METRICS_MAX_LABELS || !name_ok(labels[f->nlabels]) ||
            strncmp(labels[f->nlabels], "__", 2) == 0 ||
            (type == GW_METRIC_HISTOGRAM && strcmp(labels[f->nlabels], "le") == 0))
            family_fail(name, "too many labels or an invalid label name");
        f->labels[f->nlabels] = sq_xstrdup(labels[f->nlabels]);
    }
    if (type == GW_METRIC_HISTOGRAM) {
        if (nbuckets < 1 || nbuckets > GW_METRICS_MAX_BUCKETS)
            family_fail(name, "bucket count out of range");
        for (int i = 0; i < nbuckets; i++) {
            if (!isfinite(buckets[i]) || (i > 0 && buckets[i] <= buckets[i - 1]))
                family_fail(name, "buckets must be finite and strictly increasing");
            f->buckets[i] = buckets[i];
        }
        f->nbuckets = nbuckets;
    }
    f->max_series = max_series > 0 ? max_series : DEFAULT_MAX_SERIES;
    if (f->nlabels == 0)
        f->max_series = 1;
    f->series = sq_xcalloc((size_t)f->max_series, sizeof(*f->series));
    size_t cap = 4;
    while (cap < 2 * (size_t)f->max_series)
        cap *= 2;
    f->index = sq_xmalloc(cap * sizeof(*f->index));
    memset(f->index, 0xff, cap * sizeof(*f->index));
    f->index_mask = cap - 1;
    pthread_mutex_init(&f->lock, NULL);
    pthread_mutex_lock(&ms->lock);
    int n = atomic_load(&ms->nfamilies);
    for (int i = 0; i < n; i++)
        if (strcmp(ms->families[i]->name, name) == 0)
            family_fail(name, "registered twice");
    if (n == GW_METRICS_MAX_FAMILIES)
        family_fail(name, "too many families");
    ms->families[n] = f;
    atomic_store_explicit(&ms->nfamilies, n + 1, memory_order_release);
    pthread_mutex_unlock(&ms->lock);
    if (f->nlabels == 0)
        gw_metrics_series(f, NULL);
    return f;
}

gw_metric_series_t *gw_metrics_series(gw_metric_family_t *f, const char *const *values)
{
    uint64_t h = hash_values(values, f->nlabels);
    pthread_mutex_lock(&f->lock);
    size_t slot = (size_t)h & f->index_mask;
    gw_metric_series_t *s = NULL;
    for (;; slot = (slot + 1) & f->index_mask) {
        int i = f->index[slot];
        if (i < 0)
            break;
        gw_metric_series_t *c = f->series[i];
        if (c->hash != h)
            continue;
        int same = 1;
        for (int k = 0; k < f->nlabels && same; k++)
            same = strcmp(c->values[k], values[k]) == 0;
        if (same) {
            s = c;
            break;
        }
    }
    if (s == NULL) {
        int n = atomic_load_explicit(&f->nseries, memory_order_relaxed);
        if (n == f->max_series) {
            pthread_mutex_unlock(&f->lock);
            atomic_fetch_add(&f->owner->overflows, 1);
            if (atomic_exchange(&f->owner->overflow_logged, 1) == 0)
                SQ_WARN("metric family full, label set dropped family=%s max_series=%d", f->name,
                        f->max_series);
            return NULL;
        }
        s = sq_xcalloc(1, sizeof(*s));
        s->family = f;
        s->hash = h;
        for (int k = 0; k < f->nlabels; k++)
            s->values[k] = sq_xstrdup(values[k]);
        if (f->type == GW_METRIC_HISTOGRAM)
            s->buckets = sq_xcalloc((size_t)f->nbuckets + 1, sizeof(*s->buckets));
        f->series[n] = s;
        f->index[slot] = n;
        atomic_store_explicit(&f->nseries, n + 1, memory_order_release);
    }
    pthread_mutex_unlock(&f->lock);
    return s;
}

void gw_metrics_add(gw_metric_series_t *s, double v)
{
    if (s == NULL)
        return;
    atomic_add_double(&s->value, v);
    atomic_store_explicit(&s->hidden, 0, memory_order_relaxed);
}

void gw_metrics_set(gw_metric_series_t *s, double v)
{
    if (s == NULL)
        return;
    atomic_store_explicit(&s->value, double_to_bits(v), memory_order_relaxed);
    atomic_store_explicit(&s->hidden, 0, memory_order_relaxed);
}

void gw_metrics_observe(gw_metric_series_t *s, double v)
{
    if (s == NULL || s->buckets == NULL)
        return;
    const gw_metric_family_t *f = s->family;
    int b = 0;
    while (b < f->nbuckets && !(v <= f->buckets[b]))
        b++;
    atomic_fetch_add_explicit(&s->buckets[b], 1, memory_order_relaxed);
    atomic_add_double(&s->sum, v);
}

double gw_metrics_value(const gw_metric_series_t *s)
{
    if (s == NULL)
        return 0;
    if (s->buckets != NULL) {
        uint64_t n = 0;
        for (int b = 0; b <= s->family->nbuckets; b++)
            n += atomic_load_explicit(&s->buckets[b], memory_order_relaxed);
        return (double)n;
    }
    return bits_to_double(atomic_load_explicit(&s->value, memory_order_relaxed));
}

void gw_metrics_hide_all(gw_metric_family_t *f)
{
    int n = atomic_load_explicit(&f->nseries, memory_order_acquire);
    for (int i = 0; i < n; i++)
        atomic_store_explicit(&f->series[i]->hidden, 1, memory_order_relaxed);
}

uint64_t gw_metrics_overflows(const gw_metrics_t *ms)
{
    return atomic_load(&((gw_metrics_t *)ms)->overflows);
}

/* ---- exposition ---------------------------------------------------------------- */

static void put(sq_buf_t *b, const char *s)
{
    sq_buf_put(b, s, strlen(s));
}

static void putf(sq_buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void putf(sq_buf_t *b, const char *fmt, ...)
{
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n < sizeof(tmp)) {
        sq_buf_put(b, tmp, (size_t)n);
        return;
    }
    sq_buf_reserve(b, (size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf((char *)b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

/* The shortest text that reads back as v; Prometheus spellings for the
 * non-finite values. */
static void fmt_double(char *out, size_t len, double v)
{
    if (isnan(v)) {
        snprintf(out, len, "NaN");
        return;
    }
    if (isinf(v)) {
        snprintf(out, len, v > 0 ? "+Inf" : "-Inf");
        return;
    }
    if (v == floor(v) && fabs(v) < 1e15) {
        snprintf(out, len, "%.0f", v); /* "100", not "1e+02" */
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(out, len, "%.*g", prec, v);
        if (strtod(out, NULL) == v)
            return;
    }
}

static void put_double(sq_buf_t *b, double v)
{
    char tmp[40];
    fmt_double(tmp, sizeof(tmp), v);
    put(b, tmp);
}

/* Label values: backslash, double quote and newline are escaped. */
static void put_label_value(sq_buf_t *b, const char *v)
{
    for (const char *p = v; *p; p++) {
        if (*p == '\\')
            put(b, "\\\\");
        else if (*p == '"')
            put(b, "\\\"");
        else if (*p == '\n')
            put(b, "\\n");
        else
            sq_buf_put(b, p, 1);
    }
}

/* HELP text: backslash and newline are escaped. */
static void put_help(sq_buf_t *b, const char *v)
{
    for (const char *p = v; *p; p++) {
        if (*p == '\\')
            put(b, "\\\\");
        else if (*p == '\n')
            put(b, "\\n");
        else
            sq_buf_put(b, p, 1);
    }
}

/* name{labels[,le="..."]} */
static void put_sample_name(sq_buf_t *b, const gw_metric_family_t *f, const char *suffix,
                            const gw_metric_series_t *s, const char *le)
{
    put(b, f->name);
    put(b, suffix);
    if (f->nlabels == 0 && le == NULL)
        return;
    put(b, "{");
    for (int k = 0; k < f->nlabels; k++) {
        if (k > 0)
            put(b, ",");
        put(b, f->labels[k]);
        put(b, "=\"");
        put_label_value(b, s->values[k]);
        put(b, "\"");
    }
    if (le != NULL) {
        put(b, f->nlabels > 0 ? ",le=\"" : "le=\"");
        put(b, le);
        put(b, "\"");
    }
    put(b, "}");
}

static void write_family(sq_buf_t *b, const gw_metric_family_t *f)
{
    static const char *const type_names[] = {"counter", "gauge", "histogram"};
    putf(b, "# HELP %s ", f->name);
    put_help(b, f->help);
    putf(b, "\n# TYPE %s %s\n", f->name, type_names[f->type]);
    int n = atomic_load_explicit(&((gw_metric_family_t *)f)->nseries, memory_order_acquire);
    for (int i = 0; i < n; i++) {
        const gw_metric_series_t *s = f->series[i];
        if (atomic_load_explicit(&s->hidden, memory_order_relaxed))
            continue;
        if (f->type != GW_METRIC_HISTOGRAM) {
            put_sample_name(b, f, "", s, NULL);
            put(b, " ");
            put_double(b, gw_metrics_value(s));
            put(b, "\n");
            continue;
        }
        /* Cumulative counts from one read of each bucket, so that the +Inf
         * bucket and _count agree even while observations land. */
        uint64_t cumulative = 0;
        char le[40];
        for (int k = 0; k <= f->nbuckets; k++) {
            cumulative += atomic_load_explicit(&s->buckets[k], memory_order_relaxed);
            if (k < f->nbuckets)
                fmt_double(le, sizeof(le), f->buckets[k]);
            else
                snprintf(le, sizeof(le), "+Inf");
            put_sample_name(b, f, "_bucket", s, le);
            putf(b, " %llu\n", (unsigned long long)cumulative);
        }
        put_sample_name(b, f, "_sum", s, NULL);
        put(b, " ");
        put_double(b, bits_to_double(atomic_load_explicit(&s->sum, memory_order_relaxed)));
        put(b, "\n");
        put_sample_name(b, f, "_count", s, NULL);
        putf(b, " %llu\n", (unsigned long long)cumulative);
    }
}

/* /proc/self/stat fields (1-based as in proc(5)); 0 when unreadable. */
static int proc_stat_fields(const int *want, int nwant, unsigned long long *out)
{
    char buf[1024];
    FILE *fp = fopen("/proc/self/stat", "r");
    if (fp == NULL)
        return -1;
    size_t n = fread(buf, 1, sizeof(buf) - 1, fp);
    fclose(fp);
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    if (p == NULL)
        return -1;
    p++;
    int field = 2;
    char *save = NULL;
    for (char *tok = strtok_r(p, " ", &save); tok != NULL; tok = strtok_r(NULL, " ", &save)) {
        field++;
        for (int i = 0; i < nwant; i++)
            if (want[i] == field)
                out[i] = strtoull(tok, NULL, 10);
    }
    return 0;
}

static double process_start_time(void)
{
    int want[1] = {22};
    unsigned long long start_ticks = 0;
    double btime = 0;
    char line[256];
    FILE *fp = fopen("/proc/stat", "r");
    while (fp != NULL && fgets(line, sizeof(line), fp) != NULL)
        if (strncmp(line, "btime ", 6) == 0)
            btime = strtod(line + 6, NULL);
    if (fp != NULL)
        fclose(fp);
    long hz = sysconf(_SC_CLK_TCK);
    if (btime <= 0 || hz <= 0 || proc_stat_fields(want, 1, &start_ticks) != 0)
        return sq_wall_s();
    return btime + (double)start_ticks / (double)hz;
}

static void write_process(sq_buf_t *b, const gw_metrics_t *ms)
{
    int want[2] = {14, 15};
    unsigned long long ticks[2] = {0, 0};
    long hz = sysconf(_SC_CLK_TCK);
    proc_stat_fields(want, 2, ticks);
    put(b, "# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.\n"
           "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total ");
    put_double(b, hz > 0 ? (double)(ticks[0] + ticks[1]) / (double)hz : 0);
    unsigned long long vm_pages = 0, rss_pages = 0;
    FILE *fp = fopen("/proc/self/statm", "r");
    if (fp != NULL) {
        if (fscanf(fp, "%llu %llu", &vm_pages, &rss_pages) != 2)
            vm_pages = rss_pages = 0;
        fclose(fp);
    }
    unsigned long long page = (unsigned long long)sysconf(_SC_PAGESIZE);
    putf(b,
         "\n# HELP process_resident_memory_bytes Resident memory size in bytes.\n"
         "# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes %llu\n"
         "# HELP process_virtual_memory_bytes Virtual memory size in bytes.\n"
         "# TYPE process_virtual_memory_bytes gauge\nprocess_virtual_memory_bytes %llu\n",
         rss_pages * page, vm_pages * page);
    long fds = 0;
    DIR *d = opendir("/proc/self/fd");
    if (d != NULL) {
        for (struct dirent *e; (e = readdir(d)) != NULL;)
            fds += e->d_name[0] != '.';
        closedir(d);
        fds--; /* the directory's own descriptor */
    }
    struct rlimit rl = {0, 0};
    getrlimit(RLIMIT_NOFILE, &rl);
    putf(b,
         "# HELP process_open_fds Number of open file descriptors.\n"
         "# TYPE process_open_fds gauge\nprocess_open_fds %ld\n"
         "# HELP process_max_fds Maximum number of open file descriptors.\n"
         "# TYPE process_max_fds gauge\nprocess_max_fds %llu\n",
         fds, (unsigned long long)rl.rlim_cur);
    put(b, "# HELP process_start_time_seconds Start time of the process since unix epoch in "
           "seconds.\n# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds ");
    put_double(b, ms->start_time_s);
    put(b, "\n");
}

void gw_metrics_write(gw_metrics_t *ms, sq_buf_t *out)
{
    int n = atomic_load_explicit(&ms->nfamilies, memory_order_acquire);
    for (int i = 0; i < n; i++)
        write_family(out, ms->families[i]);
    if (ms->process)
        write_process(out, ms);
}

/* ---- the store ------------------------------------------------------------------ */

gw_metrics_t *gw_metrics_store_new(void)
{
    gw_metrics_t *ms = sq_xcalloc(1, sizeof(*ms));
    pthread_mutex_init(&ms->lock, NULL);
    pthread_mutex_init(&ms->stats_lock, NULL);
    ms->start_time_s = sq_wall_s();
    return ms;
}

static void family_free(gw_metric_family_t *f)
{
    int n = atomic_load(&f->nseries);
    for (int i = 0; i < n; i++) {
        gw_metric_series_t *s = f->series[i];
        for (int k = 0; k < f->nlabels; k++)
            free(s->values[k]);
        free(s->buckets);
        free(s);
    }
    for (int k = 0; k < f->nlabels; k++)
        free(f->labels[k]);
    pthread_mutex_destroy(&f->lock);
    free(f->series);
    free(f->index);
    free(f->name);
    free(f->help);
    free(f);
}

void gw_metrics_free(gw_metrics_t *ms)
{
    if (ms == NULL)
        return;
    int n = atomic_load(&ms->nfamilies);
    for (int i = 0; i < n; i++)
        family_free(ms->families[i]);
    if (ms->stats != NULL)
        for (size_t i = 0; i <= ms->stats_mask; i++)
            free(ms->stats[i]);
    free(ms->stats);
    pthread_mutex_destroy(&ms->lock);
    pthread_mutex_destroy(&ms->stats_lock);
    free(ms);
}

/* Latency buckets (seconds): dense where SLOs live (5 ms .. 1 s). */
static const double latency_buckets_s[] = {0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025,
                                           0.03,  0.04,   0.05,  0.075,  0.1,  0.15,  0.2,  0.3,
                                           0.5,   1,      2.5,   5,      10,   30};
static const double batch_buckets[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};
#define NLAT (int)(sizeof(latency_buckets_s) / sizeof(latency_buckets_s[0]))
#define NBATCH (int)(sizeof(batch_buckets) / sizeof(batch_buckets[0]))

gw_metrics_t *gw_metrics_new(void)
{
    gw_metrics_t *ms = gw_metrics_store_new();
    ms->process = 1;
    ms->start_time_s = process_start_time();
    const char *const model_version_slo_outcome[] = {"model", "version", "slo_ms", "outcome", NULL};
    const char *const model[] = {"model", NULL};
    const char *const model_worker[] = {"model", "worker", NULL};
    const char *const model_reason[] = {"model", "reason", NULL};
    const char *const model_version_kind[] = {"model", "version", "kind", NULL};
    const char *const worker_device[] = {"worker", "device", NULL};
    const char *const model_slo[] = {"model", "slo_ms", NULL};
    const char *const route_code[] = {"route", "code", NULL};
    const char *const outcome[] = {"outcome", NULL};
    gw_metrics_t *m = ms;
    m->requests = gw_metrics_family(
        m, GW_METRIC_COUNTER, "squish_requests_total",
        "Inference requests answered, by model, version, SLO bucket (ms) and outcome: ok, late "
        "(answered after its deadline), dropped (503: deadline, overload, no worker) or error.",
        model_version_slo_outcome, NULL, 0, 8192);
    const char *const priority_outcome[] = {"priority", "outcome", NULL};
    m->priority_requests = gw_metrics_family(
        m, GW_METRIC_COUNTER, "squish_priority_requests_total",
        "Inference requests answered, by dispatch priority level (1 the highest) and outcome, as "
        "in squish_requests_total.",
        priority_outcome, NULL, 0, 0);
    const char *const pipeline_outcome[] = {"pipeline", "outcome", NULL};
    const char *const pipeline[] = {"pipeline", NULL};
    m->pipeline_queries = gw_metrics_family(
        m, GW_METRIC_COUNTER, "squish_pipeline_queries_total",
        "Pipeline queries answered, by pipeline and outcome: ok, dropped (503: a stage could not "
        "make its deadline, the whole query went) or error.",
        pipeline_outcome, NULL, 0, 0);
    m->pipeline_duration =
        gw_metrics_family(m, GW_METRIC_HISTOGRAM, "squish_pipeline_query_duration_seconds",
                          "End-to-end latency of successful pipeline queries, arrival to answer.",
                          pipeline, latency_buckets_s, NLAT, 0);
    m->request_duration =
        gw_metrics_family(m, GW_METRIC_HISTOGRAM, "squish_request_duration_seconds",
                          "End-to-end latency of successful inference requests, arrival to answer.",
                          model, latency_buckets_s, NLAT, 0);
    m->queue_duration = gw_metrics_family(
        m, GW_METRIC_HISTOGRAM, "squish_queue_duration_seconds",
        "Time successful requests waited in the dispatcher's queue (slowest item).", model,
        latency_buckets_s, NLAT, 0);
    m->preprocess_duration = gw_metrics_family(
        m, GW_METRIC_HISTOGRAM, "squish_preprocess_duration_seconds",
        "Time from arrival to the dispatcher: JPEG decode and resize (slowest item).", model,
        latency_buckets_s, NLAT, 0);
    m->execute_duration = gw_metrics_family(
        m, GW_METRIC_HISTOGRAM, "squish_execute_duration_seconds",
        "Batch execution as squishd sees it, from sending the batch to its reply, per batch.",
        model, latency_buckets_s, NLAT, 0);
    m->batch_size = gw_metrics_family(m, GW_METRIC_HISTOGRAM, "squish_batch_size",
                                      "Size of the batches run, by model and worker.", model_worker,
                                      batch_buckets, NBATCH, 4096);
    m->batches = gw_metrics_family(m, GW_METRIC_COUNTER, "squish_batches_total",
                                   "Batches answered by workers, by model and worker.",
                                   model_worker, NULL, 0, 4096);
    m->drops = gw_metrics_family(
        m, GW_METRIC_COUNTER, "squish_dispatch_drops_total",
        "Items (images, tensor rows) the dispatcher dropped because they could not meet their "
        "deadline, by model and reason.",
        model_reason, NULL, 0, 0);
    m->worker_busy =
        gw_metrics_family(m, GW_METRIC_COUNTER, "squish_worker_busy_seconds_total",
                          "Time workers spent running batches; its rate is the busy fraction.",
                          worker_device, NULL, 0, 0);
    m->worker_up = gw_metrics_family(m, GW_METRIC_GAUGE, "squish_worker_up",
                                     "1 while a worker is connected and past its handshake.",
                                     worker_device, NULL, 0, 0);
    m->worker_rtt = gw_metrics_family(
        m, GW_METRIC_GAUGE, "squish_worker_rtt_seconds",
        "A remote worker's network round trip (the least of its last heartbeats).", worker_device,
        NULL, 0, 0);
    m->worker_bw = gw_metrics_family(
        m, GW_METRIC_GAUGE, "squish_worker_link_bytes_per_second",
        "A remote worker's link bandwidth, measured by a probe at its handshake and every 30 s.",
        worker_device, NULL, 0, 0);
    m->profile_scale = gw_metrics_family(
        m, GW_METRIC_GAUGE, "squish_profile_scale",
        "Measured batch latencies over the stored profile, by model, once they drifted beyond "
        "25% (1 when back within it): the dispatcher and planner use the profile times this.",
        model_version_kind, NULL, 0, 0);
    m->worker_restarts =
        gw_metrics_family(m, GW_METRIC_COUNTER, "squish_worker_restarts_total",
                          "Restarts of supervised workers after they died or stopped answering.",
                          worker_device, NULL, 0, 0);
    m->session_rate = gw_metrics_family(m, GW_METRIC_GAUGE, "squish_session_rate_rps",
                                        "The planner's estimate of a session's request rate.",
                                        model_slo, NULL, 0, 8192);
    m->session_planned =
        gw_metrics_family(m, GW_METRIC_GAUGE, "squish_session_planned_throughput_rps",
                          "Throughput the current plan gives a session.", model_slo, NULL, 0, 8192);
    m->plan_epoch = gw_metrics_family(m, GW_METRIC_GAUGE, "squish_plan_epoch",
                                      "Number of the current plan epoch.", NULL, NULL, 0, 0);
    m->plan_devices = gw_metrics_family(m, GW_METRIC_GAUGE, "squish_plan_devices",
                                        "Devices the current plan uses.", NULL, NULL, 0, 0);
    m->plan_lower_bound = gw_metrics_family(
        m, GW_METRIC_GAUGE, "squish_plan_devices_lower_bound",
        "Lower bound on the devices the sessions need (sum of rate over best throughput).", NULL,
        NULL, 0, 0);
    m->advice = gw_metrics_family(m, GW_METRIC_GAUGE, "squish_autoscale_advice_devices",
                                  "Autoscaling advice: devices to add (> 0) or release (< 0).",
                                  NULL, NULL, 0, 0);
    m->models_moved = gw_metrics_family(
        m, GW_METRIC_COUNTER, "squish_plan_models_moved_total",
        "Model placements new epochs made (model loads on devices).", NULL, NULL, 0, 0);
    m->http_requests =
        gw_metrics_family(m, GW_METRIC_COUNTER, "squish_http_requests_total",
                          "HTTP responses, by route and status code.", route_code, NULL, 0, 0);
    m->uploads = gw_metrics_family(
        m, GW_METRIC_COUNTER, "squish_uploads_total",
        "Model uploads, by outcome: created, or the error code that rejected them.", outcome, NULL,
        0, 0);
    /* Not yet planned: no value rather than a misleading 0. */
    gw_metrics_hide_all(m->plan_epoch);
    gw_metrics_hide_all(m->plan_devices);
    gw_metrics_hide_all(m->plan_lower_bound);
    gw_metrics_hide_all(m->advice);
    return ms;
}

/* ---- per-model statistics --------------------------------------------------------- */

static uint64_t key_hash(int64_t key)
{
    uint64_t h = (uint64_t)key * 0x9e3779b97f4a7c15ull;
    return h ^ (h >> 29);
}

/* The statistics of model key, created on first use; NULL past
 * MAX_MODEL_STATS entries. */
static model_stats_t *stats_of(gw_metrics_t *ms, int64_t key, int create)
{
    pthread_mutex_lock(&ms->stats_lock);
    model_stats_t *st = NULL;
    if (ms->stats != NULL) {
        for (size_t i = key_hash(key) & ms->stats_mask; ms->stats[i] != NULL;
             i = (i + 1) & ms->stats_mask) {
            if (ms->stats[i]->key == key) {
                st = ms->stats[i];
                break;
            }
        }
    }
    if (st == NULL && create && ms->nstats < MAX_MODEL_STATS) {
        if (ms->stats == NULL || (size_t)(ms->nstats + 1) * 2 > ms->stats_mask + 1) {
            size_t cap = ms->stats ? 2 * (ms->stats_mask + 1) : 16;
            model_stats_t **t = sq_xcalloc(cap, sizeof(*t));
            for (size_t i = 0; ms->stats != NULL && i <= ms->stats_mask; i++) {
                if (ms->stats[i] == NULL)
                    continue;
                size_t j = key_hash(ms->stats[i]->key) & (cap - 1);
                while (t[j] != NULL)
                    j = (j + 1) & (cap - 1);
                t[j] = ms->stats[i];
            }
            free(ms->stats);
            ms->stats = t;
            ms->stats_mask = cap - 1;
        }
        st = sq_xcalloc(1, sizeof(*st));
        st->key = key;
        size_t j = key_hash(key) & ms->stats_mask;
        while (ms->stats[j] != NULL)
            j = (j + 1) & ms->stats_mask;
        ms->stats[j] = st;
        ms->nstats++;
    }
    pthread_mutex_unlock(&ms->stats_lock);
    return st;
}

static void duration_add(duration_t *d, double seconds)
{
    atomic_fetch_add_explicit(&d->count, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&d->ns, seconds > 0 ? (uint64_t)(seconds * 1e9) : 0,
                              memory_order_relaxed);
}

static json_t *duration_json(const atomic_uint_fast64_t *count, const atomic_uint_fast64_t *ns)
{
    return json_pack("{s:I, s:I}", "count", (json_int_t)atomic_load(count), "ns",
                     (json_int_t)atomic_load(ns));
}

json_t *gw_metrics_model_stats(gw_metrics_t *ms, const gw_model_t *m)
{
    model_stats_t *st = stats_of(ms, m->key, 0);
    static model_stats_t zero; /* read-only: every counter 0 */
    if (st == NULL)
        st = &zero;
    char version[16];
    snprintf(version, sizeof(version), "%d", m->version);
    json_t *batches = json_array();
    for (int b = 1; b <= GW_METRICS_MAX_BATCH; b++) {
        const batch_stat_t *bs = &st->batch[b];
        if (atomic_load(&bs->count) == 0)
            continue;
        json_array_append_new(batches,
                              json_pack("{s:i, s:o, s:o, s:o}", "batch_size", b, "compute_input",
                                        duration_json(&bs->count, &bs->input_ns), "compute_infer",
                                        duration_json(&bs->count, &bs->infer_ns), "compute_output",
                                        duration_json(&bs->count, &bs->output_ns)));
    }
#define DUR(field) duration_json(&st->field.count, &st->field.ns)
    return json_pack("{s:s, s:s, s:I, s:I, s:I, s:{s:o, s:o, s:o, s:o, s:o, s:o}, s:o}", "name",
                     m->name, "version", version, "last_inference",
                     (json_int_t)atomic_load(&st->last_inference_ms), "inference_count",
                     (json_int_t)atomic_load(&st->inference_count), "execution_count",
                     (json_int_t)atomic_load(&st->execution_count), "inference_stats", "success",
                     DUR(success), "fail", DUR(fail), "queue", DUR(queue), "compute_input",
                     DUR(compute_input), "compute_infer", DUR(compute_infer), "compute_output",
                     DUR(compute_output), "batch_stats", batches);
#undef DUR
}

/* ---- squishd's recorders ------------------------------------------------------------ */

void gw_metrics_http(gw_metrics_t *ms, const char *route, int status)
{
    if (ms == NULL || ms->http_requests == NULL)
        return;
    char code[16];
    snprintf(code, sizeof(code), "%d", status);
    const char *v[] = {route, code};
    gw_metrics_add(gw_metrics_series(ms->http_requests, v), 1);
}

const char *gw_metrics_outcome(const gw_metrics_request_t *r)
{
    if (r->err != 0)
        return r->status == 503 ? "dropped" : "error";
    return r->total_s * 1000.0 > r->slo_ms ? "late" : "ok";
}

static void observe_model(gw_metric_family_t *f, const char *model, double v)
{
    const char *vals[] = {model};
    gw_metrics_observe(gw_metrics_series(f, vals), v);
}

void gw_metrics_request(gw_metrics_t *ms, const gw_model_t *m, const gw_metrics_request_t *r)
{
    if (ms == NULL || ms->requests == NULL)
        return;
    char version[16], slo[40];
    snprintf(version, sizeof(version), "%d", m->version);
    fmt_double(slo, sizeof(slo), gw_slo_bucket_ms(r->slo_ms));
    const char *outcome = gw_metrics_outcome(r);
    const char *v[] = {m->name, version, slo, outcome};
    gw_metrics_add(gw_metrics_series(ms->requests, v), 1);
    if (r->priority > 0) {
        char level[16];
        snprintf(level, sizeof(level), "%d", r->priority);
        const char *pv[] = {level, outcome};
        gw_metrics_add(gw_metrics_series(ms->priority_requests, pv), 1);
    }
    model_stats_t *st = stats_of(ms, m->key, 1);
    if (r->err != 0) {
        if (st != NULL)
            duration_add(&st->fail, r->total_s);
        return;
    }
    observe_model(ms->request_duration, m->name, r->total_s);
    observe_model(ms->queue_duration, m->name, r->queue_s);
    observe_model(ms->preprocess_duration, m->name, r->preprocess_s);
    if (st == NULL)
        return;
    duration_add(&st->success, r->total_s);
    duration_add(&st->queue, r->queue_s);
    duration_add(&st->compute_input, r->preprocess_s);
    duration_add(&st->compute_infer, r->execute_s);
    duration_add(&st->compute_output, r->output_s);
    atomic_fetch_add(&st->inference_count, (uint64_t)(r->items > 0 ? r->items : 0));
    atomic_store(&st->last_inference_ms, (uint64_t)(sq_wall_s() * 1000.0));
}

void gw_metrics_batch(gw_metrics_t *ms, const gw_model_t *m, int worker, const char *device,
                      int size, int64_t roundtrip_us, const sq_batch_done_t *done)
{
    if (ms == NULL || ms->batches == NULL)
        return;
    char w[16];
    snprintf(w, sizeof(w), "%d", worker);
    double roundtrip_s = roundtrip_us > 0 ? (double)roundtrip_us / 1e6 : 0;
    const char *mw[] = {m->name, w};
    gw_metrics_add(gw_metrics_series(ms->batches, mw), 1);
    gw_metrics_observe(gw_metrics_series(ms->batch_size, mw), size);
    observe_model(ms->execute_duration, m->name, roundtrip_s);
    const char *wd[] = {w, device};
    gw_metrics_add(gw_metrics_series(ms->worker_busy, wd), roundtrip_s);
    model_stats_t *st = stats_of(ms, m->key, 1);
    if (st == NULL || done->code != 0)
        return;
    atomic_fetch_add(&st->execution_count, 1);
    if (size < 1 || size > GW_METRICS_MAX_BATCH)
        return;
    /* The worker's receipt-to-reply time splits into gathering the inputs
     * (input) and the backend (infer); the rest of the round trip is
     * handing the outputs back (output). */
    uint64_t total_ns = done->total_ns > done->exec_ns ? done->total_ns : done->exec_ns;
    uint64_t rt_ns = roundtrip_us > 0 ? (uint64_t)roundtrip_us * 1000 : 0;
    batch_stat_t *bs = &st->batch[size];
    atomic_fetch_add(&bs->count, 1);
    atomic_fetch_add(&bs->input_ns, total_ns - done->exec_ns);
    atomic_fetch_add(&bs->infer_ns, done->exec_ns);
    atomic_fetch_add(&bs->output_ns, rt_ns > total_ns ? rt_ns - total_ns : 0);
}

void gw_metrics_pipeline_query(gw_metrics_t *ms, const char *pipeline, const char *outcome,
                               double seconds)
{
    if (ms == NULL || ms->pipeline_queries == NULL)
        return;
    const char *v[] = {pipeline, outcome};
    gw_metrics_add(gw_metrics_series(ms->pipeline_queries, v), 1);
    if (strcmp(outcome, "ok") == 0)
        gw_metrics_observe(gw_metrics_series(ms->pipeline_duration, v), seconds);
}

void gw_metrics_drop(gw_metrics_t *ms, const gw_model_t *m, int reason)
{
    if (ms == NULL || ms->drops == NULL)
        return;
    const char *v[] = {m->name, sq_err_name(reason)};
    gw_metrics_add(gw_metrics_series(ms->drops, v), 1);
}

void gw_metrics_worker_up(gw_metrics_t *ms, int worker, const char *device, int up)
{
    if (ms == NULL || ms->worker_up == NULL)
        return;
    char w[16];
    snprintf(w, sizeof(w), "%d", worker);
    const char *v[] = {w, device};
    gw_metrics_set(gw_metrics_series(ms->worker_up, v), up ? 1 : 0);
    /* The busy counter exists from the start, at 0. */
    gw_metrics_add(gw_metrics_series(ms->worker_busy, v), 0);
}

void gw_metrics_worker_restart(gw_metrics_t *ms, int worker, const char *device)
{
    if (ms == NULL || ms->worker_restarts == NULL)
        return;
    char w[16];
    snprintf(w, sizeof(w), "%d", worker);
    const char *v[] = {w, device};
    gw_metrics_add(gw_metrics_series(ms->worker_restarts, v), 1);
}

void gw_metrics_worker_link(gw_metrics_t *ms, int worker, const char *device, int64_t rtt_us,
                            double bytes_per_us)
{
    if (ms == NULL || ms->worker_rtt == NULL)
        return;
    char w[16];
    snprintf(w, sizeof(w), "%d", worker);
    const char *v[] = {w, device};
    gw_metrics_set(gw_metrics_series(ms->worker_rtt, v), (double)rtt_us / 1e6);
    gw_metrics_set(gw_metrics_series(ms->worker_bw, v), bytes_per_us * 1e6);
}

void gw_metrics_profile_scale(gw_metrics_t *ms, const gw_model_t *m, int kind, double scale)
{
    if (ms == NULL || ms->profile_scale == NULL)
        return;
    char ver[16];
    snprintf(ver, sizeof(ver), "%d", m->version);
    const char *v[] = {m->name, ver, sq_dev_kind_name((sq_dev_kind_t)kind)};
    gw_metrics_set(gw_metrics_series(ms->profile_scale, v), scale);
}

void gw_metrics_upload(gw_metrics_t *ms, int err)
{
    if (ms == NULL || ms->uploads == NULL)
        return;
    const char *v[] = {err == 0 ? "created" : sq_err_name(err)};
    gw_metrics_add(gw_metrics_series(ms->uploads, v), 1);
}

void gw_metrics_plan(gw_metrics_t *ms, const gw_metrics_plan_t *p)
{
    if (ms == NULL || ms->plan_epoch == NULL)
        return;
    gw_metrics_set(gw_metrics_series(ms->plan_epoch, NULL), (double)p->epoch);
    gw_metrics_set(gw_metrics_series(ms->plan_devices, NULL), p->devices);
    gw_metrics_set(gw_metrics_series(ms->plan_lower_bound, NULL), p->lower_bound_devices);
    gw_metrics_set(gw_metrics_series(ms->advice, NULL), p->advice_devices);
    if (p->models_moved > 0)
        gw_metrics_add(gw_metrics_series(ms->models_moved, NULL), p->models_moved);
}

void gw_metrics_sessions(gw_metrics_t *ms, const gw_metrics_session_t *s, int n)
{
    if (ms == NULL || ms->session_rate == NULL)
        return;
    gw_metrics_hide_all(ms->session_rate);
    gw_metrics_hide_all(ms->session_planned);
    for (int i = 0; i < n; i++) {
        char slo[40];
        fmt_double(slo, sizeof(slo), gw_slo_bucket_ms(s[i].slo_ms));
        const char *v[] = {s[i].model->name, slo};
        gw_metrics_set(gw_metrics_series(ms->session_rate, v), s[i].rate_rps);
        gw_metrics_set(gw_metrics_series(ms->session_planned, v), s[i].planned_rps);
    }
}
