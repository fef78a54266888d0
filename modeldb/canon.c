/* Canonical forms (mdb_graph.h), op by op: the parameters ONNX passes as
 * constant inputs become attributes (opset by opset), optional attributes
 * are filled in, axes made non-negative, auto_pad resolved into pads. Each
 * function is an op's canon in the descriptor table (ops.c). */
#include "canon_int.h"

int mdb__canon_reshape(lctx_t *c)
{
    mdb_node_t *n = c->node;
    const mdb_tensor_t *x = input(c, 0);
    int64_t target[MDB_MAX_RANK];
    size_t count = 0;
    int rc = const_ints(c, 1, target, MDB_MAX_RANK, &count);
    if (rc == 1) {
        size_t na;
        const int64_t *a = mdb_node_ints(n, "shape", &na);
        if (!a || na > MDB_MAX_RANK)
            FAIL(SQ_BAD_MODEL, "Reshape '%s' has no target shape", n->name);
        memcpy(target, a, na * sizeof(int64_t));
        count = na;
    } else if (rc) {
        return rc;
    }
    mdb_shape_t out;
    rc = mdb_reshape_resolve(&x->shape, target, (int)count, mdb_node_int(n, "allowzero", 0) != 0,
                             &out, c->err, c->errlen);
    if (rc)
        return rc;
    mdb_node_set_ints(n, "shape", out.dims, (size_t)out.rank);
    mdb_node_del_attr(n, "allowzero");
    keep_inputs(n, 1);
    return 0;
}

/* Einsum: a batched matrix product, B as it is or transposed, recognized
 * from the equation (spaces ignored); anything else is refused. */
