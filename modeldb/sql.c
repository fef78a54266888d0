/* The front of modeldb's SQL layer: picks the backend, caches statements by
 * their static text, prefixes error detail and runs write transactions. */
#include "mdb_int.h"

#include <sq.h>

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int mdb_sql_open(mdb_t *db, const char *target)
{
    db->ops = mdb_is_postgres(target) ? &mdb__pg_ops : &mdb__sqlite_ops;
    db->dialect = db->ops->dialect;
    return db->ops->open(db, target);
}

void mdb_sql_close(mdb_t *db)
{
    for (int i = 0; i < db->nstmts; i++)
        db->ops->finalize(db->stmts[i].q);
    db->nstmts = 0;
    db->ops->close(db);
}

const char *mdb_sql(const mdb_t *db, const char *sqlite_sql, const char *pg_sql)
{
    return db->dialect == MDB_PG ? pg_sql : sqlite_sql;
}

/* Prefixes the backend's detail with what failed. */
static void prefix_error(mdb_t *db, const char *what)
{
    char keep[sizeof(db->errmsg)];
    snprintf(keep, sizeof(keep), "%s", db->errmsg);
    snprintf(db->errmsg, sizeof(db->errmsg), "%s: %s", what, keep);
}

mdb_q_t *mdb_q(mdb_t *db, const char *sql)
{
    for (int i = 0; i < db->nstmts; i++) {
        if (db->stmts[i].sql == sql) {
            db->ops->reset(db->stmts[i].q);
            return db->stmts[i].q;
        }
    }
    mdb_q_t *q = db->ops->prepare(db, sql);
    if (q == NULL) {
        prefix_error(db, "prepare");
        return NULL;
    }
    q->db = db;
    q->sql = sql;
    /* The SQL texts are the static strings of this module: a full cache
     * is a bug (raise MDB_MAX_STMTS). */
    assert(db->nstmts < MDB_MAX_STMTS);
    db->stmts[db->nstmts++] = (struct mdb_stmt_cache){sql, q};
    return q;
}

void mdb_q_int64(mdb_q_t *q, int i, int64_t v)
{
    if (q != NULL)
        q->db->ops->bind_int64(q, i, v);
}

void mdb_q_double(mdb_q_t *q, int i, double v)
{
    if (q != NULL)
        q->db->ops->bind_double(q, i, v);
}

void mdb_q_text(mdb_q_t *q, int i, const char *s)
{
    if (q == NULL)
        return;
    if (s == NULL)
        q->db->ops->bind_null(q, i);
    else
        q->db->ops->bind_text(q, i, s, strlen(s));
}

void mdb_q_text_n(mdb_q_t *q, int i, const char *s, size_t len)
{
    if (q != NULL)
        q->db->ops->bind_text(q, i, s, len);
}

void mdb_q_blob(mdb_q_t *q, int i, const void *p, size_t len)
{
    if (q == NULL)
        return;
    if (p == NULL)
        q->db->ops->bind_null(q, i);
    else
        q->db->ops->bind_blob(q, i, p, len);
}

void mdb_q_null(mdb_q_t *q, int i)
{
    if (q != NULL)
        q->db->ops->bind_null(q, i);
}

int mdb_q_step(mdb_q_t *q, const char *what)
{
    if (q == NULL)
        return SQ_DB; /* the prepare error is on the handle */
    int rc = q->db->ops->step(q);
    if (rc < 0)
        prefix_error(q->db, what);
    return rc;
}

int mdb_q_run(mdb_q_t *q, const char *what)
{
    int rc = mdb_q_step(q, what);
    return rc > 0 ? 0 : rc;
}

int mdb_q_is_null(mdb_q_t *q, int i)
{
    return q->db->ops->is_null(q, i);
}

int64_t mdb_q_int64_at(mdb_q_t *q, int i)
{
    return q->db->ops->col_int64(q, i);
}

int mdb_q_int_at(mdb_q_t *q, int i)
{
    return (int)q->db->ops->col_int64(q, i);
}

double mdb_q_double_at(mdb_q_t *q, int i)
{
    return q->db->ops->col_double(q, i);
}

const char *mdb_q_text_at(mdb_q_t *q, int i)
{
    return q->db->ops->col_text(q, i);
}

const void *mdb_q_blob_at(mdb_q_t *q, int i, size_t *len)
{
    return q->db->ops->col_blob(q, i, len);
}

int64_t mdb_q_changes(mdb_q_t *q)
{
    return q == NULL ? 0 : q->db->ops->changes(q);
}

