/* modeldb's SQL layer on sqlite: the embedded default, one file in WAL mode. */
#include "mdb_int.h"

#include <sq.h>

#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef struct {
    mdb_q_t base;
    sqlite3_stmt *st;
} sqlite_q_t;

static sqlite3 *conn_of(mdb_t *db)
{
    return db->conn;
}

static sqlite3_stmt *st_of(mdb_q_t *q)
{
    return ((sqlite_q_t *)q)->st;
}

/* sqlite's result code as squish's: a taken (name, version) is "exists",
 * as PostgreSQL's unique_violation is. */
static int error_code(mdb_t *db)
{
    int ext = sqlite3_extended_errcode(conn_of(db));
    snprintf(db->errmsg, sizeof(db->errmsg), "%s", sqlite3_errmsg(conn_of(db)));
    if (ext == SQLITE_CONSTRAINT_UNIQUE || ext == SQLITE_CONSTRAINT_PRIMARYKEY)
        return SQ_EXISTS;
    if ((ext & 0xff) == SQLITE_NOMEM)
        return SQ_NOMEM;
    return SQ_DB;
}

static int sqlite_exec(mdb_t *db, const char *sql)
{
    char *err = NULL;
    if (sqlite3_exec(conn_of(db), sql, NULL, NULL, &err) != SQLITE_OK) {
        int rc = error_code(db);
        snprintf(db->errmsg, sizeof(db->errmsg), "%s", err ? err : "sqlite3_exec failed");
        sqlite3_free(err);
        return rc;
    }
    return 0;
}

static int sqlite_open(mdb_t *db, const char *path)
{
    sqlite3 *conn = NULL;
    int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX;
    int rc = sqlite3_open_v2(path, &conn, flags, NULL);
    db->conn = conn;
    if (rc != SQLITE_OK) {
        snprintf(db->errmsg, sizeof(db->errmsg), "%s: %s", path,
                 conn ? sqlite3_errmsg(conn) : "out of memory");
        return SQ_DB;
    }
    sqlite3_busy_timeout(conn, 5000);
    /* Turning a new file to WAL takes an exclusive lock, and sqlite answers
     * "database is locked" (or, while another connection builds the
     * wal-index, "disk I/O error") at once, without its busy handler: the
     * first opens of several processes or threads race for it (1 in 30
     * runs of modeldb/test_db failed so). Tried again for up to 5 s. */
    int erc = 0;
    for (int tries = 0; tries < 250; tries++) {
        erc = sqlite_exec(db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"
                              "PRAGMA foreign_keys=ON;");
        int ext = sqlite3_extended_errcode(conn) & 0xff;
        if (erc == 0 || (ext != SQLITE_BUSY && ext != SQLITE_LOCKED && ext != SQLITE_IOERR))
            break;
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return erc;
}

static void sqlite_close(mdb_t *db)
{
    sqlite3_close(conn_of(db));
    db->conn = NULL;
}

static mdb_q_t *sqlite_prepare(mdb_t *db, const char *sql)
{
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(conn_of(db), sql, -1, &st, NULL) != SQLITE_OK) {
        error_code(db);
        return NULL;
    }
    sqlite_q_t *q = sq_xcalloc(1, sizeof(*q));
    q->st = st;
    return &q->base;
}

static void sqlite_finalize(mdb_q_t *q)
{
    sqlite3_finalize(st_of(q));
    free(q);
}

static void sqlite_reset(mdb_q_t *q)
{
    sqlite3_reset(st_of(q));
    sqlite3_clear_bindings(st_of(q));
}

static void sqlite_bind_int64(mdb_q_t *q, int i, int64_t v)
{
    sqlite3_bind_int64(st_of(q), i, v);
}

static void sqlite_bind_double(mdb_q_t *q, int i, double v)
{
    sqlite3_bind_double(st_of(q), i, v);
}

static void sqlite_bind_text(mdb_q_t *q, int i, const char *s, size_t len)
{
    sqlite3_bind_text64(st_of(q), i, s, len, SQLITE_TRANSIENT, SQLITE_UTF8);
}

static void sqlite_bind_blob(mdb_q_t *q, int i, const void *p, size_t len)
{
    sqlite3_bind_blob64(st_of(q), i, p, len, SQLITE_STATIC);
}

static void sqlite_bind_null(mdb_q_t *q, int i)
{
    sqlite3_bind_null(st_of(q), i);
}

static int sqlite_step(mdb_q_t *q)
{
    int rc = sqlite3_step(st_of(q));
    if (rc == SQLITE_ROW)
        return 1;
    if (rc == SQLITE_DONE)
        return 0;
    return error_code(q->db);
}

static int sqlite_is_null(mdb_q_t *q, int i)
{
    return sqlite3_column_type(st_of(q), i) == SQLITE_NULL;
}

static int64_t sqlite_col_int64(mdb_q_t *q, int i)
{
    return sqlite3_column_int64(st_of(q), i);
}

static double sqlite_col_double(mdb_q_t *q, int i)
{
    return sqlite3_column_double(st_of(q), i);
}

static const char *sqlite_col_text(mdb_q_t *q, int i)
{
    return (const char *)sqlite3_column_text(st_of(q), i);
}

static const void *sqlite_col_blob(mdb_q_t *q, int i, size_t *len)
{
    const void *p = sqlite3_column_blob(st_of(q), i);
    *len = (size_t)sqlite3_column_bytes(st_of(q), i);
    return p;
}

static int64_t sqlite_changes(mdb_q_t *q)
{
    return sqlite3_changes64(conn_of(q->db));
}

static int sqlite_ping(mdb_t *db)
{
    return 0; /* a file: nothing to lose or reconnect */
}

static int sqlite_leader_try(mdb_t *db, int64_t key, int *is_leader)
{
    /* One host, one squishd per file: it leads. */
    *is_leader = 1;
    return 0;
}

static int sqlite_leader_who(mdb_t *db, int64_t key, char *out, size_t outlen)
{
    return SQ_NOT_FOUND; /* no other squishd to name */
}

static int sqlite_session_set(mdb_t *db, const char *name, const char *value)
{
    return 0; /* no session */
}

const mdb_sql_ops_t mdb__sqlite_ops = {
    .name = "sqlite",
    .dialect = MDB_SQLITE,
    /* IMMEDIATE takes the write lock at once: two writers never both read
     * and then both try to write. */
    .begin_sql = "BEGIN IMMEDIATE",
    .open = sqlite_open,
    .close = sqlite_close,
    .exec = sqlite_exec,
    .prepare = sqlite_prepare,
    .finalize = sqlite_finalize,
    .reset = sqlite_reset,
    .bind_int64 = sqlite_bind_int64,
    .bind_double = sqlite_bind_double,
    .bind_text = sqlite_bind_text,
    .bind_blob = sqlite_bind_blob,
    .bind_null = sqlite_bind_null,
    .step = sqlite_step,
    .is_null = sqlite_is_null,
    .col_int64 = sqlite_col_int64,
    .col_double = sqlite_col_double,
    .col_text = sqlite_col_text,
    .col_blob = sqlite_col_blob,
    .changes = sqlite_changes,
    .ping = sqlite_ping,
    .leader_try = sqlite_leader_try,
    .leader_who = sqlite_leader_who,
    .session_set = sqlite_session_set,
};
