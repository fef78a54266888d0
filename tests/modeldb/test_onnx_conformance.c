/* ONNX's own conformance models (libonnx-testdata): every node/ case of an
 * op the worker runs imports with the right output shapes, the opset-6
 * pytorch-converted cases import, and unsupported ones name their op. */
#include "onnx_util.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <mdb_graph.h>
#include <sq.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- ONNX conformance models -------------------------------------------- */

static const char *testdata(void)
{
    const char *d = getenv("ONNX_TESTDATA");
    return d ? d : "/usr/share/libonnx-testdata/data";
}

/* Reads a TensorProto file's dims; returns the rank or -1. */
static int pb_dims(const char *path, int64_t *dims, uint8_t **bytes, size_t *len)
{
    *bytes = read_file(path, len);
    if (!*bytes)
        return -1;
    Onnx__TensorProto *tp = onnx__tensor_proto__unpack(NULL, *len, *bytes);
    if (!tp)
        return -1;
    int rank = (int)tp->n_dims;
    for (int i = 0; i < rank && i < MDB_MAX_RANK; i++)
        dims[i] = tp->dims[i];
    onnx__tensor_proto__free_unpacked(tp, NULL);
    return rank;
}

/* Imports a conformance case, binding the parameter inputs (int64 tensors
 * and scalars after the first input) to their test data, and checks every
 * output shape against test_data_set_0 with N bound to the first input's
 * batch. Returns false when the model is rejected as unsupported. */
/* Whether a graph input is a parameter that a served model holds as a
 * constant (Conv's weights, BatchNormalization's statistics): read at
 * slot >= 1 by an op whose inputs are not all data. The worker runs those
 * only as constants, and the importer refuses them otherwise. */
static bool is_parameter(const Onnx__GraphProto *gp, const char *name)
{
    static const char *const data_ops[] = {"Add", "Sub", "Mul", "Div", "MatMul", "Concat"};
    for (size_t ni = 0; ni < gp->n_node; ni++) {
        const Onnx__NodeProto *nd = gp->node[ni];
        bool data = false;
        for (size_t k = 0; k < sizeof(data_ops) / sizeof(data_ops[0]); k++)
            data |= strcmp(nd->op_type, data_ops[k]) == 0;
        for (size_t s = 1; s < nd->n_input && !data; s++)
            if (strcmp(nd->input[s], name) == 0)
                return true;
    }
    return false;
}

