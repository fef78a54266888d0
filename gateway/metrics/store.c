/* The metrics store and its Prometheus text exposition (see gw_metrics.h).
 *
 * A family owns a fixed array of max_series series pointers and an
 * open-addressing index over it, both allocated when it is registered:
 * writers append under the family's mutex and publish the new count with a
 * release store; the exposition writer loads the count and reads the series
 * without any lock. Values are atomics (doubles as their bit patterns,
 * updated by compare-and-swap), so a scrape never stalls a request. */
#include "metrics_int.h"

#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

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

/* The shortest text that reads back as v; Prometheus spellings for the
 * non-finite values. */
void gw__metrics_fmt_double(char *out, size_t len, double v)
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
    gw__metrics_fmt_double(tmp, sizeof(tmp), v);
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
    sq_buf_printf(b, "# HELP %s ", f->name);
    put_help(b, f->help);
    sq_buf_printf(b, "\n# TYPE %s %s\n", f->name, type_names[f->type]);
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
                gw__metrics_fmt_double(le, sizeof(le), f->buckets[k]);
            else
                snprintf(le, sizeof(le), "+Inf");
            put_sample_name(b, f, "_bucket", s, le);
            sq_buf_printf(b, " %llu\n", (unsigned long long)cumulative);
        }
        put_sample_name(b, f, "_sum", s, NULL);
        put(b, " ");
        put_double(b, bits_to_double(atomic_load_explicit(&s->sum, memory_order_relaxed)));
        put(b, "\n");
        put_sample_name(b, f, "_count", s, NULL);
        sq_buf_printf(b, " %llu\n", (unsigned long long)cumulative);
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
    sq_buf_printf(b,
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
    sq_buf_printf(b,
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
    for (int i = 0; i < ms->nstats; i++)
        free(ms->stats[i]);
    free(ms->stats);
    sq_map_dispose(&ms->stats_ix);
    pthread_mutex_destroy(&ms->lock);
    pthread_mutex_destroy(&ms->stats_lock);
    free(ms);
}

void gw__metrics_expose_process(gw_metrics_t *ms)
{
    ms->process = 1;
    ms->start_time_s = process_start_time();
}
