/* gateway/codec/oip.c and oip_data.c: parsing OIP v2 inference requests
 * (JSON and the binary extension) against a model description. */
#include "oip_test.h"

Test(oip, fp32_flat_nested_and_per_row_data_decode_alike)
{
    gw_oip_model_t m = small_model();
    for (int levels = 1; levels <= 4; levels++) {
        sq_buf_t b;
        sq_buf_init(&b);
        fp32_request(&b, 3, levels);
        gw_oip_request_t r;
        cr_assert_eq(parse_json(sb_str(&b), &m, &r), 0, "levels %d: %s", levels, err);
        check_fp32_rows(&r, 3);
        cr_assert_null(r.id);
        cr_assert_eq(r.slo_ms, -1);
        cr_assert_eq(r.header_len, -1);
        cr_assert_eq(r.noutputs, 2, "no outputs listed: every output");
        cr_assert_eq(r.outputs[0].model_output, 0);
        cr_assert_eq(r.outputs[1].model_output, 1);
        cr_assert_eq(r.outputs[0].binary, 0);
        gw_oip_request_dispose(&r);
        sq_buf_dispose(&b);
    }
}

Test(oip, members_come_in_any_order)
{
    /* "data" before the fields that say how to read it: read on a second
     * look; the usual order is read in place. Both decode alike. */
    gw_oip_model_t m = small_model();
    sq_buf_t b;
    sq_buf_init(&b);
    const int dims[4] = {2, 3, 4, 4};
    int next = 0;
    sb_printf(&b, "{\"outputs\":[{\"name\":\"logits\"}],\"inputs\":[{\"data\":");
    emit_nested(&b, dims, 4, 0, 3, &next);
    sb_printf(&b, ",\"parameters\":{\"x\":1},\"datatype\":\"FP32\",\"shape\":[2,3,4,4],"
                  "\"name\":\"input\"}],\"id\":\"late\"}");
    gw_oip_request_t r;
    cr_assert_eq(parse_json(sb_str(&b), &m, &r), 0, "%s", err);
    check_fp32_rows(&r, 2);
    cr_assert_str_eq(r.id, "late");
    cr_assert_eq(r.noutputs, 1);
    gw_oip_request_dispose(&r);
    sq_buf_dispose(&b);
    cr_assert_eq(parse_json("{\"inputs\":[{\"data\":[\"QUJD\"],\"name\":\"input\","
                            "\"datatype\":\"BYTES\",\"shape\":[1]}]}",
                            &m, &r),
                 0, "%s", err);
    cr_assert_eq(r.inputs[0].rows[0].len, 3);
    gw_oip_request_dispose(&r);
    expect_error("{\"inputs\":[{\"data\":[1,2],\"name\":\"input\",\"datatype\":\"UINT8\","
                 "\"shape\":[1,3,4,4]}]}",
                 &m, SQ_BAD_TENSOR, "inputs[0].data: 2 elements for shape [1,3,4,4] (48)");
}

Test(oip, nested_data_must_follow_the_shape)
{
    gw_oip_model_t m = small_model();
    sq_buf_t b;
    sq_buf_init(&b);
    fp32_request(&b, 2, 4);
    /* Drop the last element of the innermost array of row 1, channel 2, y 3. */
    char *s = (char *)sb_str(&b);
    char *last = strstr(s, "]]]]");
    cr_assert_not_null(last);
    char *comma = last;
    while (*comma != ',')
        comma--;
    memmove(comma, last, strlen(last) + 1);
    gw_oip_request_t r;
    cr_assert_eq(parse_json(s, &m, &r), SQ_BAD_TENSOR);
    cr_assert_str_eq(err, "inputs[0].data[1][2][3]: 3 elements, expected 4");
    sq_buf_dispose(&b);

    expect_error("{\"inputs\":[{\"name\":\"input\",\"shape\":[1,3,4,4],\"datatype\":\"FP32\","
                 "\"data\":[[[[[1]]]]]}]}",
                 &m, SQ_BAD_TENSOR, "inputs[0].data: nested deeper than the shape");
    expect_error("{\"inputs\":[{\"name\":\"input\",\"shape\":[1,3,4,4],\"datatype\":\"FP32\","
                 "\"data\":[[1],[2]]}]}",
                 &m, SQ_BAD_TENSOR, "inputs[0].data[0]: 1 elements, expected 48");
    expect_error("{\"inputs\":[{\"name\":\"input\",\"shape\":[1,3,4,4],\"datatype\":\"FP32\","
                 "\"data\":{\"a\":1}}]}",
                 &m, SQ_BAD_TENSOR, "inputs[0].data: expected an array");
}

