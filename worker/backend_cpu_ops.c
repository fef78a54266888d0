/* The cpu backend's kernels: one builder per kernel kind. Each runs in
 * both planning phases: phase 1 (at max batch) decides layouts and
 * temporaries, phase 2 creates the primitive for one batch size and queues
 * it. Pad, Slice, Erf and Expand are plain C over plain buffers. The builders stand on
 * the buffers and layouts of backend_cpu_buf.c; the backend's vtable
 * (backend_cpu.c) reaches them through wk__cpu_ops, indexed by kind. */
#include "backend_cpu_int.h"

#include <sq_clock.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- steps ---- */

static dnnl_status_t conv_pd(dnnl_primitive_desc_t *pd, const wk_step_t *s, bool wino,
                             const dnnl_memory_desc_t *src, const dnnl_memory_desc_t *wei,
                             const dnnl_memory_desc_t *bias, const dnnl_memory_desc_t *dst,
                             const_dnnl_primitive_attr_t attr, dnnl_engine_t engine)
{
    *pd = NULL;
    dnnl_dims_t strides, dil, pl, pr;
    for (int i = 0; i < s->p.conv.n_spatial; i++) {
        strides[i] = s->p.conv.stride[i];
        dil[i] = s->p.conv.dilation[i] - 1;
        pl[i] = s->p.conv.pad_begin[i];
        pr[i] = s->p.conv.pad_end[i];
    }
    dnnl_convolution_desc_t cd;
    dnnl_status_t st = dnnl_dilated_convolution_forward_desc_init(
        &cd, dnnl_forward_inference, wino ? dnnl_convolution_winograd : dnnl_convolution_direct,
        src, wei, bias, dst, strides, dil, pl, pr);
    return st != dnnl_success ? st : dnnl_primitive_desc_create(pd, &cd, attr, engine, NULL);
}

/* Whether oneDNN fell back to its reference (unoptimized) kernel. */
static bool impl_is_ref(const_dnnl_primitive_desc_t pd)
{
    const char *impl = NULL;
    return dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) != dnnl_success ||
           impl == NULL || strncmp(impl, "ref", 3) == 0;
}

static dnnl_memory_desc_t md_with_batch(const dnnl_memory_desc_t *md, int b)
{
    dnnl_memory_desc_t r = *md;
    r.dims[0] = b;
    r.padded_dims[0] = b;
    return r;
}

/* Winograd (F(4x4, 3x3)) does 2.25x fewer multiplies on 3x3 stride-1
 * convs; it pays from this batch size up (resnet18 on 2 cores: 1.4x less
 * CPU at batch 8, 10% more at batch 1, even at 4). Its weights take 4x
 * the memory, and on small maps its 6x6 tiles are mostly padding: only
 * outputs of at least WINO_MIN_HW x WINO_MIN_HW get it (resnet18 at max
 * batch 8: every eligible conv 364 MB and 225 ms of CPU at batch 8, from
 * 14x14 up 148 MB and 240 ms, none 78 MB and 333 ms). */
#define WINO_MIN_BATCH 4
#define WINO_MIN_HW 14

static bool wino_eligible(const wk_step_t *s, const wk_value_t *y)
{
    return s->p.conv.n_spatial == 2 && s->p.conv.groups == 1 && s->p.conv.kernel[0] == 3 &&
           s->p.conv.kernel[1] == 3 && s->p.conv.stride[0] == 1 && s->p.conv.stride[1] == 1 &&
           s->p.conv.dilation[0] == 1 && s->p.conv.dilation[1] == 1 && y->dims[2] >= WINO_MIN_HW &&
           y->dims[3] >= WINO_MIN_HW;
}

/* The batch size from which the plan of g would run Winograd convs, so
 * that smaller batches are better off in a plan of their own (the
 * backend's split_batch); 0 when none would. */
int wk__cpu_split_batch(const wk_graph_t *g)
{
    if (g->max_batch < WINO_MIN_BATCH)
        return 0;
    for (int i = 0; i < g->n_steps; i++) {
        const wk_step_t *s = &g->steps[i];
        if (s->kind == WK_K_CONV && g->values[s->in[0]].batched &&
            wino_eligible(s, &g->values[s->out]))
            return WINO_MIN_BATCH;
    }
    return 0;
}

/* Whether the pd just made (st, *p) exists and is not the reference
 * kernel; p by address, since arguments are evaluated in no set order. */
static bool pd_fast(dnnl_status_t st, const dnnl_primitive_desc_t *p)
{
    return st == dnnl_success && *p != NULL && !impl_is_ref(*p);
}

/* Depthwise 3x3 convs fused into the 1x1 conv before them (oneDNN's dw
 * post-op, on its jit_1x1 kernel): the expanded tensor between them is
 * made and consumed a few rows at a time, in cache, instead of written to
 * memory and read back. That pays only where the tensor does not fit the
 * caches. On a 2-core Xeon (2 MB of L2 a core), 1x1 and dw with their
 * activations, apart and fused, ms per batch: mobilenet_v2's first expand
 * at batch 8 (96 x 112 x 112, 38 MB) with its stride-2 dw 4.3 and 2.5;
 * 144 x 56 x 56 (14 MB) 2.6 and 1.4; from 4.8 MB down (and every pair at
 * batch 1) alike within noise. So a pair is fused when the expanded tensor
 * takes at least DW_FUSE_MB at max batch and times faster fused
 * (wk__cpu_conv_dw), and batch 1 runs a plan without it (exec.c). oneDNN
 * 2.6 also takes the fusion on channels-last tensors and computes it
 * wrongly, so fused convs run on channel blocks only (wk__cpu_dw_block:
 * nChw16c with AVX-512, nChw8c with AVX2), and only where that has a fast
 * kernel. */
#define DW_FUSE_MB 8.0

static int conv_dw_index(const wk_step_t *s)
{
    for (int i = 0; i < s->n_post; i++)
        if (s->post[i].kind == WK_POST_DW)
            return i;
    return -1;
}

/* Whether value v is written by a conv with a fused depthwise conv. */
static bool written_fused(const wk_graph_t *g, int v)
{
    int from = g->values[v].producer;
    return from >= 0 && conv_dw_index(&g->steps[from]) >= 0;
}

/* The channel blocks fused convs run on: those of oneDNN's jit kernels on
 * this CPU, one vector of floats. With AVX-512, nChw16c
 * (jit_avx512_common_1x1 with its dw post-op); with AVX2 only, nChw8c
 * (jit_1x1:avx2, whose fused dw kernel takes 8-channel blocks: on nChw16c
 * there oneDNN 2.6 offers only ref_fused_convolution, the two kernels one
 * after the other through memory). */
dnnl_format_tag_t wk__cpu_dw_block(void)
{
    dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    bool avx512 = isa == dnnl_cpu_isa_avx512_mic || isa == dnnl_cpu_isa_avx512_mic_4ops ||
                  (isa & dnnl_cpu_isa_avx512_core) == dnnl_cpu_isa_avx512_core;
    return avx512 ? dnnl_nChw16c : dnnl_nChw8c;
}

/* The tensor between a fused 1x1 (input x) and its depthwise conv (output
 * y) at batch n, in channel blocks (wk__cpu_dw_block): the descriptor's
 * dst (oneDNN's dst is then the dw's output). */
static void dw_mid_md(dnnl_memory_desc_t *md, int64_t n, const wk_value_t *x, const wk_value_t *y)
{
    dnnl_dims_t d = {n, y->dims[1], x->dims[2], x->dims[3]};
    dnnl_memory_desc_init_by_tag(md, 4, d, dnnl_f32, wk__cpu_dw_block());
}

/* The depthwise weights [C, 1, 3, 3] as oneDNN's goihw [C, 1, 1, 3, 3]. */
static void dw_plain_md(dnnl_memory_desc_t *md, const wk_value_t *w)
{
    dnnl_dims_t d = {w->dims[0], 1, 1, 3, 3};
    dnnl_memory_desc_init_by_tag(md, 5, d, dnnl_f32, dnnl_goihw);
}

/* The post-ops of conv s, in order. */
static dnnl_status_t conv_post_ops(dnnl_post_ops_t po, const wk_step_t *s)
{
    dnnl_status_t st = dnnl_success;
    for (int i = 0; i < s->n_post && st == dnnl_success; i++) {
        if (s->post[i].kind == WK_POST_ADD)
            st = dnnl_post_ops_append_sum(po, 1.0f);
        else if (s->post[i].kind == WK_POST_DW)
            st = dnnl_post_ops_append_dw(po, dnnl_f32, dnnl_f32, dnnl_f32, 3, s->post[i].stride, 1,
                                         0, 0, NULL);
        else
            wk__cpu_append_act(po, s->post[i].act);
    }
    return st;
}

/* conv_pd for timing: nonzero when no primitive descriptor was made. */
static int conv_pd_failed(dnnl_primitive_desc_t *pd, const wk_step_t *s,
                          const dnnl_memory_desc_t *src, const dnnl_memory_desc_t *wei,
                          const dnnl_memory_desc_t *bias, const dnnl_memory_desc_t *dst,
                          const_dnnl_primitive_attr_t attr, dnnl_engine_t engine)
{
    return conv_pd(pd, s, false, src, wei, bias, dst, attr, engine) != dnnl_success || *pd == NULL;
}

/* A primitive of pd with every argument it names in fresh memory (filled
 * with a small constant), ready to run: for timing. */
typedef struct {
    dnnl_primitive_t prim;
    dnnl_exec_arg_t args[8];
    int n;
} timed_t;

static bool timed_make(timed_t *t, dnnl_engine_t engine, const_dnnl_primitive_desc_t pd,
                       const int *kinds, int n, dnnl_memory_t share_src)
{
    memset(t, 0, sizeof(*t));
    if (dnnl_primitive_create(&t->prim, pd) != dnnl_success)
        return false;
    for (int i = 0; i < n; i++) {
        const dnnl_memory_desc_t *md =
            dnnl_primitive_desc_query_md(pd, dnnl_query_exec_arg_md, kinds[i]);
        dnnl_memory_t m = NULL;
        if (kinds[i] == DNNL_ARG_SRC && share_src != NULL) {
            m = share_src;
        } else {
            if (md == NULL ||
                dnnl_memory_create(&m, md, engine, DNNL_MEMORY_ALLOCATE) != dnnl_success)
                return false;
            void *h = NULL;
            dnnl_memory_get_data_handle(m, &h);
            size_t bytes = dnnl_memory_desc_get_size(md);
            for (size_t k = 0; k < bytes / sizeof(float); k++)
                ((float *)h)[k] = 0.01f;
        }
        t->args[t->n++] = (dnnl_exec_arg_t){kinds[i], m};
    }
    return true;
}

static void timed_free(timed_t *t, dnnl_memory_t shared)
{
    for (int i = 0; i < t->n; i++)
        if (t->args[i].memory != shared)
            dnnl_memory_destroy(t->args[i].memory);
    if (t->prim != NULL)
        dnnl_primitive_destroy(t->prim);
}

static int64_t timed_run(dnnl_stream_t stream, const timed_t *ts, int n)
{
    int64_t t0 = sq_now_ns();
    for (int i = 0; i < n; i++)
        if (dnnl_primitive_execute(ts[i].prim, stream, ts[i].n, ts[i].args) != dnnl_success)
            return INT64_MAX;
    dnnl_stream_wait(stream);
    return sq_now_ns() - t0;
}

