/* cmd_explain.c - `kvcache explain`: one request's path through the prefix
 * cache, block by block.
 *
 * Each prompt is hashed, looked up (hits are pinned), the rest of its blocks
 * are allocated (evicting cached blocks when the pool is full), its full
 * blocks are inserted, and its table is released tail-first, so that the
 * next prompt sees what a server would see.  All input is read and checked
 * before anything runs: a bad line gets one error naming it, and no output.
 */
#include "cli.h"
#include "kvcache/kvcache.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <getopt.h>
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
    char salt[64]; /* as given, for printing; "" when none */
} prompt_t;

typedef struct {
    prompt_t *v;
    size_t n, cap;
} prompts_t;

typedef struct {
    uint32_t block;
    kvc_hash128_t hash;
    uint32_t first_token; /* of the evicted block's own prompt position: block index * bs */
} evicted_t;

typedef struct {
    evicted_t *v;
    size_t n, cap;
    bool recording;
} events_t;

static void on_event(void *ctx, const kvc_prefix_event_t *ev)
{
    events_t *e = ctx;
    if (!e->recording || ev->type != KVC_EVENT_REMOVED) return;
    if (e->n == e->cap) {
        size_t cap = e->cap ? 2 * e->cap : 16;
        evicted_t *v = realloc(e->v, cap * sizeof *v);
        if (!v) return; /* reporting only: losing an event line is not fatal */
        e->v = v;
        e->cap = cap;
    }
    e->v[e->n++] = (evicted_t){.block = ev->block, .hash = ev->hash};
}

static void free_prompts(prompts_t *p)
{
    for (size_t i = 0; i < p->n; i++) free(p->v[i].tokens);
    free(p->v);
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
    fprintf(stderr, "kvcache " CMD ": %s:%zu: ", w.path, w.line);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return 1;
}

static int push_token(prompt_t *p, size_t *cap, long long v, where_t w, const char *text)
{
    if (v < 0) return bad(w, "token id %s is negative", text);
    if (v > INT32_MAX) return bad(w, "token id %s is too large (max 2147483647)", text);
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

static int parse_text_line(char *s, prompt_t *p, where_t w)
{
    size_t cap = 0;
    for (char *tok = strtok(s, " \t\r\n,"); tok; tok = strtok(NULL, " \t\r\n,")) {
        errno = 0;
        char *end;
        long long v = strtoll(tok, &end, 10);
        if (*end || end == tok) return bad(w, "'%s' is not a token id", tok);
        if (errno == ERANGE) return bad(w, "token id %s is too large (max 2147483647)", tok);
        if (push_token(p, &cap, v, w, tok)) return 1;
    }
    return 0;
}

static int parse_json_line(const char *s, prompt_t *p, where_t w)
{
    cJSON *obj = cJSON_Parse(s);
    if (!obj || !cJSON_IsObject(obj)) {
        cJSON_Delete(obj);
        return bad(w, "%s", "not a JSON object");
    }
    int rc = 0;
    const cJSON *toks = cJSON_GetObjectItemCaseSensitive(obj, "tokens");
    if (!cJSON_IsArray(toks)) {
        rc = bad(w, "%s", "no \"tokens\" array");
        goto out;
    }
    size_t cap = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, toks)
    {
        char text[64];
        if (!cJSON_IsNumber(t)) {
            rc = bad(w, "%s", "a token in \"tokens\" is not a number");
            goto out;
        }
        double d = t->valuedouble;
        snprintf(text, sizeof text, "%.17g", d);
        if (d != (double)(long long)d) {
            rc = bad(w, "token id %s is not an integer", text);
            goto out;
        }
        if (d > (double)INT32_MAX) {
            rc = bad(w, "token id %s is too large (max 2147483647)", text);
            goto out;
        }
        if ((rc = push_token(p, &cap, (long long)d, w, text))) goto out;
    }
    const cJSON *salt = cJSON_GetObjectItemCaseSensitive(obj, "salt");
    if (salt) {
        if (!cJSON_IsString(salt)) {
            rc = bad(w, "%s", "\"salt\" is not a string");
            goto out;
        }
        int err = kvc_namespace_set_salt(&p->ns, salt->valuestring);
        if (err) {
            rc = bad(w, "\"salt\": %s", kvc_strerror(err));
            goto out;
        }
        snprintf(p->salt, sizeof p->salt, "%s", salt->valuestring);
    }
    const cJSON *lora = cJSON_GetObjectItemCaseSensitive(obj, "lora");
    if (lora) {
        if (!cJSON_IsNumber(lora) || lora->valuedouble < 0 ||
            lora->valuedouble != (double)(long long)lora->valuedouble) {
            rc = bad(w, "%s", "\"lora\" is not a non-negative integer");
            goto out;
        }
        p->ns.lora_id = (uint64_t)lora->valuedouble;
    }
out:
    cJSON_Delete(obj);
    return rc;
}

