/* IPC between squishd and squish-worker over a UNIX stream socket, or TCP
 * for a worker on another host (see "Remote workers" below).
 *
 * A frame is a 16-byte little-endian header followed by the payload:
 *   u32 payload length | u16 type | u16 flags (reserved, 0) | u64 id
 * The id correlates requests and replies (a batch id, a model id, 0 for
 * none). Payloads are encoded with sq_buf (little-endian, strings as u32
 * length + bytes). Frames larger than SQ_IPC_MAX_PAYLOAD, unknown types and
 * non-zero flags are protocol errors: the peer is dropped, never trusted.
 *
 * The first frame on a connection is HELLO (worker -> squishd) carrying the
 * protocol version; squishd answers WELCOME with the shared-memory arena's
 * file descriptor attached (SCM_RIGHTS), or ERROR and closes. */
#ifndef SQ_IPC_H
#define SQ_IPC_H

#include "sq_buf.h"
#include "sq_device.h"

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#define SQ_IPC_MAGIC 0x48535153u /* "SQSH" */
#define SQ_IPC_VERSION 9
#define SQ_IPC_HEADER_SIZE 16
#define SQ_IPC_MAX_PAYLOAD (16u << 20)
#define SQ_IPC_MAX_FDS 4

/* X(NAME, value) */
#define SQ_IPC_MSGS(X)                                                                             \
    X(HELLO, 1)                                                                                    \
    X(WELCOME, 2)                                                                                  \
    X(PING, 3)                                                                                     \
    X(PONG, 4)                                                                                     \
    X(SHUTDOWN, 5)                                                                                 \
    X(ERROR, 6)                                                                                    \
    X(MODEL_LOAD, 10)                                                                              \
    X(MODEL_CHUNK, 11)                                                                             \
    X(MODEL_LOADED, 12)                                                                            \
    X(MODEL_FAILED, 13)                                                                            \
    X(MODEL_UNLOAD, 14)                                                                            \
    X(BATCH, 20)                                                                                   \
    X(BATCH_DONE, 21)                                                                              \
    X(BATCH_INPUT, 22)                                                                             \
    X(BATCH_OUTPUT, 23)                                                                            \
    X(PROFILE, 30)                                                                                 \
    X(PROFILE_PROGRESS, 31)                                                                        \
    X(PROFILE_DONE, 32)                                                                            \
    X(PROFILE_SLICE, 33)                                                                           \
    X(AUTH_CHALLENGE, 40)                                                                          \
    X(AUTH_REPLY, 41)                                                                              \
    X(AUTH_PROOF, 42)                                                                              \
    X(MODELS_HELD, 43)                                                                             \
    X(FE_HELLO, 50)                                                                                \
    X(FE_WELCOME, 51)                                                                              \
    X(FE_CATALOG, 52)                                                                              \
    X(FE_STATE, 53)                                                                                \
    X(FE_ITEMS, 54)                                                                                \
    X(FE_WITHDRAW, 55)                                                                             \
    X(FE_ASSIGN, 56)                                                                               \
    X(FE_FAIL, 57)                                                                                 \
    X(FE_GONE, 58)                                                                                 \
    X(WORKER_DATA, 59)                                                                             \
    X(DATA_HELLO, 60)                                                                              \
    X(DATA_ROWS, 61)                                                                               \
    X(DATA_OUTPUT, 62)                                                                             \
    X(FE_METRICS, 63)

typedef enum {
#define SQ_IPC_ENUM_(n, v) SQ_MSG_##n = v,
    SQ_IPC_MSGS(SQ_IPC_ENUM_)
#undef SQ_IPC_ENUM_
} sq_msg_type_t;

/* "HELLO", ...; NULL for an unknown type. */
const char *sq_msg_name(unsigned type);

typedef struct {
    uint16_t type;
    uint16_t flags;
    uint64_t id;
    const uint8_t *payload; /* borrowed from the decoder's buffer */
    uint32_t len;
} sq_frame_t;

/* Appends a whole frame to out. */
void sq_frame_encode(sq_buf_t *out, uint16_t type, uint64_t id, const void *payload, uint32_t len);

/* Decodes the frame at the start of data. Returns 1 and fills f and
 * *consumed when a whole frame is there, 0 when more bytes are needed, and
 * SQ_PROTOCOL for an oversized frame, an unknown type or reserved flags. */
int sq_frame_decode(const uint8_t *data, size_t len, sq_frame_t *f, size_t *consumed);

