// Every label through a real gateway and a fake system of record that counts effects on its own
// side: each scenario asserts what the client returned and, separately, what the fake saw.

import assert from 'node:assert/strict';
import { describe, test } from 'node:test';

import {
  Client,
  IdemgateError,
  InFlightError,
  RejectedError,
  UnknownOutcomeError,
  describeOutcome,
  isDone,
} from 'idemgate';

import { until } from './support/fake.mjs';
import { T, TICKET, agent, agentStep, fake, gate, operator, useGateway } from './support/setup.mjs';

useGateway();

describe('applied, replayed and a reused key', () => {
  test('the same step twice is one effect: applied, then replayed with the same reference', T, async () => {
    const { step, key } = agentStep('run-applied', 'record_issue');

    const first = await step.invoke('tickets.create', TICKET);
    assert.equal(first.outcome, 'applied');
    assert.equal(first.httpStatus, 200);
    assert.equal(first.operationKey, key);
    assert.equal(first.safeToRepeat, false);
    assert.equal(first.nextAction, 'none');
    assert.ok(isDone(first));

    const second = await step.invoke('tickets.create', TICKET);
    assert.equal(second.outcome, 'replayed');
    assert.equal(second.effectReference, first.effectReference);
    assert.deepEqual(second.result, first.result);

    // At the fake: one ticket under this key, and the replay never reached it.
    assert.equal(fake.effectsFor(key), 1);
    assert.equal(fake.committed.find((c) => c.key === key)?.reference, first.effectReference);
    assert.equal(fake.requestsFor(key), 1);
  });

  test('the same key with a different request is rejected 422, and nothing is sent', T, async () => {
    const { step, key } = agentStep('run-mismatch', 'record_issue');
    const first = await step.invoke('tickets.create', TICKET);
    assert.equal(first.outcome, 'applied');

    const other = await step.invoke('tickets.create', { ...TICKET, subject: 'Something else' });
    assert.equal(other.outcome, 'rejected');
    if (other.outcome !== 'rejected') return;
    assert.equal(other.code, 'idempotency_key_reused_with_different_request');
    assert.equal(other.httpStatus, 422);
    assert.equal(other.safeToRepeat, false);
    assert.equal(other.nextAction, 'inspect_operation');
    assert.match(other.problemType ?? '', /^http:\/\/127\.0\.0\.1:\d+\/problems\/idempotency_key_reused_with_different_request$/);
    const page = await fetch(other.problemType);
    assert.equal(page.status, 200, 'the problem type resolves to a page on the gateway');
    assert.match(describeOutcome(other), /already performed a different request/);

    assert.equal(fake.effectsFor(key), 1);
    assert.equal(fake.requestsFor(key), 1);
  });

  test('a downstream refusal is rejected with no effect', T, async () => {
    const key = gate.key('run-refused', 'record_issue');
    fake.fault('tickets', 'refuse');
    const refused = await agent.invoke('tickets.create', TICKET, { workflowId: 'run-refused', stepId: 'record_issue' });
    assert.equal(refused.outcome, 'rejected');
    if (refused.outcome !== 'rejected') return;
    assert.equal(refused.code, 'downstream_rejected');
    assert.equal(refused.httpStatus, 422);
    // The request reached the fake, which refused it: no effect.
    assert.equal(fake.requestsFor(key), 1);
    assert.equal(fake.effectsFor(key), 0);
  });
});

describe('in flight, and waiting for it', () => {
  test('a second delivery while the first is held is in_flight (409); wait returns the settled outcome', T, async () => {
    const { step, key } = agentStep('run-inflight', 'record_issue');
    const release = fake.fault('tickets', 'hold');

    const first = step.invoke('tickets.create', TICKET);
    await until('the first delivery to reach the fake', () => fake.held === 1, 10_000);

    const second = await step.invoke('tickets.create', TICKET);
    assert.equal(second.outcome, 'in_flight');
    if (second.outcome !== 'in_flight') return;
    assert.equal(second.httpStatus, 409);
    assert.equal(second.nextAction, 'poll');
    assert.equal(second.awaitingApproval, false);
    assert.equal(typeof second.retryAfter, 'number');
    assert.equal(second.safeToRepeat, false);

    // A waiting delivery can only answer replayed after the release: without `Prefer: wait`
    // it would have answered in_flight at once, as the second did.
    const waiting = step.invoke('tickets.create', TICKET, { wait: 10 });
    let waitingDone = false;
    waiting.then(() => (waitingDone = true), () => (waitingDone = true));
    await new Promise((r) => setTimeout(r, 400));
    assert.equal(waitingDone, false, 'the waiting delivery answered before the operation settled');
    release();

    const [firstDone, waited] = await Promise.all([first, waiting]);
    assert.equal(firstDone.outcome, 'applied');
    assert.equal(waited.outcome, 'replayed');
    assert.equal(waited.effectReference, firstDone.effectReference);

    // Three deliveries, one request at the fake, one effect.
    assert.equal(fake.requestsFor(key), 1);
    assert.equal(fake.effectsFor(key), 1);
  });
});

