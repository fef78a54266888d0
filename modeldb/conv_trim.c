/* Conv taps that only ever read padding, dropped at import. A dilated conv
 * on a map smaller than its dilation reads the zeros of its pads with every
 * tap but the centre: DeepLabV3's atrous pyramid (3x3 convs of dilation
 * 12, 24 and 36, padded as much) on the 10x10 map of a 160x160 image, where
 * each is a 1x1 conv that oneDNN would otherwise run as a 3x3 one through
 * its im2col gemm, 9x the work (and the pyramid most of the model's time).
 *
 * On an axis of input size H, output size O, stride s, dilation d and
 * begin pad p, tap j reads x[o * s + j * d - p] for o in 0..O-1; a tap
 * none of whose positions lands in 0..H-1 contributes zero everywhere.
 * The taps before the first live one j0 and after the last live one j1
 * go: the kernel keeps j0..j1, the begin pad shrinks by j0 * d and the end
 * pad by (k - 1 - j1) * d, which leaves every output position reading what
 * it read and the output size as it was. Where the pads are symmetric, the
 * same number of taps goes from each end, so that they stay symmetric.
 * Only where both pads stay >= 0
 * (otherwise the trimmed window would crop the input); a kernel left 1
 * wide on an axis gets dilation 1 there. The result is the same sum in the
 * same order without its zero terms: the outputs match bit for bit up to
 * the kernel the backend picks. */
#include "mdb_graph.h"
#include "mdb_graph_int.h"

#include <sq.h>

#include <stdio.h>
#include <string.h>

/* Whether tap j of an axis reads some input position (see top). */
static bool tap_live(int64_t j, int64_t in, int64_t out, int64_t stride, int64_t dilation,
                     int64_t pad_begin)
{
    int64_t lo = j * dilation - pad_begin, hi = lo + (out - 1) * stride;
    if (hi < 0 || lo >= in)
        return false;
    int64_t first = lo >= 0 ? 0 : (-lo + stride - 1) / stride;
    return lo + first * stride < in;
}

/* The taps of one conv axis worth keeping: [*keep_begin, *keep_end]. */
typedef struct {
    int64_t keep_begin, keep_end;
} axis_keep_t;

