#include <criterion/criterion.h>
#include <mdb.h>
#include <sq.h>

#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[64];
static char path[128];

static void setup(void)
{
    snprintf(dir, sizeof(dir), "/tmp/squish-mdb-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/t.db", dir);
}

static void teardown(void)
{
    char cmd[160];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(mdb, .init = setup, .fini = teardown);

Test(mdb, open_creates_the_schema_in_wal_mode)
{
    mdb_t *db;
    cr_assert_eq(mdb_open(path, &db), 0, "%s", mdb_errmsg(db));
    cr_assert_eq(mdb_schema_version(db), MDB_SCHEMA_VERSION);
    cr_assert_eq(mdb_check(db), 0);
    mdb_close(db);

    sqlite3 *raw;
    cr_assert_eq(sqlite3_open(path, &raw), SQLITE_OK);
    sqlite3_stmt *st;
    cr_assert_eq(sqlite3_prepare_v2(raw, "PRAGMA journal_mode", -1, &st, NULL), SQLITE_OK);
    cr_assert_eq(sqlite3_step(st), SQLITE_ROW);
    cr_assert_str_eq((const char *)sqlite3_column_text(st, 0), "wal");
    sqlite3_finalize(st);
    const char *tables[] = {"models",     "model_nodes",   "profiles",      "plans",
                            "placements", "prefix_groups", "prefix_members"};
    for (size_t i = 0; i < sizeof(tables) / sizeof(tables[0]); i++) {
        char sql[128];
        snprintf(sql, sizeof(sql), "SELECT count(*) FROM %s", tables[i]);
        cr_assert_eq(sqlite3_prepare_v2(raw, sql, -1, &st, NULL), SQLITE_OK, "table %s", tables[i]);
        sqlite3_finalize(st);
    }
    sqlite3_close(raw);
}

Test(mdb, reopening_keeps_the_version_and_runs_no_migration_twice)
{
    mdb_t *db;
    cr_assert_eq(mdb_open(path, &db), 0);
    mdb_close(db);
    cr_assert_eq(mdb_open(path, &db), 0, "%s", mdb_errmsg(db));
    cr_assert_eq(mdb_schema_version(db), MDB_SCHEMA_VERSION);
    mdb_close(db);
}

Test(mdb, a_newer_schema_is_refused_with_a_message)
{
    mdb_t *db;
    cr_assert_eq(mdb_open(path, &db), 0);
    mdb_close(db);
    sqlite3 *raw;
    sqlite3_open(path, &raw);
    cr_assert_eq(sqlite3_exec(raw, "UPDATE schema_version SET version = 99", NULL, NULL, NULL),
                 SQLITE_OK);
    sqlite3_close(raw);
    cr_assert_eq(mdb_open(path, &db), SQ_DB);
    cr_assert_not_null(strstr(mdb_errmsg(db), "newer"), "%s", mdb_errmsg(db));
    mdb_close(db);
}

Test(mdb, a_file_that_is_not_a_database_is_an_error_not_a_crash)
{
    FILE *f = fopen(path, "w");
    fputs("this is not sqlite, just text that is long enough to be a header..........", f);
    fclose(f);
    mdb_t *db;
    cr_assert_eq(mdb_open(path, &db), SQ_DB);
    cr_assert_neq(mdb_errmsg(db)[0], '\0');
    mdb_close(db);
}

Test(mdb, unwritable_path_fails_cleanly)
{
    mdb_t *db;
    cr_assert_eq(mdb_open("/nonexistent-dir/x/y.db", &db), SQ_DB);
    cr_assert_neq(mdb_errmsg(db)[0], '\0');
    mdb_close(db);
    mdb_close(NULL);
}
