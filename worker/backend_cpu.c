/* The cpu backend on oneDNN (C API, 2.x).
 *
 * Layouts are chosen once, at max batch, by oneDNN itself (format "any" for
 * convolution, pooling, concat and the GEMM weights): activations stay in
 * blocked layouts (nChw16c on AVX-512) from conv to conv, and reorders
 * happen only at the edges, where an op needs plain row-major data
 * (reshape, transpose, slice, pad, gemm, softmax, reduce) or a conv wants
 * another layout than its producer gave. Every batch size 1..max_batch gets
 * its own primitives over the same layouts (a layout whose batch is the
 * outermost dimension holds batch b in its first b items), so that one
 * arena planned at max batch serves every run.
 *
 * Two phases: phase 1 walks the steps at max batch and records the layouts
 * and the temporary buffers; the arena is then planned by liveness; phase 2
 * creates the primitives and memory objects for every batch size. */
#include "wk_exec_int.h"

#include <sq.h>

#include <dnnl.h>
#include <dnnl_debug.h>
#include <omp.h>

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ARENA_ALIGN 64

/* A buffer: a graph value, or a temporary that holds one value in another
 * layout for one step. */
typedef struct {
    dnnl_memory_desc_t md; /* at max batch */
    bool batched;
    bool decided;
    float *data;     /* constants: the bytes (graph-owned or own_data) */
    float *own_data; /* constants reordered into a chosen layout */
    int first, last; /* liveness in steps; first = -2: not in the arena */
    int64_t batch_mult; /* batched: dims[0] is batch * batch_mult */
    int alias;       /* a view of that buffer's bytes (another rank), or -1 */
    size_t offset;   /* in the arena */
} cpu_buf_t;

typedef struct {
    dnnl_primitive_t prim; /* NULL: a C kernel (pad, slice) for step */
    dnnl_exec_arg_t args[12];
    int n_args;
    int step;
} cpu_item_t;

typedef struct {
    cpu_item_t *items;
    int n, cap;
} cpu_list_t;

/* What phase 1 decided for a step, for phase 2 to reuse. */
typedef struct {
    int tmp_src;      /* buffer the main input is reordered into first, or -1 */
    int tmp_in[4];    /* plain copies of further inputs, or -1 */
    int weights;      /* conv/gemm weights buffer (reordered constant), or -1 */
    int bias;         /* buffer of the bias / scale constants, or -1 */
    int extra;        /* second constant (batchnorm shift), or -1 */
    bool inplace;     /* conv: sums into its residual's buffer, no copy */
} cpu_step_t;

typedef struct {
    dnnl_engine_t engine;
    dnnl_stream_t stream;
    cpu_buf_t *bufs;
    int n_bufs, cap_bufs;
    cpu_step_t *steps;
    cpu_list_t *lists;       /* [max_batch + 1]: per batch, the items in order */
    dnnl_memory_t *mems;     /* [n_bufs * (max_batch + 1)], created lazily */
    dnnl_memory_t *out_user; /* [n_outputs * (max_batch + 1)]: user-pointer outputs */
    dnnl_primitive_t *out_reorder;
    char *arena;
    size_t arena_bytes;
    int phase;
} cpu_be_t;

