// idemgate/local under the frameworks' own runtimes: a guarded function as a Vercel AI SDK tool
// driven by the SDK's mock model (proposing the call twice, and a run that loses the model's
// answer and is run again), and as the tool of an MCP server written with the official MCP SDK
// (examples/mcp-refunds.mjs, run as written), effects counted where the function makes them.

import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

import { generateText, stepCountIs } from 'ai';
import { MockLanguageModelV3 } from 'ai/test';

import { guardedTool } from 'idemgate/ai';
import { Local, Receipt } from 'idemgate/local';

import { Ledger, T, sqliteStore, tempDir } from './support/local-support.mjs';

const usage = {
  inputTokens: { total: 10, noCache: 10, cacheRead: 0, cacheWrite: 0 },
  outputTokens: { total: 5, text: 5, reasoning: 0 },
};

function proposes(toolName, input, toolCallId) {
  return {
    content: [{ type: 'tool-call', toolCallId, toolName, input: JSON.stringify(input) }],
    finishReason: { unified: 'tool-calls', raw: 'tool_calls' },
    usage,
    warnings: [],
  };
}

function says(text) {
  return { content: [{ type: 'text', text }], finishReason: { unified: 'stop', raw: 'stop' }, usage, warnings: [] };
}

const TICKET_SCHEMA = {
  type: 'object',
  properties: { subject: { type: 'string' }, body: { type: 'string' } },
  required: ['subject', 'body'],
  additionalProperties: false,
};
const TICKET = { subject: 'Refund request', body: 'Order 42 arrived broken.' };

const local = new Local(sqliteStore(), { tenant: 'acme', environment: 'ai', recover: false });
after(() => local.close());
const ledger = new Ledger();
const createTicket = local.tool(
  'tickets.create',
  { fingerprint: ['subject', 'body'], inputSchema: TICKET_SCHEMA },
  async (ticket, { idempotencyKey }) => {
    ledger.effect(idempotencyKey, ticket);
    return new Receipt(`T-${ledger.effects.length}`, { subject: ticket.subject });
  },
);

describe('a guarded function as a Vercel AI SDK tool', () => {
  test('proposed twice in one run, then the run loses the model\'s answer and runs again: one effect', T, async () => {
    const tools = { tickets_create: guardedTool(createTicket, { workflowId: 'ai-run-1', stepId: 'record_issue', inputSchema: TICKET_SCHEMA }) };
    // The first run: the model proposes the call, the tool runs, the model proposes it again
    // under a new call id, and then the model's next answer is lost (the run fails).
    let turn = 0;
    const lossy = new MockLanguageModelV3({
      doGenerate: async () => {
        turn += 1;
        if (turn === 1) return proposes('tickets_create', TICKET, 'call_1');
        if (turn === 2) return proposes('tickets_create', TICKET, 'call_2');
        throw new Error('the connection to the model provider was lost');
      },
    });
    const steps = [];
    await assert.rejects(
      generateText({
        model: lossy,
        tools,
        stopWhen: stepCountIs(5),
        prompt: 'Order 42 arrived broken; record it.',
        onStepFinish: (step) => steps.push(...step.toolResults.map((r) => [r.toolCallId, r.output.outcome])),
      }),
      /connection to the model provider was lost/,
    );
    assert.deepEqual(steps, [
      ['call_1', 'applied'],
      ['call_2', 'replayed'],
    ]);

    // The application runs the agent again for the same workflow run: the model proposes the
    // same call once more; the tool answers from the record.
    const retry = new MockLanguageModelV3({
      doGenerate: [proposes('tickets_create', TICKET, 'call_9'), says('The ticket is recorded.')],
    });
    const result = await generateText({ model: retry, tools, stopWhen: stepCountIs(5), prompt: 'Order 42 arrived broken; record it.' });
    const outputs = result.steps.flatMap((s) => s.toolResults.map((r) => r.output));
    assert.equal(outputs.length, 1);
    assert.equal(outputs[0].outcome, 'replayed');
    assert.equal(outputs[0].effect_reference, 'T-1');
    assert.match(outputs[0].meaning, /already been performed/);
    assert.equal(result.text, 'The ticket is recorded.');
    assert.equal(ledger.count('acme:ai:ai-run-1:record_issue'), 1);
  });

  test('a step derived from the input: two different tickets are two effects, each once', T, async () => {
    const tools = {
      tickets_create: guardedTool(createTicket, {
        workflowId: 'ai-run-2',
        stepId: (input) => `ticket-${input.subject.toLowerCase().replace(/[^a-z0-9]+/g, '-')}`,
        inputSchema: TICKET_SCHEMA,
      }),
    };
    const other = { subject: 'Late delivery', body: 'Order 43 is a week late.' };
    const model = new MockLanguageModelV3({
      doGenerate: [
        proposes('tickets_create', TICKET, 'c1'),
        proposes('tickets_create', other, 'c2'),
        proposes('tickets_create', TICKET, 'c3'),
        says('Both are recorded.'),
      ],
    });
    const before = ledger.effects.length;
    const result = await generateText({ model, tools, stopWhen: stepCountIs(6), prompt: 'Record both.' });
    const labels = result.steps.flatMap((s) => s.toolResults.map((r) => r.output.outcome));
    assert.deepEqual(labels, ['applied', 'applied', 'replayed']);
    assert.equal(ledger.effects.length - before, 2);
  });
});

describe('a guarded function as the tool of an MCP server (the official TypeScript MCP SDK)', () => {
  test('examples/mcp-refunds.mjs as written: called twice, then through a fresh server process, one refund', T, async () => {
    const dir = tempDir();
    const refundsFile = join(dir, 'refunds.jsonl');
    const example = fileURLToPath(new URL('../examples/mcp-refunds.mjs', import.meta.url));
    const { stdout } = await promisify(execFile)(process.execPath, [example], {
      env: { ...process.env, IDEMGATE_STORE: join(dir, 'refunds.sqlite'), REFUNDS_FILE: refundsFile },
      timeout: 60_000,
    });
    const lines = stdout.trim().split('\n');
    assert.deepEqual(
      lines.slice(0, 3).map((l) => l.split(':')[0]),
      ['applied re_1', 'replayed re_1', 'replayed re_1'],
    );
    assert.equal(lines[3], 'refunds made: 1');
    // Counted at the provider itself: one refund, under the operation's key.
    const made = readFileSync(refundsFile, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l));
    assert.deepEqual(made.map((r) => r.idempotency_key), ['acme:example:conv-7:refund-pi_42']);
  });
});
