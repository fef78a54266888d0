/* The plan as the rest of squishd sees it: each epoch's snapshot, served
 * by GET /v1/plan (with the pipelines' splits as of the request), stored in
 * the model DB (the plan and its placements, one row set per epoch), and
 * its gauges and sessions' rates for /metrics; with the advice (devices to
 * add or release) computed from the outcomes since the last epoch. */
#include "placement_int.h"
#include "gw_catalog.h"
#include "gw_metrics.h"

#include <pl_loop.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The model record of key (a live one first), or NULL. */
static ds_model_t *model_of_key(gw_dispatch_t *ds, int64_t key)
{
    ds_model_t *any = ds_model_find(ds, key);
    if (any == NULL || !any->removed)
        return any;
    for (int i = 0; i < ds->nmodels; i++)
        if (ds->models[i]->key == key) {
            if (!ds->models[i]->removed)
                return ds->models[i];
            any = ds->models[i];
        }
    return any;
}

/* The share of requests within their SLO below which the advice releases
 * nothing (issue 15: >= 99.5% within SLO). */
#define ADVICE_SLO_FLOOR 0.995
/* The idle fraction from which the advice adds no device: the devices
 * were busy less than half the window. */
#define ADVICE_IDLE_FLOOR 0.5

const ds_plan_view_t *ds_plan_view(gw_dispatch_t *ds, int id, ds_plan_view_t *out)
{
    pl_loop_session_info_t si;
    if (pl_loop_session_by_id(ds->place.plan->loop, id, &si) != 0)
        return NULL;
    out->dm = model_of_key(ds, si.model);
    out->bucket_ms = si.bucket_ms;
    return out->dm != NULL ? out : NULL;
}

/* ---- the report, copied on the dispatch thread ----------------------------
 *
 * What an epoch's report needs of the dispatch thread's state is copied
 * there (the plans, the sessions' names, the workers: memcpy's worth, a few
 * ms at 10,000 sessions); the JSON is built, dumped and stored on the DB
 * thread (about 150 ms and 3 MB at 10,000 sessions, a stall that would
 * break every tight SLO on the dispatch thread). /v1/plan shows an epoch
 * once it is stored, so what a client saw there survives a crash. */

typedef struct {
    char name[MDB_NAME_MAX + 1];
    int version;
    int64_t key;
    double live_scale;
    int live; /* active, not removed, with a kind: in /metrics */
    int kind;
} rep_model_t;

typedef struct {
    int id;
    int model; /* into report_t.models, -1: gone */
    double bucket_ms;
    double rate_rps;
    double capacity_rps;  /* pl_loop_capacity_rps at its model's kind */
    double stored_factor; /* pl_loop_stored_rate of a rate of 1 */
} rep_sess_t;

typedef struct {
    int present, up;
    char device[64];
    char addr[64];
    int64_t rtt_us;
    double bytes_per_us;
} rep_worker_t;

typedef struct {
    int has;
    pl_plan_t plan;
    int *keys;
    int nkeys;
} rep_kind_t;

typedef struct {
    ds_plan_state_t *p;
    gw_metrics_t *metrics;
    long long epoch, restored_from;
    char reason[48];
    double created_at;
    int moved;
    double ok, bad, busy_us, window_s;
    rep_kind_t kinds[SQ_DEV_KIND_COUNT];
    rep_model_t *models;
    int nmodels;
    rep_sess_t *sess; /* by id, ascending */
    int nsess;
    rep_worker_t *workers; /* by worker id */
    int nworkers;
} report_t;

static int key_cmp(const void *a, const void *b)
{
    const ds_model_t *x = *(ds_model_t *const *)a, *y = *(ds_model_t *const *)b;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    /* A live record before a removed one of the same key. */
    return x->removed - y->removed;
}

