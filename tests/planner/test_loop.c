/* planner/loop.c: the planning loop's rules one by one, and the loop driven
 * by squish-sim and by squishd's dispatch-thread code (gateway/dispatch/planning.c
 * on a real dispatcher) with one arrival trace, giving the same plans,
 * routes and splits epoch by epoch. */
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

/* ---- the rules ---------------------------------------------------------- */

static pl_profile_t linear(double alpha_ms, double beta_ms, int max_batch)
{
    pl_profile_t p;
    pl_profile_init_linear(&p, alpha_ms * 1000, beta_ms * 1000, max_batch);
    return p;
}

static pl_loop_t *one_model_loop(pl_profile_t *prof, int64_t now)
{
    pl_loop_config_t c;
    pl_loop_config_default(&c);
    c.slo_bucket_ms = pl_loop_slo_bucket_ms;
    pl_loop_t *l = pl_loop_new(&c, now);
    pl_loop_model_set(l, 7,
                      &(pl_loop_model_t){.kind = 0, .profile = prof, .name = "m", .active = 1});
    return l;
}

static double rate_of(const pl_loop_t *l, int64_t model, double slo_ms)
{
    pl_loop_session_info_t si;
    int id = pl_loop_session((pl_loop_t *)l, model, slo_ms, 0);
    cr_assert_geq(id, 0);
    pl_loop_session_by_id(l, id, &si);
    return si.rate_rps;
}

Test(loop, a_rate_goes_up_with_the_last_second_and_down_over_tau)
{
    pl_profile_t prof = linear(1, 5, 32);
    pl_loop_t *l = one_model_loop(&prof, 0);
    /* 10 s at 100 req/s, then one second at 400: planned at 400 at once. */
    for (int s = 1; s <= 10; s++) {
        pl_loop_arrivals(l, 7, 100, 100);
        pl_loop_advance(l, s * 1000000LL);
    }
    double before = rate_of(l, 7, 100);
    cr_assert(before > 60 && before <= 100, "EWMA after 10 s at 100: %f", before);
    pl_loop_arrivals(l, 7, 100, 400);
    pl_loop_advance(l, 11000000);
    cr_assert_float_eq(rate_of(l, 7, 100), 400, 1e-9);
    /* Then silence: the EWMA comes down over tau, not at once. */
    pl_loop_advance(l, 12000000);
    double after = rate_of(l, 7, 100);
    cr_assert(after > 0.8 * before && after < 400, "one quiet second later: %f", after);
    pl_loop_free(l);
    pl_profile_dispose(&prof);
}

Test(loop, a_session_is_planned_at_the_least_slo_of_its_requests_not_its_bucket)
{
    /* l(1) = 11 ms: 2 l(1) fits 27 ms but not bucket 25's 25 ms. */
    pl_profile_t prof = linear(1, 10, 8);
    pl_loop_t *l = one_model_loop(&prof, 0);
    cr_assert_float_eq(pl_loop_slo_bucket_ms(27), 25, 1e-9);
    pl_loop_arrivals(l, 7, 27, 20);
    cr_assert_eq(pl_loop_advance(l, 1000000), 0u, "no plan yet, nothing due");
    int keys[2] = {0, 1};
    cr_assert_eq(pl_loop_plan(l, 0, &(pl_loop_devices_t){.n = 2, .keys = keys}, 1000000), 0);
    const pl_plan_t *plan = pl_loop_current(l, 0);
    cr_assert_eq(plan->nunplaced, 0, "planned at 27 ms it has a batch");
    cr_assert_eq(plan->ndevices, 1);
    int n;
    const pl_session_t *ss = pl_loop_planned_sessions(l, 0, &n);
    cr_assert_eq(n, 1);
    cr_assert_float_eq(ss[0].slo_us, 27000, 1e-6);
    cr_assert_str_eq(ss[0].name, "m");
    pl_loop_free(l);
    pl_profile_dispose(&prof);
}

Test(loop, an_idle_session_beside_a_busy_one_of_its_model_is_not_planned)
{
    pl_profile_t prof = linear(1, 5, 32);
    pl_loop_t *l = one_model_loop(&prof, 0);
    pl_loop_session(l, 7, 400, 1);
    pl_loop_arrivals(l, 7, 100, 50);
    pl_loop_advance(l, 1000000);
    int keys[2] = {0, 1};
    cr_assert_eq(pl_loop_plan(l, 0, &(pl_loop_devices_t){.n = 2, .keys = keys}, 1000000), 0);
    int n;
    const pl_session_t *ss = pl_loop_planned_sessions(l, 0, &n);
    cr_assert_eq(n, 1, "the 400 ms session without traffic stays out");
    cr_assert_float_eq(ss[0].slo_us, 100000, 1e-6);
    pl_loop_free(l);
    pl_profile_dispose(&prof);
}

