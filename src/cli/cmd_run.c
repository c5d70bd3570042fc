/* cmd_run.c - `kvcache run`: generate text with the CPU engine on the paged cache.
 *
 * One prompt streams its text to stdout as it is generated; --prompts FILE runs one request
 * per line, all at once (continuous batching, prefix caching across them); --json prints one
 * JSON object per request, then a summary.  The CLI only parses, tokenizes and prints: the
 * engine (kvcache/engine.h) does the work. */
#include "cli.h"
#include "kvcache/kvcache.h"
#include "kvcache/engine.h"
#include "kvcache/sample.h"
#include "kvcache/chat.h"
#include "kvcache/llama2c.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define CMD "run"

static void usage(FILE *f)
{
    fprintf(
        f, "usage: kvcache run --model FILE (--prompt TEXT | --prompt-ids \"1 2 3\" | --prompts "
           "FILE)\n"
           "                   [options]\n\n"
           "Generate with the CPU engine: the model's K/V live in kvcache's paged pool, the\n"
           "scheduler batches every request (prefill chunks and decodes in one step), and\n"
           "prompts that share a prefix share its blocks (no flag needed).\n\n"
           "input\n"
           "  --model FILE          a GGUF model (llama, qwen2, qwen3, gemma2), or a llama2.c\n"
           "                        checkpoint (.bin) with its tokenizer.bin\n"
           "  --tokenizer FILE      a llama2.c checkpoint's tokenizer (default: tokenizer.bin\n"
           "                        beside the checkpoint)\n"
           "  --prompt TEXT         one prompt (tokenized with the model's tokenizer, BOS added\n"
           "                        as the model asks)\n"
           "  --prompt-ids \"1 2 3\"  one prompt as token ids\n"
           "  --prompts FILE        one request per line, run concurrently: text, or a JSON\n"
           "                        object with \"prompt\" or \"prompt_ids\" and any of \"n\",\n"
           "                        \"temp\", \"top_k\", \"top_p\", \"min_p\", \"seed\", \"stop\", "
           "\"logprobs\"\n"
           "  --chat                render each prompt as a user turn with the model's chat\n"
           "                        template (tokenizer.chat_template, recognised by name)\n"
           "  --chat-template NAME  llama2, llama3, chatml, mistral, gemma, phi3 or zephyr\n"
           "  --system TEXT         a system message before each prompt (with --chat)\n"
           "generation (per request; --prompts lines may override)\n"
           "  -n N                  tokens to generate at most (default 128)\n"
           "  --temp T              temperature (default 0: greedy)\n"
           "  --top-k K, --top-p P, --min-p P    truncation (off by default)\n"
           "  --repeat-penalty R, --presence-penalty P, --frequency-penalty F\n"
           "  --seed S              each request's own RNG seed (default 0)\n"
           "  --stop TEXT           stop string (repeatable, up to 8)\n"
           "  --ignore-eos          keep generating past the end-of-sequence token\n"
           "  --logprobs N          report each token's logprob and the top N (0..20)\n"
           "  --spec ngram          speculative decoding with prompt-lookup drafts\n"
           "  --spec-model FILE     speculative decoding with a draft model (a GGUF with the\n"
           "                        same vocabulary size), decoded greedily on its own pool\n"
           "  --beams N             beam search with N beams (1..64; --prompts: one request\n"
           "                        after another); prints the best hypothesis\n"
           "  --length-penalty A    beams score sum logprob / len^A (default 1)\n"
           "  --early-stopping      stop once N hypotheses have ended\n"
           "  --spec-tokens K       drafts per step (default 4)\n"
           "engine\n");
    fprintf(
        f, "  --threads N           kernel threads (default: all cores)\n"
           "  --kv-dtype T          K/V storage: f32, f16 (default), bf16, fp8-e4m3, fp8-e5m2\n"
           "  --kv-memory SIZE      K/V pool size (e.g. 256MiB); default: enough for the requests\n"
           "  --ctx N               tokens per request, prompt + output (default: the model's,\n"
           "                        at most 32768)\n"
           "  --block-size N        tokens per KV block (default 16)\n"
           "  --max-seqs N          requests running at once (default 64)\n"
           "  --batch-tokens N      tokens computed per step (default 512)\n"
           "  --chunk N             prompt tokens per request per step (default: the budget)\n"
           "  --no-prefix-cache     never reuse a prefix across requests\n"
           "  --no-batch-invariance attention tiles of several query rows: faster, but outputs\n"
           "                        may then depend in the last bits on the batch\n"
           "  --preemption P        when the pool is full: recompute (default), swap (the\n"
           "                        victim's K/V to host memory and back) or backpressure\n"
           "  --no-kv-cache         recompute the whole sequence for every token (the quadratic\n"
           "                        baseline); same outputs\n"
           "  --tier SPEC           a KV tier (repeatable, in lookup order, at most 4):\n"
           "                        host:SIZE, disk:PATH:SIZE or redis://HOST:PORT[/PREFIX],\n"
           "                        each with an optional ,mode=evict|write-through\n"
           "  --tier-disk-write-budget SIZE/day   what a disk tier may write a day\n"
           "  --tier-admission P    what host and disk tiers admit: always (default),\n"
           "                        second-hit, depth:N\n"
           "  --tier-fetch P        a run found in a tier: decide (default: fetch when it beats\n"
           "                        recomputing it), always, never\n");
    fprintf(f,
            "output\n"
            "  --json                one JSON object per request (id, prompt_tokens,\n"
            "                        cached_tokens, completion_tokens, output_ids, text,\n"
            "                        finish_reason, ttft_ms, tpot_ms, logprobs), then a summary\n"
            "  -h, --help            this help\n");
}

