// The cuda backend's own kernels: see cuda_kernels.h (their host-side
// layout logic is ck_layout.c). Built by nvcc
// (worker/meson.build) for sm_80 and sm_90, with PTX for compute_90.
#include "cuda_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <math.h>

namespace {

__device__ __forceinline__ float ld(const void *p, int dt, int64_t i)
{
    switch (dt) {
    case CK_F16:
        return __half2float(static_cast<const __half *>(p)[i]);
    case CK_BF16:
        return __bfloat162float(static_cast<const __nv_bfloat16 *>(p)[i]);
    default:
        return static_cast<const float *>(p)[i];
    }
}

__device__ __forceinline__ void st(void *p, int dt, int64_t i, float v)
{
    switch (dt) {
    case CK_F16:
        static_cast<__half *>(p)[i] = __float2half_rn(v);
        break;
    case CK_BF16:
        static_cast<__nv_bfloat16 *>(p)[i] = __float2bfloat16_rn(v);
        break;
    default:
        static_cast<float *>(p)[i] = v;
    }
}

// The cpu backend's (oneDNN's) definitions, in FP32: one case per
// activation of wk_acts.h.
static_assert(CK_ACT_COUNT_ == 14, "a new activation (wk_acts.h): give it its case in act()");
__device__ __forceinline__ float act(const ck_act_t &a, float x)
{
    switch (a.kind) {
    case CK_ACT_RELU:
        return x > 0.0f ? x : 0.0f;
    case CK_ACT_LEAKY_RELU:
        return x > 0.0f ? x : a.alpha * x;
    case CK_ACT_CLIP:
        return fminf(fmaxf(x, a.alpha), a.beta);
    case CK_ACT_SIGMOID:
        return 1.0f / (1.0f + expf(-x));
    case CK_ACT_HARDSIGMOID:
        return fminf(fmaxf(a.alpha * x + a.beta, 0.0f), 1.0f);
    case CK_ACT_HARDSWISH:
        return x * fminf(fmaxf(x / 6.0f + 0.5f, 0.0f), 1.0f);
    case CK_ACT_POW:
        return powf(x, a.alpha);
    case CK_ACT_SQRT:
        return sqrtf(x);
    case CK_ACT_GELU:
        return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    case CK_ACT_TANH:
        return tanhf(x);
    case CK_ACT_SWISH:
        return x / (1.0f + expf(-x));
    case CK_ACT_NEG:
        return -x;
    case CK_ACT_EXP:
        return expf(x);
    case CK_ACT_ERF:
        return erff(x);
    default:
        return x;
    }
}

// One element of a pointwise: the logical index's offsets in y, x and the
// posts' tensors, then the ops. I: the index type (32-bit where every
// offset fits, which spares the 64-bit divisions).
template <typename I> __global__ void k_pointwise(ck_pointwise_t p, I n)
{
    const int nd = p.ndim;
    for (I i = blockIdx.x * (I)blockDim.x + threadIdx.x; i < n; i += (I)gridDim.x * blockDim.x) {
        I r = i, oy = 0, ox = 0, op[CK_MAX_POST] = {0, 0, 0, 0, 0, 0};
        for (int d = nd - 1; d >= 0; d--) {
            const I dim = (I)p.dims[d];
            const I c = r % dim;
            r /= dim;
            oy += c * (I)p.y.st[d];
            ox += c * (I)p.x.st[d];
            for (int k = 0; k < p.n_post; k++)
                op[k] += c * (I)p.post[k].t.st[d];
        }
        float v = p.x.p != nullptr ? ld(p.x.p, p.x.dt, ox) : p.x_const;
        for (int k = 0; k < p.n_post; k++) {
            const ck_post_t &q = p.post[k];
            switch (q.op) {
            case CK_OP_ACT:
                v = act(q.act, v);
                break;
            case CK_OP_ADD:
                v += ld(q.t.p, q.t.dt, op[k]);
                break;
            case CK_OP_SUB:
                v -= ld(q.t.p, q.t.dt, op[k]);
                break;
            case CK_OP_MUL:
                v *= ld(q.t.p, q.t.dt, op[k]);
                break;
            case CK_OP_DIV:
                v /= ld(q.t.p, q.t.dt, op[k]);
                break;
            case CK_OP_SCALE:
                v *= q.scale;
                break;
            }
        }
        st(p.y.p, p.y.dt, oy, v);
    }
}

// Sum over the block; every thread gets it. sh: 32 floats of shared memory.
__device__ float block_sum(float v, float *sh)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads(); // sh free again (an earlier call's readers are done)
    if ((threadIdx.x & 31) == 0)
        sh[threadIdx.x >> 5] = v;
    __syncthreads();
    float s = 0.0f;
    for (int w = 0; w < (int)((blockDim.x + 31) >> 5); w++)
        s += sh[w];
    return s;
}

