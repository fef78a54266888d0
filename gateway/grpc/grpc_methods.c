/* The methods' answers: each from the fact its HTTP route answers from
 * (gw_api.h), turned from that route's JSON into the protocol's message.
 * A method HTTP guards with the admin token is guarded here by the same
 * token in the `authorization` metadata; a method the service lacks
 * answers UNIMPLEMENTED, naming those it has. On a frontend, a method whose
 * route its HTTP forwards to the dispatcher (metadata, config,
 * statistics, the index, model control) is forwarded the same way, as
 * that route's request, and the dispatcher's JSON answer turned into the
 * message as here (its token checked there, as the route's). */
#include "grpc_call.h"
#include "kserve_v2.pb-c.h"

#include <grpc/byte_buffer_reader.h>
#include <sq_log.h>

#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define SERVED                                                                                     \
    "ServerLive, ServerReady, ModelReady, ServerMetadata, ModelMetadata, ModelInfer, "             \
    "ModelStreamInfer, ModelConfig, ModelStatistics, RepositoryIndex, "                            \
    "RepositoryModelLoad, RepositoryModelUnload, "                                                 \
    "SystemSharedMemory{Status,Register,Unregister}, "                                             \
    "CudaSharedMemory{Status,Register,Unregister}, TraceSetting and LogSettings"

/* ---- building a message: its parts live in a pool freed once packed ---- */

typedef struct {
    void **v;
    size_t n, cap;
} pool_t;

static void *palloc(pool_t *p, size_t size)
{
    if (p->n == p->cap) {
        p->cap = p->cap ? 2 * p->cap : 32;
        p->v = sq_xrealloc(p->v, p->cap * sizeof(*p->v));
    }
    return p->v[p->n++] = sq_xcalloc(1, size > 0 ? size : 1);
}

static void pool_free(pool_t *p)
{
    for (size_t i = 0; i < p->n; i++)
        free(p->v[i]);
    free(p->v);
}

/* A JSON string's text (it lives as long as the JSON), or "". */
static char *str_of(json_t *j)
{
    const char *s = json_string_value(j);
    return (char *)(s != NULL ? s : "");
}

/* Any JSON value as a parameter's text: a string as it is, else compact
 * JSON (kept in the pool). */
static char *text_of(pool_t *p, json_t *j)
{
    if (json_is_string(j))
        return str_of(j);
    char *s = json_dumps(j, JSON_COMPACT | JSON_ENCODE_ANY);
    if (s == NULL)
        return (char *)"";
    char *t = palloc(p, strlen(s) + 1);
    memcpy(t, s, strlen(s) + 1);
    free(s);
    return t;
}

static int64_t *ints_of(pool_t *p, json_t *a, size_t *n)
{
    *n = json_array_size(a);
    int64_t *v = palloc(p, *n * sizeof(*v));
    for (size_t i = 0; i < *n; i++)
        v[i] = (int64_t)json_integer_value(json_array_get(a, i));
    return v;
}

static void send_message(gw_grpc_call_t *c, const ProtobufCMessage *m)
{
    size_t n = protobuf_c_message_get_packed_size(m);
    uint8_t *buf = sq_xmalloc(n > 0 ? n : 1);
    protobuf_c_message_pack(m, buf);
    gw_grpc_reply(c, GRPC_STATUS_OK, NULL, buf, n);
    free(buf);
}

static void fail(gw_grpc_call_t *c, int err, const char *why)
{
    gw_grpc_reply(c, gw_grpc_status_of(err), why != NULL && why[0] ? why : sq_err_msg(err), NULL,
                  0);
}

/* ---- the answers ---- */

static void server_metadata(gw_grpc_call_t *c)
{
    json_t *j = gw_api_server_metadata();
    pool_t p = {0};
    Inference__ServerMetadataResponse r = INFERENCE__SERVER_METADATA_RESPONSE__INIT;
    r.name = str_of(json_object_get(j, "name"));
    r.version = str_of(json_object_get(j, "version"));
    json_t *ext = json_object_get(j, "extensions");
    r.n_extensions = json_array_size(ext);
    r.extensions = palloc(&p, r.n_extensions * sizeof(char *));
    for (size_t i = 0; i < r.n_extensions; i++)
        r.extensions[i] = str_of(json_array_get(ext, i));
    send_message(c, &r.base);
    pool_free(&p);
    json_decref(j);
}

static Inference__ModelMetadataResponse__TensorMetadata **tensors_of(pool_t *p, json_t *a,
                                                                     size_t *n)
{
    *n = json_array_size(a);
    Inference__ModelMetadataResponse__TensorMetadata **v = palloc(p, *n * sizeof(*v));
    for (size_t i = 0; i < *n; i++) {
        json_t *t = json_array_get(a, i);
        v[i] = palloc(p, sizeof(**v));
        inference__model_metadata_response__tensor_metadata__init(v[i]);
        v[i]->name = str_of(json_object_get(t, "name"));
        v[i]->datatype = str_of(json_object_get(t, "datatype"));
        v[i]->shape = ints_of(p, json_object_get(t, "shape"), &v[i]->n_shape);
    }
    return v;
}