enum {
    O_MODEL = 600,
    O_PROMPT,
    O_PROMPT_IDS,
    O_PROMPTS,
    O_TEMP,
    O_TOPK,
    O_TOPP,
    O_MINP,
    O_SEED,
    O_N,
    O_BEAMS,
    O_LENGTH_PENALTY,
    O_EARLY_STOP,
    O_SPEC,
    O_SPEC_MODEL,
    O_SPEC_TOKENS,
    O_THREADS,
    O_KV_DTYPE,
    O_KV_MEMORY,
    O_CTX,
    O_BLOCK,
    O_CHAT,
    O_CHAT_TEMPLATE,
    O_NO_KV,
    O_NO_PREFIX,
    O_LOGPROBS,
    O_JSON,
    O_STOP,
    O_IGNORE_EOS,
    O_REP,
    O_PRES,
    O_FREQ,
    O_MAX_SEQS,
    O_BATCH,
    O_CHUNK,
    O_ISA,
    O_TOKENIZER,
    O_SYSTEM,
    O_PREEMPT,
    O_NO_BI
};

static const struct option run_options[] = {
    {"model", required_argument, 0, O_MODEL},
    {"prompt", required_argument, 0, O_PROMPT},
    {"prompt-ids", required_argument, 0, O_PROMPT_IDS},
    {"prompts", required_argument, 0, O_PROMPTS},
    {"temp", required_argument, 0, O_TEMP},
    {"top-k", required_argument, 0, O_TOPK},
    {"top-p", required_argument, 0, O_TOPP},
    {"min-p", required_argument, 0, O_MINP},
    {"seed", required_argument, 0, O_SEED},
    {"n", required_argument, 0, O_N},
    {"beams", required_argument, 0, O_BEAMS},
    {"length-penalty", required_argument, 0, O_LENGTH_PENALTY},
    {"early-stopping", no_argument, 0, O_EARLY_STOP},
    {"spec", required_argument, 0, O_SPEC},
    {"spec-model", required_argument, 0, O_SPEC_MODEL},
    {"spec-tokens", required_argument, 0, O_SPEC_TOKENS},
    {"chat", no_argument, 0, O_CHAT},
    {"chat-template", required_argument, 0, O_CHAT_TEMPLATE},
    {"logprobs", required_argument, 0, O_LOGPROBS},
    {"json", no_argument, 0, O_JSON},
    {"stop", required_argument, 0, O_STOP},
    {"ignore-eos", no_argument, 0, O_IGNORE_EOS},
    {"repeat-penalty", required_argument, 0, O_REP},
    {"presence-penalty", required_argument, 0, O_PRES},
    {"frequency-penalty", required_argument, 0, O_FREQ},
    {"tokenizer", required_argument, 0, O_TOKENIZER},
    {"system", required_argument, 0, O_SYSTEM},
    {"help", no_argument, 0, 'h'},
    {0, 0, 0, 0},
};

/* One request as the CLI knows it. */
typedef struct {
    kvc_token_t *ids;
    uint32_t n_ids;
    kvc_gen_params_t gp;
    char *stop_store[KVC_MAX_STOP];
    kvc_gen_id_t id;
    bool done;
} creq_t;

typedef struct {
    creq_t *v;
    uint32_t n, cap;
} creqs_t;

static void creqs_free(creqs_t *q)
{
    for (uint32_t i = 0; i < q->n; i++) {
        free(q->v[i].ids);
        for (uint32_t j = 0; j < KVC_MAX_STOP; j++) free(q->v[i].stop_store[j]);
    }
    free(q->v);
}

static creq_t *creqs_add(creqs_t *q, const kvc_gen_params_t *gp)
{
    if (q->n == q->cap) {
        uint32_t c = q->cap ? 2 * q->cap : 8;
        creq_t *v = realloc(q->v, c * sizeof *v);
        if (!v) return NULL;
        q->v = v, q->cap = c;
    }
    creq_t *r = &q->v[q->n++];
    memset(r, 0, sizeof *r);
    r->gp = *gp;
    r->gp.tag = q->n - 1;
    return r;
}

/* "1 2 3" (spaces, commas or tabs between) into ids, each below vocab. */
static int parse_ids(const char *s, uint32_t vocab, creq_t *r)
{
    size_t cap = strlen(s) / 2 + 2;
    r->ids = malloc(cap * sizeof *r->ids);
    if (!r->ids) return kvc_cli_error(CMD, "out of memory");
    const char *p = s;
    while (*p) {
        while (*p == ' ' || *p == ',' || *p == '\t') p++;
        if (!*p) break;
        const char *b = p;
        while (*p && *p != ' ' && *p != ',' && *p != '\t') p++;
        char buf[24];
        uint64_t v;
        if ((size_t)(p - b) >= sizeof buf) return kvc_cli_error(CMD, "--prompt-ids: bad id");
        memcpy(buf, b, p - b);
        buf[p - b] = 0;
        if (!kvc_cli_parse_u64(buf, 0, vocab - 1, &v))
            return kvc_cli_error(CMD, "--prompt-ids: '%s' is not a token id below %u", buf, vocab);
        r->ids[r->n_ids++] = (kvc_token_t)v;
    }
    if (!r->n_ids) return kvc_cli_error(CMD, "--prompt-ids: no ids");
    return 0;
}

/* --chat: each prompt becomes a user turn (after --system's message) in this template. */
static struct {
    bool on;
    kvc_chat_template_t t;
    const char *system;
} chat;

