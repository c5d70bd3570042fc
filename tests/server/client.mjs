// The official openai npm client against `kvcache serve` (run by tests/cli/serve.sh, which
// starts the server with the tenants alice, bob and team, and installs the package).
// usage: node client.mjs BASE_URL   (e.g. http://127.0.0.1:PORT/v1)
import OpenAI from 'openai';
import assert from 'node:assert/strict';

const baseURL = process.argv[2];
const alice = new OpenAI({ baseURL, apiKey: 'sk-alice', maxRetries: 0, timeout: 60000 });
const bob = new OpenAI({ baseURL, apiKey: 'sk-bob', maxRetries: 0, timeout: 60000 });
const model = 'stories260K';

// models
const models = await alice.models.list();
assert.equal(models.data[0].id, model);

// completions, not streamed: greedy, logprobs, stop strings, n > 1
const c = await alice.completions.create({ model, prompt: 'Once upon a time', max_tokens: 30, temperature: 0, logprobs: 2 });
assert.equal(c.object, 'text_completion');
assert.equal(c.choices[0].finish_reason, 'length');
assert.equal(c.usage.completion_tokens, 30);
assert.equal(c.choices[0].logprobs.token_logprobs.length, 30);
assert.equal(c.choices[0].logprobs.tokens.join(''), c.choices[0].text);
assert.equal(Object.keys(c.choices[0].logprobs.top_logprobs[0]).length, 2);
const stopped = await alice.completions.create({ model, prompt: 'Once upon a time', max_tokens: 30, temperature: 0, stop: ['girl'] });
assert.equal(stopped.choices[0].finish_reason, 'stop');
assert.ok(c.choices[0].text.startsWith(stopped.choices[0].text + 'girl'));
assert.ok(!stopped.choices[0].text.includes('girl'));
const many = await alice.completions.create({ model, prompt: 'The dog', max_tokens: 12, temperature: 1, seed: 3, n: 3 });
assert.equal(many.choices.length, 3);
assert.deepEqual(many.choices.map((x) => x.index), [0, 1, 2]);
assert.equal(many.usage.completion_tokens, many.choices.length * 12);

// completions, streamed: the same text as not streamed
const stream = await alice.completions.create({ model, prompt: 'Once upon a time', max_tokens: 30, temperature: 0, stream: true, stream_options: { include_usage: true } });
let text = '';
let usage = null;
for await (const ch of stream) {
  if (ch.choices.length) text += ch.choices[0].text;
  if (ch.usage) usage = ch.usage;
}
assert.equal(text, c.choices[0].text);
assert.equal(usage.completion_tokens, 30);
assert.ok(usage.kvcache_timings.total_ms > 0);

// chat, not streamed and streamed, n > 1
const messages = [
  { role: 'system', content: 'You tell short stories about a girl named Lily.' },
  { role: 'user', content: 'Tell me a story about a big red ball.' },
];
const chat = await alice.chat.completions.create({ model, messages, max_tokens: 24, temperature: 0, logprobs: true, top_logprobs: 2 });
assert.equal(chat.object, 'chat.completion');
assert.equal(chat.choices[0].message.role, 'assistant');
assert.equal(chat.choices[0].logprobs.content.length, 24);
assert.equal(chat.choices[0].logprobs.content[0].top_logprobs.length, 2);
const cs = await alice.chat.completions.create({ model, messages, max_tokens: 24, temperature: 0, stream: true, stream_options: { include_usage: true } });
let ctext = '';
let cusage = null;
for await (const ch of cs) {
  if (ch.choices.length) ctext += ch.choices[0].delta.content ?? '';
  if (ch.usage) cusage = ch.usage;
}
assert.equal(ctext, chat.choices[0].message.content);
assert.equal(cusage.completion_tokens, 24);
const chatN = await alice.chat.completions.create({ model, messages, max_tokens: 8, temperature: 0.9, n: 2, seed: 5 });
assert.equal(chatN.choices.length, 2);

// two turns: the second reports the first turn's prompt and reply (whole blocks) as cached
const turn2 = await alice.chat.completions.create({
  model, max_tokens: 8, temperature: 0,
  messages: [...messages, { role: 'assistant', content: chat.choices[0].message.content }, { role: 'user', content: 'What happened next?' }],
});
const p1 = chat.usage.prompt_tokens + chat.usage.completion_tokens;
assert.ok(turn2.usage.prompt_tokens_details.cached_tokens >= Math.floor(p1 / 16) * 16,
  `turn two cached ${turn2.usage.prompt_tokens_details.cached_tokens}; turn one held ${p1}`);

// the same prompt under another tenant (its own salt): nothing cached
const prompt = 'Lily had a little red kite. She flew it high in the sky every day after school.';
const a1 = await alice.completions.create({ model, prompt, max_tokens: 2 });
const a2 = await alice.completions.create({ model, prompt, max_tokens: 2 });
const b1 = await bob.completions.create({ model, prompt, max_tokens: 2 });
assert.equal(a1.usage.prompt_tokens_details.cached_tokens, 0);
assert.ok(a2.usage.prompt_tokens_details.cached_tokens >= 16);
assert.equal(b1.usage.prompt_tokens_details.cached_tokens, 0);

// errors come back as the client's typed errors
await assert.rejects(alice.completions.create({ model: 'nope', prompt: 'x' }), (e) => e.status === 404);
await assert.rejects(alice.completions.create({ model, prompt: 'x', max_tokens: 100000 }), (e) => e.status === 400 && e.param === 'max_tokens');
const anon = new OpenAI({ baseURL, apiKey: 'sk-nobody', maxRetries: 0 });
await assert.rejects(anon.completions.create({ model, prompt: 'x' }), (e) => e.status === 401);

console.log('openai client: all checks passed');
