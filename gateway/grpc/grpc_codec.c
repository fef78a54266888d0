/* The gRPC room's pure part: method paths, request decoding and checks,
 * and the status an error maps to (gw_grpc.h). No gRPC core here: the
 * fuzz target (tests/fuzz/fuzz_grpc.c) builds it alone. */
#include "grpc_int.h"
#include "kserve_v2.pb-c.h"

#include <stdio.h>
#include <string.h>

static const struct {
    const char *name;
    int admin; /* HTTP's route needs the admin token */
} methods[GW_GRPC_METHOD_COUNT] = {
    [GW_GRPC_SERVER_LIVE] = {"ServerLive", 0},
    [GW_GRPC_SERVER_READY] = {"ServerReady", 0},
    [GW_GRPC_MODEL_READY] = {"ModelReady", 0},
    [GW_GRPC_SERVER_METADATA] = {"ServerMetadata", 0},
    [GW_GRPC_MODEL_METADATA] = {"ModelMetadata", 0},
    [GW_GRPC_MODEL_INFER] = {"ModelInfer", 0},
    [GW_GRPC_MODEL_STREAM_INFER] = {"ModelStreamInfer", 0},
    [GW_GRPC_MODEL_CONFIG] = {"ModelConfig", 0},
    [GW_GRPC_MODEL_STATISTICS] = {"ModelStatistics", 0},
    [GW_GRPC_REPOSITORY_INDEX] = {"RepositoryIndex", 0},
    [GW_GRPC_REPOSITORY_MODEL_LOAD] = {"RepositoryModelLoad", 1},
    [GW_GRPC_REPOSITORY_MODEL_UNLOAD] = {"RepositoryModelUnload", 1},
    [GW_GRPC_SHM_STATUS] = {"SystemSharedMemoryStatus", 1},
    [GW_GRPC_SHM_REGISTER] = {"SystemSharedMemoryRegister", 1},
    [GW_GRPC_SHM_UNREGISTER] = {"SystemSharedMemoryUnregister", 1},
    [GW_GRPC_CUDA_SHM_STATUS] = {"CudaSharedMemoryStatus", 1},
    [GW_GRPC_CUDA_SHM_REGISTER] = {"CudaSharedMemoryRegister", 1},
    [GW_GRPC_CUDA_SHM_UNREGISTER] = {"CudaSharedMemoryUnregister", 1},
    [GW_GRPC_TRACE_SETTING] = {"TraceSetting", 1},
    [GW_GRPC_LOG_SETTINGS] = {"LogSettings", 1},
};

#define SERVICE_PREFIX "/inference.GRPCInferenceService/"

const char *gw_grpc_method_name(gw_grpc_method_t m)
{
    return (unsigned)m < GW_GRPC_METHOD_COUNT ? methods[m].name : "?";
}

int gw_grpc_method_admin(gw_grpc_method_t m)
{
    return (unsigned)m < GW_GRPC_METHOD_COUNT && methods[m].admin;
}

int gw_grpc_method_of(const char *path, size_t len)
{
    size_t plen = sizeof(SERVICE_PREFIX) - 1;
    if (len <= plen || memcmp(path, SERVICE_PREFIX, plen) != 0)
        return -1;
    for (int m = 0; m < GW_GRPC_METHOD_COUNT; m++)
        if (strlen(methods[m].name) == len - plen &&
            memcmp(path + plen, methods[m].name, len - plen) == 0)
            return m;
    return -1;
}

/* A version field: "" (0: the default) or 1..1000000000 in decimal, as
 * HTTP's {version} segment (gw_parse_version). */
static int parse_version(const char *s, int *out)
{
    long long v = 0;
    *out = 0;
    if (s == NULL || s[0] == '\0')
        return 0;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9' || p - s >= 10)
            return -1;
        v = v * 10 + (*p - '0');
    }
    if (v < 1 || v > 1000000000)
        return -1;
    *out = (int)v;
    return 0;
}

/* name (required unless optional: "" is then every model) and version
 * ("" or 1..1000000000) into out. */