/* Whether pw and dw, made here at max batch as build_conv would make them,
 * run faster fused than apart. The tensor between them must take at least
 * DW_FUSE_MB (SQUISH_CPU_DW_FUSE_MB: another size; "off": none;
 * "always": every pair with a fast fused kernel, untimed), the fused
 * kernel must be a fast one on channel blocks (wk__cpu_dw_block), and then
 * the faster of two runs each way must be fused by at least DW_FUSE_GAIN:
 * with swish after both convs, efficientnet_b0's 24 -> 144 channel pair at
 * 56 x 56 ran 5.4 ms fused against 4.0 apart, where its 16 -> 96 at
 * 112 x 112 gained (7.3 against 9.2). */
#define DW_FUSE_GAIN 0.9
bool wk__cpu_conv_dw(const wk_graph_t *g, const wk_step_t *pw, const wk_step_t *dw)
{
    const char *env = getenv("SQUISH_CPU_DW_FUSE_MB");
    double mb = DW_FUSE_MB;
    bool always = env != NULL && strcmp(env, "always") == 0;
    if (env != NULL && *env != '\0' && !always) {
        char *end;
        mb = strcmp(env, "off") == 0 ? -1 : strtod(env, &end);
        if (mb < 0 || *end != '\0')
            return false;
    }
    const wk_value_t *x = &g->values[pw->in[0]], *w = &g->values[pw->in[1]],
                     *mid = &g->values[pw->out], *y = &g->values[dw->out];
    if (!always && (double)wk_value_elems(mid) * sizeof(float) < mb * 1024 * 1024)
        return false;
    bool pw_bias = pw->n_in > 2 && pw->in[2] >= 0;
    /* The fused step, as build_conv will ask for it. */
    wk_step_t f = *pw;
    f.out = dw->out;
    f.post[f.n_post++] = (wk_post_t){.kind = WK_POST_DW, .stride = (int)dw->p.conv.stride[0]};
    for (int i = 0; i < dw->n_post && f.n_post < WK_MAX_POST; i++)
        f.post[f.n_post++] = dw->post[i];
    dnnl_engine_t engine = NULL;
    dnnl_stream_t stream = NULL;
    dnnl_primitive_attr_t attr[3] = {NULL, NULL, NULL};
    dnnl_post_ops_t po[3] = {NULL, NULL, NULL};
    dnnl_primitive_desc_t pd[3] = {NULL, NULL, NULL}; /* fused, pw apart, dw apart */
    timed_t tf = {0}, t1 = {0}, t2 = {0}, r_in = {0}, r_out = {0};
    dnnl_primitive_desc_t rpd[2] = {NULL, NULL};
    bool ok = false;
    dnnl_memory_desc_t sm, wm, bm, dm, am, mm, dwm, ym;
    dnnl_dims_t sd = {x->dims[0], x->dims[1], x->dims[2], x->dims[3]},
                wd = {w->dims[0], w->dims[1], 1, 1}, bd = {w->dims[0]},
                dwd = {y->dims[1], 1, 1, 3, 3},
                yd = {y->dims[0], y->dims[1], y->dims[2], y->dims[3]};
    dw_mid_md(&dm, x->dims[0], x, y);
    const wk_step_t *apart[2] = {pw, dw};
    if (dnnl_engine_create(&engine, dnnl_cpu, 0) != dnnl_success ||
        dnnl_stream_create(&stream, engine, dnnl_stream_default_flags) != dnnl_success)
        goto out;
    for (int k = 0; k < 3; k++)
        if (dnnl_primitive_attr_create(&attr[k]) != dnnl_success ||
            dnnl_post_ops_create(&po[k]) != dnnl_success ||
            conv_post_ops(po[k], k == 0 ? &f : apart[k - 1]) != dnnl_success ||
            dnnl_primitive_attr_set_post_ops(attr[k], po[k]) != dnnl_success)
            goto out;
    if (dnnl_memory_desc_init_by_tag(&sm, 4, sd, dnnl_f32, wk__cpu_dw_block()) != dnnl_success ||
        dnnl_memory_desc_init_by_tag(&wm, 4, wd, dnnl_f32, dnnl_format_tag_any) != dnnl_success ||
        dnnl_memory_desc_init_by_tag(&bm, 1, bd, dnnl_f32, dnnl_a) != dnnl_success ||
        !pd_fast(conv_pd(&pd[0], &f, false, &sm, &wm, pw_bias ? &bm : NULL, &dm, attr[0], engine),
                 &pd[0]))
        goto out;
    if (always) {
        ok = true;
        goto out;
    }
    /* Apart, in the layouts oneDNN picks for each (channels last, in
     * practice), the dw reading what the 1x1 wrote. */
    if (dnnl_memory_desc_init_by_tag(&am, 4, sd, dnnl_f32, dnnl_format_tag_any) != dnnl_success ||
        dnnl_memory_desc_init_by_tag(&mm, 4, dm.dims, dnnl_f32, dnnl_format_tag_any) !=
            dnnl_success ||
        conv_pd_failed(&pd[1], pw, &am, &wm, pw_bias ? &bm : NULL, &mm, attr[1], engine) ||
        dnnl_memory_desc_init_by_tag(&dwm, 5, dwd, dnnl_f32, dnnl_format_tag_any) != dnnl_success ||
        dnnl_memory_desc_init_by_tag(&ym, 4, yd, dnnl_f32, dnnl_format_tag_any) != dnnl_success ||
        conv_pd_failed(&pd[2], dw, dnnl_primitive_desc_query_md(pd[1], dnnl_query_dst_md, 0), &dwm,
                       &bm, &ym, attr[2], engine))
        goto out;
    static const int fk[] = {DNNL_ARG_SRC,
                             DNNL_ARG_WEIGHTS,
                             DNNL_ARG_DST,
                             DNNL_ARG_ATTR_POST_OP_DW | DNNL_ARG_WEIGHTS,
                             DNNL_ARG_ATTR_POST_OP_DW | DNNL_ARG_BIAS,
                             DNNL_ARG_BIAS};
    static const int ck[] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_BIAS};
    if (!timed_make(&tf, engine, pd[0], fk, pw_bias ? 6 : 5, NULL) ||
        !timed_make(&t1, engine, pd[1], ck, pw_bias ? 4 : 3, NULL) ||
        !timed_make(&t2, engine, pd[2], ck, 4, t1.args[2].memory))
        goto out;
    /* Fused, it pays a reorder into the channel blocks and, but before a
     * conv, one back (build_conv keeps the blocks only from conv to conv);
     * neither where the convs apart chose those blocks too (nChw8c with
     * AVX2 only). */
    static const int rk[] = {DNNL_ARG_FROM, DNNL_ARG_TO};
    if (dnnl_reorder_primitive_desc_create(
            &rpd[0], dnnl_primitive_desc_query_md(pd[1], dnnl_query_src_md, 0), engine,
            dnnl_primitive_desc_query_md(pd[0], dnnl_query_src_md, 0), engine,
            NULL) != dnnl_success ||
        dnnl_reorder_primitive_desc_create(
            &rpd[1], dnnl_primitive_desc_query_md(pd[0], dnnl_query_dst_md, 0), engine,
            dnnl_primitive_desc_query_md(pd[2], dnnl_query_dst_md, 0), engine,
            NULL) != dnnl_success ||
        !timed_make(&r_in, engine, rpd[0], rk, 2, NULL) ||
        !timed_make(&r_out, engine, rpd[1], rk, 2, NULL))
        goto out;
    /* Not where build_conv keeps the blocks: a 1x1 reading a conv that
     * reads a fused one's output (mobilenet_v2's next block), and a dw
     * whose output only convs read. */
    int from = x->producer;
    bool blocked_in =
        (from >= 0 && g->steps[from].kind == WK_K_CONV &&
         (written_fused(g, pw->in[0]) || written_fused(g, g->steps[from].in[0]))) ||
        dnnl_memory_desc_equal(dnnl_primitive_desc_query_md(pd[1], dnnl_query_src_md, 0),
                               dnnl_primitive_desc_query_md(pd[0], dnnl_query_src_md, 0));
    bool convs_read = y->n_uses > 0 && !y->is_output;
    for (int i = 0; i < g->n_steps && convs_read; i++)
        for (int k = 0; k < g->steps[i].n_in; k++)
            if (g->steps[i].in[k] == dw->out && (g->steps[i].kind != WK_K_CONV || k != 0))
                convs_read = false;
    bool blocked_out = convs_read || dnnl_memory_desc_equal(
                                         dnnl_primitive_desc_query_md(pd[0], dnnl_query_dst_md, 0),
                                         dnnl_primitive_desc_query_md(pd[2], dnnl_query_dst_md, 0));
    timed_t both[2] = {t1, t2}, fused[3] = {tf, r_in, r_out};
    int n_fused = 1 + !blocked_in;
    if (!blocked_out)
        fused[n_fused++] = r_out;
    int64_t best_f = INT64_MAX, best_a = INT64_MAX;
    for (int r = 0; r < 3; r++) { /* the first round warms up */
        int64_t a = timed_run(stream, both, 2), b = timed_run(stream, fused, n_fused);
        if (r > 0) {
            best_a = a < best_a ? a : best_a;
            best_f = b < best_f ? b : best_f;
        }
    }
    ok = (double)best_f <= DW_FUSE_GAIN * (double)best_a;
    SQ_DEBUG("cpu: 1x1 conv to %lld channels at %lldx%lld and its depthwise conv: %.2f ms "
             "apart, %.2f fused (%s%s)%s",
             (long long)y->dims[1], (long long)x->dims[2], (long long)x->dims[3],
             (double)best_a / 1e6, (double)best_f / 1e6, blocked_in ? "" : "a reorder in, ",
             blocked_out ? "none out" : "a reorder out", ok ? ": fused" : "");
out:
    timed_free(&tf, NULL);
    timed_free(&r_in, NULL);
    timed_free(&r_out, NULL);
    for (int k = 0; k < 2; k++)
        if (rpd[k] != NULL)
            dnnl_primitive_desc_destroy(rpd[k]);
    timed_free(&t1, NULL);
    timed_free(&t2, t1.args[2].memory);
    for (int k = 0; k < 3; k++) {
        if (pd[k] != NULL)
            dnnl_primitive_desc_destroy(pd[k]);
        if (po[k] != NULL)
            dnnl_post_ops_destroy(po[k]);
        if (attr[k] != NULL)
            dnnl_primitive_attr_destroy(attr[k]);
    }
    if (stream != NULL)
        dnnl_stream_destroy(stream);
    if (engine != NULL)
        dnnl_engine_destroy(engine);
    return ok;
}

/* A conv whose input is channels last (what oneDNN's 1x1 and depthwise
 * kernels choose) keeps it when a fast kernel takes it: left to itself,
 * oneDNN 2.6 picks 8-channel blocks for regnet's grouped convs (8 channels
 * a group), and every one of them then paid a reorder in and one out, and
 * their squeeze-excitation multiply ran oneDNN's reference binary (29 of
 * regnet_y_400mf's 42 ms at batch 1). */
