// OpenAI's Responses API end to end: gale serve driven, unchanged, by the official openai client
// (responses.create, its stream, a function tool round trip through previous_response_id,
// retrieve and delete), the AI SDK's default OpenAI provider (which speaks Responses) and
// LangChain's ChatOpenAI with useResponsesApi; malformed bodies in OpenAI's error shape.
const path = require('path');
const assert = require('assert');

const [gale, nodeModules, chatTemplate] = process.argv.slice(2);
const OpenAI = require(path.join(nodeModules, 'openai'));
const harness = require('./harness.cjs');
const { check } = harness;

const tools = [{ type: 'function', name: 'get_weather', description: 'The weather in a city',
                 parameters: { type: 'object', properties: { city: { type: 'string', enum: ['Lima', 'Oslo'] } }, required: ['city'] } }];

(async () => {
  const s = await harness.startServer(gale, ['-t', '2', '--no-warmup', '--chat-template', chatTemplate]);
  const baseURL = `http://127.0.0.1:${s.port}/v1`;
  const c = new OpenAI({ baseURL, apiKey: 'x', maxRetries: 0 });
  const ask = { model: 'stories260K', instructions: 'Tell a story.', input: 'Once upon a time', max_output_tokens: 20, temperature: 0 };
  try {
    await check('responses.create: a message item, output_text, status and usage', async () => {
      const r = await c.responses.create(ask);
      assert.strictEqual(r.object, 'response');
      assert.ok(r.id.startsWith('resp_'));
      assert.strictEqual(r.output.length, 1);
      assert.strictEqual(r.output[0].type, 'message');
      assert.ok(r.output_text.length > 0);
      assert.ok(['completed', 'incomplete'].includes(r.status));
      if (r.status === 'incomplete') assert.strictEqual(r.incomplete_details.reason, 'max_output_tokens');
      assert.strictEqual(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
      assert.strictEqual(r.instructions, 'Tell a story.');
    });
    await check('stream: the same text as deltas, in the Responses event order, ending with the stored response', async () => {
      const whole = await c.responses.create(ask);
      const stream = await c.responses.create({ ...ask, stream: true });
      let text = '';
      const types = [];
      let final = null;
      for await (const e of stream) {
        types.push(e.type);
        if (e.type === 'response.output_text.delta') text += e.delta;
        if (e.type === 'response.completed' || e.type === 'response.incomplete') final = e.response;
      }
      assert.strictEqual(text, whole.output_text);
      assert.deepStrictEqual(types.slice(0, 4), ['response.created', 'response.in_progress', 'response.output_item.added', 'response.content_part.added']);
      assert.deepStrictEqual(types.slice(-4, -1), ['response.output_text.done', 'response.content_part.done', 'response.output_item.done']);
      assert.strictEqual(final.output[0].content[0].text, text);
      const stored = await c.responses.retrieve(final.id);
      assert.strictEqual(stored.output[0].content[0].text, text);
    });
    await check('a function tool round trip: a forced call, its output sent with previous_response_id; retrieve and delete', async () => {
      const r = await c.responses.create({ model: 'stories260K', input: 'Weather in Lima?', tools, tool_choice: { type: 'function', name: 'get_weather' },
                                           max_output_tokens: 80 });
      const call = r.output.find((o) => o.type === 'function_call');
      assert.ok(call, JSON.stringify(r.output));
      assert.strictEqual(call.name, 'get_weather');
      assert.ok(['Lima', 'Oslo'].includes(JSON.parse(call.arguments).city), call.arguments);
      assert.ok(!r.output.some((o) => o.type === 'message'), 'no markup as a message');
      const next = await c.responses.create({ model: 'stories260K', previous_response_id: r.id, tools, max_output_tokens: 8,
                                              input: [{ type: 'function_call_output', call_id: call.call_id, output: 'Sunny, 24 C' }] });
      assert.strictEqual(next.previous_response_id, r.id);
      assert.ok(next.usage.input_tokens > r.usage.input_tokens, 'the earlier turn is in the prompt');
      assert.strictEqual((await c.responses.retrieve(next.id)).id, next.id);
      const deleted = await c.responses.del(next.id);
      assert.strictEqual(deleted.deleted, true);
      await assert.rejects(c.responses.retrieve(next.id), (e) => e.status === 404);
      // store: false keeps nothing.
      const unstored = await c.responses.create({ ...ask, max_output_tokens: 2, store: false });
      await assert.rejects(c.responses.retrieve(unstored.id), (e) => e.status === 404);
      await assert.rejects(c.responses.create({ ...ask, previous_response_id: unstored.id }), (e) => e.status === 404 && e.param === 'previous_response_id');
    });
    await check('a function call streams: the item, then its arguments as deltas, then done', async () => {
      const stream = await c.responses.create({ model: 'stories260K', input: 'Weather?', tools, tool_choice: 'required', max_output_tokens: 80,
                                                parallel_tool_calls: false, stream: true });
      let args = '';
      let done = null;
      const types = [];
      for await (const e of stream) {
        types.push(e.type);
        if (e.type === 'response.function_call_arguments.delta') args += e.delta;
        if (e.type === 'response.function_call_arguments.done') done = e.arguments;
      }
      assert.ok(types.includes('response.output_item.added'));
      assert.strictEqual(args, done);
      assert.ok(['Lima', 'Oslo'].includes(JSON.parse(done).city), done);
    });
    await check('the AI SDK\'s default OpenAI provider (Responses) and LangChain with useResponsesApi, unchanged', async () => {
      const { generateText, streamText } = require(path.join(nodeModules, 'ai'));
      const { createOpenAI } = require(path.join(nodeModules, '@ai-sdk/openai'));
      const provider = createOpenAI({ baseURL, apiKey: 'x' });
      const whole = await c.responses.create({ model: 'stories260K', input: 'Once upon a time', max_output_tokens: 16, temperature: 0 });
      const a = await generateText({ model: provider('stories260K'), prompt: 'Once upon a time', maxOutputTokens: 16, temperature: 0, maxRetries: 0 });
      assert.strictEqual(a.text, whole.output_text);
      const st = streamText({ model: provider('stories260K'), prompt: 'Once upon a time', maxOutputTokens: 16, temperature: 0, maxRetries: 0 });
      let streamed = '';
      for await (const t of st.textStream) streamed += t;
      assert.strictEqual(streamed, whole.output_text);
      const { ChatOpenAI } = require(path.join(nodeModules, '@langchain/openai'));
      const llm = new ChatOpenAI({ model: 'stories260K', apiKey: 'x', configuration: { baseURL }, maxTokens: 16, temperature: 0,
                                   useResponsesApi: true, maxRetries: 0 });
      const l = await llm.invoke('Once upon a time');
      const text = typeof l.content === 'string' ? l.content : l.content.map((p) => p.text || '').join('');
      assert.strictEqual(text, whole.output_text);
    });
    await check('bad bodies are 400s in OpenAI\'s shape naming the field', async () => {
      await assert.rejects(c.responses.create({ model: 'stories260K' }), (e) => e instanceof OpenAI.BadRequestError && e.param === 'input');
      await assert.rejects(c.responses.create({ model: 'stories260K', input: 'x', tools: [{ type: 'web_search_preview' }] }),
                           (e) => e instanceof OpenAI.BadRequestError && e.param === 'tools[0].type');
      const raw = await fetch(`${baseURL}/responses`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"input": [' });
      assert.strictEqual(raw.status, 400);
      assert.ok((await raw.json()).error.message.includes('not valid JSON'));
      const put = await fetch(`${baseURL}/responses/resp_x`, { method: 'PUT' });
      assert.strictEqual(put.status, 405);
    });
  } finally {
    s.proc.kill('SIGTERM');
  }
  harness.finish();
})();
