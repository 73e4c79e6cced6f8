// The Vercel AI SDK adapter under `generateText`, driven by the SDK's own mock language model:
// the model proposes the same call again (in a later step, or twice in one response), and the
// fake system of record must see exactly one effect.

import assert from 'node:assert/strict';
import { describe, test } from 'node:test';

import { generateText, stepCountIs } from 'ai';
import { MockLanguageModelV3 } from 'ai/test';

import { STATUS_TOOL, idemgateTool, idemgateTools, modelToolName } from 'idemgate/ai';

import { T, TICKET, agent, fake, gate, operator, useGateway } from './support/setup.mjs';

useGateway();

const usage = {
  inputTokens: { total: 10, noCache: 10, cacheRead: 0, cacheWrite: 0 },
  outputTokens: { total: 5, text: 5, reasoning: 0 },
};

/** One model response that proposes `calls` (`[toolName, input, toolCallId]`). */
function proposes(...calls) {
  return {
    content: calls.map(([toolName, input, toolCallId]) => ({
      type: 'tool-call',
      toolCallId,
      toolName,
      input: JSON.stringify(input),
    })),
    finishReason: { unified: 'tool-calls', raw: 'tool_calls' },
    usage,
    warnings: [],
  };
}

function says(text) {
  return {
    content: [{ type: 'text', text }],
    finishReason: { unified: 'stop', raw: 'stop' },
    usage,
    warnings: [],
  };
}

/** Every tool result of a run, in order, with the step it came from. */
function toolResults(result) {
  return result.steps.flatMap((step, index) => step.toolResults.map((r) => ({ step: index, ...r })));
}