static void model_metadata(gw_grpc_call_t *c, json_t *j)
{
    pool_t p = {0};
    Inference__ModelMetadataResponse r = INFERENCE__MODEL_METADATA_RESPONSE__INIT;
    r.name = str_of(json_object_get(j, "name"));
    r.platform = str_of(json_object_get(j, "platform"));
    json_t *vs = json_object_get(j, "versions");
    r.n_versions = json_array_size(vs);
    r.versions = palloc(&p, r.n_versions * sizeof(char *));
    for (size_t i = 0; i < r.n_versions; i++)
        r.versions[i] = str_of(json_array_get(vs, i));
    r.inputs = tensors_of(&p, json_object_get(j, "inputs"), &r.n_inputs);
    r.outputs = tensors_of(&p, json_object_get(j, "outputs"), &r.n_outputs);
    send_message(c, &r.base);
    pool_free(&p);
}

static Inference__DataType data_type(json_t *j)
{
    const ProtobufCEnumValue *v =
        protobuf_c_enum_descriptor_get_value_by_name(&inference__data_type__descriptor, str_of(j));
    return v != NULL ? (Inference__DataType)v->value : INFERENCE__DATA_TYPE__TYPE_INVALID;
}

static Inference__ModelDynamicBatching *dynamic_batching(pool_t *p, json_t *j)
{
    Inference__ModelDynamicBatching *d = palloc(p, sizeof(*d));
    inference__model_dynamic_batching__init(d);
    json_t *sizes = json_object_get(j, "preferred_batch_size");
    d->n_preferred_batch_size = json_array_size(sizes);
    d->preferred_batch_size = palloc(p, d->n_preferred_batch_size * sizeof(int32_t));
    for (size_t i = 0; i < d->n_preferred_batch_size; i++)
        d->preferred_batch_size[i] = (int32_t)json_integer_value(json_array_get(sizes, i));
    d->max_queue_delay_microseconds =
        (uint64_t)json_integer_value(json_object_get(j, "max_queue_delay_microseconds"));
    d->preserve_ordering = json_is_true(json_object_get(j, "preserve_ordering"));
    d->priority_levels = (uint64_t)json_integer_value(json_object_get(j, "priority_levels"));
    d->default_priority_level =
        (uint64_t)json_integer_value(json_object_get(j, "default_priority_level"));
    return d;
}

/* GET /v2/models/{m}/config's JSON as the protocol's ModelConfig: the
 * fields it has by their own (name, platform, max_batch_size, input,
 * output, dynamic_batching), every other one of the answer (squish's
 * version, SLO, preprocessing, status, precision; a pipeline's steps) as a
 * parameter, in its JSON text. */
static void model_config(gw_grpc_call_t *c, json_t *j)
{
    pool_t p = {0};
    Inference__ModelConfig cfg = INFERENCE__MODEL_CONFIG__INIT;
    cfg.name = str_of(json_object_get(j, "name"));
    cfg.platform = str_of(json_object_get(j, "platform"));
    cfg.max_batch_size = (int32_t)json_integer_value(json_object_get(j, "max_batch_size"));
    json_t *ins = json_object_get(j, "input");
    cfg.n_input = json_array_size(ins);
    cfg.input = palloc(&p, cfg.n_input * sizeof(*cfg.input));
    for (size_t i = 0; i < cfg.n_input; i++) {
        json_t *t = json_array_get(ins, i);
        Inference__ModelInput *in = cfg.input[i] = palloc(&p, sizeof(*in));
        inference__model_input__init(in);
        in->name = str_of(json_object_get(t, "name"));
        in->data_type = data_type(json_object_get(t, "data_type"));
        in->dims = ints_of(&p, json_object_get(t, "dims"), &in->n_dims);
    }
    json_t *outs = json_object_get(j, "output");
    cfg.n_output = json_array_size(outs);
    cfg.output = palloc(&p, cfg.n_output * sizeof(*cfg.output));
    for (size_t i = 0; i < cfg.n_output; i++) {
        json_t *t = json_array_get(outs, i);
        Inference__ModelOutput *out = cfg.output[i] = palloc(&p, sizeof(*out));
        inference__model_output__init(out);
        out->name = str_of(json_object_get(t, "name"));
        out->data_type = data_type(json_object_get(t, "data_type"));
        out->dims = ints_of(&p, json_object_get(t, "dims"), &out->n_dims);
    }
    json_t *db = json_object_get(j, "dynamic_batching");
    if (json_is_object(db)) {
        cfg.scheduling_choice_case = INFERENCE__MODEL_CONFIG__SCHEDULING_CHOICE_DYNAMIC_BATCHING;
        cfg.dynamic_batching = dynamic_batching(&p, db);
    }
    static const char *const own[] = {"name",  "platform", "max_batch_size",
                                      "input", "output",   "dynamic_batching"};
    cfg.parameters = palloc(&p, json_object_size(j) * sizeof(*cfg.parameters));
    const char *key;
    json_t *v;
    json_object_foreach(j, key, v)
    {
        size_t k = 0;
        while (k < sizeof(own) / sizeof(own[0]) && strcmp(own[k], key) != 0)
            k++;
        if (k < sizeof(own) / sizeof(own[0]) || json_is_null(v))
            continue;
        Inference__ModelConfig__ParametersEntry *e = palloc(&p, sizeof(*e));
        inference__model_config__parameters_entry__init(e);
        Inference__ModelParameter *mp = palloc(&p, sizeof(*mp));
        inference__model_parameter__init(mp);
        e->key = (char *)key;
        mp->string_value = text_of(&p, v);
        e->value = mp;
        cfg.parameters[cfg.n_parameters++] = e;
    }
    Inference__ModelConfigResponse r = INFERENCE__MODEL_CONFIG_RESPONSE__INIT;
    r.config = &cfg;
    send_message(c, &r.base);
    pool_free(&p);
}

