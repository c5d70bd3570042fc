/* test_chat.c - chat templates: every layout's exact text for one conversation, with and
 * without the generation prompt; each layout recognised from real models' Jinja templates
 * and look-alikes refused; names; every argument and role refusal; the buffer-too-small
 * path; and a randomized test that rendering never writes past its buffer, always
 * reports the length it needs, and renders a conversation as a prefix of its
 * continuation (what lets the prefix cache reuse a chat's earlier turns). */
#include "test_helpers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvcache/chat.h"

/* llama.cpp's test conversation (tests/test-chat-template.cpp): system, then user and
 * assistant turns, one assistant reply padded with spaces to show which layouts trim. */
static const kvc_chat_msg_t conv[] = {
    {"system", "You are a helpful assistant"},
    {"user", "Hello"},
    {"assistant", "Hi there"},
    {"user", "Who are you"},
    {"assistant", "   I am an assistant   "},
    {"user", "Another question"},
};

typedef struct {
    kvc_chat_template_t t;
    const char *body; /* without the generation prompt */
    const char *gen;  /* what add_generation_prompt appends */
} expect_t;

static const expect_t expected[] = {
    /* meta-llama/Llama-2-7b-chat-hf's Jinja (quoted in chat.c) rendered by hand: contents
     * stripped, ' ' + reply + ' ' + eos, bos_token + '[INST] ' before every user turn but
     * the first (its BOS is the tokenizer's).  llama.cpp's expected_output_jinja for
     * bofenghuang/vigogne-2-70b-chat (the same layout with a single leading BOS) is this
     * text without the two inner "<s>". */
    {KVC_CHAT_LLAMA2,
     "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST] Hi there </s>"
     "<s>[INST] Who are you [/INST] I am an assistant </s><s>[INST] Another question [/INST]",
     ""},
    /* llama.cpp's expected output for "Llama-3" (bos_token "" there) */
    {KVC_CHAT_LLAMA3,
     "<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant<|eot_id|>"
     "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
     "<|start_header_id|>assistant<|end_header_id|>\n\nHi there<|eot_id|>"
     "<|start_header_id|>user<|end_header_id|>\n\nWho are you<|eot_id|>"
     "<|start_header_id|>assistant<|end_header_id|>\n\nI am an assistant<|eot_id|>"
     "<|start_header_id|>user<|end_header_id|>\n\nAnother question<|eot_id|>",
     "<|start_header_id|>assistant<|end_header_id|>\n\n"},
    /* llama.cpp's expected output for "teknium/OpenHermes-2.5-Mistral-7B" */
    {KVC_CHAT_CHATML,
     "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHello"
     "<|im_end|>\n<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>user\nWho are "
     "you<|im_end|>\n<|im_start|>assistant\n   I am an assistant   <|im_end|>\n"
     "<|im_start|>user\nAnother question<|im_end|>\n",
     "<|im_start|>assistant\n"},
    /* mistralai/Mistral-7B-Instruct-v0.2's Jinja; the system prompt joined with '\n\n' as
     * Mistral's later template does.  llama.cpp's expected output for that template joins
     * with one '\n' and is otherwise this text. */
    {KVC_CHAT_MISTRAL,
     "[INST] You are a helpful assistant\n\nHello [/INST]Hi there</s>[INST] Who are you "
     "[/INST]   I am an assistant   </s>[INST] Another question [/INST]",
     ""},
    /* llama.cpp's expected output for "google/gemma-7b-it" */
    {KVC_CHAT_GEMMA,
     "<start_of_turn>user\nYou are a helpful assistant\n\nHello<end_of_turn>\n"
     "<start_of_turn>model\nHi there<end_of_turn>\n<start_of_turn>user\nWho are you"
     "<end_of_turn>\n<start_of_turn>model\nI am an assistant<end_of_turn>\n"
     "<start_of_turn>user\nAnother question<end_of_turn>\n",
     "<start_of_turn>model\n"},
    /* llama.cpp's expected output for "Phi-3-small" */
    {KVC_CHAT_PHI3,
     "<|system|>\nYou are a helpful assistant<|end|>\n<|user|>\nHello<|end|>\n<|assistant|>\n"
     "Hi there<|end|>\n<|user|>\nWho are you<|end|>\n<|assistant|>\n   I am an assistant   "
     "<|end|>\n<|user|>\nAnother question<|end|>\n",
     "<|assistant|>\n"},
    /* HuggingFaceH4/zephyr-7b-beta's Jinja (quoted in chat.c) with eos_token "</s>";
     * llama.cpp's zephyr renderer gives this text with <|endoftext|> for </s>. */
    {KVC_CHAT_ZEPHYR,
     "<|system|>\nYou are a helpful assistant</s>\n<|user|>\nHello</s>\n<|assistant|>\n"
     "Hi there</s>\n<|user|>\nWho are you</s>\n<|assistant|>\n   I am an assistant   </s>\n"
     "<|user|>\nAnother question</s>\n",
     "<|assistant|>\n"},
};

