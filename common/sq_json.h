/* JSON text for what squish sends and writes (HTTP replies, the plan,
 * squish-plan's and squish-sim's output): jansson builds and parses the
 * trees, this prints them, with every real number as the shortest decimal
 * that reads back as the same double (0.025, not jansson's %.17g
 * 0.025000000000000001; a fixed JSON_REAL_PRECISION either keeps the noise
 * or loses digits). Storage that only squish reads back (the model
 * database's columns) may keep json_dumps: its text round-trips too. */
#ifndef SQ_JSON_H
#define SQ_JSON_H

#include "sq_buf.h"

#include <jansson.h>
#include <stddef.h>

/* Bytes a formatted real needs, its terminating NUL included. */
#define SQ_JSON_REAL_MAX 32

/* Writes v into out (SQ_JSON_REAL_MAX bytes) as the shortest decimal that
 * strtod reads back as v, in JSON syntax, and returns its length. Plain
 * notation for 1e-4 <= |v| < 1e16 (as Python's repr), keeping a ".0" on
 * whole values so that they read back as reals ("3.0", "-0.0"); exponent
 * notation otherwise ("1e-07" is written "1e-7", 1e300 "1e300"). NaN and
 * the infinities, which JSON cannot say, are written "null". */
size_t sq_json_real(double v, char *out);

/* The flags of jansson's json_dumps that these functions honour:
 * JSON_INDENT(n), JSON_COMPACT and JSON_SORT_KEYS (object keys in
 * insertion order otherwise, so JSON_PRESERVE_ORDER changes nothing). Any
 * value may be dumped, not only arrays and objects (JSON_ENCODE_ANY). Bytes
 * of a string that are not UTF-8 are written as U+FFFD. */
#define SQ_JSON_FLAGS (JSON_MAX_INDENT | JSON_COMPACT | JSON_SORT_KEYS | JSON_PRESERVE_ORDER)

/* Appends the JSON text of j (no trailing newline) to out. Returns 0, or
 * -1 (out as it was) when j nests deeper than jansson's parser accepts or
 * is NULL. flags: SQ_JSON_FLAGS only. */
int sq_json_dump_buf(const json_t *j, size_t flags, sq_buf_t *out);

/* The JSON text of j as a NUL-terminated string the caller frees, as
 * json_dumps; NULL where sq_json_dump_buf fails. */
char *sq_json_dumps(const json_t *j, size_t flags);

#endif
