/* gateway/batches.c's pump against the real dispatcher core, a real event
 * loop and a link that records what the dispatcher sends.
 *
 * The timer case (issue 13, finding 3): the pump copies the core's actions
 * and then acts on them; acting on a batch that cannot be sent hands the
 * worker back to the core and pumps again, and that nested pump takes a
 * newer wake-up. The core names a wake-up time once, when it changes, so an
 * outer pump that armed its own, older, TIMER action after the nested one
 * lost the newer wake-up: requests then waited past their deadlines for a
 * timer that never came. Here every batch fails to send (its outputs do not
 * fit the shared-memory arena), so every SEND nests a pump; after each
 * pump the armed timer must be the core's next wake-up (none, once the
 * queue is empty), and every item is answered exactly once. */
#include <criterion/criterion.h>

#include "batcher_int.h"
#include "api_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NITEMS 96

typedef struct {
    gw_transport_t base;
    int frames[64]; /* by message type */
} rec_link_t;

static int rec_send(gw_transport_t *t, int worker, uint16_t type, uint64_t id, const void *payload,
                    uint32_t len, const gw_region_t *regions, int nregions)
{
    rec_link_t *l = (rec_link_t *)t;
    (void)worker, (void)id, (void)payload, (void)len, (void)regions, (void)nregions;
    if (type < 64)
        l->frames[type]++;
    return 0;
}

static int rec_send_ref(gw_transport_t *t, int worker, uint16_t type, uint64_t id,
                        sq_bytes_t *bytes, size_t off, uint32_t len)
{
    (void)bytes, (void)off, (void)len;
    return rec_send(t, worker, type, id, NULL, 0, NULL, 0);
}

static int finished[NITEMS];
static int finished_rc[NITEMS];

static void on_finish(gw_item_t *it, int rc, const char *detail)
{
    (void)detail;
    finished[it->owner.index]++;
    finished_rc[it->owner.index] = rc;
}

/* An emulated model (l(b) = 1 ms + 1 ms per item, batches up to 8) whose
 * output rows (1M floats each) never fit the test's 1 MiB arena. */
static gw_model_t *model_new(void)
{
    json_t *rows = json_array(), *lat = json_array(), *sd = json_array();
    for (int b = 1; b <= 8; b++) {
        json_array_append_new(rows, json_integer(b));
        json_array_append_new(lat, json_real(1.0 + b));
        json_array_append_new(sd, json_real(0.0));
    }
    json_t *rec = json_pack(
        "{s:I, s:s, s:i, s:s, s:s, s:s, s:{s:s, s:s, s:[i,i,i,i]}, s:[{s:s, s:s, s:[i,i]}],"
        " s:f, s:i, s:[{s:s, s:o, s:o, s:o}]}",
        "id", (json_int_t)1, "name", "cap", "version", 1, "sha256", "00", "format", "emulated",
        "status", "ready", "input", "name", "x", "datatype", "FP32", "shape", -1, 3, 4, 4,
        "outputs", "name", "y", "datatype", "FP32", "shape", -1, 1 << 20, "default_slo_ms", 100.0,
        "max_batch", 8, "profiles", "device_kind", "emu", "batch", rows, "latency_ms", lat,
        "latency_std_ms", sd);
    cr_assert_not_null(rec);
    gw_model_t *m = gw_model_from_record(rec);
    json_decref(rec);
    cr_assert(m->has_profile[SQ_DEV_EMU]);
    return m;
}

static void check_timer(gw_dispatch_t *ds, const char *when)
{
    int64_t wake = pl_dispatch_next_wake(ds->batch.core);
    if (wake == PL_NEVER)
        cr_assert_eq(ds->batch.timer, 0, "%s: a timer is armed but the core wants none", when);
    else
        cr_assert(ds->batch.timer != 0 && ds->batch.timer_at_us == wake,
                  "%s: armed %lld, the core wakes at %lld", when, (long long)ds->batch.timer_at_us,
                  (long long)wake);
}

