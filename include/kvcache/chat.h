/* kvcache/chat.h - chat templates: a conversation to the prompt text a chat model expects.
 *
 * A chat model is trained on conversations laid out one particular way (role markers,
 * turn separators, where a system prompt goes).  This module knows seven layouts by name
 * and renders a list of messages in one of them.  It is not a Jinja interpreter: a
 * model's own `tokenizer.chat_template` (Jinja text) is recognised from its distinctive
 * markers (kvc_chat_template_detect), the way llama.cpp does; a template it does not
 * recognise is refused, and the caller names one (`--chat-template NAME`).
 *
 * Each layout follows the published Jinja of the model it is named after (see
 * src/model/chat.c for the exact text of each and what differs from llama.cpp's own
 * renderer):
 *   llama2   meta-llama/Llama-2-7b-chat-hf: `[INST] <<SYS>>\nSYS\n<</SYS>>\n\nUSER [/INST]`
 *            ` ASSISTANT </s>`, `<s>[INST] ...` for later turns; contents stripped
 *   llama3   meta-llama/Meta-Llama-3-8B-Instruct: `<|start_header_id|>ROLE<|end_header_id|>`
 *            `\n\n` CONTENT (trimmed) `<|eot_id|>`
 *   chatml   `<|im_start|>ROLE\nCONTENT<|im_end|>\n` (OpenHermes, Qwen, SmolLM, ...)
 *   mistral  mistralai/Mistral-7B-Instruct-v0.1/v0.2: `[INST] USER [/INST]ASSISTANT</s>`;
 *            a system prompt joins the first user turn, `SYS\n\nUSER`
 *   gemma    google/gemma-7b-it, gemma-2: `<start_of_turn>user\n...<end_of_turn>\n`, the
 *            assistant is `model`; no system role: it joins the first user turn, `SYS\n\n`
 *   phi3     microsoft/Phi-3-mini: `<|ROLE|>\nCONTENT<|end|>\n`
 *   zephyr   HuggingFaceH4/zephyr-7b-beta: `<|ROLE|>\nCONTENT</s>\n`
 *
 * BOS: the rendered text never starts with the BOS token's text, even where the Jinja
 * writes `{{ bos_token }}` first: the engine adds the BOS itself when it tokenizes
 * (KVC_TOK_ADD_SPECIAL / KVC_TOK_ADD_BOS), so a prompt never gets two.  Special tokens
 * inside the text (`</s>` and `<s>` between llama2 turns, `<|eot_id|>`, `<|im_end|>`, ...)
 * are written as their text: tokenize with KVC_TOK_PARSE_SPECIAL.
 *
 * Errors: functions returning int return 0 or a negative KVC_E* code, listed at each.
 * Thread-safety: everything here is reentrant and allocates nothing.
 */
#ifndef KVCACHE_CHAT_H
#define KVCACHE_CHAT_H

#include <stdbool.h>
#include <stddef.h>

#include "kvcache/gguf.h"
#include "kvcache/util.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    KVC_CHAT_LLAMA2 = 0,
    KVC_CHAT_LLAMA3,
    KVC_CHAT_CHATML,
    KVC_CHAT_MISTRAL,
    KVC_CHAT_GEMMA,
    KVC_CHAT_PHI3,
    KVC_CHAT_ZEPHYR,
    KVC_CHAT__COUNT
} kvc_chat_template_t;

/* "llama2", "llama3", "chatml", "mistral", "gemma", "phi3", "zephyr"; "?" outside the enum. */
KVC_API const char *kvc_chat_template_name(kvc_chat_template_t t);

/* The template named `name` (NUL-terminated, exactly one of the names above).
 * KVC_ENOENT for any other name, KVC_EINVAL for NULL name or out. */
KVC_API KVC_NODISCARD int kvc_chat_template_parse(const char *name, kvc_chat_template_t *out);

/* Recognise a model's chat template from the `len` bytes of Jinja at `jinja` (need not be
 * NUL-terminated): a text that is exactly one of the names above is that template;
 * otherwise the template whose markers it holds (`<|im_start|>`: chatml;
 * `<|start_header_id|>` and `<|end_header_id|>`: llama3; `<start_of_turn>`: gemma;
 * `[INST]` with `<<SYS>>`: llama2; `[INST]` without: mistral; `<|assistant|>` with
 * `<|end|>`: phi3; `<|user|>` and `<|assistant|>` closed by the EOS: zephyr).  Variants
 * that render differently are refused rather than guessed: Mistral's v1 (` [INST] `), v3
 * (`[AVAILABLE_TOOLS]`) and v7 (`[SYSTEM_PROMPT]`) templates, Phi-4 (`<|im_sep|>`),
 * SmolVLM (`<end_of_utterance>`), ChatGLM (`[gMASK]`), Falcon 3.
 * Errors: KVC_ENOTSUP (not recognised: the caller should ask for a template by name),
 * KVC_EINVAL (NULL out, or NULL jinja with len > 0).  *out is untouched on failure. */
KVC_API KVC_NODISCARD int kvc_chat_template_detect(const char *jinja, size_t len,
                                                   kvc_chat_template_t *out);

/* The template of a model file: detect over its `tokenizer.chat_template` string.
 * Errors: KVC_ENOENT (the file has no tokenizer.chat_template), KVC_EPARSE (the key
 * holds something other than a string), KVC_ENOTSUP (not recognised), KVC_EINVAL (NULL
 * g or out). */
KVC_API KVC_NODISCARD int kvc_chat_template_from_gguf(const kvc_gguf_t *g,
                                                      kvc_chat_template_t *out);

/* One message: role is "system", "user" or "assistant"; content is NUL-terminated UTF-8
 * (copied as bytes, not checked).  Both borrowed for the call. */
typedef struct {
    const char *role;
    const char *content;
} kvc_chat_msg_t;

/* Render n messages in template t into out[0..cap): the text and a NUL; *len gets the
 * text's bytes without the NUL.  add_generation_prompt appends what opens the
 * assistant's turn (llama2 and mistral have none: their prompt ends at `[/INST]`).
 * Where a template has no system role (llama2, mistral, gemma fold it into the first
 * user turn) a system message must be the first message and be followed by a user
 * message.  Roles need not alternate.  No allocation.
 * Errors: KVC_ERANGE when cap < text + 1 (*len is then the text's bytes without the
 * NUL; out's contents are unspecified but nothing past out[cap - 1] is written),
 * KVC_EINVAL (a role other than the three, a misplaced system message, NULL role or
 * content, t outside the enum, NULL len, NULL msgs with n > 0, NULL out with cap > 0);
 * on KVC_EINVAL *len is untouched. */
KVC_API KVC_NODISCARD int kvc_chat_render(kvc_chat_template_t t, const kvc_chat_msg_t *msgs,
                                          size_t n, bool add_generation_prompt, char *out,
                                          size_t cap, size_t *len);

#ifdef __cplusplus
}
#endif

#endif /* KVCACHE_CHAT_H */
