/* Internals of the worker's serving side (wk_serve.h), shared by its files.
 * Three threads: the I/O thread (serve_io.c, and serve_link.c for a remote
 * worker) reads squishd's frames and answers heartbeats at once; the
 * execution thread (serve.c) takes jobs one at a time, in arrival order, and
 * runs them (serve_load.c, serve_batch.c, serve_profile.c); the loader
 * thread (serve_load.c) builds models meanwhile. serve_state.c holds what
 * they share. With a data listener (--data-listen), the I/O thread also
 * takes frontends' data connections (serve_data.c), whose rows wait in a
 * table (serve_rows.c) for their batches. Each file calls only those
 * before it in this list: serve_state.c, serve_rows.c, serve_load.c,
 * serve_batch.c, serve_profile.c, serve_data.c, serve_link.c, serve_io.c,
 * serve.c. */
#ifndef SERVE_INT_H
#define SERVE_INT_H

#include "wk_exec.h"
#include "wk_serve.h"

#include <mdb.h>
#include <pthread.h>
#include <sq.h>
#include <stdbool.h>
#include <stdint.h>

/* JOB_SWEEP: drop the models no load on the current connection asked for
 * (wk_serve_opts_t.kept_models_ms after a reconnect). */
/* JOB_INSTALL: a model the loader thread built, for the execution thread
 * to put in service. */
typedef enum {
    JOB_LOAD,
    JOB_UNLOAD,
    JOB_BATCH,
    JOB_PROFILE,
    JOB_SWEEP,
    JOB_INSTALL,
    JOB_STOP
} job_kind_t;

typedef struct job {
    struct job *next;
    job_kind_t kind;
    uint64_t id; /* model key or batch id */
    sq_model_load_t *load;
    const uint8_t *bytes; /* LOAD: the model file (owned by the byte cache) */
    size_t nbytes;
    bool bytes_file;                                   /* ... mapped from a file (wk__file_alloc) */
    const uint8_t *member_bytes[SQ_MAX_GROUP_MEMBERS]; /* GROUP load: each member's file */
    size_t member_nbytes[SQ_MAX_GROUP_MEMBERS];
    bool member_file[SQ_MAX_GROUP_MEMBERS];
    sq_batch_t *batch;
    uint8_t *input; /* a remote batch's input bytes (BATCH_INPUT), owned */
    size_t input_len;
    sq_profile_req_t profile;
    int64_t received_ns;
    uint64_t gen; /* the connection it came on */
    /* INSTALL: what the loader built (NULL: it failed, build_rc and
     * build_why say why) and how long it took. */
    struct model *built;
    int build_rc;
    char *build_why;
    int64_t import_ms, load_ms;
} job_t;

/* A job queue: any thread appends, one thread takes (blocking). */
typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    job_t *head, *tail;
} jobq_t;

typedef struct model {
    struct model *next;
    uint64_t key;
    wk_plan_t *plan;   /* a model, or */
    wk_group_t *group; /* a prefix group (plan NULL) */
    int pixel_h, pixel_w;
    int64_t in_elems, out_elems;
    char sha256[65]; /* its file's ("" for a group) */
    /* What its load asked for (a plain ONNX model): a load after a
     * reconnect that asks the same keeps it. */
    uint32_t asked_max_batch;
    /* The batch it serves up to: asked_max_batch, where its cpu plan was
     * made for at most WK_CPU_PLAN_BATCH and a larger batch runs in
     * pieces of that size (wk__model_run); 0: its plan's max batch. */
    int max_batch;
    double mean[3], std[3];
    uint8_t bgr;
    uint8_t precision; /* asked for (wk_precision_t); the plan may run another */
    uint8_t runs;      /* the one its plan runs (wk_plan_precision; see wk_fault.h) */
    /* A plan that runs other than FP32: an FP32 plan's row (every output)
     * for item 0 of the profiling input (wk__profile_input), made by the
     * loader with a batch-1 FP32 plan that it then frees, for the profile
     * to measure the plan's deviation from (NULL: it runs FP32, or no FP32
     * plan could be made: ref_why says why). */
    float *ref_out;
    char *ref_why;
    uint64_t gen; /* the connection that last loaded it */
} model_t;

/* Bytes of model files received on this connection, by sha256. Kept for the
 * worker's life so that reloading a model needs no transfer; owned by the
 * I/O thread, read by the execution thread only while loading. */
typedef struct cached {
    struct cached *next;
    char sha256[65];
    uint8_t *bytes;
    size_t len;
    bool file; /* mapped from a file (wk__file_alloc) */
} cached_t;

