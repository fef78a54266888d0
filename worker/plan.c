/* The lowered graph: building, checking, the fusion passes that every
 * backend benefits from, and buffer planning by liveness. Nothing here
 * knows a backend. */
#include "wk_exec_int.h"

#include <sq.h>

#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

wk_graph_t *wk_graph_new(int max_batch)
{
    wk_graph_t *g = sq_xcalloc(1, sizeof(*g));
    g->max_batch = max_batch < 1 ? 1 : max_batch;
    return g;
}

static void step_dispose(wk_step_t *s)
{
    free(s->in);
    s->in = NULL;
}

void wk_graph_free(wk_graph_t *g)
{
    if (g == NULL)
        return;
    for (int i = 0; i < g->n_values; i++) {
        free(g->values[i].name);
        free(g->values[i].data);
    }
    for (int i = 0; i < g->n_steps; i++)
        step_dispose(&g->steps[i]);
    free(g->values);
    free(g->steps);
    free(g->inputs);
    free(g->outputs);
    free(g);
}

int wk_graph_value(wk_graph_t *g, const char *name, int ndim, const int64_t *dims, bool batched,
                   const float *data)
{
    assert(ndim >= 0 && ndim <= WK_MAX_DIMS);
    if (g->n_values == g->cap_values) {
        g->cap_values = g->cap_values ? 2 * g->cap_values : 64;
        g->values = sq_xrealloc(g->values, (size_t)g->cap_values * sizeof(*g->values));
    }
    wk_value_t *v = &g->values[g->n_values];
    memset(v, 0, sizeof(*v));
    char tmp[32];
    if (name == NULL) {
        snprintf(tmp, sizeof(tmp), "%%%d", g->n_values);
        name = tmp;
    }
    v->name = sq_xstrdup(name);
    v->ndim = ndim;
    for (int d = 0; d < ndim; d++)
        v->dims[d] = dims[d];
    v->batched = batched && ndim > 0;
    if (v->batched)
        v->dims[0] = g->max_batch;
    v->producer = -1;
    v->alias_of = -1;
    if (data != NULL) {
        size_t n = (size_t)wk_value_elems(v);
        v->data = sq_xmalloc(n * sizeof(float) + 1);
        memcpy(v->data, data, n * sizeof(float));
    }
    return g->n_values++;
}

int wk_graph_input(wk_graph_t *g, const char *name, int ndim, const int64_t *dims, bool batched)
{
    int id = wk_graph_value(g, name, ndim, dims, batched, NULL);
    g->values[id].is_input = true;
    g->inputs = sq_xrealloc(g->inputs, (size_t)(g->n_inputs + 1) * sizeof(int));
    g->inputs[g->n_inputs++] = id;
    return id;
}

void wk_graph_mark_output(wk_graph_t *g, int value)
{
    g->values[value].is_output = true;
    g->outputs = sq_xrealloc(g->outputs, (size_t)(g->n_outputs + 1) * sizeof(int));
    g->outputs[g->n_outputs++] = value;
}

wk_step_t *wk_graph_step(wk_graph_t *g, wk_kernel_t kind, const int *in, int n_in, int out)
{
    if (g->n_steps == g->cap_steps) {
        g->cap_steps = g->cap_steps ? 2 * g->cap_steps : 64;
        g->steps = sq_xrealloc(g->steps, (size_t)g->cap_steps * sizeof(*g->steps));
    }
    wk_step_t *s = &g->steps[g->n_steps++];
    memset(s, 0, sizeof(*s));
    s->kind = kind;
    s->in = sq_xmalloc((size_t)(n_in > 0 ? n_in : 1) * sizeof(int));
    memcpy(s->in, in, (size_t)n_in * sizeof(int));
    s->n_in = n_in;
    s->out = out;
    return s;
}

