/* The executor on hand-built graphs: buffer planning, fusion, every kernel
 * against a naive C reference written here, batch sizes below max (the
 * emulated backend: test_backend_emu.c). */
#include <criterion/criterion.h>
#include <math.h>
#include <mdb_graph.h>
#include <sq.h>
#include <stdlib.h>
#include <string.h>
#include <wk_exec_int.h>

static uint64_t rng_state = 42;

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

static void assert_close(const float *got, const float *want, int64_t n, float tol,
                         const char *what)
{
    for (int64_t i = 0; i < n; i++) {
        float d = fabsf(got[i] - want[i]), m = fabsf(want[i]);
        cr_assert(d <= tol * (1.0f + m), "%s: element %lld got %g want %g", what, (long long)i,
                  (double)got[i], (double)want[i]);
    }
}

/* ---- naive references ---- */

typedef struct {
    int64_t n, c, h, w, oc, kh, kw, sh, sw, dh, dw, pt, pl, pb, pr, groups;
} conv_geom_t;

static int64_t out_dim(int64_t in, int64_t k, int64_t s, int64_t d, int64_t p0, int64_t p1)
{
    return (in + p0 + p1 - d * (k - 1) - 1) / s + 1;
}

static void ref_conv(const conv_geom_t *g, const float *x, const float *w, const float *b, float *y)
{
    int64_t oh = out_dim(g->h, g->kh, g->sh, g->dh, g->pt, g->pb);
    int64_t ow = out_dim(g->w, g->kw, g->sw, g->dw, g->pl, g->pr);
    int64_t icg = g->c / g->groups, ocg = g->oc / g->groups;
    for (int64_t n = 0; n < g->n; n++)
        for (int64_t o = 0; o < g->oc; o++)
            for (int64_t i = 0; i < oh; i++)
                for (int64_t j = 0; j < ow; j++) {
                    double acc = b ? b[o] : 0;
                    int64_t grp = o / ocg;
                    for (int64_t ci = 0; ci < icg; ci++)
                        for (int64_t ki = 0; ki < g->kh; ki++)
                            for (int64_t kj = 0; kj < g->kw; kj++) {
                                int64_t yy = i * g->sh - g->pt + ki * g->dh;
                                int64_t xx = j * g->sw - g->pl + kj * g->dw;
                                if (yy < 0 || yy >= g->h || xx < 0 || xx >= g->w)
                                    continue;
                                acc +=
                                    (double)
                                        x[((n * g->c + grp * icg + ci) * g->h + yy) * g->w + xx] *
                                    w[((o * icg + ci) * g->kh + ki) * g->kw + kj];
                            }
                    y[((n * g->oc + o) * oh + i) * ow + j] = (float)acc;
                }
}

/* Builds input -> conv -> output with the geometry, at max batch g->n. */
static wk_graph_t *conv_graph(const conv_geom_t *g, const float *w, const float *b)
{
    wk_graph_t *gr = wk_graph_new((int)g->n);
    int64_t xd[4] = {g->n, g->c, g->h, g->w};
    int64_t wd[4] = {g->oc, g->c / g->groups, g->kh, g->kw};
    int64_t yd[4] = {g->n, g->oc, out_dim(g->h, g->kh, g->sh, g->dh, g->pt, g->pb),
                     out_dim(g->w, g->kw, g->sw, g->dw, g->pl, g->pr)};
    int x = wk_graph_input(gr, "x", 4, xd, true);
    int wv = wk_graph_value(gr, "w", 4, wd, false, w);
    int bv = b ? wk_graph_value(gr, "b", 1, &g->oc, false, b) : -1;
    int y = wk_graph_value(gr, "y", 4, yd, true, NULL);
    int in[3] = {x, wv, bv};
    wk_step_t *s = wk_graph_step(gr, WK_K_CONV, in, b ? 3 : 2, y);
    s->p.conv.n_spatial = 2;
    s->p.conv.kernel[0] = g->kh;
    s->p.conv.kernel[1] = g->kw;
    s->p.conv.stride[0] = g->sh;
    s->p.conv.stride[1] = g->sw;
    s->p.conv.dilation[0] = g->dh;
    s->p.conv.dilation[1] = g->dw;
    s->p.conv.pad_begin[0] = g->pt;
    s->p.conv.pad_begin[1] = g->pl;
    s->p.conv.pad_end[0] = g->pb;
    s->p.conv.pad_end[1] = g->pr;
    s->p.conv.groups = g->groups;
    wk_graph_mark_output(gr, y);
    return gr;
}

static wk_plan_t *make_plan(wk_graph_t *g, sq_dev_kind_t kind)
{
    wk_plan_opts_t o = wk_plan_opts_default();
    o.backend = kind;
    o.max_batch = g->max_batch;
    char why[512];
    wk_plan_t *p = NULL;
    int rc = wk_plan_from_graph(g, &o, &p, why, sizeof(why));
    cr_assert_eq(rc, 0, "plan: %s", why);
    return p;
}

