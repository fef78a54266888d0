/* The cuda backend on cuDNN 9 + cuBLAS + kernels of its own. Everything
 * that is not a CUDA call is shared with the cpu path: the lowered graph,
 * the fusion passes (BatchNorm folded, residual adds and activations fused
 * into convs), the liveness arena plan (wk_arena_plan) and the pixel
 * normalization.
 *
 * Ops: convolutions and pooling on cuDNN (its fused conv + bias [+
 * residual] [+ relu] where it takes it), softmax and mean reductions on
 * cuDNN, GEMM and MatMul on cuBLAS. Everything else runs on the kernels of
 * cuda_kernels.cu: every activation (also as a conv's post-ops, bias and
 * residual folded into the same pass), erf, the binary ops with full numpy
 * broadcasting (add, sub, mul, div), BatchNorm left on its own, Expand,
 * LayerNorm (FP32 sums), and the layout ops (reshape, transpose, slice,
 * concat, constant pad) as strided copies. Those kernels read and write any
 * of the value layouts below, so layouts and precisions convert inside the
 * op that needs them.
 *
 * Precision (wk_plan_opts_t.precision; the precision hook says what the
 * plan runs in):
 * - FP32: convolutions on CUDNN_FMA_MATH and cuBLAS's default math: no
 *   tensor-core rounding.
 * - TF32: convolutions on cuDNN's default math and cuBLAS on
 *   CUBLAS_TF32_TENSOR_OP_MATH; tensors stay FP32.
 * - FP16, BF16: activations in 16 bits; 4-D convolutions and pooling on
 *   NHWC tensors with NHWC filters (converted once at prepare),
 *   CUDNN_TENSOR_OP_MATH and FP32 accumulation, so cuDNN takes tensor-core
 *   kernels; GEMMs on cublasGemmEx with FP32 accumulation; LayerNorm,
 *   elementwise math, softmax and reductions in FP32 (softmax and
 *   reductions read an FP32 copy: FP32 islands, as do convs and pools that
 *   cannot run in 16 bits, e.g. 1-D or 3-D ones, pools with asymmetric
 *   pads, and every pool of a BF16 plan). Inputs arrive as FP32 in the model's layout and are
 * converted by the ops that read them; outputs are converted back to FP32 in the model's layout
 * before the copy out. A device before Ampere (sm_80) runs TF32 and BF16 plans as FP32.
 *
 * Runs: the arena is planned by liveness at max batch; conv algorithms are
 * chosen once per plan and batch size (cuDNN's heuristics). At prepare each
 * batch size runs once eagerly (a warm-up that also settles the fused-conv
 * fallback), then its whole step sequence is captured into a CUDA graph
 * (SQUISH_CUDA_GRAPHS=0: no graphs; a size whose capture fails runs
 * eagerly). Pixels and UINT8 rows come in as bytes (cuda_u8_input): they
 * cross the bus so and ck_u8 makes input 0 of them on the compute stream,
 * before the graph. A run copies the inputs in from pinned staging on a copy stream
 * (the compute stream waits on its event), launches the graph, copies the
 * outputs out and waits. Input staging is double-buffered: input_buffer()
 * gives the set the next run reads, alternating; as exec.c fills it and
 * runs synchronously, on one thread, the two sets do not overlap a run with
 * the filling of the next yet (that needs the serving side to fill batch
 * n+1 while batch n runs, which it does not do today).
 *
 * Refused when a model is lowered for it (the rules of modeldb's op table
 * that bind SQ_DEV_CUDA, which the importer reads too; squishd keeps such
 * a model on the cpu): reflect and edge pads, convolutions with asymmetric
 * pads, ConvTranspose, dilated pooling, average pooling with asymmetric
 * pads excluded from the count, MatMul broadcasts other than a shared 2-D
 * B or equal batch dims; and fused depthwise post-ops (never asked for
 * here). Resize runs on squish's own kernel (k_resize: the cpu backend's
 * transforms and taps, ck_types.h), on its input's layout and type.
 *
 * Built for sm_80 and sm_90 (PTX for later GPUs). On a machine without a
 * GPU or driver, prepare fails with SQ_DEVICE and the CUDA error text. */
#include "backend_cuda_int.h"

#include <sq.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* cuBLAS's recommended workspace on Hopper; set explicitly so that it
 * never allocates during a graph capture */
#define BLAS_WORKSPACE (32u << 20)

/* ---- plan ---- */

/* What the backend cannot do is refused before it is asked, when the
 * model is lowered for it: the rules of modeldb's op table that bind
 * SQ_DEV_CUDA (modeldb/runnable.c: reflect and edge pads, convolutions with
 * asymmetric pads, ConvTranspose, dilated pooling, average pooling with asymmetric pads
 * excluded from the count, MatMul broadcasts beyond a shared 2-D B or equal
 * batch dims), which the importer reads too, so that an upload says which
 * device kinds run a model and why the others do not. What only the lowered
 * graph shows is checked here, before any device work. */
static int check_supported(wk_plan_t *plan)
{
    const wk_graph_t *g = plan->graph;
    for (int si = 0; si < g->n_steps; si++) {
        const wk_step_t *s = &g->steps[si];
        /* the op table's rules refuse ConvTranspose on cuda */
        if (s->kind == WK_K_DECONV)
            return wk_fail(plan, SQ_UNSUPPORTED_MODEL, "cuda backend: step %d (%s): %s", si,
                           wk_kernel_names[s->kind], "no cuda kernel");
        for (int i = 0; i < s->n_post; i++)
            if (s->post[i].kind == WK_POST_DW)
                return wk_fail(plan, SQ_UNSUPPORTED_MODEL, "cuda backend: step %d (%s): %s", si,
                               wk_kernel_names[s->kind],
                               "a depthwise conv fused into a convolution");
    }
    return 0;
}

/* SQUISH_CUDA_STEP_TIMES=1: each step's mean time over the timed runs,
 * slowest first, and the sum per kernel kind, to stderr. */
