/* bench_profile.c - this machine's hardware profile for the simulator: the CPU engine's real
 * step time on a grid of (batch tokens T, mean keys per query K), written as the JSON that
 * `kvcache sim --profile FILE` reads (include/kvcache/sim.h, kvc_sim_profile_parse).
 *
 * Each cell is measured through the engine's API on the model, with the engine options the
 * server will run with (threads, block size, running cap, token budget), timing
 * kvc_engine_step itself (scheduling, the forward pass, sampling):
 *   - T <= --max-num-seqs (and 64): a decode step of T rows at context K: one request of
 *     T parallel samples (the prompt computed once, the samples forked copy-on-write), so
 *     that setting up a cell costs one prompt; the timed steps decode all T.
 *   - larger T: a prefill step of n requests computing m = T / n new tokens each after a
 *     cached prefix of f tokens, with m = min(T, 2K) and f chosen so that f + (m + 1) / 2 is
 *     K (f rounds to whole blocks; the actual K is written beside the grid).
 * The median of --reps steps per prefill cell, of 3 x --reps per decode cell; the whole grid
 * --passes times (default 2), each cell the least of its medians.  Steps whose token count is
 * not the cell's (the scheduler split them) are left out.
 *
 * Then what a server spends outside those steps, through its HTTP API: the server
 * (kvc_server, the same engine options) runs in this process on 127.0.0.1, and a client here
 * sends it --serve-reps streaming completions (after 3 warm-ups), one at a time, each a fresh
 * prompt of --serve-prompt token ids and 16 output tokens, over a new connection each, as
 * bench/serve/run.py's client does:
 *   - request_ms: the median of (the client's TTFT, from before connect to the recv that brings
 *     the first token) less (the server's own prefill_ms, usage.kvcache_timings: from taking
 *     the request off its queue to sampling the first token, the step the grid measures).
 *     What is left is the HTTP request and response, JSON, tokenizing, the hand-over to the
 *     engine thread and back to the event thread;
 *   - step_overhead_ms: the median of the server's decode_ms per output token less the grid's
 *     decode step of one row at the same mean context: the step loop around the engine's step.
 * Both are written into the profile (request_ms, step_overhead_ms; see sim.h), with the
 * medians behind them and, for people, a batch of 8 requests' time per token beside the
 * grid's (fixed_costs).  --serve-reps 0 leaves them out (a grid-only profile, as before).
 * usage: bench_profile --model FILE [--threads N] [--block-size N] [--max-num-seqs N]
 *                 [--max-num-batched-tokens N] [--kv-memory MiB] [--ctx N]
 *                 [--tokens 1,2,4,...] [--context 16,64,...] [--reps N] [--passes N]
 *                 [--serve-reps N] [--serve-prompt N] [-o FILE]
 */
#include "bench_util.h"
#include "kvcache/kvcache.h"
#include "kvcache/server.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAXP 64

static void die(const char *what, const char *msg)
{
    fprintf(stderr, "bench_profile: %s: %s\n", what, msg);
    exit(1);
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static uint32_t parse_list(const char *s, double *v)
{
    uint32_t n = 0;
    for (const char *p = s; *p && n < MAXP;) {
        char *end;
        v[n++] = strtod(p, &end);
        if (end == p) die("bad list", s);
        p = *end == ',' ? end + 1 : end;
    }
    return n;
}

typedef struct {
    kvc_engine_t *e;
    uint32_t vocab, bs;
    uint64_t rng;
    double t0;
    uint64_t live; /* requests submitted and not finished */
} ctx_t;

static kvc_token_t rnd(ctx_t *c)
{
    c->rng = c->rng * 6364136223846793005ull + 1442695040888963407ull;
    return (kvc_token_t)(3 + (c->rng >> 33) % (c->vocab - 3));
}

static void submit(ctx_t *c, const kvc_token_t *p, uint32_t n, uint32_t max_tokens)
{
    kvc_gen_params_t gp = kvc_gen_params_default();
    gp.max_tokens = max_tokens;
    gp.ignore_eos = true;
    gp.temperature = 0;
    kvc_gen_id_t id;
    char msg[256];
    if (kvc_engine_submit(c->e, p, n, &gp, &id, msg, sizeof msg)) die("submit", msg);
    c->live++;
}

static void on_event(void *ctx, const kvc_gen_event_t *ev)
{
    (void)ctx, (void)ev;
}

/* One engine step; its wall time, and the tokens it computed (prefill, decode). */
static double step(ctx_t *c, uint64_t *prefill, uint64_t *decode)
{
    kvc_engine_stats_t a, b;
    kvc_engine_stats(c->e, &a);
    bool idle;
    double t = now_s();
    int rc = kvc_engine_step(c->e, t - c->t0, on_event, NULL, &idle);
    t = now_s() - t;
    if (rc) die("step", kvc_strerror(rc));
    const kvc_gen_done_t *done;
    uint32_t nd;
    kvc_engine_finished(c->e, &done, &nd);
    c->live -= nd;
    kvc_engine_stats(c->e, &b);
    *prefill = b.prefill_tokens - a.prefill_tokens;
    *decode = b.decode_tokens - a.decode_tokens;
    return t;
}

static void drain(ctx_t *c)
{
    for (int i = 0; i < 1000000; i++) {
        if (!c->live) return;
        uint64_t p, d;
        (void)step(c, &p, &d);
    }
    die("drain", "the engine does not finish");
}

/* A fresh prefix of n tokens (a whole number of blocks), computed and left in the cache. */
static void make_prefix(ctx_t *c, kvc_token_t *buf, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) buf[i] = rnd(c);
    if (n) {
        submit(c, buf, n, 1);
        drain(c);
    }
}

