/* gateway/grpc/grpc_codec.c: a call's method from its path, each request
 * message of the methods served decoded field by field (made here with
 * protobuf-c's packers of the project's own kserve_v2.proto, as a client's
 * bytes would come), the refusals that say what to send instead, and the
 * gRPC status each squish error maps to as Triton maps its own.
 * tests/fuzz/fuzz_grpc.c throws arbitrary bytes at the same decoder. */
#include <criterion/criterion.h>

#include "grpc_int.h"
#include "gw_codec.h"
#include "kserve_v2.pb-c.h"

#include <jansson.h>

#include <stdlib.h>
#include <string.h>

#define PATH(m) "/inference.GRPCInferenceService/" m

Test(grpc_codec, a_path_names_its_method_of_this_service_only)
{
    static const char *ok[] = {PATH("ServerLive"), PATH("ModelInfer"), PATH("ModelStatistics"),
                               PATH("SystemSharedMemoryRegister")};
    static const int want[] = {GW_GRPC_SERVER_LIVE, GW_GRPC_MODEL_INFER, GW_GRPC_MODEL_STATISTICS,
                               GW_GRPC_SHM_REGISTER};
    for (int i = 0; i < 4; i++)
        cr_assert_eq(gw_grpc_method_of(ok[i], strlen(ok[i])), want[i], "%s", ok[i]);
    static const char *bad[] = {"/inference.GRPCInferenceService/Nope", "/other.Service/ServerLive",
                                PATH("ServerLiveX"), "ServerLive", ""};
    for (int i = 0; i < 5; i++)
        cr_assert_eq(gw_grpc_method_of(bad[i], strlen(bad[i])), -1, "%s", bad[i]);
    /* the length counts, not a NUL */
    const char *p = PATH("ServerReady") "junk";
    cr_assert_eq(gw_grpc_method_of(p, strlen(p) - 4), GW_GRPC_SERVER_READY);
    cr_assert_str_eq(gw_grpc_method_name(GW_GRPC_MODEL_CONFIG), "ModelConfig");
    cr_assert(gw_grpc_method_admin(GW_GRPC_SHM_REGISTER), "shared memory needs the token");
    cr_assert_not(gw_grpc_method_admin(GW_GRPC_MODEL_READY));
    /* As their routes: GET /v2/trace/setting and /v2/logging need it too. */
    cr_assert(gw_grpc_method_admin(GW_GRPC_TRACE_SETTING));
    cr_assert(gw_grpc_method_admin(GW_GRPC_LOG_SETTINGS));
    cr_assert(gw_grpc_method_admin(GW_GRPC_CUDA_SHM_STATUS));
}

static size_t pack_ready(const char *name, const char *version, uint8_t *buf)
{
    Inference__ModelReadyRequest r = INFERENCE__MODEL_READY_REQUEST__INIT;
    r.name = (char *)name;
    r.version = (char *)version;
    return inference__model_ready_request__pack(&r, buf);
}

