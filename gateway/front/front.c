/* A frontend's link to the dispatcher and to the workers (gw_front.h).
 *
 * Items: each item offered gets a slot (a generation-checked id, as the
 * dispatcher's handles), named in FE_ITEMS; the slot holds the item until
 * it is answered, by the worker's DATA_OUTPUT (its row), the dispatcher's
 * FE_FAIL, or the loss of the connection its answer would come on. An
 * item is answered exactly once: its slot is freed as it is, and whatever
 * names the slot later (a late assignment, a late failure) finds nothing.
 *
 * Everything below runs on the frontend's thread. */
#include "gw_front.h"
#include "gw_sched.h"
#include "gw_metrics.h"

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <openssl/crypto.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define DIAL_TIMEOUT_MS 1000
#define HANDSHAKE_TIMEOUT_MS 5000
#define TICK_MS 100
#define REJOIN_MIN_MS 100
#define REJOIN_MAX_MS 2000
/* Slot indexes: the dispatcher refuses more (FE_MAX_SLOTS there). */
#define MAX_SLOTS (1u << 22)
/* DATA_ROWS frames stay below this (a batch's rows go in several). */
#define ROWS_FRAME_BYTES (SQ_IPC_MAX_PAYLOAD - (64u << 10))

enum { SLOT_FREE, SLOT_OFFERED, SLOT_ASSIGNED };

typedef struct {
    gw_item_t *item;
    uint32_t gen;
    uint32_t next_free; /* index + 1 of the next free slot; 0 none */
    uint8_t state;
} slot_t;

/* Rows of a batch sent to a worker, whose outputs are to come. */
typedef struct assign {
    struct assign *next;
    uint64_t batch_id;
    uint32_t n;
    uint64_t *slot;
    uint32_t *row;
} assign_t;

/* A connection to a worker's data address. */
typedef struct data_conn {
    struct data_conn *next;
    struct gw_front *fr;
    char addr[64];
    sq_conn_t conn;
    assign_t *assigns;
    /* On the worker's local data socket: the worker mapped this frontend's
     * arena, and rows go as offsets in it. */
    int shm;
} data_conn_t;

struct gw_front {
    gw_sched_t sched; /* first: the scheduling interface (gw_front_sched) */
    gw_server_t *srv;
    sq_loop_t *loop;
    pthread_t thread;
    int started;
    char addrs[8][128];
    int naddrs, next_addr;
    uint8_t token[SQ_AUTH_MAX_TOKEN];
    size_t token_len;
    sq_tls_t *tls;
    /* the dispatcher */
    sq_conn_t conn;
    int joined;
    int fe_id;
    char admin[128];
    uint32_t heartbeat_ms;
    int64_t last_heard_ns;
    sq_backoff_t rejoin; /* REJOIN_MIN_MS, doubling up to REJOIN_MAX_MS */
    int64_t rejoin_at_ns;
    int stopping;
    uint64_t tick;
    /* items */
    slot_t *slots;
    uint32_t nslots, free_slot;
    data_conn_t *data;
    atomic_int withdraw_posted;
    sq_buf_t scratch;
    /* bytes on the dispatcher's link and on the workers' (frame headers
     * included), items offered: for /metrics */
    _Atomic uint64_t link_in, link_out, data_in, data_out, offered;
    _Atomic uint64_t data_shm; /* rows' bytes a worker on this host read from the arena */
    /* items to offer at the end of this loop turn (flush_items) */
    sq_fe_item_t pend[SQ_MAX_FE_ITEMS];
    uint32_t npend;
    int flush_posted;
    int64_t metrics_at_ns; /* the last FE_METRICS */
    /* what the dispatcher last said, for other threads (written by this
     * frontend's thread alone) */
    pthread_mutex_t lock;
    gw_fleet_t fleet;
    int ready;
    char why[256];
    int64_t *held, *gone;
    int nheld, ngone;
};

/* No worker up or coming (not joined). */
static void fleet_clear(gw_fleet_t *f)
{
    *f = (gw_fleet_t){0};
    for (int k = 0; k < SQ_DEV_KIND_COUNT; k++)
        f->back_at_us[k] = INT64_MAX;
}

/* The scheduling interface (gw_front_sched), at the end. */
static const gw_sched_ops_t front_sched_ops;

/* ---- answering items -------------------------------------------------------- */

static void release_slot(gw_front_t *fr, uint32_t idx)
{
    slot_t *s = &fr->slots[idx];
    s->item = NULL;
    s->state = SLOT_FREE;
    s->gen++;
    s->next_free = fr->free_slot;
    fr->free_slot = idx + 1;
}

/* The item's answer: its input slot back to the arena, then its finish. */
static void finish(gw_front_t *fr, gw_item_t *it, int rc, const char *detail)
{
    if (it->input.in_off >= 0) {
        sq_shm_release(fr->srv->arena, it->input.in_off);
        it->input.in_off = -1;
    }
    it->times.done_us = sq_now_us();
    it->owner.finish(it, rc, detail);
}

/* The item slot id names, if it still holds one. */
static gw_item_t *slot_item(gw_front_t *fr, uint64_t id, uint32_t *idx)
{
    uint32_t i = (uint32_t)id;
    if (i >= fr->nslots || fr->slots[i].item == NULL || fr->slots[i].gen != (uint32_t)(id >> 32))
        return NULL;
    *idx = i;
    return fr->slots[i].item;
}

static void answer_slot(gw_front_t *fr, uint32_t idx, int rc, const char *detail)
{
    gw_item_t *it = fr->slots[idx].item;
    release_slot(fr, idx);
    finish(fr, it, rc, detail);
}

/* ---- the workers' data connections ------------------------------------------ */

/* The bytes of an item's input slot (as the dispatcher reckons them). */
static uint64_t input_bytes(const gw_model_t *m, int input_kind)
{
    uint64_t elems = (uint64_t)m->c * (uint64_t)m->h * (uint64_t)m->w;
    return input_kind == SQ_INPUT_PIXELS ? (uint64_t)m->h * (uint64_t)m->w * 3
           : input_kind == SQ_INPUT_FP32 ? elems * sizeof(float)
                                         : elems;
}

static void assign_free(assign_t *a)
{
    free(a->slot);
    free(a->row);
    free(a);
}

/* A data connection closed: the items whose rows went on it are answered
 * 503 (retryable: the dispatcher runs them again only if it saw the worker
 * lost, and a retry from the client is as good). */
