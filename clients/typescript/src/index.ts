// idemgate: the client of an idemgate gateway's HTTP API v1.
//
// Reading order: `Client` (invoke, tools, operations, the operator's actions) and its
// `Workflow` / `Step` identity helpers; `Outcome`, the discriminated union on `outcome` that
// every call answers; the errors, all `IdemgateError`s. The Vercel AI SDK adapter is its own
// entry point, `idemgate/ai`.

// client.ts and errors.ts export only the public API; outcome.ts also holds the readers the
// client uses (`readOutcome`, `outcomeProblem`), which stay internal.
export * from './client.js';
export * from './errors.js';
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
