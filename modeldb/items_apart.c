/* Whether the items of a batch stay apart in a graph whose batch is not the
 * outermost dimension everywhere (mdb_graph_batch_outermost is false): the
 * worker plans such a graph per batch size with the batch bound, where the
 * batching rules of runnable.c do not apply, so that nothing else would
 * stop an op from mixing one request's data with another's.
 *
 * Each batched tensor holds the batch in one dimension d of size a * N * c,
 * item i of it at the indices whose (index / c) % N is i: c is 1 for N
 * alone or the batch innermost ([tokens * N, C] after torch's MHA folds
 * [tokens, N, C]), k for the batch outermost ([N * heads, tokens, d]). A
 * reshape keeps the items apart when the same c comes out of the row-major
 * strides on both sides; the other ops keep the batch's dimension as it is
 * and must not compute along it (reduce, normalize, contract, concatenate,
 * slide over it), and two batched operands must agree on c. */
#include "mdb_graph.h"
#include "mdb_graph_int.h"

#include <sq.h>

#include <stdio.h>
#include <stdlib.h>

/* The batch's dimension of shape, or -1. */
static int batch_dim(const mdb_shape_t *s)
{
    for (int d = 0; d < s->rank; d++)
        if (s->dims[d] < 0)
            return d;
    return -1;
}

/* Elements after dim d, per unit of the batch (the batch's own dim excluded). */
static int64_t inner_elems(const mdb_shape_t *s, int d)
{
    int64_t n = 1;
    for (int i = d + 1; i < s->rank; i++)
        n *= s->dims[i] < 0 ? -s->dims[i] : s->dims[i];
    return n;
}

/* Why node n would mix items (its batched input x has the batch in dim d),
 * or NULL. */
static const char *mixes(const mdb_graph_t *g, const mdb_node_t *n, int k, int d)
{
    const mdb_tensor_t *x = &g->tensors[n->inputs[k]];
    int rank = x->shape.rank;
    size_t count = 0;
    switch (n->op) {
    case MDB_OP_SOFTMAX:
        return mdb_node_int(n, "axis", rank - 1) == d ? "a softmax over the batch" : NULL;
    case MDB_OP_LAYER_NORM:
        return mdb_node_int(n, "axis", rank - 1) <= d ? "a normalization over the batch" : NULL;
    case MDB_OP_CONCAT:
    case MDB_OP_SPLIT:
    case MDB_OP_GATHER:
        return mdb_node_int(n, "axis", 0) == d ? "an op along the batch" : NULL;
    case MDB_OP_REDUCE_MEAN: {
        const int64_t *axes = mdb_node_ints(n, "axes", &count);
        for (size_t i = 0; i < count; i++)
            if (axes[i] == d)
                return "a reduction over the batch";
        return count == 0 ? "a reduction over the batch" : NULL;
    }
    case MDB_OP_MATMUL:
    case MDB_OP_EINSUM: {
        /* not the contracted dimension (A's last, B's second to last) */
        bool trans_b = n->op == MDB_OP_EINSUM && mdb_node_int(n, "transB", 0);
        int contracted = k == 0 || trans_b ? rank - 1 : rank - 2;
        return d == contracted ? "a product along the batch" : NULL;
    }
    case MDB_OP_GEMM:
        if (k == 1 || (k == 0 && d != (mdb_node_int(n, "transA", 0) ? 1 : 0)))
            return "a product along the batch";
        return NULL;
    case MDB_OP_CONV:
    case MDB_OP_CONV_TRANSPOSE:
    case MDB_OP_MAX_POOL:
    case MDB_OP_AVERAGE_POOL:
    case MDB_OP_GLOBAL_AVERAGE_POOL:
    case MDB_OP_BATCH_NORM:
    case MDB_OP_RESIZE:
        return d != 0 ? "the batch in a channel or spatial dimension" : NULL;
    default:
        return NULL;
    }
}