static void conv_keep_channels_last(wk_plan_t *plan, const wk_step_t *s, dnnl_primitive_desc_t *pd,
                                    const dnnl_memory_desc_t *src, const dnnl_memory_desc_t *wei,
                                    const dnnl_memory_desc_t *bias, const dnnl_memory_desc_t *dst,
                                    const_dnnl_primitive_attr_t attr)
{
    cpu_be_t *be = plan->be;
    if (s->p.conv.n_spatial != 2)
        return;
    const cpu_buf_t *in = &be->bufs[wk__cpu_vbuf(s->in[0])];
    /* After a fused depthwise conv, its channel blocks (wk__cpu_dw_block). */
    dnnl_format_tag_t tag = written_fused(plan->graph, s->in[0]) ? wk__cpu_dw_block() : dnnl_acdb;
    dnnl_memory_desc_t sm, dm;
    if (!in->decided || conv_dw_index(s) >= 0 ||
        dnnl_memory_desc_init_by_tag(&sm, src->ndims, src->dims, dnnl_f32, tag) != dnnl_success ||
        !dnnl_memory_desc_equal(&in->md, &sm) ||
        dnnl_memory_desc_equal(dnnl_primitive_desc_query_md(*pd, dnnl_query_src_md, 0), &sm) ||
        dnnl_memory_desc_init_by_tag(&dm, dst->ndims, dst->dims, dnnl_f32, tag) != dnnl_success)
        return;
    dnnl_primitive_desc_t p = NULL;
    if (pd_fast(conv_pd(&p, s, false, &sm, wei, bias, &dm, attr, be->engine), &p)) {
        dnnl_primitive_desc_destroy(*pd);
        *pd = p;
        return;
    }
    if (p != NULL)
        dnnl_primitive_desc_destroy(p);
}

/* The layouts chosen at max batch are kept for every batch size, but a
 * batch size may want another algorithm (direct below WINO_MIN_BATCH), or
 * have no optimized kernel with the shared weights (a googlenet conv at
 * batch 1 ran oneDNN's reference code: 120 ms instead of 0.1). Such a size
 * gets the weights once more, in the layout its kernel wants; the
 * activations keep their layouts. */
/* A copy of constant data (layout plain) in layout want for batch size b:
 * an earlier size's copy in that layout (alt[k], -1 for none), or a new
 * one. Returns the buffer or a negative SQ_* code. */
static int alt_copy(wk_plan_t *plan, const int *alt, int b, const dnnl_memory_desc_t *want,
                    const dnnl_memory_desc_t *plain, void *data)
{
    const cpu_be_t *be = plan->be;
    for (int k = 1; k < b; k++)
        if (alt[k] >= 0 && dnnl_memory_desc_equal(&be->bufs[alt[k]].md, want))
            return alt[k];
    return wk__cpu_const_reorder(plan, plain, data, want);
}

/* A fused depthwise conv's weights at batch size b, whose kernel is pd:
 * the shared copy, or (cs->dw_alt[b]) one in the layout pd wants. */
static int dw_weights_at(wk_plan_t *plan, int si, int b, const_dnnl_primitive_desc_t pd)
{
    cpu_be_t *be = plan->be;
    const wk_step_t *s = &plan->graph->steps[si];
    cpu_step_t *cs = &be->steps[si];
    int dwi = conv_dw_index(s), mb = plan->graph->max_batch;
    const dnnl_memory_desc_t *want =
        dwi < 0 ? NULL
                : dnnl_primitive_desc_query_md(pd, dnnl_query_exec_arg_md,
                                               DNNL_ARG_ATTR_POST_OP_DW | DNNL_ARG_WEIGHTS);
    if (want == NULL || dnnl_memory_desc_equal(want, &be->bufs[cs->dw_wei].md))
        return 0;
    if (cs->dw_alt == NULL) {
        cs->dw_alt = sq_xmalloc(sizeof(int) * (size_t)(mb + 1));
        for (int k = 0; k <= mb; k++)
            cs->dw_alt[k] = -1;
    }
    const wk_value_t *w = &plan->graph->values[s->post[dwi].value];
    dnnl_memory_desc_t plain;
    dw_plain_md(&plain, w);
    cs->dw_alt[b] = alt_copy(plan, cs->dw_alt, b, want, &plain, w->data);
    return cs->dw_alt[b] < -1 ? cs->dw_alt[b] : 0;
}

static int conv_per_batch(wk_plan_t *plan, int si, const dnnl_memory_desc_t *q_src,
                          const dnnl_memory_desc_t *q_wei, const dnnl_memory_desc_t *q_dst,
                          const dnnl_memory_desc_t *wei_any, const dnnl_memory_desc_t *bias,
                          const_dnnl_primitive_attr_t attr, const dnnl_memory_desc_t *wplain,
                          void *wdata)
{
    cpu_be_t *be = plan->be;
    const wk_step_t *s = &plan->graph->steps[si];
    cpu_step_t *cs = &be->steps[si];
    int mb = plan->graph->max_batch;
    for (int b = plan->min_batch > 1 ? plan->min_batch : 1; b < mb; b++) {
        dnnl_memory_desc_t sb = md_with_batch(q_src, b), db = md_with_batch(q_dst, b);
        bool want_wino = cs->wino && b >= WINO_MIN_BATCH, wino = want_wino;
        dnnl_primitive_desc_t p = NULL;
        const dnnl_memory_desc_t *w = NULL;
        /* The shared weights, when the algorithm is the shared one. */
        bool fast = want_wino == cs->wino &&
                    pd_fast(conv_pd(&p, s, wino, &sb, q_wei, bias, &db, attr, be->engine), &p);
        int rc = fast ? dw_weights_at(plan, si, b, p) : 0;
        if (p != NULL)
            dnnl_primitive_desc_destroy(p);
        p = NULL;
        if (rc != 0)
            return rc;
        if (fast)
            continue;
        /* Else the weights its kernel wants; a Winograd plan keeps Winograd
         * at this size if direct has no fast kernel here. */
        if (pd_fast(conv_pd(&p, s, wino, &sb, wei_any, bias, &db, attr, be->engine), &p)) {
            w = dnnl_primitive_desc_query_md(p, dnnl_query_weights_md, 0);
        } else if (cs->wino && !want_wino) {
            if (p != NULL)
                dnnl_primitive_desc_destroy(p);
            p = NULL;
            wino = true;
            if (pd_fast(conv_pd(&p, s, true, &sb, q_wei, bias, &db, attr, be->engine), &p))
                w = q_wei;
        }
        if (w != NULL) {
            if (cs->wei_alt == NULL) {
                cs->wei_alt = sq_xmalloc(sizeof(int) * (size_t)(mb + 1));
                cs->wino_at = sq_xmalloc((size_t)(mb + 1));
                for (int k = 0; k <= mb; k++) {
                    cs->wei_alt[k] = -1;
                    cs->wino_at[k] = (int8_t)cs->wino;
                }
            }
            cs->wino_at[b] = (int8_t)wino;
            /* The shared weights, or an earlier size's layout: no new copy. */
            if (w != q_wei && !dnnl_memory_desc_equal(w, q_wei))
                cs->wei_alt[b] = alt_copy(plan, cs->wei_alt, b, w, wplain, wdata);
            rc = cs->wei_alt[b] < -1 ? cs->wei_alt[b] : dw_weights_at(plan, si, b, p);
            if (rc != 0) {
                dnnl_primitive_desc_destroy(p);
                return rc;
            }
        }
        if (p != NULL)
            dnnl_primitive_desc_destroy(p);
    }
    return 0;
}

