/* ONNX's official conformance tests (Debian's libonnx-testdata, in
 * $ONNX_TESTDATA): node/ and pytorch-converted/ cases for the executor's
 * ops, each model imported by modeldb, planned and run on the cpu backend,
 * and compared with the expected outputs at ONNX's own backend-test
 * tolerance (rtol 1e-3, atol 1e-7, loosened to 1e-5 absolute for fp32
 * accumulation in convolutions and reductions).
 *
 * ONNX passes some parameters as graph inputs (Reshape's shape, Slice's
 * starts, Clip's bounds, Conv's weights in node tests). A served model has
 * them as constants, so before import those inputs are bound to their test
 * values as initializers (protobuf-c on onnx.proto, no second parser).
 *
 * A case the importer refuses for ops outside the executor's list is not
 * applicable. A case the executor refuses must be in known_gaps below with
 * the reason, or the test fails; so does any mismatch, and so does a
 * suite that passes fewer cases than it did when written (240 in all). */
#include <criterion/criterion.h>
#include <dirent.h>
#include <math.h>
#include <mdb_graph.h>
#include <onnx.pb-c.h>
#include <sq.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <wk_exec.h>

/* Executor gaps, each with why; anything else must pass. */
static const char *const known_gaps[][2] = {
    {"test_maxpool_2d_uint8", "uint8 tensors: the executor runs fp32 models"},
    {"test_add_uint8", "uint8 tensors"},
    {"test_sub_uint8", "uint8 tensors"},
    {"test_mul_uint8", "uint8 tensors"},
    {"test_div_uint8", "uint8 tensors"},
    {"test_clip_default_int8_inbounds", "int8 tensors"},
    {"test_clip_default_int8_max", "int8 tensors"},
    {"test_clip_default_int8_min", "int8 tensors"},
    {"test_edge_pad", "int32 tensors"},
    {"test_reflect_pad", "int32 tensors"},
    {"test_dropout_default_mask", "Dropout's mask output (bool tensors)"},
    {"test_dropout_default_mask_ratio", "Dropout's mask output (bool tensors)"},
    /* a value, not a refusal: this data's reference maps align_corners by
     * (in - 1) / (in * scale - 1), ONNX Runtime and torch by (in - 1) /
     * (out - 1) with out = floor(in * scale); the worker computes as they do */
    {"test_resize_downsample_scales_linear_align_corners",
     "align_corners over in * scale, not the output's length"},
    {"test_resize_downsample_scales_cubic_align_corners",
     "align_corners over in * scale, not the output's length"},
};

static const char *gap_reason(const char *name)
{
    for (size_t i = 0; i < sizeof(known_gaps) / sizeof(known_gaps[0]); i++)
        if (strcmp(known_gaps[i][0], name) == 0)
            return known_gaps[i][1];
    return NULL;
}

static void *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *p = malloc((size_t)n + 1);
    if (fread(p, 1, (size_t)n, f) != (size_t)n) {
        free(p);
        p = NULL;
    }
    fclose(f);
    *len = (size_t)n;
    return p;
}

static Onnx__TensorProto *read_tensor(const char *path)
{
    size_t len;
    void *bytes = slurp(path, &len);
    if (bytes == NULL)
        return NULL;
    Onnx__TensorProto *t = onnx__tensor_proto__unpack(NULL, len, bytes);
    free(bytes);
    return t;
}

/* A float tensor's values (raw_data or float_data); NULL if not float. */
static float *tensor_floats(const Onnx__TensorProto *t, size_t *count)
{
    if (t->data_type != ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT)
        return NULL;
    size_t n = 1;
    for (size_t i = 0; i < t->n_dims; i++)
        n *= (size_t)t->dims[i];
    float *v = malloc(n * sizeof(float) + 1);
    if (t->has_raw_data && t->raw_data.len == n * sizeof(float)) {
        if (n > 0) /* an empty tensor has no data pointer */
            memcpy(v, t->raw_data.data, n * sizeof(float));
    } else if (t->n_float_data == n) {
        if (n > 0)
            memcpy(v, t->float_data, n * sizeof(float));
    } else {
        free(v);
        return NULL;
    }
    *count = n;
    return v;
}

/* Ops whose every input is data; for the others inputs 1.. are parameters. */
static bool all_inputs_are_data(const char *op)
{
    const char *data_ops[] = {"Add", "Sub", "Mul", "Div", "MatMul", "Concat"};
    for (size_t i = 0; i < sizeof(data_ops) / sizeof(data_ops[0]); i++)
        if (strcmp(op, data_ops[i]) == 0)
            return true;
    return false;
}

