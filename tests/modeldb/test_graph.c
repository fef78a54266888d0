/* The graph IR: op table, attributes, topological order, compaction and
 * shape inference on graphs built by hand. */
#include <criterion/criterion.h>
#include <mdb_graph.h>
#include <mdb_graph_int.h>
#include <sq.h>

#include <stdlib.h>
#include <string.h>

#define B MDB_DIM_BATCH

static mdb_shape_t shp(int rank, int64_t d0, int64_t d1, int64_t d2, int64_t d3)
{
    mdb_shape_t s = {.rank = rank, .dims = {d0, d1, d2, d3}};
    return s;
}

static float *fdata(size_t n)
{
    float *p = calloc(n + 1, sizeof(float));
    for (size_t i = 0; i < n; i++)
        p[i] = (float)i * 0.5f;
    return p;
}

static int weight(mdb_graph_t *g, const char *name, mdb_shape_t s)
{
    int t = mdb_graph_add_tensor(g, name, MDB_DT_FLOAT, &s);
    int64_t n = mdb_shape_numel(&s, 1);
    mdb_graph_set_data(g, t, fdata((size_t)n), (size_t)n * 4);
    return t;
}

static int act(mdb_graph_t *g, const char *name)
{
    return mdb_graph_add_tensor(g, name, MDB_DT_UNDEFINED, NULL);
}

Test(graph, op_names_round_trip_and_runtime_flags)
{
    for (int op = 0; op < MDB_OP_COUNT; op++) {
        const char *name = mdb_op_name((mdb_op_t)op);
        cr_assert_neq(name[0], '?');
        cr_assert_eq(mdb_op_from_name(name), op, "%s", name);
    }
    cr_assert_str_eq(mdb_op_name(MDB_OP_BATCH_NORM), "BatchNormalization");
    cr_assert_eq(mdb_op_from_name("Conv"), MDB_OP_CONV);
    cr_assert_eq(mdb_op_from_name("conv"), -1);
    cr_assert_eq(mdb_op_from_name("NonMaxSuppression"), -1);
    cr_assert_str_eq(mdb_op_name(MDB_OP_COUNT), "?");
    cr_assert(mdb_op_is_runtime(MDB_OP_CONV));
    cr_assert(mdb_op_is_runtime(MDB_OP_SLICE));
    cr_assert_not(mdb_op_is_runtime(MDB_OP_SHAPE));
    cr_assert_not(mdb_op_is_runtime(MDB_OP_CONSTANT_OF_SHAPE));
    cr_assert_eq(mdb_dtype_size(MDB_DT_INT64), 8);
    cr_assert_str_eq(mdb_dtype_name(MDB_DT_FLOAT), "float");
}

Test(graph, attributes_are_typed_replaced_and_deleted)
{
    mdb_graph_t *g = mdb_graph_new();
    int x = act(g, "x"), y = act(g, "y");
    int idx = mdb_graph_add_node(g, MDB_OP_CONV, "c", &x, 1, &y, 1);
    mdb_node_t *n = &g->nodes[idx];
    int64_t pads[] = {1, 2, 3, 4};
    mdb_node_set_ints(n, "pads", pads, 4);
    mdb_node_set_int(n, "group", 2);
    mdb_node_set_float(n, "alpha", 0.5f);
    mdb_node_set_string(n, "mode", "reflect", 7);
    size_t cnt;
    const int64_t *got = mdb_node_ints(n, "pads", &cnt);
    cr_assert_eq(cnt, 4);
    cr_assert_eq(got[3], 4);
    cr_assert_eq(mdb_node_int(n, "group", 1), 2);
    cr_assert_eq(mdb_node_int(n, "pads", 7), 7, "wrong type gives the default");
    cr_assert_float_eq(mdb_node_float(n, "alpha", 0), 0.5f, 0);
    cr_assert_str_eq(mdb_node_string(n, "mode", ""), "reflect");
    /* Replacing with a value read from the attribute itself is safe. */
    mdb_node_set_ints(n, "pads", got + 2, 2);
    got = mdb_node_ints(n, "pads", &cnt);
    cr_assert_eq(cnt, 2);
    cr_assert_eq(got[0], 3);
    mdb_node_set_string(n, "mode", mdb_node_string(n, "mode", ""), 4);
    cr_assert_str_eq(mdb_node_string(n, "mode", ""), "refl");
    mdb_node_set_int(n, "group", 3);
    cr_assert_eq(n->n_attrs, 4);
    cr_assert_eq(mdb_node_int(n, "group", 1), 3);
    mdb_node_del_attr(n, "group");
    mdb_node_del_attr(n, "absent");
    cr_assert_eq(n->n_attrs, 3);
    cr_assert_null(mdb_node_attr(n, "group"));
    cr_assert_null(mdb_node_ints(n, "absent", &cnt));
    cr_assert_eq(cnt, 0);
    mdb_graph_free(g);
    mdb_graph_free(NULL);
}

