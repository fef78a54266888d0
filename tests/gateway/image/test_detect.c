/* gateway/image/detect.c: crops_of parsing and binding, SSD anchors, box
 * decoding, hard and weighted NMS, on hand-made output rows (the crops
 * themselves: test_crops.c). The decoder against ONNX Runtime and the
 * real BlazeFace is tests/gateway/image/test_detect_reference.py. */
#include <criterion/criterion.h>
#include <gw_catalog.h>
#include <gw_image.h>
#include <sq.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static json_t *js(const char *text)
{
    json_error_t e;
    json_t *v = json_loads(text, 0, &e);
    cr_assert_not_null(v, "bad test JSON %s: %s", text, e.text);
    return v;
}

static int parse(const char *text, gw_crops_spec_t *s, char *err, size_t errlen)
{
    json_t *v = js(text);
    err[0] = '\0';
    int rc = gw_crops_spec_parse(v, "stages[1].crops_of", s, err, errlen);
    json_decref(v);
    return rc;
}

static void parse_ok(const char *text, gw_crops_spec_t *s)
{
    char err[256];
    cr_assert_eq(parse(text, s, err, sizeof(err)), 0, "%s: %s", text, err);
}

/* A model whose outputs are given as "name:d0xd1x..." strings, in order. */
static gw_model_t model_of(int n, const char *const *outs)
{
    gw_model_t m;
    memset(&m, 0, sizeof(m));
    snprintf(m.name, sizeof(m.name), "det");
    for (int i = 0; i < n; i++) {
        gw_output_t *o = &m.outputs[m.noutputs++];
        const char *colon = strchr(outs[i], ':');
        snprintf(o->name, sizeof(o->name), "%.*s", (int)(colon - outs[i]), outs[i]);
        o->elems = 1;
        for (const char *p = colon + 1; *p;) {
            char *end;
            o->dims[o->ndims] = strtoll(p, &end, 10);
            if (o->ndims++ > 0)
                o->elems *= o->dims[o->ndims - 1];
            p = *end == 'x' ? end + 1 : end;
        }
    }
    return m;
}

static int64_t row_len(const gw_model_t *m)
{
    int64_t n = 0;
    for (int i = 0; i < m->noutputs; i++)
        n += m->outputs[i].elems;
    return n;
}

static void bind_ok(gw_crops_spec_t *s, const gw_model_t *m)
{
    char err[256];
    cr_assert_eq(gw_crops_spec_bind(s, m->name, m->outputs, m->noutputs, "stages[1].crops_of", err,
                                    sizeof(err)),
                 0, "%s", err);
}

/* ---- parsing ---------------------------------------------------------- */

