/* test_server.c - the server layer end to end: a server on 127.0.0.1 (an ephemeral port) in
 * this process, its engine's step loop on its own thread, driven over real sockets by a
 * small HTTP client here.  Outputs are compared with the engine run directly on the same
 * model (batch invariance makes that exact, whatever the concurrency); disconnects, slow
 * clients, limits, tenants and the metrics are checked against what they must do. */
#include "test_helpers.h"

#include "kvcache/engine.h"
#include "kvcache/server.h"
#include "server/server_int.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#define STORIES KVC_DATA_DIR "/models/stories260K.gguf"

static kvc_llm_t *g_model;

/* ---- a server on its own thread ------------------------------------------------------- */
typedef struct {
    kvc_server_t *s;
    pthread_t th;
    uint16_t port;
    int run_rc;
} srv_t;

static void *srv_main(void *arg)
{
    srv_t *t = arg;
    t->run_rc = kvc_server_run(t->s);
    return NULL;
}

static void log_to_stderr(void *ctx, const char *line)
{
    (void)ctx;
    fprintf(stderr, "server: %s\n", line);
}

static void srv_start_with(srv_t *t, kvc_server_params_t sp, kvc_engine_params_t ep)
{
    if (getenv("KVC_TEST_SERVER_LOG")) sp.log = log_to_stderr; /* for debugging */
    char msg[256];
    sp.port = 0;
    sp.drain_timeout_s = 10;
    sp.model_name = "stories";
    if (!sp.has_chat_template) sp.has_chat_template = true, sp.chat_template = KVC_CHAT_LLAMA2;
    int rc = kvc_server_create(g_model, &ep, &sp, &t->s, msg, sizeof msg);
    if (rc) fail_msg("kvc_server_create: %s", msg);
    t->port = kvc_server_port(t->s);
    assert_true(t->port > 0);
    assert_int_equal(pthread_create(&t->th, NULL, srv_main, t), 0);
}

static kvc_engine_params_t engine_params(void)
{
    kvc_engine_params_t ep = kvc_engine_params_default();
    ep.n_threads = 1;
    ep.max_ctx = 512;
    ep.kv_memory = 8 << 20;
    return ep;
}

static void srv_start(srv_t *t, const char *keys)
{
    kvc_server_params_t sp = kvc_server_params_default();
    sp.api_keys_json = keys;
    srv_start_with(t, sp, engine_params());
}

static void srv_stop(srv_t *t)
{
    kvc_server_stop(t->s);
    pthread_join(t->th, NULL);
    assert_int_equal(t->run_rc, 0);
    kvc_server_destroy(t->s);
}

/* ---- a small HTTP client -------------------------------------------------------------- */
typedef struct {
    int status;
    char *headers; /* raw, lower-cased names */
    char *body;    /* de-chunked */
    size_t body_len;
} resp_t;

static void resp_free(resp_t *r)
{
    free(r->headers), free(r->body);
    memset(r, 0, sizeof *r);
}

static int connect_to(uint16_t port, int rcvbuf)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    if (rcvbuf) setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    struct timeval tv = {60, 0}; /* every test is bounded in time */
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    return fd;
}

static void send_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w <= 0) return; /* the server may close early (413) */
        p += w, n -= (size_t)w;
    }
}

static void send_request(int fd, const char *method, const char *path, const char *extra,
                         const char *body, size_t len)
{
    char head[1024];
    int n = snprintf(head, sizeof head,
                     "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n%s\r\n",
                     method, path, len, extra ? extra : "");
    send_all(fd, head, (size_t)n);
    if (len) send_all(fd, body, len);
}

static char *read_all(int fd, size_t *len)
{
    size_t cap = 4096, n = 0;
    char *b = malloc(cap);
    for (;;) {
        if (n + 4096 > cap) b = realloc(b, cap *= 2);
        ssize_t r = recv(fd, b + n, cap - n - 1, 0);
        if (r <= 0) break;
        n += (size_t)r;
    }
    b[n] = 0;
    *len = n;
    return b;
}

static void parse_resp(char *raw, size_t n, resp_t *r)
{
    memset(r, 0, sizeof *r);
    char *end = strstr(raw, "\r\n\r\n");
    if (!end || sscanf(raw, "HTTP/1.1 %d", &r->status) != 1) {
        r->status = -1;
        r->body = strdup("");
        r->headers = strdup("");
        return;
    }
    r->headers = strndup(raw, (size_t)(end - raw));
    for (char *c = r->headers; *c; c++)
        if (*c >= 'A' && *c <= 'Z') *c += 32;
    char *body = end + 4;
    size_t blen = n - (size_t)(body - raw);
    if (strstr(r->headers, "transfer-encoding: chunked")) {
        char *out = malloc(blen + 1);
        size_t o = 0;
        char *p = body;
        while (p < raw + n) {
            unsigned long sz = strtoul(p, NULL, 16);
            char *nl = strstr(p, "\r\n");
            if (!nl || !sz) break;
            p = nl + 2;
            if (p + sz > raw + n) sz = (unsigned long)(raw + n - p);
            memcpy(out + o, p, sz);
            o += sz;
            p += sz + 2;
        }
        out[o] = 0;
        r->body = out, r->body_len = o;
    } else {
        r->body = strndup(body, blen);
        r->body_len = blen;
    }
}

static resp_t http(uint16_t port, const char *method, const char *path, const char *extra,
                   const char *body)
{
    int fd = connect_to(port, 0);
    send_request(fd, method, path, extra, body, body ? strlen(body) : 0);
    size_t n;
    char *raw = read_all(fd, &n);
    close(fd);
    resp_t r;
    parse_resp(raw, n, &r);
    free(raw);
    return r;
}

static cJSON *json_of(const resp_t *r)
{
    cJSON *j = cJSON_Parse(r->body);
    if (!j) fail_msg("not JSON (status %d): %.300s", r->status, r->body);
    return j;
}

static const char *jstr(const cJSON *j, const char *path)
{
    /* a dotted path, numbers index arrays: "choices.0.text" */
    char buf[128];
    snprintf(buf, sizeof buf, "%s", path);
    const cJSON *v = j;
    for (char *tok = strtok(buf, "."); tok && v; tok = strtok(NULL, "."))
        v = (tok[0] >= '0' && tok[0] <= '9') ? cJSON_GetArrayItem(v, atoi(tok))
                                             : cJSON_GetObjectItemCaseSensitive(v, tok);
    if (!v) fail_msg("no %s in the response", path);
    if (cJSON_IsString(v)) return v->valuestring;
    return NULL;
}

static double jnum(const cJSON *j, const char *path)
{
    char buf[128];
    snprintf(buf, sizeof buf, "%s", path);
    const cJSON *v = j;
    for (char *tok = strtok(buf, "."); tok && v; tok = strtok(NULL, "."))
        v = (tok[0] >= '0' && tok[0] <= '9') ? cJSON_GetArrayItem(v, atoi(tok))
                                             : cJSON_GetObjectItemCaseSensitive(v, tok);
    if (!v || !cJSON_IsNumber(v)) fail_msg("no number %s in the response", path);
    return v->valuedouble;
}

