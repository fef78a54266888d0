/* gateway/api/infer_reply.c: the parts of an inference answer that need
 * no connection: a classifier's top-k with softmax scores and labels, the
 * timing of a request's items, a detector's boxes and a segmenter's
 * class shares as /v1 answers them, and what a request dropped for its
 * deadline is told (whether a retry can help, what SLO would work, and the
 * code: slo_too_tight where no retry can help, deadline where one can). */
#include <criterion/criterion.h>
#include <infer_int.h>
#include <sq.h>

#include <math.h>
#include <stdio.h>
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

static gw_model_t *classifier(int nclasses)
{
    char io[512];
    snprintf(io, sizeof(io),
             "\"input\": {\"name\": \"x\", \"datatype\": \"FP32\", \"shape\": [-1, 3, 8, 8]}, "
             "\"outputs\": [{\"name\": \"y\", \"datatype\": \"FP32\", \"shape\": [-1, %d]}], "
             "\"labels\": [\"cat\", \"dog\", \"owl\", \"fox\"]",
             nclasses);
    return model_of(io);
}

static void assert_entry(json_t *a, size_t i, int index, const char *label, double score)
{
    json_t *e = json_array_get(a, i);
    cr_assert_not_null(e, "entry %zu", i);
    cr_assert_eq(json_integer_value(json_object_get(e, "index")), index, "entry %zu", i);
    cr_assert_str_eq(json_string_value(json_object_get(e, "label")), label, "entry %zu", i);
    cr_assert_float_eq(json_number_value(json_object_get(e, "score")), score, 1e-6, "entry %zu", i);
}

Test(infer_reply, top_k_ranks_classes_by_score_with_softmax_and_labels)
{
    gw_model_t *m = classifier(4);
    const float row[4] = {1.0f, 3.0f, 2.0f, 0.0f};
    double sum = exp(1) + exp(3) + exp(2) + exp(0);
    json_t *a = gw_top_k_json(m, row, 3);
    cr_assert_eq(json_array_size(a), 3);
    assert_entry(a, 0, 1, "dog", exp(3) / sum);
    assert_entry(a, 1, 2, "owl", exp(2) / sum);
    assert_entry(a, 2, 0, "cat", exp(1) / sum);
    json_decref(a);
    gw_model_unref(m);
}

Test(infer_reply, top_k_breaks_ties_by_the_lower_class_index)
{
    gw_model_t *m = classifier(4);
    const float row[4] = {0.5f, 2.0f, 0.5f, 2.0f};
    json_t *a = gw_top_k_json(m, row, 4);
    cr_assert_eq(json_array_size(a), 4);
    double hi = exp(2.0) / (2 * exp(2.0) + 2 * exp(0.5)),
           lo = exp(0.5) / (2 * exp(2.0) + 2 * exp(0.5));
    assert_entry(a, 0, 1, "dog", hi);
    assert_entry(a, 1, 3, "fox", hi);
    assert_entry(a, 2, 0, "cat", lo);
    assert_entry(a, 3, 2, "owl", lo);
    json_decref(a);
    gw_model_unref(m);
}

Test(infer_reply, top_1_is_the_best_class_alone)
{
    gw_model_t *m = classifier(4);
    const float row[4] = {-1.0f, -2.0f, 4.0f, -3.0f};
    json_t *a = gw_top_k_json(m, row, 1);
    cr_assert_eq(json_array_size(a), 1);
    cr_assert_eq(json_integer_value(json_object_get(json_array_get(a, 0), "index")), 2);
    json_decref(a);
    gw_model_unref(m);
}

