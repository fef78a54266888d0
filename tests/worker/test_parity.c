/* Backend parity: every kernel on every built backend against the cpu
 * reference (ggml's test-backend-ops habit). Each case is a small graph
 * built by hand, planned for max batch 3 and run on batches 1 and 3.
 *
 * - cpu: batch 1 must give the first row of batch 3 (the per-batch
 *   primitives over one set of layouts agree with each other);
 * - cuda: the same outputs as cpu within 1e-4 relative; skipped, with the
 *   reason, when the build has no CUDA or the machine no GPU;
 * - emu: outputs of the right shape, deterministic (its values are not
 *   math, so they are not compared). */
#include <criterion/criterion.h>
#include <math.h>
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

static int konst(wk_graph_t *g, int ndim, const int64_t *dims)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= dims[i];
    float *d = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        d[i] = frand();
    int v = wk_graph_value(g, NULL, ndim, dims, false, d);
    free(d);
    return v;
}

static int act(wk_graph_t *g, int x, const int64_t *d, int nd, wk_act_t a)
{
    int y = wk_graph_value(g, NULL, nd, d, true, NULL);
    wk_graph_step(g, WK_K_ELTWISE, &x, 1, y)->p.act = a;
    return y;
}

static void window(wk_step_t *s, int k, int st, int pb, int pe, int dil)
{
    s->p.conv.n_spatial = 2;
    for (int i = 0; i < 2; i++) {
        s->p.conv.kernel[i] = k;
        s->p.conv.stride[i] = st;
        s->p.conv.pad_begin[i] = pb;
        s->p.conv.pad_end[i] = pe;
        s->p.conv.dilation[i] = dil;
    }
    s->p.conv.groups = 1;
}

/* Builders: each makes a graph with input [MAXB, 8, 10, 10] or as noted. */
typedef wk_graph_t *(*build_fn)(void);

static wk_graph_t *start(int *x)
{
    wk_graph_t *g = wk_graph_new(MAXB);
    int64_t d[4] = {MAXB, 8, 10, 10};
    *x = wk_graph_input(g, "x", 4, d, true);
    return g;
}

static wk_graph_t *b_conv_fused(void)
{
    int x;
    wk_graph_t *g = start(&x);
    int64_t wd[4] = {8, 8, 3, 3}, bd = 8, yd[4] = {MAXB, 8, 10, 10};
    int w = konst(g, 4, wd), b = konst(g, 1, &bd);
    int c = wk_graph_value(g, NULL, 4, yd, true, NULL),
        a = wk_graph_value(g, NULL, 4, yd, true, NULL);
    window(wk_graph_step(g, WK_K_CONV, (int[]){x, w, b}, 3, c), 3, 1, 1, 1, 1);
    wk_graph_step(g, WK_K_BINARY, (int[]){c, x}, 2, a)->p.binop = WK_BIN_ADD;
    wk_graph_mark_output(g, act(g, a, yd, 4, (wk_act_t){WK_ACT_RELU, 0, 0}));
    return g;
}

/* conv + bias alone and conv + bias + relu: cuDNN's fused call with its
 * identity and relu (the residual case is b_conv_fused). */
static wk_graph_t *b_conv_bias_relu(void)
{
    int x;
    wk_graph_t *g = start(&x);
    int64_t wd[4] = {8, 8, 3, 3}, w1d[4] = {8, 8, 1, 1}, bd = 8, yd[4] = {MAXB, 8, 10, 10};
    int w = konst(g, 4, wd), b = konst(g, 1, &bd), w1 = konst(g, 4, w1d), b1 = konst(g, 1, &bd);
    int c = wk_graph_value(g, NULL, 4, yd, true, NULL),
        d = wk_graph_value(g, NULL, 4, yd, true, NULL);
    window(wk_graph_step(g, WK_K_CONV, (int[]){x, w, b}, 3, c), 3, 1, 1, 1, 1);
    int r = act(g, c, yd, 4, (wk_act_t){WK_ACT_RELU, 0, 0});
    window(wk_graph_step(g, WK_K_CONV, (int[]){r, w1, b1}, 3, d), 1, 1, 0, 0, 1);
    wk_graph_mark_output(g, d);
    return g;
}

