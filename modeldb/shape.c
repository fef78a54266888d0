/* Static shape inference over the canonical graph IR. Every dimension is a
 * known size or the symbolic batch N (MDB_DIM_BATCH); an op that would
 * have to express N times something (a batch merged into another axis) is
 * reported as unsupported, which is what lets one plan serve every batch
 * size. */
#include "shape_int.h"

int mdb__infer_broadcast(ictx_t *c)
{
    mdb_shape_t out = {0};
    int n = c->node->op == MDB_OP_MATMUL ? 0 : c->node->n_inputs;
    for (int k = 0; k < n; k++) {
        const mdb_tensor_t *t = in_t(c, k);
        if (!t)
            FAIL(SQ_BAD_MODEL, "%s '%s' lacks input %d", mdb_op_name(c->node->op), c->node->name,
                 k);
        if (t->shape.rank > out.rank) {
            int shift = t->shape.rank - out.rank;
            memmove(out.dims + shift, out.dims, (size_t)out.rank * sizeof(int64_t));
            for (int i = 0; i < shift; i++)
                out.dims[i] = 1;
            out.rank = t->shape.rank;
        }
        int off = out.rank - t->shape.rank;
        for (int i = 0; i < t->shape.rank; i++) {
            int64_t a = out.dims[off + i], b = t->shape.dims[i];
            if (a == b || b == 1)
                continue;
            if (a == 1) {
                out.dims[off + i] = b;
                continue;
            }
            FAIL(a < 0 || b < 0 ? SQ_UNSUPPORTED_MODEL : SQ_BAD_MODEL,
                 "%s '%s': shapes do not broadcast at axis %d", mdb_op_name(c->node->op),
                 c->node->name, off + i);
        }
    }
    set_out(c, 0, in_t(c, 0)->dtype, &out);
    return 0;
}

int mdb__infer_matmul(ictx_t *c)
{
    const mdb_tensor_t *a = in_t(c, 0), *b = in_t(c, 1);
    if (!a || !b || a->shape.rank < 1 || b->shape.rank < 1)
        FAIL(SQ_BAD_MODEL, "MatMul '%s' needs two inputs of rank >= 1", c->node->name);
    mdb_shape_t sa = a->shape, sb = b->shape;
    bool a_vec = sa.rank == 1, b_vec = sb.rank == 1;
    if (a_vec) {
        sa.dims[1] = sa.dims[0];
        sa.dims[0] = 1;
        sa.rank = 2;
    }
    if (b_vec) {
        sb.dims[1] = 1;
        sb.rank = 2;
    }
    int64_t k_a = sa.dims[sa.rank - 1], k_b = sb.dims[sb.rank - 2];
    if (k_a < 0 || k_b < 0 || k_a != k_b)
        FAIL(k_a < 0 || k_b < 0 ? SQ_UNSUPPORTED_MODEL : SQ_BAD_MODEL,
             "MatMul '%s': inner dimensions differ", c->node->name);
    mdb_shape_t out = {0};
    int ra = sa.rank - 2, rb = sb.rank - 2;
    out.rank = ra > rb ? ra : rb;
    for (int i = 0; i < out.rank; i++) {
        int ia = i - (out.rank - ra), ib = i - (out.rank - rb);
        int64_t da = ia >= 0 ? sa.dims[ia] : 1, db = ib >= 0 ? sb.dims[ib] : 1;
        if (da == db || db == 1)
            out.dims[i] = da;
        else if (da == 1)
            out.dims[i] = db;
        else
            FAIL(SQ_BAD_MODEL, "MatMul '%s': batch dimensions do not broadcast", c->node->name);
    }
    if (out.rank + 2 > MDB_MAX_RANK)
        FAIL(SQ_BAD_MODEL, "MatMul '%s': rank too large", c->node->name);
    if (!a_vec)
        out.dims[out.rank++] = sa.dims[sa.rank - 2];
    if (!b_vec)
        out.dims[out.rank++] = sb.dims[sb.rank - 1];
    set_out(c, 0, a->dtype, &out);
    return 0;
}