static void sleep_until_us(int64_t at_us)
{
    int64_t d = at_us - sq_now_us();
    if (d > 0)
        nanosleep(&(struct timespec){.tv_sec = d / 1000000, .tv_nsec = d % 1000000 * 1000}, NULL);
}

/* A dispatcher with one emu worker that holds model_new()'s model. */
typedef struct {
    gw_config_t cfg;
    gw_server_t srv;
    rec_link_t link;
    sq_loop_t *loop;
    gw_dispatch_t *ds;
    gw_model_t *m;
    ds_model_t *dm;
} rig_t;

static void rig_init(rig_t *r)
{
    char *argv[] = {"squishd", NULL}, *envp[] = {NULL}, err[256];
    gw_config_action_t action;
    memset(r, 0, sizeof(*r));
    cr_assert_eq(gw_config_parse(&r->cfg, 1, argv, envp, &action, err, sizeof(err)), 0, "%s", err);
    r->srv.cfg = &r->cfg;
    r->srv.metrics = gw_metrics_new();
    cr_assert_eq(sq_shm_arena_create(&r->srv.arena, 1 << 20, 4096), 0);
    r->link = (rec_link_t){.base = {.send = rec_send, .send_ref = rec_send_ref}};
    r->srv.transport = &r->link.base;
    r->srv.registry = gw_registry_new();
    r->loop = sq_loop_new();
    gw_dispatch_deps_t deps = gw_dispatch_deps(&r->srv, r->loop);
    r->ds = gw_dispatch_new(&deps);
    r->srv.dispatch = r->ds;
    gw_dispatch_events.up(r->ds, 0, "emu:0", 1ull << 30);
    r->m = model_new();
    r->dm = ds_model_get(r->ds, r->m);
    r->dm->kind = SQ_DEV_EMU;
    r->dm->active = 1;
    ds_load_t *l = ds_load_find(ds_worker_at(r->ds, 0), r->m->key, 1);
    l->state = LOAD_DONE;
    l->max_batch = 8;
}

static void rig_dispose(rig_t *r)
{
    gw_dispatch_free(r->ds);
    gw_model_unref(r->m);
    gw_registry_free(r->srv.registry);
    sq_loop_free(r->loop);
    sq_shm_arena_free(r->srv.arena);
    gw_metrics_free(r->srv.metrics);
}

Test(dispatch, a_nested_pump_keeps_the_newest_wake_up_and_answers_each_item_once)
{
    static rig_t r;
    rig_init(&r);
    gw_dispatch_t *ds = r.ds;
    gw_model_t *m = r.m;
    ds_model_t *dm = r.dm;

    /* Three waves of 32 requests, 10 ms apart, each wave handed to the
     * core before a pump (as on_submit does for requests that waited for a
     * load): the first goes to the idle worker at once and the core queues
     * the rest behind it with a wake-up; the pump's failed send frees the
     * worker, and the nested pumps send and fail the queue batch by batch,
     * each with a wake-up of its own. */
    static gw_item_t items[NITEMS];
    int64_t t0 = sq_now_us();
    for (int wave = 0; wave < NITEMS / 32; wave++) {
        sleep_until_us(t0 + wave * 10000);
        for (int i = wave * 32; i < (wave + 1) * 32; i++) {
            int64_t now = sq_now_us();
            items[i] = (gw_item_t){.owner.index = i,
                                   .ask.model = m,
                                   .ask.slo_ms = 100,
                                   .ask.arrival_us = now,
                                   .ask.deadline_us = now + 20000 + (i % 32) * 1250,
                                   .owner.finish = on_finish,
                                   .input.in_off = -1,
                                   .ask.input_kind = SQ_INPUT_FP32};
            ds_enqueue_item(ds, dm, &items[i]);
        }
        ds_pump(ds);
        check_timer(ds, "after a wave");
    }
    /* The loop's part, should the core still want to wake up: its timer
     * and a pump. */
    while (ds->batch.timer != 0 && sq_now_us() < t0 + 2000000) {
        sleep_until_us(ds->batch.timer_at_us);
        pl_dispatch_timer(ds->batch.core, sq_now_us());
        ds_pump(ds);
        check_timer(ds, "after a wake-up");
    }
    cr_assert_eq(r.link.frames[SQ_MSG_BATCH], 0, "no batch fits the arena, none is sent");
    int overload = 0;
    for (int i = 0; i < NITEMS; i++) {
        cr_assert_eq(finished[i], 1, "item %d answered %d times", i, finished[i]);
        overload += finished_rc[i] == SQ_OVERLOAD;
    }
    cr_assert(overload > 0, "the failed sends answered some items");
    rig_dispose(&r);
}