__global__ void k_layernorm(ck_layernorm_t p)
{
    __shared__ float sh[32];
    const int nd = p.ndim;
    const int64_t cols = p.dims[nd - 1], cx = p.x.st[nd - 1], cy = p.y.st[nd - 1];
    int64_t r = blockIdx.x, bx = 0, by = 0;
    for (int d = nd - 2; d >= 0; d--) {
        int64_t c = r % p.dims[d];
        r /= p.dims[d];
        bx += c * p.x.st[d];
        by += c * p.y.st[d];
    }
    float s = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
        s += ld(p.x.p, p.x.dt, bx + c * cx);
    const float mean = block_sum(s, sh) / (float)cols;
    float q = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
        float d = ld(p.x.p, p.x.dt, bx + c * cx) - mean;
        q += d * d;
    }
    const float var = block_sum(q, sh) / (float)cols;
    const float rstd = 1.0f / sqrtf(var + p.epsilon);
    const bool affine = p.scale != nullptr && p.shift != nullptr;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
        float v = (ld(p.x.p, p.x.dt, bx + c * cx) - mean) * rstd;
        if (affine)
            v = v * p.scale[c] + p.shift[c];
        st(p.y.p, p.y.dt, by + c * cy, v);
    }
}

// Bytes to FP32 (ck_types.h's ck_u8_t), one thread an output element, so
// that neighbouring threads write neighbouring floats.
__global__ void k_u8(const ck_u8_t p, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int c;
        const int64_t s = ck_u8_src(&p, i, &c);
        p.y[i] = (float)p.x[s] * p.scale[c] + p.bias[c];
    }
}

// Resize (ck_types.h's ck_resize_t): one thread an output element, in y's
// memory order, its value from its plane of x through the transforms and
// taps the cpu backend's C kernel uses, summed in the same order.
__global__ void k_resize(const ck_resize_t p, int64_t n)
{
    const ck_resize_how_t *h = &p.how;
    const int64_t ih = p.in_h, iw = p.in_w, oh = p.dims[2], ow = p.dims[3];
    const int64_t sy = p.x.st[2], sx = p.x.st[3];
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t at[4];
        ck_resize_at(&p, i, at);
        const int64_t base = at[0] * p.x.st[0] + at[1] * p.x.st[1];
        float v;
        if (h->mode == CK_RESIZE_NEAREST) {
            const float cy = ck_resize_coord(h, at[2], ih, oh, h->scale[0]);
            const float cx = ck_resize_coord(h, at[3], iw, ow, h->scale[1]);
            const int64_t y = ck_resize_nearest(h, cy, ih), x = ck_resize_nearest(h, cx, iw);
            v = ld(p.x.p, p.x.dt, base + y * sy + x * sx);
        } else if (h->mode == CK_RESIZE_LINEAR) {
            int64_t y1, y2, x1, x2;
            float wy1, wy2, wx1, wx2;
            ck_resize_linear(h, at[2], ih, oh, h->scale[0], &y1, &y2, &wy1, &wy2);
            ck_resize_linear(h, at[3], iw, ow, h->scale[1], &x1, &x2, &wx1, &wx2);
            const int64_t r1 = base + y1 * sy, r2 = base + y2 * sy;
            v = wx1 * wy1 * ld(p.x.p, p.x.dt, r1 + x1 * sx) +
                wx2 * wy1 * ld(p.x.p, p.x.dt, r1 + x2 * sx) +
                wx1 * wy2 * ld(p.x.p, p.x.dt, r2 + x1 * sx) +
                wx2 * wy2 * ld(p.x.p, p.x.dt, r2 + x2 * sx);
        } else {
            int64_t ys[4], xs[4];
            float wy[4], wx[4];
            ck_resize_cubic(h, at[2], ih, oh, h->scale[0], ys, wy);
            ck_resize_cubic(h, at[3], iw, ow, h->scale[1], xs, wx);
            v = 0.0f;
            for (int r = 0; r < 4; r++) {
                const int64_t row = base + ys[r] * sy;
                v += wy[r] * (wx[0] * ld(p.x.p, p.x.dt, row + xs[0] * sx) +
                              wx[1] * ld(p.x.p, p.x.dt, row + xs[1] * sx) +
                              wx[2] * ld(p.x.p, p.x.dt, row + xs[2] * sx) +
                              wx[3] * ld(p.x.p, p.x.dt, row + xs[3] * sx));
            }
        }
        st(p.y.p, p.y.dt,
           at[0] * p.y.st[0] + at[1] * p.y.st[1] + at[2] * p.y.st[2] + at[3] * p.y.st[3], v);
    }
}

} // namespace