/* A frame payload borrowed from shared bytes (sq_conn_send_ref): it goes
 * out after the first `at` bytes of the output buffer. */
typedef struct sq_conn_ref {
    struct sq_conn_ref *next;
    size_t at;
    sq_bytes_t *bytes; /* one reference, dropped once sent */
    const uint8_t *p;  /* what is left to send */
    size_t len;
} sq_conn_ref_t;

/* Another way to move a connection's bytes than the socket calls (TLS,
 * sq_tls.h); ctx is the connection's io_ctx. read returns the bytes read
 * (> 0), 0 at EOF, or -1 with errno (EAGAIN: nothing now); writev the
 * bytes written (>= 0; it may take none of n == 0 pieces) or -1 with errno
 * (EAGAIN: wait until writable). want_write says whether it must write
 * before it can go on (a handshake): the connection is then pending. */
typedef struct {
    ssize_t (*read)(void *ctx, void *buf, size_t len);
    ssize_t (*writev)(void *ctx, const struct iovec *iov, int n);
    int (*want_write)(const void *ctx);
    void (*free)(void *ctx);
} sq_conn_io_t;

/* One end of a connection: non-blocking fd, input and output buffers, and
 * any file descriptors received with SCM_RIGHTS.
 *
 * Both buffers are consumed by offset, never by moving what is left: a
 * 500 MB model file goes through them in 1 MB frames, and moving the rest
 * after each frame (or each write) costs time quadratic in the file. */
typedef struct {
    int fd;
    sq_buf_t in;
    size_t in_off;      /* bytes of in handed out as frames and done with */
    size_t in_consumed; /* bytes of the last frame handed out by sq_conn_next */
    sq_buf_t out;
    size_t out_off;                   /* bytes of out already written */
    sq_conn_ref_t *refs, **refs_tail; /* borrowed payloads, in order */
    uint64_t bytes_written;           /* ever: a peer that takes bytes is reading */
    int fds[SQ_IPC_MAX_FDS];
    int nfds;
    const sq_conn_io_t *io; /* NULL: the socket's own calls (UNIX, plain TCP) */
    void *io_ctx;           /* freed with the connection */
} sq_conn_t;

void sq_conn_init(sq_conn_t *c, int fd);
/* Closes the fd and any received fds not taken; drops borrowed payloads. */
void sq_conn_dispose(sq_conn_t *c);
/* Reads what the socket has. Returns the bytes read (>0), 0 at EOF, or
 * -EAGAIN when nothing is there, or another negative errno. Frames handed
 * out earlier are invalid afterwards. */
int sq_conn_read(sq_conn_t *c);
/* Hands out the next whole frame from the input buffer: 1, 0 (need more) or
 * SQ_PROTOCOL. The frame stays valid until the next call. */
int sq_conn_next(sq_conn_t *c, sq_frame_t *f);
/* Queues a frame and tries to flush. Returns 0 or a negative errno. */
int sq_conn_send(sq_conn_t *c, uint16_t type, uint64_t id, const void *payload, uint32_t len);
/* Queues a frame whose payload is bytes[off, off + len), without copying
 * it: the connection holds a reference to bytes until the payload is
 * written (or the connection disposed), then tries to flush. Returns 0 or
 * a negative errno. */
int sq_conn_send_ref(sq_conn_t *c, uint16_t type, uint64_t id, sq_bytes_t *bytes, size_t off,
                     uint32_t len);
/* Whether output is queued (then wait for EPOLLOUT and flush). */
int sq_conn_pending(const sq_conn_t *c);
/* Writes as much queued output as the socket takes: 0 when all is out,
 * 1 when some is left (wait for EPOLLOUT), or a negative errno. */
int sq_conn_flush(sq_conn_t *c);
/* Flushes queued output, then sends one frame with fd attached, blocking
 * (poll) up to timeout_ms. Used for WELCOME. Returns 0 or negative errno. */
int sq_conn_send_with_fd(sq_conn_t *c, uint16_t type, uint64_t id, const void *payload,
                         uint32_t len, int fd, int timeout_ms);
/* Takes ownership of the oldest received fd, or -1. */
int sq_conn_take_fd(sq_conn_t *c);

/* Handshake messages. */
typedef struct {
    uint32_t magic;
    uint16_t version;
    char kind[16]; /* "cpu", "cuda", "emu" */
    char name[64]; /* "cpu", "cuda:0", "emu:3", or a host-qualified name */
    uint64_t memory_bytes;
    uint32_t pid;
} sq_hello_t;

