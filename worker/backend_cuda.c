/* The cuda backend on cuDNN 9 + cuBLAS: thin by design. Everything that is
 * not a CUDA call is shared with the cpu path: the lowered graph, the
 * fusion passes (BatchNorm folded, residual adds and activations fused),
 * the liveness arena plan (wk_arena_plan) and the pixel normalization.
 *
 * Tensors stay plain row-major (NCHW) on the device, one arena planned by
 * liveness at max batch. Convolution algorithms are chosen once per plan
 * and batch size (cuDNN's heuristics), the workspace is sized once for the
 * largest, inputs and outputs pass through pinned staging buffers with
 * async copies on the plan's stream. Ops cuDNN has no call for are built
 * from the ones it has (clip = max then min; leaky relu = max(x, a x);
 * hard sigmoid = clip(a x + b); pads and slices are strided transforms);
 * what cannot be built that way is refused at plan time with the reason,
 * and squishd keeps such a model on the cpu.
 *
 * On a machine without a GPU or driver, prepare fails with SQ_DEVICE and
 * the CUDA error text. */
#include "wk_exec_int.h"

#include <sq.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CU_ALIGN 256

typedef struct {
    cudnnConvolutionDescriptor_t conv;
    cudnnFilterDescriptor_t filter;
    cudnnPoolingDescriptor_t pool;
    cudnnConvolutionFwdAlgo_t *algo; /* [max_batch + 1] */
    float *scalars;                  /* device: per-step constants (clip bounds...) */
    bool pad_explicit;               /* pooling with asymmetric pads: padded copy first */
    size_t tmp_offset;               /* arena offset of the step's temporary */
    /* conv: bias, then at most a residual and a relu, in one
     * cudnnConvolutionBiasActivationForward (fused_relu: with the relu) */
    bool fused, fused_relu;
} cuda_step_t;

typedef struct {
    int device;
    cudaStream_t stream;
    cudnnHandle_t dnn;
    cublasHandle_t blas;
    char *arena; /* device */
    size_t arena_bytes;
    size_t *offset;      /* per value: arena offset */
    float **dconst;      /* per value: device copy of a constant, or NULL */
    float **staging_in;  /* pinned, per input */
    float **staging_out; /* pinned, per output */
    void *workspace;
    size_t workspace_bytes;
    cuda_step_t *steps;
    cudnnTensorDescriptor_t td[4];
    cudnnOpTensorDescriptor_t op_add, op_mul, op_max, op_min;
    cudnnActivationDescriptor_t act;
    cudnnReduceTensorDescriptor_t reduce;
    float *scalar_pool;
} cuda_be_t;

static const float one = 1.0f, zero = 0.0f;

