/* Lowering: modeldb's canonical graph IR (mdb_graph.h) into the executor's
 * kernels. Everything an op means is decided here, once, so that backends
 * see one form: BatchNormalization becomes a per-channel scale and shift
 * (folded into the conv by wk_graph_fuse), ceil_mode becomes extra end
 * padding, Split becomes Slices, a one-index Gather a Slice and a copy, an
 * Einsum with a transposed B a transpose and a matmul, a Concat past
 * WK_MAX_CONCAT_SOURCES inputs concats of concats, Dropout, Identity, a
 * Pad of nothing and a Concat of one input disappear. How each op lowers is its entry in the table
 * lowerers[] (an elementwise op names its activation and the attributes of its parameters there, a
 * binary op its wk_binop_t: no code of its own).
 *
 * What the lowering and each backend cannot run is one list, the rules in
 * modeldb's op descriptor table (mdb_node_runnable_on), which the importer
 * reads too: each node passes the rules of the backend it is lowered for
 * before it is lowered, so that the worker refuses exactly what the
 * importer says that device kind refuses, with the same reason. */
#include "wk_exec_int.h"

#include <mdb_graph.h>
#include <sq.h>

#include <assert.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static_assert(WK_MAX_SPATIAL == MDB_RUN_MAX_SPATIAL, "one limit, modeldb/runnable.c");
static_assert(WK_MAX_DIMS >= MDB_MAX_RANK, "every rank the importer takes");

typedef struct {
    const mdb_graph_t *src;
    int64_t static_batch; /* > 0: the batch bound to this size, nothing batched */
    wk_graph_t *g;
    int *val; /* mdb tensor -> wk value, -1 when not yet made */
    char *why;
    int why_size;
} lower_t;

