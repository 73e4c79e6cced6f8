// idemgate/local: asynchronous jobs. A tool's function returns `new Job(jobId)`, its `poll`
// function says how the job stands, and the engine decides what that means, as for Python's
// `poll=`. Each scenario counts, on the tool's side, how often the function started a job and
// how often the poller was asked, separately from the outcomes the calls answer.

import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';

import { Job, JobGone, Local, Receipt, Refused } from 'idemgate/local';

import { Ledger, T, sqliteStore, tempDir } from './support/local-support.mjs';

const opened = [];
/** A Local over a fresh SQLite store, closed after the file's tests. */
function local(options = {}) {
  const l = new Local(sqliteStore(), { tenant: 'acme', environment: 'test', recover: false, ...options });
  opened.push(l);
  return l;
}
after(async () => {
  for (const l of opened) await l.close();
});

/**
 * A reports tool whose function starts a job (one ledger entry per start) and whose poller
 * answers what `job.poll` does, counting each question in `job.polls`.
 */
function reports(l, ledger, job, options = {}) {
  return l.tool(
    'reports.generate',
    {
      fingerprint: ['period'],
      ...options,
      poll: async (jobId, { idempotencyKey }) => {
        job.polls += 1;
        job.asked = [jobId, idempotencyKey];
        return job.poll(jobId);
      },
    },
    async (args, { idempotencyKey }) => {
      ledger.calls += 1;
      await job.started?.();
      ledger.effect(idempotencyKey, args);
      return new Job(`j-${ledger.effects.length}`);
    },
  );
}

/** A job that runs until the test says otherwise. */
function running() {
  return { polls: 0, asked: null, poll: () => null };
}

