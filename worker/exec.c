/* The executor's public face: plans, runs, and the pixel path (uint8 HWC
 * to normalized FP32 NCHW or NHWC), shared by every backend. */
#include "wk_exec_int.h"

#include <mdb_graph.h>
#include <sq.h>

#include <assert.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const wk_backend_ops_t *backend_ops(sq_dev_kind_t kind)
{
    switch (kind) {
    case SQ_DEV_CPU:
        return &wk_backend_cpu;
    case SQ_DEV_EMU:
        return &wk_backend_emu;
    case SQ_DEV_CUDA:
        return wk__cuda_ops();
    default:
        return NULL;
    }
}

int wk_backend_built(sq_dev_kind_t kind)
{
    return backend_ops(kind) != NULL;
}

wk_plan_opts_t wk_plan_opts_default(void)
{
    return (wk_plan_opts_t){
        .backend = SQ_DEV_CPU,
        .max_batch = 1,
        .pixel_norm = WK_PIXEL_NORM_IMAGENET,
    };
}

/* Every output's buffer at max batch, for the runs into rows. */
static int alloc_row_scratch(wk_plan_t *p)
{
    const wk_graph_t *g = p->graph;
    int64_t total = 0;
    for (int i = 0; i < g->n_outputs; i++)
        total += wk_value_elems(&g->values[g->outputs[i]]);
    p->out_scratch = malloc((size_t)total * sizeof(float) + 1);
    if (p->out_scratch == NULL)
        return wk_fail(p, SQ_NOMEM, "output staging of %lld floats", (long long)total);
    p->out_ptrs = sq_xcalloc((size_t)g->n_outputs, sizeof(*p->out_ptrs));
    int64_t at = 0;
    for (int i = 0; i < g->n_outputs; i++) {
        p->out_ptrs[i] = p->out_scratch + at;
        at += wk_value_elems(&g->values[g->outputs[i]]);
    }
    return 0;
}

int wk_plan_from_graph(wk_graph_t *g, const wk_plan_opts_t *opts, wk_plan_t **out, char *why,
                       int why_size)
{
    *out = NULL;
    const wk_backend_ops_t *ops = backend_ops(opts->backend);
    if (ops == NULL) {
        snprintf(why, (size_t)why_size, "this build has no %s backend",
                 sq_dev_kind_name(opts->backend));
        wk_graph_free(g);
        return SQ_DEVICE;
    }
    if (opts->backend == SQ_DEV_EMU &&
        (opts->emu_latency_us == NULL || opts->emu_n_latency < g->max_batch)) {
        snprintf(why, (size_t)why_size, "emulated plan needs l(b) for b = 1..%d", g->max_batch);
        wk_graph_free(g);
        return SQ_INVAL;
    }
    int rc = wk_graph_finish(g, why, why_size);
    if (rc != 0) {
        wk_graph_free(g);
        return rc;
    }
    wk_graph_fuse(g, ops->conv_act, ops->conv_add_after_act, ops->norm_act);
    /* Depthwise convs fused into the 1x1 before them where the backend
     * says so at max batch; batch 1 then runs the graph as it was (cpu:
     * mobilenet_v2 at batch 1 ran 10-20% slower fused, in the plan for
     * max batch 8 where batch 8 gained). */
    wk_graph_t *unfused = NULL;
    if (g->max_batch > 1)
        wk_graph_fuse_dw(g, ops->conv_dw, &unfused);
    /* A backend that would run larger batches otherwise (cpu: Winograd
     * from some batch size up) gives the sizes below a plan of their own,
     * whose layouts suit them (googlenet at batch 1: 18 ms instead of 28 in
     * the layouts Winograd wants). */
    wk_plan_t *small = NULL;
    int split = ops->split_batch != NULL ? ops->split_batch(g) : 0;
    if (unfused != NULL && split < 2)
        split = 2;
    if (split > 1) {
        wk_plan_opts_t so = *opts;
        so.max_batch = split - 1;
        char sub[256];
        if (wk_plan_from_graph(wk_graph_clone(unfused != NULL ? unfused : g, split - 1), &so,
                               &small, sub, sizeof(sub)) != 0) {
            SQ_DEBUG("no separate plan for small batches: %s", sub);
            small = NULL;
        }
    }
    wk_graph_free(unfused);
    wk_plan_t *p = sq_xcalloc(1, sizeof(*p));
    p->min_batch = small != NULL ? split : 1;
    p->small = small;
    p->opts = *opts;
    p->opts.max_batch = g->max_batch;
    if (opts->emu_latency_us != NULL && opts->emu_n_latency > 0) {
        p->emu_latency_us = sq_xmalloc(sizeof(int64_t) * (size_t)opts->emu_n_latency);
        memcpy(p->emu_latency_us, opts->emu_latency_us,
               sizeof(int64_t) * (size_t)opts->emu_n_latency);
        p->opts.emu_latency_us = p->emu_latency_us;
    }
    p->graph = g;
    p->ops = ops;
    int64_t t0 = sq_now_ns();
    if ((rc = ops->prepare(p)) != 0) {
        snprintf(why, (size_t)why_size, "%s", p->why);
        ops->release(p);
        wk_graph_free(g);
        wk_plan_free(p->small);
        free(p->emu_latency_us);
        free(p);
        return rc;
    }
    if (g->n_outputs > 1 && (rc = alloc_row_scratch(p)) != 0) {
        snprintf(why, (size_t)why_size, "%s", p->why);
        wk_plan_free(p);
        return rc;
    }
    SQ_DEBUG("plan ready backend=%s steps=%d max_batch=%d memory_mb=%.1f prepare_ms=%.1f",
             sq_dev_kind_name(ops->kind), g->n_steps, g->max_batch,
             (double)wk_plan_memory_bytes(p) / (1 << 20), (double)(sq_now_ns() - t0) / 1e6);
    *out = p;
    return 0;
}

