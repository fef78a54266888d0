/* Prefix-batched execution (Nexus section 6.3): models that share all but
 * their last layers run the shared prefix once, on the mixed batch of every
 * member's requests, then each member's suffix on its own rows.
 *
 * Each member graph is lowered and cut at the tensor squishd names (the
 * model DB found the shared prefix by content hashes). The first member's
 * prefix becomes the group's one prefix plan; every other member's prefix
 * is compared with it step by step and weight by weight, then dropped, so
 * the group holds one backbone and N suffixes. The prefix writes the cut
 * tensor of the whole batch into one plain buffer; each suffix reads its
 * rows there in place (the backend binds its input to that slice) and
 * writes its outputs. */
#include "wk_exec_int.h"

#include <mdb_graph.h>
#include <sq.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct wk_group {
    int n;
    int max_batch;
    wk_plan_t *prefix;
    wk_plan_t **suffix;
    int64_t cut_elems;  /* per row */
    int64_t *out_elems; /* per member, output 0 per row */
    int64_t max_out_elems;
    float *mid; /* [max_batch, cut_elems]: the prefix's output */
    float *tmp; /* [max_batch, max_out_elems]: suffix outputs before striding */
    int64_t last_run_ns;
    uint64_t memory_bytes;
    char why[512];
};

/* ---- splitting a lowered graph at one value ---------------------------- */

static int find_value(const wk_graph_t *g, const char *name)
{
    for (int i = 0; i < g->n_values; i++)
        if (g->values[i].name != NULL && strcmp(g->values[i].name, name) == 0)
            return i;
    return -1;
}

/* The k-th value read by step s (inputs, then post-op residuals), or -1. */
static int step_read(const wk_step_t *s, int k)
{
    if (k < s->n_in)
        return s->in[k];
    const wk_post_t *p = &s->post[k - s->n_in];
    return p->kind == WK_POST_ADD ? p->value : -1;
}

typedef struct {
    const wk_graph_t *src;
    wk_graph_t *dst;
    int *map; /* src value -> dst value, -1 not yet copied */
} copier_t;

static int copy_value(copier_t *c, int v)
{
    if (c->map[v] >= 0)
        return c->map[v];
    const wk_value_t *sv = &c->src->values[v];
    int id = wk_graph_value(c->dst, sv->name, sv->ndim, sv->dims, sv->batched, sv->data);
    c->map[v] = id;
    return id;
}

static void copy_step(copier_t *c, const wk_step_t *s)
{
    int in[64];
    int n_in = s->n_in < 64 ? s->n_in : 64;
    for (int k = 0; k < n_in; k++)
        in[k] = s->in[k] < 0 ? -1 : copy_value(c, s->in[k]);
    int out = copy_value(c, s->out);
    wk_step_t *d = wk_graph_step(c->dst, s->kind, in, n_in, out);
    d->p = s->p;
    d->legacy_softmax = s->legacy_softmax;
    d->n_post = s->n_post;
    for (int k = 0; k < s->n_post; k++) {
        d->post[k] = s->post[k];
        if (s->post[k].kind == WK_POST_ADD || s->post[k].kind == WK_POST_DW)
            d->post[k].value = copy_value(c, s->post[k].value);
        if (s->post[k].kind == WK_POST_DW && s->post[k].bias >= 0)
            d->post[k].bias = copy_value(c, s->post[k].bias);
    }
}

/* Splits g at the value named cut into prefix (everything cut depends on;
 * g's inputs in, cut out) and suffix (the rest; cut in, g's outputs out).
 * Refuses a cut that the rest of the graph bypasses. */
