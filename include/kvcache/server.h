/* kvcache/server.h - `kvcache serve`: an OpenAI-compatible HTTP server over the engine.
 *
 * The server layer (DESIGN.md): HTTP on libevent's evhttp, request parsing and validation,
 * server-sent-event streaming, Prometheus metrics and tenants.  It holds no KV state of its
 * own: the engine (engine.h) owns the step loop, run on a thread of its own; requests are
 * handed to it through a queue, and tokens come back through another, so a slow client never
 * stalls a step.  A client that goes away aborts its request (kvc_engine_abort: its blocks go
 * back through seq's deferred reclamation); the engine's (slot, generation) ids and the
 * server's own per-request records make sure a later request never receives its tokens.
 *
 * Endpoints: POST /v1/completions, POST /v1/chat/completions (streaming or not), GET
 * /v1/models, GET /health, GET /metrics.  docs/server.md describes fields, limits, the
 * tenants file and the metrics.
 *
 * Errors: 0 or a negative KVC_E* code, with one line in msg.  Thread-safety: one thread runs
 * kvc_server_run; kvc_server_stop may be called from any thread or a signal handler.  A
 * client that goes away mid-write raises SIGPIPE: the program ignores it (kvcache serve does).
 */
#ifndef KVCACHE_SERVER_H
#define KVCACHE_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvcache/chat.h"
#include "kvcache/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef void (*kvc_server_log_fn)(void *ctx, const char *line);

typedef struct {
    const char *host;       /* address to bind (default "127.0.0.1") */
    uint16_t port;          /* 0: an ephemeral port (kvc_server_port says which) */
    const char *model_name; /* the id requests name and /v1/models lists (copied) */
    bool has_chat_template; /* false: chat requests get 400 */
    kvc_chat_template_t chat_template;
    const char *api_keys_json; /* the tenants file's text (copied); NULL: no keys, one
                                  shared tenant "default" with no limits */
    size_t max_body_bytes;     /* request body limit (default 1 MiB): 413 beyond */
    size_t max_output_bytes;   /* unsent bytes a connection may hold before its request is
                                  aborted and the connection closed (default 4 MiB) */
    uint32_t max_queued;       /* requests in flight, all tenants, before 503 (default 256) */
    uint32_t max_tokens_limit; /* max_tokens above it: 400 (0: the context) */
    double drain_timeout_s;    /* after kvc_server_stop, how long in-flight requests may
                                  finish before they are aborted (default 30) */
    bool log_json;             /* log lines as JSON objects (default: text) */
    kvc_server_log_fn log;     /* one line per request and event; NULL: silent */
    void *log_ctx;
} kvc_server_params_t;

KVC_API kvc_server_params_t kvc_server_params_default(void);

typedef struct kvc_server kvc_server_t;

/* Create a server over model m (borrowed; it must outlive the server) with an engine of
 * parameters ep, bound and listening on host:port when this returns.  Errors (named in msg):
 * KVC_EINVAL (NULL arguments, a bad host, a parameter out of range), KVC_EPARSE (the tenants
 * JSON is malformed or a field has the wrong type or range: named), KVC_EIO (the address
 * cannot be bound, a thread or pipe cannot be made), KVC_ENOMEM, and the engine's errors
 * (kvc_engine_create).  Nothing is left allocated on an error. */
KVC_API KVC_NODISCARD int kvc_server_create(const kvc_llm_t *m, const kvc_engine_params_t *ep,
                                            const kvc_server_params_t *p, kvc_server_t **out,
                                            char *msg, size_t cap);
/* The port the server listens on. */
KVC_API uint16_t kvc_server_port(const kvc_server_t *s);
/* Serve until kvc_server_stop, then drain: stop taking requests (503), let in-flight ones
 * finish (at most drain_timeout_s, then abort them), and return.  Runs the engine's step loop
 * on a thread of its own meanwhile.  KVC_EINVAL (NULL), KVC_EIO (the thread), KVC_EBUSY
 * (already run). */
KVC_API KVC_NODISCARD int kvc_server_run(kvc_server_t *s);
/* Ask kvc_server_run to drain and return.  Async-signal-safe (it writes one byte to a
 * pipe); NULL is a no-op. */
KVC_API void kvc_server_stop(kvc_server_t *s);
/* Free the server (after kvc_server_run returned, or if it never ran).  NULL is a no-op. */
KVC_API void kvc_server_destroy(kvc_server_t *s);

#ifdef __cplusplus
}
#endif

#endif /* KVCACHE_SERVER_H */