wk_graph_t *wk_graph_clone(const wk_graph_t *g, int max_batch)
{
    wk_graph_t *c = wk_graph_new(max_batch);
    for (int i = 0; i < g->n_values; i++) {
        const wk_value_t *v = &g->values[i];
        int id = wk_graph_value(c, v->name, v->ndim, v->dims, v->batched, v->data);
        c->values[id].is_input = v->is_input;
        c->values[id].alias_of = v->alias_of;
    }
    for (int i = 0; i < g->n_inputs; i++) {
        c->inputs = sq_xrealloc(c->inputs, (size_t)(c->n_inputs + 1) * sizeof(int));
        c->inputs[c->n_inputs++] = g->inputs[i];
    }
    for (int i = 0; i < g->n_steps; i++) {
        const wk_step_t *s = &g->steps[i];
        wk_step_t *d = wk_graph_step(c, s->kind, s->in, s->n_in, s->out);
        int *in = d->in;
        *d = *s;
        d->in = in;
    }
    for (int i = 0; i < g->n_outputs; i++)
        wk_graph_mark_output(c, g->outputs[i]);
    return c;
}

int wk_post_reads(const wk_post_t *p, int out[2])
{
    int n = 0;
    if (p->kind == WK_POST_ADD || p->kind == WK_POST_DW)
        out[n++] = p->value;
    if (p->kind == WK_POST_DW && p->bias >= 0)
        out[n++] = p->bias;
    return n;
}

static void note_use(wk_graph_t *g, int v, int step)
{
    g->values[v].n_uses++;
    if (g->values[v].last_use < step)
        g->values[v].last_use = step;
}

int wk_graph_finish(wk_graph_t *g, char *why, int why_size)
{
    for (int i = 0; i < g->n_values; i++) {
        g->values[i].producer = -1;
        g->values[i].n_uses = 0;
        g->values[i].last_use = -1;
    }
    for (int si = 0; si < g->n_steps; si++) {
        wk_step_t *s = &g->steps[si];
        for (int k = 0; k < s->n_in + 2 * s->n_post; k++) {
            int reads[2] = {-1, -1};
            if (k >= s->n_in)
                wk_post_reads(&s->post[(k - s->n_in) / 2], reads);
            int v = k < s->n_in ? s->in[k] : reads[(k - s->n_in) % 2];
            if (v < 0)
                continue;
            const wk_value_t *val = &g->values[v];
            if (!val->is_input && val->data == NULL && val->producer < 0) {
                snprintf(why, (size_t)why_size, "step %d (%s) reads '%s' before it is computed", si,
                         wk_kernel_names[s->kind], val->name);
                return SQ_BAD_MODEL;
            }
            note_use(g, v, si);
        }
        wk_value_t *o = &g->values[s->out];
        if (o->producer >= 0 || o->is_input || o->data != NULL) {
            snprintf(why, (size_t)why_size, "value '%s' is written twice", o->name);
            return SQ_BAD_MODEL;
        }
        o->producer = si;
    }
    for (int i = 0; i < g->n_outputs; i++) {
        wk_value_t *o = &g->values[g->outputs[i]];
        if (o->producer < 0 && !o->is_input) {
            snprintf(why, (size_t)why_size, "graph output '%s' is never computed", o->name);
            return SQ_BAD_MODEL;
        }
        o->last_use = g->n_steps;
    }
    return 0;
}

/* Removes the steps whose kind was set to WK_K_COUNT_ by a pass. */
static void compact(wk_graph_t *g)
{
    int w = 0;
    for (int r = 0; r < g->n_steps; r++) {
        if (g->steps[r].kind == WK_K_COUNT_) {
            step_dispose(&g->steps[r]);
            continue;
        }
        g->steps[w++] = g->steps[r];
    }
    g->n_steps = w;
}

/* The conv producing `v` if v is an intermediate used only by one step. */
static wk_step_t *sole_conv_producer(wk_graph_t *g, int v)
{
    const wk_value_t *val = &g->values[v];
    if (val->producer < 0 || val->n_uses != 1 || val->is_output)
        return NULL;
    wk_step_t *c = &g->steps[val->producer];
    return c->kind == WK_K_CONV ? c : NULL;
}

