/* The op descriptor table (mdb_ops_int.h) and the questions asked through
 * it: a node's shapes (mdb_graph_infer_node), its folding (mdb_fold_node),
 * its canonical form (mdb__op_canon) and whether a backend runs it
 * (mdb_node_runnable_on). One entry per op; an op absent from an aspect
 * has no such rule (a runtime op that cannot fold, an import-time op that
 * never runs). */
#include "mdb_graph.h"
#include "mdb_graph_int.h"
#include "mdb_ops_int.h"

#include <sq.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ON_CUDA MDB_ON(SQ_DEV_CUDA)

/* Rule lists shared by several ops. */
static const mdb_rule_t window_rules[] = {
    {mdb__run_window_rank, false, 0, "1..MDB_RUN_MAX_SPATIAL spatial dims, pads >= 0"},
    {mdb__run_pool_pads, false, 0, "pads smaller than the kernel"},
    {mdb__run_cuda_pool, false, ON_CUDA, "no dilation; asymmetric pads only counted"},
    {0},
};
static const mdb_rule_t binary_rules[] = {
    {mdb__run_binary_broadcast, false, 0, "one operand of the output's shape"},
    {mdb__run_binary_batch, true, 0, "batched operands of full rank"},
    {0},
};
static const mdb_rule_t reshape_rules[] = {
    {mdb__run_reshape_batch, true, 0, "items keep their elements"},
    {0},
};

