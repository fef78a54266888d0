/* The op descriptor table (ops.c): one entry per op says everything the
 * importer knows about it, in the ggml manner (an op enum with a name table,
 * MDB_OPS in mdb_graph.h, and here what each op does):
 *   - canon: ONNX's form (opset by opset) into the canonical one
 *     (mdb_graph.h), constant inputs into attributes, defaults filled in;
 *   - arity: the data inputs a canonical runtime node takes;
 *   - infer_shape: output shapes and dtypes from the input shapes;
 *   - fold_source / fold_data: evaluation on constants at import;
 *   - rules: what the worker's lowering and each backend can run, as
 *     predicates over the canonical node (devices says which backends a
 *     rule binds: the cuda backend's limits are rules too, so that the
 *     importer tells per device kind whether a model runs, with the reason
 *     the backend would give).
 * The per-op functions live below the table by aspect (shape.c, fold.c,
 * canon.c, runnable.c); the questions asked through the table (infer a
 * node, fold it, canonicalize it, may it run on a device) live in ops.c
 * beside it. Adding an op is one MDB_OPS line, one entry here, and its
 * lowering and kernels in worker/. */
#ifndef MDB_OPS_INT_H
#define MDB_OPS_INT_H

#include "mdb_graph.h"
#include "mdb_graph_int.h"

#include <sq_device.h>

/* A node being canonicalized or shape-inferred. */
typedef struct {
    mdb_graph_t *g;
    mdb_node_t *node;
    int64_t opset; /* canon only */
    char *err;
    size_t errlen;
} mdb_op_ctx_t;

/* A node being folded: inputs carry data, the output's shape is inferred
 * and its buffer (nbytes, zeroed) allocated; the op fills data. */
typedef struct {
    mdb_graph_t *g;
    mdb_node_t *node;
    const mdb_tensor_t *in; /* input 0 */
    mdb_tensor_t *out;      /* output 0 */
    void *data;
    size_t nbytes, es;
    int64_t in_strides[MDB_MAX_RANK]; /* row-major, of input 0 */
    char *err;
    size_t errlen;
} mdb_fold_ctx_t;

/* Returned by folds: the node stays (it touches the batch, a dtype...). */
#define MDB_FOLD_CANNOT 1

/* A reason node n cannot run, or NULL when it can. buf holds formatted reasons. */
typedef const char *(*mdb_rule_fn)(const mdb_graph_t *g, const mdb_node_t *n, char *buf,
                                   size_t len);

/* Bits of sq_dev_kind_t: the backends a rule binds. */
#define MDB_ON(kind) (1u << (kind))
#define MDB_ON_CPU_CUDA (MDB_ON(SQ_DEV_CPU) | MDB_ON(SQ_DEV_CUDA))

typedef struct {
    mdb_rule_fn check;
    bool batching;    /* only while the batch is symbolic */
    unsigned devices; /* MDB_ON bits; 0: the lowering's, every backend */
    const char *what; /* for readers of the table; the reason says more */
} mdb_rule_t;

typedef struct {
    int (*canon)(mdb_op_ctx_t *c);
    int arity_min, arity_max; /* runtime ops; 0: one input */
    int (*infer_shape)(mdb_op_ctx_t *c);
    int (*fold_source)(mdb_graph_t *g, mdb_node_t *node, char *err, size_t errlen);
    int (*fold_data)(mdb_fold_ctx_t *f);
    const mdb_rule_t *rules; /* ended by a rule without check; NULL: none */
} mdb_op_desc_t;

extern const mdb_op_desc_t mdb__op_descs[MDB_OP_COUNT];

/* Canonicalizes node c->node and checks its arity (ops.c). */
int mdb__op_canon(mdb_op_ctx_t *c);