static Inference__StatisticDuration *duration(pool_t *p, json_t *j)
{
    Inference__StatisticDuration *d = palloc(p, sizeof(*d));
    inference__statistic_duration__init(d);
    d->count = (uint64_t)json_integer_value(json_object_get(j, "count"));
    d->ns = (uint64_t)json_integer_value(json_object_get(j, "ns"));
    return d;
}

static uint64_t u64_of(json_t *j)
{
    return (uint64_t)json_integer_value(j);
}

/* GET /v2/models[/{m}[/versions/{v}]]/stats's JSON as ModelStatistics,
 * field by field (response_stats and memory_usage are empty there, as
 * Triton's without decoupled models: empty here too). */
static void model_statistics(gw_grpc_call_t *c, json_t *j)
{
    pool_t p = {0};
    Inference__ModelStatisticsResponse r = INFERENCE__MODEL_STATISTICS_RESPONSE__INIT;
    json_t *rows = json_object_get(j, "model_stats");
    r.n_model_stats = json_array_size(rows);
    r.model_stats = palloc(&p, r.n_model_stats * sizeof(*r.model_stats));
    for (size_t i = 0; i < r.n_model_stats; i++) {
        json_t *row = json_array_get(rows, i);
        Inference__ModelStatistics *m = r.model_stats[i] = palloc(&p, sizeof(*m));
        inference__model_statistics__init(m);
        m->name = str_of(json_object_get(row, "name"));
        m->version = str_of(json_object_get(row, "version"));
        m->last_inference = u64_of(json_object_get(row, "last_inference"));
        m->inference_count = u64_of(json_object_get(row, "inference_count"));
        m->execution_count = u64_of(json_object_get(row, "execution_count"));
        json_t *is = json_object_get(row, "inference_stats");
        Inference__InferStatistics *st = m->inference_stats = palloc(&p, sizeof(*st));
        inference__infer_statistics__init(st);
        st->success = duration(&p, json_object_get(is, "success"));
        st->fail = duration(&p, json_object_get(is, "fail"));
        st->queue = duration(&p, json_object_get(is, "queue"));
        st->compute_input = duration(&p, json_object_get(is, "compute_input"));
        st->compute_infer = duration(&p, json_object_get(is, "compute_infer"));
        st->compute_output = duration(&p, json_object_get(is, "compute_output"));
        st->cache_hit = duration(&p, json_object_get(is, "cache_hit"));
        st->cache_miss = duration(&p, json_object_get(is, "cache_miss"));
        json_t *bs = json_object_get(row, "batch_stats");
        m->n_batch_stats = json_array_size(bs);
        m->batch_stats = palloc(&p, m->n_batch_stats * sizeof(*m->batch_stats));
        for (size_t k = 0; k < m->n_batch_stats; k++) {
            json_t *b = json_array_get(bs, k);
            Inference__InferBatchStatistics *e = m->batch_stats[k] = palloc(&p, sizeof(*e));
            inference__infer_batch_statistics__init(e);
            e->batch_size = u64_of(json_object_get(b, "batch_size"));
            e->compute_input = duration(&p, json_object_get(b, "compute_input"));
            e->compute_infer = duration(&p, json_object_get(b, "compute_infer"));
            e->compute_output = duration(&p, json_object_get(b, "compute_output"));
        }
    }
    send_message(c, &r.base);
    pool_free(&p);
}

/* HTTP's status rows ([{"name", "key", "offset", "byte_size"}]) as the
 * protocol's map of region name to status. */
static void shm_status(gw_grpc_call_t *c, json_t *rows)
{
    pool_t p = {0};
    Inference__SystemSharedMemoryStatusResponse r =
        INFERENCE__SYSTEM_SHARED_MEMORY_STATUS_RESPONSE__INIT;
    r.n_regions = json_array_size(rows);
    r.regions = palloc(&p, r.n_regions * sizeof(*r.regions));
    for (size_t i = 0; i < r.n_regions; i++) {
        json_t *row = json_array_get(rows, i);
        Inference__SystemSharedMemoryStatusResponse__RegionsEntry *e = r.regions[i] =
            palloc(&p, sizeof(*e));
        inference__system_shared_memory_status_response__regions_entry__init(e);
        Inference__SystemSharedMemoryStatusResponse__RegionStatus *st = e->value =
            palloc(&p, sizeof(*st));
        inference__system_shared_memory_status_response__region_status__init(st);
        e->key = st->name = str_of(json_object_get(row, "name"));
        st->key = str_of(json_object_get(row, "key"));
        st->offset = u64_of(json_object_get(row, "offset"));
        st->byte_size = u64_of(json_object_get(row, "byte_size"));
    }
    send_message(c, &r.base);
    pool_free(&p);
}

