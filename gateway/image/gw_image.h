/* image/: pixels: JPEG decode with DCT scaling, resize into the arena, the
 * preprocess pool, crops, and the decoding of a detector's outputs. */
#ifndef GW_IMAGE_H
#define GW_IMAGE_H

#include "gw_codec.h"

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

/* JPEG preprocessing: the step between an HTTP body and a model input.
 *
 * Two layers:
 * - gw_image_to_rgb(): a pure function (no threads, no clock, fuzzed in
 *   tests/fuzz/fuzz_jpeg.c). It sniffs the format, reads the JPEG header with
 *   libjpeg-turbo's TurboJPEG API, rejects decompression bombs before any
 *   pixel buffer exists, decodes with DCT scaling when the image is at least
 *   twice the model input, and resizes to the model input as uint8 HWC RGB,
 *   written straight into the caller's buffer (a shared-memory slot).
 *   Its state (a TurboJPEG handle and scratch buffers) lives in a
 *   gw_prep_ctx_t: one per thread, never shared.
 * - gw_prep_pool_t: a fixed pool of threads, each with its own context, fed
 *   through a bounded FIFO. Submitting to a full queue fails at once with
 *   SQ_OVERLOAD, so that the HTTP loop never blocks on preprocessing.
 *
 * Errors (sq_error.h): SQ_MEDIA_TYPE (415) for PNG, GIF, WebP, BMP, TIFF and
 * anything else that is not a JPEG; SQ_BAD_IMAGE (400) for empty, corrupt or
 * truncated data, with the decoder's reason in err; SQ_TOO_LARGE (413) when
 * the header announces more than the configured limits; SQ_NOMEM when a
 * pixel buffer cannot be allocated; SQ_INVAL for bad arguments (a bug in the
 * caller, not in the image). */

/* How the decoded image is brought to the model input size. Both use pixel
 * centers at (i + 0.5), as OpenCV and PIL do. */
typedef enum {
    /* Triangle filter whose support widens with the reduction factor (PIL's
     * BILINEAR): plain bilinear interpolation when enlarging, an area-like
     * average of every covered source pixel when reducing (no aliasing). */
    GW_RESIZE_BILINEAR = 0,
    /* The source pixel whose center is closest to the output pixel's center. */
    GW_RESIZE_NEAREST = 1,
} gw_resize_t;

/* Parses "bilinear" or "nearest" (the model config's preprocess.resize).
 * Returns 0, or SQ_INVAL for anything else. */
int gw_resize_parse(const char *name, gw_resize_t *out);
const char *gw_resize_name(gw_resize_t mode);

/* Decompression-bomb limits, checked on the header before anything is
 * decoded, and the DCT scaling switch. */
typedef struct {
    uint32_t max_width;  /* pixels; GW_PREP_DEFAULT_MAX_SIDE */
    uint32_t max_height; /* pixels; GW_PREP_DEFAULT_MAX_SIDE */
    uint64_t max_pixels; /* width * height; GW_PREP_DEFAULT_MAX_PIXELS */
    /* 1: when the image is at least twice the target in both dimensions,
     * decode at the smallest libjpeg-turbo scaling factor (1/8, 1/4, 3/8,
     * 1/2, ...) that keeps both dimensions >= the target. 0: always decode
     * at full size (for comparison in the benchmark). */
    int dct_scaling;
    /* 1: decode 4:4:4, 4:2:2, 4:2:0 and grayscale JPEGs to their Y, Cb, Cr
     * planes (no colour conversion or chroma upsampling in the decoder),
     * resize them to the target (chroma upsampled as libjpeg's fancy
     * upsampling does, folded into the resize) and convert YCbCr to RGB
     * (JFIF full range, libjpeg's integer arithmetic) per output pixel.
     * Other colour spaces and samplings, and the decodes that keep the
     * original, take the RGB path. Outputs are within 4 levels of the RGB
     * path's, except 4:2:0 under DCT scaling, where libjpeg makes full-size
     * chroma by IDCT scaling and colour edges differ by tens of levels
     * (tests/gateway/image/test_preprocess.c). 0, the default: always
     * decode to RGB. Off because it is slower: with DCT scaling, libjpeg's
     * colour conversion and upsampling are a few percent of the decode,
     * entropy decoding most of it (bench/RESULTS.md, issue 25 item 6). */
    int yuv_planes;
} gw_prep_limits_t;

