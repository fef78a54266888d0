/* What the worker runs: the limits of its lowering (worker/lower.c), of its
 * cpu backend (worker/backend_cpu_ops.c) and of its cuda backend
 * (worker/backend_cuda.c), as predicates over the canonical node. The op
 * descriptor table (ops.c) says which apply to which op and backend; the
 * importer asks them at upload (onnx_import.c: a model the cpu backend
 * would refuse is a 422 naming the node and the reason; mdb_model_info
 * tells per device kind whether the model runs) and the worker's lowering
 * at load, for the backend it lowers for (so that the two never disagree).
 * modeldb sits below worker/, so the rules live here and the worker reads
 * them.
 *
 * Rules come in two kinds: limits of the kernels (1 to 3 spatial dims,
 * constant conv weights), and limits of batching: while the batch is
 * symbolic the worker runs every batch size with one plan whose batch is
 * the outermost dimension of every batched tensor, so nothing may move, merge, reduce, pad, slice
 * or mix the batch. Batching rules are skipped when the batch is bound to one size (batch_bound: a
 * file that fixes its batch, or a static_batch plan).
 *
 * A new refusal in the lowering or a backend gets its rule here, and its
 * place in the op's entry of the table. */
#include "mdb_graph.h"
#include "mdb_graph_int.h"
#include "mdb_ops_int.h"

#include <sq.h>

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const char *why(char *buf, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static const char *why(char *buf, size_t len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, len, fmt, ap);
    va_end(ap);
    return buf;
}

static const mdb_tensor_t *in_t(const mdb_graph_t *g, const mdb_node_t *n, int k)
{
    return k < n->n_inputs && n->inputs[k] >= 0 ? &g->tensors[n->inputs[k]] : NULL;
}

static const mdb_tensor_t *out_t(const mdb_graph_t *g, const mdb_node_t *n, int k)
{
    return k < n->n_outputs && n->outputs[k] >= 0 ? &g->tensors[n->outputs[k]] : NULL;
}

static bool batched(const mdb_tensor_t *t)
{
    return t != NULL && t->shape_known && mdb_shape_has_batch(&t->shape);
}

/* ---- kernel limits ---- */

const char *mdb__run_float_only(const mdb_graph_t *g, const mdb_node_t *n, char *buf, size_t len)
{
    for (int k = 0; k < n->n_inputs; k++) {
        const mdb_tensor_t *t = in_t(g, n, k);
        if (t != NULL && t->dtype != MDB_DT_FLOAT)
            return why(buf, len, "input '%s' is %s; the worker computes in float", t->name,
                       mdb_dtype_name(t->dtype));
    }
    for (int k = 0; k < n->n_outputs; k++) {
        const mdb_tensor_t *t = out_t(g, n, k);
        if (t != NULL && t->dtype != MDB_DT_FLOAT)
            return why(buf, len, "output '%s' is %s; the worker computes in float", t->name,
                       mdb_dtype_name(t->dtype));
    }
    return NULL;
}

const char *mdb__run_known_shapes(const mdb_graph_t *g, const mdb_node_t *n, char *buf, size_t len)
{
    if (n->n_inputs < 1 || in_t(g, n, 0) == NULL)
        return why(buf, len, "no data input");
    if (n->n_outputs < 1 || out_t(g, n, 0) == NULL)
        return why(buf, len, "no output");
    for (int k = 0; k < n->n_outputs; k++) {
        const mdb_tensor_t *t = out_t(g, n, k);
        if (t != NULL && !t->shape_known)
            return why(buf, len, "output '%s' has no shape", t->name);
        /* Split writes each of its outputs (the others write output 0). */
        if (t == NULL && n->op == MDB_OP_SPLIT)
            return why(buf, len, "output %d is left out", k);
    }
    return NULL;
}

/* Any number of inputs (the importer caps them at MDB_MAX_NODE_IO), none
 * left out. */
const char *mdb__run_concat_inputs(const mdb_graph_t *g, const mdb_node_t *n, char *buf, size_t len)
{
    for (int k = 0; k < n->n_inputs; k++)
        if (in_t(g, n, k) == NULL)
            return why(buf, len, "input %d is left out", k);
    return NULL;
}

