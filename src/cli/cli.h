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
int kvc_cmd_model(int argc, char **argv);
int kvc_cmd_run(int argc, char **argv);
int kvc_cmd_serve(int argc, char **argv);

/* ---- what every subcommand shares (args.c) ---- */
/* Print "kvcache <cmd>: <message>" on one line to stderr (cmd NULL: "kvcache: <message>");
 * returns 1 (the exit status).  The message is escaped as kvc_cli_escape does, so file names,
 * option values and input lines it quotes can never put raw control bytes on a terminal. */
int kvc_cli_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Bytes kvc_cli_escape may write for n input bytes, the terminating NUL included. */
#define KVC_CLI_ESCAPED_MAX(n) (4 * (size_t)(n) + 1)
/* Copy s[0..n) to out (KVC_CLI_ESCAPED_MAX(n) bytes), NUL-terminated, with every byte a
 * terminal could act on or that is not text escaped: \n \r \t for those, \xNN for other
 * C0 controls, DEL, the bytes of a C1 control (U+0080..U+009F) and each byte that is not part
 * of well-formed UTF-8 (overlong forms, surrogates, past U+10FFFF).  Valid printable UTF-8,
 * backslashes included, is kept as it is, so escaping is idempotent: a library message that
 * already escaped its input (the planner's do) comes out unchanged.  Returns the length
 * written (without the NUL). */
size_t kvc_cli_escape(char *out, const char *s, size_t n);
/* True if s[0..n) is well-formed UTF-8 (what JSON text and JSON output must be). */
bool kvc_cli_utf8_valid(const char *s, size_t n);
/* kvc_cli_escape of a C string into a malloc'd copy (the caller frees it); NULL: no memory. */
char *kvc_cli_escape_dup(const char *s);

/* Parse a whole unsigned decimal number into [min, max]: one or more ASCII digits and nothing
 * else (no sign, no spaces before or after, no base prefix; leading zeros are digits).  False on
 * anything else, on overflow and out of range; *out is untouched then. */
bool kvc_cli_parse_u64(const char *s, uint64_t min, uint64_t max, uint64_t *out);
/* Parse a token count into [min, max]: kvc_cli_parse_u64's digits, or a number with one suffix
 * as vLLM's human_readable_int reads it: k, m, g, t multiply by 10^3, 10^6, 10^9, 10^12 and take
 * a decimal (25.6k = 25,600, truncated); K, M, G, T by 2^10, 2^20, 2^30, 2^40 and take a whole
 * number (32K = 32,768; 1M = 1,048,576).  False on anything else, overflow, out of range. */
bool kvc_cli_parse_tokens(const char *s, uint64_t min, uint64_t max, uint64_t *out);
/* Parse a whole decimal number into [min, max]: [-]digits[.digits][e[+-]digits] (".5" and "5."
 * too), nothing before or after it: no spaces, no '+', no hex floats, no inf or nan.  False on
 * anything else, on overflow or underflow (ERANGE) and out of range.  "-0" gives 0. */
bool kvc_cli_parse_double(const char *s, double min, double max, double *out);

/* What kvc_cli_parse_json_uint made of a number. */
typedef enum {
    KVC_CLI_NUM_OK = 0,
    KVC_CLI_NUM_MALFORMED,   /* not a decimal number */
    KVC_CLI_NUM_NOT_INTEGER, /* a fraction: 1.5, 1e-3 */
    KVC_CLI_NUM_NEGATIVE,    /* a whole number below 0 */
    KVC_CLI_NUM_TOO_LARGE,   /* a whole number above max (1e30, 1e400 included) */
} kvc_cli_num_t;
/* Parse the text s[0..n) of a JSON number (as written: [-]digits[.digits][(e|E)[+-]digits]) as
 * an exact whole number in [0, max], never through a double: 18446744073709551615 is itself,
 * 1.5e3 is 1500, -0 is 0.  On KVC_CLI_NUM_OK *out receives it; otherwise *out is untouched. */
kvc_cli_num_t kvc_cli_parse_json_uint(const char *s, size_t n, uint64_t max, uint64_t *out);

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
    bool weight_dtype_given; /* --weight-dtype was given: it wins over the checkpoint's */
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
int kvc_cli_deploy_resolve(kvc_cli_deploy_t *d, const char *cmd, kvc_plan_model_t *model,
                           kvc_plan_gpu_t *gpu);
