/* redis.c - the remote tier: a redis-server that many replicas share (the existing
 * distributed store; kvcache writes no network store of its own).  Values are whole
 * records (tier_int.h's format, binary-safe through %b), keys
 *
 *     <prefix>:<model id>:<weight epoch>:<block hash hex>:<namespace digest hex>
 *
 * so two models, two epochs or two namespaces never meet even before the identity check.
 * Batches are pipelined: get_many and put_many write every command, then read every
 * reply, one round trip.  A connect or command timeout (params.timeout_ms) is the fetch
 * deadline.  Any failure of the connection (refused, reset, timed out, a server killed) is
 * a miss counted in n_faults; the context is dropped and a later call reconnects once the
 * backoff (params.backoff_ms, doubling up to 5 s, on the store's clock) has passed.
 *
 * SIGPIPE: a write to a server that went away raises SIGPIPE, whose default kills the
 * process.  The library must not change process-wide signal dispositions, so each call
 * blocks SIGPIPE in the calling thread and consumes one it raised before unblocking. */
#include "tier/tier_int.h"

#include <errno.h>
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define KEY_MAX        256
#define MAX_BACKOFF_NS 5000000000ull

typedef struct {
    kvc__tier_base_t base;
    redisContext *c; /* NULL while disconnected */
    char host[KVC_TIER_HOST_MAX];
    int port;
    char prefix[KVC_TIER_PREFIX_MAX];
    char model[KVC_TIER_PREFIX_MAX];
    uint64_t epoch;
    uint64_t next_try_ns; /* no reconnect before this */
    uint64_t backoff_ns;
    unsigned char *buf; /* (record_bytes) scratch for one record */
    kvc_hash128_t ns_cache_key;
    kvc_namespace_t ns_cached; /* the last namespace digested, and its digest */
    bool ns_cache_valid;
} redis_t;

typedef struct {
    sigset_t old;
    bool was_pending;
} pipe_guard_t;

static void pipe_block(pipe_guard_t *g)
{
    sigset_t s, pending;
    sigemptyset(&s);
    sigaddset(&s, SIGPIPE);
    sigemptyset(&pending);
    sigpending(&pending);
    g->was_pending = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &s, &g->old);
}

static void pipe_unblock(pipe_guard_t *g)
{
    if (!g->was_pending) {
        sigset_t s;
        sigemptyset(&s);
        sigaddset(&s, SIGPIPE);
        struct timespec zero = {0, 0};
        while (sigtimedwait(&s, NULL, &zero) > 0) {
        }
    }
    pthread_sigmask(SIG_SETMASK, &g->old, NULL);
}

static struct timeval tv_of_ms(uint32_t ms)
{
    return (struct timeval){.tv_sec = ms / 1000, .tv_usec = (suseconds_t)(ms % 1000) * 1000};
}

/* The connection lost or never made: count it, drop the context, back off. */
static void fault(redis_t *r)
{
    r->base.st.n_faults++;
    if (r->c) {
        redisFree(r->c);
        r->c = NULL;
    }
    uint64_t now = kvc__tier_now(&r->base);
    r->next_try_ns = now + r->backoff_ns;
    r->backoff_ns = r->backoff_ns * 2 > MAX_BACKOFF_NS ? MAX_BACKOFF_NS : r->backoff_ns * 2;
}

/* A usable context, or NULL (a fault counted) while the server cannot be reached. */
static redisContext *conn(redis_t *r)
{
    if (r->c) return r->c;
    if (kvc__tier_now(&r->base) < r->next_try_ns) {
        r->base.st.n_faults++; /* still backing off: this call misses */
        return NULL;
    }
    struct timeval tv = tv_of_ms(r->base.p.timeout_ms);
    r->c = redisConnectWithTimeout(r->host, r->port, tv);
    if (!r->c || r->c->err || redisSetTimeout(r->c, tv) != REDIS_OK) {
        fault(r);
        return NULL;
    }
    r->backoff_ns = (uint64_t)r->base.p.backoff_ms * 1000000ull;
    return r->c;
}

