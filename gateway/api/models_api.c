/* Model management routes: POST/GET/DELETE /models (admin token), and the
 * KServe model metadata and readiness routes. Every route's work happens on
 * the DB thread; the loop thread only checks the request (the DB thread
 * reads the body where h2o keeps it, see gw_request_body). */
#include "api_int.h"
#include "gw_catalog.h"
#include "gw_dispatch.h"
#include "gw_http.h"
#include "gw_codec.h"

#include <mdb_graph.h>

#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* model, config, labels and the model's external data files. */
#define MAX_UPLOAD_PARTS (3 + MDB_ONNX_BUNDLE_MAX_FILES - 1)

typedef struct {
    gw_async_t base;
    char name[MDB_NAME_MAX + 1];
    int version;
    int emulated; /* the body is a JSON config alone */
    char boundary[GW_MULTIPART_MAX_BOUNDARY + 1];
    /* The request body, read on the DB thread before the reply (see
     * gw_request_body): h2o's buffer, or a copy in body_owned. */
    const uint8_t *body;
    size_t len;
    uint8_t *body_owned;
    char location[MDB_NAME_MAX + 16]; /* a 202's Location */
    char path[128];                   /* the request's, for a 404's hint */
    int force;                        /* a delete: ?force=true, even if pipelines use it */
} model_job_t;

/* A 404 for the job's name and version, with what would work. */
static void job_not_found(model_job_t *j)
{
    char why[512];
    int err = gw_not_found_why(j->base.app, j->path, j->name, j->version, why, sizeof(why));
    gw_async_fail(&j->base, err, "%s", why);
}

static void model_job_dispose(gw_async_t *a)
{
    model_job_t *j = (model_job_t *)a;
    free(j->body_owned);
}

static model_job_t *job_new(gw_call_t *call)
{
    model_job_t *j = (model_job_t *)gw_async_new(call, sizeof(model_job_t));
    j->base.dispose = model_job_dispose;
    return j;
}

static const char *oip_datatype(mdb_dtype_t dt)
{
    switch (dt) {
    case MDB_DT_FLOAT:
        return "FP32";
    case MDB_DT_UINT8:
        return "UINT8";
    case MDB_DT_INT8:
        return "INT8";
    case MDB_DT_INT32:
        return "INT32";
    case MDB_DT_INT64:
        return "INT64";
    case MDB_DT_BOOL:
        return "BOOL";
    default:
        return "BYTES";
    }
}

_Static_assert(GW_INPUT_MAX_RANK == MDB_MAX_RANK - 1,
               "an input.shape pins every size past the batch");

static json_t *shape_json(const mdb_shape_t *s)
{
    json_t *a = json_array();
    for (int i = 0; i < s->rank; i++)
        json_array_append_new(a, json_integer(s->dims[i] == MDB_DIM_BATCH ? -1 : s->dims[i]));
    return a;
}

static json_t *preprocess_json(const gw_model_config_t *cfg)
{
    return json_pack("{s:s, s:s, s:[f,f,f], s:[f,f,f]}", "resize", cfg->resize, "channel_order",
                     cfg->channel_order, "mean", cfg->mean[0], cfg->mean[1], cfg->mean[2], "std",
                     cfg->std[0], cfg->std[1], cfg->std[2]);
}

static json_t *default_labels(int64_t k)
{
    json_t *a = json_array();
    for (int64_t i = 0; i < k; i++) {
        char s[24];
        snprintf(s, sizeof(s), "%lld", (long long)i);
        json_array_append_new(a, json_string(s));
    }
    return a;
}

/* Whether labels are default_labels' ("0", "1", ...): names nobody gave. */
static int labels_are_default(json_t *labels)
{
    size_t i;
    json_t *l;
    json_array_foreach(labels, i, l)
    {
        char s[24];
        snprintf(s, sizeof(s), "%zu", i);
        if (!json_is_string(l) || strcmp(json_string_value(l), s) != 0)
            return 0;
    }
    return 1;
}

/* The labels of a new version that brings none: the newest stored
 * version's, when it has k named ones (a version 2 of the same classifier
 * answers "tabby", as version 1 did, not "281"), else default_labels(k). */
static json_t *labels_carried(mdb_t *db, const char *name, int64_t k)
{
    json_t *prev = NULL;
    if (db != NULL && mdb_model_labels(db, name, 0, &prev) == 0 && json_is_array(prev) &&
        (int64_t)json_array_size(prev) == k && !labels_are_default(prev))
        return prev;
    json_decref(prev);
    return default_labels(k);
}

/* The reply for a stored model: its record with the name, 201. */
static void reply_created(mdb_t *db, model_job_t *j, const char *name, int version)
{
    json_t *rec;
    if (mdb_model_version_get(db, name, version, &rec) != 0) {
        gw_async_fail(&j->base, SQ_DB, "stored, but cannot read back: %s", mdb_errmsg(db));
        return;
    }
    j->base.status = 201;
    j->base.body = rec;
}

/* An upload or a delete can move other models into or out of a shared-prefix
 * group (the DB drops a group left with one member; a new model can bring
 * an older one into a new group): republish those whose group changed. */