typedef enum { CASE_PASS, CASE_NA, CASE_GAP, CASE_FAIL } outcome_t;

typedef struct {
    int pass, na, gap, fail;
    char failures[4096];
} tally_t;

static void note(tally_t *t, outcome_t o, const char *name, const char *why)
{
    switch (o) {
    case CASE_PASS:
        t->pass++;
        break;
    case CASE_NA:
        t->na++;
        break;
    case CASE_GAP:
        t->gap++;
        cr_log_info("%s: known gap: %s", name, why);
        break;
    case CASE_FAIL:
        t->fail++;
        size_t l = strlen(t->failures);
        snprintf(t->failures + l, sizeof(t->failures) - l, "\n  %s: %s", name, why);
        break;
    }
}

/* Runs one case directory; returns its outcome with why. */
static outcome_t run_case(const char *dir, const char *name, char *why, size_t why_len)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/model.onnx", dir);
    size_t len;
    void *bytes = slurp(path, &len);
    if (bytes == NULL) {
        snprintf(why, why_len, "no model.onnx");
        return CASE_NA;
    }
    Onnx__ModelProto *m = onnx__model_proto__unpack(NULL, len, bytes);
    free(bytes);
    if (m == NULL || m->graph == NULL) {
        snprintf(why, why_len, "model.onnx does not parse");
        return CASE_FAIL;
    }
    Onnx__GraphProto *gp = m->graph;
    /* Which graph inputs are parameters: read by a node at input slot >= 1
     * of an op that is not all-data. */
    size_t n_in = gp->n_input;
    bool *bind = calloc(n_in + 1, 1);
    for (size_t i = 0; i < n_in; i++) {
        for (size_t k = 0; k < gp->n_initializer; k++)
            if (strcmp(gp->initializer[k]->name, gp->input[i]->name) == 0)
                bind[i] = true; /* already constant */
        for (size_t ni = 0; ni < gp->n_node && !bind[i]; ni++) {
            Onnx__NodeProto *nd = gp->node[ni];
            for (size_t s = 1; s < nd->n_input; s++)
                if (strcmp(nd->input[s], gp->input[i]->name) == 0 &&
                    !all_inputs_are_data(nd->op_type))
                    bind[i] = true;
        }
    }
    outcome_t out = CASE_PASS;
    mdb_graph_t *g = NULL;
    wk_plan_t *plan = NULL;
    float **ins = calloc(n_in + 1, sizeof(float *)), **outs = NULL, **wants = NULL;
    size_t *want_n = NULL;
    Onnx__TensorProto **bound = calloc(n_in + 1, sizeof(*bound));
    size_t n_bound = 0;
    int runtime_index[64], n_runtime = 0, run_batch = 1;
    /* Bind the parameters: initializers with the test data, appended. */
    for (size_t i = 0; i < n_in; i++) {
        snprintf(path, sizeof(path), "%s/test_data_set_0/input_%zu.pb", dir, i);
        bool already = false;
        for (size_t k = 0; k < gp->n_initializer; k++)
            if (strcmp(gp->initializer[k]->name, gp->input[i]->name) == 0)
                already = true;
        if (!bind[i] || already) {
            if (!already && n_runtime < 64)
                runtime_index[n_runtime++] = (int)i;
            continue;
        }
        Onnx__TensorProto *t = read_tensor(path);
        if (t == NULL) {
            snprintf(why, why_len, "cannot read %s", path);
            out = CASE_FAIL;
            goto done;
        }
        free(t->name);
        t->name = strdup(gp->input[i]->name);
        bound[n_bound++] = t;
    }
    Onnx__TensorProto **old_init = gp->initializer;
    size_t old_n = gp->n_initializer;
    Onnx__TensorProto **inits = calloc(old_n + n_bound + 1, sizeof(*inits));
    if (old_n > 0)
        memcpy(inits, old_init, old_n * sizeof(*inits));
    if (n_bound > 0)
        memcpy(inits + old_n, bound, n_bound * sizeof(*inits));
    gp->initializer = inits;
    gp->n_initializer = old_n + n_bound;
    size_t plen = onnx__model_proto__get_packed_size(m);
    uint8_t *packed = malloc(plen + 1);
    onnx__model_proto__pack(m, packed);
    gp->initializer = old_init;
    gp->n_initializer = old_n;
    free(inits);
    mdb_import_error_t err;
    int rc = mdb_onnx_import(packed, plen, &g, &err);
    free(packed);
    if (rc != 0) {
        snprintf(why, why_len, "import: %s %s", err.ops, err.detail);
        out = rc == SQ_UNSUPPORTED_MODEL ? CASE_NA : CASE_FAIL;
        goto done;
    }
    /* The importer makes dim 0 of the inputs the symbolic batch: plan for
     * the case's own leading size; a graph whose batch moves (a transpose
     * of dim 0) is planned with that size bound statically. */
    int64_t lead = 1;
    if (n_runtime > 0) {
        snprintf(path, sizeof(path), "%s/test_data_set_0/input_%d.pb", dir, runtime_index[0]);
        Onnx__TensorProto *t0 = read_tensor(path);
        if (t0 != NULL && t0->n_dims > 0)
            lead = t0->dims[0] > 0 ? t0->dims[0] : 1;
        if (t0)
            onnx__tensor_proto__free_unpacked(t0, NULL);
    }
    wk_plan_opts_t o = wk_plan_opts_default();
    o.max_batch = (int)lead;
    char pwhy[512];
    rc = wk_plan_create(g, &o, &plan, pwhy, sizeof(pwhy));
    if (rc == SQ_UNSUPPORTED_MODEL) {
        o.static_batch = lead;
        rc = wk_plan_create(g, &o, &plan, pwhy, sizeof(pwhy));
    }
    if (rc != 0) {
        const char *gap = gap_reason(name);
        snprintf(why, why_len, "plan: %s%s%s", pwhy, gap ? " / known: " : "", gap ? gap : "");
        out = gap ? CASE_GAP : CASE_FAIL;
        goto done;
    }
    if (wk_plan_n_inputs(plan) != n_runtime) {
        snprintf(why, why_len, "plan has %d inputs, the case %d", wk_plan_n_inputs(plan),
                 n_runtime);
        out = CASE_FAIL;
        goto done;
    }
    for (int i = 0; i < n_runtime; i++) {
        snprintf(path, sizeof(path), "%s/test_data_set_0/input_%d.pb", dir, runtime_index[i]);
        Onnx__TensorProto *t = read_tensor(path);
        size_t n = 0;
        ins[i] = t ? tensor_floats(t, &n) : NULL;
        if (t)
            onnx__tensor_proto__free_unpacked(t, NULL);
        if (i == 0 && wk_plan_input_elems(plan, 0) > 0)
            run_batch = (int)(n / (size_t)wk_plan_input_elems(plan, 0));
        if (ins[i] == NULL || (int64_t)n != run_batch * wk_plan_input_elems(plan, i)) {
            snprintf(why, why_len, "input %d: not float or %zu elements for %lld", i, n,
                     (long long)wk_plan_input_elems(plan, i));
            out = gap_reason(name) ? CASE_GAP : CASE_FAIL;
            goto done;
        }
    }
    int n_out = wk_plan_n_outputs(plan);
    outs = calloc((size_t)n_out, sizeof(float *));
    wants = calloc((size_t)n_out, sizeof(float *));
    want_n = calloc((size_t)n_out, sizeof(size_t));
    for (int i = 0; i < n_out; i++) {
        snprintf(path, sizeof(path), "%s/test_data_set_0/output_%d.pb", dir, i);
        Onnx__TensorProto *t = read_tensor(path);
        wants[i] = t ? tensor_floats(t, &want_n[i]) : NULL;
        if (t)
            onnx__tensor_proto__free_unpacked(t, NULL);
        if (wants[i] == NULL || (int64_t)want_n[i] != run_batch * wk_plan_output_elems(plan, i)) {
            snprintf(why, why_len,
                     "output %d: expected data missing or of %zu elements, plan "
                     "%lld",
                     i, want_n[i], (long long)wk_plan_output_elems(plan, i));
            out = CASE_FAIL;
            goto done;
        }
        outs[i] = malloc(want_n[i] * sizeof(float) + 1);
    }
    if (wk_plan_run(plan, run_batch, (const float *const *)ins, outs) != 0) {
        snprintf(why, why_len, "run: %s", wk_plan_errmsg(plan));
        out = CASE_FAIL;
        goto done;
    }
    for (int i = 0; i < n_out; i++)
        for (size_t k = 0; k < want_n[i]; k++) {
            double w = wants[i][k], d = fabs((double)outs[i][k] - w);
            if (!(d <= 1e-5 + 1e-3 * fabs(w)) && !(isinf(w) && outs[i][k] == w)) {
                snprintf(why, why_len, "output %d element %zu: got %.7g want %.7g", i, k,
                         (double)outs[i][k], w);
                out = gap_reason(name) ? CASE_GAP : CASE_FAIL;
                goto done;
            }
        }
