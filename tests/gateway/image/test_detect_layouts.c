/* gateway/image/detect.c: the output layouts besides BlazeFace's (YOLO's
 * one output in its three forms, decoded boxes with per-class scores or
 * labels), the "classes" filter and NMS per class, on hand-made rows
 * (BlazeFace's layout and the spec's other fields: test_detect.c). */
#include <criterion/criterion.h>
#include <gw_image.h>
#include <sq.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static gw_output_t out(const char *name, int ndims, const int64_t *dims)
{
    gw_output_t o;
    memset(&o, 0, sizeof(o));
    snprintf(o.name, sizeof(o.name), "%s", name);
    o.ndims = ndims;
    o.elems = 1;
    for (int d = 0; d < ndims; d++) {
        o.dims[d] = dims[d];
        if (d > 0)
            o.elems *= dims[d];
    }
    return o;
}

static int parse_bind(const char *text, const gw_output_t *outs, int n, gw_crops_spec_t *s,
                      char *err, size_t errlen)
{
    json_error_t je;
    json_t *v = json_loads(text, 0, &je);
    cr_assert_not_null(v, "bad test JSON %s: %s", text, je.text);
    err[0] = '\0';
    int rc = gw_crops_spec_parse(v, "crops_of", s, err, errlen);
    json_decref(v);
    if (rc == 0)
        rc = gw_crops_spec_bind(s, "det", outs, n, "crops_of", err, errlen);
    return rc;
}

static void bound(const char *text, const gw_output_t *outs, int n, gw_crops_spec_t *s)
{
    char err[512];
    cr_assert_eq(parse_bind(text, outs, n, s, err, sizeof(err)), 0, "%s: %s", text, err);
}

static void refused(const char *text, const gw_output_t *outs, int n, const char *want)
{
    gw_crops_spec_t s;
    char err[512];
    cr_assert_eq(parse_bind(text, outs, n, &s, err, sizeof(err)), SQ_BAD_CONFIG, "%s", text);
    cr_assert(strstr(err, want) != NULL, "%s: '%s' lacks '%s'", text, err, want);
}

static void assert_box(const gw_detection_t *d, float x0, float y0, float x1, float y1)
{
    cr_assert_float_eq(d->x0, x0, 1e-3, "x0 %f != %f", d->x0, x0);
    cr_assert_float_eq(d->y0, y0, 1e-3, "y0 %f != %f", d->y0, y0);
    cr_assert_float_eq(d->x1, x1, 1e-3, "x1 %f != %f", d->x1, x1);
    cr_assert_float_eq(d->y1, y1, 1e-3, "y1 %f != %f", d->y1, y1);
}

/* YOLO's rows, anchor by anchor: cx, cy, w, h (input pixels), [obj], C
 * scores; written into [1, attrs, A] (transposed 0) or [1, A, attrs]. */
static void put(float *row, int transposed, int attrs, int na, int a, const float *v)
{
    for (int j = 0; j < attrs; j++)
        row[transposed ? a * attrs + j : j * na + a] = v[j];
}

/* Four anchors of two classes on a 100x100 input, an image of 200x100:
 * anchor 1 (class 1, 0.9) and anchor 2 (class 1, 0.6) overlap: 2 goes;
 * anchor 3 (class 0, 0.8) is anchor 1's box: another class, it stays;
 * anchor 0 is under the threshold. */
static const float yolo_anchors[4][6] = {
    {10, 10, 4, 4, 0.1f, 0.2f},
    {50, 40, 20, 10, 0.05f, 0.9f},
    {51, 40, 20, 10, 0.1f, 0.6f},
    {50, 40, 20, 10, 0.8f, 0.3f},
};

static void check_yolo_dets(const gw_crops_spec_t *s, const float *row)
{
    gw_detection_t d[8];
    cr_assert_eq(gw_detect(s, row, 100, 100, 200, 100, d, 8), 2);
    cr_assert_eq(d[0].index, 1);
    cr_assert_eq(d[0].label, 1);
    cr_assert_float_eq(d[0].score, 0.9f, 1e-6);
    assert_box(&d[0], 80, 35, 120, 45);
    cr_assert_eq(d[1].index, 3);
    cr_assert_eq(d[1].label, 0);
    cr_assert_float_eq(d[1].score, 0.8f, 1e-6);
    assert_box(&d[1], 80, 35, 120, 45);
}

