/* Constant folding at import: evaluates the shape arithmetic that exporters
 * leave in graphs (Shape -> Gather -> Unsqueeze -> Concat -> Reshape, Div
 * and Mul on channel counts, ConstantOfShape, Cast...) so that only
 * runtime ops remain. Works on small tensors (MDB_MAX_FOLD_ELEMENTS) and
 * never on the symbolic batch except to carry it along. */
#include "mdb_graph.h"
#include "mdb_graph_int.h"
#include "mdb_ops_int.h"

#include <sq.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define CANNOT MDB_FOLD_CANNOT

int64_t mdb_const_count(const mdb_tensor_t *t)
{
    size_t es = mdb_dtype_size(t->dtype);
    return es ? (int64_t)(t->nbytes / es) : 0;
}

int64_t mdb_const_int(const mdb_tensor_t *t, int64_t i)
{
    const uint8_t *p = t->data;
    switch (t->dtype) {
    case MDB_DT_INT64: {
        int64_t v;
        memcpy(&v, p + i * 8, 8);
        return v;
    }
    case MDB_DT_INT32: {
        int32_t v;
        memcpy(&v, p + i * 4, 4);
        return v;
    }
    case MDB_DT_FLOAT: {
        float v;
        memcpy(&v, p + i * 4, 4);
        return isfinite(v) && fabsf(v) < 9e18f ? (int64_t)v : 0;
    }
    case MDB_DT_INT8:
        return (int8_t)p[i];
    case MDB_DT_UINT8:
    case MDB_DT_BOOL:
        return p[i];
    default:
        return 0;
    }
}

static double const_f(const mdb_tensor_t *t, int64_t i)
{
    if (t->dtype == MDB_DT_FLOAT) {
        float v;
        memcpy(&v, (const uint8_t *)t->data + i * 4, 4);
        return v;
    }
    return (double)mdb_const_int(t, i);
}

static void store(mdb_dtype_t dt, void *data, int64_t i, double f, int64_t v)
{
    uint8_t *p = data;
    switch (dt) {
    case MDB_DT_FLOAT: {
        float x = (float)f;
        memcpy(p + i * 4, &x, 4);
        break;
    }
    case MDB_DT_INT64:
        memcpy(p + i * 8, &v, 8);
        break;
    case MDB_DT_INT32: {
        int32_t x = (int32_t)v;
        memcpy(p + i * 4, &x, 4);
        break;
    }
    case MDB_DT_INT8:
    case MDB_DT_UINT8:
        p[i] = (uint8_t)v;
        break;
    case MDB_DT_BOOL:
        p[i] = v != 0;
        break;
    default:
        break;
    }
}

static bool has_sym(const mdb_tensor_t *t)
{
    if (t->dtype != MDB_DT_INT64)
        return false;
    int64_t n = mdb_const_count(t);
    for (int64_t i = 0; i < n; i++)
        if (mdb_is_sym_batch(mdb_const_int(t, i)))
            return true;
    return false;
}

/* Allocates the output buffer of out (shape known, no batch). */
int mdb__fold_alloc_out(mdb_tensor_t *out, void **data, size_t *nbytes)
{
    if (!out->shape_known || mdb_shape_has_batch(&out->shape))
        return CANNOT;
    int64_t n = mdb_shape_numel(&out->shape, 1);
    size_t es = mdb_dtype_size(out->dtype);
    if (n < 0 || n > MDB_MAX_FOLD_ELEMENTS || es == 0)
        return CANNOT;
    *nbytes = (size_t)n * es;
    *data = calloc((size_t)n + 1, es);
    return *data ? 0 : SQ_NOMEM;
}

/* Row-major strides in elements for shape, with broadcasting of a rank-r
 * shape into out_rank (missing leading dims and size-1 dims stride 0). */
static void bcast_strides(const mdb_shape_t *s, int out_rank, int64_t *strides)
{
    int64_t acc = 1;
    for (int i = out_rank - 1; i >= 0; i--) {
        int si = i - (out_rank - s->rank);
        if (si < 0) {
            strides[i] = 0;
            continue;
        }
        strides[i] = s->dims[si] == 1 ? 0 : acc;
        acc *= s->dims[si];
    }
}

/* k N times c is (k c) N; k N over c is (k / c) N where c divides k (torch
 * computes attention's N * heads, and heads from C / head_dim, so). */
