/* The cuda backend's own kernels (cuda_kernels.cu, built by nvcc): what
 * cuDNN and cuBLAS have no call for. Plain C on this side.
 *
 * Every tensor is a pointer, an element type and one element stride per
 * logical dim (0: broadcast along it), so one kernel serves plain
 * row-major tensors, NHWC ones, strided views (transpose, slice, concat,
 * pad) and numpy broadcasting alike, in FP32, FP16 or BF16; the arithmetic
 * is FP32 whatever the storage. The functions launch on `stream` and
 * return cudaGetLastError(). */
#ifndef CUDA_KERNELS_H
#define CUDA_KERNELS_H

#include "wk_acts.h"

#include <cuda_runtime_api.h>
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

cudaError_t ck_pointwise(cudaStream_t stream, const ck_pointwise_t *p);

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

cudaError_t ck_layernorm(cudaStream_t stream, const ck_layernorm_t *p);

#ifdef __cplusplus
}
#endif

#endif
