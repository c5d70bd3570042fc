/* server.c - `kvcache serve`: the OpenAI-compatible HTTP server (server layer).
 *
 * Two threads.  The event thread runs libevent's evhttp: it parses, authenticates, checks
 * limits and tokenizes each request (so a bad one costs the engine nothing and is never half
 * applied), then hands a job to the engine thread through a queue.  The engine thread owns
 * the engine and runs its step loop; per step it moves emitted text into each job (under the
 * job's lock) and wakes the event thread through a pipe, which writes SSE chunks or the whole
 * response.  A job is shared by both threads and reference counted: the event thread's
 * reference lives until the response is finished or the client is gone, the engine's until
 * every engine request of the job has its account.  A client that goes away (or one too slow
 * to take its output) queues an abort; the engine aborts the job's requests (their blocks
 * come back through seq's deferred reclamation) and their accounts end the job.  Engine ids
 * are (slot, generation) and each engine request's tag points at its own job's record, so a
 * later request reusing a slot can never receive another's tokens.
 */
#include "kvcache/server.h"
#include "kvcache/kvcache.h"
#include "kvcache/seq.h"
#include "server_int.h"
#include "util/msg.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stddef.h>
#include <strings.h>
#include <sys/socket.h>

/* ---- metrics -------------------------------------------------------------------------- */
#define N_BUCKETS 15
static const double lat_bounds[N_BUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                             0.5,   1,      2.5,   5,    10,    30,   60};
typedef struct {
    uint64_t counts[N_BUCKETS + 1];
    uint64_t count;
    double sum;
} hist_t;

static void hist_add(hist_t *h, double v)
{
    if (!isfinite(v) || v < 0) return;
    int i = 0;
    while (i < N_BUCKETS && v > lat_bounds[i]) i++;
    h->counts[i]++;
    h->count++;
    h->sum += v;
}

enum { HOP_QUEUE, HOP_TOKENIZE, HOP_PREFILL, HOP_DECODE, N_HOPS };
static const char *const hop_names[N_HOPS] = {"queue", "tokenize", "prefill", "decode"};

/* ---- jobs ----------------------------------------------------------------------------- */
typedef struct job job_t;

/* One engine request: one choice of one prompt. */
typedef struct {
    job_t *job;
    uint32_t index;    /* the choice's index */
    uint32_t prompt_i; /* which prompt */
    uint32_t seed_k;   /* sample k of its prompt: seed + k, as the engine's own n does */
    /* engine thread */
    kvc_gen_id_t id;
    bool submitted, finished;
    /* engine -> event thread, under job->mu */
    char *ptext;
    size_t plen, pcap;
    kvc_token_t *ptok;
    float *plp;
    uint32_t pn, ptcap;
    bool done; /* the account below is filled */
    uint32_t prompt_tokens, cached_tokens, completion_tokens, n_top;
    uint32_t tier_cached[KVC_ENGINE_MAX_TIERS]; /* of cached_tokens, fetched from tier i */
    kvc_token_t *out, *top_ids;
    float *lp, *top_lp;
    char *text;
    kvc_finish_t finish;
    /* event thread */
    bool finish_sent, role_sent;
    size_t text_offset;
} sub_t;

struct job {
    kvc_server_t *srv;
    atomic_int refs;
    pthread_mutex_t mu;
    /* event thread only */
    struct evhttp_request *req;
    bool gone, headers_sent, finalized;
    job_t *prev, *next; /* the active list */
    int tenant;
    uint64_t kv_tokens;
    bool chat, stream, include_usage, logprobs, token_ids;
    uint32_t top_logprobs;
    char id[48];
    long long created;
    double t_recv, t_tok;
    char path[32];
    /* written by the engine thread under mu */
    double t_submit, t_first, t_done;
    bool all_done;
    int err_status;
    char err_msg[256];
    /* queues */
    job_t *next_submit, *next_abort, *next_ready;
    bool in_ready;
    /* the requests */
    kvc_token_t *toks; /* every prompt's tokens, one after another */
    uint32_t *p_off, *p_len;
    uint32_t n_prompts;
    kvc_gen_params_t gp;
    char *stops[KVC_MAX_STOP];
    uint32_t n_subs, n_submitted, n_finished;
    sub_t *subs;
};

struct kvc_server {
    const kvc_llm_t *m;
    kvc_engine_t *e;
    kvc_server_params_t p;
    char *model_name;
    uint32_t max_ctx, block_size, max_num_seqs;
    kvc__srv_tenants_t tenants;
    bool keyed;
    struct event_base *base;
    struct evhttp *http;
    struct evhttp_bound_socket *sock;
    uint16_t port;
    int wake[2], stop_fd[2];
    struct event *wake_ev, *stop_ev, *drain_ev;
    pthread_t th;
    bool th_started, ran;
    /* engine queue, under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    job_t *sub_head, *sub_tail, *abort_head;
    bool quit;
    kvc_engine_stats_t st; /* published by the engine thread, under mu */
    kvc_pool_stats_t ps;
    kvc_sched_tenant_stats_t *tst; /* (tenants.n_tenants) the scheduler's, under mu */
    uint32_t n_tiers;              /* the engine's KV tiers (--tier), in lookup order */
    char tier_label[KVC_ENGINE_MAX_TIERS][16]; /* "host", "disk", "redis"; "disk.2" for a
                                                   second tier of one kind */
    kvc_engine_tier_stats_t tier_st[KVC_ENGINE_MAX_TIERS]; /* published, under mu */
    double tst_at;                 /* when tst was last published (engine thread) */
    /* ready queue (engine -> event thread), under rmu */
    pthread_mutex_t rmu;
    job_t *ready_head, *ready_tail;
    /* event thread */
    job_t *active;
    uint32_t in_flight;
    uint32_t unflushed; /* replies whose bytes are not all written yet */
    bool draining, drain_expired;
    uint64_t next_id;
    uint64_t m_prompt, m_gen, m_hit, m_requests_ok, m_requests_err;
    uint64_t m_status[6]; /* 2xx..5xx by class, [0]: others */
    hist_t h_ttft, h_tpot, h_e2e, h_hop[N_HOPS];
};

static double now_s(void)
{
    return (double)kvc_now_ns() * 1e-9;
}

static void sub_free(sub_t *s)
{
    free(s->ptext), free(s->ptok), free(s->plp);
    free(s->out), free(s->top_ids), free(s->lp), free(s->top_lp), free(s->text);
}

static void job_unref(job_t *j)
{
    if (!j || atomic_fetch_sub(&j->refs, 1) != 1) return;
    for (uint32_t i = 0; i < j->n_subs; i++) sub_free(&j->subs[i]);
    free(j->subs);
    for (uint32_t i = 0; i < KVC_MAX_STOP; i++) free(j->stops[i]);
    free(j->toks), free(j->p_off), free(j->p_len);
    pthread_mutex_destroy(&j->mu);
    free(j);
}

/* Wake the event thread (any thread).  The pipe is non-blocking: when it is full, the
 * event thread is already due to run. */
static void wake(int fd)
{
    const char b = 1;
    ssize_t r = write(fd, &b, 1);
    (void)r;
}

/* Engine thread: give the job to the event thread's ready queue (with a reference). */
static void mark_ready(kvc_server_t *s, job_t *j)
{
    bool signal = false;
    pthread_mutex_lock(&s->rmu);
    if (!j->in_ready) {
        j->in_ready = true;
        atomic_fetch_add(&j->refs, 1);
        j->next_ready = NULL;
        if (s->ready_tail)
            s->ready_tail->next_ready = j;
        else
            s->ready_head = j, signal = true;
        s->ready_tail = j;
    }
    pthread_mutex_unlock(&s->rmu);
    if (signal) wake(s->wake[1]);
}

/* ---- the engine thread ---------------------------------------------------------------- */
static int grow(void **p, uint32_t *cap, uint32_t need, size_t elem)
{
    if (need <= *cap) return 0;
    uint32_t c = KVC_MAX(*cap * 2, need + 16);
    void *v = realloc(*p, (size_t)c * elem);
    if (!v) return KVC_ENOMEM;
    *p = v, *cap = c;
    return 0;
}

static void on_event(void *ctx, const kvc_gen_event_t *ev)
{
    kvc_server_t *s = ctx;
    sub_t *sb = (sub_t *)(uintptr_t)ev->tag;
    job_t *j = sb->job;
    if (!ev->text_len && !ev->n_tokens) return;
    pthread_mutex_lock(&j->mu);
    if (!j->t_first) j->t_first = now_s();
    int rc = 0;
    if (j->stream && ev->text_len) {
        if (sb->plen + ev->text_len + 1 > sb->pcap) {
            size_t c = KVC_MAX(sb->pcap * 2, sb->plen + ev->text_len + 64);
            char *t = realloc(sb->ptext, c);
            if (!t)
                rc = KVC_ENOMEM;
            else
                sb->ptext = t, sb->pcap = c;
        }
        if (!rc) {
            memcpy(sb->ptext + sb->plen, ev->text, ev->text_len);
            sb->plen += ev->text_len;
            sb->ptext[sb->plen] = 0;
        }
    }
    if (!rc && j->stream && (j->logprobs || j->token_ids) && ev->n_tokens) {
        uint32_t c1 = sb->ptcap, c2 = sb->ptcap;
        rc = grow((void **)&sb->ptok, &c1, sb->pn + ev->n_tokens, sizeof *sb->ptok);
        if (!rc) rc = grow((void **)&sb->plp, &c2, sb->pn + ev->n_tokens, sizeof *sb->plp);
        if (!rc) {
            sb->ptcap = KVC_MIN(c1, c2);
            for (uint32_t i = 0; i < ev->n_tokens; i++) {
                sb->ptok[sb->pn] = ev->tokens[i];
                sb->plp[sb->pn++] = ev->logprobs ? ev->logprobs[i] : NAN;
            }
        }
    }
    if (rc && !j->err_status) {
        j->err_status = 500;
        snprintf(j->err_msg, sizeof j->err_msg, "out of memory");
    }
    pthread_mutex_unlock(&j->mu);
    mark_ready(s, j);
}

static void *memdup(const void *p, size_t n)
{
    if (!p || !n) return NULL;
    void *d = malloc(n);
    if (d) memcpy(d, p, n);
    return d;
}

