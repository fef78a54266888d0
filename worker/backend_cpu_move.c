/* The cpu backend's data movement (backend_cpu_int.h): concatenation,
 * reshapes (a copy into a view of the output) and transposes (a reorder
 * from a strided view). */
#include "backend_cpu_int.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The layouts a concat's inputs are matched against, by rank (3 to 5):
 * plain, channels last, oneDNN's 8- and 16-channel blocks. */
enum { TAG_PLAIN, TAG_CHANNELS_LAST, N_CAT_TAGS = 4 };
static bool concat_tags(int ndim, dnnl_format_tag_t *tags)
{
    static const dnnl_format_tag_t by_rank[3][N_CAT_TAGS] = {
        {dnnl_abc, dnnl_acb, dnnl_aBc8b, dnnl_aBc16b},
        {dnnl_abcd, dnnl_acdb, dnnl_aBcd8b, dnnl_aBcd16b},
        {dnnl_abcde, dnnl_acdeb, dnnl_aBcde8b, dnnl_aBcde16b},
    };
    if (ndim < 3 || ndim > 5)
        return false;
    memcpy(tags, by_rank[ndim - 3], sizeof(by_rank[0]));
    return true;
}

/* The layout of tags that md has, or -1. */
static int tag_of(const dnnl_memory_desc_t *md, const dnnl_format_tag_t *tags)
{
    for (int k = 0; k < N_CAT_TAGS; k++) {
        dnnl_memory_desc_t t;
        if (dnnl_memory_desc_init_by_tag(&t, md->ndims, md->dims, dnnl_f32, tags[k]) ==
                dnnl_success &&
            dnnl_memory_desc_equal(&t, md))
            return k;
    }
    return -1;
}

/* Phase 1: one layout for the concat's inputs and output, so that oneDNN
 * runs its simple (jit) concat. Given inputs of mixed layouts, oneDNN 2.6
 * runs its reference concat, which copies element by element: densenet121's
 * 58 concats of plain, channels-last and 8-channel-blocked inputs. The
 * layout that most of the inputs' bytes have, else channels last, else
 * plain: the first whose concat is not the reference one. Inputs in
 * another layout are reordered into it first (cs->cat_tmp). Returns false,
 * the inputs left as they are, where no layout of the list makes it fast. */
static bool concat_one_layout(wk_plan_t *plan, int si, dnnl_memory_desc_t *mds)
{
    cpu_be_t *be = plan->be;
    const wk_step_t *s = &plan->graph->steps[si];
    const wk_value_t *y = &plan->graph->values[s->out];
    dnnl_format_tag_t tags[N_CAT_TAGS];
    if (!concat_tags(y->ndim, tags))
        return false;
    size_t bytes[N_CAT_TAGS] = {0};
    int most = TAG_CHANNELS_LAST;
    for (int i = 0; i < s->n_in; i++) {
        int k = tag_of(&mds[i], tags);
        if (k >= 0 && (bytes[k] += dnnl_memory_desc_get_size(&mds[i])) > bytes[most])
            most = k;
    }
    int order[3] = {most, TAG_CHANNELS_LAST, TAG_PLAIN};
    dnnl_memory_desc_t *want = sq_xmalloc((size_t)s->n_in * sizeof(*want)), dst;
    bool found = false;
    for (int o = 0; o < 3 && !found; o++) {
        int k = order[o];
        bool ok = true;
        for (int i = 0; i < s->n_in && ok; i++)
            ok = dnnl_memory_desc_init_by_tag(&want[i], mds[i].ndims, mds[i].dims, dnnl_f32,
                                              tags[k]) == dnnl_success;
        dnnl_dims_t d;
        for (int i = 0; i < y->ndim; i++)
            d[i] = y->dims[i];
        dnnl_primitive_desc_t pd = NULL;
        ok =
            ok && dnnl_memory_desc_init_by_tag(&dst, y->ndim, d, dnnl_f32, tags[k]) == dnnl_success;
        ok = ok && dnnl_concat_primitive_desc_create(&pd, &dst, s->n_in, s->p.axis, want,
                                                     be->sp_attr, be->engine) == dnnl_success;
        found = ok && !wk__cpu_impl_is_ref(pd);
        if (pd != NULL)
            dnnl_primitive_desc_destroy(pd);
    }
    if (found) {
        cpu_step_t *cs = &be->steps[si];
        cs->cat_tmp = sq_xmalloc((size_t)s->n_in * sizeof(*cs->cat_tmp));
        for (int i = 0; i < s->n_in; i++) {
            cs->cat_tmp[i] = -1;
            wk__cpu_as_layout(plan, si, plan->graph->max_batch, s->in[i], &want[i],
                              &cs->cat_tmp[i]);
        }
        wk__cpu_set_out_md(plan, s->out, &dst);
    }
    free(want);
    return found;
}

int wk__cpu_build_concat(wk_plan_t *plan, int si, int batch)
{
    cpu_be_t *be = plan->be;
    const wk_graph_t *g = plan->graph;
    const wk_step_t *s = &g->steps[si];
    cpu_step_t *cs = &be->steps[si];
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
    if (be->phase == 1 && !concat_one_layout(plan, si, mds)) {
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
    for (int i = 0; i < s->n_in; i++) {
        bufs[i] = wk__cpu_vbuf(s->in[i]);
        if (cs->cat_tmp != NULL && cs->cat_tmp[i] >= 0) {
            /* phase 2 queues the reorder into the copy (phase 1 made it) */
            if (be->phase == 2 &&
                wk__cpu_as_layout(plan, si, batch, s->in[i], NULL, &cs->cat_tmp[i]) < 0) {
                rc = SQ_UNSUPPORTED_MODEL;
                goto out;
            }
            bufs[i] = cs->cat_tmp[i];
            mds[i] = wk__cpu_md_at(&be->bufs[bufs[i]], batch);
        }
        kinds[i] = DNNL_ARG_MULTIPLE_SRC + i;
    }
    dst = wk__cpu_md_at(&be->bufs[wk__cpu_vbuf(s->out)], batch);
    DN(dnnl_concat_primitive_desc_create(&pd, &dst, s->n_in, s->p.axis, mds, be->sp_attr,
                                         be->engine));
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