/* What a fusion pass asks of the backend, and where it keeps the graph
 * from before (wk_graph_fuse_dw). */
typedef struct {
    bool (*conv_act)(wk_act_kind_t kind);
    bool add_after_act;
    bool (*norm_act)(wk_act_kind_t kind);
    bool (*conv_dw)(const wk_graph_t *g, const wk_step_t *pw, const wk_step_t *dw);
    wk_graph_t **before;
} fuse_ctx_t;

static bool fold_batchnorm(wk_graph_t *g, wk_step_t *bn)
{
    wk_step_t *c = sole_conv_producer(g, bn->in[0]);
    if (c == NULL || c->n_post > 0 || bn->n_post > 0)
        return false;
    const wk_value_t *w = &g->values[c->in[1]];
    const float *scale = g->values[bn->in[1]].data, *shift = g->values[bn->in[2]].data;
    if (w->data == NULL || scale == NULL || shift == NULL)
        return false;
    int64_t oc = w->dims[0], per = wk_value_elems(w) / oc;
    /* New constants: the originals may be shared. */
    int nw = wk_graph_value(g, NULL, w->ndim, w->dims, false, w->data);
    int nb = wk_graph_value(g, NULL, 1, &oc, false, NULL);
    wk_value_t *wv = &g->values[nw], *bv = &g->values[nb];
    bv->data = sq_xcalloc((size_t)oc, sizeof(float));
    const float *old_b = c->n_in > 2 && c->in[2] >= 0 ? g->values[c->in[2]].data : NULL;
    for (int64_t o = 0; o < oc; o++) {
        for (int64_t k = 0; k < per; k++)
            wv->data[o * per + k] *= scale[o];
        bv->data[o] = (old_b ? old_b[o] : 0.0f) * scale[o] + shift[o];
    }
    if (c->n_in < 3) {
        c->in = sq_xrealloc(c->in, 3 * sizeof(int));
        c->n_in = 3;
    }
    c->in[1] = nw;
    c->in[2] = nb;
    c->out = bn->out;
    bn->kind = WK_K_COUNT_;
    return true;
}

/* A BatchNorm that did not fold into a conv (densenet's, after a concat):
 * the activation after it becomes its post-op where the backend applies
 * it there, so that the normalized tensor is not written, read and
 * written again (densenet121: 62 ReLUs, 35 of 410 ms at batch 8 on the
 * cpu). */
static bool fuse_norm_act(wk_graph_t *g, wk_step_t *e, bool (*norm_act)(wk_act_kind_t kind))
{
    const wk_value_t *val = &g->values[e->in[0]];
    if (norm_act == NULL || val->producer < 0 || val->n_uses != 1 || val->is_output)
        return false;
    wk_step_t *bn = &g->steps[val->producer];
    if (bn->kind != WK_K_BATCHNORM || bn->n_post == WK_MAX_POST || !norm_act(e->p.act.kind))
        return false;
    bn->post[bn->n_post++] = (wk_post_t){.kind = WK_POST_ACT, .act = e->p.act, .value = -1};
    bn->out = e->out;
    e->kind = WK_K_COUNT_;
    return true;
}

static bool fuse_act(wk_graph_t *g, wk_step_t *e, const fuse_ctx_t *ctx)
{
    bool (*conv_act)(wk_act_kind_t kind) = ctx->conv_act;
    wk_step_t *c = sole_conv_producer(g, e->in[0]);
    if (c == NULL)
        return fuse_norm_act(g, e, ctx->norm_act);
    if (c->n_post == WK_MAX_POST || (conv_act != NULL && !conv_act(e->p.act.kind)))
        return false;
    c->post[c->n_post++] = (wk_post_t){.kind = WK_POST_ACT, .act = e->p.act, .value = -1};
    c->out = e->out;
    e->kind = WK_K_COUNT_;
    return true;
}

