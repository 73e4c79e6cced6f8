// The Vercel AI SDK adapter: a gateway tool as an AI SDK `tool()`.
//
// Identity. The operation is named by the workflow and the step the application gives, never by
// what the AI SDK hands `execute(input, { toolCallId, messages, abortSignal })`: `toolCallId` is
// minted by the model provider for each proposal, so the same call proposed twice would be two
// operations, and `messages` grows between steps, so nothing derived from it stays the same.
// With a fixed `stepId`, every call of the tool in that workflow step is one operation: the
// model proposing the same call again gets `replayed`, and a different request under the same
// step is refused (nothing happens). Where one step legitimately performs several operations,
// `stepId` may be a function of the input's business identity (say, the customer to notify).

import { jsonSchema, tool, type JSONSchema7, type Tool, type ToolCallOptions } from 'ai';

import type { Client, ToolInfo } from './client.js';
import { IdemgateError, InvalidIdentityError } from './errors.js';
import { describeOutcome, type Outcome } from './outcome.js';

/** What the model receives: the outcome's members and a sentence of what it means. */
export interface ModelResult {
  outcome: Outcome['outcome'];
  /** The label again, as the gateway's tool descriptions call it. */
  status: Outcome['outcome'];
  meaning: string;
  operation_key: string | null;
  effect_reference: string | null;
  safe_to_repeat: boolean;
  next_action: Outcome['nextAction'];
  retry_after_seconds: number | null;
  result: unknown;
  error: { code: string; message: string } | null;
}

export interface IdemgateToolOptions<INPUT = Record<string, unknown>> {
  /** The workflow run, from the application's own state. */
  workflowId: string;
  /**
   * The workflow step this tool performs. A string: one operation per step, so the same call
   * proposed twice replays. A function of the validated input: one operation per value it
   * returns (derive it from the input's business identity, never from a time, a random value or
   * the tool call id). Omit only for tools whose `operationIdentity` is not `required`.
   */
  stepId?: string | ((input: INPUT) => string);
  /** The model-facing description; default the gateway's (when a `ToolInfo` is given). */
  description?: string;
  /** The input's JSON Schema; default the gateway's (when a `ToolInfo` is given). */
  inputSchema?: JSONSchema7 | Record<string, unknown>;
  /**
   * Seconds to wait for an in-flight operation to settle before answering the model
   * (`Prefer: wait=N`); default 10, 0 not to wait.
   */
  wait?: number;
}

/** The outcome as the model sees it. */
export function modelResult(o: Outcome): ModelResult {
  return {
    outcome: o.outcome,
    status: o.outcome,
    meaning: describeOutcome(o),
    operation_key: o.operationKey,
    effect_reference: o.effectReference,
    safe_to_repeat: o.safeToRepeat,
    next_action: o.nextAction,
    retry_after_seconds: o.retryAfter,
    result: o.result,
    error: o.error,
  };
}

/**
 * A gateway tool as an AI SDK tool. `target` is a tool name (then give `inputSchema`) or a
 * `ToolInfo` from `client.tools()` / `client.tool(name)` (its description and schema are used).
 * Every outcome goes back to the model with its meaning; bad input (unknown tool, missing
 * identity) and an unreachable gateway are thrown, which the AI SDK reports as a tool error.
 */
export function idemgateTool<INPUT extends Record<string, unknown> = Record<string, unknown>>(
  client: Client,
  target: string | ToolInfo,
  options: IdemgateToolOptions<INPUT>,
): Tool<INPUT, ModelResult> {
  const info = typeof target === 'string' ? null : target;
  const name = typeof target === 'string' ? target : target.name;
  if (typeof name !== 'string' || name === '') throw new IdemgateError('idemgateTool: the tool name is required');
  if (!options || typeof options.workflowId !== 'string' || options.workflowId === '') {
    throw new InvalidIdentityError(`idemgateTool ${name}: workflowId is required (the workflow run, from its own state)`);
  }
  const workflow = client.workflow(options.workflowId);
  if (options.stepId === undefined && info?.operationIdentity === 'required') {
    throw new InvalidIdentityError(
      `idemgateTool ${name}: the tool is ${info.effectClass} and needs a stepId naming the workflow step it performs`,
    );
  }
  // A fixed step is checked now, so a bad one fails before the model runs.
  const fixedStep = typeof options.stepId === 'string' ? workflow.step(options.stepId) : null;
  const schema = options.inputSchema ?? info?.inputSchema;
  if (schema === undefined) {
    throw new IdemgateError(
      `idemgateTool ${name}: inputSchema is required when the tool is given by name; or pass the ToolInfo from client.tool(${JSON.stringify(name)})`,
    );
  }
  const description = options.description ?? info?.description;
  const wait = options.wait ?? 10;
  const stepOf = options.stepId;

  return tool<INPUT, ModelResult>({
    ...(description !== undefined ? { description } : {}),
    inputSchema: jsonSchema<INPUT>(schema as JSONSchema7),
    async execute(input: INPUT, { abortSignal }: ToolCallOptions): Promise<ModelResult> {
      const step = fixedStep ?? (typeof stepOf === 'function' ? workflow.step(stepOf(input)) : null);
      const outcome = step
        ? await step.invoke(name, input, { wait, throw: false, ...(abortSignal ? { signal: abortSignal } : {}) })
        : await client.invoke(name, input, { wait, throw: false, ...(abortSignal ? { signal: abortSignal } : {}) });
      return modelResult(outcome);
    },
  });
}

