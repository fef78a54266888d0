/* planner/loop.c driven by squish-sim and by squishd's dispatch-thread code
 * (gateway/dispatch/planning.c on a real dispatcher) with one arrival trace,
 * giving the same plans, routes and splits epoch by epoch. */
#include <criterion/criterion.h>

#include "batcher_int.h"
#include "gw_metrics.h"
#include "gw_catalog.h"
#include "sim.h"

#include <pl_loop.h>
#include <unistd.h>
#include <workload.h>

#include <sq.h>

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- squish-sim and squishd, one trace ----------------------------------- */

/* Model i (1..4) of the workload is record i of squishd: the planner's
 * model ids match. Index 0 is a model no session uses. */
static const char *const model_names[] = {"unused", "a", "b", "det", "cls"};
static const double alpha_ms[] = {1, 2, 1, 4, 1};
static const double beta_ms[] = {1, 5, 3, 6, 2};
#define MAX_BATCH 16
#define NDEVICES 4
#define HORIZON_S 16
#define PIPE_SLO_MS 300.0

static void latency_rows(int m, json_t **batch, json_t **lat)
{
    *batch = json_array();
    *lat = json_array();
    for (int b = 1; b <= MAX_BATCH; b++) {
        json_array_append_new(*batch, json_integer(b));
        json_array_append_new(*lat, json_real(alpha_ms[m] * b + beta_ms[m]));
    }
}

static char *workload_text(void)
{
    json_t *models = json_array();
    for (int m = 0; m < 5; m++) {
        json_t *b, *l;
        latency_rows(m, &b, &l);
        json_array_append_new(models, json_pack("{s:s, s:i, s:{s:o, s:o}}", "name", model_names[m],
                                                "max_batch", MAX_BATCH, "profile", "batch", b,
                                                "latency_ms", l));
    }
    /* a: a rate step at 8 s; b: steady; a detector's crops, two a frame. */
    json_t *w =
        json_pack("{s:i, s:{s:i}, s:o,"
                  " s:[{s:s, s:f, s:{s:s, s:[{s:f, s:f}, {s:f, s:f}]}}, {s:s, s:f, s:f}],"
                  " s:[{s:s, s:f, s:f, s:[{s:s, s:s}, {s:s, s:s, s:s, s:f, s:s}]}]}",
                  "seed", 7, "devices", "count", NDEVICES, "models", models, "sessions", "model",
                  "a", "slo_ms", 100.0, "arrivals", "process", "poisson", "segments", "duration_s",
                  8.0, "rate_rps", 100.0, "duration_s", 8.0, "rate_rps", 400.0, "model", "b",
                  "slo_ms", 50.0, "rate_rps", 200.0, "pipelines", "name", "p", "slo_ms",
                  PIPE_SLO_MS, "rate_rps", 50.0, "stages", "id", "d", "model", "det", "id", "c",
                  "model", "cls", "after", "d", "gamma", 2.0, "gamma_dist", "fixed");
    char *txt = json_dumps(w, 0);
    json_decref(w);
    return txt;
}

/* One epoch as text: when, the plan (devices, shares, unplaced, overflow),
 * each session's routes (model, SLO: workers, targets, overflow) and the
 * split. Two sides that plan alike write the same text. */
typedef struct {
    char *text[64];
    int n;
} epochs_t;

typedef struct {
    int64_t model;
    double slo_ms;
} sess_key_t;

