/* gateway/catalog/registry.c: entries built from modeldb's records
 * (mdb_model_records), publishing and replacing them, lookups by name,
 * version and key, the version policies (all, latest N, specific) and
 * which version takes unversioned requests, reference counting across
 * updates and removals, labels, and the device kinds. */
#include <criterion/criterion.h>
#include <gw_catalog.h>
#include <sq.h>

#include <string.h>

/* A record as mdb_model_records gives it: an ONNX classifier on
 * [N,3,224,224] FP32 with 4 classes, no profile, no group, no policy. */
static json_t *record(int64_t key, const char *name, int version, const char *status)
{
    json_t *rec = json_pack(
        "{s:I, s:s, s:i, s:s, s:f, s:s, s:s,"
        " s:{s:s, s:s, s:[i, i, i, i]}, s:[{s:s, s:s, s:[i, i]}],"
        " s:{s:s, s:s, s:[f, f, f], s:[f, f, f]},"
        " s:i, s:f, s:i, s:I, s:I, s:[s, s, s, s], s:[], s:n}",
        "id", (json_int_t)key, "name", name, "version", version, "sha256",
        "ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01", "created_at",
        1700000000.5, "format", "onnx", "status", status, "input", "name", "data", "datatype",
        "FP32", "shape", -1, 3, 224, 224, "outputs", "name", "logits", "datatype", "FP32", "shape",
        -1, 4, "preprocess", "resize", "bilinear", "channel_order", "RGB", "mean", 123.675, 116.28,
        103.53, "std", 58.395, 57.12, 57.375, "labels_count", 4, "default_slo_ms", 100.0,
        "max_batch", 32, "param_bytes", (json_int_t)1000, "memory_bytes", (json_int_t)5000000,
        "labels", "cat", "dog", "owl", "fox", "profiles", "prefix_group");
    cr_assert_not_null(rec);
    return rec;
}

static gw_model_t *model(int64_t key, const char *name, int version, const char *status)
{
    json_t *rec = record(key, name, version, status);
    gw_model_t *m = gw_model_from_record(rec);
    json_decref(rec);
    return m;
}

/* A model whose upload gave this version policy (Triton's JSON form). */
static gw_model_t *model_policy(int64_t key, const char *name, int version, const char *status,
                                const char *policy)
{
    json_t *rec = record(key, name, version, status);
    json_t *vp = json_loads(policy, 0, NULL);
    cr_assert_not_null(vp, "%s", policy);
    json_object_set_new(rec, "version_policy", vp);
    gw_model_t *m = gw_model_from_record(rec);
    json_decref(rec);
    cr_assert(m->has_policy, "%s parses", policy);
    return m;
}

/* The version an unversioned request of name gets (0: none). */
static int served_version(gw_registry_t *r, const char *name)
{
    gw_model_t *m = gw_registry_find(r, name, strlen(name), 0);
    int v = m != NULL ? m->version : 0;
    gw_model_unref(m);
    return v;
}

static int is_served(gw_registry_t *r, const char *name, int version, char *why, size_t len)
{
    gw_model_t *m = gw_registry_find(r, name, strlen(name), version);
    cr_assert_not_null(m, "%s version %d is published", name, version);
    int s = gw_registry_served(r, m, why, len);
    gw_model_unref(m);
    return s;
}

/* ---- entries from records ------------------------------------------------ */

