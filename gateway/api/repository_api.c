/* What Triton clients ask of a model repository, from the registry (no DB
 * round trip): GET /v2/models/{m}[/versions/{v}]/config (the model's
 * configuration in Triton's field names, plus squish's own: preprocessing,
 * SLO, status) and POST /v2/repository/index (Triton's model repository
 * extension, read-only: every version with its state). */
#include "api_int.h"
#include "gw_http.h"
#include "gw_catalog.h"
#include "gw_server.h"

#include <jansson.h>
#include <sq.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static json_t *real3(const double v[3])
{
    return json_pack("[f, f, f]", v[0], v[1], v[2]);
}

static json_t *model_config(const gw_model_t *m)
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
    if (m->error[0])
        json_object_set_new(c, "error", json_string(m->error));
    return c;
}

void gw_route_model_config(gw_call_t *call)
{
    int version = 0;
    if (call->nargs > 1 && (version = gw_parse_version(call->args[1])) < 0) {
        gw_send_error(call->req, SQ_MODEL_NOT_FOUND, "no such model version");
        return;
    }
    gw_model_t *m =
        gw_registry_find(call->srv->registry, call->args[0].base, call->args[0].len, version);
    if (m == NULL) {
        gw_send_error(call->req, SQ_MODEL_NOT_FOUND,
                      version ? "no such model version" : "no such model");
        return;
    }
    json_t *c = model_config(m);
    gw_model_unref(m);
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

/* m's row, or NULL when ready_only leaves it out (outside the registry's
 * lock: gw_registry_served takes it). Triton's states: READY, LOADING
 * (squish: being measured), UNAVAILABLE with the reason (failed, or not in
 * the version policy). */
static json_t *index_row(gw_server_t *srv, gw_model_t *m, int ready_only)
{
    char unserved[MDB_NAME_MAX + 256];
    int profiling = strcmp(m->status, "profiling") == 0;
    int failed = strcmp(m->status, "failed") == 0;
    int served =
        !profiling && !failed && gw_registry_served(srv->registry, m, unserved, sizeof(unserved));
    if (ready_only && !served)
        return NULL;
    char v[16];
    snprintf(v, sizeof(v), "%d", m->version);
    json_t *row = json_pack("{s:s, s:s, s:s}", "name", m->name, "version", v, "state",
                            served      ? "READY"
                            : profiling ? "LOADING"
                                        : "UNAVAILABLE");
    if (!served)
        json_object_set_new(row, "reason",
                            json_string(profiling ? "profiling"
                                        : failed  ? (m->error[0] ? m->error : "failed")
                                                  : unserved));
    return row;
}

void gw_route_repository_index(gw_call_t *call)
{
    /* Body: optional {"ready": true} (only the versions that can serve). */
    const uint8_t *body;
    size_t len;
    uint8_t *owned = NULL;
    int ready_only = 0;
    if (gw_request_body(call->req, &body, &len, &owned) != 0) {
        gw_send_error(call->req, SQ_OVERLOAD, "no memory for the request body");
        return;
    }
    if (len > 0) {
        json_error_t jerr;
        json_t *req = json_loadb((const char *)body, len, 0, &jerr);
        json_t *ready = req != NULL ? json_object_get(req, "ready") : NULL;
        int ok = req != NULL && json_is_object(req) && (ready == NULL || json_is_boolean(ready));
        ready_only = ok && ready != NULL && json_is_true(ready);
        json_decref(req);
        if (!ok) {
            free(owned);
            gw_send_error(call->req, SQ_BAD_JSON,
                          "the body must be a JSON object, optionally {\"ready\": true}");
            return;
        }
    }
    free(owned);
    collect_t x = {0};
    gw_registry_foreach(call->srv->registry, collect, &x);
    if (x.n > 1)
        qsort(x.models, (size_t)x.n, sizeof(*x.models), by_name_version);
    json_t *rows = json_array();
    for (int i = 0; i < x.n; i++) {
        json_t *row = index_row(call->srv, x.models[i], ready_only);
        if (row != NULL)
            json_array_append_new(rows, row);
        gw_model_unref(x.models[i]);
    }
    free(x.models);
    gw_send_json(call->req, 200, rows);
}
