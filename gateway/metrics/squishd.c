/* squishd's families on the store (store.c), its per-model statistics
 * (Triton's /stats), and the recorders the other rooms call: one per event
 * (a request answered, a batch run, a worker up or lost, a plan), so that
 * the names and labels of the exposition live in this one file. */
#include "metrics_int.h"
#include "gw_catalog.h"

#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

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
    gw__metrics_expose_process(ms);
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
        "Inference requests answered, by model, version, SLO bucket (ms; none: best effort) and "
        "outcome: ok, late (answered after its deadline), dropped (503: deadline, overload, no "
        "worker) or error.",
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
    m->withdrawn = gw_metrics_family(
        m, GW_METRIC_COUNTER, "squish_items_withdrawn_total",
        "Items (images, tensor rows) withdrawn before they ran, by model and reason "
        "(request_failed: another item of the request or pipeline query failed; client_gone: its "
        "client closed the connection).",
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

/* The statistics of model key, created on first use; NULL past
 * MAX_MODEL_STATS entries. */
static model_stats_t *stats_of(gw_metrics_t *ms, int64_t key, int create)
{
    pthread_mutex_lock(&ms->stats_lock);
    int i = sq_map_get(&ms->stats_ix, (uint64_t)key, 0);
    model_stats_t *st = i >= 0 ? ms->stats[i] : NULL;
    if (st == NULL && create && ms->nstats < MAX_MODEL_STATS) {
        if (ms->nstats == ms->stats_cap) {
            ms->stats_cap = ms->stats_cap ? 2 * ms->stats_cap : 16;
            ms->stats = sq_xrealloc(ms->stats, (size_t)ms->stats_cap * sizeof(*ms->stats));
        }
        st = sq_xcalloc(1, sizeof(*st));
        st->key = key;
        sq_map_put(&ms->stats_ix, (uint64_t)key, 0, ms->nstats);
        ms->stats[ms->nstats++] = st;
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

void gw_metrics_stats_triton_rest(json_t *stats)
{
    json_t *is = json_object_get(stats, "inference_stats");
    json_object_set_new(is, "cache_hit", json_pack("{s:i, s:i}", "count", 0, "ns", 0));
    json_object_set_new(is, "cache_miss", json_pack("{s:i, s:i}", "count", 0, "ns", 0));
    json_object_set_new(stats, "response_stats", json_object());
    json_object_set_new(stats, "memory_usage", json_array());
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
    json_t *stats = json_pack(
        "{s:s, s:s, s:I, s:I, s:I, s:{s:o, s:o, s:o, s:o, s:o, s:o}, s:o}", "name", m->name,
        "version", version, "last_inference", (json_int_t)atomic_load(&st->last_inference_ms),
        "inference_count", (json_int_t)atomic_load(&st->inference_count), "execution_count",
        (json_int_t)atomic_load(&st->execution_count), "inference_stats", "success", DUR(success),
        "fail", DUR(fail), "queue", DUR(queue), "compute_input", DUR(compute_input),
        "compute_infer", DUR(compute_infer), "compute_output", DUR(compute_output), "batch_stats",
        batches);
#undef DUR
    gw_metrics_stats_triton_rest(stats);
    return stats;
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
    /* Best effort (no SLO) is never late. */
    return r->slo_ms > 0 && r->total_s * 1000.0 > r->slo_ms ? "late" : "ok";
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
    if (r->slo_ms > 0)
        gw__metrics_fmt_double(slo, sizeof(slo), gw_slo_bucket_ms(r->slo_ms));
    else
        snprintf(slo, sizeof(slo), "none"); /* best effort */
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
    /* The worker's receipt-to-reply time splits into the batch's wait
     * there (input) and its work (infer: the inputs gathered and
     * normalized, the run, the outputs copied, what l(b) measures); the
     * rest of the round trip is handing the outputs back (output). */
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

void gw_metrics_withdrawn(gw_metrics_t *ms, const gw_model_t *m, const char *why)
{
    if (ms == NULL || ms->withdrawn == NULL)
        return;
    const char *v[] = {m->name, why};
    gw_metrics_add(gw_metrics_series(ms->withdrawn, v), 1);
}

void gw_metrics_worker_up(gw_metrics_t *ms, int worker, const char *device, int up)
{
    if (ms == NULL || ms->worker_up == NULL)
        return;
    char w[16];
    snprintf(w, sizeof(w), "%d", worker);
    const char *v[] = {w, device};
    gw_metrics_set(gw_metrics_series(ms->worker_up, v), up ? 1 : 0);
    /* a GPU of this host (cuda:N, not cuda:N@host): nvml.c reports it */
    int idx = -1, end = 0;
    if (sscanf(device, "cuda:%d%n", &idx, &end) == 1 && device[end] == '\0' && idx >= 0 &&
        idx < 64) {
        if (up)
            atomic_fetch_or(&ms->local_cuda, (uint_fast64_t)1 << idx);
        else
            atomic_fetch_and(&ms->local_cuda, ~((uint_fast64_t)1 << idx));
    }
    /* The busy and restart counters exist from the start, at 0: a
     * counter born at 1 would hide its first restart from rate() and
     * increase(), and the dashboard shows 0 restarts rather than nothing. */
    gw_metrics_add(gw_metrics_series(ms->worker_busy, v), 0);
    gw_metrics_add(gw_metrics_series(ms->worker_restarts, v), 0);
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
        gw__metrics_fmt_double(slo, sizeof(slo), gw_slo_bucket_ms(s[i].slo_ms));
        const char *v[] = {s[i].model, slo};
        gw_metrics_set(gw_metrics_series(ms->session_rate, v), s[i].rate_rps);
        gw_metrics_set(gw_metrics_series(ms->session_planned, v), s[i].planned_rps);
    }
}