/* x * sigmoid(x) and x * hardsigmoid(x) after convs (swish and hardswish,
 * fused into the conv where the backend can), then a squeeze-excitation
 * gated by hardsigmoid: efficientnet's and mobilenet_v3's blocks. */
static wk_graph_t *b_gates(void)
{
    int x;
    wk_graph_t *g = start(&x);
    int64_t wd[4] = {8, 8, 1, 1}, dwd[4] = {8, 1, 3, 3}, sd[4] = {4, 8, 1, 1}, ud[4] = {8, 4, 1, 1},
            bd = 8, b4 = 4, yd[4] = {MAXB, 8, 10, 10}, pd[4] = {MAXB, 8, 1, 1},
            qd[4] = {MAXB, 4, 1, 1};
    int w = konst(g, 4, wd), b = konst(g, 1, &bd), dw = konst(g, 4, dwd), db = konst(g, 1, &bd);
    int c = wk_graph_value(g, NULL, 4, yd, true, NULL),
        s1 = wk_graph_value(g, NULL, 4, yd, true, NULL);
    window(wk_graph_step(g, WK_K_CONV, (int[]){x, w, b}, 3, c), 1, 1, 0, 0, 1);
    int sg = act(g, c, yd, 4, (wk_act_t){WK_ACT_SIGMOID, 0, 0});
    wk_graph_step(g, WK_K_BINARY, (int[]){sg, c}, 2, s1)->p.binop = WK_BIN_MUL;
    int d = wk_graph_value(g, NULL, 4, yd, true, NULL),
        h = wk_graph_value(g, NULL, 4, yd, true, NULL);
    wk_step_t *st = wk_graph_step(g, WK_K_CONV, (int[]){s1, dw, db}, 3, d);
    window(st, 3, 1, 1, 1, 1);
    st->p.conv.groups = 8;
    int hs = act(g, d, yd, 4, (wk_act_t){WK_ACT_HARDSIGMOID, 1.0f / 6.0f, 0.5f});
    wk_graph_step(g, WK_K_BINARY, (int[]){d, hs}, 2, h)->p.binop = WK_BIN_MUL;
    int p = wk_graph_value(g, NULL, 4, pd, true, NULL);
    wk_graph_step(g, WK_K_GLOBALAVG, &h, 1, p);
    int sw = konst(g, 4, sd), sb = konst(g, 1, &b4), uw = konst(g, 4, ud), ub = konst(g, 1, &bd);
    int q = wk_graph_value(g, NULL, 4, qd, true, NULL),
        u = wk_graph_value(g, NULL, 4, pd, true, NULL);
    window(wk_graph_step(g, WK_K_CONV, (int[]){p, sw, sb}, 3, q), 1, 1, 0, 0, 1);
    int qr = act(g, q, qd, 4, (wk_act_t){WK_ACT_RELU, 0, 0});
    window(wk_graph_step(g, WK_K_CONV, (int[]){qr, uw, ub}, 3, u), 1, 1, 0, 0, 1);
    int gate = act(g, u, pd, 4, (wk_act_t){WK_ACT_HARDSIGMOID, 1.0f / 6.0f, 0.5f});
    int y = wk_graph_value(g, NULL, 4, yd, true, NULL);
    wk_graph_step(g, WK_K_BINARY, (int[]){h, gate}, 2, y)->p.binop = WK_BIN_MUL;
    wk_graph_mark_output(g, y);
    return g;
}

