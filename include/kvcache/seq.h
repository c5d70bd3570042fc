/* kvcache/seq.h - everything one request does to KV memory between admission
 * and release: block tables (one per KV group), slot mappings, prefix
 * lookup, chunked reservation, copy-on-write forks, beam search, speculative
 * drafts and their rollback, sliding windows, and handles that a stale
 * completion cannot fool.
 *
 * A sequence's positions move through these counts, in this order:
 *
 *     n_computed <= n_reserved <= n_tokens,   n_committed = n_tokens - n_draft
 *
 *   n_tokens    tokens known: the prompt, sampled outputs, then draft tokens;
 *   n_draft     the trailing drafts not yet verified;
 *   n_reserved  positions with a slot (the table covers exactly these);
 *   n_computed  positions whose KV is written (a completed step said so).
 *
 * A full block is inserted into the prefix cache only when its KV is written
 * and its tokens are committed, never before: a block becomes hittable only
 * when its bytes are valid and can no longer be rolled back.
 *
 * Copy-on-write (DESIGN.md invariant 7): a block shared by several tables is
 * never written; the sequence that is about to write into a shared, partially
 * filled block first gets its own copy (the last sharer writes in place).
 *
 * Handles are (slot, generation).  Every call checks the generation: a stale
 * handle gets KVC_ESTALE and changes nothing.  A sequence destroyed while a
 * step that uses it is in flight keeps its blocks until that step completes;
 * its slot is reused only then, under a new generation.  A completion must
 * name its step and present the rows it was launched with, in order; a late,
 * duplicate or permuted completion is rejected and changes nothing.
 *
 * Errors: a function that returns int returns 0 or a negative KVC_E* code,
 * named in its comment, and is all or nothing: on an error nothing changed
 * (a refused call on a stale handle is only counted in the stats).  Caller
 * mistakes and environment failures are codes, never aborts.  The exceptions
 * return no code: kvc_seqs_params_default (a struct), kvc_seqs_n_groups (a
 * count), kvc_seqs_has_sliding, kvc_seq_valid and kvc_seq_eq (booleans),
 * kvc_seqs_destroy and kvc_seqs_stats (void).  The table pointer must be one
 * kvc_seqs_create returned (only kvc_seqs_destroy takes NULL).
 *
 * A caller may take references of its own on a table's blocks (kvc_pool_ref,
 * e.g. to copy one out); dropping a reference a table owns (kvc_pool_unref on
 * one of its blocks) is a caller error: the calls that would then free a
 * block twice refuse with KVC_EUNDERFLOW and change nothing.
 *
 * Thread-safety: not thread-safe; the scheduler thread owns it, like the pool.
 */
#ifndef KVCACHE_SEQ_H
#define KVCACHE_SEQ_H

#include "kvcache/prefix.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    uint32_t slot;
    uint32_t gen; /* 0 is never a live generation */
} kvc_seq_t;

static inline bool kvc_seq_eq(kvc_seq_t a, kvc_seq_t b)
{
    return a.slot == b.slot && a.gen == b.gen;
}

/* Called for every copy-on-write: the engine must copy block src's bytes to
 * dst before the step that writes dst runs.  NULL: kvc_pool_copy_block (a
 * no-op for metadata-only pools). */
typedef void (*kvc_copy_fn)(void *ctx, uint32_t dst, uint32_t src);

typedef struct {
    uint32_t max_seqs;               /* live sequences at once (default 256) */
    uint32_t n_groups;               /* KV groups, 1..KVC_MAX_GROUPS (default 1) */
    uint32_t window[KVC_MAX_GROUPS]; /* per group: 0 = full attention, else the sliding
                                        window in tokens; must agree with the prefix
                                        cache's group_window */
    uint32_t max_inflight_steps;     /* steps launched and not completed (default 4) */
    uint32_t max_batch;              /* rows in one step (default: max_seqs) */
    kvc_copy_fn on_copy;
    void *copy_ctx;
    kvc_allocator_t allocator;
} kvc_seqs_params_t;

KVC_API kvc_seqs_params_t kvc_seqs_params_default(void);

typedef struct kvc_seqs kvc_seqs_t;

