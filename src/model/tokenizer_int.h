/* model/tokenizer_int.h - internal: what the tokenizer's two files share.  tokenizer.c
 * owns the vocabulary (texts, types, the text-to-id table, special-token partition, decode
 * and the stream decoder) and the SentencePiece merge; tokenizer_bpe.c adds the byte-level
 * BPE model ("gpt2"): the pre-tokenizer regexes, the byte-to-unicode map and the merges. */
#ifndef KVC_MODEL_TOKENIZER_INT_H
#define KVC_MODEL_TOKENIZER_INT_H

#include "kvcache/tokenizer.h"

typedef struct kvc__bpe kvc__bpe_t;

struct kvc_tokenizer {
    kvc_allocator_t alloc;
    uint32_t n_vocab;
    char *blob;         /* every token's text, each followed by a NUL */
    uint32_t *text_off; /* (n_vocab) offset into blob */
    uint32_t *text_len; /* (n_vocab) bytes */
    float *scores;      /* (n_vocab) */
    uint8_t *types;     /* (n_vocab) kvc_toktype_t */
    uint8_t *strip;     /* (n_vocab) STRIP_*: whitespace a matched special token swallows */
    uint32_t *table;    /* (table_mask + 1) open addressing: id + 1, 0 empty */
    uint32_t table_mask;
    uint32_t *special; /* (n_special) ids matched in the text before merging, longest first */
    uint32_t n_special;
    uint32_t max_text_len;
    kvc_token_t byte_id[256]; /* SPM: the token for each byte: <0xXX>, else the byte, else unk */
    kvc_token_t bos, eos, unk, pad;
    bool add_bos, add_eos, add_space_prefix;
    kvc__bpe_t *bpe; /* NULL: SentencePiece ("llama"); else byte-level BPE ("gpt2") */
};

/* ---- byte-level BPE (tokenizer_bpe.c) ---------------------------------------------------- */

/* Read tokenizer.ggml.pre and tokenizer.ggml.merges for t, whose tokens and types are loaded;
 * sets *add_bos_default (llama.cpp's default for that pre-tokenizer).  Errors (message in
 * err): KVC_ENOTSUP (an unknown pre-tokenizer, named), KVC_EPARSE (merges missing, mistyped,
 * malformed or naming a text that is not a token), KVC_ENOMEM. */
int kvc__bpe_create(const kvc_tokenizer_t *t, const kvc_gguf_t *g, kvc__bpe_t **out,
                    bool *add_bos_default, char *err, size_t cap);
void kvc__bpe_destroy(const kvc_tokenizer_t *t, kvc__bpe_t *b);
const char *kvc__bpe_pre(const kvc__bpe_t *b);

/* One encode call's workspace, sized for the `len` bytes of text, with `extra` more bytes
 * (16-aligned) for the caller at kvc__bpe_ws_extra.  KVC_ENOMEM. */
typedef struct kvc__bpe_ws kvc__bpe_ws_t;
int kvc__bpe_ws_create(const kvc_tokenizer_t *t, const char *text, size_t len, size_t extra,
                       kvc__bpe_ws_t **out);
void *kvc__bpe_ws_extra(kvc__bpe_ws_t *ws);
void kvc__bpe_ws_destroy(const kvc_tokenizer_t *t, kvc__bpe_ws_t *ws);

/* Tokenize the plain-text fragment s[0..n) (no special tokens in it), appending ids to
 * out[0..cap) and counting them all in *n_out.  KVC_ENOMEM when the regex engine runs out of
 * its memory or match limits. */
int kvc__bpe_encode(const kvc_tokenizer_t *t, kvc__bpe_ws_t *ws, const char *s, size_t n,
                    kvc_token_t *out, size_t cap, size_t *n_out);

/* The pre-tokenizer alone (for tests): fn gets each piece of s[0..n) in order, as valid
 * UTF-8 (see kvc__bpe_encode).  KVC_EINVAL for a SentencePiece tokenizer, KVC_ENOMEM. */
int kvc__bpe_pieces(const kvc_tokenizer_t *t, const char *s, size_t n,
                    void (*fn)(const char *piece, size_t len, void *ctx), void *ctx);

/* A normal token's text decoded through the byte map into dst (NULL: measure only); returns
 * the bytes.  Characters outside the map are copied as they are.  Never longer than the text. */
size_t kvc__bpe_decode_text(const kvc__bpe_t *b, const char *s, size_t n, char *dst);

#endif