Test(loop, a_stage_rate_moves_with_its_budget_at_once_and_re_plans)
{
    pl_profile_t det = linear(4, 6, 32), cls = linear(1, 2, 32);
    pl_loop_config_t c;
    pl_loop_config_default(&c);
    c.slo_bucket_ms = pl_loop_slo_bucket_ms;
    pl_loop_t *l = pl_loop_new(&c, 0);
    pl_loop_model_set(l, 1, &(pl_loop_model_t){.profile = &det, .name = "det", .active = 1});
    pl_loop_model_set(l, 2, &(pl_loop_model_t){.profile = &cls, .name = "cls", .active = 1});
    pl_loop_stage_t st[2] = {{.model = 1, .parent = -1, .budget_ms = 200},
                             {.model = 2, .parent = 0, .gamma = 2, .budget_ms = 100}};
    pl_loop_pipeline_set(l, 9, 300, st, 2);
    pl_loop_stage_arrivals(l, 9, 1, 300, 2, 200);
    pl_loop_advance(l, 1000000);
    cr_assert_float_eq(rate_of(l, 2, 100), 200, 1e-9);
    int keys[2] = {0, 1};
    cr_assert_eq(pl_loop_plan(l, 0, &(pl_loop_devices_t){.n = 2, .keys = keys}, 1000000), 0);
    cr_assert_eq(pl_loop_dirty(l), 0u);
    /* The split moves the classifier to 150 ms: all of its rate there. */
    st[0].budget_ms = 150;
    st[1].budget_ms = 150;
    pl_loop_pipeline_set(l, 9, 300, st, 2);
    cr_assert_float_eq(rate_of(l, 2, 150), 200, 1e-9);
    cr_assert_float_eq(rate_of(l, 2, 100), 0, 1e-9);
    cr_assert_eq(pl_loop_dirty(l), 1u);
    cr_assert_str_eq(pl_loop_reason(l, 0), "pipeline split moved");
    pl_loop_free(l);
    pl_profile_dispose(&det);
    pl_profile_dispose(&cls);
}

Test(loop, an_unplaced_session_falls_back_to_the_devices_holding_its_model)
{
    pl_profile_t prof = linear(1, 5, 32);
    pl_loop_t *l = one_model_loop(&prof, 0);
    pl_loop_arrivals(l, 7, 100, 10);
    pl_loop_advance(l, 1000000);
    pl_route_t r[8];
    int holders[2] = {3, 5}, fell = 0;
    pl_loop_route_env_t env = {.holders = holders, .nholders = 2, .used_fallback = &fell};
    int n = pl_loop_routes(l, 7, 100, &env, r, 8);
    cr_assert_eq(n, 2, "no plan yet: the holders");
    cr_assert_eq(r[0].worker, 3);
    cr_assert_eq(r[1].worker, 5);
    cr_assert_eq(fell, 1);
    int keys[1] = {5};
    cr_assert_eq(pl_loop_plan(l, 0, &(pl_loop_devices_t){.n = 1, .keys = keys}, 1000000), 0);
    n = pl_loop_routes(l, 7, 100, &env, r, 8);
    cr_assert_eq(n, 1, "planned: its device, named by its key");
    cr_assert_eq(r[0].worker, 5);
    cr_assert_eq(r[0].target_batch, pl_loop_current(l, 0)->devices[0].allocs[0].batch);
    cr_assert_eq(fell, 0);
    int held[4];
    cr_assert_eq(pl_loop_holders(l, 0, 7, held, 4), 1);
    cr_assert_eq(held[0], 5);
    pl_loop_free(l);
    pl_profile_dispose(&prof);
}

