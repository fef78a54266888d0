/* The cuda backend's own kernels and precisions, on graphs built by hand
 * in the shapes of convnext_tiny's and vit_b_16's blocks and of the ops
 * cuDNN lacks (LayerNorm, Erf, Gelu, Div, Pow, Sqrt, Tanh, Expand,
 * hardswish fused into a conv, binary broadcasts).
 *
 * - Without a GPU (or without the backend): each graph gets past the
 *   backend's support check, i.e. wk_plan_from_graph on cuda fails with
 *   SQ_DEVICE (no device, or no backend in this build), never with
 *   SQ_UNSUPPORTED_MODEL.
 * - With a GPU: each graph in each precision against the cpu backend,
 *   batches 1 and 3, within FP32 1e-4, TF32 5e-3, FP16 1e-2 and BF16 3e-2
 *   of (1 + |cpu|); skipped, with the reason, where no GPU is present. */
#include <criterion/criterion.h>
#include <math.h>
#include <mdb_graph.h>
#include <sq.h>
#include <stdlib.h>
#include <string.h>
#include <wk_exec_int.h>

#define MAXB 3

static uint64_t seed = 7;

static float frand(void)
{
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((seed >> 40) & 0xffffff) / (float)0x1000000 * 2.0f - 1.0f;
}

static int konst_scaled(wk_graph_t *g, int ndim, const int64_t *dims, float scale, float bias)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= dims[i];
    float *d = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        d[i] = frand() * scale + bias;
    int v = wk_graph_value(g, NULL, ndim, dims, false, d);
    free(d);
    return v;
}

static int konst(wk_graph_t *g, int ndim, const int64_t *dims)
{
    return konst_scaled(g, ndim, dims, 1.0f, 0.0f);
}

static int scalar(wk_graph_t *g, float v)
{
    int64_t one = 1;
    return wk_graph_value(g, NULL, 1, &one, false, &v);
}

static int val(wk_graph_t *g, int nd, const int64_t *d)
{
    return wk_graph_value(g, NULL, nd, d, true, NULL);
}

static int act(wk_graph_t *g, int x, int nd, const int64_t *d, wk_act_t a)
{
    int y = val(g, nd, d);
    wk_graph_step(g, WK_K_ELTWISE, &x, 1, y)->p.act = a;
    return y;
}

static int binary(wk_graph_t *g, wk_binop_t op, int a, int b, int nd, const int64_t *d)
{
    int y = val(g, nd, d);
    wk_graph_step(g, WK_K_BINARY, (int[]){a, b}, 2, y)->p.binop = op;
    return y;
}

static int matmul(wk_graph_t *g, int a, int b, int nd, const int64_t *d)
{
    int y = val(g, nd, d);
    wk_graph_step(g, WK_K_MATMUL, (int[]){a, b}, 2, y);
    return y;
}

static int layernorm(wk_graph_t *g, int x, int nd, const int64_t *d, bool affine)
{
    int64_t c = d[nd - 1];
    int y = val(g, nd, d);
    wk_step_t *s = affine ? wk_graph_step(g, WK_K_LAYERNORM,
                                          (int[]){x, konst(g, 1, &c), konst(g, 1, &c)}, 3, y)
                          : wk_graph_step(g, WK_K_LAYERNORM, &x, 1, y);
    s->p.epsilon = 1e-6f;
    return y;
}

/* torch's exported GELU: x * 0.5 * (1 + erf(x / sqrt 2)) */
static int gelu_erf(wk_graph_t *g, int x, int nd, const int64_t *d)
{
    int q = binary(g, WK_BIN_DIV, x, scalar(g, 1.41421356f), nd, d);
    int e = val(g, nd, d);
    wk_graph_step(g, WK_K_ERF, &q, 1, e);
    int p = binary(g, WK_BIN_ADD, e, scalar(g, 1.0f), nd, d);
    int m = binary(g, WK_BIN_MUL, x, p, nd, d);
    return binary(g, WK_BIN_MUL, m, scalar(g, 0.5f), nd, d);
}

