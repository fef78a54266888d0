/* Detection post-processing: see gw_image.h (crops.c cuts the crops). */
#include "gw_image.h"

#include <sq.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PRESET_FACE_FRONT "mediapipe_face_front_128"

static const char *const format_names[] = {"xyxy", "cxcywh", "yxyx", "cycxhw"};

const char *gw_box_format_name(gw_box_format_t f)
{
    return (unsigned)f < 4 ? format_names[f] : "?";
}

static const char *const layout_names[] = {"boxes_scores", "yolo", "ssd_anchors"};

#define LAYOUTS_WHY                                                                                \
    "expected \"yolo\" (one output [N, 4 + C, A], its transpose [N, A, 4 + C], or YOLOv5's "       \
    "[N, A, 5 + C] with \"objectness\": true), \"boxes_scores\" (decoded boxes [N, K, 4] with "    \
    "scores [N, K] and optional labels [N, K], or per-class scores [N, K, C]: export SSD and "     \
    "RetinaNet with their postprocessing) or \"ssd_anchors\" (raw box offsets [N, K, >= 4] with "  \
    "\"anchors\", MediaPipe's SSD anchor options)"

const char *gw_detect_layout_name(gw_detect_layout_t l)
{
    return (unsigned)l < 3 ? layout_names[l] : "?";
}

/* ---- anchors (MediaPipe's SsdAnchorsCalculator) ------------------------ */

void gw_ssd_anchors_face_front_128(gw_ssd_anchors_t *a)
{
    memset(a, 0, sizeof(*a));
    a->num_layers = 4;
    a->min_scale = 0.1484375;
    a->max_scale = 0.75;
    a->input_w = 128;
    a->input_h = 128;
    a->anchor_offset_x = 0.5;
    a->anchor_offset_y = 0.5;
    a->strides[0] = 8;
    a->strides[1] = 16;
    a->strides[2] = 16;
    a->strides[3] = 16;
    a->naspect_ratios = 1;
    a->aspect_ratios[0] = 1.0;
    a->reduce_boxes_in_lowest_layer = 0;
    a->interpolated_scale_aspect_ratio = 1.0;
    a->fixed_anchor_size = 1;
}

static float anchor_scale(const gw_ssd_anchors_t *a, int i)
{
    if (a->num_layers == 1)
        return (float)((a->min_scale + a->max_scale) * 0.5);
    return (float)(a->min_scale + (a->max_scale - a->min_scale) * i / (a->num_layers - 1.0));
}

typedef void (*anchor_fn)(void *arg, int k, const gw_anchor_t *anchor);

/* Calls fn for every anchor in MediaPipe's order; returns the count. At
 * most (1 + GW_SSD_MAX_RATIOS) anchors per layer, so one stride group
 * holds at most GW_SSD_MAX_LAYERS times that. */
static int anchors_walk(const gw_ssd_anchors_t *a, anchor_fn fn, void *arg)
{
    enum { MAXA = GW_SSD_MAX_LAYERS * (GW_SSD_MAX_RATIOS + 1) };
    int k = 0, layer = 0;
    while (layer < a->num_layers) {
        float ah[MAXA], aw[MAXA];
        int n = 0, last = layer;
        while (last < a->num_layers && a->strides[last] == a->strides[layer]) {
            float scale = anchor_scale(a, last);
            float ratios[GW_SSD_MAX_RATIOS + 3], scales[GW_SSD_MAX_RATIOS + 3];
            int m = 0;
            if (last == 0 && a->reduce_boxes_in_lowest_layer) {
                ratios[0] = 1.0f, scales[0] = 0.1f;
                ratios[1] = 2.0f, scales[1] = scale;
                ratios[2] = 0.5f, scales[2] = scale;
                m = 3;
            } else {
                for (int r = 0; r < a->naspect_ratios; r++)
                    ratios[m] = (float)a->aspect_ratios[r], scales[m++] = scale;
                if (a->interpolated_scale_aspect_ratio > 0.0) {
                    float next = last == a->num_layers - 1 ? 1.0f : anchor_scale(a, last + 1);
                    scales[m] = sqrtf(scale * next);
                    ratios[m++] = (float)a->interpolated_scale_aspect_ratio;
                }
            }
            for (int i = 0; i < m && n < MAXA; i++, n++) {
                float rs = sqrtf(ratios[i]);
                ah[n] = scales[i] / rs;
                aw[n] = scales[i] * rs;
            }
            last++;
        }
        int stride = a->strides[layer];
        int fh = (int)ceilf(1.0f * (float)a->input_h / (float)stride);
        int fw = (int)ceilf(1.0f * (float)a->input_w / (float)stride);
        for (int y = 0; y < fh; y++) {
            for (int x = 0; x < fw; x++) {
                for (int j = 0; j < n; j++, k++) {
                    if (fn == NULL)
                        continue;
                    gw_anchor_t an;
                    an.cx = (float)((x + a->anchor_offset_x) * 1.0 / fw);
                    an.cy = (float)((y + a->anchor_offset_y) * 1.0 / fh);
                    an.w = a->fixed_anchor_size ? 1.0f : aw[j];
                    an.h = a->fixed_anchor_size ? 1.0f : ah[j];
                    fn(arg, k, &an);
                }
            }
        }
        layer = last;
    }
    return k;
}

typedef struct {
    gw_anchor_t *out;
    int max;
} gen_arg_t;

static void gen_one(void *arg, int k, const gw_anchor_t *anchor)
{
    gen_arg_t *g = arg;
    if (k < g->max)
        g->out[k] = *anchor;
}

int gw_ssd_anchors_generate(const gw_ssd_anchors_t *a, gw_anchor_t *out, int max)
{
    gen_arg_t g = {out, out != NULL ? max : 0};
    return anchors_walk(a, gen_one, &g);
}

/* ---- parsing ------------------------------------------------------------ */

static int bad(char *err, size_t errlen, const char *path, const char *field, const char *why)
{
    snprintf(err, errlen, "%s%s%s: %s", path != NULL ? path : "",
             path != NULL && path[0] != '\0' ? "." : "", field, why);
    return SQ_BAD_CONFIG;
}

