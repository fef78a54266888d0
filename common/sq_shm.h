/* Shared-memory arena for batch pixels and outputs: one memfd, mapped by
 * squishd and passed to each worker with SCM_RIGHTS at the handshake, so
 * that batches travel as offsets, never as bytes on the socket.
 *
 * The arena is cut into fixed-size slots; an allocation takes the first run
 * of contiguous free slots that fits, lowest first: the pages in use stay
 * those of the busiest moment so far (a next-fit would sweep the whole
 * arena and make all of it resident, in squishd and in every worker).
 * Allocation and release are thread-safe (a mutex): preprocess threads
 * allocate, the dispatcher releases. */
#ifndef SQ_SHM_H
#define SQ_SHM_H

#include <stddef.h>
#include <stdint.h>

typedef struct sq_shm_arena sq_shm_arena_t;

/* Creates an arena of `bytes` (rounded up to whole slots) with slots of
 * `slot_bytes` (a multiple of 64). Returns 0 or a negative SQ_* error;
 * *out is set on success. */
int sq_shm_arena_create(sq_shm_arena_t **out, size_t bytes, size_t slot_bytes);
/* Unmaps and closes; accepts NULL. */
void sq_shm_arena_free(sq_shm_arena_t *a);
int sq_shm_arena_fd(const sq_shm_arena_t *a);
uint8_t *sq_shm_arena_base(const sq_shm_arena_t *a);
size_t sq_shm_arena_size(const sq_shm_arena_t *a);
size_t sq_shm_arena_slot_bytes(const sq_shm_arena_t *a);
/* Bytes currently allocated (whole slots). */
size_t sq_shm_arena_used(sq_shm_arena_t *a);

/* Allocates `bytes` (> 0); returns the offset of the region, or SQ_NOMEM
 * when no run of free slots is large enough. */
int64_t sq_shm_alloc(sq_shm_arena_t *a, size_t bytes);
/* Releases a region returned by sq_shm_alloc. Releasing an offset that is
 * not the start of a live region is a bug and asserts. */
void sq_shm_release(sq_shm_arena_t *a, int64_t offset);

/* Worker side: maps an arena fd read-write. Returns NULL on failure. */
uint8_t *sq_shm_map(int fd, size_t bytes);
void sq_shm_unmap(uint8_t *base, size_t bytes);

#endif
