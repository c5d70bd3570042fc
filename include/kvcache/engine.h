/* kvcache/engine.h - a CPU inference engine on the paged cache (the model layer).
 *
 * A kvc_llm_t is a loaded model: its hyperparameters (model.h), its tokenizer
 * (tokenizer.h) and its weights, used in place in the memory-mapped GGUF
 * file.  A kvc_engine_t runs requests on it exactly as a GPU engine embeds
 * kvcache: the pool owns every byte of K/V, the prefix cache, seq and sched
 * decide which requests run and where their keys and values live, and per
 * step the engine
 *
 *     kvc_sched_step        takes the plan (prefill chunks and decodes mixed),
 *     kvc_step_launch       puts its rows in flight,
 *     forward pass          embeds the tokens, and per layer projects Q/K/V,
 *                           writes K/V at the slots seq reserved
 *                           (kvc_attn_write_kv), runs attention over the CSR
 *                           block tables (kvc_attn_forward), the output
 *                           projection and the MLP; then the LM head for the
 *                           rows that sample,
 *     samples               with each request's own RNG,
 *     kvc_step_complete,
 *     kvc_sched_complete    hands the tokens back.
 *
 * Batch invariance (DESIGN.md invariant 10): a request's logits are
 * bit-identical however it runs (alone or batched, its prompt in one chunk or
 * many, its prefix from the cache or computed, 1 or N threads): the matrix
 * kernels (matmul.h) and attention reduce in a fixed order per output
 * element, and nothing in the pass mixes rows.  So outputs never depend on
 * load, and tests compare them bit for bit.
 *
 * Errors: 0 or a negative KVC_E* code, with one line in msg where a function
 * takes one.  Thread-safety: an engine is driven from one thread (its step
 * loop); it runs its kernels on its own thread pool.
 */
#ifndef KVCACHE_ENGINE_H
#define KVCACHE_ENGINE_H

#include <stdbool.h>
#include <stdint.h>

#include "kvcache/matmul.h"
#include "kvcache/model.h"
#include "kvcache/pool.h"
#include "kvcache/sched.h"
#include "kvcache/tier.h"
#include "kvcache/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- a loaded model -------------------------------------------------------- */
typedef struct kvc_llm kvc_llm_t;

/* Load the model in a GGUF file: hyperparameters, tokenizer and weights
 * (mapped, used in place).  KVC_ENOTSUP (an architecture, feature or tensor
 * type the engine does not run: the message names it), KVC_EPARSE (a
 * malformed file, a tensor missing or of the wrong shape: named), KVC_EIO,
 * KVC_ENOMEM, KVC_EINVAL (NULL arguments). */
KVC_API KVC_NODISCARD int kvc_llm_load(const char *path, kvc_llm_t **out, char *msg, size_t cap);
/* The same over a GGUF the caller opened (ownership passes to the model,
 * also on failure). */
KVC_API KVC_NODISCARD int kvc_llm_load_gguf(kvc_gguf_t *g, kvc_llm_t **out, char *msg, size_t cap);
KVC_API void kvc_llm_free(kvc_llm_t *m); /* NULL is a no-op */
KVC_API const kvc_model_hparams_t *kvc_llm_hparams(const kvc_llm_t *m);
KVC_API const kvc_tokenizer_t *kvc_llm_tokenizer(const kvc_llm_t *m);
KVC_API const kvc_gguf_t *kvc_llm_gguf(const kvc_llm_t *m);
/* Bytes of weights read per decoded token (the matrices and norms, one
 * embedding row): the numerator of the weight-streaming bound. */
KVC_API uint64_t kvc_llm_weight_bytes_per_token(const kvc_llm_t *m);
/* Bytes of the packed copies of the matrices (kvc_mat_pack) the load made: on a CPU with AVX2,
 * every Q8_0, Q4_0 and Q4_K matrix is repacked once at load for the SIMD kernels (about the
 * matrices' own size, in memory the model owns); 0 when none is. */
KVC_API size_t kvc_llm_packed_bytes(const kvc_llm_t *m);

/* ---- the engine ------------------------------------------------------------ */
#define KVC_ENGINE_MAX_TIERS 4

/* How a run of blocks found in a tier is taken (kvc_engine_params_t.tier_fetch). */
typedef enum {
    KVC_TIER_FETCH_DECIDE = 0, /* kvc_tier_decide from the tier's measured latency and
                                  bandwidth against the engine's measured prefill rate */
    KVC_TIER_FETCH_ALWAYS,     /* fetch every run found (tests, benchmarks) */
    KVC_TIER_FETCH_NEVER,      /* recompute every run found (the baseline; counted) */
} kvc_tier_fetch_t;

