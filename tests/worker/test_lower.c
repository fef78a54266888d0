/* worker/lower.c: the lowering reads modeldb's list of what the worker
 * runs (modeldb/runnable.c), so that it refuses exactly what the importer
 * refuses, with the same reason, and runs what the importer accepts. */
#include "../modeldb/onnx_util.h"

#include <wk_exec_int.h>

#include <math.h>

/* x[N,2,3,3] concatenated n times along the channels, as an mdb graph
 * built by hand (the importer caps a node at MDB_MAX_NODE_IO inputs). */
static mdb_graph_t *concat_graph(int n)
{
    mdb_graph_t *g = mdb_graph_new();
    mdb_shape_t xs = {.rank = 4, .dims = {MDB_DIM_BATCH, 2, 3, 3}};
    int x = mdb_graph_add_tensor(g, "x", MDB_DT_FLOAT, &xs);
    int y = mdb_graph_add_tensor(g, "y", MDB_DT_FLOAT, NULL);
    mdb_graph_add_input(g, x);
    mdb_graph_add_output(g, y);
    int *ins = malloc((size_t)n * sizeof(*ins));
    for (int i = 0; i < n; i++)
        ins[i] = x;
    int idx = mdb_graph_add_node(g, MDB_OP_CONCAT, "wide", ins, n, &y, 1);
    free(ins);
    mdb_node_set_int(&g->nodes[idx], "axis", 1);
    char err[256] = "";
    cr_assert_eq(mdb_graph_toposort(g, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(mdb_graph_infer_shapes(g, err, sizeof(err)), 0, "%s", err);
    return g;
}

/* Past the 1024 sources of one oneDNN concat the lowering concatenates in
 * runs: 1100 copies of x, each in its place. */
Test(lower, a_concat_of_1100_inputs_runs_in_runs_of_1024)
{
    mdb_graph_t *g = concat_graph(1100);
    char why[512] = "";
    cr_assert_eq(mdb_graph_runnable(g, false, NULL, why, sizeof(why)), 0, "%s", why);
    wk_plan_opts_t o = wk_plan_opts_default();
    o.max_batch = 2;
    wk_plan_t *p = NULL;
    cr_assert_eq(wk_plan_create(g, &o, &p, why, sizeof(why)), 0, "%s", why);
    mdb_graph_free(g);
    cr_assert_eq(wk_plan_output_elems(p, 0), 1100 * 18);
    float x[2 * 18];
    float *y = malloc(2 * 1100 * 18 * sizeof(float));
    for (int i = 0; i < 2 * 18; i++)
        x[i] = (float)i * 0.25f - 3.0f;
    cr_assert_eq(wk_plan_run(p, 2, (const float *[]){x}, (float *[]){y}), 0, "%s",
                 wk_plan_errmsg(p));
    for (int n = 0; n < 2; n++)
        for (int k = 0; k < 1100; k++)
            for (int i = 0; i < 18; i++)
                cr_assert_eq(y[(n * 1100 + k) * 18 + i], x[n * 18 + i], "item %d copy %d [%d]", n,
                             k, i);
    free(y);
    wk_plan_free(p);
}

/* Imported from ONNX bytes like an upload, planned, run at batch 2: twelve
 * distinct inputs (x times 1..12) concatenated along the channels, each in
 * its place. DenseNet's blocks concatenate up to 49; the worker once
 * refused more than 8. */
Test(lower, a_concat_of_12_distinct_inputs_imports_and_runs)
{
    enum { K = 12 };
    mb_t b;
    mb_init(&b, 13);
    int64_t x_dims[] = {-1, 2, 3, 3};
    mb_input(&b, "x", 4, x_dims);
    char names[K][2][16];
    const char *ins[K + 1] = {0};
    for (int k = 0; k < K; k++) {
        snprintf(names[k][0], sizeof(names[k][0]), "c%d", k);
        snprintf(names[k][1], sizeof(names[k][1]), "m%d", k);
        mb_init_f(&b, names[k][0], 0, NULL, (float)(k + 1), 0.0f);
        mb_node(&b, "Mul", (const char *[]){"x", names[k][0], NULL},
                (const char *[]){names[k][1], NULL});
        ins[k] = names[k][1];
    }
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
    cr_assert_eq(wk_plan_output_elems(p, 0), K * 18);
    float x[2 * 18], y[2 * K * 18];
    for (int i = 0; i < 2 * 18; i++)
        x[i] = (float)i * 0.25f - 3.0f;
    cr_assert_eq(wk_plan_run(p, 2, (const float *[]){x}, (float *[]){y}), 0, "%s",
                 wk_plan_errmsg(p));
    for (int n = 0; n < 2; n++)
        for (int k = 0; k < K; k++)
            for (int i = 0; i < 18; i++)
                cr_assert_eq(y[(n * K + k) * 18 + i], x[n * 18 + i] * (float)(k + 1),
                             "item %d input %d [%d]", n, k, i);
    wk_plan_free(p);
}

/* torch's exports of DenseNet: AvgPool2d(2) as a Pad of nothing ahead of
 * the AveragePool (each transition), and torch.cat of a one-tensor list
 * (each block's first layer). Both are their input, as Identity is: no
 * step, so that the pool reads the conv's layout and the BatchNorm after
 * the concat its producer's. x -> Relu -> Pad(0) -> AveragePool(2) ->
 * Concat(one) -> Relu -> y: three steps, each output in its place. */
Test(lower, a_pad_of_nothing_and_a_concat_of_one_input_are_no_steps)
{
    mb_t b;
    mb_init(&b, 13);
    int64_t x_dims[] = {-1, 2, 4, 4};
    mb_input(&b, "x", 4, x_dims);
    mb_node(&b, "Relu", (const char *[]){"x", NULL}, (const char *[]){"r", NULL});
    mb_init_i64(&b, "pads", 8, (const int64_t[]){0, 0, 0, 0, 0, 0, 0, 0});
    mb_node(&b, "Pad", (const char *[]){"r", "pads", NULL}, (const char *[]){"p", NULL});
    Onnx__NodeProto *pool =
        mb_node(&b, "AveragePool", (const char *[]){"p", NULL}, (const char *[]){"a", NULL});
    mb_attr_ints(&b, pool, "kernel_shape", 2, (const int64_t[]){2, 2});
    mb_attr_ints(&b, pool, "strides", 2, (const int64_t[]){2, 2});
    Onnx__NodeProto *c =
        mb_node(&b, "Concat", (const char *[]){"a", NULL}, (const char *[]){"c", NULL});
    mb_attr_int(&b, c, "axis", 1);
    mb_node(&b, "Relu", (const char *[]){"c", NULL}, (const char *[]){"y", NULL});
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
    cr_assert_eq(p->graph->n_steps, 3, "%d steps: the Pad or the Concat is one", p->graph->n_steps);
    for (int i = 0; i < p->graph->n_steps; i++)
        cr_assert(p->graph->steps[i].kind != WK_K_PAD && p->graph->steps[i].kind != WK_K_CONCAT,
                  "step %d is a %s", i, wk_kernel_names[p->graph->steps[i].kind]);
    float x[2 * 32], y[2 * 8];
    for (int i = 0; i < 2 * 32; i++)
        x[i] = (float)(i % 7) - 2.5f;
    cr_assert_eq(wk_plan_run(p, 2, (const float *[]){x}, (float *[]){y}), 0, "%s",
                 wk_plan_errmsg(p));
    for (int n = 0; n < 2; n++)
        for (int ch = 0; ch < 2; ch++)
            for (int i = 0; i < 2; i++)
                for (int j = 0; j < 2; j++) {
                    float sum = 0;
                    for (int di = 0; di < 2; di++)
                        for (int dj = 0; dj < 2; dj++)
                            sum += fmaxf(0.0f, x[((n * 2 + ch) * 4 + 2 * i + di) * 4 + 2 * j + dj]);
                    float got = y[((n * 2 + ch) * 2 + i) * 2 + j];
                    cr_assert_float_eq(got, sum / 4, 1e-6f, "item %d channel %d (%d, %d)", n, ch, i,
                                       j);
                }
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

/* ---- mutated detector and mobile graphs ---------------------------------
 * The graphs of tests/worker/ort_graphs.py with their attributes, input
 * dims, op types and wiring changed at random (protobuf-c on onnx.proto).
 * Whatever the importer accepts, the worker must plan and run at every
 * batch size: never crash, never refuse (the importer refuses first). */

static uint64_t mut_seed = 99;

static uint32_t mut_rand(uint32_t n)
{
    mut_seed = mut_seed * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(mut_seed >> 33) % n;
}

static int64_t mut_value(int64_t orig)
{
    static const int64_t interesting[] = {-3, -2, -1, 0, 1, 2, 3, 4, 5, 9, 16, 100};
    uint32_t pick = mut_rand(16);
    if (pick < 12)
        return interesting[pick];
    return orig + (pick < 14 ? 1 : -1);
}

/* Ops of one arity that stand in for each other. */
static const char *const swap_groups[][5] = {
    {"ReduceMean", "Softmax", "Flatten", "HardSigmoid", "LeakyRelu"},
    {"Relu", "Sigmoid", "HardSwish", "Softmax", "Identity"},
    {"Add", "Sub", "Mul", "Div", "Add"},
    {"MaxPool", "AveragePool", "MaxPool", "AveragePool", "MaxPool"},
};

/* A string field pointed elsewhere, to point back before free_unpacked
 * (which frees what unpack allocated, each string once). */
typedef struct {
    char **slot;
    char *orig;
} swapped_t;

static void point(char **slot, char *to, swapped_t *undo, int *n_undo)
{
    undo[*n_undo] = (swapped_t){slot, *slot};
    (*n_undo)++;
    *slot = to;
}

static void mutate(Onnx__ModelProto *m, swapped_t *undo, int *n_undo)
{
    Onnx__GraphProto *gp = m->graph;
    Onnx__NodeProto *nd = gp->node[mut_rand((uint32_t)gp->n_node)];
    switch (mut_rand(5)) {
    case 0:
    case 1: { /* an int attribute */
        if (nd->n_attribute == 0)
            return;
        Onnx__AttributeProto *a = nd->attribute[mut_rand((uint32_t)nd->n_attribute)];
        if (a->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT)
            a->i = mut_value(a->i);
        else if (a->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS && a->n_ints > 0) {
            size_t at = mut_rand((uint32_t)a->n_ints);
            a->ints[at] = mut_value(a->ints[at]);
        }
        return;
    }
    case 2: { /* an input dim (not the batch) */
        Onnx__TensorShapeProto *sp = gp->input[0]->type->tensor_type->shape;
        if (sp->n_dim < 2)
            return;
        Onnx__TensorShapeProto__Dimension *d = sp->dim[1 + mut_rand((uint32_t)sp->n_dim - 1)];
        if (d->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE)
            d->dim_value = 1 + mut_rand(20);
        return;
    }
    case 3: /* another op of the same arity */
        for (size_t g = 0; g < sizeof(swap_groups) / sizeof(swap_groups[0]); g++)
            for (int k = 0; k < 5; k++)
                if (strcmp(nd->op_type, swap_groups[g][k]) == 0) {
                    point(&nd->op_type, (char *)swap_groups[g][mut_rand(5)], undo, n_undo);
                    return;
                }
        return;
    default: { /* rewire a data input to another node's output or the input */
        if (nd->n_input == 0)
            return;
        Onnx__NodeProto *from = gp->node[mut_rand((uint32_t)gp->n_node)];
        char *name = from->n_output > 0 && mut_rand(4) ? from->output[0] : gp->input[0]->name;
        point(&nd->input[0], name, undo, n_undo);
        return;
    }
    }
}

Test(lower, mutated_graphs_the_importer_accepts_run_at_every_batch, .timeout = 600)
{
    static const char *const seeds[] = {
        "depthwise", "nhwc", "pads", "ssd_heads", "constant_of_shape_fixed", "concat8", "heads"};
    const char *dir = getenv("SQUISH_ORT_GRAPHS");
    cr_assert_not_null(dir, "SQUISH_ORT_GRAPHS is not set");
    int accepted = 0, refused = 0;
    for (int iter = 0; iter < 280; iter++) {
        char path[1024];
        size_t len;
        snprintf(path, sizeof(path), "%s/%s.onnx", dir, seeds[iter % 7]);
        uint8_t *bytes = read_file(path, &len);
        cr_assert_not_null(bytes, "missing %s (made by tests/worker/ort_graphs.py)", path);
        Onnx__ModelProto *m = onnx__model_proto__unpack(NULL, len, bytes);
        free(bytes);
        cr_assert_not_null(m);
        swapped_t undo[4];
        int n_undo = 0;
        for (int k = 1 + (int)mut_rand(3); k > 0; k--)
            mutate(m, undo, &n_undo);
        len = onnx__model_proto__get_packed_size(m);
        bytes = malloc(len + 1);
        onnx__model_proto__pack(m, bytes);
        while (n_undo > 0) {
            n_undo--;
            *undo[n_undo].slot = undo[n_undo].orig;
        }
        onnx__model_proto__free_unpacked(m, NULL);
        mdb_graph_t *g = NULL;
        mdb_import_error_t err;
        int rc = mdb_onnx_import(bytes, len, &g, &err);
        free(bytes);
        if (rc != 0) {
            refused++;
            cr_assert(rc == SQ_BAD_MODEL || rc == SQ_UNSUPPORTED_MODEL, "rc %d", rc);
            continue;
        }
        accepted++;
        wk_plan_opts_t o = wk_plan_opts_default();
        o.max_batch = 3;
        wk_plan_t *p = NULL;
        char why[512] = "";
        rc = wk_plan_create(g, &o, &p, why, sizeof(why));
        cr_assert_eq(rc, 0, "iteration %d (%s): the importer accepted what the worker refuses: %s",
                     iter, seeds[iter % 7], why);
        int n_out = wk_plan_n_outputs(p), max_batch = wk_plan_max_batch(p);
        int64_t in_elems = wk_plan_input_elems(p, 0) * max_batch;
        float *in = malloc((size_t)in_elems * sizeof(float) + 4);
        for (int64_t i = 0; i < in_elems; i++)
            in[i] = (float)mut_rand(2000) / 1000.0f - 1.0f;
        float *outs[16];
        for (int i = 0; i < n_out; i++)
            outs[i] = malloc((size_t)(wk_plan_output_elems(p, i) * max_batch) * sizeof(float) + 4);
        for (int batch = 1; batch <= max_batch; batch++)
            cr_assert_eq(wk_plan_run(p, batch, (const float *[]){in}, outs), 0,
                         "iteration %d batch %d: %s", iter, batch, wk_plan_errmsg(p));
        for (int i = 0; i < n_out; i++)
            free(outs[i]);
        free(in);
        wk_plan_free(p);
        mdb_graph_free(g);
    }
    cr_assert_gt(accepted, 20, "accepted %d, refused %d", accepted, refused);
    cr_assert_gt(refused, 0);
}

/* What torch's chain computes for x[n][4][6], the means over axis 1 or 2. */
static void ln_gelu_reference(const float *x, int n, int axis, float eps, float sqrt2, float *z)
{
    int len = axis == 2 ? 6 : 4;
    for (int item = 0; item < n; item++) {
        const float *xi = x + item * 24;
        float d[24], var[24], mean[24];
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 6; j++) {
                double sum = 0;
                for (int k = 0; k < len; k++)
                    sum += axis == 2 ? xi[i * 6 + k] : xi[k * 6 + j];
                mean[i * 6 + j] = (float)(sum / len);
            }
        for (int e = 0; e < 24; e++)
            d[e] = xi[e] - mean[e];
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 6; j++) {
                double sum = 0;
                for (int k = 0; k < len; k++) {
                    float dk = axis == 2 ? d[i * 6 + k] : d[k * 6 + j];
                    sum += (double)dk * dk;
                }
                var[i * 6 + j] = (float)(sum / len);
            }
        for (int e = 0; e < 24; e++) {
            int j = e % 6;
            float y = d[e] / sqrtf(var[e] + eps) * (0.5f + 0.25f * (float)j) +
                      (-0.5f + 0.125f * (float)j);
            z[item * 24 + e] = y * (erff(y / sqrt2) + 1.0f) * 0.5f;
        }
    }
}

static wk_plan_t *import_and_plan(mb_t *b, int max_batch)
{
    size_t len;
    uint8_t *bytes = mb_pack(b, &len);
    mdb_graph_t *g = NULL;
    mdb_import_error_t err;
    cr_assert_eq(mdb_onnx_import(bytes, len, &g, &err), 0, "%s", err.detail);
    free(bytes);
    wk_plan_opts_t o = wk_plan_opts_default();
    o.max_batch = max_batch;
    wk_plan_t *p = NULL;
    char why[512];
    cr_assert_eq(wk_plan_create(g, &o, &p, why, sizeof(why)), 0, "%s", why);
    mdb_graph_free(g);
    return p;
}

/* The fused LayerNormalization and Gelu (oneDNN's layer normalization and
 * gelu_erf), and the same chain left unfused (Pow, Sqrt, Erf one by one),
 * each against a plain C reference at batch 2. */
Test(lower, torch_layer_norm_and_gelu_match_a_reference_fused_or_not)
{
    struct {
        float sqrt2;
        int64_t axis;
    } cases[] = {{1.4142135381698608f, -1}, {1.5f, 1}};
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        mb_t b;
        mb_ln_gelu(&b, 1e-5f, cases[c].sqrt2, cases[c].axis);
        wk_plan_t *p = import_and_plan(&b, 2);
        mb_free(&b);
        float x[48], z[48], want[48];
        for (int i = 0; i < 48; i++)
            x[i] = sinf((float)i * 0.7f) * 2.0f + (float)(i % 5) * 0.3f;
        cr_assert_eq(wk_plan_run(p, 2, (const float *[]){x}, (float *[]){z}), 0, "%s",
                     wk_plan_errmsg(p));
        ln_gelu_reference(x, 2, cases[c].axis < 0 ? 2 : 1, 1e-5f, cases[c].sqrt2, want);
        for (int i = 0; i < 48; i++)
            cr_assert_float_eq(z[i], want[i], 1e-4f, "case %zu [%d]: %g, want %g", c, i, z[i],
                               want[i]);
        wk_plan_free(p);
    }
}