static int build_conv(wk_plan_t *plan, int si, int batch)
{
    cpu_be_t *be = plan->be;
    const wk_graph_t *g = plan->graph;
    const wk_step_t *s = &g->steps[si];
    cpu_step_t *cs = &be->steps[si];
    const wk_value_t *x = &g->values[s->in[0]], *w = &g->values[s->in[1]], *y = &g->values[s->out];
    int rc = 0, nsp = s->p.conv.n_spatial;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_memory_desc_t src_md, wei_md, bias_md, dst_md;
    int64_t groups = s->p.conv.groups;
    bool decided = be->phase == 2;
    int dwi = conv_dw_index(s);
    if (decided) {
        cpu_buf_t srcb = be->bufs[wk__cpu_vbuf(s->in[0])];
        if (cs->tmp_src >= 0)
            srcb = be->bufs[cs->tmp_src];
        srcb.md = cs->src_md;
        src_md = wk__cpu_md_at(&srcb, batch);
        wei_md = be->bufs[cs->wei_alt != NULL && cs->wei_alt[batch] >= 0 ? cs->wei_alt[batch]
                                                                         : cs->weights]
                     .md;
        dst_md = wk__cpu_md_at(&be->bufs[wk__cpu_vbuf(s->out)], batch);
        if (dwi >= 0)
            dw_mid_md(&dst_md, src_md.dims[0], x, y);
    } else {
        dnnl_dims_t d;
        d[0] = x->dims[0];
        d[1] = x->dims[1];
        for (int i = 0; i < nsp; i++)
            d[2 + i] = x->dims[2 + i];
        /* fused with a depthwise conv: channel blocks (wk__cpu_dw_block), and
         * the 1x1's own output size (oneDNN's dst is then the dw's output) */
        dnnl_format_tag_t tag = dwi >= 0 ? wk__cpu_dw_block() : dnnl_format_tag_any;
        dnnl_memory_desc_init_by_tag(&src_md, 2 + nsp, d, dnnl_f32, tag);
        d[1] = y->dims[1];
        for (int i = 0; i < nsp; i++)
            d[2 + i] = dwi >= 0 ? x->dims[2 + i] : y->dims[2 + i];
        dnnl_memory_desc_init_by_tag(&dst_md, 2 + nsp, d, dnnl_f32, tag);
        dnnl_dims_t wd;
        int wn = 0;
        if (groups > 1)
            wd[wn++] = groups;
        wd[wn++] = w->dims[0] / groups;
        wd[wn++] = w->dims[1];
        for (int i = 0; i < nsp; i++)
            wd[wn++] = w->dims[2 + i];
        dnnl_memory_desc_init_by_tag(&wei_md, wn, wd, dnnl_f32, dnnl_format_tag_any);
    }
    dnnl_dims_t bd = {y->dims[1]};
    dnnl_memory_desc_init_by_tag(&bias_md, 1, bd, dnnl_f32, dnnl_a);
    bool has_bias = s->n_in > 2 && s->in[2] >= 0;

    DN(dnnl_primitive_attr_create(&attr));
    DN(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user));
    DN(dnnl_post_ops_create(&po));
    DN(conv_post_ops(po, s));
    DN(dnnl_primitive_attr_set_post_ops(attr, po));
    if (!decided) {
        /* Winograd where it can run and pays, else direct. */
        cs->wino = x->batched && g->max_batch >= WINO_MIN_BATCH && wino_eligible(s, y) &&
                   pd_fast(conv_pd(&pd, s, true, &src_md, &wei_md, has_bias ? &bias_md : NULL,
                                   &dst_md, attr, be->engine),
                           &pd);
        if (!cs->wino && pd != NULL) {
            dnnl_primitive_desc_destroy(pd);
            pd = NULL;
        }
    }
    if (pd == NULL) {
        bool wino = cs->wino_at != NULL ? cs->wino_at[batch] : cs->wino;
        DN(conv_pd(&pd, s, wino, &src_md, &wei_md, has_bias ? &bias_md : NULL, &dst_md, attr,
                   be->engine));
        if (!decided)
            conv_keep_channels_last(plan, s, &pd, &src_md, &wei_md, has_bias ? &bias_md : NULL,
                                    &dst_md, attr);
    }

    if (!decided) {
        const dnnl_memory_desc_t *q_src = dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0);
        const dnnl_memory_desc_t *q_wei =
            dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
        const dnnl_memory_desc_t *q_dst = dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0);
        if (x->batched && !wk__cpu_batch_outermost(q_src)) {
            rc = wk_fail(plan, SQ_UNSUPPORTED_MODEL,
                         "conv step %d: oneDNN chose a source layout that blocks the batch", si);
            goto out;
        }
        wk__cpu_set_out_md(plan, s->out, q_dst);
        if (y->batched && !wk__cpu_batch_outermost(&be->bufs[wk__cpu_vbuf(s->out)].md)) {
            rc = wk_fail(plan, SQ_UNSUPPORTED_MODEL,
                         "conv step %d: oneDNN chose a layout that blocks the batch", si);
            goto out;
        }
        /* A residual that dies here and has the output's layout lends its
         * buffer: the conv sums into it in place. */
        for (int i = 0; i < s->n_post; i++) {
            if (s->post[i].kind != WK_POST_ADD)
                continue;
            int r = wk__cpu_vbuf(s->post[i].value), root = wk__cpu_root_buf(be, r);
            cpu_buf_t *rb = &be->bufs[r], *ob = &be->bufs[wk__cpu_vbuf(s->out)];
            if (rb->first < 0 || g->values[s->post[i].value].is_output ||
                g->values[s->post[i].value].is_input || be->bufs[root].last != si ||
                rb->last != si || ob->alias >= 0 ||
                wk__cpu_root_buf(be, wk__cpu_vbuf(s->in[0])) == root ||
                !dnnl_memory_desc_equal(&rb->md, q_dst))
                continue;
            ob->alias = r;
            if (be->bufs[root].last < ob->last)
                be->bufs[root].last = ob->last;
            cs->inplace = true;
        }
        cs->src_md = *q_src;
        wk__cpu_as_layout(plan, si, batch, s->in[0], q_src, &cs->tmp_src);
        /* The weights: reordered into the chosen layout once. */
        dnnl_memory_desc_t wplain;
        int64_t wdims[DNNL_MAX_NDIMS];
        for (int i = 0; i < q_wei->ndims; i++)
            wdims[i] = q_wei->dims[i];
        wk__cpu_plain_md(&wplain, q_wei->ndims, wdims);
        cs->weights = wk__cpu_const_reorder(plan, &wplain, w->data, q_wei);
        if (cs->weights < 0) {
            rc = cs->weights;
            goto out;
        }
        if (dwi >= 0) {
            const wk_post_t *dp = &s->post[dwi];
            const wk_value_t *dwv = &g->values[dp->value], *dbv = &g->values[dp->bias];
            dnnl_memory_desc_t dwp, dbp;
            dnnl_dims_t dbd = {dbv->dims[0]};
            dw_plain_md(&dwp, dwv);
            DN(dnnl_memory_desc_init_by_tag(&dbp, 1, dbd, dnnl_f32, dnnl_a));
            const dnnl_memory_desc_t *q_dww = dnnl_primitive_desc_query_md(
                pd, dnnl_query_exec_arg_md, DNNL_ARG_ATTR_POST_OP_DW | DNNL_ARG_WEIGHTS);
            const dnnl_memory_desc_t *q_dwb = dnnl_primitive_desc_query_md(
                pd, dnnl_query_exec_arg_md, DNNL_ARG_ATTR_POST_OP_DW | DNNL_ARG_BIAS);
            if (q_dww == NULL || q_dww->ndims == 0 || q_dwb == NULL || q_dwb->ndims == 0) {
                rc = wk_fail(plan, SQ_INTERNAL, "conv step %d: no fused depthwise weights", si);
                goto out;
            }
            if ((cs->dw_wei = wk__cpu_const_reorder(plan, &dwp, dwv->data, q_dww)) < 0) {
                rc = cs->dw_wei;
                goto out;
            }
            if ((cs->dw_bias = wk__cpu_const_reorder(plan, &dbp, dbv->data, q_dwb)) < 0) {
                rc = cs->dw_bias;
                goto out;
            }
        }
        /* the descriptor's dst: with a fused dw, the 1x1's own output */
        if (x->batched && g->max_batch > 1 &&
            (rc = conv_per_batch(plan, si, q_src, q_wei, dwi >= 0 ? &dst_md : q_dst, &wei_md,
                                 has_bias ? &bias_md : NULL, attr, &wplain, w->data)) != 0)
            goto out;
        dnnl_primitive_desc_destroy(pd);
        pd = NULL;
        goto out;
    }
    /* A residual add: the other addend goes into dst first, the conv sums. */
    for (int i = 0; i < s->n_post && !cs->inplace; i++)
        if (s->post[i].kind == WK_POST_ADD &&
            (rc = wk__cpu_emit_reorder(plan, batch, si, wk__cpu_vbuf(s->post[i].value),
                                       wk__cpu_vbuf(s->out))) != 0)
            goto out;
    int src = cs->tmp_src >= 0 ? wk__cpu_as_layout(plan, si, batch, s->in[0], NULL, &cs->tmp_src)
                               : wk__cpu_vbuf(s->in[0]);
    if (src < 0) {
        rc = SQ_UNSUPPORTED_MODEL;
        goto out;
    }
    int wbuf = cs->wei_alt != NULL && cs->wei_alt[batch] >= 0 ? cs->wei_alt[batch] : cs->weights;
    int kinds[6] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST};
    int bufs[6] = {src, wbuf, wk__cpu_vbuf(s->out)}, n_args = 3;
    if (has_bias) {
        kinds[n_args] = DNNL_ARG_BIAS;
        bufs[n_args++] = wk__cpu_vbuf(s->in[2]);
    }
    if (dwi >= 0) {
        int dw_wei = cs->dw_alt != NULL && cs->dw_alt[batch] >= 0 ? cs->dw_alt[batch] : cs->dw_wei;
        if (!dnnl_memory_desc_equal(
                dnnl_primitive_desc_query_md(pd, dnnl_query_exec_arg_md,
                                             DNNL_ARG_ATTR_POST_OP_DW | DNNL_ARG_WEIGHTS),
                &be->bufs[dw_wei].md)) {
            rc = wk_fail(plan, SQ_INTERNAL,
                         "conv step %d: the fused depthwise weights want another layout at "
                         "batch %d",
                         si, batch);
            goto out;
        }
        kinds[n_args] = DNNL_ARG_ATTR_POST_OP_DW | DNNL_ARG_WEIGHTS;
        bufs[n_args++] = dw_wei;
        kinds[n_args] = DNNL_ARG_ATTR_POST_OP_DW | DNNL_ARG_BIAS;
        bufs[n_args++] = cs->dw_bias;
    }
    rc = wk__cpu_emit(plan, pd, batch, si, kinds, bufs, n_args);
    pd = NULL;
out:
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    dnnl_post_ops_destroy(po);
    dnnl_primitive_attr_destroy(attr);
    return rc;
}

static int build_pool(wk_plan_t *plan, int si, int batch)
{
    cpu_be_t *be = plan->be;
    const wk_graph_t *g = plan->graph;
    const wk_step_t *s = &g->steps[si];
    const wk_value_t *x = &g->values[s->in[0]], *y = &g->values[s->out];
    int rc = 0, nsp = x->ndim - 2;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_dims_t strides, kernel, dil, pl, pr;
    if (nsp < 1 || nsp > WK_MAX_SPATIAL)
        return wk_fail(plan, SQ_UNSUPPORTED_MODEL, "pooling over %d spatial dims", nsp);
    for (int i = 0; i < nsp; i++) {
        if (s->kind == WK_K_GLOBALAVG) {
            kernel[i] = x->dims[2 + i];
            strides[i] = 1;
            dil[i] = pl[i] = pr[i] = 0;
        } else {
            kernel[i] = s->p.conv.kernel[i];
            strides[i] = s->p.conv.stride[i];
            dil[i] = s->p.conv.dilation[i] - 1;
            pl[i] = s->p.conv.pad_begin[i];
            pr[i] = s->p.conv.pad_end[i];
        }
    }
    dnnl_alg_kind_t alg = s->kind == WK_K_MAXPOOL ? dnnl_pooling_max
                          : s->kind == WK_K_AVGPOOL && s->p.conv.count_include_pad
                              ? dnnl_pooling_avg_include_padding
                              : dnnl_pooling_avg_exclude_padding;
    dnnl_memory_desc_t src_md = wk__cpu_md_at(&be->bufs[wk__cpu_vbuf(s->in[0])], batch), dst_md;
    if (be->phase == 1) {
        /* The output keeps the input's layout when it can. */
        dnnl_dims_t d;
        for (int i = 0; i < y->ndim; i++)
            d[i] = y->dims[i];
        dnnl_memory_desc_init_by_tag(&dst_md, y->ndim, d, dnnl_f32, dnnl_format_tag_any);
    } else {
        dst_md = wk__cpu_md_at(&be->bufs[wk__cpu_vbuf(s->out)], batch);
    }
    dnnl_pooling_v2_desc_t desc;
    DN(dnnl_pooling_v2_forward_desc_init(&desc, dnnl_forward_inference, alg, &src_md, &dst_md,
                                         strides, kernel, dil, pl, pr));
    DN(dnnl_primitive_desc_create(&pd, &desc, be->sp_attr, be->engine, NULL));
    if (be->phase == 1) {
        wk__cpu_set_out_md(plan, s->out, dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0));
        if (y->batched && !wk__cpu_batch_outermost(&be->bufs[wk__cpu_vbuf(s->out)].md))
            wk__cpu_set_out_plain(plan, s->out);
    }
    rc = wk__cpu_emit(plan, pd, batch, si, (int[]){DNNL_ARG_SRC, DNNL_ARG_DST},
                      (int[]){wk__cpu_vbuf(s->in[0]), wk__cpu_vbuf(s->out)}, 2);
    pd = NULL;
out:
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    return rc;
}

static int build_eltwise(wk_plan_t *plan, int si, int batch)
{
    cpu_be_t *be = plan->be;
    const wk_step_t *s = &plan->graph->steps[si];
    int rc = 0;
    dnnl_primitive_desc_t pd = NULL;
    if (be->phase == 1)
        wk__cpu_set_out_md(plan, s->out, &be->bufs[wk__cpu_vbuf(s->in[0])].md);
    dnnl_memory_desc_t md = wk__cpu_md_at(&be->bufs[wk__cpu_vbuf(s->in[0])], batch);
    wk_act_t a = s->p.act;
    float alpha, beta;
    wk__cpu_act_params(a, &alpha, &beta);
    dnnl_eltwise_desc_t desc;
    DN(dnnl_eltwise_forward_desc_init(&desc, dnnl_forward_inference, wk__cpu_act_alg(a.kind), &md,
                                      alpha, beta));
    DN(dnnl_primitive_desc_create(&pd, &desc, be->sp_attr, be->engine, NULL));
    rc = wk__cpu_emit(plan, pd, batch, si, (int[]){DNNL_ARG_SRC, DNNL_ARG_DST},
                      (int[]){wk__cpu_vbuf(s->in[0]), wk__cpu_vbuf(s->out)}, 2);
    pd = NULL;
    if (rc == 0 && a.kind == WK_ACT_HARDSIGMOID) {
        /* then clip(0, 1) in place (a post-op on the reference eltwise
         * loses the values in oneDNN 2.6) */
        DN(dnnl_eltwise_forward_desc_init(&desc, dnnl_forward_inference, dnnl_eltwise_clip, &md,
                                          0.0f, 1.0f));
        DN(dnnl_primitive_desc_create(&pd, &desc, be->sp_attr, be->engine, NULL));
        rc = wk__cpu_emit(plan, pd, batch, si, (int[]){DNNL_ARG_SRC, DNNL_ARG_DST},
                          (int[]){wk__cpu_vbuf(s->out), wk__cpu_vbuf(s->out)}, 2);
        pd = NULL;
    }
out:
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    return rc;
}

