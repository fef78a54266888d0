/* The cpu backend's choices on the blocks of the nets people deploy on
 * CPUs (mobilenet_v3, efficientnet, regnet): what it fuses, that no step
 * runs oneDNN's reference kernels (slower by orders of magnitude), and that
 * activations are not reordered between steps that could share a layout.
 * The numbers against a naive C reference written here; speed itself is
 * measured in bench/ (ort_ab.py), not here. */
#include <criterion/criterion.h>
#include <math.h>
#include <omp.h>
#include <sq.h>
#include <stdlib.h>
#include <string.h>

#include <backend_cpu_int.h>
#include <wk_omp.h>

static uint64_t rng_state = 11;

static float frand(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) & 0xffffff) / (float)0x1000000 * 2.0f - 1.0f;
}

static float *rand_buf(int64_t n)
{
    float *p = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        p[i] = frand();
    return p;
}

/* ---- graphs and their naive reference ---- */

#define N 2

typedef struct {
    wk_graph_t *g;
    /* every value's numbers by the reference, [N, C, H, W] */
    float *ref[64];
    int64_t c[64], hw[64];
} net_t;

static int input(net_t *t, int64_t c, int64_t hw)
{
    int64_t d[4] = {N, c, hw, hw};
    int v = wk_graph_input(t->g, "x", 4, d, true);
    t->ref[v] = rand_buf(N * c * hw * hw);
    t->c[v] = c;
    t->hw[v] = hw;
    return v;
}

static int value(net_t *t, int64_t c, int64_t hw)
{
    int64_t d[4] = {N, c, hw, hw};
    int v = wk_graph_value(t->g, NULL, 4, d, true, NULL);
    t->ref[v] = calloc((size_t)(N * c * hw * hw), sizeof(float));
    t->c[v] = c;
    t->hw[v] = hw;
    return v;
}

/* k x k conv with pad k / 2, stride 1, bias; weights scaled so that values
 * stay near 1 through the net. */
static int conv_s(net_t *t, int x, int64_t oc, int k, int64_t groups, int stride)
{
    int64_t ic = t->c[x], hw = t->hw[x], icg = ic / groups, ocg = oc / groups;
    int64_t ohw = (hw + 2 * (k / 2) - k) / stride + 1;
    int64_t wd[4] = {oc, icg, k, k};
    float *w = rand_buf(oc * icg * k * k), *b = rand_buf(oc);
    for (int64_t i = 0; i < oc * icg * k * k; i++)
        w[i] /= sqrtf((float)(icg * k * k));
    int wv = wk_graph_value(t->g, NULL, 4, wd, false, w);
    int bv = wk_graph_value(t->g, NULL, 1, &oc, false, b);
    int y = value(t, oc, ohw);
    wk_step_t *s = wk_graph_step(t->g, WK_K_CONV, (int[]){x, wv, bv}, 3, y);
    s->p.conv.n_spatial = 2;
    for (int i = 0; i < 2; i++) {
        s->p.conv.kernel[i] = k;
        s->p.conv.stride[i] = stride;
        s->p.conv.dilation[i] = 1;
        s->p.conv.pad_begin[i] = s->p.conv.pad_end[i] = k / 2;
    }
    s->p.conv.groups = groups;
    const float *xr = t->ref[x];
    float *yr = t->ref[y];
    for (int64_t n = 0; n < N; n++)
        for (int64_t o = 0; o < oc; o++)
            for (int64_t i = 0; i < ohw; i++)
                for (int64_t j = 0; j < ohw; j++) {
                    double acc = b[o];
                    int64_t grp = o / ocg;
                    for (int64_t ci = 0; ci < icg; ci++)
                        for (int ki = 0; ki < k; ki++)
                            for (int kj = 0; kj < k; kj++) {
                                int64_t yy = i * stride - k / 2 + ki, xx = j * stride - k / 2 + kj;
                                if (yy < 0 || yy >= hw || xx < 0 || xx >= hw)
                                    continue;
                                acc += (double)xr[((n * ic + grp * icg + ci) * hw + yy) * hw + xx] *
                                       w[((o * icg + ci) * k + ki) * k + kj];
                            }
                    yr[((n * oc + o) * ohw + i) * ohw + j] = (float)acc;
                }
    free(w);
    free(b);
    return y;
}

static int conv(net_t *t, int x, int64_t oc, int k, int64_t groups)
{
    return conv_s(t, x, oc, k, groups, 1);
}

static float act_ref(wk_act_t a, float x)
{
    switch (a.kind) {
    case WK_ACT_RELU:
        return x > 0 ? x : 0;
    case WK_ACT_SIGMOID:
        return 1.0f / (1.0f + expf(-x));
    case WK_ACT_HARDSIGMOID:
        return fmaxf(0.0f, fminf(1.0f, a.alpha * x + a.beta));
    case WK_ACT_CLIP:
        return fmaxf(a.alpha, fminf(a.beta, x));
    default:
        cr_assert_fail("no reference for activation %d", (int)a.kind);
        return 0;
    }
}

static int act(net_t *t, int x, wk_act_t a)
{
    int y = value(t, t->c[x], t->hw[x]);
    wk_graph_step(t->g, WK_K_ELTWISE, &x, 1, y)->p.act = a;
    for (int64_t i = 0; i < N * t->c[x] * t->hw[x] * t->hw[x]; i++)
        t->ref[y][i] = act_ref(a, t->ref[x][i]);
    return y;
}

static int global_avg(net_t *t, int x)
{
    int y = value(t, t->c[x], 1);
    wk_graph_step(t->g, WK_K_GLOBALAVG, &x, 1, y);
    int64_t hw = t->hw[x] * t->hw[x];
    for (int64_t i = 0; i < N * t->c[x]; i++) {
        double acc = 0;
        for (int64_t k = 0; k < hw; k++)
            acc += t->ref[x][i * hw + k];
        t->ref[y][i] = (float)(acc / (double)hw);
    }
    return y;
}

