/* modeldb's SQL layer on PostgreSQL through libpq: the shared model DB of
 * several squishd processes. Statements are prepared once per session
 * under a name of their own, with the `?` placeholders of the module's SQL
 * rewritten to $1..$n. Scalars go as text parameters (the server infers
 * their types from the SQL); blobs as binary parameters, so that an ONNX
 * file is sent as its bytes, never as a hex or escaped copy. Results come
 * in binary format, so that a bytea comes back as its bytes too, and are
 * decoded by their column type.
 *
 * bytea rather than large objects: a model file is written and read whole,
 * in the same transaction as its row, and goes with the row's DELETE (a
 * large object would need its own unlink and a cleanup of orphans); the
 * price is PostgreSQL's 1 GB limit on one value. */
#include "mdb_int.h"

#include <sq.h>

#include <assert.h>
#include <ctype.h>
#include <libpq-fe.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Built-in type OIDs (fixed in PostgreSQL's catalog; libpq-dev does not
 * ship catalog/pg_type_d.h). */
enum {
    PG_BOOL = 16,
    PG_BYTEA = 17,
    PG_NAME = 19,
    PG_INT8 = 20,
    PG_INT2 = 21,
    PG_INT4 = 23,
    PG_TEXT = 25,
    PG_FLOAT4 = 700,
    PG_FLOAT8 = 701,
    PG_UNKNOWN = 705,
    PG_VARCHAR = 1043,
};

/* The session of a handle. */
typedef struct {
    PGconn *pg;
    /* Bumped by a reconnect: prepared statements and advisory locks live in
     * a session, so every statement is prepared again and a held lock is
     * held no more. */
    unsigned gen;
    unsigned nnames; /* statement names handed out */
    int leading;     /* leader_key is held by session gen leader_gen */
    int64_t leader_key;
    unsigned leader_gen;
    /* Session settings to set again after a reconnect (session_set). */
    struct {
        char name[32];
        char value[64];
    } settings[8];
    int nsettings;
} pg_conn_t;

typedef struct {
    mdb_q_t base;
    char name[24];
    unsigned gen; /* the session it was prepared in; 0: none yet */
    char *sql;    /* with $n placeholders */
    int nparams;
    const char **values;
    int *lengths;
    int *formats;
    char **owned;  /* the copies of text and number parameters */
    int too_large; /* a blob past what a libpq parameter can carry */
    PGresult *res;
    int row;
    int nrows;
} pg_q_t;

static pg_conn_t *conn_of(mdb_t *db)
{
    return db->conn;
}

static pg_q_t *pq_of(mdb_q_t *q)
{
    return (pg_q_t *)q;
}

/* libpq's messages end in a newline and may span lines: one line for logs. */
static void set_message(mdb_t *db, const char *msg)
{
    snprintf(db->errmsg, sizeof(db->errmsg), "%s", msg && *msg ? msg : "unknown libpq error");
    size_t n = strlen(db->errmsg);
    while (n > 0 && (db->errmsg[n - 1] == '\n' || db->errmsg[n - 1] == ' '))
        db->errmsg[--n] = '\0';
    for (char *p = db->errmsg; *p; p++)
        if (*p == '\n' || *p == '\t')
            *p = ' ';
}

/* A failed result (or none: the connection broke) as squish's code, with
 * the server's message on the handle. */
static int result_error(mdb_t *db, const PGresult *res)
{
    const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
    const char *msg = res ? PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY) : NULL;
    const char *detail = res ? PQresultErrorField(res, PG_DIAG_MESSAGE_DETAIL) : NULL;
    if (msg != NULL) {
        char both[sizeof(db->errmsg)];
        snprintf(both, sizeof(both), "%s%s%s", msg, detail ? " " : "", detail ? detail : "");
        set_message(db, both);
    } else {
        set_message(db, PQerrorMessage(conn_of(db)->pg));
    }
    if (state == NULL)
        return SQ_DB;
    if (strcmp(state, "23505") == 0) /* unique_violation: as sqlite's UNIQUE */
        return SQ_EXISTS;
    /* serialization_failure, deadlock_detected: another writer won; the
     * transaction can run again (mdb_write). */
    if (strcmp(state, "40001") == 0 || strcmp(state, "40P01") == 0)
        db->retry = 1;
    if (strcmp(state, "53200") == 0) /* out_of_memory */
        return SQ_NOMEM;
    if (strcmp(state, "54000") == 0) /* program_limit_exceeded: a value past 1 GB */
        return SQ_TOO_LARGE;
    return SQ_DB;
}

