/* Logging: one macro with levels and a sink. Formatting is skipped below
 * the active level. Lines are structured: a message followed by key=value
 * pairs written by the caller ("worker lost id=3 pid=123 reason=eof"). */
#ifndef SQ_LOG_H
#define SQ_LOG_H

#include <stdarg.h>

typedef enum { SQ_LOG_DEBUG, SQ_LOG_INFO, SQ_LOG_WARN, SQ_LOG_ERROR, SQ_LOG_OFF } sq_log_level_t;

/* A sink receives one formatted line (no trailing newline). */
typedef void (*sq_log_sink_fn)(void *ctx, sq_log_level_t level, const char *line);

extern sq_log_level_t sq_log_level_;

void sq_log_set_level(sq_log_level_t level);
/* Parses "debug|info|warn|error|off"; returns 0 on success, -1 if unknown. */
int sq_log_level_parse(const char *s, sq_log_level_t *out);
const char *sq_log_level_name(sq_log_level_t level);
/* Replaces the sink (NULL restores the default stderr sink). Thread-safe
 * enough for setup time; do not swap sinks while other threads log. */
void sq_log_set_sink(sq_log_sink_fn fn, void *ctx);
/* Sets the component tag printed on every line ("squishd", "worker emu:0"). */
void sq_log_set_tag(const char *tag);
void sq_log_write(sq_log_level_t level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define SQ_LOG(level, ...)                                                                         \
    do {                                                                                           \
        if ((level) >= sq_log_level_)                                                              \
            sq_log_write((level), __VA_ARGS__);                                                    \
    } while (0)
#define SQ_DEBUG(...) SQ_LOG(SQ_LOG_DEBUG, __VA_ARGS__)
#define SQ_INFO(...) SQ_LOG(SQ_LOG_INFO, __VA_ARGS__)
#define SQ_WARN(...) SQ_LOG(SQ_LOG_WARN, __VA_ARGS__)
#define SQ_ERROR(...) SQ_LOG(SQ_LOG_ERROR, __VA_ARGS__)

#endif