static void refresh_groups(mdb_t *db, gw_api_ctx_t *api, int64_t except)
{
    json_t *recs, *rec;
    size_t i;
    if (mdb_model_records(db, 0, &recs) != 0)
        return;
    json_array_foreach(recs, i, rec)
    {
        int64_t key = json_integer_value(json_object_get(rec, "id"));
        gw_model_t *old = key == except ? NULL : gw_registry_get(api->registry, key);
        if (old == NULL)
            continue;
        gw_model_t *m = gw_model_from_record(rec);
        int changed = m->group_id != old->group_id || strcmp(m->cut_tensor, old->cut_tensor) != 0;
        gw_model_unref(old);
        if (!changed) {
            gw_model_unref(m);
            continue;
        }
        gw_registry_put(api->registry, m);
        gw_dispatch_model_changed(api->dispatch, key);
    }
    json_decref(recs);
}

/* Publishes a stored model to the data plane. */
static void publish(mdb_t *db, gw_api_ctx_t *api, int64_t key, int profile)
{
    json_t *recs;
    if (mdb_model_records(db, key, &recs) == 0 && json_array_size(recs) == 1)
        gw_registry_put(api->registry, gw_model_from_record(json_array_get(recs, 0)));
    json_decref(recs);
    refresh_groups(db, api, key);
    if (profile)
        gw_dispatch_profile(api->dispatch, key);
    else
        gw_dispatch_model_changed(api->dispatch, key);
}

static void store(mdb_t *db, model_job_t *j, const mdb_new_model_t *m)
{
    int64_t key = 0;
    int rc = mdb_model_insert(db, m, &key);
    if (rc == SQ_EXISTS)
        gw_async_fail(&j->base, SQ_EXISTS, "model %s version %d already exists", m->name,
                      m->version);
    else if (rc != 0)
        gw_async_fail(&j->base, rc, "cannot store the model: %s", mdb_errmsg(db));
    else {
        SQ_INFO("model stored name=%s version=%d format=%s sha256=%.12s status=%s", m->name,
                m->version, m->format, m->sha256, m->status);
        reply_created(db, j, m->name, m->version);
        /* 202 while the worker measures the model's batching profile. */
        int profiling = strcmp(m->status, "profiling") == 0;
        if (profiling) {
            /* Where to follow it: GET /models/{name} shows the measuring. */
            j->base.status = 202;
            snprintf(j->location, sizeof(j->location), "/models/%s", m->name);
            j->base.location = j->location;
        }
        publish(db, j->base.app, key, profiling);
    }
}

static void upload_emulated(mdb_t *db, model_job_t *j)
{
    gw_model_config_t *cfg = sq_xmalloc(sizeof(*cfg));
    char err[512];
    int rc = gw_model_config_parse((const char *)j->body, j->len, 1, cfg, err, sizeof(err));
    if (rc != 0) {
        gw_async_fail(&j->base, rc, "%s", err);
        free(cfg);
        return;
    }
    mdb_profile_row_t *rows = cfg->rows;
    int nrows = cfg->nrows;
    mdb_profile_row_t *linear = NULL;
    if (cfg->linear) {
        nrows = cfg->max_batch;
        linear = sq_xcalloc((size_t)nrows, sizeof(*linear));
        for (int b = 1; b <= nrows; b++)
            linear[b - 1] = (mdb_profile_row_t){
                .batch = b, .mean_us = (cfg->alpha_ms * b + cfg->beta_ms) * 1000.0};
        rows = linear;
    }
    uint64_t mem = (uint64_t)(cfg->memory_mb * 1048576.0);
    for (int i = 0; i < nrows; i++)
        rows[i].peak_memory_bytes = mem;
    char sha[65];
    mdb_sha256_hex(j->body, j->len, sha);
    json_t *config = json_loadb((const char *)j->body, j->len, 0, NULL);
    /* A detector's rows are boxes and scores: its labels are output 0's
     * (the boxes') last dimension, as for an ONNX detector. */
    json_t *labels = cfg->labels      ? json_incref(cfg->labels)
                     : cfg->det_slots ? default_labels(4)
                                      : labels_carried(db, cfg->name, cfg->num_classes);
    json_t *outputs =
        cfg->det_slots > 0
            ? json_pack("[{s:s, s:s, s:[i,i,i]}, {s:s, s:s, s:[i,i]}]", "name", "boxes", "datatype",
                        "FP32", "shape", -1, cfg->det_slots, 4, "name", "scores", "datatype",
                        "FP32", "shape", -1, cfg->det_slots)
            : json_pack("[{s:s, s:s, s:[i,i]}]", "name", "output", "datatype", "FP32", "shape", -1,
                        cfg->num_classes);
    mdb_new_model_t m = {
        .name = cfg->name,
        .version = cfg->version,
        .format = "emulated",
        .sha256 = sha,
        .input = json_pack("{s:s, s:s, s:[i,i,i,i]}", "name", "input", "datatype", "FP32", "shape",
                           -1, cfg->input_shape[0], cfg->input_shape[1], cfg->input_shape[2]),
        .outputs = outputs,
        .preprocess = preprocess_json(cfg),
        .labels = labels,
        .config = config,
        .precision = sq_precision_name(cfg->precision),
        .default_slo_ms = cfg->default_slo_ms,
        .max_batch = cfg->max_batch,
        .memory_bytes = mem,
        .status = "ready",
        .profile = rows,
        .nprofile = nrows,
        .profile_device_kind = sq_dev_kind_name(SQ_DEV_EMU),
    };
    store(db, j, &m);
    json_decref(m.input);
    json_decref(m.outputs);
    json_decref(m.preprocess);
    json_decref(labels);
    json_decref(config);
    free(linear);
    gw_model_config_dispose(cfg);
    free(cfg);
}