static char *render(kvc_chat_template_t t, const kvc_chat_msg_t *m, size_t n, bool gen)
{
    size_t len = 0;
    int rc = kvc_chat_render(t, m, n, gen, NULL, 0, &len);
    assert_int_equal(rc, KVC_ERANGE);
    char *buf = malloc(len + 1);
    assert_non_null(buf);
    size_t len2 = 0;
    assert_int_equal(kvc_chat_render(t, m, n, gen, buf, len + 1, &len2), 0);
    assert_int_equal(len2, len);
    assert_int_equal(strlen(buf), len);
    return buf;
}

static void every_template_renders_the_conversation_exactly(void **state)
{
    (void)state;
    assert_int_equal(KVC_ARRAY_LEN(expected), KVC_CHAT__COUNT);
    for (size_t i = 0; i < KVC_ARRAY_LEN(expected); i++) {
        const expect_t *e = &expected[i];
        char want[2048];
        snprintf(want, sizeof want, "%s%s", e->body, e->gen);
        char *with = render(e->t, conv, KVC_ARRAY_LEN(conv), true);
        char *without = render(e->t, conv, KVC_ARRAY_LEN(conv), false);
        if (strcmp(with, want))
            fail_msg("%s with the generation prompt:\n%s\nwant:\n%s", kvc_chat_template_name(e->t),
                     with, want);
        if (strcmp(without, e->body))
            fail_msg("%s without the generation prompt:\n%s\nwant:\n%s",
                     kvc_chat_template_name(e->t), without, e->body);
        free(with);
        free(without);
    }
}

