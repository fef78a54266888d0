/* mdb_graph: the model graph IR that squish shares between the ONNX
 * importer (modeldb/), the shared-prefix hasher (modeldb/) and the worker's
 * executor (worker/). The graph is data: tensors, nodes that record their
 * op, inputs, outputs and typed attributes, and the graph's inputs and
 * outputs. Nothing here computes a model; the only arithmetic is shape
 * inference and the constant folding the importer needs.
 *
 * Canonical form. After mdb_onnx_import the graph is canonical, so that the
 * executor reads one form per op whatever opset the file used:
 *   - nodes are in topological order; every tensor has a static shape in
 *     which only the batch dimension may be symbolic (MDB_DIM_BATCH), or,
 *     where a reshape merged the batch into another dimension, one
 *     dimension k * N (-k); such a graph is not batch-outermost
 *     (mdb_graph_batch_outermost) and is planned per batch size;
 *   - constant subgraphs are folded: a tensor whose data is known carries
 *     it (t->data), and only runtime ops (mdb_op_is_runtime) remain;
 *   - parameters that ONNX passes as constant inputs are attributes, and the
 *     node keeps only its data inputs (see the per-op list below);
 *   - axes are non-negative, auto_pad is resolved into explicit pads;
 *   - Identity and Dropout are gone (readers read their input) unless they
 *     write a graph output; Squeeze/Unsqueeze on runtime data are Reshapes;
 *   - runtime ops read and write float tensors only;
 *   - batch_fixed is 0 when any batch size works; a file whose shapes only
 *     hold for its declared batch (a Reshape to [1, -1]) gets that batch.
 *
 * Per-op canonical attributes (all optional ones are filled in):
 *   Conv                X, W[, B]; kernel_shape, strides, dilations, pads
 *                       (begin..., end...), group
 *   MaxPool             kernel_shape, strides, dilations, pads, ceil_mode
 *   AveragePool         kernel_shape, strides, pads, ceil_mode, count_include_pad
 *   GlobalAveragePool   -
 *   Relu Sigmoid HardSwish Identity Dropout   - (Dropout: inference; a mask
 *                       output, when read, is bool and all true)
 *   Clip                min, max (floats; -inf/+inf when absent)
 *   LeakyRelu           alpha          HardSigmoid   alpha, beta
 *   Gemm                A, B[, C]; alpha, beta, transA, transB
 *   MatMul Add Mul Sub Div   numpy broadcasting, two inputs
 *   Concat              axis           Flatten   axis
 *   Reshape             shape (= the output shape, batch as MDB_DIM_BATCH)
 *   Transpose           perm           Softmax   axis (opset-13 meaning)
 *   Pad                 pads (begin..., end...), mode ("constant", "reflect",
 *                       "edge"), value (float)
 *   ReduceMean          axes (sorted, never empty), keepdims
 *   BatchNormalization  X, scale, B, mean, var; epsilon
 *   Split               axis, split (one size per output)
 *   Slice               axes, starts, ends, steps (clamped to the axis, same
 *                       length; on the batch axis only 0, INT64_MAX, 1)
 *   Pow                 exponent (float; ONNX's second input, a constant
 *                       scalar: LayerNorm's x^2 as torch exports it)
 *   Sqrt Erf            -
 *   Expand              shape (= the output shape, batch as MDB_DIM_BATCH;
 *                       ViT's class token expanded over the batch)
 *   Equal Where Mod Range Not ScatterND   import-time only (folded: Swin's
 *                       window padding, shifts and attention mask)
 *   Gather              axis; on runtime data only one constant scalar index,
 *                       as the attribute index (>= 0; the axis is dropped:
 *                       ViT's x[:, 0]); otherwise folded
 *   LayerNormalization  X[, scale, B]; axis, epsilon (also what modeldb/fuse.c
 *                       makes of torch's decomposed LayerNorm)
 *   Gelu                - (approximate "none"; also fuse.c's of torch's Erf GELU)
 *   Einsum              A, B; transB: only the batched matrix products
 *                       "...ik,...kj->...ij" (0) and "...ik,...jk->...ij" (1),
 *                       same leading labels everywhere (MaxViT's attention)
 *   Tanh Neg Exp        -
 *   Resize              mode ("nearest", "linear", "cubic"; opset 10 has
 *                       no "cubic"), cubic_coeff_a and exclude_outside (as
 *                       given; ONNX's defaults -0.75 and 0 where absent),
 *                       coordinate_transformation_mode, nearest_mode (ONNX's
 *                       defaults filled in; opset 10: "asymmetric" and
 *                       "floor", or "ceil" when downscaling), scales (floats,
 *                       one per dim: the given ones, or sizes / input dims
 *                       as float), sizes (= the output shape, batch as
 *                       MDB_DIM_BATCH); the roi, scales and sizes inputs
 *                       are gone (they must be constants or fold to them)
 *   ConvTranspose       X, W[, B]; kernel_shape, strides, dilations, pads
 *                       (begin..., end...), output_padding, group (explicit
 *                       pads only: output_shape and auto_pad are refused)
 *
 * Ownership: a graph owns every tensor, its name and its data, every node
 * and attribute. Strings passed in are copied. mdb_graph_free releases all.
 * A graph is not thread-safe while it is built; once built it is read-only
 * and may be shared by threads. */