static wk_graph_t *b_conv_grouped_strided(void)
{
    int x;
    wk_graph_t *g = start(&x);
    int64_t wd[4] = {16, 2, 3, 3}, yd[4] = {MAXB, 16, 5, 5};
    int w = konst(g, 4, wd), y = wk_graph_value(g, NULL, 4, yd, true, NULL);
    wk_step_t *s = wk_graph_step(g, WK_K_CONV, (int[]){x, w}, 2, y);
    window(s, 3, 2, 1, 1, 1);
    s->p.conv.groups = 4;
    wk_graph_mark_output(g, act(g, y, yd, 4, (wk_act_t){WK_ACT_CLIP, 0.0f, 6.0f}));
    return g;
}

static wk_graph_t *b_conv_depthwise_dilated(void)
{
    int x;
    wk_graph_t *g = start(&x);
    int64_t wd[4] = {8, 1, 3, 3}, yd[4] = {MAXB, 8, 6, 6};
    int w = konst(g, 4, wd), y = wk_graph_value(g, NULL, 4, yd, true, NULL);
    wk_step_t *s = wk_graph_step(g, WK_K_CONV, (int[]){x, w}, 2, y);
    window(s, 3, 1, 0, 0, 2);
    s->p.conv.groups = 8;
    wk_graph_mark_output(g, y);
    return g;
}

static wk_graph_t *b_batchnorm_alone(void)
{
    int x;
    wk_graph_t *g = start(&x);
    int64_t cd[3] = {8, 1, 1}, yd[4] = {MAXB, 8, 10, 10};
    int s = konst(g, 3, cd), t = konst(g, 3, cd), y = wk_graph_value(g, NULL, 4, yd, true, NULL);
    wk_graph_step(g, WK_K_BATCHNORM, (int[]){x, s, t}, 3, y);
    wk_graph_mark_output(g, y);
    return g;
}

static wk_graph_t *b_pools(void)
{
    int x;
    wk_graph_t *g = start(&x);
    int64_t md[4] = {MAXB, 8, 5, 5}, gd[4] = {MAXB, 8, 1, 1};
    int m = wk_graph_value(g, NULL, 4, md, true, NULL),
        a = wk_graph_value(g, NULL, 4, md, true, NULL);
    int gl = wk_graph_value(g, NULL, 4, gd, true, NULL);
    window(wk_graph_step(g, WK_K_MAXPOOL, &x, 1, m), 3, 2, 0, 1, 1); /* ceil-mode pads */
    wk_step_t *s = wk_graph_step(g, WK_K_AVGPOOL, &m, 1, a);
    window(s, 3, 1, 1, 1, 1);
    s->p.conv.count_include_pad = 1;
    wk_graph_step(g, WK_K_GLOBALAVG, &a, 1, gl);
    wk_graph_mark_output(g, gl);
    wk_graph_mark_output(g, a);
    return g;
}

static wk_graph_t *b_activations(void)
{
    int x;
    wk_graph_t *g = start(&x);
    int64_t d[4] = {MAXB, 8, 10, 10};
    wk_act_t acts[] = {{WK_ACT_LEAKY_RELU, 0.1f, 0},
                       {WK_ACT_SIGMOID, 0, 0},
                       {WK_ACT_HARDSIGMOID, 0.2f, 0.5f},
                       {WK_ACT_HARDSWISH, 0, 0},
                       {WK_ACT_CLIP, -0.3f, 0.4f}};
    for (size_t i = 0; i < sizeof(acts) / sizeof(acts[0]); i++)
        wk_graph_mark_output(g, act(g, x, d, 4, acts[i]));
    return g;
}