int mdb__infer_gemm(ictx_t *c)
{
    const mdb_tensor_t *a = in_t(c, 0), *b = in_t(c, 1), *bias = in_t(c, 2);
    if (!a || !b || a->shape.rank != 2 || b->shape.rank != 2)
        FAIL(SQ_BAD_MODEL, "Gemm '%s' needs two matrices", c->node->name);
    bool ta = mdb_node_int(c->node, "transA", 0) != 0;
    bool tb = mdb_node_int(c->node, "transB", 0) != 0;
    int64_t m = a->shape.dims[ta ? 1 : 0], ka = a->shape.dims[ta ? 0 : 1];
    int64_t kb = b->shape.dims[tb ? 1 : 0], n = b->shape.dims[tb ? 0 : 1];
    if (ka < 0 || kb < 0 || n < 0)
        FAIL(SQ_UNSUPPORTED_MODEL, "Gemm '%s' multiplies along the batch", c->node->name);
    if (ka != kb)
        FAIL(SQ_BAD_MODEL, "Gemm '%s': inner dimensions %lld and %lld differ", c->node->name,
             (long long)ka, (long long)kb);
    mdb_shape_t out = {.rank = 2, .dims = {m, n}};
    if (bias) {
        const mdb_shape_t *s = &bias->shape;
        if (s->rank > 2)
            FAIL(SQ_BAD_MODEL, "Gemm '%s': C has rank %d", c->node->name, s->rank);
        for (int i = 0; i < s->rank; i++) {
            int64_t want = out.dims[2 - s->rank + i];
            if (s->dims[i] != 1 && s->dims[i] != want)
                FAIL(SQ_BAD_MODEL, "Gemm '%s': C does not broadcast to the output", c->node->name);
        }
    }
    set_out(c, 0, a->dtype, &out);
    return 0;
}

/* Window geometry shared by Conv and the pools: spatial dims of out. */
static int infer_window(ictx_t *c, const mdb_shape_t *x, const int64_t *kernel, int nk,
                        bool ceil_mode, mdb_shape_t *out)
{
    int sp = x->rank - 2;
    size_t n_strides, n_dil, n_pads;
    const int64_t *strides = mdb_node_ints(c->node, "strides", &n_strides);
    const int64_t *dil = mdb_node_ints(c->node, "dilations", &n_dil);
    const int64_t *pads = mdb_node_ints(c->node, "pads", &n_pads);
    if (nk != sp || (strides && (int)n_strides != sp) || (dil && (int)n_dil != sp) ||
        (pads && (int)n_pads != 2 * sp))
        FAIL(SQ_BAD_MODEL, "%s '%s': kernel, strides, dilations or pads do not match rank %d",
             mdb_op_name(c->node->op), c->node->name, x->rank);
    for (int i = 0; i < sp; i++) {
        int64_t in = x->dims[2 + i];
        int64_t k = kernel[i], s = strides ? strides[i] : 1, d = dil ? dil[i] : 1;
        int64_t pb = pads ? pads[i] : 0, pe = pads ? pads[sp + i] : 0;
        if (in < 0)
            FAIL(SQ_UNSUPPORTED_MODEL, "%s '%s' slides over the batch", mdb_op_name(c->node->op),
                 c->node->name);
        if (k < 1 || s < 1 || d < 1 || pb < 0 || pe < 0 || k > MDB_MAX_DIM || s > MDB_MAX_DIM ||
            d > MDB_MAX_DIM || pb > MDB_MAX_DIM || pe > MDB_MAX_DIM)
            FAIL(SQ_BAD_MODEL, "%s '%s': bad kernel, stride, dilation or pad",
                 mdb_op_name(c->node->op), c->node->name);
        int64_t span = d * (k - 1) + 1;
        int64_t avail = in + pb + pe - span;
        if (avail < 0)
            FAIL(SQ_BAD_MODEL, "%s '%s': window larger than the padded input",
                 mdb_op_name(c->node->op), c->node->name);
        int64_t o = (ceil_mode ? (avail + s - 1) / s : avail / s) + 1;
        /* As PyTorch and ONNX Runtime do: the last window must start
         * inside the input or the left padding. */
        if (ceil_mode && (o - 1) * s >= in + pb)
            o--;
        out->dims[2 + i] = o;
    }
    return 0;
}

