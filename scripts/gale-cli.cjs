// Shared by the figure scripts (retention-table.cjs, quant-table.cjs): where gale is, a temporary
// folder, and running gale subcommands for their text or JSON output.
'use strict';
const { execFileSync } = require('child_process');
const fs = require('fs');
const os = require('os');
const path = require('path');

const root = path.resolve(__dirname, '..');
const args = process.argv.slice(2);
// The first argument that is not a --flag is the gale binary; build/gale otherwise.
const gale = args.find((a) => !a.startsWith('--')) || path.join(root, 'build', 'gale');

function tempDir(prefix) {
  return fs.mkdtempSync(path.join(os.tmpdir(), prefix));
}

// stdout of `gale argv...` (stderr hidden; a failure throws with it).
function run(argv) {
  return execFileSync(gale, argv, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'], maxBuffer: 1 << 26 });
}

// The parsed `-o json` output of `gale argv...`.
function json(argv) {
  return JSON.parse(run([...argv, '-o', 'json']));
}

module.exports = { root, args, gale, tempDir, run, json };
