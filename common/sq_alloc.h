/* Bookkeeping allocations abort on OOM (one wrapper, one place). Input,
 * tensor and device allocations must not use these: they return codes. */
#ifndef SQ_ALLOC_H
#define SQ_ALLOC_H

#include <stddef.h>

void *sq_xmalloc(size_t n);
void *sq_xcalloc(size_t count, size_t size);
void *sq_xrealloc(void *p, size_t n);
char *sq_xstrdup(const char *s);
char *sq_xstrndup(const char *s, size_t n);

#endif
