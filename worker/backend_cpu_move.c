/* The cpu backend's data movement (backend_cpu_int.h): concatenation,
 * reshapes (a copy into a view of the output) and transposes (a reorder
 * from a strided view). */
#include "backend_cpu_int.h"
#include "wk_omp.h"
#if defined(__x86_64__)
#include "backend_cpu_avx2.h"
#endif

#include <omp.h>
#include <stdatomic.h>
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

/* ---- A concat and the BatchNorm after it, in one pass ----------------------
 *
 * densenet's layers each concatenate every earlier layer's output and
 * normalize the result (BatchNorm, ReLU) before their 1x1 conv: the concat
 * wrote the whole tensor and the BatchNorm read it and wrote it again,
 * two passes over up to 1024 channels per layer (densenet121 at batch 8:
 * 58 concats, about 12% of a run, and as much again in the BatchNorms).
 * Where the concat's output has no other use, the concat writes the
 * normalized, activated values straight away and the BatchNorm's output
 * is the concat's buffer. In the concat's one layout (concat_one_layout):
 * plain, channels last, or channel blocks that no input splits.
 * SQUISH_CPU_CONCAT_NORM=off: the two steps apart (for comparisons). */
struct cpu_catnorm {
    float *scale, *shift; /* [C] */
    wk_act_t act[WK_MAX_POST];
    int n_act;
    int blk;          /* 1: plain or channels last; 8 or 16: channel blocks */
    bool avx2;        /* the CPU has AVX2 and FMA */
    bool last;        /* channels last */
    int64_t *off;     /* [n_in + 1]: each input's first channel, then C */
    const float **in; /* [n_in]: the inputs' bytes, at each run */
};

void wk__cpu_catnorm_free(cpu_step_t *cs)
{
    if (cs->catn == NULL)
        return;
    free(cs->catn->scale);
    free(cs->catn->shift);
    free(cs->catn->off);
    free(cs->catn->in);
    free(cs->catn);
    cs->catn = NULL;
}

/* The BatchNorm step that concat si can apply, or -1: the concat's output
 * (4-D, along channels) has that step as its only use, and the BatchNorm's
 * scale and shift are constants, its post-ops the activations a BatchNorm
 * takes (wk__cpu_norm_act: those the kernel below applies). */
static int catnorm_step(const wk_graph_t *g, int si)
{
    const wk_step_t *s = &g->steps[si];
    const wk_value_t *y = &g->values[s->out];
    if (y->ndim != 4 || s->p.axis != 1 || y->n_uses != 1 || y->is_output || y->is_input)
        return -1;
    for (int i = 0; i < s->n_in; i++)
        if (g->values[s->in[i]].data != NULL || g->values[s->in[i]].ndim != 4)
            return -1;
    for (int k = si + 1; k < g->n_steps; k++) {
        const wk_step_t *b = &g->steps[k];
        if (b->n_in < 1 || b->in[0] != s->out)
            continue;
        if (b->kind != WK_K_BATCHNORM || b->n_in < 3 || g->values[b->out].is_output)
            return -1;
        const wk_value_t *sc = &g->values[b->in[1]], *sh = &g->values[b->in[2]];
        if (sc->data == NULL || sh->data == NULL || wk_value_elems(sc) != y->dims[1] ||
            wk_value_elems(sh) != y->dims[1])
            return -1;
        for (int i = 0; i < b->n_post; i++)
            if (b->post[i].kind != WK_POST_ACT || !wk__cpu_norm_act(b->post[i].act.kind))
                return -1;
        return k;
    }
    return -1;
}

/* Phase 1, after concat_one_layout put the inputs and output in one layout
 * (tag k of concat_tags): concat si takes the BatchNorm after it where that
 * layout suits. */
