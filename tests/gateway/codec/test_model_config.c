#include <criterion/criterion.h>
#include <gw_codec.h>
#include <sq.h>

#include <stdlib.h>
#include <string.h>

static int parse(const char *json, int emulated, gw_model_config_t *cfg, char *err)
{
    return gw_model_config_parse(json, strlen(json), emulated, cfg, err, 512);
}

Test(model_config, a_name_alone_is_a_valid_config_with_defaults)
{
    gw_model_config_t cfg;
    char err[512];
    cr_assert_eq(parse("{\"name\": \"resnet18\"}", 0, &cfg, err), 0, "%s", err);
    cr_assert_str_eq(cfg.name, "resnet18");
    cr_assert_eq(cfg.version, 1);
    /* No SLO unless one is asked for (issue 23: 100 ms was imposed). */
    cr_assert_float_eq(cfg.default_slo_ms, 0, 1e-9);
    cr_assert_str_eq(cfg.channel_order, "RGB");
    cr_assert_str_eq(cfg.resize, "bilinear");
    cr_assert_float_eq(cfg.mean[0], 0.485 * 255, 1e-9);
    cr_assert_float_eq(cfg.std[2], 0.225 * 255, 1e-9);
    cr_assert_null(cfg.labels);
    gw_model_config_dispose(&cfg);
}

Test(model_config, every_field_parses)
{
    gw_model_config_t cfg;
    char err[512];
    const char *j = "{\"name\": \"m-1.a\", \"version\": 7, \"default_slo_ms\": 25.5, "
                    "\"max_batch\": 16, \"labels\": [\"cat\", \"dog\"], "
                    "\"preprocess\": {\"mean\": [1, 2, 3], \"std\": [4, 5, 6], "
                    "\"resize\": \"nearest\", \"channel_order\": \"BGR\"}}";
    cr_assert_eq(parse(j, 0, &cfg, err), 0, "%s", err);
    cr_assert_eq(cfg.version, 7);
    cr_assert_eq(cfg.max_batch, 16);
    cr_assert_eq(json_array_size(cfg.labels), 2);
    cr_assert_str_eq(cfg.channel_order, "BGR");
    cr_assert_float_eq(cfg.std[1], 5, 1e-9);
    gw_model_config_dispose(&cfg);
}

#define EXPECT_BAD(json, emulated, code, needle)                                                   \
    do {                                                                                           \
        gw_model_config_t c_;                                                                      \
        char e_[512] = "";                                                                         \
        cr_assert_eq(parse(json, emulated, &c_, e_), code, "%s -> %s", json, e_);                  \
        cr_assert(strstr(e_, needle) != NULL, "'%s' does not name '%s'", e_, needle);              \
    } while (0)

