/* Model storage: one transaction per write, so that a failed or interrupted
 * upload leaves nothing behind; shared-prefix groups found at insert time
 * from the node signatures stored for every ONNX model; deleting, statuses,
 * profiles; SHA-256. Reading records and files is models_read.c. */
#include "mdb_int.h"

#include "mdb_graph.h"

#include <sq.h>

#include <math.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A shared prefix must cover at least this fraction of the smaller model's
 * nodes to form a group: below it the shared part is an accident (a
 * weightless first op), not a backbone worth batching together. */
#define MDB_PREFIX_MIN_FRACTION 0.5

static int hex_to_hash(const char *hex, mdb_hash_t *h)
{
    return sq_hex_decode(hex, h->b, MDB_HASH_LEN);
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
    mdb_q_t *q = mdb_q(db, count_sql);
    mdb_q_int64(q, 1, model_id);
    int step = mdb_q_step(q, "count model nodes");
    if (step != 1)
        return step < 0 ? step : SQ_DB;
    int count = mdb_q_int_at(q, 0);
    q = mdb_q(db, sql);
    mdb_q_int64(q, 1, model_id);
    mdb_node_sig_t *sigs = sq_xcalloc((size_t)count + 1, sizeof(*sigs));
    char **names = sq_xcalloc((size_t)count + 1, sizeof(*names));
    int i = 0;
    step = 1;
    while (i < count && (step = mdb_q_step(q, "read model nodes")) == 1) {
        hex_to_hash(mdb_q_text_at(q, 0), &sigs[i].hash);
        sigs[i].ancestors = (uint32_t)mdb_q_int64_at(q, 1);
        sigs[i].cut_ok = mdb_q_int_at(q, 2) != 0;
        const char *output = mdb_q_text_at(q, 3);
        names[i] = sq_xstrdup(output ? output : "");
        i++;
    }
    if (step < 0) {
        free(sigs);
        free_names(names, i);
        return step;
    }
    *out = sigs;
    *outputs = names;
    *n = i;
    return 0;
}

static int add_member(mdb_t *db, int64_t group_id, int64_t model_id, const char *cut_tensor,
                      int cut_node)
{
    static const char sql[] = "INSERT INTO prefix_members (group_id, model_id, cut_tensor, "
                              "cut_node) VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING";
    mdb_q_t *q = mdb_q(db, sql);
    mdb_q_int64(q, 1, group_id);
    mdb_q_int64(q, 2, model_id);
    mdb_q_text(q, 3, cut_tensor);
    mdb_q_int64(q, 4, cut_node);
    return mdb_q_run(q, "insert prefix member");
}

/* The id of the prefix group with that hash, made if there is none. */
static int prefix_group_id(mdb_t *db, const char *hex, const char *spec, int64_t *group_id)
{
    static const char find_sql[] = "SELECT id FROM prefix_groups WHERE prefix_hash = ?";
    static const char ins_sql[] = "INSERT INTO prefix_groups (prefix_hash, input_spec) "
                                  "VALUES (?, ?) RETURNING id";
    mdb_q_t *q = mdb_q(db, find_sql);
    mdb_q_text(q, 1, hex);
    int step = mdb_q_step(q, "find prefix group");
    if (step == 0) {
        q = mdb_q(db, ins_sql);
        mdb_q_text(q, 1, hex);
        mdb_q_text(q, 2, spec);
        step = mdb_q_step(q, "insert prefix group");
    }
    if (step == 1)
        *group_id = mdb_q_int64_at(q, 0);
    mdb_q_reset(q);
    return step == 1 ? 0 : step < 0 ? step : SQ_DB;
}

/* Matches the new model's signatures against every stored ONNX model with
 * the same input spec and joins the group of the best match. */