/* The value of metric `name` (an exact line "name value") in /metrics. */
static double metric(uint16_t port, const char *name)
{
    resp_t r = http(port, "GET", "/metrics", NULL, NULL);
    assert_int_equal(r.status, 200);
    char key[160];
    snprintf(key, sizeof key, "\n%s ", name);
    const char *p = strstr(r.body, key);
    if (!p) fail_msg("no metric %s", name);
    double v = strtod(p + strlen(key), NULL);
    resp_free(&r);
    return v;
}

/* Wait (bounded) until the pool holds no used blocks and nothing runs. */
static void wait_pool_idle(uint16_t port)
{
    for (int i = 0; i < 500; i++) {
        if (metric(port, "kvcache_kv_blocks_used") == 0 &&
            metric(port, "kvcache_requests_running") == 0 &&
            metric(port, "kvcache_requests_in_flight") == 0)
            return;
        usleep(10000);
    }
    fail_msg("not idle: %g used blocks, %g running, %g in flight",
             metric(port, "kvcache_kv_blocks_used"), metric(port, "kvcache_requests_running"),
             metric(port, "kvcache_requests_in_flight"));
}

/* ---- the reference: the engine run directly ------------------------------------------- */
typedef struct {
    char text[8192];
    uint32_t n_tokens;
    kvc_token_t toks[512]; /* the first n_tokens output tokens (at most 512) */
} ref_t;

static void reference(const kvc_token_t *prompt, uint32_t n, uint32_t max_tokens, float temp,
                      uint64_t seed, ref_t *out)
{
    kvc_engine_params_t ep = engine_params();
    kvc_engine_t *e;
    char msg[256];
    if (kvc_engine_create(g_model, &ep, &e, msg, sizeof msg)) fail_msg("%s", msg);
    kvc_gen_params_t gp = kvc_gen_params_default();
    gp.max_tokens = max_tokens;
    gp.temperature = temp;
    gp.seed = seed;
    kvc_gen_id_t id;
    if (kvc_engine_submit(e, prompt, n, &gp, &id, msg, sizeof msg)) fail_msg("%s", msg);
    bool done = false;
    for (int step = 0; !done && step < 10000; step++) {
        bool idle;
        assert_ok(kvc_engine_step(e, step * 1e-3, NULL, NULL, &idle));
        const kvc_gen_done_t *d;
        uint32_t nd;
        kvc_engine_finished(e, &d, &nd);
        if (nd) {
            snprintf(out->text, sizeof out->text, "%s", d[0].text);
            out->n_tokens = d[0].completion_tokens;
            memcpy(out->toks, d[0].output,
                   KVC_MIN(out->n_tokens, (uint32_t)KVC_ARRAY_LEN(out->toks)) * sizeof *out->toks);
            done = true;
        }
    }
    assert_true(done);
    kvc_engine_destroy(e);
}

static void reference_text(const char *text, uint32_t max_tokens, float temp, uint64_t seed,
                           ref_t *out)
{
    const kvc_tokenizer_t *t = kvc_llm_tokenizer(g_model);
    kvc_token_t ids[1024];
    size_t n = 0;
    unsigned flags = KVC_TOK_PARSE_SPECIAL | (kvc_tokenizer_add_bos(t) ? KVC_TOK_ADD_BOS : 0);
    assert_ok(kvc_tokenizer_encode(t, text, strlen(text), flags, ids, 1024, &n));
    reference(ids, (uint32_t)n, max_tokens, temp, seed, out);
}

/* ---- tests ---------------------------------------------------------------------------- */
static void completions_equal_the_engine(void **state)
{
    (void)state;
    srv_t t;
    srv_start(&t, NULL);
    ref_t ref;
    reference_text("Once upon a time", 40, 0, 0, &ref);
    resp_t r =
        http(t.port, "POST", "/v1/completions", NULL,
             "{\"model\": \"stories\", \"prompt\": \"Once upon a time\", \"max_tokens\": 40, "
             "\"temperature\": 0, \"some_unknown_field\": [1, 2]}");
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.headers, "x-kvcache-timings: queue="));
    cJSON *j = json_of(&r);
    assert_string_equal(jstr(j, "object"), "text_completion");
    assert_string_equal(jstr(j, "choices.0.text"), ref.text);
    assert_string_equal(jstr(j, "choices.0.finish_reason"), "length");
    assert_int_equal((int)jnum(j, "usage.completion_tokens"), 40);
    assert_int_equal((int)jnum(j, "usage.prompt_tokens"), 5);
    assert_int_equal((int)jnum(j, "usage.total_tokens"), 45);
    assert_true(jnum(j, "usage.prompt_tokens_details.cached_tokens") == 0);
    assert_true(jnum(j, "usage.kvcache_timings.total_ms") > 0);
    assert_true(jnum(j, "usage.kvcache_timings.prefill_ms") >= 0);
    cJSON_Delete(j);
    resp_free(&r);

    /* sampled, token-id prompt, seed given */
    const kvc_token_t ids[] = {1, 403, 407, 261};
    reference(ids, 4, 30, 0.8f, 42, &ref);
    r = http(t.port, "POST", "/v1/completions", NULL,
             "{\"model\": \"stories\", \"prompt\": [1, 403, 407, 261], \"max_tokens\": 30, "
             "\"temperature\": 0.8, \"seed\": 42}");
    assert_int_equal(r.status, 200);
    j = json_of(&r);
    assert_string_equal(jstr(j, "choices.0.text"), ref.text);
    cJSON_Delete(j);
    resp_free(&r);

    /* n = 3: choice k is the request alone with seed + k */
    r = http(t.port, "POST", "/v1/completions", NULL,
             "{\"model\": \"stories\", \"prompt\": [1, 403, 407, 261], \"max_tokens\": 30, "
             "\"temperature\": 0.8, \"seed\": 42, \"n\": 3}");
    assert_int_equal(r.status, 200);
    j = json_of(&r);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "choices")), 3);
    for (int k = 0; k < 3; k++) {
        reference(ids, 4, 30, 0.8f, 42 + k, &ref);
        char path[32];
        snprintf(path, sizeof path, "choices.%d.text", k);
        assert_string_equal(jstr(j, path), ref.text);
    }
    assert_int_equal((int)jnum(j, "usage.prompt_tokens"), 4);
    assert_int_equal((int)jnum(j, "usage.completion_tokens"), 90);
    cJSON_Delete(j);
    resp_free(&r);

    /* logprobs: one per token, top alternatives as asked */
    r = http(t.port, "POST", "/v1/completions", NULL,
             "{\"model\": \"stories\", \"prompt\": \"Once upon a time\", \"max_tokens\": 5, "
             "\"temperature\": 0, \"logprobs\": 3}");
    assert_int_equal(r.status, 200);
    j = json_of(&r);
    const cJSON *lp =
        cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "logprobs");
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(lp, "token_logprobs")), 5);
    assert_int_equal(
        cJSON_GetArraySize(cJSON_GetArrayItem(cJSON_GetObjectItem(lp, "top_logprobs"), 0)), 3);
    /* the pieces concatenate to the text */
    char cat[512] = "";
    const cJSON *tk;
    cJSON_ArrayForEach(tk, cJSON_GetObjectItem(lp, "tokens")) strcat(cat, tk->valuestring);
    assert_string_equal(cat, jstr(j, "choices.0.text"));
    cJSON_Delete(j);
    resp_free(&r);

    /* stop strings are cut */
    r = http(t.port, "POST", "/v1/completions", NULL,
             "{\"model\": \"stories\", \"prompt\": \"Once upon a time\", \"max_tokens\": 40, "
             "\"temperature\": 0, \"stop\": [\"Lily\"]}");
    assert_int_equal(r.status, 200);
    j = json_of(&r);
    assert_string_equal(jstr(j, "choices.0.text"), ", there was a little girl named ");
    assert_string_equal(jstr(j, "choices.0.finish_reason"), "stop");
    cJSON_Delete(j);
    resp_free(&r);
    srv_stop(&t);
}

