/* Pipelines (complex queries): each a validated spec stored as JSON under
 * its name. The gateway validates; the DB only keeps them. */
#include "mdb_int.h"

#include <sq.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *name;
    json_t *spec;
    int replace;
} pipeline_put_t;

static int pipeline_put_tx(mdb_t *db, void *arg)
{
    static const char exists_sql[] = "SELECT 1 FROM pipelines WHERE name = ?";
    static const char put_sql[] =
        "INSERT INTO pipelines (name, spec, created_at) VALUES (?, ?, ?) "
        "ON CONFLICT (name) DO UPDATE SET spec = excluded.spec, created_at = excluded.created_at, "
        "unloaded = 0";
    const pipeline_put_t *p = arg;
    mdb_q_t *q;
    if (!p->replace) {
        q = mdb_q(db, exists_sql);
        mdb_q_text(q, 1, p->name);
        int exists = mdb_q_step(q, "check pipeline");
        mdb_q_reset(q);
        if (exists < 0)
            return exists;
        if (exists == 1) {
            snprintf(db->errmsg, sizeof(db->errmsg), "pipeline %s already exists", p->name);
            return SQ_EXISTS;
        }
    }
    q = mdb_q(db, put_sql);
    mdb_q_text(q, 1, p->name);
    mdb_q_json(q, 2, p->spec);
    mdb_q_double(q, 3, sq_wall_s());
    int rc = mdb_q_run(q, "store pipeline");
    return rc == SQ_EXISTS ? SQ_DB : rc;
}

int mdb_pipeline_put(mdb_t *db, const char *name, json_t *spec, int replace)
{
    if (name == NULL || !json_is_object(spec))
        return SQ_INVAL;
    pipeline_put_t p = {name, spec, replace};
    return mdb_write(db, pipeline_put_tx, &p);
}

int mdb_pipeline_list(mdb_t *db, json_t **out)
{
    static const char sql[] =
        "SELECT name, spec, created_at, unloaded FROM pipelines ORDER BY name";
    *out = NULL;
    mdb_q_t *q = mdb_q(db, sql);
    json_t *all = json_array();
    int rc;
    while ((rc = mdb_q_step(q, "list pipelines")) == 1) {
        json_t *spec = mdb_q_json_at(q, 1);
        if (!json_is_object(spec)) {
            json_decref(spec);
            snprintf(db->errmsg, sizeof(db->errmsg), "pipeline %s: stored spec is not an object",
                     mdb_q_text_at(q, 0));
            rc = SQ_DB;
            break;
        }
        json_array_append_new(all, json_pack("{s:s, s:o, s:f, s:b}", "name", mdb_q_text_at(q, 0),
                                             "spec", spec, "created_at", mdb_q_double_at(q, 2),
                                             "unloaded", mdb_q_int64_at(q, 3) != 0));
    }
    mdb_q_reset(q);
    if (rc != 0) {
        json_decref(all);
        return rc;
    }
    *out = all;
    return 0;
}

static int pipeline_delete_tx(mdb_t *db, void *arg)
{
    static const char sql[] = "DELETE FROM pipelines WHERE name = ?";
    mdb_q_t *q = mdb_q(db, sql);
    mdb_q_text(q, 1, arg);
    int rc = mdb_q_run(q, "delete pipeline");
    if (rc != 0)
        return rc;
    if (mdb_q_changes(q) == 0) {
        snprintf(db->errmsg, sizeof(db->errmsg), "no pipeline %s", (const char *)arg);
        return SQ_NOT_FOUND;
    }
    return 0;
}

int mdb_pipeline_delete(mdb_t *db, const char *name)
{
    return mdb_write(db, pipeline_delete_tx, (void *)name);
}

typedef struct {
    const char *name;
    int unloaded;
} pipeline_unloaded_t;

static int pipeline_unloaded_tx(mdb_t *db, void *arg)
{
    static const char sql[] = "UPDATE pipelines SET unloaded = ? WHERE name = ?";
    const pipeline_unloaded_t *u = arg;
    mdb_q_t *q = mdb_q(db, sql);
    mdb_q_int64(q, 1, u->unloaded);
    mdb_q_text(q, 2, u->name);
    int rc = mdb_q_run(q, "set pipeline unloaded");
    if (rc != 0)
        return rc;
    if (mdb_q_changes(q) == 0) {
        snprintf(db->errmsg, sizeof(db->errmsg), "no pipeline %s", u->name);
        return SQ_NOT_FOUND;
    }
    return 0;
}

int mdb_pipeline_set_unloaded(mdb_t *db, const char *name, int unloaded)
{
    pipeline_unloaded_t u = {name, unloaded != 0};
    return mdb_write(db, pipeline_unloaded_tx, &u);
}
