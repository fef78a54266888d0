/* Model storage: one transaction per write, so that a failed or interrupted
 * upload leaves nothing behind; shared-prefix groups found at insert time
 * from the node signatures stored for every ONNX model. */
#include "mdb_int.h"

#include "mdb_graph.h"

#include <sq.h>

#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A shared prefix must cover at least this fraction of the smaller model's
 * nodes to form a group: below it the shared part is an accident (a
 * weightless first op), not a backbone worth batching together. */
#define MDB_PREFIX_MIN_FRACTION 0.5

static int bind_text(sqlite3_stmt *st, int i, const char *s)
{
    return sqlite3_bind_text(st, i, s, -1, SQLITE_TRANSIENT);
}

static int bind_json(sqlite3_stmt *st, int i, json_t *v)
{
    if (v == NULL)
        return sqlite3_bind_null(st, i);
    char *txt = json_dumps(v, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY);
    int rc = sqlite3_bind_text(st, i, txt, -1, SQLITE_TRANSIENT);
    free(txt);
    return rc;
}

static json_t *column_json(sqlite3_stmt *st, int i)
{
    const char *txt = (const char *)sqlite3_column_text(st, i);
    if (txt == NULL)
        return json_null();
    json_t *v = json_loads(txt, JSON_DECODE_ANY, NULL);
    return v ? v : json_null();
}

static int step_done(mdb_t *db, sqlite3_stmt *st, const char *what)
{
    if (st == NULL)
        return SQ_DB;
    int rc = sqlite3_step(st);
    if (rc != SQLITE_DONE && rc != SQLITE_ROW) {
        mdb_set_error(db, what);
        return SQ_DB;
    }
    return 0;
}

/* One step of a query: 1 a row, 0 no more rows, or SQ_DB (the error on
 * the handle). A failed step is never "no such row": a busy, locked or
 * damaged database is a 503/500 `db` error, not a 404. */
static int step_row(mdb_t *db, sqlite3_stmt *st, const char *what)
{
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW)
        return 1;
    if (rc == SQLITE_DONE)
        return 0;
    mdb_set_error(db, what);
    return SQ_DB;
}

static int hex_to_hash(const char *hex, mdb_hash_t *h)
{
    if (hex == NULL || strlen(hex) != 2 * MDB_HASH_LEN)
        return -1;
    for (int i = 0; i < MDB_HASH_LEN; i++) {
        unsigned v;
        if (sscanf(hex + 2 * i, "%2x", &v) != 1)
            return -1;
        h->b[i] = (uint8_t)v;
    }
    return 0;
}

