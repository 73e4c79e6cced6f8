// The client of the gateway's HTTP API v1. One request per call: the client never retries on
// its own, so nothing it does can start a second operation, and it never makes up an operation
// identity: the workflow and step come from the calling application.

import {
  GatewayTimeoutError,
  GatewayUnavailableError,
  IdemgateError,
  InFlightError,
  InvalidIdentityError,
  MissingIdentityError,
  ProtocolError,
  RejectedError,
  UnauthorizedError,
  UnknownOutcomeError,
  UnknownToolError,
} from './errors.js';
import { type NextAction, type Outcome, type Rejected, outcomeProblem, readOutcome } from './outcome.js';
import { checkPart, eventOf, fromWire, summaryOf } from './records.js';

export interface ClientOptions {
  /** The gateway, e.g. `http://127.0.0.1:8080`. */
  baseUrl: string;
  /** A bearer token: an agent's, or an operator's for the operator methods. */
  token: string;
  /**
   * Throw `in_flight`, `rejected` and `unknown` outcomes as errors (`InFlightError`,
   * `RejectedError`, `UnknownOutcomeError`) instead of returning them. Default false.
   */
  throw?: boolean;
  /**
   * How long one request may take before the client stops waiting, in ms (default 30 000);
   * a `wait` adds its seconds. Stopping to wait never stops the operation.
   */
  timeoutMs?: number;
  /** A `fetch` to use instead of the global one. */
  fetch?: typeof fetch;
}

export interface InvokeOptions {
  /** The workflow run, from the application's own state (never a time or a random value). */
  workflowId?: string;
  /** The step within the run, from the workflow's own plan. */
  stepId?: string;
  /** Wait up to this many seconds for an in-flight operation to settle (`Prefer: wait=N`). */
  wait?: number;
  /** Overrides the client's `throw` option for this call. */
  throw?: boolean;
  /** Stops waiting for the answer (not the operation). */
  signal?: AbortSignal;
}

export type EffectClass = 'read' | 'natural_idempotent' | 'key_based' | 'irreversible';

/** A loaded tool, as `GET /v1/tools` describes it. */
export interface ToolInfo {
  name: string;
  version: string;
  /** The model-facing description. */
  description: string;
  effectClass: EffectClass;
  /** `required`: the tool needs a workflow and step; `optional`; `ignored` (reads). */
  operationIdentity: 'required' | 'optional' | 'ignored';
  approval: 'never' | 'always' | 'when_matches';
  /** The JSON Schema of the arguments. */
  inputSchema: Record<string, unknown>;
}

export type RecordStatus =
  | 'pending'
  | 'awaiting_approval'
  | 'applied'
  | 'failed_permanent'
  | 'unknown'
  | 'tombstone';

/** An operation's stored record. Times are milliseconds since the Unix epoch. */
export interface OperationSummary {
  operationKey: string;
  tool: string;
  toolVersion: string;
  recordStatus: RecordStatus | (string & {});
  fingerprint: string;
  /** The fencing token: grows on every takeover. */
  attempt: number;
  effectReference: string | null;
  jobId: string | null;
  approvedBy: string | null;
  createdAt: number;
  updatedAt: number;
  /** Null while the operation has not settled: its retention counts from settlement. */
  expiresAt: number | null;
}

export interface OperationEvent {
  kind: string;
  at: number;
  attempt: number;
  worker: string;
  detail: string | null;
}

/** `GET /v1/operations/{key}`: the record, its receipt, the outcome a poll gives, its trace. */
export interface Operation extends OperationSummary {
  receipt: { reference: string; result: unknown } | null;
  outcome: Outcome;
  events: OperationEvent[];
}

export interface OperationFilter {
  status?: RecordStatus;
  tool?: string;
  /** Keys after this one: the previous page's `nextAfter`. */
  after?: string;
  /** 1 to 500 (default 100). */
  limit?: number;
}

export interface OperationPage {
  operations: OperationSummary[];
  /** Pass as `after` for the next page; null on the last one. */
  nextAfter: string | null;
}