static void make_key(redis_t *r, const kvc_tier_key_t *key, char out[KEY_MAX], size_t *len)
{
    const kvc_namespace_t *ns = kvc__tier_key_ns(key);
    if (!r->ns_cache_valid || !kvc__tier_ns_eq(ns, &r->ns_cached)) {
        r->ns_cached = *ns;
        r->ns_cache_key = kvc__tier_ns_digest(ns);
        r->ns_cache_valid = true;
    }
    char h[33], n[33];
    kvc_hash128_hex(key->hash, h);
    kvc_hash128_hex(r->ns_cache_key, n);
    int w = snprintf(out, KEY_MAX, "%s:%s:%" PRIu64 ":%s:%s", r->prefix, r->model, r->epoch, h, n);
    KVC_ASSERT(w > 0 && w < KEY_MAX);
    *len = (size_t)w;
}

/* Check a GET reply against the key: 0 (payload copied to out), else a miss, counted, with
 * a bad record to drop (*drop). */
static int take_reply(redis_t *r, const kvc_tier_key_t *key, redisReply *rep, void *out, bool *drop)
{
    *drop = false;
    if (rep->type != REDIS_REPLY_STRING) return KVC_ENOENT; /* NIL: absent */
    int rc = kvc__tier_record_verify(rep->str, rep->len, key, r->base.pub.block_bytes,
                                     r->base.pub.block_tokens);
    if (rc) {
        if (rc == KVC_ECHECKSUM)
            r->base.st.n_corrupt++;
        else
            r->base.st.n_mismatch++;
        *drop = true;
        return KVC_ENOENT;
    }
    memcpy(out, rep->str + kvc__tier_payload_offset(r->base.pub.block_tokens),
           r->base.pub.block_bytes);
    r->base.st.bytes_read += rep->len;
    return 0;
}

static void drop_key(redis_t *r, const char *k, size_t klen)
{
    redisReply *rep = redisCommand(r->c, "DEL %b", k, klen);
    if (!rep)
        fault(r);
    else
        freeReplyObject(rep);
}

/* One command ("GET", "EXISTS", "DEL") on a block's key, the connection made again first if it
 * was lost: the reply, or NULL when there is no connection or the command failed (a counted
 * fault).  k[0 .. *klen) receives the key.  The caller holds the SIGPIPE guard. */
static redisReply *key_command(redis_t *r, const kvc_tier_key_t *key, const char *verb,
                               char k[KEY_MAX], size_t *klen)
{
    redisContext *c = conn(r);
    if (!c) return NULL;
    make_key(r, key, k, klen);
    redisReply *rep = redisCommand(c, "%s %b", verb, k, *klen);
    if (!rep) fault(r);
    return rep;
}

static int redis_get(kvc_tier_store_t *s, const kvc_tier_key_t *key, void *out)
{
    redis_t *r = (redis_t *)s;
    pipe_guard_t g;
    pipe_block(&g);
    int rc = KVC_ENOENT;
    char k[KEY_MAX];
    size_t klen;
    redisReply *rep = key_command(r, key, "GET", k, &klen);
    if (rep) {
        bool drop;
        rc = take_reply(r, key, rep, out, &drop);
        freeReplyObject(rep);
        if (drop) drop_key(r, k, klen);
    }
    pipe_unblock(&g);
    return rc;
}

static int redis_get_many(kvc_tier_store_t *s, const kvc_tier_key_t *keys, void *const *out,
                          size_t n, int *results)
{
    redis_t *r = (redis_t *)s;
    for (size_t i = 0; i < n; i++) results[i] = KVC_ENOENT;
    if (n == 0) return 0;
    pipe_guard_t g;
    pipe_block(&g);
    redisContext *c = conn(r);
    if (!c) goto done;
    char k[KEY_MAX];
    size_t klen;
    for (size_t i = 0; i < n; i++) {
        make_key(r, &keys[i], k, &klen);
        if (redisAppendCommand(c, "GET %b", k, klen) != REDIS_OK) {
            fault(r);
            goto done;
        }
    }
    size_t n_drop = 0;
    for (size_t i = 0; i < n; i++) {
        void *v = NULL;
        if (redisGetReply(c, &v) != REDIS_OK || !v) {
            fault(r); /* the rest of the batch stays a miss */
            goto done;
        }
        bool drop;
        results[i] = take_reply(r, &keys[i], v, out[i], &drop);
        freeReplyObject(v);
        if (drop) {
            /* Pipelined behind the replies still to read; their replies are read below. */
            make_key(r, &keys[i], k, &klen);
            if (redisAppendCommand(c, "DEL %b", k, klen) != REDIS_OK) {
                fault(r);
                goto done;
            }
            n_drop++;
        }
    }
    for (size_t i = 0; i < n_drop; i++) {
        void *v = NULL;
        if (redisGetReply(c, &v) != REDIS_OK || !v) {
            fault(r);
            break;
        }
        freeReplyObject(v);
    }
done:
    pipe_unblock(&g);
    return 0;
}