Test(detect_layouts, yolo_v8_reads_centre_boxes_in_pixels_and_the_best_class)
{
    /* Eight anchors (the last four score nothing), two classes. */
    gw_output_t o = out("output0", 3, (int64_t[]){1, 6, 8});
    gw_crops_spec_t s;
    bound("{\"layout\": \"yolo\", \"score_threshold\": 0.5}", &o, 1, &s);
    cr_assert_eq(s.nboxes, 8);
    cr_assert_eq(s.nclasses, 2);
    cr_assert_eq(s.format, GW_BOX_CXCYWH);
    cr_assert_eq(s.normalized, 0);
    float row[48] = {0};
    for (int a = 0; a < 4; a++)
        put(row, 0, 6, 8, a, yolo_anchors[a]);
    check_yolo_dets(&s, row);
}

Test(detect_layouts, yolo_transposed_is_told_by_the_longer_axis_or_by_the_spec)
{
    /* [1, A, 4 + C] with A = 8 > 6: the anchors' axis is found. */
    gw_output_t o = out("y", 3, (int64_t[]){1, 8, 6});
    gw_crops_spec_t s;
    bound("{\"layout\": \"yolo\", \"output\": \"y\"}", &o, 1, &s);
    cr_assert_eq(s.nboxes, 8);
    float row[48] = {0};
    for (int a = 0; a < 4; a++)
        put(row, 1, 6, 8, a, yolo_anchors[a]);
    check_yolo_dets(&s, row);
    /* Four anchors of 4 + 2: the axes alone cannot say which is which. */
    gw_output_t sq = out("y", 3, (int64_t[]){1, 6, 6});
    refused("{\"layout\": \"yolo\"}", &sq, 1, "transposed");
    bound("{\"layout\": \"yolo\", \"transposed\": true}", &sq, 1, &s);
    cr_assert_eq(s.nboxes, 6);
    cr_assert_eq(s.nclasses, 2);
}

Test(detect_layouts, yolo_v5_objectness_multiplies_the_class_score)
{
    gw_output_t o = out("output", 3, (int64_t[]){1, 4, 7});
    gw_crops_spec_t s;
    bound("{\"layout\": \"yolo\", \"objectness\": true, \"transposed\": true, "
          "\"score_threshold\": 0.3}",
          &o, 1, &s);
    cr_assert_eq(s.nclasses, 2);
    float row[28] = {0};
    /* 0.5 * 0.9 = 0.45 kept; 0.9 * 0.3 = 0.27 and 0.2 * 0.8 under 0.3. */
    put(row, 1, 7, 4, 0, (float[]){50, 40, 20, 10, 0.5f, 0.1f, 0.9f});
    put(row, 1, 7, 4, 1, (float[]){10, 10, 4, 4, 0.9f, 0.3f, 0.1f});
    put(row, 1, 7, 4, 2, (float[]){80, 80, 4, 4, 0.2f, 0.8f, 0.1f});
    gw_detection_t d[4];
    cr_assert_eq(gw_detect(&s, row, 100, 100, 100, 100, d, 4), 1);
    cr_assert_eq(d[0].index, 0);
    cr_assert_eq(d[0].label, 1);
    cr_assert_float_eq(d[0].score, 0.45f, 1e-6);
    assert_box(&d[0], 40, 35, 60, 45);
}

Test(detect_layouts, yolo_shape_and_field_errors_say_what_to_send)
{
    gw_output_t no_classes = out("output0", 3, (int64_t[]){1, 4, 8400});
    refused("{\"layout\": \"yolo\"}", &no_classes, 1, "at least 1 class score");
    gw_output_t flat = out("output0", 2, (int64_t[]){1, 84});
    refused("{\"layout\": \"yolo\"}", &flat, 1, "expected [N, 4 + C, A]");
    refused("{\"layout\": \"yolo\", \"output\": \"boxes\"}", &flat, 1, "no output \"boxes\"");
    refused("{\"layout\": \"yolo\", \"boxes\": \"b\"}", &flat, 1, "crops_of.boxes: not with");
    refused("{\"layout\": \"yolo\", \"anchors\": \"mediapipe_face_front_128\"}", &flat, 1,
            "crops_of.anchors");
    refused("{\"boxes\": \"b\", \"scores\": \"s\", \"objectness\": true}", &flat, 1,
            "only with layout \"yolo\"");
    refused("{\"layout\": \"retinanet\"}", &flat, 1, "export SSD and RetinaNet with their");
    refused("{\"layout\": \"ssd_anchors\", \"boxes\": \"b\", \"scores\": \"s\"}", &flat, 1,
            "anchors: required with layout");
    /* YOLO's output named as boxes: the message points to "yolo". */
    gw_output_t y = out("output0", 3, (int64_t[]){1, 84, 8400});
    refused("{\"boxes\": \"output0\", \"scores\": \"output0\"}", &y, 1, "layout \"yolo\"");
    refused("{\"layout\": \"yolo\", \"classes\": [0, 80]}", &y, 1,
            "classes: class 80, but the detector scores 80 classes");
}