typedef struct {
    uint32_t n_threads;              /* kernel threads, the step loop's included (0: all cores) */
    kvc_dtype_t kv_dtype;            /* the pool's K/V storage (default f16) */
    uint32_t block_size;             /* tokens per block (default 16) */
    uint64_t kv_memory;              /* bytes of K/V (0: enough for max_num_seqs contexts of
                                        max_ctx, at most 256 MiB, at least one max_ctx context) */
    uint32_t max_ctx;                /* tokens per request, prompt + output (0: the model's
                                        context length, at most 32768) */
    uint32_t max_num_seqs;           /* requests running at once (default 64) */
    uint32_t max_num_batched_tokens; /* tokens per step (default 512) */
    uint32_t max_prefill_chunk;      /* prompt tokens per request per step (0: the budget) */
    kvc_preemption_t preemption;     /* default recompute */
    bool no_prefix_cache;            /* true: no prefix reuse across requests */
    bool no_kv_cache;                /* true: recompute the whole sequence for every token (the
                                        quadratic baseline); same outputs */
    bool no_batch_invariance;        /* attention tiles of several query rows (K/V loads shared):
                                        faster attention, but a request's logits may then differ in
                                        the last bits with the batch it runs in (docs/engine.md) */
    uint32_t spec_tokens;            /* prompt-lookup (n-gram) drafts per decode step (0: none) */
    uint32_t spec_ngram;             /* the n-gram length the lookup matches (default 3) */
    const kvc_llm_t *draft_model;    /* speculation by a draft model (borrowed; it must outlive
                                        the engine) instead of prompt lookup: spec_tokens drafts
                                        decoded greedily on its own pool; the same vocabulary
                                        size as the model (KVC_EINVAL otherwise).  NULL: none */
    kvc_isa_t isa;                   /* kernels' ISA (KVC_ISA_AUTO: the best) */
    uint32_t n_tenants;              /* the scheduler's tenants (kvc_gen_params_t.tenant below
                                        it; 0: KVC_SCHED_DEFAULT_TENANTS, at most
                                        KVC_SCHED_MAX_TENANTS) */
    /* KV tiers (docs/tiers.md "In the engine"): copies of blocks outside the pool.  Evict-mode
     * tiers get every block the pool evicts (all of them: inclusive); write-through tiers every
     * block as it is cached; a request's prefix lookup continues in the tiers, in order. */
    const kvc_tier_spec_t *tiers;        /* (n_tiers), in lookup order; copied at create */
    uint32_t n_tiers;                    /* 0..KVC_ENGINE_MAX_TIERS */
    kvc_tier_admission_t tier_admission; /* admission of the host and disk tiers (default
                                            always) */
    uint64_t tier_disk_write_budget;     /* bytes/day for disk tiers; 0: unlimited */
    uint32_t tier_timeout_ms;            /* each fetch's deadline (redis command timeout; 0: 100) */
    const char *tier_model_id;           /* redis key part (copied); NULL: derived from the model
                                            (a digest of the GGUF metadata and tensor table, a
                                            sample of every tensor's bytes) plus kv dtype and
                                            block size, so replicas of one model share and
                                            nothing else meets */
    kvc_tier_fetch_t tier_fetch;         /* fetch-or-recompute: decide (default), always, never */
    uint64_t prefix_hash_seed;           /* the prefix cache's deployment seed (0: random per
                                            process; with tiers, derived from the model id, so
                                            that a disk tier reopened and replicas sharing a
                                            Redis find the same hashes) */
} kvc_engine_params_t;

KVC_API kvc_engine_params_t kvc_engine_params_default(void);

typedef struct kvc_engine kvc_engine_t;

/* An engine over model m (borrowed; it must outlive the engine).
 * KVC_EINVAL (NULL arguments or a parameter out of range: named in msg),
 * KVC_ENOMEM, KVC_EIO (threads). */
KVC_API KVC_NODISCARD int kvc_engine_create(const kvc_llm_t *m, const kvc_engine_params_t *p,
                                            kvc_engine_t **out, char *msg, size_t cap);
KVC_API void kvc_engine_destroy(kvc_engine_t *e); /* NULL is a no-op */

