/* What the test_oip, test_oip_json and test_oip_response tests share:
 * model descriptions, request builders and float bit helpers. */
#ifndef OIP_TEST_H
#define OIP_TEST_H

#include <criterion/criterion.h>
#include <gw_codec.h>
#include <jansson.h>
#include <oip_int.h>
#include <sq.h>

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- fixtures ---- */

/* A small image model: input FP32 [N,3,4,4] (also UINT8 and JPEG BYTES),
 * outputs logits [N,10] and features [N,2,2]. */
static inline gw_oip_model_t small_model(void)
{
    gw_oip_model_t m = {0};
    m.ninputs = 1;
    strcpy(m.inputs[0].name, "input");
    m.inputs[0].datatype = GW_OIP_FP32;
    m.inputs[0].accept = (1u << GW_OIP_FP32) | (1u << GW_OIP_UINT8) | (1u << GW_OIP_BYTES);
    m.inputs[0].item_ndim = 3;
    m.inputs[0].item_shape[0] = 3;
    m.inputs[0].item_shape[1] = 4;
    m.inputs[0].item_shape[2] = 4;
    m.noutputs = 2;
    strcpy(m.outputs[0].name, "logits");
    m.outputs[0].item_ndim = 1;
    m.outputs[0].item_shape[0] = 10;
    strcpy(m.outputs[1].name, "features");
    m.outputs[1].item_ndim = 2;
    m.outputs[1].item_shape[0] = 2;
    m.outputs[1].item_shape[1] = 2;
    m.max_batch = 8;
    return m;
}

/* ImageNet-sized: input FP32 [N,3,224,224], default accept (FP32 + BYTES). */
static inline gw_oip_model_t imagenet_model(void)
{
    gw_oip_model_t m = {0};
    m.ninputs = 1;
    strcpy(m.inputs[0].name, "input");
    m.inputs[0].datatype = GW_OIP_FP32;
    m.inputs[0].item_ndim = 3;
    m.inputs[0].item_shape[0] = 3;
    m.inputs[0].item_shape[1] = 224;
    m.inputs[0].item_shape[2] = 224;
    m.noutputs = 1;
    strcpy(m.outputs[0].name, "logits");
    m.outputs[0].item_ndim = 1;
    m.outputs[0].item_shape[0] = 1000;
    m.max_batch = 64;
    return m;
}

/* Two inputs: image FP32 [N,3,4,4] and scale FP32 [N,2]. */
static inline gw_oip_model_t two_input_model(void)
{
    gw_oip_model_t m = small_model();
    m.ninputs = 2;
    m.inputs[0].accept = 0;
    strcpy(m.inputs[0].name, "image");
    strcpy(m.inputs[1].name, "scale");
    m.inputs[1].datatype = GW_OIP_FP32;
    m.inputs[1].accept = 1u << GW_OIP_FP32;
    m.inputs[1].item_ndim = 1;
    m.inputs[1].item_shape[0] = 2;
    return m;
}

#define ITEM 48 /* 3*4*4 */

static char err[512];

static inline int parse_json(const char *json, const gw_oip_model_t *m, gw_oip_request_t *r)
{
    err[0] = '\0';
    return gw_oip_request_parse((const uint8_t *)json, strlen(json), -1, m, r, err, sizeof(err));
}

/* Expects parse to fail with code and a message containing what. */
static inline void expect_error(const char *json, const gw_oip_model_t *m, int code,
                                const char *what)
{
    gw_oip_request_t r;
    int rc = parse_json(json, m, &r);
    cr_assert_eq(rc, code, "expected %s, got %s (%s) for %s", sq_err_name(code), sq_err_name(rc),
                 err, json);
    cr_assert(strstr(err, what) != NULL, "message \"%s\" lacks \"%s\"", err, what);
    cr_assert_eq(r.batch, 0, "a failed request is left empty");
    gw_oip_request_dispose(&r);
}

static inline void sb_printf(sq_buf_t *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static inline void sb_printf(sq_buf_t *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    sq_buf_reserve(b, (size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf((char *)b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

static inline void sb_float(sq_buf_t *b, float f)
{
    char tmp[32];
    gw_oip_format_float(f, tmp);
    sb_printf(b, "%s", tmp);
}

static inline const char *sb_str(sq_buf_t *b)
{
    sq_buf_reserve(b, 1);
    b->data[b->len] = '\0';
    return (const char *)b->data;
}

static inline float row_f32(const gw_oip_row_t *row, size_t i)
{
    float f;
    memcpy(&f, row->data + 4 * i, 4);
    return f;
}

/* The data of a [dims] tensor nested `levels` deep (1 = flat; the
 * innermost arrays hold the trailing dims flattened), value(i) =
 * i * 0.25 - 3 in row-major order. */
static inline void emit_nested(sq_buf_t *b, const int *dims, int ndim, int level, int levels,
                               int *next)
{
    sb_printf(b, "[");
    if (level == levels - 1) {
        int n = 1;
        for (int i = level; i < ndim; i++)
            n *= dims[i];
        for (int i = 0; i < n; i++) {
            if (i > 0)
                sb_printf(b, ",");
            sb_float(b, (float)(*next)++ * 0.25f - 3);
        }
    } else {
        for (int i = 0; i < dims[level]; i++) {
            if (i > 0)
                sb_printf(b, ",");
            emit_nested(b, dims, ndim, level + 1, levels, next);
        }
    }
    sb_printf(b, "]");
}

static inline void fp32_request(sq_buf_t *b, int batch, int levels)
{
    sb_printf(b,
              "{\"inputs\":[{\"name\":\"input\",\"shape\":[%d,3,4,4],\"datatype\":\"FP32\","
              "\"data\":",
              batch);
    const int dims[4] = {batch, 3, 4, 4};
    int next = 0;
    emit_nested(b, dims, 4, 0, levels, &next);
    sb_printf(b, "}]}");
}

/* ---- accepted forms ---- */

static inline void check_fp32_rows(const gw_oip_request_t *r, int batch)
{
    cr_assert_eq(r->batch, batch);
    cr_assert_eq(r->inputs[0].datatype, GW_OIP_FP32);
    cr_assert_eq(r->inputs[0].binary, 0);
    for (int b = 0; b < batch; b++) {
        cr_assert_eq(r->inputs[0].rows[b].len, ITEM * 4);
        for (int i = 0; i < ITEM; i++)
            cr_assert_eq(row_f32(&r->inputs[0].rows[b], (size_t)i),
                         (float)(b * ITEM + i) * 0.25f - 3, "row %d element %d", b, i);
    }
}

static inline float bits_to_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint32_t float_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

#endif