/* Each priority level is a core session of its own, with the level as the
 * core's priority; an item that names none (0) is at the default level,
 * one past the last level at the last. */
Test(dispatch, each_priority_level_is_a_session_with_that_priority)
{
    static rig_t r;
    rig_init(&r);
    static gw_item_t items[6];
    const uint8_t asked[6] = {0, 1, 3, 9, 1, GW_PRIORITY_DEFAULT};
    const int level[6] = {GW_PRIORITY_DEFAULT, 1, 3, GW_PRIORITY_LEVELS, 1, GW_PRIORITY_DEFAULT};
    int64_t now = sq_now_us();
    for (int i = 0; i < 6; i++) {
        items[i] = (gw_item_t){.owner.index = i,
                               .ask.model = r.m,
                               .ask.slo_ms = 100,
                               .ask.priority = asked[i],
                               .ask.arrival_us = now,
                               .ask.deadline_us = now + 100000,
                               .owner.finish = on_finish,
                               .input.in_off = -1,
                               .ask.input_kind = SQ_INPUT_FP32};
        ds_enqueue_item(r.ds, r.dm, &items[i]);
    }
    cr_assert_eq(r.ds->batch.nsessions, 4, "levels 2, 1, 3 and 4");
    int queued = 0;
    for (int i = 0; i < 6; i++) {
        int found = 0;
        for (int s = 0; s < r.ds->batch.nsessions; s++) {
            if (r.ds->batch.sessions[s].priority != level[i])
                continue;
            found++;
            cr_assert_eq(r.ds->batch.sessions[s].model, r.dm);
        }
        cr_assert_eq(found, 1, "item %d: one session at level %d", i, level[i]);
    }
    for (int s = 0; s < r.ds->batch.nsessions; s++)
        queued += pl_dispatch_queued(r.ds->batch.core, s);
    pl_dispatch_stats_t st;
    pl_dispatch_stats(r.ds->batch.core, &st);
    cr_assert_eq(st.requests, 6);
    cr_assert_eq(queued + (int)st.sent_requests + (int)st.dropped, 6);
    rig_dispose(&r);
}

/* A load that completes is held at once, for whoever asks before the next
 * tick (every 50 ms): a version just measured on that load was ready in
 * the registry and answered requests while the repository index, reading
 * the tick's stale list, said LOADING (a CI failure of test_models). And a
 * worker lost holds nothing from that moment. */
Test(dispatch, a_load_that_completes_is_held_before_the_next_tick)
{
    static rig_t r;
    rig_init(&r);
    gw_model_ref(r.m); /* the registry takes a reference of its own */
    gw_registry_put(r.srv.registry, r.m);
    ds_load_t *l = ds_load_find(ds_worker_at(r.ds, 0), r.m->key, 0);
    l->state = LOAD_SENT;
    ds_publish_ready(r.ds);
    cr_assert_not(gw_sched_held(gw_dispatch_sched(r.ds), r.m->key), "loading: not held yet");
    sq_buf_t b;
    sq_buf_init(&b);
    sq_model_loaded_t info = {
        .memory_bytes = 1 << 20, .max_batch = 8, .in_elems = 48, .out_elems = 1 << 20};
    sq_model_loaded_encode(&b, &info);
    sq_frame_t f = {.type = SQ_MSG_MODEL_LOADED,
                    .id = (uint64_t)r.m->key,
                    .payload = b.data,
                    .len = (uint32_t)b.len};
    cr_assert_eq(gw_dispatch_events.frame(r.ds, 0, &f), 0);
    sq_buf_dispose(&b);
    cr_assert_eq(l->state, LOAD_DONE);
    cr_assert(gw_sched_held(gw_dispatch_sched(r.ds), r.m->key), "loaded, and held without a tick");
    gw_dispatch_events.lost(r.ds, 0);
    cr_assert_not(gw_sched_held(gw_dispatch_sched(r.ds), r.m->key),
                  "its worker lost: held no more");
    rig_dispose(&r);
}

