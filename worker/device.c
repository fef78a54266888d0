/* Device specs for the worker, and probing a device for its memory. */
#include "wk.h"

#include <sq.h>
#include <sq_config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int wk_device_parse(const char *spec, wk_device_t *out)
{
    sq_device_t d;
    memset(out, 0, sizeof(*out));
    int rc = sq_device_parse(spec, &d);
    if (rc != 0)
        return rc;
    out->kind = d.kind;
    out->index = d.index;
    memcpy(out->name, d.name, sizeof(out->name));
    return 0;
}

int wk_device_probe(wk_device_t *dev, char *why, int why_size)
{
    switch (dev->kind) {
    case SQ_DEV_CPU: {
        long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
        dev->memory_bytes = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
        return 0;
    }
    case SQ_DEV_EMU:
        if (dev->memory_bytes == 0)
            dev->memory_bytes = (uint64_t)16 << 30;
        return 0;
    case SQ_DEV_CUDA:
        return wk_cuda_probe(dev->index, &dev->memory_bytes, why, why_size);
    case SQ_DEV_KIND_COUNT:
        break;
    }
    snprintf(why, (size_t)why_size, "unknown device kind");
    return SQ_DEVICE;
}