/* The concatenated SSE deltas of a streamed response, and its usage chunk. */
static void read_stream(const resp_t *r, bool chat, char *text, size_t cap, cJSON **usage,
                        bool *done)
{
    text[0] = 0;
    *usage = NULL;
    *done = false;
    const char *p = r->body;
    while ((p = strstr(p, "data: "))) {
        p += 6;
        const char *e = strstr(p, "\n\n");
        if (!e) fail_msg("an SSE event without its blank line");
        if (!strncmp(p, "[DONE]", 6)) {
            *done = true;
            assert_true(e[2] == 0); /* nothing after [DONE] */
            break;
        }
        cJSON *c = cJSON_ParseWithLength(p, (size_t)(e - p));
        if (!c) fail_msg("a chunk that is not JSON: %.200s", p);
        const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(c, "choices"), 0);
        if (ch) {
            const cJSON *t = chat ? cJSON_GetObjectItem(cJSON_GetObjectItem(ch, "delta"), "content")
                                  : cJSON_GetObjectItem(ch, "text");
            if (cJSON_IsString(t)) strncat(text, t->valuestring, cap - strlen(text) - 1);
        }
        const cJSON *u = cJSON_GetObjectItem(c, "usage");
        if (u && cJSON_IsObject(u)) *usage = cJSON_Duplicate(u, 1);
        cJSON_Delete(c);
        p = e;
    }
}

static void streaming_equals_whole(void **state)
{
    (void)state;
    srv_t t;
    srv_start(&t, NULL);
    ref_t ref;
    reference_text("Once upon a time", 60, 0, 0, &ref);
    resp_t r =
        http(t.port, "POST", "/v1/completions", NULL,
             "{\"model\": \"stories\", \"prompt\": \"Once upon a time\", \"max_tokens\": 60, "
             "\"temperature\": 0, \"stream\": true, \"stream_options\": "
             "{\"include_usage\": true}}");
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.headers, "content-type: text/event-stream"));
    char text[8192];
    cJSON *u;
    bool done;
    read_stream(&r, false, text, sizeof text, &u, &done);
    assert_true(done);
    assert_string_equal(text, ref.text);
    assert_non_null(u);
    assert_int_equal((int)jnum(u, "completion_tokens"), 60);
    assert_true(jnum(u, "kvcache_timings.decode_ms") >= 0);
    cJSON_Delete(u);
    resp_free(&r);
    srv_stop(&t);
}

/* return_token_ids (vLLM's field): the output's token ids, whole and streamed, equal the
 * engine's; sent back as the next prompt after the first, they hit the first turn's blocks
 * (prompt and reply, whole blocks, the last token computed), and with the prefix cache off
 * (--no-prefix-cache) nothing is cached. */
static void token_ids_feed_the_next_turn(void **state)
{
    (void)state;
    const kvc_token_t prompt[] = {1, 403, 251, 93, 263, 91, 27, 471, 263, 217, 76, 425};
    const uint32_t np = KVC_ARRAY_LEN(prompt);
    ref_t ref;
    reference(prompt, np, 40, 0, 0, &ref);
    assert_int_equal(ref.n_tokens, 40);
    char ids[1024], body[4096];
    int o = 0;
    for (uint32_t i = 0; i < np; i++)
        o += snprintf(ids + o, sizeof ids - o, "%s%d", i ? ", " : "", prompt[i]);
    for (int nopc = 0; nopc < 2; nopc++) {
        srv_t t;
        kvc_engine_params_t ep = engine_params();
        ep.no_prefix_cache = nopc;
        srv_start_with(&t, kvc_server_params_default(), ep);
        for (int stream = 0; stream < 2; stream++) {
            snprintf(body, sizeof body,
                     "{\"model\": \"stories\", \"prompt\": [%s], \"max_tokens\": 40, "
                     "\"temperature\": 0, \"ignore_eos\": true, \"return_token_ids\": true, "
                     "\"stream\": %s}",
                     ids, stream ? "true" : "false");
            resp_t r = http(t.port, "POST", "/v1/completions", NULL, body);
            assert_int_equal(r.status, 200);
            kvc_token_t got[64];
            uint32_t n = 0;
            const char *p = r.body;
            while ((p = strstr(p, "\"token_ids\":["))) { /* one array, or one per chunk */
                p += strlen("\"token_ids\":[");
                while (*p && *p != ']') {
                    char *end;
                    long v = strtol(p, &end, 10);
                    if (end == p) break;
                    assert_true(n < KVC_ARRAY_LEN(got));
                    got[n++] = (kvc_token_t)v;
                    p = *end == ',' ? end + 1 : end;
                }
            }
            assert_int_equal(n, 40);
            assert_memory_equal(got, ref.toks, 40 * sizeof *got);
            resp_free(&r);
        }
        /* turn two: the first prompt, its reply, and more */
        char ids2[2048];
        int o2 = snprintf(ids2, sizeof ids2, "%s", ids);
        for (uint32_t i = 0; i < 40; i++)
            o2 += snprintf(ids2 + o2, sizeof ids2 - o2, ", %d", ref.toks[i]);
        snprintf(ids2 + o2, sizeof ids2 - o2, ", 13, 450, 109");
        snprintf(body, sizeof body,
                 "{\"model\": \"stories\", \"prompt\": [%s], \"max_tokens\": 2, "
                 "\"temperature\": 0}",
                 ids2);
        resp_t r = http(t.port, "POST", "/v1/completions", NULL, body);
        assert_int_equal(r.status, 200);
        cJSON *j = json_of(&r);
        /* turn one held 12 + 40 tokens, 51 of them computed: 3 whole blocks of 16 */
        assert_int_equal((int)jnum(j, "usage.prompt_tokens_details.cached_tokens"), nopc ? 0 : 48);
        cJSON_Delete(j);
        resp_free(&r);
        srv_stop(&t);
    }
}