static void release_each(wk_plan_t *plan)
{
    (void)plan;
}

/* The holder of per-size plans runs nothing itself (every run goes to
 * each[batch] first). */
static const wk_backend_ops_t each_ops = {.release = release_each};

/* Every input at max batch in one buffer, for the batches that run padded
 * in a larger plan (wk_plan_t.each); its size in *bytes. */
static int alloc_in_scratch(wk_plan_t *p, size_t *bytes)
{
    const wk_graph_t *g = p->graph;
    int64_t total = 0;
    for (int i = 0; i < g->n_inputs; i++)
        total += wk_value_elems(&g->values[g->inputs[i]]);
    p->in_scratch = calloc((size_t)total + 1, sizeof(float));
    if (p->in_scratch == NULL)
        return wk_fail(p, SQ_NOMEM, "input staging of %lld floats", (long long)total);
    p->in_ptrs = sq_xcalloc((size_t)g->n_inputs, sizeof(*p->in_ptrs));
    int64_t at = 0;
    for (int i = 0; i < g->n_inputs; i++) {
        p->in_ptrs[i] = p->in_scratch + at;
        at += wk_value_elems(&g->values[g->inputs[i]]);
    }
    *bytes = (size_t)total * sizeof(float);
    return 0;
}

/* Whether a holder of plans per batch size plans size b for max batch mb:
 * the powers of two below it, and mb itself. */
static bool planned_size(int b, int mb)
{
    return b == mb || (b & (b - 1)) == 0;
}

/* Static plans for a graph that merges the batch into other dimensions
 * (ViT's attention: [N * heads, tokens, d]); the batch bound to s makes
 * every shape static, and the importer checked that items stay apart
 * (mdb_graph_items_apart), so a batch padded with zeroed items gives its
 * own items' outputs unchanged. Each plan holds its own copy of the
 * weights: planning only 1, 2, 4, ... and max_batch keeps that to
 * ceil(log2(max_batch)) + 1 copies (vit_b_16 at max batch 32: 6, not 32),
 * at the cost of running a batch of b in the time of the next planned
 * size, which the profile's l(b) measures. */
static int plan_each_size(const struct mdb_graph *graph, const wk_plan_opts_t *opts,
                          wk_plan_t **out, char *why, int why_size)
{
    int mb = opts->max_batch, rc = 0, n_each = 0;
    wk_plan_t **each = sq_xcalloc((size_t)mb + 1, sizeof(*each));
    for (int b = 1; b <= mb && rc == 0; b++) {
        if (!planned_size(b, mb))
            continue;
        wk_plan_opts_t o = *opts;
        o.max_batch = 1;
        o.static_batch = b;
        wk_graph_t *g;
        char sub[400];
        rc = wk_lower(graph, opts->backend, 1, b, &g, sub, sizeof(sub));
        if (rc == 0)
            rc = wk_plan_from_graph(g, &o, &each[b], sub, sizeof(sub));
        if (rc != 0) {
            snprintf(why, (size_t)why_size, "%s (the plan for batch %d)", sub, b);
        } else {
            n_each++;
        }
    }
    wk_graph_t *g = wk_graph_new(mb);
    for (int i = 0; rc == 0 && i < 2; i++) {
        const wk_graph_t *one = each[1]->graph;
        int n = i == 0 ? one->n_inputs : one->n_outputs;
        for (int k = 0; k < n; k++) {
            const wk_value_t *v = &one->values[i == 0 ? one->inputs[k] : one->outputs[k]];
            const mdb_tensor_t *t = &graph->tensors[i == 0 ? graph->inputs[k] : graph->outputs[k]];
            bool batched = t->shape.rank > 0 && t->shape.dims[0] == MDB_DIM_BATCH;
            if (i == 0) {
                wk_graph_input(g, v->name, v->ndim, v->dims, batched);
            } else {
                int id = wk_graph_value(g, v->name, v->ndim, v->dims, batched, NULL);
                wk_graph_mark_output(g, id);
            }
        }
    }
    wk_plan_t *p = sq_xcalloc(1, sizeof(*p));
    p->min_batch = 1;
    p->each = each;
    p->n_each = n_each;
    p->opts = *opts;
    p->graph = g;
    p->ops = &each_ops;
    size_t in_bytes = 0;
    if (rc == 0)
        rc = alloc_row_scratch(p);
    if (rc == 0)
        rc = alloc_in_scratch(p, &in_bytes);
    if (rc != 0) {
        if (why[0] == '\0')
            snprintf(why, (size_t)why_size, "%s", p->why);
        wk_plan_free(p);
        return rc;
    }
    int64_t out_elems = 0;
    for (int i = 0; i < g->n_outputs; i++)
        out_elems += wk_value_elems(&g->values[g->outputs[i]]);
    p->memory_bytes = in_bytes + (uint64_t)out_elems * sizeof(float);
    SQ_DEBUG("plans per batch size ready backend=%s max_batch=%d plans=%d memory_mb=%.1f",
             sq_dev_kind_name(opts->backend), mb, n_each,
             (double)wk_plan_memory_bytes(p) / (1 << 20));
    *out = p;
    return 0;
}