static void check_conv(conv_geom_t g)
{
    int64_t oh = out_dim(g.h, g.kh, g.sh, g.dh, g.pt, g.pb);
    int64_t ow = out_dim(g.w, g.kw, g.sw, g.dw, g.pl, g.pr);
    float *x = rand_buf(g.n * g.c * g.h * g.w);
    float *w = rand_buf(g.oc * (g.c / g.groups) * g.kh * g.kw);
    float *b = rand_buf(g.oc);
    int64_t ny = g.n * g.oc * oh * ow;
    float *want = malloc((size_t)ny * sizeof(float)), *got = malloc((size_t)ny * sizeof(float));
    wk_plan_t *p = make_plan(conv_graph(&g, w, b), SQ_DEV_CPU);
    /* every batch size, the same plan */
    for (int64_t batch = 1; batch <= g.n; batch++) {
        conv_geom_t gb = g;
        gb.n = batch;
        ref_conv(&gb, x, w, b, want);
        const float *ins[1] = {x};
        float *outs[1] = {got};
        cr_assert_eq(wk_plan_run(p, (int)batch, ins, outs), 0, "%s", wk_plan_errmsg(p));
        assert_close(got, want, batch * g.oc * oh * ow, 1e-4f, "conv");
    }
    wk_plan_free(p);
    free(x);
    free(w);
    free(b);
    free(want);
    free(got);
}

Test(exec, conv_plain_strided_padded_on_every_batch_size)
{
    check_conv((conv_geom_t){.n = 3,
                             .c = 3,
                             .h = 17,
                             .w = 15,
                             .oc = 16,
                             .kh = 3,
                             .kw = 3,
                             .sh = 2,
                             .sw = 2,
                             .dh = 1,
                             .dw = 1,
                             .pt = 1,
                             .pl = 1,
                             .pb = 1,
                             .pr = 1,
                             .groups = 1});
}

/* The precisions a model's config names (sq_device.h) are the worker's,
 * value for value: a load carries them by number. */
Test(exec, precision_names_are_the_gateways)
{
    for (int p = 0; p < WK_PRECISION_COUNT_; p++) {
        cr_assert_str_eq(wk_precision_name((wk_precision_t)p), sq_precision_name(p));
        cr_assert_eq(wk_precision_parse(sq_precision_name(p)), p);
    }
    cr_assert_eq(WK_PRECISION_COUNT_, SQ_PRECISION_COUNT);
}

/* The cpu backend runs FP32 whatever a plan asks for, and says so. */
Test(exec, a_cpu_plan_runs_fp32_whatever_it_is_asked)
{
    conv_geom_t g = {.n = 2,
                     .c = 3,
                     .h = 8,
                     .w = 8,
                     .oc = 4,
                     .kh = 3,
                     .kw = 3,
                     .sh = 1,
                     .sw = 1,
                     .dh = 1,
                     .dw = 1,
                     .pt = 1,
                     .pl = 1,
                     .pb = 1,
                     .pr = 1,
                     .groups = 1};
    float *w = rand_buf(g.oc * g.c * g.kh * g.kw), *b = rand_buf(g.oc);
    for (int p = 0; p < WK_PRECISION_COUNT_; p++) {
        wk_plan_opts_t o = wk_plan_opts_default();
        o.max_batch = 2;
        o.precision = (wk_precision_t)p;
        char why[512];
        wk_plan_t *plan = NULL;
        cr_assert_eq(wk_plan_from_graph(conv_graph(&g, w, b), &o, &plan, why, sizeof(why)), 0, "%s",
                     why);
        cr_assert_eq(wk_plan_precision(plan), WK_PRECISION_FP32, "asked %s",
                     wk_precision_name((wk_precision_t)p));
        wk_plan_free(plan);
    }
    free(w);
    free(b);
}

/* A 3x3 stride-1 conv in a plan for 8: Winograd from batch 4 up, direct
 * below (each size its own weights layout), the same answers at every size. */
Test(exec, conv_3x3_winograd_and_direct_sizes_of_one_plan)
{
    check_conv((conv_geom_t){.n = 8,
                             .c = 16,
                             .h = 14,
                             .w = 15,
                             .oc = 32,
                             .kh = 3,
                             .kw = 3,
                             .sh = 1,
                             .sw = 1,
                             .dh = 1,
                             .dw = 1,
                             .pt = 1,
                             .pl = 1,
                             .pb = 1,
                             .pr = 1,
                             .groups = 1});
}

/* The backend vtable's optional split_batch: the cpu backend, which runs
 * that conv with Winograd from batch 4 up, gives batches 1..3 a plan of
 * their own; the emulated backend has no such hook. */
Test(exec, a_backend_split_batch_gives_small_batches_a_plan_of_their_own)
{
    conv_geom_t g = {.n = 8,
                     .c = 16,
                     .h = 14,
                     .w = 15,
                     .oc = 32,
                     .kh = 3,
                     .kw = 3,
                     .sh = 1,
                     .sw = 1,
                     .dh = 1,
                     .dw = 1,
                     .pt = 1,
                     .pl = 1,
                     .pb = 1,
                     .pr = 1,
                     .groups = 1};
    cr_assert_null(wk_backend_emu.split_batch);
    cr_assert_not_null(wk_backend_cpu.split_batch);
    float *w = rand_buf(g.oc * g.c * g.kh * g.kw);
    wk_graph_t *gr = conv_graph(&g, w, NULL);
    cr_assert_eq(wk_backend_cpu.split_batch(gr), 4);
    wk_plan_t *p = make_plan(gr, SQ_DEV_CPU);
    cr_assert_not_null(p->small);
    cr_assert_eq(p->min_batch, 4);
    cr_assert_eq(p->small->opts.max_batch, 3);
    wk_plan_free(p);
    free(w);
}

Test(exec, conv_grouped_dilated_asymmetric_pads)
{
    check_conv((conv_geom_t){.n = 2,
                             .c = 8,
                             .h = 12,
                             .w = 11,
                             .oc = 12,
                             .kh = 3,
                             .kw = 2,
                             .sh = 1,
                             .sw = 2,
                             .dh = 2,
                             .dw = 1,
                             .pt = 0,
                             .pl = 2,
                             .pb = 3,
                             .pr = 1,
                             .groups = 4});
}