static void print_step_times(const wk_plan_t *plan)
{
    const cuda_be_t *be = plan->be;
    const wk_graph_t *g = plan->graph;
    if (be->step_ms == NULL || be->timed_runs == 0)
        return;
    int n = g->n_steps, *order = sq_xcalloc((size_t)(n ? n : 1), sizeof(int));
    double kind_ms[WK_K_COUNT_] = {0}, total = 0;
    for (int i = 0; i < n; i++) {
        order[i] = i;
        kind_ms[g->steps[i].kind] += be->step_ms[i] / be->timed_runs;
        total += be->step_ms[i] / be->timed_runs;
    }
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && be->step_ms[order[j]] > be->step_ms[order[j - 1]]; j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    fprintf(stderr, "cuda step times: %s, batch %d, %d runs, %.3f ms per run\n",
            wk_precision_name(be->precision), be->timed_batch, be->timed_runs, total);
    for (int k = 0; k < WK_K_COUNT_; k++)
        if (kind_ms[k] > 0)
            fprintf(stderr, "  kind %-12s %8.3f ms\n", wk_kernel_names[k], kind_ms[k]);
    for (int i = 0; i < n && i < 25; i++) {
        const wk_step_t *s = &g->steps[order[i]];
        const wk_value_t *y = &g->values[s->out];
        char dims[96];
        int len = 0;
        for (int d = 0; d < y->ndim && len < (int)sizeof(dims) - 24; d++)
            len += snprintf(dims + len, sizeof(dims) - (size_t)len, "%s%lld", d ? "x" : "",
                            (long long)y->dims[d]);
        dims[len] = '\0';
        fprintf(stderr, "  step %4d %-12s out %-20s %s%s algo %d %8.3f ms\n", order[i],
                wk_kernel_names[s->kind], dims, be->rep[s->out].nhwc ? "nhwc " : "",
                be->rep[s->out].dt == CK_F32 ? "f32" : "16",
                be->steps[order[i]].algo != NULL ? (int)be->steps[order[i]].algo[be->timed_batch]
                                                 : -1,
                be->step_ms[order[i]] / be->timed_runs);
    }
    free(order);
}

static void cuda_release(wk_plan_t *plan)
{
    cuda_be_t *be = plan->be;
    if (be == NULL)
        return;
    const wk_graph_t *g = plan->graph;
    if (be->stream)
        cudaStreamSynchronize(be->stream);
    if (be->graph != NULL)
        for (int b = 0; b <= g->max_batch; b++)
            if (be->graph[b])
                cudaGraphExecDestroy(be->graph[b]);
    free(be->graph);
    if (be->steps != NULL) {
        for (int i = 0; i < g->n_steps; i++) {
            cuda_step_t *cs = &be->steps[i];
            if (cs->conv)
                cudnnDestroyConvolutionDescriptor(cs->conv);
            if (cs->filter)
                cudnnDestroyFilterDescriptor(cs->filter);
            if (cs->pool)
                cudnnDestroyPoolingDescriptor(cs->pool);
            free(cs->algo);
        }
    }
    for (int i = 0; i < g->n_values; i++) {
        if (be->dconst != NULL && be->dconst[i])
            cudaFree(be->dconst[i]);
        if (be->dconst16 != NULL && be->dconst16[i])
            cudaFree(be->dconst16[i]);
    }
    for (int k = 0; k < 2; k++) {
        for (int i = 0; be->staging_in[k] && i < g->n_inputs; i++)
            if (be->staging_in[k][i])
                cudaFreeHost(be->staging_in[k][i]);
        free(be->staging_in[k]);
    }
    for (int k = 0; k < 2; k++)
        if (be->staging_u8[k])
            cudaFreeHost(be->staging_u8[k]);
    if (be->dev_u8)
        cudaFree(be->dev_u8);
    for (int i = 0; be->staging_out && i < g->n_outputs; i++)
        if (be->staging_out[i])
            cudaFreeHost(be->staging_out[i]);
    for (int i = 0; i < 4; i++)
        if (be->td[i])
            cudnnDestroyTensorDescriptor(be->td[i]);
    if (be->act)
        cudnnDestroyActivationDescriptor(be->act);
    if (be->reduce)
        cudnnDestroyReduceTensorDescriptor(be->reduce);
    if (be->workspace)
        cudaFree(be->workspace);
    if (be->blas_workspace)
        cudaFree(be->blas_workspace);
    if (be->arena)
        cudaFree(be->arena);
    if (be->blas)
        cublasDestroy(be->blas);
    if (be->dnn)
        cudnnDestroy(be->dnn);
    print_step_times(plan);
    for (int i = 0; be->ev != NULL && i <= g->n_steps; i++)
        if (be->ev[i])
            cudaEventDestroy(be->ev[i]);
    free(be->ev);
    free(be->step_ms);
    if (be->copied)
        cudaEventDestroy(be->copied);
    if (be->copy_stream)
        cudaStreamDestroy(be->copy_stream);
    if (be->stream)
        cudaStreamDestroy(be->stream);
    free(be->offset);
    free(be->rep);
    free(be->dconst);
    free(be->dconst16);
    free(be->crep);
    free(be->staging_out);
    free(be->out_cvt);
    free(be->out_offset);
    free(be->steps);
    free(be);
    plan->be = NULL;
}

/* The convolution math of FP32 tensors: exact for FP32 plans, TF32 on
 * tensor cores for the others (16-bit plans' FP32 islands included). */
static cudnnMathType_t f32_math(const cuda_be_t *be)
{
    return be->precision == WK_PRECISION_FP32 ? CUDNN_FMA_MATH : CUDNN_DEFAULT_MATH;
}

/* SQUISH_CUDA_CONV_ALGO=find: convolution algorithms chosen by timing
 * them (cuDNN's find, as torch's cudnn.benchmark) rather than by cuDNN's
 * heuristics, the default. Not yet measured on a GPU: bench/gpu/run
 * --conv-algo-ab times both. */
static bool conv_algo_find(void)
{
    const char *e = getenv("SQUISH_CUDA_CONV_ALGO");
    return e != NULL && strcmp(e, "find") == 0;
}

