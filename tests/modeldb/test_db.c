/* modeldb/db.c: opening, migrations and checks, on sqlite and (the _pg
 * test, SQUISH_TEST_PG) on PostgreSQL; the leadership lock. */
#include "mdb_test_db.h"

#include <criterion/criterion.h>
#include <math.h>
#include <mdb.h>
#include <sq.h>

#include <pthread.h>
#include <sqlite3.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static test_db_t t;

static void setup(void)
{
    test_db_make(&t);
}

static void teardown(void)
{
    test_db_drop(&t);
}

TestSuite(mdb, .init = setup, .fini = teardown);

Test(mdb, the_backend_follows_the_target)
{
    cr_assert(mdb_is_postgres("postgresql://u@localhost/squish"));
    cr_assert(mdb_is_postgres("postgres://localhost"));
    cr_assert(mdb_is_postgres("host=/run/postgresql dbname=squish"));
    cr_assert(mdb_is_postgres("  dbname = squish"));
    cr_assert(!mdb_is_postgres("var/squish.db"));
    cr_assert(!mdb_is_postgres("/tmp/a=b.db"));
    cr_assert(!mdb_is_postgres("squish.db"));
    cr_assert(!mdb_is_postgres(""));
    char shown[256];
    mdb_target_describe("postgresql://squish:s3cret@db.example:5433/models", shown, sizeof(shown));
    cr_assert_null(strstr(shown, "s3cret"), "%s", shown);
    cr_assert_not_null(strstr(shown, "dbname=models"), "%s", shown);
    cr_assert_not_null(strstr(shown, "port=5433"), "%s", shown);
    mdb_target_describe("host=/run/pg password='a b' dbname=x", shown, sizeof(shown));
    cr_assert_null(strstr(shown, "a b"), "%s", shown);
    mdb_target_describe("var/squish.db", shown, sizeof(shown));
    cr_assert_str_eq(shown, "var/squish.db");
    mdb_t *db;
    cr_assert_eq(mdb_open(t.target, &db), 0, "%s", mdb_errmsg(db));
    cr_assert_str_eq(mdb_backend(db), t.pg ? "postgresql" : "sqlite");
    mdb_close(db);
}

Test(mdb, open_creates_the_schema)
{
    mdb_t *db;
    cr_assert_eq(mdb_open(t.target, &db), 0, "%s", mdb_errmsg(db));
    cr_assert_eq(mdb_schema_version(db), MDB_SCHEMA_VERSION);
    cr_assert_eq(mdb_check(db), 0, "%s", mdb_errmsg(db));
    cr_assert_eq(mdb_ping(db), 0, "%s", mdb_errmsg(db));
    mdb_close(db);

    if (!t.pg) {
        sqlite3 *raw;
        cr_assert_eq(sqlite3_open(t.target, &raw), SQLITE_OK);
        sqlite3_stmt *st;
        cr_assert_eq(sqlite3_prepare_v2(raw, "PRAGMA journal_mode", -1, &st, NULL), SQLITE_OK);
        cr_assert_eq(sqlite3_step(st), SQLITE_ROW);
        cr_assert_str_eq((const char *)sqlite3_column_text(st, 0), "wal");
        sqlite3_finalize(st);
        sqlite3_close(raw);
    }
    const char *tables[] = {"models",       "model_nodes",       "profiles",       "plans",
                            "placements",   "prefix_groups",     "prefix_members", "group_profiles",
                            "pipelines",    "profile_precision", "model_files",    "model_not_on",
                            "decode_costs", "schema_version"};
    for (size_t i = 0; i < sizeof(tables) / sizeof(tables[0]); i++) {
        char sql[128], err[512];
        snprintf(sql, sizeof(sql), "SELECT count(*) FROM %s", tables[i]);
        cr_assert_eq(test_db_exec(&t, sql, err, sizeof(err)), 0, "table %s: %s", tables[i], err);
    }
}

