/* What Triton clients ask of a model repository, from the registry (no DB
 * round trip): GET /v2/models/{m}[/versions/{v}]/config (the model's
 * configuration in Triton's field names, plus squish's own: preprocessing,
 * SLO, status), GET and POST /v2/repository/index (Triton's model
 * repository extension: every version and pipeline with its state) and
 * model control (POST /v2/repository/models/{m}/load and /unload). */
#include "api_int.h"
#include "gw_http.h"
#include "gw_catalog.h"
#include "gw_server.h"
#include "gw_dispatch.h"

#include <jansson.h>
#include <sq.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static json_t *real3(const double v[3])
{
    return json_pack("[f, f, f]", v[0], v[1], v[2]);
}

static int by_size(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* The batch sizes the plan runs m at, one per session of it on a device
 * (each the size its deadline and rate make best), ascending and each
 * once; else, with m in no plan (before its first epoch, or in a process
 * without a dispatcher), the sizes measured on its serving kind (none for
 * a linear profile: any size up to max_batch_size). */
static json_t *preferred_batch_sizes(gw_api_ctx_t *api, const gw_model_t *m, int kind)
{
    int sizes[64], n = 0;
    json_t *plan = api->dispatch != NULL ? gw_dispatch_plan_json(api->dispatch) : NULL;
    size_t i, j;
    json_t *dev, *sess;
    json_array_foreach(json_object_get(plan, "devices"), i, dev)
    {
        json_array_foreach(json_object_get(dev, "sessions"), j, sess)
        {
            const char *name = json_string_value(json_object_get(sess, "model"));
            int b = (int)json_integer_value(json_object_get(sess, "batch"));
            if (name == NULL || strcmp(name, m->name) != 0 ||
                json_integer_value(json_object_get(sess, "version")) != m->version || b < 1)
                continue;
            int seen = 0;
            for (int k = 0; k < n; k++)
                seen |= sizes[k] == b;
            if (!seen && n < (int)(sizeof(sizes) / sizeof(sizes[0])))
                sizes[n++] = b;
        }
    }
    json_decref(plan);
    const pl_profile_t *p = kind >= 0 && m->has_profile[kind] ? &m->profile[kind] : NULL;
    for (int r = 0; n == 0 && p != NULL && !p->linear && r < p->nrows; r++)
        if (p->rows[r].batch <= m->max_batch && r < (int)(sizeof(sizes) / sizeof(sizes[0])))
            sizes[n++] = p->rows[r].batch;
    qsort(sizes, (size_t)n, sizeof(int), by_size);
    json_t *out = json_array();
    for (int k = 0; k < n; k++)
        json_array_append_new(out, json_integer(sizes[k]));
    return out;
}

/* Triton's dynamic_batching block (model_config.proto's
 * ModelDynamicBatching, its uint64 fields as JSON numbers as Triton's
 * ModelConfigToJson writes them), from what squish does. A request waits
 * in its session's queue at most until its batch must start to meet its
 * deadline: its SLO less l(1) and the dispatch margin (a batch of one
 * started then is the latest that still makes it). max_queue_delay is that
 * bound at the SLO a request gets when it names none (the model's
 * default_slo_ms, else squishd's --default-slo-ms); a request that names
 * its own SLO waits at most its own SLO less the same. Without an SLO
 * (best effort) a batch goes as soon as a worker is free: 0. Priorities
 * are squish's four levels, the default one below the top. */
static json_t *dynamic_batching(gw_api_ctx_t *api, const gw_model_t *m)
{
    gw_sched_t *sched = gw_api_sched(api);
    int kind = gw_sched_serving_kind(sched, m);
    if (kind < 0) /* no worker of its kinds up: what it was measured on */
        for (int k = 0; k < SQ_DEV_KIND_COUNT && kind < 0; k++)
            if (m->has_profile[k] && m->not_on[k][0] == '\0')
                kind = k;
    double slo_ms = m->default_slo_ms > 0 ? m->default_slo_ms : api->cfg.default_slo_ms;
    json_int_t delay_us = 0;
    if (slo_ms > 0) {
        gw_least_t least;
        if (gw_sched_least(sched, m, kind, 1, &least) != 0)
            least.run_us = 0; /* l(1) not known yet: the SLO bounds it */
        double us = slo_ms * 1000.0 - (double)(least.run_us + least.margin_us);
        delay_us = us > 0 ? (json_int_t)us : 0;
    }
    return json_pack("{s:o, s:I, s:b, s:i, s:i, s:{}}", "preferred_batch_size",
                     preferred_batch_sizes(api, m, kind), "max_queue_delay_microseconds", delay_us,
                     "preserve_ordering", 0, "priority_levels", GW_PRIORITY_LEVELS,
                     "default_priority_level", GW_PRIORITY_DEFAULT, "priority_queue_policy");
}

static json_t *model_config(gw_api_ctx_t *api, const gw_model_t *m)
{
    json_t *profiles = json_array();
    for (int k = 0; k < SQ_DEV_KIND_COUNT; k++)
        if (m->has_profile[k])
            json_array_append_new(profiles, json_string(sq_dev_kind_name((sq_dev_kind_t)k)));
    json_t *in =
        m->nhwc ? json_pack("{s:s, s:s, s:[i, i, i]}", "name", m->input_name, "data_type",
                            m->input_uint8 ? "TYPE_UINT8" : "TYPE_FP32", "dims", m->h, m->w, m->c)
                : json_pack("{s:s, s:s, s:[i, i, i]}", "name", m->input_name, "data_type",
                            m->input_uint8 ? "TYPE_UINT8" : "TYPE_FP32", "dims", m->c, m->h, m->w);
    /* Every output, its dims after the batch's; labels name output 0's. */
    json_t *outs = json_array();
    for (int i = 0; i < m->noutputs; i++) {
        const gw_output_t *o = &m->outputs[i];
        json_t *dims = json_array();
        for (int d = 1; d < o->ndims; d++)
            json_array_append_new(dims, json_integer(o->dims[d] > 0 ? o->dims[d] : 0));
        json_t *out =
            json_pack("{s:s, s:s, s:o}", "name", o->name, "data_type", "TYPE_FP32", "dims", dims);
        if (i == 0)
            json_object_set_new(out, "label_count",
                                json_integer((json_int_t)json_array_size(m->labels)));
        json_array_append_new(outs, out);
    }
    json_t *pre = json_pack("{s:o, s:o, s:s, s:s, s:[i, i]}", "mean", real3(m->mean), "std",
                            real3(m->std), "channel_order", m->bgr ? "bgr" : "rgb", "resize",
                            m->nearest ? "nearest" : "bilinear", "size", m->h, m->w);
    json_t *c = json_pack(
        "{s:s, s:i, s:s, s:i, s:[o], s:o, s:o, s:o, s:s, s:o}", "name", m->name, "version",
        m->version, "platform", m->emulated ? "squish_emulated" : "onnxruntime_onnx",
        "max_batch_size", m->max_batch, "input", in, "output", outs, "preprocessing", pre,
        "default_slo_ms", m->default_slo_ms > 0 ? json_real(m->default_slo_ms) : json_null(),
        "status", m->status, "profiled_on", profiles);
    /* squish's own: the precision the config asked for (what the plans
     * run, per device kind, is in GET /models/{m}). Triton's optimization
     * policy names an accelerator (TensorRT, OpenVINO) for its precision
     * mode; squish's plans are its own, so it says it plainly. */
    json_object_set_new(c, "precision", json_string(sq_precision_name(m->precision)));
    json_object_set_new(c, "dynamic_batching", dynamic_batching(api, m));
    if (m->error[0])
        json_object_set_new(c, "error", json_string(m->error));
    return c;
}

/* A pipeline's configuration, as Triton shows an ensemble's: its one
 * input and output (as its metadata names them) and a step per stage. */
static json_t *pipeline_config(gw_pipeline_t *p)
{
    json_t *steps = json_array();
    for (int i = 0; i < p->nstages; i++) {
        const gw_stage_spec_t *st = &p->stages[i];
        json_t *step = json_pack("{s:s, s:i, s:s}", "model_name", st->model, "model_version",
                                 st->version > 0 ? st->version : -1, "stage", st->id);
        if (st->parent >= 0)
            json_object_set_new(step, "crops_of", json_string(p->stages[st->parent].id));
        json_array_append_new(steps, step);
    }
    return json_pack("{s:s, s:i, s:s, s:i, s:[{s:s, s:s, s:[i]}], s:[{s:s, s:s, s:[i]}], "
                     "s:{s:o}, s:f, s:b, s:O}",
                     "name", p->name, "version", 1, "platform", "squish_pipeline", "max_batch_size",
                     0, "input", "name", "IMAGE", "data_type", "TYPE_STRING", "dims", -1, "output",
                     "name", "RESULT", "data_type", "TYPE_STRING", "dims", -1,
                     "ensemble_scheduling", "step", steps, "slo_ms", p->slo_ms, "unloaded",
                     atomic_load(&p->unloaded) != 0, "spec", p->spec);
}

int gw_model_config_of(gw_api_ctx_t *api, const char *name, size_t name_len, int version,
                       json_t **out)
{
    gw_model_t *m = gw_registry_find(api->registry, name, name_len, version);
    if (m == NULL) {
        /* A pipeline is a model here too (version 1, as its metadata). */
        char pname[MDB_NAME_MAX + 1];
        gw_pipeline_t *p = NULL;
        if ((version == 0 || version == 1) && gw_model_name_ok(name, name_len)) {
            memcpy(pname, name, name_len);
            pname[name_len] = '\0';
            p = gw_pipes_get(api->pipelines, pname);
        }
        if (p == NULL)
            return SQ_MODEL_NOT_FOUND;
        *out = pipeline_config(p);
        gw_pipeline_unref(p);
        return 0;
    }
    *out = model_config(api, m);
    gw_model_unref(m);
    return 0;
}

void gw_route_model_config(gw_call_t *call)
{
    int version = 0;
    if (call->nargs > 1 && (version = gw_parse_version(call->args[1])) < 0) {
        gw_send_bad_version(call, call->args[1]);
        return;
    }
    json_t *c;
    if (gw_model_config_of(call->app, call->args[0].base, call->args[0].len, version, &c) != 0)
        gw_send_not_found(call, call->args[0], version);
    else
        gw_send_json(call->req, 200, c);
}

typedef struct {
    gw_model_t **models; /* references, collected under the registry's lock */
    int n, cap;
} collect_t;

static void collect(gw_model_t *m, void *arg)
{
    collect_t *x = arg;
    if (x->n == x->cap) {
        x->cap = x->cap ? 2 * x->cap : 16;
        x->models = sq_xrealloc(x->models, sizeof(*x->models) * (size_t)x->cap);
    }
    gw_model_ref(m);
    x->models[x->n++] = m;
}

static int by_name_version(const void *a, const void *b)
{
    const gw_model_t *x = *(gw_model_t *const *)a, *y = *(gw_model_t *const *)b;
    int c = strcmp(x->name, y->name);
    return c != 0 ? c : (x->version > y->version) - (x->version < y->version);
}

/* Triton's state of m and why it is not READY (reason NULL when it is):
 * READY (served, and a worker up holds it), LOADING (being measured, or
 * loading on a worker), UNLOADING (unloaded, with a batch still on its
 * way out), UNAVAILABLE (failed, unloaded, or not in its version
 * policy). Outside the registry's lock. */
static const char *model_state(gw_api_ctx_t *api, const gw_model_t *m, char *why, size_t len,
                               const char **reason)
{
    *reason = NULL;
    if (strcmp(m->status, "unloaded") == 0) {
        *reason = "unloaded";
        if (gw_sched_unloading(gw_api_sched(api), m->key)) {
            *reason = "unloading: its last batches are finishing";
            return "UNLOADING";
        }
        return "UNAVAILABLE";
    }
    if (strcmp(m->status, "failed") == 0) {
        *reason = m->error[0] ? m->error : "failed";
        return "UNAVAILABLE";
    }
    if (!gw_registry_served(api->registry, m, why, len)) {
        *reason = why;
        return "UNAVAILABLE";
    }
    if (strcmp(m->status, "profiling") == 0) {
        *reason = "profiling: its batch sizes are being measured";
        return "LOADING";
    }
    if (!gw_sched_held(gw_api_sched(api), m->key)) {
        *reason = gw_sched_serving_kind(gw_api_sched(api), m) < 0
                      ? "no worker that can serve it is up"
                      : "loading on a worker";
        return "LOADING";
    }
    return "READY";
}

static json_t *state_row(const char *name, int version, const char *state, const char *reason)
{
    char v[16];
    snprintf(v, sizeof(v), "%d", version);
    json_t *row = json_pack("{s:s, s:s, s:s}", "name", name, "version", v, "state", state);
    if (reason != NULL)
        json_object_set_new(row, "reason", json_string(reason));
    return row;
}

/* m's row, or NULL when ready_only leaves it out. */
static json_t *index_row(gw_api_ctx_t *api, gw_model_t *m, int ready_only)
{
    char why[MDB_NAME_MAX + 256];
    const char *reason;
    const char *state = model_state(api, m, why, sizeof(why), &reason);
    if (ready_only && strcmp(state, "READY") != 0)
        return NULL;
    return state_row(m->name, m->version, state, reason);
}

/* A pipeline's state: unloaded, or the least of its stages' models'
 * (UNAVAILABLE < UNLOADING < LOADING < READY), with that stage's reason. */
static const char *pipeline_state(gw_api_ctx_t *api, gw_pipeline_t *p, char *why, size_t len)
{
    static const char *const order[] = {"UNAVAILABLE", "UNLOADING", "LOADING", "READY"};
    if (atomic_load(&p->unloaded)) {
        snprintf(why, len, "unloaded");
        return "UNAVAILABLE";
    }
    int least = 3;
    why[0] = '\0';
    for (int i = 0; i < p->nstages; i++) {
        const gw_stage_spec_t *st = &p->stages[i];
        gw_model_t *m = gw_registry_find(api->registry, st->model, strlen(st->model), st->version);
        char mwhy[MDB_NAME_MAX + 256];
        const char *reason = "no such model";
        int rank = 0;
        if (m != NULL) {
            const char *state = model_state(api, m, mwhy, sizeof(mwhy), &reason);
            while (rank < 3 && strcmp(order[rank], state) != 0)
                rank++;
        }
        if (rank < least) {
            least = rank;
            snprintf(why, len, "stage %s: model %s: %s", st->id, st->model, reason);
        }
        gw_model_unref(m);
    }
    return order[least];
}

/* The index: every model version and pipeline (a pipeline as version 1,
 * as its metadata says), by name. */
json_t *gw_repository_index_json(gw_api_ctx_t *api, int ready_only)
{
    collect_t x = {0};
    gw_registry_foreach(api->registry, collect, &x);
    if (x.n > 1)
        qsort(x.models, (size_t)x.n, sizeof(*x.models), by_name_version);
    int np = 0;
    gw_pipeline_t **ps = gw_pipes_all(api->pipelines, &np);
    json_t *rows = json_array();
    int i = 0, k = 0;
    while (i < x.n || k < np) {
        if (k >= np || (i < x.n && strcmp(x.models[i]->name, ps[k]->name) < 0)) {
            json_t *row = index_row(api, x.models[i], ready_only);
            if (row != NULL)
                json_array_append_new(rows, row);
            gw_model_unref(x.models[i++]);
        } else {
            char why[2 * MDB_NAME_MAX + 320];
            const char *state = pipeline_state(api, ps[k], why, sizeof(why));
            int ready = strcmp(state, "READY") == 0;
            if (!ready_only || ready)
                json_array_append_new(rows, state_row(ps[k]->name, 1, state, ready ? NULL : why));
            gw_pipeline_unref(ps[k++]);
        }
    }
    free(x.models);
    free(ps);
    return rows;
}

static void send_index(gw_call_t *call, int ready_only)
{
    gw_send_json(call->req, 200, gw_repository_index_json(call->app, ready_only));
}

void gw_route_repository_index_get(gw_call_t *call)
{
    char ready[8];
    int ready_only = gw_query_param(call->req, "ready", ready, sizeof(ready)) &&
                     (strcmp(ready, "true") == 0 || strcmp(ready, "1") == 0);
    send_index(call, ready_only);
}

void gw_route_repository_index(gw_call_t *call)
{
    /* Body: optional {"ready": true} (only the versions that can serve). */
    json_t *req;
    if (gw_body_object(call, "{\"ready\": true or false}", &req) != 0)
        return;
    json_t *ready = json_object_get(req, "ready");
    int ok = ready == NULL || json_is_boolean(ready);
    int ready_only = ok && ready != NULL && json_is_true(ready);
    json_decref(req);
    if (!ok) {
        gw_send_error(call->req, SQ_BAD_JSON, "ready: expected true or false");
        return;
    }
    send_index(call, ready_only);
}

/* ---- model control: POST /v2/repository/models/{m}/load | unload -------- */

/* A load waits this long for its versions to be ready (measuring a new
 * model on a cpu worker takes up to its 30 s budget, plus the load); past
 * it the answer says what is still under way. */
#define GW_LOAD_WAIT_MS 120000

typedef struct {
    gw_async_t base;
    char name[MDB_NAME_MAX + 1];
    int load;       /* 1: load, 0: unload */
    int pipeline;   /* name is a pipeline's */
    int dependents; /* unload_dependents: a pipeline's stage models too */
    int force;      /* ?force=true: unload a model even if loaded pipelines use it */
    /* Another transport's (gw_api_model_control): answered through this,
     * not the HTTP loop; NULL for HTTP's. */
    gw_api_done_fn ext_fn;
    void *ext_arg;
} control_job_t;

/* The job is done: its answer to its transport, once. */
static void control_done(control_job_t *j)
{
    if (j->ext_fn == NULL) {
        gw_async_done(&j->base);
        return;
    }
    j->ext_fn(j->ext_arg, j->base.err, j->base.err != 0 ? gw_async_detail(&j->base) : NULL);
    json_decref(j->base.body);
    gw_async_dispose_detail(&j->base);
    free(j);
}

typedef struct {
    const char *name;
    int64_t keys[64];
    int n;
} name_keys_t;

static void collect_keys(gw_model_t *m, void *arg)
{
    name_keys_t *k = arg;
    if (strcmp(m->name, k->name) == 0 && k->n < (int)(sizeof(k->keys) / sizeof(k->keys[0])))
        k->keys[k->n++] = m->key;
}

/* DB thread: every version of name (un)loaded in the DB, then in the
 * registry and the dispatcher (a version unloaded while it was being
 * measured is measured again). Fills *k with its keys. */
static int set_model_unloaded(mdb_t *db, gw_api_ctx_t *api, const char *name, int unloaded,
                              name_keys_t *k)
{
    int rc = mdb_model_set_unloaded(db, name, unloaded, NULL);
    k->name = name;
    k->n = 0;
    if (rc != 0)
        return rc;
    gw_registry_foreach(api->registry, collect_keys, k);
    for (int i = 0; i < k->n; i++) {
        json_t *recs;
        if (mdb_model_records(db, k->keys[i], &recs) != 0)
            continue;
        if (json_array_size(recs) == 1) {
            gw_model_t *m = gw_model_from_record(json_array_get(recs, 0));
            int measure = strcmp(m->status, "profiling") == 0;
            gw_registry_put(api->registry, m);
            if (measure)
                gw_dispatch_profile(api->dispatch, k->keys[i]);
            else
                gw_dispatch_model_changed(api->dispatch, k->keys[i]);
        }
        json_decref(recs);
    }
    SQ_INFO("model %s name=%s versions=%d", unloaded ? "unloaded" : "loaded", name, k->n);
    return 0;
}

static void settle_load(gw_async_t *a, const gw_await_result_t *r)
{
    control_job_t *j = (control_job_t *)a;
    if (r->aborted)
        gw_async_fail(a, SQ_SHUTTING_DOWN, "squishd is shutting down");
    else if (r->failed > 0 && (j->pipeline || r->ready == 0))
        gw_async_fail(a, SQ_MODEL_FAILED, "%s %s cannot be served: %s",
                      j->pipeline ? "pipeline" : "model", j->name, r->why);
    else if (r->waiting > 0 && (j->pipeline || r->ready == 0))
        gw_async_fail(a, SQ_NOT_READY,
                      "%s %s is loaded but not ready after %d s: %s; GET /v2/models/%s/ready "
                      "says when it is",
                      j->pipeline ? "pipeline" : "model", j->name, GW_LOAD_WAIT_MS / 1000, r->why,
                      j->name);
    else
        a->body = json_object(); /* Triton's: an empty object */
    control_done(j);
}

/* The keys a load of model name waits for: its versions that are ready or
 * being measured and that its version policy serves (a failed one has
 * nothing to wait for). */
static int load_waits(gw_api_ctx_t *api, const name_keys_t *k, int64_t *wait, int max, char *failed,
                      size_t len)
{
    int n = 0;
    for (int i = 0; i < k->n; i++) {
        gw_model_t *m = gw_registry_get(api->registry, k->keys[i]);
        if (m == NULL)
            continue;
        if (strcmp(m->status, "failed") == 0) {
            if (!failed[0])
                snprintf(failed, len, "version %d failed: %s", m->version,
                         m->error[0] ? m->error : "it could not be measured");
        } else if (gw_registry_served(api->registry, m, NULL, 0) && n < max) {
            wait[n++] = m->key;
        }
        gw_model_unref(m);
    }
    return n;
}

static void control_job(mdb_t *db, void *arg)
{
    control_job_t *j = arg;
    gw_api_ctx_t *api = j->base.app;
    name_keys_t k;
    int64_t wait[64];
    int nwait = 0, rc = 0;
    char failed[320] = "";
    if (!j->pipeline && !j->load && !j->force && gw_refuse_in_use(&j->base, 1, j->name, 0)) {
        control_done(j);
        return;
    }
    if (!j->pipeline) {
        rc = set_model_unloaded(db, api, j->name, !j->load, &k);
        if (rc == 0 && j->load)
            nwait = load_waits(api, &k, wait, 64, failed, sizeof(failed));
    } else {
        gw_pipeline_t *p = gw_pipes_get(api->pipelines, j->name);
        rc = p == NULL ? SQ_NOT_FOUND : mdb_pipeline_set_unloaded(db, j->name, !j->load);
        if (rc == 0) {
            atomic_store(&p->unloaded, !j->load);
            SQ_INFO("pipeline %s name=%s", j->load ? "loaded" : "unloaded", j->name);
            /* A load serves its stages' models too (Triton's ensemble);
             * an unload with unload_dependents unloads them. */
            for (int i = 0; i < p->nstages && (j->load || j->dependents); i++) {
                const gw_stage_spec_t *st = &p->stages[i];
                gw_model_t *m =
                    gw_registry_find(api->registry, st->model, strlen(st->model), st->version);
                int flip = m != NULL && (strcmp(m->status, "unloaded") == 0) == j->load;
                gw_model_unref(m);
                if (flip)
                    set_model_unloaded(db, api, st->model, !j->load, &k);
                if (!j->load)
                    continue;
                m = gw_registry_find(api->registry, st->model, strlen(st->model), st->version);
                if (m == NULL && !failed[0])
                    snprintf(failed, sizeof(failed), "stage %s: no model %s", st->id, st->model);
                else if (m != NULL && nwait < 64)
                    wait[nwait++] = m->key;
                gw_model_unref(m);
            }
        }
        gw_pipeline_unref(p);
    }
    if (rc != 0) {
        gw_async_fail(&j->base, rc, "%s", mdb_errmsg(db));
    } else if (j->load && failed[0] && (j->pipeline || nwait == 0)) {
        gw_async_fail(&j->base, j->pipeline ? SQ_MODEL_NOT_FOUND : SQ_MODEL_FAILED,
                      "%s %s cannot be served: %s", j->pipeline ? "pipeline" : "model", j->name,
                      failed);
    } else if (j->load && nwait > 0) {
        gw_dispatch_await_loaded(api->dispatch, &j->base, wait, nwait,
                                 sq_now_us() + (int64_t)GW_LOAD_WAIT_MS * 1000, settle_load);
        return;
    } else {
        j->base.body = json_object();
    }
    control_done(j);
}

/* The body's parameters: Triton's unload_dependents (a bool); "config"
 * and "file:..." (a load that brings its own configuration or files) are
 * refused, since squish's models come from its DB. */
static int control_params(gw_call_t *call, int load, int *dependents)
{
    json_t *req;
    *dependents = 0;
    if (gw_body_object(call, "{\"parameters\": {...}}", &req) != 0)
        return -1;
    json_t *params = json_is_object(req) ? json_object_get(req, "parameters") : NULL;
    const char *err = NULL;
    char buf[256];
    if (params != NULL && !json_is_object(params)) {
        err = "parameters: expected an object";
    } else {
        const char *key;
        json_t *v;
        json_object_foreach(params, key, v)
        {
            if (!load && strcmp(key, "unload_dependents") == 0 && json_is_boolean(v)) {
                *dependents = json_is_true(v);
            } else if (load && (strcmp(key, "config") == 0 || strncmp(key, "file:", 5) == 0)) {
                snprintf(buf, sizeof(buf),
                         "parameter %s: squish serves the models stored in its DB; to change a "
                         "model's configuration or files, upload a new version with POST /models",
                         key);
                err = buf;
                break;
            } else {
                snprintf(buf, sizeof(buf), "unknown parameter %s; %s takes %s", key,
                         load ? "load" : "unload",
                         load ? "none"
                              : "only unload_dependents (a boolean; ?force=true in the URL "
                                "unloads a model that pipelines use)");
                err = buf;
                break;
            }
        }
    }
    json_decref(req);
    if (err != NULL) {
        gw_send_error(call->req, SQ_BAD_REQUEST, err);
        return -1;
    }
    return 0;
}

static void control(gw_call_t *call, int load)
{
    gw_api_ctx_t *api = call->app;
    if (!gw_require_admin(call))
        return;
    h2o_iovec_t name = call->args[0];
    int dependents;
    if (control_params(call, load, &dependents) != 0)
        return;
    gw_model_t *m = NULL;
    gw_pipeline_t *p = NULL;
    char cname[MDB_NAME_MAX + 1] = "";
    if (gw_model_name_ok(name.base, name.len)) {
        memcpy(cname, name.base, name.len);
        cname[name.len] = '\0';
        m = gw_registry_find(api->registry, name.base, name.len, 0);
        p = m == NULL ? gw_pipes_get(api->pipelines, cname) : NULL;
    }
    if (m == NULL && p == NULL) {
        gw_send_not_found(call, name, 0);
        return;
    }
    control_job_t *j = (control_job_t *)gw_async_new(call, sizeof(control_job_t));
    snprintf(j->name, sizeof(j->name), "%s", cname);
    j->load = load;
    j->pipeline = p != NULL;
    j->dependents = dependents;
    j->force = gw_force_param(call);
    gw_model_unref(m);
    gw_pipeline_unref(p);
    gw_db_job(api->db, control_job, j);
}

void gw_route_repository_load(gw_call_t *call)
{
    control(call, 1);
}

void gw_route_repository_unload(gw_call_t *call)
{
    control(call, 0);
}

void gw_api_model_control(gw_api_ctx_t *api, const char *name, int load, int dependents,
                          gw_api_done_fn fn, void *arg)
{
    size_t len = strlen(name);
    gw_model_t *m = NULL;
    gw_pipeline_t *p = NULL;
    if (len <= MDB_NAME_MAX && gw_model_name_ok(name, len)) {
        m = gw_registry_find(api->registry, name, len, 0);
        p = m == NULL ? gw_pipes_get(api->pipelines, name) : NULL;
    }
    if (m == NULL && p == NULL) {
        char path[MDB_NAME_MAX + 48], why[512];
        snprintf(path, sizeof(path), "/v2/repository/models/%s/%s", name, load ? "load" : "unload");
        int err = gw_not_found_why(api, path, name, 0, why, sizeof(why));
        fn(arg, err, why);
        return;
    }
    control_job_t *j = sq_xcalloc(1, sizeof(*j));
    j->base.app = api;
    snprintf(j->name, sizeof(j->name), "%s", name);
    j->load = load;
    j->pipeline = p != NULL;
    j->dependents = dependents;
    j->ext_fn = fn;
    j->ext_arg = arg;
    gw_model_unref(m);
    gw_pipeline_unref(p);
    gw_db_job(api->db, control_job, j);
}