static int num_in(const json_t *v, double lo, double hi, double *out)
{
    if (!json_is_number(v))
        return -1;
    double d = json_number_value(v);
    if (!isfinite(d) || d < lo || d > hi)
        return -1;
    *out = d;
    return 0;
}

static int int_in(const json_t *v, int lo, int hi, int *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return -1;
    *out = (int)json_integer_value(v);
    return 0;
}

static int parse_parts(const json_t *v, gw_detect_part_t *parts, int *n)
{
    *n = 0;
    if (json_is_string(v)) {
        if (json_string_length(v) == 0 || json_string_length(v) >= sizeof(parts[0].name))
            return -1;
        snprintf(parts[0].name, sizeof(parts[0].name), "%s", json_string_value(v));
        *n = 1;
        return 0;
    }
    if (!json_is_array(v) || json_array_size(v) == 0 || json_array_size(v) > GW_DETECT_MAX_PARTS)
        return -1;
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e)
    {
        if (!json_is_string(e) || json_string_length(e) == 0 ||
            json_string_length(e) >= sizeof(parts[0].name))
            return -1;
        snprintf(parts[i].name, sizeof(parts[i].name), "%s", json_string_value(e));
    }
    *n = (int)json_array_size(v);
    return 0;
}

static int parse_anchors(const json_t *v, const char *path, gw_crops_spec_t *s, char *err,
                         size_t errlen)
{
    gw_ssd_anchors_t *a = &s->anchors;
    char f[96];
    if (json_is_string(v)) {
        if (strcmp(json_string_value(v), PRESET_FACE_FRONT) != 0)
            return bad(err, errlen, path, "anchors",
                       "expected \"" PRESET_FACE_FRONT "\" or an object of anchor options");
        gw_ssd_anchors_face_front_128(a);
        snprintf(s->anchors_preset, sizeof(s->anchors_preset), "%s", PRESET_FACE_FRONT);
        return 0;
    }
    if (!json_is_object(v))
        return bad(err, errlen, path, "anchors",
                   "expected \"" PRESET_FACE_FRONT "\" or an object of anchor options");
    memset(a, 0, sizeof(*a));
    a->anchor_offset_x = a->anchor_offset_y = 0.5;
    a->naspect_ratios = 1;
    a->aspect_ratios[0] = 1.0;
    a->interpolated_scale_aspect_ratio = 1.0;
    const char *required[] = {"num_layers",       "min_scale",         "max_scale",
                              "input_size_width", "input_size_height", "strides"};
    for (size_t i = 0; i < sizeof(required) / sizeof(required[0]); i++) {
        if (json_object_get(v, required[i]) == NULL) {
            snprintf(f, sizeof(f), "anchors.%s", required[i]);
            return bad(err, errlen, path, f, "required");
        }
    }
    const char *key;
    json_t *x;
    json_object_foreach((json_t *)v, key, x)
    {
        snprintf(f, sizeof(f), "anchors.%.60s", key);
        if (strcmp(key, "num_layers") == 0) {
            if (int_in(x, 1, GW_SSD_MAX_LAYERS, &a->num_layers) != 0)
                return bad(err, errlen, path, f, "expected an integer in 1..8");
        } else if (strcmp(key, "min_scale") == 0 || strcmp(key, "max_scale") == 0) {
            double *d = key[1] == 'i' ? &a->min_scale : &a->max_scale;
            if (num_in(x, 1e-6, 100, d) != 0)
                return bad(err, errlen, path, f, "expected a positive number");
        } else if (strcmp(key, "input_size_width") == 0 || strcmp(key, "input_size_height") == 0) {
            int *d = strstr(key, "width") != NULL ? &a->input_w : &a->input_h;
            if (int_in(x, 1, 65536, d) != 0)
                return bad(err, errlen, path, f, "expected an integer in 1..65536");
        } else if (strcmp(key, "anchor_offset_x") == 0 || strcmp(key, "anchor_offset_y") == 0) {
            double *d = key[14] == 'x' ? &a->anchor_offset_x : &a->anchor_offset_y;
            if (num_in(x, 0, 1, d) != 0)
                return bad(err, errlen, path, f, "expected a number in [0, 1]");
        } else if (strcmp(key, "strides") == 0) {
            if (!json_is_array(x) || json_array_size(x) == 0 ||
                json_array_size(x) > GW_SSD_MAX_LAYERS)
                return bad(err, errlen, path, f, "expected 1 to 8 integers");
            for (size_t i = 0; i < json_array_size(x); i++) {
                if (int_in(json_array_get(x, i), 1, 65536, &a->strides[i]) != 0)
                    return bad(err, errlen, path, f, "expected integers in 1..65536");
            }
        } else if (strcmp(key, "aspect_ratios") == 0) {
            if (!json_is_array(x) || json_array_size(x) > GW_SSD_MAX_RATIOS)
                return bad(err, errlen, path, f, "expected at most 8 positive numbers");
            a->naspect_ratios = (int)json_array_size(x);
            for (size_t i = 0; i < json_array_size(x); i++) {
                if (num_in(json_array_get(x, i), 1e-3, 1e3, &a->aspect_ratios[i]) != 0)
                    return bad(err, errlen, path, f, "expected at most 8 positive numbers");
            }
        } else if (strcmp(key, "reduce_boxes_in_lowest_layer") == 0 ||
                   strcmp(key, "fixed_anchor_size") == 0) {
            if (!json_is_boolean(x))
                return bad(err, errlen, path, f, "expected true or false");
            *(key[0] == 'r' ? &a->reduce_boxes_in_lowest_layer : &a->fixed_anchor_size) =
                json_is_true(x);
        } else if (strcmp(key, "interpolated_scale_aspect_ratio") == 0) {
            if (num_in(x, 0, 1e3, &a->interpolated_scale_aspect_ratio) != 0)
                return bad(err, errlen, path, f, "expected a number >= 0 (0: none)");
        } else {
            return bad(err, errlen, path, f, "unknown field");
        }
    }
    if ((int)json_array_size(json_object_get(v, "strides")) != a->num_layers)
        return bad(err, errlen, path, "anchors.strides", "expected num_layers strides");
    if (a->naspect_ratios == 0 && a->interpolated_scale_aspect_ratio <= 0)
        return bad(err, errlen, path, "anchors.aspect_ratios",
                   "no anchors per cell (empty and no interpolated_scale_aspect_ratio)");
    s->anchors_preset[0] = '\0';
    return 0;
}