static bool check_case(const char *dir)
{
    char path[1024];
    size_t len;
    snprintf(path, sizeof(path), "%s/model.onnx", dir);
    uint8_t *bytes = read_file(path, &len);
    cr_assert_not_null(bytes, "%s", path);
    Onnx__ModelProto *m = onnx__model_proto__unpack(NULL, len, bytes);
    cr_assert_not_null(m);
    mdb_onnx_const_t binds[16];
    uint8_t *bind_bytes[16];
    int nb = 0, k = 0;
    int64_t batch = -1;
    for (size_t i = 0; i < m->graph->n_input && nb < 16; i++) {
        const Onnx__ValueInfoProto *vi = m->graph->input[i];
        bool is_init = false;
        for (size_t j = 0; j < m->graph->n_initializer; j++)
            is_init |= strcmp(m->graph->initializer[j]->name, vi->name) == 0;
        if (is_init)
            continue;
        int idx = k++;
        int64_t dims[MDB_MAX_RANK];
        uint8_t *pb;
        size_t pb_len;
        snprintf(path, sizeof(path), "%s/test_data_set_0/input_%d.pb", dir, idx);
        int rank = pb_dims(path, dims, &pb, &pb_len);
        cr_assert_geq(rank, 0, "%s", path);
        if (idx == 0) {
            batch = rank > 0 ? dims[0] : 1;
            free(pb);
            continue;
        }
        const Onnx__TypeProto__Tensor *tt = vi->type->tensor_type;
        if (tt->elem_type == ONNX__TENSOR_PROTO__DATA_TYPE__INT64 || rank == 0 ||
            is_parameter(m->graph, vi->name)) {
            bind_bytes[nb] = pb;
            binds[nb] = (mdb_onnx_const_t){vi->name, pb, pb_len};
            nb++;
        } else {
            free(pb);
        }
    }
    mdb_graph_t *g = NULL;
    mdb_import_error_t err;
    int rc = mdb_onnx_import_bound(bytes, len, binds, nb, &g, &err);
    for (int i = 0; i < nb; i++)
        free(bind_bytes[i]);
    if (rc == SQ_UNSUPPORTED_MODEL) {
        onnx__model_proto__free_unpacked(m, NULL);
        free(bytes);
        return false;
    }
    cr_assert_eq(rc, 0, "%s: %s", dir, err.detail);
    expect_only_runtime_ops(g, dir);
    cr_assert_eq(g->n_outputs, (int)m->graph->n_output);
    for (int o = 0; o < g->n_outputs; o++) {
        int64_t want[MDB_MAX_RANK];
        uint8_t *pb;
        size_t pb_len;
        snprintf(path, sizeof(path), "%s/test_data_set_0/output_%d.pb", dir, o);
        int rank = pb_dims(path, want, &pb, &pb_len);
        free(pb);
        cr_assert_geq(rank, 0, "%s", path);
        mdb_shape_t got = g->tensors[g->outputs[o]].shape;
        for (int i = 0; i < got.rank; i++)
            if (got.dims[i] == MDB_DIM_BATCH)
                got.dims[i] = batch;
        expect_shape(&got, rank, want, dir);
    }
    mdb_graph_free(g);
    onnx__model_proto__free_unpacked(m, NULL);
    free(bytes);
    return true;
}