#ifndef MDB_GRAPH_H
#define MDB_GRAPH_H

#include <assert.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <sq_device.h>

/* Limits that keep a hostile model from exhausting memory or time. */
#define MDB_MAX_RANK 8
#define MDB_MAX_NODES 100000
#define MDB_MAX_TENSORS 400000
#define MDB_MAX_NODE_IO 4096
#define MDB_MAX_NODE_ATTRS 64
#define MDB_MAX_ATTR_LIST 4096
#define MDB_MAX_DIM ((int64_t)1 << 31)
#define MDB_MAX_ELEMENTS ((int64_t)1 << 31)
/* Constant folding never creates a tensor larger than this. */
#define MDB_MAX_FOLD_ELEMENTS ((int64_t)1 << 24)

/* A dimension equal to this is the symbolic batch size N; any other
 * negative dimension -k is k * N (the batch merged with a dimension of k:
 * attention's [N * heads, tokens, d]). */
#define MDB_DIM_BATCH ((int64_t)-1)

/* X(ENUM, onnx_name, runtime): runtime ops are what the worker executes;
 * the others exist only at import time and must be folded away. */
#define MDB_OPS(X)                                                                                 \
    X(CONV, "Conv", true)                                                                          \
    X(RELU, "Relu", true)                                                                          \
    X(CLIP, "Clip", true)                                                                          \
    X(LEAKY_RELU, "LeakyRelu", true)                                                               \
    X(SIGMOID, "Sigmoid", true)                                                                    \
    X(HARD_SIGMOID, "HardSigmoid", true)                                                           \
    X(HARD_SWISH, "HardSwish", true)                                                               \
    X(MAX_POOL, "MaxPool", true)                                                                   \
    X(AVERAGE_POOL, "AveragePool", true)                                                           \
    X(GLOBAL_AVERAGE_POOL, "GlobalAveragePool", true)                                              \
    X(GEMM, "Gemm", true)                                                                          \
    X(MATMUL, "MatMul", true)                                                                      \
    X(ADD, "Add", true)                                                                            \
    X(MUL, "Mul", true)                                                                            \
    X(SUB, "Sub", true)                                                                            \
    X(DIV, "Div", true)                                                                            \
    X(CONCAT, "Concat", true)                                                                      \
    X(FLATTEN, "Flatten", true)                                                                    \
    X(RESHAPE, "Reshape", true)                                                                    \
    X(TRANSPOSE, "Transpose", true)                                                                \
    X(SOFTMAX, "Softmax", true)                                                                    \
    X(PAD, "Pad", true)                                                                            \
    X(DROPOUT, "Dropout", true)                                                                    \
    X(IDENTITY, "Identity", true)                                                                  \
    X(REDUCE_MEAN, "ReduceMean", true)                                                             \
    X(BATCH_NORM, "BatchNormalization", true)                                                      \
    X(SPLIT, "Split", true)                                                                        \
    X(SLICE, "Slice", true)                                                                        \
    X(POW, "Pow", true)                                                                            \
    X(SQRT, "Sqrt", true)                                                                          \
    X(ERF, "Erf", true)                                                                            \
    X(EXPAND, "Expand", true)                                                                      \
    X(LAYER_NORM, "LayerNormalization", true)                                                      \
    X(GELU, "Gelu", true)                                                                          \
    X(EINSUM, "Einsum", true)                                                                      \
    X(TANH, "Tanh", true)                                                                          \
    X(NEG, "Neg", true)                                                                            \
    X(EXP, "Exp", true)                                                                            \
    X(RESIZE, "Resize", true)                                                                      \
    X(CONV_TRANSPOSE, "ConvTranspose", true)                                                       \
    X(CONSTANT, "Constant", false)                                                                 \
    X(SHAPE, "Shape", false)                                                                       \
    X(GATHER, "Gather", true)                                                                      \
    X(UNSQUEEZE, "Unsqueeze", false)                                                               \
    X(SQUEEZE, "Squeeze", false)                                                                   \
    X(CAST, "Cast", false)                                                                         \
    X(CONSTANT_OF_SHAPE, "ConstantOfShape", false)                                                 \
    X(EQUAL, "Equal", false)                                                                       \
    X(WHERE, "Where", false)                                                                       \
    X(MOD, "Mod", false)                                                                           \
    X(RANGE, "Range", false)                                                                       \
    X(NOT, "Not", false)                                                                           \
    X(SCATTER_ND, "ScatterND", false)