describe('unknown: committed, then the answer was lost', () => {
  test('lookup unavailable: unknown, never resent; the operator looks the receipt up once it answers', T, async () => {
    const { step, key } = agentStep('run-unknown-lookup', 'add_note');
    fake.lookups = false;
    try {
      fake.fault('notes', 'drop');
      const lost = await step.invoke('notes.add', { text: 'called the customer' });
      assert.equal(lost.outcome, 'unknown');
      assert.equal(lost.httpStatus, 202);
      assert.equal(lost.nextAction, 'reconcile');
      assert.equal(lost.safeToRepeat, false);
      assert.equal(lost.operationKey, key);
      // The effect exists at the fake even though the client heard no reference.
      assert.equal(fake.effectsFor(key), 1);

      const again = await step.invoke('notes.add', { text: 'called the customer' });
      assert.equal(again.outcome, 'unknown');
      assert.equal(fake.requests('notes'), 1, 'an unknown operation must never be sent again');

      const queue = await operator.operations({ status: 'unknown' });
      assert.ok(queue.operations.some((o) => o.operationKey === key && o.tool === 'notes.add'));

      const still = await operator.reconcile(key);
      assert.equal(still.outcome, 'unknown');
    } finally {
      fake.lookups = true;
    }
    const found = await operator.reconcile(key, { reason: 'the notes service is back' });
    assert.ok(isDone(found), `reconcile answered ${found.outcome}`);
    assert.ok(gate.auditLog().some((e) => e.operation_key === key && e.action === 'settled_by_lookup' && e.reason === 'the notes service is back'));
    const reference = fake.committed.find((c) => c.key === key)?.reference;
    assert.equal(found.effectReference, reference);

    const replay = await step.invoke('notes.add', { text: 'called the customer' });
    assert.equal(replay.outcome, 'replayed');
    assert.equal(replay.effectReference, reference);
    assert.equal(fake.effectsFor(key), 1);
    assert.equal(fake.requests('notes'), 1);
  });

  test('no lookup at all: unknown; the operator resolves it applied with the reference', T, async () => {
    const { step, key } = agentStep('run-unknown-nolookup', 'send_letter');
    const before = fake.requests('letters');
    fake.fault('letters', 'drop');
    const lost = await step.invoke('letters.send', { to: 'A. Customer', text: 'Your refund is on its way.' });
    assert.equal(lost.outcome, 'unknown');
    assert.equal(fake.effectsFor(key), 1);

    const reference = fake.committed.find((c) => c.key === key)?.reference;
    assert.ok(reference);
    const resolved = await operator.resolveApplied(
      key,
      { effectReference: reference, result: { letter_id: reference } },
      { reason: 'seen in the letters outbox' },
    );
    assert.ok(isDone(resolved), `resolveApplied answered ${resolved.outcome}`);
    assert.ok(gate.auditLog().some((e) => e.operation_key === key && e.action === 'resolved_applied' && e.reason === 'seen in the letters outbox'));
    assert.equal(resolved.effectReference, reference);

    const replay = await step.invoke('letters.send', { to: 'A. Customer', text: 'Your refund is on its way.' });
    assert.equal(replay.outcome, 'replayed');
    assert.equal(replay.effectReference, reference);
    assert.deepEqual(replay.result, { letter_id: reference });
    assert.equal(fake.requests('letters') - before, 1);
    assert.equal(fake.effectsFor(key), 1);
  });

  test('a timeout that committed nothing: the operator resolves not_applied, and the next delivery applies once', T, async () => {
    const { step, key } = agentStep('run-not-applied', 'send_letter');
    const release = fake.fault('letters', 'stall');
    const args = { to: 'B. Customer', text: 'We received your return.' };
    const timedOut = await step.invoke('letters.send', args);
    release();
    assert.equal(timedOut.outcome, 'unknown');
    assert.equal(fake.effectsFor(key), 0, 'the stalled request committed nothing');

    const resolution = await operator.resolveNotApplied(key, { reason: 'never left the stalled queue' });
    assert.ok(gate.auditLog().some((e) => e.operation_key === key && e.action === 'resolved_not_applied' && e.reason === 'never left the stalled queue'));
    assert.notEqual(resolution.outcome, 'applied');
    assert.notEqual(resolution.outcome, 'replayed');

    const rerun = await step.invoke('letters.send', args);
    assert.equal(rerun.outcome, 'applied');
    assert.equal(fake.effectsFor(key), 1);
    assert.equal(rerun.effectReference, fake.committed.find((c) => c.key === key)?.reference);
  });
});