static int pg_exec(mdb_t *db, const char *sql)
{
    PGresult *res = PQexec(conn_of(db)->pg, sql);
    ExecStatusType st = PQresultStatus(res);
    int rc = st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK ? 0 : result_error(db, res);
    PQclear(res);
    return rc;
}

/* CREATE TABLE IF NOT EXISTS and friends say NOTICE; libpq would print
 * it on stderr. */
static void ignore_notice(void *arg, const char *message)
{
    (void)arg;
    (void)message;
}

static int apply_setting(mdb_t *db, const char *name, const char *value)
{
    const char *params[2] = {name, value};
    PGresult *res = PQexecParams(conn_of(db)->pg, "SELECT set_config($1, $2, false)", 2, NULL,
                                 params, NULL, NULL, 0);
    int rc = PQresultStatus(res) == PGRES_TUPLES_OK ? 0 : result_error(db, res);
    PQclear(res);
    return rc;
}

/* A session just (re)connected: an error prefixed with what was done, or
 * its notices silenced and the session settings (session_set) in force. */
static int session_ready(mdb_t *db, const char *what)
{
    pg_conn_t *c = conn_of(db);
    if (PQstatus(c->pg) != CONNECTION_OK) {
        char keep[sizeof(db->errmsg)];
        set_message(db, PQerrorMessage(c->pg));
        snprintf(keep, sizeof(keep), "%s", db->errmsg);
        snprintf(db->errmsg, sizeof(db->errmsg), "%s: %.480s", what, keep);
        return SQ_DB;
    }
    PQsetNoticeProcessor(c->pg, ignore_notice, NULL);
    for (int i = 0; i < c->nsettings; i++)
        if (apply_setting(db, c->settings[i].name, c->settings[i].value) != 0)
            return SQ_DB;
    return 0;
}

static int pg_open(mdb_t *db, const char *target)
{
    pg_conn_t *c = sq_xcalloc(1, sizeof(*c));
    db->conn = c;
    /* target is expanded as a conninfo or URI; an application_name it
     * gives wins over the fallback. */
    const char *const keys[] = {"dbname", "fallback_application_name", NULL};
    const char *const values[] = {target, "squishd", NULL};
    c->pg = PQconnectdbParams(keys, values, 1);
    c->gen = 1;
    if (c->pg == NULL) {
        set_message(db, "connect: out of memory");
        return SQ_NOMEM;
    }
    return session_ready(db, "connect");
}

static void pg_close(mdb_t *db)
{
    pg_conn_t *c = conn_of(db);
    if (c == NULL)
        return;
    PQfinish(c->pg);
    free(c);
    db->conn = NULL;
}

/* The module's SQL with each `?` outside quotes as $1..$n. */
static char *rewrite_placeholders(const char *sql, int *nparams)
{
    size_t len = strlen(sql);
    char *out = sq_xmalloc(len * 4 + 1); /* "?" -> "$nnn" at most */
    char *o = out;
    int n = 0;
    char quote = 0;
    for (const char *p = sql; *p; p++) {
        if (quote != 0) {
            if (*p == quote)
                quote = 0;
            *o++ = *p;
        } else if (*p == '\'' || *p == '"') {
            quote = *p;
            *o++ = *p;
        } else if (*p == '?') {
            o += sprintf(o, "$%d", ++n);
        } else {
            *o++ = *p;
        }
    }
    *o = '\0';
    *nparams = n;
    return out;
}

static mdb_q_t *pg_prepare(mdb_t *db, const char *sql)
{
    pg_conn_t *c = conn_of(db);
    pg_q_t *q = sq_xcalloc(1, sizeof(*q));
    q->sql = rewrite_placeholders(sql, &q->nparams);
    snprintf(q->name, sizeof(q->name), "mdb_%u", ++c->nnames);
    size_t n = (size_t)q->nparams + 1;
    q->values = sq_xcalloc(n, sizeof(*q->values));
    q->lengths = sq_xcalloc(n, sizeof(*q->lengths));
    q->formats = sq_xcalloc(n, sizeof(*q->formats));
    q->owned = sq_xcalloc(n, sizeof(*q->owned));
    q->base.db = db;
    /* Prepared now, so that an SQL error shows at the prepare as sqlite's
     * does; again after a reconnect, at the next step. */
    PGresult *res = PQprepare(c->pg, q->name, q->sql, q->nparams, NULL);
    if (PQresultStatus(res) != PGRES_COMMAND_OK) {
        result_error(db, res);
        PQclear(res);
        free(q->sql);
        free(q->values);
        free(q->lengths);
        free(q->formats);
        free(q->owned);
        free(q);
        return NULL;
    }
    PQclear(res);
    q->gen = c->gen;
    return &q->base;
}

