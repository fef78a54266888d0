/* The cpu backend's data movement (backend_cpu_int.h): concatenation,
 * reshapes (a copy into a view of the output) and transposes (a reorder
 * from a strided view). */
#include "backend_cpu_int.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int wk__cpu_build_concat(wk_plan_t *plan, int si, int batch)
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

/* Reshape and friends: the input in plain order, written to the output's
 * bytes (a view of the output with the input's dims). */
int wk__cpu_build_copy(wk_plan_t *plan, int si, int batch)
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
        cs->extra = wk__cpu_plain_view(be, wk__cpu_vbuf(s->out), x->ndim, x->dims, x->batched, 1);
        return 0;
    }
    return wk__cpu_emit_reorder(plan, batch, si, wk__cpu_vbuf(s->in[0]), cs->extra);
}

int wk__cpu_build_transpose(wk_plan_t *plan, int si, int batch)
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
