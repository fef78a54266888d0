/* worker/lower.c: the lowering reads modeldb's list of what the worker
 * runs (modeldb/runnable.c), so that it refuses exactly what the importer
 * refuses, with the same reason, and runs what the importer accepts. */
#include "../modeldb/onnx_util.h"

#include <wk_exec.h>

/* x[N,2,3,3] concatenated n times along the channels, as an mdb graph
 * built by hand (the importer would refuse n > 8 before the worker saw
 * it). */
static mdb_graph_t *concat_graph(int n)
{
    mdb_graph_t *g = mdb_graph_new();
    mdb_shape_t xs = {.rank = 4, .dims = {MDB_DIM_BATCH, 2, 3, 3}};
    int x = mdb_graph_add_tensor(g, "x", MDB_DT_FLOAT, &xs);
    int y = mdb_graph_add_tensor(g, "y", MDB_DT_FLOAT, NULL);
    mdb_graph_add_input(g, x);
    mdb_graph_add_output(g, y);
    int ins[16];
    for (int i = 0; i < n; i++)
        ins[i] = x;
    int idx = mdb_graph_add_node(g, MDB_OP_CONCAT, "wide", ins, n, &y, 1);
    mdb_node_set_int(&g->nodes[idx], "axis", 1);
    char err[256] = "";
    cr_assert_eq(mdb_graph_toposort(g, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(mdb_graph_infer_shapes(g, err, sizeof(err)), 0, "%s", err);
    return g;
}

Test(lower, a_concat_of_9_is_refused_with_the_importers_reason)
{
    mdb_graph_t *g = concat_graph(9);
    char want[256] = "", why[512] = "";
    cr_assert_eq(mdb_graph_runnable(g, false, NULL, want, sizeof(want)), SQ_UNSUPPORTED_MODEL);
    wk_plan_opts_t o = wk_plan_opts_default();
    o.max_batch = 2;
    wk_plan_t *p = NULL;
    cr_assert_eq(wk_plan_create(g, &o, &p, why, sizeof(why)), SQ_UNSUPPORTED_MODEL);
    cr_assert_null(p);
    cr_assert_str_eq(why, want);
    cr_assert_str_eq(why, "Concat node 'wide': 9 inputs; the worker concatenates at most 8");
    mdb_graph_free(g);
}

/* Imported from ONNX bytes like an upload, planned, run at batch 2: y is
 * x eight times over along the channels, exactly. */
Test(lower, a_concat_of_8_imports_and_runs)
{
    mb_t b;
    mb_init(&b, 13);
    int64_t x_dims[] = {-1, 2, 3, 3};
    mb_input(&b, "x", 4, x_dims);
    const char *ins[9] = {0};
    for (int i = 0; i < 8; i++)
        ins[i] = "x";
    Onnx__NodeProto *c = mb_node(&b, "Concat", ins, (const char *[]){"y", NULL});
    mb_attr_int(&b, c, "axis", 1);
    mb_output(&b, "y");
    size_t len;
    uint8_t *bytes = mb_pack(&b, &len);
    mdb_graph_t *g = NULL;
    mdb_import_error_t err;
    cr_assert_eq(mdb_onnx_import(bytes, len, &g, &err), 0, "%s", err.detail);
    free(bytes);
    mb_free(&b);
    wk_plan_opts_t o = wk_plan_opts_default();
    o.max_batch = 2;
    wk_plan_t *p = NULL;
    char why[512];
    cr_assert_eq(wk_plan_create(g, &o, &p, why, sizeof(why)), 0, "%s", why);
    mdb_graph_free(g);
    cr_assert_eq(wk_plan_output_elems(p, 0), 8 * 18);
    float x[2 * 18], y[2 * 8 * 18];
    for (int i = 0; i < 2 * 18; i++)
        x[i] = (float)i * 0.25f - 3.0f;
    cr_assert_eq(wk_plan_run(p, 2, (const float *[]){x}, (float *[]){y}), 0, "%s",
                 wk_plan_errmsg(p));
    for (int n = 0; n < 2; n++)
        for (int k = 0; k < 8; k++)
            for (int i = 0; i < 18; i++)
                cr_assert_eq(y[n * 144 + k * 18 + i], x[n * 18 + i], "item %d copy %d [%d]", n, k,
                             i);
    wk_plan_free(p);
}

/* A Transpose that moves the batch: refused, with the list's reason,
 * while the batch is symbolic; run when the plan binds it (static_batch). */
Test(lower, batching_rules_hold_until_the_batch_is_bound)
{
    mdb_graph_t *g = mdb_graph_new();
    mdb_shape_t xs = {.rank = 3, .dims = {MDB_DIM_BATCH, 2, 3}};
    int x = mdb_graph_add_tensor(g, "x", MDB_DT_FLOAT, &xs);
    int y = mdb_graph_add_tensor(g, "y", MDB_DT_FLOAT, NULL);
    mdb_graph_add_input(g, x);
    mdb_graph_add_output(g, y);
    int idx = mdb_graph_add_node(g, MDB_OP_TRANSPOSE, "t", &x, 1, &y, 1);
    mdb_node_set_ints(&g->nodes[idx], "perm", (const int64_t[]){1, 0, 2}, 3);
    char err[256] = "", why[512] = "";
    cr_assert_eq(mdb_graph_toposort(g, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(mdb_graph_infer_shapes(g, err, sizeof(err)), 0, "%s", err);
    wk_plan_opts_t o = wk_plan_opts_default();
    o.max_batch = 4;
    wk_plan_t *p = NULL;
    cr_assert_eq(wk_plan_create(g, &o, &p, why, sizeof(why)), SQ_UNSUPPORTED_MODEL);
    cr_assert_str_eq(why, "Transpose node 't': output 'y' has the batch in dim 1");
    o.static_batch = 2;
    cr_assert_eq(wk_plan_create(g, &o, &p, why, sizeof(why)), 0, "%s", why);
    float in[12], out[12];
    for (int i = 0; i < 12; i++)
        in[i] = (float)i;
    cr_assert_eq(wk_plan_run(p, 1, (const float *[]){in}, (float *[]){out}), 0, "%s",
                 wk_plan_errmsg(p));
    /* in[n][c][w] -> out[c][n][w] */
    for (int n = 0; n < 2; n++)
        for (int c = 0; c < 2; c++)
            for (int w = 0; w < 3; w++)
                cr_assert_eq(out[c * 6 + n * 3 + w], in[n * 6 + c * 3 + w]);
    wk_plan_free(p);
    mdb_graph_free(g);
}