static int split_graph(const wk_graph_t *g, const char *cut, wk_graph_t **pre, wk_graph_t **suf,
                       char *why, int why_size)
{
    *pre = *suf = NULL;
    int c = find_value(g, cut);
    if (c < 0) {
        snprintf(why, (size_t)why_size, "no tensor named '%s' to cut at", cut);
        return SQ_BAD_MODEL;
    }
    const wk_value_t *cv = &g->values[c];
    if (cv->data != NULL || cv->is_input || !cv->batched || cv->is_output || g->n_inputs != 1) {
        snprintf(why, (size_t)why_size,
                 "tensor '%s' cannot be a batched cut (a constant, an input, an output, "
                 "unbatched, or the model has several inputs)",
                 cut);
        return SQ_BAD_MODEL;
    }
    int *producer = sq_xmalloc(sizeof(int) * (size_t)(g->n_values + 1));
    for (int i = 0; i < g->n_values; i++)
        producer[i] = -1;
    for (int si = 0; si < g->n_steps; si++)
        producer[g->steps[si].out] = si;
    /* The prefix: the steps cut depends on (steps are in topological order,
     * so one backwards sweep finds them). */
    bool *in_pre = sq_xcalloc((size_t)g->n_steps + 1, sizeof(bool));
    bool *need = sq_xcalloc((size_t)g->n_values + 1, sizeof(bool));
    need[c] = true;
    for (int si = g->n_steps - 1; si >= 0; si--) {
        const wk_step_t *s = &g->steps[si];
        if (!need[s->out])
            continue;
        in_pre[si] = true;
        for (int k = 0; k < s->n_in + s->n_post; k++) {
            int v = step_read(s, k);
            if (v >= 0)
                need[v] = true;
        }
    }
    int rc = 0;
    for (int si = 0; si < g->n_steps && rc == 0; si++) {
        const wk_step_t *s = &g->steps[si];
        if (in_pre[si])
            continue;
        for (int k = 0; k < s->n_in + s->n_post; k++) {
            int v = step_read(s, k);
            if (v < 0 || v == c || g->values[v].data != NULL)
                continue;
            if (producer[v] < 0 || in_pre[producer[v]]) {
                snprintf(why, (size_t)why_size,
                         "the layers after '%s' also read '%s' from before it: not a cut", cut,
                         g->values[v].name);
                rc = SQ_BAD_MODEL;
                break;
            }
        }
    }
    for (int i = 0; i < g->n_outputs && rc == 0; i++) {
        int p = producer[g->outputs[i]];
        if (p < 0 || in_pre[p]) {
            snprintf(why, (size_t)why_size, "output '%s' is computed before the cut '%s'",
                     g->values[g->outputs[i]].name, cut);
            rc = SQ_BAD_MODEL;
        }
    }
    if (rc == 0) {
        int *map = sq_xmalloc(sizeof(int) * (size_t)(g->n_values + 1));
        copier_t cp = {.src = g, .map = map};
        /* prefix */
        for (int i = 0; i < g->n_values; i++)
            map[i] = -1;
        cp.dst = *pre = wk_graph_new(g->max_batch);
        const wk_value_t *in = &g->values[g->inputs[0]];
        map[g->inputs[0]] = wk_graph_input(cp.dst, in->name, in->ndim, in->dims, in->batched);
        for (int si = 0; si < g->n_steps; si++)
            if (in_pre[si])
                copy_step(&cp, &g->steps[si]);
        wk_graph_mark_output(cp.dst, map[c]);
        /* suffix */
        for (int i = 0; i < g->n_values; i++)
            map[i] = -1;
        cp.dst = *suf = wk_graph_new(g->max_batch);
        map[c] = wk_graph_input(cp.dst, cv->name, cv->ndim, cv->dims, true);
        for (int si = 0; si < g->n_steps; si++)
            if (!in_pre[si])
                copy_step(&cp, &g->steps[si]);
        for (int i = 0; i < g->n_outputs; i++)
            wk_graph_mark_output(cp.dst, map[g->outputs[i]]);
        free(map);
    }
    free(producer);
    free(in_pre);
    free(need);
    return rc;
}

/* Whether two prefixes compute the same function: the same steps with the
 * same parameters over the same weights. */
static bool same_prefix(const wk_graph_t *a, const wk_graph_t *b)
{
    if (a->n_steps != b->n_steps || a->n_values != b->n_values || a->n_inputs != b->n_inputs)
        return false;
    for (int i = 0; i < a->n_values; i++) {
        const wk_value_t *x = &a->values[i], *y = &b->values[i];
        if (x->ndim != y->ndim || x->batched != y->batched ||
            memcmp(x->dims, y->dims, sizeof(x->dims[0]) * (size_t)x->ndim) != 0 ||
            (x->data == NULL) != (y->data == NULL))
            return false;
        if (x->data != NULL &&
            memcmp(x->data, y->data, sizeof(float) * (size_t)wk_value_elems(x)) != 0)
            return false;
    }
    for (int i = 0; i < a->n_steps; i++) {
        const wk_step_t *x = &a->steps[i], *y = &b->steps[i];
        if (x->kind != y->kind || x->n_in != y->n_in || x->out != y->out ||
            x->n_post != y->n_post || x->legacy_softmax != y->legacy_softmax ||
            memcmp(&x->p, &y->p, sizeof(x->p)) != 0 ||
            memcmp(x->in, y->in, sizeof(int) * (size_t)x->n_in) != 0 ||
            memcmp(x->post, y->post, sizeof(x->post[0]) * (size_t)x->n_post) != 0)
            return false;
    }
    return true;
}

/* ---- the group ------------------------------------------------------------ */