/* The plain layout of value v seen with `ndim` dims (leading 1s added). */
static dnnl_memory_desc_t plain_ranked(const wk_value_t *v, int batch, int ndim)
{
    int64_t dims[WK_MAX_DIMS];
    int n = wk_value_dims_at(v, batch, dims + (ndim - v->ndim));
    for (int i = 0; i < ndim - n; i++)
        dims[i] = 1;
    dnnl_memory_desc_t md;
    wk__cpu_plain_md(&md, ndim, dims);
    return md;
}

/* A plain layout with its dims in another order (what a Transpose leaves
 * as a view): oneDNN's jit binary wants both sources alike and runs this
 * one against a row-major operand with its reference kernel, 40 ms for
 * one of ViT-B's residual adds. */
static bool permuted_plain(const dnnl_memory_desc_t *md, const wk_value_t *v)
{
    if (md->format_kind != dnnl_blocked || md->format_desc.blocking.inner_nblks != 0)
        return false;
    dnnl_memory_desc_t p;
    wk__cpu_plain_md(&p, v->ndim, v->dims);
    if (dnnl_memory_desc_equal(md, &p))
        return false;
    /* Channels last, what convs leave, is a layout the jit binary runs
     * (hardswish's x * hardsigmoid(x) after every mobilenet_v3 conv):
     * made row-major, it cost two reorders there and one back. */
    static const dnnl_format_tag_t last[] = {dnnl_acb, dnnl_acdb, dnnl_acdeb};
    dnnl_dims_t d = {0};
    for (int i = 0; i < v->ndim; i++)
        d[i] = v->dims[i];
    if (v->ndim >= 3 && v->ndim <= 5 &&
        dnnl_memory_desc_init_by_tag(&p, v->ndim, d, dnnl_f32, last[v->ndim - 3]) == dnnl_success &&
        dnnl_memory_desc_equal(md, &p))
        return false;
    return true;
}

/* Whether oneDNN would run this binary with its reference kernel because
 * the full operand is in channel blocks and the other broadcasts row-major
 * (oneDNN 2.6's jit binary takes blocks only of its vector width and with
 * both sources in them, binary_blocked_bcast: a squeeze-excitation
 * multiply after a conv that chose 8 took 3-6 ms instead of 0.03 with
 * AVX-512). If so, *cl is set to the channels-last layout to read it in
 * instead. */
static bool binary_blocked_ref(wk_plan_t *plan, const wk_step_t *s, wk_binop_t op, int src0,
                               const wk_value_t *bv, const wk_value_t *y, dnnl_memory_desc_t *cl)
{
    cpu_be_t *be = plan->be;
    const dnnl_memory_desc_t *md0 = &be->bufs[src0].md;
    if (md0->format_kind != dnnl_blocked || md0->format_desc.blocking.inner_nblks == 0 ||
        y->ndim != 4 || s->kind != WK_K_BINARY)
        return false;
    dnnl_memory_desc_t md1 = plain_ranked(bv, plan->graph->max_batch, y->ndim);
    dnnl_binary_desc_t desc;
    dnnl_primitive_desc_t pd = NULL;
    bool ref =
        dnnl_binary_desc_init(&desc, wk__cpu_bin_alg(op), md0, &md1, md0) == dnnl_success &&
        dnnl_primitive_desc_create(&pd, &desc, be->sp_attr, be->engine, NULL) == dnnl_success &&
        impl_is_ref(pd);
    if (pd != NULL)
        dnnl_primitive_desc_destroy(pd);
    return ref &&
           dnnl_memory_desc_init_by_tag(cl, 4, md0->dims, dnnl_f32, dnnl_acdb) == dnnl_success;
}

/* Whether the broadcast operand bv, made by a step in the same channel
 * blocks as src0 (a squeeze-excitation's scale, [N, C, 1, 1], from a conv
 * after the conv that made src0), is read in those blocks: oneDNN 2.6's jit
 * binary takes blocks of its vector width (8 channels with AVX2, 16 with
 * AVX-512) when both sources have them, and runs its reference kernel
 * when the broadcast one is row-major. With AVX2 only, where every conv
 * chooses nChw8c, reading it row-major cost a reorder of the scale and
 * one of the full operand into channels last (binary_blocked_ref), and
 * the next conv another back. */
static bool binary_blocked_bcast(wk_plan_t *plan, const wk_step_t *s, wk_binop_t op, int src0,
                                 const wk_value_t *bv, int b, const wk_value_t *y)
{
    cpu_be_t *be = plan->be;
    const dnnl_memory_desc_t *md0 = &be->bufs[src0].md;
    const cpu_buf_t *bb = &be->bufs[wk__cpu_vbuf(b)];
    const dnnl_memory_desc_t *md1 = &bb->md;
    if (s->kind != WK_K_BINARY || y->ndim != 4 || bv->ndim != 4 || bv->data != NULL ||
        !bb->decided || bb->alias >= 0 || md0->format_kind != dnnl_blocked ||
        md1->format_kind != dnnl_blocked || md0->format_desc.blocking.inner_nblks == 0 ||
        (bv->batched && !wk__cpu_batch_outermost(md1)))
        return false;
    const dnnl_blocking_desc_t *b0 = &md0->format_desc.blocking, *b1 = &md1->format_desc.blocking;
    if (b0->inner_nblks != b1->inner_nblks)
        return false;
    for (int i = 0; i < b0->inner_nblks; i++)
        if (b0->inner_blks[i] != b1->inner_blks[i] || b0->inner_idxs[i] != b1->inner_idxs[i])
            return false;
    dnnl_binary_desc_t desc;
    dnnl_primitive_desc_t pd = NULL;
    bool fast =
        dnnl_binary_desc_init(&desc, wk__cpu_bin_alg(op), md0, md1, md0) == dnnl_success &&
        dnnl_primitive_desc_create(&pd, &desc, be->sp_attr, be->engine, NULL) == dnnl_success &&
        !impl_is_ref(pd);
    if (pd != NULL)
        dnnl_primitive_desc_destroy(pd);
    return fast;
}

static int build_binary(wk_plan_t *plan, int si, int batch)
{
    cpu_be_t *be = plan->be;
    const wk_graph_t *g = plan->graph;
    const wk_step_t *s = &g->steps[si];
    cpu_step_t *cs = &be->steps[si];
    int rc = 0;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    const wk_value_t *y = &g->values[s->out];
    int a = s->in[0], b = s->in[1];
    wk_binop_t op = s->kind == WK_K_BINARY ? s->p.binop : WK_BIN_MUL;
    bool negate = false;
    /* oneDNN broadcasts only the second source: put the full one first. */
    if (wk_value_elems(&g->values[a]) != wk_value_elems(y) || g->values[a].ndim != y->ndim) {
        if (wk_value_elems(&g->values[b]) != wk_value_elems(y) || g->values[b].ndim != y->ndim ||
            op == WK_BIN_DIV)
            return wk_fail(plan, SQ_UNSUPPORTED_MODEL,
                           "binary step %d: both operands broadcast, or the dividend does", si);
        int t = a;
        a = b;
        b = t;
        negate = op == WK_BIN_SUB;
    }
    const wk_value_t *bv = &g->values[b];
    if (be->phase == 1) {
        /* The output takes the full operand's layout (made row-major when
         * it is a permuted view); the broadcast one is read plain with the
         * output's rank, unless it has the same shape and layout (a
         * residual add). */
        int src0 = wk__cpu_vbuf(a);
        dnnl_memory_desc_t cl;
        bool bcast_blocked = false;
        if (permuted_plain(&be->bufs[src0].md, &g->values[a])) {
            src0 = wk__cpu_as_plain(plan, si, batch, a, &cs->tmp_src);
            if (src0 < 0)
                return src0;
        } else if (binary_blocked_bcast(plan, s, op, src0, bv, b, y)) {
            bcast_blocked = true;
        } else if (binary_blocked_ref(plan, s, op, src0, bv, y, &cl)) {
            src0 = wk__cpu_as_layout(plan, si, batch, a, &cl, &cs->tmp_src);
            if (src0 < 0)
                return src0;
        }
        wk__cpu_set_out_md(plan, s->out, &be->bufs[src0].md);
        bool same =
            bv->data == NULL && wk_value_elems(bv) == wk_value_elems(y) && bv->ndim == y->ndim;
        if (same) {
            wk__cpu_as_layout(plan, si, batch, b, &be->bufs[src0].md, &cs->tmp_in[0]);
            cs->bias = cs->tmp_in[0] >= 0 ? cs->tmp_in[0] : wk__cpu_vbuf(b);
        } else if (bcast_blocked) {
            cs->bias = wk__cpu_vbuf(b);
        } else {
            if (bv->batched && bv->ndim != y->ndim)
                return wk_fail(plan, SQ_UNSUPPORTED_MODEL,
                               "binary step %d: batched operand of "
                               "lower rank",
                               si);
            dnnl_memory_desc_t p;
            wk__cpu_plain_md(&p, bv->ndim, bv->dims);
            int src = wk__cpu_as_layout(plan, si, batch, b, &p, &cs->tmp_in[0]);
            if (src < 0)
                return src;
            dnnl_memory_desc_t r = plain_ranked(bv, g->max_batch, y->ndim);
            cs->bias = wk__cpu_view_buf(be, src, &r, bv->batched);
        }
        if (s->kind == WK_K_BATCHNORM) {
            dnnl_memory_desc_t r = plain_ranked(&g->values[s->in[2]], 1, y->ndim);
            cs->extra = wk__cpu_add_buf(be, &r, false, -2, -2);
            be->bufs[cs->extra].data = g->values[s->in[2]].data;
        }
    } else if ((cs->tmp_in[0] >= 0 &&
                wk__cpu_as_layout(plan, si, batch, b, NULL, &cs->tmp_in[0]) < 0) ||
               (cs->tmp_src >= 0 &&
                wk__cpu_as_layout(plan, si, batch, a, NULL, &cs->tmp_src) < 0)) {
        return SQ_UNSUPPORTED_MODEL;
    }
    int src0 = cs->tmp_src >= 0 ? cs->tmp_src : wk__cpu_vbuf(a);
    dnnl_memory_desc_t md0 = wk__cpu_md_at(&be->bufs[src0], batch);
    dnnl_memory_desc_t md1 = wk__cpu_md_at(&be->bufs[cs->bias], batch);
    dnnl_memory_desc_t mdd = wk__cpu_md_at(&be->bufs[wk__cpu_vbuf(s->out)], batch);
    DN(dnnl_primitive_attr_create(&attr));
    DN(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user));
    DN(dnnl_post_ops_create(&po));
    if (negate)
        DN(dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_linear, -1.0f, 0.0f));
    if (s->kind == WK_K_BATCHNORM)
        DN(dnnl_post_ops_append_binary(po, dnnl_binary_add, &be->bufs[cs->extra].md));
    DN(dnnl_primitive_attr_set_post_ops(attr, po));
    dnnl_binary_desc_t desc;
    DN(dnnl_binary_desc_init(&desc, wk__cpu_bin_alg(op), &md0, &md1, &mdd));
    DN(dnnl_primitive_desc_create(&pd, &desc, attr, be->engine, NULL));
    int kinds[4] = {DNNL_ARG_SRC_0, DNNL_ARG_SRC_1, DNNL_ARG_DST,
                    DNNL_ARG_ATTR_MULTIPLE_POST_OP(negate ? 1 : 0) | DNNL_ARG_SRC_1};
    int bufs[4] = {src0, cs->bias, wk__cpu_vbuf(s->out), cs->extra};
    rc = wk__cpu_emit(plan, pd, batch, si, kinds, bufs, s->kind == WK_K_BATCHNORM ? 4 : 3);
    pd = NULL;