Test(oip, element_count_and_types_are_exact)
{
    gw_oip_model_t m = imagenet_model();
    /* 150527 zeros for [1,3,224,224]: the message of the issue, verbatim. */
    sq_buf_t b;
    sq_buf_init(&b);
    sb_printf(&b, "{\"inputs\":[{\"name\":\"input\",\"shape\":[1,3,224,224],"
                  "\"datatype\":\"FP32\",\"data\":[0");
    for (int i = 1; i < 150527; i++)
        sb_printf(&b, ",0");
    sb_printf(&b, "]}]}");
    gw_oip_request_t r;
    cr_assert_eq(parse_json(sb_str(&b), &m, &r), SQ_BAD_TENSOR);
    cr_assert_str_eq(err, "inputs[0].data: 150527 elements for shape [1,3,224,224] (150528)");
    /* One more and it is accepted. */
    b.len -= 4;
    sb_printf(&b, ",7]}]}");
    cr_assert_eq(parse_json(sb_str(&b), &m, &r), 0, "%s", err);
    cr_assert_eq(r.inputs[0].rows[0].len, 150528 * 4);
    cr_assert_eq(row_f32(&r.inputs[0].rows[0], 150527), 7.0f);
    gw_oip_request_dispose(&r);
    /* Too many is as wrong as too few. */
    b.len -= 4;
    sb_printf(&b, ",8]}]}");
    cr_assert_eq(parse_json(sb_str(&b), &m, &r), SQ_BAD_TENSOR);
    cr_assert_str_eq(err, "inputs[0].data: 150529 elements for shape [1,3,224,224] (150528)");
    sq_buf_dispose(&b);

    gw_oip_model_t s = small_model();
    expect_error("{\"inputs\":[{\"name\":\"input\",\"shape\":[1,3,4,4],\"datatype\":\"FP32\","
                 "\"data\":[1,2,\"3\"]}]}",
                 &s, SQ_BAD_TENSOR, "inputs[0].data[2]: expected a number");
    expect_error("{\"inputs\":[{\"name\":\"input\",\"shape\":[1,3,4,4],\"datatype\":\"FP32\","
                 "\"data\":[1,true]}]}",
                 &s, SQ_BAD_TENSOR, "inputs[0].data[1]: expected a number");
    expect_error("{\"inputs\":[{\"name\":\"input\",\"shape\":[1,3,4,4],\"datatype\":\"FP32\","
                 "\"data\":[1,null]}]}",
                 &s, SQ_BAD_TENSOR, "inputs[0].data[1]: expected a number");
    expect_error("{\"inputs\":[{\"name\":\"input\",\"shape\":[1,3,4,4],\"datatype\":\"FP32\","
                 "\"data\":[1e39]}]}",
                 &s, SQ_BAD_TENSOR, "inputs[0].data[0]: 1e39 is out of range for FP32");
}

static void uint8_request(sq_buf_t *b, int batch, const char *last)
{
    sb_printf(b,
              "{\"inputs\":[{\"name\":\"input\",\"shape\":[%d,3,4,4],\"datatype\":\"UINT8\","
              "\"data\":[",
              batch);
    for (int i = 0; i < batch * ITEM - 1; i++)
        sb_printf(b, "%d,", (i * 37) % 256);
    sb_printf(b, "%s]}]}", last);
}

Test(oip, uint8_tensors_take_integers_0_to_255)
{
    gw_oip_model_t m = small_model();
    sq_buf_t b;
    sq_buf_init(&b);
    uint8_request(&b, 2, "255");
    gw_oip_request_t r;
    cr_assert_eq(parse_json(sb_str(&b), &m, &r), 0, "%s", err);
    cr_assert_eq(r.inputs[0].datatype, GW_OIP_UINT8);
    cr_assert_eq(r.inputs[0].rows[1].len, ITEM);
    for (int i = 0; i < 2 * ITEM - 1; i++)
        cr_assert_eq(r.inputs[0].rows[i / ITEM].data[i % ITEM], (i * 37) % 256);
    cr_assert_eq(r.inputs[0].rows[1].data[ITEM - 1], 255);
    gw_oip_request_dispose(&r);
    const char *bad[] = {"256", "-1", "1.5", "1e2", "2.0"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        b.len = 0;
        uint8_request(&b, 2, bad[i]);
        cr_assert_eq(parse_json(sb_str(&b), &m, &r), SQ_BAD_TENSOR, "%s", bad[i]);
        char want[128];
        snprintf(want, sizeof(want), "inputs[0].data[95]: %s is not a UINT8", bad[i]);
        cr_assert(strncmp(err, want, strlen(want)) == 0, "%s", err);
    }
    sq_buf_dispose(&b);
}

static char *b64(const void *data, size_t n)
{
    char *s = malloc(4 * ((n + 2) / 3) + 1);
    s[gw_oip_base64_encode(data, n, s)] = '\0';
    return s;
}

