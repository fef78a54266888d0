/* api/: registered system shared-memory regions, Triton's shared-memory
 * extension (shm_regions.c; its routes in shm_api.c). A client on squishd's
 * host creates a POSIX shared-memory object, an admin registers a window of
 * it under a name, and inference requests then name that region for an
 * input (its bytes go from the region straight into the batch slot, no HTTP
 * body) or an output (written there, not into the answer).
 *
 * A region is mapped read-write once, at registration, and reference
 * counted: the table holds one reference, and each request using it one
 * more, so that unregistering takes the name away at once (new requests
 * cannot find it, the name can be registered again) while requests in
 * flight keep the mapping until they are done. Everything here is
 * thread-safe (one mutex around the table; a region's bytes are not
 * locked: clients and requests share them as Triton's do). */
#ifndef GW_SHM_INT_H
#define GW_SHM_INT_H

#include "gw_api.h"

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

/* At most this many regions at once (each keeps a file descriptor). */
#define GW_SHM_MAX_REGIONS 1024
/* Bytes of a region's name, as the OIP codec reads it (GW_OIP_REGION_MAX). */
#define GW_SHM_NAME_MAX 127

typedef struct gw_shm_region gw_shm_region_t;

/* Whether name (len bytes, not terminated) is a valid region name: 1..127
 * characters a URL path segment carries as they are: A-Z a-z 0-9 . _ ~ -
 * (Python's quote() leaves them alone). */
int gw_shm_name_ok(const char *name, size_t len);
/* Whether key is a POSIX shared-memory object name shm_open takes: leading
 * slashes, then 1..255 bytes without '/', not "." or "..". */
int gw_shm_key_ok(const char *key);

/* Maps byte_size bytes at offset of the shared-memory object key (opened
 * read-write; never created) as region name. Returns 0, or SQ_BAD_REQUEST
 * with why: an invalid name or key, byte_size 0, a name already
 * registered, GW_SHM_MAX_REGIONS reached, no such object or no permission,
 * offset + byte_size past the object's size, or mmap failing. */
int gw_shm_register(gw_shm_table_t *t, const char *name, const char *key, uint64_t offset,
                    uint64_t byte_size, char *why, size_t len);
/* Takes region name out of the table (NULL: every region); each mapping
 * stays until the last request using it lets go. Returns the names taken
 * out, in registration order, as a new JSON array (empty: none was
 * registered, which is no error, as in Triton). */
json_t *gw_shm_unregister(gw_shm_table_t *t, const char *name);
/* Triton's status: [{"name", "key", "offset", "byte_size"}] for every
 * region in registration order (name NULL), or for region name alone; NULL
 * when name is not registered. A new reference. */
json_t *gw_shm_status(gw_shm_table_t *t, const char *name);

/* The checks and answers the routes (shm_api.c) and other transports
 * (facts.c) share: 0, or SQ_BAD_REQUEST with why for a name that is no
 * region's; region name's status (NULL: every region's) into *out, or
 * SQ_NOT_FOUND with why. */
int gw_shm_name_why(const char *name, size_t len, char *why, size_t whylen);
int gw_shm_status_why(gw_api_ctx_t *api, const char *name, json_t **out, char *why, size_t len);

/* CUDA shared memory, answered as a server without CUDA IPC (shm_api.c),
 * for the routes and other transports (facts.c): the status of every
 * region (name NULL: [] into *out) or of one (SQ_NOT_FOUND with why,
 * naming what to use instead); a register refused (SQ_BAD_REQUEST with
 * why); an unregister, no error. A name that is no region's is
 * SQ_BAD_REQUEST with why first. */
int gw_cudashm_status_why(gw_api_ctx_t *api, const char *name, json_t **out, char *why, size_t len);
int gw_cudashm_register_why(const char *name, char *why, size_t len);
int gw_cudashm_unregister_why(const char *name, char *why, size_t len);

/* A reference to region name for a request, or NULL when none is
 * registered under it. Release it with gw_shm_release once nothing reads or
 * writes its bytes any more. */
gw_shm_region_t *gw_shm_acquire(gw_shm_table_t *t, const char *name);
/* Lets go of a reference; the last one unmaps the region. Accepts NULL. */
void gw_shm_release(gw_shm_region_t *r);
/* The len bytes at offset in region r, checked against the region
 * (Triton's limits: offset inside it, offset + len not past its end) and
 * against the object's size now (a client that shrank the object after
 * registering would make reading it a SIGBUS); NULL with why otherwise. */
uint8_t *gw_shm_span(gw_shm_region_t *r, uint64_t offset, uint64_t len, char *why, size_t whylen);

#endif