static void window(wk_step_t *s, int k, int pad, int64_t groups)
{
    s->p.conv.n_spatial = 2;
    for (int i = 0; i < 2; i++) {
        s->p.conv.kernel[i] = k;
        s->p.conv.stride[i] = 1;
        s->p.conv.pad_begin[i] = s->p.conv.pad_end[i] = pad;
        s->p.conv.dilation[i] = 1;
    }
    s->p.conv.groups = groups;
}

typedef struct {
    wk_graph_t *(*build)(void);
    int in_ndim;
    int64_t in_dims[4]; /* one item's: [1, ...] */
} case_t;

/* convnext_tiny's block: depthwise 7x7, to channels last, LayerNorm,
 * MLP with GELU (erf), layer scale, back, residual. */
static wk_graph_t *b_convnext(void)
{
    wk_graph_t *g = wk_graph_new(MAXB);
    int64_t xd[4] = {MAXB, 8, 10, 10}, wd[4] = {8, 1, 7, 7}, bd = 8, nd[4] = {MAXB, 10, 10, 8},
            hd[4] = {MAXB, 10, 10, 32}, w1d[2] = {8, 32}, w2d[2] = {32, 8}, hb = 32;
    int x = wk_graph_input(g, "x", 4, xd, true);
    int c = val(g, 4, xd);
    window(wk_graph_step(g, WK_K_CONV, (int[]){x, konst(g, 4, wd), konst(g, 1, &bd)}, 3, c), 7, 3,
           8);
    int t = val(g, 4, nd);
    memcpy(wk_graph_step(g, WK_K_TRANSPOSE, &c, 1, t)->p.perm, (int[]){0, 2, 3, 1},
           4 * sizeof(int));
    int ln = layernorm(g, t, 4, nd, true);
    int h = binary(g, WK_BIN_ADD, matmul(g, ln, konst_scaled(g, 2, w1d, 0.3f, 0), 4, hd),
                   konst(g, 1, &hb), 4, hd);
    int gl = gelu_erf(g, h, 4, hd);
    int o = binary(g, WK_BIN_ADD, matmul(g, gl, konst_scaled(g, 2, w2d, 0.2f, 0), 4, nd),
                   konst(g, 1, &bd), 4, nd);
    int ls = binary(g, WK_BIN_MUL, o, konst(g, 1, &bd), 4, nd);
    int back = val(g, 4, xd);
    memcpy(wk_graph_step(g, WK_K_TRANSPOSE, &ls, 1, back)->p.perm, (int[]){0, 3, 1, 2},
           4 * sizeof(int));
    wk_graph_mark_output(g, binary(g, WK_BIN_ADD, x, back, 4, xd));
    return g;
}

/* vit_b_16's encoder in small: a class token expanded over the batch and
 * concatenated, LayerNorm, attention (Q K^T / sqrt d, softmax, times V),
 * a residual, LayerNorm, MLP with GELU, a residual, the class token's
 * row through a head. */