/* Copy a finished engine request's account into its sub; true when the job is done. */
static bool take_account(kvc_server_t *s, const kvc_gen_done_t *d)
{
    sub_t *sb = (sub_t *)(uintptr_t)d->tag;
    job_t *j = sb->job;
    sb->finished = true;
    pthread_mutex_lock(&j->mu);
    sb->prompt_tokens = d->prompt_tokens;
    sb->cached_tokens = d->cached_tokens;
    memcpy(sb->tier_cached, d->tier_cached_tokens, sizeof sb->tier_cached);
    sb->completion_tokens = d->completion_tokens;
    sb->finish = d->finish;
    sb->n_top = d->n_logprobs;
    const size_t nc = d->completion_tokens;
    if (!j->stream || !j->logprobs) {
        sb->out = memdup(d->output, nc * sizeof *d->output);
        if (d->logprobs) sb->lp = memdup(d->logprobs, nc * sizeof *d->logprobs);
        if (d->n_logprobs && d->top_ids) {
            sb->top_ids = memdup(d->top_ids, nc * d->n_logprobs * sizeof *d->top_ids);
            sb->top_lp = memdup(d->top_logprobs, nc * d->n_logprobs * sizeof *d->top_logprobs);
        }
    }
    if (!j->stream) sb->text = strdup(d->text ? d->text : "");
    const bool oom =
        nc && ((!j->stream && (!sb->out || !sb->text)) || (d->logprobs && !j->stream && !sb->lp));
    if (oom && !j->err_status) {
        j->err_status = 500;
        snprintf(j->err_msg, sizeof j->err_msg, "out of memory");
    }
    if (d->finish == KVC_FINISH_ERROR && !j->err_status) {
        j->err_status = 500;
        snprintf(j->err_msg, sizeof j->err_msg, "the engine failed on this request");
    }
    sb->done = true;
    bool all = ++j->n_finished == j->n_submitted;
    if (all) {
        j->t_done = now_s();
        j->all_done = true;
    }
    pthread_mutex_unlock(&j->mu);
    mark_ready(s, j);
    return all;
}

/* Submit every engine request of a job; returns how many went in.  All or nothing: when one
 * is refused, those already in are aborted and the job ends with the refusal. */
static uint32_t submit_job(kvc_server_t *s, job_t *j)
{
    char msg[256] = "";
    int rc = 0;
    j->t_submit = now_s();
    for (uint32_t i = 0; i < j->n_subs && !rc; i++) {
        sub_t *sb = &j->subs[i];
        kvc_gen_params_t g = j->gp;
        g.n = 1;
        g.seed = j->gp.seed + sb->seed_k;
        g.tag = (uint64_t)(uintptr_t)sb;
        rc = kvc_engine_submit(s->e, j->toks + j->p_off[sb->prompt_i], j->p_len[sb->prompt_i], &g,
                               &sb->id, msg, sizeof msg);
        if (!rc) sb->submitted = true, j->n_submitted++;
    }
    if (rc) {
        for (uint32_t i = 0; i < j->n_subs; i++)
            if (j->subs[i].submitted) (void)kvc_engine_abort(s->e, j->subs[i].id);
        pthread_mutex_lock(&j->mu);
        j->err_status = rc == KVC_ENOMEM ? 503 : 400;
        snprintf(j->err_msg, sizeof j->err_msg, "%s", msg[0] ? msg : kvc_strerror(rc));
        if (!j->n_submitted) j->all_done = true, j->t_done = now_s();
        pthread_mutex_unlock(&j->mu);
        if (!j->n_submitted) {
            mark_ready(s, j);
            job_unref(j); /* the engine's reference: nothing of it runs */
        }
    }
    return j->n_submitted;
}

/* Engine thread: publish the engine's counters for /metrics.  The per-tenant ones (one entry
 * per tenant) at most every 50 ms while requests run, and whenever the engine goes idle
 * (`all`), so that a step's cost does not grow with the number of tenants. */
static void publish_stats(kvc_server_t *s, bool all)
{
    kvc_engine_stats_t st;
    kvc_pool_stats_t ps;
    kvc_engine_stats(s->e, &st);
    kvc_pool_stats(kvc_seqs_pool(kvc_engine_seqs(s->e)), &ps);
    const double t = now_s();
    all = all || t - s->tst_at >= 0.05;
    kvc_engine_tier_stats_t ts[KVC_ENGINE_MAX_TIERS];
    for (uint32_t i = 0; i < s->n_tiers; i++) (void)kvc_engine_tier_stats(s->e, i, &ts[i]);
    pthread_mutex_lock(&s->mu);
    s->st = st, s->ps = ps;
    memcpy(s->tier_st, ts, s->n_tiers * sizeof *ts);
    if (all) {
        const kvc_sched_t *sc = kvc_engine_sched(s->e);
        for (uint32_t i = 0; i < s->tenants.n_tenants; i++)
            (void)kvc_sched_tenant_stats(sc, i, &s->tst[i]); /* i < its n_tenants */
        s->tst_at = t;
    }
    pthread_mutex_unlock(&s->mu);
}