Test(oip, bytes_inputs_carry_base64_jpegs)
{
    gw_oip_model_t m = small_model();
    const uint8_t jpeg1[] = {0xFF, 0xD8, 0xFF, 0xE0, 0x00, 0x10, 'J', 'F', 'I', 'F', 0xFF, 0xD9};
    const uint8_t jpeg2[] = {0xFF, 0xD8, 0xFF, 0xDB, 0xFB, 0xFF, 0xD9}; /* 0xFB 0xFF: '+' '/' */
    char *e1 = b64(jpeg1, sizeof(jpeg1)), *e2 = b64(jpeg2, sizeof(jpeg2));
    cr_assert(strchr(e2, '/') != NULL, "the fixture exercises '/' (%s)", e2);
    char json[512];
    const char *forms[] = {
        "{\"id\":\"x\",\"inputs\":[{\"name\":\"input\",\"shape\":[2],\"datatype\":\"BYTES\","
        "\"data\":[\"%s\",\"%s\"]}]}",
        "{\"inputs\":[{\"name\":\"input\",\"shape\":[2,1],\"datatype\":\"BYTES\","
        "\"data\":[[\"%s\"],[\"%s\"]]}]}",
        "{\"inputs\":[{\"name\":\"input\",\"shape\":[2,1],\"datatype\":\"BYTES\","
        "\"data\":[\"%s\",\"%s\"]}]}",
    };
    for (size_t f = 0; f < 3; f++) {
        snprintf(json, sizeof(json), forms[f], e1, e2);
        gw_oip_request_t r;
        cr_assert_eq(parse_json(json, &m, &r), 0, "form %zu: %s", f, err);
        cr_assert_eq(r.batch, 2);
        cr_assert_eq(r.inputs[0].datatype, GW_OIP_BYTES);
        cr_assert_eq(r.inputs[0].rows[0].len, sizeof(jpeg1));
        cr_assert_eq(memcmp(r.inputs[0].rows[0].data, jpeg1, sizeof(jpeg1)), 0);
        cr_assert_eq(r.inputs[0].rows[1].len, sizeof(jpeg2));
        cr_assert_eq(memcmp(r.inputs[0].rows[1].data, jpeg2, sizeof(jpeg2)), 0);
        gw_oip_request_dispose(&r);
    }
    /* "\/" is JSON for '/', as some encoders write it. */
    char escaped[64] = "";
    for (const char *p = e2; *p; p++) {
        if (*p == '/')
            strcat(escaped, "\\/");
        else
            strncat(escaped, p, 1);
    }
    snprintf(json, sizeof(json),
             "{\"inputs\":[{\"name\":\"input\",\"shape\":[1],\"datatype\":\"BYTES\","
             "\"data\":[\"%s\"]}]}",
             escaped);
    gw_oip_request_t r;
    cr_assert_eq(parse_json(json, &m, &r), 0, "%s", err);
    cr_assert_eq(memcmp(r.inputs[0].rows[0].data, jpeg2, sizeof(jpeg2)), 0);
    gw_oip_request_dispose(&r);
    free(e1);
    free(e2);

    const char *tmpl = "{\"inputs\":[{\"name\":\"input\",\"shape\":[1],\"datatype\":\"BYTES\","
                       "\"data\":[%s]}]}";
    const struct {
        const char *data, *what;
        int code;
    } bad[] = {
        {"\"QQ=\"", "inputs[0].data[0]: invalid base64", SQ_BAD_TENSOR},
        {"\"QQ\"", "inputs[0].data[0]: invalid base64", SQ_BAD_TENSOR},
        {"\"QR==\"", "inputs[0].data[0]: invalid base64", SQ_BAD_TENSOR},
        {"\"QU JD\"", "inputs[0].data[0]: invalid base64", SQ_BAD_TENSOR},
        {"\"QUJD\\n\"", "inputs[0].data[0]: invalid base64", SQ_BAD_TENSOR},
        {"\"QU-_\"", "inputs[0].data[0]: invalid base64", SQ_BAD_TENSOR},
        {"\"\"", "inputs[0].data[0]: empty image", SQ_BAD_TENSOR},
        {"3", "inputs[0].data[0]: expected a base64 string", SQ_BAD_TENSOR},
        {"\"QUJD\",\"QUJD\"", "inputs[0].data: 2 elements for shape [1] (1)", SQ_BAD_TENSOR},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        snprintf(json, sizeof(json), tmpl, bad[i].data);
        expect_error(json, &m, bad[i].code, bad[i].what);
    }
    /* [N,2] is no image batch; an image bigger than the limit is 413. */
    expect_error("{\"inputs\":[{\"name\":\"input\",\"shape\":[1,2],\"datatype\":\"BYTES\","
                 "\"data\":[\"QUJD\",\"QUJD\"]}]}",
                 &m, SQ_BAD_TENSOR, "inputs[0].shape: expected [N] or [N,1] for BYTES images");
    m.max_image_bytes = 5;
    expect_error("{\"inputs\":[{\"name\":\"input\",\"shape\":[1],\"datatype\":\"BYTES\","
                 "\"data\":[\"QUJDREVG\"]}]}",
                 &m, SQ_TOO_LARGE, "inputs[0].data[0]: image larger than 5 bytes");
}

/* ---- the binary extension ---- */

static uint8_t *binary_body(const char *header, const void *tail, size_t tail_len, size_t *len)
{
    size_t h = strlen(header);
    uint8_t *body = malloc(h + tail_len);
    memcpy(body, header, h);
    memcpy(body + h, tail, tail_len);
    *len = h + tail_len;
    return body;
}

Test(oip, binary_tensors_follow_the_json_header)
{
    gw_oip_model_t m = small_model();
    float t[2 * ITEM];
    for (int i = 0; i < 2 * ITEM; i++)
        t[i] = (float)i / 7.0f;
    const char *h = "{\"inputs\":[{\"name\":\"input\",\"shape\":[2,3,4,4],\"datatype\":\"FP32\","
                    "\"parameters\":{\"binary_data_size\":384}}],"
                    "\"outputs\":[{\"name\":\"features\",\"parameters\":{\"binary_data\":true}}]}";
    size_t len;
    uint8_t *body = binary_body(h, t, sizeof(t), &len);
    gw_oip_request_t r;
    cr_assert_eq(gw_oip_request_parse(body, len, (long long)strlen(h), &m, &r, err, sizeof(err)), 0,
                 "%s", err);
    cr_assert_eq(r.batch, 2);
    cr_assert_eq(r.header_len, (int)strlen(h));
    cr_assert_eq(r.inputs[0].binary, 1);
    cr_assert_eq(r.inputs[0].rows[0].data, body + strlen(h), "zero copy");
    cr_assert_eq(r.inputs[0].rows[1].data, body + strlen(h) + ITEM * 4);
    cr_assert_eq(memcmp(r.inputs[0].rows[1].data, t + ITEM, ITEM * 4), 0);
    cr_assert_eq(r.noutputs, 1);
    cr_assert_eq(r.outputs[0].model_output, 1);
    cr_assert_eq(r.outputs[0].binary, 1);
    gw_oip_request_dispose(&r);

    /* A size that does not match the shape; more than the body holds (even
     * absurdly more); bytes left over; binary data without the header. */
    cr_assert_eq(
        gw_oip_request_parse(body, len - 4, (long long)strlen(h), &m, &r, err, sizeof(err)),
        SQ_BAD_REQUEST);
    cr_assert(strstr(err, "inputs[0].parameters.binary_data_size: 384 bytes declared but only "
                          "380 left") != NULL,
              "%s", err);
    free(body);
    const char *h2 = "{\"inputs\":[{\"name\":\"input\",\"shape\":[2,3,4,4],\"datatype\":\"FP32\","
                     "\"parameters\":{\"binary_data_size\":100}}]}";
    body = binary_body(h2, t, 100, &len);
    cr_assert_eq(gw_oip_request_parse(body, len, (long long)strlen(h2), &m, &r, err, sizeof(err)),
                 SQ_BAD_TENSOR);
    cr_assert_str_eq(err, "inputs[0].parameters.binary_data_size: 100 bytes for FP32 "
                          "[2,3,4,4] (384)");
    free(body);
    const char *h3 = "{\"inputs\":[{\"name\":\"input\",\"shape\":[2,3,4,4],\"datatype\":\"FP32\","
                     "\"parameters\":{\"binary_data_size\":9223372036854775807}}]}";
    body = binary_body(h3, t, sizeof(t), &len);
    cr_assert_eq(gw_oip_request_parse(body, len, (long long)strlen(h3), &m, &r, err, sizeof(err)),
                 SQ_BAD_REQUEST);
    cr_assert(strstr(err, "9223372036854775807 bytes declared but only 384 left") != NULL, "%s",
              err);
    free(body);
    body = binary_body(h, t, sizeof(t), &len);
    uint8_t *longer = malloc(len + 3);
    memcpy(longer, body, len);
    cr_assert_eq(
        gw_oip_request_parse(longer, len + 3, (long long)strlen(h), &m, &r, err, sizeof(err)),
        SQ_BAD_REQUEST);
    cr_assert_str_eq(err, "body: 3 bytes after the binary tensors");
    free(longer);
    cr_assert_eq(gw_oip_request_parse(body, strlen(h), -1, &m, &r, err, sizeof(err)),
                 SQ_BAD_REQUEST);
    cr_assert_str_eq(err, "inputs[0].parameters.binary_data_size: binary data needs the "
                          "Inference-Header-Content-Length header");
    cr_assert_eq(gw_oip_request_parse(body, len, (long long)len + 1, &m, &r, err, sizeof(err)),
                 SQ_BAD_REQUEST);
    cr_assert(strstr(err, "Inference-Header-Content-Length") != NULL, "%s", err);
    cr_assert_eq(gw_oip_request_parse(body, len, -7, &m, &r, err, sizeof(err)), SQ_BAD_REQUEST);
    /* A header length that cuts the JSON short is not JSON. */
    cr_assert_eq(gw_oip_request_parse(body, len, 20, &m, &r, err, sizeof(err)), SQ_BAD_JSON);
    free(body);
}