static wk_graph_t *b_binary_broadcast(void)
{
    int x;
    wk_graph_t *g = start(&x);
    int64_t d[4] = {MAXB, 8, 10, 10}, cd[3] = {8, 1, 1}, sd[1] = {10};
    int c = konst(g, 3, cd), s = konst(g, 1, sd);
    int y1 = wk_graph_value(g, NULL, 4, d, true, NULL),
        y2 = wk_graph_value(g, NULL, 4, d, true, NULL);
    int y3 = wk_graph_value(g, NULL, 4, d, true, NULL);
    wk_graph_step(g, WK_K_BINARY, (int[]){x, c}, 2, y1)->p.binop = WK_BIN_MUL;
    wk_graph_step(g, WK_K_BINARY, (int[]){s, y1}, 2, y2)->p.binop = WK_BIN_SUB;
    wk_graph_step(g, WK_K_BINARY, (int[]){y2, x}, 2, y3)->p.binop = WK_BIN_ADD;
    wk_graph_mark_output(g, y3);
    return g;
}

static wk_graph_t *b_layout_ops(void)
{
    int x;
    wk_graph_t *g = start(&x);
    int64_t cd[4] = {MAXB, 16, 10, 10}, td[4] = {MAXB, 10, 10, 16}, sd[4] = {MAXB, 10, 10, 5};
    int64_t pd[4] = {MAXB, 10, 12, 7}, rd[2] = {MAXB, 840};
    int c = wk_graph_value(g, NULL, 4, cd, true, NULL),
        t = wk_graph_value(g, NULL, 4, td, true, NULL);
    int s = wk_graph_value(g, NULL, 4, sd, true, NULL),
        p = wk_graph_value(g, NULL, 4, pd, true, NULL);
    int r = wk_graph_value(g, NULL, 2, rd, true, NULL);
    wk_graph_step(g, WK_K_CONCAT, (int[]){x, x}, 2, c)->p.axis = 1;
    wk_step_t *st = wk_graph_step(g, WK_K_TRANSPOSE, &c, 1, t);
    st->p.perm[0] = 0;
    st->p.perm[1] = 2;
    st->p.perm[2] = 3;
    st->p.perm[3] = 1;
    st = wk_graph_step(g, WK_K_SLICE, &t, 1, s);
    for (int i = 0; i < 4; i++)
        st->p.slice.step[i] = 1;
    st->p.slice.start[3] = 2;
    st->p.slice.step[3] = 3;
    st = wk_graph_step(g, WK_K_PAD, &s, 1, p);
    st->p.pad.begin[2] = 1;
    st->p.pad.end[2] = 1;
    st->p.pad.end[3] = 2;
    st->p.pad.value = 0.5f;
    wk_graph_step(g, WK_K_COPY, &p, 1, r);
    wk_graph_mark_output(g, r);
    return g;
}

/* DenseNet's concat of many inputs (the cpu backend once stopped at 8):
 * twelve sources, x and relu(x) in turn. */
static wk_graph_t *b_concat_many(void)
{
    int x;
    wk_graph_t *g = start(&x);
    int64_t d[4] = {MAXB, 8, 10, 10}, cd[4] = {MAXB, 96, 10, 10};
    int r = wk_graph_value(g, NULL, 4, d, true, NULL);
    wk_graph_step(g, WK_K_ELTWISE, &x, 1, r)->p.act.kind = WK_ACT_RELU;
    int ins[12];
    for (int i = 0; i < 12; i++)
        ins[i] = i % 2 ? r : x;
    int c = wk_graph_value(g, NULL, 4, cd, true, NULL);
    wk_graph_step(g, WK_K_CONCAT, ins, 12, c)->p.axis = 1;
    wk_graph_mark_output(g, c);
    return g;
}