#define DN(call)                                                                                   \
    do {                                                                                           \
        dnnl_status_t st_ = (call);                                                                \
        if (st_ != dnnl_success) {                                                                 \
            rc = wk_fail(plan, SQ_UNSUPPORTED_MODEL, "oneDNN %s: %s", #call,                      \
                         dnnl_status2str(st_));                                                    \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

static void plain_md(dnnl_memory_desc_t *md, int ndim, const int64_t *dims)
{
    dnnl_dims_t d, strides;
    int64_t s = 1;
    if (ndim == 0) {
        /* A scalar is a one-element 1-D tensor to oneDNN. */
        d[0] = 1;
        strides[0] = 1;
        dnnl_memory_desc_init_by_strides(md, 1, d, dnnl_f32, strides);
        return;
    }
    for (int i = ndim - 1; i >= 0; i--) {
        d[i] = dims[i];
        strides[i] = s;
        s *= dims[i];
    }
    dnnl_memory_desc_init_by_strides(md, ndim, d, dnnl_f32, strides);
}

/* The layout at batch b: the batch is the outermost dimension, so only
 * dims[0] changes. */
static dnnl_memory_desc_t md_at(const cpu_buf_t *b, int batch)
{
    dnnl_memory_desc_t md = b->md;
    if (b->batched) {
        md.dims[0] = batch * b->batch_mult;
        md.padded_dims[0] = batch * b->batch_mult;
    }
    return md;
}

/* Whether md keeps the batch outermost and unblocked (so that md_at holds). */
static bool batch_outermost(const dnnl_memory_desc_t *md)
{
    if (md->format_kind != dnnl_blocked)
        return false;
    const dnnl_blocking_desc_t *bd = &md->format_desc.blocking;
    for (int i = 0; i < bd->inner_nblks; i++)
        if (bd->inner_idxs[i] == 0)
            return false;
    size_t whole = dnnl_memory_desc_get_size(md);
    return md->dims[0] > 0 && (size_t)bd->strides[0] * sizeof(float) * (size_t)md->dims[0] == whole;
}

static int add_buf(cpu_be_t *be, const dnnl_memory_desc_t *md, bool batched, int first, int last)
{
    if (be->n_bufs == be->cap_bufs) {
        be->cap_bufs = be->cap_bufs ? 2 * be->cap_bufs : 256;
        be->bufs = sq_xrealloc(be->bufs, (size_t)be->cap_bufs * sizeof(*be->bufs));
    }
    cpu_buf_t *b = &be->bufs[be->n_bufs];
    memset(b, 0, sizeof(*b));
    if (md != NULL) {
        b->md = *md;
        b->decided = true;
    }
    b->batched = batched;
    b->batch_mult = 1;
    b->alias = -1;
    b->first = first;
    b->last = last;
    return be->n_bufs++;
}

/* The buffer that owns the bytes of id (following views). */
static int root_buf(cpu_be_t *be, int id)
{
    while (be->bufs[id].alias >= 0)
        id = be->bufs[id].alias;
    return id;
}

static void *buf_ptr(cpu_be_t *be, int id)
{
    cpu_buf_t *b = &be->bufs[id];
    if (b->alias >= 0)
        return buf_ptr(be, b->alias);
    return b->data != NULL ? (void *)b->data : be->arena + b->offset;
}

/* The memory object of buffer id at batch; created once. */
static dnnl_memory_t mem_of(wk_plan_t *plan, int id, int batch)
{
    cpu_be_t *be = plan->be;
    int mb = plan->graph->max_batch;
    dnnl_memory_t *slot = &be->mems[(size_t)id * (size_t)(mb + 1) + (size_t)batch];
    if (*slot == NULL) {
        dnnl_memory_desc_t md = md_at(&be->bufs[id], batch);
        if (dnnl_memory_create(slot, &md, be->engine, buf_ptr(be, id)) != dnnl_success)
            *slot = NULL;
    }
    return *slot;
}

static void push_item(cpu_be_t *be, int batch, const cpu_item_t *it)
{
    cpu_list_t *l = &be->lists[batch];
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        l->items = sq_xrealloc(l->items, (size_t)l->cap * sizeof(*l->items));
    }
    l->items[l->n++] = *it;
}

/* Creates the primitive of pd and queues it with args at batch (phase 2);
 * destroys pd in either phase. */
static int emit(wk_plan_t *plan, dnnl_primitive_desc_t pd, int batch, int step,
                const int *arg_kinds, const int *arg_bufs, int n_args)
{
    cpu_be_t *be = plan->be;
    int rc = 0;
    if (be->phase == 2) {
        cpu_item_t it = {.step = step};
        DN(dnnl_primitive_create(&it.prim, pd));
        for (int i = 0; i < n_args; i++) {
            dnnl_memory_t m = mem_of(plan, arg_bufs[i], batch);
            if (m == NULL) {
                dnnl_primitive_destroy(it.prim);
                rc = wk_fail(plan, SQ_NOMEM, "oneDNN memory object for step %d", step);
                goto out;
            }
            it.args[it.n_args++] = (dnnl_exec_arg_t){arg_kinds[i], m};
        }
        push_item(be, batch, &it);
    }
out:
    dnnl_primitive_desc_destroy(pd);
    return rc;
}

/* Queues a reorder of buffer src into buffer dst (same dims). */
static int emit_reorder(wk_plan_t *plan, int batch, int step, int src, int dst)
{
    cpu_be_t *be = plan->be;
    int rc = 0;
    if (be->phase == 1)
        return 0;
    dnnl_memory_desc_t smd = md_at(&be->bufs[src], batch), dmd = md_at(&be->bufs[dst], batch);
    dnnl_primitive_desc_t pd;
    DN(dnnl_reorder_primitive_desc_create(&pd, &smd, be->engine, &dmd, be->engine, NULL));
    rc = emit(plan, pd, batch, step, (int[]){DNNL_ARG_FROM, DNNL_ARG_TO}, (int[]){src, dst}, 2);
out:
    return rc;
}

/* Buffer id of a graph value: buffers 0..n_values-1 are the values. */
static int vbuf(int value)
{
    return value;
}

/* Reorders constant bytes src (layout smd) into a new buffer of layout dmd,
 * once, at plan time. Returns the buffer id or a negative SQ_* code. */
static int const_reorder(wk_plan_t *plan, const dnnl_memory_desc_t *smd, void *src,
                         const dnnl_memory_desc_t *dmd)
{
    cpu_be_t *be = plan->be;
    int rc = 0, id = add_buf(be, dmd, false, -2, -2);
    cpu_buf_t *b = &be->bufs[id];
    size_t bytes = dnnl_memory_desc_get_size(dmd);
    dnnl_memory_t ms = NULL, md = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_t p = NULL;
    b->own_data = aligned_alloc(ARENA_ALIGN, (bytes + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN);
    if (b->own_data == NULL)
        return wk_fail(plan, SQ_NOMEM, "constant of %zu bytes", bytes);
    b->data = b->own_data;
    DN(dnnl_memory_create(&ms, smd, be->engine, src));
    DN(dnnl_memory_create(&md, dmd, be->engine, b->data));
    DN(dnnl_reorder_primitive_desc_create(&pd, smd, be->engine, dmd, be->engine, NULL));
    DN(dnnl_primitive_create(&p, pd));
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, ms}, {DNNL_ARG_TO, md}};
    DN(dnnl_primitive_execute(p, be->stream, 2, args));
    DN(dnnl_stream_wait(be->stream));
out:
    dnnl_primitive_destroy(p);
    dnnl_primitive_desc_destroy(pd);
    dnnl_memory_destroy(ms);
    dnnl_memory_destroy(md);
    return rc < 0 ? rc : id;
}

/* Returns a buffer holding value v's data in layout want for step si: v's
 * own buffer when it already has that layout, else a temporary filled by a
 * reorder (queued in phase 2; for constants done once now). *tmp remembers
 * the temporary across phases, so phase 2 passes want = NULL. */
static int as_layout(wk_plan_t *plan, int si, int batch, int v, const dnnl_memory_desc_t *want,
                     int *tmp)
{
    cpu_be_t *be = plan->be;
    int id = vbuf(v);
    if (be->phase == 1) {
        if (dnnl_memory_desc_equal(&be->bufs[id].md, want))
            return id;
        if (be->bufs[id].data != NULL)
            return *tmp = const_reorder(plan, &be->bufs[id].md, be->bufs[id].data, want);
        return *tmp = add_buf(be, want, be->bufs[id].batched, si, si);
    }
    if (*tmp < 0)
        return id;
    if (be->bufs[*tmp].first != -2 && emit_reorder(plan, batch, si, id, *tmp) != 0)
        return -1;
    return *tmp;
}

/* A view of buffer id with the bytes seen as md (same size, plain). */
static int view_buf(cpu_be_t *be, int id, const dnnl_memory_desc_t *md, bool batched)
{
    int v = add_buf(be, md, batched, -2, -2);
    be->bufs[v].alias = id;
    return v;
}

static int as_plain(wk_plan_t *plan, int si, int batch, int v, int *tmp)
{
    cpu_be_t *be = plan->be;
    const wk_value_t *val = &plan->graph->values[v];
    dnnl_memory_desc_t p;
    plain_md(&p, val->ndim, val->dims);
    if (be->phase == 2 && *tmp < 0)
        return vbuf(v);
    return as_layout(plan, si, batch, v, &p, tmp);
}

static void set_out_md(wk_plan_t *plan, int v, const dnnl_memory_desc_t *md)
{
    cpu_be_t *be = plan->be;
    cpu_buf_t *b = &be->bufs[vbuf(v)];
    if (!b->decided) {
        b->md = *md;
        b->decided = true;
    }
}

