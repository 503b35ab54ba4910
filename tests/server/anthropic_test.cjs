// Anthropic's Messages API end to end: gale serve driven by the official @anthropic-ai/sdk,
// unchanged (create, stream, a tool use round trip streamed and not, count_tokens, stop
// sequences), with x-api-key auth, and malformed bodies answered in Anthropic's error shape.
const path = require('path');
const assert = require('assert');

const [gale, nodeModules, chatTemplate] = process.argv.slice(2);
const sdk = require(path.join(nodeModules, '@anthropic-ai/sdk'));
const Anthropic = sdk.default || sdk;
const harness = require('./harness.cjs');
const { check } = harness;
const startServer = (args) => harness.startServer(gale, ['-t', '2', '--no-warmup', '--chat-template', chatTemplate, ...args]);

const tools = [{
  name: 'get_weather', description: 'The weather in a city',
  input_schema: { type: 'object', properties: { city: { type: 'string', enum: ['Lima', 'Oslo'] }, days: { type: 'integer', minimum: 1, maximum: 3 } },
                  required: ['city', 'days'] },
}];

(async () => {
  const s = await startServer(['--api-key', 'sekret']);
  const client = new Anthropic({ baseURL: `http://127.0.0.1:${s.port}`, apiKey: 'sekret', maxRetries: 0 });
  const ask = { model: 'claude-sonnet-4-5', max_tokens: 24, temperature: 0, system: 'Tell a story.', messages: [{ role: 'user', content: 'Once upon a time' }] };
  try {
    await check('create: a Message with a text block, its stop reason and usage (any model name is served)', async () => {
      const m = await client.messages.create(ask);
      assert.strictEqual(m.type, 'message');
      assert.strictEqual(m.role, 'assistant');
      assert.ok(m.id.startsWith('msg_'));
      assert.strictEqual(m.model, 'stories260K');
      assert.strictEqual(m.content.length, 1);
      assert.strictEqual(m.content[0].type, 'text');
      assert.ok(m.content[0].text.length > 0);
      assert.ok(['end_turn', 'max_tokens'].includes(m.stop_reason), m.stop_reason);
      assert.ok(m.usage.input_tokens > 0 && m.usage.output_tokens > 0 && m.usage.output_tokens <= 24, JSON.stringify(m.usage));
    });
    await check('stream: the SDK\'s stream helper gets the same text and the same final message, in Anthropic\'s event order', async () => {
      const whole = await client.messages.create(ask);
      const stream = client.messages.stream(ask);
      const pieces = [];
      const kinds = [];
      stream.on('text', (t) => pieces.push(t));
      stream.on('streamEvent', (e) => kinds.push(e.type));
      const final = await stream.finalMessage();
      assert.strictEqual(pieces.join(''), whole.content[0].text);
      // (How many pieces depends on how fast the tiny model runs ahead of the reader: updates the
      // reader has not taken yet are merged.)
      assert.strictEqual(final.content[0].text, whole.content[0].text);
      assert.strictEqual(final.stop_reason, whole.stop_reason);
      assert.strictEqual(final.usage.output_tokens, whole.usage.output_tokens);
      assert.deepStrictEqual([kinds[0], kinds[1], kinds[2]], ['message_start', 'content_block_start', 'content_block_delta']);
      assert.deepStrictEqual(kinds.slice(-3), ['content_block_stop', 'message_delta', 'message_stop']);
    });
    await check('stop_sequences: the text ends before the sequence, stop_reason stop_sequence naming it', async () => {
      const whole = await client.messages.create({ ...ask, max_tokens: 40 });
      const text = whole.content[0].text;
      const at = text.indexOf(' ', 8);
      assert.ok(at > 0, text);
      const stop = text.slice(at, at + 4);
      const cut = await client.messages.create({ ...ask, max_tokens: 40, stop_sequences: ['never here', stop] });
      assert.strictEqual(cut.stop_reason, 'stop_sequence');
      assert.strictEqual(cut.stop_sequence, stop);
      assert.strictEqual(cut.content[0].text, text.slice(0, text.indexOf(stop)));
    });
    await check('tool use round trip: a forced call comes back as tool_use (streamed and not), its tool_result answered', async () => {
      const req = { ...ask, max_tokens: 120, tools, tool_choice: { type: 'tool', name: 'get_weather' },
                    messages: [{ role: 'user', content: 'Weather in Lima?' }] };
      const m = await client.messages.create(req);
      assert.strictEqual(m.stop_reason, 'tool_use', JSON.stringify(m));
      const use = m.content.find((b) => b.type === 'tool_use');
      assert.ok(use && use.name === 'get_weather' && use.id.startsWith('toolu_'), JSON.stringify(m.content));
      assert.ok(['Lima', 'Oslo'].includes(use.input.city) && use.input.days >= 1 && use.input.days <= 3, JSON.stringify(use.input));
      assert.ok(!m.content.some((b) => b.type === 'text'), 'no markup as text');
      const stream = client.messages.stream(req);
      let json = '';
      stream.on('inputJson', (delta) => { json += delta; });
      const final = await stream.finalMessage();
      const streamed = final.content.find((b) => b.type === 'tool_use');
      assert.deepStrictEqual(streamed.input, use.input);
      assert.deepStrictEqual(JSON.parse(json), use.input);
      assert.strictEqual(final.stop_reason, 'tool_use');
      const after = await client.messages.create({ ...ask, tools, messages: [
        { role: 'user', content: 'Weather in Lima?' }, { role: 'assistant', content: m.content },
        { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: 'Sunny, 24 C' }] }] });
      assert.strictEqual(after.content[0].type, 'text');
    });
    await check('count_tokens: the prompt\'s tokens, as a create with the same messages counts them', async () => {
      const counted = await client.messages.countTokens({ model: 'x', system: ask.system, messages: ask.messages });
      const m = await client.messages.create({ ...ask, max_tokens: 1 });
      assert.strictEqual(counted.input_tokens, m.usage.input_tokens + m.usage.cache_read_input_tokens);
    });
    await check('errors in Anthropic\'s shape: a missing max_tokens, an image, a malformed body, a wrong key', async () => {
      await assert.rejects(client.messages.create({ model: 'x', messages: [{ role: 'user', content: 'x' }] }), (e) => {
        assert.ok(e instanceof sdk.BadRequestError, e);
        assert.strictEqual(e.error.type, 'error');
        assert.strictEqual(e.error.error.type, 'invalid_request_error');
        assert.match(e.error.error.message, /max_tokens/);
        return true;
      });
      await assert.rejects(client.messages.create({ ...ask, messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'AA==' } }] }] }),
                           (e) => e instanceof sdk.BadRequestError && /image/.test(e.error.error.message));
      const raw = await fetch(`http://127.0.0.1:${s.port}/v1/messages`, { method: 'POST', headers: { 'x-api-key': 'sekret', 'content-type': 'application/json' }, body: '{"max_tokens": 5, "messages": [' });
      assert.strictEqual(raw.status, 400);
      const body = await raw.json();
      assert.strictEqual(body.type, 'error');
      assert.strictEqual(body.error.type, 'invalid_request_error');
      const wrong = new Anthropic({ baseURL: `http://127.0.0.1:${s.port}`, apiKey: 'nope', maxRetries: 0 });
      await assert.rejects(wrong.messages.create(ask), (e) => e instanceof sdk.AuthenticationError && e.error.error.type === 'authentication_error');
      const missing = await fetch(`http://127.0.0.1:${s.port}/v1/messages/count_tokens`, { method: 'GET', headers: { 'x-api-key': 'sekret' } });
      assert.strictEqual(missing.status, 405);
      assert.strictEqual((await missing.json()).type, 'error');
    });
  } finally {
    s.proc.kill('SIGTERM');
  }
  harness.finish();
})();
