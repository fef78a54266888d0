/* Device kinds and device specs (sq_device.h): the one name table. */
#include "sq_device.h"

#include "sq_error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const kind_names[] = {
    [SQ_DEV_CPU] = "cpu",
    [SQ_DEV_CUDA] = "cuda",
    [SQ_DEV_EMU] = "emu",
};
_Static_assert(sizeof(kind_names) / sizeof(kind_names[0]) == SQ_DEV_KIND_COUNT,
               "a device kind without a name");

const char *sq_dev_kind_name(sq_dev_kind_t kind)
{
    return (int)kind >= 0 && kind < SQ_DEV_KIND_COUNT ? kind_names[kind] : "?";
}

int sq_dev_kind_parse(const char *name)
{
    for (int k = 0; k < SQ_DEV_KIND_COUNT; k++)
        if (strcmp(name, kind_names[k]) == 0)
            return k;
    return -1;
}

static const char *const precision_names[SQ_PRECISION_COUNT] = {"fp32", "tf32", "fp16", "bf16"};

const char *sq_precision_name(int precision)
{
    return precision >= 0 && precision < SQ_PRECISION_COUNT ? precision_names[precision] : NULL;
}

int sq_precision_parse(const char *name)
{
    for (int p = 0; name != NULL && p < SQ_PRECISION_COUNT; p++)
        if (strcmp(name, precision_names[p]) == 0)
            return p;
    return -1;
}

int sq_device_format(char *buf, size_t len, sq_dev_kind_t kind, int index)
{
    if (kind == SQ_DEV_CPU)
        return snprintf(buf, len, "%s", sq_dev_kind_name(kind));
    return snprintf(buf, len, "%s:%d", sq_dev_kind_name(kind), index);
}

/* A spec without "@HOST". */
static int parse_local(const char *spec, sq_device_t *out)
{
    memset(out, 0, sizeof(*out));
    if (strcmp(spec, "cpu") == 0 || strcmp(spec, "cpu:0") == 0) {
        out->kind = SQ_DEV_CPU;
        sq_device_format(out->name, sizeof(out->name), out->kind, 0);
        return 0;
    }
    const char *colon = strchr(spec, ':');
    if (colon == NULL)
        return SQ_INVAL;
    char kind[8];
    size_t klen = (size_t)(colon - spec);
    if (klen >= sizeof(kind))
        return SQ_INVAL;
    memcpy(kind, spec, klen);
    kind[klen] = '\0';
    int k = sq_dev_kind_parse(kind);
    if (k < 0 || k == SQ_DEV_CPU)
        return SQ_INVAL;
    out->kind = (sq_dev_kind_t)k;
    char *end;
    const char *num = colon + 1;
    if (*num < '0' || *num > '9')
        return SQ_INVAL;
    long n = strtol(num, &end, 10);
    if (*end != '\0' || n < 0 || n > 4095)
        return SQ_INVAL;
    out->index = (int)n;
    sq_device_format(out->name, sizeof(out->name), out->kind, out->index);
    return 0;
}

int sq_device_parse(const char *spec, sq_device_t *out)
{
    const char *at = strchr(spec, '@');
    if (at == NULL)
        return parse_local(spec, out);
    /* "cpu@host": a worker on another host, named after it. */
    char dev[16];
    size_t dlen = (size_t)(at - spec), hlen = strlen(at + 1);
    if (dlen >= sizeof(dev) || hlen == 0 || hlen > SQ_DEVICE_MAX_HOST)
        return SQ_INVAL;
    for (const char *h = at + 1; *h; h++)
        if (!((*h >= 'a' && *h <= 'z') || (*h >= 'A' && *h <= 'Z') || (*h >= '0' && *h <= '9') ||
              *h == '.' || *h == '-' || *h == '_'))
            return SQ_INVAL;
    memcpy(dev, spec, dlen);
    dev[dlen] = '\0';
    if (parse_local(dev, out) != 0)
        return SQ_INVAL;
    size_t n = strlen(out->name);
    snprintf(out->name + n, sizeof(out->name) - n, "@%s", at + 1);
    return 0;
}
