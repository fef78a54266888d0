/* The cpu backend's convolutions and pooling (backend_cpu_int.h): the
 * conv builder with its Winograd choice, its per-batch-size weights, its
 * fused post-ops (a residual sum, activations, a depthwise conv), and the
 * pooling builder. Whether a depthwise conv is fused at all is decided in
 * backend_cpu_dwfuse.c, on the helpers here. */
#include "backend_cpu_int.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

dnnl_status_t wk__cpu_conv_pd(dnnl_primitive_desc_t *pd, const wk_step_t *s, bool wino,
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
bool wk__cpu_pd_fast(dnnl_status_t st, const dnnl_primitive_desc_t *p)
{
    return st == dnnl_success && *p != NULL && !wk__cpu_impl_is_ref(*p);
}

static int conv_dw_index(const wk_step_t *s)
{
    for (int i = 0; i < s->n_post; i++)
        if (s->post[i].kind == WK_POST_DW)
            return i;
    return -1;
}

/* Whether value v is written by a conv with a fused depthwise conv. */
bool wk__cpu_written_fused(const wk_graph_t *g, int v)
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
void wk__cpu_dw_mid_md(dnnl_memory_desc_t *md, int64_t n, const wk_value_t *x, const wk_value_t *y)
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
dnnl_status_t wk__cpu_conv_post_ops(dnnl_post_ops_t po, const wk_step_t *s)
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
    dnnl_format_tag_t tag =
        wk__cpu_written_fused(plan->graph, s->in[0]) ? wk__cpu_dw_block() : dnnl_acdb;
    dnnl_memory_desc_t sm, dm;
    if (!in->decided || conv_dw_index(s) >= 0 ||
        dnnl_memory_desc_init_by_tag(&sm, src->ndims, src->dims, dnnl_f32, tag) != dnnl_success ||
        !dnnl_memory_desc_equal(&in->md, &sm) ||
        dnnl_memory_desc_equal(dnnl_primitive_desc_query_md(*pd, dnnl_query_src_md, 0), &sm) ||
        dnnl_memory_desc_init_by_tag(&dm, dst->ndims, dst->dims, dnnl_f32, tag) != dnnl_success)
        return;
    dnnl_primitive_desc_t p = NULL;
    if (wk__cpu_pd_fast(wk__cpu_conv_pd(&p, s, false, &sm, wei, bias, &dm, attr, be->engine), &p)) {
        dnnl_primitive_desc_destroy(*pd);
        *pd = p;
        return;
    }
    if (p != NULL)
        dnnl_primitive_desc_destroy(p);
}

/* Whether the Winograd conv just made (pd) costs more in reorders than it
 * saves: its input is already in another layout (channels last, what the
 * 1x1 convs ahead of it chose; Winograd takes only channel blocks), its
 * output then takes blocks that its consumers may read back, and the
 * conv's work per channel reordered, 9 ic oc / (ic + oc) multiply-adds a
 * pixel, is small. In densenet121 every 3x3 conv (128 channels in, 32
 * out: 230) sits between channels-last 1x1 convs and concats: 147
 * reorders took 77 of its 470 ms at batch 8 on an AVX-512 guest, and the
 * direct conv in channels last ran the net 5-12% faster. resnet18 (64 in
 * and out: 288, and blocked from its first 3x3 on) ran 26% slower without
 * Winograd, googlenet (from 96 in, 128 out: 494) 12% (bench/RESULTS.md).
 * SQUISH_CPU_WINO=reorder keeps Winograd regardless (for comparison). */
