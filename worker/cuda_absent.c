/* The CUDA side of a process without the CUDA backend: squish-worker,
 * which serves cpu and emu devices (main.c execs squish-worker-cuda, its
 * sibling, for a cuda one), or any binary of a build without CUDA.
 *
 * Why two workers: the CUDA libraries cost every process that maps them,
 * GPU or not, before any call (libcublasLt's data alone, 84 MB resident,
 * and 70 MB of their pages; an idle cpu worker held 97 MB of anonymous
 * memory with them, 2 MB without), and their load time at each start. */
#include "wk.h"
#include "wk_exec_int.h"

#include <sq.h>
#include <sq_config.h>

#include <stdio.h>

int wk_cuda_in_process(void)
{
    return 0;
}

int wk_cuda_probe(int index, uint64_t *memory_bytes, char *why, int why_size)
{
    (void)index;
    (void)memory_bytes;
    snprintf(why, (size_t)why_size, "%s",
             SQUISH_HAVE_CUDA ? "this process has no CUDA backend: cuda devices run in "
                                "squish-worker-cuda (squish-worker execs it)"
                              : "this build has no CUDA backend (meson -Dcuda=enabled)");
    return SQ_DEVICE;
}

const wk_backend_ops_t *wk__cuda_ops(void)
{
    return NULL;
}