static void *engine_main(void *arg)
{
    kvc_server_t *s = arg;
    uint32_t n_live = 0;
    const double t0 = now_s();
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->sub_head && !s->abort_head && !n_live && !s->quit)
            pthread_cond_wait(&s->cv, &s->mu);
        if (s->quit && !n_live && !s->sub_head && !s->abort_head) break;
        job_t *subs = s->sub_head, *aborts = s->abort_head;
        s->sub_head = s->sub_tail = s->abort_head = NULL;
        pthread_mutex_unlock(&s->mu);
        for (job_t *j = subs, *nx; j; j = nx) {
            nx = j->next_submit;
            n_live += submit_job(s, j);
        }
        for (job_t *j = aborts, *nx; j; j = nx) {
            nx = j->next_abort;
            for (uint32_t i = 0; i < j->n_subs; i++)
                if (j->subs[i].submitted && !j->subs[i].finished)
                    (void)kvc_engine_abort(s->e, j->subs[i].id);
            job_unref(j); /* the abort queue's reference */
        }
        bool idle = true;
        uint32_t n_done = 0;
        if (n_live) {
            int rc = kvc_engine_step(s->e, now_s() - t0, on_event, s, &idle);
            (void)rc; /* the step's requests are finished with KVC_FINISH_ERROR: accounts below */
            const kvc_gen_done_t *done;
            kvc_engine_finished(s->e, &done, &n_done);
            for (uint32_t i = 0; i < n_done; i++) {
                job_t *j = ((sub_t *)(uintptr_t)done[i].tag)->job;
                n_live--;
                if (take_account(s, &done[i])) job_unref(j); /* the engine's reference */
            }
        }
        publish_stats(s, n_live == 0);
        pthread_mutex_lock(&s->mu);
        if (n_live && idle && !n_done && !s->sub_head && !s->abort_head) {
            /* nothing could run (waiting for memory others hold): wait for news, briefly */
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 2000000;
            if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
            pthread_cond_timedwait(&s->cv, &s->mu, &ts);
        }
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* Event thread: queue an abort of the job's engine requests. */
static void request_abort(kvc_server_t *s, job_t *j)
{
    atomic_fetch_add(&j->refs, 1);
    pthread_mutex_lock(&s->mu);
    j->next_abort = s->abort_head;
    s->abort_head = j;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* ---- logging -------------------------------------------------------------------------- */
static void logf_(kvc_server_t *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void logf_(kvc_server_t *s, const char *fmt, ...)
{
    if (!s->p.log) return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    s->p.log(s->p.log_ctx, line);
}

static const char *tenant_name(const kvc_server_t *s, int t)
{
    return t >= 0 ? s->tenants.tenants[t].name : "-";
}

static void log_request(kvc_server_t *s, const char *id, const char *path, int status, int tenant,
                        uint32_t prompt, uint32_t cached, uint32_t completion, double ms,
                        const char *err)
{
    if (!s->p.log) return;
    char e[200] = "";
    if (err) { /* the message may quote the client: keep the line one line of plain text */
        size_t k = 0;
        for (const char *c = err; *c && k + 1 < sizeof e; c++)
            e[k++] = (*c == '"' || *c == '\\' || (unsigned char)*c < 0x20) ? '\'' : *c;
        e[k] = 0;
    }
    if (s->p.log_json)
        logf_(s,
              "{\"id\": \"%s\", \"path\": \"%s\", \"status\": %d, \"tenant\": \"%s\", "
              "\"prompt_tokens\": %u, \"cached_tokens\": %u, \"completion_tokens\": %u, "
              "\"total_ms\": %.3f%s%s%s}",
              id, path, status, tenant_name(s, tenant), prompt, cached, completion, ms,
              err ? ", \"error\": \"" : "", e, err ? "\"" : "");
    else
        logf_(s, "%s POST %s %d tenant=%s prompt=%u cached=%u completion=%u total_ms=%.3f%s%s", id,
              path, status, tenant_name(s, tenant), prompt, cached, completion, ms,
              err ? " error=" : "", e);
}

/* ---- responses ------------------------------------------------------------------------ */
static void count_status(kvc_server_t *s, int status)
{
    const int c = status / 100;
    s->m_status[c >= 2 && c <= 5 ? c - 1 : 0]++;
}

/* While draining, the loop ends once nothing is in flight and every reply is written (or
 * the drain timeout passed: a client that does not read cannot hold the exit). */
static void maybe_exit(kvc_server_t *s)
{
    if (s->draining && !s->in_flight && (!s->unflushed || s->drain_expired))
        event_base_loopexit(s->base, NULL);
}

static void on_complete(struct evhttp_request *req, void *arg)
{
    (void)req;
    kvc_server_t *s = arg;
    s->unflushed--;
    maybe_exit(s);
}

static void track(kvc_server_t *s, struct evhttp_request *req)
{
    s->unflushed++;
    evhttp_request_set_on_complete_cb(req, on_complete, s);
}

static void send_json(kvc_server_t *s, struct evhttp_request *req, int status, const char *reason,
                      const char *body)
{
    track(s, req);
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    evhttp_add_header(h, "Content-Type", "application/json");
    struct evbuffer *b = evbuffer_new();
    if (b) evbuffer_add(b, body, strlen(body));
    count_status(s, status);
    evhttp_send_reply(req, status, reason, b);
    if (b) evbuffer_free(b);
}

static char *error_json(const kvc__srv_err_t *e)
{
    cJSON *o = cJSON_CreateObject(), *er = cJSON_AddObjectToObject(o, "error");
    if (!er) {
        cJSON_Delete(o);
        return NULL;
    }
    char safe[sizeof e->message];
    const size_t n = kvc__srv_utf8_prefix(e->message, strlen(e->message));
    memcpy(safe, e->message, n);
    safe[n] = 0;
    cJSON_AddStringToObject(er, "message", safe);
    cJSON_AddStringToObject(er, "type", e->type);
    if (e->param[0])
        cJSON_AddStringToObject(er, "param", e->param);
    else
        cJSON_AddNullToObject(er, "param");
    if (e->code)
        cJSON_AddStringToObject(er, "code", e->code);
    else
        cJSON_AddNullToObject(er, "code");
    char *t = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return t;
}

static const char *reason_of(int status)
{
    switch (status) {
    case 400:
        return "Bad Request";
    case 401:
        return "Unauthorized";
    case 404:
        return "Not Found";
    case 405:
        return "Method Not Allowed";
    case 413:
        return "Payload Too Large";
    case 429:
        return "Too Many Requests";
    case 503:
        return "Service Unavailable";
    default:
        return "Internal Server Error";
    }
}

static void send_error(kvc_server_t *s, struct evhttp_request *req, const kvc__srv_err_t *e)
{
    char *t = error_json(e);
    if (e->status == 429 || e->status == 503)
        evhttp_add_header(evhttp_request_get_output_headers(req), "Retry-After", "1");
    send_json(s, req, e->status, reason_of(e->status),
              t ? t
                : "{\"error\": {\"message\": \"out of memory\", \"type\": \"server_error\", "
                  "\"param\": null, \"code\": null}}");
    free(t);
}

/* The text of one token for logprobs, as valid UTF-8 (a token that is part of a character
 * gets U+FFFD for its bytes); its raw bytes go to bytes[] (chat). */
static void token_piece(const kvc_server_t *s, kvc_token_t id, char *out, size_t cap,
                        unsigned char *raw, size_t *n_raw)
{
    /* the piece as it reads inside a text: a tokenizer drops a leading space at the start
     * of a text only, so the piece is what a second copy adds after a first */
    size_t n = 0, n1 = 0, n2 = 0;
    char buf[256], one[256];
    const kvc_token_t two[2] = {id, id};
    const kvc_tokenizer_t *tok = kvc_llm_tokenizer(s->m);
    if (kvc_tokenizer_decode(tok, &id, 1, 0, one, sizeof one, &n1) ||
        kvc_tokenizer_decode(tok, two, 2, 0, buf, sizeof buf, &n2) || n2 < n1)
        n1 = n2 = 0;
    n = n2 - n1;
    memmove(buf, buf + n1, n);
    if (raw) memcpy(raw, buf, n), *n_raw = n;
    size_t o = 0, i = 0;
    while (i < n && o + 4 < cap) {
        size_t ok = kvc__srv_utf8_prefix(buf + i, n - i);
        if (ok) {
            size_t c = KVC_MIN(ok, cap - 4 - o);
            c = kvc__srv_utf8_prefix(buf + i, c);
            if (!c) break;
            memcpy(out + o, buf + i, c);
            o += c, i += c;
            continue;
        }
        memcpy(out + o, "\xEF\xBF\xBD", 3);
        o += 3, i++;
    }
    out[o] = 0;
}

/* logprobs of n tokens: chat {"content": [...]}, completions {"tokens", "token_logprobs",
 * "top_logprobs", "text_offset"}. */
static cJSON *logprobs_json(const kvc_server_t *s, const job_t *j, const kvc_token_t *toks,
                            const float *lp, uint32_t n, const kvc_token_t *top_ids,
                            const float *top_lp, uint32_t n_top, size_t *text_offset)
{
    cJSON *o = cJSON_CreateObject();
    char piece[1024];
    unsigned char raw[256];
    size_t n_raw = 0;
    if (j->chat) {
        cJSON *content = cJSON_AddArrayToObject(o, "content");
        for (uint32_t i = 0; i < n && content; i++) {
            cJSON *t = cJSON_CreateObject();
            token_piece(s, toks[i], piece, sizeof piece, raw, &n_raw);
            cJSON_AddStringToObject(t, "token", piece);
            cJSON_AddNumberToObject(t, "logprob", lp ? lp[i] : NAN);
            cJSON *bytes = cJSON_AddArrayToObject(t, "bytes");
            for (size_t b = 0; b < n_raw; b++)
                cJSON_AddItemToArray(bytes, cJSON_CreateNumber(raw[b]));
            cJSON *tops = cJSON_AddArrayToObject(t, "top_logprobs");
            for (uint32_t k = 0; top_ids && k < n_top; k++) {
                const kvc_token_t id = top_ids[(size_t)i * n_top + k];
                if (id < 0) continue;
                cJSON *x = cJSON_CreateObject();
                token_piece(s, id, piece, sizeof piece, raw, &n_raw);
                cJSON_AddStringToObject(x, "token", piece);
                cJSON_AddNumberToObject(x, "logprob", top_lp[(size_t)i * n_top + k]);
                cJSON *xb = cJSON_AddArrayToObject(x, "bytes");
                for (size_t b = 0; b < n_raw; b++)
                    cJSON_AddItemToArray(xb, cJSON_CreateNumber(raw[b]));
                cJSON_AddItemToArray(tops, x);
            }
            cJSON_AddItemToArray(content, t);
        }
        return o;
    }
    cJSON *tk = cJSON_AddArrayToObject(o, "tokens");
    cJSON *tl = cJSON_AddArrayToObject(o, "token_logprobs");
    cJSON *tt = top_ids ? cJSON_AddArrayToObject(o, "top_logprobs")
                        : cJSON_AddNullToObject(o, "top_logprobs");
    cJSON *to = cJSON_AddArrayToObject(o, "text_offset");
    for (uint32_t i = 0; i < n; i++) {
        token_piece(s, toks[i], piece, sizeof piece, NULL, NULL);
        cJSON_AddItemToArray(tk, cJSON_CreateString(piece));
        cJSON_AddItemToArray(tl, cJSON_CreateNumber(lp ? lp[i] : NAN));
        cJSON_AddItemToArray(to, cJSON_CreateNumber((double)*text_offset));
        *text_offset += strlen(piece);
        if (top_ids) {
            cJSON *m = cJSON_CreateObject();
            for (uint32_t k = 0; k < n_top; k++) {
                const kvc_token_t id = top_ids[(size_t)i * n_top + k];
                if (id < 0) continue;
                token_piece(s, id, piece, sizeof piece, NULL, NULL);
                if (!cJSON_GetObjectItemCaseSensitive(m, piece))
                    cJSON_AddNumberToObject(m, piece, top_lp[(size_t)i * n_top + k]);
            }
            cJSON_AddItemToArray(tt, m);
        }
    }
    return o;
}

static const char *finish_reason(kvc_finish_t f)
{
    return f == KVC_FINISH_LENGTH ? "length" : f == KVC_FINISH_ABORT ? "abort" : "stop";
}

typedef struct {
    double queue, tokenize, prefill, first_token, decode, total; /* ms */
} timings_t;

static timings_t job_timings(const job_t *j)
{
    timings_t t = {0};
    t.tokenize = (j->t_tok - j->t_recv) * 1e3;
    t.queue = j->t_submit ? (j->t_submit - j->t_tok) * 1e3 : NAN;
    t.prefill = j->t_first && j->t_submit ? (j->t_first - j->t_submit) * 1e3 : NAN;
    t.first_token = j->t_first ? (j->t_first - j->t_recv) * 1e3 : NAN;
    t.decode = j->t_first && j->t_done ? (j->t_done - j->t_first) * 1e3 : NAN;
    t.total = j->t_done ? (j->t_done - j->t_recv) * 1e3 : NAN;
    return t;
}

static void timings_header(const job_t *j, char *out, size_t cap)
{
    const timings_t t = job_timings(j);
    const double v[6] = {t.queue, t.tokenize, t.prefill, t.first_token, t.decode, t.total};
    static const char *const k[6] = {"queue",       "tokenize", "prefill",
                                     "first_token", "decode",   "total"};
    size_t o = 0;
    out[0] = 0;
    for (int i = 0; i < 6 && o < cap; i++)
        if (isfinite(v[i]))
            o += (size_t)snprintf(out + o, cap - o, "%s%s=%.3f", o ? ", " : "", k[i], v[i]);
}

static cJSON *usage_json(const job_t *j)
{
    uint32_t prompt = 0, cached = 0, completion = 0, tier[KVC_ENGINE_MAX_TIERS] = {0};
    uint32_t from_tiers = 0;
    const kvc_server_t *s = j->srv;
    for (uint32_t i = 0; i < j->n_subs; i++) {
        const sub_t *sb = &j->subs[i];
        if (sb->seed_k == 0) {
            prompt += sb->prompt_tokens, cached += sb->cached_tokens;
            for (uint32_t t = 0; t < s->n_tiers; t++)
                tier[t] += sb->tier_cached[t], from_tiers += sb->tier_cached[t];
        }
        completion += sb->completion_tokens;
    }
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", completion);
    cJSON_AddNumberToObject(u, "total_tokens", prompt + completion);
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", cached);
    if (s->n_tiers) { /* where the cached tokens came from: the pool, then each tier */
        cJSON *bt = cJSON_AddObjectToObject(d, "cached_tokens_by_tier");
        cJSON_AddNumberToObject(bt, "pool", cached >= from_tiers ? cached - from_tiers : 0);
        for (uint32_t t = 0; t < s->n_tiers; t++)
            cJSON_AddNumberToObject(bt, s->tier_label[t], tier[t]);
    }
    const timings_t t = job_timings(j);
    cJSON *k = cJSON_AddObjectToObject(u, "kvcache_timings");
#define MS(name, v) cJSON_AddNumberToObject(k, name, round((v)*1e3) / 1e3) /* to the us */
    MS("queue_ms", t.queue);
    MS("tokenize_ms", t.tokenize);
    MS("prefill_ms", t.prefill);
    MS("first_token_ms", t.first_token);
    MS("decode_ms", t.decode);
    MS("total_ms", t.total);
#undef MS
    return u;
}

static cJSON *envelope(const kvc_server_t *s, const job_t *j, bool chunk)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", j->id);
    cJSON_AddStringToObject(o, "object",
                            j->chat ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                    : "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)j->created);
    cJSON_AddStringToObject(o, "model", s->model_name);
    return o;
}

static void finalize(kvc_server_t *s, job_t *j, int status, const char *err);

/* Token ids as a JSON array (return_token_ids). */
static cJSON *token_ids_json(const kvc_token_t *t, uint32_t n)
{
    cJSON *a = cJSON_CreateArray();
    for (uint32_t i = 0; a && t && i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(t[i]));
    return a;
}

/* The whole response of a job that did not stream. */
static void send_full(kvc_server_t *s, job_t *j)
{
    cJSON *o = envelope(s, j, false);
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    for (uint32_t i = 0; i < j->n_subs; i++) {
        sub_t *sb = &j->subs[i];
        cJSON *c = cJSON_CreateObject();
        cJSON_AddNumberToObject(c, "index", sb->index);
        if (j->chat) {
            cJSON *m = cJSON_AddObjectToObject(c, "message");
            cJSON_AddStringToObject(m, "role", "assistant");
            cJSON_AddStringToObject(m, "content", sb->text ? sb->text : "");
        } else
            cJSON_AddStringToObject(c, "text", sb->text ? sb->text : "");
        if (j->logprobs) {
            size_t off = 0;
            cJSON_AddItemToObject(c, "logprobs",
                                  logprobs_json(s, j, sb->out, sb->lp, sb->completion_tokens,
                                                sb->top_ids, sb->top_lp, sb->n_top, &off));
        } else
            cJSON_AddNullToObject(c, "logprobs");
        cJSON_AddStringToObject(c, "finish_reason", finish_reason(sb->finish));
        if (j->token_ids)
            cJSON_AddItemToObject(c, "token_ids", token_ids_json(sb->out, sb->completion_tokens));
        cJSON_AddItemToArray(choices, c);
    }
    cJSON_AddItemToObject(o, "usage", usage_json(j));
    char *t = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    char th[256];
    timings_header(j, th, sizeof th);
    evhttp_add_header(evhttp_request_get_output_headers(j->req), "x-kvcache-timings", th);
    if (!t) {
        kvc__srv_err_t e;
        kvc__srv_err(&e, 500, NULL, NULL, "out of memory");
        send_error(s, j->req, &e);
        finalize(s, j, 500, "out of memory");
        return;
    }
    send_json(s, j->req, 200, "OK", t);
    free(t);
    finalize(s, j, 200, NULL);
}

static int sse(struct evhttp_request *req, cJSON *o)
{
    char *t = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!t) return KVC_ENOMEM;
    struct evbuffer *b = evbuffer_new();
    if (!b) {
        free(t);
        return KVC_ENOMEM;
    }
    evbuffer_add_printf(b, "data: %s\n\n", t);
    free(t);
    evhttp_send_reply_chunk(req, b);
    evbuffer_free(b);
    return 0;
}

static cJSON *stream_chunk(const kvc_server_t *s, const job_t *j, sub_t *sb, const char *text,
                           const char *finish)
{
    cJSON *o = envelope(s, j, true);
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    cJSON *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", sb->index);
    if (j->chat) {
        cJSON *d = cJSON_AddObjectToObject(c, "delta");
        if (!sb->role_sent) {
            cJSON_AddStringToObject(d, "role", "assistant");
            sb->role_sent = true;
        }
        if (text) cJSON_AddStringToObject(d, "content", text);
    } else
        cJSON_AddStringToObject(c, "text", text ? text : "");
    cJSON_AddNullToObject(c, "logprobs");
    if (finish)
        cJSON_AddStringToObject(c, "finish_reason", finish);
    else
        cJSON_AddNullToObject(c, "finish_reason");
    cJSON_AddItemToArray(choices, c);
    if (j->include_usage) cJSON_AddNullToObject(o, "usage");
    return o;
}

static void start_stream(kvc_server_t *s, job_t *j)
{
    struct evkeyvalq *h = evhttp_request_get_output_headers(j->req);
    evhttp_add_header(h, "Content-Type", "text/event-stream");
    evhttp_add_header(h, "Cache-Control", "no-cache");
    char th[256];
    timings_header(j, th, sizeof th); /* what is known by the first token */
    evhttp_add_header(h, "x-kvcache-timings", th);
    count_status(s, 200);
    track(s, j->req);
    evhttp_send_reply_start(j->req, 200, "OK");
    j->headers_sent = true;
}

/* Abort a job whose client cannot take its output: drop the connection (the close
 * callback queues the abort). */
static void drop_connection(kvc_server_t *s, job_t *j)
{
    struct evhttp_connection *c = evhttp_request_get_connection(j->req);
    logf_(s, "%s: the client does not read its stream; aborting it", j->id);
    j->req = NULL; /* freed with the connection */
    struct bufferevent *bev = evhttp_connection_get_bufferevent(c);
    const evutil_socket_t fd = bev ? bufferevent_getfd(bev) : -1;
    if (fd >= 0)
        shutdown(fd, SHUT_RDWR); /* the client sees the end now, whatever libevent defers */
    evhttp_connection_free(c);
}

static void close_cb(struct evhttp_connection *c, void *arg);

/* Event thread: move what the engine produced for j to its client. */
static void process_job(kvc_server_t *s, job_t *j)
{
    if (j->finalized) return;
    typedef struct {
        char *text;
        size_t len;
        kvc_token_t *tok;
        float *lp;
        uint32_t n;
        bool done;
    } take_t;
    take_t tk[KVC_MAX_SAMPLES];
    pthread_mutex_lock(&j->mu);
    const bool all_done = j->all_done;
    const int err = j->err_status;
    char err_msg[sizeof j->err_msg];
    memcpy(err_msg, j->err_msg, sizeof err_msg);
    for (uint32_t i = 0; i < j->n_subs; i++) {
        sub_t *sb = &j->subs[i];
        tk[i] = (take_t){sb->ptext, sb->plen, sb->ptok, sb->plp, sb->pn, sb->done};
        sb->ptext = NULL, sb->plen = sb->pcap = 0;
        sb->ptok = NULL, sb->plp = NULL, sb->pn = sb->ptcap = 0;
    }
    pthread_mutex_unlock(&j->mu);

    if (!j->gone && j->req) {
        if (err && all_done && !j->headers_sent) {
            kvc__srv_err_t e;
            kvc__srv_err(&e, err, NULL, NULL, "%s", err_msg);
            evhttp_connection_set_closecb(evhttp_request_get_connection(j->req), NULL, NULL);
            send_error(s, j->req, &e);
            finalize(s, j, err, err_msg);
        } else if (!j->stream) {
            if (all_done) {
                evhttp_connection_set_closecb(evhttp_request_get_connection(j->req), NULL, NULL);
                send_full(s, j);
            }
        } else {
            bool any = all_done;
            for (uint32_t i = 0; i < j->n_subs; i++) any |= tk[i].len || tk[i].n || tk[i].done;
            if (any && !j->headers_sent) start_stream(s, j);
            for (uint32_t i = 0; j->headers_sent && i < j->n_subs; i++) {
                sub_t *sb = &j->subs[i];
                if (tk[i].len || tk[i].n || (j->chat && !sb->role_sent)) {
                    cJSON *o = stream_chunk(s, j, sb, tk[i].text ? tk[i].text : "", NULL);
                    cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
                    if (j->logprobs && tk[i].n)
                        cJSON_ReplaceItemInObject(c, "logprobs",
                                                  logprobs_json(s, j, tk[i].tok, tk[i].lp, tk[i].n,
                                                                NULL, NULL, 0, &sb->text_offset));
                    if (j->token_ids)
                        cJSON_AddItemToObject(c, "token_ids", token_ids_json(tk[i].tok, tk[i].n));
                    (void)sse(j->req, o);
                }
                if (tk[i].done && !sb->finish_sent) {
                    sb->finish_sent = true;
                    (void)sse(j->req, stream_chunk(s, j, sb, NULL, finish_reason(sb->finish)));
                }
            }
            if (all_done && j->headers_sent) {
                if (err) {
                    kvc__srv_err_t e;
                    kvc__srv_err(&e, err, NULL, NULL, "%s", err_msg);
                    char *t = error_json(&e);
                    if (t) {
                        struct evbuffer *b = evbuffer_new();
                        if (b) {
                            evbuffer_add_printf(b, "data: %s\n\n", t);
                            evhttp_send_reply_chunk(j->req, b);
                            evbuffer_free(b);
                        }
                        free(t);
                    }
                }
                if (j->include_usage && !err) {
                    cJSON *o = envelope(s, j, true);
                    cJSON_AddArrayToObject(o, "choices");
                    cJSON_AddItemToObject(o, "usage", usage_json(j));
                    (void)sse(j->req, o);
                }
                struct evbuffer *b = evbuffer_new();
                if (b) {
                    evbuffer_add_printf(b, "data: [DONE]\n\n");
                    evhttp_send_reply_chunk(j->req, b);
                    evbuffer_free(b);
                }
                evhttp_connection_set_closecb(evhttp_request_get_connection(j->req), NULL, NULL);
                evhttp_send_reply_end(j->req);
                finalize(s, j, err ? err : 200, err ? err_msg : NULL);
            } else if (j->headers_sent) {
                struct evhttp_connection *c = evhttp_request_get_connection(j->req);
                struct bufferevent *bev = c ? evhttp_connection_get_bufferevent(c) : NULL;
                if (bev && evbuffer_get_length(bufferevent_get_output(bev)) > s->p.max_output_bytes)
                    drop_connection(s, j);
            }
        }
    } else if (all_done)
        finalize(s, j, 499, "client gone");
    for (uint32_t i = 0; i < j->n_subs; i++) free(tk[i].text), free(tk[i].tok), free(tk[i].lp);
}

static void finalize(kvc_server_t *s, job_t *j, int status, const char *err)
{
    if (j->finalized) return;
    j->finalized = true;
    if (j->gone && j->req) evhttp_request_free(j->req); /* orphaned by libevent at the EOF */
    j->req = NULL;
    kvc__srv_tenant_t *t = &s->tenants.tenants[j->tenant];
    t->in_flight--;
    t->kv_tokens -= j->kv_tokens;
    s->in_flight--;
    if (j->prev)
        j->prev->next = j->next;
    else
        s->active = j->next;
    if (j->next) j->next->prev = j->prev;
    uint32_t prompt = 0, cached = 0, completion = 0;
    for (uint32_t i = 0; i < j->n_subs; i++) {
        const sub_t *sb = &j->subs[i];
        if (sb->seed_k == 0) prompt += sb->prompt_tokens, cached += sb->cached_tokens;
        completion += sb->completion_tokens;
    }
    t->prompt_tokens += prompt, t->cached_tokens += cached, t->generation_tokens += completion;
    s->m_prompt += prompt, s->m_hit += cached, s->m_gen += completion;
    const timings_t tm = job_timings(j);
    if (status == 200) {
        s->m_requests_ok++;
        hist_add(&s->h_e2e, tm.total * 1e-3);
        hist_add(&s->h_ttft, tm.first_token * 1e-3);
        if (completion > j->n_subs)
            hist_add(&s->h_tpot, tm.decode * 1e-3 / ((double)completion / j->n_subs - 1));
        hist_add(&s->h_hop[HOP_QUEUE], tm.queue * 1e-3);
        hist_add(&s->h_hop[HOP_TOKENIZE], tm.tokenize * 1e-3);
        hist_add(&s->h_hop[HOP_PREFILL], tm.prefill * 1e-3);
        hist_add(&s->h_hop[HOP_DECODE], tm.decode * 1e-3);
    } else
        s->m_requests_err++;
    log_request(s, j->id, j->path, status, j->tenant, prompt, cached, completion, tm.total, err);
    maybe_exit(s);
    job_unref(j); /* the event thread's reference */
}

static void close_cb(struct evhttp_connection *c, void *arg)
{
    (void)c;
    job_t *j = arg;
    if (j->gone || j->finalized) return;
    j->gone = true;
    if (j->headers_sent) j->srv->unflushed--; /* the stream will never complete */
    request_abort(j->srv, j);
}

static void on_wake(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    kvc_server_t *s = arg;
    char buf[256];
    while (read(fd, buf, sizeof buf) > 0) {
    }
    /* one job at a time off the queue: the engine thread may queue a job again (and link it
     * anew) as soon as it is off, so the list is never walked outside the lock; and no more
     * than were queued on entry, so the loop gets back to writing what is queued */
    pthread_mutex_lock(&s->rmu);
    uint32_t n = 0;
    for (job_t *x = s->ready_head; x; x = x->next_ready) n++;
    pthread_mutex_unlock(&s->rmu);
    for (; n; n--) {
        pthread_mutex_lock(&s->rmu);
        job_t *j = s->ready_head;
        if (j) {
            s->ready_head = j->next_ready;
            if (!s->ready_head) s->ready_tail = NULL;
            j->in_ready = false;
        }
        pthread_mutex_unlock(&s->rmu);
        if (!j) break;
        process_job(s, j);
        job_unref(j); /* the ready queue's reference */
    }
    pthread_mutex_lock(&s->rmu);
    const bool more = s->ready_head != NULL;
    pthread_mutex_unlock(&s->rmu);
    if (more) wake(s->wake[1]);
}

/* ---- requests ------------------------------------------------------------------------- */
static int authenticate(kvc_server_t *s, struct evhttp_request *req, kvc__srv_err_t *e)
{
    if (!s->keyed) return 0;
    const char *a = evhttp_find_header(evhttp_request_get_input_headers(req), "Authorization");
    if (!a)
        return kvc__srv_err(e, 401, NULL, "invalid_api_key",
                            "no API key: send Authorization: Bearer KEY");
    if (strncasecmp(a, "Bearer ", 7))
        return kvc__srv_err(e, 401, NULL, "invalid_api_key", "Authorization must be Bearer KEY");
    const char *k = a + 7;
    while (*k == ' ') k++;
    int t = kvc__srv_tenants_find(&s->tenants, k, strlen(k));
    if (t < 0) return kvc__srv_err(e, 401, NULL, "invalid_api_key", "invalid API key");
    return t;
}

/* Tokenize a text prompt as `kvcache run` does (special tokens parsed, BOS as the model
 * asks). */
static int tokenize(kvc_server_t *s, const char *text, kvc_token_t **ids, uint32_t *n)
{
    const kvc_tokenizer_t *t = kvc_llm_tokenizer(s->m);
    const size_t len = strlen(text), cap = 3 * len + 8;
    size_t got = 0;
    if (!(*ids = malloc(cap * sizeof **ids))) return KVC_ENOMEM;
    unsigned flags = KVC_TOK_PARSE_SPECIAL;
    if (kvc_tokenizer_add_bos(t)) flags |= KVC_TOK_ADD_BOS;
    int rc = kvc_tokenizer_encode(t, text, len, flags, *ids, cap, &got);
    if (rc) {
        free(*ids);
        *ids = NULL;
        return rc;
    }
    *n = (uint32_t)got;
    return 0;
}

static int render_chat(kvc_server_t *s, const kvc__srv_req_t *r, char **out)
{
    kvc_chat_msg_t *m = malloc(r->n_msgs * sizeof *m);
    if (!m) return KVC_ENOMEM;
    for (uint32_t i = 0; i < r->n_msgs; i++)
        m[i] = (kvc_chat_msg_t){r->msgs[i].role, r->msgs[i].content};
    size_t need = 0;
    int rc = kvc_chat_render(s->p.chat_template, m, r->n_msgs, true, NULL, 0, &need);
    *out = NULL;
    if (rc == KVC_ERANGE && (*out = malloc(need + 1)))
        rc = kvc_chat_render(s->p.chat_template, m, r->n_msgs, true, *out, need + 1, &need);
    else if (rc == KVC_ERANGE)
        rc = KVC_ENOMEM;
    free(m);
    if (rc) free(*out), *out = NULL;
    return rc;
}

/* Build the job of a parsed request: tokens, limits, tenant checks.  Nothing changes outside
 * the job until it is committed, so a refusal is never half applied. */
static int build_job(kvc_server_t *s, const kvc__srv_req_t *r, int tenant, job_t *j,
                     kvc__srv_err_t *e)
{
    kvc__srv_tenant_t *t = &s->tenants.tenants[tenant];
    const uint32_t np = r->chat ? 1 : r->n_prompts;
    if ((uint64_t)np * r->n > KVC_MAX_SAMPLES)
        return kvc__srv_err(e, 400, "n", "invalid_value",
                            "at most %d choices per request (prompts x n)", KVC_MAX_SAMPLES);
    if (r->n > s->max_num_seqs)
        return kvc__srv_err(e, 400, "n", "invalid_value",
                            "n is %u, but at most %u requests run at once", r->n, s->max_num_seqs);
    j->p_off = calloc(np, sizeof *j->p_off);
    j->p_len = calloc(np, sizeof *j->p_len);
    if (!j->p_off || !j->p_len) return kvc__srv_err(e, 500, NULL, NULL, "out of memory");
    j->n_prompts = np;
    kvc_token_t **ids = calloc(np, sizeof *ids);
    if (!ids) return kvc__srv_err(e, 500, NULL, NULL, "out of memory");
    int rc = 0;
    uint64_t total = 0;
    const uint32_t vocab = kvc_llm_hparams(s->m)->vocab;
    for (uint32_t i = 0; i < np && !rc; i++) {
        if (r->chat) {
            char *text = NULL;
            int crc = render_chat(s, r, &text);
            if (crc)
                rc = kvc__srv_err(e, crc == KVC_ENOMEM ? 500 : 400, "messages", NULL,
                                  "cannot render the messages in the %s chat template: %s",
                                  kvc_chat_template_name(s->p.chat_template), kvc_strerror(crc));
            else if ((crc = tokenize(s, text, &ids[i], &j->p_len[i])))
                rc = kvc__srv_err(e, 500, NULL, NULL, "cannot tokenize: %s", kvc_strerror(crc));
            free(text);
        } else if (r->prompts[i].text) {
            int crc = tokenize(s, r->prompts[i].text, &ids[i], &j->p_len[i]);
            if (crc)
                rc = kvc__srv_err(e, 500, NULL, NULL, "cannot tokenize: %s", kvc_strerror(crc));
        } else {
            for (uint32_t k = 0; k < r->prompts[i].n_ids && !rc; k++)
                if ((uint32_t)r->prompts[i].ids[k] >= vocab)
                    rc = kvc__srv_err(e, 400, "prompt", "invalid_value",
                                      "prompt token %d is not in the vocabulary (%u)",
                                      r->prompts[i].ids[k], vocab);
            if (!rc && !(ids[i] = memdup(r->prompts[i].ids,
                                         r->prompts[i].n_ids * sizeof *r->prompts[i].ids)))
                rc = kvc__srv_err(e, 500, NULL, NULL, "out of memory");
            j->p_len[i] = r->prompts[i].n_ids;
        }
        if (rc) break;
        const uint32_t n = j->p_len[i];
        if (!n)
            rc = kvc__srv_err(e, 400, r->chat ? "messages" : "prompt", "invalid_value",
                              "the prompt is empty");
        else if (n >= s->max_ctx)
            rc = kvc__srv_err(e, 400, r->chat ? "messages" : "prompt", "context_length_exceeded",
                              "the prompt has %u tokens; this model's context holds %u (prompt "
                              "+ output)",
                              n, s->max_ctx);
        else if (t->max_prompt_tokens && n > t->max_prompt_tokens)
            rc = kvc__srv_err(e, 400, r->chat ? "messages" : "prompt", "prompt_too_long",
                              "the prompt has %u tokens; tenant '%s' may send at most %u", n,
                              t->name, t->max_prompt_tokens);
        j->p_off[i] = (uint32_t)total;
        total += n;
    }
    uint64_t max_tokens = 0, kv = 0;
    if (!rc) {
        if (!(j->toks = malloc((total ? total : 1) * sizeof *j->toks)))
            rc = kvc__srv_err(e, 500, NULL, NULL, "out of memory");
        for (uint32_t i = 0; i < np && !rc; i++)
            memcpy(j->toks + j->p_off[i], ids[i], j->p_len[i] * sizeof *j->toks);
    }
    for (uint32_t i = 0; i < np; i++) free(ids[i]);
    free(ids);
    if (rc) return rc;
    const uint64_t limit = s->p.max_tokens_limit ? s->p.max_tokens_limit : s->max_ctx;
    for (uint32_t i = 0; i < np; i++) {
        const uint64_t room = s->max_ctx - j->p_len[i];
        uint64_t mt;
        if (r->max_tokens_given) {
            if (r->max_tokens > limit)
                return kvc__srv_err(e, 400, "max_tokens", "invalid_value",
                                    "max_tokens is %llu; at most %llu",
                                    (unsigned long long)r->max_tokens, (unsigned long long)limit);
            if (r->max_tokens > room)
                return kvc__srv_err(e, 400, "max_tokens", "context_length_exceeded",
                                    "the prompt (%u tokens) + max_tokens (%llu) exceed this "
                                    "model's context of %u tokens",
                                    j->p_len[i], (unsigned long long)r->max_tokens, s->max_ctx);
            mt = r->max_tokens;
        } else
            mt = r->chat ? KVC_MIN(room, limit) : KVC_MIN(KVC_MIN(16, room), limit);
        max_tokens = KVC_MAX(max_tokens, mt);
        kv += (uint64_t)r->n * (j->p_len[i] + mt); /* the KV tokens it may hold */
    }
    if (t->kv_token_quota && kv > t->kv_token_quota)
        return kvc__srv_err(e, 400, NULL, "quota_exceeded",
                            "the request may hold %llu KV tokens (prompt + max_tokens, per "
                            "choice); tenant '%s' may hold %llu in all",
                            (unsigned long long)kv, t->name, (unsigned long long)t->kv_token_quota);
    if (s->in_flight >= s->p.max_queued)
        return kvc__srv_err(e, 503, NULL, "overloaded",
                            "the server has %u requests in flight; try again shortly",
                            s->in_flight);
    if (t->max_concurrent && t->in_flight >= t->max_concurrent)
        return kvc__srv_err(e, 429, NULL, "rate_limit_exceeded",
                            "tenant '%s' has %u requests in flight, its limit", t->name,
                            t->in_flight);
    if (t->kv_token_quota && t->kv_tokens + kv > t->kv_token_quota)
        return kvc__srv_err(e, 429, NULL, "quota_exceeded",
                            "tenant '%s' holds %llu of its %llu KV tokens; this request may need "
                            "%llu more",
                            t->name, (unsigned long long)t->kv_tokens,
                            (unsigned long long)t->kv_token_quota, (unsigned long long)kv);
    /* the generation parameters, stop strings copied into the job */
    j->gp = r->gp;
    j->gp.max_tokens = (uint32_t)max_tokens;
    for (uint32_t i = 0; i < r->gp.n_stop; i++) {
        if (!(j->stops[i] = strdup(r->gp.stop[i])))
            return kvc__srv_err(e, 500, NULL, NULL, "out of memory");
        j->gp.stop[i] = j->stops[i];
    }
    if (!r->gp.priority) j->gp.priority = t->priority;
    j->gp.tenant = (uint32_t)tenant; /* the scheduler's tenant of the same index */
    j->gp.ns = t->ns;
    if (r->cache_salt) { /* the request's own namespace inside its tenant's */
        size_t l = strlen(r->cache_salt) + strlen(t->name) + 16;
        char *b = malloc(l);
        if (!b) return kvc__srv_err(e, 500, NULL, NULL, "out of memory");
        snprintf(b, l, "req:%s\x1f%s", t->shared ? "" : t->name, r->cache_salt);
        int src = kvc_namespace_set_salt(&j->gp.ns, b);
        free(b);
        if (src) return kvc__srv_err(e, 500, NULL, NULL, "the salt digest failed");
    }
    j->n_subs = np * r->n;
    if (!(j->subs = calloc(j->n_subs, sizeof *j->subs)))
        return kvc__srv_err(e, 500, NULL, NULL, "out of memory");
    for (uint32_t i = 0; i < j->n_subs; i++)
        j->subs[i] = (sub_t){.job = j, .index = i, .prompt_i = i / r->n, .seed_k = i % r->n};
    /* per-prompt max_tokens: the engine caps each by the context, and max_tokens given was
     * checked against every prompt's room above */
    j->kv_tokens = kv;
    j->chat = r->chat, j->stream = r->stream, j->include_usage = r->include_usage;
    j->logprobs = r->logprobs, j->top_logprobs = r->top_logprobs;
    j->token_ids = r->return_token_ids;
    return 0;
}

static void handle_generate(kvc_server_t *s, struct evhttp_request *req, bool chat)
{
    const double t_recv = now_s();
    const char *path = chat ? "/v1/chat/completions" : "/v1/completions";
    kvc__srv_err_t e = {0};
    int tenant = 0;
    kvc__srv_req_t r;
    bool parsed = false;
    job_t *j = NULL;
    if (s->draining) {
        kvc__srv_err(&e, 503, NULL, "shutting_down", "the server is shutting down");
        goto fail;
    }
    if ((tenant = authenticate(s, req, &e)) < 0) {
        tenant = -1;
        goto fail;
    }
    if (chat && !s->p.has_chat_template) {
        kvc__srv_err(&e, 400, "messages", NULL,
                     "the model has no chat template: start the server with --chat-template "
                     "NAME, or use /v1/completions");
        goto fail;
    }
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    const size_t len = evbuffer_get_length(in);
    if (len > s->p.max_body_bytes) {
        kvc__srv_err(&e, 413, NULL, "body_too_large", "the body has %zu bytes; at most %zu", len,
                     s->p.max_body_bytes);
        goto fail;
    }
    const char *body = len ? (const char *)evbuffer_pullup(in, -1) : NULL;
    if (len && !body) {
        kvc__srv_err(&e, 500, NULL, NULL, "out of memory");
        goto fail;
    }
    if (kvc__srv_parse(body, len, chat, kvc_llm_hparams(s->m)->vocab, &r, &e)) goto fail;
    parsed = true;
    if (strcmp(r.model, s->model_name)) {
        kvc__srv_err(&e, 404, "model", "model_not_found", "the model '%.100s' does not exist",
                     r.model);
        goto fail;
    }
    if (!(j = calloc(1, sizeof *j))) {
        kvc__srv_err(&e, 500, NULL, NULL, "out of memory");
        goto fail;
    }
    pthread_mutex_init(&j->mu, NULL);
    atomic_init(&j->refs, 1);
    j->srv = s;
    j->tenant = tenant;
    j->t_recv = t_recv;
    if (build_job(s, &r, tenant, j, &e)) goto fail;
    j->t_tok = now_s();
    kvc__srv_req_free(&r);
    /* commit: from here on the job runs */
    snprintf(j->path, sizeof j->path, "%s", path);
    snprintf(j->id, sizeof j->id, "%s-%llu", chat ? "chatcmpl" : "cmpl",
             (unsigned long long)++s->next_id);
    j->created = (long long)time(NULL);
    j->req = req;
    kvc__srv_tenant_t *t = &s->tenants.tenants[tenant];
    t->in_flight++, t->kv_tokens += j->kv_tokens, t->requests++;
    s->in_flight++;
    j->next = s->active;
    if (s->active) s->active->prev = j;
    s->active = j;
    evhttp_connection_set_closecb(evhttp_request_get_connection(req), close_cb, j);
    atomic_fetch_add(&j->refs, 1); /* the engine's */
    pthread_mutex_lock(&s->mu);
    j->next_submit = NULL;
    if (s->sub_tail)
        s->sub_tail->next_submit = j;
    else
        s->sub_head = j;
    s->sub_tail = j;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return;
fail:
    if (parsed) kvc__srv_req_free(&r);
    job_unref(j);
    if (tenant >= 0) s->tenants.tenants[tenant].rejected++;
    log_request(s, "-", path, e.status, tenant, 0, 0, 0, (now_s() - t_recv) * 1e3, e.message);
    send_error(s, req, &e);
}

/* ---- /metrics --------------------------------------------------------------------------- */
static void metric(struct evbuffer *b, const char *name, const char *type, const char *help)
{
    evbuffer_add_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void hist_out(struct evbuffer *b, const char *name, const char *label, const hist_t *h)
{
    uint64_t cum = 0;
    for (int i = 0; i < N_BUCKETS; i++) {
        cum += h->counts[i];
        evbuffer_add_printf(b, "%s_bucket{%s%sle=\"%g\"} %llu\n", name, label, label[0] ? "," : "",
                            lat_bounds[i], (unsigned long long)cum);
    }
    cum += h->counts[N_BUCKETS];
    evbuffer_add_printf(b, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", name, label, label[0] ? "," : "",
                        (unsigned long long)cum);
    evbuffer_add_printf(b, "%s_sum%s%s%s %.9g\n%s_count%s%s%s %llu\n", name, label[0] ? "{" : "",
                        label, label[0] ? "}" : "", h->sum, name, label[0] ? "{" : "", label,
                        label[0] ? "}" : "", (unsigned long long)h->count);
}

/* Each tier's label in /metrics and usage: its kind, "kind.N" for the N-th tier of a kind. */
static void tier_labels(kvc_server_t *s)
{
    uint32_t seen[3] = {0};
    for (uint32_t i = 0; i < s->n_tiers; i++) {
        kvc_engine_tier_stats_t ts;
        if (kvc_engine_tier_stats(s->e, i, &ts)) ts.kind = KVC_TIER_HOST;
        const uint32_t k = (uint32_t)ts.kind < 3 ? (uint32_t)ts.kind : 0;
        if (seen[k]++)
            snprintf(s->tier_label[i], sizeof s->tier_label[i], "%s.%u",
                     kvc_tier_kind_name(ts.kind), seen[k]);
        else
            snprintf(s->tier_label[i], sizeof s->tier_label[i], "%s", kvc_tier_kind_name(ts.kind));
    }
}

/* The tiers' counters: kvcache_tier_*{tier="host|disk|redis"} (see docs/tiers.md). */
static void tier_metrics(struct evbuffer *b, const kvc_server_t *s,
                         const kvc_engine_tier_stats_t *ts)
{
#define TIER_U64(field) offsetof(kvc_engine_tier_stats_t, field)
    static const struct {
        const char *name, *type, *help;
        size_t off;
    } tm[] = {
        {"kvcache_tier_hits_total", "counter", "fetches that returned verified bytes",
         TIER_U64(store.n_hits)},
        {"kvcache_tier_misses_total", "counter",
         "fetches that did not (absent, corrupt, a fault, a timeout)", TIER_U64(store.n_misses)},
        {"kvcache_tier_read_bytes_total", "counter", "record bytes read by hits",
         TIER_U64(store.bytes_read)},
        {"kvcache_tier_written_bytes_total", "counter", "record bytes written",
         TIER_U64(store.bytes_written)},
        {"kvcache_tier_fetched_blocks_total", "counter",
         "blocks copied from the tier into the pool, verified and made matchable",
         TIER_U64(fetched_blocks)},
        {"kvcache_tier_recompute_chosen_total", "counter",
         "blocks found in the tier but recomputed: the fetch would have cost more",
         TIER_U64(recompute_blocks)},
        {"kvcache_tier_fetch_failed_total", "counter",
         "blocks whose fetch failed (corrupt, a fault, a timeout) and were recomputed",
         TIER_U64(fetch_failed_blocks)},
        {"kvcache_tier_offloaded_blocks_total", "counter",
         "blocks copied down ahead of their eviction (mode evict)", TIER_U64(offloaded_blocks)},
        {"kvcache_tier_written_through_blocks_total", "counter",
         "blocks written as they were computed (mode write-through)",
         TIER_U64(written_through_blocks)},
        {"kvcache_tier_faults_total", "counter",
         "medium failures: write errors, lost connections, timeouts", TIER_U64(store.n_faults)},
        {"kvcache_tier_corrupt_total", "counter",
         "records dropped: checksum or format wrong", TIER_U64(store.n_corrupt)},
        {"kvcache_tier_mismatch_total", "counter",
         "records dropped: another identity under the block's hash", TIER_U64(store.n_mismatch)},
        {"kvcache_tier_budget_refused_total", "counter", "writes refused by the write budget",
         TIER_U64(store.n_budget_refused)},
        {"kvcache_tier_admission_refused_total", "counter",
         "writes refused by the admission policy", TIER_U64(store.n_admission_refused)},
        {"kvcache_tier_evictions_total", "counter", "records dropped for space",
         TIER_U64(store.n_evictions)},
        {"kvcache_tier_records", "gauge", "records held (host, disk; 0 for redis)",
         TIER_U64(store.n_records)},
    };
#undef TIER_U64
    for (size_t k = 0; k < KVC_ARRAY_LEN(tm); k++) {
        metric(b, tm[k].name, tm[k].type, tm[k].help);
        for (uint32_t i = 0; i < s->n_tiers; i++)
            evbuffer_add_printf(
                b, "%s{tier=\"%s\"} %llu\n", tm[k].name, s->tier_label[i],
                (unsigned long long)*(const uint64_t *)((const char *)&ts[i] + tm[k].off));
    }
    metric(b, "kvcache_tier_fetch_latency_estimate_seconds", "gauge",
           "the fetch-or-recompute decision's current round-trip estimate");
    for (uint32_t i = 0; i < s->n_tiers; i++)
        evbuffer_add_printf(b, "kvcache_tier_fetch_latency_estimate_seconds{tier=\"%s\"} %.9g\n",
                            s->tier_label[i], ts[i].latency_s);
    metric(b, "kvcache_tier_bandwidth_estimate_bytes_per_second", "gauge",
           "the fetch-or-recompute decision's current bandwidth estimate");
    for (uint32_t i = 0; i < s->n_tiers; i++)
        evbuffer_add_printf(b,
                            "kvcache_tier_bandwidth_estimate_bytes_per_second{tier=\"%s\"} %.6g\n",
                            s->tier_label[i], ts[i].bandwidth_Bps);
    metric(b, "kvcache_tier_fetch_seconds", "histogram", "time per fetch from the tier");
    const uint64_t *bounds = kvc_tier_latency_bounds_ns();
    for (uint32_t i = 0; i < s->n_tiers; i++) {
        const kvc_tier_stats_t *st = &ts[i].store;
        uint64_t cum = 0;
        for (int k = 0; k < KVC_TIER_LAT_BUCKETS - 1; k++) {
            cum += st->latency_counts[k];
            evbuffer_add_printf(b, "kvcache_tier_fetch_seconds_bucket{tier=\"%s\",le=\"%g\"} %llu\n",
                                s->tier_label[i], (double)bounds[k] * 1e-9,
                                (unsigned long long)cum);
        }
        cum += st->latency_counts[KVC_TIER_LAT_BUCKETS - 1];
        evbuffer_add_printf(b, "kvcache_tier_fetch_seconds_bucket{tier=\"%s\",le=\"+Inf\"} %llu\n",
                            s->tier_label[i], (unsigned long long)cum);
        evbuffer_add_printf(b, "kvcache_tier_fetch_seconds_sum{tier=\"%s\"} %.9g\n",
                            s->tier_label[i], (double)st->latency_sum_ns * 1e-9);
        evbuffer_add_printf(b, "kvcache_tier_fetch_seconds_count{tier=\"%s\"} %llu\n",
                            s->tier_label[i], (unsigned long long)cum);
    }
}

static void handle_metrics(kvc_server_t *s, struct evhttp_request *req)
{
    pthread_mutex_lock(&s->mu);
    const kvc_engine_stats_t st = s->st;
    const kvc_pool_stats_t ps = s->ps;
    kvc_engine_tier_stats_t ts[KVC_ENGINE_MAX_TIERS];
    memcpy(ts, s->tier_st, s->n_tiers * sizeof *ts);
    uint32_t queued = 0;
    for (job_t *j = s->sub_head; j; j = j->next_submit) queued += j->n_subs;
    pthread_mutex_unlock(&s->mu);
    struct evbuffer *b = evbuffer_new();
    if (!b) {
        evhttp_send_error(req, 500, "out of memory");
        return;
    }
#define GAUGE(n, h, v)                                                   \
    do {                                                                 \
        metric(b, n, "gauge", h);                                        \
        evbuffer_add_printf(b, "%s %llu\n", n, (unsigned long long)(v)); \
    } while (0)
#define COUNTER(n, h, v)                                                 \
    do {                                                                 \
        metric(b, n, "counter", h);                                      \
        evbuffer_add_printf(b, "%s %llu\n", n, (unsigned long long)(v)); \
    } while (0)
    GAUGE("kvcache_kv_blocks_total", "KV blocks in the pool", ps.n_blocks);
    GAUGE("kvcache_kv_blocks_used", "KV blocks referenced by a request", ps.n_used);
    GAUGE("kvcache_kv_blocks_cached", "KV blocks free but still hittable prefixes",
          ps.n_free_cached);
    GAUGE("kvcache_kv_block_size_tokens", "tokens per KV block", s->block_size);
    COUNTER("kvcache_prefix_hit_tokens_total", "prompt tokens served from the prefix cache",
            s->m_hit);
    COUNTER("kvcache_prompt_tokens_total", "prompt tokens of finished requests", s->m_prompt);
    COUNTER("kvcache_generation_tokens_total", "tokens generated by finished requests", s->m_gen);
    COUNTER("kvcache_preemptions_total", "requests preempted for memory", st.preemptions);
    COUNTER("kvcache_engine_steps_total", "engine steps that computed something", st.steps);
    metric(b, "kvcache_engine_step_seconds_total", "counter",
           "wall time inside those steps (the forward pass, scheduling, sampling): beside the "
           "steps' count and the request timings, what the step loop spends outside them");
    evbuffer_add_printf(b, "kvcache_engine_step_seconds_total %.6f\n", st.prefill_s + st.decode_s);
    GAUGE("kvcache_requests_running", "engine requests running", st.n_running);
    GAUGE("kvcache_requests_waiting",
          "engine requests waiting (queued in the engine or handed over)", st.n_waiting + queued);
    GAUGE("kvcache_requests_in_flight", "HTTP requests being served", s->in_flight);
    COUNTER("kvcache_request_success_total", "requests answered 200", s->m_requests_ok);
    COUNTER("kvcache_request_failure_total", "generation requests that failed or were aborted",
            s->m_requests_err);
    metric(b, "kvcache_http_responses_total", "counter", "HTTP responses by status class");
    static const char *const cls[6] = {"other", "2xx", "3xx", "4xx", "5xx", ""};
    for (int i = 0; i < 5; i++)
        evbuffer_add_printf(b, "kvcache_http_responses_total{code=\"%s\"} %llu\n", cls[i],
                            (unsigned long long)s->m_status[i]);
    metric(b, "kvcache_time_to_first_token_seconds", "histogram", "time to first token");
    hist_out(b, "kvcache_time_to_first_token_seconds", "", &s->h_ttft);
    metric(b, "kvcache_time_per_output_token_seconds", "histogram",
           "time per output token after the first");
    hist_out(b, "kvcache_time_per_output_token_seconds", "", &s->h_tpot);
    metric(b, "kvcache_e2e_request_latency_seconds", "histogram", "request latency end to end");
    hist_out(b, "kvcache_e2e_request_latency_seconds", "", &s->h_e2e);
    metric(b, "kvcache_hop_seconds", "histogram",
           "time per hop: queue (handed to the engine), tokenize, prefill (to the first "
           "token), decode (after it)");
    for (int h = 0; h < N_HOPS; h++) {
        char l[32];
        snprintf(l, sizeof l, "hop=\"%s\"", hop_names[h]);
        hist_out(b, "kvcache_hop_seconds", l, &s->h_hop[h]);
    }
    static const struct {
        const char *name, *type, *help;
        size_t off;
    } tm[] = {
        {"kvcache_tenant_requests_total", "counter", "requests admitted",
         offsetof(kvc__srv_tenant_t, requests)},
        {"kvcache_tenant_rejected_total", "counter", "requests refused (4xx/5xx)",
         offsetof(kvc__srv_tenant_t, rejected)},
        {"kvcache_tenant_prompt_tokens_total", "counter", "prompt tokens",
         offsetof(kvc__srv_tenant_t, prompt_tokens)},
        {"kvcache_tenant_prefix_hit_tokens_total", "counter", "prompt tokens from the prefix cache",
         offsetof(kvc__srv_tenant_t, cached_tokens)},
        {"kvcache_tenant_generation_tokens_total", "counter", "tokens generated",
         offsetof(kvc__srv_tenant_t, generation_tokens)},
        {"kvcache_tenant_kv_tokens", "gauge", "KV tokens its in-flight requests may hold",
         offsetof(kvc__srv_tenant_t, kv_tokens)},
    };
    for (size_t k = 0; k < KVC_ARRAY_LEN(tm); k++) {
        metric(b, tm[k].name, tm[k].type, tm[k].help);
        for (uint32_t i = 0; i < s->tenants.n_tenants; i++) {
            const kvc__srv_tenant_t *t = &s->tenants.tenants[i];
            evbuffer_add_printf(
                b, "%s{tenant=\"%s\"} %llu\n", tm[k].name, t->name,
                (unsigned long long)*(const uint64_t *)((const char *)t + tm[k].off));
        }
    }
    /* the scheduler's books per tenant (published by the engine thread, read under mu) */
    pthread_mutex_lock(&s->mu);
    metric(b, "kvcache_tenant_kv_blocks", "gauge", "KV blocks its running requests hold");
    for (uint32_t i = 0; i < s->tenants.n_tenants; i++)
        evbuffer_add_printf(b, "kvcache_tenant_kv_blocks{tenant=\"%s\"} %u\n",
                            s->tenants.tenants[i].name, s->tst[i].blocks);
    metric(b, "kvcache_tenant_computed_tokens_total", "counter",
           "tokens the engine computed for it (prompt and decode)");
    for (uint32_t i = 0; i < s->tenants.n_tenants; i++)
        evbuffer_add_printf(b, "kvcache_tenant_computed_tokens_total{tenant=\"%s\"} %llu\n",
                            s->tenants.tenants[i].name, (unsigned long long)s->tst[i].computed);
    metric(b, "kvcache_tenant_kv_token_seconds_total", "counter",
           "KV tokens its requests held, times seconds");
    for (uint32_t i = 0; i < s->tenants.n_tenants; i++)
        evbuffer_add_printf(b, "kvcache_tenant_kv_token_seconds_total{tenant=\"%s\"} %.6g\n",
                            s->tenants.tenants[i].name, s->tst[i].kv_token_s);
    pthread_mutex_unlock(&s->mu);
    tier_metrics(b, s, ts);
    metric(b, "kvcache_tenant_requests_in_flight", "gauge", "requests being served");
    for (uint32_t i = 0; i < s->tenants.n_tenants; i++)
        evbuffer_add_printf(b, "kvcache_tenant_requests_in_flight{tenant=\"%s\"} %u\n",
                            s->tenants.tenants[i].name, s->tenants.tenants[i].in_flight);
#undef GAUGE
#undef COUNTER
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
                      "text/plain; version=0.0.4");
    count_status(s, 200);
    evhttp_send_reply(req, 200, "OK", b);
    evbuffer_free(b);
}

static void on_request(struct evhttp_request *req, void *arg)
{
    kvc_server_t *s = arg;
    const struct evhttp_uri *u = evhttp_request_get_evhttp_uri(req);
    const char *path = u ? evhttp_uri_get_path(u) : NULL;
    if (!path) path = "";
    const enum evhttp_cmd_type cmd = evhttp_request_get_command(req);
    const bool get = cmd == EVHTTP_REQ_GET, post = cmd == EVHTTP_REQ_POST;
    kvc__srv_err_t e;
    const bool gen = !strcmp(path, "/v1/completions") || !strcmp(path, "/v1/chat/completions");
    const bool getters =
        !strcmp(path, "/v1/models") || !strcmp(path, "/health") || !strcmp(path, "/metrics");
    if (gen && post) {
        handle_generate(s, req, !strcmp(path, "/v1/chat/completions"));
        return;
    }
    if (!(gen || getters)) {
        kvc__srv_err(&e, 404, NULL, "not_found", "no such endpoint");
        send_error(s, req, &e);
        return;
    }
    if (!get || gen) {
        kvc__srv_err(&e, 405, NULL, "method_not_allowed", "%s takes %s", path,
                     gen ? "POST" : "GET");
        evhttp_add_header(evhttp_request_get_output_headers(req), "Allow", gen ? "POST" : "GET");
        send_error(s, req, &e);
        return;
    }
    if (!strcmp(path, "/health")) {
        send_json(s, req, s->draining ? 503 : 200, s->draining ? "Service Unavailable" : "OK",
                  s->draining ? "{\"status\": \"draining\"}" : "{\"status\": \"ok\"}");
    } else if (!strcmp(path, "/metrics")) {
        handle_metrics(s, req);
    } else {
        if (authenticate(s, req, &e) < 0) {
            send_error(s, req, &e);
            return;
        }
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "object", "list");
        cJSON *d = cJSON_AddArrayToObject(o, "data");
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "id", s->model_name);
        cJSON_AddStringToObject(m, "object", "model");
        cJSON_AddNumberToObject(m, "created", 0);
        cJSON_AddStringToObject(m, "owned_by", "kvcache");
        cJSON_AddNumberToObject(m, "max_model_len", s->max_ctx);
        cJSON_AddItemToArray(d, m);
        char *t = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
        send_json(s, req, t ? 200 : 500, t ? "OK" : "Internal Server Error", t ? t : "{}");
        free(t);
    }
}

