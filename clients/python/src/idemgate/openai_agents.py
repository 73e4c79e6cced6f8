"""A gateway tool, or a function guarded in process, as an OpenAI Agents SDK `FunctionTool`,
whose operation identity comes from the run, never from the model.

    tool = function_tool(client, "tickets.create")     # through the gateway
    tool = function_tool(issue_refund)                  # a @local.tool function, in process
    agent = Agent(name="support", tools=[tool], ...)
    await Runner.run(agent, text, context=RunIdentity("run_827"))

What is stable across a re-proposed call, read from the SDK: the model's `call_id` is not —
a model that proposes the same action again (after an error, a lost answer, or by repeating
itself) sends a new call id, and the SDK only keeps a call id across a paused and resumed
`RunState`. The run context (`Runner.run(..., context=...)`) is the application's and is the
same object for the whole run. So the identity is:

- workflow_id: the explicit scope (`with idemgate.workflow(run_id):`), which wins; else the run
  context's `idemgate_workflow_id` or `workflow_id` attribute (or mapping key) —
  `RunIdentity(workflow_id)` is the smallest such context;
- step_id: the explicit `idemgate.step(...)` scope; else `step=` given here (a string, or a
  function of the arguments); else the gateway tool's name. So within one run, the same tool
  is one operation: a second proposal with the same arguments is `replayed`, with other
  arguments `rejected` (a mismatch), never a second effect. A tool that a run may legitimately
  use several times takes `step=lambda args: ...` naming what distinguishes the uses (an order
  id), never a counter.

The tool returns the outcome to the model as JSON text with a `meaning` sentence (applied or
replayed: done, do not repeat; unknown: do not retry, an operator reconciles). A lost answer or
an unreachable gateway is returned as text too, saying that calling again with the same
arguments is the same operation. Misconfiguration (unknown tool, refused token, no identity)
raises, failing the run with the error.

Install with the `openai-agents` extra: `pip install 'idemgate[openai-agents]'`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping, Optional

try:
    from agents import FunctionTool, RunContextWrapper
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "idemgate.openai_agents needs the OpenAI Agents SDK: pip install 'idemgate[openai-agents]'"
    ) from e

from . import _identity
from ._adapters import StepOf, ToolSource, invoke_from_async, invoke_options, model_name, source
from ._client import AsyncClient
from ._model_text import outcome_text, transport_text
from ._models import ToolInfo
from ._outcomes import MissingIdentityError, Outcome, TransportError

StepName = StepOf


@dataclass(frozen=True)
class RunIdentity:
    """A run context naming the workflow run: `Runner.run(agent, text, context=RunIdentity(id))`.
    Any context with a `workflow_id` (or `idemgate_workflow_id`) attribute does the same."""

    workflow_id: str


def workflow_of(context: Any) -> Optional[str]:
    """The workflow id a run context carries, if any."""
    for name in ("idemgate_workflow_id", "workflow_id"):
        value = (
            context.get(name) if isinstance(context, Mapping) else getattr(context, name, None)
        )
        if value is not None:
            return str(value)
    return None


def identity_for(
    tool: str,
    context: RunContextWrapper[Any],
    arguments: Mapping[str, Any],
    step: Optional[StepName] = None,
) -> _identity.Identity:
    """The identity of one call (see the module's doc); raises when the run names none."""
    workflow_id = _identity.current_workflow_id() or workflow_of(context.context)
    if workflow_id is None:
        raise MissingIdentityError(
            tool,
            "the agent run names no workflow: pass `context=RunIdentity(run_id)` (or a context "
            "with a `workflow_id`) to Runner.run",
        )
    step_id = _identity.current_step_id()
    if step_id is None:
        step_id = step(arguments) if callable(step) else (step or tool)
    return _identity.Identity(
        _identity.check_part("workflow_id", workflow_id), _identity.check_part("step_id", step_id)
    )


def function_tool(
    client: ToolSource,
    tool_name: Optional[str] = None,
    *,
    info: Optional[ToolInfo] = None,
    name: Optional[str] = None,
    description: Optional[str] = None,
    step: Optional[StepName] = None,
    wait: Optional[float] = None,
    resend_attempts: int = 1,
) -> FunctionTool:
    """An `agents.FunctionTool` for the gateway tool `tool_name`, or for a function guarded in
    process (`function_tool(local_tool)`, with no `tool_name`: the function runs under its
    `Local`'s engine, and an ambiguous failure is settled by its lookup or answered `unknown`).

    `info` is the tool's description (`client.tool(tool_name)`), fetched here when not given
    (with an `AsyncClient`, pass it or use `function_tool_async`). `wait` is sent as
    `Prefer: wait=N`, so a duplicate proposal running alongside the first waits for it instead
    of answering in_flight. `resend_attempts` > 1 resends under the same identity when the
    gateway's answer is lost (`invoke_resending`); by default the model is told and may call
    again, which is the same operation.
    """
    invoker, info = source(client, tool_name, info, "function_tool_async")
    gateway_name = info.name

    async def invoke(ctx: RunContextWrapper[Any], raw: str) -> str:
        try:
            arguments = json.loads(raw) if raw else {}
        except ValueError:
            return json.dumps(
                {"outcome": "rejected", "meaning": "The arguments were not JSON; nothing happened."}
            )
        if not isinstance(arguments, dict):
            return json.dumps(
                {"outcome": "rejected", "meaning": "The arguments must be an object; nothing happened."}
            )
        identity = identity_for(gateway_name, ctx, arguments, step)
        try:
            outcome = await invoke_from_async(
                invoker, gateway_name, arguments, invoke_options(identity, wait, ()), resend_attempts
            )
        except TransportError as e:
            return transport_text(e)
        return outcome_text(outcome)

    return FunctionTool(
        name=name or model_name(gateway_name),
        description=description or info.description,
        params_json_schema=dict(info.input_schema),
        on_invoke_tool=invoke,
        # The gateway's schemas have optional members, which strict mode cannot express; the
        # gateway checks every call against the contract's schema itself.
        strict_json_schema=False,
    )


async def function_tool_async(client: AsyncClient, tool_name: str, **options: Any) -> FunctionTool:
    """`function_tool` for an `AsyncClient`: fetches the tool's description first."""
    info = await client.tool(tool_name)
    return function_tool(client, tool_name, info=info, **options)


__all__ = [
    "RunIdentity",
    "function_tool",
    "function_tool_async",
    "identity_for",
    "model_name",
    "workflow_of",
]