static uint64_t memory_or_0(const wk_plan_t *plan)
{
    return plan != NULL ? wk_plan_memory_bytes(plan) : 0;
}

int wk_plan_create(const struct mdb_graph *graph, const wk_plan_opts_t *opts, wk_plan_t **out,
                   char *why, int why_size)
{
    *out = NULL;
    if (opts->max_batch < 1) {
        snprintf(why, (size_t)why_size, "max_batch must be >= 1");
        return SQ_INVAL;
    }
    if (graph->batch_fixed <= 0 && opts->static_batch <= 0 && !mdb_graph_batch_outermost(graph)) {
        /* what the importer refused, refused here too */
        int rc = mdb_graph_items_apart(graph, NULL, why, (size_t)why_size);
        if (rc != 0)
            return rc;
        why[0] = '\0';
        return plan_each_size(graph, opts, out, why, why_size);
    }
    wk_graph_t *g;
    int64_t fixed = graph->batch_fixed > 0 ? graph->batch_fixed : opts->static_batch;
    int rc = wk_lower(graph, opts->backend, opts->max_batch, fixed, &g, why, why_size);
    if (rc != 0)
        return rc;
    return wk_plan_from_graph(g, opts, out, why, why_size);
}

int wk_plan_create_emulated(const int64_t in_chw[3], int64_t out_classes,
                            const wk_plan_opts_t *opts, wk_plan_t **out, char *why, int why_size)
{
    *out = NULL;
    if (opts->backend != SQ_DEV_EMU || opts->max_batch < 1 || out_classes < 1) {
        snprintf(why, (size_t)why_size,
                 "an emulated model needs the emu backend, max_batch >= 1 "
                 "and at least one class");
        return SQ_INVAL;
    }
    int64_t slots = opts->emu_det_slots;
    if (slots < 0 || (slots > 0 && (out_classes != 5 * slots || !(opts->emu_det_mean >= 0) ||
                                    opts->emu_det_mean > (double)slots))) {
        snprintf(why, (size_t)why_size,
                 "an emulated detector of %lld slots needs 5 floats a slot (got %lld) and a "
                 "mean of 0..%lld detections",
                 (long long)slots, (long long)out_classes, (long long)slots);
        return SQ_INVAL;
    }
    wk_graph_t *g = wk_graph_new(opts->max_batch);
    int64_t in_dims[4] = {1, in_chw[0], in_chw[1], in_chw[2]};
    int x = wk_graph_input(g, "input", 4, in_dims, true);
    /* The graph of an emulated model is a stand-in: never computed. */
    if (slots == 0) {
        int64_t out_dims[2] = {1, out_classes};
        int y = wk_graph_value(g, "output", 2, out_dims, true, NULL);
        wk_graph_step(g, WK_K_GLOBALAVG, &x, 1, y);
        wk_graph_mark_output(g, y);
    } else {
        int64_t box_dims[3] = {1, slots, 4}, score_dims[2] = {1, slots};
        int boxes = wk_graph_value(g, "boxes", 3, box_dims, true, NULL);
        int scores = wk_graph_value(g, "scores", 2, score_dims, true, NULL);
        wk_graph_step(g, WK_K_GLOBALAVG, &x, 1, boxes);
        wk_graph_step(g, WK_K_GLOBALAVG, &x, 1, scores);
        wk_graph_mark_output(g, boxes);
        wk_graph_mark_output(g, scores);
    }
    return wk_plan_from_graph(g, opts, out, why, why_size);
}

/* ---- arenas shared by the plans of one device ----------------------------
 *
 * A device runs one batch at a time, so the plans of the models it holds
 * need one arena of activations and one scratchpad between them, each the
 * size of the largest plan's. A plan joins on the thread that runs the
 * batches, between batches; it was made (and may have run) in its own,
 * which it then gives back. When the largest leaves, the pages past the
 * others' extent are given back; the mapping stays. */
struct wk_arena {
    char *act;
    void *scratch;
    size_t act_bytes, scratch_bytes; /* mapped */
    wk_plan_t **leaves;              /* the plans running in it */
    int n, cap;
};

wk_arena_t *wk_arena_new(void)
{
    return sq_xcalloc(1, sizeof(wk_arena_t));
}

void wk_arena_free(wk_arena_t *a)
{
    if (a == NULL)
        return;
    assert(a->n == 0);
    wk__region_free(a->act, a->act_bytes);
    wk__region_free(a->scratch, a->scratch_bytes);
    free(a->leaves);
    free(a);
}