/* 16384 x 16384 and 64 Mpixel: the most one request may cost is a 64
 * Mpixel CMYK decode buffer (256 MB), plus, for a progressive JPEG, the
 * coefficients libjpeg-turbo keeps for the whole image (up to 6 bytes per
 * pixel). Cameras and phones stay well below (12 to 50 Mpixel). */
#define GW_PREP_DEFAULT_MAX_SIDE 16384u
#define GW_PREP_DEFAULT_MAX_PIXELS (64ull * 1024 * 1024)

/* The defaults above, with DCT scaling on and the YUV planes path off. */
gw_prep_limits_t gw_prep_limits_default(void);

/* What gw_image_to_rgb found and did. */
typedef struct {
    int width, height;                 /* as stored in the JPEG */
    int decoded_width, decoded_height; /* after DCT scaling */
    int scale_num, scale_denom;        /* DCT scaling factor used; 1/1 = none */
    int subsamp;                       /* TJSAMP_* of turbojpeg.h */
    int colorspace;                    /* TJCS_* of turbojpeg.h */
} gw_image_info_t;

/* Per-thread decoding state: a TurboJPEG decompressor and scratch buffers
 * (kept between calls up to GW_PREP_SCRATCH_KEEP_BYTES, so that a stream of
 * camera frames allocates nothing). Not thread-safe: one per thread. */
typedef struct gw_prep_ctx gw_prep_ctx_t;

#define GW_PREP_SCRATCH_KEEP_BYTES (16u * 1024 * 1024)

/* Creates a context; limits NULL means gw_prep_limits_default(). Returns
 * NULL when TurboJPEG cannot be initialised (out of memory). */
gw_prep_ctx_t *gw_prep_ctx_new(const gw_prep_limits_t *limits);
/* Releases the context; accepts NULL. */
void gw_prep_ctx_free(gw_prep_ctx_t *ctx);
/* The limits the context enforces. */
const gw_prep_limits_t *gw_prep_ctx_limits(const gw_prep_ctx_t *ctx);

/* The cheap part of gw_image_to_rgb's checks, on the first bytes only: 0
 * for a JPEG, SQ_BAD_IMAGE when empty, SQ_MEDIA_TYPE (with the format it
 * looks like in err) otherwise. Lets a caller answer a non-JPEG at once,
 * whatever its size, before queueing it for a decoder. */
int gw_image_type_check(const uint8_t *data, size_t len, char *err, size_t errlen);

/* Decodes the image in data[0..len) and writes out_w x out_h pixels, uint8
 * RGB, row-major, no padding (out_w * out_h * 3 bytes) to dst. Grayscale
 * JPEGs come out with R = G = B; CMYK and YCCK JPEGs are taken as Adobe
 * (inverted) CMYK, as Photoshop writes them, and converted with
 * R = C * K / 255 (libjpeg-turbo's convention). EXIF orientation is not
 * applied. Warnings of the decoder (a truncated scan, a bad Huffman code)
 * are errors: a half-gray image must not reach a model.
 * info may be NULL; err (may be NULL) receives a one-line reason on failure.
 * Returns 0 or a negative SQ_* code (see the top of this file); dst is
 * unspecified after an error. */
int gw_image_to_rgb(gw_prep_ctx_t *ctx, const uint8_t *data, size_t len, int out_w, int out_h,
                    gw_resize_t mode, uint8_t *dst, gw_image_info_t *info, char *err,
                    size_t errlen);

