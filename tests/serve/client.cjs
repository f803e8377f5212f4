// tests/serve/client.cjs — kl serve through the official `openai` npm client (pinned in
// package.json): models, chat whole and streamed (greedy text equal to `kl run`'s ids without
// the special ones), a tools conversation round trip (tools declared, an assistant tool call
// and the tool's reply rendered back), tool_choice naming a function (the call comes back,
// whole and streamed), legacy completions with logprobs, a seed's reply reproduced, and the
// client's error classes for a wrong key, an unknown model and an unknown tool_choice.
// Usage: node client.cjs BASE_URL KEY KL_BIN MODEL_DIR   (run by client.sh)
'use strict';
const { execFileSync } = require('node:child_process');
const OpenAI = require('openai').default;

const [base, key, kl, dir] = process.argv.slice(2);
const client = new OpenAI({ baseURL: base + '/v1', apiKey: key, maxRetries: 0 });
let failed = 0;

function check(ok, what) {
  if (!ok) {
    failed++;
    console.error('client: FAIL ' + what);
  }
}

function klJson(args) {
  return JSON.parse(execFileSync(kl, args).toString());
}

// `kl run` greedy ids as the server shows them: control and reserved ids (--skip-special) and
// the tool-call markers (tools are off) left out.
function runText(user, n) {
  const ids = klJson(['run', dir, '--chat', user, '-n', String(n), '--threads', '2', '--json',
    '-q']).generated_ids;
  const markers = klJson(['tokenize', dir, '--json', '--text', '<|tool_calls_section_begin|>'
    + '<|tool_calls_section_end|><|tool_call_begin|><|tool_call_argument_begin|>'
    + '<|tool_call_end|>']).inputs[0].ids;
  const keep = ids.filter((id) => !markers.includes(id));
  if (!keep.length) return '';
  return klJson(['detokenize', dir, '--ids', keep.join(','), '--skip-special', '--json']).text;
}

const user = 'tell me about the weather';

async function models() {
  const list = await client.models.list();
  const ids = [];
  for await (const m of list) ids.push(m.id);
  check(ids.length === 1 && ids[0] === 'tiny', 'models: ' + JSON.stringify(ids));
}

async function whole(want) {
  const r = await client.chat.completions.create({
    model: 'tiny', messages: [{ role: 'user', content: user }], max_tokens: 12, temperature: 0,
  });
  check(r.object === 'chat.completion', 'object ' + r.object);
  check(r.choices[0].message.content === want, 'whole: ' + JSON.stringify(r.choices[0].message)
    + ' wanted ' + JSON.stringify(want));
  check(r.choices[0].finish_reason === 'length', 'finish ' + r.choices[0].finish_reason);
  check(r.usage.completion_tokens === 12, 'usage ' + JSON.stringify(r.usage));
}

async function streamed(want) {
  const s = await client.chat.completions.create({
    model: 'tiny', messages: [{ role: 'user', content: user }], max_tokens: 12, temperature: 0,
    stream: true, stream_options: { include_usage: true },
  });
  let text = '', finish = null, usage = null;
  for await (const c of s) {
    if (c.usage) usage = c.usage;
    if (!c.choices.length) continue;
    if (c.choices[0].delta.content) text += c.choices[0].delta.content;
    if (c.choices[0].finish_reason) finish = c.choices[0].finish_reason;
  }
  check(text === want, 'stream: ' + JSON.stringify(text) + ' wanted ' + JSON.stringify(want));
  check(finish === 'length', 'stream finish ' + finish);
  check(usage && usage.completion_tokens === 12, 'stream usage ' + JSON.stringify(usage));
}