uint64_t wk_arena_bytes(const wk_arena_t *a)
{
    return (uint64_t)a->act_bytes + a->scratch_bytes;
}

uint64_t wk_arena_resident_bytes(const wk_arena_t *a)
{
    return wk__region_resident(a->act, 0, a->act_bytes) +
           wk__region_resident(a->scratch, 0, a->scratch_bytes);
}

int wk_arena_n_plans(const wk_arena_t *a)
{
    return a->n;
}

/* The plans that run in an arena of their own: plan, its plan for small
 * batches and its plans per batch size, each counted once. */
static int collect_leaves(wk_plan_t *plan, wk_plan_t **out, int n)
{
    if (plan == NULL)
        return n;
    if (plan->ops->arena_need != NULL && plan->be != NULL)
        out[n++] = plan;
    n = collect_leaves(plan->small, out, n);
    for (int b = 1; plan->each != NULL && b <= plan->opts.max_batch; b++)
        n = collect_leaves(plan->each[b], out, n);
    return n;
}

static int count_leaves(const wk_plan_t *plan)
{
    if (plan == NULL)
        return 0;
    int n = plan->ops->arena_need != NULL && plan->be != NULL;
    n += count_leaves(plan->small);
    for (int b = 1; plan->each != NULL && b <= plan->opts.max_batch; b++)
        n += count_leaves(plan->each[b]);
    return n;
}

/* Maps an arena of act and scratch bytes, every plan in it moved there. */
static int arena_grow(wk_arena_t *a, size_t act, size_t scratch, char *why, int why_size)
{
    char *new_act = act > a->act_bytes ? wk__region_alloc(act) : a->act;
    void *new_scratch = scratch > a->scratch_bytes ? wk__region_alloc(scratch) : a->scratch;
    if ((act > a->act_bytes && new_act == NULL) ||
        (scratch > a->scratch_bytes && new_scratch == NULL)) {
        if (new_act != a->act)
            wk__region_free(new_act, act);
        if (new_scratch != a->scratch)
            wk__region_free(new_scratch, scratch);
        snprintf(why, (size_t)why_size, "a shared arena of %zu + %zu bytes", act, scratch);
        return SQ_NOMEM;
    }
    for (int i = 0; i < a->n; i++) {
        if (a->leaves[i]->ops->arena_use(a->leaves[i], new_act, new_scratch) != 0) {
            /* a oneDNN memory object that cannot move: not seen */
            snprintf(why, (size_t)why_size, "moving a plan to the grown arena: %s",
                     a->leaves[i]->why);
            return SQ_INTERNAL;
        }
    }
    if (new_act != a->act) {
        wk__region_free(a->act, a->act_bytes);
        a->act = new_act;
        a->act_bytes = act;
    }
    if (new_scratch != a->scratch) {
        wk__region_free(a->scratch, a->scratch_bytes);
        a->scratch = new_scratch;
        a->scratch_bytes = scratch;
    }
    return 0;
}

int wk_plan_share_arena(wk_plan_t *plan, wk_arena_t *a, char *why, int why_size)
{
    int n = count_leaves(plan);
    if (n == 0 || plan->shared != NULL)
        return 0;
    wk_plan_t **leaves = sq_xcalloc((size_t)n, sizeof(*leaves));
    collect_leaves(plan, leaves, 0);
    size_t act = a->act_bytes, scratch = a->scratch_bytes;
    for (int i = 0; i < n; i++) {
        size_t s = 0, x = leaves[i]->ops->arena_need(leaves[i], &s);
        act = x > act ? x : act;
        scratch = s > scratch ? s : scratch;
    }
    int rc = arena_grow(a, act, scratch, why, why_size);
    for (int i = 0; i < n && rc == 0; i++) {
        if (leaves[i]->ops->arena_use(leaves[i], a->act, a->scratch) != 0) {
            snprintf(why, (size_t)why_size, "moving the plan to the shared arena: %s",
                     leaves[i]->why);
            rc = SQ_INTERNAL;
        }
        if (a->n == a->cap) {
            a->cap = a->cap ? 2 * a->cap : 16;
            a->leaves = sq_xrealloc(a->leaves, (size_t)a->cap * sizeof(*a->leaves));
        }
        a->leaves[a->n++] = leaves[i];
        leaves[i]->shared = a;
    }
    if (rc == 0)
        plan->shared = a;
    free(leaves);
    return rc;
}

/* Takes plan (and its sub-plans) out of the arena it shares; the pages
 * past what the others use are given back. */
static void arena_leave(wk_plan_t *plan)
{
    wk_arena_t *a = plan->shared;
    if (a == NULL)
        return;
    plan->shared = NULL;
    bool was_leaf = false;
    for (int i = 0; i < a->n; i++) {
        if (a->leaves[i] == plan) {
            a->leaves[i] = a->leaves[--a->n];
            was_leaf = true;
            break;
        }
    }
    if (!was_leaf)
        return;
    size_t act = 0, scratch = 0;
    for (int i = 0; i < a->n; i++) {
        size_t s = 0, x = a->leaves[i]->ops->arena_need(a->leaves[i], &s);
        act = x > act ? x : act;
        scratch = s > scratch ? s : scratch;
    }
    wk__region_trim(a->act, act, a->act_bytes);
    wk__region_trim(a->scratch, scratch, a->scratch_bytes);
}

