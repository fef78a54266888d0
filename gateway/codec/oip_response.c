/* Encoding of OIP inference responses (see gw_codec.h). The text is written
 * straight into the caller's buffer: the data arrays are the bulk of it and
 * a JSON tree per float would cost more than the model took. */
#include "gw_codec.h"
#include "oip_int.h"

#include <sq.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OIP_TOPK_INSERTION_MAX 32 /* above this, top-k sorts the row */
#define OIP_FLOAT_TEXT_MAX 16     /* "-1.23456789e-38" plus a comma */

static void put_lit(sq_buf_t *b, const char *s)
{
    sq_buf_put(b, s, strlen(s));
}

static void put_json_string(sq_buf_t *b, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    sq_buf_reserve(b, n + 2);
    sq_buf_put_u8(b, '"');
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch >= 0x20 && ch != '"' && ch != '\\')
            continue;
        sq_buf_put(b, s + run, i - run);
        run = i + 1;
        char esc[6] = {'\\', 0, 0, 0, 0, 0};
        size_t elen = 2;
        switch (ch) {
        case '"':
            esc[1] = '"';
            break;
        case '\\':
            esc[1] = '\\';
            break;
        case '\n':
            esc[1] = 'n';
            break;
        case '\r':
            esc[1] = 'r';
            break;
        case '\t':
            esc[1] = 't';
            break;
        default:
            memcpy(esc + 1, "u00", 3);
            esc[4] = hex[ch >> 4];
            esc[5] = hex[ch & 15];
            elen = 6;
            break;
        }
        sq_buf_put(b, esc, elen);
    }
    sq_buf_put(b, s + run, n - run);
    sq_buf_put_u8(b, '"');
}

/* Decimal, without printf: shapes, sizes and whole parameters, several
 * in every reply. */
static void put_i64(sq_buf_t *b, long long v)
{
    char tmp[24];
    size_t at = sizeof(tmp);
    unsigned long long u = v < 0 ? 0ull - (unsigned long long)v : (unsigned long long)v;
    do
        tmp[--at] = (char)('0' + u % 10);
    while ((u /= 10) != 0);
    if (v < 0)
        tmp[--at] = '-';
    sq_buf_put(b, tmp + at, sizeof(tmp) - at);
}

/* A parameter's number: a whole one (batch_size) as an integer, as
 * before; the rest as the shortest text that reads back (0.025, not
 * 0.025000000000000001). */
static void put_f64(sq_buf_t *b, double v)
{
    if (isfinite(v) && v == floor(v) && fabs(v) < 9007199254740992.0) {
        put_i64(b, (long long)v);
        return;
    }
    char tmp[SQ_JSON_REAL_MAX];
    sq_buf_put(b, tmp, sq_json_real(v, tmp));
}

/* Whether (a, ia) ranks above (b, ib): higher score, ties to the lower
 * index, NaN below everything. */
static int ranks_above(float a, int ia, float b, int ib)
{
    if (isnan(a))
        return isnan(b) && ia < ib;
    if (isnan(b))
        return 1;
    return a > b || (a == b && ia < ib);
}

/* qsort has no context argument; the codec runs on several pool threads. */
static _Thread_local const float *sort_row;

static int cmp_rank(const void *pa, const void *pb)
{
    int a = *(const int *)pa, b = *(const int *)pb;
    if (a == b)
        return 0;
    return ranks_above(sort_row[a], a, sort_row[b], b) ? -1 : 1;
}

/* The k best indices of row (n scores) into top, best first. scratch holds
 * n ints when k > OIP_TOPK_INSERTION_MAX. */
static void top_k(const float *row, int n, int k, int *top, int *scratch)
{
    if (k > OIP_TOPK_INSERTION_MAX) {
        for (int i = 0; i < n; i++)
            scratch[i] = i;
        sort_row = row;
        qsort(scratch, (size_t)n, sizeof(int), cmp_rank);
        memcpy(top, scratch, (size_t)k * sizeof(int));
        return;
    }
    int filled = 0;
    for (int i = 0; i < n; i++) {
        if (filled == k && !ranks_above(row[i], i, row[top[k - 1]], top[k - 1]))
            continue;
        int at = filled < k ? filled++ : k - 1;
        while (at > 0 && ranks_above(row[i], i, row[top[at - 1]], top[at - 1])) {
            top[at] = top[at - 1];
            at--;
        }
        top[at] = i;
    }
}

