/* modeldb/models.c, models_read.c and not_on.c: models, their ids and
 * files, the kinds a model is not on, failing reads; on sqlite and (the
 * _pg test, SQUISH_TEST_PG) on PostgreSQL. The plans and group profiles
 * are in test_plans.c, the precision records in test_precision.c. */
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

TestSuite(model_ids, .init = setup, .fini = teardown);

/* An emulated model version with these labels and config (NULL: none, and
 * {"name": name}), returning its id. */
static int64_t insert_emulated_with(const char *name, const char *sha, json_t *labels,
                                    json_t *config)
{
    json_t *input = json_pack("{s:s, s:s, s:[i,i,i,i]}", "name", "input", "datatype", "FP32",
                              "shape", -1, 3, 4, 4);
    json_t *outputs =
        json_pack("[{s:s, s:s, s:[i,i]}]", "name", "logits", "datatype", "FP32", "shape", -1, 3);
    json_t *pre = json_object();
    json_t *no_labels = json_array();
    json_t *own_config = json_pack("{s:s}", "name", name);
    mdb_new_model_t m = {.name = name,
                         .version = 1,
                         .format = "emulated",
                         .sha256 = sha,
                         .input = input,
                         .outputs = outputs,
                         .preprocess = pre,
                         .labels = labels != NULL ? labels : no_labels,
                         .config = config != NULL ? config : own_config,
                         .default_slo_ms = 100,
                         .max_batch = 4,
                         .status = "ready"};
    int64_t id = -1;
    cr_assert_eq(mdb_model_insert(db, &m, &id), 0, "%s", mdb_errmsg(db));
    json_decref(input);
    json_decref(outputs);
    json_decref(pre);
    json_decref(no_labels);
    json_decref(own_config);
    return id;
}

static int64_t insert_emulated_sha(const char *name, const char *sha)
{
    return insert_emulated_with(name, sha, NULL, NULL);
}

static int64_t insert_emulated(const char *name)
{
    return insert_emulated_sha(name, "00");
}

/* The records the gateway builds its registry from carry every label and
 * the version policy the upload's config gave. */
Test(model_ids, records_carry_the_labels_and_the_version_policy)
{
    json_t *labels = json_pack("[s, s, s]", "cat", "dog", "eel");
    json_t *config = json_pack("{s:s, s:{s:{s:i}}}", "name", "vp", "version_policy", "latest",
                               "num_versions", 2);
    int64_t id = insert_emulated_with("vp", "ab", labels, config);
    json_t *out;
    cr_assert_eq(mdb_model_records(db, id, &out), 0, "%s", mdb_errmsg(db));
    json_t *r = json_array_get(out, 0);
    cr_assert(json_equal(json_object_get(r, "labels"), labels), "the labels array");
    cr_assert(json_equal(json_object_get(r, "version_policy"),
                         json_object_get(config, "version_policy")));
    json_decref(out);
    cr_assert_eq(mdb_model_version_get(db, "vp", 1, &out), 0);
    cr_assert(json_equal(json_object_get(out, "version_policy"),
                         json_object_get(config, "version_policy")));
    cr_assert_eq(json_integer_value(json_object_get(out, "labels_count")), 3);
    json_decref(out);
    json_decref(labels);
    json_decref(config);
}

/* A group profile goes with the last model holding one of its members'
 * files; the others stay. */
Test(model_ids, group_profiles_go_with_their_members)
{
    mdb_profile_row_t row = {.batch = 1, .mean_us = 100, .std_us = 1, .peak_memory_bytes = 1};
    insert_emulated_sha("a", "aa");
    insert_emulated_sha("b", "bb");
    insert_emulated_sha("c", "cc");
    insert_emulated_sha("c2", "cc"); /* the same file under another name */
    cr_assert_eq(mdb_group_profile_store(db, "ab", "aa bb", "cpu", "cpu", &row, 1), 0);
    cr_assert_eq(mdb_group_profile_store(db, "bc", "bb cc", "cpu", "cpu", &row, 1), 0);
    cr_assert_eq(mdb_group_profile_store(db, "ac", "aa cc", "cpu", "cpu", &row, 1), 0);
    mdb_profile_row_t *got = NULL;
    int n = 0, deleted = 0;
    cr_assert_eq(mdb_model_delete(db, "c", 0, &deleted), 0);
    cr_assert_eq(mdb_group_profile_get(db, "bc", "cpu", &got, &n), 0, "c2 still holds cc");
    free(got);
    cr_assert_eq(mdb_model_delete(db, "a", 0, &deleted), 0);
    cr_assert_eq(mdb_group_profile_get(db, "ab", "cpu", &got, &n), SQ_NOT_FOUND);
    cr_assert_eq(mdb_group_profile_get(db, "ac", "cpu", &got, &n), SQ_NOT_FOUND);
    cr_assert_eq(mdb_group_profile_get(db, "bc", "cpu", &got, &n), 0);
    free(got);
    cr_assert_eq(mdb_model_delete(db, "c2", 0, &deleted), 0);
    cr_assert_eq(mdb_group_profile_get(db, "bc", "cpu", &got, &n), SQ_NOT_FOUND);
}