Test(registry, a_record_gives_every_field_the_data_plane_reads)
{
    gw_model_t *m = model(42, "resnet", 3, "ready");
    cr_assert_eq(atomic_load(&m->refs), 1);
    cr_assert_eq(m->key, 42);
    cr_assert_str_eq(m->name, "resnet");
    cr_assert_eq(m->version, 3);
    cr_assert_str_eq(m->sha256, "ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01");
    cr_assert_not(m->emulated);
    cr_assert_str_eq(m->status, "ready");
    cr_assert_str_eq(m->error, "", "no error in the record: none");
    cr_assert_str_eq(m->input_name, "data");
    cr_assert_not(m->input_uint8);
    cr_assert_not(m->nhwc);
    cr_assert_eq(m->c, 3);
    cr_assert_eq(m->h, 224);
    cr_assert_eq(m->w, 224);
    cr_assert_str_eq(m->output_name, "logits");
    cr_assert_eq(m->noutputs, 1);
    cr_assert_eq(m->outputs[0].elems, 4);
    cr_assert_eq(m->outputs[0].ndims, 2);
    cr_assert_eq(m->outputs[0].dims[0], -1);
    cr_assert_eq(m->outputs[0].dims[1], 4);
    cr_assert_eq(m->out_elems, 4);
    cr_assert_float_eq(m->mean[0], 123.675, 1e-9);
    cr_assert_float_eq(m->mean[2], 103.53, 1e-9);
    cr_assert_float_eq(m->std[1], 57.12, 1e-9);
    cr_assert_not(m->bgr);
    cr_assert_not(m->nearest);
    cr_assert_float_eq(m->default_slo_ms, 100.0, 1e-9);
    cr_assert_eq(m->max_batch, 32);
    cr_assert_eq(m->memory_bytes, 5000000);
    cr_assert_eq(json_array_size(m->labels), 4);
    for (int k = 0; k < SQ_DEV_KIND_COUNT; k++)
        cr_assert_not(m->has_profile[k]);
    cr_assert_eq(m->group_id, 0);
    cr_assert_str_eq(m->cut_tensor, "");
    cr_assert_not(m->has_policy, "no version_policy: none (all)");
    cr_assert_eq(m->det_slots, 0);
    gw_model_unref(m);
}

Test(registry, an_nhwc_uint8_bgr_input_is_read_as_such)
{
    json_t *rec = record(1, "det", 1, "profiling");
    json_object_set_new(rec, "input",
                        json_pack("{s:s, s:s, s:[i, i, i, i]}", "name", "image", "datatype",
                                  "UINT8", "shape", -1, 320, 240, 3));
    json_t *pre = json_object_get(rec, "preprocess");
    json_object_set_new(pre, "channel_order", json_string("BGR"));
    json_object_set_new(pre, "resize", json_string("nearest"));
    gw_model_t *m = gw_model_from_record(rec);
    json_decref(rec);
    cr_assert(m->nhwc);
    cr_assert(m->input_uint8);
    cr_assert_eq(m->c, 3);
    cr_assert_eq(m->h, 320);
    cr_assert_eq(m->w, 240);
    cr_assert(m->bgr);
    cr_assert(m->nearest);
    gw_model_unref(m);

    /* 3 both second and last: channels first wins ([N,3,H,W], W = 3). */
    rec = record(2, "tiny", 1, "ready");
    json_object_set_new(rec, "input",
                        json_pack("{s:s, s:s, s:[i, i, i, i]}", "name", "x", "datatype", "FP32",
                                  "shape", -1, 3, 32, 3));
    m = gw_model_from_record(rec);
    json_decref(rec);
    cr_assert_not(m->nhwc);
    cr_assert_eq(m->c, 3);
    cr_assert_eq(m->h, 32);
    cr_assert_eq(m->w, 3);
    gw_model_unref(m);
}

Test(registry, an_input_that_is_not_four_dimensional_takes_no_images)
{
    json_t *rec = record(1, "tab", 1, "ready");
    json_object_set_new(
        rec, "input",
        json_pack("{s:s, s:s, s:[i, i]}", "name", "x", "datatype", "FP32", "shape", -1, 16));
    gw_model_t *m = gw_model_from_record(rec);
    json_decref(rec);
    cr_assert_eq(m->c, 0);
    cr_assert_eq(m->h, 0);
    cr_assert_eq(m->w, 0);
    gw_model_unref(m);
}