/* gw_image_to_rgb, decoding at full size (no DCT scaling) and handing the
 * decoded image to the caller: *original (malloc'd, packed RGB,
 * info->width x info->height; the caller frees it) on success, NULL after
 * an error. For work on the original after the resize (a pipeline's
 * crops). */
int gw_image_to_rgb_keep(gw_prep_ctx_t *ctx, const uint8_t *data, size_t len, int out_w, int out_h,
                         gw_resize_t mode, uint8_t *dst, gw_image_info_t *info, uint8_t **original,
                         char *err, size_t errlen);

/* Resizes a packed RGB image (src_stride bytes per row, >= src_w * 3) to
 * dst_w x dst_h packed RGB with the arithmetic gw_image_to_rgb uses
 * (fixed point, 14-bit weights that sum exactly to one, so a flat image
 * stays exactly flat). Returns 0, SQ_INVAL or SQ_NOMEM. */
int gw_resize_rgb(gw_prep_ctx_t *ctx, const uint8_t *src, int src_w, int src_h, size_t src_stride,
                  uint8_t *dst, int dst_w, int dst_h, gw_resize_t mode);

/* ---- thread pool ---------------------------------------------------- */

typedef struct gw_prep_pool gw_prep_pool_t;
typedef struct gw_prep_job gw_prep_job_t;

/* Called exactly once per accepted job, on a pool thread, with 0 or an
 * SQ_* code: the codes of gw_image_to_rgb, SQ_DEADLINE (the job was still
 * queued at its deadline, or so close to it that a decode of the pool's
 * recent duration would end past it, and was not decoded) or
 * SQ_SHUTTING_DOWN (cancelled
 * by gw_prep_pool_shutdown). The pool no longer touches the job once this
 * returns, so the callback may free or reuse it. It must not block for
 * long, and must not shut down or free the pool. */
typedef void (*gw_prep_done_fn)(gw_prep_job_t *job, int rc);

#define GW_PREP_ERR_MAX 160

/* Owned by the caller; the pool links it into its queue (no allocation on
 * submit). Every input must stay valid until done runs. */
struct gw_prep_job {
    /* in */
    const uint8_t *data; /* the encoded image (borrowed) */
    size_t len;
    int out_w, out_h;
    gw_resize_t mode;
    uint8_t *dst;        /* out_w * out_h * 3 bytes, e.g. a shared-memory slot */
    int64_t deadline_ns; /* CLOCK_MONOTONIC (sq_now_ns); 0 = none */
    gw_prep_done_fn done;
    void *user; /* for the caller (the request) */
    /* 1: decode at full size and keep the decoded image in original (see
     * gw_image_to_rgb_keep); done owns it from then on. */
    int keep_original;
    /* With keep_original, > 0: keep it at the smallest DCT scale whose
     * output still covers this many pixels (and out_w x out_h) on both
     * sides, not at full size (a 12 MP frame kept for crops of 224 px is
     * decoded at 1/4 or 1/8); info.decoded_width x decoded_height. */
    int keep_cover;
    /* Not NULL: the job is this work instead of a decode (data, dst and
     * the sizes are the work's own business): it runs on a pool thread
     * with that thread's context and returns 0 or an SQ_* code (with a
     * reason in err), which done receives. The deadline applies as to a
     * decode. */
    int (*work)(gw_prep_ctx_t *ctx, gw_prep_job_t *job);
    /* out, valid in done */
    gw_image_info_t info;
    /* keep_original: the decoded image (info.decoded_width x decoded_height) */
    uint8_t *original;
    int64_t queued_ns, started_ns, finished_ns; /* CLOCK_MONOTONIC */
    char err[GW_PREP_ERR_MAX];                  /* reason when rc != 0 */
    /* private to the pool */
    gw_prep_job_t *next_;
};

