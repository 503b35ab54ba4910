// gale loadgen against a fake OpenAI server in this process that streams with known delays:
// first token after 150 ms, then 8 more 40 ms apart. Only what those delays guarantee is asserted,
// never a window of wall time (a busy machine can delay any event by any amount): no event can
// arrive before the server sent it, so TTFT >= 150 ms and the last event >= 470 ms after the start
// (less 1 ms: Node's timers can fire that much early relative to another clock); events arrive in
// order; the times are consistent (TTFT + the gaps = the last event <= end to end); and the
// summaries are the percentiles of the per-request values. Also: errors by kind, timeouts, trace
// arrival times (never early, in order), and the report files.
const http = require('http');
const { execFile } = require('child_process');
const fs = require('fs');
const os = require('os');
const path = require('path');
const assert = require('assert');

const gale = process.argv[2];
let mode = 'ok';
// Counters as gale's /metrics has them: each completion "verifies" 4 guesses and accepts 2.
let completions = 0;
const server = http.createServer((req, res) => {
  if (req.method === 'GET' && req.url === '/metrics') {
    res.writeHead(200, { 'Content-Type': 'text/plain; version=0.0.4' });
    return res.end(`# TYPE gale:spec_decode_num_drafts_total counter\ngale:spec_decode_num_drafts_total ${completions}\n` +
                   `gale:spec_decode_num_draft_tokens_total ${4 * completions}\n` +
                   `gale:spec_decode_num_accepted_tokens_total ${2 * completions}\n`);
  }
  if (req.method === 'GET') {
    res.writeHead(404);
    return res.end();
  }
  completions++;
  let body = '';
  req.on('data', (c) => (body += c));
  req.on('end', () => {
    if (mode === 'error' && Math.random() < 0.5) {
      res.writeHead(500, { 'Content-Type': 'application/json' });
      return res.end('{"error":{"message":"boom"}}');
    }
    res.writeHead(200, { 'Content-Type': 'text/event-stream' });
    const chunk = (t) => `data: ${JSON.stringify({ choices: [{ index: 0, text: t, finish_reason: null }] })}\n\n`;
    let n = 0;
    const send = () => {
      if (n < 9) {
        res.write(chunk('tok' + n));
        n++;
        setTimeout(send, mode === 'slow' ? 400 : 40);
      } else {
        res.write(`data: ${JSON.stringify({ choices: [], usage: { prompt_tokens: 5, completion_tokens: 9 } })}\n\n`);
        res.end('data: [DONE]\n\n');
      }
    };
    setTimeout(send, 150);
  });
});

function run(args) {
  return new Promise((resolve) => execFile(gale, args, { timeout: 60000 }, (err, stdout, stderr) => resolve({ err, stdout, stderr })));
}