Test(model_config, errors_name_the_json_path)
{
    EXPECT_BAD("{\"name\": ", 0, SQ_BAD_JSON, "invalid JSON");
    EXPECT_BAD("[1]", 0, SQ_BAD_CONFIG, "object");
    EXPECT_BAD("{}", 0, SQ_BAD_CONFIG, "config.name");
    EXPECT_BAD("{\"name\": \"a/b\"}", 0, SQ_BAD_CONFIG, "config.name");
    EXPECT_BAD("{\"name\": \"-a\"}", 0, SQ_BAD_CONFIG, "config.name");
    EXPECT_BAD("{\"name\": \"a\", \"version\": 0}", 0, SQ_BAD_CONFIG, "config.version");
    EXPECT_BAD("{\"name\": \"a\", \"version\": \"1\"}", 0, SQ_BAD_CONFIG, "config.version");
    EXPECT_BAD("{\"name\": \"a\", \"default_slo_ms\": -1}", 0, SQ_BAD_CONFIG, "default_slo_ms");
    EXPECT_BAD("{\"name\": \"a\", \"default_slo_ms\": 0}", 0, SQ_BAD_CONFIG, "null (none");
    EXPECT_BAD("{\"name\": \"a\", \"labels\": []}", 0, SQ_BAD_CONFIG, "config.labels");
    EXPECT_BAD("{\"name\": \"a\", \"labels\": [\"x\", 3]}", 0, SQ_BAD_CONFIG, "labels[1]");
    EXPECT_BAD("{\"name\": \"a\", \"preprocess\": {\"mean\": [1, 2]}}", 0, SQ_BAD_CONFIG,
               "preprocess.mean");
    EXPECT_BAD("{\"name\": \"a\", \"preprocess\": {\"std\": [1, 0, 1]}}", 0, SQ_BAD_CONFIG,
               "preprocess.std");
    EXPECT_BAD("{\"name\": \"a\", \"preprocess\": {\"gamma\": 2}}", 0, SQ_BAD_CONFIG,
               "preprocess.gamma");
    EXPECT_BAD("{\"name\": \"a\", \"preprocess\": {\"resize\": \"cubic\"}}", 0, SQ_BAD_CONFIG,
               "preprocess.resize");
    EXPECT_BAD("{\"name\": \"a\", \"max_batch\": 0}", 0, SQ_BAD_CONFIG, "max_batch");
    EXPECT_BAD("{\"name\": \"a\", \"oops\": 1}", 0, SQ_BAD_CONFIG, "config.oops");
    EXPECT_BAD("{\"name\": \"a\", \"name\": \"b\"}", 0, SQ_BAD_JSON, "duplicate");
    EXPECT_BAD("{\"name\": \"a\", \"profile\": {\"alpha_ms\": 1, \"beta_ms\": 1}}", 0,
               SQ_BAD_CONFIG, "emulated");
}

Test(model_config, emulated_models_need_a_valid_profile)
{
    gw_model_config_t cfg;
    char err[512];
    cr_assert_eq(
        parse("{\"name\": \"r50\", \"profile\": {\"alpha_ms\": 1.053, \"beta_ms\": 5.072}}", 1,
              &cfg, err),
        0, "%s", err);
    cr_assert(cfg.linear);
    cr_assert_eq(cfg.max_batch, 64);
    cr_assert_float_eq(cfg.alpha_ms, 1.053, 1e-12);
    gw_model_config_dispose(&cfg);

    cr_assert_eq(parse("{\"name\": \"A\", \"profile\": {\"batch\": [4, 8, 16], \"latency_ms\": "
                       "[50, 75, 100], \"latency_std_ms\": [1, 2, 3]}, \"memory_mb\": 300, "
                       "\"input\": {\"shape\": [3, 32, 32]}, \"num_classes\": 10}",
                       1, &cfg, err),
                 0, "%s", err);
    cr_assert_eq(cfg.nrows, 3);
    cr_assert_eq(cfg.max_batch, 16);
    cr_assert_float_eq(cfg.rows[1].mean_us, 75000, 1e-9);
    cr_assert_float_eq(cfg.rows[2].std_us, 3000, 1e-9);
    cr_assert_eq(cfg.input_shape[1], 32);
    cr_assert_eq(cfg.num_classes, 10);
    gw_model_config_dispose(&cfg);

    EXPECT_BAD("{\"name\": \"a\"}", 1, SQ_BAD_CONFIG, "profile");
    EXPECT_BAD("{\"name\": \"a\", \"profile\": {\"batch\": [1], \"latency_ms\": []}}", 1,
               SQ_BAD_CONFIG, "profile");
    EXPECT_BAD("{\"name\": \"a\", \"profile\": {\"batch\": [0], \"latency_ms\": [1]}}", 1,
               SQ_BAD_CONFIG, "profile.batch[0]");
    EXPECT_BAD("{\"name\": \"a\", \"profile\": {\"batch\": [2, 2], \"latency_ms\": [1, 2]}}", 1,
               SQ_BAD_CONFIG, "twice");
    EXPECT_BAD("{\"name\": \"a\", \"profile\": {\"batch\": [1], \"latency_ms\": [-3]}}", 1,
               SQ_BAD_CONFIG, "latency_ms[0]");
    EXPECT_BAD("{\"name\": \"a\", \"profile\": {\"alpha_ms\": 0, \"beta_ms\": 0}}", 1,
               SQ_BAD_CONFIG, "positive");
    EXPECT_BAD("{\"name\": \"a\", \"profile\": {\"alpha_ms\": 1, \"beta_ms\": 1}, \"input\": "
               "{\"shape\": [3, 0, 4]}}",
               1, SQ_BAD_CONFIG, "input");
    EXPECT_BAD("{\"name\": \"a\", \"profile\": {\"batch\": [8], \"latency_ms\": [1]}, "
               "\"max_batch\": 4}",
               1, SQ_BAD_CONFIG, "max_batch");
}