Test(registry, an_item_row_holds_every_output_flattened_in_order)
{
    json_t *rec = record(1, "ssd", 1, "ready");
    json_object_set_new(rec, "outputs",
                        json_pack("[{s:s, s:s, s:[i, i, i]}, {s:s, s:s, s:[i, i]}]", "name",
                                  "boxes", "datatype", "FP32", "shape", -1, 10, 4, "name", "scores",
                                  "datatype", "FP32", "shape", -1, 10));
    gw_model_t *m = gw_model_from_record(rec);
    json_decref(rec);
    cr_assert_eq(m->noutputs, 2);
    cr_assert_str_eq(m->output_name, "boxes", "output 0's name");
    cr_assert_str_eq(m->outputs[0].name, "boxes");
    cr_assert_eq(m->outputs[0].elems, 40, "the batch dimension is not an item's");
    cr_assert_str_eq(m->outputs[1].name, "scores");
    cr_assert_eq(m->outputs[1].elems, 10);
    cr_assert_eq(m->out_elems, 50);
    gw_model_unref(m);
}

Test(registry, only_the_first_outputs_up_to_the_cap_are_listed)
{
    json_t *rec = record(1, "many", 1, "ready");
    json_t *outs = json_array();
    for (int i = 0; i < GW_MAX_OUTPUTS + 3; i++) {
        char name[16];
        snprintf(name, sizeof(name), "o%d", i);
        json_array_append_new(outs, json_pack("{s:s, s:s, s:[i, i]}", "name", name, "datatype",
                                              "FP32", "shape", -1, 2));
    }
    json_object_set_new(rec, "outputs", outs);
    gw_model_t *m = gw_model_from_record(rec);
    json_decref(rec);
    cr_assert_eq(m->noutputs, GW_MAX_OUTPUTS);
    char last[16];
    snprintf(last, sizeof(last), "o%d", GW_MAX_OUTPUTS - 1);
    cr_assert_str_eq(m->outputs[GW_MAX_OUTPUTS - 1].name, last);
    cr_assert_eq(m->out_elems, 2 * GW_MAX_OUTPUTS, "a row holds the listed outputs only");
    gw_model_unref(m);
}

Test(registry, profiles_become_per_kind_tables_in_microseconds)
{
    json_t *rec = record(1, "p", 1, "ready");
    json_object_set_new(
        rec, "profiles",
        json_pack("[{s:s, s:s, s:[i, i, i], s:[f, f, f], s:[f, f, f], s:[I, I, I]},"
                  " {s:s, s:s, s:[i], s:[f], s:[f], s:[I]},"
                  " {s:s, s:s, s:[i], s:[f], s:[f], s:[I]}]",
                  "device_kind", "cpu", "device_name", "x86", "batch", 1, 2, 4, "latency_ms", 2.0,
                  3.0, 5.0, "latency_std_ms", 0.1, 0.2, 0.3, "peak_memory_bytes", (json_int_t)7000,
                  (json_int_t)8000, (json_int_t)9000, "device_kind", "tpu", "device_name", "?",
                  "batch", 1, "latency_ms", 1.0, "latency_std_ms", 0.0, "peak_memory_bytes",
                  (json_int_t)1, "device_kind", "emu", "device_name", "emu", "batch", 1,
                  "latency_ms", 9.0, "latency_std_ms", 0.0, "peak_memory_bytes", (json_int_t)0));
    gw_model_t *m = gw_model_from_record(rec);
    json_decref(rec);
    cr_assert(m->has_profile[SQ_DEV_CPU]);
    cr_assert_not(m->has_profile[SQ_DEV_CUDA], "an unknown device kind is skipped");
    cr_assert(m->has_profile[SQ_DEV_EMU]);
    cr_assert_float_eq(pl_latency_us(&m->profile[SQ_DEV_CPU], 1, 0), 2000, 1e-6);
    cr_assert_float_eq(pl_latency_us(&m->profile[SQ_DEV_CPU], 4, 0), 5000, 1e-6);
    cr_assert_float_eq(m->profile[SQ_DEV_CPU].memory_bytes, 7000, 1e-9,
                       "the batch-1 row's peak memory");
    cr_assert_float_eq(pl_latency_us(&m->profile[SQ_DEV_EMU], 1, 0), 9000, 1e-6);
    gw_model_unref(m);
}