/* y = x * sigmoid(x) or x * hardsigmoid(x) with hardswish's constants
 * (1/6, 1/2): one swish or hardswish step instead of two and a third
 * buffer. ONNX has no SiLU and HardSwish only from opset 14, so torch's
 * exports at 13 spell them so after every conv of efficientnet and
 * mobilenet_v3; fused, the conv then applies them as a post-op instead of
 * writing x, reading it twice and writing twice more. */
static bool fuse_gate(wk_graph_t *g, wk_step_t *mul)
{
    if (mul->p.binop != WK_BIN_MUL || mul->n_in != 2 || mul->in[0] == mul->in[1])
        return false;
    for (int pick = 0; pick < 2; pick++) {
        int x = mul->in[1 - pick];
        const wk_value_t *hv = &g->values[mul->in[pick]];
        if (hv->producer < 0 || hv->n_uses != 1 || hv->is_output)
            continue;
        wk_step_t *e = &g->steps[hv->producer];
        if (e->kind != WK_K_ELTWISE || e->in[0] != x)
            continue;
        wk_act_t a = e->p.act;
        if (a.kind == WK_ACT_SIGMOID)
            a = (wk_act_t){.kind = WK_ACT_SWISH};
        else if (a.kind == WK_ACT_HARDSIGMOID && fabsf(a.alpha - 1.0f / 6.0f) < 1e-6f &&
                 fabsf(a.beta - 0.5f) < 1e-6f)
            a = (wk_act_t){.kind = WK_ACT_HARDSWISH};
        else
            continue;
        e->p.act = a;
        e->out = mul->out;
        mul->kind = WK_K_COUNT_;
        return true;
    }
    return false;
}

static bool same_shape(const wk_value_t *a, const wk_value_t *b)
{
    if (a->ndim != b->ndim || a->batched != b->batched)
        return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->dims[d] != b->dims[d])
            return false;
    return true;
}

static bool acts_only(const wk_step_t *c)
{
    for (int i = 0; i < c->n_post; i++)
        if (c->post[i].kind != WK_POST_ACT)
            return false;
    return true;
}

/* A 2-D conv with this kernel, stride and pad on every side, dilation 1. */
static bool conv_is(const wk_step_t *c, int64_t k, int64_t stride, int64_t pad)
{
    if (c->kind != WK_K_CONV || c->p.conv.n_spatial != 2)
        return false;
    for (int i = 0; i < 2; i++)
        if (c->p.conv.kernel[i] != k || c->p.conv.stride[i] != stride ||
            c->p.conv.dilation[i] != 1 || c->p.conv.pad_begin[i] != pad ||
            c->p.conv.pad_end[i] != pad)
            return false;
    return true;
}

/* y = dw(pw(x)): a depthwise 3x3 conv (pad 1, stride 1 or 2, its own
 * activations after it) becomes a post-op of the 1x1 conv before it, when
 * the 1x1's output has no other use and conv_dw says yes (the graph as it
 * was goes to *before first, once). The expanded
 * tensor between them (mobilenet_v2's 96 channels at 112x112) then never
 * leaves the cache. */
