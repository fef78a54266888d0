/* Internals of the execution engine, shared by exec.c, plan.c and the
 * backends. Not part of the worker's public face.
 *
 * The lowered graph (wk_graph_t) is the executable form of a model graph:
 * kernels that a backend runs, values with shapes at max batch, constants
 * owned by the graph. It is built from modeldb's graph IR (lower.c) or by
 * hand in tests, then simplified by the fusion passes (plan.c). */
#ifndef WK_EXEC_INT_H
#define WK_EXEC_INT_H

#include "wk_acts.h"
#include "wk_exec.h"

#include <sq_config.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define WK_MAX_DIMS 8
#define WK_MAX_POST 4
#define WK_MAX_SPATIAL 3

/* X(ENUM, name): the kernels a backend runs, one line each; the enum and
 * the name table (names.c) come from it. A new kind needs its entry in each
 * backend's table (backend_cpu_ops.c: wk__cpu_ops; backend_cuda_ops.c:
 * cuda_kernels), whose count asserts fail until it has them. */
#define WK_KERNELS(X)                                                                              \
    X(CONV, "conv")               /* in: X, W (const), [B (const)]; fused post-ops */              \
    X(MAXPOOL, "maxpool")         /* in: X */                                                      \
    X(AVGPOOL, "avgpool")         /* in: X; count_include_pad */                                   \
    X(GLOBALAVG, "globalavgpool") /* in: X; mean over every spatial dim */                         \
    X(ELTWISE, "eltwise")         /* in: X; act */                                                 \
    X(BINARY, "binary")           /* in: A, B (numpy broadcast) */                                 \
    X(BATCHNORM, "batchnorm")     /* in: X, scale[C] (const), shift[C] (const) */                  \
    X(CONCAT, "concat")           /* in: X0..Xn; axis */                                           \
    X(SOFTMAX, "softmax")         /* in: X; axis (coerced to 2D for opset < 13) */                 \
    X(GEMM, "gemm")               /* in: A, B, [C]; trans_a, trans_b, alpha, beta */               \
    X(MATMUL, "matmul")           /* in: A, B (numpy batched) */                                   \
    X(REDUCE_MEAN, "reducemean")  /* in: X; reduced axes; output shape may drop them */            \
    X(COPY, "copy")               /* in: X; same elements, new shape (Reshape, Flatten...) */      \
    X(TRANSPOSE, "transpose")     /* in: X; perm */                                                \
    X(PAD, "pad")                 /* in: X; pads, mode, value */                                   \
    X(SLICE, "slice")             /* in: X; starts, steps per dim (output shape gives count) */    \
    X(ERF, "erf")                 /* in: X; erf(x) elementwise */                                  \
    X(EXPAND, "expand")           /* in: X; broadcast to the output's shape (numpy rules) */       \
    X(LAYERNORM, "layernorm")     /* in: X, [scale[C], shift[C] (const)]; over the last axis */    \
    X(RESIZE, "resize")           /* in: X (NCHW); H and W resized: nearest, bilinear, bicubic */  \
    X(DECONV, "deconv")           /* in: X, W [IC, OC, kh, kw] (const), [B (const)]; p.conv */

typedef enum {
#define WK_K_ENUM_(e, name) WK_K_##e,
    WK_KERNELS(WK_K_ENUM_)
#undef WK_K_ENUM_
        WK_K_COUNT_
} wk_kernel_t;

extern const char *const wk_kernel_names[WK_K_COUNT_];

typedef enum {
#define WK_ACT_ENUM_(e, name) WK_ACT_##e,
    WK_ACTS(WK_ACT_ENUM_)
#undef WK_ACT_ENUM_
        WK_ACT_COUNT_
} wk_act_kind_t;

extern const char *const wk_act_names[WK_ACT_COUNT_];

typedef struct {
    wk_act_kind_t kind;
    float alpha, beta;
} wk_act_t;

/* Inputs of one concat step: oneDNN numbers a concat's sources from
 * DNNL_ARG_MULTIPLE_SRC, 1024 ids below DNNL_ARG_MULTIPLE_DST. The lowering
 * splits a longer Concat into steps of this many. */
#define WK_MAX_CONCAT_SOURCES 1024