/* "score:index" or "score:index:label" into s (needs 40 + label bytes). */
static size_t class_string(char *s, float score, int index, const gw_oip_response_t *r)
{
    size_t o = (size_t)gw_oip_format_float(score, s);
    o += (size_t)sprintf(s + o, ":%d", index);
    if (r->labels != NULL && index < r->nlabels && r->labels[index] != NULL) {
        size_t l = strlen(r->labels[index]);
        s[o++] = ':';
        memcpy(s + o, r->labels[index], l);
        o += l;
    }
    return o;
}

static size_t max_label_len(const gw_oip_response_t *r)
{
    size_t m = 0;
    for (int i = 0; r->labels != NULL && i < r->nlabels; i++)
        if (r->labels[i] != NULL && strlen(r->labels[i]) > m)
            m = strlen(r->labels[i]);
    return m;
}

static void put_shape(sq_buf_t *b, int batch, const int64_t *dims, int ndim)
{
    put_lit(b, "\"shape\":[");
    put_i64(b, batch);
    for (int i = 0; i < ndim; i++) {
        sq_buf_put_u8(b, ',');
        put_i64(b, (long long)dims[i]);
    }
    sq_buf_put_u8(b, ']');
}

static void put_binary_size(sq_buf_t *b, size_t n)
{
    put_lit(b, ",\"parameters\":{\"binary_data_size\":");
    put_i64(b, (long long)n);
    put_lit(b, "}");
}

/* An output written into a shared-memory region: its datatype and shape
 * alone, no "data" and no "parameters". That is Triton's answer
 * (http_server.cc, FinalizeResponse: an output of kind SHM gets neither
 * binary_data_size nor data), and its C++ client relies on it: an output
 * with "parameters" is read as binary data and must carry
 * binary_data_size. The client knows the region: it named it. */
static void encode_shm(const gw_oip_output_desc_t *desc, int batch, sq_buf_t *json)
{
    put_lit(json, ",\"datatype\":\"FP32\",");
    put_shape(json, batch, desc->item_shape, desc->item_ndim);
}

static void encode_classification(const gw_oip_response_t *r, int batch, const float *data,
                                  size_t item, int k, int binary, sq_buf_t *json, sq_buf_t *bin)
{
    int *top = sq_xmalloc((size_t)k * sizeof(int));
    int *scratch = k > OIP_TOPK_INSERTION_MAX ? sq_xmalloc(item * sizeof(int)) : NULL;
    char *s = sq_xmalloc(48 + max_label_len(r));
    size_t bin_start = bin->len;
    put_lit(json, ",\"datatype\":\"BYTES\",");
    int64_t kdim = k;
    put_shape(json, batch, &kdim, 1);
    if (!binary)
        put_lit(json, ",\"data\":[");
    for (int b = 0; b < batch; b++) {
        const float *row = data + (size_t)b * item;
        top_k(row, (int)item, k, top, scratch);
        for (int j = 0; j < k; j++) {
            size_t n = class_string(s, row[top[j]], top[j], r);
            if (binary) {
                sq_buf_put_u32(bin, (uint32_t)n);
                sq_buf_put(bin, s, n);
            } else {
                if (b > 0 || j > 0)
                    sq_buf_put_u8(json, ',');
                put_json_string(json, s, n);
            }
        }
    }
    if (binary)
        put_binary_size(json, bin->len - bin_start);
    else
        sq_buf_put_u8(json, ']');
    free(s);
    free(scratch);
    free(top);
}

