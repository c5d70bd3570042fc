/* cli.h - the kvcache command's subcommands and the helpers they share.
 * The CLI only parses arguments and prints; the work is the library's. */
#ifndef KVC_CLI_H
#define KVC_CLI_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* Each subcommand: argv[0] is the subcommand's name; returns the exit status. */
int kvc_cmd_explain(int argc, char **argv);
int kvc_cmd_plan(int argc, char **argv);

/* Print "kvcache <cmd>: <message>" on one line to stderr; returns 1 (the exit status). */
int kvc_cli_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Parse a whole decimal number into [min, max]; false on junk or out of range. */
bool kvc_cli_parse_u64(const char *s, uint64_t min, uint64_t max, uint64_t *out);

#endif