/* A detector's "detector" block read as a crops_of against the graph's
 * outputs, or a segmenter's output 0 checked as [N, C, H, W]: the number of
 * classes its labels name in *classes (*any_labels: the detector's classes
 * come from a labels output, so any count of labels goes). */
static int vision_check(const gw_model_config_t *cfg, const mdb_model_info_t *info,
                        int64_t *classes, int *any_labels, char *err, size_t errlen)
{
    if (cfg->segmenter) {
        const mdb_shape_t *o = &info->output_shapes[0];
        if (o->rank != 4 || o->dims[1] < 1 || o->dims[2] < 1 || o->dims[3] < 1) {
            char dims[96] = "";
            for (int d = 0; d < o->rank; d++)
                snprintf(dims + strlen(dims), sizeof(dims) - strlen(dims), "%s%lld", d ? ", " : "",
                         (long long)o->dims[d]);
            snprintf(err, errlen,
                     "config.segmenter: output 0 '%s' is [%s], expected [N, C, H, W]: class "
                     "scores per pixel",
                     info->output_names[0], dims);
            return SQ_BAD_CONFIG;
        }
        *classes = o->dims[1];
        return 0;
    }
    gw_output_t *outs = sq_xcalloc(GW_MAX_OUTPUTS, sizeof(*outs));
    int n = 0;
    for (int i = 0; i < info->n_outputs && n < GW_MAX_OUTPUTS; i++, n++) {
        gw_output_t *g = &outs[n];
        snprintf(g->name, sizeof(g->name), "%s", info->output_names[i]);
        g->elems = 1;
        for (int d = 0; d < info->output_shapes[i].rank && d < GW_MAX_DIMS; d++) {
            g->dims[g->ndims++] = info->output_shapes[i].dims[d];
            if (d > 0)
                g->elems *= info->output_shapes[i].dims[d];
        }
    }
    gw_crops_spec_t *spec = sq_xmalloc(sizeof(*spec));
    int rc = gw_crops_spec_parse(cfg->detector, "config.detector", spec, err, errlen);
    if (rc == 0)
        rc = gw_crops_spec_bind(spec, cfg->name, outs, n, "config.detector", err, errlen);
    if (rc == 0) {
        *classes = spec->nclasses;
        *any_labels = spec->has_labels;
    }
    free(spec);
    free(outs);
    return rc;
}