static int get_bool(const json_t *x, int *out)
{
    if (!json_is_boolean(x))
        return -1;
    *out = json_is_true(x);
    return 0;
}

int gw_crops_spec_parse(const json_t *crops_of, const char *path, gw_crops_spec_t *out, char *err,
                        size_t errlen)
{
    gw_crops_spec_t *s = out;
    memset(s, 0, sizeof(*s));
    s->format = GW_BOX_XYXY;
    s->normalized = 1;
    s->score_threshold = 0.5;
    s->nms_iou = 0.5;
    s->max_crops = 8;
    s->transposed = -1;
    s->background = -1;
    if (!json_is_object(crops_of)) {
        snprintf(err, errlen, "%s: expected an object", path != NULL ? path : "crops_of");
        return SQ_BAD_CONFIG;
    }
    int has_format = 0, has_normalized = 0, has_scale[4] = {0}, has_layout = 0;
    const char *key;
    json_t *x;
    json_object_foreach((json_t *)crops_of, key, x)
    {
        if (strcmp(key, "stage") == 0)
            continue; /* the pipeline parser's */
        if (strcmp(key, "layout") == 0) {
            int found = -1;
            for (int i = 0; i < 3 && json_is_string(x); i++) {
                if (strcmp(json_string_value(x), layout_names[i]) == 0)
                    found = i;
            }
            if (found < 0)
                return bad(err, errlen, path, key, LAYOUTS_WHY);
            s->layout = (gw_detect_layout_t)found;
            has_layout = 1;
        } else if (strcmp(key, "output") == 0) {
            if (!json_is_string(x) || json_string_length(x) == 0 ||
                json_string_length(x) >= sizeof(s->output))
                return bad(err, errlen, path, key, "expected an output name");
            snprintf(s->output, sizeof(s->output), "%s", json_string_value(x));
        } else if (strcmp(key, "objectness") == 0) {
            if (get_bool(x, &s->objectness) != 0)
                return bad(err, errlen, path, key, "expected true or false");
        } else if (strcmp(key, "transposed") == 0) {
            if (get_bool(x, &s->transposed) != 0)
                return bad(err, errlen, path, key, "expected true or false");
        } else if (strcmp(key, "labels") == 0) {
            if (!json_is_string(x) || json_string_length(x) == 0 ||
                json_string_length(x) >= sizeof(s->label_part.name))
                return bad(err, errlen, path, key,
                           "expected the name of an output [N, K] of class indices");
            snprintf(s->label_part.name, sizeof(s->label_part.name), "%s", json_string_value(x));
            s->has_labels = 1;
        } else if (strcmp(key, "classes") == 0) {
            if (!json_is_array(x) || json_array_size(x) == 0 ||
                json_array_size(x) > GW_DETECT_MAX_CLASSES)
                return bad(err, errlen, path, key,
                           "expected a list of 1 to 256 class indices (integers >= 0)");
            for (size_t i = 0; i < json_array_size(x); i++) {
                if (int_in(json_array_get(x, i), 0, 1 << 24, &s->classes_kept[i]) != 0)
                    return bad(err, errlen, path, key,
                               "expected a list of 1 to 256 class indices (integers >= 0)");
            }
            s->nclasses_kept = (int)json_array_size(x);
        } else if (strcmp(key, "background") == 0) {
            if (int_in(x, 0, 1 << 24, &s->background) != 0)
                return bad(err, errlen, path, key,
                           "expected the class index of \"nothing there\" (an integer >= 0)");
        } else if (strcmp(key, "boxes") == 0) {
            if (parse_parts(x, s->box_parts, &s->nbox_parts) != 0)
                return bad(err, errlen, path, key,
                           "expected an output name or a list of 1 to 4 output names");
        } else if (strcmp(key, "scores") == 0) {
            if (parse_parts(x, s->score_parts, &s->nscore_parts) != 0)
                return bad(err, errlen, path, key,
                           "expected an output name or a list of 1 to 4 output names");
        } else if (strcmp(key, "box_offset") == 0) {
            if (int_in(x, 0, 4096, &s->box_offset) != 0)
                return bad(err, errlen, path, key, "expected an integer in 0..4096");
        } else if (strcmp(key, "format") == 0) {
            int found = -1;
            for (int i = 0; i < 4 && json_is_string(x); i++) {
                if (strcmp(json_string_value(x), format_names[i]) == 0)
                    found = i;
            }
            if (found < 0)
                return bad(err, errlen, path, key,
                           "expected \"xyxy\", \"cxcywh\", \"yxyx\" or \"cycxhw\"");
            s->format = (gw_box_format_t)found;
            has_format = 1;
        } else if (strcmp(key, "normalized") == 0) {
            if (get_bool(x, &s->normalized) != 0)
                return bad(err, errlen, path, key, "expected true or false");
            has_normalized = 1;
        } else if (strcmp(key, "anchors") == 0) {
            int rc = parse_anchors(x, path, s, err, errlen);
            if (rc != 0)
                return rc;
            s->has_anchors = 1;
        } else if (strcmp(key, "x_scale") == 0 || strcmp(key, "y_scale") == 0 ||
                   strcmp(key, "w_scale") == 0 || strcmp(key, "h_scale") == 0) {
            int i = key[0] == 'x' ? 0 : key[0] == 'y' ? 1 : key[0] == 'w' ? 2 : 3;
            double *d[4] = {&s->x_scale, &s->y_scale, &s->w_scale, &s->h_scale};
            if (num_in(x, 1e-9, 1e9, d[i]) != 0)
                return bad(err, errlen, path, key, "expected a positive number");
            has_scale[i] = 1;
        } else if (strcmp(key, "exp_box_size") == 0) {
            if (get_bool(x, &s->exp_box_size) != 0)
                return bad(err, errlen, path, key, "expected true or false");
        } else if (strcmp(key, "sigmoid") == 0) {
            if (get_bool(x, &s->sigmoid) != 0)
                return bad(err, errlen, path, key, "expected true or false");
        } else if (strcmp(key, "score_clip") == 0) {
            if (num_in(x, 0, 1e9, &s->score_clip) != 0)
                return bad(err, errlen, path, key, "expected a number >= 0 (0: none)");
        } else if (strcmp(key, "score_threshold") == 0) {
            if (num_in(x, -1e30, 1e30, &s->score_threshold) != 0)
                return bad(err, errlen, path, key, "expected a number");
        } else if (strcmp(key, "nms") == 0) {
            if (!json_is_string(x) || (strcmp(json_string_value(x), "hard") != 0 &&
                                       strcmp(json_string_value(x), "weighted") != 0))
                return bad(err, errlen, path, key, "expected \"hard\" or \"weighted\"");
            s->nms_weighted = strcmp(json_string_value(x), "weighted") == 0;
        } else if (strcmp(key, "nms_iou") == 0) {
            if (num_in(x, 0, 1, &s->nms_iou) != 0 || s->nms_iou <= 0)
                return bad(err, errlen, path, key, "expected a number in (0, 1]");
        } else if (strcmp(key, "max_crops") == 0) {
            if (int_in(x, 1, GW_DETECT_MAX_CROPS, &s->max_crops) != 0)
                return bad(err, errlen, path, key, "expected an integer in 1..64");
        } else if (strcmp(key, "padding") == 0) {
            if (num_in(x, 0, 4, &s->padding) != 0)
                return bad(err, errlen, path, key, "expected a number in [0, 4]");
        } else if (strcmp(key, "square") == 0) {
            if (get_bool(x, &s->square) != 0)
                return bad(err, errlen, path, key, "expected true or false");
        } else {
            return bad(err, errlen, path, key, "unknown field");
        }
    }
    if (!has_layout)
        s->layout = s->has_anchors ? GW_LAYOUT_SSD_ANCHORS : GW_LAYOUT_BOXES_SCORES;
    if (s->layout == GW_LAYOUT_YOLO) {
        /* One output holds the boxes and the scores. */
        const char *not_yolo[] = {"boxes", "scores", "labels", "anchors", "box_offset"};
        for (size_t i = 0; i < sizeof(not_yolo) / sizeof(not_yolo[0]); i++) {
            if (json_object_get(crops_of, not_yolo[i]) != NULL)
                return bad(err, errlen, path, not_yolo[i],
                           "not with layout \"yolo\" (its one output holds boxes and scores: "
                           "name it with \"output\")");
        }
        if (!has_format)
            s->format = GW_BOX_CXCYWH;
        if (!has_normalized)
            s->normalized = 0;
    } else {
        const char *yolo_only[] = {"output", "objectness", "transposed"};
        for (size_t i = 0; i < sizeof(yolo_only) / sizeof(yolo_only[0]); i++) {
            if (json_object_get(crops_of, yolo_only[i]) != NULL)
                return bad(err, errlen, path, yolo_only[i], "only with layout \"yolo\"");
        }
        if (s->nbox_parts == 0)
            return bad(err, errlen, path, "boxes", "required: the output(s) holding the boxes");
        if (s->nscore_parts == 0)
            return bad(err, errlen, path, "scores", "required: the output(s) holding the scores");
    }
    if (s->layout == GW_LAYOUT_SSD_ANCHORS && !s->has_anchors)
        return bad(err, errlen, path, "anchors",
                   "required with layout \"ssd_anchors\": \"" PRESET_FACE_FRONT
                   "\" or an object of MediaPipe's SSD anchor options");
    if (s->layout != GW_LAYOUT_SSD_ANCHORS && s->has_anchors)
        return bad(err, errlen, path, "anchors", "only with layout \"ssd_anchors\"");
    if (s->has_labels && s->layout != GW_LAYOUT_BOXES_SCORES)
        return bad(err, errlen, path, "labels", "only with layout \"boxes_scores\"");
    if (s->has_anchors) {
        if (!has_format)
            s->format = GW_BOX_CXCYWH;
        if (s->format != GW_BOX_CXCYWH && s->format != GW_BOX_CYCXHW)
            return bad(err, errlen, path, "format", "anchors need \"cxcywh\" or \"cycxhw\"");
        if (has_normalized && !s->normalized)
            return bad(err, errlen, path, "normalized", "anchors decode to normalized coordinates");
        s->normalized = 1;
        if (!has_scale[0])
            s->x_scale = s->anchors.input_w;
        if (!has_scale[1])
            s->y_scale = s->anchors.input_h;
        if (!has_scale[2])
            s->w_scale = s->anchors.input_w;
        if (!has_scale[3])
            s->h_scale = s->anchors.input_h;
    } else {
        const char *names[4] = {"x_scale", "y_scale", "w_scale", "h_scale"};
        for (int i = 0; i < 4; i++) {
            if (has_scale[i])
                return bad(err, errlen, path, names[i], "only with anchors");
        }
        if (s->exp_box_size)
            return bad(err, errlen, path, "exp_box_size", "only with anchors");
    }
    if (s->score_clip > 0 && !s->sigmoid)
        return bad(err, errlen, path, "score_clip", "only with sigmoid");
    return 0;
}