static void data_close(gw_front_t *fr, data_conn_t *d, const char *why)
{
    for (data_conn_t **pp = &fr->data; *pp != NULL; pp = &(*pp)->next)
        if (*pp == d) {
            *pp = d->next;
            break;
        }
    char detail[160];
    snprintf(detail, sizeof(detail), "lost the connection to the worker at %s (%s)", d->addr, why);
    int n = 0;
    for (assign_t *a = d->assigns, *next; a != NULL; a = next) {
        next = a->next;
        for (uint32_t k = 0; k < a->n; k++) {
            uint32_t idx;
            if (slot_item(fr, a->slot[k], &idx) != NULL) {
                answer_slot(fr, idx, SQ_WORKER_LOST, detail);
                n++;
            }
        }
        assign_free(a);
    }
    if (d->conn.fd >= 0)
        sq_loop_unwatch(fr->loop, d->conn.fd);
    sq_conn_dispose(&d->conn);
    SQ_LOG(fr->stopping ? SQ_LOG_INFO : SQ_LOG_WARN,
           "worker data connection closed addr=%s "
           "reason=%s items_failed=%d",
           d->addr, why, n);
    free(d);
}

static void on_output(gw_front_t *fr, data_conn_t *d, const sq_frame_t *f)
{
    sq_data_output_t *o = sq_xmalloc(sizeof(*o));
    if (sq_data_output_decode(f, o) != 0) {
        free(o);
        data_close(fr, d, "bad DATA_OUTPUT");
        return;
    }
    assign_t **pa = &d->assigns;
    while (*pa != NULL && (*pa)->batch_id != f->id)
        pa = &(*pa)->next;
    assign_t *a = *pa;
    if (a == NULL) {
        free(o);
        return; /* answered meanwhile (its items failed) */
    }
    int64_t now = sq_now_us();
    for (uint32_t k = 0; k < o->n; k++) {
        uint64_t slot = 0;
        int found = 0;
        for (uint32_t j = 0; j < a->n && !found; j++)
            if (a->row[j] == o->row[k]) {
                slot = a->slot[j];
                found = 1;
            }
        uint32_t idx;
        gw_item_t *it = found ? slot_item(fr, slot, &idx) : NULL;
        if (it == NULL)
            continue;
        if (o->code != 0) {
            /* Rows that never reached the worker: a retry can succeed (503);
             * a run that failed is a device error, as on a dispatcher's own
             * batches. */
            answer_slot(fr, idx, o->code == SQ_IO ? SQ_WORKER_LOST : SQ_DEVICE, o->message);
            continue;
        }
        uint64_t row_bytes = (uint64_t)it->ask.model->out_elems * sizeof(float);
        if (row_bytes > o->out_stride) {
            answer_slot(fr, idx, SQ_PROTOCOL,
                        "the worker's output row is shorter than the model's");
            continue;
        }
        memcpy(it->owner.out, o->bytes + (uint64_t)k * o->out_stride, row_bytes);
        it->times.batch_size = (int)o->count;
        it->times.exec_end_us = now;
        it->times.exec_start_us = now - (int64_t)(o->exec_ns / 1000);
        release_slot(fr, idx);
        finish(fr, it, 0, NULL);
    }
    /* A batch's outputs for this frontend come in one or more frames: the
     * assignment goes when each of its rows has been answered. */
    int left = 0;
    for (uint32_t j = 0; j < a->n && !left; j++) {
        uint32_t idx;
        left = slot_item(fr, a->slot[j], &idx) != NULL;
    }
    if (!left) {
        *pa = a->next;
        assign_free(a);
    }
    free(o);
}

static void on_data_io(sq_loop_t *loop, int fd, int events, void *data)
{
    data_conn_t *d = data;
    gw_front_t *fr = d->fr;
    if (events & SQ_EV_WRITE) {
        int rc = sq_conn_flush(&d->conn);
        if (rc < 0) {
            data_close(fr, d, "write_error");
            return;
        }
        sq_loop_modify(loop, fd, SQ_EV_READ | (rc == 1 ? SQ_EV_WRITE : 0));
    }
    if (!(events & SQ_EV_READ))
        return;
    int rc = sq_conn_read(&d->conn);
    if (rc == 0 || (rc < 0 && rc != -EAGAIN)) {
        data_close(fr, d, rc == 0 ? "eof" : "read_error");
        return;
    }
    sq_frame_t f;
    while ((rc = sq_conn_next(&d->conn, &f)) == 1) {
        atomic_fetch_add(&fr->data_in, (uint64_t)f.len + SQ_IPC_HEADER_SIZE);
        if (f.type == SQ_MSG_DATA_OUTPUT) {
            on_output(fr, d, &f);
            /* on_output may have closed d */
            data_conn_t *x = fr->data;
            while (x != NULL && x != d)
                x = x->next;
            if (x == NULL)
                return;
        } else if (f.type == SQ_MSG_PING) {
            sq_conn_send(&d->conn, SQ_MSG_PONG, f.id, f.payload, f.len);
        } else if (f.type != SQ_MSG_PONG) {
            data_close(fr, d, "protocol_error");
            return;
        }
    }
    if (rc < 0) {
        data_close(fr, d, "bad_frame");
        return;
    }
    if (sq_conn_pending(&d->conn))
        sq_loop_modify(loop, fd, SQ_EV_READ | SQ_EV_WRITE);
}

/* The worker's local data socket (SQ_DATA_LOCAL_PREFIX + its address, in
 * the abstract namespace): there only when the worker runs on this host. A
 * connected fd, or -1. */
static int local_dial(const char *addr)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    int n = snprintf(sa.sun_path + 1, sizeof(sa.sun_path) - 1, "%s%s", SQ_DATA_LOCAL_PREFIX, addr);
    if (n <= 0 || (size_t)n >= sizeof(sa.sun_path) - 2)
        return -1;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
    if (connect(fd, (struct sockaddr *)&sa, len) != 0) {
        close(fd);
        return -1;
    }
    int fl = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, fl | O_NONBLOCK);
    return fd;
}

/* The connection to the worker at addr, opened (and authenticated) the
 * first time; NULL with why when it cannot be. */
static data_conn_t *data_conn(gw_front_t *fr, const char *addr, char *why, size_t whylen)
{
    for (data_conn_t *d = fr->data; d != NULL; d = d->next)
        if (strcmp(d->addr, addr) == 0)
            return d;
    /* A worker on this host: its local data socket, and shared memory;
     * else TCP, with the cluster's TLS where workers speak it (on their
     * data listener too). */
    int fd = local_dial(addr);
    int shm = fd >= 0;
    sq_dial_opts_t o = {.tls = shm ? NULL : fr->tls,
                        .token = fr->token,
                        .token_len = fr->token_len,
                        .dial_timeout_ms = DIAL_TIMEOUT_MS,
                        .auth_timeout_ms = HANDSHAKE_TIMEOUT_MS};
    data_conn_t *d = sq_xcalloc(1, sizeof(*d));
    d->fr = fr;
    d->shm = shm;
    snprintf(d->addr, sizeof(d->addr), "%s", addr);
    int rc = sq_dial_open(&d->conn, addr, fd, &o, NULL, why, whylen);
    if (rc != 0) {
        free(d);
        return NULL;
    }
    fd = d->conn.fd;
    sq_buf_t b;
    sq_buf_init(&b);
    sq_buf_put_u32(&b, (uint32_t)fr->fe_id);
    rc = shm ? sq_conn_send_with_fd(&d->conn, SQ_MSG_DATA_HELLO, 0, b.data, (uint32_t)b.len,
                                    sq_shm_arena_fd(fr->srv->arena), HANDSHAKE_TIMEOUT_MS)
             : sq_conn_send(&d->conn, SQ_MSG_DATA_HELLO, 0, b.data, (uint32_t)b.len);
    sq_buf_dispose(&b);
    if (rc != 0)
        snprintf(why, whylen, "cannot send DATA_HELLO: %s", strerror(-rc));
    if (rc == 0 && sq_loop_watch(fr->loop, fd, SQ_EV_READ | SQ_EV_WRITE, on_data_io, d) != 0) {
        snprintf(why, whylen, "cannot watch the connection");
        rc = SQ_IO;
    }
    if (rc != 0) {
        sq_conn_dispose(&d->conn);
        free(d);
        return NULL;
    }
    SQ_INFO("worker data connection addr=%s frontend=%d shared_memory=%s", addr, fr->fe_id,
            shm ? "yes" : "no");
    d->next = fr->data;
    fr->data = d;
    return d;
}

