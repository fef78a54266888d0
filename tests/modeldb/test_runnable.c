/* modeldb/runnable.c: the one list of what the worker runs. The importer
 * refuses at upload, with the node and the reason, every graph past it;
 * the batching rules hold only while the batch is symbolic. (That the
 * worker's lowering refuses exactly the same graphs, with the same words,
 * is tests/worker/test_lower.c.) */
#include "onnx_util.h"

static int import_builder(mb_t *b, mdb_graph_t **g, mdb_import_error_t *err)
{
    size_t len;
    uint8_t *bytes = mb_pack(b, &len);
    memset(err, 0, sizeof(*err));
    int rc = mdb_onnx_import(bytes, len, g, err);
    free(bytes);
    return rc;
}

/* x[N or batch, 2, 4, 4] concatenated n times along the channels into y,
 * by a node called "wide". */
static void concat_model(mb_t *b, int n, int64_t batch)
{
    mb_init(b, 13);
    int64_t x_dims[] = {batch, 2, 4, 4};
    mb_input(b, "x", 4, x_dims);
    const char *ins[64] = {0};
    cr_assert_lt(n, 64);
    for (int i = 0; i < n; i++)
        ins[i] = "x";
    Onnx__NodeProto *c = mb_node(b, "Concat", ins, (const char *[]){"y", NULL});
    c->name = mb_str(b, "wide");
    mb_attr_int(b, c, "axis", 1);
    mb_output(b, "y");
}

static void expect_refused(mb_t *b, const char *op, const char *node, const char *reason)
{
    mdb_graph_t *g = NULL;
    mdb_import_error_t err;
    cr_assert_eq(import_builder(b, &g, &err), SQ_UNSUPPORTED_MODEL, "accepted; want '%s'", reason);
    cr_assert_null(g);
    cr_assert_eq(err.code, SQ_UNSUPPORTED_MODEL);
    cr_assert_str_eq(err.ops, op);
    /* "Op node 'name': reason" from the list; shape inference, which
     * refuses some of the same graphs first, says "Op 'name' reason". */
    char quoted[64];
    snprintf(quoted, sizeof(quoted), "'%s'", node);
    cr_assert(strncmp(err.detail, op, strlen(op)) == 0, "detail: %s", err.detail);
    cr_assert_not_null(strstr(err.detail, quoted), "detail: %s", err.detail);
    cr_assert_not_null(strstr(err.detail, reason), "detail: %s", err.detail);
}

static mdb_graph_t *expect_imported(mb_t *b)
{
    mdb_graph_t *g = NULL;
    mdb_import_error_t err;
    cr_assert_eq(import_builder(b, &g, &err), 0, "%s %s", err.ops, err.detail);
    cr_assert_eq(mdb_graph_runnable(g, false, NULL, NULL, 0), 0);
    return g;
}

/* DenseNet-201 concatenates 49 inputs; the worker takes any number. */
Test(runnable, a_concat_of_many_inputs_is_accepted)
{
    int counts[] = {9, 12, 49};
    for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
        mb_t b;
        concat_model(&b, counts[c], -1);
        mdb_graph_t *g = expect_imported(&b);
        cr_assert_eq(g->n_nodes, 1);
        cr_assert_eq(g->nodes[0].n_inputs, counts[c]);
        int64_t y[] = {MDB_DIM_BATCH, 2 * counts[c], 4, 4};
        expect_shape(&g->tensors[g->outputs[0]].shape, 4, y, "y");
        mdb_graph_free(g);
        mb_free(&b);
    }
}

/* x[batch, 2, 4, 4] through one node op(x[, c]) named "n", c a constant of
 * c_dims when c_rank > 0 (c first when c_first). */
static Onnx__NodeProto *unary_model(mb_t *b, int64_t opset, const char *op, int64_t batch,
                                    int c_rank, const int64_t *c_dims, bool c_first)
{
    mb_init(b, opset);
    int64_t x_dims[] = {batch, 2, 4, 4};
    mb_input(b, "x", 4, x_dims);
    if (c_rank > 0)
        mb_init_f(b, "c", c_rank, c_dims, 2.0f, 0.5f);
    const char *ins[3] = {c_rank > 0 && c_first ? "c" : "x",
                          c_rank > 0 ? (c_first ? "x" : "c") : NULL, NULL};
    Onnx__NodeProto *n = mb_node(b, op, ins, (const char *[]){"y", NULL});
    n->name = mb_str(b, "n");
    mb_output(b, "y");
    return n;
}

