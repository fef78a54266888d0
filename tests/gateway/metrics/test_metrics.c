/* gateway/metrics.c: the store, the Prometheus text exposition (escaping,
 * cumulative histogram buckets with +Inf, _sum and _count), exact counts
 * under concurrent updates, cardinality bounds, squishd's families and the
 * per-model (Triton) statistics, and which GPUs the nv_gpu_* series are
 * read for. */
#include <criterion/criterion.h>

#include "gw_metrics.h"
#include "metrics_int.h"

#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

/* The exposition as a NUL-terminated string (caller frees). */
static char *expose(gw_metrics_t *ms)
{
    sq_buf_t b;
    sq_buf_init(&b);
    gw_metrics_write(ms, &b);
    sq_buf_put(&b, "", 1);
    char *s = strdup((const char *)b.data);
    sq_buf_dispose(&b);
    return s;
}

/* The value of the sample line that starts with `sample ` (name and
 * labels exactly as written); fails the test when absent. */
static double sample(const char *text, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = text; p != NULL && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        if (strncmp(p, name, n) == 0 && p[n] == ' ')
            return strtod(p + n + 1, NULL);
    }
    cr_assert_fail("no sample %s in:\n%s", name, text);
    return 0;
}

static int has_line(const char *text, const char *line)
{
    size_t n = strlen(line);
    for (const char *p = text; p != NULL && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (strncmp(p, line, n) == 0 && (p[n] == '\n' || p[n] == '\0'))
            return 1;
    return 0;
}

Test(metrics, counter_and_gauge_exposition_with_help_type_and_escaped_labels)
{
    gw_metrics_t *ms = gw_metrics_store_new();
    const char *const labels[] = {"model", "outcome", NULL};
    gw_metric_family_t *c =
        gw_metrics_family(ms, GW_METRIC_COUNTER, "t_requests_total",
                          "Requests.\nSecond line with a \\ backslash.", labels, NULL, 0, 0);
    gw_metric_family_t *g =
        gw_metrics_family(ms, GW_METRIC_GAUGE, "t_temperature", "Degrees.", NULL, NULL, 0, 0);
    const char *v1[] = {"a\"b\\c\nd", "ok"};
    gw_metrics_add(gw_metrics_series(c, v1), 2);
    gw_metrics_add(gw_metrics_series(c, v1), 1.5);
    const char *v2[] = {"plain", "error"};
    gw_metrics_add(gw_metrics_series(c, v2), 1);
    gw_metrics_set(gw_metrics_series(g, NULL), -2.25);
    char *text = expose(ms);
    cr_assert(has_line(text, "# HELP t_requests_total Requests.\\nSecond line with a \\\\ "
                             "backslash."),
              "%s", text);
    cr_assert(has_line(text, "# TYPE t_requests_total counter"), "%s", text);
    cr_assert(has_line(text, "t_requests_total{model=\"a\\\"b\\\\c\\nd\",outcome=\"ok\"} 3.5"),
              "%s", text);
    cr_assert(has_line(text, "t_requests_total{model=\"plain\",outcome=\"error\"} 1"), "%s", text);
    cr_assert(has_line(text, "# HELP t_temperature Degrees."), "%s", text);
    cr_assert(has_line(text, "# TYPE t_temperature gauge"), "%s", text);
    cr_assert(has_line(text, "t_temperature -2.25"), "%s", text);
    /* Families come out in registration order, HELP before TYPE before samples. */
    const char *help = strstr(text, "# HELP t_requests_total");
    const char *type = strstr(text, "# TYPE t_requests_total");
    const char *first = strstr(text, "t_requests_total{");
    cr_assert(help < type && type < first && first < strstr(text, "# HELP t_temperature"));
    cr_assert_eq(text[strlen(text) - 1], '\n');
    free(text);
    gw_metrics_free(ms);
}

Test(metrics, histogram_buckets_are_cumulative_and_end_with_inf_sum_and_count)
{
    gw_metrics_t *ms = gw_metrics_store_new();
    const double buckets[] = {0.005, 0.1, 1, 2};
    const char *const labels[] = {"model", NULL};
    gw_metric_family_t *h = gw_metrics_family(ms, GW_METRIC_HISTOGRAM, "t_latency_seconds",
                                              "Latency.", labels, buckets, 4, 0);
    const char *v[] = {"m"};
    gw_metric_series_t *s = gw_metrics_series(h, v);
    const double obs[] = {0.001, 0.005, 0.05, 0.5, 1, 1.5, 100, 0.2};
    double sum = 0;
    for (size_t i = 0; i < sizeof(obs) / sizeof(obs[0]); i++) {
        gw_metrics_observe(s, obs[i]);
        sum += obs[i];
    }
    char *text = expose(ms);
    cr_assert(has_line(text, "# TYPE t_latency_seconds histogram"), "%s", text);
    /* le is the shortest exact spelling, an observation equal to a bound
     * lands in that bound's bucket. */
    cr_assert_eq(sample(text, "t_latency_seconds_bucket{model=\"m\",le=\"0.005\"}"), 2);
    cr_assert_eq(sample(text, "t_latency_seconds_bucket{model=\"m\",le=\"0.1\"}"), 3);
    cr_assert_eq(sample(text, "t_latency_seconds_bucket{model=\"m\",le=\"1\"}"), 6);
    cr_assert_eq(sample(text, "t_latency_seconds_bucket{model=\"m\",le=\"2\"}"), 7);
    cr_assert_eq(sample(text, "t_latency_seconds_bucket{model=\"m\",le=\"+Inf\"}"), 8);
    cr_assert_float_eq(sample(text, "t_latency_seconds_sum{model=\"m\"}"), sum, 1e-9);
    cr_assert_eq(sample(text, "t_latency_seconds_count{model=\"m\"}"), 8);
    cr_assert_eq(gw_metrics_value(s), 8);
    /* Monotonic in file order, +Inf last. */
    double prev = -1;
    int nb = 0;
    const char *last_le = NULL;
    for (const char *p = strstr(text, "t_latency_seconds_bucket"); p != NULL;
         p = strstr(p + 1, "t_latency_seconds_bucket")) {
        double v2 = strtod(strchr(p, '}') + 2, NULL);
        cr_assert_geq(v2, prev);
        prev = v2;
        last_le = strstr(p, "le=\"");
        nb++;
    }
    cr_assert_eq(nb, 5);
    cr_assert(strncmp(last_le, "le=\"+Inf\"", 9) == 0);
    cr_assert(strstr(text, "_bucket{model=\"m\",le=\"+Inf\"}") <
              strstr(text, "t_latency_seconds_sum"));
    cr_assert(strstr(text, "t_latency_seconds_sum") < strstr(text, "t_latency_seconds_count"));
    free(text);
    gw_metrics_free(ms);
}

Test(metrics, histogram_without_labels_and_empty_family)
{
    gw_metrics_t *ms = gw_metrics_store_new();
    const double buckets[] = {1};
    gw_metric_family_t *h =
        gw_metrics_family(ms, GW_METRIC_HISTOGRAM, "t_size", "Sizes.", NULL, buckets, 1, 0);
    const char *const labels[] = {"x", NULL};
    gw_metrics_family(ms, GW_METRIC_COUNTER, "t_unused_total", "Nothing yet.", labels, NULL, 0, 0);
    gw_metrics_observe(gw_metrics_series(h, NULL), 3);
    char *text = expose(ms);
    cr_assert(has_line(text, "t_size_bucket{le=\"1\"} 0"), "%s", text);
    cr_assert(has_line(text, "t_size_bucket{le=\"+Inf\"} 1"), "%s", text);
    cr_assert(has_line(text, "t_size_sum 3"), "%s", text);
    cr_assert(has_line(text, "t_size_count 1"), "%s", text);
    cr_assert(has_line(text, "# TYPE t_unused_total counter"), "%s", text);
    cr_assert_null(strstr(text, "t_unused_total{"));
    free(text);
    gw_metrics_free(ms);
}

typedef struct {
    gw_metric_family_t *counter, *hist;
    int thread;
} hammer_t;

#define THREADS 8
#define ROUNDS 20000

static void *hammer(void *arg)
{
    hammer_t *h = arg;
    char mine[16];
    snprintf(mine, sizeof(mine), "t%d", h->thread);
    const char *shared[] = {"shared"};
    const char *own[] = {mine};
    for (int i = 0; i < ROUNDS; i++) {
        /* Lookup every time: the hot path as squishd uses it. */
        gw_metrics_add(gw_metrics_series(h->counter, shared), 1);
        gw_metrics_add(gw_metrics_series(h->counter, own), 0.5);
        gw_metrics_observe(gw_metrics_series(h->hist, shared), (double)(i % 4));
    }
    return NULL;
}

Test(metrics, concurrent_increments_from_threads_sum_exactly)
{
    gw_metrics_t *ms = gw_metrics_store_new();
    const char *const labels[] = {"k", NULL};
    const double buckets[] = {0, 1, 2};
    hammer_t h[THREADS];
    pthread_t th[THREADS];
    gw_metric_family_t *c =
        gw_metrics_family(ms, GW_METRIC_COUNTER, "t_hits_total", "Hits.", labels, NULL, 0, 0);
    gw_metric_family_t *hi =
        gw_metrics_family(ms, GW_METRIC_HISTOGRAM, "t_values", "Values.", labels, buckets, 3, 0);
    for (int i = 0; i < THREADS; i++) {
        h[i] = (hammer_t){.counter = c, .hist = hi, .thread = i};
        pthread_create(&th[i], NULL, hammer, &h[i]);
    }
    for (int i = 0; i < THREADS; i++)
        pthread_join(th[i], NULL);
    const char *shared[] = {"shared"};
    cr_assert_eq(gw_metrics_value(gw_metrics_series(c, shared)), (double)THREADS * ROUNDS);
    for (int i = 0; i < THREADS; i++) {
        char mine[16];
        snprintf(mine, sizeof(mine), "t%d", i);
        const char *own[] = {mine};
        cr_assert_eq(gw_metrics_value(gw_metrics_series(c, own)), 0.5 * ROUNDS);
    }
    char *text = expose(ms);
    cr_assert_eq(sample(text, "t_values_count{k=\"shared\"}"), (double)THREADS * ROUNDS);
    cr_assert_eq(sample(text, "t_values_bucket{k=\"shared\",le=\"0\"}"), THREADS * ROUNDS / 4);
    cr_assert_eq(sample(text, "t_values_bucket{k=\"shared\",le=\"2\"}"), THREADS * ROUNDS / 4 * 3);
    cr_assert_eq(sample(text, "t_values_sum{k=\"shared\"}"), (double)THREADS * ROUNDS / 4 * 6);
    free(text);
    gw_metrics_free(ms);
}

Test(metrics, label_sets_are_bounded_and_overflow_is_counted)
{
    gw_metrics_t *ms = gw_metrics_store_new();
    const char *const labels[] = {"model", NULL};
    gw_metric_family_t *c =
        gw_metrics_family(ms, GW_METRIC_COUNTER, "t_bounded_total", "Bounded.", labels, NULL, 0, 2);
    const char *a[] = {"a"}, *b[] = {"b"}, *x[] = {"x"};
    cr_assert_not_null(gw_metrics_series(c, a));
    cr_assert_not_null(gw_metrics_series(c, b));
    cr_assert_null(gw_metrics_series(c, x));
    cr_assert_eq(gw_metrics_overflows(ms), 1);
    gw_metrics_add(gw_metrics_series(c, x), 1); /* a no-op, not a crash */
    cr_assert_eq(gw_metrics_series(c, a), gw_metrics_series(c, a), "same set, same series");
    /* ("ab", "") and ("a", "b") are different label sets. */
    const char *const two[] = {"p", "q", NULL};
    gw_metric_family_t *t =
        gw_metrics_family(ms, GW_METRIC_COUNTER, "t_pairs_total", "Pairs.", two, NULL, 0, 0);
    const char *ab[] = {"ab", ""}, *a_b[] = {"a", "b"};
    cr_assert_neq(gw_metrics_series(t, ab), gw_metrics_series(t, a_b));
    gw_metrics_free(ms);
}

Test(metrics, hidden_gauges_vanish_until_set_again)
{
    gw_metrics_t *ms = gw_metrics_store_new();
    const char *const labels[] = {"session", NULL};
    gw_metric_family_t *g =
        gw_metrics_family(ms, GW_METRIC_GAUGE, "t_rate_rps", "Rate.", labels, NULL, 0, 0);
    const char *a[] = {"a"}, *b[] = {"b"};
    gw_metrics_set(gw_metrics_series(g, a), 1);
    gw_metrics_set(gw_metrics_series(g, b), 2);
    gw_metrics_hide_all(g);
    gw_metrics_set(gw_metrics_series(g, b), 3);
    char *text = expose(ms);
    cr_assert_null(strstr(text, "t_rate_rps{session=\"a\"}"), "%s", text);
    cr_assert(has_line(text, "t_rate_rps{session=\"b\"} 3"), "%s", text);
    free(text);
    gw_metrics_free(ms);
}

Test(metrics, decreasing_buckets_are_a_bug, .signal = SIGABRT)
{
    gw_metrics_t *ms = gw_metrics_store_new();
    const double buckets[] = {1, 0.5};
    gw_metrics_family(ms, GW_METRIC_HISTOGRAM, "t_bad", "Bad.", NULL, buckets, 2, 0);
}

Test(metrics, a_family_registered_twice_is_a_bug, .signal = SIGABRT)
{
    gw_metrics_t *ms = gw_metrics_store_new();
    gw_metrics_family(ms, GW_METRIC_GAUGE, "t_twice", "Once.", NULL, NULL, 0, 0);
    gw_metrics_family(ms, GW_METRIC_GAUGE, "t_twice", "Twice.", NULL, NULL, 0, 0);
}

static gw_model_t model_named(const char *name, int version, int64_t key)
{
    gw_model_t m;
    memset(&m, 0, sizeof(m));
    snprintf(m.name, sizeof(m.name), "%s", name);
    m.version = version;
    m.key = key;
    return m;
}

Test(metrics, squishd_families_outcomes_and_slo_buckets)
{
    gw_metrics_t *ms = gw_metrics_new();
    gw_model_t m = model_named("r50", 2, 7);
    gw_metrics_request_t ok = {.status = 200, .slo_ms = 100, .items = 1, .total_s = 0.040};
    gw_metrics_request_t late = {.status = 200, .slo_ms = 100, .items = 1, .total_s = 0.120};
    gw_metrics_request_t dropped = {.status = 503, .err = SQ_DEADLINE, .slo_ms = 3};
    gw_metrics_request_t bad = {.status = 400, .err = SQ_BAD_IMAGE, .slo_ms = 110};
    cr_assert_str_eq(gw_metrics_outcome(&ok), "ok");
    cr_assert_str_eq(gw_metrics_outcome(&late), "late");
    cr_assert_str_eq(gw_metrics_outcome(&dropped), "dropped");
    cr_assert_str_eq(gw_metrics_outcome(&bad), "error");
    gw_metrics_request(ms, &m, &ok);
    gw_metrics_request(ms, &m, &ok);
    gw_metrics_request(ms, &m, &late);
    gw_metrics_request(ms, &m, &dropped);
    gw_metrics_request(ms, &m, &bad);
    gw_metrics_http(ms, "infer_v1", 200);
    gw_metrics_upload(ms, 0);
    gw_metrics_upload(ms, SQ_EXISTS);
    gw_metrics_worker_up(ms, 0, "emu:0", 1);
    gw_metrics_worker_restart(ms, 1, "emu:1");
    gw_metrics_drop(ms, &m, SQ_DEADLINE);
    sq_batch_done_t done = {.exec_ns = 5000000, .total_ns = 6000000};
    gw_metrics_batch(ms, &m, 0, "emu:0", 4, 7000, &done);
    char *text = expose(ms);
    /* SLO labels are the dispatcher's buckets: 3 ms joins the 5 ms bucket,
     * 110 ms the 100 ms one. */
    cr_assert_eq(sample(text, "squish_requests_total{model=\"r50\",version=\"2\",slo_ms=\"100\","
                              "outcome=\"ok\"}"),
                 2);
    cr_assert_eq(sample(text, "squish_requests_total{model=\"r50\",version=\"2\",slo_ms=\"100\","
                              "outcome=\"late\"}"),
                 1);
    cr_assert_eq(sample(text, "squish_requests_total{model=\"r50\",version=\"2\",slo_ms=\"5\","
                              "outcome=\"dropped\"}"),
                 1);
    cr_assert_eq(sample(text, "squish_requests_total{model=\"r50\",version=\"2\",slo_ms=\"100\","
                              "outcome=\"error\"}"),
                 1);
    cr_assert_eq(sample(text, "squish_request_duration_seconds_count{model=\"r50\"}"), 3);
    cr_assert_eq(sample(text, "squish_http_requests_total{route=\"infer_v1\",code=\"200\"}"), 1);
    cr_assert_eq(sample(text, "squish_uploads_total{outcome=\"created\"}"), 1);
    cr_assert_eq(sample(text, "squish_uploads_total{outcome=\"already_exists\"}"), 1);
    cr_assert_eq(sample(text, "squish_worker_up{worker=\"0\",device=\"emu:0\"}"), 1);
    cr_assert_eq(sample(text, "squish_worker_restarts_total{worker=\"1\",device=\"emu:1\"}"), 1);
    cr_assert_eq(sample(text, "squish_dispatch_drops_total{model=\"r50\",reason=\"deadline\"}"), 1);
    cr_assert_eq(sample(text, "squish_batch_size_bucket{model=\"r50\",worker=\"0\",le=\"2\"}"), 0);
    cr_assert_eq(sample(text, "squish_batch_size_bucket{model=\"r50\",worker=\"0\",le=\"4\"}"), 1);
    cr_assert_float_eq(
        sample(text, "squish_worker_busy_seconds_total{worker=\"0\",device=\"emu:0\"}"), 0.007,
        1e-12);
    cr_assert_eq(sample(text, "squish_plan_models_moved_total"), 0);
    cr_assert_null(strstr(text, "\nsquish_plan_devices "), "no plan yet: no value");
    /* Every family has HELP and TYPE; process metrics from /proc. */
    const char *fams[] = {"squish_requests_total",
                          "squish_request_duration_seconds",
                          "squish_queue_duration_seconds",
                          "squish_preprocess_duration_seconds",
                          "squish_execute_duration_seconds",
                          "squish_batch_size",
                          "squish_batches_total",
                          "squish_worker_busy_seconds_total",
                          "squish_worker_up",
                          "squish_worker_restarts_total",
                          "squish_session_rate_rps",
                          "squish_session_planned_throughput_rps",
                          "squish_plan_epoch",
                          "squish_plan_devices",
                          "squish_plan_devices_lower_bound",
                          "squish_autoscale_advice_devices",
                          "squish_plan_models_moved_total",
                          "squish_http_requests_total",
                          "squish_uploads_total",
                          "process_resident_memory_bytes",
                          "process_open_fds",
                          "process_start_time_seconds"};
    for (size_t i = 0; i < sizeof(fams) / sizeof(fams[0]); i++) {
        char line[128];
        snprintf(line, sizeof(line), "# HELP %s ", fams[i]);
        cr_assert_not_null(strstr(text, line), "%s", fams[i]);
        snprintf(line, sizeof(line), "# TYPE %s ", fams[i]);
        cr_assert_not_null(strstr(text, line), "%s", fams[i]);
    }
    cr_assert_gt(sample(text, "process_resident_memory_bytes"), 1e5);
    cr_assert_geq(sample(text, "process_open_fds"), 3);
    double start = sample(text, "process_start_time_seconds");
    cr_assert(start > 1.6e9 && start <= sq_wall_s() + 1, "%f", start);
    free(text);
    gw_metrics_free(ms);
}

Test(metrics, plan_gauges_and_sessions_replace_each_other)
{
    gw_metrics_t *ms = gw_metrics_new();
    gw_model_t a = model_named("a", 1, 1), b = model_named("b", 1, 2);
    gw_metrics_plan_t p = {.epoch = 3,
                           .devices = 4,
                           .lower_bound_devices = 3.5,
                           .advice_devices = -1,
                           .models_moved = 2};
    gw_metrics_plan(ms, &p);
    gw_metrics_plan(ms, &p);
    gw_metrics_session_t s1[] = {{a.name, 100, 50, 60}, {b.name, 25, 10, 12}};
    gw_metrics_sessions(ms, s1, 2);
    gw_metrics_session_t s2[] = {{b.name, 25, 11, 12}};
    gw_metrics_sessions(ms, s2, 1);
    char *text = expose(ms);
    cr_assert_eq(sample(text, "squish_plan_epoch"), 3);
    cr_assert_eq(sample(text, "squish_plan_devices"), 4);
    cr_assert_eq(sample(text, "squish_plan_devices_lower_bound"), 3.5);
    cr_assert_eq(sample(text, "squish_autoscale_advice_devices"), -1);
    cr_assert_eq(sample(text, "squish_plan_models_moved_total"), 4);
    cr_assert_eq(sample(text, "squish_session_rate_rps{model=\"b\",slo_ms=\"25\"}"), 11);
    cr_assert_eq(sample(text, "squish_session_planned_throughput_rps{model=\"b\",slo_ms=\"25\"}"),
                 12);
    cr_assert_null(strstr(text, "squish_session_rate_rps{model=\"a\""), "%s", text);
    free(text);
    gw_metrics_free(ms);
}

Test(metrics, model_stats_count_requests_executions_and_batch_sizes)
{
    gw_metrics_t *ms = gw_metrics_new();
    gw_model_t m = model_named("r50", 1, 9), other = model_named("r18", 1, 10);
    gw_metrics_request_t ok = {.status = 200,
                               .slo_ms = 100,
                               .items = 3,
                               .total_s = 0.010,
                               .preprocess_s = 0.002,
                               .queue_s = 0.003,
                               .execute_s = 0.004,
                               .output_s = 0.001};
    gw_metrics_request_t bad = {.status = 400, .err = SQ_BAD_IMAGE, .total_s = 0.001};
    gw_metrics_request(ms, &m, &ok);
    gw_metrics_request(ms, &m, &ok);
    gw_metrics_request(ms, &m, &bad);
    sq_batch_done_t done = {.exec_ns = 3000000, .total_ns = 3500000};
    gw_metrics_batch(ms, &m, 0, "emu:0", 3, 4000, &done);
    gw_metrics_batch(ms, &m, 1, "emu:1", 3, 4000, &done);
    gw_metrics_batch(ms, &m, 0, "emu:0", 1, 4000, &done);
    json_t *st = gw_metrics_model_stats(ms, &m);
    cr_assert_str_eq(json_string_value(json_object_get(st, "name")), "r50");
    cr_assert_str_eq(json_string_value(json_object_get(st, "version")), "1");
    cr_assert_eq(json_integer_value(json_object_get(st, "inference_count")), 6);
    cr_assert_eq(json_integer_value(json_object_get(st, "execution_count")), 3);
    cr_assert_gt(json_integer_value(json_object_get(st, "last_inference")), 1600000000000LL);
    json_t *is = json_object_get(st, "inference_stats");
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(is, "success"), "count")), 2);
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(is, "success"), "ns")),
                 20000000);
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(is, "fail"), "count")), 1);
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(is, "queue"), "ns")), 6000000);
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(is, "compute_infer"), "ns")),
                 8000000);
    /* What Triton sends without a response cache, which perf_analyzer
     * reads without looking first. */
    for (int i = 0; i < 2; i++) {
        json_t *cache = json_object_get(is, i == 0 ? "cache_hit" : "cache_miss");
        cr_assert(json_is_integer(json_object_get(cache, "count")), "%d", i);
        cr_assert(json_is_integer(json_object_get(cache, "ns")), "%d", i);
        cr_assert_eq(json_integer_value(json_object_get(cache, "count")), 0);
        cr_assert_eq(json_integer_value(json_object_get(cache, "ns")), 0);
    }
    cr_assert(json_is_object(json_object_get(st, "response_stats")));
    cr_assert_eq(json_object_size(json_object_get(st, "response_stats")), 0);
    cr_assert(json_is_array(json_object_get(st, "memory_usage")));
    cr_assert_eq(json_array_size(json_object_get(st, "memory_usage")), 0);
    json_t *bs = json_object_get(st, "batch_stats");
    cr_assert_eq(json_array_size(bs), 2);
    json_t *b1 = json_array_get(bs, 0), *b3 = json_array_get(bs, 1);
    cr_assert_eq(json_integer_value(json_object_get(b1, "batch_size")), 1);
    cr_assert_eq(json_integer_value(json_object_get(b3, "batch_size")), 3);
    json_t *infer3 = json_object_get(b3, "compute_infer");
    cr_assert_eq(json_integer_value(json_object_get(infer3, "count")), 2);
    cr_assert_eq(json_integer_value(json_object_get(infer3, "ns")), 6000000);
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(b3, "compute_input"), "ns")),
                 1000000);
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(b3, "compute_output"), "ns")),
                 1000000);
    json_decref(st);
    /* A model without traffic: zeros, no batch sizes. */
    st = gw_metrics_model_stats(ms, &other);
    cr_assert_eq(json_integer_value(json_object_get(st, "inference_count")), 0);
    cr_assert_eq(json_array_size(json_object_get(st, "batch_stats")), 0);
    json_decref(st);
    gw_metrics_free(ms);
}

