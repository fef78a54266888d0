/* common/: the pieces every squish module uses. One include for all. */
#ifndef SQ_H
#define SQ_H

#include "sq_alloc.h"
#include "sq_auth.h"
#include "sq_backoff.h"
#include "sq_buf.h"
#include "sq_clock.h"
#include "sq_device.h"
#include "sq_dial.h"
#include "sq_error.h"
#include "sq_heap.h"
#include "sq_map.h"
#include "sq_ipc.h"
#include "sq_json.h"
#include "sq_log.h"
#include "sq_loop.h"
#include "sq_opts.h"
#include "sq_shm.h"
#include "sq_text.h"
#include "sq_tls.h"

#endif
