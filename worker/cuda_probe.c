/* The CUDA runtime probe; built only with the CUDA backend. It fails soft:
 * on a machine without a GPU or driver it reports why, and the worker exits
 * with WK_EXIT_DEVICE_UNAVAILABLE so that squishd falls back to cpu. */
#include "wk.h"

#include <sq.h>

#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <stdio.h>

int wk_cuda_in_process(void)
{
    return 1;
}

int wk_cuda_probe(int index, uint64_t *memory_bytes, char *why, int why_size)
{
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
        snprintf(why, (size_t)why_size, "cudaGetDeviceCount: %s (%s)", cudaGetErrorString(err),
                 cudaGetErrorName(err));
        return SQ_DEVICE;
    }
    if (index >= count) {
        snprintf(why, (size_t)why_size, "cuda:%d requested but %d device(s) present", index, count);
        return SQ_DEVICE;
    }
    struct cudaDeviceProp prop;
    if ((err = cudaGetDeviceProperties(&prop, index)) != cudaSuccess) {
        snprintf(why, (size_t)why_size, "cudaGetDeviceProperties: %s", cudaGetErrorString(err));
        return SQ_DEVICE;
    }
    *memory_bytes = prop.totalGlobalMem;
    SQ_INFO("cuda device index=%d name=\"%s\" memory_mb=%llu cudnn=%zu", index, prop.name,
            (unsigned long long)(prop.totalGlobalMem >> 20), cudnnGetVersion());
    return 0;
}
