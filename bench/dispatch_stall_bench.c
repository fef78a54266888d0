/* squish-dispatch-stall-bench: how long squishd's dispatch thread stops
 * while an epoch plans many sessions, with the plan computed on the dispatch
 * thread (--plan-thread 0) and on the planner thread (--plan-thread 1).
 *
 * It runs squishd's own dispatch-thread code (gateway/dispatch: the planning
 * loop's shell, its epochs, loads, routes and reports) on a dispatcher with
 * no worker processes (a link that drops what it is sent, workers announced
 * up) and a real model DB (a temporary SQLite file, its own thread, as in
 * squishd: the plan reports are rendered and stored there): MODELS emulated
 * models, each with dispatcher and planner sessions at SLOS SLO buckets
 * (10,000 sessions at 400 x 25), WORKERS emu workers, steady arrivals. The
 * ticks come every 50 ms as in squishd; with the planner thread, the slices
 * of an apply run between them as squishd's loop runs them between its
 * events. Each tick's and each slice's time on the calling thread is a time
 * the dispatch thread could not spend on batches: the longest is the stall.
 * Prints one JSON object per mode. Usage: squish-dispatch-stall-bench [MODELS [SLOS
 * [WORKERS [SECONDS [MODE]]]]], MODE 0 or 1 for one mode only (profiling). */
#include "bench_util.h"
#include "gw_catalog.h"
#include "batcher_int.h"
#include "gw_metrics.h"

#include <pl_loop.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_BATCH 32
#define TICK_US 50000

static const double buckets_ms[] = {5,   10,   15,   20,   25,   30,   40,    50,    60,
                                    75,  100,  125,  150,  200,  250,  300,   400,   500,
                                    750, 1000, 1500, 2000, 3000, 5000, 10000, 30000, 60000};

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