/* ---- shape rules (shape.c) ---- */
int mdb__infer_same(mdb_op_ctx_t *c);
int mdb__infer_softmax(mdb_op_ctx_t *c);
int mdb__infer_dropout(mdb_op_ctx_t *c);
int mdb__infer_batch_norm(mdb_op_ctx_t *c);
int mdb__infer_conv(mdb_op_ctx_t *c);
int mdb__infer_pool(mdb_op_ctx_t *c);
int mdb__infer_gemm(mdb_op_ctx_t *c);
int mdb__infer_matmul(mdb_op_ctx_t *c);
int mdb__infer_einsum(mdb_op_ctx_t *c);
int mdb__infer_binary(mdb_op_ctx_t *c);
int mdb__infer_broadcast(mdb_op_ctx_t *c);
int mdb__infer_not(mdb_op_ctx_t *c);
int mdb__infer_select(mdb_op_ctx_t *c);
int mdb__infer_expand(mdb_op_ctx_t *c);
int mdb__infer_concat(mdb_op_ctx_t *c);
int mdb__infer_flatten(mdb_op_ctx_t *c);
int mdb__infer_reshape(mdb_op_ctx_t *c);
int mdb__infer_transpose(mdb_op_ctx_t *c);
int mdb__infer_pad(mdb_op_ctx_t *c);
int mdb__infer_reduce(mdb_op_ctx_t *c);
int mdb__infer_split(mdb_op_ctx_t *c);
int mdb__infer_slice(mdb_op_ctx_t *c);
int mdb__infer_squeeze(mdb_op_ctx_t *c);
int mdb__infer_gather(mdb_op_ctx_t *c);
int mdb__infer_shape_op(mdb_op_ctx_t *c);
int mdb__infer_cast(mdb_op_ctx_t *c);
int mdb__infer_unfolded(mdb_op_ctx_t *c);
int mdb__infer_resize(mdb_op_ctx_t *c);
int mdb__infer_conv_transpose(mdb_op_ctx_t *c);

/* ---- folds (fold.c) ---- */
int mdb__fold_alloc_out(mdb_tensor_t *out, void **data, size_t *nbytes);
void mdb__fold_row_strides(const mdb_shape_t *s, int64_t *strides);
int mdb__fold_source(mdb_graph_t *g, mdb_node_t *node, char *err, size_t errlen);
int mdb__fold_range(mdb_graph_t *g, mdb_node_t *node, char *err, size_t errlen);
int mdb__fold_shape(mdb_fold_ctx_t *f);
int mdb__fold_copy(mdb_fold_ctx_t *f);
int mdb__fold_cast(mdb_fold_ctx_t *f);
int mdb__fold_binary(mdb_fold_ctx_t *f);
int mdb__fold_select(mdb_fold_ctx_t *f);
int mdb__fold_not(mdb_fold_ctx_t *f);
int mdb__fold_scatter_nd(mdb_fold_ctx_t *f);
int mdb__fold_expand(mdb_fold_ctx_t *f);
int mdb__fold_transpose(mdb_fold_ctx_t *f);
int mdb__fold_slice(mdb_fold_ctx_t *f);
int mdb__fold_gather(mdb_fold_ctx_t *f);
int mdb__fold_concat(mdb_fold_ctx_t *f);

/* ---- canonical forms (canon.c) ---- */
int mdb__canon_window(mdb_op_ctx_t *c);
int mdb__canon_pow(mdb_op_ctx_t *c);
int mdb__canon_expand(mdb_op_ctx_t *c);
int mdb__canon_einsum(mdb_op_ctx_t *c);
int mdb__canon_layer_norm(mdb_op_ctx_t *c);
int mdb__canon_gelu(mdb_op_ctx_t *c);
int mdb__canon_clip(mdb_op_ctx_t *c);
int mdb__canon_binary(mdb_op_ctx_t *c);
int mdb__canon_leaky_relu(mdb_op_ctx_t *c);
int mdb__canon_hard_sigmoid(mdb_op_ctx_t *c);
int mdb__canon_gemm(mdb_op_ctx_t *c);
int mdb__canon_concat(mdb_op_ctx_t *c);
int mdb__canon_gather(mdb_op_ctx_t *c);
int mdb__canon_flatten(mdb_op_ctx_t *c);
int mdb__canon_softmax(mdb_op_ctx_t *c);
int mdb__canon_reshape(mdb_op_ctx_t *c);
int mdb__canon_transpose(mdb_op_ctx_t *c);
int mdb__canon_pad(mdb_op_ctx_t *c);
int mdb__canon_reduce_mean(mdb_op_ctx_t *c);
int mdb__canon_batch_norm(mdb_op_ctx_t *c);
int mdb__canon_dropout(mdb_op_ctx_t *c);
int mdb__canon_split(mdb_op_ctx_t *c);
int mdb__canon_slice(mdb_op_ctx_t *c);
int mdb__canon_unsqueeze(mdb_op_ctx_t *c);
int mdb__canon_squeeze(mdb_op_ctx_t *c);
int mdb__canon_cast(mdb_op_ctx_t *c);
int mdb__canon_shape(mdb_op_ctx_t *c);
int mdb__canon_resize(mdb_op_ctx_t *c);
int mdb__canon_conv_transpose(mdb_op_ctx_t *c);

