#include "mdb_int.h"

#include <sq.h>

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Migrations, in order; migration i brings the schema from version i to i+1.
 * Never edit a released one: append, to both dialects' lists (the same
 * tables and columns; sqlite's INTEGER is 64-bit, so PostgreSQL's is
 * BIGINT). */
static const char *const sqlite_migrations[] = {
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
    /* 4: pipelines (complex queries), each its validated spec as JSON. */
    "CREATE TABLE pipelines ("
    "  name TEXT PRIMARY KEY,"
    "  spec TEXT NOT NULL,"
    "  created_at REAL NOT NULL"
    ");",
    /* 5: unloaded (Triton's model control: POST
     * /v2/repository/models/{m}/unload): kept, but served by no worker and
     * in no plan until loaded again; an operator's word, so it outlives a
     * restart and a takeover. */
    ("ALTER TABLE models ADD COLUMN unloaded INTEGER NOT NULL DEFAULT 0;"
     "ALTER TABLE pipelines ADD COLUMN unloaded INTEGER NOT NULL DEFAULT 0;"),
    /* 6: precision: the arithmetic a model's config asks its plans to run
     * in (fp32, tf32, fp16, bf16), and per device kind it was measured on,
     * the one its plan ran and how far its outputs were from an FP32
     * plan's. Every plan before ran FP32: their deviation is 0. */
    ("ALTER TABLE models ADD COLUMN precision_asked TEXT NOT NULL DEFAULT 'fp32';"
     "CREATE TABLE profile_precision ("
     "  model_id INTEGER NOT NULL REFERENCES models(id) ON DELETE CASCADE,"
     "  device_kind TEXT NOT NULL,"
     "  runs TEXT NOT NULL,"
     "  max_abs_deviation REAL NOT NULL," /* -1: not measured; +inf: not finite */
     "  max_rel_deviation REAL NOT NULL,"
     "  PRIMARY KEY (model_id, device_kind)"
     ");"
     "INSERT INTO profile_precision SELECT DISTINCT model_id, device_kind, 'fp32', 0, 0 "
     "FROM profiles;"),
    /* 7: a model's file in a table of its own. In the models row it came
     * before status, input and the rest, and sqlite stores a row's columns
     * in order, its overflow pages a chain: every read of a record (a
     * readiness probe, GET /models, the model list) walked the whole file
     * to reach the columns after it, 6.4 ms of squishd's CPU per
     * /v2/models/mobilenet_v2/ready (14 MB) against 0.1 for
     * /v2/health/live, and 50 probes a second doubled the profile measured
     * on the cpu worker beside it. */
    ("CREATE TABLE model_files ("
     "  model_id INTEGER PRIMARY KEY REFERENCES models(id) ON DELETE CASCADE,"
     "  onnx BLOB NOT NULL"
     ");"
     "INSERT INTO model_files SELECT id, onnx FROM models WHERE onnx IS NOT NULL;"
     "UPDATE models SET onnx = NULL;"
     "ALTER TABLE models DROP COLUMN onnx;"
     /* and the device kinds that cannot run a model, with the reason
      * (not_on.c): none known for the models stored before. */
     "CREATE TABLE model_not_on ("
     "  model_id INTEGER NOT NULL REFERENCES models(id) ON DELETE CASCADE,"
     "  device_kind TEXT NOT NULL,"
     "  reason TEXT NOT NULL,"
     "  PRIMARY KEY (model_id, device_kind)"
     ");"
     /* and what decoding a frame costs the gateway, so that a restart
      * plans its first frames as the later ones (decode_costs.c) */
     "CREATE TABLE decode_costs ("
     "  what TEXT PRIMARY KEY,"
     "  mean_ns REAL NOT NULL,"
     "  dev_ns REAL NOT NULL,"
     "  samples INTEGER NOT NULL"
     ");"),
    /* 8: a model file past MDB_FILE_CHUNK_BYTES goes on in rows of this
     * table (model_files holds its first piece): one blob is at most
     * SQLITE_MAX_LENGTH, 1e9 bytes by default. */
    "CREATE TABLE model_file_chunks ("
    "  model_id INTEGER NOT NULL REFERENCES models(id) ON DELETE CASCADE,"
    "  seq INTEGER NOT NULL,"
    "  data BLOB NOT NULL,"
    "  PRIMARY KEY (model_id, seq)"
    ");",
};

