// idemgate/local: the engine in this process, each scenario counted on the effect's side — a
// ledger the guarded function writes — separately from the outcomes it answers.

import assert from 'node:assert/strict';
import { AsyncLocalStorage } from 'node:async_hooks';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';

import {
  IdemgateError,
  InvalidIdentityError,
  Local,
  MissingIdentityError,
  NotSent,
  Receipt,
  Refused,
  UnknownToolError,
  step,
  workflow,
} from 'idemgate/local';

import { FileLedger, Ledger, T, lockSqlite, sqliteStore, tempDir, worker } from './support/local-support.mjs';
import { open, register } from './support/local-worker.mjs';

const opened = [];
/** A Local over `url` (a fresh SQLite store), closed after the file's tests. */
function local(options = {}, url = sqliteStore()) {
  const l = new Local(url, { tenant: 'acme', environment: 'test', recover: false, ...options });
  opened.push(l);
  return l;
}
after(async () => {
  for (const l of opened) await l.close();
});

/** A refunds tool over `ledger`: one ledger entry per effect, `behave` may throw first. */
function refunds(l, ledger, options = {}, behave = () => {}) {
  return l.tool('refunds.issue', { fingerprint: ['order_id', 'amount'], ...options }, async (args, { idempotencyKey }) => {
    ledger.calls += 1;
    await behave(args, idempotencyKey, ledger.calls);
    ledger.effect(idempotencyKey, args);
    return new Receipt(`re_${ledger.effects.length}`, { status: 'succeeded', amount: args.amount });
  });
}