static int name_version(const char *name, const char *version, int optional, gw_grpc_req_t *out,
                        char *why, size_t whylen)
{
    size_t n = name != NULL ? strlen(name) : 0;
    if (n == 0 && !optional) {
        snprintf(why, whylen, "name: a model's name is required");
        return SQ_BAD_REQUEST;
    }
    if (n >= sizeof(out->name)) {
        snprintf(why, whylen, "name: at most %zu bytes", sizeof(out->name) - 1);
        return SQ_BAD_REQUEST;
    }
    memcpy(out->name, n > 0 ? name : "", n + 1);
    if (parse_version(version, &out->version) != 0) {
        snprintf(why, whylen, "version: expected \"\" (the default) or 1..1000000000, got '%.32s'",
                 version);
        return SQ_BAD_REQUEST;
    }
    if (n == 0 && out->version != 0) {
        snprintf(why, whylen, "version: only with a model's name");
        return SQ_BAD_REQUEST;
    }
    return 0;
}

/* RepositoryModelLoad's and -Unload's model, in squish's one repository
 * (repository_name empty). */
static int control_target(const char *repository, const char *name, gw_grpc_req_t *out, char *why,
                          size_t whylen)
{
    if (repository != NULL && repository[0] != '\0') {
        snprintf(why, whylen,
                 "repository_name: squish has one repository (leave it empty), not '%.64s'",
                 repository);
        return SQ_BAD_REQUEST;
    }
    return name_version(name, "", 0, out, why, whylen);
}

/* A load's or unload's parameter, as HTTP's body's: an unload takes
 * unload_dependents (a bool); a load's config or file: (its own
 * configuration or files) is refused, squish's models being in its DB. */
static int control_param(const char *key, const Inference__ModelRepositoryParameter *v, int load,
                         gw_grpc_req_t *out, char *why, size_t whylen)
{
    if (!load && strcmp(key, "unload_dependents") == 0 && v != NULL &&
        v->parameter_choice_case ==
            INFERENCE__MODEL_REPOSITORY_PARAMETER__PARAMETER_CHOICE_BOOL_PARAM) {
        out->dependents = v->bool_param != 0;
        return 0;
    }
    if (load && (strcmp(key, "config") == 0 || strncmp(key, "file:", 5) == 0))
        snprintf(why, whylen,
                 "parameter %.64s: squish serves the models stored in its DB; to change a "
                 "model's configuration or files, upload a new version with POST /models",
                 key);
    else
        snprintf(why, whylen, "unknown parameter %.64s; %s takes %s", key,
                 load ? "RepositoryModelLoad" : "RepositoryModelUnload",
                 load ? "none" : "only unload_dependents (a bool_param)");
    return SQ_BAD_REQUEST;
}

int gw_grpc_name_version(const char *name, const char *version, gw_grpc_req_t *out, char *why,
                         size_t whylen)
{
    memset(out, 0, sizeof(*out));
    return name_version(name, version, 0, out, why, whylen);
}

/* Sets o's key to j (stolen); 0, or SQ_BAD_REQUEST with why when either
 * is no UTF-8 (j NULL: its string was none), as a JSON body cannot be. */
static int set_setting(json_t *o, const char *key, json_t *j, char *why, size_t whylen)
{
    if (j != NULL && json_object_set_new(o, key, j) == 0)
        return 0;
    snprintf(why, whylen, "settings: a name or value that is no UTF-8");
    return SQ_BAD_REQUEST;
}

/* TraceSetting's settings as its route's body into *out: a setting
 * without values is null (a model's own cleared, as Triton's); trace_level
 * an array of its values, any other setting its one value (several: an
 * array, which the route refuses, as over HTTP). NULL when none is given
 * (a GET). */