/* The same schema in PostgreSQL's dialect. Where sqlite has an implicit
 * rowid that the SQL orders or deletes by (placements, group_profiles),
 * PostgreSQL has a BIGSERIAL column of that name. Names and device kinds
 * sort by bytes (COLLATE "C"), as sqlite's do, whatever the cluster's
 * locale. */
static const char *const pg_migrations[] = {
    /* 0 -> 1 */
    "CREATE TABLE models ("
    "  id BIGSERIAL PRIMARY KEY,"
    "  name TEXT COLLATE \"C\" NOT NULL,"
    "  version BIGINT NOT NULL,"
    "  sha256 TEXT NOT NULL,"
    "  created_at DOUBLE PRECISION NOT NULL,"
    "  format TEXT NOT NULL CHECK (format IN ('onnx', 'emulated')),"
    "  onnx BYTEA,"
    "  input_name TEXT,"
    "  input TEXT,"
    "  input_layout TEXT,"
    "  preprocess TEXT NOT NULL,"
    "  labels TEXT,"
    "  default_slo_ms DOUBLE PRECISION NOT NULL,"
    "  max_batch BIGINT NOT NULL,"
    "  outputs TEXT NOT NULL,"
    "  param_bytes BIGINT NOT NULL DEFAULT 0,"
    "  memory_bytes BIGINT NOT NULL DEFAULT 0,"
    "  input_spec TEXT NOT NULL DEFAULT '',"
    "  config TEXT NOT NULL,"
    "  status TEXT NOT NULL CHECK (status IN ('profiling', 'ready', 'failed')),"
    "  error TEXT,"
    "  UNIQUE (name, version)"
    ");"
    /* A model file is weights, which do not compress: stored out of line
     * as it is, without a pglz attempt over hundreds of megabytes. */
    "ALTER TABLE models ALTER COLUMN onnx SET STORAGE EXTERNAL;"
    "CREATE TABLE model_nodes ("
    "  model_id BIGINT NOT NULL REFERENCES models(id) ON DELETE CASCADE,"
    "  idx BIGINT NOT NULL,"
    "  op TEXT NOT NULL,"
    "  output TEXT NOT NULL,"
    "  prefix_hash TEXT NOT NULL,"
    "  ancestors BIGINT NOT NULL,"
    "  cut_ok BIGINT NOT NULL,"
    "  PRIMARY KEY (model_id, idx)"
    ");"
    "CREATE INDEX model_nodes_hash ON model_nodes(prefix_hash);"
    "CREATE TABLE prefix_groups ("
    "  id BIGSERIAL PRIMARY KEY,"
    "  prefix_hash TEXT NOT NULL UNIQUE,"
    "  input_spec TEXT NOT NULL"
    ");"
    "CREATE TABLE prefix_members ("
    "  group_id BIGINT NOT NULL REFERENCES prefix_groups(id) ON DELETE CASCADE,"
    "  model_id BIGINT NOT NULL REFERENCES models(id) ON DELETE CASCADE,"
    "  cut_tensor TEXT NOT NULL,"
    "  cut_node BIGINT NOT NULL,"
    "  PRIMARY KEY (group_id, model_id)"
    ");"
    "CREATE TABLE profiles ("
    "  model_id BIGINT NOT NULL REFERENCES models(id) ON DELETE CASCADE,"
    "  device_kind TEXT COLLATE \"C\" NOT NULL,"
    "  device_name TEXT NOT NULL,"
    "  batch BIGINT NOT NULL,"
    "  latency_mean_us DOUBLE PRECISION NOT NULL,"
    "  latency_std_us DOUBLE PRECISION NOT NULL,"
    "  peak_memory_bytes BIGINT NOT NULL,"
    "  preprocess_us DOUBLE PRECISION NOT NULL DEFAULT 0,"
    "  PRIMARY KEY (model_id, device_kind, batch)"
    ");"
    "CREATE TABLE plans ("
    "  epoch BIGINT PRIMARY KEY,"
    "  created_at DOUBLE PRECISION NOT NULL,"
    "  reason TEXT NOT NULL,"
    "  plan TEXT NOT NULL"
    ");"
    "CREATE TABLE placements ("
    "  epoch BIGINT NOT NULL REFERENCES plans(epoch) ON DELETE CASCADE,"
    "  device TEXT NOT NULL,"
    "  model_id BIGINT NOT NULL,"
    "  slo_ms DOUBLE PRECISION NOT NULL,"
    "  batch BIGINT NOT NULL,"
    "  duty_cycle_us DOUBLE PRECISION NOT NULL,"
    "  rate_rps DOUBLE PRECISION NOT NULL,"
    "  rowid BIGSERIAL PRIMARY KEY"
    ");"
    "CREATE INDEX placements_epoch ON placements(epoch);",
    /* 2 */
    "CREATE TABLE group_profiles ("
    "  members TEXT NOT NULL,"
    "  device_kind TEXT NOT NULL,"
    "  device_name TEXT NOT NULL,"
    "  rows TEXT NOT NULL,"
    "  created_at DOUBLE PRECISION NOT NULL,"
    "  rowid BIGSERIAL UNIQUE,"
    "  PRIMARY KEY (members, device_kind)"
    ");",
    /* 3: ids are never handed out again: models.id's sequence never goes
     * back (and is safe for concurrent writers, unlike a MAX + 1); it starts
     * after every id the stored plans still name. */
    "SELECT setval(pg_get_serial_sequence('models', 'id'),"
    "  GREATEST(COALESCE((SELECT MAX(id) FROM models), 0),"
    "           COALESCE((SELECT MAX(model_id) FROM placements), 0),"
    "           (SELECT last_value FROM models_id_seq WHERE is_called)) + 1, false);"
    "DELETE FROM group_profiles;"
    "ALTER TABLE group_profiles ADD COLUMN member_shas TEXT NOT NULL DEFAULT '';",
    /* 4 */
    "CREATE TABLE pipelines ("
    "  name TEXT COLLATE \"C\" PRIMARY KEY,"
    "  spec TEXT NOT NULL,"
    "  created_at DOUBLE PRECISION NOT NULL"
    ");",
    /* 5 */
    ("ALTER TABLE models ADD COLUMN unloaded BIGINT NOT NULL DEFAULT 0;"
     "ALTER TABLE pipelines ADD COLUMN unloaded BIGINT NOT NULL DEFAULT 0;"),
    /* 6 */
    ("ALTER TABLE models ADD COLUMN precision_asked TEXT NOT NULL DEFAULT 'fp32';"
     "CREATE TABLE profile_precision ("
     "  model_id BIGINT NOT NULL REFERENCES models(id) ON DELETE CASCADE,"
     "  device_kind TEXT COLLATE \"C\" NOT NULL,"
     "  runs TEXT NOT NULL,"
     "  max_abs_deviation DOUBLE PRECISION NOT NULL,"
     "  max_rel_deviation DOUBLE PRECISION NOT NULL,"
     "  PRIMARY KEY (model_id, device_kind)"
     ");"
     "INSERT INTO profile_precision SELECT DISTINCT model_id, device_kind, 'fp32', 0, 0 "
     "FROM profiles;"),
    /* 7 (PostgreSQL kept the file out of line already, STORAGE EXTERNAL:
     * the same table as on sqlite, so that the SQL is written once) */
    ("CREATE TABLE model_files ("
     "  model_id BIGINT PRIMARY KEY REFERENCES models(id) ON DELETE CASCADE,"
     "  onnx BYTEA NOT NULL"
     ");"
     "ALTER TABLE model_files ALTER COLUMN onnx SET STORAGE EXTERNAL;"
     "INSERT INTO model_files SELECT id, onnx FROM models WHERE onnx IS NOT NULL;"
     "ALTER TABLE models DROP COLUMN onnx;"
     "CREATE TABLE model_not_on ("
     "  model_id BIGINT NOT NULL REFERENCES models(id) ON DELETE CASCADE,"
     "  device_kind TEXT COLLATE \"C\" NOT NULL,"
     "  reason TEXT NOT NULL,"
     "  PRIMARY KEY (model_id, device_kind)"
     ");"
     "CREATE TABLE decode_costs ("
     "  what TEXT COLLATE \"C\" PRIMARY KEY,"
     "  mean_ns DOUBLE PRECISION NOT NULL,"
     "  dev_ns DOUBLE PRECISION NOT NULL,"
     "  samples BIGINT NOT NULL"
     ");"),
    /* 8 (a bytea value is at most 1 GB) */
    ("CREATE TABLE model_file_chunks ("
     "  model_id BIGINT NOT NULL REFERENCES models(id) ON DELETE CASCADE,"
     "  seq BIGINT NOT NULL,"
     "  data BYTEA NOT NULL,"
     "  PRIMARY KEY (model_id, seq)"
     ");"
     "ALTER TABLE model_file_chunks ALTER COLUMN data SET STORAGE EXTERNAL;"),
};

