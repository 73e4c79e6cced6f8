"""idemgate's MCP face driven by the official MCP Python SDK (`mcp` on PyPI), over both transports.

stdio: `idemgate mcp --fake-downstream` as a child process. Streamable HTTP: the crate's
`mcp_http` example (the service a gateway mounts at `/mcp`) on 127.0.0.1 with two bearer
tokens for two tenants. Every test starts its own server on a fresh SQLite file.

Effects are counted on the downstream's side: each contract has an in-process fake system of
record with its own table of committed effects, separate from idemgate's store, read through
the hidden `idemgate_fake_downstream` tool that only `--fake-downstream` serves. It runs in
the server process, so it proves what reached the system of record, not what a separate
process saw.

`idemgate serve --config` answers MCP at `/mcp` with its own bearer tokens, and
`idemgate mcp --config` reads the same file (one test each, at the end).

Run: `IDEMGATE_BIN=… IDEMGATE_MCP_HTTP=… pytest crates/mcp/tests/python` (see .ci/run).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import uuid
from pathlib import Path
from typing import Any, AsyncIterator

import httpx2
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

ROOT = Path(__file__).resolve().parents[4]
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
IDEMGATE = Path(os.environ.get("IDEMGATE_BIN", TARGET / "debug" / "idemgate"))
MCP_HTTP = Path(os.environ.get("IDEMGATE_MCP_HTTP", TARGET / "debug" / "examples" / "mcp_http"))
CONTRACTS = str(ROOT / "contracts" / "*.yaml")

TOKENS = {"acme": "token-acme", "globex": "token-globex"}
ENVIRONMENT = "test"
OPERATION = "io.idemgate/operation"
CONTROL = "idemgate_fake_downstream"
STATUS = "idemgate_operation_status"

TICKET = {"subject": "Refund request", "body": "Order 42 arrived broken."}
REPORT = {"report_type": "usage", "period_start": "2026-10-01", "period_end": "2026-10-31"}

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def meta(step: str, workflow: str | None = None) -> dict[str, Any]:
    return {OPERATION: {"workflow_id": workflow or f"run_{uuid.uuid4().hex[:8]}", "step_id": step}}


class HttpServer:
    """The `mcp_http` example on a loopback port; stops when its stdin closes."""

    def __init__(self, tmp: Path, extra: list[str] | None = None) -> None:
        args = [str(MCP_HTTP), "--store", str(tmp / "http.sqlite"), "--contracts", CONTRACTS,
                "--environment", ENVIRONMENT]
        for tenant, token in TOKENS.items():
            args += ["--token", f"{token}={tenant}"]
        self.proc = subprocess.Popen(args + (extra or []), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line.startswith("LISTENING "):
            self.stop()
            raise RuntimeError(f"mcp_http did not start: {line!r}")
        self.url = line.split()[1]

    def stop(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(params=["stdio", "http"])
def transport(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def server(transport: str, tmp_path: Path):
    """A way to connect as a tenant to a fresh server on this transport."""
    http = HttpServer(tmp_path) if transport == "http" else None

    @contextlib.asynccontextmanager
    async def connect(tenant: str = "acme", mode: str = "auto") -> AsyncIterator[Client]:
        if http is None:
            params = StdioServerParameters(
                command=str(IDEMGATE),
                args=["mcp", "--fake-downstream", "--store", f"sqlite://{tmp_path}/stdio.sqlite",
                      "--contracts", CONTRACTS, "--tenant", tenant, "--environment", ENVIRONMENT,
                      "--actor", f"agent-of-{tenant}"],
                env={"RUST_LOG": "warn"},
            )
            async with Client(params, mode=mode) as client:
                yield client
        else:
            headers = {"Authorization": f"Bearer {TOKENS[tenant]}"}
            async with create_mcp_http_client(headers=headers) as http_client:
                async with Client(streamable_http_client(http.url, http_client=http_client),
                                  mode=mode) as client:
                    yield client

    connect.transport = transport  # type: ignore[attr-defined]
    connect.http = http  # type: ignore[attr-defined]
    yield connect
    if http is not None:
        http.stop()


async def call(client: Client, tool: str, arguments: dict[str, Any], meta_: dict | None = None):
    result = await client.call_tool(tool, arguments, meta=meta_)
    assert result.structured_content is not None, result
    return result


async def fake(client: Client, tool: str, action: str = "stats", **extra: str) -> dict[str, Any]:
    result = await client.call_tool(CONTROL, {"action": action, "tool": tool, **extra})
    assert not result.is_error, result.content
    return result.structured_content


EXPECTED_HINTS = {
    # tool: (readOnlyHint, destructiveHint, idempotentHint, openWorldHint)
    "tickets_create": (False, False, True, True),
    "tickets_get": (True, False, True, True),
    "tickets_set_status": (False, True, True, True),
    "email_send": (False, True, True, True),
    "reports_generate": (False, False, True, True),
    STATUS: (True, False, True, False),
}

OUTCOME_FIELDS = {"status", "operation_key", "effect_reference", "safe_to_repeat", "next_action",
                  "retry_after_seconds", "result", "error"}


async def test_tools_are_the_contracts_with_schemas_and_hints(server) -> None:
    async with server() as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert set(tools) == set(EXPECTED_HINTS), "the control tool stays hidden"
        for name, (read_only, destructive, idempotent, open_world) in EXPECTED_HINTS.items():
            a = tools[name].annotations
            assert (a.read_only_hint, a.destructive_hint, a.idempotent_hint, a.open_world_hint) == (
                read_only, destructive, idempotent, open_world), name
            assert set(tools[name].output_schema["required"]) == OUTCOME_FIELDS, name
        create = tools["tickets_create"]
        assert create.input_schema["required"] == ["subject", "body"]
        assert create.input_schema["additionalProperties"] is False
        assert create.description.startswith("Create one support ticket for one validated workflow step.")
        for needle in ("Use when:", "Do not use when:", "`replayed`", STATUS, "`unknown`"):
            assert needle in create.description, needle
        assert create.meta["io.idemgate/contract"]["name"] == "tickets.create"
        assert create.meta["io.idemgate/contract"]["operation_identity"] == "required"
        for tool in tools.values():
            if tool.name == STATUS:
                continue  # it takes an operation_key on purpose: that is what it polls
            schema = str(tool.input_schema)
            for key_word in ("workflow_id", "step_id", "idempotency"):
                assert key_word not in schema, (tool.name, key_word)


async def test_the_same_operation_twice_is_one_effect(server) -> None:
    async with server() as client:
        m = meta("record_issue")
        first = await call(client, "tickets_create", TICKET, m)
        assert not first.is_error
        assert first.structured_content["status"] == "applied"
        second = await call(client, "tickets_create", TICKET, m)
        assert not second.is_error
        assert second.structured_content["status"] == "replayed"
        ref = first.structured_content["effect_reference"]
        assert second.structured_content["effect_reference"] == ref
        assert second.content[0].text == (
            f"replayed: {ref} was already done for this step; no new effect, do not call again.")
        # Counted at the system of record: one effect, and the replay never reached it.
        stats = await fake(client, "tickets.create")
        assert (stats["effects"], stats["calls"]) == (1, 1)
        # Another step of the same workflow is another operation.
        other = dict(m)
        other[OPERATION] = {**m[OPERATION], "step_id": "record_issue_2"}
        third = await call(client, "tickets_create", TICKET, other)
        assert third.structured_content["status"] == "applied"
        assert (await fake(client, "tickets.create"))["effects"] == 2


async def test_a_call_without_operation_meta_is_rejected(server) -> None:
    async with server() as client:
        result = await call(client, "tickets_create", TICKET)
        assert result.is_error
        outcome = result.structured_content
        assert (outcome["status"], outcome["error"]["code"]) == ("rejected", "missing_operation_key")
        assert outcome["safe_to_repeat"] is True
        assert result.content[0].text.startswith("rejected (missing_operation_key): nothing happened")
        # Malformed identity is a different error, and neither reaches the downstream.
        bad = await call(client, "tickets_create", TICKET, {OPERATION: {"workflow_id": "a:b", "step_id": "s"}})
        assert bad.is_error
        assert bad.structured_content["error"]["code"] == "invalid_operation_key"
        assert (await fake(client, "tickets.create"))["calls"] == 0
        # A read needs no identity.
        read = await call(client, "tickets_get", {"ticket_id": "ticket_1"})
        assert not read.is_error and read.structured_content["status"] == "applied"


async def test_a_lost_answer_after_commit_is_replayed_on_retry(server) -> None:
    async with server() as client:
        await fake(client, "tickets.create", "push_fault", fault="commit_then_drop")
        m = meta("record_issue")
        first = await call(client, "tickets_create", TICKET, m)
        # The ticket service committed and its answer was lost; idemgate found the receipt by
        # operation key instead of sending again.
        assert first.structured_content["status"] == "applied"
        stats = await fake(client, "tickets.create")
        assert (stats["effects"], stats["lookups"]) == (1, 1)
        retry = await call(client, "tickets_create", TICKET, m)
        assert retry.structured_content["status"] == "replayed"
        assert retry.structured_content["effect_reference"] == first.structured_content["effect_reference"]
        stats = await fake(client, "tickets.create")
        assert (stats["effects"], stats["calls"]) == (1, 1)


async def test_a_changed_request_under_the_same_step_is_rejected(server) -> None:
    async with server() as client:
        m = meta("record_issue")
        await call(client, "tickets_create", TICKET, m)
        changed = await call(client, "tickets_create", {**TICKET, "subject": "Something else"}, m)
        assert changed.is_error
        assert changed.structured_content["error"]["code"] == "idempotency_key_reused_with_different_request"
        assert (await fake(client, "tickets.create"))["effects"] == 1


async def test_an_async_job_is_polled_through_the_status_tool(server) -> None:
    async with server() as client:
        await fake(client, "reports_generate", "push_fault", fault="accept_job")
        m = meta("monthly_report")
        started = await call(client, "reports_generate", REPORT, m)
        outcome = started.structured_content
        assert (outcome["status"], outcome["next_action"]) == ("in_flight", "poll")
        assert not started.is_error
        key = outcome["operation_key"]
        assert key.endswith(":monthly_report")
        assert STATUS in started.content[0].text

        running = await call(client, STATUS, {"operation_key": key})
        assert running.structured_content["status"] == "in_flight"
        stats = await fake(client, "reports_generate")
        assert stats["effects"] == 0 and [j["state"] for j in stats["jobs"]] == ["running"]

        await fake(client, "reports_generate", "complete_job", job_id=stats["jobs"][0]["job_id"])
        done = await call(client, STATUS, {"operation_key": key})
        assert done.structured_content["status"] == "replayed", done.structured_content
        assert done.structured_content["result"] is not None
        again = await call(client, "reports_generate", REPORT, m)
        assert again.structured_content["status"] == "replayed"
        assert (await fake(client, "reports_generate"))["effects"] == 1


async def test_status_is_scoped_to_the_callers_tenant(server) -> None:
    async with server("acme") as client:
        created = await call(client, "tickets_create", TICKET, meta("record_issue"))
        key = created.structured_content["operation_key"]
        assert key.startswith(f"acme:{ENVIRONMENT}:")
        mine = await call(client, STATUS, {"operation_key": key})
        assert mine.structured_content["status"] == "replayed"
        missing = await call(client, STATUS, {"operation_key": key.replace("record_issue", "nope")})
        foreign = await call(client, STATUS, {"operation_key": key.replace("acme:", "globex:", 1)})
        for r in (missing, foreign):
            assert r.is_error and r.structured_content["error"]["code"] == "not_found"
    if server.transport == "http":
        # Another tenant's credentials on the same server cannot read acme's operation, and get
        # exactly the answer of a missing one.
        async with server("globex") as other:
            theirs = await call(other, STATUS, {"operation_key": key})
            assert theirs.is_error
            assert theirs.structured_content == missing.structured_content


async def test_the_pre_2026_handshake_works_too(server) -> None:
    async with server(mode="legacy") as client:
        assert client.session.protocol_version < "2026-07-28"
        m = meta("record_issue")
        assert (await call(client, "tickets_create", TICKET, m)).structured_content["status"] == "applied"
        assert (await call(client, "tickets_create", TICKET, m)).structured_content["status"] == "replayed"


async def test_http_requires_a_token_and_an_allowed_host(tmp_path: Path) -> None:
    server = HttpServer(tmp_path)
    try:
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
        headers = {"Accept": "application/json, text/event-stream"}
        async with httpx2.AsyncClient() as http:
            r = await http.post(server.url, json=body, headers=headers)
            assert r.status_code == 401
            assert r.headers["www-authenticate"] == "Bearer"
            assert r.json()["error"]["code"] == "unauthorized"
            r = await http.post(server.url, json=body,
                                headers={**headers, "Authorization": "Bearer wrong"})
            assert r.status_code == 401
            r = await http.post(server.url, json=body, headers={
                **headers, "Authorization": f"Bearer {TOKENS['acme']}", "Host": "evil.example"})
            assert r.status_code == 403
    finally:
        server.stop()
    # The allow-list is configurable: a deployment names its own host.
    server = HttpServer(tmp_path, ["--allowed-host", "idemgate.example"])
    try:
        body = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "pytest", "version": "0"}}}
        async with httpx2.AsyncClient() as http:
            r = await http.post(server.url, json=body, headers={
                "Accept": "application/json, text/event-stream",
                "Authorization": f"Bearer {TOKENS['acme']}", "Host": "idemgate.example"})
            assert r.status_code == 200, r.text
            r = await http.post(server.url, json=body, headers={
                "Accept": "application/json, text/event-stream",
                "Authorization": f"Bearer {TOKENS['acme']}"})
            assert r.status_code == 403
    finally:
        server.stop()


def test_the_agent_runtime_example_resumes_a_step_safely(tmp_path: Path) -> None:
    """examples/agent_runtime.py: crash after a call, resume, and the step is replayed."""
    import sys

    example = [sys.executable, str(ROOT / "examples" / "agent_runtime.py"), "--state",
               str(tmp_path / "wf.json"), "--idemgate", str(IDEMGATE), "--contracts", CONTRACTS]
    crashed = subprocess.run(example + ["--crash-after", "record_issue"], capture_output=True,
                             text=True, timeout=60)
    assert crashed.returncode == 3, crashed.stdout + crashed.stderr
    assert "record_issue: applied:" in crashed.stdout
    resumed = subprocess.run(example, capture_output=True, text=True, timeout=60)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "record_issue: replayed:" in resumed.stdout
    assert "usage_report: applied:" in resumed.stdout
    assert "workflow finished" in resumed.stdout


def gateway_config(tmp: Path) -> Path:
    """The gateway's TOML configuration: the sandbox, tenant acme with an agent token."""
    digest = hashlib.sha256(TOKENS["acme"].encode()).hexdigest()
    path = tmp / "gate.toml"
    path.write_text(
        f'environment = "{ENVIRONMENT}"\n'
        f'store = "sqlite://{tmp / "gate.sqlite"}"\n'
        f'contracts = ["{CONTRACTS}"]\n'
        "sandbox = true\n"
        '[[tenants]]\nname = "acme"\n'
        f'[[tenants.tokens]]\nname = "acme-agent"\nsha256 = "{digest}"\nrole = "agent"\n')
    return path