Test(runnable, a_division_of_a_broadcast_dividend_is_refused)
{
    mb_t b;
    int64_t c[] = {1, 2, 1, 1};
    unary_model(&b, 13, "Div", -1, 4, c, true);
    expect_refused(&b, "Div", "n", "the dividend 'c' broadcasts");
    mb_free(&b);
    /* The divisor may broadcast; so may either side of a Sub (negated). */
    unary_model(&b, 13, "Div", -1, 4, c, false);
    mdb_graph_free(expect_imported(&b));
    mb_free(&b);
    unary_model(&b, 13, "Sub", -1, 4, c, true);
    mdb_graph_free(expect_imported(&b));
    mb_free(&b);
}

Test(runnable, an_add_where_both_operands_broadcast_is_refused)
{
    mb_t b;
    mb_init(&b, 13);
    int64_t x_dims[] = {-1, 2, 1, 4}, c_dims[] = {1, 1, 3, 1};
    mb_input(&b, "x", 4, x_dims);
    mb_init_f(&b, "c", 4, c_dims, 1.0f, 1.0f);
    Onnx__NodeProto *n =
        mb_node(&b, "Add", (const char *[]){"x", "c", NULL}, (const char *[]){"y", NULL});
    n->name = mb_str(&b, "n");
    mb_output(&b, "y");
    expect_refused(&b, "Add", "n", "both operands broadcast");
    mb_free(&b);
}

Test(runnable, reductions_and_softmax_over_the_symbolic_batch_are_refused)
{
    mb_t b;
    int64_t axes[] = {0};
    Onnx__NodeProto *n = unary_model(&b, 13, "ReduceMean", -1, 0, NULL, false);
    mb_attr_ints(&b, n, "axes", 1, axes);
    expect_refused(&b, "ReduceMean", "n", "over the batch");
    mb_free(&b);
    n = unary_model(&b, 13, "Softmax", -1, 0, NULL, false);
    mb_attr_int(&b, n, "axis", 0);
    expect_refused(&b, "Softmax", "n", "over the batch");
    mb_free(&b);
    /* Over the channels, both run. */
    n = unary_model(&b, 13, "Softmax", -1, 0, NULL, false);
    mb_attr_int(&b, n, "axis", 1);
    mdb_graph_free(expect_imported(&b));
    mb_free(&b);
}

Test(runnable, a_transpose_that_moves_the_batch_fixes_a_declared_batch_or_is_refused)
{
    mb_t b;
    int64_t perm[] = {1, 0, 2, 3};
    /* A symbolic batch cannot leave dim 0. */
    Onnx__NodeProto *n = unary_model(&b, 13, "Transpose", -1, 0, NULL, false);
    mb_attr_ints(&b, n, "perm", 4, perm);
    expect_refused(&b, "Transpose", "n", "the batch");
    mb_free(&b);
    /* A file that declares batch 2 is imported for that batch only. */
    n = unary_model(&b, 13, "Transpose", 2, 0, NULL, false);
    mb_attr_ints(&b, n, "perm", 4, perm);
    mdb_graph_t *g = expect_imported(&b);
    cr_assert_eq(g->batch_fixed, 2);
    int64_t y[] = {2, 2, 4, 4};
    expect_shape(&g->tensors[g->outputs[0]].shape, 4, y, "y");
    mdb_graph_free(g);
    mb_free(&b);
}

Test(runnable, a_pad_of_the_batch_is_refused_and_other_pads_run)
{
    mb_t b;
    int64_t batch_pads[] = {1, 0, 0, 0, 0, 0, 0, 0}, hw_pads[] = {0, 0, 1, 2, 0, 0, 3, 0};
    Onnx__NodeProto *n = unary_model(&b, 10, "Pad", -1, 0, NULL, false);
    mb_attr_ints(&b, n, "pads", 8, batch_pads);
    expect_refused(&b, "Pad", "n", "pads the batch");
    mb_free(&b);
    n = unary_model(&b, 10, "Pad", -1, 0, NULL, false);
    mb_attr_ints(&b, n, "pads", 8, hw_pads);
    mdb_graph_t *g = expect_imported(&b);
    int64_t y[] = {MDB_DIM_BATCH, 2, 8, 6};
    expect_shape(&g->tensors[g->outputs[0]].shape, 4, y, "y");
    mdb_graph_free(g);
    mb_free(&b);
}