static void two_turn_chat_hits_turn_one(void **state)
{
    (void)state;
    srv_t t;
    kvc_server_params_t sp = kvc_server_params_default();
    sp.has_chat_template = true;
    sp.chat_template = KVC_CHAT_LLAMA3; /* its assistant turn re-tokenizes as generated */
    srv_start_with(&t, sp, engine_params());
    resp_t r = http(t.port, "POST", "/v1/chat/completions", NULL,
                    "{\"model\": \"stories\", \"messages\": [{\"role\": \"system\", \"content\": "
                    "\"You tell stories about a girl named Lily and her dog.\"}, {\"role\": "
                    "\"user\", \"content\": \"Tell me a story about a dog.\"}], \"max_tokens\": "
                    "40, \"temperature\": 0}");
    assert_int_equal(r.status, 200);
    cJSON *j = json_of(&r);
    assert_string_equal(jstr(j, "object"), "chat.completion");
    assert_string_equal(jstr(j, "choices.0.message.role"), "assistant");
    const uint32_t p1 = (uint32_t)jnum(j, "usage.prompt_tokens");
    const uint32_t c1 = (uint32_t)jnum(j, "usage.completion_tokens");
    char reply[4096];
    snprintf(reply, sizeof reply, "%s", jstr(j, "choices.0.message.content"));
    cJSON_Delete(j);
    resp_free(&r);
    cJSON *body = cJSON_Parse(
        "{\"model\": \"stories\", \"max_tokens\": 10, \"temperature\": 0, \"messages\": "
        "[{\"role\": \"system\", \"content\": \"You tell stories about a girl named Lily and her "
        "dog.\"}, {\"role\": \"user\", \"content\": \"Tell me a story about a dog.\"}]}");
    cJSON *msgs = cJSON_GetObjectItem(body, "messages");
    cJSON *a = cJSON_CreateObject();
    cJSON_AddStringToObject(a, "role", "assistant");
    cJSON_AddStringToObject(a, "content", reply);
    cJSON_AddItemToArray(msgs, a);
    cJSON *u2 = cJSON_CreateObject();
    cJSON_AddStringToObject(u2, "role", "user");
    cJSON_AddStringToObject(u2, "content", "And then?");
    cJSON_AddItemToArray(msgs, u2);
    char *b2 = cJSON_PrintUnformatted(body);
    r = http(t.port, "POST", "/v1/chat/completions", NULL, b2);
    assert_int_equal(r.status, 200);
    j = json_of(&r);
    const uint32_t cached = (uint32_t)jnum(j, "usage.prompt_tokens_details.cached_tokens");
    /* turn one's prompt and reply, in whole blocks of 16 (the last partial one recomputed) */
    if (cached < (p1 + c1) / 16 * 16)
        fail_msg("turn two cached %u tokens; turn one held %u + %u", cached, p1, c1);
    assert_true(cached < (uint32_t)jnum(j, "usage.prompt_tokens"));
    assert_true(metric(t.port, "kvcache_prefix_hit_tokens_total") >= cached);
    cJSON_Delete(j);
    resp_free(&r);
    free(b2);
    cJSON_Delete(body);
    srv_stop(&t);
}

static const char *TENANTS =
    "{\"key-a\": {\"tenant\": \"alice\"}, \"key-b\": {\"tenant\": \"bob\"},"
    " \"key-c\": {\"tenant\": \"carol\", \"cache\": \"shared\"},"
    " \"key-d\": {\"tenant\": \"dave\", \"cache\": \"shared\"},"
    " \"key-one\": {\"tenant\": \"solo\", \"max_concurrent\": 1},"
    " \"key-q\": {\"tenant\": \"quota\", \"kv_token_quota\": 300, \"max_prompt_tokens\": 64}}";

static const char *PROMPT48 =
    "{\"model\": \"stories\", \"prompt\": \"Once upon a time, there was a little girl named Lily. "
    "She loved to play outside in the sunshine with her friends and her dog.\", \"max_tokens\": "
    "4, \"temperature\": 0}";

static uint32_t cached_of(uint16_t port, const char *key, const char *body)
{
    char h[128];
    snprintf(h, sizeof h, "Authorization: Bearer %s\r\n", key);
    resp_t r = http(port, "POST", "/v1/completions", h, body);
    if (r.status != 200) fail_msg("status %d: %s", r.status, r.body);
    cJSON *j = json_of(&r);
    uint32_t c = (uint32_t)jnum(j, "usage.prompt_tokens_details.cached_tokens");
    cJSON_Delete(j);
    resp_free(&r);
    return c;
}

static void tenants_isolate_and_limit(void **state)
{
    (void)state;
    srv_t t;
    srv_start(&t, TENANTS);
    /* keys */
    resp_t r = http(t.port, "POST", "/v1/completions", NULL, PROMPT48);
    assert_int_equal(r.status, 401);
    cJSON *j = json_of(&r);
    assert_string_equal(jstr(j, "error.type"), "authentication_error");
    assert_string_equal(jstr(j, "error.code"), "invalid_api_key");
    cJSON_Delete(j);
    resp_free(&r);
    r = http(t.port, "POST", "/v1/completions", "Authorization: Bearer nope\r\n", PROMPT48);
    assert_int_equal(r.status, 401);
    resp_free(&r);
    r = http(t.port, "GET", "/v1/models", NULL, NULL);
    assert_int_equal(r.status, 401);
    resp_free(&r);
    /* salts: alice's cache is hers; bob's first request misses it */
    assert_int_equal(cached_of(t.port, "key-a", PROMPT48), 0);
    assert_true(cached_of(t.port, "key-a", PROMPT48) >= 16);
    assert_int_equal(cached_of(t.port, "key-b", PROMPT48), 0);
    /* shared tenants share one cache (not alice's) */
    assert_int_equal(cached_of(t.port, "key-c", PROMPT48), 0);
    assert_true(cached_of(t.port, "key-d", PROMPT48) >= 16);
    /* a request's own cache_salt splits even a shared tenant's cache */
    char salted[1024];
    snprintf(salted, sizeof salted, "%.*s, \"cache_salt\": \"s1\"}", (int)strlen(PROMPT48) - 1,
             PROMPT48);
    assert_int_equal(cached_of(t.port, "key-c", salted), 0);
    assert_true(cached_of(t.port, "key-d", salted) >= 16);

    /* quota in KV tokens: a request that may hold more than the whole quota is a 400 */
    r = http(t.port, "POST", "/v1/completions", "Authorization: Bearer key-q\r\n",
             "{\"model\": \"stories\", \"prompt\": [1, 2, 3], \"max_tokens\": 400}");
    assert_int_equal(r.status, 400);
    j = json_of(&r);
    assert_string_equal(jstr(j, "error.code"), "quota_exceeded");
    cJSON_Delete(j);
    resp_free(&r);
    r = http(t.port, "POST", "/v1/completions", "Authorization: Bearer key-q\r\n",
             "{\"model\": \"stories\", \"prompt\": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, "
             "15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, "
             "36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, "
             "57, 58, 59, 60, 61, 62, 63, 64, 65], \"max_tokens\": 4}");
    assert_int_equal(r.status, 400); /* over its max_prompt_tokens */
    resp_free(&r);

    /* concurrency: solo's second request while its first streams is a 429 with retry-after;
     * and quota's is one too when its first holds most of its KV tokens */
    const char *keys[2] = {"key-one", "key-q"};
    const char *firsts[2] = {
        "{\"model\": \"stories\", \"prompt\": [1], \"max_tokens\": 500, \"ignore_eos\": true, "
        "\"stream\": true}",
        "{\"model\": \"stories\", \"prompt\": [1], \"max_tokens\": 250, \"ignore_eos\": true, "
        "\"stream\": true}"};
    for (int k = 0; k < 2; k++) {
        char h[128];
        snprintf(h, sizeof h, "Authorization: Bearer %s\r\n", keys[k]);
        int fd = connect_to(t.port, 2048);
        send_request(fd, "POST", "/v1/completions", h, firsts[k], strlen(firsts[k]));
        char buf[64];
        assert_true(recv(fd, buf, sizeof buf, 0) > 0); /* it is running */
        r = http(t.port, "POST", "/v1/completions", h,
                 "{\"model\": \"stories\", \"prompt\": [1, 2], \"max_tokens\": 100}");
        assert_int_equal(r.status, 429);
        assert_non_null(strstr(r.headers, "retry-after: 1"));
        j = json_of(&r);
        assert_string_equal(jstr(j, "error.type"), "rate_limit_error");
        cJSON_Delete(j);
        resp_free(&r);
        close(fd); /* gone: aborted, and its tenant's slot comes back */
        bool ok = false;
        for (int i = 0; i < 300 && !ok; i++) {
            r = http(t.port, "POST", "/v1/completions", h,
                     "{\"model\": \"stories\", \"prompt\": [1, 2], \"max_tokens\": 2}");
            ok = r.status == 200;
            resp_free(&r);
            if (!ok) usleep(10000);
        }
        assert_true(ok);
    }
    /* per-tenant counters */
    r = http(t.port, "GET", "/metrics", NULL, NULL);
    assert_non_null(strstr(r.body, "kvcache_tenant_requests_total{tenant=\"alice\"} 2\n"));
    assert_non_null(strstr(r.body, "kvcache_tenant_prefix_hit_tokens_total{tenant=\"bob\"} 0\n"));
    assert_non_null(strstr(r.body, "# TYPE kvcache_tenant_rejected_total counter\n"));
    resp_free(&r);
    wait_pool_idle(t.port);
    srv_stop(&t);
}

