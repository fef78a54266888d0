/* modeldb: squish's persistent state: models, their graph facts and
 * profiles, plans. On sqlite (WAL, the embedded default: one file) or on
 * PostgreSQL through libpq (a database that several squishd can share),
 * with the same schema, migrations and behaviour. Every write is one
 * transaction, so that a crash or a failed upload leaves nothing
 * half-written; on PostgreSQL a write that a concurrent writer invalidated
 * is run again (serializable isolation).
 *
 * A handle is one connection, used by one thread at a time (squishd owns it
 * on its DB thread; the HTTP loop never touches the database). Detail of
 * the last error is on the handle (mdb_errmsg), never in a global. */
#ifndef MDB_H
#define MDB_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

typedef struct mdb mdb_t;
struct mdb_graph;

/* The schema version this build writes; older files are migrated on open. */
#define MDB_SCHEMA_VERSION 8

/* Whether target names a PostgreSQL database: a URI (postgresql://...,
 * postgres://...) or a key=value conninfo ("host=/run/pg dbname=squish");
 * anything else is a sqlite file name. */
int mdb_is_postgres(const char *target);
/* target as logs may show it: a PostgreSQL conninfo without its password. */
void mdb_target_describe(const char *target, char *out, size_t outlen);

/* Opens the database target names (mdb_is_postgres): a sqlite file is
 * created if needed and put in WAL mode with foreign keys on; a PostgreSQL
 * database must exist (its tables are created). Runs the migrations.
 * Returns 0 and sets *out, or a negative SQ_* error; on error *out is still
 * set (when memory allowed) so that the caller can read mdb_errmsg, and
 * must be closed. */
int mdb_open(const char *target, mdb_t **out);
/* Accepts NULL. */
void mdb_close(mdb_t *db);
/* The detail of the last failure on this handle ("" if none). */
const char *mdb_errmsg(const mdb_t *db);
/* "sqlite" or "postgresql". */
const char *mdb_backend(const mdb_t *db);
/* The schema_version stored in the database. */
int mdb_schema_version(mdb_t *db);
/* sqlite: PRAGMA quick_check; PostgreSQL: an answer. 0 when consistent. */
int mdb_check(mdb_t *db);

/* A cheap liveness check: 0 when the connection works; on PostgreSQL a
 * broken one is reconnected (PQreset), which returns 1: a new session, in
 * which session state such as mdb_leader_try's lock is gone. SQ_DB when
 * the server cannot be reached. sqlite: always 0. */
int mdb_ping(mdb_t *db);

/* Leadership among squishd sharing one database: on PostgreSQL a
 * session-level advisory lock on lock_key (pg_try_advisory_lock), held as
 * long as this handle's connection lives, so the caller must keep a
 * dedicated handle for it and call again from time to time: a broken
 * connection is reconnected (mdb_ping) and the lock tried again, and
 * *is_leader says whether it is held now. Closing the handle releases it.
 * sqlite (one host): always the leader. 0, or SQ_DB with *is_leader 0. */
int mdb_leader_try(mdb_t *db, int64_t lock_key, int *is_leader);
/* The leader names itself on its leadership handle (PostgreSQL: the
 * session's application_name, "squishd ADDRESS", at most 63 bytes), and
 * anyone reads the name of the session that holds lock_key: standbys tell
 * clients where the leader is. who: 0, or SQ_NOT_FOUND when nobody holds
 * it (always on sqlite). Both survive reconnects of the handle. */
int mdb_leader_announce(mdb_t *db, const char *address);
int mdb_leader_who(mdb_t *db, int64_t lock_key, char *out, size_t outlen);
/* PostgreSQL: the server ends this handle's session when its peer is
 * silent for about dead_after_ms (TCP keepalives and user timeout; a
 * leader's host cut off loses its lock within that). sqlite: nothing. */
int mdb_session_timeouts(mdb_t *db, int dead_after_ms);

/* Lowercase hex SHA-256 of data into out (65 bytes): the identity of a
 * model file, in the DB and on the worker protocol alike. */
void mdb_sha256_hex(const void *data, size_t len, char out[65]);
/* The same digest over bytes that arrive in pieces (a worker hashes each
 * chunk of a model file as it comes in, instead of stalling on the whole
 * file at the end). mdb_sha256_end writes the hex and frees the state;
 * mdb_sha256_free drops an unfinished one (accepts NULL). */
typedef struct mdb_sha256 mdb_sha256_t;
mdb_sha256_t *mdb_sha256_begin(void);
void mdb_sha256_update(mdb_sha256_t *h, const void *data, size_t len);
void mdb_sha256_end(mdb_sha256_t *h, char out[65]);
void mdb_sha256_free(mdb_sha256_t *h);

/* ---- models (models.c) ------------------------------------------------ */

#define MDB_NAME_MAX 64

/* One profile row: the latency of a batch on a device kind. */
typedef struct {
    int batch;
    double mean_us;
    double std_us;
    uint64_t peak_memory_bytes;
} mdb_profile_row_t;

