/* Fault injection for tests of squishd's supervision: a worker started with
 *   SQUISH_WORKER_FAULT=POINT:SHA[,POINT:SHA...]
 * (POINT one of load, profile, run, refuse; SHA a prefix of a model file's
 * sha256, at least 8 hex digits) dies of SIGSEGV when it reaches that point
 * for that file, as a worker would on a model that crashes its backend;
 * "refuse" makes its load answer MODEL_FAILED instead, as a backend that
 * cannot run the graph would; "precision" makes the worker take that
 * model's plan to run the precision its load asked for (the cpu backend
 * runs FP32 whatever is asked), so that the measurement of a lower
 * precision's deviation from FP32 (an FP32 reference plan, a comparison)
 * runs on a cpu worker too. Unset (the default, and in production) it
 * does nothing. Read once, at the first call. */
#ifndef WK_FAULT_H
#define WK_FAULT_H

typedef enum {
    WK_FAULT_LOAD,
    WK_FAULT_PROFILE,
    WK_FAULT_RUN,
    WK_FAULT_REFUSE,
    WK_FAULT_PRECISION
} wk_fault_point_t;

/* Crashes the process if a fault is set for (point, sha256); for
 * WK_FAULT_REFUSE and WK_FAULT_PRECISION returns 1 instead (0 when no
 * fault is set). */
int wk_fault_check(wk_fault_point_t point, const char *sha256);

#endif