/* Admission, budget and encoding of one put: true if it is to be sent (the record in
 * r->buf), else *status says why not. */
static bool prepare_put(redis_t *r, const kvc_tier_key_t *key, const void *data,
                        kvc_tier_put_status_t *status)
{
    if (!kvc__tier_admit(&r->base, key)) {
        *status = KVC_TIER_PUT_NOT_ADMITTED;
        return false;
    }
    if (!kvc__tier_budget_take(&r->base, r->base.record_bytes)) {
        *status = KVC_TIER_PUT_OVER_BUDGET;
        return false;
    }
    kvc__tier_record_encode(r->buf, key, data, r->base.pub.block_bytes, 0);
    return true;
}

static int append_set(redis_t *r, const kvc_tier_key_t *key)
{
    char k[KEY_MAX];
    size_t klen;
    make_key(r, key, k, &klen);
    if (r->base.p.ttl_s)
        return redisAppendCommand(r->c, "SET %b %b EX %u", k, klen, r->buf, r->base.record_bytes,
                                  (unsigned)r->base.p.ttl_s);
    return redisAppendCommand(r->c, "SET %b %b", k, klen, r->buf, r->base.record_bytes);
}

static bool reply_ok(redisReply *rep)
{
    return rep->type == REDIS_REPLY_STATUS && rep->len == 2 && memcmp(rep->str, "OK", 2) == 0;
}

/* One pipelined batch of at most CHUNK puts: every SET appended, then every reply read. */
#define CHUNK 256

static void put_chunk(redis_t *r, const kvc_tier_key_t *keys, const void *const *data, size_t n,
                      kvc_tier_put_status_t *st)
{
    bool sent[CHUNK];
    redisContext *c = NULL;
    bool tried = false;
    for (size_t i = 0; i < n; i++) {
        sent[i] = false;
        st[i] = KVC_TIER_PUT_FAULT;
        if (!prepare_put(r, &keys[i], data[i], &st[i])) continue;
        st[i] = KVC_TIER_PUT_FAULT;
        if (!tried) {
            c = conn(r); /* counts a fault if it fails */
            tried = true;
        } else if (!c)
            r->base.st.n_faults++; /* one more put lost to the same outage */
        if (!c) continue;
        if (append_set(r, &keys[i]) != REDIS_OK) {
            fault(r);
            c = NULL;
            continue;
        }
        sent[i] = true;
    }
    for (size_t i = 0; i < n; i++) {
        if (!sent[i]) continue;
        void *v = NULL;
        if (!c || redisGetReply(c, &v) != REDIS_OK || !v) {
            if (c) fault(r);
            c = NULL; /* this and every later reply are lost: those puts are faults */
            continue;
        }
        if (reply_ok(v)) {
            st[i] = KVC_TIER_PUT_STORED;
            r->base.st.n_puts++;
            r->base.st.bytes_written += r->base.record_bytes;
        } else
            r->base.st.n_faults++; /* an error reply: out of memory, a read-only replica */
        freeReplyObject(v);
    }
}

static int redis_put_many(kvc_tier_store_t *s, const kvc_tier_key_t *keys, const void *const *data,
                          size_t n, kvc_tier_put_status_t *status)
{
    redis_t *r = (redis_t *)s;
    pipe_guard_t g;
    pipe_block(&g);
    kvc_tier_put_status_t st[CHUNK];
    for (size_t at = 0; at < n; at += CHUNK) {
        size_t m = KVC_MIN(CHUNK, n - at);
        put_chunk(r, keys + at, data + at, m, st);
        if (status) memcpy(status + at, st, m * sizeof *st);
    }
    pipe_unblock(&g);
    return 0;
}