static void bad_input_gets_4xx_and_the_server_goes_on(void **state)
{
    (void)state;
    kvc_server_params_t sp = kvc_server_params_default();
    sp.max_body_bytes = 4096;
    sp.max_tokens_limit = 300;
    srv_t t;
    srv_start_with(&t, sp, engine_params());
    static const struct {
        const char *path, *body;
        int status;
        const char *param;
    } cases[] = {
        {"/v1/completions", "{", 400, NULL},
        {"/v1/completions", "[1, 2]", 400, NULL},
        {"/v1/completions", "", 400, NULL},
        {"/v1/completions", "{\"prompt\": \"x\"}", 400, "model"},
        {"/v1/completions", "{\"model\": \"stories\"}", 400, "prompt"},
        {"/v1/completions", "{\"model\": 7, \"prompt\": \"x\"}", 400, "model"},
        {"/v1/completions", "{\"model\": \"gpt-4\", \"prompt\": \"x\"}", 404, "model"},
        {"/v1/completions", "{\"model\": \"stories\", \"prompt\": 5}", 400, "prompt"},
        {"/v1/completions", "{\"model\": \"stories\", \"prompt\": []}", 400, "prompt"},
        {"/v1/completions", "{\"model\": \"stories\", \"prompt\": [1, -2]}", 400, "prompt"},
        {"/v1/completions", "{\"model\": \"stories\", \"prompt\": [1, 1.5]}", 400, "prompt"},
        {"/v1/completions", "{\"model\": \"stories\", \"prompt\": [1, 99999]}", 400, "prompt"},
        {"/v1/completions", "{\"model\": \"stories\", \"prompt\": \"x\", \"max_tokens\": 0}", 400,
         "max_tokens"},
        {"/v1/completions", "{\"model\": \"stories\", \"prompt\": \"x\", \"max_tokens\": \"5\"}",
         400, "max_tokens"},
        {"/v1/completions", "{\"model\": \"stories\", \"prompt\": \"x\", \"max_tokens\": 301}", 400,
         "max_tokens"},
        {"/v1/completions", "{\"model\": \"stories\", \"prompt\": \"x\", \"max_tokens\": 1e12}",
         400, "max_tokens"},
        {"/v1/completions", "{\"model\": \"stories\", \"prompt\": \"x\", \"n\": 1000}", 400, "n"},
        {"/v1/completions", "{\"model\": \"stories\", \"prompt\": \"x\", \"n\": 0}", 400, "n"},
        {"/v1/completions", "{\"model\": \"stories\", \"prompt\": \"x\", \"temperature\": -1}", 400,
         "temperature"},
        {"/v1/completions", "{\"model\": \"stories\", \"prompt\": \"x\", \"temperature\": \"hot\"}",
         400, "temperature"},
        {"/v1/completions", "{\"model\": \"stories\", \"prompt\": \"x\", \"top_p\": 0}", 400,
         "top_p"},
        {"/v1/completions", "{\"model\": \"stories\", \"prompt\": \"x\", \"stop\": 3}", 400,
         "stop"},
        {"/v1/completions",
         "{\"model\": \"stories\", \"prompt\": \"x\", \"stop\": "
         "[\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\",\"i\"]}",
         400, "stop"},
        {"/v1/completions", "{\"model\": \"stories\", \"prompt\": \"x\", \"logprobs\": 50}", 400,
         "logprobs"},
        {"/v1/completions", "{\"model\": \"stories\", \"prompt\": \"x\", \"stream\": \"yes\"}", 400,
         "stream"},
        {"/v1/completions", "{\"model\": \"stories\", \"prompt\": \"x\", \"stream_options\": 1}",
         400, "stream_options"},
        {"/v1/completions", "{\"model\": \"stories\", \"prompt\": \"x\", \"seed\": 1.5}", 400,
         "seed"},
        {"/v1/completions", "{\"model\": \"stories\", \"prompt\": \"x\", \"priority\": 99}", 400,
         "priority"},
        {"/v1/completions", "{\"model\": \"stories\", \"prompt\": \"x\", \"presence_penalty\": 3}",
         400, "presence_penalty"},
        {"/v1/completions", "{\"model\": \"stories\", \"prompt\": \"x\", \"cache_salt\": 3}", 400,
         "cache_salt"},
        {"/v1/completions", "{\"model\": \"stories\", \"prompt\": \"\xff\xfe\"}", 400, NULL},
        {"/v1/chat/completions", "{\"model\": \"stories\", \"messages\": []}", 400, "messages"},
        {"/v1/chat/completions", "{\"model\": \"stories\", \"messages\": \"hi\"}", 400, "messages"},
        {"/v1/chat/completions",
         "{\"model\": \"stories\", \"messages\": [{\"role\": \"wizard\", \"content\": \"x\"}]}",
         400, "messages"},
        {"/v1/chat/completions",
         "{\"model\": \"stories\", \"messages\": [{\"role\": \"user\", \"content\": 5}]}", 400,
         "messages"},
        {"/v1/chat/completions",
         "{\"model\": \"stories\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
         "\"top_logprobs\": 3}",
         400, "top_logprobs"},
        {"/v1/chat/completions",
         "{\"model\": \"stories\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
         "\"logprobs\": 3}",
         400, "logprobs"},
        {"/v1/nothing", "{}", 404, NULL},
    };
    for (size_t i = 0; i < KVC_ARRAY_LEN(cases); i++) {
        resp_t r = http(t.port, "POST", cases[i].path, NULL, cases[i].body);
        if (r.status != cases[i].status)
            fail_msg("case %zu (%s): status %d, not %d: %s", i, cases[i].body, r.status,
                     cases[i].status, r.body);
        cJSON *j = json_of(&r);
        assert_non_null(jstr(j, "error.message"));
        assert_non_null(jstr(j, "error.type"));
        if (cases[i].param) assert_string_equal(jstr(j, "error.param"), cases[i].param);
        cJSON_Delete(j);
        resp_free(&r);
    }
    /* a prompt longer than the context (512) */
    char big[8192];
    int o = snprintf(big, sizeof big, "{\"model\": \"stories\", \"prompt\": [1");
    for (int i = 0; i < 1000; i++) o += snprintf(big + o, sizeof big - o, ", 300");
    snprintf(big + o, sizeof big - o, "]}");
    resp_t r = http(t.port, "POST", "/v1/completions", NULL, big);
    assert_int_equal(r.status, 413); /* over 4096 bytes first */
    resp_free(&r);
    o = snprintf(big, sizeof big, "{\"model\":\"stories\",\"prompt\":[1");
    for (int i = 0; i < 520; i++) o += snprintf(big + o, sizeof big - o, ",9");
    snprintf(big + o, sizeof big - o, "]}");
    r = http(t.port, "POST", "/v1/completions", NULL, big);
    assert_int_equal(r.status, 400);
    cJSON *j = json_of(&r);
    assert_string_equal(jstr(j, "error.code"), "context_length_exceeded");
    cJSON_Delete(j);
    resp_free(&r);
    /* prompt + max_tokens over the context */
    r = http(t.port, "POST", "/v1/completions", NULL,
             "{\"model\": \"stories\", \"prompt\": [1, 2], \"max_tokens\": 300, \"n\": 2}");
    assert_int_equal(r.status, 200);
    resp_free(&r);
    /* a huge body, sent in full */
    char *huge = malloc(1 << 20);
    memset(huge, ' ', 1 << 20);
    memcpy(huge, "{\"model\": \"stories\", \"prompt\": \"", 33);
    huge[(1 << 20) - 2] = '"', huge[(1 << 20) - 1] = '}';
    int fd = connect_to(t.port, 0);
    send_request(fd, "POST", "/v1/completions", NULL, huge, 1 << 20);
    size_t n;
    char *raw = read_all(fd, &n);
    close(fd);
    parse_resp(raw, n, &r);
    assert_int_equal(r.status, 413);
    resp_free(&r);
    free(raw);
    free(huge);
    /* wrong methods */
    r = http(t.port, "GET", "/v1/completions", NULL, NULL);
    assert_int_equal(r.status, 405);
    resp_free(&r);
    /* and it still serves */
    r = http(t.port, "POST", "/v1/completions", NULL,
             "{\"model\": \"stories\", \"prompt\": \"Once\", \"max_tokens\": 3}");
    assert_int_equal(r.status, 200);
    resp_free(&r);
    r = http(t.port, "GET", "/health", NULL, NULL);
    assert_int_equal(r.status, 200);
    resp_free(&r);
    assert_true(metric(t.port, "kvcache_request_success_total") == 2);
    wait_pool_idle(t.port);
    srv_stop(&t);
}