/* The system-prompt handling of each layout on small cases the big one does not reach. */
static void system_prompts_go_where_each_template_puts_them(void **state)
{
    (void)state;
    const kvc_chat_msg_t su[] = {{"system", " S "}, {"user", "  u  "}};
    const kvc_chat_msg_t sblank[] = {{"system", "S"}, {"user", " \t\n"}};
    const kvc_chat_msg_t u[] = {{"user", "  u  "}};
    const struct {
        kvc_chat_template_t t;
        const kvc_chat_msg_t *m;
        size_t n;
        const char *want;
    } cases[] = {
        /* llama2: '<<SYS>>\n' + system + '\n<</SYS>>\n\n' + user, the whole .strip()ped:
         * the system keeps its spaces, the user its leading ones */
        {KVC_CHAT_LLAMA2, su, 2, "[INST] <<SYS>>\n S \n<</SYS>>\n\n  u [/INST]"},
        /* an all-space user message: strip() eats the '\n\n' after the block too */
        {KVC_CHAT_LLAMA2, sblank, 2, "[INST] <<SYS>>\nS\n<</SYS>> [/INST]"},
        {KVC_CHAT_LLAMA2, u, 1, "[INST] u [/INST]"},
        {KVC_CHAT_MISTRAL, su, 2, "[INST]  S \n\n  u   [/INST]"},
        {KVC_CHAT_MISTRAL, u, 1, "[INST]   u   [/INST]"},
        /* gemma-3's first_user_prefix: the system untrimmed, the user trimmed */
        {KVC_CHAT_GEMMA, su, 2, "<start_of_turn>user\n S \n\nu<end_of_turn>\n"},
        {KVC_CHAT_LLAMA3, su, 2,
         "<|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|><|start_header_id|>user"
         "<|end_header_id|>\n\nu<|eot_id|>"},
        {KVC_CHAT_CHATML, su, 2,
         "<|im_start|>system\n S <|im_end|>\n<|im_start|>user\n  u  "
         "<|im_end|>\n"},
        {KVC_CHAT_PHI3, su, 2, "<|system|>\n S <|end|>\n<|user|>\n  u  <|end|>\n"},
        {KVC_CHAT_ZEPHYR, su, 2, "<|system|>\n S </s>\n<|user|>\n  u  </s>\n"},
    };
    for (size_t i = 0; i < KVC_ARRAY_LEN(cases); i++) {
        char *got = render(cases[i].t, cases[i].m, cases[i].n, false);
        if (strcmp(got, cases[i].want))
            fail_msg("case %zu (%s): got '%s' want '%s'", i, kvc_chat_template_name(cases[i].t),
                     got, cases[i].want);
        free(got);
    }
    /* Jinja's trim is Python's str.strip(): Unicode spaces go too (U+00A0, U+3000) */
    const kvc_chat_msg_t uni[] = {{"user", "\xc2\xa0\xe3\x80\x80x y\xe2\x80\x83\n"}};
    char *got = render(KVC_CHAT_GEMMA, uni, 1, false);
    assert_string_equal(got, "<start_of_turn>user\nx y<end_of_turn>\n");
    free(got);
    /* every code point Python's str.isspace() accepts, one at a time, is stripped at
     * either end; zero-width and BOM characters, which it does not accept, are kept */
    static const unsigned spaces[] = {
        0x09,   0x0a,   0x0b,   0x0c,   0x0d,   0x1c,   0x1d,   0x1e,   0x1f,   0x20,
        0x85,   0xa0,   0x1680, 0x2000, 0x2001, 0x2002, 0x2003, 0x2004, 0x2005, 0x2006,
        0x2007, 0x2008, 0x2009, 0x200a, 0x2028, 0x2029, 0x202f, 0x205f, 0x3000};
    static const unsigned kept[] = {0x200b, 0x180e, 0xfeff, 0x2060, 0x1f, 0x21};
    for (size_t i = 0; i < KVC_ARRAY_LEN(spaces) + KVC_ARRAY_LEN(kept); i++) {
        const bool is_space = i < KVC_ARRAY_LEN(spaces);
        const unsigned cp = is_space ? spaces[i] : kept[i - KVC_ARRAY_LEN(spaces)];
        if (!is_space && cp == 0x1f) continue; /* (a space: the list's sentinel) */
        char u8[5] = {0};
        if (cp < 0x80) {
            u8[0] = (char)cp;
        } else if (cp < 0x800) {
            u8[0] = (char)(0xc0 | cp >> 6), u8[1] = (char)(0x80 | (cp & 0x3f));
        } else {
            u8[0] = (char)(0xe0 | cp >> 12), u8[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
            u8[2] = (char)(0x80 | (cp & 0x3f));
        }
        char content[32], want[96];
        snprintf(content, sizeof content, "%sx%s", u8, u8);
        const kvc_chat_msg_t one[] = {{"user", content}};
        if (is_space)
            snprintf(want, sizeof want, "<start_of_turn>user\nx<end_of_turn>\n");
        else
            snprintf(want, sizeof want, "<start_of_turn>user\n%s<end_of_turn>\n", content);
        char *g = render(KVC_CHAT_GEMMA, one, 1, false);
        if (strcmp(g, want)) fail_msg("U+%04X: got '%s'", cp, g);
        free(g);
    }
    /* an empty conversation is the generation prompt alone */
    got = render(KVC_CHAT_CHATML, NULL, 0, true);
    assert_string_equal(got, "<|im_start|>assistant\n");
    free(got);
    got = render(KVC_CHAT_LLAMA2, NULL, 0, true);
    assert_string_equal(got, "");
    free(got);
}

static void bad_roles_and_arguments_are_refused(void **state)
{
    (void)state;
    char buf[256];
    size_t len = 12345;
    const kvc_chat_msg_t tool[] = {{"user", "a"}, {"tool", "b"}};
    const kvc_chat_msg_t caps[] = {{"User", "a"}};
    const kvc_chat_msg_t null_role[] = {{NULL, "a"}};
    const kvc_chat_msg_t null_content[] = {{"user", NULL}};
    const kvc_chat_msg_t late_system[] = {{"user", "a"}, {"system", "s"}};
    const kvc_chat_msg_t lone_system[] = {{"system", "s"}};
    const kvc_chat_msg_t system_then_assistant[] = {{"system", "s"}, {"assistant", "a"}};
    for (int t = 0; t < KVC_CHAT__COUNT; t++) {
        assert_int_equal(kvc_chat_render(t, tool, 2, true, buf, sizeof buf, &len), KVC_EINVAL);
        assert_int_equal(kvc_chat_render(t, caps, 1, true, buf, sizeof buf, &len), KVC_EINVAL);
        assert_int_equal(kvc_chat_render(t, null_role, 1, true, buf, sizeof buf, &len), KVC_EINVAL);
        assert_int_equal(kvc_chat_render(t, null_content, 1, true, buf, sizeof buf, &len),
                         KVC_EINVAL);
        assert_int_equal(kvc_chat_render(t, NULL, 1, true, buf, sizeof buf, &len), KVC_EINVAL);
        assert_int_equal(kvc_chat_render(t, conv, 1, true, NULL, 4, &len), KVC_EINVAL);
        assert_int_equal(kvc_chat_render(t, conv, 1, true, buf, sizeof buf, NULL), KVC_EINVAL);
        /* a system message anywhere is fine where the layout has a system role */
        const bool folds = t == KVC_CHAT_LLAMA2 || t == KVC_CHAT_MISTRAL || t == KVC_CHAT_GEMMA;
        const int want = folds ? KVC_EINVAL : 0;
        assert_int_equal(kvc_chat_render(t, late_system, 2, true, buf, sizeof buf, &len), want);
        assert_int_equal(kvc_chat_render(t, lone_system, 1, true, buf, sizeof buf, &len), want);
        assert_int_equal(kvc_chat_render(t, system_then_assistant, 2, true, buf, sizeof buf, &len),
                         want);
    }
    len = 12345;
    assert_int_equal(kvc_chat_render(KVC_CHAT__COUNT, conv, 1, true, buf, sizeof buf, &len),
                     KVC_EINVAL);
    assert_int_equal(kvc_chat_render((kvc_chat_template_t)-1, conv, 1, true, buf, sizeof buf, &len),
                     KVC_EINVAL);
    assert_int_equal(len, 12345); /* untouched on EINVAL */
}

static void a_small_buffer_gets_erange_and_the_length_needed(void **state)
{
    (void)state;
    const size_t n = KVC_ARRAY_LEN(conv);
    for (int t = 0; t < KVC_CHAT__COUNT; t++) {
        char *full = render(t, conv, n, true);
        const size_t need = strlen(full);
        char buf[1024];
        for (size_t cap = 0; cap <= need + 1; cap++) {
            memset(buf, 'Z', sizeof buf);
            size_t len = 0;
            int rc = kvc_chat_render(t, conv, n, true, cap ? buf : NULL, cap, &len);
            assert_int_equal(len, need);
            if (cap <= need) {
                assert_int_equal(rc, KVC_ERANGE);
            } else {
                assert_int_equal(rc, 0);
                assert_memory_equal(buf, full, need + 1);
            }
            for (size_t k = cap; k < sizeof buf; k++)
                if (buf[k] != 'Z')
                    fail_msg("%s cap %zu: byte %zu written", kvc_chat_template_name(t), cap, k);
        }
        free(full);
    }
}

static void names_round_trip(void **state)
{
    (void)state;
    static const char *const want[] = {"llama2", "llama3", "chatml", "mistral",
                                       "gemma",  "phi3",   "zephyr"};
    for (int t = 0; t < KVC_CHAT__COUNT; t++) {
        assert_string_equal(kvc_chat_template_name(t), want[t]);
        kvc_chat_template_t p = KVC_CHAT__COUNT;
        assert_int_equal(kvc_chat_template_parse(want[t], &p), 0);
        assert_int_equal(p, t);
        /* the name alone is recognised as that template, as llama.cpp does */
        p = KVC_CHAT__COUNT;
        assert_int_equal(kvc_chat_template_detect(want[t], strlen(want[t]), &p), 0);
        assert_int_equal(p, t);
    }
    assert_string_equal(kvc_chat_template_name(KVC_CHAT__COUNT), "?");
    kvc_chat_template_t p = KVC_CHAT_GEMMA;
    assert_int_equal(kvc_chat_template_parse("llama-2", &p), KVC_ENOENT);
    assert_int_equal(kvc_chat_template_parse("ChatML", &p), KVC_ENOENT);
    assert_int_equal(kvc_chat_template_parse("", &p), KVC_ENOENT);
    assert_int_equal(kvc_chat_template_parse(NULL, &p), KVC_EINVAL);
    assert_int_equal(kvc_chat_template_parse("chatml", NULL), KVC_EINVAL);
    assert_int_equal(p, KVC_CHAT_GEMMA);
}

/* Real models' tokenizer.chat_template strings (as llama.cpp's tests/test-chat-template.cpp
 * and the models' tokenizer_config.json on Hugging Face hold them). */
static const struct {
    const char *model;
    const char *jinja;
    int want; /* a template, or -1: refused */
} jinjas[] = {
    {"teknium/OpenHermes-2.5-Mistral-7B",
     "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
     "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ "
     "'<|im_start|>assistant\\n' }}{% endif %}",
     KVC_CHAT_CHATML},
    {"Qwen/Qwen2-7B-Instruct",
     "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
     "'<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif "
     "%}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
     "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif "
     "%}",
     KVC_CHAT_CHATML},
    {"meta-llama/Meta-Llama-3-8B-Instruct",
     "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
     "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | "
     "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% "
     "endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
     "'<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}",
     KVC_CHAT_LLAMA3},
    {"google/gemma-7b-it",
     "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role "
     "not supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == "
     "'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must "
     "alternate user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == "
     "'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif "
     "%}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' "
     "}}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}",
     KVC_CHAT_GEMMA},
    {"meta-llama/Llama-2-7b-chat-hf",
     "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set "
     "system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% "
     "set system_message = false %}{% endif %}{% for message in loop_messages %}{% if "
     "(message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation "
     "roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 "
     "== 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + "
     "'\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] "
     "%}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + "
     "content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + "
     "content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}",
     KVC_CHAT_LLAMA2},
    {"mistralai/Mistral-7B-Instruct-v0.2",
     "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != "
     "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
     "user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ "
     "'[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ "
     "message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant "
     "roles are supported!') }}{% endif %}{% endfor %}",
     KVC_CHAT_MISTRAL},
    {"microsoft/Phi-3-mini-4k-instruct",
     "{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\\n' + "
     "message['content'] + '<|end|>\\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\\n' + "
     "message['content'] + '<|end|>\\n'}}{% elif message['role'] == 'assistant' "
     "%}{{'<|assistant|>\\n' + message['content'] + '<|end|>\\n'}}{% endif %}{% endfor %}{% if "
     "add_generation_prompt %}{{ '<|assistant|>\\n' }}{% else %}{{ eos_token }}{% endif %}",
     KVC_CHAT_PHI3},
    {"microsoft/Phi-3-small-8k-instruct",
     "{{ bos_token }}{% for message in messages %}{{'<|' + message['role'] + '|>' + '\\n' + "
     "message['content'] + '<|end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ "
     "'<|assistant|>\\n' }}{% else %}{{ eos_token }}{% endif %}",
     KVC_CHAT_PHI3},
    {"HuggingFaceH4/zephyr-7b-beta",
     "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + "
     "message['content'] + eos_token }}\n{% elif message['role'] == 'system' %}\n{{ "
     "'<|system|>\n' + message['content'] + eos_token }}\n{% elif message['role'] == "
     "'assistant' %}\n{{ '<|assistant|>\n'  + message['content'] + eos_token }}\n{% endif %}\n{% "
     "if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor "
     "%}",
     KVC_CHAT_ZEPHYR},
    /* look-alikes that render differently: refused, not guessed */
    {"mistralai/Mistral-Large-Instruct-2411 (v7)",
     "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] "
     "' + message['content'] + '[/INST]' }}{% elif message['role'] == 'system' %}{{ "
     "'[SYSTEM_PROMPT] ' + message['content'] + '[/SYSTEM_PROMPT]' }}{% elif message['role'] "
     "== 'assistant' %}{{ ' ' + message['content'] + eos_token }}{% else %}{{ "
     "raise_exception('Only user, system and assistant roles are supported!') }}{% endif %}{% "
     "endfor %}",
     -1},
    {"mistralai v1 with a system prompt",
     "{{- bos_token }}\n{%- for message in loop_messages %}\n    {%- if message['role'] == "
     "'user' %}\n        {%- if loop.first and system_message is defined %}\n            {{- ' "
     "[INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}\n        {%- "
     "else %}\n            {{- ' [INST] ' + message['content'] + ' [/INST]' }}\n",
     -1},
    {"phi-4",
     "{% for message in messages %}{% if (message['role'] == 'system') "
     "%}{{'<|im_start|>system<|im_sep|>' + message['content'] + '<|im_end|>'}}{% endif %}{% "
     "endfor %}",
     -1},
    {"CohereForAI/c4ai-command-r-plus",
     "{{ bos_token }}{% if system_message != false %}{{ "
     "'<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>' + system_message + '<|END_OF_TURN_TOKEN|>' }}{% "
     "endif %}{% for message in loop_messages %}{% if message['role'] == 'user' %}{{ "
     "'<|START_OF_TURN_TOKEN|><|USER_TOKEN|>' + content.strip() + '<|END_OF_TURN_TOKEN|>' }}",
     -1},
    {"THUDM/glm-4-9b-chat",
     "[gMASK]<sop>{% for item in messages %}{% if item['content'] %}<|{{ item['role'] }}|>{{ "
     "item['metadata'] }}\n{{ item['content'] }}{% endif %}{% endfor %}{% if "
     "add_generation_prompt %}<|assistant|>\n{% endif %}",
     -1},
    {"GLMEdge",
     "{% for item in messages %}{% if item['role'] == 'system' %}<|system|>\n{{ item['content'] "
     "}}{% elif item['role'] == 'user' %}<|user|>\n{{ item['content'] }}{% elif item['role'] == "
     "'assistant' %}<|assistant|>\n{{ item['content'] }}{% endif %}{% endfor %}<|assistant|>",
     -1},
    {"eachadea/vicuna-13b-1.1",
     "{%- for message in messages %}{%- if message['role'] == 'user' -%}{{-'USER: ' + "
     "message['content'] + '\\n'-}}{%- else -%}{{-'ASSISTANT: ' + message['content'] + "
     "'</s>\\n' -}}{%- endif -%}{%- endfor -%}",
     -1},
    {"an invalid template", "INVALID TEMPLATE", -1},
    {"empty", "", -1},
    {"a name with a suffix", "chatml ", -1},
};

static void real_templates_are_recognised_and_look_alikes_refused(void **state)
{
    (void)state;
    for (size_t i = 0; i < KVC_ARRAY_LEN(jinjas); i++) {
        kvc_chat_template_t t = KVC_CHAT__COUNT;
        int rc = kvc_chat_template_detect(jinjas[i].jinja, strlen(jinjas[i].jinja), &t);
        if (jinjas[i].want < 0) {
            if (rc != KVC_ENOTSUP)
                fail_msg("%s: want KVC_ENOTSUP, got %s (%s)", jinjas[i].model, kvc_errname(rc),
                         rc ? "" : kvc_chat_template_name(t));
            assert_int_equal(t, KVC_CHAT__COUNT);
        } else if (rc || (int)t != jinjas[i].want) {
            fail_msg("%s: want %s, got %s / %s", jinjas[i].model,
                     kvc_chat_template_name(jinjas[i].want), kvc_errname(rc),
                     kvc_chat_template_name(t));
        }
        /* the length bounds the search: a marker past len is not seen */
        if (jinjas[i].want >= 0) {
            assert_int_equal(kvc_chat_template_detect(jinjas[i].jinja, 10, &t), KVC_ENOTSUP);
        }
    }
    kvc_chat_template_t t;
    assert_int_equal(kvc_chat_template_detect(NULL, 0, &t), KVC_ENOTSUP);
    assert_int_equal(kvc_chat_template_detect(NULL, 1, &t), KVC_EINVAL);
    assert_int_equal(kvc_chat_template_detect("chatml", 6, NULL), KVC_EINVAL);
}

/* A GGUF with (or without) a chat template, written by the project's writer. */
static kvc_gguf_t *gguf_with(const char *tmpl, bool as_int)
{
    kvc_gguf_writer_t *w;
    assert_int_equal(kvc_gguf_writer_create(NULL, &w), 0);
    assert_int_equal(kvc_gguf_writer_set_str(w, "general.architecture", "llama", 5), 0);
    if (tmpl)
        assert_int_equal(kvc_gguf_writer_set_str(w, "tokenizer.chat_template", tmpl, strlen(tmpl)),
                         0);
    if (as_int) assert_int_equal(kvc_gguf_writer_set_u32(w, "tokenizer.chat_template", 7), 0);
    char path[] = "/tmp/kvc_test_chat_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    char err[256];
    assert_int_equal(kvc_gguf_writer_write(w, path, NULL, NULL, err, sizeof err), 0);
    kvc_gguf_writer_destroy(w);
    kvc_gguf_t *g;
    assert_int_equal(kvc_gguf_open(path, NULL, &g, err, sizeof err), 0);
    unlink(path);
    return g;
}

static void the_template_is_read_from_a_gguf(void **state)
{
    (void)state;
    kvc_chat_template_t t = KVC_CHAT__COUNT;
    kvc_gguf_t *g = gguf_with(jinjas[2].jinja, false); /* Llama 3 */
    assert_int_equal(kvc_chat_template_from_gguf(g, &t), 0);
    assert_int_equal(t, KVC_CHAT_LLAMA3);
    kvc_gguf_close(g);
    g = gguf_with("INVALID TEMPLATE", false);
    assert_int_equal(kvc_chat_template_from_gguf(g, &t), KVC_ENOTSUP);
    kvc_gguf_close(g);
    g = gguf_with(NULL, false);
    assert_int_equal(kvc_chat_template_from_gguf(g, &t), KVC_ENOENT);
    assert_int_equal(kvc_chat_template_from_gguf(NULL, &t), KVC_EINVAL);
    assert_int_equal(kvc_chat_template_from_gguf(g, NULL), KVC_EINVAL);
    kvc_gguf_close(g);
    g = gguf_with(NULL, true);
    assert_int_equal(kvc_chat_template_from_gguf(g, &t), KVC_EPARSE);
    kvc_gguf_close(g);
    assert_int_equal(t, KVC_CHAT_LLAMA3);
    /* stories260K, a base model, has none */
    char path[1024];
    const char *d = getenv("KVC_DATA_DIR");
    snprintf(path, sizeof path, "%s/models/stories260K.gguf", d && *d ? d : KVC_DATA_DIR);
    char err[256];
    assert_int_equal(kvc_gguf_open(path, NULL, &g, err, sizeof err), 0);
    assert_int_equal(kvc_chat_template_from_gguf(g, &t), KVC_ENOENT);
    kvc_gguf_close(g);
}

/* Random conversations: the rendered text fits exactly the length reported, a buffer of
 * any smaller size gets KVC_ERANGE with nothing written past it, and the text of the first
 * k messages is a prefix of the text of all n. */
static void random_rendering_never_overflows_and_extends_by_prefix(void **state)
{
    (void)state;
    static const char *const pieces[] = {
        "a",        " ",        "  ",           "\n",           "\t",
        "hello",    "\xc2\xa0", "\xe3\x80\x80", "\xe2\x80\x83", "<s>",
        "</s>",     "[INST]",   "<|im_end|>",   "\xe2\x96\x81", "\xff",
        "\xe3\x80", "\r\n",
    };
    static const char *const roles[] = {"system", "user", "assistant"};
    kvc_rng_t rng;
    kvc_rng_seed(&rng, 12);
    const int rounds = KVC_TEST_SANITIZED ? 300 : 2000;
    enum { MAXM = 12, MAXC = 64 };
    char contents[MAXM][MAXC * 4];
    kvc_chat_msg_t m[MAXM];
    char *buf = malloc(1 << 16), *pre = malloc(1 << 16);
    assert_non_null(buf);
    assert_non_null(pre);
    for (int r = 0; r < rounds; r++) {
        const kvc_chat_template_t t = (kvc_chat_template_t)kvc_rng_below(&rng, KVC_CHAT__COUNT);
        const bool folds = t == KVC_CHAT_LLAMA2 || t == KVC_CHAT_MISTRAL || t == KVC_CHAT_GEMMA;
        const size_t n = 1 + kvc_rng_below(&rng, MAXM);
        for (size_t i = 0; i < n; i++) {
            size_t len = 0, k = kvc_rng_below(&rng, 8);
            contents[i][0] = 0;
            for (size_t j = 0; j < k; j++) {
                const char *p = pieces[kvc_rng_below(&rng, KVC_ARRAY_LEN(pieces))];
                memcpy(contents[i] + len, p, strlen(p) + 1);
                len += strlen(p);
            }
            size_t ri = kvc_rng_below(&rng, 3);
            if (folds && ri == 0 && i != 0) ri = 1 + kvc_rng_below(&rng, 2);
            m[i] = (kvc_chat_msg_t){roles[ri], contents[i]};
        }
        if (folds && n >= 1 && !strcmp(m[0].role, "system")) {
            if (n == 1)
                m[0].role = "user";
            else
                m[1].role = "user";
        }
        const bool gen = kvc_rng_below(&rng, 2);
        size_t need = 0;
        assert_int_equal(kvc_chat_render(t, m, n, gen, buf, 1 << 16, &need), 0);
        assert_true(need < (1 << 16));
        assert_int_equal(strlen(buf), need);
        /* a random smaller buffer, guarded */
        const size_t cap = kvc_rng_below(&rng, need + 1);
        char *small = malloc(cap + 16);
        assert_non_null(small);
        memset(small, 'Z', cap + 16);
        size_t len = 0;
        assert_int_equal(kvc_chat_render(t, m, n, gen, cap ? small : NULL, cap, &len), KVC_ERANGE);
        assert_int_equal(len, need);
        for (size_t k = cap; k < cap + 16; k++) assert_int_equal(small[k], 'Z');
        if (cap) assert_memory_equal(small, buf, cap - 1); /* what fits is the text's start */
        free(small);
        /* prefix: the first k messages (where k keeps the conversation valid) */
        size_t k = kvc_rng_below(&rng, n + 1);
        if (folds && k == 1 && !strcmp(m[0].role, "system")) k = 0;
        size_t plen = 0;
        assert_int_equal(kvc_chat_render(t, m, k, false, pre, 1 << 16, &plen), 0);
        assert_true(plen <= need);
        if (memcmp(pre, buf, plen))
            fail_msg("%s: %zu messages do not render as a prefix of %zu", kvc_chat_template_name(t),
                     k, n);
    }
    free(buf);
    free(pre);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_template_renders_the_conversation_exactly),
        cmocka_unit_test(system_prompts_go_where_each_template_puts_them),
        cmocka_unit_test(bad_roles_and_arguments_are_refused),
        cmocka_unit_test(a_small_buffer_gets_erange_and_the_length_needed),
        cmocka_unit_test(names_round_trip),
        cmocka_unit_test(real_templates_are_recognised_and_look_alikes_refused),
        cmocka_unit_test(the_template_is_read_from_a_gguf),
        cmocka_unit_test(random_rendering_never_overflows_and_extends_by_prefix),
    };
    if (getenv("KVC_TEST_FILTER")) cmocka_set_test_filter(getenv("KVC_TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
