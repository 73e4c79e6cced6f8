// idemgate: the client of an idemgate gateway's HTTP API v1.
//
// Reading order: `Client` (invoke, tools, operations, the operator's actions) and its
// `Workflow` / `Step` identity helpers; `Outcome`, the discriminated union on `outcome` that
// every call answers; the errors, all `IdemgateError`s. The Vercel AI SDK adapter is its own
// entry point, `idemgate/ai`.

export {
  Client,
  Step,
  Workflow,
  type ActionOptions,
  type ClientOptions,
  type EffectClass,
  type InvokeOptions,
  type Operation,
  type OperationEvent,
  type OperationFilter,
  type OperationPage,
  type OperationSummary,
  type RecordStatus,
  type ToolInfo,
} from './client.js';
export {
  describeOutcome,
  isDone,
  type Applied,
  type ErrorCode,
  type InFlight,
  type Label,
  type NextAction,
  type Outcome,
  type Rejected,
  type Replayed,
  type Unknown,
} from './outcome.js';
export {
  GatewayTimeoutError,
  GatewayUnavailableError,
  IdemgateError,
  InFlightError,
  InvalidIdentityError,
  MissingIdentityError,
  OutcomeError,
  ProtocolError,
  RejectedError,
  UnauthorizedError,
  UnknownOutcomeError,
  UnknownToolError,
} from './errors.js';