Test(detect_layouts, decoded_boxes_with_per_class_scores_take_each_box_s_best_class)
{
    /* torchvision-style postprocessed export: boxes [1, 3, 4] in pixels of
     * the 100x100 input, scores [1, 3, 3] per class (0: background). */
    gw_output_t o[2] = {out("boxes", 3, (int64_t[]){1, 3, 4}),
                        out("scores", 3, (int64_t[]){1, 3, 3})};
    gw_crops_spec_t s;
    bound("{\"layout\": \"boxes_scores\", \"boxes\": \"boxes\", \"scores\": \"scores\", "
          "\"normalized\": false, \"classes\": [1, 2]}",
          o, 2, &s);
    cr_assert_eq(s.nclasses, 3);
    float row[12 + 9] = {10,
                         10,
                         30,
                         30,
                         12,
                         10,
                         32,
                         30,
                         60,
                         60,
                         90,
                         90,
                         /* scores */ 0.1f,
                         0.2f,
                         0.7f,
                         0.1f,
                         0.6f,
                         0.3f,
                         0.9f,
                         0.05f,
                         0.05f};
    gw_detection_t d[4];
    /* Box 2's best class is the background, not kept; boxes 0 and 1
     * overlap (IoU 0.82) but are of classes 2 and 1. */
    cr_assert_eq(gw_detect(&s, row, 100, 100, 100, 100, d, 4), 2);
    cr_assert_eq(d[0].index, 0);
    cr_assert_eq(d[0].label, 2);
    assert_box(&d[0], 10, 10, 30, 30);
    cr_assert_eq(d[1].index, 1);
    cr_assert_eq(d[1].label, 1);
    /* Without the filter the background box comes first. */
    bound("{\"boxes\": \"boxes\", \"scores\": \"scores\", \"normalized\": false}", o, 2, &s);
    cr_assert_eq(gw_detect(&s, row, 100, 100, 100, 100, d, 4), 3);
    cr_assert_eq(d[0].index, 2);
    cr_assert_eq(d[0].label, 0);
}

/* torchvision's SSD scores class 0 as "nothing there" in its softmax:
 * with "background": 0 a box's class is its best other one (torchvision's
 * postprocessing never reports class 0), where "classes" would drop the
 * box whose background outscores its objects. */
Test(detect_layouts, the_background_class_is_never_a_box_s_class)
{
    gw_output_t o[2] = {out("boxes", 3, (int64_t[]){1, 2, 4}),
                        out("scores", 3, (int64_t[]){1, 2, 3})};
    gw_crops_spec_t s;
    bound("{\"boxes\": \"boxes\", \"scores\": \"scores\", \"normalized\": false, "
          "\"background\": 0, \"score_threshold\": 0.3}",
          o, 2, &s);
    cr_assert_eq(s.background, 0);
    /* Box 0: background 0.5, class 2 at 0.4: a class-2 box. Box 1: class 1
     * at 0.6 above the background's 0.3. */
    float row[8 + 6] = {10, 10, 30, 30, 60, 60, 90, 90, 0.5f, 0.1f, 0.4f, 0.3f, 0.6f, 0.1f};
    gw_detection_t d[4];
    cr_assert_eq(gw_detect(&s, row, 100, 100, 100, 100, d, 4), 2);
    cr_assert_eq(d[0].index, 1);
    cr_assert_eq(d[0].label, 1);
    cr_assert_float_eq(d[0].score, 0.6f, 1e-6);
    cr_assert_eq(d[1].index, 0);
    cr_assert_eq(d[1].label, 2);
    cr_assert_float_eq(d[1].score, 0.4f, 1e-6);
    /* Any class may be the background; one past the scores' is refused, as
     * is a background with one score per box. */
    bound("{\"boxes\": \"boxes\", \"scores\": \"scores\", \"normalized\": false, "
          "\"background\": 2, \"score_threshold\": 0.3}",
          o, 2, &s);
    cr_assert_eq(gw_detect(&s, row, 100, 100, 100, 100, d, 4), 2);
    cr_assert_eq(d[0].label, 1);
    cr_assert_eq(d[1].label, 0);
    refused("{\"boxes\": \"boxes\", \"scores\": \"scores\", \"background\": 3}", o, 2,
            "class 3, but the detector scores 3 classes (0..2)");
    gw_output_t one[2] = {o[0], out("scores", 2, (int64_t[]){1, 2})};
    refused("{\"boxes\": \"boxes\", \"scores\": \"scores\", \"background\": 0}", one, 2,
            "scores 1 class (0..0)");
    refused("{\"boxes\": \"boxes\", \"scores\": \"scores\", \"background\": -1}", o, 2,
            "nothing there");
    /* With labels, a box labelled the background is dropped. */
    gw_output_t lab[3] = {o[0], out("conf", 2, (int64_t[]){1, 2}),
                          out("cls", 2, (int64_t[]){1, 2})};
    bound("{\"boxes\": \"boxes\", \"scores\": \"conf\", \"labels\": \"cls\", \"normalized\": "
          "false, \"background\": 0}",
          lab, 3, &s);
    float lrow[8 + 2 + 2] = {10, 10, 30, 30, 60, 60, 90, 90, 0.9f, 0.8f, 0, 4};
    cr_assert_eq(gw_detect(&s, lrow, 100, 100, 100, 100, d, 4), 1);
    cr_assert_eq(d[0].label, 4);
}

