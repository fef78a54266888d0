/* worker/ execution engine: runs a model graph on one device.
 *
 * A plan is made once per (model, max batch): the graph is lowered (BatchNorm
 * folded into Conv, activations and residual adds fused into Conv), the
 * backend creates its primitives for every batch size 1..max_batch, and one
 * arena of buffers is planned by liveness. Running a batch then allocates
 * nothing. Backends (cpu on oneDNN, cuda on cuDNN + cuBLAS, emulated) sit
 * behind one vtable; the model graph never depends on the backend.
 *
 * A plan is used by one thread at a time. Errors are negative SQ_* codes;
 * their detail text is on the plan (wk_plan_errmsg), or in the caller's `why`
 * buffer when no plan could be made. */
#ifndef WK_EXEC_H
#define WK_EXEC_H

#include <sq_device.h>
#include <stddef.h>
#include <stdint.h>

/* Whether this build has the backend (cuda only with the CUDA libraries). */
int wk_backend_built(sq_dev_kind_t kind);

/* How the uint8 HWC pixels of the JPEG path become the model's FP32 input
 * (NCHW planes, or interleaved for an NHWC input): x = (pixel / 255 -
 * mean[c]) / std[c], channels taken in RGB order, or BGR when channels_bgr
 * is set (the pixels always arrive as RGB). */
typedef struct {
    float mean[3];
    float std[3];
    int channels_bgr;
} wk_pixel_norm_t;

/* ImageNet's mean and std, RGB order: the torchvision convention. */
#define WK_PIXEL_NORM_IMAGENET                                                                     \
    ((wk_pixel_norm_t){.mean = {0.485f, 0.456f, 0.406f}, .std = {0.229f, 0.224f, 0.225f}})

/* Arithmetic a plan runs in. FP32 is exact IEEE single precision (on cuda:
 * FMA math, no tensor-core rounding); TF32 lets convolutions and GEMMs
 * round their inputs to 10-bit mantissas on tensor cores (accumulating in
 * FP32, tensors stay FP32); FP16 and BF16 store activations and weights in
 * 16 bits (NHWC on cuda, so tensor cores take the convolutions) and
 * accumulate in FP32. A backend that lacks a precision runs the nearest it
 * has, and says which (wk_plan_precision). */
typedef enum {
    WK_PRECISION_FP32 = 0,
    WK_PRECISION_TF32,
    WK_PRECISION_FP16,
    WK_PRECISION_BF16,
    WK_PRECISION_COUNT_
} wk_precision_t;

/* "fp32", "tf32", "fp16", "bf16"; NULL for a value out of range. */
const char *wk_precision_name(wk_precision_t p);
/* The precision of a name above; -1 for any other string. */
int wk_precision_parse(const char *name);

typedef struct {
    sq_dev_kind_t backend;
    /* asked for; the plan may run another (wk_plan_precision) */
    wk_precision_t precision;
    int device_index; /* cuda:N */
    int max_batch;    /* >= 1; ignored (taken as 1) for graphs without a batch dimension */
    int threads;      /* cpu: worker threads for the kernels; 0 = every core */
    /* cpu: the batch sizes made ready at plan creation, 1..ready_batch
     * (0: every size up to max_batch). A larger size gets its kernels at
     * its first run: each size's kernels are JIT code (densenet121: 19 MB
     * and 140 ms a size), and a model served at the batch sizes its
     * profile reaches never runs the others. */
    int ready_batch;
    /* > 0: bind the graph's symbolic batch to this size and run the graph
     * as static (one "item" is the whole batch; max_batch becomes 1). For
     * graphs whose batch does not stay the outermost dimension. */
    int64_t static_batch;
    wk_pixel_norm_t pixel_norm;
    /* emulated: l(b) in microseconds for b = 1..n_latency (n_latency >= max_batch);
     * copied by the plan */
    const int64_t *emu_latency_us;
    int emu_n_latency;
    /* emulated detector (wk_plan_create_emulated): emu_det_slots > 0 makes
     * outputs "boxes" [N, K, 4] and "scores" [N, K] with K = emu_det_slots,
     * and each item a Poisson(emu_det_mean) count of detections. */
    int emu_det_slots;
    double emu_det_mean;
} wk_plan_opts_t;

/* Defaults: cpu, max_batch 1, all threads, ImageNet normalization. */
wk_plan_opts_t wk_plan_opts_default(void);

typedef struct wk_plan wk_plan_t;
struct mdb_graph; /* the model graph of modeldb/mdb_graph.h */

