/* The cpu backend's kernels: one builder per kernel kind, in the table
 * wk__cpu_ops indexed by wk_kernel_t. Each builder runs in both planning
 * phases: phase 1 (at max batch) decides layouts and temporaries, phase 2
 * creates the primitive for one batch size and queues it. The builders
 * live by concern (backend_cpu_conv.c, _elem.c, _matmul.c, _norm.c,
 * _move.c, and _ckern.c for the plain C kernels) on the buffers and
 * layouts of backend_cpu_buf.c; the backend's vtable (backend_cpu.c)
 * reaches them through this table. */
#include "backend_cpu_int.h"

/* One entry per kernel kind (wk_kernel_t, names in wk_kernel_names). A new
 * kind fails the asserts until it has its entry here. */
const wk_cpu_op_t wk__cpu_ops[] = {
    [WK_K_CONV] = {.build = wk__cpu_build_any_conv},
    [WK_K_MAXPOOL] = {.build = wk__cpu_build_pool},
    [WK_K_AVGPOOL] = {.build = wk__cpu_build_pool},
    [WK_K_GLOBALAVG] = {.build = wk__cpu_build_pool},
    [WK_K_ELTWISE] = {.build = wk__cpu_build_eltwise},
    [WK_K_BINARY] = {.build = wk__cpu_build_binary},
    [WK_K_BATCHNORM] = {.build = wk__cpu_build_binary},
    [WK_K_CONCAT] = {.build = wk__cpu_build_concat},
    [WK_K_SOFTMAX] = {.build = wk__cpu_build_softmax},
    [WK_K_GEMM] = {.build = wk__cpu_build_gemm},
    [WK_K_MATMUL] = {.build = wk__cpu_build_matmul},
    [WK_K_REDUCE_MEAN] = {.build = wk__cpu_build_reduce},
    [WK_K_COPY] = {.build = wk__cpu_build_copy},
    [WK_K_TRANSPOSE] = {.build = wk__cpu_build_transpose},
    [WK_K_PAD] = {.build = wk__cpu_build_c_kernel, .run_c = wk__cpu_run_pad},
    [WK_K_SLICE] = {.build = wk__cpu_build_c_kernel, .run_c = wk__cpu_run_slice},
    [WK_K_ERF] = {.build = wk__cpu_build_c_kernel, .run_c = wk__cpu_run_erf},
    [WK_K_EXPAND] = {.build = wk__cpu_build_c_kernel, .run_c = wk__cpu_run_expand},
    [WK_K_LAYERNORM] = {.build = wk__cpu_build_layernorm},
    [WK_K_RESIZE] = {.build = wk__cpu_build_resize, .run_c = wk__cpu_run_resize},
    [WK_K_DECONV] = {.build = wk__cpu_build_deconv},
};
_Static_assert(sizeof(wk__cpu_ops) / sizeof(wk__cpu_ops[0]) == WK_K_COUNT_,
               "a kernel kind without a cpu op");
_Static_assert(WK_K_COUNT_ == 21, "a new kernel kind: give it its entry in wk__cpu_ops");