Test(oip, binary_bytes_elements_are_length_prefixed)
{
    gw_oip_model_t m = small_model();
    uint8_t tail[4 + 3 + 4 + 5];
    sq_put_le32(tail, 3);
    memcpy(tail + 4, "\xFF\xD8\xFF", 3);
    sq_put_le32(tail + 7, 5);
    memcpy(tail + 11, "\xFF\xD8\xFF\xE1\x00", 5);
    const char *h = "{\"inputs\":[{\"name\":\"input\",\"shape\":[2],\"datatype\":\"BYTES\","
                    "\"parameters\":{\"binary_data_size\":16}}]}";
    size_t len;
    uint8_t *body = binary_body(h, tail, sizeof(tail), &len);
    gw_oip_request_t r;
    cr_assert_eq(gw_oip_request_parse(body, len, (long long)strlen(h), &m, &r, err, sizeof(err)), 0,
                 "%s", err);
    cr_assert_eq(r.inputs[0].datatype, GW_OIP_BYTES);
    cr_assert_eq(r.inputs[0].rows[0].len, 3);
    cr_assert_eq(r.inputs[0].rows[0].data, body + strlen(h) + 4);
    cr_assert_eq(r.inputs[0].rows[1].len, 5);
    cr_assert_eq(memcmp(r.inputs[0].rows[1].data, "\xFF\xD8\xFF\xE1\x00", 5), 0);
    gw_oip_request_dispose(&r);
    free(body);

    /* An element length running past the tensor, one that is huge, a
     * missing length, an empty image. */
    sq_put_le32(tail + 7, 6);
    body = binary_body(h, tail, sizeof(tail), &len);
    cr_assert_eq(gw_oip_request_parse(body, len, (long long)strlen(h), &m, &r, err, sizeof(err)),
                 SQ_BAD_TENSOR);
    cr_assert_str_eq(err, "inputs[0].parameters.binary_data_size: element 1: 6 bytes declared by "
                          "its 4-byte little-endian length prefix, 5 left in the tensor");
    free(body);
    sq_put_le32(tail + 7, 0xFFFFFFFFu);
    body = binary_body(h, tail, sizeof(tail), &len);
    cr_assert_eq(gw_oip_request_parse(body, len, (long long)strlen(h), &m, &r, err, sizeof(err)),
                 SQ_BAD_TENSOR);
    free(body);
    sq_put_le32(tail + 7, 5);
    sq_put_le32(tail, 0);
    body = binary_body(h, tail, sizeof(tail), &len);
    cr_assert_eq(gw_oip_request_parse(body, len, (long long)strlen(h), &m, &r, err, sizeof(err)),
                 SQ_BAD_TENSOR);
    cr_assert(strstr(err, "element 0: empty image") != NULL, "%s", err);
    free(body);
    const char *h1 = "{\"inputs\":[{\"name\":\"input\",\"shape\":[1],\"datatype\":\"BYTES\","
                     "\"parameters\":{\"binary_data_size\":2}}]}";
    body = binary_body(h1, "\x01\x00", 2, &len);
    cr_assert_eq(gw_oip_request_parse(body, len, (long long)strlen(h1), &m, &r, err, sizeof(err)),
                 SQ_BAD_TENSOR);
    cr_assert(strstr(err, "element 0: missing its 4-byte length") != NULL, "%s", err);
    free(body);
}

