/* gateway/grpc/grpc_codec.c: a call's method from its path, each request
 * message of the methods served decoded field by field (made here with
 * protobuf-c's packers of the project's own kserve_v2.proto, as a client's
 * bytes would come), the refusals that say what to send instead, and the
 * gRPC status each squish error maps to as Triton maps its own.
 * tests/fuzz/fuzz_grpc.c throws arbitrary bytes at the same decoder. */
#include <criterion/criterion.h>

#include "grpc_int.h"
#include "kserve_v2.pb-c.h"

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

Test(grpc_codec, a_method_not_served_yet_is_refused_by_name)
{
    gw_grpc_req_t q;
    char why[256];
    cr_assert_eq(gw_grpc_decode(GW_GRPC_MODEL_INFER, NULL, 0, &q, why, sizeof(why)),
                 SQ_BAD_REQUEST);
    cr_assert_not_null(strstr(why, "ModelInfer"), "%s", why);
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