Test(model_config, labels_files_parse_one_per_line)
{
    char err[256];
    json_t *l = gw_labels_parse("cat\r\ndog\nfish\n", 14, err, sizeof(err));
    cr_assert_not_null(l, "%s", err);
    cr_assert_eq(json_array_size(l), 3);
    cr_assert_str_eq(json_string_value(json_array_get(l, 1)), "dog");
    json_decref(l);
    cr_assert_null(gw_labels_parse("", 0, err, sizeof(err)));
    cr_assert_null(gw_labels_parse("\xff\xfe\n", 3, err, sizeof(err)));
}

Test(model_config, version_policies_parse_in_tritons_form)
{
    gw_model_config_t *cfg = malloc(sizeof(*cfg));
    char err[256];
    cr_assert_eq(parse("{\"name\": \"m\", \"version_policy\": {\"latest\": {\"num_versions\": 2}}}",
                       0, cfg, err),
                 0, "%s", err);
    gw_model_config_dispose(cfg);
    const char *bad[][2] = {
        {"{\"name\": \"m\", \"version_policy\": {\"latest\": {\"num_versions\": 0}}}",
         "config.version_policy.latest.num_versions"},
        {"{\"name\": \"m\", \"version_policy\": {\"specific\": {\"versions\": []}}}",
         "config.version_policy.specific.versions"},
        {"{\"name\": \"m\", \"version_policy\": {\"newest\": {}}}", "config.version_policy"},
        {"{\"name\": \"m\", \"version_policy\": 3}", "config.version_policy"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cr_assert_eq(parse(bad[i][0], 0, cfg, err), SQ_BAD_CONFIG, "%s", bad[i][0]);
        cr_assert(strstr(err, bad[i][1]) == err, "%s: %s", bad[i][0], err);
    }
    gw_version_policy_t p;
    json_t *v = json_loads("{\"specific\": {\"versions\": [1, 5]}}", 0, NULL);
    cr_assert_eq(gw_version_policy_parse(v, &p, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(p.kind, GW_VP_SPECIFIC);
    cr_assert_eq(p.nversions, 2);
    char d[64];
    gw_version_policy_describe(&p, d, sizeof(d));
    cr_assert_str_eq(d, "versions 1, 5");
    json_decref(v);
    v = json_loads("{\"all\": {}}", 0, NULL);
    cr_assert_eq(gw_version_policy_parse(v, &p, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(p.kind, GW_VP_ALL);
    json_decref(v);
    free(cfg);
}

Test(model_config, an_emulated_detector_gives_its_mean_and_slots)
{
    gw_model_config_t cfg;
    char err[512];
    cr_assert_eq(parse("{\"name\": \"ssd\", \"profile\": {\"alpha_ms\": 23.8, \"beta_ms\": 9.7}, "
                       "\"detections\": {\"mean\": 2.5, \"slots\": 16}}",
                       1, &cfg, err),
                 0, "%s", err);
    cr_assert_eq(cfg.det_slots, 16);
    cr_assert_float_eq(cfg.det_mean, 2.5, 1e-12);
    gw_model_config_dispose(&cfg);
    cr_assert_eq(parse("{\"name\": \"ssd\", \"profile\": {\"alpha_ms\": 1, \"beta_ms\": 1}, "
                       "\"detections\": {\"mean\": 0.1}}",
                       1, &cfg, err),
                 0, "%s", err);
    cr_assert_eq(cfg.det_slots, GW_EMU_DET_DEFAULT_SLOTS);
    gw_model_config_dispose(&cfg);

#define DET(body) "{\"name\": \"d\", \"profile\": {\"alpha_ms\": 1, \"beta_ms\": 1}, " body "}"
    EXPECT_BAD(DET("\"detections\": {\"mean\": 3, \"slots\": 2}"), 1, SQ_BAD_CONFIG,
               "config.detections.mean");
    EXPECT_BAD(DET("\"detections\": {\"mean\": -1}"), 1, SQ_BAD_CONFIG, "config.detections.mean");
    EXPECT_BAD(DET("\"detections\": {\"slots\": 4}"), 1, SQ_BAD_CONFIG, "config.detections.mean");
    EXPECT_BAD(DET("\"detections\": {\"mean\": 1, \"slots\": 0}"), 1, SQ_BAD_CONFIG,
               "config.detections.slots");
    EXPECT_BAD(DET("\"detections\": {\"mean\": 1, \"slots\": 2000}"), 1, SQ_BAD_CONFIG,
               "config.detections.slots");
    EXPECT_BAD(DET("\"detections\": {\"mean\": 1, \"k\": 2}"), 1, SQ_BAD_CONFIG,
               "config.detections.k");
    EXPECT_BAD(DET("\"detections\": 1"), 1, SQ_BAD_CONFIG, "config.detections");
    EXPECT_BAD(DET("\"detections\": {\"mean\": 1}, \"num_classes\": 3"), 1, SQ_BAD_CONFIG,
               "no classes");
#undef DET
    /* An ONNX model's outputs come from its file. */
    EXPECT_BAD("{\"name\": \"a\", \"detections\": {\"mean\": 1}}", 0, SQ_BAD_CONFIG, "emulated");
}

/* "precision": the arithmetic the workers' plans are asked to run in. Every
 * value parses, for an ONNX and an emulated model alike; none is fp32. */
Test(model_config, precision_takes_each_value_and_defaults_to_fp32)
{
    const char *names[] = {"fp32", "tf32", "fp16", "bf16"};
    for (int emulated = 0; emulated < 2; emulated++) {
        gw_model_config_t cfg;
        char err[512], j[256];
        const char *prof = emulated ? ", \"profile\": {\"alpha_ms\": 1, \"beta_ms\": 2}" : "";
        snprintf(j, sizeof(j), "{\"name\": \"p\"%s}", prof);
        cr_assert_eq(parse(j, emulated, &cfg, err), 0, "%s", err);
        cr_assert_eq(cfg.precision, 0, "the default is fp32");
        cr_assert_str_eq(sq_precision_name(cfg.precision), "fp32");
        gw_model_config_dispose(&cfg);
        for (int p = 0; p < 4; p++) {
            snprintf(j, sizeof(j), "{\"name\": \"p\", \"precision\": \"%s\"%s}", names[p], prof);
            cr_assert_eq(parse(j, emulated, &cfg, err), 0, "%s: %s", j, err);
            cr_assert_eq(cfg.precision, p, "%s", j);
            cr_assert_str_eq(sq_precision_name(cfg.precision), names[p]);
            gw_model_config_dispose(&cfg);
        }
    }
}

/* Anything else is a 400 bad_config that names the field and the values
 * it takes (squishd answers {"error": err, "code": "bad_config"}). */
Test(model_config, a_bad_precision_names_the_field_and_its_values)
{
    const char *bad[] = {"{\"name\": \"p\", \"precision\": \"fp8\"}",
                         "{\"name\": \"p\", \"precision\": \"FP16\"}",
                         "{\"name\": \"p\", \"precision\": \"\"}",
                         "{\"name\": \"p\", \"precision\": 16}",
                         "{\"name\": \"p\", \"precision\": null}",
                         "{\"name\": \"p\", \"precision\": [\"fp16\"]}"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        gw_model_config_t cfg;
        char err[512] = "";
        cr_assert_eq(parse(bad[i], 0, &cfg, err), SQ_BAD_CONFIG, "%s", bad[i]);
        cr_assert_str_eq(err,
                         "config.precision: expected \"fp32\" (the default), \"tf32\", \"fp16\" "
                         "or \"bf16\"",
                         "%s -> %s", bad[i], err);
        cr_assert_null(cfg.labels);
    }
    /* The refusal of an unknown field lists it among the fields. */
    EXPECT_BAD("{\"name\": \"p\", \"precison\": \"fp16\"}", 0, SQ_BAD_CONFIG, "precision");
    /* A bad precision with labels given leaks nothing (labels are parsed
     * after it, but the config is disposed of on every error). */
    EXPECT_BAD("{\"name\": \"p\", \"labels\": [\"a\"], \"precision\": \"x\"}", 0, SQ_BAD_CONFIG,
               "config.precision");
}

Test(model_config, an_onnx_model_may_pin_its_input_sizes)
{
    gw_model_config_t cfg;
    char err[512];
    /* Not given: nothing pinned (the file's sizes). */
    cr_assert_eq(parse("{\"name\": \"det\"}", 0, &cfg, err), 0, "%s", err);
    cr_assert_eq(cfg.input_rank, 0);
    gw_model_config_dispose(&cfg);
    /* Triton's dims: every size past the batch, in the model's order. */
    cr_assert_eq(parse("{\"name\": \"det\", \"input\": {\"shape\": [3, 480, 640]}}", 0, &cfg, err),
                 0, "%s", err);
    cr_assert_eq(cfg.input_rank, 3);
    cr_assert_eq(cfg.input_shape[0], 3);
    cr_assert_eq(cfg.input_shape[1], 480);
    cr_assert_eq(cfg.input_shape[2], 640);
    gw_model_config_dispose(&cfg);
    /* Another rank is the importer's to judge (it knows the file). */
    cr_assert_eq(parse("{\"name\": \"seq\", \"input\": {\"shape\": [128, 80]}}", 0, &cfg, err), 0,
                 "%s", err);
    cr_assert_eq(cfg.input_rank, 2);
    gw_model_config_dispose(&cfg);
    /* An emulated model's is its [C, H, W], as ever. */
    cr_assert_eq(parse("{\"name\": \"e\", \"profile\": {\"alpha_ms\": 1, \"beta_ms\": 1}, "
                       "\"input\": {\"shape\": [3, 16, 24]}}",
                       1, &cfg, err),
                 0, "%s", err);
    cr_assert_eq(cfg.input_rank, 3);
    cr_assert_eq(cfg.input_shape[2], 24);
    gw_model_config_dispose(&cfg);
}

Test(model_config, a_bad_input_pin_names_its_path)
{
    EXPECT_BAD("{\"name\": \"a\", \"input\": [3, 32, 32]}", 0, SQ_BAD_CONFIG,
               "config.input: expected {\"shape\": [C, H, W]}");
    EXPECT_BAD("{\"name\": \"a\", \"input\": {\"shape\": []}}", 0, SQ_BAD_CONFIG, "config.input");
    EXPECT_BAD("{\"name\": \"a\", \"input\": {\"shape\": [1, 2, 3, 4, 5, 6, 7, 8]}}", 0,
               SQ_BAD_CONFIG, "config.input");
    EXPECT_BAD("{\"name\": \"a\", \"input\": {\"shape\": [3, 32, 32], \"layout\": \"NCHW\"}}", 0,
               SQ_BAD_CONFIG, "config.input");
    EXPECT_BAD("{\"name\": \"a\", \"input\": {\"shape\": [3, 0, 32]}}", 0, SQ_BAD_CONFIG,
               "config.input.shape[1]: expected a size in 1..65536");
    EXPECT_BAD("{\"name\": \"a\", \"input\": {\"shape\": [3, 32, \"W\"]}}", 0, SQ_BAD_CONFIG,
               "config.input.shape[2]");
    EXPECT_BAD("{\"name\": \"a\", \"input\": {\"shape\": [3, 32, 70000]}}", 0, SQ_BAD_CONFIG,
               "config.input.shape[2]");
}
