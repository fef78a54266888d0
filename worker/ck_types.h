/* The cuda backend's kernels' arguments (cuda_kernels.h) and the host-side
 * preparation of a pointwise (ck_layout.c): plain C, no CUDA header, so
 * that the layout logic builds and is tested on machines without CUDA.
 *
 * Every tensor is a pointer, an element type and one element stride per
 * logical dim (0: broadcast along it), so one kernel serves plain
 * row-major tensors, NHWC ones, strided views (transpose, slice, concat,
 * pad) and numpy broadcasting alike, in FP32, FP16 or BF16; the arithmetic
 * is FP32 whatever the storage. */
#ifndef CK_TYPES_H
#define CK_TYPES_H

#include "wk_acts.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CK_MAX_DIMS 8
#define CK_MAX_POST 6

typedef enum { CK_F32 = 0, CK_F16 = 1, CK_BF16 = 2 } ck_dtype_t;

/* Activation kinds: wk_act_kind_t's numbers, from the one list
 * (wk_acts.h), plus erf. */
enum {
#define CK_ACT_ENUM_(e, name) CK_ACT_##e,
    WK_ACTS(CK_ACT_ENUM_)
#undef CK_ACT_ENUM_
        CK_ACT_COUNT_,
    CK_ACT_ERF = 100,
};

typedef struct {
    int kind;
    float alpha, beta;
} ck_act_t;

typedef struct {
    void *p; /* device; NULL in a pointwise's x: every element is x_const */
    ck_dtype_t dt;
    int64_t st[CK_MAX_DIMS];
} ck_ten_t;

/* What a pointwise applies to each value v, in order. */
typedef enum {
    CK_OP_ACT,   /* v = act(v) */
    CK_OP_ADD,   /* v = v + t */
    CK_OP_SUB,   /* v = v - t */
    CK_OP_MUL,   /* v = v * t */
    CK_OP_DIV,   /* v = v / t */
    CK_OP_SCALE, /* v = v * scale */
} ck_op_t;

typedef struct {
    ck_op_t op;
    ck_act_t act;
    float scale;
    ck_ten_t t;
} ck_post_t;

/* y = post[n-1](...post[0](x)) over every element of the logical dims;
 * y may be x (in place, same strides). */
typedef struct {
    int ndim;
    int64_t dims[CK_MAX_DIMS];
    ck_ten_t y, x;
    float x_const;
    int n_post;
    ck_post_t post[CK_MAX_POST];
} ck_pointwise_t;

/* Layer normalization over the last logical dim (one block per row of the
 * others), FP32 sums in two passes: y = (x - mean) / sqrt(var + eps),
 * then * scale[c] + shift[c] when both are given (FP32, device). */
typedef struct {
    int ndim;
    int64_t dims[CK_MAX_DIMS];
    ck_ten_t y, x;
    const float *scale, *shift;
    float epsilon;
} ck_layernorm_t;

/* Bytes to FP32 on the device: a batch's uint8 pixels (or a UINT8 tensor)
 * become the model's FP32 input there, so that a quarter of the bytes
 * cross the bus and no host thread walks them. y[i] = x[ck_u8_src(p, i,
 * &c)] * scale[c] + bias[c] for i in 0..count (ck_u8_count).
 * - pixels: x holds n images of hw pixels, 3 bytes each (RGB, HWC); y
 *   holds them as planes (NCHW) or, y_nhwc, interleaved (NHWC); channel
 *   c of y is byte src_chan[c] of a pixel (2 - c for a BGR model).
 * - else: x and y are n elements each, c = 0 (a cast: scale 1, bias 0). */
typedef struct {
    const uint8_t *x;
    float *y;
    int64_t n, hw;
    bool pixels, y_nhwc;
    int src_chan[3];
    float scale[3], bias[3];
} ck_u8_t;

#ifdef __CUDACC__
#define CK_HD __host__ __device__ __forceinline__
#else
#define CK_HD static inline
#endif