describe('a tool in process', () => {
  test('applies once and replays the stored result; the function runs once', T, async () => {
    const l = local();
    const ledger = new Ledger();
    const issue = refunds(l, ledger);
    const first = await workflow('run-1', () => step('refund', () => issue({ order_id: 'pi_42', amount: 1200 })));
    assert.equal(first.outcome, 'applied');
    assert.equal(first.operationKey, 'acme:test:run-1:refund');
    assert.equal(first.effectReference, 're_1');
    assert.deepEqual(first.result, { status: 'succeeded', amount: 1200 });
    const again = await issue({ order_id: 'pi_42', amount: 1200 }, { workflowId: 'run-1', stepId: 'refund' });
    assert.equal(again.outcome, 'replayed');
    assert.equal(again.effectReference, 're_1');
    assert.deepEqual(again.result, first.result);
    const third = await l.invoke('refunds.issue', { order_id: 'pi_42', amount: 1200 }, { workflowId: 'run-1', stepId: 'refund' });
    assert.equal(third.outcome, 'replayed');
    assert.equal(ledger.calls, 1);
    assert.equal(ledger.count('acme:test:run-1:refund'), 1);
  });

  test('the function receives the operation key and the caller\'s async context', T, async () => {
    const l = local();
    const mine = new AsyncLocalStorage();
    const seen = [];
    const send = l.tool('mail.send', {}, async (args, { idempotencyKey }) => {
      seen.push({ key: idempotencyKey, request: mine.getStore(), args });
      return { sent: true };
    });
    const outcome = await mine.run('request-7', () => workflow('run-2', () => step('mail', () => send({ to: 'a@b' }))));
    assert.equal(outcome.outcome, 'applied');
    // A plain JSON result is kept; the reference is the operation key.
    assert.deepEqual(outcome.result, { sent: true });
    assert.equal(outcome.effectReference, 'acme:test:run-2:mail');
    assert.deepEqual(seen, [{ key: 'acme:test:run-2:mail', request: 'request-7', args: { to: 'a@b' } }]);
  });

  test('changed arguments under the same step are rejected, never a second effect', T, async () => {
    const l = local();
    const ledger = new Ledger();
    const issue = refunds(l, ledger);
    const ids = { workflowId: 'run-3', stepId: 'refund' };
    assert.equal((await issue({ order_id: 'pi_1', amount: 100 }, ids)).outcome, 'applied');
    const changed = await issue({ order_id: 'pi_1', amount: 999 }, ids);
    assert.equal(changed.outcome, 'rejected');
    assert.equal(changed.code, 'idempotency_key_reused_with_different_request');
    assert.equal(changed.safeToRepeat, false);
    assert.equal(ledger.calls, 1);
    assert.equal(ledger.effects.length, 1);
  });

  test('NotSent releases the claim: the next delivery runs the function and applies once', T, async () => {
    const l = local();
    const ledger = new Ledger();
    const issue = refunds(l, ledger, {}, (_args, _key, call) => {
      if (call === 1) throw new NotSent('the payment service refused the connection', { retryAfter: 2 });
    });
    const ids = { workflowId: 'run-4', stepId: 'refund' };
    const first = await issue({ order_id: 'pi_2', amount: 5 }, ids);
    assert.equal(first.outcome, 'rejected');
    assert.equal(first.safeToRepeat, true);
    assert.match(first.message, /refused the connection/);
    assert.equal(ledger.effects.length, 0);
    const second = await issue({ order_id: 'pi_2', amount: 5 }, ids);
    assert.equal(second.outcome, 'applied');
    assert.equal(ledger.calls, 2);
    assert.equal(ledger.effects.length, 1);
  });

  test('Refused is recorded and replayed without calling the function again', T, async () => {
    const l = local();
    const ledger = new Ledger();
    const issue = refunds(l, ledger, {}, () => {
      throw new Refused('card_declined', 'the card was declined');
    });
    const ids = { workflowId: 'run-5', stepId: 'refund' };
    const first = await issue({ order_id: 'pi_3', amount: 5 }, ids);
    assert.equal(first.outcome, 'rejected');
    assert.equal(first.code, 'downstream_rejected');
    assert.match(first.message, /card_declined: the card was declined/);
    const again = await issue({ order_id: 'pi_3', amount: 5 }, ids);
    assert.equal(again.outcome, 'rejected');
    assert.equal(again.code, 'downstream_rejected');
    assert.equal(ledger.calls, 1);
    assert.equal(ledger.effects.length, 0);
  });

  test('any other throw is unknown and never called again', T, async () => {
    const l = local();
    const ledger = new Ledger();
    const issue = refunds(l, ledger, {}, (args, key) => {
      // The effect happens, then the answer is lost.
      ledger.effect(key, args);
      throw new Error('socket hang up');
    });
    const ids = { workflowId: 'run-6', stepId: 'refund' };
    const first = await issue({ order_id: 'pi_4', amount: 5 }, ids);
    assert.equal(first.outcome, 'unknown');
    assert.equal(first.safeToRepeat, false);
    assert.equal(first.nextAction, 'reconcile');
    const again = await issue({ order_id: 'pi_4', amount: 5 }, ids);
    assert.equal(again.outcome, 'unknown');
    assert.equal(ledger.calls, 1);
    assert.equal(ledger.effects.length, 1);
    // The exception's class and message are the operation's evidence.
    const operation = await l.operation(first.operationKey);
    assert.equal(operation.recordStatus, 'unknown');
    assert.ok(operation.events.some((e) => (e.detail ?? '').includes('Error: socket hang up')), JSON.stringify(operation.events));
  });

  test('a throw after the effect is settled applied through the lookup', T, async () => {
    const l = local();
    const ledger = new Ledger();
    const lookup = (key) => (ledger.count(key) ? new Receipt(`found:${key}`, { via: 'lookup' }) : null);
    const issue = refunds(l, ledger, { lookup }, (args, key) => {
      ledger.effect(key, args);
      throw new TypeError('fetch failed');
    });
    const ids = { workflowId: 'run-7', stepId: 'refund' };
    const first = await issue({ order_id: 'pi_5', amount: 5 }, ids);
    assert.equal(first.outcome, 'applied');
    assert.equal(first.effectReference, 'found:acme:test:run-7:refund');
    assert.deepEqual(first.result, { via: 'lookup' });
    assert.equal((await issue({ order_id: 'pi_5', amount: 5 }, ids)).outcome, 'replayed');
    assert.equal(ledger.calls, 1);
    assert.equal(ledger.effects.length, 1);
  });

  test('a function past its timeout is unknown; its late answer never makes a second call', T, async () => {
    const l = local();
    const ledger = new Ledger();
    let finished;
    const done = new Promise((r) => {
      finished = r;
    });
    const issue = refunds(l, ledger, { timeoutMs: 300 }, async () => {
      await new Promise((r) => setTimeout(r, 1200));
      finished();
    });
    const ids = { workflowId: 'run-8', stepId: 'refund' };
    const started = Date.now();
    const first = await issue({ order_id: 'pi_6', amount: 5 }, ids);
    assert.equal(first.outcome, 'unknown');
    assert.ok(Date.now() - started < 1100, 'the timeout did not cut the wait');
    await done;
    const again = await issue({ order_id: 'pi_6', amount: 5 }, ids);
    assert.equal(again.outcome, 'unknown');
    assert.equal(ledger.calls, 1);
    // The late function did its effect once; nothing ran it again.
    assert.equal(ledger.effects.length, 1);
  });

  test('a missing identity is an error: nothing recorded, nothing called', T, async () => {
    const l = local();
    const ledger = new Ledger();
    const issue = refunds(l, ledger);
    await assert.rejects(issue({ order_id: 'pi_7', amount: 5 }), MissingIdentityError);
    await assert.rejects(workflow('run-9', () => issue({ order_id: 'pi_7', amount: 5 })), MissingIdentityError);
    await assert.rejects(step('refund', () => issue({ order_id: 'pi_7', amount: 5 })), MissingIdentityError);
    await assert.rejects(issue({ order_id: 'pi_7', amount: 5 }, { workflowId: 'run-9' }), InvalidIdentityError);
    assert.throws(() => workflow('a:b', () => 1), InvalidIdentityError);
    await assert.rejects(l.invoke('nope', {}, { workflowId: 'w', stepId: 's' }), UnknownToolError);
    assert.equal(ledger.calls, 0);
    assert.deepEqual((await l.operations()).operations, []);
  });

  test('16 concurrent invocations of one step make one effect', T, async () => {
    const l = local();
    const ledger = new Ledger();
    const issue = refunds(l, ledger, {}, () => new Promise((r) => setTimeout(r, 50)));
    const ids = { workflowId: 'run-10', stepId: 'refund' };
    const outcomes = await Promise.all(Array.from({ length: 16 }, () => issue({ order_id: 'pi_8', amount: 5 }, ids)));
    const labels = outcomes.map((o) => o.outcome);
    assert.equal(labels.filter((x) => x === 'applied').length, 1, labels.join());
    assert.ok(labels.every((x) => ['applied', 'replayed', 'in_flight'].includes(x)), labels.join());
    assert.equal(ledger.calls, 1);
    assert.equal(ledger.effects.length, 1);
  });

  test('the event loop runs while the engine waits on the store and on the function', T, async () => {
    const l = local();
    const ledger = new Ledger();
    const issue = refunds(l, ledger, {}, () => new Promise((r) => setTimeout(r, 200)));
    let ticks = 0;
    const timer = setInterval(() => {
      ticks += 1;
    }, 10);
    try {
      const outcomes = await Promise.all(
        Array.from({ length: 8 }, (_, i) => issue({ order_id: `pi_${i}`, amount: 1 }, { workflowId: 'run-11', stepId: `s${i}` })),
      );
      assert.ok(outcomes.every((o) => o.outcome === 'applied'));
    } finally {
      clearInterval(timer);
    }
    // 200 ms of waiting at 10 ms a tick: a blocked loop would tick once or never.
    assert.ok(ticks >= 5, `only ${ticks} ticks while 8 calls waited`);
    assert.equal(ledger.effects.length, 8);
  });

  test('the event loop runs while many unique calls wait on a store another process locked', T, async () => {
    const url = sqliteStore();
    const l = local({}, url);
    const ledger = new Ledger();
    const issue = refunds(l, ledger);
    // A replay first, so that the memory-only path is warm and answers on the loop's thread.
    await issue({ order_id: 'pi_0', amount: 1 }, { workflowId: 'run-12', stepId: 'warm' });
    const lock = await lockSqlite(url.slice('sqlite://'.length));
    let ticks = 0;
    const timer = setInterval(() => {
      ticks += 1;
    }, 10);
    let settled = 0;
    let calls;
    try {
      calls = Array.from({ length: 32 }, (_, i) =>
        issue({ order_id: `pi_${i}`, amount: 1 }, { workflowId: 'run-12', stepId: `s${i}` }).finally(() => {
          settled += 1;
        }),
      );
      const replay = await issue({ order_id: 'pi_0', amount: 1 }, { workflowId: 'run-12', stepId: 'warm' });
      assert.equal(replay.outcome, 'replayed');
      await new Promise((r) => setTimeout(r, 400));
      // Every claim needs the write lock: none can have been answered while it is held.
      assert.equal(settled, 0, 'a call was answered while the store was locked');
    } finally {
      lock.release();
      clearInterval(timer);
    }
    // 400 ms at 10 ms a tick: a loop blocked on the store would tick once or never.
    assert.ok(ticks >= 10, `only ${ticks} ticks while 32 calls waited on the store`);
    const outcomes = await Promise.all(calls);
    assert.ok(outcomes.every((o) => o.outcome === 'applied'), outcomes.map((o) => o.outcome).join());
    assert.equal(ledger.effects.length, 33);
  });

  test('the operator reads, lists and resolves what the engine recorded', T, async () => {
    const l = local();
    const ledger = new Ledger();
    const issue = refunds(l, ledger, {}, (args, key) => {
      ledger.effect(key, args);
      throw new Error('connection reset');
    });
    const ids = { workflowId: 'run-12', stepId: 'refund' };
    const unknown = await issue({ order_id: 'pi_9', amount: 5 }, ids);
    assert.equal(unknown.outcome, 'unknown');
    const queue = await l.operations({ status: 'unknown' });
    assert.deepEqual(queue.operations.map((o) => o.operationKey), [unknown.operationKey]);
    assert.equal(queue.operations[0].tool, 'refunds.issue');
    const resolved = await l.resolveApplied(unknown.operationKey, { effectReference: 're_manual', result: { by: 'hand' } });
    // The operator's resolution answers the operation as it now stands: the stored receipt.
    assert.ok(['applied', 'replayed'].includes(resolved.outcome), resolved.outcome);
    assert.equal(resolved.effectReference, 're_manual');
    const after = await issue({ order_id: 'pi_9', amount: 5 }, ids);
    assert.equal(after.outcome, 'replayed');
    assert.equal(after.effectReference, 're_manual');
    const read = await l.operation(unknown.operationKey);
    assert.equal(read.recordStatus, 'applied');
    assert.deepEqual(read.receipt, { reference: 're_manual', result: { by: 'hand' } });
    assert.equal(await l.operation('acme:test:nope:nope'), null);
    const missing = await l.reconcile('acme:test:nope:nope');
    assert.equal(missing.outcome, 'rejected');
    assert.equal(missing.code, 'not_found');
    assert.equal(ledger.calls, 1);
    assert.equal(ledger.effects.length, 1);
  });

  test('approval: the function runs once after an operator approves, never after a denial', T, async () => {
    const l = local();
    const ledger = new Ledger();
    const issue = refunds(l, ledger, { approval: { amount: [5000] } });
    const held = await issue({ order_id: 'pi_10', amount: 5000 }, { workflowId: 'run-13', stepId: 'refund' });
    assert.equal(held.outcome, 'in_flight');
    assert.equal(held.awaitingApproval, true);
    assert.equal(ledger.calls, 0);
    const approved = await l.approve(held.operationKey, {}, { reason: 'checked the order' });
    assert.ok(['applied', 'in_flight', 'replayed'].includes(approved.outcome), JSON.stringify(approved.body));
    const deadline = Date.now() + 10_000;
    let after;
    do {
      after = await issue({ order_id: 'pi_10', amount: 5000 }, { workflowId: 'run-13', stepId: 'refund', wait: 2 });
    } while (after.outcome === 'in_flight' && Date.now() < deadline);
    assert.ok(['applied', 'replayed'].includes(after.outcome), JSON.stringify(after.body));
    assert.equal(ledger.calls, 1);

    const denied = await issue({ order_id: 'pi_11', amount: 5000 }, { workflowId: 'run-14', stepId: 'refund' });
    assert.equal((await l.deny(denied.operationKey, { reason: 'not eligible' })).outcome, 'rejected');
    const replay = await issue({ order_id: 'pi_11', amount: 5000 }, { workflowId: 'run-14', stepId: 'refund' });
    assert.equal(replay.outcome, 'rejected');
    assert.equal(replay.code, 'approval_denied');
    // Below the threshold, no approval is asked.
    assert.equal((await issue({ order_id: 'pi_12', amount: 10 }, { workflowId: 'run-15', stepId: 'refund' })).outcome, 'applied');
    assert.equal(ledger.calls, 2);
    assert.equal(ledger.effects.length, 2);
  });

  test('authorize is asked before the effect and before every replay; a denial or a throw runs nothing', T, async () => {
    const l = local();
    const ledger = new Ledger();
    const asked = [];
    let allow = true;
    const issue = refunds(l, ledger, {
      authorize: (request) => {
        asked.push([request.stage, request.operationKey, request.actor, request.fingerprint.startsWith('sha256:')]);
        if (allow === 'throw') throw new Error('the policy service is down');
        return allow ? true : 'refunds are frozen for this account';
      },
    });
    const ids = { workflowId: 'run-16', stepId: 'refund' };
    assert.equal((await issue({ order_id: 'pi_13', amount: 5 }, ids)).outcome, 'applied');
    allow = false;
    const denied = await issue({ order_id: 'pi_13', amount: 5 }, ids);
    assert.equal(denied.outcome, 'rejected');
    assert.equal(denied.code, 'forbidden');
    assert.match(denied.message, /refunds are frozen/);
    const fresh = await issue({ order_id: 'pi_14', amount: 5 }, { workflowId: 'run-17', stepId: 'refund' });
    assert.equal(fresh.outcome, 'rejected');
    allow = 'throw';
    const closed = await issue({ order_id: 'pi_15', amount: 5 }, { workflowId: 'run-18', stepId: 'refund' });
    assert.equal(closed.outcome, 'rejected');
    assert.equal(closed.code, 'authorization_unavailable');
    assert.deepEqual(asked.slice(0, 2), [
      ['before_effect', 'acme:test:run-16:refund', 'local', true],
      ['before_replay', 'acme:test:run-16:refund', 'local', true],
    ]);
    assert.equal(ledger.calls, 1);
    assert.equal(ledger.effects.length, 1);
  });

  test('bad input is refused with a message naming what is wrong, before anything is stored', T, async () => {
    assert.throws(() => new Local('mysql://x'), /sqlite:\/\/PATH or postgres/);
    assert.throws(() => new Local(sqliteStore(), { tenant: 'a:b' }), /tenant/);
    const l = local();
    const ledger = new Ledger();
    assert.throws(() => l.tool('x', { effectClass: 'sometimes' }, () => 1), /effectClass is one of/);
    assert.throws(() => l.tool('x', { fingerprint: ['nope'], inputSchema: { type: 'object', properties: { a: {} } } }, () => 1), /request_fingerprint\.fields.*nope/);
    assert.throws(() => l.tool('x', { leaseSeconds: 1 }, () => 1), /lease_seconds/);
    assert.throws(() => l.tool('x', { contract: join(tempDir(), 'missing.yaml') }, () => 1), /missing\.yaml/);
    const issue = refunds(l, ledger);
    assert.throws(() => refunds(l, ledger), /already registered/);
    await assert.rejects(issue({ order_id: 1n, amount: 5 }, { workflowId: 'w', stepId: 's' }), /not JSON/);
    await assert.rejects(l.operations({ status: 'done' }), /status is one of/);
    assert.equal(ledger.calls, 0);
    assert.deepEqual((await l.operations()).operations, []);
    await l.close();
    await assert.rejects(issue({ order_id: 'x', amount: 5 }, { workflowId: 'w', stepId: 's' }), IdemgateError);
  });
});