/* GET /v2/cudasharedmemory/status's rows ([{"name", "device_id",
 * "byte_size"}]: none, squish having no CUDA IPC) as the protocol's map. */
static void cuda_shm_status(gw_grpc_call_t *c, json_t *rows)
{
    pool_t p = {0};
    Inference__CudaSharedMemoryStatusResponse r =
        INFERENCE__CUDA_SHARED_MEMORY_STATUS_RESPONSE__INIT;
    r.n_regions = json_array_size(rows);
    r.regions = palloc(&p, r.n_regions * sizeof(*r.regions));
    for (size_t i = 0; i < r.n_regions; i++) {
        json_t *row = json_array_get(rows, i);
        Inference__CudaSharedMemoryStatusResponse__RegionsEntry *e = r.regions[i] =
            palloc(&p, sizeof(*e));
        inference__cuda_shared_memory_status_response__regions_entry__init(e);
        Inference__CudaSharedMemoryStatusResponse__RegionStatus *st = e->value =
            palloc(&p, sizeof(*st));
        inference__cuda_shared_memory_status_response__region_status__init(st);
        e->key = st->name = str_of(json_object_get(row, "name"));
        st->device_id = u64_of(json_object_get(row, "device_id"));
        st->byte_size = u64_of(json_object_get(row, "byte_size"));
    }
    send_message(c, &r.base);
    pool_free(&p);
}

/* The trace settings' JSON ({"trace_level": [...], "trace_rate": "1000",
 * ...}) as TraceSettingResponse: an array's strings, or the one value's
 * text, as the setting's values (as Triton's). */
static void trace_setting(gw_grpc_call_t *c, json_t *j)
{
    pool_t p = {0};
    Inference__TraceSettingResponse r = INFERENCE__TRACE_SETTING_RESPONSE__INIT;
    r.settings = palloc(&p, json_object_size(j) * sizeof(*r.settings));
    const char *key;
    json_t *v;
    json_object_foreach(j, key, v)
    {
        if (json_is_null(v))
            continue;
        Inference__TraceSettingResponse__SettingsEntry *e = palloc(&p, sizeof(*e));
        inference__trace_setting_response__settings_entry__init(e);
        Inference__TraceSettingResponse__SettingValue *sv = palloc(&p, sizeof(*sv));
        inference__trace_setting_response__setting_value__init(sv);
        e->key = (char *)key;
        e->value = sv;
        sv->n_value = json_is_array(v) ? json_array_size(v) : 1;
        sv->value = palloc(&p, sv->n_value * sizeof(char *));
        for (size_t i = 0; i < sv->n_value; i++)
            sv->value[i] = text_of(&p, json_is_array(v) ? json_array_get(v, i) : v);
        r.settings[r.n_settings++] = e;
    }
    send_message(c, &r.base);
    pool_free(&p);
}

/* The log settings' JSON as LogSettingsResponse: a boolean as bool_param,
 * a number as uint32_param, a string as string_param (as Triton's). */
static void log_settings(gw_grpc_call_t *c, json_t *j)
{
    pool_t p = {0};
    Inference__LogSettingsResponse r = INFERENCE__LOG_SETTINGS_RESPONSE__INIT;
    r.settings = palloc(&p, json_object_size(j) * sizeof(*r.settings));
    const char *key;
    json_t *v;
    json_object_foreach(j, key, v)
    {
        Inference__LogSettingsResponse__SettingsEntry *e = palloc(&p, sizeof(*e));
        inference__log_settings_response__settings_entry__init(e);
        Inference__LogSettingsResponse__SettingValue *sv = palloc(&p, sizeof(*sv));
        inference__log_settings_response__setting_value__init(sv);
        e->key = (char *)key;
        e->value = sv;
        if (json_is_boolean(v)) {
            sv->parameter_choice_case =
                INFERENCE__LOG_SETTINGS_RESPONSE__SETTING_VALUE__PARAMETER_CHOICE_BOOL_PARAM;
            sv->bool_param = json_is_true(v);
        } else if (json_is_integer(v)) {
            sv->parameter_choice_case =
                INFERENCE__LOG_SETTINGS_RESPONSE__SETTING_VALUE__PARAMETER_CHOICE_UINT32_PARAM;
            sv->uint32_param = (uint32_t)json_integer_value(v);
        } else {
            sv->parameter_choice_case =
                INFERENCE__LOG_SETTINGS_RESPONSE__SETTING_VALUE__PARAMETER_CHOICE_STRING_PARAM;
            sv->string_param = text_of(&p, v);
        }
        r.settings[r.n_settings++] = e;
    }
    send_message(c, &r.base);
    pool_free(&p);
}