static int trace_settings(const Inference__TraceSettingRequest *r, json_t **out, char *why,
                          size_t whylen)
{
    if (r->n_settings == 0)
        return 0;
    json_t *o = *out = json_object();
    for (size_t i = 0; i < r->n_settings; i++) {
        const Inference__TraceSettingRequest__SettingsEntry *e = r->settings[i];
        const Inference__TraceSettingRequest__SettingValue *v = e->value;
        size_t n = v != NULL ? v->n_value : 0;
        json_t *j;
        if (n == 0) {
            j = json_null();
        } else if (n == 1 && strcmp(e->key, "trace_level") != 0) {
            j = json_string(v->value[0]);
        } else {
            j = json_array();
            for (size_t k = 0; k < n; k++)
                json_array_append_new(j, json_string(v->value[k]));
            if (json_array_size(j) != n) { /* a value that is no UTF-8 */
                json_decref(j);
                j = NULL;
            }
        }
        if (set_setting(o, e->key, j, why, whylen) != 0)
            return SQ_BAD_REQUEST;
    }
    return 0;
}

/* LogSettings' settings as its route's body into *out: each value as its
 * kind (a bool, an integer, a string); one with none is null (left as it
 * is). NULL when none is given (a GET). */
static int log_settings(const Inference__LogSettingsRequest *r, json_t **out, char *why,
                        size_t whylen)
{
    if (r->n_settings == 0)
        return 0;
    json_t *o = *out = json_object();
    for (size_t i = 0; i < r->n_settings; i++) {
        const Inference__LogSettingsRequest__SettingsEntry *e = r->settings[i];
        const Inference__LogSettingsRequest__SettingValue *v = e->value;
        json_t *j;
        switch (v != NULL ? v->parameter_choice_case : 0) {
        case INFERENCE__LOG_SETTINGS_REQUEST__SETTING_VALUE__PARAMETER_CHOICE_BOOL_PARAM:
            j = json_boolean(v->bool_param);
            break;
        case INFERENCE__LOG_SETTINGS_REQUEST__SETTING_VALUE__PARAMETER_CHOICE_UINT32_PARAM:
            j = json_integer((json_int_t)v->uint32_param);
            break;
        case INFERENCE__LOG_SETTINGS_REQUEST__SETTING_VALUE__PARAMETER_CHOICE_STRING_PARAM:
            j = json_string(v->string_param);
            break;
        default:
            j = json_null();
            break;
        }
        if (set_setting(o, e->key, j, why, whylen) != 0)
            return SQ_BAD_REQUEST;
    }
    return 0;
}

void gw_grpc_req_dispose(gw_grpc_req_t *r)
{
    json_decref(r->settings);
    r->settings = NULL;
}