/* Replaces conv si's heuristic algorithms by the fastest that cuDNN's find
 * times at batch sizes 1, 2, 4, ... and max_batch, each used up to the
 * next timed size (an algorithm's speed changes slowly with the batch;
 * timing all 64 sizes would take minutes). A size whose found algorithm
 * does not fit keeps the heuristic's. Descriptors of the conv and filter
 * are set; td[0] and td[1] are left at the last size timed. */
static int conv_find(wk_plan_t *plan, int si, bool half, cudnnMathType_t math)
{
    cuda_be_t *be = plan->be;
    const wk_graph_t *g = plan->graph;
    const wk_step_t *s = &g->steps[si];
    cuda_step_t *cs = &be->steps[si];
    const wk_value_t *x = &g->values[s->in[0]], *y = &g->values[s->out];
    int rc = 0, lo = 1;
    for (int b = 1; lo <= g->max_batch; b = b * 2 < g->max_batch ? b * 2 : g->max_batch) {
        cudnnConvolutionFwdAlgoPerf_t perf[8];
        int found = 0;
        DNN(wk__cuda_set_io(be, be->td[0], be->td[1], x, y, b, half));
        DNN(cudnnFindConvolutionForwardAlgorithm(be->dnn, be->td[0], cs->filter, cs->conv,
                                                 be->td[1], 8, &found, perf));
        /* fastest first; exact FP32 keeps to FMA math */
        int pick = -1;
        for (int i = 0; i < found && pick < 0; i++)
            if (perf[i].status == CUDNN_STATUS_SUCCESS &&
                (math != CUDNN_FMA_MATH || perf[i].mathType == CUDNN_FMA_MATH))
                pick = i;
        for (int k = lo; pick >= 0 && k <= b; k++) {
            size_t ws = 0;
            DNN(wk__cuda_set_io(be, be->td[2], be->td[3], x, y, k, half));
            if (cudnnGetConvolutionForwardWorkspaceSize(be->dnn, be->td[2], cs->filter, cs->conv,
                                                        be->td[3], perf[pick].algo,
                                                        &ws) == CUDNN_STATUS_SUCCESS)
                cs->algo[k] = perf[pick].algo;
        }
        SQ_DEBUG("cuda: step %d: batch %d..%d: algorithm %d by timing (%.3f ms at %d)", si, lo, b,
                 pick >= 0 ? (int)perf[pick].algo : -1, pick >= 0 ? perf[pick].time : -1.0, b);
        lo = b + 1;
        if (b == g->max_batch)
            break;
    }
out:
    return rc;
}

/* Descriptors and algorithms of conv si, in 16 bits on NHWC (half) or in
 * FP32 row-major. Returns 0, 1 when cuDNN has no algorithm for some batch
 * size, or an error. */
static int conv_setup(wk_plan_t *plan, int si, bool half, size_t *ws_need)
{
    cuda_be_t *be = plan->be;
    const wk_graph_t *g = plan->graph;
    const wk_step_t *s = &g->steps[si];
    cuda_step_t *cs = &be->steps[si];
    int rc = 0, nsp = s->p.conv.n_spatial;
    int pad[WK_MAX_SPATIAL], str[WK_MAX_SPATIAL], dil[WK_MAX_SPATIAL];
    const wk_value_t *x = &g->values[s->in[0]], *y = &g->values[s->out];
    const wk_value_t *w = &g->values[s->in[1]];
    int wd[WK_MAX_DIMS];
    for (int i = 0; i < w->ndim; i++)
        wd[i] = (int)w->dims[i];
    for (int i = 0; i < nsp; i++) {
        pad[i] = (int)s->p.conv.pad_begin[i];
        str[i] = (int)s->p.conv.stride[i];
        dil[i] = (int)s->p.conv.dilation[i];
    }
    int wn = w->ndim;
    if (nsp == 1) {
        /* cuDNN convolves 2-D and 3-D: a 1-D conv is [L, 1]. */
        wd[wn++] = 1;
        pad[1] = 0;
        str[1] = dil[1] = 1;
        nsp = 2;
    }
    cudnnMathType_t math = half ? CUDNN_TENSOR_OP_MATH : f32_math(be);
    if (!cs->filter)
        DNN(cudnnCreateFilterDescriptor(&cs->filter));
    if (half)
        DNN(cudnnSetFilter4dDescriptor(cs->filter, wk__cuda_dnn_type(be->dt16), CUDNN_TENSOR_NHWC,
                                       wd[0], wd[1], wd[2], wd[3]));
    else
        DNN(cudnnSetFilterNdDescriptor(cs->filter, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, wn, wd));
    if (!cs->conv)
        DNN(cudnnCreateConvolutionDescriptor(&cs->conv));
    /* 16-bit data with FP32 compute: cuDNN's PSEUDO_HALF and BFLOAT16
     * configurations */
    DNN(cudnnSetConvolutionNdDescriptor(cs->conv, nsp, pad, str, dil, CUDNN_CROSS_CORRELATION,
                                        CUDNN_DATA_FLOAT));
    DNN(cudnnSetConvolutionGroupCount(cs->conv, (int)s->p.conv.groups));
    DNN(cudnnSetConvolutionMathType(cs->conv, math));
    if (cs->algo == NULL)
        cs->algo = sq_xcalloc((size_t)g->max_batch + 1, sizeof(*cs->algo));
    size_t need = 0;
    for (int b = 1; b <= g->max_batch; b++) {
        cudnnConvolutionFwdAlgoPerf_t perf[8];
        int found = 0;
        DNN(wk__cuda_set_io(be, be->td[0], be->td[1], x, y, b, half));
        DNN(cudnnGetConvolutionForwardAlgorithm_v7(be->dnn, be->td[0], cs->filter, cs->conv,
                                                   be->td[1], 8, &found, perf));
        /* the first that works (exact FP32: the first in FMA math, if any) */
        int pick = -1;
        for (int i = 0; i < found && pick < 0 && math == CUDNN_FMA_MATH; i++)
            if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].mathType == math)
                pick = i;
        for (int i = 0; i < found && pick < 0; i++)
            if (perf[i].status == CUDNN_STATUS_SUCCESS)
                pick = i;
        if (pick < 0)
            return 1;
        cs->algo[b] = perf[pick].algo;
    }
    if (conv_algo_find() && (rc = conv_find(plan, si, half, math)) != 0)
        goto out;
    for (int b = 1; b <= g->max_batch; b++) {
        size_t ws = 0;
        DNN(wk__cuda_set_io(be, be->td[0], be->td[1], x, y, b, half));
        DNN(cudnnGetConvolutionForwardWorkspaceSize(be->dnn, be->td[0], cs->filter, cs->conv,
                                                    be->td[1], cs->algo[b], &ws));
        if (ws > need)
            need = ws;
    }
    if (need > *ws_need)
        *ws_need = need;
