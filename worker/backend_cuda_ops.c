/* The cuda backend's steps: convolutions and pooling on cuDNN (NHWC in 16
 * bits, plain FP32 otherwise), softmax and mean reductions on cuDNN in
 * FP32, GEMMs on cuBLAS, and everything elementwise, broadcast, strided or
 * normalized on the kernels of cuda_kernels.cu, which read and write any
 * of the value layouts (backend_cuda_int.h: cuda_rep_t) directly. */
#include "wk_resize.h"
#include "backend_cuda_int.h"

#include <sq.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const float wk__cuda_one = 1.0f, wk__cuda_zero = 0.0f;
#define one wk__cuda_one
#define zero wk__cuda_zero

_Static_assert((int)CK_ACT_COUNT_ == (int)WK_ACT_COUNT_, "one list of activations: wk_acts.h");
_Static_assert(CK_MAX_DIMS == WK_MAX_DIMS, "one bound on ranks");
_Static_assert(CK_MAX_POST >= WK_MAX_POST + 1, "a conv's bias and post-ops in one pointwise");

/* ---- layouts and descriptors ---- */

size_t wk__cuda_dt_size(ck_dtype_t dt)
{
    return dt == CK_F32 ? 4 : 2;
}

cudnnDataType_t wk__cuda_dnn_type(ck_dtype_t dt)
{
    return dt == CK_F16 ? CUDNN_DATA_HALF : dt == CK_BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
}

static void row_strides(int ndim, const int64_t *dims, int64_t *st)
{
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        st[i] = s;
        s *= dims[i];
    }
}

void wk__cuda_rep_strides(const wk_value_t *v, int batch, cuda_rep_t r, int64_t *st)
{
    int64_t d[WK_MAX_DIMS];
    int n = wk_value_dims_at(v, batch, d);
    if (r.nhwc && n == 4) {
        st[1] = 1;
        st[3] = d[1];
        st[2] = d[1] * d[3];
        st[0] = d[1] * d[3] * d[2];
    } else {
        row_strides(n, d, st);
    }
}

cudnnStatus_t wk__cuda_set_plain(cudnnTensorDescriptor_t d, int ndim, const int64_t *dims)
{
    int n = ndim < 4 ? 4 : ndim, da[WK_MAX_DIMS + 4], sa[WK_MAX_DIMS + 4];
    for (int i = 0; i < n; i++)
        da[i] = i < ndim ? (int)dims[i] : 1;
    int s = 1;
    for (int i = n - 1; i >= 0; i--) {
        sa[i] = s;
        s *= da[i];
    }
    return cudnnSetTensorNdDescriptor(d, CUDNN_DATA_FLOAT, n, da, sa);
}

static cudnnStatus_t set_strided(cudnnTensorDescriptor_t d, int ndim, const int64_t *dims,
                                 const int64_t *strides)
{
    int n = ndim < 4 ? 4 : ndim, da[WK_MAX_DIMS + 4], sa[WK_MAX_DIMS + 4];
    for (int i = 0; i < n; i++) {
        da[i] = i < ndim ? (int)dims[i] : 1;
        sa[i] = i < ndim ? (int)strides[i] : 1;
    }
    return cudnnSetTensorNdDescriptor(d, CUDNN_DATA_FLOAT, n, da, sa);
}

cudnnStatus_t wk__cuda_set_value(cudnnTensorDescriptor_t d, const wk_value_t *v, int batch)
{
    int64_t dims[WK_MAX_DIMS];
    int n = wk_value_dims_at(v, batch, dims);
    return wk__cuda_set_plain(d, n, dims);
}

cudnnStatus_t wk__cuda_set_nhwc(cudnnTensorDescriptor_t d, const wk_value_t *v, int batch,
                                ck_dtype_t dt)
{
    int64_t x[WK_MAX_DIMS];
    wk_value_dims_at(v, batch, x);
    return cudnnSetTensor4dDescriptor(d, CUDNN_TENSOR_NHWC, wk__cuda_dnn_type(dt), (int)x[0],
                                      (int)x[1], (int)x[2], (int)x[3]);
}