static report_t *report_take(gw_dispatch_t *ds, const char *reason, int moved)
{
    ds_plan_state_t *p = ds->place.plan;
    report_t *r = sq_xcalloc(1, sizeof(*r));
    r->p = p;
    r->metrics = ds->metrics;
    r->epoch = p->epoch;
    r->restored_from = p->restored_from;
    snprintf(r->reason, sizeof(r->reason), "%s", reason);
    r->created_at = sq_wall_s();
    r->moved = moved;
    r->ok = p->ok;
    r->bad = p->bad;
    r->busy_us = p->busy_us;
    r->window_s = (double)(sq_now_us() - p->window_start_us) / 1e6;
    for (int k = 0; k < SQ_DEV_KIND_COUNT; k++) {
        const pl_plan_t *plan = pl_loop_current(p->loop, k);
        if (plan == NULL)
            continue;
        rep_kind_t *K = &r->kinds[k];
        K->has = 1;
        pl_plan_copy(&K->plan, plan);
        int nkeys = 0;
        for (int i = 0; i < plan->ndevices; i++)
            if (plan->devices[i].id + 1 > nkeys)
                nkeys = plan->devices[i].id + 1;
        for (int o = 0; o < plan->noverflow; o++)
            if (plan->overflow[o].device_id + 1 > nkeys)
                nkeys = plan->overflow[o].device_id + 1;
        K->keys = sq_xmalloc(sizeof(int) * (size_t)(nkeys + 1));
        for (int d = 0; d < nkeys; d++)
            K->keys[d] = pl_loop_device_key(p->loop, k, d);
        K->nkeys = nkeys;
    }
    /* The models by key (a live record first), for the sessions. */
    ds_model_t **by_key = sq_xmalloc(sizeof(*by_key) * (size_t)(ds->nmodels + 1));
    if (ds->nmodels > 0)
        memcpy(by_key, ds->models, sizeof(*by_key) * (size_t)ds->nmodels);
    qsort(by_key, (size_t)ds->nmodels, sizeof(*by_key), key_cmp);
    r->models = sq_xcalloc((size_t)ds->nmodels + 1, sizeof(*r->models));
    r->nmodels = ds->nmodels;
    for (int i = 0; i < ds->nmodels; i++) {
        const ds_model_t *dm = by_key[i];
        rep_model_t *m = &r->models[i];
        snprintf(m->name, sizeof(m->name), "%s", dm->m->name);
        m->version = dm->m->version;
        m->key = dm->key;
        m->live_scale = dm->live_scale;
        m->live = !dm->removed && dm->active && dm->kind >= 0;
        m->kind = dm->kind;
    }
    int nsess = pl_loop_nsessions(p->loop);
    r->sess = sq_xcalloc((size_t)nsess + 1, sizeof(*r->sess));
    for (int i = 0; i < nsess; i++) {
        pl_loop_session_info_t si;
        if (pl_loop_session_at(p->loop, i, &si) != 0)
            continue;
        int lo = 0, hi = ds->nmodels;
        while (lo < hi) {
            int mid = lo + (hi - lo) / 2;
            if (by_key[mid]->key < si.model)
                lo = mid + 1;
            else
                hi = mid;
        }
        int mi = lo < ds->nmodels && by_key[lo]->key == si.model ? lo : -1;
        rep_sess_t *rs = &r->sess[r->nsess++];
        *rs = (rep_sess_t){
            .id = si.id, .model = mi, .bucket_ms = si.bucket_ms, .rate_rps = si.rate_rps};
        const pl_alloc_t one = {.rate_rps = 1};
        rs->stored_factor =
            mi >= 0 ? pl_loop_stored_rate(p->loop, by_key[mi]->kind, si.id, &one) : 1;
        rs->capacity_rps = mi >= 0 ? pl_loop_capacity_rps(p->loop, by_key[mi]->kind, si.id) : 0;
    }
    free(by_key);
    r->workers = sq_xcalloc((size_t)ds->nworkers + 1, sizeof(*r->workers));
    r->nworkers = ds->nworkers;
    for (int i = 0; i < ds->nworkers; i++) {
        const ds_worker_t *w = ds->workers[i];
        if (w == NULL)
            continue;
        rep_worker_t *rw = &r->workers[i];
        rw->present = 1;
        rw->up = w->up;
        snprintf(rw->device, sizeof(rw->device), "%s", w->device);
        snprintf(rw->addr, sizeof(rw->addr), "%s", w->addr);
        rw->rtt_us = w->rtt_us;
        rw->bytes_per_us = w->bytes_per_us;
    }
    return r;
}