typedef struct {
    int threads;        /* >= 1 */
    int queue_capacity; /* jobs waiting (not yet running) at most; >= 1 */
    gw_prep_limits_t limits;
} gw_prep_pool_config_t;

typedef enum {
    GW_PREP_DRAIN,  /* run every queued job, then stop */
    GW_PREP_CANCEL, /* finish running jobs; queued ones get SQ_SHUTTING_DOWN */
} gw_prep_shutdown_t;

/* Starts cfg->threads threads, each with its own context. Returns 0 and the
 * pool in *out, SQ_INVAL for a bad config, SQ_NOMEM or SQ_INTERNAL when a
 * context or thread cannot be created (nothing is left running then). */
int gw_prep_pool_new(const gw_prep_pool_config_t *cfg, gw_prep_pool_t **out);
/* Queues a job; thread-safe, never blocks on decoding. Returns 0 (done will
 * be called), SQ_OVERLOAD when queue_capacity jobs are already waiting,
 * SQ_DEADLINE when the jobs waiting ahead of it and its own decode, at the
 * pool's recent decode time per job (an EWMA), would not let it be done by
 * its deadline, SQ_SHUTTING_DOWN after shutdown began, SQ_INVAL for a malformed
 * job (no callback, no dst, bad size). On an error done is not called. */
int gw_prep_pool_submit(gw_prep_pool_t *pool, gw_prep_job_t *job);
/* Jobs waiting in the queue now (for metrics and admission control). */
int gw_prep_pool_queued(gw_prep_pool_t *pool);
/* A decode time's estimate: an EWMA (weight GW_PREP_EST_WEIGHT) of the
 * samples and of their absolute deviation from it, and how many samples
 * it holds (0: none, the rest 0). */
typedef struct {
    double mean_ns, dev_ns;
    long long samples;
} gw_prep_est_t;
#define GW_PREP_EST_WEIGHT 0.1
/* The 99th percentile is taken as the mean plus this many mean absolute
 * deviations. A normal law's p99 is 2.9 of them, an exponential's 4.9:
 * decodes on a shared CPU have the tail of the second (a decode that
 * loses its core waits for a time slice), so 4. */
#define GW_PREP_EST_P99_DEVS 4.0
/* Adds one sample: the first sets the mean, the next move the mean and the
 * deviation by the weight. */
void gw_prep_est_add(gw_prep_est_t *est, double x);
/* The estimate's 99th percentile (mean_ns + GW_PREP_EST_P99_DEVS * dev_ns);
 * 0 with no samples. */
double gw_prep_est_p99(const gw_prep_est_t *est);

/* What the pool knows of its decodes' cost: every decode's duration (ns),
 * the duration of a decode of a file below GW_PREP_BYTE_RATE_MIN (ns),
 * and the time per byte of a decode of a larger file (ns per byte). Work
 * jobs (work != NULL) count in none. */
typedef struct {
    gw_prep_est_t decode, frame, per_byte;
} gw_prep_costs_t;

/* The pool's recent decode time per job (the EWMA submit uses), in µs; 0
 * before the first decode. Thread-safe. */
double gw_prep_pool_decode_us(gw_prep_pool_t *pool);
/* The 99th percentile of a frame's decode, in µs: of the decodes of files
 * below GW_PREP_BYTE_RATE_MIN (those of larger files are planned from
 * their size, frame by frame), or of every decode while there was no such
 * file; 0 before the first. What a pipeline's split reserves for a
 * stage's decode. Thread-safe. */
double gw_prep_pool_decode_p99_us(gw_prep_pool_t *pool);
/* A copy of the pool's estimates (to store them). Thread-safe. */
void gw_prep_pool_costs(gw_prep_pool_t *pool, gw_prep_costs_t *out);
/* Sets each of the pool's estimates that holds no sample yet to the given
 * one when that has samples and finite, non-negative values (a mean above
 * 0): estimates stored by an earlier run, so that the first frames are
 * planned as the later ones. Thread-safe. */