static wk_graph_t *b_head(void)
{
    /* global pool -> reshape -> gemm -> softmax, and reduce-mean, matmul */
    int x;
    wk_graph_t *g = start(&x);
    int64_t gd[4] = {MAXB, 8, 1, 1}, fd[2] = {MAXB, 8}, wd[2] = {5, 8}, bd = 5, yd[2] = {MAXB, 5};
    int64_t md[4] = {MAXB, 8, 10, 1}, kd[2] = {10, 4}, od[4] = {MAXB, 8, 10, 4};
    int gp = wk_graph_value(g, NULL, 4, gd, true, NULL),
        f = wk_graph_value(g, NULL, 2, fd, true, NULL);
    int w = konst(g, 2, wd), b = konst(g, 1, &bd);
    int gm = wk_graph_value(g, NULL, 2, yd, true, NULL),
        sm = wk_graph_value(g, NULL, 2, yd, true, NULL);
    wk_graph_step(g, WK_K_GLOBALAVG, &x, 1, gp);
    wk_graph_step(g, WK_K_COPY, &gp, 1, f);
    wk_step_t *s = wk_graph_step(g, WK_K_GEMM, (int[]){f, w, b}, 3, gm);
    s->p.gemm.trans_b = 1;
    s->p.gemm.alpha = 1.0f;
    s->p.gemm.beta = 1.0f;
    wk_graph_step(g, WK_K_SOFTMAX, &gm, 1, sm)->p.axis = 1;
    int rm = wk_graph_value(g, NULL, 4, md, true, NULL);
    wk_graph_step(g, WK_K_REDUCE_MEAN, &x, 1, rm)->p.reduce.axes_mask = 8;
    int k = konst(g, 2, kd), mm = wk_graph_value(g, NULL, 4, od, true, NULL);
    wk_graph_step(g, WK_K_MATMUL, (int[]){x, k}, 2, mm);
    wk_graph_mark_output(g, sm);
    wk_graph_mark_output(g, rm);
    wk_graph_mark_output(g, mm);
    return g;
}

typedef struct {
    float *in;
    float *out[8];
    int64_t out_per[8];
    int n_out;
} run_t;

static int plan_on(build_fn build, sq_dev_kind_t kind, wk_plan_t **p, char *why, int n)
{
    seed = 7; /* the same constants for every backend */
    wk_graph_t *g = build();
    wk_plan_opts_t o = wk_plan_opts_default();
    o.backend = kind;
    o.max_batch = MAXB;
    int64_t lat[MAXB] = {1000, 1200, 1400};
    o.emu_latency_us = lat;
    o.emu_n_latency = MAXB;
    return wk_plan_from_graph(g, &o, p, why, n);
}

static void run_on(wk_plan_t *p, int batch, const float *in, run_t *r)
{
    r->n_out = wk_plan_n_outputs(p);
    for (int i = 0; i < r->n_out; i++) {
        r->out_per[i] = wk_plan_output_elems(p, i);
        r->out[i] = calloc((size_t)(r->out_per[i] * MAXB), sizeof(float));
    }
    cr_assert_eq(wk_plan_run(p, batch, (const float *[]){in}, r->out), 0, "run: %s",
                 wk_plan_errmsg(p));
}

static void free_run(run_t *r)
{
    for (int i = 0; i < r->n_out; i++)
        free(r->out[i]);
}

static float *input(void)
{
    float *in = malloc(MAXB * 8 * 100 * sizeof(float));
    uint64_t s = seed;
    seed = 99;
    for (int i = 0; i < MAXB * 800; i++)
        in[i] = frand() * 2.0f;
    seed = s;
    return in;
}

static void check_cpu(build_fn build, const char *name)
{
    wk_plan_t *p;
    char why[512];
    cr_assert_eq(plan_on(build, SQ_DEV_CPU, &p, why, sizeof(why)), 0, "%s: %s", name, why);
    float *in = input();
    run_t full, one;
    run_on(p, MAXB, in, &full);
    run_on(p, 1, in, &one);
    for (int o = 0; o < full.n_out; o++)
        for (int64_t k = 0; k < full.out_per[o]; k++)
            cr_assert_float_eq(one.out[o][k], full.out[o][k], 1e-5f * (1 + fabsf(full.out[o][k])),
                               "%s output %d [%lld]: batch 1 %g, batch 3 %g", name, o, (long long)k,
                               (double)one.out[o][k], (double)full.out[o][k]);
    free_run(&full);
    free_run(&one);
    free(in);
    wk_plan_free(p);
}