static void append(char **buf, size_t *len, size_t *cap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void append(char **buf, size_t *len, size_t *cap, const char *fmt, ...)
{
    va_list ap;
    for (;;) {
        va_start(ap, fmt);
        int n = vsnprintf(*buf + *len, *cap - *len, fmt, ap);
        va_end(ap);
        if ((size_t)n < *cap - *len) {
            *len += (size_t)n;
            return;
        }
        *cap = *cap * 2 + (size_t)n;
        *buf = realloc(*buf, *cap);
    }
}

static char *epoch_text(int64_t at_us, const pl_loop_t *l, int kind, const sess_key_t *keys,
                        const pl_route_t *const *routes, const int *nroutes, int nsess,
                        const double *budget_ms)
{
    size_t len = 0, cap = 1024;
    char *t = malloc(cap);
    t[0] = '\0';
    const pl_plan_t *p = pl_loop_current(l, kind);
    append(&t, &len, &cap, "t=%lld devices=%d\n", (long long)at_us, p->ndevices);
    for (int i = 0; i < p->ndevices; i++) {
        const pl_device_t *d = &p->devices[i];
        append(&t, &len, &cap, " device %d (worker %d) duty %.3f sat %d:", d->id,
               pl_loop_device_key(l, kind, d->id), d->duty_cycle_us, d->saturated);
        for (int a = 0; a < d->nallocs; a++)
            append(&t, &len, &cap, " [s%d m%d b%d r%.6f]", d->allocs[a].session_id,
                   d->allocs[a].model, d->allocs[a].batch, d->allocs[a].rate_rps);
        append(&t, &len, &cap, "\n");
    }
    for (int u = 0; u < p->nunplaced; u++)
        append(&t, &len, &cap, " unplaced s%d r%.6f why %d\n", p->unplaced[u].session_id,
               p->unplaced[u].rate_rps, p->unplaced[u].reason);
    for (int o = 0; o < p->noverflow; o++)
        append(&t, &len, &cap, " overflow device %d s%d\n", p->overflow[o].device_id,
               p->overflow[o].session_id);
    int n;
    const pl_session_t *ss = pl_loop_planned_sessions(l, kind, &n);
    for (int i = 0; i < n; i++)
        append(&t, &len, &cap, " session %d %s slo %.3f rate %.6f dispersion %.6f\n", ss[i].id,
               ss[i].name, ss[i].slo_us / 1000, ss[i].rate_rps, ss[i].dispersion);
    for (int s = 0; s < nsess; s++) {
        append(&t, &len, &cap, " routes m%lld/%.3f:", (long long)keys[s].model, keys[s].slo_ms);
        for (int k = 0; k < nroutes[s]; k++)
            append(&t, &len, &cap, " w%d/t%d/o%d", routes[s][k].worker, routes[s][k].target_batch,
                   routes[s][k].overflow);
        append(&t, &len, &cap, "\n");
    }
    append(&t, &len, &cap, " split %.6f / %.6f\n", budget_ms[0], budget_ms[1]);
    return t;
}

/* The simulator's side: its epochs, and the budgets and sessions behind
 * them. */
typedef struct {
    epochs_t ep;
    const sim_result_t *res; /* the split, filled before the first epoch */
    sess_key_t keys[8];
    double budget_ms[2];
} sim_side_t;

static void on_sim_epoch(void *ctx, const sim_epoch_t *e)
{
    sim_side_t *s = ctx;
    const pl_route_t *routes[8];
    int nroutes[8];
    for (int i = 0; i < e->nsessions; i++) {
        routes[i] = e->routes + e->route_off[i];
        nroutes[i] = e->route_off[i + 1] - e->route_off[i];
    }
    cr_assert_lt(s->ep.n, 64);
    s->ep.text[s->ep.n++] =
        epoch_text(e->at_us, e->loop, 0, s->keys, routes, nroutes, e->nsessions, s->budget_ms);
}

/* squishd's side: a dispatcher (no worker process, no DB) whose workers
 * load at once, as the simulator's devices. */
typedef struct {
    gw_transport_t base;
} null_link_t;

static int null_send(gw_transport_t *t, int worker, uint16_t type, uint64_t id, const void *payload,
                     uint32_t len, const gw_region_t *regions, int nregions)
{
    (void)t, (void)worker, (void)type, (void)id, (void)payload, (void)len, (void)regions,
        (void)nregions;
    return 0;
}

static int null_send_ref(gw_transport_t *t, int worker, uint16_t type, uint64_t id,
                         sq_bytes_t *bytes, size_t off, uint32_t len)
{
    (void)t, (void)worker, (void)type, (void)id, (void)bytes, (void)off, (void)len;
    return 0;
}

static gw_model_t *record(int m)
{
    json_t *rows, *lat, *sd = json_array();
    latency_rows(m, &rows, &lat);
    for (int b = 1; b <= MAX_BATCH; b++)
        json_array_append_new(sd, json_real(0.0));
    json_t *rec = json_pack(
        "{s:I, s:s, s:i, s:s, s:s, s:s, s:{s:s, s:s, s:[i,i,i,i]}, s:[{s:s, s:s, s:[i,i]}],"
        " s:f, s:i, s:[{s:s, s:o, s:o, s:o}]}",
        "id", (json_int_t)m, "name", model_names[m], "version", 1, "sha256", "00", "format",
        "emulated", "status", "ready", "input", "name", "x", "datatype", "FP32", "shape", -1, 3, 4,
        4, "outputs", "name", "y", "datatype", "FP32", "shape", -1, 10, "default_slo_ms", 100.0,
        "max_batch", MAX_BATCH, "profiles", "device_kind", "emu", "batch", rows, "latency_ms", lat,
        "latency_std_ms", sd);
    cr_assert_not_null(rec);
    gw_model_t *gm = gw_model_from_record(rec);
    json_decref(rec);
    cr_assert(gm->has_profile[SQ_DEV_EMU]);
    return gm;
}

/* Every load the plan sent is done at once; routes follow, moves settle. */
static void loads_done(gw_dispatch_t *ds)
{
    for (int i = 0; i < ds->nworkers; i++) {
        ds_worker_t *w = ds->workers[i];
        for (int k = 0; w != NULL && k < w->nloads; k++)
            if (w->loads[k].state == LOAD_SENT) {
                w->loads[k].state = LOAD_DONE;
                w->loads[k].max_batch = MAX_BATCH;
            }
    }
    ds_plan_loaded(ds, SQ_DEV_EMU);
    for (int i = 0; i < ds->nmodels; i++)
        if (ds->models[i]->active)
            ds_update_routes(ds, ds->models[i]);
}

typedef struct {
    size_t index;
    int64_t at_us;
} arrival_t;

static int arrival_cmp(const void *a, const void *b)
{
    const arrival_t *x = a, *y = b;
    if (x->at_us != y->at_us)
        return x->at_us < y->at_us ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index);
}

