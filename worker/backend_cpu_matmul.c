/* The cpu backend's matrix products (backend_cpu_int.h): Gemm (with
 * transposes, alpha, beta and C) and MatMul with numpy semantics, both on
 * oneDNN's matmul. */
#include "backend_cpu_int.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void strided_md(dnnl_memory_desc_t *md, int64_t rows, int64_t cols, bool transposed)
{
    dnnl_dims_t d = {rows, cols};
    dnnl_dims_t st = {transposed ? 1 : cols, transposed ? rows : 1};
    dnnl_memory_desc_init_by_strides(md, 2, d, dnnl_f32, st);
}

/* Gemm: Y = alpha * A' B' + beta * C, A' = A or A^T, B' = B or B^T. */
int wk__cpu_build_gemm(wk_plan_t *plan, int si, int batch)
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
    /* What is constant, from the graph in phase 1; in phase 2 from what
     * phase 1 made of it (a size made at its first run comes after
     * release_unused_constants gave the graph's copies back): a computed
     * B is a view of its buffer, a computed C the post-op's `extra`. */
    bool b_const = be->phase == 1 ? bv->data != NULL : be->bufs[cs->weights].alias < 0;
    bool c_const = cv == NULL || (be->phase == 1 ? cv->data != NULL : cs->extra < 0);
    bool scale_out = alpha != 1.0f && !b_const;
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
        cmd = wk__cpu_plain_ranked(cv, 1, 2);
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
            dnnl_memory_desc_t r = wk__cpu_plain_ranked(cv, 1, 2);
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
int wk__cpu_build_matmul(wk_plan_t *plan, int si, int batch)
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
            cs->tmp_src = wk__cpu_plain_view(be, sa, 2, a2, a_b, mult);
            cs->weights = wk__cpu_plain_view(be, sb, 2, b2, false, 1);
            cs->extra = wk__cpu_plain_view(be, wk__cpu_vbuf(s->out), 2, y2, y_b, mult);
        } else {
            cs->tmp_src = wk__cpu_plain_view(be, sa, r, ad, a_b, 1);
            cs->weights = wk__cpu_plain_view(be, sb, r, bd, b_b, 1);
            cs->extra = wk__cpu_plain_view(be, wk__cpu_vbuf(s->out), r, yd, y_b, 1);
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
