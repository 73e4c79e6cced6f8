"""What the framework adapters (`langchain`, `openai_agents`) share: the tool's name for the
model, its description fetched once, and one invocation from a framework's async code with
either kind of client."""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Mapping, Optional, Union

from ._client import AsyncClient, Client, RaiseOn
from ._identity import Identity
from ._models import ToolInfo
from ._outcomes import Outcome

AnyClient = Union[Client, AsyncClient]
StepOf = Union[str, Callable[[Mapping[str, Any]], str]]
"""The `step=` of an adapted tool: a string, or a function of the call's arguments."""


def model_name(tool_name: str) -> str:
    """A tool name as the model APIs accept it (letters, digits, `_` and `-`)."""
    return "".join(c if c.isalnum() or c in "_-" else "_" for c in tool_name)[:64]


def tool_info(
    client: AnyClient, tool_name: str, info: Optional[ToolInfo], async_builder: str
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
    `AsyncClient`, in a worker thread with a `Client` (`to_thread` copies the context, so the
    explicit identity scope follows the call)."""
    if isinstance(client, AsyncClient):
        if attempts > 1:
            return await client.invoke_resending(tool, arguments, attempts=attempts, **options)
        return await client.invoke(tool, arguments, **options)
    if attempts > 1:
        return await asyncio.to_thread(
            client.invoke_resending, tool, arguments, attempts=attempts, **options
        )
    return await asyncio.to_thread(client.invoke, tool, arguments, **options)
