/* Registered system shared-memory regions (shm_int.h): a table of
 * reference-counted mappings of POSIX shared-memory objects, by name. */
#include "shm_int.h"

#include <sq.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

struct gw_shm_region {
    atomic_int refs; /* the table's (while registered) and one per request using it */
    char name[GW_SHM_NAME_MAX + 1];
    char key[NAME_MAX + 2];
    uint64_t offset;    /* of the region in the object */
    uint64_t byte_size; /* of the region */
    /* Kept open to check the object's size at each use (gw_shm_span). */
    int fd;
    void *map; /* mmap's, from offset rounded down to a page */
    size_t map_len;
    uint8_t *data; /* the region's first byte */
};

struct gw_shm_table {
    pthread_mutex_t mu;
    gw_shm_region_t *regions[GW_SHM_MAX_REGIONS]; /* registration order */
    int count;
};

gw_shm_table_t *gw_shm_table_new(void)
{
    gw_shm_table_t *t = sq_xcalloc(1, sizeof(*t));
    pthread_mutex_init(&t->mu, NULL);
    return t;
}

void gw_shm_table_free(gw_shm_table_t *t)
{
    if (t == NULL)
        return;
    json_decref(gw_shm_unregister(t, NULL));
    pthread_mutex_destroy(&t->mu);
    free(t);
}

int gw_shm_name_ok(const char *name, size_t len)
{
    if (len == 0 || len > GW_SHM_NAME_MAX)
        return 0;
    for (size_t i = 0; i < len; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '~' || c == '-'))
            return 0;
    }
    return 1;
}

int gw_shm_key_ok(const char *key)
{
    while (*key == '/')
        key++;
    size_t n = strlen(key);
    return n >= 1 && n <= NAME_MAX && strchr(key, '/') == NULL && strcmp(key, ".") != 0 &&
           strcmp(key, "..") != 0;
}

/* The index of region name in the table, or -1; under the lock. */
static int find(const gw_shm_table_t *t, const char *name)
{
    for (int i = 0; i < t->count; i++)
        if (strcmp(t->regions[i]->name, name) == 0)
            return i;
    return -1;
}

static void region_free(gw_shm_region_t *r)
{
    if (r->map != NULL)
        munmap(r->map, r->map_len);
    if (r->fd >= 0)
        close(r->fd);
    free(r);
}

void gw_shm_release(gw_shm_region_t *r)
{
    if (r != NULL && atomic_fetch_sub(&r->refs, 1) == 1)
        region_free(r);
}

/* Opens and maps the region (no lock held: syscalls); 0 or SQ_BAD_REQUEST
 * with why. */
