// Structured outputs and tool calls end to end: gale serve with the official openai client, every
// schema of schemas.jsonl (tool parameters and structured-output schemas of the kinds agents
// send) on the default model and on a random-weight synth, greedy and sampled, batched and alone;
// every output that finishes is parsed and validated with ajv (+ ajv-formats), a JSON Schema
// validator that shares no code with gale. tool_choice "required" returns a valid call, streamed
// and not; a request with the fields agent SDKs send succeeds unchanged; zod schemas through the
// openai client, the AI SDK and LangChain come back valid by zod.
const { execFileSync } = require('child_process');
const fs = require('fs');
const os = require('os');
const path = require('path');
const assert = require('assert');

const [gale, nodeModules, chatTemplate, dataDir] = process.argv.slice(2);
const OpenAI = require(path.join(nodeModules, 'openai'));
const Ajv = require(path.join(nodeModules, 'ajv'));
const addFormats = require(path.join(nodeModules, 'ajv-formats'));

const schemas = fs.readFileSync(path.join(__dirname, 'schemas.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l));
const ajv = new Ajv({ strict: false, allErrors: true });
addFormats(ajv);
const validators = schemas.map((s) => ajv.compile(s.schema));

const harness = require('./harness.cjs');
const { check, waitForLog } = harness;
const startServer = (args) => harness.startServer(gale, ['-t', '2', '--no-warmup', ...args]);

function client(port) {
  return new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'x', maxRetries: 0, timeout: 600000 });
}

function responseFormat(s) {
  return { type: 'json_schema', json_schema: { name: s.name, strict: true, schema: s.schema } };
}

// Runs every schema once (concurrently: the server batches them), returns [{text, finish}].
async function runAll(c, { temperature, maxTokens, seedBase = 0 }) {
  return Promise.all(schemas.map(async (s, i) => {
    const r = await c.chat.completions.create({
      messages: [{ role: 'user', content: `Give me a ${s.name.replace(/_/g, ' ')} as JSON.` }],
      response_format: responseFormat(s), max_tokens: maxTokens, temperature, seed: seedBase + i,
    });
    return { text: r.choices[0].message.content, finish: r.choices[0].finish_reason };
  }));
}

// Every finished output parses and validates; returns how many finished.
function validateAll(label, outs) {
  let finished = 0;
  outs.forEach((o, i) => {
    if (o.finish !== 'stop') {
      assert.strictEqual(o.finish, 'length', `${label} ${schemas[i].name}: finish ${o.finish}`);
      return;
    }
    finished++;
    let v;
    try {
      v = JSON.parse(o.text);
    } catch (e) {
      throw new Error(`${label} ${schemas[i].name}: not JSON: ${JSON.stringify(o.text)}`);
    }
    if (!validators[i](v)) {
      throw new Error(`${label} ${schemas[i].name}: ${ajv.errorsText(validators[i].errors)} in ${JSON.stringify(o.text)}`);
    }
  });
  console.log(`     ${label}: ${finished} of ${outs.length} finished within max_tokens, all valid`);
  return finished;
}

