/* codec/: the wire formats, pure functions (no I/O, no threads, no h2o
 * types; fuzzed): the Open Inference Protocol's JSON and binary tensors,
 * multipart bodies, and a model upload's config. */
#ifndef GW_CODEC_H
#define GW_CODEC_H

#include <jansson.h>
#include <mdb.h>
#include <sq_buf.h>
#include <stddef.h>
#include <stdint.h>

/* The codec of POST /v2/models/{m}[/versions/{v}]/infer: KServe v2 / Open
 * Inference Protocol JSON tensors plus Triton's binary tensor and
 * classification extensions. Pure: no I/O, no threads, no h2o types;
 * bounded in time and memory by the body and the model's limits; never
 * crashes on any input (fuzzed: tests/fuzz/fuzz_oip.c).
 *
 * jansson is not used on this path: it builds a node per number and parses
 * tensor-sized bodies at about 20 MB/s; this codec validates the JSON in one
 * flat pass (depth limited before anything recurses) and then reads the
 * tensors straight into their rows, several times faster.
 *
 * Request: {"id"?, "parameters"?: {"slo_ms"?, "timeout"? (µs), "priority"?,
 * "binary_data_output"?}, "inputs": [{"name", "shape", "datatype",
 * "parameters"?: {"binary_data_size"? | "shared_memory_region"?,
 * "shared_memory_offset"?, "shared_memory_byte_size"?}, "data"?}],
 * "outputs"?: [{"name", "parameters"?: {"binary_data"?, "classification"?,
 * "shared_memory_region"?, "shared_memory_offset"?,
 * "shared_memory_byte_size"?}}]}
 * (schemas/oip_infer_request.schema.json). Tensor inputs are FP32 or UINT8
 * [N, item...] with data flat, fully nested, or nested down to any level with
 * the trailing dims flattened; JPEG inputs are BYTES [N] or [N,1], base64 in
 * JSON or 4-byte little-endian length + bytes in the binary part.
 *
 * Response: {"model_name", "model_version"?, "id"?, "parameters"?,
 * "outputs": [{"name", "datatype", "shape", "data" | "parameters":
 * {"binary_data_size"} | "parameters": {"shared_memory_region",
 * "shared_memory_offset", "shared_memory_byte_size"}}]}
 * (schemas/oip_infer_response.schema.json). */

#define GW_OIP_MAX_INPUTS 4
#define GW_OIP_MAX_OUTPUTS 8
#define GW_OIP_MAX_DIMS 8  /* item dims (after the batch dim) */
#define GW_OIP_NAME_MAX 63 /* tensor names */
#define GW_OIP_ID_MAX 256  /* bytes of a request id */
#define GW_OIP_DEFAULT_DEPTH 32
#define GW_OIP_MAX_DEPTH 256
#define GW_OIP_DEFAULT_IMAGE_BYTES (64u << 20)
#define GW_OIP_REGION_MAX 127 /* bytes of a shared-memory region's name */

typedef enum {
    GW_OIP_FP32 = 0,
    GW_OIP_UINT8,
    GW_OIP_BYTES,
    GW_OIP_DATATYPE_COUNT_
} gw_oip_datatype_t;

/* "FP32", "UINT8", "BYTES"; "?" outside the enum. */
const char *gw_oip_datatype_name(gw_oip_datatype_t dt);
/* Bytes per element: 4, 1, and 0 for BYTES (variable). */
size_t gw_oip_datatype_size(gw_oip_datatype_t dt);

/* One input of the model. The item shape excludes the batch dim (which the
 * metadata shows as -1 in front): for an image CNN {3, 224, 224}. */
typedef struct {
    char name[GW_OIP_NAME_MAX + 1];
    gw_oip_datatype_t datatype; /* FP32 or UINT8: the tensor the model takes */
    /* Datatypes a request may send, as a mask of (1u << GW_OIP_*); 0 means
     * `datatype` plus BYTES (JPEG images to preprocess into this input). */
    unsigned accept;
    int item_ndim; /* 1..GW_OIP_MAX_DIMS */
    int64_t item_shape[GW_OIP_MAX_DIMS];
} gw_oip_input_desc_t;

typedef struct {
    char name[GW_OIP_NAME_MAX + 1];
    int item_ndim; /* 1..GW_OIP_MAX_DIMS, e.g. {1000} for logits */
    int64_t item_shape[GW_OIP_MAX_DIMS];
} gw_oip_output_desc_t;