static json_t *parts_json(const gw_detect_part_t *p, int n)
{
    if (n == 1)
        return json_string(p[0].name);
    json_t *a = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(a, json_string(p[i].name));
    return a;
}

json_t *gw_crops_spec_json(const gw_crops_spec_t *s)
{
    json_t *o = json_object();
    json_object_set_new(o, "layout", json_string(gw_detect_layout_name(s->layout)));
    if (s->layout == GW_LAYOUT_YOLO) {
        if (s->output[0] != '\0')
            json_object_set_new(o, "output", json_string(s->output));
        json_object_set_new(o, "objectness", json_boolean(s->objectness));
        if (s->transposed >= 0)
            json_object_set_new(o, "transposed", json_boolean(s->transposed));
    } else {
        json_object_set_new(o, "boxes", parts_json(s->box_parts, s->nbox_parts));
        json_object_set_new(o, "scores", parts_json(s->score_parts, s->nscore_parts));
        json_object_set_new(o, "box_offset", json_integer(s->box_offset));
        if (s->has_labels)
            json_object_set_new(o, "labels", json_string(s->label_part.name));
    }
    if (s->nclasses_kept > 0) {
        json_t *cl = json_array();
        for (int i = 0; i < s->nclasses_kept; i++)
            json_array_append_new(cl, json_integer(s->classes_kept[i]));
        json_object_set_new(o, "classes", cl);
    }
    if (s->background >= 0)
        json_object_set_new(o, "background", json_integer(s->background));
    json_object_set_new(o, "format", json_string(gw_box_format_name(s->format)));
    json_object_set_new(o, "normalized", json_boolean(s->normalized));
    if (s->has_anchors) {
        if (s->anchors_preset[0] != '\0') {
            json_object_set_new(o, "anchors", json_string(s->anchors_preset));
        } else {
            const gw_ssd_anchors_t *a = &s->anchors;
            json_t *an = json_object(), *st = json_array(), *ar = json_array();
            for (int i = 0; i < a->num_layers; i++)
                json_array_append_new(st, json_integer(a->strides[i]));
            for (int i = 0; i < a->naspect_ratios; i++)
                json_array_append_new(ar, json_real(a->aspect_ratios[i]));
            json_object_set_new(an, "num_layers", json_integer(a->num_layers));
            json_object_set_new(an, "min_scale", json_real(a->min_scale));
            json_object_set_new(an, "max_scale", json_real(a->max_scale));
            json_object_set_new(an, "input_size_width", json_integer(a->input_w));
            json_object_set_new(an, "input_size_height", json_integer(a->input_h));
            json_object_set_new(an, "anchor_offset_x", json_real(a->anchor_offset_x));
            json_object_set_new(an, "anchor_offset_y", json_real(a->anchor_offset_y));
            json_object_set_new(an, "strides", st);
            json_object_set_new(an, "aspect_ratios", ar);
            json_object_set_new(an, "reduce_boxes_in_lowest_layer",
                                json_boolean(a->reduce_boxes_in_lowest_layer));
            json_object_set_new(an, "interpolated_scale_aspect_ratio",
                                json_real(a->interpolated_scale_aspect_ratio));
            json_object_set_new(an, "fixed_anchor_size", json_boolean(a->fixed_anchor_size));
            json_object_set_new(o, "anchors", an);
        }
        json_object_set_new(o, "x_scale", json_real(s->x_scale));
        json_object_set_new(o, "y_scale", json_real(s->y_scale));
        json_object_set_new(o, "w_scale", json_real(s->w_scale));
        json_object_set_new(o, "h_scale", json_real(s->h_scale));
        json_object_set_new(o, "exp_box_size", json_boolean(s->exp_box_size));
    }
    json_object_set_new(o, "sigmoid", json_boolean(s->sigmoid));
    if (s->sigmoid)
        json_object_set_new(o, "score_clip", json_real(s->score_clip));
    json_object_set_new(o, "score_threshold", json_real(s->score_threshold));
    json_object_set_new(o, "nms", json_string(s->nms_weighted ? "weighted" : "hard"));
    json_object_set_new(o, "nms_iou", json_real(s->nms_iou));
    json_object_set_new(o, "max_crops", json_integer(s->max_crops));
    json_object_set_new(o, "padding", json_real(s->padding));
    json_object_set_new(o, "square", json_boolean(s->square));
    return o;
}

