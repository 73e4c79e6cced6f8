// idemgate/local: idemgate's engine inside this Node process.
//
// The engine itself (the same executor as the gateway's, compiled into the native addon built
// from crates/node) claims, performs, records and recovers; nothing of that is decided here.
// This module is the face over it:
//
// - `new Local(url, { tenant, environment })` — one engine over one store: `sqlite://PATH`
//   (several processes of one host may share the file, with Python programs and `idemgate
//   serve`) or `postgres://…`, in the gateway's schema. It starts the background recoverer;
//   `close()` stops it.
// - `local.tool(name, options, fn)` — registers `fn` as the effect of a tool and returns a
//   guarded async function: calling it invokes the tool under the current `workflow` / `step`
//   identity and resolves to the labelled outcome (the HTTP client's `Outcome`).
// - `local.invoke(tool, args, { workflowId, stepId })`, `local.operation(key)` and the
//   operator's methods — the surface of the HTTP `Client`, so code moves between the two by
//   changing one constructor.
//
// Each tool's function is wrapped in an adapter that calls it and answers a small JSON array
// saying what it did; every exception of the user's code is caught and described here, and the
// engine classifies the answer. The addon is loaded with the first `Local`, by this entry point
// alone: `import 'idemgate'` never loads native code.

import { AsyncLocalStorage, AsyncResource } from 'node:async_hooks';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';

import type { ActionOptions, EffectClass, Operation, OperationFilter, OperationPage } from './client.js';
import {
  IdemgateError,
  InFlightError,
  InvalidIdentityError,
  MissingIdentityError,
  RejectedError,
  UnknownOutcomeError,
  UnknownToolError,
} from './errors.js';
import { type Outcome, type Rejected, outcomeProblem, readOutcome } from './outcome.js';
import { checkPart, eventOf, summaryOf } from './records.js';

// ---------------------------------------------------------------------------------------------
// What a tool's function answers and throws.

/** What a tool's function returns when it knows the downstream's reference for its effect. */
export class Receipt {
  readonly reference: string;
  readonly result: unknown;
  /** `reference`: the downstream's id of the effect (a refund id); `result`: what to replay. */
  constructor(reference: string, result: unknown = null) {
    this.reference = reference;
    this.result = result;
  }
}

/**
 * Thrown by a tool's function when it provably sent nothing (validation failed before the
 * call, a connection was refused): the claim is released and the call may run again.
 */
export class NotSent extends Error {
  readonly reason: string;
  /** Seconds the caller should wait before trying again, when known. */
  readonly retryAfter: number | null;
  constructor(reason: string, options: { retryAfter?: number } = {}) {
    super(reason);
    this.name = 'NotSent';
    this.reason = reason;
    this.retryAfter = options.retryAfter ?? null;
  }
}

/**
 * Thrown by a tool's function for a deterministic refusal by the downstream (a declined card):
 * the operation ends `rejected` (`downstream_rejected`) and every later delivery replays the
 * refusal without calling the function again.
 */
export class Refused extends Error {
  readonly code: string;
  constructor(code: string, message = '') {
    super(message);
    this.name = 'Refused';
    this.code = code;
  }
}

/**
 * What a tool's function returns when the downstream accepted an asynchronous job: the
 * operation stays in flight (`in_flight`, `poll`) with the job, and the tool's `poll` function
 * finishes it. The tool needs the `poll` option (its contract declares `async_jobs`).
 */
export class Job {
  readonly jobId: string;
  /** `jobId`: the downstream's id of the job, what `poll` is asked about. */
  constructor(jobId: string) {
    this.jobId = jobId;
  }
}

/**
 * Thrown by a tool's `poll` function when the downstream no longer knows the job: its outcome
 * cannot be proved, so the operation ends `unknown` for an operator.
 */
export class JobGone extends Error {
  readonly reason: string;
  constructor(reason = 'the job is no longer known') {
    super(reason);
    this.name = 'JobGone';
    this.reason = reason;
  }
}

// ---------------------------------------------------------------------------------------------
// Identity: the workflow run and step, from the application's own state.

interface Scope {
  workflowId: string | null;
  stepId: string | null;
}

const identity = new AsyncLocalStorage<Scope>();

/**
 * Runs `fn` as part of the workflow run `workflowId` (use the run id the application already
 * keeps: a job id, a thread id). Steps named outside it do not carry in.
 */
export function workflow<T>(workflowId: string, fn: () => T): T {
  return identity.run({ workflowId: checkPart('workflowId', workflowId), stepId: null }, fn);
}

/**
 * Runs `fn` as the step `stepId` of the current workflow: a name that is the same every time
 * this step is attempted (the node's or activity's name), never a counter or a time.
 */
