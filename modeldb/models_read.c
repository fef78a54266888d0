/* Reading models: a model's record as JSON (its row with its profiles,
 * its precision and its prefix group), by name, by version, every model's,
 * by key for a worker, and a model's file (the model_files table). Model
 * storage, the writes, is models.c. */
#include "mdb_int.h"

#include <sq.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static json_t *profiles_json(mdb_t *db, int64_t id)
{
    static const char sql[] = "SELECT device_kind, device_name, batch, latency_mean_us, "
                              "latency_std_us, peak_memory_bytes FROM profiles WHERE model_id = ? "
                              "ORDER BY device_kind, batch";
    json_t *out = json_array();
    mdb_q_t *q = mdb_q(db, sql);
    mdb_q_int64(q, 1, id);
    json_t *cur = NULL;
    while (mdb_q_step(q, "read profiles") == 1) {
        const char *kind = mdb_q_text_at(q, 0);
        if (cur == NULL || strcmp(json_string_value(json_object_get(cur, "device_kind")), kind)) {
            cur = json_pack("{s:s, s:s, s:[], s:[], s:[], s:[]}", "device_kind", kind,
                            "device_name", mdb_q_text_at(q, 1), "batch", "latency_ms",
                            "latency_std_ms", "peak_memory_bytes");
            json_array_append_new(out, cur);
        }
        json_array_append_new(json_object_get(cur, "batch"), json_integer(mdb_q_int_at(q, 2)));
        json_array_append_new(json_object_get(cur, "latency_ms"),
                              json_real(mdb_q_double_at(q, 3) / 1000.0));
        json_array_append_new(json_object_get(cur, "latency_std_ms"),
                              json_real(mdb_q_double_at(q, 4) / 1000.0));
        json_array_append_new(json_object_get(cur, "peak_memory_bytes"),
                              json_integer(mdb_q_int64_at(q, 5)));
    }
    mdb_q_reset(q);
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
    mdb_q_t *q = mdb_q(db, sql);
    mdb_q_int64(q, 1, id);
    if (mdb_q_step(q, "read prefix group") != 1)
        return json_null();
    int64_t gid = mdb_q_int64_at(q, 0);
    json_t *g = json_pack("{s:I, s:s, s:s, s:[]}", "id", (json_int_t)gid, "prefix_hash",
                          mdb_q_text_at(q, 1), "cut_tensor", mdb_q_text_at(q, 2), "members");
    mdb_q_reset(q);
    q = mdb_q(db, members_sql);
    mdb_q_int64(q, 1, gid);
    while (mdb_q_step(q, "read prefix members") == 1)
        json_array_append_new(json_object_get(g, "members"),
                              json_pack("{s:s, s:i, s:s}", "name", mdb_q_text_at(q, 0), "version",
                                        mdb_q_int_at(q, 1), "cut_tensor", mdb_q_text_at(q, 2)));
    mdb_q_reset(q);
    return g;
}

/* record_from_row reads these by index; a query that adds columns after
 * them reads those from RECORD_NCOLUMNS on. */
#define RECORD_NCOLUMNS 20
#define RECORD_COLUMNS                                                                             \
    "id, name, version, sha256, created_at, format, status, error, input_name, input, "            \
    "outputs, preprocess, labels, default_slo_ms, max_batch, param_bytes, memory_bytes, config, "  \
    "unloaded, precision_asked"

