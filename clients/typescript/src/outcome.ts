// Outcomes: what the gateway says happened to one delivery, as a discriminated union on
// `outcome`. The label is read from the body's `outcome` member, which every answer has
// (outcome or problem); the HTTP status is kept for diagnostics and never decides the label:
// 202 is `unknown` or an in-flight operation awaiting approval, and only the body tells which.

/** The five labels. */
export type Label = 'applied' | 'replayed' | 'in_flight' | 'rejected' | 'unknown';

/** What the caller should do next. */
export type NextAction = 'none' | 'poll' | 'reconcile' | 'ask_for_approval' | 'inspect_operation';

/** The gateway's stable error codes. Later gateways may add codes; they arrive as strings. */
export type ErrorCode =
  | 'invalid_arguments'
  | 'missing_operation_key'
  | 'invalid_operation_key'
  | 'idempotency_key_reused_with_different_request'
  | 'possible_duplicate_intent'
  | 'unauthorized'
  | 'forbidden'
  | 'authorization_unavailable'
  | 'approval_denied'
  | 'approval_expired'
  | 'expired_operation'
  | 'downstream_rejected'
  | 'downstream_unavailable'
  | 'precondition_failed'
  | 'outcome_unknown'
  | 'store_unavailable'
  | 'effect_class_refused'
  | 'unknown_tool'
  | 'not_found'
  | 'conflict'
  | 'webhook_signature_invalid'
  | 'internal_error'
  | (string & {});

/** The members every outcome has. */
interface OutcomeFields {
  /** `tenant:environment:workflow_id:step_id`, when the delivery named an operation. */
  operationKey: string | null;
  /** The downstream's receipt (ticket id, provider message id, job id). */
  effectReference: string | null;
  /** May this business action be attempted again without risking a second effect? */
  safeToRepeat: boolean;
  nextAction: NextAction;
  /** Seconds to wait before polling, when the gateway advises it. */
  retryAfter: number | null;
  /** The replay-safe result stored with the receipt. */
  result: unknown;
  error: { code: ErrorCode; message: string } | null;
  /** The HTTP status of the answer: for diagnostics only. */
  httpStatus: number;
  /** The answer's JSON body as the gateway sent it. */
  body: Record<string, unknown>;
}

/** This delivery performed the effect, once, and recorded it. */
export interface Applied extends OutcomeFields {
  outcome: 'applied';
  effectReference: string;
}

/** The operation had already been applied: the stored result, no new effect. */
export interface Replayed extends OutcomeFields {
  outcome: 'replayed';
  effectReference: string;
}

/**
 * Still running (another delivery owns it, or a job runs), or waiting for an operator's
 * approval (`nextAction: 'ask_for_approval'`). No new effect was started by this delivery.
 */
export interface InFlight extends OutcomeFields {
  outcome: 'in_flight';
  nextAction: 'poll' | 'ask_for_approval';
  /** True while an operator has to approve or deny the operation. */
  awaitingApproval: boolean;
}

/** Refused: nothing new happened. `safeToRepeat` says whether the action may be tried again. */
export interface Rejected extends OutcomeFields {
  outcome: 'rejected';
  code: ErrorCode;
  message: string;
  /** The RFC 9457 problem type, `<gateway>/problems/<code>`: a page explaining the code. */
  problemType: string | null;
}

/** The effect may have happened and cannot be proved: never resend; an operator reconciles. */
export interface Unknown extends OutcomeFields {
  outcome: 'unknown';
  nextAction: 'reconcile';
}

export type Outcome = Applied | Replayed | InFlight | Rejected | Unknown;

const LABELS: ReadonlySet<string> = new Set(['applied', 'replayed', 'in_flight', 'rejected', 'unknown']);

/** Why a body could not be read as an outcome, or `null` when it can. */
export function outcomeProblem(body: unknown): string | null {
  if (typeof body !== 'object' || body === null || Array.isArray(body)) {
    return 'the answer is not a JSON object';
  }
  const label = (body as Record<string, unknown>).outcome;
  if (typeof label !== 'string') {
    return 'the answer has no `outcome` member (is this an idemgate gateway of API v1 with `outcome` in every body?)';
  }
  if (!LABELS.has(label)) return `the answer's outcome ${JSON.stringify(label).slice(0, 40)} is not a known label`;
  const reference = (body as Record<string, unknown>).effect_reference;
  if ((label === 'applied' || label === 'replayed') && (typeof reference !== 'string' || reference === '')) {
    return `an ${label} answer without an effect_reference`;
  }
  return null;
}