Test(infer_reply, timing_is_each_phases_longest_item)
{
    gw_item_t items[2];
    memset(items, 0, sizeof(items));
    int64_t t0 = sq_now_us() - 50000;
    /* item 0: 2 ms preprocess, 10 ms queued, 3 ms run in a batch of 4;
     * item 1: 5 ms preprocess, 1 ms queued, 7 ms run in a batch of 2. */
    items[0].times.ready_us = t0 + 2000;
    items[0].times.sent_us = t0 + 12000;
    items[0].times.done_us = t0 + 15000;
    items[0].times.batch_size = 4;
    items[1].times.ready_us = t0 + 5000;
    items[1].times.sent_us = t0 + 6000;
    items[1].times.done_us = t0 + 13000;
    items[1].times.batch_size = 2;
    gw_infer_t req = {.arrival_us = t0, .n_items = 2, .items = items};
    gw_infer_timing_t t = gw_infer_timing(&req);
    cr_assert_float_eq(t.preprocess_ms, 5, 1e-9);
    cr_assert_float_eq(t.queue_ms, 10, 1e-9);
    cr_assert_float_eq(t.execute_ms, 7, 1e-9);
    cr_assert_eq(t.batch_size, 4);
    cr_assert(t.total_ms >= 50 && t.total_ms < 5000, "since arrival: %g", t.total_ms);
}

Test(infer_reply, an_slo_below_what_the_items_take_alone_says_no_retry_helps)
{
    gw_infer_t req = {.err = SQ_DEADLINE, .slo_ms = 5, .slo_source = "request", .n_items = 2};
    snprintf(req.err_detail, sizeof(req.err_detail), "dropped");
    char why[640];
    cr_assert_eq(gw_infer_failure_why(&req, 12.3, why, sizeof(why)), 0, "no Retry-After");
    cr_assert_str_eq(why, "dropped: an SLO of 5 ms (request) cannot be met for 2 items, which "
                          "take at least 12.3 ms alone on an idle worker; ask for 13 ms or "
                          "more, or for none (best effort)");
}

Test(infer_reply, an_slo_missed_under_load_says_a_retry_can_make_it)
{
    gw_infer_t req = {.err = SQ_DEADLINE, .slo_ms = 50, .n_items = 1};
    char why[640];
    cr_assert_eq(gw_infer_failure_why(&req, 12.3, why, sizeof(why)), 1, "Retry-After");
    char want[640];
    snprintf(want, sizeof(want),
             "%s under the current load: SLO 50 ms (server); alone on an idle worker it takes "
             "12.3 ms, so a retry can make it, or a larger SLO, or none (best effort)",
             sq_err_msg(SQ_DEADLINE));
    cr_assert_str_eq(why, want, "no detail: the error's message; no source: the server's");
}

Test(infer_reply, a_deadline_failure_below_what_the_items_take_alone_is_slo_too_tight_400)
{
    gw_infer_t req = {.err = SQ_DEADLINE, .slo_ms = 5, .slo_source = "request", .n_items = 2};
    cr_assert_eq(gw_infer_failure_code(&req, 12.3), SQ_SLO_TOO_TIGHT);
    cr_assert_eq(sq_err_http_status(gw_infer_failure_code(&req, 12.3)), 400);
    /* At the least exactly, or above it: missed under the load, a retry
     * can make it. */
    cr_assert_eq(gw_infer_failure_code(&req, 5), SQ_DEADLINE);
    req.slo_ms = 50;
    cr_assert_eq(gw_infer_failure_code(&req, 12.3), SQ_DEADLINE);
    cr_assert_eq(sq_err_http_status(gw_infer_failure_code(&req, 12.3)), 503);
    /* The least unknown (no profile, no worker of its kind): as it was. */
    req.slo_ms = 5;
    cr_assert_eq(gw_infer_failure_code(&req, 0), SQ_DEADLINE);
    /* Best effort has no SLO to be too tight. */
    req.slo_ms = 0;
    cr_assert_eq(gw_infer_failure_code(&req, 12.3), SQ_DEADLINE);
    /* Other failures keep their code. */
    req = (gw_infer_t){.err = SQ_WORKER_LOST, .slo_ms = 5, .n_items = 1};
    cr_assert_eq(gw_infer_failure_code(&req, 12.3), SQ_WORKER_LOST);
}

