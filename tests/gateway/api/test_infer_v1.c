/* gateway/api/infer_v1.c: what /v1 refuses before any decode: a model
 * without class scores, and a body sent the way a common slip sends it
 * (each refusal saying what to send instead). */
#include <criterion/criterion.h>
#include <infer_int.h>
#include <sq.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A model from a modeldb record whose input and outputs are given as JSON
 * text ("input": {...}, "outputs": [...], any other members). */
static gw_model_t *model_of(const char *io)
{
    char txt[2048];
    snprintf(txt, sizeof(txt),
             "{\"id\": 1, \"name\": \"m\", \"version\": 2, \"sha256\": \"00\", \"format\": "
             "\"emulated\", \"status\": \"ready\", %s}",
             io);
    json_error_t je;
    json_t *rec = json_loads(txt, 0, &je);
    cr_assert_not_null(rec, "%s", je.text);
    gw_model_t *m = gw_model_from_record(rec);
    json_decref(rec);
    cr_assert_not_null(m);
    return m;
}

static const char IMAGE_IN[] =
    "\"input\": {\"name\": \"x\", \"datatype\": \"FP32\", \"shape\": [-1, 3, 8, 8]}, ";

static h2o_iovec_t ct(const char *s)
{
    return h2o_iovec_init(s, strlen(s));
}

static const uint8_t JPEG[] = {0xFF, 0xD8, 0xFF, 0xE0, 0x00, 0x10, 'J', 'F', 'I', 'F'};

Test(infer_v1, a_classifier_answers_v1)
{
    char io[512];
    snprintf(io, sizeof(io), "%s\"outputs\": [{\"name\": \"y\", \"shape\": [-1, 10]}]", IMAGE_IN);
    gw_model_t *m = model_of(io);
    char why[512] = "";
    cr_assert_eq(gw_v1_scores_why(m, why, sizeof(why)), 0);
    cr_assert_str_eq(why, "");
    gw_model_unref(m);
}

Test(infer_v1, a_model_without_class_scores_is_sent_to_v2_naming_its_shape)
{
    char io[512];
    snprintf(io, sizeof(io), "%s\"outputs\": [{\"name\": \"feat\", \"shape\": [-1, 4, 7]}]",
             IMAGE_IN);
    gw_model_t *m = model_of(io);
    char why[512];
    cr_assert_eq(gw_v1_scores_why(m, why, sizeof(why)), SQ_BAD_REQUEST);
    cr_assert_str_eq(why, "model m has no class scores (output 0 'feat' is [-1, 4, 7]): /v1 "
                          "answers a classifier's top-k labels; POST /v2/models/m/infer for its "
                          "outputs");
    gw_model_unref(m);
}

Test(infer_v1, a_detectors_boxes_are_no_class_scores)
{
    char io[512];
    snprintf(io, sizeof(io),
             "%s\"outputs\": [{\"name\": \"boxes\", \"shape\": [-1, 6]}], \"detections\": "
             "{\"slots\": 3}",
             IMAGE_IN);
    gw_model_t *m = model_of(io);
    cr_assert_gt(m->det_slots, 0);
    char why[512];
    cr_assert_eq(gw_v1_scores_why(m, why, sizeof(why)), SQ_BAD_REQUEST);
    cr_assert_not_null(strstr(why, "is [-1, 6], a detector's boxes"), "%s", why);
    gw_model_unref(m);
}

Test(infer_v1, a_jpeg_is_no_slip_whatever_its_content_type_but_json)
{
    char why[512] = "";
    cr_assert_eq(gw_v1_body_slip(JPEG, sizeof(JPEG), ct("image/jpeg"), "m", why, sizeof(why)), 0);
    cr_assert_eq(gw_v1_body_slip(JPEG, sizeof(JPEG), ct("application/x-www-form-urlencoded"), "m",
                                 why, sizeof(why)),
                 0, "curl --data-binary's type, a short body");
    cr_assert_eq(gw_v1_body_slip(JPEG, sizeof(JPEG), ct(""), "m", why, sizeof(why)), 0);
    cr_assert_str_eq(why, "");
}

Test(infer_v1, a_jpeg_labelled_json_is_told_its_content_type)
{
    char why[512];
    cr_assert_eq(gw_v1_body_slip(JPEG, sizeof(JPEG), ct("application/json; charset=utf-8"), "m",
                                 why, sizeof(why)),
                 SQ_MEDIA_TYPE);
    cr_assert_str_eq(why, "the body is a JPEG but Content-Type says application/json: send "
                          "Content-Type: image/jpeg");
}