export function step<T>(stepId: string, fn: () => T): T {
  const current = identity.getStore();
  return identity.run({ workflowId: current?.workflowId ?? null, stepId: checkPart('stepId', stepId) }, fn);
}

/** The workflow and step the calling code runs under (null parts where none is named). */
export function currentIdentity(): { workflowId: string | null; stepId: string | null } {
  const current = identity.getStore();
  return { workflowId: current?.workflowId ?? null, stepId: current?.stepId ?? null };
}

/** A rejection made here, before the engine, in the shape the engine answers. */
function rejection(code: string, message: string): Rejected {
  const body = {
    outcome: 'rejected',
    status: 'rejected',
    operation_key: null,
    effect_reference: null,
    safe_to_repeat: true,
    next_action: 'none',
    retry_after_seconds: null,
    result: null,
    error: { code, message },
  };
  return readOutcome(body, 0) as Rejected;
}

// ---------------------------------------------------------------------------------------------
// The native addon.

interface NativeLocal {
  register(
    name: string,
    spec: string | null,
    contractPath: string | null,
    timeoutSeconds: number | null,
    perform: (argumentsJson: string, key: string) => Promise<string>,
    lookup: ((key: string) => Promise<string>) | null,
    poll: ((jobId: string, key: string) => Promise<string>) | null,
    authorize: ((requestJson: string) => Promise<string>) | null,
  ): string[][];
  tools(): string[];
  invoke(tool: string, args: string, workflowId: string | null, stepId: string | null, wait: number | null): Promise<string>;
  operation(key: string): Promise<string>;
  operations(status: string | null, tool: string | null, after: string | null, limit: number | null): Promise<string>;
  reconcile(
    key: string,
    resolution: string | null,
    reference: string | null,
    result: string | null,
    reason: string | null,
  ): Promise<string>;
  approve(key: string, fingerprint: string | null, reason: string | null): Promise<string>;
  deny(key: string, reason: string | null): Promise<string>;
  close(): Promise<boolean>;
  readonly closed: boolean;
  readonly tenant: string;
  readonly environment: string;
}

interface NativeModule {
  NativeLocal: new (
    url: string,
    tenant: string,
    environment: string,
    actor: string,
    recover: boolean,
    recoveryEvery: number,
    sweepEvery: number,
    encryptionKeyEnv: string | null,
  ) => NativeLocal;
}

let native: NativeModule | null = null;

/**
 * The addon: `IDEMGATE_NATIVE` when set, else `native/idemgate.node` in this package (built by
 * `npm run build:native`).
 */
function loadNative(): NativeModule {
  if (native) return native;
  const path = process.env.IDEMGATE_NATIVE || fileURLToPath(new URL('../native/idemgate.node', import.meta.url));
  try {
    native = createRequire(import.meta.url)(path) as NativeModule;
  } catch (e) {
    throw new IdemgateError(
      `idemgate/local: the native addon could not be loaded from ${path} (${(e as Error).message}); ` +
        'build it with `npm run build:native` in clients/typescript, or set IDEMGATE_NATIVE',
      { cause: e },
    );
  }
  return native;
}

// ---------------------------------------------------------------------------------------------
// Adapters: the user's functions, called and described in the array the engine reads.

/** The longest evidence kept about an exception: its class and the start of its message. */
const MAX_EVIDENCE = 500;

function evidence(error: unknown): string {
  let described: string;
  if (error instanceof Error) {
    described = error.message ? `${error.name}: ${error.message}` : error.name;
  } else {
    try {
      described = `thrown ${typeof error}: ${String(error)}`;
    } catch {
      described = `thrown ${typeof error}`;
    }
  }
  return described.slice(0, MAX_EVIDENCE);
}

/** A refusal as its message: `code: message`, or the code alone. */
function refusal(error: Refused): string {
  return error.message ? `${error.code}: ${error.message}` : error.code;
}

/** What a function's exception says. */
function raised(tool: string, error: unknown): unknown[] {
  if (error instanceof NotSent) return ['not_sent', error.reason, error.retryAfter];
  if (error instanceof Refused) return ['refused', refusal(error)];
  process.emitWarning(
    `idemgate: tool ${tool} threw ${evidence(error)}; the effect may have happened, so the engine ` +
      'recovers it by its lookup or leaves it unknown',
    { code: 'IDEMGATE_AMBIGUOUS' },
  );
  return ['ambiguous', evidence(error)];
}

/** A value as JSON text, or null when it is not JSON (a BigInt, a cycle). */
function json(value: unknown): string | null {
  try {
    return JSON.stringify(value) ?? 'null';
  } catch {
    return null;
  }
}