/* FE_ASSIGN: the rows go to the worker, each present while this frontend
 * still holds its item (absent otherwise: the batch does not wait for it). */
static void on_assign(gw_front_t *fr, const sq_frame_t *f)
{
    sq_fe_assign_t *a = sq_xmalloc(sizeof(*a));
    if (sq_fe_assign_decode(f, a) != 0) {
        SQ_WARN("malformed FE_ASSIGN from the dispatcher");
        free(a);
        return;
    }
    char why[256] = "";
    data_conn_t *d = data_conn(fr, a->addr, why, sizeof(why));
    if (d == NULL) {
        char detail[400];
        snprintf(detail, sizeof(detail), "cannot reach the worker at %s: %s", a->addr, why);
        SQ_WARN("%s", detail);
        for (uint32_t k = 0; k < a->n; k++) {
            uint32_t idx;
            if (slot_item(fr, a->slot[k], &idx) != NULL)
                answer_slot(fr, idx, SQ_WORKER_LOST, detail);
        }
        free(a);
        return;
    }
    const uint8_t *base = sq_shm_arena_base(fr->srv->arena);
    sq_data_rows_t *r = sq_xmalloc(sizeof(*r));
    assign_t *rec = sq_xcalloc(1, sizeof(*rec));
    rec->batch_id = f->id;
    rec->slot = sq_xmalloc(sizeof(*rec->slot) * a->n);
    rec->row = sq_xmalloc(sizeof(*rec->row) * a->n);
    int rc = 0;
    uint32_t k = 0;
    while (k < a->n && rc == 0) {
        /* As many rows as fit one frame (at least one). */
        r->count = a->count;
        r->input_kind = a->input_kind;
        r->row_bytes = a->row_bytes;
        r->shm = (uint8_t)d->shm;
        r->n = 0;
        uint64_t bytes = 0;
        uint32_t first = k;
        for (; k < a->n; k++) {
            uint32_t idx;
            gw_item_t *it = slot_item(fr, a->slot[k], &idx);
            int present = it != NULL && it->input.in_off >= 0 &&
                          input_bytes(it->ask.model, it->ask.input_kind) == a->row_bytes;
            if (present && !d->shm && bytes + a->row_bytes > ROWS_FRAME_BYTES && r->n > 0)
                break;
            r->row[r->n] = a->row[k];
            r->off[r->n] = present ? (uint64_t)it->input.in_off : 0;
            r->present[r->n++] = (uint8_t)present;
            bytes += present && !d->shm ? a->row_bytes : 0;
            if (present && d->shm)
                atomic_fetch_add(&fr->data_shm, a->row_bytes);
            if (present) {
                fr->slots[idx].state = SLOT_ASSIGNED;
                it->times.sent_us = sq_now_us(); /* its rows leave for the worker */
                rec->slot[rec->n] = a->slot[k];
                rec->row[rec->n++] = a->row[k];
            }
        }
        fr->scratch.len = 0;
        sq_data_rows_encode(&fr->scratch, r);
        for (uint32_t j = 0; j < r->n && !d->shm; j++) {
            if (!r->present[j])
                continue;
            uint32_t idx;
            gw_item_t *it = slot_item(fr, a->slot[first + j], &idx);
            sq_buf_put(&fr->scratch, base + it->input.in_off, a->row_bytes);
        }
        rc = sq_conn_send(&d->conn, SQ_MSG_DATA_ROWS, f->id, fr->scratch.data,
                          (uint32_t)fr->scratch.len);
        atomic_fetch_add(&fr->data_out, fr->scratch.len + SQ_IPC_HEADER_SIZE);
    }
    free(r);
    free(a);
    if (rec->n > 0) {
        rec->next = d->assigns;
        d->assigns = rec;
    } else {
        assign_free(rec);
    }
    if (rc < 0)
        data_close(fr, d, "write_error");
    else if (sq_conn_pending(&d->conn))
        sq_loop_modify(fr->loop, d->conn.fd, SQ_EV_READ | SQ_EV_WRITE);
}

/* ---- what the dispatcher says ----------------------------------------------- */

typedef struct {
    char name[MDB_NAME_MAX + 1];
    int version;
    int64_t key;
} model_id_t;

typedef struct {
    model_id_t *ids;
    int n, cap;
} model_ids_t;

static void collect_id(gw_model_t *m, void *arg)
{
    model_ids_t *ids = arg;
    if (ids->n == ids->cap) {
        ids->cap = ids->cap ? 2 * ids->cap : 16;
        ids->ids = sq_xrealloc(ids->ids, sizeof(*ids->ids) * (size_t)ids->cap);
    }
    model_id_t *x = &ids->ids[ids->n++];
    snprintf(x->name, sizeof(x->name), "%s", m->name);
    x->version = m->version;
    x->key = m->key;
}

/* FE_CATALOG: the registry becomes the dispatcher's (entries built from
 * its records, as its DB thread builds them; those it no longer has go). */
static void on_catalog(gw_front_t *fr, const sq_frame_t *f)
{
    json_error_t jerr;
    json_t *cat = json_loadb((const char *)f->payload, f->len, 0, &jerr);
    json_t *models = json_object_get(cat, "models");
    if (!json_is_array(models)) {
        SQ_WARN("malformed FE_CATALOG from the dispatcher: %s", jerr.text);
        json_decref(cat);
        return;
    }
    gw_registry_t *reg = fr->srv->registry;
    model_ids_t have = {0};
    gw_registry_foreach(reg, collect_id, &have);
    size_t i;
    json_t *rec;
    json_array_foreach(models, i, rec)
    {
        if (!json_is_object(rec) || !json_is_integer(json_object_get(rec, "id")))
            continue;
        gw_model_t *m = gw_model_from_record(rec);
        for (int k = 0; k < have.n; k++)
            if (have.ids[k].key == m->key)
                have.ids[k].key = 0; /* kept */
        gw_registry_put(reg, m);
    }
    for (int k = 0; k < have.n; k++) {
        int64_t removed[4];
        if (have.ids[k].key != 0)
            gw_registry_remove(reg, have.ids[k].name, have.ids[k].version, removed, 4);
    }
    free(have.ids);
    json_decref(cat);
}