CK_HD int64_t ck_u8_count(const ck_u8_t *p)
{
    return p->pixels ? p->n * p->hw * 3 : p->n;
}

/* The byte of x that y's element i is made from, and its channel. */
CK_HD int64_t ck_u8_src(const ck_u8_t *p, int64_t i, int *c)
{
    if (!p->pixels) {
        *c = 0;
        return i;
    }
    const int64_t per = p->hw * 3, img = i / per, r = i - img * per;
    int64_t px;
    if (p->y_nhwc) {
        px = r / 3;
        *c = (int)(r - px * 3);
    } else {
        *c = (int)(r / p->hw);
        px = r - (int64_t)*c * p->hw;
    }
    return img * per + px * 3 + p->src_chan[*c];
}

/* Resize of N x C x H x W maps, H and W resized (ONNX's Resize as
 * mdb_node_runnable takes it): the coordinate transforms and taps below
 * are the cpu backend's C kernel's and the cuda kernel's both, so that the
 * two compute the same floats (the cpu's are held to ONNX Runtime and
 * torch by the tests). mode: CK_RESIZE_*; coord: wk_resize_coord_t's
 * numbers; nearest: wk_resize_nearest_t's. */
enum { CK_RESIZE_NEAREST = 0, CK_RESIZE_LINEAR = 1, CK_RESIZE_CUBIC = 2 };
enum {
    CK_COORD_HALF_PIXEL = 0,
    CK_COORD_PYTORCH_HALF_PIXEL = 1,
    CK_COORD_ALIGN_CORNERS = 2,
    CK_COORD_ASYMMETRIC = 3,
};
enum {
    CK_NEAREST_ROUND_PREFER_FLOOR = 0,
    CK_NEAREST_ROUND_PREFER_CEIL = 1,
    CK_NEAREST_FLOOR = 2,
    CK_NEAREST_CEIL = 3,
};

typedef struct {
    int mode, coord, nearest;
    bool exclude_outside; /* cubic: taps off the map weigh 0, the rest rescaled */
    float cubic_a;        /* cubic: ONNX's cubic_coeff_a */
    float scale[2];       /* H, W: what the transforms divide by */
} ck_resize_how_t;

/* The cuda kernel's arguments: y[n, c, oy, ox] from x's plane (n, c),
 * each through its strides per logical dim N, C, H, W; order: y's dims
 * largest |stride| first (ck_resize_prepare), the order threads walk. */
typedef struct {
    ck_resize_how_t how;
    int64_t dims[4]; /* y's N, C, H, W */
    int64_t in_h, in_w;
    ck_ten_t x, y;
    int order[4];
} ck_resize_t;

/* Output pixel o of an axis (in -> out pixels) as a coordinate of the
 * input, in float as ONNX Runtime computes it. */
CK_HD float ck_resize_coord(const ck_resize_how_t *h, int64_t o, int64_t in, int64_t out,
                            float scale)
{
    switch (h->coord) {
    case CK_COORD_HALF_PIXEL:
        return ((float)o + 0.5f) / scale - 0.5f;
    case CK_COORD_PYTORCH_HALF_PIXEL:
        return out > 1 ? ((float)o + 0.5f) / scale - 0.5f : 0.0f;
    case CK_COORD_ALIGN_CORNERS:
        return out == 1 ? 0.0f : (float)o * (float)(in - 1) / (float)(out - 1);
    case CK_COORD_ASYMMETRIC:
    default:
        return (float)o / scale;
    }
}

/* The input pixel nearest to coordinate c, by the rounding asked,
 * clamped to the map. */
