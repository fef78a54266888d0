/* One backoff for every retry loop: a delay that doubles per consecutive
 * failure up to a cap, and starts over once things went well (a worker
 * restarted by squishd, a remote worker reconnecting, a frontend joining
 * the dispatcher). Not thread-safe; the caller owns it. */
#ifndef SQ_BACKOFF_H
#define SQ_BACKOFF_H

typedef struct {
    int first_ms; /* the first delay, and the one after a reset */
    int max_ms;   /* the cap of the doubling */
    int next_ms;  /* the delay the next failure waits */
} sq_backoff_t;

/* Starts at first_ms, doubling up to max_ms (a first delay above the cap
 * is waited once, as given). */
void sq_backoff_init(sq_backoff_t *b, int first_ms, int max_ms);
/* A failure: the delay to wait now (next_ms); the one after is twice as
 * long (1 ms after 0), at most max_ms. */
int sq_backoff_next(sq_backoff_t *b);
/* A success: the next failure waits first_ms again. */
void sq_backoff_reset(sq_backoff_t *b);

#endif