Test(infer_reply, an_slo_too_tight_without_a_detail_says_the_slo_and_what_to_ask_for)
{
    gw_infer_t req = {.err = SQ_SLO_TOO_TIGHT, .slo_ms = 5, .slo_source = "model", .n_items = 1};
    char why[640];
    cr_assert_eq(gw_infer_failure_why(&req, 12.3, why, sizeof(why)), 0, "no Retry-After");
    cr_assert_str_eq(why, "an SLO of 5 ms (model) cannot be met for 1 item, which take at least "
                          "12.3 ms alone on an idle worker; ask for 13 ms or more, or for none "
                          "(best effort)");
}

Test(infer_reply, a_detector_answers_its_boxes_in_image_pixels_with_labels)
{
    /* YOLO-style [1, 4 + 2, 8] on an 8x8 input; labels name the classes. */
    char io[1024];
    snprintf(io, sizeof(io),
             "\"input\": {\"name\": \"x\", \"datatype\": \"FP32\", \"shape\": [-1, 3, 8, 8]}, "
             "\"outputs\": [{\"name\": \"y\", \"shape\": [-1, 6, 8]}], \"labels\": [\"cat\", "
             "\"dog\"], \"detector\": {\"layout\": \"yolo\", \"score_threshold\": 0.4}");
    gw_model_t *m = model_of(io);
    cr_assert(m->has_detector);
    float row[48] = {0};
    /* anchor 2: centre (4, 2), 4 x 2 input pixels, dog 0.8; anchor 5 the
     * same box, dog 0.5 (suppressed), anchor 6 out of the image, cat 0.9 */
    const float a2[6] = {4, 2, 4, 2, 0.1f, 0.8f}, a5[6] = {4, 2, 4, 2, 0.1f, 0.5f},
                a6[6] = {9, 9, 4, 4, 0.9f, 0};
    for (int j = 0; j < 6; j++) {
        row[j * 8 + 2] = a2[j];
        row[j * 8 + 5] = a5[j];
        row[j * 8 + 6] = a6[j];
    }
    json_t *d = gw_v1_detections_json(m, row, 80, 40);
    char *txt = json_dumps(d, JSON_COMPACT);
    cr_assert_str_eq(txt, "[{\"box\":[70.0,35.0,80.0,40.0],\"index\":0,\"label\":\"cat\",\"score\":"
                          "0.89999997615814209},{\"box\":[20.0,5.0,60.0,15.0],\"index\":1,"
                          "\"label\":\"dog\",\"score\":0.80000001192092896}]");
    free(txt);
    json_decref(d);
    gw_model_unref(m);
}

Test(infer_reply, a_segmenter_answers_its_classes_by_pixel_share)
{
    char io[512];
    snprintf(io, sizeof(io),
             "\"input\": {\"name\": \"x\", \"datatype\": \"FP32\", \"shape\": [-1, 3, 8, 8]}, "
             "\"outputs\": [{\"name\": \"out\", \"shape\": [-1, 3, 2, 2]}], \"labels\": [\"bg\", "
             "\"cat\", \"dog\"], \"segmenter\": true");
    gw_model_t *m = model_of(io);
    cr_assert(m->segmenter);
    /* pixels: dog, dog, dog, bg; cat never wins */
    const float row[12] = {0, 0, 0, 5, /* cat */ 1, 1, 1, 1, /* dog */ 2, 2, 2, 0};
    json_t *s = gw_v1_segments_json(m, row);
    char *txt = json_dumps(s, JSON_COMPACT);
    cr_assert_str_eq(txt, "[{\"index\":2,\"label\":\"dog\",\"share\":0.75},{\"index\":0,\"label\":"
                          "\"bg\",\"share\":0.25}]");
    free(txt);
    json_decref(s);
    gw_model_unref(m);
}