/* a * b, b of a's shape or [N, C, 1, 1] (a squeeze-excitation's scale). */
static int mul(net_t *t, int a, int b)
{
    int full = t->hw[a] >= t->hw[b] ? a : b, part = full == a ? b : a;
    int y = value(t, t->c[full], t->hw[full]);
    wk_graph_step(t->g, WK_K_BINARY, (int[]){a, b}, 2, y)->p.binop = WK_BIN_MUL;
    int64_t hw = t->hw[full] * t->hw[full];
    for (int64_t i = 0; i < N * t->c[full] * hw; i++)
        t->ref[y][i] = t->ref[full][i] * t->ref[part][t->hw[part] == 1 ? i / hw : i];
    return y;
}

/* Global pool, 1x1 conv down and relu, 1x1 conv up and gate, times x. */
static int squeeze_excite(net_t *t, int x, int64_t mid, wk_act_t gate)
{
    int p = global_avg(t, x);
    int d = act(t, conv(t, p, mid, 1, 1), (wk_act_t){.kind = WK_ACT_RELU});
    int s = act(t, conv(t, d, t->c[x], 1, 1), gate);
    return mul(t, x, s);
}

/* a and b concatenated along the channels (of the same map size). */
static int concat(net_t *t, int a, int b)
{
    int64_t hw = t->hw[a] * t->hw[a], ca = t->c[a], cb = t->c[b];
    int y = value(t, ca + cb, t->hw[a]);
    wk_graph_step(t->g, WK_K_CONCAT, (int[]){a, b}, 2, y)->p.axis = 1;
    for (int64_t n = 0; n < N; n++) {
        memcpy(t->ref[y] + n * (ca + cb) * hw, t->ref[a] + n * ca * hw,
               (size_t)(ca * hw) * sizeof(float));
        memcpy(t->ref[y] + (n * (ca + cb) + ca) * hw, t->ref[b] + n * cb * hw,
               (size_t)(cb * hw) * sizeof(float));
    }
    return y;
}

static const wk_act_t hardsigmoid = {WK_ACT_HARDSIGMOID, 1.0f / 6.0f, 0.5f};
static const wk_act_t sigmoid = {.kind = WK_ACT_SIGMOID};

/* Plans t at max batch N, runs batches N and 1 against the reference. */
static wk_plan_t *plan_and_check(net_t *t, int x, int y)
{
    wk_graph_mark_output(t->g, y);
    char why[256];
    cr_assert_eq(wk_graph_finish(t->g, why, sizeof(why)), 0, "%s", why);
    wk_plan_opts_t o = wk_plan_opts_default();
    o.max_batch = N;
    o.threads = 2;
    int64_t ny = N * t->c[y] * t->hw[y] * t->hw[y];
    /* the graph is the plan's from here; the reference stays ours */
    float *want = t->ref[y], *in = t->ref[x];
    wk_plan_t *p = NULL;
    cr_assert_eq(wk_plan_from_graph(t->g, &o, &p, why, sizeof(why)), 0, "plan: %s", why);
    float *got = malloc((size_t)ny * sizeof(float));
    for (int b = N; b >= 1; b--) {
        cr_assert_eq(wk_plan_run(p, b, (const float *[]){in}, (float *[]){got}), 0, "%s",
                     wk_plan_errmsg(p));
        for (int64_t i = 0; i < ny / N * b; i++)
            cr_assert(fabsf(got[i] - want[i]) <= 1e-4f * (1.0f + fabsf(want[i])),
                      "batch %d element %lld: %g, reference %g", b, (long long)i, (double)got[i],
                      (double)want[i]);
    }
    free(got);
    for (int i = 0; i < 64; i++)
        free(t->ref[i]);
    return p;
}

/* No step of p runs oneDNN's reference kernels (slower by orders of
 * magnitude). */
static void expect_no_ref_kernels(const wk_plan_t *p)
{
    const cpu_be_t *be = p->be;
    cr_expect_eq(be->n_ref_kernels, 0, "%d steps run oneDNN's reference kernels",
                 be->n_ref_kernels);
}

static int count_steps(const wk_plan_t *p, wk_kernel_t kind)
{
    int n = 0;
    for (int i = 0; i < p->graph->n_steps; i++)
        n += p->graph->steps[i].kind == kind;
    return n;
}

/* The conv's post-op activations, in order, as a string: "hardswish". */
static const char *posts_of(const wk_plan_t *p, int conv_index, char *buf, size_t len)
{
    buf[0] = '\0';
    int seen = 0;
    for (int i = 0; i < p->graph->n_steps; i++) {
        const wk_step_t *s = &p->graph->steps[i];
        if (s->kind != WK_K_CONV || seen++ != conv_index)
            continue;
        for (int k = 0; k < s->n_post; k++)
            if (s->post[k].kind == WK_POST_ACT)
                snprintf(buf + strlen(buf), len - strlen(buf), "%s%s", k ? "," : "",
                         wk_act_names[s->post[k].act.kind]);
    }
    return buf;
}

/* ---- tests ---- */

/* mobilenet_v3's block: conv, hardswish spelt x * hardsigmoid(x) as opset
 * 13 exports it, squeeze-excitation gated by hardsigmoid. The SE convs on
 * a 1x1 map ran oneDNN's reference conv (32 of mobilenet_v3_large's 51 ms at
 * batch 1), and the hardswish took three steps and two reorders. */
Test(backend_cpu, mobilenet_v3_block_fuses_hardswish_and_runs_no_reference_kernel)
{
    net_t t = {.g = wk_graph_new(N)};
    int x = input(&t, 16, 8);
    int c = conv(&t, x, 32, 1, 1);
    int hs = mul(&t, c, act(&t, c, hardsigmoid));
    int dw = conv(&t, hs, 32, 3, 32);
    int y = squeeze_excite(&t, dw, 8, hardsigmoid);
    wk_plan_t *p = plan_and_check(&t, x, y);
    char posts[64];
    cr_expect_str_eq(posts_of(p, 0, posts, sizeof(posts)), "hardswish");
    cr_expect_eq(count_steps(p, WK_K_ELTWISE), 0, "every activation is a conv's post-op");
    cr_expect_eq(count_steps(p, WK_K_BINARY), 1, "only the squeeze-excitation multiply is left");
    cpu_be_t *be = p->be;
    expect_no_ref_kernels(p);
    /* the input's reorder into channels last (with AVX2 only, into the
     * 8-channel blocks its kernels choose), and nothing between steps */
    cr_expect_leq(be->n_reorders, 1, "%d reorders at max batch", be->n_reorders);
    wk_plan_free(p);
}