Test(mdb, pipelines_are_stored_listed_replaced_and_deleted_by_name)
{
    mdb_t *db;
    cr_assert_eq(mdb_open(t.target, &db), 0, "%s", mdb_errmsg(db));
    json_t *a = json_pack("{s:s, s:i}", "name", "faces", "slo_ms", 300);
    json_t *b = json_pack("{s:s, s:i}", "name", "cars", "slo_ms", 400);
    cr_assert_eq(mdb_pipeline_put(db, "faces", a, 0), 0, "%s", mdb_errmsg(db));
    cr_assert_eq(mdb_pipeline_put(db, "cars", b, 0), 0, "%s", mdb_errmsg(db));
    cr_assert_eq(mdb_pipeline_put(db, "faces", b, 0), SQ_EXISTS);
    json_t *list;
    cr_assert_eq(mdb_pipeline_list(db, &list), 0, "%s", mdb_errmsg(db));
    cr_assert_eq(json_array_size(list), 2);
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(list, 0), "name")), "cars");
    cr_assert(json_equal(json_object_get(json_array_get(list, 1), "spec"), a));
    json_decref(list);
    json_object_set_new(a, "slo_ms", json_integer(500));
    cr_assert_eq(mdb_pipeline_put(db, "faces", a, 1), 0, "%s", mdb_errmsg(db));
    cr_assert_eq(mdb_pipeline_delete(db, "cars"), 0, "%s", mdb_errmsg(db));
    cr_assert_eq(mdb_pipeline_delete(db, "cars"), SQ_NOT_FOUND);
    mdb_close(db);
    /* What was acknowledged is there after a reopen. */
    cr_assert_eq(mdb_open(t.target, &db), 0, "%s", mdb_errmsg(db));
    cr_assert_eq(mdb_pipeline_list(db, &list), 0, "%s", mdb_errmsg(db));
    cr_assert_eq(json_array_size(list), 1);
    cr_assert(json_equal(json_object_get(json_array_get(list, 0), "spec"), a));
    json_decref(list);
    mdb_close(db);
    json_decref(a);
    json_decref(b);
}

/* The gateway's decode costs: none at first, stored by name (a second
 * write replaces), there after a reopen, and a cost that is not one
 * refused with nothing stored. */
Test(mdb, decode_costs_are_stored_by_name_and_survive_a_reopen)
{
    mdb_t *db;
    cr_assert_eq(mdb_open(t.target, &db), 0, "%s", mdb_errmsg(db));
    mdb_decode_cost_t got[4];
    int n = -1;
    cr_assert_eq(mdb_decode_costs_read(db, got, 4, &n), 0, "%s", mdb_errmsg(db));
    cr_assert_eq(n, 0);
    mdb_decode_cost_t put[2] = {
        {.what = "frame", .mean_ns = 4.5e6, .dev_ns = 1.25e6, .samples = 900},
        {.what = "per_byte", .mean_ns = 31.5, .dev_ns = 2.5, .samples = 40}};
    cr_assert_eq(mdb_decode_costs_write(db, put, 2), 0, "%s", mdb_errmsg(db));
    put[0].mean_ns = 5e6;
    put[0].samples = 1000;
    cr_assert_eq(mdb_decode_costs_write(db, put, 1), 0, "%s", mdb_errmsg(db));
    mdb_decode_cost_t bad = {.what = "frame", .mean_ns = NAN, .dev_ns = 0, .samples = 1};
    cr_assert_eq(mdb_decode_costs_write(db, &bad, 1), SQ_INVAL);
    bad = (mdb_decode_cost_t){.what = "", .mean_ns = 1, .dev_ns = 0, .samples = 1};
    cr_assert_eq(mdb_decode_costs_write(db, &bad, 1), SQ_INVAL);
    mdb_close(db);
    cr_assert_eq(mdb_open(t.target, &db), 0, "%s", mdb_errmsg(db));
    cr_assert_eq(mdb_decode_costs_read(db, got, 4, &n), 0, "%s", mdb_errmsg(db));
    cr_assert_eq(n, 2);
    cr_assert_str_eq(got[0].what, "frame");
    cr_assert_float_eq(got[0].mean_ns, 5e6, 1e-6);
    cr_assert_float_eq(got[0].dev_ns, 1.25e6, 1e-6);
    cr_assert_eq(got[0].samples, 1000);
    cr_assert_str_eq(got[1].what, "per_byte");
    cr_assert_float_eq(got[1].mean_ns, 31.5, 1e-9);
    cr_assert_float_eq(got[1].dev_ns, 2.5, 1e-9);
    cr_assert_eq(got[1].samples, 40);
    /* Fewer slots than rows: the first ones, no error. */
    cr_assert_eq(mdb_decode_costs_read(db, got, 1, &n), 0, "%s", mdb_errmsg(db));
    cr_assert_eq(n, 1);
    cr_assert_str_eq(got[0].what, "frame");
    mdb_close(db);
}