/* ---- lifecycle ------------------------------------------------------------------------ */
static void on_drain_timeout(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    kvc_server_t *s = arg;
    s->drain_expired = true;
    if (s->in_flight)
        logf_(s, "drain: %u request(s) still in flight after %g s; aborting them", s->in_flight,
              s->p.drain_timeout_s);
    for (job_t *j = s->active; j; j = j->next)
        if (!j->gone) request_abort(s, j);
    maybe_exit(s);
}

static void on_stop(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    kvc_server_t *s = arg;
    char buf[64];
    while (read(fd, buf, sizeof buf) > 0) {
    }
    if (s->draining) return;
    s->draining = true;
    logf_(s, "draining: %u request(s) in flight", s->in_flight);
    if (s->sock) evhttp_del_accept_socket(s->http, s->sock), s->sock = NULL;
    maybe_exit(s);
    const struct timeval tv = {
        (time_t)s->p.drain_timeout_s,
        (suseconds_t)((s->p.drain_timeout_s - floor(s->p.drain_timeout_s)) * 1e6)};
    s->drain_ev = evtimer_new(s->base, on_drain_timeout, s);
    if (s->drain_ev) evtimer_add(s->drain_ev, &tv);
}

kvc_server_params_t kvc_server_params_default(void)
{
    return (kvc_server_params_t){.host = "127.0.0.1",
                                 .port = 8080,
                                 .model_name = "model",
                                 .max_body_bytes = 1 << 20,
                                 .max_output_bytes = 4 << 20,
                                 .max_queued = 256,
                                 .drain_timeout_s = 30};
}

