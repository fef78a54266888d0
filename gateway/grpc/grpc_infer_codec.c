/* ModelInfer's messages, pure (grpc_int.h): a ModelInferRequest is turned
 * into the body POST /v2/models/{m}/infer takes with Triton's binary
 * extension (a JSON header, then each input's bytes), which the OIP codec
 * then checks and decodes as it does HTTP's: one copy of every rule on
 * names, datatypes, shapes, shared memory, classification, the SLO,
 * priority and Triton's timeout, and the same messages. Typed contents
 * become the binary form here (FP32 little-endian, UINT8 bytes, BYTES as
 * 4-byte length + bytes), their count checked against the shape first.
 * The answer HTTP would send (every output binary) is turned back into a
 * ModelInferResponse with raw_output_contents. */
#include "grpc_int.h"
#include "kserve_v2.pb-c.h"

#include <jansson.h>
#include <sq_alloc.h>
#include <sq_buf.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef Inference__ModelInferRequest infer_req_t;
typedef Inference__ModelInferRequest__InferInputTensor infer_in_t;

/* A parameter's value as an integer (int64, uint64, or a double with no
 * fraction); -1 when it is no integer >= 0. */
static int param_int(const Inference__InferParameter *p, int64_t *out)
{
    switch (p->parameter_choice_case) {
    case INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_INT64_PARAM:
        *out = p->int64_param;
        return p->int64_param >= 0 ? 0 : -1;
    case INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_UINT64_PARAM:
        if (p->uint64_param > INT64_MAX)
            return -1;
        *out = (int64_t)p->uint64_param;
        return 0;
    default:
        return -1;
    }
}

/* A parameter's value as a number (any numeric kind); -1 otherwise. */
static int param_number(const Inference__InferParameter *p, double *out)
{
    int64_t i;
    if (p->parameter_choice_case == INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_DOUBLE_PARAM) {
        *out = p->double_param;
        return 0;
    }
    if (param_int(p, &i) != 0)
        return -1;
    *out = (double)i;
    return 0;
}

/* Copies the shared_memory_* parameters into the tensor's JSON
 * parameters, checked for their kinds. */
static int shm_params(Inference__InferParameter *const *vals, char *const *keys, size_t n,
                      json_t *params, const char *path, char *why, size_t whylen)
{
    for (size_t k = 0; k < n; k++) {
        const char *key = keys[k];
        const Inference__InferParameter *v = vals[k];
        if (strcmp(key, "shared_memory_region") == 0) {
            json_t *s = v->parameter_choice_case ==
                                INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_STRING_PARAM
                            ? json_string(v->string_param)
                            : NULL;
            if (s == NULL) {
                snprintf(why, whylen, "%s.parameters.%s: expected a string_param (UTF-8)", path,
                         key);
                return SQ_BAD_REQUEST;
            }
            json_object_set_new(params, key, s);
        } else if (strcmp(key, "shared_memory_offset") == 0 ||
                   strcmp(key, "shared_memory_byte_size") == 0) {
            int64_t i;
            if (param_int(v, &i) != 0) {
                snprintf(why, whylen, "%s.parameters.%s: expected an int64_param >= 0", path, key);
                return SQ_BAD_REQUEST;
            }
            json_object_set_new(params, key, json_integer(i));
        }
    }
    return 0;
}

/* The elements a shape holds, or -1 (a dim < 0, or too many). */
static int64_t shape_elems(const int64_t *shape, size_t n)
{
    int64_t e = 1;
    for (size_t i = 0; i < n; i++) {
        if (shape[i] < 0 || (shape[i] > 0 && e > INT64_MAX / shape[i]))
            return -1;
        e *= shape[i];
    }
    return e;
}

/* Input i's typed contents in the binary extension's form, appended to
 * bin, its byte count in *bytes: FP32 from fp32_contents, UINT8 from
 * uint_contents (each 0..255), BYTES from bytes_contents. Another
 * datatype appends nothing (the OIP codec refuses it by name). */