const mdb_op_desc_t mdb__op_descs[MDB_OP_COUNT] = {
    [MDB_OP_CONV] = {.canon = mdb__canon_window,
                     .arity_min = 2,
                     .arity_max = 3,
                     .infer_shape = mdb__infer_conv,
                     .rules =
                         (const mdb_rule_t[]){
                             {mdb__run_window_rank, false, 0,
                              "1..MDB_RUN_MAX_SPATIAL spatial dims, pads >= 0"},
                             {mdb__run_conv_constants, false, 0, "constant weights and bias"},
                             {mdb__run_cuda_conv_pads, false, ON_CUDA, "symmetric pads"},
                             {0},
                         }},
    [MDB_OP_RELU] = {.infer_shape = mdb__infer_same},
    [MDB_OP_CLIP] = {.canon = mdb__canon_clip, .infer_shape = mdb__infer_same},
    [MDB_OP_LEAKY_RELU] = {.canon = mdb__canon_leaky_relu, .infer_shape = mdb__infer_same},
    [MDB_OP_SIGMOID] = {.infer_shape = mdb__infer_same},
    [MDB_OP_HARD_SIGMOID] = {.canon = mdb__canon_hard_sigmoid, .infer_shape = mdb__infer_same},
    [MDB_OP_HARD_SWISH] = {.infer_shape = mdb__infer_same},
    [MDB_OP_MAX_POOL] = {.canon = mdb__canon_window,
                         .infer_shape = mdb__infer_pool,
                         .rules = window_rules},
    [MDB_OP_AVERAGE_POOL] = {.canon = mdb__canon_window,
                             .infer_shape = mdb__infer_pool,
                             .rules = window_rules},
    [MDB_OP_GLOBAL_AVERAGE_POOL] = {.infer_shape = mdb__infer_pool,
                                    .rules =
                                        (const mdb_rule_t[]){
                                            {mdb__run_window_rank, false, 0,
                                             "1..MDB_RUN_MAX_SPATIAL spatial dims"},
                                            {0},
                                        }},
    [MDB_OP_GEMM] = {.canon = mdb__canon_gemm,
                     .arity_min = 2,
                     .arity_max = 3,
                     .infer_shape = mdb__infer_gemm,
                     .rules =
                         (const mdb_rule_t[]){
                             {mdb__run_gemm_operands, false, 0,
                              "2-D operands; beta 1 with a computed C"},
                             {mdb__run_gemm_batch, true, 0, "the batch only in an untransposed A"},
                             {0},
                         }},
    [MDB_OP_MATMUL] = {.arity_min = 2,
                       .arity_max = 2,
                       .infer_shape = mdb__infer_matmul,
                       .rules =
                           (const mdb_rule_t[]){
                               {mdb__run_matmul_batch, true, 0, "the batch leads the product"},
                               {mdb__run_cuda_matmul, false, ON_CUDA,
                                "B shared, or with A's leading dims"},
                               {0},
                           }},
    [MDB_OP_ADD] = {.canon = mdb__canon_binary,
                    .arity_min = 2,
                    .arity_max = 2,
                    .infer_shape = mdb__infer_binary,
                    .fold_data = mdb__fold_binary,
                    .rules = binary_rules},
    [MDB_OP_MUL] = {.canon = mdb__canon_binary,
                    .arity_min = 2,
                    .arity_max = 2,
                    .infer_shape = mdb__infer_binary,
                    .fold_data = mdb__fold_binary,
                    .rules = binary_rules},
    [MDB_OP_SUB] = {.canon = mdb__canon_binary,
                    .arity_min = 2,
                    .arity_max = 2,
                    .infer_shape = mdb__infer_binary,
                    .fold_data = mdb__fold_binary,
                    .rules = binary_rules},
    [MDB_OP_DIV] = {.canon = mdb__canon_binary,
                    .arity_min = 2,
                    .arity_max = 2,
                    .infer_shape = mdb__infer_binary,
                    .fold_data = mdb__fold_binary,
                    .rules =
                        (const mdb_rule_t[]){
                            {mdb__run_binary_broadcast, false, 0,
                             "the dividend of the output's shape"},
                            {mdb__run_binary_batch, true, 0, "batched operands of full rank"},
                            {0},
                        }},
    [MDB_OP_CONCAT] = {.canon = mdb__canon_concat,
                       .arity_max = MDB_MAX_NODE_IO,
                       .infer_shape = mdb__infer_concat,
                       .fold_data = mdb__fold_concat,
                       .rules =
                           (const mdb_rule_t[]){
                               {mdb__run_concat_inputs, false, 0, "no input left out"},
                               {mdb__run_axis_not_batch, true, 0, "not along the batch"},
                               {0},
                           }},
    [MDB_OP_FLATTEN] = {.canon = mdb__canon_flatten,
                        .infer_shape = mdb__infer_flatten,
                        .fold_data = mdb__fold_copy,
                        .rules = reshape_rules},
    [MDB_OP_RESHAPE] = {.canon = mdb__canon_reshape,
                        .infer_shape = mdb__infer_reshape,
                        .fold_data = mdb__fold_copy,
                        .rules = reshape_rules},
    [MDB_OP_TRANSPOSE] = {.canon = mdb__canon_transpose,
                          .infer_shape = mdb__infer_transpose,
                          .fold_data = mdb__fold_transpose,
                          .rules =
                              (const mdb_rule_t[]){
                                  {mdb__run_transpose_batch, true, 0, "perm[0] == 0"},
                                  {0},
                              }},
    [MDB_OP_SOFTMAX] = {.canon = mdb__canon_softmax,
                        .infer_shape = mdb__infer_softmax,
                        .rules =
                            (const mdb_rule_t[]){
                                {mdb__run_softmax_batch, true, 0, "not over the batch"},
                                {0},
                            }},
    [MDB_OP_PAD] = {.canon = mdb__canon_pad,
                    .infer_shape = mdb__infer_pad,
                    .rules =
                        (const mdb_rule_t[]){
                            {mdb__run_pad_mode, false, 0, "constant, reflect or edge; pads >= 0"},
                            {mdb__run_cuda_pad_constant, false, ON_CUDA, "constant pads"},
                            {mdb__run_pad_batch, true, 0, "the batch is not padded"},
                            {0},
                        }},
    [MDB_OP_DROPOUT] = {.canon = mdb__canon_dropout,
                        .infer_shape = mdb__infer_dropout,
                        .fold_data = mdb__fold_copy},
    [MDB_OP_IDENTITY] = {.infer_shape = mdb__infer_same, .fold_data = mdb__fold_copy},
    [MDB_OP_REDUCE_MEAN] = {.canon = mdb__canon_reduce_mean,
                            .infer_shape = mdb__infer_reduce,
                            .rules =
                                (const mdb_rule_t[]){
                                    {mdb__run_reduce_batch, true, 0, "not over the batch"},
                                    {0},
                                }},
    [MDB_OP_BATCH_NORM] = {.canon = mdb__canon_batch_norm,
                           .arity_min = 5,
                           .arity_max = 5,
                           .infer_shape = mdb__infer_batch_norm,
                           .rules =
                               (const mdb_rule_t[]){
                                   {mdb__run_bn_constants, false, 0,
                                    "constant per-channel statistics"},
                                   {0},
                               }},
    [MDB_OP_SPLIT] = {.canon = mdb__canon_split,
                      .infer_shape = mdb__infer_split,
                      .rules =
                          (const mdb_rule_t[]){
                              {mdb__run_split_batch, true, 0, "the batch is not split"},
                              {0},
                          }},
    [MDB_OP_SLICE] = {.canon = mdb__canon_slice,
                      .infer_shape = mdb__infer_slice,
                      .fold_data = mdb__fold_slice,
                      .rules =
                          (const mdb_rule_t[]){
                              {mdb__run_slice_batch, true, 0, "the batch is not sliced"},
                              {0},
                          }},
    [MDB_OP_POW] = {.canon = mdb__canon_pow, .infer_shape = mdb__infer_same},
    [MDB_OP_SQRT] = {.infer_shape = mdb__infer_same},
    [MDB_OP_ERF] = {.infer_shape = mdb__infer_same},
    [MDB_OP_EXPAND] = {.canon = mdb__canon_expand,
                       .infer_shape = mdb__infer_expand,
                       .fold_data = mdb__fold_expand},
    [MDB_OP_LAYER_NORM] = {.canon = mdb__canon_layer_norm,
                           .arity_max = 3,
                           .infer_shape = mdb__infer_same,
                           .rules =
                               (const mdb_rule_t[]){
                                   {mdb__run_layer_norm_operands, false, 0,
                                    "the last axis; constant per-channel scale, bias"},
                                   {0},
                               }},
    [MDB_OP_GELU] = {.canon = mdb__canon_gelu, .infer_shape = mdb__infer_same},
    [MDB_OP_EINSUM] = {.canon = mdb__canon_einsum,
                       .arity_min = 2,
                       .arity_max = 2,
                       .infer_shape = mdb__infer_einsum,
                       .rules =
                           (const mdb_rule_t[]){
                               {mdb__run_matmul_batch, true, 0, "the batch leads the product"},
                               {0},
                           }},
    [MDB_OP_TANH] = {.infer_shape = mdb__infer_same},
    [MDB_OP_NEG] = {.infer_shape = mdb__infer_same},
    [MDB_OP_EXP] = {.infer_shape = mdb__infer_same},
    /* scales and sizes (constants, or folded into them) become attributes */
    [MDB_OP_RESIZE] = {.canon = mdb__canon_resize,
                       .infer_shape = mdb__infer_resize,
                       .rules =
                           (const mdb_rule_t[]){
                               {mdb__run_resize, false, 0,
                                "NCHW, H and W only; nearest, linear or cubic, four transforms"},
                               {0},
                           }},
    [MDB_OP_CONV_TRANSPOSE] =
        {.canon = mdb__canon_conv_transpose,
         .arity_min = 2,
         .arity_max = 3,
         .infer_shape = mdb__infer_conv_transpose,
         .rules =
             (const mdb_rule_t[]){
                 {mdb__run_conv_constants, false, 0, "constant weights and bias"},
                 {mdb__run_conv_transpose, false, 0,
                  "2-D, group 1, no dilation, output_padding in end pads"},
                 {mdb__run_cuda_no_kernel, false, ON_CUDA, "no deconvolution kernel"},
                 {0},
             }},
    [MDB_OP_CONSTANT] = {.infer_shape = mdb__infer_unfolded, .fold_source = mdb__fold_source},
    [MDB_OP_SHAPE] = {.canon = mdb__canon_shape,
                      .infer_shape = mdb__infer_shape_op,
                      .fold_data = mdb__fold_shape},
    /* on runtime data only one constant scalar index (canon: the attribute
     * index); 2 inputs while it may still fold */
    [MDB_OP_GATHER] = {.canon = mdb__canon_gather,
                       .arity_max = 2,
                       .infer_shape = mdb__infer_gather,
                       .fold_data = mdb__fold_gather,
                       .rules =
                           (const mdb_rule_t[]){
                               {mdb__run_gather_index, false, 0, "one constant scalar index"},
                               {0},
                           }},
    [MDB_OP_UNSQUEEZE] = {.canon = mdb__canon_unsqueeze,
                          .infer_shape = mdb__infer_squeeze,
                          .fold_data = mdb__fold_copy},
    [MDB_OP_SQUEEZE] = {.canon = mdb__canon_squeeze,
                        .infer_shape = mdb__infer_squeeze,
                        .fold_data = mdb__fold_copy},
    [MDB_OP_CAST] = {.canon = mdb__canon_cast,
                     .infer_shape = mdb__infer_cast,
                     .fold_data = mdb__fold_cast},
    [MDB_OP_CONSTANT_OF_SHAPE] = {.infer_shape = mdb__infer_unfolded,
                                  .fold_source = mdb__fold_source},
    [MDB_OP_EQUAL] = {.infer_shape = mdb__infer_select, .fold_data = mdb__fold_select},
    [MDB_OP_WHERE] = {.infer_shape = mdb__infer_select, .fold_data = mdb__fold_select},
    [MDB_OP_MOD] = {.infer_shape = mdb__infer_broadcast, .fold_data = mdb__fold_binary},
    [MDB_OP_RANGE] = {.infer_shape = mdb__infer_unfolded, .fold_source = mdb__fold_range},
    [MDB_OP_NOT] = {.infer_shape = mdb__infer_not, .fold_data = mdb__fold_not},
    [MDB_OP_SCATTER_ND] = {.infer_shape = mdb__infer_same, .fold_data = mdb__fold_scatter_nd},
};

