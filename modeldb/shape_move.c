/* Shape inference of the ops that move, gather or cut data without
 * computing on it (concat, flatten, reshape, transpose, pad, split, slice,
 * squeeze, gather, shape, expand); shape.c has the others. */
#include "shape_int.h"

int mdb__infer_concat(ictx_t *c)
{
    const mdb_tensor_t *first = in_t(c, 0);
    if (!first || c->node->n_inputs < 1)
        FAIL(SQ_BAD_MODEL, "Concat '%s' has no inputs", c->node->name);
    int rank = first->shape.rank;
    int64_t axis = norm_axis(mdb_node_int(c->node, "axis", 0), rank);
    int rc = check_axis(c, axis, rank);
    if (rc)
        return rc;
    mdb_shape_t out = first->shape;
    out.dims[axis] = 0;
    for (int k = 0; k < c->node->n_inputs; k++) {
        const mdb_tensor_t *t = in_t(c, k);
        if (!t || t->shape.rank != rank)
            FAIL(SQ_BAD_MODEL, "Concat '%s': input %d has another rank", c->node->name, k);
        for (int i = 0; i < rank; i++) {
            if (i == axis)
                continue;
            if (t->shape.dims[i] != out.dims[i])
                FAIL(SQ_BAD_MODEL, "Concat '%s': input %d differs at axis %d", c->node->name, k, i);
        }
        int64_t d = t->shape.dims[axis];
        if (d < 0)
            FAIL(SQ_UNSUPPORTED_MODEL, "Concat '%s' concatenates along the batch", c->node->name);
        out.dims[axis] += d;
        if (out.dims[axis] > MDB_MAX_DIM)
            FAIL(SQ_BAD_MODEL, "Concat '%s': dimension overflow", c->node->name);
    }
    set_out(c, 0, first->dtype, &out);
    return 0;
}

int mdb__infer_flatten(ictx_t *c)
{
    const mdb_tensor_t *x = in_t(c, 0);
    int rank = x->shape.rank;
    int64_t axis = norm_axis(mdb_node_int(c->node, "axis", 1), rank);
    if (axis < 0 || axis > rank)
        FAIL(SQ_BAD_MODEL, "Flatten '%s': axis out of range", c->node->name);
    mdb_shape_t out = {.rank = 2, .dims = {1, 1}};
    for (int i = 0; i < rank; i++) {
        int rc =
            dim_mul(c, out.dims[i < axis ? 0 : 1], x->shape.dims[i], &out.dims[i < axis ? 0 : 1]);
        if (rc)
            return rc;
    }
    set_out(c, 0, x->dtype, &out);
    return 0;
}

/* The batch may be merged with other dimensions and split from them again
 * (k * N: attention's [N * heads, tokens, d]); a target dimension is then
 * -k, and whether items stay apart is the graph's check
 * (mdb_graph_items_apart), not the resolver's. */