out:
    return rc;
}

/* Descriptors, algorithms and workspace needs of one step. */
static int prepare_step(wk_plan_t *plan, int si, size_t *ws_need)
{
    cuda_be_t *be = plan->be;
    const wk_graph_t *g = plan->graph;
    const wk_step_t *s = &g->steps[si];
    cuda_step_t *cs = &be->steps[si];
    int rc = 0, nsp = s->p.conv.n_spatial;
    int pad[WK_MAX_SPATIAL], str[WK_MAX_SPATIAL], win[WK_MAX_SPATIAL];
    const wk_value_t *x = &g->values[s->in[0]], *y = &g->values[s->out];
    if (s->kind == WK_K_CONV) {
        const wk_value_t *w = &g->values[s->in[1]];
        bool half = be->dt16 != CK_F32 && x->ndim == 4 && nsp == 2 && w->data != NULL;
        if (half && (rc = conv_setup(plan, si, true, ws_need)) == 1) {
            SQ_DEBUG("cuda: step %d: no 16-bit NHWC convolution algorithm; FP32", si);
            half = false;
        }
        if (rc < 0)
            return rc;
        if (!half && (rc = conv_setup(plan, si, false, ws_need)) != 0)
            return rc == 1 ? wk_fail(plan, SQ_UNSUPPORTED_MODEL,
                                     "cuda: no convolution algorithm for step %d", si)
                           : rc;
        cs->half = half;
        /* bias [+ residual] [+ relu]: cuDNN's one fused call (run_conv),
         * in FP32 and TF32 plans only (in 16-bit ones, whose residuals may
         * be 16-bit, convs take their post-ops in one pointwise) */
        bool bias = s->n_in > 2 && s->in[2] >= 0 && g->values[s->in[2]].data != NULL;
        bool add0 = s->n_post > 0 && s->post[0].kind == WK_POST_ADD;
        int rest = s->n_post - (add0 ? 1 : 0);
        cs->fused_relu = rest == 1 && s->post[s->n_post - 1].kind == WK_POST_ACT &&
                         s->post[s->n_post - 1].act.kind == WK_ACT_RELU;
        cs->fused = be->dt16 == CK_F32 && bias && y->ndim <= 4 && (rest == 0 || cs->fused_relu);
    } else if (s->kind == WK_K_MAXPOOL || s->kind == WK_K_AVGPOOL || s->kind == WK_K_GLOBALAVG) {
        nsp = x->ndim - 2;
        for (int i = 0; i < nsp; i++) {
            bool global = s->kind == WK_K_GLOBALAVG;
            win[i] = global ? (int)x->dims[2 + i] : (int)s->p.conv.kernel[i];
            str[i] = global ? 1 : (int)s->p.conv.stride[i];
            pad[i] = global ? 0 : (int)s->p.conv.pad_begin[i];
            if (!global && s->p.conv.pad_begin[i] != s->p.conv.pad_end[i])
                cs->pad_explicit = true;
        }
        if (cs->pad_explicit)
            for (int i = 0; i < nsp; i++)
                pad[i] = 0;
        if (nsp == 1) {
            /* 1-D pooling as [L, 1] */
            win[1] = str[1] = 1;
            pad[1] = 0;
            nsp = 2;
        }
        /* FP16 pooling on NHWC is cuDNN's long-standing path; BF16 plans
         * pool in FP32 (an island) rather than count on BF16 pooling */
        cs->half = be->dt16 == CK_F16 && x->ndim == 4 && !cs->pad_explicit;
        cudnnPoolingMode_t mode =
            s->kind == WK_K_MAXPOOL ? CUDNN_POOLING_MAX
            : s->kind == WK_K_AVGPOOL && (s->p.conv.count_include_pad || cs->pad_explicit)
                ? CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING
                : CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING;
        DNN(cudnnCreatePoolingDescriptor(&cs->pool));
        DNN(cudnnSetPoolingNdDescriptor(cs->pool, mode, CUDNN_PROPAGATE_NAN, nsp, win, pad, str));
    } else if (s->kind == WK_K_REDUCE_MEAN) {
        size_t ws = 0;
        int64_t k[WK_MAX_DIMS];
        for (int i = 0; i < x->ndim; i++)
            k[i] = (s->p.reduce.axes_mask >> i) & 1 ? 1 : x->dims[i];
        DNN(wk__cuda_set_plain(be->td[0], x->ndim, x->dims));
        DNN(wk__cuda_set_plain(be->td[1], x->ndim, k));
        DNN(cudnnGetReductionWorkspaceSize(be->dnn, be->reduce, be->td[0], be->td[1], &ws));
        if (ws > *ws_need)
            *ws_need = ws;
    }
out:
    return rc;
}

static bool rep_same(cuda_rep_t a, cuda_rep_t b, int ndim)
{
    return a.dt == b.dt && (ndim != 4 || a.nhwc == b.nhwc);
}

/* Each value's layout and type: FP32 row-major everywhere in FP32 and
 * TF32 plans; in 16-bit plans, what its producer writes best (module
 * comment). */