#define KVC_MAX_STOP     8 /* stop token ids and stop strings per request, each */
#define KVC_MAX_LOGPROBS 20
#define KVC_MAX_SAMPLES  64 /* parallel samples per request */

typedef struct {
    float temperature;                         /* 0: greedy */
    uint32_t top_k;                            /* 0: off */
    float top_p;                               /* 1: off */
    float min_p;                               /* 0: off */
    float repetition_penalty;                  /* 1: off */
    float presence_penalty, frequency_penalty; /* 0: off */
    uint64_t seed;
    uint32_t max_tokens; /* output tokens at most (>= 1); capped by the context */
    bool ignore_eos;     /* keep going past the end-of-sequence token */
    bool logprobs;       /* report each chosen token's logprob */
    uint32_t n_logprobs; /* and the top n alternatives at each position (<= KVC_MAX_LOGPROBS) */
    kvc_token_t stop_ids[KVC_MAX_STOP];
    uint32_t n_stop_ids;
    const char *stop[KVC_MAX_STOP]; /* stop strings (copied) */
    uint32_t n_stop;
    uint32_t n;         /* parallel samples (1..KVC_MAX_SAMPLES; 0: 1): the prompt is computed
                           once and each sample forks its blocks copy-on-write; sample k uses
                           seed + k and finishes with its own account (sample_index k) */
    uint32_t priority;  /* scheduler class */
    uint32_t tenant;    /* the scheduler's tenant, below kvc_engine_params_t.n_tenants */
    uint64_t tag;       /* the caller's, echoed in events */
    kvc_namespace_t ns; /* the prefix-cache namespace (a tenant's cache salt: prefix.h); all
                           zero (the default): the shared one */
} kvc_gen_params_t;

KVC_API kvc_gen_params_t kvc_gen_params_default(void);

typedef enum {
    KVC_FINISH_NONE = 0,
    KVC_FINISH_STOP,   /* EOS, a stop id or a stop string */
    KVC_FINISH_LENGTH, /* max_tokens or the context */
    KVC_FINISH_ABORT,
    KVC_FINISH_ERROR,
} kvc_finish_t;
/* "stop", "length", "abort", "error"; "" for NONE. */
KVC_API const char *kvc_finish_name(kvc_finish_t f);

typedef uint64_t kvc_gen_id_t;

/* Queue a request (the prompt is copied).  KVC_EINVAL (bad parameters: msg
 * names the field), KVC_ERANGE (the prompt does not fit the context or the
 * pool), KVC_ENOMEM. */
KVC_API KVC_NODISCARD int kvc_engine_submit(kvc_engine_t *e, const kvc_token_t *prompt,
                                            uint32_t n_prompt, const kvc_gen_params_t *gp,
                                            kvc_gen_id_t *id, char *msg, size_t cap);
/* Abort a request; its blocks go back through seq's deferred reclamation.
 * KVC_ESTALE for an id that is not live. */
KVC_API int kvc_engine_abort(kvc_engine_t *e, kvc_gen_id_t id);

/* What a step produced, per request. */
typedef struct {
    kvc_gen_id_t id;
    uint64_t tag;
    const kvc_token_t *tokens; /* tokens emitted this step (a speculative step may emit
                                  several); borrowed until the next step */
    uint32_t n_tokens;
    const float *logprobs; /* (n_tokens) or NULL */
    const char *text;      /* the text they complete (valid UTF-8, stop strings held
                              back and cut), NUL-terminated */
    size_t text_len;
    kvc_finish_t finish; /* NONE while it runs */
} kvc_gen_event_t;

typedef void (*kvc_gen_event_fn)(void *ctx, const kvc_gen_event_t *ev);

/* Run one step at time `now` (seconds, any monotonic clock): the callback
 * gets one event per request that emitted a token or finished.  *idle is set
 * when nothing could run (no requests, or all waiting for memory that will not
 * come).  Errors from the layers below (KVC_ENOMEM, ...): the step's requests
 * are finished with KVC_FINISH_ERROR. */
KVC_API KVC_NODISCARD int kvc_engine_step(kvc_engine_t *e, double now, kvc_gen_event_fn fn,
                                          void *ctx, bool *idle);

