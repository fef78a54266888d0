/* modeldb/fuse.c: torch's decomposed LayerNorm and GELU (opset 13, as
 * torch 1.13 exports nn.LayerNorm and nn.GELU) become one
 * LayerNormalization and one Gelu node at import; a chain that differs
 * (another constant, another axis) is left as it is. That the fused graph
 * computes what the chain does is tests/worker/test_lower.c. */
#include "onnx_util.h"

static mdb_graph_t *import_ok(mb_t *b)
{
    size_t len;
    uint8_t *bytes = mb_pack(b, &len);
    mdb_graph_t *g = NULL;
    mdb_import_error_t err;
    cr_assert_eq(mdb_onnx_import(bytes, len, &g, &err), 0, "%s", err.detail);
    free(bytes);
    return g;
}

Test(fuse, torch_layer_norm_and_gelu_become_two_nodes)
{
    mb_t b;
    mb_ln_gelu(&b, 1e-5f, 1.4142135381698608f, -1);
    mdb_graph_t *g = import_ok(&b);
    cr_assert_eq(g->n_nodes, 2, "%d nodes", g->n_nodes);
    const mdb_node_t *ln = &g->nodes[0], *gelu = &g->nodes[1];
    cr_assert_eq(ln->op, MDB_OP_LAYER_NORM);
    cr_assert_eq(ln->n_inputs, 3);
    cr_assert_str_eq(g->tensors[ln->inputs[0]].name, "x");
    cr_assert_str_eq(g->tensors[ln->inputs[1]].name, "gamma");
    cr_assert_str_eq(g->tensors[ln->inputs[2]].name, "beta");
    cr_assert_eq(mdb_node_int(ln, "axis", -1), 2);
    cr_assert_float_eq(mdb_node_float(ln, "epsilon", 0), 1e-5f, 1e-12);
    cr_assert_eq(gelu->op, MDB_OP_GELU);
    cr_assert_eq(gelu->inputs[0], ln->outputs[0]);
    cr_assert_str_eq(g->tensors[gelu->outputs[0]].name, "z");
    cr_assert_eq(mdb_graph_runnable(g, false, NULL, NULL, 0), 0);
    mdb_graph_free(g);
    mb_free(&b);
}

Test(fuse, chains_that_differ_are_left_alone)
{
    /* tanh's constant instead of sqrt 2: no Gelu; a mean over axis 1: no
     * LayerNormalization (the ops stay, and run). */
    mb_t b;
    mb_ln_gelu(&b, 1e-5f, 1.5f, 1);
    mdb_graph_t *g = import_ok(&b);
    int hist[MDB_OP_COUNT];
    mdb_graph_op_histogram(g, hist);
    cr_assert_eq(hist[MDB_OP_LAYER_NORM], 0);
    cr_assert_eq(hist[MDB_OP_GELU], 0);
    cr_assert_eq(hist[MDB_OP_ERF], 1);
    cr_assert_eq(hist[MDB_OP_POW], 1);
    cr_assert_eq(hist[MDB_OP_SQRT], 1);
    cr_assert_eq(mdb_graph_runnable(g, false, NULL, NULL, 0), 0);
    mdb_graph_free(g);
    mb_free(&b);
}
