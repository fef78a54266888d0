/* IPC between squishd and squish-worker over a UNIX stream socket.
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

#include <stddef.h>
#include <stdint.h>

#define SQ_IPC_MAGIC 0x48535153u /* "SQSH" */
#define SQ_IPC_VERSION 1
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
    X(ERROR, 6)

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

/* One end of a connection: non-blocking fd, input and output buffers, and
 * any file descriptors received with SCM_RIGHTS. */
typedef struct {
    int fd;
    sq_buf_t in;
    sq_buf_t out;
    size_t in_consumed; /* bytes of the last frame handed out by sq_conn_next */
    int fds[SQ_IPC_MAX_FDS];
    int nfds;
} sq_conn_t;

void sq_conn_init(sq_conn_t *c, int fd);
/* Closes the fd and any received fds not taken. */
void sq_conn_dispose(sq_conn_t *c);
/* Reads what the socket has. Returns the bytes read (>0), 0 at EOF, or
 * -EAGAIN when nothing is there, or another negative errno. */
int sq_conn_read(sq_conn_t *c);
/* Hands out the next whole frame from the input buffer: 1, 0 (need more) or
 * SQ_PROTOCOL. The frame stays valid until the next call. */
int sq_conn_next(sq_conn_t *c, sq_frame_t *f);
/* Queues a frame and tries to flush. Returns 0 or a negative errno. */
int sq_conn_send(sq_conn_t *c, uint16_t type, uint64_t id, const void *payload, uint32_t len);
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
    char kind[16];  /* "cpu", "cuda", "emu" */
    char name[64];  /* "cpu", "cuda:0", "emu:3", or a host-qualified name */
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

#endif