static void upload_onnx(mdb_t *db, model_job_t *j)
{
    gw_part_t parts[MAX_UPLOAD_PARTS];
    int nparts = 0;
    char err[512];
    int rc = gw_multipart_parse(j->body, j->len, j->boundary, parts, MAX_UPLOAD_PARTS, &nparts, err,
                                sizeof(err));
    if (rc != 0) {
        gw_async_fail(&j->base, rc, "%s", err);
        return;
    }
    const gw_part_t *model = NULL, *config = NULL, *labels_part = NULL;
    /* files[0] is the model; the others are its external data, each part
     * named by the location the .onnx gives it (Triton keeps them beside
     * model.onnx in the version directory). */
    mdb_onnx_file_t files[MDB_ONNX_BUNDLE_MAX_FILES];
    int nfiles = 1;
    for (int i = 0; i < nparts; i++) {
        const gw_part_t *p = &parts[i];
        const gw_part_t **slot = gw_part_is(p, "model")    ? &model
                                 : gw_part_is(p, "config") ? &config
                                 : gw_part_is(p, "labels") ? &labels_part
                                                           : NULL;
        if (slot == NULL && !mdb_onnx_location_ok(p->name, p->name_len)) {
            gw_async_fail(&j->base, SQ_BAD_MULTIPART,
                          "unknown part '%.*s' (expected model, config, optionally labels, and "
                          "the model's external data files, each named by its location: a "
                          "relative path without '..')",
                          (int)(p->name_len > 64 ? 64 : p->name_len), p->name);
            return;
        }
        int twice = slot != NULL && *slot != NULL;
        for (int f = 1; slot == NULL && f < nfiles; f++)
            twice |= files[f].name_len == p->name_len &&
                     memcmp(files[f].name, p->name, p->name_len) == 0;
        if (twice) {
            gw_async_fail(&j->base, SQ_BAD_MULTIPART, "part '%.*s' given twice",
                          (int)(p->name_len > 64 ? 64 : p->name_len), p->name);
            return;
        }
        if (slot != NULL)
            *slot = p;
        else
            files[nfiles++] = (mdb_onnx_file_t){p->name, p->name_len, p->data, p->len};
    }
    if (model == NULL || config == NULL) {
        gw_async_fail(&j->base, SQ_BAD_MULTIPART,
                      "an upload needs a 'model' part (the .onnx file) and a 'config' part (JSON)");
        return;
    }
    if (model->len == 0) {
        gw_async_fail(&j->base, SQ_BAD_MODEL, "the model part is empty");
        return;
    }
    gw_model_config_t *cfg = sq_xmalloc(sizeof(*cfg));
    rc = gw_model_config_parse((const char *)config->data, config->len, 0, cfg, err, sizeof(err));
    if (rc != 0) {
        gw_async_fail(&j->base, rc, "%s", err);
        free(cfg);
        return;
    }
    json_t *labels = NULL, *config_json = NULL;
    mdb_graph_t *g = NULL;
    mdb_import_error_t ierr;
    memset(&ierr, 0, sizeof(ierr));
    if (labels_part != NULL) {
        if (cfg->labels != NULL) {
            gw_async_fail(&j->base, SQ_BAD_CONFIG, "labels given both in config and as a part");
            goto out;
        }
        if ((labels = gw_labels_parse((const char *)labels_part->data, labels_part->len, err,
                                      sizeof(err))) == NULL) {
            gw_async_fail(&j->base, SQ_BAD_CONFIG, "%s", err);
            goto out;
        }
    } else if (cfg->labels != NULL) {
        labels = json_incref(cfg->labels);
    }
    /* The config's input.shape pins the input's symbolic sizes (the
     * importer says what to send when it has some and no pin). */
    mdb_input_pin_t pin = {.rank = cfg->input_rank};
    for (int d = 0; d < cfg->input_rank; d++)
        pin.dims[d] = cfg->input_shape[d];
    /* One name whatever the client called its file: the same model is the
     * same bundle, and so the same sha256 (its profile is reused). */
    files[0] = (mdb_onnx_file_t){"model.onnx", strlen("model.onnx"), model->data, model->len};
    rc = mdb_onnx_import_files(files, nfiles, &pin, &g, &ierr);
    if (rc != 0 && ierr.unused_file > 0) {
        const mdb_onnx_file_t *f = &files[ierr.unused_file];
        gw_async_fail(&j->base, SQ_BAD_MULTIPART,
                      "unknown part '%.*s': no tensor of the model reads a file of that name "
                      "(expected model, config, optionally labels, and the files the model's "
                      "external data names)",
                      (int)(f->name_len > 64 ? 64 : f->name_len), f->name);
        goto out;
    }
    if (rc != 0) {
        /* The importer's detail names the ops (and their nodes where it
         * knows them) and the opset, once. */
        if (ierr.detail[0] == '\0' && rc == SQ_UNSUPPORTED_MODEL && ierr.ops[0] != '\0')
            gw_async_fail(&j->base, rc, "unsupported operators (opset %lld): %s",
                          (long long)ierr.opset, ierr.ops);
        else
            gw_async_fail(&j->base, rc, "%s", ierr.detail[0] ? ierr.detail : sq_err_msg(rc));
        goto out;
    }
    mdb_model_info_t info;
    if ((rc = mdb_model_info(g, &info, err, sizeof(err))) != 0) {
        gw_async_fail(&j->base, rc, "%s", err);
        goto out;
    }
    /* A file that fixes its batch (BlazeFace's input is [1, 128, 128, 3]
     * and its shapes hold for 1 only) runs that batch and no other: it is
     * the model's max batch for the planner and the workers alike. */
    if (g->batch_fixed > 0 && cfg->max_batch > 0 && cfg->max_batch != g->batch_fixed) {
        gw_async_fail(&j->base, SQ_BAD_CONFIG,
                      "config.max_batch: %d, but the file fixes its batch at %lld; leave "
                      "max_batch out (or set %lld), or export the model with a dynamic batch",
                      cfg->max_batch, (long long)g->batch_fixed, (long long)g->batch_fixed);
        goto out;
    }
    /* Classifier output: [N, K]; labels must match K. A detector's labels
     * name its classes, a segmenter's its [N, C, H, W] output's C. */
    int64_t classes = info.output_shapes[0].rank >= 2
                          ? info.output_shapes[0].dims[info.output_shapes[0].rank - 1]
                          : 1;
    int any_labels = 0;
    if (cfg->detector != NULL || cfg->segmenter) {
        if ((rc = vision_check(cfg, &info, &classes, &any_labels, err, sizeof(err))) != 0) {
            gw_async_fail(&j->base, rc, "%s", err);
            goto out;
        }
    }
    if (labels != NULL && !any_labels && (int64_t)json_array_size(labels) != classes) {
        gw_async_fail(&j->base, SQ_BAD_CONFIG,
                      "config.labels: %zu labels for an output of %lld classes",
                      json_array_size(labels), (long long)classes);
        goto out;
    }
    if (labels == NULL)
        labels = labels_carried(db, cfg->name, classes);
    json_t *outputs = json_array();
    for (int i = 0; i < info.n_outputs; i++)
        json_array_append_new(outputs,
                              json_pack("{s:s, s:s, s:o}", "name", info.output_names[i], "datatype",
                                        "FP32", "shape", shape_json(&info.output_shapes[i])));
    json_t *input =
        json_pack("{s:s, s:s, s:o}", "name", info.input_name, "datatype",
                  oip_datatype(info.input_dtype), "shape", shape_json(&info.input_shape));
    json_t *pre = preprocess_json(cfg);
    /* The device kinds whose backends cannot run it, and why: it is
     * measured and served on the others. */
    json_t *not_on = json_object();
    for (int k = 0; k < SQ_DEV_KIND_COUNT; k++)
        if (k != SQ_DEV_EMU && !info.runs_on[k])
            json_object_set_new(not_on, sq_dev_kind_name((sq_dev_kind_t)k),
                                json_string(info.not_on[k]));
    config_json = json_loadb((const char *)config->data, config->len, 0, NULL);
    /* With data files, what is stored (and sent to workers) is their
     * bundle: its table, then the parts where the upload holds them. */
    char sha[65];
    uint8_t *table = NULL;
    mdb_span_t spans[1 + MDB_ONNX_BUNDLE_MAX_FILES];
    int nspans = 0;
    if (nfiles > 1) {
        size_t table_len = mdb_onnx_bundle_header(files, nfiles, NULL, 0);
        table = sq_xmalloc(table_len);
        mdb_onnx_bundle_header(files, nfiles, table, table_len);
        spans[nspans++] = (mdb_span_t){table, table_len};
    }
    for (int f = 0; f < nfiles; f++)
        spans[nspans++] = (mdb_span_t){files[f].data, files[f].len};
    mdb_sha256_t *digest = mdb_sha256_begin();
    for (int s = 0; s < nspans; s++)
        mdb_sha256_update(digest, spans[s].data, spans[s].len);
    mdb_sha256_end(digest, sha);
    mdb_new_model_t m = {
        .name = cfg->name,
        .version = cfg->version,
        .format = "onnx",
        .onnx_spans = spans,
        .n_onnx_spans = nspans,
        .sha256 = sha,
        .input = input,
        .outputs = outputs,
        .preprocess = pre,
        .labels = labels,
        .config = config_json,
        .precision = sq_precision_name(cfg->precision),
        .not_on = not_on,
        .default_slo_ms = cfg->default_slo_ms,
        .max_batch = g->batch_fixed > 0 ? (int)g->batch_fixed
                     : cfg->max_batch   ? cfg->max_batch
                                        : 64,
        .param_bytes = info.param_bytes,
        .memory_bytes = info.param_bytes,
        .status = "profiling",
        .graph = g,
    };
    store(db, j, &m);
    free(table);
    json_decref(input);
    json_decref(outputs);
    json_decref(pre);
    json_decref(not_on);
out:
    json_decref(labels);
    json_decref(config_json);
    mdb_graph_free(g);
    gw_model_config_dispose(cfg);
    free(cfg);
}