/* Trims conv node idx where it can; true when it did. */
static bool trim_conv(mdb_graph_t *g, int idx)
{
    mdb_node_t *n = &g->nodes[idx];
    if (n->n_inputs < 2 || n->inputs[0] < 0 || n->inputs[1] < 0 || n->n_outputs < 1 ||
        n->outputs[0] < 0)
        return false;
    const mdb_tensor_t *x = &g->tensors[n->inputs[0]], *w = &g->tensors[n->inputs[1]];
    const mdb_tensor_t *y = &g->tensors[n->outputs[0]];
    int sp = x->shape.rank - 2;
    if (sp < 1 || !x->shape_known || !y->shape_known || y->shape.rank != x->shape.rank ||
        w->data == NULL || w->dtype != MDB_DT_FLOAT || w->shape.rank != x->shape.rank)
        return false;
    size_t nk, ns, nd, np;
    const int64_t *k = mdb_node_ints(n, "kernel_shape", &nk);
    const int64_t *s = mdb_node_ints(n, "strides", &ns);
    const int64_t *d = mdb_node_ints(n, "dilations", &nd);
    const int64_t *p = mdb_node_ints(n, "pads", &np);
    if (k == NULL || s == NULL || d == NULL || p == NULL || (int)nk != sp || (int)ns != sp ||
        (int)nd != sp || (int)np != 2 * sp)
        return false;
    axis_keep_t keep[MDB_MAX_RANK];
    bool trimmed = false;
    for (int i = 0; i < sp; i++) {
        int64_t in = x->shape.dims[2 + i], out = y->shape.dims[2 + i];
        keep[i] = (axis_keep_t){0, k[i] - 1};
        if (in < 1 || out < 1 || s[i] < 1 || d[i] < 1 || k[i] != w->shape.dims[2 + i])
            return false;
        int64_t j0 = 0, j1 = k[i] - 1;
        while (j0 < k[i] && !tap_live(j0, in, out, s[i], d[i], p[i]))
            j0++;
        while (j1 > j0 && !tap_live(j1, in, out, s[i], d[i], p[i]))
            j1--;
        /* No live tap at all (the output is the bias): left as it is. */
        if (j0 == k[i])
            continue;
        /* Symmetric pads stay symmetric: as many taps go from each end
         * (the dead ones left read zeros, as before). A stride-2 conv on
         * a 2x2 map reads padding with its first tap only; trimmed on one
         * side its pads would be asymmetric, which cuDNN does not take
         * (every SSD and RetinaNet extra block on a small map), to save
         * one tap of a map that small. */
        if (p[i] == p[sp + i]) {
            int64_t t = j0 < k[i] - 1 - j1 ? j0 : k[i] - 1 - j1;
            j0 = t;
            j1 = k[i] - 1 - t;
        }
        if (j0 == 0 && j1 == k[i] - 1)
            continue;
        if (p[i] - j0 * d[i] < 0 || p[sp + i] - (k[i] - 1 - j1) * d[i] < 0)
            continue;
        keep[i] = (axis_keep_t){j0, j1};
        trimmed = true;
    }
    if (!trimmed)
        return false;

    mdb_shape_t ws = w->shape;
    int64_t kernel[MDB_MAX_RANK], tap_stride[MDB_MAX_RANK], dil[MDB_MAX_RANK];
    int64_t pads[2 * MDB_MAX_RANK];
    for (int i = 0; i < sp; i++) {
        kernel[i] = keep[i].keep_end - keep[i].keep_begin + 1;
        ws.dims[2 + i] = kernel[i];
        dil[i] = kernel[i] == 1 ? 1 : d[i];
        pads[i] = p[i] - keep[i].keep_begin * d[i];
        pads[sp + i] = p[sp + i] - (k[i] - 1 - keep[i].keep_end) * d[i];
    }
    /* Row-major strides of the old kernel window, innermost last. */
    int64_t window = 1;
    for (int i = sp - 1; i >= 0; i--) {
        tap_stride[i] = window;
        window *= k[i];
    }
    int64_t new_window = 1;
    for (int i = 0; i < sp; i++)
        new_window *= kernel[i];
    int64_t filters = w->shape.dims[0] * w->shape.dims[1];
    const float *src = w->data;
    float *dst = sq_xmalloc((size_t)(filters * new_window) * sizeof(float));
    for (int64_t f = 0; f < filters; f++)
        for (int64_t t = 0; t < new_window; t++) {
            /* Tap t of the trimmed window, as its place in the old one. */
            int64_t rest = t, at = 0;
            for (int i = sp - 1; i >= 0; i--) {
                at += (rest % kernel[i] + keep[i].keep_begin) * tap_stride[i];
                rest /= kernel[i];
            }
            dst[f * new_window + t] = src[f * window + at];
        }
    char name[256];
    snprintf(name, sizeof(name), "%s/live_taps", w->name);
    int wt = mdb_graph_add_tensor(g, name, MDB_DT_FLOAT, &ws);
    mdb_graph_set_data(g, wt, dst, (size_t)(filters * new_window) * sizeof(float));
    /* add_tensor may have moved the tensors; n is a node, still in place. */
    n->inputs[1] = wt;
    mdb_node_set_ints(n, "kernel_shape", kernel, (size_t)sp);
    mdb_node_set_ints(n, "dilations", dil, (size_t)sp);
    mdb_node_set_ints(n, "pads", pads, (size_t)(2 * sp));
    return true;
}

int mdb_graph_trim_convs(mdb_graph_t *g)
{
    int trimmed = 0;
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].op == MDB_OP_CONV)
            trimmed += trim_conv(g, i);
    if (trimmed > 0)
        mdb_graph_compact(g);
    return trimmed;
}