static void set_out_plain(wk_plan_t *plan, int v)
{
    const wk_value_t *val = &plan->graph->values[v];
    dnnl_memory_desc_t md;
    plain_md(&md, val->ndim, val->dims);
    set_out_md(plan, v, &md);
}

static dnnl_alg_kind_t act_alg(wk_act_kind_t k)
{
    switch (k) {
    case WK_ACT_RELU:
    case WK_ACT_LEAKY_RELU:
        return dnnl_eltwise_relu;
    case WK_ACT_CLIP:
        return dnnl_eltwise_clip;
    case WK_ACT_SIGMOID:
        return dnnl_eltwise_logistic;
    case WK_ACT_HARDSIGMOID:
        return dnnl_eltwise_linear; /* followed by clip(0, 1) */
    case WK_ACT_HARDSWISH:
        return dnnl_eltwise_hardswish;
    default:
        return dnnl_alg_kind_undef;
    }
}

static void append_act(dnnl_post_ops_t po, wk_act_t a)
{
    float alpha = a.kind == WK_ACT_LEAKY_RELU || a.kind == WK_ACT_CLIP || a.kind == WK_ACT_HARDSIGMOID
                      ? a.alpha
                      : 0.0f;
    float beta = a.kind == WK_ACT_CLIP || a.kind == WK_ACT_HARDSIGMOID ? a.beta : 0.0f;
    dnnl_post_ops_append_eltwise(po, 1.0f, act_alg(a.kind), alpha, beta);
    if (a.kind == WK_ACT_HARDSIGMOID)
        dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_clip, 0.0f, 1.0f);
}

static dnnl_alg_kind_t bin_alg(wk_binop_t op)
{
    switch (op) {
    case WK_BIN_ADD:
        return dnnl_binary_add;
    case WK_BIN_SUB:
        return dnnl_binary_sub;
    case WK_BIN_MUL:
        return dnnl_binary_mul;
    case WK_BIN_DIV:
        return dnnl_binary_div;
    default:
        return dnnl_alg_kind_undef;
    }
}

/* ---- steps ---- */

static int do_conv(wk_plan_t *plan, int si, int batch)
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
    dnnl_dims_t strides, dil, pl, pr;
    int64_t groups = s->p.conv.groups;
    for (int i = 0; i < nsp; i++) {
        strides[i] = s->p.conv.stride[i];
        dil[i] = s->p.conv.dilation[i] - 1;
        pl[i] = s->p.conv.pad_begin[i];
        pr[i] = s->p.conv.pad_end[i];
    }
    bool decided = be->phase == 2;
    if (decided) {
        cpu_buf_t srcb = be->bufs[vbuf(s->in[0])];
        if (cs->tmp_src >= 0)
            srcb = be->bufs[cs->tmp_src];
        src_md = md_at(&srcb, batch);
        wei_md = be->bufs[cs->weights].md;
        dst_md = md_at(&be->bufs[vbuf(s->out)], batch);
    } else {
        dnnl_dims_t d;
        d[0] = x->dims[0];
        d[1] = x->dims[1];
        for (int i = 0; i < nsp; i++)
            d[2 + i] = x->dims[2 + i];
        dnnl_memory_desc_init_by_tag(&src_md, 2 + nsp, d, dnnl_f32, dnnl_format_tag_any);
        d[1] = y->dims[1];
        for (int i = 0; i < nsp; i++)
            d[2 + i] = y->dims[2 + i];
        dnnl_memory_desc_init_by_tag(&dst_md, 2 + nsp, d, dnnl_f32, dnnl_format_tag_any);
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
    DN(dnnl_post_ops_create(&po));
    for (int i = 0; i < s->n_post; i++) {
        if (s->post[i].kind == WK_POST_ADD)
            DN(dnnl_post_ops_append_sum(po, 1.0f));
        else
            append_act(po, s->post[i].act);
    }
    DN(dnnl_primitive_attr_set_post_ops(attr, po));
    dnnl_convolution_desc_t cd;
    DN(dnnl_dilated_convolution_forward_desc_init(
        &cd, dnnl_forward_inference, dnnl_convolution_direct, &src_md, &wei_md,
        has_bias ? &bias_md : NULL, &dst_md, strides, dil, pl, pr));
    DN(dnnl_primitive_desc_create(&pd, &cd, attr, be->engine, NULL));

    if (!decided) {
        const dnnl_memory_desc_t *q_src = dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0);
        const dnnl_memory_desc_t *q_wei = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
        const dnnl_memory_desc_t *q_dst = dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0);
        if (x->batched && !batch_outermost(q_src)) {
            rc = wk_fail(plan, SQ_UNSUPPORTED_MODEL,
                         "conv step %d: oneDNN chose a source layout that blocks the batch", si);
            goto out;
        }
        set_out_md(plan, s->out, q_dst);
        if (y->batched && !batch_outermost(&be->bufs[vbuf(s->out)].md)) {
            rc = wk_fail(plan, SQ_UNSUPPORTED_MODEL,
                         "conv step %d: oneDNN chose a layout that blocks the batch", si);
            goto out;
        }
        /* A residual that dies here and has the output's layout lends its
         * buffer: the conv sums into it in place. */
        for (int i = 0; i < s->n_post; i++) {
            if (s->post[i].kind != WK_POST_ADD)
                continue;
            int r = vbuf(s->post[i].value), root = root_buf(be, r);
            cpu_buf_t *rb = &be->bufs[r], *ob = &be->bufs[vbuf(s->out)];
            if (rb->first < 0 || g->values[s->post[i].value].is_output ||
                g->values[s->post[i].value].is_input || be->bufs[root].last != si ||
                rb->last != si || ob->alias >= 0 || root_buf(be, vbuf(s->in[0])) == root ||
                !dnnl_memory_desc_equal(&rb->md, q_dst))
                continue;
            ob->alias = r;
            if (be->bufs[root].last < ob->last)
                be->bufs[root].last = ob->last;
            cs->inplace = true;
        }
        as_layout(plan, si, batch, s->in[0], q_src, &cs->tmp_src);
        /* The weights: reordered into the chosen layout once. */
        dnnl_memory_desc_t wplain;
        int64_t wdims[DNNL_MAX_NDIMS];
        for (int i = 0; i < q_wei->ndims; i++)
            wdims[i] = q_wei->dims[i];
        plain_md(&wplain, q_wei->ndims, wdims);
        cs->weights = const_reorder(plan, &wplain, w->data, q_wei);
        if (cs->weights < 0) {
            rc = cs->weights;
            goto out;
        }
        dnnl_primitive_desc_destroy(pd);
        pd = NULL;
        goto out;
    }
    /* A residual add: the other addend goes into dst first, the conv sums. */
    for (int i = 0; i < s->n_post && !cs->inplace; i++)
        if (s->post[i].kind == WK_POST_ADD &&
            (rc = emit_reorder(plan, batch, si, vbuf(s->post[i].value), vbuf(s->out))) != 0)
            goto out;
    int src = cs->tmp_src >= 0 ? as_layout(plan, si, batch, s->in[0], NULL, &cs->tmp_src)
                               : vbuf(s->in[0]);
    if (src < 0) {
        rc = SQ_UNSUPPORTED_MODEL;
        goto out;
    }
    int kinds[4] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_BIAS};
    int bufs[4] = {src, cs->weights, vbuf(s->out), has_bias ? vbuf(s->in[2]) : -1};
    rc = emit(plan, pd, batch, si, kinds, bufs, has_bias ? 4 : 3);
    pd = NULL;
