/* kvcache/tokenizer.h - text to token ids and back (the model layer's tokenizers).
 *
 * A kvc_tokenizer_t is built from a GGUF file's `tokenizer.ggml.*` metadata
 * and copies everything it needs, so the GGUF may be closed afterwards.  Two
 * models, each with the behaviour of llama.cpp's tokenizer for it, which is
 * what its test vectors (Hugging Face / sentencepiece ids) are checked against.
 *
 * SentencePiece-style (`tokenizer.ggml.model` = "llama": scores, byte
 * fallback, the leading-space rule):
 *
 *   encode: the text is split at special tokens (user-defined tokens always;
 *   control and unknown tokens too with KVC_TOK_PARSE_SPECIAL), longest text
 *   first; each plain fragment gets a leading space when add_space_prefix is
 *   set and it starts the text or follows a special token, has its spaces
 *   (U+0020 only) replaced by U+2581 "▁", is split into UTF-8 characters and
 *   merged pairwise, best score first (ties: leftmost), into vocabulary
 *   pieces; a character with no piece of its own becomes byte tokens
 *   `<0xXX>` (or the unknown token where the vocabulary has no byte token).
 *
 *   decode: normal tokens with "▁" turned back into spaces, byte tokens as
 *   their byte, user-defined tokens verbatim, control / unknown / unused
 *   tokens as nothing (their text with KVC_TOK_UNPARSE_SPECIAL); when
 *   add_space_prefix is set, the first token's piece loses one leading space
 *   (as llama.cpp's detokenizer: with KVC_TOK_REMOVE_SPECIAL a leading BOS is
 *   dropped and the space is then kept, and a BOS decoded as a token
 *   consumes the rule, since the rule applies to the first token only).
 *
 * Byte-level BPE (`tokenizer.ggml.model` = "gpt2": merges, GPT-2's byte map,
 * a pre-tokenizer chosen by `tokenizer.ggml.pre`):
 *
 *   encode: the same special-token partition; each plain fragment is read as
 *   UTF-8 (a byte that starts no valid sequence, or an unfinished sequence,
 *   becomes U+FFFD, as in llama.cpp; so do surrogates and values past
 *   U+10FFFF), split into words by the pre-tokenizer's regexes in turn (each
 *   regex splits every piece the previous left, the text between its matches
 *   being pieces too), and each word's bytes, as their GPT-2 characters, are
 *   merged by the rank of tokenizer.ggml.merges (lowest first, ties leftmost).
 *   Pre-tokenizers (with llama.cpp's aliases): default (no key), gpt-2 (also
 *   mpt, phi-2, olmo, jais), llama-bpe (llama3, llama-v3, falcon3: a word that
 *   is a token is taken whole), dbrx, smaug-bpe, qwen2 (deepseek-r1-qwen,
 *   stablelm2, megrez), deepseek-llm, deepseek-coder, falcon, starcoder
 *   (refact, command-r, smollm, codeshell, exaone).  A byte whose character
 *   the vocabulary lacks is dropped, as llama.cpp and Hugging Face do.
 *
 *   decode: normal tokens through the byte map back to bytes (a character
 *   outside the map as its UTF-8), user-defined tokens verbatim, control and
 *   unknown tokens as nothing (their text with KVC_TOK_UNPARSE_SPECIAL), other
 *   types as nothing.  No leading-space rule, and no clean-up of spaces before
 *   punctuation (Hugging Face's clean_up_tokenization_spaces), so any valid
 *   UTF-8 text whose bytes all have tokens decodes back to itself.
 *
 * Any other tokenizer model is refused with KVC_ENOTSUP.
 *
 * Errors: functions returning int return 0 or a negative KVC_E* code, listed
 * at each function.  Ownership: the caller owns what _create returns and
 * frees it with the matching _destroy (NULL is a no-op); every const char *
 * handed out points into the tokenizer and lives as long as it.
 * Thread-safety: a kvc_tokenizer_t is read-only after creation, so any number
 * of threads may encode and decode with one tokenizer at once (encode's
 * workspace is per call).  A stream decoder belongs to one thread at a time.
 */