Test(registry, an_emulated_detector_keeps_its_detections_and_a_group_its_cut)
{
    json_t *rec = record(1, "emu-det", 1, "ready");
    json_object_set_new(rec, "format", json_string("emulated"));
    json_object_set_new(rec, "detections", json_pack("{s:f}", "mean", 2.5));
    json_object_set_new(rec, "prefix_group",
                        json_pack("{s:I, s:s, s:s, s:[]}", "id", (json_int_t)7, "prefix_hash", "00",
                                  "cut_tensor", "layer3", "members"));
    gw_model_t *m = gw_model_from_record(rec);
    json_decref(rec);
    cr_assert(m->emulated);
    cr_assert_eq(m->det_slots, GW_EMU_DET_DEFAULT_SLOTS, "slots not given: the default");
    cr_assert_float_eq(m->det_mean, 2.5, 1e-9);
    cr_assert_eq(m->group_id, 7);
    cr_assert_str_eq(m->cut_tensor, "layer3");
    gw_model_unref(m);

    /* Detections on an ONNX model are not an emulated detector's. */
    rec = record(2, "onnx-det", 1, "ready");
    json_object_set_new(rec, "detections", json_pack("{s:i, s:f}", "slots", 9, "mean", 2.5));
    m = gw_model_from_record(rec);
    json_decref(rec);
    cr_assert_eq(m->det_slots, 0);
    gw_model_unref(m);
}

Test(registry, a_failed_record_keeps_its_error)
{
    json_t *rec = record(1, "bad", 1, "failed");
    json_object_set_new(rec, "error", json_string("profiling crashed the worker"));
    gw_model_t *m = gw_model_from_record(rec);
    json_decref(rec);
    cr_assert_str_eq(m->status, "failed");
    cr_assert_str_eq(m->error, "profiling crashed the worker");
    gw_model_unref(m);
}

Test(registry, an_invalid_version_policy_is_no_policy)
{
    json_t *rec = record(1, "x", 1, "ready");
    json_object_set_new(rec, "version_policy", json_pack("{s:{s:i}}", "latest", "num_versions", 0));
    gw_model_t *m = gw_model_from_record(rec);
    json_decref(rec);
    cr_assert_not(m->has_policy);
    gw_model_unref(m);
}

/* ---- labels and kinds ------------------------------------------------------ */

Test(registry, a_class_outside_the_labels_is_named_by_its_index)
{
    gw_model_t *m = model(1, "resnet", 1, "ready");
    char buf[24];
    cr_assert_str_eq(gw_model_label(m, 0, buf, sizeof(buf)), "cat");
    cr_assert_str_eq(gw_model_label(m, 3, buf, sizeof(buf)), "fox");
    cr_assert_str_eq(gw_model_label(m, 4, buf, sizeof(buf)), "4");
    cr_assert_str_eq(gw_model_label(m, -1, buf, sizeof(buf)), "-1");
    gw_model_unref(m);

    /* No labels at all: every class by its index. */
    json_t *rec = record(2, "bare", 1, "ready");
    json_object_del(rec, "labels");
    m = gw_model_from_record(rec);
    json_decref(rec);
    cr_assert_null(m->labels);
    cr_assert_str_eq(gw_model_label(m, 2, buf, sizeof(buf)), "2");
    gw_model_unref(m);
}

/* ---- publishing and lookups ------------------------------------------------ */

Test(registry, lookups_by_name_version_and_key)
{
    gw_registry_t *r = gw_registry_new();
    gw_registry_put(r, model(10, "resnet", 1, "ready"));
    gw_registry_put(r, model(11, "resnet", 2, "ready"));
    gw_registry_put(r, model(20, "mobilenet", 1, "ready"));

    gw_model_t *m = gw_registry_find(r, "resnet", 6, 1);
    cr_assert_not_null(m);
    cr_assert_eq(m->key, 10);
    gw_model_unref(m);
    m = gw_registry_find(r, "resnet", 6, 0);
    cr_assert_eq(m->version, 2, "unversioned: the newest ready");
    gw_model_unref(m);
    cr_assert_null(gw_registry_find(r, "resnet", 6, 3), "no version 3");
    cr_assert_null(gw_registry_find(r, "vgg", 3, 0));
    cr_assert_null(gw_registry_find(r, "resne", 5, 0), "a prefix of a name is not the name");
    cr_assert_null(gw_registry_find(r, "resnet50", 8, 0), "nor a longer one");
    /* The name is a length, not a terminated string: a path segment. */
    const char *path = "mobilenet/versions/1";
    m = gw_registry_find(r, path, 9, 0);
    cr_assert_not_null(m);
    cr_assert_str_eq(m->name, "mobilenet");
    gw_model_unref(m);

    m = gw_registry_get(r, 20);
    cr_assert_not_null(m);
    cr_assert_str_eq(m->name, "mobilenet");
    gw_model_unref(m);
    cr_assert_null(gw_registry_get(r, 99));
    gw_registry_free(r);
}

