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