Test(detect_layouts, decoded_boxes_with_labels_are_suppressed_per_label)
{
    /* SSD-style postprocessed export: boxes normalized cxcywh, scores
     * [1, 3] and labels [1, 3]. */
    gw_output_t o[3] = {out("dets", 3, (int64_t[]){1, 3, 4}), out("conf", 2, (int64_t[]){1, 3}),
                        out("cls", 2, (int64_t[]){1, 3})};
    gw_crops_spec_t s;
    bound("{\"boxes\": \"dets\", \"scores\": \"conf\", \"labels\": \"cls\", \"format\": "
          "\"cxcywh\"}",
          o, 3, &s);
    float row[12 + 3 + 3] = {.5f,
                             .5f,
                             .2f,
                             .2f,
                             .51f,
                             .5f,
                             .2f,
                             .2f,
                             .5f,
                             .5f,
                             .2f,
                             .2f,
                             /* scores */ 0.9f,
                             0.8f,
                             0.7f,
                             /* labels */ 17,
                             17,
                             3};
    gw_detection_t d[4];
    cr_assert_eq(gw_detect(&s, row, 100, 100, 50, 50, d, 4), 2);
    cr_assert_eq(d[0].label, 17);
    assert_box(&d[0], 20, 20, 30, 30);
    cr_assert_eq(d[1].index, 2);
    cr_assert_eq(d[1].label, 3);
    /* Only label 3. */
    bound("{\"boxes\": \"dets\", \"scores\": \"conf\", \"labels\": \"cls\", \"format\": "
          "\"cxcywh\", \"classes\": [3]}",
          o, 3, &s);
    cr_assert_eq(gw_detect(&s, row, 100, 100, 50, 50, d, 4), 1);
    cr_assert_eq(d[0].index, 2);
    /* Labels must be one per box, and not with per-class scores. */
    gw_output_t bad_labels[3] = {o[0], o[1], out("cls", 2, (int64_t[]){1, 4})};
    refused("{\"boxes\": \"dets\", \"scores\": \"conf\", \"labels\": \"cls\"}", bad_labels, 3,
            "expected [N, 3]: a class per box");
    gw_output_t per_class[3] = {o[0], out("conf", 3, (int64_t[]){1, 3, 5}), o[2]};
    refused("{\"boxes\": \"dets\", \"scores\": \"conf\", \"labels\": \"cls\"}", per_class, 3,
            "leave labels out");
}

Test(detect_layouts, hard_nms_suppresses_within_a_class_only)
{
    /* Two classes' scores for three overlapping boxes. */
    gw_output_t o[2] = {out("b", 3, (int64_t[]){1, 3, 4}), out("s", 3, (int64_t[]){1, 3, 2})};
    gw_crops_spec_t s;
    bound("{\"boxes\": \"b\", \"scores\": \"s\", \"nms_iou\": 0.3}", o, 2, &s);
    float row[12 + 6] = {.1f,
                         .1f,
                         .5f,
                         .5f,
                         .12f,
                         .1f,
                         .52f,
                         .5f,
                         .14f,
                         .1f,
                         .54f,
                         .5f,
                         /* scores */ 0.9f,
                         0.1f,
                         0.1f,
                         0.8f,
                         0.7f,
                         0.2f};
    gw_detection_t d[4];
    /* 0 (class 0) and 1 (class 1) stay; 2 (class 0) goes under 0. */
    cr_assert_eq(gw_detect(&s, row, 10, 10, 10, 10, d, 4), 2);
    cr_assert_eq(d[0].index, 0);
    cr_assert_eq(d[1].index, 1);
    cr_assert_eq(d[1].label, 1);
    /* max_crops cuts after NMS. */
    bound("{\"boxes\": \"b\", \"scores\": \"s\", \"nms_iou\": 0.3, \"max_crops\": 1}", o, 2, &s);
    cr_assert_eq(gw_detect(&s, row, 10, 10, 10, 10, d, 4), 1);
}