static void upload_job(mdb_t *db, void *arg)
{
    model_job_t *j = arg;
    if (j->emulated) {
        upload_emulated(db, j);
    } else {
        upload_onnx(db, j);
        /* The import's graph (the weights, once) went back to malloc,
         * which keeps freed heap resident: a 1.2 GB model left squishd
         * 1.2 GB larger after its upload. */
        malloc_trim(0);
    }
    gw_api_ctx_t *api = j->base.app;
    gw_metrics_upload(api->metrics, j->base.err);
    gw_async_done(&j->base);
}

void gw_route_models_post(gw_call_t *call)
{
    gw_api_ctx_t *api = call->app;
    if (!gw_require_admin(call)) {
        gw_metrics_upload(api->metrics, SQ_UNAUTHORIZED);
        return;
    }
    h2o_req_t *req = call->req;
    h2o_iovec_t ct = gw_header(req, "content-type");
    model_job_t *j;
    char boundary[GW_MULTIPART_MAX_BOUNDARY + 1] = "";
    if (ct.len >= 16 && strncasecmp(ct.base, "application/json", 16) == 0) {
        j = job_new(call);
        j->emulated = 1;
    } else {
        int rc = gw_multipart_boundary(ct.base ? ct.base : "", ct.len, boundary, sizeof(boundary));
        if (rc != 0) {
            gw_metrics_upload(api->metrics, rc);
            gw_send_error(req, rc,
                          rc == SQ_MEDIA_TYPE
                              ? "POST /models takes multipart/form-data (model + config parts) "
                                "or application/json (an emulated model)"
                              : "multipart/form-data without a valid boundary");
            return;
        }
        j = job_new(call);
        memcpy(j->boundary, boundary, sizeof(boundary));
    }
    if (gw_request_body(req, &j->body, &j->len, &j->body_owned) != 0) {
        gw_metrics_upload(api->metrics, SQ_OVERLOAD);
        gw_async_fail(&j->base, SQ_OVERLOAD,
                      "not enough memory to hold an upload of %zu bytes; retry shortly",
                      req->entity.len);
        gw_async_done(&j->base);
        return;
    }
    gw_db_job(api->db, upload_job, j);
}

/* Copies the {name} path segment (and {version}) into the job; replies 404
 * and returns NULL for an impossible name or version. */
static model_job_t *named_job(gw_call_t *call, int with_version)
{
    h2o_iovec_t name = call->args[0];
    int version = 0;
    if (!gw_model_name_ok(name.base, name.len)) {
        gw_send_not_found(call, name, 0);
        return NULL;
    }
    if (with_version && (version = gw_parse_version(call->args[1])) < 0) {
        gw_send_bad_version(call, call->args[1]);
        return NULL;
    }
    model_job_t *j = job_new(call);
    gw_call_path(call, j->path, sizeof(j->path));
    memcpy(j->name, name.base, name.len);
    j->name[name.len] = '\0';
    j->version = version;
    return j;
}