typedef enum { WK_BIN_ADD, WK_BIN_SUB, WK_BIN_MUL, WK_BIN_DIV, WK_BIN_COUNT_ } wk_binop_t;

/* A post-op fused into a conv: an activation, the addition of another
 * value of the conv output's shape (a residual), or a depthwise 3x3 conv
 * (pad 1) of the conv's output, whose own activations follow it (only
 * after a 1x1 conv, only where the backend asks for it: wk_graph_fuse_dw). */
typedef struct {
    enum { WK_POST_ACT, WK_POST_ADD, WK_POST_DW } kind;
    wk_act_t act;
    int value;  /* ADD: the addend; DW: the depthwise weights [C, 1, 3, 3] (a constant) */
    int bias;   /* DW: its bias [C] (a constant) */
    int stride; /* DW: 1 or 2 */
} wk_post_t;

typedef enum { WK_PAD_CONSTANT, WK_PAD_REFLECT, WK_PAD_EDGE } wk_pad_mode_t;

/* Resize: ONNX's coordinate transforms (output x to input coordinate) and
 * nearest-pixel roundings. */
typedef enum {
    WK_RESIZE_HALF_PIXEL,         /* (x + 0.5) / scale - 0.5 */
    WK_RESIZE_PYTORCH_HALF_PIXEL, /* the same, 0 for an output of one pixel */
    WK_RESIZE_ALIGN_CORNERS,      /* x (in - 1) / (out - 1) */
    WK_RESIZE_ASYMMETRIC,         /* x / scale */
} wk_resize_coord_t;
typedef enum {
    WK_NEAREST_ROUND_PREFER_FLOOR,
    WK_NEAREST_ROUND_PREFER_CEIL,
    WK_NEAREST_FLOOR,
    WK_NEAREST_CEIL,
} wk_resize_nearest_t;

typedef struct {
    wk_kernel_t kind;
    int *in; /* value ids; -1 for an optional input left out */
    int n_in;
    int out;
    union {
        struct {
            int n_spatial;
            int64_t kernel[WK_MAX_SPATIAL], stride[WK_MAX_SPATIAL], dilation[WK_MAX_SPATIAL];
            int64_t pad_begin[WK_MAX_SPATIAL], pad_end[WK_MAX_SPATIAL];
            int64_t groups;
            int count_include_pad;
        } conv; /* conv, deconv and pools; pads already account for ceil_mode and auto_pad
                   (deconv: pad_end less ONNX's output_padding) */
        wk_act_t act;
        wk_binop_t binop;
        int axis;      /* concat, softmax */
        float epsilon; /* layernorm */
        struct {
            int trans_a, trans_b;
            float alpha, beta;
        } gemm;
        struct {
            int64_t axes_mask; /* bit d: dim d reduced */
        } reduce;
        int perm[WK_MAX_DIMS];
        struct {
            int64_t begin[WK_MAX_DIMS], end[WK_MAX_DIMS];
            wk_pad_mode_t mode;
            float value;
        } pad;
        struct {
            int64_t start[WK_MAX_DIMS], step[WK_MAX_DIMS];
        } slice;
        struct {
            bool linear; /* bilinear */
            bool cubic;  /* bicubic (ONNX's cubic: cubic_a, exclude_outside); else nearest */
            bool exclude_outside; /* cubic: taps outside the map weigh 0, the rest rescaled */
            float cubic_a;        /* cubic: ONNX's cubic_coeff_a (torch -0.75, TF -0.5) */
            wk_resize_coord_t coord;
            wk_resize_nearest_t nearest;
            float scale[2]; /* H, W: what the transform divides by */
        } resize;
    } p;
    int legacy_softmax; /* opset < 13: softmax over the dims from axis, flattened */
    wk_post_t post[WK_MAX_POST];
    int n_post;
} wk_step_t;

typedef struct {
    char *name;
    int ndim;
    int64_t dims[WK_MAX_DIMS]; /* at max batch */
    bool batched;              /* dims[0] is the batch and scales with the run */
    float *data;               /* constants: owned, plain row-major; NULL otherwise */
    int producer;              /* step index; -1 for inputs and constants */
    int n_uses;
    int last_use; /* step index; n_steps for graph outputs */
    bool is_input, is_output;
    int alias_of; /* -1; or the value this one is a plain view of */
} wk_value_t;