/* The dispatcher's pipelines: each spec parsed as its DB thread parses a
 * stored one (a new copy when the spec changed), its split taken as made
 * there, and what this frontend measures of them kept for its reports. */
static void sync_pipelines(gw_front_t *fr, json_t *list)
{
    gw_pipes_t *pipes = fr->srv->pipelines;
    int nhave = 0;
    gw_pipeline_t **have = gw_pipes_all(pipes, &nhave);
    size_t i;
    json_t *e;
    json_array_foreach(list, i, e)
    {
        json_t *spec = json_object_get(e, "spec");
        const char *name = json_string_value(json_object_get(spec, "name"));
        if (name == NULL)
            continue;
        gw_pipeline_t *p = gw_pipes_get(pipes, name);
        if (p == NULL || !json_equal(p->spec, spec)) {
            gw_pipeline_unref(p);
            char err[256];
            if (gw_pipeline_parse(spec, NULL, &p, err, sizeof(err)) != 0) {
                SQ_WARN("the dispatcher's pipeline %s does not parse here: %s", name, err);
                continue;
            }
            gw_pipeline_reporting(p);
            gw_pipeline_ref(p);
            gw_pipes_put(pipes, p); /* takes one reference */
        }
        atomic_store(&p->unloaded, json_is_true(json_object_get(e, "unloaded")));
        double b[GW_PIPE_MAX_STAGES] = {0}, c[GW_PIPE_MAX_STAGES] = {0};
        for (int k = 0; k < p->nstages; k++) {
            b[k] = json_number_value(json_array_get(json_object_get(e, "budget_ms"), (size_t)k));
            c[k] = json_number_value(json_array_get(json_object_get(e, "cum_ms"), (size_t)k));
        }
        if (b[0] > 0)
            gw_pipeline_set_split(p, b, c);
        for (int k = 0; k < nhave; k++)
            if (have[k] != NULL && strcmp(have[k]->name, name) == 0) {
                gw_pipeline_unref(have[k]);
                have[k] = NULL; /* kept */
            }
        gw_pipeline_unref(p);
    }
    for (int k = 0; k < nhave; k++)
        if (have[k] != NULL) {
            gw_pipes_remove(pipes, have[k]->name);
            gw_pipeline_unref(have[k]);
        }
    free(have);
}

static int keys_of(json_t *a, int64_t **out)
{
    size_t n = json_array_size(a);
    *out = n > 0 ? sq_xmalloc(sizeof(**out) * n) : NULL;
    for (size_t i = 0; i < n; i++)
        (*out)[i] = json_integer_value(json_array_get(a, i));
    return (int)n;
}

/* FE_STATE: readiness, and the workers up and coming per kind (what this
 * frontend's admission reads from the server record, as a dispatcher's
 * own HTTP side does). */
static void on_state(gw_front_t *fr, const sq_frame_t *f)
{
    json_t *st = json_loadb((const char *)f->payload, f->len, 0, NULL);
    if (!json_is_object(st)) {
        SQ_WARN("malformed FE_STATE from the dispatcher");
        json_decref(st);
        return;
    }
    int64_t now = sq_now_us();
    gw_fleet_t fleet = {.workers_up = (int)json_integer_value(json_object_get(st, "workers_up"))};
    for (int k = 0; k < SQ_DEV_KIND_COUNT; k++) {
        fleet.up[k] = (int)json_integer_value(json_array_get(json_object_get(st, "kind_up"), k));
        fleet.coming[k] =
            (int)json_integer_value(json_array_get(json_object_get(st, "kind_coming"), k));
        int64_t back =
            json_integer_value(json_array_get(json_object_get(st, "kind_back_in_us"), k));
        fleet.back_at_us[k] = back < 0 ? INT64_MAX : now + back;
    }
    sync_pipelines(fr, json_object_get(st, "pipelines"));
    int64_t *held, *gone;
    int nheld = keys_of(json_object_get(st, "held"), &held);
    int ngone = keys_of(json_object_get(st, "gone"), &gone);
    const char *why = json_string_value(json_object_get(st, "why"));
    pthread_mutex_lock(&fr->lock);
    fr->fleet = fleet;
    free(fr->held);
    free(fr->gone);
    fr->held = held;
    fr->nheld = nheld;
    fr->gone = gone;
    fr->ngone = ngone;
    snprintf(fr->why, sizeof(fr->why), "%s", why != NULL ? why : "");
    fr->ready = why != NULL && why[0] == '\0';
    pthread_mutex_unlock(&fr->lock);
    json_decref(st);
}

static void on_fail(gw_front_t *fr, const sq_frame_t *f)
{
    sq_fe_fail_t fail;
    uint32_t idx;
    if (sq_fe_fail_decode(f, &fail) != 0) {
        SQ_WARN("malformed FE_FAIL from the dispatcher");
        return;
    }
    if (slot_item(fr, f->id, &idx) != NULL)
        answer_slot(fr, idx, fail.code, fail.detail);
}

static void leave(gw_front_t *fr, const char *why);

static void send_dispatcher(gw_front_t *fr, uint16_t type, uint64_t id, const void *p, uint32_t len)
{
    if (!fr->joined)
        return;
    if (sq_conn_send(&fr->conn, type, id, p, len) < 0) {
        leave(fr, "write_error");
        return;
    }
    atomic_fetch_add(&fr->link_out, (uint64_t)len + SQ_IPC_HEADER_SIZE);
    if (sq_conn_pending(&fr->conn))
        sq_loop_modify(fr->loop, fr->conn.fd, SQ_EV_READ | SQ_EV_WRITE);
}

/* Handles the frames buffered on the dispatcher's connection; 0, or -1
 * when it was left. */
static int dispatcher_frames(gw_front_t *fr)
{
    sq_frame_t f;
    int rc;
    while (fr->joined && (rc = sq_conn_next(&fr->conn, &f)) == 1) {
        atomic_fetch_add(&fr->link_in, (uint64_t)f.len + SQ_IPC_HEADER_SIZE);
        switch (f.type) {
        case SQ_MSG_FE_CATALOG:
            on_catalog(fr, &f);
            break;
        case SQ_MSG_FE_STATE:
            on_state(fr, &f);
            break;
        case SQ_MSG_FE_ASSIGN:
            on_assign(fr, &f);
            break;
        case SQ_MSG_FE_FAIL:
            on_fail(fr, &f);
            break;
        case SQ_MSG_PING:
            send_dispatcher(fr, SQ_MSG_PONG, f.id, f.payload, f.len);
            break;
        case SQ_MSG_SHUTDOWN:
            leave(fr, "the dispatcher is stopping");
            return -1;
        case SQ_MSG_ERROR: {
            sq_ipc_error_t e;
            if (sq_ipc_error_decode(&f, &e) == 0)
                SQ_WARN("dispatcher error code=%s message=\"%s\"", sq_err_name(e.code), e.message);
            break;
        }
        default:
            SQ_WARN("unexpected message from the dispatcher type=%s", sq_msg_name(f.type));
            leave(fr, "protocol_error");
            return -1;
        }
    }
    if (!fr->joined)
        return -1;
    if (rc < 0) {
        leave(fr, "bad_frame");
        return -1;
    }
    return 0;
}

