// What the end-to-end server tests share: named checks that count passes and failures, and
// starting a `gale serve` process on a free port (resolved once it says it is ready).
const { spawn } = require('child_process');

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

// Prints the tally and exits with its status.
function finish() {
  console.log(`${passes} passed, ${failures} failed`);
  process.exit(failures ? 1 : 0);
}

// args: everything after `serve --port 0`; env: variables set beside this process's; resolves
// { proc, port, log() }.
function startServer(gale, args, { timeoutMs = 60000, env = {} } = {}) {
  return new Promise((resolve, reject) => {
    const proc = spawn(gale, ['serve', '--port', '0', ...args],
                       { stdio: ['ignore', 'ignore', 'pipe'], env: { ...process.env, ...env } });
    let log = '';
    let port = null;
    const timer = setTimeout(() => reject(new Error('server did not start: ' + log)), timeoutMs);
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

// Resolves once the server's log holds `text`: its stderr is a separate pipe, so a line written
// before an HTTP response can reach the test after the response does.
async function waitForLog(server, text, { timeoutMs = 5000 } = {}) {
  const end = Date.now() + timeoutMs;
  while (!server.log().includes(text)) {
    if (Date.now() > end) throw new Error(`the server log never said: ${text}\n${server.log().slice(-3000)}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

module.exports = { check, finish, startServer, waitForLog };
