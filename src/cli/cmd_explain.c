/* cmd_explain.c - `kvcache explain`: one request's path through the prefix
 * cache, block by block.
 *
 * Each prompt goes through the library's own request path, as a server's
 * would: the sequence table (seq) looks its prefix up and pins the hits,
 * reserves the rest (the pool evicts cached blocks through the prefix cache
 * when it is full), completes the prompt (its full blocks are inserted, and a
 * block someone else already cached is swapped for that copy), and releases
 * its table tail-first, so that the next prompt sees what a server would see.
 * Beside that path, kvc_prefix_match says why each block did or did not hit,
 * and the pool's eviction events say what made room.  All input is read and
 * checked before anything runs: a bad line gets one error naming it, and no
 * output.
 */
#include "cli.h"
#include "kvcache/kvcache.h"

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
    const char *salt; /* as given, for printing; NULL when none */
    bool salt_owned;  /* salt is this prompt's copy (from its JSON line) */
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
    bool json;
    const char *path; /* the input */
} opts_t;

static void help(FILE *f)
{
    fprintf(
        f,
        "usage: kvcache explain [options] FILE\n"
        "\n"
        "Walks each prompt through the prefix cache as a server would (hash, look up and\n"
        "pin, allocate with eviction, insert, release tail-first) and prints, per block,\n"
        "its hash, whether it hit and why, and what eviction took to make room.\n"
        "\n"
        "FILE ('-' for standard input) holds one prompt a line: token ids separated by\n"
        "spaces or commas, or a JSON object {\"tokens\": [...], \"salt\": \"...\", \"lora\": N}.\n"
        "Lines starting with '#' are comments.\n"
        "\n"
        "options:\n"
        "  --pool-blocks N   blocks in the pool (default 64)\n"
        "  --block-size N    tokens per block, a power of two 1..256 (default 16)\n"
        "  --salt STR        tenant cache salt for every prompt (JSON lines may override)\n"
        "  --lora ID         LoRA adapter id for every prompt (default 0: base model)\n"
        "  --epoch N         weight epoch (default 0)\n"
        "  --seed N          hash seed (default: random per process, as in production)\n"
        "  --json            one JSON object per prompt instead of text\n"
        "  -h, --help        this help\n"
        "\n"
        "Numbers are plain decimal digits (no sign, no spaces).\n");
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
                                         {"json", no_argument, NULL, 'j'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    *o = (opts_t){.pool_blocks = 64, .block_size = 16};
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

static int parse_lora(const cJSON *lora, const lexer_t *lx, prompt_t *p, where_t w)
{
    size_t cursor = 0;
    const number_t *num = cJSON_IsNumber(lora) ? number_text(lx, &cursor, lora) : NULL;
    if (cJSON_IsNumber(lora) && !num)
        return bad(w, "%s", "internal: a number's text was not found");
    uint64_t v;
    kvc_cli_num_t r =
        num ? kvc_cli_parse_json_uint(num->text, num->len, UINT64_MAX, &v) : KVC_CLI_NUM_MALFORMED;
    if (r == KVC_CLI_NUM_TOO_LARGE)
        return bad(w, "\"lora\" %.*s is too large (max %" PRIu64 ")", clip(num->len), num->text,
                   UINT64_MAX);
    if (r != KVC_CLI_NUM_OK) return bad(w, "%s", "\"lora\" is not a non-negative integer");
    p->ns.lora_id = v;
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
    static const char *const keys[] = {"tokens", "salt", "lora"};
    unsigned seen = 0;
    for (const cJSON *c = obj->child; c; c = c->next) {
        size_t k = 0;
        while (k < KVC_ARRAY_LEN(keys) && strcmp(c->string, keys[k])) k++;
        if (k == KVC_ARRAY_LEN(keys))
            return bad(w, "unknown key \"%s\" (the keys are tokens, salt and lora)", c->string);
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
             (lora && parse_lora(lora, &lx, p, w));
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
} evicted_t;

typedef struct {
    evicted_t *v;
    size_t n, cap;
    bool recording;
    bool lost; /* an event could not be recorded (no memory) */
} events_t;

typedef struct {
    kvc_pool_t *pool;
    kvc_prefix_t *pc; /* the pool's evictor */
    kvc_seqs_t *seqs; /* one request at a time, through the library's path */
    events_t events;
    uint32_t bs;
    bool json;
} cache_t;

static void on_event(void *ctx, const kvc_prefix_event_t *ev)
{
    events_t *e = ctx;
    if (!e->recording || ev->type != KVC_EVENT_REMOVED) return;
    if (e->n == e->cap) {
        size_t cap = e->cap ? 2 * e->cap : 16;
        evicted_t *v = realloc(e->v, cap * sizeof *v);
        if (!v) {
            e->lost = true;
            return;
        }
        e->v = v;
        e->cap = cap;
    }
    e->v[e->n++] = (evicted_t){.block = ev->block, .hash = ev->hash};
}

static void close_cache(cache_t *c)
{
    kvc_seqs_destroy(c->seqs);
    kvc_prefix_destroy(c->pc);
    kvc_pool_destroy(c->pool);
    free(c->events.v);
}

/* Build the pool, its prefix cache and the sequence table from the options: every parameter
 * the cache takes is set here.  0, or 1 with the one-line error printed. */
static int open_cache(const opts_t *o, cache_t *c)
{
    *c = (cache_t){.json = o->json};
    kvc_pool_params_t pp = kvc_pool_params_default();
    pp.n_blocks = (uint32_t)o->pool_blocks;
    pp.block_size = (uint32_t)o->block_size;
    kvc_prefix_params_t cp = kvc_prefix_params_default();
    cp.hash_seed = o->seed;
    cp.on_event = on_event;
    cp.event_ctx = &c->events;
    kvc_seqs_params_t sp = kvc_seqs_params_default();
    sp.max_seqs = 1;
    const char *what = "the pool";
    int rc = kvc_pool_create(&pp, &c->pool);
    if (!rc) what = "the prefix cache", rc = kvc_prefix_create(c->pool, &cp, &c->pc);
    if (!rc) what = "the sequence table", rc = kvc_seqs_create(c->pool, c->pc, &sp, &c->seqs);
    if (rc) {
        close_cache(c);
        return kvc_cli_error(CMD, "cannot create %s: %s", what, kvc_strerror(rc));
    }
    c->bs = pp.block_size;
    return 0;
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
} outcome_t;

static void free_outcome(outcome_t *o)
{
    free(o->hashes);
    free(o->status);
    free(o->table);
    free(o->origin);
}

static int fail(const prompt_t *p, const char *what, int err)
{
    return kvc_cli_error(CMD, "line %zu: %s failed: %s", p->line, what, kvc_strerror(err));
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
    kvc_prefix_query_t q = {.ns = &p->ns, .tokens = p->tokens, .n_tokens = p->n_tokens};
    size_t n_hashed;
    int err = kvc_prefix_hash(c->pc, &q, o->hashes, o->n_full, &n_hashed);
    if (err) return fail(p, "hashing", err);
    q.hashes = o->hashes;
    if ((err = kvc_prefix_match(c->pc, &q, NULL, 0, o->status, &o->hit)))
        return fail(p, "matching", err);
    return 0;
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

/* The request's path: look up and pin, reserve the rest (recording what eviction takes),
 * complete it (inserting its full blocks), release it. */
static int walk_request(cache_t *c, const prompt_t *p, outcome_t *o)
{
    kvc_seq_desc_t d = {.prompt = p->tokens, .n_prompt = p->n_tokens, .ns = &p->ns};
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
    }
    rc = 0;
out:
    err = kvc_seq_destroy(c->seqs, h); /* released tail-first */
    if (err && !rc) rc = fail(p, "release", err);
    kvc_pool_stats(c->pool, &o->pool);
    return rc;
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
    }
    ADD(cJSON_AddBoolToObject(obj, "cut_by_last_token", o->hit.cut_by_last_token));
    NUM(obj, "hit_blocks", o->hit.n_hit_blocks);
    NUM(obj, "hit_tokens", o->hit.n_hit_tokens);
    NUM(obj, "computed_tokens", ran ? p->n_tokens - o->hit.n_hit_tokens : 0);
    NUM(obj, "allocated_blocks", ran ? o->need : 0);
    cJSON *ev = cJSON_AddArrayToObject(obj, "evicted");
    ADD(ev);
    for (size_t i = 0; ok && i < c->events.n; i++) {
        char hex[33];
        kvc_hash128_hex(c->events.v[i].hash, hex);
        cJSON *e = cJSON_CreateObject();
        if (!e || !cJSON_AddItemToArray(ev, e)) {
            cJSON_Delete(e);
            ok = false;
            break;
        }
        NUM(e, "block", c->events.v[i].block);
        ADD(cJSON_AddStringToObject(e, "hash", hex));
    }
    ADD(ran ? cJSON_AddNullToObject(obj, "error")
            : cJSON_AddStringToObject(obj, "error", kvc_strerror(o->run_err)));
    NUM(obj, "pool_free", o->pool.n_free);
    NUM(obj, "pool_free_cached", o->pool.n_free_cached);
#undef NUM
#undef ADD
    char *s = ok ? cJSON_PrintUnformatted(obj) : NULL;
    cJSON_Delete(obj);
    if (!s) return kvc_cli_error(CMD, "out of memory");
    puts(s);
    free(s);
    return 0;
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
        putchar('\n');
    }
    for (size_t i = 0; i < c->events.n; i++) {
        char hex[33];
        kvc_hash128_hex(c->events.v[i].hash, hex);
        printf("  evicted #%u (hash %s): least recently used cached block with no cached "
               "children\n",
               c->events.v[i].block, hex);
    }
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
    printf("  => released tail-first; pool: %u free, %u of them cached\n\n", o->pool.n_free,
           o->pool.n_free_cached);
    return 0;
}

static int run_prompt(cache_t *c, size_t index, const prompt_t *p)
{
    outcome_t o = {0};
    int rc = classify(c, p, &o);
    if (!rc) rc = walk_request(c, p, &o);
    if (!rc) rc = c->json ? print_json(c, index, p, &o) : print_text(c, index, p, &o);
    free_outcome(&o);
    return rc;
}

/* ---- the command ------------------------------------------------------------ */
static void print_totals(const cache_t *c)
{
    kvc_prefix_stats_t st;
    kvc_prefix_stats(c->pc, &st);
    printf("totals: %llu lookups, %llu of %llu prompt tokens hit (%.1f%%), %llu blocks "
           "inserted, %llu evicted, %u cached now\n",
           (unsigned long long)st.n_lookups, (unsigned long long)st.n_hit_tokens,
           (unsigned long long)st.n_query_tokens,
           st.n_query_tokens ? 100.0 * (double)st.n_hit_tokens / (double)st.n_query_tokens : 0.0,
           (unsigned long long)st.n_inserts, (unsigned long long)st.n_evictions,
           st.n_cached_blocks);
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
    if (!o.json)
        printf("pool: %u blocks of %u tokens; hash seed %llu%s\n\n", (uint32_t)o.pool_blocks, c.bs,
               (unsigned long long)kvc_prefix_seed(c.pc), o.seed ? "" : " (random)");
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
