/* request.c - the server's request parser: an OpenAI completions or chat completions body
 * into a checked request, or a 400 that names the field.  All or nothing: on an error nothing
 * stays allocated.  No HTTP and no engine here, so fuzz_server_request drives it directly. */
#include "server_int.h"

#include "kvcache/sched.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- UTF-8 ---------------------------------------------------------------------------- */
/* Bytes of the well-formed character at s[0..n), or 0. */
static size_t utf8_char(const unsigned char *s, size_t n)
{
    const unsigned c = s[0];
    if (c < 0x80) return 1;
    size_t len;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F; /* no surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else
        return 0;
    if (n < len) return 0;
    if (s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < len; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    return len;
}

bool kvc__srv_utf8_valid(const char *s, size_t n)
{
    return kvc__srv_utf8_prefix(s, n) == n;
}

size_t kvc__srv_utf8_prefix(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        size_t l = utf8_char(u + i, n - i);
        if (!l) break;
        i += l;
    }
    return i;
}

int kvc__srv_err(kvc__srv_err_t *e, int status, const char *param, const char *code,
                 const char *fmt, ...)
{
    e->status = status;
    e->type = status == 401   ? "authentication_error"
              : status == 404 ? "not_found_error"
              : status == 429 ? "rate_limit_error"
              : status >= 500 ? "server_error"
                              : "invalid_request_error";
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

/* ---- fields --------------------------------------------------------------------------- */
static const cJSON *field(const cJSON *j, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, name);
    return v && cJSON_IsNull(v) ? NULL : v; /* null means "not given", as OpenAI reads it */
}

static bool is_int(const cJSON *v)
{
    return cJSON_IsNumber(v) && isfinite(v->valuedouble) && v->valuedouble == floor(v->valuedouble);
}

/* A number field in [lo, hi]; absent leaves *dst. */
static int num(const cJSON *j, const char *name, double lo, double hi, double *dst,
               kvc__srv_err_t *e)
{
    const cJSON *v = field(j, name);
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return kvc__srv_err(e, 400, name, "invalid_type", "'%s' must be a number", name);
    if (!(v->valuedouble >= lo && v->valuedouble <= hi))
        return kvc__srv_err(e, 400, name, "invalid_value", "'%s' must be in [%g, %g]; got %g", name,
                            lo, hi, v->valuedouble);
    *dst = v->valuedouble;
    return 0;
}

/* A whole-number field in [lo, hi]. */
static int integer(const cJSON *j, const char *name, double lo, double hi, double *dst,
                   kvc__srv_err_t *e)
{
    const cJSON *v = field(j, name);
    if (!v) return 0;
    if (!is_int(v))
        return kvc__srv_err(e, 400, name, "invalid_type", "'%s' must be an integer", name);
    return num(j, name, lo, hi, dst, e);
}

static int boolean(const cJSON *j, const char *name, bool *dst, kvc__srv_err_t *e)
{
    const cJSON *v = field(j, name);
    if (!v) return 0;
    if (!cJSON_IsBool(v))
        return kvc__srv_err(e, 400, name, "invalid_type", "'%s' must be a boolean", name);
    *dst = cJSON_IsTrue(v);
    return 0;
}

static int string(const cJSON *j, const char *name, char **dst, kvc__srv_err_t *e)
{
    const cJSON *v = field(j, name);
    if (!v) return 0;
    if (!cJSON_IsString(v))
        return kvc__srv_err(e, 400, name, "invalid_type", "'%s' must be a string", name);
    if (!(*dst = strdup(v->valuestring))) return kvc__srv_err(e, 500, NULL, NULL, "out of memory");
    return 0;
}

/* One token-id array into p. */
static int id_array(const cJSON *a, uint32_t vocab, kvc__srv_prompt_t *p, kvc__srv_err_t *e)
{
    const int n = cJSON_GetArraySize(a);
    if (n <= 0) return kvc__srv_err(e, 400, "prompt", "invalid_value", "'prompt' is empty");
    if (!(p->ids = malloc((size_t)n * sizeof *p->ids)))
        return kvc__srv_err(e, 500, NULL, NULL, "out of memory");
    const cJSON *v;
    cJSON_ArrayForEach(v, a)
    {
        if (!is_int(v) || v->valuedouble < 0 || v->valuedouble >= (vocab ? vocab : 2147483647.0))
            return kvc__srv_err(e, 400, "prompt", "invalid_value",
                                "'prompt' token ids must be integers in [0, %u)",
                                vocab ? vocab : 2147483647u);
        p->ids[p->n_ids++] = (kvc_token_t)v->valuedouble;
    }
    return 0;
}

