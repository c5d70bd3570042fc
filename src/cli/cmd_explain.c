/* cmd_explain.c - `kvcache explain`: one request's path through the prefix
 * cache, block by block.
 *
 * Each prompt goes through the library's own request path, as a server's
 * would: the sequence table (seq) looks its prefix up and pins the hits,
 * reserves the rest (the pool evicts cached blocks through the prefix cache
 * when it is full), completes the prompt (its full blocks are inserted, and a
 * block someone else already cached is swapped for that copy), and releases
 * its table tail-first (or head-first, to show what that order costs), so that
 * the next prompt sees what a server would see.  Beside that path,
 * kvc_prefix_match says why each block did or did not hit, the pool's eviction
 * events say what made room, and the cache's parent links say which cached
 * blocks an eviction left stranded (only naive-lru strands).  Every hit is
 * checked to hold the prompt's exact prefix, whatever the hash (--hash-bits
 * weakens it).  All input is read and checked before anything runs: a bad line
 * gets one error naming it, and no output.
 */
#include "cli.h"
#include "kvcache/kvcache.h"
#include "kvcache/testing.h" /* --hash-bits: a weakened index hash, for demonstration */

#include <cjson/cJSON.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define CMD "explain"

typedef struct {
    kvc_token_t *tokens;
    size_t n_tokens;
    size_t line;
    kvc_namespace_t ns;
    uint32_t priority; /* its JSON line's "priority"; 0 for text lines */
    const char *salt;  /* as given, for printing; NULL when none */
    bool salt_owned;   /* salt is this prompt's copy (from its JSON line) */
} prompt_t;

typedef struct {
    prompt_t *v;
    size_t n, cap;
} prompts_t;

static void free_prompts(prompts_t *p)
{
    for (size_t i = 0; i < p->n; i++) {
        free(p->v[i].tokens);
        if (p->v[i].salt_owned) free((char *)p->v[i].salt);
    }
    free(p->v);
}

/* ---- options ------------------------------------------------------------ */
/* Everything the command line sets.  The cache's policies (the eviction order, a weakened hash
 * for demonstrations) are fields here, parsed in parse_options and applied in open_cache. */
typedef struct {
    uint64_t pool_blocks, block_size, seed;
    const char *salt;   /* --salt, NULL when none */
    kvc_namespace_t ns; /* --salt, --lora, --epoch: every prompt's unless its line says */
    kvc_eviction_t eviction;
    uint64_t hash_bits;          /* --hash-bits; 0: the full 128-bit hash */
    uint64_t kv_bytes_per_token; /* what a block's KV weighs, for the stranded bytes */
    bool head_first;             /* --release head-first */
    bool json;
    const char *path; /* the input */
} opts_t;

/* KV bytes a token by default: Llama-3.1-8B in bf16, 2 (K and V) x 32 layers x 8 KV heads x
 * 128 dims x 2 bytes, as `kvcache plan --model llama-3.1-8b` derives it. */
#define KV_BYTES_PER_TOKEN_DEFAULT 131072
#define KV_BYTES_PER_TOKEN_MAX     (1ull << 30) /* far above any model; keeps products exact */
#define KV_BYTES_PER_TOKEN_MAX_TXT "1073741824"

/* Print `text` from column `indent`, words wrapped before column 80; the first line continues
 * a line already at column `col`. */
static void wrap(FILE *f, const char *text, int col, int indent)
{
    while (*text) {
        size_t n = strcspn(text, " ");
        if (col > indent && col + 1 + (int)n > 80) {
            fprintf(f, "\n%*s", indent, "");
            col = indent;
        } else if (col > indent) {
            fputc(' ', f);
            col++;
        }
        fprintf(f, "%.*s", (int)n, text);
        col += (int)n;
        text += n;
        text += strspn(text, " ");
    }
    fputc('\n', f);
}

/* "lru, lfu, priority, naive-lru": the policies' names, for --help and the error. */
static void policy_names(char *out, size_t cap)
{
    size_t len = 0;
    out[0] = '\0';
    for (const char *const *n = kvc_eviction_names(); *n && len < cap; n++)
        len += (size_t)snprintf(out + len, cap - len, "%s%s", len ? ", " : "", *n);
}

static void help(FILE *f)
{
    fprintf(f,
            "usage: kvcache explain [options] FILE\n"
            "\n"
            "Walks each prompt through the prefix cache as a server would (hash, look up and\n"
            "pin, allocate with eviction, insert, release) and prints, per block, its hash,\n"
            "whether it hit and why, what eviction took to make room, and which cached\n"
            "blocks were left stranded (cached, resident, but unreachable).\n"
            "\n"
            "FILE ('-' for standard input) holds one prompt a line: token ids separated by\n"
            "spaces or commas, or a JSON object {\"tokens\": [...], \"salt\": \"...\",\n"
            "\"lora\": N, \"priority\": N} (all but tokens optional; priority 0..%d, for the\n"
            "priority policy; text lines have priority 0).  Lines starting with '#' are\n"
            "comments.\n"
            "\n"
            "options:\n"
            "  --pool-blocks N   blocks in the pool, 1..16777216 (default 64)\n"
            "  --block-size N    tokens per block, a power of two 1..256 (default 16)\n"
            "  --salt STR        tenant cache salt for every prompt (JSON lines may override)\n"
            "  --lora ID         LoRA adapter id for every prompt (default 0: base model)\n"
            "  --epoch N         weight epoch (default 0)\n"
            "  --seed N          hash seed (default: random per process, as in production)\n"
            "  --eviction POLICY which free cached block goes first when the pool needs one:\n",
            KVC_PREFIX_MAX_PRIORITY);
    for (int i = 0; i < KVC_EVICT__COUNT; i++) {
        fprintf(f, "%*s%-10s ", 20, "", kvc_eviction_name((kvc_eviction_t)i));
        wrap(f, kvc_eviction_summary((kvc_eviction_t)i), 31, 31);
    }
    fprintf(f,
            "  --release ORDER   how a finished request's blocks go back to the free queue:\n"
            "                    tail-first (the default, what the library does: a prefix's\n"
            "                    tail is then evicted before its head) or head-first (table\n"
            "                    order, as a naive server frees them; only then does\n"
            "                    naive-lru find a parent older than its children)\n"
            "  --kv-bytes-per-token N\n"
            "                    KV bytes one token takes, 1..%s, to weigh stranded\n"
            "                    blocks (this pool holds no KV); default %d, Llama-3.1-8B\n"
            "                    in bf16: 2 (K, V) x 32 layers x 8 KV heads x 128 x 2 bytes\n"
            "  --hash-bits N     cut the index hash to its low N bits, 1..64, so that\n"
            "                    unrelated blocks collide (status 'collision'), for\n"
            "                    demonstration: a hit still needs the exact tokens and\n"
            "                    parent (default: all 128 bits)\n"
            "  --json            one JSON object per prompt instead of text\n"
            "  -h, --help        this help\n"
            "\n"
            "Numbers are plain decimal digits (no sign, no spaces).\n",
            KV_BYTES_PER_TOKEN_MAX_TXT, KV_BYTES_PER_TOKEN_DEFAULT);
}