/* ViT's class token: a constant expanded over the batch (the shape from
 * Shape(x), N symbolic), and x[:, 1] picked by a scalar Gather. */
Test(lower, expand_over_the_batch_and_a_scalar_gather_run)
{
    mb_t b;
    mb_init(&b, 13);
    int64_t x_dims[] = {-1, 2, 3}, c_dims[] = {1, 1, 3}, one = 1;
    mb_input(&b, "x", 3, x_dims);
    mb_init_f(&b, "c", 3, c_dims, 10.0f, 1.0f);
    mb_init_i64(&b, "idx", 1, &one)->n_dims = 0;
    mb_node(&b, "Shape", (const char *[]){"x", NULL}, (const char *[]){"sx", NULL});
    mb_node(&b, "Expand", (const char *[]){"c", "sx", NULL}, (const char *[]){"t", NULL});
    mb_node(&b, "Add", (const char *[]){"x", "t", NULL}, (const char *[]){"y", NULL});
    Onnx__NodeProto *gn =
        mb_node(&b, "Gather", (const char *[]){"y", "idx", NULL}, (const char *[]){"g", NULL});
    mb_attr_int(&b, gn, "axis", 1);
    mb_output(&b, "g");
    wk_plan_t *p = import_and_plan(&b, 3);
    mb_free(&b);
    cr_assert_eq(wk_plan_output_elems(p, 0), 3);
    float x[18], g[9];
    for (int i = 0; i < 18; i++)
        x[i] = (float)i;
    cr_assert_eq(wk_plan_run(p, 3, (const float *[]){x}, (float *[]){g}), 0, "%s",
                 wk_plan_errmsg(p));
    for (int n = 0; n < 3; n++)
        for (int k = 0; k < 3; k++)
            cr_assert_eq(g[n * 3 + k], x[n * 6 + 3 + k] + 10.0f + (float)k, "item %d [%d]: %g", n,
                         k, g[n * 3 + k]);
    wk_plan_free(p);
}