/* ---- binding ------------------------------------------------------------- */

static const gw_output_t *find_output(const gw_output_t *outputs, int noutputs, const char *name,
                                      int64_t *off)
{
    int64_t o = 0;
    for (int i = 0; i < noutputs; i++) {
        if (strcmp(outputs[i].name, name) == 0) {
            *off = o;
            return &outputs[i];
        }
        o += outputs[i].elems;
    }
    return NULL;
}

static void dims_str(const gw_output_t *o, char *buf, size_t len)
{
    size_t n = (size_t)snprintf(buf, len, "[");
    for (int d = 0; d < o->ndims && n < len; d++)
        n += (size_t)snprintf(buf + n, len - n, "%s%lld", d ? ", " : "", (long long)o->dims[d]);
    if (n < len)
        snprintf(buf + n, len - n, "]");
}

/* YOLO's one output: [N, 4 + C, A] (v8), [N, A, 4 + C], or with an
 * objectness column [N, A, 5 + C] (v5). */
static int bind_yolo(gw_crops_spec_t *s, const char *det_name, const gw_output_t *outputs,
                     int noutputs, const char *path, char *err, size_t errlen)
{
    char why[512], dims[96];
    const char *name = s->output[0] != '\0' ? s->output : noutputs > 0 ? outputs[0].name : "";
    int64_t off = 0;
    const gw_output_t *o = find_output(outputs, noutputs, name, &off);
    if (o == NULL) {
        snprintf(why, sizeof(why), "model %s has no output \"%s\"", det_name, name);
        return bad(err, errlen, path, "output", why);
    }
    dims_str(o, dims, sizeof(dims));
    int head = 4 + s->objectness;
    if (o->ndims != 3 || o->dims[1] < 1 || o->dims[2] < 1 ||
        (s->transposed < 0 && o->dims[1] == o->dims[2])) {
        snprintf(why, sizeof(why),
                 "output \"%s\" is %s, expected [N, %s + C, A] (YOLOv8) or [N, A, %s + C]%s", name,
                 dims, s->objectness ? "5" : "4", s->objectness ? "5" : "4",
                 o->ndims == 3 && o->dims[1] == o->dims[2]
                     ? ": both axes are as long, say which is A with \"transposed\""
                     : "");
        return bad(err, errlen, path, "output", why);
    }
    int transposed = s->transposed >= 0 ? s->transposed : o->dims[1] > o->dims[2];
    int64_t attrs = transposed ? o->dims[2] : o->dims[1];
    int64_t na = transposed ? o->dims[1] : o->dims[2];
    if (attrs < head + 1 || na > INT32_MAX || attrs - head > INT32_MAX) {
        snprintf(why, sizeof(why),
                 "output \"%s\" is %s: %lld numbers per anchor, expected %d box numbers%s and at "
                 "least 1 class score (%s)",
                 name, dims, (long long)attrs, 4, s->objectness ? ", the objectness" : "",
                 transposed ? "[N, A, 4 + C]"
                            : "[N, 4 + C, A]; say \"transposed\": true for "
                              "[N, A, 4 + C]");
        return bad(err, errlen, path, "output", why);
    }
    int64_t kstride = transposed ? attrs : 1, jstride = transposed ? 1 : na;
    gw_detect_part_t box = {.off = off, .count = (int)na, .kstride = kstride, .jstride = jstride};
    snprintf(box.name, sizeof(box.name), "%s", name);
    s->box_parts[0] = box;
    s->nbox_parts = 1;
    s->obj_part = box;
    s->obj_part.off = off + 4 * jstride;
    s->score_parts[0] = box;
    s->score_parts[0].off = off + head * jstride;
    s->nscore_parts = 1;
    s->nclasses = (int)(attrs - head);
    s->nboxes = (int)na;
    s->box_stride = (int)attrs;
    return 0;
}