/* What a model accepts and returns, and the limits of one request. Built by
 * the caller from the model's record; read only. */
typedef struct {
    int ninputs; /* 1..GW_OIP_MAX_INPUTS */
    gw_oip_input_desc_t inputs[GW_OIP_MAX_INPUTS];
    int noutputs; /* 1..GW_OIP_MAX_OUTPUTS; outputs are FP32 */
    gw_oip_output_desc_t outputs[GW_OIP_MAX_OUTPUTS];
    int max_batch; /* N in 1..max_batch (>= 1) */
    int max_depth; /* JSON nesting limit; 0 = GW_OIP_DEFAULT_DEPTH, at most GW_OIP_MAX_DEPTH */
    size_t max_body_bytes;  /* 0 = no limit here (the HTTP layer has one) */
    size_t max_image_bytes; /* per JPEG element; 0 = GW_OIP_DEFAULT_IMAGE_BYTES */
    /* 1: inputs and outputs may name shared-memory regions (the caller
     * resolves them, gw_oip_shm_t); 0: such a request is SQ_BAD_REQUEST. */
    int shared_memory;
} gw_oip_model_t;

/* A tensor in a registered shared-memory region instead of the body
 * (Triton's shared-memory extension): parameters.shared_memory_region,
 * shared_memory_offset (default 0) and shared_memory_byte_size. The codec
 * checks the byte size against the tensor (an input's exactly, as the
 * binary extension; an output's at least); the caller looks the region up,
 * checks offset and byte size against it, hands an input's bytes over with
 * gw_oip_input_set_bytes and writes an output's tensor there. */
typedef struct {
    char region[GW_OIP_REGION_MAX + 1]; /* "": the tensor is not in shared memory */
    uint64_t offset;
    uint64_t byte_size;
} gw_oip_shm_t;

/* One batch row of an input: JPEG bytes (datatype BYTES) or one tensor row of
 * item elements, little-endian and possibly unaligned (FP32/UINT8), to be
 * copied to the worker untouched. Points into the body or into memory the
 * request owns. */
typedef struct {
    const uint8_t *data;
    size_t len;
} gw_oip_row_t;

typedef struct {
    gw_oip_datatype_t datatype; /* as sent */
    int binary;                 /* came through the binary extension (points into the body) */
    gw_oip_row_t *rows;         /* batch rows, owned by the request */
    int position;               /* its index in the request's "inputs" */
    /* In shared memory: its rows are empty (NULL) until the caller hands
     * the region's bytes over (gw_oip_input_set_bytes). */
    gw_oip_shm_t shm;
} gw_oip_input_t;

typedef struct {
    int model_output;   /* index in model->outputs */
    int binary;         /* return as raw bytes after the JSON header */
    int classification; /* k > 0: top-k "score:index[:label]" BYTES instead of the tensor */
    /* Written into a shared-memory region by the caller: its byte_size holds
     * the tensor (checked), and the response names the region, no data. */
    gw_oip_shm_t shm;
} gw_oip_output_req_t;

/* A decoded request. Rows may point into the body: keep the body alive as
 * long as the request. */
typedef struct {
    int batch; /* N, the same for every input */
    char *id;  /* NULL when the request has none; NUL-terminated, id_len bytes (may hold NULs) */
    size_t id_len;
    double slo_ms;      /* parameters.slo_ms, or timeout µs / 1000, or -1 = the model's default */
    int slo_is_timeout; /* slo_ms came from Triton's timeout (an X-SLO-Ms header wins) */
    int priority;       /* parameters.priority; 0 = default, 1 = highest */
    int binary_data_output; /* parameters.binary_data_output */
    int header_len;         /* the JSON header length used (-1: none, whole body JSON) */
    gw_oip_input_t inputs[GW_OIP_MAX_INPUTS]; /* indexed like model->inputs */
    int noutputs;                             /* in request order; every model output when absent */
    gw_oip_output_req_t outputs[GW_OIP_MAX_OUTPUTS];
    /* private: memory the request owns */
    void **owned_;
    int nowned_, owned_cap_;
} gw_oip_request_t;

