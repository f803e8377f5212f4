// tests/serve/client.cjs — kl serve through the official `openai` npm client (pinned in
// package.json): models, chat whole and streamed (greedy text equal to `kl run`), a tools
// conversation round trip (tools declared, an assistant tool call and the tool's reply rendered
// back), and the client's error classes for a wrong key and an unknown model.
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

function runText(user, n) {
  const out = execFileSync(kl, ['run', dir, '--chat', user, '-n', String(n), '--threads', '2',
    '--json', '-q']);
  return JSON.parse(out.toString()).text;
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
}

(async () => {
  const want = runText(user, 12);
  await models();
  await whole(want);
  await streamed(want);
  await toolsRoundTrip();
  await errors();
  console.error(failed ? `client: ${failed} failed` : 'client: all passed');
  process.exit(failed ? 1 : 0);
})().catch((e) => {
  console.error('client: ' + (e.stack || e));
  process.exit(1);
});
