/* Op fusion at import: torch (1.13, opset 13) exports LayerNorm and GELU as
 * chains of elementwise ops, which the worker would run one by one, the
 * LayerNorm's subtraction and division broadcasting over the innermost
 * axis (oneDNN runs that broadcast with its slow reference binary: 3 s of
 * ConvNeXt-T's 3.5 s). Each chain becomes one canonical node that oneDNN
 * runs as one primitive:
 *
 *   LayerNorm  m = ReduceMean(x, [r-1]); d = x - m; v = ReduceMean(d^2, [r-1]);
 *              y = d / Sqrt(v + eps) [* gamma + beta]
 *              -> LayerNormalization(x[, gamma, beta]); axis r-1, epsilon
 *   GELU       y = x * (Erf(x / sqrt 2) + 1) * 0.5
 *              -> Gelu(x)
 *
 * The rewritten node is the chain's last one (it keeps its output); the
 * nodes before it are left for mdb_graph_compact to drop when nothing else
 * reads them. Only dataflow is matched, so an intermediate read elsewhere
 * stays computed and correct. */
#include "mdb_graph.h"
#include "mdb_graph_int.h"

#include <sq.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    mdb_graph_t *g;
    int *producer; /* tensor -> node, -1 */
    int *readers;  /* tensor -> how many node inputs read it (+1 for a graph output) */
} fctx_t;

/* The node writing tensor t when it is op, else NULL. */
static mdb_node_t *made_by(fctx_t *f, int t, mdb_op_t op)
{
    if (t < 0 || f->producer[t] < 0)
        return NULL;
    mdb_node_t *n = &f->g->nodes[f->producer[t]];
    return n->op == op ? n : NULL;
}

/* Whether t is a float constant holding one value (v set). */
static bool scalar(const mdb_graph_t *g, int t, float *v)
{
    if (t < 0)
        return false;
    const mdb_tensor_t *c = &g->tensors[t];
    if (c->data == NULL || c->dtype != MDB_DT_FLOAT || mdb_const_count(c) != 1)
        return false;
    memcpy(v, c->data, sizeof(float));
    return true;
}

/* For a two-input node, the input that is not the scalar constant, with
 * the constant's value in *v; -1 when neither is. */
static int other_than_scalar(const mdb_graph_t *g, const mdb_node_t *n, float *v)
{
    if (n->n_inputs != 2)
        return -1;
    if (scalar(g, n->inputs[1], v))
        return n->inputs[0];
    if (scalar(g, n->inputs[0], v))
        return n->inputs[1];
    return -1;
}

/* ReduceMean over the last axis only, keeping it. */
static bool mean_of_last(const mdb_graph_t *g, const mdb_node_t *n)
{
    size_t count = 0;
    const int64_t *axes = mdb_node_ints(n, "axes", &count);
    int rank = g->tensors[n->inputs[0]].shape.rank;
    return n->n_inputs == 1 && axes != NULL && count == 1 && axes[0] == rank - 1 &&
           mdb_node_int(n, "keepdims", 1) == 1;
}

/* A float constant of shape [C] (or [1, ..., C]), C the last dim of x. */
static bool per_channel(const mdb_graph_t *g, int t, const mdb_tensor_t *x)
{
    if (t < 0 || g->tensors[t].data == NULL || g->tensors[t].dtype != MDB_DT_FLOAT)
        return false;
    const mdb_shape_t *s = &g->tensors[t].shape;
    if (s->rank < 1 || s->rank > x->shape.rank ||
        s->dims[s->rank - 1] != x->shape.dims[x->shape.rank - 1])
        return false;
    for (int i = 0; i < s->rank - 1; i++)
        if (s->dims[i] != 1)
            return false;
    return true;
}

/* The one node reading tensor t (as input k of it), or NULL. */
static mdb_node_t *sole_reader(fctx_t *f, int t, mdb_op_t op, int *k)
{
    if (f->readers[t] != 1)
        return NULL;
    for (int i = 0; i < f->g->n_nodes; i++) {
        mdb_node_t *n = &f->g->nodes[i];
        for (int j = 0; j < n->n_inputs; j++)
            if (n->inputs[j] == t) {
                *k = j;
                return n->op == op ? n : NULL;
            }
    }
    return NULL;
}

static void become(mdb_node_t *n, mdb_op_t op, const int *inputs, int n_inputs)
{
    n->op = op;
    n->inputs = sq_xrealloc(n->inputs, (size_t)(n_inputs + 1) * sizeof(int));
    memcpy(n->inputs, inputs, (size_t)n_inputs * sizeof(int));
    n->n_inputs = n_inputs;
    while (n->n_attrs > 0)
        mdb_node_del_attr(n, n->attrs[0].name);
}

/* div is d / s; rewrites the LayerNorm that ends there (or at its affine
 * Mul and Add). */