static int sym_arith(mdb_op_t op, int64_t x, int64_t y, int64_t *r)
{
    bool sx = mdb_is_sym_batch(x), sy = mdb_is_sym_batch(y);
    int64_t k, c = sx ? y : x;
    if (sx && sy)
        return CANNOT;
    k = mdb_sym_batch_k(sx ? x : y);
    if (c < 1 || c > MDB_MAX_DIM)
        return CANNOT;
    if (op == MDB_OP_MUL) {
        if (k > MDB_MAX_DIM / c)
            return CANNOT;
        *r = mdb_sym_batch(k * c);
        return 0;
    }
    if (op == MDB_OP_DIV && sx && k % c == 0) {
        *r = mdb_sym_batch(k / c);
        return 0;
    }
    return CANNOT;
}

static int binary(mdb_graph_t *g, mdb_node_t *node, mdb_tensor_t *out, void *data)
{
    const mdb_tensor_t *a = &g->tensors[node->inputs[0]], *b = &g->tensors[node->inputs[1]];
    bool sym = has_sym(a) || has_sym(b);
    if (sym && (out->dtype != MDB_DT_INT64 || (node->op != MDB_OP_MUL && node->op != MDB_OP_DIV)))
        return CANNOT;
    int rank = out->shape.rank;
    int64_t sa[MDB_MAX_RANK], sb[MDB_MAX_RANK], idx[MDB_MAX_RANK] = {0};
    bcast_strides(&a->shape, rank, sa);
    bcast_strides(&b->shape, rank, sb);
    int64_t n = mdb_shape_numel(&out->shape, 1);
    bool is_float = out->dtype == MDB_DT_FLOAT;
    int64_t ia = 0, ib = 0;
    for (int64_t i = 0; i < n; i++) {
        if (is_float) {
            double x = const_f(a, ia), y = const_f(b, ib), r = 0;
            switch (node->op) {
            case MDB_OP_ADD:
                r = x + y;
                break;
            case MDB_OP_SUB:
                r = x - y;
                break;
            case MDB_OP_MUL:
                r = (float)x * (float)y;
                break;
            case MDB_OP_MOD:
                r = fmodf((float)x, (float)y); /* floats: fmod=1 (ONNX) */
                break;
            default:
                r = (float)x / (float)y;
                break;
            }
            store(out->dtype, data, i, r, 0);
        } else {
            int64_t x = mdb_const_int(a, ia), y = mdb_const_int(b, ib), r = 0;
            bool ovf = false;
            if (sym && (mdb_is_sym_batch(x) || mdb_is_sym_batch(y))) {
                if (sym_arith(node->op, x, y, &r) != 0)
                    return CANNOT;
                store(out->dtype, data, i, (double)r, r);
                goto next;
            }
            switch (node->op) {
            case MDB_OP_ADD:
                ovf = __builtin_add_overflow(x, y, &r);
                break;
            case MDB_OP_SUB:
                ovf = __builtin_sub_overflow(x, y, &r);
                break;
            case MDB_OP_MUL:
                ovf = __builtin_mul_overflow(x, y, &r);
                break;
            case MDB_OP_MOD:
                if (y == 0 || (x == INT64_MIN && y == -1))
                    return CANNOT;
                r = x % y;
                /* fmod=0: the sign of the divisor (Python's %) */
                if (!mdb_node_int(node, "fmod", 0) && r != 0 && (r < 0) != (y < 0))
                    r += y;
                break;
            default:
                if (y == 0 || (x == INT64_MIN && y == -1))
                    return CANNOT;
                r = x / y; /* ONNX integer Div truncates, as C does */
                break;
            }
            if (ovf)
                return CANNOT;
            store(out->dtype, data, i, (double)r, r);
        }
    next:
        for (int d = rank - 1; d >= 0; d--) {
            ia += sa[d];
            ib += sb[d];
            if (++idx[d] < out->shape.dims[d])
                break;
            ia -= sa[d] * idx[d];
            ib -= sb[d] * idx[d];
            idx[d] = 0;
        }
    }
    return 0;
}

/* Range(start, limit, delta): its length is in its values, so it is
 * built here, before any shape rule (Swin's window index arithmetic). */
