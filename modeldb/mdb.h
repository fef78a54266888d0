/* modeldb: squish's persistent state on sqlite (WAL): models, their graph
 * facts and profiles, plans. Every write is one transaction, so that a crash
 * or a failed upload leaves nothing half-written.
 *
 * A handle is used by one thread at a time (squishd owns it on its DB
 * thread; the HTTP loop never touches sqlite). Detail of the last error is
 * on the handle (mdb_errmsg), never in a global. */
#ifndef MDB_H
#define MDB_H

#include <stdint.h>

typedef struct mdb mdb_t;

/* The schema version this build writes; older files are migrated on open. */
#define MDB_SCHEMA_VERSION 1

/* Opens (creating if needed) the database at path, enables WAL and foreign
 * keys, and runs the migrations. Returns 0 and sets *out, or a negative SQ_*
 * error; on error *out is still set (when memory allowed) so that the caller
 * can read mdb_errmsg, and must be closed. */
int mdb_open(const char *path, mdb_t **out);
/* Accepts NULL. */
void mdb_close(mdb_t *db);
/* The detail of the last failure on this handle ("" if none). */
const char *mdb_errmsg(const mdb_t *db);
/* The schema_version stored in the file. */
int mdb_schema_version(mdb_t *db);
/* Runs PRAGMA quick_check; returns 0 when the file is consistent. */
int mdb_check(mdb_t *db);

#endif