/* efficientnet's: swish spelt sigmoid(x) * x (operands either way round),
 * squeeze-excitation gated by sigmoid. */
Test(backend_cpu, efficientnet_block_fuses_swish_either_way_round)
{
    net_t t = {.g = wk_graph_new(N)};
    int x = input(&t, 16, 8);
    int c = conv(&t, x, 32, 1, 1);
    int s1 = mul(&t, act(&t, c, sigmoid), c);
    int d = conv(&t, s1, 32, 3, 32);
    int s2 = mul(&t, d, act(&t, d, sigmoid));
    int y = squeeze_excite(&t, s2, 8, sigmoid);
    wk_plan_t *p = plan_and_check(&t, x, y);
    char posts[64];
    cr_expect_str_eq(posts_of(p, 0, posts, sizeof(posts)), "swish");
    cr_expect_str_eq(posts_of(p, 1, posts, sizeof(posts)), "swish");
    cr_expect_eq(count_steps(p, WK_K_ELTWISE), 0);
    cpu_be_t *be = p->be;
    expect_no_ref_kernels(p);
    cr_expect_leq(be->n_reorders, 1, "%d reorders at max batch", be->n_reorders);
    wk_plan_free(p);
}

/* regnet_y's: grouped 3x3 convs of 8 channels a group between 1x1 convs,
 * squeeze-excitation on the grouped conv's output. Left to itself oneDNN
 * blocked the grouped convs by 8 channels: a reorder in and out of each,
 * and the SE multiply on 8-blocks ran its reference binary (29 of
 * regnet_y_400mf's 42 ms at batch 1). With AVX2 only, where every conv
 * chooses 8-channel blocks, the block stays in them, the SE multiply
 * included (its scale read in the blocks too: one reorder each, and one
 * back, when it was made channels last). */
Test(backend_cpu, regnet_block_keeps_channels_last_through_grouped_convs)
{
    net_t t = {.g = wk_graph_new(N)};
    int x = input(&t, 16, 10);
    int a = act(&t, conv(&t, x, 48, 1, 1), (wk_act_t){.kind = WK_ACT_RELU});
    int b = act(&t, conv(&t, a, 48, 3, 6), (wk_act_t){.kind = WK_ACT_RELU});
    int se = squeeze_excite(&t, b, 12, sigmoid);
    int y = conv(&t, se, 48, 1, 1);
    wk_plan_t *p = plan_and_check(&t, x, y);
    cpu_be_t *be = p->be;
    expect_no_ref_kernels(p);
    cr_expect_leq(be->n_reorders, 1, "%d reorders at max batch", be->n_reorders);
    wk_plan_free(p);
}

/* x * hardsigmoid(x) with other constants than hardswish's is not
 * hardswish: it stays a gate, and the numbers say so. */
Test(backend_cpu, a_gate_with_other_constants_is_not_fused_as_hardswish)
{
    net_t t = {.g = wk_graph_new(N)};
    int x = input(&t, 16, 6);
    int c = conv(&t, x, 16, 1, 1);
    int y = mul(&t, c, act(&t, c, (wk_act_t){WK_ACT_HARDSIGMOID, 0.2f, 0.5f}));
    wk_plan_t *p = plan_and_check(&t, x, y);
    cr_expect_eq(count_steps(p, WK_K_BINARY), 1);
    wk_plan_free(p);
}

/* A squeeze-excitation straight on a row-major value (here the input): the
 * pooled [N, C, 1, 1] is the same bytes row-major and channels last, so
 * the conv after it reads it in place, and must be made for the layout its
 * fast kernel chose, not the buffer's (which gave oneDNN's reference conv:
 * 2.5-10 ms each in mobilenet_v3_large). */
Test(backend_cpu, squeeze_excitation_on_a_row_major_value_runs_no_reference_kernel)
{
    net_t t = {.g = wk_graph_new(N)};
    int x = input(&t, 64, 7);
    int y = squeeze_excite(&t, x, 16, hardsigmoid);
    wk_plan_t *p = plan_and_check(&t, x, y);
    expect_no_ref_kernels(p);
    wk_plan_free(p);
}

static int count_dw_posts(const wk_plan_t *p)
{
    int n = 0;
    for (int i = 0; i < p->graph->n_steps; i++)
        for (int k = 0; k < p->graph->steps[i].n_post; k++)
            n += p->graph->steps[i].post[k].kind == WK_POST_DW;
    return n;
}

/* mobilenet_v2's blocks: 1x1 expand, relu, depthwise 3x3 (stride 1, then
 * 2), relu, 1x1 project. Each depthwise conv runs as a post-op of the 1x1
 * before it (forced here: on its own the worker fuses only expanded
 * tensors of 8 MB and up that time faster fused), on channel blocks of
 * the CPU's vector width: 16 with AVX-512, 8 with AVX2 only (oneDNN 2.6
 * computes the fusion wrongly on channels-last tensors, and has a fused
 * kernel with AVX2 only on 8-channel blocks);
 * batch 1 runs a plan of its own without the fusion; and the numbers
 * match the reference at batches 2 and 1. 112 x 112 maps:
 * on smaller ones oneDNN offers only its ref_fused_convolution (the two
 * kernels one after the other), which the worker does not take. */
