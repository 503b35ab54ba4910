// gale serve end to end: a real server process, the official openai client, raw HTTP for the
// error paths, random bodies, 200 concurrent streams with disconnects, SIGTERM.
const { spawn } = require('child_process');
const http = require('http');
const net = require('net');
const fs = require('fs');
const path = require('path');
const assert = require('assert');

const [gale, nodeModules, chatTemplate] = process.argv.slice(2);
const OpenAI = require(path.join(nodeModules, 'openai'));

let failures = 0;
let passes = 0;
async function check(name, fn) {
  try {
    await fn();
    passes++;
    console.log(`ok   ${name}`);
  } catch (e) {
    failures++;
    console.log(`FAIL ${name}: ${e && e.stack ? e.stack : e}`);
  }
}

function startServer(extraArgs = []) {
  return new Promise((resolve, reject) => {
    const proc = spawn(gale, ['serve', '--port', '0', '--chat-template', chatTemplate, '-t', '2', ...extraArgs],
                       { stdio: ['ignore', 'ignore', 'pipe'] });
    let log = '';
    let port = null;
    const timer = setTimeout(() => reject(new Error('server did not start: ' + log)), 30000);
    proc.stderr.on('data', (d) => {
      log += d.toString();
      const m = log.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m && !port) port = Number(m[1]);
      if (port && log.includes('ready:')) {
        clearTimeout(timer);
        resolve({ proc, port, log: () => log });
      }
    });
    proc.on('exit', (code) => reject(new Error(`server exited ${code}: ${log}`)));
  });
}

function request(port, method, p, body, headers = {}) {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port, method, path: p, headers }, (res) => {
      let data = '';
      res.on('data', (c) => (data += c));
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body: data }));
    });
    req.on('error', reject);
    if (body !== undefined) req.write(body);
    req.end();
  });
}

function metricValue(text, name) {
  const line = text.split('\n').find((l) => l.startsWith(name + ' ') || l.startsWith(name + '{'));
  return line ? Number(line.split(' ').pop()) : NaN;
}

function sumMetric(text, prefix) {
  return text.split('\n').filter((l) => l.startsWith(prefix)).reduce((a, l) => a + Number(l.split(' ').pop()), 0);
}

function rssKb(pid) {
  const s = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
  return Number(s.match(/VmRSS:\s+(\d+)/)[1]);
}

// A streaming chat request over a raw socket; optionally hangs up after `cutAfter` bytes.
function rawStream(port, cutAfter) {
  return new Promise((resolve) => {
    const body = JSON.stringify({ messages: [{ role: 'user', content: 'Once upon a time' }], max_tokens: 40,
                                  temperature: 0.8, seed: 7, stream: true });
    const sock = net.connect(port, '127.0.0.1', () => {
      sock.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n` +
                 `Content-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
    });
    let data = '';
    sock.on('data', (d) => {
      data += d.toString();
      if (cutAfter !== null && data.length >= cutAfter) {
        sock.destroy();
        resolve({ cut: true, data });
      }
    });
    sock.on('end', () => resolve({ cut: false, data }));
    sock.on('error', () => resolve({ cut: true, data }));
  });
}

