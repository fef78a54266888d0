/* modeldb internals shared by its source files. */
#ifndef MDB_INT_H
#define MDB_INT_H

#include "mdb.h"

#include <sqlite3.h>

struct mdb {
    sqlite3 *sql;
    char errmsg[512];
};

/* Records "what: sqlite's message" on the handle. */
void mdb_set_error(mdb_t *db, const char *what);
/* Runs SQL without results; on failure records sqlite's message. */
int mdb_exec(mdb_t *db, const char *sql);

#endif