int mdb__infer_conv(ictx_t *c)
{
    const mdb_tensor_t *x = in_t(c, 0), *w = in_t(c, 1), *bias = in_t(c, 2);
    if (!x || !w || x->shape.rank < 3 || w->shape.rank != x->shape.rank)
        FAIL(SQ_BAD_MODEL, "Conv '%s' needs X and W of the same rank >= 3", c->node->name);
    int64_t group = mdb_node_int(c->node, "group", 1);
    int64_t ch = x->shape.dims[1], m = w->shape.dims[0];
    if (ch < 0 || m < 0)
        FAIL(SQ_UNSUPPORTED_MODEL, "Conv '%s' convolves over the batch", c->node->name);
    if (group < 1 || ch % group != 0 || m % group != 0 || w->shape.dims[1] * group != ch)
        FAIL(SQ_BAD_MODEL, "Conv '%s': %lld channels, W %lldx%lld, group %lld do not fit",
             c->node->name, (long long)ch, (long long)m, (long long)w->shape.dims[1],
             (long long)group);
    if (bias && (bias->shape.rank != 1 || bias->shape.dims[0] != m))
        FAIL(SQ_BAD_MODEL, "Conv '%s': bias is not [%lld]", c->node->name, (long long)m);
    size_t nk;
    const int64_t *kernel = mdb_node_ints(c->node, "kernel_shape", &nk);
    if (!kernel) {
        kernel = w->shape.dims + 2;
        nk = (size_t)w->shape.rank - 2;
    }
    for (size_t i = 0; i < nk && (int)i + 2 < w->shape.rank; i++)
        if (kernel[i] != w->shape.dims[2 + i])
            FAIL(SQ_BAD_MODEL, "Conv '%s': kernel_shape differs from W", c->node->name);
    mdb_shape_t out = x->shape;
    out.dims[1] = m;
    int rc = infer_window(c, &x->shape, kernel, (int)nk, false, &out);
    if (rc)
        return rc;
    set_out(c, 0, x->dtype, &out);
    return 0;
}

int mdb__infer_pool(ictx_t *c)
{
    const mdb_tensor_t *x = in_t(c, 0);
    if (!x || x->shape.rank < 3)
        FAIL(SQ_BAD_MODEL, "%s '%s' needs an input of rank >= 3", mdb_op_name(c->node->op),
             c->node->name);
    mdb_shape_t out = x->shape;
    if (c->node->op == MDB_OP_GLOBAL_AVERAGE_POOL) {
        for (int i = 2; i < out.rank; i++)
            out.dims[i] = 1;
        set_out(c, 0, x->dtype, &out);
        return 0;
    }
    size_t nk;
    const int64_t *kernel = mdb_node_ints(c->node, "kernel_shape", &nk);
    if (!kernel)
        FAIL(SQ_BAD_MODEL, "%s '%s' has no kernel_shape", mdb_op_name(c->node->op), c->node->name);
    int rc =
        infer_window(c, &x->shape, kernel, (int)nk, mdb_node_int(c->node, "ceil_mode", 0), &out);
    if (rc)
        return rc;
    set_out(c, 0, x->dtype, &out);
    for (int k = 1; k < c->node->n_outputs; k++)
        if (c->node->outputs[k] >= 0)
            FAIL(SQ_UNSUPPORTED_MODEL, "%s '%s': the Indices output is not supported",
                 mdb_op_name(c->node->op), c->node->name);
    return 0;
}

/* Elementwise ops (and LayerNorm): the input's shape and dtype. */
int mdb__infer_same(ictx_t *c)
{
    const mdb_tensor_t *x = in_t(c, 0);
    set_out(c, 0, x->dtype, &x->shape);
    return 0;
}

int mdb__infer_softmax(ictx_t *c)
{
    const mdb_tensor_t *x = in_t(c, 0);
    int rc = check_axis(c, mdb_node_int(c->node, "axis", -1), x->shape.rank);
    if (rc)
        return rc;
    set_out(c, 0, x->dtype, &x->shape);
    return 0;
}

int mdb__infer_dropout(ictx_t *c)
{
    const mdb_tensor_t *x = in_t(c, 0);
    set_out(c, 0, x->dtype, &x->shape);
    if (c->node->n_outputs > 1 && c->node->outputs[1] >= 0)
        set_out(c, 1, MDB_DT_BOOL, &x->shape);
    return 0;
}

