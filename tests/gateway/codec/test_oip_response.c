/* gateway/codec/oip_response.c: responses, JSON and binary. */
#include "oip_test.h"

static gw_oip_request_t request_for(const char *json, const gw_oip_model_t *m)
{
    gw_oip_request_t r;
    int rc = parse_json(json, m, &r);
    cr_assert_eq(rc, 0, "%s", err);
    return r;
}

Test(oip, json_response_parses_back_exactly)
{
    gw_oip_model_t m = small_model();
    gw_oip_request_t r =
        request_for("{\"id\":\"a\\\"b\\u0001\",\"inputs\":[{\"name\":\"input\",\"shape\":[2],"
                    "\"datatype\":\"BYTES\",\"data\":[\"QUJD\",\"QUJD\"]}],"
                    "\"outputs\":[{\"name\":\"features\"},{\"name\":\"logits\","
                    "\"parameters\":{\"classification\":3}}]}",
                    &m);
    float logits[2 * 10], features[2 * 4];
    for (int i = 0; i < 20; i++)
        logits[i] = (float)((i * 7) % 10) * 0.1f + (i >= 10 ? 1 : 0);
    logits[3] = logits[4]; /* a tie: the lower index ranks first */
    logits[19] = 5.0f;     /* row 1: index 9, whose label is NULL */
    for (int i = 0; i < 8; i++)
        features[i] = 1.0f / (float)(i + 1) - 0.3f;
    const float *outs[2] = {logits, features};
    const char *labels[10] = {"zero", "one", "two",   "three", "four",
                              "five", "six", "seven", "eight", NULL};
    gw_oip_param_t params[3] = {
        {"queue_ms", 1.25, NULL}, {"batch_size", 2, NULL}, {"slo_source", 0, "no\"ne"}};
    gw_oip_response_t resp = {.model_name = "tiny",
                              .model_version = "3",
                              .model = &m,
                              .request = &r,
                              .outputs = outs,
                              .labels = labels,
                              .nlabels = 10,
                              .params = params,
                              .nparams = 3};
    sq_buf_t b;
    sq_buf_init(&b);
    long long hl = 99;
    cr_assert_eq(gw_oip_response_encode(&resp, &b, &hl), 0);
    cr_assert_eq(hl, -1);
    json_error_t je;
    json_t *j = json_loadb((const char *)b.data, b.len, 0, &je);
    cr_assert_not_null(j, "%s: %.*s", je.text, (int)b.len, b.data);
    cr_assert_str_eq(json_string_value(json_object_get(j, "model_name")), "tiny");
    cr_assert_str_eq(json_string_value(json_object_get(j, "model_version")), "3");
    cr_assert_eq(json_string_length(json_object_get(j, "id")), 4);
    cr_assert_eq(memcmp(json_string_value(json_object_get(j, "id")), "a\"b\x01", 4), 0);
    json_t *p = json_object_get(j, "parameters");
    cr_assert_eq(json_real_value(json_object_get(p, "queue_ms")), 1.25);
    cr_assert_str_eq(json_string_value(json_object_get(p, "slo_source")), "no\"ne");
    json_t *outputs = json_object_get(j, "outputs");
    cr_assert_eq(json_array_size(outputs), 2);
    json_t *f = json_array_get(outputs, 0);
    cr_assert_str_eq(json_string_value(json_object_get(f, "name")), "features");
    cr_assert_str_eq(json_string_value(json_object_get(f, "datatype")), "FP32");
    json_t *shape = json_object_get(f, "shape");
    cr_assert_eq(json_array_size(shape), 3);
    cr_assert_eq(json_integer_value(json_array_get(shape, 0)), 2);
    cr_assert_eq(json_integer_value(json_array_get(shape, 2)), 2);
    json_t *data = json_object_get(f, "data");
    cr_assert_eq(json_array_size(data), 8);
    for (int i = 0; i < 8; i++)
        cr_assert_eq((float)json_number_value(json_array_get(data, (size_t)i)), features[i]);
    json_t *c = json_array_get(outputs, 1);
    cr_assert_str_eq(json_string_value(json_object_get(c, "datatype")), "BYTES");
    shape = json_object_get(c, "shape");
    cr_assert_eq(json_integer_value(json_array_get(shape, 0)), 2);
    cr_assert_eq(json_integer_value(json_array_get(shape, 1)), 3);
    data = json_object_get(c, "data");
    cr_assert_eq(json_array_size(data), 6);
    /* Row 0 scores: index i -> ((7i) % 10) * 0.1, with [3] = [4] = 0.8: the
     * best are 7 (0.9), 3 (0.8, lower index), 4 (0.8). */
    char want[64];
    char s9[32];
    gw_oip_format_float(logits[7], s9);
    snprintf(want, sizeof(want), "%s:7:seven", s9);
    cr_assert_str_eq(json_string_value(json_array_get(data, 0)), want);
    gw_oip_format_float(logits[3], s9);
    snprintf(want, sizeof(want), "%s:3:three", s9);
    cr_assert_str_eq(json_string_value(json_array_get(data, 1)), want);
    snprintf(want, sizeof(want), "%s:4:four", s9);
    cr_assert_str_eq(json_string_value(json_array_get(data, 2)), want);
    /* Row 1: 9 is best (1.9); its label is NULL: "score:index". */
    gw_oip_format_float(logits[19], s9);
    snprintf(want, sizeof(want), "%s:9", s9);
    cr_assert_str_eq(json_string_value(json_array_get(data, 3)), want);
    json_decref(j);
    sq_buf_dispose(&b);

    /* A requested output without data is the caller's bug. */
    const float *missing[2] = {logits, NULL};
    resp.outputs = missing;
    sq_buf_init(&b);
    cr_assert_eq(gw_oip_response_encode(&resp, &b, &hl), SQ_INVAL);
    sq_buf_dispose(&b);
    gw_oip_request_dispose(&r);
}