/* A constant that broadcasts in a middle axis (Swin's attention mask,
 * [1, 64, 1, 49, 49] over [1, 64, 3, 49, 49]) is expanded at lowering
 * for oneDNN's jit binary; the sum is the same. */
Test(lower, a_constant_broadcast_in_a_middle_axis_adds_right)
{
    mb_t b;
    mb_init(&b, 13);
    int64_t x_dims[] = {-1, 4, 3, 5}, c_dims[] = {1, 4, 1, 5};
    mb_input(&b, "x", 4, x_dims);
    mb_init_f(&b, "c", 4, c_dims, -2.0f, 0.5f);
    mb_node(&b, "Add", (const char *[]){"x", "c", NULL}, (const char *[]){"y", NULL});
    mb_output(&b, "y");
    wk_plan_t *p = import_and_plan(&b, 2);
    mb_free(&b);
    float x[120], y[120];
    for (int i = 0; i < 120; i++)
        x[i] = (float)i * 0.1f;
    cr_assert_eq(wk_plan_run(p, 2, (const float *[]){x}, (float *[]){y}), 0, "%s",
                 wk_plan_errmsg(p));
    for (int n = 0; n < 2; n++)
        for (int ch = 0; ch < 4; ch++)
            for (int h = 0; h < 3; h++)
                for (int w = 0; w < 5; w++) {
                    int i = ((n * 4 + ch) * 3 + h) * 5 + w;
                    float want = x[i] - 2.0f + 0.5f * (float)(ch * 5 + w);
                    cr_assert_float_eq(y[i], want, 1e-6f, "[%d]: %g, want %g", i, y[i], want);
                }
    wk_plan_free(p);
}