typedef struct {
    uint16_t version;
    uint32_t worker_id;
    uint32_t heartbeat_ms;
    uint64_t shm_bytes;
} sq_welcome_t;

typedef struct {
    int32_t code; /* an SQ_* error */
    char message[256];
} sq_ipc_error_t;

void sq_hello_encode(sq_buf_t *b, const sq_hello_t *m);
int sq_hello_decode(const sq_frame_t *f, sq_hello_t *m);
void sq_welcome_encode(sq_buf_t *b, const sq_welcome_t *m);
int sq_welcome_decode(const sq_frame_t *f, sq_welcome_t *m);
void sq_ipc_error_encode(sq_buf_t *b, const sq_ipc_error_t *m);
int sq_ipc_error_decode(const sq_frame_t *f, sq_ipc_error_t *m);

/* ---- models, batches, profiles (frame id: the model key or batch id) ---- */

#define SQ_MODEL_CHUNK_BYTES (1u << 20)
#define SQ_MAX_EMU_LATENCIES 1024
#define SQ_MAX_EMU_DET_SLOTS 1024
#define SQ_MAX_BATCH_ITEMS 1024
#define SQ_MAX_PROFILE_ROWS 128

#define SQ_MAX_GROUP_MEMBERS 64

/* ONNX: one model file. GROUP: a prefix group of ONNX models whose files
 * this connection already sent (members[]), run as one prefix-batched
 * unit (worker/group.c). */
typedef enum { SQ_FORMAT_ONNX = 0, SQ_FORMAT_EMULATED = 1, SQ_FORMAT_GROUP = 2 } sq_model_format_t;

typedef struct {
    char sha256[65];
    char cut[256]; /* the cut tensor's name in this member's graph */
} sq_group_member_t;

/* MODEL_LOAD: squishd -> worker. For ONNX, total_bytes of the file follow
 * in MODEL_CHUNK frames unless `cached` says this connection already sent
 * bytes with this sha256. The worker answers MODEL_LOADED or MODEL_FAILED. */
typedef struct {
    char sha256[65];
    uint8_t format;
    uint8_t cached;
    uint64_t total_bytes;
    uint32_t max_batch;
    double mean[3], std[3]; /* on the 0..255 pixel scale */
    uint8_t bgr;
    /* The arithmetic asked for (sq_device.h: 0 fp32 .. 3 bf16, the model
     * config's "precision"); the plan may run another (PROFILE_DONE says
     * which). Protocol 8. */
    uint8_t precision;
    /* The item's shape ({C,H,W}, or {H,W,C} for NHWC): an emulated plan
     * takes it; an ONNX file's input is imported with its sizes past the
     * batch pinned to it (mdb_input_pin_t: the upload's input.shape where
     * the file left them symbolic). */
    uint32_t in_chw[3];
    uint32_t out_classes; /* emulated: floats per item (its row: one output) */
    /* emulated detector (det_slots > 0): the row is det_slots boxes (4
     * floats each, normalized x0 y0 x1 y1) then det_slots scores, so
     * out_classes == 5 det_slots; each item has a Poisson(det_mean) count
     * of detections. */
    uint32_t det_slots;
    double det_mean;
    uint32_t n_latency; /* emulated: l(b) for b = 1..n_latency */
    uint64_t latency_us[SQ_MAX_EMU_LATENCIES];
    /* ONNX: only keep the bytes for a later GROUP load (no plan, no reply
     * unless it fails). */
    uint8_t cache_only;
    uint32_t n_members; /* GROUP */
    sq_group_member_t members[SQ_MAX_GROUP_MEMBERS];
    /* The largest batch of the model's profile on the worker's kind (0:
     * not profiled there yet, <= max_batch): a cpu worker makes the
     * kernels of batch sizes up to it at load, and any other size's at
     * its first run. Protocol 9. */
    uint32_t ready_batch;
} sq_model_load_t;

/* MODEL_LOADED: worker -> squishd. */
typedef struct {
    uint64_t memory_bytes;
    uint32_t max_batch;
    uint64_t in_elems;  /* floats (or pixels x3) per item */
    uint64_t out_elems; /* floats of an item's row: every output, in graph order */
    uint32_t in_hw[2];  /* pixel input: H, W */
} sq_model_loaded_t;

typedef enum { SQ_INPUT_PIXELS = 0, SQ_INPUT_FP32 = 1, SQ_INPUT_UINT8 = 2 } sq_input_kind_t;

