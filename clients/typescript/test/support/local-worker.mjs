// A Node process of its own running the engine in process, for the tests that kill one or need
// a fresh environment:
//
//   node local-worker.mjs hang URL LEDGER WORKFLOW
//       delivers one call whose function writes its ledger line, prints SENT, and then waits
//       until it is killed: the kill lands after the effect and before its record.
//   node local-worker.mjs panic URL LEDGER WORKFLOW
//       (run with IDEMGATE_NODE_TEST_PANIC=after_call) delivers one call, then a read of the
//       store, and prints one JSON line: the outcome's label and the process still running.
//   node local-worker.mjs replay-panic URL LEDGER WORKFLOW
//       (run with IDEMGATE_NODE_TEST_PANIC=replay_from_memory) delivers one call, then the same
//       call again, which the engine answers from memory on the event loop's thread and panics
//       there; prints one JSON line: the first label, how the replay ended, and the process
//       still running.
//   node local-worker.mjs invoke-panic URL LEDGER WORKFLOW
//       (run with IDEMGATE_NODE_TEST_PANIC=invoke_polled) delivers one call, whose future panics
//       while the event loop polls it, before anything is claimed; prints one JSON line: how the
//       call ended and the process still running.
//   node local-worker.mjs lone URL LEDGER WORKFLOW
//       delivers one call and prints its label from the promise's callback, with nothing else
//       keeping the process alive (no timer, no open Local's recoverer, no close): the pending
//       call must keep it alive until it settles, and nothing must keep it alive after.
//
// Each function appends a line with its operation key to LEDGER (fsynced): the effects,
// counted on the effect's own side.

import { Local, Receipt } from 'idemgate/local';

import { FileLedger } from './local-support.mjs';

export const TENANT = 'acme';
export const ENVIRONMENT = 'multi';
/** The shortest lease a contract may have: a killed worker's claim is recoverable within a test. */
export const LEASE_SECONDS = 3;

/** A Local over `url` for the workers and the tests that settle what they left. */
export function open(url, recover = false) {
  return new Local(url, { tenant: TENANT, environment: ENVIRONMENT, recover, recoveryInterval: 0.2 });
}

/** The tool every worker registers: one ledger line per effect, a lookup that reads the ledger. */
export function register(local, ledger, { lookup = false, hang = false } = {}) {
  return local.tool(
    'rows.insert',
    {
      fingerprint: ['n'],
      leaseSeconds: LEASE_SECONDS,
      ...(lookup ? { lookup: (key) => (ledger.has(key) ? new Receipt(`row:${key}`, { found: true }) : null) } : {}),
    },
    async ({ n }, { idempotencyKey }) => {
      ledger.effect(idempotencyKey);
      if (hang) {
        process.stdout.write('SENT\n');
        await new Promise(() => setInterval(() => {}, 1000));
      }
      return new Receipt(`row:${idempotencyKey}`, { n });
    },
  );
}

async function main() {
  const [mode, url, ledgerPath, workflowId] = process.argv.slice(2);
  const ledger = new FileLedger(ledgerPath);
  const local = open(url);
  if (mode === 'hang') {
    const insert = register(local, ledger, { hang: true });
    await insert({ n: 1 }, { workflowId, stepId: 'insert' });
    throw new Error('the hanging call answered');
  }
  if (mode === 'panic') {
    const insert = register(local, ledger);
    const outcome = await insert({ n: 1 }, { workflowId, stepId: 'insert' });
    const again = await insert({ n: 1 }, { workflowId, stepId: 'insert' });
    const page = await local.operations({});
    process.stdout.write(
      `${JSON.stringify({ label: outcome.outcome, again: again.outcome, listed: page.operations.length, alive: true })}\n`,
    );
    await local.close();
    return;
  }
  if (mode === 'replay-panic') {
    const insert = register(local, ledger);
    const outcome = await insert({ n: 1 }, { workflowId, stepId: 'insert' });
    const again = await insert({ n: 1 }, { workflowId, stepId: 'insert' }).then(
      (o) => `answered ${o.outcome}`,
      (e) => `rejected ${e.constructor.name}: ${e.message}`,
    );
    process.stdout.write(`${JSON.stringify({ label: outcome.outcome, again, alive: true })}\n`);
    await local.close();
    return;
  }
  if (mode === 'invoke-panic') {
    const insert = register(local, ledger);
    const first = await insert({ n: 1 }, { workflowId, stepId: 'insert' }).then(
      (o) => `answered ${o.outcome}`,
      (e) => `rejected ${e.constructor.name}: ${e.message}`,
    );
    process.stdout.write(`${JSON.stringify({ first, alive: true })}\n`);
    await local.close();
    return;
  }
  if (mode === 'lone') {
    const insert = register(local, ledger);
    // Not awaited, and nothing after it: the process lives on the pending call alone.
    insert({ n: 1 }, { workflowId, stepId: 'insert' }).then((o) => process.stdout.write(`${o.outcome}\n`));
    return;
  }
  throw new Error(`local-worker: unknown mode ${mode}`);
}

if (import.meta.url === `file://${process.argv[1]}`) {
  main().catch((e) => {
    process.stderr.write(`${e.stack ?? e}\n`);
    process.exit(1);
  });
}