static int read_prompts(const char *path, const kvc_namespace_t *ns, const char *salt,
                        prompts_t *out)
{
    FILE *f = strcmp(path, "-") ? fopen(path, "r") : stdin;
    if (!f) return kvc_cli_error(CMD, "cannot open %s: %s", path, strerror(errno));
    char *line = NULL;
    size_t line_cap = 0, lineno = 0;
    int rc = 0;
    while (getline(&line, &line_cap, f) >= 0) {
        where_t w = {path, ++lineno};
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
        *p = (prompt_t){.line = lineno, .ns = *ns};
        snprintf(p->salt, sizeof p->salt, "%s", salt ? salt : "");
        rc = *s == '{' ? parse_json_line(s, p, w) : parse_text_line(s, p, w);
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

/* ---- one prompt --------------------------------------------------------- */
typedef struct {
    kvc_pool_t *pool;
    kvc_prefix_t *pc;
    events_t *events;
    uint32_t bs;
    bool json;
} ctx_t;

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

static int run_prompt(ctx_t *c, size_t index, const prompt_t *p)
{
    const uint32_t bs = c->bs;
    size_t n_full = p->n_tokens / bs, n_all = (p->n_tokens + bs - 1) / bs;
    kvc_hash128_t *hashes = calloc(n_full + 1, sizeof *hashes);
    kvc_block_status_t *status = calloc(n_all, sizeof *status);
    uint32_t *table = calloc(n_all, sizeof *table);
    uint32_t *origin = calloc(n_all, sizeof *origin); /* what happened to each block */
    int rc = 1;
    if (!hashes || !status || !table || !origin) {
        kvc_cli_error(CMD, "out of memory");
        goto out;
    }
    kvc_prefix_query_t q = {.ns = &p->ns, .tokens = p->tokens, .n_tokens = p->n_tokens};
    size_t n_hashed;
    int err = kvc_prefix_hash(c->pc, &q, hashes, n_full, &n_hashed);
    if (err) {
        kvc_cli_error(CMD, "line %zu: hashing failed: %s", p->line, kvc_strerror(err));
        goto out;
    }
    q.hashes = hashes;
    kvc_prefix_hit_t hit;
    kvc_prefix_match(c->pc, &q, NULL, 0, status, &hit);
    if ((err = kvc_prefix_lookup(c->pc, &q, table, n_all, &hit))) {
        kvc_cli_error(CMD, "line %zu: lookup failed: %s", p->line, kvc_strerror(err));
        goto out;
    }

    /* Allocate the rest; record what eviction takes. */
    uint32_t need = (uint32_t)(n_all - hit.n_hit_blocks);
    c->events->n = 0;
    c->events->recording = true;
    uint32_t n_free_before = kvc_pool_n_free(c->pool);
    err = kvc_pool_alloc(c->pool, need, table + hit.n_hit_blocks);
    c->events->recording = false;
    bool ran = err == 0;

    /* Insert the computed full blocks, chaining from the last hit. */
    uint32_t parent = hit.n_hit_blocks ? table[hit.n_hit_blocks - 1] : KVC_NONE;
    for (size_t i = 0; i < n_all; i++) origin[i] = KVC_NONE;
    for (size_t i = hit.n_hit_blocks; ran && i < n_full; i++) {
        uint32_t canonical;
        err = kvc_prefix_insert(c->pc, &q, i, parent, table[i], &canonical);
        if (err) {
            kvc_cli_error(CMD, "line %zu: insert failed: %s", p->line, kvc_strerror(err));
            kvc_pool_release(c->pool, table, (uint32_t)n_all);
            goto out;
        }
        if (canonical != table[i]) {
            /* Already cached (the last-token rule made us compute it again): share the cached
             * copy and give ours back, as a server would. */
            origin[i] = table[i];
            if ((err = kvc_pool_ref(c->pool, canonical)) ||
                (err = kvc_pool_unref(c->pool, table[i]))) {
                kvc_cli_error(CMD, "line %zu: sharing a duplicate failed: %s", p->line,
                              kvc_strerror(err));
                goto out;
            }
            table[i] = canonical;
        }
        parent = table[i];
    }

    kvc_pool_stats_t ps;
    size_t computed = p->n_tokens - hit.n_hit_tokens;
    if (c->json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "prompt", (double)index + 1);
        cJSON_AddNumberToObject(o, "line", (double)p->line);
        cJSON_AddNumberToObject(o, "n_tokens", (double)p->n_tokens);
        cJSON_AddNumberToObject(o, "block_size", bs);
        cJSON_AddStringToObject(o, "salt", p->salt);
        cJSON_AddNumberToObject(o, "lora", (double)p->ns.lora_id);
        cJSON *blocks = cJSON_AddArrayToObject(o, "blocks");
        for (size_t i = 0; i < n_all; i++) {
            cJSON *b = cJSON_CreateObject();
            char hex[33] = "";
            if (i < n_full) kvc_hash128_hex(hashes[i], hex);
            cJSON_AddNumberToObject(b, "index", (double)i);
            cJSON_AddNumberToObject(b, "first_token", (double)(i * bs));
            cJSON_AddNumberToObject(b, "last_token",
                                    (double)KVC_MIN((i + 1) * bs, p->n_tokens) - 1);
            if (i < n_full)
                cJSON_AddStringToObject(b, "hash", hex);
            else
                cJSON_AddNullToObject(b, "hash");
            cJSON_AddStringToObject(b, "status", kvc_block_status_name(status[i]));
            cJSON_AddStringToObject(b, "why", note_for(status[i]));
            if (ran)
                cJSON_AddNumberToObject(b, "block", table[i]);
            else
                cJSON_AddNullToObject(b, "block");
            if (origin[i] != KVC_NONE) cJSON_AddNumberToObject(b, "recomputed_in", origin[i]);
            cJSON_AddItemToArray(blocks, b);
        }
        cJSON_AddBoolToObject(o, "cut_by_last_token", hit.cut_by_last_token);
        cJSON_AddNumberToObject(o, "hit_blocks", (double)hit.n_hit_blocks);
        cJSON_AddNumberToObject(o, "hit_tokens", (double)hit.n_hit_tokens);
        cJSON_AddNumberToObject(o, "computed_tokens", ran ? (double)computed : 0);
        cJSON_AddNumberToObject(o, "allocated_blocks", ran ? need : 0);
        cJSON *ev = cJSON_AddArrayToObject(o, "evicted");
        for (size_t i = 0; i < c->events->n; i++) {
            char hex[33];
            kvc_hash128_hex(c->events->v[i].hash, hex);
            cJSON *e = cJSON_CreateObject();
            cJSON_AddNumberToObject(e, "block", c->events->v[i].block);
            cJSON_AddStringToObject(e, "hash", hex);
            cJSON_AddItemToArray(ev, e);
        }
        if (ran)
            cJSON_AddNullToObject(o, "error");
        else
            cJSON_AddStringToObject(o, "error", kvc_strerror(err));
        if (ran)
            kvc_pool_release(c->pool, table, (uint32_t)n_all);
        else
            kvc_pool_release(c->pool, table, (uint32_t)hit.n_hit_blocks);
        kvc_pool_stats(c->pool, &ps);
        cJSON_AddNumberToObject(o, "pool_free", ps.n_free);
        cJSON_AddNumberToObject(o, "pool_free_cached", ps.n_free_cached);
        char *s = cJSON_PrintUnformatted(o);
        if (s) puts(s);
        free(s);
        cJSON_Delete(o);
    } else {
        printf("prompt %zu (line %zu): %zu tokens = %zu full block%s%s (block size %u)", index + 1,
               p->line, p->n_tokens, n_full, n_full == 1 ? "" : "s",
               n_all > n_full ? " + 1 partial" : "", bs);
        if (p->salt[0]) printf(", salt '%s'", p->salt);
        if (p->ns.lora_id) printf(", lora %llu", (unsigned long long)p->ns.lora_id);
        printf("\n  %-5s %-11s %-32s  %-10s %-6s %s\n", "block", "tokens", "hash", "status", "slot",
               "why");
        for (size_t i = 0; i < n_all; i++) {
            char hex[33] = "-", range[32], slot[16] = "-";
            if (i < n_full) kvc_hash128_hex(hashes[i], hex);
            snprintf(range, sizeof range, "%zu-%zu", i * bs,
                     KVC_MIN((i + 1) * bs, p->n_tokens) - 1);
            if (ran) snprintf(slot, sizeof slot, "#%u", table[i]);
            printf("  %-5zu %-11s %-32s  %-10s %-6s %s", i, range, hex,
                   kvc_block_status_name(status[i]), slot, note_for(status[i]));
            if (origin[i] != KVC_NONE)
                printf("; computed in #%u, which went back: #%u already held it", origin[i],
                       table[i]);
            putchar('\n');
        }
        for (size_t i = 0; i < c->events->n; i++) {
            char hex[33];
            kvc_hash128_hex(c->events->v[i].hash, hex);
            printf("  evicted #%u (hash %s): least recently used cached block with no cached "
                   "children\n",
                   c->events->v[i].block, hex);
        }
        if (ran) {
            printf(
                "  => hit %zu of %zu tokens (%zu block%s)%s; computed %zu; allocated %u block%s, "
                "evicted %zu\n",
                hit.n_hit_tokens, p->n_tokens, hit.n_hit_blocks, hit.n_hit_blocks == 1 ? "" : "s",
                hit.cut_by_last_token ? ", cut by the last-token rule" : "", computed, need,
                need == 1 ? "" : "s", c->events->n);
            kvc_pool_release(c->pool, table, (uint32_t)n_all);
        } else {
            printf("  => cannot run: needs %u more blocks, the pool has %u free (%s)\n", need,
                   n_free_before, kvc_strerror(err));
            kvc_pool_release(c->pool, table, (uint32_t)hit.n_hit_blocks);
        }
        kvc_pool_stats(c->pool, &ps);
        printf("  => released tail-first; pool: %u free, %u of them cached\n\n", ps.n_free,
               ps.n_free_cached);
    }
    rc = 0;
out:
    free(hashes);
    free(status);
    free(table);
    free(origin);
    return rc;
}

/* ---- the command ------------------------------------------------------------ */
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
        "  -h, --help        this help\n");
}

