/* The database a modeldb test runs on: a sqlite file in a temporary
 * directory, or, when SQUISH_TEST_PG names a PostgreSQL server (the
 * *_pg tests: tests/modeldb/pg_cluster.py starts a private one), a
 * database of its own there, made for the test and dropped after it.
 * test_db_exec runs SQL beside modeldb, as another client would. */
#ifndef MDB_TEST_DB_H
#define MDB_TEST_DB_H

#include <criterion/criterion.h>
#include <libpq-fe.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    int pg;
    char dir[64];      /* sqlite: the temporary directory */
    char target[1024]; /* what mdb_open takes: a file name or a conninfo */
    char admin[512];   /* PostgreSQL: SQUISH_TEST_PG, where databases are made */
    char dbname[64];
} test_db_t;

/* conninfo with its dbname replaced, as a key='value' conninfo. */
static inline void test_db_conninfo(const char *conninfo, const char *dbname, char *out,
                                    size_t outlen)
{
    char *err = NULL;
    PQconninfoOption *opts = PQconninfoParse(conninfo, &err);
    cr_assert_not_null(opts, "SQUISH_TEST_PG: %s", err ? err : "?");
    size_t n = 0;
    out[0] = '\0';
    for (PQconninfoOption *o = opts; o->keyword != NULL; o++) {
        const char *v = strcmp(o->keyword, "dbname") == 0 ? dbname : o->val;
        if (v == NULL)
            continue;
        n += (size_t)snprintf(out + n, n < outlen ? outlen - n : 0, "%s='", o->keyword);
        for (const char *p = v; *p; p++)
            n += (size_t)snprintf(out + n, n < outlen ? outlen - n : 0, "%s%c",
                                  *p == '\'' || *p == '\\' ? "\\" : "", *p);
        n += (size_t)snprintf(out + n, n < outlen ? outlen - n : 0, "' ");
    }
    PQconninfoFree(opts);
    cr_assert_lt(n, outlen, "conninfo too long");
}

static inline void pg_admin_exec(const char *conninfo, const char *sql)
{
    PGconn *c = PQconnectdb(conninfo);
    cr_assert_eq(PQstatus(c), CONNECTION_OK, "%s", PQerrorMessage(c));
    PGresult *r = PQexec(c, sql);
    int ok = PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK;
    char msg[512];
    snprintf(msg, sizeof(msg), "%s", PQresultErrorMessage(r));
    PQclear(r);
    PQfinish(c);
    cr_assert(ok, "%s: %s", sql, msg);
}

static inline int test_db_is_pg(void)
{
    const char *pg = getenv("SQUISH_TEST_PG");
    return pg != NULL && *pg != '\0';
}

static inline void test_db_make(test_db_t *t)
{
    memset(t, 0, sizeof(*t));
    const char *pg = getenv("SQUISH_TEST_PG");
    if (pg != NULL && *pg != '\0') {
        static int serial;
        t->pg = 1;
        snprintf(t->admin, sizeof(t->admin), "%s", pg);
        snprintf(t->dbname, sizeof(t->dbname), "squish_t_%d_%d", (int)getpid(), ++serial);
        char sql[128];
        snprintf(sql, sizeof(sql), "CREATE DATABASE %s", t->dbname);
        pg_admin_exec(t->admin, sql);
        test_db_conninfo(t->admin, t->dbname, t->target, sizeof(t->target));
        return;
    }
    snprintf(t->dir, sizeof(t->dir), "/tmp/squish-mdb-XXXXXX");
    cr_assert_not_null(mkdtemp(t->dir));
    snprintf(t->target, sizeof(t->target), "%s/t.db", t->dir);
}

static inline void test_db_drop(test_db_t *t)
{
    if (t->pg) {
        char sql[128];
        snprintf(sql, sizeof(sql), "DROP DATABASE IF EXISTS %s WITH (FORCE)", t->dbname);
        pg_admin_exec(t->admin, sql);
        return;
    }
    char cmd[160];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", t->dir);
    cr_assert_eq(system(cmd), 0);
}

/* Runs sql on the test's database from a connection of its own; the
 * error text (empty on success) goes to err. Returns 0 on success. */
static inline int test_db_exec(const test_db_t *t, const char *sql, char *err, size_t errlen)
{
    int rc;
    err[0] = '\0';
    if (t->pg) {
        PGconn *c = PQconnectdb(t->target);
        PGresult *r = PQexec(c, sql);
        rc = PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK ? 0 : -1;
        if (rc != 0)
            snprintf(err, errlen, "%s", PQerrorMessage(c));
        PQclear(r);
        PQfinish(c);
        return rc;
    }
    sqlite3 *raw;
    char *msg = NULL;
    rc = sqlite3_open(t->target, &raw) == SQLITE_OK ? 0 : -1;
    if (rc == 0 && sqlite3_exec(raw, sql, NULL, NULL, &msg) != SQLITE_OK)
        rc = -1;
    if (rc != 0)
        snprintf(err, errlen, "%s", msg ? msg : sqlite3_errmsg(raw));
    sqlite3_free(msg);
    sqlite3_close(raw);
    return rc;
}

/* The first column of the first row of a query, as text (PostgreSQL). */
static inline void test_db_query(const test_db_t *t, const char *sql, char *out, size_t outlen)
{
    PGconn *c = PQconnectdb(t->target);
    PGresult *r = PQexec(c, sql);
    int ok = PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) > 0;
    snprintf(out, outlen, "%s", ok ? PQgetvalue(r, 0, 0) : PQerrorMessage(c));
    PQclear(r);
    PQfinish(c);
    cr_assert(ok, "%s: %s", sql, out);
}

#endif