/** The answer for what a function returned. */
function answerOf(tool: string, value: unknown): string {
  // A Job's id is the engine's to check (one without an id is ambiguous there), as is whether
  // the contract declares jobs at all.
  const answer =
    value instanceof Job
      ? ['job', typeof value.jobId === 'string' ? value.jobId : null]
      : value instanceof Receipt
        ? typeof value.reference === 'string' && value.reference !== ''
          ? ['committed', value.reference, value.result ?? null]
          : ['ambiguous', `tool ${tool} returned a Receipt without a reference (a non-empty string); the effect may have happened`]
        : ['committed', null, value === undefined ? null : value];
  return (
    json(answer) ??
    JSON.stringify(['ambiguous', `tool ${tool} returned a result that is not JSON; the effect may have happened`])
  );
}

/**
 * The answer `[kind, reference, result]` for the receipt a lookup or job poller returned; when
 * it returned something else, `unavailable`: it could not tell, which is never "not found".
 */
function receiptAnswer(kind: string, value: unknown, whose: string): string {
  if (value instanceof Receipt && typeof value.reference === 'string' && value.reference !== '') {
    return json([kind, value.reference, value.result ?? null]) ?? JSON.stringify(['unavailable', `${whose} returned a result that is not JSON`]);
  }
  return JSON.stringify(['unavailable', `${whose} returned neither a Receipt with a reference nor null`]);
}

/** Runs `fn` in the async context of the caller waiting for `key`, when one is. */
type Runner = <R>(fn: () => R) => R;

/** The callers waiting right now, by operation key (the last one of a key wins). */
class Callers {
  #next = 0;
  readonly #byKey = new Map<string, { id: number; context: AsyncResource }>();

