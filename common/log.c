#include "sq_log.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* The levels below SQ_LOG_OFF, each one bit. */
#define ALL_LEVELS ((1u << SQ_LOG_OFF) - 1u)

atomic_uint sq_log_mask_ = ALL_LEVELS & ~((1u << SQ_LOG_INFO) - 1u);

static const char *level_names[] = {"debug", "info", "warn", "error", "off"};
/* Triton's level letters (verbose lines are its 'I' too; squish's debug
 * lines are its verbose ones). */
static const char level_letters[] = {'I', 'I', 'W', 'E', '?'};
static atomic_int log_format = SQ_LOG_FORMAT_SQUISH;
static char log_tag[48] = "squish";
static sq_log_sink_fn log_sink;
static void *log_sink_ctx;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

void sq_log_set_level(sq_log_level_t level)
{
    unsigned below = level >= SQ_LOG_OFF ? ALL_LEVELS : (1u << (unsigned)level) - 1u;
    atomic_store(&sq_log_mask_, ALL_LEVELS & ~below);
}

void sq_log_enable(sq_log_level_t level, int on)
{
    if (level >= SQ_LOG_OFF)
        return;
    if (on)
        atomic_fetch_or(&sq_log_mask_, 1u << (unsigned)level);
    else
        atomic_fetch_and(&sq_log_mask_, ~(1u << (unsigned)level));
}

int sq_log_level_parse(const char *s, sq_log_level_t *out)
{
    for (int i = 0; i <= SQ_LOG_OFF; i++) {
        if (strcmp(s, level_names[i]) == 0) {
            *out = (sq_log_level_t)i;
            return 0;
        }
    }
    return -1;
}

const char *sq_log_level_name(sq_log_level_t level)
{
    return level <= SQ_LOG_OFF ? level_names[level] : "?";
}

void sq_log_set_format(sq_log_format_t format)
{
    atomic_store(&log_format, (int)format);
}

sq_log_format_t sq_log_get_format(void)
{
    return (sq_log_format_t)atomic_load(&log_format);
}

void sq_log_set_sink(sq_log_sink_fn fn, void *ctx)
{
    pthread_mutex_lock(&log_lock);
    log_sink = fn;
    log_sink_ctx = ctx;
    pthread_mutex_unlock(&log_lock);
}

void sq_log_set_tag(const char *tag)
{
    snprintf(log_tag, sizeof(log_tag), "%s", tag);
}

size_t sq_log_format_line(char *out, size_t len, sq_log_format_t format, const struct timespec *ts,
                          long pid, const char *tag, sq_log_level_t level, const char *msg)
{
    struct tm tm;
    gmtime_r(&ts->tv_sec, &tm);
    int n;
    if (format == SQ_LOG_FORMAT_ISO8601)
        n = snprintf(out, len, "%04d-%02d-%02dT%02d:%02d:%02dZ %c %ld %s] %s", tm.tm_year + 1900,
                     tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                     level_letters[level <= SQ_LOG_OFF ? level : SQ_LOG_OFF], pid, tag, msg);
    else
        n = snprintf(out, len, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s level=%s %s",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                     ts->tv_nsec / 1000000, tag, sq_log_level_name(level), msg);
    return n < 0 ? 0 : (size_t)n;
}

void sq_log_write(sq_log_level_t level, const char *fmt, ...)
{
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);

    pthread_mutex_lock(&log_lock);
    if (log_sink != NULL) {
        log_sink(log_sink_ctx, level, msg);
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        char line[sizeof(msg) + 128];
        sq_log_format_line(line, sizeof(line), sq_log_get_format(), &ts, (long)getpid(), log_tag,
                           level, msg);
        fprintf(stderr, "%s\n", line);
    }
    pthread_mutex_unlock(&log_lock);
}
