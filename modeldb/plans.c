/* Plans per epoch, read back at squishd's restart, and the measured
 * profiles of prefix groups: each write one transaction. */
#include "mdb_int.h"

#include <sq.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    long long epoch;
    const char *reason, *plan_json;
    json_t *placements;
} plan_store_t;

static int plan_store_tx(mdb_t *db, void *arg)
{
    static const char plan_sql[] =
        "INSERT INTO plans (epoch, created_at, reason, plan) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (epoch) DO UPDATE SET created_at = excluded.created_at, "
        "reason = excluded.reason, plan = excluded.plan";
    static const char del_sql[] = "DELETE FROM placements WHERE epoch = ?";
    static const char pl_sql[] = "INSERT INTO placements (epoch, device, model_id, slo_ms, batch, "
                                 "duty_cycle_us, rate_rps) VALUES (?, ?, ?, ?, ?, ?, ?)";
    const plan_store_t *ps = arg;
    mdb_q_t *q = mdb_q(db, plan_sql);
    mdb_q_int64(q, 1, ps->epoch);
    mdb_q_double(q, 2, sq_wall_s());
    mdb_q_text(q, 3, ps->reason);
    mdb_q_text(q, 4, ps->plan_json);
    int rc = mdb_q_run(q, "insert plan");
    if (rc != 0)
        return rc;
    q = mdb_q(db, del_sql);
    mdb_q_int64(q, 1, ps->epoch);
    if ((rc = mdb_q_run(q, "delete placements")) != 0)
        return rc;
    size_t i;
    json_t *p;
    json_array_foreach(ps->placements, i, p)
    {
        q = mdb_q(db, pl_sql);
        mdb_q_int64(q, 1, ps->epoch);
        mdb_q_text(q, 2, json_string_value(json_object_get(p, "device")));
        mdb_q_int64(q, 3, json_integer_value(json_object_get(p, "model_id")));
        mdb_q_double(q, 4, json_number_value(json_object_get(p, "slo_ms")));
        mdb_q_int64(q, 5, (int)json_integer_value(json_object_get(p, "batch")));
        mdb_q_double(q, 6, json_number_value(json_object_get(p, "duty_cycle_us")));
        mdb_q_double(q, 7, json_number_value(json_object_get(p, "rate_rps")));
        if ((rc = mdb_q_run(q, "insert placement")) != 0)
            return rc;
    }
    return 0;
}

int mdb_plan_store(mdb_t *db, long long epoch, const char *reason, const char *plan_json,
                   json_t *placements)
{
    plan_store_t ps = {epoch, reason, plan_json, placements};
    int rc = mdb_write(db, plan_store_tx, &ps);
    return rc == SQ_EXISTS ? SQ_DB : rc;
}

long long mdb_plan_last_epoch(mdb_t *db)
{
    static const char sql[] = "SELECT coalesce(max(epoch), 0) FROM plans";
    mdb_q_t *q = mdb_q(db, sql);
    long long e = mdb_q_step(q, "read last epoch") == 1 ? mdb_q_int64_at(q, 0) : 0;
    mdb_q_reset(q); /* a stepped statement would hold its read transaction open */
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
    mdb_q_t *q = mdb_q(db, plan_sql);
    int rc = mdb_q_step(q, "select plan");
    if (rc == 0) {
        mdb_q_reset(q);
        *placements = json_array();
        return 0;
    }
    if (rc < 0) {
        mdb_q_reset(q);
        return rc;
    }
    long long e = mdb_q_int64_at(q, 0);
    json_t *p = mdb_q_json_at(q, 1);
    mdb_q_reset(q);
    if (!json_is_object(p)) {
        json_decref(p);
        snprintf(db->errmsg, sizeof(db->errmsg), "plan of epoch %lld: not a JSON object", e);
        return SQ_DB;
    }
    q = mdb_q(db, pl_sql);
    mdb_q_int64(q, 1, e);
    json_t *all = json_array();
    while ((rc = mdb_q_step(q, "select placements")) == 1) {
        const char *dev = mdb_q_text_at(q, 0);
        json_array_append_new(
            all, json_pack("{s:s, s:I, s:f, s:i, s:f, s:f}", "device", dev ? dev : "", "model_id",
                           (json_int_t)mdb_q_int64_at(q, 1), "slo_ms", mdb_q_double_at(q, 2),
                           "batch", mdb_q_int_at(q, 3), "duty_cycle_us", mdb_q_double_at(q, 4),
                           "rate_rps", mdb_q_double_at(q, 5)));
    }
    mdb_q_reset(q);
    if (rc != 0) {
        json_decref(p);
        json_decref(all);
        return rc;
    }
    *epoch = e;
    *plan = p;
    *placements = all;
    return 0;
}

int mdb_group_profile_store(mdb_t *db, const char *members, const char *member_shas,
                            const char *device_kind, const char *device_name,
                            const mdb_profile_row_t *rows, int nrows)
{
    static const char sql[] =
        "INSERT INTO group_profiles (members, device_kind, device_name, rows, created_at, "
        "member_shas) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (members, device_kind) DO UPDATE "
        "SET device_name = excluded.device_name, rows = excluded.rows, "
        "created_at = excluded.created_at, member_shas = excluded.member_shas";
    if (nrows < 1)
        return SQ_INVAL;
    json_t *a = json_array();
    for (int i = 0; i < nrows; i++)
        json_array_append_new(a, json_pack("[i, f, f, I]", rows[i].batch, rows[i].mean_us,
                                           rows[i].std_us, (json_int_t)rows[i].peak_memory_bytes));
    char *txt = json_dumps(a, JSON_COMPACT);
    json_decref(a);
    if (txt == NULL)
        return SQ_NOMEM;
    mdb_q_t *q = mdb_q(db, sql);
    mdb_q_text(q, 1, members);
    mdb_q_text(q, 2, device_kind);
    mdb_q_text(q, 3, device_name);
    mdb_q_text(q, 4, txt);
    mdb_q_double(q, 5, sq_wall_s());
    mdb_q_text(q, 6, member_shas);
    int rc = mdb_q_run(q, "store group profile");
    free(txt);
    return rc == SQ_EXISTS ? SQ_DB : rc;
}

int mdb_group_profile_get(mdb_t *db, const char *members, const char *device_kind,
                          mdb_profile_row_t **rows, int *nrows)
{
    static const char sql[] =
        "SELECT rows FROM group_profiles WHERE members = ? AND device_kind = ?";
    *rows = NULL;
    *nrows = 0;
    mdb_q_t *q = mdb_q(db, sql);
    mdb_q_text(q, 1, members);
    mdb_q_text(q, 2, device_kind);
    int step = mdb_q_step(q, "read group profile");
    if (step != 1) {
        mdb_q_reset(q);
        return step == 0 ? SQ_NOT_FOUND : step;
    }
    const char *txt = mdb_q_text_at(q, 0);
    json_t *a = txt ? json_loads(txt, 0, NULL) : NULL;
    mdb_q_reset(q);
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