/* The least latency admission reports (gw_dispatch_least: "ask for N ms
 * or more", a decode's deadline) is what the dispatcher plans with: with a
 * live correction (squish_profile_scale 2.5), the core's cost of a batch
 * of one, not the measured profile's (l(1) = 2 ms: 5 ms corrected, plus
 * the 2 ms dispatch margin). And it follows the correction back. */
Test(dispatch, the_least_latency_admission_reports_is_what_dispatch_plans)
{
    static rig_t r;
    rig_init(&r);
    static gw_item_t items[2];
    int64_t now = sq_now_us();
    items[0] = (gw_item_t){.owner.index = 0,
                           .ask.model = r.m,
                           .ask.slo_ms = 100,
                           .ask.arrival_us = now,
                           .ask.deadline_us = now + 100000,
                           .owner.finish = on_finish,
                           .input.in_off = -1,
                           .ask.input_kind = SQ_INPUT_FP32};
    ds_enqueue_item(r.ds, r.dm, &items[0]);
    cr_assert_eq(r.ds->batch.nsessions, 1);
    gw_least_t least;
    for (int step = 0; step < 3; step++) {
        double scale = step == 1 ? 1.0 : step == 0 ? 2.5 : 0.5;
        ds_live_set(r.ds, r.dm, SQ_DEV_EMU, scale);
        cr_assert_eq(gw_sched_least(gw_dispatch_sched(r.ds), r.m, SQ_DEV_EMU, 1, &least), 0);
        int64_t planned = pl_dispatch_batch_cost_us(r.ds->batch.core, 0, 1);
        cr_assert_eq(least.run_us + least.margin_us, planned,
                     "scale %g: admission says %lld us, dispatch plans %lld us", scale,
                     (long long)(least.run_us + least.margin_us), (long long)planned);
        cr_assert_eq(least.margin_us, r.cfg.dispatch_margin_us);
        cr_assert_eq(least.run_us, (int64_t)ceil(2000.0 * scale), "scale %g", scale);
        /* Ten items: one batch of 8 and one of 2 in turn, the margin once. */
        cr_assert_eq(gw_sched_least(gw_dispatch_sched(r.ds), r.m, SQ_DEV_EMU, 10, &least), 0);
        cr_assert_eq(least.run_us + least.margin_us,
                     pl_dispatch_batch_cost_us(r.ds->batch.core, 0, 8) +
                         pl_dispatch_batch_cost_us(r.ds->batch.core, 0, 2) -
                         r.cfg.dispatch_margin_us,
                     "scale %g", scale);
    }
    cr_assert_eq(gw_sched_least(gw_dispatch_sched(r.ds), r.m, SQ_DEV_CPU, 1, &least), -1,
                 "no cpu profile");
    cr_assert_eq(least.run_us, 0);
    cr_assert_eq(least.margin_us, r.cfg.dispatch_margin_us);
    rig_dispose(&r);
}

/* An ONNX model (status profiling, no profile) with, when not_on_cuda is
 * set, the importer's word that the cuda backend cannot run it. */
static gw_model_t *onnx_model_new(int64_t key, const char *not_on_cuda)
{
    json_t *rec = json_pack(
        "{s:I, s:s, s:i, s:s, s:s, s:s, s:{s:s, s:s, s:[i,i,i,i]}, s:[{s:s, s:s, s:[i,i]}],"
        " s:f, s:i, s:[], s:{}}",
        "id", (json_int_t)key, "name", "pads", "version", 1, "sha256", "abcdef0123456789", "format",
        "onnx", "status", "profiling", "input", "name", "x", "datatype", "FP32", "shape", -1, 3, 4,
        4, "outputs", "name", "y", "datatype", "FP32", "shape", -1, 3, "default_slo_ms", 100.0,
        "max_batch", 8, "profiles", "not_on");
    if (not_on_cuda != NULL)
        json_object_set_new(json_object_get(rec, "not_on"), "cuda", json_string(not_on_cuda));
    gw_model_t *m = gw_model_from_record(rec);
    json_decref(rec);
    return m;
}