Test(loop, the_even_split_gives_each_stage_its_longest_paths_share)
{
    /* a -> b -> c and a -> d: squishd's old even split gave d 100 ms too
     * (the SLO over the deepest path); d's path has two stages. */
    int pa = 0, pb = 1;
    pl_stage_t st[4] = {{.nparents = 0},
                        {.nparents = 1, .parents = &pa},
                        {.nparents = 1, .parents = &pb},
                        {.nparents = 1, .parents = &pa}};
    double b[4];
    cr_assert_eq(pl_query_even_budgets(st, 4, 300000, b), 0);
    cr_assert_float_eq(b[0], 100000, 1e-6);
    cr_assert_float_eq(b[1], 100000, 1e-6);
    cr_assert_float_eq(b[2], 100000, 1e-6);
    cr_assert_float_eq(b[3], 150000, 1e-6);
}

Test(loop, the_split_floors_the_rate_and_steps_at_most_a_thousandth_of_the_slo)
{
    pl_profile_t det = linear(23.778, 9.729, 128), cls = linear(1.964, 8.771, 128);
    int p0 = 0;
    double g = 1;
    pl_stage_t st[2] = {{.profile = &det},
                        {.profile = &cls, .nparents = 1, .parents = &p0, .gamma = &g}};
    pl_loop_split_in_t in = {.stages = st, .nstages = 2, .slo_us = 300000, .epsilon_us = 1000};
    double at0[2], at1[2], at100[2], at200[2];
    pl_loop_split_why_t why;
    int missing;
    cr_assert_eq(pl_loop_split(&in, at0, &why, &missing, NULL), 0);
    cr_assert_eq(why, PL_LOOP_SPLIT_DP);
    in.rate_qps = 1;
    pl_loop_split(&in, at1, &why, &missing, NULL);
    in.rate_qps = 100;
    pl_loop_split(&in, at100, &why, &missing, NULL);
    in.rate_qps = 200;
    pl_loop_split(&in, at200, &why, &missing, NULL);
    for (int k = 0; k < 2; k++) {
        cr_assert_float_eq(at0[k], at1[k], 1e-9, "rate 0 plans as 1 q/s");
        /* Linear profiles: the cheapest split is the same at any rate, and
         * at several devices' load (2.4 and 4.8 for the detector) the
         * split keeps to it. */
        cr_assert_float_eq(at100[k], at200[k], 1e-6, "the split does not move with the rate");
    }
    /* At 1 q/s, on the one device any split needs, each stage gets its
     * floor (2 l(1)) and an equal share of the rest. */
    double slack_det = at1[0] - 2 * pl_latency_us(&det, 1, 0),
           slack_cls = at1[1] - 2 * pl_latency_us(&cls, 1, 0);
    cr_assert_float_eq(slack_det, slack_cls, 1e-6, "slack %f and %f us", slack_det, slack_cls);
    cr_assert(fabs(at1[0] - at100[0]) > 1000, "the cheapest split is another");
    /* A 0.3 ms step at 300 ms: a budget off the 1 ms grid. */
    cr_assert(fabs(at100[0] / 1000 - round(at100[0] / 1000)) > 1e-6, "detect %f us", at100[0]);
    /* A missing profile: the even split, and no result. */
    st[1].profile = NULL;
    pl_query_result_t res;
    cr_assert_eq(pl_loop_split(&in, at0, &why, &missing, &res), SQ_DEADLINE);
    cr_assert_eq(why, PL_LOOP_SPLIT_EVEN_NO_PROFILE);
    cr_assert_eq(missing, 1);
    cr_assert_float_eq(at0[0], 150000, 1e-6);
    pl_profile_dispose(&det);
    pl_profile_dispose(&cls);
}

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

/* ---- an epoch's plan on another thread ---------------------------------- */