/* A finished request's account. */
typedef struct {
    kvc_gen_id_t id;
    uint64_t tag;
    uint32_t prompt_tokens, cached_tokens, completion_tokens;
    const kvc_token_t *output;  /* (completion_tokens), borrowed until the next step */
    const float *logprobs;      /* (completion_tokens) or NULL */
    const kvc_token_t *top_ids; /* (completion_tokens, n_logprobs) or NULL */
    const float *top_logprobs;
    uint32_t n_logprobs;
    const char *text; /* the whole output text (stop string cut) */
    kvc_finish_t finish;
    double submit_s, first_token_s, finish_s;
    uint32_t preemptions;
    uint32_t draft_tokens, accepted_tokens;
    uint32_t sample_index; /* which of the request's n parallel samples */
    uint32_t tier_cached_tokens[KVC_ENGINE_MAX_TIERS]; /* of cached_tokens, those fetched from
                                                          tiers[i]; the rest came from the pool */
} kvc_gen_done_t;

/* The request ids finished in the last step and their accounts (borrowed
 * until the next step). */
KVC_API void kvc_engine_finished(const kvc_engine_t *e, const kvc_gen_done_t **done, uint32_t *n);

typedef struct {
    uint64_t steps, prefill_tokens, decode_tokens;
    double prefill_s, decode_s; /* wall time of steps that computed mostly prompt / decode */
    uint64_t kv_bytes_per_token;
    uint32_t n_blocks, peak_blocks, block_size;
    uint64_t preemptions;
    uint64_t swapped_out_bytes, swapped_in_bytes; /* swap preemption's copies (as sched counts
                                                     them: whole blocks) */
    uint64_t hit_tokens;
    uint64_t draft_tokens, accepted_tokens;
    uint64_t draft_computed_tokens; /* positions the draft model computed (its K/V rows) */
    uint32_t n_running, n_waiting;
} kvc_engine_stats_t;

KVC_API void kvc_engine_stats(const kvc_engine_t *e, kvc_engine_stats_t *out);

/* ---- tiers ------------------------------------------------------------------ */
typedef struct {
    kvc_tier_kind_t kind;
    kvc_tier_mode_t mode;
    kvc_tier_stats_t store;          /* the store's counters (hits, misses, bytes, faults,
                                        corrupt, latency histogram...) */
    uint64_t fetched_blocks;         /* copied from this tier into the pool, verified, committed */
    uint64_t recompute_blocks;       /* found here, but the decision chose recompute */
    uint64_t fetch_failed_blocks;    /* fetch failed (miss after contains, corrupt, fault,
                                        timeout): recomputed */
    uint64_t offloaded_blocks;       /* evict mode: copied down as the pool evicted them */
    uint64_t written_through_blocks; /* write-through mode: copied as computed */
    double latency_s, bandwidth_Bps; /* the estimator's current values */
} kvc_engine_tier_stats_t;

/* The number of tiers the engine was created with (0 for NULL). */
KVC_API uint32_t kvc_engine_n_tiers(const kvc_engine_t *e);
/* Tier i's counters into *out.  KVC_EINVAL for e or out NULL or i >= kvc_engine_n_tiers
 * (*out unchanged).  Not thread-safe with kvc_engine_step (the server reads it on the step
 * thread). */
KVC_API int kvc_engine_tier_stats(const kvc_engine_t *e, uint32_t i, kvc_engine_tier_stats_t *out);
/* The model id the tiers' keys carry (params.tier_model_id or the derived one: 32 hex digits);
 * "" without tiers or for NULL.  Borrowed for the engine's life. */
KVC_API const char *kvc_engine_tier_model_id(const kvc_engine_t *e);

/* The seq table and scheduler the engine runs on (borrowed), for tests and
 * reports that check their invariants. */
KVC_API kvc_seqs_t *kvc_engine_seqs(const kvc_engine_t *e);
/* The prefix cache (NULL with no_prefix_cache or no_kv_cache), for kvc_prefix_check. */
KVC_API kvc_prefix_t *kvc_engine_prefix(const kvc_engine_t *e);
KVC_API kvc_sched_t *kvc_engine_sched(const kvc_engine_t *e);

