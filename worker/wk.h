/* worker/: squish-worker, one process per device. This header is the
 * module's public face: device specs and probing. The execution engine
 * (graph executor and backends) is added behind wk_backend_t. */
#ifndef WK_H
#define WK_H

#include <stdint.h>

typedef enum { WK_DEV_CPU, WK_DEV_CUDA, WK_DEV_EMU } wk_dev_kind_t;

typedef struct {
    wk_dev_kind_t kind;
    int index;     /* N of cuda:N / emu:N; 0 for cpu */
    char name[64]; /* canonical: "cpu", "cuda:0", "emu:3", "cpu@host2" */
    uint64_t memory_bytes;
} wk_device_t;

/* Exit status of a worker whose device cannot be used (no GPU, no driver):
 * squishd's supervisor treats it as "fall back", not as a crash to retry. */
#define WK_EXIT_DEVICE_UNAVAILABLE 3

/* Parses "cpu", "cuda:N" or "emu:N" (N in 0..4095), optionally followed by
 * "@HOST" (a worker on another host: letters, digits, '.', '-', '_', at
 * most WK_MAX_HOST_NAME), kept in the name. Returns 0 or SQ_INVAL. */
#define WK_MAX_HOST_NAME 40
int wk_device_parse(const char *spec, wk_device_t *out);
const char *wk_dev_kind_name(wk_dev_kind_t kind);

/* Probes the device and fills memory_bytes (for emu: keeps a preset value,
 * default 16 GiB). Returns 0, or SQ_DEVICE with a reason in `why`. */
int wk_device_probe(wk_device_t *dev, char *why, int why_size);

/* CUDA probe, only in builds with the CUDA backend: device count, then the
 * device's total memory. Returns 0 or SQ_DEVICE with the CUDA error text. */
int wk_cuda_probe(int index, uint64_t *memory_bytes, char *why, int why_size);

#endif