void wk_plan_free(wk_plan_t *plan)
{
    if (plan == NULL)
        return;
    arena_leave(plan);
    plan->ops->release(plan);
    wk_graph_free(plan->graph);
    wk_plan_free(plan->small);
    for (int b = 1; plan->each != NULL && b <= plan->opts.max_batch; b++)
        wk_plan_free(plan->each[b]);
    free(plan->each);
    free(plan->emu_latency_us);
    free(plan->out_scratch);
    free(plan->out_ptrs);
    free(plan->in_scratch);
    free(plan->in_ptrs);
    free(plan);
}

const char *wk_plan_errmsg(const wk_plan_t *plan)
{
    return plan->why;
}

int wk_plan_max_batch(const wk_plan_t *plan)
{
    return plan->graph->max_batch;
}

wk_precision_t wk_plan_precision(const wk_plan_t *plan)
{
    if (plan->each != NULL)
        return wk_plan_precision(plan->each[1]);
    return plan->ops->precision != NULL ? plan->ops->precision(plan) : WK_PRECISION_FP32;
}

sq_dev_kind_t wk_plan_backend(const wk_plan_t *plan)
{
    return plan->opts.backend;
}

int wk_plan_sizes_ready(const wk_plan_t *plan)
{
    if (plan->each != NULL)
        return plan->opts.max_batch; /* every size runs in a planned one */
    int n = plan->small != NULL ? wk_plan_sizes_ready(plan->small) : 0;
    if (plan->ops->sizes_ready != NULL && plan->be != NULL)
        return n + plan->ops->sizes_ready(plan);
    return n + plan->graph->max_batch - (plan->min_batch > 1 ? plan->min_batch - 1 : 0);
}

void wk_plan_keep_sizes(wk_plan_t *plan, int upto)
{
    if (plan->each != NULL)
        return; /* a plan per planned size, each holding one */
    if (plan->small != NULL)
        wk_plan_keep_sizes(plan->small, upto);
    if (plan->ops->keep_sizes != NULL && plan->be != NULL)
        plan->ops->keep_sizes(plan, upto);
}

uint64_t wk_plan_memory_bytes(const wk_plan_t *plan)
{
    uint64_t bytes = plan->memory_bytes + memory_or_0(plan->small);
    if (plan->ops->resident != NULL && plan->be != NULL)
        bytes += plan->ops->resident(plan);
    for (int b = 1; plan->each != NULL && b <= plan->opts.max_batch; b++)
        bytes += memory_or_0(plan->each[b]);
    return bytes;
}

int wk_plan_n_inputs(const wk_plan_t *plan)
{
    return plan->graph->n_inputs;
}

int wk_plan_n_outputs(const wk_plan_t *plan)
{
    return plan->graph->n_outputs;
}

static int item_shape(const wk_value_t *v, int64_t dims[8])
{
    int skip = v->batched ? 1 : 0;
    for (int d = skip; d < v->ndim; d++)
        dims[d - skip] = v->dims[d];
    return v->ndim - skip;
}

int wk_plan_input_shape(const wk_plan_t *plan, int index, int64_t dims[8])
{
    return item_shape(&plan->graph->values[plan->graph->inputs[index]], dims);
}

int wk_plan_output_shape(const wk_plan_t *plan, int index, int64_t dims[8])
{
    return item_shape(&plan->graph->values[plan->graph->outputs[index]], dims);
}

int64_t wk_plan_input_elems(const wk_plan_t *plan, int index)
{
    return wk_value_elems_at(&plan->graph->values[plan->graph->inputs[index]], 1);
}

int64_t wk_plan_output_elems(const wk_plan_t *plan, int index)
{
    return wk_value_elems_at(&plan->graph->values[plan->graph->outputs[index]], 1);
}

int64_t wk_plan_row_elems(const wk_plan_t *plan)
{
    int64_t n = 0;
    for (int i = 0; i < plan->graph->n_outputs; i++)
        n += wk_plan_output_elems(plan, i);
    return n;
}

int64_t wk_plan_last_run_ns(const wk_plan_t *plan)
{
    return plan->last_run_ns;
}

/* Whether batch runs in the plan for small batches; after the run, its
 * time and error message are the plan's. */
static bool runs_small(const wk_plan_t *plan, int batch)
{
    return plan->small != NULL && batch >= 1 && batch < plan->min_batch;
}

static int from_small(wk_plan_t *plan, int rc)
{
    plan->last_run_ns = plan->small->last_run_ns;
    if (rc != 0)
        snprintf(plan->why, sizeof(plan->why), "%s", plan->small->why);
    return rc;
}

/* The plan of a holder of plans per batch size (wk_plan_t.each) that runs
 * batch: the smallest planned size >= batch, in *size. NULL when plan
 * holds none or batch is out of range (check_batch then says so). */