describe('approval through the operator methods', () => {
  test('awaiting approval is in_flight (202) with no effect; approve applies it once', T, async () => {
    const { step, key } = agentStep('run-approve', 'legal_ticket');
    const args = { ...TICKET, queue_id: 'legal' };
    const held = await step.invoke('tickets.create', args);
    assert.equal(held.outcome, 'in_flight');
    if (held.outcome !== 'in_flight') return;
    assert.equal(held.httpStatus, 202, '202 here is awaiting approval, read from the body');
    assert.equal(held.awaitingApproval, true);
    assert.equal(held.nextAction, 'ask_for_approval');
    assert.equal(fake.requestsFor(key), 0);

    const pending = await operator.operations({ status: 'awaiting_approval', tool: 'tickets.create' });
    assert.ok(pending.operations.some((o) => o.operationKey === key));
    const record = await operator.operation(key);
    assert.ok(record);
    assert.equal(record.recordStatus, 'awaiting_approval');
    assert.equal(record.outcome.outcome, 'in_flight');

    const approved = await operator.approve(key, { fingerprint: record.fingerprint });
    assert.equal(approved.outcome, 'applied');
    assert.equal(fake.effectsFor(key), 1);

    const replay = await step.invoke('tickets.create', args);
    assert.equal(replay.outcome, 'replayed');
    assert.equal(replay.effectReference, approved.effectReference);
    assert.equal(fake.effectsFor(key), 1);
  });

  test('deny: rejected approval_denied now and on every later delivery; no effect', T, async () => {
    const { step, key } = agentStep('run-deny', 'legal_ticket');
    const args = { ...TICKET, queue_id: 'legal' };
    const held = await step.invoke('tickets.create', args);
    assert.equal(held.outcome, 'in_flight');

    const denied = await operator.deny(key, { reason: 'not a legal matter' });
    assert.equal(denied.outcome, 'rejected');
    assert.equal(denied.outcome === 'rejected' && denied.code, 'approval_denied');

    const later = await step.invoke('tickets.create', args);
    assert.equal(later.outcome, 'rejected');
    assert.equal(later.outcome === 'rejected' && later.code, 'approval_denied');
    assert.equal(fake.requestsFor(key), 0);
  });
});

describe('operator reasons', () => {
  test('the reason of approve and deny is what the audit log records; a blank one is refused before sending', T, async () => {
    const args = { ...TICKET, queue_id: 'legal' };
    const a = agentStep('run-reason-approve', 'legal_ticket');
    assert.equal((await a.step.invoke('tickets.create', args)).outcome, 'in_flight');
    await assert.rejects(operator.approve(a.key, {}, { reason: ' ' }), (e) => e instanceof IdemgateError && /reason/.test(e.message));
    assert.equal(fake.effectsFor(a.key), 0);
    const approved = await operator.approve(a.key, {}, { reason: 'legal queue reviewed' });
    assert.equal(approved.outcome, 'applied');
    assert.equal(fake.effectsFor(a.key), 1);

    const d = agentStep('run-reason-deny', 'legal_ticket');
    assert.equal((await d.step.invoke('tickets.create', args)).outcome, 'in_flight');
    assert.equal((await operator.deny(d.key, { reason: 'duplicate request' })).outcome, 'rejected');
    assert.equal(fake.requestsFor(d.key), 0);

    const reasons = new Map(gate.auditLog().map((e) => [`${e.operation_key} ${e.action}`, e.reason]));
    assert.equal(reasons.get(`${a.key} approved`), 'legal queue reviewed');
    assert.equal(reasons.get(`${d.key} denied`), 'duplicate request');
  });
});

