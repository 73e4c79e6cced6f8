// Calls per second, side by side: idemgate's engine in this Node process (idemgate/local) and
// the TypeScript HTTP client through `idemgate serve`, each on its own fresh SQLite file, unique
// keys (claim, effect, record) and replays (one applied key again), at 1 and 8 concurrent calls.
// scripts/bench-local-ts runs it beside the Rust library path; release builds only.
//
//   node bench/local-calls.mjs [--seconds S] [--warmup S] [--clients 1,8] [--only inproc|http]
//       [--face NAME] [--package DIR]   (the in-process lines' name, `inproc` unless given; the
//       package's directory, this one unless given)
//
// The gateway is IDEMGATE_BIN (release) with contracts/tickets.create.yaml and the in-process
// sandbox downstream (it answers at once); the in-process tool is a no-op function returning
// its argument, declared as that contract declares its downstream (it deduplicates on the key
// and has a receipt lookup, so no dispatch marker), so that the three faces take the same path
// through the engine and the store. Every answer is checked (unique: applied, replay: replayed) and the effects are
// counted: the in-process function once per unique call, never for a replay. Prints one line
// per point: `inproc unique clients=8 calls=N seconds=S rps=R p50_ms=… p99_ms=…`.

import { spawn } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const argv = process.argv.slice(2);
const flag = (name, fallback) => {
  const i = argv.indexOf(name);
  return i >= 0 ? argv[i + 1] : fallback;
};
const seconds = Number(flag('--seconds', '5'));
const warmup = Number(flag('--warmup', '1'));
const clients = flag('--clients', '1,8').split(',').map(Number);
const only = flag('--only', null);
// The in-process lines' name, and the package they run: another build of the package (its
// dist/ and native/ built) is measured as `--package DIR --face before`.
const face = flag('--face', 'inproc');
const pkg = flag('--package', null);
const { Client } = await (pkg ? import(pathToFileURL(join(pkg, 'dist', 'index.js')).href) : import('idemgate'));
const { Local } = await (pkg ? import(pathToFileURL(join(pkg, 'dist', 'local.js')).href) : import('idemgate/local'));
const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..');
const dir = mkdtempSync(join(tmpdir(), 'idemgate-bench-ts-'));
process.on('exit', () => rmSync(dir, { recursive: true, force: true }));

/** Runs `c` callers of `call(worker, i)` for `s` seconds: the count and the latencies (ms). */
async function point(c, s, call) {
  const deadline = performance.now() + s * 1000;
  const latencies = [];
  const began = performance.now();
  await Promise.all(
    Array.from({ length: c }, async (_, worker) => {
      for (let i = 0; performance.now() < deadline; i += 1) {
        const t = performance.now();
        await call(worker, i);
        latencies.push(performance.now() - t);
      }
    }),
  );
  const elapsed = (performance.now() - began) / 1000;
  latencies.sort((a, b) => a - b);
  const at = (q) => latencies[Math.min(latencies.length - 1, Math.floor(q * latencies.length))] ?? 0;
  return { calls: latencies.length, elapsed, p50: at(0.5), p99: at(0.99) };
}

function report(face, mode, c, r) {
  console.log(
    `${face} ${mode} clients=${c} calls=${r.calls} seconds=${r.elapsed.toFixed(2)} rps=${(r.calls / r.elapsed).toFixed(1)} ` +
      `p50_ms=${r.p50.toFixed(3)} p99_ms=${r.p99.toFixed(3)}`,
  );
}

/** Both modes at each client count, `call(mode, tag, worker, i)` checked by the caller. */
async function measure(face, call) {
  for (const c of clients) {
    for (const mode of ['unique', 'replay']) {
      const tag = `${mode}-${c}-${randomBytes(3).toString('hex')}`;
      if (warmup > 0) await point(c, warmup, (w, i) => call(mode, `warm-${tag}`, w, i));
      report(face, mode, c, await point(c, seconds, (w, i) => call(mode, tag, w, i)));
    }
  }
}

async function inProcess() {
  const local = new Local(`sqlite://${join(dir, 'inproc.sqlite')}`, { tenant: 'bench', environment: 'bench' });
  let effects = 0;
  const shape = { fingerprint: ['n'], deduplicatesByKey: true, lookup: async () => null };
  const noop = local.tool('bench.noop', shape, async ({ n }) => {
    effects += 1;
    return { n };
  });
  let unique = 0;
  await noop({ n: 0 }, { workflowId: 'replay', stepId: 's' });
  effects = 0;
  await measure(face, async (mode, tag, w, i) => {
    const o =
      mode === 'unique'
        ? await noop({ n: i }, { workflowId: `${tag}-${w}-${i}`, stepId: 's' })
        : await noop({ n: 0 }, { workflowId: 'replay', stepId: 's' });
    if (o.outcome !== (mode === 'unique' ? 'applied' : 'replayed')) throw new Error(`${mode}: ${JSON.stringify(o.body)}`);
    if (mode === 'unique') unique += 1;
  });
  await local.close();
  if (effects !== unique) throw new Error(`effects ${effects} != unique calls ${unique}`);
  console.log(`${face} effects=${effects} unique_calls=${unique}`);
}

async function throughGateway() {
  const bin = process.env.IDEMGATE_BIN;
  if (!bin) throw new Error('set IDEMGATE_BIN to a release idemgate');
  const token = `idg_bench_${randomBytes(12).toString('hex')}`;
  const config = join(dir, 'gate.toml');
  writeFileSync(
    config,
    `listen = "127.0.0.1:0"
environment = "bench"
store = "sqlite://${join(dir, 'gate.sqlite')}"
contracts = ["${join(root, 'contracts', 'tickets.create.yaml')}"]
sandbox = true

[[tenants]]
name = "bench"
[[tenants.tokens]]
name = "agent"
sha256 = "${createHash('sha256').update(token).digest('hex')}"
role = "agent"
`,
  );
  const child = spawn(bin, ['serve', '--config', config], { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, RUST_LOG: 'warn' } });
  let output = '';
  child.stdout.on('data', (d) => (output += d));
  child.stderr.on('data', (d) => (output += d));
  try {
    const url = await new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`serve did not start:\n${output}`)), 20_000);
      child.stdout.on('data', () => {
        const m = output.match(/idemgate listening on (http:\/\/127\.0\.0\.1:\d+)/);
        if (m) {
          clearTimeout(timer);
          resolve(m[1]);
        }
      });
    });
    const client = new Client({ baseUrl: url, token });
    const ticket = { subject: 'bench', body: 'bench' };
    await client.invoke('tickets.create', ticket, { workflowId: 'replay', stepId: 's' });
    await measure('http', async (mode, tag, w, i) => {
      const o =
        mode === 'unique'
          ? await client.invoke('tickets.create', ticket, { workflowId: `${tag}-${w}-${i}`, stepId: 's' })
          : await client.invoke('tickets.create', ticket, { workflowId: 'replay', stepId: 's' });
      if (o.outcome !== (mode === 'unique' ? 'applied' : 'replayed')) throw new Error(`${mode}: ${JSON.stringify(o.body)}`);
    });
  } finally {
    child.kill('SIGTERM');
  }
}

if (only !== 'http') await inProcess();
if (only !== 'inproc') await throughGateway();
