/* Small helpers shared by the C benchmarks (one copy, static inline: each
 * benchmark is its own program). */
#ifndef BENCH_UTIL_H
#define BENCH_UTIL_H

#include <math.h>
#include <stdint.h>
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

/* A seeded uniform in [0, 1): a 64-bit LCG's top 53 bits (the same
 * sequence on every machine, so a benchmark's inputs repeat). */
static inline double bench_rnd(uint64_t *state)
{
    *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(*state >> 11) / 9007199254740992.0;
}

/* Zipf(s) shares over n items on shuffled ranks, mean 1: item i gets
 * n * rank_i^-s / sum of them (a session's rate is mean_rps * share[i]). */
static inline void bench_zipf_shares(int n, double s, uint64_t *rng, double *share)
{
    int *rank = malloc(sizeof(int) * (size_t)n);
    for (int i = 0; i < n; i++)
        rank[i] = i + 1;
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(bench_rnd(rng) * (i + 1));
        int t = rank[i];
        rank[i] = rank[j];
        rank[j] = t;
    }
    double zsum = 0;
    for (int i = 0; i < n; i++)
        zsum += pow(rank[i], -s);
    for (int i = 0; i < n; i++)
        share[i] = n * pow(rank[i], -s) / zsum;
    free(rank);
}

#endif