/* Frontends' rows by batch (serve_rows.c); thread-safe. */
typedef struct rows rows_t;

/* The largest batch a cpu plan is made for by default
 * (SQUISH_CPU_PLAN_BATCH sets another, wk__cpu_plan_batch): each size up
 * to it gets its own primitives at load (time and code), although a cpu's
 * profile stops near 10 on 2 vCPUs; a larger batch runs in pieces of this
 * size, its cost measured by the profile like any other. */
#define WK_CPU_PLAN_BATCH 16
int wk__cpu_plan_batch(void);
/* How long a batch waits for its frontends' rows, from its BATCH's
 * arrival: rows still missing then count as absent (the batch runs
 * without them, and their frontend hears they failed). */
#define WK_ROWS_WAIT_MS 2000
/* Rows no BATCH claimed are dropped after this long. */
#define WK_ROWS_KEEP_MS 5000
/* Most bytes of frontends' rows held at once: a data connection whose rows
 * would go past it is dropped. */
#define WK_ROWS_MAX_BYTES ((uint64_t)1 << 30)

typedef struct server {
    wk_serve_opts_t o;
    sq_loop_t *loop;
    sq_conn_t *conn;
    int exit_status;
    /* I/O thread: the connection's number (replies to jobs of an earlier
     * one are dropped), whether it is lost (a remote worker reconnects),
     * when squishd was last heard */
    uint64_t conn_gen;
    int lost;
    int64_t last_heard_ns;
    uint32_t heartbeat_ms;
    uint64_t silence_timer;
    uint64_t sweep_timer; /* on_sweep after a rejoin */
    /* I/O thread: a remote batch's inputs being received */
    struct {
        uint64_t id;
        sq_buf_t bytes;
        int active;
    } rin;
    /* I/O thread: an ONNX file being received */
    struct {
        uint64_t key;
        sq_model_load_t *spec;
        uint8_t *bytes;
        bool file; /* bytes mapped from a file */
        size_t have;
        mdb_sha256_t *digest; /* of the chunks so far */
        int64_t started_ns;
    } rx;
    cached_t *cache;
    /* loader thread: builds models (import, compile, allocate) while the
     * execution thread goes on running batches; its queue */
    pthread_t loader;
    jobq_t loadq;
    /* execution thread: loads handed to the loader and not yet installed,
     * in order; an unload meanwhile cancels them */
    struct building *building;
    /* execution thread */
    pthread_t exec;
    uint64_t exec_gen; /* execution thread: the connection of the job it runs */
    jobq_t execq;
    /* Replies the execution thread posted and the I/O thread wrote (or
     * dropped): a job starts only once every earlier reply is on the wire,
     * so that when a job crashes the process, squishd has the answers of
     * all the jobs before it and knows which one it was. */
    pthread_mutex_t reply_lock;
    pthread_cond_t reply_cond;
    uint64_t replies_posted, replies_written;
    int io_done; /* the I/O loop has stopped: nothing waits for it */
    model_t *models;
    /* Execution thread: the arena of activations and scratchpad that the
     * models' plans share (they run one batch at a time); made at the
     * first install, freed after the last model. */
    wk_arena_t *arena;
    struct measure *meas; /* execution thread: a measurement under way */
    uint8_t *staging;
    size_t staging_len;
    /* The I/O thread's socket handler (serve_io.c), through which the
     * remote link (serve_link.c, below it) hands the I/O thread a new
     * connection. */
    sq_io_fn on_socket;
    /* Frontends' rows (always there; filled only with a data listener) and
     * the data listener's connections (serve_data.c; NULL without one).
     * send_data: how the lowest layer (a reply's post) reaches a
     * frontend's data connection, on the I/O thread. */
    rows_t *rows;
    struct data_plane *data;
    void (*send_data)(struct server *s, uint32_t frontend, uint16_t type, uint64_t id,
                      const sq_buf_t *payload);
} server_t;

typedef struct {
    server_t *srv;
    uint16_t type;
    uint64_t id;
    uint64_t gen;
    int64_t frontend; /* -1: to squishd; else to this frontend's data connection */
    sq_buf_t payload;
} reply_t;

/* A load handed to the loader thread (execution thread's list). */
typedef struct building {
    struct building *next;
    uint64_t key;
    int cancelled; /* unloaded before it was installed */
} building_t;

/* ---- serve_state.c: queues, replies, models held, model files ---------- */