static bool fuse_dw(wk_graph_t *g, wk_step_t *dw, const fuse_ctx_t *c)
{
    if (!(conv_is(dw, 3, 1, 1) || conv_is(dw, 3, 2, 1)) || !acts_only(dw) || dw->n_in < 2)
        return false;
    const wk_value_t *x = &g->values[dw->in[0]], *w = &g->values[dw->in[1]],
                     *y = &g->values[dw->out];
    const wk_value_t *b = dw->n_in > 2 && dw->in[2] >= 0 ? &g->values[dw->in[2]] : NULL;
    if (x->ndim != 4 || !x->batched || w->data == NULL || w->ndim != 4 ||
        dw->p.conv.groups != x->dims[1] || w->dims[0] != x->dims[1] || w->dims[1] != 1 ||
        y->dims[1] != x->dims[1] || (b != NULL && b->data == NULL))
        return false;
    wk_step_t *pw = sole_conv_producer(g, dw->in[0]);
    if (pw == NULL || !conv_is(pw, 1, 1, 0) || pw->p.conv.groups != 1 || !acts_only(pw) ||
        pw->n_post + 1 + dw->n_post > WK_MAX_POST || !c->conv_dw(g, pw, dw))
        return false;
    if (c->before != NULL && *c->before == NULL)
        *c->before = wk_graph_clone(g, g->max_batch);
    int bias = dw->n_in > 2 ? dw->in[2] : -1;
    if (bias < 0) {
        int64_t ch = x->dims[1];
        bias = wk_graph_value(g, NULL, 1, &ch, false, NULL);
        g->values[bias].data = sq_xcalloc((size_t)ch, sizeof(float));
    }
    pw->post[pw->n_post++] = (wk_post_t){
        .kind = WK_POST_DW, .value = dw->in[1], .bias = bias, .stride = (int)dw->p.conv.stride[0]};
    for (int i = 0; i < dw->n_post; i++)
        pw->post[pw->n_post++] = dw->post[i];
    pw->out = dw->out;
    dw->kind = WK_K_COUNT_;
    return true;
}

/* out = conv(x) + other becomes a conv post-op when `other` exists before
 * the conv runs and has the conv output's shape. */
static bool fuse_add(wk_graph_t *g, wk_step_t *add, bool after_act)
{
    if (add->p.binop != WK_BIN_ADD || add->n_in != 2)
        return false;
    for (int pick = 1; pick >= 0; pick--) {
        int cv = add->in[pick], other = add->in[1 - pick];
        wk_step_t *c = sole_conv_producer(g, cv);
        if (c == NULL || c->n_post == WK_MAX_POST || cv == other)
            continue;
        if (!after_act && c->n_post > 0 && c->post[c->n_post - 1].kind == WK_POST_ACT)
            continue;
        const wk_value_t *ov = &g->values[other];
        if (ov->data != NULL || !same_shape(ov, &g->values[cv]))
            continue;
        int conv_index = (int)(c - g->steps);
        if (!ov->is_input && ov->producer >= conv_index)
            continue;
        c->post[c->n_post++] = (wk_post_t){.kind = WK_POST_ADD, .value = other};
        c->out = add->out;
        add->kind = WK_K_COUNT_;
        return true;
    }
    return false;
}

/* Constants nobody reads any more (pre-fold weights) free their bytes. */
static void free_dead_constants(wk_graph_t *g)
{
    for (int i = 0; i < g->n_values; i++) {
        wk_value_t *v = &g->values[i];
        if (v->data != NULL && v->n_uses == 0) {
            free(v->data);
            v->data = NULL;
            v->producer = -2; /* dead constant */
        }
    }
}

/* Runs fuse on every step until none fuses; each fusion removes a step
 * whose output an earlier step now writes, so producers and uses are
 * recomputed and the walk starts over. Returns the number removed. */
static int fuse_pass(wk_graph_t *g, bool (*fuse)(wk_graph_t *g, wk_step_t *s, const fuse_ctx_t *c),
                     const fuse_ctx_t *c)
{
    char why[8];
    int removed = 0;
    if (wk_graph_finish(g, why, sizeof(why)) != 0)
        return 0;
    for (int si = 0; si < g->n_steps; si++) {
        if (fuse(g, &g->steps[si], c)) {
            compact(g);
            removed++;
            wk_graph_finish(g, why, sizeof(why));
            si = -1;
        }
    }
    free_dead_constants(g);
    return removed;
}

static bool fuse_step(wk_graph_t *g, wk_step_t *s, const fuse_ctx_t *c)
{
    if (s->kind == WK_K_BATCHNORM)
        return fold_batchnorm(g, s);
    if (s->kind == WK_K_ELTWISE)
        return fuse_act(g, s, c);
    if (s->kind == WK_K_BINARY)
        return fuse_gate(g, s) || fuse_add(g, s, c->add_after_act);
    return false;
}