#define WINO_MIN_FLOPS_PER_REORDERED 256.0
static bool wino_would_reorder(wk_plan_t *plan, const wk_step_t *s, const_dnnl_primitive_desc_t pd)
{
    const char *e = getenv("SQUISH_CPU_WINO");
    bool always = e != NULL && strcmp(e, "reorder") == 0;
    const cpu_be_t *be = plan->be;
    const wk_graph_t *g = plan->graph;
    const cpu_buf_t *in = &be->bufs[wk__cpu_vbuf(s->in[0])];
    if (always || !in->decided ||
        dnnl_memory_desc_equal(&in->md, dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0)))
        return false;
    double ic = (double)g->values[s->in[0]].dims[1], oc = (double)g->values[s->out].dims[1];
    return 9.0 * ic * oc / (ic + oc) < WINO_MIN_FLOPS_PER_REORDERED;
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
                    wk__cpu_pd_fast(
                        wk__cpu_conv_pd(&p, s, wino, &sb, q_wei, bias, &db, attr, be->engine), &p);
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
        if (wk__cpu_pd_fast(wk__cpu_conv_pd(&p, s, wino, &sb, wei_any, bias, &db, attr, be->engine),
                            &p)) {
            w = dnnl_primitive_desc_query_md(p, dnnl_query_weights_md, 0);
        } else if (cs->wino && !want_wino) {
            if (p != NULL)
                dnnl_primitive_desc_destroy(p);
            p = NULL;
            wino = true;
            if (wk__cpu_pd_fast(
                    wk__cpu_conv_pd(&p, s, true, &sb, q_wei, bias, &db, attr, be->engine), &p))
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

/* A residual that dies at conv si and has its output's layout (dst)
 * lends its buffer: the conv sums into it in place (phase 1). */
void wk__cpu_conv_sum_in_place(wk_plan_t *plan, int si, const dnnl_memory_desc_t *dst)
{
    cpu_be_t *be = plan->be;
    const wk_graph_t *g = plan->graph;
    const wk_step_t *s = &g->steps[si];
    for (int i = 0; i < s->n_post; i++) {
        if (s->post[i].kind != WK_POST_ADD)
            continue;
        int r = wk__cpu_vbuf(s->post[i].value), root = wk__cpu_root_buf(be, r);
        cpu_buf_t *rb = &be->bufs[r], *ob = &be->bufs[wk__cpu_vbuf(s->out)];
        if (rb->first < 0 || g->values[s->post[i].value].is_output ||
            g->values[s->post[i].value].is_input || be->bufs[root].last != si || rb->last != si ||
            ob->alias >= 0 || wk__cpu_root_buf(be, wk__cpu_vbuf(s->in[0])) == root ||
            !dnnl_memory_desc_equal(&rb->md, dst))
            continue;
        ob->alias = r;
        if (be->bufs[root].last < ob->last)
            be->bufs[root].last = ob->last;
        be->steps[si].inplace = true;
    }
}

/* A residual add of conv si not summed in place: the other addend is
 * copied into its output first, and the conv sums (phase 2, at batch). */
int wk__cpu_conv_residual_first(wk_plan_t *plan, int si, int batch)
{
    const cpu_be_t *be = plan->be;
    const wk_step_t *s = &plan->graph->steps[si];
    int rc = 0;
    for (int i = 0; i < s->n_post && !be->steps[si].inplace && rc == 0; i++)
        if (s->post[i].kind == WK_POST_ADD)
            rc = wk__cpu_emit_reorder(plan, batch, si, wk__cpu_vbuf(s->post[i].value),
                                      wk__cpu_vbuf(s->out));
    return rc;
}

int wk__cpu_build_conv(wk_plan_t *plan, int si, int batch)
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
            wk__cpu_dw_mid_md(&dst_md, src_md.dims[0], x, y);
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
    DN(wk__cpu_conv_post_ops(po, s));
    DN(dnnl_primitive_attr_set_post_ops(attr, po));
    if (!decided) {
        /* Winograd where it can run and pays, else direct. */
        cs->wino =
            x->batched && g->max_batch >= WINO_MIN_BATCH && wino_eligible(s, y) &&
            wk__cpu_pd_fast(wk__cpu_conv_pd(&pd, s, true, &src_md, &wei_md,
                                            has_bias ? &bias_md : NULL, &dst_md, attr, be->engine),
                            &pd);
        if (cs->wino && wino_would_reorder(plan, s, pd))
            cs->wino = false;
        if (!cs->wino && pd != NULL) {
            dnnl_primitive_desc_destroy(pd);
            pd = NULL;
        }
    }
    if (pd == NULL) {
        bool wino = cs->wino_at != NULL ? cs->wino_at[batch] : cs->wino;
        DN(wk__cpu_conv_pd(&pd, s, wino, &src_md, &wei_md, has_bias ? &bias_md : NULL, &dst_md,
                           attr, be->engine));
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
        wk__cpu_conv_sum_in_place(plan, si, q_dst);
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
    if ((rc = wk__cpu_conv_residual_first(plan, si, batch)) != 0)
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

/* A pooling's or a resampling's output: in the planning phase any layout
 * (the primitive picks the input's when it can), then the one it took. */
static dnnl_memory_desc_t window_dst_md(wk_plan_t *plan, const wk_step_t *s, const wk_value_t *y,
                                        int batch)
{
    cpu_be_t *be = plan->be;
    dnnl_memory_desc_t md;
    if (be->phase != 1)
        return wk__cpu_md_at(&be->bufs[wk__cpu_vbuf(s->out)], batch);
    dnnl_dims_t d;
    for (int i = 0; i < y->ndim; i++)
        d[i] = y->dims[i];
    dnnl_memory_desc_init_by_tag(&md, y->ndim, d, dnnl_f32, dnnl_format_tag_any);
    return md;
}

/* Emits a one-input primitive (src to dst) of step si; in the planning
 * phase its output takes the primitive's layout first, plain when the
 * batch would not stay outermost. Takes pd. */
static int emit_src_dst(wk_plan_t *plan, dnnl_primitive_desc_t pd, int batch, int si,
                        const wk_step_t *s, const wk_value_t *y)
{
    cpu_be_t *be = plan->be;
    if (be->phase == 1) {
        wk__cpu_set_out_md(plan, s->out, dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0));
        if (y->batched && !wk__cpu_batch_outermost(&be->bufs[wk__cpu_vbuf(s->out)].md))
            wk__cpu_set_out_plain(plan, s->out);
    }
    return wk__cpu_emit(plan, pd, batch, si, (int[]){DNNL_ARG_SRC, DNNL_ARG_DST},
                        (int[]){wk__cpu_vbuf(s->in[0]), wk__cpu_vbuf(s->out)}, 2);
}

int wk__cpu_build_pool(wk_plan_t *plan, int si, int batch)
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
    dnnl_memory_desc_t src_md = wk__cpu_md_at(&be->bufs[wk__cpu_vbuf(s->in[0])], batch),
                       dst_md = window_dst_md(plan, s, y, batch);
    dnnl_pooling_v2_desc_t desc;
    DN(dnnl_pooling_v2_forward_desc_init(&desc, dnnl_forward_inference, alg, &src_md, &dst_md,
                                         strides, kernel, dil, pl, pr));
    DN(dnnl_primitive_desc_create(&pd, &desc, be->sp_attr, be->engine, NULL));
    rc = emit_src_dst(plan, pd, batch, si, s, y);
    pd = NULL;
out:
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    return rc;
}

