/* A Resize step (wk_exec_int.h) as ck_types.h's transforms and taps take
 * it: the cpu backend's C kernel and the cuda kernel read the step through
 * this one function. */
#ifndef WK_RESIZE_H
#define WK_RESIZE_H

#include "ck_types.h"
#include "wk_exec_int.h"

static inline ck_resize_how_t wk_resize_how(const wk_step_t *s)
{
    return (ck_resize_how_t){
        .mode = s->p.resize.cubic    ? CK_RESIZE_CUBIC
                : s->p.resize.linear ? CK_RESIZE_LINEAR
                                     : CK_RESIZE_NEAREST,
        .coord = (int)s->p.resize.coord,
        .nearest = (int)s->p.resize.nearest,
        .exclude_outside = s->p.resize.exclude_outside,
        .cubic_a = s->p.resize.cubic_a,
        .scale = {s->p.resize.scale[0], s->p.resize.scale[1]},
    };
}
_Static_assert((int)WK_RESIZE_HALF_PIXEL == CK_COORD_HALF_PIXEL &&
                   (int)WK_RESIZE_PYTORCH_HALF_PIXEL == CK_COORD_PYTORCH_HALF_PIXEL &&
                   (int)WK_RESIZE_ALIGN_CORNERS == CK_COORD_ALIGN_CORNERS &&
                   (int)WK_RESIZE_ASYMMETRIC == CK_COORD_ASYMMETRIC,
               "one list of coordinate transforms");
_Static_assert((int)WK_NEAREST_ROUND_PREFER_FLOOR == CK_NEAREST_ROUND_PREFER_FLOOR &&
                   (int)WK_NEAREST_ROUND_PREFER_CEIL == CK_NEAREST_ROUND_PREFER_CEIL &&
                   (int)WK_NEAREST_FLOOR == CK_NEAREST_FLOOR &&
                   (int)WK_NEAREST_CEIL == CK_NEAREST_CEIL,
               "one list of nearest roundings");

#endif
