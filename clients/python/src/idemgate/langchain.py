"""A gateway tool, or a function guarded in process, as a LangChain tool, whose operation
identity inside LangGraph comes from the graph's own run state.

    tool = as_langchain_tool(client, "tickets.create")     # through the gateway
    tool = as_langchain_tool(issue_refund)                  # a @local.tool function, in process

The tool's name, description and argument schema come from `GET /v1/tools/{tool}`, or for a
guarded function from its decorator (`input_schema=`, `description=`) or its type hints and
docstring; in process the call runs the engine of the function's `Local` (an `AsyncLocal`'s
tool is called with `ainvoke`). When it runs, its identity is, in order:

1. the explicit scope, which wins: `with idemgate.workflow(run_id):` (and `idemgate.step(...)`
   when given; without one, the step below is used);
2. inside LangGraph: the thread id (`config["configurable"]["thread_id"]`) as workflow_id, and
   the node's name (`config["metadata"]["langgraph_node"]`) as step_id, followed by
   `.<suffix>` — the `step=` given here (a string, or a function of the arguments), else the
   tool call's id when the tool was called with a model's `ToolCall` (LangGraph keeps it in the
   checkpointed message, so a resumed run calls it with the same id).

A node that runs once per thread and calls the tool once needs nothing more. A node that calls
several gateway tools, or the same one several times, gives each call its own `step=`; a node
that runs several times in one thread (a loop) must put what distinguishes the runs into the
suffix (`step=lambda args: args["order_id"]`). Nothing is ever made up from time or randomness:
with no identity, a tool that needs one raises `MissingIdentityError`.

The tool returns the outcome as JSON text with a `meaning` sentence for the model, and the raw
outcome body as the artifact (`response_format="content_and_artifact"`). Misconfiguration
(unknown tool, refused token, missing identity) and transport errors raise: in LangGraph the
node then fails before its checkpoint is written, and running it again is the same operation.

Install with the `langgraph` extra: `pip install 'idemgate[langgraph]'`.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Iterator, Mapping, Optional

try:
    from langchain_core.runnables import RunnableConfig
    from langchain_core.tools import BaseTool
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "idemgate.langchain needs langchain-core: pip install 'idemgate[langgraph]'"
    ) from e

from pydantic import PrivateAttr

from . import _identity
from ._adapters import AnyClient, StepOf, ToolSource, invoke_from_async, invoke_options, model_name, source
from ._client import AsyncClient, Client, RaiseOn
from ._local import Local
from ._model_text import outcome_text
from ._models import ToolInfo
from ._outcomes import MissingIdentityError, Outcome

StepSuffix = StepOf

# The id of the model's tool call being run, set by `invoke`/`ainvoke` for the tool's body.
_TOOL_CALL_ID: contextvars.ContextVar[Optional[str]] = contextvars.ContextVar(
    "idemgate_langchain_tool_call_id", default=None
)


def _tool_call_id(value: Any) -> Optional[str]:
    if isinstance(value, Mapping) and value.get("type") == "tool_call":
        call_id = value.get("id")
        return call_id if isinstance(call_id, str) and call_id else None
    return None


@contextlib.contextmanager
def _calling(input: Any) -> Iterator[None]:
    """The tool's body runs with the id of the model's tool call it was given, if any."""
    token = _TOOL_CALL_ID.set(_tool_call_id(input))
    try:
        yield
    finally:
        _TOOL_CALL_ID.reset(token)


def identity_from_config(
    tool: str,
    config: Optional[Mapping[str, Any]],
    arguments: Mapping[str, Any],
    step: Optional[StepSuffix] = None,
    tool_call_id: Optional[str] = None,
) -> Optional[_identity.Identity]:
    """The identity of one call (see the module's doc), or None when nothing names one."""
    configurable = (config or {}).get("configurable") or {}
    metadata = (config or {}).get("metadata") or {}
    suffix: Optional[str]
    if callable(step):
        suffix = step(arguments)
    else:
        suffix = step if step is not None else tool_call_id
    node = metadata.get("langgraph_node")
    derived_step: Optional[str]
    if isinstance(node, str) and node:
        derived_step = f"{node}.{suffix}" if suffix else node
    else:
        derived_step = suffix

    explicit_workflow = _identity.current_workflow_id()
    if explicit_workflow is not None:
        step_id = _identity.current_step_id() or derived_step
        if step_id is None:
            raise MissingIdentityError(
                tool, f"workflow {explicit_workflow!r} names no step and this is not a LangGraph node"
            )
        return _identity.resolve(tool, explicit_workflow, step_id)

    thread = configurable.get("thread_id") or metadata.get("thread_id")
    if thread is None:
        return None
    if derived_step is None:
        raise MissingIdentityError(
            tool, f"thread {thread!r} gives the workflow but no LangGraph node names the step; pass step="
        )
    return _identity.resolve(tool, str(thread), derived_step)


class IdemgateTool(BaseTool):
    """A LangChain tool that invokes one gateway tool. Build it with `as_langchain_tool`."""

    response_format: Any = "content_and_artifact"
    _client: AnyClient = PrivateAttr()
    _tool: str = PrivateAttr()
    _step: Optional[StepSuffix] = PrivateAttr(default=None)
    _wait: Optional[float] = PrivateAttr(default=None)
    _raise_on: Optional[RaiseOn] = PrivateAttr(default=None)

    def invoke(self, input: Any, config: Optional[RunnableConfig] = None, **kwargs: Any) -> Any:
        with _calling(input):
            return super().invoke(input, config, **kwargs)

    async def ainvoke(
        self, input: Any, config: Optional[RunnableConfig] = None, **kwargs: Any
    ) -> Any:
        with _calling(input):
            return await super().ainvoke(input, config, **kwargs)

    def _options(self, config: RunnableConfig, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """`invoke`'s keyword arguments for this call: its identity, `wait` and `raise_on`."""
        identity = identity_from_config(
            self._tool, config, arguments, self._step, _TOOL_CALL_ID.get()
        )
        raise_on = self._raise_on if self._raise_on is not None else ()
        return invoke_options(identity, self._wait, raise_on)

    def _answer(self, outcome: Outcome) -> tuple[str, dict[str, Any]]:
        return outcome_text(outcome), dict(outcome.raw)

    def _run(self, config: RunnableConfig, **arguments: Any) -> tuple[str, dict[str, Any]]:
        client = self._client
        if not isinstance(client, (Client, Local)):
            raise TypeError(
                f"the tool {self.name} wraps an {type(client).__name__}: call it with `ainvoke`, "
                "or build it from an idemgate.Client or a Local's tool"
            )
        outcome = client.invoke(self._tool, arguments, **self._options(config, arguments))
        return self._answer(outcome)

    async def _arun(self, config: RunnableConfig, **arguments: Any) -> tuple[str, dict[str, Any]]:
        options = self._options(config, arguments)
        return self._answer(await invoke_from_async(self._client, self._tool, arguments, options))


def as_langchain_tool(
    client: ToolSource,
    tool_name: Optional[str] = None,
    *,
    info: Optional[ToolInfo] = None,
    name: Optional[str] = None,
    description: Optional[str] = None,
    step: Optional[StepSuffix] = None,
    wait: Optional[float] = None,
    raise_on: Optional[RaiseOn] = None,
) -> IdemgateTool:
    """A LangChain `BaseTool` for the gateway tool `tool_name`, or for a function guarded in
    process (`as_langchain_tool(local_tool)`, with no `tool_name`).

    `info` is the tool's description (`client.tool(tool_name)`), fetched here when not given;
    with an `AsyncClient`, pass it or use `as_langchain_tool_async`. `name` defaults to the
    tool's name with dots as underscores, `description` to its model-facing text.
    `step` is the step suffix (see the module's doc); `wait` is sent as `Prefer: wait=N`, so a
    call that finds its own operation still in flight (a resumed run) waits for it to settle.
    `raise_on` is passed to `invoke` (by default every outcome is returned to the model).
    """
    invoker, info = source(client, tool_name, info, "as_langchain_tool_async")
    tool = IdemgateTool(
        name=name or model_name(info.name),
        description=description or info.description,
        args_schema=dict(info.input_schema),
    )
    tool._client = invoker
    tool._tool = info.name
    tool._step = step
    tool._wait = wait
    tool._raise_on = raise_on
    return tool


async def as_langchain_tool_async(
    client: AsyncClient, tool_name: str, **options: Any
) -> IdemgateTool:
    """`as_langchain_tool` for an `AsyncClient`: fetches the tool's description first."""
    info = await client.tool(tool_name)
    return as_langchain_tool(client, tool_name, info=info, **options)


__all__ = [
    "IdemgateTool",
    "as_langchain_tool",
    "as_langchain_tool_async",
    "identity_from_config",
    "model_name",
]
