#include "sq_shm.h"
#include "sq_alloc.h"
#include "sq_error.h"

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

struct sq_shm_arena {
    int fd;
    uint8_t *base;
    size_t size;
    size_t slot_bytes;
    size_t nslots;
    uint32_t *run; /* run[i] = slots in the region starting at i, 0 if none starts there */
    uint8_t *busy; /* busy[i] = 1 when slot i is allocated */
    size_t low;    /* every slot below it is busy (where first-fit starts) */
    size_t used_slots;
    pthread_mutex_t lock;
};

int sq_shm_arena_create(sq_shm_arena_t **out, size_t bytes, size_t slot_bytes)
{
    if (slot_bytes == 0 || slot_bytes % 64 != 0 || bytes == 0)
        return SQ_INVAL;
    size_t nslots = (bytes + slot_bytes - 1) / slot_bytes;
    size_t size = nslots * slot_bytes;
    int fd = memfd_create("squish-arena", MFD_CLOEXEC);
    if (fd < 0)
        return SQ_IO;
    if (ftruncate(fd, (off_t)size) != 0) {
        close(fd);
        return SQ_NOMEM;
    }
    void *base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        close(fd);
        return SQ_NOMEM;
    }
    sq_shm_arena_t *a = sq_xcalloc(1, sizeof(*a));
    a->fd = fd;
    a->base = base;
    a->size = size;
    a->slot_bytes = slot_bytes;
    a->nslots = nslots;
    a->run = sq_xcalloc(nslots, sizeof(*a->run));
    a->busy = sq_xcalloc(nslots, 1);
    pthread_mutex_init(&a->lock, NULL);
    *out = a;
    return 0;
}

void sq_shm_arena_free(sq_shm_arena_t *a)
{
    if (a == NULL)
        return;
    munmap(a->base, a->size);
    close(a->fd);
    free(a->run);
    free(a->busy);
    pthread_mutex_destroy(&a->lock);
    free(a);
}

int sq_shm_arena_fd(const sq_shm_arena_t *a)
{
    return a->fd;
}

uint8_t *sq_shm_arena_base(const sq_shm_arena_t *a)
{
    return a->base;
}

size_t sq_shm_arena_size(const sq_shm_arena_t *a)
{
    return a->size;
}

size_t sq_shm_arena_slot_bytes(const sq_shm_arena_t *a)
{
    return a->slot_bytes;
}

size_t sq_shm_arena_used(sq_shm_arena_t *a)
{
    pthread_mutex_lock(&a->lock);
    size_t used = a->used_slots * a->slot_bytes;
    pthread_mutex_unlock(&a->lock);
    return used;
}

/* Looks for `need` free slots in [from, to); returns the start or SIZE_MAX.
 * An allocation's slots are skipped in one step (run[] holds its length at
 * its first slot): the scan costs the allocations it passes, not their
 * slots. */
static size_t find_run(const sq_shm_arena_t *a, size_t from, size_t to, size_t need)
{
    size_t start = from, len = 0;
    for (size_t i = from; i < to; i++) {
        if (a->busy[i]) {
            if (a->run[i] > 0)
                i += a->run[i] - 1;
            len = 0;
            start = i + 1;
            continue;
        }
        if (++len == need)
            return start;
    }
    return SIZE_MAX;
}

int64_t sq_shm_alloc(sq_shm_arena_t *a, size_t bytes)
{
    if (bytes == 0 || bytes > a->size)
        return SQ_NOMEM;
    size_t need = (bytes + a->slot_bytes - 1) / a->slot_bytes;
    pthread_mutex_lock(&a->lock);
    size_t at = find_run(a, a->low, a->nslots, need);
    if (at == SIZE_MAX) {
        pthread_mutex_unlock(&a->lock);
        return SQ_NOMEM;
    }
    for (size_t i = at; i < at + need; i++)
        a->busy[i] = 1;
    a->run[at] = (uint32_t)need;
    a->used_slots += need;
    if (at == a->low)
        a->low = at + need;
    pthread_mutex_unlock(&a->lock);
    return (int64_t)(at * a->slot_bytes);
}

void sq_shm_release(sq_shm_arena_t *a, int64_t offset)
{
    assert(offset >= 0 && (size_t)offset % a->slot_bytes == 0);
    size_t at = (size_t)offset / a->slot_bytes;
    pthread_mutex_lock(&a->lock);
    assert(at < a->nslots && a->run[at] > 0);
    size_t n = a->run[at];
    for (size_t i = at; i < at + n; i++)
        a->busy[i] = 0;
    a->run[at] = 0;
    a->used_slots -= n;
    if (at < a->low)
        a->low = at;
    pthread_mutex_unlock(&a->lock);
}

uint8_t *sq_shm_map(int fd, size_t bytes)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    return p == MAP_FAILED ? NULL : p;
}

void sq_shm_unmap(uint8_t *base, size_t bytes)
{
    if (base != NULL)
        munmap(base, bytes);
}
