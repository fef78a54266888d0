/* The precision records of modeldb/models.c: the precision a model asks
 * for and the one each device kind ran its profile in; on sqlite and (the
 * _pg test, SQUISH_TEST_PG) on PostgreSQL. */
#include "mdb_models_test.h"

#include <criterion/criterion.h>
#include <mdb.h>
#include <mdb_int.h>
#include <sq.h>

#include <math.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* An emulated model version asking for `precision` (NULL: none), with a
 * given profile on emu when profiled. */
static int64_t insert_precision_model(const char *name, const char *precision, int profiled)
{
    json_t *input = json_pack("{s:s, s:s, s:[i,i,i,i]}", "name", "input", "datatype", "FP32",
                              "shape", -1, 3, 4, 4);
    json_t *outputs =
        json_pack("[{s:s, s:s, s:[i,i]}]", "name", "logits", "datatype", "FP32", "shape", -1, 3);
    json_t *pre = json_object(), *labels = json_array();
    json_t *config = precision ? json_pack("{s:s, s:s}", "name", name, "precision", precision)
                               : json_pack("{s:s}", "name", name);
    mdb_profile_row_t row = {.batch = 1, .mean_us = 100, .std_us = 1, .peak_memory_bytes = 1};
    mdb_new_model_t m = {.name = name,
                         .version = 1,
                         .format = "emulated",
                         .sha256 = "ee",
                         .input = input,
                         .outputs = outputs,
                         .preprocess = pre,
                         .labels = labels,
                         .config = config,
                         .precision = precision,
                         .default_slo_ms = 100,
                         .max_batch = 4,
                         .status = profiled ? "ready" : "profiling",
                         .profile = profiled ? &row : NULL,
                         .nprofile = profiled ? 1 : 0,
                         .profile_device_kind = "emu"};
    int64_t id = -1;
    cr_assert_eq(mdb_model_insert(db, &m, &id), 0, "%s", mdb_errmsg(db));
    json_decref(input);
    json_decref(outputs);
    json_decref(pre);
    json_decref(labels);
    json_decref(config);
    return id;
}

/* The record's "precision" of version 1 of name. */
static json_t *precision_of(const char *name)
{
    json_t *r;
    cr_assert_eq(mdb_model_version_get(db, name, 1, &r), 0, "%s", mdb_errmsg(db));
    json_t *p = json_incref(json_object_get(r, "precision"));
    json_decref(r);
    cr_assert(json_is_object(p), "the record has a precision");
    return p;
}

static void assert_device(json_t *p, size_t i, const char *kind, const char *runs, double abs,
                          double rel)
{
    json_t *d = json_array_get(json_object_get(p, "devices"), i);
    cr_assert_not_null(d, "device %zu", i);
    cr_assert_str_eq(json_string_value(json_object_get(d, "device_kind")), kind);
    cr_assert_str_eq(json_string_value(json_object_get(d, "runs")), runs);
    json_t *a = json_object_get(d, "max_abs_deviation"),
           *r = json_object_get(d, "max_rel_deviation");
    if (abs < 0) {
        cr_assert(json_is_null(a) && json_is_null(r), "%s: a deviation not measured is null", kind);
        return;
    }
    cr_assert(json_is_real(a) && json_is_real(r), "%s: deviations are numbers", kind);
    cr_assert_float_eq(json_real_value(a), abs, 1e-12, "%s", kind);
    cr_assert_float_eq(json_real_value(r), rel, 1e-12, "%s", kind);
}

TestSuite(precision, .init = setup, .fini = teardown);

/* The precision a config asks for is stored with the model and comes back
 * in its records, after a reopen too; none asked is fp32. */
Test(precision, the_asked_precision_is_stored_and_survives_a_reopen)
{
    const char *names[] = {"fp32", "tf32", "fp16", "bf16"};
    for (int i = 0; i < 4; i++) {
        char name[16];
        snprintf(name, sizeof(name), "p%d", i);
        insert_precision_model(name, names[i], 0);
    }
    insert_precision_model("none", NULL, 0);
    mdb_close(db);
    cr_assert_eq(mdb_open(t.target, &db), 0, "%s", mdb_errmsg(db));
    for (int i = 0; i < 4; i++) {
        char name[16];
        snprintf(name, sizeof(name), "p%d", i);
        json_t *p = precision_of(name);
        cr_assert_str_eq(json_string_value(json_object_get(p, "asked")), names[i]);
        cr_assert_eq(json_array_size(json_object_get(p, "devices")), 0, "not measured yet");
        json_decref(p);
    }
    json_t *p = precision_of("none");
    cr_assert_str_eq(json_string_value(json_object_get(p, "asked")), "fp32");
    json_decref(p);
    /* The records squishd builds its registry from say it too. */
    json_t *recs;
    cr_assert_eq(mdb_model_records(db, 0, &recs), 0, "%s", mdb_errmsg(db));
    cr_assert_eq(json_array_size(recs), 5);
    json_t *r = json_array_get(recs, 2);
    cr_assert_str_eq(json_string_value(json_object_get(r, "name")), "p2");
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(r, "precision"), "asked")),
                     "fp16");
    cr_assert_eq(json_array_size(json_object_get(r, "labels")), 0, "labels still read after it");
    json_decref(recs);
}

/* What each device kind's measurement found (the precision its plan ran,
 * its deviation from FP32) is stored with its profile, per kind, replaced
 * by the next measurement of that kind, removed by a failed one, survives
 * a reopen and goes with the model. */
