/* The activations the worker's elementwise steps and conv post-ops apply,
 * one X-macro line each: X(ENUM, name). It makes wk_act_kind_t and its
 * name table (wk_exec_int.h, names.c) and the cuda kernels' CK_ACT_*
 * numbers (cuda_kernels.h), so that they agree by construction. Plain C,
 * no includes: nvcc reads it too.
 *
 * A new activation is a line here, its entry in the cpu backend's table
 * (backend_cpu_buf.c: cpu_acts, oneDNN's algorithm) and its case in the
 * cuda kernels' act() (cuda_kernels.cu); count asserts beside both fail
 * until they have it. */
#ifndef WK_ACTS_H
#define WK_ACTS_H

#define WK_ACTS(X)                                                                                 \
    X(NONE, "none")                                                                                \
    X(RELU, "relu")                                                                                \
    X(LEAKY_RELU, "leaky_relu") /* alpha: slope */                                                 \
    X(CLIP, "clip")             /* alpha: min, beta: max */                                        \
    X(SIGMOID, "sigmoid")                                                                          \
    X(HARDSIGMOID, "hardsigmoid") /* max(0, min(1, alpha x + beta)) */                             \
    X(HARDSWISH, "hardswish")     /* x * max(0, min(1, x / 6 + 1/2)) */                            \
    X(POW, "pow")                 /* x^alpha */                                                    \
    X(SQRT, "sqrt")                                                                                \
    X(GELU, "gelu") /* x * (1 + erf(x / sqrt 2)) / 2 */                                            \
    X(TANH, "tanh")                                                                                \
    X(SWISH, "swish") /* x * sigmoid(x) (SiLU) */                                                  \
    X(NEG, "neg")                                                                                  \
    X(EXP, "exp")

#endif