static wk_graph_t *b_vit(void)
{
    wk_graph_t *g = wk_graph_new(MAXB);
    int64_t xd[3] = {MAXB, 5, 16}, cd[3] = {1, 1, 16}, ce[3] = {MAXB, 1, 16}, td[3] = {MAXB, 6, 16},
            wd[2] = {16, 16}, kd[3] = {MAXB, 16, 6}, ad[3] = {MAXB, 6, 6}, m1[2] = {16, 32},
            hd[3] = {MAXB, 6, 32}, m2[2] = {32, 16}, c16 = 16, c32 = 32, sd[3] = {MAXB, 1, 16},
            fd[2] = {MAXB, 16}, wh[2] = {10, 16}, od[2] = {MAXB, 10}, ob = 10;
    int x = wk_graph_input(g, "x", 3, xd, true);
    int cls = val(g, 3, ce);
    wk_graph_step(g, WK_K_EXPAND, (int[]){konst(g, 3, cd)}, 1, cls);
    int t = val(g, 3, td);
    wk_graph_step(g, WK_K_CONCAT, (int[]){cls, x}, 2, t)->p.axis = 1;
    int ln = layernorm(g, t, 3, td, true);
    int q = matmul(g, ln, konst_scaled(g, 2, wd, 0.4f, 0), 3, td);
    int k = matmul(g, ln, konst_scaled(g, 2, wd, 0.4f, 0), 3, td);
    int v = matmul(g, ln, konst_scaled(g, 2, wd, 0.4f, 0), 3, td);
    int kt = val(g, 3, kd);
    memcpy(wk_graph_step(g, WK_K_TRANSPOSE, &k, 1, kt)->p.perm, (int[]){0, 2, 1}, 3 * sizeof(int));
    int sc = binary(g, WK_BIN_DIV, matmul(g, q, kt, 3, ad), scalar(g, 4.0f), 3, ad);
    int sm = val(g, 3, ad);
    wk_graph_step(g, WK_K_SOFTMAX, &sc, 1, sm)->p.axis = 2;
    int at = matmul(g, sm, v, 3, td);
    int r1 = binary(g, WK_BIN_ADD, t, at, 3, td);
    int ln2 = layernorm(g, r1, 3, td, true);
    int h = binary(g, WK_BIN_ADD, matmul(g, ln2, konst_scaled(g, 2, m1, 0.3f, 0), 3, hd),
                   konst(g, 1, &c32), 3, hd);
    int gl = act(g, h, 3, hd, (wk_act_t){WK_ACT_GELU, 0, 0});
    int o = binary(g, WK_BIN_ADD, matmul(g, gl, konst_scaled(g, 2, m2, 0.2f, 0), 3, td),
                   konst(g, 1, &c16), 3, td);
    int r2 = binary(g, WK_BIN_ADD, r1, o, 3, td);
    int row = val(g, 3, sd);
    wk_step_t *s = wk_graph_step(g, WK_K_SLICE, &r2, 1, row);
    for (int d = 0; d < WK_MAX_DIMS; d++)
        s->p.slice.step[d] = 1;
    int f = val(g, 2, fd);
    wk_graph_step(g, WK_K_COPY, &row, 1, f);
    int y = val(g, 2, od);
    s = wk_graph_step(g, WK_K_GEMM, (int[]){f, konst(g, 2, wh), konst(g, 1, &ob)}, 3, y);
    s->p.gemm.trans_b = 1;
    s->p.gemm.alpha = 1.0f;
    s->p.gemm.beta = 1.0f;
    wk_graph_mark_output(g, y);
    wk_graph_mark_output(g, ln); /* a LayerNorm on its own, unaffine below */
    wk_graph_mark_output(g, layernorm(g, x, 3, xd, false));
    return g;
}

/* Every activation as a step of its own, each an output; the values of x
 * kept where each is defined (sqrt of x^2 + 1, pow of |x|-ish). */
static wk_graph_t *b_activations(void)
{
    wk_graph_t *g = wk_graph_new(MAXB);
    int64_t xd[4] = {MAXB, 8, 10, 10};
    int x = wk_graph_input(g, "x", 4, xd, true);
    static const wk_act_t acts[] = {
        {WK_ACT_RELU, 0, 0},
        {WK_ACT_LEAKY_RELU, 0.1f, 0},
        {WK_ACT_CLIP, -0.5f, 0.7f},
        {WK_ACT_SIGMOID, 0, 0},
        {WK_ACT_HARDSIGMOID, 0.2f, 0.5f},
        {WK_ACT_HARDSWISH, 0, 0},
        {WK_ACT_GELU, 0, 0},
        {WK_ACT_TANH, 0, 0},
        {WK_ACT_SWISH, 0, 0},
        {WK_ACT_POW, 2.0f, 0},
        {WK_ACT_NEG, 0, 0},
        {WK_ACT_EXP, 0, 0},
    };
    _Static_assert(sizeof(acts) / sizeof(acts[0]) == WK_ACT_COUNT_ - 2,
                   "every activation (wk_acts.h) but none, and sqrt below");
    for (size_t i = 0; i < sizeof(acts) / sizeof(acts[0]); i++)
        wk_graph_mark_output(g, act(g, x, 4, xd, acts[i]));
    int sq = act(g, x, 4, xd, (wk_act_t){WK_ACT_POW, 2.0f, 0});
    int p1 = binary(g, WK_BIN_ADD, sq, scalar(g, 1.0f), 4, xd);
    wk_graph_mark_output(g, act(g, p1, 4, xd, (wk_act_t){WK_ACT_SQRT, 0, 0}));
    int e = val(g, 4, xd);
    wk_graph_step(g, WK_K_ERF, &x, 1, e);
    wk_graph_mark_output(g, e);
    return g;
}