int mdb__fold_range(mdb_graph_t *g, mdb_node_t *node, char *err, size_t errlen)
{
    if (node->n_inputs != 3)
        return CANNOT;
    const mdb_tensor_t *t[3];
    for (int k = 0; k < 3; k++) {
        if (node->inputs[k] < 0)
            return CANNOT;
        t[k] = &g->tensors[node->inputs[k]];
        if (mdb_const_count(t[k]) != 1 || has_sym(t[k]))
            return CANNOT;
    }
    mdb_tensor_t *out = &g->tensors[node->outputs[0]];
    double start = const_f(t[0], 0), limit = const_f(t[1], 0), delta = const_f(t[2], 0);
    if (delta == 0 || !isfinite(start) || !isfinite(limit) || !isfinite(delta)) {
        mdb_errf(err, errlen, "Range '%s': bad start, limit or delta", node->name);
        return SQ_BAD_MODEL;
    }
    double count = ceil((limit - start) / delta);
    count = count < 0 ? 0 : count;
    if (count > MDB_MAX_FOLD_ELEMENTS)
        return CANNOT;
    out->dtype = t[0]->dtype;
    out->shape = (mdb_shape_t){.rank = 1, .dims = {(int64_t)count}};
    out->shape_known = true;
    void *data;
    size_t nbytes;
    int rc = mdb__fold_alloc_out(out, &data, &nbytes);
    if (rc)
        return rc;
    for (int64_t i = 0; i < (int64_t)count; i++) {
        if (out->dtype == MDB_DT_FLOAT)
            store(out->dtype, data, i, start + (double)i * delta, 0);
        else
            store(out->dtype, data, i, 0, mdb_const_int(t[0], 0) + i * mdb_const_int(t[2], 0));
    }
    mdb_graph_set_data(g, node->outputs[0], data, nbytes);
    return 0;
}

/* ScatterND(data, indices, updates), reduction none: data with the slices
 * that indices name replaced (Swin's attention mask, filled window by
 * window). */
static int scatter_nd(mdb_graph_t *g, mdb_node_t *node, mdb_tensor_t *out, void *data, char *err,
                      size_t errlen)
{
    if (node->n_inputs != 3 || node->inputs[1] < 0 || node->inputs[2] < 0)
        return CANNOT;
    const mdb_tensor_t *x = &g->tensors[node->inputs[0]], *ind = &g->tensors[node->inputs[1]];
    const mdb_tensor_t *upd = &g->tensors[node->inputs[2]];
    if (strcmp(mdb_node_string(node, "reduction", "none"), "none") != 0 || has_sym(ind) ||
        ind->dtype == MDB_DT_FLOAT || upd->dtype != x->dtype || ind->shape.rank < 1)
        return CANNOT;
    int k = (int)ind->shape.dims[ind->shape.rank - 1];
    if (k < 1 || k > x->shape.rank) {
        mdb_errf(err, errlen, "ScatterND '%s': indices of depth %d", node->name, k);
        return SQ_BAD_MODEL;
    }
    size_t es = mdb_dtype_size(x->dtype);
    int64_t slice = 1, n_ind = mdb_const_count(ind) / k;
    for (int d = k; d < x->shape.rank; d++)
        slice *= x->shape.dims[d];
    if (mdb_const_count(upd) != n_ind * slice) {
        mdb_errf(err, errlen, "ScatterND '%s': updates do not match the indices", node->name);
        return SQ_BAD_MODEL;
    }
    memcpy(data, x->data, x->nbytes);
    for (int64_t i = 0; i < n_ind; i++) {
        int64_t off = 0;
        for (int d = 0; d < k; d++) {
            int64_t dim = x->shape.dims[d], at = mdb_const_int(ind, i * k + d);
            at = at < 0 ? at + dim : at;
            if (at < 0 || at >= dim) {
                mdb_errf(err, errlen, "ScatterND '%s': index out of range", node->name);
                return SQ_BAD_MODEL;
            }
            off = off * dim + at;
        }
        memcpy((uint8_t *)data + (size_t)(off * slice) * es,
               (const uint8_t *)upd->data + (size_t)(i * slice) * es, (size_t)slice * es);
    }
    return 0;
}

/* Equal and Where, with broadcasting: what torch exports for expand(-1)
 * (Where(Equal(shape, -1), 1, shape)). The symbolic batch equals itself and
 * never a size below 1; anything else about it is unknown. */
