/* front/'s private header: the frontend's record (struct gw_front), the
 * slots that hold its items, its data connections to the workers, and
 * what the files of the room call of one another (fr_ prefix).
 *
 * Slots: each item offered gets a slot (a generation-checked id, as the
 * dispatcher's handles), named in FE_ITEMS; the slot holds the item until
 * it is answered, by the worker's DATA_OUTPUT (its row), the dispatcher's
 * FE_FAIL, or the loss of the connection its answer would come on. An
 * item is answered exactly once: its slot is freed as it is, and whatever
 * names the slot later (a late assignment, a late failure) finds nothing.
 *
 * The files, each calling only those listed after it (no call circle):
 *   front.c    the thread, its tick, start, stop and free
 *   sched.c    the scheduling interface's answers (any thread)
 *   report.c   what this frontend says of itself (metrics, FE_METRICS)
 *   submit.c   items in: offered in FE_ITEMS, withdrawn in FE_WITHDRAW
 *   link.c     the dispatcher's connection: joining, its frames, leaving
 *   catalog.c  what the dispatcher says: FE_CATALOG, FE_STATE
 *   data.c     the workers' data connections: FE_ASSIGN, DATA_ROWS, DATA_OUTPUT
 *   slots.c    the slots, and answering an item
 *
 * Everything but sched.c's answers and report.c's traffic runs on the
 * frontend's thread. */
#ifndef GW_FRONT_INT_H
#define GW_FRONT_INT_H

#include "gw_codec_fe.h"
#include "gw_front.h"
#include "gw_metrics.h"
#include "gw_sched.h"

#include <pthread.h>
#include <stdatomic.h>

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

/* A live-corrected profile the dispatcher published (FE_STATE). */
typedef struct {
    int64_t key;
    int kind;
    pl_profile_t profile; /* owned */
} fr_live_t;

struct gw_front {
    gw_sched_t sched; /* first: the scheduling interface (gw_front_sched) */
    /* What the room works with, taken once at gw_front_start. */
    gw_registry_t *registry;
    gw_pipes_t *pipelines;
    sq_shm_arena_t *arena;
    gw_metrics_t *metrics;
    const atomic_int *http_port;
    pl_dispatch_opts_t core; /* the least latency's rule (gw_sched_least_on) */
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
    /* the profiles the dispatcher plans with, corrected by what its
     * batches took (FE_STATE): the least latency is counted on them */
    fr_live_t *live;
    int nlive;
};

/* FE_METRICS goes every this often (front.c's tick, report.c). */
#define METRICS_EVERY_NS 2000000000LL

/* No worker up or coming (not joined). */
static inline void fr_fleet_clear(gw_fleet_t *f)
{
    *f = (gw_fleet_t){0};
    for (int k = 0; k < SQ_DEV_KIND_COUNT; k++)
        f->back_at_us[k] = INT64_MAX;
}

/* ---- slots.c ---- */
/* A new slot holding it, *id its id; -1 when MAX_SLOTS are held. */
int fr_slot_new(gw_front_t *fr, gw_item_t *it, uint64_t *id);
/* Frees slot idx (its generation moves: its old id names nothing). */
void fr_release_slot(gw_front_t *fr, uint32_t idx);
/* The item id names, with its index in *idx; NULL when it holds none. */
gw_item_t *fr_slot_item(gw_front_t *fr, uint64_t id, uint32_t *idx);
/* The item's answer: its input back to the arena, then its finish. */
void fr_finish(gw_front_t *fr, gw_item_t *it, int rc, const char *detail);
/* Frees slot idx and answers its item. */
void fr_answer_slot(gw_front_t *fr, uint32_t idx, int rc, const char *detail);
/* Answers an abandoned item as withdrawn (and counts it). */
void fr_withdrawn(gw_front_t *fr, gw_item_t *it);

/* ---- data.c ---- */
/* FE_ASSIGN: the rows to the worker (a data connection opened if need be). */
void fr_on_assign(gw_front_t *fr, const sq_frame_t *f);
/* Closes d; the items whose rows went on it are answered 503. */
void fr_data_close(gw_front_t *fr, data_conn_t *d, const char *why);

/* ---- catalog.c ---- */
/* FE_CATALOG and FE_STATE frames (a malformed one is logged and dropped). */
void fr_on_catalog(gw_front_t *fr, const sq_frame_t *f);
void fr_on_state(gw_front_t *fr, const sq_frame_t *f);
/* What they hold, decoded: the registry made the catalog's (returns the
 * records that did not parse); the state, as of now_us, taken. */
int fr_take_catalog(gw_registry_t *reg, const gw_fe_catalog_t *cat);
void fr_take_state(gw_front_t *fr, const gw_fe_state_t *st, int64_t now_us);
/* Its live profiles as planner profiles (*n of them; the malformed
 * skipped); fr_live_free releases them. */
fr_live_t *fr_live_from(const gw_fe_state_t *st, int *n);
void fr_live_free(fr_live_t *live, int n);

/* ---- link.c ---- */
/* One try at joining the next dispatcher address; 0 when joined. */
int fr_join(gw_front_t *fr);
/* The dispatcher is gone: every item held is answered 503. */
void fr_leave(gw_front_t *fr, const char *why);
/* A frame to the dispatcher, when joined (a failed write leaves it). */
void fr_send_dispatcher(gw_front_t *fr, uint16_t type, uint64_t id, const void *p, uint32_t len);

/* ---- submit.c ---- */
void fr_sched_submit(gw_sched_t *s, gw_item_t *first);
void fr_sched_withdraw(gw_sched_t *s);

/* ---- report.c ---- */
/* FE_METRICS: this frontend's exposition and statistics, to the dispatcher. */
void fr_push_metrics(gw_front_t *fr);

/* ---- sched.c ---- */
extern const gw_sched_ops_t fr_front_sched_ops;
/* gw_sched_ops_t.least: on the dispatcher's live-corrected profile of m on
 * kind when it published one, else on m's measured one. */
int fr_sched_least(gw_sched_t *s, const gw_model_t *m, int kind, int n, gw_least_t *out);

#endif
