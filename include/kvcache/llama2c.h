/* kvcache/llama2c.h - llama2.c checkpoints (`.bin`, the legacy layout) and tokenizers
 * (`tokenizer.bin`), read into and written from the GGUF form the engine uses.
 *
 * The legacy layout (llama2.c's run.c memory_map_weights, export.py legacy_export): seven
 * little-endian int32, dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size (negative:
 * the classifier is not the embedding and follows at the end), seq_len; then float32
 * arrays, row-major: token_embedding (vocab, dim), rms_att (L, dim), wq (L, dim, dim), wk
 * (L, kv_dim, dim), wv (L, kv_dim, dim), wo (L, dim, dim), rms_ffn (L, dim), w1 (L, hidden,
 * dim), w2 (L, dim, hidden), w3 (L, hidden, dim), rms_final (dim), freq_cis_real and
 * freq_cis_imag (seq_len, head_size / 2 each: not read), and wcls (vocab, dim) when
 * vocab_size < 0.  The format has no magic, so the shape is checked hard: every count > 0,
 * heads dividing dim and each other, an even head size, and the sizes adding up to the
 * file's length exactly.
 *
 * tokenizer.bin (llama2.c's tokenizer.py): uint32 max_token_length, then per token a
 * float32 score, an int32 length and that many bytes.  The exporter wrote SentencePiece's
 * U+2581 as a space and BOS / EOS as "\n<s>\n" / "\n</s>\n"; reading maps them back.
 * run.c fixes BOS = 1 and EOS = 2, so the token types are: 0 unknown, 1 and 2 control,
 * `<0xXX>` byte, every other normal.
 *
 * The GGUF a checkpoint becomes is what llama.cpp's convert-llama2c-to-ggml writes: arch
 * llama, llama.cpp's tensor names (token_embd, blk.N.attn_norm / attn_q / attn_k / attn_v /
 * attn_output / ffn_norm / ffn_gate (w1) / ffn_down (w2) / ffn_up (w3), output_norm,
 * output), F32, RMSNorm eps 1e-5, RoPE theta 10000 on the whole head.  No Q/K permutation:
 * llama2.c and ggml's llama RoPE both rotate adjacent pairs.  output.weight is always
 * there: wcls, or for a shared classifier a copy of the embedding, as llama.cpp's
 * converter writes it (so stories260K.gguf, whose output.weight is its embedding, is a
 * shared checkpoint).  Writing, the classifier is shared (vocab_size > 0) when the GGUF
 * has no output.weight or one whose floats equal the embedding's bit for bit.
 *
 * Errors: 0 or a negative KVC_E* code with one line in msg (may be NULL).
 * Thread-safety: reentrant; the functions only read their inputs.
 */
#ifndef KVCACHE_LLAMA2C_H
#define KVCACHE_LLAMA2C_H

#include <stddef.h>

#include "kvcache/gguf.h"
#include "kvcache/util.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Read the checkpoint at bin_path and its tokenizer (tokenizer_path; NULL: none, then the
 * GGUF holds llama.vocab_size instead of a vocabulary) into an in-memory GGUF: *out owns
 * its memory (allocated through `a`, NULL: the C library; `a` must outlive it) and is
 * closed with kvc_gguf_close.  The result passes kvc_model_hparams_from_gguf and, with a
 * tokenizer, kvc_tokenizer_create_gguf: both are run before it is returned.
 * Errors: KVC_EIO (a file cannot be opened, read or mapped: the message names it and the
 * OS error), KVC_EPARSE (a truncated or inconsistent header, sizes that do not add up to
 * the file's length, a bad token record: the message says which file, what and where),
 * KVC_ENOMEM, KVC_EINVAL (NULL bin_path or out).  *out is untouched on failure. */
KVC_API KVC_NODISCARD int kvc_llama2c_open(const char *bin_path, const char *tokenizer_path,
                                           const kvc_allocator_t *a, kvc_gguf_t **out, char *msg,
                                           size_t cap);

/* The same over checkpoint and tokenizer bytes in memory (tok NULL with tok_bytes 0: no
 * tokenizer), borrowed for the call: the fuzz target's entry.  Errors as kvc_llama2c_open
 * without KVC_EIO. */
KVC_API KVC_NODISCARD int kvc_llama2c_open_memory(const void *bin, size_t bin_bytes,
                                                  const void *tok, size_t tok_bytes,
                                                  const kvc_allocator_t *a, kvc_gguf_t **out,
                                                  char *msg, size_t cap);

/* Write the llama-architecture model in g as a legacy .bin at bin_path (float32: every
 * weight type kvc_ggml_dequantize_row converts is dequantized) and, if tokenizer_path is
 * not NULL, its vocabulary as a tokenizer.bin.  A model the format cannot hold is refused:
 * another architecture, head_dim * heads != dim, partial RoPE, RoPE scaling or a theta
 * other than 10000, an RMSNorm eps other than 1e-5 (run.c fixes both), QKV bias, Q/K
 * norms, a sliding window, a dimension past INT32_MAX; for the tokenizer, a vocabulary
 * other than SentencePiece's, BOS / EOS ids other than 1 / 2, or a token holding a space
 * (it would read back as U+2581).  Files are replaced; on failure neither is left.
 * Errors: KVC_ENOTSUP (what cannot be represented, named), KVC_EPARSE (g's metadata or a
 * tensor's shape or type is not what its hyperparameters say), KVC_EIO, KVC_ENOMEM,
 * KVC_EINVAL (NULL g or bin_path). */
KVC_API KVC_NODISCARD int kvc_llama2c_write(const kvc_gguf_t *g, const char *bin_path,
                                            const char *tokenizer_path, char *msg, size_t cap);

#ifdef __cplusplus
}
#endif

#endif /* KVCACHE_LLAMA2C_H */
