/* Detection post-processing and cropping, for pipelines where a detector
 * stage feeds crops of its detections to a classifier stage.
 *
 * A pipeline stage's "crops_of" object says how to read the detector's
 * output: which outputs hold the boxes and the scores, how the four box
 * numbers are laid out, whether they are decoded against SSD anchors the
 * way MediaPipe's TensorsToDetectionsCalculator does (BlazeFace), how
 * scores are thresholded, how overlapping boxes are suppressed (hard NMS or
 * MediaPipe's weighted NMS), and how a detection becomes a crop (padding,
 * square expansion).
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
#ifndef GW_DETECT_H
#define GW_DETECT_H

#include "gw_preprocess.h"
#include "gw_registry.h"

#include <jansson.h>
#include <stdint.h>

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

typedef struct {
    char name[128];
    /* bound by gw_crops_spec_bind: */
    int64_t off; /* floats from the start of the row */
    int count;   /* K of this output */
} gw_detect_part_t;

typedef struct {
    /* "boxes": an output name or a list; each [N, K, C] with C >= box_offset + 4. */
    int nbox_parts;
    gw_detect_part_t box_parts[GW_DETECT_MAX_PARTS];
    /* "scores": an output name or a list; each [N, K] or [N, K, 1]. */
    int nscore_parts;
    gw_detect_part_t score_parts[GW_DETECT_MAX_PARTS];
    int box_offset;         /* "box_offset": where the 4 numbers start in a box row; 0 */
    gw_box_format_t format; /* "format"; "xyxy", or "cxcywh" with anchors */
    /* "normalized": 1 (default): coordinates in [0, 1] of the model input;
     * 0: pixels of the model input. Anchor decoding is always normalized. */
    int normalized;
    /* "anchors": the preset name "mediapipe_face_front_128" or an object with
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
    /* "nms": "hard" (default) or "weighted" (MediaPipe: the top box and the
     * boxes overlapping it are replaced by their score-weighted mean box,
     * with the top score); "nms_iou": suppress IoU > nms_iou, in (0, 1]; 0.5. */
    int nms_weighted;
    double nms_iou;
    int max_crops;  /* "max_crops": 1..GW_DETECT_MAX_CROPS; 8 */
    double padding; /* "padding": fraction of the box size added on each side, 0..4; 0 */
    int square;     /* "square": expand the crop to a square around the box center; false */
    /* bound by gw_crops_spec_bind: */
    int bound;
    int nboxes;     /* K in all */
    int box_stride; /* C: floats per box row */
} gw_crops_spec_t;

/* A detection, in pixels of the original image (continuous coordinates:
 * the image spans [0, img_w] x [0, img_h]); not clamped to the image. */
typedef struct {
    float x0, y0, x1, y1;
    float score;
    int index; /* the box's k in the detector output */
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

/* Resolves the output names against the detector model (det->outputs[]):
 * a missing output, a wrong shape (boxes [N, K, >= box_offset + 4] with one
 * C for all parts, scores [N, K] or [N, K, 1]), different K in all for boxes
 * and scores, or an anchor count other than K -> SQ_BAD_CONFIG with err
 * naming the field, prefixed by path. Returns 0 and fills the bound fields. */
int gw_crops_spec_bind(gw_crops_spec_t *s, const gw_model_t *det, const char *path, char *err,
                       size_t errlen);

/* Decodes one item's output row (see the top of this file) of a bound spec:
 * scores (after the sigmoid) >= score_threshold, NMS, then at most
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