static int pipeline_unloaded(mdb_t *db, const char *name)
{
    json_t *list, *p;
    size_t i;
    int unloaded = -1;
    cr_assert_eq(mdb_pipeline_list(db, &list), 0, "%s", mdb_errmsg(db));
    json_array_foreach(list, i,
                       p) if (strcmp(json_string_value(json_object_get(p, "name")), name) == 0)
        unloaded = json_is_true(json_object_get(p, "unloaded"));
    json_decref(list);
    return unloaded;
}

/* Model control: a pipeline unloaded stays so across a reopen, is loaded
 * again by a load or by publishing its spec anew. */
Test(mdb, a_pipeline_unloaded_stays_unloaded_until_loaded_or_replaced)
{
    mdb_t *db;
    cr_assert_eq(mdb_open(t.target, &db), 0, "%s", mdb_errmsg(db));
    json_t *a = json_pack("{s:s, s:i}", "name", "faces", "slo_ms", 300);
    cr_assert_eq(mdb_pipeline_put(db, "faces", a, 0), 0, "%s", mdb_errmsg(db));
    cr_assert_eq(pipeline_unloaded(db, "faces"), 0);
    cr_assert_eq(mdb_pipeline_set_unloaded(db, "faces", 1), 0, "%s", mdb_errmsg(db));
    cr_assert_eq(mdb_pipeline_set_unloaded(db, "cars", 1), SQ_NOT_FOUND);
    mdb_close(db);
    cr_assert_eq(mdb_open(t.target, &db), 0, "%s", mdb_errmsg(db));
    cr_assert_eq(pipeline_unloaded(db, "faces"), 1);
    cr_assert_eq(mdb_pipeline_set_unloaded(db, "faces", 0), 0, "%s", mdb_errmsg(db));
    cr_assert_eq(pipeline_unloaded(db, "faces"), 0);
    cr_assert_eq(mdb_pipeline_set_unloaded(db, "faces", 1), 0, "%s", mdb_errmsg(db));
    cr_assert_eq(mdb_pipeline_put(db, "faces", a, 1), 0, "%s", mdb_errmsg(db));
    cr_assert_eq(pipeline_unloaded(db, "faces"), 0);
    mdb_close(db);
    json_decref(a);
}

Test(mdb, reopening_keeps_the_version_and_runs_no_migration_twice)
{
    mdb_t *db;
    cr_assert_eq(mdb_open(t.target, &db), 0, "%s", mdb_errmsg(db));
    mdb_close(db);
    cr_assert_eq(mdb_open(t.target, &db), 0, "%s", mdb_errmsg(db));
    cr_assert_eq(mdb_schema_version(db), MDB_SCHEMA_VERSION);
    mdb_close(db);
}

Test(mdb, a_newer_schema_is_refused_with_a_message)
{
    mdb_t *db;
    cr_assert_eq(mdb_open(t.target, &db), 0, "%s", mdb_errmsg(db));
    mdb_close(db);
    char err[512];
    cr_assert_eq(test_db_exec(&t, "UPDATE schema_version SET version = 99", err, sizeof(err)), 0,
                 "%s", err);
    cr_assert_eq(mdb_open(t.target, &db), SQ_DB);
    cr_assert_not_null(strstr(mdb_errmsg(db), "newer"), "%s", mdb_errmsg(db));
    mdb_close(db);
}

/* sqlite: a file that is not a database; PostgreSQL: a database that is
 * not there. */