int mdb_reshape_resolve(const mdb_shape_t *in, const int64_t *target, int n, bool allowzero,
                        mdb_shape_t *out, char *err, size_t errlen)
{
    if (n < 0 || n > MDB_MAX_RANK) {
        mdb_errf(err, errlen, "Reshape to rank %d", n);
        return SQ_UNSUPPORTED_MODEL;
    }
    /* Each side is const * k * N (or const without the batch). */
    int in_batch = 0;
    int64_t in_const = 1, in_k = 1;
    if (in->rank < 0 || in->rank > MDB_MAX_RANK)
        return SQ_INTERNAL;
    for (int i = 0; i < in->rank; i++) {
        int64_t d = in->dims[i];
        if (d < 0) {
            in_batch++;
            d = -d;
            if (__builtin_mul_overflow(in_k, d, &in_k))
                in_const = -1;
        } else if (__builtin_mul_overflow(in_const, d, &in_const)) {
            in_const = -1;
        }
    }
    if (in_const < 0 || in_const > MDB_MAX_ELEMENTS || in_k > MDB_MAX_DIM || in_batch > 1) {
        mdb_errf(err, errlen, "Reshape of a tensor too large");
        return in_batch > 1 ? SQ_UNSUPPORTED_MODEL : SQ_BAD_MODEL;
    }
    out->rank = n;
    int infer_at = -1, out_batch = 0;
    int64_t out_const = 1, out_k = 1;
    for (int i = 0; i < n; i++) {
        int64_t d = target[i];
        if (mdb_is_sym_batch(d)) {
            d = -mdb_sym_batch_k(d);
        } else if (d == 0 && !allowzero) {
            if (i >= in->rank) {
                mdb_errf(err, errlen, "Reshape copies dimension %d of a rank-%d input", i,
                         in->rank);
                return SQ_BAD_MODEL;
            }
            d = in->dims[i];
        } else if (d == -1) {
            if (infer_at >= 0) {
                mdb_errf(err, errlen, "Reshape target has two -1");
                return SQ_BAD_MODEL;
            }
            infer_at = i;
            out->dims[i] = 1;
            continue;
        } else if (d < 0 || d > MDB_MAX_DIM) {
            mdb_errf(err, errlen, "Reshape target dimension %lld", (long long)d);
            return SQ_BAD_MODEL;
        }
        out->dims[i] = d;
        if (d < 0) {
            out_batch++;
            out_k = -d;
        } else {
            if (d != 0 && out_const > MDB_MAX_ELEMENTS / d) {
                mdb_errf(err, errlen, "Reshape target too large");
                return SQ_BAD_MODEL;
            }
            out_const *= d;
        }
    }
    if (out_batch > 1 || (out_batch == 1 && !in_batch)) {
        mdb_errf(err, errlen, "Reshape target has the batch where the input has none");
        return SQ_UNSUPPORTED_MODEL;
    }
    if (infer_at >= 0) {
        /* The whole input (in_const * in_k, per unit of N) over what the
         * target fixes: the batch's multiple when the target has none. */
        int64_t whole = in_const * in_k, fixed = out_const * out_k;
        if (fixed == 0 || whole % fixed != 0) {
            mdb_errf(err, errlen, "Reshape cannot infer the -1 dimension");
            return SQ_BAD_MODEL;
        }
        int64_t k = whole / fixed;
        if (in_batch && !out_batch) {
            if (k > MDB_MAX_DIM) {
                mdb_errf(err, errlen, "Reshape target too large");
                return SQ_BAD_MODEL;
            }
            out->dims[infer_at] = -k;
            out_batch = 1;
            out_k = k;
        } else {
            out->dims[infer_at] = k;
            out_const *= k;
        }
    }
    if ((in_batch != 0) != (out_batch == 1)) {
        mdb_errf(err, errlen, "Reshape drops the batch");
        return SQ_UNSUPPORTED_MODEL;
    }
    if (out_const * out_k != in_const * in_k) {
        mdb_errf(err, errlen, "Reshape changes the element count (%lld to %lld)",
                 (long long)(in_const * in_k), (long long)(out_const * out_k));
        return SQ_BAD_MODEL;
    }
    return 0;
}

int mdb__infer_reshape(ictx_t *c)
{
    const mdb_tensor_t *x = in_t(c, 0);
    size_t n;
    const int64_t *shape = mdb_node_ints(c->node, "shape", &n);
    if (!shape && n == 0 && !mdb_node_attr(c->node, "shape"))
        FAIL(SQ_BAD_MODEL, "Reshape '%s' has no target shape", c->node->name);
    mdb_shape_t out;
    int64_t target[MDB_MAX_RANK];
    if (n > MDB_MAX_RANK)
        FAIL(SQ_UNSUPPORTED_MODEL, "Reshape '%s' to rank %zu", c->node->name, n);
    /* The canonical attribute uses -k for k * N; the resolver expects the
     * folded sentinel. */
    for (size_t i = 0; i < n; i++)
        target[i] = shape[i] < 0 && shape[i] >= -MDB_MAX_DIM ? mdb_sym_batch(-shape[i]) : shape[i];
    int rc = mdb_reshape_resolve(&x->shape, target, (int)n, true, &out, c->err, c->errlen);
    if (rc)
        return rc;
    set_out(c, 0, x->dtype, &out);
    return 0;
}

int mdb__infer_transpose(ictx_t *c)
{
    const mdb_tensor_t *x = in_t(c, 0);
    int rank = x->shape.rank;
    size_t n;
    const int64_t *perm = mdb_node_ints(c->node, "perm", &n);
    mdb_shape_t out = {.rank = rank};
    bool used[MDB_MAX_RANK] = {0};
    for (int i = 0; i < rank; i++) {
        int64_t p = perm ? (i < (int)n ? perm[i] : -1) : rank - 1 - i;
        if ((perm && (int)n != rank) || p < 0 || p >= rank || used[p])
            FAIL(SQ_BAD_MODEL, "Transpose '%s': perm is not a permutation of %d axes",
                 c->node->name, rank);
        used[p] = true;
        out.dims[i] = x->shape.dims[p];
    }
    set_out(c, 0, x->dtype, &out);
    return 0;
}