int gw_grpc_decode(gw_grpc_method_t m, const uint8_t *data, size_t len, gw_grpc_req_t *out,
                   char *why, size_t whylen)
{
    memset(out, 0, sizeof(*out));
    const ProtobufCMessageDescriptor *d = NULL;
    switch (m) {
    case GW_GRPC_SERVER_LIVE:
        d = &inference__server_live_request__descriptor;
        break;
    case GW_GRPC_SERVER_READY:
        d = &inference__server_ready_request__descriptor;
        break;
    case GW_GRPC_SERVER_METADATA:
        d = &inference__server_metadata_request__descriptor;
        break;
    case GW_GRPC_MODEL_READY:
        d = &inference__model_ready_request__descriptor;
        break;
    case GW_GRPC_MODEL_METADATA:
        d = &inference__model_metadata_request__descriptor;
        break;
    case GW_GRPC_MODEL_CONFIG:
        d = &inference__model_config_request__descriptor;
        break;
    case GW_GRPC_REPOSITORY_INDEX:
        d = &inference__repository_index_request__descriptor;
        break;
    case GW_GRPC_MODEL_STATISTICS:
        d = &inference__model_statistics_request__descriptor;
        break;
    case GW_GRPC_SHM_STATUS:
        d = &inference__system_shared_memory_status_request__descriptor;
        break;
    case GW_GRPC_SHM_REGISTER:
        d = &inference__system_shared_memory_register_request__descriptor;
        break;
    case GW_GRPC_SHM_UNREGISTER:
        d = &inference__system_shared_memory_unregister_request__descriptor;
        break;
    case GW_GRPC_REPOSITORY_MODEL_LOAD:
        d = &inference__repository_model_load_request__descriptor;
        break;
    case GW_GRPC_REPOSITORY_MODEL_UNLOAD:
        d = &inference__repository_model_unload_request__descriptor;
        break;
    case GW_GRPC_CUDA_SHM_STATUS:
        d = &inference__cuda_shared_memory_status_request__descriptor;
        break;
    case GW_GRPC_CUDA_SHM_REGISTER:
        d = &inference__cuda_shared_memory_register_request__descriptor;
        break;
    case GW_GRPC_CUDA_SHM_UNREGISTER:
        d = &inference__cuda_shared_memory_unregister_request__descriptor;
        break;
    case GW_GRPC_TRACE_SETTING:
        d = &inference__trace_setting_request__descriptor;
        break;
    case GW_GRPC_LOG_SETTINGS:
        d = &inference__log_settings_request__descriptor;
        break;
    default:
        /* ModelInfer's and the stream's requests: gw_grpc_decode_infer. */
        snprintf(why, whylen, "%s: not a request this decoder reads", gw_grpc_method_name(m));
        return SQ_BAD_REQUEST;
    }
    ProtobufCMessage *msg = protobuf_c_message_unpack(d, NULL, len, data);
    if (msg == NULL) {
        snprintf(why, whylen, "the request is no %s", d->name);
        return SQ_BAD_REQUEST;
    }
    int rc = 0;
    switch (m) {
    case GW_GRPC_MODEL_READY: {
        Inference__ModelReadyRequest *r = (Inference__ModelReadyRequest *)msg;
        rc = name_version(r->name, r->version, 0, out, why, whylen);
        break;
    }
    case GW_GRPC_MODEL_METADATA: {
        Inference__ModelMetadataRequest *r = (Inference__ModelMetadataRequest *)msg;
        rc = name_version(r->name, r->version, 0, out, why, whylen);
        break;
    }
    case GW_GRPC_MODEL_CONFIG: {
        Inference__ModelConfigRequest *r = (Inference__ModelConfigRequest *)msg;
        rc = name_version(r->name, r->version, 0, out, why, whylen);
        break;
    }
    case GW_GRPC_MODEL_STATISTICS: {
        Inference__ModelStatisticsRequest *r = (Inference__ModelStatisticsRequest *)msg;
        rc = name_version(r->name, r->version, 1, out, why, whylen);
        break;
    }
    case GW_GRPC_SHM_STATUS:
        rc = name_version(((Inference__SystemSharedMemoryStatusRequest *)msg)->name, "", 1, out,
                          why, whylen);
        break;
    case GW_GRPC_SHM_UNREGISTER:
        rc = name_version(((Inference__SystemSharedMemoryUnregisterRequest *)msg)->name, "", 1, out,
                          why, whylen);
        break;
    case GW_GRPC_SHM_REGISTER: {
        Inference__SystemSharedMemoryRegisterRequest *r =
            (Inference__SystemSharedMemoryRegisterRequest *)msg;
        rc = name_version(r->name, "", 0, out, why, whylen);
        size_t k = r->key != NULL ? strlen(r->key) : 0;
        if (rc == 0 && k >= sizeof(out->key)) {
            snprintf(why, whylen, "key: at most %zu bytes", sizeof(out->key) - 1);
            rc = SQ_BAD_REQUEST;
        } else if (rc == 0) {
            memcpy(out->key, k > 0 ? r->key : "", k + 1);
            out->offset = r->offset;
            out->byte_size = r->byte_size;
        }
        break;
    }
    case GW_GRPC_REPOSITORY_MODEL_LOAD: {
        Inference__RepositoryModelLoadRequest *r = (Inference__RepositoryModelLoadRequest *)msg;
        rc = control_target(r->repository_name, r->model_name, out, why, whylen);
        for (size_t k = 0; rc == 0 && k < r->n_parameters; k++)
            rc = control_param(r->parameters[k]->key, r->parameters[k]->value, 1, out, why, whylen);
        break;
    }
    case GW_GRPC_REPOSITORY_MODEL_UNLOAD: {
        Inference__RepositoryModelUnloadRequest *r = (Inference__RepositoryModelUnloadRequest *)msg;
        rc = control_target(r->repository_name, r->model_name, out, why, whylen);
        for (size_t k = 0; rc == 0 && k < r->n_parameters; k++)
            rc = control_param(r->parameters[k]->key, r->parameters[k]->value, 0, out, why, whylen);
        break;
    }
    case GW_GRPC_CUDA_SHM_STATUS:
        rc = name_version(((Inference__CudaSharedMemoryStatusRequest *)msg)->name, "", 1, out, why,
                          whylen);
        break;
    case GW_GRPC_CUDA_SHM_UNREGISTER:
        rc = name_version(((Inference__CudaSharedMemoryUnregisterRequest *)msg)->name, "", 1, out,
                          why, whylen);
        break;
    case GW_GRPC_CUDA_SHM_REGISTER:
        rc = name_version(((Inference__CudaSharedMemoryRegisterRequest *)msg)->name, "", 0, out,
                          why, whylen);
        break;
    case GW_GRPC_TRACE_SETTING: {
        Inference__TraceSettingRequest *r = (Inference__TraceSettingRequest *)msg;
        rc = name_version(r->model_name, "", 1, out, why, whylen);
        if (rc == 0)
            rc = trace_settings(r, &out->settings, why, whylen);
        break;
    }
    case GW_GRPC_LOG_SETTINGS:
        rc = log_settings((Inference__LogSettingsRequest *)msg, &out->settings, why, whylen);
        break;
    case GW_GRPC_REPOSITORY_INDEX: {
        Inference__RepositoryIndexRequest *r = (Inference__RepositoryIndexRequest *)msg;
        /* One repository (squish's model DB): any name but "" is another. */
        if (r->repository_name != NULL && r->repository_name[0] != '\0') {
            snprintf(why, whylen,
                     "repository_name: squish has one repository (leave it empty), not '%.64s'",
                     r->repository_name);
            rc = SQ_BAD_REQUEST;
        }
        out->ready = r->ready != 0;
        break;
    }
    default:
        break;
    }
    protobuf_c_message_free_unpacked(msg, NULL);
    return rc;
}

