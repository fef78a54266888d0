/* The cpu backend's bottom layer (backend_cpu_int.h): buffers (graph
 * values, temporaries, reordered constants, views), their oneDNN layouts at
 * each batch size, memory objects and scratchpads, and queueing a
 * primitive or a reorder. The op builders (backend_cpu_ops.c) stand on it;
 * it calls nothing of theirs or of the backend's vtable (backend_cpu.c). */
#include "backend_cpu_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void wk__cpu_plain_md(dnnl_memory_desc_t *md, int ndim, const int64_t *dims)
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
dnnl_memory_desc_t wk__cpu_md_at(const cpu_buf_t *b, int batch)
{
    dnnl_memory_desc_t md = b->md;
    if (b->batched) {
        md.dims[0] = batch * b->batch_mult;
        md.padded_dims[0] = batch * b->batch_mult;
    }
    return md;
}

/* Whether md keeps the batch outermost and unblocked (so that md_at holds). */
bool wk__cpu_batch_outermost(const dnnl_memory_desc_t *md)
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

int wk__cpu_add_buf(cpu_be_t *be, const dnnl_memory_desc_t *md, bool batched, int first, int last)
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
int wk__cpu_root_buf(cpu_be_t *be, int id)
{
    while (be->bufs[id].alias >= 0)
        id = be->bufs[id].alias;
    return id;
}

void *wk__cpu_buf_ptr(cpu_be_t *be, int id)
{
    cpu_buf_t *b = &be->bufs[id];
    if (b->alias >= 0)
        return wk__cpu_buf_ptr(be, b->alias);
    return b->data != NULL ? (void *)b->data : be->arena + b->offset;
}

/* The memory object of buffer id at batch; created once. */
dnnl_memory_t wk__cpu_mem_of(wk_plan_t *plan, int id, int batch)
{
    cpu_be_t *be = plan->be;
    int mb = plan->graph->max_batch;
    dnnl_memory_t *slot = &be->mems[(size_t)id * (size_t)(mb + 1) + (size_t)batch];
    if (*slot == NULL) {
        dnnl_memory_desc_t md = wk__cpu_md_at(&be->bufs[id], batch);
        if (dnnl_memory_create(slot, &md, be->engine, wk__cpu_buf_ptr(be, id)) != dnnl_success)
            *slot = NULL;
    }
    return *slot;
}

void wk__cpu_push_item(cpu_be_t *be, int batch, const cpu_item_t *it)
{
    cpu_list_t *l = &be->lists[batch];
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        l->items = sq_xrealloc(l->items, (size_t)l->cap * sizeof(*l->items));
    }
    l->items[l->n++] = *it;
}

/* The scratchpad memory object pd's primitive runs with (*out NULL: it
 * needs none). Every primitive that runs with the plan takes its scratchpad
 * from the caller (be->sp_attr): oneDNN's own is shared per thread and
 * would tie a primitive to the thread that created it, and a worker builds
 * models on its loader thread and runs them on its execution thread. The
 * objects all point at one buffer, sized for the largest, allocated once
 * the plan is complete (primitives of a plan run one at a time). */
dnnl_status_t wk__cpu_scratch_of(cpu_be_t *be, const_dnnl_primitive_desc_t pd, dnnl_memory_t *out)
{
    *out = NULL;
    const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    size_t bytes = md != NULL ? dnnl_memory_desc_get_size(md) : 0;
    if (bytes == 0)
        return dnnl_success;
    /* A size made at its first run fits the scratchpad its dry pass sized. */
    if (be->late && bytes > be->scratch_bytes)
        return dnnl_out_of_memory;
    dnnl_status_t st = dnnl_memory_create(out, md, be->engine, DNNL_MEMORY_NONE);
    if (st == dnnl_success && be->late)
        st = dnnl_memory_set_data_handle_v2(*out, be->scratch, be->stream);
    if (st != dnnl_success)
        return st;
    if (be->n_scratch == be->cap_scratch) {
        be->cap_scratch = be->cap_scratch ? 2 * be->cap_scratch : 16;
        be->scratch_mems =
            sq_xrealloc(be->scratch_mems, (size_t)be->cap_scratch * sizeof(*be->scratch_mems));
    }
    be->scratch_mems[be->n_scratch++] = *out;
    if (bytes > be->scratch_bytes && !be->late)
        be->scratch_bytes = bytes;
    return dnnl_success;
}

/* A dry pass (a size whose kernels are made at its first run): the
 * scratchpad grows to what pd's primitive will want, and the constants it
 * reads stay (release_unused_constants). */