static int typed_contents(const infer_in_t *in, size_t i, sq_buf_t *bin, size_t *bytes, char *why,
                          size_t whylen)
{
    const Inference__InferTensorContents *c = in->contents;
    int64_t elems = shape_elems(in->shape, in->n_shape);
    size_t start = bin->len;
    const char *dt = in->datatype != NULL ? in->datatype : "";
    size_t have = 0;
    const char *field = NULL;
    if (strcmp(dt, "FP32") == 0) {
        field = "fp32_contents";
        have = c->n_fp32_contents;
    } else if (strcmp(dt, "UINT8") == 0) {
        field = "uint_contents";
        have = c->n_uint_contents;
    } else if (strcmp(dt, "BYTES") == 0) {
        field = "bytes_contents";
        have = c->n_bytes_contents;
    } else {
        *bytes = 0;
        return 0;
    }
    size_t others = c->n_bool_contents + c->n_int_contents + c->n_int64_contents +
                    c->n_uint_contents + c->n_uint64_contents + c->n_fp32_contents +
                    c->n_fp64_contents + c->n_bytes_contents - have;
    if (others > 0) {
        snprintf(why, whylen, "inputs[%zu].contents: datatype %s is sent in %s, not another list",
                 i, dt, field);
        return SQ_BAD_TENSOR;
    }
    if (elems < 0 || (uint64_t)elems != have) {
        snprintf(why, whylen, "inputs[%zu].contents.%s: %zu values, but shape holds %lld", i, field,
                 have, (long long)elems);
        return SQ_BAD_TENSOR;
    }
    for (size_t k = 0; k < have; k++) {
        if (field[0] == 'f') {
            uint32_t u;
            memcpy(&u, &c->fp32_contents[k], 4);
            sq_buf_put_u32(bin, u);
        } else if (field[0] == 'u') {
            if (c->uint_contents[k] > 255) {
                snprintf(why, whylen, "inputs[%zu].contents.uint_contents[%zu]: %u is no UINT8", i,
                         k, (unsigned)c->uint_contents[k]);
                return SQ_BAD_TENSOR;
            }
            sq_buf_put_u8(bin, (uint8_t)c->uint_contents[k]);
        } else {
            const ProtobufCBinaryData *b = &c->bytes_contents[k];
            if (b->len > UINT32_MAX) {
                snprintf(why, whylen, "inputs[%zu].contents.bytes_contents[%zu]: too long", i, k);
                return SQ_TOO_LARGE;
            }
            sq_buf_put_bytes(bin, b->data, (uint32_t)b->len);
        }
    }
    *bytes = bin->len - start;
    return 0;
}

/* One input as its JSON (name, datatype, shape, parameters) and its bytes
 * appended to bin (raw: raw_input_contents' entry, or NULL). */