typedef struct {
    wk_value_t *values;
    int n_values, cap_values;
    wk_step_t *steps;
    int n_steps, cap_steps;
    int *inputs, n_inputs;
    int *outputs, n_outputs;
    int max_batch; /* 1 when no value is batched */
} wk_graph_t;

/* ---- building (plan.c) ---- */
wk_graph_t *wk_graph_new(int max_batch);
void wk_graph_free(wk_graph_t *g);
/* Adds a value; data (n elements of the shape) is copied when not NULL. */
int wk_graph_value(wk_graph_t *g, const char *name, int ndim, const int64_t *dims, bool batched,
                   const float *data);
int wk_graph_input(wk_graph_t *g, const char *name, int ndim, const int64_t *dims, bool batched);
void wk_graph_mark_output(wk_graph_t *g, int value);
/* Appends a step with n_in inputs (copied) writing `out`; returns it for the
 * caller to fill in its parameters. */
wk_step_t *wk_graph_step(wk_graph_t *g, wk_kernel_t kind, const int *in, int n_in, int out);

/* ---- values' shapes (values.c) ---- */
int64_t wk_value_elems(const wk_value_t *v);
/* Elements at run batch `batch`. */
int64_t wk_value_elems_at(const wk_value_t *v, int batch);
/* dims at run batch `batch` into out; returns ndim. */
int wk_value_dims_at(const wk_value_t *v, int batch, int64_t *out);

/* ---- passes (plan.c) ---- */
/* Checks the graph (inputs defined before use, shapes of the conv and gemm
 * operands); recomputes producers, uses and last uses. Returns 0 or
 * SQ_BAD_MODEL with why. */
int wk_graph_finish(wk_graph_t *g, char *why, int why_size);
/* BatchNorm into the preceding Conv, x * sigmoid(x) and x * hardsigmoid(x)
 * into one swish or hardswish step, activations (those conv_act accepts,
 * every one when NULL) and residual adds (after an activation only when
 * add_after_act) into Conv post-ops, and activations after a BatchNorm
 * that stays a step (densenet's, after a concat) into its post-ops where
 * norm_act accepts them (none when NULL), where the
 * intermediate value has no other use. Calls wk_graph_finish. Returns the
 * number of steps removed. */
int wk_graph_fuse(wk_graph_t *g, bool (*conv_act)(wk_act_kind_t kind), bool add_after_act,
                  bool (*norm_act)(wk_act_kind_t kind));

/* After wk_graph_fuse: each depthwise 3x3 conv into the 1x1 conv before it
 * (WK_POST_DW) where conv_dw says yes. Returns the number fused; *before
 * (when not NULL) gets a copy of g as it was, or NULL when none fused. */
int wk_graph_fuse_dw(wk_graph_t *g,
                     bool (*conv_dw)(const wk_graph_t *g, const wk_step_t *pw, const wk_step_t *dw),
                     wk_graph_t **before);

/* The values a post-op reads: an ADD's addend, a DW's weights and bias.
 * Returns how many (at most 2) it wrote to out. */
int wk_post_reads(const wk_post_t *p, int out[2]);

/* ---- buffer planning by liveness (plan.c) ---- */
typedef struct {
    size_t bytes;
    int first, last; /* steps during which the buffer is live, inclusive */
} wk_buf_req_t;

/* Gives each request an offset (aligned to `align`) in one arena so that
 * requests whose lifetimes overlap never share bytes; largest first,
 * lowest free offset. Returns the arena size. */
size_t wk_arena_plan(const wk_buf_req_t *reqs, int n, size_t align, size_t *offsets);

/* Memory for an arena or a scratchpad: zeroed pages mapped as first
 * touched, so that a plan for max batch 64 run at batches up to 7 holds
 * the pages those batches touch, not the whole arena. NULL for 0 bytes or
 * when the mapping fails (errno). */
void *wk__region_alloc(size_t bytes);
/* Accepts NULL. */
void wk__region_free(void *region, size_t bytes);
/* Gives the pages of [from, bytes) back (they read as zeros again). */
void wk__region_trim(void *region, size_t from, size_t bytes);
/* Bytes of the pages of region that hold bytes from..to-1 and are
 * resident (mincore): measured, not planned. */
uint64_t wk__region_resident(const void *region, size_t from, size_t to);
/* The system's page size. */
size_t wk__page_bytes(void);

