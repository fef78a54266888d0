/* Internals of the cpu backend, in layers, each calling only those below
 * it: backend_cpu_buf.c (buffers and layouts); the op builders by concern,
 * backend_cpu_conv.c (convolutions, pooling; backend_cpu_dwfuse.c on it:
 * whether a depthwise conv is fused), backend_cpu_elem.c (activations,
 * binary ops), backend_cpu_matmul.c (Gemm, MatMul), backend_cpu_norm.c
 * (softmax, reductions, layer norm), backend_cpu_move.c (concat, reshape,
 * transpose) and backend_cpu_ckern.c (plain C kernels); backend_cpu_sqconv.c
 * on the conv builder (squish's own direct conv on AVX2 CPUs, where it
 * times faster than oneDNN's); backend_cpu_ops.c
 * (their table wk__cpu_ops, one entry per kernel kind); and backend_cpu.c
 * (the backend's vtable: the two planning phases, running). See
 * backend_cpu.c for the design. */
#ifndef BACKEND_CPU_INT_H
#define BACKEND_CPU_INT_H

#include "wk_exec_int.h"

#include <sq.h>

#include <dnnl.h>
#include <dnnl_debug.h>

#define ARENA_ALIGN 64

/* A buffer: a graph value, or a temporary that holds one value in another
 * layout for one step. */
typedef struct {
    dnnl_memory_desc_t md; /* at max batch */
    bool batched;
    bool decided;
    float *data;        /* constants: the bytes (graph-owned or own_data) */
    float *own_data;    /* constants reordered into a chosen layout */
    int first, last;    /* liveness in steps; first = -2: not in the arena */
    int64_t batch_mult; /* batched: dims[0] is batch * batch_mult */
    int alias;          /* a view of that buffer's bytes (another rank), or -1 */
    size_t offset;      /* in the arena */
    bool lazy_ref;      /* a constant read by a batch size made at its first run */
} cpu_buf_t;

typedef struct {
    dnnl_primitive_t prim; /* NULL: a C kernel (pad, slice) for step */
    dnnl_exec_arg_t *args; /* owned; a concat has one per input */
    int n_args;
    int step;
} cpu_item_t;

/* How a batch size's last runs went each way the pool can run them
 * (backend_cpu.c, wk__cpu_way_pick): its threads sleeping between
 * regions, spinning, or the leader alone. */
#define WAY_RING 8
enum { WAY_SLEEP, WAY_SPIN, WAY_ALONE, N_WAYS };
typedef struct {
    int64_t ns[N_WAYS][WAY_RING]; /* run times, a ring each way */
    unsigned n[N_WAYS];           /* runs each way so far */
    unsigned runs;
    int confirm; /* 1 + the way whose last look beat every other way, run again to
                    confirm it; 0: none */
} cpu_ways_t;

typedef struct {
    cpu_item_t *items;
    int n, cap;
    cpu_ways_t ways;
} cpu_list_t;

/* What phase 1 decided for a step, for phase 2 to reuse. */
typedef struct {
    int tmp_src;     /* buffer the main input is reordered into first, or -1 */
    int tmp_in[4];   /* plain copies of further inputs, or -1 */
    int weights;     /* conv/gemm weights buffer (reordered constant), or -1 */
    int bias;        /* buffer of the bias / scale constants, or -1 */
    int extra;       /* second constant (batchnorm shift), or -1 */
    int dw_wei;      /* conv with a WK_POST_DW: the depthwise weights and bias, */
    int dw_bias;     /* reordered for the fused kernel; or -1 */
    int *dw_alt;     /* NULL, or [max_batch + 1]: the depthwise weights for batch sizes
                        whose fused kernel wants another layout (-1: dw_wei) */
    bool inplace;    /* conv: sums into its residual's buffer, no copy */
    int *wei_alt;    /* conv: [max_batch + 1], the weights buffer for batch sizes whose
                        fast kernel wants another layout than the shared one (-1: shared);
                        NULL when every size takes the shared one */
    bool wino;       /* conv: Winograd at max batch (layouts chosen for it) */
    int8_t *wino_at; /* conv: [max_batch + 1], per batch size whether it runs Winograd
                        (NULL: as `wino` says, for every size) */
    /* conv: the source layout its kernel was chosen for. A buffer oneDNN
     * calls equal (the same bytes: abcd and acdb of a 1x1 map) is read in
     * place, but the kernel is made for this layout, not the buffer's: one
     * made for the buffer's can be oneDNN's reference code. */
    dnnl_memory_desc_t src_md;
    int *cat_tmp;             /* concat: [n_in], each input's copy in the concat's layout, or -1;
                                 NULL when the inputs are read as they are */
    struct cpu_sqconv *sqc;   /* conv: run by squish's own kernel (backend_cpu_sqconv.c), or NULL */
    struct cpu_catnorm *catn; /* concat: writes the BatchNorm after it in the same pass
                                 (backend_cpu_move.c), or NULL */
} cpu_step_t;