const tools = [{
  type: 'function',
  function: {
    name: 'get_weather', description: 'The weather in a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  },
}];

async function toolsRoundTrip() {
  const plain = await client.chat.completions.create({
    model: 'tiny', messages: [{ role: 'user', content: user }], max_tokens: 1, temperature: 0,
  });
  const r = await client.chat.completions.create({
    model: 'tiny', tools, tool_choice: 'auto', max_tokens: 4, temperature: 0,
    messages: [
      { role: 'system', content: 'You are helpful.' },
      { role: 'user', content: user },
      { role: 'assistant', content: null, tool_calls: [{ id: 'functions.get_weather:0',
        type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
      { role: 'tool', tool_call_id: 'functions.get_weather:0', content: 'sunny, 21 C' },
    ],
  });
  check(['stop', 'length', 'tool_calls'].includes(r.choices[0].finish_reason),
    'tools finish ' + r.choices[0].finish_reason);
  check(r.usage.prompt_tokens > plain.usage.prompt_tokens + 20,
    'tools prompt ' + r.usage.prompt_tokens + ' vs ' + plain.usage.prompt_tokens);
}

async function namedTool() {
  const ask = { model: 'tiny', tools, max_tokens: 8, temperature: 0,
    tool_choice: { type: 'function', function: { name: 'get_weather' } },
    messages: [{ role: 'user', content: user }] };
  const r = await client.chat.completions.create(ask);
  const calls = r.choices[0].message.tool_calls || [];
  check(calls.length === 1 && calls[0].id === 'functions.get_weather:0'
    && calls[0].function.name === 'get_weather' && r.choices[0].finish_reason === 'tool_calls',
    'named tool: ' + JSON.stringify(r.choices[0]));
  const s = await client.chat.completions.create({ ...ask, stream: true });
  let id = null, name = null, args = '';
  for await (const c of s) {
    for (const tc of (c.choices[0] && c.choices[0].delta.tool_calls) || []) {
      if (tc.id) { id = tc.id; name = tc.function.name; }
      args += tc.function.arguments || '';
    }
  }
  check(id === calls[0].id && name === 'get_weather'
    && args === calls[0].function.arguments, 'named tool streamed: ' + id + ' ' + args);
}

async function completionLogprobs() {
  const r = await client.completions.create({ model: 'tiny', prompt: 'Once upon a time',
    max_tokens: 5, temperature: 0, logprobs: 2 });
  const lp = r.choices[0].logprobs;
  check(lp && lp.tokens.length === 5 && lp.token_logprobs.length === 5
    && lp.top_logprobs.length === 5 && lp.text_offset[0] === 0
    && lp.tokens.every((t, i) => lp.top_logprobs[i][t] === lp.token_logprobs[i]),
  'completion logprobs: ' + JSON.stringify(lp));
}

async function seeded() {
  const ask = { model: 'tiny', messages: [{ role: 'user', content: user }], max_tokens: 10,
    temperature: 1.2, top_p: 0.9, seed: 1234 };
  const a = await client.chat.completions.create(ask);
  const b = await client.chat.completions.create(ask);
  check(a.choices[0].message.content === b.choices[0].message.content,
    'seed: ' + JSON.stringify([a.choices[0].message.content, b.choices[0].message.content]));
}

async function errors() {
  const bad = new OpenAI({ baseURL: base + '/v1', apiKey: 'wrong', maxRetries: 0 });
  try {
    await bad.models.list();
    check(false, 'a wrong key was accepted');
  } catch (e) {
    check(e instanceof OpenAI.AuthenticationError && e.status === 401, 'wrong key: ' + e);
  }
  try {
    await client.chat.completions.create({ model: 'nope', messages: [{ role: 'user',
      content: 'x' }] });
    check(false, 'an unknown model was accepted');
  } catch (e) {
    check(e instanceof OpenAI.NotFoundError && e.status === 404 && e.code === 'model_not_found',
      'unknown model: ' + e);
  }
  try {
    await client.chat.completions.create({ model: 'tiny', messages: [] });
    check(false, 'empty messages were accepted');
  } catch (e) {
    check(e instanceof OpenAI.BadRequestError && e.param === 'messages', 'empty messages: ' + e);
  }
  try {
    await client.chat.completions.create({ model: 'tiny', tools, messages: [{ role: 'user',
      content: 'x' }], tool_choice: { type: 'function', function: { name: 'nope' } } });
    check(false, 'an unknown tool_choice was accepted');
  } catch (e) {
    check(e instanceof OpenAI.BadRequestError && e.param === 'tool_choice', 'tool_choice: ' + e);
  }
}

(async () => {
  const want = runText(user, 12);
  await models();
  await whole(want);
  await streamed(want);
  await toolsRoundTrip();
  await namedTool();
  await completionLogprobs();
  await seeded();
  await errors();
  console.error(failed ? `client: ${failed} failed` : 'client: all passed');
  process.exit(failed ? 1 : 0);
})().catch((e) => {
  console.error('client: ' + (e.stack || e));
  process.exit(1);
});