/* Create the sequence table over `pool` and (optionally, NULL: no prefix
 * caching) `pc`; both are borrowed and must outlive it.  KVC_EINVAL for NULL
 * pool, params or out, max_seqs 0 or >= 2^30, n_groups 0 or > KVC_MAX_GROUPS,
 * max_inflight_steps 0 or > 1,024, a window for a group >= n_groups, a prefix
 * cache over another pool, or windows that differ from the cache's
 * group_window (*out is then NULL); KVC_ENOMEM.  The caller destroys it with
 * kvc_seqs_destroy. */
KVC_API KVC_NODISCARD int kvc_seqs_create(kvc_pool_t *pool, kvc_prefix_t *pc,
                                          const kvc_seqs_params_t *params, kvc_seqs_t **out);
/* Release every sequence's blocks (tail first) and free the table (a block the
 * caller already unref'd is skipped, never freed twice).  NULL is a no-op. */
KVC_API void kvc_seqs_destroy(kvc_seqs_t *seqs);

/* ---- lifecycle ----------------------------------------------------------- */
typedef struct {
    const kvc_token_t *prompt; /* (n_prompt), copied */
    size_t n_prompt;           /* >= 1 */
    const kvc_namespace_t *ns; /* NULL: the default namespace; its group is ignored
                                  (each group uses its own) */
    const kvc_mm_input_t *mm;  /* multimodal inputs in the prompt, copied */
    size_t n_mm;
    uint32_t priority; /* the prefix queries' priority (kvc_prefix_query_t.priority:
                          0..KVC_PREFIX_MAX_PRIORITY; only the "priority" eviction policy
                          reads it); 0 by default */
} kvc_seq_desc_t;

/* Register a request: its prompt is known, no block is taken yet.
 * KVC_EINVAL (NULL arguments, an empty prompt, a multimodal input that does not
 * lie within the prompt, a priority above KVC_PREFIX_MAX_PRIORITY), KVC_ENOSPC (all slots taken),
 * KVC_ERANGE (with a prefix cache: more multimodal inputs overlap one block, the prompt's last
 * partial block included, than the cache's max_extra_keys), KVC_ENOMEM. */
KVC_API KVC_NODISCARD int kvc_seq_create(kvc_seqs_t *seqs, const kvc_seq_desc_t *desc,
                                         kvc_seq_t *out);

/* Finish or abort a request.  Its blocks are released tail-first now, or,
 * if a step that uses it is in flight, when the last such step completes
 * (deferred reclamation).  The handle is stale from this call on either way.
 * KVC_ESTALE for a stale handle; KVC_EUNDERFLOW if the caller unref'd one of
 * its blocks (the sequence stays live and unchanged; re-ref it and retry). */
KVC_API int kvc_seq_destroy(kvc_seqs_t *seqs, kvc_seq_t h);

/* Preemption: release every block (tail first) and drop pending drafts, but
 * keep the committed tokens and the accepted/emitted counts; n_reserved and
 * n_computed go back to 0 and the sequence may look its prefix up again
 * (its own full blocks stay cached until their memory is needed, so a
 * recompute can hit them).  KVC_ESTALE; KVC_EBUSY while a step that uses it
 * is in flight; KVC_EUNDERFLOW if the caller unref'd one of its blocks. */
KVC_API int kvc_seq_reset(kvc_seqs_t *seqs, kvc_seq_t h);

/* The table's KV groups (its params.n_groups: a count), and whether any has a
 * sliding window (a boolean). */
KVC_API uint32_t kvc_seqs_n_groups(const kvc_seqs_t *seqs);
KVC_API bool kvc_seqs_has_sliding(const kvc_seqs_t *seqs);

/* True if h names a live sequence (a boolean; never counted as a stale call). */
KVC_API bool kvc_seq_valid(const kvc_seqs_t *seqs, kvc_seq_t h);

/* ---- prefix reuse, reservation, completion ------------------------------------ */
/* Look up the prompt's longest cached prefix across all groups and pin it:
 * a full-attention group needs every block of the prefix, a sliding group only
 * those of the window before the first computed position.  n_computed and
 * n_reserved become the hit length (never the whole prompt: the last token is
 * computed).  Once, before the first reservation (KVC_EBUSY otherwise; after
 * a kvc_seq_reset it may look up again).  *n_hit_tokens (if not NULL)
 * receives the hit.
 * KVC_ESTALE, KVC_ENOMEM, KVC_EOVERFLOW (pinning a block past the pool's
 * reference limit), KVC_ECORRUPT (the prefix cache's probe and lookup
 * disagree: a bug, reported rather than aborting). */