/* POST /v2/repository/index's rows as RepositoryIndexResponse. */
static void repository_index(gw_grpc_call_t *c, json_t *rows)
{
    pool_t p = {0};
    Inference__RepositoryIndexResponse r = INFERENCE__REPOSITORY_INDEX_RESPONSE__INIT;
    r.n_models = json_array_size(rows);
    r.models = palloc(&p, r.n_models * sizeof(*r.models));
    for (size_t i = 0; i < r.n_models; i++) {
        json_t *row = json_array_get(rows, i);
        Inference__RepositoryIndexResponse__ModelIndex *m = r.models[i] = palloc(&p, sizeof(*m));
        inference__repository_index_response__model_index__init(m);
        m->name = str_of(json_object_get(row, "name"));
        m->version = str_of(json_object_get(row, "version"));
        m->state = str_of(json_object_get(row, "state"));
        m->reason = str_of(json_object_get(row, "reason"));
    }
    send_message(c, &r.base);
    pool_free(&p);
}

static void server_ready(gw_grpc_call_t *c)
{
    /* Not ready is an answer, not an error (as Triton): ready false. */
    char why[256];
    Inference__ServerReadyResponse r = INFERENCE__SERVER_READY_RESPONSE__INIT;
    r.ready = gw_api_server_ready(c->api, why, sizeof(why)) == 0;
    send_message(c, &r.base);
}

/* A DB fact's answer (gw_api_fact_fn), on the DB thread. */
static void fact_answered(void *arg, int err, json_t *body, const char *why)
{
    gw_grpc_call_t *c = arg;
    if (c->method == GW_GRPC_MODEL_READY && (err == 0 || err == SQ_NOT_READY)) {
        Inference__ModelReadyResponse r = INFERENCE__MODEL_READY_RESPONSE__INIT;
        r.ready = err == 0;
        send_message(c, &r.base);
    } else if (err != 0) {
        fail(c, err, why);
    } else {
        model_metadata(c, body);
    }
    json_decref(body);
}

/* A load's or unload's answer (gw_api_done_fn), on the DB or dispatch
 * thread: Triton's empty response, or the route's error. */
static void control_answered(void *arg, int err, const char *why)
{
    gw_grpc_call_t *c = arg;
    if (err != 0) {
        fail(c, err, why);
        return;
    }
    Inference__RepositoryModelLoadResponse load = INFERENCE__REPOSITORY_MODEL_LOAD_RESPONSE__INIT;
    Inference__RepositoryModelUnloadResponse unload =
        INFERENCE__REPOSITORY_MODEL_UNLOAD_RESPONSE__INIT;
    send_message(c, c->method == GW_GRPC_REPOSITORY_MODEL_LOAD ? &load.base : &unload.base);
}

/* The answer of a method a frontend forwards (gw_api_fact_fn), on the
 * forward's thread: the dispatcher's JSON as the method's message. */
static void forward_answered(void *arg, int err, json_t *body, const char *why)
{
    gw_grpc_call_t *c = arg;
    switch (err != 0 ? -1 : c->method) {
    case -1:
        fail(c, err, why);
        break;
    case GW_GRPC_MODEL_METADATA:
        model_metadata(c, body);
        break;
    case GW_GRPC_MODEL_CONFIG:
        model_config(c, body);
        break;
    case GW_GRPC_MODEL_STATISTICS:
        model_statistics(c, body);
        break;
    case GW_GRPC_REPOSITORY_INDEX:
        repository_index(c, body);
        break;
    case GW_GRPC_REPOSITORY_MODEL_LOAD:
    case GW_GRPC_REPOSITORY_MODEL_UNLOAD:
        control_answered(c, 0, "");
        break;
    default:
        fail(c, SQ_INTERNAL, "this frontend forwarded a method it cannot answer");
        break;
    }
    json_decref(body);
}

/* One path segment, escaped as a URL's (RFC 3986: all but unreserved). */
static void put_segment(char *out, size_t len, const char *seg)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t n = strlen(out);
    for (const unsigned char *s = (const unsigned char *)seg; *s && n + 4 < len; s++) {
        if ((*s >= 'A' && *s <= 'Z') || (*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') ||
            *s == '-' || *s == '.' || *s == '_' || *s == '~') {
            out[n++] = (char)*s;
        } else {
            out[n++] = '%';
            out[n++] = hex[*s >> 4];
            out[n++] = hex[*s & 15];
        }
    }
    out[n] = '\0';
}

/* "/v2/models/{m}[/versions/{v}]" of req into path. */
static void model_path(char *path, size_t len, const gw_grpc_req_t *req)
{
    snprintf(path, len, "/v2/models/");
    put_segment(path, len, req->name);
    if (req->version > 0)
        snprintf(path + strlen(path), len - strlen(path), "/versions/%d", req->version);
}