Test(exec, conv_depthwise)
{
    check_conv((conv_geom_t){.n = 2,
                             .c = 32,
                             .h = 14,
                             .w = 14,
                             .oc = 32,
                             .kh = 3,
                             .kw = 3,
                             .sh = 2,
                             .sw = 2,
                             .dh = 1,
                             .dw = 1,
                             .pt = 1,
                             .pl = 1,
                             .pb = 1,
                             .pr = 1,
                             .groups = 32});
}

Test(exec, conv_pointwise_wide)
{
    check_conv((conv_geom_t){.n = 2,
                             .c = 64,
                             .h = 7,
                             .w = 7,
                             .oc = 96,
                             .kh = 1,
                             .kw = 1,
                             .sh = 1,
                             .sw = 1,
                             .dh = 1,
                             .dw = 1,
                             .groups = 1});
}

/* conv -> batchnorm -> add(residual) -> relu: fused into one conv step,
 * same numbers as the unfused reference. */
Test(exec, batchnorm_residual_and_relu_fuse_into_the_conv)
{
    conv_geom_t g = {.n = 2,
                     .c = 16,
                     .h = 9,
                     .w = 9,
                     .oc = 16,
                     .kh = 3,
                     .kw = 3,
                     .sh = 1,
                     .sw = 1,
                     .dh = 1,
                     .dw = 1,
                     .pt = 1,
                     .pl = 1,
                     .pb = 1,
                     .pr = 1,
                     .groups = 1};
    float *x = rand_buf(2 * 16 * 81), *w = rand_buf(16 * 16 * 9), *scale = rand_buf(16),
          *shift = rand_buf(16);
    wk_graph_t *gr = wk_graph_new(2);
    int64_t xd[4] = {2, 16, 9, 9}, wd[4] = {16, 16, 3, 3}, cd[3] = {16, 1, 1};
    int xv = wk_graph_input(gr, "x", 4, xd, true);
    int wv = wk_graph_value(gr, "w", 4, wd, false, w);
    int sv = wk_graph_value(gr, "s", 3, cd, false, scale);
    int tv = wk_graph_value(gr, "t", 3, cd, false, shift);
    int c1 = wk_graph_value(gr, NULL, 4, xd, true, NULL);
    int b1 = wk_graph_value(gr, NULL, 4, xd, true, NULL);
    int a1 = wk_graph_value(gr, NULL, 4, xd, true, NULL);
    int r1 = wk_graph_value(gr, "y", 4, xd, true, NULL);
    wk_step_t *s = wk_graph_step(gr, WK_K_CONV, (int[]){xv, wv}, 2, c1);
    s->p.conv.n_spatial = 2;
    for (int i = 0; i < 2; i++) {
        s->p.conv.kernel[i] = 3;
        s->p.conv.stride[i] = s->p.conv.dilation[i] = 1;
        s->p.conv.pad_begin[i] = s->p.conv.pad_end[i] = 1;
    }
    s->p.conv.groups = 1;
    wk_graph_step(gr, WK_K_BATCHNORM, (int[]){c1, sv, tv}, 3, b1);
    wk_graph_step(gr, WK_K_BINARY, (int[]){xv, b1}, 2, a1)->p.binop = WK_BIN_ADD;
    wk_graph_step(gr, WK_K_ELTWISE, (int[]){a1}, 1, r1)->p.act.kind = WK_ACT_RELU;
    wk_graph_mark_output(gr, r1);
    char why[256];
    cr_assert_eq(wk_graph_finish(gr, why, sizeof(why)), 0, "%s", why);
    wk_plan_t *p = make_plan(gr, SQ_DEV_CPU);
    cr_assert_eq(p->graph->n_steps, 1, "fused into %d steps", p->graph->n_steps);
    cr_assert_eq(p->graph->steps[0].n_post, 2);

    float *want = malloc(sizeof(float) * 2 * 16 * 81), *got = malloc(sizeof(float) * 2 * 16 * 81);
    ref_conv(&g, x, w, NULL, want);
    for (int64_t i = 0; i < 2 * 16 * 81; i++) {
        int64_t c = (i / 81) % 16;
        float v = want[i] * scale[c] + shift[c] + x[i];
        want[i] = v > 0 ? v : 0;
    }
    cr_assert_eq(wk_plan_run(p, 2, (const float *[]){x}, (float *[]){got}), 0, "%s",
                 wk_plan_errmsg(p));
    assert_close(got, want, 2 * 16 * 81, 1e-4f, "fused");
    wk_plan_free(p);
    free(x);
    free(w);
    free(scale);
    free(shift);
    free(want);
    free(got);
}

Test(exec, arena_never_overlaps_buffers_that_live_together)
{
    enum { N = 200 };
    wk_buf_req_t reqs[N];
    size_t offs[N];
    for (int i = 0; i < N; i++) {
        int first = (int)((frand() + 1) * 50), len = (int)((frand() + 1) * 10);
        reqs[i] = (wk_buf_req_t){(size_t)((frand() + 1.1) * 10000), first, first + len};
    }
    size_t total = wk_arena_plan(reqs, N, 64, offs), sum = 0;
    for (int i = 0; i < N; i++) {
        cr_assert_eq(offs[i] % 64, 0);
        cr_assert_leq(offs[i] + reqs[i].bytes, total);
        sum += reqs[i].bytes;
        for (int j = 0; j < i; j++) {
            bool live = !(reqs[i].last < reqs[j].first || reqs[j].last < reqs[i].first);
            bool mem = offs[i] < offs[j] + reqs[j].bytes && offs[j] < offs[i] + reqs[i].bytes;
            cr_assert(!(live && mem), "buffers %d and %d overlap", i, j);
        }
    }
    cr_assert_lt(total, sum / 2, "liveness reuse should at least halve %zu (got %zu)", sum, total);
}