static char *input_spec(const mdb_new_model_t *m)
{
    /* The input's name is not part of the spec: renamed inputs still match. */
    json_t *input = json_deep_copy(m->input);
    json_object_del(input, "name");
    json_t *spec = json_pack("{s:o?, s:O?}", "input", input, "preprocess", m->preprocess);
    char *txt = json_dumps(spec, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(spec);
    return txt;
}

static void free_names(char **names, int n)
{
    for (int i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

/* Loads the stored signatures of a model. */
static int load_sigs(mdb_t *db, int64_t model_id, mdb_node_sig_t **out, char ***outputs, int *n)
{
    static const char count_sql[] = "SELECT count(*) FROM model_nodes WHERE model_id = ?";
    static const char sql[] = "SELECT prefix_hash, ancestors, cut_ok, output FROM model_nodes "
                              "WHERE model_id = ? ORDER BY idx";
    sqlite3_stmt *st = mdb_stmt(db, count_sql);
    if (st == NULL)
        return SQ_DB;
    sqlite3_bind_int64(st, 1, model_id);
    if (step_row(db, st, "count model nodes") != 1)
        return SQ_DB;
    int count = sqlite3_column_int(st, 0);
    mdb_node_sig_t *sigs = sq_xcalloc((size_t)count + 1, sizeof(*sigs));
    char **names = sq_xcalloc((size_t)count + 1, sizeof(*names));
    st = mdb_stmt(db, sql);
    if (st == NULL) {
        free(sigs);
        free(names);
        return SQ_DB;
    }
    sqlite3_bind_int64(st, 1, model_id);
    int i = 0, step = 1;
    while (i < count && (step = step_row(db, st, "read model nodes")) == 1) {
        hex_to_hash((const char *)sqlite3_column_text(st, 0), &sigs[i].hash);
        sigs[i].ancestors = (uint32_t)sqlite3_column_int64(st, 1);
        sigs[i].cut_ok = sqlite3_column_int(st, 2) != 0;
        names[i] = sq_xstrdup((const char *)sqlite3_column_text(st, 3));
        i++;
    }
    if (step < 0) {
        free(sigs);
        free_names(names, i);
        return SQ_DB;
    }
    *out = sigs;
    *outputs = names;
    *n = i;
    return 0;
}

static int add_member(mdb_t *db, int64_t group_id, int64_t model_id, const char *cut_tensor,
                      int cut_node)
{
    static const char sql[] = "INSERT OR IGNORE INTO prefix_members (group_id, model_id, "
                              "cut_tensor, cut_node) VALUES (?, ?, ?, ?)";
    sqlite3_stmt *st = mdb_stmt(db, sql);
    if (st == NULL)
        return SQ_DB;
    sqlite3_bind_int64(st, 1, group_id);
    sqlite3_bind_int64(st, 2, model_id);
    bind_text(st, 3, cut_tensor);
    sqlite3_bind_int(st, 4, cut_node);
    return step_done(db, st, "insert prefix member");
}

/* Matches the new model's signatures against every stored ONNX model with
 * the same input spec and joins the group of the best match. */
static int find_prefix_group(mdb_t *db, int64_t id, const char *spec, const mdb_graph_t *g,
                             const mdb_node_sig_t *sigs)
{
    static const char sql[] = "SELECT id FROM models WHERE format = 'onnx' AND input_spec = ? "
                              "AND id != ? ORDER BY id";
    sqlite3_stmt *st = mdb_stmt(db, sql);
    if (st == NULL)
        return SQ_DB;
    bind_text(st, 1, spec);
    sqlite3_bind_int64(st, 2, id);
    int64_t others[256];
    int nothers = 0, step = 1;
    while (nothers < 256 && (step = step_row(db, st, "find prefix candidates")) == 1)
        others[nothers++] = sqlite3_column_int64(st, 0);
    if (step < 0)
        return step;

    mdb_prefix_t best = {0};
    int64_t best_model = 0;
    char best_tensor_b[256] = "";
    for (int i = 0; i < nothers; i++) {
        mdb_node_sig_t *osigs;
        char **onames;
        int on;
        if (load_sigs(db, others[i], &osigs, &onames, &on) != 0)
            return SQ_DB;
        mdb_prefix_t m;
        mdb_prefix_match(sigs, g->n_nodes, osigs, on, &m);
        int smaller = g->n_nodes < on ? g->n_nodes : on;
        if (m.found && m.prefix_nodes >= MDB_PREFIX_MIN_FRACTION * smaller &&
            m.prefix_nodes > best.prefix_nodes) {
            best = m;
            best_model = others[i];
            snprintf(best_tensor_b, sizeof(best_tensor_b), "%s", onames[m.node_b]);
        }
        free(osigs);
        free_names(onames, on);
    }
    if (!best.found)
        return 0;

    char hex[2 * MDB_HASH_LEN + 1];
    mdb_hash_hex(&best.prefix_hash, hex);
    static const char find_sql[] = "SELECT id FROM prefix_groups WHERE prefix_hash = ?";
    static const char ins_sql[] = "INSERT INTO prefix_groups (prefix_hash, input_spec) "
                                  "VALUES (?, ?)";
    st = mdb_stmt(db, find_sql);
    if (st == NULL)
        return SQ_DB;
    bind_text(st, 1, hex);
    int64_t group_id;
    if (sqlite3_step(st) == SQLITE_ROW) {
        group_id = sqlite3_column_int64(st, 0);
    } else {
        st = mdb_stmt(db, ins_sql);
        if (st == NULL)
            return SQ_DB;
        bind_text(st, 1, hex);
        bind_text(st, 2, spec);
        if (step_done(db, st, "insert prefix group") != 0)
            return SQ_DB;
        group_id = sqlite3_last_insert_rowid(db->sql);
    }
    /* mdb_prefix_match names nodes; the cut tensor is the cut node's output. */
    const char *cut_a = g->tensors[g->nodes[best.node_a].outputs[0]].name;
    int rc = add_member(db, group_id, id, cut_a, best.node_a);
    if (rc == 0)
        rc = add_member(db, group_id, best_model, best_tensor_b, best.node_b);
    return rc;
}

static int insert_nodes(mdb_t *db, int64_t id, const mdb_graph_t *g, mdb_node_sig_t *sigs)
{
    static const char sql[] = "INSERT INTO model_nodes (model_id, idx, op, output, prefix_hash, "
                              "ancestors, cut_ok) VALUES (?, ?, ?, ?, ?, ?, ?)";
    for (int i = 0; i < g->n_nodes; i++) {
        const mdb_node_t *n = &g->nodes[i];
        sqlite3_stmt *st = mdb_stmt(db, sql);
        if (st == NULL)
            return SQ_DB;
        char hex[2 * MDB_HASH_LEN + 1];
        mdb_hash_hex(&sigs[i].hash, hex);
        sqlite3_bind_int64(st, 1, id);
        sqlite3_bind_int(st, 2, i);
        bind_text(st, 3, mdb_op_name(n->op));
        bind_text(st, 4, n->n_outputs > 0 ? g->tensors[n->outputs[0]].name : "");
        bind_text(st, 5, hex);
        sqlite3_bind_int64(st, 6, sigs[i].ancestors);
        sqlite3_bind_int(st, 7, sigs[i].cut_ok);
        if (step_done(db, st, "insert node") != 0)
            return SQ_DB;
    }
    return 0;
}

static int insert_profile(mdb_t *db, int64_t id, const char *kind, const char *name,
                          const mdb_profile_row_t *rows, int n)
{
    static const char del_sql[] = "DELETE FROM profiles WHERE model_id = ? AND device_kind = ?";
    static const char sql[] = "INSERT INTO profiles (model_id, device_kind, device_name, batch, "
                              "latency_mean_us, latency_std_us, peak_memory_bytes) "
                              "VALUES (?, ?, ?, ?, ?, ?, ?)";
    sqlite3_stmt *st = mdb_stmt(db, del_sql);
    if (st == NULL)
        return SQ_DB;
    sqlite3_bind_int64(st, 1, id);
    bind_text(st, 2, kind);
    if (step_done(db, st, "delete profile") != 0)
        return SQ_DB;
    for (int i = 0; i < n; i++) {
        st = mdb_stmt(db, sql);
        if (st == NULL)
            return SQ_DB;
        sqlite3_bind_int64(st, 1, id);
        bind_text(st, 2, kind);
        bind_text(st, 3, name);
        sqlite3_bind_int(st, 4, rows[i].batch);
        sqlite3_bind_double(st, 5, rows[i].mean_us);
        sqlite3_bind_double(st, 6, rows[i].std_us);
        sqlite3_bind_int64(st, 7, (sqlite3_int64)rows[i].peak_memory_bytes);
        if (step_done(db, st, "insert profile") != 0)
            return SQ_DB;
    }
    return 0;
}

static int rollback(mdb_t *db, int rc)
{
    char keep[sizeof(db->errmsg)];
    snprintf(keep, sizeof(keep), "%s", db->errmsg);
    mdb_exec(db, "ROLLBACK");
    snprintf(db->errmsg, sizeof(db->errmsg), "%s", keep);
    return rc;
}

int mdb_model_insert(mdb_t *db, const mdb_new_model_t *m, int64_t *id_out)
{
    static const char exists_sql[] = "SELECT 1 FROM models WHERE name = ? AND version = ?";
    static const char sql[] =
        "INSERT INTO models (id, name, version, sha256, created_at, format, onnx, input_name, "
        "input, input_layout, preprocess, labels, default_slo_ms, max_batch, outputs, "
        "param_bytes, memory_bytes, input_spec, config, status) "
        "VALUES ((SELECT last + 1 FROM model_id_seq), "
        "?, ?, ?, ?, ?, ?, ?, ?, 'NCHW', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";
    db->errmsg[0] = '\0';
    int rc = mdb_exec(db, "BEGIN IMMEDIATE");
    if (rc != 0)
        return rc;
    sqlite3_stmt *st = mdb_stmt(db, exists_sql);
    if (st == NULL)
        return rollback(db, SQ_DB);
    bind_text(st, 1, m->name);
    sqlite3_bind_int(st, 2, m->version);
    int exists = step_row(db, st, "check model");
    if (exists < 0)
        return rollback(db, exists);
    if (exists == 1) {
        snprintf(db->errmsg, sizeof(db->errmsg), "model %s version %d already exists", m->name,
                 m->version);
        return rollback(db, SQ_EXISTS);
    }
    char *spec = input_spec(m);
    st = mdb_stmt(db, sql);
    if (st == NULL) {
        free(spec);
        return rollback(db, SQ_DB);
    }
    bind_text(st, 1, m->name);
    sqlite3_bind_int(st, 2, m->version);
    bind_text(st, 3, m->sha256);
    sqlite3_bind_double(st, 4, sq_wall_s());
    bind_text(st, 5, m->format);
    if (m->onnx != NULL)
        sqlite3_bind_blob64(st, 6, m->onnx, m->onnx_len, SQLITE_STATIC);
    else
        sqlite3_bind_null(st, 6);
    bind_text(st, 7, json_string_value(json_object_get(m->input, "name")));
    bind_json(st, 8, m->input);
    bind_json(st, 9, m->preprocess);
    bind_json(st, 10, m->labels);
    sqlite3_bind_double(st, 11, m->default_slo_ms);
    sqlite3_bind_int(st, 12, m->max_batch);
    bind_json(st, 13, m->outputs);
    sqlite3_bind_int64(st, 14, (sqlite3_int64)m->param_bytes);
    sqlite3_bind_int64(st, 15, (sqlite3_int64)m->memory_bytes);
    bind_text(st, 16, spec);
    bind_json(st, 17, m->config);
    bind_text(st, 18, m->status);
    if (step_done(db, st, "insert model") != 0) {
        free(spec);
        return rollback(db, SQ_DB);
    }
    int64_t id = sqlite3_last_insert_rowid(db->sql);
    if (m->graph != NULL) {
        mdb_node_sig_t *sigs = sq_xcalloc((size_t)m->graph->n_nodes + 1, sizeof(*sigs));
        rc = mdb_graph_signature(m->graph, sigs);
        if (rc == 0)
            rc = insert_nodes(db, id, m->graph, sigs);
        if (rc == 0)
            rc = find_prefix_group(db, id, spec, m->graph, sigs);
        free(sigs);
        if (rc != 0) {
            free(spec);
            return rollback(db, rc);
        }
    }
    free(spec);
    if (m->nprofile > 0 && insert_profile(db, id, m->profile_device_kind, m->profile_device_kind,
                                          m->profile, m->nprofile) != 0)
        return rollback(db, SQ_DB);
    if ((rc = mdb_exec(db, "COMMIT")) != 0)
        return rollback(db, rc);
    if (id_out != NULL)
        *id_out = id;
    return 0;
}

static json_t *profiles_json(mdb_t *db, int64_t id)
{
    static const char sql[] = "SELECT device_kind, device_name, batch, latency_mean_us, "
                              "latency_std_us, peak_memory_bytes FROM profiles WHERE model_id = ? "
                              "ORDER BY device_kind, batch";
    json_t *out = json_array();
    sqlite3_stmt *st = mdb_stmt(db, sql);
    if (st == NULL)
        return out;
    sqlite3_bind_int64(st, 1, id);
    json_t *cur = NULL;
    while (sqlite3_step(st) == SQLITE_ROW) {
        const char *kind = (const char *)sqlite3_column_text(st, 0);
        if (cur == NULL || strcmp(json_string_value(json_object_get(cur, "device_kind")), kind)) {
            cur = json_pack("{s:s, s:s, s:[], s:[], s:[], s:[]}", "device_kind", kind,
                            "device_name", (const char *)sqlite3_column_text(st, 1), "batch",
                            "latency_ms", "latency_std_ms", "peak_memory_bytes");
            json_array_append_new(out, cur);
        }
        json_array_append_new(json_object_get(cur, "batch"),
                              json_integer(sqlite3_column_int(st, 2)));
        json_array_append_new(json_object_get(cur, "latency_ms"),
                              json_real(sqlite3_column_double(st, 3) / 1000.0));
        json_array_append_new(json_object_get(cur, "latency_std_ms"),
                              json_real(sqlite3_column_double(st, 4) / 1000.0));
        json_array_append_new(json_object_get(cur, "peak_memory_bytes"),
                              json_integer(sqlite3_column_int64(st, 5)));
    }
    return out;
}

static json_t *prefix_group_json(mdb_t *db, int64_t id)
{
    static const char sql[] = "SELECT g.id, g.prefix_hash, m.cut_tensor FROM prefix_members m "
                              "JOIN prefix_groups g ON g.id = m.group_id WHERE m.model_id = ?";
    static const char members_sql[] =
        "SELECT models.name, models.version, pm.cut_tensor FROM prefix_members pm "
        "JOIN models ON models.id = pm.model_id WHERE pm.group_id = ? "
        "ORDER BY models.name, models.version";
    sqlite3_stmt *st = mdb_stmt(db, sql);
    if (st == NULL)
        return json_null();
    sqlite3_bind_int64(st, 1, id);
    if (sqlite3_step(st) != SQLITE_ROW)
        return json_null();
    int64_t gid = sqlite3_column_int64(st, 0);
    json_t *g = json_pack("{s:I, s:s, s:s, s:[]}", "id", (json_int_t)gid, "prefix_hash",
                          (const char *)sqlite3_column_text(st, 1), "cut_tensor",
                          (const char *)sqlite3_column_text(st, 2), "members");
    st = mdb_stmt(db, members_sql);
    if (st == NULL)
        return g;
    sqlite3_bind_int64(st, 1, gid);
    while (sqlite3_step(st) == SQLITE_ROW)
        json_array_append_new(json_object_get(g, "members"),
                              json_pack("{s:s, s:i, s:s}", "name",
                                        (const char *)sqlite3_column_text(st, 0), "version",
                                        sqlite3_column_int(st, 1), "cut_tensor",
                                        (const char *)sqlite3_column_text(st, 2)));
    return g;
}

#define RECORD_COLUMNS                                                                             \
    "id, name, version, sha256, created_at, format, status, error, input_name, input, "            \
    "outputs, preprocess, labels, default_slo_ms, max_batch, param_bytes, memory_bytes"

static json_t *record_from_row(mdb_t *db, sqlite3_stmt *st)
{
    int64_t id = sqlite3_column_int64(st, 0);
    json_t *labels = column_json(st, 12);
    json_t *input = column_json(st, 9);
    const char *err = (const char *)sqlite3_column_text(st, 7);
    json_t *r = json_pack(
        "{s:s, s:i, s:s, s:f, s:s, s:s, s:s?, s:o, s:o, s:o, s:i, s:f, s:i, s:I, s:I}", "name",
        (const char *)sqlite3_column_text(st, 1), "version", sqlite3_column_int(st, 2), "sha256",
        (const char *)sqlite3_column_text(st, 3), "created_at", sqlite3_column_double(st, 4),
        "format", (const char *)sqlite3_column_text(st, 5), "status",
        (const char *)sqlite3_column_text(st, 6), "error", err, "input", input, "outputs",
        column_json(st, 10), "preprocess", column_json(st, 11), "labels_count",
        (int)json_array_size(labels), "default_slo_ms", sqlite3_column_double(st, 13), "max_batch",
        sqlite3_column_int(st, 14), "param_bytes", (json_int_t)sqlite3_column_int64(st, 15),
        "memory_bytes", (json_int_t)sqlite3_column_int64(st, 16));
    json_decref(labels);
    if (err == NULL)
        json_object_del(r, "error");
    /* The statement is reused by the helpers below: copy what they need first. */
    json_object_set_new(r, "id", json_integer(id));
    return r;
}

/* Adds the profile and prefix group to records (after the row loop, since
 * those queries reuse other cached statements). */
static void finish_record_keep_id(mdb_t *db, json_t *r)
{
    int64_t id = json_integer_value(json_object_get(r, "id"));
    json_object_set_new(r, "profiles", profiles_json(db, id));
    json_object_set_new(r, "prefix_group", prefix_group_json(db, id));
}

static void finish_record(mdb_t *db, json_t *r)
{
    finish_record_keep_id(db, r);
    json_object_del(r, "id");
}

int mdb_model_get(mdb_t *db, const char *name, json_t **out)
{
    static const char sql[] = "SELECT " RECORD_COLUMNS " FROM models WHERE name = ? "
                              "ORDER BY version";
    sqlite3_stmt *st = mdb_stmt(db, sql);
    if (st == NULL)
        return SQ_DB;
    bind_text(st, 1, name);
    json_t *versions = json_array();
    int step;
    while ((step = step_row(db, st, "read model")) == 1)
        json_array_append_new(versions, record_from_row(db, st));
    if (step != 0 || json_array_size(versions) == 0) {
        json_decref(versions);
        return step != 0 ? step : SQ_MODEL_NOT_FOUND;
    }
    size_t i;
    json_t *r;
    json_array_foreach(versions, i, r)
    {
        finish_record(db, r);
        json_object_del(r, "name");
    }
    *out = json_pack("{s:s, s:o}", "name", name, "versions", versions);
    return 0;
}

int mdb_model_version_get(mdb_t *db, const char *name, int version, json_t **out)
{
    static const char sql[] = "SELECT " RECORD_COLUMNS " FROM models WHERE name = ? AND "
                              "(version = ? OR ? = 0) ORDER BY version DESC LIMIT 1";
    sqlite3_stmt *st = mdb_stmt(db, sql);
    if (st == NULL)
        return SQ_DB;
    bind_text(st, 1, name);
    sqlite3_bind_int(st, 2, version);
    sqlite3_bind_int(st, 3, version);
    int step = step_row(db, st, "read model version");
    if (step != 1)
        return step == 0 ? SQ_MODEL_NOT_FOUND : step;
    json_t *r = record_from_row(db, st);
    finish_record(db, r);
    *out = r;
    return 0;
}

int mdb_model_labels(mdb_t *db, const char *name, int version, json_t **out)
{
    static const char sql[] = "SELECT labels FROM models WHERE name = ? AND (version = ? OR "
                              "? = 0) ORDER BY version DESC LIMIT 1";
    sqlite3_stmt *st = mdb_stmt(db, sql);
    if (st == NULL)
        return SQ_DB;
    bind_text(st, 1, name);
    sqlite3_bind_int(st, 2, version);
    sqlite3_bind_int(st, 3, version);
    int step = step_row(db, st, "read labels");
    if (step != 1)
        return step == 0 ? SQ_MODEL_NOT_FOUND : step;
    *out = column_json(st, 0);
    return 0;
}

int mdb_model_list(mdb_t *db, json_t **out)
{
    static const char sql[] = "SELECT name, version, status, format FROM models "
                              "ORDER BY name, version";
    sqlite3_stmt *st = mdb_stmt(db, sql);
    if (st == NULL)
        return SQ_DB;
    json_t *models = json_array();
    json_t *cur = NULL;
    int step;
    while ((step = step_row(db, st, "list models")) == 1) {
        const char *name = (const char *)sqlite3_column_text(st, 0);
        if (cur == NULL || strcmp(json_string_value(json_object_get(cur, "name")), name) != 0) {
            cur = json_pack("{s:s, s:[]}", "name", name, "versions");
            json_array_append_new(models, cur);
        }
        json_array_append_new(json_object_get(cur, "versions"),
                              json_integer(sqlite3_column_int(st, 1)));
        json_object_set_new(cur, "latest",
                            json_pack("{s:i, s:s, s:s}", "version", sqlite3_column_int(st, 1),
                                      "status", (const char *)sqlite3_column_text(st, 2), "format",
                                      (const char *)sqlite3_column_text(st, 3)));
    }
    if (step != 0) {
        json_decref(models);
        return step;
    }
    *out = json_pack("{s:o}", "models", models);
    return 0;
}

/* Group profiles one of whose member files no model holds any more (inside
 * the caller's transaction). */
static int purge_group_profiles(mdb_t *db)
{
    static const char rows_sql[] = "SELECT rowid, member_shas FROM group_profiles";
    static const char held_sql[] = "SELECT 1 FROM models WHERE sha256 = ?";
    static const char del_sql[] = "DELETE FROM group_profiles WHERE rowid = ?";
    int64_t *gone = NULL;
    int ngone = 0, cap = 0, rc = 0;
    sqlite3_stmt *st = mdb_stmt(db, rows_sql);
    sqlite3_stmt *held = mdb_stmt(db, held_sql);
    if (st == NULL || held == NULL)
        return SQ_DB;
    int step;
    while ((step = sqlite3_step(st)) == SQLITE_ROW) {
        const char *shas = (const char *)sqlite3_column_text(st, 1);
        int stale = 0;
        for (const char *p = shas ? shas : ""; *p != '\0' && !stale;) {
            size_t n = strcspn(p, " ");
            if (n > 0) {
                sqlite3_bind_text(held, 1, p, (int)n, SQLITE_TRANSIENT);
                stale = sqlite3_step(held) != SQLITE_ROW;
                sqlite3_reset(held);
            }
            p += n + (p[n] == ' ');
        }
        if (stale) {
            if (ngone == cap) {
                cap = cap ? 2 * cap : 8;
                gone = sq_xrealloc(gone, sizeof(*gone) * (size_t)cap);
            }
            gone[ngone++] = sqlite3_column_int64(st, 0);
        }
    }
    sqlite3_reset(st);
    if (step != SQLITE_DONE) {
        mdb_set_error(db, "read group profiles");
        rc = SQ_DB;
    }
    sqlite3_stmt *del = rc == 0 ? mdb_stmt(db, del_sql) : NULL;
    for (int i = 0; i < ngone && rc == 0; i++) {
        if (del == NULL) {
            rc = SQ_DB;
            break;
        }
        sqlite3_bind_int64(del, 1, gone[i]);
        rc = step_done(db, del, "delete group profile") != 0 ? SQ_DB : 0;
        sqlite3_reset(del);
    }
    free(gone);
    return rc;
}

int mdb_model_delete(mdb_t *db, const char *name, int version, int *deleted)
{
    static const char sql[] = "DELETE FROM models WHERE name = ? AND (version = ? OR ? = 0)";
    *deleted = 0;
    int rc = mdb_exec(db, "BEGIN IMMEDIATE");
    if (rc != 0)
        return rc;
    sqlite3_stmt *st = mdb_stmt(db, sql);
    if (st == NULL)
        return rollback(db, SQ_DB);
    bind_text(st, 1, name);
    sqlite3_bind_int(st, 2, version);
    sqlite3_bind_int(st, 3, version);
    if (step_done(db, st, "delete model") != 0)
        return rollback(db, SQ_DB);
    *deleted = sqlite3_changes(db->sql);
    if (*deleted > 0 && (rc = purge_group_profiles(db)) != 0)
        return rollback(db, rc);
    rc = mdb_exec(db, "DELETE FROM prefix_members WHERE group_id IN (SELECT group_id FROM "
                      "prefix_members GROUP BY group_id HAVING count(*) < 2);"
                      "DELETE FROM prefix_groups WHERE id NOT IN (SELECT group_id FROM "
                      "prefix_members);"
                      "COMMIT");
    if (rc != 0)
        return rollback(db, rc);
    return *deleted > 0 ? 0 : SQ_MODEL_NOT_FOUND;
}

int mdb_model_set_status(mdb_t *db, int64_t model_id, const char *status, const char *error)
{
    static const char sql[] = "UPDATE models SET status = ?, error = ? WHERE id = ?";
    sqlite3_stmt *st = mdb_stmt(db, sql);
    if (st == NULL)
        return SQ_DB;
    bind_text(st, 1, status);
    if (error != NULL)
        bind_text(st, 2, error);
    else
        sqlite3_bind_null(st, 2);
    sqlite3_bind_int64(st, 3, model_id);
    if (step_done(db, st, "set model status") != 0)
        return SQ_DB;
    if (sqlite3_changes(db->sql) == 0) {
        snprintf(db->errmsg, sizeof(db->errmsg), "model %lld not found", (long long)model_id);
        return SQ_MODEL_NOT_FOUND;
    }
    return 0;
}

int mdb_profile_copy(mdb_t *db, int64_t from_id, int64_t to_id)
{
    static const char exists_sql[] = "SELECT count(*) FROM models WHERE id IN (?, ?)";
    static const char del_sql[] = "DELETE FROM profiles WHERE model_id = ?";
    static const char copy_sql[] =
        "INSERT INTO profiles (model_id, device_kind, device_name, batch, latency_mean_us, "
        "latency_std_us, peak_memory_bytes, preprocess_us) "
        "SELECT ?, device_kind, device_name, batch, latency_mean_us, latency_std_us, "
        "peak_memory_bytes, preprocess_us FROM profiles WHERE model_id = ?";
    static const char status_sql[] =
        "UPDATE models SET status = 'ready', error = NULL WHERE id = ?";
    int rc = mdb_exec(db, "BEGIN IMMEDIATE");
    if (rc != 0)
        return rc;
    sqlite3_stmt *st = mdb_stmt(db, exists_sql);
    if (st == NULL)
        return rollback(db, SQ_DB);
    sqlite3_bind_int64(st, 1, from_id);
    sqlite3_bind_int64(st, 2, to_id);
    if (sqlite3_step(st) != SQLITE_ROW) {
        mdb_set_error(db, "find models");
        return rollback(db, SQ_DB);
    }
    if (sqlite3_column_int64(st, 0) != 2) {
        snprintf(db->errmsg, sizeof(db->errmsg), "model %lld or %lld was deleted",
                 (long long)from_id, (long long)to_id);
        return rollback(db, SQ_MODEL_NOT_FOUND);
    }
    if ((st = mdb_stmt(db, del_sql)) == NULL)
        return rollback(db, SQ_DB);
    sqlite3_bind_int64(st, 1, to_id);
    if (step_done(db, st, "delete profile") != 0)
        return rollback(db, SQ_DB);
    if ((st = mdb_stmt(db, copy_sql)) == NULL)
        return rollback(db, SQ_DB);
    sqlite3_bind_int64(st, 1, to_id);
    sqlite3_bind_int64(st, 2, from_id);
    if (step_done(db, st, "copy profile") != 0)
        return rollback(db, SQ_DB);
    if (sqlite3_changes(db->sql) == 0) {
        snprintf(db->errmsg, sizeof(db->errmsg), "model %lld has no profile", (long long)from_id);
        return rollback(db, SQ_NOT_FOUND);
    }
    if ((st = mdb_stmt(db, status_sql)) == NULL)
        return rollback(db, SQ_DB);
    sqlite3_bind_int64(st, 1, to_id);
    if (step_done(db, st, "update status") != 0)
        return rollback(db, SQ_DB);
    if ((rc = mdb_exec(db, "COMMIT")) != 0)
        return rollback(db, rc);
    return 0;
}

int mdb_profile_store(mdb_t *db, int64_t model_id, const char *device_kind, const char *device_name,
                      const mdb_profile_row_t *rows, int nrows, const char *status,
                      const char *error)
{
    static const char sql[] = "UPDATE models SET status = ?, error = ? WHERE id = ?";
    static const char exists_sql[] = "SELECT 1 FROM models WHERE id = ?";
    int rc = mdb_exec(db, "BEGIN IMMEDIATE");
    if (rc != 0)
        return rc;
    /* A model deleted while it was measured (the worker's answer and the
     * delete cross): nothing to store, and no foreign key to break. */
    sqlite3_stmt *ex = mdb_stmt(db, exists_sql);
    if (ex == NULL)
        return rollback(db, SQ_DB);
    sqlite3_bind_int64(ex, 1, model_id);
    rc = sqlite3_step(ex);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) {
        mdb_set_error(db, "find model");
        return rollback(db, SQ_DB);
    }
    if (rc == SQLITE_DONE) {
        snprintf(db->errmsg, sizeof(db->errmsg), "model %lld was deleted", (long long)model_id);
        return rollback(db, SQ_MODEL_NOT_FOUND);
    }
    if (insert_profile(db, model_id, device_kind, device_name, rows, nrows) != 0)
        return rollback(db, SQ_DB);
    sqlite3_stmt *st = mdb_stmt(db, sql);
    if (st == NULL)
        return rollback(db, SQ_DB);
    bind_text(st, 1, status);
    if (error != NULL)
        bind_text(st, 2, error);
    else
        sqlite3_bind_null(st, 2);
    sqlite3_bind_int64(st, 3, model_id);
    if (step_done(db, st, "update status") != 0)
        return rollback(db, SQ_DB);
    if ((rc = mdb_exec(db, "COMMIT")) != 0)
        return rollback(db, rc);
    return 0;
}

int mdb_model_records(mdb_t *db, int64_t key, json_t **out)
{
    static const char sql[] = "SELECT " RECORD_COLUMNS ", labels FROM models "
                              "WHERE id = ? OR ? = 0 ORDER BY id";
    sqlite3_stmt *st = mdb_stmt(db, sql);
    if (st == NULL)
        return SQ_DB;
    sqlite3_bind_int64(st, 1, key);
    sqlite3_bind_int64(st, 2, key);
    json_t *all = json_array();
    int step;
    while ((step = step_row(db, st, "read models")) == 1) {
        json_t *r = record_from_row(db, st);
        json_object_set_new(r, "labels", column_json(st, 17));
        json_array_append_new(all, r);
    }
    if (step != 0) {
        json_decref(all);
        return step;
    }
    size_t i;
    json_t *r;
    json_array_foreach(all, i, r) finish_record_keep_id(db, r);
    *out = all;
    return 0;
}

int mdb_model_blob(mdb_t *db, int64_t key, void **bytes, size_t *len)
{
    static const char sql[] = "SELECT onnx FROM models WHERE id = ?";
    sqlite3_stmt *st = mdb_stmt(db, sql);
    if (st == NULL)
        return SQ_DB;
    sqlite3_bind_int64(st, 1, key);
    int step = step_row(db, st, "read model file");
    if (step != 1)
        return step == 0 ? SQ_MODEL_NOT_FOUND : step;
    size_t n = (size_t)sqlite3_column_bytes(st, 0);
    const void *p = sqlite3_column_blob(st, 0);
    if (p == NULL || n == 0)
        return SQ_NOT_FOUND;
    void *copy = malloc(n);
    if (copy == NULL)
        return SQ_NOMEM;
    memcpy(copy, p, n);
    *bytes = copy;
    *len = n;
    return 0;
}

int mdb_plan_store(mdb_t *db, long long epoch, const char *reason, const char *plan_json,
                   json_t *placements)
{
    static const char plan_sql[] = "INSERT OR REPLACE INTO plans (epoch, created_at, reason, "
                                   "plan) VALUES (?, ?, ?, ?)";
    static const char del_sql[] = "DELETE FROM placements WHERE epoch = ?";
    static const char pl_sql[] = "INSERT INTO placements (epoch, device, model_id, slo_ms, batch, "
                                 "duty_cycle_us, rate_rps) VALUES (?, ?, ?, ?, ?, ?, ?)";
    int rc = mdb_exec(db, "BEGIN IMMEDIATE");
    if (rc != 0)
        return rc;
    sqlite3_stmt *st = mdb_stmt(db, plan_sql);
    if (st == NULL)
        return rollback(db, SQ_DB);
    sqlite3_bind_int64(st, 1, epoch);
    sqlite3_bind_double(st, 2, sq_wall_s());
    bind_text(st, 3, reason);
    bind_text(st, 4, plan_json);
    if (step_done(db, st, "insert plan") != 0)
        return rollback(db, SQ_DB);
    st = mdb_stmt(db, del_sql);
    if (st == NULL)
        return rollback(db, SQ_DB);
    sqlite3_bind_int64(st, 1, epoch);
    if (step_done(db, st, "delete placements") != 0)
        return rollback(db, SQ_DB);
    size_t i;
    json_t *p;
    json_array_foreach(placements, i, p)
    {
        st = mdb_stmt(db, pl_sql);
        if (st == NULL)
            return rollback(db, SQ_DB);
        sqlite3_bind_int64(st, 1, epoch);
        bind_text(st, 2, json_string_value(json_object_get(p, "device")));
        sqlite3_bind_int64(st, 3, json_integer_value(json_object_get(p, "model_id")));
        sqlite3_bind_double(st, 4, json_number_value(json_object_get(p, "slo_ms")));
        sqlite3_bind_int(st, 5, (int)json_integer_value(json_object_get(p, "batch")));
        sqlite3_bind_double(st, 6, json_number_value(json_object_get(p, "duty_cycle_us")));
        sqlite3_bind_double(st, 7, json_number_value(json_object_get(p, "rate_rps")));
        if (step_done(db, st, "insert placement") != 0)
            return rollback(db, SQ_DB);
    }
    if ((rc = mdb_exec(db, "COMMIT")) != 0)
        return rollback(db, rc);
    return 0;
}

long long mdb_plan_last_epoch(mdb_t *db)
{
    static const char sql[] = "SELECT coalesce(max(epoch), 0) FROM plans";
    sqlite3_stmt *st = mdb_stmt(db, sql);
    if (st == NULL)
        return 0;
    long long e = sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0;
    sqlite3_reset(st); /* a stepped statement would hold its read transaction open */
    return e;
}

int mdb_plan_last(mdb_t *db, long long *epoch, json_t **plan, json_t **placements)
{
    static const char plan_sql[] = "SELECT epoch, plan FROM plans ORDER BY epoch DESC LIMIT 1";
    static const char pl_sql[] = "SELECT device, model_id, slo_ms, batch, duty_cycle_us, rate_rps "
                                 "FROM placements WHERE epoch = ? ORDER BY rowid";
    *epoch = 0;
    *plan = NULL;
    *placements = NULL;
    sqlite3_stmt *st = mdb_stmt(db, plan_sql);
    if (st == NULL)
        return SQ_DB;
    int rc = sqlite3_step(st);
    if (rc == SQLITE_DONE) {
        sqlite3_reset(st);
        *placements = json_array();
        return 0;
    }
    if (rc != SQLITE_ROW) {
        mdb_set_error(db, "select plan");
        sqlite3_reset(st);
        return SQ_DB;
    }
    long long e = sqlite3_column_int64(st, 0);
    json_t *p = column_json(st, 1);
    sqlite3_reset(st);
    if (!json_is_object(p)) {
        json_decref(p);
        snprintf(db->errmsg, sizeof(db->errmsg), "plan of epoch %lld: not a JSON object", e);
        return SQ_DB;
    }
    if ((st = mdb_stmt(db, pl_sql)) == NULL) {
        json_decref(p);
        return SQ_DB;
    }
    sqlite3_bind_int64(st, 1, e);
    json_t *all = json_array();
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        const char *dev = (const char *)sqlite3_column_text(st, 0);
        json_array_append_new(
            all, json_pack("{s:s, s:I, s:f, s:i, s:f, s:f}", "device", dev ? dev : "", "model_id",
                           (json_int_t)sqlite3_column_int64(st, 1), "slo_ms",
                           sqlite3_column_double(st, 2), "batch", sqlite3_column_int(st, 3),
                           "duty_cycle_us", sqlite3_column_double(st, 4), "rate_rps",
                           sqlite3_column_double(st, 5)));
    }
    if (rc != SQLITE_DONE) {
        mdb_set_error(db, "select placements");
        sqlite3_reset(st);
        json_decref(p);
        json_decref(all);
        return SQ_DB;
    }
    sqlite3_reset(st);
    *epoch = e;
    *plan = p;
    *placements = all;
    return 0;
}

void mdb_sha256_hex(const void *data, size_t len, char out[65])
{
    unsigned char md[32];
    unsigned int mdlen = 0;
    EVP_Digest(data, len, md, &mdlen, EVP_sha256(), NULL);
    for (int i = 0; i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", md[i]);
}

struct mdb_sha256 {
    EVP_MD_CTX *ctx;
};

mdb_sha256_t *mdb_sha256_begin(void)
{
    mdb_sha256_t *h = sq_xmalloc(sizeof(*h));
    h->ctx = EVP_MD_CTX_new();
    if (h->ctx == NULL || EVP_DigestInit_ex(h->ctx, EVP_sha256(), NULL) != 1) {
        SQ_ERROR("cannot start a sha256 digest (out of memory)");
        abort(); /* bookkeeping, like sq_xmalloc */
    }
    return h;
}

void mdb_sha256_update(mdb_sha256_t *h, const void *data, size_t len)
{
    EVP_DigestUpdate(h->ctx, data, len);
}

void mdb_sha256_end(mdb_sha256_t *h, char out[65])
{
    unsigned char md[32];
    unsigned int mdlen = 0;
    EVP_DigestFinal_ex(h->ctx, md, &mdlen);
    for (int i = 0; i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", md[i]);
    mdb_sha256_free(h);
}

void mdb_sha256_free(mdb_sha256_t *h)
{
    if (h == NULL)
        return;
    EVP_MD_CTX_free(h->ctx);
    free(h);
}

int mdb_group_profile_store(mdb_t *db, const char *members, const char *member_shas,
                            const char *device_kind, const char *device_name,
                            const mdb_profile_row_t *rows, int nrows)
{
    static const char sql[] = "INSERT OR REPLACE INTO group_profiles (members, device_kind, "
                              "device_name, rows, created_at, member_shas) VALUES (?, ?, ?, ?, "
                              "(julianday('now') - 2440587.5) * 86400.0, ?)";
    if (nrows < 1)
        return SQ_INVAL;
    json_t *a = json_array();
    for (int i = 0; i < nrows; i++)
        json_array_append_new(a, json_pack("[i, f, f, I]", rows[i].batch, rows[i].mean_us,
                                           rows[i].std_us, (json_int_t)rows[i].peak_memory_bytes));
    char *txt = json_dumps(a, JSON_COMPACT);
    json_decref(a);
    sqlite3_stmt *st = mdb_stmt(db, sql);
    int rc = SQ_DB;
    if (st != NULL && txt != NULL) {
        bind_text(st, 1, members);
        bind_text(st, 2, device_kind);
        bind_text(st, 3, device_name);
        bind_text(st, 4, txt);
        bind_text(st, 5, member_shas);
        rc = step_done(db, st, "store group profile") != 0 ? SQ_DB : 0;
    }
    free(txt);
    return rc;
}

int mdb_group_profile_get(mdb_t *db, const char *members, const char *device_kind,
                          mdb_profile_row_t **rows, int *nrows)
{
    static const char sql[] =
        "SELECT rows FROM group_profiles WHERE members = ? AND device_kind = ?";
    *rows = NULL;
    *nrows = 0;
    sqlite3_stmt *st = mdb_stmt(db, sql);
    if (st == NULL)
        return SQ_DB;
    bind_text(st, 1, members);
    bind_text(st, 2, device_kind);
    int step = sqlite3_step(st);
    if (step == SQLITE_DONE) {
        sqlite3_reset(st);
        return SQ_NOT_FOUND;
    }
    if (step != SQLITE_ROW) {
        mdb_set_error(db, "read group profile");
        sqlite3_reset(st);
        return SQ_DB;
    }
    json_t *a = json_loads((const char *)sqlite3_column_text(st, 0), 0, NULL);
    sqlite3_reset(st);
    size_t n = json_array_size(a);
    if (n == 0) {
        json_decref(a);
        snprintf(db->errmsg, sizeof(db->errmsg), "a stored group profile is not a row list");
        return SQ_DB;
    }
    *rows = sq_xcalloc(n, sizeof(**rows));
    for (size_t i = 0; i < n; i++) {
        json_t *r = json_array_get(a, i);
        (*rows)[i] = (mdb_profile_row_t){.batch = (int)json_integer_value(json_array_get(r, 0)),
                                         .mean_us = json_number_value(json_array_get(r, 1)),
                                         .std_us = json_number_value(json_array_get(r, 2)),
                                         .peak_memory_bytes =
                                             (uint64_t)json_integer_value(json_array_get(r, 3))};
    }
    *nrows = (int)n;
    json_decref(a);
    return 0;
}
