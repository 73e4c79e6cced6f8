// The errors the client throws. Every one is an `IdemgateError`; the outcome errors carry the
// outcome they stand for, so code that catches them can still read the operation key.

import type { InFlight, Outcome, Rejected, Unknown } from './outcome.js';

/** The base of every error this package throws. */
export class IdemgateError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
  }
}

/**
 * The base of the errors about one request to the gateway (unreachable, no answer in time, an
 * answer that is not the gateway's): each names the request's URL. Not exported: code catches
 * the concrete classes, or `IdemgateError`.
 */
abstract class RequestError extends IdemgateError {
  readonly url: string;
  constructor(url: string, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.url = url;
  }
}

/**
 * The gateway could not be reached or the connection broke. `maybeReceived` is false when the
 * connection was never made (nothing reached the gateway), true when it broke after the
 * request may have been sent: then the operation may exist. Either way invoking again with the
 * same workflow and step is safe (it replays or reports in flight); the client never does so on
 * its own.
 */
export class GatewayUnavailableError extends RequestError {
  readonly maybeReceived: boolean;
  constructor(url: string, reason: string, maybeReceived: boolean, cause?: unknown) {
    super(
      url,
      maybeReceived
        ? `the connection to the idemgate gateway at ${url} broke (${reason}); the request may have been received: ` +
            'invoke again with the same workflow and step to learn its outcome (it cannot run twice)'
        : `the idemgate gateway at ${url} could not be reached (${reason}); nothing was received by it`,
      { cause },
    );
    this.maybeReceived = maybeReceived;
  }
}

/**
 * The gateway did not answer within the client's timeout. The operation may be running: its
 * effect does not depend on this connection.
 */
export class GatewayTimeoutError extends RequestError {
  readonly timeoutMs: number;
  constructor(url: string, timeoutMs: number, cause?: unknown) {
    super(
      url,
      `the idemgate gateway at ${url} did not answer within ${timeoutMs} ms; the operation may still be running: ` +
        'invoke again with the same workflow and step, or read the operation, to learn its outcome',
      { cause },
    );
    this.timeoutMs = timeoutMs;
  }
}

/** An answer that is not one the gateway's API v1 gives (a proxy's error page, say). */
export class ProtocolError extends RequestError {
  readonly httpStatus: number;
  constructor(url: string, httpStatus: number, reason: string) {
    super(url, `unexpected answer from ${url} (HTTP ${httpStatus}): ${reason}`);
    this.httpStatus = httpStatus;
  }
}

/** A workflow or step id that cannot name an operation; found before anything is sent. */
export class InvalidIdentityError extends IdemgateError {}

/** An outcome thrown as an error: by the `throw` option, or by the always-thrown rejections. */
export class OutcomeError extends IdemgateError {
  readonly outcome: Outcome;
  constructor(message: string, outcome: Outcome) {
    super(message);
    this.outcome = outcome;
  }
  get operationKey(): string | null {
    return this.outcome.operationKey;
  }
}

/** `in_flight`: still running, or awaiting approval. Poll; do not send a new operation. */
export class InFlightError extends OutcomeError {
  declare readonly outcome: InFlight;
  constructor(outcome: InFlight, tool?: string) {
    super(
      outcome.awaitingApproval
        ? `${tool ?? 'the operation'} awaits an operator's approval (operation ${outcome.operationKey})`
        : `${tool ?? 'the operation'} is still in flight (operation ${outcome.operationKey}); poll after ${
            outcome.retryAfter ?? 1
          } s`,
      outcome,
    );
  }
  get retryAfter(): number | null {
    return this.outcome.retryAfter;
  }
  get awaitingApproval(): boolean {
    return this.outcome.awaitingApproval;
  }
}

/** `rejected`: nothing new happened. */
export class RejectedError extends OutcomeError {
  declare readonly outcome: Rejected;
  constructor(outcome: Rejected, message?: string) {
    super(message ?? `rejected (${outcome.code}, HTTP ${outcome.httpStatus}): ${outcome.message}`, outcome);
  }
  get code(): string {
    return this.outcome.code;
  }
  get httpStatus(): number {
    return this.outcome.httpStatus;
  }
  get safeToRepeat(): boolean {
    return this.outcome.safeToRepeat;
  }
}

/** The gateway has no tool of that name. Always thrown. */
export class UnknownToolError extends RejectedError {
  readonly tool: string;
  constructor(tool: string, outcome: Rejected) {
    super(outcome, `the idemgate gateway has no tool named ${JSON.stringify(tool)}: ${outcome.message}`);
    this.tool = tool;
  }
}

/**
 * A key-based or irreversible tool was invoked without a workflow and step. Nothing was
 * recorded or sent. Always thrown.
 */
export class MissingIdentityError extends RejectedError {
  readonly tool: string;
  constructor(tool: string, outcome: Rejected) {
    super(
      outcome,
      `${tool} needs an operation identity: invoke it through client.workflow(runId).step(name), ` +
        `or pass workflowId and stepId from the workflow's own state (${outcome.message})`,
    );
    this.tool = tool;
  }
}

/** The token was not accepted. Always thrown. */
export class UnauthorizedError extends RejectedError {
  constructor(url: string, outcome: Rejected) {
    super(outcome, `the idemgate gateway at ${url} did not accept the token: ${outcome.message}`);
  }
}

/** `unknown`: the effect may have happened. Never resend; an operator reconciles it. */
export class UnknownOutcomeError extends OutcomeError {
  declare readonly outcome: Unknown;
  constructor(outcome: Unknown, tool?: string) {
    super(
      `the outcome of ${tool ?? 'the operation'} is unknown (operation ${outcome.operationKey}): ` +
        'it may have happened; do not send it again, an operator reconciles it',
      outcome,
    );
  }
}
