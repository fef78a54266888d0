/* modeldb/plans.c: plans stored per epoch and read back for squishd's
 * restart, and group profiles; on sqlite and (the _pg test,
 * SQUISH_TEST_PG) on PostgreSQL. */
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

TestSuite(plans, .init = setup, .fini = teardown);

static json_t *placement(const char *device, long long model, double slo, int batch, double duty,
                         double rate)
{
    return json_pack("{s:s, s:I, s:f, s:i, s:f, s:f}", "device", device, "model_id",
                     (json_int_t)model, "slo_ms", slo, "batch", batch, "duty_cycle_us", duty,
                     "rate_rps", rate);
}

Test(plans, an_empty_database_has_no_plan)
{
    long long epoch = -1;
    json_t *plan = NULL, *pl = NULL;
    cr_assert_eq(mdb_plan_last(db, &epoch, &plan, &pl), 0, "%s", mdb_errmsg(db));
    cr_assert_eq(epoch, 0);
    cr_assert_null(plan);
    cr_assert(json_is_array(pl) && json_array_size(pl) == 0);
    json_decref(pl);
    cr_assert_eq(mdb_plan_last_epoch(db), 0);
}

Test(plans, the_newest_epoch_comes_back_with_its_placements_in_order)
{
    json_t *p1 = json_array();
    json_array_append_new(p1, placement("emu:0", 1, 100, 4, 50000, 80));
    cr_assert_eq(mdb_plan_store(db, 7, "new model", "{\"epoch\": 7}", p1), 0, "%s", mdb_errmsg(db));
    json_t *p2 = json_array();
    json_array_append_new(p2, placement("emu:1", 2, 200, 8, 90000, 120.5));
    json_array_append_new(p2, placement("emu:0", 1, 100, 6, 45000, 133.25));
    json_array_append_new(p2, placement("emu:3", 1, 100, 2, 45000, 10));
    cr_assert_eq(mdb_plan_store(db, 8, "rate change", "{\"epoch\": 8, \"reason\": \"x\"}", p2), 0);
    cr_assert_eq(mdb_plan_last_epoch(db), 8);

    long long epoch;
    json_t *plan, *pl;
    cr_assert_eq(mdb_plan_last(db, &epoch, &plan, &pl), 0, "%s", mdb_errmsg(db));
    cr_assert_eq(epoch, 8);
    cr_assert_eq(json_integer_value(json_object_get(plan, "epoch")), 8);
    cr_assert_str_eq(json_string_value(json_object_get(plan, "reason")), "x");
    cr_assert_eq(json_array_size(pl), 3);
    for (size_t i = 0; i < 3; i++) {
        json_t *want = json_array_get(p2, i), *got = json_array_get(pl, i);
        cr_assert(json_equal(want, got), "placement %zu: %s", i, json_dumps(got, 0));
    }
    json_decref(plan);
    json_decref(pl);

    /* Storing an epoch again replaces its placements (INSERT OR REPLACE). */
    json_t *p3 = json_array();
    json_array_append_new(p3, placement("emu:2", 2, 200, 1, 10000, 1));
    cr_assert_eq(mdb_plan_store(db, 8, "again", "{\"epoch\": 8}", p3), 0);
    cr_assert_eq(mdb_plan_last(db, &epoch, &plan, &pl), 0);
    cr_assert_eq(json_array_size(pl), 1);
    cr_assert(json_equal(json_array_get(pl, 0), json_array_get(p3, 0)));
    json_decref(plan);
    json_decref(pl);
    json_decref(p1);
    json_decref(p2);
    json_decref(p3);
}

Test(plans, a_plan_with_no_placements_is_still_the_newest)
{
    json_t *p1 = json_array();
    json_array_append_new(p1, placement("emu:0", 1, 100, 4, 50000, 80));
    cr_assert_eq(mdb_plan_store(db, 1, "new model", "{}", p1), 0);
    json_t *none = json_array();
    cr_assert_eq(mdb_plan_store(db, 2, "worker up", "{}", none), 0);
    long long epoch;
    json_t *plan, *pl;
    cr_assert_eq(mdb_plan_last(db, &epoch, &plan, &pl), 0);
    cr_assert_eq(epoch, 2);
    cr_assert_eq(json_array_size(pl), 0);
    json_decref(plan);
    json_decref(pl);
    json_decref(p1);
    json_decref(none);
}

Test(plans, a_corrupt_plan_row_is_an_error_not_a_crash)
{
    json_t *none = json_array();
    cr_assert_eq(mdb_plan_store(db, 3, "x", "not json", none), 0);
    json_decref(none);
    long long epoch = -1;
    json_t *plan = NULL, *pl = NULL;
    cr_assert_eq(mdb_plan_last(db, &epoch, &plan, &pl), SQ_DB);
    cr_assert_neq(mdb_errmsg(db)[0], '\0');
    cr_assert_null(plan);
    cr_assert_null(pl);
    cr_assert_eq(epoch, 0);
}

