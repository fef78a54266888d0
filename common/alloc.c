#include "sq_alloc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void oom(size_t n)
{
    fprintf(stderr, "squish: out of memory allocating %zu bytes\n", n);
    abort();
}

void *sq_xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (p == NULL)
        oom(n);
    return p;
}

void *sq_xcalloc(size_t count, size_t size)
{
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (p == NULL)
        oom(count * size);
    return p;
}

void *sq_xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (q == NULL)
        oom(n);
    return q;
}

char *sq_xstrdup(const char *s)
{
    return sq_xstrndup(s, strlen(s));
}

char *sq_xstrndup(const char *s, size_t n)
{
    char *p = sq_xmalloc(n + 1);
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}