static int bind_boxes_scores(gw_crops_spec_t *s, const char *det_name, const gw_output_t *outputs,
                             int noutputs, const char *path, char *err, size_t errlen)
{
    char why[512], dims[96];
    int kb = 0, ks = 0;
    for (int pi = 0; pi < s->nbox_parts; pi++) {
        gw_detect_part_t *p = &s->box_parts[pi];
        const gw_output_t *o = find_output(outputs, noutputs, p->name, &p->off);
        if (o == NULL) {
            snprintf(why, sizeof(why), "model %s has no output \"%s\"", det_name, p->name);
            return bad(err, errlen, path, "boxes", why);
        }
        dims_str(o, dims, sizeof(dims));
        if (o->ndims != 3 || o->dims[1] < 1 || o->dims[2] < s->box_offset + 4) {
            snprintf(why, sizeof(why), "output \"%s\" is %s, expected [N, K, >= %d]%s", p->name,
                     dims, s->box_offset + 4,
                     o->ndims == 3 && o->dims[1] >= 4 && o->dims[1] < o->dims[2]
                         ? " (boxes and scores in one output [N, 4 + C, A] are layout \"yolo\")"
                         : "");
            return bad(err, errlen, path, "boxes", why);
        }
        if (pi > 0 && o->dims[2] != s->box_stride) {
            snprintf(why, sizeof(why), "output \"%s\" is %s, expected [N, K, %d] as the first",
                     p->name, dims, s->box_stride);
            return bad(err, errlen, path, "boxes", why);
        }
        s->box_stride = (int)o->dims[2];
        p->count = (int)o->dims[1];
        p->kstride = s->box_stride;
        p->jstride = 1;
        kb += p->count;
    }
    for (int pi = 0; pi < s->nscore_parts; pi++) {
        gw_detect_part_t *p = &s->score_parts[pi];
        const gw_output_t *o = find_output(outputs, noutputs, p->name, &p->off);
        if (o == NULL) {
            snprintf(why, sizeof(why), "model %s has no output \"%s\"", det_name, p->name);
            return bad(err, errlen, path, "scores", why);
        }
        dims_str(o, dims, sizeof(dims));
        for (int bi = 0; bi < s->nbox_parts; bi++) {
            if (strcmp(s->box_parts[bi].name, p->name) == 0) {
                snprintf(why, sizeof(why),
                         "output \"%s\" (%s) holds the boxes: one output of boxes and scores "
                         "[N, 4 + C, A] or [N, A, 4 + C] is layout \"yolo\"",
                         p->name, dims);
                return bad(err, errlen, path, "scores", why);
            }
        }
        int64_t c = o->ndims == 3 ? o->dims[2] : 1;
        if (!(o->ndims == 2 || o->ndims == 3) || o->dims[1] < 1 || c < 1 || c > INT32_MAX) {
            snprintf(why, sizeof(why),
                     "output \"%s\" is %s, expected [N, K], [N, K, 1] or per class [N, K, C]",
                     p->name, dims);
            return bad(err, errlen, path, "scores", why);
        }
        if (pi > 0 && c != s->nclasses) {
            snprintf(why, sizeof(why), "output \"%s\" is %s, expected %d classes as the first",
                     p->name, dims, s->nclasses);
            return bad(err, errlen, path, "scores", why);
        }
        s->nclasses = (int)c;
        p->count = (int)o->dims[1];
        p->kstride = c;
        p->jstride = 1;
        ks += p->count;
    }
    if (kb != ks) {
        snprintf(why, sizeof(why), "%d scores for %d boxes", ks, kb);
        return bad(err, errlen, path, "scores", why);
    }
    if (s->has_labels) {
        gw_detect_part_t *p = &s->label_part;
        const gw_output_t *o = find_output(outputs, noutputs, p->name, &p->off);
        if (o == NULL) {
            snprintf(why, sizeof(why), "model %s has no output \"%s\"", det_name, p->name);
            return bad(err, errlen, path, "labels", why);
        }
        dims_str(o, dims, sizeof(dims));
        if (!(o->ndims == 2 || (o->ndims == 3 && o->dims[2] == 1)) || o->dims[1] != kb) {
            snprintf(why, sizeof(why), "output \"%s\" is %s, expected [N, %d]: a class per box",
                     p->name, dims, kb);
            return bad(err, errlen, path, "labels", why);
        }
        if (s->nclasses != 1) {
            snprintf(why, sizeof(why),
                     "with per-class scores (%d classes) a box's class is its best-scored one: "
                     "leave labels out, or give scores [N, K]",
                     s->nclasses);
            return bad(err, errlen, path, "labels", why);
        }
        p->count = kb;
        p->kstride = 1;
        p->jstride = 1;
    }
    if (s->has_anchors) {
        int na = gw_ssd_anchors_generate(&s->anchors, NULL, 0);
        if (na != kb) {
            snprintf(why, sizeof(why), "%d anchors for %d boxes", na, kb);
            return bad(err, errlen, path, "anchors", why);
        }
    }
    s->nboxes = kb;
    return 0;
}

