/* modeldb internals shared by its source files: the handle and a small SQL
 * layer with two implementations, sqlite (sql_sqlite.c) and PostgreSQL
 * through libpq (sql_pg.c). The SQL of db.c and models.c is written once
 * with `?` placeholders; where the dialects differ, mdb_sql picks one of two
 * static strings. sql.c is the front: the statement cache, the error
 * detail, transactions with their retries. The backends call nothing of
 * sql.c, db.c or models.c (they write the handle's errmsg themselves). */
#ifndef MDB_INT_H
#define MDB_INT_H

#include "mdb.h"

#include <stddef.h>
#include <stdint.h>

#define MDB_MAX_STMTS 64
/* A write that PostgreSQL aborts for a serialization failure or a deadlock
 * (another squishd wrote the same rows) is run again this many times in all. */
#define MDB_WRITE_ATTEMPTS 5

enum mdb_dialect { MDB_SQLITE, MDB_PG };

typedef struct mdb_q mdb_q_t;
typedef struct mdb_sql_ops mdb_sql_ops_t;

/* A prepared statement; each backend extends it (base first). */
struct mdb_q {
    mdb_t *db;
    const char *sql; /* the static text it was prepared from (the cache key) */
};

struct mdb {
    const mdb_sql_ops_t *ops;
    void *conn; /* the backend's connection (sqlite3 *, or sql_pg.c's state) */
    enum mdb_dialect dialect;
    /* Set by a backend when the last failure was a serialization failure
     * or a deadlock: mdb_write runs the transaction again. */
    int retry;
    char errmsg[512];
    /* Prepared statements, keyed by the address of their (static) SQL text. */
    struct mdb_stmt_cache {
        const char *sql;
        mdb_q_t *q;
    } stmts[MDB_MAX_STMTS];
    int nstmts;
    /* The largest piece of a model file a row holds: MDB_FILE_CHUNK_BYTES,
     * smaller in tests. */
    size_t file_chunk_bytes;
};

/* A backend. Every function that can fail returns 0 or a negative SQ_*
 * code and writes the detail into db->errmsg (without a "what" prefix).
 * Bound text is copied; a bound blob is borrowed until the statement is
 * stepped for the first time. */
struct mdb_sql_ops {
    const char *name;
    enum mdb_dialect dialect;
    /* The script that starts a write transaction. */
    const char *begin_sql;
    int (*open)(mdb_t *db, const char *target);
    void (*close)(mdb_t *db); /* db->conn may be NULL */
    int (*exec)(mdb_t *db, const char *sql);
    mdb_q_t *(*prepare)(mdb_t *db, const char *sql);
    void (*finalize)(mdb_q_t *q);
    /* Forgets the results (and any read snapshot they hold) and the bindings. */
    void (*reset)(mdb_q_t *q);
    void (*bind_int64)(mdb_q_t *q, int i, int64_t v);
    void (*bind_double)(mdb_q_t *q, int i, double v);
    void (*bind_text)(mdb_q_t *q, int i, const char *s, size_t len);
    void (*bind_blob)(mdb_q_t *q, int i, const void *p, size_t len);
    void (*bind_null)(mdb_q_t *q, int i);
    /* 1: a row, 0: no more rows, or a negative SQ_* code. */
    int (*step)(mdb_q_t *q);
    int (*is_null)(mdb_q_t *q, int i);
    int64_t (*col_int64)(mdb_q_t *q, int i);
    double (*col_double)(mdb_q_t *q, int i);
    const char *(*col_text)(mdb_q_t *q, int i); /* NULL for NULL */
    const void *(*col_blob)(mdb_q_t *q, int i, size_t *len);
    /* Rows the statement's last run inserted, updated or deleted. */
    int64_t (*changes)(mdb_q_t *q);
    int (*ping)(mdb_t *db);
    int (*leader_try)(mdb_t *db, int64_t key, int *is_leader);
    /* The application name of the session holding lock key, into out. */
    int (*leader_who)(mdb_t *db, int64_t key, char *out, size_t outlen);
    /* A session setting (set_config), kept and set again on every
     * reconnect. */
    int (*session_set)(mdb_t *db, const char *name, const char *value);
};

extern const mdb_sql_ops_t mdb__sqlite_ops;
extern const mdb_sql_ops_t mdb__pg_ops;

/* Picks the backend for target (mdb_is_postgres) and connects. */
int mdb_sql_open(mdb_t *db, const char *target);
/* Finalizes the cached statements and disconnects. */
void mdb_sql_close(mdb_t *db);

/* The cached prepared statement for a static SQL string, reset and with
 * bindings cleared; NULL on a prepare error (recorded on the handle). The
 * bind and step functions accept NULL, so that a failed prepare surfaces
 * once, at the step. */
mdb_q_t *mdb_q(mdb_t *db, const char *sql);
/* The dialect's text of a statement that differs between them. */
const char *mdb_sql(const mdb_t *db, const char *sqlite_sql, const char *pg_sql);

/* Parameters count from 1, columns from 0 (as sqlite's). */
void mdb_q_int64(mdb_q_t *q, int i, int64_t v);
void mdb_q_double(mdb_q_t *q, int i, double v);
void mdb_q_text(mdb_q_t *q, int i, const char *s); /* NULL binds NULL */
void mdb_q_text_n(mdb_q_t *q, int i, const char *s, size_t len);
void mdb_q_blob(mdb_q_t *q, int i, const void *p, size_t len); /* NULL binds NULL */
void mdb_q_null(mdb_q_t *q, int i);
/* v as compact JSON text with sorted keys; NULL binds NULL. */
void mdb_q_json(mdb_q_t *q, int i, json_t *v);
/* 1: a row, 0: no more rows, or a negative SQ_* code with "what: detail"
 * on the handle. A failed step is never "no such row". */
int mdb_q_step(mdb_q_t *q, const char *what);
/* Steps a statement that returns no rows: 0 or the SQ_* code. */
int mdb_q_run(mdb_q_t *q, const char *what);
int mdb_q_is_null(mdb_q_t *q, int i);
int64_t mdb_q_int64_at(mdb_q_t *q, int i);
int mdb_q_int_at(mdb_q_t *q, int i);
double mdb_q_double_at(mdb_q_t *q, int i);
const char *mdb_q_text_at(mdb_q_t *q, int i);
const void *mdb_q_blob_at(mdb_q_t *q, int i, size_t *len);
/* A JSON text column parsed (a new reference; JSON null for NULL or junk). */
json_t *mdb_q_json_at(mdb_q_t *q, int i);
int64_t mdb_q_changes(mdb_q_t *q);
/* Drops a statement's results early: a stepped sqlite statement holds its
 * read snapshot, a PostgreSQL one its result's memory. Accepts NULL. */
void mdb_q_reset(mdb_q_t *q);

/* Runs SQL without results (several statements allowed); on failure
 * records the detail and returns the SQ_* code. */
int mdb_exec(mdb_t *db, const char *sql);
/* Runs body in one write transaction: committed when body returns 0,
 * rolled back (keeping body's error detail) otherwise, and run again from
 * the start when PostgreSQL aborted it for a concurrent writer. */
int mdb_write(mdb_t *db, int (*body)(mdb_t *db, void *arg), void *arg);

/* not_on.c: a model's device kinds that cannot run it, {kind: reason}
 * (a new reference); and those of an upload stored (in its transaction). */
json_t *mdb__not_on_json(mdb_t *db, int64_t id);
int mdb__not_on_insert(mdb_t *db, int64_t id, json_t *not_on);

#endif