void wk__jobq_init(jobq_t *q);
void wk__jobq_destroy(jobq_t *q);
/* Any thread appends; one thread takes, blocking until there is a job. */
void wk__jobq_push(jobq_t *q, job_t *j);
job_t *wk__jobq_pop(jobq_t *q);
/* Drops every job queued, then queues `then` (or nothing). */
void wk__jobq_replace(jobq_t *q, job_t *then);
void wk__job_free(job_t *j);
/* I/O thread: stamps j with the time and the connection, for the
 * execution thread. */
void wk__enqueue(server_t *s, job_t *j);
/* Jobs still queued came on a connection that is gone: nobody waits for
 * their answers (squishd re-sends what it still wants). */
void wk__drop_queued(server_t *s);

/* Execution thread, before a job: waits until the replies of the jobs
 * before it are written to the socket. */
void wk__replies_flushed(server_t *s);
/* A frame for the I/O thread to send, on the connection of the job running
 * (from the execution thread) or the current one: fill its payload, then
 * post it. */
reply_t *wk__reply_new(server_t *s, uint16_t type, uint64_t id);
/* The same, for frontend's data connection (dropped when it has none). */
reply_t *wk__reply_new_data(server_t *s, uint16_t type, uint64_t id, uint32_t frontend);
void wk__reply_post(server_t *s, reply_t *r);
void wk__reply_failed(server_t *s, uint64_t key, int code, const char *msg);

model_t *wk__model_find(server_t *s, uint64_t key);
void wk__model_free(model_t *m);
void wk__model_drop(server_t *s, uint64_t key);
int wk__model_max_batch(const model_t *m);
uint64_t wk__model_memory(const model_t *m);
/* Floats of an item's row (every output); for a group, its widest
 * member's output. */
int64_t wk__model_out_elems(const model_t *m);
const char *wk__model_errmsg(const model_t *m);
/* Runs `batch` items of a model or group: pixels or FP32 tensors in `in`,
 * row i (every output of the item) at out + i * out_stride floats (a plain
 * model needs out_stride == its row size). */
int wk__model_run(model_t *m, int batch, int pixels, const uint8_t *in, const int *member,
                  float *out, size_t out_stride);
/* The same for a plain model's UINT8 rows (in_elems bytes an item), each
 * byte the FP32 value it holds (wk_plan_run_u8). */
int wk__model_run_u8(model_t *m, int batch, const uint8_t *in, float *out, size_t out_stride);
/* The input a model is profiled on, `items` of it at in: uint8 HWC pixels
 * (pixel_h x pixel_w x 3 bytes an item) when pixels, else in_elems FP32
 * values an item. Item i is the same whatever `items` is. */
void wk__profile_input(int pixels, size_t item_bytes, int items, uint8_t *in);

/* A model file's bytes (mapped, see serve_state.c), and the files held. */
/* n bytes for a model file: a file-backed mapping where the temporary
 * directory takes one (*file set), else anonymous memory. */
uint8_t *wk__file_alloc(size_t n, bool *file);
void wk__file_free(uint8_t *p, size_t n);
/* The file's bytes are not needed until the next load that reads them:
 * a file-backed mapping's pages leave the worker's resident memory (the
 * page cache keeps them); anonymous memory stays as it is. */
void wk__file_idle(const uint8_t *p, size_t n, bool file);
cached_t *wk__cache_find(server_t *s, const char *sha);

/* I/O thread: stops the loop with this exit status. */
void wk__finish(server_t *s, int status);
/* What belonged to the connection: a file half received, a batch's inputs. */
void wk__reset_connection_state(server_t *s);

/* ---- serve_rows.c: frontends' rows, by batch ----------------------------- */

/* A row of a claimed batch: from squishd (in_off, as without frontends),
 * or from a frontend: its bytes; absent (the frontend no longer holds it);
 * lost (its frontend's connection closed, or squishd said it is gone);
 * late (not there by the deadline); bad (sent by another frontend than
 * the batch names, or of another size or kind than the batch's). */
enum { ROW_LOCAL, ROW_PRESENT, ROW_ABSENT, ROW_LOST, ROW_LATE, ROW_BAD, ROWS_PENDING };

typedef struct {
    uint32_t count;
    uint64_t row_bytes; /* as the frontends sent them (0: none came) */
    uint8_t input_kind;
    uint8_t state[SQ_MAX_BATCH_ITEMS];
    uint8_t *bytes[SQ_MAX_BATCH_ITEMS]; /* ROW_PRESENT: row_bytes, owned */
} rows_claim_t;