void gw_prep_pool_seed(gw_prep_pool_t *pool, const gw_prep_costs_t *stored);
/* What decoding a JPEG of len bytes is expected to take, in µs: for a
 * file of at least GW_PREP_BYTE_RATE_MIN bytes, the pool's recent time per
 * byte of such files times len (a large file's decode follows its size:
 * entropy decoding is most of it at any DCT scale) when that is more than
 * the mean decode; else the mean. Thread-safe. */
double gw_prep_pool_decode_us_for(gw_prep_pool_t *pool, size_t len);
/* What a frame of len bytes may borrow its decode by (the pipeline's
 * root_start): gw_prep_pool_decode_us_for, or before the pool has seen a
 * large file's time per byte, small files' time per byte times len when
 * that is more (a small file's includes its fixed costs and its pixels at
 * full scale, so it errs long: the first 12 MP photo of a new model DB
 * takes slack from its crops instead of missing its detector's share).
 * Thread-safe. */
double gw_prep_pool_decode_borrow_us_for(gw_prep_pool_t *pool, size_t len);
#define GW_PREP_BYTE_RATE_MIN (256 * 1024)
/* Stops accepting jobs, drains or cancels the queue, and joins the
 * threads; on return no callback is running or will run. Call from one
 * thread, never from a callback. A second call does nothing. */
void gw_prep_pool_shutdown(gw_prep_pool_t *pool, gw_prep_shutdown_t how);
/* Shuts down (draining) if not done yet and releases the pool; accepts NULL. */
void gw_prep_pool_free(gw_prep_pool_t *pool);

/* Detection post-processing and cropping, for pipelines where a detector
 * stage feeds crops of its detections to a classifier stage, and for /v1's
 * answer of a detector.
 *
 * A pipeline stage's "crops_of" object (and a detector model's upload
 * config "detector" block, with the same fields) says how to read the
 * detector's output. Its "layout" names one of three common layouts:
 * - "yolo": YOLOv5/v8's one output [N, 4 + C, A] (or its transpose
 *   [N, A, 4 + C], or YOLOv5's [N, A, 5 + C] with an objectness column):
 *   centre boxes in input pixels, then C class scores, per anchor;
 * - "boxes_scores": boxes already decoded ([N, K, >= 4], any of the four
 *   orders, in input pixels or normalized) with scores [N, K] (and
 *   optionally class indices [N, K], "labels") or per-class scores
 *   [N, K, C], as SSD and RetinaNet exports with their postprocessing give;
 * - "ssd_anchors": raw SSD box offsets decoded against anchors the way
 *   MediaPipe's TensorsToDetectionsCalculator does (BlazeFace), scores
 *   [N, K] or per class [N, K, C].
 * A spec without "layout" is "ssd_anchors" when it gives "anchors", else
 * "boxes_scores". Scores are thresholded, a box's class is its best-scored
 * one (or its label), a "classes" list keeps only those classes, and
 * overlapping boxes of one class are suppressed (hard NMS, or MediaPipe's
 * weighted NMS); a detection becomes a crop with padding and square
 * expansion.
 *
 * The data plane hands one item's output row: every output of the graph
 * concatenated in graph order, each flattened per item (output i starts at
 * the sum of the elems of outputs 0..i-1, see gw_output_t).
 * gw_crops_spec_bind() finds the named outputs in that row once per model;
 * gw_detect() then decodes a row, and gw_crop_rect() / gw_crop_resize() cut
 * and resize the crops into the next stage's input slots.
 *
 * Everything here is pure: no I/O, no clock, no global state; a bound spec
 * is read-only and may be shared by threads. */