KVC_API KVC_NODISCARD int kvc_seq_lookup(kvc_seqs_t *seqs, kvc_seq_t h, size_t *n_hit_tokens);

/* Reserve slots for the next n positions [n_reserved, n_reserved + n), which
 * must hold known tokens.  Allocates blocks as positions cross block
 * boundaries and copies a shared block before its first write.  All or
 * nothing: KVC_ESTALE, KVC_ERANGE (beyond the known tokens), KVC_ENOSPC /
 * KVC_EBUSY (from kvc_pool_alloc), KVC_ENOMEM, and no change.  slots (if not
 * NULL) receives n_groups * n entries, group-major: block * block_size +
 * offset of each position. */
KVC_API KVC_NODISCARD int kvc_seq_reserve(kvc_seqs_t *seqs, kvc_seq_t h, uint32_t n,
                                          int64_t *slots);

/* Blocks a reservation of n more positions would take from the pool now
 * (new blocks plus copies), so a scheduler can plan without trying.
 * KVC_ESTALE, KVC_EINVAL (n_blocks NULL), KVC_ERANGE (beyond the known tokens). */
KVC_API int kvc_seq_blocks_needed(const kvc_seqs_t *seqs, kvc_seq_t h, uint32_t n,
                                  uint32_t *n_blocks);

/* A step wrote the KV of the next n reserved positions: n_computed += n.
 * Full blocks now written and committed are inserted into the prefix cache
 * (a duplicate is replaced by the cached copy and ours goes back to the
 * pool); sliding groups release the blocks that fell out of the window of the
 * next position.  Allocates nothing; KVC_ESTALE, KVC_ERANGE (past n_reserved)
 * are its only errors.  (A block the cache refuses, e.g. for its extra keys,
 * is simply not cached, and neither is any later block of that group.) */
KVC_API KVC_NODISCARD int kvc_seq_complete(kvc_seqs_t *seqs, kvc_seq_t h, uint32_t n);

/* Append known tokens after the committed ones (sampled outputs); no block is
 * taken (kvc_seq_reserve does that).  KVC_ESTALE, KVC_EINVAL (tokens NULL
 * with n > 0), KVC_EBUSY while drafts are pending, KVC_ENOMEM (the token and
 * hash arrays grow). */
KVC_API int kvc_seq_append(kvc_seqs_t *seqs, kvc_seq_t h, const kvc_token_t *tokens, uint32_t n);

/* ---- speculative decoding --------------------------------------------------- */
/* Append draft tokens (unverified).  Reserve their slots with kvc_seq_reserve.
 * KVC_ESTALE, KVC_EINVAL (tokens NULL with n > 0), KVC_ENOMEM. */
KVC_API KVC_NODISCARD int kvc_seq_draft(kvc_seqs_t *seqs, kvc_seq_t h, const kvc_token_t *tokens,
                                        uint32_t n);

/* Verification accepted the first n_accepted pending drafts: they become
 * committed, the rest are rolled back (kvc_seq_rollback).  The bonus token,
 * if any, is then appended with kvc_seq_append.  KVC_ESTALE, KVC_ERANGE if
 * n_accepted exceeds the pending drafts, KVC_ENOMEM, KVC_EUNDERFLOW (as
 * kvc_seq_rollback). */
KVC_API int kvc_seq_accept(kvc_seqs_t *seqs, kvc_seq_t h, uint32_t n_accepted);

/* Remove the last n pending drafts as if they had never been appended:
 * tokens, reservations, computed count and blocks (blocks that covered only
 * rolled-back positions return to the pool, where they are reused first)
 * go back to exactly their state before.  KVC_ESTALE, KVC_ERANGE if fewer
 * drafts are pending, KVC_EUNDERFLOW if the caller unref'd a block the
 * rollback would release. */
KVC_API int kvc_seq_rollback(kvc_seqs_t *seqs, kvc_seq_t h, uint32_t n);

/* The user received n more output tokens.  Only committed output tokens can
 * be emitted (KVC_ERANGE otherwise), so an emitted token is never rolled back.
 * KVC_ESTALE. */
KVC_API int kvc_seq_emit(kvc_seqs_t *seqs, kvc_seq_t h, uint32_t n);