Test(backend_cpu, a_depthwise_conv_runs_fused_into_the_1x1_before_it)
{
    setenv("SQUISH_CPU_DW_FUSE_MB", "always", 1);
    const wk_act_t relu = {.kind = WK_ACT_RELU};
    net_t t = {.g = wk_graph_new(N)};
    int x = input(&t, 16, 112);
    int e1 = act(&t, conv(&t, x, 96, 1, 1), relu);
    int d1 = act(&t, conv_s(&t, e1, 96, 3, 96, 1), relu);
    int p1 = conv(&t, d1, 16, 1, 1);
    int e2 = act(&t, conv(&t, p1, 96, 1, 1), relu);
    int d2 = act(&t, conv_s(&t, e2, 96, 3, 96, 2), relu);
    int y = conv(&t, d2, 24, 1, 1);
    wk_plan_t *p = plan_and_check(&t, x, y);
    unsetenv("SQUISH_CPU_DW_FUSE_MB");
    cr_expect_eq(count_dw_posts(p), 2, "both depthwise convs fused");
    cr_expect(p->small != NULL && p->min_batch == 2 && count_dw_posts(p->small) == 0,
              "batch 1 runs a plan of its own, unfused");
    cr_expect_eq(count_steps(p, WK_K_CONV), 4);
    expect_no_ref_kernels(p);
    wk_plan_free(p);
}

/* The 1x1's output read by another step too (here: multiplied by the
 * depthwise conv's) stays a value of its own: nothing is fused. */
Test(backend_cpu, a_1x1_output_read_elsewhere_keeps_its_depthwise_conv_apart)
{
    setenv("SQUISH_CPU_DW_FUSE_MB", "always", 1);
    net_t t = {.g = wk_graph_new(N)};
    int x = input(&t, 16, 8);
    int e = conv(&t, x, 32, 1, 1);
    int y = mul(&t, conv(&t, e, 32, 3, 32), e);
    wk_plan_t *p = plan_and_check(&t, x, y);
    unsetenv("SQUISH_CPU_DW_FUSE_MB");
    cr_expect_eq(count_dw_posts(p), 0);
    cr_expect_eq(count_steps(p, WK_K_CONV), 2);
    wk_plan_free(p);
}

/* What oneDNN's fused kernel cannot take stays apart: a 5x5 depthwise
 * conv (mobilenet_v3's and efficientnet's), and a depthwise conv after a
 * 1x1 that sums a residual. */
Test(backend_cpu, a_5x5_depthwise_conv_or_one_after_a_residual_stays_apart)
{
    setenv("SQUISH_CPU_DW_FUSE_MB", "always", 1);
    net_t t = {.g = wk_graph_new(N)};
    int x = input(&t, 16, 112);
    int d5 = conv(&t, conv(&t, x, 32, 1, 1), 32, 5, 32);
    int r = conv(&t, d5, 32, 1, 1);
    int64_t n = N * 32 * 112 * 112;
    int sum = value(&t, 32, 112);
    wk_graph_step(t.g, WK_K_BINARY, (int[]){r, d5}, 2, sum)->p.binop = WK_BIN_ADD;
    for (int64_t i = 0; i < n; i++)
        t.ref[sum][i] = t.ref[r][i] + t.ref[d5][i];
    int y = conv(&t, sum, 32, 3, 32);
    wk_plan_t *p = plan_and_check(&t, x, y);
    unsetenv("SQUISH_CPU_DW_FUSE_MB");
    cr_expect_eq(count_dw_posts(p), 0);
    cr_expect_eq(count_steps(p, WK_K_CONV), 4, "the residual add is the 1x1's post-op");
    wk_plan_free(p);
}

/* Unforced, a pair whose expanded tensor takes 8 MB or more (96 x 112 x
 * 112 at batch 2: 9.6 MB) is timed both ways at plan time; whichever way
 * it went, the numbers match. */
Test(backend_cpu, a_large_expanded_tensor_is_timed_both_ways_and_either_way_matches)
{
    unsetenv("SQUISH_CPU_DW_FUSE_MB");
    net_t t = {.g = wk_graph_new(N)};
    int x = input(&t, 16, 112);
    int e = act(&t, conv(&t, x, 96, 1, 1), (wk_act_t){.kind = WK_ACT_RELU});
    int y = conv(&t, conv_s(&t, e, 96, 3, 96, 2), 24, 1, 1);
    wk_plan_t *p = plan_and_check(&t, x, y);
    cr_expect_leq(count_dw_posts(p), 1);
    wk_plan_free(p);
}

/* Below SQUISH_CPU_DW_FUSE_MB nothing is even timed: the pair that
 * "always" fuses (the first test's stride-2 block, 9.6 MB between) stays
 * apart under a 1000 MB threshold. */
Test(backend_cpu, a_pair_below_the_size_threshold_stays_apart)
{
    setenv("SQUISH_CPU_DW_FUSE_MB", "1000", 1);
    net_t t = {.g = wk_graph_new(N)};
    int x = input(&t, 16, 112);
    int e = act(&t, conv(&t, x, 96, 1, 1), (wk_act_t){.kind = WK_ACT_RELU});
    int y = conv_s(&t, e, 96, 3, 96, 2);
    wk_plan_t *p = plan_and_check(&t, x, y);
    unsetenv("SQUISH_CPU_DW_FUSE_MB");
    cr_expect_eq(count_dw_posts(p), 0);
    cr_expect_null(p->small, "nothing fused: no plan of its own for batch 1");
    wk_plan_free(p);
}

/* Off: nothing fused, whatever the size. */
Test(backend_cpu, squish_cpu_dw_fuse_mb_off_fuses_nothing)
{
    setenv("SQUISH_CPU_DW_FUSE_MB", "off", 1);
    net_t t = {.g = wk_graph_new(N)};
    int x = input(&t, 16, 8);
    int y = conv_s(&t, conv(&t, x, 32, 1, 1), 32, 3, 32, 1);
    wk_plan_t *p = plan_and_check(&t, x, y);
    unsetenv("SQUISH_CPU_DW_FUSE_MB");
    cr_expect_eq(count_dw_posts(p), 0);
    wk_plan_free(p);
}

/* oneDNN's parallel regions run on the worker's own OpenMP pool
 * (worker/omp_pool.c), not libgomp's: the dynamic linker binds libdnnl's
 * GOMP_parallel to the executable's. */
Test(backend_cpu, onednn_runs_its_regions_on_the_workers_pool)
{
    unsigned long before = wk_omp_regions();
    net_t t = {.g = wk_graph_new(N)};
    int x = input(&t, 16, 16);
    int y = conv(&t, conv(&t, x, 32, 3, 1), 32, 3, 1);
    wk_plan_t *p = plan_and_check(&t, x, y);
    cr_expect_gt(wk_omp_regions(), before, "no region ran on the worker's pool");
    wk_plan_free(p);
}