const char *mdb__run_window_rank(const mdb_graph_t *g, const mdb_node_t *n, char *buf, size_t len)
{
    int spatial = in_t(g, n, 0)->shape.rank - 2;
    if (spatial < 1 || spatial > MDB_RUN_MAX_SPATIAL)
        return why(buf, len, "%d spatial dims; the worker runs 1 to %d", spatial,
                   MDB_RUN_MAX_SPATIAL);
    size_t count = 0;
    const int64_t *pads = mdb_node_ints(n, "pads", &count);
    for (size_t i = 0; pads != NULL && i < count; i++)
        if (pads[i] < 0)
            return why(buf, len, "negative pads");
    return NULL;
}

/* A pool's axis i as the lowering runs it: the dilated kernel's reach, its
 * dilation, and its begin and end pads, the end grown for ceil_mode. */
typedef struct {
    int64_t reach, dilation, begin, end;
} pool_axis_t;

static pool_axis_t pool_axis(const mdb_graph_t *g, const mdb_node_t *n, int i)
{
    const mdb_tensor_t *x = in_t(g, n, 0), *y = out_t(g, n, 0);
    int spatial = x->shape.rank - 2;
    size_t nk = 0, ns = 0, nd = 0, np = 0;
    const int64_t *kernel = mdb_node_ints(n, "kernel_shape", &nk);
    const int64_t *strides = mdb_node_ints(n, "strides", &ns);
    const int64_t *dilations = mdb_node_ints(n, "dilations", &nd);
    const int64_t *pads = mdb_node_ints(n, "pads", &np);
    int64_t k = kernel != NULL && (size_t)i < nk ? kernel[i] : 1;
    int64_t st = strides != NULL && (size_t)i < ns ? strides[i] : 1;
    pool_axis_t a = {.dilation = dilations != NULL && (size_t)i < nd ? dilations[i] : 1};
    a.begin = pads != NULL && (size_t)(spatial + i) < np ? pads[i] : 0;
    a.end = pads != NULL && (size_t)(spatial + i) < np ? pads[spatial + i] : 0;
    a.reach = a.dilation * (k - 1) + 1;
    int64_t need = (y->shape.dims[2 + i] - 1) * st + a.reach - x->shape.dims[2 + i] - a.begin;
    a.end = need > a.end ? need : a.end;
    return a;
}

/* Pools: every pad smaller than the (dilated) kernel, the end pads as the
 * lowering grows them for ceil_mode (oneDNN's pooling takes no more; ONNX
 * asks the same). */
const char *mdb__run_pool_pads(const mdb_graph_t *g, const mdb_node_t *n, char *buf, size_t len)
{
    int spatial = in_t(g, n, 0)->shape.rank - 2;
    for (int i = 0; i < spatial; i++) {
        pool_axis_t a = pool_axis(g, n, i);
        if (a.begin >= a.reach || a.end >= a.reach)
            return why(buf, len, "pads %lld and %lld (with ceil_mode) for a kernel of %lld",
                       (long long)a.begin, (long long)a.end, (long long)a.reach);
    }
    return NULL;
}

const char *mdb__run_conv_constants(const mdb_graph_t *g, const mdb_node_t *n, char *buf,
                                    size_t len)
{
    const mdb_tensor_t *w = in_t(g, n, 1), *b = in_t(g, n, 2);
    if (w == NULL || w->data == NULL)
        return why(buf, len, "the weights are computed, not constant");
    if (w->shape.rank != in_t(g, n, 0)->shape.rank)
        return why(buf, len, "weights of rank %d for an input of rank %d", w->shape.rank,
                   in_t(g, n, 0)->shape.rank);
    if (b != NULL && b->data == NULL)
        return why(buf, len, "the bias is computed, not constant");
    return NULL;
}

const char *mdb__run_bn_constants(const mdb_graph_t *g, const mdb_node_t *n, char *buf, size_t len)
{
    const mdb_tensor_t *x = in_t(g, n, 0);
    int64_t c = x->shape.rank > 1 ? x->shape.dims[1] : 1;
    for (int k = 1; k <= 4; k++) {
        const mdb_tensor_t *t = in_t(g, n, k);
        if (t == NULL || t->data == NULL)
            return why(buf, len, "the statistics are computed, not constant");
        if (mdb_shape_numel(&t->shape, 1) != c)
            return why(buf, len, "'%s' does not hold one value per channel (%lld)", t->name,
                       (long long)c);
    }
    return NULL;
}

