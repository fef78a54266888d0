/* One hash map for every module that looks things up by key: (a, b) pairs
 * of 64-bit words to non-negative ints (an index into the caller's array),
 * open addressing with linear probing, grown at half full. No removal:
 * a caller whose array is compacted clears the map and puts again. Not
 * thread-safe; the caller owns it. Used by the planning loop's sessions
 * (model, SLO bucket) and models, looked up once a request. */
#ifndef SQ_MAP_H
#define SQ_MAP_H

#include <stdint.h>

typedef struct {
    uint64_t *a, *b;
    int *val; /* -1: empty slot */
    uint32_t cap, n;
} sq_map_t;

/* Puts (a, b) -> v (v >= 0), replacing what it held. */
void sq_map_put(sq_map_t *m, uint64_t a, uint64_t b, int v);
/* The value of (a, b), or -1. */
int sq_map_get(const sq_map_t *m, uint64_t a, uint64_t b);
/* Empties it, keeping its room. */
void sq_map_clear(sq_map_t *m);
void sq_map_dispose(sq_map_t *m);

#endif
