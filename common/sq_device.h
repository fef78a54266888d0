/* Device kinds: the one list of what a worker can run on, with their names,
 * and the device specs ("cpu", "cuda:1", "emu:3@host2") that squishd's
 * --workers, a worker's --device and its HELLO carry. Parsing only: probing
 * a device is the worker's (worker/wk.h). */
#ifndef SQ_DEVICE_H
#define SQ_DEVICE_H

#include <stddef.h>

/* cpu: oneDNN; cuda: cuDNN + cuBLAS; emu: an emulated device that holds a
 * batch for its profiled l(b). SQ_DEV_KIND_COUNT sizes per-kind arrays. */
typedef enum { SQ_DEV_CPU, SQ_DEV_CUDA, SQ_DEV_EMU, SQ_DEV_KIND_COUNT } sq_dev_kind_t;

/* "cpu", "cuda", "emu"; "?" for anything else. */
const char *sq_dev_kind_name(sq_dev_kind_t kind);
/* The kind named `name` exactly, or -1. */
int sq_dev_kind_parse(const char *name);

/* The arithmetic a model's plan runs in, as a model's config asks for it
 * ("precision") and the worker reports what its plan runs: fp32, tf32,
 * fp16, bf16. The values are the worker's wk_precision_t's (worker/wk_exec.h
 * says what each means); the gateway and the IPC carry them by these. */
#define SQ_PRECISION_COUNT 4
/* "fp32", "tf32", "fp16", "bf16"; NULL for a value out of range. */
const char *sq_precision_name(int precision);
/* The precision named `name` exactly, or -1. */
int sq_precision_parse(const char *name);

/* Exit status of a worker whose device cannot be used (no GPU, no driver):
 * squishd's supervisor treats it as "fall back", not as a crash to retry. */
#define SQ_EXIT_DEVICE_UNAVAILABLE 3

#define SQ_DEVICE_NAME_MAX 64
#define SQ_DEVICE_MAX_HOST 40

typedef struct {
    sq_dev_kind_t kind;
    int index;                     /* N of cuda:N / emu:N; 0 for cpu */
    char name[SQ_DEVICE_NAME_MAX]; /* canonical: "cpu", "cuda:0", "emu:3", "cpu@host2" */
} sq_device_t;

/* Parses "cpu" (or "cpu:0"), "cuda:N" or "emu:N" (N in 0..4095), optionally
 * followed by "@HOST" (a worker on another host: letters, digits, '.', '-',
 * '_', at most SQ_DEVICE_MAX_HOST), kept in the name. Returns 0 or
 * SQ_INVAL. */
int sq_device_parse(const char *spec, sq_device_t *out);

/* The canonical name of device `index` of `kind` on this host: "cpu" (there
 * is one), "cuda:N", "emu:N". Returns what snprintf does. */
int sq_device_format(char *buf, size_t len, sq_dev_kind_t kind, int index);

#endif