describe('the throw option', () => {
  test('in_flight, rejected and unknown are thrown as IdemgateError subclasses; applied is returned', T, async () => {
    const strict = new Client({ baseUrl: gate.url, token: gate.agentToken, throw: true });
    const run = strict.workflow('run-throw');

    const applied = await run.step('ticket').invoke('tickets.create', TICKET);
    assert.equal(applied.outcome, 'applied');

    await assert.rejects(run.step('ticket').invoke('tickets.create', { ...TICKET, body: 'other' }), (e) => {
      assert.ok(e instanceof RejectedError && e instanceof IdemgateError);
      assert.equal(e.code, 'idempotency_key_reused_with_different_request');
      assert.equal(e.httpStatus, 422);
      assert.equal(e.safeToRepeat, false);
      assert.equal(e.operationKey, gate.key('run-throw', 'ticket'));
      return true;
    });

    await assert.rejects(run.step('legal').invoke('tickets.create', { ...TICKET, queue_id: 'legal' }), (e) => {
      assert.ok(e instanceof InFlightError);
      assert.equal(e.awaitingApproval, true);
      assert.equal(e.outcome.nextAction, 'ask_for_approval');
      return true;
    });

    fake.fault('letters', 'drop');
    await assert.rejects(run.step('letter').invoke('letters.send', { to: 'C', text: 'hello' }), (e) => {
      assert.ok(e instanceof UnknownOutcomeError);
      assert.match(e.message, /do not send it again/);
      return true;
    });

    // The per-call option overrides the client's: the same unknown answer, returned.
    const returned = await run.step('letter').invoke('letters.send', { to: 'C', text: 'hello' }, { throw: false });
    assert.equal(returned.outcome, 'unknown');

    assert.equal(fake.effectsFor(gate.key('run-throw', 'ticket')), 1);
    assert.equal(fake.effectsFor(gate.key('run-throw', 'legal')), 0);
    assert.equal(fake.effectsFor(gate.key('run-throw', 'letter')), 1);
    assert.equal(fake.requestsFor(gate.key('run-throw', 'letter')), 1);
  });
});

describe('reading operations and tools', () => {
  test('operation(key) gives the record, receipt, outcome and events; a missing key is null', T, async () => {
    const { step, key } = agentStep('run-read', 'record_issue');
    const applied = await step.invoke('tickets.create', TICKET);
    assert.equal(applied.outcome, 'applied');

    const op = await agent.operation(key);
    assert.ok(op);
    assert.equal(op.operationKey, key);
    assert.equal(op.tool, 'tickets.create');
    assert.equal(op.recordStatus, 'applied');
    assert.match(op.fingerprint, /^sha256:[0-9a-f]{64}$/);
    assert.equal(op.receipt?.reference, applied.effectReference);
    assert.equal(op.outcome.outcome, 'replayed');
    assert.ok(op.events.some((e) => e.kind === 'claimed'));
    assert.ok(op.events.some((e) => e.kind === 'sent'));
    assert.equal(fake.effectsFor(key), 1);

    assert.equal(await agent.operation(gate.key('run-read', 'never_invoked')), null);
  });

  test('tools() lists the loaded contracts with their identity rules', T, async () => {
    const tools = await agent.tools();
    assert.deepEqual(tools.map((t) => t.name).sort(), ['letters.send', 'notes.add', 'tickets.create']);
    const tickets = await agent.tool('tickets.create');
    assert.equal(tickets.effectClass, 'key_based');
    assert.equal(tickets.operationIdentity, 'required');
    assert.equal(tickets.approval, 'when_matches');
    assert.deepEqual(tickets.inputSchema.required, ['subject', 'body']);
    assert.ok(tickets.description.length > 0);
  });

  test('operator methods with an agent token are refused as forbidden', T, async () => {
    await assert.rejects(agent.operations({ status: 'unknown' }), (e) => {
      assert.ok(e instanceof RejectedError);
      assert.equal(e.code, 'forbidden');
      assert.equal(e.httpStatus, 403);
      return true;
    });
  });
});