#define CU(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            rc = wk_fail(plan, SQ_DEVICE, "%s: %s", #call, cudaGetErrorString(e_));                \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)
#define DNN(call)                                                                                  \
    do {                                                                                           \
        cudnnStatus_t e_ = (call);                                                                 \
        if (e_ != CUDNN_STATUS_SUCCESS) {                                                          \
            rc = wk_fail(plan, SQ_DEVICE, "%s: %s", #call, cudnnGetErrorString(e_));               \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)
#define BLAS(call)                                                                                 \
    do {                                                                                           \
        cublasStatus_t e_ = (call);                                                                \
        if (e_ != CUBLAS_STATUS_SUCCESS) {                                                         \
            rc = wk_fail(plan, SQ_DEVICE, "%s: cublas status %d", #call, (int)e_);                 \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

/* ---- descriptors ---- */

/* A plain tensor (dims at batch), padded to 4 dims with trailing 1s. */
static cudnnStatus_t set_plain(cudnnTensorDescriptor_t d, int ndim, const int64_t *dims)
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

static cudnnStatus_t set_value(cudnnTensorDescriptor_t d, const wk_value_t *v, int batch)
{
    int64_t dims[WK_MAX_DIMS];
    int n = wk_value_dims_at(v, batch, dims);
    return set_plain(d, n, dims);
}

/* Value v seen with `ndim` dims (leading 1s), for broadcasting operands. */
static cudnnStatus_t set_ranked(cudnnTensorDescriptor_t d, const wk_value_t *v, int batch, int ndim)
{
    int64_t dims[WK_MAX_DIMS];
    int n = wk_value_dims_at(v, batch, dims + (ndim - v->ndim));
    for (int i = 0; i < ndim - n; i++)
        dims[i] = 1;
    return set_plain(d, ndim, dims);
}

static void row_strides(int ndim, const int64_t *dims, int64_t *st)
{
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        st[i] = s;
        s *= dims[i];
    }
}

static float *dptr(cuda_be_t *be, const wk_graph_t *g, int v)
{
    if (be->dconst[v] != NULL)
        return be->dconst[v];
    (void)g;
    return (float *)(be->arena + be->offset[v]);
}

/* ---- activations from cuDNN's pieces ---- */

/* y = act(y), in place; d describes y. s: the step's two device scalars. */
static int apply_act(wk_plan_t *plan, wk_act_t a, cudnnTensorDescriptor_t d, float *y,
                     const float *s)
{
    cuda_be_t *be = plan->be;
    int rc = 0;
    cudnnTensorDescriptor_t sd = be->td[3];
    int ones[4] = {1, 1, 1, 1};
    DNN(cudnnSetTensorNdDescriptor(sd, CUDNN_DATA_FLOAT, 4, ones, ones));
    switch (a.kind) {
    case WK_ACT_NONE:
        break;
    case WK_ACT_RELU:
    case WK_ACT_SIGMOID:
        DNN(cudnnSetActivationDescriptor(
            be->act, a.kind == WK_ACT_RELU ? CUDNN_ACTIVATION_RELU : CUDNN_ACTIVATION_SIGMOID,
            CUDNN_PROPAGATE_NAN, 0.0));
        DNN(cudnnActivationForward(be->dnn, be->act, &one, d, y, &zero, d, y));
        break;
    case WK_ACT_SWISH:
        /* cuDNN's own x * sigmoid(beta x), in place: one pass, so a conv
         * takes it as a post-op (efficientnet's SiLU) */
        DNN(cudnnSetActivationDescriptor(be->act, CUDNN_ACTIVATION_SWISH, CUDNN_PROPAGATE_NAN,
                                         0.0));
        DNN(cudnnSetActivationDescriptorSwishBeta(be->act, 1.0));
        DNN(cudnnActivationForward(be->dnn, be->act, &one, d, y, &zero, d, y));
        break;
    case WK_ACT_LEAKY_RELU: {
        /* max(x, a x) for a <= 1, min(x, a x) above */
        float alpha2 = a.alpha;
        DNN(cudnnOpTensor(be->dnn, a.alpha <= 1.0f ? be->op_max : be->op_min, &one, d, y, &alpha2,
                          d, y, &zero, d, y));
        break;
    }
    case WK_ACT_HARDSIGMOID:
    case WK_ACT_HARDSWISH:
    case WK_ACT_CLIP:
        /* scalars: s[0] = lower bound, s[1] = upper bound, s[2] = 1 */
        if (a.kind != WK_ACT_CLIP) {
            float ka = a.kind == WK_ACT_HARDSWISH ? 1.0f / 6.0f : a.alpha;
            float kb = a.kind == WK_ACT_HARDSWISH ? 0.5f : a.beta;
            if (a.kind == WK_ACT_HARDSWISH)
                return wk_fail(plan, SQ_UNSUPPORTED_MODEL, "hardswish needs a second buffer");
            /* y = ka * y + kb * 1 */
            DNN(cudnnOpTensor(be->dnn, be->op_add, &ka, d, y, &kb, sd, s + 2, &zero, d, y));
        }
        DNN(cudnnOpTensor(be->dnn, be->op_max, &one, d, y, &one, sd, s, &zero, d, y));
        DNN(cudnnOpTensor(be->dnn, be->op_min, &one, d, y, &one, sd, s + 1, &zero, d, y));
        break;
    default:
        return wk_fail(plan, SQ_UNSUPPORTED_MODEL, "activation %d", (int)a.kind);
    }
out:
    return rc;
}

/* ---- steps ---- */

static int run_conv(wk_plan_t *plan, int si, int batch)
{
    cuda_be_t *be = plan->be;
    const wk_graph_t *g = plan->graph;
    const wk_step_t *s = &g->steps[si];
    cuda_step_t *cs = &be->steps[si];
    int rc = 0;
    const wk_value_t *x = &g->values[s->in[0]], *y = &g->values[s->out];
    float *yp = dptr(be, g, s->out);
    float beta = 0.0f;
    DNN(set_value(be->td[0], x, batch));
    DNN(set_value(be->td[1], y, batch));
    /* cuDNN's fused call: y = act(conv(x) + alpha2 z + bias), the residual
     * as z (alpha2 0 when there is none: z is then not read, cuDNN's rule
     * for a zero blend factor). Identity needs the implicit precomputed
     * GEMM algorithm; a conv the call refuses goes back to the separate
     * calls below, for good. */
    if (cs->fused &&
        (cs->fused_relu || cs->algo[batch] == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM)) {
        int64_t bd[2] = {1, y->dims[1]};
        bool res = s->n_post > 0 && s->post[0].kind == WK_POST_ADD;
        float alpha2 = res ? 1.0f : 0.0f;
        DNN(set_plain(be->td[2], 2, bd));
        DNN(cudnnSetActivationDescriptor(
            be->act, cs->fused_relu ? CUDNN_ACTIVATION_RELU : CUDNN_ACTIVATION_IDENTITY,
            CUDNN_PROPAGATE_NAN, 0.0));
        cudnnStatus_t st = cudnnConvolutionBiasActivationForward(
            be->dnn, &one, be->td[0], dptr(be, g, s->in[0]), cs->filter, dptr(be, g, s->in[1]),
            cs->conv, cs->algo[batch], be->workspace, be->workspace_bytes, &alpha2, be->td[1],
            res ? dptr(be, g, s->post[0].value) : yp, be->td[2], dptr(be, g, s->in[2]), be->act,
            be->td[1], yp);
        if (st == CUDNN_STATUS_SUCCESS)
            return 0;
        if (st != CUDNN_STATUS_NOT_SUPPORTED)
            DNN(st);
        SQ_DEBUG("cuda: step %d: the fused conv is not supported here (%s); separate calls", si,
                 cudnnGetErrorString(st));
        cs->fused = false;
    }
    /* A residual goes into y first; the conv then accumulates (beta 1). */
    int post = 0;
    if (s->n_post > 0 && s->post[0].kind == WK_POST_ADD) {
        CU(cudaMemcpyAsync(yp, dptr(be, g, s->post[0].value),
                           (size_t)wk_value_elems_at(y, batch) * sizeof(float),
                           cudaMemcpyDeviceToDevice, be->stream));
        beta = 1.0f;
        post = 1;
    }
    DNN(cudnnConvolutionForward(be->dnn, &one, be->td[0], dptr(be, g, s->in[0]), cs->filter,
                                dptr(be, g, s->in[1]), cs->conv, cs->algo[batch], be->workspace,
                                be->workspace_bytes, &beta, be->td[1], yp));
    if (s->n_in > 2 && s->in[2] >= 0) {
        int64_t bd[2] = {1, y->dims[1]};
        DNN(set_plain(be->td[2], 2, bd));
        DNN(cudnnAddTensor(be->dnn, &one, be->td[2], dptr(be, g, s->in[2]), &one, be->td[1], yp));
    }
    for (int i = post; i < s->n_post; i++) {
        if (s->post[i].kind == WK_POST_ADD) {
            DNN(cudnnAddTensor(be->dnn, &one, be->td[1], dptr(be, g, s->post[i].value), &one,
                               be->td[1], yp));
        } else if ((rc = apply_act(plan, s->post[i].act, be->td[1], yp, cs->scalars + 3 * i)) !=
                   0) {
            goto out;
        }
    }
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
    const float *xp = dptr(be, g, s->in[0]);
    DNN(set_value(be->td[0], x, batch));
    DNN(set_value(be->td[1], y, batch));
    if (cs->pad_explicit) {
        /* Asymmetric pads: copy into a -inf (max) or 0 (avg) frame first. */
        int64_t pd[WK_MAX_DIMS], st[WK_MAX_DIMS];
        wk_value_dims_at(x, batch, pd);
        for (int i = 0; i < s->p.conv.n_spatial; i++)
            pd[2 + i] += s->p.conv.pad_begin[i] + s->p.conv.pad_end[i];
        row_strides(x->ndim, pd, st);
        float *tmp = (float *)(be->arena + cs->tmp_offset);
        float fill = s->kind == WK_K_MAXPOOL ? -INFINITY : 0.0f;
        DNN(set_plain(be->td[2], x->ndim, pd));
        DNN(cudnnSetTensor(be->dnn, be->td[2], tmp, &fill));
        int64_t off = 0, xd[WK_MAX_DIMS];
        wk_value_dims_at(x, batch, xd);
        for (int i = 0; i < s->p.conv.n_spatial; i++)
            off += s->p.conv.pad_begin[i] * st[2 + i];
        DNN(set_strided(be->td[3], x->ndim, xd, st));
        DNN(cudnnTransformTensor(be->dnn, &one, be->td[0], xp, &zero, be->td[3], tmp + off));
        DNN(set_plain(be->td[0], x->ndim, pd));
        xp = tmp;
    }
    DNN(cudnnPoolingForward(be->dnn, cs->pool, &one, be->td[0], xp, &zero, be->td[1],
                            dptr(be, g, s->out)));
out:
    return rc;
}

static int run_binary(wk_plan_t *plan, int si, int batch)
{
    cuda_be_t *be = plan->be;
    const wk_graph_t *g = plan->graph;
    const wk_step_t *s = &g->steps[si];
    int rc = 0;
    const wk_value_t *y = &g->values[s->out];
    int a = s->in[0], b = s->in[1];
    float alpha_b = 1.0f;
    if (wk_value_elems(&g->values[a]) != wk_value_elems(y)) {
        int t = a;
        a = b;
        b = t;
    }
    float alpha_a = 1.0f;
    if (s->kind == WK_K_BINARY && s->p.binop == WK_BIN_SUB) {
        /* a - b, or after the swap -(b) + a with roles exchanged */
        if (a == s->in[0])
            alpha_b = -1.0f;
        else
            alpha_a = -1.0f;
    }
    cudnnOpTensorDescriptor_t op = s->kind == WK_K_BINARY && s->p.binop == WK_BIN_MUL ? be->op_mul
                                   : s->kind == WK_K_BATCHNORM                        ? be->op_mul
                                                                                      : be->op_add;
    DNN(set_value(be->td[0], &g->values[a], batch));
    DNN(set_ranked(be->td[1], &g->values[b], batch, y->ndim));
    DNN(set_value(be->td[2], y, batch));
    float *yp = dptr(be, g, s->out);
    DNN(cudnnOpTensor(be->dnn, op, &alpha_a, be->td[0], dptr(be, g, a), &alpha_b, be->td[1],
                      dptr(be, g, b), &zero, be->td[2], yp));
    if (s->kind == WK_K_BATCHNORM) {
        DNN(set_ranked(be->td[1], &g->values[s->in[2]], batch, y->ndim));
        DNN(cudnnOpTensor(be->dnn, be->op_add, &one, be->td[2], yp, &one, be->td[1],
                          dptr(be, g, s->in[2]), &zero, be->td[2], yp));
    }
out:
    return rc;
}

/* Copies x into a strided view of y: the building block of concat, pad,
 * slice and transpose. */
static int transform(wk_plan_t *plan, int ndim, const int64_t *dims, const int64_t *src_strides,
                     const float *src, const int64_t *dst_strides, float *dst)
{
    cuda_be_t *be = plan->be;
    int rc = 0;
    DNN(set_strided(be->td[0], ndim, dims, src_strides));
    DNN(set_strided(be->td[1], ndim, dims, dst_strides));
    DNN(cudnnTransformTensor(be->dnn, &one, be->td[0], src, &zero, be->td[1], dst));
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
    int64_t xd[WK_MAX_DIMS], yd[WK_MAX_DIMS], xs[WK_MAX_DIMS], ys[WK_MAX_DIMS];
    int n = wk_value_dims_at(x, batch, xd);
    wk_value_dims_at(y, batch, yd);
    row_strides(n, xd, xs);
    row_strides(y->ndim, yd, ys);
    float *yp = dptr(be, g, s->out);
    switch (s->kind) {
    case WK_K_COPY:
        CU(cudaMemcpyAsync(yp, dptr(be, g, s->in[0]),
                           (size_t)wk_value_elems_at(x, batch) * sizeof(float),
                           cudaMemcpyDeviceToDevice, be->stream));
        break;
    case WK_K_CONCAT: {
        int64_t at = 0;
        for (int i = 0; i < s->n_in; i++) {
            const wk_value_t *xi = &g->values[s->in[i]];
            int64_t d[WK_MAX_DIMS], st[WK_MAX_DIMS];
            wk_value_dims_at(xi, batch, d);
            row_strides(xi->ndim, d, st);
            if ((rc = transform(plan, xi->ndim, d, st, dptr(be, g, s->in[i]), ys,
                                yp + at * ys[s->p.axis])) != 0)
                goto out;
            at += d[s->p.axis];
        }
        break;
    }
    case WK_K_TRANSPOSE: {
        int64_t vs[WK_MAX_DIMS];
        for (int i = 0; i < y->ndim; i++)
            vs[i] = xs[s->p.perm[i]];
        rc = transform(plan, y->ndim, yd, vs, dptr(be, g, s->in[0]), ys, yp);
        break;
    }
    case WK_K_SLICE: {
        int64_t vs[WK_MAX_DIMS], off = 0;
        for (int i = 0; i < n; i++) {
            vs[i] = xs[i] * s->p.slice.step[i];
            off += s->p.slice.start[i] * xs[i];
        }
        rc = transform(plan, n, yd, vs, dptr(be, g, s->in[0]) + off, ys, yp);
        break;
    }
    case WK_K_PAD: {
        DNN(set_plain(be->td[2], y->ndim, yd));
        DNN(cudnnSetTensor(be->dnn, be->td[2], yp, &s->p.pad.value));
        int64_t off = 0;
        for (int i = 0; i < n; i++)
            off += s->p.pad.begin[i] * ys[i];
        rc = transform(plan, n, xd, xs, dptr(be, g, s->in[0]), ys, yp + off);
        break;
    }
    default:
        rc = wk_fail(plan, SQ_INTERNAL, "step %d is no layout op", si);
    }
out:
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
    /* [outer, axis, inner, 1] with softmax over the channel dim */
    for (int i = 0; i < n; i++)
        v[i < s->p.axis ? 0 : i == s->p.axis ? 1 : 2] *= d[i];
    if (s->legacy_softmax) {
        v[1] *= v[2];
        v[2] = 1;
    }
    DNN(set_plain(be->td[0], 4, v));
    DNN(cudnnSoftmaxForward(be->dnn, CUDNN_SOFTMAX_ACCURATE, CUDNN_SOFTMAX_MODE_CHANNEL, &one,
                            be->td[0], dptr(be, g, s->in[0]), &zero, be->td[0],
                            dptr(be, g, s->out)));
out:
    return rc;
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
    float *yp = dptr(be, g, s->out);
    float beta = 0.0f;
    int64_t M, N, K, count = 1;
    cublasOperation_t op_a = CUBLAS_OP_N, op_b = CUBLAS_OP_N;
    float alpha = 1.0f;
    if (s->kind == WK_K_GEMM) {
        M = yd[0];
        N = yd[1];
        K = s->p.gemm.trans_a ? ad[0] : ad[1];
        op_a = s->p.gemm.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
        op_b = s->p.gemm.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
        alpha = s->p.gemm.alpha;
        if (s->n_in > 2 && s->in[2] >= 0) {
            /* y = beta_gemm * C (broadcast), then the product accumulates */
            float bg = s->p.gemm.beta;
            DNN(set_ranked(be->td[0], &g->values[s->in[2]], batch, 2));
            DNN(set_value(be->td[1], y, batch));
            DNN(cudnnAddTensor(be->dnn, &bg, be->td[0], dptr(be, g, s->in[2]), &zero, be->td[1],
                               yp));
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
    if (count == 1) {
        BLAS(cublasSgemm(be->blas, op_b, op_a, (int)N, (int)M, (int)K, &alpha,
                         dptr(be, g, s->in[1]), ldb, dptr(be, g, s->in[0]), lda, &beta, yp,
                         (int)N));
    } else {
        BLAS(cublasSgemmStridedBatched(be->blas, op_b, op_a, (int)N, (int)M, (int)K, &alpha,
                                       dptr(be, g, s->in[1]), ldb, K * N, dptr(be, g, s->in[0]),
                                       lda, M * K, &beta, yp, (int)N, M * N, (int)count));
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
    for (int i = 0; i < n; i++)
        k[i] = (s->p.reduce.axes_mask >> i) & 1 ? 1 : d[i];
    DNN(set_plain(be->td[0], n, d));
    DNN(set_plain(be->td[1], n, k));
    DNN(cudnnReduceTensor(be->dnn, be->reduce, NULL, 0, be->workspace, be->workspace_bytes, &one,
                          be->td[0], dptr(be, g, s->in[0]), &zero, be->td[1], dptr(be, g, s->out)));
out:
    return rc;
}

static int run_step(wk_plan_t *plan, int si, int batch)
{
    cuda_be_t *be = plan->be;
    const wk_graph_t *g = plan->graph;
    const wk_step_t *s = &g->steps[si];
    int rc = 0;
    switch (s->kind) {
    case WK_K_CONV:
        return run_conv(plan, si, batch);
    case WK_K_MAXPOOL:
    case WK_K_AVGPOOL:
    case WK_K_GLOBALAVG:
        return run_pool(plan, si, batch);
    case WK_K_ELTWISE: {
        const wk_value_t *y = &g->values[s->out];
        float *yp = dptr(be, g, s->out);
        CU(cudaMemcpyAsync(yp, dptr(be, g, s->in[0]),
                           (size_t)wk_value_elems_at(y, batch) * sizeof(float),
                           cudaMemcpyDeviceToDevice, be->stream));
        DNN(set_value(be->td[1], y, batch));
        if (s->p.act.kind == WK_ACT_HARDSWISH) {
            /* x * clip(x / 6 + 1/2, 0, 1): the clip in y, then y *= x */
            wk_act_t hs = {WK_ACT_HARDSIGMOID, 1.0f / 6.0f, 0.5f};
            if ((rc = apply_act(plan, hs, be->td[1], yp, be->steps[si].scalars)) != 0)
                goto out;
            DNN(cudnnOpTensor(be->dnn, be->op_mul, &one, be->td[1], yp, &one, be->td[1],
                              dptr(be, g, s->in[0]), &zero, be->td[1], yp));
            break;
        }
        return apply_act(plan, s->p.act, be->td[1], yp, be->steps[si].scalars);
    }
    case WK_K_BINARY:
    case WK_K_BATCHNORM:
        return run_binary(plan, si, batch);
    case WK_K_SOFTMAX:
        return run_softmax(plan, si, batch);
    case WK_K_GEMM:
    case WK_K_MATMUL:
        return run_gemm(plan, si, batch);
    case WK_K_REDUCE_MEAN:
        return run_reduce(plan, si, batch);
    case WK_K_COPY:
    case WK_K_CONCAT:
    case WK_K_TRANSPOSE:
    case WK_K_SLICE:
    case WK_K_PAD:
        return run_layout(plan, si, batch);
    case WK_K_ERF:
    case WK_K_EXPAND:
    case WK_K_LAYERNORM:
        /* refused by check_supported before any device work */
        return wk_fail(plan, SQ_UNSUPPORTED_MODEL, "cuda backend: %s", wk_kernel_names[s->kind]);
    case WK_K_COUNT_:
        break;
    }
out:
    return rc;
}

/* ---- plan ---- */

/* What cuDNN cannot do, refused before any device work. */
static int check_supported(wk_plan_t *plan)
{
    const wk_graph_t *g = plan->graph;
    for (int si = 0; si < g->n_steps; si++) {
        const wk_step_t *s = &g->steps[si];
        const char *why = NULL;
        for (int i = 0; i < s->n_post; i++)
            if (s->post[i].kind == WK_POST_ACT &&
                (s->post[i].act.kind == WK_ACT_POW || s->post[i].act.kind == WK_ACT_SQRT ||
                 s->post[i].act.kind == WK_ACT_GELU || s->post[i].act.kind == WK_ACT_TANH))
                why = "Pow, Sqrt, Gelu and Tanh (not written for cuDNN yet)";
        switch (s->kind) {
        case WK_K_ELTWISE:
            if (s->p.act.kind == WK_ACT_POW || s->p.act.kind == WK_ACT_SQRT ||
                s->p.act.kind == WK_ACT_GELU || s->p.act.kind == WK_ACT_TANH)
                why = "Pow, Sqrt, Gelu and Tanh (not written for cuDNN yet)";
            break;
        case WK_K_LAYERNORM:
            why = "LayerNormalization (not written for cuDNN yet)";
            break;
        case WK_K_ERF:
            why = "Erf (cuDNN has no erf)";
            break;
        case WK_K_EXPAND:
            why = "Expand (not written for cuDNN yet)";
            break;
        case WK_K_BINARY:
            if (s->p.binop == WK_BIN_DIV)
                why = "Div (cuDNN has no division)";
            else if (wk_value_elems(&g->values[s->in[0]]) != wk_value_elems(&g->values[s->out]) &&
                     wk_value_elems(&g->values[s->in[1]]) != wk_value_elems(&g->values[s->out]))
                why = "both operands broadcast";
            break;
        case WK_K_AVGPOOL:
        case WK_K_MAXPOOL:
            for (int i = 0; i < s->p.conv.n_spatial; i++) {
                if (s->p.conv.dilation[i] != 1)
                    why = "dilated pooling";
                if (s->kind == WK_K_AVGPOOL && !s->p.conv.count_include_pad &&
                    s->p.conv.pad_begin[i] != s->p.conv.pad_end[i])
                    why = "average pooling with asymmetric pads excluded from the count";
            }
            break;
        case WK_K_PAD:
            if (s->p.pad.mode != WK_PAD_CONSTANT)
                why = "reflect and edge pads";
            break;
        case WK_K_SLICE:
            for (int i = 0; i < g->values[s->in[0]].ndim; i++)
                if (s->p.slice.step[i] < 1)
                    why = "slices with negative steps";
            break;
        case WK_K_GEMM:
            if (g->values[s->in[0]].ndim != 2 || g->values[s->in[1]].ndim != 2)
                why = "gemm operands of rank other than 2";
            break;
        case WK_K_MATMUL: {
            const wk_value_t *a = &g->values[s->in[0]], *b = &g->values[s->in[1]];
            if (a->ndim < 2 || b->ndim < 1 || (b->ndim > 2 && b->ndim != a->ndim))
                why = "matmul broadcast beyond a shared 2-D weight";
            else if (b->ndim > 2)
                for (int i = 0; i < a->ndim - 2; i++)
                    if (a->dims[i] != b->dims[i] || a->batched || b->batched)
                        why = "matmul broadcast beyond equal batch dims";
            break;
        }
        case WK_K_CONV:
            for (int i = 0; i < s->p.conv.n_spatial; i++)
                if (s->p.conv.pad_begin[i] != s->p.conv.pad_end[i])
                    why = "convolution with asymmetric pads";
            for (int i = 0; i < s->n_post; i++) {
                if (i > 0 && s->post[i].kind == WK_POST_ADD)
                    why = "residual add after an activation";
                if (s->post[i].kind == WK_POST_ACT && s->post[i].act.kind == WK_ACT_HARDSWISH)
                    why = "hardswish fused into a convolution";
            }
            break;
        default:
            break;
        }
        if (why != NULL)
            return wk_fail(plan, SQ_UNSUPPORTED_MODEL, "cuda backend: step %d (%s): %s", si,
                           wk_kernel_names[s->kind], why);
    }
    return 0;
}

static void cuda_release(wk_plan_t *plan)
{
    cuda_be_t *be = plan->be;
    if (be == NULL)
        return;
    const wk_graph_t *g = plan->graph;
    if (be->steps != NULL) {
        for (int i = 0; i < g->n_steps; i++) {
            cuda_step_t *cs = &be->steps[i];
            if (cs->conv)
                cudnnDestroyConvolutionDescriptor(cs->conv);
            if (cs->filter)
                cudnnDestroyFilterDescriptor(cs->filter);
            if (cs->pool)
                cudnnDestroyPoolingDescriptor(cs->pool);
            free(cs->algo);
        }
    }
    if (be->dconst != NULL)
        for (int i = 0; i < g->n_values; i++)
            if (be->dconst[i])
                cudaFree(be->dconst[i]);
    for (int i = 0; be->staging_in && i < g->n_inputs; i++)
        if (be->staging_in[i])
            cudaFreeHost(be->staging_in[i]);
    for (int i = 0; be->staging_out && i < g->n_outputs; i++)
        if (be->staging_out[i])
            cudaFreeHost(be->staging_out[i]);
    for (int i = 0; i < 4; i++)
        if (be->td[i])
            cudnnDestroyTensorDescriptor(be->td[i]);
    if (be->op_add)
        cudnnDestroyOpTensorDescriptor(be->op_add);
    if (be->op_mul)
        cudnnDestroyOpTensorDescriptor(be->op_mul);
    if (be->op_max)
        cudnnDestroyOpTensorDescriptor(be->op_max);
    if (be->op_min)
        cudnnDestroyOpTensorDescriptor(be->op_min);
    if (be->act)
        cudnnDestroyActivationDescriptor(be->act);
    if (be->reduce)
        cudnnDestroyReduceTensorDescriptor(be->reduce);
    if (be->scalar_pool)
        cudaFree(be->scalar_pool);
    if (be->workspace)
        cudaFree(be->workspace);
    if (be->arena)
        cudaFree(be->arena);
    if (be->blas)
        cublasDestroy(be->blas);
    if (be->dnn)
        cudnnDestroy(be->dnn);
    if (be->stream)
        cudaStreamDestroy(be->stream);
    free(be->offset);
    free(be->dconst);
    free(be->staging_in);
    free(be->staging_out);
    free(be->steps);
    free(be);
    plan->be = NULL;
}

static int make_op(wk_plan_t *plan, cudnnOpTensorDescriptor_t *d, cudnnOpTensorOp_t op)
{
    int rc = 0;
    DNN(cudnnCreateOpTensorDescriptor(d));
    DNN(cudnnSetOpTensorDescriptor(*d, op, CUDNN_DATA_FLOAT, CUDNN_PROPAGATE_NAN));
out:
    return rc;
}

/* Descriptors, algorithms and workspace needs of one step. */
static int prepare_step(wk_plan_t *plan, int si, size_t *ws_need)
{
    cuda_be_t *be = plan->be;
    const wk_graph_t *g = plan->graph;
    const wk_step_t *s = &g->steps[si];
    cuda_step_t *cs = &be->steps[si];
    int rc = 0, nsp = s->p.conv.n_spatial;
    int pad[WK_MAX_SPATIAL], str[WK_MAX_SPATIAL], dil[WK_MAX_SPATIAL], win[WK_MAX_SPATIAL];
    const wk_value_t *x = &g->values[s->in[0]], *y = &g->values[s->out];
    if (s->kind == WK_K_CONV) {
        const wk_value_t *w = &g->values[s->in[1]];
        int wd[WK_MAX_DIMS];
        for (int i = 0; i < w->ndim; i++)
            wd[i] = (int)w->dims[i];
        for (int i = 0; i < nsp; i++) {
            pad[i] = (int)s->p.conv.pad_begin[i];
            str[i] = (int)s->p.conv.stride[i];
            dil[i] = (int)s->p.conv.dilation[i];
        }
        int wn = w->ndim;
        if (nsp == 1) {
            /* cuDNN convolves 2-D and 3-D: a 1-D conv is [L, 1]. */
            wd[wn++] = 1;
            pad[1] = 0;
            str[1] = dil[1] = 1;
            nsp = 2;
        }
        DNN(cudnnCreateFilterDescriptor(&cs->filter));
        DNN(cudnnSetFilterNdDescriptor(cs->filter, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, wn, wd));
        DNN(cudnnCreateConvolutionDescriptor(&cs->conv));
        DNN(cudnnSetConvolutionNdDescriptor(cs->conv, nsp, pad, str, dil, CUDNN_CROSS_CORRELATION,
                                            CUDNN_DATA_FLOAT));
        DNN(cudnnSetConvolutionGroupCount(cs->conv, (int)s->p.conv.groups));
        DNN(cudnnSetConvolutionMathType(cs->conv, CUDNN_DEFAULT_MATH));
        cs->algo = sq_xcalloc((size_t)g->max_batch + 1, sizeof(*cs->algo));
        /* bias [+ residual] [+ relu]: cuDNN's one fused call (run_conv) */
        bool bias = s->n_in > 2 && s->in[2] >= 0,
             add = s->n_post > 0 && s->post[0].kind == WK_POST_ADD;
        int acts = s->n_post - (add ? 1 : 0);
        cs->fused_relu = acts == 1 && s->post[s->n_post - 1].kind == WK_POST_ACT &&
                         s->post[s->n_post - 1].act.kind == WK_ACT_RELU;
        cs->fused = bias && y->ndim <= 4 && (acts == 0 || cs->fused_relu);
        for (int b = 1; b <= g->max_batch; b++) {
            cudnnConvolutionFwdAlgoPerf_t perf[8];
            int found = 0;
            DNN(set_value(be->td[0], x, b));
            DNN(set_value(be->td[1], y, b));
            DNN(cudnnGetConvolutionForwardAlgorithm_v7(be->dnn, be->td[0], cs->filter, cs->conv,
                                                       be->td[1], 8, &found, perf));
            int pick = -1;
            for (int i = 0; i < found && pick < 0; i++)
                if (perf[i].status == CUDNN_STATUS_SUCCESS)
                    pick = i;
            if (pick < 0) {
                rc = wk_fail(plan, SQ_UNSUPPORTED_MODEL,
                             "cuda: no convolution algorithm for "
                             "step %d",
                             si);
                goto out;
            }
            cs->algo[b] = perf[pick].algo;
            size_t ws = 0;
            DNN(cudnnGetConvolutionForwardWorkspaceSize(be->dnn, be->td[0], cs->filter, cs->conv,
                                                        be->td[1], cs->algo[b], &ws));
            if (ws > *ws_need)
                *ws_need = ws;
        }
    } else if (s->kind == WK_K_MAXPOOL || s->kind == WK_K_AVGPOOL || s->kind == WK_K_GLOBALAVG) {
        nsp = x->ndim - 2;
        for (int i = 0; i < nsp; i++) {
            bool global = s->kind == WK_K_GLOBALAVG;
            win[i] = global ? (int)x->dims[2 + i] : (int)s->p.conv.kernel[i];
            str[i] = global ? 1 : (int)s->p.conv.stride[i];
            pad[i] = global ? 0 : (int)s->p.conv.pad_begin[i];
            if (!global && s->p.conv.pad_begin[i] != s->p.conv.pad_end[i])
                cs->pad_explicit = true;
        }
        if (cs->pad_explicit)
            for (int i = 0; i < nsp; i++)
                pad[i] = 0;
        if (nsp == 1) {
            /* 1-D pooling as [L, 1] */
            win[1] = str[1] = 1;
            pad[1] = 0;
            nsp = 2;
        }
        cudnnPoolingMode_t mode =
            s->kind == WK_K_MAXPOOL ? CUDNN_POOLING_MAX
            : s->kind == WK_K_AVGPOOL && (s->p.conv.count_include_pad || cs->pad_explicit)
                ? CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING
                : CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING;
        DNN(cudnnCreatePoolingDescriptor(&cs->pool));
        DNN(cudnnSetPoolingNdDescriptor(cs->pool, mode, CUDNN_PROPAGATE_NAN, nsp, win, pad, str));
    } else if (s->kind == WK_K_REDUCE_MEAN) {
        size_t ws = 0;
        int64_t k[WK_MAX_DIMS];
        for (int i = 0; i < x->ndim; i++)
            k[i] = (s->p.reduce.axes_mask >> i) & 1 ? 1 : x->dims[i];
        DNN(set_plain(be->td[0], x->ndim, x->dims));
        DNN(set_plain(be->td[1], x->ndim, k));
        DNN(cudnnGetReductionWorkspaceSize(be->dnn, be->reduce, be->td[0], be->td[1], &ws));
        if (ws > *ws_need)
            *ws_need = ws;
    }
out:
    return rc;
}

/* Per step three device scalars per post-op / activation: lower bound,
 * upper bound, 1 (for clip and hard sigmoid built from max/min/add). */
static void act_scalars(wk_act_t a, float *s3)
{
    s3[0] = a.kind == WK_ACT_CLIP ? a.alpha : 0.0f;
    s3[1] = a.kind == WK_ACT_CLIP ? a.beta : 1.0f;
    s3[2] = 1.0f;
}

static int cuda_prepare(wk_plan_t *plan)
{
    const wk_graph_t *g = plan->graph;
    int rc = 0, count = 0, mb = g->max_batch;
    cuda_be_t *be = sq_xcalloc(1, sizeof(*be));
    plan->be = be;
    be->device = plan->opts.device_index;
    if ((rc = check_supported(plan)) != 0)
        return rc;
    cudaError_t ce = cudaGetDeviceCount(&count);
    if (ce != cudaSuccess)
        return wk_fail(plan, SQ_DEVICE, "cuda:%d unavailable: %s (%s)", be->device,
                       cudaGetErrorString(ce), cudaGetErrorName(ce));
    if (be->device >= count)
        return wk_fail(plan, SQ_DEVICE, "cuda:%d requested but %d device(s) present", be->device,
                       count);
    CU(cudaSetDevice(be->device));
    CU(cudaStreamCreateWithFlags(&be->stream, cudaStreamNonBlocking));
    DNN(cudnnCreate(&be->dnn));
    DNN(cudnnSetStream(be->dnn, be->stream));
    BLAS(cublasCreate(&be->blas));
    BLAS(cublasSetStream(be->blas, be->stream));
    for (int i = 0; i < 4; i++)
        DNN(cudnnCreateTensorDescriptor(&be->td[i]));
    if ((rc = make_op(plan, &be->op_add, CUDNN_OP_TENSOR_ADD)) != 0 ||
        (rc = make_op(plan, &be->op_mul, CUDNN_OP_TENSOR_MUL)) != 0 ||
        (rc = make_op(plan, &be->op_max, CUDNN_OP_TENSOR_MAX)) != 0 ||
        (rc = make_op(plan, &be->op_min, CUDNN_OP_TENSOR_MIN)) != 0)
        goto out;
    DNN(cudnnCreateActivationDescriptor(&be->act));
    DNN(cudnnCreateReduceTensorDescriptor(&be->reduce));
    DNN(cudnnSetReduceTensorDescriptor(be->reduce, CUDNN_REDUCE_TENSOR_AVG, CUDNN_DATA_FLOAT,
                                       CUDNN_PROPAGATE_NAN, CUDNN_REDUCE_TENSOR_NO_INDICES,
                                       CUDNN_32BIT_INDICES));

    /* Constants to the device, once. */
    be->dconst = sq_xcalloc((size_t)g->n_values, sizeof(float *));
    be->offset = sq_xcalloc((size_t)g->n_values, sizeof(size_t));
    for (int i = 0; i < g->n_values; i++) {
        const wk_value_t *v = &g->values[i];
        if (v->data == NULL)
            continue;
        size_t bytes = (size_t)wk_value_elems(v) * sizeof(float);
        CU(cudaMalloc((void **)&be->dconst[i], bytes ? bytes : 4));
        CU(cudaMemcpy(be->dconst[i], v->data, bytes, cudaMemcpyHostToDevice));
        plan->memory_bytes += bytes;
    }

    /* Arena by liveness (plain layouts: sizes from the shapes), plus the
     * padded copies of asymmetric pooling. */
    be->steps = sq_xcalloc((size_t)(g->n_steps ? g->n_steps : 1), sizeof(*be->steps));
    size_t ws_need = 0;
    for (int si = 0; si < g->n_steps; si++)
        if ((rc = prepare_step(plan, si, &ws_need)) != 0)
            goto out;
    int n_req = 0;
    wk_buf_req_t *reqs = sq_xcalloc((size_t)(g->n_values + g->n_steps), sizeof(*reqs));
    size_t *offs = sq_xcalloc((size_t)(g->n_values + g->n_steps), sizeof(size_t));
    int *owner = sq_xcalloc((size_t)(g->n_values + g->n_steps), sizeof(int));
    for (int i = 0; i < g->n_values; i++) {
        const wk_value_t *v = &g->values[i];
        if (v->data != NULL || (!v->is_input && v->producer < 0))
            continue;
        int first = v->is_input ? 0 : v->producer;
        reqs[n_req] = (wk_buf_req_t){(size_t)wk_value_elems(v) * sizeof(float), first,
                                     v->last_use > first ? v->last_use : first};
        owner[n_req++] = i;
    }
    for (int si = 0; si < g->n_steps; si++) {
        if (!be->steps[si].pad_explicit)
            continue;
        const wk_step_t *s = &g->steps[si];
        const wk_value_t *x = &g->values[s->in[0]];
        int64_t elems = 1;
        for (int d = 0; d < x->ndim; d++)
            elems *=
                x->dims[d] + (d >= 2 ? s->p.conv.pad_begin[d - 2] + s->p.conv.pad_end[d - 2] : 0);
        reqs[n_req] = (wk_buf_req_t){(size_t)elems * sizeof(float), si, si};
        owner[n_req++] = -1 - si;
    }
    be->arena_bytes = wk_arena_plan(reqs, n_req, CU_ALIGN, offs);
    for (int k = 0; k < n_req; k++) {
        if (owner[k] >= 0)
            be->offset[owner[k]] = offs[k];
        else
            be->steps[-1 - owner[k]].tmp_offset = offs[k];
    }
    free(reqs);
    free(offs);
    free(owner);
    CU(cudaMalloc((void **)&be->arena, be->arena_bytes ? be->arena_bytes : CU_ALIGN));
    be->workspace_bytes = ws_need;
    if (ws_need > 0)
        CU(cudaMalloc(&be->workspace, ws_need));
    plan->memory_bytes += be->arena_bytes + ws_need;

    /* Scalars of the activations: three per post-op slot of every step. */
    {
        size_t per = 3 * (WK_MAX_POST + 1);
        float *host = sq_xcalloc((size_t)(g->n_steps ? g->n_steps : 1) * per, sizeof(float));
        for (int si = 0; si < g->n_steps; si++) {
            const wk_step_t *s = &g->steps[si];
            if (s->kind == WK_K_ELTWISE)
                act_scalars(s->p.act.kind == WK_ACT_HARDSWISH
                                ? (wk_act_t){WK_ACT_HARDSIGMOID, 1.0f / 6.0f, 0.5f}
                                : s->p.act,
                            host + si * per);
            for (int i = 0; i < s->n_post; i++)
                act_scalars(s->post[i].act, host + si * per + 3 * (size_t)i);
        }
        cudaError_t e = cudaMalloc((void **)&be->scalar_pool,
                                   (size_t)(g->n_steps ? g->n_steps : 1) * per * sizeof(float));
        if (e == cudaSuccess)
            e = cudaMemcpy(be->scalar_pool, host,
                           (size_t)(g->n_steps ? g->n_steps : 1) * per * sizeof(float),
                           cudaMemcpyHostToDevice);
        free(host);
        if (e != cudaSuccess) {
            rc = wk_fail(plan, SQ_DEVICE, "scalars: %s", cudaGetErrorString(e));
            goto out;
        }
        for (int si = 0; si < g->n_steps; si++)
            be->steps[si].scalars = be->scalar_pool + si * per;
    }

    /* Pinned staging for the edges. */
    be->staging_in = sq_xcalloc((size_t)(g->n_inputs ? g->n_inputs : 1), sizeof(float *));
    be->staging_out = sq_xcalloc((size_t)(g->n_outputs ? g->n_outputs : 1), sizeof(float *));
    for (int i = 0; i < g->n_inputs; i++)
        CU(cudaHostAlloc((void **)&be->staging_in[i],
                         (size_t)wk_value_elems(&g->values[g->inputs[i]]) * sizeof(float) + 4,
                         cudaHostAllocDefault));
    for (int i = 0; i < g->n_outputs; i++)
        CU(cudaHostAlloc((void **)&be->staging_out[i],
                         (size_t)wk_value_elems(&g->values[g->outputs[i]]) * sizeof(float) + 4,
                         cudaHostAllocDefault));
    (void)mb;
out:
    return rc;
}

static float *cuda_input_buffer(wk_plan_t *plan, int index)
{
    return ((cuda_be_t *)plan->be)->staging_in[index];
}

static int cuda_run(wk_plan_t *plan, int batch, float *const *outputs)
{
    cuda_be_t *be = plan->be;
    const wk_graph_t *g = plan->graph;
    int rc = 0;
    CU(cudaSetDevice(be->device));
    for (int i = 0; i < g->n_inputs; i++) {
        const wk_value_t *v = &g->values[g->inputs[i]];
        CU(cudaMemcpyAsync(dptr(be, g, g->inputs[i]), be->staging_in[i],
                           (size_t)wk_value_elems_at(v, batch) * sizeof(float),
                           cudaMemcpyHostToDevice, be->stream));
    }
    for (int si = 0; si < g->n_steps; si++)
        if ((rc = run_step(plan, si, batch)) != 0)
            goto out;
    for (int i = 0; i < g->n_outputs; i++) {
        const wk_value_t *v = &g->values[g->outputs[i]];
        CU(cudaMemcpyAsync(be->staging_out[i], dptr(be, g, g->outputs[i]),
                           (size_t)wk_value_elems_at(v, batch) * sizeof(float),
                           cudaMemcpyDeviceToHost, be->stream));
    }
    CU(cudaStreamSynchronize(be->stream));
    for (int i = 0; i < g->n_outputs; i++)
        memcpy(outputs[i], be->staging_out[i],
               (size_t)wk_value_elems_at(&g->values[g->outputs[i]], batch) * sizeof(float));
out:
    return rc;
}

/* Activations a conv applies in place after its own output: hardswish
 * needs x and a second buffer (cuDNN has no hardswish), so it stays a step
 * of its own; so do those check_supported refuses anyway. */
static bool cuda_conv_act(wk_act_kind_t kind)
{
    return kind != WK_ACT_HARDSWISH && kind != WK_ACT_POW && kind != WK_ACT_SQRT &&
           kind != WK_ACT_GELU && kind != WK_ACT_TANH;
}

const wk_backend_ops_t wk_backend_cuda = {
    .kind = SQ_DEV_CUDA,
    .prepare = cuda_prepare,
    .input_buffer = cuda_input_buffer,
    .run = cuda_run,
    .release = cuda_release,
    .conv_act = cuda_conv_act,
};