static int select_(mdb_graph_t *g, mdb_node_t *node, mdb_tensor_t *out, void *data)
{
    int n_in = node->op == MDB_OP_WHERE ? 3 : 2;
    if (node->n_inputs != n_in)
        return CANNOT;
    const mdb_tensor_t *t[3];
    int rank = out->shape.rank;
    int64_t st[3][MDB_MAX_RANK], off[3] = {0}, idx[MDB_MAX_RANK] = {0};
    for (int k = 0; k < n_in; k++) {
        if (node->inputs[k] < 0)
            return CANNOT;
        t[k] = &g->tensors[node->inputs[k]];
        bcast_strides(&t[k]->shape, rank, st[k]);
    }
    if (node->op == MDB_OP_WHERE &&
        (t[1]->dtype != out->dtype || t[2]->dtype != out->dtype || has_sym(t[0])))
        return CANNOT;
    size_t es = mdb_dtype_size(out->dtype);
    int64_t n = mdb_shape_numel(&out->shape, 1);
    for (int64_t i = 0; i < n; i++) {
        if (node->op == MDB_OP_WHERE) {
            const mdb_tensor_t *pick = mdb_const_int(t[0], off[0]) ? t[1] : t[2];
            int64_t at = off[pick == t[1] ? 1 : 2];
            memcpy((uint8_t *)data + (size_t)i * es, (const uint8_t *)pick->data + (size_t)at * es,
                   es);
        } else if (t[0]->dtype == MDB_DT_FLOAT || t[1]->dtype == MDB_DT_FLOAT) {
            store(MDB_DT_BOOL, data, i, 0, const_f(t[0], off[0]) == const_f(t[1], off[1]));
        } else {
            int64_t a = mdb_const_int(t[0], off[0]), b = mdb_const_int(t[1], off[1]);
            bool sa = t[0]->dtype == MDB_DT_INT64 && mdb_is_sym_batch(a);
            bool sb = t[1]->dtype == MDB_DT_INT64 && mdb_is_sym_batch(b);
            if (sa != sb && (sa ? b : a) >= 1)
                return CANNOT;
            store(MDB_DT_BOOL, data, i, 0, a == b);
        }
        for (int d = rank - 1; d >= 0; d--) {
            for (int k = 0; k < n_in; k++)
                off[k] += st[k][d];
            if (++idx[d] < out->shape.dims[d])
                break;
            for (int k = 0; k < n_in; k++)
                off[k] -= st[k][d] * idx[d];
            idx[d] = 0;
        }
    }
    return 0;
}

/* Copies elements of in (element size es) into out in out's row-major
 * order, reading in at offset base + sum(idx[d] * in_strides[d]). Shared by
 * Transpose, Slice, Gather and Concat. */
static void gather_copy(const uint8_t *in, int64_t base, const int64_t *in_strides,
                        const mdb_shape_t *out_shape, size_t es, uint8_t *out)
{
    int rank = out_shape->rank;
    int64_t idx[MDB_MAX_RANK] = {0};
    int64_t n = mdb_shape_numel(out_shape, 1);
    int64_t off = base;
    for (int64_t i = 0; i < n; i++) {
        memcpy(out + (size_t)i * es, in + (size_t)off * es, es);
        for (int d = rank - 1; d >= 0; d--) {
            off += in_strides[d];
            if (++idx[d] < out_shape->dims[d])
                break;
            off -= in_strides[d] * idx[d];
            idx[d] = 0;
        }
    }
}

void mdb__fold_row_strides(const mdb_shape_t *s, int64_t *strides)
{
    int64_t acc = 1;
    for (int i = s->rank - 1; i >= 0; i--) {
        strides[i] = acc;
        acc *= s->dims[i];
    }
}

static int cast(const mdb_tensor_t *in, mdb_tensor_t *out, void *data)
{
    int64_t n = mdb_const_count(in);
    if (has_sym(in) && out->dtype != MDB_DT_INT64)
        return CANNOT;
    for (int64_t i = 0; i < n; i++) {
        if (in->dtype == MDB_DT_FLOAT) {
            double f = const_f(in, i);
            if (out->dtype != MDB_DT_FLOAT && !(fabs(f) < 9e18))
                return CANNOT;
            store(out->dtype, data, i, f, (int64_t)f);
        } else {
            int64_t v = mdb_const_int(in, i);
            store(out->dtype, data, i, (double)v, v);
        }
    }
    return 0;
}