/* A decode step of T rows at context about K: one request with T parallel samples (its
 * prompt computed once, the samples forked copy-on-write, as the engine runs n), whose
 * prompt is the same for every T of this K (so that after the first cell it is a prefix
 * hit).  Returns the median, *k_out the mean context of the timed steps. */
static double cell_decode(ctx_t *c, uint32_t T, double K, int reps, double *k_out)
{
    const uint32_t P = (uint32_t)KVC_MAX(1.0, floor(K - 1 - (reps - 1) / 2.0 + 0.5));
    kvc_token_t *buf = malloc((size_t)P * sizeof *buf);
    if (!buf) die("decode", "out of memory");
    uint64_t saved = c->rng;
    c->rng = (uint64_t)K * 7919 + 1; /* the same prompt for every T of this K */
    for (uint32_t i = 0; i < P; i++) buf[i] = rnd(c);
    c->rng = saved;
    kvc_gen_params_t gp = kvc_gen_params_default();
    gp.max_tokens = (uint32_t)reps + 2;
    gp.ignore_eos = true;
    gp.temperature = 1;
    gp.n = T;
    kvc_gen_id_t id;
    char msg[256];
    if (kvc_engine_submit(c->e, buf, P, &gp, &id, msg, sizeof msg)) die("submit", msg);
    c->live += T;
    double v[256];
    int n = 0;
    for (int guard = 0; guard < 100000 && n < reps && c->live; guard++) {
        uint64_t p, d;
        double t = step(c, &p, &d);
        if (getenv("KVC_PROFILE_DEBUG"))
            fprintf(stderr, "  step: %llu prefill + %llu decode tokens, %.3f ms\n",
                    (unsigned long long)p, (unsigned long long)d, t * 1e3);
        if (p == 0 && d == T) v[n++] = t; /* decode j attends P + 1 + j keys */
    }
    drain(c);
    free(buf);
    if (n == 0) die("decode", "no step decoded the whole batch (raise --max-num-batched-tokens)");
    *k_out = P + 1 + (n - 1) / 2.0;
    return kvc_bench_median(v, n);
}

/* A prefill step of T tokens at mean context about K. */
static double cell_prefill(ctx_t *c, uint32_t T, double K, int reps, double *k_out)
{
    uint32_t m = (uint32_t)KVC_MIN((double)T, KVC_MAX(1.0, floor(2 * K)));
    while (T % m) m--; /* n requests of m tokens make T */
    const uint32_t n_req = T / m;
    double fd = K - (m + 1) / 2.0;
    uint32_t f = fd > 0 ? (uint32_t)(fd / c->bs + 0.5) * c->bs : 0;
    kvc_token_t *buf = malloc((size_t)(f + m) * sizeof *buf);
    if (!buf) die("prefill", "out of memory");
    make_prefix(c, buf, f);
    double v[256];
    int n = 0;
    for (int r = 0; r < reps; r++) {
        for (uint32_t q = 0; q < n_req; q++) {
            for (uint32_t i = 0; i < m; i++) buf[f + i] = rnd(c);
            submit(c, buf, f + m, 1);
        }
        uint64_t p, d;
        double t = step(c, &p, &d);
        if (p + d == T) v[n++] = t;
        drain(c);
    }
    free(buf);
    if (n == 0) die("prefill", "no step computed the whole cell (raise --max-num-batched-tokens)");
    *k_out = f + (m + 1) / 2.0;
    return kvc_bench_median(v, n);
}