int mdb__infer_batch_norm(ictx_t *c)
{
    const mdb_tensor_t *x = in_t(c, 0);
    mdb_node_t *node = c->node;
    int64_t ch = x->shape.rank >= 2 ? x->shape.dims[1] : -2;
    for (int k = 1; k < 5; k++) {
        const mdb_tensor_t *p = in_t(c, k);
        if (!p || p->shape.rank != 1 || p->shape.dims[0] != ch)
            FAIL(SQ_BAD_MODEL, "BatchNormalization '%s': parameter %d is not [C]", node->name, k);
    }
    for (int k = 1; k < node->n_outputs; k++)
        if (node->outputs[k] >= 0)
            FAIL(SQ_UNSUPPORTED_MODEL, "BatchNormalization '%s' in training mode", node->name);
    set_out(c, 0, x->dtype, &x->shape);
    return 0;
}

/* canonical: same ranks, same leading dims (canon.c) */
int mdb__infer_einsum(ictx_t *c)
{
    mdb_node_t *node = c->node;
    const mdb_tensor_t *a = in_t(c, 0), *b = in_t(c, 1);
    int r = a->shape.rank;
    bool tb = mdb_node_int(node, "transB", 0) != 0;
    if (b == NULL || b->shape.rank != r || r < 2)
        FAIL(SQ_BAD_MODEL, "Einsum '%s': operands of ranks that differ", node->name);
    mdb_shape_t out = a->shape;
    for (int i = 0; i < r - 2; i++)
        if (a->shape.dims[i] != b->shape.dims[i])
            FAIL(SQ_BAD_MODEL, "Einsum '%s': leading dims differ", node->name);
    if (a->shape.dims[r - 1] != b->shape.dims[tb ? r - 1 : r - 2])
        FAIL(SQ_BAD_MODEL, "Einsum '%s': inner dimensions differ", node->name);
    out.dims[r - 1] = b->shape.dims[tb ? r - 2 : r - 1];
    set_out(c, 0, a->dtype, &out);
    return 0;
}

/* Add, Sub, Mul, Div: two inputs, numpy broadcasting. */
int mdb__infer_binary(ictx_t *c)
{
    if (c->node->n_inputs != 2)
        FAIL(SQ_BAD_MODEL, "%s '%s' needs two inputs", mdb_op_name(c->node->op), c->node->name);
    return mdb__infer_broadcast(c);
}

int mdb__infer_not(ictx_t *c)
{
    const mdb_tensor_t *x = in_t(c, 0);
    if (x->dtype != MDB_DT_BOOL)
        FAIL(SQ_BAD_MODEL, "Not '%s' of a %s tensor", c->node->name, mdb_dtype_name(x->dtype));
    set_out(c, 0, x->dtype, &x->shape);
    return 0;
}

/* Equal (bool) and Where (its second input's dtype). */
int mdb__infer_select(ictx_t *c)
{
    int rc = mdb__infer_broadcast(c);
    if (rc == 0)
        c->g->tensors[c->node->outputs[0]].dtype =
            c->node->op == MDB_OP_EQUAL ? MDB_DT_BOOL : in_t(c, 1)->dtype;
    return rc;
}

int mdb__infer_cast(ictx_t *c)
{
    const mdb_tensor_t *x = in_t(c, 0);
    int64_t to = mdb_node_int(c->node, "to", 0);
    if (to <= MDB_DT_UNDEFINED || to >= MDB_DT_COUNT)
        FAIL(SQ_UNSUPPORTED_MODEL, "Cast '%s' to an unsupported type", c->node->name);
    set_out(c, 0, (mdb_dtype_t)to, &x->shape);
    return 0;
}

/* Constant, ConstantOfShape, Range: their shapes come from their data, and
 * only folding knows them. */
int mdb__infer_unfolded(ictx_t *c)
{
    FAIL(SQ_UNSUPPORTED_MODEL, "%s '%s' could not be folded", mdb_op_name(c->node->op),
         c->node->name);
}

/* Resize: the output shape is the canonical attribute sizes. */
int mdb__infer_resize(ictx_t *c)
{
    const mdb_tensor_t *x = in_t(c, 0);
    size_t count = 0;
    const int64_t *sizes = mdb_node_ints(c->node, "sizes", &count);
    if (!x || !sizes || (int)count != x->shape.rank)
        FAIL(SQ_BAD_MODEL, "Resize '%s': no output sizes of the input's rank", c->node->name);
    mdb_shape_t out = {.rank = x->shape.rank};
    for (int d = 0; d < out.rank; d++) {
        if (sizes[d] < -MDB_MAX_DIM)
            FAIL(SQ_BAD_MODEL, "Resize '%s': size %lld", c->node->name, (long long)sizes[d]);
        if ((sizes[d] < 0 || x->shape.dims[d] < 0) && sizes[d] != x->shape.dims[d])
            FAIL(SQ_UNSUPPORTED_MODEL, "Resize '%s' resizes the batch", c->node->name);
        out.dims[d] = sizes[d];
    }
    set_out(c, 0, x->dtype, &out);
    return 0;
}