/* MaxViT's attention as Einsum: q k^T ("BHID,BHJD->BHIJ", B transposed
 * first) then attn v ("BHIJ,BHJD->BHID"), a Tanh between, against loops;
 * another equation is refused at import, naming it. */
Test(lower, einsum_batched_products_and_tanh_match_loops)
{
    mb_t b;
    mb_init(&b, 13);
    int64_t q_dims[] = {-1, 2, 3, 4}, k_dims[] = {1, 2, 5, 4}, v_dims[] = {1, 2, 5, 4};
    mb_input(&b, "q", 4, q_dims);
    mb_init_f(&b, "k", 4, k_dims, -1.0f, 0.05f);
    mb_init_f(&b, "v", 4, v_dims, 0.5f, -0.03f);
    Onnx__NodeProto *e1 =
        mb_node(&b, "Einsum", (const char *[]){"q", "k", NULL}, (const char *[]){"s", NULL});
    Onnx__NodeProto *e2 =
        mb_node(&b, "Einsum", (const char *[]){"t", "v", NULL}, (const char *[]){"o", NULL});
    mb_node(&b, "Tanh", (const char *[]){"s", NULL}, (const char *[]){"t", NULL});
    Onnx__NodeProto *es[2] = {e1, e2};
    const char *eqs[2] = {"B H I D, B H J D -> B H I J", "BHIJ,BHJD->BHID"};
    for (int i = 0; i < 2; i++) {
        Onnx__AttributeProto *a = mb_alloc(&b, sizeof(*a));
        onnx__attribute_proto__init(a);
        a->name = mb_str(&b, "equation");
        a->has_type = 1;
        a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING;
        a->has_s = 1;
        a->s.data = (uint8_t *)mb_str(&b, eqs[i]);
        a->s.len = strlen(eqs[i]);
        es[i]->attribute[es[i]->n_attribute++] = a;
    }
    mb_output(&b, "o");
    /* Batch 1: the constants' leading dim is 1, as the file fixes it. */
    b.inputs[0]->type->tensor_type->shape->dim[0]->value_case =
        ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
    b.inputs[0]->type->tensor_type->shape->dim[0]->dim_value = 1;
    wk_plan_t *p = import_and_plan(&b, 1);
    float q[24], o[24], want[24];
    for (int i = 0; i < 24; i++)
        q[i] = cosf((float)i) * 0.8f;
    cr_assert_eq(wk_plan_run(p, 1, (const float *[]){q}, (float *[]){o}), 0, "%s",
                 wk_plan_errmsg(p));
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < 3; i++)
            for (int d = 0; d < 4; d++) {
                double acc = 0;
                for (int j = 0; j < 5; j++) {
                    double sc = 0;
                    for (int e = 0; e < 4; e++)
                        sc += (double)q[(h * 3 + i) * 4 + e] *
                              (-1.0 + 0.05 * (double)((h * 5 + j) * 4 + e));
                    acc += tanh(sc) * (0.5 - 0.03 * (double)((h * 5 + j) * 4 + d));
                }
                want[(h * 3 + i) * 4 + d] = (float)acc;
            }
    for (int i = 0; i < 24; i++)
        cr_assert_float_eq(o[i], want[i], 1e-4f, "[%d]: %g, want %g", i, o[i], want[i]);
    wk_plan_free(p);
    /* A contraction over two labels is not a matrix product. */
    es[0]->attribute[0]->s.data = (uint8_t *)mb_str(&b, "BHID,BHJD->BHI");
    es[0]->attribute[0]->s.len = strlen("BHID,BHJD->BHI");
    size_t len;
    uint8_t *bytes = mb_pack(&b, &len);
    mdb_graph_t *g = NULL;
    mdb_import_error_t err;
    cr_assert_eq(mdb_onnx_import(bytes, len, &g, &err), SQ_UNSUPPORTED_MODEL);
    cr_assert_not_null(strstr(err.detail, "BHID,BHJD->BHI"), "%s", err.detail);
    free(bytes);
    mb_free(&b);
}

