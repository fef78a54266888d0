/* The cpu backend's AVX2 code outside oneDNN (backend_cpu_sqconv.c's conv,
 * backend_cpu_move.c's concat with its BatchNorm): the target attribute its
 * functions carry, so that the rest of the worker builds for any x86-64, and
 * the activations they apply to 8 floats at a time. The callers check
 * AVX2 and FMA at run time before they call in. */
#ifndef WK_BACKEND_CPU_AVX2_H
#define WK_BACKEND_CPU_AVX2_H

#include "wk_exec_int.h"

#include <immintrin.h>

#define WK_AVX2 __attribute__((target("avx2,fma")))

/* a(v), for the activations the AVX2 kernels take (relu, leaky relu, clip,
 * hardswish); v itself for any other. */
static inline __attribute__((always_inline)) WK_AVX2 __m256 wk__cpu_act8(__m256 v,
                                                                         const wk_act_t *a)
{
    __m256 z = _mm256_setzero_ps();
    switch (a->kind) {
    case WK_ACT_RELU:
        return _mm256_max_ps(v, z);
    case WK_ACT_LEAKY_RELU: {
        __m256 neg = _mm256_mul_ps(v, _mm256_set1_ps(a->alpha));
        return _mm256_blendv_ps(v, neg, _mm256_cmp_ps(v, z, _CMP_LT_OQ));
    }
    case WK_ACT_CLIP:
        return _mm256_min_ps(_mm256_max_ps(v, _mm256_set1_ps(a->alpha)), _mm256_set1_ps(a->beta));
    case WK_ACT_HARDSWISH: {
        __m256 t = _mm256_fmadd_ps(v, _mm256_set1_ps(1.0f / 6.0f), _mm256_set1_ps(0.5f));
        t = _mm256_min_ps(_mm256_max_ps(t, z), _mm256_set1_ps(1.0f));
        return _mm256_mul_ps(v, t);
    }
    default:
        return v;
    }
}

#endif
