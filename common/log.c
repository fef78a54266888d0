#include "sq_log.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

sq_log_level_t sq_log_level_ = SQ_LOG_INFO;

static const char *level_names[] = {"debug", "info", "warn", "error", "off"};
static char log_tag[48] = "squish";
static sq_log_sink_fn log_sink;
static void *log_sink_ctx;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

void sq_log_set_level(sq_log_level_t level)
{
    sq_log_level_ = level;
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
        struct tm tm;
        clock_gettime(CLOCK_REALTIME, &ts);
        gmtime_r(&ts.tv_sec, &tm);
        fprintf(stderr, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s level=%s %s\n", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000,
                log_tag, sq_log_level_name(level), msg);
    }
    pthread_mutex_unlock(&log_lock);
}