out:
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    dnnl_post_ops_destroy(po);
    dnnl_primitive_attr_destroy(attr);
    return rc;
}

static int do_pool(wk_plan_t *plan, int si, int batch)
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
    dnnl_memory_desc_t src_md = md_at(&be->bufs[vbuf(s->in[0])], batch), dst_md;
    if (be->phase == 1) {
        /* The output keeps the input's layout when it can. */
        dnnl_dims_t d;
        for (int i = 0; i < y->ndim; i++)
            d[i] = y->dims[i];
        dnnl_memory_desc_init_by_tag(&dst_md, y->ndim, d, dnnl_f32, dnnl_format_tag_any);
    } else {
        dst_md = md_at(&be->bufs[vbuf(s->out)], batch);
    }
    dnnl_pooling_v2_desc_t desc;
    DN(dnnl_pooling_v2_forward_desc_init(&desc, dnnl_forward_inference, alg, &src_md, &dst_md,
                                         strides, kernel, dil, pl, pr));
    DN(dnnl_primitive_desc_create(&pd, &desc, NULL, be->engine, NULL));
    if (be->phase == 1) {
        set_out_md(plan, s->out, dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0));
        if (y->batched && !batch_outermost(&be->bufs[vbuf(s->out)].md))
            set_out_plain(plan, s->out);
    }
    rc = emit(plan, pd, batch, si, (int[]){DNNL_ARG_SRC, DNNL_ARG_DST},
              (int[]){vbuf(s->in[0]), vbuf(s->out)}, 2);
    pd = NULL;
out:
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    return rc;
}

static int do_eltwise(wk_plan_t *plan, int si, int batch)
{
    cpu_be_t *be = plan->be;
    const wk_step_t *s = &plan->graph->steps[si];
    int rc = 0;
    dnnl_primitive_desc_t pd = NULL;
    if (be->phase == 1)
        set_out_md(plan, s->out, &be->bufs[vbuf(s->in[0])].md);
    dnnl_memory_desc_t md = md_at(&be->bufs[vbuf(s->in[0])], batch);
    wk_act_t a = s->p.act;
    float alpha = a.kind == WK_ACT_LEAKY_RELU || a.kind == WK_ACT_CLIP || a.kind == WK_ACT_HARDSIGMOID
                      ? a.alpha
                      : 0.0f;
    float beta = a.kind == WK_ACT_CLIP || a.kind == WK_ACT_HARDSIGMOID ? a.beta : 0.0f;
    dnnl_eltwise_desc_t desc;
    DN(dnnl_eltwise_forward_desc_init(&desc, dnnl_forward_inference, act_alg(a.kind), &md, alpha,
                                      beta));
    DN(dnnl_primitive_desc_create(&pd, &desc, NULL, be->engine, NULL));
    rc = emit(plan, pd, batch, si, (int[]){DNNL_ARG_SRC, DNNL_ARG_DST},
              (int[]){vbuf(s->in[0]), vbuf(s->out)}, 2);
    pd = NULL;
    if (rc == 0 && a.kind == WK_ACT_HARDSIGMOID) {
        /* then clip(0, 1) in place (a post-op on the reference eltwise
         * loses the values in oneDNN 2.6) */
        DN(dnnl_eltwise_forward_desc_init(&desc, dnnl_forward_inference, dnnl_eltwise_clip, &md,
                                          0.0f, 1.0f));
        DN(dnnl_primitive_desc_create(&pd, &desc, NULL, be->engine, NULL));
        rc = emit(plan, pd, batch, si, (int[]){DNNL_ARG_SRC, DNNL_ARG_DST},
                  (int[]){vbuf(s->out), vbuf(s->out)}, 2);
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
    plain_md(&md, ndim, dims);
    return md;
}

static int do_binary(wk_plan_t *plan, int si, int batch)
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
    if (wk_value_elems(&g->values[a]) != wk_value_elems(y) ||
        g->values[a].ndim != y->ndim) {
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
        /* The output takes the full operand's layout; the broadcast one is
         * read plain with the output's rank, unless it has the same shape
         * and layout (a residual add). */
        set_out_md(plan, s->out, &be->bufs[vbuf(a)].md);
        bool same = bv->data == NULL && wk_value_elems(bv) == wk_value_elems(y) &&
                    bv->ndim == y->ndim;
        if (same) {
            as_layout(plan, si, batch, b, &be->bufs[vbuf(a)].md, &cs->tmp_in[0]);
            cs->bias = cs->tmp_in[0] >= 0 ? cs->tmp_in[0] : vbuf(b);
        } else {
            if (bv->batched && bv->ndim != y->ndim)
                return wk_fail(plan, SQ_UNSUPPORTED_MODEL, "binary step %d: batched operand of "
                               "lower rank", si);
            dnnl_memory_desc_t p;
            plain_md(&p, bv->ndim, bv->dims);
            int src = as_layout(plan, si, batch, b, &p, &cs->tmp_in[0]);
            if (src < 0)
                return src;
            dnnl_memory_desc_t r = plain_ranked(bv, g->max_batch, y->ndim);
            cs->bias = view_buf(be, src, &r, bv->batched);
        }
        if (s->kind == WK_K_BATCHNORM) {
            dnnl_memory_desc_t r = plain_ranked(&g->values[s->in[2]], 1, y->ndim);
            cs->extra = add_buf(be, &r, false, -2, -2);
            be->bufs[cs->extra].data = g->values[s->in[2]].data;
        }
    } else if (cs->tmp_in[0] >= 0 && as_layout(plan, si, batch, b, NULL, &cs->tmp_in[0]) < 0) {
        return SQ_UNSUPPORTED_MODEL;
    }
    dnnl_memory_desc_t md0 = md_at(&be->bufs[vbuf(a)], batch);
    dnnl_memory_desc_t md1 = md_at(&be->bufs[cs->bias], batch);
    dnnl_memory_desc_t mdd = md_at(&be->bufs[vbuf(s->out)], batch);
    DN(dnnl_primitive_attr_create(&attr));
    DN(dnnl_post_ops_create(&po));
    if (negate)
        DN(dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_linear, -1.0f, 0.0f));
    if (s->kind == WK_K_BATCHNORM)
        DN(dnnl_post_ops_append_binary(po, dnnl_binary_add, &be->bufs[cs->extra].md));
    DN(dnnl_primitive_attr_set_post_ops(attr, po));
    dnnl_binary_desc_t desc;
    DN(dnnl_binary_desc_init(&desc, bin_alg(op), &md0, &md1, &mdd));
    DN(dnnl_primitive_desc_create(&pd, &desc, attr, be->engine, NULL));
    int kinds[4] = {DNNL_ARG_SRC_0, DNNL_ARG_SRC_1, DNNL_ARG_DST,
                    DNNL_ARG_ATTR_MULTIPLE_POST_OP(negate ? 1 : 0) | DNNL_ARG_SRC_1};
    int bufs[4] = {vbuf(a), cs->bias, vbuf(s->out), cs->extra};
    rc = emit(plan, pd, batch, si, kinds, bufs, s->kind == WK_K_BATCHNORM ? 4 : 3);
    pd = NULL;
