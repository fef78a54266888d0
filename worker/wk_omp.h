/* The cpu worker's own OpenMP runtime (omp_pool.c): it stands in for
 * libgomp under oneDNN, so that threads spin between the parallel regions
 * of a running graph and sleep otherwise. */
#ifndef WK_OMP_H
#define WK_OMP_H

#include <stdbool.h>

/* Whether the regions the calling thread leads from now on wait for each
 * other spinning (at most SQUISH_CPU_SPIN_US, 50 by default) before they
 * sleep, or sleep at once (off, the default: between graphs). */
void wk_omp_hot(bool on);

/* Whether the regions the calling thread leads from now on run on it
 * alone, their team's shares one after the other, without waking the
 * workers (unless a share waits at a barrier for the others): for a
 * machine where a neighbour holds the workers' cores. Off by default. */
void wk_omp_alone(bool on);

/* False when SQUISH_CPU_SPIN_US=0: wk_omp_hot(true) changes nothing. */
bool wk_omp_spins(void);

/* Runs fn(data) as one parallel region of the calling thread's pool, on
 * every thread of its team (omp_get_thread_num tells which). */
void wk_omp_run(void (*fn)(void *), void *data);

/* Parallel regions run on more than one thread so far, in this process. */
unsigned long wk_omp_regions(void);

#endif
