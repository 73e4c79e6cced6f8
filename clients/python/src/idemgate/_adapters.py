"""What the framework adapters (`langchain`, `openai_agents`, `mcp`) share: the tool's name for
the model, its description (fetched once from a gateway, or read from a function guarded in
process), and one invocation from a framework's async code with any of the four invokers
(`Client`, `AsyncClient`, `Local`, `AsyncLocal` — they share `invoke`'s signature)."""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Mapping, Optional, Union

from ._client import AsyncClient, Client, RaiseOn
from ._identity import Identity
from ._local import AsyncLocal, Local, LocalTool
from ._models import ToolInfo
from ._outcomes import Outcome

AnyClient = Union[Client, AsyncClient, Local, AsyncLocal]
"""What invokes an adapted tool: a gateway client, or the engine in process."""
ToolSource = Union[Client, AsyncClient, LocalTool]
"""What an adapter is built from: a gateway client with a tool's name, or a guarded function."""
StepOf = Union[str, Callable[[Mapping[str, Any]], str]]
"""The `step=` of an adapted tool: a string, or a function of the call's arguments."""


def model_name(tool_name: str) -> str:
    """A tool name as the model APIs accept it (letters, digits, `_` and `-`)."""
    return "".join(c if c.isalnum() or c in "_-" else "_" for c in tool_name)[:64]


def local_info(tool: LocalTool) -> ToolInfo:
    """A guarded function's description, as a gateway would give it for its tool."""
    identity = "required" if tool.effect_class in (None, "key_based", "irreversible") else "optional"
    return ToolInfo.from_json(
        {
            "name": tool.name,
            "description": tool.description,
            "effect_class": tool.effect_class or "",
            "operation_identity": identity,
            "input_schema": dict(tool.input_schema),
        }
    )


def source(
    target: Any, tool_name: Optional[str], info: Optional[ToolInfo], async_builder: str
) -> tuple[AnyClient, ToolInfo]:
    """The invoker and the tool's description an adapter is built from: a `LocalTool` (a
    function guarded in process, which describes itself), or a client and a tool's name."""
    if isinstance(target, LocalTool):
        if tool_name is not None and tool_name != target.name:
            raise ValueError(
                f"tool_name: {tool_name!r} is not the guarded function's tool {target.name!r}; "
                "leave it out"
            )
        local = target.local
        assert isinstance(local, (Local, AsyncLocal))
        return local, info if info is not None else local_info(target)
    if not isinstance(target, (Client, AsyncClient)):
        raise TypeError(
            "an adapted tool is built from a function guarded with @local.tool, or from an "
            f"idemgate.Client / AsyncClient and a tool's name, not a value of type {type(target).__name__}"
        )
    if not isinstance(tool_name, str) or not tool_name:
        raise TypeError("tool_name: give the gateway tool's name, such as 'tickets.create'")
    return target, tool_info(target, tool_name, info, async_builder)


def tool_info(
    client: Union[Client, AsyncClient], tool_name: str, info: Optional[ToolInfo], async_builder: str
) -> ToolInfo:
    """`info`, else the tool's description fetched with a `Client`; an `AsyncClient` cannot
    fetch it here, and the error names `async_builder`, the builder that can."""
    if info is not None:
        return info
    if not isinstance(client, Client):
        raise TypeError(
            "with an AsyncClient, pass info=await client.tool(name), or use "
            f"`await {async_builder}(client, name)`"
        )
    return client.tool(tool_name)


def invoke_options(
    identity: Optional[Identity], wait: Optional[float], raise_on: RaiseOn
) -> dict[str, Any]:
    """The keyword arguments of `invoke` for one call of an adapted tool."""
    return {
        "workflow_id": identity.workflow_id if identity else None,
        "step_id": identity.step_id if identity else None,
        "wait": wait,
        "raise_on": raise_on,
    }


async def invoke_from_async(
    client: AnyClient,
    tool: str,
    arguments: Mapping[str, Any],
    options: Mapping[str, Any],
    attempts: int = 1,
) -> Outcome:
    """One invocation (`invoke_resending` when `attempts` > 1) from async code: awaited with an
    `AsyncClient` or an `AsyncLocal`, in a worker thread with a `Client` or a `Local`
    (`to_thread` copies the context, so the explicit identity scope follows the call). In
    process there is no answer to lose, so `attempts` is for the clients only."""
    if isinstance(client, AsyncLocal):
        return await client.invoke(tool, arguments, **options)
    if isinstance(client, Local):
        return await asyncio.to_thread(client.invoke, tool, arguments, **options)
    if isinstance(client, AsyncClient):
        if attempts > 1:
            return await client.invoke_resending(tool, arguments, attempts=attempts, **options)
        return await client.invoke(tool, arguments, **options)
    if attempts > 1:
        return await asyncio.to_thread(
            client.invoke_resending, tool, arguments, attempts=attempts, **options
        )
    return await asyncio.to_thread(client.invoke, tool, arguments, **options)