cudnnStatus_t wk__cuda_set_io(const cuda_be_t *be, cudnnTensorDescriptor_t dx,
                              cudnnTensorDescriptor_t dy, const wk_value_t *x, const wk_value_t *y,
                              int batch, bool half)
{
    cudnnStatus_t st =
        half ? wk__cuda_set_nhwc(dx, x, batch, be->dt16) : wk__cuda_set_value(dx, x, batch);
    if (st != CUDNN_STATUS_SUCCESS)
        return st;
    return half ? wk__cuda_set_nhwc(dy, y, batch, be->dt16) : wk__cuda_set_value(dy, y, batch);
}

/* ---- tensors for the kernels ---- */

static void *vptr(cuda_be_t *be, int v)
{
    return be->dconst[v] != NULL ? (void *)be->dconst[v] : (void *)(be->arena + be->offset[v]);
}

/* Value v as it lies, with its own dims. */
static ck_ten_t ten(cuda_be_t *be, const wk_graph_t *g, int v, int batch)
{
    ck_ten_t t = {.p = vptr(be, v), .dt = be->rep[v].dt};
    wk__cuda_rep_strides(&g->values[v], batch, be->rep[v], t.st);
    return t;
}

/* t seen with the `ndim` dims of `dims` by numpy broadcasting: missing
 * leading dims and dims of 1 get stride 0. t's strides are for vdims. */
static ck_ten_t bcast(ck_ten_t t, int vn, const int64_t *vdims, int ndim, const int64_t *dims)
{
    ck_ten_t r = t;
    for (int i = 0; i < ndim; i++) {
        int vi = i - (ndim - vn);
        r.st[i] = vi < 0 || (vdims[vi] == 1 && dims[i] != 1) ? 0 : t.st[vi];
    }
    return r;
}

/* Value v broadcast to the dims of value y at batch. */
static ck_ten_t ten_to(cuda_be_t *be, const wk_graph_t *g, int v, int y, int batch,
                       ck_pointwise_t *pw)
{
    int64_t vd[WK_MAX_DIMS];
    int vn = wk_value_dims_at(&g->values[v], batch, vd);
    pw->ndim = wk_value_dims_at(&g->values[y], batch, pw->dims);
    return bcast(ten(be, g, v, batch), vn, vd, pw->ndim, pw->dims);
}

static ck_ten_t at_offset(ck_ten_t t, int64_t elems)
{
    t.p = (char *)t.p + elems * (int64_t)wk__cuda_dt_size(t.dt);
    return t;
}

static int pointwise(wk_plan_t *plan, const ck_pointwise_t *pw)
{
    cuda_be_t *be = plan->be;
    int rc = 0;
    CU(ck_pointwise(be->stream, pw));
out:
    return rc;
}

int wk__cuda_convert(wk_plan_t *plan, int v, int batch, cuda_rep_t r, void *dst)
{
    cuda_be_t *be = plan->be;
    const wk_graph_t *g = plan->graph;
    ck_pointwise_t pw = {0};
    pw.ndim = wk_value_dims_at(&g->values[v], batch, pw.dims);
    pw.x = ten(be, g, v, batch);
    pw.y = (ck_ten_t){.p = dst, .dt = r.dt};
    wk__cuda_rep_strides(&g->values[v], batch, r, pw.y.st);
    return pointwise(plan, &pw);
}

static bool rep_eq(cuda_rep_t a, cuda_rep_t b, int ndim)
{
    return a.dt == b.dt && (ndim != 4 || a.nhwc == b.nhwc);
}