/** Options of the operator's actions. */
export interface ActionOptions {
  throw?: boolean;
  signal?: AbortSignal;
  /** Why, for the gateway's audit log (at most 500 characters); left out, "no reason given". */
  reason?: string;
}

interface Answer {
  status: number;
  headers: Headers;
  body: unknown;
  url: string;
}

/** What one request carries besides its method and path. */
interface RequestOptions {
  body?: unknown;
  headers?: Record<string, string>;
  /** Added to the client's timeout: a `wait`'s seconds. */
  extraMs?: number;
  signal?: AbortSignal;
}

const DEFAULT_TIMEOUT_MS = 30_000;

function toolOf(o: Record<string, unknown>): ToolInfo {
  return fromWire<ToolInfo>(o, {
    name: '', version: '', description: '', effectClass: 'key_based', operationIdentity: 'required',
    approval: 'never', inputSchema: {},
  });
}

/** The path of the operation under `operationKey`. */
function operationPath(operationKey: string): string {
  return `/v1/operations/${encodeURIComponent(operationKey)}`;
}

/** The connection error's code, looked up through `cause` chains (undici wraps them). */
function errorCode(e: unknown): string | null {
  let current: unknown = e;
  for (let depth = 0; depth < 5 && current && typeof current === 'object'; depth += 1) {
    const code = (current as { code?: unknown }).code;
    if (typeof code === 'string') return code;
    current = (current as { cause?: unknown }).cause;
  }
  return null;
}

/** Codes that say the connection was never made: nothing reached the gateway. */
const NOT_CONNECTED = new Set([
  'ECONNREFUSED',
  'ENOTFOUND',
  'EAI_AGAIN',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'EADDRNOTAVAIL',
  'UND_ERR_CONNECT_TIMEOUT',
  'ERR_INVALID_URL',
]);

export class Client {
  readonly baseUrl: string;
  readonly #token: string;
  readonly #throw: boolean;
  readonly #timeoutMs: number;
  readonly #fetch: typeof fetch;

  constructor(options: ClientOptions) {
    if (!options || typeof options.baseUrl !== 'string' || options.baseUrl === '') {
      throw new IdemgateError('new Client({ baseUrl, token }): baseUrl is required, e.g. http://127.0.0.1:8080');
    }
    let parsed: URL;
    try {
      parsed = new URL(options.baseUrl);
    } catch {
      throw new IdemgateError(`new Client: baseUrl ${JSON.stringify(options.baseUrl)} is not a URL`);
    }
    if (parsed.protocol !== 'http:' && parsed.protocol !== 'https:') {
      throw new IdemgateError(`new Client: baseUrl ${options.baseUrl} is not an http or https URL`);
    }
    if (typeof options.token !== 'string' || options.token === '') {
      throw new IdemgateError('new Client({ baseUrl, token }): token is required');
    }
    this.baseUrl = options.baseUrl.replace(/\/+$/, '');
    this.#token = options.token;
    this.#throw = options.throw ?? false;
    this.#timeoutMs = options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    const f = options.fetch ?? globalThis.fetch;
    if (typeof f !== 'function') throw new IdemgateError('no global fetch: use Node 20 or later, or pass options.fetch');
    this.#fetch = f;
  }

  /** A workflow run, named from the application's own state: its steps name operations. */
  workflow(workflowId: string): Workflow {
    return new Workflow(this, workflowId);
  }