void wk__cpu_scratch_grow(cpu_be_t *be, const_dnnl_primitive_desc_t pd)
{
    const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    size_t bytes = md != NULL ? dnnl_memory_desc_get_size(md) : 0;
    if (bytes > be->scratch_bytes)
        be->scratch_bytes = bytes;
}

static void dry_emit(cpu_be_t *be, const_dnnl_primitive_desc_t pd, const int *arg_bufs, int n_args)
{
    wk__cpu_scratch_grow(be, pd);
    for (int i = 0; i < n_args; i++)
        be->bufs[arg_bufs[i]].lazy_ref = true;
}

/* Creates the primitive of pd and queues it with args at batch (phase 2);
 * destroys pd in either phase. */
int wk__cpu_emit(wk_plan_t *plan, dnnl_primitive_desc_t pd, int batch, int step,
                 const int *arg_kinds, const int *arg_bufs, int n_args)
{
    cpu_be_t *be = plan->be;
    int rc = 0;
    if (be->phase == 2) {
        cpu_item_t it = {.step = step};
        dnnl_memory_t sp = NULL;
        const char *impl = NULL;
        if (batch == plan->graph->max_batch && !be->late &&
            dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success &&
            impl != NULL && strncmp(impl, "ref", 3) == 0) {
            be->n_ref_kernels++;
            SQ_WARN("cpu plan: step %d (%s) runs oneDNN's reference kernel %s", step,
                    wk_kernel_names[plan->graph->steps[step].kind], impl);
        }
        if (be->dry) {
            dry_emit(be, pd, arg_bufs, n_args);
            goto out;
        }
        DN(dnnl_primitive_create(&it.prim, pd));
        if (wk__cpu_scratch_of(be, pd, &sp) != dnnl_success) {
            dnnl_primitive_destroy(it.prim);
            rc = wk_fail(plan, SQ_NOMEM, "oneDNN scratchpad for step %d", step);
            goto out;
        }
        it.args = sq_xmalloc((size_t)(n_args + 1) * sizeof(*it.args));
        if (sp != NULL)
            it.args[it.n_args++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, sp};
        for (int i = 0; i < n_args; i++) {
            dnnl_memory_t m = wk__cpu_mem_of(plan, arg_bufs[i], batch);
            if (m == NULL) {
                dnnl_primitive_destroy(it.prim);
                free(it.args);
                rc = wk_fail(plan, SQ_NOMEM, "oneDNN memory object for step %d", step);
                goto out;
            }
            it.args[it.n_args++] = (dnnl_exec_arg_t){arg_kinds[i], m};
        }
        wk__cpu_push_item(be, batch, &it);
    }
out:
    dnnl_primitive_desc_destroy(pd);
    return rc;
}

/* Queues a reorder of buffer src into buffer dst (same dims). */
int wk__cpu_emit_reorder(wk_plan_t *plan, int batch, int step, int src, int dst)
{
    cpu_be_t *be = plan->be;
    int rc = 0;
    if (be->phase == 1)
        return 0;
    dnnl_memory_desc_t smd = wk__cpu_md_at(&be->bufs[src], batch),
                       dmd = wk__cpu_md_at(&be->bufs[dst], batch);
    dnnl_primitive_desc_t pd;
    DN(dnnl_reorder_primitive_desc_create(&pd, &smd, be->engine, &dmd, be->engine, be->sp_attr));
    if (batch == plan->graph->max_batch && !be->late)
        be->n_reorders++;
    rc = wk__cpu_emit(plan, pd, batch, step, (int[]){DNNL_ARG_FROM, DNNL_ARG_TO}, (int[]){src, dst},
                      2);
out:
    return rc;
}

/* Buffer id of a graph value: buffers 0..n_values-1 are the values. */
int wk__cpu_vbuf(int value)
{
    return value;
}

/* Reorders constant bytes src (layout smd) into a new buffer of layout dmd,
 * once, at plan time. Returns the buffer id or a negative SQ_* code. */
/* The bytes of a constant of plan->small (the same model's plan for the
 * batch sizes below Winograd's, whose convs other than Winograd's take
 * their weights in the same layouts as this plan's) equal to b's, or NULL:
 * those bytes then serve both plans (resnet50's weights were held twice). */
static float *small_twin(const wk_plan_t *plan, const cpu_buf_t *b, size_t bytes)
{
    const wk_plan_t *sm = plan->small;
    if (sm == NULL || sm->ops != plan->ops || sm->be == NULL)
        return NULL;
    const cpu_be_t *o = sm->be;
    for (int i = 0; i < o->n_bufs; i++) {
        const cpu_buf_t *c = &o->bufs[i];
        if (c->own_data != NULL && dnnl_memory_desc_equal(&c->md, &b->md) &&
            memcmp(c->own_data, b->own_data, bytes) == 0)
            return c->own_data;
    }
    return NULL;
}