/* 0: parsed; 1: the one-line error is printed; -1: help printed, exit 0. */
static int parse_options(int argc, char **argv, opts_t *o)
{
    static const struct option opts[] = {{"pool-blocks", required_argument, NULL, 'p'},
                                         {"block-size", required_argument, NULL, 'b'},
                                         {"salt", required_argument, NULL, 's'},
                                         {"lora", required_argument, NULL, 'l'},
                                         {"epoch", required_argument, NULL, 'e'},
                                         {"seed", required_argument, NULL, 'S'},
                                         {"eviction", required_argument, NULL, 'E'},
                                         {"release", required_argument, NULL, 'R'},
                                         {"kv-bytes-per-token", required_argument, NULL, 'K'},
                                         {"hash-bits", required_argument, NULL, 'H'},
                                         {"json", no_argument, NULL, 'j'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    *o = (opts_t){.pool_blocks = 64,
                  .block_size = 16,
                  .eviction = KVC_EVICT_LRU,
                  .kv_bytes_per_token = KV_BYTES_PER_TOKEN_DEFAULT};
    int ch;
    optind = 1;
    opterr = 0;
    while ((ch = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (ch) {
        case 'p':
            if (!kvc_cli_parse_u64(optarg, 1, 1u << 24, &o->pool_blocks))
                return kvc_cli_error(CMD, "--pool-blocks: '%s' is not a number in 1..16777216",
                                     optarg);
            break;
        case 'b':
            if (!kvc_cli_parse_u64(optarg, 1, 256, &o->block_size) ||
                (o->block_size & (o->block_size - 1)))
                return kvc_cli_error(CMD, "--block-size: '%s' is not a power of two in 1..256",
                                     optarg);
            break;
        case 's':
            /* the --json output carries it, and JSON text is UTF-8 */
            if (!kvc_cli_utf8_valid(optarg, strlen(optarg)))
                return kvc_cli_error(CMD, "--salt: '%s' is not valid UTF-8", optarg);
            o->salt = optarg;
            if (kvc_namespace_set_salt(&o->ns, optarg))
                return kvc_cli_error(CMD, "--salt: cannot digest the salt (SHA-256 failed)");
            break;
        case 'l':
            if (!kvc_cli_parse_u64(optarg, 0, UINT64_MAX, &o->ns.lora_id))
                return kvc_cli_error(CMD, "--lora: '%s' is not a non-negative integer", optarg);
            break;
        case 'e':
            if (!kvc_cli_parse_u64(optarg, 0, UINT64_MAX, &o->ns.weight_epoch))
                return kvc_cli_error(CMD, "--epoch: '%s' is not a non-negative integer", optarg);
            break;
        case 'S':
            if (!kvc_cli_parse_u64(optarg, 1, UINT64_MAX, &o->seed))
                return kvc_cli_error(CMD, "--seed: '%s' is not a positive integer", optarg);
            break;
        case 'E':
            if (kvc_eviction_parse(optarg, &o->eviction)) {
                char names[256];
                policy_names(names, sizeof names);
                return kvc_cli_error(CMD, "--eviction: '%s' is not a policy (%s)", optarg, names);
            }
            break;
        case 'R':
            if (strcmp(optarg, "tail-first") && strcmp(optarg, "head-first"))
                return kvc_cli_error(
                    CMD, "--release: '%s' is not an order (tail-first, head-first)", optarg);
            o->head_first = !strcmp(optarg, "head-first");
            break;
        case 'K':
            if (!kvc_cli_parse_u64(optarg, 1, KV_BYTES_PER_TOKEN_MAX, &o->kv_bytes_per_token))
                return kvc_cli_error(CMD, "--kv-bytes-per-token: '%s' is not a number in 1..%s",
                                     optarg, KV_BYTES_PER_TOKEN_MAX_TXT);
            break;
        case 'H':
            if (!kvc_cli_parse_u64(optarg, 1, 64, &o->hash_bits))
                return kvc_cli_error(CMD, "--hash-bits: '%s' is not a number in 1..64", optarg);
            break;
        case 'j':
            o->json = true;
            break;
        case 'h':
            help(stdout);
            return -1;
        case ':':
            return kvc_cli_error(CMD, "%s needs a value", argv[optind - 1]);
        default:
            return kvc_cli_error(CMD, "unknown option '%s' (try --help)", argv[optind - 1]);
        }
    }
    if (optind != argc - 1)
        return kvc_cli_error(CMD, optind >= argc ? "no input file (try --help)"
                                                 : "one input file expected (try --help)");
    o->path = argv[optind];
    return 0;
}

/* ---- input ------------------------------------------------------------- */
typedef struct {
    const char *path;
    size_t line;
} where_t;

__attribute__((format(printf, 2, 3))) static int bad(where_t w, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *msg = NULL;
    int n = vasprintf(&msg, fmt, ap);
    va_end(ap);
    kvc_cli_error(CMD, "%s:%zu: %s", w.path, w.line, n >= 0 ? msg : "(no memory for the message)");
    if (n >= 0) free(msg);
    return 1;
}

static const char *const token_max_text = "2147483647";

/* A length for "%.*s". */
static int clip(size_t n)
{
    return n > INT_MAX ? INT_MAX : (int)n;
}

/* Append token id `text` (n bytes: a JSON number, or a text line's word), judged exactly. */
static int push_token(prompt_t *p, size_t *cap, const char *text, size_t n, where_t w)
{
    uint64_t v;
    switch (kvc_cli_parse_json_uint(text, n, INT32_MAX, &v)) {
    case KVC_CLI_NUM_OK:
        break;
    case KVC_CLI_NUM_NOT_INTEGER:
        return bad(w, "token id %.*s is not an integer", clip(n), text);
    case KVC_CLI_NUM_NEGATIVE:
        return bad(w, "token id %.*s is negative", clip(n), text);
    case KVC_CLI_NUM_TOO_LARGE:
        return bad(w, "token id %.*s is too large (max %s)", clip(n), text, token_max_text);
    default:
        return bad(w, "'%.*s' is not a token id", clip(n), text);
    }
    /* A prompt is reserved in one call, of at most UINT32_MAX positions; no pool holds more. */
    if (p->n_tokens == UINT32_MAX) return bad(w, "the prompt has more than %u tokens", UINT32_MAX);
    if (p->n_tokens == *cap) {
        size_t c = *cap ? 2 * *cap : 64;
        kvc_token_t *t = realloc(p->tokens, c * sizeof *t);
        if (!t) return bad(w, "%s", "out of memory");
        p->tokens = t;
        *cap = c;
    }
    p->tokens[p->n_tokens++] = (kvc_token_t)v;
    return 0;
}

/* A text line: token ids (plain decimal digits) separated by spaces, tabs or commas. */
static int parse_text_line(char *s, prompt_t *p, where_t w)
{
    size_t cap = 0;
    for (char *tok = strtok(s, " \t\r\n,"); tok; tok = strtok(NULL, " \t\r\n,")) {
        /* only [-]digits here: "1.5", "1e3" or "+1" are not how a text line writes an id */
        const char *d = tok + (tok[0] == '-');
        if (!*d || strspn(d, "0123456789") != strlen(d))
            return bad(w, "'%s' is not a token id", tok);
        if (push_token(p, &cap, tok, strlen(tok), w)) return 1;
    }
    return 0;
}

/* cJSON keeps a number only as a double and cuts a string at an escaped NUL.  So the line's
 * lexemes are read beside the tree: cJSON builds the tree in document order, and walking it in
 * that order meets its numbers in the order they appear in the text. */
typedef struct {
    const cJSON *item;
    const char *text; /* the number as written */
    size_t len;
} number_t;

typedef struct {
    const char *s;
    size_t n, pos;
    number_t *v;
    size_t n_numbers, cap;
} lexer_t;

/* The end of the string whose opening quote is at s[i] (one past its closing quote). */
static size_t string_end(const char *s, size_t n, size_t i)
{
    for (i++; i < n && s[i] != '"'; i++)
        if (s[i] == '\\') i++; /* an escape: the next character is not the end */
    return i + 1;
}

/* True if a string of the (well-formed) JSON text s[0..n) holds an escaped NUL, which cJSON's
 * strings would silently end at. */
static bool has_escaped_nul(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '"') continue;
        size_t end = string_end(s, n, i);
        for (size_t j = i + 1; j + 5 < end; j++) {
            if (s[j] != '\\') continue;
            if (s[j + 1] == 'u' && !strncmp(s + j + 2, "0000", 4)) return true;
            j++;
        }
        i = end - 1;
    }
    return false;
}

/* Advance to the next number lexeme, skipping strings; false at the end of the text. */
static bool next_number(lexer_t *lx, size_t *start, size_t *len)
{
    const char *s = lx->s;
    while (lx->pos < lx->n) {
        char c = s[lx->pos];
        if (c == '"') {
            lx->pos = string_end(s, lx->n, lx->pos);
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            *start = lx->pos;
            while (lx->pos < lx->n && s[lx->pos] && strchr("0123456789+-.eE", s[lx->pos]))
                lx->pos++;
            *len = lx->pos - *start;
            return true;
        } else
            lx->pos++;
    }
    return false;
}

/* Pair every number of the tree under `item` with its text.  0, or KVC_ENOMEM / KVC_ECORRUPT
 * (the text and the tree disagree: cJSON read the line differently from this lexer). */
static int pair_numbers(const cJSON *item, lexer_t *lx)
{
    for (const cJSON *c = item->child; c; c = c->next) {
        if (cJSON_IsArray(c) || cJSON_IsObject(c)) {
            int rc = pair_numbers(c, lx);
            if (rc) return rc;
            continue;
        }
        if (!cJSON_IsNumber(c)) continue;
        size_t start, len;
        if (!next_number(lx, &start, &len)) return KVC_ECORRUPT;
        if (lx->n_numbers == lx->cap) {
            size_t cap = lx->cap ? 2 * lx->cap : 64;
            number_t *v = realloc(lx->v, cap * sizeof *v);
            if (!v) return KVC_ENOMEM;
            lx->v = v;
            lx->cap = cap;
        }
        lx->v[lx->n_numbers++] = (number_t){.item = c, .text = lx->s + start, .len = len};
    }
    return 0;
}

/* The text of number `item`, searching on from *cursor (numbers are met in order). */
static const number_t *number_text(const lexer_t *lx, size_t *cursor, const cJSON *item)
{
    for (size_t k = 0; k < lx->n_numbers; k++) {
        size_t i = (*cursor + k) % lx->n_numbers;
        if (lx->v[i].item == item) {
            *cursor = i + 1;
            return &lx->v[i];
        }
    }
    return NULL;
}

static int parse_tokens(const cJSON *toks, const lexer_t *lx, prompt_t *p, where_t w)
{
    size_t cap = 0, cursor = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, toks)
    {
        if (!cJSON_IsNumber(t)) return bad(w, "%s", "a token in \"tokens\" is not a number");
        const number_t *num = number_text(lx, &cursor, t);
        if (!num) return bad(w, "%s", "internal: a number's text was not found");
        if (push_token(p, &cap, num->text, num->len, w)) return 1;
    }
    return 0;
}