/* grpc_status_code's values (grpc/impl/codegen/status.h), which the
 * codec names without the core's header. */
enum {
    ST_INVALID_ARGUMENT = 3,
    ST_DEADLINE_EXCEEDED = 4,
    ST_NOT_FOUND = 5,
    ST_ALREADY_EXISTS = 6,
    ST_RESOURCE_EXHAUSTED = 8,
    ST_FAILED_PRECONDITION = 9,
    ST_UNIMPLEMENTED = 12,
    ST_INTERNAL = 13,
    ST_UNAVAILABLE = 14,
    ST_UNAUTHENTICATED = 16,
};

int gw_grpc_status_of(int err)
{
    switch (err) {
    case SQ_OK:
        return 0;
    case SQ_NOT_FOUND:
    case SQ_MODEL_NOT_FOUND:
        return ST_NOT_FOUND;
    case SQ_UNAUTHORIZED:
        return ST_UNAUTHENTICATED;
    case SQ_EXISTS:
        return ST_ALREADY_EXISTS;
    case SQ_MODEL_FAILED:
    case SQ_MODEL_UNLOADED:
    case SQ_IN_USE:
        return ST_FAILED_PRECONDITION;
    case SQ_TOO_LARGE:
    case SQ_HEADERS_TOO_LARGE:
        return ST_RESOURCE_EXHAUSTED;
    case SQ_METHOD:
        return ST_UNIMPLEMENTED;
    default:
        break;
    }
    switch (sq_err_http_status(err)) {
    case 400:
    case 415:
    case 422:
        return ST_INVALID_ARGUMENT;
    case 503:
        return ST_UNAVAILABLE;
    case 504:
        return ST_DEADLINE_EXCEEDED;
    default:
        return ST_INTERNAL;
    }
}