Test(infer_v1, json_on_the_image_route_is_sent_to_v2)
{
    const char *body = " \n {\"inputs\": []}";
    char why[512];
    cr_assert_eq(gw_v1_body_slip((const uint8_t *)body, strlen(body), ct("text/plain"), "resnet",
                                 why, sizeof(why)),
                 SQ_MEDIA_TYPE, "JSON after white space, whatever the type");
    cr_assert_str_eq(why, "this route takes images (image/jpeg, or multipart/form-data of JPEGs); "
                          "JSON inference requests (the Open Inference Protocol) go to POST "
                          "/v2/models/resnet/infer");
    body = "[1, 2]";
    cr_assert_eq(gw_v1_body_slip((const uint8_t *)body, strlen(body), ct("application/json"), "m",
                                 why, sizeof(why)),
                 SQ_MEDIA_TYPE);
}

Test(infer_v1, a_large_form_encoded_body_without_cr_or_lf_is_curl_d)
{
    size_t n = 4096;
    uint8_t *b = calloc(n, 1);
    memcpy(b, JPEG, sizeof(JPEG));
    memset(b + sizeof(JPEG), 'x', n - sizeof(JPEG));
    char why[512];
    cr_assert_eq(
        gw_v1_body_slip(b, n, ct("application/x-www-form-urlencoded"), "m", why, sizeof(why)),
        SQ_MEDIA_TYPE);
    cr_assert_not_null(strstr(why, "--data-binary @photo.jpg"), "%s", why);
    cr_assert_eq(
        gw_v1_body_slip(b, n - 1, ct("application/x-www-form-urlencoded"), "m", why, sizeof(why)),
        0, "below 4096 bytes a JPEG may lack both");
    b[100] = '\n';
    cr_assert_eq(
        gw_v1_body_slip(b, n, ct("application/x-www-form-urlencoded"), "m", why, sizeof(why)), 0,
        "one LF: not stripped");
    b[100] = 'x';
    cr_assert_eq(gw_v1_body_slip(b, n, ct("image/jpeg"), "m", why, sizeof(why)), 0,
                 "sent as an image: as it is");
    free(b);
}

Test(infer_v1, a_detector_and_a_segmenter_answer_v1)
{
    char io[1024];
    snprintf(io, sizeof(io),
             "%s\"outputs\": [{\"name\": \"y\", \"shape\": [-1, 6, 8]}], \"detector\": "
             "{\"layout\": \"yolo\"}",
             IMAGE_IN);
    gw_model_t *m = model_of(io);
    cr_assert(m->has_detector);
    char why[512] = "";
    cr_assert_eq(gw_v1_scores_why(m, why, sizeof(why)), 0, "detector: %s", why);
    gw_model_unref(m);
    snprintf(io, sizeof(io),
             "%s\"outputs\": [{\"name\": \"out\", \"shape\": [-1, 3, 2, 2]}], \"segmenter\": true",
             IMAGE_IN);
    m = model_of(io);
    cr_assert(m->segmenter);
    cr_assert_eq(gw_v1_scores_why(m, why, sizeof(why)), 0, "segmenter: %s", why);
    gw_model_unref(m);
}

Test(infer_v1, an_onnx_model_without_class_scores_is_told_of_detector_and_segmenter)
{
    char io[512];
    snprintf(io, sizeof(io), "%s\"outputs\": [{\"name\": \"out\", \"shape\": [-1, 3, 2, 2]}]",
             IMAGE_IN);
    char rec[1024];
    snprintf(rec, sizeof(rec),
             "{\"id\": 1, \"name\": \"m\", \"version\": 2, \"sha256\": \"00\", \"format\": "
             "\"onnx\", \"status\": \"ready\", %s}",
             io);
    json_t *r = json_loads(rec, 0, NULL);
    gw_model_t *m = gw_model_from_record(r);
    json_decref(r);
    char why[512];
    cr_assert_eq(gw_v1_scores_why(m, why, sizeof(why)), SQ_BAD_REQUEST);
    cr_assert_not_null(strstr(why, "\"segmenter\": true"), "%s", why);
    cr_assert_not_null(strstr(why, "a \"detector\" block"), "%s", why);
    cr_assert_not_null(strstr(why, "POST /v2/models/m/infer for its outputs (or give"), "%s", why);
    gw_model_unref(m);
}