static void list_job(mdb_t *db, void *arg)
{
    model_job_t *j = arg;
    if (mdb_model_list(db, &j->base.body) != 0)
        gw_async_fail(&j->base, SQ_DB, "%s", mdb_errmsg(db));
    gw_async_done(&j->base);
}

void gw_route_models_list(gw_call_t *call)
{
    gw_api_ctx_t *api = call->app;
    if (!gw_require_admin(call))
        return;
    gw_db_job(api->db, list_job, job_new(call));
}

/* A version being measured gets "profiling": where, how far, and about how
 * long is left (the batch sizes left at the pace of those done; larger
 * batches take longer, so it is a lower bound early on). */
static void add_progress(gw_api_ctx_t *api, const char *name, json_t *rec)
{
    const char *status = json_string_value(json_object_get(rec, "status"));
    if (status == NULL || strcmp(status, "profiling") != 0)
        return;
    int version = (int)json_integer_value(json_object_get(rec, "version"));
    gw_model_t *m = gw_registry_find(api->registry, name, strlen(name), version);
    gw_profile_progress_t p;
    int have = m != NULL && gw_dispatch_profile_progress(api->dispatch, m->key, &p);
    gw_model_unref(m);
    if (!have) {
        /* Not measured yet: for want of a worker only while none is up;
         * else it waits its turn (a worker measures one model at a time,
         * between batches) or for an identical file's measurement. */
        gw_fleet_t fleet;
        gw_sched_fleet(gw_api_sched(api), &fleet);
        int up = fleet.up[SQ_DEV_CPU] + fleet.up[SQ_DEV_CUDA];
        json_object_set_new(
            rec, "profiling",
            json_pack("{s:s}", "state", up > 0 ? "queued" : "waiting for a cpu or cuda worker"));
        return;
    }
    double elapsed_ms = (double)(sq_now_us() - p.started_us) / 1000.0;
    json_t *o = json_pack("{s:s, s:s, s:i, s:i, s:f}", "state", "measuring", "device", p.device,
                          "batch_sizes_done", p.done, "batch_sizes_total", p.total, "elapsed_ms",
                          elapsed_ms);
    /* What the worker expects to run still, at the wall time each run µs
     * took so far (it measures between batches of the models it serves). */
    if (p.run_left_us >= 0 && p.run_spent_us > 0) {
        double pace = elapsed_ms * 1000.0 / p.run_spent_us;
        json_object_set_new(o, "eta_ms", json_real(p.run_left_us / 1000.0 * (pace > 1 ? pace : 1)));
    }
    json_object_set_new(rec, "profiling", o);
}

static void get_job(mdb_t *db, void *arg)
{
    model_job_t *j = arg;
    int rc = mdb_model_get(db, j->name, &j->base.body);
    if (rc == 0) {
        json_t *v;
        size_t i;
        json_array_foreach(json_object_get(j->base.body, "versions"), i, v)
            add_progress(j->base.app, j->name, v);
    }
    if (rc == SQ_MODEL_NOT_FOUND)
        job_not_found(j);
    else if (rc != 0)
        gw_async_fail(&j->base, rc, "%s", mdb_errmsg(db));
    gw_async_done(&j->base);
}

void gw_route_models_get(gw_call_t *call)
{
    gw_api_ctx_t *api = call->app;
    if (!gw_require_admin(call))
        return;
    model_job_t *j = named_job(call, 0);
    if (j != NULL)
        gw_db_job(api->db, get_job, j);
}

static void delete_job(mdb_t *db, void *arg)
{
    model_job_t *j = arg;
    int deleted = 0;
    if (!j->force && gw_refuse_in_use(&j->base, 0, j->name, j->version)) {
        gw_async_done(&j->base);
        return;
    }
    int rc = mdb_model_delete(db, j->name, j->version, &deleted);
    if (rc == SQ_MODEL_NOT_FOUND)
        job_not_found(j);
    else if (rc != 0)
        gw_async_fail(&j->base, rc, "%s", mdb_errmsg(db));
    else {
        gw_api_ctx_t *api = j->base.app;
        SQ_INFO("model deleted name=%s version=%d versions_deleted=%d", j->name, j->version,
                deleted);
        int64_t keys[64];
        int n = gw_registry_remove(api->registry, j->name, j->version, keys, 64);
        for (int i = 0; i < n && i < 64; i++)
            gw_dispatch_model_changed(api->dispatch, keys[i]);
        refresh_groups(db, j->base.app, 0);
        j->base.body = json_pack("{s:s, s:i}", "name", j->name, "deleted_versions", deleted);
    }
    gw_async_done(&j->base);
}

void gw_route_models_delete(gw_call_t *call)
{
    gw_api_ctx_t *api = call->app;
    if (!gw_require_admin(call))
        return;
    model_job_t *j = named_job(call, 0);
    if (j == NULL)
        return;
    j->force = gw_force_param(call);
    gw_db_job(api->db, delete_job, j);
}