/* ---- backends ---- */
struct wk_plan {
    int64_t *emu_latency_us; /* owned copy of opts.emu_latency_us (the caller's may go away) */
    /* Batches below min_batch run in `small`, a plan of its own for them
     * (cpu: the layouts that suit small batches differ from those Winograd
     * wants at large ones); min_batch 1 and small NULL otherwise. */
    int min_batch;
    struct wk_plan *small;
    /* A graph whose batch does not stay outermost (mdb_graph_batch_outermost)
     * has no one plan for every batch size: each[s] is a static plan of its
     * own with the batch bound to s, for the n_each sizes s = 1, 2, 4, ...
     * below max_batch and max_batch itself (each[b] NULL for the other b <=
     * max_batch), and this plan only holds them (its graph has the inputs
     * and outputs, no steps). A batch of b runs in the plan of the smallest
     * planned s >= b: its b items copied into in_scratch with the items up
     * to s zeroed, the plan run into out_scratch, and the first b items of
     * each output copied out (the rows past b are padding and never reach
     * the caller). NULL, 0 and NULL otherwise. */
    struct wk_plan **each;
    int n_each;
    float *in_scratch; /* every input at max batch, one after the other */
    float **in_ptrs;   /* input i's start in in_scratch */
    wk_plan_opts_t opts;
    wk_graph_t *graph;
    const struct wk_backend_ops *ops;
    void *be;
    /* The arena this plan runs in with other plans (wk_plan_share_arena),
     * or NULL: its own. */
    struct wk_arena *shared;
    /* Weights, constants and staging the plan holds whatever it runs; its
     * arena and scratchpad are measured (wk_backend_ops_t.resident), and
     * its sub-plans (small, each) counted by wk_plan_memory_bytes. */
    uint64_t memory_bytes;
    int64_t last_run_ns;
    /* Rows (wk_plan_run_rows, wk_plan_run_pixels) of a plan with several
     * outputs: the backend writes each output here (max batch), and each
     * item's slices are copied to its row. NULL with one output, except in
     * a plan holding plans per batch size (each), where a padded batch's
     * outputs land here whatever their number. */
    float *out_scratch;
    float **out_ptrs;
    char why[512];
};

/* How input 0 of a run is made from bytes (wk_backend_ops_t.u8_input):
 * `n` images of h x w RGB pixels, 3 bytes each, normalized into the
 * model's layout (pixels; channel c of the input from byte src_chan[c]:
 * value * scale[c] + bias[c]), or `n` bytes cast to FP32 one for one. */
typedef struct wk_u8_in {
    bool pixels, nhwc;
    int64_t n, h, w;
    int src_chan[3];
    float scale[3], bias[3];
} wk_u8_in_t;

/* The vtable. prepare() makes everything for batch 1..max_batch (errors into
 * plan->why); input_buffer() is the host buffer where exec.c writes input
 * `i` as plain FP32 for the next run; run() executes `batch` and writes each
 * output as plain FP32 to outputs[i]; release() frees the backend state. */
