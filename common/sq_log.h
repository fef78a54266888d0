/* Logging: one macro with levels and a sink. Formatting is skipped for a
 * level that is off. Lines are structured: a message followed by key=value
 * pairs written by the caller ("worker lost id=3 pid=123 reason=eof").
 *
 * Which levels are written, and the line format, may change while other
 * threads log (Triton's logging extension, POST /v2/logging): both are
 * atomics, read without a lock by every SQ_LOG. */
#ifndef SQ_LOG_H
#define SQ_LOG_H

#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <time.h>

typedef enum { SQ_LOG_DEBUG, SQ_LOG_INFO, SQ_LOG_WARN, SQ_LOG_ERROR, SQ_LOG_OFF } sq_log_level_t;

/* How a line looks on the default sink:
 *   SQUISH:  "2026-11-25T10:11:12.345Z squishd level=info message" (the default)
 *   ISO8601: "2026-11-25T10:11:12Z I 4242 squishd] message" (Triton's
 *            ISO8601 layout: level letter, pid, then the tag where Triton
 *            names its source file) */
typedef enum { SQ_LOG_FORMAT_SQUISH, SQ_LOG_FORMAT_ISO8601 } sq_log_format_t;

/* A sink receives one formatted line (no trailing newline). */
typedef void (*sq_log_sink_fn)(void *ctx, sq_log_level_t level, const char *line);

/* The levels written: bit (1 << level) per level; read by SQ_LOG. Change it
 * with the functions below only. */
extern atomic_uint sq_log_mask_;

static inline int sq_log_enabled(sq_log_level_t level)
{
    return (atomic_load_explicit(&sq_log_mask_, memory_order_relaxed) >> (unsigned)level) & 1u;
}

/* Writes level and every level above it, nothing below. */
void sq_log_set_level(sq_log_level_t level);
/* Turns one level on or off, the others as they are (Triton's log_info,
 * log_warning, log_error and log_verbose_level are independent). */
void sq_log_enable(sq_log_level_t level, int on);
/* Parses "debug|info|warn|error|off"; returns 0 on success, -1 if unknown. */
int sq_log_level_parse(const char *s, sq_log_level_t *out);
const char *sq_log_level_name(sq_log_level_t level);
void sq_log_set_format(sq_log_format_t format);
sq_log_format_t sq_log_get_format(void);
/* Formats one line of the default sink into out (NUL-terminated, no
 * newline, truncated to len): the wall time ts, the process id, the tag,
 * the level and the message. Returns the length it would have. */
size_t sq_log_format_line(char *out, size_t len, sq_log_format_t format, const struct timespec *ts,
                          long pid, const char *tag, sq_log_level_t level, const char *msg);
/* Replaces the sink (NULL restores the default stderr sink). Thread-safe
 * enough for setup time; do not swap sinks while other threads log. */
void sq_log_set_sink(sq_log_sink_fn fn, void *ctx);
/* Sets the component tag printed on every line ("squishd", "worker emu:0"). */
void sq_log_set_tag(const char *tag);
void sq_log_write(sq_log_level_t level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define SQ_LOG(level, ...)                                                                         \
    do {                                                                                           \
        if (sq_log_enabled(level))                                                                 \
            sq_log_write((level), __VA_ARGS__);                                                    \
    } while (0)
#define SQ_DEBUG(...) SQ_LOG(SQ_LOG_DEBUG, __VA_ARGS__)
#define SQ_INFO(...) SQ_LOG(SQ_LOG_INFO, __VA_ARGS__)
#define SQ_WARN(...) SQ_LOG(SQ_LOG_WARN, __VA_ARGS__)
#define SQ_ERROR(...) SQ_LOG(SQ_LOG_ERROR, __VA_ARGS__)

#endif