/* ConvTranspose: out = stride (in - 1) + output_padding + dilation (k - 1)
 * + 1 - pads, with W [C_in, C_out / group, k...]. */
int mdb__infer_conv_transpose(ictx_t *c)
{
    const mdb_tensor_t *x = in_t(c, 0), *w = in_t(c, 1), *bias = in_t(c, 2);
    const mdb_node_t *n = c->node;
    if (!x || !w || x->shape.rank < 3 || w->shape.rank != x->shape.rank)
        FAIL(SQ_BAD_MODEL, "ConvTranspose '%s' needs X and W of the same rank >= 3", n->name);
    int sp = x->shape.rank - 2;
    int64_t group = mdb_node_int(n, "group", 1);
    int64_t ch = x->shape.dims[1];
    if (ch < 0 || w->shape.dims[0] < 0)
        FAIL(SQ_UNSUPPORTED_MODEL, "ConvTranspose '%s' convolves over the batch", n->name);
    if (group < 1 || ch != w->shape.dims[0] || ch % group != 0 ||
        w->shape.dims[1] > MDB_MAX_DIM / group)
        FAIL(SQ_BAD_MODEL, "ConvTranspose '%s': %lld channels, W %lldx%lld, group %lld do not fit",
             n->name, (long long)ch, (long long)w->shape.dims[0], (long long)w->shape.dims[1],
             (long long)group);
    int64_t m = w->shape.dims[1] * group;
    if (bias && (bias->shape.rank != 1 || bias->shape.dims[0] != m))
        FAIL(SQ_BAD_MODEL, "ConvTranspose '%s': bias is not [%lld]", n->name, (long long)m);
    size_t nk = 0, ns = 0, nd = 0, np = 0, no = 0;
    const int64_t *k = mdb_node_ints(n, "kernel_shape", &nk);
    const int64_t *s = mdb_node_ints(n, "strides", &ns);
    const int64_t *d = mdb_node_ints(n, "dilations", &nd);
    const int64_t *p = mdb_node_ints(n, "pads", &np);
    const int64_t *op = mdb_node_ints(n, "output_padding", &no);
    mdb_shape_t out = x->shape;
    out.dims[1] = m;
    for (int i = 0; i < sp; i++) {
        int64_t in = x->shape.dims[2 + i];
        int64_t kk = k && (int)nk == sp ? k[i] : w->shape.dims[2 + i];
        int64_t st = s && (int)ns == sp ? s[i] : 1, dl = d && (int)nd == sp ? d[i] : 1;
        int64_t pb = p && (int)np == 2 * sp ? p[i] : 0, pe = p && (int)np == 2 * sp ? p[sp + i] : 0;
        int64_t opad = op && (int)no == sp ? op[i] : 0;
        if (kk != w->shape.dims[2 + i])
            FAIL(SQ_BAD_MODEL, "ConvTranspose '%s': kernel_shape differs from W", n->name);
        if (in < 1 || st < 1 || st > MDB_MAX_DIM || dl < 1 || dl > MDB_MAX_DIM || kk < 1 ||
            pb < -MDB_MAX_DIM || pb > MDB_MAX_DIM || pe < -MDB_MAX_DIM || pe > MDB_MAX_DIM ||
            opad < 0 || opad > MDB_MAX_DIM)
            FAIL(SQ_BAD_MODEL, "ConvTranspose '%s': bad geometry", n->name);
        int64_t o = st * (in - 1) + opad + dl * (kk - 1) + 1 - pb - pe;
        if (o < 1 || o > MDB_MAX_DIM)
            FAIL(SQ_BAD_MODEL, "ConvTranspose '%s': output dim %lld", n->name, (long long)o);
        out.dims[2 + i] = o;
    }
    set_out(c, 0, x->dtype, &out);
    return 0;
}