Test(oip, binary_response_has_a_json_header_then_raw_outputs)
{
    gw_oip_model_t m = small_model();
    gw_oip_request_t r =
        request_for("{\"inputs\":[{\"name\":\"input\",\"shape\":[2],"
                    "\"datatype\":\"BYTES\",\"data\":[\"QUJD\",\"QUJD\"]}],"
                    "\"parameters\":{\"binary_data_output\":true},"
                    "\"outputs\":[{\"name\":\"logits\",\"parameters\":{\"classification\":2}},"
                    "{\"name\":\"features\"}]}",
                    &m);
    float logits[20], features[8];
    for (int i = 0; i < 20; i++)
        logits[i] = (float)i;
    for (int i = 0; i < 8; i++)
        features[i] = -(float)i / 3.0f;
    const float *outs[2] = {logits, features};
    gw_oip_response_t resp = {.model_name = "tiny", .model = &m, .request = &r, .outputs = outs};
    sq_buf_t b;
    sq_buf_init(&b);
    long long hl;
    cr_assert_eq(gw_oip_response_encode(&resp, &b, &hl), 0);
    cr_assert_gt(hl, 0);
    json_error_t je;
    json_t *j = json_loadb((const char *)b.data, (size_t)hl, 0, &je);
    cr_assert_not_null(j, "%s", je.text);
    cr_assert_null(json_object_get(j, "model_version"));
    cr_assert_null(json_object_get(j, "id"));
    json_t *outputs = json_object_get(j, "outputs");
    json_t *c = json_array_get(outputs, 0), *f = json_array_get(outputs, 1);
    cr_assert_null(json_object_get(c, "data"));
    size_t csize = (size_t)json_integer_value(
        json_object_get(json_object_get(c, "parameters"), "binary_data_size"));
    size_t fsize = (size_t)json_integer_value(
        json_object_get(json_object_get(f, "parameters"), "binary_data_size"));
    cr_assert_eq(fsize, sizeof(features));
    cr_assert_eq((size_t)hl + csize + fsize, b.len);
    /* Classification strings: 4-byte length + "score:index", best first. */
    const uint8_t *p = b.data + hl;
    const char *want[4] = {"9:9", "8:8", "19:9", "18:8"};
    for (int i = 0; i < 4; i++) {
        uint32_t n = sq_le32(p);
        cr_assert_eq(n, strlen(want[i]));
        cr_assert_eq(memcmp(p + 4, want[i], n), 0, "%.*s", (int)n, p + 4);
        p += 4 + n;
    }
    cr_assert_eq(p, b.data + hl + csize);
    cr_assert_eq(memcmp(p, features, sizeof(features)), 0);
    json_decref(j);
    sq_buf_dispose(&b);
    gw_oip_request_dispose(&r);
}

Test(oip, classification_k_beyond_the_insertion_path_sorts)
{
    gw_oip_model_t m = imagenet_model();
    gw_oip_request_t r =
        request_for("{\"inputs\":[{\"name\":\"input\",\"shape\":[1],\"datatype\":\"BYTES\","
                    "\"data\":[\"QUJD\"]}],\"outputs\":[{\"name\":\"logits\","
                    "\"parameters\":{\"classification\":5000,\"binary_data\":true}}]}",
                    &m);
    float *logits = malloc(1000 * sizeof(float));
    for (int i = 0; i < 1000; i++)
        logits[i] = (float)((i * 389) % 1000); /* a permutation of 0..999 */
    logits[10] = NAN;
    const float *outs[1] = {logits};
    gw_oip_response_t resp = {.model_name = "m", .model = &m, .request = &r, .outputs = outs};
    sq_buf_t b;
    sq_buf_init(&b);
    long long hl;
    cr_assert_eq(gw_oip_response_encode(&resp, &b, &hl), 0);
    cr_assert(strstr((const char *)b.data, "\"shape\":[1,1000]") != NULL, "k capped at 1000");
    const uint8_t *p = b.data + hl;
    float prev = INFINITY;
    for (int i = 0; i < 1000; i++) {
        uint32_t n = sq_le32(p);
        char s[64];
        memcpy(s, p + 4, n);
        s[n] = '\0';
        p += 4 + n;
        if (i == 999) {
            cr_assert_str_eq(s, "null:10", "NaN ranks last");
            break;
        }
        float score = strtof(s, NULL);
        cr_assert_leq(score, prev);
        prev = score;
    }
    sq_buf_dispose(&b);
    free(logits);
    gw_oip_request_dispose(&r);
}