/* An emulated model: l(b) = alpha b + beta, alpha 0.5-3 ms, beta 2-10 ms. */
static gw_model_t *record(int m)
{
    double alpha = 0.5 + 2.5 * (double)((m * 7919) % 101) / 100.0;
    double beta = 2.0 + 8.0 * (double)((m * 104729) % 97) / 96.0;
    json_t *rows = json_array(), *lat = json_array(), *sd = json_array();
    for (int b = 1; b <= MAX_BATCH; b++) {
        json_array_append_new(rows, json_integer(b));
        json_array_append_new(lat, json_real(alpha * b + beta));
        json_array_append_new(sd, json_real(0.0));
    }
    char name[32];
    snprintf(name, sizeof(name), "m%d", m);
    json_t *rec = json_pack(
        "{s:I, s:s, s:i, s:s, s:s, s:s, s:{s:s, s:s, s:[i,i,i,i]}, s:[{s:s, s:s, s:[i,i]}],"
        " s:f, s:i, s:[{s:s, s:o, s:o, s:o}]}",
        "id", (json_int_t)(m + 1), "name", name, "version", 1, "sha256", "00", "format", "emulated",
        "status", "ready", "input", "name", "x", "datatype", "FP32", "shape", -1, 3, 4, 4,
        "outputs", "name", "y", "datatype", "FP32", "shape", -1, 10, "default_slo_ms", 100.0,
        "max_batch", MAX_BATCH, "profiles", "device_kind", "emu", "batch", rows, "latency_ms", lat,
        "latency_std_ms", sd);
    gw_model_t *gm = gw_model_from_record(rec);
    json_decref(rec);
    return gm;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void run(int threaded, int nmodels, int nslos, int nworkers, int seconds)
{
    char *argv[] = {"squishd", NULL}, *envp[] = {NULL}, err[256];
    gw_config_action_t action;
    static gw_config_t cfg;
    static gw_server_t srv;
    memset(&srv, 0, sizeof(srv));
    if (gw_config_parse(&cfg, 1, argv, envp, &action, err, sizeof(err)) != 0) {
        fprintf(stderr, "%s\n", err);
        exit(1);
    }
    cfg.plan_thread = threaded;
    cfg.log_level = SQ_LOG_WARN;
    char db_path[] = "/tmp/squish-stall-XXXXXX";
    int fd = mkstemp(db_path);
    if (fd < 0)
        exit(1);
    close(fd);
    snprintf(cfg.db_path, sizeof(cfg.db_path), "%s", db_path);
    sq_log_set_level(SQ_LOG_WARN);
    srv.cfg = &cfg;
    srv.metrics = gw_metrics_new();
    srv.registry = gw_registry_new();
    srv.pipelines = gw_pipes_new();
    if (sq_shm_arena_create(&srv.arena, 1 << 20, 4096) != 0)
        exit(1);
    gw_db_deps_t db_deps = gw_db_deps(&srv);
    if (gw_db_start(&db_deps, &srv.db, err, sizeof(err)) != 0) {
        fprintf(stderr, "%s\n", err);
        exit(1);
    }
    null_link_t link = {.base = {.send = null_send, .send_ref = null_send_ref}};
    srv.transport = &link.base;
    sq_loop_t *evloop = sq_loop_new();
    gw_dispatch_deps_t deps = gw_dispatch_deps(&srv, evloop);
    gw_dispatch_t *ds = gw_dispatch_new(&deps);
    srv.dispatch = ds;
    pl_loop_t *loop = ds_plan_loop(ds);
    ds_model_t **dm = calloc((size_t)nmodels, sizeof(*dm));
    for (int m = 0; m < nmodels; m++) {
        gw_model_t *gm = record(m);
        gw_registry_put(srv.registry, gm);
        dm[m] = ds_model_get(ds, gm);
        dm[m]->kind = SQ_DEV_EMU;
        dm[m]->active = 1;
        for (int s = 0; s < nslos; s++) {
            int made;
            pl_loop_session(loop, dm[m]->key, buckets_ms[s], 1);
            ds_session_ensure(ds, dm[m], buckets_ms[s], SQ_INPUT_PIXELS, 0, 0, &made);
        }
    }
    for (int i = 0; i < nworkers; i++) {
        char dev[16];
        snprintf(dev, sizeof(dev), "emu:%d", i);
        gw_dispatch_events.up(ds, i, dev, 1ull << 34);
    }
    int64_t t0 = pl_loop_rates_at_us(loop);
    int nticks = seconds * 1000000 / TICK_US;
    double *tick_ms = calloc((size_t)nticks, sizeof(double));
    double slice_max_ms = 0;
    long long nslices = 0;
    long long epochs0 = pl_loop_epochs(loop);
    for (int k = 0; k < nticks; k++) {
        int64_t t = t0 + (int64_t)k * TICK_US;
        if (k % 20 == 0) /* a second's arrivals: 1 to 20 req/s a session */
            for (int m = 0; m < nmodels; m++)
                for (int s = 0; s < nslos; s++)
                    pl_loop_arrivals(loop, dm[m]->key, buckets_ms[s], 1 + (m * 31 + s * 7) % 20);
        double a = now_ms();
        ds_plan_tick(ds, t);
        tick_ms[k] = now_ms() - a;
        if (!threaded)
            continue;
        /* The planner thread works between ticks, as in squishd; what it
         * handed over is applied in slices meanwhile. */
        double next = a + TICK_US / 1000.0;
        while (now_ms() < next) {
            if (ds_plan_pending(ds) > 0) {
                double b = now_ms();
                ds_plan_continue(ds);
                double d = now_ms() - b;
                nslices++;
                slice_max_ms = d > slice_max_ms ? d : slice_max_ms;
            }
            usleep(500);
        }
    }
    gw_db_quiesce(srv.db); /* the reports rendered and stored */
    int pending = ds_plan_pending(ds);
    long long epochs = pl_loop_epochs(loop) - epochs0;
    double *sorted = malloc(sizeof(double) * (size_t)nticks);
    memcpy(sorted, tick_ms, sizeof(double) * (size_t)nticks);
    qsort(sorted, (size_t)nticks, sizeof(double), bench_cmp_double);
    int nplan = 0;
    const pl_plan_t *plan = pl_loop_current(loop, SQ_DEV_EMU);
    if (plan != NULL)
        nplan = plan->ndevices;
    double stall = sorted[nticks - 1] > slice_max_ms ? sorted[nticks - 1] : slice_max_ms;
    printf("{\"plan_thread\": %d, \"sessions\": %d, \"workers\": %d, \"ticks\": %d, "
           "\"epochs_applied\": %lld, \"pending_at_end\": %d, \"devices_planned\": %d, "
           "\"overflow_routes\": %d, \"tick_ms_median\": %.3f, \"tick_ms_p99\": %.3f, "
           "\"tick_ms_max\": %.3f, \"apply_slices\": %lld, \"slice_ms_max\": %.3f, "
           "\"stall_ms\": %.3f}\n",
           threaded, pl_loop_nsessions(loop), nworkers, nticks, epochs, pending, nplan,
           plan != NULL ? plan->noverflow : 0, sorted[nticks / 2], sorted[(int)(nticks * 0.99)],
           sorted[nticks - 1], nslices, slice_max_ms, stall);
    fflush(stdout);
    free(sorted);
    free(tick_ms);
    free(dm);
    gw_db_stop(srv.db);
    srv.db = NULL;
    gw_dispatch_free(ds);
    unlink(db_path);
    gw_pipes_free(srv.pipelines);
    gw_registry_free(srv.registry);
    sq_loop_free(evloop);
    sq_shm_arena_free(srv.arena);
    gw_metrics_free(srv.metrics);
}

int main(int argc, char **argv)
{
    int nmodels = argc > 1 ? atoi(argv[1]) : 400;
    int nslos = argc > 2 ? atoi(argv[2]) : 25;
    int nworkers = argc > 3 ? atoi(argv[3]) : 2000;
    int seconds = argc > 4 ? atoi(argv[4]) : 5;
    int mode = argc > 5 ? atoi(argv[5]) : -1;
    if (nmodels < 1 || nslos < 1 || nslos > (int)(sizeof(buckets_ms) / sizeof(buckets_ms[0])) ||
        nworkers < 1 || seconds < 1 || mode < -1 || mode > 1) {
        fprintf(stderr,
                "usage: squish-dispatch-stall-bench [MODELS [SLOS [WORKERS [SECONDS [MODE]]]]]\n");
        return 2;
    }
    for (int threaded = 0; threaded <= 1; threaded++)
        if (mode < 0 || mode == threaded)
            run(threaded, nmodels, nslos, nworkers, seconds);
    return 0;
}