/* Issue 25's one view: each family once, its samples from the dispatcher
 * and every frontend (labelled) together, HELP and TYPE from the first. */
Test(metrics, a_frontends_exposition_folds_into_the_dispatchers_family_by_family)
{
    const char *own = "# HELP squish_requests_total Requests.\n"
                      "# TYPE squish_requests_total counter\n"
                      "squish_requests_total{model=\"m\"} 3\n"
                      "# HELP squish_up Up.\n# TYPE squish_up gauge\nsquish_up 1\n";
    const char *fe = "# HELP squish_requests_total Requests.\n"
                     "# TYPE squish_requests_total counter\n"
                     "squish_requests_total{model=\"m\"} 5\n"
                     "# HELP squish_latency_seconds Latency.\n"
                     "# TYPE squish_latency_seconds histogram\n"
                     "squish_latency_seconds_bucket{le=\"+Inf\"} 5\n"
                     "squish_latency_seconds_sum 0.5\nsquish_latency_seconds_count 5\n"
                     "squish_frontend_joined 1\n";
    const char *texts[] = {fe, NULL, fe};
    const char *names[] = {"fe-a:8000", "gone", "fe\"b"};
    sq_buf_t out;
    sq_buf_init(&out);
    gw_metrics_merge(&out, own, texts, names, 3);
    sq_buf_put(&out, "", 1);
    const char *t = (const char *)out.data;
    cr_assert(strstr(t, "# TYPE squish_requests_total counter\n"
                        "squish_requests_total{model=\"m\"} 3\n"
                        "squish_requests_total{frontend=\"fe-a:8000\",model=\"m\"} 5\n"
                        "squish_requests_total{frontend=\"fe\\\"b\",model=\"m\"} 5\n") != NULL,
              "%s", t);
    /* One HELP and one TYPE a family, whoever brought it. */
    const char *first = strstr(t, "# TYPE squish_requests_total");
    cr_assert_null(strstr(first + 1, "# TYPE squish_requests_total"), "%s", t);
    cr_assert(strstr(t, "squish_latency_seconds_sum{frontend=\"fe-a:8000\"} 0.5\n") != NULL, "%s",
              t);
    cr_assert(strstr(t, "squish_latency_seconds_bucket{frontend=\"fe-a:8000\",le=\"+Inf\"} 5\n") !=
                  NULL,
              "%s", t);
    cr_assert(strstr(t, "squish_frontend_joined{frontend=\"fe-a:8000\"} 1\n") != NULL, "%s", t);
    cr_assert(strstr(t, "squish_up 1\n") != NULL);
    cr_assert_null(strstr(t, "gone"));
    sq_buf_dispose(&out);
}