static wk_plan_t *runs_each(const wk_plan_t *plan, int batch, int *size)
{
    if (plan->each == NULL || batch < 1 || batch > plan->opts.max_batch)
        return NULL;
    int s = batch;
    while (plan->each[s] == NULL)
        s++;
    *size = s;
    return plan->each[s];
}

static int from_each(wk_plan_t *plan, wk_plan_t *sub, int rc)
{
    plan->last_run_ns = sub->last_run_ns;
    if (rc != 0)
        snprintf(plan->why, sizeof(plan->why), "%s", sub->why);
    return rc;
}

/* Zeroes items batch..size-1 of every batched input in the holder's
 * scratch: a smaller batch run in a larger plan leaves no earlier batch's
 * items there. */
static void zero_padding(wk_plan_t *plan, int batch, int size)
{
    const wk_graph_t *g = plan->graph;
    for (int i = 0; i < g->n_inputs; i++) {
        const wk_value_t *v = &g->values[g->inputs[i]];
        size_t per = (size_t)wk_value_elems_at(v, 1);
        if (v->batched)
            memset(plan->in_ptrs[i] + (size_t)batch * per, 0,
                   (size_t)(size - batch) * per * sizeof(float));
    }
}

/* Runs batch items in sub, the holder's plan for size >= batch, each output
 * whole (size items) into plan->out_ptrs. inputs hold batch items each;
 * with batch < size they are copied into the holder's scratch and the items
 * up to size zeroed, so the plan reads no more of the caller's than it
 * gave. inputs == plan->in_ptrs: already there (the pixel path). */
static int run_each_scratch(wk_plan_t *plan, wk_plan_t *sub, int batch, int size,
                            const float *const *inputs, bool inplace)
{
    const wk_graph_t *g = plan->graph;
    if (batch < size && inputs != (const float *const *)plan->in_ptrs) {
        for (int i = 0; i < g->n_inputs; i++) {
            const wk_value_t *v = &g->values[g->inputs[i]];
            memcpy(plan->in_ptrs[i], inputs[i],
                   (size_t)wk_value_elems_at(v, batch) * sizeof(float));
        }
        inputs = (const float *const *)plan->in_ptrs;
    }
    if (batch < size)
        zero_padding(plan, batch, size);
    int rc = inplace ? wk__plan_run_inplace(sub, 1, inputs, plan->out_ptrs)
                     : wk_plan_run(sub, 1, inputs, plan->out_ptrs);
    return from_each(plan, sub, rc);
}

/* The first batch items of each output in plan->out_ptrs to outputs[i]
 * (an output without the batch: whole). */
static void copy_outputs(const wk_plan_t *plan, int batch, float *const *outputs)
{
    const wk_graph_t *g = plan->graph;
    for (int i = 0; i < g->n_outputs; i++) {
        const wk_value_t *v = &g->values[g->outputs[i]];
        memcpy(outputs[i], plan->out_ptrs[i], (size_t)wk_value_elems_at(v, batch) * sizeof(float));
    }
}

/* Runs a holder's batch in sub, its plan for size >= batch: directly when
 * the sizes match, else padded through the holder's scratch, the first
 * batch items of each output copied out. */
static int run_each(wk_plan_t *plan, wk_plan_t *sub, int batch, int size,
                    const float *const *inputs, float *const *outputs, bool inplace)
{
    if (batch == size)
        return from_each(plan, sub,
                         inplace ? wk__plan_run_inplace(sub, 1, inputs, outputs)
                                 : wk_plan_run(sub, 1, inputs, outputs));
    int rc = run_each_scratch(plan, sub, batch, size, inputs, inplace);
    if (rc == 0)
        copy_outputs(plan, batch, outputs);
    return rc;
}

/* Item b's row, out + b * row_elems, gets its slice of each output in
 * plan->out_ptrs in turn; an output without the batch is the same for
 * every item and copied whole into each row. */
static void rows_from_outputs(const wk_plan_t *plan, int batch, float *out)
{
    const wk_graph_t *g = plan->graph;
    size_t row = (size_t)wk_plan_row_elems(plan), at = 0;
    for (int i = 0; i < g->n_outputs; i++) {
        const wk_value_t *v = &g->values[g->outputs[i]];
        size_t per = (size_t)wk_value_elems_at(v, 1);
        for (int b = 0; b < batch; b++)
            memcpy(out + (size_t)b * row + at,
                   plan->out_ptrs[i] + (v->batched ? (size_t)b * per : 0), per * sizeof(float));
        at += per;
    }
}

static int check_batch(wk_plan_t *plan, int batch)
{
    if (batch < 1 || batch > plan->graph->max_batch)
        return wk_fail(plan, SQ_INVAL, "batch %d outside 1..%d", batch, plan->graph->max_batch);
    return 0;
}

static int run_backend(wk_plan_t *plan, int batch, float *const *outputs)
{
    int64_t t0 = sq_now_ns();
    int rc = plan->ops->run(plan, batch, outputs);
    plan->last_run_ns = sq_now_ns() - t0;
    return rc;
}