Test(runnable, batching_rules_apply_only_while_the_batch_is_symbolic)
{
    /* By hand, as no importer would leave it: x[N,2,4,4] -> Transpose
     * (1, 0, 2, 3) -> y[2,N,4,4]. */
    mdb_graph_t *g = mdb_graph_new();
    mdb_shape_t xs = {.rank = 4, .dims = {MDB_DIM_BATCH, 2, 4, 4}};
    int x = mdb_graph_add_tensor(g, "x", MDB_DT_FLOAT, &xs);
    int y = mdb_graph_add_tensor(g, "y", MDB_DT_FLOAT, NULL);
    mdb_graph_add_input(g, x);
    mdb_graph_add_output(g, y);
    int idx = mdb_graph_add_node(g, MDB_OP_TRANSPOSE, "t", &x, 1, &y, 1);
    mdb_node_set_ints(&g->nodes[idx], "perm", (const int64_t[]){1, 0, 2, 3}, 4);
    char err[256] = "";
    cr_assert_eq(mdb_graph_toposort(g, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(mdb_graph_infer_shapes(g, err, sizeof(err)), 0, "%s", err);
    int bad = 0;
    cr_assert_eq(mdb_graph_runnable(g, false, &bad, err, sizeof(err)), SQ_UNSUPPORTED_MODEL);
    cr_assert_eq(bad, 0);
    cr_assert_str_eq(err, "Transpose node 't': output 'y' has the batch in dim 1");
    cr_assert_eq(mdb_node_runnable(g, 0, true, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(mdb_graph_runnable(g, true, &bad, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(bad, -1);
    mdb_graph_free(g);
}

Test(runnable, computed_conv_weights_are_refused)
{
    mb_t b;
    mb_init(&b, 13);
    int64_t x_dims[] = {-1, 2, 4, 4}, w_dims[] = {2, 2, 1, 1};
    mb_input(&b, "x", 4, x_dims);
    mb_input(&b, "w", 4, w_dims);
    Onnx__NodeProto *n =
        mb_node(&b, "Conv", (const char *[]){"x", "w", NULL}, (const char *[]){"y", NULL});
    n->name = mb_str(&b, "n");
    mb_output(&b, "y");
    expect_refused(&b, "Conv", "n", "the weights are computed, not constant");
    mb_free(&b);
}

/* The cuda backend's limits are rules of the op table too: the importer
 * takes the model (the cpu backend runs it) and says, per device kind,
 * that the cuda backend would refuse it and why. */
Test(runnable, model_info_says_per_device_kind_whether_the_model_runs)
{
    mb_t b;
    mb_init(&b, 13);
    int64_t x_dims[] = {-1, 2, 4, 4}, w_dims[] = {2, 2, 3, 3}, pads[] = {0, 0, 1, 1};
    mb_input(&b, "x", 4, x_dims);
    mb_init_f(&b, "w", 4, w_dims, 0.5f, 0.0f);
    Onnx__NodeProto *n =
        mb_node(&b, "Conv", (const char *[]){"x", "w", NULL}, (const char *[]){"y", NULL});
    n->name = mb_str(&b, "c1");
    mb_attr_ints(&b, n, "pads", 4, pads);
    mb_output(&b, "y");
    mdb_graph_t *g = expect_imported(&b);
    mdb_model_info_t info;
    char err[256] = "";
    cr_assert_eq(mdb_model_info(g, &info, err, sizeof(err)), 0, "%s", err);
    cr_assert(info.runs_on[SQ_DEV_CPU], "%s", info.not_on[SQ_DEV_CPU]);
    cr_assert_not(info.runs_on[SQ_DEV_CUDA]);
    cr_assert_str_eq(info.not_on[SQ_DEV_CUDA], "Conv node 'c1': convolution with asymmetric pads");
    cr_assert_not(info.runs_on[SQ_DEV_EMU]);
    int bad = -2;
    cr_assert_eq(mdb_graph_runnable_on(g, SQ_DEV_CUDA, false, &bad, err, sizeof(err)),
                 SQ_UNSUPPORTED_MODEL);
    cr_assert_eq(bad, 0);
    mdb_graph_free(g);
    mb_free(&b);

    /* symmetric pads: every backend */
    mb_init(&b, 13);
    mb_input(&b, "x", 4, x_dims);
    mb_init_f(&b, "w", 4, w_dims, 0.5f, 0.0f);
    n = mb_node(&b, "Conv", (const char *[]){"x", "w", NULL}, (const char *[]){"y", NULL});
    mb_attr_ints(&b, n, "pads", 4, (const int64_t[]){1, 1, 1, 1});
    mb_output(&b, "y");
    g = expect_imported(&b);
    cr_assert_eq(mdb_model_info(g, &info, err, sizeof(err)), 0, "%s", err);
    cr_assert(info.runs_on[SQ_DEV_CPU] && info.runs_on[SQ_DEV_CUDA], "%s",
              info.not_on[SQ_DEV_CUDA]);
    mdb_graph_free(g);
    mb_free(&b);
}

static void attr_str(mb_t *b, Onnx__NodeProto *n, const char *name, const char *v)
{
    Onnx__AttributeProto *a = mb_alloc(b, sizeof(*a));
    onnx__attribute_proto__init(a);
    a->name = mb_str(b, name);
    a->has_type = 1;
    a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING;
    a->has_s = 1;
    a->s.data = (uint8_t *)mb_str(b, v);
    a->s.len = strlen(v);
    n->attribute[n->n_attribute++] = a;
}

/* x[N,2,4,4] -> Resize by scales (H and W 2 unless given) named "up". */
static Onnx__NodeProto *resize_model(mb_t *b, const char *mode, float sc)
{
    mb_init(b, 13);
    mb_input(b, "x", 4, (const int64_t[]){-1, 2, 4, 4});
    Onnx__TensorProto *t = mb_init_f(b, "scales", 1, (const int64_t[]){4}, 2, 0);
    ((float *)t->raw_data.data)[0] = 1;
    ((float *)t->raw_data.data)[1] = sc;
    Onnx__NodeProto *n = mb_node(b, "Resize", (const char *[]){"x", "", "scales", NULL},
                                 (const char *[]){"y", NULL});
    n->name = mb_str(b, "up");
    attr_str(b, n, "mode", mode);
    mb_output(b, "y");
    return n;
}

/* Resize runs on the cpu and on cuda (nearest, linear and cubic, H and W:
 * the cuda backend's k_resize takes the cpu's transforms); what neither
 * runs is refused with its reason. */
Test(runnable, resize_runs_on_the_cpu_and_on_cuda)
{
    mb_t b;
    resize_model(&b, "nearest", 1);
    mdb_graph_t *g = expect_imported(&b);
    mdb_model_info_t info;
    char err[256] = "";
    cr_assert_eq(mdb_model_info(g, &info, err, sizeof(err)), 0, "%s", err);
    cr_assert(info.runs_on[SQ_DEV_CPU], "%s", info.not_on[SQ_DEV_CPU]);
    cr_assert(info.runs_on[SQ_DEV_CUDA], "%s", info.not_on[SQ_DEV_CUDA]);
    mdb_graph_free(g);
    mb_free(&b);

    /* bicubic as torch (a -0.75) and TensorFlow (a -0.5, exclude_outside)
     * export it: on both */
    Onnx__NodeProto *n = resize_model(&b, "cubic", 1);
    attr_str(&b, n, "coordinate_transformation_mode", "pytorch_half_pixel");
    g = expect_imported(&b);
    cr_assert_eq(mdb_model_info(g, &info, err, sizeof(err)), 0, "%s", err);
    cr_assert(info.runs_on[SQ_DEV_CPU], "%s", info.not_on[SQ_DEV_CPU]);
    cr_assert(info.runs_on[SQ_DEV_CUDA], "%s", info.not_on[SQ_DEV_CUDA]);
    mdb_graph_free(g);
    mb_free(&b);
    n = resize_model(&b, "cubic", 1);
    mb_attr_int(&b, n, "exclude_outside", 1);
    Onnx__AttributeProto *a = mb_alloc(&b, sizeof(*a));
    onnx__attribute_proto__init(a);
    a->name = mb_str(&b, "cubic_coeff_a");
    a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT;
    a->has_f = 1;
    a->f = -0.5f;
    n->attribute[n->n_attribute++] = a;
    g = expect_imported(&b);
    cr_assert_eq(mdb_model_info(g, &info, err, sizeof(err)), 0, "%s", err);
    cr_assert(info.runs_on[SQ_DEV_CPU], "%s", info.not_on[SQ_DEV_CPU]);
    cr_assert(info.runs_on[SQ_DEV_CUDA], "%s", info.not_on[SQ_DEV_CUDA]);
    mdb_graph_free(g);
    mb_free(&b);

    n = resize_model(&b, "cubic", 1);
    mb_attr_int(&b, n, "exclude_outside", 2);
    expect_refused(&b, "Resize", "up", "exclude_outside 2 (0 or 1)");
    mb_free(&b);
    /* ONNX allows tf_half_pixel_for_nn with nearest only */
    n = resize_model(&b, "cubic", 1);
    attr_str(&b, n, "coordinate_transformation_mode", "tf_half_pixel_for_nn");
    expect_refused(&b, "Resize", "up", "coordinate_transformation_mode 'tf_half_pixel_for_nn'");
    mb_free(&b);
    resize_model(&b, "lanczos", 1);
    expect_refused(&b, "Resize", "up", "mode 'lanczos' (nearest, linear and cubic only)");
    mb_free(&b);
    n = resize_model(&b, "nearest", 1);
    attr_str(&b, n, "coordinate_transformation_mode", "tf_crop_and_resize");
    expect_refused(&b, "Resize", "up", "coordinate_transformation_mode 'tf_crop_and_resize'");
    mb_free(&b);
    resize_model(&b, "linear", 2);
    expect_refused(&b, "Resize", "up", "resizes dim 1");
    mb_free(&b);
}

/* An upload learns all it lacks at once: the first node of every op the
 * worker refuses, each with its reason, every op once in the list. */
Test(runnable, every_refused_op_is_named_with_its_first_node)
{
    mb_t b;
    resize_model(&b, "lanczos", 1);
    Onnx__NodeProto *again = mb_node(&b, "Resize", (const char *[]){"x", "", "scales", NULL},
                                     (const char *[]){"y2", NULL});
    again->name = mb_str(&b, "up2");
    attr_str(&b, again, "mode", "lanczos");
    mb_init_i64(&b, "pads", 8, (const int64_t[]){0, 0, 0, -1, 0, 0, 0, 0});
    Onnx__NodeProto *pad =
        mb_node(&b, "Pad", (const char *[]){"x", "pads", NULL}, (const char *[]){"z", NULL});
    pad->name = mb_str(&b, "crop");
    mb_output(&b, "y2");
    mb_output(&b, "z");
    mdb_graph_t *g = NULL;
    mdb_import_error_t err;
    cr_assert_eq(import_builder(&b, &g, &err), SQ_UNSUPPORTED_MODEL);
    cr_assert_null(g);
    cr_assert_str_eq(err.ops, "Resize,Pad");
    cr_assert_str_eq(err.detail, "Resize node 'up': mode 'lanczos' (nearest, linear and cubic "
                                 "only); Pad node 'crop': negative pads (cropping)");
    mb_free(&b);
}

/* x[N,4,5,5] -> ConvTranspose(w [4,2,3,3]) named "up", stride 2. */
static Onnx__NodeProto *conv_transpose_model(mb_t *b, int64_t group)
{
    mb_init(b, 13);
    mb_input(b, "x", 4, (const int64_t[]){-1, 4, 5, 5});
    mb_init_f(b, "w", 4, (const int64_t[]){4, 2, 3, 3}, 0.5f, 0.0f);
    Onnx__NodeProto *n =
        mb_node(b, "ConvTranspose", (const char *[]){"x", "w", NULL}, (const char *[]){"y", NULL});
    n->name = mb_str(b, "up");
    mb_attr_ints(b, n, "strides", 2, (const int64_t[]){2, 2});
    mb_attr_int(b, n, "group", group);
    mb_output(b, "y");
    return n;
}

Test(runnable, conv_transpose_runs_in_2d_with_one_group_on_the_cpu_only)
{
    mb_t b;
    conv_transpose_model(&b, 1);
    mdb_graph_t *g = expect_imported(&b);
    mdb_model_info_t info;
    char err[256] = "";
    cr_assert_eq(mdb_model_info(g, &info, err, sizeof(err)), 0, "%s", err);
    cr_assert(info.runs_on[SQ_DEV_CPU], "%s", info.not_on[SQ_DEV_CPU]);
    cr_assert_str_eq(info.not_on[SQ_DEV_CUDA],
                     "ConvTranspose node 'up': the cuda backend has no ConvTranspose kernel");
    mdb_graph_free(g);
    mb_free(&b);

    conv_transpose_model(&b, 2);
    expect_refused(&b, "ConvTranspose", "up", "group 2");
    mb_free(&b);
    Onnx__NodeProto *n = conv_transpose_model(&b, 1);
    mb_attr_ints(&b, n, "dilations", 2, (const int64_t[]){2, 2});
    expect_refused(&b, "ConvTranspose", "up", "dilations");
    mb_free(&b);
    n = conv_transpose_model(&b, 1);
    mb_attr_ints(&b, n, "output_padding", 2, (const int64_t[]){1, 1});
    expect_refused(&b, "ConvTranspose", "up", "output_padding larger than the end pads");
    mb_free(&b);
}