static void plan_assert_eq(const pl_plan_t *a, const pl_plan_t *b)
{
    cr_assert_eq(a->ndevices, b->ndevices);
    for (int i = 0; i < a->ndevices; i++) {
        const pl_device_t *x = &a->devices[i], *y = &b->devices[i];
        cr_assert_eq(x->id, y->id);
        cr_assert_eq(x->saturated, y->saturated);
        cr_assert(x->duty_cycle_us == y->duty_cycle_us && x->occupancy == y->occupancy &&
                  x->memory_bytes == y->memory_bytes && x->rtt_us == y->rtt_us &&
                  x->bytes_per_us == y->bytes_per_us);
        cr_assert_eq(x->nallocs, y->nallocs);
        for (int k = 0; k < x->nallocs; k++) {
            const pl_alloc_t *p = &x->allocs[k], *q = &y->allocs[k];
            cr_assert(p->session == q->session && p->session_id == q->session_id &&
                      p->model == q->model && p->batch == q->batch &&
                      p->latency_us == q->latency_us && p->transfer_us == q->transfer_us &&
                      p->rate_rps == q->rate_rps);
        }
    }
    cr_assert_eq(a->nunplaced, b->nunplaced);
    for (int u = 0; u < a->nunplaced; u++)
        cr_assert(a->unplaced[u].session == b->unplaced[u].session &&
                  a->unplaced[u].session_id == b->unplaced[u].session_id &&
                  a->unplaced[u].rate_rps == b->unplaced[u].rate_rps &&
                  a->unplaced[u].reason == b->unplaced[u].reason);
    cr_assert(a->lower_bound_devices == b->lower_bound_devices);
    cr_assert(a->moved == b->moved && a->evicted == b->evicted && a->released == b->released);
    cr_assert_eq(a->noverflow, b->noverflow);
    for (int o = 0; o < a->noverflow; o++)
        cr_assert(a->overflow[o].device_id == b->overflow[o].device_id &&
                  a->overflow[o].session == b->overflow[o].session &&
                  a->overflow[o].session_id == b->overflow[o].session_id &&
                  a->overflow[o].model == b->overflow[o].model);
}

static void loops_assert_eq(const pl_loop_t *a, const pl_loop_t *b, int kind)
{
    cr_assert_eq(pl_loop_epochs(a), pl_loop_epochs(b));
    plan_assert_eq(pl_loop_current(a, kind), pl_loop_current(b, kind));
    for (int d = 0; d < pl_loop_current(a, kind)->ndevices + 2; d++)
        cr_assert_eq(pl_loop_device_key(a, kind, d), pl_loop_device_key(b, kind, d));
    int na, nb;
    const pl_session_t *sa = pl_loop_planned_sessions(a, kind, &na);
    const pl_session_t *sb = pl_loop_planned_sessions(b, kind, &nb);
    cr_assert_eq(na, nb);
    for (int i = 0; i < na; i++) {
        cr_assert(sa[i].id == sb[i].id && sa[i].model == sb[i].model &&
                  sa[i].slo_us == sb[i].slo_us && sa[i].rate_rps == sb[i].rate_rps &&
                  sa[i].item_bytes == sb[i].item_bytes && sa[i].dispersion == sb[i].dispersion);
        cr_assert_str_eq(sa[i].name, sb[i].name);
        cr_assert(pl_latency_us(sa[i].profile, 1, 0) == pl_latency_us(sb[i].profile, 1, 0));
    }
}

/* Models 1..4 (kinds 0, 0, 0, 1), each at two SLOs; names and profiles
 * on the heap, so that ASan sees a job reading them after they go. */
typedef struct {
    pl_profile_t *prof[5];
    char *name[5];
} models_t;

static pl_loop_t *multi_loop(models_t *m)
{
    pl_loop_config_t c;
    pl_loop_config_default(&c);
    c.slo_bucket_ms = pl_loop_slo_bucket_ms;
    c.nkinds = 2;
    pl_loop_t *l = pl_loop_new(&c, 0);
    for (int k = 1; k <= 4; k++) {
        m->prof[k] = sq_xmalloc(sizeof(pl_profile_t));
        *m->prof[k] = linear(0.5 * k, 2 + k, 32);
        char buf[16];
        snprintf(buf, sizeof(buf), "model-%d", k);
        m->name[k] = sq_xstrdup(buf);
        pl_loop_model_set(l, k,
                          &(pl_loop_model_t){.kind = k == 4,
                                             .profile = m->prof[k],
                                             .name = m->name[k],
                                             .item_bytes = 1000,
                                             .active = 1});
    }
    for (int s = 1; s <= 3; s++) {
        for (int k = 1; k <= 4; k++) {
            pl_loop_arrivals(l, k, 100, 40.0 * k * s);
            pl_loop_arrivals(l, k, 400, 300.0 / k);
        }
        pl_loop_advance(l, s * 1000000LL);
    }
    return l;
}

static void models_free(models_t *m)
{
    for (int k = 1; k <= 4; k++) {
        if (m->prof[k] != NULL)
            pl_profile_dispose(m->prof[k]);
        free(m->prof[k]);
        free(m->name[k]);
        m->prof[k] = NULL;
        m->name[k] = NULL;
    }
}