int gw_crops_spec_bind(gw_crops_spec_t *s, const char *det_name, const gw_output_t *outputs,
                       int noutputs, const char *path, char *err, size_t errlen)
{
    s->bound = 0;
    int rc = s->layout == GW_LAYOUT_YOLO
                 ? bind_yolo(s, det_name, outputs, noutputs, path, err, errlen)
                 : bind_boxes_scores(s, det_name, outputs, noutputs, path, err, errlen);
    if (rc != 0)
        return rc;
    if (s->background >= 0 && !s->has_labels && (s->nclasses < 2 || s->background >= s->nclasses)) {
        char why[160];
        snprintf(why, sizeof(why), "class %d, but the detector scores %d class%s (0..%d)",
                 s->background, s->nclasses, s->nclasses == 1 ? "" : "es", s->nclasses - 1);
        return bad(err, errlen, path, "background", why);
    }
    for (int i = 0; i < s->nclasses_kept && !s->has_labels; i++) {
        if (s->classes_kept[i] >= s->nclasses) {
            char why[160];
            snprintf(why, sizeof(why), "class %d, but the detector scores %d classes (0..%d)",
                     s->classes_kept[i], s->nclasses, s->nclasses - 1);
            return bad(err, errlen, path, "classes", why);
        }
    }
    s->bound = 1;
    return 0;
}

/* ---- decoding ------------------------------------------------------------ */

typedef struct {
    float x0, y0, x1, y1; /* normalized coordinates of the model input */
    float score;
    int k;
    int cls;
} cand_t;

/* Where box (anchor) k of the concatenated parts starts. */
static const gw_detect_part_t *part_at(const gw_detect_part_t *parts, int n, const float *row,
                                       int k, const float **at)
{
    for (int i = 0; i < n; i++) {
        if (k < parts[i].count) {
            *at = row + parts[i].off + (int64_t)k * parts[i].kstride;
            return &parts[i];
        }
        k -= parts[i].count;
    }
    *at = NULL;
    return NULL;
}

/* The four box numbers of box k, from box_offset on. */
static void box_at(const gw_crops_spec_t *s, const float *row, int k, float b[4])
{
    const float *at;
    const gw_detect_part_t *p = part_at(s->box_parts, s->nbox_parts, row, k, &at);
    at += (int64_t)s->box_offset * p->jstride;
    for (int i = 0; i < 4; i++)
        b[i] = at[i * p->jstride];
}

static float score_of(const gw_crops_spec_t *s, float v)
{
    if (!s->sigmoid)
        return v;
    if (s->score_clip > 0) {
        float c = (float)s->score_clip;
        v = v < -c ? -c : v > c ? c : v;
    }
    return 1.0f / (1.0f + expf(-v));
}

typedef struct {
    const gw_crops_spec_t *s;
    const float *row;
    cand_t *c;
    int n, next;
} decode_arg_t;

/* Anchor decoding of the candidates (sorted by k) as the walk passes them. */
static void decode_anchor(void *arg, int k, const gw_anchor_t *an)
{
    decode_arg_t *d = arg;
    if (d->next >= d->n || d->c[d->next].k != k)
        return;
    const gw_crops_spec_t *s = d->s;
    cand_t *c = &d->c[d->next++];
    float b[4];
    box_at(s, d->row, k, b);
    int yx = s->format == GW_BOX_CYCXHW;
    float cx = b[yx ? 1 : 0], cy = b[yx ? 0 : 1], w = b[yx ? 3 : 2], h = b[yx ? 2 : 3];
    cx = cx / (float)s->x_scale * an->w + an->cx;
    cy = cy / (float)s->y_scale * an->h + an->cy;
    if (s->exp_box_size) {
        w = expf(w / (float)s->w_scale) * an->w;
        h = expf(h / (float)s->h_scale) * an->h;
    } else {
        w = w / (float)s->w_scale * an->w;
        h = h / (float)s->h_scale * an->h;
    }
    c->x0 = cx - w / 2;
    c->y0 = cy - h / 2;
    c->x1 = cx + w / 2;
    c->y1 = cy + h / 2;
}

static void decode_plain(const gw_crops_spec_t *s, const float *row, cand_t *c, int in_w, int in_h)
{
    float b[4];
    box_at(s, row, c->k, b);
    float x0, y0, x1, y1;
    switch (s->format) {
    case GW_BOX_XYXY:
        x0 = b[0], y0 = b[1], x1 = b[2], y1 = b[3];
        break;
    case GW_BOX_YXYX:
        y0 = b[0], x0 = b[1], y1 = b[2], x1 = b[3];
        break;
    case GW_BOX_CXCYWH:
        x0 = b[0] - b[2] / 2, y0 = b[1] - b[3] / 2, x1 = b[0] + b[2] / 2, y1 = b[1] + b[3] / 2;
        break;
    default: /* GW_BOX_CYCXHW */
        y0 = b[0] - b[2] / 2, x0 = b[1] - b[3] / 2, y1 = b[0] + b[2] / 2, x1 = b[1] + b[3] / 2;
        break;
    }
    if (!s->normalized) {
        x0 /= (float)in_w, x1 /= (float)in_w;
        y0 /= (float)in_h, y1 /= (float)in_h;
    }
    c->x0 = x0 < x1 ? x0 : x1;
    c->x1 = x0 < x1 ? x1 : x0;
    c->y0 = y0 < y1 ? y0 : y1;
    c->y1 = y0 < y1 ? y1 : y0;
}