/* Concatenate two NULL-terminated option tables into out (cap entries); -1 if too many. */
int kvc_cli_join_options(struct option *out, size_t cap, const struct option *a,
                         const struct option *b);
/* Parse an option's value; on failure print the one-line error naming the option and the
 * accepted range, and return false. */
bool kvc_cli_opt_u64(const char *cmd, const char *opt, const char *value, uint64_t lo, uint64_t hi,
                     uint64_t *out);
/* A token count (kvc_cli_parse_tokens: 32k, 32K, 1M) in [lo, hi], or the one-line error. */
bool kvc_cli_opt_tokens(const char *cmd, const char *opt, const char *value, uint64_t lo,
                        uint64_t hi, uint64_t *out);
bool kvc_cli_opt_double(const char *cmd, const char *opt, const char *value, double lo, double hi,
                        double *out);
/* The one-line error for what getopt_long could not take (ch ':' or '?'): a missing value, a
 * value given to a flag, or an unknown option.  Returns 1. */
int kvc_cli_bad_option(const char *cmd, int ch, const char *opt_name);
/* For getopt_long's '?' in commands whose optstring has no leading ':' (run, serve): a long
 * option (code >= first_long) without its value, a short one without its value or unknown, or
 * an unknown option; the one-line error, returns 1. */
int kvc_cli_getopt_error(const char *cmd, char **argv, int first_long);
/* The name of the option getopt_long just returned, for messages: from the table when it
 * matched one (li >= 0), else the argument as typed, cut at '='. */
void kvc_cli_opt_name(char *out, size_t cap, const struct option *opts, int li, int ch, int argc,
                      char **argv);
int kvc_cli_presets_line(char *buf, size_t len, bool models);
void kvc_cli_list_presets(void);

/* ---- the engine's options and model loading, shared by run and serve (engine_opts.c) ---- */
#include "kvcache/engine.h"
enum {
    KVC_CLI_ENGINE_THREADS = 800, /* option values of the shared engine table */
    KVC_CLI_ENGINE_KV_DTYPE,
    KVC_CLI_ENGINE_KV_MEMORY,
    KVC_CLI_ENGINE_CTX,
    KVC_CLI_ENGINE_BLOCK,
    KVC_CLI_ENGINE_MAX_SEQS,
    KVC_CLI_ENGINE_BATCH,
    KVC_CLI_ENGINE_CHUNK,
    KVC_CLI_ENGINE_NO_KV,
    KVC_CLI_ENGINE_NO_PREFIX,
    KVC_CLI_ENGINE_NO_BI,
    KVC_CLI_ENGINE_PREEMPT,
    KVC_CLI_ENGINE_ISA,
    KVC_CLI_ENGINE_TIER,
    KVC_CLI_ENGINE_TIER_BUDGET,
    KVC_CLI_ENGINE_TIER_ADMISSION,
    KVC_CLI_ENGINE_TIER_FETCH,
};
/* The getopt_long table of the engine's options (--threads, --kv-dtype, --kv-memory, --ctx,
 * --block-size, --max-seqs/--max-num-seqs, --batch-tokens/--max-num-batched-tokens, --chunk,
 * --no-kv-cache, --no-prefix-cache, --no-batch-invariance, --preemption, --isa, --tier (up to
 * KVC_ENGINE_MAX_TIERS, in order; the specs are kept in this file's static storage, which
 * ep->tiers points to: one command per process), --tier-disk-write-budget, --tier-admission,
 * --tier-fetch), NULL-terminated. */
extern const struct option kvc_cli_engine_options[];
/* Handle option ch into ep if it is an engine option: 1 handled, 0 not ours, -1 bad value
 * (the one-line error is printed).  --block-size's power of two is the caller's to check. */
int kvc_cli_engine_option(kvc_engine_params_t *ep, const char *cmd, int ch, const char *value);
/* Load a GGUF model, or a llama2.c checkpoint with its tokenizer (tokenizer NULL: the
 * tokenizer.bin beside it).  0, or 1 with the one-line error printed. */
int kvc_cli_load_model(const char *cmd, const char *path, const char *tokenizer, kvc_llm_t **out);

#endif