int wk_graph_fuse(wk_graph_t *g, bool (*conv_act)(wk_act_kind_t kind), bool add_after_act,
                  bool (*norm_act)(wk_act_kind_t kind))
{
    return fuse_pass(
        g, fuse_step,
        &(fuse_ctx_t){.conv_act = conv_act, .add_after_act = add_after_act, .norm_act = norm_act});
}

int wk_graph_fuse_dw(wk_graph_t *g,
                     bool (*conv_dw)(const wk_graph_t *g, const wk_step_t *pw, const wk_step_t *dw),
                     wk_graph_t **before)
{
    if (before != NULL)
        *before = NULL;
    if (conv_dw == NULL)
        return 0;
    return fuse_pass(g, fuse_dw, &(fuse_ctx_t){.conv_dw = conv_dw, .before = before});
}

size_t wk_arena_plan(const wk_buf_req_t *reqs, int n, size_t align, size_t *offsets)
{
    int *order = sq_xmalloc((size_t)(n > 0 ? n : 1) * sizeof(int));
    int *placed = sq_xmalloc((size_t)(n > 0 ? n : 1) * sizeof(int));
    int n_placed = 0;
    size_t total = 0;
    for (int i = 0; i < n; i++)
        order[i] = i;
    /* Largest first (insertion sort: plans have a few hundred buffers). */
    for (int i = 1; i < n; i++) {
        int k = order[i], j = i - 1;
        while (j >= 0 && reqs[order[j]].bytes < reqs[k].bytes) {
            order[j + 1] = order[j];
            j--;
        }
        order[j + 1] = k;
    }
    for (int oi = 0; oi < n; oi++) {
        int r = order[oi];
        size_t need = (reqs[r].bytes + align - 1) / align * align;
        size_t at = 0;
        /* Move past every placed buffer that overlaps [at, at + need) and
         * lives at the same time, until no conflict remains. */
        bool moved = true;
        while (moved) {
            moved = false;
            for (int pi = 0; pi < n_placed; pi++) {
                int q = placed[pi];
                if (reqs[q].last < reqs[r].first || reqs[r].last < reqs[q].first)
                    continue;
                size_t qb = offsets[q], qe = qb + (reqs[q].bytes + align - 1) / align * align;
                if (at < qe && qb < at + need) {
                    at = qe;
                    moved = true;
                }
            }
        }
        offsets[r] = at;
        if (at + need > total)
            total = at + need;
        placed[n_placed++] = r;
    }
    free(order);
    free(placed);
    return total;
}

size_t wk__page_bytes(void)
{
    long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? (size_t)p : 4096;
}

static size_t round_to_pages(size_t bytes)
{
    size_t pg = wk__page_bytes();
    return (bytes + pg - 1) / pg * pg;
}

void *wk__region_alloc(size_t bytes)
{
    if (bytes == 0)
        return NULL;
    void *p = mmap(NULL, round_to_pages(bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                   -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

void wk__region_free(void *region, size_t bytes)
{
    if (region != NULL)
        munmap(region, round_to_pages(bytes));
}

void wk__region_trim(void *region, size_t from, size_t bytes)
{
    size_t start = round_to_pages(from), end = round_to_pages(bytes);
    if (region != NULL && start < end)
        madvise((char *)region + start, end - start, MADV_DONTNEED);
}

uint64_t wk__region_resident(const void *region, size_t from, size_t to)
{
    size_t pg = wk__page_bytes();
    from = from / pg * pg;
    if (region == NULL || to <= from)
        return 0;
    size_t n = round_to_pages(to - from) / pg;
    unsigned char *vec = sq_xmalloc(n);
    uint64_t resident = 0;
    if (mincore((char *)region + from, n * pg, vec) == 0) {
        for (size_t i = 0; i < n; i++)
            resident += vec[i] & 1;
    }
    free(vec);
    return resident * pg;
}
