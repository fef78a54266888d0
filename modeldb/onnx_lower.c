/* Lowering of an imported ONNX graph to canonical form (see mdb_graph.h):
 * one pass in topological order that, for each node, turns the parameters
 * ONNX passes as constant inputs into attributes (opset by opset), folds
 * the node when its inputs are constants, or else infers its output shapes
 * (each op's canon, fold and shape rules: the descriptor table, ops.c).
 * Identity and Dropout disappear (their readers read their input). What
 * remains must be runtime ops only. */
#include "mdb_graph.h"
#include "mdb_graph_int.h"
#include "mdb_ops_int.h"

#include <sq.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef mdb_op_ctx_t lctx_t;

static const mdb_tensor_t *input(lctx_t *c, int k)
{
    if (k >= c->node->n_inputs || c->node->inputs[k] < 0)
        return NULL;
    return &c->g->tensors[c->node->inputs[k]];
}

/* Whether tensor t is a graph output or read by a node after node i (a
 * Dropout's mask that torch declares and nothing reads). */
static bool tensor_read(const mdb_graph_t *g, int i, int t)
{
    if (g->tensors[t].is_output)
        return true;
    for (int j = i + 1; j < g->n_nodes; j++)
        for (int k = 0; k < g->nodes[j].n_inputs; k++)
            if (g->nodes[j].inputs[k] == t)
                return true;
    return false;
}

/* Appends an op type to the comma-separated list ops (once). */
static void add_op(char *ops, size_t opslen, const char *name)
{
    size_t len = strlen(ops);
    if (!strstr(ops, name) && len + strlen(name) + 2 < opslen)
        snprintf(ops + len, opslen - len, "%s%s", len ? "," : "", name);
}

