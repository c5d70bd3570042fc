/* chat.c - chat templates by name (see kvcache/chat.h): recognising a model's Jinja
 * template from its markers, and rendering a conversation in each layout.
 *
 * Every layout is written from the model's published Jinja (the text is quoted at each
 * renderer), rendered as Hugging Face renders it (trim_blocks, so the newline after a
 * block tag is dropped; `trim` and `.strip()` are Python's str.strip(), which strips
 * Unicode whitespace).  Where llama.cpp's own renderer (llm_chat_apply_template) differs
 * from the Jinja, the Jinja wins and the difference is noted.  The text never starts with
 * the BOS token's text (the engine's tokenizer adds BOS), whatever the Jinja writes. */
#include "kvcache/chat.h"

#include <stdint.h>
#include <string.h>

static const char *const names[KVC_CHAT__COUNT] = {
    [KVC_CHAT_LLAMA2] = "llama2",   [KVC_CHAT_LLAMA3] = "llama3", [KVC_CHAT_CHATML] = "chatml",
    [KVC_CHAT_MISTRAL] = "mistral", [KVC_CHAT_GEMMA] = "gemma",   [KVC_CHAT_PHI3] = "phi3",
    [KVC_CHAT_ZEPHYR] = "zephyr",
};

const char *kvc_chat_template_name(kvc_chat_template_t t)
{
    return (unsigned)t < KVC_CHAT__COUNT ? names[t] : "?";
}

int kvc_chat_template_parse(const char *name, kvc_chat_template_t *out)
{
    if (!name || !out) return KVC_EINVAL;
    for (int t = 0; t < KVC_CHAT__COUNT; t++)
        if (!strcmp(name, names[t])) {
            *out = (kvc_chat_template_t)t;
            return 0;
        }
    return KVC_ENOENT;
}

/* ---- detection ------------------------------------------------------------------------ */

typedef struct {
    const char *s;
    size_t n;
} text_t;

static bool has(text_t t, const char *needle)
{
    const size_t m = strlen(needle);
    if (m > t.n) return false;
    for (size_t i = 0; i + m <= t.n; i++)
        if (t.s[i] == needle[0] && !memcmp(t.s + i, needle, m)) return true;
    return false;
}

int kvc_chat_template_detect(const char *jinja, size_t len, kvc_chat_template_t *out)
{
    if (!out || (!jinja && len)) return KVC_EINVAL;
    const text_t t = {jinja, len};
    /* a template given by name (llama.cpp accepts the name in place of the Jinja too) */
    for (int k = 0; k < KVC_CHAT__COUNT; k++)
        if (strlen(names[k]) == len && !memcmp(jinja, names[k], len)) {
            *out = (kvc_chat_template_t)k;
            return 0;
        }
    kvc_chat_template_t r;
    if (has(t, "<|im_start|>")) {
        /* Phi-4 puts <|im_sep|> after the role; SmolVLM uses <|im_start|> as its BOS
         * around a different layout: neither is chatml. */
        if (has(t, "<|im_sep|>") || has(t, "<end_of_utterance>")) return KVC_ENOTSUP;
        r = KVC_CHAT_CHATML;
    } else if (has(t, "<|start_header_id|>") && has(t, "<|end_header_id|>")) {
        r = KVC_CHAT_LLAMA3;
    } else if (has(t, "<start_of_turn>")) {
        r = KVC_CHAT_GEMMA;
    } else if (has(t, "[INST]")) {
        /* Mistral's later templates differ in spaces and system placement (v7 has a
         * system block, v3 tools and no space before [/INST], v1 a space before [INST]):
         * rendering them as v0.2 would tokenize differently, so they are refused. */
        if (has(t, "[SYSTEM_PROMPT]") || has(t, "[AVAILABLE_TOOLS]") ||
            has(t, "' [INST] ' + system_message"))
            return KVC_ENOTSUP;
        r = has(t, "<<SYS>>") ? KVC_CHAT_LLAMA2 : KVC_CHAT_MISTRAL;
    } else if (has(t, "<|assistant|>") && has(t, "<|end|>")) {
        r = KVC_CHAT_PHI3;
    } else if (has(t, "<|user|>") && has(t, "<|assistant|>")) {
        /* ChatGLM and GLM-Edge share the role markers but close no turn; Falcon 3 writes
         * a literal </s>; Zephyr closes every turn with the EOS. */
        if (has(t, "[gMASK]") || has(t, "<|begin_of_image|>") || has(t, "</s>")) return KVC_ENOTSUP;
        if (!has(t, "eos_token") && !has(t, "<|endoftext|>")) return KVC_ENOTSUP;
        r = KVC_CHAT_ZEPHYR;
    } else {
        return KVC_ENOTSUP;
    }
    *out = r;
    return 0;
}