/* threaded: squishd's planner thread computes each plan (cfg.plan_thread);
 * the test waits for it within the tick, so epochs land on the same ticks. */
static void trace_alike(int threaded)
{
    /* The simulator: squishd's default epochs (30 s, early at most every
     * 10 s, a scale-up after 1 s), starting cold as squishd does. */
    char *txt = workload_text();
    wl_workload_t w;
    cr_assert_eq(wl_load_string(&w, txt), 0, "%s", w.error);
    free(txt);
    sim_side_t sim = {0};
    sim_opts_t o;
    sim_opts_default(&o);
    o.routing = SIM_ROUTE_PLAN;
    o.epoch_s = 30;
    o.duration_s = HORIZON_S;
    o.plan_cold = 1;
    o.on_epoch = on_sim_epoch;
    o.on_epoch_ctx = &sim;
    /* The split is made before the run's first epoch: take it from a dry
     * run's summary (deterministic, the same split). */
    sim_result_t res;
    {
        sim_opts_t dry = o;
        dry.on_epoch = NULL;
        dry.duration_s = 0.001;
        cr_assert_eq(sim_run(&w, &dry, &res), 0);
        for (int k = 0; k < 2; k++)
            sim.budget_ms[k] = res.pipelines[0].budget_us[k] / 1000.0;
        sim_result_dispose(&res);
    }
    sim.keys[0] = (sess_key_t){1, 100};
    sim.keys[1] = (sess_key_t){2, 50};
    sim.keys[2] = (sess_key_t){3, sim.budget_ms[0]};
    sim.keys[3] = (sess_key_t){4, sim.budget_ms[1]};
    cr_assert_eq(sim_run(&w, &o, &res), 0);
    cr_assert_gt(sim.ep.n, 3, "epochs: the first, scale-ups and the rate step (%d)", sim.ep.n);

    /* squishd: the dispatcher, its models, the pipeline (its gamma of 2
     * measured before), no worker yet. */
    char *argv[] = {"squishd", NULL}, *envp[] = {NULL}, err[256];
    gw_config_action_t action;
    static gw_config_t cfg;
    static gw_server_t srv;
    memset(&srv, 0, sizeof(srv));
    cr_assert_eq(gw_config_parse(&cfg, 1, argv, envp, &action, err, sizeof(err)), 0, "%s", err);
    cfg.dispatch_margin_us = 0; /* the simulator's devices have no overhead */
    cfg.plan_thread = threaded;
    srv.cfg = &cfg;
    srv.metrics = gw_metrics_new();
    srv.registry = gw_registry_new();
    srv.pipelines = gw_pipes_new();
    cr_assert_eq(sq_shm_arena_create(&srv.arena, 1 << 20, 4096), 0);
    null_link_t link = {.base = {.send = null_send, .send_ref = null_send_ref}};
    srv.transport = &link.base;
    sq_loop_t *evloop = sq_loop_new();
    gw_dispatch_deps_t deps = gw_dispatch_deps(&srv, evloop);
    gw_dispatch_t *ds = gw_dispatch_new(&deps);
    /* An emu worker coming (the link's word): its models are servable. */
    int coming[SQ_DEV_KIND_COUNT] = {[SQ_DEV_EMU] = 1};
    int64_t back_at[SQ_DEV_KIND_COUNT] = {INT64_MAX, INT64_MAX, INT64_MAX};
    gw_dispatch_events.coming(ds, coming, back_at);
    srv.dispatch = ds;
    ds_model_t *dm[5] = {0};
    gw_model_t *gm[5] = {0};
    for (int m = 1; m < 5; m++) {
        gm[m] = record(m);
        gw_registry_put(srv.registry, gm[m]); /* the registry's reference */
        dm[m] = ds_model_get(ds, gm[m]);
    }
    json_t *spec =
        json_pack("{s:s, s:f, s:s, s:[{s:s, s:s}, {s:s, s:s, s:{s:s, s:s, s:s}}]}", "name", "p",
                  "slo_ms", PIPE_SLO_MS, "split", "dp", "stages", "id", "d", "model", "det", "id",
                  "c", "model", "cls", "crops_of", "stage", "d", "boxes", "b", "scores", "s");
    gw_pipeline_t *pipe = NULL;
    cr_assert_eq(gw_pipeline_parse(spec, NULL, &pipe, err, sizeof(err)), 0, "%s", err);
    json_decref(spec);
    gw_pipes_put(srv.pipelines, pipe);
    for (int i = 0; i < 8; i++)
        gw_pipeline_fanout(pipe, 1, 2);
    pl_loop_t *loop = ds_plan_loop(ds);
    int64_t t0 = pl_loop_rates_at_us(loop);
    /* The first tick splits the pipeline; then each session's first
     * request activates its model, in the simulator's order. */
    ds_plan_tick(ds, t0);
    double budget_ms[2] = {gw_pipeline_budget_ms(pipe, 0), gw_pipeline_budget_ms(pipe, 1)};
    for (int k = 0; k < 2; k++)
        cr_assert_float_eq(budget_ms[k], sim.budget_ms[k], 1e-9, "stage %d's budget", k);
    gw_item_t first[4] = {{.ask.slo_ms = 100},
                          {.ask.slo_ms = 50},
                          {.ask.slo_ms = budget_ms[0],
                           .pipe.pipeline = pipe,
                           .pipe.stage = 0,
                           .pipe.query_slo_ms = PIPE_SLO_MS},
                          {.ask.slo_ms = budget_ms[1],
                           .pipe.pipeline = pipe,
                           .pipe.stage = 1,
                           .pipe.query_slo_ms = PIPE_SLO_MS}};
    for (int s = 0; s < 4; s++) {
        ds_model_t *m = dm[s + 1];
        if (!m->active) { /* as serving_record does */
            m->kind = SQ_DEV_EMU;
            m->active = 1;
            /* On the test's clock, as every tick below: an epoch begun on
             * the real one came a few ms after t0, and on a loaded box a
             * whole tick later than the simulator's. */
            ds_plan_activate(ds, m, gw_slo_bucket_ms(first[s].ask.slo_ms), &first[s], t0);
        }
    }
    for (int i = 0; i < NDEVICES; i++) {
        char dev[16];
        snprintf(dev, sizeof(dev), "emu:%d", i);
        gw_dispatch_events.up(ds, i, dev, 1ull << 30);
    }
    for (int waited_ms = 0; ds_plan_pending(ds) > 0; waited_ms++) {
        cr_assert_lt(waited_ms, 20000, "the planner thread answers");
        usleep(1000);
        ds_plan_collect(ds);
    }

    /* The trace: every request and item the simulation saw, in time order;
     * squishd's dispatch thread ticks every 50 ms. */
    arrival_t *arr = malloc(sizeof(*arr) * (res.nrequests + 1));
    for (size_t i = 0; i < res.nrequests; i++)
        arr[i] = (arrival_t){.index = i, .at_us = res.requests[i].arrival_us};
    qsort(arr, res.nrequests, sizeof(*arr), arrival_cmp);
    epochs_t live = {0};
    long long epochs = pl_loop_epochs(loop);
    size_t next = 0;
    int64_t horizon_us = (int64_t)HORIZON_S * 1000000;
    for (int64_t t = 0; t < horizon_us; t += 50000) {
        for (; next < res.nrequests && arr[next].at_us <= t; next++) {
            const sim_request_t *q = &res.requests[arr[next].index];
            if (q->query < 0) {
                gw_item_t it = {.ask.slo_ms = q->session == 0 ? 100 : 50};
                ds_plan_arrival(ds, dm[q->session + 1], gw_slo_bucket_ms(it.ask.slo_ms), &it);
                continue;
            }
            gw_item_t it = {.ask.slo_ms = budget_ms[q->stage],
                            .pipe.pipeline = pipe,
                            .pipe.stage = q->stage,
                            .pipe.query_slo_ms = PIPE_SLO_MS};
            if (q->stage == 0)
                gw_pipeline_arrival(pipe);
            else
                gw_pipeline_fanout(pipe, 1, 2);
            ds_plan_arrival(ds, dm[q->stage == 0 ? 3 : 4], gw_slo_bucket_ms(it.ask.slo_ms), &it);
        }
        ds_plan_tick(ds, t0 + t);
        for (int waited_ms = 0; ds_plan_pending(ds) > 0; waited_ms++) {
            cr_assert_lt(waited_ms, 20000, "the planner thread answers");
            usleep(1000);
            ds_plan_collect(ds);
        }
        loads_done(ds);
        if (pl_loop_epochs(loop) == epochs)
            continue;
        cr_assert_eq(pl_loop_epochs(loop), epochs + 1, "one epoch a tick at %lld", (long long)t);
        epochs = pl_loop_epochs(loop);
        pl_route_t routes[4][16];
        const pl_route_t *rp[4];
        int nroutes[4];
        for (int s = 0; s < 4; s++) {
            ds_session_t dsess = {.model = dm[s + 1],
                                  .bucket_ms = gw_slo_bucket_ms(sim.keys[s].slo_ms)};
            int holders[64];
            int nholders = ds_plan_holders(ds, dm[s + 1], holders);
            nroutes[s] = ds_plan_routes(ds, &dsess, holders, nholders, routes[s], 16);
            rp[s] = routes[s];
        }
        double now_budget[2] = {gw_pipeline_budget_ms(pipe, 0), gw_pipeline_budget_ms(pipe, 1)};
        cr_assert_lt(live.n, 64);
        live.text[live.n++] = epoch_text(t, loop, SQ_DEV_EMU, sim.keys, rp, nroutes, 4, now_budget);
    }

    cr_assert_eq(live.n, sim.ep.n, "squishd planned %d epochs, the simulator %d", live.n, sim.ep.n);
    for (int e = 0; e < live.n; e++)
        cr_assert_str_eq(live.text[e], sim.ep.text[e], "epoch %d:\nsquishd:\n%s\nsimulator:\n%s", e,
                         live.text[e], sim.ep.text[e]);
    for (int e = 0; e < live.n; e++) {
        free(live.text[e]);
        free(sim.ep.text[e]);
    }
    free(arr);
    gw_dispatch_free(ds);
    gw_pipes_free(srv.pipelines);
    gw_registry_free(srv.registry);
    sq_loop_free(evloop);
    sq_shm_arena_free(srv.arena);
    gw_metrics_free(srv.metrics);
    sim_result_dispose(&res);
    wl_workload_dispose(&w);
}

Test(loop, squish_sim_and_squishd_plan_route_and_split_alike_epoch_by_epoch)
{
    trace_alike(0);
}

Test(loop, squishd_plans_alike_on_its_planner_thread)
{
    trace_alike(1);
}