Test(exec, arena_reuses_a_dead_buffer)
{
    wk_buf_req_t reqs[3] = {{1000, 0, 1}, {1000, 1, 2}, {1000, 2, 3}};
    size_t offs[3];
    size_t total = wk_arena_plan(reqs, 3, 64, offs);
    cr_assert_eq(offs[0], offs[2], "the first buffer is dead when the third is born");
    cr_assert_eq(total, 2 * 1024);
}

/* A chain of the layout-sensitive kernels: maxpool, avgpool, concat,
 * transpose, reshape, slice, pad, reduce, softmax, gemm. */
Test(exec, plain_kernels_match_a_reference)
{
    int64_t xd[4] = {2, 4, 6, 6};
    float *x = rand_buf(2 * 4 * 36);
    wk_graph_t *g = wk_graph_new(2);
    int xv = wk_graph_input(g, "x", 4, xd, true);
    /* maxpool 2x2 s2 -> [2,4,3,3] */
    int64_t pd[4] = {2, 4, 3, 3};
    int mp = wk_graph_value(g, "mp", 4, pd, true, NULL);
    wk_step_t *s = wk_graph_step(g, WK_K_MAXPOOL, &xv, 1, mp);
    s->p.conv.n_spatial = 2;
    for (int i = 0; i < 2; i++) {
        s->p.conv.kernel[i] = s->p.conv.stride[i] = 2;
        s->p.conv.dilation[i] = 1;
    }
    /* concat(mp, mp) on channels -> [2,8,3,3] */
    int64_t cd[4] = {2, 8, 3, 3};
    int cc = wk_graph_value(g, "cc", 4, cd, true, NULL);
    wk_graph_step(g, WK_K_CONCAT, (int[]){mp, mp}, 2, cc)->p.axis = 1;
    /* transpose (0,2,3,1) -> [2,3,3,8] */
    int64_t td[4] = {2, 3, 3, 8};
    int tv = wk_graph_value(g, "t", 4, td, true, NULL);
    s = wk_graph_step(g, WK_K_TRANSPOSE, &cc, 1, tv);
    s->p.perm[0] = 0;
    s->p.perm[1] = 2;
    s->p.perm[2] = 3;
    s->p.perm[3] = 1;
    /* slice channels 1..7 step 2 of the last dim -> [2,3,3,3] */
    int64_t sd[4] = {2, 3, 3, 3};
    int sv = wk_graph_value(g, "s", 4, sd, true, NULL);
    s = wk_graph_step(g, WK_K_SLICE, &tv, 1, sv);
    for (int i = 0; i < 4; i++)
        s->p.slice.step[i] = 1;
    s->p.slice.start[3] = 1;
    s->p.slice.step[3] = 2;
    /* pad last dim by (1, 2) reflect -> [2,3,3,6] */
    int64_t qd[4] = {2, 3, 3, 6};
    int qv = wk_graph_value(g, "q", 4, qd, true, NULL);
    s = wk_graph_step(g, WK_K_PAD, &sv, 1, qv);
    s->p.pad.begin[3] = 1;
    s->p.pad.end[3] = 2;
    s->p.pad.mode = WK_PAD_REFLECT;
    /* reshape -> [2, 54] */
    int64_t rd[2] = {2, 54};
    int rv = wk_graph_value(g, "r", 2, rd, true, NULL);
    wk_graph_step(g, WK_K_COPY, &qv, 1, rv);
    /* gemm with W [5, 54] (transB), C [5], alpha 0.5 beta 2 -> [2,5] */
    float *w = rand_buf(5 * 54), *c = rand_buf(5);
    int64_t wd[2] = {5, 54}, c1 = 5, gd[2] = {2, 5};
    int wv = wk_graph_value(g, "w", 2, wd, false, w);
    int cv = wk_graph_value(g, "c", 1, &c1, false, c);
    int gv = wk_graph_value(g, "g", 2, gd, true, NULL);
    s = wk_graph_step(g, WK_K_GEMM, (int[]){rv, wv, cv}, 3, gv);
    s->p.gemm.trans_b = 1;
    s->p.gemm.alpha = 0.5f;
    s->p.gemm.beta = 2.0f;
    /* softmax over the last axis */
    int yv = wk_graph_value(g, "y", 2, gd, true, NULL);
    wk_graph_step(g, WK_K_SOFTMAX, &gv, 1, yv)->p.axis = 1;
    /* and a reduce-mean of the reshape over axis 1, keepdims -> [2,1] */
    int64_t md[2] = {2, 1};
    int mv = wk_graph_value(g, "m", 2, md, true, NULL);
    wk_graph_step(g, WK_K_REDUCE_MEAN, &rv, 1, mv)->p.reduce.axes_mask = 2;
    wk_graph_mark_output(g, yv);
    wk_graph_mark_output(g, mv);
    wk_plan_t *p = make_plan(g, SQ_DEV_CPU);

    /* reference */
    float want_y[10], want_m[2];
    for (int n = 0; n < 2; n++) {
        float mpv[4][3][3], r[54];
        for (int ch = 0; ch < 4; ch++)
            for (int i = 0; i < 3; i++)
                for (int j = 0; j < 3; j++) {
                    float m = -INFINITY;
                    for (int a = 0; a < 2; a++)
                        for (int b = 0; b < 2; b++) {
                            float v = x[((n * 4 + ch) * 6 + 2 * i + a) * 6 + 2 * j + b];
                            m = v > m ? v : m;
                        }
                    mpv[ch][i][j] = m;
                }
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < 3; j++)
                for (int k = 0; k < 6; k++) {
                    int src = k - 1; /* reflect pad of 3 slice elements */
                    if (src < 0)
                        src = -src;
                    if (src > 2)
                        src = 4 - src;
                    int ch8 = 1 + 2 * src; /* slice start 1 step 2 of 8 channels */
                    r[(i * 3 + j) * 6 + k] = mpv[ch8 % 4][i][j];
                }
        double sum = 0;
        for (int k = 0; k < 54; k++)
            sum += r[k];
        want_m[n] = (float)(sum / 54);
        float gm[5], mx = -INFINITY, z = 0;
        for (int o = 0; o < 5; o++) {
            double acc = 0;
            for (int k = 0; k < 54; k++)
                acc += (double)r[k] * w[o * 54 + k];
            gm[o] = (float)(0.5 * acc + 2.0 * c[o]);
            mx = gm[o] > mx ? gm[o] : mx;
        }
        for (int o = 0; o < 5; o++)
            z += expf(gm[o] - mx);
        for (int o = 0; o < 5; o++)
            want_y[n * 5 + o] = expf(gm[o] - mx) / z;
    }
    for (int batch = 1; batch <= 2; batch++) {
        float got_y[10], got_m[2];
        cr_assert_eq(wk_plan_run(p, batch, (const float *[]){x}, (float *[]){got_y, got_m}), 0,
                     "%s", wk_plan_errmsg(p));
        assert_close(got_y, want_y, batch * 5, 1e-5f, "softmax(gemm)");
        assert_close(got_m, want_m, batch, 1e-5f, "reduce_mean");
    }
    wk_plan_free(p);
    free(x);
    free(w);
    free(c);
}