_Static_assert(sizeof(sqlite_migrations) / sizeof(sqlite_migrations[0]) == MDB_SCHEMA_VERSION,
               "one migration per schema version");
_Static_assert(sizeof(pg_migrations) / sizeof(pg_migrations[0]) == MDB_SCHEMA_VERSION,
               "one migration per schema version, in both dialects");

const char *mdb_errmsg(const mdb_t *db)
{
    return db ? db->errmsg : "no database handle";
}

int mdb_schema_version(mdb_t *db)
{
    static const char sql[] = "SELECT version FROM schema_version";
    mdb_q_t *q = mdb_q(db, sql);
    int v = mdb_q_step(q, "read schema version") == 1 ? mdb_q_int_at(q, 0) : -1;
    mdb_q_reset(q);
    return v;
}

/* The schema_version table, in the migrations' transaction. On PostgreSQL
 * several squishd may start at once on one database: a transaction-level
 * advisory lock (a two-key one, apart from the one-key space that
 * mdb_leader_try's callers use) makes them migrate one after the other. */
static const char sqlite_migrate_begin[] =
    "BEGIN IMMEDIATE;"
    "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL);"
    "INSERT INTO schema_version SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM schema_version);";
static const char pg_migrate_begin[] =
    "BEGIN;"
    "SELECT pg_advisory_xact_lock(1936684393, 1);" /* 'squi', migrations */
    "CREATE TABLE IF NOT EXISTS schema_version (version BIGINT NOT NULL);"
    "INSERT INTO schema_version SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM schema_version);";