/* x[N,3,8,8] -> Conv(4x3x3x3, stride 2, pads 1 0 1 0 asym) -> Relu
 *   -> GlobalAveragePool -> Flatten -> Gemm(10x4, transB) */
static mdb_graph_t *small_cnn(void)
{
    mdb_graph_t *g = mdb_graph_new();
    mdb_shape_t in = shp(4, B, 3, 8, 8);
    int x = mdb_graph_add_tensor(g, "x", MDB_DT_FLOAT, &in);
    mdb_graph_add_input(g, x);
    int w = weight(g, "w", shp(4, 4, 3, 3, 3));
    int fc = weight(g, "fc", shp(2, 10, 4, 0, 0));
    int c = act(g, "c"), r = act(g, "r"), p = act(g, "p"), f = act(g, "f"), y = act(g, "y");
    int conv = mdb_graph_add_node(g, MDB_OP_CONV, "conv", (int[]){x, w, -1}, 3, &c, 1);
    int64_t k[] = {3, 3}, s[] = {2, 2}, pads[] = {1, 0, 1, 0};
    mdb_node_set_ints(&g->nodes[conv], "kernel_shape", k, 2);
    mdb_node_set_ints(&g->nodes[conv], "strides", s, 2);
    mdb_node_set_ints(&g->nodes[conv], "pads", pads, 4);
    mdb_graph_add_node(g, MDB_OP_RELU, "relu", &c, 1, &r, 1);
    mdb_graph_add_node(g, MDB_OP_GLOBAL_AVERAGE_POOL, "gap", &r, 1, &p, 1);
    mdb_graph_add_node(g, MDB_OP_FLATTEN, "flat", &p, 1, &f, 1);
    int gemm = mdb_graph_add_node(g, MDB_OP_GEMM, "fc", (int[]){f, fc}, 2, &y, 1);
    mdb_node_set_int(&g->nodes[gemm], "transB", 1);
    mdb_graph_add_output(g, y);
    return g;
}