/* The id is the key squishd and the workers name a model by: a deleted
 * model's id handed to the next upload met the deleted model's late load
 * answer (the worker ran the wrong graph for the new model). */
Test(model_ids, a_deleted_models_id_is_never_handed_out_again)
{
    int deleted = 0;
    int64_t a = insert_emulated("a");
    cr_assert_eq(mdb_model_delete(db, "a", 0, &deleted), 0);
    int64_t b = insert_emulated("b");
    cr_assert_gt(b, a, "b=%lld a=%lld", (long long)b, (long long)a);
    cr_assert_eq(mdb_model_delete(db, "b", 0, &deleted), 0);
    /* Nor after a reopen. */
    mdb_close(db);
    cr_assert_eq(mdb_open(t.target, &db), 0, "%s", mdb_errmsg(db));
    int64_t c = insert_emulated("c");
    cr_assert_gt(c, b, "c=%lld b=%lld", (long long)c, (long long)b);
}

/* A profile measured for a model deleted meanwhile (the worker's answer
 * and the delete cross on the way to the DB thread) is not stored: no
 * foreign-key failure, a code that says why, and no transaction left open. */
Test(model_ids, a_profile_for_a_deleted_model_is_not_stored)
{
    mdb_profile_row_t row = {.batch = 1, .mean_us = 100, .std_us = 1, .peak_memory_bytes = 1};
    int deleted = 0;
    int64_t a = insert_emulated("a");
    cr_assert_eq(mdb_profile_store(db, a, "cpu", "cpu", &row, 1, "ready", NULL, NULL), 0, "%s",
                 mdb_errmsg(db));
    cr_assert_eq(mdb_model_delete(db, "a", 0, &deleted), 0);
    cr_assert_eq(mdb_profile_store(db, a, "cpu", "cpu", &row, 1, "ready", NULL, NULL),
                 SQ_MODEL_NOT_FOUND, "%s", mdb_errmsg(db));
    cr_assert(strstr(mdb_errmsg(db), "deleted") != NULL, "%s", mdb_errmsg(db));
    int64_t b = insert_emulated("b");
    cr_assert_eq(mdb_profile_store(db, b, "cpu", "cpu", &row, 1, "ready", NULL, NULL), 0, "%s",
                 mdb_errmsg(db));
}

/* Model control: a name's versions unloaded (and its records say
 * so) and loaded again; the measured status stays what it was. */
Test(model_ids, every_version_of_a_name_is_unloaded_and_loaded_again)
{
    insert_emulated("a");
    int64_t b1 = insert_emulated("b");
    int n = -1;
    cr_assert_eq(mdb_model_set_unloaded(db, "b", 1, &n), 0, "%s", mdb_errmsg(db));
    cr_assert_eq(n, 1);
    cr_assert_eq(mdb_model_set_unloaded(db, "zz", 1, NULL), SQ_MODEL_NOT_FOUND);
    json_t *recs;
    cr_assert_eq(mdb_model_records(db, 0, &recs), 0, "%s", mdb_errmsg(db));
    size_t i;
    json_t *r;
    int seen = 0;
    json_array_foreach(recs, i, r)
    {
        int is_b = strcmp(json_string_value(json_object_get(r, "name")), "b") == 0;
        cr_assert_eq(json_is_true(json_object_get(r, "unloaded")), is_b);
        cr_assert_str_eq(json_string_value(json_object_get(r, "status")), "ready");
        seen += is_b && json_integer_value(json_object_get(r, "id")) == b1;
    }
    cr_assert_eq(seen, 1);
    json_decref(recs);
    cr_assert_eq(mdb_model_set_unloaded(db, "b", 0, &n), 0, "%s", mdb_errmsg(db));
    cr_assert_eq(mdb_model_records(db, b1, &recs), 0, "%s", mdb_errmsg(db));
    cr_assert_null(json_object_get(json_array_get(recs, 0), "unloaded"));
    json_decref(recs);
}