/* The order of the four box numbers (at box_offset in each box row). */
typedef enum {
    GW_BOX_XYXY,   /* x0, y0, x1, y1 */
    GW_BOX_CXCYWH, /* center x, center y, width, height */
    GW_BOX_YXYX,   /* y0, x0, y1, x1 (TensorFlow's object detection API) */
    GW_BOX_CYCXHW, /* center y, center x, height, width (MediaPipe's default order) */
} gw_box_format_t;

/* "xyxy", "cxcywh", "yxyx", "cycxhw". */
const char *gw_box_format_name(gw_box_format_t f);

/* MediaPipe's SsdAnchorsCalculatorOptions (ssd_anchors_calculator.proto),
 * without the explicit feature_map_width/height lists (the feature map of a
 * layer is ceil(input size / stride)). */
#define GW_SSD_MAX_LAYERS 8
#define GW_SSD_MAX_RATIOS 8
typedef struct {
    int num_layers; /* 1..GW_SSD_MAX_LAYERS; strides has this many entries */
    double min_scale, max_scale;
    int input_w, input_h;                    /* input_size_width/height */
    double anchor_offset_x, anchor_offset_y; /* default 0.5 */
    int strides[GW_SSD_MAX_LAYERS];
    int naspect_ratios;
    double aspect_ratios[GW_SSD_MAX_RATIOS]; /* default [1.0] */
    int reduce_boxes_in_lowest_layer;        /* default 0 */
    double interpolated_scale_aspect_ratio;  /* default 1.0; 0 = no interpolated anchor */
    int fixed_anchor_size;                   /* default 0 */
} gw_ssd_anchors_t;

/* One anchor, in normalized coordinates of the model input. */
typedef struct {
    float cx, cy, w, h;
} gw_anchor_t;

/* MediaPipe's published options for BlazeFace front 128x128
 * (face_detection_front*.pbtxt): 4 layers, scales 0.1484375..0.75, input
 * 128x128, offsets 0.5, strides [8, 16, 16, 16], aspect ratios [1.0],
 * interpolated ratio 1.0, fixed anchor size: 896 anchors. */
void gw_ssd_anchors_face_front_128(gw_ssd_anchors_t *a);

/* Generates the anchors in MediaPipe's order (layers with one stride
 * grouped, then rows, columns, anchors of a cell); writes at most max to
 * out (out may be NULL with max 0) and returns how many there are. */
int gw_ssd_anchors_generate(const gw_ssd_anchors_t *a, gw_anchor_t *out, int max);

/* The boxes and the scores may each be split over several outputs of the
 * graph (BlazeFace's ONNX export has one per feature-map stride): they are
 * taken concatenated along K in the order listed. */
#define GW_DETECT_MAX_PARTS 4
#define GW_DETECT_MAX_CROPS 64

#define GW_DETECT_MAX_CLASSES 256

typedef enum {
    GW_LAYOUT_BOXES_SCORES, /* "boxes_scores" */
    GW_LAYOUT_YOLO,         /* "yolo" */
    GW_LAYOUT_SSD_ANCHORS,  /* "ssd_anchors" */
} gw_detect_layout_t;

/* "boxes_scores", "yolo", "ssd_anchors". */
const char *gw_detect_layout_name(gw_detect_layout_t l);

typedef struct {
    char name[128];
    /* bound by gw_crops_spec_bind: */
    int64_t off;     /* floats from the start of the row */
    int count;       /* K of this output */
    int64_t kstride; /* floats from one box (anchor) to the next */
    int64_t jstride; /* floats from one box number (or class) to the next */
} gw_detect_part_t;