int wk_plan_run(wk_plan_t *plan, int batch, const float *const *inputs, float *const *outputs)
{
    int size = 0;
    wk_plan_t *sub = runs_each(plan, batch, &size);
    if (sub != NULL)
        return run_each(plan, sub, batch, size, inputs, outputs, false);
    if (runs_small(plan, batch))
        return from_small(plan, wk_plan_run(plan->small, batch, inputs, outputs));
    int rc = check_batch(plan, batch);
    if (rc != 0)
        return rc;
    for (int i = 0; i < plan->graph->n_inputs; i++) {
        const wk_value_t *v = &plan->graph->values[plan->graph->inputs[i]];
        memcpy(plan->ops->input_buffer(plan, i), inputs[i],
               (size_t)wk_value_elems_at(v, batch) * sizeof(float));
    }
    return run_backend(plan, batch, outputs);
}

int wk__plan_run_inplace(wk_plan_t *plan, int batch, const float *const *inputs,
                         float *const *outputs)
{
    int size = 0;
    wk_plan_t *sub = runs_each(plan, batch, &size);
    if (sub != NULL)
        return run_each(plan, sub, batch, size, inputs, outputs, true);
    if (runs_small(plan, batch))
        return from_small(plan, wk__plan_run_inplace(plan->small, batch, inputs, outputs));
    int rc = check_batch(plan, batch);
    if (rc != 0)
        return rc;
    const wk_graph_t *g = plan->graph;
    int bound = 0;
    if (plan->ops->bind_input != NULL) {
        while (bound < g->n_inputs && plan->ops->bind_input(plan, bound, batch, inputs[bound]) == 0)
            bound++;
    }
    for (int i = bound; i < g->n_inputs; i++) {
        const wk_value_t *v = &g->values[g->inputs[i]];
        memcpy(plan->ops->input_buffer(plan, i), inputs[i],
               (size_t)wk_value_elems_at(v, batch) * sizeof(float));
    }
    rc = run_backend(plan, batch, outputs);
    for (int i = 0; i < bound; i++)
        plan->ops->bind_input(plan, i, batch, NULL);
    return rc;
}

/* Runs the backend with every output going to its item's row: out + b *
 * row_elems holds item b's slice of output 0, then of output 1... A batched
 * output is [batch, ...]; an output without the batch (a static plan's, or
 * a constant) is the same for every item and copied whole into each row. */
static int run_into_rows(wk_plan_t *plan, int batch, float *out)
{
    const wk_graph_t *g = plan->graph;
    if (g->n_outputs == 1)
        return run_backend(plan, batch, &out);
    int rc = run_backend(plan, batch, plan->out_ptrs);
    if (rc == 0)
        rows_from_outputs(plan, batch, out);
    return rc;
}

int wk_plan_run_rows(wk_plan_t *plan, int batch, const float *const *inputs, float *out)
{
    int size = 0;
    wk_plan_t *sub = runs_each(plan, batch, &size);
    if (sub != NULL && batch == size && plan->graph->n_outputs == 1)
        return from_each(plan, sub, wk_plan_run_rows(sub, 1, inputs, out));
    if (sub != NULL) {
        int rc = run_each_scratch(plan, sub, batch, size, inputs, false);
        if (rc == 0)
            rows_from_outputs(plan, batch, out);
        return rc;
    }
    if (runs_small(plan, batch))
        return from_small(plan, wk_plan_run_rows(plan->small, batch, inputs, out));
    int rc = check_batch(plan, batch);
    if (rc != 0)
        return rc;
    for (int i = 0; i < plan->graph->n_inputs; i++) {
        const wk_value_t *v = &plan->graph->values[plan->graph->inputs[i]];
        memcpy(plan->ops->input_buffer(plan, i), inputs[i],
               (size_t)wk_value_elems_at(v, batch) * sizeof(float));
    }
    return run_into_rows(plan, batch, out);
}

/* Channel c of the model's input is byte src_chan[c] of a pixel, times
 * scale[c] plus bias[c]: (v / 255 - mean) / std. */
static void pixel_affine(const wk_pixel_norm_t *norm, int src_chan[3], float scale[3],
                         float bias[3])
{
    for (int c = 0; c < 3; c++) {
        src_chan[c] = norm->channels_bgr ? 2 - c : c;
        scale[c] = 1.0f / (255.0f * norm->std[c]);
        bias[c] = -norm->mean[c] / norm->std[c];
    }
}

/* uint8 HWC (RGB) -> normalized FP32 per image: planes (CHW) or, nhwc,
 * interleaved (HWC) with the channels in the same order. */
static void normalize_pixels(const wk_pixel_norm_t *norm, const uint8_t *pixels, int64_t h,
                             int64_t w, int nhwc, float *dst)
{
    int src_chan[3];
    float scale[3], bias[3];
    pixel_affine(norm, src_chan, scale, bias);
    int64_t hw = h * w;
    for (int c = 0; c < 3; c++) {
        int from = src_chan[c];
        const uint8_t *src = pixels + from;
        if (nhwc) {
            float *chan = dst + c;
            for (int64_t i = 0; i < hw; i++)
                chan[3 * i] = (float)src[3 * i] * scale[c] + bias[c];
        } else {
            float *plane = dst + c * hw;
            for (int64_t i = 0; i < hw; i++)
                plane[i] = (float)src[3 * i] * scale[c] + bias[c];
        }
    }
}