int mdb__infer_pad(ictx_t *c)
{
    const mdb_tensor_t *x = in_t(c, 0);
    int rank = x->shape.rank;
    size_t n;
    const int64_t *pads = mdb_node_ints(c->node, "pads", &n);
    if (!pads || (int)n != 2 * rank)
        FAIL(SQ_BAD_MODEL, "Pad '%s': pads must have %d values", c->node->name, 2 * rank);
    mdb_shape_t out = x->shape;
    for (int i = 0; i < rank; i++) {
        if (x->shape.dims[i] < 0) {
            if (pads[i] || pads[rank + i])
                FAIL(SQ_UNSUPPORTED_MODEL, "Pad '%s' pads the batch", c->node->name);
            continue;
        }
        if (pads[i] < -MDB_MAX_DIM || pads[i] > MDB_MAX_DIM || pads[rank + i] < -MDB_MAX_DIM ||
            pads[rank + i] > MDB_MAX_DIM)
            FAIL(SQ_BAD_MODEL, "Pad '%s': absurd pads", c->node->name);
        out.dims[i] += pads[i] + pads[rank + i];
        if (out.dims[i] < 0 || out.dims[i] > MDB_MAX_DIM)
            FAIL(SQ_BAD_MODEL, "Pad '%s': padded dimension %d out of range", c->node->name, i);
    }
    set_out(c, 0, x->dtype, &out);
    return 0;
}

int mdb__infer_reduce(ictx_t *c)
{
    const mdb_tensor_t *x = in_t(c, 0);
    int rank = x->shape.rank;
    size_t n;
    const int64_t *axes = mdb_node_ints(c->node, "axes", &n);
    bool keep = mdb_node_int(c->node, "keepdims", 1) != 0;
    bool reduce[MDB_MAX_RANK] = {0};
    for (size_t i = 0; i < n; i++) {
        int64_t a = norm_axis(axes[i], rank);
        int rc = check_axis(c, a, rank);
        if (rc)
            return rc;
        reduce[a] = true;
    }
    if (n == 0)
        for (int i = 0; i < rank; i++)
            reduce[i] = true;
    mdb_shape_t out = {0};
    for (int i = 0; i < rank; i++) {
        if (reduce[i] && x->shape.dims[i] < 0)
            FAIL(SQ_UNSUPPORTED_MODEL, "ReduceMean '%s' reduces over the batch", c->node->name);
        if (!reduce[i])
            out.dims[out.rank++] = x->shape.dims[i];
        else if (keep)
            out.dims[out.rank++] = 1;
    }
    set_out(c, 0, x->dtype, &out);
    return 0;
}

int mdb__infer_split(ictx_t *c)
{
    const mdb_tensor_t *x = in_t(c, 0);
    int rank = x->shape.rank;
    int64_t axis = norm_axis(mdb_node_int(c->node, "axis", 0), rank);
    int rc = check_axis(c, axis, rank);
    if (rc)
        return rc;
    int64_t dim = x->shape.dims[axis];
    if (dim < 0)
        FAIL(SQ_UNSUPPORTED_MODEL, "Split '%s' splits the batch", c->node->name);
    size_t n;
    const int64_t *split = mdb_node_ints(c->node, "split", &n);
    int outs = c->node->n_outputs;
    if (outs < 1 || (split && (int)n != outs))
        FAIL(SQ_BAD_MODEL, "Split '%s': %zu sizes for %d outputs", c->node->name, n, outs);
    int64_t sum = 0;
    for (int k = 0; k < outs; k++) {
        int64_t len = split ? split[k] : (dim + outs - 1) / outs;
        if (!split && k == outs - 1)
            len = dim - sum;
        if (len < 0 || len > dim - sum)
            FAIL(SQ_BAD_MODEL, "Split '%s': sizes exceed the dimension", c->node->name);
        mdb_shape_t out = x->shape;
        out.dims[axis] = len;
        set_out(c, k, x->dtype, &out);
        sum += len;
    }
    if (sum != dim)
        FAIL(SQ_BAD_MODEL, "Split '%s': sizes sum to %lld, not %lld", c->node->name, (long long)sum,
             (long long)dim);
    return 0;
}