static int make_pipe(int fd[2])
{
    if (pipe(fd)) return KVC_EIO;
    for (int i = 0; i < 2; i++) {
        fcntl(fd[i], F_SETFL, fcntl(fd[i], F_GETFL) | O_NONBLOCK);
        fcntl(fd[i], F_SETFD, FD_CLOEXEC);
    }
    return 0;
}

int kvc_server_create(const kvc_llm_t *m, const kvc_engine_params_t *ep,
                      const kvc_server_params_t *p, kvc_server_t **out, char *msg, size_t cap)
{
    if (out) *out = NULL;
    if (!m || !ep || !p || !out || !p->host || !p->model_name || !p->model_name[0])
        return kvc__msgf(KVC_EINVAL, msg, cap, "server: NULL arguments");
    if (!p->max_body_bytes || !p->max_output_bytes || !p->max_queued ||
        !(p->drain_timeout_s >= 0 && p->drain_timeout_s <= 86400) ||
        (p->has_chat_template && (unsigned)p->chat_template >= KVC_CHAT__COUNT))
        return kvc__msgf(KVC_EINVAL, msg, cap, "server: a parameter is out of range");
    /* the address first, so that libevent (which prints) never sees one it cannot resolve */
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE},
                    *ai = NULL;
    if (getaddrinfo(p->host, NULL, &hints, &ai) || !ai)
        return kvc__msgf(KVC_EINVAL, msg, cap, "server: '%.100s' is not an address to bind",
                         p->host);
    freeaddrinfo(ai);
    kvc_server_t *s = calloc(1, sizeof *s);
    if (!s) return kvc__msgf(KVC_ENOMEM, msg, cap, "out of memory");
    s->m = m;
    s->p = *p;
    s->wake[0] = s->wake[1] = s->stop_fd[0] = s->stop_fd[1] = -1;
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->rmu, NULL);
    pthread_cond_init(&s->cv, NULL);
    int rc = 0;
    if (!(s->model_name = strdup(p->model_name)))
        rc = kvc__msgf(KVC_ENOMEM, msg, cap, "out of memory");
    s->p.model_name = s->model_name;
    s->p.api_keys_json = NULL;
    if (!rc && p->api_keys_json) {
        rc = kvc__srv_tenants_parse(p->api_keys_json, strlen(p->api_keys_json), &s->tenants, msg,
                                    cap);
        s->keyed = !rc;
    } else if (!rc) { /* no keys: one tenant, the shared cache, no limits */
        s->tenants.tenants = calloc(1, sizeof *s->tenants.tenants);
        if (!s->tenants.tenants || !(s->tenants.tenants[0].name = strdup("default")))
            rc = kvc__msgf(KVC_ENOMEM, msg, cap, "out of memory");
        else
            s->tenants.n_tenants = 1, s->tenants.tenants[0].shared = true;
    }
    /* one scheduler tenant per tenant of the file, so that its per-tenant books are theirs */
    kvc_engine_params_t ep2 = *ep;
    if (!rc && ep2.n_tenants < s->tenants.n_tenants) ep2.n_tenants = s->tenants.n_tenants;
    if (!rc && !(s->tst = calloc(s->tenants.n_tenants, sizeof *s->tst)))
        rc = kvc__msgf(KVC_ENOMEM, msg, cap, "out of memory");
    if (!rc) rc = kvc_engine_create(m, &ep2, &s->e, msg, cap);
    if (!rc) {
        const kvc_model_hparams_t *h = kvc_llm_hparams(m);
        s->max_ctx = ep->max_ctx ? ep->max_ctx : (uint32_t)KVC_MIN(h->ctx ? h->ctx : 2048, 32768);
        kvc_engine_stats_t st;
        kvc_engine_stats(s->e, &st);
        s->block_size = st.block_size;
        s->max_num_seqs = ep->max_num_seqs ? ep->max_num_seqs : 64;
        s->n_tiers = KVC_MIN(kvc_engine_n_tiers(s->e), (uint32_t)KVC_ENGINE_MAX_TIERS);
        tier_labels(s);
        publish_stats(s, true);
    }
    if (!rc && (make_pipe(s->wake) || make_pipe(s->stop_fd)))
        rc = kvc__msgf(KVC_EIO, msg, cap, "server: pipe: %s", strerror(errno));
    if (!rc && (!(s->base = event_base_new()) || !(s->http = evhttp_new(s->base))))
        rc = kvc__msgf(KVC_ENOMEM, msg, cap, "server: cannot create the event loop");
    if (!rc) {
        s->wake_ev = event_new(s->base, s->wake[0], EV_READ | EV_PERSIST, on_wake, s);
        s->stop_ev = event_new(s->base, s->stop_fd[0], EV_READ | EV_PERSIST, on_stop, s);
        if (!s->wake_ev || !s->stop_ev || event_add(s->wake_ev, NULL) ||
            event_add(s->stop_ev, NULL))
            rc = kvc__msgf(KVC_ENOMEM, msg, cap, "server: cannot create events");
    }
    if (!rc) {
        evhttp_set_max_body_size(s->http, (ev_ssize_t)p->max_body_bytes);
        evhttp_set_max_headers_size(s->http, 64 * 1024);
        evhttp_set_timeout(s->http, 600); /* a long generation is not an idle connection */
        evhttp_set_allowed_methods(s->http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_HEAD |
                                                EVHTTP_REQ_PUT | EVHTTP_REQ_DELETE |
                                                EVHTTP_REQ_OPTIONS | EVHTTP_REQ_PATCH);
        evhttp_set_gencb(s->http, on_request, s);
        if (!(s->sock = evhttp_bind_socket_with_handle(s->http, p->host, p->port)))
            rc = kvc__msgf(KVC_EIO, msg, cap, "server: cannot listen on %s:%u", p->host, p->port);
    }
    if (!rc) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        if (getsockname(evhttp_bound_socket_get_fd(s->sock), (struct sockaddr *)&ss, &sl))
            rc = kvc__msgf(KVC_EIO, msg, cap, "server: getsockname: %s", strerror(errno));
        else if (ss.ss_family == AF_INET)
            s->port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
        else if (ss.ss_family == AF_INET6)
            s->port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    }
    if (rc) {
        kvc_server_destroy(s);
        return rc;
    }
    *out = s;
    return 0;
}

