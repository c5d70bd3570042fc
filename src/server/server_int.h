/* server_int.h - what the server layer's files share: the request parser (request.c), the
 * tenants file (tenants.c) and UTF-8 helpers.  Nothing here touches HTTP or the engine, so
 * the fuzz target and the tests drive it directly. */
#ifndef KVC_SERVER_INT_H
#define KVC_SERVER_INT_H

#include "kvcache/engine.h"
#include "kvcache/chat.h"
#include "kvcache/prefix.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- UTF-8 ---- */
/* True if s[0..n) is well-formed UTF-8 (no overlong forms, surrogates or code points past
 * U+10FFFF). */
bool kvc__srv_utf8_valid(const char *s, size_t n);
/* Length of the longest prefix of s[0..n) that is well-formed UTF-8 and ends at a
 * character boundary. */
size_t kvc__srv_utf8_prefix(const char *s, size_t n);

/* ---- errors in OpenAI's shape ---- */
typedef struct {
    int status;       /* HTTP status: 400, 401, 404, 413, 429, 503, 500 */
    const char *type; /* "invalid_request_error", ... (static) */
    const char *code; /* NULL or a static string */
    char param[64];   /* "" or the field */
    char message[320];
} kvc__srv_err_t;

/* Fill e and return -1 (the parser's failure), so a check reads `return srv_err(...)`. */
int kvc__srv_err(kvc__srv_err_t *e, int status, const char *param, const char *code,
                 const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* ---- one request's body, parsed and checked ---- */
typedef struct {
    char *text;       /* a text prompt (NUL-terminated, valid UTF-8), or NULL */
    kvc_token_t *ids; /* a token-id prompt (n_ids), or NULL */
    uint32_t n_ids;
} kvc__srv_prompt_t;

typedef struct {
    char *role, *content;
} kvc__srv_msg_t;

#define KVC_SRV_MAX_PROMPTS 64 /* prompts in one completions request */

typedef struct {
    bool chat, stream, include_usage;
    bool return_token_ids; /* vLLM's extension: each choice carries its output's token ids */
    char *model;
    kvc__srv_prompt_t *prompts; /* completions: (n_prompts) */
    uint32_t n_prompts;
    kvc__srv_msg_t *msgs; /* chat: (n_msgs) */
    uint32_t n_msgs;
    kvc_gen_params_t gp; /* sampling; gp.stop[] point into stops[] */
    char *stops[KVC_MAX_STOP];
    bool max_tokens_given;
    uint64_t max_tokens; /* as asked (the server checks it against its limit) */
    uint32_t n;          /* choices per prompt */
    bool logprobs;       /* chat: logprobs true; completions: logprobs given */
    uint32_t top_logprobs;
    char *user, *cache_salt;
} kvc__srv_req_t;

/* Parse a request body (len bytes, not NUL-terminated) of /v1/chat/completions (chat) or
 * /v1/completions.  Unknown fields are ignored; a field of the wrong type or out of range is
 * a 400 naming it.  0 on success (*out filled: free it with kvc__srv_req_free), or -1 with *e
 * filled and *out holding nothing.  vocab: token ids must be below it (0: any id >= 0). */
int kvc__srv_parse(const char *body, size_t len, bool chat, uint32_t vocab, kvc__srv_req_t *out,
                   kvc__srv_err_t *e);
void kvc__srv_req_free(kvc__srv_req_t *r);

/* ---- tenants ---- */
typedef struct {
    char *name;
    kvc_namespace_t ns; /* its cache salt (all zero: the shared cache) */
    bool shared;
    uint64_t kv_token_quota; /* KV tokens its in-flight requests may hold (0: no limit) */
    uint32_t priority;       /* scheduler class */
    uint32_t max_prompt_tokens, max_concurrent; /* 0: no limit */
    /* live state and counters (the server's event thread only) */
    uint32_t in_flight;
    uint64_t kv_tokens;
    uint64_t requests, rejected, prompt_tokens, cached_tokens, generation_tokens;
} kvc__srv_tenant_t;

typedef struct {
    kvc__srv_tenant_t *tenants;
    uint32_t n_tenants;
    struct {
        char *key;
        uint32_t tenant;
    } * keys;
    uint32_t n_keys;
} kvc__srv_tenants_t;

/* Parse the tenants file's JSON text: an object of API key -> {"tenant": NAME, "cache":
 * "isolated" | "shared", "cache_salt": S, "kv_token_quota": N, "priority": P,
 * "max_prompt_tokens": N, "max_concurrent": N}.  Several keys may name one tenant (with the
 * same settings).  0, or KVC_EPARSE (named in msg), KVC_ENOMEM; on an error *out holds
 * nothing. */
int kvc__srv_tenants_parse(const char *json, size_t len, kvc__srv_tenants_t *out, char *msg,
                           size_t cap);
void kvc__srv_tenants_free(kvc__srv_tenants_t *t);
/* The tenant of an API key, or -1. */
int kvc__srv_tenants_find(const kvc__srv_tenants_t *t, const char *key, size_t len);

#endif