/* ---- what runs (runnable.c) ---- */
/* Every runtime op, before its own rules: */
const char *mdb__run_known_shapes(const mdb_graph_t *g, const mdb_node_t *n, char *buf, size_t len);
const char *mdb__run_float_only(const mdb_graph_t *g, const mdb_node_t *n, char *buf, size_t len);
/* ... and while the batch is symbolic, before its batching rules: */
const char *mdb__run_batch_outermost(const mdb_graph_t *g, const mdb_node_t *n, char *buf,
                                     size_t len);
const char *mdb__run_concat_inputs(const mdb_graph_t *g, const mdb_node_t *n, char *buf,
                                   size_t len);
const char *mdb__run_window_rank(const mdb_graph_t *g, const mdb_node_t *n, char *buf, size_t len);
const char *mdb__run_pool_pads(const mdb_graph_t *g, const mdb_node_t *n, char *buf, size_t len);
const char *mdb__run_conv_constants(const mdb_graph_t *g, const mdb_node_t *n, char *buf,
                                    size_t len);
const char *mdb__run_bn_constants(const mdb_graph_t *g, const mdb_node_t *n, char *buf, size_t len);
const char *mdb__run_pad_mode(const mdb_graph_t *g, const mdb_node_t *n, char *buf, size_t len);
const char *mdb__run_binary_broadcast(const mdb_graph_t *g, const mdb_node_t *n, char *buf,
                                      size_t len);
const char *mdb__run_layer_norm_operands(const mdb_graph_t *g, const mdb_node_t *n, char *buf,
                                         size_t len);
const char *mdb__run_gather_index(const mdb_graph_t *g, const mdb_node_t *n, char *buf, size_t len);
const char *mdb__run_gemm_operands(const mdb_graph_t *g, const mdb_node_t *n, char *buf,
                                   size_t len);
const char *mdb__run_axis_not_batch(const mdb_graph_t *g, const mdb_node_t *n, char *buf,
                                    size_t len);
const char *mdb__run_softmax_batch(const mdb_graph_t *g, const mdb_node_t *n, char *buf,
                                   size_t len);
const char *mdb__run_reduce_batch(const mdb_graph_t *g, const mdb_node_t *n, char *buf, size_t len);
const char *mdb__run_reshape_batch(const mdb_graph_t *g, const mdb_node_t *n, char *buf,
                                   size_t len);
const char *mdb__run_transpose_batch(const mdb_graph_t *g, const mdb_node_t *n, char *buf,
                                     size_t len);
const char *mdb__run_pad_batch(const mdb_graph_t *g, const mdb_node_t *n, char *buf, size_t len);
const char *mdb__run_slice_batch(const mdb_graph_t *g, const mdb_node_t *n, char *buf, size_t len);
const char *mdb__run_split_batch(const mdb_graph_t *g, const mdb_node_t *n, char *buf, size_t len);
const char *mdb__run_gemm_batch(const mdb_graph_t *g, const mdb_node_t *n, char *buf, size_t len);
const char *mdb__run_matmul_batch(const mdb_graph_t *g, const mdb_node_t *n, char *buf, size_t len);
const char *mdb__run_binary_batch(const mdb_graph_t *g, const mdb_node_t *n, char *buf, size_t len);
const char *mdb__run_resize(const mdb_graph_t *g, const mdb_node_t *n, char *buf, size_t len);
const char *mdb__run_conv_transpose(const mdb_graph_t *g, const mdb_node_t *n, char *buf,
                                    size_t len);
/* The cuda backend's limits (worker/backend_cuda.c) */
const char *mdb__run_cuda_conv_pads(const mdb_graph_t *g, const mdb_node_t *n, char *buf,
                                    size_t len);
const char *mdb__run_cuda_pool(const mdb_graph_t *g, const mdb_node_t *n, char *buf, size_t len);
const char *mdb__run_cuda_pad_constant(const mdb_graph_t *g, const mdb_node_t *n, char *buf,
                                       size_t len);
const char *mdb__run_cuda_matmul(const mdb_graph_t *g, const mdb_node_t *n, char *buf, size_t len);
const char *mdb__run_cuda_no_kernel(const mdb_graph_t *g, const mdb_node_t *n, char *buf,
                                    size_t len);

#endif
