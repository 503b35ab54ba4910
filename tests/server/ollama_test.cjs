// Ollama's API end to end: gale serve (with mean pooling, so /api/embed answers) driven, unchanged,
// by the official `ollama` npm client: chat and generate, streamed (Ollama's default, as
// newline-delimited JSON) and not, with options, format (json and a schema) and a tool round trip;
// embed; list, show, ps and version; a load-only request; errors as {"error": ...}.
const path = require('path');
const assert = require('assert');

const [gale, nodeModules, chatTemplate] = process.argv.slice(2);
const { Ollama } = require(path.join(nodeModules, 'ollama'));
const harness = require('./harness.cjs');
const { check } = harness;

(async () => {
  const s = await harness.startServer(gale, ['-t', '2', '--no-warmup', '--chat-template', chatTemplate, '--pooling', 'mean']);
  const host = `http://127.0.0.1:${s.port}`;
  const o = new Ollama({ host });
  const options = { num_predict: 16, temperature: 0 };
  const messages = [{ role: 'user', content: 'Once upon a time' }];
  try {
    await check('chat: whole and streamed (the default) give the same text; done_reason, counts and durations', async () => {
      const whole = await o.chat({ model: 'stories260K', messages, options, stream: false });
      assert.strictEqual(whole.message.role, 'assistant');
      assert.ok(whole.message.content.length > 0);
      assert.strictEqual(whole.done, true);
      assert.strictEqual(whole.done_reason, 'length');
      assert.strictEqual(whole.eval_count, 16);
      assert.ok(whole.prompt_eval_count > 0 && whole.total_duration > 0);
      let text = '';
      let last = null;
      for await (const part of await o.chat({ model: 'stories260K:latest', messages, options, stream: true })) {
        text += part.message.content;
        last = part;
      }
      assert.strictEqual(text, whole.message.content);
      assert.strictEqual(last.done, true);
      assert.strictEqual(last.model, 'stories260K:latest');
      assert.strictEqual(last.eval_count, 16);
    });
    await check('generate: streamed and not, with a system prompt and raw (no template)', async () => {
      const whole = await o.generate({ model: 'stories260K', prompt: 'Once upon a time', options, stream: false });
      let text = '';
      for await (const part of await o.generate({ model: 'stories260K', prompt: 'Once upon a time', options, stream: true })) text += part.response;
      assert.strictEqual(text, whole.response);
      assert.strictEqual(whole.done_reason, 'length');
      const chat = await o.chat({ model: 'stories260K', messages, options, stream: false });
      assert.strictEqual(whole.response, chat.message.content, 'generate renders the chat template as chat does');
      const raw = await o.generate({ model: 'stories260K', prompt: 'Once upon a time', raw: true, options, stream: false });
      assert.ok(raw.response.length > 0 && raw.eval_count === 16);
      // Without num_predict, until the end of text or of the context (as Ollama's default).
      const open = await o.generate({ model: 'stories260K', prompt: 'Once upon a time', raw: true, stream: false });
      assert.ok(open.eval_count > 16, JSON.stringify(open));
      const sys = await o.generate({ model: 'stories260K', prompt: 'Once upon a time', system: 'Be brief.', options: { num_predict: 2 }, stream: false });
      assert.ok(sys.prompt_eval_count >= whole.prompt_eval_count);
    });
    await check('format: "json" and a schema constrain the answer', async () => {
      const schema = { type: 'object', properties: { n: { type: 'integer', minimum: 1, maximum: 9 } }, required: ['n'] };
      const r = await o.chat({ model: 'stories260K', messages, format: schema, options: { num_predict: 40 }, stream: false });
      if (r.done_reason === 'stop') {
        const v = JSON.parse(r.message.content);
        assert.ok(Number.isInteger(v.n) && v.n >= 1 && v.n <= 9, r.message.content);
      }
      const j = await o.generate({ model: 'stories260K', prompt: 'JSON:', format: 'json', options: { num_predict: 60, seed: 3, temperature: 1 }, stream: false });
      if (j.done_reason === 'stop') JSON.parse(j.response);
    });
    await check('a tool round trip: an assistant message with tool_calls (object arguments) and a tool message are accepted', async () => {
      const tools = [{ type: 'function', function: { name: 'get_weather', description: 'W', parameters: { type: 'object', properties: { city: { type: 'string' } } } } }];
      const r = await o.chat({ model: 'stories260K', tools, options: { num_predict: 4 }, stream: false, messages: [
        { role: 'user', content: 'Weather in Lima?' },
        { role: 'assistant', content: '', tool_calls: [{ function: { name: 'get_weather', arguments: { city: 'Lima' } } }] },
        { role: 'tool', content: 'Sunny', tool_name: 'get_weather' }] });
      assert.strictEqual(r.done, true);
    });
    await check('embed: one vector per input; the legacy /api/embeddings too', async () => {
      const e = await o.embed({ model: 'stories260K', input: ['hello', 'world'] });
      assert.strictEqual(e.embeddings.length, 2);
      assert.ok(e.embeddings[0].length > 0);
      assert.notDeepStrictEqual(e.embeddings[0], e.embeddings[1]);
      const one = await o.embeddings({ model: 'stories260K', prompt: 'hello' });
      assert.deepStrictEqual(one.embedding.map((x) => x.toFixed(5)), e.embeddings[0].map((x) => x.toFixed(5)));
    });
    await check('list, show, ps and version describe the served model', async () => {
      const list = await o.list();
      assert.strictEqual(list.models.length, 1);
      assert.strictEqual(list.models[0].name, 'stories260K:latest');
      assert.strictEqual(list.models[0].details.format, 'gguf');
      assert.strictEqual(list.models[0].details.family, 'llama');
      assert.ok(list.models[0].size > 0);
      const show = await o.show({ model: 'stories260K:latest' });
      assert.ok(show.capabilities.includes('completion') && show.capabilities.includes('embedding'), JSON.stringify(show.capabilities));
      assert.ok(show.template.includes('messages'));
      assert.strictEqual(show.model_info['general.architecture'], 'llama');
      const ps = await o.ps();
      assert.strictEqual(ps.models[0].model, 'stories260K:latest');
      const v = await (await fetch(`${host}/api/version`)).json();
      assert.match(v.version, /^\d+\.\d+\.\d+$/);
    });
    await check('a request without messages or prompt loads the model (done_reason "load")', async () => {
      const r = await (await fetch(`${host}/api/generate`, { method: 'POST', body: JSON.stringify({ model: 'stories260K' }) })).json();
      assert.strictEqual(r.done, true);
      assert.strictEqual(r.done_reason, 'load');
    });
    await check('errors are {"error": ...}: another model, a malformed body, images, a wrong method', async () => {
      await assert.rejects(o.chat({ model: 'llama3', messages, stream: false }), (e) => e.status_code === 404 && /not found/.test(e.error));
      const bad = await fetch(`${host}/api/chat`, { method: 'POST', body: '{"model": "stories260K", "messages": [' });
      assert.strictEqual(bad.status, 400);
      assert.ok(/not valid JSON/.test((await bad.json()).error));
      await assert.rejects(o.chat({ model: 'stories260K', messages: [{ role: 'user', content: 'x', images: ['AAAA'] }], stream: false }),
                           (e) => e.status_code === 400 && /images/.test(e.error));
      const get = await fetch(`${host}/api/chat`);
      assert.strictEqual(get.status, 405);
      assert.ok(typeof (await get.json()).error === 'string');
    });
  } finally {
    s.proc.kill('SIGTERM');
  }
  harness.finish();
})();