extern "C" cudaError_t ck_resize(cudaStream_t stream, const ck_resize_t *p)
{
    ck_resize_t q = *p;
    ck_resize_prepare(&q);
    const int64_t n = q.dims[0] * q.dims[1] * q.dims[2] * q.dims[3];
    if (n == 0)
        return cudaSuccess;
    if (q.in_h < 1 || q.in_w < 1)
        return cudaErrorInvalidValue;
    const int threads = 256;
    int64_t blocks = (n + threads - 1) / threads;
    if (blocks > (1 << 20))
        blocks = 1 << 20;
    k_resize<<<(unsigned)blocks, threads, 0, stream>>>(q, n);
    return cudaGetLastError();
}

extern "C" cudaError_t ck_pointwise(cudaStream_t stream, const ck_pointwise_t *p)
{
    ck_pointwise_t q = *p;
    int64_t n = 1;
    for (int d = 0; d < q.ndim; d++)
        n *= q.dims[d];
    if (n == 0)
        return cudaSuccess;
    const bool small = ck_pointwise_prepare(&q, n);
    const int threads = 256;
    int64_t blocks = (n + threads - 1) / threads;
    if (blocks > (1 << 20))
        blocks = 1 << 20;
    if (small)
        k_pointwise<int32_t><<<(unsigned)blocks, threads, 0, stream>>>(q, (int32_t)n);
    else
        k_pointwise<int64_t><<<(unsigned)blocks, threads, 0, stream>>>(q, n);
    return cudaGetLastError();
}

extern "C" cudaError_t ck_layernorm(cudaStream_t stream, const ck_layernorm_t *p)
{
    if (p->ndim < 1)
        return cudaErrorInvalidValue;
    int64_t rows = 1, cols = p->dims[p->ndim - 1];
    for (int d = 0; d < p->ndim - 1; d++)
        rows *= p->dims[d];
    if (rows == 0 || cols == 0)
        return cudaSuccess;
    if (rows > 0x7fffffff)
        return cudaErrorInvalidValue;
    int threads = cols >= 512 ? 256 : cols >= 128 ? 128 : 64;
    k_layernorm<<<(unsigned)rows, threads, 0, stream>>>(*p);
    return cudaGetLastError();
}

extern "C" cudaError_t ck_u8(cudaStream_t stream, const ck_u8_t *p)
{
    const int64_t n = ck_u8_count(p);
    if (n == 0)
        return cudaSuccess;
    const int threads = 256;
    int64_t blocks = (n + threads - 1) / threads;
    if (blocks > (1 << 20))
        blocks = 1 << 20;
    k_u8<<<(unsigned)blocks, threads, 0, stream>>>(*p, n);
    return cudaGetLastError();
}