#define FAIL(code, ...)                                                                            \
    do {                                                                                           \
        mdb_errf(err, errlen, __VA_ARGS__);                                                        \
        return (code);                                                                             \
    } while (0)

/* ---- shapes ---- */

int mdb_graph_infer_node(mdb_graph_t *g, int idx, char *err, size_t errlen)
{
    mdb_node_t *node = &g->nodes[idx];
    for (int k = 0; k < node->n_inputs; k++) {
        int t = node->inputs[k];
        if (t >= 0 && !g->tensors[t].shape_known)
            FAIL(SQ_BAD_MODEL, "%s '%s': input '%s' has no known shape", mdb_op_name(node->op),
                 node->name, g->tensors[t].name);
    }
    if ((node->n_inputs < 1 || node->inputs[0] < 0) && node->op != MDB_OP_CONSTANT)
        FAIL(SQ_BAD_MODEL, "%s '%s' has no input", mdb_op_name(node->op), node->name);
    if (node->n_outputs < 1 || node->outputs[0] < 0)
        FAIL(SQ_BAD_MODEL, "%s '%s' has no output", mdb_op_name(node->op), node->name);
    if ((unsigned)node->op >= MDB_OP_COUNT || mdb__op_descs[node->op].infer_shape == NULL)
        FAIL(SQ_INTERNAL, "no shape rule for op %d", (int)node->op);
    mdb_op_ctx_t c = {.g = g, .node = node, .err = err, .errlen = errlen};
    return mdb__op_descs[node->op].infer_shape(&c);
}