/* Decodes a request body. header_len is the Inference-Header-Content-Length
 * header (-1 when absent; 0: the whole body is one raw tensor of the model's
 * single input at batch 1, in the model's datatype, answered with every
 * output in JSON). Rows may point into body. Binary tensors must fill the
 * body after the header exactly, in the order of "inputs". On success
 * returns 0 and fills out (release it with gw_oip_request_dispose). On
 * failure returns a negative SQ_* code with a message naming the JSON path in
 * err ("inputs[0].shape: expected [N,3,224,224]"), out left empty and
 * disposable:
 *   SQ_BAD_JSON     not JSON (with the byte offset),
 *   SQ_BAD_TENSOR   an input's name, datatype, shape or data does not fit the model,
 *   SQ_BAD_REQUEST  anything else malformed (types of fields, binary framing),
 *   SQ_TOO_LARGE    over a limit: batch, body or image bytes, JSON depth, id length,
 *   SQ_NOMEM        a tensor buffer could not be allocated,
 *   SQ_INVAL        the model description itself is invalid (a caller bug).
 * A malformed body is SQ_BAD_JSON whatever else is wrong with it: the text is
 * validated before anything in it is read. An input in shared memory comes
 * back with its shm set and its rows empty (see gw_oip_input_set_bytes). */
int gw_oip_request_parse(const uint8_t *body, size_t len, long long header_len,
                         const gw_oip_model_t *model, gw_oip_request_t *out, char *err,
                         size_t errlen);
/* Hands over the bytes of input `input` (model index) that is in shared
 * memory: len is its shm.byte_size, data the region's bytes at its offset.
 * FP32/UINT8 rows are cut from them; BYTES elements are read as in the
 * binary extension (each a 4-byte little-endian length, then its bytes),
 * filling len exactly. The rows point into data, which must stay mapped
 * while they are used. Returns 0, or SQ_BAD_TENSOR / SQ_TOO_LARGE (an
 * image over the limit) / SQ_INVAL (not an input in shared memory, or len
 * not its byte size: a caller bug) with "inputs[i] (region "r"): why" in
 * err. */
int gw_oip_input_set_bytes(gw_oip_request_t *req, const gw_oip_model_t *model, int input,
                           const uint8_t *data, size_t len, char *err, size_t errlen);
/* Sets (replaces) the id echoed in the response, e.g. a generated one. */
void gw_oip_request_set_id(gw_oip_request_t *req, const char *id, size_t len);
/* Releases what the request owns; accepts NULL and a zeroed or failed request. */
void gw_oip_request_dispose(gw_oip_request_t *req);

/* A named number for the response's top-level "parameters" (timings...),
 * or a string when text is not NULL. */
typedef struct {
    const char *name;
    double value;
    const char *text;
} gw_oip_param_t;

typedef struct {
    const char *model_name;
    const char *model_version;       /* NULL: omitted */
    const gw_oip_model_t *model;     /* output names and item shapes */
    const gw_oip_request_t *request; /* batch, id, requested outputs and their forms */
    /* Per model output: batch x item floats, row-major; only the requested
     * outputs are read (others may be NULL). */
    const float *const *outputs;
    const char *const *labels; /* output 0's classification labels (UTF-8) by index, or NULL */
    int nlabels;
    const gw_oip_param_t *params; /* NULL/0: no "parameters" */
    int nparams;
} gw_oip_response_t;

/* Appends the response body to out. *header_len is -1 when the body is all
 * JSON, else the length of the JSON header for Inference-Header-Content-Length
 * (binary outputs follow it in order: FP32 little-endian, classification
 * strings as 4-byte length + bytes). An output in shared memory (its shm
 * set; the caller wrote it there) has no data, and parameters naming its
 * region, offset and the bytes the tensor takes there. Floats are printed with the
 * fewest digits that read back as the same float (gw_oip_format_float); NaN and
 * infinities as null. Returns 0, or
 * SQ_INVAL for a requested output without data. */
int gw_oip_response_encode(const gw_oip_response_t *resp, sq_buf_t *out, long long *header_len);

/* Writes f as JSON with the fewest significant digits that read back as
 * the same float (sq_shortest_float: "0.1", "-2.5", "1e-7", "0.33333334",
 * "3.4028235e38": fixed notation for exponents -4..8 as %g does). buf
 * needs 24 bytes; returns the length. Non-finite: "null". */