#ifndef KVCACHE_TOKENIZER_H
#define KVCACHE_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvcache/util.h"
#include "kvcache/prefix.h" /* kvc_token_t */
#include "kvcache/gguf.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVC_TOKEN_NONE ((kvc_token_t)-1) /* "no such special token" */

/* Token types, numbered as tokenizer.ggml.token_type numbers them. */
typedef enum {
    KVC_TOKTYPE_UNDEFINED = 0,
    KVC_TOKTYPE_NORMAL = 1,
    KVC_TOKTYPE_UNKNOWN = 2,
    KVC_TOKTYPE_CONTROL = 3,
    KVC_TOKTYPE_USER_DEFINED = 4,
    KVC_TOKTYPE_UNUSED = 5,
    KVC_TOKTYPE_BYTE = 6
} kvc_toktype_t;

/* Flags of kvc_tokenizer_encode. */
enum {
    KVC_TOK_ADD_BOS = 1u << 0,       /* prepend BOS (KVC_ENOENT if the vocabulary has none) */
    KVC_TOK_ADD_EOS = 1u << 1,       /* append EOS (likewise) */
    KVC_TOK_ADD_SPECIAL = 1u << 2,   /* BOS / EOS as the vocabulary's add_bos / add_eos say */
    KVC_TOK_PARSE_SPECIAL = 1u << 3, /* also match control and unknown tokens' text */
};
/* Flags of kvc_tokenizer_decode and the stream decoder. */
enum {
    KVC_TOK_REMOVE_SPECIAL =
        1u << 4, /* drop a leading BOS (if add_bos) / trailing EOS (if add_eos) */
    KVC_TOK_UNPARSE_SPECIAL = 1u << 5, /* render control and unknown tokens as their text */
};

typedef struct kvc_tokenizer kvc_tokenizer_t;

typedef struct {
    kvc_allocator_t allocator; /* zeroed: the C library; used for the tokenizer, encode's
                                * per-call workspace and stream decoders */
} kvc_tokenizer_params_t;

/* The C library allocator. */
KVC_API kvc_tokenizer_params_t kvc_tokenizer_params_default(void);

/* Build a tokenizer from g's tokenizer.ggml.* metadata (g is only borrowed
 * during the call; params may be NULL for the defaults).  Read:
 * tokenizer.ggml.model (required: "llama" or "gpt2"), tokens (required, 1 to 2^24 of them,
 * valid UTF-8
 * without NUL, at most 65535 bytes each; a duplicate text resolves to its
 * last id, as in llama.cpp), scores (float32, default 0) and token_type
 * (integers 0..6, default normal; a byte token's text must be `<0xXX>`),
 * both with exactly one entry per token; bos_token_id, eos_token_id,
 * unknown_token_id, padding_token_id (default 1, 2, 0 and none; for "gpt2"
 * 11, 11, none and none, llama.cpp's defaults; a default that is not a valid
 * id meaning none; a negative stored value, or -1 stored unsigned as
 * 0xFFFFFFFF or UINT64_MAX, means none); add_bos_token (default true; for
 * "gpt2" false, except true for the llama-bpe pre-tokenizer), add_eos_token
 * (false), add_space_prefix (true; always false for "gpt2").  For "gpt2"
 * also: pre (a string, default "default") and merges (required: strings
 * "LEFT RIGHT", split at the first space after the first byte, where LEFT,
 * RIGHT and LEFT+RIGHT are all tokens; a repeated pair keeps its first
 * rank).  Errors (with a one-line message in err): KVC_ENOENT (no
 * tokenizer.ggml.model), KVC_ENOTSUP (a model other than "llama" and
 * "gpt2", or an unknown pre-tokenizer; the message names it), KVC_EPARSE (any
 * other missing, mistyped, mismatched or out-of-range field, a malformed
 * merge or one naming a text that is not a token, or, for "llama", a byte
 * with neither a byte token nor an unknown token to fall back on; the
 * message names the key and the value), KVC_EINVAL (NULL g or out),
 * KVC_ENOMEM.  *out is untouched on failure. */