const char *mdb__run_pad_mode(const mdb_graph_t *g, const mdb_node_t *n, char *buf, size_t len)
{
    const char *mode = mdb_node_string(n, "mode", "constant");
    if (strcmp(mode, "constant") != 0 && strcmp(mode, "reflect") != 0 && strcmp(mode, "edge") != 0)
        return why(buf, len, "pad mode '%s'; the worker pads constant, reflect or edge", mode);
    size_t count = 0;
    const int64_t *pads = mdb_node_ints(n, "pads", &count);
    for (size_t i = 0; pads != NULL && i < count; i++)
        if (pads[i] < 0)
            return why(buf, len, "negative pads (cropping)");
    return NULL;
}

/* One operand has the output's shape: oneDNN broadcasts only the second
 * source, and a division's dividend cannot be the broadcast one. */
const char *mdb__run_binary_broadcast(const mdb_graph_t *g, const mdb_node_t *n, char *buf,
                                      size_t len)
{
    const mdb_tensor_t *a = in_t(g, n, 0), *b = in_t(g, n, 1), *y = out_t(g, n, 0);
    if (b == NULL)
        return why(buf, len, "one operand");
    bool a_full = mdb_shape_eq(&a->shape, &y->shape), b_full = mdb_shape_eq(&b->shape, &y->shape);
    if (!a_full && !b_full)
        return why(buf, len, "both operands broadcast (%s and %s); the worker broadcasts one",
                   a->name, b->name);
    if (!a_full && n->op == MDB_OP_DIV)
        return why(buf, len, "the dividend '%s' broadcasts; the worker broadcasts the divisor",
                   a->name);
    return NULL;
}

/* Over the last axis (oneDNN's layer normalization), with constant
 * per-channel scale and bias. */
const char *mdb__run_layer_norm_operands(const mdb_graph_t *g, const mdb_node_t *n, char *buf,
                                         size_t len)
{
    const mdb_tensor_t *x = in_t(g, n, 0);
    int64_t c = x->shape.rank > 0 ? x->shape.dims[x->shape.rank - 1] : 1;
    if (mdb_node_int(n, "axis", -1) != x->shape.rank - 1)
        return why(buf, len, "normalizes from axis %lld; the worker normalizes the last axis only",
                   (long long)mdb_node_int(n, "axis", -1));
    for (int k = 1; k < n->n_inputs; k++) {
        const mdb_tensor_t *t = in_t(g, n, k);
        if (t == NULL)
            continue;
        if (t->data == NULL)
            return why(buf, len, "the scale and bias are computed, not constant");
        if (mdb_shape_numel(&t->shape, 1) != c)
            return why(buf, len, "'%s' does not hold one value per channel (%lld)", t->name,
                       (long long)c);
    }
    return NULL;
}

const char *mdb__run_gather_index(const mdb_graph_t *g, const mdb_node_t *n, char *buf, size_t len)
{
    if (!mdb_node_attr(n, "index"))
        return why(buf, len, "indices other than one constant scalar");
    return NULL;
}

const char *mdb__run_gemm_operands(const mdb_graph_t *g, const mdb_node_t *n, char *buf, size_t len)
{
    const mdb_tensor_t *a = in_t(g, n, 0), *b = in_t(g, n, 1), *c = in_t(g, n, 2);
    if (b == NULL || a->shape.rank != 2 || b->shape.rank != 2)
        return why(buf, len, "operands must be 2-D");
    if (c != NULL && c->data == NULL && mdb_node_float(n, "beta", 1.0f) != 1.0f)
        return why(buf, len, "beta with a computed C");
    return NULL;
}

/* ---- batching limits (symbolic batch only) ---- */

/* The batch stays the outermost dimension of every tensor. */
const char *mdb__run_batch_outermost(const mdb_graph_t *g, const mdb_node_t *n, char *buf,
                                     size_t len)
{
    for (int k = 0; k < n->n_outputs; k++) {
        const mdb_tensor_t *t = out_t(g, n, k);
        for (int d = 1; t != NULL && d < t->shape.rank; d++)
            if (t->shape.dims[d] == MDB_DIM_BATCH)
                return why(buf, len, "output '%s' has the batch in dim %d", t->name, d);
    }
    for (int k = 0; k < n->n_inputs; k++) {
        const mdb_tensor_t *t = in_t(g, n, k);
        if (batched(t) && t->data != NULL)
            return why(buf, len, "constant '%s' has a batch dimension", t->name);
    }
    return NULL;
}

const char *mdb__run_axis_not_batch(const mdb_graph_t *g, const mdb_node_t *n, char *buf,
                                    size_t len)
{
    if (batched(out_t(g, n, 0)) && mdb_node_int(n, "axis", 1) == 0)
        return why(buf, len, "along the batch");
    return NULL;
}

