/* grpc/: internal to the room. The codec (grpc_codec.c): pure, without
 * the gRPC core or the rooms below (tests/fuzz/fuzz_grpc.c builds it
 * alone); the methods' answers (grpc_methods.c) and the calls' life on the
 * completion queue (grpc_server.c). */
#ifndef GW_GRPC_INT_H
#define GW_GRPC_INT_H

#include <sq_error.h>

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

/* The methods of the service, by their path's last segment. */
typedef enum {
    GW_GRPC_SERVER_LIVE,
    GW_GRPC_SERVER_READY,
    GW_GRPC_MODEL_READY,
    GW_GRPC_SERVER_METADATA,
    GW_GRPC_MODEL_METADATA,
    GW_GRPC_MODEL_INFER,
    GW_GRPC_MODEL_STREAM_INFER,
    GW_GRPC_MODEL_CONFIG,
    GW_GRPC_MODEL_STATISTICS,
    GW_GRPC_REPOSITORY_INDEX,
    GW_GRPC_REPOSITORY_MODEL_LOAD,
    GW_GRPC_REPOSITORY_MODEL_UNLOAD,
    GW_GRPC_SHM_STATUS,
    GW_GRPC_SHM_REGISTER,
    GW_GRPC_SHM_UNREGISTER,
    GW_GRPC_CUDA_SHM_STATUS,
    GW_GRPC_CUDA_SHM_REGISTER,
    GW_GRPC_CUDA_SHM_UNREGISTER,
    GW_GRPC_TRACE_SETTING,
    GW_GRPC_LOG_SETTINGS,
    GW_GRPC_METHOD_COUNT
} gw_grpc_method_t;

/* A method's name ("ServerLive") and whether HTTP's route for the same
 * needs the admin token. */
const char *gw_grpc_method_name(gw_grpc_method_t m);
int gw_grpc_method_admin(gw_grpc_method_t m);
/* The method a call's path names ("/inference.GRPCInferenceService/X"),
 * or -1. */
int gw_grpc_method_of(const char *path, size_t len);

/* What a request of the methods built so far asks, decoded and checked. */
typedef struct {
    /* a model's (MDB_NAME_MAX) or a shared-memory region's; "": every one
     * (ModelStatistics, SystemSharedMemoryStatus and -Unregister) */
    char name[129];
    int version; /* 0: the default one */
    int ready;   /* RepositoryIndex: only those that can serve */
    /* SystemSharedMemoryRegister: the object's name (shm_open's), window */
    char key[257];
    uint64_t offset, byte_size;
    int dependents; /* RepositoryModelUnload: parameters.unload_dependents */
    /* TraceSetting, LogSettings: the settings to change as their HTTP
     * route's POST body (an object; NULL: none, as a GET); owned, freed by
     * gw_grpc_req_dispose. TraceSetting's model_name is name. */
    json_t *settings;
} gw_grpc_req_t;
/* Frees what a decoded request owns (its settings); accepts one whose
 * decoding failed. */
void gw_grpc_req_dispose(gw_grpc_req_t *r);
/* Decodes a request of method m (its protobuf bytes) into out (then
 * gw_grpc_req_dispose, whatever the result): 0, or
 * SQ_BAD_REQUEST with why (not the method's message, a version that is no
 * number in 1..1000000000, a name too long). A method whose request is
 * empty takes any bytes of its message. */
int gw_grpc_decode(gw_grpc_method_t m, const uint8_t *data, size_t len, gw_grpc_req_t *out,
                   char *why, size_t whylen);
/* name (required: a model's) and version ("" or 1..1000000000) into out
 * (its name and version); 0, or SQ_BAD_REQUEST with why. */
int gw_grpc_name_version(const char *name, const char *version, gw_grpc_req_t *out, char *why,
                         size_t whylen);

/* The dims an answer's output has at most (batch included). */
#define GW_GRPC_MAX_DIMS 9

/* A ModelInferRequest as the body POST /v2/models/{m}/infer takes with
 * Triton's binary extension (grpc_infer_codec.c): the model and version
 * it names, and body (owned, malloc'd) whose first header_len bytes are
 * the JSON header, then each input's bytes (raw_input_contents, or the
 * typed contents packed as the binary extension packs them). Every
 * output is asked binary (raw_output_contents). */
typedef struct {
    char name[129];
    int version; /* 0: the default one */
    uint8_t *body;
    size_t len;
    long long header_len;
} gw_grpc_infer_req_t;
/* Decodes a ModelInferRequest into out: 0, or SQ_BAD_REQUEST (not the
 * message, a name or version refused, a parameter of the wrong kind,
 * contents and raw_input_contents mixed, raw_input_contents not one per
 * input), SQ_BAD_TENSOR (no data; typed contents in the wrong list or
 * not as many as the shape holds; a uint_contents value above 255) or
 * SQ_TOO_LARGE, with why; out is then empty. What the body says of the
 * model (names, datatypes, shapes, shared memory) the OIP codec checks. */
int gw_grpc_decode_infer(const uint8_t *data, size_t len, gw_grpc_infer_req_t *out, char *why,
                         size_t whylen);
/* Frees out's body; accepts a disposed or failed one. */
void gw_grpc_infer_req_dispose(gw_grpc_infer_req_t *r);
/* HTTP's answer to such a body (len bytes, its JSON header header_len
 * bytes, -1: all JSON) as a packed ModelInferResponse in *out (malloc'd,
 * *outlen bytes): model_name, model_version, id, the answer's parameters,
 * each output's name, datatype and shape, and one raw_output_contents
 * entry per output (empty for one in shared memory). 0, or SQ_INTERNAL
 * with why (not such an answer). */
int gw_grpc_encode_infer(const uint8_t *answer, size_t len, long long header_len, uint8_t **out,
                         size_t *outlen, char *why, size_t whylen);

/* A ModelStreamInferResponse (malloc'd, *outlen bytes) around a packed
 * ModelInferResponse (error NULL), or carrying error as its
 * error_message. */
uint8_t *gw_grpc_stream_response(const char *error, const uint8_t *response, size_t len,
                                 size_t *outlen);

/* The gRPC status code (grpc_status_code's value) an SQ_* error maps to,
 * as Triton maps its errors: not found, invalid argument, unauthenticated,
 * unavailable, already exists, failed precondition, internal. */
int gw_grpc_status_of(int err);

#endif
