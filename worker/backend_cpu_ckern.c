/* The cpu backend's kernels in plain C over plain buffers, for what oneDNN
 * has no primitive for (backend_cpu_int.h): Pad, Slice, Erf and Expand, and
 * the Resize modes that oneDNN's resampling does not compute (bicubic among
 * them).
 * Their builder only queues an item without a primitive; the backend runs
 * the op's run_c for it (wk__cpu_ops). */
#include "backend_cpu_int.h"
#include "wk_resize.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Pad, Slice, Erf and Expand run as plain C over plain buffers. */
int wk__cpu_build_c_kernel(wk_plan_t *plan, int si, int batch)
{
    cpu_be_t *be = plan->be;
    const wk_step_t *s = &plan->graph->steps[si];
    cpu_step_t *cs = &be->steps[si];
    if (be->phase == 1) {
        wk__cpu_set_out_plain(plan, s->out);
        int src = wk__cpu_as_plain(plan, si, batch, s->in[0], &cs->tmp_src);
        if (src < 0)
            return src;
        cs->bias = src;
        return 0;
    }
    if (cs->tmp_src >= 0 && wk__cpu_as_layout(plan, si, batch, s->in[0], NULL, &cs->tmp_src) < 0)
        return SQ_UNSUPPORTED_MODEL;
    if (be->dry)
        return 0;
    cpu_item_t it = {.prim = NULL, .step = si};
    wk__cpu_push_item(be, batch, &it);
    return 0;
}

void wk__cpu_run_pad(const wk_step_t *s, const wk_value_t *x, const wk_value_t *y, int batch,
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

void wk__cpu_run_slice(const wk_step_t *s, const wk_value_t *x, const wk_value_t *y, int batch,
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

/* erf(x): oneDNN has no erf eltwise (only gelu_erf, the whole GELU), and
 * an exported model may use Erf on its own. */
void wk__cpu_run_erf(const wk_step_t *s, const wk_value_t *x, const wk_value_t *y, int batch,
                     const float *src, float *dst)
{
    (void)s;
    (void)x;
    int64_t n = wk_value_elems_at(y, batch);
    for (int64_t i = 0; i < n; i++)
        dst[i] = erff(src[i]);
}

/* Numpy broadcasting of x to y's shape (ViT's class token over the batch):
 * oneDNN broadcasts only a binary op's second source, so this is a copy by
 * hand, one innermost row at a time. */
void wk__cpu_run_expand(const wk_step_t *s, const wk_value_t *x, const wk_value_t *y, int batch,
                        const float *src, float *dst)
{
    (void)s;
    int64_t xd[WK_MAX_DIMS], yd[WK_MAX_DIMS], xs[WK_MAX_DIMS], idx[WK_MAX_DIMS] = {0};
    int n = wk_value_dims_at(y, batch, yd), shift = n - x->ndim;
    wk_value_dims_at(x, batch, xd);
    int64_t acc = 1;
    for (int i = n - 1; i >= 0; i--) {
        int xi = i - shift;
        int64_t d = xi >= 0 ? xd[xi] : 1;
        xs[i] = d == 1 ? 0 : acc;
        acc *= d;
    }
    if (n == 0) {
        dst[0] = src[0];
        return;
    }
    int64_t inner = yd[n - 1];
    if (inner == 0)
        return;
    int64_t rows = wk_value_elems_at(y, batch) / inner;
    for (int64_t r = 0; r < rows; r++) {
        int64_t off = 0;
        for (int i = 0; i < n - 1; i++)
            off += idx[i] * xs[i];
        for (int64_t k = 0; k < inner; k++)
            dst[k] = src[off + k * xs[n - 1]];
        dst += inner;
        for (int i = n - 2; i >= 0; i--) {
            if (++idx[i] < yd[i])
                break;
            idx[i] = 0;
        }
    }
}

/* Bicubic resize of one plane: per output row its four source rows, then
 * per output pixel its four columns of each. */
static void resize_cubic_plane(const ck_resize_how_t *h, const float *in, int64_t ih, int64_t iw,
                               int64_t oh, int64_t ow, float *dst)
{
    float sh = h->scale[0], sw = h->scale[1];
    for (int64_t oy = 0; oy < oh; oy++, dst += ow) {
        int64_t ys[4], xs[4];
        float wy[4], wx[4];
        ck_resize_cubic(h, oy, ih, oh, sh, ys, wy);
        for (int64_t ox = 0; ox < ow; ox++) {
            ck_resize_cubic(h, ox, iw, ow, sw, xs, wx);
            float acc = 0.0f;
            for (int r = 0; r < 4; r++) {
                const float *row = in + ys[r] * iw;
                acc += wy[r] * (wx[0] * row[xs[0]] + wx[1] * row[xs[1]] + wx[2] * row[xs[2]] +
                                wx[3] * row[xs[3]]);
            }
            dst[ox] = acc;
        }
    }
}

/* Resize of NCHW maps (H and W; mdb_node_runnable): nearest, bilinear or
 * bicubic, the modes oneDNN's resampling does not compute exactly
 * (wk__cpu_build_resize). */
void wk__cpu_run_resize(const wk_step_t *s, const wk_value_t *x, const wk_value_t *y, int batch,
                        const float *src, float *dst)
{
    int64_t xd[WK_MAX_DIMS], yd[WK_MAX_DIMS];
    wk_value_dims_at(x, batch, xd);
    wk_value_dims_at(y, batch, yd);
    int64_t planes = yd[0] * yd[1], ih = xd[2], iw = xd[3], oh = yd[2], ow = yd[3];
    const ck_resize_how_t how = wk_resize_how(s), *h = &how;
    float sh = h->scale[0], sw = h->scale[1];
    for (int64_t p = 0; p < planes; p++) {
        const float *in = src + p * ih * iw;
        if (h->mode == CK_RESIZE_CUBIC) {
            resize_cubic_plane(h, in, ih, iw, oh, ow, dst);
            dst += oh * ow;
            continue;
        }
        for (int64_t oy = 0; oy < oh; oy++, dst += ow) {
            if (h->mode == CK_RESIZE_NEAREST) {
                const float *row =
                    in + ck_resize_nearest(h, ck_resize_coord(h, oy, ih, oh, sh), ih) * iw;
                for (int64_t ox = 0; ox < ow; ox++)
                    dst[ox] = row[ck_resize_nearest(h, ck_resize_coord(h, ox, iw, ow, sw), iw)];
                continue;
            }
            int64_t y1, y2;
            float wy1, wy2;
            ck_resize_linear(h, oy, ih, oh, sh, &y1, &y2, &wy1, &wy2);
            const float *r1 = in + y1 * iw, *r2 = in + y2 * iw;
            for (int64_t ox = 0; ox < ow; ox++) {
                int64_t x1, x2;
                float wx1, wx2;
                ck_resize_linear(h, ox, iw, ow, sw, &x1, &x2, &wx1, &wx2);
                dst[ox] = wx1 * wy1 * r1[x1] + wx2 * wy1 * r1[x2] + wx1 * wy2 * r2[x1] +
                          wx2 * wy2 * r2[x2];
            }
        }
    }
}