KVC_API KVC_NODISCARD int kvc_tokenizer_create_gguf(const kvc_gguf_t *g,
                                                    const kvc_tokenizer_params_t *params,
                                                    kvc_tokenizer_t **out, char *err, size_t cap);
KVC_API void kvc_tokenizer_destroy(kvc_tokenizer_t *t);

/* Accessors (t must be non-NULL). */
KVC_API uint32_t kvc_tokenizer_n_vocab(const kvc_tokenizer_t *t);
KVC_API kvc_token_t kvc_tokenizer_bos(const kvc_tokenizer_t *t); /* KVC_TOKEN_NONE if none */
KVC_API kvc_token_t kvc_tokenizer_eos(const kvc_tokenizer_t *t);
KVC_API kvc_token_t kvc_tokenizer_unk(const kvc_tokenizer_t *t);
KVC_API kvc_token_t kvc_tokenizer_pad(const kvc_tokenizer_t *t);
KVC_API bool kvc_tokenizer_add_bos(const kvc_tokenizer_t *t);
KVC_API bool kvc_tokenizer_add_eos(const kvc_tokenizer_t *t);
KVC_API bool kvc_tokenizer_add_space_prefix(const kvc_tokenizer_t *t);
/* The tokenizer model: "llama" (SentencePiece-style) or "gpt2" (byte-level BPE). */
KVC_API const char *kvc_tokenizer_model(const kvc_tokenizer_t *t);
/* The BPE pre-tokenizer's name as tokenizer.ggml.pre spells it ("default" where the GGUF has
 * none), or NULL for a SentencePiece tokenizer. */
KVC_API const char *kvc_tokenizer_pre(const kvc_tokenizer_t *t);
/* Token id's text as stored in the vocabulary (NUL-terminated, "▁" not
 * replaced, BPE's byte characters not mapped back), or NULL for an id out of range. */
KVC_API const char *kvc_tokenizer_token_text(const kvc_tokenizer_t *t, kvc_token_t id);
/* Token id's score (0 out of range) and type (KVC_TOKTYPE_UNDEFINED out of range). */
KVC_API float kvc_tokenizer_token_score(const kvc_tokenizer_t *t, kvc_token_t id);
KVC_API kvc_toktype_t kvc_tokenizer_token_type(const kvc_tokenizer_t *t, kvc_token_t id);
/* The id whose text is exactly the `len` bytes at s, or KVC_TOKEN_NONE. */
KVC_API kvc_token_t kvc_tokenizer_find(const kvc_tokenizer_t *t, const char *s, size_t len);
/* The most bytes one kvc_tokenizer_stream_push or _finish can hand out (a held
 * EOS, the token's piece and held bytes, every byte a U+FFFD at worst); a
 * token's one-shot piece is never longer. */
KVC_API size_t kvc_tokenizer_max_piece_bytes(const kvc_tokenizer_t *t);

/* Tokenize the `len` bytes at text (need not be NUL-terminated or valid
 * UTF-8; NULL with len 0 is the empty text) with flags KVC_TOK_ADD_BOS,
 * _ADD_EOS, _ADD_SPECIAL, _PARSE_SPECIAL.  The ids go to out[0..cap) and
 * their count to *n_out; there are never more than 3 * len + 5 (a cap of
 * that always suffices).  Invalid UTF-8 is tokenized as llama.cpp does
 * (SentencePiece: a lead byte takes the bytes after it into its character,
 * whatever they are; BPE: see above), so it may not decode back to the same
 * bytes.  Memory: one workspace allocation per call, about 100 bytes per
 * input byte (BPE: about 120, up to 3 times that for invalid UTF-8, plus the
 * regex engine's match data, and its backtracking frames where PCRE2 has no
 * JIT), nothing per token.  Errors: KVC_ERANGE when cap is too small (*n_out
 * is then the count needed; out's contents are unspecified), KVC_ENOENT when
 * BOS or EOS is asked for and the vocabulary has none, KVC_EINVAL (NULL t or
 * n_out, NULL text with len > 0, NULL out with cap > 0, unknown flags, len
 * over 64 MiB), KVC_ENOMEM (the workspace, or the regex engine out of memory
 * or past its match limits; out's contents are then unspecified and *n_out
 * untouched). */