static void on_dispatcher_io(sq_loop_t *loop, int fd, int events, void *data)
{
    gw_front_t *fr = data;
    if (events & SQ_EV_WRITE) {
        int rc = sq_conn_flush(&fr->conn);
        if (rc < 0) {
            leave(fr, "write_error");
            return;
        }
        sq_loop_modify(loop, fd, SQ_EV_READ | (rc == 1 ? SQ_EV_WRITE : 0));
    }
    if (!(events & SQ_EV_READ))
        return;
    int rc = sq_conn_read(&fr->conn);
    if (rc == 0 || (rc < 0 && rc != -EAGAIN)) {
        leave(fr, rc == 0 ? "eof" : "read_error");
        return;
    }
    fr->last_heard_ns = sq_now_ns();
    if (dispatcher_frames(fr) == 0 && sq_conn_pending(&fr->conn))
        sq_loop_modify(loop, fd, SQ_EV_READ | SQ_EV_WRITE);
}

/* ---- joining and leaving ----------------------------------------------------- */

/* One try at the next dispatcher address: connect, authenticate, FE_HELLO,
 * FE_WELCOME. 0 when joined. */
static int join(gw_front_t *fr)
{
    const char *addr = fr->addrs[fr->next_addr];
    fr->next_addr = (fr->next_addr + 1) % fr->naddrs;
    sq_dial_opts_t o = {.tls = fr->tls,
                        .token = fr->token,
                        .token_len = fr->token_len,
                        .dial_timeout_ms = DIAL_TIMEOUT_MS,
                        .auth_timeout_ms = HANDSHAKE_TIMEOUT_MS};
    char why[256] = "";
    sq_dial_step_t failed;
    int rc = sq_dial_open(&fr->conn, addr, -1, &o, &failed, why, sizeof(why));
    if (failed == SQ_DIAL_CONNECT) {
        SQ_DEBUG("cannot reach the dispatcher addr=%s error=\"%s\"", addr, strerror(-rc));
        return -1;
    }
    if (rc != 0) {
        SQ_WARN("cannot join the dispatcher addr=%s reason=\"%s\"", addr, why);
        return -1;
    }
    int fd = fr->conn.fd;
    sq_frame_t f;
    sq_fe_hello_t h = {.version = SQ_IPC_VERSION};
    char host[48] = "";
    gethostname(host, sizeof(host));
    host[sizeof(host) - 1] = '\0';
    snprintf(h.name, sizeof(h.name), "%s:%d", host, atomic_load(&fr->srv->http_port));
    fr->scratch.len = 0;
    sq_fe_hello_encode(&fr->scratch, &h);
    rc = sq_conn_send(&fr->conn, SQ_MSG_FE_HELLO, 0, fr->scratch.data, (uint32_t)fr->scratch.len);
    if (rc == 0)
        rc = sq_conn_read_frame(&fr->conn, &f, HANDSHAKE_TIMEOUT_MS);
    if (rc < 0)
        snprintf(why, sizeof(why), "no FE_WELCOME: %s", sq_err_msg(rc));
    sq_fe_welcome_t wel;
    if (rc == 1 && f.type == SQ_MSG_ERROR) {
        sq_ipc_error_t e;
        snprintf(why, sizeof(why), "refused: %s",
                 sq_ipc_error_decode(&f, &e) == 0 ? e.message : "?");
        rc = SQ_UNAUTHORIZED;
    } else if (rc == 1 && sq_fe_welcome_decode(&f, &wel) != 0) {
        snprintf(why, sizeof(why), "expected FE_WELCOME, got %s", sq_msg_name(f.type));
        rc = SQ_PROTOCOL;
    }
    if (rc == 1 &&
        sq_loop_watch(fr->loop, fd, SQ_EV_READ | SQ_EV_WRITE, on_dispatcher_io, fr) != 0) {
        snprintf(why, sizeof(why), "cannot watch the connection");
        rc = SQ_IO;
    }
    if (rc != 1) {
        SQ_WARN("cannot join the dispatcher addr=%s reason=\"%s\"", addr, why);
        sq_conn_dispose(&fr->conn);
        return -1;
    }
    fr->joined = 1;
    fr->fe_id = (int)wel.frontend;
    fr->heartbeat_ms = wel.heartbeat_ms > 0 ? wel.heartbeat_ms : 200;
    /* The dispatcher's HTTP: on a wildcard address, at the address this
     * connection reached (not the name dialed: a name that resolves to the
     * leader and its standbys would reach a standby as often). */
    char ahost[128], dhost[INET6_ADDRSTRLEN] = "";
    int aport = 0;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) == 0)
        inet_ntop(ss.ss_family,
                  ss.ss_family == AF_INET6 ? (void *)&((struct sockaddr_in6 *)&ss)->sin6_addr
                                           : (void *)&((struct sockaddr_in *)&ss)->sin_addr,
                  dhost, sizeof(dhost));
    if (sq_hostport_split(wel.admin, ahost, sizeof(ahost), &aport) == 0 &&
        (strcmp(ahost, "0.0.0.0") == 0 || strcmp(ahost, "::") == 0 || ahost[0] == '\0') &&
        dhost[0] != '\0')
        snprintf(wel.admin, sizeof(wel.admin), strchr(dhost, ':') != NULL ? "[%s]:%d" : "%s:%d",
                 dhost, aport);
    pthread_mutex_lock(&fr->lock);
    snprintf(fr->admin, sizeof(fr->admin), "%s", wel.admin);
    pthread_mutex_unlock(&fr->lock);
    fr->last_heard_ns = sq_now_ns();
    sq_backoff_reset(&fr->rejoin);
    SQ_INFO("joined the dispatcher addr=%s frontend=%d dispatcher_http=%s", addr, fr->fe_id,
            fr->admin);
    dispatcher_frames(fr); /* what came with FE_WELCOME */
    return 0;
}

/* The dispatcher is gone (or stopping): every item held is answered 503
 * now (its client retries; a standby that takes over gets it), the data
 * connections close (they carry this frontend id, which goes with the
 * dispatcher), and readiness says why until it is joined again. */
