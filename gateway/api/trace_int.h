/* api/: request traces, Triton's trace extension (trace.c): the settings
 * (global, and per model over them), the choice of which requests to trace
 * (every trace_rate-th, at most trace_count), and the trace file, written
 * as JSON lines by a thread of its own so that no HTTP or dispatch thread
 * waits on file I/O. */
#ifndef GW_TRACE_INT_H
#define GW_TRACE_INT_H

#include "gw_api.h"

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

/* Trace levels (Triton's trace_level): squish records timestamps only. */
#define GW_TRACE_OFF 0
#define GW_TRACE_TIMESTAMPS 1

/* Triton's defaults: off, one in 1000, no limit, written as they come. */
#define GW_TRACE_DEFAULT_RATE 1000

/* Applies a POST body of Triton's trace settings to model's settings
 * (NULL: the global ones): trace_level (["OFF"] or ["TIMESTAMPS"]),
 * trace_rate, trace_count and log_frequency (strings, as Triton's, or
 * integers); null clears a model's setting back to the global one (the
 * global one back to its default). trace_file and trace_mode are accepted
 * only as they are (the file is chosen at start; the mode is "triton").
 * Anything else is refused: SQ_BAD_REQUEST with why, and nothing changed.
 * Updating a setting restarts its rate count, as in Triton. Thread-safe. */
int gw_trace_update(gw_trace_t *t, const char *model, json_t *body, char *why, size_t len);
/* The settings in effect for model (NULL: the global ones) as Triton's
 * GET answer: trace_level, trace_rate, trace_count (the traces left; -1:
 * no limit), log_frequency, trace_file, trace_mode. Thread-safe. */
json_t *gw_trace_settings_json(gw_trace_t *t, const char *model);

/* A request for model arrived: its trace id (> 0) when it is to be traced
 * (every trace_rate-th request under model's settings, while trace_count
 * allows), else 0. Any thread; a lock only while some setting traces. */
uint64_t gw_trace_sample(gw_trace_t *t, const char *model);

/* The moments of a request's life, in order, as a trace line names them. */
typedef enum {
    GW_TRACE_RECEIVE,       /* the request reached its handler, body read */
    GW_TRACE_DECODE_START,  /* its first JPEG's decode began (JPEG inputs) */
    GW_TRACE_DECODE_END,    /* its last JPEG's decode ended */
    GW_TRACE_QUEUE,         /* its items reached the dispatcher */
    GW_TRACE_BATCH,         /* its first batch went to a worker */
    GW_TRACE_EXECUTE_START, /* the worker's run of that batch began */
    GW_TRACE_EXECUTE_END,   /* the run of its last batch ended */
    GW_TRACE_REPLY,         /* the answer was handed to HTTP */
    GW_TRACE_NSTAMPS
} gw_trace_stamp_t;

/* One traced request: what its line says. Times in µs on CLOCK_MONOTONIC
 * (sq_now_us); 0: the request never got there (failed before, or no
 * JPEG). */
typedef struct {
    uint64_t id;
    const char *request_id;
    const char *model;
    int version;
    int status; /* the HTTP status answered; 0: none (the client went away) */
    int items;
    int batch_size; /* its largest batch */
    int64_t at_us[GW_TRACE_NSTAMPS];
} gw_trace_record_t;

/* The stamp's name in a line ("receive", "decode_start"...). */
const char *gw_trace_stamp_name(gw_trace_stamp_t s);
/* Formats r as one JSON line with its newline into out (truncated to len,
 * NUL-terminated); returns the length it would have:
 * {"id", "request_id", "model_name", "model_version", "status", "items",
 *  "batch_size", "timestamps": [{"name", "us"}...]} with the stamps
 * reached, in the order above. Strings are escaped byte by byte (a byte
 * past ASCII as \u00XX), so that any X-Request-Id gives valid JSON. */
size_t gw_trace_format(const gw_trace_record_t *r, char *out, size_t len);
/* Queues r's line for the writer; any thread, never blocks on I/O (past
 * 16 MiB waiting the line is dropped and counted in a warning). */
void gw_trace_emit(gw_trace_t *t, const gw_trace_record_t *r);

#endif