/* ONNX Slice arithmetic for one axis: clamps start/end and returns the
 * output length. */
static int64_t slice_len(int64_t dim, int64_t *start, int64_t *end, int64_t step)
{
    int64_t s = *start, e = *end;
    if (s < 0)
        s += dim;
    if (e < 0)
        e += dim;
    if (step > 0) {
        s = s < 0 ? 0 : s > dim ? dim : s;
        e = e < 0 ? 0 : e > dim ? dim : e;
    } else {
        s = s < 0 ? -1 : s > dim - 1 ? dim - 1 : s;
        e = e < -1 ? -1 : e > dim - 1 ? dim - 1 : e;
    }
    *start = s;
    /* Before the first element (a reversed slice to the start) is stored
     * as INT64_MIN: -1 would read back as the last element when canonical
     * attributes are resolved again (Swin's F.pad reverses its pads). */
    *end = step < 0 && e == -1 ? INT64_MIN : e;
    if (step > 0)
        return e > s ? (e - s + step - 1) / step : 0;
    return s > e ? (s - e + (-step) - 1) / (-step) : 0;
}

int mdb_slice_resolve(const mdb_shape_t *in, mdb_node_t *node, mdb_shape_t *out, bool rewrite,
                      char *err, size_t errlen)
{
    size_t na, ns, ne, nst;
    const int64_t *axes = mdb_node_ints(node, "axes", &na);
    const int64_t *starts = mdb_node_ints(node, "starts", &ns);
    const int64_t *ends = mdb_node_ints(node, "ends", &ne);
    const int64_t *steps = mdb_node_ints(node, "steps", &nst);
    int rank = in->rank;
    if (!starts || !ends || ns != ne || (axes && na != ns) || (steps && nst != ns) ||
        ns > (size_t)rank) {
        mdb_errf(err, errlen, "Slice '%s': starts, ends, axes, steps disagree", node->name);
        return SQ_BAD_MODEL;
    }
    int64_t new_axes[MDB_MAX_RANK], new_starts[MDB_MAX_RANK], new_ends[MDB_MAX_RANK],
        new_steps[MDB_MAX_RANK];
    bool seen[MDB_MAX_RANK] = {0};
    *out = *in;
    for (size_t i = 0; i < ns; i++) {
        int64_t a = axes ? norm_axis(axes[i], rank) : (int64_t)i;
        int64_t step = steps ? steps[i] : 1;
        if (a < 0 || a >= rank || seen[a] || step == 0) {
            mdb_errf(err, errlen, "Slice '%s': bad axis or zero step", node->name);
            return SQ_BAD_MODEL;
        }
        seen[a] = true;
        int64_t s = starts[i], e = ends[i];
        if (in->dims[a] < 0) {
            /* Only the whole batch may be "sliced". */
            if (step != 1 || !(s == 0 || s <= -MDB_MAX_DIM) || e < MDB_MAX_DIM) {
                mdb_errf(err, errlen, "Slice '%s' slices the batch", node->name);
                return SQ_UNSUPPORTED_MODEL;
            }
            s = 0;
            e = INT64_MAX;
        } else {
            out->dims[a] = slice_len(in->dims[a], &s, &e, step);
        }
        new_axes[i] = a;
        new_starts[i] = s;
        new_ends[i] = e;
        new_steps[i] = step;
    }
    if (rewrite) {
        mdb_node_set_ints(node, "axes", new_axes, ns);
        mdb_node_set_ints(node, "starts", new_starts, ns);
        mdb_node_set_ints(node, "ends", new_ends, ns);
        mdb_node_set_ints(node, "steps", new_steps, ns);
    }
    return 0;
}

int mdb__infer_slice(ictx_t *c)
{
    mdb_shape_t out;
    int rc = mdb_slice_resolve(&in_t(c, 0)->shape, c->node, &out, false, c->err, c->errlen);
    if (rc)
        return rc;
    set_out(c, 0, in_t(c, 0)->dtype, &out);
    return 0;
}