Test(exec, batch_outside_the_plan_is_refused)
{
    conv_geom_t g = {.n = 2,
                     .c = 3,
                     .h = 5,
                     .w = 5,
                     .oc = 4,
                     .kh = 1,
                     .kw = 1,
                     .sh = 1,
                     .sw = 1,
                     .dh = 1,
                     .dw = 1,
                     .groups = 1};
    float *w = rand_buf(12), x[150] = {0}, y[200];
    wk_plan_t *p = make_plan(conv_graph(&g, w, NULL), SQ_DEV_CPU);
    cr_assert_eq(wk_plan_run(p, 3, (const float *[]){x}, (float *[]){y}), SQ_INVAL);
    cr_assert_eq(wk_plan_run(p, 0, (const float *[]){x}, (float *[]){y}), SQ_INVAL);
    cr_assert(strstr(wk_plan_errmsg(p), "outside") != NULL);
    wk_plan_free(p);
    free(w);
}

Test(exec, pixels_are_normalized_per_channel)
{
    /* A 1x1 identity-weight conv exposes the normalized input. */
    conv_geom_t g = {.n = 1,
                     .c = 3,
                     .h = 2,
                     .w = 2,
                     .oc = 3,
                     .kh = 1,
                     .kw = 1,
                     .sh = 1,
                     .sw = 1,
                     .dh = 1,
                     .dw = 1,
                     .groups = 1};
    float w[9] = {1, 0, 0, 0, 1, 0, 0, 0, 1};
    wk_plan_t *p = make_plan(conv_graph(&g, w, NULL), SQ_DEV_CPU);
    uint8_t px[12];
    for (int i = 0; i < 12; i++)
        px[i] = (uint8_t)(i * 20);
    float y[12];
    cr_assert_eq(wk_plan_run_pixels(p, 1, px, y), 0, "%s", wk_plan_errmsg(p));
    wk_pixel_norm_t n = WK_PIXEL_NORM_IMAGENET;
    for (int c = 0; c < 3; c++)
        for (int i = 0; i < 4; i++) {
            float want = (px[i * 3 + c] / 255.0f - n.mean[c]) / n.std[c];
            cr_assert_float_eq(y[c * 4 + i], want, 1e-5f);
        }
    wk_plan_free(p);
}

Test(exec, unsupported_layouts_fail_with_a_reason)
{
    /* A reshape that moves the batch into another dim is refused. */
    wk_graph_t *g = wk_graph_new(2);
    int64_t xd[2] = {2, 6}, yd[2] = {4, 3};
    int x = wk_graph_input(g, "x", 2, xd, true);
    int y = wk_graph_value(g, "y", 2, yd, false, NULL);
    wk_graph_step(g, WK_K_COPY, &x, 1, y);
    wk_graph_mark_output(g, y);
    wk_plan_opts_t o = wk_plan_opts_default();
    o.max_batch = 2;
    char why[256];
    wk_plan_t *p;
    cr_assert_eq(wk_plan_from_graph(g, &o, &p, why, sizeof(why)), SQ_UNSUPPORTED_MODEL);
    cr_assert(strstr(why, "batch") != NULL, "%s", why);
    cr_assert_null(p);
}

/* x[N,3,2,2] -> output 0 "gap" = GlobalAveragePool [N,3,1,1] (3 floats an
 * item), output 1 "t" = Transpose(0,2,3,1) [N,2,2,3] (12 floats an item). */
