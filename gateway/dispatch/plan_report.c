/* The plan as the rest of squishd sees it: each epoch's snapshot, served
 * by GET /v1/plan (with the pipelines' splits as of the request), stored in
 * the model DB (the plan and its placements, one row set per epoch), and
 * its gauges and sessions' rates for /metrics; with the advice (devices to
 * add or release) computed from the outcomes since the last epoch. */
#include "gw_dispatch_int.h"
#include "gw_catalog.h"
#include "gw_metrics.h"

#include <pl_loop.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The model record of key (a live one first), or NULL. */
static ds_model_t *model_of_key(gw_dispatch_t *ds, int64_t key)
{
    ds_model_t *any = NULL;
    for (int i = 0; i < ds->nmodels; i++)
        if (ds->models[i]->key == key) {
            if (!ds->models[i]->removed)
                return ds->models[i];
            any = ds->models[i];
        }
    return any;
}

static const char *unplaced_reason(pl_unplaced_reason_t r)
{
    return r == PL_UNPLACED_SLO      ? "slo"
           : r == PL_UNPLACED_MEMORY ? "memory"
           : r == PL_UNPLACED_LINK   ? "link"
                                     : "devices";
}

/* The share of requests within their SLO below which the advice releases
 * nothing (issue 15: >= 99.5% within SLO). */
#define ADVICE_SLO_FLOOR 0.995

const ds_plan_view_t *ds_plan_view(gw_dispatch_t *ds, int id, ds_plan_view_t *out)
{
    pl_loop_session_info_t si;
    if (pl_loop_session_by_id(ds->plan->loop, id, &si) != 0)
        return NULL;
    out->dm = model_of_key(ds, si.model);
    out->bucket_ms = si.bucket_ms;
    return out->dm != NULL ? out : NULL;
}