int kvc_chat_template_from_gguf(const kvc_gguf_t *g, kvc_chat_template_t *out)
{
    if (!g || !out) return KVC_EINVAL;
    kvc_gguf_str_t s;
    int rc = kvc_gguf_get_str(g, "tokenizer.chat_template", &s);
    if (rc == KVC_ENOENT) return KVC_ENOENT;
    if (rc) return KVC_EPARSE;
    if (s.len > SIZE_MAX) return KVC_ENOTSUP;
    return kvc_chat_template_detect(s.s, (size_t)s.len, out);
}

/* ---- rendering ------------------------------------------------------------------------ */

/* The output: bytes past the capacity are counted, never written (room for the NUL kept). */
typedef struct {
    char *out;
    size_t cap, n;
} sink_t;

static void put(sink_t *w, const char *s, size_t n)
{
    if (w->n < w->cap) {
        size_t room = w->cap - 1 - w->n; /* cap >= 1 here: one byte stays for the NUL */
        memcpy(w->out + w->n, s, n < room ? n : room);
    }
    w->n = n > SIZE_MAX - w->n ? SIZE_MAX : w->n + n; /* saturates: then ERANGE */
}

static void puts_(sink_t *w, const char *s)
{
    put(w, s, strlen(s));
}

/* Python's str.isspace() over UTF-8: the code points Jinja's trim and str.strip() remove.
 * Returns the sequence's length at s[0..n) if it is one, else 0. */
static size_t space_at(const unsigned char *s, size_t n)
{
    if (n == 0) return 0;
    const unsigned c = s[0];
    if (c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f)) return 1;
    if (c == 0xc2 && n >= 2 && (s[1] == 0x85 || s[1] == 0xa0)) return 2; /* U+0085, U+00A0 */
    if (n < 3) return 0;
    const unsigned cp = ((c & 0x0fu) << 12) | ((s[1] & 0x3fu) << 6) | (s[2] & 0x3fu);
    if ((c & 0xf0) != 0xe0 || (s[1] & 0xc0) != 0x80 || (s[2] & 0xc0) != 0x80) return 0;
    if (cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 ||
        cp == 0x202f || cp == 0x205f || cp == 0x3000)
        return 3;
    return 0;
}

/* s without leading and trailing whitespace (str.strip()). */
static text_t strip(const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t n = strlen(s), k;
    while ((k = space_at(p, n))) p += k, n -= k;
    /* trailing: scan forward, remembering where the last run of spaces began */
    size_t end = 0, i = 0;
    while (i < n) {
        if ((k = space_at(p + i, n - i))) {
            i += k;
        } else {
            i++;
            end = i;
        }
    }
    return (text_t){(const char *)p, end};
}

static void put_text(sink_t *w, text_t t)
{
    put(w, t.s, t.n);
}

typedef enum { R_SYSTEM, R_USER, R_ASSISTANT } role_t;

static int role_of(const char *r, role_t *out)
{
    if (!r) return KVC_EINVAL;
    if (!strcmp(r, "system"))
        *out = R_SYSTEM;
    else if (!strcmp(r, "user"))
        *out = R_USER;
    else if (!strcmp(r, "assistant"))
        *out = R_ASSISTANT;
    else
        return KVC_EINVAL;
    return 0;
}

/* A message's role, already validated by kvc_chat_render. */
static role_t role(const kvc_chat_msg_t *m)
{
    role_t r = R_USER;
    int rc = role_of(m->role, &r);
    KVC_ASSERT(rc == 0);
    return r;
}

/* meta-llama/Llama-2-7b-chat-hf:
 *   {% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}
 *   {% set system_message = messages[0]['content'] %}{% else %}... false{% endif %}
 *   {% for message in loop_messages %}...
 *   {% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\n' +
 *   system_message + '\n<</SYS>>\n\n' + message['content'] %}{% else %}{% set content =
 *   message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token +
 *   '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}
 *   {{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}
 * So the system block is stripped together with the first user message (only that
 * message's trailing space goes), and every later user turn starts with a BOS.
 * (llama.cpp's llama2-sys-strip renderer drops the spaces around the assistant's reply
 * and the inner BOS; this follows the Jinja.) */
