/* The device kinds that cannot run a model, each with its reason: what the
 * importer's rules said at upload (mdb_model_info's not_on), and what a
 * worker of that kind said when it refused the model's load. A record
 * shows them as "not_on": {kind: reason}; squishd neither measures nor
 * serves a model on such a kind. Table model_not_on (migration 7). */
#include "mdb.h"
#include "mdb_int.h"
#include <sq.h>

#include <stdio.h>

json_t *mdb__not_on_json(mdb_t *db, int64_t id)
{
    static const char sql[] = "SELECT device_kind, reason FROM model_not_on WHERE model_id = ? "
                              "ORDER BY device_kind";
    json_t *out = json_object();
    mdb_q_t *q = mdb_q(db, sql);
    mdb_q_int64(q, 1, id);
    while (mdb_q_step(q, "read not_on") == 1)
        json_object_set_new(out, mdb_q_text_at(q, 0), json_string(mdb_q_text_at(q, 1)));
    mdb_q_reset(q);
    return out;
}

/* Inside the caller's transaction. */
static int put(mdb_t *db, int64_t id, const char *kind, const char *reason)
{
    static const char sql[] =
        "INSERT INTO model_not_on (model_id, device_kind, reason) VALUES (?, ?, ?) "
        "ON CONFLICT (model_id, device_kind) DO UPDATE SET reason = excluded.reason";
    mdb_q_t *q = mdb_q(db, sql);
    mdb_q_int64(q, 1, id);
    mdb_q_text(q, 2, kind);
    mdb_q_text(q, 3, reason);
    return mdb_q_run(q, "store not_on");
}

int mdb__not_on_insert(mdb_t *db, int64_t id, json_t *not_on)
{
    const char *kind;
    json_t *reason;
    json_object_foreach(not_on, kind, reason)
    {
        int rc = json_is_string(reason) ? put(db, id, kind, json_string_value(reason)) : 0;
        if (rc != 0)
            return rc;
    }
    return 0;
}

typedef struct {
    int64_t id;
    const char *kind, *reason;
} set_t;

static int set_tx(mdb_t *db, void *arg)
{
    static const char exists_sql[] = "SELECT 1 FROM models WHERE id = ?";
    const set_t *s = arg;
    mdb_q_t *q = mdb_q(db, exists_sql);
    mdb_q_int64(q, 1, s->id);
    int step = mdb_q_step(q, "find model");
    mdb_q_reset(q);
    if (step < 0)
        return step;
    if (step == 0) {
        snprintf(db->errmsg, sizeof(db->errmsg), "model %lld not found", (long long)s->id);
        return SQ_MODEL_NOT_FOUND;
    }
    return put(db, s->id, s->kind, s->reason);
}

int mdb_model_set_not_on(mdb_t *db, int64_t model_id, const char *device_kind, const char *reason)
{
    set_t s = {.id = model_id, .kind = device_kind, .reason = reason};
    return mdb_write(db, set_tx, &s);
}