/* A model's file is stored in pieces of at most this many bytes (each a
 * row, in order): sqlite refuses a blob past SQLITE_MAX_LENGTH (1e9 bytes
 * by default) and PostgreSQL a bytea value past 1 GB. */
#define MDB_FILE_CHUNK_BYTES ((size_t)256 << 20)

/* A piece of a model file, borrowed. */
typedef struct {
    const void *data;
    size_t len;
} mdb_span_t;

/* A model version to store. JSON values are borrowed. */
typedef struct {
    const char *name;
    int version;
    const char *format; /* "onnx" or "emulated" */
    /* The file (onnx format) as pieces stored one after the other (a
     * bundle: its table, the .onnx and its data files, as the upload holds
     * them, never copied into one buffer; a plain .onnx is one span); none
     * for an emulated model. */
    const mdb_span_t *onnx_spans;
    int n_onnx_spans;
    const char *sha256; /* hex of the ONNX bytes, or of the config for emulated */
    json_t *input;      /* {"name", "datatype", "shape"} with -1 for the batch */
    json_t *outputs;    /* [{"name", "datatype", "shape"}] */
    json_t *preprocess; /* {"resize", "mean", "std", "channel_order"} */
    json_t *labels;     /* array of strings */
    json_t *config;     /* as given */
    /* The precision the config asks for: "fp32", "tf32", "fp16", "bf16";
     * NULL is "fp32". */
    const char *precision;
    /* {device kind: why its backend cannot run the model} (the importer's
     * mdb_model_info not_on); NULL: none. */
    json_t *not_on;
    double default_slo_ms;
    int max_batch;
    uint64_t param_bytes;
    uint64_t memory_bytes;
    const char *status; /* "profiling", "ready" or "failed" */
    /* For ONNX models: the imported graph, whose node signatures are stored
     * and matched against stored models for shared prefixes. */
    const struct mdb_graph *graph;
    /* A given profile (emulated models): rows for profile_device_kind, which
     * runs FP32 (its precision row says so, with deviation 0). */
    const mdb_profile_row_t *profile;
    int nprofile;
    const char *profile_device_kind;
} mdb_new_model_t;

/* Stores a model version in one transaction: the row, its node signatures,
 * its shared-prefix group memberships and any given profile. Returns 0 and
 * the row id, SQ_EXISTS when (name, version) is taken, or SQ_DB. */
int mdb_model_insert(mdb_t *db, const mdb_new_model_t *m, int64_t *id_out);

/* {"name", "versions": [record...]} for every version of name, newest
 * last; SQ_MODEL_NOT_FOUND when there is none. A record is
 * {"version", "sha256", "created_at", "format", "status", "error",
 *  "input", "outputs", "preprocess", "labels_count", "default_slo_ms",
 *  "max_batch", "param_bytes", "memory_bytes", "profile", "prefix_group",
 *  "precision": {"asked", "devices": [{"device_kind", "runs",
 *  "max_abs_deviation", "max_rel_deviation"}]} (a deviation is null when
 *  not measured or not finite), "version_policy" (only when its upload's
 *  config gave one), "detections"
 *  (an emulated detector's, likewise), "unloaded": true (only when it is,
 *  mdb_model_set_unloaded)}. */
int mdb_model_get(mdb_t *db, const char *name, json_t **out);
/* The record of one version (0: the newest). */
int mdb_model_version_get(mdb_t *db, const char *name, int version, json_t **out);
/* {"models": [{"name", "versions": [n...], "latest": {status, format},
 * "unloaded": true (only when it is)}]}. */
int mdb_model_list(mdb_t *db, json_t **out);
/* The labels array of a version (new reference). */
int mdb_model_labels(mdb_t *db, const char *name, int version, json_t **out);
/* Deletes one version (version > 0) or every version of name, with their
 * nodes, profiles and group memberships, in one transaction; groups left
 * with fewer than two members are removed. *deleted counts versions. */
int mdb_model_delete(mdb_t *db, const char *name, int version, int *deleted);
/* Every stored version (key 0) or the one with that row id, as records
 * with their "id" (the model key), "name" and the full "labels" array added. */
int mdb_model_records(mdb_t *db, int64_t key, json_t **out);
/* A malloc'd copy of a model's ONNX bytes (the caller frees). SQ_NOT_FOUND
 * for an emulated model. */
int mdb_model_blob(mdb_t *db, int64_t key, void **bytes, size_t *len);
/* ---- plans ------------------------------------------------------------ */

/* Stores one epoch's plan (the /v1/plan JSON) and its placements
 * ([{"device", "model_id", "slo_ms", "batch", "duty_cycle_us", "rate_rps"}])
 * in one transaction. */
int mdb_plan_store(mdb_t *db, long long epoch, const char *reason, const char *plan_json,
                   json_t *placements);
/* The newest stored epoch, 0 when none. */
long long mdb_plan_last_epoch(mdb_t *db);
/* The newest stored plan, for squishd to reapply at start: its epoch, the
 * plan JSON as stored and its placements (as given to mdb_plan_store, in
 * that order), new references. With no plan stored: 0, *epoch 0, *plan
 * NULL and an empty array. SQ_DB on a read error or a stored plan that is
 * not a JSON object (nothing is returned then). */