static ds_model_t *measure(gw_dispatch_t *ds, gw_model_t *m)
{
    ds_model_t *dm = ds_model_get(ds, m);
    static char file[64] = "onnx";
    dm->blob = sq_bytes_adopt(sq_xmalloc(sizeof(file)), sizeof(file));
    dm->blob_len = sizeof(file);
    dm->blob_state = 2;
    dm->profile_pending = 1;
    ds_start_profile(ds, dm);
    return dm;
}

/* A model whose load a cuda worker refuses while it is to be measured
 * there (its backend cannot run an op, the device's memory is too small,
 * no engine) is measured on a cpu worker instead, not marked failed while
 * a cpu worker could serve it; and a model whose upload said the cuda
 * backend cannot run it is never sent to a cuda worker. (With no kind
 * left, a refusal fails the model as before: stored, which this rig,
 * without a model DB, cannot show.) */
Test(dispatch, a_model_a_cuda_worker_refuses_is_measured_on_a_cpu_worker)
{
    static rig_t r;
    rig_init(&r);
    gw_dispatch_events.up(r.ds, 1, "cuda:0", 1ull << 30);
    gw_dispatch_events.up(r.ds, 2, "cpu:0", 1ull << 30);
    cr_assert_eq(ds_worker_at(r.ds, 1)->kind, SQ_DEV_CUDA);

    gw_model_t *m = onnx_model_new(7, NULL);
    ds_model_t *dm = measure(r.ds, m);
    cr_assert_eq(dm->profile_worker, 1, "measured on the cuda worker first");
    int sent = r.link.frames[SQ_MSG_MODEL_LOAD];
    cr_assert_gt(sent, 0, "its load was sent");
    sq_buf_t b;
    sq_buf_init(&b);
    sq_ipc_error_t e = {.code = SQ_UNSUPPORTED_MODEL};
    snprintf(e.message, sizeof(e.message), "Resize node 'up': mode cubic");
    sq_ipc_error_encode(&b, &e);
    sq_frame_t f = {.type = SQ_MSG_MODEL_FAILED,
                    .id = (uint64_t)m->key,
                    .payload = b.data,
                    .len = (uint32_t)b.len};
    cr_assert_eq(gw_dispatch_events.frame(r.ds, 1, &f), 0);
    cr_assert_eq(dm->profile_worker, 2, "measured on the cpu worker instead");
    cr_assert(dm->refused_kinds & (1u << SQ_DEV_CUDA));
    cr_assert_gt(r.link.frames[SQ_MSG_MODEL_LOAD], sent, "its load went to the cpu worker");
    cr_assert_not(dm->poisoned);
    sq_buf_dispose(&b);

    gw_model_t *pads = onnx_model_new(8, "Conv node 'c1': convolution with asymmetric pads");
    ds_model_t *dp = measure(r.ds, pads);
    cr_assert_eq(dp->profile_worker, -1,
                 "the importer's word: it waits for the busy cpu worker, not the idle cuda one");
    ds_end_profile(r.ds, dm, ds_worker_at(r.ds, 2));
    cr_assert_eq(dp->profile_worker, 2, "measured on the cpu worker once it is free");
    gw_fleet_t fl = {.up = {[SQ_DEV_CPU] = 1, [SQ_DEV_CUDA] = 1}};
    pads->has_profile[SQ_DEV_CUDA] = pads->has_profile[SQ_DEV_CPU] = 1;
    cr_assert_eq(gw_fleet_serving_kind(&fl, pads), SQ_DEV_CPU, "and never served on cuda");
    pads->has_profile[SQ_DEV_CUDA] = pads->has_profile[SQ_DEV_CPU] = 0;
    rig_dispose(&r);
    gw_model_unref(m);
    gw_model_unref(pads);
}
