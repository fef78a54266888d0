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
#include "backend_cpu_int.h"

#include <omp.h>

#include <assert.h>
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
static dnnl_status_t scratch_of(cpu_be_t *be, const_dnnl_primitive_desc_t pd, dnnl_memory_t *out)
{
    *out = NULL;
    const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    size_t bytes = md != NULL ? dnnl_memory_desc_get_size(md) : 0;
    if (bytes == 0)
        return dnnl_success;
    dnnl_status_t st = dnnl_memory_create(out, md, be->engine, DNNL_MEMORY_NONE);
    if (st != dnnl_success)
        return st;
    if (be->n_scratch == be->cap_scratch) {
        be->cap_scratch = be->cap_scratch ? 2 * be->cap_scratch : 16;
        be->scratch_mems =
            sq_xrealloc(be->scratch_mems, (size_t)be->cap_scratch * sizeof(*be->scratch_mems));
    }
    be->scratch_mems[be->n_scratch++] = *out;
    if (bytes > be->scratch_bytes)
        be->scratch_bytes = bytes;
    return dnnl_success;
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
        DN(dnnl_primitive_create(&it.prim, pd));
        if (scratch_of(be, pd, &sp) != dnnl_success) {
            dnnl_primitive_destroy(it.prim);
            rc = wk_fail(plan, SQ_NOMEM, "oneDNN scratchpad for step %d", step);
            goto out;
        }
        if (sp != NULL)
            it.args[it.n_args++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, sp};
        for (int i = 0; i < n_args; i++) {
            dnnl_memory_t m = wk__cpu_mem_of(plan, arg_bufs[i], batch);
            if (m == NULL) {
                dnnl_primitive_destroy(it.prim);
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

dnnl_alg_kind_t wk__cpu_act_alg(wk_act_kind_t k)
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

void wk__cpu_append_act(dnnl_post_ops_t po, wk_act_t a)
{
    float alpha =
        a.kind == WK_ACT_LEAKY_RELU || a.kind == WK_ACT_CLIP || a.kind == WK_ACT_HARDSIGMOID
            ? a.alpha
            : 0.0f;
    float beta = a.kind == WK_ACT_CLIP || a.kind == WK_ACT_HARDSIGMOID ? a.beta : 0.0f;
    dnnl_post_ops_append_eltwise(po, 1.0f, wk__cpu_act_alg(a.kind), alpha, beta);
    if (a.kind == WK_ACT_HARDSIGMOID)
        dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_clip, 0.0f, 1.0f);
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

static int do_step(wk_plan_t *plan, int si, int batch)
{
    switch (plan->graph->steps[si].kind) {
    case WK_K_CONV:
        return wk__cpu_do_conv(plan, si, batch);
    case WK_K_MAXPOOL:
    case WK_K_AVGPOOL:
    case WK_K_GLOBALAVG:
        return wk__cpu_do_pool(plan, si, batch);
    case WK_K_ELTWISE:
        return wk__cpu_do_eltwise(plan, si, batch);
    case WK_K_BINARY:
    case WK_K_BATCHNORM:
        return wk__cpu_do_binary(plan, si, batch);
    case WK_K_CONCAT:
        return wk__cpu_do_concat(plan, si, batch);
    case WK_K_SOFTMAX:
        return wk__cpu_do_softmax(plan, si, batch);
    case WK_K_GEMM:
        return wk__cpu_do_gemm(plan, si, batch);
    case WK_K_MATMUL:
        return wk__cpu_do_matmul(plan, si, batch);
    case WK_K_REDUCE_MEAN:
        return wk__cpu_do_reduce(plan, si, batch);
    case WK_K_COPY:
        return wk__cpu_do_copy(plan, si, batch);
    case WK_K_TRANSPOSE:
        return wk__cpu_do_transpose(plan, si, batch);
    case WK_K_PAD:
    case WK_K_SLICE:
        return wk__cpu_do_c_kernel(plan, si, batch);
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
    for (int i = 0; i < be->n_scratch; i++)
        dnnl_memory_destroy(be->scratch_mems[i]);
    free(be->scratch_mems);
    free(be->scratch);
    free(be->out_scratch);
    dnnl_primitive_attr_destroy(be->sp_attr);
    for (int i = 0; i < be->n_bufs; i++)
        free(be->bufs[i].own_data);
    free(be->bufs);
    for (int i = 0; be->steps != NULL && i < plan->graph->n_steps; i++)
        free(be->steps[i].wei_alt), free(be->steps[i].wino_at);
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

/* Constants that no primitive reads any more (weights reordered into
 * oneDNN's layout live in own_data) give their bytes back; those still read
 * count in the plan's memory. */
static void release_unused_constants(wk_plan_t *plan)
{
    cpu_be_t *be = plan->be;
    wk_graph_t *g = plan->graph;
    int mb = g->max_batch;
    bool *used = sq_xcalloc((size_t)g->n_values + 1, sizeof(bool));
    for (int b = 0; b < be->n_bufs; b++) {
        bool has_mem = false;
        for (int k = 0; k <= mb && !has_mem; k++)
            has_mem = be->mems[(size_t)b * (size_t)(mb + 1) + (size_t)k] != NULL;
        if (!has_mem)
            continue;
        int r = wk__cpu_root_buf(be, b);
        if (r < g->n_values)
            used[r] = true;
        for (int v = 0; v < g->n_values; v++)
            if (be->bufs[r].data != NULL && be->bufs[r].data == g->values[v].data)
                used[v] = true;
    }
    for (int v = 0; v < g->n_values; v++) {
        wk_value_t *val = &g->values[v];
        if (val->data == NULL)
            continue;
        if (used[v]) {
            plan->memory_bytes += (uint64_t)wk_value_elems(val) * sizeof(float);
            continue;
        }
        free(val->data);
        val->data = NULL;
        be->bufs[v].data = NULL;
    }
    free(used);
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
    DN(dnnl_primitive_attr_create(&be->sp_attr));
    DN(dnnl_primitive_attr_set_scratchpad_mode(be->sp_attr, dnnl_scratchpad_mode_user));
    for (int i = 0; i < g->n_values; i++) {
        const wk_value_t *v = &g->values[i];
        int first = v->is_input ? 0 : v->producer;
        int last = v->last_use > first ? v->last_use : first;
        int id = wk__cpu_add_buf(be, NULL, v->batched, first, last);
        if (v->data != NULL || v->producer == -2 || (!v->is_input && v->producer < 0)) {
            be->bufs[id].first = be->bufs[id].last = -2;
            be->bufs[id].data = v->data;
        }
        if (v->data != NULL || v->is_input) {
            dnnl_memory_desc_t md;
            wk__cpu_plain_md(&md, v->ndim, v->dims);
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
    be->out_scratch = sq_xcalloc((size_t)g->n_outputs * (size_t)(mb + 1), sizeof(dnnl_memory_t));
    for (int b = plan->min_batch > 1 ? plan->min_batch : 1; b <= mb; b++) {
        for (int si = 0; si < g->n_steps; si++)
            if ((rc = do_step(plan, si, b)) != 0)
                goto out;
        for (int o = 0; o < g->n_outputs; o++) {
            const wk_value_t *v = &g->values[g->outputs[o]];
            int64_t dims[WK_MAX_DIMS];
            wk_value_dims_at(v, b, dims);
            dnnl_memory_desc_t umd, smd = wk__cpu_md_at(&be->bufs[wk__cpu_vbuf(g->outputs[o])], b);
            wk__cpu_plain_md(&umd, v->ndim, dims);
            size_t k = (size_t)o * (size_t)(mb + 1) + (size_t)b;
            dnnl_primitive_desc_t pd;
            DN(dnnl_memory_create(&be->out_user[k], &umd, be->engine, DNNL_MEMORY_NONE));
            DN(dnnl_reorder_primitive_desc_create(&pd, &smd, be->engine, &umd, be->engine,
                                                  be->sp_attr));
            dnnl_status_t st = dnnl_primitive_create(&be->out_reorder[k], pd);
            if (st == dnnl_success)
                st = scratch_of(be, pd, &be->out_scratch[k]);
            dnnl_primitive_desc_destroy(pd);
            DN(st);
            if (wk__cpu_mem_of(plan, wk__cpu_vbuf(g->outputs[o]), b) == NULL) {
                rc = wk_fail(plan, SQ_NOMEM, "output memory object");
                goto out;
            }
        }
    }
    if (be->scratch_bytes > 0) {
        size_t n = (be->scratch_bytes + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
        if ((be->scratch = aligned_alloc(ARENA_ALIGN, n)) == NULL) {
            rc = wk_fail(plan, SQ_NOMEM, "scratchpad of %zu bytes", be->scratch_bytes);
            goto out;
        }
        plan->memory_bytes += n;
        for (int i = 0; i < be->n_scratch; i++)
            DN(dnnl_memory_set_data_handle_v2(be->scratch_mems[i], be->scratch, be->stream));
    }
    release_unused_constants(plan);
out:
    if (rc != 0)
        cpu_release(plan);
    return rc;
}

static float *cpu_input_buffer(wk_plan_t *plan, int index)
{
    return wk__cpu_buf_ptr(plan->be, wk__cpu_vbuf(plan->graph->inputs[index]));
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
        const float *src = wk__cpu_buf_ptr(be, be->steps[it->step].bias);
        float *dst = wk__cpu_buf_ptr(be, wk__cpu_vbuf(s->out));
        if (s->kind == WK_K_PAD)
            wk__cpu_run_pad(s, &g->values[s->in[0]], &g->values[s->out], batch, src, dst);
        else
            wk__cpu_run_slice(s, &g->values[s->in[0]], &g->values[s->out], batch, src, dst);
    }
    for (int o = 0; o < g->n_outputs; o++) {
        size_t k = (size_t)o * (size_t)(mb + 1) + (size_t)batch;
        DN(dnnl_memory_set_data_handle_v2(be->out_user[k], outputs[o], be->stream));
        dnnl_exec_arg_t args[3] = {
            {DNNL_ARG_FROM, wk__cpu_mem_of(plan, wk__cpu_vbuf(g->outputs[o]), batch)},
            {DNNL_ARG_TO, be->out_user[k]},
            {DNNL_ARG_SCRATCHPAD, be->out_scratch[k]}};
        DN(dnnl_primitive_execute(be->out_reorder[k], be->stream, be->out_scratch[k] ? 3 : 2,
                                  args));
    }
    DN(dnnl_stream_wait(be->stream));
out:
    return rc;
}

/* Points every memory object over input `index`'s bytes (the input and its
 * views) at ptr for runs at `batch`, or back at the arena. The C kernels
 * address the arena directly, so a plan that runs one at this batch copies
 * instead. */
static int cpu_bind_input(wk_plan_t *plan, int index, int batch, const float *ptr)
{
    cpu_be_t *be = plan->be;
    int mb = plan->graph->max_batch, rc = 0;
    const cpu_list_t *l = &be->lists[batch];
    for (int i = 0; i < l->n; i++)
        if (l->items[i].prim == NULL)
            return SQ_UNSUPPORTED_MODEL;
    int root = wk__cpu_vbuf(plan->graph->inputs[index]);
    for (int id = 0; id < be->n_bufs; id++) {
        dnnl_memory_t m = be->mems[(size_t)id * (size_t)(mb + 1) + (size_t)batch];
        if (m == NULL || wk__cpu_root_buf(be, id) != root)
            continue;
        void *h = ptr != NULL ? (void *)ptr : wk__cpu_buf_ptr(be, id);
        DN(dnnl_memory_set_data_handle_v2(m, h, be->stream));
    }
out:
    return rc;
}

const wk_backend_ops_t wk_backend_cpu = {
    .kind = SQ_DEV_CPU,
    .prepare = cpu_prepare,
    .input_buffer = cpu_input_buffer,
    .run = cpu_run,
    .release = cpu_release,
    .bind_input = cpu_bind_input,
};