const char *mdb__run_softmax_batch(const mdb_graph_t *g, const mdb_node_t *n, char *buf, size_t len)
{
    const mdb_tensor_t *x = in_t(g, n, 0);
    int64_t axis = mdb_node_int(n, "axis", x->shape.rank - 1);
    if (batched(x) && (axis == 0 || axis == -x->shape.rank))
        return why(buf, len, "over the batch");
    return NULL;
}

const char *mdb__run_reduce_batch(const mdb_graph_t *g, const mdb_node_t *n, char *buf, size_t len)
{
    size_t count = 0;
    const int64_t *axes = mdb_node_ints(n, "axes", &count);
    if (!batched(in_t(g, n, 0)))
        return NULL;
    if (axes == NULL || count == 0)
        return why(buf, len, "over every axis, the batch too");
    for (size_t i = 0; i < count; i++)
        if (axes[i] == 0)
            return why(buf, len, "over the batch");
    return NULL;
}

/* Reshape, Flatten: each item keeps its elements. */
const char *mdb__run_reshape_batch(const mdb_graph_t *g, const mdb_node_t *n, char *buf, size_t len)
{
    const mdb_tensor_t *x = in_t(g, n, 0), *y = out_t(g, n, 0);
    if (batched(x) != batched(y) ||
        (batched(x) && mdb_shape_numel(&x->shape, 1) != mdb_shape_numel(&y->shape, 1)))
        return why(buf, len, "moves the batch (%s to %s)", x->name, y->name);
    return NULL;
}

const char *mdb__run_transpose_batch(const mdb_graph_t *g, const mdb_node_t *n, char *buf,
                                     size_t len)
{
    size_t count = 0;
    const int64_t *perm = mdb_node_ints(n, "perm", &count);
    const mdb_tensor_t *x = in_t(g, n, 0);
    int64_t first = count > 0 ? perm[0] : x->shape.rank - 1;
    if (batched(x) && first != 0)
        return why(buf, len, "moves the batch");
    return NULL;
}

const char *mdb__run_pad_batch(const mdb_graph_t *g, const mdb_node_t *n, char *buf, size_t len)
{
    const mdb_tensor_t *x = in_t(g, n, 0);
    size_t count = 0;
    const int64_t *pads = mdb_node_ints(n, "pads", &count);
    if (batched(x) && pads != NULL && count == 2 * (size_t)x->shape.rank &&
        (pads[0] != 0 || pads[x->shape.rank] != 0))
        return why(buf, len, "pads the batch");
    return NULL;
}

const char *mdb__run_slice_batch(const mdb_graph_t *g, const mdb_node_t *n, char *buf, size_t len)
{
    const mdb_tensor_t *x = in_t(g, n, 0), *y = out_t(g, n, 0);
    if (!batched(x))
        return NULL;
    size_t na = 0, ns = 0, nst = 0;
    const int64_t *axes = mdb_node_ints(n, "axes", &na);
    const int64_t *starts = mdb_node_ints(n, "starts", &ns);
    const int64_t *steps = mdb_node_ints(n, "steps", &nst);
    for (size_t i = 0; i < ns; i++) {
        int64_t axis = axes != NULL && i < na ? axes[i] : (int64_t)i;
        int64_t step = steps != NULL && i < nst ? steps[i] : 1;
        if (axis == 0 && (starts[i] != 0 || step != 1 || y->shape.dims[0] != MDB_DIM_BATCH))
            return why(buf, len, "slices the batch");
    }
    return NULL;
}

const char *mdb__run_split_batch(const mdb_graph_t *g, const mdb_node_t *n, char *buf, size_t len)
{
    if (batched(in_t(g, n, 0)) && mdb_node_int(n, "axis", 0) == 0)
        return why(buf, len, "splits the batch");
    return NULL;
}

/* A batched operand must be A, not transposed; C only as a row. */
const char *mdb__run_gemm_batch(const mdb_graph_t *g, const mdb_node_t *n, char *buf, size_t len)
{
    const mdb_tensor_t *a = in_t(g, n, 0), *b = in_t(g, n, 1), *c = in_t(g, n, 2);
    if (batched(a) && mdb_node_int(n, "transA", 0))
        return why(buf, len, "the batch in a transposed A");
    if (batched(b))
        return why(buf, len, "the batch in B");
    if (batched(c) && c->data == NULL)
        return why(buf, len, "the batch in a computed C");
    if (batched(a) && c != NULL && c->data != NULL && c->shape.rank == 2 && c->shape.dims[0] != 1)
        return why(buf, len, "C has a row per batch item");
    return NULL;
}