/* A schema-2 file, whose highest models went with their deletes: the
 * migration starts after every id its stored plans still name. */
Test(model_ids, a_migrated_database_starts_after_every_id_it_knows)
{
    int64_t a = insert_emulated("a");
    mdb_close(db);
    /* Back to schema 2; on PostgreSQL with the id sequence reset too. */
    char sql[1024], err[512];
    snprintf(sql, sizeof(sql),
             "%s%s"
             "DROP TABLE profile_precision;"
             "ALTER TABLE models DROP COLUMN precision_asked;"
             "DROP TABLE pipelines;"
             "ALTER TABLE models DROP COLUMN unloaded;"
             "ALTER TABLE group_profiles DROP COLUMN member_shas;"
             "UPDATE schema_version SET version = 2;"
             "INSERT INTO plans VALUES (5, 0, 'x', '{}');"
             "INSERT INTO placements (epoch, device, model_id, slo_ms, batch, duty_cycle_us, "
             "rate_rps) VALUES (5, 'emu:0', %lld, 100, 4, 1000, 10);",
             undo_model_files(),
             t.pg ? "SELECT setval('models_id_seq', 1, false);"
                  : "DROP TRIGGER models_id_seq; DROP TABLE model_id_seq;",
             (long long)a + 7);
    cr_assert_eq(test_db_exec(&t, sql, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(mdb_open(t.target, &db), 0, "%s", mdb_errmsg(db));
    cr_assert_eq(mdb_schema_version(db), MDB_SCHEMA_VERSION);
    int64_t b = insert_emulated("b");
    cr_assert_eq(b, a + 8, "b=%lld a=%lld", (long long)b, (long long)a);
}

/* An ONNX model version whose file is the spans' bytes in order (not a
 * graph: the database stores what it is given; sha: of all of them), named
 * name, with the device kinds that cannot run it (not_on; NULL: none). */
static int64_t insert_spans_model(const char *name, const mdb_span_t *spans, int n, const char *sha,
                                  json_t *not_on)
{
    json_t *input =
        json_pack("{s:s, s:s, s:[i,i,i,i]}", "name", "x", "datatype", "FP32", "shape", -1, 3, 4, 4);
    json_t *outputs =
        json_pack("[{s:s, s:s, s:[i,i]}]", "name", "y", "datatype", "FP32", "shape", -1, 3);
    json_t *pre = json_object(), *labels = json_array(), *config = json_object();
    mdb_new_model_t m = {.name = name,
                         .version = 1,
                         .format = "onnx",
                         .onnx_spans = spans,
                         .n_onnx_spans = n,
                         .sha256 = sha,
                         .input = input,
                         .outputs = outputs,
                         .preprocess = pre,
                         .labels = labels,
                         .config = config,
                         .not_on = not_on,
                         .default_slo_ms = 100,
                         .max_batch = 4,
                         .status = "ready"};
    int64_t id = 0;
    cr_assert_eq(mdb_model_insert(db, &m, &id), 0, "%s", mdb_errmsg(db));
    json_decref(input);
    json_decref(outputs);
    json_decref(pre);
    json_decref(labels);
    json_decref(config);
    return id;
}

/* The same, of `len` bytes of one file. */
static int64_t insert_file_model(const char *name, const uint8_t *file, size_t len, json_t *not_on)
{
    char sha[65];
    mdb_sha256_hex(file, len, sha);
    return insert_spans_model(name, (const mdb_span_t[]){{file, len}}, 1, sha, not_on);
}

static uint8_t *file_bytes(size_t len)
{
    uint8_t *file = malloc(len);
    cr_assert_not_null(file);
    for (size_t i = 0; i < len; i++)
        file[i] = (uint8_t)(i * 2654435761u >> 11);
    return file;
}

/* A model file comes back byte for byte: zeros, every byte value, a size
 * that is no power of two (PostgreSQL: a binary parameter and a binary
 * result, no text encoding on the way). */
Test(model_ids, a_model_file_comes_back_byte_for_byte)
{
    size_t len = 24 * 1000 * 1000 + 3;
    uint8_t *file = malloc(len);
    cr_assert_not_null(file);
    for (size_t i = 0; i < len; i++)
        file[i] = i % 7 == 0 ? 0 : (uint8_t)(i * 2654435761u >> 13);
    int64_t id = insert_file_model("file", file, len, NULL);
    void *back = NULL;
    size_t back_len = 0;
    cr_assert_eq(mdb_model_blob(db, id, &back, &back_len), 0, "%s", mdb_errmsg(db));
    cr_assert_eq(back_len, len);
    cr_assert(memcmp(back, file, len) == 0, "the bytes differ");
    free(back);
    /* An emulated model has no file. */
    int64_t emu = insert_emulated("emu");
    cr_assert_eq(mdb_model_blob(db, emu, &back, &back_len), SQ_NOT_FOUND);
    free(file);
}

static int64_t count_chunks(void)
{
    mdb_q_t *q = mdb_q(db, "SELECT COUNT(*) FROM model_file_chunks");
    cr_assert_eq(mdb_q_step(q, "count"), 1, "%s", mdb_errmsg(db));
    int64_t n = mdb_q_int64_at(q, 0);
    mdb_q_reset(q);
    return n;
}

/* A file stored in pieces of db->file_chunk_bytes (MDB_FILE_CHUNK_BYTES,
 * 256 MiB, in squishd: one blob is at most 1e9 bytes in sqlite, 1 GB in
 * PostgreSQL) comes back whole, from spans cut anywhere, after the DB is
 * opened again (a restart), and its pieces go with the model. */
Test(model_ids, a_file_past_the_chunk_size_is_stored_in_pieces_and_read_back_whole)
{
    cr_assert_geq(MDB_FILE_CHUNK_BYTES, (size_t)64 << 20);
    cr_assert_lt(MDB_FILE_CHUNK_BYTES, (size_t)1000 * 1000 * 1000, "under SQLITE_MAX_LENGTH");
    size_t len = 100003;
    uint8_t *file = file_bytes(len);
    db->file_chunk_bytes = 4096;
    /* Spans as an upload's bundle gives them: a small table, then parts. */
    mdb_span_t spans[] = {{file, 37},
                          {file + 37, 4096 * 3},
                          {file + 37 + 4096 * 3, 0},
                          {file + 37 + 4096 * 3, len - 37 - 4096 * 3}};
    char sha[65];
    mdb_sha256_hex(file, len, sha);
    int64_t id = insert_spans_model("pieces", spans, 4, sha, NULL);
    /* 37 | 4096 x 3 | 4096 x 21 + 1662: 26 rows, the first in model_files. */
    cr_assert_eq(count_chunks(), 25);
    mdb_close(db);
    cr_assert_eq(mdb_open(t.target, &db), 0, "%s", mdb_errmsg(db));
    cr_assert_eq(db->file_chunk_bytes, MDB_FILE_CHUNK_BYTES);
    void *back = NULL;
    size_t back_len = 0;
    cr_assert_eq(mdb_model_blob(db, id, &back, &back_len), 0, "%s", mdb_errmsg(db));
    cr_assert_eq(back_len, len);
    cr_assert(memcmp(back, file, len) == 0, "the bytes differ");
    free(back);
    int deleted = 0;
    cr_assert_eq(mdb_model_delete(db, "pieces", 1, &deleted), 0, "%s", mdb_errmsg(db));
    cr_assert_eq(count_chunks(), 0, "the pieces go with the model");
    free(file);
}

/* Reading a model's record (a readiness probe, GET /models/{m}, the list)
 * does not read its file: the bug stored the file in the models row before
 * status and the rest, and sqlite walked its whole overflow chain (24 MB:
 * about 6000 pages) to reach them on every read; 6.4 ms of squishd's CPU
 * per readiness probe of a 14 MB model, whose 50 probes a second doubled
 * the profile measured beside them. Counted in pages sqlite read from the
 * file (its cache holds 2 MB); PostgreSQL keeps large values out of line
 * and is only checked for the answers. */
Test(model_ids, reading_a_models_record_does_not_read_its_file)
{
    size_t len = 24 * 1000 * 1000;
    uint8_t *file = file_bytes(len);
    insert_file_model("big", file, len, NULL);
    free(file);
    /* A fresh connection: nothing of the file in its cache. */
    mdb_close(db);
    cr_assert_eq(mdb_open(t.target, &db), 0, "%s", mdb_errmsg(db));
    int cur = 0, hi = 0;
    if (!t.pg)
        sqlite3_db_status(db->conn, SQLITE_DBSTATUS_CACHE_MISS, &cur, &hi, 1);
    for (int i = 0; i < 3; i++) {
        json_t *r;
        cr_assert_eq(mdb_model_version_get(db, "big", 1, &r), 0, "%s", mdb_errmsg(db));
        cr_assert_str_eq(json_string_value(json_object_get(r, "status")), "ready");
        json_decref(r);
        cr_assert_eq(mdb_model_get(db, "big", &r), 0, "%s", mdb_errmsg(db));
        json_decref(r);
        cr_assert_eq(mdb_model_list(db, &r), 0, "%s", mdb_errmsg(db));
        cr_assert_eq(json_array_size(json_object_get(r, "models")), 1);
        json_decref(r);
    }
    if (!t.pg) {
        sqlite3_db_status(db->conn, SQLITE_DBSTATUS_CACHE_MISS, &cur, &hi, 0);
        cr_assert_lt(cur, 200, "9 reads of the record read %d pages of the database", cur);
    }
}

/* A database of schema 6 kept each model's file in its models row: opened
 * by this build, the files move to model_files and come back byte for
 * byte, an emulated model still has none, and a deleted model's file goes
 * with it. */
Test(model_ids, a_migrated_database_keeps_every_model_file)
{
    size_t len = 3 * 1000 * 1000 + 7;
    uint8_t *file = file_bytes(len);
    int64_t id = insert_file_model("old", file, len, NULL);
    int64_t emu = insert_emulated("emu");
    mdb_close(db);
    char sql[1024], err[512];
    snprintf(sql, sizeof(sql), "%sUPDATE schema_version SET version = 6;", undo_model_files());
    cr_assert_eq(test_db_exec(&t, sql, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(mdb_open(t.target, &db), 0, "%s", mdb_errmsg(db));
    cr_assert_eq(mdb_schema_version(db), MDB_SCHEMA_VERSION);
    void *back = NULL;
    size_t back_len = 0;
    cr_assert_eq(mdb_model_blob(db, id, &back, &back_len), 0, "%s", mdb_errmsg(db));
    cr_assert_eq(back_len, len);
    cr_assert(memcmp(back, file, len) == 0, "the bytes differ");
    free(back);
    cr_assert_eq(mdb_model_blob(db, emu, &back, &back_len), SQ_NOT_FOUND);
    cr_assert_eq(test_db_exec(&t, "SELECT onnx FROM models", err, sizeof(err)), -1,
                 "the models table has no file column after the migration");
    int deleted = 0;
    cr_assert_eq(mdb_model_delete(db, "old", 1, &deleted), 0, "%s", mdb_errmsg(db));
    cr_assert_eq(deleted, 1);
    cr_assert_eq(mdb_model_blob(db, id, &back, &back_len), SQ_MODEL_NOT_FOUND);
    cr_assert_eq(test_db_exec(&t, "SELECT 1 FROM model_files", err, sizeof(err)), 0, "%s", err);
    free(file);
}

/* The device kinds that cannot run a model: given at upload, added when a
 * worker refuses its load (the reason replaced for a kind said twice), in
 * every record read, and gone with the model. */
Test(model_ids, a_models_not_on_kinds_are_stored_with_their_reasons)
{
    json_t *not_on = json_pack("{s:s}", "cuda", "Conv node 'c1': convolution with asymmetric pads");
    uint8_t file[16] = {1, 2, 3};
    int64_t id = insert_file_model("pads", file, sizeof(file), not_on);
    json_t *r;
    cr_assert_eq(mdb_model_version_get(db, "pads", 1, &r), 0, "%s", mdb_errmsg(db));
    cr_assert(json_equal(json_object_get(r, "not_on"), not_on), "the upload's not_on comes back");
    json_decref(r);
    cr_assert_eq(mdb_model_set_not_on(db, id, "cuda", "cuda worker 1 refused the load: x"), 0, "%s",
                 mdb_errmsg(db));
    cr_assert_eq(mdb_model_set_not_on(db, id, "emu", "emu runs emulated models only"), 0, "%s",
                 mdb_errmsg(db));
    cr_assert_eq(mdb_model_records(db, id, &r), 0, "%s", mdb_errmsg(db));
    json_t *got = json_object_get(json_array_get(r, 0), "not_on");
    cr_assert_eq(json_object_size(got), 2);
    cr_assert_str_eq(json_string_value(json_object_get(got, "cuda")),
                     "cuda worker 1 refused the load: x");
    json_decref(r);
    cr_assert_eq(mdb_model_set_not_on(db, id + 100, "cuda", "x"), SQ_MODEL_NOT_FOUND);
    int deleted = 0;
    cr_assert_eq(mdb_model_delete(db, "pads", 0, &deleted), 0, "%s", mdb_errmsg(db));
    char err[512], out[64];
    if (t.pg) {
        test_db_query(&t, "SELECT count(*) FROM model_not_on", out, sizeof(out));
        cr_assert_str_eq(out, "0", "the rows go with their model");
    } else {
        cr_assert_eq(test_db_exec(&t, "SELECT 1 FROM model_not_on", err, sizeof(err)), 0, "%s",
                     err);
    }
    /* A model stored without any has an empty object. */
    insert_emulated("plain");
    cr_assert_eq(mdb_model_version_get(db, "plain", 1, &r), 0, "%s", mdb_errmsg(db));
    cr_assert(json_is_object(json_object_get(r, "not_on")) &&
              json_object_size(json_object_get(r, "not_on")) == 0);
    json_decref(r);
    json_decref(not_on);
}

/* Several writers (squishd processes sharing one database) store the same
 * (name, version) at once: one stores it, the others are told it exists;
 * distinct versions all get distinct ids. */
typedef struct {
    const char *target;
    int version;
    int rc;
    int64_t id;
    char err[512];
} racer_t;

static void *race_insert(void *arg)
{
    racer_t *r = arg;
    mdb_t *h;
    r->rc = mdb_open(r->target, &h);
    if (r->rc == 0) {
        json_t *input =
            json_pack("{s:s, s:s, s:[i,i]}", "name", "x", "datatype", "FP32", "shape", -1, 3);
        json_t *outputs = json_array(), *pre = json_object(), *labels = json_array();
        json_t *config = json_object();
        mdb_new_model_t m = {.name = "raced",
                             .version = r->version,
                             .format = "emulated",
                             .sha256 = "00",
                             .input = input,
                             .outputs = outputs,
                             .preprocess = pre,
                             .labels = labels,
                             .config = config,
                             .default_slo_ms = 100,
                             .max_batch = 4,
                             .status = "ready"};
        r->rc = mdb_model_insert(h, &m, &r->id);
        json_decref(input);
        json_decref(outputs);
        json_decref(pre);
        json_decref(labels);
        json_decref(config);
    }
    snprintf(r->err, sizeof(r->err), "%s", mdb_errmsg(h));
    mdb_close(h);
    return NULL;
}

Test(model_ids, concurrent_writers_store_a_version_once)
{
    enum { N = 6 };
    racer_t r[N];
    pthread_t th[N];
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < N; i++) {
            /* round 0: all the same version; round 1: each its own. */
            r[i] = (racer_t){.target = t.target, .version = round == 0 ? 1 : 10 + i};
            cr_assert_eq(pthread_create(&th[i], NULL, race_insert, &r[i]), 0);
        }
        int stored = 0;
        for (int i = 0; i < N; i++) {
            pthread_join(th[i], NULL);
            if (r[i].rc == 0)
                stored++;
            else
                cr_assert_eq(r[i].rc, round == 0 ? SQ_EXISTS : 0, "racer %d: %d %s", i, r[i].rc,
                             r[i].err);
        }
        cr_assert_eq(stored, round == 0 ? 1 : N);
        for (int i = 0; i < N; i++)
            for (int j = 0; j < i; j++)
                cr_assert(r[i].rc != 0 || r[j].rc != 0 || r[i].id != r[j].id, "one id twice");
    }
    json_t *out;
    cr_assert_eq(mdb_model_get(db, "raced", &out), 0, "%s", mdb_errmsg(db));
    cr_assert_eq(json_array_size(json_object_get(out, "versions")), 1 + N);
    json_decref(out);
}

Test(sha256, a_file_hashed_in_pieces_has_the_digest_of_the_whole)
{
    size_t len = 3 * 1000 * 1000 + 17;
    uint8_t *data = malloc(len);
    for (size_t i = 0; i < len; i++)
        data[i] = (uint8_t)(i * 131 + (i >> 9));
    char whole[65], pieces[65], empty[65];
    mdb_sha256_hex(data, len, whole);
    mdb_sha256_t *h = mdb_sha256_begin();
    for (size_t off = 0, step = 1; off < len; off += step, step = step * 3 + 1)
        mdb_sha256_update(h, data + off, step < len - off ? step : len - off);
    mdb_sha256_end(h, pieces);
    cr_assert_str_eq(pieces, whole);
    h = mdb_sha256_begin();
    mdb_sha256_end(h, empty);
    cr_assert_str_eq(empty, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    mdb_sha256_free(mdb_sha256_begin()); /* an unfinished digest is dropped */
    mdb_sha256_free(NULL);
    free(data);
}

/* ---- a failing database is not a missing model ---------------------------- */

/* Every step of a query fails, as a busy, locked or damaged file would
 * make it (sqlite: SQLITE_INTERRUPT), or a lost server (PostgreSQL: the
 * session is terminated): the reads that used to treat any failed step as
 * "no row" answered 404 for a model that exists. */
static int interrupt_every_step(void *arg)
{
    (void)arg;
    return 1;
}

static const char *fail_every_step(void)
{
    if (t.pg) {
        char sql[256];
        snprintf(sql, sizeof(sql),
                 "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity "
                 "WHERE datname = '%s' AND pid <> pg_backend_pid()",
                 t.dbname);
        pg_admin_exec(t.admin, sql);
        return "connection";
    }
    sqlite3_progress_handler(db->conn, 1, interrupt_every_step, NULL);
    return "interrupt";
}

TestSuite(db_errors, .init = setup, .fini = teardown);

Test(db_errors, a_missing_model_is_not_found_when_the_database_works)
{
    json_t *out = NULL;
    cr_assert_eq(mdb_model_get(db, "nope", &out), SQ_MODEL_NOT_FOUND);
    cr_assert_eq(mdb_model_version_get(db, "nope", 0, &out), SQ_MODEL_NOT_FOUND);
    cr_assert_eq(mdb_model_labels(db, "nope", 0, &out), SQ_MODEL_NOT_FOUND);
    void *bytes = NULL;
    size_t len = 0;
    cr_assert_eq(mdb_model_blob(db, 12345, &bytes, &len), SQ_MODEL_NOT_FOUND);
}

Test(db_errors, reads_of_an_existing_model_that_fail_are_db_errors_not_404)
{
    int64_t id = insert_emulated("here");
    json_t *out = NULL;
    cr_assert_eq(mdb_model_get(db, "here", &out), 0, "%s", mdb_errmsg(db));
    json_decref(out);
    out = NULL;
    const char *why = fail_every_step();
    cr_assert_eq(mdb_model_get(db, "here", &out), SQ_DB);
    cr_assert_not_null(strstr(mdb_errmsg(db), why), "%s", mdb_errmsg(db));
    cr_assert_eq(mdb_model_version_get(db, "here", 1, &out), SQ_DB);
    cr_assert_eq(mdb_model_labels(db, "here", 0, &out), SQ_DB);
    void *bytes = NULL;
    size_t len = 0;
    cr_assert_eq(mdb_model_blob(db, id, &bytes, &len), SQ_DB);
    cr_assert_null(out);
    cr_assert_eq(sq_err_http_status(SQ_DB) / 100, 5, "a db error is a 5xx");
}

Test(db_errors, a_list_or_records_read_that_fails_is_an_error_not_an_empty_list)
{
    insert_emulated("here");
    json_t *out = NULL;
    fail_every_step();
    cr_assert_eq(mdb_model_list(db, &out), SQ_DB);
    cr_assert_eq(mdb_model_records(db, 0, &out), SQ_DB);
    cr_assert_null(out);
}
