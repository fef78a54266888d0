/* Monotonic clock helpers. Times inside squish are int64 microseconds or
 * nanoseconds on CLOCK_MONOTONIC; names carry the unit. The pure cores never
 * call these: their shells pass the time in. */
#ifndef SQ_CLOCK_H
#define SQ_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline int64_t sq_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline int64_t sq_now_us(void)
{
    return sq_now_ns() / 1000;
}

static inline int64_t sq_now_ms(void)
{
    return sq_now_ns() / 1000000;
}

/* Wall-clock seconds since the epoch, for records and metrics only. */
static inline double sq_wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Sleeps until an absolute CLOCK_MONOTONIC time in ns (not a spin). */
static inline void sq_sleep_until_ns(int64_t deadline_ns)
{
    struct timespec ts = {.tv_sec = deadline_ns / 1000000000, .tv_nsec = deadline_ns % 1000000000};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0) {
    }
}

#endif