/* Makes a plan for graph on opts->backend. Returns 0 and sets *out, or a
 * negative SQ_* code (SQ_UNSUPPORTED_MODEL for ops or attributes the
 * executor cannot run, SQ_DEVICE when the device is unusable, SQ_NOMEM)
 * with the reason in why. The plan copies what it needs from the graph. */
int wk_plan_create(const struct mdb_graph *graph, const wk_plan_opts_t *opts, wk_plan_t **out,
                   char *why, int why_size);

/* An emulated model without a graph (uploaded as a profile): one input of
 * in_shape and one output of out_classes floats per item; or, for an
 * emulated detector (opts->emu_det_slots > 0), the outputs "boxes" and
 * "scores" of K slots, where out_classes must be 5 K. */
int wk_plan_create_emulated(const int64_t in_chw[3], int64_t out_classes,
                            const wk_plan_opts_t *opts, wk_plan_t **out, char *why, int why_size);

/* Accepts NULL. */
void wk_plan_free(wk_plan_t *plan);
const char *wk_plan_errmsg(const wk_plan_t *plan);
int wk_plan_max_batch(const wk_plan_t *plan);
sq_dev_kind_t wk_plan_backend(const wk_plan_t *plan);
/* The precision the plan runs in: opts.precision where the backend has it,
 * else the nearest it has (the cpu and emu backends: FP32). */
wk_precision_t wk_plan_precision(const wk_plan_t *plan);
/* Bytes of device memory the plan holds: its weights and staging, and of
 * its arena and scratchpad the bytes resident now (cpu: measured, so it
 * grows with the largest batch run; in a shared arena, those of the
 * plan's own extent, which other plans' runs may touch too). */
uint64_t wk_plan_memory_bytes(const wk_plan_t *plan);
/* The batch sizes whose kernels the plan holds now (cpu: those made at
 * creation, 1..ready_batch, and every size run since; other backends:
 * every size up to max_batch). */
int wk_plan_sizes_ready(const wk_plan_t *plan);
/* Gives back the kernels of the batch sizes past upto (cpu: a size runs
 * again by making them anew, as a size past ready_batch does; other
 * backends keep theirs): a worker calls it once the model's profile says
 * which sizes it reaches. */
void wk_plan_keep_sizes(wk_plan_t *plan, int upto);

/* One arena of activations and one scratchpad that the plans of a device
 * share: a device runs one batch at a time, so the models it holds need
 * the largest plan's arena between them, not one each. Every plan in it
 * must run on one thread (the one that joins it, and frees it), one batch
 * at a time; a plan made on another thread (a loader) runs in its own
 * arena until it joins. cpu plans join; others keep their own. */
typedef struct wk_arena wk_arena_t;
wk_arena_t *wk_arena_new(void);
/* Once every plan in it is freed. Accepts NULL. */
void wk_arena_free(wk_arena_t *a);
/* Moves plan (and its sub-plans) into a, which grows to the largest; its
 * own arena is given back. A failure (SQ_NOMEM; why says) leaves the plan
 * in the arena it had. Call between runs, on the thread that runs them. */
int wk_plan_share_arena(wk_plan_t *plan, wk_arena_t *a, char *why, int why_size);
/* Bytes mapped (the largest plan's arena and scratchpad), and resident
 * now (measured). */
uint64_t wk_arena_bytes(const wk_arena_t *a);
uint64_t wk_arena_resident_bytes(const wk_arena_t *a);
/* Plans running in it (a plan with a separate plan for small batches
 * counts as two). */
int wk_arena_n_plans(const wk_arena_t *a);

int wk_plan_n_inputs(const wk_plan_t *plan);
int wk_plan_n_outputs(const wk_plan_t *plan);
/* Shape of one item (batch dimension left out when the graph has one):
 * returns the rank and fills dims (up to 8). */
int wk_plan_input_shape(const wk_plan_t *plan, int index, int64_t dims[8]);
int wk_plan_output_shape(const wk_plan_t *plan, int index, int64_t dims[8]);
/* Elements of one item of input/output `index`. */
int64_t wk_plan_input_elems(const wk_plan_t *plan, int index);
int64_t wk_plan_output_elems(const wk_plan_t *plan, int index);

/* Floats of one item's row: every output's item elements, in the graph's
 * output order (output i starts after the elements of outputs 0..i-1). */
int64_t wk_plan_row_elems(const wk_plan_t *plan);

/* Whether the plan takes images: one input of [N,3,H,W] (NCHW) or
 * [N,H,W,3] (NHWC: dims[3] == 3 and dims[1] != 3); sets H, W and the layout
 * (each may be NULL). */
