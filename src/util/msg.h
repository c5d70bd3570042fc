/* util/msg.h - internal: the one-line messages that checkers and parsers hand
 * back through (msg, cap) out-parameters.  Shared by every layer. */
#ifndef KVC_UTIL_MSG_H
#define KVC_UTIL_MSG_H

#include <stddef.h>

/* Format a message into msg[0..cap) (if msg and cap) and return err, so that
 * `return kvc__msgf(KVC_ECORRUPT, msg, cap, "...", ...);` reports and fails in one line. */
int kvc__msgf(int err, char *msg, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