out:
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    dnnl_post_ops_destroy(po);
    dnnl_primitive_attr_destroy(attr);
    return rc;
}

static int do_concat(wk_plan_t *plan, int si, int batch)
{
    cpu_be_t *be = plan->be;
    const wk_graph_t *g = plan->graph;
    const wk_step_t *s = &g->steps[si];
    const wk_value_t *y = &g->values[s->out];
    int rc = 0;
    dnnl_primitive_desc_t pd = NULL;
    if (y->batched && s->p.axis == 0)
        return wk_fail(plan, SQ_UNSUPPORTED_MODEL, "concat step %d along the batch", si);
    if (s->n_in > 10)
        return wk_fail(plan, SQ_UNSUPPORTED_MODEL, "concat step %d of %d inputs", si, s->n_in);
    dnnl_memory_desc_t mds[10], dst;
    for (int i = 0; i < s->n_in; i++)
        mds[i] = md_at(&be->bufs[vbuf(s->in[i])], batch);
    if (be->phase == 1) {
        DN(dnnl_concat_primitive_desc_create(&pd, NULL, s->n_in, s->p.axis, mds, NULL, be->engine));
        set_out_md(plan, s->out, dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0));
        if (y->batched && !batch_outermost(&be->bufs[vbuf(s->out)].md)) {
            be->bufs[vbuf(s->out)].decided = false;
            set_out_plain(plan, s->out);
        }
        dnnl_primitive_desc_destroy(pd);
        pd = NULL;
    }
    dst = md_at(&be->bufs[vbuf(s->out)], batch);
    DN(dnnl_concat_primitive_desc_create(&pd, &dst, s->n_in, s->p.axis, mds, NULL, be->engine));
    int kinds[11], bufs[11];
    for (int i = 0; i < s->n_in; i++) {
        kinds[i] = DNNL_ARG_MULTIPLE_SRC + i;
        bufs[i] = vbuf(s->in[i]);
    }
    kinds[s->n_in] = DNNL_ARG_DST;
    bufs[s->n_in] = vbuf(s->out);
    rc = emit(plan, pd, batch, si, kinds, bufs, s->n_in + 1);
    pd = NULL;
out:
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    return rc;
}

/* A plain 2-D or n-D view over a buffer, scaled with the batch through
 * batch_mult when its first dim is batch * something. */
static int plain_view(cpu_be_t *be, int id, int ndim, const int64_t *dims_max, bool batched,
                      int64_t batch_mult)
{
    dnnl_memory_desc_t md;
    plain_md(&md, ndim, dims_max);
    int v = view_buf(be, id, &md, batched);
    be->bufs[v].batch_mult = batch_mult;
    return v;
}