typedef enum { ROWS_FE_UP, ROWS_FE_CLOSED, ROWS_FE_GONE } rows_fe_event_t;

rows_t *wk__rows_new(uint64_t max_bytes);
void wk__rows_free(rows_t *t);
/* I/O thread: a DATA_ROWS frame of `frontend` for `batch`. Returns 0 (also
 * when the batch already ran: the rows are dropped), SQ_PROTOCOL (a row
 * twice, or the batch's shape unlike its other rows') or SQ_TOO_LARGE (past
 * max_bytes): the caller drops the connection. */
int wk__rows_put(rows_t *t, uint32_t frontend, uint64_t batch, const sq_data_rows_t *m,
                 int64_t now_ns);
/* A frontend's data connection is up (again) or closed, or squishd said
 * it is gone (FE_GONE: its rows never come, even if it connects again). */
void wk__rows_frontend(rows_t *t, uint32_t frontend, rows_fe_event_t ev);
int wk__rows_frontend_gone(rows_t *t, uint32_t frontend);
/* Drops rows unclaimed for WK_ROWS_KEEP_MS. */
void wk__rows_expire(rows_t *t, int64_t now_ns);
/* A new connection to squishd: batch ids and frontend ids start over. */
void wk__rows_reset(rows_t *t);
/* The worker stops: claims wait no more. */
void wk__rows_stop(rows_t *t);
/* Execution thread: the rows of `batch` (src[i] - 1: row i's frontend, 0:
 * not from one), waiting until each is there or cannot come, at most until
 * deadline_ns (CLOCK_MONOTONIC); fills c. Rows that come later are
 * dropped. */
void wk__rows_claim(rows_t *t, uint64_t batch, uint32_t count, const uint32_t *src,
                    int64_t deadline_ns, rows_claim_t *c);
void wk__rows_claim_dispose(rows_claim_t *c);
uint64_t wk__rows_held_bytes(rows_t *t);

/* ---- serve_load.c: loading models --------------------------------------- */

/* LOAD (execution thread): returns 1 when j went to the loader thread. */
int wk__do_load(server_t *s, job_t *j);
/* INSTALL (execution thread): a model the loader built goes in service. */
void wk__do_install(server_t *s, job_t *j);
void wk__do_unload(server_t *s, uint64_t key);
/* SWEEP: drops the models no load on connection `gen` asked for. */
void wk__sweep_models(server_t *s, uint64_t gen);
void *wk__loader_thread(void *arg);
/* Stops the loader thread: loads it has not started are dropped, one it
 * is building finishes (and lands in the execution queue). */
void wk__loader_stop(server_t *s);

/* ---- serve_batch.c, serve_profile.c: running ----------------------------- */

void wk__do_batch(server_t *s, job_t *j);
/* PROFILE: one slice of the model's measurement. */
void wk__do_profile(server_t *s, job_t *j);
void wk__measure_free(struct measure *M);

/* ---- serve_data.c: frontends' data connections (I/O thread) -------------- */

/* Starts the data listener of o.data_fd, if any (s->data, s->send_data);
 * returns 0 or a negative error. */
int wk__data_start(server_t *s);
/* Closes the data connections (not the listener's fd: the caller's). */
void wk__data_stop(server_t *s);
/* After WELCOME: tells squishd the data address (WORKER_DATA). */
void wk__data_announce(server_t *s);

/* ---- serve_link.c: a remote worker's connections ------------------------- */

/* Joins squishd; returns 0, 1 when the worker was told to stop, or -1 when
 * it gives up. */
int wk__link_join(server_t *s);
/* After a lost connection: what was queued for it dropped, wk__link_join
 * again, the sweep of models not loaded again armed; returns as
 * wk__link_join does. */
int wk__link_rejoin(server_t *s);
/* The stop_fd became readable (SIGTERM, SIGINT). */
void wk__on_stop(sq_loop_t *loop, int fd, int events, void *data);

/* ---- serve_io.c: the I/O thread ------------------------------------------ */

int wk__handle_frame(server_t *s, const sq_frame_t *f);
void wk__on_socket(sq_loop_t *loop, int fd, int events, void *data);
/* A remote worker's connection is gone: stop reading it and rejoin
 * (wk__link_rejoin) from the loop, then handle the frames that came with
 * WELCOME. */
void wk__connection_lost(server_t *s, const char *why);
/* Every 250 ms: a squishd silent for several heartbeats is gone. */
void wk__on_silence_tick(sq_loop_t *loop, uint64_t id, void *data);

#endif