/* Constant and ConstantOfShape build their output from attributes. */
int mdb__fold_source(mdb_graph_t *g, mdb_node_t *node, char *err, size_t errlen)
{
    const mdb_attr_t *va = mdb_node_attr(node, "value");
    int src = va && va->type == MDB_ATTR_TENSOR ? va->tensor : -1;
    mdb_tensor_t *out = &g->tensors[node->outputs[0]];
    if (node->op == MDB_OP_CONSTANT) {
        if (src < 0 || !g->tensors[src].data) {
            mdb_errf(err, errlen, "Constant '%s' has no tensor value", node->name);
            return SQ_UNSUPPORTED_MODEL;
        }
        const mdb_tensor_t *s = &g->tensors[src];
        void *copy = malloc(s->nbytes + 1);
        if (!copy)
            return SQ_NOMEM;
        memcpy(copy, s->data, s->nbytes);
        out->dtype = s->dtype;
        out->shape = s->shape;
        out->shape_known = true;
        mdb_graph_set_data(g, node->outputs[0], copy, s->nbytes);
        return 0;
    }
    /* ConstantOfShape */
    const mdb_tensor_t *shape_t = &g->tensors[node->inputs[0]];
    int64_t rank = mdb_const_count(shape_t);
    if (shape_t->shape.rank != 1 || rank > MDB_MAX_RANK || has_sym(shape_t))
        return CANNOT;
    mdb_shape_t shape = {.rank = (int)rank};
    for (int i = 0; i < rank; i++) {
        shape.dims[i] = mdb_const_int(shape_t, i);
        if (shape.dims[i] < 0 || shape.dims[i] > MDB_MAX_DIM) {
            mdb_errf(err, errlen, "ConstantOfShape '%s': bad dimension", node->name);
            return SQ_BAD_MODEL;
        }
    }
    mdb_dtype_t dt = MDB_DT_FLOAT;
    const mdb_tensor_t *v = NULL;
    if (src >= 0) {
        v = &g->tensors[src];
        if (mdb_const_count(v) != 1) {
            mdb_errf(err, errlen, "ConstantOfShape '%s': value must have one element", node->name);
            return SQ_BAD_MODEL;
        }
        dt = v->dtype;
    }
    out->dtype = dt;
    out->shape = shape;
    out->shape_known = true;
    void *data;
    size_t nbytes;
    int rc = mdb__fold_alloc_out(out, &data, &nbytes);
    if (rc)
        return rc;
    size_t es = mdb_dtype_size(dt);
    for (size_t i = 0; v && i < nbytes / es; i++)
        memcpy((uint8_t *)data + i * es, v->data, es);
    mdb_graph_set_data(g, node->outputs[0], data, nbytes);
    return 0;
}

int mdb__fold_shape(mdb_fold_ctx_t *f)
{
    int rank = f->in->shape.rank;
    int64_t s = mdb_node_int(f->node, "start", 0);
    s = s < 0 ? s + rank : s;
    int64_t start = s < 0 ? 0 : s > rank ? rank : s;
    for (int64_t i = 0; i < f->out->shape.dims[0]; i++) {
        int64_t d = f->in->shape.dims[start + i];
        store(MDB_DT_INT64, f->data, i, 0, d < 0 ? mdb_sym_batch(-d) : d);
    }
    return 0;
}

/* Identity, Dropout, Unsqueeze, Squeeze, Reshape, Flatten: the same bytes. */
int mdb__fold_copy(mdb_fold_ctx_t *f)
{
    if (f->in->nbytes != f->nbytes)
        return CANNOT;
    memcpy(f->data, f->in->data, f->nbytes);
    return 0;
}

int mdb__fold_cast(mdb_fold_ctx_t *f)
{
    return cast(f->in, f->out, f->data);
}

int mdb__fold_binary(mdb_fold_ctx_t *f)
{
    if (f->node->n_inputs != 2 || f->node->inputs[1] < 0)
        return CANNOT;
    return binary(f->g, f->node, f->out, f->data);
}

int mdb__fold_select(mdb_fold_ctx_t *f)
{
    return select_(f->g, f->node, f->out, f->data);
}

int mdb__fold_not(mdb_fold_ctx_t *f)
{
    for (int64_t i = 0; i < (int64_t)f->nbytes; i++)
        ((uint8_t *)f->data)[i] = !((const uint8_t *)f->in->data)[i];
    return 0;
}

