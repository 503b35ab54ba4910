#!/usr/bin/env node
// KV retention quality vs memory: runs `gale eval ppl` (perplexity, KL divergence and top-1
// agreement against no retention) and `gale eval tasks` (greedy agreement with no retention) for
// every policy at budgets of 50%, 25% and 12.5%, and prints a markdown table and a text chart.
//   node scripts/retention-table.cjs [path/to/gale] [--synth]
// --synth adds a random-weight 4096-context model (written to a temporary file) on a text of
// twice the bundled eval text. Takes about a minute on two cores.
'use strict';
const fs = require('fs');
const path = require('path');
const { root, args, tempDir, run, json } = require('./gale-cli.cjs');

const withSynth = args.includes('--synth');
const policies = ['window', 'sink-window', 'heavy-hitter'];
const ratios = [0.5, 0.25, 0.125];
const tmp = tempDir('gale-retention-');

function evaluate(name, model, text, ctx, tasks) {
  const base = path.join(tmp, `${name}.logprobs`);
  const common = ['eval', 'ppl', '-f', text, ...(model ? ['-m', model] : []), ...(ctx ? ['--ctx', String(ctx)] : [])];
  const none = json([...common, '--save-logits', base]);
  const rows = [];
  for (const policy of policies) {
    for (const ratio of ratios) {
      const r = json([...common, '--kv-retention', policy, '--kv-budget-ratio', String(ratio), '--kl-base', base]);
      const row = { policy, ratio, budget: r.kv_budget, ppl: r.perplexity, kl: r.kl_mean, top1: r.top1_agreement };
      if (tasks) {
        const t = json(['eval', 'tasks', '-f', tasks, ...(model ? ['-m', model] : []), '--kv-retention', policy,
          '--kv-budget-ratio', String(ratio)]);
        let agree = 0, exact = 0, n = 0;
        for (const c of t.categories) {
          agree += c.token_agreement * c.tasks;
          exact += c.exact_match_rate * c.tasks;
          n += c.tasks;
        }
        row.taskAgree = agree / n;
        row.taskExact = exact / n;
        row.long = t.categories.find((c) => c.category === 'long');
      }
      rows.push(row);
    }
  }
  return { name, none, rows };
}

function table(res) {
  const hasTasks = res.rows[0].taskAgree !== undefined;
  let out = `**${res.name}** (no retention: perplexity ${res.none.perplexity.toFixed(4)} over ${res.none.scored} tokens)\n\n`;
  out += '| policy | budget | perplexity | vs none | KL mean | top-1 agreement |' +
    (hasTasks ? ' tasks: exact | tasks: tokens agreeing | long: tokens agreeing |' : '') + '\n';
  out += '|---|---|---|---|---|---|' + (hasTasks ? '---|---|---|' : '') + '\n';
  for (const r of res.rows) {
    const d = (100 * (r.ppl / res.none.perplexity - 1)).toFixed(2);
    out += `| ${r.policy} | ${r.ratio * 100}% (${r.budget}) | ${r.ppl.toFixed(4)} | ${d >= 0 ? '+' : ''}${d}% | ` +
      `${r.kl.toFixed(4)} | ${(100 * r.top1).toFixed(1)}% |` +
      (hasTasks ? ` ${(100 * r.taskExact).toFixed(0)}% | ${(100 * r.taskAgree).toFixed(0)}% | ` +
        `${(100 * r.long.token_agreement).toFixed(0)}% |` : '') + '\n';
  }
  return out;
}

// KL divergence against no retention, one bar per policy and budget.
function chart(res) {
  const max = Math.max(...res.rows.map((r) => r.kl));
  const width = 50;
  let out = `KL divergence vs no retention, ${res.name} (longer is worse; full bar = ${max.toFixed(4)})\n`;
  for (const ratio of ratios) {
    for (const policy of policies) {
      const r = res.rows.find((x) => x.policy === policy && x.ratio === ratio);
      const n = Math.max(1, Math.round((width * r.kl) / max));
      out += `${(ratio * 100 + '%').padStart(6)} ${policy.padEnd(13)} ${'#'.repeat(n).padEnd(width)} ${r.kl.toFixed(4)}\n`;
    }
  }
  return out;
}

const results = [evaluate('stories260K (ctx 512)', null, path.join(root, 'eval', 'stories260K-sampled.txt'), 0,
  path.join(root, 'eval', 'stories260K-tasks.jsonl'))];
if (withSynth) {
  const model = path.join(tmp, 'synth-long.gguf');
  run(['synth', '--shape', 'custom', '--dim', '256', '--layers', '4', '--heads', '4', '--kv-heads', '4',
    '--ffn', '768', '--vocab', '2048', '--ctx', '4096', '--type', 'f16', '-o', model]);
  const text = path.join(tmp, 'long.txt');
  const sampled = fs.readFileSync(path.join(root, 'eval', 'stories260K-sampled.txt'), 'utf8');
  fs.writeFileSync(text, sampled + sampled);
  results.push(evaluate('synthetic 4-layer random-weight model (ctx 4096)', model, text, 4096,
    path.join(root, 'eval', 'stories260K-tasks.jsonl')));
}
for (const res of results) process.stdout.write(table(res) + '\n```\n' + chart(res) + '```\n\n');
fs.rmSync(tmp, { recursive: true, force: true });