out:
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    dnnl_post_ops_destroy(po);
    dnnl_primitive_attr_destroy(attr);
    return rc;
}

static int build_concat(wk_plan_t *plan, int si, int batch)
{
    cpu_be_t *be = plan->be;
    const wk_graph_t *g = plan->graph;
    const wk_step_t *s = &g->steps[si];
    const wk_value_t *y = &g->values[s->out];
    int rc = 0;
    dnnl_primitive_desc_t pd = NULL;
    if (y->batched && s->p.axis == 0)
        return wk_fail(plan, SQ_UNSUPPORTED_MODEL, "concat step %d along the batch", si);
    /* Any number of inputs: oneDNN's concat takes N sources (DenseNet's
     * last blocks concatenate up to 49). */
    dnnl_memory_desc_t *mds = sq_xmalloc((size_t)s->n_in * sizeof(*mds)), dst;
    int *kinds = sq_xmalloc((size_t)(s->n_in + 1) * sizeof(*kinds));
    int *bufs = sq_xmalloc((size_t)(s->n_in + 1) * sizeof(*bufs));
    for (int i = 0; i < s->n_in; i++)
        mds[i] = wk__cpu_md_at(&be->bufs[wk__cpu_vbuf(s->in[i])], batch);
    if (be->phase == 1) {
        DN(dnnl_concat_primitive_desc_create(&pd, NULL, s->n_in, s->p.axis, mds, be->sp_attr,
                                             be->engine));
        wk__cpu_set_out_md(plan, s->out, dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0));
        if (y->batched && !wk__cpu_batch_outermost(&be->bufs[wk__cpu_vbuf(s->out)].md)) {
            be->bufs[wk__cpu_vbuf(s->out)].decided = false;
            wk__cpu_set_out_plain(plan, s->out);
        }
        dnnl_primitive_desc_destroy(pd);
        pd = NULL;
    }
    dst = wk__cpu_md_at(&be->bufs[wk__cpu_vbuf(s->out)], batch);
    DN(dnnl_concat_primitive_desc_create(&pd, &dst, s->n_in, s->p.axis, mds, be->sp_attr,
                                         be->engine));
    for (int i = 0; i < s->n_in; i++) {
        kinds[i] = DNNL_ARG_MULTIPLE_SRC + i;
        bufs[i] = wk__cpu_vbuf(s->in[i]);
    }
    kinds[s->n_in] = DNNL_ARG_DST;
    bufs[s->n_in] = wk__cpu_vbuf(s->out);
    rc = wk__cpu_emit(plan, pd, batch, si, kinds, bufs, s->n_in + 1);
    pd = NULL;
out:
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    free(mds);
    free(kinds);
    free(bufs);
    return rc;
}

/* A plain 2-D or n-D view over a buffer, scaled with the batch through
 * batch_mult when its first dim is batch * something. */
static int plain_view(cpu_be_t *be, int id, int ndim, const int64_t *dims_max, bool batched,
                      int64_t batch_mult)
{
    dnnl_memory_desc_t md;
    wk__cpu_plain_md(&md, ndim, dims_max);
    int v = wk__cpu_view_buf(be, id, &md, batched);
    be->bufs[v].batch_mult = batch_mult;
    return v;
}

static int build_softmax(wk_plan_t *plan, int si, int batch)
{
    cpu_be_t *be = plan->be;
    const wk_graph_t *g = plan->graph;
    const wk_step_t *s = &g->steps[si];
    cpu_step_t *cs = &be->steps[si];
    const wk_value_t *x = &g->values[s->in[0]];
    int rc = 0, axis = s->p.axis;
    dnnl_primitive_desc_t pd = NULL;
    if (be->phase == 1) {
        wk__cpu_set_out_plain(plan, s->out);
        int src = wk__cpu_as_plain(plan, si, batch, s->in[0], &cs->tmp_src);
        if (src < 0)
            return src;
        if (s->legacy_softmax) {
            if (x->batched && axis == 0)
                return wk_fail(plan, SQ_UNSUPPORTED_MODEL, "softmax step %d over the batch", si);
            int64_t d2[2] = {1, 1};
            for (int i = 0; i < x->ndim; i++)
                d2[i < axis ? 0 : 1] *= x->dims[i];
            int64_t mult = x->batched ? d2[0] / x->dims[0] : 1;
            cs->bias = plain_view(be, src, 2, d2, x->batched, mult);
            cs->extra = plain_view(be, wk__cpu_vbuf(s->out), 2, d2, x->batched, mult);
        } else {
            cs->bias = src;
            cs->extra = wk__cpu_vbuf(s->out);
        }
    } else if (cs->tmp_src >= 0 &&
               wk__cpu_as_layout(plan, si, batch, s->in[0], NULL, &cs->tmp_src) < 0) {
        return SQ_UNSUPPORTED_MODEL;
    }
    dnnl_memory_desc_t src_md = wk__cpu_md_at(&be->bufs[cs->bias], batch);
    dnnl_memory_desc_t dst_md = wk__cpu_md_at(&be->bufs[cs->extra], batch);
    dnnl_softmax_v2_desc_t desc;
    DN(dnnl_softmax_v2_forward_desc_init(&desc, dnnl_forward_inference, dnnl_softmax_accurate,
                                         &src_md, &dst_md, s->legacy_softmax ? 1 : axis));
    DN(dnnl_primitive_desc_create(&pd, &desc, be->sp_attr, be->engine, NULL));
    rc = wk__cpu_emit(plan, pd, batch, si, (int[]){DNNL_ARG_SRC, DNNL_ARG_DST},
                      (int[]){cs->bias, cs->extra}, 2);
    pd = NULL;
out:
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    return rc;
}

static void strided_md(dnnl_memory_desc_t *md, int64_t rows, int64_t cols, bool transposed)
{
    dnnl_dims_t d = {rows, cols};
    dnnl_dims_t st = {transposed ? 1 : cols, transposed ? rows : 1};
    dnnl_memory_desc_init_by_strides(md, 2, d, dnnl_f32, st);
}

/* Gemm: Y = alpha * A' B' + beta * C, A' = A or A^T, B' = B or B^T. */
static int build_gemm(wk_plan_t *plan, int si, int batch)
{
    cpu_be_t *be = plan->be;
    const wk_graph_t *g = plan->graph;
    const wk_step_t *s = &g->steps[si];
    cpu_step_t *cs = &be->steps[si];
    const wk_value_t *av = &g->values[s->in[0]], *bv = &g->values[s->in[1]];
    const wk_value_t *y = &g->values[s->out];
    const wk_value_t *cv = s->n_in > 2 && s->in[2] >= 0 ? &g->values[s->in[2]] : NULL;
    int rc = 0;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    int ta = s->p.gemm.trans_a, tb = s->p.gemm.trans_b;
    float alpha = s->p.gemm.alpha, beta = s->p.gemm.beta;
    if (av->ndim != 2 || bv->ndim != 2 || y->ndim != 2)
        return wk_fail(plan, SQ_UNSUPPORTED_MODEL, "gemm step %d: operands must be 2-D", si);
    int64_t M = y->dims[0], N = y->dims[1], K = ta ? av->dims[0] : av->dims[1];
    bool c_const = cv == NULL || cv->data != NULL;
    bool scale_out = alpha != 1.0f && bv->data == NULL;
    if ((ta && av->batched) || bv->batched || (cv && cv->batched && !c_const))
        return wk_fail(plan, SQ_UNSUPPORTED_MODEL,
                       "gemm step %d: batch in a transposed or "
                       "second operand",
                       si);
    if (!c_const && beta != 1.0f)
        return wk_fail(plan, SQ_UNSUPPORTED_MODEL, "gemm step %d: beta with a computed C", si);
    DN(dnnl_primitive_attr_create(&attr));
    DN(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user));
    DN(dnnl_post_ops_create(&po));
    if (scale_out)
        DN(dnnl_primitive_attr_set_output_scales(attr, 1, 0, &alpha));
    dnnl_memory_desc_t cmd;
    if (!c_const) {
        cmd = plain_ranked(cv, 1, 2);
        DN(dnnl_post_ops_append_binary(po, dnnl_binary_add, &cmd));
    }
    DN(dnnl_primitive_attr_set_post_ops(attr, po));
    if (be->phase == 1) {
        wk__cpu_set_out_plain(plan, s->out);
        dnnl_memory_desc_t p;
        wk__cpu_plain_md(&p, av->ndim, av->dims);
        int src = wk__cpu_as_layout(plan, si, batch, s->in[0], &p, &cs->tmp_src);
        if (src < 0) {
            rc = src;
            goto out;
        }
        if (ta) {
            dnnl_memory_desc_t t;
            strided_md(&t, M, K, true);
            cs->tmp_in[1] = wk__cpu_view_buf(be, src, &t, false);
        } else {
            cs->tmp_in[1] = src;
        }
        dnnl_memory_desc_t bmd;
        strided_md(&bmd, K, N, tb);
        if (bv->data != NULL) {
            /* Constant weights: alpha folded in, layout chosen by oneDNN. */
            dnnl_memory_desc_t any, amd, dmd;
            dnnl_dims_t wd = {K, N}, ad = {M, K}, dd = {M, N};
            dnnl_memory_desc_init_by_tag(&any, 2, wd, dnnl_f32, dnnl_format_tag_any);
            dnnl_memory_desc_init_by_tag(&amd, 2, ad, dnnl_f32, dnnl_format_tag_any);
            amd = be->bufs[cs->tmp_in[1]].md;
            dnnl_memory_desc_init_by_tag(&dmd, 2, dd, dnnl_f32, dnnl_ab);
            dnnl_matmul_desc_t md;
            DN(dnnl_matmul_desc_init(&md, &amd, &any, NULL, &dmd));
            DN(dnnl_primitive_desc_create(&pd, &md, attr, be->engine, NULL));
            dnnl_memory_desc_t want = *dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
            dnnl_primitive_desc_destroy(pd);
            pd = NULL;
            float *scaled = NULL;
            if (alpha != 1.0f) {
                scaled = sq_xmalloc((size_t)(K * N) * sizeof(float));
                for (int64_t i = 0; i < K * N; i++)
                    scaled[i] = bv->data[i] * alpha;
            }
            cs->weights = wk__cpu_const_reorder(plan, &bmd, scaled ? scaled : bv->data, &want);
            free(scaled);
            if (cs->weights < 0) {
                rc = cs->weights;
                goto out;
            }
        } else {
            int src_b = wk__cpu_as_plain(plan, si, batch, s->in[1], &cs->tmp_in[2]);
            if (src_b < 0) {
                rc = src_b;
                goto out;
            }
            cs->weights = wk__cpu_view_buf(be, src_b, &bmd, false);
        }
        if (cv != NULL && c_const) {
            /* bias: beta * C, broadcast to [M, N] */
            dnnl_memory_desc_t r = plain_ranked(cv, 1, 2);
            int64_t n = wk_value_elems(cv);
            float *scaled = sq_xmalloc((size_t)n * sizeof(float));
            for (int64_t i = 0; i < n; i++)
                scaled[i] = cv->data[i] * beta;
            cs->bias = wk__cpu_const_reorder(plan, &r, scaled, &r);
            free(scaled);
            if (cs->bias < 0) {
                rc = cs->bias;
                goto out;
            }
            if (r.dims[0] != 1 && av->batched) {
                rc = wk_fail(plan, SQ_UNSUPPORTED_MODEL, "gemm step %d: C has a batch of rows", si);
                goto out;
            }
        } else if (cv != NULL) {
            int src_c = wk__cpu_as_plain(plan, si, batch, s->in[2], &cs->tmp_in[3]);
            if (src_c < 0) {
                rc = src_c;
                goto out;
            }
            cs->extra = wk__cpu_view_buf(be, src_c, &cmd, false);
        }
    } else {
        if (cs->tmp_src >= 0 &&
            wk__cpu_as_layout(plan, si, batch, s->in[0], NULL, &cs->tmp_src) < 0)
            return SQ_UNSUPPORTED_MODEL;
        if (cs->tmp_in[2] >= 0 &&
            wk__cpu_as_layout(plan, si, batch, s->in[1], NULL, &cs->tmp_in[2]) < 0)
            return SQ_UNSUPPORTED_MODEL;
        if (cs->tmp_in[3] >= 0 &&
            wk__cpu_as_layout(plan, si, batch, s->in[2], NULL, &cs->tmp_in[3]) < 0)
            return SQ_UNSUPPORTED_MODEL;
    }
    {
        dnnl_memory_desc_t amd = wk__cpu_md_at(&be->bufs[cs->tmp_in[1]], batch);
        dnnl_memory_desc_t wmd = be->bufs[cs->weights].md;
        dnnl_memory_desc_t dmd = wk__cpu_md_at(&be->bufs[wk__cpu_vbuf(s->out)], batch);
        dnnl_memory_desc_t bias_md;
        if (cs->bias >= 0)
            bias_md = be->bufs[cs->bias].md;
        dnnl_matmul_desc_t md;
        DN(dnnl_matmul_desc_init(&md, &amd, &wmd, cs->bias >= 0 ? &bias_md : NULL, &dmd));
        DN(dnnl_primitive_desc_create(&pd, &md, attr, be->engine, NULL));
        int kinds[5] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST};
        int bufs[5] = {cs->tmp_in[1], cs->weights, wk__cpu_vbuf(s->out)};
        int n = 3;
        if (cs->bias >= 0) {
            kinds[n] = DNNL_ARG_BIAS;
            bufs[n++] = cs->bias;
        }
        if (cs->extra >= 0) {
            kinds[n] = DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1;
            bufs[n++] = cs->extra;
        }
        rc = wk__cpu_emit(plan, pd, batch, si, kinds, bufs, n);
        pd = NULL;
    }