/* ConvTranspose: oneDNN's deconvolution with ONNX's weights W [IC, OC, kh,
 * kw] (oneDNN's iohw) reordered once into the layout it picks at max batch,
 * on plain sources and outputs (whose layout holds at every batch). */
int wk__cpu_build_deconv(wk_plan_t *plan, int si, int batch)
{
    cpu_be_t *be = plan->be;
    const wk_graph_t *g = plan->graph;
    const wk_step_t *s = &g->steps[si];
    cpu_step_t *cs = &be->steps[si];
    const wk_value_t *x = &g->values[s->in[0]], *w = &g->values[s->in[1]], *y = &g->values[s->out];
    int rc = 0, nsp = s->p.conv.n_spatial;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_memory_desc_t src_md, wei_md, bias_md, dst_md;
    dnnl_dims_t strides, pl, pr, wd, bd = {y->dims[1]};
    bool has_bias = s->n_in > 2 && s->in[2] >= 0;
    if (nsp < 1 || nsp > WK_MAX_SPATIAL || s->p.conv.groups != 1)
        return wk_fail(plan, SQ_UNSUPPORTED_MODEL, "deconv step %d: %d spatial dims, groups %lld",
                       si, nsp, (long long)s->p.conv.groups);
    wd[0] = y->dims[1];
    wd[1] = x->dims[1];
    for (int i = 0; i < nsp; i++) {
        strides[i] = s->p.conv.stride[i];
        pl[i] = s->p.conv.pad_begin[i];
        pr[i] = s->p.conv.pad_end[i];
        wd[2 + i] = w->dims[2 + i];
    }
    if (be->phase == 1) {
        wk__cpu_set_out_plain(plan, s->out);
        int src = wk__cpu_as_plain(plan, si, batch, s->in[0], &cs->tmp_src);
        if (src < 0)
            return src;
        dnnl_memory_desc_init_by_tag(&wei_md, 2 + nsp, wd, dnnl_f32, dnnl_format_tag_any);
    } else {
        if (cs->tmp_src >= 0 &&
            wk__cpu_as_layout(plan, si, batch, s->in[0], NULL, &cs->tmp_src) < 0)
            return SQ_UNSUPPORTED_MODEL;
        wei_md = be->bufs[cs->weights].md;
    }
    int src = cs->tmp_src >= 0 ? cs->tmp_src : wk__cpu_vbuf(s->in[0]);
    src_md = wk__cpu_md_at(&be->bufs[src], batch);
    dst_md = wk__cpu_md_at(&be->bufs[wk__cpu_vbuf(s->out)], batch);
    dnnl_memory_desc_init_by_tag(&bias_md, 1, bd, dnnl_f32, dnnl_a);
    dnnl_deconvolution_desc_t desc;
    DN(dnnl_deconvolution_forward_desc_init(&desc, dnnl_forward_inference,
                                            dnnl_deconvolution_direct, &src_md, &wei_md,
                                            has_bias ? &bias_md : NULL, &dst_md, strides, pl, pr));
    DN(dnnl_primitive_desc_create(&pd, &desc, be->sp_attr, be->engine, NULL));
    if (be->phase == 1) {
        dnnl_memory_desc_t wuser;
        DN(dnnl_memory_desc_init_by_tag(&wuser, 2 + nsp, wd, dnnl_f32,
                                        nsp == 1   ? dnnl_bac
                                        : nsp == 2 ? dnnl_bacd
                                                   : dnnl_bacde));
        cs->weights = wk__cpu_const_reorder(
            plan, &wuser, w->data, dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0));
        rc = cs->weights < 0 ? cs->weights : 0;
        goto out;
    }
    int kinds[4] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_BIAS};
    int bufs[4] = {src, cs->weights, wk__cpu_vbuf(s->out), has_bias ? wk__cpu_vbuf(s->in[2]) : -1};
    rc = wk__cpu_emit(plan, pd, batch, si, kinds, bufs, has_bias ? 4 : 3);
    pd = NULL;
