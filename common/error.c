#include "sq_error.h"

#include <string.h>

static const struct {
    const char *name;
    int http_status;
    const char *msg;
} err_table[] = {
#define SQ_ERR_ROW_(e, name, status, msg) {name, status, msg},
    SQ_ERRORS(SQ_ERR_ROW_)
#undef SQ_ERR_ROW_
};

_Static_assert(sizeof(err_table) / sizeof(err_table[0]) == SQ_ERR_COUNT_, "error table size");

static int err_index(int err)
{
    int idx = -err;
    return idx >= 0 && idx < SQ_ERR_COUNT_ ? idx : -1;
}

const char *sq_err_name(int err)
{
    int i = err_index(err);
    return i < 0 ? "unknown" : err_table[i].name;
}

int sq_err_of_name(const char *name)
{
    for (int i = 1; name != NULL && i < SQ_ERR_COUNT_; i++)
        if (strcmp(err_table[i].name, name) == 0)
            return -i;
    return 0;
}

const char *sq_err_msg(int err)
{
    int i = err_index(err);
    return i < 0 ? "unknown error" : err_table[i].msg;
}

int sq_err_http_status(int err)
{
    int i = err_index(err);
    return i < 0 ? 500 : err_table[i].http_status;
}