CK_HD int64_t ck_resize_nearest(const ck_resize_how_t *h, float c, int64_t in)
{
    float r;
    switch (h->nearest) {
    case CK_NEAREST_ROUND_PREFER_FLOOR:
        r = c == (float)(int64_t)c + 0.5f ? floorf(c) : roundf(c);
        break;
    case CK_NEAREST_ROUND_PREFER_CEIL:
        r = roundf(c);
        break;
    case CK_NEAREST_FLOOR:
        r = floorf(c);
        break;
    case CK_NEAREST_CEIL:
    default:
        r = ceilf(c);
        break;
    }
    int64_t i = (int64_t)r;
    return i < 0 ? 0 : i >= in ? in - 1 : i;
}

/* The two source pixels of a bilinear tap and their weights (w1 for i1,
 * w2 for i2), the coordinate clamped to the map. */
CK_HD void ck_resize_linear(const ck_resize_how_t *h, int64_t o, int64_t in, int64_t out,
                            float scale, int64_t *i1, int64_t *i2, float *w1, float *w2)
{
    float c = ck_resize_coord(h, o, in, out, scale);
    c = fmaxf(0.0f, fminf(c, (float)(in - 1)));
    *i1 = (int64_t)c < in - 1 ? (int64_t)c : in - 1;
    *i2 = *i1 + 1 < in - 1 ? *i1 + 1 : in - 1;
    float d1 = fabsf(c - (float)*i1), d2 = fabsf(c - (float)*i2);
    if (*i1 == *i2)
        d1 = d2 = 0.5f;
    *w1 = d2; /* i1's weight is the distance to i2 */
    *w2 = d1;
}

/* The four source pixels of a bicubic tap (c - 1 .. c + 2 around the
 * coordinate's floor c, clamped to the map) and their weights: Keys'
 * kernel with ONNX's cubic_coeff_a at the fraction t, as ONNX Runtime
 * computes it. With exclude_outside, the taps off the map weigh 0 and the
 * others are scaled to sum to 1. */
CK_HD void ck_resize_cubic(const ck_resize_how_t *h, int64_t o, int64_t in, int64_t out,
                           float scale, int64_t idx[4], float w[4])
{
    float c = ck_resize_coord(h, o, in, out, scale), a = h->cubic_a;
    float base = floorf(c), t = c - base, u = 1.0f - t;
    w[0] = ((a * (t + 1) - 5 * a) * (t + 1) + 8 * a) * (t + 1) - 4 * a;
    w[1] = ((a + 2) * t - (a + 3)) * t * t + 1;
    w[2] = ((a + 2) * u - (a + 3)) * u * u + 1;
    w[3] = ((a * (u + 1) - 5 * a) * (u + 1) + 8 * a) * (u + 1) - 4 * a;
    float sum = 0.0f;
    for (int k = 0; k < 4; k++) {
        int64_t i = (int64_t)base - 1 + k;
        if (h->exclude_outside && (i < 0 || i >= in))
            w[k] = 0.0f;
        sum += w[k];
        idx[k] = i < 0 ? 0 : i >= in ? in - 1 : i;
    }
    if (h->exclude_outside && sum != 0.0f)
        for (int k = 0; k < 4; k++)
            w[k] /= sum;
}

/* Element i of the walk (ck_resize_t.order) as y's logical N, C, H, W. */
CK_HD void ck_resize_at(const ck_resize_t *p, int64_t i, int64_t nchw[4])
{
    for (int k = 3; k >= 0; k--) {
        const int d = p->order[k];
        nchw[d] = i % p->dims[d];
        i /= p->dims[d];
    }
}

/* Readies a resize for its launch: its walk in y's memory order. */
void ck_resize_prepare(ck_resize_t *p);

/* Readies a pointwise for its launch: orders the logical dims as y lies
 * in memory (largest stride first, stable), so that neighbouring threads
 * write neighbouring elements, then drops dims of size 1 and merges
 * neighbours contiguous in every tensor. Returns whether every index and
 * offset fits in 31 bits (the kernel's 32-bit index arithmetic) with room
 * for the grid-stride step past the end. n: the element count. */
bool ck_pointwise_prepare(ck_pointwise_t *p, int64_t n);

#ifdef __cplusplus
}
#endif

#endif