/* Input slot k of step si as the step wants it (cuda_step_t.want). */
static int input(wk_plan_t *plan, int si, int k, int batch, ck_ten_t *t)
{
    cuda_be_t *be = plan->be;
    const wk_graph_t *g = plan->graph;
    cuda_step_t *cs = &be->steps[si];
    int v = g->steps[si].in[k];
    *t = ten(be, g, v, batch);
    if (!cs->needs[k])
        return 0;
    if (cs->cvt[k]) {
        void *dst = be->arena + cs->cvt_offset[k];
        int rc = wk__cuda_convert(plan, v, batch, cs->want[k], dst);
        t->p = dst;
        t->dt = cs->want[k].dt;
        wk__cuda_rep_strides(&g->values[v], batch, cs->want[k], t->st);
        return rc;
    }
    if (be->dconst16[v] != NULL && rep_eq(be->crep[v], cs->want[k], g->values[v].ndim)) {
        t->p = be->dconst16[v];
        t->dt = be->crep[v].dt;
        wk__cuda_rep_strides(&g->values[v], batch, be->crep[v], t->st);
    }
    return 0;
}

/* ---- steps ---- */

/* y = post-ops(y + bias), in place, in one pass (the conv's output in
 * whatever layout it has). */
static int conv_epilogue(wk_plan_t *plan, int si, int batch, bool bias)
{
    cuda_be_t *be = plan->be;
    const wk_graph_t *g = plan->graph;
    const wk_step_t *s = &g->steps[si];
    ck_pointwise_t pw = {0};
    pw.ndim = wk_value_dims_at(&g->values[s->out], batch, pw.dims);
    pw.y = pw.x = ten(be, g, s->out, batch);
    if (bias) {
        ck_ten_t b = {.p = be->dconst[s->in[2]] != NULL ? be->dconst[s->in[2]] : vptr(be, s->in[2]),
                      .dt = be->dconst[s->in[2]] != NULL ? CK_F32 : be->rep[s->in[2]].dt};
        b.st[1] = 1; /* [C] along the channels */
        pw.post[pw.n_post++] = (ck_post_t){.op = CK_OP_ADD, .t = b};
    }
    for (int i = 0; i < s->n_post; i++) {
        if (s->post[i].kind == WK_POST_ADD) {
            ck_post_t q = {.op = CK_OP_ADD};
            q.t = ten_to(be, g, s->post[i].value, s->out, batch, &pw);
            pw.post[pw.n_post++] = q;
        } else {
            wk_act_t a = s->post[i].act;
            pw.post[pw.n_post++] =
                (ck_post_t){.op = CK_OP_ACT, .act = {(int)a.kind, a.alpha, a.beta}};
        }
    }
    if (pw.n_post == 0)
        return 0;
    return pointwise(plan, &pw);
}

static int run_conv(wk_plan_t *plan, int si, int batch)
{
    cuda_be_t *be = plan->be;
    const wk_graph_t *g = plan->graph;
    const wk_step_t *s = &g->steps[si];
    cuda_step_t *cs = &be->steps[si];
    int rc = 0;
    const wk_value_t *x = &g->values[s->in[0]], *y = &g->values[s->out];
    void *yp = vptr(be, s->out);
    bool bias = s->n_in > 2 && s->in[2] >= 0;
    ck_ten_t xt, wt;
    if ((rc = input(plan, si, 0, batch, &xt)) != 0 || (rc = input(plan, si, 1, batch, &wt)) != 0)
        goto out;
    DNN(wk__cuda_set_io(be, be->td[0], be->td[1], x, y, batch, cs->half));
    /* cuDNN's fused call: y = act(conv(x) + alpha2 z + bias), the residual
     * as z (alpha2 0 when there is none: z is then not read, cuDNN's rule
     * for a zero blend factor). Identity needs the implicit precomputed
     * GEMM algorithm; a conv the call refuses goes back to the separate
     * calls below, for good (the warm-up run at prepare settles it). */
    if (cs->fused &&
        (cs->fused_relu || cs->algo[batch] == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM)) {
        int64_t bd[2] = {1, y->dims[1]};
        bool res = s->n_post > 0 && s->post[0].kind == WK_POST_ADD;
        float alpha2 = res ? 1.0f : 0.0f;
        DNN(wk__cuda_set_plain(be->td[2], 2, bd));
        DNN(cudnnSetActivationDescriptor(
            be->act, cs->fused_relu ? CUDNN_ACTIVATION_RELU : CUDNN_ACTIVATION_IDENTITY,
            CUDNN_PROPAGATE_NAN, 0.0));
        cudnnStatus_t st = cudnnConvolutionBiasActivationForward(
            be->dnn, &one, be->td[0], xt.p, cs->filter, wt.p, cs->conv, cs->algo[batch],
            be->workspace, be->workspace_bytes, &alpha2, be->td[1],
            res ? vptr(be, s->post[0].value) : yp, be->td[2], vptr(be, s->in[2]), be->act,
            be->td[1], yp);
        if (st == CUDNN_STATUS_SUCCESS)
            return 0;
        if (st != CUDNN_STATUS_NOT_SUPPORTED)
            DNN(st);
        SQ_DEBUG("cuda: step %d: the fused conv is not supported here (%s); separate calls", si,
                 cudnnGetErrorString(st));
        cs->fused = false;
    }
    DNN(cudnnConvolutionForward(be->dnn, &one, be->td[0], xt.p, cs->filter, wt.p, cs->conv,
                                cs->algo[batch], be->workspace, be->workspace_bytes, &zero,
                                be->td[1], yp));
    rc = conv_epilogue(plan, si, batch, bias);
out:
    return rc;
}