(async () => {
  assert.ok(schemas.length >= 100, `the suite has ${schemas.length} schemas`);
  const s = await startServer(['--chat-template', chatTemplate]);
  const c = client(s.port);
  try {
    await check(`default model: ${schemas.length} schemas, greedy, batched and alone, all finished outputs valid`, async () => {
      const batched = await runAll(c, { temperature: 0, maxTokens: 400 });
      // The tiny story model, held to compact JSON (no whitespace between tokens), closes about
      // half of its documents within 400 tokens (measured 60 of 119; 88 when it could space them).
      assert.ok(validateAll('greedy', batched) >= 0.4 * schemas.length);
      // Alone (one at a time): the same text, token for token.
      for (let i = 0; i < schemas.length; i += 10) {
        const r = await c.chat.completions.create({
          messages: [{ role: 'user', content: `Give me a ${schemas[i].name.replace(/_/g, ' ')} as JSON.` }],
          response_format: responseFormat(schemas[i]), max_tokens: 400, temperature: 0,
        });
        assert.strictEqual(r.choices[0].message.content, batched[i].text, schemas[i].name);
      }
    });
    await check('default model: sampled (temperature 1), all finished outputs valid', async () => {
      const sampled = await runAll(c, { temperature: 1, maxTokens: 400, seedBase: 100 });
      assert.ok(validateAll('sampled', sampled) >= 0.5 * schemas.length);
    });
    await check('json_object, guided_choice, guided_regex and llama.cpp\'s json_schema through the client', async () => {
      const o = await c.chat.completions.create({ messages: [{ role: 'user', content: 'Hi' }], max_tokens: 300, temperature: 0,
                                                  response_format: { type: 'json_object' } });
      if (o.choices[0].finish_reason === 'stop') assert.strictEqual(typeof JSON.parse(o.choices[0].message.content), 'object');
      const ch = await c.completions.create({ prompt: 'The cat', max_tokens: 20, guided_choice: ['red', 'green', 'blue'] });
      assert.ok(['red', 'green', 'blue'].includes(ch.choices[0].text), ch.choices[0].text);
      const re = await c.completions.create({ prompt: 'Call me at', max_tokens: 30, temperature: 1, seed: 3, guided_regex: '\\d{3}-\\d{4}' });
      assert.match(re.choices[0].text, /^\d{3}-\d{4}$/);
      const js = await c.completions.create({ prompt: 'x', max_tokens: 30, json_schema: { type: 'integer', minimum: 5, maximum: 9 } });
      assert.ok([5, 6, 7, 8, 9].includes(JSON.parse(js.choices[0].text)), js.choices[0].text);
      const st = await c.chat.completions.create({ messages: [{ role: 'user', content: 'Hi' }], max_tokens: 300, stream: true,
                                                   response_format: responseFormat(schemas.find((x) => x.name === 'sentiment')) });
      let text = '';
      let finish = null;
      for await (const chunk of st) {
        if (chunk.choices[0].delta.content) text += chunk.choices[0].delta.content;
        if (chunk.choices[0].finish_reason) finish = chunk.choices[0].finish_reason;
      }
      if (finish === 'stop') assert.ok(validators[schemas.findIndex((x) => x.name === 'sentiment')](JSON.parse(text)), text);
    });
    await check('zod schemas with formats: zod 4\'s toJSONSchema, and the openai client\'s parse with zodResponseFormat', async () => {
      // email, uuid, datetime, url, regex with a minimum length: what apps write with zod (email and
      // url capped, so the tiny model finishes them within its context). zod 4
      // writes a format and its own pattern side by side (4.0's email pattern opens with
      // lookaheads); the v3 API (what openai 4's helper reads) writes the format alone. Every
      // finished output must pass zod's own parse.
      const shape = (zz) => ({ email: zz.string().email().max(16), id: zz.string().uuid(), at: zz.string().datetime(),
                               site: zz.string().url().max(32), code: zz.string().regex(/^[A-Z]{3}-[0-9]{2,4}$/).min(7) });
      let finished = 0;
      for (const [zod, seeds] of [['zod4', [1, 2, 3]], ['zod/v4', [4, 5, 6]]]) {
        const { z } = require(path.join(nodeModules, zod));
        const v4 = z.object(shape(z));
        const schema = z.toJSONSchema(v4);
        for (const seed of seeds) {
          const r = await c.chat.completions.create({
            messages: [{ role: 'user', content: 'A contact record as JSON.' }], max_tokens: 300, temperature: 1, seed,
            response_format: { type: 'json_schema', json_schema: { name: 'contact', strict: true, schema } },
          });
          if (r.choices[0].finish_reason !== 'stop') continue;
          finished++;
          const parsed = v4.safeParse(JSON.parse(r.choices[0].message.content));
          assert.ok(parsed.success, `${zod}: ${r.choices[0].message.content}: ${JSON.stringify(parsed.error && parsed.error.issues)}`);
        }
      }
      const { zodResponseFormat } = require(path.join(nodeModules, 'openai/helpers/zod'));
      const v3 = require(path.join(nodeModules, 'zod')).z;
      const contact = v3.object(shape(v3));
      for (const seed of [7, 8, 9]) {
        let r;
        try {
          r = await c.beta.chat.completions.parse({
            messages: [{ role: 'user', content: 'A contact record as JSON.' }], max_tokens: 300, temperature: 1, seed,
            response_format: zodResponseFormat(contact, 'contact'),
          });
        } catch (e) {
          if (e instanceof require(path.join(nodeModules, 'openai/error')).LengthFinishReasonError) continue;  // cut at max_tokens
          throw e;
        }
        finished++;
        assert.ok(contact.safeParse(r.choices[0].message.parsed).success, JSON.stringify(r.choices[0].message.parsed));
      }
      console.log(`     ${finished} of 9 finished within max_tokens, all valid by zod`);
      assert.ok(finished >= 2, `${finished} of 9 finished`);
    });
    await check('zod schemas through the AI SDK\'s generateObject and LangChain\'s withStructuredOutput', async () => {
      // The libraries as apps call them, unchanged: the AI SDK's OpenAI provider on chat
      // completions (it sends response_format json_schema), LangChain's ChatOpenAI with a
      // function call (tool_choice named) and with json_schema. Each validates what comes back
      // against the zod schema itself and throws when it does not parse (or was cut by max_tokens).
      const { z } = require(path.join(nodeModules, 'zod'));
      const contact = z.object({ email: z.string().email().max(16), id: z.string().uuid(), at: z.string().datetime(),
                                 site: z.string().url().max(32), code: z.string().regex(/^[A-Z]{3}-[0-9]{2,4}$/).min(7) });
      const baseURL = `http://127.0.0.1:${s.port}/v1`;
      const { generateObject, NoObjectGeneratedError } = require(path.join(nodeModules, 'ai'));
      const { createOpenAI } = require(path.join(nodeModules, '@ai-sdk/openai'));
      const provider = createOpenAI({ baseURL, apiKey: 'x' });
      const { ChatOpenAI } = require(path.join(nodeModules, '@langchain/openai'));
      const llm = new ChatOpenAI({ model: 'stories260K', apiKey: 'x', configuration: { baseURL }, maxTokens: 300, temperature: 1, maxRetries: 0 });
      const tally = {};
      for (const seed of [1, 2, 3]) {
        const runs = {
          'AI SDK': async () => (await generateObject({ model: provider.chat('stories260K'), schema: contact, prompt: 'A contact record.',
                                                        maxOutputTokens: 300, temperature: 1, seed, maxRetries: 0 })).object,
          'LangChain functionCalling': () => llm.withConfig({ seed }).withStructuredOutput(contact, { name: 'contact', method: 'functionCalling' })
            .invoke('A contact record.'),
          'LangChain jsonSchema': () => llm.withConfig({ seed }).withStructuredOutput(contact, { name: 'contact', method: 'jsonSchema' })
            .invoke('A contact record.'),
        };
        for (const [name, run] of Object.entries(runs)) {
          let object;
          try {
            object = await run();
          } catch (e) {
            // Cut at max_tokens: the JSON is unfinished (the AI SDK's own error, LangChain's parse error).
            if ((NoObjectGeneratedError.isInstance(e) && e.finishReason === 'length') || /Unterminated|Unexpected end|JSON/i.test(e.message)) continue;
            throw new Error(`${name}: ${e.message}`);
          }
          assert.ok(contact.safeParse(object).success, `${name}: ${JSON.stringify(object)}`);
          tally[name] = (tally[name] || 0) + 1;
        }
      }
      console.log(`     finished within max_tokens and valid by zod, of 3 each: ${JSON.stringify(tally)}`);
      for (const name of ['AI SDK', 'LangChain functionCalling', 'LangChain jsonSchema']) assert.ok(tally[name] >= 1, `${name}: none finished`);
    });
    await check('bad schemas and grammars are a 400 naming what is wrong', async () => {
      const bad = async (body, want) => {
        await assert.rejects(c.chat.completions.create({ messages: [{ role: 'user', content: 'Hi' }], max_tokens: 5, ...body }),
                             (e) => e instanceof OpenAI.BadRequestError && e.message.includes(want) ? true : (() => { throw e; })());
      };
      await bad({ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object', properties: { t: { type: 'array', uniqueItems: true } } } } } },
                "'/properties/t': 'uniqueItems' is supported only over");
      await bad({ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { $ref: '#/$defs/nope' } } } }, 'points at nothing');
      await bad({ guided_grammar: 'root ::= foo' }, "'foo' is used but never defined");
      await bad({ guided_regex: '(?<=a)b' }, 'lookarounds');
      await bad({ response_format: { type: 'json_object' }, guided_regex: 'a' }, 'both constrain');
    });
    await check('hostile constraints: a 400 naming the bound, never a 5xx, while other requests keep their latency', async () => {
      // Small requests back to back the whole time; their slowest must stay under a second or, on a
      // loaded machine (where the compile threads, at a lower priority, get little of the CPU and the
      // refusals take long), under a quarter of the longest refusal: an engine waiting for a
      // compilation would make them as slow as it.
      let stop = false;
      let slowest = 0;
      let smalls = 0;
      let failed = null;
      const background = (async () => {
        while (!stop) {
          const t0 = Date.now();
          try {
            await c.completions.create({ prompt: 'Once', max_tokens: 4, temperature: 0 });
          } catch (e) {
            failed = e;
            return;
          }
          slowest = Math.max(slowest, Date.now() - t0);
          smalls++;
        }
      })();
      const serverLog = () => `\nthe server's log ends:\n${s.log().slice(-4000)}`;
      const refused = async (body, want) => {
        const t0 = Date.now();
        await assert.rejects(c.completions.create({ prompt: 'x', max_tokens: 8, ...body }),
                             (e) => e instanceof OpenAI.BadRequestError && want.test(e.message) ? true : (() => { throw e; })());
        return Date.now() - t0;
      };
      const pattern = { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'string', pattern: '^(a{0,9999}){0,9999}$' } } };
      const times = await Promise.all([
        // Explodes after the opening quote: the engine's work bound ends that request alone.
        refused({ response_format: pattern }, /too ambiguous to follow|took longer than the server's limit/),
        // Explodes in its first state: refused when compiled, off the engine's thread.
        refused({ guided_grammar: 'root ::= ("a"{0,9999}){0,9999}' }, /too ambiguous to follow|took longer than the server's limit/),
        refused({ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: {
          anyOf: Array.from({ length: 20000 }, (_, i) => ({ type: 'object', properties: { [`k${i}`]: { type: 'integer' } }, required: [`k${i}`] })),
        } } } }, /too ambiguous to follow|took longer than the server's limit/),
      ]);
      // The same refusal again comes from the compiler's cache.
      await refused({ guided_grammar: 'root ::= ("a"{0,9999}){0,9999}' }, /too ambiguous to follow|took longer than the server's limit/);
      // A 20,000-value enum is an ordinary constraint.
      const values = Array.from({ length: 20000 }, (_, i) => `value${i}`);
      const e = await c.completions.create({ prompt: 'x', max_tokens: 12, temperature: 1, seed: 5,
                                             response_format: { type: 'json_schema', json_schema: { name: 'e', schema: { enum: values } } } });
      const text = e.choices[0].text.trim();
      if (e.choices[0].finish_reason === 'stop') {
        assert.ok(values.includes(JSON.parse(text)), text);
      } else {
        assert.ok(values.some((v) => JSON.stringify(v).startsWith(text)), text);
      }
      stop = true;
      await background;
      if (failed) throw new Error(`a small request failed: ${failed.stack}${serverLog()}`);
      console.log(`     refusals in ${times.join(' / ')} ms; ${smalls} small requests meanwhile, slowest ${slowest} ms`);
      assert.ok(smalls >= 3, `${smalls} small requests`);
      assert.ok(slowest < Math.max(1000, Math.max(...times) / 4), `a small request took ${slowest} ms`);
    });
    const tools = ['get_current_weather', 'control_light', 'set_timer'].map((n) => schemas.find((x) => x.name === n));
    const toolDefs = tools.map((t) => ({ type: 'function', function: { name: t.name, description: `the ${t.name} tool`, parameters: t.schema } }));
    const validCall = (call) => {
      const i = tools.findIndex((t) => t.name === call.function.name);
      assert.ok(i >= 0, `unknown tool ${call.function.name}`);
      assert.match(call.id, /^call_/);
      assert.strictEqual(call.type, 'function');
      const args = JSON.parse(call.function.arguments);
      assert.ok(validators[schemas.indexOf(tools[i])](args), `${call.function.arguments}: ${ajv.errorsText(validators[schemas.indexOf(tools[i])].errors)}`);
    };
    await check('tool_choice "required": a valid call comes back, streamed and not', async () => {
      for (const temperature of [0, 1]) {
        const r = await c.chat.completions.create({ messages: [{ role: 'user', content: 'What is the weather in Paris?' }], tools: toolDefs,
                                                    tool_choice: 'required', parallel_tool_calls: false, max_tokens: 400, temperature, seed: 9 });
        const ch = r.choices[0];
        assert.strictEqual(ch.finish_reason, 'tool_calls', JSON.stringify(ch));
        assert.strictEqual(ch.message.tool_calls.length, 1);
        validCall(ch.message.tool_calls[0]);
        const stream = await c.chat.completions.create({ messages: [{ role: 'user', content: 'What is the weather in Paris?' }], tools: toolDefs,
                                                         tool_choice: 'required', parallel_tool_calls: false, max_tokens: 400, temperature, seed: 9,
                                                         stream: true });
        const calls = [];
        let finish = null;
        for await (const chunk of stream) {
          for (const d of chunk.choices[0].delta.tool_calls || []) {
            if (!calls[d.index]) calls[d.index] = { id: d.id, type: d.type, function: { name: d.function.name, arguments: '' } };
            calls[d.index].function.arguments += d.function.arguments || '';
          }
          if (chunk.choices[0].finish_reason) finish = chunk.choices[0].finish_reason;
        }
        assert.strictEqual(finish, 'tool_calls');
        assert.strictEqual(calls.length, 1);
        validCall(calls[0]);
        assert.strictEqual(calls[0].function.arguments, ch.message.tool_calls[0].function.arguments);
      }
      // Parallel calls end like OpenAI's: within kMaxParallelToolCalls (8) the answer is complete,
      // finish tool_calls, content null; cut by max_tokens, the cut call is dropped, not content.
      for (const [maxTokens, seed] of [[480, 3], [480, 4], [100, 5]]) {
        const r = await c.chat.completions.create({ messages: [{ role: 'user', content: 'Weather everywhere?' }], tools: toolDefs,
                                                    tool_choice: 'required', max_tokens: maxTokens, temperature: 1, seed });
        const ch = r.choices[0];
        assert.strictEqual(ch.message.content, null, JSON.stringify(ch));
        const calls = ch.message.tool_calls || [];
        assert.ok(calls.length <= 8, JSON.stringify(ch));
        calls.forEach(validCall);
        if (ch.finish_reason !== 'length') {
          assert.strictEqual(ch.finish_reason, 'tool_calls', JSON.stringify(ch));
          assert.ok(r.usage.completion_tokens < maxTokens);
        }
        console.log(`     parallel, max_tokens ${maxTokens}: ${calls.length} calls, ${r.usage.completion_tokens} tokens, ${ch.finish_reason}`);
      }
      // A named function: that one, and the call round-trips through the template with the tool's answer.
      const named = await c.chat.completions.create({ messages: [{ role: 'user', content: 'Book it' }], tools: toolDefs, max_tokens: 400,
                                                      tool_choice: { type: 'function', function: { name: 'control_light' } } });
      const call = named.choices[0].message.tool_calls[0];
      assert.strictEqual(call.function.name, 'control_light');
      assert.strictEqual(named.choices[0].finish_reason, 'tool_calls');
      assert.strictEqual(named.choices[0].message.content, null);
      assert.strictEqual(named.choices[0].message.tool_calls.length, 1);
      validCall(call);
      const after = await c.chat.completions.create({ tools: toolDefs, max_tokens: 8, messages: [
        { role: 'user', content: 'Book it' }, { role: 'assistant', content: null, tool_calls: [call] },
        { role: 'tool', tool_call_id: call.id, content: '{"ok": true}' }] });
      assert.strictEqual(after.choices.length, 1);
    });
    await check('a request with the fields agent SDKs send (LangChain-JS, Vercel AI SDK) succeeds unchanged', async () => {
      const r = await c.chat.completions.create({
        model: 'stories260K', messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hello' }],
        temperature: 0.7, top_p: 0.9, frequency_penalty: 0, presence_penalty: 0, max_tokens: 8, max_completion_tokens: 8, n: 1,
        stream: false, stop: ['\n\n'], seed: 1, user: 'u-1', logit_bias: { 5: -1 }, logprobs: false, tools: toolDefs, tool_choice: 'auto',
        parallel_tool_calls: true, store: false, metadata: { app: 'test' }, service_tier: 'auto', reasoning_effort: 'low',
        modalities: ['text'], prediction: null, stream_options: undefined, response_format: { type: 'text' },
      });
      assert.strictEqual(r.choices.length, 1);
      assert.ok(r.choices[0].message.content !== undefined);
      await waitForLog(s, "ignoring the unknown request field 'service_tier'");
    });
  } finally {
    s.proc.kill('SIGTERM');
  }

  const strict = await startServer(['--chat-template', chatTemplate, '--strict-api']);
  try {
    await check('--strict-api refuses unknown fields', async () => {
      await assert.rejects(client(strict.port).chat.completions.create({ messages: [{ role: 'user', content: 'x' }], max_tokens: 2, store: true }),
                           (e) => e instanceof OpenAI.BadRequestError && e.message.includes("unknown field 'store'"));
    });
  } finally {
    strict.proc.kill('SIGTERM');
  }

  // A random-weight model with its synthetic vocabulary: most of its strings never end within
  // max_tokens, but every output that ends is valid, greedy and sampled.
  const model = path.join(os.tmpdir(), `gale-structured-${process.pid}.gguf`);
  execFileSync(gale, ['synth', '--shape', 'tiny', '--type', 'q8_0', '-o', model], { stdio: 'ignore' });
  const sy = await startServer(['-m', model, '--chat-template', chatTemplate]);
  try {
    await check(`synth model: ${schemas.length} schemas, greedy and sampled, all finished outputs valid`, async () => {
      const c2 = client(sy.port);
      const greedy = validateAll('synth greedy', await runAll(c2, { temperature: 0, maxTokens: 200 }));
      const sampled = validateAll('synth sampled', await runAll(c2, { temperature: 1, maxTokens: 200, seedBase: 7 }));
      assert.ok(greedy + sampled >= 10, `${greedy} + ${sampled} finished`);
    });
  } finally {
    sy.proc.kill('SIGTERM');
    fs.rmSync(model, { force: true });
  }

  // Real templates (llama.cpp's bundle, derived by scripts/derive-test-data.sh) on random-weight
  // models with real tokenizers (Qwen3's, gpt-oss's): required and named tool calls and JSON
  // schemas come back as tool_calls and content, streamed and not. On a thinking template (the
  // prompt ends inside <think>) the constraint waits for </think>: a logit bias on </think> makes
  // the model close its thought at once, and the answer after it is still a call or the JSON,
  // never text inside reasoning_content.
  const templates = path.join(dataDir || '', 'chat-templates/templates');
  const hf = path.join(nodeModules, '../hf');
  if (!dataDir || !fs.existsSync(templates) || !fs.existsSync(path.join(hf, 'tokenizer-qwen3'))) {
    console.log(`skip real-template checks: ${templates} or ${hf} is missing (scripts/install-deps.sh --test makes them)`);
  } else {
    const qwen = path.join(os.tmpdir(), `gale-structured-qwen3-${process.pid}.gguf`);
    const oss = path.join(os.tmpdir(), `gale-structured-gptoss-${process.pid}.gguf`);
    // Qwen3.5's template on a Qwen3.5 model (Gated DeltaNet layers: the engine's recurrent states).
    const qwen35 = path.join(os.tmpdir(), `gale-structured-qwen35-${process.pid}.gguf`);
    execFileSync(gale, ['synth', '--shape', 'custom', '--arch', 'qwen35', '--dim', '64', '--layers', '4', '--heads', '4',
                        '--kv-heads', '2', '--ffn', '128', '--ctx', '4096', '--type', 'q8_0',
                        '--tokenizer', path.join(hf, 'tokenizer-qwen3/models'), '-o', qwen35], { stdio: 'ignore' });
    execFileSync(gale, ['synth', '--shape', 'custom', '--arch', 'qwen3', '--dim', '64', '--layers', '2', '--heads', '4',
                        '--kv-heads', '2', '--ffn', '128', '--ctx', '4096', '--type', 'q8_0',
                        '--tokenizer', path.join(hf, 'tokenizer-qwen3/models'), '-o', qwen], { stdio: 'ignore' });
    execFileSync(gale, ['synth', '--shape', 'custom', '--arch', 'gpt-oss', '--dim', '64', '--layers', '2', '--heads', '4',
                        '--kv-heads', '2', '--head-dim', '32', '--ffn', '128', '--experts', '4', '--experts-used', '2',
                        '--expert-ffn', '64', '--type', 'q8_0', '--tokenizer', path.join(hf, 'tokenizer-gptoss/models'),
                        '-o', oss], { stdio: 'ignore' });
    const qwenTokens = JSON.parse(fs.readFileSync(path.join(hf, 'tokenizer-qwen3/models/tokenizer.json'), 'utf8')).added_tokens;
    const endThink = qwenTokens.find((t) => t.content === '</think>').id;
    const cases = [
      { template: 'Qwen3.5-4B.jinja', model: qwen35, parser: 'qwen3_coder', thinks: true },
      { template: 'Qwen3-Coder.jinja', model: qwen, parser: 'qwen3_coder', thinks: false },
      { template: 'llama-cpp-deepseek-r1.jinja', model: qwen, parser: 'deepseek_v3', thinks: true },
      { template: 'openai-gpt-oss-120b.jinja', model: oss, parser: 'gpt_oss', thinks: false },
    ];
    const time = { type: 'function', function: { name: 'get_time', description: 'The time in a zone', parameters: {
      type: 'object', properties: { zone: { enum: ['utc', 'local'] } }, required: ['zone'] } } };
    const light = { type: 'function', function: { name: 'set_light', description: 'Switch a light', parameters: {
      type: 'object', properties: { on: { type: 'boolean' } }, required: ['on'] } } };
    const validZone = (args) => assert.ok(['utc', 'local'].includes(JSON.parse(args).zone), args);
    // One answer, streamed or not, as { finish, content, reasoning, calls: [{ name, arguments }] }.
    const ask = async (c, body) => {
      const r = await c.chat.completions.create(body);
      if (!body.stream) {
        const m = r.choices[0].message;
        return { finish: r.choices[0].finish_reason, content: m.content, reasoning: m.reasoning_content || '',
                 calls: (m.tool_calls || []).map((t) => t.function) };
      }
      const out = { finish: null, content: null, reasoning: '', calls: [] };
      for await (const chunk of r) {
        const d = chunk.choices[0].delta;
        if (d.content) out.content = (out.content || '') + d.content;
        if (d.reasoning_content) out.reasoning += d.reasoning_content;
        for (const t of d.tool_calls || []) {
          if (!out.calls[t.index]) out.calls[t.index] = { name: t.function.name, arguments: '' };
          out.calls[t.index].arguments += t.function.arguments || '';
        }
        if (chunk.choices[0].finish_reason) out.finish = chunk.choices[0].finish_reason;
      }
      return out;
    };
    for (const tc of cases) {
      const th = await startServer(['-m', tc.model, '--chat-template', path.join(templates, tc.template)]);
      try {
        await check(`${tc.template}: tool_choice required/named and json_schema give tool_calls and content, streamed and not`, async () => {
          await waitForLog(th, `tool calls: the ${tc.parser} parser (from the chat template)` +
                               (tc.thinks ? '; reasoning in <think>...</think> blocks' : ''));
          const c3 = client(th.port);
          const messages = [{ role: 'user', content: 'What time is it?' }];
          // Thinking templates: closed at once (a logit bias on </think>), and for Qwen3.5 also
          // switched off by the template (enable_thinking: false).
          const modes = tc.thinks ? [{ logit_bias: { [endThink]: 100 } }] : [{}];
          if (tc.template.startsWith('Qwen3.5')) modes.push({ chat_template_kwargs: { enable_thinking: false } });
          for (const mode of modes) {
            for (const stream of [false, true]) {
              const tag = JSON.stringify({ mode, stream });
              const base = { messages, max_tokens: 200, seed: 3, stream, ...mode };
              const req = await ask(c3, { ...base, tools: [time, light], tool_choice: 'required', parallel_tool_calls: false });
              assert.strictEqual(req.finish, 'tool_calls', `${tag} ${JSON.stringify(req)}`);
              assert.strictEqual(req.content, null, tag);
              assert.ok(!/tool_call|get_time|set_light/.test(req.reasoning), `${tag} reasoning: ${req.reasoning}`);
              assert.strictEqual(req.calls.length, 1, tag);
              assert.ok(['get_time', 'set_light'].includes(req.calls[0].name), tag);
              const named = await ask(c3, { ...base, tools: [time, light], tool_choice: { type: 'function', function: { name: 'get_time' } } });
              assert.strictEqual(named.finish, 'tool_calls', `${tag} ${JSON.stringify(named)}`);
              assert.deepStrictEqual(named.calls.map((x) => x.name), ['get_time'], tag);
              validZone(named.calls[0].arguments);
              const js = await ask(c3, { ...base, response_format: { type: 'json_schema', json_schema: { name: 'z', schema: time.function.parameters } } });
              assert.strictEqual(js.finish, 'stop', `${tag} ${JSON.stringify(js)}`);
              assert.deepStrictEqual(js.calls, [], tag);
              validZone(js.content);
            }
          }
          if (tc.thinks) {
            // Left to itself, this random model rarely closes its thought within 40 tokens: nothing
            // of the call is forced into the thought meanwhile.
            const on = await ask(c3, { messages, tools: [time], tool_choice: 'required', max_tokens: 40, temperature: 1, seed: 2 });
            assert.ok(!on.reasoning.includes('<tool_call>') && !on.reasoning.includes('get_time'), JSON.stringify(on));
            assert.ok(on.finish === 'length' ? on.content === null : on.calls[0].name === 'get_time', JSON.stringify(on));
          }
        });
      } finally {
        th.proc.kill('SIGTERM');
      }
    }
    // Parallel calls (Qwen3.5, thinking off): this model repeats them; the grammar is complete after
    // 8 and the answer ends.
    const th = await startServer(['-m', qwen, '--chat-template', path.join(templates, 'Qwen3.5-4B.jinja')]);
    try {
      await check('parallel required calls stop at 8: the grammar is complete and the answer ends', async () => {
        const par = await client(th.port).chat.completions.create({ messages: [{ role: 'user', content: 'Time?' }], tools: [time],
          tool_choice: 'required', max_tokens: 1500, chat_template_kwargs: { enable_thinking: false } });
        assert.strictEqual(par.choices[0].finish_reason, 'tool_calls', JSON.stringify(par.choices[0]));
        const n = par.choices[0].message.tool_calls.length;
        assert.ok(n >= 1 && n <= 8, `${n} calls`);
        assert.ok(par.usage.completion_tokens < 1500);
      });
      await check('a call streams as it is written: its name first, then its arguments in pieces (the SDK\'s stream helper)', async () => {
        const both = { type: 'function', function: { name: 'set_light_in', description: 'Switch a light in a zone', parameters: {
          type: 'object', properties: { zone: { enum: ['utc', 'local'] }, on: { type: 'boolean' } }, required: ['zone', 'on'] } } };
        const events = [];
        let firstCallChunk = null;
        const stream = client(th.port).beta.chat.completions.stream({
          messages: [{ role: 'user', content: 'Light?' }], tools: [both], max_tokens: 200, seed: 1,
          tool_choice: { type: 'function', function: { name: 'set_light_in' } }, chat_template_kwargs: { enable_thinking: false } });
        stream.on('chunk', (chunk) => {
          const t = chunk.choices[0].delta.tool_calls;
          if (t && !firstCallChunk) firstCallChunk = t[0];
        });
        stream.on('tool_calls.function.arguments.delta', (e) => events.push(e));
        const done = await stream.finalChatCompletion();
        const call = done.choices[0].message.tool_calls[0];
        assert.strictEqual(done.choices[0].finish_reason, 'tool_calls');
        assert.strictEqual(call.function.name, 'set_light_in');
        const args = JSON.parse(call.function.arguments);
        assert.ok(['utc', 'local'].includes(args.zone) && typeof args.on === 'boolean', call.function.arguments);
        // The first piece names the call (with its id), before its arguments are whole.
        assert.ok(firstCallChunk && firstCallChunk.id && firstCallChunk.type === 'function' &&
                  firstCallChunk.function.name === 'set_light_in', JSON.stringify(firstCallChunk));
        assert.ok(events.length >= 2, `${events.length} argument deltas`);
        assert.ok(events[0].arguments.length < call.function.arguments.length, JSON.stringify(events[0]));
        assert.strictEqual(events.map((e) => e.arguments_delta).join(''), call.function.arguments);
      });
    } finally {
      th.proc.kill('SIGTERM');
      fs.rmSync(qwen, { force: true });
      fs.rmSync(oss, { force: true });
      fs.rmSync(qwen35, { force: true });
    }
  }

  harness.finish();
})().catch((e) => {
  console.log('FAIL', e);
  process.exit(1);
});