/* ---- concurrency, disconnects, slow clients ------------------------------------------- */
typedef struct {
    uint16_t port;
    int id;
    int completed, aborted, wrong;
    unsigned seed;
} soak_arg_t;

static ref_t g_refs[4];
static const char *const SOAK_PROMPTS[4] = {"Once upon a time", "Lily and Ben", "The dog ran",
                                            "One day, a little"};

static void *soak_client(void *arg)
{
    soak_arg_t *a = arg;
    for (int i = 0; i < 12; i++) {
        const int k = (int)(rand_r(&a->seed) % 4);
        const bool stream = rand_r(&a->seed) % 2;
        const bool drop = rand_r(&a->seed) % 3 == 0;
        char body[512];
        snprintf(body, sizeof body,
                 "{\"model\": \"stories\", \"prompt\": \"%s\", \"max_tokens\": 60, "
                 "\"temperature\": 0.7, \"seed\": %d, \"stream\": %s}",
                 SOAK_PROMPTS[k], k, stream ? "true" : "false");
        int fd = connect_to(a->port, 0);
        send_request(fd, "POST", "/v1/completions", NULL, body, strlen(body));
        if (drop) {
            /* go away at a random point: before the reply or inside the stream */
            const int bytes = (int)(rand_r(&a->seed) % 600);
            char buf[700];
            int got = 0;
            while (got < bytes) {
                ssize_t r = recv(fd, buf, (size_t)(bytes - got), 0);
                if (r <= 0) break;
                got += (int)r;
            }
            close(fd);
            a->aborted++;
            continue;
        }
        size_t n;
        char *raw = read_all(fd, &n);
        close(fd);
        resp_t r;
        parse_resp(raw, n, &r);
        free(raw);
        char text[8192] = "";
        if (r.status == 200 && stream) {
            cJSON *u;
            bool done;
            read_stream(&r, false, text, sizeof text, &u, &done);
            cJSON_Delete(u);
            if (!done) a->wrong++;
        } else if (r.status == 200) {
            cJSON *j = cJSON_Parse(r.body);
            const cJSON *t = cJSON_GetObjectItem(
                cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "text");
            if (cJSON_IsString(t)) snprintf(text, sizeof text, "%s", t->valuestring);
            cJSON_Delete(j);
        }
        if (r.status != 200 || strcmp(text, g_refs[k].text))
            a->wrong++;
        else
            a->completed++;
        resp_free(&r);
    }
    return NULL;
}

static void soak_with_disconnects(void **state)
{
    (void)state;
    for (int k = 0; k < 4; k++) reference_text(SOAK_PROMPTS[k], 60, 0.7f, (uint64_t)k, &g_refs[k]);
    srv_t t;
    kvc_engine_params_t ep = engine_params();
    ep.kv_memory = 1 << 20; /* small: preemption joins in */
    ep.max_num_seqs = 8;
    srv_start_with(&t, kvc_server_params_default(), ep);
    enum { N = 8 };
    pthread_t th[N];
    soak_arg_t a[N];
    for (int i = 0; i < N; i++) {
        a[i] = (soak_arg_t){.port = t.port, .id = i, .seed = 1234u + (unsigned)i};
        assert_int_equal(pthread_create(&th[i], NULL, soak_client, &a[i]), 0);
    }
    int completed = 0, aborted = 0, wrong = 0;
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        completed += a[i].completed, aborted += a[i].aborted, wrong += a[i].wrong;
    }
    print_message("soak: %d completed, %d dropped, %d wrong\n", completed, aborted, wrong);
    assert_int_equal(wrong, 0);
    assert_true(completed > 30 && aborted > 10);
    wait_pool_idle(t.port);
    assert_true(metric(t.port, "kvcache_kv_blocks_used") == 0);
    srv_stop(&t);
}