int mdb_graph_infer_shapes(mdb_graph_t *g, char *err, size_t errlen)
{
    for (int i = 0; i < g->n_nodes; i++) {
        int rc = mdb_graph_infer_node(g, i, err, errlen);
        if (rc)
            return rc;
    }
    return 0;
}

/* ---- folding ---- */

bool mdb_op_is_foldable(mdb_op_t op)
{
    return (unsigned)op < MDB_OP_COUNT &&
           (mdb__op_descs[op].fold_data != NULL || mdb__op_descs[op].fold_source != NULL);
}

int mdb_fold_node(mdb_graph_t *g, int idx, char *err, size_t errlen)
{
    mdb_node_t *node = &g->nodes[idx];
    if (!mdb_op_is_foldable(node->op) || node->n_outputs < 1 || node->outputs[0] < 0)
        return MDB_FOLD_CANNOT;
    const mdb_op_desc_t *d = &mdb__op_descs[node->op];
    for (int k = 1; k < node->n_outputs; k++)
        if (node->outputs[k] >= 0 && node->op != MDB_OP_DROPOUT)
            return MDB_FOLD_CANNOT;
    /* The source of every constant reads no input. */
    if (node->op == MDB_OP_CONSTANT)
        return d->fold_source(g, node, err, errlen);
    for (int k = 0; k < node->n_inputs; k++) {
        int t = node->inputs[k];
        if (t < 0)
            continue;
        if (!g->tensors[t].data && !(node->op == MDB_OP_SHAPE && k == 0))
            return MDB_FOLD_CANNOT;
    }
    if (node->n_inputs < 1 || node->inputs[0] < 0)
        return MDB_FOLD_CANNOT;
    if (d->fold_source != NULL)
        return d->fold_source(g, node, err, errlen);

    int rc = mdb_graph_infer_node(g, idx, err, errlen);
    if (rc)
        return rc;
    mdb_fold_ctx_t f = {.g = g,
                        .node = node,
                        .in = &g->tensors[node->inputs[0]],
                        .out = &g->tensors[node->outputs[0]],
                        .err = err,
                        .errlen = errlen};
    rc = mdb__fold_alloc_out(f.out, &f.data, &f.nbytes);
    if (rc)
        return rc;
    f.es = mdb_dtype_size(f.out->dtype);
    mdb__fold_row_strides(&f.in->shape, f.in_strides);
    rc = d->fold_data(&f);
    if (rc) {
        free(f.data);
        return rc;
    }
    mdb_graph_set_data(g, node->outputs[0], f.data, f.nbytes);
    return 0;
}