static void clear_bindings(pg_q_t *q)
{
    for (int i = 0; i < q->nparams; i++) {
        free(q->owned[i]);
        q->owned[i] = NULL;
        q->values[i] = NULL;
        q->lengths[i] = 0;
        q->formats[i] = 0;
    }
    q->too_large = 0;
}

static void pg_reset(mdb_q_t *base)
{
    pg_q_t *q = pq_of(base);
    PQclear(q->res);
    q->res = NULL;
    q->row = -1;
    q->nrows = 0;
    clear_bindings(q);
}

static void pg_finalize(mdb_q_t *base)
{
    pg_q_t *q = pq_of(base);
    pg_reset(base);
    /* The prepared statement goes with the session (PQfinish). */
    free(q->sql);
    free(q->values);
    free(q->lengths);
    free(q->formats);
    free(q->owned);
    free(q);
}

/* Parameter i (from 1) as owned text. */
static void bind_owned(pg_q_t *q, int i, char *text)
{
    assert(i >= 1 && i <= q->nparams);
    free(q->owned[i - 1]);
    q->owned[i - 1] = text;
    q->values[i - 1] = text;
    q->lengths[i - 1] = 0;
    q->formats[i - 1] = 0;
}

static void pg_bind_int64(mdb_q_t *q, int i, int64_t v)
{
    char buf[24];
    snprintf(buf, sizeof(buf), "%lld", (long long)v);
    bind_owned(pq_of(q), i, sq_xstrdup(buf));
}

static void pg_bind_double(mdb_q_t *q, int i, double v)
{
    char buf[40];
    snprintf(buf, sizeof(buf), "%.17g", v); /* round-trips; float8in reads inf and nan */
    bind_owned(pq_of(q), i, sq_xstrdup(buf));
}

static void pg_bind_text(mdb_q_t *q, int i, const char *s, size_t len)
{
    char *copy = sq_xmalloc(len + 1);
    memcpy(copy, s, len);
    copy[len] = '\0';
    bind_owned(pq_of(q), i, copy);
}

static void pg_bind_blob(mdb_q_t *base, int i, const void *p, size_t len)
{
    pg_q_t *q = pq_of(base);
    bind_owned(q, i, NULL);
    if (len > INT_MAX) {
        q->too_large = 1;
        return;
    }
    q->values[i - 1] = p;
    q->lengths[i - 1] = (int)len;
    q->formats[i - 1] = 1; /* binary: the bytes as they are */
}

static void pg_bind_null(mdb_q_t *q, int i)
{
    bind_owned(pq_of(q), i, NULL);
}

static int pg_step(mdb_q_t *base)
{
    pg_q_t *q = pq_of(base);
    mdb_t *db = base->db;
    pg_conn_t *c = conn_of(db);
    if (q->res == NULL) {
        if (q->too_large) {
            snprintf(db->errmsg, sizeof(db->errmsg),
                     "a value of more than %d bytes cannot be sent to PostgreSQL", INT_MAX);
            return SQ_TOO_LARGE;
        }
        if (PQstatus(c->pg) != CONNECTION_OK) {
            set_message(db, PQerrorMessage(c->pg));
            return SQ_DB;
        }
        if (q->gen != c->gen) {
            PGresult *res = PQprepare(c->pg, q->name, q->sql, q->nparams, NULL);
            int ok = PQresultStatus(res) == PGRES_COMMAND_OK;
            int rc = ok ? 0 : result_error(db, res);
            PQclear(res);
            if (rc != 0)
                return rc;
            q->gen = c->gen;
        }
        PGresult *res =
            PQexecPrepared(c->pg, q->name, q->nparams, q->values, q->lengths, q->formats, 1);
        ExecStatusType st = PQresultStatus(res);
        if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK) {
            int rc = result_error(db, res);
            PQclear(res);
            return rc;
        }
        q->res = res;
        q->nrows = PQntuples(res);
        q->row = -1;
    }
    if (q->row < q->nrows)
        q->row++;
    return q->row < q->nrows ? 1 : 0;
}

static int pg_is_null(mdb_q_t *base, int i)
{
    pg_q_t *q = pq_of(base);
    return PQgetisnull(q->res, q->row, i);
}

static uint64_t be_bytes(const char *p, int n)
{
    uint64_t v = 0;
    for (int k = 0; k < n; k++)
        v = v << 8 | (unsigned char)p[k];
    return v;
}