static json_t *record_from_row(mdb_q_t *q)
{
    int64_t id = mdb_q_int64_at(q, 0);
    json_t *labels = mdb_q_json_at(q, 12);
    json_t *input = mdb_q_json_at(q, 9);
    const char *err = mdb_q_text_at(q, 7);
    double slo_ms = mdb_q_double_at(q, 13);
    json_t *r = json_pack(
        "{s:s, s:i, s:s, s:f, s:s, s:s, s:s?, s:o, s:o, s:o, s:i, s:o, s:i, s:I, s:I}", "name",
        mdb_q_text_at(q, 1), "version", mdb_q_int_at(q, 2), "sha256", mdb_q_text_at(q, 3),
        "created_at", mdb_q_double_at(q, 4), "format", mdb_q_text_at(q, 5), "status",
        mdb_q_text_at(q, 6), "error", err, "input", input, "outputs", mdb_q_json_at(q, 10),
        "preprocess", mdb_q_json_at(q, 11), "labels_count", (int)json_array_size(labels),
        /* 0 is stored for none (best effort): null */
        "default_slo_ms", slo_ms > 0 ? json_real(slo_ms) : json_null(), "max_batch",
        mdb_q_int_at(q, 14), "param_bytes", (json_int_t)mdb_q_int64_at(q, 15), "memory_bytes",
        (json_int_t)mdb_q_int64_at(q, 16));
    json_decref(labels);
    if (err == NULL)
        json_object_del(r, "error");
    /* The version policy the upload gave (Triton's form), as given. */
    json_t *config = mdb_q_json_at(q, 17);
    json_t *vp = json_is_object(config) ? json_object_get(config, "version_policy") : NULL;
    if (vp != NULL)
        json_object_set(r, "version_policy", vp);
    /* An emulated detector's detections (gw_codec.h), as given. */
    json_t *det = json_is_object(config) ? json_object_get(config, "detections") : NULL;
    if (det != NULL)
        json_object_set(r, "detections", det);
    /* An ONNX detector's output layout and a segmenter's flag, as given. */
    json_t *detector = json_is_object(config) ? json_object_get(config, "detector") : NULL;
    if (json_is_object(detector))
        json_object_set(r, "detector", detector);
    if (json_is_object(config) && json_is_true(json_object_get(config, "segmenter")))
        json_object_set_new(r, "segmenter", json_true());
    json_decref(config);
    /* Unloaded (model control): only when it is, as Triton's index says. */
    if (mdb_q_int64_at(q, 18) != 0)
        json_object_set_new(r, "unloaded", json_true());
    /* The precision asked; the devices' come with finish_record. */
    json_object_set_new(r, "precision",
                        json_pack("{s:s, s:[]}", "asked",
                                  mdb_q_text_at(q, 19) ? mdb_q_text_at(q, 19) : "fp32", "devices"));
    /* The statement is reused by the helpers below: copy what they need first. */
    json_object_set_new(r, "id", json_integer(id));
    return r;
}

/* A deviation as the record shows it: null when not measured (-1) or not
 * finite. */
static json_t *deviation_json(double d)
{
    return d >= 0 && isfinite(d) ? json_real(d) : json_null();
}

/* Per device kind measured: the precision the plan ran and its deviation
 * from FP32, into the record's "precision". */
static void precision_devices(mdb_t *db, int64_t id, json_t *precision)
{
    static const char sql[] = "SELECT device_kind, runs, max_abs_deviation, max_rel_deviation "
                              "FROM profile_precision WHERE model_id = ? ORDER BY device_kind";
    json_t *devices = json_object_get(precision, "devices");
    mdb_q_t *q = mdb_q(db, sql);
    mdb_q_int64(q, 1, id);
    while (devices != NULL && mdb_q_step(q, "read precision") == 1)
        json_array_append_new(devices,
                              json_pack("{s:s, s:s, s:o, s:o}", "device_kind", mdb_q_text_at(q, 0),
                                        "runs", mdb_q_text_at(q, 1), "max_abs_deviation",
                                        deviation_json(mdb_q_double_at(q, 2)), "max_rel_deviation",
                                        deviation_json(mdb_q_double_at(q, 3))));
    mdb_q_reset(q);
}

/* Adds the profile, precision and prefix group to records (after the row
 * loop, since those queries reuse other cached statements). */
static void finish_record_keep_id(mdb_t *db, json_t *r)
{
    int64_t id = json_integer_value(json_object_get(r, "id"));
    json_object_set_new(r, "profiles", profiles_json(db, id));
    precision_devices(db, id, json_object_get(r, "precision"));
    json_object_set_new(r, "not_on", mdb__not_on_json(db, id));
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
    mdb_q_t *q = mdb_q(db, sql);
    mdb_q_text(q, 1, name);
    json_t *versions = json_array();
    int step;
    while ((step = mdb_q_step(q, "read model")) == 1)
        json_array_append_new(versions, record_from_row(q));
    mdb_q_reset(q);
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
    mdb_q_t *q = mdb_q(db, sql);
    mdb_q_text(q, 1, name);
    mdb_q_int64(q, 2, version);
    mdb_q_int64(q, 3, version);
    int step = mdb_q_step(q, "read model version");
    if (step != 1)
        return step == 0 ? SQ_MODEL_NOT_FOUND : step;
    json_t *r = record_from_row(q);
    mdb_q_reset(q);
    finish_record(db, r);
    *out = r;
    return 0;
}

int mdb_model_labels(mdb_t *db, const char *name, int version, json_t **out)
{
    static const char sql[] = "SELECT labels FROM models WHERE name = ? AND (version = ? OR "
                              "? = 0) ORDER BY version DESC LIMIT 1";
    mdb_q_t *q = mdb_q(db, sql);
    mdb_q_text(q, 1, name);
    mdb_q_int64(q, 2, version);
    mdb_q_int64(q, 3, version);
    int step = mdb_q_step(q, "read labels");
    if (step != 1)
        return step == 0 ? SQ_MODEL_NOT_FOUND : step;
    *out = mdb_q_json_at(q, 0);
    mdb_q_reset(q);
    return 0;
}

