"""An `MCPServer` tool that is a function guarded in process, driven by the official MCP Python
SDK client over stdio (a server process per session): the same call twice, in one session and
from a new session to a new server process, is one effect in the function's ledger."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from mcp import Client
from mcp.client.stdio import StdioServerParameters

from local_support import FileLedger

SERVER = Path(__file__).with_name("mcp_local_server.py")
TICKET = {"subject": "Refund request", "body": "Order 42 arrived broken."}


def _server(tmp_path: Path) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=[str(SERVER), f"sqlite://{tmp_path / 'ops.sqlite'}", str(tmp_path / "ledger.txt")],
        env=dict(os.environ),  # the checkout's package (PYTHONPATH), as the test imports it
    )


def _meta(workflow_id: str, step_id: str = "record_issue") -> Any:
    return {"io.idemgate/operation": {"workflow_id": workflow_id, "step_id": step_id}}


def _session(tmp_path: Path, calls: list[tuple[dict[str, Any], Any]]) -> list[Any]:
    async def main() -> list[Any]:
        async with Client(_server(tmp_path)) as client:
            return [await asyncio.wait_for(client.call_tool("tickets_create", a, meta=m), 30) for a, m in calls]

    return asyncio.run(asyncio.wait_for(main(), 60))


def test_the_tool_is_listed_with_the_functions_schema(tmp_path: Path) -> None:
    async def main() -> Any:
        async with Client(_server(tmp_path)) as client:
            return await client.list_tools()

    tools = asyncio.run(asyncio.wait_for(main(), 60)).tools
    assert [t.name for t in tools] == ["tickets_create"]
    assert tools[0].description == "Opens a support ticket with a subject and a body."
    schema = tools[0].input_schema
    assert set(schema["properties"]) == {"subject", "body"}
    assert schema["required"] == ["subject"]


def test_the_same_call_twice_is_one_effect(tmp_path: Path, run_id: str) -> None:
    ledger = FileLedger(tmp_path / "ledger.txt")
    key = f"acme:mcp:{run_id}:record_issue"
    first, second = _session(tmp_path, [(TICKET, _meta(run_id)), (TICKET, _meta(run_id))])
    assert not first.is_error and not second.is_error, (first, second)
    assert first.structured_content["outcome"] == "applied"
    assert first.structured_content["operation_key"] == key
    assert second.structured_content["outcome"] == "replayed"
    assert second.structured_content["effect_reference"] == f"ticket:{key}"
    assert ledger.counts() == {key: 1}

    # The client reconnects to a new server process over the same store and delivers it again.
    (again,) = _session(tmp_path, [(TICKET, _meta(run_id))])
    assert again.structured_content["outcome"] == "replayed"
    # Other arguments under the same operation: a mismatch, not a second ticket.
    (other,) = _session(tmp_path, [(dict(TICKET, subject="Something else"), _meta(run_id))])
    assert other.structured_content["outcome"] == "rejected"
    assert other.structured_content["error"]["code"] == "idempotency_key_reused_with_different_request"
    assert ledger.counts() == {key: 1}


def test_a_call_without_an_identity_is_a_tool_error_and_no_effect(tmp_path: Path) -> None:
    ledger = FileLedger(tmp_path / "ledger.txt")
    (answer,) = _session(tmp_path, [(TICKET, None)])
    assert answer.is_error
    text = " ".join(getattr(c, "text", "") for c in answer.content)
    assert "tickets.create" in text, text
    assert ledger.counts() == {}