/* How the pool runs a graph (backend_cpu.c, wk__cpu_way_pick): each way
 * (sleeping, spinning, the leader alone) is tried, the fastest taken with
 * a look at another every 16th run, and when the machine changes (a
 * neighbour starts: spinning turns slow, then the team turns slower than
 * its leader alone) the choice follows within a few runs, and back again. */
static void ways_in(cpu_ways_t *s, int runs, const int64_t ns[N_WAYS], int took[N_WAYS])
{
    for (int w = 0; w < N_WAYS; w++)
        took[w] = 0;
    for (int i = 0; i < runs; i++) {
        int w = wk__cpu_way_pick(s);
        cr_assert(w >= 0 && w < N_WAYS);
        took[w]++;
        wk__cpu_way_note(s, w, ns[w]);
    }
}

Test(backend_cpu, a_batch_size_runs_the_fastest_way_and_follows_the_machine)
{
    omp_set_num_threads(2);
    cpu_ways_t s = {0};
    int took[N_WAYS];
    /* quiet: spinning 3 ms, sleeping 4.5, alone 6 */
    const int64_t quiet[N_WAYS] = {4500000, 3000000, 6000000};
    ways_in(&s, 9, quiet, took);
    for (int w = 0; w < N_WAYS; w++)
        cr_expect_eq(took[w], 3, "the first runs try each way alike: way %d took %d of 9", w,
                     took[w]);
    ways_in(&s, 64, quiet, took);
    cr_expect(took[WAY_SPIN] >= 58 && took[WAY_SPIN] <= 62, "quiet: %d of 64 runs spun",
              took[WAY_SPIN]);
    cr_expect(took[WAY_SLEEP] >= 1 && took[WAY_ALONE] >= 1, "looks at the others: %d, %d",
              took[WAY_SLEEP], took[WAY_ALONE]);
    /* a neighbour on one core: spinning 12 ms, sleeping 7, alone 5 */
    const int64_t busy[N_WAYS] = {7000000, 12000000, 5000000};
    ways_in(&s, 8, busy, took);
    ways_in(&s, 64, busy, took);
    cr_expect(took[WAY_ALONE] >= 58 && took[WAY_ALONE] <= 62, "busy: %d of 64 runs alone",
              took[WAY_ALONE]);
    /* quiet again */
    ways_in(&s, 96, quiet, took);
    ways_in(&s, 64, quiet, took);
    cr_expect(took[WAY_SPIN] >= 58, "quiet again: %d of 64 runs spun", took[WAY_SPIN]);
}

/* A guest whose host runs other guests: the threads sleeping between
 * regions now and then run as fast as spinning, when the other vCPU
 * happens to be awake, mostly twice as slow. One such run must not take
 * over: believed at once, it held mnasnet0_5 at batch 1 on the sleeping
 * way for 40 runs at 1.5 times spinning's time. */
Test(backend_cpu, one_lucky_run_of_a_slow_way_does_not_take_over)
{
    omp_set_num_threads(2);
    cpu_ways_t s = {0};
    int took[N_WAYS] = {0}, prev = -1;
    for (int i = 0; i < 9 + 256; i++) {
        int w = wk__cpu_way_pick(&s);
        /* spinning 3 ms; alone 5; sleeping 2.5 when the way before was
         * another (its first run after them), else 6 */
        int64_t ns = w == WAY_SPIN    ? 3000000
                     : w == WAY_ALONE ? 5000000
                     : prev != w      ? 2500000
                                      : 6000000;
        if (i >= 9)
            took[w]++;
        wk__cpu_way_note(&s, w, ns);
        prev = w;
    }
    /* a look every 16th run, each way in turn, a lucky look run twice
     * (believed at once, sleeping took 45 of the 256 runs) */
    cr_expect_geq(took[WAY_SPIN], 220, "%d of 256 runs spun, %d slept", took[WAY_SPIN],
                  took[WAY_SLEEP]);
}

/* A plan for batches from Winograd's size up keeps a plan of its own for
 * the smaller ones (plan->small). Weights both hold in the same layout
 * are held once: resnet50's were held twice, 97 MB each. */
Test(backend_cpu, the_small_batch_plan_and_the_large_share_their_common_weights)
{
    net_t t = {.g = wk_graph_new(8)};
    int x = input(&t, 16, 16);
    int a = conv(&t, x, 16, 3, 1); /* 3x3 at 16x16: Winograd from batch 4 */
    int y = conv(&t, a, 32, 1, 1); /* 1x1: the same direct conv at any batch */
    wk_graph_mark_output(t.g, y);
    char why[256];
    cr_assert_eq(wk_graph_finish(t.g, why, sizeof(why)), 0, "%s", why);
    wk_plan_opts_t o = wk_plan_opts_default();
    o.max_batch = 8;
    o.threads = 2;
    wk_plan_t *p = NULL;
    cr_assert_eq(wk_plan_from_graph(t.g, &o, &p, why, sizeof(why)), 0, "plan: %s", why);
    cr_assert_not_null(p->small, "batches below Winograd's get a plan of their own");
    const cpu_be_t *big = p->be, *small = p->small->be;
    int shared = 0;
    for (int i = 0; i < big->n_bufs; i++) {
        const cpu_buf_t *b = &big->bufs[i];
        if (b->own_data != NULL || b->data == NULL || b->first != -2)
            continue;
        for (int k = 0; k < small->n_bufs; k++)
            shared += small->bufs[k].own_data == b->data;
    }
    cr_assert_geq(shared, 1, "the 1x1 conv's weights are held once");
    /* and both plans still compute the net */
    int64_t ny = N * 32 * 16 * 16;
    float *got = malloc((size_t)ny * sizeof(float));
    for (int b = N; b >= 1; b--) {
        cr_assert_eq(wk_plan_run(p, b, (const float *[]){t.ref[x]}, (float *[]){got}), 0, "%s",
                     wk_plan_errmsg(p));
        for (int64_t i = 0; i < ny / N * b; i++)
            cr_assert(fabsf(got[i] - t.ref[y][i]) <= 1e-4f * (1.0f + fabsf(t.ref[y][i])),
                      "batch %d element %lld", b, (long long)i);
    }
    float *big_in = malloc((size_t)(8 * 16 * 16 * 16) * sizeof(float));
    float *big_out = malloc((size_t)(8 * 32 * 16 * 16) * sizeof(float));
    for (int64_t i = 0; i < 8 * 16 * 16 * 16; i++)
        big_in[i] = t.ref[x][i % (N * 16 * 16 * 16)];
    cr_assert_eq(wk_plan_run(p, 8, (const float *[]){big_in}, (float *[]){big_out}), 0, "%s",
                 wk_plan_errmsg(p));
    for (int64_t i = 0; i < 8 * 32 * 16 * 16; i++) {
        float want = t.ref[y][i % ny];
        cr_assert(fabsf(big_out[i] - want) <= 1e-4f * (1.0f + fabsf(want)), "batch 8 element %lld",
                  (long long)i);
    }
    free(big_in);
    free(big_out);
    free(got);
    for (int i = 0; i < 64; i++)
        free(t.ref[i]);
    wk_plan_free(p);
}

