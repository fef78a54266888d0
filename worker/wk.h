/* worker/: squish-worker, one process per device. This header is the
 * module's public face: device specs and probing. The execution engine
 * (graph executor and backends) is added behind wk_backend_t. */
#ifndef WK_H
#define WK_H

#include <sq_device.h>
#include <stdint.h>

/* A device spec (common/sq_device.h) and what probing found. */
typedef struct {
    sq_dev_kind_t kind;
    int index;                     /* N of cuda:N / emu:N; 0 for cpu */
    char name[SQ_DEVICE_NAME_MAX]; /* canonical: "cpu", "cuda:0", "emu:3", "cpu@host2" */
    uint64_t memory_bytes;
} wk_device_t;

/* Exit status of a worker whose device cannot be used: the one squishd's
 * supervisor falls back on (common/sq_device.h). */
#define WK_EXIT_DEVICE_UNAVAILABLE SQ_EXIT_DEVICE_UNAVAILABLE

/* sq_device_parse into a device not probed yet (memory_bytes 0). Returns 0
 * or SQ_INVAL. */
int wk_device_parse(const char *spec, wk_device_t *out);

/* Probes the device and fills memory_bytes (for emu: keeps a preset value,
 * default 16 GiB). Returns 0, or SQ_DEVICE with a reason in `why`. */
int wk_device_probe(wk_device_t *dev, char *why, int why_size);

/* CUDA probe: device count, then the device's total memory. Returns 0 or
 * SQ_DEVICE with the CUDA error text; in a process without the CUDA
 * backend (cuda_absent.c), SQ_DEVICE saying so. */
int wk_cuda_probe(int index, uint64_t *memory_bytes, char *why, int why_size);

/* Whether this process has the CUDA backend in it: squish-worker-cuda and
 * the tests and benchmarks of a CUDA build do (cuda_probe.c);
 * squish-worker, which serves cpu and emu devices and execs
 * squish-worker-cuda for a cuda one, does not (cuda_absent.c). */
int wk_cuda_in_process(void);

#endif