int mdb__fold_scatter_nd(mdb_fold_ctx_t *f)
{
    return scatter_nd(f->g, f->node, f->out, f->data, f->err, f->errlen);
}

int mdb__fold_expand(mdb_fold_ctx_t *f)
{
    int64_t st[MDB_MAX_RANK];
    bcast_strides(&f->in->shape, f->out->shape.rank, st);
    gather_copy(f->in->data, 0, st, &f->out->shape, f->es, f->data);
    return 0;
}

int mdb__fold_transpose(mdb_fold_ctx_t *f)
{
    size_t np;
    const int64_t *perm = mdb_node_ints(f->node, "perm", &np);
    int64_t st[MDB_MAX_RANK];
    for (int i = 0; i < f->out->shape.rank; i++)
        st[i] = f->in_strides[perm ? perm[i] : f->out->shape.rank - 1 - i];
    gather_copy(f->in->data, 0, st, &f->out->shape, f->es, f->data);
    return 0;
}

int mdb__fold_slice(mdb_fold_ctx_t *f)
{
    size_t n;
    const int64_t *axes = mdb_node_ints(f->node, "axes", &n);
    const int64_t *starts = mdb_node_ints(f->node, "starts", &n);
    const int64_t *steps = mdb_node_ints(f->node, "steps", &n);
    int64_t st[MDB_MAX_RANK], base = 0;
    memcpy(st, f->in_strides, sizeof(st));
    for (size_t i = 0; axes && starts && steps && i < n; i++) {
        base += starts[i] * f->in_strides[axes[i]];
        st[axes[i]] = f->in_strides[axes[i]] * steps[i];
    }
    if (mdb_shape_numel(&f->out->shape, 1) > 0)
        gather_copy(f->in->data, base, st, &f->out->shape, f->es, f->data);
    return 0;
}

int mdb__fold_gather(mdb_fold_ctx_t *f)
{
    const mdb_tensor_t *in = f->in, *ind = &f->g->tensors[f->node->inputs[1]];
    int rank = in->shape.rank;
    int64_t axis = mdb_node_int(f->node, "axis", 0);
    axis = axis < 0 ? axis + rank : axis;
    int64_t dim = in->shape.dims[axis];
    int64_t outer = 1, inner = 1, n_ind = mdb_const_count(ind);
    for (int i = 0; i < axis; i++)
        outer *= in->shape.dims[i];
    for (int i = (int)axis + 1; i < rank; i++)
        inner *= in->shape.dims[i];
    if (ind->dtype == MDB_DT_FLOAT || has_sym(ind))
        return CANNOT;
    uint8_t *o = f->data;
    for (int64_t a = 0; a < outer; a++)
        for (int64_t j = 0; j < n_ind; j++) {
            int64_t k = mdb_const_int(ind, j);
            k = k < 0 ? k + dim : k;
            if (k < 0 || k >= dim) {
                mdb_errf(f->err, f->errlen, "Gather '%s': index out of range", f->node->name);
                return SQ_BAD_MODEL;
            }
            memcpy(o, (const uint8_t *)in->data + ((a * dim + k) * inner) * (int64_t)f->es,
                   (size_t)inner * f->es);
            o += (size_t)inner * f->es;
        }
    return 0;
}

int mdb__fold_concat(mdb_fold_ctx_t *f)
{
    int rank = f->out->shape.rank;
    int64_t axis = mdb_node_int(f->node, "axis", 0);
    axis = axis < 0 ? axis + rank : axis;
    int64_t outer = 1, inner = 1;
    for (int i = 0; i < axis; i++)
        outer *= f->out->shape.dims[i];
    for (int i = (int)axis + 1; i < rank; i++)
        inner *= f->out->shape.dims[i];
    uint8_t *o = f->data;
    for (int64_t a = 0; a < outer; a++)
        for (int k = 0; k < f->node->n_inputs; k++) {
            const mdb_tensor_t *t = &f->g->tensors[f->node->inputs[k]];
            if (t->dtype != f->out->dtype)
                return CANNOT;
            size_t chunk = (size_t)(t->shape.dims[axis] * inner) * f->es;
            memcpy(o, (const uint8_t *)t->data + (size_t)a * chunk, chunk);
            o += chunk;
        }
    return 0;
}