/* The HTTP request whose route a method answers as (the method, its path,
 * its JSON body or NULL), as a client of the frontend's HTTP would send
 * it; 0 for a method no route answers. */
static int http_request_of(int method, const gw_grpc_req_t *req, const char **hmethod, char *path,
                           size_t len, const char **body)
{
    *hmethod = "GET";
    *body = NULL;
    path[0] = '\0';
    switch (method) {
    case GW_GRPC_SERVER_LIVE:
        snprintf(path, len, "/v2/health/live");
        return 1;
    case GW_GRPC_SERVER_READY:
        snprintf(path, len, "/v2/health/ready");
        return 1;
    case GW_GRPC_SERVER_METADATA:
        snprintf(path, len, "/v2");
        return 1;
    case GW_GRPC_MODEL_READY:
    case GW_GRPC_MODEL_METADATA:
    case GW_GRPC_MODEL_CONFIG:
        model_path(path, len, req);
        snprintf(path + strlen(path), len - strlen(path), "%s",
                 method == GW_GRPC_MODEL_READY    ? "/ready"
                 : method == GW_GRPC_MODEL_CONFIG ? "/config"
                                                  : "");
        return 1;
    case GW_GRPC_MODEL_STATISTICS:
        if (req->name[0] != '\0')
            model_path(path, len, req);
        else
            snprintf(path, len, "/v2/models");
        snprintf(path + strlen(path), len - strlen(path), "/stats");
        return 1;
    case GW_GRPC_REPOSITORY_INDEX:
        *hmethod = "POST";
        *body = req->ready ? "{\"ready\": true}" : "{}";
        snprintf(path, len, "/v2/repository/index");
        return 1;
    case GW_GRPC_REPOSITORY_MODEL_LOAD:
    case GW_GRPC_REPOSITORY_MODEL_UNLOAD:
        *hmethod = "POST";
        *body = req->dependents ? "{\"parameters\": {\"unload_dependents\": true}}" : "{}";
        snprintf(path, len, "/v2/repository/models/");
        put_segment(path, len, req->name);
        snprintf(path + strlen(path), len - strlen(path), "%s",
                 method == GW_GRPC_REPOSITORY_MODEL_LOAD ? "/load" : "/unload");
        return 1;
    case GW_GRPC_SHM_STATUS:
    case GW_GRPC_SHM_UNREGISTER:
    case GW_GRPC_SHM_REGISTER:
    case GW_GRPC_CUDA_SHM_STATUS:
    case GW_GRPC_CUDA_SHM_UNREGISTER:
    case GW_GRPC_CUDA_SHM_REGISTER:
        snprintf(path, len, "/v2/%ssharedmemory",
                 method == GW_GRPC_SHM_STATUS || method == GW_GRPC_SHM_UNREGISTER ||
                         method == GW_GRPC_SHM_REGISTER
                     ? "system"
                     : "cuda");
        if (req->name[0] != '\0') {
            snprintf(path + strlen(path), len - strlen(path), "/region/");
            put_segment(path, len, req->name);
        }
        *hmethod =
            method == GW_GRPC_SHM_STATUS || method == GW_GRPC_CUDA_SHM_STATUS ? "GET" : "POST";
        snprintf(path + strlen(path), len - strlen(path), "%s",
                 method == GW_GRPC_SHM_STATUS || method == GW_GRPC_CUDA_SHM_STATUS ? "/status"
                 : method == GW_GRPC_SHM_REGISTER || method == GW_GRPC_CUDA_SHM_REGISTER
                     ? "/register"
                     : "/unregister");
        return 1;
    case GW_GRPC_TRACE_SETTING:
        /* No setting to change is a GET, as Triton's clients mean it. */
        *hmethod = req->settings != NULL ? "POST" : "GET";
        snprintf(path, len, "/v2");
        if (req->name[0] != '\0') {
            snprintf(path + strlen(path), len - strlen(path), "/models/");
            put_segment(path, len, req->name);
        }
        snprintf(path + strlen(path), len - strlen(path), "/trace/setting");
        return 1;
    case GW_GRPC_LOG_SETTINGS:
        *hmethod = req->settings != NULL ? "POST" : "GET";
        snprintf(path, len, "/v2/logging");
        return 1;
    default:
        return 0;
    }
}

/* ---- the call ---- */

/* The value of the client's metadata key, or NULL. */
static const grpc_slice *metadata(const gw_grpc_call_t *c, const char *key)
{
    size_t klen = strlen(key);
    for (size_t i = 0; i < c->md.count; i++) {
        const grpc_slice *k = &c->md.metadata[i].key;
        if (GRPC_SLICE_LENGTH(*k) == klen &&
            strncasecmp((const char *)GRPC_SLICE_START_PTR(*k), key, klen) == 0)
            return &c->md.metadata[i].value;
    }
    return NULL;
}

/* Whether the call carries the admin token, as HTTP's Authorization
 * header would (gw_require_admin); if not, answers UNAUTHENTICATED. */