typedef enum {
#define MDB_OP_ENUM_(e, name, runtime) MDB_OP_##e,
    MDB_OPS(MDB_OP_ENUM_)
#undef MDB_OP_ENUM_
        MDB_OP_COUNT
} mdb_op_t;

/* Keep in step with MDB_OPS: the name table in graph.c is checked too. */
static_assert(MDB_OP_COUNT == 53, "update the op count when adding ops");

/* The ONNX op_type of op ("?" outside the enum). */
const char *mdb_op_name(mdb_op_t op);
/* Looks up an ONNX op_type (case-sensitive); returns -1 when unknown. */
int mdb_op_from_name(const char *name);
/* Whether the worker executes op (false: import-time only). */
bool mdb_op_is_runtime(mdb_op_t op);

typedef enum {
    MDB_DT_UNDEFINED = 0,
    MDB_DT_FLOAT,
    MDB_DT_UINT8,
    MDB_DT_INT8,
    MDB_DT_INT32,
    MDB_DT_INT64,
    MDB_DT_BOOL,
    MDB_DT_COUNT
} mdb_dtype_t;

/* Bytes per element (0 for UNDEFINED). */
size_t mdb_dtype_size(mdb_dtype_t dt);
/* "float", "uint8", ... (OIP names are the caller's business). */
const char *mdb_dtype_name(mdb_dtype_t dt);

/* A static shape; dims[i] >= 0, or MDB_DIM_BATCH for the symbolic batch
 * (-k: k times the batch). */
typedef struct {
    int rank;
    int64_t dims[MDB_MAX_RANK];
} mdb_shape_t;

/* Elements of shape with the batch bound to batch; -1 on overflow. */
int64_t mdb_shape_numel(const mdb_shape_t *shape, int64_t batch);
/* Whether shape contains the batch (a negative dimension). */
bool mdb_shape_has_batch(const mdb_shape_t *shape);
bool mdb_shape_eq(const mdb_shape_t *a, const mdb_shape_t *b);
/* Writes "[N,3,224,224]" ("[197,12N,64]" for a merged batch) into buf
 * (always terminated). */
void mdb_shape_str(const mdb_shape_t *shape, char *buf, size_t len);

typedef struct {
    char *name;
    mdb_dtype_t dtype;
    mdb_shape_t shape;
    bool shape_known;
    /* Constant data (initializer or folded), C order, little-endian; NULL
     * for activations. Owned by the graph. */
    void *data;
    size_t nbytes;
    /* The node that writes this tensor, or -1 (graph input or constant). */
    int producer;
    bool is_input;
    bool is_output;
} mdb_tensor_t;

typedef enum {
    MDB_ATTR_INT,
    MDB_ATTR_FLOAT,
    MDB_ATTR_INTS,
    MDB_ATTR_FLOATS,
    MDB_ATTR_STRING,
    MDB_ATTR_TENSOR,
} mdb_attr_type_t;

typedef struct {
    char *name;
    mdb_attr_type_t type;
    int64_t i;
    float f;
    /* INTS / FLOATS: count elements; STRING: s (terminated, count bytes);
     * TENSOR: tensor is a graph tensor index carrying data. */
    size_t count;
    int64_t *ints;
    float *floats;
    char *s;
    int tensor;
} mdb_attr_t;

typedef struct {
    mdb_op_t op;
    char *name;
    int n_inputs;
    int *inputs; /* tensor indices; -1 for an omitted optional input */
    int n_outputs;
    int *outputs;
    int n_attrs;
    mdb_attr_t *attrs;
} mdb_node_t;

