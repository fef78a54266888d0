/* What canon.c and canon_spatial.c share: the canonical-form context's
 * helpers (an input, constant ints and floats read from it, attributes
 * filled). Private to modeldb's canonical forms. */
#ifndef MDB_CANON_INT_H
#define MDB_CANON_INT_H

#include "mdb_graph.h"
#include "mdb_graph_int.h"
#include "mdb_ops_int.h"

#include <sq.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef mdb_op_ctx_t lctx_t;

#define FAIL(code, ...)                                                                            \
    do {                                                                                           \
        mdb_errf(c->err, c->errlen, __VA_ARGS__);                                                  \
        return (code);                                                                             \
    } while (0)

static inline const mdb_tensor_t *input(lctx_t *c, int k)
{
    if (k >= c->node->n_inputs || c->node->inputs[k] < 0)
        return NULL;
    return &c->g->tensors[c->node->inputs[k]];
}

/* Reads optional constant input k as an int list; returns 1 when absent,
 * 0 when read, or an error when present but not constant. */
static inline int const_ints(lctx_t *c, int k, int64_t *vals, size_t cap, size_t *n)
{
    const mdb_tensor_t *t = input(c, k);
    if (!t)
        return 1;
    if (!t->data || t->dtype == MDB_DT_FLOAT)
        FAIL(SQ_UNSUPPORTED_MODEL, "%s '%s': input %d must be a constant integer tensor",
             mdb_op_name(c->node->op), c->node->name, k);
    int64_t count = mdb_const_count(t);
    if (count < 0 || (size_t)count > cap)
        FAIL(SQ_BAD_MODEL, "%s '%s': input %d has too many values", mdb_op_name(c->node->op),
             c->node->name, k);
    for (int64_t i = 0; i < count; i++)
        vals[i] = mdb_const_int(t, i);
    *n = (size_t)count;
    return 0;
}

static inline int const_float(lctx_t *c, int k, float *out)
{
    const mdb_tensor_t *t = input(c, k);
    if (!t)
        return 1;
    if (!t->data || mdb_const_count(t) != 1)
        FAIL(SQ_UNSUPPORTED_MODEL, "%s '%s': input %d must be a constant scalar",
             mdb_op_name(c->node->op), c->node->name, k);
    if (t->dtype == MDB_DT_FLOAT)
        memcpy(out, t->data, 4);
    else
        *out = (float)mdb_const_int(t, 0);
    return 0;
}

static inline void keep_inputs(mdb_node_t *n, int count)
{
    if (n->n_inputs > count)
        n->n_inputs = count;
}

static inline int rank0(lctx_t *c)
{
    const mdb_tensor_t *x = input(c, 0);
    return x ? x->shape.rank : 0;
}

static inline void fill_ints(mdb_node_t *n, const char *name, size_t count, int64_t v)
{
    size_t have;
    if (mdb_node_ints(n, name, &have))
        return;
    int64_t vals[MDB_MAX_RANK * 2];
    for (size_t i = 0; i < count && i < MDB_MAX_RANK * 2; i++)
        vals[i] = v;
    mdb_node_set_ints(n, name, vals, count);
}

static inline int norm_axis_attr(lctx_t *c, const char *name, int64_t def, int rank)
{
    int64_t a = mdb_node_int(c->node, name, def);
    if (a < -rank || a >= rank)
        FAIL(SQ_BAD_MODEL, "%s '%s': %s %lld out of range for rank %d", mdb_op_name(c->node->op),
             c->node->name, name, (long long)a, rank);
    mdb_node_set_int(c->node, name, a < 0 ? a + rank : a);
    return 0;
}

#endif