static int redis_put(kvc_tier_store_t *s, const kvc_tier_key_t *key, const void *data,
                     kvc_tier_put_status_t *status)
{
    return redis_put_many(s, key, &data, 1, status);
}

static int redis_contains(kvc_tier_store_t *s, const kvc_tier_key_t *key)
{
    redis_t *r = (redis_t *)s;
    pipe_guard_t g;
    pipe_block(&g);
    int found = 0;
    char k[KEY_MAX];
    size_t klen;
    redisReply *rep = key_command(r, key, "EXISTS", k, &klen);
    if (rep) {
        found = rep->type == REDIS_REPLY_INTEGER && rep->integer == 1;
        freeReplyObject(rep);
    }
    pipe_unblock(&g);
    return found;
}

static int redis_del(kvc_tier_store_t *s, const kvc_tier_key_t *key)
{
    redis_t *r = (redis_t *)s;
    pipe_guard_t g;
    pipe_block(&g);
    int rc = KVC_ENOENT;
    char k[KEY_MAX];
    size_t klen;
    redisReply *rep = key_command(r, key, "DEL", k, &klen);
    if (rep) {
        if (rep->type == REDIS_REPLY_INTEGER && rep->integer == 1) rc = 0;
        freeReplyObject(rep);
    }
    pipe_unblock(&g);
    return rc;
}

static void redis_destroy(kvc_tier_store_t *s)
{
    redis_t *r = (redis_t *)s;
    kvc_allocator_t a = r->base.p.allocator;
    if (r->c) redisFree(r->c);
    kvc__tier_base_deinit(&r->base);
    kvc_free(&a, r->buf);
    kvc_free(&a, r);
}

static const kvc_tier_ops_t redis_ops = {
    .name = "redis",
    .put = redis_put,
    .get = redis_get,
    .contains = redis_contains,
    .del = redis_del,
    .put_many = redis_put_many,
    .get_many = redis_get_many,
    .destroy = redis_destroy,
};

static bool part_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n >= KVC_TIER_PREFIX_MAX) return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == ':' || ch <= ' ' || ch == 0x7f) return false;
    }
    return true;
}

int kvc_tier_redis_create(const char *host, uint16_t port, const char *prefix,
                          const kvc_tier_params_t *params, kvc_tier_store_t **out)
{
    if (!host || !*host || strlen(host) >= KVC_TIER_HOST_MAX || port == 0 || !params || !out)
        return KVC_EINVAL;
    if (!prefix || !*prefix) prefix = "kvc";
    const char *model = params->model_id ? params->model_id : "model";
    if (!part_ok(prefix) || !part_ok(model)) return KVC_EINVAL;
    if (kvc__tier_record_size(params->block_bytes, params->block_tokens) == 0) return KVC_EINVAL;
    redis_t *r = kvc_calloc(&params->allocator, 1, sizeof *r, 64);
    if (!r) return KVC_ENOMEM;
    int rc = kvc__tier_base_init(&r->base, &redis_ops, params);
    if (rc == 0) {
        r->buf = kvc_alloc(&params->allocator, r->base.record_bytes, 64);
        if (!r->buf) rc = KVC_ENOMEM;
    }
    if (rc) {
        kvc__tier_base_deinit(&r->base);
        kvc_free(&params->allocator, r->buf);
        kvc_free(&params->allocator, r);
        return rc;
    }
    strcpy(r->host, host);
    r->port = port;
    strcpy(r->prefix, prefix);
    strcpy(r->model, model);
    r->epoch = params->weight_epoch;
    r->backoff_ns = (uint64_t)r->base.p.backoff_ms * 1000000ull;
    pipe_guard_t g;
    pipe_block(&g);
    (void)conn(r); /* unreachable now is a counted fault, not an error: it retries later */
    pipe_unblock(&g);
    *out = &r->base.pub;
    return 0;
}