  enter(key: string): () => void {
    const id = (this.#next += 1);
    // The caller's async context, as `AsyncLocalStorage.snapshot()` keeps it, without the
    // function that one binds: on Node 20 binding wraps a deprecated getter around it, which
    // cost a replay answered from memory a quarter of its time.
    this.#byKey.set(key, { id, context: new AsyncResource('idemgate.invoke') });
    return () => {
      if (this.#byKey.get(key)?.id === id) this.#byKey.delete(key);
    };
  }

  runner(key: string): Runner | null {
    const context = this.#byKey.get(key)?.context;
    return context ? (fn) => context.runInAsyncScope(fn) : null;
  }
}

// ---------------------------------------------------------------------------------------------
// Options.

export interface LocalOptions {
  /** The tenant part of every operation key (default `default`). */
  tenant?: string;
  /** The environment part of every operation key (default `development`). */
  environment?: string;
  /** Recorded as the actor of the operator's actions taken through this Local (default `local`). */
  actor?: string;
  /** Start the background recoverer (default true). */
  recover?: boolean;
  /** Seconds between the recoverer's passes over expired leases (default 2). */
  recoveryInterval?: number;
  /** Seconds between its sweeps of records past their retention (default 300). */
  sweepInterval?: number;
  /** Encrypt stored arguments and results with the key in this environment variable. */
  encryptionKeyEnv?: string;
  /** Throw `in_flight`, `rejected` and `unknown` outcomes as errors, as the HTTP client's option. */
  throw?: boolean;
}

/** The retention of a tool's records (the contract's `retention` section). */
export interface Retention {
  recordTtl?: string;
  tombstoneTtl?: string;
  maxRetryWindow?: string;
  lateArrival?: 'reject' | 'replay';
}

/**
 * What a tool's `authorize` function decides on, before every effect and every replay (an
 * idempotency hit is no bypass). Never the arguments: their fingerprint only.
 */
export interface AuthRequest {
  tenant: string;
  actor: string;
  role: string;
  tool: string;
  operationKey: string | null;
  fingerprint: string;
  stage: 'before_effect' | 'before_replay';
}

/** A tool's contract, as options of `local.tool`. */
export interface ToolOptions {
  /** Default `key_based`: the function passes the operation key to its system of record. */
  effectClass?: EffectClass;
  /** The argument names that make a request the same request (default: all arguments). */
  fingerprint?: string[];
  version?: string;
  /** The receipt lookup by operation key: a `Receipt` when the effect exists, else null. */
  lookup?: (idempotencyKey: string) => Receipt | null | undefined | Promise<Receipt | null | undefined>;
  /**
   * The job poller, for a function that returns `new Job(jobId)`: a `Receipt` when the job is
   * done, null while it runs; it throws `Refused` when the job failed and `JobGone` when the
   * downstream no longer knows it. Anything else it throws says nothing: the job stays in flight.
   */
  poll?: (jobId: string, context: ToolContext) => Receipt | null | undefined | Promise<Receipt | null | undefined>;
  /**
   * The live authorization check: `true` allows, `false` denies, a string denies with that
   * reason; a throw (or the timeout) fails closed — nothing runs, the caller may ask again.
   */
  authorize?: (request: AuthRequest) => boolean | string | Promise<boolean | string>;
  /** `always`, `never`, or `{ argument: [values that need an operator's approval] }`. */
  approval?: 'always' | 'never' | Record<string, unknown[]>;
  retention?: Retention;
  /** How long the function may take, in ms, before its answer counts as lost (default 60 000; null: none). */
  timeoutMs?: number | null;
  /** A contract file instead of these options, read and linted as the gateway does. */
  contract?: string;
  /** The arguments' JSON Schema (default: an object; the fingerprint's fields as properties). */
  inputSchema?: Record<string, unknown>;
  /** The function's downstream deduplicates on the key it is given: an ambiguous call may be resent. */
  deduplicatesByKey?: boolean;
  leaseSeconds?: number;
  /** The model-facing description. */
  description?: string;
}

/** What a tool's function receives besides its arguments. */
export interface ToolContext {
  /** The operation key: pass it to the system of record as its idempotency key. */
  idempotencyKey: string;
}

export type ToolFunction<A> = (args: A, context: ToolContext) => unknown;

/** Options of one invocation. */
export interface LocalInvokeOptions {
  workflowId?: string;
  stepId?: string;
  /** Deliver again while the answer is `in_flight`, for up to this many seconds. */
  wait?: number;
  /** Overrides the Local's `throw` option for this call. */
  throw?: boolean;
}

/** A tool's function, guarded: calling it invokes the tool under the current identity. */
export interface GuardedTool<A extends Record<string, unknown>> {
  (args: A, options?: LocalInvokeOptions): Promise<Outcome>;
  readonly toolName: string;
  readonly local: Local;
}

const DEFAULT_RETENTION = { record_ttl: '7d', tombstone_ttl: '30d', max_retry_window: '1d', late_arrival: 'reject' };
const RETENTION_FIELDS: Record<string, string> = {
  recordTtl: 'record_ttl',
  tombstoneTtl: 'tombstone_ttl',
  maxRetryWindow: 'max_retry_window',
  lateArrival: 'late_arrival',
};
const EFFECT_CLASSES = ['key_based', 'irreversible', 'natural_idempotent', 'read'];
const DEFAULT_TIMEOUT_MS = 60_000;

function positiveSeconds(name: string, value: unknown): number {
  if (typeof value !== 'number' || !Number.isFinite(value) || value <= 0) {
    throw new IdemgateError(`${name} is a number of seconds above 0, not ${String(value)}`);
  }
  return value;
}

/** The contract `local.tool`'s options describe, shaped as a contract file. */
function specOf(name: string, options: ToolOptions): Record<string, unknown> {
  const where = `local.tool(${JSON.stringify(name)})`;
  const effectClass = options.effectClass ?? 'key_based';
  if (!EFFECT_CLASSES.includes(effectClass)) {
    throw new IdemgateError(`${where}: effectClass is one of ${EFFECT_CLASSES.join(', ')}`);
  }
  const version = options.version ?? '1';
  if (typeof version !== 'string' || version.trim() === '') throw new IdemgateError(`${where}: version is a non-empty string`);
  const fingerprint = options.fingerprint;
  if (fingerprint !== undefined && (!Array.isArray(fingerprint) || !fingerprint.every((f) => typeof f === 'string'))) {
    throw new IdemgateError(`${where}: fingerprint is a list of argument names`);
  }
  const schema = options.inputSchema ?? {
    type: 'object',
    ...(fingerprint ? { properties: Object.fromEntries(fingerprint.map((f) => [f, {}])) } : {}),
  };
  const security: Record<string, unknown> = { recheck_authorization: true };
  const approval = options.approval;
  if (approval === 'always' || approval === 'never') security.approval = approval;
  else if (approval !== undefined) {
    if (typeof approval !== 'object' || approval === null || Object.keys(approval).length === 0) {
      throw new IdemgateError(
        `${where}: approval is 'always', 'never', or an object from an argument to the values that need an operator's approval`,
      );
    }
    security.approval = 'when_matches';
    security.approval_when = Object.fromEntries(
      Object.entries(approval).map(([field, values]) => [field, Array.isArray(values) ? values : [values]]),
    );
  }
  const spec: Record<string, unknown> = {
    name,
    version,
    effect_class: effectClass,
    operation_key: {
      supplied_by: 'application',
      scope: ['tenant', 'environment', 'workflow_id', 'step_id'],
      reused_for_retry: true,
    },
    input_schema: schema,
    request_fingerprint: { fields: fingerprint ?? ['*'] },
    downstream: {
      deduplicates_by_key: options.deduplicatesByKey === true,
      receipt_lookup: options.lookup !== undefined,
      async_jobs: options.poll !== undefined,
    },
    security,
  };
  if (options.description) spec.purpose = options.description;
  if (effectClass !== 'read' || options.retention !== undefined) {
    const retention: Record<string, unknown> = { ...DEFAULT_RETENTION };
    for (const [field, value] of Object.entries(options.retention ?? {})) {
      const wire = RETENTION_FIELDS[field];
      if (!wire) throw new IdemgateError(`${where}: retention: unknown field ${JSON.stringify(field)}`);
      retention[wire] = value;
    }
    spec.retention = retention;
  }
  if (options.leaseSeconds !== undefined) {
    if (!Number.isInteger(options.leaseSeconds)) throw new IdemgateError(`${where}: leaseSeconds is a whole number of seconds`);
    spec.lease_seconds = options.leaseSeconds;
  }
  return spec;
}

// ---------------------------------------------------------------------------------------------
// Local.

/**
 * idemgate's engine in this process, over one store. Every call answers a promise at once, and
 * Node's event loop never waits: the store commits on its own thread and wakes the call when
 * its write is durable, and a tool's function is awaited like any promise.
 *
 * `new Local('sqlite://ops.sqlite', { tenant: 'acme', environment: 'production' })` — the
 * store is created (or migrated) on first use, in the gateway's schema, so `idemgate ops
 * --store` and the console of `idemgate serve` see the records.
 */
export class Local {
  readonly url: string;
  readonly #native: NativeLocal;
  readonly #throw: boolean;
  /** `tenant:environment:`, the start of every key of this Local. */
  readonly #keyPrefix: string;
  readonly #callers = new Callers();
  readonly #tools = new Map<string, GuardedTool<Record<string, unknown>>>();

  constructor(url: string, options: LocalOptions = {}) {
    if (typeof url !== 'string' || !/^(sqlite|postgres|postgresql):\/\//.test(url)) {
      throw new IdemgateError('new Local(url): url is sqlite://PATH or postgres://USER@HOST/DATABASE');
    }
    for (const name of ['tenant', 'environment', 'actor', 'encryptionKeyEnv'] as const) {
      const value = options[name];
      if (value !== undefined && (typeof value !== 'string' || value === '')) {
        throw new IdemgateError(`new Local: ${name} is a non-empty string`);
      }
    }
    const Native = loadNative().NativeLocal;
    try {
      this.#native = new Native(
        url,
        options.tenant ?? 'default',
        options.environment ?? 'development',
        options.actor ?? 'local',
        options.recover ?? true,
        positiveSeconds('recoveryInterval', options.recoveryInterval ?? 2),
        positiveSeconds('sweepInterval', options.sweepInterval ?? 300),
        options.encryptionKeyEnv ?? null,
      );
    } catch (e) {
      throw new IdemgateError(`new Local: ${(e as Error).message}`, { cause: e });
    }
    this.url = url;
    this.#throw = options.throw ?? false;
    this.#keyPrefix = `${this.#native.tenant}:${this.#native.environment}:`;
  }

  get tenant(): string {
    return this.#native.tenant;
  }

  get environment(): string {
    return this.#native.environment;
  }

  get closed(): boolean {
    return this.#native.closed;
  }

  /** The registered tools' names, sorted. */
  tools(): string[] {
    return this.#native.tools();
  }

  /**
   * Registers `fn` as the effect of the tool `name` and returns it guarded. `fn` receives the
   * arguments and `{ idempotencyKey }` (the operation key, to pass to the system of record); it
   * returns a `Receipt` (or a JSON value, kept as the result) or, with the `poll` option, a `Job`;
   * it throws `NotSent` when it provably sent nothing, `Refused` for a deterministic refusal.
   * Anything else it throws, and a timeout,
   * is ambiguous: the engine recovers by the lookup or answers `unknown`, and never calls it
   * again for the operation.
   */
  tool<A extends Record<string, unknown>>(name: string, options: ToolOptions, fn: ToolFunction<A>): GuardedTool<A> {
    if (typeof name !== 'string' || name === '') {
      throw new IdemgateError("local.tool: name is the tool's name, a non-empty string such as 'refunds.issue'");
    }
    const where = `local.tool(${JSON.stringify(name)})`;
    if (typeof options !== 'object' || options === null) throw new IdemgateError(`${where}: options is an object`);
    if (typeof fn !== 'function') throw new IdemgateError(`${where}: the tool's function is missing`);
    const { lookup, poll, authorize } = options;
    if (lookup !== undefined && typeof lookup !== 'function') throw new IdemgateError(`${where}: lookup is a function`);
    if (poll !== undefined && typeof poll !== 'function') throw new IdemgateError(`${where}: poll is a function`);
    if (authorize !== undefined && typeof authorize !== 'function') throw new IdemgateError(`${where}: authorize is a function`);
    const timeoutMs = options.timeoutMs === undefined ? DEFAULT_TIMEOUT_MS : options.timeoutMs;
    if (timeoutMs !== null && (typeof timeoutMs !== 'number' || !(timeoutMs > 0))) {
      throw new IdemgateError(`${where}: timeoutMs is a number of ms above 0, or null`);
    }
    let spec: string | null = null;
    if (options.contract !== undefined) {
      if (typeof options.contract !== 'string') throw new IdemgateError(`${where}: contract is the path of a contract file`);
      const given = (
        ['effectClass', 'fingerprint', 'version', 'approval', 'retention', 'inputSchema', 'deduplicatesByKey', 'leaseSeconds', 'description'] as const
      ).filter((k) => options[k] !== undefined);
      if (given.length > 0) {
        throw new IdemgateError(`${where}: ${given[0]} is the contract file's to say; give either contract or the contract's fields`);
      }
    } else {
      spec = JSON.stringify(specOf(name, options));
    }
    const callers = this.#callers;
    const perform = async (argumentsJson: string, key: string): Promise<string> => {
      let args: A;
      try {
        args = JSON.parse(argumentsJson) as A;
      } catch (e) {
        return JSON.stringify(['not_sent', `the arguments could not be read: ${evidence(e)}`, null]);
      }
      const call = (): unknown => fn(args, { idempotencyKey: key });
      let value: unknown;
      try {
        const run = callers.runner(key);
        value = await (run ? run(call) : call());
      } catch (e) {
        return JSON.stringify(raised(name, e));
      }
      return answerOf(name, value);
    };
    const find =
      lookup === undefined
        ? null
        : async (key: string): Promise<string> => {
            try {
              const found = await lookup(key);
              if (found === null || found === undefined) return JSON.stringify(['not_found']);
              return receiptAnswer('found', found, 'the lookup');
            } catch (e) {
              return JSON.stringify(['unavailable', evidence(e)]);
            }
          };
    const follow =
      poll === undefined
        ? null
        : async (jobId: string, key: string): Promise<string> => {
            let polled: unknown;
            try {
              polled = await poll(jobId, { idempotencyKey: key });
            } catch (e) {
              if (e instanceof Refused) return JSON.stringify(['failed', refusal(e)]);
              if (e instanceof JobGone) return JSON.stringify(['gone', e.reason]);
              return JSON.stringify(['unavailable', evidence(e)]);
            }
            if (polled === null || polled === undefined) return JSON.stringify(['running']);
            return receiptAnswer('done', polled, 'the job poller');
          };
    const check =
      authorize === undefined
        ? null
        : async (requestJson: string): Promise<string> => {
            try {
              const raw = JSON.parse(requestJson) as Record<string, string | null>;
              const request: AuthRequest = {
                tenant: String(raw.tenant),
                actor: String(raw.actor),
                role: String(raw.role),
                tool: String(raw.tool),
                operationKey: raw.operation_key ?? null,
                fingerprint: String(raw.fingerprint),
                stage: raw.stage === 'before_replay' ? 'before_replay' : 'before_effect',
              };
              const decide = (): unknown => authorize(request);
              const run = request.operationKey === null ? null : callers.runner(request.operationKey);
              const decided = await (run ? run(decide) : decide());
              if (decided === true) return JSON.stringify(['allowed']);
              if (decided === false) return JSON.stringify(['denied', `denied by the authorize function of ${name}`]);
              if (typeof decided === 'string' && decided !== '') return JSON.stringify(['denied', decided]);
              return JSON.stringify(['unavailable', `the authorize function of ${name} answered neither a boolean nor a reason`]);
            } catch (e) {
              return JSON.stringify(['unavailable', evidence(e)]);
            }
          };
    let findings: string[][];
    try {
      findings = this.#native.register(
        name,
        spec,
        options.contract ?? null,
        timeoutMs === null ? null : timeoutMs / 1000,
        perform,
        find,
        follow,
        check,
      );
    } catch (e) {
      throw new IdemgateError(`${where}: ${(e as Error).message}`, { cause: e });
    }
    for (const [level, rule, field, reason] of findings) {
      process.emitWarning(`${options.contract}: ${level} ${rule} (${field}): ${reason}`, { code: 'IDEMGATE_CONTRACT' });
    }
    const guarded = ((args: A, invokeOptions: LocalInvokeOptions = {}) =>
      this.invoke(name, args, invokeOptions)) as GuardedTool<A>;
    Object.defineProperty(guarded, 'toolName', { value: name });
    Object.defineProperty(guarded, 'local', { value: this });
    Object.defineProperty(guarded, 'name', { value: name });
    this.#tools.set(name, guarded as unknown as GuardedTool<Record<string, unknown>>);
    return guarded;
  }