Test(loop, begin_run_finish_gives_the_plan_pl_loop_plan_gives)
{
    models_t ma = {0}, mb = {0};
    pl_loop_t *a = multi_loop(&ma), *b = multi_loop(&mb);
    int keys1[6] = {10, 11, 12, 13, 14, 15};
    pl_link_t links[6] = {{0, 0}, {0, 0}, {100, 1000}, {0, 0}, {200, 500}, {0, 0}};
    pl_loop_devices_t d1 = {.n = 6, .keys = keys1, .links = links, .nlinks = 6};
    cr_assert_eq(pl_loop_plan(a, 0, &d1, 3000000), 0);
    int rc;
    pl_loop_job_t *j = pl_loop_plan_begin(b, 0, &d1, 3000000, &rc);
    cr_assert_not_null(j);
    pl_loop_job_run(j);
    cr_assert_eq(pl_loop_plan_finish(b, j), 0);
    loops_assert_eq(a, b, 0);
    /* An incremental epoch on other devices (one gone, one new), kind 1
     * uncapped. */
    for (int k = 1; k <= 4; k++) {
        pl_loop_arrivals(a, k, 100, 90.0 * k);
        pl_loop_arrivals(b, k, 100, 90.0 * k);
    }
    pl_loop_advance(a, 4000000);
    pl_loop_advance(b, 4000000);
    int keys2[6] = {15, 11, 16, 10, 13, 12};
    pl_loop_devices_t d2 = {.n = 6, .keys = keys2};
    cr_assert_eq(pl_loop_plan(a, 0, &d2, 4000000), 0);
    j = pl_loop_plan_begin(b, 0, &d2, 4000000, &rc);
    pl_loop_job_run(j);
    cr_assert_eq(pl_loop_plan_finish(b, j), 0);
    loops_assert_eq(a, b, 0);
    pl_loop_devices_t un = {.uncapped = 1};
    cr_assert_eq(pl_loop_plan(a, 1, &un, 4000000), 0);
    j = pl_loop_plan_begin(b, 1, &un, 4000000, &rc);
    cr_assert_eq(pl_loop_plan_finish(b, j), 0, "finish runs a job not run");
    loops_assert_eq(a, b, 1);
    /* No device: 1 and no job, as pl_loop_plan. */
    pl_loop_devices_t none = {.n = 0};
    cr_assert_eq(pl_loop_plan(a, 0, &none, 5000000), 1);
    cr_assert_null(pl_loop_plan_begin(b, 0, &none, 5000000, &rc));
    cr_assert_eq(rc, 1);
    loops_assert_eq(a, b, 0);
    pl_loop_free(a);
    pl_loop_free(b);
    models_free(&ma);
    models_free(&mb);
}

static void *run_job(void *j)
{
    pl_loop_job_run(j);
    return NULL;
}