KVC_API KVC_NODISCARD int kvc_tokenizer_encode(const kvc_tokenizer_t *t, const char *text,
                                               size_t len, unsigned flags, kvc_token_t *out,
                                               size_t cap, size_t *n_out);

/* Detokenize n ids with flags KVC_TOK_REMOVE_SPECIAL, _UNPARSE_SPECIAL into
 * out (bytes exactly as the tokens give them, so ids that split a character
 * give invalid UTF-8: the stream decoder below repairs that) followed by a
 * NUL; *n_bytes gets the byte count without the NUL.  No allocation.
 * Errors: KVC_ERANGE when cap < bytes + 1 (*n_bytes is then the bytes
 * needed without the NUL; out's contents are unspecified), KVC_EINVAL (an id
 * out of range, NULL t or n_bytes, NULL ids with n > 0, NULL out with
 * cap > 0, unknown flags). */
KVC_API KVC_NODISCARD int kvc_tokenizer_decode(const kvc_tokenizer_t *t, const kvc_token_t *ids,
                                               size_t n, unsigned flags, char *out, size_t cap,
                                               size_t *n_bytes);

/* ---- streaming decode -------------------------------------------------------
 * Feeds ids one at a time and hands back only complete, valid UTF-8: the
 * bytes of a character split across tokens are held until it completes, and
 * each maximal ill-formed subsequence (Unicode's "maximal subpart" rule, as
 * browsers decode) becomes U+FFFD.  The concatenation of every push and the
 * finish equals kvc_tokenizer_decode of the same ids wherever that is valid
 * UTF-8, however the ids are split.  With KVC_TOK_REMOVE_SPECIAL an EOS is
 * held until the next id shows it was not the last.  The stream borrows its
 * tokenizer, which must outlive it. */
typedef struct kvc_tokenizer_stream kvc_tokenizer_stream_t;

/* Errors: KVC_EINVAL (NULL t or out, unknown flags), KVC_ENOMEM. */
KVC_API KVC_NODISCARD int kvc_tokenizer_stream_create(const kvc_tokenizer_t *t, unsigned flags,
                                                      kvc_tokenizer_stream_t **out);
KVC_API void kvc_tokenizer_stream_destroy(kvc_tokenizer_stream_t *s);
/* Back to the state of a new stream (as before the first id). */
KVC_API void kvc_tokenizer_stream_reset(kvc_tokenizer_stream_t *s);
/* Decode one more id: the text it completes goes to out (NUL-terminated),
 * its byte count to *n_bytes (0 when the id only starts a character).
 * A cap of kvc_tokenizer_max_piece_bytes(t) + 1 always suffices.  Errors
 * (the stream unchanged): KVC_EINVAL (an id out of range, NULL s, out or
 * n_bytes), KVC_ERANGE (cap too small; *n_bytes is then the bytes needed
 * without the NUL). */
KVC_API KVC_NODISCARD int kvc_tokenizer_stream_push(kvc_tokenizer_stream_t *s, kvc_token_t id,
                                                    char *out, size_t cap, size_t *n_bytes);
/* End of the ids: an unfinished character becomes U+FFFD, a held EOS is
 * dropped; the stream is then as new.  Errors as for _push. */
KVC_API KVC_NODISCARD int kvc_tokenizer_stream_finish(kvc_tokenizer_stream_t *s, char *out,
                                                      size_t cap, size_t *n_bytes);

#ifdef __cplusplus
}
#endif

#endif /* KVCACHE_TOKENIZER_H */
