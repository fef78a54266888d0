/* The cpu worker's own OpenMP runtime (omp_pool.c): it stands in for
 * libgomp under oneDNN, so that threads spin between the parallel regions
 * of a running graph and sleep otherwise. */
#ifndef WK_OMP_H
#define WK_OMP_H

#include <stdbool.h>

/* Says whether the calling thread is running a graph now: while it is, the
 * workers of its regions wait for the next region spinning (at most
 * SQUISH_CPU_SPIN_US, 50 by default, less where waits run long; 0: never) instead of sleeping. */
void wk_omp_hot(bool on);

/* Parallel regions run on more than one thread so far, in this process. */
unsigned long wk_omp_regions(void);

#endif