(async () => {
  const srv = await startServer();
  const base = `http://127.0.0.1:${srv.port}/v1`;
  const client = new OpenAI({ baseURL: base, apiKey: 'unused', maxRetries: 0 });

  await check('health and models', async () => {
    const h = await request(srv.port, 'GET', '/health');
    assert.strictEqual(h.status, 200);
    const models = await client.models.list();
    assert.strictEqual(models.data[0].id, 'stories260K');
  });

  await check('completion (openai client)', async () => {
    const r = await client.completions.create({ model: 'stories260K', prompt: 'Once upon a time', max_tokens: 12, temperature: 0 });
    assert.ok(r.choices[0].text.startsWith(', there was a little girl'), r.choices[0].text);
    assert.strictEqual(r.choices[0].finish_reason, 'length');
    assert.strictEqual(r.usage.completion_tokens, 12);
    assert.ok(r.usage.prompt_tokens > 0);
  });

  await check('chat, streamed equals non-streamed for the same seed', async () => {
    const params = { model: 'stories260K', messages: [{ role: 'user', content: 'The cat' }], max_tokens: 30,
                     temperature: 0.9, seed: 42 };
    const whole = await client.chat.completions.create(params);
    const stream = await client.chat.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
    let text = '';
    let usage = null;
    let finish = null;
    for await (const chunk of stream) {
      if (chunk.choices.length) {
        text += chunk.choices[0].delta.content || '';
        if (chunk.choices[0].finish_reason) finish = chunk.choices[0].finish_reason;
      }
      if (chunk.usage) usage = chunk.usage;
    }
    assert.strictEqual(text, whole.choices[0].message.content);
    assert.strictEqual(finish, whole.choices[0].finish_reason);
    assert.ok(usage && usage.completion_tokens === whole.usage.completion_tokens, JSON.stringify(usage));
  });

  await check('stop sequences end the text and never leak', async () => {
    const full = await client.completions.create({ prompt: 'Once upon a time', max_tokens: 40, temperature: 0 });
    const r = await client.completions.create({ prompt: 'Once upon a time', max_tokens: 40, temperature: 0, stop: ['Lily'] });
    assert.strictEqual(r.choices[0].finish_reason, 'stop');
    assert.ok(!r.choices[0].text.includes('Lily'));
    assert.strictEqual(r.choices[0].text, full.choices[0].text.slice(0, full.choices[0].text.indexOf('Lily')));
    const s = await client.completions.create({ prompt: 'Once upon a time', max_tokens: 40, temperature: 0, stop: ['Lily'], stream: true });
    let text = '';
    for await (const c of s) text += c.choices[0] ? c.choices[0].text : '';
    assert.strictEqual(text, r.choices[0].text);
  });

  await check('n choices and cached prompt tokens in usage', async () => {
    const prompt = 'Once upon a time there was a little dog who liked to run in the park with his friends every day. ' +
                   'One day the dog saw a big red ball under a tree and';
    const r = await client.completions.create({ prompt, max_tokens: 5, n: 3, temperature: 0.8, seed: 1 });
    assert.strictEqual(r.choices.length, 3);
    assert.strictEqual(r.usage.completion_tokens, 15);
    const again = await client.completions.create({ prompt, max_tokens: 5 });
    assert.ok(again.usage.prompt_tokens_details.cached_tokens > 0, JSON.stringify(again.usage));
  });

  await check('per-request KV retention: same text under a large budget, evictions in usage and /metrics, bad settings 400', async () => {
    const prompt = 'Once upon a time';
    const plain = await client.completions.create({ prompt, max_tokens: 200, temperature: 0 });
    assert.strictEqual(plain.usage.kv_evicted_tokens, undefined);
    const big = await client.completions.create({ prompt, max_tokens: 200, temperature: 0, kv_retention: 'window', kv_budget: 256 });
    assert.strictEqual(big.choices[0].text, plain.choices[0].text);
    assert.strictEqual(big.usage.kv_evicted_tokens, 0);
    const small = await client.completions.create({ prompt, max_tokens: 200, temperature: 0, kv_retention: 'heavy-hitter', kv_budget_ratio: 0.25 });
    assert.ok(small.usage.kv_evicted_tokens > 100, JSON.stringify(small.usage));
    assert.strictEqual(small.usage.completion_tokens, 200);
    const m = (await request(srv.port, 'GET', '/metrics')).body;
    assert.ok(metricValue(m, 'gale:kv_evicted_tokens_total') >= small.usage.kv_evicted_tokens, m);
    assert.ok(metricValue(m, 'gale:kv_evictions_total') > 0);
    await assert.rejects(client.completions.create({ prompt, kv_budget: 64 }), (e) => e instanceof OpenAI.BadRequestError && /needs 'kv_retention'/.test(e.message));
    await assert.rejects(client.completions.create({ prompt, kv_retention: 'h2o', kv_budget: 64 }), OpenAI.BadRequestError);
    await assert.rejects(client.completions.create({ prompt, kv_retention: 'window' }), (e) => e instanceof OpenAI.BadRequestError && /exactly one/.test(e.message));
  });

  await check('logprobs: chat (top_logprobs) and completions (legacy shape), streamed and not', async () => {
    const chat = await client.chat.completions.create({ messages: [{ role: 'user', content: 'The dog' }], max_tokens: 6,
                                                        temperature: 0, logprobs: true, top_logprobs: 3 });
    const content = chat.choices[0].logprobs.content;
    assert.strictEqual(content.length, chat.usage.completion_tokens);
    for (const t of content) {
      assert.ok(t.logprob <= 0 && t.top_logprobs.length === 3);
      assert.strictEqual(t.top_logprobs[0].token, t.token);  // greedy: the most likely token
    }
    assert.strictEqual(content.map((t) => t.token).join(''), chat.choices[0].message.content);
    const comp = await client.completions.create({ prompt: 'Once upon a time', max_tokens: 5, temperature: 0, logprobs: 2 });
    const lp = comp.choices[0].logprobs;
    assert.strictEqual(lp.tokens.length, 5);
    assert.strictEqual(lp.tokens.join(''), comp.choices[0].text);
    assert.deepStrictEqual(lp.text_offset, lp.tokens.map((_, i) => lp.tokens.slice(0, i).join('').length));
    const s = await client.completions.create({ prompt: 'Once upon a time', max_tokens: 5, temperature: 0, logprobs: 2, stream: true });
    const streamed = [];
    for await (const c of s) if (c.choices[0] && c.choices[0].logprobs) streamed.push(...c.choices[0].logprobs.token_logprobs);
    assert.deepStrictEqual(streamed, lp.token_logprobs);
    await assert.rejects(client.chat.completions.create({ messages: [{ role: 'user', content: 'x' }], top_logprobs: 2 }), OpenAI.BadRequestError);
  });

  await check('errors surface as the client\'s typed errors', async () => {
    await assert.rejects(client.completions.create({ prompt: 'x', max_tokens: 0 }), OpenAI.BadRequestError);
    await assert.rejects(client.completions.create({ prompt: 'x', temperature: 7 }), OpenAI.BadRequestError);
    await assert.rejects(client.completions.create({ model: 'nope', prompt: 'x' }), OpenAI.NotFoundError);
    const long = 'Once upon a time '.repeat(400);
    await assert.rejects(client.completions.create({ prompt: long, max_tokens: 10 }), (e) => e instanceof OpenAI.BadRequestError && /exceeds the limit/.test(e.message));
    const t = await client.completions.create({ prompt: long, max_tokens: 10, truncate_prompt_tokens: 100 });
    assert.strictEqual(t.usage.prompt_tokens, 100);
  });

  await check('raw HTTP errors: malformed JSON, unknown field, 404, 405, 413', async () => {
    let r = await request(srv.port, 'POST', '/v1/completions', '{"prompt": ');
    assert.strictEqual(r.status, 400);
    assert.ok(JSON.parse(r.body).error.message.includes('not valid JSON'));
    r = await request(srv.port, 'POST', '/v1/chat/completions', JSON.stringify({ messages: [{ role: 'user', content: 'x' }], wat: 1 }));
    assert.strictEqual(r.status, 400);
    assert.strictEqual(JSON.parse(r.body).error.param, 'wat');
    r = await request(srv.port, 'GET', '/v2/nothing');
    assert.strictEqual(r.status, 404);
    r = await request(srv.port, 'GET', '/v1/completions');
    assert.strictEqual(r.status, 405);
    r = await request(srv.port, 'POST', '/v1/completions', 'x'.repeat(9 * 1024 * 1024)).catch((e) => ({ status: 413 }));
    assert.strictEqual(r.status, 413);
  });

  await check('random bodies and headers never take the server down', async () => {
    let seed = 12345;
    const rnd = (n) => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n; };
    const pieces = ['{', '}', '[', ']', '"prompt"', '"messages"', ':', ',', '"x"', '1e999', '-1', 'null', 'true',
                    '"max_tokens"', '"stream"', '"n"', '99999999999999999999', '"\\u0000"', '"\\ud800"', '{"role":"user"}'];
    for (let i = 0; i < 150; i++) {
      let body = '';
      for (let k = rnd(12); k > 0; k--) body += pieces[rnd(pieces.length)];
      const headers = rnd(3) === 0 ? { 'Content-Type': 'text/plain', 'X-Junk': 'a'.repeat(rnd(2000)) } : {};
      const route = rnd(2) ? '/v1/completions' : '/v1/chat/completions';
      const r = await request(srv.port, 'POST', route, body, headers).catch(() => ({ status: 0 }));
      assert.ok(r.status === 0 || (r.status >= 200 && r.status < 500), `status ${r.status} for ${body}`);
    }
    const h = await request(srv.port, 'GET', '/health');
    assert.strictEqual(h.status, 200);
  });

  await check('200 concurrent streams, a third hanging up: complete streams well-formed, blocks freed, memory flat', async () => {
    const round = async () => {
      const jobs = [];
      for (let i = 0; i < 200; i++) jobs.push(rawStream(srv.port, i % 3 === 0 ? 200 + (i * 37) % 900 : null));
      return Promise.all(jobs);
    };
    await round();  // warm the allocator
    const before = rssKb(srv.proc.pid);
    const results = await round();
    let complete = 0;
    for (const r of results) {
      if (r.cut) continue;
      complete++;
      assert.ok(r.data.includes('data: [DONE]'), 'stream without [DONE]');
      const events = r.data.split('\n').filter((l) => l.startsWith('data: {'));
      assert.ok(events.length >= 2);
      for (const e of events) JSON.parse(e.slice(6));
    }
    assert.ok(complete >= 120, `only ${complete} complete`);
    // Cancelled and finished requests have released their blocks.
    let m = '';
    for (let t = 0; t < 50; t++) {
      m = (await request(srv.port, 'GET', '/metrics')).body;
      if (metricValue(m, 'gale:kv_cache_usage_perc') === 0 && metricValue(m, 'gale:num_requests_running') === 0) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    assert.strictEqual(metricValue(m, 'gale:kv_cache_usage_perc'), 0, 'KV blocks still in use');
    const after = rssKb(srv.proc.pid);
    // Under AddressSanitizer freed memory sits in quarantine: the check means nothing there.
    if (!process.env.ASAN_OPTIONS) assert.ok(after < before * 1.25 + 20000, `RSS grew from ${before} to ${after} kB`);
    assert.ok(metricValue(m, 'gale:request_success_total{finished_reason="abort"}') > 0, 'no abort counted');
  });

  await check('a thousand idle connections need no more threads, and the server keeps serving', async () => {
    const threadsOf = (pid) => Number(fs.readFileSync(`/proc/${pid}/status`, 'utf8').match(/Threads:\s+(\d+)/)[1]);
    const before = threadsOf(srv.proc.pid);
    const socks = await Promise.all(Array.from({ length: 1000 }, () => new Promise((resolve) => {
      const s = net.connect(srv.port, '127.0.0.1', () => resolve(s));
      s.on('error', () => resolve(s));
    })));
    try {
      const h = await request(srv.port, 'GET', '/health');
      assert.strictEqual(h.status, 200);
      const r = await client.completions.create({ prompt: 'Once upon a time', max_tokens: 4 });
      assert.strictEqual(r.usage.completion_tokens, 4);
      assert.strictEqual(threadsOf(srv.proc.pid), before, 'the server started threads for connections');
    } finally {
      for (const s of socks) s.destroy();
    }
  });

  await check('metrics add up', async () => {
    const m = (await request(srv.port, 'GET', '/metrics')).body;
    const finished = sumMetric(m, 'gale:request_success_total{finished_reason="stop"}') +
                     sumMetric(m, 'gale:request_success_total{finished_reason="length"}') +
                     sumMetric(m, 'gale:request_success_total{finished_reason="abort"}');
    assert.strictEqual(finished, metricValue(m, 'gale:e2e_request_latency_seconds_count'));
    assert.ok(metricValue(m, 'gale:generation_tokens_total') > 0);
    assert.ok(metricValue(m, 'gale:prefix_cache_hits_total') > 0);
  });

  await check('--spec ngram: same greedy text (streamed and not), guesses counted in /metrics', async () => {
    const s4 = await startServer(['--spec', 'ngram', '--no-warmup']);
    try {
      const spec = new OpenAI({ baseURL: `http://127.0.0.1:${s4.port}/v1`, apiKey: 'x', maxRetries: 0 });
      for (const prompt of ['Once upon a time', 'Lily and Tom went to the park. Lily and Tom']) {
        const params = { prompt, max_tokens: 120, temperature: 0, ignore_eos: true };
        const want = (await client.completions.create(params)).choices[0].text;
        const got = (await spec.completions.create(params)).choices[0].text;
        assert.strictEqual(got, want);
        let streamed = '';
        for await (const c of await spec.completions.create({ ...params, stream: true })) streamed += c.choices[0].text;
        assert.strictEqual(streamed, want);
        // Seeded sampling gives the same text too.
        const sampled = { prompt, max_tokens: 60, temperature: 0.8, seed: 7 };
        assert.strictEqual((await spec.completions.create(sampled)).choices[0].text,
                           (await client.completions.create(sampled)).choices[0].text);
      }
      const m = (await request(s4.port, 'GET', '/metrics')).body;
      assert.ok(metricValue(m, 'gale:spec_decode_num_draft_tokens_total') > 0, 'no guesses verified');
      assert.ok(metricValue(m, 'gale:spec_decode_num_accepted_tokens_total') > 0, 'no guess accepted');
      assert.ok(metricValue(m, 'gale:spec_decode_num_drafts_total') > 0);
    } finally {
      s4.proc.kill('SIGTERM');
    }
  });

  await check('SIGTERM exits cleanly while a request is in flight', async () => {
    const pending = client.completions.create({ prompt: 'Once upon a time', max_tokens: 200, temperature: 0 });
    await new Promise((r) => setTimeout(r, 30));
    srv.proc.removeAllListeners('exit');  // the start-up listener treats any exit as a failure
    const exited = new Promise((resolve) => srv.proc.on('exit', (code) => resolve(code)));
    srv.proc.kill('SIGTERM');
    const r = await pending;  // finishes within the grace period
    assert.ok(r.choices[0].text.length > 0);
    const code = await Promise.race([exited, new Promise((r) => setTimeout(() => r('timeout'), 15000))]);
    assert.strictEqual(code, 0, 'server log:\n' + srv.log().slice(-3000));
  });

  await check('a full waiting queue answers 429 with Retry-After', async () => {
    const s3 = await startServer(['--max-batch-size', '1', '--max-waiting', '2', '--no-warmup']);
    try {
      const body = JSON.stringify({ prompt: 'Once upon a time', max_tokens: 300, ignore_eos: true });
      const all = await Promise.all(Array.from({ length: 12 }, () => request(s3.port, 'POST', '/v1/completions', body, { 'Content-Type': 'application/json' })));
      const limited = all.filter((r) => r.status === 429);
      assert.ok(limited.length > 0, 'no 429 among ' + all.map((r) => r.status).join(','));
      assert.strictEqual(limited[0].headers['retry-after'], '1');
      assert.strictEqual(JSON.parse(limited[0].body).error.type, 'rate_limit_error');
      assert.ok(all.some((r) => r.status === 200));
    } finally {
      s3.proc.kill('SIGTERM');
    }
  });

  await check('--api-key: 401 without it, typed AuthenticationError, works with it', async () => {
    const s2 = await startServer(['--api-key', 'sekrit', '--no-warmup']);
    try {
      const bad = new OpenAI({ baseURL: `http://127.0.0.1:${s2.port}/v1`, apiKey: 'wrong', maxRetries: 0 });
      await assert.rejects(bad.models.list(), OpenAI.AuthenticationError);
      const good = new OpenAI({ baseURL: `http://127.0.0.1:${s2.port}/v1`, apiKey: 'sekrit', maxRetries: 0 });
      const r = await good.completions.create({ prompt: 'Hi', max_tokens: 2 });
      assert.strictEqual(r.choices.length, 1);
      const h = await request(s2.port, 'GET', '/health');
      assert.strictEqual(h.status, 200);
    } finally {
      s2.proc.kill('SIGTERM');
    }
  });

  console.log(`${passes} passed, ${failures} failed`);
  process.exit(failures ? 1 : 0);
})().catch((e) => {
  console.log('FAIL', e);
  process.exit(1);
});