static int do_softmax(wk_plan_t *plan, int si, int batch)
{
    cpu_be_t *be = plan->be;
    const wk_graph_t *g = plan->graph;
    const wk_step_t *s = &g->steps[si];
    cpu_step_t *cs = &be->steps[si];
    const wk_value_t *x = &g->values[s->in[0]];
    int rc = 0, axis = s->p.axis;
    dnnl_primitive_desc_t pd = NULL;
    if (be->phase == 1) {
        set_out_plain(plan, s->out);
        int src = as_plain(plan, si, batch, s->in[0], &cs->tmp_src);
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
            cs->extra = plain_view(be, vbuf(s->out), 2, d2, x->batched, mult);
        } else {
            cs->bias = src;
            cs->extra = vbuf(s->out);
        }
    } else if (cs->tmp_src >= 0 && as_layout(plan, si, batch, s->in[0], NULL, &cs->tmp_src) < 0) {
        return SQ_UNSUPPORTED_MODEL;
    }
    dnnl_memory_desc_t src_md = md_at(&be->bufs[cs->bias], batch);
    dnnl_memory_desc_t dst_md = md_at(&be->bufs[cs->extra], batch);
    dnnl_softmax_v2_desc_t desc;
    DN(dnnl_softmax_v2_forward_desc_init(&desc, dnnl_forward_inference, dnnl_softmax_accurate,
                                         &src_md, &dst_md, s->legacy_softmax ? 1 : axis));
    DN(dnnl_primitive_desc_create(&pd, &desc, NULL, be->engine, NULL));
    rc = emit(plan, pd, batch, si, (int[]){DNNL_ARG_SRC, DNNL_ARG_DST},
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
static int do_gemm(wk_plan_t *plan, int si, int batch)
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
        return wk_fail(plan, SQ_UNSUPPORTED_MODEL, "gemm step %d: batch in a transposed or "
                       "second operand", si);
    if (!c_const && beta != 1.0f)
        return wk_fail(plan, SQ_UNSUPPORTED_MODEL, "gemm step %d: beta with a computed C", si);
    DN(dnnl_primitive_attr_create(&attr));
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
        set_out_plain(plan, s->out);
        dnnl_memory_desc_t p;
        plain_md(&p, av->ndim, av->dims);
        int src = as_layout(plan, si, batch, s->in[0], &p, &cs->tmp_src);
        if (src < 0) {
            rc = src;
            goto out;
        }
        if (ta) {
            dnnl_memory_desc_t t;
            strided_md(&t, M, K, true);
            cs->tmp_in[1] = view_buf(be, src, &t, false);
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
            cs->weights = const_reorder(plan, &bmd, scaled ? scaled : bv->data, &want);
            free(scaled);
            if (cs->weights < 0) {
                rc = cs->weights;
                goto out;
            }
        } else {
            int src_b = as_plain(plan, si, batch, s->in[1], &cs->tmp_in[2]);
            if (src_b < 0) {
                rc = src_b;
                goto out;
            }
            cs->weights = view_buf(be, src_b, &bmd, false);
        }
        if (cv != NULL && c_const) {
            /* bias: beta * C, broadcast to [M, N] */
            dnnl_memory_desc_t r = plain_ranked(cv, 1, 2);
            int64_t n = wk_value_elems(cv);
            float *scaled = sq_xmalloc((size_t)n * sizeof(float));
            for (int64_t i = 0; i < n; i++)
                scaled[i] = cv->data[i] * beta;
            cs->bias = const_reorder(plan, &r, scaled, &r);
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
            int src_c = as_plain(plan, si, batch, s->in[2], &cs->tmp_in[3]);
            if (src_c < 0) {
                rc = src_c;
                goto out;
            }
            cs->extra = view_buf(be, src_c, &cmd, false);
        }
    } else {
        if (cs->tmp_src >= 0 && as_layout(plan, si, batch, s->in[0], NULL, &cs->tmp_src) < 0)
            return SQ_UNSUPPORTED_MODEL;
        if (cs->tmp_in[2] >= 0 && as_layout(plan, si, batch, s->in[1], NULL, &cs->tmp_in[2]) < 0)
            return SQ_UNSUPPORTED_MODEL;
        if (cs->tmp_in[3] >= 0 && as_layout(plan, si, batch, s->in[2], NULL, &cs->tmp_in[3]) < 0)
            return SQ_UNSUPPORTED_MODEL;
    }
    {
        dnnl_memory_desc_t amd = md_at(&be->bufs[cs->tmp_in[1]], batch);
        dnnl_memory_desc_t wmd = be->bufs[cs->weights].md;
        dnnl_memory_desc_t dmd = md_at(&be->bufs[vbuf(s->out)], batch);
        dnnl_memory_desc_t bias_md;
        if (cs->bias >= 0)
            bias_md = be->bufs[cs->bias].md;
        dnnl_matmul_desc_t md;
        DN(dnnl_matmul_desc_init(&md, &amd, &wmd, cs->bias >= 0 ? &bias_md : NULL, &dmd));
        DN(dnnl_primitive_desc_create(&pd, &md, attr, be->engine, NULL));
        int kinds[5] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST};
        int bufs[5] = {cs->tmp_in[1], cs->weights, vbuf(s->out)};
        int n = 3;
        if (cs->bias >= 0) {
            kinds[n] = DNNL_ARG_BIAS;
            bufs[n++] = cs->bias;
        }
        if (cs->extra >= 0) {
            kinds[n] = DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1;
            bufs[n++] = cs->extra;
        }
        rc = emit(plan, pd, batch, si, kinds, bufs, n);
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
static int do_matmul(wk_plan_t *plan, int si, int batch)
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
        set_out_plain(plan, s->out);
        int sa = as_plain(plan, si, batch, s->in[0], &cs->tmp_in[0]);
        int sb = as_plain(plan, si, batch, s->in[1], &cs->tmp_in[1]);
        if (sa < 0 || sb < 0)
            return sa < 0 ? sa : sb;
        cs->tmp_src = plain_view(be, sa, r, ad, a_b, 1);
        cs->weights = plain_view(be, sb, r, bd, b_b, 1);
        cs->extra = plain_view(be, vbuf(s->out), r, yd, y_b, 1);
    } else {
        if (cs->tmp_in[0] >= 0 && as_layout(plan, si, batch, s->in[0], NULL, &cs->tmp_in[0]) < 0)
            return SQ_UNSUPPORTED_MODEL;
        if (cs->tmp_in[1] >= 0 && as_layout(plan, si, batch, s->in[1], NULL, &cs->tmp_in[1]) < 0)
            return SQ_UNSUPPORTED_MODEL;
    }
    dnnl_memory_desc_t amd = md_at(&be->bufs[cs->tmp_src], batch);
    dnnl_memory_desc_t bmd = md_at(&be->bufs[cs->weights], batch);
    dnnl_memory_desc_t dmd = md_at(&be->bufs[cs->extra], batch);
    dnnl_matmul_desc_t md;
    DN(dnnl_matmul_desc_init(&md, &amd, &bmd, NULL, &dmd));
    DN(dnnl_primitive_desc_create(&pd, &md, NULL, be->engine, NULL));
    rc = emit(plan, pd, batch, si, (int[]){DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST},
              (int[]){cs->tmp_src, cs->weights, cs->extra}, 3);
    pd = NULL;
out:
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    return rc;
}

static int do_reduce(wk_plan_t *plan, int si, int batch)
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
        set_out_plain(plan, s->out);
        int src = as_plain(plan, si, batch, s->in[0], &cs->tmp_src);
        if (src < 0)
            return src;
        int64_t kd[WK_MAX_DIMS];
        for (int i = 0; i < x->ndim; i++)
            kd[i] = (s->p.reduce.axes_mask >> i) & 1 ? 1 : x->dims[i];
        cs->bias = src;
        cs->extra = plain_view(be, vbuf(s->out), x->ndim, kd, x->batched, 1);
    } else if (cs->tmp_src >= 0 && as_layout(plan, si, batch, s->in[0], NULL, &cs->tmp_src) < 0) {
        return SQ_UNSUPPORTED_MODEL;
    }
    dnnl_memory_desc_t smd = md_at(&be->bufs[cs->bias], batch);
    dnnl_memory_desc_t dmd = md_at(&be->bufs[cs->extra], batch);
    if (dnnl_memory_desc_equal(&smd, &dmd))
        return emit_reorder(plan, batch, si, cs->bias, cs->extra); /* nothing reduced */
    dnnl_reduction_desc_t desc;
    DN(dnnl_reduction_desc_init(&desc, dnnl_reduction_mean, &smd, &dmd, 0.0f, 0.0f));
    DN(dnnl_primitive_desc_create(&pd, &desc, NULL, be->engine, NULL));
    rc = emit(plan, pd, batch, si, (int[]){DNNL_ARG_SRC, DNNL_ARG_DST},
              (int[]){cs->bias, cs->extra}, 2);
    pd = NULL;
