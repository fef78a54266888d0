/* The names of the execution engine's enums, below every file that prints
 * them: kernels and activations (from their X-macro tables in
 * wk_exec_int.h and wk_acts.h) and precisions (wk_exec.h), a precision's
 * name read back too. */
#include "wk_exec_int.h"

#include <string.h>

const char *const wk_kernel_names[WK_K_COUNT_] = {
#define WK_K_NAME_(e, name) [WK_K_##e] = name,
    WK_KERNELS(WK_K_NAME_)
#undef WK_K_NAME_
};

const char *const wk_act_names[WK_ACT_COUNT_] = {
#define WK_ACT_NAME_(e, name) [WK_ACT_##e] = name,
    WK_ACTS(WK_ACT_NAME_)
#undef WK_ACT_NAME_
};

static const char *const precision_names[WK_PRECISION_COUNT_] = {"fp32", "tf32", "fp16", "bf16"};

const char *wk_precision_name(wk_precision_t p)
{
    return (unsigned)p < WK_PRECISION_COUNT_ ? precision_names[p] : NULL;
}

int wk_precision_parse(const char *name)
{
    for (int i = 0; name != NULL && i < WK_PRECISION_COUNT_; i++)
        if (strcmp(name, precision_names[i]) == 0)
            return i;
    return -1;
}