Test(registry, an_empty_registry_finds_nothing)
{
    gw_registry_t *r = gw_registry_new();
    cr_assert_null(gw_registry_find(r, "x", 1, 0));
    cr_assert_null(gw_registry_find(r, "x", 1, 1));
    cr_assert_null(gw_registry_get(r, 1));
    int64_t keys[2];
    cr_assert_eq(gw_registry_remove(r, "x", 0, keys, 2), 0);
    gw_registry_free(r);
    gw_registry_free(NULL);
}

Test(registry, a_put_with_the_same_key_replaces_the_entry)
{
    gw_registry_t *r = gw_registry_new();
    gw_registry_put(r, model(5, "resnet", 1, "profiling"));
    gw_registry_put(r, model(5, "resnet", 1, "ready"));
    gw_model_t *m = gw_registry_find(r, "resnet", 6, 1);
    cr_assert_str_eq(m->status, "ready");
    gw_model_unref(m);
    /* One entry, not two. */
    int64_t keys[4];
    int n = gw_registry_remove(r, "resnet", 0, keys, 4);
    cr_assert_eq(n, 1);
    cr_assert_eq(keys[0], 5);
    gw_registry_free(r);
}

Test(registry, many_entries_grow_the_table)
{
    gw_registry_t *r = gw_registry_new();
    for (int v = 1; v <= 100; v++)
        gw_registry_put(r, model(v, "big", v, "ready"));
    cr_assert_eq(served_version(r, "big"), 100);
    for (int v = 1; v <= 100; v += 33) {
        gw_model_t *m = gw_registry_get(r, v);
        cr_assert_not_null(m, "key %d", v);
        cr_assert_eq(m->version, v);
        gw_model_unref(m);
    }
    gw_registry_free(r);
}

static void count_entry(gw_model_t *m, void *arg)
{
    int *counts = arg;
    counts[0]++;
    if (strcmp(m->name, "a") == 0)
        counts[1] += m->version;
}

Test(registry, foreach_visits_every_entry_once)
{
    gw_registry_t *r = gw_registry_new();
    gw_registry_put(r, model(1, "a", 1, "ready"));
    gw_registry_put(r, model(2, "a", 2, "failed"));
    gw_registry_put(r, model(3, "b", 1, "profiling"));
    int counts[2] = {0, 0};
    gw_registry_foreach(r, count_entry, counts);
    cr_assert_eq(counts[0], 3);
    cr_assert_eq(counts[1], 3, "a's versions 1 and 2");
    gw_registry_free(r);
}

/* ---- removal --------------------------------------------------------------- */

Test(registry, removing_one_version_keeps_the_others)
{
    gw_registry_t *r = gw_registry_new();
    gw_registry_put(r, model(1, "a", 1, "ready"));
    gw_registry_put(r, model(2, "a", 2, "ready"));
    gw_registry_put(r, model(3, "a", 3, "ready"));
    gw_registry_put(r, model(4, "ab", 1, "ready"));
    int64_t keys[4] = {0};
    cr_assert_eq(gw_registry_remove(r, "a", 3, keys, 4), 1);
    cr_assert_eq(keys[0], 3);
    cr_assert_eq(served_version(r, "a"), 2, "the next newest takes the traffic");
    cr_assert_eq(gw_registry_remove(r, "a", 7, keys, 4), 0, "no version 7");
    cr_assert_eq(gw_registry_remove(r, "a", 0, keys, 4), 2);
    cr_assert((keys[0] == 1 && keys[1] == 2) || (keys[0] == 2 && keys[1] == 1));
    cr_assert_eq(served_version(r, "a"), 0);
    cr_assert_eq(served_version(r, "ab"), 1, "another name, even a longer one, stays");
    gw_registry_free(r);
}

