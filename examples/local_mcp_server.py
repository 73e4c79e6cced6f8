"""A function guarded in process, as a tool of an MCP server built with the official MCP Python
SDK (`MCPServer`): the same call delivered twice — by one client, or by a client that
reconnects to a new server process — is one effect.

    pip install './clients/python[mcp]'
    python examples/local_mcp_server.py serve STORE_URL    # the server, over stdio (for a host)
    python examples/local_mcp_server.py                    # a demo: starts it and calls it

The demo starts this script as a stdio server twice, each time over the same SQLite store, and
calls `tickets_create` with the operation identity in the call's `_meta` (as an agent runtime
does, never the model): the first call is `applied`, every later one `replayed`. The ticket
system is a ledger file beside the store; the demo prints how many tickets it holds: one.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from pathlib import Path

import idemgate
import idemgate.mcp


def serve(url: str) -> None:
    from mcp.server.mcpserver import MCPServer

    ledger = Path(url.removeprefix("sqlite://")).with_suffix(".tickets")
    server = MCPServer("tickets")
    with idemgate.Local(url, tenant="acme", environment="demo") as local:

        @local.tool("tickets.create", fingerprint=["subject", "body"])
        def create_ticket(subject: str, body: str, *, idempotency_key: str) -> idemgate.Receipt:
            """Opens a support ticket."""
            with ledger.open("a") as f:  # the effect
                f.write(f"{idempotency_key}\t{subject}\n")
            return idemgate.Receipt(reference=f"T-{sum(1 for _ in ledger.open())}")

        idemgate.mcp.add_tool(server, create_ticket, wait=10)
        server.run("stdio")


async def demo(directory: Path) -> None:
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    url = f"sqlite://{directory / 'ops.sqlite'}"
    # The server inherits this environment (the SDK passes only a few variables by default).
    server = StdioServerParameters(command=sys.executable, args=[__file__, "serve", url], env=dict(os.environ))
    meta = {"io.idemgate/operation": {"workflow_id": "conversation-9", "step_id": "open_ticket"}}
    arguments = {"subject": "Refund request", "body": "Order 42 arrived broken."}
    for session in (1, 2):  # a new server process each time, over the same store
        async with Client(server) as client:
            for _ in range(2):
                result = await client.call_tool("tickets_create", arguments, meta=meta)
                answer = result.structured_content
                print(f"session {session}: {answer['outcome']} {answer.get('effect_reference')}")
    tickets = (directory / "ops.tickets").read_text().splitlines()
    print(f"tickets in the ledger: {len(tickets)}")
    assert len(tickets) == 1


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve(sys.argv[2])
    else:
        with tempfile.TemporaryDirectory() as d:
            asyncio.run(demo(Path(d)))