static int one_input(const infer_in_t *in, size_t i, const ProtobufCBinaryData *raw, json_t *inputs,
                     sq_buf_t *bin, char *why, size_t whylen)
{
    char path[32];
    snprintf(path, sizeof(path), "inputs[%zu]", i);
    json_t *j = json_object();
    json_array_append_new(inputs, j);
    json_t *name = json_string(in->name != NULL ? in->name : "");
    json_t *dt = json_string(in->datatype != NULL ? in->datatype : "");
    if (name == NULL || dt == NULL) {
        json_decref(name);
        json_decref(dt);
        snprintf(why, whylen, "%s: name and datatype must be UTF-8", path);
        return SQ_BAD_REQUEST;
    }
    json_object_set_new(j, "name", name);
    json_object_set_new(j, "datatype", dt);
    json_t *shape = json_array();
    for (size_t k = 0; k < in->n_shape; k++)
        json_array_append_new(shape, json_integer(in->shape[k]));
    json_object_set_new(j, "shape", shape);
    json_t *params = json_object();
    json_object_set_new(j, "parameters", params);
    int rc = 0;
    for (size_t k = 0; rc == 0 && k < in->n_parameters; k++)
        rc = shm_params(&in->parameters[k]->value, &in->parameters[k]->key, 1, params, path, why,
                        whylen);
    if (rc != 0)
        return rc;
    int in_shm = json_object_get(params, "shared_memory_region") != NULL;
    int typed = in->contents != NULL;
    if (in_shm) {
        if ((raw != NULL && raw->len > 0) || typed) {
            snprintf(why, whylen,
                     "%s: in shared memory (parameters.shared_memory_region), so without "
                     "contents or raw_input_contents",
                     path);
            return SQ_BAD_REQUEST;
        }
        return 0;
    }
    size_t bytes = 0;
    if (raw != NULL) {
        if (typed) {
            snprintf(why, whylen,
                     "%s.contents: not with raw_input_contents (send every input one way)", path);
            return SQ_BAD_REQUEST;
        }
        sq_buf_put(bin, raw->data, raw->len);
        bytes = raw->len;
    } else if (typed) {
        if ((rc = typed_contents(in, i, bin, &bytes, why, whylen)) != 0)
            return rc;
    } else {
        snprintf(why, whylen,
                 "%s: no data: send contents, raw_input_contents or "
                 "parameters.shared_memory_region",
                 path);
        return SQ_BAD_TENSOR;
    }
    json_object_set_new(params, "binary_data_size", json_integer((json_int_t)bytes));
    return 0;
}

/* The request's parameters squish reads, as HTTP's: slo_ms (ms),
 * priority, and Triton's timeout (microseconds). */
static int request_params(const infer_req_t *r, json_t *params, char *why, size_t whylen)
{
    for (size_t k = 0; k < r->n_parameters; k++) {
        const char *key = r->parameters[k]->key;
        const Inference__InferParameter *v = r->parameters[k]->value;
        if (v == NULL)
            continue;
        if (strcmp(key, "slo_ms") == 0) {
            double ms;
            if (param_number(v, &ms) != 0) {
                snprintf(why, whylen, "parameters.slo_ms: expected a double_param or int64_param");
                return SQ_BAD_REQUEST;
            }
            json_object_set_new(params, key, json_real(ms));
        } else if (strcmp(key, "priority") == 0 || strcmp(key, "timeout") == 0) {
            int64_t i;
            if (param_int(v, &i) != 0) {
                snprintf(why, whylen, "parameters.%s: expected an int64_param or uint64_param >= 0",
                         key);
                return SQ_BAD_REQUEST;
            }
            json_object_set_new(params, key, json_integer(i));
        }
    }
    return 0;
}

/* The requested outputs: each binary (raw_output_contents), with its
 * classification and shared memory as asked. */
static int requested_outputs(const infer_req_t *r, json_t *outputs, char *why, size_t whylen)
{
    for (size_t i = 0; i < r->n_outputs; i++) {
        const Inference__ModelInferRequest__InferRequestedOutputTensor *o = r->outputs[i];
        char path[32];
        snprintf(path, sizeof(path), "outputs[%zu]", i);
        json_t *j = json_object();
        json_array_append_new(outputs, j);
        json_t *name = json_string(o->name != NULL ? o->name : "");
        if (name == NULL) {
            snprintf(why, whylen, "%s.name: not UTF-8", path);
            return SQ_BAD_REQUEST;
        }
        json_object_set_new(j, "name", name);
        json_t *params = json_object();
        json_object_set_new(j, "parameters", params);
        for (size_t k = 0; k < o->n_parameters; k++) {
            const char *key = o->parameters[k]->key;
            const Inference__InferParameter *v = o->parameters[k]->value;
            if (v == NULL)
                continue;
            if (strcmp(key, "classification") == 0) {
                int64_t n;
                if (param_int(v, &n) != 0) {
                    snprintf(why, whylen,
                             "%s.parameters.classification: expected an int64_param >= 0", path);
                    return SQ_BAD_REQUEST;
                }
                json_object_set_new(params, key, json_integer(n));
            }
            int rc = shm_params(&o->parameters[k]->value, &o->parameters[k]->key, 1, params, path,
                                why, whylen);
            if (rc != 0)
                return rc;
        }
        if (json_object_get(params, "shared_memory_region") == NULL)
            json_object_set_new(params, "binary_data", json_true());
    }
    return 0;
}

