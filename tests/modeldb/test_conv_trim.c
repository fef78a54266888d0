/* modeldb/conv_trim.c: a Conv's taps that read only padding are dropped at
 * import (DeepLabV3's atrous convs on a small map become 1x1 convs), the
 * kernel, pads and weights cut to the taps that read the input; a conv
 * whose every tap reads it is left as it is. That the trimmed graph
 * computes what torch does is tests/worker/test_segmenters.c. */
#include "onnx_util.h"

/* x[N,C,h,w] -> Conv(w [4,C,kh,kw] = 0, 1, 2, ..., dilations, pads) -> y. */
static mdb_graph_t *import_conv(int64_t c, int64_t h, int64_t w, int64_t kh, int64_t kw,
                                const int64_t *dilations, const int64_t *pads,
                                const int64_t *strides)
{
    mb_t b;
    mb_init(&b, 17);
    int64_t x_dims[] = {-1, c, h, w}, w_dims[] = {4, c, kh, kw};
    mb_input(&b, "x", 4, x_dims);
    mb_init_f(&b, "w", 4, w_dims, 0.0f, 1.0f);
    Onnx__NodeProto *conv =
        mb_node(&b, "Conv", (const char *[]){"x", "w", NULL}, (const char *[]){"y", NULL});
    mb_attr_ints(&b, conv, "dilations", 2, dilations);
    mb_attr_ints(&b, conv, "pads", 4, pads);
    if (strides)
        mb_attr_ints(&b, conv, "strides", 2, strides);
    mb_output(&b, "y");
    size_t len;
    uint8_t *bytes = mb_pack(&b, &len);
    mdb_graph_t *g = NULL;
    mdb_import_error_t err;
    cr_assert_eq(mdb_onnx_import(bytes, len, &g, &err), 0, "%s", err.detail);
    free(bytes);
    mb_free(&b);
    cr_assert_eq(g->n_nodes, 1);
    return g;
}

static void expect_attr(const mdb_node_t *n, const char *name, int count, const int64_t *want)
{
    size_t got_n = 0;
    const int64_t *got = mdb_node_ints(n, name, &got_n);
    cr_assert_not_null(got, "%s missing", name);
    cr_assert_eq((int)got_n, count, "%s: %zu values", name, got_n);
    for (int i = 0; i < count; i++)
        cr_assert_eq(got[i], want[i], "%s[%d] = %lld, not %lld", name, i, (long long)got[i],
                     (long long)want[i]);
}

/* A 3x3 conv, stride 2, pads 1, on c channels of a hw x hw map: imported
 * as it was (its kernel, pads and weights). */
static void expect_a_3x3_stride_2_conv_left_alone(int64_t c, int64_t hw)
{
    mdb_graph_t *g = import_conv(c, hw, hw, 3, 3, (const int64_t[]){1, 1},
                                 (const int64_t[]){1, 1, 1, 1}, (const int64_t[]){2, 2});
    const mdb_node_t *n = &g->nodes[0];
    expect_attr(n, "kernel_shape", 2, (const int64_t[]){3, 3});
    expect_attr(n, "pads", 4, (const int64_t[]){1, 1, 1, 1});
    cr_assert_str_eq(g->tensors[n->inputs[1]].name, "w");
    mdb_graph_free(g);
}

Test(conv_trim, an_atrous_conv_on_a_map_smaller_than_its_dilation_becomes_a_1x1_conv)
{
    /* DeepLabV3's ASPP branch: 3x3, dilation 12, pads 12, on a 10x10 map. */
    mdb_graph_t *g = import_conv(2, 10, 10, 3, 3, (const int64_t[]){12, 12},
                                 (const int64_t[]){12, 12, 12, 12}, NULL);
    const mdb_node_t *n = &g->nodes[0];
    expect_attr(n, "kernel_shape", 2, (const int64_t[]){1, 1});
    expect_attr(n, "dilations", 2, (const int64_t[]){1, 1});
    expect_attr(n, "pads", 4, (const int64_t[]){0, 0, 0, 0});
    const mdb_tensor_t *w = &g->tensors[n->inputs[1]];
    int64_t dims[] = {4, 2, 1, 1};
    expect_shape(&w->shape, 4, dims, "trimmed weights");
    /* Filter f's centre tap of the old [4, 2, 3, 3] weights: 9 f + 4. */
    const float *v = w->data;
    for (int f = 0; f < 8; f++)
        cr_assert_float_eq(v[f], (float)(9 * f + 4), 0, "filter %d: %g", f, v[f]);
    int64_t y_dims[] = {MDB_DIM_BATCH, 4, 10, 10};
    expect_shape(&g->tensors[n->outputs[0]].shape, 4, y_dims, "output");
    cr_assert_eq(g->n_tensors, 3, "the old weights are gone: %d tensors", g->n_tensors);
    mdb_graph_free(g);
}