static void render_llama2(sink_t *w, const kvc_chat_msg_t *m, size_t n)
{
    size_t i = 0;
    const char *sys = NULL;
    if (n && role(&m[0]) == R_SYSTEM) sys = m[i++].content;
    bool first = true;
    for (; i < n; i++) {
        if (role(&m[i]) == R_USER) {
            if (!first) puts_(w, "<s>");
            puts_(w, "[INST] ");
            if (sys && first) {
                /* '<<SYS>>\n' + sys + '\n<</SYS>>\n\n' + user, then strip(): the block
                 * starts with '<', so only the end is stripped, into the block if the
                 * user's text is all space */
                text_t u = strip(m[i].content);
                puts_(w, "<<SYS>>\n");
                if (u.n) {
                    puts_(w, sys);
                    puts_(w, "\n<</SYS>>\n\n");
                    /* the user's leading space stays: it is inside the string */
                    const char *c = m[i].content;
                    put(w, c, (size_t)(u.s + u.n - c));
                } else {
                    /* strip() eats '\n\n' after the block and nothing else */
                    puts_(w, sys);
                    puts_(w, "\n<</SYS>>");
                }
            } else {
                put_text(w, strip(m[i].content));
            }
            puts_(w, " [/INST]");
        } else { /* assistant */
            puts_(w, " ");
            put_text(w, strip(m[i].content));
            puts_(w, " </s>");
        }
        first = false;
    }
}

/* meta-llama/Meta-Llama-3-8B-Instruct:
 *   {% set loop_messages = messages %}{% for message in loop_messages %}{% set content =
 *   '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] |
 *   trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}
 *   {% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}
 *   {{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %} */