Test(mdb, a_target_that_is_not_a_database_is_an_error_not_a_crash)
{
    char target[1100];
    if (t.pg) {
        test_db_conninfo(t.admin, "no_such_database", target, sizeof(target));
    } else {
        FILE *f = fopen(t.target, "w");
        fputs("this is not sqlite, just text that is long enough to be a header..........", f);
        fclose(f);
        snprintf(target, sizeof(target), "%s", t.target);
    }
    mdb_t *db;
    cr_assert_eq(mdb_open(target, &db), SQ_DB);
    cr_assert_neq(mdb_errmsg(db)[0], '\0');
    if (t.pg)
        cr_assert_not_null(strstr(mdb_errmsg(db), "no_such_database"), "%s", mdb_errmsg(db));
    mdb_close(db);
}

Test(mdb, an_unreachable_target_fails_cleanly)
{
    mdb_t *db;
    const char *target = t.pg ? "host=/nonexistent-dir/x dbname=squish connect_timeout=2"
                              : "/nonexistent-dir/x/y.db";
    cr_assert_eq(mdb_open(target, &db), SQ_DB);
    cr_assert_neq(mdb_errmsg(db)[0], '\0');
    mdb_close(db);
    cr_assert_eq(mdb_open("postgresql://127.0.0.1:1/squish?connect_timeout=2", &db), SQ_DB);
    cr_assert_not_null(strstr(mdb_errmsg(db), "connect"), "%s", mdb_errmsg(db));
    mdb_close(db);
    mdb_close(NULL);
}

/* Several squishd starting at once on one PostgreSQL database migrate it
 * one after the other (sqlite: one file, the same). */
static void *open_close(void *arg)
{
    mdb_t *db;
    intptr_t rc = mdb_open(arg, &db);
    mdb_close(db);
    return (void *)rc;
}

Test(mdb, concurrent_first_opens_migrate_once)
{
    pthread_t th[4];
    for (int i = 0; i < 4; i++)
        cr_assert_eq(pthread_create(&th[i], NULL, open_close, t.target), 0);
    for (int i = 0; i < 4; i++) {
        void *rc;
        pthread_join(th[i], &rc);
        cr_assert_eq((intptr_t)rc, 0, "open %d", i);
    }
    mdb_t *db;
    cr_assert_eq(mdb_open(t.target, &db), 0, "%s", mdb_errmsg(db));
    cr_assert_eq(mdb_schema_version(db), MDB_SCHEMA_VERSION);
    mdb_close(db);
    char err[512];
    cr_assert_eq(test_db_exec(&t, "SELECT 1 FROM schema_version", err, sizeof(err)), 0);
}

TestSuite(leader, .init = setup, .fini = teardown);

Test(leader, one_handle_leads_until_it_closes)
{
    mdb_t *a, *b;
    cr_assert_eq(mdb_open(t.target, &a), 0, "%s", mdb_errmsg(a));
    cr_assert_eq(mdb_open(t.target, &b), 0, "%s", mdb_errmsg(b));
    int la = -1, lb = -1;
    cr_assert_eq(mdb_leader_try(a, 42, &la), 0, "%s", mdb_errmsg(a));
    cr_assert_eq(mdb_leader_try(b, 42, &lb), 0, "%s", mdb_errmsg(b));
    cr_assert_eq(la, 1);
    if (!t.pg) {
        cr_assert_eq(lb, 1, "sqlite: one host, every handle leads");
        mdb_close(a);
        mdb_close(b);
        return;
    }
    cr_assert_eq(lb, 0, "the lock is held by a");
    /* Asking again keeps it (and does not pile up holds). */
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(mdb_leader_try(a, 42, &la), 0);
        cr_assert_eq(la, 1);
    }
    int lc = -1;
    cr_assert_eq(mdb_leader_try(b, 43, &lc), 0);
    cr_assert_eq(lc, 1, "another key is another lock");
    mdb_close(a);
    /* The server ends a's session (and frees its lock) after the
     * disconnect, not at once: b, polling as a standby does, takes over. */
    for (int i = 0; i < 250 && lb == 0; i++) {
        cr_assert_eq(mdb_leader_try(b, 42, &lb), 0, "%s", mdb_errmsg(b));
        if (lb == 0)
            usleep(20 * 1000);
    }
    cr_assert_eq(lb, 1, "a's session ended: b takes over");
    mdb_close(b);
}