static int admin_ok(gw_grpc_call_t *c)
{
    static const char bearer[] = "Bearer ";
    const grpc_slice *v = metadata(c, "authorization");
    size_t blen = sizeof(bearer) - 1;
    if (v != NULL) {
        const char *s = (const char *)GRPC_SLICE_START_PTR(*v);
        size_t n = GRPC_SLICE_LENGTH(*v);
        /* Leading blanks skipped, as HTTP's parser skips them before a
         * header's value: perf_analyzer's -H "authorization: Bearer ..."
         * sends " Bearer ..." as the metadata's value. */
        while (n > 0 && (*s == ' ' || *s == '\t')) {
            s++;
            n--;
        }
        if (n > blen && strncasecmp(s, bearer, blen) == 0 &&
            gw_token_matches(c->admin_token, s + blen, n - blen))
            return 1;
    }
    char why[160];
    snprintf(why, sizeof(why), "%s needs the admin token: %s", gw_grpc_method_name(c->method),
             v == NULL ? "send 'authorization: Bearer <admin token>' metadata"
                       : "invalid bearer token");
    gw_grpc_reply(c, gw_grpc_status_of(SQ_UNAUTHORIZED), why, NULL, 0);
    return 0;
}

/* Forwards c to its frontend's dispatcher as its HTTP route (hmethod,
 * path, body) is forwarded there, with its authorization metadata as the
 * header (the dispatcher checks the token, as it does the route's). */
static void forward(gw_grpc_call_t *c, const char *hmethod, const char *path, const char *body)
{
    char auth[512];
    const grpc_slice *v = metadata(c, "authorization");
    size_t n = v != NULL ? GRPC_SLICE_LENGTH(*v) : 0;
    const char *s = v != NULL ? (const char *)GRPC_SLICE_START_PTR(*v) : "";
    while (n > 0 && (*s == ' ' || *s == '\t')) {
        s++;
        n--;
    }
    /* Printable ASCII only: nothing that would end the header line. */
    int ok = v != NULL && n < sizeof(auth);
    for (size_t i = 0; ok && i < n; i++)
        ok = s[i] >= 0x20 && s[i] < 0x7f;
    if (ok) {
        memcpy(auth, s, n);
        auth[n] = '\0';
    }
    gw_api_forward(c->api, hmethod, path, ok ? auth : NULL, body, forward_answered, c);
}

/* Answers c, whose request is decoded into req (rc: 0, or the decoding's
 * error with why). */