Test(oip, header_length_zero_means_one_raw_tensor)
{
    gw_oip_model_t m = small_model();
    float t[ITEM];
    for (int i = 0; i < ITEM; i++)
        t[i] = (float)i;
    gw_oip_request_t r;
    cr_assert_eq(gw_oip_request_parse((const uint8_t *)t, sizeof(t), 0, &m, &r, err, sizeof(err)),
                 0, "%s", err);
    cr_assert_eq(r.batch, 1);
    cr_assert_eq(r.header_len, 0);
    cr_assert_eq(r.inputs[0].datatype, GW_OIP_FP32);
    cr_assert_eq(r.inputs[0].binary, 1);
    cr_assert_eq(r.inputs[0].rows[0].data, (const uint8_t *)t);
    cr_assert_eq(r.inputs[0].rows[0].len, sizeof(t));
    cr_assert_eq(r.noutputs, 2);
    cr_assert_null(r.id);
    gw_oip_request_dispose(&r);
    cr_assert_eq(
        gw_oip_request_parse((const uint8_t *)t, sizeof(t) - 1, 0, &m, &r, err, sizeof(err)),
        SQ_BAD_TENSOR);
    cr_assert_str_eq(err, "body: 191 bytes, expected 192 for FP32 [1,3,4,4] (raw tensor)");
    gw_oip_model_t two = two_input_model();
    cr_assert_eq(gw_oip_request_parse((const uint8_t *)t, sizeof(t), 0, &two, &r, err, sizeof(err)),
                 SQ_BAD_REQUEST);
    cr_assert(strstr(err, "single input") != NULL, "%s", err);
}

Test(oip, several_inputs_map_by_name_and_binary_follows_request_order)
{
    gw_oip_model_t m = two_input_model();
    float scale[2 * 2] = {1.5f, -2.5f, 3.5f, 4.5f};
    float image[2 * ITEM];
    for (int i = 0; i < 2 * ITEM; i++)
        image[i] = (float)(1000 + i);
    /* "scale" first in the request, then "image": the binary part holds
     * scale's bytes, then image's. */
    const char *h = "{\"inputs\":[{\"name\":\"scale\",\"shape\":[2,2],\"datatype\":\"FP32\","
                    "\"parameters\":{\"binary_data_size\":16}},"
                    "{\"name\":\"image\",\"shape\":[2,3,4,4],\"datatype\":\"FP32\","
                    "\"parameters\":{\"binary_data_size\":384}}]}";
    uint8_t tail[16 + 384];
    memcpy(tail, scale, 16);
    memcpy(tail + 16, image, 384);
    size_t len;
    uint8_t *body = binary_body(h, tail, sizeof(tail), &len);
    gw_oip_request_t r;
    cr_assert_eq(gw_oip_request_parse(body, len, (long long)strlen(h), &m, &r, err, sizeof(err)), 0,
                 "%s", err);
    cr_assert_eq(r.batch, 2);
    cr_assert_eq(row_f32(&r.inputs[0].rows[0], 0), 1000.0f, "inputs[] follow the model's order");
    cr_assert_eq(row_f32(&r.inputs[0].rows[1], 0), 1000.0f + ITEM);
    cr_assert_eq(row_f32(&r.inputs[1].rows[0], 1), -2.5f);
    cr_assert_eq(row_f32(&r.inputs[1].rows[1], 0), 3.5f);
    gw_oip_request_dispose(&r);
    free(body);

    /* Mixed: scale in JSON, image binary. */
    const char *h2 = "{\"inputs\":[{\"name\":\"image\",\"shape\":[2,3,4,4],\"datatype\":\"FP32\","
                     "\"parameters\":{\"binary_data_size\":384}},"
                     "{\"name\":\"scale\",\"shape\":[2,2],\"datatype\":\"FP32\","
                     "\"data\":[[1,2],[3,4]]}]}";
    body = binary_body(h2, image, 384, &len);
    cr_assert_eq(gw_oip_request_parse(body, len, (long long)strlen(h2), &m, &r, err, sizeof(err)),
                 0, "%s", err);
    cr_assert_eq(r.inputs[1].binary, 0);
    cr_assert_eq(r.inputs[0].binary, 1);
    cr_assert_eq(row_f32(&r.inputs[1].rows[1], 1), 4.0f);
    gw_oip_request_dispose(&r);
    free(body);

    expect_error("{\"inputs\":[{\"name\":\"scale\",\"shape\":[1,2],\"datatype\":\"FP32\","
                 "\"data\":[1,2]}]}",
                 &m, SQ_BAD_TENSOR, "inputs: missing input \"image\"");
    expect_error("{\"inputs\":[{\"name\":\"scale\",\"shape\":[1,2],\"datatype\":\"FP32\","
                 "\"data\":[1,2]},{\"name\":\"scale\",\"shape\":[1,2],\"datatype\":\"FP32\","
                 "\"data\":[1,2]}]}",
                 &m, SQ_BAD_REQUEST, "inputs[1].name: input \"scale\" given twice");
    expect_error("{\"inputs\":[{\"name\":\"scale\",\"shape\":[1,2],\"datatype\":\"FP32\","
                 "\"data\":[1,2]},{\"name\":\"image\",\"shape\":[2,3,4,4],\"datatype\":\"FP32\","
                 "\"data\":[1]}]}",
                 &m, SQ_BAD_TENSOR, "inputs[1].shape: batch size 2 differs from the other");
    expect_error("{\"inputs\":[{\"name\":\"scale\",\"shape\":[1,2],\"datatype\":\"BYTES\","
                 "\"data\":[\"QUJD\"]}]}",
                 &m, SQ_BAD_TENSOR,
                 "inputs[0].datatype: BYTES is not accepted for \"scale\" "
                 "(expected FP32)");
}

/* ---- fields around the tensors ---- */