Test(detect, parse_errors_name_the_field)
{
    static const struct {
        const char *json, *err;
    } cases[] = {
        {"[]", "stages[1].crops_of: expected an object"},
        {"{\"scores\": \"s\"}", "stages[1].crops_of.boxes: required"},
        {"{\"boxes\": \"b\"}", "stages[1].crops_of.scores: required"},
        {"{\"boxes\": 3, \"scores\": \"s\"}", "stages[1].crops_of.boxes: expected an output name"},
        {"{\"boxes\": [], \"scores\": \"s\"}", "stages[1].crops_of.boxes: expected"},
        {"{\"boxes\": \"b\", \"scores\": [\"a\", 1]}", "stages[1].crops_of.scores: expected"},
        {"{\"boxes\": \"b\", \"scores\": \"s\", \"nms_iou\": 0}",
         "stages[1].crops_of.nms_iou: expected a number in (0, 1]"},
        {"{\"boxes\": \"b\", \"scores\": \"s\", \"nms_iou\": 1.5}",
         "stages[1].crops_of.nms_iou: expected a number in (0, 1]"},
        {"{\"boxes\": \"b\", \"scores\": \"s\", \"nms\": \"soft\"}",
         "stages[1].crops_of.nms: expected \"hard\" or \"weighted\""},
        {"{\"boxes\": \"b\", \"scores\": \"s\", \"format\": \"xywh\"}",
         "stages[1].crops_of.format: expected"},
        {"{\"boxes\": \"b\", \"scores\": \"s\", \"max_crops\": 0}",
         "stages[1].crops_of.max_crops: expected an integer in 1..64"},
        {"{\"boxes\": \"b\", \"scores\": \"s\", \"max_crops\": 65}",
         "stages[1].crops_of.max_crops: expected an integer in 1..64"},
        {"{\"boxes\": \"b\", \"scores\": \"s\", \"padding\": -0.1}",
         "stages[1].crops_of.padding: expected a number in [0, 4]"},
        {"{\"boxes\": \"b\", \"scores\": \"s\", \"square\": 1}",
         "stages[1].crops_of.square: expected true or false"},
        {"{\"boxes\": \"b\", \"scores\": \"s\", \"box_offset\": -1}",
         "stages[1].crops_of.box_offset: expected an integer"},
        {"{\"boxes\": \"b\", \"scores\": \"s\", \"score_threshold\": \"high\"}",
         "stages[1].crops_of.score_threshold: expected a number"},
        {"{\"boxes\": \"b\", \"scores\": \"s\", \"score_clip\": 100}",
         "stages[1].crops_of.score_clip: only with sigmoid"},
        {"{\"boxes\": \"b\", \"scores\": \"s\", \"x_scale\": 128}",
         "stages[1].crops_of.x_scale: only with anchors"},
        {"{\"boxes\": \"b\", \"scores\": \"s\", \"nmsiou\": 0.3}",
         "stages[1].crops_of.nmsiou: unknown field"},
        {"{\"boxes\": \"b\", \"scores\": \"s\", \"anchors\": \"yolo\"}",
         "stages[1].crops_of.anchors: expected \"mediapipe_face_front_128\""},
        {"{\"boxes\": \"b\", \"scores\": \"s\", \"anchors\": \"mediapipe_face_front_128\", "
         "\"format\": \"xyxy\"}",
         "stages[1].crops_of.format: anchors need \"cxcywh\" or \"cycxhw\""},
        {"{\"boxes\": \"b\", \"scores\": \"s\", \"anchors\": \"mediapipe_face_front_128\", "
         "\"normalized\": false}",
         "stages[1].crops_of.normalized: anchors decode to normalized coordinates"},
        {"{\"boxes\": \"b\", \"scores\": \"s\", \"anchors\": {\"num_layers\": 2}}",
         "stages[1].crops_of.anchors.min_scale: required"},
        {"{\"boxes\": \"b\", \"scores\": \"s\", \"anchors\": {\"num_layers\": 2, \"min_scale\": "
         "0.1, \"max_scale\": 0.5, \"input_size_width\": 64, \"input_size_height\": 64, "
         "\"strides\": [8]}}",
         "stages[1].crops_of.anchors.strides: expected num_layers strides"},
        {"{\"boxes\": \"b\", \"scores\": \"s\", \"anchors\": {\"num_layers\": 1, \"min_scale\": "
         "0.1, \"max_scale\": 0.5, \"input_size_width\": 64, \"input_size_height\": 64, "
         "\"strides\": [8], \"stride\": 8}}",
         "stages[1].crops_of.anchors.stride: unknown field"},
        {"{\"boxes\": \"b\", \"scores\": \"s\", \"anchors\": {\"num_layers\": 1, \"min_scale\": "
         "0.1, \"max_scale\": 0.5, \"input_size_width\": 64, \"input_size_height\": 64, "
         "\"strides\": [8], \"anchor_offset_y\": 2}}",
         "stages[1].crops_of.anchors.anchor_offset_y: expected a number in [0, 1]"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        gw_crops_spec_t s;
        char err[256];
        cr_assert_eq(parse(cases[i].json, &s, err, sizeof(err)), SQ_BAD_CONFIG, "%s",
                     cases[i].json);
        cr_assert(strncmp(err, cases[i].err, strlen(cases[i].err)) == 0, "%s: got \"%s\"",
                  cases[i].json, err);
    }
}

Test(detect, parse_defaults_and_stage_field)
{
    gw_crops_spec_t s;
    parse_ok("{\"stage\": \"det\", \"boxes\": \"b\", \"scores\": [\"s1\", \"s2\"]}", &s);
    cr_assert_eq(s.nbox_parts, 1);
    cr_assert_str_eq(s.box_parts[0].name, "b");
    cr_assert_eq(s.nscore_parts, 2);
    cr_assert_str_eq(s.score_parts[1].name, "s2");
    cr_assert_eq(s.format, GW_BOX_XYXY);
    cr_assert_eq(s.normalized, 1);
    cr_assert_eq(s.box_offset, 0);
    cr_assert_eq(s.has_anchors, 0);
    cr_assert_eq(s.sigmoid, 0);
    cr_assert_eq(s.score_threshold, 0.5);
    cr_assert_eq(s.nms_weighted, 0);
    cr_assert_eq(s.nms_iou, 0.5);
    cr_assert_eq(s.max_crops, 8);
    cr_assert_eq(s.padding, 0);
    cr_assert_eq(s.square, 0);
    /* With anchors: cxcywh and the scales from the anchors' input size. */
    parse_ok("{\"boxes\": \"b\", \"scores\": \"s\", \"anchors\": \"mediapipe_face_front_128\"}",
             &s);
    cr_assert_eq(s.format, GW_BOX_CXCYWH);
    cr_assert_eq(s.x_scale, 128);
    cr_assert_eq(s.h_scale, 128);
}

static void round_trip(const char *text)
{
    gw_crops_spec_t a, b;
    char err[256];
    parse_ok(text, &a);
    json_t *j = gw_crops_spec_json(&a);
    cr_assert_eq(gw_crops_spec_parse(j, "x", &b, err, sizeof(err)), 0, "%s", err);
    char *dump = json_dumps(j, JSON_SORT_KEYS);
    cr_assert(memcmp(&a, &b, sizeof(a)) == 0, "%s -> %s parses differently", text, dump);
    free(dump);
    json_decref(j);
}

Test(detect, json_round_trips)
{
    round_trip("{\"boxes\": \"b\", \"scores\": \"s\"}");
    round_trip("{\"boxes\": [\"b1\", \"b2\"], \"scores\": [\"s1\", \"s2\"], \"format\": \"yxyx\", "
               "\"normalized\": false, \"box_offset\": 3, \"sigmoid\": true, \"score_clip\": 50, "
               "\"score_threshold\": 0.25, \"nms\": \"weighted\", \"nms_iou\": 0.3, "
               "\"max_crops\": 5, \"padding\": 0.2, \"square\": true}");
    round_trip("{\"boxes\": \"b\", \"scores\": \"s\", \"anchors\": \"mediapipe_face_front_128\", "
               "\"sigmoid\": true, \"score_clip\": 100, \"score_threshold\": 0.75, \"nms\": "
               "\"weighted\", \"nms_iou\": 0.3}");
    round_trip("{\"boxes\": \"b\", \"scores\": \"s\", \"format\": \"cycxhw\", \"anchors\": "
               "{\"num_layers\": 2, \"min_scale\": 0.2, \"max_scale\": 0.9, "
               "\"input_size_width\": 300, \"input_size_height\": 200, \"strides\": [16, 32], "
               "\"aspect_ratios\": [1, 2, 0.5], \"reduce_boxes_in_lowest_layer\": true, "
               "\"interpolated_scale_aspect_ratio\": 0}, \"x_scale\": 10, \"y_scale\": 10, "
               "\"w_scale\": 5, \"h_scale\": 5, \"exp_box_size\": true}");
}

/* ---- anchors ----------------------------------------------------------- */

Test(detect, face_front_anchors_follow_mediapipe)
{
    gw_ssd_anchors_t a;
    gw_ssd_anchors_face_front_128(&a);
    gw_anchor_t an[900];
    cr_assert_eq(gw_ssd_anchors_generate(&a, NULL, 0), 896);
    cr_assert_eq(gw_ssd_anchors_generate(&a, an, 900), 896);
    /* Stride 8: a 16x16 map, 2 anchors a cell (aspect ratio 1 and the
     * interpolated one); stride 16 (layers 1..3 grouped): 8x8, 6 a cell.
     * Centers (x + 0.5) / map size; fixed size 1x1. */
    cr_assert_float_eq(an[0].cx, 0.5f / 16, 1e-7);
    cr_assert_float_eq(an[0].cy, 0.5f / 16, 1e-7);
    cr_assert_eq(an[0].w, 1.0f);
    cr_assert_eq(an[0].h, 1.0f);
    cr_assert_eq(an[1].cx, an[0].cx);
    cr_assert_float_eq(an[2].cx, 1.5f / 16, 1e-7);  /* next cell in the row */
    cr_assert_float_eq(an[32].cy, 1.5f / 16, 1e-7); /* next row */
    cr_assert_float_eq(an[511].cx, 15.5f / 16, 1e-7);
    cr_assert_float_eq(an[512].cx, 0.5f / 8, 1e-7);
    cr_assert_float_eq(an[517].cx, 0.5f / 8, 1e-7);
    cr_assert_float_eq(an[518].cx, 1.5f / 8, 1e-7);
    cr_assert_float_eq(an[895].cx, 7.5f / 8, 1e-7);
    cr_assert_float_eq(an[895].cy, 7.5f / 8, 1e-7);
    /* Without fixed_anchor_size the sizes are MediaPipe's scales:
     * scale_i = min + (max - min) * i / (layers - 1), the interpolated
     * anchor sqrt(scale_i * scale_i+1) (1.0 after the last layer). */
    a.fixed_anchor_size = 0;
    gw_ssd_anchors_generate(&a, an, 900);
    double s[4];
    for (int i = 0; i < 4; i++)
        s[i] = 0.1484375 + (0.75 - 0.1484375) * i / 3.0;
    cr_assert_float_eq(an[0].w, s[0], 1e-6);
    cr_assert_float_eq(an[1].w, sqrt(s[0] * s[1]), 1e-6);
    cr_assert_float_eq(an[512].w, s[1], 1e-6);
    cr_assert_float_eq(an[513].w, sqrt(s[1] * s[2]), 1e-6);
    cr_assert_float_eq(an[516].h, s[3], 1e-6);
    cr_assert_float_eq(an[895].w, sqrt(s[3] * 1.0), 1e-6);
    /* Aspect ratio r: w = scale * sqrt(r), h = scale / sqrt(r). */
    a.naspect_ratios = 2;
    a.aspect_ratios[1] = 4.0;
    cr_assert_eq(gw_ssd_anchors_generate(&a, an, 900), 16 * 16 * 3 + 8 * 8 * 9);
    cr_assert_float_eq(an[1].w, s[0] * 2, 1e-6);
    cr_assert_float_eq(an[1].h, s[0] / 2, 1e-6);
}

/* ---- decoding ---------------------------------------------------------- */

/* One box (K = 1) in a model with an unrelated output first, so that the
 * offsets are exercised: outputs "extra" [1,3], "boxes" [1,1,C], "scores"
 * [1,1,1]. Decoded with model input 200x100, image 400x300. */
static void one_box(const char *spec, int c, const float *box, gw_detection_t *d)
{
    char bdims[32];
    snprintf(bdims, sizeof(bdims), "boxes:1x1x%d", c);
    const char *outs[] = {"extra:1x3", bdims, "scores:1x1x1"};
    gw_model_t m = model_of(3, outs);
    float row[32] = {7, 7, 7};
    memcpy(row + 3, box, sizeof(float) * (size_t)c);
    row[3 + c] = 0.9f;
    cr_assert_eq(row_len(&m), 3 + c + 1);
    gw_crops_spec_t s;
    parse_ok(spec, &s);
    bind_ok(&s, &m);
    cr_assert_eq(s.box_parts[0].off, 3);
    cr_assert_eq(s.score_parts[0].off, 3 + c);
    cr_assert_eq(gw_detect(&s, row, 200, 100, 400, 300, d, 4), 1, "%s", spec);
    cr_assert_float_eq(d->score, 0.9f, 1e-6);
}

static void assert_box(const gw_detection_t *d, float x0, float y0, float x1, float y1)
{
    cr_assert(fabsf(d->x0 - x0) < 1e-3 && fabsf(d->y0 - y0) < 1e-3 && fabsf(d->x1 - x1) < 1e-3 &&
                  fabsf(d->y1 - y1) < 1e-3,
              "got (%g, %g, %g, %g), expected (%g, %g, %g, %g)", d->x0, d->y0, d->x1, d->y1, x0, y0,
              x1, y1);
}

Test(detect, decodes_each_format_and_normalization)
{
    /* Every case is the box x 0.1..0.5, y 0.2..0.6 of the model input:
     * (40, 60)-(200, 180) in the 400x300 image. */
    gw_detection_t d;
    one_box("{\"boxes\": \"boxes\", \"scores\": \"scores\"}", 4, (float[]){.1f, .2f, .5f, .6f}, &d);
    assert_box(&d, 40, 60, 200, 180);
    one_box("{\"boxes\": \"boxes\", \"scores\": \"scores\", \"format\": \"cxcywh\"}", 4,
            (float[]){.3f, .4f, .4f, .4f}, &d);
    assert_box(&d, 40, 60, 200, 180);
    one_box("{\"boxes\": \"boxes\", \"scores\": \"scores\", \"format\": \"yxyx\"}", 4,
            (float[]){.2f, .1f, .6f, .5f}, &d);
    assert_box(&d, 40, 60, 200, 180);
    one_box("{\"boxes\": \"boxes\", \"scores\": \"scores\", \"format\": \"cycxhw\"}", 4,
            (float[]){.4f, .3f, .4f, .4f}, &d);
    assert_box(&d, 40, 60, 200, 180);
    /* Pixels of the 200x100 model input. */
    one_box("{\"boxes\": \"boxes\", \"scores\": \"scores\", \"normalized\": false}", 4,
            (float[]){20, 20, 100, 60}, &d);
    assert_box(&d, 40, 60, 200, 180);
    one_box("{\"boxes\": \"boxes\", \"scores\": \"scores\", \"normalized\": false, "
            "\"format\": \"cxcywh\"}",
            4, (float[]){60, 40, 80, 40}, &d);
    assert_box(&d, 40, 60, 200, 180);
    one_box("{\"boxes\": \"boxes\", \"scores\": \"scores\", \"normalized\": false, "
            "\"format\": \"yxyx\"}",
            4, (float[]){20, 20, 60, 100}, &d);
    assert_box(&d, 40, 60, 200, 180);
    /* box_offset: the coordinates after two other numbers (YOLO-style rows
     * carry them first or last), extra numbers after them. */
    one_box("{\"boxes\": \"boxes\", \"scores\": \"scores\", \"box_offset\": 2}", 7,
            (float[]){9, 9, .1f, .2f, .5f, .6f, 9}, &d);
    assert_box(&d, 40, 60, 200, 180);
    /* Swapped corners come out ordered. */
    one_box("{\"boxes\": \"boxes\", \"scores\": \"scores\"}", 4, (float[]){.5f, .6f, .1f, .2f}, &d);
    assert_box(&d, 40, 60, 200, 180);
}

Test(detect, decodes_against_anchors_with_sigmoid_scores)
{
    /* The BlazeFace layout of the ONNX export: scores split 512 + 384,
     * boxes likewise, scores first. */
    const char *outs[] = {"s8:1x512x1", "s16:1x384x1", "b8:1x512x16", "b16:1x384x16"};
    gw_model_t m = model_of(4, outs);
    gw_crops_spec_t s;
    parse_ok("{\"boxes\": [\"b8\", \"b16\"], \"scores\": [\"s8\", \"s16\"], \"anchors\": "
             "\"mediapipe_face_front_128\", \"sigmoid\": true, \"score_clip\": 100, "
             "\"score_threshold\": 0.75}",
             &s);
    bind_ok(&s, &m);
    cr_assert_eq(s.nboxes, 896);
    cr_assert_eq(s.box_stride, 16);
    cr_assert_eq(s.box_parts[1].off, 896 + 512 * 16);
    float *row = calloc((size_t)row_len(&m), sizeof(float));
    for (int k = 0; k < 896; k++)
        row[k] = -5; /* sigmoid 0.0067 */
    /* k = 0: anchor (1/32, 1/32); raw cx 12.8 px, cy -6.4 px, w 25.6, h 51.2
     * with scales 128 -> cx 0.13125, cy -0.01875, w 0.2, h 0.4. */
    row[0] = 3; /* 0.9526 */
    float *b0 = row + 896;
    b0[0] = 12.8f, b0[1] = -6.4f, b0[2] = 25.6f, b0[3] = 51.2f;
    /* k = 895: anchor (15/16, 15/16); raw 0 offsets, w = h = 12.8 px; a
     * logit of 1000 is clipped to 100 (sigmoid 1). */
    row[895] = 1000;
    float *b1 = row + 896 + 512 * 16 + 383 * 16;
    b1[2] = 12.8f, b1[3] = 12.8f;
    /* k = 600: 0.73, under the threshold. */
    row[600] = 1;
    gw_detection_t d[8];
    cr_assert_eq(gw_detect(&s, row, 128, 128, 640, 480, d, 8), 2);
    cr_assert_eq(d[0].index, 895);
    cr_assert_float_eq(d[0].score, 1.0f, 1e-6);
    assert_box(&d[0], (0.9375f - 0.05f) * 640, (0.9375f - 0.05f) * 480, (0.9375f + 0.05f) * 640,
               (0.9375f + 0.05f) * 480);
    cr_assert_eq(d[1].index, 0);
    cr_assert_float_eq(d[1].score, 1 / (1 + expf(-3)), 1e-6);
    assert_box(&d[1], (0.13125f - 0.1f) * 640, (-0.01875f - 0.2f) * 480, (0.13125f + 0.1f) * 640,
               (-0.01875f + 0.2f) * 480);
    /* cycxhw: the same numbers read as y, x, h, w. */
    parse_ok("{\"boxes\": [\"b8\", \"b16\"], \"scores\": [\"s8\", \"s16\"], \"anchors\": "
             "\"mediapipe_face_front_128\", \"format\": \"cycxhw\", \"sigmoid\": true, "
             "\"score_threshold\": 0.9}",
             &s);
    bind_ok(&s, &m);
    row[895] = -5;
    cr_assert_eq(gw_detect(&s, row, 128, 128, 640, 480, d, 8), 1);
    assert_box(&d[0], (0.03125f - 6.4f / 128 - 0.2f) * 640, (0.03125f + 0.1f - 0.1f) * 480,
               (0.03125f - 6.4f / 128 + 0.2f) * 640, (0.03125f + 0.1f + 0.1f) * 480);
    free(row);
}

/* K boxes in pixels of a 100x100 input and image (no mapping). */
static int detect_boxes(const char *spec, int k, const float (*boxes)[4], const float *scores,
                        gw_detection_t *d, int max)
{
    char bd[32], sd[32];
    snprintf(bd, sizeof(bd), "boxes:1x%dx4", k);
    snprintf(sd, sizeof(sd), "scores:1x%d", k);
    const char *outs[] = {bd, sd};
    gw_model_t m = model_of(2, outs);
    float *row = malloc(sizeof(float) * (size_t)row_len(&m));
    memcpy(row, boxes, sizeof(float) * 4 * (size_t)k);
    memcpy(row + 4 * k, scores, sizeof(float) * (size_t)k);
    gw_crops_spec_t s;
    parse_ok(spec, &s);
    bind_ok(&s, &m);
    int n = gw_detect(&s, row, 100, 100, 100, 100, d, max);
    free(row);
    return n;
}

static const float overlap_boxes[4][4] = {
    {0, 0, 10, 10},   /* A */
    {1, 0, 11, 10},   /* B: IoU with A 90 / 110 = 0.82 */
    {20, 20, 30, 30}, /* C: apart */
    {0, 0, 10, 10},   /* D: A again, higher score */
};
static const float overlap_scores[4] = {0.9f, 0.8f, 0.7f, 0.95f};

Test(detect, hard_nms_keeps_the_top_of_each_cluster)
{
    gw_detection_t d[8];
    int n = detect_boxes("{\"boxes\": \"boxes\", \"scores\": \"scores\", \"normalized\": false}", 4,
                         overlap_boxes, overlap_scores, d, 8);
    cr_assert_eq(n, 2);
    cr_assert_eq(d[0].index, 3);
    assert_box(&d[0], 0, 0, 10, 10);
    cr_assert_eq(d[1].index, 2);
    /* IoU 0.82 is not above 0.85: B stays. */
    n = detect_boxes("{\"boxes\": \"boxes\", \"scores\": \"scores\", \"normalized\": false, "
                     "\"nms_iou\": 0.85}",
                     4, overlap_boxes, overlap_scores, d, 8);
    cr_assert_eq(n, 3);
    cr_assert_eq(d[0].index, 3);
    cr_assert_eq(d[1].index, 1);
    cr_assert_eq(d[2].index, 2);
}

Test(detect, weighted_nms_averages_a_cluster_by_score)
{
    gw_detection_t d[8];
    int n = detect_boxes("{\"boxes\": \"boxes\", \"scores\": \"scores\", \"normalized\": false, "
                         "\"nms\": \"weighted\", \"nms_iou\": 0.3}",
                         4, overlap_boxes, overlap_scores, d, 8);
    cr_assert_eq(n, 2);
    /* D, A and B: x0 = (0 * .95 + 0 * .9 + 1 * .8) / 2.65, x1 = x0 + 10;
     * the top score. */
    float x0 = 0.8f / 2.65f;
    assert_box(&d[0], x0, 0, x0 + 10, 10);
    cr_assert_float_eq(d[0].score, 0.95f, 1e-6);
    cr_assert_eq(d[0].index, 3);
    assert_box(&d[1], 20, 20, 30, 30);
    cr_assert_float_eq(d[1].score, 0.7f, 1e-6);
    /* A cluster member under the threshold does not count. */
    const float scores[4] = {0.9f, 0.4f, 0.7f, 0.95f};
    n = detect_boxes("{\"boxes\": \"boxes\", \"scores\": \"scores\", \"normalized\": false, "
                     "\"nms\": \"weighted\", \"nms_iou\": 0.3}",
                     4, overlap_boxes, scores, d, 8);
    cr_assert_eq(n, 2);
    assert_box(&d[0], 0, 0, 10, 10);
}

Test(detect, max_crops_threshold_and_score_order)
{
    /* Five boxes apart from each other. */
    float boxes[5][4];
    for (int i = 0; i < 5; i++) {
        boxes[i][0] = (float)(i * 20), boxes[i][1] = 0;
        boxes[i][2] = (float)(i * 20 + 10), boxes[i][3] = 10;
    }
    const float scores[5] = {0.6f, 0.9f, 0.7f, 0.9f, 0.5f};
    gw_detection_t d[8];
    const char *spec = "{\"boxes\": \"boxes\", \"scores\": \"scores\", \"normalized\": false, "
                       "\"max_crops\": 3}";
    cr_assert_eq(detect_boxes(spec, 5, boxes, scores, d, 8), 3);
    /* Highest first; the tie in k order. */
    cr_assert_eq(d[0].index, 1);
    cr_assert_eq(d[1].index, 3);
    cr_assert_eq(d[2].index, 2);
    /* max below max_crops. */
    cr_assert_eq(detect_boxes(spec, 5, boxes, scores, d, 2), 2);
    cr_assert_eq(d[1].index, 3);
    cr_assert_eq(detect_boxes(spec, 5, boxes, scores, d, 0), 0);
    /* The threshold keeps score >= it: 0.5 (the default) passes. */
    cr_assert_eq(detect_boxes("{\"boxes\": \"boxes\", \"scores\": \"scores\", \"normalized\": "
                              "false}",
                              5, boxes, scores, d, 8),
                 5);
    cr_assert_eq(d[4].index, 4);
    cr_assert_eq(detect_boxes("{\"boxes\": \"boxes\", \"scores\": \"scores\", \"normalized\": "
                              "false, \"score_threshold\": 0.65}",
                              5, boxes, scores, d, 8),
                 3);
    /* Nothing above the threshold. */
    cr_assert_eq(detect_boxes("{\"boxes\": \"boxes\", \"scores\": \"scores\", \"normalized\": "
                              "false, \"score_threshold\": 0.95}",
                              5, boxes, scores, d, 8),
                 0);
}

Test(detect, unbound_spec_is_refused)
{
    gw_crops_spec_t s;
    parse_ok("{\"boxes\": \"b\", \"scores\": \"s\"}", &s);
    float row[8] = {0};
    gw_detection_t d[1];
    cr_assert_eq(gw_detect(&s, row, 10, 10, 10, 10, d, 1), SQ_INVAL);
}

/* ---- binding ------------------------------------------------------------ */

Test(detect, bind_errors_name_the_field)
{
    static const struct {
        const char *spec, *err;
    } cases[] = {
        {"{\"boxes\": \"nope\", \"scores\": \"s\"}",
         "stages[1].crops_of.boxes: model det has no output \"nope\""},
        {"{\"boxes\": \"b\", \"scores\": \"nope\"}",
         "stages[1].crops_of.scores: model det has no output \"nope\""},
        {"{\"boxes\": \"s\", \"scores\": \"s\"}",
         "stages[1].crops_of.boxes: output \"s\" is [1, 896, 1], expected [N, K, >= 4]"},
        {"{\"boxes\": \"b\", \"scores\": \"s\", \"box_offset\": 13}",
         "stages[1].crops_of.boxes: output \"b\" is [1, 896, 16], expected [N, K, >= 17]"},
        {"{\"boxes\": \"b\", \"scores\": \"b\"}",
         "stages[1].crops_of.scores: output \"b\" ([1, 896, 16]) holds the boxes: one output of "
         "boxes and scores [N, 4 + C, A] or [N, A, 4 + C] is layout \"yolo\""},
        {"{\"boxes\": \"b\", \"scores\": \"s2\"}",
         "stages[1].crops_of.scores: 10 scores for 896 boxes"},
        {"{\"boxes\": [\"b\", \"b4\"], \"scores\": \"s\"}",
         "stages[1].crops_of.boxes: output \"b4\" is [1, 10, 4], expected [N, K, 16] as the first"},
        {"{\"boxes\": \"b4\", \"scores\": \"s2\", \"anchors\": \"mediapipe_face_front_128\"}",
         "stages[1].crops_of.anchors: 896 anchors for 10 boxes"},
    };
    const char *outs[] = {"s:1x896x1", "b:1x896x16", "s2:1x10", "b4:1x10x4"};
    gw_model_t m = model_of(4, outs);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        gw_crops_spec_t s;
        char err[256];
        parse_ok(cases[i].spec, &s);
        cr_assert_eq(gw_crops_spec_bind(&s, m.name, m.outputs, m.noutputs, "stages[1].crops_of",
                                        err, sizeof(err)),
                     SQ_BAD_CONFIG, "%s", cases[i].spec);
        cr_assert_str_eq(err, cases[i].err, "%s", cases[i].spec);
        cr_assert_eq(s.bound, 0);
    }
    gw_crops_spec_t s;
    parse_ok("{\"boxes\": \"b4\", \"scores\": \"s2\"}", &s);
    bind_ok(&s, &m);
    cr_assert_eq(s.box_parts[0].off, 896 + 896 * 16 + 10);
    cr_assert_eq(s.score_parts[0].off, 896 + 896 * 16);
    cr_assert_eq(s.nboxes, 10);
}