/* Convs with the post-ops cuDNN has no call for (hardswish, gelu, tanh
 * after a residual), a conv without bias, pooling after. */
static wk_graph_t *b_conv_posts(void)
{
    wk_graph_t *g = wk_graph_new(MAXB);
    int64_t xd[4] = {MAXB, 8, 10, 10}, wd[4] = {8, 8, 3, 3}, w1[4] = {8, 8, 1, 1}, bd = 8,
            pd[4] = {MAXB, 8, 5, 5};
    int x = wk_graph_input(g, "x", 4, xd, true);
    int c1 = val(g, 4, xd);
    window(wk_graph_step(g, WK_K_CONV,
                         (int[]){x, konst_scaled(g, 4, wd, 0.3f, 0), konst(g, 1, &bd)}, 3, c1),
           3, 1, 1);
    int h = act(g, c1, 4, xd, (wk_act_t){WK_ACT_HARDSWISH, 0, 0});
    int c2 = val(g, 4, xd);
    window(wk_graph_step(g, WK_K_CONV, (int[]){h, konst_scaled(g, 4, w1, 0.3f, 0)}, 2, c2), 1, 0,
           1);
    int r = binary(g, WK_BIN_ADD, c2, x, 4, xd);
    int t = act(g, r, 4, xd, (wk_act_t){WK_ACT_GELU, 0, 0});
    int p = val(g, 4, pd);
    wk_step_t *s = wk_graph_step(g, WK_K_MAXPOOL, &t, 1, p);
    s->p.conv.n_spatial = 2;
    for (int i = 0; i < 2; i++) {
        s->p.conv.kernel[i] = s->p.conv.stride[i] = 2;
        s->p.conv.dilation[i] = 1;
    }
    wk_graph_mark_output(g, act(g, p, 4, pd, (wk_act_t){WK_ACT_TANH, 0, 0}));
    return g;
}

/* Add, sub, mul, div with the broadcast operand on either side (the cpu
 * takes a broadcast dividend nowhere, so div broadcasts its divisor), and
 * Expand of a per-channel value over space. */
static wk_graph_t *b_binary(void)
{
    wk_graph_t *g = wk_graph_new(MAXB);
    int64_t xd[4] = {MAXB, 8, 10, 10}, cd[3] = {8, 1, 1}, rd[4] = {1, 1, 1, 10},
            ed[4] = {MAXB, 8, 1, 1};
    int x = wk_graph_input(g, "x", 4, xd, true);
    int c = konst(g, 3, cd), r = konst(g, 4, rd), d = konst_scaled(g, 3, cd, 0.5f, 1.5f);
    wk_graph_mark_output(g, binary(g, WK_BIN_ADD, c, x, 4, xd));
    wk_graph_mark_output(g, binary(g, WK_BIN_SUB, x, r, 4, xd));
    wk_graph_mark_output(g, binary(g, WK_BIN_SUB, c, x, 4, xd));
    wk_graph_mark_output(g, binary(g, WK_BIN_MUL, x, r, 4, xd));
    wk_graph_mark_output(g, binary(g, WK_BIN_DIV, x, d, 4, xd));
    int m = val(g, 4, ed);
    wk_graph_step(g, WK_K_REDUCE_MEAN, &x, 1, m)->p.reduce.axes_mask = 12;
    int e = val(g, 4, xd);
    wk_graph_step(g, WK_K_EXPAND, &m, 1, e);
    wk_graph_mark_output(g, binary(g, WK_BIN_SUB, x, e, 4, xd));
    return g;
}

