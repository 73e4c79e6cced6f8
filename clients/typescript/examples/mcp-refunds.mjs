// An MCP server written with the official TypeScript MCP SDK whose tool is a function guarded by
// idemgate's engine in process (idemgate/local), and a client that calls it twice, then again
// through a fresh server process: one refund, however often the tool is called.
//
//   npm ci && npm run build && npm run build:native     # once, in clients/typescript
//   node examples/mcp-refunds.mjs                       # the client: starts the server itself
//
// The "payment provider" is a file of refunds (REFUNDS_FILE, one JSON line per refund), so the
// effect can be counted where it happens; the store is SQLite (IDEMGATE_STORE). Both default
// to a fresh temporary directory. `node examples/mcp-refunds.mjs server` is the server alone,
// on stdio, for an MCP host.

import { appendFileSync, existsSync, mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { StdioServerTransport } from '@modelcontextprotocol/sdk/server/stdio.js';
import { z } from 'zod';

import { describeOutcome } from 'idemgate';
import { Local, Receipt } from 'idemgate/local';

/** The refunds the provider made: one JSON line each, with the idempotency key it was given. */
function refunds(file) {
  return existsSync(file) ? readFileSync(file, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l)) : [];
}

async function server(store, refundsFile) {
  const local = new Local(`sqlite://${store}`, { tenant: 'acme', environment: 'example' });
  const issueRefund = local.tool(
    'refunds.issue',
    {
      fingerprint: ['order_id', 'amount'],
      // If an answer is lost, the engine asks the provider whether the refund exists.
      lookup: (key) => {
        const found = refunds(refundsFile).find((r) => r.idempotency_key === key);
        return found ? new Receipt(found.id, { amount: found.amount }) : null;
      },
    },
    async ({ order_id, amount }, { idempotencyKey }) => {
      const refund = { id: `re_${refunds(refundsFile).length + 1}`, order_id, amount, idempotency_key: idempotencyKey };
      appendFileSync(refundsFile, `${JSON.stringify(refund)}\n`);
      return new Receipt(refund.id, { amount });
    },
  );

  const mcp = new McpServer({ name: 'refunds', version: '1.0.0' });
  mcp.registerTool(
    'refunds_issue',
    {
      description: 'Refunds an order. Calling it again for the same conversation and order replays the first answer.',
      inputSchema: { conversation_id: z.string().min(1), order_id: z.string().min(1), amount: z.number().int().positive() },
    },
    async ({ conversation_id, order_id, amount }) => {
      // The operation: the conversation (the workflow run) and the order (the step), never the
      // request id, which is new for every call.
      const outcome = await issueRefund({ order_id, amount }, { workflowId: conversation_id, stepId: `refund-${order_id}` });
      const answer = { outcome: outcome.outcome, effect_reference: outcome.effectReference, meaning: describeOutcome(outcome) };
      return { content: [{ type: 'text', text: JSON.stringify(answer) }], isError: outcome.outcome === 'rejected' };
    },
  );
  await mcp.connect(new StdioServerTransport());
}

/** Starts a server process, calls the tool `times` times, and closes it. */
async function session(env, times) {
  const client = new Client({ name: 'mcp-refunds-example', version: '1.0.0' });
  await client.connect(
    new StdioClientTransport({ command: process.execPath, args: [fileURLToPath(import.meta.url), 'server'], env: { ...process.env, ...env } }),
  );
  const answers = [];
  try {
    for (let i = 0; i < times; i += 1) {
      const result = await client.callTool({
        name: 'refunds_issue',
        arguments: { conversation_id: 'conv-7', order_id: 'pi_42', amount: 1200 },
      });
      answers.push(JSON.parse(result.content[0].text));
    }
  } finally {
    await client.close();
  }
  return answers;
}

async function main() {
  const dir = mkdtempSync(join(tmpdir(), 'idemgate-mcp-example-'));
  const env = {
    IDEMGATE_STORE: process.env.IDEMGATE_STORE ?? join(dir, 'refunds.sqlite'),
    REFUNDS_FILE: process.env.REFUNDS_FILE ?? join(dir, 'refunds.jsonl'),
  };
  const answers = [...(await session(env, 2)), ...(await session(env, 1))];
  for (const a of answers) console.log(`${a.outcome} ${a.effect_reference}: ${a.meaning}`);
  const made = refunds(env.REFUNDS_FILE).length;
  console.log(`refunds made: ${made}`);
  if (made !== 1) process.exit(1);
}

if (process.argv[2] === 'server') {
  const dir = process.env.IDEMGATE_STORE && process.env.REFUNDS_FILE ? null : mkdtempSync(join(tmpdir(), 'idemgate-mcp-'));
  await server(process.env.IDEMGATE_STORE ?? join(dir, 'refunds.sqlite'), process.env.REFUNDS_FILE ?? join(dir, 'refunds.jsonl'));
} else {
  await main();
}