Test(precision, each_kinds_precision_run_is_stored_with_its_profile)
{
    mdb_profile_row_t row = {.batch = 1, .mean_us = 100, .std_us = 1, .peak_memory_bytes = 1};
    int64_t id = insert_precision_model("m", "fp16", 0);
    mdb_precision_t cpu = {.runs = "fp32"};
    mdb_precision_t cuda = {
        .runs = "fp16", .max_abs_deviation = 0.0125, .max_rel_deviation = 0.0025};
    cr_assert_eq(mdb_profile_store(db, id, "cuda", "cuda:0", &row, 1, "ready", NULL, &cuda), 0,
                 "%s", mdb_errmsg(db));
    cr_assert_eq(mdb_profile_store(db, id, "cpu", "cpu", &row, 1, "ready", NULL, &cpu), 0, "%s",
                 mdb_errmsg(db));
    mdb_close(db);
    cr_assert_eq(mdb_open(t.target, &db), 0, "%s", mdb_errmsg(db));
    json_t *p = precision_of("m");
    cr_assert_str_eq(json_string_value(json_object_get(p, "asked")), "fp16");
    cr_assert_eq(json_array_size(json_object_get(p, "devices")), 2);
    assert_device(p, 0, "cpu", "fp32", 0, 0);
    assert_device(p, 1, "cuda", "fp16", 0.0125, 0.0025);
    json_decref(p);

    /* Measured again: replaced. Not measured (-1) and overflowing (+inf,
     * NaN) deviations read as null. */
    double odd[] = {-1, INFINITY, NAN};
    for (int i = 0; i < 3; i++) {
        cuda.max_abs_deviation = cuda.max_rel_deviation = odd[i];
        cr_assert_eq(mdb_profile_store(db, id, "cuda", "cuda:0", &row, 1, "ready", NULL, &cuda), 0,
                     "%s", mdb_errmsg(db));
        p = precision_of("m");
        cr_assert_eq(json_array_size(json_object_get(p, "devices")), 2);
        assert_device(p, 1, "cuda", "fp16", -1, -1);
        json_decref(p);
    }
    /* A failed measurement leaves that kind without one. */
    cr_assert_eq(mdb_profile_store(db, id, "cuda", "cuda:0", &row, 0, "failed", "oom", NULL), 0,
                 "%s", mdb_errmsg(db));
    p = precision_of("m");
    cr_assert_eq(json_array_size(json_object_get(p, "devices")), 1);
    assert_device(p, 0, "cpu", "fp32", 0, 0);
    json_decref(p);

    /* A twin (the same file, the same precision) takes them with its
     * profile. */
    int64_t twin = insert_precision_model("twin", "fp16", 0);
    cr_assert_eq(mdb_profile_copy(db, id, twin), 0, "%s", mdb_errmsg(db));
    p = precision_of("twin");
    cr_assert_eq(json_array_size(json_object_get(p, "devices")), 1);
    assert_device(p, 0, "cpu", "fp32", 0, 0);
    json_decref(p);

    /* They go with the model: the twin's row is the one left. */
    int deleted = 0;
    cr_assert_eq(mdb_model_delete(db, "m", 0, &deleted), 0);
    mdb_q_t *q = mdb_q(db, "SELECT count(*), max(model_id) FROM profile_precision");
    cr_assert_eq(mdb_q_step(q, "count"), 1, "%s", mdb_errmsg(db));
    cr_assert_eq(mdb_q_int_at(q, 0), 1);
    cr_assert_eq(mdb_q_int64_at(q, 1), twin);
    mdb_q_reset(q);
}

/* An emulated model's given profile is an emu device's, which runs FP32. */
Test(precision, a_given_profile_runs_fp32_on_emu)
{
    insert_precision_model("e", "bf16", 1);
    json_t *p = precision_of("e");
    cr_assert_str_eq(json_string_value(json_object_get(p, "asked")), "bf16");
    cr_assert_eq(json_array_size(json_object_get(p, "devices")), 1);
    assert_device(p, 0, "emu", "fp32", 0, 0);
    json_decref(p);
}

/* A schema-5 database (no precision): its models asked for fp32 and their
 * measured profiles ran it, deviation 0. */
Test(precision, a_migrated_database_says_its_profiles_ran_fp32)
{
    mdb_profile_row_t row = {.batch = 1, .mean_us = 100, .std_us = 1, .peak_memory_bytes = 1};
    int64_t id = insert_precision_model("old", NULL, 0);
    cr_assert_eq(mdb_profile_store(db, id, "cpu", "cpu", &row, 1, "ready", NULL, NULL), 0, "%s",
                 mdb_errmsg(db));
    mdb_close(db);
    char sql[1024], err[512];
    snprintf(sql, sizeof(sql),
             "%sDROP TABLE profile_precision;"
             "ALTER TABLE models DROP COLUMN precision_asked;"
             "UPDATE schema_version SET version = 5;",
             undo_model_files());
    cr_assert_eq(test_db_exec(&t, sql, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(mdb_open(t.target, &db), 0, "%s", mdb_errmsg(db));
    cr_assert_eq(mdb_schema_version(db), MDB_SCHEMA_VERSION);
    json_t *p = precision_of("old");
    cr_assert_str_eq(json_string_value(json_object_get(p, "asked")), "fp32");
    cr_assert_eq(json_array_size(json_object_get(p, "devices")), 1);
    assert_device(p, 0, "cpu", "fp32", 0, 0);
    json_decref(p);
}
