"""A typed client for the idemgate gateway (HTTP API v1).

Reading order:

- `Client` / `AsyncClient` — `invoke(tool, arguments, workflow_id=, step_id=, wait=)` returns
  an `Outcome`; `tools()`, `operation(key)`, and the operator's `operations`, `reconcile`,
  `resolve_applied`, `resolve_not_applied`, `approve`, `deny`.
- `Outcome` — one of `Applied`, `Replayed`, `InFlight`, `Rejected`, `Unknown`, chosen by the
  answer's `outcome` member, never by its HTTP status. `raise_for_outcome()` (or the client's
  `raise_on=`) turns the last three into `InFlightError`, `RejectedError`,
  `UnknownOutcomeError`, all `IdemgateError`s.
- `workflow(run_id)` / `client.step(name)` — the operation identity from the workflow's own
  state, in a context variable that follows threads and asyncio tasks.
- `invoke_resending` — the one resend there is: the same identity again after a transport
  error, which the gateway answers from the same operation's record.
- Adapters: `idemgate.langchain.as_langchain_tool` (extra `langgraph`) and
  `idemgate.openai_agents.function_tool` (extra `openai-agents`).

In process, without a gateway (the engine itself, compiled into `idemgate._native`):

- `Local(url, tenant=, environment=)` / `AsyncLocal` — the engine over a `sqlite://PATH` or
  `postgres://…` store, with the same `invoke`, `step`, `operation` and operator methods as
  `Client`; `@local.tool(name, ...)` makes a function the guarded effect of a tool.
- What a tool's function tells the engine: it returns a `Receipt(reference, result)` (or a
  JSON value), or raises `NotSent(reason)` or `Refused(code, message)`; any other exception
  is ambiguous. `Job`, `JobGone` and `AuthRequest` serve the `poll=` and `authorize=` hooks.
"""

from ._client import NOT_DONE, AsyncClient, AsyncStep, Client, RaiseOn, Step
from ._identity import (
    Identity,
    StepScope,
    WorkflowScope,
    current_step_id,
    current_workflow_id,
    step,
    workflow,
)
from ._effects import AuthRequest, Job, JobGone, NotSent, Refused
from ._local import (
    AsyncLocal,
    AsyncLocalStep,
    AsyncLocalTool,
    ContractWarning,
    Local,
    LocalStep,
    LocalTool,
)
from ._model_text import meaning, outcome_text, transport_text
from ._models import Event, Operation, OperationPage, OperationRecord, Receipt, ToolInfo
from ._outcomes import (
    AnswerLost,
    Applied,
    AuthenticationError,
    GatewayUnavailable,
    IdemgateError,
    InFlight,
    InFlightError,
    InvalidIdentityError,
    Label,
    MissingIdentityError,
    NextAction,
    NotFoundError,
    Outcome,
    OutcomeError,
    ProtocolError,
    Rejected,
    RejectedError,
    Replayed,
    TransportError,
    Unknown,
    UnknownOutcomeError,
    UnknownToolError,
    parse_outcome,
)

__version__ = "0.1.0"

__all__ = [
    "NOT_DONE",
    "AnswerLost",
    "Applied",
    "AsyncClient",
    "AsyncLocal",
    "AsyncLocalStep",
    "AsyncLocalTool",
    "AsyncStep",
    "AuthRequest",
    "AuthenticationError",
    "Client",
    "ContractWarning",
    "Event",
    "GatewayUnavailable",
    "Identity",
    "IdemgateError",
    "InFlight",
    "InFlightError",
    "InvalidIdentityError",
    "Job",
    "JobGone",
    "Label",
    "Local",
    "LocalStep",
    "LocalTool",
    "MissingIdentityError",
    "NextAction",
    "NotSent",
    "NotFoundError",
    "Operation",
    "OperationPage",
    "OperationRecord",
    "Outcome",
    "OutcomeError",
    "ProtocolError",
    "RaiseOn",
    "Receipt",
    "Refused",
    "Rejected",
    "RejectedError",
    "Replayed",
    "Step",
    "StepScope",
    "ToolInfo",
    "TransportError",
    "Unknown",
    "UnknownOutcomeError",
    "UnknownToolError",
    "WorkflowScope",
    "current_step_id",
    "current_workflow_id",
    "meaning",
    "outcome_text",
    "parse_outcome",
    "step",
    "transport_text",
    "workflow",
]