/* BATCH: squishd -> worker. Item i's input is at arena offset in_off[i]
 * (uint8 HWC pixels, or the model's input tensor); item i's row (every
 * output of the model, in graph order, each flattened) goes to out_off +
 * i * out_stride. For a group, member[i] is item i's model (an index into
 * the GROUP load's members); items of one member come together.
 *
 * With has_sources, src[i] says where item i's input is: 0 at in_off[i]
 * as above, else with frontend src[i] - 1, which sends it to the worker in
 * DATA_ROWS and takes its row back in DATA_OUTPUT (see "Frontends"). The
 * region at out_off is written (and, for a remote worker, sent back in
 * BATCH_OUTPUT) only when some item has src 0. */
typedef struct {
    uint64_t model_key;
    uint8_t input_kind;
    uint32_t count;
    uint64_t out_off;
    uint64_t out_stride;
    uint64_t in_off[SQ_MAX_BATCH_ITEMS];
    uint8_t has_members;
    uint16_t member[SQ_MAX_BATCH_ITEMS];
    uint8_t has_sources;
    uint32_t src[SQ_MAX_BATCH_ITEMS];
} sq_batch_t;

/* BATCH_DONE: worker -> squishd. */
typedef struct {
    int32_t code;      /* 0 or an SQ_* error */
    uint64_t exec_ns;  /* the batch's work: gather + normalize + run + copy out */
    uint64_t total_ns; /* from receipt to reply (exec_ns and the wait before it) */
    char message[200];
} sq_batch_done_t;

/* PROFILE: squishd -> worker: measure l(b) of a loaded model.
 *
 * With slice_us 0 the whole measurement runs at once. Else it runs in
 * slices that squishd fits into the worker's idle gaps: each PROFILE runs
 * measurement batches for at most slice_us (at least one; it does not
 * start one its pace says would end past the slice) and answers
 * PROFILE_SLICE (a u64: the expected µs of the next batch, which squishd
 * needs a gap for), or PROFILE_DONE when the measurement is complete. The
 * next PROFILE of the same model goes on where the last one stopped;
 * SQ_PROFILE_FRESH starts over. budget_ms counts measuring time only. */
#define SQ_PROFILE_FRESH 1u
typedef struct {
    uint32_t max_batch;
    uint32_t warmup;
    uint32_t repeats;
    uint32_t budget_ms; /* stop growing b when the next size would exceed it */
    uint32_t slice_us;
    uint32_t flags;
} sq_profile_req_t;

typedef struct {
    uint32_t batch;
    double mean_us, std_us;
    uint64_t peak_memory_bytes;
} sq_profile_row_t;

/* PROFILE_DONE: worker -> squishd (PROFILE_PROGRESS carries two u32: the
 * batch sizes measured so far, and those expected in all, sizes up to the
 * max that fit what is left of the time budget at the pace so far; each
 * size counts once per pass over the sizes, worker/wk_measure.h; then two
 * u64: the run time spent so far and the run time it still expects, µs,
 * wk_measure_left_us). */
typedef struct {
    int32_t code;
    char message[200];
    uint32_t nrows;
    sq_profile_row_t rows[SQ_MAX_PROFILE_ROWS];
    /* Protocol 8: the precision the plan runs in (sq_device.h), and how far
     * its outputs are from an FP32 plan's on the profiling input at batch 1:
     * the largest absolute difference and that over the largest magnitude
     * of the FP32 outputs. 0 when it runs FP32; -1 when not measured (no
     * FP32 plan could be made); +inf where its outputs are not finite but
     * FP32's are. Never NaN. */
    uint8_t precision;
    double max_abs_deviation;
    double max_rel_deviation;
} sq_profile_done_t;

/* ---- remote workers (TCP) ----
 *
 * A worker on another host has no shared memory. The connection starts
 * with the authentication of sq_auth.h (AUTH_CHALLENGE, AUTH_REPLY,
 * AUTH_PROOF), then the worker sends MODELS_HELD (the sha256s of the model
 * files it kept from earlier connections: squishd sends those as cached),
 * then HELLO; WELCOME comes without a file descriptor (shm_bytes 0).
 *
 * A batch's inputs come before its BATCH in BATCH_INPUT frames (id: the
 * batch id), whose payloads, concatenated, are the batch's input bytes;
 * BATCH's in_off[i] are offsets into them and out_off is 0. The worker
 * sends the output region (count * out_stride bytes) back in BATCH_OUTPUT
 * frames before BATCH_DONE. Both in pieces of at most SQ_REMOTE_CHUNK_BYTES,
 * so that no batch meets SQ_IPC_MAX_PAYLOAD. */