/* The whole number under `key` in [0, max], read exactly from its text. */
static int parse_uint_key(const char *key, const cJSON *item, const lexer_t *lx, uint64_t max,
                          uint64_t *out, where_t w)
{
    size_t cursor = 0;
    const number_t *num = cJSON_IsNumber(item) ? number_text(lx, &cursor, item) : NULL;
    if (cJSON_IsNumber(item) && !num)
        return bad(w, "%s", "internal: a number's text was not found");
    kvc_cli_num_t r =
        num ? kvc_cli_parse_json_uint(num->text, num->len, max, out) : KVC_CLI_NUM_MALFORMED;
    if (r == KVC_CLI_NUM_TOO_LARGE)
        return bad(w, "\"%s\" %.*s is too large (max %" PRIu64 ")", key, clip(num->len), num->text,
                   max);
    if (r != KVC_CLI_NUM_OK) return bad(w, "\"%s\" is not a non-negative integer", key);
    return 0;
}

static int parse_lora(const cJSON *lora, const lexer_t *lx, prompt_t *p, where_t w)
{
    return parse_uint_key("lora", lora, lx, UINT64_MAX, &p->ns.lora_id, w);
}

static int parse_priority(const cJSON *prio, const lexer_t *lx, prompt_t *p, where_t w)
{
    uint64_t v;
    if (parse_uint_key("priority", prio, lx, KVC_PREFIX_MAX_PRIORITY, &v, w)) return 1;
    p->priority = (uint32_t)v;
    return 0;
}

static int parse_salt(const cJSON *salt, prompt_t *p, where_t w)
{
    if (!cJSON_IsString(salt)) return bad(w, "%s", "\"salt\" is not a string");
    char *copy = strdup(salt->valuestring);
    if (!copy) return bad(w, "%s", "out of memory");
    if (p->salt_owned) free((char *)p->salt);
    p->salt = copy;
    p->salt_owned = true;
    if (kvc_namespace_set_salt(&p->ns, copy))
        return bad(w, "%s", "cannot digest the salt (SHA-256 failed)");
    return 0;
}

/* The object's keys: each known one at most once, no other. */
static int check_keys(const cJSON *obj, where_t w)
{
    static const char *const keys[] = {"tokens", "salt", "lora", "priority"};
    unsigned seen = 0;
    for (const cJSON *c = obj->child; c; c = c->next) {
        size_t k = 0;
        while (k < KVC_ARRAY_LEN(keys) && strcmp(c->string, keys[k])) k++;
        if (k == KVC_ARRAY_LEN(keys))
            return bad(w, "unknown key \"%s\" (the keys are tokens, salt, lora and priority)",
                       c->string);
        if (seen & (1u << k)) return bad(w, "\"%s\" is given twice", keys[k]);
        seen |= 1u << k;
    }
    return 0;
}

static int parse_json_line(const char *s, size_t n, prompt_t *p, where_t w)
{
    /* JSON text is UTF-8, and what it gives (the salt) is printed in JSON again */
    if (!kvc_cli_utf8_valid(s, n)) return bad(w, "%s", "not valid UTF-8");
    const char *end = NULL;
    cJSON *obj = cJSON_ParseWithLengthOpts(s, n, &end, false);
    if (!obj || !cJSON_IsObject(obj)) {
        cJSON_Delete(obj);
        return bad(w, "%s", "not a JSON object");
    }
    lexer_t lx = {.s = s, .n = n};
    int rc = 0, err;
    const cJSON *toks = cJSON_GetObjectItemCaseSensitive(obj, "tokens");
    const cJSON *salt = cJSON_GetObjectItemCaseSensitive(obj, "salt");
    const cJSON *lora = cJSON_GetObjectItemCaseSensitive(obj, "lora");
    const cJSON *prio = cJSON_GetObjectItemCaseSensitive(obj, "priority");
    end += strspn(end, " \t\r\n");
    size_t rest = (size_t)(s + n - end); /* what follows the object, but its line end */
    while (rest && (end[rest - 1] == '\n' || end[rest - 1] == '\r')) rest--;
    if (rest)
        rc = bad(w, "text after the JSON object: '%.*s'", clip(rest), end);
    else if (has_escaped_nul(s, n))
        rc = bad(w, "%s", "a string holds U+0000 (NUL)");
    else if ((err = pair_numbers(obj, &lx)))
        rc =
            bad(w, "%s", err == KVC_ENOMEM ? "out of memory" : "internal: cannot read the numbers");
    else if (!cJSON_IsArray(toks))
        rc = bad(w, "%s", "no \"tokens\" array");
    else if (check_keys(obj, w))
        rc = 1;
    else
        rc = parse_tokens(toks, &lx, p, w) || (salt && parse_salt(salt, p, w)) ||
             (lora && parse_lora(lora, &lx, p, w)) || (prio && parse_priority(prio, &lx, p, w));
    free(lx.v);
    cJSON_Delete(obj);
    return rc;
}