static void leave(gw_front_t *fr, const char *why)
{
    if (!fr->joined)
        return;
    fr->joined = 0;
    fr->npend = 0;
    sq_loop_unwatch(fr->loop, fr->conn.fd);
    sq_conn_dispose(&fr->conn);
    char detail[200];
    snprintf(detail, sizeof(detail), "this frontend lost its dispatcher (%s); retry", why);
    int n = 0;
    for (uint32_t i = 0; i < fr->nslots; i++)
        if (fr->slots[i].item != NULL) {
            answer_slot(fr, i, SQ_NOT_READY, detail);
            n++;
        }
    while (fr->data != NULL)
        data_close(fr, fr->data, "left the dispatcher");
    pthread_mutex_lock(&fr->lock);
    fleet_clear(&fr->fleet);
    fr->ready = 0;
    fr->admin[0] = '\0';
    snprintf(fr->why, sizeof(fr->why), "this frontend has no dispatcher (%s)", why);
    pthread_mutex_unlock(&fr->lock);
    SQ_LOG(fr->stopping ? SQ_LOG_INFO : SQ_LOG_WARN,
           "left the dispatcher reason=\"%s\" items_failed=%d", why, n);
    fr->rejoin_at_ns = sq_now_ns();
}

/* ---- items in ------------------------------------------------------------------ */

static int slot_new(gw_front_t *fr, gw_item_t *it, uint64_t *id)
{
    if (fr->free_slot == 0) {
        if (fr->nslots == MAX_SLOTS)
            return -1;
        uint32_t cap = fr->nslots ? 2 * fr->nslots : 256;
        if (cap > MAX_SLOTS)
            cap = MAX_SLOTS;
        fr->slots = sq_xrealloc(fr->slots, sizeof(*fr->slots) * cap);
        for (uint32_t i = cap; i > fr->nslots; i--) {
            fr->slots[i - 1] = (slot_t){.next_free = fr->free_slot};
            fr->free_slot = i;
        }
        fr->nslots = cap;
    }
    uint32_t idx = fr->free_slot - 1;
    slot_t *s = &fr->slots[idx];
    fr->free_slot = s->next_free;
    s->item = it;
    s->state = SLOT_OFFERED;
    *id = ((uint64_t)s->gen << 32) | idx;
    return 0;
}

static void withdrawn(gw_front_t *fr, gw_item_t *it)
{
    int gone = atomic_load(it->owner.abandoned) == GW_ABANDONED_GONE;
    gw_metrics_withdrawn(fr->srv->metrics, it->ask.model, gone ? "client_gone" : "request_failed");
    finish(fr, it, SQ_DEADLINE,
           gone ? "withdrawn: its client went away"
                : "withdrawn: another item of its request failed");
}

/* Items offered go out together: those submitted in one turn of the
 * frontend's loop (every post queued by then) share FE_ITEMS frames, so
 * that the dispatcher reads many items a wake-up at high rates. */
static void flush_items(gw_front_t *fr)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < fr->npend; i++) {
        uint32_t idx;
        if (slot_item(fr, fr->pend[i].slot, &idx) != NULL) /* not answered meanwhile */
            fr->pend[n++] = fr->pend[i];
        else if (n > 0)
            fr->pend[n - 1].clump_next = fr->pend[i].clump_next;
    }
    fr->npend = 0;
    if (n == 0 || !fr->joined)
        return;
    fr->pend[n - 1].clump_next = 0;
    fr->scratch.len = 0;
    sq_fe_items_encode(&fr->scratch, fr->pend, n);
    send_dispatcher(fr, SQ_MSG_FE_ITEMS, 0, fr->scratch.data, (uint32_t)fr->scratch.len);
    atomic_fetch_add(&fr->offered, n);
}

static void on_flush(sq_loop_t *loop, void *arg)
{
    gw_front_t *fr = arg;
    (void)loop;
    fr->flush_posted = 0;
    flush_items(fr);
}

static void on_submit(sq_loop_t *loop, void *arg)
{
    gw_item_t *it = arg;
    gw_front_t *fr = it->held.holder;
    int64_t now = sq_now_us();
    for (gw_item_t *next; it != NULL; it = next) {
        next = it->owner.clump_next;
        it->owner.clump_next = NULL;
        it->times.ready_us = now;
        if (!fr->joined || fr->stopping) {
            finish(fr, it, fr->stopping ? SQ_SHUTTING_DOWN : SQ_NOT_READY,
                   fr->stopping ? "squishd is shutting down"
                                : "this frontend has no dispatcher now; retry");
            continue;
        }
        if (it->owner.abandoned != NULL && atomic_load(it->owner.abandoned) != 0) {
            withdrawn(fr, it);
            continue;
        }
        if (it->ask.deadline_us <= now) {
            finish(fr, it, SQ_DEADLINE, "the deadline passed during preprocessing");
            continue;
        }
        uint64_t slot;
        if (slot_new(fr, it, &slot) != 0) {
            finish(fr, it, SQ_OVERLOAD, "this frontend holds as many items as it can");
            continue;
        }
        if (fr->npend == SQ_MAX_FE_ITEMS)
            flush_items(fr);
        fr->pend[fr->npend++] =
            (sq_fe_item_t){.slot = slot,
                           .model_key = it->ask.model->key,
                           .slo_ms = it->ask.slo_ms,
                           .budget_us = it->ask.deadline_us - now,
                           .age_us = now > it->ask.arrival_us ? now - it->ask.arrival_us : 0,
                           .input_kind = it->ask.input_kind,
                           .priority = it->ask.priority,
                           .best_effort = it->ask.best_effort,
                           .clump_next = next != NULL,
                           .stage = -1};
        if (it->pipe.pipeline != NULL) { /* a query's stage: the dispatcher counts it there */
            sq_fe_item_t *e = &fr->pend[fr->npend - 1];
            e->stage = it->pipe.stage;
            e->query_slo_ms = it->pipe.query_slo_ms;
            snprintf(e->pipeline, sizeof(e->pipeline), "%s", it->pipe.pipeline->name);
        }
    }
    if (fr->npend > 0) {
        fr->pend[fr->npend - 1].clump_next = 0; /* a clump ends with its request */
        if (!fr->flush_posted) {
            fr->flush_posted = 1;
            sq_loop_post(loop, on_flush, fr);
        }
    }
}

/* gw_sched_ops_t.submit: offered to the dispatcher from this thread. */
static void sched_submit(gw_sched_t *s, gw_item_t *first)
{
    gw_front_t *fr = (gw_front_t *)s;
    first->held.holder = fr;
    sq_loop_post(fr->loop, on_submit, first);
}

/* Items abandoned while the dispatcher queues them are answered here and
 * withdrawn there; those whose rows went to a worker are answered as it
 * answers them. */