int mdb_graph_items_apart(const mdb_graph_t *g, int *bad_node, char *err, size_t errlen)
{
    int rc = 0;
    if (bad_node != NULL)
        *bad_node = -1;
    int64_t *inner = sq_xcalloc((size_t)g->n_tensors + 1, sizeof(*inner));
    for (int i = 0; i < g->n_inputs; i++) {
        const mdb_shape_t *s = &g->tensors[g->inputs[i]].shape;
        int d = batch_dim(s);
        if (d > 0 || (d == 0 && s->dims[0] != MDB_DIM_BATCH)) {
            mdb_errf(err, errlen, "input '%s' has the batch in dim %d",
                     g->tensors[g->inputs[i]].name, d);
            rc = SQ_UNSUPPORTED_MODEL;
            goto out;
        }
        inner[g->inputs[i]] = 1;
    }
    for (int i = 0; i < g->n_nodes; i++) {
        const mdb_node_t *n = &g->nodes[i];
        const char *why = NULL;
        int64_t c = 0;
        int from = -1;
        for (int k = 0; k < n->n_inputs && why == NULL; k++) {
            int t = n->inputs[k];
            if (t < 0 || !g->tensors[t].shape_known)
                continue;
            int d = batch_dim(&g->tensors[t].shape);
            if (d < 0)
                continue;
            if (g->tensors[t].data != NULL) {
                why = "a constant with the batch";
                break;
            }
            if (c != 0 && inner[t] != c)
                why = "operands that hold the batch's items in different places";
            c = inner[t];
            from = t;
            if (why == NULL)
                why = mixes(g, n, k, d);
        }
        for (int k = 0; k < n->n_outputs && why == NULL; k++) {
            int t = n->outputs[k];
            if (t < 0)
                continue;
            const mdb_shape_t *s = &g->tensors[t].shape;
            int d = batch_dim(s);
            if (d < 0) {
                if (from >= 0 && n->op != MDB_OP_SHAPE)
                    why = "drops the batch";
                continue;
            }
            if (from < 0) {
                inner[t] = 1; /* a constant expanded over the batch: the same for every item */
                continue;
            }
            if (n->op == MDB_OP_RESHAPE || n->op == MDB_OP_FLATTEN) {
                /* items in the input are blocks of stride_in = c * inner elements */
                const mdb_shape_t *xs = &g->tensors[from].shape;
                int64_t stride = c * inner_elems(xs, batch_dim(xs));
                int64_t after = inner_elems(s, d);
                if (after == 0 || stride % after != 0 || (-s->dims[d]) % (stride / after) != 0)
                    why = "merges the batch's items with each other";
                else
                    inner[t] = stride / after;
            } else {
                inner[t] = c;
            }
        }
        if (why != NULL) {
            mdb_errf(err, errlen, "%s node '%s': %s", mdb_op_name(n->op), n->name ? n->name : "",
                     why);
            if (bad_node != NULL)
                *bad_node = i;
            rc = SQ_UNSUPPORTED_MODEL;
            goto out;
        }
    }
    for (int i = 0; i < g->n_outputs; i++) {
        int t = g->outputs[i];
        const mdb_shape_t *s = &g->tensors[t].shape;
        int d = batch_dim(s);
        if (d > 0 || (d == 0 && (s->dims[0] != MDB_DIM_BATCH || inner[t] != 1))) {
            /* named after the node that writes it, as the lowering would */
            int p = g->tensors[t].producer;
            char where[200] = "";
            if (p >= 0)
                snprintf(where, sizeof(where), "%s node '%s': ", mdb_op_name(g->nodes[p].op),
                         g->nodes[p].name ? g->nodes[p].name : "");
            if (d > 0)
                mdb_errf(err, errlen, "%soutput '%s' has the batch in dim %d", where,
                         g->tensors[t].name, d);
            else
                mdb_errf(err, errlen, "%soutput '%s' holds the batch merged with another dimension",
                         where, g->tensors[t].name);
            if (bad_node != NULL)
                *bad_node = p;
            rc = SQ_UNSUPPORTED_MODEL;
            goto out;
        }
    }
out:
    free(inner);
    return rc;
}