static void assign_reps(wk_plan_t *plan)
{
    cuda_be_t *be = plan->be;
    const wk_graph_t *g = plan->graph;
    const cuda_rep_t f32 = {CK_F32, false}, h = {be->dt16, false}, hn = {be->dt16, true};
    for (int i = 0; i < g->n_values; i++)
        be->rep[i] = f32;
    if (be->dt16 == CK_F32)
        return;
    for (int si = 0; si < g->n_steps; si++) {
        const wk_step_t *s = &g->steps[si];
        const wk_value_t *y = &g->values[s->out];
        cuda_rep_t r = h;
        switch (s->kind) {
        case WK_K_CONV:
        case WK_K_MAXPOOL:
        case WK_K_AVGPOOL:
        case WK_K_GLOBALAVG:
            r = be->steps[si].half ? hn : f32;
            break;
        case WK_K_SOFTMAX:
        case WK_K_REDUCE_MEAN:
            r = f32;
            break;
        case WK_K_ELTWISE:
        case WK_K_ERF:
        case WK_K_BINARY:
        case WK_K_BATCHNORM:
        case WK_K_EXPAND:
        case WK_K_LAYERNORM:
            /* NHWC when a full-shaped operand is (the chain between convs) */
            for (int k = 0; k < s->n_in && y->ndim == 4; k++) {
                const wk_value_t *v = s->in[k] >= 0 ? &g->values[s->in[k]] : NULL;
                if (v != NULL && v->data == NULL && be->rep[s->in[k]].nhwc &&
                    wk_value_elems(v) == wk_value_elems(y) && v->ndim == 4)
                    r = hn;
            }
            break;
        case WK_K_RESIZE:
            /* as its input lies: an FPN's upsampled map meets a conv's NHWC
             * output in the add after it */
            r = be->rep[s->in[0]].nhwc ? hn : h;
            break;
        case WK_K_CONCAT:
            r = y->ndim == 4 ? hn : h;
            for (int k = 0; k < s->n_in; k++)
                if (!be->rep[s->in[k]].nhwc)
                    r = h;
            break;
        default:
            break;
        }
        be->rep[s->out] = r;
    }
}

/* What each step's inputs must be for cuDNN and cuBLAS (the kernels take
 * any), and how they get so: converted at each run into the arena, or,
 * for constants, once at prepare (dconst16). */
static void assign_inputs(wk_plan_t *plan)
{
    cuda_be_t *be = plan->be;
    const wk_graph_t *g = plan->graph;
    const cuda_rep_t f32 = {CK_F32, false};
    for (int si = 0; si < g->n_steps; si++) {
        const wk_step_t *s = &g->steps[si];
        cuda_step_t *cs = &be->steps[si];
        cuda_rep_t dev = cs->half ? (cuda_rep_t){be->dt16, true} : f32;
        switch (s->kind) {
        case WK_K_CONV:
            cs->needs[0] = cs->needs[1] = true;
            cs->want[0] = cs->want[1] = dev;
            break;
        case WK_K_MAXPOOL:
        case WK_K_AVGPOOL:
        case WK_K_GLOBALAVG:
            cs->needs[0] = true;
            cs->want[0] = dev;
            break;
        case WK_K_SOFTMAX:
        case WK_K_REDUCE_MEAN:
            cs->needs[0] = true;
            cs->want[0] = f32;
            break;
        case WK_K_GEMM:
        case WK_K_MATMUL:
            cs->needs[0] = cs->needs[1] = true;
            cs->want[0] = cs->want[1] = (cuda_rep_t){be->dt16, false};
            break;
        default:
            break;
        }
        for (int k = 0; k < CU_MAX_CVT && k < s->n_in; k++) {
            int v = s->in[k];
            if (!cs->needs[k] || v < 0)
                continue;
            int nd = g->values[v].ndim;
            if (rep_same(be->rep[v], cs->want[k], nd))
                continue;
            if (g->values[v].data != NULL &&
                (!be->crep[v].dt || rep_same(be->crep[v], cs->want[k], nd))) {
                be->crep[v] = cs->want[k]; /* dconst16 made in prepare */
                continue;
            }
            cs->cvt[k] = true;
        }
    }
}

/* Constants as their 16-bit consumers want them, converted once. */
static int convert_constants(wk_plan_t *plan)
{
    cuda_be_t *be = plan->be;
    const wk_graph_t *g = plan->graph;
    int rc = 0;
    for (int v = 0; v < g->n_values; v++) {
        if (be->dconst[v] == NULL || !be->crep[v].dt)
            continue;
        size_t bytes = (size_t)wk_value_elems(&g->values[v]) * wk__cuda_dt_size(be->crep[v].dt);
        CU(cudaMalloc(&be->dconst16[v], bytes ? bytes : 4));
        plan->memory_bytes += bytes;
        if ((rc = wk__cuda_convert(plan, v, 1, be->crep[v], be->dconst16[v])) != 0)
            goto out;
    }
    CU(cudaStreamSynchronize(be->stream));
out:
    return rc;
}

/* The arena by liveness: every value in its layout and type, the
 * converted inputs of the steps that need them, the padded copies of
 * asymmetric pooling and the outputs' FP32 copies. */
