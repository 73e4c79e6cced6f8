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
- with `--events`, tools that talk back to the host during a call:
  - `slow_ticket(subject)` — logs, reports progress three times, then one effect.
  - `tagged_ticket(subject, calls)` — waits until `calls` calls of it are running at once
    (each appends its operation key to `<effects>.arrived`), then reports progress three
    times, each message naming the operation key its request carried in `_meta`, then one
    effect.
  - `summarize_ticket(subject)` — asks the host's model (sampling), then one effect naming
    the model's answer.
  - `ticket_roots()` — asks the host for its roots (read-only).
  - `impatient_ticket(subject)` — asks the host's model (sampling), gives up after one second
    (cancelling its request), and opens nothing.
  - `confirm_ticket(subject)` — asks the host's user for a priority (elicitation), then one
    effect naming it, or none when the user declines.
  - `later_ticket(subject, seconds)` — waits, then one effect (for a cancelled call).
  - `add_tool()` / `drop_tool(name)` — change the tool list and say so (tools/list_changed);
    `add_tool` adds `late_ticket(subject)` (one effect) and, with `collide`, a tool with the
    name of idemgate's own.
  - a resource `tickets://slow` that answers after 30 s, and writes `<effects>.cancelled` when
    its request is cancelled; completion of the prompt `triage`'s `subject`.
  - `logging/setLevel`, `resources/subscribe` and `resources/unsubscribe` answered, and every
    one received — and every read of `tickets://count` — appended to `<effects>.received` as
    `pid<TAB>method<TAB>level or uri`, so a test sees what each process was told, in order.
- with `--pay`, tools that take an idempotency key, as payment servers' do, and deduplicate
  on it: the ledger `<effects>.keys` holds one line per key ever seen (`key<TAB>answer`), and a
  call under a key already there answers the stored answer and performs nothing.
  - `pay(amount, idempotency_key)` and `charge(amount, idempotencyKey)` — one effect per new
    key (`pay` or `charge` in the effects file). While `<effects>.lose` exists, the first call
    deletes it, performs its effect, records its key, and SIGKILLs its own process before it
    answers: the lost answer, with the effect committed.
  - `lookup_payment(number)` — a read the server does not annotate (no readOnlyHint): counts
    reads in `<effects>.reads`, no effect.
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
parser.add_argument("--events", action="store_true")
parser.add_argument("--pay", action="store_true")
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


if args.pay:
    import signal

    def deduplicated(kind: str, amount: int, key: str) -> str:
        ledger = Path(f"{EFFECTS}.keys")
        seen = dict(l.split("\t", 1) for l in ledger.read_text().splitlines()) if ledger.exists() else {}
        if key in seen:
            return seen[key]
        n = effect(kind, f"{amount}\t{key}")
        answer = f"{kind} P-{n} of {amount} done"
        with ledger.open("a") as f:
            f.write(f"{key}\t{answer}\n")
            f.flush()
            os.fsync(f.fileno())
        lose = Path(f"{EFFECTS}.lose")
        if lose.exists():
            lose.unlink()
            os.kill(os.getpid(), signal.SIGKILL)
        return answer

    @server.tool(description="Pays an amount. Make a new idempotency_key for every request.")
    def pay(amount: int, idempotency_key: str) -> str:
        return deduplicated("pay", amount, idempotency_key)

    @server.tool(description="Charges an amount, deduplicated on idempotencyKey.")
    def charge(amount: int, idempotencyKey: str) -> str:  # noqa: N803 (the server's spelling)
        return deduplicated("charge", amount, idempotencyKey)

    @server.tool(description="Reads a payment.")
    def lookup_payment(number: int) -> str:
        with Path(f"{EFFECTS}.reads").open("a") as f:
            f.write(f"{number}\n")
        return f"payment P-{number}"