out:
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    dnnl_post_ops_destroy(po);
    dnnl_primitive_attr_destroy(attr);
    return rc;
}

/* MatMul with numpy semantics: batched, broadcast, 1-D operands promoted. */
static int build_matmul(wk_plan_t *plan, int si, int batch)
{
    cpu_be_t *be = plan->be;
    const wk_graph_t *g = plan->graph;
    const wk_step_t *s = &g->steps[si];
    cpu_step_t *cs = &be->steps[si];
    const wk_value_t *av = &g->values[s->in[0]], *bv = &g->values[s->in[1]];
    const wk_value_t *y = &g->values[s->out];
    int rc = 0;
    dnnl_primitive_desc_t pd = NULL;
    if (be->phase == 1) {
        int r = av->ndim > bv->ndim ? av->ndim : bv->ndim;
        if (r < 2)
            r = 2;
        int64_t ad[WK_MAX_DIMS], bd[WK_MAX_DIMS], yd[WK_MAX_DIMS];
        for (int i = 0; i < r; i++)
            ad[i] = bd[i] = 1;
        if (av->ndim == 1)
            ad[r - 1] = av->dims[0];
        else
            for (int i = 0; i < av->ndim; i++)
                ad[r - av->ndim + i] = av->dims[i];
        if (bv->ndim == 1)
            bd[r - 2] = bv->dims[0];
        else
            for (int i = 0; i < bv->ndim; i++)
                bd[r - bv->ndim + i] = bv->dims[i];
        for (int i = 0; i < r - 2; i++)
            yd[i] = ad[i] > bd[i] ? ad[i] : bd[i];
        yd[r - 2] = ad[r - 2];
        yd[r - 1] = bd[r - 1];
        bool a_b = av->batched && av->ndim == r, b_b = bv->batched && bv->ndim == r;
        bool y_b = y->batched && y->ndim == r;
        if ((av->batched && !a_b) || (bv->batched && !b_b) || (y->batched && !y_b))
            return wk_fail(plan, SQ_UNSUPPORTED_MODEL, "matmul step %d: batch not leading", si);
        wk__cpu_set_out_plain(plan, s->out);
        int sa = wk__cpu_as_plain(plan, si, batch, s->in[0], &cs->tmp_in[0]);
        int sb = wk__cpu_as_plain(plan, si, batch, s->in[1], &cs->tmp_in[1]);
        if (sa < 0 || sb < 0)
            return sa < 0 ? sa : sb;
        bool shared_b = !b_b && r > 2;
        for (int i = 0; i < r - 2; i++)
            shared_b = shared_b && bd[i] == 1;
        if (shared_b) {
            /* One [K, N] weight for every leading index (a Linear on a
             * [L, N, E] or [N, H, W, C] tensor): the leading dims join M,
             * or oneDNN runs ViT's [197, 1, 768] x [768, 2304] as 197
             * products of one row. */
            int64_t rows = 1;
            for (int i = 0; i < r - 1; i++)
                rows *= ad[i];
            int64_t a2[2] = {rows, ad[r - 1]}, b2[2] = {bd[r - 2], bd[r - 1]};
            int64_t y2[2] = {rows, bd[r - 1]}, mult = a_b ? rows / ad[0] : 1;
            cs->tmp_src = plain_view(be, sa, 2, a2, a_b, mult);
            cs->weights = plain_view(be, sb, 2, b2, false, 1);
            cs->extra = plain_view(be, wk__cpu_vbuf(s->out), 2, y2, y_b, mult);
        } else {
            cs->tmp_src = plain_view(be, sa, r, ad, a_b, 1);
            cs->weights = plain_view(be, sb, r, bd, b_b, 1);
            cs->extra = plain_view(be, wk__cpu_vbuf(s->out), r, yd, y_b, 1);
        }
    } else {
        if (cs->tmp_in[0] >= 0 &&
            wk__cpu_as_layout(plan, si, batch, s->in[0], NULL, &cs->tmp_in[0]) < 0)
            return SQ_UNSUPPORTED_MODEL;
        if (cs->tmp_in[1] >= 0 &&
            wk__cpu_as_layout(plan, si, batch, s->in[1], NULL, &cs->tmp_in[1]) < 0)
            return SQ_UNSUPPORTED_MODEL;
    }
    dnnl_memory_desc_t amd = wk__cpu_md_at(&be->bufs[cs->tmp_src], batch);
    dnnl_memory_desc_t bmd = wk__cpu_md_at(&be->bufs[cs->weights], batch);
    dnnl_memory_desc_t dmd = wk__cpu_md_at(&be->bufs[cs->extra], batch);
    dnnl_matmul_desc_t md;
    DN(dnnl_matmul_desc_init(&md, &amd, &bmd, NULL, &dmd));
    DN(dnnl_primitive_desc_create(&pd, &md, be->sp_attr, be->engine, NULL));
    rc = wk__cpu_emit(plan, pd, batch, si, (int[]){DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST},
                      (int[]){cs->tmp_src, cs->weights, cs->extra}, 3);
    pd = NULL;
out:
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    return rc;
}

static int build_reduce(wk_plan_t *plan, int si, int batch)
{
    cpu_be_t *be = plan->be;
    const wk_graph_t *g = plan->graph;
    const wk_step_t *s = &g->steps[si];
    cpu_step_t *cs = &be->steps[si];
    const wk_value_t *x = &g->values[s->in[0]];
    int rc = 0;
    dnnl_primitive_desc_t pd = NULL;
    if (be->phase == 1) {
        if (x->batched && (s->p.reduce.axes_mask & 1))
            return wk_fail(plan, SQ_UNSUPPORTED_MODEL, "reduce step %d over the batch", si);
        wk__cpu_set_out_plain(plan, s->out);
        int src = wk__cpu_as_plain(plan, si, batch, s->in[0], &cs->tmp_src);
        if (src < 0)
            return src;
        int64_t kd[WK_MAX_DIMS];
        for (int i = 0; i < x->ndim; i++)
            kd[i] = (s->p.reduce.axes_mask >> i) & 1 ? 1 : x->dims[i];
        cs->bias = src;
        cs->extra = plain_view(be, wk__cpu_vbuf(s->out), x->ndim, kd, x->batched, 1);
    } else if (cs->tmp_src >= 0 &&
               wk__cpu_as_layout(plan, si, batch, s->in[0], NULL, &cs->tmp_src) < 0) {
        return SQ_UNSUPPORTED_MODEL;
    }
    dnnl_memory_desc_t smd = wk__cpu_md_at(&be->bufs[cs->bias], batch);
    dnnl_memory_desc_t dmd = wk__cpu_md_at(&be->bufs[cs->extra], batch);
    if (dnnl_memory_desc_equal(&smd, &dmd))
        return wk__cpu_emit_reorder(plan, batch, si, cs->bias, cs->extra); /* nothing reduced */
    dnnl_reduction_desc_t desc;
    DN(dnnl_reduction_desc_init(&desc, dnnl_reduction_mean, &smd, &dmd, 0.0f, 0.0f));
    DN(dnnl_primitive_desc_create(&pd, &desc, be->sp_attr, be->engine, NULL));
    rc = wk__cpu_emit(plan, pd, batch, si, (int[]){DNNL_ARG_SRC, DNNL_ARG_DST},
                      (int[]){cs->bias, cs->extra}, 2);
    pd = NULL;
out:
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    return rc;
}

/* Reshape and friends: the input in plain order, written to the output's
 * bytes (a view of the output with the input's dims). */
static int build_copy(wk_plan_t *plan, int si, int batch)
{
    cpu_be_t *be = plan->be;
    const wk_graph_t *g = plan->graph;
    const wk_step_t *s = &g->steps[si];
    cpu_step_t *cs = &be->steps[si];
    const wk_value_t *x = &g->values[s->in[0]], *y = &g->values[s->out];
    if (be->phase == 1) {
        if (x->batched != y->batched ||
            (x->batched && wk_value_elems(x) / x->dims[0] != wk_value_elems(y) / y->dims[0]))
            return wk_fail(plan, SQ_UNSUPPORTED_MODEL, "reshape step %d moves the batch", si);
        wk__cpu_set_out_plain(plan, s->out);
        cs->extra = plain_view(be, wk__cpu_vbuf(s->out), x->ndim, x->dims, x->batched, 1);
        return 0;
    }
    return wk__cpu_emit_reorder(plan, batch, si, wk__cpu_vbuf(s->in[0]), cs->extra);
}