static int prompt_item(const cJSON *v, uint32_t vocab, kvc__srv_prompt_t *p, kvc__srv_err_t *e)
{
    if (cJSON_IsString(v)) {
        if (!(p->text = strdup(v->valuestring)))
            return kvc__srv_err(e, 500, NULL, NULL, "out of memory");
        return 0;
    }
    if (cJSON_IsArray(v)) return id_array(v, vocab, p, e);
    return kvc__srv_err(e, 400, "prompt", "invalid_type",
                        "'prompt' must be a string, an array of strings, an array of token ids "
                        "or an array of token-id arrays");
}

static int parse_prompt(const cJSON *j, uint32_t vocab, kvc__srv_req_t *r, kvc__srv_err_t *e)
{
    const cJSON *p = field(j, "prompt");
    if (!p)
        return kvc__srv_err(e, 400, "prompt", "missing_required_parameter", "'prompt' is required");
    uint32_t n = 1;
    bool list = false; /* an array of prompts (strings or id arrays), not one id array */
    if (cJSON_IsArray(p)) {
        const int sz = cJSON_GetArraySize(p);
        if (sz <= 0) return kvc__srv_err(e, 400, "prompt", "invalid_value", "'prompt' is empty");
        const cJSON *first = cJSON_GetArrayItem(p, 0);
        if (cJSON_IsString(first) || cJSON_IsArray(first)) {
            list = true;
            if (sz > KVC_SRV_MAX_PROMPTS)
                return kvc__srv_err(e, 400, "prompt", "invalid_value",
                                    "at most %d prompts per request", KVC_SRV_MAX_PROMPTS);
            n = (uint32_t)sz;
        }
    } else if (!cJSON_IsString(p))
        return prompt_item(p, vocab, &(kvc__srv_prompt_t){0}, e);
    if (!(r->prompts = calloc(n, sizeof *r->prompts)))
        return kvc__srv_err(e, 500, NULL, NULL, "out of memory");
    r->n_prompts = n;
    if (!list) return prompt_item(p, vocab, &r->prompts[0], e);
    uint32_t i = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, p)
    {
        if (!cJSON_IsString(v) && !cJSON_IsArray(v))
            return kvc__srv_err(e, 400, "prompt", "invalid_type",
                                "'prompt' array items must all be strings or all token-id arrays");
        if (prompt_item(v, vocab, &r->prompts[i++], e)) return -1;
    }
    return 0;
}

/* A message's content: a string, or an array of {"type": "text", "text": ...} parts. */
static int content_text(const cJSON *c, char **out, kvc__srv_err_t *e)
{
    if (!c) {
        *out = strdup("");
    } else if (cJSON_IsString(c)) {
        *out = strdup(c->valuestring);
    } else if (cJSON_IsArray(c)) {
        size_t len = 0;
        const cJSON *part;
        cJSON_ArrayForEach(part, c)
        {
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(part, "type");
            const cJSON *x = cJSON_GetObjectItemCaseSensitive(part, "text");
            if (!cJSON_IsObject(part) || !cJSON_IsString(t) || strcmp(t->valuestring, "text") ||
                !cJSON_IsString(x))
                return kvc__srv_err(e, 400, "messages", "invalid_value",
                                    "message content parts must be {\"type\": \"text\", "
                                    "\"text\": ...} (no other modality is supported)");
            len += strlen(x->valuestring);
        }
        if ((*out = malloc(len + 1))) {
            size_t at = 0;
            cJSON_ArrayForEach(part, c)
            {
                const char *x = cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring;
                memcpy(*out + at, x, strlen(x));
                at += strlen(x);
            }
            (*out)[at] = 0;
        }
    } else
        return kvc__srv_err(e, 400, "messages", "invalid_type",
                            "message 'content' must be a string or an array of text parts");
    if (!*out) return kvc__srv_err(e, 500, NULL, NULL, "out of memory");
    return 0;
}

