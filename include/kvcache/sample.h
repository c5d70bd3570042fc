/* kvcache/sample.h - choosing the next token from a row of logits (the model layer's
 * sampling), log-probabilities for beams, and stop strings over streamed text.
 *
 * The engine calls kvc_sample once per sampled position of a request, with that request's
 * own parameters and its own RNG, so a request's samples never depend on what else is in
 * the batch.
 *
 * The chain, in the order of llama.cpp's default sampler chain (common/common.h:
 * penalties, dry, top_n_sigma, top_k, typical_p, top_p, min_p, xtc, temperature; the ones
 * kvcache has, in that order):
 *
 *   1. penalties over the last penalty_last_n tokens of the history (0: all of it), for
 *      each distinct token t seen c > 0 times there, computed in double and rounded once:
 *        l = l > 0 ? l / repetition_penalty : l * repetition_penalty   (CTRL / HF rule)
 *        l = l - (frequency_penalty * c + presence_penalty)          (OpenAI's rule)
 *   2. temperature 0: greedy.  The highest logit after penalties, ties to the lowest id;
 *      truncation is skipped (it never removes that token) and the RNG is not touched.
 *   3. top_k: the k highest logits (ties: lower ids first).
 *   4. top_p: of what is left, sorted by logit (ties: lower id first), the shortest prefix
 *      whose softmax mass (over what is left, at temperature 1) reaches top_p.
 *   5. min_p: what is left with probability >= min_p * the highest probability.
 *   6. temperature: the survivors' logits divided by it, then a draw from their softmax.
 * Precision: the kept sets (top_p's masses, min_p's ratios) are decided in double; the
 * draw's weights exp((l - max) / T) are computed in float (about 1e-7 relative; at
 * temperature 1 with nothing truncated, the double ones are reused) and summed in double; ties are
 * broken by token id everywhere, so a kept set is a function of the logits alone.  The SIMD and
 * scalar kernels compute the same bits (kvc_sampler_set_isa). As in llama.cpp, temperature comes
 * last, so top_p and min_p see the penalized logits at temperature 1.  (vLLM divides by the
 * temperature first; the kept sets then differ.)
 *
 * Randomness: a request owns one kvc_rng_t (util.h: xoshiro256**, seeded by splitmix64)
 * seeded with kvc_rng_seed(&rng, params.seed).  A sample with temperature > 0 consumes
 * exactly one kvc_rng_next (one uniform double in [0, 1)), whatever survives truncation,
 * even a single token; a greedy sample consumes none; a failed call consumes none.  The
 * engine relies on this: speculative decoding reproduces plain decoding by sampling each
 * verified position with the same stream, in order, and comparing with the draft.
 *
 * Non-finite logits: NaN is treated as -inf (never sampled, log-probability -inf); +inf is
 * clamped to FLT_MAX (so the +inf tokens share all the probability equally, the limit of
 * the softmax).  A row with no finite logit (all NaN / -inf, also after penalties) is
 * KVC_EINVAL.
 *
 * Log-probabilities (result.logprob and the top n_logprobs) are the log-softmax of the raw
 * logits (after only the NaN / inf rule above): before penalties, temperature and
 * truncation, as vLLM and OpenAI report by default.  Computed in double, stored as float.
 *
 * Ownership and threads: a kvc_sampler_t is scratch memory for one vocabulary size; it
 * belongs to one thread at a time (one per engine worker is enough: it keeps no state
 * between calls).  Parameters, logits and history are borrowed for the call only.  A
 * kvc_stop_t copies its stop strings and belongs to one request.
 */
#ifndef KVCACHE_SAMPLE_H
#define KVCACHE_SAMPLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvcache/util.h"
#include "kvcache/prefix.h" /* kvc_token_t */
#include "kvcache/quant.h"  /* kvc_isa_t */