static int tokenize(const kvc_tokenizer_t *t, const char *text, size_t len, creq_t *r)
{
    char *rendered = NULL;
    if (chat.on) {
        char *user = strndup(text, len);
        if (!user) return kvc_cli_error(CMD, "out of memory");
        kvc_chat_msg_t msgs[2] = {{"system", chat.system}, {"user", user}};
        const kvc_chat_msg_t *mp = chat.system ? msgs : msgs + 1;
        const size_t nm = chat.system ? 2 : 1;
        size_t need = 0;
        int rc = kvc_chat_render(chat.t, mp, nm, true, NULL, 0, &need);
        if (rc == KVC_ERANGE && (rendered = malloc(need + 1)))
            rc = kvc_chat_render(chat.t, mp, nm, true, rendered, need + 1, &need);
        free(user);
        if (rc) {
            free(rendered);
            return kvc_cli_error(CMD, "cannot render the chat template: %s", kvc_strerror(rc));
        }
        text = rendered, len = need;
    }
    size_t cap = 3 * len + 8, n = 0;
    r->ids = malloc(cap * sizeof *r->ids);
    if (!r->ids) return kvc_cli_error(CMD, "out of memory");
    unsigned flags = KVC_TOK_PARSE_SPECIAL;
    if (kvc_tokenizer_add_bos(t)) flags |= KVC_TOK_ADD_BOS;
    int rc = kvc_tokenizer_encode(t, text, len, flags, r->ids, cap, &n);
    free(rendered);
    if (rc) return kvc_cli_error(CMD, "cannot tokenize the prompt: %s", kvc_strerror(rc));
    if (!n) return kvc_cli_error(CMD, "the prompt is empty");
    r->n_ids = (uint32_t)n;
    return 0;
}

static int add_stop(creq_t *r, const char *s)
{
    if (r->gp.n_stop >= KVC_MAX_STOP)
        return kvc_cli_error(CMD, "at most %d stop strings", KVC_MAX_STOP);
    char *d = strdup(s);
    if (!d) return kvc_cli_error(CMD, "out of memory");
    r->stop_store[r->gp.n_stop] = d;
    r->gp.stop[r->gp.n_stop++] = d;
    return 0;
}

/* A JSON line of --prompts: prompt or prompt_ids, and per-request options. */
static int parse_json_line(const char *line, size_t lineno, const kvc_tokenizer_t *t,
                           uint32_t vocab, creq_t *r)
{
    cJSON *j = cJSON_ParseWithLength(line, strlen(line));
    if (!j || !cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return kvc_cli_error(CMD, "--prompts line %zu: not a JSON object", lineno);
    }
    int rc = 0;
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "prompt");
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(j, "prompt_ids");
    if (cJSON_IsString(p))
        rc = tokenize(t, p->valuestring, strlen(p->valuestring), r);
    else if (cJSON_IsArray(ids)) {
        int n = cJSON_GetArraySize(ids);
        r->ids = malloc((n ? n : 1) * sizeof *r->ids);
        if (!r->ids) rc = kvc_cli_error(CMD, "out of memory");
        for (int i = 0; !rc && i < n; i++) {
            const cJSON *v = cJSON_GetArrayItem(ids, i);
            if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble >= vocab ||
                v->valuedouble != floor(v->valuedouble))
                rc = kvc_cli_error(CMD,
                                   "--prompts line %zu: prompt_ids[%d] is not a token id below %u",
                                   lineno, i, vocab);
            else
                r->ids[r->n_ids++] = (kvc_token_t)v->valuedouble;
        }
        if (!rc && !r->n_ids) rc = kvc_cli_error(CMD, "--prompts line %zu: no prompt ids", lineno);
    } else
        rc = kvc_cli_error(CMD, "--prompts line %zu: needs \"prompt\" (a string) or \"prompt_ids\"",
                           lineno);
#define NUM(key, lo, hi, dst)                                                                      \
    do {                                                                                           \
        const cJSON *v_ = cJSON_GetObjectItemCaseSensitive(j, key);                                \
        if (!rc && v_) {                                                                           \
            if (!cJSON_IsNumber(v_) || !(v_->valuedouble >= (lo) && v_->valuedouble <= (hi)))      \
                rc = kvc_cli_error(CMD, "--prompts line %zu: \"%s\" must be a number in [%g, %g]", \
                                   lineno, key, (double)(lo), (double)(hi));                       \
            else                                                                                   \
                dst = v_->valuedouble;                                                             \
        }                                                                                          \
    } while (0)
    double d;
    d = r->gp.max_tokens;
    NUM("n", 1, 1 << 24, d);
    r->gp.max_tokens = (uint32_t)d;
    d = r->gp.max_tokens;
    NUM("max_tokens", 1, 1 << 24, d);
    r->gp.max_tokens = (uint32_t)d;
    d = r->gp.temperature;
    NUM("temp", 0, 100, d);
    r->gp.temperature = (float)d;
    d = r->gp.temperature;
    NUM("temperature", 0, 100, d);
    r->gp.temperature = (float)d;
    d = r->gp.top_k;
    NUM("top_k", 0, 1 << 24, d);
    r->gp.top_k = (uint32_t)d;
    d = r->gp.top_p;
    NUM("top_p", 0, 1, d);
    r->gp.top_p = (float)d;
    d = r->gp.min_p;
    NUM("min_p", 0, 1, d);
    r->gp.min_p = (float)d;
    d = (double)r->gp.seed;
    NUM("seed", 0, 9007199254740991.0, d);
    r->gp.seed = (uint64_t)d;
    d = r->gp.n_logprobs;
    NUM("logprobs", 0, KVC_MAX_LOGPROBS, d);
    r->gp.n_logprobs = (uint32_t)d;