static int parse_messages(const cJSON *j, kvc__srv_req_t *r, kvc__srv_err_t *e)
{
    const cJSON *m = field(j, "messages");
    if (!m)
        return kvc__srv_err(e, 400, "messages", "missing_required_parameter",
                            "'messages' is required");
    if (!cJSON_IsArray(m))
        return kvc__srv_err(e, 400, "messages", "invalid_type", "'messages' must be an array");
    const int n = cJSON_GetArraySize(m);
    if (n <= 0) return kvc__srv_err(e, 400, "messages", "invalid_value", "'messages' is empty");
    if (n > 4096) return kvc__srv_err(e, 400, "messages", "invalid_value", "too many messages");
    if (!(r->msgs = calloc((size_t)n, sizeof *r->msgs)))
        return kvc__srv_err(e, 500, NULL, NULL, "out of memory");
    const cJSON *v;
    cJSON_ArrayForEach(v, m)
    {
        const cJSON *role = cJSON_IsObject(v) ? cJSON_GetObjectItemCaseSensitive(v, "role") : NULL;
        if (!cJSON_IsString(role))
            return kvc__srv_err(e, 400, "messages", "invalid_type",
                                "messages[%u] must be an object with a string 'role'", r->n_msgs);
        const char *rn = role->valuestring;
        if (!strcmp(rn, "developer")) rn = "system"; /* OpenAI's newer name for it */
        if (strcmp(rn, "system") && strcmp(rn, "user") && strcmp(rn, "assistant"))
            return kvc__srv_err(e, 400, "messages", "invalid_value",
                                "messages[%u].role must be system, user or assistant", r->n_msgs);
        kvc__srv_msg_t *msg = &r->msgs[r->n_msgs++];
        if (!(msg->role = strdup(rn))) return kvc__srv_err(e, 500, NULL, NULL, "out of memory");
        if (content_text(field(v, "content"), &msg->content, e)) return -1;
    }
    return 0;
}

static int parse_stop(const cJSON *j, kvc__srv_req_t *r, kvc__srv_err_t *e)
{
    const cJSON *s = field(j, "stop");
    if (!s) return 0;
    const cJSON *one = cJSON_IsString(s) ? s : NULL;
    if (!one && !cJSON_IsArray(s))
        return kvc__srv_err(e, 400, "stop", "invalid_type",
                            "'stop' must be a string or an array of strings");
    if (!one && cJSON_GetArraySize(s) > KVC_MAX_STOP)
        return kvc__srv_err(e, 400, "stop", "invalid_value", "at most %d stop strings",
                            KVC_MAX_STOP);
    const cJSON *v = one ? one : s->child;
    for (; v; v = one ? NULL : v->next) {
        if (!cJSON_IsString(v))
            return kvc__srv_err(e, 400, "stop", "invalid_type", "'stop' items must be strings");
        const size_t l = strlen(v->valuestring);
        if (!l) continue; /* an empty stop string stops nothing */
        if (l > 256)
            return kvc__srv_err(e, 400, "stop", "invalid_value", "stop strings: at most 256 bytes");
        char *d = strdup(v->valuestring);
        if (!d) return kvc__srv_err(e, 500, NULL, NULL, "out of memory");
        r->stops[r->gp.n_stop] = d;
        r->gp.stop[r->gp.n_stop++] = d;
    }
    return 0;
}

void kvc__srv_req_free(kvc__srv_req_t *r)
{
    if (!r) return;
    for (uint32_t i = 0; i < r->n_prompts; i++) free(r->prompts[i].text), free(r->prompts[i].ids);
    free(r->prompts);
    for (uint32_t i = 0; i < r->n_msgs; i++) free(r->msgs[i].role), free(r->msgs[i].content);
    free(r->msgs);
    for (uint32_t i = 0; i < KVC_MAX_STOP; i++) free(r->stops[i]);
    free(r->model), free(r->user), free(r->cache_salt);
    memset(r, 0, sizeof *r);
}