Test(registry, remove_counts_every_version_but_writes_at_most_max_keys)
{
    gw_registry_t *r = gw_registry_new();
    for (int v = 1; v <= 5; v++)
        gw_registry_put(r, model(100 + v, "m", v, "ready"));
    int64_t keys[3] = {-1, -1, -1};
    cr_assert_eq(gw_registry_remove(r, "m", 0, keys, 2), 5);
    for (int i = 0; i < 2; i++)
        cr_assert(keys[i] > 100 && keys[i] <= 105, "keys[%d] = %lld", i, (long long)keys[i]);
    cr_assert_eq(keys[2], -1, "nothing written past max");
    cr_assert_null(gw_registry_get(r, 103), "all five are gone");
    cr_assert_eq(gw_registry_remove(r, "m", 0, NULL, 0), 0);
    gw_registry_free(r);
}

/* ---- reference counting ---------------------------------------------------- */

Test(registry, an_entry_a_request_holds_survives_an_update)
{
    gw_registry_t *r = gw_registry_new();
    gw_registry_put(r, model(1, "resnet", 1, "profiling"));
    gw_model_t *held = gw_registry_find(r, "resnet", 6, 0);
    cr_assert_eq(atomic_load(&held->refs), 2, "the registry's and the request's");
    gw_registry_put(r, model(1, "resnet", 1, "ready"));
    /* The request keeps the entry it started with, intact. */
    cr_assert_eq(atomic_load(&held->refs), 1);
    cr_assert_str_eq(held->status, "profiling");
    cr_assert_str_eq(gw_model_label(held, 1, (char[8]){0}, 8), "dog");
    gw_model_t *now = gw_registry_find(r, "resnet", 6, 0);
    cr_assert_neq(now, held);
    cr_assert_str_eq(now->status, "ready");
    gw_model_unref(now);
    gw_model_unref(held); /* frees it (ASan sees a use after free otherwise) */
    gw_registry_free(r);
}

Test(registry, an_entry_a_request_holds_survives_its_removal_and_the_registry)
{
    gw_registry_t *r = gw_registry_new();
    gw_registry_put(r, model(1, "resnet", 1, "ready"));
    gw_model_t *held = gw_registry_get(r, 1);
    gw_model_t *held2 = gw_registry_find(r, "resnet", 6, 1);
    cr_assert_eq(held, held2);
    cr_assert_eq(atomic_load(&held->refs), 3);
    int64_t key;
    cr_assert_eq(gw_registry_remove(r, "resnet", 0, &key, 1), 1);
    cr_assert_eq(atomic_load(&held->refs), 2);
    gw_registry_free(r);
    cr_assert_eq(atomic_load(&held->refs), 2, "the registry no longer held it");
    cr_assert_str_eq(held->name, "resnet");
    gw_model_unref(held2);
    gw_model_unref(held);
    gw_model_unref(NULL);
}

Test(registry, a_reference_taken_with_ref_is_released_by_unref)
{
    gw_model_t *m = model(1, "x", 1, "ready");
    gw_model_ref(m);
    cr_assert_eq(atomic_load(&m->refs), 2);
    gw_model_unref(m);
    cr_assert_eq(atomic_load(&m->refs), 1);
    cr_assert_str_eq(m->name, "x");
    gw_model_unref(m);
}

/* ---- which version takes unversioned requests ------------------------------ */

Test(registry, a_newer_version_takes_unversioned_requests_once_ready)
{
    gw_registry_t *r = gw_registry_new();
    gw_registry_put(r, model(1, "m", 1, "ready"));
    gw_registry_put(r, model(2, "m", 2, "profiling"));
    cr_assert_eq(served_version(r, "m"), 1, "a version still profiling takes no traffic");
    gw_registry_put(r, model(2, "m", 2, "ready"));
    cr_assert_eq(served_version(r, "m"), 2);
    gw_registry_free(r);
}