async def test_idemgate_serve_answers_mcp_with_its_own_tokens(tmp_path: Path) -> None:
    """`/mcp` on `idemgate serve`: one operation, two faces (MCP, then API v1)."""
    proc = subprocess.Popen([str(IDEMGATE), "serve", "--config", str(gateway_config(tmp_path)),
                             "--listen", "127.0.0.1:0"], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert line.startswith("idemgate listening on "), line
        base = line.split()[-1]
        auth = {"Authorization": f"Bearer {TOKENS['acme']}"}
        m = meta("record_issue")
        async with create_mcp_http_client(headers=auth) as http_client:
            async with Client(streamable_http_client(f"{base}/mcp", http_client=http_client)) as client:
                assert {t.name for t in (await client.list_tools()).tools} == set(EXPECTED_HINTS)
                missing = await call(client, "tickets_create", TICKET)
                assert missing.structured_content["error"]["code"] == "missing_operation_key"
                first = await call(client, "tickets_create", TICKET, m)
                assert first.structured_content["status"] == "applied"
                assert first.structured_content["operation_key"].startswith(f"acme:{ENVIRONMENT}:")
                again = await call(client, "tickets_create", TICKET, m)
                assert again.structured_content["status"] == "replayed"
        async with httpx2.AsyncClient() as http:
            step = m[OPERATION]
            r = await http.post(f"{base}/v1/tools/tickets.create/invoke", headers=auth, json={
                "workflow_id": step["workflow_id"], "step_id": step["step_id"], "arguments": TICKET})
            assert r.status_code == 200, r.text
            assert r.headers["idempotent-replayed"] == "true"
            assert r.json()["effect_reference"] == first.structured_content["effect_reference"]
            r = await http.post(f"{base}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                                headers={"Accept": "application/json, text/event-stream"})
            assert r.status_code == 401
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def test_idemgate_mcp_reads_the_gateway_config(tmp_path: Path) -> None:
    """`idemgate mcp --config`: store, environment and contracts from the file, a named tenant."""
    params = StdioServerParameters(
        command=str(IDEMGATE),
        args=["mcp", "--config", str(gateway_config(tmp_path)), "--tenant", "acme",
              "--fake-downstream"],
        env={"RUST_LOG": "warn"},
    )
    async with Client(params) as client:
        m = meta("record_issue")
        first = await call(client, "tickets_create", TICKET, m)
        assert first.structured_content["operation_key"].startswith(f"acme:{ENVIRONMENT}:")
        again = await call(client, "tickets_create", TICKET, m)
        assert again.structured_content["status"] == "replayed"
        stats = await fake(client, "tickets.create")
        assert (stats["effects"], stats["calls"]) == (1, 1)
    refused = subprocess.run([str(IDEMGATE), "mcp", "--config", str(tmp_path / "gate.toml"),
                              "--tenant", "globex"], capture_output=True, text=True, timeout=30,
                             stdin=subprocess.DEVNULL)
    assert refused.returncode == 2
    assert "not a tenant of" in refused.stderr and "its tenants: acme" in refused.stderr