static wk_graph_t *two_output_graph(int max_batch)
{
    wk_graph_t *g = wk_graph_new(max_batch);
    int64_t xd[4] = {max_batch, 3, 2, 2}, gd[4] = {max_batch, 3, 1, 1},
            td[4] = {max_batch, 2, 2, 3};
    int x = wk_graph_input(g, "x", 4, xd, true);
    int gap = wk_graph_value(g, "gap", 4, gd, true, NULL);
    int t = wk_graph_value(g, "t", 4, td, true, NULL);
    wk_graph_step(g, WK_K_GLOBALAVG, &x, 1, gap);
    wk_step_t *s = wk_graph_step(g, WK_K_TRANSPOSE, &x, 1, t);
    s->p.perm[0] = 0;
    s->p.perm[1] = 2;
    s->p.perm[2] = 3;
    s->p.perm[3] = 1;
    wk_graph_mark_output(g, gap);
    wk_graph_mark_output(g, t);
    return g;
}

/* Item b's row of two_output_graph: its 3 channel means, then its pixels
 * in HWC order. */
static void two_output_row(const float *x, int b, float *row)
{
    const float *item = x + b * 12;
    for (int c = 0; c < 3; c++)
        row[c] = (item[c * 4] + item[c * 4 + 1] + item[c * 4 + 2] + item[c * 4 + 3]) / 4;
    for (int i = 0; i < 4; i++)
        for (int c = 0; c < 3; c++)
            row[3 + i * 3 + c] = item[c * 4 + i];
}

Test(exec, rows_hold_every_output_of_each_item)
{
    wk_plan_t *p = make_plan(two_output_graph(4), SQ_DEV_CPU);
    cr_assert_eq(wk_plan_n_outputs(p), 2);
    cr_assert_eq(wk_plan_row_elems(p), 15);
    float *x = rand_buf(4 * 12);
    uint8_t px[4 * 12];
    for (int i = 0; i < 4 * 12; i++)
        px[i] = (uint8_t)(i * 37 + 11);
    /* the pixels as the plan normalizes them, NCHW */
    float xn[4 * 12];
    wk_pixel_norm_t n = WK_PIXEL_NORM_IMAGENET;
    for (int b = 0; b < 4; b++)
        for (int c = 0; c < 3; c++)
            for (int i = 0; i < 4; i++)
                xn[b * 12 + c * 4 + i] = (px[b * 12 + i * 3 + c] / 255.0f - n.mean[c]) / n.std[c];
    int batches[2] = {1, 4};
    for (int k = 0; k < 2; k++) {
        int batch = batches[k];
        float got[4 * 15], want[15];
        memset(got, 0xff, sizeof(got));
        cr_assert_eq(wk_plan_run_rows(p, batch, (const float *[]){x}, got), 0, "%s",
                     wk_plan_errmsg(p));
        for (int b = 0; b < batch; b++) {
            two_output_row(x, b, want);
            assert_close(got + b * 15, want, 15, 1e-5f, "tensor row");
        }
        memset(got, 0xff, sizeof(got));
        cr_assert_eq(wk_plan_run_pixels(p, batch, px, got), 0, "%s", wk_plan_errmsg(p));
        for (int b = 0; b < batch; b++) {
            two_output_row(xn, b, want);
            assert_close(got + b * 15, want, 15, 1e-5f, "pixel row");
        }
    }
    wk_plan_free(p);
    free(x);
}

Test(exec, uint8_rows_run_as_the_fp32_values_they_hold)
{
    wk_plan_t *p = make_plan(two_output_graph(4), SQ_DEV_CPU);
    uint8_t bytes[4 * 12];
    float x[4 * 12];
    for (int i = 0; i < 4 * 12; i++) {
        bytes[i] = (uint8_t)(i * 53 + 3);
        x[i] = (float)bytes[i];
    }
    for (int batch = 1; batch <= 4; batch += 3) {
        float got[4 * 15], want[4 * 15];
        memset(got, 0xff, sizeof(got));
        cr_assert_eq(wk_plan_run_u8(p, batch, bytes, got), 0, "%s", wk_plan_errmsg(p));
        cr_assert_eq(wk_plan_run_rows(p, batch, (const float *[]){x}, want), 0);
        cr_assert_arr_eq(got, want, (size_t)batch * 15 * sizeof(float), "batch %d", batch);
    }
    wk_plan_free(p);
}

Test(exec, rows_of_a_static_plan_hold_its_whole_outputs)
{
    /* A graph without a batch (a file that fixes N = 2): one "item" is the
     * whole of every output. */
    wk_graph_t *g = wk_graph_new(1);
    int64_t xd[2] = {2, 3}, yd[2] = {2, 3}, md[2] = {2, 1};
    int x = wk_graph_input(g, "x", 2, xd, false);
    int y = wk_graph_value(g, "y", 2, yd, false, NULL);
    int m = wk_graph_value(g, "m", 2, md, false, NULL);
    wk_graph_step(g, WK_K_ELTWISE, &x, 1, y)->p.act.kind = WK_ACT_RELU;
    wk_graph_step(g, WK_K_REDUCE_MEAN, &x, 1, m)->p.reduce.axes_mask = 2;
    wk_graph_mark_output(g, m);
    wk_graph_mark_output(g, y);
    wk_plan_t *p = make_plan(g, SQ_DEV_CPU);
    cr_assert_eq(wk_plan_row_elems(p), 8);
    float in[6] = {1, -2, 4, -3, 6, 0}, got[8];
    cr_assert_eq(wk_plan_run_rows(p, 1, (const float *[]){in}, got), 0, "%s", wk_plan_errmsg(p));
    float want[8] = {1, 1, 1, 0, 4, 0, 6, 0};
    assert_close(got, want, 8, 1e-6f, "static row");
    wk_plan_free(p);
}

