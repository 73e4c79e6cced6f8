"""An MCP server over stdio (the official SDK's `MCPServer`) whose one tool is a function
guarded in process, for the MCP tests.

    python mcp_local_server.py STORE_URL LEDGER

`tickets.create` (the MCP tool `tickets_create`) appends its operation key to LEDGER (fsynced,
`local_support.FileLedger`) as its effect. Several of these servers may share one store.
"""

from __future__ import annotations

import sys
from pathlib import Path

from mcp.server.mcpserver import MCPServer

sys.path.insert(0, str(Path(__file__).parent))

from local_support import FileLedger  # noqa: E402

import idemgate  # noqa: E402
import idemgate.mcp  # noqa: E402


def main() -> None:
    url, ledger_path = sys.argv[1:3]
    ledger = FileLedger(Path(ledger_path))
    server = MCPServer("tickets")
    with idemgate.Local(url, tenant="acme", environment="mcp", recover=False) as local:

        @local.tool("tickets.create", fingerprint=["subject", "body"])
        def create_ticket(subject: str, body: str = "", *, idempotency_key: str) -> idemgate.Receipt:
            """Opens a support ticket with a subject and a body."""
            ledger.effect(idempotency_key)
            return idemgate.Receipt(f"ticket:{idempotency_key}", {"subject": subject})

        assert isinstance(create_ticket, idemgate.LocalTool)
        idemgate.mcp.add_tool(server, create_ticket, wait=10)
        server.run("stdio")


if __name__ == "__main__":
    main()