static void on_withdraw(sq_loop_t *loop, void *arg)
{
    gw_front_t *fr = arg;
    (void)loop;
    atomic_store(&fr->withdraw_posted, 0);
    uint64_t ids[SQ_MAX_FE_ITEMS];
    uint32_t n = 0;
    for (uint32_t i = 0; i < fr->nslots; i++) {
        slot_t *s = &fr->slots[i];
        gw_item_t *it = s->item;
        if (it == NULL || s->state != SLOT_OFFERED || it->owner.abandoned == NULL ||
            atomic_load(it->owner.abandoned) == 0)
            continue;
        ids[n++] = ((uint64_t)s->gen << 32) | i;
        release_slot(fr, i);
        withdrawn(fr, it);
        if (n == SQ_MAX_FE_ITEMS) {
            fr->scratch.len = 0;
            sq_fe_withdraw_encode(&fr->scratch, ids, n);
            send_dispatcher(fr, SQ_MSG_FE_WITHDRAW, 0, fr->scratch.data, (uint32_t)fr->scratch.len);
            n = 0;
        }
    }
    if (n > 0) {
        fr->scratch.len = 0;
        sq_fe_withdraw_encode(&fr->scratch, ids, n);
        send_dispatcher(fr, SQ_MSG_FE_WITHDRAW, 0, fr->scratch.data, (uint32_t)fr->scratch.len);
    }
}

static void sched_withdraw(gw_sched_t *s)
{
    gw_front_t *fr = (gw_front_t *)s;
    if (atomic_exchange(&fr->withdraw_posted, 1) == 0)
        sq_loop_post(fr->loop, on_withdraw, fr);
}

/* ---- what this frontend says of itself -------------------------------------------- */

void gw_front_metrics_text(gw_server_t *srv, sq_buf_t *out)
{
    gw_front_traffic_t t;
    gw_front_traffic(srv, &t);
    char buf[1024];
    int n =
        snprintf(buf, sizeof(buf),
                 "# HELP squish_frontend_joined Whether this frontend is joined to a dispatcher.\n"
                 "# TYPE squish_frontend_joined gauge\nsquish_frontend_joined %d\n"
                 "# HELP squish_frontend_offered_items_total Items this frontend offered its "
                 "dispatcher.\n# TYPE squish_frontend_offered_items_total counter\n"
                 "squish_frontend_offered_items_total %llu\n"
                 "# HELP squish_frontend_bytes_total Bytes on this frontend's links (frame headers "
                 "included): link=dispatcher carries metadata, link=workers the rows and outputs, "
                 "link=shared_memory the rows workers on this host read from its arena.\n"
                 "# TYPE squish_frontend_bytes_total counter\n"
                 "squish_frontend_bytes_total{link=\"dispatcher\",direction=\"in\"} %llu\n"
                 "squish_frontend_bytes_total{link=\"dispatcher\",direction=\"out\"} %llu\n"
                 "squish_frontend_bytes_total{link=\"workers\",direction=\"in\"} %llu\n"
                 "squish_frontend_bytes_total{link=\"workers\",direction=\"out\"} %llu\n"
                 "squish_frontend_bytes_total{link=\"shared_memory\",direction=\"out\"} %llu\n",
                 t.joined, (unsigned long long)t.items, (unsigned long long)t.link_in,
                 (unsigned long long)t.link_out, (unsigned long long)t.data_in,
                 (unsigned long long)t.data_out, (unsigned long long)t.data_shm);
    sq_buf_put(out, buf, (size_t)n);
}

static void collect_stats(gw_model_t *m, void *arg)
{
    void **a = arg;
    json_array_append_new(a[0], gw_metrics_model_stats(((gw_server_t *)a[1])->metrics, m));
}

/* FE_METRICS: this frontend's exposition and model statistics, for the
 * dispatcher's one view of the cluster (every METRICS_EVERY_NS). */
#define METRICS_EVERY_NS 2000000000LL

static void push_metrics(gw_front_t *fr)
{
    gw_server_t *srv = fr->srv;
    sq_buf_t text;
    sq_buf_init(&text);
    gw_metrics_write(srv->metrics, &text);
    gw_front_metrics_text(srv, &text);
    json_t *stats = json_array();
    void *arg[2] = {stats, srv};
    gw_registry_foreach(srv->registry, collect_stats, arg);
    json_t *reports = json_object();
    int np = 0;
    gw_pipeline_t **ps = gw_pipes_all(srv->pipelines, &np);
    for (int i = 0; i < np; i++) {
        json_t *r = gw_pipeline_report(ps[i]);
        if (r != NULL)
            json_object_set_new(reports, ps[i]->name, r);
        gw_pipeline_unref(ps[i]);
    }
    free(ps);
    json_t *m = json_pack("{s:s%, s:o, s:o}", "metrics", text.len ? (const char *)text.data : "",
                          text.len, "stats", stats, "pipelines", reports);
    char *payload = json_dumps(m, JSON_COMPACT);
    json_decref(m);
    sq_buf_dispose(&text);
    if (payload != NULL && strlen(payload) < SQ_IPC_MAX_PAYLOAD)
        send_dispatcher(fr, SQ_MSG_FE_METRICS, 0, payload, (uint32_t)strlen(payload));
    free(payload);
}

/* ---- the tick, start and stop --------------------------------------------------- */

/* Items held this long past their deadline get no answer from the
 * cluster any more: answered here (none should be). */
#define STUCK_US 10000000

static void on_tick(sq_loop_t *loop, uint64_t id, void *data)
{
    gw_front_t *fr = data;
    (void)id;
    int64_t now = sq_now_ns();
    if (fr->stopping)
        return;
    if (fr->joined) {
        int64_t limit = (int64_t)fr->heartbeat_ms * 5 * 1000000;
        if (limit < (int64_t)2000 * 1000000)
            limit = (int64_t)2000 * 1000000;
        if (now - fr->last_heard_ns > limit)
            leave(fr, "the dispatcher is silent");
    }
    if (!fr->joined && now >= fr->rejoin_at_ns && join(fr) != 0) {
        fr->rejoin_at_ns = now + (int64_t)sq_backoff_next(&fr->rejoin) * 1000000;
    }
    if (fr->joined && now - fr->metrics_at_ns >= METRICS_EVERY_NS) {
        fr->metrics_at_ns = now;
        push_metrics(fr);
    }
    int64_t now_us = now / 1000;
    for (uint32_t i = 0; i < fr->nslots; i++) {
        gw_item_t *it = fr->slots[i].item;
        if (it != NULL && now_us - it->ask.deadline_us > STUCK_US) {
            SQ_WARN("item held past its deadline with no answer from the cluster slot=%u", i);
            answer_slot(fr, i, SQ_DEADLINE, "no answer from the cluster by the deadline");
        }
    }
    fr->tick = sq_loop_timer_at(loop, sq_now_ns() + (int64_t)TICK_MS * 1000000, on_tick, fr);
}

static void *front_thread(void *arg)
{
    gw_front_t *fr = arg;
    sq_loop_run(fr->loop);
    return NULL;
}