describe('processes', () => {
  /** A worker whose function wrote its ledger line and was SIGKILLed before its record. */
  async function killedAfterTheEffect(store, ledger, workflowId) {
    const w = worker(['hang', store, ledger.path, workflowId]);
    try {
      assert.equal(await w.line(30_000), 'SENT');
    } finally {
      w.child.kill('SIGKILL');
    }
    assert.deepEqual(await w.exited, { code: null, signal: 'SIGKILL' });
    const key = `acme:multi:${workflowId}:insert`;
    assert.equal(ledger.count(key), 1);
    return key;
  }

  /** Delivers again while the dead worker's lease holds (in flight), for at most 20 s. */
  async function deliverUntilSettled(insert, workflowId) {
    const deadline = Date.now() + 20_000;
    for (;;) {
      const outcome = await insert({ n: 1 }, { workflowId, stepId: 'insert' });
      if (outcome.outcome !== 'in_flight' || Date.now() > deadline) return outcome;
      await new Promise((r) => setTimeout(r, 300));
    }
  }

  test('a process killed after the effect is settled by the next delivery through the lookup', T, async () => {
    const store = sqliteStore();
    const ledger = new FileLedger(join(tempDir(), 'ledger'));
    const key = await killedAfterTheEffect(store, ledger, 'killed-1');
    const l = open(store);
    try {
      const insert = register(l, ledger, { lookup: true });
      const outcome = await deliverUntilSettled(insert, 'killed-1');
      assert.ok(['applied', 'replayed'].includes(outcome.outcome), JSON.stringify(outcome.body));
      assert.equal(outcome.effectReference, `row:${key}`);
      assert.equal((await insert({ n: 1 }, { workflowId: 'killed-1', stepId: 'insert' })).outcome, 'replayed');
    } finally {
      await l.close();
    }
    assert.equal(ledger.count(key), 1);
  });

  test('a process killed after the effect, without a lookup, ends unknown: never a second effect', T, async () => {
    const store = sqliteStore();
    const ledger = new FileLedger(join(tempDir(), 'ledger'));
    const key = await killedAfterTheEffect(store, ledger, 'killed-2');
    const l = open(store);
    try {
      const insert = register(l, ledger);
      const outcome = await deliverUntilSettled(insert, 'killed-2');
      assert.equal(outcome.outcome, 'unknown', JSON.stringify(outcome.body));
      const queue = await l.operations({ status: 'unknown' });
      assert.deepEqual(queue.operations.map((o) => o.operationKey), [key]);
    } finally {
      await l.close();
    }
    assert.equal(ledger.count(key), 1);
  });

  test('a panic on the memory-only replay path rejects the call and never crashes the process', T, async () => {
    const store = sqliteStore();
    const ledger = new FileLedger(join(tempDir(), 'ledger'));
    const w = worker(['replay-panic', store, ledger.path, 'replay-panicked'], { IDEMGATE_NODE_TEST_PANIC: 'replay_from_memory' });
    const line = JSON.parse(await w.line(30_000));
    assert.deepEqual(await w.exited, { code: 0, signal: null }, w.stderr());
    assert.equal(line.label, 'applied');
    assert.match(line.again, /^rejected IdemgateError: .*failed internally: IDEMGATE_NODE_TEST_PANIC=replay_from_memory/);
    assert.equal(line.alive, true);
    assert.equal(ledger.count('acme:multi:replay-panicked:insert'), 1);
  });

  test('a panic while the event loop polls a call rejects it, never crashes the process, and loses nothing', T, async () => {
    const store = sqliteStore();
    const ledger = new FileLedger(join(tempDir(), 'ledger'));
    const w = worker(['invoke-panic', store, ledger.path, 'poll-panicked'], { IDEMGATE_NODE_TEST_PANIC: 'invoke_polled' });
    const line = JSON.parse(await w.line(30_000));
    assert.deepEqual(await w.exited, { code: 0, signal: null }, w.stderr());
    assert.match(line.first, /^rejected IdemgateError: .*failed internally: IDEMGATE_NODE_TEST_PANIC=invoke_polled/);
    assert.equal(line.alive, true);
    // It panicked before the claim: nothing was stored or called, and the next delivery applies.
    assert.equal(ledger.count('acme:multi:poll-panicked:insert'), 0);
    const l = open(store);
    try {
      const insert = register(l, ledger);
      const outcome = await insert({ n: 1 }, { workflowId: 'poll-panicked', stepId: 'insert' });
      assert.equal(outcome.outcome, 'applied');
    } finally {
      await l.close();
    }
    assert.equal(ledger.count('acme:multi:poll-panicked:insert'), 1);
  });

  test('a pending call keeps Node alive until it settles, and nothing of the engine keeps it alive after', T, async () => {
    const store = sqliteStore();
    const ledger = new FileLedger(join(tempDir(), 'ledger'));
    const w = worker(['lone', store, ledger.path, 'lone']);
    // Exited on its own (a kept reference would hang it past the test's timeout) after printing.
    assert.deepEqual(await w.exited, { code: 0, signal: null }, w.stderr());
    assert.equal(await w.line(1_000), 'applied');
    assert.equal(ledger.count('acme:multi:lone:insert'), 1);
  });

  test('a panic in the engine around the function never crashes the process and is never a refusal', T, async () => {
    const store = sqliteStore();
    const ledger = new FileLedger(join(tempDir(), 'ledger'));
    const w = worker(['panic', store, ledger.path, 'panicked'], { IDEMGATE_NODE_TEST_PANIC: 'after_call' });
    const line = JSON.parse(await w.line(30_000));
    assert.deepEqual(await w.exited, { code: 0, signal: null }, w.stderr());
    // The panic came after the function's effect: ambiguous, so unknown (no lookup), and the
    // next delivery answers from the record without calling the function again.
    assert.deepEqual(line, { label: 'unknown', again: 'unknown', listed: 1, alive: true });
    assert.equal(ledger.count('acme:multi:panicked:insert'), 1);
  });
});