Test(metrics, a_frontends_model_statistics_add_to_the_dispatchers)
{
    json_t *a = json_loads("{\"name\":\"m\",\"version\":\"1\",\"last_inference\":5,"
                           "\"inference_count\":2,\"execution_count\":1,"
                           "\"inference_stats\":{\"success\":{\"count\":2,\"ns\":100}},"
                           "\"batch_stats\":[{\"batch_size\":2,\"compute_infer\":"
                           "{\"count\":1,\"ns\":50}}]}",
                           0, NULL);
    json_t *b = json_loads("{\"name\":\"m\",\"version\":\"1\",\"last_inference\":9,"
                           "\"inference_count\":3,\"execution_count\":2,"
                           "\"inference_stats\":{\"success\":{\"count\":3,\"ns\":30}},"
                           "\"batch_stats\":[{\"batch_size\":2,\"compute_infer\":"
                           "{\"count\":1,\"ns\":10}},{\"batch_size\":1,\"compute_infer\":"
                           "{\"count\":1,\"ns\":7}}]}",
                           0, NULL);
    gw_metrics_stats_add(a, b);
    cr_assert_eq(json_integer_value(json_object_get(a, "inference_count")), 5);
    cr_assert_eq(json_integer_value(json_object_get(a, "last_inference")), 9);
    cr_assert_str_eq(json_string_value(json_object_get(a, "version")), "1");
    json_t *succ = json_object_get(json_object_get(a, "inference_stats"), "success");
    cr_assert_eq(json_integer_value(json_object_get(succ, "ns")), 130);
    json_t *bs = json_object_get(a, "batch_stats");
    cr_assert_eq(json_array_size(bs), 2);
    cr_assert_eq(json_integer_value(json_object_get(
                     json_object_get(json_array_get(bs, 0), "compute_infer"), "ns")),
                 60);
    json_decref(a);
    json_decref(b);
}