static const case_t cases[] = {
    {b_convnext, 4, {1, 8, 10, 10}},    {b_vit, 3, {1, 5, 16, 0}},
    {b_activations, 4, {1, 8, 10, 10}}, {b_conv_posts, 4, {1, 8, 10, 10}},
    {b_binary, 4, {1, 8, 10, 10}},
};
static const char *const case_names[] = {"convnext", "vit", "activations", "conv_posts", "binary"};
#define N_CASES ((int)(sizeof(cases) / sizeof(cases[0])))

static int plan_on(int c, sq_dev_kind_t kind, wk_precision_t prec, wk_plan_t **p, char *why, int n)
{
    seed = 7; /* the same constants for every backend */
    wk_graph_t *g = cases[c].build();
    wk_plan_opts_t o = wk_plan_opts_default();
    o.backend = kind;
    o.max_batch = MAXB;
    o.precision = prec;
    return wk_plan_from_graph(g, &o, p, why, n);
}

Test(cuda_support, new_ops_pass_the_support_check)
{
    for (int c = 0; c < N_CASES; c++) {
        for (int prec = 0; prec < WK_PRECISION_COUNT_; prec++) {
            wk_plan_t *p = NULL;
            char why[512] = "";
            int rc = plan_on(c, SQ_DEV_CUDA, (wk_precision_t)prec, &p, why, sizeof(why));
            cr_assert(rc == 0 || rc == SQ_DEVICE, "%s (%s): rc %d: %s", case_names[c],
                      wk_precision_name((wk_precision_t)prec), rc, why);
            if (rc == 0) {
                wk_precision_t got = wk_plan_precision(p);
                cr_assert(got == (wk_precision_t)prec || got == WK_PRECISION_FP32,
                          "%s: asked %s, runs %s", case_names[c],
                          wk_precision_name((wk_precision_t)prec), wk_precision_name(got));
                wk_plan_free(p);
            } else if (wk_backend_built(SQ_DEV_CUDA)) {
                cr_assert(strstr(why, "cuda:") != NULL, "the reason names the device: %s", why);
            }
        }
    }
}

static void run_all(wk_plan_t *p, int batch, const float *in, float **out);
static float *input(int c, int64_t *per);

/* The graphs themselves are sound: each plans and runs on the cpu, and
 * its batch-1 rows are batch 3's first. */
Test(cuda_support, cases_run_on_the_cpu)
{
    for (int c = 0; c < N_CASES; c++) {
        wk_plan_t *p;
        char why[512];
        cr_assert_eq(plan_on(c, SQ_DEV_CPU, WK_PRECISION_FP32, &p, why, sizeof(why)), 0, "%s: %s",
                     case_names[c], why);
        int64_t per;
        float *in = input(c, &per), *one[16] = {0}, *full[16] = {0};
        run_all(p, 1, in, one);
        run_all(p, MAXB, in, full);
        for (int o = 0; o < wk_plan_n_outputs(p); o++) {
            for (int64_t k = 0; k < wk_plan_output_elems(p, o); k++)
                cr_assert(fabsf(one[o][k] - full[o][k]) <= 1e-5f * (1 + fabsf(full[o][k])),
                          "%s output %d [%lld]: %g vs %g", case_names[c], o, (long long)k,
                          (double)one[o][k], (double)full[o][k]);
            free(one[o]);
            free(full[o]);
        }
        free(in);
        wk_plan_free(p);
    }
}