int mdb__infer_squeeze(ictx_t *c)
{
    const mdb_tensor_t *x = in_t(c, 0);
    int rank = x->shape.rank;
    size_t n;
    const int64_t *axes = mdb_node_ints(c->node, "axes", &n);
    mdb_shape_t out = {0};
    if (c->node->op == MDB_OP_UNSQUEEZE) {
        int out_rank = rank + (int)n;
        bool ins[MDB_MAX_RANK] = {0};
        if (out_rank > MDB_MAX_RANK)
            FAIL(SQ_UNSUPPORTED_MODEL, "Unsqueeze '%s' to rank %d", c->node->name, out_rank);
        for (size_t i = 0; i < n; i++) {
            int64_t a = norm_axis(axes[i], out_rank);
            if (a < 0 || a >= out_rank || ins[a])
                FAIL(SQ_BAD_MODEL, "Unsqueeze '%s': bad axes", c->node->name);
            ins[a] = true;
        }
        out.rank = out_rank;
        for (int i = 0, j = 0; i < out_rank; i++)
            out.dims[i] = ins[i] ? 1 : x->shape.dims[j++];
    } else {
        bool sq[MDB_MAX_RANK] = {0};
        for (size_t i = 0; i < n; i++) {
            int64_t a = norm_axis(axes[i], rank);
            int rc = check_axis(c, a, rank);
            if (rc)
                return rc;
            if (x->shape.dims[a] != 1)
                FAIL(x->shape.dims[a] < 0 ? SQ_UNSUPPORTED_MODEL : SQ_BAD_MODEL,
                     "Squeeze '%s' of a dimension that is not 1", c->node->name);
            sq[a] = true;
        }
        for (int i = 0; i < rank; i++)
            if (!(n ? sq[i] : x->shape.dims[i] == 1))
                out.dims[out.rank++] = x->shape.dims[i];
    }
    set_out(c, 0, x->dtype, &out);
    return 0;
}

int mdb__infer_gather(ictx_t *c)
{
    const mdb_tensor_t *x = in_t(c, 0), *idx = in_t(c, 1);
    mdb_tensor_t scalar_index = {.shape = {.rank = 0}}; /* canonical: the attribute */
    if (!idx && mdb_node_attr(c->node, "index"))
        idx = &scalar_index;
    if (!idx)
        FAIL(SQ_BAD_MODEL, "Gather '%s' has no indices", c->node->name);
    int rank = x->shape.rank;
    int64_t axis = norm_axis(mdb_node_int(c->node, "axis", 0), rank);
    int rc = check_axis(c, axis, rank);
    if (rc)
        return rc;
    if (rank - 1 + idx->shape.rank > MDB_MAX_RANK)
        FAIL(SQ_UNSUPPORTED_MODEL, "Gather '%s': output rank too large", c->node->name);
    mdb_shape_t out = {0};
    for (int i = 0; i < axis; i++)
        out.dims[out.rank++] = x->shape.dims[i];
    for (int i = 0; i < idx->shape.rank; i++)
        out.dims[out.rank++] = idx->shape.dims[i];
    for (int i = (int)axis + 1; i < rank; i++)
        out.dims[out.rank++] = x->shape.dims[i];
    set_out(c, 0, x->dtype, &out);
    return 0;
}

int mdb__infer_shape_op(ictx_t *c)
{
    const mdb_tensor_t *x = in_t(c, 0);
    int rank = x->shape.rank;
    int64_t start = mdb_node_int(c->node, "start", 0), end = mdb_node_int(c->node, "end", rank);
    start = start < 0 ? start + rank : start;
    end = end < 0 ? end + rank : end;
    start = start < 0 ? 0 : start > rank ? rank : start;
    end = end < 0 ? 0 : end > rank ? rank : end;
    mdb_shape_t out = {.rank = 1, .dims = {end > start ? end - start : 0}};
    set_out(c, 0, MDB_DT_INT64, &out);
    return 0;
}

int mdb__infer_expand(ictx_t *c)
{
    const mdb_tensor_t *x = in_t(c, 0);
    mdb_node_t *node = c->node;
    size_t count = 0;
    const int64_t *dims = mdb_node_ints(node, "shape", &count);
    if (dims == NULL || count > MDB_MAX_RANK || (int)count < x->shape.rank)
        FAIL(SQ_BAD_MODEL, "Expand '%s' has no output shape", node->name);
    mdb_shape_t out = {.rank = (int)count};
    for (size_t i = 0; i < count; i++) {
        out.dims[i] = dims[i];
        int xi = (int)i - ((int)count - x->shape.rank);
        if (xi >= 0 && x->shape.dims[xi] != 1 && x->shape.dims[xi] != dims[i])
            FAIL(SQ_BAD_MODEL, "Expand '%s': shapes do not broadcast at axis %d", node->name,
                 (int)i);
    }
    set_out(c, 0, x->dtype, &out);
    return 0;
}
