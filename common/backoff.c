/* The doubling backoff of sq_backoff.h. */
#include "sq_backoff.h"

void sq_backoff_init(sq_backoff_t *b, int first_ms, int max_ms)
{
    b->first_ms = first_ms < 0 ? 0 : first_ms;
    b->max_ms = max_ms < 0 ? 0 : max_ms;
    b->next_ms = b->first_ms;
}

int sq_backoff_next(sq_backoff_t *b)
{
    int delay = b->next_ms;
    int twice = delay == 0 ? 1 : delay > b->max_ms / 2 ? b->max_ms : delay * 2;
    b->next_ms = twice > b->max_ms ? b->max_ms : twice;
    return delay;
}

void sq_backoff_reset(sq_backoff_t *b)
{
    b->next_ms = b->first_ms;
}