typedef struct {
    gw_detect_layout_t layout; /* "layout"; see the top of this section */
    /* "boxes": an output name or a list; each [N, K, C] with C >= box_offset + 4
     * (boxes_scores, ssd_anchors). */
    int nbox_parts;
    gw_detect_part_t box_parts[GW_DETECT_MAX_PARTS];
    /* "scores": an output name or a list; each [N, K], [N, K, 1] or, per
     * class, [N, K, C] with one C for all (boxes_scores, ssd_anchors). */
    int nscore_parts;
    gw_detect_part_t score_parts[GW_DETECT_MAX_PARTS];
    /* "labels" (boxes_scores): an output [N, K] of class indices (as
     * postprocessed exports give them with [N, K] scores); has_labels 0:
     * none. */
    int has_labels;
    gw_detect_part_t label_part;
    /* yolo: "output", the one output (default: the model's first);
     * "objectness": its rows hold an objectness column after the box
     * (YOLOv5, [N, A, 5 + C]; a score is objectness times the class's);
     * "transposed": 1 for [N, A, 4 + C], 0 for [N, 4 + C, A], -1 (not
     * given): the longer axis is A. */
    char output[128];
    int objectness;
    int transposed;
    int box_offset;         /* "box_offset": where the 4 numbers start in a box row; 0 */
    gw_box_format_t format; /* "format"; "xyxy", "cxcywh" with anchors and yolo */
    /* "normalized": 1 (default): coordinates in [0, 1] of the model input;
     * 0 (yolo's default): pixels of the model input. Anchor decoding is
     * always normalized. */
    int normalized;
    /* "anchors" (ssd_anchors): the preset name "mediapipe_face_front_128" or
     * an object with
     * the fields of gw_ssd_anchors_t (num_layers, min_scale, max_scale,
     * input_size_width, input_size_height, anchor_offset_x, anchor_offset_y,
     * strides, aspect_ratios, reduce_boxes_in_lowest_layer,
     * interpolated_scale_aspect_ratio, fixed_anchor_size). With anchors,
     * format must be cxcywh or cycxhw and box k decodes as MediaPipe does:
     * cx = raw_cx / x_scale * anchor.w + anchor.cx, w = raw_w / w_scale *
     * anchor.w (or exp(raw_w / w_scale) * anchor.w with exp_box_size), and
     * likewise for y and h. */
    int has_anchors;
    char anchors_preset[64]; /* "" for explicit options */
    gw_ssd_anchors_t anchors;
    /* "x_scale", "y_scale", "w_scale", "h_scale": default the anchors' input
     * width (x, w) and height (y, h). */
    double x_scale, y_scale, w_scale, h_scale;
    int exp_box_size; /* "exp_box_size": false */
    /* "sigmoid": the scores are logits (false); "score_clip": with sigmoid,
     * logits are first clipped to [-score_clip, score_clip] (0 = no clip). */
    int sigmoid;
    double score_clip;
    double score_threshold; /* "score_threshold": keep score >= it; 0.5 */
    /* "classes": keep only the detections of these class indices (a box's
     * class is its best-scored one, or its label); nclasses_kept 0: all. */
    int nclasses_kept;
    int classes_kept[GW_DETECT_MAX_CLASSES];
    /* "background": a class index that is never a detection (torchvision's
     * SSD and RetinaNet-style softmax heads score class 0 as "nothing
     * there"): a box's class is its best-scored other one; -1: none. */
    int background;
    /* "nms": "hard" (default: a box suppresses the lower-scored boxes of
     * its class that overlap it) or "weighted" (MediaPipe: the top box and
     * the boxes of its class overlapping it are replaced by their
     * score-weighted mean box, with the top score); "nms_iou": suppress
     * IoU > nms_iou, in (0, 1]; 0.5. */
    int nms_weighted;
    double nms_iou;
    int max_crops;  /* "max_crops": 1..GW_DETECT_MAX_CROPS; 8 */
    double padding; /* "padding": fraction of the box size added on each side, 0..4; 0 */
    int square;     /* "square": expand the crop to a square around the box center; false */
    /* bound by gw_crops_spec_bind: */
    int bound;
    int nboxes;                /* K in all */
    int box_stride;            /* C: floats per box row */
    int nclasses;              /* C: the scores' classes (1 for [N, K] scores) */
    gw_detect_part_t obj_part; /* yolo with objectness */
} gw_crops_spec_t;