/* ---- canonical form ---- */

/* After canonicalization every runtime op has a fixed arity; a file that
 * gives more inputs than the op has is malformed (and would otherwise reach
 * the executor). */
static int check_arity(const mdb_node_t *n, char *err, size_t errlen)
{
    if (!mdb_op_is_runtime(n->op))
        return 0;
    const mdb_op_desc_t *d = &mdb__op_descs[n->op];
    int lo = d->arity_min ? d->arity_min : 1, hi = d->arity_max ? d->arity_max : 1;
    int given = n->n_inputs;
    while (given > 0 && n->inputs[given - 1] < 0)
        given--;
    if (given < lo || given > hi)
        FAIL(SQ_BAD_MODEL, "%s '%s' has %d inputs (%d to %d expected)", mdb_op_name(n->op), n->name,
             given, lo, hi);
    for (int k = 0; k < lo; k++)
        if (n->inputs[k] < 0)
            FAIL(SQ_BAD_MODEL, "%s '%s' lacks input %d", mdb_op_name(n->op), n->name, k);
    return 0;
}

int mdb__op_canon(mdb_op_ctx_t *c)
{
    const mdb_op_desc_t *d = &mdb__op_descs[c->node->op];
    int rc = d->canon != NULL ? d->canon(c) : 0;
    return rc != 0 ? rc : check_arity(c->node, c->err, c->errlen);
}

/* ---- what runs where ---- */

static const char *run_rule(const mdb_rule_t *r, const mdb_graph_t *g, const mdb_node_t *n,
                            sq_dev_kind_t dev, bool batch_bound, char *buf, size_t len)
{
    if ((r->batching && batch_bound) || (r->devices != 0 && !(r->devices & MDB_ON(dev))))
        return NULL;
    return r->check(g, n, buf, len);
}