static void render_llama3(sink_t *w, const kvc_chat_msg_t *m, size_t n, bool gen)
{
    for (size_t i = 0; i < n; i++) {
        puts_(w, "<|start_header_id|>");
        puts_(w, m[i].role);
        puts_(w, "<|end_header_id|>\n\n");
        put_text(w, strip(m[i].content));
        puts_(w, "<|eot_id|>");
    }
    if (gen) puts_(w, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

/* ChatML (teknium/OpenHermes-2.5-Mistral-7B, Qwen, SmolLM):
 *   {% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' +
 *   message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}
 *   {{ '<|im_start|>assistant\n' }}{% endif %} */
static void render_chatml(sink_t *w, const kvc_chat_msg_t *m, size_t n, bool gen)
{
    for (size_t i = 0; i < n; i++) {
        puts_(w, "<|im_start|>");
        puts_(w, m[i].role);
        puts_(w, "\n");
        puts_(w, m[i].content);
        puts_(w, "<|im_end|>\n");
    }
    if (gen) puts_(w, "<|im_start|>assistant\n");
}

/* mistralai/Mistral-7B-Instruct-v0.1 / v0.2:
 *   {{ bos_token }}{% for message in messages %}...{% if message['role'] == 'user' %}
 *   {{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] ==
 *   'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only
 *   user and assistant roles are supported!') }}{% endif %}{% endfor %}
 * That Jinja has no system role; a system prompt joins the first user message with
 * '\n\n' as Mistral's own later revision of it does (system_message + '\n\n' +
 * message['content']).  llama.cpp joins with a single '\n'. */
static void render_mistral(sink_t *w, const kvc_chat_msg_t *m, size_t n)
{
    size_t i = 0;
    const char *sys = NULL;
    if (n && role(&m[0]) == R_SYSTEM) sys = m[i++].content;
    for (bool first = true; i < n; i++, first = false) {
        if (role(&m[i]) == R_USER) {
            puts_(w, "[INST] ");
            if (sys && first) {
                puts_(w, sys);
                puts_(w, "\n\n");
            }
            puts_(w, m[i].content);
            puts_(w, " [/INST]");
        } else {
            puts_(w, m[i].content);
            puts_(w, "</s>");
        }
    }
}

/* google/gemma-7b-it (gemma-2 the same after its leading bos_token):
 *   {% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not
 *   supported') }}{% endif %}{% for message in messages %}...{% if (message['role'] ==
 *   'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}
 *   {% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim +
 *   '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}
 *   {{'<start_of_turn>model\n'}}{% endif %}
 * A system prompt goes where gemma-3's template puts it: first_user_prefix =
 * messages[0]['content'] + '\n\n', written untrimmed before the first user turn's trimmed
 * content. */
static void render_gemma(sink_t *w, const kvc_chat_msg_t *m, size_t n, bool gen)
{
    size_t i = 0;
    const char *sys = NULL;
    if (n && role(&m[0]) == R_SYSTEM) sys = m[i++].content;
    for (bool first = true; i < n; i++, first = false) {
        puts_(w, role(&m[i]) == R_ASSISTANT ? "<start_of_turn>model\n" : "<start_of_turn>user\n");
        if (sys && first) {
            puts_(w, sys);
            puts_(w, "\n\n");
        }
        put_text(w, strip(m[i].content));
        puts_(w, "<end_of_turn>\n");
    }
    if (gen) puts_(w, "<start_of_turn>model\n");
}

/* microsoft/Phi-3-small-8k-instruct (Phi-3-mini's writes the same for these roles):
 *   {{ bos_token }}{% for message in messages %}{{'<|' + message['role'] + '|>' + '\n' +
 *   message['content'] + '<|end|>\n' }}{% endfor %}{% if add_generation_prompt %}
 *   {{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}
 * The trailing eos_token without a generation prompt (a finished training example) is
 * not written, as llama.cpp does not: a conversation rendered to be continued must not
 * end in EOS. */
static void render_phi3(sink_t *w, const kvc_chat_msg_t *m, size_t n, bool gen)
{
    for (size_t i = 0; i < n; i++) {
        puts_(w, "<|");
        puts_(w, m[i].role);
        puts_(w, "|>\n");
        puts_(w, m[i].content);
        puts_(w, "<|end|>\n");
    }
    if (gen) puts_(w, "<|assistant|>\n");
}

/* HuggingFaceH4/zephyr-7b-beta (eos_token "</s>"), rendered with trim_blocks, so each
 * {{ ... }} keeps the newline after it:
 *   {% for message in messages %}
 *   {% if message['role'] == 'user' %}
 *   {{ '<|user|>\n' + message['content'] + eos_token }}
 *   {% elif message['role'] == 'system' %}
 *   {{ '<|system|>\n' + message['content'] + eos_token }}
 *   {% elif message['role'] == 'assistant' %}
 *   {{ '<|assistant|>\n'  + message['content'] + eos_token }}
 *   {% endif %}
 *   {% if loop.last and add_generation_prompt %}
 *   {{ '<|assistant|>' }}
 *   {% endif %}
 *   {% endfor %}
 * llama.cpp's zephyr renderer closes turns with <|endoftext|> (StableLM-2-Zephyr's EOS). */
static void render_zephyr(sink_t *w, const kvc_chat_msg_t *m, size_t n, bool gen)
{
    for (size_t i = 0; i < n; i++) {
        puts_(w, "<|");
        puts_(w, m[i].role);
        puts_(w, "|>\n");
        puts_(w, m[i].content);
        puts_(w, "</s>\n");
    }
    if (gen) puts_(w, "<|assistant|>\n");
}

int kvc_chat_render(kvc_chat_template_t t, const kvc_chat_msg_t *msgs, size_t n,
                    bool add_generation_prompt, char *out, size_t cap, size_t *len)
{
    if ((unsigned)t >= KVC_CHAT__COUNT || !len || (!msgs && n) || (!out && cap)) return KVC_EINVAL;
    const bool folds_system = t == KVC_CHAT_LLAMA2 || t == KVC_CHAT_MISTRAL || t == KVC_CHAT_GEMMA;
    /* validate everything first: on EINVAL nothing is written */
    for (size_t i = 0; i < n; i++) {
        role_t r;
        if (role_of(msgs[i].role, &r) || !msgs[i].content) return KVC_EINVAL;
        if (folds_system && r == R_SYSTEM) {
            role_t next;
            if (i != 0 || n < 2 || role_of(msgs[1].role, &next) || next != R_USER)
                return KVC_EINVAL;
        }
    }
    sink_t w = {out, cap, 0};
    switch (t) {
    case KVC_CHAT_LLAMA2:
        render_llama2(&w, msgs, n);
        break;
    case KVC_CHAT_LLAMA3:
        render_llama3(&w, msgs, n, add_generation_prompt);
        break;
    case KVC_CHAT_CHATML:
        render_chatml(&w, msgs, n, add_generation_prompt);
        break;
    case KVC_CHAT_MISTRAL:
        render_mistral(&w, msgs, n);
        break;
    case KVC_CHAT_GEMMA:
        render_gemma(&w, msgs, n, add_generation_prompt);
        break;
    case KVC_CHAT_PHI3:
        render_phi3(&w, msgs, n, add_generation_prompt);
        break;
    default:
        render_zephyr(&w, msgs, n, add_generation_prompt);
        break;
    }
    *len = w.n;
    if (w.n >= cap) return KVC_ERANGE;
    out[w.n] = 0;
    return 0;
}