int gw_front_start(gw_server_t *srv, char *err, size_t errlen)
{
    const gw_config_t *cfg = srv->cfg;
    gw_front_t *fr = sq_xcalloc(1, sizeof(*fr));
    fr->sched.ops = &front_sched_ops;
    fr->srv = srv;
    fleet_clear(&fr->fleet);
    pthread_mutex_init(&fr->lock, NULL);
    snprintf(fr->why, sizeof(fr->why), "this frontend has not joined its dispatcher yet");
    sq_buf_init(&fr->scratch);
    sq_backoff_init(&fr->rejoin, REJOIN_MIN_MS, REJOIN_MAX_MS);
    char list[sizeof(cfg->dispatcher)];
    snprintf(list, sizeof(list), "%s", cfg->dispatcher);
    for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok != NULL && fr->naddrs < 8;
         tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ')
            tok++;
        if (*tok != '\0')
            snprintf(fr->addrs[fr->naddrs++], sizeof(fr->addrs[0]), "%s", tok);
    }
    int rc = 0;
    if (fr->naddrs == 0) {
        snprintf(err, errlen, "--dispatcher: no address");
        rc = SQ_BAD_CONFIG;
    }
    if (rc == 0)
        rc = sq_auth_read_token(cfg->cluster_token_file, fr->token, sizeof(fr->token),
                                &fr->token_len, err, errlen);
    if (rc == 0 && cfg->cluster_tls_cert[0] != '\0')
        rc = sq_tls_new(&fr->tls, 0, cfg->cluster_tls_cert, cfg->cluster_tls_key,
                        cfg->cluster_tls_ca, err, errlen);
    if (rc == 0 && (fr->loop = sq_loop_new()) == NULL) {
        snprintf(err, errlen, "cannot create the frontend's loop");
        rc = SQ_NOMEM;
    }
    if (rc != 0) {
        sq_tls_free(fr->tls);
        sq_buf_dispose(&fr->scratch);
        free(fr);
        return rc;
    }
    srv->front = fr;
    fr->tick = sq_loop_timer_at(fr->loop, sq_now_ns(), on_tick, fr);
    if (pthread_create(&fr->thread, NULL, front_thread, fr) != 0) {
        snprintf(err, errlen, "cannot start the frontend's thread");
        return SQ_NOMEM;
    }
    pthread_setname_np(fr->thread, "sq-front");
    fr->started = 1;
    SQ_INFO("frontend started dispatcher=%s", cfg->dispatcher);
    return 0;
}

static void on_stop(sq_loop_t *loop, void *arg)
{
    gw_front_t *fr = arg;
    fr->stopping = 1;
    if (fr->joined)
        leave(fr, "squishd is stopping");
    for (uint32_t i = 0; i < fr->nslots; i++)
        if (fr->slots[i].item != NULL)
            answer_slot(fr, i, SQ_SHUTTING_DOWN, "squishd is shutting down");
    if (fr->tick != 0)
        sq_loop_timer_cancel(loop, fr->tick);
    fr->tick = 0;
    sq_loop_stop(loop);
}

void gw_front_stop(gw_server_t *srv)
{
    gw_front_t *fr = srv->front;
    if (fr == NULL || !fr->started)
        return;
    sq_loop_post(fr->loop, on_stop, fr);
    pthread_join(fr->thread, NULL);
    fr->started = 0;
    /* Items submitted after the loop stopped are answered here. */
    sq_loop_run_posts(fr->loop);
}

void gw_front_free(gw_server_t *srv)
{
    gw_front_t *fr = srv->front;
    if (fr == NULL)
        return;
    sq_loop_run_posts(fr->loop);
    sq_loop_free(fr->loop);
    sq_tls_free(fr->tls);
    OPENSSL_cleanse(fr->token, sizeof(fr->token));
    sq_buf_dispose(&fr->scratch);
    free(fr->slots);
    free(fr->held);
    free(fr->gone);
    pthread_mutex_destroy(&fr->lock);
    free(fr);
    srv->front = NULL;
}

/* ---- for other threads ------------------------------------------------------------ */

/* The scheduling interface's questions, from what the dispatcher last
 * said (FE_STATE). */
static int sched_ready(gw_sched_t *s, char *why, size_t len)
{
    gw_front_t *fr = (gw_front_t *)s;
    pthread_mutex_lock(&fr->lock);
    int ready = fr->ready;
    snprintf(why, len, "%s", fr->why);
    pthread_mutex_unlock(&fr->lock);
    return ready;
}

static int sched_held(gw_sched_t *s, int64_t key)
{
    gw_front_t *fr = (gw_front_t *)s;
    pthread_mutex_lock(&fr->lock);
    int found = 0;
    for (int i = 0; i < fr->nheld && !found; i++)
        found = fr->held[i] == key;
    pthread_mutex_unlock(&fr->lock);
    return found;
}

static int sched_unloading(gw_sched_t *s, int64_t key)
{
    gw_front_t *fr = (gw_front_t *)s;
    pthread_mutex_lock(&fr->lock);
    int found = 0;
    for (int i = 0; i < fr->ngone && !found; i++)
        found = fr->gone[i] == key;
    pthread_mutex_unlock(&fr->lock);
    return found;
}

static void sched_fleet(gw_sched_t *s, gw_fleet_t *out)
{
    gw_front_t *fr = (gw_front_t *)s;
    pthread_mutex_lock(&fr->lock);
    *out = fr->fleet;
    pthread_mutex_unlock(&fr->lock);
}

static int sched_serving_kind(gw_sched_t *s, const gw_model_t *m)
{
    gw_fleet_t f;
    sched_fleet(s, &f);
    return gw_fleet_serving_kind(&f, m);
}

/* No live profile here (the dispatcher keeps those): the measured one. */
static int sched_least(gw_sched_t *s, const gw_model_t *m, int kind, int n, gw_least_t *out)
{
    pl_dispatch_opts_t o = gw_sched_core_opts(((gw_front_t *)s)->srv->cfg);
    return gw_sched_least_on(&o, NULL, m, kind, n, out);
}

static const gw_sched_ops_t front_sched_ops = {
    .submit = sched_submit,
    .withdraw = sched_withdraw,
    .ready = sched_ready,
    .held = sched_held,
    .unloading = sched_unloading,
    .serving_kind = sched_serving_kind,
    .least = sched_least,
    .fleet = sched_fleet,
};

gw_sched_t *gw_front_sched(gw_front_t *fr)
{
    return &fr->sched;
}

void gw_front_dispatcher_http(gw_server_t *srv, char *out, size_t len)
{
    gw_front_t *fr = srv->front;
    pthread_mutex_lock(&fr->lock);
    snprintf(out, len, "%s", fr->admin);
    pthread_mutex_unlock(&fr->lock);
}

void gw_front_traffic(gw_server_t *srv, gw_front_traffic_t *out)
{
    gw_front_t *fr = srv->front;
    out->link_in = atomic_load(&fr->link_in);
    out->link_out = atomic_load(&fr->link_out);
    out->data_in = atomic_load(&fr->data_in);
    out->data_out = atomic_load(&fr->data_out);
    out->data_shm = atomic_load(&fr->data_shm);
    out->items = atomic_load(&fr->offered);
    pthread_mutex_lock(&fr->lock);
    out->joined = fr->admin[0] != '\0';
    pthread_mutex_unlock(&fr->lock);
}