Test(plans, the_read_leaves_no_transaction_open)
{
    json_t *p1 = json_array();
    json_array_append_new(p1, placement("emu:0", 1, 100, 4, 50000, 80));
    cr_assert_eq(mdb_plan_store(db, 1, "x", "{}", p1), 0);
    long long epoch;
    json_t *plan, *pl;
    cr_assert_eq(mdb_plan_last(db, &epoch, &plan, &pl), 0);
    cr_assert_eq(mdb_plan_last_epoch(db), 1);
    json_decref(plan);
    json_decref(pl);
    json_decref(p1);
    if (t.pg) {
        /* Another session can take an exclusive lock on the tables read:
         * db's session holds no transaction (and so no lock) open. */
        char err[512];
        cr_assert_eq(test_db_exec(&t,
                                  "SET lock_timeout = '2s';"
                                  "ALTER TABLE plans ADD COLUMN x BIGINT;"
                                  "ALTER TABLE placements ADD COLUMN x BIGINT;",
                                  err, sizeof(err)),
                     0, "%s", err);
        char n[64];
        test_db_query(&t,
                      "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                      "AND state LIKE 'idle in transaction%'",
                      n, sizeof(n));
        cr_assert_str_eq(n, "0");
        return;
    }
    /* Another connection can take the write lock and checkpoint the whole
     * WAL: no statement of db still holds a read snapshot. */
    sqlite3 *raw;
    cr_assert_eq(sqlite3_open(t.target, &raw), SQLITE_OK);
    cr_assert_eq(sqlite3_exec(raw, "INSERT INTO plans VALUES (2, 0, 'y', '{}')", NULL, NULL, NULL),
                 SQLITE_OK);
    int log = -1, ckpt = -1;
    cr_assert_eq(sqlite3_wal_checkpoint_v2(raw, NULL, SQLITE_CHECKPOINT_TRUNCATE, &log, &ckpt),
                 SQLITE_OK, "%s", sqlite3_errmsg(raw));
    sqlite3_close(raw);
}

TestSuite(group_profiles, .init = setup, .fini = teardown);

Test(group_profiles, stored_per_members_and_kind_and_replaced)
{
    mdb_profile_row_t rows[3] = {
        {.batch = 1, .mean_us = 1500.5, .std_us = 20, .peak_memory_bytes = 1 << 20},
        {.batch = 4, .mean_us = 4200, .std_us = 31.25, .peak_memory_bytes = 3u << 20},
        {.batch = 8, .mean_us = 8000, .std_us = 40, .peak_memory_bytes = 5u << 20}};
    mdb_profile_row_t *got = NULL;
    int n = -1;
    cr_assert_eq(mdb_group_profile_get(db, "abc", "cpu", &got, &n), SQ_NOT_FOUND);
    cr_assert_null(got);
    cr_assert_eq(n, 0);
    cr_assert_eq(mdb_group_profile_store(db, "abc", "", "cpu", "cpu", rows, 3), 0, "%s",
                 mdb_errmsg(db));
    cr_assert_eq(mdb_group_profile_get(db, "abc", "cpu", &got, &n), 0, "%s", mdb_errmsg(db));
    cr_assert_eq(n, 3);
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(got[i].batch, rows[i].batch);
        cr_assert_float_eq(got[i].mean_us, rows[i].mean_us, 1e-9);
        cr_assert_float_eq(got[i].std_us, rows[i].std_us, 1e-9);
        cr_assert_eq(got[i].peak_memory_bytes, rows[i].peak_memory_bytes);
    }
    free(got);
    /* Another kind, other members: separate; a second store replaces. */
    cr_assert_eq(mdb_group_profile_get(db, "abc", "cuda", &got, &n), SQ_NOT_FOUND);
    cr_assert_eq(mdb_group_profile_get(db, "abd", "cpu", &got, &n), SQ_NOT_FOUND);
    cr_assert_eq(mdb_group_profile_store(db, "abc", "", "cpu", "cpu", rows + 1, 1), 0);
    cr_assert_eq(mdb_group_profile_get(db, "abc", "cpu", &got, &n), 0);
    cr_assert_eq(n, 1);
    cr_assert_eq(got[0].batch, 4);
    free(got);
    cr_assert_eq(mdb_group_profile_store(db, "abc", "", "cpu", "cpu", rows, 0), SQ_INVAL);
    /* It survives a reopen, at the current schema version. */
    mdb_close(db);
    cr_assert_eq(mdb_open(t.target, &db), 0);
    cr_assert_eq(mdb_schema_version(db), MDB_SCHEMA_VERSION);
    cr_assert_eq(mdb_group_profile_get(db, "abc", "cpu", &got, &n), 0);
    free(got);
}