static int region_map(gw_shm_region_t *r, char *why, size_t len)
{
    r->fd = shm_open(r->key, O_RDWR, 0);
    if (r->fd < 0) {
        int e = errno;
        if (e == ENOENT)
            snprintf(why, len,
                     "failed to register shared memory region '%s': no shared-memory object '%s' "
                     "(create it first, e.g. with Python's multiprocessing.shared_memory or "
                     "tritonclient.utils.shared_memory)",
                     r->name, r->key);
        else if (e == EACCES)
            snprintf(why, len,
                     "failed to register shared memory region '%s': squishd may not open '%s' "
                     "read-write (permission denied)",
                     r->name, r->key);
        else
            snprintf(why, len, "failed to register shared memory region '%s': cannot open '%s': %s",
                     r->name, r->key, strerror(e));
        return SQ_BAD_REQUEST;
    }
    struct stat st;
    if (fstat(r->fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < 0) {
        snprintf(why, len,
                 "failed to register shared memory region '%s': '%s' is not a shared-memory "
                 "object",
                 r->name, r->key);
        return SQ_BAD_REQUEST;
    }
    uint64_t size = (uint64_t)st.st_size;
    if (r->offset > size || r->byte_size > size - r->offset) {
        snprintf(why, len,
                 "failed to register shared memory region '%s': offset %llu + byte_size %llu is "
                 "past the end of '%s' (%llu bytes)",
                 r->name, (unsigned long long)r->offset, (unsigned long long)r->byte_size, r->key,
                 (unsigned long long)size);
        return SQ_BAD_REQUEST;
    }
    /* mmap takes page-aligned offsets only; Triton refuses any other. */
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t map_off = r->offset - r->offset % page;
    if (r->byte_size + (r->offset - map_off) > SIZE_MAX) {
        snprintf(why, len, "failed to register shared memory region '%s': too large", r->name);
        return SQ_BAD_REQUEST;
    }
    r->map_len = (size_t)(r->byte_size + (r->offset - map_off));
    void *map = mmap(NULL, r->map_len, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd, (off_t)map_off);
    if (map == MAP_FAILED) {
        snprintf(why, len, "failed to register shared memory region '%s': cannot map it: %s",
                 r->name, strerror(errno));
        return SQ_BAD_REQUEST;
    }
    r->map = map;
    r->data = (uint8_t *)map + (r->offset - map_off);
    return 0;
}

int gw_shm_register(gw_shm_table_t *t, const char *name, const char *key, uint64_t offset,
                    uint64_t byte_size, char *why, size_t len)
{
    if (!gw_shm_name_ok(name, strlen(name))) {
        snprintf(why, len,
                 "region name '%.*s': expected 1..%d of the characters A-Z a-z 0-9 . _ ~ -",
                 GW_SHM_NAME_MAX, name, GW_SHM_NAME_MAX);
        return SQ_BAD_REQUEST;
    }
    if (!gw_shm_key_ok(key)) {
        snprintf(why, len,
                 "cannot register shared memory region '%s' - invalid shm key '%.*s': expected "
                 "a POSIX shared-memory object name, \"/name\" with no other '/'",
                 name, NAME_MAX, key);
        return SQ_BAD_REQUEST;
    }
    if (byte_size == 0) {
        snprintf(why, len, "byte_size: expected an integer >= 1");
        return SQ_BAD_REQUEST;
    }
    /* Refused before anything is opened, and checked again after (another
     * registration may have taken the name meanwhile). */
    pthread_mutex_lock(&t->mu);
    int taken = find(t, name) >= 0, full = t->count >= GW_SHM_MAX_REGIONS;
    pthread_mutex_unlock(&t->mu);
    if (taken) {
        snprintf(why, len,
                 "shared memory region '%s' is already registered: unregister it first, or "
                 "choose another name",
                 name);
        return SQ_BAD_REQUEST;
    }
    if (full) {
        snprintf(why, len, "squishd holds at most %d shared-memory regions: unregister some first",
                 GW_SHM_MAX_REGIONS);
        return SQ_BAD_REQUEST;
    }
    gw_shm_region_t *r = sq_xcalloc(1, sizeof(*r));
    atomic_init(&r->refs, 1);
    r->fd = -1;
    snprintf(r->name, sizeof(r->name), "%s", name);
    snprintf(r->key, sizeof(r->key), "%s", key);
    r->offset = offset;
    r->byte_size = byte_size;
    int rc = region_map(r, why, len);
    if (rc != 0) {
        region_free(r);
        return rc;
    }
    pthread_mutex_lock(&t->mu);
    taken = find(t, name) >= 0;
    full = t->count >= GW_SHM_MAX_REGIONS;
    if (!taken && !full)
        t->regions[t->count++] = r;
    pthread_mutex_unlock(&t->mu);
    if (taken || full) {
        region_free(r);
        if (taken)
            snprintf(why, len,
                     "shared memory region '%s' is already registered: unregister it first", name);
        else
            snprintf(why, len,
                     "squishd holds at most %d shared-memory regions: unregister some "
                     "first",
                     GW_SHM_MAX_REGIONS);
        return SQ_BAD_REQUEST;
    }
    SQ_INFO("shared-memory region %s registered: %s at %llu, %llu bytes", name, key,
            (unsigned long long)offset, (unsigned long long)byte_size);
    return 0;
}

json_t *gw_shm_unregister(gw_shm_table_t *t, const char *name)
{
    json_t *names = json_array();
    gw_shm_region_t *gone[GW_SHM_MAX_REGIONS];
    int ngone = 0;
    pthread_mutex_lock(&t->mu);
    for (int i = 0; i < t->count;) {
        if (name != NULL && strcmp(t->regions[i]->name, name) != 0) {
            i++;
            continue;
        }
        gone[ngone++] = t->regions[i];
        memmove(&t->regions[i], &t->regions[i + 1],
                (size_t)(t->count - i - 1) * sizeof(t->regions[0]));
        t->count--;
    }
    pthread_mutex_unlock(&t->mu);
    for (int i = 0; i < ngone; i++) {
        json_array_append_new(names, json_string(gone[i]->name));
        SQ_INFO("shared-memory region %s unregistered", gone[i]->name);
        gw_shm_release(gone[i]);
    }
    return names;
}

static json_t *status_json(const gw_shm_region_t *r)
{
    return json_pack("{s:s, s:s, s:I, s:I}", "name", r->name, "key", r->key, "offset",
                     (json_int_t)r->offset, "byte_size", (json_int_t)r->byte_size);
}

json_t *gw_shm_status(gw_shm_table_t *t, const char *name)
{
    json_t *out = json_array();
    pthread_mutex_lock(&t->mu);
    int at = name != NULL ? find(t, name) : -1;
    if (name == NULL) {
        for (int i = 0; i < t->count; i++)
            json_array_append_new(out, status_json(t->regions[i]));
    } else if (at >= 0) {
        json_array_append_new(out, status_json(t->regions[at]));
    }
    pthread_mutex_unlock(&t->mu);
    if (name != NULL && at < 0) {
        json_decref(out);
        return NULL;
    }
    return out;
}

gw_shm_region_t *gw_shm_acquire(gw_shm_table_t *t, const char *name)
{
    pthread_mutex_lock(&t->mu);
    int at = find(t, name);
    gw_shm_region_t *r = at >= 0 ? t->regions[at] : NULL;
    if (r != NULL)
        atomic_fetch_add(&r->refs, 1);
    pthread_mutex_unlock(&t->mu);
    return r;
}

uint8_t *gw_shm_span(gw_shm_region_t *r, uint64_t offset, uint64_t len, char *why, size_t whylen)
{
    if (offset >= r->byte_size) {
        snprintf(why, whylen,
                 "invalid offset for shared memory region '%s': %llu is past its end (%llu bytes)",
                 r->name, (unsigned long long)offset, (unsigned long long)r->byte_size);
        return NULL;
    }
    if (len > r->byte_size - offset) {
        snprintf(why, whylen,
                 "invalid offset + byte size for shared memory region '%s': %llu + %llu is past "
                 "its end (%llu bytes)",
                 r->name, (unsigned long long)offset, (unsigned long long)len,
                 (unsigned long long)r->byte_size);
        return NULL;
    }
    struct stat st = {0};
    if (fstat(r->fd, &st) != 0 || st.st_size < 0 ||
        (uint64_t)st.st_size < r->offset + offset + len) {
        snprintf(why, whylen,
                 "shared memory region '%s': its object '%s' shrank to %lld bytes since it was "
                 "registered; unregister it and register it again",
                 r->name, r->key, (long long)st.st_size);
        return NULL;
    }
    return r->data + offset;
}
