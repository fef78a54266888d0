/* modeldb internals shared by its source files. */
#ifndef MDB_INT_H
#define MDB_INT_H

#include "mdb.h"

#include <sqlite3.h>

#define MDB_MAX_STMTS 64

struct mdb {
    sqlite3 *sql;
    char errmsg[512];
    /* Prepared statements, keyed by the address of their (static) SQL text. */
    struct mdb_stmt_cache {
        const char *sql;
        sqlite3_stmt *st;
    } stmts[MDB_MAX_STMTS];
    int nstmts;
};

/* The cached prepared statement for a static SQL string, reset and with
 * bindings cleared; NULL on a prepare error (recorded on the handle). */
sqlite3_stmt *mdb_stmt(mdb_t *db, const char *sql);

/* Records "what: sqlite's message" on the handle. */
void mdb_set_error(mdb_t *db, const char *what);
/* Runs SQL without results; on failure records sqlite's message. */
int mdb_exec(mdb_t *db, const char *sql);

#endif