typedef struct wk_backend_ops {
    sq_dev_kind_t kind; /* the devices it runs on */
    int (*prepare)(wk_plan_t *plan);
    float *(*input_buffer)(wk_plan_t *plan, int index);
    int (*run)(wk_plan_t *plan, int batch, float *const *outputs);
    void (*release)(wk_plan_t *plan);
    /* Optional: make the next run at `batch` read input `index` from ptr
     * (plain FP32) instead of input_buffer(), or back again with NULL.
     * Returns 0, or nonzero when the plan cannot read it in place. */
    int (*bind_input)(wk_plan_t *plan, int index, int batch, const float *ptr);
    /* Optional: make the next run read input 0 from uint8 bytes that the
     * backend converts to FP32 itself, on its device (how: wk_u8_in_t).
     * Returns 0, or nonzero where it cannot: exec.c then converts them on
     * the host into input_buffer(). */
    int (*u8_input)(wk_plan_t *plan, const uint8_t *bytes, const struct wk_u8_in *how);
    /* Optional: the batch size from which a plan of g would rather run in
     * other layouts or algorithms than smaller batches do, which then get a
     * plan of their own (wk_plan_t.small); 0 when none would. */
    int (*split_batch)(const wk_graph_t *g);
    /* Optional: whether a conv of this backend applies activation `kind`
     * as a post-op (wk_graph_fuse asks before it fuses one); NULL: every
     * activation. */
    bool (*conv_act)(wk_act_kind_t kind);
    /* Whether a conv of this backend takes a residual add after its
     * activation (conv, act, + x: YOLO's C2f and CSP bottlenecks) as a
     * post-op; false: the add runs as a step of its own there. */
    bool conv_add_after_act;
    /* Optional: whether a BatchNorm step of this backend applies activation
     * `kind` as a post-op (WK_POST_ACT in its post[]); NULL: none, the
     * activation stays a step of its own. */
    bool (*norm_act)(wk_act_kind_t kind);
    /* Optional: whether a conv of this backend takes depthwise conv dw as
     * a post-op of the 1x1 conv pw before it (both already checked to be
     * of the shapes WK_POST_DW allows); NULL: never. */
    bool (*conv_dw)(const wk_graph_t *g, const wk_step_t *pw, const wk_step_t *dw);
    /* Optional: the precision a prepared plan runs in (plan->opts.precision
     * where the backend has it); NULL: FP32 whatever was asked. */
    wk_precision_t (*precision)(const wk_plan_t *plan);
    /* Optional: the batch sizes whose kernels the plan holds
     * (wk_plan_sizes_ready); NULL: every size up to max batch. */
    int (*sizes_ready)(const wk_plan_t *plan);
    /* Optional: gives back the kernels of the sizes past upto
     * (wk_plan_keep_sizes). */
    void (*keep_sizes)(wk_plan_t *plan, int upto);
    /* Optional, with arena_use and resident: the bytes of the plan's arena
     * of activations, and of its scratchpad in *scratch_bytes. */
    size_t (*arena_need)(const wk_plan_t *plan, size_t *scratch_bytes);
    /* Runs the plan in act and scratch (at least arena_need's bytes each;
     * a wk_arena_t's), its own arena and scratchpad given back. Nonzero
     * when a memory object could not be moved (the plan then must not
     * run). */
    int (*arena_use)(wk_plan_t *plan, char *act, void *scratch);
    /* Bytes of the plan's arena and scratchpad that are resident, measured
     * over the plan's own extent (in a shared arena, what its runs touch
     * and others' may have). */
    uint64_t (*resident)(const wk_plan_t *plan);
} wk_backend_ops_t;

extern const wk_backend_ops_t wk_backend_cpu;
extern const wk_backend_ops_t wk_backend_emu;
/* The cuda backend's vtable where the process has it (backend_cuda.c),
 * else NULL (cuda_absent.c). */
const wk_backend_ops_t *wk__cuda_ops(void);

/* A copy of g (after wk_graph_finish) for another max batch. */
wk_graph_t *wk_graph_clone(const wk_graph_t *g, int max_batch);

/* Makes a plan from an already lowered graph (taken over, freed on error).
 * Used by wk_plan_create and by tests that build graphs by hand. */
int wk_plan_from_graph(wk_graph_t *g, const wk_plan_opts_t *opts, wk_plan_t **out, char *why,
                       int why_size);

/* Lowers modeldb's graph IR (lower.c) for the backend of device kind dev,
 * refusing (SQ_UNSUPPORTED_MODEL, the node and the reason in why) what the
 * op table's rules say that backend cannot run. static_batch > 0 binds the
 * symbolic batch to that size and makes every tensor static (max batch 1). */
int wk_lower(const struct mdb_graph *graph, sq_dev_kind_t dev, int max_batch, int64_t static_batch,
             wk_graph_t **out, char *why, int why_size);

/* Whether the lowering has an entry for op (an mdb_op_t): every runtime
 * op must (tests/worker/test_lower.c checks). */
bool wk__op_lowers(int op);

/* wk_plan_run that reads the inputs where they lie when the backend can
 * (bind_input), else copies them in as wk_plan_run does. For the suffixes of
 * a prefix group, which read their rows of the prefix's output. */
int wk__plan_run_inplace(wk_plan_t *plan, int batch, const float *const *inputs,
                         float *const *outputs);

/* printf into plan->why; returns err (values.c, below every file that
 * builds or runs a plan). */
int wk_fail(wk_plan_t *plan, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