#define SQ_REMOTE_CHUNK_BYTES (1u << 20)
#define SQ_REMOTE_MAX_BATCH_BYTES ((uint64_t)1 << 30)
#define SQ_MAX_HELD 4096

typedef struct {
    uint32_t n;
    char (*sha256)[65]; /* n entries; the decoder allocates (free it) */
} sq_models_held_t;

/* ---- frontends (squishd --role frontend) ----
 *
 * A frontend takes clients' requests (HTTP, decode) and holds their inputs;
 * the dispatcher decides batches by metadata only. A frontend connects to
 * the dispatcher's cluster listener and authenticates as a worker does,
 * then sends FE_HELLO (instead of HELLO); the dispatcher answers
 * FE_WELCOME, then FE_CATALOG (the models and pipelines) and FE_STATE
 * (readiness, the workers up and their data addresses, the live-corrected
 * profiles) whenever they change. Their payloads, and FE_METRICS's, have
 * typed codecs in gateway/codec/gw_codec_fe.h (a model's record and a
 * pipeline's spec travel inside them as the JSON documents they are).
 *
 *   frontend -> dispatcher  FE_ITEMS     items it holds (metadata only)
 *   frontend -> dispatcher  FE_WITHDRAW  items no longer wanted
 *   dispatcher -> frontend  FE_ASSIGN    rows of a batch it is to send to a worker
 *   dispatcher -> frontend  FE_FAIL      an item failed (dropped, no worker...)
 *   frontend -> dispatcher  FE_METRICS   its metrics and model statistics,
 *                                        every few seconds: the cluster's one view
 *   dispatcher -> worker    FE_GONE      id: a frontend gone; its rows never come
 *   worker -> dispatcher    WORKER_DATA  the worker's data address (after WELCOME)
 *
 * The inputs go from the frontend straight to the worker: a frontend opens
 * a connection to a worker's data address, authenticates (the frontend as
 * the dialing side), sends DATA_HELLO (its frontend id), then DATA_ROWS
 * for each assignment, and the worker answers DATA_OUTPUT with the rows'
 * outputs once the batch ran. A frontend on the worker's host connects to
 * the worker's local data socket instead (the abstract UNIX socket
 * SQ_DATA_LOCAL_PREFIX + its data address) and attaches its arena's file
 * descriptor to DATA_HELLO: its rows then name offsets in that arena. An item the frontend no
 * longer holds (its client went away) is sent as absent: the batch runs without waiting for it. */
#define SQ_MAX_PIPELINE_NAME 64
#define SQ_DATA_LOCAL_PREFIX "squish-data/"

typedef struct {
    uint64_t slot; /* the frontend's handle of the item */
    int64_t model_key;
    double slo_ms;
    int64_t budget_us; /* time left to its deadline when sent */
    int64_t age_us;    /* since it arrived at the frontend */
    uint8_t input_kind;
    uint8_t priority;
    uint8_t best_effort;
    uint8_t clump_next; /* the next item of the frame is of its clump */
    int32_t stage;      /* a pipeline query's stage, -1 none */
    double query_slo_ms;
    char pipeline[SQ_MAX_PIPELINE_NAME];
} sq_fe_item_t;

typedef struct {
    uint32_t version;
    char name[64];
} sq_fe_hello_t;

typedef struct {
    uint32_t frontend; /* its id */
    uint32_t heartbeat_ms;
    char admin[128]; /* the dispatcher's HTTP address (management routes) */
} sq_fe_welcome_t;

/* FE_ASSIGN (id: the batch id): rows row[k] of the batch, whose inputs the
 * frontend holds as slot[k], go to worker (at addr) in DATA_ROWS. */
typedef struct {
    uint32_t worker;
    char addr[64];
    int64_t model_key;
    uint8_t input_kind;
    uint32_t count;      /* rows in the whole batch */
    uint64_t row_bytes;  /* input bytes per row */
    uint64_t out_stride; /* output bytes per row */
    uint32_t n;
    uint64_t slot[SQ_MAX_BATCH_ITEMS];
    uint32_t row[SQ_MAX_BATCH_ITEMS];
} sq_fe_assign_t;

/* FE_FAIL (id: the slot). */
typedef struct {
    int32_t code;
    char detail[200];
} sq_fe_fail_t;

/* DATA_ROWS (id: the batch id): rows row[k]; those present follow, in
 * order, row_bytes each. With shm (a frontend on the worker's host, whose
 * arena the worker mapped at DATA_HELLO), no bytes follow: a present row is
 * at offset off[k] of that arena. */