void wk__cpu_share_twin(wk_plan_t *plan, int id)
{
    cpu_be_t *be = plan->be;
    cpu_buf_t *b = &be->bufs[id];
    float *twin = small_twin(plan, b, dnnl_memory_desc_get_size(&b->md));
    if (twin != NULL) {
        /* read only, and the small plan is freed after this one */
        free(b->own_data);
        b->own_data = NULL;
        b->data = twin;
    }
}

int wk__cpu_const_reorder(wk_plan_t *plan, const dnnl_memory_desc_t *smd, void *src,
                          const dnnl_memory_desc_t *dmd)
{
    cpu_be_t *be = plan->be;
    int rc = 0, id = wk__cpu_add_buf(be, dmd, false, -2, -2);
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
    wk__cpu_share_twin(plan, id);
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
int wk__cpu_as_layout(wk_plan_t *plan, int si, int batch, int v, const dnnl_memory_desc_t *want,
                      int *tmp)
{
    cpu_be_t *be = plan->be;
    int id = wk__cpu_vbuf(v);
    if (be->phase == 1) {
        if (dnnl_memory_desc_equal(&be->bufs[id].md, want))
            return id;
        if (be->bufs[id].data != NULL)
            return *tmp = wk__cpu_const_reorder(plan, &be->bufs[id].md, be->bufs[id].data, want);
        return *tmp = wk__cpu_add_buf(be, want, be->bufs[id].batched, si, si);
    }
    if (*tmp < 0)
        return id;
    if (be->bufs[*tmp].first != -2 && wk__cpu_emit_reorder(plan, batch, si, id, *tmp) != 0)
        return -1;
    return *tmp;
}

/* A view of buffer id with the bytes seen as md (same size, plain). */
int wk__cpu_view_buf(cpu_be_t *be, int id, const dnnl_memory_desc_t *md, bool batched)
{
    int v = wk__cpu_add_buf(be, md, batched, -2, -2);
    be->bufs[v].alias = id;
    return v;
}

int wk__cpu_as_plain(wk_plan_t *plan, int si, int batch, int v, int *tmp)
{
    cpu_be_t *be = plan->be;
    const wk_value_t *val = &plan->graph->values[v];
    dnnl_memory_desc_t p;
    wk__cpu_plain_md(&p, val->ndim, val->dims);
    if (be->phase == 2 && *tmp < 0)
        return wk__cpu_vbuf(v);
    return wk__cpu_as_layout(plan, si, batch, v, &p, tmp);
}

void wk__cpu_set_out_md(wk_plan_t *plan, int v, const dnnl_memory_desc_t *md)
{
    cpu_be_t *be = plan->be;
    cpu_buf_t *b = &be->bufs[wk__cpu_vbuf(v)];
    if (!b->decided) {
        b->md = *md;
        b->decided = true;
    }
}

void wk__cpu_set_out_plain(wk_plan_t *plan, int v)
{
    const wk_value_t *val = &plan->graph->values[v];
    dnnl_memory_desc_t md;
    wk__cpu_plain_md(&md, val->ndim, val->dims);
    wk__cpu_set_out_md(plan, v, &md);
}

/* oneDNN's eltwise for each activation: its algorithm, and its alpha and
 * beta, fixed or the step's (params). */
typedef struct {
    dnnl_alg_kind_t alg;
    enum {
        ACT_FIXED,      /* alpha, beta as below */
        ACT_ALPHA,      /* alpha: the step's alpha */
        ACT_ALPHA_BETA, /* alpha, beta: the step's */
        ACT_EXPONENT,   /* beta: the step's alpha (oneDNN's pow is alpha * x^beta) */
    } params;
    float alpha, beta;
} cpu_act_t;

static const cpu_act_t cpu_acts[] = {
    [WK_ACT_NONE] = {dnnl_alg_kind_undef, ACT_FIXED, 0, 0},
    [WK_ACT_RELU] = {dnnl_eltwise_relu, ACT_FIXED, 0, 0},
    [WK_ACT_LEAKY_RELU] = {dnnl_eltwise_relu, ACT_ALPHA, 0, 0},
    [WK_ACT_CLIP] = {dnnl_eltwise_clip, ACT_ALPHA_BETA, 0, 0},
    [WK_ACT_SIGMOID] = {dnnl_eltwise_logistic, ACT_FIXED, 0, 0},
    /* then clip(0, 1): wk__cpu_append_act, build_eltwise */
    [WK_ACT_HARDSIGMOID] = {dnnl_eltwise_linear, ACT_ALPHA_BETA, 0, 0},
    [WK_ACT_HARDSWISH] = {dnnl_eltwise_hardswish, ACT_FIXED, 0, 0},
    [WK_ACT_POW] = {dnnl_eltwise_pow, ACT_EXPONENT, 1.0f, 0},
    [WK_ACT_SQRT] = {dnnl_eltwise_sqrt, ACT_FIXED, 0, 0},
    [WK_ACT_GELU] = {dnnl_eltwise_gelu_erf, ACT_FIXED, 0, 0},
    [WK_ACT_TANH] = {dnnl_eltwise_tanh, ACT_FIXED, 0, 0},
    [WK_ACT_SWISH] = {dnnl_eltwise_swish, ACT_FIXED, 1.0f, 0}, /* x * sigmoid(alpha x) */
    [WK_ACT_NEG] = {dnnl_eltwise_linear, ACT_FIXED, -1.0f, 0}, /* alpha x + beta */
    [WK_ACT_EXP] = {dnnl_eltwise_exp, ACT_FIXED, 0, 0},
};
_Static_assert(sizeof(cpu_acts) / sizeof(cpu_acts[0]) == WK_ACT_COUNT_,
               "an activation without its oneDNN algorithm");
_Static_assert(WK_ACT_COUNT_ == 14, "a new activation (wk_acts.h): give it its entry in cpu_acts");

dnnl_alg_kind_t wk__cpu_act_alg(wk_act_kind_t k)
{
    return (unsigned)k < WK_ACT_COUNT_ ? cpu_acts[k].alg : dnnl_alg_kind_undef;
}

void wk__cpu_act_params(wk_act_t a, float *alpha, float *beta)
{
    const cpu_act_t *c = &cpu_acts[(unsigned)a.kind < WK_ACT_COUNT_ ? a.kind : WK_ACT_NONE];
    *alpha = c->params == ACT_ALPHA || c->params == ACT_ALPHA_BETA ? a.alpha : c->alpha;
    *beta = c->params == ACT_ALPHA_BETA ? a.beta : c->params == ACT_EXPONENT ? a.alpha : c->beta;
}

void wk__cpu_append_act(dnnl_post_ops_t po, wk_act_t a)
{
    float alpha, beta;
    wk__cpu_act_params(a, &alpha, &beta);
    dnnl_post_ops_append_eltwise(po, 1.0f, wk__cpu_act_alg(a.kind), alpha, beta);
    if (a.kind == WK_ACT_HARDSIGMOID)
        dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_clip, 0.0f, 1.0f);
}