static int infer_body(const infer_req_t *r, gw_grpc_infer_req_t *out, char *why, size_t whylen)
{
    if (r->n_raw_input_contents > 0 && r->n_raw_input_contents != r->n_inputs) {
        snprintf(why, whylen,
                 "raw_input_contents: %zu entries for %zu inputs (one per input, in their order)",
                 r->n_raw_input_contents, r->n_inputs);
        return SQ_BAD_REQUEST;
    }
    json_t *head = json_object();
    sq_buf_t bin;
    sq_buf_init(&bin);
    int rc = 0;
    if (r->id != NULL && r->id[0] != '\0') {
        json_t *id = json_string(r->id);
        if (id == NULL) {
            snprintf(why, whylen, "id: not UTF-8");
            rc = SQ_BAD_REQUEST;
            goto out;
        }
        json_object_set_new(head, "id", id);
    }
    json_t *params = json_object();
    json_object_set_new(head, "parameters", params);
    if ((rc = request_params(r, params, why, whylen)) != 0)
        goto out;
    json_t *inputs = json_array();
    json_object_set_new(head, "inputs", inputs);
    for (size_t i = 0; i < r->n_inputs && rc == 0; i++)
        rc = one_input(r->inputs[i], i,
                       r->n_raw_input_contents > 0 ? &r->raw_input_contents[i] : NULL, inputs, &bin,
                       why, whylen);
    if (rc != 0)
        goto out;
    if (r->n_outputs > 0) {
        json_t *outputs = json_array();
        json_object_set_new(head, "outputs", outputs);
        if ((rc = requested_outputs(r, outputs, why, whylen)) != 0)
            goto out;
    } else {
        json_object_set_new(params, "binary_data_output", json_true());
    }
    char *text = json_dumps(head, JSON_COMPACT);
    size_t hlen = strlen(text);
    out->body = sq_xmalloc(hlen + bin.len + 1);
    memcpy(out->body, text, hlen);
    if (bin.len > 0)
        memcpy(out->body + hlen, bin.data, bin.len);
    out->len = hlen + bin.len;
    out->header_len = (long long)hlen;
    free(text);
out:
    json_decref(head);
    sq_buf_dispose(&bin);
    return rc;
}

int gw_grpc_decode_infer(const uint8_t *data, size_t len, gw_grpc_infer_req_t *out, char *why,
                         size_t whylen)
{
    memset(out, 0, sizeof(*out));
    infer_req_t *r = (infer_req_t *)protobuf_c_message_unpack(
        &inference__model_infer_request__descriptor, NULL, len, data);
    if (r == NULL) {
        snprintf(why, whylen, "the request is no inference.ModelInferRequest");
        return SQ_BAD_REQUEST;
    }
    gw_grpc_req_t nv;
    int rc = gw_grpc_name_version(r->model_name, r->model_version, &nv, why, whylen);
    if (rc == 0) {
        memcpy(out->name, nv.name, sizeof(out->name));
        out->version = nv.version;
        rc = infer_body(r, out, why, whylen);
    }
    protobuf_c_message_free_unpacked(&r->base, NULL);
    if (rc != 0)
        gw_grpc_infer_req_dispose(out);
    return rc;
}

void gw_grpc_infer_req_dispose(gw_grpc_infer_req_t *r)
{
    free(r->body);
    r->body = NULL;
    r->len = 0;
}

/* A JSON value of the answer's parameters as an InferParameter: a string
 * as string_param, a number as double_param (whether its text had a
 * fraction or not: slo_ms is one kind in every answer). */