typedef struct mdb_graph {
    int n_tensors, cap_tensors;
    mdb_tensor_t *tensors;
    int n_nodes, cap_nodes;
    mdb_node_t *nodes;
    int n_inputs;
    int *inputs; /* runtime inputs only (never initializers) */
    int n_outputs;
    int *outputs;
    int64_t opset;       /* default-domain opset of the source model */
    int64_t batch_fixed; /* 0 when the batch is symbolic, else the only batch */
} mdb_graph_t;

/* An empty graph (aborts on OOM: bookkeeping). */
mdb_graph_t *mdb_graph_new(void);
/* Accepts NULL. */
void mdb_graph_free(mdb_graph_t *g);

/* Adds a tensor (name copied; shape may be NULL for unknown); returns its index. */
int mdb_graph_add_tensor(mdb_graph_t *g, const char *name, mdb_dtype_t dtype,
                         const mdb_shape_t *shape);
/* Gives the tensor constant data (ownership of data moves to the graph;
 * any previous data is freed). nbytes must equal numel * dtype size. */
void mdb_graph_set_data(mdb_graph_t *g, int tensor, void *data, size_t nbytes);
/* Adds a node (arrays copied); returns its index. */
int mdb_graph_add_node(mdb_graph_t *g, mdb_op_t op, const char *name, const int *inputs,
                       int n_inputs, const int *outputs, int n_outputs);
void mdb_graph_add_input(mdb_graph_t *g, int tensor);
void mdb_graph_add_output(mdb_graph_t *g, int tensor);

/* Attribute setters replace an attribute of the same name. */
void mdb_node_set_int(mdb_node_t *n, const char *name, int64_t v);
void mdb_node_set_float(mdb_node_t *n, const char *name, float v);
void mdb_node_set_ints(mdb_node_t *n, const char *name, const int64_t *v, size_t count);
void mdb_node_set_floats(mdb_node_t *n, const char *name, const float *v, size_t count);
void mdb_node_set_string(mdb_node_t *n, const char *name, const char *s, size_t len);
void mdb_node_set_tensor(mdb_node_t *n, const char *name, int tensor);
/* Removes the attribute if present. */
void mdb_node_del_attr(mdb_node_t *n, const char *name);

/* The attribute called name, or NULL. */
const mdb_attr_t *mdb_node_attr(const mdb_node_t *n, const char *name);
/* Typed getters: the value, or def when absent or of another type. */
int64_t mdb_node_int(const mdb_node_t *n, const char *name, int64_t def);
float mdb_node_float(const mdb_node_t *n, const char *name, float def);
/* The list and its length in *count, or NULL (count 0) when absent. */
const int64_t *mdb_node_ints(const mdb_node_t *n, const char *name, size_t *count);
const float *mdb_node_floats(const mdb_node_t *n, const char *name, size_t *count);
/* The string, or def. */
const char *mdb_node_string(const mdb_node_t *n, const char *name, const char *def);

/* Reorders nodes topologically (Kahn, stable: ties keep file order) and
 * fills every tensor's producer. Returns 0, or SQ_BAD_MODEL for a cycle or
 * a tensor written twice, with detail in err (may be NULL). */
int mdb_graph_toposort(mdb_graph_t *g, char *err, size_t errlen);

/* Infers the output shapes of node idx from its (known) input shapes.
 * Returns 0, SQ_BAD_MODEL when the shapes are inconsistent, or
 * SQ_UNSUPPORTED_MODEL when the result is not expressible (e.g. a batch
 * merged into another dimension); detail in err. */
int mdb_graph_infer_node(mdb_graph_t *g, int idx, char *err, size_t errlen);
/* Runs mdb_graph_infer_node over the whole (sorted) graph. */
int mdb_graph_infer_shapes(mdb_graph_t *g, char *err, size_t errlen);

/* Removes nodes whose outputs nobody needs and tensors nobody references,
 * renumbering indices; keeps topological order. */
void mdb_graph_compact(mdb_graph_t *g);

/* Whether every tensor that holds the batch holds it as N in dim 0, so that
 * one plan runs every batch size. When not (ViT's and Swin's attention
 * reshape [N, tokens, C] to [N * heads, tokens, d]; torch's MHA transposes
 * to [tokens, N, C]), the worker plans each batch size with the batch
 * bound (wk_plan_create), and the importer checks instead that items stay
 * apart (mdb_graph_items_apart). */
