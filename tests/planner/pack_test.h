/* What the pack tests share: the includes, the ms unit and lookups into a
 * plan (a session's device, its allocation there). */
#ifndef PACK_TEST_H
#define PACK_TEST_H

#include <criterion/criterion.h>
#include <math.h>
#include <pl.h>
#include <sq.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MS 1000.0

static inline const pl_device_t *device_of(const pl_plan_t *p, int session_id, int saturated)
{
    for (int i = 0; i < p->ndevices; i++)
        for (int a = 0; a < p->devices[i].nallocs; a++)
            if (p->devices[i].allocs[a].session_id == session_id &&
                p->devices[i].saturated == saturated)
                return &p->devices[i];
    return NULL;
}

static inline const pl_alloc_t *alloc_of(const pl_device_t *d, int session_id)
{
    for (int a = 0; d && a < d->nallocs; a++)
        if (d->allocs[a].session_id == session_id)
            return &d->allocs[a];
    return NULL;
}

#endif