/* The activations a BatchNorm step applies as post-ops
 * (wk_backend_ops_t.norm_act): those oneDNN's jit binary runs as eltwise
 * post-ops in one pass (densenet's ReLU after each pre-activation
 * BatchNorm), and the concat that takes its BatchNorm applies itself
 * (backend_cpu_move.c). */
bool wk__cpu_norm_act(wk_act_kind_t kind)
{
    return kind == WK_ACT_RELU || kind == WK_ACT_LEAKY_RELU || kind == WK_ACT_CLIP;
}

dnnl_alg_kind_t wk__cpu_bin_alg(wk_binop_t op)
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

/* Whether oneDNN fell back to its reference (unoptimized) kernel. */
bool wk__cpu_impl_is_ref(const_dnnl_primitive_desc_t pd)
{
    const char *impl = NULL;
    return dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) != dnnl_success ||
           impl == NULL || strncmp(impl, "ref", 3) == 0;
}

/* The plain layout of value v seen with `ndim` dims (leading 1s added). */
dnnl_memory_desc_t wk__cpu_plain_ranked(const wk_value_t *v, int batch, int ndim)
{
    int64_t dims[WK_MAX_DIMS];
    int n = wk_value_dims_at(v, batch, dims + (ndim - v->ndim));
    for (int i = 0; i < ndim - n; i++)
        dims[i] = 1;
    dnnl_memory_desc_t md;
    wk__cpu_plain_md(&md, ndim, dims);
    return md;
}

/* A plain 2-D or n-D view over a buffer, scaled with the batch through
 * batch_mult when its first dim is batch * something. */
int wk__cpu_plain_view(cpu_be_t *be, int id, int ndim, const int64_t *dims_max, bool batched,
                       int64_t batch_mult)
{
    dnnl_memory_desc_t md;
    wk__cpu_plain_md(&md, ndim, dims_max);
    int v = wk__cpu_view_buf(be, id, &md, batched);
    be->bufs[v].batch_mult = batch_mult;
    return v;
}