static bool fuse_layer_norm(fctx_t *f, mdb_node_t *div)
{
    mdb_graph_t *g = f->g;
    if (div->n_inputs != 2)
        return false;
    mdb_node_t *sub = made_by(f, div->inputs[0], MDB_OP_SUB);
    mdb_node_t *sq = made_by(f, div->inputs[1], MDB_OP_SQRT);
    if (sub == NULL || sq == NULL || sub->n_inputs != 2)
        return false;
    int x = sub->inputs[0];
    mdb_node_t *mean = made_by(f, sub->inputs[1], MDB_OP_REDUCE_MEAN);
    if (mean == NULL || mean->inputs[0] != x || !mean_of_last(g, mean))
        return false;
    float eps = 0.0f;
    mdb_node_t *add = made_by(f, sq->inputs[0], MDB_OP_ADD);
    int v = add != NULL ? other_than_scalar(g, add, &eps) : -1;
    mdb_node_t *var = made_by(f, v, MDB_OP_REDUCE_MEAN);
    if (var == NULL || !mean_of_last(g, var))
        return false;
    mdb_node_t *pw = made_by(f, var->inputs[0], MDB_OP_POW);
    if (pw == NULL || pw->inputs[0] != div->inputs[0] || mdb_node_float(pw, "exponent", 0) != 2.0f)
        return false;
    const mdb_tensor_t *xt = &g->tensors[x];
    if (xt->dtype != MDB_DT_FLOAT || !(eps >= 0.0f) ||
        !mdb_shape_eq(&xt->shape, &g->tensors[div->outputs[0]].shape))
        return false;
    /* The affine part: y * gamma + beta, each read only there. */
    mdb_node_t *last = div;
    int ins[3] = {x, -1, -1}, n_ins = 1;
    int k = 0;
    mdb_node_t *mul = sole_reader(f, div->outputs[0], MDB_OP_MUL, &k);
    if (mul != NULL && mul->n_inputs == 2 && per_channel(g, mul->inputs[1 - k], xt)) {
        int kb = 0;
        mdb_node_t *bias = sole_reader(f, mul->outputs[0], MDB_OP_ADD, &kb);
        if (bias != NULL && bias->n_inputs == 2 && per_channel(g, bias->inputs[1 - kb], xt)) {
            ins[1] = mul->inputs[1 - k];
            ins[2] = bias->inputs[1 - kb];
            n_ins = 3;
            last = bias;
        }
    }
    become(last, MDB_OP_LAYER_NORM, ins, n_ins);
    mdb_node_set_int(last, "axis", xt->shape.rank - 1);
    mdb_node_set_float(last, "epsilon", eps);
    return true;
}

/* e is Erf(x / sqrt 2); rewrites the GELU x * (e + 1) * 0.5 around it. */
static bool fuse_gelu(fctx_t *f, mdb_node_t *erf)
{
    mdb_graph_t *g = f->g;
    float c = 0.0f;
    mdb_node_t *div = made_by(f, erf->inputs[0], MDB_OP_DIV);
    if (div == NULL || div->n_inputs != 2 || !scalar(g, div->inputs[1], &c) ||
        fabsf(c - (float)M_SQRT2) > 1e-6f)
        return false;
    int x = div->inputs[0], k = 0;
    mdb_node_t *plus = sole_reader(f, erf->outputs[0], MDB_OP_ADD, &k);
    if (plus == NULL || other_than_scalar(g, plus, &c) != erf->outputs[0] || c != 1.0f)
        return false;
    mdb_node_t *times = sole_reader(f, plus->outputs[0], MDB_OP_MUL, &k);
    if (times == NULL || times->n_inputs != 2 || times->inputs[1 - k] != x)
        return false;
    mdb_node_t *half = sole_reader(f, times->outputs[0], MDB_OP_MUL, &k);
    if (half == NULL || other_than_scalar(g, half, &c) != times->outputs[0] || c != 0.5f)
        return false;
    if (!mdb_shape_eq(&g->tensors[x].shape, &g->tensors[half->outputs[0]].shape))
        return false;
    become(half, MDB_OP_GELU, &x, 1);
    return true;
}

int mdb_graph_fuse(mdb_graph_t *g)
{
    fctx_t f = {.g = g};
    f.producer = sq_xmalloc((size_t)(g->n_tensors + 1) * sizeof(int));
    f.readers = sq_xcalloc((size_t)g->n_tensors + 1, sizeof(int));
    int fused = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (int t = 0; t < g->n_tensors; t++)
            f.producer[t] = -1;
        memset(f.readers, 0, (size_t)g->n_tensors * sizeof(int));
        for (int i = 0; i < g->n_nodes; i++) {
            const mdb_node_t *n = &g->nodes[i];
            for (int k = 0; k < n->n_outputs; k++)
                if (n->outputs[k] >= 0)
                    f.producer[n->outputs[k]] = i;
            for (int k = 0; k < n->n_inputs; k++)
                if (n->inputs[k] >= 0)
                    f.readers[n->inputs[k]]++;
        }
        for (int i = 0; i < g->n_outputs; i++)
            f.readers[g->outputs[i]]++;
        /* GELUs first (pass 0), so that LayerNorm matching sees their
         * readers as they are; a rewrite changes only the last node's
         * inputs, and counts are rebuilt before the next pass. */
        for (int i = 0; i < g->n_nodes; i++) {
            mdb_node_t *n = &g->nodes[i];
            if (pass == 0 && n->op == MDB_OP_ERF && n->n_inputs == 1)
                fused += fuse_gelu(&f, n);
            else if (pass == 1 && n->op == MDB_OP_DIV)
                fused += fuse_layer_norm(&f, n);
        }
    }
    free(f.producer);
    free(f.readers);
    if (fused > 0)
        mdb_graph_compact(g);
    return fused;
}