static int build_transpose(wk_plan_t *plan, int si, int batch)
{
    cpu_be_t *be = plan->be;
    const wk_graph_t *g = plan->graph;
    const wk_step_t *s = &g->steps[si];
    cpu_step_t *cs = &be->steps[si];
    const wk_value_t *x = &g->values[s->in[0]], *y = &g->values[s->out];
    if (be->phase == 1) {
        if (x->batched && s->p.perm[0] != 0)
            return wk_fail(plan, SQ_UNSUPPORTED_MODEL, "transpose step %d moves the batch", si);
        wk__cpu_set_out_plain(plan, s->out);
        int src = wk__cpu_as_plain(plan, si, batch, s->in[0], &cs->tmp_src);
        if (src < 0)
            return src;
        int64_t st[WK_MAX_DIMS], acc = 1;
        for (int i = x->ndim - 1; i >= 0; i--) {
            st[i] = acc;
            acc *= x->dims[i];
        }
        dnnl_dims_t d, vs;
        for (int i = 0; i < y->ndim; i++) {
            d[i] = y->dims[i];
            vs[i] = st[s->p.perm[i]];
        }
        dnnl_memory_desc_t md;
        if (y->ndim == 0)
            wk__cpu_plain_md(&md, 0, NULL);
        else
            dnnl_memory_desc_init_by_strides(&md, y->ndim, d, dnnl_f32, vs);
        cs->bias = wk__cpu_view_buf(be, src, &md, x->batched);
        return 0;
    }
    if (cs->tmp_src >= 0 && wk__cpu_as_layout(plan, si, batch, s->in[0], NULL, &cs->tmp_src) < 0)
        return SQ_UNSUPPORTED_MODEL;
    return wk__cpu_emit_reorder(plan, batch, si, cs->bias, wk__cpu_vbuf(s->out));
}

/* Pad, Slice, Erf and Expand run as plain C over plain buffers. */
static int build_c_kernel(wk_plan_t *plan, int si, int batch)
{
    cpu_be_t *be = plan->be;
    const wk_step_t *s = &plan->graph->steps[si];
    cpu_step_t *cs = &be->steps[si];
    if (be->phase == 1) {
        wk__cpu_set_out_plain(plan, s->out);
        int src = wk__cpu_as_plain(plan, si, batch, s->in[0], &cs->tmp_src);
        if (src < 0)
            return src;
        cs->bias = src;
        return 0;
    }
    if (cs->tmp_src >= 0 && wk__cpu_as_layout(plan, si, batch, s->in[0], NULL, &cs->tmp_src) < 0)
        return SQ_UNSUPPORTED_MODEL;
    cpu_item_t it = {.prim = NULL, .step = si};
    wk__cpu_push_item(be, batch, &it);
    return 0;
}

static void run_pad(const wk_step_t *s, const wk_value_t *x, const wk_value_t *y, int batch,
                    const float *src, float *dst)
{
    int64_t xd[WK_MAX_DIMS], yd[WK_MAX_DIMS], idx[WK_MAX_DIMS] = {0}, xs[WK_MAX_DIMS];
    int n = wk_value_dims_at(x, batch, xd);
    wk_value_dims_at(y, batch, yd);
    int64_t acc = 1;
    for (int i = n - 1; i >= 0; i--) {
        xs[i] = acc;
        acc *= xd[i];
    }
    int64_t total = wk_value_elems_at(y, batch);
    for (int64_t o = 0; o < total; o++) {
        int64_t off = 0;
        bool outside = false;
        for (int i = 0; i < n; i++) {
            int64_t j = idx[i] - s->p.pad.begin[i];
            if (j < 0 || j >= xd[i]) {
                if (s->p.pad.mode == WK_PAD_CONSTANT) {
                    outside = true;
                    break;
                }
                if (s->p.pad.mode == WK_PAD_EDGE) {
                    j = j < 0 ? 0 : xd[i] - 1;
                } else {
                    while (j < 0 || j >= xd[i]) {
                        if (j < 0)
                            j = -j;
                        if (j >= xd[i])
                            j = 2 * (xd[i] - 1) - j;
                        if (xd[i] == 1)
                            j = 0;
                    }
                }
            }
            off += j * xs[i];
        }
        dst[o] = outside ? s->p.pad.value : src[off];
        for (int i = n - 1; i >= 0; i--) {
            if (++idx[i] < yd[i])
                break;
            idx[i] = 0;
        }
    }
}

static void run_slice(const wk_step_t *s, const wk_value_t *x, const wk_value_t *y, int batch,
                      const float *src, float *dst)
{
    int64_t xd[WK_MAX_DIMS], yd[WK_MAX_DIMS], idx[WK_MAX_DIMS] = {0}, xs[WK_MAX_DIMS];
    int n = wk_value_dims_at(x, batch, xd);
    wk_value_dims_at(y, batch, yd);
    if (n == 0) {
        dst[0] = src[0];
        return;
    }
    int64_t acc = 1;
    for (int i = n - 1; i >= 0; i--) {
        xs[i] = acc;
        acc *= xd[i];
    }
    int64_t rows = wk_value_elems_at(y, batch) / (yd[n - 1] ? yd[n - 1] : 1);
    int64_t inner = yd[n - 1], step_in = s->p.slice.step[n - 1];
    if (inner == 0)
        return;
    for (int64_t r = 0; r < rows; r++) {
        int64_t off = s->p.slice.start[n - 1] * xs[n - 1];
        for (int i = 0; i < n - 1; i++)
            off += (s->p.slice.start[i] + idx[i] * s->p.slice.step[i]) * xs[i];
        if (step_in == 1) {
            memcpy(dst, src + off, (size_t)inner * sizeof(float));
        } else {
            for (int64_t k = 0; k < inner; k++)
                dst[k] = src[off + k * step_in];
        }
        dst += inner;
        for (int i = n - 2; i >= 0; i--) {
            if (++idx[i] < yd[i])
                break;
            idx[i] = 0;
        }
    }
}

/* Layer normalization over the last axis on plain memory, with the scale
 * and shift (when the model has them) as oneDNN's separate [C] arguments. */
static int build_layernorm(wk_plan_t *plan, int si, int batch)
{
    cpu_be_t *be = plan->be;
    const wk_graph_t *g = plan->graph;
    const wk_step_t *s = &g->steps[si];
    cpu_step_t *cs = &be->steps[si];
    int rc = 0;
    dnnl_primitive_desc_t pd = NULL;
    bool affine = s->n_in == 3 && s->in[1] >= 0 && s->in[2] >= 0;
    if (be->phase == 1) {
        wk__cpu_set_out_plain(plan, s->out);
        int src = wk__cpu_as_plain(plan, si, batch, s->in[0], &cs->tmp_src);
        if (src < 0)
            return src;
        cs->bias = src;
    } else if (cs->tmp_src >= 0 &&
               wk__cpu_as_layout(plan, si, batch, s->in[0], NULL, &cs->tmp_src) < 0) {
        return SQ_UNSUPPORTED_MODEL;
    }
    dnnl_memory_desc_t md = wk__cpu_md_at(&be->bufs[cs->bias], batch);
    dnnl_layer_normalization_desc_t desc;
    DN(dnnl_layer_normalization_forward_desc_init(&desc, dnnl_forward_inference, &md, NULL,
                                                  s->p.epsilon,
                                                  affine ? dnnl_use_scale | dnnl_use_shift : 0));
    DN(dnnl_primitive_desc_create(&pd, &desc, be->sp_attr, be->engine, NULL));
    int kinds[4] = {DNNL_ARG_SRC, DNNL_ARG_DST, DNNL_ARG_SCALE, DNNL_ARG_SHIFT};
    int bufs[4] = {cs->bias, wk__cpu_vbuf(s->out), affine ? wk__cpu_vbuf(s->in[1]) : -1,
                   affine ? wk__cpu_vbuf(s->in[2]) : -1};
    rc = wk__cpu_emit(plan, pd, batch, si, kinds, bufs, affine ? 4 : 2);
    pd = NULL;
out:
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    return rc;
}

/* erf(x): oneDNN has no erf eltwise (only gelu_erf, the whole GELU), and
 * an exported model may use Erf on its own. */
static void run_erf(const wk_step_t *s, const wk_value_t *x, const wk_value_t *y, int batch,
                    const float *src, float *dst)
{
    (void)s;
    (void)x;
    int64_t n = wk_value_elems_at(y, batch);
    for (int64_t i = 0; i < n; i++)
        dst[i] = erff(src[i]);
}

/* Numpy broadcasting of x to y's shape (ViT's class token over the batch):
 * oneDNN broadcasts only a binary op's second source, so this is a copy by
 * hand, one innermost row at a time. */
static void run_expand(const wk_step_t *s, const wk_value_t *x, const wk_value_t *y, int batch,
                       const float *src, float *dst)
{
    (void)s;
    int64_t xd[WK_MAX_DIMS], yd[WK_MAX_DIMS], xs[WK_MAX_DIMS], idx[WK_MAX_DIMS] = {0};
    int n = wk_value_dims_at(y, batch, yd), shift = n - x->ndim;
    wk_value_dims_at(x, batch, xd);
    int64_t acc = 1;
    for (int i = n - 1; i >= 0; i--) {
        int xi = i - shift;
        int64_t d = xi >= 0 ? xd[xi] : 1;
        xs[i] = d == 1 ? 0 : acc;
        acc *= d;
    }
    if (n == 0) {
        dst[0] = src[0];
        return;
    }
    int64_t inner = yd[n - 1];
    if (inner == 0)
        return;
    int64_t rows = wk_value_elems_at(y, batch) / inner;
    for (int64_t r = 0; r < rows; r++) {
        int64_t off = 0;
        for (int i = 0; i < n - 1; i++)
            off += idx[i] * xs[i];
        for (int64_t k = 0; k < inner; k++)
            dst[k] = src[off + k * xs[n - 1]];
        dst += inner;
        for (int i = n - 2; i >= 0; i--) {
            if (++idx[i] < yd[i])
                break;
            idx[i] = 0;
        }
    }
}

/* One entry per kernel kind (wk_kernel_t, names in wk_kernel_names). A new
 * kind fails the asserts until it has its entry here. */
const wk_cpu_op_t wk__cpu_ops[] = {
    [WK_K_CONV] = {.build = build_conv},
    [WK_K_MAXPOOL] = {.build = build_pool},
    [WK_K_AVGPOOL] = {.build = build_pool},
    [WK_K_GLOBALAVG] = {.build = build_pool},
    [WK_K_ELTWISE] = {.build = build_eltwise},
    [WK_K_BINARY] = {.build = build_binary},
    [WK_K_BATCHNORM] = {.build = build_binary},
    [WK_K_CONCAT] = {.build = build_concat},
    [WK_K_SOFTMAX] = {.build = build_softmax},
    [WK_K_GEMM] = {.build = build_gemm},
    [WK_K_MATMUL] = {.build = build_matmul},
    [WK_K_REDUCE_MEAN] = {.build = build_reduce},
    [WK_K_COPY] = {.build = build_copy},
    [WK_K_TRANSPOSE] = {.build = build_transpose},
    [WK_K_PAD] = {.build = build_c_kernel, .run_c = run_pad},
    [WK_K_SLICE] = {.build = build_c_kernel, .run_c = run_slice},
    [WK_K_ERF] = {.build = build_c_kernel, .run_c = run_erf},
    [WK_K_EXPAND] = {.build = build_c_kernel, .run_c = run_expand},
    [WK_K_LAYERNORM] = {.build = build_layernorm},
};
_Static_assert(sizeof(wk__cpu_ops) / sizeof(wk__cpu_ops[0]) == WK_K_COUNT_,
               "a kernel kind without a cpu op");
_Static_assert(WK_K_COUNT_ == 19, "a new kernel kind: give it its entry in wk__cpu_ops");