static void catnorm_take(wk_plan_t *plan, int si, int k)
{
    cpu_be_t *be = plan->be;
    const wk_graph_t *g = plan->graph;
    const wk_step_t *s = &g->steps[si];
    const char *e = getenv("SQUISH_CPU_CONCAT_NORM");
    int bi = catnorm_step(g, si);
    if (bi < 0 || k < 0 || (e != NULL && strcmp(e, "off") == 0))
        return;
    int blk = k == 2 ? 8 : k == 3 ? 16 : 1;
    for (int i = 0; i < s->n_in; i++)
        if (g->values[s->in[i]].dims[1] % blk != 0)
            return;
    const wk_step_t *b = &g->steps[bi];
    int yb = wk__cpu_vbuf(s->out), bb = wk__cpu_vbuf(b->out);
    cpu_buf_t *ob = &be->bufs[bb];
    if (ob->alias >= 0 || ob->decided)
        return;
    int64_t c = g->values[s->out].dims[1];
    struct cpu_catnorm *cn = sq_xcalloc(1, sizeof(*cn));
    cn->scale = sq_xmalloc((size_t)c * sizeof(float));
    cn->shift = sq_xmalloc((size_t)c * sizeof(float));
    memcpy(cn->scale, g->values[b->in[1]].data, (size_t)c * sizeof(float));
    memcpy(cn->shift, g->values[b->in[2]].data, (size_t)c * sizeof(float));
    for (int i = 0; i < b->n_post; i++)
        cn->act[cn->n_act++] = b->post[i].act;
    cn->blk = blk;
#if defined(__x86_64__)
    cn->avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
    cn->last = k == TAG_CHANNELS_LAST;
    cn->off = sq_xmalloc((size_t)(s->n_in + 1) * sizeof(int64_t));
    cn->in = sq_xcalloc((size_t)s->n_in, sizeof(*cn->in));
    cn->off[0] = 0;
    for (int i = 0; i < s->n_in; i++)
        cn->off[i + 1] = cn->off[i] + g->values[s->in[i]].dims[1];
    be->steps[si].catn = cn;
    /* The BatchNorm's output is the concat's buffer. */
    wk__cpu_set_out_md(plan, b->out, &be->bufs[yb].md);
    ob->alias = yb;
    int root = wk__cpu_root_buf(be, yb);
    if (be->bufs[root].last < ob->last)
        be->bufs[root].last = ob->last;
}

bool wk__cpu_norm_by_concat(wk_plan_t *plan, int si)
{
    cpu_be_t *be = plan->be;
    const wk_graph_t *g = plan->graph;
    int p = g->values[g->steps[si].in[0]].producer;
    return p >= 0 && g->steps[p].kind == WK_K_CONCAT && be->steps[p].catn != NULL;
}

static inline float act1(float v, const struct cpu_catnorm *cn)
{
    for (int a = 0; a < cn->n_act; a++) {
        wk_act_t act = cn->act[a];
        v = act.kind == WK_ACT_RELU         ? (v > 0.0f ? v : 0.0f)
            : act.kind == WK_ACT_LEAKY_RELU ? (v > 0.0f ? v : v * act.alpha)
                                            : (v < act.alpha  ? act.alpha
                                               : v > act.beta ? act.beta
                                                              : v);
    }
    return v;
}

#if defined(__x86_64__)
WK_AVX2 static inline __m256 act8(__m256 v, const struct cpu_catnorm *cn)
{
    for (int a = 0; a < cn->n_act; a++)
        v = wk__cpu_act8(v, &cn->act[a]);
    return v;
}

/* scale and shift per element (stride 1) or one for the span (stride 0) */
WK_AVX2 static void norm_span_avx2(float *restrict dst, const float *restrict src,
                                   const float *restrict scale, const float *restrict shift,
                                   int64_t n, int stride, const struct cpu_catnorm *cn)
{
    int64_t i = 0;
    if (stride == 0) {
        __m256 sc = _mm256_set1_ps(scale[0]), sh = _mm256_set1_ps(shift[0]);
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(dst + i, act8(_mm256_fmadd_ps(_mm256_loadu_ps(src + i), sc, sh), cn));
    } else {
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(
                dst + i, act8(_mm256_fmadd_ps(_mm256_loadu_ps(src + i), _mm256_loadu_ps(scale + i),
                                              _mm256_loadu_ps(shift + i)),
                              cn));
    }
    for (; i < n; i++)
        dst[i] = act1(src[i] * scale[stride * i] + shift[stride * i], cn);
}
#endif

/* dst[i] = act(src[i] * scale[i] + shift[i]) for i < n, or with scale[0]
 * and shift[0] for every i where stride is 0 (one channel of a plain
 * tensor). */
static void norm_span(float *restrict dst, const float *restrict src, const float *restrict scale,
                      const float *restrict shift, int64_t n, int stride,
                      const struct cpu_catnorm *cn)
{
#if defined(__x86_64__)
    if (cn->avx2) {
        norm_span_avx2(dst, src, scale, shift, n, stride, cn);
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++)
        dst[i] = act1(src[i] * scale[stride * i] + shift[stride * i], cn);
}

typedef struct {
    const struct cpu_catnorm *cn;
    const float **in;
    float *out;
    int n_in;
    int64_t c, hw, w, rows, per_claim;
    atomic_llong next;
} catnorm_run_t;

/* The input holding channel ch, by the offsets. */
static int piece_of(const struct cpu_catnorm *cn, int n_in, int64_t ch)
{
    int k = 0;
    while (k + 1 < n_in && cn->off[k + 1] <= ch)
        k++;
    return k;
}