Test(graph, shapes_of_a_small_cnn_keep_the_batch_symbolic)
{
    mdb_graph_t *g = small_cnn();
    char err[256] = "";
    cr_assert_eq(mdb_graph_toposort(g, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(mdb_graph_infer_shapes(g, err, sizeof(err)), 0, "%s", err);
    /* (8 + 1 + 1 - 3) / 2 + 1 = 4 rows; (8 + 0 + 0 - 3) / 2 + 1 = 3 cols */
    mdb_shape_t want_c = shp(4, B, 4, 4, 3);
    cr_assert(mdb_shape_eq(&g->tensors[mdb_graph_find_tensor(g, "c")].shape, &want_c));
    mdb_shape_t want_p = shp(4, B, 4, 1, 1);
    cr_assert(mdb_shape_eq(&g->tensors[mdb_graph_find_tensor(g, "p")].shape, &want_p));
    mdb_shape_t want_y = shp(2, B, 10, 0, 0);
    cr_assert(mdb_shape_eq(&g->tensors[g->outputs[0]].shape, &want_y));
    char s[64];
    mdb_shape_str(&g->tensors[mdb_graph_find_tensor(g, "c")].shape, s, sizeof(s));
    cr_assert_str_eq(s, "[N,4,4,3]");
    cr_assert_eq(mdb_shape_numel(&want_c, 8), 8 * 4 * 4 * 3);
    cr_assert_eq(mdb_graph_param_bytes(g), (108 + 40) * 4);
    int hist[MDB_OP_COUNT];
    mdb_graph_op_histogram(g, hist);
    cr_assert_eq(hist[MDB_OP_CONV], 1);
    cr_assert_eq(hist[MDB_OP_GEMM], 1);
    cr_assert_eq(hist[MDB_OP_ADD], 0);
    mdb_graph_free(g);
}

Test(graph, validation_catches_broken_invariants)
{
    mdb_graph_t *g = small_cnn();
    char err[256];
    /* Before shape inference the activations have no shapes. */
    cr_assert_eq(mdb_graph_validate(g, err, sizeof(err)), SQ_INTERNAL);
    cr_assert_eq(mdb_graph_toposort(g, err, sizeof(err)), 0);
    cr_assert_eq(mdb_graph_infer_shapes(g, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(mdb_graph_validate(g, err, sizeof(err)), 0, "%s", err);
    /* A constant whose bytes do not match its shape. */
    int w = mdb_graph_find_tensor(g, "w");
    g->tensors[w].nbytes -= 4;
    cr_assert_eq(mdb_graph_validate(g, err, sizeof(err)), SQ_INTERNAL);
    cr_assert_not_null(strstr(err, "'w'"), "%s", err);
    g->tensors[w].nbytes += 4;
    /* Nodes out of order. */
    mdb_node_t tmp = g->nodes[0];
    g->nodes[0] = g->nodes[1];
    g->nodes[1] = tmp;
    cr_assert_eq(mdb_graph_validate(g, err, sizeof(err)), SQ_INTERNAL);
    g->nodes[1] = g->nodes[0];
    g->nodes[0] = tmp;
    /* An import-only op left behind. */
    g->nodes[1].op = MDB_OP_SHAPE;
    cr_assert_eq(mdb_graph_validate(g, err, sizeof(err)), SQ_INTERNAL);
    cr_assert_not_null(strstr(err, "Shape"), "%s", err);
    g->nodes[1].op = MDB_OP_RELU;
    cr_assert_eq(mdb_graph_validate(g, err, sizeof(err)), 0, "%s", err);
    mdb_graph_free(g);
}

Test(graph, toposort_orders_a_reversed_graph_and_finds_cycles)
{
    mdb_graph_t *g = mdb_graph_new();
    mdb_shape_t in = shp(2, B, 4, 0, 0);
    int x = mdb_graph_add_tensor(g, "x", MDB_DT_FLOAT, &in);
    mdb_graph_add_input(g, x);
    int a = act(g, "a"), b = act(g, "b"), c = act(g, "c");
    mdb_graph_add_node(g, MDB_OP_SIGMOID, "third", &b, 1, &c, 1);
    mdb_graph_add_node(g, MDB_OP_RELU, "second", &a, 1, &b, 1);
    mdb_graph_add_node(g, MDB_OP_RELU, "first", &x, 1, &a, 1);
    mdb_graph_add_output(g, c);
    char err[128];
    cr_assert_eq(mdb_graph_toposort(g, err, sizeof(err)), 0);
    cr_assert_str_eq(g->nodes[0].name, "first");
    cr_assert_str_eq(g->nodes[2].name, "third");
    cr_assert_eq(g->tensors[c].producer, 2);
    cr_assert_eq(g->tensors[x].producer, -1);
    /* Make "first" read c: a cycle. */
    g->nodes[0].inputs[0] = c;
    cr_assert_eq(mdb_graph_toposort(g, err, sizeof(err)), SQ_BAD_MODEL);
    cr_assert_not_null(strstr(err, "cycle"));
    mdb_graph_free(g);
}

Test(graph, compaction_drops_dead_nodes_and_renumbers)
{
    mdb_graph_t *g = small_cnn();
    /* A dead branch reading the conv output. */
    int c = mdb_graph_find_tensor(g, "c");
    int dead = act(g, "dead");
    mdb_graph_add_node(g, MDB_OP_SIGMOID, "unused", &c, 1, &dead, 1);
    weight(g, "orphan", shp(1, 1000, 0, 0, 0));
    char err[128];
    cr_assert_eq(mdb_graph_toposort(g, err, sizeof(err)), 0);
    int before_nodes = g->n_nodes, before_tensors = g->n_tensors;
    mdb_graph_compact(g);
    cr_assert_eq(g->n_nodes, before_nodes - 1);
    cr_assert_eq(g->n_tensors, before_tensors - 2);
    cr_assert_eq(mdb_graph_find_tensor(g, "dead"), -1);
    cr_assert_eq(mdb_graph_find_tensor(g, "orphan"), -1);
    /* Indices still line up. */
    for (int i = 0; i < g->n_nodes; i++)
        for (int k = 0; k < g->nodes[i].n_outputs; k++)
            cr_assert_eq(g->tensors[g->nodes[i].outputs[k]].producer, i);
    cr_assert_str_eq(g->tensors[g->outputs[0]].name, "y");
    cr_assert_str_eq(g->tensors[g->inputs[0]].name, "x");
    cr_assert_eq(mdb_graph_infer_shapes(g, err, sizeof(err)), 0, "%s", err);
    mdb_graph_free(g);
}

Test(graph, reshape_resolution_handles_the_symbolic_batch)
{
    mdb_shape_t in = shp(4, B, 512, 1, 1), out;
    char err[128];
    int64_t t1[] = {MDB_SYM_BATCH, -1};
    cr_assert_eq(mdb_reshape_resolve(&in, t1, 2, false, &out, err, sizeof(err)), 0, "%s", err);
    mdb_shape_t want = shp(2, B, 512, 0, 0);
    cr_assert(mdb_shape_eq(&out, &want));
    /* [-1, 512]: -1 absorbs exactly the batch. */
    int64_t t2[] = {-1, 512};
    cr_assert_eq(mdb_reshape_resolve(&in, t2, 2, false, &out, err, sizeof(err)), 0, "%s", err);
    cr_assert(mdb_shape_eq(&out, &want));
    /* 0 copies the batch. */
    int64_t t3[] = {0, 512};
    cr_assert_eq(mdb_reshape_resolve(&in, t3, 2, false, &out, err, sizeof(err)), 0, "%s", err);
    cr_assert(mdb_shape_eq(&out, &want));
    /* Batch merged into another dimension: 512 N, as -512. */
    int64_t t4[] = {-1};
    cr_assert_eq(mdb_reshape_resolve(&in, t4, 1, false, &out, err, sizeof(err)), 0, "%s", err);
    mdb_shape_t merged = shp(1, -512, 0, 0, 0);
    cr_assert(mdb_shape_eq(&out, &merged));
    int64_t t5[] = {1, -1};
    cr_assert_eq(mdb_reshape_resolve(&in, t5, 2, false, &out, err, sizeof(err)), 0, "%s", err);
    mdb_shape_t row = shp(2, 1, -512, 0, 0);
    cr_assert(mdb_shape_eq(&out, &row));
    /* ... and split from it again: [512 N] to [N * 8, 64] (attention's
     * N * heads, folded as a multiple of the batch). */
    int64_t tm[] = {mdb_sym_batch(8), 64};
    cr_assert_eq(mdb_reshape_resolve(&merged, tm, 2, false, &out, err, sizeof(err)), 0, "%s", err);
    mdb_shape_t heads = shp(2, -8, 64, 0, 0);
    cr_assert(mdb_shape_eq(&out, &heads));
    /* The batch in two dimensions (N squared) is not expressible. */
    int64_t tn[] = {MDB_SYM_BATCH, MDB_SYM_BATCH, 512};
    cr_assert_eq(mdb_reshape_resolve(&in, tn, 3, false, &out, err, sizeof(err)),
                 SQ_UNSUPPORTED_MODEL);
    /* Element count changes. */
    int64_t t6[] = {MDB_SYM_BATCH, 500};
    cr_assert_eq(mdb_reshape_resolve(&in, t6, 2, false, &out, err, sizeof(err)), SQ_BAD_MODEL);
    int64_t t7[] = {-1, -1};
    cr_assert_eq(mdb_reshape_resolve(&in, t7, 2, false, &out, err, sizeof(err)), SQ_BAD_MODEL);
    /* Concrete shapes, and allowzero. */
    mdb_shape_t c = shp(3, 2, 3, 4, 0);
    int64_t t8[] = {4, 0, -1};
    cr_assert_eq(mdb_reshape_resolve(&c, t8, 3, false, &out, err, sizeof(err)), 0, "%s", err);
    mdb_shape_t w8 = shp(3, 4, 3, 2, 0);
    cr_assert(mdb_shape_eq(&out, &w8));
    cr_assert_eq(mdb_reshape_resolve(&c, t8, 3, true, &out, err, sizeof(err)), SQ_BAD_MODEL);
}

static int infer_one(mdb_op_t op, mdb_shape_t a, const mdb_shape_t *b, mdb_shape_t *out,
                     void (*set)(mdb_node_t *))
{
    mdb_graph_t *g = mdb_graph_new();
    int x = mdb_graph_add_tensor(g, "x", MDB_DT_FLOAT, &a);
    mdb_graph_add_input(g, x);
    int ins[2] = {x, -1}, n_in = 1;
    if (b) {
        ins[1] = weight(g, "b", *b);
        n_in = 2;
    }
    int y = act(g, "y");
    int idx = mdb_graph_add_node(g, op, "n", ins, n_in, &y, 1);
    if (set)
        set(&g->nodes[idx]);
    char err[128];
    int rc = mdb_graph_infer_node(g, idx, err, sizeof(err));
    if (rc == 0)
        *out = g->tensors[y].shape;
    mdb_graph_free(g);
    return rc;
}

Test(graph, broadcasting_keeps_the_batch_apart)
{
    mdb_shape_t out, bias = shp(3, 3, 1, 1, 0), row = shp(2, 2, 3, 0, 0);
    cr_assert_eq(infer_one(MDB_OP_ADD, shp(4, B, 3, 5, 5), &bias, &out, NULL), 0);
    mdb_shape_t want = shp(4, B, 3, 5, 5);
    cr_assert(mdb_shape_eq(&out, &want));
    /* [N,3] + [2,3]: N against 2 is not known to broadcast. */
    cr_assert_eq(infer_one(MDB_OP_MUL, shp(2, B, 3, 0, 0), &row, &out, NULL), SQ_UNSUPPORTED_MODEL);
    /* [4,3] + [2,3]: plainly wrong. */
    cr_assert_eq(infer_one(MDB_OP_SUB, shp(2, 4, 3, 0, 0), &row, &out, NULL), SQ_BAD_MODEL);
}

static void set_depthwise(mdb_node_t *n)
{
    int64_t pads[] = {1, 1, 1, 1}, s[] = {2, 2}, d[] = {2, 2};
    mdb_node_set_ints(n, "pads", pads, 4);
    mdb_node_set_ints(n, "strides", s, 2);
    mdb_node_set_ints(n, "dilations", d, 2);
    mdb_node_set_int(n, "group", 8);
}

static void set_bad_group(mdb_node_t *n)
{
    mdb_node_set_int(n, "group", 3);
}

static void set_pool_ceil(mdb_node_t *n)
{
    int64_t k[] = {3, 3}, s[] = {2, 2};
    mdb_node_set_ints(n, "kernel_shape", k, 2);
    mdb_node_set_ints(n, "strides", s, 2);
    mdb_node_set_int(n, "ceil_mode", 1);
}

Test(graph, conv_and_pool_geometry)
{
    mdb_shape_t out, dw = shp(4, 8, 1, 3, 3);
    /* Depthwise, dilation 2 (span 5), stride 2, pad 1: (16 + 2 - 5) / 2 + 1 = 7. */
    cr_assert_eq(infer_one(MDB_OP_CONV, shp(4, B, 8, 16, 16), &dw, &out, set_depthwise), 0);
    mdb_shape_t want = shp(4, B, 8, 7, 7);
    cr_assert(mdb_shape_eq(&out, &want));
    cr_assert_eq(infer_one(MDB_OP_CONV, shp(4, B, 8, 16, 16), &dw, &out, set_bad_group),
                 SQ_BAD_MODEL);
    /* Max pool 3x3 stride 2 with ceil: 112 -> 56 (not 55), 111 -> 55. */
    cr_assert_eq(infer_one(MDB_OP_MAX_POOL, shp(4, B, 64, 112, 111), NULL, &out, set_pool_ceil), 0);
    mdb_shape_t pooled = shp(4, B, 64, 56, 55);
    cr_assert(mdb_shape_eq(&out, &pooled));
    /* A pool without a kernel is malformed. */
    cr_assert_eq(infer_one(MDB_OP_MAX_POOL, shp(4, B, 64, 8, 8), NULL, &out, NULL), SQ_BAD_MODEL);
}

static void set_axis1(mdb_node_t *n)
{
    mdb_node_set_int(n, "axis", 1);
}

static void set_axis0(mdb_node_t *n)
{
    mdb_node_set_int(n, "axis", 0);
}

static void set_perm(mdb_node_t *n)
{
    int64_t perm[] = {0, 2, 3, 1};
    mdb_node_set_ints(n, "perm", perm, 4);
}

static void set_mean_hw(mdb_node_t *n)
{
    int64_t axes[] = {2, 3};
    mdb_node_set_ints(n, "axes", axes, 2);
    mdb_node_set_int(n, "keepdims", 0);
}

static void set_mean_batch(mdb_node_t *n)
{
    int64_t axes[] = {0};
    mdb_node_set_ints(n, "axes", axes, 1);
}

Test(graph, layout_ops_and_reductions)
{
    mdb_shape_t out;
    cr_assert_eq(infer_one(MDB_OP_FLATTEN, shp(4, B, 2, 3, 4), NULL, &out, set_axis1), 0);
    mdb_shape_t flat = shp(2, B, 24, 0, 0);
    cr_assert(mdb_shape_eq(&out, &flat));
    /* axis 0 merges the batch: [1, 24 N] */
    cr_assert_eq(infer_one(MDB_OP_FLATTEN, shp(4, B, 2, 3, 4), NULL, &out, set_axis0), 0);
    mdb_shape_t merged = shp(2, 1, -24, 0, 0);
    cr_assert(mdb_shape_eq(&out, &merged));
    cr_assert_eq(infer_one(MDB_OP_TRANSPOSE, shp(4, B, 2, 3, 4), NULL, &out, set_perm), 0);
    mdb_shape_t nhwc = shp(4, B, 3, 4, 2);
    cr_assert(mdb_shape_eq(&out, &nhwc));
    cr_assert_eq(infer_one(MDB_OP_REDUCE_MEAN, shp(4, B, 2, 3, 4), NULL, &out, set_mean_hw), 0);
    mdb_shape_t mean = shp(2, B, 2, 0, 0);
    cr_assert(mdb_shape_eq(&out, &mean));
    cr_assert_eq(infer_one(MDB_OP_REDUCE_MEAN, shp(4, B, 2, 3, 4), NULL, &out, set_mean_batch),
                 SQ_UNSUPPORTED_MODEL);
}