int mdb__canon_einsum(lctx_t *c)
{
    mdb_node_t *n = c->node;
    if (mdb_node_attr(n, "transB") && !mdb_node_attr(n, "equation"))
        return 0; /* canonical already */
    const char *eq = mdb_node_string(n, "equation", "");
    char t[3][MDB_MAX_RANK + 1];
    int len[3] = {0, 0, 0}, part = 0;
    bool ok = true;
    for (const char *p = eq; *p && ok; p++) {
        if (*p == ' ')
            continue;
        if (*p == ',' && part == 0)
            part = 1;
        else if (*p == '-' && p[1] == '>' && part == 1) {
            part = 2;
            p++;
        } else if (((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z')) &&
                   len[part] < MDB_MAX_RANK)
            t[part][len[part]++] = *p;
        else
            ok = false;
    }
    int r = len[0];
    ok = ok && part == 2 && r >= 2 && len[1] == r && len[2] == r &&
         memcmp(t[0], t[1], (size_t)(r - 2)) == 0 && memcmp(t[0], t[2], (size_t)(r - 2)) == 0;
    char i = ok ? t[0][r - 2] : 0, k = ok ? t[0][r - 1] : 0;
    int trans_b = -1;
    if (ok && t[2][r - 2] == i && t[1][r - 2] == k && t[2][r - 1] == t[1][r - 1])
        trans_b = 0;
    else if (ok && t[2][r - 2] == i && t[1][r - 1] == k && t[2][r - 1] == t[1][r - 2])
        trans_b = 1;
    if (trans_b < 0 || t[2][r - 1] == i || t[2][r - 1] == k || i == k)
        FAIL(SQ_UNSUPPORTED_MODEL,
             "Einsum '%s': '%s' is not a batched matrix product (the worker runs "
             "...ik,...kj->...ij and ...ik,...jk->...ij)",
             n->name, eq);
    mdb_node_del_attr(n, "equation");
    mdb_node_set_int(n, "transB", trans_b);
    return 0;
}

/* Expand: the output shape (x broadcast against the requested one, the
 * batch as MDB_DIM_BATCH) as the attribute "shape". */
int mdb__canon_expand(lctx_t *c)
{
    mdb_node_t *n = c->node;
    const mdb_tensor_t *x = input(c, 0);
    int64_t target[MDB_MAX_RANK];
    size_t count = 0;
    int rc = const_ints(c, 1, target, MDB_MAX_RANK, &count);
    if (rc == 1) {
        if (mdb_node_attr(n, "shape"))
            return 0; /* canonical already */
        FAIL(SQ_BAD_MODEL, "Expand '%s' has no shape", n->name);
    }
    if (rc)
        return rc;
    int rank = (int)count > x->shape.rank ? (int)count : x->shape.rank;
    int64_t out[MDB_MAX_RANK];
    for (int i = 0; i < rank; i++) {
        int xi = i - (rank - x->shape.rank), ti = i - (rank - (int)count);
        int64_t a = xi >= 0 ? x->shape.dims[xi] : 1;
        int64_t b = ti >= 0 ? target[ti] : 1;
        if (mdb_is_sym_batch(b))
            b = -mdb_sym_batch_k(b);
        else if (b < 0 || b > MDB_MAX_DIM)
            FAIL(SQ_BAD_MODEL, "Expand '%s': bad dimension %lld", n->name, (long long)b);
        if (a == b || b == 1)
            out[i] = a;
        else if (a == 1)
            out[i] = b;
        else
            FAIL(a < 0 || b < 0 ? SQ_UNSUPPORTED_MODEL : SQ_BAD_MODEL,
                 "Expand '%s': shapes do not broadcast at axis %d", n->name, i);
    }
    mdb_node_set_ints(n, "shape", out, (size_t)rank);
    keep_inputs(n, 1);
    return 0;
}

static int axes_list(lctx_t *c, const char *attr, int input_k, int rank, bool sort)
{
    mdb_node_t *n = c->node;
    int64_t axes[MDB_MAX_RANK * 2];
    size_t count = 0;
    int rc = c->opset >= 13 && input_k > 0 ? const_ints(c, input_k, axes, MDB_MAX_RANK, &count) : 1;
    if (rc == 1) {
        size_t na;
        const int64_t *a = mdb_node_ints(n, attr, &na);
        if (na > MDB_MAX_RANK)
            FAIL(SQ_BAD_MODEL, "%s '%s': too many axes", mdb_op_name(n->op), n->name);
        if (a)
            memcpy(axes, a, na * sizeof(int64_t));
        count = na;
    } else if (rc) {
        return rc;
    }
    for (size_t i = 0; i < count; i++) {
        if (axes[i] < -rank || axes[i] >= rank)
            FAIL(SQ_BAD_MODEL, "%s '%s': axis %lld out of range", mdb_op_name(n->op), n->name,
                 (long long)axes[i]);
        if (axes[i] < 0)
            axes[i] += rank;
        for (size_t j = 0; j < i; j++)
            if (axes[j] == axes[i])
                FAIL(SQ_BAD_MODEL, "%s '%s': repeated axis", mdb_op_name(n->op), n->name);
    }
    for (size_t i = 1; sort && i < count; i++)
        for (size_t j = i; j > 0 && axes[j - 1] > axes[j]; j--) {
            int64_t t = axes[j];
            axes[j] = axes[j - 1];
            axes[j - 1] = t;
        }
    mdb_node_set_ints(n, attr, axes, count);
    keep_inputs(n, 1);
    return 0;
}

/* Before opset 7, Add/Mul/Sub/Div broadcast B from axis (broadcast=1,
 * axis=k): a constant B of shape [C] against [N,C,H,W] at axis 1 becomes
 * [C,1,1], which numpy broadcasting then reads the same way. */
static int legacy_broadcast(lctx_t *c)
{
    mdb_node_t *n = c->node;
    bool bcast = mdb_node_int(n, "broadcast", 0) != 0;
    const mdb_attr_t *axis_attr = mdb_node_attr(n, "axis");
    int64_t axis = axis_attr && axis_attr->type == MDB_ATTR_INT ? axis_attr->i : INT64_MIN;
    mdb_node_del_attr(n, "broadcast");
    mdb_node_del_attr(n, "axis");
    mdb_node_del_attr(n, "consumed_inputs");
    if (!bcast || axis == INT64_MIN)
        return 0;
    const mdb_tensor_t *a = input(c, 0), *b = input(c, 1);
    if (!a || !b)
        FAIL(SQ_BAD_MODEL, "%s '%s' needs two inputs", mdb_op_name(n->op), n->name);
    int ra = a->shape.rank, rb = b->shape.rank;
    if (axis < 0)
        axis += ra;
    int64_t ones = ra - axis - rb;
    if (axis < 0 || ones < 0 || rb + ones > MDB_MAX_RANK)
        FAIL(SQ_BAD_MODEL, "%s '%s': legacy broadcast axis out of range", mdb_op_name(n->op),
             n->name);
    if (ones == 0)
        return 0;
    if (!b->data)
        FAIL(SQ_UNSUPPORTED_MODEL, "%s '%s': legacy axis broadcast of a runtime tensor",
             mdb_op_name(n->op), n->name);
    mdb_shape_t shape = b->shape;
    for (int i = 0; i < ones; i++)
        shape.dims[shape.rank++] = 1;
    void *copy = malloc(b->nbytes + 1);
    if (!copy)
        return SQ_NOMEM;
    memcpy(copy, b->data, b->nbytes);
    size_t nbytes = b->nbytes;
    int t = mdb_graph_add_tensor(c->g, b->name, b->dtype, &shape);
    mdb_graph_set_data(c->g, t, copy, nbytes);
    c->node->inputs[1] = t;
    return 0;
}

/* POW */
int mdb__canon_pow(lctx_t *c)
{
    mdb_node_t *n = c->node;
    int rc;
    float exponent = 0.0f;
    if ((rc = const_float(c, 1, &exponent)) < 0)
        return rc;
    if (rc == 1 && !mdb_node_attr(n, "exponent"))
        FAIL(SQ_BAD_MODEL, "Pow '%s' has no exponent", n->name);
    if (rc == 0)
        mdb_node_set_float(n, "exponent", exponent);
    keep_inputs(n, 1);
    return 0;
}

/* LAYER_NORM */
int mdb__canon_layer_norm(lctx_t *c)
{
    mdb_node_t *n = c->node;
    int rank = rank0(c);
    int rc;
    if ((rc = norm_axis_attr(c, "axis", -1, rank)) != 0)
        return rc;
    if (!mdb_node_attr(n, "epsilon"))
        mdb_node_set_float(n, "epsilon", 1e-5f);
    mdb_node_del_attr(n, "stash_type");
    return 0;
}

/* GELU */
int mdb__canon_gelu(lctx_t *c)
{
    mdb_node_t *n = c->node;
    if (strcmp(mdb_node_string(n, "approximate", "none"), "none") != 0)
        FAIL(SQ_UNSUPPORTED_MODEL, "Gelu '%s': only approximate=\"none\"", n->name);
    mdb_node_del_attr(n, "approximate");
    return 0;
}

/* CLIP */
int mdb__canon_clip(lctx_t *c)
{
    mdb_node_t *n = c->node;
    int rc;
    float lo = -INFINITY, hi = INFINITY;
    if (c->opset < 11) {
        lo = mdb_node_float(n, "min", lo);
        hi = mdb_node_float(n, "max", hi);
    } else {
        if ((rc = const_float(c, 1, &lo)) < 0 || (rc = const_float(c, 2, &hi)) < 0)
            return rc;
    }
    mdb_node_set_float(n, "min", lo);
    mdb_node_set_float(n, "max", hi);
    keep_inputs(n, 1);
    return 0;
}

/* ADD, MUL, SUB, DIV */
int mdb__canon_binary(lctx_t *c)
{
    return c->opset < 7 ? legacy_broadcast(c) : 0;
}

/* LEAKY_RELU */
int mdb__canon_leaky_relu(lctx_t *c)
{
    mdb_node_t *n = c->node;
    mdb_node_set_float(n, "alpha", mdb_node_float(n, "alpha", 0.01f));
    return 0;
}

/* HARD_SIGMOID */
int mdb__canon_hard_sigmoid(lctx_t *c)
{
    mdb_node_t *n = c->node;
    mdb_node_set_float(n, "alpha", mdb_node_float(n, "alpha", 0.2f));
    mdb_node_set_float(n, "beta", mdb_node_float(n, "beta", 0.5f));
    return 0;
}

/* GEMM */
int mdb__canon_gemm(lctx_t *c)
{
    mdb_node_t *n = c->node;
    mdb_node_set_float(n, "alpha", mdb_node_float(n, "alpha", 1.0f));
    mdb_node_set_float(n, "beta", mdb_node_float(n, "beta", 1.0f));
    mdb_node_set_int(n, "transA", mdb_node_int(n, "transA", 0));
    mdb_node_set_int(n, "transB", mdb_node_int(n, "transB", 0));
    mdb_node_del_attr(n, "broadcast");
    return 0;
}

/* CONCAT */
int mdb__canon_concat(lctx_t *c)
{
    int rank = rank0(c);
    /* axis was optional (default 1) before opset 4 */
    return norm_axis_attr(c, "axis", c->opset < 4 ? 1 : 0, rank);
}

/* GATHER */
int mdb__canon_gather(lctx_t *c)
{
    mdb_node_t *n = c->node;
    int rank = rank0(c);
    int rc;
    if ((rc = norm_axis_attr(c, "axis", 0, rank)) != 0)
        return rc;
    const mdb_tensor_t *x = input(c, 0), *ind = input(c, 1);
    if (x->data != NULL || ind == NULL || ind->data == NULL || ind->dtype == MDB_DT_FLOAT ||
        ind->shape.rank != 0)
        return 0; /* folded, or refused as import-time */
    int64_t axis = mdb_node_int(n, "axis", 0), dim = x->shape.dims[axis];
    int64_t index = mdb_const_int(ind, 0);
    if (dim < 0)
        FAIL(SQ_UNSUPPORTED_MODEL, "Gather '%s' picks one item of the batch", n->name);
    if (index < -dim || index >= dim)
        FAIL(SQ_BAD_MODEL, "Gather '%s': index out of range", n->name);
    mdb_node_set_int(n, "index", index < 0 ? index + dim : index);
    keep_inputs(n, 1);
    return 0;
}

/* FLATTEN */
int mdb__canon_flatten(lctx_t *c)
{
    mdb_node_t *n = c->node;
    int rank = rank0(c);
    int64_t a = mdb_node_int(n, "axis", 1);
    if (a < -rank || a > rank)
        FAIL(SQ_BAD_MODEL, "Flatten '%s': axis out of range", n->name);
    mdb_node_set_int(n, "axis", a < 0 ? a + rank : a);
    return 0;
}

/* SOFTMAX */
int mdb__canon_softmax(lctx_t *c)
{
    mdb_node_t *n = c->node;
    int rank = rank0(c);
    int rc;
    rc = norm_axis_attr(c, "axis", c->opset < 13 ? 1 : -1, rank);
    if (rc)
        return rc;
    /* Before opset 13 Softmax flattened [axis:] into one axis; that is
     * the single-axis form when the dims after axis are all 1. */
    int64_t a = mdb_node_int(n, "axis", 0);
    if (c->opset < 13) {
        const mdb_tensor_t *x = input(c, 0);
        for (int i = (int)a + 1; i < rank; i++)
            if (x->shape.dims[i] != 1)
                FAIL(SQ_UNSUPPORTED_MODEL,
                     "Softmax '%s': opset %lld coerces axes %lld.. into one, which is not "
                     "supported",
                     n->name, (long long)c->opset, (long long)a);
    }
    return 0;
}

/* TRANSPOSE */
int mdb__canon_transpose(lctx_t *c)
{
    mdb_node_t *n = c->node;
    int rank = rank0(c);
    size_t np;
    if (!mdb_node_ints(n, "perm", &np)) {
        int64_t perm[MDB_MAX_RANK];
        for (int i = 0; i < rank; i++)
            perm[i] = rank - 1 - i;
        mdb_node_set_ints(n, "perm", perm, (size_t)rank);
    }
    return 0;
}

/* PAD */
int mdb__canon_pad(lctx_t *c)
{
    mdb_node_t *n = c->node;
    int rc;
    const char *mode = mdb_node_string(n, "mode", "constant");
    if (strcmp(mode, "constant") != 0 && strcmp(mode, "reflect") != 0 && strcmp(mode, "edge") != 0)
        FAIL(SQ_UNSUPPORTED_MODEL, "Pad '%s': mode '%s'", n->name, mode);
    mdb_node_set_string(n, "mode", mode, strlen(mode));
    if (c->opset >= 11) {
        int64_t pads[MDB_MAX_RANK * 2];
        size_t count = 0;
        float value = 0;
        if ((rc = const_ints(c, 1, pads, MDB_MAX_RANK * 2, &count)) != 0)
            return rc == 1 ? (mdb_errf(c->err, c->errlen, "Pad '%s' has no pads", n->name),
                              SQ_BAD_MODEL)
                           : rc;
        if ((rc = const_float(c, 2, &value)) < 0)
            return rc;
        if (input(c, 3))
            FAIL(SQ_UNSUPPORTED_MODEL, "Pad '%s' with axes", n->name);
        mdb_node_set_ints(n, "pads", pads, count);
        mdb_node_set_float(n, "value", value);
    } else {
        if (c->opset < 2) {
            size_t np;
            const int64_t *p = mdb_node_ints(n, "paddings", &np);
            if (p)
                mdb_node_set_ints(n, "pads", p, np);
            mdb_node_del_attr(n, "paddings");
        }
        mdb_node_set_float(n, "value", mdb_node_float(n, "value", 0));
    }
    keep_inputs(n, 1);
    return 0;
}

/* REDUCE_MEAN */
int mdb__canon_reduce_mean(lctx_t *c)
{
    mdb_node_t *n = c->node;
    int rank = rank0(c);
    int rc;
    if (c->opset >= 18 && mdb_node_int(n, "noop_with_empty_axes", 0) && !input(c, 1))
        FAIL(SQ_UNSUPPORTED_MODEL, "ReduceMean '%s' with noop_with_empty_axes", n->name);
    mdb_node_del_attr(n, "noop_with_empty_axes");
    int64_t saved = c->opset;
    c->opset = saved >= 18 ? 18 : 0; /* axes became an input in opset 18 */
    rc = axes_list(c, "axes", 1, rank, true);
    c->opset = saved;
    if (rc)
        return rc;
    size_t na;
    mdb_node_ints(n, "axes", &na);
    if (na == 0) {
        int64_t all[MDB_MAX_RANK];
        for (int i = 0; i < rank; i++)
            all[i] = i;
        mdb_node_set_ints(n, "axes", all, (size_t)rank);
    }
    mdb_node_set_int(n, "keepdims", mdb_node_int(n, "keepdims", 1));
    return 0;
}

/* BATCH_NORM */
int mdb__canon_batch_norm(lctx_t *c)
{
    mdb_node_t *n = c->node;
    if (mdb_node_int(n, "training_mode", 0) || (c->opset < 9 && !mdb_node_int(n, "spatial", 1)))
        FAIL(SQ_UNSUPPORTED_MODEL, "BatchNormalization '%s' in training or non-spatial mode",
             n->name);
    mdb_node_set_float(n, "epsilon", mdb_node_float(n, "epsilon", 1e-5f));
    mdb_node_del_attr(n, "momentum");
    mdb_node_del_attr(n, "spatial");
    mdb_node_del_attr(n, "is_test");
    mdb_node_del_attr(n, "consumed_inputs");
    mdb_node_del_attr(n, "training_mode");
    return 0;
}

/* DROPOUT */
int mdb__canon_dropout(lctx_t *c)
{
    mdb_node_t *n = c->node;
    int rc;
    if (c->opset >= 12 && input(c, 2)) {
        int64_t tm[1];
        size_t cnt = 0;
        if ((rc = const_ints(c, 2, tm, 1, &cnt)) < 0)
            return rc;
        /* A ratio of 0 drops nothing even in training mode (torch
         * exports Swin's F.dropout(attn, p=0.0) so). */
        float ratio = 0.5f;
        if (cnt == 1 && tm[0] && (const_float(c, 1, &ratio) != 0 || ratio != 0.0f))
            FAIL(SQ_UNSUPPORTED_MODEL, "Dropout '%s' in training mode", n->name);
    }
    mdb_node_del_attr(n, "ratio");
    mdb_node_del_attr(n, "seed");
    mdb_node_del_attr(n, "is_test");
    keep_inputs(n, 1);
    return 0;
}

/* SPLIT */
int mdb__canon_split(lctx_t *c)
{
    mdb_node_t *n = c->node;
    int rank = rank0(c);
    int rc;
    rc = norm_axis_attr(c, "axis", 0, rank);
    if (rc)
        return rc;
    int64_t sizes[MDB_MAX_NODE_IO];
    size_t count = 0;
    rc = c->opset >= 13 ? const_ints(c, 1, sizes, MDB_MAX_NODE_IO, &count) : 1;
    if (rc < 0)
        return rc;
    if (rc == 1 && !mdb_node_attr(n, "split")) {
        const mdb_tensor_t *x = input(c, 0);
        int64_t dim = x->shape.dims[mdb_node_int(n, "axis", 0)];
        int outs = n->n_outputs;
        if (dim < 0 || outs < 1)
            FAIL(SQ_UNSUPPORTED_MODEL, "Split '%s' of the batch", n->name);
        /* Opset 18 allows a smaller last chunk; earlier ones need an
         * even split, which the same formula gives. */
        int64_t chunk = (dim + outs - 1) / outs;
        for (int i = 0; i < outs; i++) {
            int64_t left = dim - chunk * i;
            sizes[i] = left < 0 ? 0 : left < chunk ? left : chunk;
        }
        count = (size_t)outs;
        rc = 0;
    }
    if (rc == 0)
        mdb_node_set_ints(n, "split", sizes, count);
    mdb_node_del_attr(n, "num_outputs");
    keep_inputs(n, 1);
    return 0;
}

/* SLICE */
int mdb__canon_slice(lctx_t *c)
{
    mdb_node_t *n = c->node;
    int rc;
    if (c->opset >= 10) {
        int64_t v[4][MDB_MAX_RANK];
        size_t cnt[4] = {0};
        static const char *const names[4] = {"starts", "ends", "axes", "steps"};
        for (int k = 0; k < 4; k++) {
            rc = const_ints(c, k + 1, v[k], MDB_MAX_RANK, &cnt[k]);
            if (rc < 0)
                return rc;
            if (rc == 0)
                mdb_node_set_ints(n, names[k], v[k], cnt[k]);
        }
    }
    size_t ns, na, nst;
    const int64_t *starts = mdb_node_ints(n, "starts", &ns);
    if (!starts)
        FAIL(SQ_BAD_MODEL, "Slice '%s' has no starts", n->name);
    if (!mdb_node_ints(n, "axes", &na)) {
        int64_t axes[MDB_MAX_RANK];
        for (size_t i = 0; i < ns && i < MDB_MAX_RANK; i++)
            axes[i] = (int64_t)i;
        mdb_node_set_ints(n, "axes", axes, ns < MDB_MAX_RANK ? ns : MDB_MAX_RANK);
    }
    if (!mdb_node_ints(n, "steps", &nst))
        fill_ints(n, "steps", ns < MDB_MAX_RANK ? ns : MDB_MAX_RANK, 1);
    keep_inputs(n, 1);
    mdb_shape_t out;
    return mdb_slice_resolve(&input(c, 0)->shape, n, &out, true, c->err, c->errlen);
}

/* UNSQUEEZE */
int mdb__canon_unsqueeze(lctx_t *c)
{
    mdb_node_t *n = c->node;
    int rank = rank0(c);
    int rc;
    /* Axes of Unsqueeze count in the output rank. */
    int64_t axes[MDB_MAX_RANK];
    size_t count = 0;
    rc = c->opset >= 13 ? const_ints(c, 1, axes, MDB_MAX_RANK, &count) : 1;
    if (rc < 0)
        return rc;
    if (rc == 1) {
        const int64_t *a = mdb_node_ints(n, "axes", &count);
        if (!a || count > MDB_MAX_RANK)
            FAIL(SQ_BAD_MODEL, "Unsqueeze '%s': missing or too many axes", n->name);
        memcpy(axes, a, count * sizeof(int64_t));
    }
    int out_rank = rank + (int)count;
    if (out_rank > MDB_MAX_RANK)
        FAIL(SQ_UNSUPPORTED_MODEL, "Unsqueeze '%s' to rank %d", n->name, out_rank);
    for (size_t i = 0; i < count; i++) {
        if (axes[i] < -out_rank || axes[i] >= out_rank)
            FAIL(SQ_BAD_MODEL, "Unsqueeze '%s': axis out of range", n->name);
        if (axes[i] < 0)
            axes[i] += out_rank;
    }
    mdb_node_set_ints(n, "axes", axes, count);
    keep_inputs(n, 1);
    return 0;
}

/* SQUEEZE */
int mdb__canon_squeeze(lctx_t *c)
{
    int rank = rank0(c);
    return axes_list(c, "axes", 1, rank, true);
}

/* CAST */
int mdb__canon_cast(lctx_t *c)
{
    mdb_node_t *n = c->node;
    /* ONNX's "to" becomes an mdb_dtype_t. */
    static const int map[] = {[1] = MDB_DT_FLOAT, [2] = MDB_DT_UINT8, [3] = MDB_DT_INT8,
                              [6] = MDB_DT_INT32, [7] = MDB_DT_INT64, [9] = MDB_DT_BOOL};
    int64_t to = mdb_node_int(n, "to", 0);
    if (to < 0 || to >= (int64_t)(sizeof(map) / sizeof(map[0])) || map[to] == 0)
        FAIL(SQ_UNSUPPORTED_MODEL, "Cast '%s' to ONNX type %lld", n->name, (long long)to);
    mdb_node_set_int(n, "to", map[to]);
    return 0;
}

/* SHAPE */
int mdb__canon_shape(lctx_t *c)
{
    mdb_node_t *n = c->node;
    int rank = rank0(c);
    int64_t s = mdb_node_int(n, "start", 0), e = mdb_node_int(n, "end", rank);
    s = s < 0 ? s + rank : s;
    e = e < 0 ? e + rank : e;
    s = s < 0 ? 0 : s > rank ? rank : s;
    e = e < 0 ? 0 : e > rank ? rank : e;
    mdb_node_set_int(n, "start", s);
    mdb_node_set_int(n, "end", e);
    return 0;
}