int wk_plan_image_input(const wk_plan_t *plan, int *h, int *w, int *nhwc)
{
    const wk_graph_t *g = plan->graph;
    if (g->n_inputs != 1)
        return 0;
    const wk_value_t *v = &g->values[g->inputs[0]];
    if (v->ndim != 4)
        return 0;
    int is_nhwc = v->dims[1] != 3 && v->dims[3] == 3;
    if (v->dims[1] != 3 && !is_nhwc)
        return 0;
    if (h != NULL)
        *h = (int)(is_nhwc ? v->dims[1] : v->dims[2]);
    if (w != NULL)
        *w = (int)(is_nhwc ? v->dims[2] : v->dims[3]);
    if (nhwc != NULL)
        *nhwc = is_nhwc;
    return 1;
}

int wk_plan_run_pixels(wk_plan_t *plan, int batch, const uint8_t *pixels, float *out)
{
    int size = 0;
    wk_plan_t *sub = runs_each(plan, batch, &size);
    if (sub != NULL && batch == size && plan->graph->n_outputs == 1)
        return from_each(plan, sub, wk_plan_run_pixels(sub, 1, pixels, out));
    if (runs_small(plan, batch))
        return from_small(plan, wk_plan_run_pixels(plan->small, batch, pixels, out));
    int rc = check_batch(plan, batch);
    if (rc != 0)
        return rc;
    const wk_graph_t *g = plan->graph;
    if (g->n_inputs != 1 || g->n_outputs < 1)
        return wk_fail(plan, SQ_BAD_TENSOR, "pixels need a model with one input");
    int h, w, nhwc;
    if (!wk_plan_image_input(plan, &h, &w, &nhwc))
        return wk_fail(plan, SQ_BAD_TENSOR, "pixels need a [N,3,H,W] or [N,H,W,3] input");
    const wk_value_t *v = &g->values[g->inputs[0]];
    /* a static plan's one item holds all of its images */
    int64_t images = v->batched ? batch : v->dims[0];
    size_t per = (size_t)h * (size_t)w * 3;
    /* on the device where the backend can: a quarter of the bytes cross,
     * and no host thread walks the pixels */
    if (sub == NULL && plan->ops->u8_input != NULL) {
        wk_u8_in_t how = {.pixels = true, .nhwc = nhwc != 0, .n = images, .h = h, .w = w};
        pixel_affine(&plan->opts.pixel_norm, how.src_chan, how.scale, how.bias);
        if (plan->ops->u8_input(plan, pixels, &how) == 0)
            return run_into_rows(plan, batch, out);
    }
    /* a batch run in a larger plan (or several outputs of one): its images
     * go to the holder's scratch, the plan's own run reads no more */
    float *dst = sub != NULL ? plan->in_ptrs[0] : plan->ops->input_buffer(plan, 0);
    for (int64_t b = 0; b < images; b++)
        normalize_pixels(&plan->opts.pixel_norm, pixels + (size_t)b * per, h, w, nhwc,
                         dst + (size_t)b * per);
    if (sub == NULL)
        return run_into_rows(plan, batch, out);
    rc = run_each_scratch(plan, sub, batch, size, (const float *const *)plan->in_ptrs, false);
    if (rc == 0)
        rows_from_outputs(plan, batch, out);
    return rc;
}

int wk_plan_run_u8(wk_plan_t *plan, int batch, const uint8_t *bytes, float *out)
{
    const wk_graph_t *g = plan->graph;
    if (g->n_inputs != 1)
        return wk_fail(plan, SQ_BAD_TENSOR, "UINT8 rows need a model with one input");
    const wk_value_t *v = &g->values[g->inputs[0]];
    int size = 0;
    if (runs_each(plan, batch, &size) == NULL) {
        if (runs_small(plan, batch))
            return from_small(plan, wk_plan_run_u8(plan->small, batch, bytes, out));
        int rc = check_batch(plan, batch);
        if (rc != 0)
            return rc;
        int64_t n = wk_value_elems_at(v, batch);
        wk_u8_in_t how = {.n = n, .scale = {1.0f, 1.0f, 1.0f}};
        if (plan->ops->u8_input != NULL && plan->ops->u8_input(plan, bytes, &how) == 0)
            return run_into_rows(plan, batch, out);
        float *dst = plan->ops->input_buffer(plan, 0);
        for (int64_t e = 0; e < n; e++)
            dst[e] = (float)bytes[e];
        return run_into_rows(plan, batch, out);
    }
    /* a plan of plans per batch size: its rows as FP32 */
    int64_t n = wk_value_elems_at(v, batch);
    float *rows = malloc((size_t)n * sizeof(float) + 1);
    if (rows == NULL)
        return wk_fail(plan, SQ_NOMEM, "no memory for %lld floats", (long long)n);
    for (int64_t e = 0; e < n; e++)
        rows[e] = (float)bytes[e];
    const float *ins[1] = {rows};
    int rc = wk_plan_run_rows(plan, batch, ins, out);
    free(rows);
    return rc;
}