static double be_double(const char *p, int n)
{
    if (n == 4) {
        uint32_t bits = (uint32_t)be_bytes(p, 4);
        float f;
        memcpy(&f, &bits, sizeof(f));
        return f;
    }
    uint64_t bits = be_bytes(p, 8);
    double d;
    memcpy(&d, &bits, sizeof(d));
    return d;
}

static int64_t pg_col_int64(mdb_q_t *base, int i)
{
    pg_q_t *q = pq_of(base);
    if (PQgetisnull(q->res, q->row, i))
        return 0;
    const char *p = PQgetvalue(q->res, q->row, i);
    switch (PQftype(q->res, i)) {
    case PG_INT8:
        return (int64_t)be_bytes(p, 8);
    case PG_INT4:
        return (int32_t)be_bytes(p, 4);
    case PG_INT2:
        return (int16_t)be_bytes(p, 2);
    case PG_BOOL:
        return p[0] != 0;
    case PG_FLOAT4:
        return (int64_t)be_double(p, 4);
    case PG_FLOAT8:
        return (int64_t)be_double(p, 8);
    default:
        assert(!"an integer read from a column of another type");
        return 0;
    }
}

static double pg_col_double(mdb_q_t *base, int i)
{
    pg_q_t *q = pq_of(base);
    if (PQgetisnull(q->res, q->row, i))
        return 0;
    const char *p = PQgetvalue(q->res, q->row, i);
    switch (PQftype(q->res, i)) {
    case PG_FLOAT8:
        return be_double(p, 8);
    case PG_FLOAT4:
        return be_double(p, 4);
    default:
        return (double)pg_col_int64(base, i);
    }
}

static const char *pg_col_text(mdb_q_t *base, int i)
{
    pg_q_t *q = pq_of(base);
    if (PQgetisnull(q->res, q->row, i))
        return NULL;
    Oid type = PQftype(q->res, i);
    (void)type;
    /* A binary text value is its bytes; libpq ends every value with a NUL. */
    assert(type == PG_TEXT || type == PG_VARCHAR || type == PG_NAME || type == PG_UNKNOWN);
    return PQgetvalue(q->res, q->row, i);
}

static const void *pg_col_blob(mdb_q_t *base, int i, size_t *len)
{
    pg_q_t *q = pq_of(base);
    *len = 0;
    if (PQgetisnull(q->res, q->row, i))
        return NULL;
    *len = (size_t)PQgetlength(q->res, q->row, i);
    return PQgetvalue(q->res, q->row, i);
}

static int64_t pg_changes(mdb_q_t *base)
{
    pg_q_t *q = pq_of(base);
    const char *n = q->res ? PQcmdTuples(q->res) : "";
    return *n ? strtoll(n, NULL, 10) : 0;
}

static int pg_session_set(mdb_t *db, const char *name, const char *value)
{
    pg_conn_t *c = conn_of(db);
    int i = 0;
    while (i < c->nsettings && strcmp(c->settings[i].name, name) != 0)
        i++;
    if (i == (int)(sizeof(c->settings) / sizeof(c->settings[0])) ||
        strlen(name) >= sizeof(c->settings[i].name) ||
        strlen(value) >= sizeof(c->settings[i].value)) {
        snprintf(db->errmsg, sizeof(db->errmsg), "session setting %s: too many or too long", name);
        return SQ_INVAL;
    }
    snprintf(c->settings[i].name, sizeof(c->settings[i].name), "%s", name);
    snprintf(c->settings[i].value, sizeof(c->settings[i].value), "%s", value);
    if (i == c->nsettings)
        c->nsettings++;
    return apply_setting(db, name, value);
}

/* The session holding advisory lock key (a bigint lock: classid the high
 * 32 bits, objid the low, objsubid 1) in this database. */
static int pg_leader_who(mdb_t *db, int64_t key, char *out, size_t outlen)
{
    char hi[24], lo[24];
    snprintf(hi, sizeof(hi), "%lld", (long long)((uint64_t)key >> 32));
    snprintf(lo, sizeof(lo), "%lld", (long long)((uint64_t)key & 0xffffffffu));
    const char *params[2] = {hi, lo};
    PGresult *res = PQexecParams(
        conn_of(db)->pg,
        "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
        " WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1"
        " AND l.classid::bigint = $1::bigint AND l.objid::bigint = $2::bigint"
        " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        " LIMIT 1",
        2, NULL, params, NULL, NULL, 0);
    if (PQresultStatus(res) != PGRES_TUPLES_OK) {
        int rc = result_error(db, res);
        PQclear(res);
        return rc;
    }
    int rc = SQ_NOT_FOUND;
    if (PQntuples(res) == 1) {
        snprintf(out, outlen, "%s", PQgetvalue(res, 0, 0));
        rc = 0;
    }
    PQclear(res);
    return rc;
}