static void encode_tensor(const gw_oip_output_desc_t *desc, int batch, const float *data,
                          size_t item, int binary, sq_buf_t *json, sq_buf_t *bin)
{
    size_t count = (size_t)batch * item;
    put_lit(json, ",\"datatype\":\"FP32\",");
    put_shape(json, batch, desc->item_shape, desc->item_ndim);
    if (binary) {
        sq_buf_put(bin, data, count * sizeof(float)); /* little-endian host */
        put_binary_size(json, count * sizeof(float));
        return;
    }
    put_lit(json, ",\"data\":[");
    sq_buf_reserve(json, count * OIP_FLOAT_TEXT_MAX + 2);
    char *o = (char *)json->data + json->len;
    for (size_t i = 0; i < count; i++) {
        if (i > 0)
            *o++ = ',';
        o += gw_oip_format_float(data[i], o);
    }
    json->len = (size_t)((uint8_t *)o - json->data);
    sq_buf_put_u8(json, ']');
}

int gw_oip_response_encode(const gw_oip_response_t *resp, sq_buf_t *out, long long *header_len)
{
    const gw_oip_request_t *req = resp->request;
    const gw_oip_model_t *m = resp->model;
    size_t start = out->len;
    *header_len = -1;
    for (int i = 0; i < req->noutputs; i++) {
        int mo = req->outputs[i].model_output;
        if (mo < 0 || mo >= m->noutputs || resp->outputs == NULL || resp->outputs[mo] == NULL)
            return SQ_INVAL;
    }
    sq_buf_t bin;
    sq_buf_init(&bin);
    put_lit(out, "{\"model_name\":");
    put_json_string(out, resp->model_name, strlen(resp->model_name));
    if (resp->model_version != NULL) {
        put_lit(out, ",\"model_version\":");
        put_json_string(out, resp->model_version, strlen(resp->model_version));
    }
    if (req->id != NULL) {
        put_lit(out, ",\"id\":");
        put_json_string(out, req->id, req->id_len);
    }
    if (resp->nparams > 0) {
        put_lit(out, ",\"parameters\":{");
        for (int i = 0; i < resp->nparams; i++) {
            if (i > 0)
                sq_buf_put_u8(out, ',');
            put_json_string(out, resp->params[i].name, strlen(resp->params[i].name));
            sq_buf_put_u8(out, ':');
            if (resp->params[i].text != NULL)
                put_json_string(out, resp->params[i].text, strlen(resp->params[i].text));
            else
                put_f64(out, resp->params[i].value);
        }
        sq_buf_put_u8(out, '}');
    }
    put_lit(out, ",\"outputs\":[");
    int any_binary = 0;
    for (int i = 0; i < req->noutputs; i++) {
        const gw_oip_output_req_t *o = &req->outputs[i];
        const gw_oip_output_desc_t *desc = &m->outputs[o->model_output];
        size_t item = 1;
        for (int k = 0; k < desc->item_ndim; k++)
            item *= (size_t)desc->item_shape[k];
        if (i > 0)
            sq_buf_put_u8(out, ',');
        put_lit(out, "{\"name\":");
        put_json_string(out, desc->name, strlen(desc->name));
        const float *data = resp->outputs[o->model_output];
        if (o->shm.region[0] != '\0') {
            encode_shm(desc, req->batch, out);
        } else if (o->classification > 0) {
            int k = o->classification < (long long)item ? o->classification : (int)item;
            /* the labels name output 0's classes; other outputs get indexes */
            gw_oip_response_t unlabelled = *resp;
            unlabelled.labels = NULL;
            unlabelled.nlabels = 0;
            encode_classification(o->model_output == 0 ? resp : &unlabelled, req->batch, data, item,
                                  k, o->binary, out, &bin);
        } else {
            encode_tensor(desc, req->batch, data, item, o->binary, out, &bin);
        }
        any_binary |= o->binary;
        sq_buf_put_u8(out, '}');
    }
    put_lit(out, "]}");
    if (any_binary) {
        *header_len = (long long)(out->len - start);
        sq_buf_put(out, bin.data, bin.len);
    }
    sq_buf_dispose(&bin);
    return 0;
}