Test(exec, nhwc_pixels_normalize_like_nchw_transposed)
{
    /* x[N,2,3,3] (NHWC: H 2, W 3) read back unchanged by a Transpose to
     * NCHW, against the NCHW plan's identity conv on the same pixels. */
    int64_t xd[4] = {2, 2, 3, 3}, yd[4] = {2, 3, 2, 3};
    wk_graph_t *g = wk_graph_new(2);
    int x = wk_graph_input(g, "x", 4, xd, true);
    int y = wk_graph_value(g, "y", 4, yd, true, NULL);
    wk_step_t *s = wk_graph_step(g, WK_K_TRANSPOSE, &x, 1, y);
    s->p.perm[0] = 0;
    s->p.perm[1] = 3;
    s->p.perm[2] = 1;
    s->p.perm[3] = 2;
    wk_graph_mark_output(g, y);
    conv_geom_t cg = {.n = 2,
                      .c = 3,
                      .h = 2,
                      .w = 3,
                      .oc = 3,
                      .kh = 1,
                      .kw = 1,
                      .sh = 1,
                      .sw = 1,
                      .dh = 1,
                      .dw = 1,
                      .groups = 1};
    float w[9] = {1, 0, 0, 0, 1, 0, 0, 0, 1};
    wk_plan_opts_t o = wk_plan_opts_default();
    o.max_batch = 2;
    o.pixel_norm = (wk_pixel_norm_t){
        .mean = {0.5f, 0.25f, 0.75f}, .std = {0.5f, 0.2f, 0.1f}, .channels_bgr = 1};
    char why[512];
    wk_plan_t *nhwc = NULL, *nchw = NULL;
    cr_assert_eq(wk_plan_from_graph(g, &o, &nhwc, why, sizeof(why)), 0, "%s", why);
    cr_assert_eq(wk_plan_from_graph(conv_graph(&cg, w, NULL), &o, &nchw, why, sizeof(why)), 0, "%s",
                 why);
    int h = 0, wd = 0, is_nhwc = -1;
    cr_assert(wk_plan_image_input(nhwc, &h, &wd, &is_nhwc));
    cr_assert(h == 2 && wd == 3 && is_nhwc == 1, "h %d w %d nhwc %d", h, wd, is_nhwc);
    cr_assert(wk_plan_image_input(nchw, &h, &wd, &is_nhwc));
    cr_assert(h == 2 && wd == 3 && is_nhwc == 0, "h %d w %d nhwc %d", h, wd, is_nhwc);
    uint8_t px[2 * 18];
    for (int i = 0; i < 36; i++)
        px[i] = (uint8_t)(i * 29 + 3);
    float a[36], b[36];
    cr_assert_eq(wk_plan_run_pixels(nhwc, 2, px, a), 0, "%s", wk_plan_errmsg(nhwc));
    cr_assert_eq(wk_plan_run_pixels(nchw, 2, px, b), 0, "%s", wk_plan_errmsg(nchw));
    assert_close(a, b, 36, 1e-6f, "nhwc transposed vs nchw");
    /* and against the formula: BGR takes channel c from pixel channel 2 - c */
    for (int c = 0; c < 3; c++) {
        float want =
            (px[18 + 4 * 3 + (2 - c)] / 255.0f - o.pixel_norm.mean[c]) / o.pixel_norm.std[c];
        cr_assert_float_eq(a[18 + c * 6 + 4], want, 1e-5f);
    }
    wk_plan_free(nhwc);
    wk_plan_free(nchw);
}

/* x[N,3,2,2] moved to [3,N,2,2] and back around a Relu (the batch not
 * outermost: planned per batch size), outputs a = relu(x) and b = x * x:
 * two outputs of 12 floats an item. */
