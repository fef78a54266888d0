/* The cpu backend's normalizations and reductions (backend_cpu_int.h):
 * softmax, mean over axes, layer normalization, on plain memory. */
#include "backend_cpu_int.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int wk__cpu_build_softmax(wk_plan_t *plan, int si, int batch)
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
            cs->bias = wk__cpu_plain_view(be, src, 2, d2, x->batched, mult);
            cs->extra = wk__cpu_plain_view(be, wk__cpu_vbuf(s->out), 2, d2, x->batched, mult);
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

int wk__cpu_build_reduce(wk_plan_t *plan, int si, int batch)
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
        cs->extra = wk__cpu_plain_view(be, wk__cpu_vbuf(s->out), x->ndim, kd, x->batched, 1);
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

/* Layer normalization over the last axis on plain memory, with the scale
 * and shift (when the model has them) as oneDNN's separate [C] arguments. */
int wk__cpu_build_layernorm(wk_plan_t *plan, int si, int batch)
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