static int read_prompts(const opts_t *o, prompts_t *out)
{
    const char *path = o->path;
    FILE *f = strcmp(path, "-") ? fopen(path, "r") : stdin;
    if (!f) return kvc_cli_error(CMD, "cannot open %s: %s", path, strerror(errno));
    char *line = NULL;
    size_t line_cap = 0, lineno = 0;
    ssize_t len;
    int rc = 0;
    while ((len = getline(&line, &line_cap, f)) >= 0) {
        where_t w = {path, ++lineno};
        const char *nul = memchr(line, '\0', (size_t)len);
        if (nul) {
            rc = bad(w, "a NUL byte at column %zu", (size_t)(nul - line) + 1);
            break;
        }
        char *s = line;
        while (*s == ' ' || *s == '\t') s++;
        if (*s == '#') continue; /* a comment */
        if (out->n == out->cap) {
            size_t cap = out->cap ? 2 * out->cap : 16;
            prompt_t *v = realloc(out->v, cap * sizeof *v);
            if (!v) {
                rc = bad(w, "%s", "out of memory");
                break;
            }
            out->v = v;
            out->cap = cap;
        }
        prompt_t *p = &out->v[out->n++];
        *p = (prompt_t){.line = lineno, .ns = o->ns, .salt = o->salt};
        rc = *s == '{' ? parse_json_line(s, (size_t)(line + len - s), p, w)
                       : parse_text_line(s, p, w);
        if (rc) break;
        if (p->n_tokens == 0) {
            rc = bad(w, "%s", "empty prompt");
            break;
        }
    }
    if (!rc && ferror(f)) rc = kvc_cli_error(CMD, "cannot read %s: %s", path, strerror(errno));
    if (!rc && out->n == 0) rc = kvc_cli_error(CMD, "%s: no prompts", path);
    free(line);
    if (f != stdin) fclose(f);
    return rc;
}

/* ---- the cache ---------------------------------------------------------- */
typedef struct {
    kvc_hash128_t hash;
    uint32_t block;
    uint32_t n_stranded; /* cached blocks its eviction made unreachable (naive-lru) */
    bool was_stranded;   /* it was unreachable itself when it went */
} evicted_t;

typedef struct {
    evicted_t *v;
    size_t n, cap;
    bool recording;
    bool lost; /* an event could not be recorded (no memory) */
} events_t;

/* A cached block that became unreachable during one prompt. */
typedef struct {
    kvc_hash128_t hash;
    uint32_t block;
    uint32_t parent;     /* the block it was inserted under (evicted, or stranded itself) */
    bool parent_evicted; /* its own parent went; else it is below a stranded block */
    uint32_t top, depth; /* for printing each chain top-down: the block whose parent went
                            and how far below it this one is */
} stranded_t;

typedef struct {
    kvc_pool_t *pool;
    kvc_prefix_t *pc; /* the pool's evictor */
    kvc_seqs_t *seqs; /* one request at a time, through the library's path */
    events_t events;
    uint32_t bs, n_blocks;
    kvc_eviction_t eviction;
    uint32_t hash_bits; /* 0: the full hash */
    uint64_t kv_bytes_per_token;
    bool head_first;
    bool json;
    /* Stranding, as the user sees it.  The cache counts stranded blocks; which ones they are,
     * and why, is read from the stored events (each block's parent when it was inserted) and
     * the cache's parent links (a stranded block has none). */
    uint32_t *parent;            /* (n_blocks) the parent named by the block's last STORED event */
    uint8_t *stranded;           /* (n_blocks) unreachable at the last count */
    uint8_t *memo;               /* (n_blocks) scratch for the count */
    uint32_t n_stranded_last;    /* unreachable blocks at the last count */
    uint64_t strandings_counted; /* the cache's n_strandings at the last count */
    uint64_t strandings_last;    /* ... at the last eviction or count */
    /* kvc_prefix_match counts the collisions it meets, as the lookup does: explain's own match
     * calls (the explanation beside the request path) are taken off the totals */
    uint64_t match_collisions;
} cache_t;

/* Whether cached block b is unreachable: it or a block above it lost its parent.  A block
 * the events say was a root is reachable from itself; any other block whose parent link the
 * cache dropped was stranded.  memo (may be NULL) remembers the answers: 1 no, 2 yes. */
static bool unreachable(const cache_t *c, uint32_t b, uint8_t *memo)
{
    uint32_t x = b;
    uint8_t answer = 0;
    for (uint32_t depth = 0; !answer; depth++) {
        if (memo && memo[x]) {
            answer = memo[x];
        } else if (c->parent[x] == KVC_NONE) {
            answer = 1; /* a root */
        } else {
            uint32_t p = kvc_prefix_block_parent(c->pc, x);
            if (p == KVC_NONE || depth == c->n_blocks) answer = 2; /* (no cycle exists) */
            x = p;
        }
    }
    if (memo) /* the path again, now that its answer is known */
        for (x = b; !memo[x]; x = kvc_prefix_block_parent(c->pc, x)) {
            memo[x] = answer;
            if (c->parent[x] == KVC_NONE || kvc_prefix_block_parent(c->pc, x) == KVC_NONE) break;
        }
    return answer == 2;
}

static void on_event(void *ctx, const kvc_prefix_event_t *ev)
{
    cache_t *c = ctx;
    if (ev->block >= c->n_blocks) return;
    if (ev->type == KVC_EVENT_STORED) {
        c->parent[ev->block] = ev->parent_block;
        c->stranded[ev->block] = 0;
        return;
    }
    /* removed: the cache has already stranded what its eviction strands (naive-lru), and the
     * block is still cached while it tells */
    kvc_prefix_stats_t st;
    kvc_prefix_stats(c->pc, &st);
    evicted_t e = {.block = ev->block,
                   .hash = ev->hash,
                   .n_stranded = (uint32_t)(st.n_strandings - c->strandings_last),
                   .was_stranded = st.n_stranded_blocks && unreachable(c, ev->block, NULL)};
    c->strandings_last = st.n_strandings;
    c->stranded[ev->block] = 0;
    events_t *q = &c->events;
    if (!q->recording) return;
    if (q->n == q->cap) {
        size_t cap = q->cap ? 2 * q->cap : 16;
        evicted_t *v = realloc(q->v, cap * sizeof *v);
        if (!v) {
            q->lost = true;
            return;
        }
        q->v = v;
        q->cap = cap;
    }
    q->v[q->n++] = e;
}

static void close_cache(cache_t *c)
{
    kvc_seqs_destroy(c->seqs);
    kvc_prefix_destroy(c->pc);
    kvc_pool_destroy(c->pool);
    free(c->events.v);
    free(c->parent);
    free(c->stranded);
    free(c->memo);
}

/* Build the pool, its prefix cache and the sequence table from the options: every parameter
 * the cache takes is set here.  0, or 1 with the one-line error printed. */