/* Batched operands and output have the full (broadcast) rank. */
const char *mdb__run_matmul_batch(const mdb_graph_t *g, const mdb_node_t *n, char *buf, size_t len)
{
    const mdb_tensor_t *a = in_t(g, n, 0), *b = in_t(g, n, 1), *y = out_t(g, n, 0);
    int r = a->shape.rank > b->shape.rank ? a->shape.rank : b->shape.rank;
    r = r < 2 ? 2 : r;
    if ((batched(a) && a->shape.rank != r) || (batched(b) && b->shape.rank != r) ||
        (batched(y) && y->shape.rank != r))
        return why(buf, len, "the batch is not the leading dimension of the product");
    return NULL;
}

/* Binary ops: the batched operand has the output's rank. */
const char *mdb__run_binary_batch(const mdb_graph_t *g, const mdb_node_t *n, char *buf, size_t len)
{
    const mdb_tensor_t *y = out_t(g, n, 0);
    for (int k = 0; k < 2; k++) {
        const mdb_tensor_t *t = in_t(g, n, k);
        if (batched(t) && t->shape.rank != y->shape.rank)
            return why(buf, len, "batched operand '%s' of lower rank", t->name);
    }
    return NULL;
}

/* ---- the cuda backend's limits (worker/backend_cuda.c names them) ---- */

/* cuDNN pads a convolution the same at both ends. */
const char *mdb__run_cuda_conv_pads(const mdb_graph_t *g, const mdb_node_t *n, char *buf,
                                    size_t len)
{
    size_t count = 0;
    const int64_t *pads = mdb_node_ints(n, "pads", &count);
    for (size_t i = 0; pads != NULL && i < count / 2; i++)
        if (pads[i] != pads[count / 2 + i])
            return why(buf, len, "convolution with asymmetric pads");
    return NULL;
}

/* cuDNN pools without dilation, and excludes pads from an average's count
 * only where they are the same at both ends (the end pads as the lowering
 * grows them for ceil_mode). */
const char *mdb__run_cuda_pool(const mdb_graph_t *g, const mdb_node_t *n, char *buf, size_t len)
{
    int spatial = in_t(g, n, 0)->shape.rank - 2;
    bool exclude = n->op == MDB_OP_AVERAGE_POOL && !mdb_node_int(n, "count_include_pad", 0);
    const char *reason = NULL;
    for (int i = 0; i < spatial; i++) {
        pool_axis_t a = pool_axis(g, n, i);
        if (a.dilation != 1)
            reason = "dilated pooling";
        if (exclude && a.begin != a.end)
            reason = "average pooling with asymmetric pads excluded from the count";
    }
    return reason == NULL ? NULL : why(buf, len, "%s", reason);
}

const char *mdb__run_cuda_pad_constant(const mdb_graph_t *g, const mdb_node_t *n, char *buf,
                                       size_t len)
{
    if (strcmp(mdb_node_string(n, "mode", "constant"), "constant") != 0)
        return why(buf, len, "reflect and edge pads");
    return NULL;
}

/* cuBLAS's strided batches: B a shared matrix, or of A's rank with the
 * same leading dims (MatMul; Einsum's operands always are). */
const char *mdb__run_cuda_matmul(const mdb_graph_t *g, const mdb_node_t *n, char *buf, size_t len)
{
    const mdb_tensor_t *a = in_t(g, n, 0), *b = in_t(g, n, 1);
    if (a->shape.rank < 2 || b->shape.rank < 1 ||
        (b->shape.rank > 2 && b->shape.rank != a->shape.rank))
        return why(buf, len, "matmul broadcast beyond a shared 2-D weight");
    for (int i = 0; b->shape.rank > 2 && i < a->shape.rank - 2; i++)
        if (a->shape.dims[i] != b->shape.dims[i])
            return why(buf, len, "matmul broadcast beyond equal batch dims");
    return NULL;
}

/* Resize: NCHW maps, only H and W resized; nearest (floor, ceil or round
 * with either tie), bilinear or bicubic (any cubic_coeff_a, exclude_outside
 * 0 or 1), on the four coordinate transforms that torch, paddle2onnx and
 * tf2onnx export (worker/backend_cpu_ckern.c and the cuda backend's
 * k_resize, through the same transforms: worker/ck_types.h). */