Test(registry, a_failed_newer_version_never_takes_the_traffic_of_a_ready_one)
{
    gw_registry_t *r = gw_registry_new();
    gw_registry_put(r, model(1, "m", 1, "ready"));
    gw_registry_put(r, model(3, "m", 3, "failed"));
    gw_registry_put(r, model(2, "m", 2, "profiling"));
    cr_assert_eq(served_version(r, "m"), 1);
    gw_registry_free(r);
}

Test(registry, with_none_ready_the_newest_answers_with_its_state)
{
    gw_registry_t *r = gw_registry_new();
    gw_registry_put(r, model(1, "m", 1, "failed"));
    gw_registry_put(r, model(2, "m", 2, "profiling"));
    gw_model_t *m = gw_registry_find(r, "m", 1, 0);
    cr_assert_eq(m->version, 2, "the newest served: its state is the answer");
    cr_assert_str_eq(m->status, "profiling");
    gw_model_unref(m);
    gw_registry_free(r);
}

Test(registry, an_explicit_version_is_found_whatever_its_state_or_policy)
{
    gw_registry_t *r = gw_registry_new();
    gw_registry_put(r, model(1, "m", 1, "failed"));
    gw_registry_put(r, model_policy(2, "m", 2, "ready", "{\"specific\": {\"versions\": [2]}}"));
    gw_model_t *m = gw_registry_find(r, "m", 1, 1);
    cr_assert_not_null(m);
    cr_assert_str_eq(m->status, "failed");
    char why[256] = "";
    cr_assert_not(gw_registry_served(r, m, why, sizeof(why)), "found, but not served");
    gw_model_unref(m);
    gw_registry_free(r);
}

/* ---- version policies ------------------------------------------------------ */

Test(registry, without_a_policy_every_version_is_served)
{
    gw_registry_t *r = gw_registry_new();
    for (int v = 1; v <= 3; v++)
        gw_registry_put(r, model(v, "m", v, v == 2 ? "profiling" : "ready"));
    char why[256] = "untouched";
    for (int v = 1; v <= 3; v++)
        cr_assert(is_served(r, "m", v, why, sizeof(why)), "version %d", v);
    cr_assert_str_eq(why, "untouched", "why is written only when not served");
    cr_assert_eq(served_version(r, "m"), 3);
    gw_registry_free(r);
}

Test(registry, latest_n_serves_the_newest_n_ready_versions)
{
    gw_registry_t *r = gw_registry_new();
    const char *latest2 = "{\"latest\": {\"num_versions\": 2}}";
    gw_registry_put(r, model_policy(1, "m", 1, "ready", latest2));
    gw_registry_put(r, model_policy(2, "m", 2, "ready", latest2));
    gw_registry_put(r, model_policy(3, "m", 3, "ready", latest2));
    gw_registry_put(r, model_policy(4, "m", 4, "profiling", latest2));
    char why[256] = "";
    /* Ready 1, 2, 3: the latest two ready are 3 and 2; 4, profiling, does
     * not count and is not served. */
    cr_assert(is_served(r, "m", 3, why, sizeof(why)));
    cr_assert(is_served(r, "m", 2, why, sizeof(why)));
    cr_assert_not(is_served(r, "m", 1, why, sizeof(why)));
    cr_assert_str_eq(why,
                     "version 1 of model m is not served: its version_policy serves the latest "
                     "2 ready");
    cr_assert_not(is_served(r, "m", 4, why, sizeof(why)), "not ready: not among the latest");
    cr_assert_eq(served_version(r, "m"), 3);
    /* 4 becomes ready: 2 drops out. */
    gw_registry_put(r, model_policy(4, "m", 4, "ready", latest2));
    cr_assert_not(is_served(r, "m", 2, why, sizeof(why)));
    cr_assert(is_served(r, "m", 3, why, sizeof(why)));
    cr_assert_eq(served_version(r, "m"), 4);
    gw_registry_free(r);
}