bool mdb_graph_batch_outermost(const mdb_graph_t *g);
/* For such a graph: whether every op keeps the items of a batch apart (no
 * reduction, normalization, product, concat or window along the batch's
 * dimension; reshapes that keep each item's elements together), and the
 * inputs and outputs hold the batch in dim 0. Returns 0, or
 * SQ_UNSUPPORTED_MODEL with "Op node 'name': reason" in err and the node in
 * *bad_node (an output's writer; -1 for an input; may be NULL). */
int mdb_graph_items_apart(const mdb_graph_t *g, int *bad_node, char *err, size_t errlen);

/* Checks the invariants of a canonical graph: indices in range, nodes in
 * topological order with every input written before it is read, each
 * tensor written once, known shapes of rank <= MDB_MAX_RANK with the batch
 * only as negative dims (MDB_DIM_BATCH or -k), constant data whose size
 * matches its shape, only runtime ops. Returns 0 or SQ_INTERNAL with detail in err: a failure is a
 * bug in whatever built the graph. */
int mdb_graph_validate(const mdb_graph_t *g, char *err, size_t errlen);

/* Bytes of constant data held by tensors that runtime nodes read. */
uint64_t mdb_graph_param_bytes(const mdb_graph_t *g);
/* Node count per op: hist[op] for op < MDB_OP_COUNT. */
void mdb_graph_op_histogram(const mdb_graph_t *g, int hist[MDB_OP_COUNT]);
/* Index of the tensor called name, or -1. */
int mdb_graph_find_tensor(const mdb_graph_t *g, const char *name);

/* ---- ONNX import (onnx_import.c) ------------------------------------- */

/* Oldest and newest default-domain opsets the importer understands. */
#define MDB_OPSET_MIN 1
#define MDB_OPSET_MAX 18

/* Why an import failed. code is the SQ_* error; detail is human text;
 * for SQ_UNSUPPORTED_MODEL, ops lists the offending op types (comma
 * separated, each once) and opset the model's default-domain opset. */
typedef struct {
    int code;
    int64_t opset;
    char ops[512];
    char detail[2048];
    /* i > 0: files[i] of mdb_onnx_import_files (a bundle's file i) is
     * read by no tensor (SQ_BAD_MODEL); 0 otherwise. */
    int unused_file;
} mdb_import_error_t;

/* Parses an ONNX ModelProto (or a bundle of one with its external data
 * files, below) and builds the canonical graph (see top).
 * Returns 0 and sets *out (caller frees), or a negative SQ_* code with err
 * filled (err may be NULL): SQ_BAD_MODEL for bytes that are not a valid
 * model, SQ_UNSUPPORTED_MODEL for a valid model the worker cannot run,
 * SQ_TOO_LARGE past MDB_MODEL_MAX_BYTES, SQ_BAD_CONFIG for an input with symbolic sizes
 * past the batch (they need a pin: mdb_onnx_import_pinned). Never crashes
 * on any byte string; sizes are capped (MDB_MAX_*), and so is what decoding
 * and folding may allocate. */
int mdb_onnx_import(const void *bytes, size_t len, mdb_graph_t **out, mdb_import_error_t *err);

/* A graph input replaced by a constant: name and a serialized TensorProto
 * (the format of ONNX's test_data_set_N/input_K.pb files). */
typedef struct {
    const char *name;
    const void *tensor_pb;
    size_t len;
} mdb_onnx_const_t;

/* mdb_onnx_import with the named inputs bound to constants before
 * lowering, so that parameters that a file passes as graph inputs (the ONNX
 * conformance tests do: Reshape's shape, Clip's bounds, Slice's starts...)
 * fold into attributes. */
int mdb_onnx_import_bound(const void *bytes, size_t len, const mdb_onnx_const_t *consts,
                          int n_consts, mdb_graph_t **out, mdb_import_error_t *err);

/* The sizes an upload gives its model's runtime input past the batch (the
 * upload config's "input": {"shape": [C, H, W]}, Triton's `dims`): one per
 * dimension after dim 0, in the file's order. A file whose input has
 * symbolic sizes there (height and width exported dynamic) is imported as
 * if it had these; a static size must equal its pin. rank 0: no pin. */
typedef struct {
    int rank;
    int64_t dims[MDB_MAX_RANK - 1];
} mdb_input_pin_t;