static int pg_ping(mdb_t *db)
{
    pg_conn_t *c = conn_of(db);
    if (PQstatus(c->pg) == CONNECTION_OK) {
        PGresult *res = PQexec(c->pg, "SELECT 1");
        int ok = PQresultStatus(res) == PGRES_TUPLES_OK;
        PQclear(res);
        if (ok)
            return 0;
    }
    PQreset(c->pg);
    c->gen++;
    c->leading = 0;
    return session_ready(db, "reconnect") == 0 ? 1 : SQ_DB;
}

static int pg_leader_try(mdb_t *db, int64_t key, int *is_leader)
{
    pg_conn_t *c = conn_of(db);
    /* A broken session has lost its lock: reconnect and try again. */
    int rc = pg_ping(db);
    if (rc < 0)
        return rc;
    /* Held already: the ping proved the session (and so the lock) alive.
     * Not asked again: pg_try_advisory_lock counts, and a leader that
     * polls would pile up holds. */
    if (c->leading && c->leader_key == key && c->leader_gen == c->gen) {
        *is_leader = 1;
        return 0;
    }
    char sql[64];
    snprintf(sql, sizeof(sql), "SELECT pg_try_advisory_lock(%lld)", (long long)key);
    PGresult *res = PQexecParams(c->pg, sql, 0, NULL, NULL, NULL, NULL, 0);
    if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1) {
        rc = result_error(db, res);
        PQclear(res);
        return rc;
    }
    *is_leader = strcmp(PQgetvalue(res, 0, 0), "t") == 0;
    PQclear(res);
    if (*is_leader) {
        c->leading = 1;
        c->leader_key = key;
        c->leader_gen = c->gen;
    }
    return 0;
}

const mdb_sql_ops_t mdb__pg_ops = {
    .name = "postgresql",
    .dialect = MDB_PG,
    /* SERIALIZABLE: a read-modify-write (is this version taken? which
     * prefix group does the new model join?) that another squishd's write
     * invalidates is aborted, and mdb_write runs it again. */
    .begin_sql = "BEGIN ISOLATION LEVEL SERIALIZABLE",
    .open = pg_open,
    .close = pg_close,
    .exec = pg_exec,
    .prepare = pg_prepare,
    .finalize = pg_finalize,
    .reset = pg_reset,
    .bind_int64 = pg_bind_int64,
    .bind_double = pg_bind_double,
    .bind_text = pg_bind_text,
    .bind_blob = pg_bind_blob,
    .bind_null = pg_bind_null,
    .step = pg_step,
    .is_null = pg_is_null,
    .col_int64 = pg_col_int64,
    .col_double = pg_col_double,
    .col_text = pg_col_text,
    .col_blob = pg_col_blob,
    .changes = pg_changes,
    .ping = pg_ping,
    .leader_try = pg_leader_try,
    .leader_who = pg_leader_who,
    .session_set = pg_session_set,
};

int mdb_is_postgres(const char *target)
{
    if (target == NULL)
        return 0;
    if (strncmp(target, "postgresql://", 13) == 0 || strncmp(target, "postgres://", 11) == 0)
        return 1;
    /* A key=value conninfo starts with a keyword ("host=", "dbname = x");
     * a file name with an '=' has a '/' or '.' before it. */
    const char *p = target;
    while (isspace((unsigned char)*p))
        p++;
    const char *word = p;
    while (isalpha((unsigned char)*p) || *p == '_')
        p++;
    if (p == word)
        return 0;
    while (isspace((unsigned char)*p))
        p++;
    return *p == '=';
}

void mdb_target_describe(const char *target, char *out, size_t outlen)
{
    if (!mdb_is_postgres(target)) {
        snprintf(out, outlen, "%s", target);
        return;
    }
    /* Everything of the conninfo but its password, for logs. */
    PQconninfoOption *opts = PQconninfoParse(target, NULL);
    if (opts == NULL) {
        snprintf(out, outlen, "postgresql (a conninfo that does not parse)");
        return;
    }
    size_t n = (size_t)snprintf(out, outlen, "postgresql");
    for (PQconninfoOption *o = opts; o->keyword != NULL; o++) {
        if (o->val == NULL || o->val[0] == '\0' || strcmp(o->keyword, "password") == 0)
            continue;
        n += (size_t)snprintf(out + (n < outlen ? n : outlen), n < outlen ? outlen - n : 0,
                              " %s=%s", o->keyword, o->val);
    }
    PQconninfoFree(opts);
}