/* ---- the server's fixed costs, through its HTTP API ------------------------------------ */
/* One streaming completion on its own connection, as a client (bench/serve/run.py) sends it:
 * connect, POST, read the server-sent events as they come. */
typedef struct {
    int fd;
    double t_send, t_first, t_last; /* client clock: before connect, first and last token */
    uint32_t n_tokens;
    double srv_prefill_ms, srv_decode_ms, srv_first_ms; /* usage.kvcache_timings */
    char *buf;                                          /* the response as it arrives */
    size_t len, cap, body_at, used; /* body_at: after the headers; used: chunks decoded up to */
    char *body;                     /* de-chunked body */
    size_t blen, bcap, scanned;     /* scanned: events parsed up to */
    bool chunked, done;
} conn_t;

static void grow_buf(char **b, size_t *cap, size_t need)
{
    if (need <= *cap) return;
    size_t c = KVC_MAX(*cap * 2, need + 4096);
    char *n = realloc(*b, c);
    if (!n) die("client", "out of memory");
    *b = n, *cap = c;
}

static void conn_open(conn_t *c, uint16_t port, const kvc_token_t *prompt, uint32_t n_prompt,
                      uint32_t max_tokens)
{
    size_t cap = 256 + 12 * (size_t)n_prompt, o = 0;
    char *body = malloc(cap);
    if (!body) die("client", "out of memory");
    o += (size_t)snprintf(body + o, cap - o, "{\"model\": \"bench\", \"prompt\": [");
    for (uint32_t i = 0; i < n_prompt; i++)
        o += (size_t)snprintf(body + o, cap - o, "%s%d", i ? ", " : "", (int)prompt[i]);
    o += (size_t)snprintf(body + o, cap - o,
                          "], \"max_tokens\": %u, \"temperature\": 0, \"ignore_eos\": true, "
                          "\"stream\": true, \"return_token_ids\": true, "
                          "\"stream_options\": {\"include_usage\": true}}",
                          max_tokens);
    char *req = malloc(o + 256);
    if (!req) die("client", "out of memory");
    int n = snprintf(req, o + 256,
                     "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                     "application/json\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n%s",
                     o, body);
    *c = (conn_t){.fd = -1};
    c->t_send = now_s();
    c->fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const int one = 1;
    if (c->fd < 0 || connect(c->fd, (struct sockaddr *)&a, sizeof a))
        die("client", "cannot connect to the server");
    (void)setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    for (int sent = 0; sent < n;) {
        ssize_t w = send(c->fd, req + sent, (size_t)(n - sent), 0);
        if (w <= 0) die("client", "send failed");
        sent += (int)w;
    }
    free(req), free(body);
}

/* Parse the complete events of the de-chunked body: tokens and the usage's timings. */
static void conn_events(conn_t *c)
{
    for (;;) {
        char *start = c->body + c->scanned, *end = NULL;
        for (size_t i = c->scanned; i + 1 < c->blen; i++)
            if (c->body[i] == '\n' && c->body[i + 1] == '\n') {
                end = c->body + i;
                break;
            }
        if (!end) return;
        c->scanned = (size_t)(end - c->body) + 2;
        if (strncmp(start, "data: ", 6) || !strncmp(start + 6, "[DONE]", 6)) continue;
        cJSON *o = cJSON_ParseWithLength(start + 6, (size_t)(end - start - 6));
        if (!o) die("client", "an event is not JSON");
        const cJSON *ch, *choices = cJSON_GetObjectItemCaseSensitive(o, "choices");
        cJSON_ArrayForEach(ch, choices)
        {
            int k = cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(ch, "token_ids"));
            if (k > 0) {
                double t = now_s();
                if (!c->n_tokens) c->t_first = t;
                c->t_last = t;
                c->n_tokens += (uint32_t)k;
            }
        }
        const cJSON *u = cJSON_GetObjectItemCaseSensitive(o, "usage");
        const cJSON *tm = u ? cJSON_GetObjectItemCaseSensitive(u, "kvcache_timings") : NULL;
        if (tm) {
            const cJSON *x = cJSON_GetObjectItemCaseSensitive(tm, "prefill_ms");
            const cJSON *y = cJSON_GetObjectItemCaseSensitive(tm, "decode_ms");
            const cJSON *z = cJSON_GetObjectItemCaseSensitive(tm, "first_token_ms");
            if (!cJSON_IsNumber(x) || !cJSON_IsNumber(y) || !cJSON_IsNumber(z))
                die("client", "usage.kvcache_timings lacks prefill_ms, decode_ms, first_token_ms");
            c->srv_prefill_ms = x->valuedouble, c->srv_decode_ms = y->valuedouble;
            c->srv_first_ms = z->valuedouble;
        }
        cJSON_Delete(o);
    }
}