int gw_oip_format_float(float f, char *buf);

/* Strict base64 (RFC 4648 section 4): standard alphabet, padding required,
 * no whitespace, zero pad bits. Returns the decoded length or -1. out needs
 * gw_oip_base64_decoded_max(len) bytes. */
long long gw_oip_base64_decode(const char *in, size_t len, uint8_t *out);
size_t gw_oip_base64_decoded_max(size_t len);
/* Encodes (with padding) into out, which needs 4 * ((len + 2) / 3) bytes;
 * returns the length written. */
size_t gw_oip_base64_encode(const uint8_t *in, size_t len, char *out);

/* A strict, bounded multipart/form-data parser (RFC 7578 over RFC 2046).
 * Pure: no allocation, no I/O; parts point into the body. Used for model
 * uploads and multi-image inference; fuzzed (tests/fuzz). */

#define GW_MULTIPART_MAX_BOUNDARY 70  /* RFC 2046 */
#define GW_MULTIPART_MAX_HEADERS 4096 /* bytes of headers per part */

typedef struct {
    const char *name; /* form field name (not terminated; name_len) */
    size_t name_len;
    const char *filename; /* NULL when absent */
    size_t filename_len;
    const char *content_type; /* NULL when absent */
    size_t content_type_len;
    const uint8_t *data;
    size_t len;
} gw_part_t;

/* Extracts the boundary parameter of a multipart/form-data Content-Type
 * (quoted or not) into out (terminated). Returns 0, or SQ_MEDIA_TYPE when
 * the type is not multipart/form-data, or SQ_BAD_MULTIPART for a missing or
 * invalid boundary. */
int gw_multipart_boundary(const char *content_type, size_t len, char *out, size_t outlen);

/* Splits body into at most max_parts parts. Returns 0 with *nparts set, or
 * SQ_BAD_MULTIPART with a reason in err (missing delimiter, no closing
 * delimiter, a part without Content-Disposition form-data name, oversized
 * headers, malformed header line), or SQ_TOO_LARGE when there are more
 * than max_parts parts. */
int gw_multipart_parse(const uint8_t *body, size_t len, const char *boundary, gw_part_t *parts,
                       int max_parts, int *nparts, char *err, size_t errlen);

/* Whether a part's name equals s. */
int gw_part_is(const gw_part_t *p, const char *s);

/* Model configuration as operators send it with an upload, validated into
 * a typed struct. Pure (no I/O): parsed on the DB thread, fuzzed.
 *
 * Every field but `name` has a default, so {"name": "resnet18"} is a valid
 * config for an ONNX model: version 1, ImageNet mean/std, RGB, bilinear
 * resize to the graph's input size, labels "0".."K-1", no SLO, precision
 * fp32. "precision" ("fp32", "tf32", "fp16", "bf16") is the arithmetic the
 * workers' plans are asked to run in (a backend without it runs fp32 and
 * says so in the model's status).
 * An emulated model (no ONNX file) carries its profile instead:
 * {"name", "profile": {"alpha_ms", "beta_ms"} or {"batch": [...],
 * "latency_ms": [...], "latency_std_ms": [...]}, "max_batch", "memory_mb",
 * "input": {"shape": [3, 224, 224]}, "num_classes"}. An ONNX model may say
 * "input": {"shape": [...]} too: the sizes its input's symbolic dimensions
 * past the batch are served at (one per dimension after the batch, static
 * ones as the file has them; the importer checks them against the file).
 * An emulated detector
 * (for pipelines) says "detections": {"mean": gamma, "slots": K} instead of
 * num_classes: its outputs are "boxes" [N, K, 4] (normalized x0 y0 x1 y1,
 * on a grid so that no two overlap) and "scores" [N, K], and each item gets
 * a Poisson(gamma) count of slots scored 0.9 (the rest 0.05), drawn by the
 * emu worker. */

#define GW_MAX_PROFILE_ROWS 1024
#define GW_MAX_POLICY_VERSIONS 64
/* An emulated detector's boxes per item (the IPC bound SQ_MAX_EMU_DET_SLOTS). */
#define GW_EMU_DET_MAX_SLOTS 1024
#define GW_EMU_DET_DEFAULT_SLOTS 32
/* Sizes past the batch an upload config's input.shape may give (an input
 * of rank MDB_MAX_RANK), and the largest of them. */