/** A guarded function of `idemgate/local` (`local.tool(...)`), as `guardedTool` takes it. */
export type GuardedFunction<INPUT> = (
  args: INPUT,
  options: { workflowId?: string; stepId?: string; wait?: number; throw?: boolean },
) => Promise<Outcome>;

/**
 * A guarded function of `idemgate/local` as an AI SDK tool: the engine in this process instead of
 * a gateway, the same identity rule and the same answers to the model as `idemgateTool`. The
 * operation is `workflowId` plus `stepId` (a string, or a function of the validated input), never
 * the tool call id, so a call the model proposes twice is one effect. `inputSchema` is required.
 */
export function guardedTool<INPUT extends Record<string, unknown> = Record<string, unknown>>(
  guarded: GuardedFunction<INPUT>,
  options: IdemgateToolOptions<INPUT> & { inputSchema: JSONSchema7 | Record<string, unknown> },
): Tool<INPUT, ModelResult> {
  const name = (guarded as { toolName?: unknown }).toolName ?? 'the guarded function';
  if (typeof guarded !== 'function') throw new IdemgateError('guardedTool: give the function local.tool(...) returned');
  if (!options || typeof options.workflowId !== 'string' || options.workflowId === '') {
    throw new InvalidIdentityError(`guardedTool ${String(name)}: workflowId is required (the workflow run, from its own state)`);
  }
  if (options.stepId === undefined) {
    throw new InvalidIdentityError(`guardedTool ${String(name)}: stepId is required (the workflow step the tool performs)`);
  }
  if (options.inputSchema === undefined) throw new IdemgateError(`guardedTool ${String(name)}: inputSchema is required`);
  const { workflowId, stepId, description } = options;
  const wait = options.wait ?? 10;
  return tool<INPUT, ModelResult>({
    ...(description !== undefined ? { description } : {}),
    inputSchema: jsonSchema<INPUT>(options.inputSchema as JSONSchema7),
    async execute(input: INPUT): Promise<ModelResult> {
      const step = typeof stepId === 'function' ? stepId(input) : stepId;
      return modelResult(await guarded(input, { workflowId, stepId: step, wait, throw: false }));
    },
  });
}

/** A model-safe tool name: providers accept `[A-Za-z0-9_-]`, so `tickets.create` becomes `tickets_create`. */
export function modelToolName(name: string): string {
  return name.replace(/[^A-Za-z0-9_-]/g, '_');
}

/** The name the gateway's tool descriptions give the status tool. */
export const STATUS_TOOL = 'idemgate_operation_status';

/**
 * A read-only tool that reads where an operation stands by the `operation_key` of an earlier
 * answer: what the gateway's tool descriptions tell the model to use instead of calling a tool
 * again. Reading never performs an effect; an operation this token cannot see answers
 * `rejected` with `not_found`.
 */
export function idemgateStatusTool(client: Client): Tool<{ operation_key: string }, ModelResult> {
  return tool<{ operation_key: string }, ModelResult>({
    description:
      'Reads where an earlier operation stands, by the operation_key its answer gave. Use it for an operation that ' +
      'answered in_flight instead of calling its tool again: it answers replayed with the stored result once done, ' +
      'in_flight while it runs or awaits approval, unknown while an operator must reconcile it. Never performs an effect.',
    inputSchema: jsonSchema<{ operation_key: string }>({
      type: 'object',
      properties: { operation_key: { type: 'string', minLength: 1, maxLength: 600 } },
      required: ['operation_key'],
      additionalProperties: false,
    }),
    async execute({ operation_key }, { abortSignal }: ToolCallOptions): Promise<ModelResult> {
      const op = await client.operation(operation_key, abortSignal ? { signal: abortSignal } : {});
      if (op) return modelResult(op.outcome);
      return {
        outcome: 'rejected',
        status: 'rejected',
        meaning: 'There is no operation under this key for this application; nothing was read or done.',
        operation_key,
        effect_reference: null,
        safe_to_repeat: false,
        next_action: 'none',
        retry_after_seconds: null,
        result: null,
        error: { code: 'not_found', message: 'no such operation' },
      };
    },
  });
}

/**
 * The gateway's tools named in `steps`, as an AI SDK tool set keyed by model-safe names, plus
 * the status tool (`idemgate_operation_status`) unless `statusTool: false`. Each entry maps a
 * gateway tool to the workflow step it performs (`null` for a read, which needs none). A name
 * the gateway does not have is an `UnknownToolError`.
 */
export async function idemgateTools(
  client: Client,
  options: { workflowId: string; steps: Record<string, string | null>; wait?: number; statusTool?: boolean },
): Promise<Record<string, Tool<any, ModelResult>>> {
  const set: Record<string, Tool<any, ModelResult>> = {};
  for (const [name, stepId] of Object.entries(options.steps)) {
    const info = await client.tool(name);
    set[modelToolName(name)] = idemgateTool(client, info, {
      workflowId: options.workflowId,
      ...(stepId !== null ? { stepId } : {}),
      ...(options.wait !== undefined ? { wait: options.wait } : {}),
    });
  }
  if (options.statusTool !== false) set[STATUS_TOOL] = idemgateStatusTool(client);
  return set;
}