static int run_pool(wk_plan_t *plan, int si, int batch)
{
    cuda_be_t *be = plan->be;
    const wk_graph_t *g = plan->graph;
    const wk_step_t *s = &g->steps[si];
    cuda_step_t *cs = &be->steps[si];
    int rc = 0;
    const wk_value_t *x = &g->values[s->in[0]], *y = &g->values[s->out];
    ck_ten_t xt;
    if ((rc = input(plan, si, 0, batch, &xt)) != 0)
        goto out;
    const void *xp = xt.p;
    DNN(wk__cuda_set_io(be, be->td[0], be->td[1], x, y, batch, cs->half));
    if (cs->pad_explicit) {
        /* Asymmetric pads (FP32 only): copy into a -inf (max) or 0 (avg)
         * frame first. */
        int64_t pd[WK_MAX_DIMS], st[WK_MAX_DIMS];
        wk_value_dims_at(x, batch, pd);
        for (int i = 0; i < s->p.conv.n_spatial; i++)
            pd[2 + i] += s->p.conv.pad_begin[i] + s->p.conv.pad_end[i];
        row_strides(x->ndim, pd, st);
        float *tmp = (float *)(be->arena + cs->pad_offset);
        float fill = s->kind == WK_K_MAXPOOL ? -INFINITY : 0.0f;
        DNN(wk__cuda_set_plain(be->td[2], x->ndim, pd));
        DNN(cudnnSetTensor(be->dnn, be->td[2], tmp, &fill));
        int64_t off = 0, xd[WK_MAX_DIMS];
        wk_value_dims_at(x, batch, xd);
        for (int i = 0; i < s->p.conv.n_spatial; i++)
            off += s->p.conv.pad_begin[i] * st[2 + i];
        DNN(set_strided(be->td[3], x->ndim, xd, st));
        DNN(cudnnTransformTensor(be->dnn, &one, be->td[0], xp, &zero, be->td[3], tmp + off));
        DNN(wk__cuda_set_plain(be->td[0], x->ndim, pd));
        xp = tmp;
    }
    DNN(cudnnPoolingForward(be->dnn, cs->pool, &one, be->td[0], xp, &zero, be->td[1],
                            vptr(be, s->out)));
out:
    return rc;
}