/* A 3x3 conv between 1x1 convs that chose channels last (densenet's: 128
 * channels in, 32 out) runs direct in that layout, not Winograd, which
 * takes only channel blocks: its reorders in and out cost densenet121 more
 * than Winograd saved (77 of 470 ms at batch 8 on an AVX-512 guest). Where
 * the 1x1 conv chooses channel blocks itself (AVX2), Winograd reads them
 * as they are and stays. */
Test(backend_cpu, a_winograd_conv_that_would_reorder_its_input_runs_direct)
{
    net_t t = {.g = wk_graph_new(8)};
    int x = input(&t, 64, 16);
    int a = conv(&t, x, 128, 1, 1);
    int b = conv(&t, a, 32, 3, 1);
    int y = conv(&t, b, 64, 1, 1);
    wk_graph_mark_output(t.g, y);
    char why[256];
    cr_assert_eq(wk_graph_finish(t.g, why, sizeof(why)), 0, "%s", why);
    wk_plan_opts_t o = wk_plan_opts_default();
    o.max_batch = 8;
    o.threads = 2;
    wk_plan_t *p = NULL;
    cr_assert_eq(wk_plan_from_graph(t.g, &o, &p, why, sizeof(why)), 0, "plan: %s", why);
    const cpu_be_t *be = p->be;
    int si = -1;
    for (int i = 0; i < t.g->n_steps; i++)
        if (t.g->steps[i].out == b)
            si = i;
    cr_assert_geq(si, 0);
    const dnnl_memory_desc_t *in = &be->bufs[wk__cpu_vbuf(a)].md;
    bool blocked = in->format_kind == dnnl_blocked && in->format_desc.blocking.inner_nblks > 0;
    cr_log_info("the 1x1 conv's output: %s; the 3x3 conv %s", blocked ? "channel blocks" : "plain",
                be->steps[si].wino ? "Winograd" : "direct");
    if (!blocked)
        cr_expect(!be->steps[si].wino, "the 3x3 conv would reorder its input into blocks");
    /* the numbers, at batch 8 (the plan that would run Winograd) */
    float *big_in = malloc((size_t)(8 * 64 * 16 * 16) * sizeof(float));
    float *big_out = malloc((size_t)(8 * 64 * 16 * 16) * sizeof(float));
    int64_t nx = N * 64 * 16 * 16;
    for (int64_t i = 0; i < 8 * 64 * 16 * 16; i++)
        big_in[i] = t.ref[x][i % nx];
    cr_assert_eq(wk_plan_run(p, 8, (const float *[]){big_in}, (float *[]){big_out}), 0, "%s",
                 wk_plan_errmsg(p));
    for (int64_t i = 0; i < 8 * 64 * 16 * 16; i++) {
        float want = t.ref[y][i % nx];
        cr_assert(fabsf(big_out[i] - want) <= 1e-4f * (1.0f + fabsf(want)), "element %lld",
                  (long long)i);
    }
    free(big_in);
    free(big_out);
    for (int i = 0; i < 64; i++)
        free(t.ref[i]);
    wk_plan_free(p);
}

/* A BatchNorm that cannot fold into the conv before it (densenet's, after
 * a concat; here the conv's output is read twice) runs as a multiply by
 * its per-channel scale with its shift as a post-op. On the conv's channel
 * blocks with the scale row-major, oneDNN 2.6 ran that on its reference
 * kernel: 180 ms for one of densenet121's 56x56 maps, which took 1.6 s a
 * batch of 1 on an AVX2 guest (0.15 s after). */
Test(backend_cpu, a_batchnorm_on_a_convs_channel_blocks_runs_no_reference_kernel)
{
    net_t t = {.g = wk_graph_new(N)};
    int x = input(&t, 16, 14);
    int y1 = conv(&t, x, 32, 3, 1);
    int64_t cd[3] = {32, 1, 1};
    float *scale = rand_buf(32), *shift = rand_buf(32);
    int sv = wk_graph_value(t.g, NULL, 3, cd, false, scale);
    int tv = wk_graph_value(t.g, NULL, 3, cd, false, shift);
    int b = value(&t, 32, 14), y = value(&t, 32, 14);
    wk_graph_step(t.g, WK_K_BATCHNORM, (int[]){y1, sv, tv}, 3, b);
    wk_graph_step(t.g, WK_K_BINARY, (int[]){y1, b}, 2, y)->p.binop = WK_BIN_ADD;
    for (int64_t i = 0; i < N * 32 * 14 * 14; i++) {
        int64_t c = (i / (14 * 14)) % 32;
        t.ref[y][i] = t.ref[y1][i] + (t.ref[y1][i] * scale[c] + shift[c]);
    }
    free(scale);
    free(shift);
    wk_plan_t *p = plan_and_check(&t, x, y);
    cr_assert_eq(count_steps(p, WK_K_BATCHNORM), 1, "the BatchNorm stays a step of its own");
    expect_no_ref_kernels(p);
    wk_plan_free(p);
}