typedef struct {
    dnnl_engine_t engine;
    dnnl_stream_t stream;
    cpu_buf_t *bufs;
    int n_bufs, cap_bufs;
    cpu_step_t *steps;
    cpu_list_t *lists;       /* [max_batch + 1]: per batch, the items in order */
    dnnl_memory_t *mems;     /* [n_bufs * (max_batch + 1)], created lazily */
    dnnl_memory_t *out_user; /* [n_outputs * (max_batch + 1)]: user-pointer outputs */
    dnnl_primitive_t *out_reorder;
    dnnl_memory_t *out_scratch; /* [n_outputs * (max_batch + 1)]: their scratchpads, or NULL */
    /* Scratchpads are the plan's own (wk__cpu_scratch_of): every
     * primitive is created with sp_attr, and its scratchpad object points
     * into `scratch`, sized for the largest. */
    dnnl_primitive_attr_t sp_attr;
    dnnl_memory_t *scratch_mems;
    int n_scratch, cap_scratch;
    size_t scratch_bytes;
    void *scratch;
    char *arena;
    size_t arena_bytes;
    /* The arena and scratchpad are a wk_arena_t's (cpu_arena_use), not
     * the plan's own: release leaves them. */
    bool shared;
    int ran_batch; /* the largest batch run so far (cpu_resident) */
    int phase;
    /* Phase 2 makes the kernels of batch sizes 1..opts.ready_batch; for
     * the others it only sizes the scratchpad (dry), and a size's kernels
     * are made at its first run (late). ready[b]: size b's are made. */
    bool dry, late;
    bool *ready;
    /* At max batch: the kernels that are oneDNN's reference code (slow by
     * orders of magnitude; each is logged), and the reorders of
     * activations between steps (inputs' and outputs' included). */
    int n_ref_kernels, n_reorders;
} cpu_be_t;

