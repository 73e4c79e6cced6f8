// Compiled, never run (`npm run typecheck`): the published types narrow the way the README
// says. A line marked @ts-expect-error fails the check if it ever compiles.

import { Client, type Outcome, RejectedError, describeOutcome } from 'idemgate';
import { idemgateTool, type ModelResult } from 'idemgate/ai';
import type { Tool } from 'ai';
import { Job, JobGone, Local, Receipt, NotSent, Refused, step, workflow } from 'idemgate/local';

declare const client: Client;

export async function narrowing(): Promise<string> {
  const o: Outcome = await client.workflow('run_827').step('record_issue').invoke('tickets.create', { subject: 's', body: 'b' });
  switch (o.outcome) {
    case 'applied':
    case 'replayed': {
      const reference: string = o.effectReference;
      return reference;
    }
    case 'in_flight': {
      const next: 'poll' | 'ask_for_approval' = o.nextAction;
      const approval: boolean = o.awaitingApproval;
      return `${next} ${approval} ${o.retryAfter ?? 0}`;
    }
    case 'rejected': {
      const status: number = o.httpStatus;
      return `${o.code} ${o.message} ${status} ${o.safeToRepeat}`;
    }
    case 'unknown': {
      const next: 'reconcile' = o.nextAction;
      return next;
    }
  }
}

export function rejectedOnly(o: Outcome): string {
  // @ts-expect-error `code` exists only once the outcome is narrowed to rejected.
  const code: string = o.code;
  return code + describeOutcome(o);
}

export function errors(e: unknown): string | null {
  return e instanceof RejectedError ? e.code : null;
}

export const aiTool: Tool<Record<string, unknown>, ModelResult> = idemgateTool(client, 'tickets.create', {
  workflowId: 'run_827',
  stepId: 'record_issue',
  inputSchema: { type: 'object' },
});

// idemgate/local: the guarded function keeps its arguments' type and answers the same outcomes.

declare const local: Local;

export const issueRefund = local.tool(
  'refunds.issue',
  { fingerprint: ['orderId', 'amount'], lookup: (key: string) => new Receipt(key) },
  async (args: { orderId: string; amount: number }, { idempotencyKey }) => {
    if (args.amount <= 0) throw new NotSent('nothing to refund');
    return new Receipt(`re_${idempotencyKey}`, { amount: args.amount });
  },
);

export async function inProcess(): Promise<string> {
  const o: Outcome = await workflow('run_1', () => step('refund', () => issueRefund({ orderId: 'pi_42', amount: 1200 })));
  // @ts-expect-error the guarded function checks its arguments.
  await issueRefund({ orderId: 42 });
  const same: Outcome = await local.invoke('refunds.issue', { orderId: 'pi_42', amount: 1200 }, { workflowId: 'run_1', stepId: 'refund' });
  return o.outcome === 'applied' || same.outcome === 'replayed' ? 'done' : 'other';
}

// A job: the function returns a Job, the poller a Receipt (done) or null (running), or throws.
export const generateReport = local.tool(
  'reports.generate',
  {
    fingerprint: ['period'],
    poll: async (jobId: string, { idempotencyKey }) => {
      if (jobId === 'lost') throw new JobGone(`no job for ${idempotencyKey}`);
      if (jobId === 'failed') throw new Refused('period_closed');
      return jobId === 'done' ? new Receipt(`report-${jobId}`) : null;
    },
  },
  async (args: { period: string }) => new Job(`job-${args.period}`),
);

// @ts-expect-error a poller answers a Receipt or null, not a bare result.
local.tool('reports.other', { poll: () => ({ pages: 2 }) }, () => new Job('j'));
