/* gateway/api/infer_request.c: an inference request's setup without a
 * server: the SLO and priority a client may ask for, the JPEG signature,
 * the deadline an SLO (or none) gives under --max-request-ms, and the
 * items' arrays. */
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

Test(infer_request, an_slo_is_a_finite_number_above_zero)
{
    double v = -1;
    cr_assert_eq(gw_infer_parse_positive("12.5", &v), 0);
    cr_assert_float_eq(v, 12.5, 1e-12);
    cr_assert_eq(gw_infer_parse_positive("1e2", &v), 0);
    cr_assert_float_eq(v, 100, 1e-12);
    const char *bad[] = {"0", "-3", "", "abc", "5ms", " ", "inf", "nan", "1e999"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        v = 7;
        cr_assert_eq(gw_infer_parse_positive(bad[i], &v), -1, "'%s'", bad[i]);
        cr_assert_float_eq(v, 7, 1e-12, "'%s' leaves the value alone", bad[i]);
    }
}

Test(infer_request, a_priority_is_digits_only_up_to_int32_max)
{
    int64_t p = -1;
    cr_assert_eq(gw_infer_parse_priority("0", &p), 0);
    cr_assert_eq(p, 0);
    cr_assert_eq(gw_infer_parse_priority("3", &p), 0);
    cr_assert_eq(p, 3);
    cr_assert_eq(gw_infer_parse_priority("2147483647", &p), 0);
    cr_assert_eq(p, 2147483647);
    const char *bad[] = {
        "", "-1", "+1", " 1", "1 ", "1.0", "x", "2147483648", "99999999999999999999"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        p = 42;
        cr_assert_eq(gw_infer_parse_priority(bad[i], &p), -1, "'%s'", bad[i]);
        cr_assert_eq(p, 42, "'%s' leaves the value alone", bad[i]);
    }
}

Test(infer_request, a_jpeg_starts_with_ff_d8_ff)
{
    const uint8_t jpeg[] = {0xFF, 0xD8, 0xFF, 0xE0}, png[] = {0x89, 'P', 'N', 'G'};
    cr_assert(gw_infer_is_jpeg(jpeg, sizeof(jpeg)));
    cr_assert(gw_infer_is_jpeg(jpeg, 3));
    cr_assert_not(gw_infer_is_jpeg(jpeg, 2), "too short");
    cr_assert_not(gw_infer_is_jpeg(png, sizeof(png)));
}

static gw_api_config_t cfg_capped_at(int max_request_ms)
{
    gw_api_config_t cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.max_request_ms = max_request_ms;
    return cfg;
}

Test(infer_request, a_requests_slo_replaces_the_default_and_sets_the_deadline)
{
    gw_api_config_t cfg = cfg_capped_at(60000);
    gw_infer_t req = {.arrival_us = 1000000, .slo_ms = 100, .slo_source = "model"};
    gw_infer_set_deadline(&req, 250, &cfg);
    cr_assert_float_eq(req.slo_ms, 250, 1e-12);
    cr_assert_str_eq(req.slo_source, "request");
    cr_assert_eq(req.deadline_us, 1000000 + 250000);
    cr_assert_float_eq(req.slo_asked_ms, 0, 1e-12, "not capped");
}

Test(infer_request, no_slo_asked_keeps_the_default)
{
    gw_api_config_t cfg = cfg_capped_at(60000);
    gw_infer_t req = {.arrival_us = 5000, .slo_ms = 100, .slo_source = "model"};
    gw_infer_set_deadline(&req, -1, &cfg);
    cr_assert_float_eq(req.slo_ms, 100, 1e-12);
    cr_assert_str_eq(req.slo_source, "model");
    cr_assert_eq(req.deadline_us, 5000 + 100000);
}

Test(infer_request, an_slo_above_max_request_ms_is_capped_and_the_ask_kept)
{
    gw_api_config_t cfg = cfg_capped_at(2000);
    gw_infer_t req = {.arrival_us = 0};
    gw_infer_set_deadline(&req, 5000, &cfg);
    cr_assert_float_eq(req.slo_ms, 2000, 1e-12);
    cr_assert_float_eq(req.slo_asked_ms, 5000, 1e-12, "the answer's warning names it");
    cr_assert_eq(req.deadline_us, 2000000);
}

Test(infer_request, best_effort_lives_until_max_request_ms)
{
    gw_api_config_t cfg = cfg_capped_at(30000);
    gw_infer_t req = {.arrival_us = 7, .slo_ms = 0, .slo_source = "none"};
    gw_infer_set_deadline(&req, -1, &cfg);
    cr_assert_float_eq(req.slo_ms, 0, 1e-12, "still best effort");
    cr_assert_str_eq(req.slo_source, "none");
    cr_assert_eq(req.deadline_us, 7 + 30000000LL);
}

Test(infer_request, items_are_numbered_pending_and_owned_by_their_request)
{
    gw_model_t *m = model_of("\"input\": {\"name\": \"x\", \"datatype\": \"FP32\", \"shape\": "
                             "[-1, 3, 8, 8]}, \"outputs\": [{\"name\": \"a\", \"datatype\": "
                             "\"FP32\", \"shape\": [-1, 4]}, {\"name\": \"b\", \"datatype\": "
                             "\"FP32\", \"shape\": [-1, 2, 3]}]");
    cr_assert_eq(m->out_elems, 10);
    gw_infer_t req = {.model = m};
    cr_assert_eq(gw_infer_alloc_items(&req, 3), 0);
    cr_assert_eq(req.n_items, 3);
    cr_assert_eq(atomic_load(&req.pending), 3);
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(req.items[i].owner.req, &req);
        cr_assert_eq(req.items[i].owner.index, i);
        cr_assert_eq(req.items[i].input.in_off, -1, "no arena slot yet");
    }
    /* Room for every item's row of every output. */
    req.outputs[3 * 10 - 1] = 1.0f;
    cr_assert_float_eq(req.outputs[0], 0.0f, 1e-12);
    free(req.items);
    free(req.preps);
    free(req.outputs);
    gw_model_unref(m);
}