void gw_route_models_delete_version(gw_call_t *call)
{
    gw_api_ctx_t *api = call->app;
    if (!gw_require_admin(call))
        return;
    model_job_t *j = named_job(call, 1);
    if (j == NULL)
        return;
    j->force = gw_force_param(call);
    gw_db_job(api->db, delete_job, j);
}

/* The version a request without one goes to, as the registry decides it
 * (the newest ready version the name's version policy serves); 0 when the
 * registry has none of that name. */
static int default_version(gw_api_ctx_t *api, const char *name)
{
    gw_model_t *m = gw_registry_find(api->registry, name, strlen(name), 0);
    int v = m != NULL ? m->version : 0;
    gw_model_unref(m);
    return v;
}

/* KServe model metadata (api_int.h): {"name", "versions", "platform",
 * "inputs", "outputs"}. */
int gw_kserve_metadata(mdb_t *db, gw_api_ctx_t *api, const char *name, int version,
                       const char *path, json_t **body, char *why, size_t len)
{
    json_t *all;
    int rc = mdb_model_get(db, name, &all);
    if (rc != 0) {
        if (rc == SQ_MODEL_NOT_FOUND)
            return gw_not_found_why(api, path, name, version, why, len);
        snprintf(why, len, "%s", mdb_errmsg(db));
        return rc;
    }
    int want = version != 0 ? version : default_version(api, name);
    json_t *versions = json_array(), *chosen = NULL, *v;
    size_t i;
    json_array_foreach(json_object_get(all, "versions"), i, v)
    {
        char s[16];
        int n = (int)json_integer_value(json_object_get(v, "version"));
        snprintf(s, sizeof(s), "%d", n);
        json_array_append_new(versions, json_string(s));
        if (want == 0 || n == want) /* want 0: the newest (records come newest last) */
            chosen = v;
    }
    if (chosen == NULL) {
        rc = gw_not_found_why(api, path, name, version, why, len);
        json_decref(versions);
    } else {
        const char *format = json_string_value(json_object_get(chosen, "format"));
        *body = json_pack(
            "{s:s, s:o, s:s, s:[O], s:O}", "name", name, "versions", versions, "platform",
            strcmp(format, "onnx") == 0 ? "onnxruntime_onnx" : "squish_emulated", "inputs",
            json_object_get(chosen, "input"), "outputs", json_object_get(chosen, "outputs"));
    }
    json_decref(all);
    return rc;
}

static void kserve_metadata_job(mdb_t *db, void *arg)
{
    model_job_t *j = arg;
    char why[512];
    int rc = gw_kserve_metadata(db, j->base.app, j->name, j->version, j->path, &j->base.body, why,
                                sizeof(why));
    if (rc != 0)
        gw_async_fail(&j->base, rc, "%s", why);
    gw_async_done(&j->base);
}

/* Why a version being measured cannot take a batch: it waits for its
 * measurement, or for a worker of a kind that can run it when every kind
 * up refuses it (the reasons of the kinds that do). */
static const char *profiling_why(gw_api_ctx_t *api, const char *name, int version, char *buf,
                                 size_t len)
{
    static const char waiting[] = "the model is being profiled; retry shortly";
    gw_model_t *m = gw_registry_find(api->registry, name, strlen(name), version);
    if (m == NULL || m->emulated) {
        gw_model_unref(m);
        return waiting;
    }
    gw_fleet_t f;
    gw_sched_fleet(gw_api_sched(api), &f);
    int runnable_up = 0, refused_up = 0;
    size_t n = (size_t)snprintf(buf, len, "no worker that can run the model is up:");
    for (int k = 0; k < SQ_DEV_KIND_COUNT; k++) {
        if (k == SQ_DEV_EMU || f.up[k] == 0)
            continue;
        if (m->not_on[k][0] == '\0') {
            runnable_up = 1;
        } else {
            refused_up = 1;
            if (n < len)
                n += (size_t)snprintf(buf + n, len - n, " %s: %s;", sq_dev_kind_name(k),
                                      m->not_on[k]);
        }
    }
    gw_model_unref(m);
    if (runnable_up || !refused_up)
        return waiting;
    if (n < len && n > 0 && buf[n - 1] == ';')
        buf[n - 1] = '\0';
    return buf;
}

/* Why the version of rec cannot take a batch now, or NULL when it can; a
 * measured version no worker up holds is loaded on the way, so that a
 * client polling readiness before it sends is not kept waiting. */
static const char *not_ready_why(gw_api_ctx_t *api, const char *name, json_t *rec, char *buf,
                                 size_t len)
{
    const char *status = json_string_value(json_object_get(rec, "status"));
    if (json_is_true(json_object_get(rec, "unloaded"))) {
        snprintf(buf, len,
                 "the model is unloaded; POST /v2/repository/models/%s/load serves it again", name);
        return buf;
    }
    int version = (int)json_integer_value(json_object_get(rec, "version"));
    if (status != NULL && strcmp(status, "profiling") == 0)
        return profiling_why(api, name, version, buf, len);
    if (status == NULL || strcmp(status, "ready") != 0)
        return "the model failed profiling and cannot be served";
    gw_model_t *m = gw_registry_find(api->registry, name, strlen(name), version);
    if (m == NULL)
        return NULL; /* stored, not yet published: the DB's word stands */
    const char *why = NULL;
    int kind = gw_sched_serving_kind(gw_api_sched(api), m);
    if (!gw_registry_served(api->registry, m, buf, len)) {
        why = buf;
    } else if (!gw_sched_held(gw_api_sched(api), m->key)) {
        if (kind >= 0)
            gw_dispatch_warm(api->dispatch, m->key);
        why = kind < 0 ? "no worker that can run the model is up"
                       : "no worker holds the model now; it is being loaded, retry shortly";
    }
    gw_model_unref(m);
    return why;
}

