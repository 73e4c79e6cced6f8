"""The `session_window` identity rule driven by the official MCP Python SDK, as a host that sends
no `_meta` (a desktop assistant, an IDE, the Inspector) would: no test here passes `_meta`.

Servers: `idemgate mcp --fake-downstream --identity session_window:2s` over stdio, the crate's
`mcp_http` example with `--identity session_window:2s` over streamable HTTP, and
`idemgate mcp --config` / `idemgate serve --config` with `[mcp] identity` in the file. The
window is two seconds so that "after the window" is a short sleep.

Effects are counted on the downstream's side: the in-process fake system of record of each
contract, read through the hidden `idemgate_fake_downstream` tool.

Run: `IDEMGATE_BIN=… IDEMGATE_MCP_HTTP=… pytest crates/mcp/tests/python` (see .ci/run).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import subprocess
from pathlib import Path
from typing import Any, AsyncIterator

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

# The binaries, the contracts and the HTTP server of the SDK suite beside this file.
from test_mcp import CONTRACTS, IDEMGATE, TOKENS, HttpServer, anyio_backend  # noqa: F401

WINDOW = 2.0
IDENTITY = "session_window:2s"
TOKEN = TOKENS["acme"]
ENVIRONMENT = "test"
CONTROL = "idemgate_fake_downstream"
IDENTITY_META = "io.idemgate/identity"

TICKET = {"subject": "Printer out of toner", "body": "Floor 3, the big one."}

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]


@pytest.fixture(params=["stdio", "http"])
def server(request: pytest.FixtureRequest, tmp_path: Path):
    """Connects to a fresh server under `session_window:2s` on this transport."""
    http = HttpServer(tmp_path, ["--identity", IDENTITY]) if request.param == "http" else None

    @contextlib.asynccontextmanager
    async def connect() -> AsyncIterator[Client]:
        if http is None:
            params = StdioServerParameters(
                command=str(IDEMGATE),
                args=["mcp", "--fake-downstream", "--store", f"sqlite://{tmp_path}/stdio.sqlite",
                      "--contracts", CONTRACTS, "--tenant", "acme", "--environment", ENVIRONMENT,
                      "--identity", IDENTITY],
                env={"RUST_LOG": "warn"},
            )
            async with Client(params) as client:
                yield client
        else:
            headers = {"Authorization": f"Bearer {TOKEN}"}
            async with create_mcp_http_client(headers=headers) as http_client:
                async with Client(streamable_http_client(http.url, http_client=http_client)) as client:
                    yield client

    yield connect
    if http is not None:
        http.stop()


async def call(client: Client, arguments: dict[str, Any], tool: str = "tickets_create"):
    # No `_meta`: this is a host that cannot send one.
    result = await client.call_tool(tool, arguments)
    assert result.structured_content is not None, result
    return result


async def effects(client: Client, tool: str = "tickets.create") -> int:
    result = await client.call_tool(CONTROL, {"action": "stats", "tool": tool})
    assert not result.is_error, result.content
    return result.structured_content["effects"]


async def test_a_repeat_in_the_window_is_one_effect_repeat_of_a_second_and_later_a_new_one(server) -> None:
    async with server() as client:
        first = await call(client, TICKET)
        assert not first.is_error, first.content
        assert first.structured_content["status"] == "applied"
        key = first.structured_content["operation_key"]
        assert key.startswith(f"acme:{ENVIRONMENT}:mcp-"), key
        assert first.meta[IDENTITY_META] == {"rule": "session_window", "window_seconds": 2}
        text = first.content[0].text
        assert "Key rule: session_window" in text, text
        assert f'repeat_of "{key}"' in text, text

        # The host re-sends the call (a lost answer, a model proposing it again): one effect.
        again = await call(client, TICKET)
        assert again.structured_content["status"] == "replayed", again.content
        assert again.structured_content["operation_key"] == key
        assert await effects(client) == 1

        # A deliberate repeat: a new operation, a second effect at the system of record.
        repeat = await call(client, {**TICKET, "repeat_of": key})
        assert repeat.structured_content["status"] == "applied", repeat.content
        second = repeat.structured_content["operation_key"]
        assert second != key
        assert repeat.meta[IDENTITY_META]["rule"] == "repeat_of"
        assert await effects(client) == 2
        # The repeat re-sent is still that repeat.
        resent = await call(client, {**TICKET, "repeat_of": key})
        assert resent.structured_content["status"] == "replayed"
        assert resent.structured_content["operation_key"] == second
        assert await effects(client) == 2

        # After the window, the same call is a new operation.
        await asyncio.sleep(WINDOW + 0.5)
        later = await call(client, TICKET)
        assert later.structured_content["status"] == "applied", later.content
        assert later.structured_content["operation_key"] not in (key, second)
        assert await effects(client) == 3


async def test_the_tool_offers_repeat_of_and_says_what_a_repeat_means(server) -> None:
    async with server() as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        create = tools["tickets_create"]
        assert create.input_schema["properties"]["repeat_of"]["type"] == "string"
        assert "repeat_of" not in create.input_schema["required"]
        assert "the same operation" in create.description
        assert "Never use `repeat_of` to retry" in create.description
        assert create.meta["io.idemgate/contract"]["identity_rule"] == "session_window"
        # Reads have no key to derive.
        assert "repeat_of" not in tools["tickets_get"].input_schema["properties"]


async def test_repeat_of_a_key_that_is_not_the_callers_is_refused(server) -> None:
    async with server() as client:
        foreign = "globex:test:mcp-0123456789abcdef:tickets.create-x"
        refused = await call(client, {**TICKET, "repeat_of": foreign})
        assert refused.is_error
        assert refused.structured_content["error"]["code"] == "invalid_operation_key"
        assert "repeat_of names no operation of this caller" in refused.content[0].text
        assert await effects(client) == 0


def gateway_config(tmp: Path) -> Path:
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    path = tmp / "gate.toml"
    path.write_text(
        f'environment = "{ENVIRONMENT}"\n'
        f'store = "sqlite://{tmp / "gate.sqlite"}"\n'
        f'contracts = ["{CONTRACTS}"]\n'
        "sandbox = true\n"
        f'[mcp]\nidentity = "{IDENTITY}"\n'
        '[[tenants]]\nname = "acme"\n'
        f'[[tenants.tokens]]\nname = "acme-agent"\nsha256 = "{digest}"\nrole = "agent"\n')
    return path


async def test_idemgate_mcp_takes_the_identity_rule_from_the_config(tmp_path: Path) -> None:
    params = StdioServerParameters(
        command=str(IDEMGATE),
        args=["mcp", "--config", str(gateway_config(tmp_path)), "--tenant", "acme",
              "--fake-downstream"],
        env={"RUST_LOG": "warn"},
    )
    async with Client(params) as client:
        first = await call(client, TICKET)
        assert first.structured_content["status"] == "applied", first.content
        again = await call(client, TICKET)
        assert again.structured_content["status"] == "replayed"
        assert await effects(client) == 1


async def test_idemgate_serve_mcp_takes_the_identity_rule_from_the_config(tmp_path: Path) -> None:
    """`/mcp` on `idemgate serve` with `[mcp] identity`: the rule reaches the HTTP face. (Its
    sandbox has no control tool; effect counts are the other tests'.)"""
    proc = subprocess.Popen([str(IDEMGATE), "serve", "--config", str(gateway_config(tmp_path)),
                             "--listen", "127.0.0.1:0"], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert line.startswith("idemgate listening on "), line
        base = line.split()[-1]
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with create_mcp_http_client(headers=headers) as http_client:
            async with Client(streamable_http_client(f"{base}/mcp", http_client=http_client)) as client:
                first = await call(client, TICKET)
                assert first.structured_content["status"] == "applied", first.content
                again = await call(client, TICKET)
                assert again.structured_content["status"] == "replayed"
                assert again.structured_content["operation_key"] == first.structured_content["operation_key"]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def test_over_http_with_sessions_the_session_is_part_of_the_key(tmp_path: Path) -> None:
    """`mcp_http --sessions` keeps MCP sessions (`Mcp-Session-Id`): the same call in one session
    is one operation, the same call in another session of the same principal is another."""
    http = HttpServer(tmp_path, ["--identity", IDENTITY.replace("2s", "60s"), "--sessions"])
    try:
        headers = {"Authorization": f"Bearer {TOKEN}"}

        @contextlib.asynccontextmanager
        async def session() -> AsyncIterator[Client]:
            async with create_mcp_http_client(headers=headers) as http_client:
                async with Client(streamable_http_client(http.url, http_client=http_client),
                                  mode="legacy") as client:
                    yield client

        async with session() as one:
            first = await call(one, TICKET)
            assert first.structured_content["status"] == "applied", first.content
            again = await call(one, TICKET)
            assert again.structured_content["status"] == "replayed"
            assert await effects(one) == 1
        async with session() as two:
            other = await call(two, TICKET)
            assert other.structured_content["status"] == "applied", other.content
            assert other.structured_content["operation_key"] != first.structured_content["operation_key"]
            assert await effects(two) == 2
    finally:
        http.stop()