/* Read what the socket has; decode the HTTP framing; false once the response is complete. */
static bool conn_read(conn_t *c)
{
    grow_buf(&c->buf, &c->cap, c->len + 65536);
    ssize_t r = recv(c->fd, c->buf + c->len, c->cap - c->len - 1, 0);
    if (r < 0) die("client", "recv failed");
    c->len += (size_t)r;
    c->buf[c->len] = 0;
    if (!c->body_at) {
        char *h = strstr(c->buf, "\r\n\r\n");
        if (h) {
            if (strncmp(c->buf, "HTTP/1.1 200", 12)) die("client", c->buf);
            c->body_at = c->used = (size_t)(h - c->buf) + 4;
            *h = 0;
            c->chunked = strcasestr(c->buf, "transfer-encoding: chunked") != NULL;
        }
    }
    if (c->body_at) {
        for (;;) { /* move whole chunks (or, unchunked, everything) into the body */
            size_t n, hdr = 0;
            if (c->chunked) {
                char *crlf = strstr(c->buf + c->used, "\r\n");
                if (!crlf) break;
                n = strtoul(c->buf + c->used, NULL, 16);
                hdr = (size_t)(crlf - (c->buf + c->used)) + 2;
                if (c->used + hdr + n + 2 > c->len) break;
                if (n == 0) c->done = true;
            } else {
                n = c->len - c->used;
                if (!n) break;
            }
            grow_buf(&c->body, &c->bcap, c->blen + n + 1);
            memcpy(c->body + c->blen, c->buf + c->used + hdr, n);
            c->blen += n;
            c->body[c->blen] = 0;
            c->used += hdr + n + (c->chunked ? 2 : 0);
            if (c->done) break;
        }
        conn_events(c);
    }
    if (r == 0) c->done = true;
    return !c->done;
}

static void conn_close(conn_t *c)
{
    if (c->fd >= 0) close(c->fd);
    free(c->buf), free(c->body);
    c->fd = -1, c->buf = c->body = NULL;
}

static void *serve_thread(void *arg)
{
    if (kvc_server_run(arg)) die("server", "kvc_server_run failed");
    return NULL;
}

/* B streaming requests of a fresh prompt of P tokens each, sent together; each one's client
 * TTFT less the server's prefill (send to the first token in the client's hands, less the
 * engine's time from taking the request to sampling its first token) into req_ms, and the
 * server's time per output token into tok_ms. */
typedef struct {
    double req_ms, tok_ms, ttft_ms, prefill_ms, first_ms;
} sample_t;