Test(registry, specific_serves_only_the_listed_versions)
{
    gw_registry_t *r = gw_registry_new();
    const char *spec = "{\"specific\": {\"versions\": [1, 3]}}";
    for (int v = 1; v <= 4; v++)
        gw_registry_put(r, model_policy(v, "m", v, "ready", spec));
    char why[256] = "";
    cr_assert(is_served(r, "m", 1, why, sizeof(why)));
    cr_assert_not(is_served(r, "m", 2, why, sizeof(why)));
    cr_assert_str_eq(why, "version 2 of model m is not served: its version_policy serves "
                          "versions 1, 3");
    cr_assert(is_served(r, "m", 3, why, sizeof(why)));
    cr_assert_not(is_served(r, "m", 4, why, sizeof(why)));
    cr_assert_eq(served_version(r, "m"), 3, "the newest listed, not the newest");
    gw_registry_free(r);
}

Test(registry, a_listed_version_still_profiling_is_served_but_ready_ones_go_first)
{
    gw_registry_t *r = gw_registry_new();
    const char *spec = "{\"specific\": {\"versions\": [1, 2]}}";
    gw_registry_put(r, model_policy(1, "m", 1, "ready", spec));
    gw_registry_put(r, model_policy(2, "m", 2, "profiling", spec));
    cr_assert(is_served(r, "m", 2, NULL, 0));
    cr_assert_eq(served_version(r, "m"), 1);
    gw_registry_free(r);
}

Test(registry, the_newest_versions_policy_applies_to_every_version)
{
    gw_registry_t *r = gw_registry_new();
    /* Version 1 asked for all; version 2, the newest, for itself only. */
    gw_registry_put(r, model_policy(1, "m", 1, "ready", "{\"all\": {}}"));
    gw_registry_put(r, model_policy(2, "m", 2, "profiling", "{\"specific\": {\"versions\": [2]}}"));
    cr_assert_not(is_served(r, "m", 1, NULL, 0), "the newest's policy, even while it profiles");
    gw_model_t *m = gw_registry_find(r, "m", 1, 0);
    cr_assert_eq(m->version, 2, "the only served version, though not ready");
    gw_model_unref(m);
    /* Removing the newest brings the older policy back. */
    int64_t key;
    cr_assert_eq(gw_registry_remove(r, "m", 2, &key, 1), 1);
    cr_assert(is_served(r, "m", 1, NULL, 0));
    cr_assert_eq(served_version(r, "m"), 1);
    gw_registry_free(r);
}

Test(registry, a_newest_version_without_a_policy_serves_all)
{
    gw_registry_t *r = gw_registry_new();
    gw_registry_put(r, model_policy(1, "m", 1, "ready", "{\"specific\": {\"versions\": [9]}}"));
    cr_assert_not(is_served(r, "m", 1, NULL, 0));
    gw_registry_put(r, model(2, "m", 2, "profiling"));
    cr_assert(is_served(r, "m", 1, NULL, 0), "the newest gave none: all");
    cr_assert_eq(served_version(r, "m"), 1);
    gw_registry_free(r);
}

Test(registry, with_no_version_served_the_newest_answers_and_served_says_why)
{
    gw_registry_t *r = gw_registry_new();
    const char *spec = "{\"specific\": {\"versions\": [5]}}";
    gw_registry_put(r, model_policy(1, "m", 1, "ready", spec));
    gw_registry_put(r, model_policy(2, "m", 2, "ready", spec));
    gw_model_t *m = gw_registry_find(r, "m", 1, 0);
    cr_assert_not_null(m);
    cr_assert_eq(m->version, 2);
    char why[256] = "";
    cr_assert_not(gw_registry_served(r, m, why, sizeof(why)));
    cr_assert_str_eq(why,
                     "version 2 of model m is not served: its version_policy serves versions 5");
    gw_model_unref(m);
    gw_registry_free(r);
}

Test(registry, policies_of_other_names_do_not_mix)
{
    gw_registry_t *r = gw_registry_new();
    gw_registry_put(r, model(1, "a", 1, "ready"));
    gw_registry_put(r, model(2, "a", 2, "ready"));
    gw_registry_put(r, model_policy(3, "ab", 9, "ready", "{\"latest\": {\"num_versions\": 1}}"));
    cr_assert(is_served(r, "a", 1, NULL, 0), "ab's policy is not a's");
    gw_registry_free(r);
}
