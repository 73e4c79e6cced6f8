// idemgate/local's stores: the records a Node process writes are the gateway's records — read,
// listed and resolved by `idemgate serve` over the same SQLite file, replayed by a Python
// process on it — and PostgreSQL serves several Locals (hosts) at once. Effects are counted in
// ledgers the tools' functions write.

import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { homedir } from 'node:os';
import { dirname, join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { Client } from 'idemgate';
import { Local, Receipt } from 'idemgate/local';

import { startGateway } from './support/gateway.mjs';
import { FileLedger, Ledger, T, postgresDatabase, tempDir } from './support/local-support.mjs';

/** The tool both processes register: one ledger line per effect. */
function rowsInsert(local, ledger, options = {}) {
  return local.tool('rows.insert', { fingerprint: ['n'], ...options }, async ({ n }, { idempotencyKey }) => {
    ledger.effect(idempotencyKey, { n });
    return new Receipt(`row-${n}`, { n });
  });
}

test('records written in process are the gateway\'s: idemgate serve lists and reads them, and sees them resolved', T, async () => {
  const dir = tempDir();
  const local = new Local(`sqlite://${join(dir, 'gate.sqlite')}`, { tenant: 'ci', environment: 'ci', recover: false });
  const ledger = new Ledger();
  const insert = rowsInsert(local, ledger);
  const remove = local.tool('rows.delete', {}, async ({ n }, { idempotencyKey }) => {
    ledger.effect(idempotencyKey, { n });
    throw new Error('connection reset after the delete');
  });
  const applied = await insert({ n: 1 }, { workflowId: 'w1', stepId: 'insert' });
  const unknown = await remove({ n: 1 }, { workflowId: 'w1', stepId: 'delete' });
  assert.equal(applied.outcome, 'applied');
  assert.equal(unknown.outcome, 'unknown');

  const gate = await startGateway('http://127.0.0.1:9', { dir });
  try {
    const operator = new Client({ baseUrl: gate.url, token: gate.operatorToken });
    const listed = (await operator.operations({})).operations;
    assert.deepEqual(listed.map((o) => o.operationKey).sort(), [applied.operationKey, unknown.operationKey].sort());
    const queue = (await operator.operations({ status: 'unknown' })).operations;
    assert.deepEqual(queue.map((o) => o.operationKey), [unknown.operationKey]);
    const read = await operator.operation(applied.operationKey);
    assert.equal(read.recordStatus, 'applied');
    assert.equal(read.tool, 'rows.insert');
    assert.deepEqual(read.receipt, { reference: 'row-1', result: { n: 1 } });
    assert.deepEqual(read.events.slice(0, 3).map((e) => e.kind), ['proposed', 'validated', 'claimed']);
    // Resolved in process (the tool's home), the gateway reads the operator's finding.
    const resolved = await local.resolveApplied(unknown.operationKey, { effectReference: 'deleted-by-hand' });
    assert.ok(['applied', 'replayed'].includes(resolved.outcome), JSON.stringify(resolved.body));
    const settled = await operator.operation(unknown.operationKey);
    assert.equal(settled.recordStatus, 'applied');
    assert.equal(settled.effectReference, 'deleted-by-hand');
    assert.deepEqual((await operator.operations({ status: 'unknown' })).operations, []);
  } finally {
    await gate.stop();
  }
  // Back in process, the operator's resolution is what the next delivery replays.
  const after = await remove({ n: 1 }, { workflowId: 'w1', stepId: 'delete' });
  assert.equal(after.outcome, 'replayed');
  assert.equal(after.effectReference, 'deleted-by-hand');
  await local.close();
  assert.equal(ledger.effects.length, 2);
  assert.equal(ledger.count(applied.operationKey), 1);
  assert.equal(ledger.count(unknown.operationKey), 1);
});

const here = dirname(fileURLToPath(import.meta.url));
const pythonSource = join(here, '..', '..', 'python', 'src');
const python = process.env.IDEMGATE_PYTHON || join(homedir(), '.cache', 'idemgate-venv-clients', 'bin', 'python');

/** Why the Python package's engine cannot be run here, or null when it can. */
function pythonMissing() {
  if (!existsSync(python)) return `no Python at ${python} (set IDEMGATE_PYTHON)`;
  try {
    execFileSync(python, ['-c', 'import idemgate._native'], { env: { ...process.env, PYTHONPATH: pythonSource }, stdio: 'pipe' });
    return null;
  } catch {
    return `the Python package's extension is not built in ${pythonSource} (clients/python/ci builds it)`;
  }
}

const PYTHON_PROCESS = `
import json, os, sys
import idemgate
url, ledger = sys.argv[1], sys.argv[2]
local = idemgate.Local(url, tenant="ci", environment="ci", recover=False)

@local.tool("rows.insert", fingerprint=["n"])
def insert(n, *, idempotency_key):
    with open(ledger, "a") as f:
        f.write(idempotency_key + "\\n")
    return idemgate.Receipt(f"row-{n}", {"n": n})

labels = [insert.invoke({"n": 1}, workflow_id="w1", step_id="insert").label,
          insert.invoke({"n": 2}, workflow_id="w2", step_id="insert").label]
local.close()
print(json.dumps(labels))
`;

test('a Python process on the same SQLite file replays what Node applied, and the other way round', { ...T, skip: pythonMissing() ?? false }, async () => {
  const dir = tempDir();
  const url = `sqlite://${join(dir, 'shared.sqlite')}`;
  const ledger = new FileLedger(join(dir, 'ledger'));
  const local = new Local(url, { tenant: 'ci', environment: 'ci', recover: false });
  const insert = local.tool('rows.insert', { fingerprint: ['n'] }, async ({ n }, { idempotencyKey }) => {
    ledger.effect(idempotencyKey);
    return new Receipt(`row-${n}`, { n });
  });
  assert.equal((await insert({ n: 1 }, { workflowId: 'w1', stepId: 'insert' })).outcome, 'applied');
  const out = execFileSync(python, ['-c', PYTHON_PROCESS, url, ledger.path], {
    env: { ...process.env, PYTHONPATH: pythonSource },
    timeout: 60_000,
  });
  assert.deepEqual(JSON.parse(out.toString().trim().split('\n').pop()), ['replayed', 'applied']);
  const fromPython = await insert({ n: 2 }, { workflowId: 'w2', stepId: 'insert' });
  assert.equal(fromPython.outcome, 'replayed');
  assert.equal(fromPython.effectReference, 'row-2');
  await local.close();
  assert.equal(ledger.count('ci:ci:w1:insert'), 1);
  assert.equal(ledger.count('ci:ci:w2:insert'), 1);
});

test('PostgreSQL: two Locals (two hosts) deliver one step 8 times each, one effect', T, async (t) => {
  const db = postgresDatabase();
  if (db.skip) {
    t.skip(db.skip);
    console.log(`# skipped: ${db.skip}`);
    return;
  }
  const ledger = new Ledger();
  const hosts = [];
  try {
    for (let i = 0; i < 2; i += 1) {
      const local = new Local(db.url, { tenant: 'acme', environment: 'pg', recover: false });
      hosts.push(local);
      rowsInsert(local, ledger);
    }
    const deliveries = hosts.flatMap((local) =>
      Array.from({ length: 8 }, () => local.invoke('rows.insert', { n: 7 }, { workflowId: 'pg-run', stepId: 'insert' })),
    );
    const labels = (await Promise.all(deliveries)).map((o) => o.outcome);
    assert.equal(labels.filter((l) => l === 'applied').length, 1, labels.join());
    assert.ok(labels.every((l) => ['applied', 'replayed', 'in_flight'].includes(l)), labels.join());
    const again = await hosts[1].invoke('rows.insert', { n: 7 }, { workflowId: 'pg-run', stepId: 'insert' });
    assert.equal(again.outcome, 'replayed');
    assert.equal((await hosts[0].operations({ status: 'applied' })).operations.length, 1);
  } finally {
    for (const local of hosts) await local.close();
    db.drop();
  }
  assert.equal(ledger.effects.length, 1);
});