static void slow_client_is_cut_off(void **state)
{
    (void)state;
    kvc_server_params_t sp = kvc_server_params_default();
    sp.max_output_bytes = 8192;
    srv_t t;
    kvc_engine_params_t ep = engine_params();
    ep.kv_memory = 64 << 20;
    srv_start_with(&t, sp, ep);
    /* a client that never reads a long stream (64 choices of 500 tokens, some 8 MB: more than
     * the sockets' buffers hold, 4 MB at most here): the server drops it and frees its blocks */
    int fd = connect_to(t.port, 1024);
    const char *body = "{\"model\": \"stories\", \"prompt\": [1], \"max_tokens\": 500, "
                       "\"ignore_eos\": true, \"stream\": true, \"n\": 64}";
    send_request(fd, "POST", "/v1/completions", NULL, body, strlen(body));
    bool cut = false;
    for (int i = 0; i < 12000 && !cut; i++) { /* at most 2 minutes (the sanitizer build is slow) */
        usleep(10000);
        cut = metric(t.port, "kvcache_request_failure_total") == 1;
        if (metric(t.port, "kvcache_request_success_total") > 0)
            fail_msg("the stream was taken whole: the socket buffers held it");
    }
    assert_true(cut);
    close(fd); /* (reading the rest is the kernel's business: what the server had handed it) */
    wait_pool_idle(t.port);
    /* the next one is served whole */
    resp_t r =
        http(t.port, "POST", "/v1/completions", NULL,
             "{\"model\": \"stories\", \"prompt\": [1], \"max_tokens\": 8, \"stream\": true}");
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "data: [DONE]"));
    resp_free(&r);
    srv_stop(&t);
}

static void stop_drains_in_flight(void **state)
{
    (void)state;
    srv_t t;
    srv_start(&t, NULL);
    int fd = connect_to(t.port, 0);
    const char *body = "{\"model\": \"stories\", \"prompt\": [1], \"max_tokens\": 300, "
                       "\"ignore_eos\": true}";
    send_request(fd, "POST", "/v1/completions", NULL, body, strlen(body));
    usleep(20000);
    kvc_server_stop(t.s);
    size_t n;
    char *raw = read_all(fd, &n);
    close(fd);
    resp_t r;
    parse_resp(raw, n, &r);
    free(raw);
    assert_int_equal(r.status, 200); /* finished, not cut */
    cJSON *j = json_of(&r);
    assert_int_equal((int)jnum(j, "usage.completion_tokens"), 300);
    cJSON_Delete(j);
    resp_free(&r);
    pthread_join(t.th, NULL);
    assert_int_equal(t.run_rc, 0);
    kvc_server_destroy(t.s);
}

static void metrics_are_prometheus(void **state)
{
    (void)state;
    srv_t t;
    srv_start(&t, NULL);
    resp_t r = http(t.port, "POST", "/v1/completions", NULL,
                    "{\"model\": \"stories\", \"prompt\": \"Once\", \"max_tokens\": 8}");
    assert_int_equal(r.status, 200);
    resp_free(&r);
    r = http(t.port, "GET", "/metrics", NULL, NULL);
    assert_int_equal(r.status, 200);
    static const char *const names[] = {"kvcache_kv_blocks_total",
                                        "kvcache_kv_blocks_used",
                                        "kvcache_kv_blocks_cached",
                                        "kvcache_prefix_hit_tokens_total",
                                        "kvcache_prompt_tokens_total",
                                        "kvcache_generation_tokens_total",
                                        "kvcache_preemptions_total",
                                        "kvcache_requests_running",
                                        "kvcache_requests_waiting",
                                        "kvcache_time_to_first_token_seconds",
                                        "kvcache_time_per_output_token_seconds",
                                        "kvcache_e2e_request_latency_seconds",
                                        "kvcache_hop_seconds",
                                        "kvcache_engine_steps_total",
                                        "kvcache_engine_step_seconds_total"};
    for (size_t i = 0; i < KVC_ARRAY_LEN(names); i++) {
        char k[160];
        snprintf(k, sizeof k, "# TYPE %s ", names[i]);
        if (!strstr(r.body, k)) fail_msg("no %s", k);
        snprintf(k, sizeof k, "# HELP %s ", names[i]);
        if (!strstr(r.body, k)) fail_msg("no %s", k);
    }
    resp_free(&r);
    /* at least its prompt step; their time is inside the request's own */
    assert_true(metric(t.port, "kvcache_engine_steps_total") >= 1);
    double step_s = metric(t.port, "kvcache_engine_step_seconds_total");
    assert_true(step_s > 0 && step_s < metric(t.port, "kvcache_e2e_request_latency_seconds_sum"));
    r = http(t.port, "GET", "/metrics", NULL, NULL);
    static const char *const hops[] = {"queue", "tokenize", "prefill", "decode"};
    for (size_t i = 0; i < 4; i++) {
        char k[160];
        snprintf(k, sizeof k, "kvcache_hop_seconds_count{hop=\"%s\"} 1\n", hops[i]);
        if (!strstr(r.body, k)) fail_msg("no %s", k);
    }
    assert_non_null(strstr(r.body, "kvcache_e2e_request_latency_seconds_bucket{le=\"+Inf\"} 1\n"));
    assert_non_null(strstr(r.body, "\nkvcache_generation_tokens_total 8\n"));
    assert_non_null(strstr(r.body, "kvcache_tenant_requests_total{tenant=\"default\"} 1\n"));
    resp_free(&r);
    srv_stop(&t);
}

/* ---- the parser and the tenants file on their own ------------------------------------- */
static void parser_is_all_or_nothing(void **state)
{
    (void)state;
    kvc__srv_req_t r;
    kvc__srv_err_t e;
    const char *ok = "{\"model\": \"m\", \"prompt\": [\"a\", \"b\"], \"stop\": [\"x\", \"\"], "
                     "\"top_k\": -1, \"seed\": -1}";
    assert_int_equal(kvc__srv_parse(ok, strlen(ok), false, 0, &r, &e), 0);
    assert_int_equal(r.n_prompts, 2);
    assert_int_equal(r.gp.n_stop, 1);
    assert_int_equal(r.gp.top_k, 0);
    assert_true(r.gp.seed == UINT64_MAX);
    kvc__srv_req_free(&r);
    /* a failure late in the body leaves nothing allocated (ASan checks) */
    const char *bad = "{\"model\": \"m\", \"prompt\": [\"a\", \"b\"], \"stop\": \"x\", \"n\": -1}";
    assert_int_equal(kvc__srv_parse(bad, strlen(bad), false, 0, &r, &e), -1);
    assert_int_equal(e.status, 400);
    assert_string_equal(e.param, "n");
    assert_null(r.prompts);
    const char *chat = "{\"model\": \"m\", \"messages\": [{\"role\": \"developer\", \"content\": "
                       "[{\"type\": \"text\", \"text\": \"a\"}, {\"type\": \"text\", \"text\": "
                       "\"b\"}]}, {\"role\": \"assistant\", \"content\": null}]}";
    assert_int_equal(kvc__srv_parse(chat, strlen(chat), true, 0, &r, &e), 0);
    assert_string_equal(r.msgs[0].role, "system");
    assert_string_equal(r.msgs[0].content, "ab");
    assert_string_equal(r.msgs[1].content, "");
    kvc__srv_req_free(&r);
    /* UTF-8 */
    assert_true(kvc__srv_utf8_valid("h\xc3\xa9", 3));
    assert_false(kvc__srv_utf8_valid("\xc0\xaf", 2));         /* overlong */
    assert_false(kvc__srv_utf8_valid("\xed\xa0\x80", 3));     /* a surrogate */
    assert_false(kvc__srv_utf8_valid("\xf4\x90\x80\x80", 4)); /* past U+10FFFF */
    assert_int_equal(kvc__srv_utf8_prefix("ab\xe2\x82", 4), 2);
}