static int plan_arena(wk_plan_t *plan)
{
    cuda_be_t *be = plan->be;
    const wk_graph_t *g = plan->graph;
    int rc = 0, n_req = 0;
    size_t cap = (size_t)(g->n_values + g->n_steps * (CU_MAX_CVT + 1) + g->n_outputs + 1);
    wk_buf_req_t *reqs = sq_xcalloc(cap, sizeof(*reqs));
    size_t *offs = sq_xcalloc(cap, sizeof(size_t));
    size_t **where = sq_xcalloc(cap, sizeof(size_t *));
    for (int i = 0; i < g->n_values; i++) {
        const wk_value_t *v = &g->values[i];
        if (v->data != NULL || (!v->is_input && v->producer < 0))
            continue;
        int first = v->is_input ? 0 : v->producer;
        reqs[n_req] = (wk_buf_req_t){(size_t)wk_value_elems(v) * wk__cuda_dt_size(be->rep[i].dt),
                                     first, v->last_use > first ? v->last_use : first};
        where[n_req++] = &be->offset[i];
    }
    for (int si = 0; si < g->n_steps; si++) {
        const wk_step_t *s = &g->steps[si];
        cuda_step_t *cs = &be->steps[si];
        for (int k = 0; k < CU_MAX_CVT && k < s->n_in; k++) {
            if (!cs->cvt[k])
                continue;
            reqs[n_req] = (wk_buf_req_t){(size_t)wk_value_elems(&g->values[s->in[k]]) *
                                             wk__cuda_dt_size(cs->want[k].dt),
                                         si, si};
            where[n_req++] = &cs->cvt_offset[k];
        }
        if (cs->pad_explicit) {
            const wk_value_t *x = &g->values[s->in[0]];
            int64_t elems = 1;
            for (int d = 0; d < x->ndim; d++)
                elems *= x->dims[d] +
                         (d >= 2 ? s->p.conv.pad_begin[d - 2] + s->p.conv.pad_end[d - 2] : 0);
            reqs[n_req] = (wk_buf_req_t){(size_t)elems * sizeof(float), si, si};
            where[n_req++] = &cs->pad_offset;
        }
    }
    for (int i = 0; i < g->n_outputs; i++) {
        int v = g->outputs[i];
        if (g->values[v].data != NULL || rep_same(be->rep[v], (cuda_rep_t){CK_F32, false}, 0))
            continue;
        be->out_cvt[i] = true;
        reqs[n_req] = (wk_buf_req_t){(size_t)wk_value_elems(&g->values[v]) * sizeof(float),
                                     g->n_steps, g->n_steps};
        where[n_req++] = &be->out_offset[i];
    }
    be->arena_bytes = wk_arena_plan(reqs, n_req, CU_ALIGN, offs);
    for (int k = 0; k < n_req; k++)
        *where[k] = offs[k];
    free(reqs);
    free(offs);
    free(where);
    CU(cudaMalloc((void **)&be->arena, be->arena_bytes ? be->arena_bytes : CU_ALIGN));
    CU(cudaMemset(be->arena, 0, be->arena_bytes ? be->arena_bytes : CU_ALIGN));
    plan->memory_bytes += be->arena_bytes;
out:
    return rc;
}

/* The precision the device allows: TF32 and BF16 need Ampere (sm_80),
 * FP16 tensor cores Volta. */
static wk_precision_t settle_precision(wk_plan_t *plan, int major)
{
    wk_precision_t p = plan->opts.precision;
    if ((unsigned)p >= WK_PRECISION_COUNT_)
        p = WK_PRECISION_FP32;
    if ((p == WK_PRECISION_TF32 || p == WK_PRECISION_BF16) && major < 8)
        p = WK_PRECISION_FP32;
    if (p == WK_PRECISION_FP16 && major < 7)
        p = WK_PRECISION_FP32;
    if (p != plan->opts.precision)
        SQ_INFO("cuda:%d (sm_%d): precision %d asked, running %s", plan->opts.device_index,
                major * 10, (int)plan->opts.precision, wk_precision_name(p));
    return p;
}

static bool step_times_wanted(void)
{
    const char *e = getenv("SQUISH_CUDA_STEP_TIMES");
    return e != NULL && strcmp(e, "1") == 0;
}

static bool graphs_wanted(void)
{
    const char *e = getenv("SQUISH_CUDA_GRAPHS");
    return (e == NULL || strcmp(e, "0") != 0) && !step_times_wanted();
}

/* Each batch size once eagerly (the warm-up: first launches, lazy module
 * loading, the fused-conv fallback settled), then captured into a graph.
 * A size whose capture fails runs eagerly, said once. The graphs allocate
 * no memory of their own (no memory nodes: every buffer is the arena's or
 * a workspace's, already in memory_bytes); what the driver keeps for an
 * instantiated graph is not knowable here and not counted. */
static int warm_and_capture(wk_plan_t *plan)
{
    cuda_be_t *be = plan->be;
    const wk_graph_t *g = plan->graph;
    int rc = 0;
    bool graphs = graphs_wanted(), said = false;
    be->graph = sq_xcalloc((size_t)g->max_batch + 1, sizeof(*be->graph));
    for (int b = 1; b <= g->max_batch; b++) {
        if ((rc = wk__cuda_run_seq(plan, b)) != 0)
            goto out;
        CU(cudaStreamSynchronize(be->stream));
        if (!graphs)
            continue;
        cudaGraph_t graph = NULL;
        cudaError_t ce = cudaStreamBeginCapture(be->stream, cudaStreamCaptureModeThreadLocal);
        int run_rc = ce == cudaSuccess ? wk__cuda_run_seq(plan, b) : 0;
        if (ce == cudaSuccess) {
            cudaError_t ee = cudaStreamEndCapture(be->stream, &graph);
            ce = run_rc != 0 ? cudaErrorStreamCaptureInvalidated : ee;
        }
        if (ce == cudaSuccess && graph != NULL)
            ce = cudaGraphInstantiate(&be->graph[b], graph, 0);
        if (graph != NULL)
            cudaGraphDestroy(graph);
        if (ce != cudaSuccess || run_rc != 0) {
            if (!said)
                SQ_WARN("cuda: batch %d runs without a CUDA graph: %s", b,
                        run_rc != 0 ? plan->why : cudaGetErrorString(ce));
            said = true;
            be->graph[b] = NULL;
            plan->why[0] = '\0';
            (void)cudaGetLastError(); /* the capture's error is not the plan's */
        }
    }
out:
    return rc;
}

/* force: WK_PRECISION_FP32 after a 16-bit or TF32 attempt failed;
 * WK_PRECISION_COUNT_ for what was asked (as the device allows). */