static int find_prefix_group(mdb_t *db, int64_t id, const char *spec, const mdb_graph_t *g,
                             const mdb_node_sig_t *sigs)
{
    static const char sql[] = "SELECT id FROM models WHERE format = 'onnx' AND input_spec = ? "
                              "AND id != ? ORDER BY id";
    mdb_q_t *q = mdb_q(db, sql);
    mdb_q_text(q, 1, spec);
    mdb_q_int64(q, 2, id);
    int64_t others[256];
    int nothers = 0, step = 1;
    while (nothers < 256 && (step = mdb_q_step(q, "find prefix candidates")) == 1)
        others[nothers++] = mdb_q_int64_at(q, 0);
    mdb_q_reset(q);
    if (step < 0)
        return step;

    mdb_prefix_t best = {0};
    int64_t best_model = 0;
    char best_tensor_b[256] = "";
    for (int i = 0; i < nothers; i++) {
        mdb_node_sig_t *osigs;
        char **onames;
        int on;
        int rc = load_sigs(db, others[i], &osigs, &onames, &on);
        if (rc != 0)
            return rc;
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
    int64_t group_id;
    int rc = prefix_group_id(db, hex, spec, &group_id);
    if (rc != 0)
        return rc;
    /* mdb_prefix_match names nodes; the cut tensor is the cut node's output. */
    const char *cut_a = g->tensors[g->nodes[best.node_a].outputs[0]].name;
    rc = add_member(db, group_id, id, cut_a, best.node_a);
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
        mdb_q_t *q = mdb_q(db, sql);
        char hex[2 * MDB_HASH_LEN + 1];
        mdb_hash_hex(&sigs[i].hash, hex);
        mdb_q_int64(q, 1, id);
        mdb_q_int64(q, 2, i);
        mdb_q_text(q, 3, mdb_op_name(n->op));
        mdb_q_text(q, 4, n->n_outputs > 0 ? g->tensors[n->outputs[0]].name : "");
        mdb_q_text(q, 5, hex);
        mdb_q_int64(q, 6, sigs[i].ancestors);
        mdb_q_int64(q, 7, sigs[i].cut_ok);
        int rc = mdb_q_run(q, "insert node");
        if (rc != 0)
            return rc;
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
    mdb_q_t *q = mdb_q(db, del_sql);
    mdb_q_int64(q, 1, id);
    mdb_q_text(q, 2, kind);
    int rc = mdb_q_run(q, "delete profile");
    for (int i = 0; i < n && rc == 0; i++) {
        q = mdb_q(db, sql);
        mdb_q_int64(q, 1, id);
        mdb_q_text(q, 2, kind);
        mdb_q_text(q, 3, name);
        mdb_q_int64(q, 4, rows[i].batch);
        mdb_q_double(q, 5, rows[i].mean_us);
        mdb_q_double(q, 6, rows[i].std_us);
        mdb_q_int64(q, 7, (int64_t)rows[i].peak_memory_bytes);
        rc = mdb_q_run(q, "insert profile");
    }
    return rc;
}

/* Replaces a model's precision row for a device kind (precision NULL:
 * removes it). A deviation that is not a number is stored as +inf: sqlite
 * keeps no NaN, and a NaN deviation is a non-finite output all the same. */
static int insert_precision(mdb_t *db, int64_t id, const char *kind, const mdb_precision_t *p)
{
    static const char del_sql[] =
        "DELETE FROM profile_precision WHERE model_id = ? AND device_kind = ?";
    static const char sql[] = "INSERT INTO profile_precision (model_id, device_kind, runs, "
                              "max_abs_deviation, max_rel_deviation) VALUES (?, ?, ?, ?, ?)";
    mdb_q_t *q = mdb_q(db, del_sql);
    mdb_q_int64(q, 1, id);
    mdb_q_text(q, 2, kind);
    int rc = mdb_q_run(q, "delete precision");
    if (rc != 0 || p == NULL)
        return rc;
    q = mdb_q(db, sql);
    mdb_q_int64(q, 1, id);
    mdb_q_text(q, 2, kind);
    mdb_q_text(q, 3, p->runs != NULL ? p->runs : "fp32");
    mdb_q_double(q, 4, isnan(p->max_abs_deviation) ? INFINITY : p->max_abs_deviation);
    mdb_q_double(q, 5, isnan(p->max_rel_deviation) ? INFINITY : p->max_rel_deviation);
    return mdb_q_run(q, "insert precision");
}

/* Whether a model with that id exists (1), not (0), or SQ_*. */
static int model_exists(mdb_t *db, int64_t id)
{
    static const char sql[] = "SELECT 1 FROM models WHERE id = ?";
    mdb_q_t *q = mdb_q(db, sql);
    mdb_q_int64(q, 1, id);
    int step = mdb_q_step(q, "find model");
    mdb_q_reset(q);
    return step;
}

/* A model's id is drawn from model_id_seq on sqlite (ids are never handed
 * out again, see migration 3), from models.id's sequence on PostgreSQL
 * (which concurrent writers can draw from). */
#define MODEL_INSERT_SQL(id)                                                                       \
    "INSERT INTO models (id, name, version, sha256, created_at, format, input_name, "              \
    "input, input_layout, preprocess, labels, default_slo_ms, max_batch, outputs, "                \
    "param_bytes, memory_bytes, input_spec, config, status, precision_asked) "                     \
    "VALUES (" id ", ?, ?, ?, ?, ?, ?, ?, 'NCHW', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id"

/* The model file in rows of at most db->file_chunk_bytes, in order (its
 * pieces cut at the spans' ends too): the first in model_files (migration
 * 7: a record's reads never walk it), the rest in model_file_chunks
 * (migration 8). Borrowed, not copied: sent (PostgreSQL) or written
 * (sqlite) from the caller's buffers. */
static int insert_file(mdb_t *db, int64_t id, const mdb_span_t *spans, int nspans)
{
    static const char first_sql[] = "INSERT INTO model_files (model_id, onnx) VALUES (?, ?)";
    static const char chunk_sql[] =
        "INSERT INTO model_file_chunks (model_id, seq, data) VALUES (?, ?, ?)";
    int64_t seq = 0;
    for (int i = 0; i < nspans; i++) {
        const uint8_t *p = spans[i].data;
        for (size_t off = 0; off < spans[i].len;) {
            size_t n = spans[i].len - off;
            if (n > db->file_chunk_bytes)
                n = db->file_chunk_bytes;
            mdb_q_t *q = mdb_q(db, seq == 0 ? first_sql : chunk_sql);
            mdb_q_int64(q, 1, id);
            if (seq > 0)
                mdb_q_int64(q, 2, seq);
            mdb_q_blob(q, seq == 0 ? 2 : 3, p + off, n);
            int rc = mdb_q_run(q, seq == 0 ? "insert model file" : "insert model file chunk");
            if (rc != 0)
                return rc;
            off += n;
            seq++;
        }
    }
    return 0;
}

typedef struct {
    const mdb_new_model_t *m;
    char *spec;
    int64_t id;
} model_insert_t;

static int model_insert_tx(mdb_t *db, void *arg)
{
    static const char exists_sql[] = "SELECT 1 FROM models WHERE name = ? AND version = ?";
    static const char sqlite_sql[] = MODEL_INSERT_SQL("(SELECT last + 1 FROM model_id_seq)");
    static const char pg_sql[] = MODEL_INSERT_SQL("DEFAULT");
    model_insert_t *ins = arg;
    const mdb_new_model_t *m = ins->m;
    mdb_q_t *q = mdb_q(db, exists_sql);
    mdb_q_text(q, 1, m->name);
    mdb_q_int64(q, 2, m->version);
    int exists = mdb_q_step(q, "check model");
    mdb_q_reset(q);
    if (exists < 0)
        return exists;
    if (exists == 1) {
        snprintf(db->errmsg, sizeof(db->errmsg), "model %s version %d already exists", m->name,
                 m->version);
        return SQ_EXISTS;
    }
    q = mdb_q(db, mdb_sql(db, sqlite_sql, pg_sql));
    mdb_q_text(q, 1, m->name);
    mdb_q_int64(q, 2, m->version);
    mdb_q_text(q, 3, m->sha256);
    mdb_q_double(q, 4, sq_wall_s());
    mdb_q_text(q, 5, m->format);
    mdb_q_text(q, 6, json_string_value(json_object_get(m->input, "name")));
    mdb_q_json(q, 7, m->input);
    mdb_q_json(q, 8, m->preprocess);
    mdb_q_json(q, 9, m->labels);
    mdb_q_double(q, 10, m->default_slo_ms);
    mdb_q_int64(q, 11, m->max_batch);
    mdb_q_json(q, 12, m->outputs);
    mdb_q_int64(q, 13, (int64_t)m->param_bytes);
    mdb_q_int64(q, 14, (int64_t)m->memory_bytes);
    mdb_q_text(q, 15, ins->spec);
    mdb_q_json(q, 16, m->config);
    mdb_q_text(q, 17, m->status);
    mdb_q_text(q, 18, m->precision != NULL ? m->precision : "fp32");
    int step = mdb_q_step(q, "insert model");
    if (step != 1)
        return step < 0 ? step : SQ_DB;
    ins->id = mdb_q_int64_at(q, 0);
    mdb_q_reset(q);
    int rc = mdb__not_on_insert(db, ins->id, m->not_on);
    if (rc != 0)
        return rc;
    if ((rc = insert_file(db, ins->id, m->onnx_spans, m->n_onnx_spans)) != 0)
        return rc;
    if (m->graph != NULL) {
        mdb_node_sig_t *sigs = sq_xcalloc((size_t)m->graph->n_nodes + 1, sizeof(*sigs));
        rc = mdb_graph_signature(m->graph, sigs);
        if (rc == 0)
            rc = insert_nodes(db, ins->id, m->graph, sigs);
        if (rc == 0)
            rc = find_prefix_group(db, ins->id, ins->spec, m->graph, sigs);
        free(sigs);
        /* (name, version) was checked: any other clash is not "exists". */
        if (rc == SQ_EXISTS)
            rc = SQ_DB;
    }
    if (rc == 0 && m->nprofile > 0)
        rc = insert_profile(db, ins->id, m->profile_device_kind, m->profile_device_kind, m->profile,
                            m->nprofile);
    /* A given profile's device (the emulated one) runs FP32. */
    const mdb_precision_t fp32 = {.runs = "fp32"};
    if (rc == 0 && m->nprofile > 0)
        rc = insert_precision(db, ins->id, m->profile_device_kind, &fp32);
    return rc == SQ_EXISTS ? SQ_DB : rc;
}

int mdb_model_insert(mdb_t *db, const mdb_new_model_t *m, int64_t *id_out)
{
    model_insert_t ins = {.m = m, .spec = input_spec(m)};
    int rc = mdb_write(db, model_insert_tx, &ins);
    free(ins.spec);
    if (rc == 0 && id_out != NULL)
        *id_out = ins.id;
    return rc;
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
    mdb_q_t *q = mdb_q(db, rows_sql);
    int step;
    while (rc == 0 && (step = mdb_q_step(q, "read group profiles")) == 1) {
        const char *shas = mdb_q_text_at(q, 1);
        int stale = 0;
        for (const char *p = shas ? shas : ""; *p != '\0' && !stale && rc == 0;) {
            size_t n = strcspn(p, " ");
            if (n > 0) {
                mdb_q_t *held = mdb_q(db, held_sql);
                mdb_q_text_n(held, 1, p, n);
                int h = mdb_q_step(held, "find member file");
                mdb_q_reset(held);
                if (h < 0)
                    rc = h;
                stale = h == 0;
            }
            p += n + (p[n] == ' ');
        }
        if (stale) {
            if (ngone == cap) {
                cap = cap ? 2 * cap : 8;
                gone = sq_xrealloc(gone, sizeof(*gone) * (size_t)cap);
            }
            gone[ngone++] = mdb_q_int64_at(q, 0);
        }
    }
    mdb_q_reset(q);
    if (rc == 0 && step < 0)
        rc = step;
    for (int i = 0; i < ngone && rc == 0; i++) {
        mdb_q_t *del = mdb_q(db, del_sql);
        mdb_q_int64(del, 1, gone[i]);
        rc = mdb_q_run(del, "delete group profile");
    }
    free(gone);
    return rc;
}

typedef struct {
    const char *name;
    int version;
    int deleted;
} model_delete_t;

static int model_delete_tx(mdb_t *db, void *arg)
{
    static const char sql[] = "DELETE FROM models WHERE name = ? AND (version = ? OR ? = 0)";
    model_delete_t *del = arg;
    mdb_q_t *q = mdb_q(db, sql);
    mdb_q_text(q, 1, del->name);
    mdb_q_int64(q, 2, del->version);
    mdb_q_int64(q, 3, del->version);
    int rc = mdb_q_run(q, "delete model");
    if (rc != 0)
        return rc;
    del->deleted = (int)mdb_q_changes(q);
    if (del->deleted > 0 && (rc = purge_group_profiles(db)) != 0)
        return rc;
    return mdb_exec(db, "DELETE FROM prefix_members WHERE group_id IN (SELECT group_id FROM "
                        "prefix_members GROUP BY group_id HAVING count(*) < 2);"
                        "DELETE FROM prefix_groups WHERE id NOT IN (SELECT group_id FROM "
                        "prefix_members);");
}

int mdb_model_delete(mdb_t *db, const char *name, int version, int *deleted)
{
    model_delete_t del = {.name = name, .version = version};
    *deleted = 0;
    int rc = mdb_write(db, model_delete_tx, &del);
    if (rc != 0)
        return rc;
    *deleted = del.deleted;
    return *deleted > 0 ? 0 : SQ_MODEL_NOT_FOUND;
}

typedef struct {
    const char *name;
    int unloaded;
    int n;
} set_unloaded_t;

static int set_unloaded_tx(mdb_t *db, void *arg)
{
    static const char sql[] = "UPDATE models SET unloaded = ? WHERE name = ?";
    set_unloaded_t *u = arg;
    mdb_q_t *q = mdb_q(db, sql);
    mdb_q_int64(q, 1, u->unloaded);
    mdb_q_text(q, 2, u->name);
    int rc = mdb_q_run(q, "set model unloaded");
    if (rc != 0)
        return rc;
    u->n = (int)mdb_q_changes(q);
    if (u->n == 0) {
        snprintf(db->errmsg, sizeof(db->errmsg), "no model %s", u->name);
        return SQ_MODEL_NOT_FOUND;
    }
    return 0;
}

int mdb_model_set_unloaded(mdb_t *db, const char *name, int unloaded, int *versions)
{
    set_unloaded_t u = {name, unloaded != 0, 0};
    int rc = mdb_write(db, set_unloaded_tx, &u);
    if (versions != NULL)
        *versions = u.n;
    return rc;
}

int mdb_model_set_status(mdb_t *db, int64_t model_id, const char *status, const char *error)
{
    static const char sql[] = "UPDATE models SET status = ?, error = ? WHERE id = ?";
    mdb_q_t *q = mdb_q(db, sql);
    mdb_q_text(q, 1, status);
    mdb_q_text(q, 2, error);
    mdb_q_int64(q, 3, model_id);
    int rc = mdb_q_run(q, "set model status");
    if (rc != 0)
        return rc;
    if (mdb_q_changes(q) == 0) {
        snprintf(db->errmsg, sizeof(db->errmsg), "model %lld not found", (long long)model_id);
        return SQ_MODEL_NOT_FOUND;
    }
    return 0;
}

typedef struct {
    int64_t from_id, to_id;
} profile_copy_t;

static int profile_copy_tx(mdb_t *db, void *arg)
{
    static const char exists_sql[] = "SELECT count(*) FROM models WHERE id IN (?, ?)";
    static const char del_sql[] = "DELETE FROM profiles WHERE model_id = ?";
    /* The CAST types the parameter for PostgreSQL, which cannot infer it
     * from a select list. */
    static const char copy_sql[] =
        "INSERT INTO profiles (model_id, device_kind, device_name, batch, latency_mean_us, "
        "latency_std_us, peak_memory_bytes, preprocess_us) "
        "SELECT CAST(? AS BIGINT), device_kind, device_name, batch, latency_mean_us, "
        "latency_std_us, peak_memory_bytes, preprocess_us FROM profiles WHERE model_id = ?";
    static const char status_sql[] =
        "UPDATE models SET status = 'ready', error = NULL WHERE id = ?";
    static const char prec_del_sql[] = "DELETE FROM profile_precision WHERE model_id = ?";
    static const char prec_copy_sql[] =
        "INSERT INTO profile_precision (model_id, device_kind, runs, max_abs_deviation, "
        "max_rel_deviation) SELECT CAST(? AS BIGINT), device_kind, runs, max_abs_deviation, "
        "max_rel_deviation FROM profile_precision WHERE model_id = ?";
    const profile_copy_t *c = arg;
    mdb_q_t *q = mdb_q(db, exists_sql);
    mdb_q_int64(q, 1, c->from_id);
    mdb_q_int64(q, 2, c->to_id);
    int step = mdb_q_step(q, "find models");
    if (step != 1)
        return step < 0 ? step : SQ_DB;
    int64_t found = mdb_q_int64_at(q, 0);
    mdb_q_reset(q);
    if (found != 2) {
        snprintf(db->errmsg, sizeof(db->errmsg), "model %lld or %lld was deleted",
                 (long long)c->from_id, (long long)c->to_id);
        return SQ_MODEL_NOT_FOUND;
    }
    q = mdb_q(db, del_sql);
    mdb_q_int64(q, 1, c->to_id);
    int rc = mdb_q_run(q, "delete profile");
    if (rc != 0)
        return rc;
    q = mdb_q(db, copy_sql);
    mdb_q_int64(q, 1, c->to_id);
    mdb_q_int64(q, 2, c->from_id);
    if ((rc = mdb_q_run(q, "copy profile")) != 0)
        return rc;
    if (mdb_q_changes(q) == 0) {
        snprintf(db->errmsg, sizeof(db->errmsg), "model %lld has no profile",
                 (long long)c->from_id);
        return SQ_NOT_FOUND;
    }
    /* The same file under the same precision (twins are found so): the
     * same plans, the same deviations. */
    q = mdb_q(db, prec_del_sql);
    mdb_q_int64(q, 1, c->to_id);
    if ((rc = mdb_q_run(q, "delete precision")) != 0)
        return rc;
    q = mdb_q(db, prec_copy_sql);
    mdb_q_int64(q, 1, c->to_id);
    mdb_q_int64(q, 2, c->from_id);
    if ((rc = mdb_q_run(q, "copy precision")) != 0)
        return rc;
    q = mdb_q(db, status_sql);
    mdb_q_int64(q, 1, c->to_id);
    return mdb_q_run(q, "update status");
}

int mdb_profile_copy(mdb_t *db, int64_t from_id, int64_t to_id)
{
    profile_copy_t c = {from_id, to_id};
    return mdb_write(db, profile_copy_tx, &c);
}

typedef struct {
    int64_t model_id;
    const char *device_kind, *device_name;
    const mdb_profile_row_t *rows;
    int nrows;
    const char *status, *error;
    const mdb_precision_t *precision;
} profile_store_t;

static int profile_store_tx(mdb_t *db, void *arg)
{
    static const char sql[] = "UPDATE models SET status = ?, error = ? WHERE id = ?";
    const profile_store_t *p = arg;
    /* A model deleted while it was measured (the worker's answer and the
     * delete cross): nothing to store, and no foreign key to break. */
    int exists = model_exists(db, p->model_id);
    if (exists < 0)
        return exists;
    if (exists == 0) {
        snprintf(db->errmsg, sizeof(db->errmsg), "model %lld was deleted", (long long)p->model_id);
        return SQ_MODEL_NOT_FOUND;
    }
    int rc = insert_profile(db, p->model_id, p->device_kind, p->device_name, p->rows, p->nrows);
    if (rc == 0)
        rc = insert_precision(db, p->model_id, p->device_kind, p->precision);
    if (rc != 0)
        return rc == SQ_EXISTS ? SQ_DB : rc;
    mdb_q_t *q = mdb_q(db, sql);
    mdb_q_text(q, 1, p->status);
    mdb_q_text(q, 2, p->error);
    mdb_q_int64(q, 3, p->model_id);
    return mdb_q_run(q, "update status");
}

int mdb_profile_store(mdb_t *db, int64_t model_id, const char *device_kind, const char *device_name,
                      const mdb_profile_row_t *rows, int nrows, const char *status,
                      const char *error, const mdb_precision_t *precision)
{
    profile_store_t p = {model_id, device_kind, device_name, rows, nrows, status, error, precision};
    return mdb_write(db, profile_store_tx, &p);
}

void mdb_sha256_hex(const void *data, size_t len, char out[65])
{
    unsigned char md[32];
    unsigned int mdlen = 0;
    EVP_Digest(data, len, md, &mdlen, EVP_sha256(), NULL);
    sq_hex_encode(md, 32, out);
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
    sq_hex_encode(md, 32, out);
    mdb_sha256_free(h);
}

void mdb_sha256_free(mdb_sha256_t *h)
{
    if (h == NULL)
        return;
    EVP_MD_CTX_free(h->ctx);
    free(h);
}