Test(oip, id_and_scheduling_parameters)
{
    gw_oip_model_t m = small_model();
    const char *tail = ",\"inputs\":[{\"name\":\"input\",\"shape\":[1],\"datatype\":\"BYTES\","
                       "\"data\":[\"QUJD\"]}]}";
    char json[1024];
    gw_oip_request_t r;
    snprintf(json, sizeof(json),
             "{\"id\":\"req-\\u00e9\\\"1\",\"parameters\":{\"slo_ms\":42.5,\"priority\":2,"
             "\"binary_data_output\":true,\"custom\":{\"x\":[1,2]}}%s",
             tail);
    cr_assert_eq(parse_json(json, &m, &r), 0, "%s", err);
    cr_assert_eq(r.id_len, 8);
    cr_assert_str_eq(r.id, "req-\xc3\xa9\"1");
    cr_assert_eq(r.slo_ms, 42.5);
    cr_assert_eq(r.priority, 2);
    cr_assert_eq(r.binary_data_output, 1);
    cr_assert_eq(r.outputs[0].binary, 1, "binary_data_output applies to every output");
    cr_assert_eq(r.outputs[1].binary, 1);
    gw_oip_request_set_id(&r, "generated", 9);
    cr_assert_str_eq(r.id, "generated");
    gw_oip_request_dispose(&r);

    snprintf(json, sizeof(json), "{\"parameters\":{\"timeout\":250000}%s", tail);
    cr_assert_eq(parse_json(json, &m, &r), 0, "%s", err);
    cr_assert_eq(r.slo_ms, 250.0, "Triton's timeout is in microseconds");
    cr_assert_eq(r.slo_is_timeout, 1, "an X-SLO-Ms header wins over it");
    gw_oip_request_dispose(&r);
    snprintf(json, sizeof(json), "{\"parameters\":{\"timeout\":250000,\"slo_ms\":30}%s", tail);
    cr_assert_eq(parse_json(json, &m, &r), 0, "%s", err);
    cr_assert_eq(r.slo_ms, 30.0, "slo_ms wins over timeout");
    cr_assert_eq(r.slo_is_timeout, 0);
    gw_oip_request_dispose(&r);
    snprintf(json, sizeof(json), "{\"parameters\":{\"timeout\":0}%s", tail);
    cr_assert_eq(parse_json(json, &m, &r), 0, "%s", err);
    cr_assert_eq(r.slo_ms, -1, "timeout 0 is no timeout: the model's default");
    gw_oip_request_dispose(&r);

    const struct {
        const char *head, *what;
        int code;
    } bad[] = {
        {"{\"id\":5", "id: expected a string", SQ_BAD_REQUEST},
        {"{\"parameters\":{\"slo_ms\":0}", "parameters.slo_ms: expected a number", SQ_BAD_REQUEST},
        {"{\"parameters\":{\"slo_ms\":\"5\"}", "parameters.slo_ms: expected", SQ_BAD_REQUEST},
        {"{\"parameters\":{\"timeout\":-1}", "parameters.timeout: expected an integer",
         SQ_BAD_REQUEST},
        {"{\"parameters\":{\"timeout\":1.5}", "parameters.timeout: expected", SQ_BAD_REQUEST},
        {"{\"parameters\":{\"priority\":-2}", "parameters.priority: expected", SQ_BAD_REQUEST},
        {"{\"parameters\":{\"binary_data_output\":1}",
         "parameters.binary_data_output: expected true or false", SQ_BAD_REQUEST},
        {"{\"parameters\":[]", "parameters: expected an object", SQ_BAD_REQUEST},
        {"{\"id\":\"a\",\"id\":\"b\"", "id: given twice", SQ_BAD_REQUEST},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        snprintf(json, sizeof(json), "%s%s", bad[i].head, tail);
        expect_error(json, &m, bad[i].code, bad[i].what);
    }
    /* An id past the limit. */
    char big[2048] = "{\"id\":\"";
    memset(big + strlen(big), 'x', GW_OIP_ID_MAX + 1);
    strcat(big, "\"");
    strcat(big, tail);
    expect_error(big, &m, SQ_TOO_LARGE, "id: longer than 256 bytes");
}

Test(oip, requested_outputs)
{
    gw_oip_model_t m = small_model();
    const char *head = "{\"inputs\":[{\"name\":\"input\",\"shape\":[1],\"datatype\":\"BYTES\","
                       "\"data\":[\"QUJD\"]}],";
    char json[1024];
    gw_oip_request_t r;
    snprintf(json, sizeof(json),
             "%s\"parameters\":{\"binary_data_output\":true},"
             "\"outputs\":[{\"name\":\"logits\",\"parameters\":{\"classification\":3,"
             "\"binary_data\":false}},{\"name\":\"features\"}]}",
             head);
    cr_assert_eq(parse_json(json, &m, &r), 0, "%s", err);
    cr_assert_eq(r.noutputs, 2);
    cr_assert_eq(r.outputs[0].model_output, 0);
    cr_assert_eq(r.outputs[0].classification, 3);
    cr_assert_eq(r.outputs[0].binary, 0, "binary_data overrides binary_data_output");
    cr_assert_eq(r.outputs[1].model_output, 1);
    cr_assert_eq(r.outputs[1].binary, 1);
    gw_oip_request_dispose(&r);
    snprintf(json, sizeof(json), "%s\"outputs\":[]}", head);
    cr_assert_eq(parse_json(json, &m, &r), 0, "%s", err);
    cr_assert_eq(r.noutputs, 2, "an empty list asks for every output");
    gw_oip_request_dispose(&r);

    snprintf(json, sizeof(json), "%s\"outputs\":[{\"name\":\"prob\"}]}", head);
    expect_error(json, &m, SQ_BAD_TENSOR, "outputs[0].name: unknown output \"prob\"");
    snprintf(json, sizeof(json), "%s\"outputs\":[{\"name\":\"logits\"},{\"name\":\"logits\"}]}",
             head);
    expect_error(json, &m, SQ_BAD_REQUEST, "outputs[1].name: output \"logits\" requested twice");
    snprintf(json, sizeof(json),
             "%s\"outputs\":[{\"name\":\"logits\",\"parameters\":{\"classification\":-1}}]}", head);
    expect_error(json, &m, SQ_BAD_REQUEST, "outputs[0].parameters.classification: expected");
    snprintf(json, sizeof(json), "%s\"outputs\":[{\"parameters\":{}}]}", head);
    expect_error(json, &m, SQ_BAD_REQUEST, "outputs[0].name: missing");
}