#define GW_INPUT_MAX_RANK 7
#define GW_INPUT_MAX_DIM 65536

/* Which versions of a model are served (Triton's version_policy): all
 * (the default), the latest N ready ones, or the ones listed. The newest
 * upload's policy applies to every version of its name. */
typedef enum { GW_VP_ALL = 0, GW_VP_LATEST, GW_VP_SPECIFIC } gw_vp_kind_t;
typedef struct {
    gw_vp_kind_t kind;
    int latest;                           /* GW_VP_LATEST: N >= 1 */
    int versions[GW_MAX_POLICY_VERSIONS]; /* GW_VP_SPECIFIC */
    int nversions;
} gw_version_policy_t;

/* Parses Triton's JSON form: {"latest": {"num_versions": N}}, {"specific":
 * {"versions": [v, ...]}} or {"all": {}}. Returns 0, or SQ_BAD_CONFIG with
 * "config.version_policy...: why" in err. */
int gw_version_policy_parse(json_t *v, gw_version_policy_t *out, char *err, size_t errlen);
/* "latest 2", "versions 1, 3" or "all", for messages. */
void gw_version_policy_describe(const gw_version_policy_t *p, char *buf, size_t len);

typedef struct {
    char name[MDB_NAME_MAX + 1];
    int version;
    double default_slo_ms;
    int max_batch; /* 0 = choose (profiling / emulated default 64) */
    int precision; /* sq_device.h: 0 fp32 (the default), tf32, fp16, bf16 */
    /* preprocessing */
    char resize[16];        /* "bilinear" | "nearest" */
    char channel_order[4];  /* "RGB" | "BGR" */
    double mean[3], std[3]; /* on 0..255 pixel values */
    json_t *labels;         /* array of strings or NULL (then 0..K-1); owned */
    /* emulated */
    int emulated;
    int linear;
    double alpha_ms, beta_ms;
    int nrows;
    mdb_profile_row_t rows[GW_MAX_PROFILE_ROWS];
    double memory_mb;
    /* "input": {"shape": [...]}: the item's sizes past the batch, in the
     * model's order. An emulated model's [C, H, W] (default [3, 224, 224]);
     * an ONNX model's pin of the symbolic sizes of its input (Triton's
     * dims; mdb_input_pin_t), input_rank 0 when not given. */
    int input_rank;
    int input_shape[GW_INPUT_MAX_RANK];
    int num_classes;
    int det_slots;   /* emulated detector: K boxes per item; 0 = a classifier */
    double det_mean; /* emulated detector: mean detections per item */
    /* An ONNX detector's "detector": a pipeline crops_of's fields (without
     * "stage"), read by image/ against the graph's outputs at upload; /v1
     * answers its detections. NULL: none; owned. */
    json_t *detector;
    /* "segmenter": true: output 0 is [N, C, H, W] class scores per pixel;
     * /v1 answers the classes present and their pixel shares. */
    int segmenter;
} gw_model_config_t;

/* Parses and validates a config (JSON text). emulated: the upload carries
 * no ONNX file, so a profile is required. Returns 0, or SQ_BAD_CONFIG /
 * SQ_BAD_JSON with a message naming the JSON path in err ("config.version:
 * expected an integer >= 1"). */
int gw_model_config_parse(const char *json, size_t len, int emulated, gw_model_config_t *cfg,
                          char *err, size_t errlen);
/* Releases what the config owns; accepts NULL. */
void gw_model_config_dispose(gw_model_config_t *cfg);
/* Whether name is a valid model name: [A-Za-z0-9][A-Za-z0-9_.-]{0,63}. */
int gw_model_name_ok(const char *name, size_t len);
/* Parses a labels file: one label per line (CR/LF tolerated, trailing
 * empty line ignored). Returns a new array, or NULL with err set. */
json_t *gw_labels_parse(const char *text, size_t len, char *err, size_t errlen);

/* One output of a model's graph, as its record lists it. */
#define GW_MAX_OUTPUTS 8
#define GW_MAX_DIMS 8
typedef struct {
    char name[128];
    int ndims;
    int64_t dims[GW_MAX_DIMS]; /* dims[0] is the batch (-1 or N when symbolic) */
    int64_t elems;             /* floats per item: the product of dims[1..] */
} gw_output_t;

#endif