static void probe(ctx_t *c, uint16_t port, uint32_t B, uint32_t P, uint32_t n_out, sample_t *out)
{
    conn_t cs[64];
    struct pollfd pf[64];
    kvc_token_t *prompt = malloc((size_t)P * sizeof *prompt);
    if (!prompt) die("probe", "out of memory");
    for (uint32_t b = 0; b < B; b++) {
        for (uint32_t i = 0; i < P; i++) prompt[i] = rnd(c);
        prompt[0] = 1;
        conn_open(&cs[b], port, prompt, P, n_out);
    }
    for (uint32_t live = B; live;) {
        uint32_t n = 0;
        for (uint32_t b = 0; b < B; b++)
            if (!cs[b].done) pf[n++] = (struct pollfd){.fd = cs[b].fd, .events = POLLIN};
        if (poll(pf, n, 60000) <= 0) die("probe", "the server does not answer");
        for (uint32_t k = 0; k < n; k++) {
            if (!(pf[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            for (uint32_t b = 0; b < B; b++)
                if (cs[b].fd == pf[k].fd && !conn_read(&cs[b])) live--;
        }
    }
    for (uint32_t b = 0; b < B; b++) {
        if (cs[b].n_tokens != n_out) die("probe", "a reply has the wrong number of tokens");
        const double ttft = (cs[b].t_first - cs[b].t_send) * 1e3;
        out[b] = (sample_t){.req_ms = ttft - cs[b].srv_prefill_ms,
                            .tok_ms = cs[b].srv_decode_ms / (n_out - 1),
                            .ttft_ms = ttft,
                            .prefill_ms = cs[b].srv_prefill_ms,
                            .first_ms = cs[b].srv_first_ms};
        conn_close(&cs[b]);
    }
    free(prompt);
}

#define SERVE_OUT   16 /* output tokens per probe request */
#define SERVE_BATCH 8

typedef struct {
    double request_ms, step_ms;                            /* what the profile gets */
    double ttft_ms, prefill_ms, first_ms, tok_ms, grid_ms; /* medians behind them */
    uint32_t batch, batch_prompt;
    double batch_tok_ms, batch_grid_ms; /* a batch of SERVE_BATCH: for people, not used */
} fixed_t;

/* The server's fixed costs outside the engine's steps (see the banner). */
static void measure_fixed(ctx_t *c, const kvc_llm_t *m, const kvc_engine_params_t *ep,
                          const kvc_sim_profile_t *grid, int n, uint32_t P, fixed_t *fx)
{
    kvc_server_params_t sp = kvc_server_params_default();
    sp.model_name = "bench";
    sp.port = 0;
    kvc_server_t *srv;
    char msg[512];
    if (kvc_server_create(m, ep, &sp, &srv, msg, sizeof msg)) die("server", msg);
    pthread_t th;
    if (pthread_create(&th, NULL, serve_thread, srv)) die("server", "cannot start a thread");
    const uint16_t port = kvc_server_port(srv);
    sample_t v[256 + 3];
    for (int r = 0; r < n + 3; r++) /* 3 warm-ups: the first connections, pages first touched */
        probe(c, port, 1, P, SERVE_OUT, &v[KVC_MAX(0, r - 3)]);
    double x[5][256];
    for (int r = 0; r < n; r++) {
        x[0][r] = v[r].req_ms, x[1][r] = v[r].tok_ms, x[2][r] = v[r].ttft_ms;
        x[3][r] = v[r].prefill_ms, x[4][r] = v[r].first_ms;
    }
    fx->request_ms = KVC_MAX(0.0, kvc_bench_median(x[0], n));
    fx->tok_ms = kvc_bench_median(x[1], n);
    fx->ttft_ms = kvc_bench_median(x[2], n);
    fx->prefill_ms = kvc_bench_median(x[3], n);
    fx->first_ms = kvc_bench_median(x[4], n);
    /* decode step j (1..SERVE_OUT-1) attends P + j keys: the grid at their mean */
    fx->grid_ms = kvc_sim_profile_step_s(grid, 1, P + SERVE_OUT / 2.0) * 1e3;
    fx->step_ms = KVC_MAX(0.0, fx->tok_ms - fx->grid_ms);
    /* a batch, for people: does the loop's cost grow with the rows? */
    sample_t bv[SERVE_BATCH * 5];
    double bt[SERVE_BATCH * 5];
    /* prompts short enough that the batch's prefills fit one step's budget, so that the
     * decodes run together rather than beside the others' prefill chunks */
    const uint32_t Pb = KVC_MAX(1u, KVC_MIN(P, ep->max_num_batched_tokens / SERVE_BATCH / 2));
    for (int r = 0; r < 5; r++) probe(c, port, SERVE_BATCH, Pb, SERVE_OUT, bv + r * SERVE_BATCH);
    for (int i = 0; i < SERVE_BATCH * 5; i++) bt[i] = bv[i].tok_ms;
    fx->batch = SERVE_BATCH;
    fx->batch_tok_ms = kvc_bench_median(bt, SERVE_BATCH * 5);
    fx->batch_grid_ms = kvc_sim_profile_step_s(grid, SERVE_BATCH, Pb + SERVE_OUT / 2.0) * 1e3;
    fx->batch_prompt = Pb;
    kvc_server_stop(srv);
    pthread_join(th, NULL);
    kvc_server_destroy(srv);
    fprintf(stderr,
            "server: request %.3f ms (client TTFT less prefill), %.3f ms per token against the "
            "grid's %.3f ms step: %.3f ms per step; batch %u: %.3f ms per token, grid %.3f ms\n",
            fx->request_ms, fx->tok_ms, fx->grid_ms, fx->step_ms, fx->batch, fx->batch_tok_ms,
            fx->batch_grid_ms);
}

static void write_grid(FILE *f, const char *model, const kvc_engine_params_t *ep, uint32_t bs,
                       int reps, int passes, const double *tokens, uint32_t nt,
                       const double *context, uint32_t nc, double ms[][MAXP], double kk[][MAXP])
{
    fprintf(
        f,
        "{\"kvcache_profile\": 1,\n \"model\": \"%s\", \"threads\": %u, \"block_size\": %u,"
        " \"max_num_seqs\": %u, \"max_num_batched_tokens\": %u, \"reps\": %d, \"passes\": %d,\n",
        model, ep->n_threads, bs, ep->max_num_seqs, ep->max_num_batched_tokens, reps, passes);
    fprintf(f, " \"tokens\": [");
    for (uint32_t i = 0; i < nt; i++) fprintf(f, "%s%g", i ? ", " : "", tokens[i]);
    fprintf(f, "],\n \"context\": [");
    for (uint32_t k = 0; k < nc; k++) fprintf(f, "%s%g", k ? ", " : "", context[k]);
    fprintf(f, "],\n \"step_ms\": [");
    for (uint32_t i = 0; i < nt; i++) {
        fprintf(f, "%s[", i ? ",\n             " : "");
        for (uint32_t k = 0; k < nc; k++) fprintf(f, "%s%.4f", k ? ", " : "", ms[i][k]);
        fprintf(f, "]");
    }
    fprintf(f, "],\n \"actual_context\": [");
    for (uint32_t i = 0; i < nt; i++) {
        fprintf(f, "%s[", i ? ", " : "");
        for (uint32_t k = 0; k < nc; k++) fprintf(f, "%s%.1f", k ? ", " : "", kk[i][k]);
        fprintf(f, "]");
    }
    fprintf(f, "]");
}

int main(int argc, char **argv)
{
    const char *model = NULL, *out_path = NULL;
    kvc_engine_params_t ep = kvc_engine_params_default();
    ep.n_threads = 1;
    ep.max_ctx = 4096;
    ep.kv_memory = 64ull << 20;
    double tokens[MAXP] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512};
    double context[MAXP] = {16, 64, 256, 1024};
    uint32_t nt = 10, nc = 4;
    int reps = 7, serve_reps = 15, passes = 2;
    uint32_t serve_prompt = 128;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) die(a, "needs a value");
        i++;
        if (!strcmp(a, "--model"))
            model = v;
        else if (!strcmp(a, "-o"))
            out_path = v;
        else if (!strcmp(a, "--threads"))
            ep.n_threads = (uint32_t)atoi(v);
        else if (!strcmp(a, "--block-size"))
            ep.block_size = (uint32_t)atoi(v);
        else if (!strcmp(a, "--max-num-seqs"))
            ep.max_num_seqs = (uint32_t)atoi(v);
        else if (!strcmp(a, "--max-num-batched-tokens"))
            ep.max_num_batched_tokens = (uint32_t)atoi(v);
        else if (!strcmp(a, "--kv-memory"))
            ep.kv_memory = (uint64_t)atoll(v) << 20;
        else if (!strcmp(a, "--ctx"))
            ep.max_ctx = (uint32_t)atoi(v);
        else if (!strcmp(a, "--tokens"))
            nt = parse_list(v, tokens);
        else if (!strcmp(a, "--context"))
            nc = parse_list(v, context);
        else if (!strcmp(a, "--passes"))
            passes = KVC_MAX(1, KVC_MIN(atoi(v), 9));
        else if (!strcmp(a, "--serve-reps"))
            serve_reps = KVC_MAX(0, KVC_MIN(atoi(v), 255));
        else if (!strcmp(a, "--serve-prompt"))
            serve_prompt = (uint32_t)KVC_MAX(1, KVC_MIN(atoi(v), 4000));
        else if (!strcmp(a, "--reps"))
            reps = KVC_MAX(1, KVC_MIN(atoi(v), 255));
        else
            die(a, "unknown option");
    }
    if (!model) die("usage", "bench_profile --model FILE [options] (see the file's banner)");
    char msg[512];
    kvc_llm_t *m;
    if (kvc_llm_load(model, &m, msg, sizeof msg)) die(model, msg);
    ctx_t c = {.vocab = kvc_llm_hparams(m)->vocab, .rng = 12345, .t0 = now_s()};
    if (kvc_engine_create(m, &ep, &c.e, msg, sizeof msg)) die("engine", msg);
    kvc_engine_stats_t st;
    kvc_engine_stats(c.e, &st);
    c.bs = st.block_size;
    static double ms[MAXP][MAXP], kk[MAXP][MAXP];
    /* The grid `passes` times over, each cell the least of its passes' medians: a burst of
     * other work on a shared machine inflates a whole cell (its steps run within a second),
     * and the next pass, seconds later, misses it. */
    for (int pass = 0; pass < passes; pass++)
        for (uint32_t i = 0; i < nt; i++)
            for (uint32_t k = 0; k < nc; k++) {
                uint32_t T = (uint32_t)tokens[i];
                const bool dec = T <= ep.max_num_seqs && T <= KVC_MAX_SAMPLES;
                /* decode steps are short and noisier: three times the samples */
                double t = dec ? cell_decode(&c, T, context[k], KVC_MIN(3 * reps, 255), &kk[i][k])
                               : cell_prefill(&c, T, context[k], reps, &kk[i][k]);
                ms[i][k] = pass ? fmin(ms[i][k], t * 1e3) : t * 1e3;
                fprintf(stderr, "pass %d  T %4u  K %7.1f  (actual %7.1f)  %8.3f ms  %s\n", pass, T,
                        context[k], kk[i][k], t * 1e3, dec ? "decode" : "prefill");
            }
    /* The grid as a profile, to read the engine's own step time at the probes' points. */
    char *grid_json = NULL;
    size_t grid_len = 0;
    FILE *mf = open_memstream(&grid_json, &grid_len);
    if (!mf) die("profile", "out of memory");
    write_grid(mf, model, &ep, c.bs, reps, passes, tokens, nt, context, nc, ms, kk);
    fprintf(mf, "}\n");
    fclose(mf);
    kvc_sim_profile_t *grid;
    if (kvc_sim_profile_parse(grid_json, grid_len, "grid", &grid, msg, sizeof msg))
        die("profile", msg);
    free(grid_json);
    kvc_engine_destroy(c.e); /* the server makes its own */
    c.e = NULL;
    fixed_t fx = {0};
    if (serve_reps > 0) measure_fixed(&c, m, &ep, grid, serve_reps, serve_prompt, &fx);
    kvc_sim_profile_destroy(grid);
    FILE *f = out_path ? fopen(out_path, "w") : stdout;
    if (!f) die(out_path, "cannot write");
    write_grid(f, model, &ep, c.bs, reps, passes, tokens, nt, context, nc, ms, kk);
    if (serve_reps > 0)
        fprintf(
            f,
            ",\n \"request_ms\": %.4f, \"step_overhead_ms\": %.4f,\n"
            " \"fixed_costs\": {\"how\": \"the server in this process (kvc_server) on 127.0.0.1, "
            "one streaming completion at a time, %d requests after 3 warm-ups, a fresh "
            "prompt of %u token ids, %u output tokens; request_ms: median of client TTFT "
            "(from before connect) less the server's prefill_ms; step_overhead_ms: median "
            "of the server's decode_ms per output token less the grid's decode step at the "
            "same context\", \"client_ttft_ms\": %.4f, \"server_prefill_ms\": %.4f, "
            "\"server_first_token_ms\": %.4f, \"server_ms_per_token\": %.4f, "
            "\"grid_decode_step_ms\": %.4f, \"batch\": %u, \"batch_prompt\": %u, "
            "\"batch_ms_per_token\": %.4f, "
            "\"grid_batch_step_ms\": %.4f}",
            fx.request_ms, fx.step_ms, serve_reps, serve_prompt, SERVE_OUT, fx.ttft_ms,
            fx.prefill_ms, fx.first_ms, fx.tok_ms, fx.grid_ms, fx.batch, fx.batch_prompt,
            fx.batch_tok_ms, fx.batch_grid_ms);
    fprintf(f, "}\n");
    if (f != stdout) fclose(f);
    kvc_llm_free(m);
    return 0;
}