static mdb_graph_t *batch_inside_graph(void)
{
    mdb_graph_t *g = mdb_graph_new();
    mdb_shape_t xs = {.rank = 4, .dims = {MDB_DIM_BATCH, 3, 2, 2}};
    int x = mdb_graph_add_tensor(g, "x", MDB_DT_FLOAT, &xs);
    int t = mdb_graph_add_tensor(g, "t", MDB_DT_FLOAT, NULL);
    int r = mdb_graph_add_tensor(g, "r", MDB_DT_FLOAT, NULL);
    int a = mdb_graph_add_tensor(g, "a", MDB_DT_FLOAT, NULL);
    int b = mdb_graph_add_tensor(g, "b", MDB_DT_FLOAT, NULL);
    mdb_graph_add_input(g, x);
    mdb_graph_add_output(g, a);
    mdb_graph_add_output(g, b);
    const int64_t perm[4] = {1, 0, 2, 3};
    int n = mdb_graph_add_node(g, MDB_OP_TRANSPOSE, "in", &x, 1, &t, 1);
    mdb_node_set_ints(&g->nodes[n], "perm", perm, 4);
    mdb_graph_add_node(g, MDB_OP_RELU, "relu", &t, 1, &r, 1);
    n = mdb_graph_add_node(g, MDB_OP_TRANSPOSE, "out", &r, 1, &a, 1);
    mdb_node_set_ints(&g->nodes[n], "perm", perm, 4);
    mdb_graph_add_node(g, MDB_OP_MUL, "square", (const int[]){x, x}, 2, &b, 1);
    char err[256] = "";
    cr_assert_eq(mdb_graph_toposort(g, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(mdb_graph_infer_shapes(g, err, sizeof(err)), 0, "%s", err);
    cr_assert_not(mdb_graph_batch_outermost(g));
    return g;
}

/* Item `item` of x as the outputs of batch_inside_graph: a then b. */
static void batch_inside_row(const float *x, int item, float *row)
{
    for (int i = 0; i < 12; i++) {
        float v = x[item * 12 + i];
        row[i] = v > 0 ? v : 0;
        row[12 + i] = v * v;
    }
}

/* Planned for max batch 6, the holder has plans for 1, 2, 4 and 6 only; a
 * batch of 3 runs padded in 4, 5 in 6. Every entry point takes buffers of
 * exactly the batch's items (ASan sees any read or write past them), and
 * the padding items are zeros whatever a larger batch left before. */
Test(exec, a_graph_planned_per_batch_size_plans_powers_of_two_and_pads_the_rest)
{
    mdb_graph_t *mg = batch_inside_graph();
    wk_plan_opts_t o = wk_plan_opts_default();
    o.max_batch = 6;
    wk_plan_t *p = NULL;
    char why[512] = "";
    cr_assert_eq(wk_plan_create(mg, &o, &p, why, sizeof(why)), 0, "%s", why);
    mdb_graph_free(mg);
    cr_assert_not_null(p->each);
    cr_assert_eq(p->n_each, 4);
    uint64_t plans = 0;
    for (int s = 1; s <= 6; s++) {
        bool planned = s == 1 || s == 2 || s == 4 || s == 6;
        cr_assert_eq(p->each[s] != NULL, planned, "size %d", s);
        plans += planned ? p->each[s]->memory_bytes : 0;
    }
    /* the plans, and the scratch: 6 items of x in, 6 of a and b out */
    cr_assert_eq(wk_plan_memory_bytes(p), plans + (6 * 12 + 6 * 24) * sizeof(float));
    cr_assert_eq(wk_plan_max_batch(p), 6);
    cr_assert_eq(wk_plan_row_elems(p), 24);
    float *all = rand_buf(6 * 12);
    uint8_t all_px[6 * 12];
    for (int i = 0; i < 6 * 12; i++)
        all_px[i] = (uint8_t)(i * 37 + 11);
    float all_xn[6 * 12];
    wk_pixel_norm_t norm = WK_PIXEL_NORM_IMAGENET;
    for (int b = 0; b < 6; b++)
        for (int c = 0; c < 3; c++)
            for (int i = 0; i < 4; i++)
                all_xn[b * 12 + c * 4 + i] =
                    (all_px[b * 12 + i * 3 + c] / 255.0f - norm.mean[c]) / norm.std[c];
    /* 6 first, so that 5's padding item in the plan for 6 held x[5] */
    const int batches[] = {6, 5, 1, 3, 4, 2};
    for (int k = 0; k < 6; k++) {
        int batch = batches[k];
        size_t n_in = (size_t)batch * 12;
        float *x = malloc(n_in * sizeof(float));
        memcpy(x, all, n_in * sizeof(float));
        uint8_t *px = malloc(n_in);
        memcpy(px, all_px, n_in);
        float *rows = malloc(n_in * 2 * sizeof(float));
        float *a = malloc(n_in * sizeof(float)), *b = malloc(n_in * sizeof(float));
        float want[24];
        cr_assert_eq(wk_plan_run_rows(p, batch, (const float *[]){x}, rows), 0, "%s",
                     wk_plan_errmsg(p));
        for (int i = 0; i < batch; i++) {
            batch_inside_row(all, i, want);
            assert_close(rows + i * 24, want, 24, 1e-6f, "rows");
        }
        if (batch == 5) {
            /* item 5 of the plan for 6: zeros in, relu(0) and 0 * 0 out */
            for (int i = 0; i < 12; i++) {
                cr_assert_eq(p->out_ptrs[0][5 * 12 + i], 0.0f);
                cr_assert_eq(p->out_ptrs[1][5 * 12 + i], 0.0f);
            }
        }
        cr_assert_eq(wk_plan_run_pixels(p, batch, px, rows), 0, "%s", wk_plan_errmsg(p));
        for (int i = 0; i < batch; i++) {
            batch_inside_row(all_xn, i, want);
            assert_close(rows + i * 24, want, 24, 1e-5f, "pixel rows");
        }
        for (int inplace = 0; inplace < 2; inplace++) {
            memset(a, 0xff, n_in * sizeof(float));
            memset(b, 0xff, n_in * sizeof(float));
            int rc = inplace
                         ? wk__plan_run_inplace(p, batch, (const float *[]){x}, (float *[]){a, b})
                         : wk_plan_run(p, batch, (const float *[]){x}, (float *[]){a, b});
            cr_assert_eq(rc, 0, "%s", wk_plan_errmsg(p));
            for (int i = 0; i < batch; i++) {
                batch_inside_row(all, i, want);
                assert_close(a + i * 12, want, 12, 1e-6f, "output a");
                assert_close(b + i * 12, want + 12, 12, 1e-6f, "output b");
            }
        }
        cr_assert_gt(wk_plan_last_run_ns(p), 0);
        free(x);
        free(px);
        free(rows);
        free(a);
        free(b);
    }
    cr_assert_eq(wk_plan_run(p, 7, (const float *[]){all}, (float *[]){all, all}), SQ_INVAL);
    free(all);
    wk_plan_free(p);
}