/* A detection, in pixels of the original image (continuous coordinates:
 * the image spans [0, img_w] x [0, img_h]); not clamped to the image. */
typedef struct {
    float x0, y0, x1, y1;
    float score;
    int index; /* the box's k in the detector output */
    int label; /* its class index (0 for single-class scores) */
} gw_detection_t;

/* A crop in whole pixels of the original image, inside it, w, h >= 1. */
typedef struct {
    int x, y, w, h;
} gw_rect_t;

/* Parses a pipeline stage's "crops_of" object (every field but the parent
 * stage's name, "stage", which the pipeline parser reads and which is
 * skipped here). Defaults are those given above. Returns 0, or
 * SQ_BAD_CONFIG with err naming the field prefixed by path, e.g.
 * "stages[1].crops_of.nms_iou: expected a number in (0, 1]"; unknown
 * fields are errors too. out is unbound afterwards. */
int gw_crops_spec_parse(const json_t *crops_of, const char *path, gw_crops_spec_t *out, char *err,
                        size_t errlen);

/* The spec as JSON again (for GET /pipelines), with the defaults filled in;
 * parsing it gives the same spec. A new reference. */
json_t *gw_crops_spec_json(const gw_crops_spec_t *s);

/* Resolves the output names against the detector model's outputs (the
 * model det_name's, in its graph's order):
 * a missing output, a wrong shape (boxes [N, K, >= box_offset + 4] with one
 * C for all parts, scores [N, K], [N, K, 1] or [N, K, C], labels [N, K],
 * yolo's [N, 4 + C, A] or its transpose), different K in all for boxes,
 * scores and labels, a class of "classes" past C, or an anchor count other
 * than K -> SQ_BAD_CONFIG with err naming the field, prefixed by path, and
 * saying what to send instead. Returns 0 and fills the bound fields. */
int gw_crops_spec_bind(gw_crops_spec_t *s, const char *det_name, const gw_output_t *outputs,
                       int noutputs, const char *path, char *err, size_t errlen);

/* Decodes one item's output row (see the top of this file) of a bound spec:
 * scores (after the sigmoid) >= score_threshold, of the kept classes, NMS
 * per class, then at most
 * min(max, max_crops) detections, highest score first (ties: lower k
 * first). Boxes are mapped from the model input (in_w x in_h, used for
 * pixel coordinates) to the original image (img_w x img_h), the model input
 * being a plain stretch-resize of the whole image (no letterbox). Thread-safe;
 * allocates one temporary array of K candidates (malloc, freed before it
 * returns). Returns the count, SQ_INVAL (unbound spec, bad sizes) or
 * SQ_NOMEM. */
int gw_detect(const gw_crops_spec_t *s, const float *row, int in_w, int in_h, int img_w, int img_h,
              gw_detection_t *out, int max);

/* The crop rectangle for a detection: the box grown by padding times its
 * width (height) on the left and right (top and bottom), then, with square,
 * grown to a square of the larger side around its center; then rounded
 * outwards to whole pixels and clipped to the image (a square crop at a
 * border is cut, not shifted), at least 1x1. */
gw_rect_t gw_crop_rect(const gw_crops_spec_t *s, const gw_detection_t *d, int img_w, int img_h);

/* Resizes rectangle r of a packed RGB image (img_w x img_h, 3 bytes per
 * pixel, no row padding) into dst (dst_w x dst_h packed RGB, e.g. the next
 * stage's input slot) with gw_resize_rgb. Returns 0, SQ_INVAL (r not
 * inside the image, bad sizes) or SQ_NOMEM. */
int gw_crop_resize(gw_prep_ctx_t *ctx, const uint8_t *rgb, int img_w, int img_h, gw_rect_t r,
                   uint8_t *dst, int dst_w, int dst_h, gw_resize_t mode);

#endif