Test(loop, a_job_runs_on_a_thread_while_the_loop_changes)
{
    models_t ma = {0}, mb = {0};
    pl_loop_t *a = multi_loop(&ma), *b = multi_loop(&mb);
    int *keys = sq_xmalloc(sizeof(int) * 4);
    pl_link_t *links = sq_xmalloc(sizeof(pl_link_t) * 4);
    for (int i = 0; i < 4; i++) {
        keys[i] = 20 + i;
        links[i] = (pl_link_t){.rtt_us = 50.0 * i, .bytes_per_us = 1000};
    }
    pl_loop_devices_t d = {.n = 4, .keys = keys, .links = links, .nlinks = 4};
    /* A first plan in force: the job plans incrementally from it. */
    cr_assert_eq(pl_loop_plan(a, 0, &d, 3000000), 0);
    cr_assert_eq(pl_loop_plan(b, 0, &d, 3000000), 0);
    for (int k = 1; k <= 4; k++) {
        pl_loop_arrivals(a, k, 100, 60.0 * k);
        pl_loop_arrivals(b, k, 100, 60.0 * k);
    }
    pl_loop_advance(a, 4000000);
    pl_loop_advance(b, 4000000);
    /* a: the plan of the begin-time loop, on one thread. */
    cr_assert_eq(pl_loop_plan(a, 0, &d, 4000000), 0);
    int rc;
    pl_loop_job_t *j = pl_loop_plan_begin(b, 0, &d, 4000000, &rc);
    cr_assert_not_null(j);
    /* The devices, the models' profiles and names go while it runs. */
    free(keys);
    free(links);
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, run_job, j), 0);
    pl_loop_model_forget(b, 2);
    pl_profile_dispose(mb.prof[2]);
    free(mb.prof[2]);
    free(mb.name[2]);
    mb.prof[2] = NULL;
    mb.name[2] = NULL;
    pl_profile_t *np = sq_xmalloc(sizeof(*np));
    *np = linear(3, 9, 16);
    char *nn = sq_xstrdup("model-1-again");
    pl_loop_model_set(b, 1, &(pl_loop_model_t){.kind = 0, .profile = np, .name = nn, .active = 1});
    pl_profile_dispose(mb.prof[1]);
    free(mb.prof[1]);
    free(mb.name[1]);
    mb.prof[1] = np;
    mb.name[1] = nn;
    for (int s = 0; s < 200; s++) {
        pl_loop_arrivals(b, 1 + s % 4, 50 + s, 3);
        pl_loop_seed(b, 5 + s % 7, 100, 10, 1);
    }
    pl_loop_advance(b, 5000000);
    pl_loop_devices_t un = {.uncapped = 1};
    cr_assert_eq(pl_loop_plan(b, 1, &un, 5000000), 0, "another kind plans meanwhile");
    cr_assert_eq(pthread_join(t, NULL), 0);
    cr_assert_eq(pl_loop_plan_finish(b, j), 0);
    /* The plan of the begin-time snapshot, its sessions' names and
     * profiles the loop's own copies. */
    plan_assert_eq(pl_loop_current(a, 0), pl_loop_current(b, 0));
    int na, nb;
    const pl_session_t *sa = pl_loop_planned_sessions(a, 0, &na);
    const pl_session_t *sb = pl_loop_planned_sessions(b, 0, &nb);
    cr_assert_eq(na, nb);
    for (int i = 0; i < na; i++) {
        cr_assert(sa[i].id == sb[i].id && sa[i].rate_rps == sb[i].rate_rps);
        cr_assert_str_eq(sb[i].name, sa[i].name, "the name at begin, not the one set since");
        cr_assert(pl_latency_us(sb[i].profile, 4, 0) == pl_latency_us(sa[i].profile, 4, 0));
    }
    for (int i = 0; i < 4; i++)
        cr_assert_eq(pl_loop_device_key(b, 0, i), 20 + i);
    cr_assert_eq(pl_loop_epochs(b), pl_loop_epochs(a) + 1, "kind 1's epoch too");
    pl_loop_free(a);
    pl_loop_free(b);
    models_free(&ma);
    models_free(&mb);
}

Test(loop, a_second_job_for_a_kind_in_flight_is_refused)
{
    models_t m = {0};
    pl_loop_t *l = multi_loop(&m);
    int keys[3] = {1, 2, 3};
    pl_loop_devices_t d = {.n = 3, .keys = keys};
    pl_loop_devices_t un = {.uncapped = 1};
    int rc;
    pl_loop_job_t *j0 = pl_loop_plan_begin(l, 0, &d, 3000000, &rc);
    cr_assert_not_null(j0);
    cr_assert_null(pl_loop_plan_begin(l, 0, &d, 3000000, &rc));
    cr_assert_eq(rc, SQ_EXISTS);
    cr_assert_eq(pl_loop_plan(l, 0, &d, 3000000), SQ_EXISTS);
    pl_loop_job_t *j1 = pl_loop_plan_begin(l, 1, &un, 3000000, &rc);
    cr_assert_not_null(j1, "another kind's job may be in flight");
    pl_loop_job_run(j0);
    cr_assert_null(pl_loop_plan_begin(l, 0, &d, 3000000, &rc), "run, not finished");
    cr_assert_eq(pl_loop_plan_finish(l, j0), 0);
    j0 = pl_loop_plan_begin(l, 0, &d, 3500000, &rc);
    cr_assert_not_null(j0, "finished: a next job may begin");
    /* Abandoned: freed unfinished, the kind free again and dirty. */
    pl_loop_job_free(l, j1);
    cr_assert(pl_loop_dirty(l) & 2u);
    cr_assert_null(pl_loop_current(l, 1));
    j1 = pl_loop_plan_begin(l, 1, &un, 3500000, &rc);
    cr_assert_not_null(j1);
    pl_loop_job_run(j1);
    cr_assert_eq(pl_loop_plan_finish(l, j1), 0);
    cr_assert_eq(pl_loop_epochs(l), 2);
    /* A job outliving its loop (shutdown). */
    pl_loop_free(l);
    pl_loop_job_run(j0);
    pl_loop_job_free(NULL, j0);
    models_free(&m);
}