if args.events:
    import warnings

    import anyio
    from mcp.server.mcpserver import Context
    from mcp_types import (Completion, EmptyResult, PromptReference, SamplingMessage,
                           SetLevelRequestParams, SubscribeRequestParams, TextContent,
                           UnsubscribeRequestParams)
    from pydantic import BaseModel

    class Priority(BaseModel):
        priority: str

    # Logging, sampling and roots are deprecated by the 2026-07-28 revision; wrap speaks the
    # handshake revision to its child, where they are current.
    warnings.simplefilter("ignore")

    @server.tool(description="Opens a ticket slowly, telling how far it got.")
    async def slow_ticket(subject: str, ctx: Context) -> str:
        await ctx.info(f"opening a ticket about {subject}")
        for step in (1, 2, 3):
            await ctx.report_progress(step, 3, f"step {step} of 3")
            await anyio.sleep(0.05)
        n = effect("slow", subject)
        return f"ticket T-{n} opened slowly: {subject}"

    @server.tool(description="Opens a ticket once `calls` calls of it run at once, telling how far it got.")
    async def tagged_ticket(subject: str, calls: int, ctx: Context) -> str:
        operation = (ctx.request_context.meta or {}).get("io.idemgate/operation_key", "none")
        arrived = Path(f"{EFFECTS}.arrived")
        with arrived.open("a") as f:
            f.write(f"{operation}\n")
        with anyio.move_on_after(20):
            while len(arrived.read_text().splitlines()) < calls:
                await anyio.sleep(0.02)
        for step in (1, 2, 3):
            await ctx.report_progress(step, 3, f"{operation} step {step}")
            await anyio.sleep(0.05)
        n = effect("tagged", subject)
        return f"ticket T-{n} opened: {subject}"

    def received(method: str, value: str) -> None:
        with Path(f"{EFFECTS}.received").open("a") as f:
            f.write(f"{os.getpid()}\t{method}\t{value}\n")

    async def on_set_level(_ctx, params: SetLevelRequestParams) -> EmptyResult:
        received("logging/setLevel", params.level)
        return EmptyResult()

    async def on_subscribe(_ctx, params: SubscribeRequestParams) -> EmptyResult:
        received("resources/subscribe", str(params.uri))
        return EmptyResult()

    async def on_unsubscribe(_ctx, params: UnsubscribeRequestParams) -> EmptyResult:
        received("resources/unsubscribe", str(params.uri))
        return EmptyResult()

    lowlevel = server._lowlevel_server
    lowlevel.add_request_handler("logging/setLevel", SetLevelRequestParams, on_set_level)
    lowlevel.add_request_handler("resources/subscribe", SubscribeRequestParams, on_subscribe)
    lowlevel.add_request_handler("resources/unsubscribe", UnsubscribeRequestParams, on_unsubscribe)

    @server.tool(description="Opens a ticket with a summary written by the host's model.")
    async def summarize_ticket(subject: str, ctx: Context) -> str:
        answer = await ctx.session.create_message(
            [SamplingMessage(role="user", content=TextContent(type="text", text=f"Summarize: {subject}"))],
            max_tokens=20)
        summary = answer.content.text
        n = effect("summary", summary)
        return f"ticket T-{n} opened: {summary}"

    @server.tool(description="Asks the host's model for a summary, and gives up after a second.")
    async def impatient_ticket(subject: str, ctx: Context) -> str:
        with anyio.move_on_after(1):
            await ctx.session.create_message(
                [SamplingMessage(role="user", content=TextContent(type="text", text=f"Summarize: {subject}"))],
                max_tokens=20)
            return "answered in time"
        return f"gave up waiting for a summary of {subject}"

    @server.tool(description="Lists the host's roots.", annotations=ToolAnnotations(read_only_hint=True))
    async def ticket_roots(ctx: Context) -> str:
        roots = await ctx.session.list_roots()
        return " ".join(str(r.uri) for r in roots.roots)

    @server.tool(description="Opens a ticket at the priority the user gives.")
    async def confirm_ticket(subject: str, ctx: Context) -> str:
        answer = await ctx.elicit(f"Priority of {subject}?", schema=Priority)
        if answer.action != "accept":
            return f"not opened: {answer.action}"
        n = effect("confirmed", f"{subject}:{answer.data.priority}")
        return f"ticket T-{n} opened at {answer.data.priority}: {subject}"

    @server.tool(description="Opens a ticket after a pause.")
    async def later_ticket(subject: str, seconds: float) -> str:
        await anyio.sleep(seconds)
        n = effect("later", subject)
        return f"ticket T-{n} opened later: {subject}"

    def late_ticket(subject: str) -> str:
        """Opens a ticket, with a tool added at run time."""
        n = effect("late", subject)
        return f"ticket T-{n} opened late: {subject}"

    def late_collision() -> str:
        return "collision"

    @server.tool(description="Adds the tool late_ticket (and, with collide, a colliding one).")
    async def add_tool(ctx: Context, collide: bool = False) -> str:
        server.add_tool(late_ticket, description="Opens a ticket, added at run time.")
        if collide:
            server.add_tool(late_collision, name="idemgate_operation_status", description="Collides.")
        await ctx.session.send_tool_list_changed()
        return "added"

    @server.resource("tickets://slow")
    async def slow_resource() -> str:
        try:
            await anyio.sleep(30)
        except anyio.get_cancelled_exc_class():
            Path(f"{EFFECTS}.cancelled").write_text("slow")
            raise
        return "slow"

    @server.completion()
    async def complete(ref, argument, _context):
        if isinstance(ref, PromptReference) and argument.name == "subject":
            return Completion(values=[s for s in ("printer", "projector") if s.startswith(argument.value)])
        return None

    @server.tool(description="Removes a tool.")
    async def drop_tool(name: str, ctx: Context) -> str:
        server.remove_tool(name)
        await ctx.session.send_tool_list_changed()
        return f"removed {name}"


@server.resource("tickets://count")
def ticket_count() -> str:
    if args.events:
        received("resources/read", "tickets://count")
    return str(len(EFFECTS.read_text().splitlines()) if EFFECTS.exists() else 0)


@server.prompt()
def triage(subject: str) -> str:
    return f"Triage the ticket about {subject}."


if __name__ == "__main__":
    server.run()
