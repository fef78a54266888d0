/* Internals of the cuda backend, shared by backend_cuda.c (plan: support
 * checks, precision, arena, CUDA graphs, runs) and backend_cuda_ops.c (the
 * steps). Not part of the worker's public face. */
#ifndef BACKEND_CUDA_INT_H
#define BACKEND_CUDA_INT_H

#include "cuda_kernels.h"
#include "wk_exec_int.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <stdbool.h>
#include <stddef.h>

#define CU_ALIGN 256
/* input slots of a step that may be read through a converted copy */
#define CU_MAX_CVT 3

/* How a value lies on the device: its element type, and NHWC (4-D values
 * only) or plain row-major. */
typedef struct {
    ck_dtype_t dt;
    bool nhwc;
} cuda_rep_t;

typedef struct {
    cudnnConvolutionDescriptor_t conv;
    cudnnFilterDescriptor_t filter;
    cudnnPoolingDescriptor_t pool;
    cudnnConvolutionFwdAlgo_t *algo; /* [max_batch + 1] */
    bool pad_explicit;               /* pooling with asymmetric pads: padded copy first */
    size_t pad_offset;               /* arena offset of that copy */
    /* conv and pooling in 16 bits on NHWC tensors (tensor cores) */
    bool half;
    /* conv: bias, then at most a residual and a relu, in one
     * cudnnConvolutionBiasActivationForward (fused_relu: with the relu) */
    bool fused, fused_relu;
    /* input slot k read as want[k]: from a copy converted at each run into
     * the arena at cvt_offset[k] (cvt[k]), or from a constant's copy made
     * at prepare */
    bool needs[CU_MAX_CVT], cvt[CU_MAX_CVT];
    cuda_rep_t want[CU_MAX_CVT];
    size_t cvt_offset[CU_MAX_CVT];
} cuda_step_t;

typedef struct {
    int device;
    wk_precision_t precision; /* what the plan runs in */
    ck_dtype_t dt16;          /* FP16 and BF16 plans: their 16-bit type; else CK_F32 */
    cudaStream_t stream;      /* compute */
    cudaStream_t copy_stream; /* inputs in */
    cudaEvent_t copied;
    cudnnHandle_t dnn;
    cublasHandle_t blas;
    char *arena; /* device */
    size_t arena_bytes;
    size_t *offset;   /* per value: arena offset */
    cuda_rep_t *rep;  /* per value */
    float **dconst;   /* per value: device copy of a constant (FP32, row-major), or NULL */
    void **dconst16;  /* per value: the constant converted once (conv weights, GEMM operands) */
    cuda_rep_t *crep; /* per value: dconst16's layout and type */
    float **staging_in[2]; /* pinned, per input; two sets, alternating runs */
    int cur_in;
    /* input 0 from bytes (cuda_u8_input): pinned staging, two sets as
     * staging_in's, and their device copy, made at the first such run */
    uint8_t *staging_u8[2], *dev_u8;
    bool u8_next;        /* the next run converts staging_u8 into input 0 */
    ck_u8_t u8_how;      /* ... so (its x and y set at the run) */
    float **staging_out; /* pinned, per output */
    bool *out_cvt;       /* per output: converted to FP32 row-major at out_offset first */
    size_t *out_offset;
    void *workspace; /* cuDNN */
    size_t workspace_bytes;
    void *blas_workspace;
    size_t blas_workspace_bytes;
    cuda_step_t *steps;
    cudnnTensorDescriptor_t td[4];
    cudnnActivationDescriptor_t act;
    cudnnReduceTensorDescriptor_t reduce;
    /* per batch size 1..max_batch: the captured step sequence, or NULL
     * where that size runs eagerly */
    cudaGraphExec_t *graph;
    /* SQUISH_CUDA_STEP_TIMES=1, a developer's tool (CUDA graphs off): the
     * steps of each run after the warm-up timed by events, summed per
     * step and printed at release */
    cudaEvent_t *ev; /* [n_steps + 1] */
    double *step_ms; /* [n_steps] */
    int timed_runs, timed_batch;
    bool timing; /* the run in progress is timed */
} cuda_be_t;

extern const float wk__cuda_one, wk__cuda_zero;

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

/* ---- backend_cuda_ops.c ---- */
size_t wk__cuda_dt_size(ck_dtype_t dt);
cudnnDataType_t wk__cuda_dnn_type(ck_dtype_t dt);
/* Element strides of value v at `batch` laid out as r. */
void wk__cuda_rep_strides(const wk_value_t *v, int batch, cuda_rep_t r, int64_t *st);
/* A plain (row-major, trailing 1s to 4 dims) or NHWC 4-D descriptor. */
cudnnStatus_t wk__cuda_set_plain(cudnnTensorDescriptor_t d, int ndim, const int64_t *dims);
cudnnStatus_t wk__cuda_set_value(cudnnTensorDescriptor_t d, const wk_value_t *v, int batch);
cudnnStatus_t wk__cuda_set_nhwc(cudnnTensorDescriptor_t d, const wk_value_t *v, int batch,
                                ck_dtype_t dt);
/* A conv's or pooling's input and output descriptors at `batch`: NHWC in
 * the plan's 16-bit type (half), else as the values lie in FP32. */
cudnnStatus_t wk__cuda_set_io(const cuda_be_t *be, cudnnTensorDescriptor_t dx,
                              cudnnTensorDescriptor_t dy, const wk_value_t *x, const wk_value_t *y,
                              int batch, bool half);
/* Converts value v (its own layout and type) to r in dst (device). */
int wk__cuda_convert(wk_plan_t *plan, int v, int batch, cuda_rep_t r, void *dst);
/* The whole step sequence at `batch`, outputs converted for the copy out
 * last: what a CUDA graph captures. */
int wk__cuda_run_seq(wk_plan_t *plan, int batch);

#endif
