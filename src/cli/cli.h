/* cli.h - the kvcache command's subcommands and the helpers they share.
 * The CLI only parses arguments and prints; the work is the library's. */
#ifndef KVC_CLI_H
#define KVC_CLI_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* Each subcommand: argv[0] is the subcommand's name; returns the exit status. */
int kvc_cmd_explain(int argc, char **argv);
int kvc_cmd_sim(int argc, char **argv);
int kvc_cmd_plan(int argc, char **argv);

/* Print "kvcache <cmd>: <message>" on one line to stderr; returns 1 (the exit status). */
int kvc_cli_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Parse a whole decimal number into [min, max]; false on junk or out of range. */
bool kvc_cli_parse_u64(const char *s, uint64_t min, uint64_t max, uint64_t *out);

/* ---- the deployment options kvcache plan and kvcache sim share (deploy.c) ---- */
#include <getopt.h>
#include <stddef.h>
#include "kvcache/plan.h"

enum {
    KVC_CLI_DEPLOY_FIRST = 256, /* option values of the shared table */
    KVC_CLI_PLAN_FIRST = 512,   /* a command's own options start here */
    KVC_CLI_MAX_OPTIONS = 128,
};

typedef struct {
    kvc_plan_params_t p;
    const char *model_arg, *gpu_arg;
    /* explicit GPU numbers; 0 / NAN / UINT64_MAX: not given */
    uint64_t g_mem, g_l2;
    double g_bw, g_flops, g_fp8, g_link, g_pcie;
} kvc_cli_deploy_t;

/* The getopt_long table of the shared options, NULL-terminated. */
extern const struct option kvc_cli_deploy_options[];
void kvc_cli_deploy_init(kvc_cli_deploy_t *d);
/* Handle option ch if it is a shared one: 1 handled, 0 not ours, -1 bad value (the one-line
 * error is printed). */
int kvc_cli_deploy_option(kvc_cli_deploy_t *d, const char *cmd, int ch, const char *opt_name,
                          const char *value);
/* After parsing: the model (preset or config.json) and the GPU (preset or numbers).  0, or
 * 1 with the one-line error printed. */
int kvc_cli_deploy_resolve(const kvc_cli_deploy_t *d, const char *cmd, kvc_plan_model_t *model,
                           kvc_plan_gpu_t *gpu);
/* Concatenate two NULL-terminated option tables into out (cap entries); -1 if too many. */
int kvc_cli_join_options(struct option *out, size_t cap, const struct option *a,
                         const struct option *b);
bool kvc_cli_parse_double(const char *s, double min, double max, double *out);
/* Parse an option's value; on failure print the one-line error naming the option and the
 * accepted range, and return false. */
bool kvc_cli_opt_u64(const char *cmd, const char *opt, const char *value, uint64_t lo, uint64_t hi,
                     uint64_t *out);
bool kvc_cli_opt_double(const char *cmd, const char *opt, const char *value, double lo, double hi,
                        double *out);
/* The one-line error for what getopt_long could not take (ch ':' or '?'): a missing value, a
 * value given to a flag, or an unknown option.  Returns 1. */
int kvc_cli_bad_option(const char *cmd, int ch, const char *opt_name);
/* The name of the option getopt_long just returned, for messages: from the table when it
 * matched one (li >= 0), else the argument as typed, cut at '='. */
void kvc_cli_opt_name(char *out, size_t cap, const struct option *opts, int li, int ch, int argc,
                      char **argv);
int kvc_cli_presets_line(char *buf, size_t len, bool models);
void kvc_cli_list_presets(void);

#endif