static int rollback_keep(mdb_t *db, int rc)
{
    char keep[sizeof(db->errmsg)];
    snprintf(keep, sizeof(keep), "%s", db->errmsg);
    mdb_exec(db, "ROLLBACK");
    snprintf(db->errmsg, sizeof(db->errmsg), "%s", keep);
    return rc;
}

static int migrate(mdb_t *db)
{
    const char *const *migrations = db->dialect == MDB_PG ? pg_migrations : sqlite_migrations;
    int rc = mdb_exec(db, mdb_sql(db, sqlite_migrate_begin, pg_migrate_begin));
    if (rc < 0)
        return rc;
    int v = mdb_schema_version(db);
    if (v < 0)
        return rollback_keep(db, SQ_DB);
    if (v > MDB_SCHEMA_VERSION) {
        snprintf(db->errmsg, sizeof(db->errmsg),
                 "database schema version %d is newer than this build's %d", v, MDB_SCHEMA_VERSION);
        return rollback_keep(db, SQ_DB);
    }
    for (; v < MDB_SCHEMA_VERSION; v++) {
        if ((rc = mdb_exec(db, migrations[v])) < 0) {
            char keep[sizeof(db->errmsg)];
            snprintf(keep, sizeof(keep), "%s", db->errmsg);
            mdb_exec(db, "ROLLBACK");
            snprintf(db->errmsg, sizeof(db->errmsg), "migration %d: %.480s", v + 1, keep);
            return SQ_DB;
        }
    }
    char sql[96];
    snprintf(sql, sizeof(sql), "UPDATE schema_version SET version = %d; COMMIT;",
             MDB_SCHEMA_VERSION);
    if ((rc = mdb_exec(db, sql)) < 0)
        return rollback_keep(db, rc);
    return 0;
}

int mdb_open(const char *target, mdb_t **out)
{
    mdb_t *db = sq_xcalloc(1, sizeof(*db));
    db->file_chunk_bytes = MDB_FILE_CHUNK_BYTES;
    *out = db;
    int rc = mdb_sql_open(db, target);
    if (rc < 0)
        return rc;
    return migrate(db);
}

void mdb_close(mdb_t *db)
{
    if (db == NULL)
        return;
    if (db->ops != NULL)
        mdb_sql_close(db);
    free(db);
}

int mdb_check(mdb_t *db)
{
    /* sqlite checks the file; a PostgreSQL server keeps its own pages, and
     * an answer is what there is to check. */
    static const char sqlite_sql[] = "PRAGMA quick_check";
    static const char pg_sql[] = "SELECT 'ok'";
    mdb_q_t *q = mdb_q(db, mdb_sql(db, sqlite_sql, pg_sql));
    int step = mdb_q_step(q, "quick_check");
    if (step < 0)
        return step;
    const char *t = step == 1 ? mdb_q_text_at(q, 0) : NULL;
    int ok = t != NULL && strcmp(t, "ok") == 0;
    if (!ok)
        snprintf(db->errmsg, sizeof(db->errmsg), "quick_check: %s", t ? t : "?");
    mdb_q_reset(q);
    return ok ? 0 : SQ_DB;
}