/* Rows: plain, one (image, channel) each; channels last, one (image, map
 * row); blocks, one (image, channel block). */
static void catnorm_rows(catnorm_run_t *r, int64_t r0, int64_t r1)
{
    const struct cpu_catnorm *cn = r->cn;
    int64_t c = r->c, hw = r->hw;
    for (int64_t row = r0; row < r1; row++) {
        if (cn->last) {
            int64_t px0 = row * r->w;
            for (int k = 0; k < r->n_in; k++) {
                int64_t ck = cn->off[k + 1] - cn->off[k];
                for (int64_t x = 0; x < r->w; x++) {
                    int64_t px = px0 + x;
                    norm_span(r->out + px * c + cn->off[k], r->in[k] + px * ck,
                              cn->scale + cn->off[k], cn->shift + cn->off[k], ck, 1, cn);
                }
            }
        } else if (cn->blk == 1) {
            int64_t n = row / c, ch = row % c;
            int k = piece_of(cn, r->n_in, ch);
            int64_t ck = cn->off[k + 1] - cn->off[k];
            norm_span(r->out + row * hw, r->in[k] + (n * ck + ch - cn->off[k]) * hw, cn->scale + ch,
                      cn->shift + ch, hw, 0, cn);
        } else {
            int64_t nb = c / cn->blk, n = row / nb, cb = row % nb, ch = cb * cn->blk;
            int k = piece_of(cn, r->n_in, ch);
            int64_t ckb = (cn->off[k + 1] - cn->off[k]) / cn->blk;
            const float *src = r->in[k] + ((n * ckb) + (ch - cn->off[k]) / cn->blk) * hw * cn->blk;
            float *dst = r->out + row * hw * cn->blk;
            for (int64_t px = 0; px < hw; px++)
                norm_span(dst + px * cn->blk, src + px * cn->blk, cn->scale + ch, cn->shift + ch,
                          cn->blk, 1, cn);
        }
    }
}

static void catnorm_share(void *data)
{
    catnorm_run_t *r = data;
    for (;;) {
        int64_t r0 = atomic_fetch_add(&r->next, r->per_claim);
        if (r0 >= r->rows)
            return;
        int64_t r1 = r0 + r->per_claim < r->rows ? r0 + r->per_claim : r->rows;
        catnorm_rows(r, r0, r1);
    }
}

int wk__cpu_concat_src(const cpu_step_t *cs, const wk_step_t *s, int i)
{
    return cs->cat_tmp != NULL && cs->cat_tmp[i] >= 0 ? cs->cat_tmp[i] : wk__cpu_vbuf(s->in[i]);
}

void wk__cpu_run_catnorm(cpu_be_t *be, const wk_step_t *s, const cpu_step_t *cs, int batch)
{
    struct cpu_catnorm *cn = cs->catn;
    const float **in = cn->in;
    for (int i = 0; i < s->n_in; i++)
        in[i] = wk__cpu_buf_ptr(be, wk__cpu_concat_src(cs, s, i));
    const dnnl_memory_desc_t *md = &be->bufs[wk__cpu_vbuf(s->out)].md;
    catnorm_run_t r = {.cn = cn,
                       .in = in,
                       .out = wk__cpu_buf_ptr(be, wk__cpu_vbuf(s->out)),
                       .n_in = s->n_in,
                       .c = cn->off[s->n_in],
                       .hw = md->dims[2] * md->dims[3],
                       .w = md->dims[3]};
    r.rows = cn->last ? (int64_t)batch * md->dims[2] : (int64_t)batch * r.c / cn->blk;
    int nt = omp_get_max_threads();
    r.per_claim = r.rows / (nt * 8) > 0 ? r.rows / (nt * 8) : 1;
    atomic_init(&r.next, 0);
    wk_omp_run(catnorm_share, &r);
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
    if (be->phase == 1 && concat_one_layout(plan, si, mds)) {
        dnnl_format_tag_t tags[N_CAT_TAGS];
        if (concat_tags(y->ndim, tags))
            catnorm_take(plan, si, tag_of(&be->bufs[wk__cpu_vbuf(s->out)].md, tags));
    } else if (be->phase == 1) {
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
    if (cs->catn != NULL) {
        /* the concat and its BatchNorm: a C kernel (wk__cpu_run_catnorm) */
        if (be->phase == 2 && !be->dry) {
            cpu_item_t it = {.prim = NULL, .step = si};
            wk__cpu_push_item(be, batch, &it);
        }
        goto out;
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