#ifdef __cplusplus
extern "C" {
#endif

#define KVC_SAMPLE_MAX_LOGPROBS 20

typedef struct {
    float temperature;        /* >= 0, finite; 0: greedy */
    uint32_t top_k;           /* 0 (or >= the vocabulary): off */
    float top_p;              /* (0, 1]; 1: off */
    float min_p;              /* [0, 1]; 0: off */
    float repetition_penalty; /* > 0, finite; 1: off */
    float presence_penalty;   /* [-2, 2]; 0: off */
    float frequency_penalty;  /* [-2, 2]; 0: off */
    uint32_t penalty_last_n;  /* tokens of the history's end the penalties see; 0: all */
    uint64_t seed;            /* for kvc_rng_seed; kvc_sample itself never reads it */
    uint32_t n_logprobs;      /* 0..KVC_SAMPLE_MAX_LOGPROBS top alternatives to report */
} kvc_sampling_params_t;

/* OpenAI's / vLLM's defaults: temperature 1, everything else off, seed 0, no logprobs. */
KVC_API kvc_sampling_params_t kvc_sampling_params_default(void);

/* 0 if every field is in range, else KVC_EINVAL with one line naming the field and the
 * allowed range in msg (NUL-terminated, truncated to cap; msg may be NULL when cap is 0).
 * Refused: temperature negative or non-finite; top_p outside (0, 1]; min_p outside [0, 1];
 * repetition_penalty <= 0 or non-finite; presence / frequency penalty outside [-2, 2]
 * (NaN included); n_logprobs > 20; p NULL. */
KVC_API KVC_NODISCARD int kvc_sampling_params_check(const kvc_sampling_params_t *p, char *msg,
                                                    size_t cap);

typedef struct {
    kvc_token_t token; /* the sampled token */
    float logprob;     /* its log-probability (raw log-softmax; see above) */
    uint32_t n_top;    /* = params.n_logprobs, or the vocabulary size if smaller */
    kvc_token_t top_ids[KVC_SAMPLE_MAX_LOGPROBS]; /* (n_top) highest first, ties by lower id */
    float top_logprobs[KVC_SAMPLE_MAX_LOGPROBS];  /* (n_top) */
} kvc_sample_result_t;

typedef struct kvc_sampler kvc_sampler_t;

/* Scratch for sampling rows of n_vocab logits (about 24 bytes a token), allocated through
 * `a` (NULL: the C library) and freed by kvc_sampler_destroy (NULL is a no-op).
 * Errors: KVC_EINVAL (n_vocab 0 or above INT32_MAX, out NULL), KVC_ENOMEM (nothing is
 * left allocated; *out is untouched). */
KVC_API KVC_NODISCARD int kvc_sampler_create(uint32_t n_vocab, const kvc_allocator_t *a,
                                             kvc_sampler_t **out);
KVC_API void kvc_sampler_destroy(kvc_sampler_t *s);
KVC_API uint32_t kvc_sampler_n_vocab(const kvc_sampler_t *s);
/* The row kernels to use: KVC_ISA_SCALAR, or any SIMD one (AVX2 kernels), or KVC_ISA_AUTO
 * (the default: the best this CPU has).  Every version computes the same bits, so this never
 * changes a sample or a logprob; it is for tests and measurements.
 * Errors: KVC_EINVAL (s NULL, an unknown isa), KVC_ENOTSUP (the CPU lacks it). */
KVC_API KVC_NODISCARD int kvc_sampler_set_isa(kvc_sampler_t *s, kvc_isa_t isa);

/* Sample one token from logits (n_vocab floats, borrowed) with params p, the request's rng
 * and its token history (the prompt and the output so far, oldest first; only the last
 * penalty_last_n are read, and only when a penalty is on; may be NULL when n_history is 0).
 * Fills *out.  Never allocates; O(n_vocab) plus a sort of at most the candidates the
 * truncation keeps near its boundary.
 * Errors (nothing is written to *out and rng is not advanced): KVC_EINVAL for a NULL
 * s / p / logits / out, rng NULL with temperature > 0, history NULL with n_history > 0,
 * parameters kvc_sampling_params_check refuses, a history token outside [0, n_vocab) in
 * the penalty window (checked only when a penalty is on), or no finite logit. */
KVC_API KVC_NODISCARD int kvc_sample(kvc_sampler_t *s, const kvc_sampling_params_t *p,
                                     kvc_rng_t *rng, const float *logits,
                                     const kvc_token_t *history, size_t n_history,
                                     kvc_sample_result_t *out);

/* The tokens the draw of kvc_sample(s, p, ...) would choose from for these logits and this
 * history: what steps 1-5 keep, less the tokens whose logit is -inf (or NaN); with
 * temperature 0 the one greedy token.  Written to ids[0..*n_ids) (ids holds n_vocab), in
 * no particular order.  For tests and debugging; draws nothing.
 * Errors: those of kvc_sample (less the rng and out ones), and KVC_EINVAL for ids or
 * n_ids NULL. */
KVC_API KVC_NODISCARD int kvc_sample_kept(kvc_sampler_t *s, const kvc_sampling_params_t *p,
                                          const float *logits, const kvc_token_t *history,
                                          size_t n_history, kvc_token_t *ids, uint32_t *n_ids);

/* The k most probable tokens of the log-softmax of logits[0..n) (the NaN / inf rule
 * above), highest first, ties by lower id, into ids[0..k) and logprobs[0..k) (double), for
 * beam search.  Needs no scratch; O(n log k).
 * Errors: KVC_EINVAL (a NULL pointer, n 0 or above INT32_MAX, k 0 or > n, no finite logit). */
KVC_API KVC_NODISCARD int kvc_log_softmax_topk(const float *logits, uint32_t n, uint32_t k,
                                               kvc_token_t *ids, double *logprobs);

/* ---- stop strings ----------------------------------------------------------------------
 * Stop strings over the decoded text as it streams, chunk by chunk.  Text that may still
 * be the start of a stop string is held back (at most KVC_STOP_MAX_BYTES - 1 bytes); the
 * rest comes out at once.  A match ends the output right before the stop string, which is
 * never emitted.  The match is the one that completes first in the stream (the smallest
 * end offset; at the same end, the longest stop string, which starts earliest), so the
 * output is the same however the text is cut into chunks.  Matching is on bytes; when the
 * chunks and the stop strings are valid UTF-8, every emitted piece is valid UTF-8 too
 * (a held-back suffix always starts at the first byte of a stop string).  Stop token ids
 * are the engine's job. */
#define KVC_STOP_MAX_STRINGS 16
#define KVC_STOP_MAX_BYTES   256

typedef struct kvc_stop kvc_stop_t;

/* Copies stops[0..n_stops) (NUL-terminated, 1..KVC_STOP_MAX_BYTES bytes each; n_stops
 * 0..KVC_STOP_MAX_STRINGS, where 0 never matches and holds nothing back).  Freed by
 * kvc_stop_destroy (NULL is a no-op).
 * Errors: KVC_EINVAL (out NULL, stops NULL with n_stops > 0, a NULL or empty string),
 * KVC_ERANGE (too many strings or one too long), KVC_ENOMEM. */
KVC_API KVC_NODISCARD int kvc_stop_create(const char *const *stops, size_t n_stops,
                                          const kvc_allocator_t *a, kvc_stop_t **out);
KVC_API void kvc_stop_destroy(kvc_stop_t *st);

/* Feed text[0..len) (may be NULL when len is 0).  Writes the bytes that are safe to emit
 * now to out[0..*n_out) (held-back text from earlier chunks first, then this chunk's);
 * *matched is set when a stop string completed in this chunk or an earlier one (after a
 * match every feed emits nothing).  out needs cap >= len + KVC_STOP_MAX_BYTES.
 * Errors (the state is unchanged): KVC_EINVAL (a NULL pointer), KVC_ERANGE (cap too small). */
KVC_API KVC_NODISCARD int kvc_stop_feed(kvc_stop_t *st, const char *text, size_t len, char *out,
                                        size_t cap, size_t *n_out, bool *matched);

/* The stream ended without a match: writes the held-back text to out[0..*n_out) (nothing
 * after a match) and empties it.  cap >= KVC_STOP_MAX_BYTES is always enough.
 * Errors: KVC_EINVAL (a NULL pointer), KVC_ERANGE (cap smaller than the held text). */
KVC_API KVC_NODISCARD int kvc_stop_flush(kvc_stop_t *st, char *out, size_t cap, size_t *n_out);

/* Back to the state of a new stream (same stop strings). */
KVC_API void kvc_stop_reset(kvc_stop_t *st);

#ifdef __cplusplus
}
#endif
#endif /* KVCACHE_SAMPLE_H */