/* The GPUs /metrics reports (nv_gpu_*, gateway/metrics/nvml.c) are those
 * local cuda workers serve: cuda:N up on this host, not cpu, emu or a
 * remote host's cuda:N@host, and not once the worker is gone. Without
 * NVML (no driver here) no nv_gpu_* series at all, as on a cpu-only
 * Triton; bench/gpu/run checks them where a GPU is. */
Test(metrics, the_gpus_reported_are_those_of_local_cuda_workers_up)
{
    gw_metrics_t *ms = gw_metrics_new();
    gw_metrics_worker_up(ms, 0, "cpu", 1);
    gw_metrics_worker_up(ms, 1, "cuda:3", 1);
    gw_metrics_worker_up(ms, 2, "cuda:0@gpu-host", 1);
    gw_metrics_worker_up(ms, 3, "cuda:1", 1);
    gw_metrics_worker_up(ms, 4, "emu:5", 1);
    cr_assert_eq(atomic_load(&ms->local_cuda), (1u << 3) | (1u << 1));
    gw_metrics_worker_up(ms, 3, "cuda:1", 0);
    cr_assert_eq(atomic_load(&ms->local_cuda), 1u << 3);
    sq_buf_t gpus;
    sq_buf_init(&gpus);
    gw_metrics_write_gpus(ms, &gpus);
    void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (nvml == NULL)
        cr_assert_eq(gpus.len, 0, "no NVML, no GPU series: %.*s", (int)gpus.len,
                     (const char *)gpus.data);
    else
        dlclose(nvml);
    sq_buf_dispose(&gpus);
    gw_metrics_free(ms);
}