static int fail(lower_t *L, int err, const mdb_node_t *n, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int fail(lower_t *L, int err, const mdb_node_t *n, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (n != NULL)
        snprintf(L->why, (size_t)L->why_size, "%s node '%s': %s", mdb_op_name(n->op),
                 n->name ? n->name : "", msg);
    else
        snprintf(L->why, (size_t)L->why_size, "%s", msg);
    return err;
}

/* The wk value of mdb tensor t (constants converted to float on first use). */
static int value_of(lower_t *L, int t, const mdb_node_t *n)
{
    if (t < 0)
        return -1;
    if (L->val[t] >= 0)
        return L->val[t];
    const mdb_tensor_t *mt = &L->src->tensors[t];
    int64_t dims[WK_MAX_DIMS];
    bool batched = false;
    for (int d = 0; d < mt->shape.rank; d++) {
        dims[d] = mt->shape.dims[d];
        if (dims[d] < 0) {
            if (L->static_batch > 0) {
                dims[d] = -dims[d] * L->static_batch;
                continue;
            }
            if (d != 0 || dims[d] != MDB_DIM_BATCH)
                return fail(L, SQ_UNSUPPORTED_MODEL, n, "tensor '%s' has the batch in dim %d",
                            mt->name, d);
            batched = true;
            dims[d] = L->g->max_batch;
        }
    }
    if (mt->data == NULL)
        return fail(L, SQ_BAD_MODEL, n, "tensor '%s' is read before it is written", mt->name);
    if (mt->dtype != MDB_DT_FLOAT)
        return fail(L, SQ_UNSUPPORTED_MODEL, n, "constant '%s' is %s, not float", mt->name,
                    mdb_dtype_name(mt->dtype));
    if (batched)
        return fail(L, SQ_UNSUPPORTED_MODEL, n, "constant '%s' has a batch dimension", mt->name);
    L->val[t] = wk_graph_value(L->g, mt->name, mt->shape.rank, dims, false, mt->data);
    return L->val[t];
}

/* A new value for the output tensor t of node n. */
static int output_of(lower_t *L, int t, const mdb_node_t *n)
{
    const mdb_tensor_t *mt = &L->src->tensors[t];
    if (!mt->shape_known)
        return fail(L, SQ_BAD_MODEL, n, "output '%s' has no shape", mt->name);
    if (mt->dtype != MDB_DT_FLOAT)
        return fail(L, SQ_UNSUPPORTED_MODEL, n, "output '%s' is %s, not float", mt->name,
                    mdb_dtype_name(mt->dtype));
    int64_t dims[WK_MAX_DIMS];
    bool batched = false;
    for (int d = 0; d < mt->shape.rank; d++) {
        dims[d] = mt->shape.dims[d];
        if (dims[d] < 0) {
            if (L->static_batch > 0) {
                dims[d] = -dims[d] * L->static_batch;
                continue;
            }
            if (d != 0 || dims[d] != MDB_DIM_BATCH)
                return fail(L, SQ_UNSUPPORTED_MODEL, n, "output '%s' has the batch in dim %d",
                            mt->name, d);
            batched = true;
        }
    }
    L->val[t] = wk_graph_value(L->g, mt->name, mt->shape.rank, dims, batched, NULL);
    return L->val[t];
}

static int ints_attr(const mdb_node_t *n, const char *name, int64_t *out, int want, int64_t def)
{
    size_t count = 0;
    const int64_t *v = mdb_node_ints(n, name, &count);
    for (int i = 0; i < want; i++)
        out[i] = v != NULL && (size_t)i < count ? v[i] : def;
    return (int)count;
}

/* Conv and pools: kernel, strides, dilations, pads; end pads grown so that
 * the output has the IR's size (ceil_mode). */
static int window(lower_t *L, const mdb_node_t *n, wk_step_t *s, const wk_value_t *x,
                  const wk_value_t *y, const int64_t *kernel_from_w)
{
    int nsp = x->ndim - 2; /* 1..WK_MAX_SPATIAL: mdb_node_runnable */
    s->p.conv.n_spatial = nsp;
    int64_t pads[2 * WK_MAX_SPATIAL];
    ints_attr(n, "kernel_shape", s->p.conv.kernel, nsp, 1);
    if (kernel_from_w != NULL && mdb_node_ints(n, "kernel_shape", &(size_t){0}) == NULL)
        for (int i = 0; i < nsp; i++)
            s->p.conv.kernel[i] = kernel_from_w[i];
    ints_attr(n, "strides", s->p.conv.stride, nsp, 1);
    ints_attr(n, "dilations", s->p.conv.dilation, nsp, 1);
    ints_attr(n, "pads", pads, 2 * nsp, 0);
    for (int i = 0; i < nsp; i++) {
        s->p.conv.pad_begin[i] = pads[i];
        s->p.conv.pad_end[i] = pads[nsp + i];
        int64_t in = x->dims[2 + i], k = s->p.conv.kernel[i], st = s->p.conv.stride[i];
        int64_t dil = s->p.conv.dilation[i];
        int64_t need = (y->dims[2 + i] - 1) * st + dil * (k - 1) + 1 - in - pads[i];
        if (need > s->p.conv.pad_end[i])
            s->p.conv.pad_end[i] = need;
        if (s->p.conv.pad_begin[i] < 0 || s->p.conv.pad_end[i] < 0)
            return fail(L, SQ_UNSUPPORTED_MODEL, n, "negative pads");
    }
    s->p.conv.groups = mdb_node_int(n, "group", 1);
    s->p.conv.count_include_pad = (int)mdb_node_int(n, "count_include_pad", 0);
    return 0;
}

/* Concat of any number of inputs: a backend's step takes at most
 * WK_MAX_CONCAT_SOURCES, so a longer list is concatenated in runs of that
 * many into temporaries first (in practice DenseNet's 49 fit one step). */
static int lower_concat(lower_t *L, const mdb_node_t *n, const int *in, int nin, int out)
{
    wk_graph_t *g = L->g;
    int axis = (int)mdb_node_int(n, "axis", 1);
    if (nin <= WK_MAX_CONCAT_SOURCES) {
        wk_step_t *s = wk_graph_step(g, WK_K_CONCAT, in, nin, out);
        s->p.axis = axis;
        return 0;
    }
    int n_parts = (nin + WK_MAX_CONCAT_SOURCES - 1) / WK_MAX_CONCAT_SOURCES;
    int *parts = sq_xmalloc((size_t)n_parts * sizeof(*parts));
    for (int p = 0; p < n_parts; p++) {
        int first = p * WK_MAX_CONCAT_SOURCES;
        int count = nin - first < WK_MAX_CONCAT_SOURCES ? nin - first : WK_MAX_CONCAT_SOURCES;
        const wk_value_t *x = &g->values[in[first]];
        int64_t dims[WK_MAX_DIMS];
        for (int d = 0; d < x->ndim; d++)
            dims[d] = x->dims[d];
        dims[axis] = 0;
        for (int i = first; i < first + count; i++)
            dims[axis] += g->values[in[i]].dims[axis];
        parts[p] = wk_graph_value(g, NULL, x->ndim, dims, g->values[out].batched, NULL);
        wk_step_t *s = wk_graph_step(g, WK_K_CONCAT, in + first, count, parts[p]);
        s->p.axis = axis;
    }
    int rc = lower_concat(L, n, parts, n_parts, out);
    free(parts);
    return rc;
}

/* A constant operand of a binary op as oneDNN's jit binary takes it: it
 * broadcasts a scalar, one value per channel ([1, C, 1, 1]) or a
 * contiguous innermost block ([1, 1, H, W]), and runs any other pattern
 * with its reference kernel (Swin's attention mask [1, 64, 1, 49, 49]
 * over [1, 64, 3, 49, 49]: a third of the model's time). Such a constant
 * is expanded to the output's shape here, once (dim 0 stays as it is: the
 * batch); it must stay below 4M values. Returns v or the new value. */
static int jit_broadcast(lower_t *L, int v, int out)
{
    wk_graph_t *g = L->g;
    const wk_value_t *c = &g->values[v], *y = &g->values[out];
    if (c->data == NULL || c->batched || c->ndim > y->ndim || y->ndim < 2)
        return v;
    int shift = y->ndim - c->ndim;
    int64_t cd[WK_MAX_DIMS], full[WK_MAX_DIMS];
    for (int d = 0; d < y->ndim; d++)
        cd[d] = d < shift ? 1 : c->dims[d - shift];
    /* The dims past 0 that the constant does not broadcast: none, {1}, or a
     * suffix are what the jit kernel takes. */
    int first_kept = -1, n_kept = 0;
    for (int d = 1; d < y->ndim; d++)
        if (cd[d] != 1 || y->dims[d] == 1) {
            first_kept = first_kept < 0 ? d : first_kept;
            n_kept++;
        }
    if (n_kept == 0 || (n_kept == 1 && first_kept == 1) || first_kept + n_kept == y->ndim)
        return v;
    int64_t elems = cd[0];
    for (int d = 1; d < y->ndim; d++) {
        full[d] = y->dims[d];
        elems *= full[d];
    }
    full[0] = cd[0];
    if (elems > ((int64_t)4 << 20))
        return v;
    int64_t cs[WK_MAX_DIMS], acc = 1;
    for (int d = y->ndim - 1; d >= 0; d--) {
        cs[d] = cd[d] == 1 ? 0 : acc;
        acc *= cd[d];
    }
    float *data = sq_xmalloc((size_t)elems * sizeof(float));
    int64_t idx[WK_MAX_DIMS] = {0};
    for (int64_t i = 0; i < elems; i++) {
        int64_t off = 0;
        for (int d = 0; d < y->ndim; d++)
            off += idx[d] * cs[d];
        data[i] = c->data[off];
        for (int d = y->ndim - 1; d >= 0; d--) {
            if (++idx[d] < full[d])
                break;
            idx[d] = 0;
        }
    }
    int nv = wk_graph_value(g, NULL, y->ndim, full, false, data);
    free(data);
    return nv;
}

/* How each op lowers: a function, and for the ops that share one, what
 * it makes (the kernel, the activation and the attributes its parameters
 * come from, the binary op). Indexed by op; import-time ops have none
 * (mdb_node_runnable_on refuses them first). */
typedef struct lowerer lowerer_t;
struct lowerer {
    /* Lowers node n whose inputs are in[] (values, -1 when omitted) into
     * out, the value made for its output 0 (-1 with own_outputs). */
    int (*lower)(lower_t *L, const mdb_node_t *n, const lowerer_t *how, int *in, int out);
    bool own_outputs;                   /* lower makes the node's outputs itself */
    wk_kernel_t kernel;                 /* lower_step, lower_pool */
    wk_act_kind_t act;                  /* lower_act: the activation, and its alpha and beta from */
    const char *alpha_attr, *beta_attr; /* these attributes (NULL: 0) */
    float alpha_def, beta_def;          /* or these when absent */
    wk_binop_t binop;                   /* lower_binary */
};

/* One step of how->kernel reading every input. */
static int lower_step(lower_t *L, const mdb_node_t *n, const lowerer_t *how, int *in, int out)
{
    wk_graph_step(L->g, how->kernel, in, n->n_inputs, out);
    return 0;
}

static int lower_act(lower_t *L, const mdb_node_t *n, const lowerer_t *how, int *in, int out)
{
    wk_step_t *s = wk_graph_step(L->g, WK_K_ELTWISE, in, 1, out);
    s->p.act.kind = how->act;
    if (how->alpha_attr != NULL)
        s->p.act.alpha = mdb_node_float(n, how->alpha_attr, how->alpha_def);
    if (how->beta_attr != NULL)
        s->p.act.beta = mdb_node_float(n, how->beta_attr, how->beta_def);
    return 0;
}

static int lower_binary(lower_t *L, const mdb_node_t *n, const lowerer_t *how, int *in, int out)
{
    (void)n;
    for (int k = 0; k < 2; k++)
        in[k] = jit_broadcast(L, in[k], out);
    wk_graph_step(L->g, WK_K_BINARY, in, 2, out)->p.binop = how->binop;
    return 0;
}

static int lower_conv(lower_t *L, const mdb_node_t *n, const lowerer_t *how, int *in, int out)
{
    (void)how;
    wk_graph_t *g = L->g;
    int64_t kernel[WK_MAX_SPATIAL];
    const wk_value_t *w = &g->values[in[1]]; /* constant: mdb_node_runnable */
    for (int i = 0; i < w->ndim - 2 && i < WK_MAX_SPATIAL; i++)
        kernel[i] = w->dims[2 + i];
    wk_step_t *s = wk_graph_step(g, WK_K_CONV, in, n->n_inputs, out);
    return window(L, n, s, &g->values[in[0]], &g->values[out], kernel);
}

static int lower_pool(lower_t *L, const mdb_node_t *n, const lowerer_t *how, int *in, int out)
{
    wk_graph_t *g = L->g;
    wk_step_t *s = wk_graph_step(g, how->kernel, in, 1, out);
    return window(L, n, s, &g->values[in[0]], &g->values[out], NULL);
}

/* Identity and Dropout: the output is the input, unless a graph output
 * would alias a graph input; then a copy. */
static int lower_identity(lower_t *L, const mdb_node_t *n, const lowerer_t *how, int *in, int out)
{
    (void)how;
    (void)out;
    const wk_value_t *x = &L->g->values[in[0]];
    if (!L->src->tensors[n->outputs[0]].is_output || (!x->is_input && x->data == NULL)) {
        L->val[n->outputs[0]] = in[0];
        return 0;
    }
    int y = output_of(L, n->outputs[0], n);
    if (y < 0)
        return y;
    wk_graph_step(L->g, WK_K_COPY, in, 1, y);
    return 0;
}

/* Split: one slice per output. */
static int lower_split(lower_t *L, const mdb_node_t *n, const lowerer_t *how, int *in, int out)
{
    (void)how;
    (void)out;
    wk_graph_t *g = L->g;
    int axis = (int)mdb_node_int(n, "axis", 0);
    int64_t at = 0;
    for (int o = 0; o < n->n_outputs; o++) {
        int y = output_of(L, n->outputs[o], n);
        if (y < 0)
            return y;
        wk_step_t *s = wk_graph_step(g, WK_K_SLICE, in, 1, y);
        for (int d = 0; d < WK_MAX_DIMS; d++)
            s->p.slice.step[d] = 1;
        s->p.slice.start[axis] = at;
        at += g->values[y].dims[axis];
    }
    return 0;
}

/* Gather of one index (mdb_node_runnable): a slice of one along the axis,
 * then the output's shape without it. */
static int lower_gather(lower_t *L, const mdb_node_t *n, const lowerer_t *how, int *in, int out)
{
    (void)how;
    wk_graph_t *g = L->g;
    const wk_value_t *x = &g->values[in[0]];
    int axis = (int)mdb_node_int(n, "axis", 0);
    int64_t dims[WK_MAX_DIMS];
    for (int d = 0; d < x->ndim; d++)
        dims[d] = x->dims[d];
    dims[axis] = 1;
    int picked = wk_graph_value(g, NULL, x->ndim, dims, g->values[out].batched, NULL);
    wk_step_t *s = wk_graph_step(g, WK_K_SLICE, in, 1, picked);
    for (int d = 0; d < WK_MAX_DIMS; d++)
        s->p.slice.step[d] = 1;
    s->p.slice.start[axis] = mdb_node_int(n, "index", 0);
    wk_graph_step(g, WK_K_COPY, &picked, 1, out);
    return 0;
}

/* LayerNorm: scale and bias as [C] constants, whatever rank the file gave
 * them (mdb_node_runnable: one value per channel). */
static int lower_layer_norm(lower_t *L, const mdb_node_t *n, const lowerer_t *how, int *in, int out)
{
    (void)how;
    wk_graph_t *g = L->g;
    int nin = n->n_inputs;
    int ln_in[3] = {in[0], -1, -1};
    int64_t cdim = g->values[in[0]].dims[g->values[in[0]].ndim - 1];
    for (int k = 1; k < nin && k < 3; k++) {
        if (in[k] < 0)
            continue;
        const float *data = g->values[in[k]].data;
        ln_in[k] = wk_graph_value(g, NULL, 1, &cdim, false, data);
    }
    wk_step_t *s = wk_graph_step(g, WK_K_LAYERNORM, ln_in, nin < 3 ? 1 : 3, out);
    s->p.epsilon = mdb_node_float(n, "epsilon", 1e-5f);
    return 0;
}

static int lower_gemm(lower_t *L, const mdb_node_t *n, const lowerer_t *how, int *in, int out)
{
    (void)how;
    wk_step_t *s = wk_graph_step(L->g, WK_K_GEMM, in, n->n_inputs, out);
    s->p.gemm.trans_a = (int)mdb_node_int(n, "transA", 0);
    s->p.gemm.trans_b = (int)mdb_node_int(n, "transB", 0);
    s->p.gemm.alpha = mdb_node_float(n, "alpha", 1.0f);
    s->p.gemm.beta = mdb_node_float(n, "beta", 1.0f);
    return 0;
}

/* Einsum: a batched product; B transposed first into a temporary when the
 * equation reads it so (mdb canonical transB). */
static int lower_einsum(lower_t *L, const mdb_node_t *n, const lowerer_t *how, int *in, int out)
{
    (void)how;
    wk_graph_t *g = L->g;
    int b = in[1];
    if (mdb_node_int(n, "transB", 0)) {
        const wk_value_t *bv = &g->values[in[1]];
        int nd = bv->ndim;
        int64_t dims[WK_MAX_DIMS];
        for (int d = 0; d < nd; d++)
            dims[d] = bv->dims[d];
        dims[nd - 2] = bv->dims[nd - 1];
        dims[nd - 1] = bv->dims[nd - 2];
        b = wk_graph_value(g, NULL, nd, dims, bv->batched, NULL);
        wk_step_t *s = wk_graph_step(g, WK_K_TRANSPOSE, &in[1], 1, b);
        for (int d = 0; d < nd; d++)
            s->p.perm[d] = d;
        s->p.perm[nd - 2] = nd - 1;
        s->p.perm[nd - 1] = nd - 2;
    }
    wk_graph_step(g, WK_K_MATMUL, (int[]){in[0], b}, 2, out);
    return 0;
}

/* A Concat of one input (DenseNet's first layer of each block: torch.cat
 * of a one-tensor list) is its input, as Identity is. */
static int lower_concat_node(lower_t *L, const mdb_node_t *n, const lowerer_t *how, int *in,
                             int out)
{
    (void)out;
    if (n->n_inputs == 1)
        return lower_identity(L, n, how, in, -1);
    if ((out = output_of(L, n->outputs[0], n)) < 0)
        return out;
    return lower_concat(L, n, in, n->n_inputs, out);
}

static int lower_transpose(lower_t *L, const mdb_node_t *n, const lowerer_t *how, int *in, int out)
{
    (void)how;
    int ndim = L->g->values[in[0]].ndim;
    wk_step_t *s = wk_graph_step(L->g, WK_K_TRANSPOSE, in, 1, out);
    int64_t perm[WK_MAX_DIMS];
    size_t count = 0;
    mdb_node_ints(n, "perm", &count);
    ints_attr(n, "perm", perm, ndim, 0);
    for (int d = 0; d < ndim; d++)
        s->p.perm[d] = count ? (int)perm[d] : ndim - 1 - d;
    return 0;
}

static int lower_softmax(lower_t *L, const mdb_node_t *n, const lowerer_t *how, int *in, int out)
{
    (void)how;
    int ndim = L->g->values[in[0]].ndim;
    wk_step_t *s = wk_graph_step(L->g, WK_K_SOFTMAX, in, 1, out);
    s->p.axis = (int)mdb_node_int(n, "axis", ndim - 1);
    if (s->p.axis < 0)
        s->p.axis += ndim;
    return 0;
}

/* A Pad of nothing is its input, as Identity is: torch exports
 * AvgPool2d(2) as one ahead of the AveragePool (DenseNet's transitions),
 * and run, it cost a reorder into plain order, a copy, and a pool on
 * plain order where the conv before it wrote channels last. */
static int lower_pad(lower_t *L, const mdb_node_t *n, const lowerer_t *how, int *in, int out)
{
    int ndim = L->g->values[in[0]].ndim;
    int64_t pads[2 * WK_MAX_DIMS];
    ints_attr(n, "pads", pads, 2 * ndim, 0);
    bool none = true;
    for (int d = 0; d < 2 * ndim; d++)
        none = none && pads[d] == 0;
    if (none)
        return lower_identity(L, n, how, in, -1);
    if ((out = output_of(L, n->outputs[0], n)) < 0)
        return out;
    wk_step_t *s = wk_graph_step(L->g, WK_K_PAD, in, 1, out);
    for (int d = 0; d < ndim; d++) {
        s->p.pad.begin[d] = pads[d];
        s->p.pad.end[d] = pads[ndim + d];
    }
    /* pads >= 0, never on the batch, a known mode: mdb_node_runnable */
    const char *mode = mdb_node_string(n, "mode", "constant");
    s->p.pad.mode = strcmp(mode, "reflect") == 0 ? WK_PAD_REFLECT
                    : strcmp(mode, "edge") == 0  ? WK_PAD_EDGE
                                                 : WK_PAD_CONSTANT;
    s->p.pad.value = mdb_node_float(n, "value", 0.0f);
    return 0;
}

static int lower_reduce_mean(lower_t *L, const mdb_node_t *n, const lowerer_t *how, int *in,
                             int out)
{
    (void)how;
    int ndim = L->g->values[in[0]].ndim;
    wk_step_t *s = wk_graph_step(L->g, WK_K_REDUCE_MEAN, in, 1, out);
    size_t count = 0;
    const int64_t *axes = mdb_node_ints(n, "axes", &count);
    for (size_t i = 0; i < count; i++)
        s->p.reduce.axes_mask |= (int64_t)1 << axes[i];
    if (count == 0)
        s->p.reduce.axes_mask = ((int64_t)1 << ndim) - 1;
    return 0;
}

/* BatchNormalization: a per-channel scale and shift (folded into the conv
 * before it by wk_graph_fuse). */
static int lower_batch_norm(lower_t *L, const mdb_node_t *n, const lowerer_t *how, int *in, int out)
{
    (void)how;
    wk_graph_t *g = L->g;
    const wk_value_t *x = &g->values[in[0]];
    const wk_value_t *sc = &g->values[in[1]], *b = &g->values[in[2]];
    const wk_value_t *mean = &g->values[in[3]], *var = &g->values[in[4]];
    /* constants of one value per channel: mdb_node_runnable */
    int64_t c = x->ndim > 1 ? x->dims[1] : 1;
    if (wk_value_elems(sc) != c || wk_value_elems(b) != c || wk_value_elems(mean) != c ||
        wk_value_elems(var) != c)
        return fail(L, SQ_BAD_MODEL, n, "parameters are not of the channel count %lld",
                    (long long)c);
    float eps = mdb_node_float(n, "epsilon", 1e-5f);
    float *scale = sq_xmalloc((size_t)c * sizeof(float));
    float *shift = sq_xmalloc((size_t)c * sizeof(float));
    for (int64_t i = 0; i < c; i++) {
        scale[i] = sc->data[i] / sqrtf(var->data[i] + eps);
        shift[i] = b->data[i] - mean->data[i] * scale[i];
    }
    /* Per-channel constants shaped [C, 1, ...] to broadcast over NC... in
     * the unfused case. */
    int64_t dims[WK_MAX_DIMS];
    int nd = x->ndim > 1 ? x->ndim - 1 : 1;
    dims[0] = c;
    for (int d = 1; d < nd; d++)
        dims[d] = 1;
    int bn_in[3] = {in[0], wk_graph_value(g, NULL, nd, dims, false, scale),
                    wk_graph_value(g, NULL, nd, dims, false, shift)};
    free(scale);
    free(shift);
    wk_graph_step(g, WK_K_BATCHNORM, bn_in, 3, out);
    return 0;
}

static int lower_slice(lower_t *L, const mdb_node_t *n, const lowerer_t *how, int *in, int out)
{
    (void)how;
    wk_graph_t *g = L->g;
    wk_step_t *s = wk_graph_step(g, WK_K_SLICE, in, 1, out);
    const wk_value_t *x = &g->values[in[0]], *y = &g->values[out];
    for (int d = 0; d < WK_MAX_DIMS; d++)
        s->p.slice.step[d] = 1;
    size_t na = 0, ns = 0, nst = 0;
    const int64_t *axes = mdb_node_ints(n, "axes", &na);
    const int64_t *starts = mdb_node_ints(n, "starts", &ns);
    const int64_t *steps = mdb_node_ints(n, "steps", &nst);
    for (size_t i = 0; i < ns; i++) {
        int axis = axes && i < na ? (int)axes[i] : (int)i;
        if (axis < 0 || axis >= x->ndim)
            return fail(L, SQ_BAD_MODEL, n, "axis %d", axis);
        s->p.slice.start[axis] = starts[i];
        s->p.slice.step[axis] = steps && i < nst ? steps[i] : 1;
        if (x->batched && axis == 0 &&
            (starts[i] != 0 || s->p.slice.step[axis] != 1 || y->dims[0] != x->dims[0]))
            return fail(L, SQ_UNSUPPORTED_MODEL, n, "slices the batch");
    }
    return 0;
}

#define STEP(k)                                                                                    \
    {                                                                                              \
        .lower = lower_step, .kernel = (k)                                                         \
    }
#define ACT(k, ...)                                                                                \
    {                                                                                              \
        .lower = lower_act, .act = (k), __VA_ARGS__                                                \
    }
#define BINARY(op)                                                                                 \
    {                                                                                              \
        .lower = lower_binary, .binop = (op)                                                       \
    }

/* Resize: the canonical attributes (mode, cubic_coeff_a, exclude_outside,
 * transforms, scales) into the step; NCHW with only H and W resized (mdb_node_runnable). */
static int lower_resize(lower_t *L, const mdb_node_t *n, const lowerer_t *how, int *in, int out)
{
    (void)how;
    wk_step_t *s = wk_graph_step(L->g, WK_K_RESIZE, in, 1, out);
    static const char *const coords[] = {[WK_RESIZE_HALF_PIXEL] = "half_pixel",
                                         [WK_RESIZE_PYTORCH_HALF_PIXEL] = "pytorch_half_pixel",
                                         [WK_RESIZE_ALIGN_CORNERS] = "align_corners",
                                         [WK_RESIZE_ASYMMETRIC] = "asymmetric"};
    static const char *const nearests[] = {[WK_NEAREST_ROUND_PREFER_FLOOR] = "round_prefer_floor",
                                           [WK_NEAREST_ROUND_PREFER_CEIL] = "round_prefer_ceil",
                                           [WK_NEAREST_FLOOR] = "floor",
                                           [WK_NEAREST_CEIL] = "ceil"};
    const char *ctm = mdb_node_string(n, "coordinate_transformation_mode", "half_pixel");
    const char *nm = mdb_node_string(n, "nearest_mode", "round_prefer_floor");
    const char *mode = mdb_node_string(n, "mode", "nearest");
    s->p.resize.linear = strcmp(mode, "linear") == 0;
    s->p.resize.cubic = strcmp(mode, "cubic") == 0;
    s->p.resize.cubic_a = mdb_node_float(n, "cubic_coeff_a", -0.75f);
    s->p.resize.exclude_outside = mdb_node_int(n, "exclude_outside", 0) != 0;
    for (int i = 0; i < 4; i++) {
        if (strcmp(ctm, coords[i]) == 0)
            s->p.resize.coord = (wk_resize_coord_t)i;
        if (strcmp(nm, nearests[i]) == 0)
            s->p.resize.nearest = (wk_resize_nearest_t)i;
    }
    size_t count = 0;
    const float *scales = mdb_node_floats(n, "scales", &count);
    const wk_value_t *x = &L->g->values[in[0]], *y = &L->g->values[out];
    for (int i = 0; i < 2; i++)
        s->p.resize.scale[i] = scales != NULL && count == 4
                                   ? scales[2 + i]
                                   : (float)y->dims[2 + i] / (float)x->dims[2 + i];
    return 0;
}

/* ConvTranspose: a deconv step; ONNX's output_padding comes off the end
 * pads (mdb_node_runnable: it fits in them), so that the step's geometry
 * is oneDNN's. */
static int lower_conv_transpose(lower_t *L, const mdb_node_t *n, const lowerer_t *how, int *in,
                                int out)
{
    (void)how;
    wk_step_t *s = wk_graph_step(L->g, WK_K_DECONV, in, n->n_inputs, out);
    int nsp = L->g->values[in[0]].ndim - 2;
    int64_t pads[2 * WK_MAX_SPATIAL], opad[WK_MAX_SPATIAL];
    s->p.conv.n_spatial = nsp;
    ints_attr(n, "kernel_shape", s->p.conv.kernel, nsp, 1);
    ints_attr(n, "strides", s->p.conv.stride, nsp, 1);
    ints_attr(n, "dilations", s->p.conv.dilation, nsp, 1);
    ints_attr(n, "pads", pads, 2 * nsp, 0);
    ints_attr(n, "output_padding", opad, nsp, 0);
    for (int i = 0; i < nsp; i++) {
        s->p.conv.pad_begin[i] = pads[i];
        s->p.conv.pad_end[i] = pads[nsp + i] - opad[i];
    }
    s->p.conv.groups = mdb_node_int(n, "group", 1);
    return 0;
}

static const lowerer_t lowerers[MDB_OP_COUNT] = {
    [MDB_OP_CONV] = {.lower = lower_conv},
    [MDB_OP_RELU] = ACT(WK_ACT_RELU),
    [MDB_OP_CLIP] = ACT(WK_ACT_CLIP, .alpha_attr = "min", .alpha_def = -INFINITY,
                        .beta_attr = "max", .beta_def = INFINITY),
    [MDB_OP_LEAKY_RELU] = ACT(WK_ACT_LEAKY_RELU, .alpha_attr = "alpha", .alpha_def = 0.01f),
    [MDB_OP_SIGMOID] = ACT(WK_ACT_SIGMOID),
    [MDB_OP_HARD_SIGMOID] = ACT(WK_ACT_HARDSIGMOID, .alpha_attr = "alpha", .alpha_def = 0.2f,
                                .beta_attr = "beta", .beta_def = 0.5f),
    [MDB_OP_HARD_SWISH] = ACT(WK_ACT_HARDSWISH),
    [MDB_OP_MAX_POOL] = {.lower = lower_pool, .kernel = WK_K_MAXPOOL},
    [MDB_OP_AVERAGE_POOL] = {.lower = lower_pool, .kernel = WK_K_AVGPOOL},
    [MDB_OP_GLOBAL_AVERAGE_POOL] = STEP(WK_K_GLOBALAVG),
    [MDB_OP_GEMM] = {.lower = lower_gemm},
    [MDB_OP_MATMUL] = STEP(WK_K_MATMUL),
    [MDB_OP_ADD] = BINARY(WK_BIN_ADD),
    [MDB_OP_MUL] = BINARY(WK_BIN_MUL),
    [MDB_OP_SUB] = BINARY(WK_BIN_SUB),
    [MDB_OP_DIV] = BINARY(WK_BIN_DIV),
    [MDB_OP_CONCAT] = {.lower = lower_concat_node, .own_outputs = true},
    [MDB_OP_FLATTEN] = STEP(WK_K_COPY),
    [MDB_OP_RESHAPE] = STEP(WK_K_COPY),
    [MDB_OP_TRANSPOSE] = {.lower = lower_transpose},
    [MDB_OP_SOFTMAX] = {.lower = lower_softmax},
    [MDB_OP_PAD] = {.lower = lower_pad, .own_outputs = true},
    [MDB_OP_DROPOUT] = {.lower = lower_identity, .own_outputs = true},
    [MDB_OP_IDENTITY] = {.lower = lower_identity, .own_outputs = true},
    [MDB_OP_REDUCE_MEAN] = {.lower = lower_reduce_mean},
    [MDB_OP_BATCH_NORM] = {.lower = lower_batch_norm},
    [MDB_OP_SPLIT] = {.lower = lower_split, .own_outputs = true},
    [MDB_OP_SLICE] = {.lower = lower_slice},
    [MDB_OP_POW] = ACT(WK_ACT_POW, .alpha_attr = "exponent", .alpha_def = 1.0f),
    [MDB_OP_SQRT] = ACT(WK_ACT_SQRT),
    [MDB_OP_ERF] = STEP(WK_K_ERF),
    [MDB_OP_EXPAND] = STEP(WK_K_EXPAND),
    [MDB_OP_LAYER_NORM] = {.lower = lower_layer_norm},
    [MDB_OP_GELU] = ACT(WK_ACT_GELU),
    [MDB_OP_EINSUM] = {.lower = lower_einsum},
    [MDB_OP_TANH] = ACT(WK_ACT_TANH),
    [MDB_OP_NEG] = ACT(WK_ACT_NEG),
    [MDB_OP_EXP] = ACT(WK_ACT_EXP),
    [MDB_OP_RESIZE] = {.lower = lower_resize},
    [MDB_OP_CONV_TRANSPOSE] = {.lower = lower_conv_transpose},
    [MDB_OP_GATHER] = {.lower = lower_gather},
    /* import-time only: folded away before the worker sees a graph */
    [MDB_OP_CONSTANT] = {0},
    [MDB_OP_SHAPE] = {0},
    [MDB_OP_UNSQUEEZE] = {0},
    [MDB_OP_SQUEEZE] = {0},
    [MDB_OP_CAST] = {0},
    [MDB_OP_CONSTANT_OF_SHAPE] = {0},
    [MDB_OP_EQUAL] = {0},
    [MDB_OP_WHERE] = {0},
    [MDB_OP_MOD] = {0},
    [MDB_OP_RANGE] = {0},
    [MDB_OP_NOT] = {0},
    [MDB_OP_SCATTER_ND] = {0},
};
static_assert(MDB_OP_COUNT == 53, "a new op (MDB_OPS): give it its entry in lowerers");

#undef STEP
#undef ACT
#undef BINARY

bool wk__op_lowers(int op)
{
    return op >= 0 && op < MDB_OP_COUNT && lowerers[op].lower != NULL;
}

static int lower_node(lower_t *L, const mdb_node_t *n)
{
    const lowerer_t *how = (unsigned)n->op < MDB_OP_COUNT ? &lowerers[n->op] : NULL;
    if (how == NULL || how->lower == NULL)
        return fail(L, SQ_UNSUPPORTED_MODEL, n, "op not supported by the executor");
    if (n->n_inputs < 1 || n->n_outputs < 1)
        return fail(L, SQ_BAD_MODEL, n, "no %s", n->n_inputs < 1 ? "input" : "output");
    /* Concat has any number of inputs; the other ops at most 5, and some
     * read optional ones past n_inputs as -1. */
    int slots = n->n_inputs > 8 ? n->n_inputs : 8;
    int *in = sq_xmalloc((size_t)slots * sizeof(*in));
    int rc = 0, out = -1;
    for (int i = 0; i < slots; i++)
        in[i] = -1;
    for (int i = 0; i < n->n_inputs; i++) {
        in[i] = n->inputs[i] >= 0 ? value_of(L, n->inputs[i], n) : -1;
        if (n->inputs[i] >= 0 && in[i] < 0) {
            rc = in[i];
            goto out;
        }
    }
    if (in[0] < 0) {
        rc = fail(L, SQ_BAD_MODEL, n, "no input");
        goto out;
    }
    if (!how->own_outputs && (out = output_of(L, n->outputs[0], n)) < 0) {
        rc = out;
        goto out;
    }
    rc = how->lower(L, n, how, in, out);
out:
    free(in);
    return rc;
}

int wk_lower(const mdb_graph_t *src, sq_dev_kind_t dev, int max_batch, int64_t static_batch,
             wk_graph_t **out, char *why, int why_size)
{
    bool has_batch = false;
    for (int i = 0; i < src->n_tensors; i++)
        if (src->tensors[i].shape_known && mdb_shape_has_batch(&src->tensors[i].shape))
            has_batch = true;
    lower_t L = {.src = src, .why = why, .why_size = why_size, .static_batch = static_batch};
    L.g = wk_graph_new(has_batch && static_batch <= 0 ? max_batch : 1);
    L.val = sq_xmalloc((size_t)(src->n_tensors ? src->n_tensors : 1) * sizeof(int));
    for (int i = 0; i < src->n_tensors; i++)
        L.val[i] = -1;
    int rc = 0;
    for (int i = 0; i < src->n_inputs; i++) {
        const mdb_tensor_t *t = &src->tensors[src->inputs[i]];
        if (t->dtype != MDB_DT_FLOAT) {
            rc = fail(&L, SQ_UNSUPPORTED_MODEL, NULL, "input '%s' is %s, not float", t->name,
                      mdb_dtype_name(t->dtype));
            goto out;
        }
        int64_t dims[WK_MAX_DIMS];
        bool batched = false;
        for (int d = 0; d < t->shape.rank; d++) {
            dims[d] = t->shape.dims[d];
            if (dims[d] < 0) {
                if (static_batch > 0)
                    dims[d] = -dims[d] * static_batch;
                else
                    batched = true;
            }
        }
        if (batched && t->shape.dims[0] != MDB_DIM_BATCH) {
            rc = fail(&L, SQ_UNSUPPORTED_MODEL, NULL, "input '%s': batch not in dim 0", t->name);
            goto out;
        }
        L.val[src->inputs[i]] = wk_graph_input(L.g, t->name, t->shape.rank, dims, batched);
    }
    for (int i = 0; i < src->n_nodes; i++) {
        const mdb_node_t *n = &src->nodes[i];
        if ((rc = mdb_node_runnable_on(src, i, dev, static_batch > 0, why, (size_t)why_size)) != 0)
            goto out;
        if ((rc = lower_node(&L, n)) < 0)
            goto out;
    }
    for (int i = 0; i < src->n_outputs; i++) {
        int t = src->outputs[i];
        int v = L.val[t] >= 0 ? L.val[t] : value_of(&L, t, NULL);
        if (v < 0) {
            rc = v;
            goto out;
        }
        wk_graph_mark_output(L.g, v);
    }
    rc = wk_graph_finish(L.g, why, why_size);
out:
    free(L.val);
    if (rc != 0) {
        wk_graph_free(L.g);
        return rc;
    }
    *out = L.g;
    return 0;
}