out:
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    return rc;
}

/* Reshape and friends: the input in plain order, written to the output's
 * bytes (a view of the output with the input's dims). */
static int do_copy(wk_plan_t *plan, int si, int batch)
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
        set_out_plain(plan, s->out);
        cs->extra = plain_view(be, vbuf(s->out), x->ndim, x->dims, x->batched, 1);
        return 0;
    }
    return emit_reorder(plan, batch, si, vbuf(s->in[0]), cs->extra);
}

static int do_transpose(wk_plan_t *plan, int si, int batch)
{
    cpu_be_t *be = plan->be;
    const wk_graph_t *g = plan->graph;
    const wk_step_t *s = &g->steps[si];
    cpu_step_t *cs = &be->steps[si];
    const wk_value_t *x = &g->values[s->in[0]], *y = &g->values[s->out];
    if (be->phase == 1) {
        if (x->batched && s->p.perm[0] != 0)
            return wk_fail(plan, SQ_UNSUPPORTED_MODEL, "transpose step %d moves the batch", si);
        set_out_plain(plan, s->out);
        int src = as_plain(plan, si, batch, s->in[0], &cs->tmp_src);
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
            plain_md(&md, 0, NULL);
        else
            dnnl_memory_desc_init_by_strides(&md, y->ndim, d, dnnl_f32, vs);
        cs->bias = view_buf(be, src, &md, x->batched);
        return 0;
    }
    if (cs->tmp_src >= 0 && as_layout(plan, si, batch, s->in[0], NULL, &cs->tmp_src) < 0)
        return SQ_UNSUPPORTED_MODEL;
    return emit_reorder(plan, batch, si, cs->bias, vbuf(s->out));
}