static int add(net_t *t, int a, int b);

static int count_catnorms(const wk_plan_t *p)
{
    const cpu_be_t *be = p->be;
    int n = 0;
    for (int i = 0; i < p->graph->n_steps; i++)
        n += be->steps[i].catn != NULL;
    return n;
}

/* A BatchNorm of x's channels, its scale and shift random, and its reference */
static int batchnorm(net_t *t, int x)
{
    int64_t c = t->c[x], hw = t->hw[x], cd[3] = {c, 1, 1};
    float *scale = rand_buf(c), *shift = rand_buf(c);
    int sv = wk_graph_value(t->g, NULL, 3, cd, false, scale);
    int tv = wk_graph_value(t->g, NULL, 3, cd, false, shift);
    int b = value(t, c, hw);
    wk_graph_step(t->g, WK_K_BATCHNORM, (int[]){x, sv, tv}, 3, b);
    for (int64_t i = 0; i < N * c * hw * hw; i++) {
        int64_t ch = (i / (hw * hw)) % c;
        t->ref[b][i] = t->ref[x][i] * scale[ch] + shift[ch];
    }
    free(scale);
    free(shift);
    return b;
}

/* The concat that writes its BatchNorm's output (densenet's) on inputs
 * of channel counts no block divides (12 and 20: read plain or channels
 * last), one the net's input, and a ReLU6 (clip) after;
 * and a concat whose output has a second use keeps both steps. */
Test(backend_cpu, a_concat_writes_the_batchnorm_after_it_in_any_layout)
{
    net_t t = {.g = wk_graph_new(N)};
    int x = input(&t, 12, 10);
    int a = conv(&t, x, 20, 3, 1);
    int b = conv(&t, a, 12, 1, 1);
    int cat = concat(&t, x, a);
    int r = act(&t, batchnorm(&t, cat), (wk_act_t){.kind = WK_ACT_CLIP, .alpha = 0, .beta = 6});
    int cat2 = concat(&t, r, b);
    int y = conv(&t, add(&t, batchnorm(&t, cat2), cat2), 16, 1, 1);
    wk_plan_t *p = plan_and_check(&t, x, y);
    cr_expect_geq(count_catnorms(p), 1, "the first concat (of two) writes its BatchNorm");
    expect_no_ref_kernels(p);
    wk_plan_free(p);
}

/* densenet's pre-activation: concat, BatchNorm, ReLU, 1x1 conv. The
 * BatchNorm cannot fold into a conv (a concat made its input), so the
 * ReLU runs as its post-op: no step of its own that reads the normalized
 * tensor and writes it again (densenet121: 62 of them, 35 of its 410 ms at
 * batch 8). */
Test(backend_cpu, a_relu_after_a_batchnorm_that_stays_runs_as_its_post_op)
{
    net_t t = {.g = wk_graph_new(N)};
    int x = input(&t, 16, 14);
    int c = conv(&t, x, 32, 3, 1);
    int r = act(&t, batchnorm(&t, concat(&t, x, c)), (wk_act_t){.kind = WK_ACT_RELU});
    int y = conv(&t, r, 32, 1, 1);
    wk_plan_t *p = plan_and_check(&t, x, y);
    cr_expect_eq(count_steps(p, WK_K_ELTWISE), 0, "the ReLU is the BatchNorm's post-op");
    cr_expect_eq(count_catnorms(p), 1, "the concat writes the BatchNorm's output");
    cr_assert_eq(count_steps(p, WK_K_BATCHNORM), 1);
    for (int i = 0; i < p->graph->n_steps; i++)
        if (p->graph->steps[i].kind == WK_K_BATCHNORM)
            cr_expect(p->graph->steps[i].n_post == 1 &&
                      p->graph->steps[i].post[0].act.kind == WK_ACT_RELU);
    expect_no_ref_kernels(p);
    wk_plan_free(p);
}

/* A concat of inputs in different layouts (the net's input in plain order
 * and a conv's output in the conv's channel blocks or channels last, as
 * densenet121's blocks concatenated a pool's plain output with its convs'
 * outputs) reads them in one layout: oneDNN 2.6 runs its reference concat,
 * element by element, on mixed ones. */
Test(backend_cpu, a_concat_of_inputs_in_different_layouts_runs_no_reference_kernel)
{
    net_t t = {.g = wk_graph_new(N)};
    int x = input(&t, 16, 14);
    int c = conv(&t, x, 32, 3, 1);
    int y = conv(&t, concat(&t, x, c), 32, 1, 1);
    wk_plan_t *p = plan_and_check(&t, x, y);
    cr_assert_eq(count_steps(p, WK_K_CONCAT), 1);
    expect_no_ref_kernels(p);
    wk_plan_free(p);
}

static int add(net_t *t, int a, int b)
{
    int y = value(t, t->c[a], t->hw[a]);
    wk_graph_step(t->g, WK_K_BINARY, (int[]){a, b}, 2, y)->p.binop = WK_BIN_ADD;
    for (int64_t i = 0; i < N * t->c[a] * t->hw[a] * t->hw[a]; i++)
        t->ref[y][i] = t->ref[a][i] + t->ref[b][i];
    return y;
}

static int count_own_convs(const wk_plan_t *p)
{
    const cpu_be_t *be = p->be;
    int n = 0;
    for (int i = 0; i < p->graph->n_steps; i++)
        n += be->steps[i].sqc != NULL;
    return n;
}

/* A resnet's blocks and their siblings: 3x3 convs with stride 1 and 2, a
 * residual summed with a relu after it, 24 output channels (a tile and a
 * half), a 5x5 conv, at batches 2 and 1 against the reference. Where the
 * CPU has AVX2 but not AVX-512, every conv whose input is in 8-channel
 * blocks runs squish's own kernel (backend_cpu_sqconv.c): all but the
 * first, which reads the net's plain input. */