static int prepare_at(wk_plan_t *plan, wk_precision_t force)
{
    const wk_graph_t *g = plan->graph;
    int rc = 0, count = 0;
    cuda_be_t *be = sq_xcalloc(1, sizeof(*be));
    plan->be = be;
    be->device = plan->opts.device_index;
    be->precision = WK_PRECISION_FP32;
    be->dt16 = CK_F32;
    if ((rc = check_supported(plan)) != 0)
        return rc;
    cudaError_t ce = cudaGetDeviceCount(&count);
    if (ce != cudaSuccess)
        return wk_fail(plan, SQ_DEVICE, "cuda:%d unavailable: %s (%s)", be->device,
                       cudaGetErrorString(ce), cudaGetErrorName(ce));
    if (be->device >= count)
        return wk_fail(plan, SQ_DEVICE, "cuda:%d requested but %d device(s) present", be->device,
                       count);
    CU(cudaSetDevice(be->device));
    int major = 0;
    CU(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, be->device));
    be->precision = force == WK_PRECISION_COUNT_ ? settle_precision(plan, major) : force;
    be->dt16 = be->precision == WK_PRECISION_FP16   ? CK_F16
               : be->precision == WK_PRECISION_BF16 ? CK_BF16
                                                    : CK_F32;
    CU(cudaStreamCreateWithFlags(&be->stream, cudaStreamNonBlocking));
    CU(cudaStreamCreateWithFlags(&be->copy_stream, cudaStreamNonBlocking));
    CU(cudaEventCreateWithFlags(&be->copied, cudaEventDisableTiming));
    DNN(cudnnCreate(&be->dnn));
    DNN(cudnnSetStream(be->dnn, be->stream));
    BLAS(cublasCreate(&be->blas));
    BLAS(cublasSetStream(be->blas, be->stream));
    BLAS(cublasSetMathMode(be->blas, be->precision == WK_PRECISION_TF32 ? CUBLAS_TF32_TENSOR_OP_MATH
                                                                        : CUBLAS_DEFAULT_MATH));
    be->blas_workspace_bytes = BLAS_WORKSPACE;
    CU(cudaMalloc(&be->blas_workspace, be->blas_workspace_bytes));
    BLAS(cublasSetWorkspace(be->blas, be->blas_workspace, be->blas_workspace_bytes));
    plan->memory_bytes += be->blas_workspace_bytes;
    for (int i = 0; i < 4; i++)
        DNN(cudnnCreateTensorDescriptor(&be->td[i]));
    DNN(cudnnCreateActivationDescriptor(&be->act));
    DNN(cudnnCreateReduceTensorDescriptor(&be->reduce));
    DNN(cudnnSetReduceTensorDescriptor(be->reduce, CUDNN_REDUCE_TENSOR_AVG, CUDNN_DATA_FLOAT,
                                       CUDNN_PROPAGATE_NAN, CUDNN_REDUCE_TENSOR_NO_INDICES,
                                       CUDNN_32BIT_INDICES));

    /* Constants to the device, once, as FP32. */
    be->dconst = sq_xcalloc((size_t)g->n_values, sizeof(float *));
    be->dconst16 = sq_xcalloc((size_t)g->n_values, sizeof(void *));
    be->crep = sq_xcalloc((size_t)g->n_values, sizeof(cuda_rep_t));
    be->offset = sq_xcalloc((size_t)g->n_values, sizeof(size_t));
    be->rep = sq_xcalloc((size_t)g->n_values, sizeof(cuda_rep_t));
    be->out_cvt = sq_xcalloc((size_t)(g->n_outputs ? g->n_outputs : 1), sizeof(bool));
    be->out_offset = sq_xcalloc((size_t)(g->n_outputs ? g->n_outputs : 1), sizeof(size_t));
    for (int i = 0; i < g->n_values; i++) {
        const wk_value_t *v = &g->values[i];
        if (v->data == NULL)
            continue;
        size_t bytes = (size_t)wk_value_elems(v) * sizeof(float);
        CU(cudaMalloc((void **)&be->dconst[i], bytes ? bytes : 4));
        CU(cudaMemcpy(be->dconst[i], v->data, bytes, cudaMemcpyHostToDevice));
        plan->memory_bytes += bytes;
    }

    be->steps = sq_xcalloc((size_t)(g->n_steps ? g->n_steps : 1), sizeof(*be->steps));
    if (step_times_wanted()) {
        be->ev = sq_xcalloc((size_t)g->n_steps + 1, sizeof(cudaEvent_t));
        be->step_ms = sq_xcalloc((size_t)(g->n_steps ? g->n_steps : 1), sizeof(double));
        for (int i = 0; i <= g->n_steps; i++)
            CU(cudaEventCreate(&be->ev[i]));
    }
    size_t ws_need = 0;
    for (int si = 0; si < g->n_steps; si++)
        if ((rc = prepare_step(plan, si, &ws_need)) != 0)
            goto out;
    assign_reps(plan);
    assign_inputs(plan);
    if ((rc = plan_arena(plan)) != 0 || (rc = convert_constants(plan)) != 0)
        goto out;
    be->workspace_bytes = ws_need;
    if (ws_need > 0)
        CU(cudaMalloc(&be->workspace, ws_need));
    plan->memory_bytes += ws_need;

    /* Pinned staging for the edges, two sets for the inputs. */
    for (int k = 0; k < 2; k++) {
        be->staging_in[k] = sq_xcalloc((size_t)(g->n_inputs ? g->n_inputs : 1), sizeof(float *));
        for (int i = 0; i < g->n_inputs; i++)
            CU(cudaHostAlloc((void **)&be->staging_in[k][i],
                             (size_t)wk_value_elems(&g->values[g->inputs[i]]) * sizeof(float) + 4,
                             cudaHostAllocDefault));
    }
    be->staging_out = sq_xcalloc((size_t)(g->n_outputs ? g->n_outputs : 1), sizeof(float *));
    for (int i = 0; i < g->n_outputs; i++)
        CU(cudaHostAlloc((void **)&be->staging_out[i],
                         (size_t)wk_value_elems(&g->values[g->outputs[i]]) * sizeof(float) + 4,
                         cudaHostAllocDefault));
    rc = warm_and_capture(plan);
out:
    return rc;
}

/* A plan that cannot be made in the precision asked (cuDNN without a
 * 16-bit call for one of its ops, say) is made again in FP32, which the
 * precision hook then reports. */