/* Pad and Slice run as plain C over plain buffers. */
static int do_c_kernel(wk_plan_t *plan, int si, int batch)
{
    cpu_be_t *be = plan->be;
    const wk_step_t *s = &plan->graph->steps[si];
    cpu_step_t *cs = &be->steps[si];
    if (be->phase == 1) {
        set_out_plain(plan, s->out);
        int src = as_plain(plan, si, batch, s->in[0], &cs->tmp_src);
        if (src < 0)
            return src;
        cs->bias = src;
        return 0;
    }
    if (cs->tmp_src >= 0 && as_layout(plan, si, batch, s->in[0], NULL, &cs->tmp_src) < 0)
        return SQ_UNSUPPORTED_MODEL;
    cpu_item_t it = {.prim = NULL, .step = si};
    push_item(be, batch, &it);
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

static int do_step(wk_plan_t *plan, int si, int batch)
{
    switch (plan->graph->steps[si].kind) {
    case WK_K_CONV:
        return do_conv(plan, si, batch);
    case WK_K_MAXPOOL:
    case WK_K_AVGPOOL:
    case WK_K_GLOBALAVG:
        return do_pool(plan, si, batch);
    case WK_K_ELTWISE:
        return do_eltwise(plan, si, batch);
    case WK_K_BINARY:
    case WK_K_BATCHNORM:
        return do_binary(plan, si, batch);
    case WK_K_CONCAT:
        return do_concat(plan, si, batch);
    case WK_K_SOFTMAX:
        return do_softmax(plan, si, batch);
    case WK_K_GEMM:
        return do_gemm(plan, si, batch);
    case WK_K_MATMUL:
        return do_matmul(plan, si, batch);
    case WK_K_REDUCE_MEAN:
        return do_reduce(plan, si, batch);
    case WK_K_COPY:
        return do_copy(plan, si, batch);
    case WK_K_TRANSPOSE:
        return do_transpose(plan, si, batch);
    case WK_K_PAD:
    case WK_K_SLICE:
        return do_c_kernel(plan, si, batch);
    case WK_K_COUNT_:
        break;
    }
    return wk_fail(plan, SQ_INTERNAL, "step %d: unknown kernel", si);
}

static void cpu_release(wk_plan_t *plan)
{
    cpu_be_t *be = plan->be;
    if (be == NULL)
        return;
    int mb = plan->graph->max_batch;
    if (be->lists != NULL) {
        for (int b = 0; b <= mb; b++) {
            for (int i = 0; i < be->lists[b].n; i++)
                if (be->lists[b].items[i].prim)
                    dnnl_primitive_destroy(be->lists[b].items[i].prim);
            free(be->lists[b].items);
        }
    }
    if (be->mems != NULL)
        for (size_t i = 0; i < (size_t)be->n_bufs * (size_t)(mb + 1); i++)
            dnnl_memory_destroy(be->mems[i]);
    if (be->out_user != NULL)
        for (size_t i = 0; i < (size_t)plan->graph->n_outputs * (size_t)(mb + 1); i++) {
            dnnl_memory_destroy(be->out_user[i]);
            dnnl_primitive_destroy(be->out_reorder[i]);
        }
    for (int i = 0; i < be->n_bufs; i++)
        free(be->bufs[i].own_data);
    free(be->bufs);
    free(be->steps);
    free(be->lists);
    free(be->mems);
    free(be->out_user);
    free(be->out_reorder);
    free(be->arena);
    if (be->stream)
        dnnl_stream_destroy(be->stream);
    if (be->engine)
        dnnl_engine_destroy(be->engine);
    free(be);
    plan->be = NULL;
}

static int cpu_prepare(wk_plan_t *plan)
{
    wk_graph_t *g = plan->graph;
    int rc = 0, mb = g->max_batch;
    cpu_be_t *be = sq_xcalloc(1, sizeof(*be));
    plan->be = be;
    if (plan->opts.threads > 0)
        omp_set_num_threads(plan->opts.threads);
    DN(dnnl_engine_create(&be->engine, dnnl_cpu, 0));
    DN(dnnl_stream_create(&be->stream, be->engine, dnnl_stream_default_flags));
    for (int i = 0; i < g->n_values; i++) {
        const wk_value_t *v = &g->values[i];
        int first = v->is_input ? 0 : v->producer;
        int last = v->last_use > first ? v->last_use : first;
        int id = add_buf(be, NULL, v->batched, first, last);
        if (v->data != NULL || v->producer == -2 || (!v->is_input && v->producer < 0)) {
            be->bufs[id].first = be->bufs[id].last = -2;
            be->bufs[id].data = v->data;
        }
        if (v->data != NULL || v->is_input) {
            dnnl_memory_desc_t md;
            plain_md(&md, v->ndim, v->dims);
            be->bufs[id].md = md;
            be->bufs[id].decided = true;
        }
    }
    be->steps = sq_xcalloc((size_t)(g->n_steps ? g->n_steps : 1), sizeof(*be->steps));
    for (int i = 0; i < g->n_steps; i++) {
        cpu_step_t *cs = &be->steps[i];
        cs->tmp_src = cs->weights = cs->bias = cs->extra = -1;
        for (int k = 0; k < 4; k++)
            cs->tmp_in[k] = -1;
    }
    be->phase = 1;
    for (int si = 0; si < g->n_steps; si++)
        if ((rc = do_step(plan, si, mb)) != 0)
            goto out;

    /* The arena, by liveness. */
    {
        wk_buf_req_t *reqs = sq_xcalloc((size_t)be->n_bufs, sizeof(*reqs));
        size_t *offs = sq_xcalloc((size_t)be->n_bufs, sizeof(*offs));
        int *ids = sq_xcalloc((size_t)be->n_bufs, sizeof(int));
        int n = 0;
        for (int i = 0; i < be->n_bufs; i++) {
            cpu_buf_t *b = &be->bufs[i];
            if (b->first == -2 || b->alias >= 0)
                continue;
            if (!b->decided) {
                free(reqs);
                free(offs);
                free(ids);
                rc = wk_fail(plan, SQ_INTERNAL, "buffer %d has no layout", i);
                goto out;
            }
            reqs[n] = (wk_buf_req_t){dnnl_memory_desc_get_size(&b->md), b->first, b->last};
            ids[n++] = i;
        }
        be->arena_bytes = wk_arena_plan(reqs, n, ARENA_ALIGN, offs);
        for (int k = 0; k < n; k++)
            be->bufs[ids[k]].offset = offs[k];
        free(reqs);
        free(offs);
        free(ids);
        be->arena = aligned_alloc(ARENA_ALIGN, be->arena_bytes + ARENA_ALIGN);
        if (be->arena == NULL) {
            rc = wk_fail(plan, SQ_NOMEM, "arena of %zu bytes", be->arena_bytes);
            goto out;
        }
        memset(be->arena, 0, be->arena_bytes);
    }
    plan->memory_bytes = be->arena_bytes;
    for (int i = 0; i < be->n_bufs; i++)
        if (be->bufs[i].own_data)
            plan->memory_bytes += dnnl_memory_desc_get_size(&be->bufs[i].md);

    be->phase = 2;
    be->lists = sq_xcalloc((size_t)mb + 1, sizeof(*be->lists));
    be->mems = sq_xcalloc((size_t)be->n_bufs * (size_t)(mb + 1), sizeof(dnnl_memory_t));
    be->out_user = sq_xcalloc((size_t)g->n_outputs * (size_t)(mb + 1), sizeof(dnnl_memory_t));
    be->out_reorder = sq_xcalloc((size_t)g->n_outputs * (size_t)(mb + 1), sizeof(dnnl_primitive_t));
    for (int b = 1; b <= mb; b++) {
        for (int si = 0; si < g->n_steps; si++)
            if ((rc = do_step(plan, si, b)) != 0)
                goto out;
        for (int o = 0; o < g->n_outputs; o++) {
            const wk_value_t *v = &g->values[g->outputs[o]];
            int64_t dims[WK_MAX_DIMS];
            wk_value_dims_at(v, b, dims);
            dnnl_memory_desc_t umd, smd = md_at(&be->bufs[vbuf(g->outputs[o])], b);
            plain_md(&umd, v->ndim, dims);
            size_t k = (size_t)o * (size_t)(mb + 1) + (size_t)b;
            dnnl_primitive_desc_t pd;
            DN(dnnl_memory_create(&be->out_user[k], &umd, be->engine, DNNL_MEMORY_NONE));
            DN(dnnl_reorder_primitive_desc_create(&pd, &smd, be->engine, &umd, be->engine, NULL));
            dnnl_status_t st = dnnl_primitive_create(&be->out_reorder[k], pd);
            dnnl_primitive_desc_destroy(pd);
            DN(st);
            if (mem_of(plan, vbuf(g->outputs[o]), b) == NULL) {
                rc = wk_fail(plan, SQ_NOMEM, "output memory object");
                goto out;
            }
        }
    }
out:
    if (rc != 0)
        cpu_release(plan);
    return rc;
}

static float *cpu_input_buffer(wk_plan_t *plan, int index)
{
    return buf_ptr(plan->be, vbuf(plan->graph->inputs[index]));
}

static int cpu_run(wk_plan_t *plan, int batch, float *const *outputs)
{
    cpu_be_t *be = plan->be;
    const wk_graph_t *g = plan->graph;
    int rc = 0, mb = g->max_batch;
    if (plan->opts.threads > 0)
        omp_set_num_threads(plan->opts.threads);
    const cpu_list_t *l = &be->lists[batch];
    for (int i = 0; i < l->n; i++) {
        const cpu_item_t *it = &l->items[i];
        if (it->prim != NULL) {
            DN(dnnl_primitive_execute(it->prim, be->stream, it->n_args, it->args));
            continue;
        }
        /* C kernels read plain memory written by the primitives before. */
        DN(dnnl_stream_wait(be->stream));
        const wk_step_t *s = &g->steps[it->step];
        const float *src = buf_ptr(be, be->steps[it->step].bias);
        float *dst = buf_ptr(be, vbuf(s->out));
        if (s->kind == WK_K_PAD)
            run_pad(s, &g->values[s->in[0]], &g->values[s->out], batch, src, dst);
        else
            run_slice(s, &g->values[s->in[0]], &g->values[s->out], batch, src, dst);
    }
    for (int o = 0; o < g->n_outputs; o++) {
        size_t k = (size_t)o * (size_t)(mb + 1) + (size_t)batch;
        DN(dnnl_memory_set_data_handle_v2(be->out_user[k], outputs[o], be->stream));
        dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, mem_of(plan, vbuf(g->outputs[o]), batch)},
                                   {DNNL_ARG_TO, be->out_user[k]}};
        DN(dnnl_primitive_execute(be->out_reorder[k], be->stream, 2, args));
    }
    DN(dnnl_stream_wait(be->stream));
out:
    return rc;
}

const wk_backend_ops_t wk_backend_cpu = {
    .name = "cpu",
    .prepare = cpu_prepare,
    .input_buffer = cpu_input_buffer,
    .run = cpu_run,
    .release = cpu_release,
};
