#include "mdb_int.h"

#include <sq.h>

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Migrations, in order; migration i brings the schema from version i to i+1.
 * Never edit a released one: append. */
static const char *const migrations[] = {
    /* 0 -> 1: the first schema. */
    "CREATE TABLE models ("
    "  id INTEGER PRIMARY KEY,"
    "  name TEXT NOT NULL,"
    "  version INTEGER NOT NULL,"
    "  sha256 TEXT NOT NULL,"
    "  created_at REAL NOT NULL,"
    "  format TEXT NOT NULL CHECK (format IN ('onnx', 'emulated')),"
    "  onnx BLOB,"
    "  input_name TEXT,"
    "  input TEXT,"               /* JSON {name, datatype, shape}, -1 for the batch */
    "  input_layout TEXT,"        /* NCHW */
    "  preprocess TEXT NOT NULL," /* JSON: resize, mean, std, channel order */
    "  labels TEXT,"              /* JSON array */
    "  default_slo_ms REAL NOT NULL,"
    "  max_batch INTEGER NOT NULL,"
    "  outputs TEXT NOT NULL," /* JSON array of {name, datatype, shape} */
    "  param_bytes INTEGER NOT NULL DEFAULT 0,"
    "  memory_bytes INTEGER NOT NULL DEFAULT 0,"
    "  input_spec TEXT NOT NULL DEFAULT ''," /* input + preprocess, canonical JSON */
    "  config TEXT NOT NULL,"                /* the config JSON as given, for the record */
    "  status TEXT NOT NULL CHECK (status IN ('profiling', 'ready', 'failed')),"
    "  error TEXT,"
    "  UNIQUE (name, version)"
    ");"
    "CREATE TABLE model_nodes ("
    "  model_id INTEGER NOT NULL REFERENCES models(id) ON DELETE CASCADE,"
    "  idx INTEGER NOT NULL,"
    "  op TEXT NOT NULL,"
    "  output TEXT NOT NULL,"
    "  prefix_hash TEXT NOT NULL,"
    "  ancestors INTEGER NOT NULL,"
    "  cut_ok INTEGER NOT NULL,"
    "  PRIMARY KEY (model_id, idx)"
    ");"
    "CREATE INDEX model_nodes_hash ON model_nodes(prefix_hash);"
    "CREATE TABLE prefix_groups ("
    "  id INTEGER PRIMARY KEY,"
    "  prefix_hash TEXT NOT NULL UNIQUE,"
    "  input_spec TEXT NOT NULL"
    ");"
    "CREATE TABLE prefix_members ("
    "  group_id INTEGER NOT NULL REFERENCES prefix_groups(id) ON DELETE CASCADE,"
    "  model_id INTEGER NOT NULL REFERENCES models(id) ON DELETE CASCADE,"
    "  cut_tensor TEXT NOT NULL,"
    "  cut_node INTEGER NOT NULL,"
    "  PRIMARY KEY (group_id, model_id)"
    ");"
    "CREATE TABLE profiles ("
    "  model_id INTEGER NOT NULL REFERENCES models(id) ON DELETE CASCADE,"
    "  device_kind TEXT NOT NULL,"
    "  device_name TEXT NOT NULL,"
    "  batch INTEGER NOT NULL,"
    "  latency_mean_us REAL NOT NULL,"
    "  latency_std_us REAL NOT NULL,"
    "  peak_memory_bytes INTEGER NOT NULL,"
    "  preprocess_us REAL NOT NULL DEFAULT 0,"
    "  PRIMARY KEY (model_id, device_kind, batch)"
    ");"
    "CREATE TABLE plans ("
    "  epoch INTEGER PRIMARY KEY,"
    "  created_at REAL NOT NULL,"
    "  reason TEXT NOT NULL,"
    "  plan TEXT NOT NULL" /* the plan JSON as /v1/plan serves it */
    ");"
    "CREATE TABLE placements ("
    "  epoch INTEGER NOT NULL REFERENCES plans(epoch) ON DELETE CASCADE,"
    "  device TEXT NOT NULL,"
    "  model_id INTEGER NOT NULL,"
    "  slo_ms REAL NOT NULL,"
    "  batch INTEGER NOT NULL,"
    "  duty_cycle_us REAL NOT NULL,"
    "  rate_rps REAL NOT NULL"
    ");"
    "CREATE INDEX placements_epoch ON placements(epoch);",
    /* 2: the measured profiles of prefix groups, by the identity of their
     * members (their files and cuts), so that a restart need not measure
     * them again. */
    "CREATE TABLE group_profiles ("
    "  members TEXT NOT NULL,"
    "  device_kind TEXT NOT NULL,"
    "  device_name TEXT NOT NULL,"
    "  rows TEXT NOT NULL," /* [[batch, mean_us, std_us, peak_memory_bytes], ...] */
    "  created_at REAL NOT NULL,"
    "  PRIMARY KEY (members, device_kind)"
    ");",
    /* 3: a model version's id is never handed out again after a delete (it
     * is the key squishd and its workers name the model by; a reused one
     * could meet answers, and stored placements, meant for the deleted
     * model). The last id ever used; a trigger keeps it up to date whatever
     * inserts a row. */
    "CREATE TABLE model_id_seq (last INTEGER NOT NULL);"
    "INSERT INTO model_id_seq SELECT MAX(COALESCE((SELECT MAX(id) FROM models), 0),"
    "                                    COALESCE((SELECT MAX(model_id) FROM placements), 0));"
    "CREATE TRIGGER models_id_seq AFTER INSERT ON models BEGIN"
    "  UPDATE model_id_seq SET last = MAX(last, NEW.id);"
    "END;"
    /* and a group profile names its members' files, so that it goes when
     * one of them does (rows stored before could not say: measured again). */
    "DELETE FROM group_profiles;"
    "ALTER TABLE group_profiles ADD COLUMN member_shas TEXT NOT NULL DEFAULT '';",
};