int kvc_cmd_explain(int argc, char **argv)
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
    uint64_t pool_blocks = 64, block_size = 16, seed = 0;
    const char *salt = NULL;
    kvc_namespace_t ns = {0};
    bool json = false;
    int ch;
    optind = 1;
    opterr = 0;
    while ((ch = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (ch) {
        case 'p':
            if (!kvc_cli_parse_u64(optarg, 1, 1u << 24, &pool_blocks))
                return kvc_cli_error(CMD, "--pool-blocks: '%s' is not a number in 1..16777216",
                                     optarg);
            break;
        case 'b':
            if (!kvc_cli_parse_u64(optarg, 1, 256, &block_size) || (block_size & (block_size - 1)))
                return kvc_cli_error(CMD, "--block-size: '%s' is not a power of two in 1..256",
                                     optarg);
            break;
        case 's': {
            salt = optarg;
            int err = kvc_namespace_set_salt(&ns, optarg);
            if (err) return kvc_cli_error(CMD, "--salt: %s", kvc_strerror(err));
            break;
        }
        case 'l':
            if (!kvc_cli_parse_u64(optarg, 0, UINT64_MAX, &ns.lora_id))
                return kvc_cli_error(CMD, "--lora: '%s' is not a non-negative integer", optarg);
            break;
        case 'e':
            if (!kvc_cli_parse_u64(optarg, 0, UINT64_MAX, &ns.weight_epoch))
                return kvc_cli_error(CMD, "--epoch: '%s' is not a non-negative integer", optarg);
            break;
        case 'S':
            if (!kvc_cli_parse_u64(optarg, 1, UINT64_MAX, &seed))
                return kvc_cli_error(CMD, "--seed: '%s' is not a positive integer", optarg);
            break;
        case 'j':
            json = true;
            break;
        case 'h':
            help(stdout);
            return 0;
        case ':':
            return kvc_cli_error(CMD, "%s needs a value", argv[optind - 1]);
        default:
            return kvc_cli_error(CMD, "unknown option '%s' (try --help)", argv[optind - 1]);
        }
    }
    if (optind != argc - 1)
        return kvc_cli_error(CMD, optind >= argc ? "no input file (try --help)"
                                                 : "one input file expected (try --help)");

    prompts_t prompts = {0};
    if (read_prompts(argv[optind], &ns, salt, &prompts)) {
        free_prompts(&prompts);
        return 1;
    }

    kvc_pool_params_t pp = kvc_pool_params_default();
    pp.n_blocks = (uint32_t)pool_blocks;
    pp.block_size = (uint32_t)block_size;
    kvc_pool_t *pool = NULL;
    kvc_prefix_t *pc = NULL;
    events_t events = {0};
    kvc_prefix_params_t cp = kvc_prefix_params_default();
    cp.hash_seed = seed;
    cp.on_event = on_event;
    cp.event_ctx = &events;
    int rc = kvc_pool_create(&pp, &pool);
    if (!rc) rc = kvc_prefix_create(pool, &cp, &pc);
    if (rc) {
        kvc_prefix_destroy(pc);
        kvc_pool_destroy(pool);
        free_prompts(&prompts);
        return kvc_cli_error(CMD, "cannot create the pool: %s", kvc_strerror(rc));
    }
    if (!json)
        printf("pool: %u blocks of %u tokens; hash seed %llu%s\n\n", pp.n_blocks, pp.block_size,
               (unsigned long long)kvc_prefix_seed(pc), seed ? "" : " (random)");
    ctx_t c = {.pool = pool, .pc = pc, .events = &events, .bs = pp.block_size, .json = json};
    int status = 0;
    for (size_t i = 0; i < prompts.n && !status; i++) status = run_prompt(&c, i, &prompts.v[i]);
    if (!status) {
        char msg[256];
        if (kvc_prefix_check(pc, msg, sizeof msg)) status = kvc_cli_error(CMD, "internal: %s", msg);
    }
    if (!status && !json) {
        kvc_prefix_stats_t st;
        kvc_prefix_stats(pc, &st);
        printf("totals: %llu lookups, %llu of %llu prompt tokens hit (%.1f%%), %llu blocks "
               "inserted, %llu evicted, %u cached now\n",
               (unsigned long long)st.n_lookups, (unsigned long long)st.n_hit_tokens,
               (unsigned long long)st.n_query_tokens,
               st.n_query_tokens ? 100.0 * (double)st.n_hit_tokens / (double)st.n_query_tokens
                                 : 0.0,
               (unsigned long long)st.n_inserts, (unsigned long long)st.n_evictions,
               st.n_cached_blocks);
    }
    kvc_prefix_destroy(pc);
    kvc_pool_destroy(pool);
    free(events.v);
    free_prompts(&prompts);
    return status;
}