/* ---- round trip over random tensors ---- */

static uint64_t rng_state;

static uint32_t rng(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 32);
}

static float random_float(void)
{
    for (;;) {
        uint32_t u = rng();
        if (u % 4 == 0)
            return (float)(int)(rng() % 512) - 256; /* small integers */
        if (u % 4 == 1)
            return ((float)rng() / 4294967296.0f - 0.5f) * 8; /* typical values */
        float f = bits_to_float(rng());
        if (isfinite(f))
            return f;
    }
}

Test(oip, random_tensors_round_trip_through_request_and_response)
{
    rng_state = 20261122;
    gw_oip_model_t m = small_model();
    for (int iter = 0; iter < 200; iter++) {
        int batch = 1 + (int)(rng() % 8);
        size_t count = (size_t)batch * ITEM;
        float *t = malloc(count * sizeof(float));
        for (size_t i = 0; i < count; i++)
            t[i] = random_float();
        int form = (int)(rng() % 3); /* JSON flat, JSON per row, binary */
        sq_buf_t b;
        sq_buf_init(&b);
        sb_printf(&b,
                  "{\"id\":\"it%d\",\"inputs\":[{\"name\":\"input\",\"shape\":[%d,3,4,4],"
                  "\"datatype\":\"FP32\",",
                  iter, batch);
        long long hl = -1;
        if (form == 2) {
            sb_printf(&b, "\"parameters\":{\"binary_data_size\":%zu}}]}", count * 4);
            hl = (long long)b.len;
            sq_buf_put(&b, t, count * 4);
        } else {
            sb_printf(&b, "\"data\":[");
            for (size_t i = 0; i < count; i++) {
                if (form == 1 && i % ITEM == 0)
                    sb_printf(&b, "%s[", i ? "," : "");
                else if (i > 0)
                    sb_printf(&b, ",");
                sb_float(&b, t[i]);
                if (form == 1 && i % ITEM == ITEM - 1)
                    sb_printf(&b, "]");
            }
            sb_printf(&b, "]}]}");
        }
        gw_oip_request_t r;
        cr_assert_eq(gw_oip_request_parse(b.data, b.len, hl, &m, &r, err, sizeof(err)), 0,
                     "iter %d form %d: %s", iter, form, err);
        cr_assert_eq(r.batch, batch);
        for (size_t i = 0; i < count; i++)
            cr_assert_eq(float_bits(row_f32(&r.inputs[0].rows[i / ITEM], i % ITEM)),
                         float_bits(t[i]), "iter %d element %zu", iter, i);
        /* Echo the rows back as the model's outputs: logits are the first 10
         * of each row, features the next 4; JSON or binary at random. */
        float *logits = malloc((size_t)batch * 10 * sizeof(float));
        float *feat = malloc((size_t)batch * 4 * sizeof(float));
        for (int k = 0; k < batch; k++) {
            memcpy(logits + k * 10, t + k * ITEM, 40);
            memcpy(feat + k * 4, t + k * ITEM + 10, 16);
        }
        r.outputs[0].binary = (int)(rng() % 2);
        r.outputs[1].binary = (int)(rng() % 2);
        const float *outs[2] = {logits, feat};
        gw_oip_response_t resp = {
            .model_name = "tiny", .model = &m, .request = &r, .outputs = outs};
        sq_buf_t o;
        sq_buf_init(&o);
        long long ohl;
        cr_assert_eq(gw_oip_response_encode(&resp, &o, &ohl), 0);
        size_t jl = ohl >= 0 ? (size_t)ohl : o.len;
        json_error_t je;
        json_t *j = json_loadb((const char *)o.data, jl, 0, &je);
        cr_assert_not_null(j, "%s", je.text);
        char id[16];
        snprintf(id, sizeof(id), "it%d", iter);
        cr_assert_str_eq(json_string_value(json_object_get(j, "id")), id);
        const uint8_t *bin = o.data + jl;
        for (int k = 0; k < 2; k++) {
            json_t *out = json_array_get(json_object_get(j, "outputs"), (size_t)k);
            const float *want = k == 0 ? logits : feat;
            size_t n = (size_t)batch * (k == 0 ? 10 : 4);
            if (r.outputs[k].binary) {
                cr_assert_eq(memcmp(bin, want, n * 4), 0);
                bin += n * 4;
                continue;
            }
            json_t *data = json_object_get(out, "data");
            cr_assert_eq(json_array_size(data), n);
            for (size_t i = 0; i < n; i++)
                cr_assert_eq(float_bits((float)json_number_value(json_array_get(data, i))),
                             float_bits(want[i]), "iter %d output %d element %zu", iter, k, i);
        }
        cr_assert_eq(bin, o.data + o.len);
        json_decref(j);
        sq_buf_dispose(&o);
        free(logits);
        free(feat);
        gw_oip_request_dispose(&r);
        sq_buf_dispose(&b);
        free(t);
    }
}

/* ---- the JSON validator against jansson ---- */