void wk_group_free(wk_group_t *grp)
{
    if (grp == NULL)
        return;
    wk_plan_free(grp->prefix);
    for (int i = 0; i < grp->n; i++)
        wk_plan_free(grp->suffix[i]);
    free(grp->suffix);
    free(grp->out_elems);
    free(grp->mid);
    free(grp->tmp);
    free(grp);
}

int wk_group_create(const struct mdb_graph *const *graphs, const char *const *cuts, int n,
                    const wk_plan_opts_t *opts, wk_group_t **out, char *why, int why_size)
{
    *out = NULL;
    if (n < 1 || opts->max_batch < 1 || opts->backend == SQ_DEV_EMU) {
        snprintf(why, (size_t)why_size,
                 "a prefix group needs members, max_batch >= 1 and a real backend");
        return SQ_INVAL;
    }
    wk_group_t *grp = sq_xcalloc(1, sizeof(*grp));
    grp->n = n;
    grp->suffix = sq_xcalloc((size_t)n, sizeof(*grp->suffix));
    grp->out_elems = sq_xcalloc((size_t)n, sizeof(*grp->out_elems));
    wk_graph_t *first_pre = NULL;
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        wk_graph_t *g = NULL, *pre = NULL, *suf = NULL;
        char sub[400] = "";
        if (graphs[i]->batch_fixed > 0) {
            rc = SQ_UNSUPPORTED_MODEL;
            snprintf(sub, sizeof(sub), "a fixed batch size cannot be batched across models");
        }
        if (rc == 0)
            rc = wk_lower(graphs[i], opts->backend, opts->max_batch, 0, &g, sub, sizeof(sub));
        if (rc == 0)
            rc = split_graph(g, cuts[i], &pre, &suf, sub, sizeof(sub));
        wk_graph_free(g);
        if (rc == 0 && i > 0 && !same_prefix(first_pre, pre)) {
            rc = SQ_BAD_MODEL;
            snprintf(sub, sizeof(sub), "its layers up to '%s' differ from member 0's", cuts[i]);
        }
        if (rc == 0 && i == 0) {
            first_pre = pre;
            pre = NULL;
        }
        wk_graph_free(pre);
        if (rc == 0) {
            wk_plan_opts_t so = *opts;
            rc = wk_plan_from_graph(suf, &so, &grp->suffix[i], sub, sizeof(sub));
        } else {
            wk_graph_free(suf);
        }
        if (rc != 0)
            snprintf(why, (size_t)why_size, "member %d: %s", i, sub);
    }
    if (rc == 0) {
        char sub[400] = "";
        /* Fusion may not swallow the cut: it is the prefix's graph output. */
        rc = wk_plan_from_graph(first_pre, opts, &grp->prefix, sub, sizeof(sub));
        first_pre = NULL;
        if (rc != 0)
            snprintf(why, (size_t)why_size, "prefix: %s", sub);
    }
    wk_graph_free(first_pre);
    if (rc != 0) {
        wk_group_free(grp);
        return rc;
    }
    grp->max_batch = wk_plan_max_batch(grp->prefix);
    grp->cut_elems = wk_plan_output_elems(grp->prefix, 0);
    for (int i = 0; i < n; i++) {
        if (wk_plan_n_outputs(grp->suffix[i]) != 1 ||
            wk_plan_input_elems(grp->suffix[i], 0) != grp->cut_elems ||
            wk_plan_max_batch(grp->suffix[i]) != grp->max_batch) {
            snprintf(why, (size_t)why_size,
                     "member %d: the layers after the cut need one output and the cut's shape", i);
            wk_group_free(grp);
            return SQ_UNSUPPORTED_MODEL;
        }
        grp->out_elems[i] = wk_plan_output_elems(grp->suffix[i], 0);
        if (grp->out_elems[i] > grp->max_out_elems)
            grp->max_out_elems = grp->out_elems[i];
    }
    size_t mid = (size_t)grp->max_batch * (size_t)grp->cut_elems * sizeof(float);
    size_t tmp = (size_t)grp->max_batch * (size_t)grp->max_out_elems * sizeof(float);
    grp->mid = sq_xmalloc(mid + 1);
    grp->tmp = sq_xmalloc(tmp + 1);
    grp->memory_bytes = mid + tmp;
    *out = grp;
    return 0;
}

int wk_group_n_members(const wk_group_t *grp)
{
    return grp->n;
}

int wk_group_max_batch(const wk_group_t *grp)
{
    return grp->max_batch;
}

uint64_t wk_group_memory_bytes(const wk_group_t *grp)
{
    /* the plans' arenas are measured as they are now */
    uint64_t bytes = grp->memory_bytes + wk_plan_memory_bytes(grp->prefix);
    for (int i = 0; i < grp->n; i++)
        bytes += wk_plan_memory_bytes(grp->suffix[i]);
    return bytes;
}

