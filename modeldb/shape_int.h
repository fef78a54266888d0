/* What shape.c and shape_move.c share: the inference context's helpers
 * (an input tensor, an output's shape set, dimension arithmetic with the
 * symbolic batch, axes). Private to modeldb's shape inference. */
#ifndef MDB_SHAPE_INT_H
#define MDB_SHAPE_INT_H

#include "mdb_graph.h"
#include "mdb_graph_int.h"
#include "mdb_ops_int.h"

#include <sq.h>

#include <stdio.h>
#include <string.h>

#define B MDB_DIM_BATCH

typedef mdb_op_ctx_t ictx_t;

#define FAIL(code, ...)                                                                            \
    do {                                                                                           \
        mdb_errf(c->err, c->errlen, __VA_ARGS__);                                                  \
        return (code);                                                                             \
    } while (0)

static inline const mdb_tensor_t *in_t(ictx_t *c, int k)
{
    if (k >= c->node->n_inputs || c->node->inputs[k] < 0)
        return NULL;
    return &c->g->tensors[c->node->inputs[k]];
}

static inline void set_out(ictx_t *c, int k, mdb_dtype_t dt, const mdb_shape_t *s)
{
    if (k >= c->node->n_outputs || c->node->outputs[k] < 0)
        return;
    mdb_tensor_t *t = &c->g->tensors[c->node->outputs[k]];
    t->dtype = dt;
    t->shape = *s;
    t->shape_known = true;
}

/* a * b for dims; k N times j is (k j) N (-k j); N times N is not expressible. */
static inline int dim_mul(ictx_t *c, int64_t a, int64_t b, int64_t *out)
{
    if (a < 0 || b < 0) {
        int64_t k = a < 0 ? -a : -b, other = a < 0 ? b : a;
        if (other < 0)
            FAIL(SQ_UNSUPPORTED_MODEL, "%s '%s' multiplies the batch by itself",
                 mdb_op_name(c->node->op), c->node->name);
        if (other > MDB_MAX_DIM / k)
            FAIL(SQ_BAD_MODEL, "%s '%s': dimension overflow", mdb_op_name(c->node->op),
                 c->node->name);
        *out = other == 0 ? 0 : -(k * other);
        return 0;
    }
    if (a != 0 && b > MDB_MAX_ELEMENTS / a)
        FAIL(SQ_BAD_MODEL, "%s '%s': dimension overflow", mdb_op_name(c->node->op), c->node->name);
    *out = a * b;
    return 0;
}

static inline int64_t norm_axis(int64_t axis, int rank)
{
    return axis < 0 ? axis + rank : axis;
}

static inline int check_axis(ictx_t *c, int64_t axis, int rank)
{
    if (axis < 0 || axis >= rank)
        FAIL(SQ_BAD_MODEL, "%s '%s': axis %lld out of range for rank %d", mdb_op_name(c->node->op),
             c->node->name, (long long)axis, rank);
    return 0;
}

#endif
