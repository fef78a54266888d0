#include "wk.h"

#include <sq.h>
#include <sq_config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *wk_dev_kind_name(wk_dev_kind_t kind)
{
    switch (kind) {
    case WK_DEV_CPU:
        return "cpu";
    case WK_DEV_CUDA:
        return "cuda";
    case WK_DEV_EMU:
        return "emu";
    }
    return "?";
}

static int device_parse(const char *spec, wk_device_t *out);

int wk_device_parse(const char *spec, wk_device_t *out)
{
    const char *at = strchr(spec, '@');
    if (at == NULL)
        return device_parse(spec, out);
    /* "cpu@host": a worker on another host, named after it. */
    char dev[16];
    size_t dlen = (size_t)(at - spec), hlen = strlen(at + 1);
    if (dlen >= sizeof(dev) || hlen == 0 || hlen > WK_MAX_HOST_NAME)
        return SQ_INVAL;
    for (const char *h = at + 1; *h; h++)
        if (!((*h >= 'a' && *h <= 'z') || (*h >= 'A' && *h <= 'Z') || (*h >= '0' && *h <= '9') ||
              *h == '.' || *h == '-' || *h == '_'))
            return SQ_INVAL;
    memcpy(dev, spec, dlen);
    dev[dlen] = '\0';
    if (device_parse(dev, out) != 0)
        return SQ_INVAL;
    size_t n = strlen(out->name);
    snprintf(out->name + n, sizeof(out->name) - n, "@%s", at + 1);
    return 0;
}

static int device_parse(const char *spec, wk_device_t *out)
{
    memset(out, 0, sizeof(*out));
    if (strcmp(spec, "cpu") == 0 || strcmp(spec, "cpu:0") == 0) {
        out->kind = WK_DEV_CPU;
        snprintf(out->name, sizeof(out->name), "cpu");
        return 0;
    }
    const char *colon = strchr(spec, ':');
    if (colon == NULL)
        return SQ_INVAL;
    size_t klen = (size_t)(colon - spec);
    if (klen == 4 && strncmp(spec, "cuda", 4) == 0)
        out->kind = WK_DEV_CUDA;
    else if (klen == 3 && strncmp(spec, "emu", 3) == 0)
        out->kind = WK_DEV_EMU;
    else
        return SQ_INVAL;
    char *end;
    const char *num = colon + 1;
    if (*num < '0' || *num > '9')
        return SQ_INVAL;
    long n = strtol(num, &end, 10);
    if (*end != '\0' || n < 0 || n > 4095)
        return SQ_INVAL;
    out->index = (int)n;
    snprintf(out->name, sizeof(out->name), "%s:%d", wk_dev_kind_name(out->kind), out->index);
    return 0;
}

int wk_device_probe(wk_device_t *dev, char *why, int why_size)
{
    switch (dev->kind) {
    case WK_DEV_CPU: {
        long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
        dev->memory_bytes = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
        return 0;
    }
    case WK_DEV_EMU:
        if (dev->memory_bytes == 0)
            dev->memory_bytes = (uint64_t)16 << 30;
        return 0;
    case WK_DEV_CUDA:
#if SQUISH_HAVE_CUDA
        return wk_cuda_probe(dev->index, &dev->memory_bytes, why, why_size);
#else
        snprintf(why, (size_t)why_size, "this build has no CUDA backend (meson -Dcuda=enabled)");
        return SQ_DEVICE;
#endif
    }
    snprintf(why, (size_t)why_size, "unknown device kind");
    return SQ_DEVICE;
}