const wk_plan_t *wk_group_prefix(const wk_group_t *grp)
{
    return grp->prefix;
}

int64_t wk_group_output_elems(const wk_group_t *grp, int member)
{
    return member >= 0 && member < grp->n ? grp->out_elems[member] : -1;
}

int wk_group_share_arena(wk_group_t *grp, wk_arena_t *a, char *why, int why_size)
{
    int rc = wk_plan_share_arena(grp->prefix, a, why, why_size);
    for (int i = 0; i < grp->n && rc == 0; i++)
        rc = wk_plan_share_arena(grp->suffix[i], a, why, why_size);
    return rc;
}

void wk_group_keep_sizes(wk_group_t *grp, int upto)
{
    wk_plan_keep_sizes(grp->prefix, upto);
    for (int i = 0; i < grp->n; i++)
        wk_plan_keep_sizes(grp->suffix[i], upto);
}

int wk_group_sizes_ready(const wk_group_t *grp)
{
    return wk_plan_sizes_ready(grp->prefix);
}

int64_t wk_group_last_run_ns(const wk_group_t *grp)
{
    return grp->last_run_ns;
}

const char *wk_group_errmsg(const wk_group_t *grp)
{
    return grp->why;
}

static int group_fail(wk_group_t *grp, int rc, const char *what, const wk_plan_t *plan)
{
    snprintf(grp->why, sizeof(grp->why), "%s: %s", what, plan ? wk_plan_errmsg(plan) : "");
    return rc;
}

/* Runs each member's suffix over its rows of the prefix output. */
static int run_suffixes(wk_group_t *grp, int batch, const int *member, float *out,
                        size_t out_stride)
{
    for (int b = 0; b < batch; b++)
        if (member[b] < 0 || member[b] >= grp->n) {
            snprintf(grp->why, sizeof(grp->why), "row %d names member %d of %d", b, member[b],
                     grp->n);
            return SQ_INVAL;
        }
    int start = 0;
    while (start < batch) {
        int k = member[start], end = start + 1;
        while (end < batch && member[end] == k)
            end++;
        int rows = end - start;
        size_t oe = (size_t)grp->out_elems[k];
        /* Rows land straight in out when it is packed for this member. */
        float *dst = out_stride == oe ? out + (size_t)start * out_stride : grp->tmp;
        const float *in[1] = {grp->mid + (size_t)start * (size_t)grp->cut_elems};
        float *outs[1] = {dst};
        int rc = wk__plan_run_inplace(grp->suffix[k], rows, in, outs);
        if (rc != 0)
            return group_fail(grp, rc, "suffix", grp->suffix[k]);
        if (dst == grp->tmp)
            for (int r = 0; r < rows; r++)
                memcpy(out + (size_t)(start + r) * out_stride, grp->tmp + (size_t)r * oe,
                       oe * sizeof(float));
        start = end;
    }
    return 0;
}

static int check_group_batch(wk_group_t *grp, int batch, size_t out_stride)
{
    if (batch < 1 || batch > grp->max_batch) {
        snprintf(grp->why, sizeof(grp->why), "batch %d outside 1..%d", batch, grp->max_batch);
        return SQ_INVAL;
    }
    if (out_stride < (size_t)grp->max_out_elems) {
        snprintf(grp->why, sizeof(grp->why), "output stride %zu under %lld floats", out_stride,
                 (long long)grp->max_out_elems);
        return SQ_INVAL;
    }
    return 0;
}

int wk_group_run_pixels(wk_group_t *grp, int batch, const uint8_t *pixels, const int *member,
                        float *out, size_t out_stride)
{
    int rc = check_group_batch(grp, batch, out_stride);
    if (rc != 0)
        return rc;
    int64_t t0 = sq_now_ns();
    if ((rc = wk_plan_run_pixels(grp->prefix, batch, pixels, grp->mid)) != 0)
        return group_fail(grp, rc, "prefix", grp->prefix);
    rc = run_suffixes(grp, batch, member, out, out_stride);
    grp->last_run_ns = sq_now_ns() - t0;
    return rc;
}

int wk_group_run(wk_group_t *grp, int batch, const float *input, const int *member, float *out,
                 size_t out_stride)
{
    int rc = check_group_batch(grp, batch, out_stride);
    if (rc != 0)
        return rc;
    int64_t t0 = sq_now_ns();
    const float *ins[1] = {input};
    float *outs[1] = {grp->mid};
    if ((rc = wk_plan_run(grp->prefix, batch, ins, outs)) != 0)
        return group_fail(grp, rc, "prefix", grp->prefix);
    rc = run_suffixes(grp, batch, member, out, out_stride);
    grp->last_run_ns = sq_now_ns() - t0;
    return rc;
}
