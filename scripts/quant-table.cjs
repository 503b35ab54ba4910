#!/usr/bin/env node
// Every weight scheme and KV type against F32: size, prefill and decode tokens/s (gale bench),
// perplexity, KL divergence and top-1 agreement (gale eval ppl --kl-base) and greedy task
// agreement (gale eval tasks --base), as a markdown table.
//   node scripts/quant-table.cjs [path/to/gale] [--synth]
// Calibration for w8a8 / w4a16 / w4a8 is bench/story-prompt.txt, for the key statistics
// eval/stories260K-calib.jsonl (neither is the eval text); the default model only. --synth adds
// a random-weight model of the 110m shape (F32, about 0.5 GB in a temporary folder; several
// minutes). Speeds are medians of the bench's repetitions on a noisy machine.
'use strict';
const fs = require('fs');
const path = require('path');
const { root, args, tempDir, run, json } = require('./gale-cli.cjs');

const withSynth = args.includes('--synth');
const tmp = tempDir('gale-quant-');
const evalText = path.join(root, 'eval', 'stories260K-sampled.txt');
const tasks = path.join(root, 'eval', 'stories260K-tasks.jsonl');
const calib = path.join(root, 'bench', 'story-prompt.txt');
const kvCalib = path.join(root, 'eval', 'stories260K-calib.jsonl');

const schemes = [
  { name: 'f32', args: null },
  { name: 'q8_0', args: ['--type', 'q8_0'] },
  { name: 'w8a8 (SmoothQuant)', args: ['--type', 'w8a8', '--calib', calib] },
  { name: 'q4_0', args: ['--type', 'q4_0'] },
  { name: 'w4a16 g64 (round to nearest)', args: ['--type', 'w4a16', '--group-size', '64'] },
  { name: 'w4a16 g64 (AWQ)', args: ['--type', 'w4a16', '--group-size', '64', '--calib', calib] },
  { name: 'w4a16 g64 zero point (AWQ)', args: ['--type', 'w4a16', '--group-size', '64', '--zero-point', '--calib', calib] },
  { name: 'w4a16 g128 (AWQ)', args: ['--type', 'w4a16', '--group-size', '128', '--calib', calib] },
  { name: 'w4a8 g64 (AWQ)', args: ['--type', 'w4a8', '--group-size', '64', '--calib', calib] },
  { name: 'w4a8 g128 (AWQ)', args: ['--type', 'w4a8', '--group-size', '128', '--calib', calib] },
];
const kvTypes = [
  { name: 'f32 + KV f16', kv: ['--kv-type', 'f16'] },
  { name: 'f32 + KV int8', kv: ['--kv-type', 'int8'] },
  { name: 'f32 + KV K int8 / V int4', kv: ['--kv-type', 'int8', '--v-cache-dtype', 'int4'] },
  { name: 'f32 + KV int4', kv: ['--kv-type', 'int4'] },
  // The same model with calibrated key statistics (gale calibrate-kv on kvCalib): keys per channel.
  { name: 'f32 + KV int8, keys per channel', kv: ['--kv-type', 'int8'], channels: true },
  { name: 'f32 + KV K int8 / V int4, keys per channel', kv: ['--kv-type', 'int8', '--v-cache-dtype', 'int4'], channels: true },
  { name: 'f32 + KV int4, keys per channel', kv: ['--kv-type', 'int4'], channels: true },
];

function measure(label, base, pp, tg, reps, keyChannels) {
  const basePath = path.join(tmp, `${label}-base.lp`);
  const ctx = ['--ctx', '512'];
  const baseEval = json(['eval', 'ppl', '-m', base, '-f', evalText, ...ctx, '--save-logits', basePath]);
  const rows = [];
  const one = (name, model, kv) => {
    const evalKv = kv ? kv : [];
    const e = model === base && !kv ? baseEval
      : json(['eval', 'ppl', '-m', model, '-f', evalText, ...ctx, ...evalKv, '--kl-base', basePath]);
    const t = json(['eval', 'tasks', '-m', model, '--base', base, '-f', tasks, ...evalKv]);
    let agree = 0, exact = 0, n = 0;
    for (const c of t.categories) {
      agree += c.token_agreement * c.tasks;
      exact += c.exact_match_rate * c.tasks;
      n += c.tasks;
    }
    const b = json(['bench', '-m', model, '-p', String(pp), '-n', String(tg), '-r', String(reps), '--bandwidth', '50',
      ...(kv || ['--kv-type', 'f32'])]);
    const speed = (test) => b.find((x) => x.test === test).tokens_per_second;
    rows.push({ name, size: fs.statSync(model).size, pp: speed(`pp${pp}`), tg: speed(`tg${tg}`), ppl: e.perplexity,
      kl: e.kl_mean, top1: e.top1_agreement, exact: exact / n, agree: agree / n });
  };
  for (const s of schemes) {
    let model = base;
    if (s.args) {
      model = path.join(tmp, `${label}-${rows.length}.gguf`);
      run(['quantize', '-i', base, '-o', model, ...s.args]);
    }
    one(s.name, model, null);
    if (model !== base) fs.rmSync(model);
  }
  let kvModel = null;
  if (keyChannels) {
    kvModel = path.join(tmp, `${label}-kv.gguf`);
    run(['calibrate-kv', '-i', base, '-o', kvModel, '--calib', kvCalib]);
  }
  for (const k of kvTypes) {
    if (!k.channels) {
      one(k.name, base, k.kv);
    } else if (kvModel) {
      one(k.name, kvModel, k.kv);
    }
  }
  let out = `**${label}** (bench pp${pp} / tg${tg}, ${reps} repetitions; eval: ${baseEval.scored} tokens of ` +
    '`eval/stories260K-sampled.txt`; tasks: `eval/stories260K-tasks.jsonl` against the F32 model)\n\n';
  out += '| weights / KV | size MiB | prefill tok/s | decode tok/s | perplexity | KL mean | top-1 | tasks exact | task tokens agreeing |\n';
  out += '|---|---|---|---|---|---|---|---|---|\n';
  for (const r of rows) {
    out += `| ${r.name} | ${(r.size / 1048576).toFixed(2)} | ${r.pp.toFixed(0)} | ${r.tg.toFixed(0)} | ${r.ppl.toFixed(4)} | ` +
      `${r.kl === undefined ? '-' : r.kl.toFixed(5)} | ${r.top1 === undefined ? '-' : (100 * r.top1).toFixed(2) + '%'} | ` +
      `${(100 * r.exact).toFixed(0)}% | ${(100 * r.agree).toFixed(0)}% |\n`;
  }
  return out;
}

let out = measure('stories260K', path.join(root, 'models', 'stories260K.gguf'), 128, 128, 5, true);
if (withSynth) {
  const synth = path.join(tmp, 'synth-110m-f32.gguf');
  run(['synth', '--shape', '110m', '--type', 'f32', '-o', synth]);
  out += '\n' + measure('110m shape, random weights (F32 source)', synth, 64, 32, 3);
}
process.stdout.write(out);
fs.rmSync(tmp, { recursive: true, force: true });