static int open_cache(const opts_t *o, cache_t *c)
{
    *c = (cache_t){.json = o->json,
                   .eviction = o->eviction,
                   .hash_bits = (uint32_t)o->hash_bits,
                   .kv_bytes_per_token = o->kv_bytes_per_token,
                   .head_first = o->head_first,
                   .n_blocks = (uint32_t)o->pool_blocks};
    /* zeroed pages cost nothing until a block is cached: a huge pool stays cheap */
    c->parent = calloc(c->n_blocks, sizeof *c->parent);
    c->stranded = calloc(c->n_blocks, 1);
    c->memo = calloc(c->n_blocks, 1);
    if (!c->parent || !c->stranded || !c->memo) {
        close_cache(c);
        return kvc_cli_error(CMD, "out of memory");
    }
    kvc_pool_params_t pp = kvc_pool_params_default();
    pp.n_blocks = c->n_blocks;
    pp.block_size = (uint32_t)o->block_size;
    kvc_prefix_params_t cp = kvc_prefix_params_default();
    cp.hash_seed = o->seed;
    cp.eviction = o->eviction;
    cp.on_event = on_event;
    cp.event_ctx = c;
    kvc_seqs_params_t sp = kvc_seqs_params_default();
    sp.max_seqs = 1;
    const char *what = "the pool";
    int rc = kvc_pool_create(&pp, &c->pool);
    if (!rc) what = "the prefix cache", rc = kvc_prefix_create(c->pool, &cp, &c->pc);
    if (!rc && o->hash_bits) /* before anything is cached, as the hook requires */
        what = "the weakened hash", rc = kvc_testing_prefix_set_hash_bits(c->pc, c->hash_bits);
    if (!rc) what = "the sequence table", rc = kvc_seqs_create(c->pool, c->pc, &sp, &c->seqs);
    if (rc) {
        close_cache(c);
        return kvc_cli_error(CMD, "cannot create %s: %s", what, kvc_strerror(rc));
    }
    c->bs = pp.block_size;
    return 0;
}

/* KV bytes of n blocks (exact: blocks < 2^25, tokens a block <= 2^8, bytes a token <= 2^30). */
static uint64_t kv_bytes(const cache_t *c, uint64_t n_blocks)
{
    return n_blocks * c->bs * c->kv_bytes_per_token;
}