static void param_of(json_t *v, Inference__InferParameter *p)
{
    inference__infer_parameter__init(p);
    if (json_is_string(v)) {
        p->parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_STRING_PARAM;
        p->string_param = (char *)json_string_value(v);
    } else if (json_is_boolean(v)) {
        p->parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_BOOL_PARAM;
        p->bool_param = json_is_true(v);
    } else {
        p->parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_DOUBLE_PARAM;
        p->double_param = json_number_value(v);
    }
}

static char *text_of(json_t *j)
{
    const char *s = json_string_value(j);
    return (char *)(s != NULL ? s : "");
}

/* Output o's JSON data, when it has some (BYTES only: the one datatype
 * an answer gives as JSON to another transport), appended to buf in the
 * binary extension's form: at *off, *len bytes. */
static int json_contents(json_t *o, sq_buf_t *buf, size_t *off, size_t *len, char *why,
                         size_t whylen)
{
    json_t *data = json_object_get(o, "data");
    *off = buf->len;
    *len = 0;
    if (data == NULL)
        return 0;
    if (strcmp(text_of(json_object_get(o, "datatype")), "BYTES") != 0 || !json_is_array(data)) {
        snprintf(why, whylen, "output %s: JSON data other than BYTES",
                 text_of(json_object_get(o, "name")));
        return SQ_INTERNAL;
    }
    size_t k;
    json_t *e;
    json_array_foreach(data, k, e)
    {
        const char *v = json_string_value(e);
        sq_buf_put_bytes(buf, v != NULL ? v : "", (uint32_t)json_string_length(e));
    }
    *len = buf->len - *off;
    return 0;
}

