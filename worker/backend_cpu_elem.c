/* The cpu backend's elementwise ops (backend_cpu_int.h): activations
 * (oneDNN's eltwise) and binary ops with numpy broadcasting (batchnorm is
 * one with a shift post-op), with the layouts their jit kernels take. */
#include "backend_cpu_int.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int wk__cpu_build_eltwise(wk_plan_t *plan, int si, int batch)
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
 * AVX-512; and a standalone BatchNorm, a multiply by its scale with its
 * shift as a post-op: densenet121 took 1.6 s at batch 1 on an AVX2 guest,
 * 0.15 s read channels last). If so, *cl is set to the channels-last layout
 * to read it in instead. */
static bool binary_blocked_ref(wk_plan_t *plan, const wk_step_t *s, wk_binop_t op, int src0,
                               const wk_value_t *bv, const wk_value_t *y, dnnl_memory_desc_t *cl)
{
    cpu_be_t *be = plan->be;
    const dnnl_memory_desc_t *md0 = &be->bufs[src0].md;
    if (md0->format_kind != dnnl_blocked || md0->format_desc.blocking.inner_nblks == 0 ||
        y->ndim != 4 || (s->kind != WK_K_BINARY && s->kind != WK_K_BATCHNORM))
        return false;
    dnnl_memory_desc_t md1 = wk__cpu_plain_ranked(bv, plan->graph->max_batch, y->ndim);
    dnnl_binary_desc_t desc;
    dnnl_primitive_desc_t pd = NULL;
    bool ref =
        dnnl_binary_desc_init(&desc, wk__cpu_bin_alg(op), md0, &md1, md0) == dnnl_success &&
        dnnl_primitive_desc_create(&pd, &desc, be->sp_attr, be->engine, NULL) == dnnl_success &&
        wk__cpu_impl_is_ref(pd);
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
        !wk__cpu_impl_is_ref(pd);
    if (pd != NULL)
        dnnl_primitive_desc_destroy(pd);
    return fast;
}

int wk__cpu_build_binary(wk_plan_t *plan, int si, int batch)
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
    if (s->kind == WK_K_BATCHNORM && wk__cpu_norm_by_concat(plan, si))
        return 0;
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
            dnnl_memory_desc_t r = wk__cpu_plain_ranked(bv, g->max_batch, y->ndim);
            cs->bias = wk__cpu_view_buf(be, src, &r, bv->batched);
        }
        if (s->kind == WK_K_BATCHNORM) {
            dnnl_memory_desc_t r = wk__cpu_plain_ranked(&g->values[s->in[2]], 1, y->ndim);
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
    if (s->kind == WK_K_BATCHNORM) {
        DN(dnnl_post_ops_append_binary(po, dnnl_binary_add, &be->bufs[cs->extra].md));
        /* its activations (wk__cpu_norm_act), after the shift */
        for (int i = 0; i < s->n_post; i++)
            wk__cpu_append_act(po, s->post[i].act);
    }
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