/* Elementwise, broadcasting and normalizing kinds: one kernel each. */
static int run_pointwise(wk_plan_t *plan, int si, int batch)
{
    cuda_be_t *be = plan->be;
    const wk_graph_t *g = plan->graph;
    const wk_step_t *s = &g->steps[si];
    ck_pointwise_t pw = {0};
    pw.y = ten(be, g, s->out, batch);
    pw.x = ten_to(be, g, s->in[0], s->out, batch, &pw);
    switch (s->kind) {
    case WK_K_ELTWISE:
        pw.post[pw.n_post++] = (ck_post_t){
            .op = CK_OP_ACT, .act = {(int)s->p.act.kind, s->p.act.alpha, s->p.act.beta}};
        break;
    case WK_K_ERF:
        pw.post[pw.n_post++] = (ck_post_t){.op = CK_OP_ACT, .act = {CK_ACT_ERF, 0, 0}};
        break;
    case WK_K_BINARY: {
        static const ck_op_t ops[WK_BIN_COUNT_] = {CK_OP_ADD, CK_OP_SUB, CK_OP_MUL, CK_OP_DIV};
        ck_post_t q = {.op = ops[s->p.binop]};
        q.t = ten_to(be, g, s->in[1], s->out, batch, &pw);
        pw.post[pw.n_post++] = q;
        break;
    }
    case WK_K_BATCHNORM: {
        ck_post_t m = {.op = CK_OP_MUL}, a = {.op = CK_OP_ADD};
        m.t = ten_to(be, g, s->in[1], s->out, batch, &pw);
        a.t = ten_to(be, g, s->in[2], s->out, batch, &pw);
        pw.post[pw.n_post++] = m;
        pw.post[pw.n_post++] = a;
        break;
    }
    case WK_K_EXPAND:
        break;
    default:
        return wk_fail(plan, SQ_INTERNAL, "step %d is no pointwise op", si);
    }
    return pointwise(plan, &pw);
}

static int run_layernorm(wk_plan_t *plan, int si, int batch)
{
    cuda_be_t *be = plan->be;
    const wk_graph_t *g = plan->graph;
    const wk_step_t *s = &g->steps[si];
    int rc = 0;
    bool affine = s->n_in == 3 && s->in[1] >= 0 && s->in[2] >= 0;
    ck_layernorm_t ln = {.epsilon = s->p.epsilon};
    ln.ndim = wk_value_dims_at(&g->values[s->in[0]], batch, ln.dims);
    ln.x = ten(be, g, s->in[0], batch);
    ln.y = ten(be, g, s->out, batch);
    if (affine) {
        ln.scale = be->dconst[s->in[1]];
        ln.shift = be->dconst[s->in[2]];
    }
    CU(ck_layernorm(be->stream, &ln));
out:
    return rc;
}

/* Resize (wk_resize.h): x and y as they lie (any type, NCHW or NHWC),
 * one thread an output element. */
static int run_resize(wk_plan_t *plan, int si, int batch)
{
    cuda_be_t *be = plan->be;
    const wk_graph_t *g = plan->graph;
    const wk_step_t *s = &g->steps[si];
    int rc = 0;
    ck_resize_t r = {.how = wk_resize_how(s)};
    int64_t xd[WK_MAX_DIMS];
    wk_value_dims_at(&g->values[s->in[0]], batch, xd);
    wk_value_dims_at(&g->values[s->out], batch, r.dims);
    r.in_h = xd[2];
    r.in_w = xd[3];
    r.x = ten(be, g, s->in[0], batch);
    r.y = ten(be, g, s->out, batch);
    CU(ck_resize(be->stream, &r));
out:
    return rc;
}