/* KServe model readiness (api_int.h). */
int gw_kserve_ready(mdb_t *db, gw_api_ctx_t *api, const char *name, int version, const char *path,
                    char *why, size_t len)
{
    json_t *rec;
    int v = version != 0 ? version : default_version(api, name);
    int rc = mdb_model_version_get(db, name, v, &rec);
    if (rc != 0) {
        if (rc == SQ_MODEL_NOT_FOUND)
            return gw_not_found_why(api, path, name, version, why, len);
        snprintf(why, len, "%s", mdb_errmsg(db));
        return rc;
    }
    const char *r = not_ready_why(api, name, rec, why, len);
    if (r != NULL && r != why)
        snprintf(why, len, "%s", r);
    json_decref(rec);
    return r == NULL ? 0 : SQ_NOT_READY;
}

static void kserve_ready_job(mdb_t *db, void *arg)
{
    model_job_t *j = arg;
    char why[MDB_NAME_MAX + 512];
    int rc = gw_kserve_ready(db, j->base.app, j->name, j->version, j->path, why, sizeof(why));
    if (rc == 0) {
        j->base.body = json_pack("{s:s, s:b}", "name", j->name, "ready", 1);
    } else if (rc == SQ_NOT_READY) {
        /* The Open Inference Protocol answers by status code: 200 ready, 4xx
         * not (400, as Triton). The body says the same, with the error's
         * reason and code for a client that reads only those. */
        j->base.status = 400;
        j->base.body = json_pack("{s:s, s:b, s:s, s:s}", "name", j->name, "ready", 0, "error", why,
                                 "code", sq_err_name(SQ_NOT_READY));
    } else {
        gw_async_fail(&j->base, rc, "%s", why);
    }
    gw_async_done(&j->base);
}

void gw_route_kserve_model(gw_call_t *call)
{
    gw_api_ctx_t *api = call->app;
    model_job_t *j = named_job(call, call->nargs > 1);
    if (j != NULL)
        gw_db_job(api->db, kserve_metadata_job, j);
}

int gw_frontend_ready_why(gw_api_ctx_t *api, const char *name, size_t name_len, int version,
                          const char *path, char *why, size_t len)
{
    gw_model_t *m = gw_model_name_ok(name, name_len)
                        ? gw_registry_find(api->registry, name, name_len, version)
                        : NULL;
    if (m == NULL || m->record == NULL || (version != 0 && m->version != version)) {
        /* Not in the catalog this frontend has (yet): not ready here, even
         * when its dispatcher would say so (pipelines were looked at first). */
        gw_model_unref(m);
        return gw_name_not_found_why(api, path, name, name_len, version, why, len);
    }
    char buf[MDB_NAME_MAX + 256];
    const char *r = not_ready_why(api, m->name, m->record, buf, sizeof(buf));
    snprintf(why, len, "%s", r != NULL ? r : "");
    gw_model_unref(m);
    return r != NULL ? SQ_NOT_READY : 0;
}

/* A frontend's answer (--role frontend: no DB here): gw_frontend_ready_why's. */
static void frontend_ready(gw_call_t *call)
{
    h2o_iovec_t name = call->args[0];
    int version = 0;
    if (!gw_model_name_ok(name.base, name.len)) {
        gw_send_not_found(call, name, 0);
        return;
    }
    if (call->nargs > 1 && (version = gw_parse_version(call->args[1])) < 0) {
        gw_send_bad_version(call, call->args[1]);
        return;
    }
    char path[256], why[MDB_NAME_MAX + 512];
    gw_call_path(call, path, sizeof(path));
    int rc = gw_frontend_ready_why(call->app, name.base, name.len, version, path, why, sizeof(why));
    json_t *ok = json_stringn(name.base, name.len);
    if (rc == 0)
        gw_send_json(call->req, 200, json_pack("{s:o, s:b}", "name", ok, "ready", 1));
    else if (rc == SQ_NOT_READY)
        gw_send_json(call->req, 400,
                     json_pack("{s:o, s:b, s:s, s:s}", "name", ok, "ready", 0, "error", why, "code",
                               sq_err_name(SQ_NOT_READY)));
    else {
        json_decref(ok);
        gw_send_error(call->req, rc, why);
    }
}

void gw_route_kserve_model_ready(gw_call_t *call)
{
    gw_api_ctx_t *api = call->app;
    if (api->frontend) {
        frontend_ready(call);
        return;
    }
    model_job_t *j = named_job(call, call->nargs > 1);
    if (j != NULL)
        gw_db_job(api->db, kserve_ready_job, j);
}