int mdb_model_list(mdb_t *db, json_t **out)
{
    static const char sql[] = "SELECT name, version, status, format, unloaded FROM models "
                              "ORDER BY name, version";
    mdb_q_t *q = mdb_q(db, sql);
    json_t *models = json_array();
    json_t *cur = NULL;
    int step;
    while ((step = mdb_q_step(q, "list models")) == 1) {
        const char *name = mdb_q_text_at(q, 0);
        if (cur == NULL || strcmp(json_string_value(json_object_get(cur, "name")), name) != 0) {
            cur = json_pack("{s:s, s:[]}", "name", name, "versions");
            json_array_append_new(models, cur);
        }
        json_array_append_new(json_object_get(cur, "versions"), json_integer(mdb_q_int_at(q, 1)));
        json_t *latest = json_pack("{s:i, s:s, s:s}", "version", mdb_q_int_at(q, 1), "status",
                                   mdb_q_text_at(q, 2), "format", mdb_q_text_at(q, 3));
        if (mdb_q_int64_at(q, 4) != 0) /* model control: a name's versions go together */
            json_object_set_new(cur, "unloaded", json_true());
        json_object_set_new(cur, "latest", latest);
    }
    mdb_q_reset(q);
    if (step != 0) {
        json_decref(models);
        return step;
    }
    *out = json_pack("{s:o}", "models", models);
    return 0;
}

int mdb_model_records(mdb_t *db, int64_t key, json_t **out)
{
    static const char sql[] = "SELECT " RECORD_COLUMNS ", labels FROM models "
                              "WHERE id = ? OR ? = 0 ORDER BY id";
    mdb_q_t *q = mdb_q(db, sql);
    mdb_q_int64(q, 1, key);
    mdb_q_int64(q, 2, key);
    json_t *all = json_array();
    int step;
    while ((step = mdb_q_step(q, "read models")) == 1) {
        json_t *r = record_from_row(q);
        json_object_set_new(r, "labels", mdb_q_json_at(q, RECORD_NCOLUMNS));
        json_array_append_new(all, r);
    }
    mdb_q_reset(q);
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
    /* The size first (sqlite reads a blob's length from its record, not
     * its pages), so that the file is read into one buffer piece by piece:
     * each piece is held once more only while it is copied. */
    static const char size_sql[] =
        "SELECT length(f.onnx), (SELECT COALESCE(SUM(length(c.data)), 0) FROM model_file_chunks c "
        "WHERE c.model_id = m.id) FROM models m LEFT JOIN model_files f ON f.model_id = m.id "
        "WHERE m.id = ?";
    static const char first_sql[] = "SELECT onnx FROM model_files WHERE model_id = ?";
    static const char chunks_sql[] =
        "SELECT data FROM model_file_chunks WHERE model_id = ? ORDER BY seq";
    mdb_q_t *q = mdb_q(db, size_sql);
    mdb_q_int64(q, 1, key);
    int step = mdb_q_step(q, "read model file size");
    if (step != 1)
        return step == 0 ? SQ_MODEL_NOT_FOUND : step;
    uint64_t total = (uint64_t)mdb_q_int64_at(q, 0) + (uint64_t)mdb_q_int64_at(q, 1);
    mdb_q_reset(q);
    if (total == 0)
        return SQ_NOT_FOUND;
    uint8_t *buf = malloc((size_t)total);
    if (buf == NULL)
        return SQ_NOMEM;
    size_t have = 0;
    int rc = 0;
    for (int part = 0; part < 2 && rc == 0; part++) {
        q = mdb_q(db, part == 0 ? first_sql : chunks_sql);
        mdb_q_int64(q, 1, key);
        while (rc == 0 && (step = mdb_q_step(q, "read model file")) == 1) {
            size_t n = 0;
            const void *p = mdb_q_blob_at(q, 0, &n);
            if (n > total - have) {
                rc = SQ_DB; /* written meanwhile: a torn read */
                snprintf(db->errmsg, sizeof(db->errmsg), "model %lld's file changed while read",
                         (long long)key);
            } else if (n > 0) {
                memcpy(buf + have, p, n);
                have += n;
            }
        }
        if (rc == 0 && step < 0)
            rc = step;
        mdb_q_reset(q);
    }
    if (rc == 0 && have != total) {
        rc = SQ_DB;
        snprintf(db->errmsg, sizeof(db->errmsg), "model %lld's file changed while read",
                 (long long)key);
    }
    if (rc != 0) {
        free(buf);
        return rc;
    }
    *bytes = buf;
    *len = (size_t)total;
    return 0;
}