const char *mdb__run_resize(const mdb_graph_t *g, const mdb_node_t *n, char *buf, size_t len)
{
    const mdb_tensor_t *x = in_t(g, n, 0), *y = out_t(g, n, 0);
    const char *mode = mdb_node_string(n, "mode", "nearest");
    const char *ctm = mdb_node_string(n, "coordinate_transformation_mode", "half_pixel");
    const char *nm = mdb_node_string(n, "nearest_mode", "round_prefer_floor");
    static const char *const ctms[] = {"half_pixel", "pytorch_half_pixel", "align_corners",
                                       "asymmetric"};
    static const char *const nms[] = {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"};
    bool ctm_ok = false, nm_ok = strcmp(mode, "nearest") != 0;
    for (size_t i = 0; i < sizeof(ctms) / sizeof(ctms[0]); i++)
        ctm_ok |= strcmp(ctm, ctms[i]) == 0;
    for (size_t i = 0; i < sizeof(nms) / sizeof(nms[0]); i++)
        nm_ok |= strcmp(nm, nms[i]) == 0;
    if (strcmp(mode, "nearest") != 0 && strcmp(mode, "linear") != 0 && strcmp(mode, "cubic") != 0)
        return why(buf, len, "mode '%s' (nearest, linear and cubic only)", mode);
    int64_t exclude = mdb_node_int(n, "exclude_outside", 0);
    if (exclude != 0 && exclude != 1)
        return why(buf, len, "exclude_outside %lld (0 or 1)", (long long)exclude);
    if (!isfinite(mdb_node_float(n, "cubic_coeff_a", -0.75f)))
        return why(buf, len, "cubic_coeff_a not finite");
    if (!ctm_ok)
        return why(buf, len, "coordinate_transformation_mode '%s'", ctm);
    if (!nm_ok)
        return why(buf, len, "nearest_mode '%s'", nm);
    if (x->shape.rank != 4)
        return why(buf, len, "an input of rank %d (NCHW maps only)", x->shape.rank);
    size_t ns = 0;
    const float *scales = mdb_node_floats(n, "scales", &ns);
    for (int d = 0; d < 2; d++)
        if (y->shape.dims[d] != x->shape.dims[d] || (scales != NULL && ns == 4 && scales[d] != 1))
            return why(buf, len, "resizes dim %d (only H and W)", d);
    for (int d = 2; d < 4; d++)
        if (x->shape.dims[d] < 1 || y->shape.dims[d] < 1)
            return why(buf, len, "an empty map");
    return NULL;
}

/* ConvTranspose: oneDNN's deconvolution, 2-D, one group, no dilation, the
 * output padding within the end pads (taken from them). */
const char *mdb__run_conv_transpose(const mdb_graph_t *g, const mdb_node_t *n, char *buf,
                                    size_t len)
{
    const mdb_tensor_t *x = in_t(g, n, 0);
    if (x->shape.rank != 4)
        return why(buf, len, "%d spatial dims (2-D only)", x->shape.rank - 2);
    if (mdb_node_int(n, "group", 1) != 1)
        return why(buf, len, "group %lld (1 only)", (long long)mdb_node_int(n, "group", 1));
    size_t nd = 0, np = 0, no = 0, ns = 0;
    const int64_t *d = mdb_node_ints(n, "dilations", &nd);
    const int64_t *p = mdb_node_ints(n, "pads", &np);
    const int64_t *op = mdb_node_ints(n, "output_padding", &no);
    const int64_t *s = mdb_node_ints(n, "strides", &ns);
    for (size_t i = 0; d != NULL && i < nd; i++)
        if (d[i] != 1)
            return why(buf, len, "dilations (1 only)");
    for (size_t i = 0; p != NULL && i < np; i++)
        if (p[i] < 0)
            return why(buf, len, "negative pads");
    for (size_t i = 0; op != NULL && i < no; i++) {
        if (s != NULL && i < ns && op[i] >= s[i])
            return why(buf, len, "output_padding not below the stride");
        if (p == NULL || np != 2 * no || op[i] > p[no + i])
            return why(buf, len, "output_padding larger than the end pads");
    }
    return NULL;
}

/* An op the cuda backend has no kernel for (ConvTranspose). */
const char *mdb__run_cuda_no_kernel(const mdb_graph_t *g, const mdb_node_t *n, char *buf,
                                    size_t len)
{
    (void)g;
    return why(buf, len, "the cuda backend has no %s kernel", mdb_op_name(n->op));
}