/* Every node/ case of the ops squish runs; none may be rejected. */
static const char *const node_cases[] = {
    "averagepool_1d_default",
    "averagepool_2d_ceil",
    "averagepool_2d_default",
    "averagepool_2d_pads",
    "averagepool_2d_pads_count_include_pad",
    "averagepool_2d_precomputed_pads",
    "averagepool_2d_precomputed_same_upper",
    "averagepool_2d_precomputed_strides",
    "averagepool_2d_same_lower",
    "averagepool_2d_same_upper",
    "averagepool_2d_strides",
    "averagepool_3d_default",
    "basic_conv_with_padding",
    "basic_conv_without_padding",
    "conv_with_autopad_same",
    "conv_with_strides_and_asymmetric_padding",
    "conv_with_strides_no_padding",
    "conv_with_strides_padding",
    "maxpool_1d_default",
    "maxpool_2d_ceil",
    "maxpool_2d_default",
    "maxpool_2d_dilations",
    "maxpool_2d_pads",
    "maxpool_2d_precomputed_pads",
    "maxpool_2d_precomputed_same_upper",
    "maxpool_2d_precomputed_strides",
    "maxpool_2d_same_lower",
    "maxpool_2d_same_upper",
    "maxpool_2d_strides",
    "maxpool_3d_default",
    "globalaveragepool",
    "globalaveragepool_precomputed",
    "relu",
    "clip",
    "clip_default_inbounds",
    "clip_default_max",
    "clip_default_min",
    "clip_example",
    "clip_inbounds",
    "clip_outbounds",
    "clip_splitbounds",
    "leakyrelu",
    "leakyrelu_default",
    "leakyrelu_example",
    "sigmoid",
    "sigmoid_example",
    "hardsigmoid",
    "hardsigmoid_default",
    "hardsigmoid_example",
    "hardswish",
    "neg",
    "neg_example",
    "exp",
    "exp_example",
    "resize_upsample_scales_nearest",
    "resize_upsample_scales_linear",
    "resize_downsample_sizes_nearest",
    "resize_upsample_sizes_nearest_floor_align_corners",
    "convtranspose",
    "convtranspose_pads",
    "gemm_all_attributes",
    "gemm_alpha",
    "gemm_beta",
    "gemm_default_matrix_bias",
    "gemm_default_no_bias",
    "gemm_default_scalar_bias",
    "gemm_default_single_elem_vector_bias",
    "gemm_default_vector_bias",
    "gemm_default_zero_bias",
    "gemm_transposeA",
    "gemm_transposeB",
    "matmul_2d",
    "matmul_3d",
    "matmul_4d",
    "add",
    "add_bcast",
    "mul",
    "mul_bcast",
    "mul_example",
    "sub",
    "sub_bcast",
    "sub_example",
    "div",
    "div_bcast",
    "div_example",
    "concat_1d_axis_0",
    "concat_2d_axis_1",
    "concat_3d_axis_2",
    "concat_3d_axis_negative_1",
    "flatten_axis0",
    "flatten_axis1",
    "flatten_axis2",
    "flatten_axis3",
    "flatten_default_axis",
    "flatten_negative_axis1",
    "reshape_extended_dims",
    "reshape_negative_dim",
    "reshape_negative_extended_dims",
    "reshape_one_dim",
    "reshape_reduced_dims",
    "reshape_reordered_all_dims",
    "reshape_reordered_last_dims",
    "reshape_zero_and_negative_dim",
    "reshape_zero_dim",
    "reshape_allowzero_reordered",
    "transpose_default",
    "transpose_all_permutations_0",
    "transpose_all_permutations_5",
    "softmax_axis_0",
    "softmax_axis_1",
    "softmax_axis_2",
    "softmax_default_axis",
    "softmax_example",
    "softmax_large_number",
    "softmax_negative_axis",
    "constant_pad",
    "dropout_default",
    "dropout_default_ratio",
    "dropout_default_old",
    "dropout_random_old",
    "identity",
    "reduce_mean_default_axes_keepdims_example",
    "reduce_mean_do_not_keepdims_example",
    "reduce_mean_keepdims_example",
    "reduce_mean_negative_axes_keepdims_example",
    "batchnorm_epsilon",
    "batchnorm_example",
    "split_equal_parts_1d",
    "split_equal_parts_2d",
    "split_equal_parts_default_axis",
    "split_variable_parts_1d",
    "split_variable_parts_2d",
    "split_variable_parts_default_axis",
    "slice",
    "slice_default_axes",
    "slice_default_steps",
    "slice_end_out_of_bounds",
    "slice_neg",
    "slice_neg_steps",
    "slice_negative_axes",
    "slice_start_out_of_bounds",
    "squeeze",
    "squeeze_negative_axes",
    "unsqueeze_axis_0",
    "unsqueeze_axis_1",
    "unsqueeze_axis_2",
    "unsqueeze_negative_axes",
    "unsqueeze_three_axes",
    "unsqueeze_two_axes",
    "unsqueeze_unsorted_axes",
};

Test(onnx_conformance, conformance_node_models_of_supported_ops_import_with_right_shapes)
{
    char dir[1024];
    for (size_t i = 0; i < sizeof(node_cases) / sizeof(node_cases[0]); i++) {
        snprintf(dir, sizeof(dir), "%s/node/test_%s", testdata(), node_cases[i]);
        cr_assert(check_case(dir), "%s was rejected as unsupported", node_cases[i]);
    }
}

Test(onnx_conformance, conformance_pytorch_converted_models_import_or_are_rejected_cleanly)
{
    char dir[1024];
    snprintf(dir, sizeof(dir), "%s/pytorch-converted", testdata());
    DIR *d = opendir(dir);
    cr_assert_not_null(d, "%s", dir);
    struct dirent *de;
    int imported = 0, rejected = 0;
    while ((de = readdir(d)) != NULL) {
        if (strncmp(de->d_name, "test_", 5) != 0)
            continue;
        char sub[1200];
        snprintf(sub, sizeof(sub), "%s/%s", dir, de->d_name);
        if (check_case(sub))
            imported++;
        else
            rejected++;
    }
    closedir(d);
    /* Conv 1d/2d/3d (groups, depthwise, dilation, padding), pools,
     * BatchNorm, pads, Linear, LeakyReLU, Softmax...: 60 in Debian's set. */
    cr_assert_geq(imported, 55, "imported %d, rejected %d", imported, rejected);
}