/* A leader whose session the server ends (a restart, a failover) is told
 * at its next try, which reconnects and takes the lock again if free. */
Test(leader, a_lost_session_is_reconnected_and_tried_again)
{
    if (!t.pg)
        cr_skip_test("PostgreSQL only (sqlite has no session to lose)");
    mdb_t *a;
    cr_assert_eq(mdb_open(t.target, &a), 0, "%s", mdb_errmsg(a));
    int la = -1;
    cr_assert_eq(mdb_leader_try(a, 7, &la), 0);
    cr_assert_eq(la, 1);
    char sql[256];
    snprintf(sql, sizeof(sql),
             "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity "
             "WHERE datname = '%s' AND pid <> pg_backend_pid()",
             t.dbname);
    pg_admin_exec(t.admin, sql);
    json_t *out = NULL;
    cr_assert_eq(mdb_model_list(a, &out), SQ_DB, "the session is gone");
    cr_assert_eq(mdb_ping(a), 1, "%s", mdb_errmsg(a));
    cr_assert_eq(mdb_model_list(a, &out), 0, "%s", mdb_errmsg(a));
    json_decref(out);
    cr_assert_eq(mdb_leader_try(a, 7, &la), 0, "%s", mdb_errmsg(a));
    cr_assert_eq(la, 1);
    mdb_close(a);
}

/* Standbys find the leader's address: the name its leadership session
 * announced, also after that session was reconnected. */
Test(leader, standbys_read_the_leaders_announced_address)
{
    mdb_t *a, *b;
    cr_assert_eq(mdb_open(t.target, &a), 0, "%s", mdb_errmsg(a));
    cr_assert_eq(mdb_open(t.target, &b), 0, "%s", mdb_errmsg(b));
    char who[128] = "";
    int la = -1, lb = -1;
    cr_assert_eq(mdb_session_timeouts(a, 4000), 0, "%s", mdb_errmsg(a));
    cr_assert_eq(mdb_leader_try(a, 99, &la), 0, "%s", mdb_errmsg(a));
    cr_assert_eq(la, 1);
    cr_assert_eq(mdb_leader_announce(a, "http://10.0.0.7:8000"), 0, "%s", mdb_errmsg(a));
    if (!t.pg) {
        cr_assert_eq(mdb_leader_who(b, 99, who, sizeof(who)), SQ_NOT_FOUND);
        mdb_close(a);
        mdb_close(b);
        return;
    }
    cr_assert_eq(mdb_leader_who(b, 99, who, sizeof(who)), 0, "%s", mdb_errmsg(b));
    cr_assert_str_eq(who, "http://10.0.0.7:8000");
    cr_assert_eq(mdb_leader_who(b, 98, who, sizeof(who)), SQ_NOT_FOUND, "nobody holds key 98");
    cr_assert_eq(mdb_leader_try(b, 99, &lb), 0);
    cr_assert_eq(lb, 0);
    /* a's session ends; its reconnect takes the lock again and names
     * itself again. */
    char sql[256];
    snprintf(sql, sizeof(sql),
             "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity "
             "WHERE datname = '%s' AND application_name LIKE 'squishd %%'",
             t.dbname);
    pg_admin_exec(t.admin, sql);
    for (int i = 0; i < 250; i++) {
        cr_assert_eq(mdb_leader_try(a, 99, &la), 0, "%s", mdb_errmsg(a));
        if (la == 1)
            break;
        usleep(20 * 1000);
    }
    cr_assert_eq(la, 1);
    cr_assert_eq(mdb_leader_who(b, 99, who, sizeof(who)), 0, "%s", mdb_errmsg(b));
    cr_assert_str_eq(who, "http://10.0.0.7:8000", "named again after the reconnect");
    mdb_close(a);
    mdb_close(b);
}