/* A model lowered for the cuda backend passes the op table's rules for
 * cuda (modeldb/runnable.c) and is refused, before any device work, with
 * the reason the importer gives for that device kind; the cpu lowers it. */
Test(lower, the_cuda_lowering_refuses_what_the_importer_says_cuda_cannot_run)
{
    mdb_graph_t *g = mdb_graph_new();
    mdb_shape_t xs = {.rank = 4, .dims = {MDB_DIM_BATCH, 2, 4, 4}};
    mdb_shape_t ws = {.rank = 4, .dims = {2, 2, 3, 3}};
    int x = mdb_graph_add_tensor(g, "x", MDB_DT_FLOAT, &xs);
    int w = mdb_graph_add_tensor(g, "w", MDB_DT_FLOAT, &ws);
    float *wd = calloc(36, sizeof(float));
    mdb_graph_set_data(g, w, wd, 36 * sizeof(float));
    int y = mdb_graph_add_tensor(g, "y", MDB_DT_FLOAT, NULL);
    mdb_graph_add_input(g, x);
    mdb_graph_add_output(g, y);
    int idx = mdb_graph_add_node(g, MDB_OP_CONV, "c1", (const int[]){x, w}, 2, &y, 1);
    mdb_node_t *n = &g->nodes[idx];
    mdb_node_set_ints(n, "kernel_shape", (const int64_t[]){3, 3}, 2);
    mdb_node_set_ints(n, "strides", (const int64_t[]){1, 1}, 2);
    mdb_node_set_ints(n, "dilations", (const int64_t[]){1, 1}, 2);
    mdb_node_set_ints(n, "pads", (const int64_t[]){0, 0, 1, 1}, 4);
    mdb_node_set_int(n, "group", 1);
    char why[512] = "", err[256] = "";
    cr_assert_eq(mdb_graph_toposort(g, why, sizeof(why)), 0, "%s", why);
    cr_assert_eq(mdb_graph_infer_shapes(g, why, sizeof(why)), 0, "%s", why);
    cr_assert_eq(mdb_graph_runnable_on(g, SQ_DEV_CUDA, false, NULL, err, sizeof(err)),
                 SQ_UNSUPPORTED_MODEL);
    wk_plan_opts_t o = wk_plan_opts_default();
    o.max_batch = 2;
    o.backend = SQ_DEV_CUDA;
    wk_plan_t *p = NULL;
    cr_assert_eq(wk_plan_create(g, &o, &p, why, sizeof(why)), SQ_UNSUPPORTED_MODEL);
    cr_assert_null(p);
    cr_assert_str_eq(why, err);
    cr_assert_str_eq(why, "Conv node 'c1': convolution with asymmetric pads");
    o.backend = SQ_DEV_CPU;
    cr_assert_eq(wk_plan_create(g, &o, &p, why, sizeof(why)), 0, "%s", why);
    wk_plan_free(p);
    mdb_graph_free(g);
}

/* The lowering's table has an entry for every op the worker runs, and
 * none for the import-time ops (folded away before it sees a graph). */
Test(lower, every_runtime_op_has_a_lowering)
{
    for (int op = 0; op < MDB_OP_COUNT; op++)
        cr_assert_eq(wk__op_lowers(op), mdb_op_is_runtime((mdb_op_t)op), "%s",
                     mdb_op_name((mdb_op_t)op));
}