static void answer_request(gw_grpc_call_t *c, const gw_grpc_req_t *req, int rc, char *why,
                           size_t whylen)
{
    /* On a frontend, a method whose route its HTTP forwards to the
     * dispatcher is forwarded the same way, its token checked there. */
    const char *hmethod, *hbody;
    char path[3 * sizeof(req->name) + 64];
    int fwd = rc == 0 && http_request_of(c->method, req, &hmethod, path, sizeof(path), &hbody) &&
              gw_api_forwarded(c->api, hmethod, path);
    if (gw_grpc_method_admin(c->method) && !fwd && !admin_ok(c))
        return;
    if (rc != 0) {
        fail(c, rc, why);
        return;
    }
    if (fwd) {
        forward(c, hmethod, path, hbody);
        return;
    }
    switch (c->method) {
    case GW_GRPC_SERVER_LIVE: {
        Inference__ServerLiveResponse r = INFERENCE__SERVER_LIVE_RESPONSE__INIT;
        r.live = 1; /* as GET /v2/health/live: answering is being live */
        send_message(c, &r.base);
        break;
    }
    case GW_GRPC_SERVER_READY:
        server_ready(c);
        break;
    case GW_GRPC_SERVER_METADATA:
        server_metadata(c);
        break;
    case GW_GRPC_MODEL_READY:
        gw_api_model_ready(c->api, req->name, req->version, fact_answered, c);
        break;
    case GW_GRPC_MODEL_METADATA:
        gw_api_model_metadata(c->api, req->name, req->version, fact_answered, c);
        break;
    case GW_GRPC_MODEL_CONFIG: {
        json_t *j;
        if ((rc = gw_api_model_config(c->api, req->name, req->version, &j, why, whylen)) != 0) {
            fail(c, rc, why);
            break;
        }
        model_config(c, j);
        json_decref(j);
        break;
    }
    case GW_GRPC_MODEL_STATISTICS: {
        json_t *j;
        if ((rc = gw_api_model_stats(c->api, req->name[0] ? req->name : NULL, req->version, &j, why,
                                     whylen)) != 0) {
            fail(c, rc, why);
            break;
        }
        model_statistics(c, j);
        json_decref(j);
        break;
    }
    case GW_GRPC_REPOSITORY_INDEX: {
        json_t *rows = gw_api_repository_index(c->api, req->ready);
        repository_index(c, rows);
        json_decref(rows);
        break;
    }
    case GW_GRPC_REPOSITORY_MODEL_LOAD:
    case GW_GRPC_REPOSITORY_MODEL_UNLOAD:
        gw_api_model_control(c->api, req->name, c->method == GW_GRPC_REPOSITORY_MODEL_LOAD,
                             req->dependents, control_answered, c);
        break;
    case GW_GRPC_SHM_STATUS: {
        json_t *j;
        if ((rc = gw_api_shm_status(c->api, req->name[0] ? req->name : NULL, &j, why, whylen)) !=
            0) {
            fail(c, rc, why);
            break;
        }
        shm_status(c, j);
        json_decref(j);
        break;
    }
    case GW_GRPC_SHM_REGISTER:
    case GW_GRPC_SHM_UNREGISTER: {
        json_t *gone = NULL;
        rc = c->method == GW_GRPC_SHM_REGISTER
                 ? gw_api_shm_register(c->api, req->name, req->key, req->offset, req->byte_size,
                                       why, whylen)
                 : gw_api_shm_unregister(c->api, req->name[0] ? req->name : NULL, &gone, why,
                                         whylen);
        json_decref(gone);
        if (rc != 0) {
            fail(c, rc, why);
            break;
        }
        Inference__SystemSharedMemoryRegisterResponse reg =
            INFERENCE__SYSTEM_SHARED_MEMORY_REGISTER_RESPONSE__INIT;
        Inference__SystemSharedMemoryUnregisterResponse unreg =
            INFERENCE__SYSTEM_SHARED_MEMORY_UNREGISTER_RESPONSE__INIT;
        send_message(c, c->method == GW_GRPC_SHM_REGISTER ? &reg.base : &unreg.base);
        break;
    }
    case GW_GRPC_CUDA_SHM_STATUS: {
        json_t *j;
        if ((rc = gw_api_cudashm_status(c->api, req->name[0] ? req->name : NULL, &j, why,
                                        whylen)) != 0) {
            fail(c, rc, why);
            break;
        }
        cuda_shm_status(c, j);
        json_decref(j);
        break;
    }
    case GW_GRPC_CUDA_SHM_REGISTER:
        fail(c, gw_api_cudashm_register(c->api, req->name, why, whylen), why);
        break;
    case GW_GRPC_CUDA_SHM_UNREGISTER: {
        if ((rc = gw_api_cudashm_unregister(c->api, req->name[0] ? req->name : NULL, why,
                                            whylen)) != 0) {
            fail(c, rc, why);
            break;
        }
        Inference__CudaSharedMemoryUnregisterResponse r =
            INFERENCE__CUDA_SHARED_MEMORY_UNREGISTER_RESPONSE__INIT;
        send_message(c, &r.base);
        break;
    }
    case GW_GRPC_TRACE_SETTING:
    case GW_GRPC_LOG_SETTINGS: {
        json_t *j;
        rc = c->method == GW_GRPC_TRACE_SETTING
                 ? gw_api_trace_setting(c->api, req->name[0] ? req->name : NULL, req->settings, &j,
                                        why, whylen)
                 : gw_api_log_settings(c->api, req->settings, &j, why, whylen);
        if (rc != 0) {
            fail(c, rc, why);
            break;
        }
        if (c->method == GW_GRPC_TRACE_SETTING)
            trace_setting(c, j);
        else
            log_settings(c, j);
        json_decref(j);
        break;
    }
    default:
        break;
    }
}

void gw_grpc_answer(gw_grpc_call_t *c)
{
    char why[512];
    if (c->method < 0) {
        snprintf(why, sizeof(why), "no such method %.*s; squish serves " SERVED " over gRPC",
                 (int)GRPC_SLICE_LENGTH(c->details.method),
                 (const char *)GRPC_SLICE_START_PTR(c->details.method));
        gw_grpc_reply(c, GRPC_STATUS_UNIMPLEMENTED, why, NULL, 0);
        return;
    }
    gw_grpc_req_t req;
    memset(&req, 0, sizeof(req));
    grpc_slice body = grpc_empty_slice();
    if (c->recv != NULL) {
        grpc_byte_buffer_reader rd;
        if (grpc_byte_buffer_reader_init(&rd, c->recv)) {
            body = grpc_byte_buffer_reader_readall(&rd);
            grpc_byte_buffer_reader_destroy(&rd);
        }
    }
    if (c->method == GW_GRPC_MODEL_STREAM_INFER) {
        grpc_slice_unref(body);
        gw_grpc_stream_start(c);
        return;
    }
    if (c->method == GW_GRPC_MODEL_INFER) {
        if (c->recv == NULL)
            fail(c, SQ_BAD_REQUEST, "ModelInfer: no request message came");
        else
            gw_grpc_model_infer(c, GRPC_SLICE_START_PTR(body), GRPC_SLICE_LENGTH(body));
        grpc_slice_unref(body);
        return;
    }
    int rc = SQ_BAD_REQUEST;
    if (c->recv == NULL)
        snprintf(why, sizeof(why), "%s: no request message came", gw_grpc_method_name(c->method));
    else
        rc = gw_grpc_decode((gw_grpc_method_t)c->method, GRPC_SLICE_START_PTR(body),
                            GRPC_SLICE_LENGTH(body), &req, why, sizeof(why));
    grpc_slice_unref(body);
    answer_request(c, &req, rc, why, sizeof(why));
    gw_grpc_req_dispose(&req);
}