describe('asynchronous jobs in process', () => {
  test('a job starts once, is in flight while it runs, then applies and replays without asking again', T, async () => {
    const l = local();
    const ledger = new Ledger();
    const job = running();
    const generate = reports(l, ledger, job);
    const ids = { workflowId: 'run-1', stepId: 'report' };
    const started = await generate({ period: '2026-11' }, ids);
    assert.equal(started.outcome, 'in_flight');
    assert.equal(started.nextAction, 'poll');
    assert.equal(started.operationKey, 'acme:test:run-1:report');
    const pending = await l.operation(started.operationKey);
    assert.equal(pending.recordStatus, 'pending');
    assert.equal(pending.jobId, 'j-1');
    const stillRunning = await generate({ period: '2026-11' }, ids);
    assert.equal(stillRunning.outcome, 'in_flight');
    assert.equal(stillRunning.nextAction, 'poll');
    // Reading the operation and delivering again each asked the poller, with the job's id and
    // the operation key; neither started the job again.
    assert.equal(job.polls, 2);
    assert.deepEqual(job.asked, ['j-1', 'acme:test:run-1:report']);
    assert.equal(ledger.calls, 1);

    job.poll = (jobId) => new Receipt(`report-${jobId}`, { pages: 2 });
    const finished = await generate({ period: '2026-11' }, ids);
    assert.equal(finished.outcome, 'replayed');
    assert.equal(finished.effectReference, 'report-j-1');
    assert.deepEqual(finished.result, { pages: 2 });
    const applied = await l.operation(started.operationKey);
    assert.equal(applied.recordStatus, 'applied');
    assert.deepEqual(applied.receipt, { reference: 'report-j-1', result: { pages: 2 } });
    assert.equal(job.polls, 3);

    const again = await l.invoke('reports.generate', { period: '2026-11' }, ids);
    assert.equal(again.outcome, 'replayed');
    assert.equal(again.effectReference, 'report-j-1');
    assert.deepEqual(again.result, { pages: 2 });
    assert.equal(job.polls, 3);
    assert.equal(ledger.calls, 1);
    assert.equal(ledger.count('acme:test:run-1:report'), 1);
  });

  test('reading the operation polls the job to its end, as in Python', T, async () => {
    const l = local();
    const ledger = new Ledger();
    const job = running();
    const generate = reports(l, ledger, job);
    const started = await generate({ period: '2026-12' }, { workflowId: 'run-2', stepId: 'report' });
    assert.equal(started.outcome, 'in_flight');
    job.poll = (jobId) => new Receipt(`report-${jobId}`, { pages: 3 });
    const read = await l.operation(started.operationKey);
    assert.equal(read.recordStatus, 'applied');
    assert.deepEqual(read.receipt, { reference: 'report-j-1', result: { pages: 3 } });
    assert.equal(read.outcome.outcome, 'replayed');
    assert.equal(job.polls, 1);
    assert.equal(ledger.calls, 1);
  });

  test('the same step invoked concurrently while its job starts and runs: the function runs once', T, async () => {
    const l = local();
    const ledger = new Ledger();
    const job = running();
    let release;
    const gate = new Promise((r) => {
      release = r;
    });
    job.started = () => gate;
    const generate = reports(l, ledger, job);
    const ids = { workflowId: 'run-3', stepId: 'report' };
    const calls = Array.from({ length: 8 }, () => generate({ period: '2027-01' }, ids));
    // Let every delivery reach the engine while the first one's function waits.
    await new Promise((r) => setTimeout(r, 200));
    release();
    const outcomes = await Promise.all(calls);
    for (const o of outcomes) {
      assert.equal(o.outcome, 'in_flight');
      assert.equal(o.nextAction, 'poll');
    }
    const more = await Promise.all(Array.from({ length: 8 }, () => generate({ period: '2027-01' }, ids)));
    assert.ok(more.every((o) => o.outcome === 'in_flight'));
    assert.equal(ledger.calls, 1);
    assert.equal(ledger.count('acme:test:run-3:report'), 1);
    assert.ok(job.polls >= 8, `every later delivery asked the poller (${job.polls})`);
  });

  test('a poller throwing Refused: the operation is refused, and replayed as refused without asking again', T, async () => {
    const l = local();
    const ledger = new Ledger();
    const job = running();
    const generate = reports(l, ledger, job);
    const ids = { workflowId: 'run-4', stepId: 'report' };
    assert.equal((await generate({ period: '2027-02' }, ids)).outcome, 'in_flight');
    job.poll = () => {
      throw new Refused('period_closed', 'the period is closed');
    };
    const refused = await generate({ period: '2027-02' }, ids);
    assert.equal(refused.outcome, 'rejected');
    assert.equal(refused.code, 'downstream_rejected');
    assert.match(refused.message, /period_closed: the period is closed/);
    assert.equal(job.polls, 1);
    const again = await generate({ period: '2027-02' }, ids);
    assert.equal(again.outcome, 'rejected');
    assert.equal(again.code, 'downstream_rejected');
    assert.match(again.message, /period_closed/);
    assert.equal((await l.operation(refused.operationKey)).recordStatus, 'failed_permanent');
    assert.equal(job.polls, 1);
    assert.equal(ledger.calls, 1);
  });

  test('a poller throwing JobGone: the operation ends unknown for an operator, never started again, settled by later evidence', T, async () => {
    const l = local();
    const ledger = new Ledger();
    const job = running();
    const generate = reports(l, ledger, job);
    const ids = { workflowId: 'run-5', stepId: 'report' };
    assert.equal((await generate({ period: '2027-03' }, ids)).outcome, 'in_flight');
    job.poll = () => {
      throw new JobGone('no job j-1 here');
    };
    const gone = await generate({ period: '2027-03' }, ids);
    assert.equal(gone.outcome, 'unknown');
    assert.equal(gone.nextAction, 'reconcile');
    assert.match(gone.error.message, /no longer knows job j-1: no job j-1 here/);
    const again = await generate({ period: '2027-03' }, ids);
    assert.equal(again.outcome, 'unknown');
    const read = await l.operation(gone.operationKey);
    assert.equal(read.recordStatus, 'unknown');
    assert.equal(read.jobId, 'j-1');
    assert.deepEqual((await l.operations({ status: 'unknown' })).operations.map((o) => o.operationKey), [gone.operationKey]);
    // `unknown` is not final: each later delivery and read asks the poller for evidence (the
    // engine's rule, as in Python), and a job found done after all settles it.
    assert.equal(job.polls, 3);
    job.poll = (jobId) => new Receipt(`report-${jobId}`);
    const settled = await generate({ period: '2027-03' }, ids);
    assert.equal(settled.outcome, 'replayed');
    assert.equal(settled.effectReference, 'report-j-1');
    assert.equal((await l.operation(gone.operationKey)).recordStatus, 'applied');
    assert.equal(job.polls, 4);
    assert.equal(ledger.calls, 1);
  });

  test('a poller throwing anything else says nothing: the job stays pending and is never started twice', T, async () => {
    const l = local();
    const ledger = new Ledger();
    const job = running();
    const generate = reports(l, ledger, job);
    const ids = { workflowId: 'run-6', stepId: 'report' };
    assert.equal((await generate({ period: '2027-04' }, ids)).outcome, 'in_flight');
    job.poll = () => {
      throw new Error('the reports service timed out');
    };
    for (let i = 0; i < 3; i += 1) {
      const o = await generate({ period: '2027-04' }, ids);
      assert.equal(o.outcome, 'in_flight');
      assert.equal(o.nextAction, 'poll');
    }
    const read = await l.operation('acme:test:run-6:report');
    assert.equal(read.recordStatus, 'pending');
    assert.equal(read.jobId, 'j-1');
    assert.equal(job.polls, 4);
    // A poller that returns something other than a Receipt or null says nothing either.
    job.poll = () => ({ done: true });
    assert.equal((await generate({ period: '2027-04' }, ids)).outcome, 'in_flight');
    job.poll = (jobId) => new Receipt(`report-${jobId}`);
    const finished = await generate({ period: '2027-04' }, ids);
    assert.equal(finished.outcome, 'replayed');
    assert.equal(finished.effectReference, 'report-j-1');
    assert.equal(job.polls, 6);
    assert.equal(ledger.calls, 1);
  });

  test('the background recoverer polls a running job once its lease runs out', T, async () => {
    const l = local({ recover: true, recoveryInterval: 0.2 });
    const ledger = new Ledger();
    const job = running();
    const generate = reports(l, ledger, job, { leaseSeconds: 3 });
    const started = await generate({ period: '2027-05' }, { workflowId: 'run-7', stepId: 'report' });
    assert.equal(started.outcome, 'in_flight');
    job.poll = (jobId) => new Receipt(`report-${jobId}`, { pages: 1 });
    // Listing reads the records without polling: only the recoverer can finish the job here.
    const deadline = Date.now() + 20_000;
    let applied = [];
    while (applied.length === 0 && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 200));
      applied = (await l.operations({ status: 'applied' })).operations;
    }
    assert.deepEqual(applied.map((o) => [o.operationKey, o.effectReference]), [[started.operationKey, 'report-j-1']]);
    assert.ok(job.polls >= 1);
    assert.equal(ledger.calls, 1);
  });

  test('a Job from a tool without a poller is ambiguous: unknown, never a second start', T, async () => {
    const l = local();
    const ledger = new Ledger();
    const start = l.tool('reports.start', { fingerprint: ['period'] }, async (args, { idempotencyKey }) => {
      ledger.calls += 1;
      ledger.effect(idempotencyKey, args);
      return new Job('j-1');
    });
    const ids = { workflowId: 'run-8', stepId: 'report' };
    const first = await start({ period: '2027-06' }, ids);
    assert.equal(first.outcome, 'unknown');
    assert.match(first.error.message, /accepted a job the contract does not declare/);
    assert.equal((await start({ period: '2027-06' }, ids)).outcome, 'unknown');
    assert.equal(ledger.calls, 1);
  });

  test('a contract file declaring downstream.async_jobs needs poll, and poll needs the declaration', T, async () => {
    const l = local();
    const ledger = new Ledger();
    const file = (jobs) => {
      const path = join(tempDir(), 'reports.yaml');
      writeFileSync(
        path,
        [
          'name: reports.generate',
          'version: "1"',
          'effect_class: key_based',
          'operation_key:',
          '  supplied_by: application',
          '  scope: [tenant, environment, workflow_id, step_id]',
          'input_schema:',
          '  type: object',
          '  properties: {period: {type: string}}',
          'request_fingerprint: {fields: [period]}',
          `downstream: {async_jobs: ${jobs}}`,
          'retention: {record_ttl: 7d, tombstone_ttl: 30d, max_retry_window: 1d}',
          '',
        ].join('\n'),
      );
      return path;
    };
    const fn = () => new Job('j-1');
    assert.throws(() => l.tool('reports.generate', { contract: file(true) }, fn), /downstream\.async_jobs.*give poll/);
    assert.throws(() => l.tool('reports.generate', { contract: file(false), poll: () => null }, fn), /poll is given.*downstream\.async_jobs/);
    assert.throws(() => l.tool('reports.generate', { poll: 'soon' }, fn), /poll is a function/);
    assert.deepEqual(l.tools(), []);
    const job = running();
    const generate = reports(l, ledger, job, { contract: file(true), fingerprint: undefined });
    assert.deepEqual(l.tools(), ['reports.generate']);
    const started = await generate({ period: '2027-07' }, { workflowId: 'run-9', stepId: 'report' });
    assert.equal(started.outcome, 'in_flight');
    assert.equal((await l.operation(started.operationKey)).jobId, 'j-1');
    assert.equal(ledger.calls, 1);
  });
});