static void check_backend(build_fn build, const char *name, sq_dev_kind_t kind)
{
    if (!wk_backend_built(kind))
        cr_skip_test("%s: this build has no %s backend", name, sq_dev_kind_name(kind));
    wk_plan_t *ref, *p;
    char why[512];
    int rc = plan_on(build, kind, &p, why, sizeof(why));
    if (rc == SQ_DEVICE)
        cr_skip_test("%s on %s: no device here (%s)", name, sq_dev_kind_name(kind), why);
    cr_assert_eq(rc, 0, "%s on %s: %s", name, sq_dev_kind_name(kind), why);
    cr_assert_eq(plan_on(build, SQ_DEV_CPU, &ref, why, sizeof(why)), 0, "%s", why);
    float *in = input();
    for (int batch = 1; batch <= MAXB; batch += MAXB - 1) {
        run_t want, got;
        run_on(ref, batch, in, &want);
        run_on(p, batch, in, &got);
        cr_assert_eq(got.n_out, want.n_out);
        for (int o = 0; o < want.n_out; o++) {
            cr_assert_eq(got.out_per[o], want.out_per[o]);
            if (kind == SQ_DEV_EMU)
                continue; /* shapes only: the emulated device does no math */
            for (int64_t k = 0; k < batch * want.out_per[o]; k++)
                cr_assert(fabsf(got.out[o][k] - want.out[o][k]) <=
                              1e-4f * (1 + fabsf(want.out[o][k])),
                          "%s on %s, batch %d, output %d [%lld]: %g vs cpu %g", name,
                          sq_dev_kind_name(kind), batch, o, (long long)k, (double)got.out[o][k],
                          (double)want.out[o][k]);
        }
        free_run(&want);
        free_run(&got);
    }
    free(in);
    wk_plan_free(ref);
    wk_plan_free(p);
}

#define PARITY(name)                                                                               \
    Test(parity_cpu, name)                                                                         \
    {                                                                                              \
        check_cpu(b_##name, #name);                                                                \
    }                                                                                              \
    Test(parity_cuda, name)                                                                        \
    {                                                                                              \
        check_backend(b_##name, #name, SQ_DEV_CUDA);                                               \
    }                                                                                              \
    Test(parity_emu, name)                                                                         \
    {                                                                                              \
        check_backend(b_##name, #name, SQ_DEV_EMU);                                                \
    }

PARITY(conv_fused)
PARITY(conv_bias_relu)
PARITY(gates)
PARITY(conv_grouped_strided)
PARITY(conv_depthwise_dilated)
PARITY(batchnorm_alone)
PARITY(pools)
PARITY(activations)
PARITY(binary_broadcast)
PARITY(layout_ops)
PARITY(head)
PARITY(concat_many)

Test(parity, cuda_without_a_device_fails_soft_with_a_reason)
{
    if (!wk_backend_built(SQ_DEV_CUDA)) {
        wk_plan_t *p;
        char why[256];
        cr_assert_eq(plan_on(b_pools, SQ_DEV_CUDA, &p, why, sizeof(why)), SQ_DEVICE);
        cr_assert(strstr(why, "no cuda backend") != NULL, "%s", why);
        return;
    }
    wk_plan_t *p = NULL;
    char why[256] = "";
    int rc = plan_on(b_pools, SQ_DEV_CUDA, &p, why, sizeof(why));
    if (rc == 0) {
        wk_plan_free(p);
        cr_skip_test("a GPU is present: nothing to fail");
    }
    cr_assert_eq(rc, SQ_DEVICE, "%s", why);
    cr_assert_null(p);
    cr_assert(strstr(why, "cuda:0") != NULL, "the reason names the device: %s", why);
}