int mdb_onnx_lower(mdb_graph_t *g, int64_t opset, uint64_t fold_budget, char *err, size_t errlen,
                   char *ops, size_t opslen)
{
    int rc = 0;
    uint64_t folded_bytes = 0;
    /* alias[t]: the tensor that readers of t read instead (Identity, Dropout). */
    int n_alias = g->n_tensors; /* tensors added while lowering are never aliased */
    int *alias = sq_xcalloc((size_t)n_alias + 1, sizeof(int));
    for (int t = 0; t < n_alias; t++)
        alias[t] = t;
    lctx_t ctx = {.g = g, .opset = opset, .err = err, .errlen = errlen};
    lctx_t *c = &ctx;

    for (int i = 0; i < g->n_nodes; i++) {
        mdb_node_t *n = &g->nodes[i];
        c->node = n;
        for (int k = 0; k < n->n_inputs; k++)
            if (n->inputs[k] >= 0 && n->inputs[k] < n_alias)
                n->inputs[k] = alias[n->inputs[k]];
        for (int k = 0; k < n->n_inputs; k++) {
            const mdb_tensor_t *t = input(c, k);
            if (t && !t->shape_known) {
                mdb_errf(err, errlen, "%s '%s': input '%s' has no known shape", mdb_op_name(n->op),
                         n->name, t->name);
                rc = SQ_BAD_MODEL;
                goto out;
            }
        }
        if (n->op != MDB_OP_CONSTANT && !input(c, 0)) {
            mdb_errf(err, errlen, "%s '%s' has no input", mdb_op_name(n->op), n->name);
            rc = SQ_BAD_MODEL;
            goto out;
        }
        if ((rc = mdb__op_canon(c)) != 0)
            goto out;
        bool passthrough = n->op == MDB_OP_IDENTITY || n->op == MDB_OP_DROPOUT;
        int out0 = n->n_outputs > 0 ? n->outputs[0] : -1;
        bool mask_used = false;
        for (int k = 1; passthrough && k < n->n_outputs; k++)
            mask_used |=
                n->outputs[k] >= 0 && (n->op != MDB_OP_DROPOUT || tensor_read(g, i, n->outputs[k]));
        if (passthrough && out0 >= 0 && !g->tensors[out0].is_output && !mask_used) {
            /* Readers read the input; the node dies in compaction. It
             * still gets a shape so that the graph stays consistent. */
            alias[out0] = n->inputs[0];
            if ((rc = mdb_graph_infer_node(g, i, err, errlen)) != 0)
                goto out;
            continue;
        }
        rc = mdb_fold_node(g, i, err, errlen);
        if (rc < 0)
            goto out;
        if (rc == 0) {
            for (int k = 0; k < n->n_outputs; k++)
                if (n->outputs[k] >= 0)
                    folded_bytes += g->tensors[n->outputs[k]].nbytes;
            if (folded_bytes > fold_budget) {
                mdb_errf(err, errlen, "constant folding would create more than %llu bytes",
                         (unsigned long long)fold_budget);
                rc = SQ_BAD_MODEL;
                goto out;
            }
            continue;
        }
        rc = mdb_graph_infer_node(g, i, err, errlen);
        if (rc) {
            /* The uploader is told which op (a ConstantOfShape of the batch). */
            if (rc == SQ_UNSUPPORTED_MODEL)
                add_op(ops, opslen, mdb_op_name(n->op));
            goto out;
        }
        for (int k = 0; k < n->n_outputs; k++) {
            if (n->outputs[k] < 0)
                continue;
            const mdb_tensor_t *t = &g->tensors[n->outputs[k]];
            if (!t->shape_known) {
                mdb_errf(err, errlen, "%s '%s' writes output %d, which the op does not have",
                         mdb_op_name(n->op), n->name, k);
                rc = SQ_BAD_MODEL;
                goto out;
            }
            /* Per image: what the executor would have to allocate. */
            int64_t numel = mdb_shape_numel(&t->shape, 1);
            if (numel < 0 || numel > MDB_MAX_ELEMENTS) {
                mdb_errf(err, errlen, "%s '%s' writes a tensor of more than %lld elements",
                         mdb_op_name(n->op), n->name, (long long)MDB_MAX_ELEMENTS);
                rc = SQ_BAD_MODEL;
                goto out;
            }
        }
        if (n->op == MDB_OP_SQUEEZE || n->op == MDB_OP_UNSQUEEZE) {
            /* On runtime data they only relabel dimensions: a Reshape. */
            const mdb_shape_t *s = &g->tensors[n->outputs[0]].shape;
            n->op = MDB_OP_RESHAPE;
            mdb_node_del_attr(n, "axes");
            mdb_node_set_ints(n, "shape", s->dims, (size_t)s->rank);
        }
    }
    /* What was not folded must be something the worker runs. */
    for (int i = 0; i < g->n_nodes; i++) {
        const mdb_node_t *n = &g->nodes[i];
        bool folded = true;
        for (int k = 0; k < n->n_outputs; k++)
            if (n->outputs[k] >= 0 && !g->tensors[n->outputs[k]].data)
                folded = false;
        if (!folded && !mdb_op_is_runtime(n->op)) {
            add_op(ops, opslen, mdb_op_name(n->op));
            rc = SQ_UNSUPPORTED_MODEL;
        }
    }
    if (rc) {
        mdb_errf(err, errlen, "ops that depend on runtime data and cannot be folded: %s", ops);
        goto out;
    }
    mdb_graph_compact(g);
    /* The worker computes in float: a runtime op on integers (a uint8
     * MaxPool, an Add of int64 tensors) is something it cannot run. */
    for (int i = 0; i < g->n_nodes; i++) {
        const mdb_node_t *n = &g->nodes[i];
        bool is_float = n->n_outputs < 1 || n->outputs[0] < 0 ||
                        g->tensors[n->outputs[0]].dtype == MDB_DT_FLOAT;
        for (int k = 0; k < n->n_inputs; k++)
            if (n->inputs[k] >= 0 && g->tensors[n->inputs[k]].dtype != MDB_DT_FLOAT)
                is_float = false;
        if (!is_float) {
            add_op(ops, opslen, mdb_op_name(n->op));
            rc = SQ_UNSUPPORTED_MODEL;
        }
    }
    if (rc)
        mdb_errf(err, errlen, "ops on non-float tensors, which the worker does not run: %s", ops);
    else {
        mdb_graph_fuse(g);
        mdb_graph_trim_convs(g);
    }
out:
    free(alias);
    return rc;
}