static int run_layout(wk_plan_t *plan, int si, int batch)
{
    cuda_be_t *be = plan->be;
    const wk_graph_t *g = plan->graph;
    const wk_step_t *s = &g->steps[si];
    int rc = 0;
    const wk_value_t *x = &g->values[s->in[0]], *y = &g->values[s->out];
    ck_ten_t xt = ten(be, g, s->in[0], batch), yt = ten(be, g, s->out, batch);
    ck_pointwise_t pw = {0};
    int64_t xd[WK_MAX_DIMS];
    int n = wk_value_dims_at(x, batch, xd);
    switch (s->kind) {
    case WK_K_COPY:
        /* same elements in row-major order, new dims: y read as x's dims */
        pw.ndim = n;
        memcpy(pw.dims, xd, sizeof(xd));
        pw.x = xt;
        pw.y = yt;
        row_strides(n, xd, pw.y.st);
        return pointwise(plan, &pw);
    case WK_K_CONCAT: {
        int64_t at = 0;
        for (int i = 0; i < s->n_in; i++) {
            pw.ndim = wk_value_dims_at(&g->values[s->in[i]], batch, pw.dims);
            pw.x = ten(be, g, s->in[i], batch);
            pw.y = at_offset(yt, at * yt.st[s->p.axis]);
            if ((rc = pointwise(plan, &pw)) != 0)
                return rc;
            at += pw.dims[s->p.axis];
        }
        return 0;
    }
    case WK_K_TRANSPOSE:
        pw.ndim = wk_value_dims_at(y, batch, pw.dims);
        pw.x = xt;
        for (int i = 0; i < y->ndim; i++)
            pw.x.st[i] = xt.st[s->p.perm[i]];
        pw.y = yt;
        return pointwise(plan, &pw);
    case WK_K_SLICE: {
        int64_t off = 0;
        pw.ndim = wk_value_dims_at(y, batch, pw.dims);
        pw.x = xt;
        for (int i = 0; i < n; i++) {
            pw.x.st[i] = xt.st[i] * s->p.slice.step[i];
            off += s->p.slice.start[i] * xt.st[i];
        }
        pw.x = at_offset(pw.x, off);
        pw.y = yt;
        return pointwise(plan, &pw);
    }
    case WK_K_PAD: {
        pw.ndim = wk_value_dims_at(y, batch, pw.dims);
        pw.y = yt;
        pw.x_const = s->p.pad.value; /* pw.x.p NULL: a fill */
        if ((rc = pointwise(plan, &pw)) != 0)
            return rc;
        int64_t off = 0;
        for (int i = 0; i < n; i++)
            off += s->p.pad.begin[i] * yt.st[i];
        pw.ndim = n;
        memcpy(pw.dims, xd, sizeof(xd));
        pw.x = xt;
        pw.y = at_offset(yt, off);
        return pointwise(plan, &pw);
    }
    default:
        rc = wk_fail(plan, SQ_INTERNAL, "step %d is no layout op", si);
    }
    return rc;
}

static int run_softmax(wk_plan_t *plan, int si, int batch)
{
    cuda_be_t *be = plan->be;
    const wk_graph_t *g = plan->graph;
    const wk_step_t *s = &g->steps[si];
    int rc = 0;
    const wk_value_t *x = &g->values[s->in[0]];
    int64_t d[WK_MAX_DIMS], v[4] = {1, 1, 1, 1};
    int n = wk_value_dims_at(x, batch, d);
    ck_ten_t xt;
    if ((rc = input(plan, si, 0, batch, &xt)) != 0)
        goto out;
    /* [outer, axis, inner, 1] with softmax over the channel dim, in FP32 */
    for (int i = 0; i < n; i++)
        v[i < s->p.axis ? 0 : i == s->p.axis ? 1 : 2] *= d[i];
    if (s->legacy_softmax) {
        v[1] *= v[2];
        v[2] = 1;
    }
    DNN(wk__cuda_set_plain(be->td[0], 4, v));
    DNN(cudnnSoftmaxForward(be->dnn, CUDNN_SOFTMAX_ACCURATE, CUDNN_SOFTMAX_MODE_CHANNEL, &one,
                            be->td[0], xt.p, &zero, be->td[0], vptr(be, s->out)));
out:
    return rc;
}