static wk_plan_t *resnet_like_plan(void)
{
    net_t t = {.g = wk_graph_new(N)};
    int x = input(&t, 16, 14);
    int c1 = conv(&t, x, 24, 3, 1);
    int r1 = act(&t, conv(&t, c1, 24, 3, 1), (wk_act_t){.kind = WK_ACT_RELU});
    int c2 = conv_s(&t, r1, 32, 3, 1, 2);
    int y = act(&t, add(&t, conv(&t, c2, 32, 3, 1), c2), (wk_act_t){.kind = WK_ACT_RELU});
    int y2 = conv(&t, y, 16, 5, 1);
    return plan_and_check(&t, x, y2);
}

Test(backend_cpu, resnet_blocks_on_avx2_run_squishs_own_convs_as_the_reference)
{
    /* untimed: every conv that fits (timed, each takes the faster kernel) */
    setenv("SQUISH_CPU_OWN_CONV", "always", 1);
    wk_plan_t *p = resnet_like_plan();
    dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    bool avx2_only = isa == dnnl_cpu_isa_avx2 || isa == dnnl_cpu_isa_avx2_vnni;
    cr_expect_eq(count_own_convs(p), avx2_only ? 4 : 0, "convs on squish's own kernel");
    wk_plan_free(p);
}

Test(backend_cpu, squish_cpu_own_conv_off_leaves_every_conv_to_onednn)
{
    setenv("SQUISH_CPU_OWN_CONV", "off", 1);
    wk_plan_t *p = resnet_like_plan();
    cr_expect_eq(count_own_convs(p), 0);
    wk_plan_free(p);
}

/* A net's stem: a 7x7 stride-2 conv over the image's 3 plain channels
 * (padding 3), then a 3x3 conv; on AVX2 both run squish's own kernel, the
 * first reading the plain input, as the reference. */
Test(backend_cpu, a_stem_conv_over_the_plain_image_runs_squishs_own_kernel_as_the_reference)
{
    setenv("SQUISH_CPU_OWN_CONV", "always", 1);
    net_t t = {.g = wk_graph_new(N)};
    int x = input(&t, 3, 30);
    int s = act(&t, conv_s(&t, x, 16, 7, 1, 2), (wk_act_t){.kind = WK_ACT_RELU});
    int y = conv(&t, s, 16, 3, 1);
    int64_t nx = N * 3 * 30 * 30, ny = N * 16 * 15 * 15;
    float *in = malloc((size_t)nx * sizeof(float)), *want = malloc((size_t)ny * sizeof(float));
    memcpy(in, t.ref[x], (size_t)nx * sizeof(float));
    memcpy(want, t.ref[y], (size_t)ny * sizeof(float));
    wk_plan_t *p = plan_and_check(&t, x, y);
    dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    bool avx2_only = isa == dnnl_cpu_isa_avx2 || isa == dnnl_cpu_isa_avx2_vnni;
    cr_expect_eq(count_own_convs(p), avx2_only ? 2 : 0, "convs on squish's own kernel");
    /* Run in place (the caller's input bound where the plan allows it):
     * the stem reads the input from the arena, so the plan copies it
     * there, and a run of zeros before leaves nothing behind. */
    float *zeros = calloc((size_t)nx, sizeof(float)), *got = malloc((size_t)ny * sizeof(float));
    cr_assert_eq(wk_plan_run(p, N, (const float *[]){zeros}, (float *[]){got}), 0);
    cr_assert_eq(wk__plan_run_inplace(p, N, (const float *[]){in}, (float *[]){got}), 0, "%s",
                 wk_plan_errmsg(p));
    for (int64_t i = 0; i < ny; i++)
        cr_assert(fabsf(got[i] - want[i]) <= 1e-4f * (1.0f + fabsf(want[i])),
                  "in place: element %lld: %g, reference %g", (long long)i, (double)got[i],
                  (double)want[i]);
    free(zeros);
    free(got);
    free(in);
    free(want);
    wk_plan_free(p);
}

/* After a BatchNorm that does not fold (densenet's, after its concats),
 * which reads and writes channels last, a 3x3 conv with a residual runs squish's own kernel
 * on channels last, in and out, as the reference. */
Test(backend_cpu, a_conv_on_channels_last_runs_squishs_own_kernel_as_the_reference)
{
    setenv("SQUISH_CPU_OWN_CONV", "always", 1);
    net_t t = {.g = wk_graph_new(N)};
    int x = input(&t, 16, 10);
    int c = conv(&t, x, 32, 3, 1);
    /* densenet's BatchNorm after a concat, not folded: channels last */
    int64_t cd[3] = {32, 1, 1};
    float *scale = rand_buf(32), *shift = rand_buf(32);
    int sv = wk_graph_value(t.g, NULL, 3, cd, false, scale);
    int tv = wk_graph_value(t.g, NULL, 3, cd, false, shift);
    int bn = value(&t, 32, 10);
    wk_graph_step(t.g, WK_K_BATCHNORM, (int[]){c, sv, tv}, 3, bn);
    for (int64_t i = 0; i < N * 32 * 10 * 10; i++) {
        int64_t ch = (i / (10 * 10)) % 32;
        t.ref[bn][i] = t.ref[c][i] * scale[ch] + shift[ch];
    }
    free(scale);
    free(shift);
    int r = act(&t, bn, (wk_act_t){.kind = WK_ACT_RELU});
    int y = act(&t, add(&t, conv(&t, r, 32, 3, 1), c), (wk_act_t){.kind = WK_ACT_RELU});
    wk_plan_t *p = plan_and_check(&t, x, y);
    dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    if (isa == dnnl_cpu_isa_avx2 || isa == dnnl_cpu_isa_avx2_vnni) {
        const cpu_be_t *be = p->be;
        int own = -1;
        for (int i = 0; i < p->graph->n_steps; i++)
            if (be->steps[i].sqc != NULL)
                own = i;
        cr_assert_geq(own, 0, "the 3x3 conv runs squish's own kernel");
        const cpu_buf_t *in = &be->bufs[wk__cpu_vbuf(p->graph->steps[own].in[0])];
        dnnl_memory_desc_t last;
        dnnl_memory_desc_init_by_tag(&last, 4, in->md.dims, dnnl_f32, dnnl_acdb);
        cr_expect(dnnl_memory_desc_equal(&in->md, &last), "its input is channels last");
    }
    wk_plan_free(p);
}
