/* The OIP codec's side of Triton's shared-memory extension (codec/oip.c,
 * oip_data.c, oip_response.c): inputs and outputs that name a region,
 * the limits Triton checks on them, and the response of an output written
 * into one. The regions themselves are the API's (tests/integration/
 * test_shm.py). */
#include "oip_test.h"

/* oip_test.h's small model (input FP32 [N,3,4,4], also UINT8 and BYTES;
 * outputs logits [N,10] and features [N,2,2]), shared memory taken. */
static gw_oip_model_t shm_model(void)
{
    gw_oip_model_t m = small_model();
    m.max_image_bytes = 1000;
    m.shared_memory = 1;
    return m;
}

#define INPUT_HEAD "{\"inputs\":[{\"name\":\"input\",\"shape\":[2,3,4,4],\"datatype\":\"FP32\","

Test(oip_shm, an_fp32_input_names_its_window_and_takes_the_regions_bytes)
{
    gw_oip_model_t m = shm_model();
    gw_oip_request_t r;
    int rc =
        parse_json(INPUT_HEAD "\"parameters\":{\"shared_memory_region\":\"in_0\","
                              "\"shared_memory_offset\":64,\"shared_memory_byte_size\":384}}]}",
                   &m, &r);
    cr_assert_eq(rc, 0, "%s", err);
    const gw_oip_input_t *in = &r.inputs[0];
    cr_assert_str_eq(in->shm.region, "in_0");
    cr_assert_eq(in->shm.offset, 64);
    cr_assert_eq(in->shm.byte_size, 384);
    cr_assert_eq(in->binary, 0);
    cr_assert_eq(r.batch, 2);
    cr_assert_null(in->rows[0].data, "rows wait for the region's bytes");
    /* Every output, none in shared memory. */
    cr_assert_eq(r.noutputs, 2);
    cr_assert_eq(r.outputs[0].shm.region[0], '\0');

    uint8_t region[384];
    for (size_t i = 0; i < sizeof(region); i++)
        region[i] = (uint8_t)i;
    cr_assert_eq(gw_oip_input_set_bytes(&r, &m, 0, region, sizeof(region), err, sizeof(err)), 0,
                 "%s", err);
    cr_assert_eq(in->rows[0].data, region);
    cr_assert_eq(in->rows[0].len, 192);
    cr_assert_eq(in->rows[1].data, region + 192);
    cr_assert_eq(in->rows[1].len, 192);
    gw_oip_request_dispose(&r);

    /* The offset is optional (0), and UINT8 tensors take a byte each. */
    rc = parse_json(
        "{\"inputs\":[{\"name\":\"input\",\"shape\":[1,3,4,4],\"datatype\":\"UINT8\","
        "\"parameters\":{\"shared_memory_region\":\"u\",\"shared_memory_byte_size\":48}}]}",
        &m, &r);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert_eq(r.inputs[0].shm.offset, 0);
    cr_assert_eq(gw_oip_input_set_bytes(&r, &m, 0, region, 48, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(r.inputs[0].rows[0].len, 48);
    gw_oip_request_dispose(&r);
}

Test(oip_shm, the_byte_size_must_be_the_tensors)
{
    gw_oip_model_t m = shm_model();
    expect_error(INPUT_HEAD "\"parameters\":{\"shared_memory_region\":\"in\","
                            "\"shared_memory_byte_size\":768}}]}",
                 &m, SQ_BAD_TENSOR,
                 "inputs[0].parameters.shared_memory_byte_size: 768 bytes, but FP32 [2,3,4,4] "
                 "takes 384");
    expect_error(INPUT_HEAD "\"parameters\":{\"shared_memory_region\":\"in\","
                            "\"shared_memory_byte_size\":0}}]}",
                 &m, SQ_BAD_TENSOR, "0 bytes, but FP32 [2,3,4,4] takes 384");
}

Test(oip_shm, refusals_name_the_parameter)
{
    gw_oip_model_t m = shm_model();
    struct {
        const char *json;
        const char *what;
        int code;
    } bad[] = {
        {INPUT_HEAD "\"parameters\":{\"shared_memory_region\":\"in\"}}]}",
         "inputs[0].parameters.shared_memory_byte_size: missing (parameters.shared_memory_region "
         "needs it)",
         SQ_BAD_REQUEST},
        {INPUT_HEAD "\"parameters\":{\"shared_memory_byte_size\":384},\"data\":[]}]}",
         "inputs[0].parameters.shared_memory_byte_size: given without "
         "parameters.shared_memory_region",
         SQ_BAD_REQUEST},
        {INPUT_HEAD "\"parameters\":{\"shared_memory_offset\":0},\"data\":[]}]}",
         "inputs[0].parameters.shared_memory_offset: given without", SQ_BAD_REQUEST},
        {INPUT_HEAD "\"parameters\":{\"shared_memory_region\":\"in\","
                    "\"shared_memory_byte_size\":384},\"data\":[]}]}",
         "inputs[0]: set only one of data, parameters.binary_data_size and "
         "parameters.shared_memory_region",
         SQ_BAD_REQUEST},
        {INPUT_HEAD "\"parameters\":{\"binary_data_size\":384,\"shared_memory_region\":\"in\","
                    "\"shared_memory_byte_size\":384}}]}",
         "inputs[0]: set only one of", SQ_BAD_REQUEST},
        {INPUT_HEAD "\"parameters\":{\"shared_memory_region\":\"\","
                    "\"shared_memory_byte_size\":384}}]}",
         "inputs[0].parameters.shared_memory_region: expected the name of a registered "
         "shared-memory region (1..127 bytes)",
         SQ_BAD_REQUEST},
        {INPUT_HEAD "\"parameters\":{\"shared_memory_region\":7,"
                    "\"shared_memory_byte_size\":384}}]}",
         "inputs[0].parameters.shared_memory_region: expected a string", SQ_BAD_REQUEST},
        {INPUT_HEAD "\"parameters\":{\"shared_memory_region\":\"a\\u0000b\","
                    "\"shared_memory_byte_size\":384}}]}",
         "expected the name of a registered shared-memory region", SQ_BAD_REQUEST},
        {INPUT_HEAD "\"parameters\":{\"shared_memory_region\":\"in\","
                    "\"shared_memory_byte_size\":-1}}]}",
         "inputs[0].parameters.shared_memory_byte_size: expected an integer >= 0", SQ_BAD_REQUEST},
        {INPUT_HEAD "\"parameters\":{\"shared_memory_region\":\"in\","
                    "\"shared_memory_offset\":1.5,\"shared_memory_byte_size\":384}}]}",
         "inputs[0].parameters.shared_memory_offset: expected an integer >= 0", SQ_BAD_REQUEST},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        expect_error(bad[i].json, &m, bad[i].code, bad[i].what);

    /* A name of 128 bytes is one too many. */
    char json[512], name[129];
    memset(name, 'a', 128);
    name[128] = '\0';
    snprintf(json, sizeof(json),
             INPUT_HEAD "\"parameters\":{\"shared_memory_region\":\"%s\","
                        "\"shared_memory_byte_size\":384}}]}",
             name);
    expect_error(json, &m, SQ_BAD_REQUEST, "(1..127 bytes)");
    name[127] = '\0';
    snprintf(json, sizeof(json),
             INPUT_HEAD "\"parameters\":{\"shared_memory_region\":\"%s\","
                        "\"shared_memory_byte_size\":384}}]}",
             name);
    gw_oip_request_t r;
    cr_assert_eq(parse_json(json, &m, &r), 0, "%s", err);
    cr_assert_eq(strlen(r.inputs[0].shm.region), 127);
    gw_oip_request_dispose(&r);
}

Test(oip_shm, a_route_without_shared_memory_refuses_it)
{
    gw_oip_model_t m = shm_model();
    m.shared_memory = 0;
    expect_error(INPUT_HEAD "\"parameters\":{\"shared_memory_region\":\"in\","
                            "\"shared_memory_byte_size\":384}}]}",
                 &m, SQ_BAD_REQUEST,
                 "inputs[0].parameters.shared_memory_region: shared-memory tensors are not taken "
                 "on this route");
    expect_error("{\"inputs\":[{\"name\":\"input\",\"shape\":[1],\"datatype\":\"BYTES\","
                 "\"data\":[\"QUJD\"]}],\"outputs\":[{\"name\":\"logits\",\"parameters\":"
                 "{\"shared_memory_region\":\"out\",\"shared_memory_byte_size\":40}}]}",
                 &m, SQ_BAD_REQUEST,
                 "outputs[0].parameters.shared_memory_region: shared-memory tensors are not "
                 "taken");
}

/* A BYTES tensor in Triton's binary form: each element's 4-byte
 * little-endian length, then its bytes. */
static size_t put_element(uint8_t *p, const char *s)
{
    uint32_t n = (uint32_t)strlen(s);
    memcpy(p, &n, 4);
    memcpy(p + 4, s, n);
    return 4 + n;
}

Test(oip_shm, bytes_elements_are_length_prefixed_as_in_the_binary_extension)
{
    gw_oip_model_t m = shm_model();
    uint8_t region[64];
    size_t n = put_element(region, "abc");
    n += put_element(region + n, "defgh");
    char json[512];
    snprintf(json, sizeof(json),
             "{\"inputs\":[{\"name\":\"input\",\"shape\":[2],\"datatype\":\"BYTES\","
             "\"parameters\":{\"shared_memory_region\":\"jpegs\",\"shared_memory_byte_size\":%zu}"
             "}]}",
             n);
    gw_oip_request_t r;
    cr_assert_eq(parse_json(json, &m, &r), 0, "%s", err);
    cr_assert_eq(gw_oip_input_set_bytes(&r, &m, 0, region, n, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(r.inputs[0].rows[0].len, 3);
    cr_assert_eq(memcmp(r.inputs[0].rows[0].data, "abc", 3), 0);
    cr_assert_eq(r.inputs[0].rows[1].len, 5);
    cr_assert_eq(memcmp(r.inputs[0].rows[1].data, "defgh", 5), 0);
    gw_oip_request_dispose(&r);

    /* The elements must fill the window exactly; errors name the region. */
    snprintf(json, sizeof(json),
             "{\"inputs\":[{\"name\":\"input\",\"shape\":[1],\"datatype\":\"BYTES\","
             "\"parameters\":{\"shared_memory_region\":\"jpegs\",\"shared_memory_byte_size\":%zu}"
             "}]}",
             n);
    cr_assert_eq(parse_json(json, &m, &r), 0, "%s", err);
    cr_assert_eq(gw_oip_input_set_bytes(&r, &m, 0, region, n, err, sizeof(err)), SQ_BAD_TENSOR);
    cr_assert(strstr(err, "inputs[0] (region \"jpegs\"): 9 bytes after the 1 elements") != NULL,
              "%s", err);
    gw_oip_request_dispose(&r);

    snprintf(json, sizeof(json),
             "{\"inputs\":[{\"name\":\"input\",\"shape\":[3],\"datatype\":\"BYTES\","
             "\"parameters\":{\"shared_memory_region\":\"jpegs\",\"shared_memory_byte_size\":%zu}"
             "}]}",
             n);
    cr_assert_eq(parse_json(json, &m, &r), 0, "%s", err);
    cr_assert_eq(gw_oip_input_set_bytes(&r, &m, 0, region, n, err, sizeof(err)), SQ_BAD_TENSOR);
    cr_assert(strstr(err, "element 2: missing its 4-byte length") != NULL, "%s", err);
    gw_oip_request_dispose(&r);

    /* An element over the image limit is too large. */
    uint8_t big[1200] = {0};
    uint32_t len = 1100;
    memcpy(big, &len, 4);
    cr_assert_eq(parse_json("{\"inputs\":[{\"name\":\"input\",\"shape\":[1],\"datatype\":\"BYTES\","
                            "\"parameters\":{\"shared_memory_region\":\"j\","
                            "\"shared_memory_byte_size\":1104}}]}",
                            &m, &r),
                 0, "%s", err);
    cr_assert_eq(gw_oip_input_set_bytes(&r, &m, 0, big, 1104, err, sizeof(err)), SQ_TOO_LARGE, "%s",
                 err);
    gw_oip_request_dispose(&r);
}

Test(oip_shm, set_bytes_refuses_what_is_not_a_shared_memory_input)
{
    gw_oip_model_t m = shm_model();
    gw_oip_request_t r;
    uint8_t region[384] = {0};
    cr_assert_eq(parse_json("{\"inputs\":[{\"name\":\"input\",\"shape\":[1],\"datatype\":\"BYTES\","
                            "\"data\":[\"QUJD\"]}]}",
                            &m, &r),
                 0, "%s", err);
    cr_assert_eq(gw_oip_input_set_bytes(&r, &m, 0, region, 3, err, sizeof(err)), SQ_INVAL);
    cr_assert_eq(gw_oip_input_set_bytes(&r, &m, 1, region, 3, err, sizeof(err)), SQ_INVAL);
    gw_oip_request_dispose(&r);
    cr_assert_eq(parse_json(INPUT_HEAD "\"parameters\":{\"shared_memory_region\":\"in\","
                                       "\"shared_memory_byte_size\":384}}]}",
                            &m, &r),
                 0, "%s", err);
    cr_assert_eq(gw_oip_input_set_bytes(&r, &m, 0, region, 383, err, sizeof(err)), SQ_INVAL,
                 "only its byte size is taken");
    gw_oip_request_dispose(&r);
}

#define BYTES_INPUT                                                                                \
    "{\"inputs\":[{\"name\":\"input\",\"shape\":[2],\"datatype\":\"BYTES\","                       \
    "\"data\":[\"QUJD\",\"QUJD\"]}],"

Test(oip_shm, an_output_names_a_window_that_holds_it)
{
    gw_oip_model_t m = shm_model();
    gw_oip_request_t r;
    int rc =
        parse_json(BYTES_INPUT "\"parameters\":{\"binary_data_output\":true},\"outputs\":["
                               "{\"name\":\"features\",\"parameters\":{\"shared_memory_region\":"
                               "\"out\",\"shared_memory_offset\":8,\"shared_memory_byte_size\":"
                               "100}},{\"name\":\"logits\"}]}",
                   &m, &r);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert_eq(r.noutputs, 2);
    cr_assert_eq(r.outputs[0].model_output, 1);
    cr_assert_str_eq(r.outputs[0].shm.region, "out");
    cr_assert_eq(r.outputs[0].shm.offset, 8);
    cr_assert_eq(r.outputs[0].shm.byte_size, 100);
    cr_assert_eq(r.outputs[0].binary, 0, "in shared memory, not in the body");
    cr_assert_eq(r.outputs[1].binary, 1, "binary_data_output still holds for the others");
    cr_assert_eq(r.outputs[1].shm.region[0], '\0');
    gw_oip_request_dispose(&r);

    /* [2,2,2] FP32 is 32 bytes: 31 cannot hold it (the batch is known only
     * after the inputs, which may come later in the body). */
    expect_error("{\"outputs\":[{\"name\":\"features\",\"parameters\":{\"shared_memory_region\":"
                 "\"out\",\"shared_memory_byte_size\":31}}],"
                 "\"inputs\":[{\"name\":\"input\",\"shape\":[2],\"datatype\":\"BYTES\","
                 "\"data\":[\"QUJD\",\"QUJD\"]}]}",
                 &m, SQ_BAD_TENSOR,
                 "outputs[0].parameters.shared_memory_byte_size: 31 bytes cannot hold FP32 "
                 "[2,2,2] (32 bytes)");
    cr_assert_eq(parse_json(BYTES_INPUT
                            "\"outputs\":[{\"name\":\"features\",\"parameters\":{"
                            "\"shared_memory_region\":\"out\",\"shared_memory_byte_size\":"
                            "32}}]}",
                            &m, &r),
                 0, "%s", err);
    gw_oip_request_dispose(&r);

    struct {
        const char *json;
        const char *what;
    } bad[] = {
        {BYTES_INPUT "\"outputs\":[{\"name\":\"logits\",\"parameters\":{\"classification\":2,"
                     "\"shared_memory_region\":\"out\",\"shared_memory_byte_size\":80}}]}",
         "outputs[0].parameters.shared_memory_region: an output cannot set both "
         "shared_memory_region and classification"},
        {BYTES_INPUT "\"outputs\":[{\"name\":\"logits\",\"parameters\":{\"binary_data\":true,"
                     "\"shared_memory_region\":\"out\",\"shared_memory_byte_size\":80}}]}",
         "an output cannot set both shared_memory_region and binary_data"},
        {BYTES_INPUT "\"outputs\":[{\"name\":\"logits\",\"parameters\":{"
                     "\"shared_memory_region\":\"out\"}}]}",
         "outputs[0].parameters.shared_memory_byte_size: missing"},
        {BYTES_INPUT "\"outputs\":[{\"name\":\"logits\"},{\"name\":\"features\",\"parameters\":{"
                     "\"shared_memory_byte_size\":80}}]}",
         "outputs[1].parameters.shared_memory_byte_size: given without "
         "parameters.shared_memory_region"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        expect_error(bad[i].json, &m, SQ_BAD_REQUEST, bad[i].what);
    /* binary_data false is what Triton's client sends with shared memory. */
    cr_assert_eq(parse_json(BYTES_INPUT "\"outputs\":[{\"name\":\"logits\",\"parameters\":{"
                                        "\"binary_data\":false,\"shared_memory_region\":\"out\","
                                        "\"shared_memory_byte_size\":80}}]}",
                            &m, &r),
                 0, "%s", err);
    gw_oip_request_dispose(&r);
}

/* As Triton's HTTP server answers an output it wrote to shared memory
 * (FinalizeResponse: neither data nor binary_data_size): name, datatype
 * and shape, no "parameters", which Triton's C++ client would read as
 * binary data and look for binary_data_size in. */
Test(oip_shm, the_response_gives_an_output_in_a_region_only_its_datatype_and_shape)
{
    gw_oip_model_t m = shm_model();
    gw_oip_request_t r;
    cr_assert_eq(parse_json(BYTES_INPUT
                            "\"outputs\":[{\"name\":\"features\",\"parameters\":{"
                            "\"shared_memory_region\":\"out\",\"shared_memory_offset\":16,"
                            "\"shared_memory_byte_size\":64}},{\"name\":\"logits\","
                            "\"parameters\":{\"binary_data\":true}}]}",
                            &m, &r),
                 0, "%s", err);
    float logits[20], features[8];
    for (int i = 0; i < 20; i++)
        logits[i] = (float)i;
    for (int i = 0; i < 8; i++)
        features[i] = -1;
    const float *outs[2] = {logits, features};
    gw_oip_response_t resp = {.model_name = "m", .model = &m, .request = &r, .outputs = outs};
    sq_buf_t b;
    sq_buf_init(&b);
    long long header_len;
    cr_assert_eq(gw_oip_response_encode(&resp, &b, &header_len), 0);
    cr_assert_gt(header_len, 0, "logits are binary");
    cr_assert_eq(b.len, (size_t)header_len + sizeof(logits), "only logits follow the header");
    json_error_t jerr;
    json_t *j = json_loadb((const char *)b.data, (size_t)header_len, 0, &jerr);
    cr_assert_not_null(j, "%s", jerr.text);
    json_t *o = json_array_get(json_object_get(j, "outputs"), 0);
    cr_assert_str_eq(json_string_value(json_object_get(o, "name")), "features");
    cr_assert_str_eq(json_string_value(json_object_get(o, "datatype")), "FP32");
    cr_assert_null(json_object_get(o, "data"));
    cr_assert_null(json_object_get(o, "parameters"));
    cr_assert_eq(json_object_size(o), 3, "name, datatype and shape alone");
    json_t *shape = json_object_get(o, "shape");
    cr_assert_eq(json_array_size(shape), 3);
    cr_assert_eq(json_integer_value(json_array_get(shape, 0)), 2);
    json_decref(j);
    sq_buf_dispose(&b);
    gw_oip_request_dispose(&r);
}

Test(oip_shm, errors_of_the_second_input_name_its_place_in_the_request)
{
    gw_oip_model_t m = shm_model();
    m.ninputs = 2;
    m.inputs[0].accept = 0;
    strcpy(m.inputs[1].name, "scale");
    m.inputs[1].datatype = GW_OIP_FP32;
    m.inputs[1].accept = 1u << GW_OIP_FP32;
    m.inputs[1].item_ndim = 1;
    m.inputs[1].item_shape[0] = 2;
    gw_oip_request_t r;
    /* "scale" comes first in the request, the image second. */
    cr_assert_eq(
        parse_json("{\"inputs\":[{\"name\":\"scale\",\"shape\":[1,2],\"datatype\":\"FP32\","
                   "\"data\":[1,2]},{\"name\":\"input\",\"shape\":[1],\"datatype\":\"BYTES\","
                   "\"parameters\":{\"shared_memory_region\":\"img\","
                   "\"shared_memory_byte_size\":3}}]}",
                   &m, &r),
        0, "%s", err);
    cr_assert_eq(r.inputs[0].position, 1);
    cr_assert_eq(r.inputs[1].position, 0);
    uint8_t three[3] = {1, 2, 3};
    cr_assert_eq(gw_oip_input_set_bytes(&r, &m, 0, three, 3, err, sizeof(err)), SQ_BAD_TENSOR);
    cr_assert(strstr(err, "inputs[1] (region \"img\"): element 0: missing its 4-byte length") !=
                  NULL,
              "%s", err);
    gw_oip_request_dispose(&r);
}