int mdb_plan_last(mdb_t *db, long long *epoch, json_t **plan, json_t **placements);

/* ---- pipelines --------------------------------------------------------- */

/* Stores a pipeline's spec (a JSON object the gateway validated) under its
 * name; replace 0 refuses an existing name with SQ_EXISTS, 1 overwrites
 * (and loads it: a spec published again is served). */
int mdb_pipeline_put(mdb_t *db, const char *name, json_t *spec, int replace);
/* Every stored pipeline: [{"name", "spec", "created_at", "unloaded"}] by
 * name, new reference. */
int mdb_pipeline_list(mdb_t *db, json_t **out);
/* Removes one; SQ_NOT_FOUND when there is none by that name. */
int mdb_pipeline_delete(mdb_t *db, const char *name);

/* Prefix groups' measured profiles, keyed by `members` (a digest of the
 * members' files and cuts that the caller computes) and device kind.
 * member_shas lists the members' file sha256s, space-separated: a profile
 * is removed with the last model holding any of them (mdb_model_delete).
 * store replaces; get returns 0 with *rows (malloc'd, caller frees) and
 * *nrows, SQ_NOT_FOUND when none is stored, SQ_DB on errors. */
int mdb_group_profile_store(mdb_t *db, const char *members, const char *member_shas,
                            const char *device_kind, const char *device_name,
                            const mdb_profile_row_t *rows, int nrows);
int mdb_group_profile_get(mdb_t *db, const char *members, const char *device_kind,
                          mdb_profile_row_t **rows, int *nrows);

/* Sets a model's status and error text (NULL: none), keeping its
 * profiles: a model that crashed its workers is marked "failed".
 * SQ_MODEL_NOT_FOUND when there is no such model. */
int mdb_model_set_status(mdb_t *db, int64_t model_id, const char *status, const char *error);
/* Records that device kind's backend cannot run the model, and why (a
 * worker of the kind refused its load): the record's "not_on" says so and
 * squishd no longer measures or serves it there (not_on.c). */
int mdb_model_set_not_on(mdb_t *db, int64_t model_id, const char *device_kind, const char *reason);
/* A named estimate of what decoding a frame costs the gateway (its
 * preprocess pool's, gw_prep_costs_t): the mean, the mean absolute
 * deviation (in ns, or ns per byte, as the name says) and the number of
 * samples behind them (decode_costs.c). */
typedef struct {
    char what[32];
    double mean_ns, dev_ns;
    int64_t samples;
} mdb_decode_cost_t;
/* The stored estimates, by name: at most max into out, *n of them; 0 or
 * SQ_DB. None stored is 0 with *n 0. */
int mdb_decode_costs_read(mdb_t *db, mdb_decode_cost_t *out, int max, int *n);
/* Stores n estimates in one transaction, each replacing the one of its
 * name. SQ_INVAL (nothing stored) for an empty name or a value that is
 * negative or not finite; SQ_DB on errors. */
int mdb_decode_costs_write(mdb_t *db, const mdb_decode_cost_t *costs, int n);
/* Unloads (1) or loads (0) every version of name: an unloaded version is
 * kept, with its profiles, but served by no worker (records say
 * "unloaded": true). *versions (may be NULL) counts them;
 * SQ_MODEL_NOT_FOUND when there is none. */
int mdb_model_set_unloaded(mdb_t *db, const char *name, int unloaded, int *versions);
/* The same for a pipeline; SQ_NOT_FOUND when there is none by that name. */
int mdb_pipeline_set_unloaded(mdb_t *db, const char *name, int unloaded);

/* Gives model to_id the profiles of model from_id (the same file, measured
 * already) and makes it "ready" (one transaction). SQ_NOT_FOUND when
 * from_id has no profile; SQ_MODEL_NOT_FOUND when either model is gone. */
int mdb_profile_copy(mdb_t *db, int64_t from_id, int64_t to_id);

/* What a measurement found of a model's precision on a device kind: the
 * precision its plan runs ("fp32"...) and the largest absolute and relative
 * deviation of its outputs from an FP32 plan's (0 when it runs FP32; -1
 * when not measured; +inf when not finite). */
typedef struct {
    const char *runs;
    double max_abs_deviation;
    double max_rel_deviation;
} mdb_precision_t;

/* Replaces the profile rows of a model for a device kind, and its precision
 * row for that kind (precision NULL: none), and sets its status (one
 * transaction). SQ_MODEL_NOT_FOUND, storing nothing, when the model was
 * deleted meanwhile. The copy (mdb_profile_copy) takes the precision rows
 * too. */
int mdb_profile_store(mdb_t *db, int64_t model_id, const char *device_kind, const char *device_name,
                      const mdb_profile_row_t *rows, int nrows, const char *status,
                      const char *error, const mdb_precision_t *precision);

#endif