/* What the cuda backend refuses is refused when a model is lowered for it,
 * with the reason of the op table's cuda rules (modeldb/runnable.c, which
 * the importer asks too), before any device work: a reflect pad, which
 * the cpu backend runs. */
Test(cuda_support, reflect_pads_stay_refused)
{
    mdb_graph_t *mg = mdb_graph_new();
    mdb_shape_t xs = {.rank = 4, .dims = {MDB_DIM_BATCH, 8, 10, 10}};
    int x = mdb_graph_add_tensor(mg, "x", MDB_DT_FLOAT, &xs);
    int y = mdb_graph_add_tensor(mg, "y", MDB_DT_FLOAT, NULL);
    mdb_graph_add_input(mg, x);
    mdb_graph_add_output(mg, y);
    int idx = mdb_graph_add_node(mg, MDB_OP_PAD, "p", &x, 1, &y, 1);
    mdb_node_set_ints(&mg->nodes[idx], "pads", (const int64_t[]){0, 0, 1, 1, 0, 0, 1, 1}, 8);
    mdb_node_set_string(&mg->nodes[idx], "mode", "reflect", 7);
    char why[512] = "";
    cr_assert_eq(mdb_graph_toposort(mg, why, sizeof(why)), 0, "%s", why);
    cr_assert_eq(mdb_graph_infer_shapes(mg, why, sizeof(why)), 0, "%s", why);
    wk_plan_opts_t o = wk_plan_opts_default();
    o.backend = SQ_DEV_CUDA;
    o.max_batch = MAXB;
    wk_plan_t *p = NULL;
    cr_assert_eq(wk_plan_create(mg, &o, &p, why, sizeof(why)), SQ_UNSUPPORTED_MODEL, "%s", why);
    cr_assert_str_eq(why, "Pad node 'p': reflect and edge pads");
    o.backend = SQ_DEV_CPU;
    cr_assert_eq(wk_plan_create(mg, &o, &p, why, sizeof(why)), 0, "%s", why);
    wk_plan_free(p);
    mdb_graph_free(mg);
}

static float *input(int c, int64_t *per)
{
    *per = 1;
    for (int i = 1; i < cases[c].in_ndim; i++)
        *per *= cases[c].in_dims[i];
    float *in = malloc((size_t)(MAXB * *per) * sizeof(float));
    uint64_t s = seed;
    seed = 99;
    for (int64_t i = 0; i < MAXB * *per; i++)
        in[i] = frand() * 2.0f;
    seed = s;
    return in;
}

static float tolerance(wk_precision_t p)
{
    switch (p) {
    case WK_PRECISION_TF32:
        return 5e-3f;
    case WK_PRECISION_FP16:
        return 1e-2f;
    case WK_PRECISION_BF16:
        return 3e-2f;
    default:
        return 1e-4f;
    }
}

static void run_all(wk_plan_t *p, int batch, const float *in, float **out)
{
    for (int i = 0; i < wk_plan_n_outputs(p); i++)
        out[i] = calloc((size_t)(wk_plan_output_elems(p, i) * MAXB), sizeof(float));
    cr_assert_eq(wk_plan_run(p, batch, (const float *[]){in}, out), 0, "run: %s",
                 wk_plan_errmsg(p));
}