#undef NUM
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(j, "stop");
    if (!rc && st) {
        if (cJSON_IsString(st))
            rc = add_stop(r, st->valuestring);
        else if (cJSON_IsArray(st)) {
            const cJSON *v;
            cJSON_ArrayForEach(v, st)
            {
                if (rc) break;
                if (!cJSON_IsString(v))
                    rc = kvc_cli_error(CMD, "--prompts line %zu: stop strings", lineno);
                else
                    rc = add_stop(r, v->valuestring);
            }
        } else
            rc = kvc_cli_error(CMD, "--prompts line %zu: \"stop\" is a string or an array", lineno);
    }
    if (!rc && cJSON_GetObjectItemCaseSensitive(j, "logprobs")) r->gp.logprobs = true;
    cJSON_Delete(j);
    return rc;
}

static int read_prompts(const char *path, const kvc_tokenizer_t *t, uint32_t vocab,
                        const kvc_gen_params_t *gp, creqs_t *q)
{
    FILE *f = fopen(path, "rb");
    if (!f) return kvc_cli_error(CMD, "--prompts %s: %s", path, strerror(errno));
    char *line = NULL;
    size_t lcap = 0, lineno = 0;
    ssize_t len;
    int rc = 0;
    while (!rc && (len = getline(&line, &lcap, f)) >= 0) {
        lineno++;
        while (len && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        if (!len) continue;
        if (memchr(line, 0, len)) {
            rc = kvc_cli_error(CMD, "--prompts line %zu: a NUL byte", lineno);
            break;
        }
        creq_t *r = creqs_add(q, gp);
        if (!r)
            rc = kvc_cli_error(CMD, "out of memory");
        else {
            for (uint32_t i = 0; i < gp->n_stop; i++) r->gp.stop[i] = NULL;
            r->gp.n_stop = 0;
            for (uint32_t i = 0; !rc && i < gp->n_stop; i++) rc = add_stop(r, gp->stop[i]);
            if (rc) break;
            if (line[0] == '{')
                rc = parse_json_line(line, lineno, t, vocab, r);
            else
                rc = tokenize(t, line, (size_t)len, r);
        }
    }
    free(line);
    fclose(f);
    if (!rc && !q->n) rc = kvc_cli_error(CMD, "--prompts %s: no prompts", path);
    return rc;
}

/* ---- output ------------------------------------------------------------------------------ */
typedef struct {
    bool stream; /* one request, text to stdout as it comes */
} out_ctx_t;

static void on_event(void *ctx, const kvc_gen_event_t *ev)
{
    out_ctx_t *o = ctx;
    if (o->stream && ev->text_len) {
        fwrite(ev->text, 1, ev->text_len, stdout);
        fflush(stdout);
    }
}

static void json_str(FILE *f, const char *s, size_t n)
{
    fputc('"', f);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c == '\n')
            fputs("\\n", f);
        else if (c == '\r')
            fputs("\\r", f);
        else if (c == '\t')
            fputs("\\t", f);
        else if (c < 0x20 || c == 0x7f)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

static void json_num(FILE *f, double v)
{
    if (isfinite(v))
        fprintf(f, "%.9g", v);
    else
        fputs("null", f);
}

static void print_done(const kvc_gen_done_t *d, uint64_t index, bool spec, bool samples)
{
    printf(
        "{\"id\": %llu, \"prompt_tokens\": %u, \"cached_tokens\": %u, \"completion_tokens\": %u, "
        "\"output_ids\": [",
        (unsigned long long)index, d->prompt_tokens, d->cached_tokens, d->completion_tokens);
    for (uint32_t i = 0; i < d->completion_tokens; i++) printf(i ? ", %d" : "%d", d->output[i]);
    printf("], \"text\": ");
    json_str(stdout, d->text, strlen(d->text));
    printf(", \"finish_reason\": \"%s\", \"ttft_ms\": ", kvc_finish_name(d->finish));
    json_num(stdout, d->first_token_s >= 0 ? (d->first_token_s - d->submit_s) * 1e3 : NAN);
    printf(", \"tpot_ms\": ");
    json_num(stdout, d->completion_tokens > 1
                         ? (d->finish_s - d->first_token_s) * 1e3 / (d->completion_tokens - 1)
                         : NAN);
    printf(", \"logprobs\": ");
    if (!d->logprobs)
        printf("null");
    else {
        printf("[");
        for (uint32_t i = 0; i < d->completion_tokens; i++) {
            printf(i ? ", {\"token\": %d, \"logprob\": " : "{\"token\": %d, \"logprob\": ",
                   d->output[i]);
            json_num(stdout, d->logprobs[i]);
            if (d->n_logprobs) {
                printf(", \"top\": [");
                for (uint32_t k = 0; k < d->n_logprobs; k++) {
                    size_t at = (size_t)i * d->n_logprobs + k;
                    if (d->top_ids[at] < 0) continue;
                    printf(k ? ", [%d, " : "[%d, ", d->top_ids[at]);
                    json_num(stdout, d->top_logprobs[at]);
                    printf("]");
                }
                printf("]");
            }
            printf("}");
        }
        printf("]");
    }
    if (spec)
        printf(", \"draft_tokens\": %u, \"accepted_tokens\": %u", d->draft_tokens,
               d->accepted_tokens);
    if (samples) printf(", \"index\": %u", d->sample_index);
    printf("}\n");
}

/* --beams N: each request's beam search (kvc_llm_beam_search), one after another; the best
 * hypothesis's text, or with --json one object per request with every hypothesis under
 * "beams", then a summary.  Sampling options do not apply; stop ids end hypotheses as EOS
 * does; stop strings, --spec and --no-kv-cache are refused. */
static int run_beams(const kvc_llm_t *m, const creqs_t *q, kvc_beam_params_t *bp,
                     const kvc_engine_params_t *ep, bool json, bool spec)
{
    if (spec || ep->no_kv_cache)
        return kvc_cli_error(CMD, "--beams does not go with --spec or --no-kv-cache");
    bp->n_threads = ep->n_threads;
    bp->kv_dtype = ep->kv_dtype;
    bp->block_size = ep->block_size;
    bp->kv_memory = ep->kv_memory;
    bp->prefix_cache = !ep->no_prefix_cache;
    bp->isa = ep->isa;
    const kvc_tokenizer_t *tok = kvc_llm_tokenizer(m);
    char msg[512], *text = NULL;
    size_t text_cap = 0;
    uint64_t gen_tokens = 0, steps = 0;
    uint32_t peak = 0, n_blocks = 0;
    int rc = 0;
    const double t0 = (double)kvc_now_ns() * 1e-9;
    for (uint32_t i = 0; !rc && i < q->n; i++) {
        const creq_t *r = &q->v[i];
        if (r->gp.n_stop) {
            rc = kvc_cli_error(CMD, "--beams: stop strings are not supported");
            break;
        }
        bp->max_tokens = r->gp.max_tokens;
        bp->ignore_eos = r->gp.ignore_eos;
        bp->n_stop_ids = r->gp.n_stop_ids;
        memcpy(bp->stop_ids, r->gp.stop_ids, sizeof bp->stop_ids);
        kvc_beam_result_t res;
        const double ts = (double)kvc_now_ns() * 1e-9;
        if (kvc_llm_beam_search(m, bp, r->ids, r->n_ids, &res, msg, sizeof msg)) {
            rc = q->n > 1 ? kvc_cli_error(CMD, "request %u: %s", i, msg)
                          : kvc_cli_error(CMD, "%s", msg);
            break;
        }
        const double ms = ((double)kvc_now_ns() * 1e-9 - ts) * 1e3;
        steps += res.steps;
        peak = KVC_MAX(peak, res.peak_blocks);
        n_blocks = res.n_blocks;
        if (json)
            printf("{\"id\": %u, \"prompt_tokens\": %u, \"cached_tokens\": 0, "
                   "\"completion_tokens\": %u, \"output_ids\": [",
                   i, r->n_ids, res.hyps[0].n_ids);
        for (uint32_t h = 0; !rc && h < res.n_hyps; h++) {
            const kvc_beam_hyp_t *hy = &res.hyps[h];
            gen_tokens += hy->n_ids;
            /* the text stops before the EOS or stop id, as the engine's does */
            const uint32_t n_text = hy->n_ids - (hy->finish == KVC_FINISH_STOP);
            size_t nb = 0;
            int drc = kvc_tokenizer_decode(tok, hy->ids, n_text, KVC_TOK_REMOVE_SPECIAL, text,
                                           text_cap, &nb);
            if (drc == KVC_ERANGE || !text) {
                free(text);
                text_cap = nb + 1;
                if (!(text = malloc(text_cap))) {
                    rc = kvc_cli_error(CMD, "out of memory");
                    break;
                }
                drc = kvc_tokenizer_decode(tok, hy->ids, n_text, KVC_TOK_REMOVE_SPECIAL, text,
                                           text_cap, &nb);
            }
            if (drc) {
                rc = kvc_cli_error(CMD, "decode: %s", kvc_strerror(drc));
                break;
            }
            if (!json) {
                printf("%s\n", text);
                break;
            }
            if (h == 0) {
                for (uint32_t k = 0; k < hy->n_ids; k++) printf(k ? ", %d" : "%d", hy->ids[k]);
                printf("], \"text\": ");
                json_str(stdout, text, nb);
                printf(", \"finish_reason\": \"%s\", \"ttft_ms\": ", kvc_finish_name(hy->finish));
                json_num(stdout, ms); /* nothing is emitted before the search ends */
                printf(", \"tpot_ms\": null, \"logprobs\": null, \"beams\": [");
            }
            printf(h ? ", {\"ids\": [" : "{\"ids\": [");
            for (uint32_t k = 0; k < hy->n_ids; k++) printf(k ? ", %d" : "%d", hy->ids[k]);
            printf("], \"text\": ");
            json_str(stdout, text, nb);
            printf(", \"score\": ");
            json_num(stdout, hy->score);
            printf(", \"sum_logprob\": ");
            json_num(stdout, hy->sum_logprob);
            printf(", \"finish_reason\": \"%s\"}", kvc_finish_name(hy->finish));
            if (h + 1 == res.n_hyps) printf("]}\n");
        }
        kvc_beam_result_free(&res);
    }
    free(text);
    const double wall = (double)kvc_now_ns() * 1e-9 - t0;
    if (!rc && json) {
        printf("{\"summary\": true, \"requests\": %u, \"beams\": %u, \"beam_steps\": %llu, "
               "\"prefill_tokens_per_s\": null, \"decode_tokens_per_s\": ",
               q->n, bp->n_beams, (unsigned long long)steps);
        json_num(stdout, wall > 0 ? gen_tokens / wall : NAN);
        printf(", \"wall_s\": ");
        json_num(stdout, wall);
        printf(", \"peak_kv_blocks\": %u, \"kv_blocks\": %u, \"preemptions\": 0}\n", peak,
               n_blocks);
    } else if (!rc)
        fprintf(stderr,
                "kvcache run: %u request(s), %u beams, %llu steps, peak %u of %u KV blocks\n", q->n,
                bp->n_beams, (unsigned long long)steps, peak, n_blocks);
    return rc;
}

int kvc_cmd_run(int argc, char **argv)
{
    const char *model_path = NULL, *prompt = NULL, *prompt_ids = NULL, *prompts = NULL;
    const char *tokenizer_path = NULL, *template_name = NULL;
    memset(&chat, 0, sizeof chat);
    kvc_engine_params_t ep = kvc_engine_params_default();
    kvc_gen_params_t gp = kvc_gen_params_default();
    gp.max_tokens = 128;
    char *stops[KVC_MAX_STOP] = {0};
    bool json = false, spec = false;
    const char *spec_model = NULL;
    bool beams = false;
    kvc_beam_params_t bp = kvc_beam_params_default();
    uint64_t u;
    double d;
    int rc = 0;
    optind = 1;
    opterr = 0;
    int c;
#define U64(name, lo, hi, dst)                                                                  \
    do {                                                                                        \
        if (!kvc_cli_parse_u64(optarg, lo, hi, &u))                                             \
            return kvc_cli_error(CMD, "--%s: '%s' is not a whole number in [%llu, %llu]", name, \
                                 optarg, (unsigned long long)(lo), (unsigned long long)(hi));   \
        dst = u;                                                                                \
    } while (0)
#define DBL(name, lo, hi, dst)                                                                \
    do {                                                                                      \
        if (!kvc_cli_parse_double(optarg, lo, hi, &d))                                        \
            return kvc_cli_error(CMD, "--%s: '%s' is not a number in [%g, %g]", name, optarg, \
                                 (double)(lo), (double)(hi));                                 \
        dst = (float)d;                                                                       \
    } while (0)
    struct option options[KVC_CLI_MAX_OPTIONS];
    if (kvc_cli_join_options(options, KVC_CLI_MAX_OPTIONS, run_options, kvc_cli_engine_options))
        return kvc_cli_error(CMD, "internal: too many options");
    while ((c = getopt_long(argc, argv, "n:h", options, NULL)) != -1) {
        const int eo = kvc_cli_engine_option(&ep, CMD, c, optarg);
        if (eo < 0) return 1;
        if (eo) continue;
        switch (c) {
        case O_MODEL:
            model_path = optarg;
            break;
        case O_PROMPT:
            prompt = optarg;
            break;
        case O_PROMPT_IDS:
            prompt_ids = optarg;
            break;
        case O_PROMPTS:
            prompts = optarg;
            break;
        case 'n':
            U64("n", 1, 1 << 24, gp.max_tokens);
            break;
        case O_TEMP:
            DBL("temp", 0, 100, gp.temperature);
            break;
        case O_TOPK:
            U64("top-k", 0, 1 << 24, gp.top_k);
            break;
        case O_TOPP:
            DBL("top-p", 1e-9, 1, gp.top_p);
            break;
        case O_MINP:
            DBL("min-p", 0, 1, gp.min_p);
            break;
        case O_REP:
            DBL("repeat-penalty", 1e-3, 100, gp.repetition_penalty);
            break;
        case O_PRES:
            DBL("presence-penalty", -2, 2, gp.presence_penalty);
            break;
        case O_FREQ:
            DBL("frequency-penalty", -2, 2, gp.frequency_penalty);
            break;
        case O_SEED:
            U64("seed", 0, UINT64_MAX, gp.seed);
            break;
        case O_STOP:
            if (gp.n_stop >= KVC_MAX_STOP)
                return kvc_cli_error(CMD, "--stop: at most %d", KVC_MAX_STOP);
            if (!optarg[0] || strlen(optarg) > 256)
                return kvc_cli_error(CMD, "--stop: 1 to 256 bytes");
            stops[gp.n_stop] = optarg;
            gp.stop[gp.n_stop++] = optarg;
            break;
        case O_IGNORE_EOS:
            gp.ignore_eos = true;
            break;
        case O_LOGPROBS:
            U64("logprobs", 0, KVC_MAX_LOGPROBS, gp.n_logprobs);
            gp.logprobs = true;
            break;
        case O_N:
            U64("n", 1, KVC_MAX_SAMPLES, gp.n);
            break;
        case O_BEAMS:
            U64("beams", 1, 64, bp.n_beams);
            beams = true;
            break;
        case O_LENGTH_PENALTY:
            DBL("length-penalty", -100, 100, bp.length_penalty);
            break;
        case O_EARLY_STOP:
            bp.early_stopping = true;
            break;
        case O_SPEC:
            if (strcmp(optarg, "ngram"))
                return kvc_cli_error(CMD, "--spec: '%s' is not a draft method (ngram)", optarg);
            spec = true;
            if (!ep.spec_tokens) ep.spec_tokens = 4;
            break;
        case O_SPEC_TOKENS:
            U64("spec-tokens", 1, 16, ep.spec_tokens);
            break;
        case O_SPEC_MODEL:
            spec_model = optarg;
            break;
        case O_CHAT:
            chat.on = true;
            break;
        case O_CHAT_TEMPLATE:
            chat.on = true;
            template_name = optarg;
            if (kvc_chat_template_parse(optarg, &chat.t))
                return kvc_cli_error(
                    CMD,
                    "--chat-template: '%s' is not llama2, llama3, chatml, mistral, "
                    "gemma, phi3 or zephyr",
                    optarg);
            break;
        case O_SYSTEM:
            chat.system = optarg;
            break;
        case O_TOKENIZER:
            tokenizer_path = optarg;
            break;
        case O_JSON:
            json = true;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            return kvc_cli_getopt_error(CMD, argv, O_MODEL);
        }
    }
#undef U64
#undef DBL
    if (optind < argc) return kvc_cli_error(CMD, "unexpected argument '%s'", argv[optind]);
    if (!model_path) return kvc_cli_error(CMD, "--model FILE is required (see --help)");
    if (!!prompt + !!prompt_ids + !!prompts != 1)
        return kvc_cli_error(CMD, "give exactly one of --prompt, --prompt-ids, --prompts");
    if (ep.block_size & (ep.block_size - 1))
        return kvc_cli_error(CMD, "--block-size: a power of two");
    if (spec && spec_model)
        return kvc_cli_error(CMD, "--spec ngram and --spec-model do not go together");
    if (spec_model) {
        spec = true;
        if (!ep.spec_tokens) ep.spec_tokens = 4;
    }
    if (spec && ep.no_kv_cache)
        return kvc_cli_error(CMD, "--spec and --no-kv-cache do not go together");
    if (!spec) ep.spec_tokens = 0;

    if (chat.system && !chat.on) return kvc_cli_error(CMD, "--system needs --chat");
    if (chat.on && prompt_ids) return kvc_cli_error(CMD, "--chat takes text, not --prompt-ids");

    char msg[512];
    kvc_llm_t *m = NULL;
    if (kvc_cli_load_model(CMD, model_path, tokenizer_path, &m)) return 1;
    if (chat.on && !template_name) {
        int crc = kvc_chat_template_from_gguf(kvc_llm_gguf(m), &chat.t);
        if (crc) {
            kvc_llm_free(m);
            return kvc_cli_error(CMD, crc == KVC_ENOENT
                                          ? "--chat: the model has no chat template; pass "
                                            "--chat-template NAME"
                                          : "--chat: the model's chat template is not one kvcache "
                                            "knows; pass --chat-template NAME");
        }
    }
    kvc_llm_t *dm = NULL; /* --spec-model's draft model */
    if (spec_model) {
        if ((rc = kvc_llm_load(spec_model, &dm, msg, sizeof msg))) {
            kvc_llm_free(m);
            return kvc_cli_error(CMD, "--spec-model %s: %s", spec_model, msg);
        }
        ep.draft_model = dm;
    }
    const kvc_tokenizer_t *tok = kvc_llm_tokenizer(m);
    const uint32_t vocab = kvc_llm_hparams(m)->vocab;

    creqs_t q = {0};
    kvc_engine_t *e = NULL;
    if (prompts)
        rc = read_prompts(prompts, tok, vocab, &gp, &q);
    else {
        creq_t *r = creqs_add(&q, &gp);
        if (!r)
            rc = kvc_cli_error(CMD, "out of memory");
        else {
            for (uint32_t i = 0; i < KVC_MAX_STOP; i++) r->gp.stop[i] = NULL;
            r->gp.n_stop = 0;
            for (uint32_t i = 0; !rc && i < gp.n_stop; i++) rc = add_stop(r, stops[i]);
            if (!rc)
                rc = prompt ? tokenize(tok, prompt, strlen(prompt), r)
                            : parse_ids(prompt_ids, vocab, r);
        }
    }
    if (!rc && beams) {
        rc = run_beams(m, &q, &bp, &ep, json, spec);
        creqs_free(&q);
        kvc_llm_free(dm);
        kvc_llm_free(m);
        return rc ? 1 : 0;
    }
    if (!rc && !ep.kv_memory) {
        /* no size given: room for every request at once (prompt + output, in blocks), so
         * nothing is preempted, and no more (the pool is allocated and zeroed up front) */
        const kvc_model_hparams_t *h = kvc_llm_hparams(m);
        const uint32_t bs = ep.block_size ? ep.block_size : 16;
        const uint32_t ctx =
            ep.max_ctx ? ep.max_ctx : (uint32_t)KVC_MIN(h->ctx ? h->ctx : 2048, 32768);
        uint64_t blocks = 0;
        for (uint32_t i = 0; i < q.n; i++) {
            uint64_t t =
                KVC_MIN((uint64_t)q.v[i].n_ids + q.v[i].gp.max_tokens + ep.spec_tokens, ctx);
            blocks += (t + bs - 1) / bs + 1;
        }
        const uint64_t per_block = (uint64_t)kvc_dtype_bytes(ep.kv_dtype) * 2 * h->n_layers *
                                   h->n_kv_heads * h->head_dim * bs;
        ep.kv_memory = (blocks + 8) * (per_block + 64);
    }
    if (!rc && kvc_engine_create(m, &ep, &e, msg, sizeof msg)) rc = kvc_cli_error(CMD, "%s", msg);
    for (uint32_t i = 0; !rc && i < q.n; i++)
        if (kvc_engine_submit(e, q.v[i].ids, q.v[i].n_ids, &q.v[i].gp, &q.v[i].id, msg, sizeof msg))
            rc = q.n > 1 ? kvc_cli_error(CMD, "request %u: %s", i, msg)
                         : kvc_cli_error(CMD, "%s", msg);

    out_ctx_t oc = {.stream = !json && q.n == 1 && q.v[0].gp.n <= 1};
    uint32_t n_left = 0;
    for (uint32_t i = 0; !rc && i < q.n; i++) n_left += q.v[i].gp.n ? q.v[i].gp.n : 1;
    double now = 0;
    const double t_start = (double)kvc_now_ns() * 1e-9;
    while (!rc && n_left) {
        bool idle = false;
        int e_rc = kvc_engine_step(e, now, on_event, &oc, &idle);
        now += 1e-3;
        if (e_rc) {
            rc = kvc_cli_error(CMD, "engine step failed: %s", kvc_strerror(e_rc));
            break;
        }
        const kvc_gen_done_t *done;
        uint32_t n_done;
        kvc_engine_finished(e, &done, &n_done);
        for (uint32_t i = 0; i < n_done; i++) {
            n_left--;
            if (json)
                print_done(&done[i], done[i].tag, spec, gp.n > 1);
            else if (oc.stream)
                printf("\n");
            else
                printf("[%llu] (%u prompt tokens, %u from the prefix cache) %s\n",
                       (unsigned long long)done[i].tag, done[i].prompt_tokens,
                       done[i].cached_tokens, done[i].text);
            if (done[i].finish == KVC_FINISH_ERROR)
                rc = kvc_cli_error(CMD, "request %llu failed", (unsigned long long)done[i].tag);
        }
        if (idle && n_left && !n_done) {
            rc = kvc_cli_error(CMD, "no progress: the requests cannot be scheduled");
            break;
        }
    }
    const double t_total = (double)kvc_now_ns() * 1e-9 - t_start;
    if (!rc) {
        kvc_engine_stats_t st;
        kvc_engine_stats(e, &st);
        if (json) {
            printf("{\"summary\": true, \"requests\": %u, \"prefill_tokens\": %llu, "
                   "\"decode_tokens\": %llu, \"prefill_tokens_per_s\": ",
                   q.n, (unsigned long long)st.prefill_tokens,
                   (unsigned long long)st.decode_tokens);
            json_num(stdout, st.prefill_s > 0 ? st.prefill_tokens / st.prefill_s : NAN);
            printf(", \"decode_tokens_per_s\": ");
            json_num(stdout, st.decode_s > 0 ? st.decode_tokens / st.decode_s : NAN);
            printf(", \"wall_s\": ");
            json_num(stdout, t_total);
            printf(", \"kv_bytes_per_token\": %llu, \"peak_kv_blocks\": %u, \"kv_blocks\": %u, "
                   "\"block_size\": %u, \"preemptions\": %llu, \"cached_tokens\": %llu",
                   (unsigned long long)st.kv_bytes_per_token, st.peak_blocks, st.n_blocks,
                   st.block_size, (unsigned long long)st.preemptions,
                   (unsigned long long)st.hit_tokens);
            if (spec)
                printf(", \"draft_tokens\": %llu, \"accepted_tokens\": %llu",
                       (unsigned long long)st.draft_tokens, (unsigned long long)st.accepted_tokens);
            if (spec_model)
                printf(", \"draft_computed_tokens\": %llu",
                       (unsigned long long)st.draft_computed_tokens);
            if (kvc_engine_n_tiers(e)) {
                printf(", \"tiers\": [");
                for (uint32_t i = 0; i < kvc_engine_n_tiers(e); i++) {
                    kvc_engine_tier_stats_t ts;
                    if (kvc_engine_tier_stats(e, i, &ts)) continue;
                    printf("%s{\"kind\": \"%s\", \"mode\": \"%s\", \"hits\": %llu, "
                           "\"misses\": %llu, \"fetched_blocks\": %llu, \"recompute_blocks\": "
                           "%llu, \"fetch_failed_blocks\": %llu, \"offloaded_blocks\": %llu, "
                           "\"written_through_blocks\": %llu, \"faults\": %llu, \"corrupt\": "
                           "%llu, \"latency_s\": %.9g, \"bandwidth_Bps\": %.9g}",
                           i ? ", " : "", kvc_tier_kind_name(ts.kind), kvc_tier_mode_name(ts.mode),
                           (unsigned long long)ts.store.n_hits,
                           (unsigned long long)ts.store.n_misses,
                           (unsigned long long)ts.fetched_blocks,
                           (unsigned long long)ts.recompute_blocks,
                           (unsigned long long)ts.fetch_failed_blocks,
                           (unsigned long long)ts.offloaded_blocks,
                           (unsigned long long)ts.written_through_blocks,
                           (unsigned long long)ts.store.n_faults,
                           (unsigned long long)(ts.store.n_corrupt + ts.store.n_mismatch),
                           ts.latency_s, ts.bandwidth_Bps);
                }
                printf("]");
            }
            printf("}\n");
        } else {
            fflush(stdout); /* the text first, then the account */
            fprintf(stderr,
                    "kvcache run: %u request(s), prefill %llu tokens at %.1f tok/s, decode %llu "
                    "tokens at %.1f tok/s, %llu prompt tokens from the prefix cache, peak %u of "
                    "%u KV blocks, %llu preemptions\n",
                    q.n, (unsigned long long)st.prefill_tokens,
                    st.prefill_s > 0 ? st.prefill_tokens / st.prefill_s : 0.0,
                    (unsigned long long)st.decode_tokens,
                    st.decode_s > 0 ? st.decode_tokens / st.decode_s : 0.0,
                    (unsigned long long)st.hit_tokens, st.peak_blocks, st.n_blocks,
                    (unsigned long long)st.preemptions);
            for (uint32_t i = 0; i < kvc_engine_n_tiers(e); i++) {
                kvc_engine_tier_stats_t ts;
                if (kvc_engine_tier_stats(e, i, &ts)) continue;
                fprintf(stderr,
                        "kvcache run: tier %u %s (%s): %llu hits, %llu misses, %llu blocks "
                        "fetched, %llu recomputes chosen, %llu fetches failed, %llu offloaded, "
                        "%llu written through, %llu faults, %llu corrupt\n",
                        i, kvc_tier_kind_name(ts.kind), kvc_tier_mode_name(ts.mode),
                        (unsigned long long)ts.store.n_hits, (unsigned long long)ts.store.n_misses,
                        (unsigned long long)ts.fetched_blocks,
                        (unsigned long long)ts.recompute_blocks,
                        (unsigned long long)ts.fetch_failed_blocks,
                        (unsigned long long)ts.offloaded_blocks,
                        (unsigned long long)ts.written_through_blocks,
                        (unsigned long long)ts.store.n_faults,
                        (unsigned long long)(ts.store.n_corrupt + ts.store.n_mismatch));
            }
        }
    }
    kvc_engine_destroy(e);
    creqs_free(&q);
    kvc_llm_free(dm);
    kvc_llm_free(m);
    return rc ? 1 : 0;
}