int mdb_node_runnable_on(const mdb_graph_t *g, int idx, sq_dev_kind_t dev, bool batch_bound,
                         char *err, size_t errlen)
{
    static const mdb_rule_t every_op[] = {
        {mdb__run_known_shapes, false, 0, "outputs have shapes, a data input"},
        {mdb__run_float_only, false, 0, "float tensors only"},
    };
    static const mdb_rule_t batch_outermost = {mdb__run_batch_outermost, true, 0,
                                               "the batch stays outermost, never in a constant"};
    const mdb_node_t *n = &g->nodes[idx];
    char buf[256];
    const char *reason = NULL;
    const mdb_rule_t *own = mdb_op_is_runtime(n->op) ? mdb__op_descs[n->op].rules : NULL;
    if (!mdb_op_is_runtime(n->op))
        reason = "an import-time op left in the graph";
    for (size_t i = 0; reason == NULL && i < sizeof(every_op) / sizeof(every_op[0]); i++)
        reason = run_rule(&every_op[i], g, n, dev, batch_bound, buf, sizeof(buf));
    /* The op's kernel limits, then the batching rule of every op, then the
     * op's own batching rules. */
    for (int pass = 0; pass < 2 && reason == NULL; pass++) {
        if (pass == 1)
            reason = run_rule(&batch_outermost, g, n, dev, batch_bound, buf, sizeof(buf));
        for (const mdb_rule_t *r = own; reason == NULL && r != NULL && r->check != NULL; r++)
            if (r->batching == (pass == 1))
                reason = run_rule(r, g, n, dev, batch_bound, buf, sizeof(buf));
    }
    if (reason == NULL)
        return 0;
    mdb_errf(err, errlen, "%s node '%s': %s", mdb_op_name(n->op), n->name ? n->name : "", reason);
    return SQ_UNSUPPORTED_MODEL;
}

int mdb_node_runnable(const mdb_graph_t *g, int idx, bool batch_bound, char *err, size_t errlen)
{
    return mdb_node_runnable_on(g, idx, SQ_DEV_CPU, batch_bound, err, errlen);
}

int mdb_graph_runnable_on(const mdb_graph_t *g, sq_dev_kind_t dev, bool batch_bound, int *bad_node,
                          char *err, size_t errlen)
{
    if (bad_node != NULL)
        *bad_node = -1;
    for (int i = 0; i < g->n_inputs; i++) {
        const mdb_tensor_t *t = &g->tensors[g->inputs[i]];
        if (t->dtype != MDB_DT_FLOAT) {
            mdb_errf(err, errlen, "input '%s' is %s; the worker takes float inputs", t->name,
                     mdb_dtype_name(t->dtype));
            return SQ_UNSUPPORTED_MODEL;
        }
        for (int d = 1; !batch_bound && d < t->shape.rank; d++)
            if (t->shape.dims[d] == MDB_DIM_BATCH) {
                mdb_errf(err, errlen, "input '%s' has the batch in dim %d", t->name, d);
                return SQ_UNSUPPORTED_MODEL;
            }
    }
    for (int i = 0; i < g->n_nodes; i++) {
        int rc = mdb_node_runnable_on(g, i, dev, batch_bound, err, errlen);
        if (rc != 0) {
            if (bad_node != NULL)
                *bad_node = i;
            return rc;
        }
    }
    for (int i = 0; i < g->n_outputs; i++) {
        const mdb_tensor_t *t = &g->tensors[g->outputs[i]];
        if (t->dtype != MDB_DT_FLOAT) {
            mdb_errf(err, errlen, "output '%s' is %s; the worker writes float outputs", t->name,
                     mdb_dtype_name(t->dtype));
            return SQ_UNSUPPORTED_MODEL;
        }
    }
    return 0;
}

int mdb_graph_runnable(const mdb_graph_t *g, bool batch_bound, int *bad_node, char *err,
                       size_t errlen)
{
    return mdb_graph_runnable_on(g, SQ_DEV_CPU, batch_bound, bad_node, err, errlen);
}