int gw_grpc_encode_infer(const uint8_t *answer, size_t len, long long header_len, uint8_t **out,
                         size_t *outlen, char *why, size_t whylen)
{
    *out = NULL;
    *outlen = 0;
    size_t hlen = header_len >= 0 ? (size_t)header_len : len;
    if (hlen > len) {
        snprintf(why, whylen, "the answer's header is longer than the answer");
        return SQ_INTERNAL;
    }
    json_error_t jerr;
    json_t *j = json_loadb((const char *)answer, hlen, 0, &jerr);
    if (!json_is_object(j)) {
        json_decref(j);
        snprintf(why, whylen, "the answer is no JSON object");
        return SQ_INTERNAL;
    }
    Inference__ModelInferResponse r = INFERENCE__MODEL_INFER_RESPONSE__INIT;
    r.model_name = text_of(json_object_get(j, "model_name"));
    r.model_version = text_of(json_object_get(j, "model_version"));
    r.id = text_of(json_object_get(j, "id"));
    json_t *params = json_object_get(j, "parameters");
    size_t np = json_object_size(params);
    Inference__ModelInferResponse__ParametersEntry *pe = sq_xcalloc(np + 1, sizeof(*pe));
    Inference__ModelInferResponse__ParametersEntry **pp = sq_xcalloc(np + 1, sizeof(*pp));
    Inference__InferParameter *pv = sq_xcalloc(np + 1, sizeof(*pv));
    const char *key;
    json_t *v;
    json_object_foreach(params, key, v)
    {
        inference__model_infer_response__parameters_entry__init(&pe[r.n_parameters]);
        pe[r.n_parameters].key = (char *)key;
        param_of(v, &pv[r.n_parameters]);
        pe[r.n_parameters].value = &pv[r.n_parameters];
        pp[r.n_parameters] = &pe[r.n_parameters];
        r.n_parameters++;
    }
    r.parameters = pp;
    json_t *outs = json_object_get(j, "outputs");
    size_t no = json_array_size(outs);
    Inference__ModelInferResponse__InferOutputTensor *ot = sq_xcalloc(no + 1, sizeof(*ot));
    Inference__ModelInferResponse__InferOutputTensor **op = sq_xcalloc(no + 1, sizeof(*op));
    ProtobufCBinaryData *raw = sq_xcalloc(no + 1, sizeof(*raw));
    int64_t *shapes = sq_xcalloc(no * GW_GRPC_MAX_DIMS + 1, sizeof(*shapes));
    size_t at = hlen;
    int rc = 0;
    /* Outputs the answer gives as JSON (a pipeline's RESULT): their
     * elements in the binary extension's form (BYTES: each a 4-byte
     * little-endian length, then its bytes), as Triton's raw contents. */
    sq_buf_t from_json;
    sq_buf_init(&from_json);
    size_t *json_at = sq_xcalloc(no + 1, sizeof(*json_at));
    for (size_t i = 0; i < no; i++) {
        json_t *o = json_array_get(outs, i);
        Inference__ModelInferResponse__InferOutputTensor *t = &ot[i];
        inference__model_infer_response__infer_output_tensor__init(t);
        t->name = text_of(json_object_get(o, "name"));
        t->datatype = text_of(json_object_get(o, "datatype"));
        json_t *shape = json_object_get(o, "shape");
        t->shape = &shapes[i * GW_GRPC_MAX_DIMS];
        for (size_t k = 0; k < json_array_size(shape) && k < GW_GRPC_MAX_DIMS; k++)
            t->shape[t->n_shape++] = (int64_t)json_integer_value(json_array_get(shape, k));
        op[i] = t;
        /* One raw entry per output, in their order (an output written
         * into shared memory has an empty one), so that a client finds an
         * output's bytes at its index. */
        json_t *size = json_object_get(json_object_get(o, "parameters"), "binary_data_size");
        if (json_is_integer(size)) {
            json_int_t n = json_integer_value(size);
            if (n < 0 || (size_t)n > len - at) {
                snprintf(why, whylen, "outputs[%zu]: its binary data runs past the answer", i);
                rc = SQ_INTERNAL;
                break;
            }
            raw[i].data = (uint8_t *)answer + at;
            raw[i].len = (size_t)n;
            at += (size_t)n;
        } else if ((rc = json_contents(o, &from_json, &json_at[i], &raw[i].len, why, whylen)) !=
                   0) {
            break;
        }
    }
    for (size_t i = 0; i < no && rc == 0; i++)
        if (raw[i].data == NULL && raw[i].len > 0)
            raw[i].data = from_json.data + json_at[i];
    r.outputs = op;
    r.n_outputs = no;
    r.raw_output_contents = raw;
    r.n_raw_output_contents = no;
    if (rc == 0) {
        *outlen = protobuf_c_message_get_packed_size(&r.base);
        *out = sq_xmalloc(*outlen + 1);
        protobuf_c_message_pack(&r.base, *out);
    }
    free(pe);
    free(pp);
    free(pv);
    free(ot);
    free(op);
    free(raw);
    free(shapes);
    free(json_at);
    sq_buf_dispose(&from_json);
    json_decref(j);
    return rc;
}

/* A varint's bytes into p (at most 10); returns their count. */
static size_t put_varint(uint8_t *p, uint64_t v)
{
    size_t n = 0;
    do {
        p[n++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
        v >>= 7;
    } while (v > 0);
    return n;
}

uint8_t *gw_grpc_stream_response(const char *error, const uint8_t *response, size_t len,
                                 size_t *outlen)
{
    /* One field: error_message (1) or infer_response (2), length-delimited:
     * a packed message's bytes are the field's as they are. */
    const uint8_t *body = error != NULL ? (const uint8_t *)error : response;
    size_t n = error != NULL ? strlen(error) : len;
    uint8_t *out = sq_xmalloc(n + 11);
    out[0] = error != NULL ? (1 << 3) | 2 : (2 << 3) | 2;
    size_t at = 1 + put_varint(out + 1, n);
    if (n > 0)
        memcpy(out + at, body, n);
    *outlen = at + n;
    return out;
}