static int parse_fields(const cJSON *j, bool chat, uint32_t vocab, kvc__srv_req_t *r,
                        kvc__srv_err_t *e)
{
    const cJSON *model = field(j, "model");
    if (!model)
        return kvc__srv_err(e, 400, "model", "missing_required_parameter", "'model' is required");
    if (string(j, "model", &r->model, e)) return -1;
    if (chat ? parse_messages(j, r, e) : parse_prompt(j, vocab, r, e)) return -1;
    double d;
    d = 16;
    if (integer(j, "max_tokens", 1, 4294967295.0, &d, e)) return -1;
    if (field(j, "max_tokens")) r->max_tokens_given = true, r->max_tokens = (uint64_t)d;
    if (integer(j, "max_completion_tokens", 1, 4294967295.0, &d, e)) return -1;
    if (field(j, "max_completion_tokens")) r->max_tokens_given = true, r->max_tokens = (uint64_t)d;
    d = 1;
    if (num(j, "temperature", 0, 2, &d, e)) return -1;
    r->gp.temperature = (float)d;
    d = 1;
    if (num(j, "top_p", 0, 1, &d, e)) return -1;
    if (d <= 0) return kvc__srv_err(e, 400, "top_p", "invalid_value", "'top_p' must be in (0, 1]");
    r->gp.top_p = (float)d;
    d = 0;
    if (integer(j, "top_k", -1, 1 << 24, &d, e)) return -1;
    r->gp.top_k = d < 0 ? 0 : (uint32_t)d;
    d = 0;
    if (num(j, "min_p", 0, 1, &d, e)) return -1;
    r->gp.min_p = (float)d;
    d = 1;
    if (num(j, "repetition_penalty", 1e-3, 100, &d, e)) return -1;
    r->gp.repetition_penalty = (float)d;
    d = 0;
    if (num(j, "presence_penalty", -2, 2, &d, e)) return -1;
    r->gp.presence_penalty = (float)d;
    d = 0;
    if (num(j, "frequency_penalty", -2, 2, &d, e)) return -1;
    r->gp.frequency_penalty = (float)d;
    d = 0;
    /* JSON numbers past 2^53 are not exact in cJSON: a seed must be below it */
    if (integer(j, "seed", -9007199254740991.0, 9007199254740991.0, &d, e)) return -1;
    r->gp.seed = d < 0 ? (uint64_t)(int64_t)d : (uint64_t)d;
    d = 1;
    if (integer(j, "n", 1, KVC_MAX_SAMPLES, &d, e)) return -1;
    r->n = (uint32_t)d;
    if (parse_stop(j, r, e)) return -1;
    if (chat) {
        if (boolean(j, "logprobs", &r->logprobs, e)) return -1;
        d = 0;
        if (integer(j, "top_logprobs", 0, KVC_MAX_LOGPROBS, &d, e)) return -1;
        r->top_logprobs = (uint32_t)d;
        if (r->top_logprobs && !r->logprobs)
            return kvc__srv_err(e, 400, "top_logprobs", "invalid_value",
                                "'top_logprobs' needs 'logprobs': true");
    } else {
        d = -1;
        if (integer(j, "logprobs", 0, KVC_MAX_LOGPROBS, &d, e)) return -1;
        if (d >= 0) r->logprobs = true, r->top_logprobs = (uint32_t)d;
    }
    r->gp.logprobs = r->logprobs;
    r->gp.n_logprobs = r->top_logprobs;
    if (boolean(j, "stream", &r->stream, e)) return -1;
    const cJSON *so = field(j, "stream_options");
    if (so) {
        if (!cJSON_IsObject(so))
            return kvc__srv_err(e, 400, "stream_options", "invalid_type",
                                "'stream_options' must be an object");
        if (boolean(so, "include_usage", &r->include_usage, e)) return -1;
    }
    if (boolean(j, "return_token_ids", &r->return_token_ids, e)) return -1;
    bool ignore_eos = false;
    if (boolean(j, "ignore_eos", &ignore_eos, e)) return -1;
    r->gp.ignore_eos = ignore_eos;
    if (string(j, "user", &r->user, e)) return -1;
    if (string(j, "cache_salt", &r->cache_salt, e)) return -1;
    if (r->cache_salt && !r->cache_salt[0])
        return kvc__srv_err(e, 400, "cache_salt", "invalid_value", "'cache_salt' is empty");
    d = 0;
    if (integer(j, "priority", 0, KVC_MAX_CLASSES - 1, &d, e)) return -1;
    r->gp.priority = (uint32_t)d;
    return 0;
}

int kvc__srv_parse(const char *body, size_t len, bool chat, uint32_t vocab, kvc__srv_req_t *out,
                   kvc__srv_err_t *e)
{
    memset(out, 0, sizeof *out);
    memset(e, 0, sizeof *e);
    out->gp = kvc_gen_params_default();
    out->chat = chat;
    if (!body || !len) return kvc__srv_err(e, 400, NULL, NULL, "the request has no body");
    if (!kvc__srv_utf8_valid(body, len))
        return kvc__srv_err(e, 400, NULL, "invalid_encoding", "the body is not valid UTF-8");
    cJSON *j = cJSON_ParseWithLength(body, len);
    if (!j) return kvc__srv_err(e, 400, NULL, "invalid_json", "the body is not valid JSON");
    int rc = cJSON_IsObject(j)
                 ? parse_fields(j, chat, vocab, out, e)
                 : kvc__srv_err(e, 400, NULL, "invalid_json", "the body must be a JSON object");
    cJSON_Delete(j);
    if (rc) kvc__srv_req_free(out);
    return rc;
}