done:
    for (size_t i = 0; i < n_bound; i++)
        onnx__tensor_proto__free_unpacked(bound[i], NULL);
    free(bound);
    for (size_t i = 0; i < n_in; i++)
        free(ins[i]);
    free(ins);
    if (plan != NULL)
        for (int i = 0; i < wk_plan_n_outputs(plan); i++) {
            free(outs ? outs[i] : NULL);
            free(wants ? wants[i] : NULL);
        }
    free(outs);
    free(wants);
    free(want_n);
    free(bind);
    wk_plan_free(plan);
    mdb_graph_free(g);
    onnx__model_proto__free_unpacked(m, NULL);
    return out;
}

static const char *testdata(void)
{
    const char *d = getenv("ONNX_TESTDATA");
    return d ? d : "/usr/share/libonnx-testdata/data";
}

/* Runs every case of `suite` whose name starts with one of the prefixes;
 * asserts no failure and at least min_pass passes. */
static void run_suite(const char *suite, const char *const *prefixes, int min_pass)
{
    char root[512];
    snprintf(root, sizeof(root), "%s/%s", testdata(), suite);
    DIR *d = opendir(root);
    cr_assert_not_null(d, "no conformance data at %s (libonnx-testdata)", root);
    tally_t t = {0};
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        bool match = false;
        for (const char *const *p = prefixes; *p != NULL; p++)
            if (strncmp(e->d_name, *p, strlen(*p)) == 0)
                match = true;
        if (!match)
            continue;
        char dir[1024], why[512] = "";
        snprintf(dir, sizeof(dir), "%s/%s", root, e->d_name);
        outcome_t o = run_case(dir, e->d_name, why, sizeof(why));
        if (o == CASE_NA)
            cr_log_info("%s: not applicable: %s", e->d_name, why);
        note(&t, o, e->d_name, why);
    }
    closedir(d);
    cr_log_info("%s %s...: %d pass, %d known gaps, %d not applicable, %d fail", suite, prefixes[0],
                t.pass, t.gap, t.na, t.fail);
    cr_assert_eq(t.fail, 0, "%d case(s) failed:%s", t.fail, t.failures);
    cr_assert_geq(t.pass, min_pass, "only %d case(s) passed (want >= %d)", t.pass, min_pass);
}