Test(grpc_codec, a_models_name_and_version_are_read_and_checked)
{
    uint8_t buf[512];
    gw_grpc_req_t q;
    char why[256];
    size_t n = pack_ready("resnet18", "3", buf);
    cr_assert_eq(gw_grpc_decode(GW_GRPC_MODEL_READY, buf, n, &q, why, sizeof(why)), 0, "%s", why);
    cr_assert_str_eq(q.name, "resnet18");
    cr_assert_eq(q.version, 3);
    n = pack_ready("resnet18", "", buf);
    cr_assert_eq(gw_grpc_decode(GW_GRPC_MODEL_METADATA, buf, n, &q, why, sizeof(why)), 0);
    cr_assert_eq(q.version, 0, "no version: the default one");
    n = pack_ready("resnet18", "three", buf);
    cr_assert_eq(gw_grpc_decode(GW_GRPC_MODEL_CONFIG, buf, n, &q, why, sizeof(why)),
                 SQ_BAD_REQUEST);
    cr_assert_not_null(strstr(why, "version"), "%s", why);
    n = pack_ready("", "", buf);
    cr_assert_eq(gw_grpc_decode(GW_GRPC_MODEL_READY, buf, n, &q, why, sizeof(why)), SQ_BAD_REQUEST,
                 "a model needs its name");
    char longname[300];
    memset(longname, 'a', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    n = pack_ready(longname, "", buf);
    cr_assert_eq(gw_grpc_decode(GW_GRPC_MODEL_READY, buf, n, &q, why, sizeof(why)), SQ_BAD_REQUEST,
                 "a name past 128 bytes");
    /* bytes that are no such message */
    const uint8_t junk[] = {0xff, 0xff, 0xff, 0xff, 0x0f};
    cr_assert_eq(gw_grpc_decode(GW_GRPC_MODEL_READY, junk, sizeof(junk), &q, why, sizeof(why)),
                 SQ_BAD_REQUEST);
    cr_assert_not_null(strstr(why, "ModelReadyRequest"), "%s", why);
}

Test(grpc_codec, statistics_take_every_model_or_one_and_a_version_only_with_a_name)
{
    uint8_t buf[512];
    gw_grpc_req_t q;
    char why[256];
    Inference__ModelStatisticsRequest r = INFERENCE__MODEL_STATISTICS_REQUEST__INIT;
    r.name = (char *)"";
    r.version = (char *)"";
    size_t n = inference__model_statistics_request__pack(&r, buf);
    cr_assert_eq(gw_grpc_decode(GW_GRPC_MODEL_STATISTICS, buf, n, &q, why, sizeof(why)), 0, "%s",
                 why);
    cr_assert_str_eq(q.name, "", "every model");
    r.version = (char *)"2";
    n = inference__model_statistics_request__pack(&r, buf);
    cr_assert_eq(gw_grpc_decode(GW_GRPC_MODEL_STATISTICS, buf, n, &q, why, sizeof(why)),
                 SQ_BAD_REQUEST);
    cr_assert_not_null(strstr(why, "only with a model's name"), "%s", why);
}

Test(grpc_codec, shared_memory_registration_reads_every_field)
{
    uint8_t buf[1024];
    gw_grpc_req_t q;
    char why[256];
    Inference__SystemSharedMemoryRegisterRequest r =
        INFERENCE__SYSTEM_SHARED_MEMORY_REGISTER_REQUEST__INIT;
    r.name = (char *)"input0";
    r.key = (char *)"/squish_in0";
    r.offset = 64;
    r.byte_size = (uint64_t)5 << 32;
    size_t n = inference__system_shared_memory_register_request__pack(&r, buf);
    cr_assert_eq(gw_grpc_decode(GW_GRPC_SHM_REGISTER, buf, n, &q, why, sizeof(why)), 0, "%s", why);
    cr_assert_str_eq(q.name, "input0");
    cr_assert_str_eq(q.key, "/squish_in0");
    cr_assert_eq(q.offset, 64);
    cr_assert_eq(q.byte_size, (uint64_t)5 << 32);
    char key[300];
    memset(key, 'k', sizeof(key) - 1);
    key[sizeof(key) - 1] = '\0';
    r.key = key;
    n = inference__system_shared_memory_register_request__pack(&r, buf);
    cr_assert_eq(gw_grpc_decode(GW_GRPC_SHM_REGISTER, buf, n, &q, why, sizeof(why)),
                 SQ_BAD_REQUEST);
    cr_assert_not_null(strstr(why, "key"), "%s", why);
}

Test(grpc_codec, the_repository_index_is_squishs_one_repository)
{
    uint8_t buf[256];
    gw_grpc_req_t q;
    char why[256];
    Inference__RepositoryIndexRequest r = INFERENCE__REPOSITORY_INDEX_REQUEST__INIT;
    r.repository_name = (char *)"";
    r.ready = 1;
    size_t n = inference__repository_index_request__pack(&r, buf);
    cr_assert_eq(gw_grpc_decode(GW_GRPC_REPOSITORY_INDEX, buf, n, &q, why, sizeof(why)), 0, "%s",
                 why);
    cr_assert_eq(q.ready, 1);
    r.repository_name = (char *)"other";
    n = inference__repository_index_request__pack(&r, buf);
    cr_assert_eq(gw_grpc_decode(GW_GRPC_REPOSITORY_INDEX, buf, n, &q, why, sizeof(why)),
                 SQ_BAD_REQUEST);
    cr_assert_not_null(strstr(why, "leave it empty"), "%s", why);
}

Test(grpc_codec, a_method_of_another_decoder_is_refused_by_name)
{
    gw_grpc_req_t q;
    char why[256];
    cr_assert_eq(gw_grpc_decode(GW_GRPC_MODEL_STREAM_INFER, NULL, 0, &q, why, sizeof(why)),
                 SQ_BAD_REQUEST);
    cr_assert_not_null(strstr(why, "ModelStreamInfer"), "%s", why);
}

Test(grpc_codec, model_control_reads_the_model_and_unload_dependents)
{
    uint8_t buf[512];
    gw_grpc_req_t q;
    char why[256];
    Inference__ModelRepositoryParameter yes = INFERENCE__MODEL_REPOSITORY_PARAMETER__INIT;
    yes.parameter_choice_case = INFERENCE__MODEL_REPOSITORY_PARAMETER__PARAMETER_CHOICE_BOOL_PARAM;
    yes.bool_param = 1;
    Inference__RepositoryModelUnloadRequest__ParametersEntry e =
        INFERENCE__REPOSITORY_MODEL_UNLOAD_REQUEST__PARAMETERS_ENTRY__INIT;
    Inference__RepositoryModelUnloadRequest__ParametersEntry *es[] = {&e};
    e.key = "unload_dependents";
    e.value = &yes;
    Inference__RepositoryModelUnloadRequest u = INFERENCE__REPOSITORY_MODEL_UNLOAD_REQUEST__INIT;
    u.model_name = "pipe";
    u.parameters = es;
    u.n_parameters = 1;
    size_t n = inference__repository_model_unload_request__pack(&u, buf);
    cr_assert_eq(gw_grpc_decode(GW_GRPC_REPOSITORY_MODEL_UNLOAD, buf, n, &q, why, sizeof(why)), 0,
                 "%s", why);
    cr_assert_str_eq(q.name, "pipe");
    cr_assert_eq(q.dependents, 1);
    e.key = "cascade";
    n = inference__repository_model_unload_request__pack(&u, buf);
    cr_assert_eq(gw_grpc_decode(GW_GRPC_REPOSITORY_MODEL_UNLOAD, buf, n, &q, why, sizeof(why)),
                 SQ_BAD_REQUEST);
    cr_assert_not_null(strstr(why, "cascade"), "%s", why);

    Inference__RepositoryModelLoadRequest l = INFERENCE__REPOSITORY_MODEL_LOAD_REQUEST__INIT;
    l.model_name = "resnet";
    n = inference__repository_model_load_request__pack(&l, buf);
    cr_assert_eq(gw_grpc_decode(GW_GRPC_REPOSITORY_MODEL_LOAD, buf, n, &q, why, sizeof(why)), 0);
    cr_assert_str_eq(q.name, "resnet");
    cr_assert_eq(q.dependents, 0);
    /* a load with its own configuration: the models are the DB's */
    Inference__RepositoryModelLoadRequest__ParametersEntry le =
        INFERENCE__REPOSITORY_MODEL_LOAD_REQUEST__PARAMETERS_ENTRY__INIT;
    Inference__RepositoryModelLoadRequest__ParametersEntry *les[] = {&le};
    le.key = "config";
    le.value = &yes;
    l.parameters = les;
    l.n_parameters = 1;
    n = inference__repository_model_load_request__pack(&l, buf);
    cr_assert_eq(gw_grpc_decode(GW_GRPC_REPOSITORY_MODEL_LOAD, buf, n, &q, why, sizeof(why)),
                 SQ_BAD_REQUEST);
    cr_assert_not_null(strstr(why, "POST /models"), "%s", why);
    l.n_parameters = 0;
    l.repository_name = "other";
    n = inference__repository_model_load_request__pack(&l, buf);
    cr_assert_eq(gw_grpc_decode(GW_GRPC_REPOSITORY_MODEL_LOAD, buf, n, &q, why, sizeof(why)),
                 SQ_BAD_REQUEST);
    cr_assert_not_null(strstr(why, "repository_name"), "%s", why);
    l.repository_name = "";
    l.model_name = "";
    n = inference__repository_model_load_request__pack(&l, buf);
    cr_assert_eq(gw_grpc_decode(GW_GRPC_REPOSITORY_MODEL_LOAD, buf, n, &q, why, sizeof(why)),
                 SQ_BAD_REQUEST);
}

Test(grpc_codec, errors_map_to_the_status_codes_triton_answers)
{
    cr_assert_eq(gw_grpc_status_of(SQ_OK), 0);
    cr_assert_eq(gw_grpc_status_of(SQ_MODEL_NOT_FOUND), 5); /* NOT_FOUND */
    cr_assert_eq(gw_grpc_status_of(SQ_BAD_REQUEST), 3);     /* INVALID_ARGUMENT */
    cr_assert_eq(gw_grpc_status_of(SQ_UNAUTHORIZED), 16);   /* UNAUTHENTICATED */
    cr_assert_eq(gw_grpc_status_of(SQ_EXISTS), 6);          /* ALREADY_EXISTS */
    cr_assert_eq(gw_grpc_status_of(SQ_TOO_LARGE), 8);       /* RESOURCE_EXHAUSTED */
    cr_assert_eq(gw_grpc_status_of(SQ_MODEL_UNLOADED), 9);  /* FAILED_PRECONDITION */
    cr_assert_eq(gw_grpc_status_of(SQ_METHOD), 12);         /* UNIMPLEMENTED */
}

/* ---- ModelInfer: the request as /v2's body, the answer back ---- */

typedef Inference__ModelInferRequest infer_req_t;
typedef Inference__ModelInferRequest__InferInputTensor infer_in_t;
typedef Inference__ModelInferRequest__InferRequestedOutputTensor infer_out_t;
typedef Inference__ModelInferRequest__ParametersEntry req_param_t;
typedef Inference__ModelInferRequest__InferInputTensor__ParametersEntry in_param_t;
typedef Inference__ModelInferRequest__InferRequestedOutputTensor__ParametersEntry out_param_t;

/* A parameter of each kind the tests send. */
static Inference__InferParameter int_param(int64_t v)
{
    Inference__InferParameter p = INFERENCE__INFER_PARAMETER__INIT;
    p.parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_INT64_PARAM;
    p.int64_param = v;
    return p;
}

static Inference__InferParameter double_param(double v)
{
    Inference__InferParameter p = INFERENCE__INFER_PARAMETER__INIT;
    p.parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_DOUBLE_PARAM;
    p.double_param = v;
    return p;
}

static Inference__InferParameter string_param(const char *v)
{
    Inference__InferParameter p = INFERENCE__INFER_PARAMETER__INIT;
    p.parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_STRING_PARAM;
    p.string_param = (char *)v;
    return p;
}

/* The model the bodies are parsed against: input "input" [N,3,2,2] FP32
 * (UINT8 and BYTES taken too), outputs "scores" [N,5] and "feat" [N,4]. */
static gw_oip_model_t model_desc(void)
{
    gw_oip_model_t d;
    memset(&d, 0, sizeof(d));
    d.ninputs = 1;
    snprintf(d.inputs[0].name, sizeof(d.inputs[0].name), "input");
    d.inputs[0].datatype = GW_OIP_FP32;
    d.inputs[0].accept = (1u << GW_OIP_FP32) | (1u << GW_OIP_UINT8) | (1u << GW_OIP_BYTES);
    d.inputs[0].item_ndim = 3;
    d.inputs[0].item_shape[0] = 3;
    d.inputs[0].item_shape[1] = 2;
    d.inputs[0].item_shape[2] = 2;
    d.noutputs = 2;
    snprintf(d.outputs[0].name, sizeof(d.outputs[0].name), "scores");
    d.outputs[0].item_ndim = 1;
    d.outputs[0].item_shape[0] = 5;
    snprintf(d.outputs[1].name, sizeof(d.outputs[1].name), "feat");
    d.outputs[1].item_ndim = 1;
    d.outputs[1].item_shape[0] = 4;
    d.max_batch = 8;
    d.shared_memory = 1;
    return d;
}

/* Packs r, decodes it (0 expected) and parses its body against the
 * model (rc expected from the OIP codec, its message in why). */
static int decode_and_parse(const infer_req_t *r, gw_grpc_infer_req_t *q, gw_oip_request_t *p,
                            char *why, size_t whylen)
{
    uint8_t *buf = malloc(inference__model_infer_request__get_packed_size(r) + 1);
    size_t n = inference__model_infer_request__pack(r, buf);
    int rc = gw_grpc_decode_infer(buf, n, q, why, whylen);
    free(buf);
    cr_assert_eq(rc, 0, "%s", why);
    gw_oip_model_t d = model_desc();
    return gw_oip_request_parse(q->body, q->len, q->header_len, &d, p, why, whylen);
}

/* Packs r and decodes it, expecting rc with word in why. */
static void refused(const infer_req_t *r, int rc, const char *word)
{
    uint8_t *buf = malloc(inference__model_infer_request__get_packed_size(r) + 1);
    size_t n = inference__model_infer_request__pack(r, buf);
    gw_grpc_infer_req_t q;
    char why[512] = "";
    cr_assert_eq(gw_grpc_decode_infer(buf, n, &q, why, sizeof(why)), rc, "%s", why);
    cr_assert_not_null(strstr(why, word), "'%s' not in: %s", word, why);
    cr_assert_null(q.body, "a refusal leaves nothing to free");
    free(buf);
}

Test(grpc_codec, a_model_infer_request_is_v2s_body_field_by_field)
{
    float x[24];
    for (int i = 0; i < 24; i++)
        x[i] = (float)i * 0.5f - 3.0f;
    int64_t shape[] = {2, 3, 2, 2};
    infer_in_t in = INFERENCE__MODEL_INFER_REQUEST__INFER_INPUT_TENSOR__INIT;
    infer_in_t *ins[] = {&in};
    in.name = "input";
    in.datatype = "FP32";
    in.shape = shape;
    in.n_shape = 4;
    ProtobufCBinaryData raw = {sizeof(x), (uint8_t *)x};
    Inference__InferParameter slo = double_param(80), prio = int_param(2);
    req_param_t rp[] = {INFERENCE__MODEL_INFER_REQUEST__PARAMETERS_ENTRY__INIT,
                        INFERENCE__MODEL_INFER_REQUEST__PARAMETERS_ENTRY__INIT};
    rp[0].key = "slo_ms";
    rp[0].value = &slo;
    rp[1].key = "priority";
    rp[1].value = &prio;
    req_param_t *rps[] = {&rp[0], &rp[1]};
    infer_out_t o0 = INFERENCE__MODEL_INFER_REQUEST__INFER_REQUESTED_OUTPUT_TENSOR__INIT,
                o1 = INFERENCE__MODEL_INFER_REQUEST__INFER_REQUESTED_OUTPUT_TENSOR__INIT;
    infer_out_t *outs[] = {&o0, &o1};
    o0.name = "scores";
    Inference__InferParameter k = int_param(3), region = string_param("out"), off = int_param(8),
                              size = int_param(64);
    out_param_t cls =
        INFERENCE__MODEL_INFER_REQUEST__INFER_REQUESTED_OUTPUT_TENSOR__PARAMETERS_ENTRY__INIT;
    cls.key = "classification";
    cls.value = &k;
    out_param_t *cls_p[] = {&cls};
    o0.parameters = cls_p;
    o0.n_parameters = 1;
    o1.name = "feat";
    out_param_t shm[3];
    out_param_t *shm_p[3];
    const char *keys[] = {"shared_memory_region", "shared_memory_offset",
                          "shared_memory_byte_size"};
    Inference__InferParameter *vals[] = {&region, &off, &size};
    for (int i = 0; i < 3; i++) {
        inference__model_infer_request__infer_requested_output_tensor__parameters_entry__init(
            &shm[i]);
        shm[i].key = (char *)keys[i];
        shm[i].value = vals[i];
        shm_p[i] = &shm[i];
    }
    o1.parameters = shm_p;
    o1.n_parameters = 3;
    infer_req_t r = INFERENCE__MODEL_INFER_REQUEST__INIT;
    r.model_name = "resnet";
    r.model_version = "2";
    r.id = "req-1";
    r.parameters = rps;
    r.n_parameters = 2;
    r.inputs = ins;
    r.n_inputs = 1;
    r.outputs = outs;
    r.n_outputs = 2;
    r.raw_input_contents = &raw;
    r.n_raw_input_contents = 1;

    gw_grpc_infer_req_t q;
    gw_oip_request_t p;
    char why[512];
    cr_assert_eq(decode_and_parse(&r, &q, &p, why, sizeof(why)), 0, "%s", why);
    cr_assert_str_eq(q.name, "resnet");
    cr_assert_eq(q.version, 2);
    cr_assert_eq(q.len, (size_t)q.header_len + sizeof(x), "the JSON header, then the tensor");
    cr_assert_eq(p.batch, 2);
    cr_assert_eq(p.id_len, 5);
    cr_assert_str_eq(p.id, "req-1");
    cr_assert_float_eq(p.slo_ms, 80.0, 1e-9);
    cr_assert_eq(p.slo_is_timeout, 0);
    cr_assert_eq(p.priority, 2);
    cr_assert_eq(p.inputs[0].datatype, GW_OIP_FP32);
    cr_assert_eq(p.inputs[0].binary, 1);
    cr_assert_eq(p.inputs[0].rows[0].len, 48);
    cr_assert_eq(memcmp(p.inputs[0].rows[0].data, x, 48), 0);
    cr_assert_eq(memcmp(p.inputs[0].rows[1].data, x + 12, 48), 0);
    cr_assert_eq(p.noutputs, 2);
    cr_assert_eq(p.outputs[0].model_output, 0);
    cr_assert_eq(p.outputs[0].classification, 3);
    cr_assert_eq(p.outputs[0].binary, 1, "raw_output_contents: binary");
    cr_assert_eq(p.outputs[1].model_output, 1);
    cr_assert_str_eq(p.outputs[1].shm.region, "out");
    cr_assert_eq(p.outputs[1].shm.offset, 8);
    cr_assert_eq(p.outputs[1].shm.byte_size, 64);
    gw_oip_request_dispose(&p);
    gw_grpc_infer_req_dispose(&q);

    /* Triton's timeout, in microseconds; every output binary when none is
     * named. */
    Inference__InferParameter timeout = int_param(5000);
    rp[0].key = "timeout";
    rp[0].value = &timeout;
    r.n_parameters = 1;
    r.n_outputs = 0;
    r.id = "";
    cr_assert_eq(decode_and_parse(&r, &q, &p, why, sizeof(why)), 0, "%s", why);
    cr_assert_float_eq(p.slo_ms, 5.0, 1e-9);
    cr_assert_eq(p.slo_is_timeout, 1);
    cr_assert_null(p.id, "no id sent: none");
    cr_assert_eq(p.noutputs, 2);
    cr_assert(p.outputs[0].binary && p.outputs[1].binary);
    gw_oip_request_dispose(&p);
    gw_grpc_infer_req_dispose(&q);
}

Test(grpc_codec, typed_contents_become_the_binary_form_of_their_datatype)
{
    int64_t shape[] = {1, 3, 2, 2};
    float f[12];
    uint32_t u[12];
    for (int i = 0; i < 12; i++) {
        f[i] = 1.0f / (float)(i + 1);
        u[i] = (uint32_t)(i * 20);
    }
    Inference__InferTensorContents c = INFERENCE__INFER_TENSOR_CONTENTS__INIT;
    infer_in_t in = INFERENCE__MODEL_INFER_REQUEST__INFER_INPUT_TENSOR__INIT;
    infer_in_t *ins[] = {&in};
    in.name = "input";
    in.shape = shape;
    in.n_shape = 4;
    in.contents = &c;
    infer_req_t r = INFERENCE__MODEL_INFER_REQUEST__INIT;
    r.model_name = "m";
    r.inputs = ins;
    r.n_inputs = 1;
    gw_grpc_infer_req_t q;
    gw_oip_request_t p;
    char why[512];

    in.datatype = "FP32";
    c.fp32_contents = f;
    c.n_fp32_contents = 12;
    cr_assert_eq(decode_and_parse(&r, &q, &p, why, sizeof(why)), 0, "%s", why);
    cr_assert_eq(p.inputs[0].datatype, GW_OIP_FP32);
    cr_assert_eq(p.inputs[0].rows[0].len, 48);
    cr_assert_eq(memcmp(p.inputs[0].rows[0].data, f, 48), 0, "little-endian floats as sent");
    gw_oip_request_dispose(&p);
    gw_grpc_infer_req_dispose(&q);

    in.datatype = "UINT8";
    c.n_fp32_contents = 0;
    c.uint_contents = u;
    c.n_uint_contents = 12;
    cr_assert_eq(decode_and_parse(&r, &q, &p, why, sizeof(why)), 0, "%s", why);
    cr_assert_eq(p.inputs[0].datatype, GW_OIP_UINT8);
    cr_assert_eq(p.inputs[0].rows[0].len, 12);
    for (int i = 0; i < 12; i++)
        cr_assert_eq(p.inputs[0].rows[0].data[i], u[i]);
    gw_oip_request_dispose(&p);
    gw_grpc_infer_req_dispose(&q);

    /* BYTES: each element one row (a JPEG's bytes, here any). */
    int64_t bshape[] = {2};
    ProtobufCBinaryData b[] = {{3, (uint8_t *)"abc"}, {5, (uint8_t *)"hello"}};
    in.datatype = "BYTES";
    in.shape = bshape;
    in.n_shape = 1;
    c.n_uint_contents = 0;
    c.bytes_contents = b;
    c.n_bytes_contents = 2;
    cr_assert_eq(decode_and_parse(&r, &q, &p, why, sizeof(why)), 0, "%s", why);
    cr_assert_eq(p.inputs[0].datatype, GW_OIP_BYTES);
    cr_assert_eq(p.batch, 2);
    cr_assert_eq(p.inputs[0].rows[1].len, 5);
    cr_assert_eq(memcmp(p.inputs[0].rows[1].data, "hello", 5), 0);
    gw_oip_request_dispose(&p);
    gw_grpc_infer_req_dispose(&q);

    /* The shape and datatype are the OIP codec's to check, with its words. */
    in.datatype = "INT32";
    in.shape = shape;
    in.n_shape = 4;
    c.n_bytes_contents = 0;
    int32_t ints[12] = {0};
    c.int_contents = ints;
    c.n_int_contents = 12;
    cr_assert_eq(decode_and_parse(&r, &q, &p, why, sizeof(why)), SQ_BAD_TENSOR);
    cr_assert_not_null(strstr(why, "datatype"), "%s", why);
    gw_oip_request_dispose(&p);
    gw_grpc_infer_req_dispose(&q);
}

Test(grpc_codec, a_model_infer_request_that_cannot_be_a_body_is_refused_saying_why)
{
    int64_t shape[] = {1, 3, 2, 2};
    float f[12] = {0};
    uint32_t u[12] = {0};
    Inference__InferTensorContents c = INFERENCE__INFER_TENSOR_CONTENTS__INIT;
    infer_in_t in = INFERENCE__MODEL_INFER_REQUEST__INFER_INPUT_TENSOR__INIT;
    infer_in_t *ins[] = {&in, &in};
    in.name = "input";
    in.datatype = "FP32";
    in.shape = shape;
    in.n_shape = 4;
    infer_req_t r = INFERENCE__MODEL_INFER_REQUEST__INIT;
    r.model_name = "m";
    r.inputs = ins;
    r.n_inputs = 1;

    refused(&r, SQ_BAD_TENSOR, "no data");
    in.contents = &c;
    c.fp32_contents = f;
    c.n_fp32_contents = 11;
    refused(&r, SQ_BAD_TENSOR, "11 values, but shape holds 12");
    c.n_fp32_contents = 0;
    c.uint_contents = u;
    c.n_uint_contents = 12;
    refused(&r, SQ_BAD_TENSOR, "fp32_contents");
    in.datatype = "UINT8";
    u[5] = 256;
    refused(&r, SQ_BAD_TENSOR, "uint_contents[5]");
    u[5] = 0;
    ProtobufCBinaryData raw[2] = {{12, (uint8_t *)u}, {12, (uint8_t *)u}};
    r.raw_input_contents = raw;
    r.n_raw_input_contents = 1;
    refused(&r, SQ_BAD_REQUEST, "raw_input_contents");
    in.contents = NULL;
    r.n_raw_input_contents = 2;
    refused(&r, SQ_BAD_REQUEST, "2 entries for 1 inputs");
    r.n_raw_input_contents = 1;

    /* parameters of the wrong kind */
    Inference__InferParameter s = string_param("soon"), neg = int_param(-1);
    req_param_t rp = INFERENCE__MODEL_INFER_REQUEST__PARAMETERS_ENTRY__INIT;
    req_param_t *rps[] = {&rp};
    r.parameters = rps;
    r.n_parameters = 1;
    const char *keys[] = {"slo_ms", "priority", "timeout"};
    for (int i = 0; i < 3; i++) {
        rp.key = (char *)keys[i];
        rp.value = &s;
        refused(&r, SQ_BAD_REQUEST, keys[i]);
    }
    rp.key = "priority";
    rp.value = &neg;
    refused(&r, SQ_BAD_REQUEST, "priority");
    r.n_parameters = 0;

    /* in shared memory and sent along too; a region's name of another kind */
    in_param_t ip = INFERENCE__MODEL_INFER_REQUEST__INFER_INPUT_TENSOR__PARAMETERS_ENTRY__INIT;
    in_param_t *ips[] = {&ip};
    Inference__InferParameter region = string_param("r");
    ip.key = "shared_memory_region";
    ip.value = &region;
    in.parameters = ips;
    in.n_parameters = 1;
    refused(&r, SQ_BAD_REQUEST, "shared memory");
    ip.value = &neg;
    refused(&r, SQ_BAD_REQUEST, "shared_memory_region");
    in.n_parameters = 0;

    /* the model's name and version */
    r.model_name = "";
    refused(&r, SQ_BAD_REQUEST, "name");
    r.model_name = "m";
    r.model_version = "v1";
    refused(&r, SQ_BAD_REQUEST, "version");

    gw_grpc_infer_req_t q;
    char why[256];
    static const uint8_t garbled[] = {0x0d, 0x01, 0x02};
    cr_assert_eq(gw_grpc_decode_infer(garbled, sizeof(garbled), &q, why, sizeof(why)),
                 SQ_BAD_REQUEST);
    cr_assert_not_null(strstr(why, "ModelInferRequest"), "%s", why);
}

Test(grpc_codec, v2s_answer_becomes_a_model_infer_response_with_raw_outputs)
{
    float scores[2] = {0.25f, -1.5f};
    const char *head = "{\"model_name\":\"m\",\"model_version\":\"3\",\"id\":\"req-9\","
                       "\"parameters\":{\"total_ms\":4,\"slo_source\":\"model\"},"
                       "\"outputs\":[{\"name\":\"scores\",\"datatype\":\"FP32\",\"shape\":[1,2],"
                       "\"parameters\":{\"binary_data_size\":8}},"
                       "{\"name\":\"feat\",\"datatype\":\"FP32\",\"shape\":[1,4],"
                       "\"parameters\":{\"shared_memory_region\":\"out\"}}]}";
    size_t hlen = strlen(head);
    uint8_t answer[1024];
    memcpy(answer, head, hlen);
    memcpy(answer + hlen, scores, sizeof(scores));
    uint8_t *msg;
    size_t n;
    char why[256];
    cr_assert_eq(
        gw_grpc_encode_infer(answer, hlen + 8, (long long)hlen, &msg, &n, why, sizeof(why)), 0,
        "%s", why);
    Inference__ModelInferResponse *r = inference__model_infer_response__unpack(NULL, n, msg);
    cr_assert_not_null(r);
    cr_assert_str_eq(r->model_name, "m");
    cr_assert_str_eq(r->model_version, "3");
    cr_assert_str_eq(r->id, "req-9");
    cr_assert_eq(r->n_parameters, 2);
    for (size_t i = 0; i < r->n_parameters; i++) {
        Inference__InferParameter *v = r->parameters[i]->value;
        if (strcmp(r->parameters[i]->key, "total_ms") == 0)
            cr_assert(v->parameter_choice_case ==
                          INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_DOUBLE_PARAM &&
                      v->double_param == 4.0);
        else
            cr_assert_str_eq(v->string_param, "model");
    }
    cr_assert_eq(r->n_outputs, 2);
    cr_assert_str_eq(r->outputs[0]->name, "scores");
    cr_assert_str_eq(r->outputs[0]->datatype, "FP32");
    cr_assert_eq(r->outputs[0]->n_shape, 2);
    cr_assert_eq(r->outputs[0]->shape[1], 2);
    cr_assert_eq(r->outputs[1]->shape[1], 4);
    cr_assert_eq(r->n_raw_output_contents, 2, "one entry per output");
    cr_assert_eq(r->raw_output_contents[0].len, 8);
    cr_assert_eq(memcmp(r->raw_output_contents[0].data, scores, 8), 0);
    cr_assert_eq(r->raw_output_contents[1].len, 0, "in shared memory: empty");
    inference__model_infer_response__free_unpacked(r, NULL);
    free(msg);
    /* binary data past the answer's end: a bug, not a crash */
    cr_assert_eq(
        gw_grpc_encode_infer(answer, hlen + 4, (long long)hlen, &msg, &n, why, sizeof(why)),
        SQ_INTERNAL);
    cr_assert_null(msg);
}

Test(grpc_codec, an_answers_json_bytes_output_becomes_its_raw_contents)
{
    /* A pipeline's answer: RESULT's texts in the JSON, no binary part. */
    const char *answer = "{\"model_name\":\"p\",\"model_version\":\"1\",\"id\":\"q\","
                         "\"outputs\":[{\"name\":\"RESULT\",\"datatype\":\"BYTES\","
                         "\"shape\":[2,1],\"data\":[\"{}\",\"abc\"]}]}";
    uint8_t *msg;
    size_t n;
    char why[256];
    cr_assert_eq(gw_grpc_encode_infer((const uint8_t *)answer, strlen(answer), -1, &msg, &n, why,
                                      sizeof(why)),
                 0, "%s", why);
    Inference__ModelInferResponse *r = inference__model_infer_response__unpack(NULL, n, msg);
    cr_assert_not_null(r);
    cr_assert_eq(r->n_outputs, 1);
    cr_assert_str_eq(r->outputs[0]->datatype, "BYTES");
    cr_assert_eq(r->n_raw_output_contents, 1);
    static const uint8_t want[] = {2, 0, 0, 0, '{', '}', 3, 0, 0, 0, 'a', 'b', 'c'};
    cr_assert_eq(r->raw_output_contents[0].len, sizeof(want));
    cr_assert_eq(memcmp(r->raw_output_contents[0].data, want, sizeof(want)), 0);
    inference__model_infer_response__free_unpacked(r, NULL);
    free(msg);
    /* JSON data of another datatype: a bug, not a silent empty output */
    const char *fp = "{\"outputs\":[{\"name\":\"y\",\"datatype\":\"FP32\",\"shape\":[1],"
                     "\"data\":[1.5]}]}";
    cr_assert_eq(
        gw_grpc_encode_infer((const uint8_t *)fp, strlen(fp), -1, &msg, &n, why, sizeof(why)),
        SQ_INTERNAL);
    cr_assert_null(msg);
}

Test(grpc_codec, a_stream_answer_wraps_the_response_or_carries_the_error)
{
    Inference__ModelInferResponse in = INFERENCE__MODEL_INFER_RESPONSE__INIT;
    in.model_name = "m";
    in.id = "a-long-enough-id-to-need-no-more-than-one-length-byte";
    uint8_t packed[256];
    size_t plen = inference__model_infer_response__pack(&in, packed);
    size_t n;
    uint8_t *msg = gw_grpc_stream_response(NULL, packed, plen, &n);
    Inference__ModelStreamInferResponse *r =
        inference__model_stream_infer_response__unpack(NULL, n, msg);
    cr_assert_not_null(r);
    cr_assert_str_eq(r->error_message, "");
    cr_assert_not_null(r->infer_response);
    cr_assert_str_eq(r->infer_response->model_name, "m");
    cr_assert_str_eq(r->infer_response->id, in.id);
    inference__model_stream_infer_response__free_unpacked(r, NULL);
    free(msg);
    /* an error of more than 127 bytes: a two-byte length */
    char why[300];
    memset(why, 'x', sizeof(why) - 1);
    why[sizeof(why) - 1] = '\0';
    msg = gw_grpc_stream_response(why, NULL, 0, &n);
    r = inference__model_stream_infer_response__unpack(NULL, n, msg);
    cr_assert_not_null(r);
    cr_assert_str_eq(r->error_message, why);
    cr_assert_null(r->infer_response);
    inference__model_stream_infer_response__free_unpacked(r, NULL);
    free(msg);
}

Test(grpc_codec, trace_settings_become_their_routes_body)
{
    uint8_t buf[1024];
    gw_grpc_req_t q;
    char why[256];
    Inference__TraceSettingRequest r = INFERENCE__TRACE_SETTING_REQUEST__INIT;
    r.model_name = (char *)"inc";
    /* No setting: a GET (no body). */
    size_t n = inference__trace_setting_request__pack(&r, buf);
    cr_assert_eq(gw_grpc_decode(GW_GRPC_TRACE_SETTING, buf, n, &q, why, sizeof(why)), 0, "%s", why);
    cr_assert_str_eq(q.name, "inc");
    cr_assert_null(q.settings);
    gw_grpc_req_dispose(&q);
    Inference__TraceSettingRequest__SettingValue level =
        INFERENCE__TRACE_SETTING_REQUEST__SETTING_VALUE__INIT;
    Inference__TraceSettingRequest__SettingValue rate =
        INFERENCE__TRACE_SETTING_REQUEST__SETTING_VALUE__INIT;
    Inference__TraceSettingRequest__SettingValue cleared =
        INFERENCE__TRACE_SETTING_REQUEST__SETTING_VALUE__INIT;
    char *levels[] = {(char *)"TIMESTAMPS"}, *rates[] = {(char *)"100"};
    level.n_value = 1;
    level.value = levels;
    rate.n_value = 1;
    rate.value = rates;
    Inference__TraceSettingRequest__SettingsEntry e[3];
    Inference__TraceSettingRequest__SettingsEntry *ep[3] = {&e[0], &e[1], &e[2]};
    const char *keys[] = {"trace_level", "trace_rate", "trace_count"};
    Inference__TraceSettingRequest__SettingValue *vals[] = {&level, &rate, &cleared};
    for (int i = 0; i < 3; i++) {
        inference__trace_setting_request__settings_entry__init(&e[i]);
        e[i].key = (char *)keys[i];
        e[i].value = vals[i];
    }
    r.n_settings = 3;
    r.settings = ep;
    r.model_name = (char *)"";
    n = inference__trace_setting_request__pack(&r, buf);
    cr_assert_eq(gw_grpc_decode(GW_GRPC_TRACE_SETTING, buf, n, &q, why, sizeof(why)), 0, "%s", why);
    cr_assert_str_eq(q.name, "", "no model: the global settings");
    char *text = json_dumps(q.settings, JSON_COMPACT | JSON_SORT_KEYS);
    cr_assert_str_eq(text, "{\"trace_count\":null,\"trace_level\":[\"TIMESTAMPS\"],"
                           "\"trace_rate\":\"100\"}");
    free(text);
    gw_grpc_req_dispose(&q);
    gw_grpc_req_dispose(&q); /* twice is harmless */
    /* A value that is no UTF-8 is refused, as a JSON body could not hold it. */
    rates[0] = (char *)"\xff";
    n = inference__trace_setting_request__pack(&r, buf);
    cr_assert_eq(gw_grpc_decode(GW_GRPC_TRACE_SETTING, buf, n, &q, why, sizeof(why)),
                 SQ_BAD_REQUEST);
    cr_assert_not_null(strstr(why, "UTF-8"), "%s", why);
    gw_grpc_req_dispose(&q);
}

Test(grpc_codec, log_settings_become_their_routes_body_by_kind)
{
    uint8_t buf[1024];
    gw_grpc_req_t q;
    char why[256];
    Inference__LogSettingsRequest r = INFERENCE__LOG_SETTINGS_REQUEST__INIT;
    Inference__LogSettingsRequest__SettingValue v[4];
    Inference__LogSettingsRequest__SettingsEntry e[4];
    Inference__LogSettingsRequest__SettingsEntry *ep[4];
    const char *keys[] = {"log_info", "log_verbose_level", "log_format", "log_error"};
    for (int i = 0; i < 4; i++) {
        inference__log_settings_request__setting_value__init(&v[i]);
        inference__log_settings_request__settings_entry__init(&e[i]);
        e[i].key = (char *)keys[i];
        e[i].value = &v[i];
        ep[i] = &e[i];
    }
    v[0].parameter_choice_case =
        INFERENCE__LOG_SETTINGS_REQUEST__SETTING_VALUE__PARAMETER_CHOICE_BOOL_PARAM;
    v[0].bool_param = 1;
    v[1].parameter_choice_case =
        INFERENCE__LOG_SETTINGS_REQUEST__SETTING_VALUE__PARAMETER_CHOICE_UINT32_PARAM;
    v[1].uint32_param = 4000000000u;
    v[2].parameter_choice_case =
        INFERENCE__LOG_SETTINGS_REQUEST__SETTING_VALUE__PARAMETER_CHOICE_STRING_PARAM;
    v[2].string_param = (char *)"ISO8601";
    /* v[3]: no value, left as it is (null) */
    r.n_settings = 4;
    r.settings = ep;
    size_t n = inference__log_settings_request__pack(&r, buf);
    cr_assert_eq(gw_grpc_decode(GW_GRPC_LOG_SETTINGS, buf, n, &q, why, sizeof(why)), 0, "%s", why);
    char *text = json_dumps(q.settings, JSON_COMPACT | JSON_SORT_KEYS);
    cr_assert_str_eq(text, "{\"log_error\":null,\"log_format\":\"ISO8601\",\"log_info\":true,"
                           "\"log_verbose_level\":4000000000}");
    free(text);
    gw_grpc_req_dispose(&q);
    r.n_settings = 0;
    n = inference__log_settings_request__pack(&r, buf);
    cr_assert_eq(gw_grpc_decode(GW_GRPC_LOG_SETTINGS, buf, n, &q, why, sizeof(why)), 0);
    cr_assert_null(q.settings, "no setting: a GET");
}

Test(grpc_codec, cuda_shared_memory_requests_read_their_region)
{
    uint8_t buf[256];
    gw_grpc_req_t q;
    char why[256];
    Inference__CudaSharedMemoryRegisterRequest r =
        INFERENCE__CUDA_SHARED_MEMORY_REGISTER_REQUEST__INIT;
    r.name = (char *)"g0";
    r.byte_size = 64;
    size_t n = inference__cuda_shared_memory_register_request__pack(&r, buf);
    cr_assert_eq(gw_grpc_decode(GW_GRPC_CUDA_SHM_REGISTER, buf, n, &q, why, sizeof(why)), 0, "%s",
                 why);
    cr_assert_str_eq(q.name, "g0");
    r.name = (char *)"";
    n = inference__cuda_shared_memory_register_request__pack(&r, buf);
    cr_assert_eq(gw_grpc_decode(GW_GRPC_CUDA_SHM_REGISTER, buf, n, &q, why, sizeof(why)),
                 SQ_BAD_REQUEST, "a register names its region");
    Inference__CudaSharedMemoryStatusRequest s = INFERENCE__CUDA_SHARED_MEMORY_STATUS_REQUEST__INIT;
    n = inference__cuda_shared_memory_status_request__pack(&s, buf);
    cr_assert_eq(gw_grpc_decode(GW_GRPC_CUDA_SHM_STATUS, buf, n, &q, why, sizeof(why)), 0);
    cr_assert_str_eq(q.name, "", "no name: every region");
}