/* "0 bytes", "1048576 bytes = 1.0 MiB". */
static const char *fmt_bytes(uint64_t n, char out[64])
{
    static const char *const unit[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    int u = -1;
    double v = (double)n;
    while (v >= 1024 && u < 5) v /= 1024, u++;
    if (u < 0)
        snprintf(out, 64, "%" PRIu64 " bytes", n);
    else
        snprintf(out, 64, "%" PRIu64 " bytes = %.1f %s", n, v, unit[u]);
    return out;
}

/* ---- one prompt --------------------------------------------------------- */
/* What happened to one prompt, for printing. */
typedef struct {
    size_t n_full, n_all;       /* full blocks; all blocks, the partial one included */
    kvc_hash128_t *hashes;      /* (n_full + 1) */
    kvc_block_status_t *status; /* (n_all) why each block hit or not */
    kvc_prefix_hit_t hit;
    uint32_t need;         /* blocks its reservation takes from the pool */
    uint32_t free_before;  /* free blocks just before it */
    int run_err;           /* 0: it ran; KVC_ENOSPC / KVC_EBUSY: the pool could not hold it */
    uint32_t *table;       /* (n_all) its block table after completion, when it ran */
    uint32_t *origin;      /* (n_all) the block a duplicate was computed in, else KVC_NONE */
    kvc_pool_stats_t pool; /* after its table went back */
    uint32_t *copy;        /* (n_all) or NULL: a stranded block that holds block i, or KVC_NONE */
    stranded_t *stranded;  /* (n_stranded) blocks it left unreachable, chain by chain */
    size_t n_stranded;
    uint32_t stranded_before, stranded_after; /* unreachable blocks before it and after it */
} outcome_t;

static void free_outcome(outcome_t *o)
{
    free(o->hashes);
    free(o->status);
    free(o->table);
    free(o->origin);
    free(o->copy);
    free(o->stranded);
}

static int fail(const prompt_t *p, const char *what, int err)
{
    return kvc_cli_error(CMD, "line %zu: %s failed: %s", p->line, what, kvc_strerror(err));
}

typedef struct {
    kvc_hash128_t hash;
    uint32_t block;
} keyed_t;

static int by_hash(const void *a, const void *b)
{
    const kvc_hash128_t *x = &((const keyed_t *)a)->hash, *y = &((const keyed_t *)b)->hash;
    if (x->hi != y->hi) return x->hi < y->hi ? -1 : 1;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Which of the prompt's blocks a stranded block holds: the cache has their KV, but no lookup
 * reaches it.  Under the full hash, an equal chained hash is the same prefix; under a weakened
 * one it proves nothing, so nothing is claimed. */
static int find_copies(const cache_t *c, outcome_t *o)
{
    if (c->n_stranded_last == 0 || c->hash_bits || o->n_full == 0) return 0;
    keyed_t *v = malloc(c->n_stranded_last * sizeof *v);
    o->copy = malloc(o->n_all * sizeof *o->copy);
    if (!v || !o->copy) {
        free(v);
        return kvc_cli_error(CMD, "out of memory");
    }
    size_t k = 0;
    for (uint32_t b = 0; b < c->n_blocks && k < c->n_stranded_last; b++)
        if (c->stranded[b] && kvc_prefix_block_hash(c->pc, b, &v[k].hash) == 0) v[k++].block = b;
    if (k > 1) qsort(v, k, sizeof *v, by_hash);
    for (size_t i = 0; i < o->n_all; i++) {
        keyed_t key = {.hash = i < o->n_full ? o->hashes[i] : (kvc_hash128_t){0}};
        const keyed_t *hit = i < o->n_full && k ? bsearch(&key, v, k, sizeof *v, by_hash) : NULL;
        o->copy[i] = hit && o->status[i] != KVC_BLOCK_HIT ? hit->block : KVC_NONE;
    }
    free(v);
    return 0;
}

/* Each block's hash and why it does or does not hit, before anything is pinned. */
static int classify(cache_t *c, const prompt_t *p, outcome_t *o)
{
    o->n_full = p->n_tokens / c->bs;
    o->n_all = (p->n_tokens + c->bs - 1) / c->bs;
    o->hashes = calloc(o->n_full + 1, sizeof *o->hashes);
    o->status = calloc(o->n_all, sizeof *o->status);
    o->table = calloc(o->n_all, sizeof *o->table);
    o->origin = calloc(o->n_all, sizeof *o->origin);
    if (!o->hashes || !o->status || !o->table || !o->origin)
        return kvc_cli_error(CMD, "out of memory");
    kvc_prefix_query_t q = {
        .ns = &p->ns, .tokens = p->tokens, .n_tokens = p->n_tokens, .priority = p->priority};
    size_t n_hashed;
    int err = kvc_prefix_hash(c->pc, &q, o->hashes, o->n_full, &n_hashed);
    if (err) return fail(p, "hashing", err);
    q.hashes = o->hashes;
    kvc_prefix_stats_t before, after;
    kvc_prefix_stats(c->pc, &before);
    if ((err = kvc_prefix_match(c->pc, &q, NULL, 0, o->status, &o->hit)))
        return fail(p, "matching", err);
    kvc_prefix_stats(c->pc, &after);
    c->match_collisions += after.n_collisions - before.n_collisions;
    return find_copies(c, o);
}

/* Copy the sequence's block table (which must cover all n_all blocks) into out. */
static int copy_table(cache_t *c, kvc_seq_t h, const prompt_t *p, size_t n_all, uint32_t *out)
{
    const uint32_t *t;
    uint32_t n;
    int err = kvc_seq_table(c->seqs, h, 0, &t, &n);
    if (err) return fail(p, "reading the block table", err);
    if (n != n_all)
        return kvc_cli_error(CMD, "line %zu: internal: the table holds %u blocks, not %zu", p->line,
                             n, n_all);
    memcpy(out, t, n * sizeof *t);
    return 0;
}

/* Every hit holds exactly this prompt's prefix: the block's tokens are the prompt's, and its
 * parent is the block hit one step before (or it is a root).  The cache promises it whatever
 * the hash does (--hash-bits weakens it); explain checks it, hit by hit. */
static int verify_hits(const cache_t *c, const prompt_t *p, const outcome_t *o)
{
    for (size_t i = 0; i < o->hit.n_hit_blocks; i++) {
        const kvc_token_t *t = kvc_prefix_block_tokens(c->pc, o->table[i]);
        uint32_t parent = i ? o->table[i - 1] : KVC_NONE;
        if (!t || memcmp(t, p->tokens + i * c->bs, c->bs * sizeof *t) ||
            kvc_prefix_block_parent(c->pc, o->table[i]) != parent)
            return kvc_cli_error(CMD,
                                 "line %zu: internal: block %zu hit #%u, which does not hold "
                                 "this prompt's prefix (wrong KV)",
                                 p->line, i, o->table[i]);
    }
    return 0;
}

/* Finish the request: its blocks go back tail-first (the library's order), or head-first
 * (--release head-first: the blocks are held one reference longer, the sequence is destroyed,
 * and the references are dropped in table order). */
static int release(cache_t *c, kvc_seq_t h, const prompt_t *p)
{
    uint32_t *held = NULL, n = 0;
    int err = 0;
    if (c->head_first) {
        const uint32_t *t;
        if ((err = kvc_seq_table(c->seqs, h, 0, &t, &n))) {
            (void)kvc_seq_destroy(c->seqs, h);
            return fail(p, "reading the block table", err);
        }
        held = malloc((n ? n : 1) * sizeof *held);
        if (!held) {
            (void)kvc_seq_destroy(c->seqs, h);
            return kvc_cli_error(CMD, "out of memory");
        }
        for (uint32_t i = 0; i < n && !err; i++) {
            held[i] = t[i];
            if (t[i] != KVC_NONE && (err = kvc_pool_ref(c->pool, t[i])))
                for (uint32_t j = i; j-- > 0;)
                    if (held[j] != KVC_NONE) (void)kvc_pool_unref(c->pool, held[j]);
        }
        if (err) {
            free(held);
            (void)kvc_seq_destroy(c->seqs, h);
            return fail(p, "holding the blocks for a head-first release", err);
        }
    }
    int rc = 0;
    if ((err = kvc_seq_destroy(c->seqs, h))) rc = fail(p, "release", err);
    for (uint32_t i = 0; i < n; i++) /* the blocks stay ours even if destroy failed */
        if (held[i] != KVC_NONE && (err = kvc_pool_unref(c->pool, held[i])) && !rc)
            rc = fail(p, "the head-first release", err);
    free(held);
    return rc;
}

/* The request's path: look up and pin, reserve the rest (recording what eviction takes),
 * complete it (inserting its full blocks), release it. */
static int walk_request(cache_t *c, const prompt_t *p, outcome_t *o)
{
    kvc_seq_desc_t d = {
        .prompt = p->tokens, .n_prompt = p->n_tokens, .ns = &p->ns, .priority = p->priority};
    kvc_seq_t h;
    int err = kvc_seq_create(c->seqs, &d, &h);
    if (err) return fail(p, "registering the request", err);
    int rc = 1;
    size_t n_hit;
    if ((err = kvc_seq_lookup(c->seqs, h, &n_hit))) {
        fail(p, "lookup", err);
        goto out;
    }
    if (n_hit != o->hit.n_hit_tokens) {
        kvc_cli_error(CMD, "line %zu: internal: the lookup hit %zu tokens, the match %zu", p->line,
                      n_hit, o->hit.n_hit_tokens);
        goto out;
    }
    uint32_t n_rest = (uint32_t)(p->n_tokens - n_hit); /* >= 1: the last token is computed */
    if ((err = kvc_seq_blocks_needed(c->seqs, h, n_rest, &o->need))) {
        fail(p, "sizing the reservation", err);
        goto out;
    }
    o->free_before = kvc_pool_n_free(c->pool);
    c->events.n = 0;
    c->events.recording = true;
    err = kvc_seq_reserve(c->seqs, h, n_rest, NULL);
    c->events.recording = false;
    if (c->events.lost) {
        kvc_cli_error(CMD, "out of memory");
        goto out;
    }
    o->run_err = err == KVC_ENOSPC || err == KVC_EBUSY ? err : 0; /* an outcome, not an error */
    if (err && !o->run_err) {
        fail(p, "reservation", err);
        goto out;
    }
    if (!o->run_err) {
        for (size_t i = 0; i < o->n_all; i++) o->origin[i] = KVC_NONE;
        if (copy_table(c, h, p, o->n_all, o->origin)) goto out; /* the blocks it computed in */
        if ((err = kvc_seq_complete(c->seqs, h, n_rest))) {
            fail(p, "completion", err);
            goto out;
        }
        if (copy_table(c, h, p, o->n_all, o->table)) goto out;
        for (size_t i = 0; i < o->n_all; i++)
            if (o->origin[i] == o->table[i]) o->origin[i] = KVC_NONE; /* not swapped */
        if (verify_hits(c, p, o)) goto out;
    }
    rc = 0;
out:
    if (release(c, h, p)) rc = 1;
    kvc_pool_stats(c->pool, &o->pool);
    return rc;
}

static int by_chain(const void *a, const void *b)
{
    const stranded_t *x = a, *y = b;
    if (x->top != y->top) return x->top < y->top ? -1 : 1;
    return x->depth < y->depth ? -1 : x->depth > y->depth;
}

/* After the prompt: which cached blocks are unreachable now, and which of them became so
 * during it.  Counted again only when the cache's own counts moved (only naive-lru moves
 * them), and checked against them. */
static int count_stranded(cache_t *c, const prompt_t *p, outcome_t *o)
{
    kvc_prefix_stats_t st;
    kvc_prefix_stats(c->pc, &st);
    o->stranded_before = c->n_stranded_last;
    o->stranded_after = st.n_stranded_blocks;
    c->strandings_last = st.n_strandings;
    if (st.n_stranded_blocks == c->n_stranded_last && st.n_strandings == c->strandings_counted)
        return 0; /* no block was stranded, none went: the same blocks as before */
    c->strandings_counted = st.n_strandings;
    memset(c->memo, 0, c->n_blocks);
    uint32_t n = 0;
    size_t cap = 0;
    for (uint32_t b = 0; b < c->n_blocks; b++) {
        kvc_hash128_t hash;
        bool u = kvc_prefix_block_hash(c->pc, b, &hash) == 0 && unreachable(c, b, c->memo);
        n += u;
        if (u && !c->stranded[b]) {
            if (o->n_stranded == cap) {
                cap = cap ? 2 * cap : 8;
                stranded_t *v = realloc(o->stranded, cap * sizeof *v);
                if (!v) return kvc_cli_error(CMD, "out of memory");
                o->stranded = v;
            }
            o->stranded[o->n_stranded++] =
                (stranded_t){.block = b,
                             .hash = hash,
                             .parent = c->parent[b],
                             .parent_evicted = kvc_prefix_block_parent(c->pc, b) == KVC_NONE};
        }
        c->stranded[b] = u;
    }
    c->n_stranded_last = n;
    /* top-down: each newly stranded chain from the block whose parent went */
    memset(c->memo, 0, c->n_blocks);
    for (size_t i = 0; i < o->n_stranded; i++) c->memo[o->stranded[i].block] = 1;
    for (size_t i = 0; i < o->n_stranded; i++) {
        stranded_t *s = &o->stranded[i];
        uint32_t x = s->block, up;
        s->depth = 0;
        while ((up = kvc_prefix_block_parent(c->pc, x)) != KVC_NONE && c->memo[up] &&
               s->depth < o->n_stranded)
            x = up, s->depth++;
        s->top = x;
    }
    if (o->n_stranded > 1) /* (qsort takes no NULL, even for 0 items) */
        qsort(o->stranded, o->n_stranded, sizeof *o->stranded, by_chain);
    if (n != st.n_stranded_blocks)
        return kvc_cli_error(CMD,
                             "line %zu: internal: %u cached blocks are unreachable, the cache "
                             "counts %u",
                             p->line, n, st.n_stranded_blocks);
    return 0;
}

static const char *note_for(kvc_block_status_t s)
{
    switch (s) {
    case KVC_BLOCK_HIT:
        return "cached: reused, not computed";
    case KVC_BLOCK_MISS:
        return "no cached block has this hash";
    case KVC_BLOCK_COLLISION:
        return "hash found, but its tokens or parent differ (a collision)";
    case KVC_BLOCK_AFTER_MISS:
        return "an earlier block missed, so this one cannot hit";
    case KVC_BLOCK_LAST_TOKEN:
        return "cached, but the last prompt token must be computed for logits";
    case KVC_BLOCK_PARTIAL:
        return "partial block: only full blocks are cached";
    case KVC_BLOCK_OUT_OF_WINDOW:
        return "before the sliding window: not needed";
    }
    return "?";
}

/* Why the policy took this block: what it evicts first. */
static const char *eviction_why(kvc_eviction_t p)
{
    switch (p) {
    case KVC_EVICT_LRU:
        return "least recently used cached block with no cached children";
    case KVC_EVICT_LFU:
        return "fewest uses among cached blocks with no cached children (least recently used "
               "first among equals)";
    case KVC_EVICT_PRIORITY:
        return "lowest priority among cached blocks with no cached children (least recently "
               "used first within it)";
    case KVC_EVICT_NAIVE_LRU:
        return "least recently used cached block, cached children or not";
    case KVC_EVICT__COUNT:
        break;
    }
    return kvc_eviction_summary(p); /* a policy added without a line here */
}

/* The cache's totals so far; collisions as the request path counted them. */
static void totals(const cache_t *c, kvc_prefix_stats_t *st)
{
    kvc_prefix_stats(c->pc, st);
    st->n_collisions -= c->match_collisions;
}

static int print_json(const cache_t *c, size_t index, const prompt_t *p, const outcome_t *o)
{
    const bool ran = o->run_err == 0;
    const uint32_t bs = c->bs;
    bool ok = true; /* every member was added (cJSON returns NULL when it has no memory) */
#define ADD(call)        (ok = (call) != NULL && ok)
#define NUM(obj, key, v) ADD(cJSON_AddNumberToObject(obj, key, (double)(v)))
    cJSON *obj = cJSON_CreateObject();
    if (!obj) return kvc_cli_error(CMD, "out of memory");
    char lora[24];
    snprintf(lora, sizeof lora, "%" PRIu64, p->ns.lora_id); /* exact: a double is not */
    NUM(obj, "prompt", index + 1);
    NUM(obj, "line", p->line);
    NUM(obj, "n_tokens", p->n_tokens);
    NUM(obj, "block_size", bs);
    ADD(cJSON_AddStringToObject(obj, "salt", p->salt ? p->salt : ""));
    ADD(cJSON_AddRawToObject(obj, "lora", lora));
    NUM(obj, "priority", p->priority);
    cJSON *blocks = cJSON_AddArrayToObject(obj, "blocks");
    ADD(blocks);
    for (size_t i = 0; ok && i < o->n_all; i++) {
        cJSON *b = cJSON_CreateObject();
        if (!b || !cJSON_AddItemToArray(blocks, b)) {
            cJSON_Delete(b);
            ok = false;
            break;
        }
        char hex[33] = "";
        if (i < o->n_full) kvc_hash128_hex(o->hashes[i], hex);
        NUM(b, "index", i);
        NUM(b, "first_token", i * bs);
        NUM(b, "last_token", KVC_MIN((i + 1) * bs, p->n_tokens) - 1);
        ADD(i < o->n_full ? cJSON_AddStringToObject(b, "hash", hex)
                          : cJSON_AddNullToObject(b, "hash"));
        ADD(cJSON_AddStringToObject(b, "status", kvc_block_status_name(o->status[i])));
        ADD(cJSON_AddStringToObject(b, "why", note_for(o->status[i])));
        ADD(ran ? cJSON_AddNumberToObject(b, "block", o->table[i])
                : cJSON_AddNullToObject(b, "block"));
        if (ran && o->origin[i] != KVC_NONE) NUM(b, "recomputed_in", o->origin[i]);
        if (o->copy && o->copy[i] != KVC_NONE) NUM(b, "stranded_copy", o->copy[i]);
    }
    ADD(cJSON_AddBoolToObject(obj, "cut_by_last_token", o->hit.cut_by_last_token));
    NUM(obj, "hit_blocks", o->hit.n_hit_blocks);
    NUM(obj, "hit_tokens", o->hit.n_hit_tokens);
    NUM(obj, "computed_tokens", ran ? p->n_tokens - o->hit.n_hit_tokens : 0);
    NUM(obj, "allocated_blocks", ran ? o->need : 0);
    cJSON *ev = cJSON_AddArrayToObject(obj, "evicted");
    ADD(ev);
    for (size_t i = 0; ok && i < c->events.n; i++) {
        const evicted_t *x = &c->events.v[i];
        char hex[33];
        kvc_hash128_hex(x->hash, hex);
        cJSON *e = cJSON_CreateObject();
        if (!e || !cJSON_AddItemToArray(ev, e)) {
            cJSON_Delete(e);
            ok = false;
            break;
        }
        NUM(e, "block", x->block);
        ADD(cJSON_AddStringToObject(e, "hash", hex));
        if (x->n_stranded) NUM(e, "stranded_children", x->n_stranded);
        if (x->was_stranded) ADD(cJSON_AddBoolToObject(e, "stranded", true));
    }
    cJSON *sa = cJSON_AddArrayToObject(obj, "stranded");
    ADD(sa);
    for (size_t i = 0; ok && i < o->n_stranded; i++) {
        const stranded_t *x = &o->stranded[i];
        char hex[33];
        kvc_hash128_hex(x->hash, hex);
        cJSON *e = cJSON_CreateObject();
        if (!e || !cJSON_AddItemToArray(sa, e)) {
            cJSON_Delete(e);
            ok = false;
            break;
        }
        NUM(e, "block", x->block);
        ADD(cJSON_AddStringToObject(e, "hash", hex));
        NUM(e, "parent", x->parent);
        ADD(cJSON_AddBoolToObject(e, "parent_evicted", x->parent_evicted));
    }
    ADD(ran ? cJSON_AddNullToObject(obj, "error")
            : cJSON_AddStringToObject(obj, "error", kvc_strerror(o->run_err)));
    NUM(obj, "pool_free", o->pool.n_free);
    NUM(obj, "pool_free_cached", o->pool.n_free_cached);
    /* the cache's totals after this prompt: the last line's are the run's */
    kvc_prefix_stats_t st;
    totals(c, &st);
    cJSON *t = cJSON_AddObjectToObject(obj, "totals");
    ADD(t);
    if (t) {
        NUM(t, "lookups", st.n_lookups);
        NUM(t, "query_tokens", st.n_query_tokens);
        NUM(t, "hit_tokens", st.n_hit_tokens);
        NUM(t, "inserted", st.n_inserts);
        NUM(t, "evicted", st.n_evictions);
        NUM(t, "cached_blocks", st.n_cached_blocks);
        NUM(t, "collisions", st.n_collisions);
        NUM(t, "stranded_blocks", st.n_stranded_blocks);
        char bytes[24]; /* exact: a double is not, past 2^53 */
        snprintf(bytes, sizeof bytes, "%" PRIu64, kv_bytes(c, st.n_stranded_blocks));
        ADD(cJSON_AddRawToObject(t, "stranded_bytes", bytes));
        NUM(t, "strandings", st.n_strandings);
    }
#undef NUM
#undef ADD
    char *s = ok ? cJSON_PrintUnformatted(obj) : NULL;
    cJSON_Delete(obj);
    if (!s) return kvc_cli_error(CMD, "out of memory");
    puts(s);
    free(s);
    return 0;
}

static void print_evictions_text(const cache_t *c)
{
    for (size_t i = 0; i < c->events.n; i++) {
        const evicted_t *e = &c->events.v[i];
        char hex[33];
        kvc_hash128_hex(e->hash, hex);
        printf("  evicted #%u (hash %s): %s", e->block, hex, eviction_why(c->eviction));
        if (e->was_stranded) printf(" (itself stranded: no lookup could reach it)");
        if (e->n_stranded)
            printf("; it had cached children: %u block%s stranded", e->n_stranded,
                   e->n_stranded == 1 ? "" : "s");
        putchar('\n');
    }
}

static void print_stranded_text(const cache_t *c, const outcome_t *o)
{
    for (size_t i = 0; i < o->n_stranded; i++) {
        const stranded_t *s = &o->stranded[i];
        char hex[33];
        kvc_hash128_hex(s->hash, hex);
        printf("  stranded #%u (hash %s): cached, resident, unreachable: ", s->block, hex);
        if (s->parent_evicted)
            printf("its parent #%u was evicted\n", s->parent);
        else
            printf("below #%u, which is stranded\n", s->parent);
    }
    if (o->stranded_after != o->stranded_before) {
        char bytes[64];
        printf("  => stranded now: %u block%s (%s of KV), %u before this prompt\n",
               o->stranded_after, o->stranded_after == 1 ? "" : "s",
               fmt_bytes(kv_bytes(c, o->stranded_after), bytes), o->stranded_before);
    }
}

static int print_text(const cache_t *c, size_t index, const prompt_t *p, const outcome_t *o)
{
    const bool ran = o->run_err == 0;
    const uint32_t bs = c->bs;
    const size_t n_full = o->n_full, n_all = o->n_all;
    printf("prompt %zu (line %zu): %zu tokens = %zu full block%s%s (block size %u)", index + 1,
           p->line, p->n_tokens, n_full, n_full == 1 ? "" : "s",
           n_all > n_full ? " + 1 partial" : "", bs);
    if (p->salt && p->salt[0]) {
        char *salt = kvc_cli_escape_dup(p->salt); /* the salt is input: never raw on a terminal */
        if (!salt) return kvc_cli_error(CMD, "out of memory");
        printf(", salt '%s'", salt);
        free(salt);
    }
    if (p->ns.lora_id) printf(", lora %" PRIu64, p->ns.lora_id);
    if (p->priority) printf(", priority %u", p->priority);
    printf("\n  %-5s %-11s %-32s  %-10s %-6s %s\n", "block", "tokens", "hash", "status", "slot",
           "why");
    for (size_t i = 0; i < n_all; i++) {
        char hex[33] = "-", range[48], slot[16] = "-";
        if (i < n_full) kvc_hash128_hex(o->hashes[i], hex);
        snprintf(range, sizeof range, "%zu-%zu", i * bs, KVC_MIN((i + 1) * bs, p->n_tokens) - 1);
        if (ran) snprintf(slot, sizeof slot, "#%u", o->table[i]);
        printf("  %-5zu %-11s %-32s  %-10s %-6s %s", i, range, hex,
               kvc_block_status_name(o->status[i]), slot, note_for(o->status[i]));
        if (ran && o->origin[i] != KVC_NONE)
            printf("; computed in #%u, which went back: #%u already held it", o->origin[i],
                   o->table[i]);
        if (o->copy && o->copy[i] != KVC_NONE)
            printf("; stranded #%u holds it, unreachable", o->copy[i]);
        putchar('\n');
    }
    print_evictions_text(c);
    print_stranded_text(c, o);
    const kvc_prefix_hit_t *hit = &o->hit;
    if (ran)
        printf("  => hit %zu of %zu tokens (%zu block%s)%s; computed %zu; allocated %u block%s, "
               "evicted %zu\n",
               hit->n_hit_tokens, p->n_tokens, hit->n_hit_blocks, hit->n_hit_blocks == 1 ? "" : "s",
               hit->cut_by_last_token ? ", cut by the last-token rule" : "",
               p->n_tokens - hit->n_hit_tokens, o->need, o->need == 1 ? "" : "s", c->events.n);
    else
        printf("  => cannot run: needs %u more blocks, the pool has %u free (%s)\n", o->need,
               o->free_before, kvc_strerror(o->run_err));
    printf("  => released %s; pool: %u free, %u of them cached\n\n",
           c->head_first ? "head-first" : "tail-first", o->pool.n_free, o->pool.n_free_cached);
    return 0;
}

static int run_prompt(cache_t *c, size_t index, const prompt_t *p)
{
    outcome_t o = {0};
    int rc = classify(c, p, &o);
    if (!rc) rc = walk_request(c, p, &o);
    if (!rc) rc = count_stranded(c, p, &o);
    if (!rc) rc = c->json ? print_json(c, index, p, &o) : print_text(c, index, p, &o);
    free_outcome(&o);
    return rc;
}

/* ---- the command ------------------------------------------------------------ */
static void print_totals(const cache_t *c)
{
    kvc_prefix_stats_t st;
    totals(c, &st);
    printf("totals: %llu lookups, %llu of %llu prompt tokens hit (%.1f%%), %llu blocks "
           "inserted, %llu evicted, %u cached now\n",
           (unsigned long long)st.n_lookups, (unsigned long long)st.n_hit_tokens,
           (unsigned long long)st.n_query_tokens,
           st.n_query_tokens ? 100.0 * (double)st.n_hit_tokens / (double)st.n_query_tokens : 0.0,
           (unsigned long long)st.n_inserts, (unsigned long long)st.n_evictions,
           st.n_cached_blocks);
    char bytes[64];
    printf("stranded: %u block%s now (%s of KV at %llu bytes a token), %llu ever\n",
           st.n_stranded_blocks, st.n_stranded_blocks == 1 ? "" : "s",
           fmt_bytes(kv_bytes(c, st.n_stranded_blocks), bytes),
           (unsigned long long)c->kv_bytes_per_token, (unsigned long long)st.n_strandings);
    printf("collisions: %llu (a cached block with the hash but another identity: refused, never "
           "handed out)\n",
           (unsigned long long)st.n_collisions);
}

int kvc_cmd_explain(int argc, char **argv)
{
    opts_t o;
    int rc = parse_options(argc, argv, &o);
    if (rc) return rc < 0 ? 0 : rc;

    prompts_t prompts = {0};
    if (read_prompts(&o, &prompts)) {
        free_prompts(&prompts);
        return 1;
    }
    cache_t c;
    if (open_cache(&o, &c)) {
        free_prompts(&prompts);
        return 1;
    }
    if (!o.json) {
        printf("pool: %u blocks of %u tokens; eviction %s; hash seed %llu%s", c.n_blocks, c.bs,
               kvc_eviction_name(c.eviction), (unsigned long long)kvc_prefix_seed(c.pc),
               o.seed ? "" : " (random)");
        if (c.hash_bits) printf("; index hash cut to %u bits (--hash-bits)", c.hash_bits);
        printf("\n\n");
    }
    int status = 0;
    for (size_t i = 0; i < prompts.n && !status; i++) status = run_prompt(&c, i, &prompts.v[i]);
    if (!status) {
        char msg[256];
        if (kvc_seqs_check(c.seqs, msg, sizeof msg))
            status = kvc_cli_error(CMD, "internal: %s", msg);
    }
    if (!status && !o.json) print_totals(&c);
    close_cache(&c);
    free_prompts(&prompts);
    return status;
}