/* ---- beam search ------------------------------------------------------------
 * One request's beam search on a pool and seq table of its own, through the same
 * forward pass: the prompt is computed once, then every step runs each live beam's last
 * token as one batched pass (one segment per beam), ranks every beam's continuations by
 * cumulative log-probability (log-softmax in double), keeps the best n_beams and moves
 * the seq table with kvc_seq_beam_step (dead beams' blocks freed, survivors forked
 * copy-on-write: the prompt's blocks are stored once, whatever n_beams).  The rules are
 * Hugging Face's BeamSearchScorer's (see docs/model.md):
 *   - per step the 2 * n_beams best (beam, token) candidates by cumulative log-probability,
 *     ties to the lower beam index, then the lower token id; walked in that order, an EOS
 *     (unless ignore_eos) or stop id candidate among the first n_beams ends a hypothesis,
 *     one beyond them is skipped, any other candidate becomes a beam of the next step
 *     until n_beams are chosen;
 *   - a finished hypothesis scores sum logprob / len^length_penalty, len the tokens it
 *     generated, EOS included; the best n_beams are kept (a tie keeps the earlier one);
 *   - the search ends when n_beams hypotheses are finished and either early_stopping, or
 *     no live beam's best cumulative log-probability / len^length_penalty beats the worst
 *     of them; or at max_tokens, where every live beam becomes a hypothesis ("length"). */
typedef struct {
    uint32_t n_beams;                   /* 1..64 (and 2 * n_beams <= the vocabulary) */
    uint32_t max_tokens;                /* tokens generated per hypothesis at most (>= 1) */
    float length_penalty;               /* alpha in sum logprob / len^alpha; finite (default 1) */
    bool early_stopping;                /* stop as soon as n_beams hypotheses are finished */
    bool ignore_eos;                    /* EOS is a token like any other */
    kvc_token_t stop_ids[KVC_MAX_STOP]; /* more ids that end a hypothesis as EOS does
                                           (ignore_eos or not) */
    uint32_t n_stop_ids;
    uint32_t n_threads;   /* kernel threads (0: all cores) */
    kvc_dtype_t kv_dtype; /* default f16 */
    uint32_t block_size;  /* tokens per block (default 16) */
    uint64_t kv_memory;   /* bytes of K/V (0: the prompt once plus every beam's output) */
    bool prefix_cache;    /* run the pool with a prefix cache (full blocks inserted) */
    kvc_isa_t isa;        /* kernels' ISA (KVC_ISA_AUTO: the best) */
} kvc_beam_params_t;

KVC_API kvc_beam_params_t kvc_beam_params_default(void);

typedef struct {
    kvc_token_t *ids; /* (n_ids) generated tokens, the final EOS or stop id included (as
                         the engine's output ids); the score's len is n_ids */
    uint32_t n_ids;
    double sum_logprob;  /* of those n_ids tokens */
    double score;        /* sum_logprob / n_ids^length_penalty */
    kvc_finish_t finish; /* KVC_FINISH_STOP (EOS or a stop id) or KVC_FINISH_LENGTH */
} kvc_beam_hyp_t;

typedef struct {
    kvc_beam_hyp_t *hyps;       /* (n_hyps) best score first, ties in the order they finished */
    uint32_t n_hyps;            /* n_beams */
    uint32_t steps;             /* decode passes run (the prompt's pass not counted) */
    uint32_t n_blocks;          /* the pool's blocks */
    uint32_t prompt_blocks;     /* blocks the prompt fills, partly filled last one included */
    uint32_t peak_blocks;       /* blocks in use at most, all beams together */
    uint64_t forks, cow_copies; /* from kvc_seqs_stats */
} kvc_beam_result_t;

/* Beam search from prompt[0..n_prompt) (token ids, borrowed) on model m (borrowed) with
 * parameters p; *out is filled (the caller frees it with kvc_beam_result_free; on an error
 * it is zeroed and holds nothing).  Errors, with one line in msg: KVC_EINVAL (NULL
 * arguments, an empty prompt, a prompt or stop id outside the vocabulary, more than
 * KVC_MAX_STOP stop ids, a parameter out of range:
 * named), KVC_ERANGE (prompt + max_tokens beyond the model's context), KVC_ENOSPC /
 * KVC_EBUSY (the pool is too small for the prompt or for n_beams beams: the step is
 * named), KVC_ENOMEM, KVC_EIO (threads), and those of the layers below.  Nothing is left
 * allocated on an error.  Thread-safety: m may be shared by concurrent calls. */
KVC_API KVC_NODISCARD int kvc_llm_beam_search(const kvc_llm_t *m, const kvc_beam_params_t *p,
                                              const kvc_token_t *prompt, uint32_t n_prompt,
                                              kvc_beam_result_t *out, char *msg, size_t cap);
/* Free what a result holds and zero it; NULL is a no-op. */
KVC_API void kvc_beam_result_free(kvc_beam_result_t *r);

#ifdef __cplusplus
}
#endif

#endif /* KVCACHE_ENGINE_H */