Test(onnx_conformance, conformance_unsupported_ops_are_named)
{
    static const struct {
        const char *test, *op;
    } cases[] = {
        {"node/test_convtranspose_dilations", "ConvTranspose"},
        {"node/test_prelu_example", "PRelu"},
        {"node/test_globalmaxpool", "GlobalMaxPool"},
        {"node/test_softmax_axis_0_expanded", "ReduceMax"},
        {"node/test_gather_0", "Gather"},
        {"node/test_maxpool_2d_uint8", "MaxPool"}, /* integer compute */
        {"node/test_add_uint8", "Add"},
        /* the worker computes in float: a bool mask output is past it */
        {"node/test_dropout_default_mask", "Dropout"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char path[1024];
        size_t len;
        snprintf(path, sizeof(path), "%s/%s/model.onnx", testdata(), cases[i].test);
        uint8_t *bytes = read_file(path, &len);
        cr_assert_not_null(bytes, "%s", path);
        mdb_graph_t *g = NULL;
        mdb_import_error_t err;
        cr_assert_eq(mdb_onnx_import(bytes, len, &g, &err), SQ_UNSUPPORTED_MODEL, "%s",
                     cases[i].test);
        cr_assert_null(g);
        cr_assert_eq(err.code, SQ_UNSUPPORTED_MODEL);
        cr_assert_not_null(strstr(err.ops, cases[i].op), "%s: ops '%s'", cases[i].test, err.ops);
        cr_assert_not_null(strstr(err.detail, cases[i].op), "%s: %s", cases[i].test, err.detail);
        cr_assert_gt(err.opset, 0);
        free(bytes);
    }
}

Test(onnx_conformance, pad_modes_and_pads_come_through_from_opset_6)
{
    static const struct {
        const char *test, *mode;
        int64_t pads[8];
    } cases[] = {
        {"test_ReflectionPad2d", "reflect", {0, 0, 3, 1, 0, 0, 4, 2}},
        {"test_ReplicationPad2d", "edge", {0, 0, 3, 1, 0, 0, 4, 2}},
        {"test_ConstantPad2d", "constant", {0, 0, 3, 1, 0, 0, 4, 2}},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char path[1024];
        size_t len;
        snprintf(path, sizeof(path), "%s/pytorch-converted/%s/model.onnx", testdata(),
                 cases[i].test);
        uint8_t *bytes = read_file(path, &len);
        cr_assert_not_null(bytes, "%s", path);
        mdb_graph_t *g = NULL;
        mdb_import_error_t err;
        cr_assert_eq(mdb_onnx_import(bytes, len, &g, &err), 0, "%s", err.detail);
        free(bytes);
        cr_assert_eq(g->n_nodes, 1);
        const mdb_node_t *n = &g->nodes[0];
        cr_assert_eq(n->op, MDB_OP_PAD);
        cr_assert_eq(n->n_inputs, 1);
        cr_assert_str_eq(mdb_node_string(n, "mode", ""), cases[i].mode);
        size_t np;
        const int64_t *pads = mdb_node_ints(n, "pads", &np);
        cr_assert_eq(np, 8);
        for (int k = 0; k < 8; k++)
            cr_assert_eq(pads[k], cases[i].pads[k], "%s pads[%d] = %lld", cases[i].test, k,
                         (long long)pads[k]);
        cr_assert_float_eq(mdb_node_float(n, "value", -1), i == 2 ? 2.0f : 0.0f, 0);
        mdb_graph_free(g);
    }
}