  /** Runs `fn` as part of the workflow run `workflowId`: the same as `workflow(id, fn)`. */
  workflow<T>(workflowId: string, fn: () => T): T {
    return workflow(workflowId, fn);
  }

  /** Runs `fn` as the step `stepId` of the current workflow: the same as `step(name, fn)`. */
  step<T>(stepId: string, fn: () => T): T {
    return step(stepId, fn);
  }

  /**
   * Invokes `tool` with `args`: the identity is `workflowId` and `stepId` when given (both or
   * neither), else the current `workflow` / `step`. A key-based or irreversible tool without one
   * throws `MissingIdentityError`; an unregistered tool `UnknownToolError`.
   */
  async invoke(tool: string, args: Record<string, unknown> = {}, options: LocalInvokeOptions = {}): Promise<Outcome> {
    if (typeof tool !== 'string' || tool === '') throw new IdemgateError('invoke: the tool name is required');
    if (typeof args !== 'object' || args === null || Array.isArray(args)) {
      throw new IdemgateError(`invoke ${tool}: the arguments are an object of named arguments`);
    }
    const hasWorkflow = options.workflowId !== undefined;
    const hasStep = options.stepId !== undefined;
    if (hasWorkflow !== hasStep) {
      throw new InvalidIdentityError(
        `${tool}: name both workflowId and stepId, or neither (got only ${hasWorkflow ? 'workflowId' : 'stepId'})`,
      );
    }
    let workflowId: string | null = null;
    let stepId: string | null = null;
    if (hasWorkflow) {
      workflowId = checkPart('workflowId', options.workflowId);
      stepId = checkPart('stepId', options.stepId);
    } else {
      const current = currentIdentity();
      if (current.workflowId !== null && current.stepId === null) {
        throw new MissingIdentityError(tool, rejection('missing_operation_key', `workflow ${JSON.stringify(current.workflowId)} names no step for this call: wrap it in step(name, fn)`));
      }
      if (current.workflowId === null && current.stepId !== null) {
        throw new MissingIdentityError(tool, rejection('missing_operation_key', `step ${JSON.stringify(current.stepId)} has no workflow: wrap it in workflow(runId, fn)`));
      }
      workflowId = current.workflowId;
      stepId = current.stepId;
    }
    let wait: number | null = null;
    if (options.wait !== undefined) {
      if (typeof options.wait !== 'number' || !(options.wait >= 0)) {
        throw new IdemgateError(`invoke ${tool}: wait is a number of seconds >= 0, not ${String(options.wait)}`);
      }
      wait = options.wait || null;
    }
    const text = json(args);
    if (text === null) throw new IdemgateError(`invoke ${tool}: the arguments are not JSON (a BigInt, a cycle?); nothing was recorded`);
    const leave =
      workflowId !== null && stepId !== null
        ? this.#callers.enter(`${this.#keyPrefix}${workflowId}:${stepId}`)
        : null;
    let answer: string;
    try {
      answer = await this.#native.invoke(tool, text, workflowId, stepId, wait);
    } catch (e) {
      throw new IdemgateError(`invoke ${tool}: ${(e as Error).message}`, { cause: e });
    } finally {
      leave?.();
    }
    const outcome = this.#outcome(answer);
    if (outcome.outcome === 'rejected') {
      if (outcome.code === 'unknown_tool') throw new UnknownToolError(tool, outcome);
      if (outcome.code === 'missing_operation_key') throw new MissingIdentityError(tool, outcome);
    }
    return this.#settle(outcome, options.throw, tool);
  }