static json_t *plan_json(gw_dispatch_t *ds, const char *reason, json_t **placements)
{
    ds_plan_state_t *p = ds->plan;
    json_t *devices = json_array(), *unplaced = json_array(), *overflow = json_array();
    *placements = json_array();
    double lower = 0;
    int used = 0;
    for (int k = 0; k < SQ_DEV_KIND_COUNT; k++) {
        const pl_plan_t *plan = pl_loop_current(p->loop, k);
        if (plan == NULL)
            continue;
        lower += plan->lower_bound_devices;
        for (int i = 0; i < plan->ndevices; i++) {
            const pl_device_t *d = &plan->devices[i];
            int wid = pl_loop_device_key(p->loop, k, d->id);
            ds_worker_t *w = ds_worker_at(ds, wid);
            json_t *sessions = json_array();
            for (int a = 0; a < d->nallocs; a++) {
                const pl_alloc_t *al = &d->allocs[a];
                pl_loop_session_info_t si;
                ds_model_t *dm = pl_loop_session_by_id(p->loop, al->session_id, &si) == 0
                                     ? model_of_key(ds, si.model)
                                     : NULL;
                if (dm == NULL)
                    continue;
                const ds_plan_view_t view = {.dm = dm, .bucket_ms = si.bucket_ms};
                const ds_plan_view_t *ps = &view;
                json_t *so =
                    json_pack("{s:s, s:i, s:f, s:f, s:i, s:f}", "model", ps->dm->m->name, "version",
                              ps->dm->m->version, "slo_ms", ps->bucket_ms, "rate_rps", al->rate_rps,
                              "batch", al->batch, "latency_ms", al->latency_us / 1000.0);
                if (al->transfer_us > 0) /* the batch's round trip and bytes on the link */
                    json_object_set_new(so, "transfer_ms", json_real(al->transfer_us / 1000.0));
                if (ps->dm->live_scale > 0) /* planned with the measured latencies */
                    json_object_set_new(so, "profile_scale", json_real(ps->dm->live_scale));
                json_array_append_new(sessions, so);
                json_array_append_new(
                    *placements,
                    json_pack("{s:s, s:I, s:f, s:i, s:f, s:f}", "device", w ? w->device : "?",
                              "model_id", (json_int_t)ps->dm->key, "slo_ms", ps->bucket_ms, "batch",
                              al->batch, "duty_cycle_us", d->duty_cycle_us, "rate_rps",
                              pl_loop_stored_rate(p->loop, k, al->session_id, al)));
            }
            used++;
            json_t *dj = json_pack(
                "{s:i, s:s, s:i, s:s, s:f, s:f, s:f, s:b, s:o}", "id",
                (int)json_array_size(devices), "kind", sq_dev_kind_name((sq_dev_kind_t)k), "worker",
                wid, "device", w ? w->device : "?", "duty_cycle_ms", d->duty_cycle_us / 1000.0,
                "occupancy", d->occupancy, "memory_mb", d->memory_bytes / 1048576.0, "saturated",
                d->saturated, "sessions", sessions);
            if (d->rtt_us > 0 || d->bytes_per_us > 0) { /* behind a link (pl.h) */
                json_object_set_new(dj, "rtt_ms", json_real(d->rtt_us / 1000.0));
                json_object_set_new(dj, "bandwidth_mbps", json_real(d->bytes_per_us * 8.0));
            }
            json_array_append_new(devices, dj);
        }
        for (int o = 0; o < plan->noverflow; o++) {
            const pl_overflow_t *ov = &plan->overflow[o];
            ds_plan_view_t view;
            const ds_plan_view_t *ps = ds_plan_view(ds, ov->session_id, &view);
            int wid = pl_loop_device_key(p->loop, k, ov->device_id);
            if (ps != NULL)
                json_array_append_new(overflow,
                                      json_pack("{s:s, s:i, s:f, s:i}", "model", ps->dm->m->name,
                                                "version", ps->dm->m->version, "slo_ms",
                                                ps->bucket_ms, "worker", wid));
        }
        for (int u = 0; u < plan->nunplaced; u++) {
            ds_plan_view_t view;
            const ds_plan_view_t *ps = ds_plan_view(ds, plan->unplaced[u].session_id, &view);
            if (ps != NULL)
                json_array_append_new(
                    unplaced, json_pack("{s:s, s:f, s:f, s:s}", "model", ps->dm->m->name, "slo_ms",
                                        ps->bucket_ms, "rate_rps", plan->unplaced[u].rate_rps,
                                        "reason", unplaced_reason(plan->unplaced[u].reason)));
        }
    }
    /* Advice (Symphony section 3.5): with bad rate r over N devices ask for
     * N r / (1 - r) more; with idle fraction f release N f. */
    double window_s = (double)(sq_now_us() - p->window_start_us) / 1e6;
    double total = p->ok + p->bad;
    double bad_rate = total > 0 ? p->bad / total : 0;
    int nworkers = 0;
    for (int i = 0; i < ds->nworkers; i++)
        nworkers += ds->workers[i] != NULL && ds->workers[i]->up;
    double idle = nworkers > 0 && window_s > 0 ? 1.0 - p->busy_us / 1e6 / (window_s * nworkers) : 0;
    idle = idle < 0 ? 0 : idle;
    double add = pl_advice_add(nworkers, bad_rate);
    double release = pl_advice_release(nworkers, idle);
    double delta = add >= 1 ? ceil(add) : -floor(release);
    /* Requests missing their SLO beyond the floor: never advise a release,
     * however idle the devices look on average. */
    if (bad_rate > 1 - ADVICE_SLO_FLOOR && delta < 0)
        delta = 0;
    /* The advice and the plan agree: load left without a device asks for
     * devices, however idle the others look, and a device the plan uses is
     * never one to release. */
    int short_of_devices = 0;
    for (int k = 0; k < SQ_DEV_KIND_COUNT; k++) {
        const pl_plan_t *plan = pl_loop_current(p->loop, k);
        for (int u = 0; plan != NULL && u < plan->nunplaced; u++)
            short_of_devices |= plan->unplaced[u].reason == PL_UNPLACED_DEVICES;
    }
    if (short_of_devices && delta < 1)
        delta = lower - used >= 1 ? ceil(lower - used) : 1;
    if (delta < 0 && -delta > nworkers - used)
        delta = -(double)(nworkers - used > 0 ? nworkers - used : 0);
    json_t *snap =
        json_pack("{s:I, s:f, s:s, s:o, s:i, s:f, s:o, s:[], s:{s:f, s:f, s:f, s:f, s:f}}", "epoch",
                  (json_int_t)p->epoch, "created_at", sq_wall_s(), "reason", reason, "devices",
                  devices, "devices_used", used, "lower_bound_devices", lower, "unplaced", unplaced,
                  "pipelines", "advice", "devices_delta", delta, "bad_rate", bad_rate,
                  "idle_fraction", idle, "add", add, "release", release);
    /* Where each worker is: remote ones with their measured link. */
    json_t *ws = json_array();
    for (int i = 0; i < ds->nworkers; i++) {
        const ds_worker_t *w = ds->workers[i];
        if (w == NULL || !w->up)
            continue;
        json_t *o = json_pack("{s:i, s:s, s:s}", "worker", w->id, "device", w->device, "host",
                              w->addr[0] ? w->addr : "local");
        if (w->addr[0] && w->bytes_per_us > 0) {
            json_object_set_new(o, "rtt_ms", json_real((double)w->rtt_us / 1000.0));
            json_object_set_new(o, "bandwidth_mbps", json_real(w->bytes_per_us * 8.0));
        }
        json_array_append_new(ws, o);
    }
    json_object_set_new(snap, "workers", ws);
    /* Workers that also hold sessions for their overflow (pl_plan_t.overflow). */
    json_object_set_new(snap, "overflow", overflow);
    if (strcmp(reason, "restored") == 0) {
        json_object_set_new(snap, "restored", json_true());
        json_object_set_new(snap, "restored_from_epoch", json_integer(p->restored_from));
    }
    return snap;
}

