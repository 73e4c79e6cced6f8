// The setup every test file shares: a fake system of record and a real gateway over it, started
// before the file's tests and stopped after them, with a client for each of the gateway's tokens.
//
//   import { agent, fake, gate, operator, useGateway } from './support/setup.mjs';
//   useGateway();
//
// `fake`, `gate`, `agent` and `operator` are live bindings: set by the `before` hook that
// `useGateway()` registers, so they are read inside the tests, never at import time.

import { after, before } from 'node:test';

import { Client } from 'idemgate';

import { FakeSystem } from './fake.mjs';
import { startGateway } from './gateway.mjs';

/** The options of every test: a hang fails the test instead of the run. */
export const T = { timeout: 30_000 };

/** The arguments of a `tickets.create` call the tests make again and again. */
export const TICKET = { subject: 'Refund request', body: 'Order 42 arrived broken.' };

/** @type {FakeSystem} */
export let fake;
/** @type {Awaited<ReturnType<typeof startGateway>>} */
export let gate;
/** A client with the agent's token. @type {Client} */
export let agent;
/** A client with the operator's token. @type {Client} */
export let operator;

/** Registers the hooks that start the fake and the gateway for this file, and stop them. */
export function useGateway() {
  before(async () => {
    fake = await new FakeSystem().start();
    gate = await startGateway(fake.url);
    agent = new Client({ baseUrl: gate.url, token: gate.agentToken });
    operator = new Client({ baseUrl: gate.url, token: gate.operatorToken });
  });

  after(async () => {
    await gate?.stop();
    await fake?.stop();
  });
}

/**
 * A step of a workflow run through the agent's client, with the operation key the gateway gives
 * it: `const { step, key } = agentStep('run-1', 'record_issue')`.
 * @param {string} workflowId
 * @param {string} stepId
 */
export function agentStep(workflowId, stepId) {
  return { step: agent.workflow(workflowId).step(stepId), key: gate.key(workflowId, stepId) };
}