function text(v: unknown): string | null {
  return typeof v === 'string' ? v : null;
}

function seconds(v: unknown): number | null {
  return typeof v === 'number' && Number.isFinite(v) && v >= 0 ? v : null;
}

/**
 * Reads an outcome from a body the caller checked with {@link outcomeProblem}. `retryAfterHeader`
 * is the `Retry-After` header, used when the body carries no advice.
 */
export function readOutcome(
  body: Record<string, unknown>,
  httpStatus: number,
  retryAfterHeader: string | null = null,
): Outcome {
  const rawError = body.error as { code?: unknown; message?: unknown } | null | undefined;
  const error =
    rawError && typeof rawError === 'object'
      ? { code: String(rawError.code ?? 'internal_error'), message: String(rawError.message ?? '') }
      : null;
  const headerSeconds = retryAfterHeader !== null && /^\d+$/.test(retryAfterHeader.trim())
    ? Number(retryAfterHeader.trim())
    : null;
  const fields = {
    operationKey: text(body.operation_key),
    effectReference: text(body.effect_reference),
    safeToRepeat: body.safe_to_repeat === true,
    nextAction: (text(body.next_action) ?? 'none') as NextAction,
    retryAfter: seconds(body.retry_after_seconds) ?? headerSeconds,
    result: body.result ?? null,
    error,
    httpStatus,
    body,
  };
  const label = body.outcome as Label;
  switch (label) {
    case 'applied':
    case 'replayed':
      return { ...fields, outcome: label, effectReference: fields.effectReference ?? '' };
    case 'in_flight': {
      const awaitingApproval = fields.nextAction === 'ask_for_approval';
      return {
        ...fields,
        outcome: 'in_flight',
        nextAction: awaitingApproval ? 'ask_for_approval' : 'poll',
        awaitingApproval,
      };
    }
    case 'rejected': {
      const problemType = text(body.type);
      // `<gateway>/problems/<code>`: the code is the type's last path segment.
      const fromType = problemType?.match(/\/problems\/([a-z_]+)$/)?.[1] ?? null;
      const code = error?.code ?? fromType ?? 'internal_error';
      const message = error?.message || text(body.detail) || text(body.title) || code;
      return { ...fields, outcome: 'rejected', code, message, problemType };
    }
    case 'unknown':
      return { ...fields, outcome: 'unknown', nextAction: 'reconcile' };
  }
}

/** Applied or replayed: the one effect exists and `effectReference` names it. */
export function isDone(o: Outcome): o is Applied | Replayed {
  return o.outcome === 'applied' || o.outcome === 'replayed';
}

/**
 * One sentence of what an outcome means and what to do next, for a person or a model. It never
 * invites a resend that could make a second effect.
 */
export function describeOutcome(o: Outcome): string {
  switch (o.outcome) {
    case 'applied':
      return `The action was performed now, exactly once (reference ${o.effectReference}); do not repeat it: calling again for this step only replays this result.`;
    case 'replayed':
      return `The action had already been performed (reference ${o.effectReference}); nothing new happened, this is the stored result, and it must not be requested again.`;
    case 'in_flight':
      return o.awaitingApproval
        ? 'The action is waiting for a person to approve it and has not happened yet; do not call it again, tell the user it awaits approval.'
        : `The action is still running and no second one was started; do not call it again now${
            o.retryAfter !== null ? `, its result can be read in about ${o.retryAfter} s` : ''
          }.`;
    case 'rejected':
      if (o.code === 'idempotency_key_reused_with_different_request') {
        return 'Refused: this workflow step already performed a different request, and nothing new happened; one step performs one action, so a different action needs a new step from the application.';
      }
      return o.safeToRepeat
        ? `Refused, and nothing happened (${o.code}: ${o.message}); it may be attempted again once the cause is fixed.`
        : `Refused, and nothing new happened (${o.code}: ${o.message}); do not attempt it again before the operation is inspected.`;
    case 'unknown':
      return `The action may or may not have happened and this cannot be proved yet; do not call it again and do not report it as failed: an operator reconciles it${
        o.operationKey ? ` (operation ${o.operationKey})` : ''
      }.`;
  }
}