#define SUITE(name, suite, min_pass, ...)                                                          \
    Test(conformance, name, .timeout = 120)                                                        \
    {                                                                                              \
        const char *const prefixes[] = {__VA_ARGS__, NULL};                                        \
        run_suite(suite, prefixes, min_pass);                                                      \
    }

SUITE(conv, "node", 4, "test_conv_")
SUITE(pool, "node", 27, "test_maxpool_", "test_averagepool_", "test_globalaveragepool")
SUITE(activations, "node", 19, "test_relu", "test_clip", "test_leakyrelu", "test_sigmoid",
      "test_hardsigmoid", "test_hardswish")
/* "test_exp" also takes Expand's two cases */
SUITE(neg_exp, "node", 6, "test_neg", "test_exp")
/* Resize without tf_crop_and_resize and tf_half_pixel_for_nn (bicubic
 * up and down, by scales and to sizes, half_pixel, align_corners and
 * asymmetric, cubic_coeff_a -0.75 and -0.5 with exclude_outside);
 * ConvTranspose in 2-D with explicit pads */
SUITE(resize_convtranspose, "node", 21, "test_resize_", "test_convtranspose")
SUITE(gemm_matmul, "node", 14, "test_gemm_", "test_matmul_")
SUITE(binary, "node", 11, "test_add", "test_sub", "test_mul", "test_div")
SUITE(shape_ops, "node", 38, "test_concat_", "test_flatten_", "test_reshape_", "test_transpose_")
SUITE(softmax_reduce, "node", 15, "test_softmax_", "test_reduce_mean_")
SUITE(pad_slice_split, "node", 16, "test_constant_pad", "test_edge_pad", "test_reflect_pad",
      "test_slice", "test_split_")
SUITE(batchnorm_dropout_identity, "node", 7, "test_batchnorm_", "test_dropout_", "test_identity")
SUITE(pytorch_converted, "pytorch-converted", 62, "test_")