server.listen(0, '127.0.0.1', async () => {
  const port = server.address().port;
  const out = fs.mkdtempSync(path.join(os.tmpdir(), 'lg-'));
  let failures = 0;
  const check = async (name, fn) => {
    try { await fn(); console.log('ok   ' + name); } catch (e) { failures++; console.log('FAIL ' + name + ': ' + (e.stack || e)); }
  };
  await check('timings match the fake server', async () => {
    const r = await run(['loadgen', '--url', `http://127.0.0.1:${port}/v1`, '--concurrency', '3', '--requests', '12', '--out', out]);
    assert.ifError(r.err);
    const j = JSON.parse(fs.readFileSync(path.join(out, 'results.json'), 'utf8'));
    assert.strictEqual(j.requests.length, 12);
    for (const q of j.requests) {
      assert.strictEqual(q.outcome, 'ok');
      assert.ok(q.ttft_s >= 0.149, `ttft ${q.ttft_s}`);
      assert.strictEqual(q.output_tokens, 9);
      assert.strictEqual(q.itl_s.length, 8);
      for (const g of q.itl_s) assert.ok(g >= 0, `itl ${g}`);
      const last = q.ttft_s + q.itl_s.reduce((a, b) => a + b, 0);
      assert.ok(last >= 0.469, `last event at ${last}`);
      assert.ok(last <= q.e2e_s + 1e-6, `last event at ${last}, end to end ${q.e2e_s}`);
    }
    // The summary's percentiles are those of the requests (nearest-rank or interpolated: between
    // the neighbouring order statistics).
    const s = j.summaries[0];
    const sorted = j.requests.map((q) => q.ttft_s).sort((a, b) => a - b);
    const mid = (sorted.length - 1) / 2;
    assert.ok(s.ttft_s.p50 >= sorted[Math.floor(mid)] - 1e-9 && s.ttft_s.p50 <= sorted[Math.ceil(mid)] + 1e-9,
              `p50 ${s.ttft_s.p50} of ${sorted}`);
    assert.ok(s.ttft_s.mean >= 0.149 && s.tpot_s.p50 > 0);
    // The server's counters over the phase: 12 completions, 48 guesses, 24 accepted.
    assert.strictEqual(s.server.spec_draft_tokens, 48);
    assert.strictEqual(s.server.spec_acceptance_rate, 0.5);
    assert.strictEqual(s.server.spec_mean_tokens_per_verify, 3);
    assert.ok(r.stdout.includes('speculative 24 of 48 guesses accepted (50.0%)'), r.stdout);
    const html = fs.readFileSync(path.join(out, 'report.html'), 'utf8');
    assert.ok((html.match(/<svg class="chart"/g) || []).length >= 3, 'charts missing');
  });
  await check('the HTML report renders in headless Chromium with its charts', async () => {
    const browser = ['chromium', 'chromium-browser', 'google-chrome'].find((b) => {
      try { require('child_process').execFileSync('which', [b], { stdio: 'ignore' }); return true; } catch (e) { return false; }
    });
    assert.ok(browser, 'no Chromium on PATH (scripts/install-deps.sh --test installs it)');
    const flags = ['--headless=new', '--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'];
    const url = 'file://' + path.join(out, 'report.html');
    const dom = await new Promise((resolve) => execFile(browser, [...flags, '--dump-dom', url], { timeout: 60000, maxBuffer: 64 << 20 },
                                                        (err, stdout) => resolve(stdout || '')));
    assert.ok((dom.match(/<svg class="chart"/g) || []).length >= 3, 'rendered DOM lacks the charts');
    assert.ok(/<polyline/.test(dom) && /<circle/.test(dom), 'charts have no lines or points');
    const png = path.join(out, 'report.png');
    await new Promise((resolve) => execFile(browser, [...flags, '--window-size=1200,1600', '--screenshot=' + png, url], { timeout: 60000 }, () => resolve()));
    assert.ok(fs.existsSync(png) && fs.statSync(png).size > 20000, 'screenshot missing or blank');
  });
  await check('ramp reports a knee and ramp charts', async () => {
    const r = await run(['loadgen', '--url', `http://127.0.0.1:${port}/v1`, '--ramp-concurrency', '1,2,4', '--requests', '4', '--out', out]);
    assert.ifError(r.err);
    assert.ok(/knee: concurrency/.test(r.stdout), r.stdout);
    const html = fs.readFileSync(path.join(out, 'report.html'), 'utf8');
    assert.ok(html.includes('class="knee"'));
  });
  await check('trace replay keeps the recorded arrival times, scaled by --speed', async () => {
    const trace = path.join(out, 'trace.jsonl');
    fs.writeFileSync(trace, [0, 0.4, 0.8].map((t, i) => JSON.stringify({ timestamp: 100 + t, input_length: 8, output_length: 4 + i })).join('\n') + '\n');
    const r = await run(['loadgen', '--url', `http://127.0.0.1:${port}/v1`, '--trace', trace, '--speed', '2', '--out', out]);
    assert.ifError(r.err);
    const reqs = JSON.parse(fs.readFileSync(path.join(out, 'results.json'), 'utf8')).requests;
    assert.strictEqual(reqs.length, 3);
    // Arrivals at 0, 0.2 and 0.4 s of the phase (0.4 s apart in the trace, at speed 2): never
    // early, and in the trace's order (the outputs ask for 4, 5, 6 tokens in that order).
    const byStart = [...reqs].sort((a, b) => a.start_s - b.start_s);
    byStart.forEach((q, i) => assert.ok(q.start_s >= 0.2 * i - 0.001, `request ${i} started at ${q.start_s}`));
    assert.deepStrictEqual(byStart.map((q) => q.output_len), [4, 5, 6]);
  });
  await check('errors by kind and timeouts are counted', async () => {
    mode = 'error';
    let r = await run(['loadgen', '--url', `http://127.0.0.1:${port}/v1`, '--rate', '50', '--requests', '20', '--out', out]);
    assert.ifError(r.err);
    let s = JSON.parse(fs.readFileSync(path.join(out, 'results.json'), 'utf8')).summaries[0];
    assert.ok(s.errors.http_error > 0 && s.errors.http_error < 20, JSON.stringify(s.errors));
    mode = 'slow';
    r = await run(['loadgen', '--url', `http://127.0.0.1:${port}/v1`, '--burst', '3', '--timeout', '0.5', '--out', out]);
    assert.ifError(r.err);
    s = JSON.parse(fs.readFileSync(path.join(out, 'results.json'), 'utf8')).summaries[0];
    assert.strictEqual(s.timeout_rate, 1);
    r = await run(['loadgen', '--url', 'http://127.0.0.1:1/v1', '--requests', '2']);
    assert.ok(/connect_error/.test(r.stdout), r.stdout);
    r = await run(['loadgen', '--url', 'ftp://x', '--requests', '2']);
    assert.ok(r.err && /--url/.test(r.stderr));
  });
  server.close();
  console.log(failures ? `${failures} failed` : 'all passed');
  process.exit(failures ? 1 : 0);
});
