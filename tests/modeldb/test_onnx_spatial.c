/* ONNX import of the ops over spatial sizes that detectors and segmenters
 * add: Resize (scales or sizes folded into attributes, opset by opset, and
 * what is refused) and ConvTranspose (its output shapes). */
#include "onnx_util.h"

#include <criterion/criterion.h>
#include <mdb_graph.h>
#include <sq.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int import_builder(mb_t *b, mdb_graph_t **g, mdb_import_error_t *err)
{
    size_t len;
    uint8_t *bytes = mb_pack(b, &len);
    int rc = mdb_onnx_import(bytes, len, g, err);
    free(bytes);
    return rc;
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

/* A float initializer of n values. */
static void init_floats(mb_t *b, const char *name, int n, const float *vals)
{
    Onnx__TensorProto *t = mb_init_f(b, name, 1, (const int64_t[]){n}, 0, 0);
    if (n > 0)
        memcpy(t->raw_data.data, vals, sizeof(float) * (size_t)n);
}

/* x[N,4,5,6] -> Resize(inputs) -> y at opset. */
static Onnx__NodeProto *resize_model(mb_t *b, int64_t opset, const char *const *ins)
{
    mb_init(b, opset);
    mb_input(b, "x", 4, (const int64_t[]){-1, 4, 5, 6});
    Onnx__NodeProto *n = mb_node(b, "Resize", ins, (const char *[]){"y", NULL});
    mb_output(b, "y");
    return n;
}

static void expect_floats(const mdb_node_t *n, const char *name, int count, const float *want)
{
    size_t got = 0;
    const float *v = mdb_node_floats(n, name, &got);
    cr_assert_not_null(v, "no %s", name);
    cr_assert_eq(got, (size_t)count, "%s: %zu values", name, got);
    for (int i = 0; i < count; i++)
        cr_assert_float_eq(v[i], want[i], 1e-7, "%s[%d] %g, want %g", name, i, v[i], want[i]);
}

static void expect_ints(const mdb_node_t *n, const char *name, int count, const int64_t *want)
{
    size_t got = 0;
    const int64_t *v = mdb_node_ints(n, name, &got);
    cr_assert_not_null(v, "no %s", name);
    cr_assert_eq(got, (size_t)count, "%s: %zu values", name, got);
    for (int i = 0; i < count; i++)
        cr_assert_eq(v[i], want[i], "%s[%d] %lld, want %lld", name, i, (long long)v[i],
                     (long long)want[i]);
}

/* Resize's scales (opset 13, and opset 10's second input) and sizes (from
 * the Shape of a map with a symbolic batch, as torch's F.interpolate(size=)
 * exports them at opset 11) fold into the attributes scales and sizes; the
 * output is floor(in * scale), or the sizes; ONNX's defaults are filled in. */
Test(onnx_import, resize_scales_and_sizes_fold_into_attributes)
{
    mb_t b;
    mdb_graph_t *g = NULL;
    mdb_import_error_t err;
    Onnx__NodeProto *n = resize_model(&b, 13, (const char *[]){"x", "roi", "scales", NULL});
    init_floats(&b, "roi", 0, NULL);
    init_floats(&b, "scales", 4, (const float[]){1, 1, 2, 1.5f});
    cr_assert_eq(import_builder(&b, &g, &err), 0, "%s", err.detail);
    cr_assert_eq(g->n_nodes, 1);
    const mdb_node_t *r = &g->nodes[0];
    cr_assert_eq(r->op, MDB_OP_RESIZE);
    cr_assert_eq(r->n_inputs, 1);
    expect_shape(&g->tensors[g->outputs[0]].shape, 4, (const int64_t[]){MDB_DIM_BATCH, 4, 10, 9},
                 "y");
    expect_floats(r, "scales", 4, (const float[]){1, 1, 2, 1.5f});
    expect_ints(r, "sizes", 4, (const int64_t[]){MDB_DIM_BATCH, 4, 10, 9});
    cr_assert_str_eq(mdb_node_string(r, "mode", ""), "nearest");
    cr_assert_str_eq(mdb_node_string(r, "coordinate_transformation_mode", ""), "half_pixel");
    cr_assert_str_eq(mdb_node_string(r, "nearest_mode", ""), "round_prefer_floor");
    mdb_graph_free(g);
    mb_free(&b);

    /* opset 11: sizes = Concat(Shape(x)[0:2], [7, 3]); scales empty */
    n = resize_model(&b, 11, (const char *[]){"x", "roi", "noscales", "sizes", NULL});
    attr_str(&b, n, "mode", "linear");
    attr_str(&b, n, "coordinate_transformation_mode", "pytorch_half_pixel");
    init_floats(&b, "roi", 0, NULL);
    init_floats(&b, "noscales", 0, NULL);
    mb_init_i64(&b, "zero", 1, (const int64_t[]){0});
    mb_init_i64(&b, "two", 1, (const int64_t[]){2});
    mb_init_i64(&b, "hw", 2, (const int64_t[]){7, 3});
    mb_node(&b, "Shape", (const char *[]){"x", NULL}, (const char *[]){"shape", NULL});
    mb_node(&b, "Slice", (const char *[]){"shape", "zero", "two", NULL},
            (const char *[]){"nc", NULL});
    Onnx__NodeProto *cat =
        mb_node(&b, "Concat", (const char *[]){"nc", "hw", NULL}, (const char *[]){"sizes", NULL});
    mb_attr_int(&b, cat, "axis", 0);
    cr_assert_eq(import_builder(&b, &g, &err), 0, "%s", err.detail);
    cr_assert_eq(g->n_nodes, 1, "Shape, Slice and Concat fold away");
    r = &g->nodes[0];
    cr_assert_eq(r->n_inputs, 1);
    expect_shape(&g->tensors[g->outputs[0]].shape, 4, (const int64_t[]){MDB_DIM_BATCH, 4, 7, 3},
                 "y");
    expect_floats(r, "scales", 4, (const float[]){1, 1, 7.0f / 5.0f, 3.0f / 6.0f});
    expect_ints(r, "sizes", 4, (const int64_t[]){MDB_DIM_BATCH, 4, 7, 3});
    cr_assert_str_eq(mdb_node_string(r, "mode", ""), "linear");
    cr_assert_str_eq(mdb_node_string(r, "coordinate_transformation_mode", ""),
                     "pytorch_half_pixel");
    mdb_graph_free(g);
    mb_free(&b);

    /* opset 10: X, scales; x / scale, truncated */
    resize_model(&b, 10, (const char *[]){"x", "scales", NULL});
    init_floats(&b, "scales", 4, (const float[]){1, 1, 2, 2});
    cr_assert_eq(import_builder(&b, &g, &err), 0, "%s", err.detail);
    r = &g->nodes[0];
    expect_shape(&g->tensors[g->outputs[0]].shape, 4, (const int64_t[]){MDB_DIM_BATCH, 4, 10, 12},
                 "y");
    cr_assert_str_eq(mdb_node_string(r, "coordinate_transformation_mode", ""), "asymmetric");
    cr_assert_str_eq(mdb_node_string(r, "nearest_mode", ""), "floor");
    mdb_graph_free(g);
    mb_free(&b);
}

Test(onnx_import, resize_without_constant_scales_or_of_the_batch_or_cubic_at_opset_10_is_refused)
{
    mb_t b;
    mdb_graph_t *g = NULL;
    mdb_import_error_t err;
    /* the batch resized */
    resize_model(&b, 13, (const char *[]){"x", "", "scales", NULL});
    init_floats(&b, "scales", 4, (const float[]){2, 1, 1, 1});
    cr_assert_eq(import_builder(&b, &g, &err), SQ_UNSUPPORTED_MODEL);
    cr_assert_not_null(strstr(err.detail, "resizes the batch"), "%s", err.detail);
    mb_free(&b);
    /* neither scales nor sizes */
    resize_model(&b, 13, (const char *[]){"x", "", "scales", NULL});
    init_floats(&b, "scales", 0, NULL);
    cr_assert_eq(import_builder(&b, &g, &err), SQ_BAD_MODEL);
    cr_assert_not_null(strstr(err.detail, "neither scales nor sizes"), "%s", err.detail);
    mb_free(&b);
    /* scales of the wrong rank */
    resize_model(&b, 13, (const char *[]){"x", "", "scales", NULL});
    init_floats(&b, "scales", 2, (const float[]){2, 2});
    cr_assert_eq(import_builder(&b, &g, &err), SQ_BAD_MODEL);
    mb_free(&b);
    /* opset 10's Resize has no cubic mode (opset 11 on: accepted, its
     * cubic_coeff_a and exclude_outside kept for the worker) */
    Onnx__NodeProto *n = resize_model(&b, 10, (const char *[]){"x", "scales", NULL});
    init_floats(&b, "scales", 4, (const float[]){1, 1, 2, 2});
    attr_str(&b, n, "mode", "cubic");
    cr_assert_eq(import_builder(&b, &g, &err), SQ_BAD_MODEL);
    cr_assert_str_eq(err.detail,
                     "Resize 'Resize': mode 'cubic' (nearest or linear at this opset) (opset 10)");
    mb_free(&b);
    n = resize_model(&b, 11, (const char *[]){"x", "", "scales", NULL});
    init_floats(&b, "scales", 4, (const float[]){1, 1, 2, 2});
    attr_str(&b, n, "mode", "cubic");
    mb_attr_int(&b, n, "exclude_outside", 1);
    cr_assert_eq(import_builder(&b, &g, &err), 0, "%s", err.detail);
    cr_assert_str_eq(mdb_node_string(&g->nodes[0], "mode", ""), "cubic");
    cr_assert_eq(mdb_node_int(&g->nodes[0], "exclude_outside", 0), 1);
    mdb_graph_free(g);
    g = NULL;
    mb_free(&b);
    /* scales computed from the input */
    resize_model(&b, 13, (const char *[]){"x", "", "s", NULL});
    mb_node(&b, "Shape", (const char *[]){"x", NULL}, (const char *[]){"sh", NULL});
    mb_node(&b, "Cast", (const char *[]){"x", NULL}, (const char *[]){"s", NULL});
    cr_assert_lt(import_builder(&b, &g, &err), 0);
    cr_assert_null(g);
    mb_free(&b);
}

/* ConvTranspose: out = stride (in - 1) + output_padding + k - pads, the
 * channels W's second dim; defaults filled in; output_shape refused. */
Test(onnx_import, conv_transpose_shapes_follow_strides_pads_and_output_padding)
{
    mb_t b;
    mdb_graph_t *g = NULL;
    mdb_import_error_t err;
    mb_init(&b, 13);
    mb_input(&b, "x", 4, (const int64_t[]){-1, 3, 5, 5});
    mb_init_f(&b, "w", 4, (const int64_t[]){3, 2, 3, 3}, 0.1f, 0.01f);
    mb_init_f(&b, "bias", 1, (const int64_t[]){2}, 0.5f, 0);
    Onnx__NodeProto *n = mb_node(&b, "ConvTranspose", (const char *[]){"x", "w", "bias", NULL},
                                 (const char *[]){"y", NULL});
    mb_attr_ints(&b, n, "strides", 2, (const int64_t[]){2, 2});
    mb_attr_ints(&b, n, "pads", 4, (const int64_t[]){1, 1, 1, 1});
    mb_attr_ints(&b, n, "output_padding", 2, (const int64_t[]){1, 1});
    mb_output(&b, "y");
    cr_assert_eq(import_builder(&b, &g, &err), 0, "%s", err.detail);
    cr_assert_eq(g->n_nodes, 1);
    const mdb_node_t *c = &g->nodes[0];
    cr_assert_eq(c->op, MDB_OP_CONV_TRANSPOSE);
    expect_shape(&g->tensors[g->outputs[0]].shape, 4, (const int64_t[]){MDB_DIM_BATCH, 2, 10, 10},
                 "y");
    expect_ints(c, "kernel_shape", 2, (const int64_t[]){3, 3});
    expect_ints(c, "dilations", 2, (const int64_t[]){1, 1});
    cr_assert_eq(mdb_node_int(c, "group", 0), 1);
    mdb_graph_free(g);
    mb_free(&b);

    /* no attributes: stride 1, no pads; k 2 grows 5 to 6 */
    mb_init(&b, 13);
    mb_input(&b, "x", 4, (const int64_t[]){-1, 3, 5, 5});
    mb_init_f(&b, "w", 4, (const int64_t[]){3, 4, 2, 2}, 0.1f, 0.01f);
    mb_node(&b, "ConvTranspose", (const char *[]){"x", "w", NULL}, (const char *[]){"y", NULL});
    mb_output(&b, "y");
    cr_assert_eq(import_builder(&b, &g, &err), 0, "%s", err.detail);
    expect_shape(&g->tensors[g->outputs[0]].shape, 4, (const int64_t[]){MDB_DIM_BATCH, 4, 6, 6},
                 "y");
    expect_ints(&g->nodes[0], "pads", 4, (const int64_t[]){0, 0, 0, 0});
    expect_ints(&g->nodes[0], "output_padding", 2, (const int64_t[]){0, 0});
    mdb_graph_free(g);
    mb_free(&b);

    /* output_shape: refused; a bias of the wrong size: malformed */
    mb_init(&b, 13);
    mb_input(&b, "x", 4, (const int64_t[]){-1, 3, 5, 5});
    mb_init_f(&b, "w", 4, (const int64_t[]){3, 4, 2, 2}, 0.1f, 0.01f);
    n = mb_node(&b, "ConvTranspose", (const char *[]){"x", "w", NULL}, (const char *[]){"y", NULL});
    mb_attr_ints(&b, n, "output_shape", 2, (const int64_t[]){6, 6});
    mb_output(&b, "y");
    cr_assert_eq(import_builder(&b, &g, &err), SQ_UNSUPPORTED_MODEL);
    cr_assert_not_null(strstr(err.detail, "output_shape"), "%s", err.detail);
    mb_free(&b);
    mb_init(&b, 13);
    mb_input(&b, "x", 4, (const int64_t[]){-1, 3, 5, 5});
    mb_init_f(&b, "w", 4, (const int64_t[]){3, 4, 2, 2}, 0.1f, 0.01f);
    mb_init_f(&b, "bias", 1, (const int64_t[]){3}, 0.5f, 0);
    mb_node(&b, "ConvTranspose", (const char *[]){"x", "w", "bias", NULL},
            (const char *[]){"y", NULL});
    mb_output(&b, "y");
    cr_assert_eq(import_builder(&b, &g, &err), SQ_BAD_MODEL);
    mb_free(&b);
}