int wk_plan_image_input(const wk_plan_t *plan, int *h, int *w, int *nhwc);

/* Runs a batch of uint8 HWC pixels (RGB, batch * H * W * 3 bytes, H and W
 * the model input's) through a model that takes images (above): normalized
 * per the plan's pixel_norm, laid out, run; item b's row (every output,
 * wk_plan_row_elems floats) goes to out + b * row_elems. 1 <= batch <=
 * max_batch. */
int wk_plan_run_pixels(wk_plan_t *plan, int batch, const uint8_t *pixels, float *out);

/* Runs a batch of a one-input model's rows given as UINT8 (batch *
 * input_elems(0) bytes), each byte the FP32 value it holds; rows as for
 * wk_plan_run_pixels. A backend that can casts them on its device. */
int wk_plan_run_u8(wk_plan_t *plan, int batch, const uint8_t *bytes, float *out);

/* Runs a batch of the model's own FP32 tensors: inputs[i] holds batch *
 * input_elems(i) floats, outputs[i] receives batch * output_elems(i). */
int wk_plan_run(wk_plan_t *plan, int batch, const float *const *inputs, float *const *outputs);

/* The same, with every output going to its item's row as for
 * wk_plan_run_pixels: item b's row at out + b * wk_plan_row_elems. */
int wk_plan_run_rows(wk_plan_t *plan, int batch, const float *const *inputs, float *out);

/* Nanoseconds the last run spent in the backend (excluding normalization). */
int64_t wk_plan_last_run_ns(const wk_plan_t *plan);

/* ---- prefix groups ---------------------------------------------------------
 * Models that share their first layers (the model DB finds them by content
 * hashes) run as one group: the shared prefix once, on the mixed batch of
 * every member's rows, then each member's suffix on its own rows, reading
 * them in place from the prefix's output. Memory: one prefix and n
 * suffixes. */
typedef struct wk_group wk_group_t;

/* Lowers each member graph, cuts it at the tensor cuts[i] (its name in that
 * graph), checks that every member's part before the cut equals member 0's
 * (same layers, same weights) and plans member 0's prefix once and every
 * suffix, all at opts->max_batch. Returns 0 and sets *out, or a negative
 * SQ_* code with the reason in why (SQ_BAD_MODEL: not a cut, or prefixes
 * that differ). Not for the emu backend. */
int wk_group_create(const struct mdb_graph *const *graphs, const char *const *cuts, int n,
                    const wk_plan_opts_t *opts, wk_group_t **out, char *why, int why_size);
/* Accepts NULL. */
void wk_group_free(wk_group_t *grp);
int wk_group_n_members(const wk_group_t *grp);
int wk_group_max_batch(const wk_group_t *grp);
/* The prefix plan: its input shape is every member's. */
const wk_plan_t *wk_group_prefix(const wk_group_t *grp);
/* Floats of output 0 per row of member's suffix; -1 for a bad member. */
int64_t wk_group_output_elems(const wk_group_t *grp, int member);
uint64_t wk_group_memory_bytes(const wk_group_t *grp);
/* The prefix and every suffix move into a (wk_plan_share_arena): they run
 * one after the other, the prefix's output in the group's own buffer, so
 * they need the largest one's arena, not one each. A failure (why says)
 * leaves the plans not moved in the arenas they had. */
int wk_group_share_arena(wk_group_t *grp, wk_arena_t *a, char *why, int why_size);
/* wk_plan_keep_sizes on the prefix and every suffix. */
void wk_group_keep_sizes(wk_group_t *grp, int upto);
/* The prefix's wk_plan_sizes_ready. */
int wk_group_sizes_ready(const wk_group_t *grp);
int64_t wk_group_last_run_ns(const wk_group_t *grp);
const char *wk_group_errmsg(const wk_group_t *grp);

/* Runs a mixed batch: row b belongs to member[b]. Rows of one member should
 * be adjacent (each run of equal members is one suffix call; any order is
 * correct). Row b's output goes to out + b * out_stride (floats; out_stride
 * >= every member's output_elems). Pixels as for wk_plan_run_pixels, or the
 * model's FP32 input tensors, batch * input_elems floats. */
int wk_group_run_pixels(wk_group_t *grp, int batch, const uint8_t *pixels, const int *member,
                        float *out, size_t out_stride);
int wk_group_run(wk_group_t *grp, int batch, const float *input, const int *member, float *out,
                 size_t out_stride);

#endif