_Static_assert(sizeof(migrations) / sizeof(migrations[0]) == MDB_SCHEMA_VERSION,
               "one migration per schema version");

void mdb_set_error(mdb_t *db, const char *what)
{
    snprintf(db->errmsg, sizeof(db->errmsg), "%s: %s", what,
             db->sql ? sqlite3_errmsg(db->sql) : "no database");
}

const char *mdb_errmsg(const mdb_t *db)
{
    return db ? db->errmsg : "no database handle";
}

int mdb_exec(mdb_t *db, const char *sql)
{
    char *err = NULL;
    if (sqlite3_exec(db->sql, sql, NULL, NULL, &err) != SQLITE_OK) {
        snprintf(db->errmsg, sizeof(db->errmsg), "%s", err ? err : "sqlite3_exec failed");
        sqlite3_free(err);
        return SQ_DB;
    }
    return 0;
}

int mdb_schema_version(mdb_t *db)
{
    sqlite3_stmt *st;
    int v = -1;
    if (sqlite3_prepare_v2(db->sql, "SELECT version FROM schema_version", -1, &st, NULL) !=
        SQLITE_OK)
        return -1;
    if (sqlite3_step(st) == SQLITE_ROW)
        v = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    return v;
}

static int migrate(mdb_t *db)
{
    int rc = mdb_exec(db, "BEGIN IMMEDIATE;"
                          "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL);"
                          "INSERT INTO schema_version SELECT 0 WHERE NOT EXISTS "
                          "(SELECT 1 FROM schema_version);");
    if (rc < 0)
        return rc;
    int v = mdb_schema_version(db);
    if (v < 0 || v > MDB_SCHEMA_VERSION) {
        snprintf(db->errmsg, sizeof(db->errmsg),
                 "database schema version %d is newer than this build's %d", v, MDB_SCHEMA_VERSION);
        mdb_exec(db, "ROLLBACK");
        return SQ_DB;
    }
    for (; v < MDB_SCHEMA_VERSION; v++) {
        if ((rc = mdb_exec(db, migrations[v])) < 0) {
            char keep[sizeof(db->errmsg)];
            snprintf(keep, sizeof(keep), "%s", db->errmsg);
            mdb_exec(db, "ROLLBACK");
            snprintf(db->errmsg, sizeof(db->errmsg), "migration %d: %s", v + 1, keep);
            return rc;
        }
    }
    char sql[96];
    snprintf(sql, sizeof(sql), "UPDATE schema_version SET version = %d; COMMIT;",
             MDB_SCHEMA_VERSION);
    if ((rc = mdb_exec(db, sql)) < 0)
        mdb_exec(db, "ROLLBACK");
    return rc;
}

int mdb_open(const char *path, mdb_t **out)
{
    mdb_t *db = sq_xcalloc(1, sizeof(*db));
    *out = db;
    int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX;
    if (sqlite3_open_v2(path, &db->sql, flags, NULL) != SQLITE_OK) {
        mdb_set_error(db, path);
        return SQ_DB;
    }
    sqlite3_busy_timeout(db->sql, 5000);
    int rc = mdb_exec(db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"
                          "PRAGMA foreign_keys=ON;");
    if (rc < 0)
        return rc;
    return migrate(db);
}

sqlite3_stmt *mdb_stmt(mdb_t *db, const char *sql)
{
    for (int i = 0; i < db->nstmts; i++) {
        if (db->stmts[i].sql == sql) {
            sqlite3_reset(db->stmts[i].st);
            sqlite3_clear_bindings(db->stmts[i].st);
            return db->stmts[i].st;
        }
    }
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(db->sql, sql, -1, &st, NULL) != SQLITE_OK) {
        mdb_set_error(db, "prepare");
        return NULL;
    }
    /* The SQL texts are the static strings of this module: a full cache
     * is a bug (raise MDB_MAX_STMTS). */
    assert(db->nstmts < MDB_MAX_STMTS);
    db->stmts[db->nstmts++] = (struct mdb_stmt_cache){sql, st};
    return st;
}

void mdb_close(mdb_t *db)
{
    if (db == NULL)
        return;
    for (int i = 0; i < db->nstmts; i++)
        sqlite3_finalize(db->stmts[i].st);
    sqlite3_close(db->sql);
    free(db);
}

int mdb_check(mdb_t *db)
{
    sqlite3_stmt *st;
    int ok = 0;
    if (sqlite3_prepare_v2(db->sql, "PRAGMA quick_check", -1, &st, NULL) != SQLITE_OK) {
        mdb_set_error(db, "quick_check");
        return SQ_DB;
    }
    if (sqlite3_step(st) == SQLITE_ROW) {
        const unsigned char *t = sqlite3_column_text(st, 0);
        ok = t != NULL && strcmp((const char *)t, "ok") == 0;
        if (!ok)
            snprintf(db->errmsg, sizeof(db->errmsg), "quick_check: %s", t ? (const char *)t : "?");
    }
    sqlite3_finalize(st);
    return ok ? 0 : SQ_DB;
}