/* mdb_onnx_import with the first runtime input's sizes past the batch
 * pinned (pin may be NULL: none). Besides mdb_onnx_import's errors:
 * SQ_BAD_CONFIG, its detail naming the config key ("config.input.shape:
 * ..."), for a symbolic size past the batch without a pin (the detail says
 * what to send, for this model's rank), a pin of another rank, or a pin
 * that contradicts a static size (the detail names the dimension and the
 * file's size). */
int mdb_onnx_import_pinned(const void *bytes, size_t len, const mdb_input_pin_t *pin,
                           mdb_graph_t **out, mdb_import_error_t *err);

/* ---- ONNX external data (onnx_external.c) ---------------------------- */

/* A model with external data is uploaded as its .onnx plus the files its
 * tensors name (location, offset, length; onnx.save_model(...,
 * save_as_external_data=True)), and kept as one bundle: a table of the
 * files' names and sizes, then their bytes, the .onnx first. Every
 * mdb_onnx_import* takes a bundle wherever it takes a .onnx, so that the
 * DB, a restart and a worker store and read one blob as for any model. */
#define MDB_ONNX_BUNDLE_MAX_FILES 64
#define MDB_ONNX_LOCATION_MAX 255

/* Largest model (a .onnx, or a bundle with its data files) the importer
 * takes: what a worker holds (its file of a model, serve_io.c) and what
 * the DB stores in chunks (mdb.h's MDB_FILE_CHUNK_BYTES). */
#define MDB_MODEL_MAX_BYTES ((size_t)4 << 30)

/* One file of a bundle: its name (the location the .onnx's tensors give,
 * not NUL-terminated) and bytes, borrowed. */
typedef struct {
    const char *name;
    size_t name_len;
    const void *data;
    size_t len;
} mdb_onnx_file_t;

/* Whether loc (len bytes) may name an external data file: a relative path
 * of at most MDB_ONNX_LOCATION_MAX bytes, without '..' segments, empty
 * segments, backslashes or control characters. */
int mdb_onnx_location_ok(const char *loc, size_t len);

/* Writes the bundle's table for files[0..n) (the .onnx first) to out and
 * returns its size; with out NULL or cap too small, only the size. The
 * bundle is that table followed by each file's bytes in order. */
size_t mdb_onnx_bundle_header(const mdb_onnx_file_t *files, int n, uint8_t *out, size_t cap);

/* Whether bytes start as a bundle (no ONNX file does). */
int mdb_onnx_is_bundle(const void *bytes, size_t len);

/* Reads a bundle's table into files[0..*nfiles), pointing into bytes; 0, or
 * SQ_BAD_MODEL with err for a table that is truncated, overruns the bytes,
 * or holds more than max files. */
int mdb_onnx_bundle_parse(const void *bytes, size_t len, mdb_onnx_file_t *files, int max,
                          int *nfiles, char *err, size_t errlen);

/* mdb_onnx_import_pinned for a model given as its files, not as one
 * bundle: files[0] the .onnx, the others its external data (the upload's
 * parts, read where they lie). */
int mdb_onnx_import_files(const mdb_onnx_file_t *files, int nfiles, const mdb_input_pin_t *pin,
                          mdb_graph_t **out, mdb_import_error_t *err);

/* What the gateway stores and shows about a model. */
typedef struct {
    const char *input_name; /* borrowed from the graph */
    mdb_dtype_t input_dtype;
    mdb_shape_t input_shape; /* NCHW, dims[0] == MDB_DIM_BATCH unless batch_fixed */
    const char *layout;      /* "NCHW" */
    int n_outputs;
    const char *output_names[8];
    mdb_shape_t output_shapes[8];
    uint64_t param_bytes;
    int op_hist[MDB_OP_COUNT];
    /* Whether the backend of each device kind runs the model, and when not,
     * the reason it gives at load ("Conv node 'c1': convolution with
     * asymmetric pads"): the op table's rules for that kind. */
    bool runs_on[SQ_DEV_KIND_COUNT];
    char not_on[SQ_DEV_KIND_COUNT][192];
} mdb_model_info_t;

/* Fills info for a servable image model: one float or uint8 input of rank 4
 * (NCHW), 1..8 outputs. Returns 0, or SQ_UNSUPPORTED_MODEL with detail in
 * err. */
int mdb_model_info(const mdb_graph_t *g, mdb_model_info_t *info, char *err, size_t errlen);