static void parity(int c, wk_precision_t prec)
{
    if (!wk_backend_built(SQ_DEV_CUDA))
        cr_skip_test("this build has no cuda backend");
    wk_plan_t *ref, *p;
    char why[512];
    int rc = plan_on(c, SQ_DEV_CUDA, prec, &p, why, sizeof(why));
    if (rc == SQ_DEVICE)
        cr_skip_test("%s in %s: no GPU here (%s)", case_names[c], wk_precision_name(prec), why);
    cr_assert_eq(rc, 0, "%s in %s: %s", case_names[c], wk_precision_name(prec), why);
    cr_assert_eq(plan_on(c, SQ_DEV_CPU, WK_PRECISION_FP32, &ref, why, sizeof(why)), 0, "%s", why);
    wk_precision_t runs = wk_plan_precision(p);
    float tol = tolerance(runs);
    int64_t per;
    float *in = input(c, &per);
    for (int batch = 1; batch <= MAXB; batch += MAXB - 1) {
        float *want[16] = {0}, *got[16] = {0};
        int n_out = wk_plan_n_outputs(ref);
        cr_assert_eq(wk_plan_n_outputs(p), n_out);
        run_all(ref, batch, in, want);
        run_all(p, batch, in, got);
        for (int o = 0; o < n_out; o++) {
            int64_t n = batch * wk_plan_output_elems(ref, o);
            double worst = 0.0;
            for (int64_t k = 0; k < n; k++) {
                float w = want[o][k], v = got[o][k];
                cr_assert(isfinite(v) == isfinite(w), "%s in %s, output %d [%lld]: %g vs cpu %g",
                          case_names[c], wk_precision_name(runs), o, (long long)k, (double)v,
                          (double)w);
                if (isfinite(w) && fabsf(v - w) / (1 + fabsf(w)) > worst)
                    worst = fabsf(v - w) / (1 + fabsf(w));
            }
            cr_assert(worst <= tol, "%s in %s, batch %d, output %d: off by %g (allowed %g)",
                      case_names[c], wk_precision_name(runs), batch, o, worst, (double)tol);
        }
        for (int o = 0; o < n_out; o++) {
            free(want[o]);
            free(got[o]);
        }
    }
    free(in);
    wk_plan_free(ref);
    wk_plan_free(p);
}

#define PARITY(name, index)                                                                        \
    Test(cuda_parity, name##_fp32)                                                                 \
    {                                                                                              \
        parity(index, WK_PRECISION_FP32);                                                          \
    }                                                                                              \
    Test(cuda_parity, name##_tf32)                                                                 \
    {                                                                                              \
        parity(index, WK_PRECISION_TF32);                                                          \
    }                                                                                              \
    Test(cuda_parity, name##_fp16)                                                                 \
    {                                                                                              \
        parity(index, WK_PRECISION_FP16);                                                          \
    }                                                                                              \
    Test(cuda_parity, name##_bf16)                                                                 \
    {                                                                                              \
        parity(index, WK_PRECISION_BF16);                                                          \
    }

PARITY(convnext, 0)
PARITY(vit, 1)
PARITY(activations, 2)
PARITY(conv_posts, 3)
PARITY(binary, 4)

/* Graphs off (SQUISH_CUDA_GRAPHS=0) give the same numbers as graphs on. */
Test(cuda_parity, eager_runs_match_graphs)
{
    if (!wk_backend_built(SQ_DEV_CUDA))
        cr_skip_test("this build has no cuda backend");
    wk_plan_t *eager, *graphs;
    char why[512];
    setenv("SQUISH_CUDA_GRAPHS", "0", 1);
    int rc = plan_on(0, SQ_DEV_CUDA, WK_PRECISION_FP32, &eager, why, sizeof(why));
    unsetenv("SQUISH_CUDA_GRAPHS");
    if (rc == SQ_DEVICE)
        cr_skip_test("no GPU here (%s)", why);
    cr_assert_eq(rc, 0, "%s", why);
    cr_assert_eq(plan_on(0, SQ_DEV_CUDA, WK_PRECISION_FP32, &graphs, why, sizeof(why)), 0, "%s",
                 why);
    int64_t per;
    float *in = input(0, &per);
    for (int batch = 1; batch <= MAXB; batch++) {
        float *a[16] = {0}, *b[16] = {0};
        run_all(eager, batch, in, a);
        run_all(graphs, batch, in, b);
        int64_t n = batch * wk_plan_output_elems(eager, 0);
        cr_assert_eq(memcmp(a[0], b[0], (size_t)n * sizeof(float)), 0, "batch %d", batch);
        free(a[0]);
        free(b[0]);
    }
    free(in);
    wk_plan_free(eager);
    wk_plan_free(graphs);
}