static int cuda_prepare(wk_plan_t *plan)
{
    uint64_t mem0 = plan->memory_bytes;
    int rc = prepare_at(plan, WK_PRECISION_COUNT_);
    cuda_be_t *be = plan->be;
    if (rc == 0 || rc == SQ_UNSUPPORTED_MODEL || be == NULL || be->stream == NULL ||
        be->precision == WK_PRECISION_FP32)
        return rc;
    SQ_WARN("cuda:%d: the %s plan failed (%s); FP32 instead", be->device,
            wk_precision_name(be->precision), plan->why);
    cuda_release(plan);
    (void)cudaGetLastError();
    plan->memory_bytes = mem0;
    plan->why[0] = '\0';
    return prepare_at(plan, WK_PRECISION_FP32);
}

static float *cuda_input_buffer(wk_plan_t *plan, int index)
{
    cuda_be_t *be = plan->be;
    return be->staging_in[be->cur_in][index];
}

/* The bytes are copied to pinned staging now (the caller's buffer may be
 * reused before the run) and go over the bus as bytes at the run, where
 * ck_u8 makes input 0 of them on the compute stream. */
static int cuda_u8_input(wk_plan_t *plan, const uint8_t *bytes, const wk_u8_in_t *how)
{
    cuda_be_t *be = plan->be;
    const wk_graph_t *g = plan->graph;
    int rc = 0;
    if (g->n_inputs < 1)
        return SQ_INVAL;
    ck_u8_t u = {.n = how->n,
                 .hw = how->h * how->w,
                 .pixels = how->pixels,
                 .y_nhwc = how->nhwc,
                 .src_chan = {how->src_chan[0], how->src_chan[1], how->src_chan[2]},
                 .scale = {how->scale[0], how->scale[1], how->scale[2]},
                 .bias = {how->bias[0], how->bias[1], how->bias[2]}};
    int64_t count = ck_u8_count(&u);
    size_t cap = (size_t)wk_value_elems(&g->values[g->inputs[0]]);
    if (count < 1 || (size_t)count > cap)
        return SQ_INVAL;
    CU(cudaSetDevice(be->device));
    if (be->dev_u8 == NULL) {
        for (int k = 0; k < 2; k++)
            CU(cudaHostAlloc((void **)&be->staging_u8[k], cap, cudaHostAllocDefault));
        CU(cudaMalloc((void **)&be->dev_u8, cap));
        plan->memory_bytes += cap;
    }
    memcpy(be->staging_u8[be->cur_in], bytes, (size_t)count);
    be->u8_how = u;
    be->u8_next = true;
out:
    return rc;
}

static int cuda_run(wk_plan_t *plan, int batch, float *const *outputs)
{
    cuda_be_t *be = plan->be;
    const wk_graph_t *g = plan->graph;
    int rc = 0;
    float **in = be->staging_in[be->cur_in];
    uint8_t *in_u8 = be->staging_u8[be->cur_in];
    bool u8 = be->u8_next;
    be->u8_next = false;
    be->cur_in ^= 1; /* the next input_buffer() fills the other set */
    CU(cudaSetDevice(be->device));
    for (int i = u8 ? 1 : 0; i < g->n_inputs; i++) {
        int v = g->inputs[i];
        CU(cudaMemcpyAsync(be->arena + be->offset[v], in[i],
                           (size_t)wk_value_elems_at(&g->values[v], batch) * sizeof(float),
                           cudaMemcpyHostToDevice, be->copy_stream));
    }
    if (u8)
        CU(cudaMemcpyAsync(be->dev_u8, in_u8, (size_t)ck_u8_count(&be->u8_how),
                           cudaMemcpyHostToDevice, be->copy_stream));
    CU(cudaEventRecord(be->copied, be->copy_stream));
    CU(cudaStreamWaitEvent(be->stream, be->copied, 0));
    if (u8) {
        be->u8_how.x = be->dev_u8;
        be->u8_how.y = (float *)(be->arena + be->offset[g->inputs[0]]);
        CU(ck_u8(be->stream, &be->u8_how));
    }
    be->timing = true;
    if (be->graph[batch] != NULL)
        CU(cudaGraphLaunch(be->graph[batch], be->stream));
    else if ((rc = wk__cuda_run_seq(plan, batch)) != 0)
        goto out;
    be->timing = false;
    for (int i = 0; i < g->n_outputs; i++) {
        int v = g->outputs[i];
        const void *src = be->out_cvt[i] ? (const void *)(be->arena + be->out_offset[i])
                          : g->values[v].data != NULL ? (const void *)be->dconst[v]
                                                      : (const void *)(be->arena + be->offset[v]);
        CU(cudaMemcpyAsync(be->staging_out[i], src,
                           (size_t)wk_value_elems_at(&g->values[v], batch) * sizeof(float),
                           cudaMemcpyDeviceToHost, be->stream));
    }
    CU(cudaStreamSynchronize(be->stream));
    for (int i = 0; i < g->n_outputs; i++)
        memcpy(outputs[i], be->staging_out[i],
               (size_t)wk_value_elems_at(&g->values[g->outputs[i]], batch) * sizeof(float));
out:
    return rc;
}

static wk_precision_t cuda_precision(const wk_plan_t *plan)
{
    const cuda_be_t *be = plan->be;
    return be != NULL ? be->precision : WK_PRECISION_FP32;
}

/* Every activation is a conv post-op here (one pointwise after the conv),
 * so conv_act is left NULL. */
static const wk_backend_ops_t wk_backend_cuda = {
    .kind = SQ_DEV_CUDA,
    .prepare = cuda_prepare,
    .input_buffer = cuda_input_buffer,
    .run = cuda_run,
    .u8_input = cuda_u8_input,
    .release = cuda_release,
    .precision = cuda_precision,
    .conv_add_after_act = true, /* its pointwise runs post-ops in any order */
};

const wk_backend_ops_t *wk__cuda_ops(void)
{
    return &wk_backend_cuda;
}