  /**
   * Invokes `tool` with `args`. Key-based and irreversible tools need `workflowId` and
   * `stepId` (or go through `workflow(id).step(name)`); without them a `MissingIdentityError`
   * names the tool. Returns the outcome; with the `throw` option, anything but applied or
   * replayed is thrown.
   */
  async invoke(tool: string, args: Record<string, unknown> = {}, options: InvokeOptions = {}): Promise<Outcome> {
    if (typeof tool !== 'string' || tool === '') throw new IdemgateError('invoke: the tool name is required');
    const body: Record<string, unknown> = { arguments: args };
    const hasWorkflow = options.workflowId !== undefined;
    const hasStep = options.stepId !== undefined;
    if (hasWorkflow !== hasStep) {
      throw new InvalidIdentityError(
        `${tool}: name both workflowId and stepId, or neither (got only ${hasWorkflow ? 'workflowId' : 'stepId'})`,
      );
    }
    if (hasWorkflow) {
      body.workflow_id = checkPart('workflowId', options.workflowId);
      body.step_id = checkPart('stepId', options.stepId);
    }
    const headers: Record<string, string> = {};
    let extraMs = 0;
    if (options.wait !== undefined) {
      if (!Number.isInteger(options.wait) || options.wait < 0) {
        throw new IdemgateError(`invoke ${tool}: wait is a whole number of seconds, not ${options.wait}`);
      }
      headers.prefer = `wait=${options.wait}`;
      extraMs = options.wait * 1000;
    }
    const path = `/v1/tools/${encodeURIComponent(tool)}/invoke`;
    return this.#send(path, { body, headers, extraMs, signal: options.signal }, options.throw, tool);
  }

  /** The loaded tools. */
  async tools(options: { signal?: AbortSignal } = {}): Promise<ToolInfo[]> {
    const { items } = await this.#list('/v1/tools', 'tools', options);
    return items.map(toolOf);
  }

  /** One loaded tool; an `UnknownToolError` names a tool the gateway does not have. */
  async tool(name: string, options: { signal?: AbortSignal } = {}): Promise<ToolInfo> {
    const answer = await this.#request('GET', `/v1/tools/${encodeURIComponent(name)}`, options);
    return toolOf(this.#data(answer, name));
  }

  /** The operation under `operationKey`, or null when this tenant has none under it. */
  async operation(operationKey: string, options: { signal?: AbortSignal } = {}): Promise<Operation | null> {
    const answer = await this.#request('GET', operationPath(operationKey), options);
    if (answer.status === 404 && this.#problemCode(answer) === 'not_found') return null;
    const body = this.#data(answer);
    const rawOutcome = body.outcome;
    const problem = outcomeProblem(rawOutcome);
    if (problem) throw new ProtocolError(answer.url, answer.status, `the operation's outcome: ${problem}`);
    const receipt = body.receipt as { reference?: unknown; result?: unknown } | null;
    return {
      ...summaryOf(body),
      receipt: receipt ? { reference: String(receipt.reference ?? ''), result: receipt.result ?? null } : null,
      outcome: readOutcome(rawOutcome as Record<string, unknown>, answer.status),
      events: (Array.isArray(body.events) ? body.events : []).map(eventOf),
    };
  }

  /** Operator: a page of the tenant's operations; `status: 'unknown'` is the reconciliation queue. */
  async operations(filter: OperationFilter = {}, options: { signal?: AbortSignal } = {}): Promise<OperationPage> {
    const query = new URLSearchParams();
    for (const name of ['status', 'tool', 'after', 'limit'] as const) {
      const value = filter[name];
      if (value !== undefined) query.set(name, String(value));
    }
    const qs = query.toString();
    const { items, body } = await this.#list(`/v1/operations${qs ? `?${qs}` : ''}`, 'operations', options);
    return { operations: items.map(summaryOf), nextAfter: (body.next_after as string | null) ?? null };
  }

  /** Operator: look the operation's receipt up at the downstream now. */
  async reconcile(operationKey: string, options: ActionOptions = {}): Promise<Outcome> {
    return this.#action(operationKey, 'reconcile', undefined, options);
  }

  /** Operator: the effect happened; record its reference (and the result to replay). */
  async resolveApplied(
    operationKey: string,
    resolution: { effectReference: string; result?: unknown },
    options: ActionOptions = {},
  ): Promise<Outcome> {
    if (typeof resolution?.effectReference !== 'string' || resolution.effectReference.trim() === '') {
      throw new IdemgateError(`resolveApplied ${operationKey}: effectReference is required`);
    }
    const body: Record<string, unknown> = { resolution: 'applied', effect_reference: resolution.effectReference };
    if (resolution.result !== undefined) body.result = resolution.result;
    return this.#action(operationKey, 'reconcile', body, options);
  }

  /** Operator: the effect did not happen; the key may run again. */
  async resolveNotApplied(operationKey: string, options: ActionOptions = {}): Promise<Outcome> {
    return this.#action(operationKey, 'reconcile', { resolution: 'not_applied' }, options);
  }

  /** Operator: approve an operation awaiting approval, bound to `fingerprint` when given. */
  async approve(operationKey: string, approval: { fingerprint?: string } = {}, options: ActionOptions = {}): Promise<Outcome> {
    const body = approval.fingerprint !== undefined ? { fingerprint: approval.fingerprint } : undefined;
    return this.#action(operationKey, 'approve', body, options);
  }

  /** Operator: deny an operation awaiting approval; every later delivery replays the refusal. */
  async deny(operationKey: string, denial: { reason?: string } = {}, options: ActionOptions = {}): Promise<Outcome> {
    return this.#action(operationKey, 'deny', undefined, { ...options, reason: denial.reason ?? options.reason });
  }

  async #action(
    operationKey: string,
    action: 'reconcile' | 'approve' | 'deny',
    body: Record<string, unknown> | undefined,
    options: ActionOptions,
  ): Promise<Outcome> {
    if (typeof operationKey !== 'string' || operationKey === '') {
      throw new IdemgateError(`${action}: the operation key is required`);
    }
    if (options.reason !== undefined) {
      if (typeof options.reason !== 'string' || options.reason.trim() === '') {
        throw new IdemgateError(`${action} ${operationKey}: reason must be a non-empty text, or left out`);
      }
      // No body looks the receipt up; with a reason, that is the explicit `lookup` resolution.
      body = { ...(body ?? (action === 'reconcile' ? { resolution: 'lookup' } : {})), reason: options.reason };
    }
    return this.#send(`${operationPath(operationKey)}/${action}`, { body, signal: options.signal }, options.throw);
  }

  /**
   * The one path of the calls that answer an outcome (`invoke` and the operator's actions):
   * POSTs, reads the outcome and settles it by the `throw` option. With `tool` (an invoke), an
   * unknown tool or a missing identity is thrown as its own error.
   */
  async #send(path: string, request: RequestOptions, throwOption: boolean | undefined, tool?: string): Promise<Outcome> {
    const outcome = this.#outcome(await this.#request('POST', path, request));
    if (tool !== undefined && outcome.outcome === 'rejected') {
      if (outcome.code === 'unknown_tool') throw new UnknownToolError(tool, outcome);
      if (outcome.code === 'missing_operation_key') throw new MissingIdentityError(tool, outcome);
    }
    return this.#settle(outcome, throwOption, tool);
  }

