/* squish error codes: negative ints from one X-macro table that also yields
 * the snake_case name sent to clients, the default human message and the
 * HTTP status. Detail text lives on the object that failed (request, job,
 * db handle), never in a global. */
#ifndef SQ_ERROR_H
#define SQ_ERROR_H

/* X(ENUM, name, http_status, message) */
#define SQ_ERRORS(X)                                                                               \
    X(OK, "ok", 200, "success")                                                                    \
    X(NOMEM, "out_of_memory", 503, "out of memory")                                                \
    X(INVAL, "invalid_argument", 400, "invalid argument")                                          \
    X(BAD_REQUEST, "bad_request", 400,                                                             \
      "malformed request: the message says which field and what it takes")                         \
    X(BAD_JSON, "bad_json", 400, "malformed JSON")                                                 \
    X(BAD_CONFIG, "bad_config", 400, "invalid configuration")                                      \
    X(BAD_MULTIPART, "bad_multipart", 400, "malformed multipart body")                             \
    X(BAD_IMAGE, "bad_image", 400, "the image could not be decoded: send a JPEG (image/jpeg)")     \
    X(BAD_TENSOR, "bad_tensor", 400,                                                               \
      "the input tensor does not match the model: GET /v2/models/{name} shows its inputs")         \
    X(UNAUTHORIZED, "unauthorized", 401, "missing or invalid bearer token")                        \
    X(NOT_FOUND, "not_found", 404, "not found")                                                    \
    X(MODEL_NOT_FOUND, "model_not_found", 404,                                                     \
      "no such model or version: GET /v2/repository/index lists them")                             \
    X(METHOD, "method_not_allowed", 405, "method not allowed")                                     \
    X(EXISTS, "already_exists", 409, "already exists")                                             \
    X(TOO_LARGE, "too_large", 413,                                                                 \
      "the request is too large (--max-body-mb, applied to inflated bodies too)")                  \
    X(HEADERS_TOO_LARGE, "headers_too_large", 431, "request header fields too large")              \
    X(MEDIA_TYPE, "unsupported_media_type", 415,                                                   \
      "unsupported media type: the message says what to send")                                     \
    X(UNSUPPORTED_MODEL, "unsupported_model", 422,                                                 \
      "the model uses operators the workers cannot run (the message names them and their nodes)")  \
    X(BAD_MODEL, "bad_model", 400,                                                                 \
      "the model file could not be parsed: send an ONNX file (a ModelProto)")                      \
    X(DEADLINE, "deadline", 503,                                                                   \
      "the deadline could not be met under the current load: retry after Retry-After; the "        \
      "message says the least SLO the request can meet")                                           \
    X(OVERLOAD, "overloaded", 503,                                                                 \
      "server overloaded (--max-inflight requests in flight); retry after Retry-After")            \
    X(NO_WORKER, "no_worker", 503,                                                                 \
      "no worker that can run the model is up, or none holds it before the deadline")              \
    X(WORKER_LOST, "worker_lost", 503, "worker lost while running the request")                    \
    X(NOT_READY, "not_ready", 503,                                                                 \
      "not ready: still being measured, or loading on a worker; retry shortly")                    \
    X(SHUTTING_DOWN, "shutting_down", 503, "server is shutting down")                              \
    X(IO, "io_error", 500, "I/O error")                                                            \
    X(DB, "database_error", 500, "database error")                                                 \
    X(PROTOCOL, "protocol_error", 500, "protocol error")                                           \
    X(DEVICE, "device_error", 500, "device error")                                                 \
    X(INTERNAL, "internal", 500, "internal error")                                                 \
    X(MODEL_FAILED, "model_failed", 409, "the model failed and cannot be served")                  \
    X(MODEL_UNLOADED, "model_unloaded", 409,                                                       \
      "the model is unloaded; POST /v2/repository/models/{name}/load serves it again")             \
    X(STANDBY, "standby", 503, "this squishd is a standby; ask the leader")                        \
    X(IN_USE, "in_use", 409,                                                                       \
      "a stored pipeline uses the model: the message names it; ?force=true goes ahead")            \
    X(SLO_TOO_TIGHT, "slo_too_tight", 400,                                                         \
      "the SLO is below the least the model or pipeline takes alone on idle workers: ask for the " \
      "least the message names or more, or for none (best effort)")

enum {
#define SQ_ERR_ENUM_(e, name, status, msg) SQ_ERR_##e##_IDX_,
    SQ_ERRORS(SQ_ERR_ENUM_)
#undef SQ_ERR_ENUM_
        SQ_ERR_COUNT_
};

/* SQ_OK is 0; every error is the negative of its table index. */
enum {
#define SQ_ERR_CODE_(e, name, status, msg) SQ_##e = -SQ_ERR_##e##_IDX_,
    SQ_ERRORS(SQ_ERR_CODE_)
#undef SQ_ERR_CODE_
};

/* The snake_case code sent to clients as "code"; "unknown" for a value outside the table. */
const char *sq_err_name(int err);
/* The error whose code is name (as sq_err_name gives it; a forwarded
 * answer's "code"), or 0 when none is. */
int sq_err_of_name(const char *name);
/* The default human-readable message. */
const char *sq_err_msg(int err);
/* The HTTP status the error maps to (500 for unknown values). */
int sq_err_http_status(int err);

#endif