void mdb_q_reset(mdb_q_t *q)
{
    if (q != NULL)
        q->db->ops->reset(q);
}

int mdb_exec(mdb_t *db, const char *sql)
{
    return db->ops->exec(db, sql);
}

/* sqlite refuses to commit while a statement of the transaction is still
 * stepping (an INSERT ... RETURNING read once); PostgreSQL results are
 * only memory. Either way nothing is read after the commit. */
static void reset_all(mdb_t *db)
{
    for (int i = 0; i < db->nstmts; i++)
        db->ops->reset(db->stmts[i].q);
}

int mdb_write(mdb_t *db, int (*body)(mdb_t *db, void *arg), void *arg)
{
    for (int attempt = 1;; attempt++) {
        db->errmsg[0] = '\0';
        db->retry = 0;
        int rc = mdb_exec(db, db->ops->begin_sql);
        if (rc != 0) {
            prefix_error(db, "begin");
            return rc;
        }
        rc = body(db, arg);
        reset_all(db);
        if (rc == 0 && (rc = mdb_exec(db, "COMMIT")) != 0)
            prefix_error(db, "commit");
        if (rc == 0)
            return 0;
        char keep[sizeof(db->errmsg)];
        snprintf(keep, sizeof(keep), "%s", db->errmsg);
        int retry = db->retry;
        mdb_exec(db, "ROLLBACK");
        snprintf(db->errmsg, sizeof(db->errmsg), "%s", keep);
        db->retry = 0;
        if (!retry)
            return rc;
        if (attempt == MDB_WRITE_ATTEMPTS) {
            snprintf(db->errmsg, sizeof(db->errmsg), "%.440s (after %d attempts)", keep, attempt);
            return SQ_DB;
        }
    }
}

int mdb_ping(mdb_t *db)
{
    db->errmsg[0] = '\0';
    return db->ops->ping(db);
}

int mdb_leader_try(mdb_t *db, int64_t lock_key, int *is_leader)
{
    *is_leader = 0;
    db->errmsg[0] = '\0';
    return db->ops->leader_try(db, lock_key, is_leader);
}

int mdb_leader_announce(mdb_t *db, const char *address)
{
    char name[64];
    snprintf(name, sizeof(name), "squishd %s", address);
    db->errmsg[0] = '\0';
    return db->ops->session_set(db, "application_name", name);
}

int mdb_leader_who(mdb_t *db, int64_t lock_key, char *out, size_t outlen)
{
    char name[128] = "";
    db->errmsg[0] = '\0';
    int rc = db->ops->leader_who(db, lock_key, name, sizeof(name));
    if (rc != 0)
        return rc;
    snprintf(out, outlen, "%s", strncmp(name, "squishd ", 8) == 0 ? name + 8 : name);
    return 0;
}

int mdb_session_timeouts(mdb_t *db, int dead_after_ms)
{
    /* Keepalive probes from the server every idle/3 s, dead after three
     * unanswered; data unacknowledged for dead_after_ms ends it too. */
    int idle_s = dead_after_ms / 3000 > 0 ? dead_after_ms / 3000 : 1;
    int interval_s = idle_s > 1 ? idle_s / 2 : 1;
    char v[32];
    db->errmsg[0] = '\0';
    int rc;
    snprintf(v, sizeof(v), "%d", idle_s);
    if ((rc = db->ops->session_set(db, "tcp_keepalives_idle", v)) != 0)
        return rc;
    snprintf(v, sizeof(v), "%d", interval_s);
    if ((rc = db->ops->session_set(db, "tcp_keepalives_interval", v)) != 0)
        return rc;
    if ((rc = db->ops->session_set(db, "tcp_keepalives_count", "3")) != 0)
        return rc;
    snprintf(v, sizeof(v), "%d", dead_after_ms);
    return db->ops->session_set(db, "tcp_user_timeout", v);
}

const char *mdb_backend(const mdb_t *db)
{
    return db != NULL && db->ops != NULL ? db->ops->name : "none";
}

void mdb_q_json(mdb_q_t *q, int i, json_t *v)
{
    if (v == NULL) {
        mdb_q_null(q, i);
        return;
    }
    char *txt = json_dumps(v, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY);
    mdb_q_text(q, i, txt);
    free(txt);
}

json_t *mdb_q_json_at(mdb_q_t *q, int i)
{
    const char *txt = mdb_q_text_at(q, i);
    if (txt == NULL)
        return json_null();
    json_t *v = json_loads(txt, JSON_DECODE_ANY, NULL);
    return v ? v : json_null();
}