  /** The operation under `operationKey`, or null when this Local's tenant has none under it. */
  async operation(operationKey: string): Promise<Operation | null> {
    if (typeof operationKey !== 'string' || operationKey === '') throw new IdemgateError('operation: the operation key is required');
    const read = JSON.parse(await this.#call('operation', () => this.#native.operation(operationKey))) as
      | null
      | { found?: Record<string, unknown>; denied?: unknown; error?: unknown };
    if (read === null) return null;
    if (read.found) {
      const body = read.found;
      const receipt = body.receipt as { reference?: unknown; result?: unknown } | null;
      return {
        ...summaryOf(body),
        receipt: receipt ? { reference: String(receipt.reference ?? ''), result: receipt.result ?? null } : null,
        outcome: readOutcome(body.outcome as Record<string, unknown>, 0),
        events: (Array.isArray(body.events) ? body.events : []).map(eventOf),
      };
    }
    const outcome = this.#outcome(JSON.stringify(read.denied ?? read.error));
    throw new RejectedError(outcome as Rejected);
  }

  /** A page of this Local's operations; `status: 'unknown'` is the reconciliation queue. */
  async operations(filter: OperationFilter = {}): Promise<OperationPage> {
    const page = JSON.parse(
      await this.#call('operations', () =>
        this.#native.operations(filter.status ?? null, filter.tool ?? null, filter.after ?? null, filter.limit ?? null),
      ),
    ) as { operations: Record<string, unknown>[]; next_after: string | null };
    return { operations: page.operations.map(summaryOf), nextAfter: page.next_after ?? null };
  }