uint16_t kvc_server_port(const kvc_server_t *s)
{
    return s ? s->port : 0;
}

int kvc_server_run(kvc_server_t *s)
{
    if (!s) return KVC_EINVAL;
    if (s->ran) return KVC_EBUSY;
    s->ran = true;
    if (pthread_create(&s->th, NULL, engine_main, s)) return KVC_EIO;
    s->th_started = true;
    event_base_dispatch(s->base);
    /* every job is finalized (the loop exits only when none is in flight) */
    pthread_mutex_lock(&s->mu);
    s->quit = true;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->th, NULL);
    s->th_started = false;
    for (;;) { /* release what the engine thread queued last */
        pthread_mutex_lock(&s->rmu);
        const bool more = s->ready_head != NULL;
        pthread_mutex_unlock(&s->rmu);
        if (!more) break;
        on_wake(s->wake[0], 0, s);
    }
    return 0;
}

void kvc_server_stop(kvc_server_t *s)
{
    if (s) wake(s->stop_fd[1]);
}

void kvc_server_destroy(kvc_server_t *s)
{
    if (!s) return;
    if (s->http) evhttp_free(s->http);
    if (s->wake_ev) event_free(s->wake_ev);
    if (s->stop_ev) event_free(s->stop_ev);
    if (s->drain_ev) event_free(s->drain_ev);
    if (s->base) event_base_free(s->base);
    for (int i = 0; i < 2; i++) {
        if (s->wake[i] >= 0) close(s->wake[i]);
        if (s->stop_fd[i] >= 0) close(s->stop_fd[i]);
    }
    kvc_engine_destroy(s->e);
    kvc__srv_tenants_free(&s->tenants);
    free(s->tst);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->rmu);
    pthread_cond_destroy(&s->cv);
    free(s->model_name);
    free(s);
}