static void tenants_file_is_checked(void **state)
{
    (void)state;
    kvc__srv_tenants_t t;
    char msg[256];
    assert_int_equal(kvc__srv_tenants_parse(TENANTS, strlen(TENANTS), &t, msg, sizeof msg), 0);
    assert_int_equal(t.n_tenants, 6);
    assert_int_equal(kvc__srv_tenants_find(&t, "key-b", 5), 1);
    assert_int_equal(kvc__srv_tenants_find(&t, "key-", 4), -1);
    assert_int_equal(kvc__srv_tenants_find(&t, "key-bb", 6), -1);
    assert_true(t.tenants[2].shared);
    kvc__srv_tenants_free(&t);
    static const char *const bad[] = {
        "[]",
        "{}",
        "{\"k\": 1}",
        "{\"k\": {}}",
        "{\"k\": {\"tenant\": \"a b\"}}",
        "{\"k\": {\"tenant\": \"a\", \"cache\": \"maybe\"}}",
        "{\"k\": {\"tenant\": \"a\", \"kv_token_quota\": -5}}",
        "{\"k\": {\"tenant\": \"a\", \"priority\": 100}}",
        "{\"k\": {\"tenant\": \"a\", \"cache\": \"shared\", \"cache_salt\": \"x\"}}",
        "{\"k\": {\"tenant\": \"a\"}, \"j\": {\"tenant\": \"a\", \"max_concurrent\": 2}}",
        "{\"k\": {\"tenant\": \"a\"}, \"k\": {\"tenant\": \"b\"}}",
    };
    for (size_t i = 0; i < KVC_ARRAY_LEN(bad); i++) {
        int rc = kvc__srv_tenants_parse(bad[i], strlen(bad[i]), &t, msg, sizeof msg);
        if (rc != KVC_EPARSE) fail_msg("'%s' gave %d", bad[i], rc);
        assert_int_equal(t.n_tenants, 0);
    }
    /* more tenants than the scheduler's compile-time tenant limit */
    char big[8192];
    int o = snprintf(big, sizeof big, "{");
    for (int i = 0; i < 40; i++)
        o += snprintf(big + o, sizeof big - o, "%s\"k%d\": {\"tenant\": \"t%d\"}", i ? ", " : "", i,
                      i);
    snprintf(big + o, sizeof big - o, "}");
    assert_int_equal(kvc__srv_tenants_parse(big, strlen(big), &t, msg, sizeof msg), 0);
    assert_int_equal(t.n_tenants, 40);
    kvc__srv_tenants_free(&t);
}

static void many_tenants_serve(void **state)
{
    (void)state;
    char big[8192];
    int o = snprintf(big, sizeof big, "{");
    for (int i = 0; i < 40; i++)
        o += snprintf(big + o, sizeof big - o, "%s\"k%d\": {\"tenant\": \"t%d\", \"priority\": %d}",
                      i ? ", " : "", i, i, i % 2);
    snprintf(big + o, sizeof big - o, "}");
    srv_t t;
    srv_start(&t, big);
    for (int i = 0; i < 40; i += 13) { /* each tenant isolated: each misses the others' blocks */
        char key[8];
        snprintf(key, sizeof key, "k%d", i);
        assert_int_equal(cached_of(t.port, key, PROMPT48), 0);
    }
    /* every tenant is served, and the scheduler's books are each tenant's own: the tokens it
     * computed for tenant i are exactly i's uncached prompt tokens and its decodes */
    uint64_t want[40];
    for (int i = 0; i < 40; i++) {
        char h[128], body[256];
        snprintf(h, sizeof h, "Authorization: Bearer k%d\r\n", i);
        snprintf(body, sizeof body,
                 "{\"model\": \"stories\", \"prompt\": \"The dog ran to tenant %d\", "
                 "\"max_tokens\": %d, \"temperature\": 0}",
                 i, 2 + i % 5);
        resp_t r = http(t.port, "POST", "/v1/completions", h, body);
        if (r.status != 200) fail_msg("tenant %d: status %d: %s", i, r.status, r.body);
        cJSON *j = json_of(&r);
        double prompt = jnum(j, "usage.prompt_tokens"),
               completion = jnum(j, "usage.completion_tokens"),
               cached = jnum(j, "usage.prompt_tokens_details.cached_tokens");
        assert_true(completion >= 1);
        want[i] = (uint64_t)(prompt - cached + completion - 1);
        cJSON_Delete(j);
        resp_free(&r);
    }
    wait_pool_idle(t.port);
    for (int i = 0; i < 40; i++) {
        char name[128];
        snprintf(name, sizeof name, "kvcache_tenant_computed_tokens_total{tenant=\"t%d\"}", i);
        double got = metric(t.port, name);
        if (i % 13 == 0) {
            /* the PROMPT48 request above counted too */
            assert_true(got > (double)want[i]);
        } else if (got != (double)want[i]) {
            fail_msg("tenant t%d: %g tokens computed, want %llu", i, got,
                     (unsigned long long)want[i]);
        }
        snprintf(name, sizeof name, "kvcache_tenant_kv_blocks{tenant=\"t%d\"}", i);
        assert_true(metric(t.port, name) == 0);
        snprintf(name, sizeof name, "kvcache_tenant_requests_total{tenant=\"t%d\"}", i);
        assert_true(metric(t.port, name) == (i % 13 ? 1 : 2));
    }
    srv_stop(&t);
}

static int setup(void **state)
{
    (void)state;
    char msg[256];
    signal(SIGPIPE, SIG_IGN);
    if (kvc_llm_load(STORIES, &g_model, msg, sizeof msg)) {
        fprintf(stderr, "%s\n", msg);
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    kvc_llm_free(g_model);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(parser_is_all_or_nothing),
        cmocka_unit_test(tenants_file_is_checked),
        cmocka_unit_test(completions_equal_the_engine),
        cmocka_unit_test(streaming_equals_whole),
        cmocka_unit_test(two_turn_chat_hits_turn_one),
        cmocka_unit_test(token_ids_feed_the_next_turn),
        cmocka_unit_test(tenants_isolate_and_limit),
        cmocka_unit_test(many_tenants_serve),
        cmocka_unit_test(bad_input_gets_4xx_and_the_server_goes_on),
        cmocka_unit_test(metrics_are_prometheus),
        cmocka_unit_test(slow_client_is_cut_off),
        cmocka_unit_test(stop_drains_in_flight),
        cmocka_unit_test(soak_with_disconnects),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
