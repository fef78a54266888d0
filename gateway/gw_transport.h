/* The dispatch thread's link to its workers. The dispatcher sends frames
 * through a gw_transport_t and hears of workers through the events it
 * gave when the link started; it never calls into the link's file, nor the
 * link into the dispatcher's. Today's link is a UNIX socket beside shared
 * memory (workers.c: batches name arena offsets, the worker maps the
 * arena); a TCP link to workers on other hosts implements the same two
 * structs, carrying the regions a frame names in the frame itself.
 *
 * Everything here runs on the dispatch thread. */
#ifndef GW_TRANSPORT_H
#define GW_TRANSPORT_H

#include <sq.h>

#include <stdint.h>

/* A piece of the shared-memory arena that a frame refers to (a batch's
 * input slots): a link without shared memory sends its bytes along. */
typedef struct {
    uint64_t offset;
    uint64_t bytes;
} gw_region_t;

typedef struct gw_transport gw_transport_t;

/* The base of a link (first member of the implementation's struct). */
struct gw_transport {
    /* Queues one frame to `worker`: 0, or SQ_NO_WORKER when it is not
     * connected, or another error when the connection failed (the link
     * then reports the worker lost). */
    int (*send)(gw_transport_t *t, int worker, uint16_t type, uint64_t id, const void *payload,
                uint32_t len, const gw_region_t *regions, int nregions);
    /* The same with a payload borrowed from shared bytes (a model file):
     * bytes[off, off + len) goes out without a copy; the link holds a
     * reference until it is written. */
    int (*send_ref)(gw_transport_t *t, int worker, uint16_t type, uint64_t id, sq_bytes_t *bytes,
                    size_t off, uint32_t len);
};

/* What the link tells the dispatcher (ctx: the dispatcher's). */
typedef struct {
    /* A worker passed its handshake. */
    void (*up)(void *ctx, int worker, const char *device, uint64_t memory_bytes);
    /* A frame from it; nonzero means the frame breaks the protocol and the
     * link drops the worker. */
    int (*frame)(void *ctx, int worker, const sq_frame_t *f);
    /* Its connection ended (then, for a process squishd started, exited
     * with its waitpid status once it is reaped). */
    void (*lost)(void *ctx, int worker);
    void (*exited)(void *ctx, int worker, int status);
    /* squishd stops: answer everything still held (idempotent). */
    void (*abort)(void *ctx);
    /* Optional: right after up, the model files (sha256 hex) a worker that
     * reconnected still holds; loading one of them sends no bytes. */
    void (*held)(void *ctx, int worker, const char (*sha256)[65], int n);
    /* Optional: a remote worker's link as measured (its address, round
     * trip, bandwidth), when first known and when it changes. */
    void (*link)(void *ctx, int worker, const char *addr, int64_t rtt_us, double bytes_per_us);
} gw_transport_events_t;

#endif