/* ---- forks and beams -------------------------------------------------------- */
/* A child that shares all of the parent's blocks and state.  The parent must
 * have nothing reserved beyond its computed positions and no drafts
 * (KVC_EBUSY).  KVC_ESTALE, KVC_EINVAL (child NULL), KVC_ENOSPC when all
 * slots are taken, KVC_ENOMEM, KVC_EOVERFLOW (a block at the pool's reference
 * limit). */
KVC_API KVC_NODISCARD int kvc_seq_fork(kvc_seqs_t *seqs, kvc_seq_t parent, kvc_seq_t *child);

typedef struct {
    uint32_t parent;   /* index into the current beams */
    kvc_token_t token; /* the beam's next token */
} kvc_beam_choice_t;

#define KVC_MAX_BEAMS 1024 /* beams in one kvc_seq_beam_step */

/* One beam-search step.  beams[0..n_beams) are the current beams, all fully
 * computed; choices[0..n_choices) the survivors.  Dead beams (chosen by no
 * one) are destroyed first, so that a survivor that becomes the last holder
 * of a block writes in place; then each parent's first choice continues the
 * parent itself and its other choices fork from it; then every new beam
 * appends its token and reserves its slot.  new_beams[j] is choice j's beam;
 * slots (if not NULL) receives n_groups * n_choices entries, group-major.
 * All or nothing: on any error every beam, dead ones included, is exactly as
 * before (on KVC_EBUSY the pool may have dropped the identity of free cached
 * blocks it tried to evict).  KVC_EINVAL (NULL arrays, more than
 * KVC_MAX_BEAMS or max_seqs beams, a beam listed twice, a parent index out of
 * range), KVC_ESTALE, KVC_EBUSY (a beam not fully computed or with drafts, or
 * from kvc_pool_alloc: cached blocks held back by their children), KVC_ENOSPC
 * (slots for the forks, or blocks for the survivors even with the dead beams'
 * given back), KVC_ENOMEM, KVC_EOVERFLOW (a block at the pool's reference
 * limit), KVC_EUNDERFLOW (the caller unref'd a dead beam's block). */
KVC_API KVC_NODISCARD int kvc_seq_beam_step(kvc_seqs_t *seqs, const kvc_seq_t *beams,
                                            uint32_t n_beams, const kvc_beam_choice_t *choices,
                                            uint32_t n_choices, kvc_seq_t *new_beams,
                                            int64_t *slots);

/* ---- steps: the launch-to-completion contract --------------------------------- */
typedef uint64_t kvc_step_id_t;

/* A step is launched over rows[0..n_rows): row i computes for rows[i].  All
 * handles live and distinct (KVC_ESTALE / KVC_EINVAL); KVC_EINVAL also for
 * NULL id or rows, or more than max_batch rows; KVC_EBUSY when
 * max_inflight_steps are already in flight. */
KVC_API KVC_NODISCARD int kvc_step_launch(kvc_seqs_t *seqs, const kvc_seq_t *rows, uint32_t n_rows,
                                          kvc_step_id_t *id);

/* The step completed.  `rows` must be exactly the rows it was launched with,
 * in the same order: an unknown or already-completed step id, or rows that
 * differ, are rejected with KVC_ESTALE and change nothing (counted in the
 * stats); KVC_EINVAL for NULL rows with n_rows > 0.  On success live[i] (if
 * not NULL) says whether row i's sequence is still live, i.e. whether its
 * results may be applied; sequences destroyed while the step was in flight
 * are reclaimed now. */
KVC_API KVC_NODISCARD int kvc_step_complete(kvc_seqs_t *seqs, kvc_step_id_t id,
                                            const kvc_seq_t *rows, uint32_t n_rows, bool *live);

/* ---- what kernels and schedulers read ------------------------------------------ */
typedef struct {
    size_t n_prompt, n_tokens, n_draft, n_reserved, n_computed;
    size_t n_accepted;                 /* drafts accepted, in total */
    size_t n_emitted;                  /* output tokens the user received */
    size_t n_hit_tokens;               /* prompt tokens that came from the prefix cache */
    uint32_t n_blocks[KVC_MAX_GROUPS]; /* blocks held per group */
    uint32_t n_draft_blocks;           /* blocks (all groups) held only for draft positions */
    uint32_t n_inflight;               /* launched steps not yet completed */
} kvc_seq_info_t;