typedef struct {
    long long epoch;
    char reason[48];
    char *plan;
    json_t *placements;
} store_job_t;

static void store_job(mdb_t *db, void *arg)
{
    store_job_t *j = arg;
    if (db != NULL && mdb_plan_store(db, j->epoch, j->reason, j->plan, j->placements) != 0)
        SQ_WARN("cannot store plan epoch=%lld error=\"%s\"", j->epoch, mdb_errmsg(db));
    free(j->plan);
    json_decref(j->placements);
    free(j);
}

json_t *gw_dispatch_plan_json(gw_server_t *srv)
{
    ds_plan_state_t *p = srv->dispatch ? srv->dispatch->plan : NULL;
    json_t *out = NULL;
    if (p != NULL) {
        pthread_mutex_lock(&p->lock);
        if (p->json != NULL)
            out = json_loads(p->json, 0, NULL);
        pthread_mutex_unlock(&p->lock);
    }
    if (out == NULL)
        out = json_pack("{s:i, s:n, s:s, s:[], s:i, s:f, s:[], s:[], s:{s:f}}", "epoch", 0,
                        "created_at", "reason", "no plan yet", "devices", "devices_used", 0,
                        "lower_bound_devices", 0.0, "unplaced", "pipelines", "advice",
                        "devices_delta", 0.0);
    /* Pipelines as of now: their split, measured gammas and rates. */
    json_t *pipes = json_array();
    int n = 0;
    gw_pipeline_t **all = srv->pipelines ? gw_pipes_all(srv->pipelines, &n) : NULL;
    for (int i = 0; i < n; i++) {
        json_t *j = gw_pipeline_json(all[i]);
        json_t *split = json_object_get(j, "split");
        json_object_set(j, "budgets_ms", json_object_get(split, "budgets_ms"));
        json_object_set(j, "rates_rps", json_object_get(split, "rates_rps"));
        json_object_del(j, "spec");
        json_array_append_new(pipes, j);
        gw_pipeline_unref(all[i]);
    }
    free(all);
    json_object_set_new(out, "pipelines", pipes);
    return out;
}

/* The plan's gauges and the sessions' rates for /metrics. */
static void publish_metrics(gw_dispatch_t *ds, json_t *snap, int moved)
{
    ds_plan_state_t *p = ds->plan;
    gw_metrics_plan_t mp = {
        .epoch = p->epoch,
        .devices = (int)json_integer_value(json_object_get(snap, "devices_used")),
        .lower_bound_devices = json_number_value(json_object_get(snap, "lower_bound_devices")),
        .advice_devices =
            json_number_value(json_object_get(json_object_get(snap, "advice"), "devices_delta")),
        .models_moved = moved};
    gw_metrics_plan(ds->srv->metrics, &mp);
    int nsess = pl_loop_nsessions(p->loop);
    gw_metrics_session_t *ms = sq_xcalloc((size_t)nsess + 1, sizeof(*ms));
    int n = 0;
    for (int i = 0; i < nsess; i++) {
        pl_loop_session_info_t si;
        pl_loop_session_at(p->loop, i, &si);
        ds_model_t *dm = model_of_key(ds, si.model);
        if (dm == NULL || dm->removed || !dm->active || dm->kind < 0)
            continue;
        const pl_plan_t *plan = pl_loop_current(p->loop, dm->kind);
        ms[n++] = (gw_metrics_session_t){.model = dm->m,
                                         .slo_ms = si.bucket_ms,
                                         .rate_rps = si.rate_rps,
                                         .planned_rps =
                                             plan != NULL ? pl_plan_capacity_rps(plan, si.id) : 0};
    }
    gw_metrics_sessions(ds->srv->metrics, ms, n);
    free(ms);
}

void ds_plan_publish(gw_dispatch_t *ds, const char *reason, int moved)
{
    ds_plan_state_t *p = ds->plan;
    json_t *placements;
    json_t *snap = plan_json(ds, reason, &placements);
    publish_metrics(ds, snap, moved);
    char *txt = json_dumps(snap, JSON_COMPACT | JSON_REAL_PRECISION(13));
    json_decref(snap);
    pthread_mutex_lock(&p->lock);
    free(p->json);
    p->json = sq_xstrdup(txt);
    pthread_mutex_unlock(&p->lock);
    store_job_t *sj = sq_xcalloc(1, sizeof(*sj));
    sj->epoch = p->epoch;
    snprintf(sj->reason, sizeof(sj->reason), "%s", reason);
    sj->plan = txt;
    sj->placements = placements;
    if (ds->srv->db != NULL)
        gw_db_post(ds->srv, store_job, sj);
    else /* a dispatcher without storage (unit tests): nothing to keep */
        store_job(NULL, sj);
}