Test(oip, input_errors_name_their_path)
{
    gw_oip_model_t m = imagenet_model();
    const struct {
        const char *json, *what;
        int code;
    } bad[] = {
        {"{}", "inputs: missing", SQ_BAD_REQUEST},
        {"[]", "expected a JSON object", SQ_BAD_REQUEST},
        {"{\"inputs\":{}}", "inputs: expected an array", SQ_BAD_REQUEST},
        {"{\"inputs\":[5]}", "inputs[0]: expected an object", SQ_BAD_REQUEST},
        {"{\"inputs\":[]}", "inputs: missing input \"input\"", SQ_BAD_TENSOR},
        {"{\"inputs\":[{\"name\":\"img\",\"shape\":[1],\"datatype\":\"BYTES\",\"data\":[]}]}",
         "inputs[0].name: unknown input \"img\" (the model takes \"input\")", SQ_BAD_TENSOR},
        {"{\"inputs\":[{\"shape\":[1],\"datatype\":\"BYTES\",\"data\":[]}]}",
         "inputs[0].name: missing", SQ_BAD_REQUEST},
        {"{\"inputs\":[{\"name\":\"input\",\"shape\":[1,3,224,224],\"datatype\":\"INT64\","
         "\"data\":[]}]}",
         "inputs[0].datatype: INT64 is not accepted for \"input\" (expected FP32 or BYTES)",
         SQ_BAD_TENSOR},
        {"{\"inputs\":[{\"name\":\"input\",\"shape\":[1,3,224,224],\"datatype\":\"UINT8\","
         "\"data\":[]}]}",
         "inputs[0].datatype: UINT8 is not accepted", SQ_BAD_TENSOR},
        {"{\"inputs\":[{\"name\":\"input\",\"shape\":[1,3,224,224],\"datatype\":\"float\","
         "\"data\":[]}]}",
         "inputs[0].datatype: unknown datatype \"float\"", SQ_BAD_TENSOR},
        {"{\"inputs\":[{\"name\":\"input\",\"shape\":[1,224,224,3],\"datatype\":\"FP32\","
         "\"data\":[]}]}",
         "inputs[0].shape: expected [N,3,224,224]", SQ_BAD_TENSOR},
        {"{\"inputs\":[{\"name\":\"input\",\"shape\":[3,224,224],\"datatype\":\"FP32\","
         "\"data\":[]}]}",
         "inputs[0].shape: expected [N,3,224,224]", SQ_BAD_TENSOR},
        {"{\"inputs\":[{\"name\":\"input\",\"shape\":[0,3,224,224],\"datatype\":\"FP32\","
         "\"data\":[]}]}",
         "inputs[0].shape: batch size 0, expected at least 1", SQ_BAD_TENSOR},
        {"{\"inputs\":[{\"name\":\"input\",\"shape\":[65,3,224,224],\"datatype\":\"FP32\","
         "\"data\":[]}]}",
         "inputs[0].shape: batch size 65 over the model's maximum 64", SQ_TOO_LARGE},
        {"{\"inputs\":[{\"name\":\"input\",\"shape\":[99999999999,3,224,224],"
         "\"datatype\":\"FP32\",\"data\":[]}]}",
         "inputs[0].shape: batch size 99999999999 over", SQ_TOO_LARGE},
        {"{\"inputs\":[{\"name\":\"input\",\"shape\":[1,-3,224,224],\"datatype\":\"FP32\","
         "\"data\":[]}]}",
         "inputs[0].shape[1]: expected an integer >= 0", SQ_BAD_TENSOR},
        {"{\"inputs\":[{\"name\":\"input\",\"shape\":[1,1,1,1,1,1,1,1,1,1],"
         "\"datatype\":\"FP32\",\"data\":[]}]}",
         "inputs[0].shape: more than 9 dimensions", SQ_BAD_TENSOR},
        {"{\"inputs\":[{\"name\":\"input\",\"datatype\":\"FP32\",\"data\":[]}]}",
         "inputs[0].shape: missing", SQ_BAD_REQUEST},
        {"{\"inputs\":[{\"name\":\"input\",\"shape\":[1],\"data\":[]}]}",
         "inputs[0].datatype: missing", SQ_BAD_REQUEST},
        {"{\"inputs\":[{\"name\":\"input\",\"shape\":[1],\"datatype\":\"BYTES\"}]}",
         "inputs[0].data: missing", SQ_BAD_REQUEST},
        {"{\"inputs\":[{\"name\":\"input\",\"shape\":[1],\"datatype\":\"BYTES\","
         "\"parameters\":{\"binary_data_size\":0},\"data\":[]}]}",
         "inputs[0]: both data and parameters.binary_data_size given", SQ_BAD_REQUEST},
        {"{\"inputs\":[{\"name\":\"input\",\"shape\":[1],\"datatype\":\"BYTES\","
         "\"data\":[\"QUJD\"],\"parameters\":{\"binary_data_size\":0}}]}",
         "inputs[0]: both data and parameters.binary_data_size given", SQ_BAD_REQUEST},
        {"{\"inputs\":[{\"name\":\"input\",\"shape\":[1],\"shape\":[1]}]}",
         "inputs[0].shape: given twice", SQ_BAD_REQUEST},
        {"{\"inputs\":[{\"name\":\"input\",\"shape\":[1],\"datatype\":\"BYTES\","
         "\"data\":[\"QUJD\"]},{\"name\":\"x\"}]}",
         "inputs[1]: the model takes 1 input", SQ_BAD_TENSOR},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        expect_error(bad[i].json, &m, bad[i].code, bad[i].what);
}

Test(oip, malformed_json_is_bad_json_whatever_it_says)
{
    gw_oip_model_t m = small_model();
    const char *bad[] = {
        "",
        "   ",
        "{",
        "{\"inputs\":[}",
        "{\"inputs\":[]",
        "{\"inputs\":[]}x",
        "{\"inputs\":[],}",
        "{\"inputs\" []}",
        "{'inputs':[]}",
        "{\"a\":01}",
        "{\"a\":1.}",
        "{\"a\":-}",
        "{\"a\":1e}",
        "{\"a\":tru}",
        "{\"a\":NaN}",
        "{\"a\":\"\\x\"}",
        "{\"a\":\"\\ud800\"}",
        "{\"a\":\"\\udc00\"}",
        "{\"a\":\"\\u12\"}",
        "{\"a\":\"tab\there\"}",
        "{\"a\":\"\xc3\"}",
        "{\"a\":\"\xc0\xaf\"}",
        "{\"a\":\"\xed\xa0\x80\"}",
        "{\"a\":\"\xf4\x90\x80\x80\"}",
        "{\"a\":\"unterminated}",
        "{\"inputs\":[{\"name\":\"input\",\"shape\":[1,3,4,4],\"datatype\":\"FP32\","
        "\"data\":[1,2,3,]}]}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        expect_error(bad[i], &m, SQ_BAD_JSON, "invalid JSON at byte");
    /* Valid UTF-8 of every length and escaped pairs are fine. */
    const char *ok = "{\"x\":\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\\ud83d\\ude00\\n\\/\","
                     "\"inputs\":[{\"name\":\"input\",\"shape\":[1],\"datatype\":\"BYTES\","
                     "\"data\":[\"QUJD\"]}]}";
    gw_oip_request_t r;
    cr_assert_eq(parse_json(ok, &m, &r), 0, "%s", err);
    gw_oip_request_dispose(&r);
    /* A NUL byte inside the body is not JSON either. */
    const char nul[] = "{\"a\":\"x\0y\",\"inputs\":[]}";
    cr_assert_eq(
        gw_oip_request_parse((const uint8_t *)nul, sizeof(nul) - 1, -1, &m, &r, err, sizeof(err)),
        SQ_BAD_JSON);
}

/* ---- limits ---- */

Test(oip, a_depth_bomb_is_too_large_and_cheap)
{
    gw_oip_model_t m = small_model();
    size_t depth = 100000;
    char *bomb = malloc(2 * depth + 64);
    size_t o = 0;
    o += (size_t)sprintf(bomb, "{\"inputs\":");
    memset(bomb + o, '[', depth);
    o += depth;
    memset(bomb + o, ']', depth);
    o += depth;
    bomb[o++] = '}';
    gw_oip_request_t r;
    cr_assert_eq(gw_oip_request_parse((const uint8_t *)bomb, o, -1, &m, &r, err, sizeof(err)),
                 SQ_TOO_LARGE);
    cr_assert(strstr(err, "nested deeper than 32 levels") != NULL, "%s", err);
    /* Inside an ignored member, and unterminated: still too deep first. */
    o = (size_t)sprintf(bomb, "{\"extra\":{");
    for (size_t i = 0; i < depth / 6; i++) {
        memcpy(bomb + o, "\"k\":[{", 6);
        o += 6;
    }
    cr_assert_eq(gw_oip_request_parse((const uint8_t *)bomb, o, -1, &m, &r, err, sizeof(err)),
                 SQ_TOO_LARGE);
    free(bomb);
    /* At the limit exactly it parses (and the unknown member is skipped). */
    m.max_depth = 8;
    const char *deep = "{\"x\":[[[[[[[1]]]]]]],\"inputs\":[{\"name\":\"input\",\"shape\":[1],"
                       "\"datatype\":\"BYTES\",\"data\":[\"QUJD\"]}]}";
    cr_assert_eq(parse_json(deep, &m, &r), 0, "%s", err);
    gw_oip_request_dispose(&r);
    m.max_depth = 7;
    cr_assert_eq(parse_json(deep, &m, &r), SQ_TOO_LARGE);
}

Test(oip, body_limit)
{
    gw_oip_model_t m = small_model();
    m.max_body_bytes = 10;
    expect_error("{\"inputs\":[]}", &m, SQ_TOO_LARGE, "body of 13 bytes over the limit of 10");
}

Test(oip, a_short_body_with_a_big_shape_allocates_nothing_big)
{
    /* 64 x 3 x 224 x 224 floats would be 38 MB; the text has 3 numbers. */
    gw_oip_model_t m = imagenet_model();
    expect_error("{\"inputs\":[{\"name\":\"input\",\"shape\":[64,3,224,224],\"datatype\":\"FP32\","
                 "\"data\":[1,2,3]}]}",
                 &m, SQ_BAD_TENSOR,
                 "inputs[0].data: 3 elements for shape [64,3,224,224] (9633792)");
}

Test(oip, invalid_model_descriptions_are_refused)
{
    gw_oip_model_t m = small_model();
    m.max_batch = 0;
    gw_oip_request_t r;
    cr_assert_eq(parse_json("{}", &m, &r), SQ_INVAL);
    m = small_model();
    m.inputs[0].item_shape[1] = 0;
    cr_assert_eq(parse_json("{}", &m, &r), SQ_INVAL);
    m = small_model();
    m.inputs[0].datatype = GW_OIP_BYTES;
    cr_assert_eq(parse_json("{}", &m, &r), SQ_INVAL);
    gw_oip_request_dispose(NULL);
}

/* ---- base64 and floats ---- */
