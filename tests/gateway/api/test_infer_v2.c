/* gateway/api/infer_v2.c: what /v2 tells the OIP codec of a model (its
 * input's item shape in its layout and the datatypes it takes, each
 * output's dims after the batch, the server's limits), and each output's
 * rows gathered from the items' rows for the answer. */
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

static gw_api_config_t limits(void)
{
    gw_api_config_t cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.max_images = 16;
    cfg.max_body_bytes = 1 << 20;
    return cfg;
}

Test(infer_v2, an_nchw_models_input_is_c_h_w_and_takes_fp32_uint8_and_jpegs)
{
    gw_model_t *m = model_of("\"input\": {\"name\": \"pixels\", \"datatype\": \"FP32\", "
                             "\"shape\": [-1, 3, 24, 32]}, \"outputs\": [{\"name\": \"y\", "
                             "\"shape\": [-1, 10]}]");
    gw_api_config_t cfg = limits();
    gw_oip_model_t d;
    memset(&d, 0, sizeof(d));
    gw_v2_model_desc(m, &cfg, &d);
    cr_assert_eq(d.ninputs, 1);
    cr_assert_str_eq(d.inputs[0].name, "pixels");
    cr_assert_eq(d.inputs[0].datatype, GW_OIP_FP32);
    cr_assert_eq(d.inputs[0].accept,
                 (1u << GW_OIP_FP32) | (1u << GW_OIP_UINT8) | (1u << GW_OIP_BYTES));
    cr_assert_eq(d.inputs[0].item_ndim, 3);
    cr_assert_eq(d.inputs[0].item_shape[0], 3);
    cr_assert_eq(d.inputs[0].item_shape[1], 24);
    cr_assert_eq(d.inputs[0].item_shape[2], 32);
    cr_assert_eq(d.max_batch, 16);
    cr_assert_eq(d.max_body_bytes, (size_t)1 << 20);
    cr_assert(d.shared_memory);
    gw_model_unref(m);
}

Test(infer_v2, an_nhwc_uint8_models_input_is_h_w_c)
{
    gw_model_t *m = model_of("\"input\": {\"name\": \"x\", \"datatype\": \"UINT8\", "
                             "\"shape\": [-1, 24, 32, 3]}, \"outputs\": [{\"name\": \"y\", "
                             "\"shape\": [-1, 10]}]");
    gw_api_config_t cfg = limits();
    gw_oip_model_t d;
    memset(&d, 0, sizeof(d));
    gw_v2_model_desc(m, &cfg, &d);
    cr_assert_eq(d.inputs[0].datatype, GW_OIP_UINT8);
    cr_assert_eq(d.inputs[0].item_shape[0], 24);
    cr_assert_eq(d.inputs[0].item_shape[1], 32);
    cr_assert_eq(d.inputs[0].item_shape[2], 3);
    gw_model_unref(m);
}

Test(infer_v2, each_output_has_its_dims_after_the_batch_and_a_scalar_one)
{
    gw_model_t *m = model_of("\"input\": {\"name\": \"x\", \"datatype\": \"FP32\", "
                             "\"shape\": [-1, 3, 8, 8]}, \"outputs\": [{\"name\": \"boxes\", "
                             "\"shape\": [-1, 5, 4]}, {\"name\": \"count\", \"shape\": [-1]}]");
    gw_api_config_t cfg = limits();
    gw_oip_model_t d;
    memset(&d, 0, sizeof(d));
    gw_v2_model_desc(m, &cfg, &d);
    cr_assert_eq(d.noutputs, 2);
    cr_assert_str_eq(d.outputs[0].name, "boxes");
    cr_assert_eq(d.outputs[0].item_ndim, 2);
    cr_assert_eq(d.outputs[0].item_shape[0], 5);
    cr_assert_eq(d.outputs[0].item_shape[1], 4);
    cr_assert_str_eq(d.outputs[1].name, "count");
    cr_assert_eq(d.outputs[1].item_ndim, 1, "[N]: one value per item");
    cr_assert_eq(d.outputs[1].item_shape[0], 1);
    gw_model_unref(m);
}

Test(infer_v2, a_single_output_is_the_items_rows_as_they_are)
{
    gw_model_t *m = model_of("\"input\": {\"name\": \"x\", \"datatype\": \"FP32\", "
                             "\"shape\": [-1, 3, 8, 8]}, \"outputs\": [{\"name\": \"y\", "
                             "\"shape\": [-1, 3]}]");
    const float rows[6] = {1, 2, 3, 4, 5, 6};
    const float *outputs[GW_OIP_MAX_OUTPUTS] = {0};
    cr_assert_null(gw_v2_gather_outputs(m, 2, rows, outputs), "no copy");
    cr_assert_eq(outputs[0], rows);
    gw_model_unref(m);
}

Test(infer_v2, several_outputs_are_gathered_each_as_batch_by_item)
{
    gw_model_t *m = model_of("\"input\": {\"name\": \"x\", \"datatype\": \"FP32\", "
                             "\"shape\": [-1, 3, 8, 8]}, \"outputs\": [{\"name\": \"a\", "
                             "\"shape\": [-1, 2]}, {\"name\": \"b\", \"shape\": [-1, 3]}]");
    /* Two items' rows: a0 a0 b0 b0 b0 | a1 a1 b1 b1 b1. */
    const float rows[10] = {1, 2, 10, 20, 30, 3, 4, 40, 50, 60};
    const float *outputs[GW_OIP_MAX_OUTPUTS] = {0};
    float *gathered = gw_v2_gather_outputs(m, 2, rows, outputs);
    cr_assert_not_null(gathered);
    const float a[4] = {1, 2, 3, 4}, b[6] = {10, 20, 30, 40, 50, 60};
    for (int i = 0; i < 4; i++)
        cr_assert_float_eq(outputs[0][i], a[i], 0, "a[%d]", i);
    for (int i = 0; i < 6; i++)
        cr_assert_float_eq(outputs[1][i], b[i], 0, "b[%d]", i);
    free(gathered);
    gw_model_unref(m);
}