Test(detect_layouts, layouts_round_trip_through_json)
{
    const char *specs[] = {
        "{\"layout\": \"yolo\", \"output\": \"y\", \"objectness\": true, \"transposed\": true, "
        "\"classes\": [0, 2]}",
        "{\"boxes\": \"dets\", \"scores\": \"conf\", \"labels\": \"cls\"}",
        "{\"boxes\": \"boxes\", \"scores\": \"scores\", \"background\": 0}",
        "{\"boxes\": \"b\", \"scores\": \"s\", \"anchors\": \"mediapipe_face_front_128\"}",
    };
    for (size_t i = 0; i < sizeof(specs) / sizeof(specs[0]); i++) {
        json_t *v = json_loads(specs[i], 0, NULL);
        gw_crops_spec_t a, b;
        char err[256];
        cr_assert_eq(gw_crops_spec_parse(v, "c", &a, err, sizeof(err)), 0, "%s", err);
        json_t *j = gw_crops_spec_json(&a);
        cr_assert_eq(gw_crops_spec_parse(j, "c", &b, err, sizeof(err)), 0, "%s", err);
        json_t *j2 = gw_crops_spec_json(&b);
        cr_assert(json_equal(j, j2), "%s", specs[i]);
        json_decref(v);
        json_decref(j);
        json_decref(j2);
    }
    json_t *v = json_loads("{\"boxes\": \"b\", \"scores\": \"s\", \"anchors\": "
                           "\"mediapipe_face_front_128\"}",
                           0, NULL);
    gw_crops_spec_t a;
    char err[256];
    cr_assert_eq(gw_crops_spec_parse(v, "c", &a, err, sizeof(err)), 0);
    cr_assert_eq(a.layout, GW_LAYOUT_SSD_ANCHORS);
    json_decref(v);
}

Test(detect_layouts, ssd_anchors_take_per_class_scores)
{
    /* One layer of stride 2 on a 4x4 input: 2 x 2 cells, one fixed-size
     * anchor each (centres 0.25 and 0.75); three classes per anchor. */
    gw_output_t o[2] = {out("raw", 3, (int64_t[]){1, 4, 4}), out("cls", 3, (int64_t[]){1, 4, 3})};
    gw_crops_spec_t s;
    const char *spec = "{\"layout\": \"ssd_anchors\", \"boxes\": \"raw\", \"scores\": \"cls\", "
                       "\"anchors\": {\"num_layers\": 1, \"min_scale\": 0.5, \"max_scale\": 0.5, "
                       "\"input_size_width\": 4, \"input_size_height\": 4, \"strides\": [2], "
                       "\"interpolated_scale_aspect_ratio\": 0, \"fixed_anchor_size\": true}, "
                       "\"classes\": [1, 2]}";
    bound(spec, o, 2, &s);
    cr_assert_eq(s.nboxes, 4);
    cr_assert_eq(s.nclasses, 3);
    /* anchor 0 (0.25, 0.25): w = h = 2 / 4 -> [0, 0.5]; class 2.
     * anchor 3 (0.75, 0.75): shifted by +1 px, w = h = 1 / 4; class 1.
     * anchor 1: class 0, not kept. */
    float row[16 + 12] = {0,
                          0,
                          2,
                          2,
                          0,
                          0,
                          2,
                          2,
                          0,
                          0,
                          2,
                          2,
                          1,
                          1,
                          1,
                          1,
                          /* scores */ 0.1f,
                          0.2f,
                          0.9f,
                          0.95f,
                          0.1f,
                          0.1f,
                          0,
                          0,
                          0,
                          0.1f,
                          0.7f,
                          0.2f};
    gw_detection_t d[4];
    cr_assert_eq(gw_detect(&s, row, 4, 4, 100, 100, d, 4), 2);
    cr_assert_eq(d[0].index, 0);
    cr_assert_eq(d[0].label, 2);
    assert_box(&d[0], 0, 0, 50, 50);
    cr_assert_eq(d[1].index, 3);
    cr_assert_eq(d[1].label, 1);
    assert_box(&d[1], 87.5f, 87.5f, 112.5f, 112.5f);
    /* The anchors must match K. */
    gw_output_t few[2] = {out("raw", 3, (int64_t[]){1, 3, 4}), out("cls", 3, (int64_t[]){1, 3, 3})};
    refused(spec, few, 2, "4 anchors for 3 boxes");
}
