/* Small helpers shared by the C benchmarks (one copy, static inline: each
 * benchmark is its own program). */
#ifndef BENCH_UTIL_H
#define BENCH_UTIL_H

#include <stdio.h>
#include <stdlib.h>

/* qsort order for doubles, ascending. */
static inline int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The whole file at path (malloc'd, caller frees) and its length, or NULL. */
static inline void *bench_slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *p = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (p != NULL && fread(p, 1, (size_t)n, f) != (size_t)n) {
        free(p);
        p = NULL;
    }
    fclose(f);
    *len = n >= 0 ? (size_t)n : 0;
    return p;
}

#endif
