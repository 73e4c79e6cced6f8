"""A small MCP server (the official `mcp` package's MCPServer, once FastMCP) for `idemgate wrap`.

It is the system of record of the tests: every effect it performs is one line appended to its
effects file (`--effects FILE`), written and flushed before it answers, so the tests count
effects on the child's side, separately from what idemgate answered. It also writes its
process id to `<effects>.pid` at start, so a test can kill it (SIGKILL) mid-call.

Tools:
- `create_ticket(subject)` — one effect; no annotations (key-based by default).
- `hang(subject)` — writes its effect, then blocks until killed (the lost answer).
- `fail_ticket(subject)` — writes its effect, then raises: a result with `isError: true`.
- `get_ticket(number)` — `readOnlyHint`: counts reads in `<effects>.reads`, no effect.
- `purge_tickets()` — `destructiveHint`: one effect, approval required by default.
- with `--collide`: also `idemgate_operation_status`, the name of idemgate's own tool.
A resource `tickets://count` and a prompt `triage` test the pass-through.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp_types import ToolAnnotations

parser = argparse.ArgumentParser()
parser.add_argument("--effects", required=True)
parser.add_argument("--collide", action="store_true")
args = parser.parse_args()

EFFECTS = Path(args.effects)
Path(f"{EFFECTS}.pid").write_text(str(os.getpid()))
# The parent is the `idemgate wrap` that started this child.
Path(f"{EFFECTS}.ppid").write_text(str(os.getppid()))

server = MCPServer("tickets-child")


def effect(kind: str, subject: str) -> int:
    with EFFECTS.open("a") as f:
        f.write(f"{kind}\t{subject}\n")
        f.flush()
        os.fsync(f.fileno())
    return len(EFFECTS.read_text().splitlines())


@server.tool(description="Opens a ticket with this subject.")
def create_ticket(subject: str) -> str:
    n = effect("create", subject)
    return f"ticket T-{n} opened: {subject}"


@server.tool(description="Opens a ticket, then never answers.")
def hang(subject: str) -> str:
    effect("hang", subject)
    while True:
        time.sleep(60)


@server.tool(description="Opens a ticket, then fails.")
def fail_ticket(subject: str) -> str:
    effect("fail", subject)
    raise RuntimeError(f"the ticket system failed after opening {subject!r}")


@server.tool(description="Reads a ticket.", annotations=ToolAnnotations(read_only_hint=True))
def get_ticket(number: int) -> str:
    reads = Path(f"{EFFECTS}.reads")
    with reads.open("a") as f:
        f.write(f"{number}\n")
    return f"ticket T-{number}"


@server.tool(description="Deletes every ticket.", annotations=ToolAnnotations(destructive_hint=True))
def purge_tickets() -> str:
    effect("purge", "-")
    return "purged"


if args.collide:

    @server.tool(name="idemgate_operation_status", description="Collides with idemgate's tool.")
    def collide() -> str:
        return "collision"


@server.resource("tickets://count")
def ticket_count() -> str:
    return str(len(EFFECTS.read_text().splitlines()) if EFFECTS.exists() else 0)


@server.prompt()
def triage(subject: str) -> str:
    return f"Triage the ticket about {subject}."


if __name__ == "__main__":
    server.run()