static void report_free(report_t *r)
{
    for (int k = 0; k < SQ_DEV_KIND_COUNT; k++) {
        pl_plan_dispose(&r->kinds[k].plan);
        free(r->kinds[k].keys);
    }
    free(r->models);
    free(r->sess);
    free(r->workers);
    free(r);
}

static int sess_cmp(const void *a, const void *b)
{
    int x = *(const int *)a, y = ((const rep_sess_t *)b)->id;
    return (x > y) - (x < y);
}

/* The session id's model record, or NULL (the loop forgot it, or its model
 * is gone); *s its session. */
static const rep_model_t *sess_model(const report_t *r, int id, const rep_sess_t **s)
{
    *s = bsearch(&id, r->sess, (size_t)r->nsess, sizeof(*r->sess), sess_cmp);
    return *s != NULL && (*s)->model >= 0 ? &r->models[(*s)->model] : NULL;
}

static int key_at(const rep_kind_t *K, int device_id)
{
    return device_id >= 0 && device_id < K->nkeys ? K->keys[device_id] : -1;
}

static const rep_worker_t *worker_at(const report_t *r, int id)
{
    return id >= 0 && id < r->nworkers && r->workers[id].present ? &r->workers[id] : NULL;
}

static json_t *plan_json(const report_t *r, json_t **placements)
{
    json_t *devices = json_array(), *unplaced = json_array(), *overflow = json_array();
    *placements = json_array();
    double lower = 0;
    int used = 0, nunplaced = 0;
    for (int k = 0; k < SQ_DEV_KIND_COUNT; k++) {
        const rep_kind_t *K = &r->kinds[k];
        if (!K->has)
            continue;
        const pl_plan_t *plan = &K->plan;
        lower += plan->lower_bound_devices;
        for (int i = 0; i < plan->ndevices; i++) {
            const pl_device_t *d = &plan->devices[i];
            int wid = key_at(K, d->id);
            const rep_worker_t *w = worker_at(r, wid);
            json_t *sessions = json_array();
            for (int a = 0; a < d->nallocs; a++) {
                const pl_alloc_t *al = &d->allocs[a];
                const rep_sess_t *rs;
                const rep_model_t *m = sess_model(r, al->session_id, &rs);
                if (m == NULL)
                    continue;
                json_t *so =
                    json_pack("{s:s, s:i, s:f, s:f, s:i, s:f}", "model", m->name, "version",
                              m->version, "slo_ms", rs->bucket_ms, "rate_rps", al->rate_rps,
                              "batch", al->batch, "latency_ms", al->latency_us / 1000.0);
                if (al->transfer_us > 0) /* the batch's round trip and bytes on the link */
                    json_object_set_new(so, "transfer_ms", json_real(al->transfer_us / 1000.0));
                if (m->live_scale > 0) /* planned with the measured latencies */
                    json_object_set_new(so, "profile_scale", json_real(m->live_scale));
                json_array_append_new(sessions, so);
                json_array_append_new(*placements,
                                      json_pack("{s:s, s:I, s:f, s:i, s:f, s:f}", "device",
                                                w ? w->device : "?", "model_id", (json_int_t)m->key,
                                                "slo_ms", rs->bucket_ms, "batch", al->batch,
                                                "duty_cycle_us", d->duty_cycle_us, "rate_rps",
                                                al->rate_rps * rs->stored_factor));
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
            const rep_sess_t *rs;
            const rep_model_t *m = sess_model(r, ov->session_id, &rs);
            if (m != NULL)
                json_array_append_new(overflow,
                                      json_pack("{s:s, s:i, s:f, s:i}", "model", m->name, "version",
                                                m->version, "slo_ms", rs->bucket_ms, "worker",
                                                key_at(K, ov->device_id)));
        }
        for (int u = 0; u < plan->nunplaced; u++) {
            const pl_unplaced_t *un = &plan->unplaced[u];
            const rep_sess_t *rs, *bs;
            const rep_model_t *m = sess_model(r, un->session_id, &rs);
            if (m == NULL)
                continue;
            const rep_model_t *bm =
                un->blocker_session_id >= 0 ? sess_model(r, un->blocker_session_id, &bs) : NULL;
            const rep_worker_t *w = worker_at(r, key_at(K, un->device_id));
            char words[512];
            pl_unplaced_words(words, sizeof(words), un, rs->bucket_ms * 1000.0, plan->ndevices,
                              w ? w->device : NULL, bm ? bm->name : NULL);
            json_t *uj = json_pack("{s:s, s:f, s:f, s:s, s:s}", "model", m->name, "slo_ms",
                                   rs->bucket_ms, "rate_rps", un->rate_rps, "reason",
                                   pl_unplaced_code(un->reason), "detail", words);
            if (w != NULL && un->device_id >= 0)
                json_object_set_new(uj, "device", json_string(w->device));
            json_array_append_new(unplaced, uj);
            nunplaced++;
        }
    }
    /* Advice (Symphony section 3.5): with bad rate r over N devices ask for
     * N r / (1 - r) more; with idle fraction f release N f. */
    double total = r->ok + r->bad;
    double bad_rate = total > 0 ? r->bad / total : 0;
    int nworkers = 0;
    for (int i = 0; i < r->nworkers; i++)
        nworkers += r->workers[i].present && r->workers[i].up;
    double idle =
        nworkers > 0 && r->window_s > 0 ? 1.0 - r->busy_us / 1e6 / (r->window_s * nworkers) : 0;
    idle = idle < 0 ? 0 : idle;
    double add = pl_advice_add(nworkers, bad_rate);
    double release = pl_advice_release(nworkers, idle);
    double delta = add >= 1 ? ceil(add) : -floor(release);
    /* Requests missing their SLO beyond the floor: never advise a release,
     * however idle the devices look on average. */
    if (bad_rate > 1 - ADVICE_SLO_FLOOR && delta < 0)
        delta = 0;
    /* The advice and the plan agree: load left without a device asks for
     * devices, and a device the plan uses is never one to release. A
     * session whose block is a duty cycle it cannot share (duty_cycle)
     * asks for one too, as its words say: a device or a longer SLO. */
    int short_of_devices = 0;
    for (int k = 0; k < SQ_DEV_KIND_COUNT; k++) {
        const pl_plan_t *plan = r->kinds[k].has ? &r->kinds[k].plan : NULL;
        for (int u = 0; plan != NULL && u < plan->nunplaced; u++)
            short_of_devices |= plan->unplaced[u].reason == PL_UNPLACED_DEVICES ||
                                plan->unplaced[u].reason == PL_UNPLACED_DUTY_CYCLE;
    }
    if (short_of_devices && delta < 1)
        delta = lower - used >= 1 ? ceil(lower - used) : 1;
    if (delta < 0 && -delta > nworkers - used)
        delta = -(double)(nworkers - used > 0 ? nworkers - used : 0);
    /* But never a device while the devices were mostly idle over a window
     * that saw requests: what the plan reserves (a batch slot per cycle
     * for each session, a short cycle for a tight SLO) is then not what
     * the load uses, the unplaced sessions' batches run as overflow on
     * the idle devices, and their words say what would place them. A
     * window without requests (just started, restored) says nothing of
     * idleness, and the plan's word stands. */
    delta += 0.0; /* -floor(0.9) is -0: show 0 */
    int mostly_idle = total > 0 && idle >= ADVICE_IDLE_FLOOR;
    const char *note = NULL;
    char note_buf[256];
    if (mostly_idle && delta > 0) {
        delta = 0;
        snprintf(note_buf, sizeof(note_buf),
                 "the devices were idle %.0f%% of the last %.0f s: no device needed%s", idle * 100,
                 r->window_s,
                 nunplaced > 0 ? "; the unplaced sessions run as overflow on them, and their "
                                 "detail says what would place them"
                               : "");
        note = note_buf;
    } else if (delta > 0) {
        snprintf(note_buf, sizeof(note_buf), "add %.0f device%s: %s", delta, delta > 1 ? "s" : "",
                 short_of_devices ? "sessions are unplaced for want of devices (see unplaced)"
                                  : "requests missed their SLO");
        note = note_buf;
    } else if (delta < 0) {
        snprintf(note_buf, sizeof(note_buf), "%.0f device%s can go: idle %.0f%% of the window",
                 -delta, delta < -1 ? "s" : "", idle * 100);
        note = note_buf;
    } else {
        note = nunplaced > 0 ? "no device to add or release; the unplaced sessions' detail says "
                               "what would place them"
                             : "no device needed";
    }
    json_t *snap =
        json_pack("{s:I, s:f, s:s, s:o, s:i, s:f, s:o, s:[], s:{s:f, s:f, s:f, s:f, s:f}}", "epoch",
                  (json_int_t)r->epoch, "created_at", r->created_at, "reason", r->reason, "devices",
                  devices, "devices_used", used, "lower_bound_devices", lower, "unplaced", unplaced,
                  "pipelines", "advice", "devices_delta", delta, "bad_rate", bad_rate,
                  "idle_fraction", idle, "add", add, "release", release);
    json_object_set_new(json_object_get(snap, "advice"), "note", json_string(note));
    /* Where each worker is: remote ones with their measured link. */
    json_t *ws = json_array();
    for (int i = 0; i < r->nworkers; i++) {
        const rep_worker_t *w = &r->workers[i];
        if (!w->present || !w->up)
            continue;
        json_t *o = json_pack("{s:i, s:s, s:s}", "worker", i, "device", w->device, "host",
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
    if (strcmp(r->reason, "restored") == 0) {
        json_object_set_new(snap, "restored", json_true());
        json_object_set_new(snap, "restored_from_epoch", json_integer(r->restored_from));
    }
    return snap;
}

/* The plan's gauges and the sessions' rates for /metrics. */
static void publish_metrics(const report_t *r, json_t *snap)
{
    gw_metrics_plan_t mp = {
        .epoch = r->epoch,
        .devices = (int)json_integer_value(json_object_get(snap, "devices_used")),
        .lower_bound_devices = json_number_value(json_object_get(snap, "lower_bound_devices")),
        .advice_devices =
            json_number_value(json_object_get(json_object_get(snap, "advice"), "devices_delta")),
        .models_moved = r->moved};
    gw_metrics_plan(r->metrics, &mp);
    gw_metrics_session_t *ms = sq_xcalloc((size_t)r->nsess + 1, sizeof(*ms));
    int n = 0;
    for (int i = 0; i < r->nsess; i++) {
        const rep_sess_t *rs = &r->sess[i];
        const rep_model_t *m = rs->model >= 0 ? &r->models[rs->model] : NULL;
        if (m == NULL || !m->live)
            continue;
        ms[n++] = (gw_metrics_session_t){.model = m->name,
                                         .slo_ms = rs->bucket_ms,
                                         .rate_rps = rs->rate_rps,
                                         .planned_rps = rs->capacity_rps};
    }
    gw_metrics_sessions(r->metrics, ms, n);
    free(ms);
}

/* On the DB thread (or the caller's without a DB): renders, stores, then
 * shows the report. */
static void report_job(mdb_t *db, void *arg)
{
    report_t *r = arg;
    json_t *placements;
    json_t *snap = plan_json(r, &placements);
    publish_metrics(r, snap);
    char *txt = sq_json_dumps(snap, JSON_COMPACT);
    json_decref(snap);
    if (db != NULL && mdb_plan_store(db, r->epoch, r->reason, txt, placements) != 0)
        SQ_WARN("cannot store plan epoch=%lld error=\"%s\"", r->epoch, mdb_errmsg(db));
    json_decref(placements);
    pthread_mutex_lock(&r->p->lock);
    free(r->p->json);
    r->p->json = txt;
    pthread_mutex_unlock(&r->p->lock);
    report_free(r);
}

json_t *gw_dispatch_plan_json(gw_dispatch_t *ds)
{
    ds_plan_state_t *p = ds != NULL ? ds->place.plan : NULL;
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
    gw_pipeline_t **all = ds != NULL ? gw_pipes_all(ds->pipelines, &n) : NULL;
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

void ds_plan_publish(gw_dispatch_t *ds, const char *reason, int moved)
{
    report_t *r = report_take(ds, reason, moved);
    if (ds->db != NULL)
        gw_db_job(ds->db, report_job, r);
    else /* a dispatcher without storage (unit tests, benches) */
        report_job(NULL, r);
}