  /** Operator: look the operation's receipt up now (the tool's lookup). */
  async reconcile(operationKey: string, options: ActionOptions = {}): Promise<Outcome> {
    return this.#action('reconcile', operationKey, options, () =>
      this.#native.reconcile(operationKey, null, null, null, this.#reason(options)),
    );
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
    const result = resolution.result === undefined ? null : json(resolution.result);
    if (resolution.result !== undefined && result === null) throw new IdemgateError(`resolveApplied ${operationKey}: result is not JSON`);
    return this.#action('resolveApplied', operationKey, options, () =>
      this.#native.reconcile(operationKey, 'applied', resolution.effectReference, result, this.#reason(options)),
    );
  }

  /** Operator: the effect did not happen; the key may run again. */
  async resolveNotApplied(operationKey: string, options: ActionOptions = {}): Promise<Outcome> {
    return this.#action('resolveNotApplied', operationKey, options, () =>
      this.#native.reconcile(operationKey, 'not_applied', null, null, this.#reason(options)),
    );
  }

  /** Operator: approve an operation awaiting approval, bound to `fingerprint` when given. */
  async approve(operationKey: string, approval: { fingerprint?: string } = {}, options: ActionOptions = {}): Promise<Outcome> {
    return this.#action('approve', operationKey, options, () =>
      this.#native.approve(operationKey, approval.fingerprint ?? null, this.#reason(options)),
    );
  }

  /** Operator: deny an operation awaiting approval; every later delivery replays the refusal. */
  async deny(operationKey: string, denial: { reason?: string } = {}, options: ActionOptions = {}): Promise<Outcome> {
    const reason = denial.reason ?? options.reason;
    return this.#action('deny', operationKey, options, () => this.#native.deny(operationKey, this.#reason({ reason })));
  }

  /** Stops the recoverer; every later call is refused. Closing twice does nothing. */
  async close(): Promise<void> {
    await this.#native.close();
  }

  #reason(options: ActionOptions): string | null {
    if (options.reason === undefined) return null;
    if (typeof options.reason !== 'string' || options.reason.trim() === '') {
      throw new IdemgateError('reason must be a non-empty text, or left out');
    }
    return options.reason;
  }

  async #action(name: string, operationKey: string, options: ActionOptions, call: () => Promise<string>): Promise<Outcome> {
    if (typeof operationKey !== 'string' || operationKey === '') throw new IdemgateError(`${name}: the operation key is required`);
    return this.#settle(this.#outcome(await this.#call(name, call)), options.throw);
  }

  async #call(name: string, call: () => Promise<string>): Promise<string> {
    try {
      return await call();
    } catch (e) {
      throw new IdemgateError(`${name}: ${(e as Error).message}`, { cause: e });
    }
  }

  #outcome(text: string): Outcome {
    const body = JSON.parse(text) as unknown;
    const problem = outcomeProblem(body);
    if (problem) throw new IdemgateError(`idemgate's engine answered something that is not an outcome: ${problem}`);
    return readOutcome(body as Record<string, unknown>, 0);
  }

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
}

export {
  IdemgateError,
  InFlightError,
  InvalidIdentityError,
  MissingIdentityError,
  RejectedError,
  UnknownOutcomeError,
  UnknownToolError,
} from './errors.js';
export type { Applied, InFlight, Outcome, Rejected, Replayed, Unknown } from './outcome.js';
export type { Operation, OperationFilter, OperationPage, OperationSummary, ActionOptions } from './client.js';