static cudaDataType_t blas_type(ck_dtype_t dt)
{
    return dt == CK_F16 ? CUDA_R_16F : dt == CK_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

static int run_gemm(wk_plan_t *plan, int si, int batch)
{
    cuda_be_t *be = plan->be;
    const wk_graph_t *g = plan->graph;
    const wk_step_t *s = &g->steps[si];
    int rc = 0;
    const wk_value_t *a = &g->values[s->in[0]], *b = &g->values[s->in[1]];
    const wk_value_t *y = &g->values[s->out];
    int64_t ad[WK_MAX_DIMS], bd[WK_MAX_DIMS], yd[WK_MAX_DIMS];
    wk_value_dims_at(a, batch, ad);
    wk_value_dims_at(b, batch, bd);
    wk_value_dims_at(y, batch, yd);
    void *yp = vptr(be, s->out);
    float beta = 0.0f;
    int64_t M, N, K, count = 1;
    cublasOperation_t op_a = CUBLAS_OP_N, op_b = CUBLAS_OP_N;
    float alpha = 1.0f;
    ck_ten_t at, bt;
    if ((rc = input(plan, si, 0, batch, &at)) != 0 || (rc = input(plan, si, 1, batch, &bt)) != 0)
        goto out;
    if (s->kind == WK_K_GEMM) {
        M = yd[0];
        N = yd[1];
        K = s->p.gemm.trans_a ? ad[0] : ad[1];
        op_a = s->p.gemm.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
        op_b = s->p.gemm.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
        alpha = s->p.gemm.alpha;
        if (s->n_in > 2 && s->in[2] >= 0) {
            /* y = beta_gemm * C (broadcast), then the product accumulates */
            ck_pointwise_t pw = {0};
            pw.y = ten(be, g, s->out, batch);
            pw.x = ten_to(be, g, s->in[2], s->out, batch, &pw);
            pw.post[pw.n_post++] = (ck_post_t){.op = CK_OP_SCALE, .scale = s->p.gemm.beta};
            if ((rc = pointwise(plan, &pw)) != 0)
                goto out;
            beta = 1.0f;
        }
    } else {
        /* MatMul: B 2-D (shared) folds A's batch dims into M; equal batch
         * dims run strided-batched. Other broadcasts were refused. */
        M = a->ndim >= 2 ? ad[a->ndim - 2] : 1;
        K = ad[a->ndim - 1];
        N = b->ndim >= 2 ? bd[b->ndim - 1] : 1;
        for (int i = 0; i < a->ndim - 2; i++)
            count *= ad[i];
        if (b->ndim <= 2) {
            M *= count;
            count = 1;
        }
    }
    /* Row-major Y = A B is column-major Y^T = B^T A^T. */
    int lda = op_a == CUBLAS_OP_N ? (int)K : (int)M, ldb = op_b == CUBLAS_OP_N ? (int)N : (int)K;
    if (be->dt16 == CK_F32) {
        /* FP32 and TF32: the handle's math mode says which */
        if (count == 1)
            BLAS(cublasSgemm(be->blas, op_b, op_a, (int)N, (int)M, (int)K, &alpha, bt.p, ldb, at.p,
                             lda, &beta, yp, (int)N));
        else
            BLAS(cublasSgemmStridedBatched(be->blas, op_b, op_a, (int)N, (int)M, (int)K, &alpha,
                                           bt.p, ldb, K * N, at.p, lda, M * K, &beta, yp, (int)N,
                                           M * N, (int)count));
    } else {
        /* 16-bit operands and output, FP32 accumulation, on tensor cores */
        cudaDataType_t t = blas_type(be->dt16);
        if (count == 1)
            BLAS(cublasGemmEx(be->blas, op_b, op_a, (int)N, (int)M, (int)K, &alpha, bt.p, t, ldb,
                              at.p, t, lda, &beta, yp, t, (int)N, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT));
        else
            BLAS(cublasGemmStridedBatchedEx(be->blas, op_b, op_a, (int)N, (int)M, (int)K, &alpha,
                                            bt.p, t, ldb, K * N, at.p, t, lda, M * K, &beta, yp, t,
                                            (int)N, M * N, (int)count, CUBLAS_COMPUTE_32F,
                                            CUBLAS_GEMM_DEFAULT));
    }
out:
    return rc;
}

static int run_reduce(wk_plan_t *plan, int si, int batch)
{
    cuda_be_t *be = plan->be;
    const wk_graph_t *g = plan->graph;
    const wk_step_t *s = &g->steps[si];
    int rc = 0;
    const wk_value_t *x = &g->values[s->in[0]];
    int64_t d[WK_MAX_DIMS], k[WK_MAX_DIMS];
    int n = wk_value_dims_at(x, batch, d);
    ck_ten_t xt;
    if ((rc = input(plan, si, 0, batch, &xt)) != 0)
        goto out;
    for (int i = 0; i < n; i++)
        k[i] = (s->p.reduce.axes_mask >> i) & 1 ? 1 : d[i];
    DNN(wk__cuda_set_plain(be->td[0], n, d));
    DNN(wk__cuda_set_plain(be->td[1], n, k));
    DNN(cudnnReduceTensor(be->dnn, be->reduce, NULL, 0, be->workspace, be->workspace_bytes, &one,
                          be->td[0], xt.p, &zero, be->td[1], vptr(be, s->out)));
out:
    return rc;
}

/* One entry per kernel kind (wk_kernel_t), like the cpu backend's
 * wk__cpu_ops: a new kind fails the asserts until it has its entry. */
typedef struct {
    int (*launch)(wk_plan_t *plan, int si, int batch);
} cuda_kernel_t;

static const cuda_kernel_t cuda_kernels[] = {
    [WK_K_CONV] = {.launch = run_conv},
    [WK_K_MAXPOOL] = {.launch = run_pool},
    [WK_K_AVGPOOL] = {.launch = run_pool},
    [WK_K_GLOBALAVG] = {.launch = run_pool},
    [WK_K_ELTWISE] = {.launch = run_pointwise},
    [WK_K_BINARY] = {.launch = run_pointwise},
    [WK_K_BATCHNORM] = {.launch = run_pointwise},
    [WK_K_CONCAT] = {.launch = run_layout},
    [WK_K_SOFTMAX] = {.launch = run_softmax},
    [WK_K_GEMM] = {.launch = run_gemm},
    [WK_K_MATMUL] = {.launch = run_gemm},
    [WK_K_REDUCE_MEAN] = {.launch = run_reduce},
    [WK_K_COPY] = {.launch = run_layout},
    [WK_K_TRANSPOSE] = {.launch = run_layout},
    [WK_K_PAD] = {.launch = run_layout},
    [WK_K_SLICE] = {.launch = run_layout},
    [WK_K_ERF] = {.launch = run_pointwise},
    [WK_K_EXPAND] = {.launch = run_pointwise},
    [WK_K_LAYERNORM] = {.launch = run_layernorm},
    [WK_K_RESIZE] = {.launch = run_resize},
    /* none: the op table's rules refuse ConvTranspose on cuda */
    [WK_K_DECONV] = {0},
};
_Static_assert(sizeof(cuda_kernels) / sizeof(cuda_kernels[0]) == WK_K_COUNT_,
               "a kernel kind without a cuda step");
_Static_assert(WK_K_COUNT_ == 21, "a new kernel kind: give it its entry in cuda_kernels");

static int run_step(wk_plan_t *plan, int si, int batch)
{
    const wk_step_t *s = &plan->graph->steps[si];
    if ((unsigned)s->kind < WK_K_COUNT_ && cuda_kernels[s->kind].launch != NULL)
        return cuda_kernels[s->kind].launch(plan, si, batch);
    return wk_fail(plan, SQ_INTERNAL, "step %d: kernel kind %d", si, (int)s->kind);
}

int wk__cuda_run_seq(wk_plan_t *plan, int batch)
{
    cuda_be_t *be = plan->be;
    const wk_graph_t *g = plan->graph;
    int rc = 0;
    const bool timed = be->ev != NULL && be->timing;
    if (timed)
        CU(cudaEventRecord(be->ev[0], be->stream));
    for (int si = 0; si < g->n_steps; si++) {
        if ((rc = run_step(plan, si, batch)) != 0)
            return rc;
        if (timed)
            CU(cudaEventRecord(be->ev[si + 1], be->stream));
    }
    if (timed) {
        CU(cudaEventSynchronize(be->ev[g->n_steps]));
        for (int si = 0; si < g->n_steps; si++) {
            float ms = 0.0f;
            CU(cudaEventElapsedTime(&ms, be->ev[si], be->ev[si + 1]));
            be->step_ms[si] += ms;
        }
        be->timed_runs++;
        be->timed_batch = batch;
    }
    for (int i = 0; i < g->n_outputs; i++)
        if (be->out_cvt[i] &&
            (rc = wk__cuda_convert(plan, g->outputs[i], batch, (cuda_rep_t){CK_F32, false},
                                   be->arena + be->out_offset[i])) != 0)
            return rc;
out:
    return rc;
}