static int by_score(const void *pa, const void *pb)
{
    const cand_t *a = pa, *b = pb;
    if (a->score != b->score)
        return a->score > b->score ? -1 : 1;
    return a->k < b->k ? -1 : a->k > b->k;
}

static float iou(const cand_t *a, const cand_t *b)
{
    float iw = fminf(a->x1, b->x1) - fmaxf(a->x0, b->x0);
    float ih = fminf(a->y1, b->y1) - fmaxf(a->y0, b->y0);
    if (iw <= 0 || ih <= 0)
        return 0;
    float inter = iw * ih;
    float uni = (a->x1 - a->x0) * (a->y1 - a->y0) + (b->x1 - b->x0) * (b->y1 - b->y0) - inter;
    return uni > 0 ? inter / uni : 0;
}

static void emit(gw_detection_t *d, const cand_t *c, int img_w, int img_h)
{
    d->x0 = c->x0 * (float)img_w;
    d->y0 = c->y0 * (float)img_h;
    d->x1 = c->x1 * (float)img_w;
    d->y1 = c->y1 * (float)img_h;
    d->score = c->score;
    d->index = c->k;
    d->label = c->cls;
}

static int class_kept(const gw_crops_spec_t *s, int cls)
{
    if (s->nclasses_kept == 0)
        return 1;
    for (int i = 0; i < s->nclasses_kept; i++) {
        if (s->classes_kept[i] == cls)
            return 1;
    }
    return 0;
}

/* Box k's score and class: its best class's score but the background's
 * (times its objectness with YOLOv5's), or its one score and its label. 0
 * when it is dropped (below the threshold, NaN, of a class not kept, or
 * labelled the background). */
static int score_box(const gw_crops_spec_t *s, const float *row, int k, float *score, int *cls)
{
    const float *at;
    const gw_detect_part_t *p = part_at(s->score_parts, s->nscore_parts, row, k, &at);
    int bc = s->background == 0 && s->nclasses > 1 ? 1 : 0;
    float best = score_of(s, at[(int64_t)bc * p->jstride]);
    for (int c = bc + 1; c < s->nclasses; c++) {
        if (c == s->background)
            continue;
        float v = score_of(s, at[(int64_t)c * p->jstride]);
        if (v > best || best != best)
            best = v, bc = c;
    }
    if (s->objectness) {
        const float *o = row + s->obj_part.off + (int64_t)k * s->obj_part.kstride;
        best *= score_of(s, *o);
    }
    if (s->has_labels) {
        float l = row[s->label_part.off + k];
        bc = l >= 0 && l < (float)(1 << 24) ? (int)lrintf(l) : -1;
    }
    if (!(best >= (float)s->score_threshold) || !class_kept(s, bc) ||
        (s->has_labels && bc == s->background)) /* false for NaN */
        return 0;
    *score = best;
    *cls = bc;
    return 1;
}

int gw_detect(const gw_crops_spec_t *s, const float *row, int in_w, int in_h, int img_w, int img_h,
              gw_detection_t *out, int max)
{
    if (s == NULL || !s->bound || row == NULL || in_w < 1 || in_h < 1 || img_w < 1 || img_h < 1 ||
        max < 0 || (max > 0 && out == NULL))
        return SQ_INVAL;
    if (max > s->max_crops)
        max = s->max_crops;
    if (max == 0)
        return 0;
    cand_t *c = malloc(sizeof(cand_t) * (size_t)s->nboxes);
    if (c == NULL)
        return SQ_NOMEM;
    int n = 0;
    for (int k = 0; k < s->nboxes; k++) {
        if (score_box(s, row, k, &c[n].score, &c[n].cls))
            c[n++].k = k;
    }
    if (s->has_anchors) {
        decode_arg_t d = {s, row, c, n, 0};
        anchors_walk(&s->anchors, decode_anchor, &d);
    } else {
        for (int i = 0; i < n; i++)
            decode_plain(s, row, &c[i], in_w, in_h);
    }
    qsort(c, (size_t)n, sizeof(cand_t), by_score);
    float nms = (float)s->nms_iou;
    int got = 0;
    if (!s->nms_weighted) {
        /* Hard NMS per class: a kept box suppresses every lower one of its
         * class overlapping it. */
        for (int i = 0; i < n && got < max; i++) {
            if (c[i].k < 0)
                continue;
            emit(&out[got++], &c[i], img_w, img_h);
            for (int j = i + 1; j < n; j++) {
                if (c[j].k >= 0 && c[j].cls == c[i].cls && iou(&c[i], &c[j]) > nms)
                    c[j].k = -1;
            }
        }
    } else {
        /* MediaPipe's weighted NMS: the top box and those of its class
         * overlapping it leave together; the detection has the top score
         * and their score-weighted mean box. */
        for (int i = 0; i < n && got < max; i++) {
            if (c[i].k < 0)
                continue;
            cand_t top = c[i];
            double sw = c[i].score, x0 = c[i].x0 * sw, y0 = c[i].y0 * sw, x1 = c[i].x1 * sw,
                   y1 = c[i].y1 * sw;
            for (int j = i + 1; j < n; j++) {
                if (c[j].k < 0 || c[j].cls != top.cls || iou(&top, &c[j]) <= nms)
                    continue;
                double w = c[j].score;
                sw += w;
                x0 += c[j].x0 * w, y0 += c[j].y0 * w, x1 += c[j].x1 * w, y1 += c[j].y1 * w;
                c[j].k = -1;
            }
            if (sw > 0) {
                top.x0 = (float)(x0 / sw), top.y0 = (float)(y0 / sw);
                top.x1 = (float)(x1 / sw), top.y1 = (float)(y1 / sw);
            }
            emit(&out[got++], &top, img_w, img_h);
        }
    }
    free(c);
    return got;
}
