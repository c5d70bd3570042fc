/* util/fmt.h - internal: the one way the text outputs of sim and the CLI print a byte count
 * ("0 bytes", "512 bytes", "1.5 MiB", up to EiB).  (The planner prints exact integers and
 * its own two-decimal form, pinned by its golden tests: plan/format.c.) */
#ifndef KVC_UTIL_FMT_H
#define KVC_UTIL_FMT_H

#include <stddef.h>

/* Write `bytes` to buf (cap bytes, NUL-terminated) and return buf. */
const char *kvc__fmt_iec(char *buf, size_t cap, double bytes);

#endif