#define DN(call)                                                                                   \
    do {                                                                                           \
        dnnl_status_t st_ = (call);                                                                \
        if (st_ != dnnl_success) {                                                                 \
            rc =                                                                                   \
                wk_fail(plan, SQ_UNSUPPORTED_MODEL, "oneDNN %s: %s", #call, dnnl_status2str(st_)); \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

/* ---- backend_cpu_buf.c: buffers and layouts ------------------------------ */

void wk__cpu_plain_md(dnnl_memory_desc_t *md, int ndim, const int64_t *dims);

/* The layout at batch b: the batch is the outermost dimension, so only
 * dims[0] changes. */
dnnl_memory_desc_t wk__cpu_md_at(const cpu_buf_t *b, int batch);

/* Whether md keeps the batch outermost and unblocked (so that md_at holds). */
bool wk__cpu_batch_outermost(const dnnl_memory_desc_t *md);

int wk__cpu_add_buf(cpu_be_t *be, const dnnl_memory_desc_t *md, bool batched, int first, int last);

/* The buffer that owns the bytes of id (following views). */
int wk__cpu_root_buf(cpu_be_t *be, int id);

void *wk__cpu_buf_ptr(cpu_be_t *be, int id);

/* The memory object of buffer id at batch; created once. */
dnnl_memory_t wk__cpu_mem_of(wk_plan_t *plan, int id, int batch);

void wk__cpu_push_item(cpu_be_t *be, int batch, const cpu_item_t *it);

/* The scratchpad memory object pd's primitive runs with (*out NULL: it
 * needs none), pointing into the plan's one scratchpad. */
/* A dry pass: the plan's scratchpad grows to what pd's primitive wants. */
void wk__cpu_scratch_grow(cpu_be_t *be, const_dnnl_primitive_desc_t pd);
dnnl_status_t wk__cpu_scratch_of(cpu_be_t *be, const_dnnl_primitive_desc_t pd, dnnl_memory_t *out);

/* Creates the primitive of pd and queues it with args at batch (phase 2);
 * destroys pd in either phase. */
int wk__cpu_emit(wk_plan_t *plan, dnnl_primitive_desc_t pd, int batch, int step,
                 const int *arg_kinds, const int *arg_bufs, int n_args);

/* Queues a reorder of buffer src into buffer dst (same dims). */
int wk__cpu_emit_reorder(wk_plan_t *plan, int batch, int step, int src, int dst);

/* Buffer id of a graph value: buffers 0..n_values-1 are the values. */
int wk__cpu_vbuf(int value);

/* Reorders constant bytes src (layout smd) into a new buffer of layout dmd,
 * once, at plan time. Returns the buffer id or a negative SQ_* code. */
int wk__cpu_const_reorder(wk_plan_t *plan, const dnnl_memory_desc_t *smd, void *src,
                          const dnnl_memory_desc_t *dmd);

/* Buffer id's own constant bytes, given up for the same bytes of the
 * model's plan for small batches where it holds them (they then serve
 * both plans). */
void wk__cpu_share_twin(wk_plan_t *plan, int id);

/* Returns a buffer holding value v's data in layout want for step si: v's
 * own buffer when it already has that layout, else a temporary filled by a
 * reorder (queued in phase 2; for constants done once now). *tmp remembers
 * the temporary across phases, so phase 2 passes want = NULL. */
int wk__cpu_as_layout(wk_plan_t *plan, int si, int batch, int v, const dnnl_memory_desc_t *want,
                      int *tmp);

/* A view of buffer id with the bytes seen as md (same size, plain). */
int wk__cpu_view_buf(cpu_be_t *be, int id, const dnnl_memory_desc_t *md, bool batched);

int wk__cpu_as_plain(wk_plan_t *plan, int si, int batch, int v, int *tmp);

void wk__cpu_set_out_md(wk_plan_t *plan, int v, const dnnl_memory_desc_t *md);

void wk__cpu_set_out_plain(wk_plan_t *plan, int v);

dnnl_alg_kind_t wk__cpu_act_alg(wk_act_kind_t k);

/* oneDNN's alpha and beta for activation a (pow: 1 and the exponent). */
void wk__cpu_act_params(wk_act_t a, float *alpha, float *beta);
void wk__cpu_append_act(dnnl_post_ops_t po, wk_act_t a);
/* Whether a BatchNorm step applies activation kind as a post-op. */
bool wk__cpu_norm_act(wk_act_kind_t kind);

dnnl_alg_kind_t wk__cpu_bin_alg(wk_binop_t op);

/* Whether oneDNN fell back to its reference (unoptimized) kernel for pd. */
bool wk__cpu_impl_is_ref(const_dnnl_primitive_desc_t pd);

/* The plain layout of value v at batch seen with `ndim` dims (leading 1s
 * added). */
dnnl_memory_desc_t wk__cpu_plain_ranked(const wk_value_t *v, int batch, int ndim);

/* A plain 2-D or n-D view over buffer id, scaled with the batch through
 * batch_mult when its first dim is batch * something. */
int wk__cpu_plain_view(cpu_be_t *be, int id, int ndim, const int64_t *dims_max, bool batched,
                       int64_t batch_mult);

/* ---- backend_cpu.c: the way a graph runs --------------------------------- */

/* The way (WAY_SLEEP, WAY_SPIN, WAY_ALONE) the next run of the list that s
 * belongs to takes (see backend_cpu.c); then note how long it took. */
int wk__cpu_way_pick(cpu_ways_t *s);
void wk__cpu_way_note(cpu_ways_t *s, int way, int64_t ns);

/* ---- the op builders, by concern ---------------------------------------- */

/* Each runs in both planning phases for step si: phase 1 (at max batch)
 * decides layouts and temporaries, phase 2 creates the primitive for
 * `batch` and queues it. Returns 0 or a negative SQ_* code (why in
 * plan->why). */

/* backend_cpu_conv.c: convolutions and pooling */
int wk__cpu_build_conv(wk_plan_t *plan, int si, int batch);
int wk__cpu_build_pool(wk_plan_t *plan, int si, int batch);
/* ConvTranspose on oneDNN's deconvolution (plain source and output). */
int wk__cpu_build_deconv(wk_plan_t *plan, int si, int batch);
/* Resize on oneDNN's resampling where it computes what ONNX asks exactly
 * (bilinear with half-pixel coordinates, nearest by whole factors), else
 * the C kernel wk__cpu_run_resize (bicubic always). */
int wk__cpu_build_resize(wk_plan_t *plan, int si, int batch);

/* The batch size from which the plan of g would run Winograd convs, so
 * that smaller batches are better off in a plan of their own; 0 when none
 * would (the backend's split_batch). */
int wk__cpu_split_batch(const wk_graph_t *g);

/* The channel blocks that 1x1 convs with a fused depthwise conv run on:
 * nChw16c where oneDNN runs AVX-512 kernels, else nChw8c (its AVX2
 * kernels' width). */
dnnl_format_tag_t wk__cpu_dw_block(void);

/* What backend_cpu_dwfuse.c makes its trial convs with, as the conv
 * builder makes them: the primitive descriptor of conv s (Winograd or
 * direct), whether one just made is fast (made, and not oneDNN's
 * reference kernel), the post-ops of s in order, the tensor between a
 * fused 1x1 (input x) and its depthwise conv (output y) at batch n, and
 * whether value v is written by a conv with a fused depthwise conv. */
dnnl_status_t wk__cpu_conv_pd(dnnl_primitive_desc_t *pd, const wk_step_t *s, bool wino,
                              const dnnl_memory_desc_t *src, const dnnl_memory_desc_t *wei,
                              const dnnl_memory_desc_t *bias, const dnnl_memory_desc_t *dst,
                              const_dnnl_primitive_attr_t attr, dnnl_engine_t engine);
bool wk__cpu_pd_fast(dnnl_status_t st, const dnnl_primitive_desc_t *p);
/* A conv's residual (its ADD post-op): summed in place where the
 * residual's buffer dies at the conv in the output's layout dst (phase 1),
 * else copied into the output before the conv runs (phase 2). */
void wk__cpu_conv_sum_in_place(wk_plan_t *plan, int si, const dnnl_memory_desc_t *dst);
int wk__cpu_conv_residual_first(wk_plan_t *plan, int si, int batch);
dnnl_status_t wk__cpu_conv_post_ops(dnnl_post_ops_t po, const wk_step_t *s);
void wk__cpu_dw_mid_md(dnnl_memory_desc_t *md, int64_t n, const wk_value_t *x, const wk_value_t *y);
bool wk__cpu_written_fused(const wk_graph_t *g, int v);

/* backend_cpu_sqconv.c: squish's own direct conv on AVX2 CPUs (8-channel
 * blocks in and out). take: whether step si runs on it (phase 1, its
 * input's layout decided: where it fits and times faster than oneDNN's;
 * then be->steps[si].sqc is set); build: its builder in both phases; run:
 * one run at batch; free: what the step's plan holds of it. */
bool wk__cpu_sqconv_take(wk_plan_t *plan, int si);
/* The conv builder of the ops table: this kernel's where it takes the
 * step, else oneDNN's (wk__cpu_build_conv). */
int wk__cpu_build_any_conv(wk_plan_t *plan, int si, int batch);
int wk__cpu_build_sqconv(wk_plan_t *plan, int si, int batch);
void wk__cpu_run_sqconv(cpu_be_t *be, const wk_step_t *s, const cpu_step_t *cs, int batch);
void wk__cpu_sqconv_free(cpu_step_t *cs);

/* backend_cpu_dwfuse.c: whether depthwise conv dw goes into 1x1 conv pw
 * as a post-op (the backend's conv_dw), timed both ways. */
bool wk__cpu_conv_dw(const wk_graph_t *g, const wk_step_t *pw, const wk_step_t *dw);

/* backend_cpu_elem.c: activations; binary ops and batchnorm */
int wk__cpu_build_eltwise(wk_plan_t *plan, int si, int batch);
int wk__cpu_build_binary(wk_plan_t *plan, int si, int batch);

/* backend_cpu_matmul.c: Gemm and MatMul */
int wk__cpu_build_gemm(wk_plan_t *plan, int si, int batch);
int wk__cpu_build_matmul(wk_plan_t *plan, int si, int batch);

/* backend_cpu_norm.c: softmax, ReduceMean, layer normalization */
int wk__cpu_build_softmax(wk_plan_t *plan, int si, int batch);
int wk__cpu_build_reduce(wk_plan_t *plan, int si, int batch);
int wk__cpu_build_layernorm(wk_plan_t *plan, int si, int batch);

/* backend_cpu_move.c: concat, reshape copies, transposes */
/* A BatchNorm step that the concat before it applies (cpu_step_t.catn):
 * nothing of its own to build. */
bool wk__cpu_norm_by_concat(wk_plan_t *plan, int si);
/* The buffer concat step s reads its input i from: the input's copy in
 * the concat's layout (cs->cat_tmp), or the input itself. */
int wk__cpu_concat_src(const cpu_step_t *cs, const wk_step_t *s, int i);
/* Runs concat step s and the BatchNorm it applies. */
void wk__cpu_run_catnorm(cpu_be_t *be, const wk_step_t *s, const cpu_step_t *cs, int batch);
/* Frees cs->catn. */
void wk__cpu_catnorm_free(cpu_step_t *cs);
int wk__cpu_build_concat(wk_plan_t *plan, int si, int batch);
int wk__cpu_build_copy(wk_plan_t *plan, int si, int batch);
int wk__cpu_build_transpose(wk_plan_t *plan, int si, int batch);

/* backend_cpu_ckern.c: the kernels in plain C over plain buffers. The
 * builder queues an item without a primitive; the run_c of the kind runs
 * it, from src (x at batch) into dst (y at batch). */
int wk__cpu_build_c_kernel(wk_plan_t *plan, int si, int batch);
void wk__cpu_run_pad(const wk_step_t *s, const wk_value_t *x, const wk_value_t *y, int batch,
                     const float *src, float *dst);
void wk__cpu_run_slice(const wk_step_t *s, const wk_value_t *x, const wk_value_t *y, int batch,
                       const float *src, float *dst);
void wk__cpu_run_erf(const wk_step_t *s, const wk_value_t *x, const wk_value_t *y, int batch,
                     const float *src, float *dst);
void wk__cpu_run_expand(const wk_step_t *s, const wk_value_t *x, const wk_value_t *y, int batch,
                        const float *src, float *dst);
void wk__cpu_run_resize(const wk_step_t *s, const wk_value_t *x, const wk_value_t *y, int batch,
                        const float *src, float *dst);

/* ---- backend_cpu_ops.c: the table of op builders ------------------------- */

/* What the backend does for one kernel kind: build (above) and run_c, for
 * kernels done in plain C over plain buffers (Pad, Slice, Erf, Expand, and
 * Resize where oneDNN does not compute it; their
 * queued item has no primitive), which runs the step; NULL for the others. */
typedef struct {
    int (*build)(wk_plan_t *plan, int si, int batch);
    void (*run_c)(const wk_step_t *s, const wk_value_t *x, const wk_value_t *y, int batch,
                  const float *src, float *dst);
} wk_cpu_op_t;

/* Indexed by wk_kernel_t, WK_K_COUNT_ entries. */
extern const wk_cpu_op_t wk__cpu_ops[];

#endif