typedef struct {
    uint32_t count;
    uint8_t input_kind;
    uint64_t row_bytes;
    uint32_t n;
    uint32_t row[SQ_MAX_BATCH_ITEMS];
    uint8_t present[SQ_MAX_BATCH_ITEMS];
    uint8_t shm;
    uint64_t off[SQ_MAX_BATCH_ITEMS];
    const uint8_t *bytes; /* decode: borrowed from the frame */
    uint64_t nbytes;
} sq_data_rows_t;

/* DATA_OUTPUT (id: the batch id): the outputs of rows row[k] (out_stride
 * bytes each, in order) when code is 0. */
typedef struct {
    int32_t code;
    uint64_t exec_ns, total_ns;
    uint32_t count;
    char message[200];
    uint64_t out_stride;
    uint32_t n;
    uint32_t row[SQ_MAX_BATCH_ITEMS];
    const uint8_t *bytes; /* decode: borrowed from the frame */
    uint64_t nbytes;
} sq_data_output_t;

/* FE_ITEMS holds at most this many items. */
#define SQ_MAX_FE_ITEMS 256
void sq_fe_items_encode(sq_buf_t *b, const sq_fe_item_t *items, uint32_t n);
/* Into items (room for SQ_MAX_FE_ITEMS); *n of them. */
int sq_fe_items_decode(const sq_frame_t *f, sq_fe_item_t *items, uint32_t *n);
void sq_fe_hello_encode(sq_buf_t *b, const sq_fe_hello_t *m);
int sq_fe_hello_decode(const sq_frame_t *f, sq_fe_hello_t *m);
void sq_fe_welcome_encode(sq_buf_t *b, const sq_fe_welcome_t *m);
int sq_fe_welcome_decode(const sq_frame_t *f, sq_fe_welcome_t *m);
void sq_fe_assign_encode(sq_buf_t *b, const sq_fe_assign_t *m);
int sq_fe_assign_decode(const sq_frame_t *f, sq_fe_assign_t *m);
void sq_fe_fail_encode(sq_buf_t *b, const sq_fe_fail_t *m);
int sq_fe_fail_decode(const sq_frame_t *f, sq_fe_fail_t *m);
/* FE_WITHDRAW: n slots. */
void sq_fe_withdraw_encode(sq_buf_t *b, const uint64_t *slots, uint32_t n);
int sq_fe_withdraw_decode(const sq_frame_t *f, uint64_t *slots, uint32_t cap, uint32_t *n);
/* The header of DATA_ROWS; the present rows' bytes are appended by the
 * caller (n_present * row_bytes). */
void sq_data_rows_encode(sq_buf_t *b, const sq_data_rows_t *m);
int sq_data_rows_decode(const sq_frame_t *f, sq_data_rows_t *m);
/* The header of DATA_OUTPUT; the outputs are appended by the caller. */
void sq_data_output_encode(sq_buf_t *b, const sq_data_output_t *m);
int sq_data_output_decode(const sq_frame_t *f, sq_data_output_t *m);

void sq_models_held_encode(sq_buf_t *b, uint32_t n, const char (*sha256)[65]);
/* Checks each entry is 64 hex digits. Returns 0 or SQ_PROTOCOL. */
int sq_models_held_decode(const sq_frame_t *f, sq_models_held_t *m);

void sq_model_load_encode(sq_buf_t *b, const sq_model_load_t *m);
int sq_model_load_decode(const sq_frame_t *f, sq_model_load_t *m);
void sq_model_loaded_encode(sq_buf_t *b, const sq_model_loaded_t *m);
int sq_model_loaded_decode(const sq_frame_t *f, sq_model_loaded_t *m);
void sq_batch_encode(sq_buf_t *b, const sq_batch_t *m);
int sq_batch_decode(const sq_frame_t *f, sq_batch_t *m);
void sq_batch_done_encode(sq_buf_t *b, const sq_batch_done_t *m);
int sq_batch_done_decode(const sq_frame_t *f, sq_batch_done_t *m);
void sq_profile_req_encode(sq_buf_t *b, const sq_profile_req_t *m);
int sq_profile_req_decode(const sq_frame_t *f, sq_profile_req_t *m);
void sq_profile_done_encode(sq_buf_t *b, const sq_profile_done_t *m);
int sq_profile_done_decode(const sq_frame_t *f, sq_profile_done_t *m);

#endif
