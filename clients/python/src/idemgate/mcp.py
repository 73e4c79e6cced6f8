"""A function guarded in process as a tool of an MCP server built with the official MCP Python
SDK (`mcp.server.mcpserver.MCPServer`, called `FastMCP` before mcp 2).

    server = MCPServer("refunds")
    idemgate.mcp.add_tool(server, issue_refund)     # issue_refund is a @local.tool function
    server.run()                                    # stdio

The MCP tool's name is the guarded tool's with dots as underscores (`refunds.issue` →
`refunds_issue`), its arguments the function's (its type hints, as for any MCPServer tool), its
description the guarded tool's. A call runs under the engine of the function's `Local` (awaited
with an `AsyncLocal`, on a worker thread with a `Local`, so the server's event loop never
waits on the store).

The operation identity is the one the gateway's MCP face reads (docs/mcp.md): the call's
`_meta["io.idemgate/operation"]` = `{"workflow_id": ..., "step_id": ...}`, set by the runtime
that drives the model, never by the model; else an explicit `idemgate.workflow` /
`idemgate.step` scope around the server; else `step=` given here names the step of the
workflow from `_meta`. A key-based tool called without an identity answers a tool error naming
it (`is_error`, the reason in its text), and nothing runs. The same call delivered twice is one operation: the second answers
`replayed` from the record, and the function runs once.

The tool answers the outcome as structured content (the outcome's JSON body with a `meaning`
sentence for the model, as `idemgate.outcome_text` writes it).

Install the SDK with the `mcp` extra: `pip install 'idemgate[mcp]'`.
"""

from __future__ import annotations

import inspect
import json
import typing
from typing import Any, Mapping, Optional

try:
    from mcp.server.mcpserver import Context
    from mcp.server.mcpserver.exceptions import ToolError
except ImportError:  # pragma: no cover - mcp 1.x
    try:
        from mcp.server.fastmcp import Context
        from mcp.server.fastmcp.exceptions import ToolError  # type: ignore[import-not-found,unused-ignore]
    except ImportError as e:
        raise ImportError("idemgate.mcp needs the MCP Python SDK: pip install 'idemgate[mcp]'") from e

from . import _identity
from ._adapters import StepOf, invoke_from_async, invoke_options, local_info, model_name
from ._local import AsyncLocal, Local, LocalTool
from ._model_text import outcome_text
from ._outcomes import IdemgateError, MissingIdentityError

META_KEY = "io.idemgate/operation"
"""The `_meta` member naming a call's operation: `{"workflow_id": ..., "step_id": ...}`."""

_CONTEXT = "idemgate_mcp_context"


def _meta_of(context: Any) -> Mapping[str, Any]:
    """The call's `_meta` as a mapping (mcp 2 gives a dict, mcp 1 a pydantic model)."""
    try:
        meta = context.request_context.meta
    except (AttributeError, ValueError, LookupError):
        return {}
    if meta is None:
        return {}
    if isinstance(meta, Mapping):
        return meta
    dumped = getattr(meta, "model_dump", None)
    return dumped(by_alias=True) if callable(dumped) else {}


def identity_of(
    tool: str, meta: Mapping[str, Any], arguments: Mapping[str, Any], step: Optional[StepOf] = None
) -> Optional[_identity.Identity]:
    """The identity of one call (see the module's doc), or None when nothing names one."""
    named = meta.get(META_KEY)
    workflow_id: Optional[str] = None
    step_id: Optional[str] = None
    if named is not None:
        if not isinstance(named, Mapping):
            raise MissingIdentityError(tool, f'_meta["{META_KEY}"] is not an object with workflow_id and step_id')
        workflow_id = named.get("workflow_id")
        step_id = named.get("step_id")
        for part, value in (("workflow_id", workflow_id), ("step_id", step_id)):
            if value is not None and not isinstance(value, str):
                raise MissingIdentityError(tool, f'_meta["{META_KEY}"].{part} is not a string')
    if step_id is None and step is not None and (workflow_id or _identity.current_workflow_id()):
        step_id = step(arguments) if callable(step) else step
    return _identity.resolve(tool, workflow_id, step_id)


def add_tool(
    server: Any,
    tool: LocalTool,
    *,
    name: Optional[str] = None,
    description: Optional[str] = None,
    step: Optional[StepOf] = None,
    wait: Optional[float] = None,
) -> str:
    """Adds the guarded function `tool` to the MCP `server` (an `MCPServer`, or mcp 1's
    `FastMCP`) and returns the MCP tool's name.

    `name` defaults to the tool's name with dots as underscores, `description` to the tool's
    (`@local.tool(description=)` or the function's docstring). `step` names the step when the
    call's `_meta` names only the workflow (a string, or a function of the arguments). `wait`
    is how long a call that finds its operation in flight (the same call delivered twice at
    once) waits for it to settle.
    """
    if not isinstance(tool, LocalTool):
        raise TypeError(f"tool: give a function guarded with @local.tool, not a value of type {type(tool).__name__}")
    add = getattr(server, "add_tool", None)
    if not callable(add):
        raise TypeError(f"server: give an MCPServer (or FastMCP), not a value of type {type(server).__name__}")
    local = tool.local
    assert isinstance(local, (Local, AsyncLocal))
    info = local_info(tool)
    tool_name = name or model_name(info.name)
    parameters = list(tool._call.parameters.values())
    for p in parameters:
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            raise TypeError(
                f"tool: {info.name} takes **{p.name}, which an MCP tool's schema cannot express; "
                "name its arguments"
            )
        if p.name == _CONTEXT:
            raise TypeError(f"tool: {info.name} has a parameter named {_CONTEXT}, which idemgate.mcp uses")
    try:
        hints = typing.get_type_hints(tool.function)
    except Exception:  # noqa: BLE001 - a hint that cannot be resolved is Any, as for the schema
        hints = {}
    annotations: dict[str, Any] = {p.name: hints.get(p.name, Any) for p in parameters}
    annotations[_CONTEXT] = Context
    annotations["return"] = dict[str, Any]
    signature = inspect.Signature(
        [p.replace(annotation=annotations[p.name]) for p in parameters]
        + [inspect.Parameter(_CONTEXT, inspect.Parameter.KEYWORD_ONLY, annotation=Context)],
        return_annotation=dict[str, Any],
    )

    async def call(**given: Any) -> dict[str, Any]:
        context = given.pop(_CONTEXT, None)
        try:
            identity = identity_of(info.name, _meta_of(context), given, step)
            outcome = await invoke_from_async(local, info.name, given, invoke_options(identity, wait, ()))
        except (IdemgateError, TypeError, ValueError) as e:
            # A call idemgate refused before anything ran (no identity, arguments that are not
            # JSON): the model reads why, as the SDK shows an anticipated tool error.
            raise ToolError(str(e)) from e
        answer: dict[str, Any] = json.loads(outcome_text(outcome))
        return answer

    call.__name__ = tool_name
    call.__qualname__ = tool_name
    call.__doc__ = description or info.description
    call.__signature__ = signature  # type: ignore[attr-defined]
    call.__annotations__ = annotations
    add(call, name=tool_name, description=description or info.description)
    return tool_name


__all__ = ["META_KEY", "add_tool", "identity_of"]