describe('generateText with an idemgate tool', () => {
  test('the model proposes the same call in two steps: one effect, applied then replayed', T, async () => {
    const info = await agent.tool('tickets.create');
    const name = modelToolName(info.name);
    const model = new MockLanguageModelV3({
      doGenerate: [
        proposes([name, TICKET, 'call_1']),
        // The model "forgets" it already did it and proposes it again, under a new call id.
        proposes([name, TICKET, 'call_2']),
        says('The ticket is recorded.'),
      ],
    });
    const result = await generateText({
      model,
      tools: { [name]: idemgateTool(agent, info, { workflowId: 'ai-run-1', stepId: 'record_issue' }) },
      stopWhen: stepCountIs(5),
      prompt: 'Order 42 arrived broken; record it.',
    });

    const key = gate.key('ai-run-1', 'record_issue');
    const results = toolResults(result);
    assert.equal(results.length, 2);
    assert.deepEqual(
      results.map((r) => [r.step, r.toolCallId, r.output.outcome]),
      [
        [0, 'call_1', 'applied'],
        [1, 'call_2', 'replayed'],
      ],
    );
    const [first, second] = results.map((r) => r.output);
    assert.equal(second.effect_reference, first.effect_reference);
    assert.equal(first.operation_key, key);
    assert.match(first.meaning, /performed now, exactly once/);
    assert.match(second.meaning, /already been performed.*nothing new happened/);
    assert.equal(result.text, 'The ticket is recorded.');

    // The model saw the outcome: the second step's prompt carries the first tool result.
    const secondPrompt = JSON.stringify(model.doGenerateCalls[1].prompt);
    assert.ok(secondPrompt.includes(first.effect_reference));

    // At the fake: one ticket, one request under the key.
    assert.equal(fake.effectsFor(key), 1);
    assert.equal(fake.requestsFor(key), 1);
    assert.equal(fake.committed.find((c) => c.key === key)?.reference, first.effect_reference);
  });

  test('the same call twice in one response (parallel tool calls): one effect', T, async () => {
    const tools = await idemgateTools(agent, { workflowId: 'ai-run-2', steps: { 'tickets.create': 'record_issue' } });
    assert.deepEqual(Object.keys(tools), ['tickets_create', 'idemgate_operation_status']);
    const model = new MockLanguageModelV3({
      doGenerate: [
        proposes(['tickets_create', TICKET, 'call_a'], ['tickets_create', TICKET, 'call_b']),
        says('Done.'),
      ],
    });
    const result = await generateText({ model, tools, stopWhen: stepCountIs(4), prompt: 'Record it.' });

    const key = gate.key('ai-run-2', 'record_issue');
    const outcomes = toolResults(result).map((r) => r.output.outcome).sort();
    // One delivery performs it; the other waits (Prefer: wait) and hears the replay.
    assert.deepEqual(outcomes, ['applied', 'replayed']);
    const references = new Set(toolResults(result).map((r) => r.output.effect_reference));
    assert.equal(references.size, 1);
    assert.equal(fake.effectsFor(key), 1);
    assert.equal(fake.requestsFor(key), 1);
  });

  test('a different request in the same step is refused with its meaning; still one effect', T, async () => {
    const info = await agent.tool('tickets.create');
    const model = new MockLanguageModelV3({
      doGenerate: [
        proposes(['tickets_create', TICKET, 'call_1']),
        proposes(['tickets_create', { ...TICKET, subject: 'A second ticket' }, 'call_2']),
        says('Stopped.'),
      ],
    });
    const result = await generateText({
      model,
      tools: { tickets_create: idemgateTool(agent, info, { workflowId: 'ai-run-3', stepId: 'record_issue' }) },
      stopWhen: stepCountIs(5),
      prompt: 'Record it.',
    });
    const [first, second] = toolResults(result).map((r) => r.output);
    assert.equal(first.outcome, 'applied');
    assert.equal(second.outcome, 'rejected');
    assert.equal(second.error.code, 'idempotency_key_reused_with_different_request');
    assert.equal(second.safe_to_repeat, false);
    assert.match(second.meaning, /already performed a different request/);
    assert.equal(fake.effectsFor(gate.key('ai-run-3', 'record_issue')), 1);
  });

  test('a step derived from the input: two customers, two operations; a repeat for either replays', T, async () => {
    const model = new MockLanguageModelV3({
      doGenerate: [
        proposes(['notes_add', { text: 'alice' }, 'c1'], ['notes_add', { text: 'bob' }, 'c2']),
        proposes(['notes_add', { text: 'alice' }, 'c3']),
        says('Both noted.'),
      ],
    });
    const notes = idemgateTool(agent, 'notes.add', {
      workflowId: 'ai-run-4',
      stepId: (input) => `note-${input.text}`,
      description: 'Add one note.',
      inputSchema: {
        type: 'object',
        properties: { text: { type: 'string' } },
        required: ['text'],
        additionalProperties: false,
      },
    });
    const result = await generateText({ model, tools: { notes_add: notes }, stopWhen: stepCountIs(5), prompt: 'Note both.' });
    assert.deepEqual(
      toolResults(result).map((r) => [r.toolCallId, r.output.outcome]),
      [
        ['c1', 'applied'],
        ['c2', 'applied'],
        ['c3', 'replayed'],
      ],
    );
    // notes.add does not deduplicate at the fake: the one request per key is the gateway's doing.
    assert.equal(fake.effectsFor(gate.key('ai-run-4', 'note-alice')), 1);
    assert.equal(fake.effectsFor(gate.key('ai-run-4', 'note-bob')), 1);
    assert.equal(fake.seen.filter((s) => s.key?.startsWith('ci:ci:ai-run-4:')).length, 2);
  });

  test('an unknown outcome goes back to the model as unknown, with no resend', T, async () => {
    fake.fault('letters', 'drop');
    const model = new MockLanguageModelV3({
      doGenerate: [
        proposes(['letters_send', { to: 'D', text: 'hi' }, 'l1']),
        proposes(['letters_send', { to: 'D', text: 'hi' }, 'l2']),
        says('It may have been sent.'),
      ],
    });
    const tools = await idemgateTools(agent, { workflowId: 'ai-run-5', steps: { 'letters.send': 'send_letter' } });
    const result = await generateText({ model, tools, stopWhen: stepCountIs(5), prompt: 'Send it.' });
    const outputs = toolResults(result).map((r) => r.output);
    assert.deepEqual(outputs.map((o) => o.outcome), ['unknown', 'unknown']);
    assert.equal(outputs[0].next_action, 'reconcile');
    assert.match(outputs[0].meaning, /do not call it again and do not report it as failed/);
    const key = gate.key('ai-run-5', 'send_letter');
    assert.equal(fake.effectsFor(key), 1);
    assert.equal(fake.requestsFor(key), 1);
  });

  test('awaiting approval: the model polls the status tool instead of calling again; one effect after approval', T, async () => {
    const key = gate.key('ai-run-6', 'legal_ticket');
    const legal = { ...TICKET, queue_id: 'legal' };
    const responses = [
      () => proposes(['tickets_create', legal, 't1']),
      () => proposes([STATUS_TOOL, { operation_key: key }, 't2']),
      // An operator approves between the model's steps.
      async () => {
        const approved = await operator.approve(key);
        assert.equal(approved.outcome, 'applied');
        return proposes([STATUS_TOOL, { operation_key: key }, 't3']);
      },
      () => proposes([STATUS_TOOL, { operation_key: 'ci:ci:ai-run-6:no_such_step' }, 't4']),
      () => says('Approved and recorded.'),
    ];
    let calls = 0;
    const model = new MockLanguageModelV3({
      doGenerate: async () => {
        const next = responses[calls];
        calls += 1;
        if (!next) throw new Error('the mock model was asked for more steps than scripted');
        return next();
      },
    });
    const tools = await idemgateTools(agent, { workflowId: 'ai-run-6', steps: { 'tickets.create': 'legal_ticket' }, wait: 0 });
    const result = await generateText({ model, tools, stopWhen: stepCountIs(6), prompt: 'File it with legal.' });

    const outputs = toolResults(result).map((r) => [r.toolName, r.output.outcome, r.output.next_action]);
    assert.deepEqual(outputs, [
      ['tickets_create', 'in_flight', 'ask_for_approval'],
      [STATUS_TOOL, 'in_flight', 'ask_for_approval'],
      [STATUS_TOOL, 'replayed', 'none'],
      [STATUS_TOOL, 'rejected', 'none'],
    ]);
    assert.match(toolResults(result)[0].output.meaning, /waiting for a person to approve it/);
    assert.equal(toolResults(result)[3].output.error.code, 'not_found');
    assert.equal(fake.effectsFor(key), 1);
    assert.equal(fake.requestsFor(key), 1);
  });
});