/* KVC_ESTALE, KVC_EINVAL (out NULL). */
KVC_API int kvc_seq_info(const kvc_seqs_t *seqs, kvc_seq_t h, kvc_seq_info_t *out);

/* The counts a scheduler reads every step, cheaply: tokens known, tokens
 * computed, blocks held (all groups).  Any pointer may be NULL.  KVC_ESTALE. */
KVC_API int kvc_seq_progress(const kvc_seqs_t *seqs, kvc_seq_t h, size_t *n_tokens,
                             size_t *n_computed, uint32_t *n_blocks);

/* The sequence's tokens (borrowed until the next call that changes it).
 * KVC_ESTALE, KVC_EINVAL (NULL pointers). */
KVC_API int kvc_seq_tokens(const kvc_seqs_t *seqs, kvc_seq_t h, const kvc_token_t **tokens,
                           size_t *n);

/* A group's block table: logical block i -> physical block, KVC_NONE for a
 * sliding group's released blocks.  Borrowed until the next call that
 * changes the sequence.  KVC_ESTALE, KVC_EINVAL (no such group, NULL
 * pointers). */
KVC_API int kvc_seq_table(const kvc_seqs_t *seqs, kvc_seq_t h, uint32_t group,
                          const uint32_t **table, uint32_t *n_blocks);

/* Slots of positions [first, first + n) in a group (KVC_ERANGE outside the
 * reserved positions or in a released block).  KVC_ESTALE, KVC_EINVAL (no
 * such group, slots NULL with n > 0). */
KVC_API int kvc_seq_slots(const kvc_seqs_t *seqs, kvc_seq_t h, uint32_t group, size_t first,
                          uint32_t n, int64_t *slots);

/* The paged-attention view of a batch for one group, in the CSR form kernels
 * take: row i's blocks are indices[indptr[i] .. indptr[i + 1]) in logical
 * order (KVC_NONE for released sliding blocks), and last_page_len[i] tokens of
 * its last block are in use (reserved positions count: they are written
 * before attention reads them).  KVC_ERANGE if indices_cap is too small,
 * KVC_ESTALE for a stale row, KVC_EINVAL for NULL arrays or no such group
 * (the outputs may then be partly written). */
KVC_API int kvc_seqs_csr(const kvc_seqs_t *seqs, const kvc_seq_t *rows, uint32_t n_rows,
                         uint32_t group, uint32_t *indptr, uint32_t *indices, size_t indices_cap,
                         uint32_t *last_page_len);

typedef struct {
    uint32_t n_live;    /* live sequences */
    uint32_t n_zombies; /* destroyed, waiting for an in-flight step */
    uint32_t n_steps_inflight;
    uint64_t n_created, n_destroyed, n_deferred;
    uint64_t n_forks, n_cow_copies;
    uint64_t n_drafted, n_accepted, n_rolled_back; /* draft tokens */
    uint64_t n_hit_tokens;                         /* prompt tokens served from the prefix cache */
    uint64_t n_window_released;                    /* sliding-window blocks released */
    uint64_t n_duplicates_shared;                  /* blocks swapped for an identical cached copy */
    uint64_t n_stale;                              /* calls refused for a stale handle */
    uint64_t n_rejected_completions;
} kvc_seqs_stats_t;

KVC_API void kvc_seqs_stats(const kvc_seqs_t *seqs, kvc_seqs_stats_t *out);

/* Check the sequences' invariants, assuming the seq layer is the pool's only
 * user: every block's refcount equals the number of tables holding it (1);
 * each table covers exactly the reserved positions; positions about to be
 * written are in blocks no one else holds (7); inserted blocks carry the
 * sequence's own hashes; counts are ordered; plus kvc_prefix_check (or
 * kvc_pool_check without a prefix cache).  0 or KVC_ECORRUPT with msg;
 * KVC_ENOMEM.  Its scratch comes from the C library, not params.allocator, so
 * that fault-injection tests can check the state a failure left. */
KVC_API int kvc_seqs_check(const kvc_seqs_t *seqs, char *msg, size_t msg_cap);

/* The pool the table was created over (borrowed), so that a layer above takes it from here
 * instead of being handed it a second time. */
KVC_API kvc_pool_t *kvc_seqs_pool(const kvc_seqs_t *seqs);

#ifdef __cplusplus
}
#endif
#endif /* KVCACHE_SEQ_H */