out:
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    return rc;
}

/* oneDNN's resampling computes bilinear taps at (o + 0.5) in / out - 0.5,
 * clamped to the map, and nearest pixels from that coordinate: ONNX's
 * linear with half_pixel (pytorch_half_pixel: unless an axis ends at one
 * pixel) where the scale is out / in, and, where the output is a whole
 * multiple k of the input, nearest with the roundings that then all take
 * pixel o / k (no coordinate falls on a tie). Anything else runs the C
 * kernel. */
static dnnl_alg_kind_t resize_alg(const wk_step_t *s, const wk_value_t *x, const wk_value_t *y)
{
    bool half = s->p.resize.coord == WK_RESIZE_HALF_PIXEL ||
                s->p.resize.coord == WK_RESIZE_PYTORCH_HALF_PIXEL;
    bool round = s->p.resize.nearest == WK_NEAREST_ROUND_PREFER_FLOOR ||
                 s->p.resize.nearest == WK_NEAREST_ROUND_PREFER_CEIL;
    if (s->p.resize.cubic)
        return dnnl_alg_kind_undef; /* oneDNN's resampling has no bicubic */
    for (int i = 0; i < 2; i++) {
        int64_t in = x->dims[2 + i], out = y->dims[2 + i];
        if (s->p.resize.scale[i] != (float)out / (float)in || out < 2)
            return dnnl_alg_kind_undef;
        if (s->p.resize.linear) {
            if (!half)
                return dnnl_alg_kind_undef;
        } else if (out % in != 0 ||
                   !((half && round) || (s->p.resize.coord == WK_RESIZE_ASYMMETRIC &&
                                         s->p.resize.nearest == WK_NEAREST_FLOOR))) {
            return dnnl_alg_kind_undef;
        }
    }
    return s->p.resize.linear ? dnnl_resampling_linear : dnnl_resampling_nearest;
}

int wk__cpu_build_resize(wk_plan_t *plan, int si, int batch)
{
    cpu_be_t *be = plan->be;
    const wk_graph_t *g = plan->graph;
    const wk_step_t *s = &g->steps[si];
    const wk_value_t *x = &g->values[s->in[0]], *y = &g->values[s->out];
    dnnl_alg_kind_t alg = resize_alg(s, x, y);
    if (alg == dnnl_alg_kind_undef)
        return wk__cpu_build_c_kernel(plan, si, batch);
    int rc = 0;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_memory_desc_t src_md = wk__cpu_md_at(&be->bufs[wk__cpu_vbuf(s->in[0])], batch),
                       dst_md = window_dst_md(plan, s, y, batch);
    dnnl_resampling_desc_t desc;
    DN(dnnl_resampling_forward_desc_init(&desc, dnnl_forward_inference, alg, NULL, &src_md,
                                         &dst_md));
    DN(dnnl_primitive_desc_create(&pd, &desc, be->sp_attr, be->engine, NULL));
    rc = emit_src_dst(plan, pd, batch, si, s, y);
    pd = NULL;
out:
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    return rc;
}
