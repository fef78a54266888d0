/* Internals shared by the graph IR's source files (graph.c, shape.c,
 * fold.c, onnx_import.c, prefix.c). */
#ifndef MDB_GRAPH_INT_H
#define MDB_GRAPH_INT_H

#include "mdb_graph.h"

/* In folded int64 shape values (the output of Shape and what is computed
 * from it), the symbolic batch size N, and k * N as MDB_SYM_BATCH + k - 1
 * (mdb_sym_batch): a multiple of the batch travels through Gather, Slice,
 * Concat, Unsqueeze, Squeeze, Identity and Cast to int64, through Mul by a
 * positive constant and Div by one that divides k (attention's N * heads),
 * into a Reshape target. Other arithmetic refuses to touch it. */
#define MDB_SYM_BATCH (INT64_MIN + 7)

/* Whether v is a folded k * N; its k; the value of k * N (1 <= k <= MDB_MAX_DIM). */
static inline bool mdb_is_sym_batch(int64_t v)
{
    return v >= MDB_SYM_BATCH && v < MDB_SYM_BATCH + MDB_MAX_DIM;
}
static inline int64_t mdb_sym_batch_k(int64_t v)
{
    return v - MDB_SYM_BATCH + 1;
}
static inline int64_t mdb_sym_batch(int64_t k)
{
    return MDB_SYM_BATCH + k - 1;
}

/* snprintf into err when err is not NULL. */
void mdb_errf(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Resolves an ONNX Reshape target (0 = copy unless allowzero, -1 = infer,
 * mdb_sym_batch(k) = k * N) against in; returns 0 or a negative SQ_* code. */
int mdb_reshape_resolve(const mdb_shape_t *in, const int64_t *target, int n, bool allowzero,
                        mdb_shape_t *out, char *err, size_t errlen);

/* Checks and clamps a canonical Slice's attributes against in (ONNX
 * semantics), computing out; with rewrite, stores the clamped values back
 * on the node. */
int mdb_slice_resolve(const mdb_shape_t *in, mdb_node_t *node, mdb_shape_t *out, bool rewrite,
                      char *err, size_t errlen);

/* Evaluates node idx, whose inputs all carry data (or, for Shape, a known
 * shape), and gives its outputs data and shapes. Returns 0, 1 when the
 * node cannot be folded (e.g. it would touch the symbolic batch, or an
 * unsupported dtype) and must stay, or a negative SQ_* code. */
int mdb_fold_node(mdb_graph_t *g, int idx, char *err, size_t errlen);

/* Canonicalizes, folds and shape-infers an imported graph (sorted) in one
 * pass, then compacts it (onnx_lower.c). Folding creates at most
 * fold_budget bytes of constants in all. On SQ_UNSUPPORTED_MODEL the ops
 * left unfoldable are appended to ops (comma separated). */
int mdb_onnx_lower(mdb_graph_t *g, int64_t opset, uint64_t fold_budget, char *err, size_t errlen,
                   char *ops, size_t opslen);

/* Rewrites torch's decomposed LayerNorms and GELUs of a lowered, compacted
 * graph into LayerNormalization and Gelu nodes, and compacts it again
 * (fuse.c). Returns how many it rewrote. */
int mdb_graph_fuse(mdb_graph_t *g);

/* Drops the taps of each Conv that read only padding (a dilation as large
 * as the map: DeepLabV3's atrous convs on small images), shrinking its
 * kernel and pads so that it computes what it did, and compacts the graph
 * when it changed one (conv_trim.c). Returns how many convs it trimmed. */
int mdb_graph_trim_convs(mdb_graph_t *g);

/* Whether op can be evaluated by mdb_fold_node at all. */
bool mdb_op_is_foldable(mdb_op_t op);

/* Reads element i of a constant int tensor (int64/int32/uint8/int8/bool)
 * as int64. */
int64_t mdb_const_int(const mdb_tensor_t *t, int64_t i);
/* Elements of a constant tensor (nbytes / dtype size). */
int64_t mdb_const_count(const mdb_tensor_t *t);

/* onnx_wire.c: walks a protobuf message of type desc (bytes p..end) as
 * protobuf-c would decode it, descending into known message fields; false
 * on truncation, groups or nesting too deep. Adds what decoding would
 * allocate to *cost (bytes); depth is 0 for the outermost message. */
struct ProtobufCMessageDescriptor;
bool mdb_onnx_wire_check(const struct ProtobufCMessageDescriptor *desc, const uint8_t *p,
                         const uint8_t *end, int depth, uint64_t *cost);
/* What decoding may allocate for an input of len bytes. */
uint64_t mdb_onnx_decode_budget(size_t len);

/* onnx_external.c: the bytes of external tensor tp (called name, nbytes
 * long by its shape) among the model's files: its location checked (a
 * relative path, no '..'), found among files (SQ_BAD_MODEL naming the file
 * when it is missing) and its offset and length checked against the file
 * and the shape. *data points into that file, files[*file]. */
struct Onnx__TensorProto;
int mdb_onnx_external_data(const struct Onnx__TensorProto *tp, const char *name,
                           const mdb_onnx_file_t *files, int nfiles, size_t nbytes,
                           const uint8_t **data, int *file, char *err, size_t errlen);

#endif