Test(conv_trim, only_the_axes_and_taps_that_read_nothing_go)
{
    /* Height 4 with dilation 6: only the centre row reads the map. Width
     * 20 with dilation 2: every tap does, the axis stays as it is. */
    mdb_graph_t *g =
        import_conv(1, 4, 20, 3, 3, (const int64_t[]){6, 2}, (const int64_t[]){6, 2, 6, 2}, NULL);
    const mdb_node_t *n = &g->nodes[0];
    expect_attr(n, "kernel_shape", 2, (const int64_t[]){1, 3});
    expect_attr(n, "dilations", 2, (const int64_t[]){1, 2});
    expect_attr(n, "pads", 4, (const int64_t[]){0, 2, 0, 2});
    const float *v = g->tensors[n->inputs[1]].data;
    for (int f = 0; f < 4; f++)
        for (int j = 0; j < 3; j++)
            cr_assert_float_eq(v[f * 3 + j], (float)(9 * f + 3 + j), 0, "filter %d tap %d", f, j);
    mdb_graph_free(g);
}

Test(conv_trim, a_one_sided_pad_keeps_the_live_taps_and_what_they_read)
{
    /* Height 5, 3 taps of dilation 4, pads 8 before and none after: 5
     * outputs; tap 0 reads row o - 8 (never one of 0..4), taps 1 and 2
     * read rows o - 4 and o: the kernel keeps taps 1..2 and the begin pad
     * drops to 4. */
    mdb_graph_t *g =
        import_conv(1, 5, 5, 3, 1, (const int64_t[]){4, 1}, (const int64_t[]){8, 0, 0, 0}, NULL);
    const mdb_node_t *n = &g->nodes[0];
    expect_attr(n, "kernel_shape", 2, (const int64_t[]){2, 1});
    expect_attr(n, "dilations", 2, (const int64_t[]){4, 1});
    expect_attr(n, "pads", 4, (const int64_t[]){4, 0, 0, 0});
    int64_t y_dims[] = {MDB_DIM_BATCH, 4, 5, 5};
    expect_shape(&g->tensors[n->outputs[0]].shape, 4, y_dims, "output");
    const float *v = g->tensors[n->inputs[1]].data;
    for (int f = 0; f < 4; f++)
        for (int j = 0; j < 2; j++)
            cr_assert_float_eq(v[f * 2 + j], (float)(3 * f + 1 + j), 0, "filter %d tap %d", f, j);
    mdb_graph_free(g);
}

/* RetinaNet's P7 (and SSD's extra blocks): a 3x3 stride-2 conv, pads 1, on
 * a 2x2 map. Its one output reads rows -1..1: tap 0 reads only padding,
 * taps 1 and 2 the map. Trimming tap 0 alone would leave pads (0, 1),
 * asymmetric, which cuDNN refuses: symmetric pads stay as they are when
 * only one end is dead. */
Test(conv_trim, symmetric_pads_stay_symmetric)
{
    expect_a_3x3_stride_2_conv_left_alone(2, 2);
    /* Dead at both ends, more at the begin: 5 taps, stride 2, pads 2, on
     * height 2; the one output reads rows -2..2, taps 0, 1 and 4 only
     * padding. One tap goes from each end: taps 1..3, pads 1 and 1 (taps
     * 2..3 alone would leave pads 0 and 1). */
    mdb_graph_t *g = import_conv(1, 2, 2, 5, 1, (const int64_t[]){1, 1},
                                 (const int64_t[]){2, 0, 2, 0}, (const int64_t[]){2, 1});
    const mdb_node_t *n = &g->nodes[0];
    expect_attr(n, "kernel_shape", 2, (const int64_t[]){3, 1});
    expect_attr(n, "pads", 4, (const int64_t[]){1, 0, 1, 0});
    const float *v = g->tensors[n->inputs[1]].data;
    for (int f = 0; f < 4; f++)
        for (int j = 0; j < 3; j++)
            cr_assert_float_eq(v[f * 3 + j], (float)(5 * f + 1 + j), 0, "filter %d tap %d", f, j);
    mdb_graph_free(g);
}

Test(conv_trim, convs_whose_every_tap_reads_the_map_are_left_alone)
{
    expect_a_3x3_stride_2_conv_left_alone(3, 8);
}