/* ---- What the worker runs (runnable.c, ops.c) ------------------------ */

/* One list of the limits of the worker's lowering and of each backend, per
 * op in the op descriptor table, read by the importer (a model past the
 * cpu backend's is refused at upload, naming the node and the reason;
 * mdb_model_info says which device kinds run it) and by the worker's
 * lowering for the backend it lowers for (which refuses exactly that).
 * The numbers that size the worker's arrays: */
#define MDB_RUN_MAX_SPATIAL 3 /* spatial dims of Conv and the pools (rank 3..5) */

/* Checks node idx of a canonical graph against the list. batch_bound: the
 * symbolic batch is bound to one size (the worker's static_batch), so that
 * the rules that keep the batch outermost do not apply. Returns 0, or
 * SQ_UNSUPPORTED_MODEL with "Op node 'name': reason" in err. */
int mdb_node_runnable(const mdb_graph_t *g, int idx, bool batch_bound, char *err, size_t errlen);
/* The same for the backend of device kind dev (mdb_node_runnable: the cpu
 * backend's, which every ONNX model must pass; the cuda backend refuses a
 * few more, with the reason it gives at load; emu runs no ONNX graph and
 * is asked nothing past the lowering's limits). */
int mdb_node_runnable_on(const mdb_graph_t *g, int idx, sq_dev_kind_t dev, bool batch_bound,
                         char *err, size_t errlen);
/* Every node, and the graph's inputs and outputs (float; the batch in dim
 * 0). Returns 0, or SQ_UNSUPPORTED_MODEL with the reason in err and the
 * failing node in *bad_node (-1 for an input or output; may be NULL). */
int mdb_graph_runnable(const mdb_graph_t *g, bool batch_bound, int *bad_node, char *err,
                       size_t errlen);
int mdb_graph_runnable_on(const mdb_graph_t *g, sq_dev_kind_t dev, bool batch_bound, int *bad_node,
                          char *err, size_t errlen);

/* ---- Shared-prefix detection (prefix.c) ------------------------------ */

#define MDB_HASH_LEN 32

typedef struct {
    uint8_t b[MDB_HASH_LEN];
} mdb_hash_t;

/* Per-node facts that prefix matching needs; small enough to store in
 * model_nodes so that a new model can be matched against stored ones
 * without their graphs. */
typedef struct {
    mdb_hash_t hash;    /* SHA-256 of (op, attributes, input hashes) */
    uint32_t ancestors; /* for a cut_ok node: the nodes of the prefix that ends
                           there, itself included (its index + 1); else 0 */
    bool cut_ok;        /* the node has one output, and everything after it
                           reads the prefix only through that output */
} mdb_node_sig_t;

/* Hashes every node of g (sorted, canonical and compacted, as
 * mdb_onnx_import returns it) into sigs[g->n_nodes] (caller allocated). Hashes do not depend on
 * tensor or node names, nor on the order of initializers or of independent nodes: a weight enters
 * by content (dtype, shape, bytes), a graph input by (position, dtype, shape), an activation by the
 * hash of its producer and output slot. Returns 0 or SQ_NOMEM / SQ_INTERNAL. */
int mdb_graph_signature(const mdb_graph_t *g, mdb_node_sig_t *sigs);

typedef struct {
    bool found;
    int node_a, node_b;     /* the node whose output is the cut, in each graph */
    int tensor_a, tensor_b; /* the cut tensor in each graph */
    uint32_t prefix_nodes;  /* nodes in the shared prefix */
    mdb_hash_t prefix_hash; /* the hash of the cut node: names the prefix */
} mdb_prefix_t;

/* Longest shared prefix of two signed graphs that ends at a single tensor
 * (cut_ok in both). Pure; O((n_a + n_b) log n_b). found is false when none;
 * tensor_a/b are left -1 (only mdb_prefix_find knows the graphs). */
void mdb_prefix_match(const mdb_node_sig_t *a, int n_a, const mdb_node_sig_t *b, int n_b,
                      mdb_prefix_t *out);
/* Convenience: signs both graphs and matches them; fills tensor_a/b.
 * Returns 0 or a negative SQ_* code. */
int mdb_prefix_find(const mdb_graph_t *a, const mdb_graph_t *b, mdb_prefix_t *out);
/* Lowercase hex of h into buf[2 * MDB_HASH_LEN + 1]. */
void mdb_hash_hex(const mdb_hash_t *h, char *buf);

#endif