  /** GETs a list: the `member` array of the data answer, and the answer's body. */
  async #list(
    path: string,
    member: string,
    options: { signal?: AbortSignal },
  ): Promise<{ items: Record<string, unknown>[]; body: Record<string, unknown> }> {
    const answer = await this.#request('GET', path, options);
    const body = this.#data(answer);
    const items = body[member];
    if (!Array.isArray(items)) throw new ProtocolError(answer.url, answer.status, `no \`${member}\` list`);
    return { items, body };
  }

  /** Returns the outcome, or throws it when the `throw` option asks for it. */
  #settle(outcome: Outcome, throwOption: boolean | undefined, tool?: string): Outcome {
    if (!(throwOption ?? this.#throw)) return outcome;
    switch (outcome.outcome) {
      case 'applied':
      case 'replayed':
        return outcome;
      case 'in_flight':
        throw new InFlightError(outcome, tool);
      case 'rejected':
        throw new RejectedError(outcome);
      case 'unknown':
        throw new UnknownOutcomeError(outcome, tool);
    }
  }

  /** Reads an answer's outcome from its `outcome` member; a refused token is always thrown. */
  #outcome(answer: Answer): Outcome {
    const problem = outcomeProblem(answer.body);
    if (problem) throw new ProtocolError(answer.url, answer.status, problem);
    const outcome = readOutcome(answer.body as Record<string, unknown>, answer.status, answer.headers.get('retry-after'));
    if (outcome.outcome === 'rejected' && outcome.code === 'unauthorized') {
      throw new UnauthorizedError(this.baseUrl, outcome);
    }
    return outcome;
  }

  #problemCode(answer: Answer): string | null {
    if (outcomeProblem(answer.body) !== null) return null;
    const o = readOutcome(answer.body as Record<string, unknown>, answer.status);
    return o.outcome === 'rejected' ? o.code : null;
  }

  /** The body of a data answer (2xx); a problem is thrown as the matching error. */
  #data(answer: Answer, tool?: string): Record<string, unknown> {
    if (answer.status >= 200 && answer.status < 300) {
      if (typeof answer.body !== 'object' || answer.body === null || Array.isArray(answer.body)) {
        throw new ProtocolError(answer.url, answer.status, 'the answer is not a JSON object');
      }
      return answer.body as Record<string, unknown>;
    }
    const outcome = this.#outcome(answer);
    if (outcome.outcome !== 'rejected') {
      throw new ProtocolError(answer.url, answer.status, `an ${outcome.outcome} answer where data was expected`);
    }
    if (outcome.code === 'unknown_tool' && tool !== undefined) throw new UnknownToolError(tool, outcome as Rejected);
    throw new RejectedError(outcome);
  }

  async #request(method: 'GET' | 'POST', path: string, options: RequestOptions): Promise<Answer> {
    const url = `${this.baseUrl}${path}`;
    const timeoutMs = this.#timeoutMs + (options.extraMs ?? 0);
    const timeout = AbortSignal.timeout(timeoutMs);
    const signal = options.signal ? AbortSignal.any([options.signal, timeout]) : timeout;
    const headers: Record<string, string> = {
      authorization: `Bearer ${this.#token}`,
      accept: 'application/json, application/problem+json',
      ...options.headers,
    };
    let init: RequestInit = { method, headers, signal };
    if (options.body !== undefined) {
      headers['content-type'] = 'application/json';
      init = { ...init, body: JSON.stringify(options.body) };
    }
    let response: Response;
    let text: string;
    try {
      response = await this.#fetch(url, init);
      text = await response.text();
    } catch (e) {
      if (options.signal?.aborted) throw options.signal.reason ?? e;
      if (timeout.aborted) throw new GatewayTimeoutError(url, timeoutMs, e);
      const code = errorCode(e);
      const notConnected = code !== null && NOT_CONNECTED.has(code);
      const reason = code ?? (e instanceof Error ? e.message : String(e));
      // A request that never connected cannot have been received; anything later might.
      throw new GatewayUnavailableError(url, reason, !notConnected, e);
    }
    let body: unknown = null;
    if (text !== '') {
      try {
        body = JSON.parse(text);
      } catch {
        throw new ProtocolError(url, response.status, `the body is not JSON: ${JSON.stringify(text.slice(0, 80))}`);
      }
    }
    return { status: response.status, headers: response.headers, body, url };
  }
}

/** A workflow run. Its steps name operations: `workflow(runId).step('record_issue')`. */
export class Workflow {
  readonly client: Client;
  readonly workflowId: string;
  constructor(client: Client, workflowId: string) {
    this.client = client;
    this.workflowId = checkPart('workflowId', workflowId);
  }

  /** A step of this run, named from the workflow's own plan (never a time or random value). */
  step(stepId: string): Step {
    return new Step(this, stepId);
  }
}

/** One step of a workflow run: the identity of one operation. */
export class Step {
  readonly workflow: Workflow;
  readonly stepId: string;
  constructor(workflow: Workflow, stepId: string) {
    this.workflow = workflow;
    this.stepId = checkPart('stepId', stepId);
  }

  get workflowId(): string {
    return this.workflow.workflowId;
  }

  /** Invokes `tool` as this step's operation. Invoking it again replays; it never runs twice. */
  invoke(
    tool: string,
    args: Record<string, unknown> = {},
    options: Omit<InvokeOptions, 'workflowId' | 'stepId'> = {},
  ): Promise<Outcome> {
    return this.workflow.client.invoke(tool, args, {
      ...options,
      workflowId: this.workflow.workflowId,
      stepId: this.stepId,
    });
  }
}

