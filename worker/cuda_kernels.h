/* The cuda backend's own kernels: what cuDNN and cuBLAS have no call for.
 * Plain C on this side; their arguments are ck_types.h's. The functions
 * launch on `stream` and return cudaGetLastError(). */
#ifndef CUDA_KERNELS_H
#define CUDA_KERNELS_H

#include "ck_types.h"

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

cudaError_t ck_pointwise(cudaStream_t stream, const ck_pointwise_t *p);
cudaError_t ck_layernorm(cudaStream_t stream, const ck_layernorm_t *p);
cudaError_t ck_u8(cudaStream_t stream, const ck_u8_t *p);
cudaError_t ck_resize(cudaStream_t stream, const ck_resize_t *p);

#ifdef __cplusplus
}
#endif

#endif
