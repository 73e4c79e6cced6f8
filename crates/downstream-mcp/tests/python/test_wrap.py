"""`idemgate wrap -- python child.py` driven by the official MCP Python SDK (`mcp` on PyPI).

The child (child.py beside this file) is the system of record: it appends one line per effect
to its own effects file before it answers, so every test counts effects on the child's side,
separately from what idemgate answered. The store is a fresh SQLite file per test, read with
sqlite3 where a test asserts that a record exists or not.

Run: `IDEMGATE_BIN=… pytest crates/downstream-mcp/tests/python` (see scripts/ci-wrap).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, AsyncIterator

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[3]
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
IDEMGATE = Path(os.environ.get("IDEMGATE_BIN", TARGET / "debug" / "idemgate"))
CHILD = HERE / "child.py"
PYTHON = sys.executable
OPERATION = "io.idemgate/operation"
STATUS = "idemgate_operation_status"
CHILD_TOOLS = ["create_ticket", "hang", "fail_ticket", "get_ticket", "purge_tickets"]

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]
anyio_backend = pytest.fixture(lambda: "asyncio", name="anyio_backend")


def meta(step: str, workflow: str = "") -> dict[str, Any]:
    """The `_meta` an agent runtime sends: a fresh workflow unless one is named."""
    identity = {"workflow_id": workflow or "wf-" + uuid.uuid4().hex, "step_id": step}
    return {OPERATION: identity}


class World:
    """One test's child effects file and store."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.effects_file = tmp / "effects.log"
        self.store = tmp / "wrap.sqlite"

    def effects(self, kind: str | None = None) -> list[str]:
        if not self.effects_file.exists():
            return []
        lines = self.effects_file.read_text().splitlines()
        return [l for l in lines if kind is None or l.startswith(f"{kind}\t")]

    def reads(self) -> int:
        reads = Path(f"{self.effects_file}.reads")
        return len(reads.read_text().splitlines()) if reads.exists() else 0

    def child_pid(self) -> int:
        return int(Path(f"{self.effects_file}.pid").read_text())

    def records(self, tool: str | None = None) -> list[tuple[str, str]]:
        if not self.store.exists():
            return []
        with contextlib.closing(sqlite3.connect(self.store)) as db:
            rows = db.execute("SELECT tool, status FROM operations").fetchall()
        return [r for r in rows if tool is None or r[0] == tool]

    def args(self, *extra: str, child: tuple[str, ...] = ()) -> list[str]:
        return ["wrap", "--store", f"sqlite://{self.store}", *extra, "--",
                PYTHON, str(CHILD), "--effects", str(self.effects_file), *child]

    @contextlib.asynccontextmanager
    async def connect(self, *extra: str, child: tuple[str, ...] = (), stderr: Path | None = None,
                      **client: Any) -> AsyncIterator[Client]:
        """`client` goes to the SDK's Client: callbacks, and `mode` ("legacy" for the
        initialize handshake that the hosts people use today speak). `stderr`: a file that
        receives wrap's stderr."""
        params = StdioServerParameters(command=str(IDEMGATE), args=self.args(*extra, child=child),
                                       env={"RUST_LOG": "warn", "PATH": os.environ["PATH"]})
        with contextlib.ExitStack() as files:
            server: Any = params
            if stderr is not None:
                server = stdio_client(params, errlog=files.enter_context(stderr.open("w")))
            async with Client(server, **client) as client_:
                yield client_


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


async def test_tools_are_listed_with_the_childs_names_schemas_and_annotations(world: World):
    # The child itself, without idemgate, is the reference.
    direct = StdioServerParameters(command=PYTHON, args=[str(CHILD), "--effects", str(world.tmp / "direct.log")])
    async with Client(direct) as client:
        theirs = {t.name: t for t in (await client.list_tools()).tools}
    async with world.connect() as client:
        ours = {t.name: t for t in (await client.list_tools()).tools}
    assert list(ours) == [STATUS, *CHILD_TOOLS]
    for name in CHILD_TOOLS:
        # Under wrap's default identity (session_window) a key-based tool also lists the
        # optional `repeat_of`; everything else of the child's schema is as the child wrote it.
        schema = json.loads(json.dumps(ours[name].input_schema))
        added = schema.get("properties", {}).pop("repeat_of", None)
        assert (added is None) == (name == "get_ticket"), name
        assert schema == theirs[name].input_schema, name
        assert ours[name].annotations == theirs[name].annotations, name
        assert ours[name].description.startswith(theirs[name].description), name
        contract = ours[name].meta["io.idemgate/contract"]
        assert contract["name"] == name
    classes = {n: ours[n].meta["io.idemgate/contract"]["effect_class"] for n in CHILD_TOOLS}
    assert classes == {"create_ticket": "key_based", "hang": "key_based", "fail_ticket": "key_based",
                       "get_ticket": "read", "purge_tickets": "irreversible"}


async def test_repeated_calls_with_meta_give_one_effect(world: World):
    step = meta("open")
    async with world.connect() as client:
        statuses = []
        for _ in range(3):
            result = await client.call_tool("create_ticket", {"subject": "printer"}, meta=step)
            statuses.append(result.structured_content["status"])
            assert "ticket T-1 opened: printer" in result.content[0].text
        assert statuses == ["applied", "replayed", "replayed"]
        # Another step of the same workflow is another operation: a second effect.
        other = await client.call_tool("create_ticket", {"subject": "printer"},
                                       meta=meta("open-again", step[OPERATION]["workflow_id"]))
        assert other.structured_content["status"] == "applied"
    # A new wrap process (and a new child) replays from the store: no third effect.
    async with world.connect() as client:
        again = await client.call_tool("create_ticket", {"subject": "printer"}, meta=step)
        assert again.structured_content["status"] == "replayed"
    assert len(world.effects("create")) == 2
    # The same operation with different arguments is refused, and sends nothing.
    async with world.connect() as client:
        changed = await client.call_tool("create_ticket", {"subject": "scanner"}, meta=step)
        assert changed.is_error
        assert changed.structured_content["error"]["code"] == "idempotency_key_reused_with_different_request"
    assert len(world.effects("create")) == 2


async def wait_for(predicate, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await anyio.sleep(0.05)


async def test_a_child_killed_mid_call_ends_unknown_and_is_never_resent(world: World):
    step = meta("hang")
    async with world.connect() as client:
        started_pid = world.child_pid()
        results: list[Any] = []

        async def call() -> None:
            results.append(await client.call_tool("hang", {"subject": "lost"}, meta=step))

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            # The child has performed its effect and blocks; kill it before it answers.
            await wait_for(lambda: len(world.effects("hang")) == 1)
            os.kill(started_pid, signal.SIGKILL)
        outcome = results[0].structured_content
        assert outcome["status"] == "unknown", outcome
        assert outcome["next_action"] == "reconcile"
        assert outcome["safe_to_repeat"] is False
        assert results[0].is_error
        # A retry of the same operation is not resent to the restarted child.
        retry = await client.call_tool("hang", {"subject": "lost"}, meta=step)
        assert retry.structured_content["status"] == "unknown", retry.structured_content
        # The status tool reads the same record.
        status = await client.call_tool(STATUS, {"operation_key": outcome["operation_key"]})
        assert status.structured_content["status"] == "unknown", status.structured_content
        # The child was started again: a new operation reaches the new process.
        fresh = await client.call_tool("create_ticket", {"subject": "after"}, meta=meta("after"))
        assert fresh.structured_content["status"] == "applied"
        assert world.child_pid() != started_pid
    assert len(world.effects("hang")) == 1
    assert ("hang", "unknown") in world.records("hang")


async def test_a_child_that_hangs_past_the_timeout_ends_unknown_and_is_never_resent(world: World):
    step = meta("slow")
    async with world.connect("--call-timeout", "2s") as client:
        started = time.monotonic()
        first = await client.call_tool("hang", {"subject": "slow"}, meta=step)
        assert time.monotonic() - started < 30
        assert first.structured_content["status"] == "unknown", first.structured_content
        retry = await client.call_tool("hang", {"subject": "slow"}, meta=step)
        assert retry.structured_content["status"] == "unknown", retry.structured_content
    assert len(world.effects("hang")) == 1
    assert world.records("hang") == [("hang", "unknown")]


async def test_wrap_killed_mid_call_is_recovered_as_unknown_by_the_next_wrap(world: World):
    """SIGKILL of idemgate wrap itself while the child performs the effect: the record is left
    pending with the dispatch marker; the next wrap on the same store recovers it (after the
    lease, 10 s with a 2 s call timeout) as unknown, and never sends it again."""
    step = meta("crash")
    try:
        async with world.connect("--call-timeout", "2s") as client:
            async with anyio.create_task_group() as tg:
                async def call() -> None:
                    with contextlib.suppress(Exception):
                        await client.call_tool("hang", {"subject": "crash"}, meta=step)

                tg.start_soon(call)
                await wait_for(lambda: len(world.effects("hang")) == 1)
                os.kill(int(Path(f"{world.effects_file}.ppid").read_text()), signal.SIGKILL)
                os.kill(world.child_pid(), signal.SIGKILL)
    except Exception:  # the client sees its server vanish
        pass
    assert world.records("hang") == [("hang", "pending")]
    async with world.connect("--call-timeout", "2s") as client:
        deadline = time.monotonic() + 40
        while True:
            result = await client.call_tool("hang", {"subject": "crash"}, meta=step)
            status = result.structured_content["status"]
            if status != "in_flight" or time.monotonic() > deadline:
                break
            await anyio.sleep(1)
        assert status == "unknown", result.structured_content
    assert len(world.effects("hang")) == 1
    assert world.records("hang") == [("hang", "unknown")]


async def test_a_malformed_answer_mid_call_ends_unknown_and_is_never_resent(world: World):
    malformed = HERE / "malformed_child.py"
    params = StdioServerParameters(
        command=str(IDEMGATE),
        args=["wrap", "--store", f"sqlite://{world.store}", "--call-timeout", "3s", "--",
              PYTHON, str(malformed), "--effects", str(world.effects_file)],
        env={"RUST_LOG": "warn", "PATH": os.environ["PATH"]})
    step = meta("garbled")
    async with Client(params) as client:
        first = await client.call_tool("create_ticket", {"subject": "garbled"}, meta=step)
        assert first.structured_content["status"] == "unknown", first.structured_content
        retry = await client.call_tool("create_ticket", {"subject": "garbled"}, meta=step)
        assert retry.structured_content["status"] == "unknown", retry.structured_content
    assert world.effects("create") == ["create\tgarbled"]
    assert world.records() == [("create_ticket", "unknown")]


async def test_a_read_only_tool_passes_through_without_a_record(world: World):
    async with world.connect() as client:
        for _ in range(2):
            result = await client.call_tool("get_ticket", {"number": 7})
            assert not result.is_error
            assert result.content[0].text == "ticket T-7"
            assert result.structured_content["status"] == "applied"
            assert result.structured_content["operation_key"] is None
    assert world.reads() == 2
    assert world.records() == []


async def test_without_meta_the_session_window_names_the_operation(world: World):
    # wrap's default: hosts send no _meta, so a repeat inside the window is the same operation.
    async with world.connect() as client:
        listed = {t.name: t for t in (await client.list_tools()).tools}
        assert "repeat_of" in listed["create_ticket"].input_schema["properties"]
        assert "repeat_of" not in listed["get_ticket"].input_schema.get("properties", {})
        first = await client.call_tool("create_ticket", {"subject": "window"})
        again = await client.call_tool("create_ticket", {"subject": "window"})
        assert first.structured_content["status"] == "applied"
        assert again.structured_content["status"] == "replayed"
        key = first.structured_content["operation_key"]
        assert again.structured_content["operation_key"] == key
        assert any("session_window" in json.dumps(r.meta or {}) for r in (first, again))
        assert len(world.effects("create")) == 1
        # A deliberate repeat names the earlier operation: a new one, a second effect.
        repeat = await client.call_tool("create_ticket", {"subject": "window", "repeat_of": key})
        assert repeat.structured_content["status"] == "applied", repeat.structured_content
        assert repeat.structured_content["operation_key"] != key
    assert len(world.effects("create")) == 2


async def test_a_restarted_wrap_replays_the_same_call_without_meta(world: World):
    """A host that restarts `idemgate wrap` (a new process, a new child, one store) and re-sends
    a call whose answer it lost reaches the same operation: over stdio the derived key has no
    per-connection part. Effects are counted by the child on its own side."""
    async with world.connect() as client:
        first = await client.call_tool("create_ticket", {"subject": "restart"})
        assert first.structured_content["status"] == "applied", first.structured_content
    async with world.connect() as client:
        again = await client.call_tool("create_ticket", {"subject": "restart"})
        assert again.structured_content["status"] == "replayed", again.structured_content
        assert again.structured_content["operation_key"] == first.structured_content["operation_key"]
    assert len(world.effects("create")) == 1
    # Another actor on the same store is another principal: its call is its own operation.
    async with world.connect("--actor", "someone-else") as client:
        other = await client.call_tool("create_ticket", {"subject": "restart"})
        assert other.structured_content["status"] == "applied", other.structured_content
    assert len(world.effects("create")) == 2


async def test_a_key_based_call_without_identity_sends_nothing(world: World):
    # Under `--identity meta`, a key-based call without _meta is refused before any record.
    async with world.connect("--identity", "meta") as client:
        result = await client.call_tool("create_ticket", {"subject": "anonymous"})
        assert result.is_error
        assert result.structured_content["error"]["code"] == "missing_operation_key"
    assert world.effects() == []
    assert world.records() == []


async def test_a_childs_error_answer_is_recorded_and_replayed_not_resent(world: World):
    step = meta("fail")
    async with world.connect() as client:
        first = await client.call_tool("fail_ticket", {"subject": "boom"}, meta=step)
        second = await client.call_tool("fail_ticket", {"subject": "boom"}, meta=step)
    for result in (first, second):
        assert result.is_error
        assert "answered with an error" in result.content[-1].text
        assert result.structured_content["result"]["isError"] is True
    assert [first.structured_content["status"], second.structured_content["status"]] == ["applied", "replayed"]
    assert len(world.effects("fail")) == 1


async def test_a_destructive_tool_waits_for_approval_and_sends_nothing(world: World):
    async with world.connect() as client:
        result = await client.call_tool("purge_tickets", {}, meta=meta("purge"))
    outcome = result.structured_content
    assert outcome["status"] == "in_flight", outcome
    assert outcome["next_action"] == "ask_for_approval"
    assert world.effects("purge") == []
    assert world.records("purge_tickets") == [("purge_tickets", "awaiting_approval")]


async def test_resources_and_prompts_pass_through(world: World):
    async with world.connect() as client:
        await client.call_tool("create_ticket", {"subject": "one"}, meta=meta("one"))
        resources = await client.list_resources()
        assert [str(r.uri) for r in resources.resources] == ["tickets://count"]
        read = await client.read_resource("tickets://count")
        assert read.contents[0].text == "1"
        prompts = await client.list_prompts()
        assert [p.name for p in prompts.prompts] == ["triage"]
        prompt = await client.get_prompt("triage", {"subject": "printer"})
        assert "printer" in prompt.messages[0].content.text


async def test_an_over_long_argument_is_refused_naming_the_tool_and_child(world: World):
    big = "x" * (2 << 20)
    async with world.connect() as client:
        result = await client.call_tool("create_ticket", {"subject": big}, meta=meta("big"))
        error = result.structured_content["error"]
        assert error["code"] == "invalid_arguments", error
        assert "create_ticket" in error["message"] and "child.py" in error["message"]
        assert result.structured_content["safe_to_repeat"] is True
        # Nothing is lost: the next call works.
        ok = await client.call_tool("create_ticket", {"subject": "small"}, meta=meta("small"))
        assert ok.structured_content["status"] == "applied"
    assert world.effects("create") == ["create\tsmall"]
    assert [t for t, _ in world.records()] == ["create_ticket"]


def run_wrap(*command: str, extra: tuple[str, ...] = (), store: Path,
             start_timeout: str = "3s") -> subprocess.CompletedProcess:
    """A child that does start (a Python MCP server: several seconds on a loaded machine) gets
    `start_timeout="20s"`; 3 s keeps the cases that never answer short."""
    return subprocess.run([str(IDEMGATE), "wrap", "--store", f"sqlite://{store}",
                           "--start-timeout", start_timeout, *extra, "--", *command],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=40)


@pytest.mark.parametrize("case", ["exits", "not_mcp", "missing", "collides"])
def test_a_bad_child_is_a_clear_error_naming_it(world: World, case: str):
    command = {
        "exits": [PYTHON, "-c", "import sys; sys.exit(3)"],
        "not_mcp": [PYTHON, "-c", "import time; print('hello, I am not MCP', flush=True); time.sleep(20)"],
        "missing": [str(world.tmp / "no-such-server")],
        "collides": [PYTHON, str(CHILD), "--effects", str(world.effects_file), "--collide"],
    }[case]
    done = run_wrap(*command, store=world.store, start_timeout="20s" if case == "collides" else "3s")
    assert done.returncode == 2, done
    assert done.stdout == "", "nothing but the protocol on stdout"
    message = done.stderr
    assert command[0] in message or command[-1] in message, message
    expected = {
        "exits": r"not an MCP server, or exited at start",
        "not_mcp": r"not an MCP server|did not answer `initialize` within 3 s",
        "missing": r"could not be started",
        "collides": r"tool `idemgate_operation_status` of the child .*idemgate's own tool",
    }[case]
    assert re.search(expected, message), message
    assert world.records() == []


def test_a_contract_naming_no_tool_of_the_child_is_an_error(world: World):
    contract = world.tmp / "stray.yaml"
    contract.write_text((ROOT / "contracts" / "tickets.create.yaml").read_text())
    done = run_wrap(PYTHON, str(CHILD), "--effects", str(world.effects_file),
                    extra=("--contracts", str(contract)), store=world.store, start_timeout="20s")
    assert done.returncode == 2, done
    assert "names no tool of the child" in done.stderr and "create_ticket" in done.stderr, done.stderr


async def test_a_contract_file_overrides_the_defaults_per_tool(world: World):
    # A contract for `get_ticket` as key-based: the read now needs an operation and is recorded.
    contract = world.tmp / "get_ticket.yaml"
    contract.write_text(
        "name: get_ticket\nversion: \"7\"\npurpose: Reads a ticket.\neffect_class: key_based\n"
        "operation_key:\n  supplied_by: application\n  scope: [tenant, environment, workflow_id, step_id]\n"
        "input_schema:\n  type: object\n  properties:\n    number: {type: integer}\n  required: [number]\n"
        "request_fingerprint:\n  fields: [number]\n"
        "retention:\n  record_ttl: 1d\n  tombstone_ttl: 2d\n  max_retry_window: 1d\n")
    config = world.tmp / "wrap.toml"
    config.write_text(f'contracts = ["{contract.name}"]\nidentity = "meta"\n')
    params = StdioServerParameters(
        command=str(IDEMGATE),
        args=["wrap", "--config", str(config), "--", PYTHON, str(CHILD), "--effects", str(world.effects_file)],
        env={"RUST_LOG": "warn", "PATH": os.environ["PATH"]})
    step = meta("read")
    async with Client(params) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert tools["get_ticket"].meta["io.idemgate/contract"]["version"] == "7"
        for expect in ["applied", "replayed"]:
            result = await client.call_tool("get_ticket", {"number": 3}, meta=step)
            assert result.structured_content["status"] == expect
    assert world.reads() == 1
    # The store defaults to a file beside the configuration.
    db = world.tmp / "idemgate-wrap.sqlite"
    with contextlib.closing(sqlite3.connect(db)) as conn:
        assert conn.execute("SELECT tool FROM operations").fetchall() == [("get_ticket",)]


async def test_a_published_server_behind_wrap(world: World):
    """`mcp-server-time` from PyPI (installed by scripts/ci-wrap), offline."""
    pytest.importorskip("mcp_server_time")
    params = StdioServerParameters(
        command=str(IDEMGATE), args=["wrap", "--store", f"sqlite://{world.store}", "--", PYTHON, "-m", "mcp_server_time"],
        env={"RUST_LOG": "warn", "PATH": os.environ["PATH"]})
    async with Client(params) as client:
        names = [t.name for t in (await client.list_tools()).tools]
        assert names[0] == STATUS and "get_current_time" in names
        result = await client.call_tool("get_current_time", {"timezone": "UTC"})
        assert result.structured_content["status"] == "applied"
        assert json.loads(result.content[0].text)["timezone"] == "UTC"
    # Its tools say readOnlyHint: passed through, nothing recorded.
    assert world.records() == []


# ---------------------------------------------------------------------------------------------
# The configuration snippets of docs/mcp.md, launched exactly as written.

def snippet(marker: str) -> dict[str, Any]:
    """The JSON block after `<!-- snippet: NAME -->` in docs/mcp.md."""
    text = (ROOT / "docs" / "mcp.md").read_text()
    found = re.search(rf"<!-- snippet: {marker} -->\s*```json\n(.*?)```", text, re.S)
    assert found, f"docs/mcp.md has no snippet {marker}"
    return json.loads(found.group(1))


@pytest.mark.parametrize("marker,path", [("desktop", ("mcpServers", "tickets")),
                                         ("ide", ("servers", "tickets"))])
async def test_the_documented_snippets_launch_as_written(world: World, tmp_path: Path, marker: str, path):
    entry = snippet(marker)
    for part in path:
        entry = entry[part]
    command, args = entry["command"], entry["args"]
    assert command == "idemgate" and args[:1] == ["wrap"] and "--" in args
    # `idemgate` and `python` are found on PATH, as a host finds them; the command line is the
    # snippet's, unchanged. The snippet's server is the published mcp-server-time.
    pytest.importorskip("mcp_server_time")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "idemgate").symlink_to(IDEMGATE)
    home = tmp_path / "home"
    home.mkdir()
    # The test's virtual environment provides `python` (with mcp_server_time installed).
    env = {"PATH": f"{bin_dir}:{Path(PYTHON).parent}:{os.environ['PATH']}", "HOME": str(home),
           "RUST_LOG": "warn"}
    async with Client(StdioServerParameters(command=command, args=args, env=env)) as client:
        names = [t.name for t in (await client.list_tools()).tools]
        assert "get_current_time" in names
        result = await client.call_tool("get_current_time", {"timezone": "Europe/Paris"})
        assert result.structured_content["status"] == "applied"
    # Without --store or --config the store is one file per command line in the data dir.
    stores = list((home / ".local/share/idemgate/wrap").glob("python-*.sqlite"))
    assert len(stores) == 1, stores


# ---------------------------------------------------------------------------------------------
# What passes between the child and the host besides tool calls (the child with `--events`).

EVENTS = ("--events",)


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_childs_log_and_progress_during_a_call_reach_the_host(world: World, mode: str):
    logs: list[Any] = []
    progress: list[tuple[float, float | None, str | None]] = []

    async def on_log(params: Any) -> None:
        logs.append(params)

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, total, message))

    step = meta("slow")
    async with world.connect(child=EVENTS, mode=mode, logging_callback=on_log) as client:
        result = await client.call_tool("slow_ticket", {"subject": "printer"}, meta=step,
                                        progress_callback=on_progress)
        assert result.structured_content["status"] == "applied", result.structured_content
        await wait_for(lambda: len(progress) == 3 and len(logs) == 1, seconds=5)
        # A replay performs nothing, so nothing reports progress.
        again = await client.call_tool("slow_ticket", {"subject": "printer"}, meta=step,
                                       progress_callback=on_progress)
        assert again.structured_content["status"] == "replayed"
    assert progress == [(1, 3, "step 1 of 3"), (2, 3, "step 2 of 3"), (3, 3, "step 3 of 3")]
    assert "opening a ticket about printer" in str(logs[0].data)
    assert world.effects("slow") == ["slow\tprinter"]


async def test_identical_concurrent_calls_each_receive_only_their_own_progress(world: World):
    """Four calls with the same tool and arguments, four operations (distinct `_meta`), run at
    once at the child (it waits until all four arrived); the child tags each progress message
    with the operation key its request carried. Each host call hears three steps, every one
    naming the operation that call's answer names: progress goes by the request that owns it,
    not by tool and arguments."""
    calls = 4
    heard: dict[int, list[str]] = {n: [] for n in range(calls)}
    outcomes: dict[int, dict[str, Any]] = {}

    def listener(n: int):
        async def on_progress(_value: float, _total: float | None, message: str | None) -> None:
            heard[n].append(message or "")
        return on_progress

    async with world.connect(child=EVENTS, mode="legacy") as client:
        async def call(n: int) -> None:
            result = await client.call_tool("tagged_ticket", {"subject": "same", "calls": calls},
                                            meta=meta(f"tagged-{n}"), progress_callback=listener(n))
            outcomes[n] = result.structured_content

        async with anyio.create_task_group() as tg:
            for n in range(calls):
                tg.start_soon(call, n)
        await wait_for(lambda: all(len(h) == 3 for h in heard.values()), seconds=5)
    keys = {n: outcomes[n]["operation_key"] for n in range(calls)}
    assert all(o["status"] == "applied" for o in outcomes.values()), outcomes
    assert len(set(keys.values())) == calls, keys
    # The child saw all four at once, each under its own key.
    assert sorted(Path(f"{world.effects_file}.arrived").read_text().split()) == sorted(keys.values())
    for n in range(calls):
        assert sorted(heard[n]) == [f"{keys[n]} step {s}" for s in (1, 2, 3)], (n, heard)
    assert len(world.effects("tagged")) == calls


# `logging/setLevel` and `resources/subscribe` exist on the handshake revision only (the SDK
# warns that 2026-07-28 removed them); the hosts of today speak it.
@pytest.mark.filterwarnings("ignore:.*2026-07-28")
async def test_a_child_started_again_gets_the_hosts_log_level_and_subscriptions_first(world: World):
    """The host sets the log level twice and subscribes to two resources, then unsubscribes one;
    the child is killed (SIGKILL). The process started again is told the last level and the one
    live subscription, before the request that started it — as its own record shows."""
    received = Path(f"{world.effects_file}.received")

    def told(pid: int) -> list[str]:
        lines = received.read_text().splitlines() if received.exists() else []
        return [l.split("\t", 1)[1] for l in lines if l.startswith(f"{pid}\t")]

    async with world.connect(child=EVENTS, mode="legacy") as client:
        first = world.child_pid()
        await client.set_logging_level("info")
        await client.set_logging_level("debug")
        await client.subscribe_resource("tickets://count")
        await client.subscribe_resource("tickets://slow")
        await client.unsubscribe_resource("tickets://slow")
        assert told(first) == ["logging/setLevel\tinfo", "logging/setLevel\tdebug",
                               "resources/subscribe\ttickets://count",
                               "resources/subscribe\ttickets://slow",
                               "resources/unsubscribe\ttickets://slow"]
        os.kill(first, signal.SIGKILL)
        # wrap notices the end on the next request that needs the child and starts it again; a
        # request sent into the dying connection gets an error, the next one the new process.
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(Exception):
                read = await client.read_resource("tickets://count")
                break
            assert time.monotonic() < deadline, "the child was not started again"
            await anyio.sleep(0.2)
        assert read.contents[0].text == "0"
        second = world.child_pid()
        assert second != first
        assert told(second) == ["logging/setLevel\tdebug", "resources/subscribe\ttickets://count",
                                "resources/read\ttickets://count"]
        # What the host sets now reaches the new process as before.
        await client.unsubscribe_resource("tickets://count")
        assert told(second)[-1] == "resources/unsubscribe\ttickets://count"


def sampled(answer: str, asked: list[str]):
    async def sampling(_ctx: Any, params: Any) -> Any:
        from mcp_types import CreateMessageResult, TextContent
        asked.append(params.messages[0].content.text)
        return CreateMessageResult(role="assistant", content=TextContent(type="text", text=answer),
                                   model="host-model")
    return sampling


def elicited(priority: str, asked: list[str]):
    async def elicitation(_ctx: Any, params: Any) -> Any:
        from mcp_types import ElicitResult
        asked.append(params.message)
        return ElicitResult(action="accept", content={"priority": priority})
    return elicitation


@pytest.mark.parametrize("kind", ["sampling", "elicitation"])
async def test_a_childs_request_is_answered_by_the_host_and_the_effect_happens_once(world: World, kind: str):
    """The child asks the host's model (sampling) or user (elicitation) in the middle of a
    call; the answer decides the effect. The host is asked once, for the one effect; the
    replay asks nobody."""
    asked: list[str] = []
    tool, callbacks, question, answered, effect = {
        "sampling": ("summarize_ticket", {"sampling_callback": sampled("paper jam", asked)},
                     "Summarize: printer", "opened: paper jam", "summary\tpaper jam"),
        "elicitation": ("confirm_ticket", {"elicitation_callback": elicited("high", asked)},
                        "Priority of printer?", "opened at high: printer", "confirmed\tprinter:high"),
    }[kind]
    step = meta(kind)
    async with world.connect(child=EVENTS, mode="legacy", **callbacks) as client:
        statuses = []
        for _ in range(2):
            result = await client.call_tool(tool, {"subject": "printer"}, meta=step)
            statuses.append(result.structured_content["status"])
            assert answered in result.content[0].text, result.content
        assert statuses == ["applied", "replayed"]
    assert asked == [question]
    assert world.effects() == [effect]


async def test_a_request_the_child_cancels_is_cancelled_at_the_host(world: World):
    """The child asks the host's model and gives up after a second (its SDK sends
    `notifications/cancelled`); the host's sampling callback, still working, is cancelled too,
    instead of running on for nobody."""
    cancelled: list[str] = []

    async def slow_sampling(_ctx: Any, params: Any) -> Any:
        try:
            await anyio.sleep(20)
        except anyio.get_cancelled_exc_class():
            cancelled.append(params.messages[0].content.text)
            raise
        raise AssertionError("the host's sampling ran to its end")

    async with world.connect(child=EVENTS, mode="legacy", sampling_callback=slow_sampling) as client:
        result = await client.call_tool("impatient_ticket", {"subject": "printer"}, meta=meta("impatient"))
        assert "gave up waiting for a summary of printer" in result.content[0].text, result.content
        assert result.structured_content["status"] == "applied", result.structured_content
        await wait_for(lambda: cancelled == ["Summarize: printer"], seconds=5)
    assert world.effects() == []


async def test_a_sampling_request_the_host_cannot_answer_is_an_error_for_the_child(world: World):
    # No sampling callback: the host declares no `sampling`, so the child's request gets a
    # JSON-RPC error naming the capability, and the child's tool fails before its effect.
    async with world.connect(child=EVENTS, mode="legacy") as client:
        result = await client.call_tool("summarize_ticket", {"subject": "x"}, meta=meta("nosampling"))
    assert result.is_error
    assert "sampling" in result.content[0].text, result.content
    assert world.effects("summary") == []


async def test_a_childs_roots_request_is_answered_by_the_host(world: World):
    from mcp_types import ListRootsResult, Root

    async def roots(_ctx: Any) -> Any:
        return ListRootsResult(roots=[Root(uri="file:///work/tickets", name="tickets")])

    async with world.connect(child=EVENTS, mode="legacy", list_roots_callback=roots) as client:
        result = await client.call_tool("ticket_roots", {})
    assert not result.is_error, result.content
    assert result.content[0].text == "file:///work/tickets"


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_tool_the_child_adds_is_served_through_the_executor_and_a_removed_one_refused(
        world: World, mode: str):
    from mcp_types import ToolListChangedNotification
    changes: list[Any] = []

    async def on_message(message: Any) -> None:
        if isinstance(message, ToolListChangedNotification):
            changes.append(message)

    stderr = world.tmp / "wrap.stderr"
    async with world.connect(child=EVENTS, mode=mode, message_handler=on_message, stderr=stderr) as client:
        assert "late_ticket" not in [t.name for t in (await client.list_tools()).tools]
        await client.call_tool("add_tool", {}, meta=meta("add"))
        await wait_for(lambda: len(changes) == 1, seconds=10)
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert "late_ticket" in tools
        assert tools["late_ticket"].meta["io.idemgate/contract"]["effect_class"] == "key_based"
        assert "repeat_of" in tools["late_ticket"].input_schema["properties"]
        step = meta("late")
        statuses = []
        for _ in range(2):
            result = await client.call_tool("late_ticket", {"subject": "late"}, meta=step)
            statuses.append(result.structured_content["status"])
        assert statuses == ["applied", "replayed"]
        # The same tool added again: listed once, warned about once.
        await client.call_tool("add_tool", {}, meta=meta("add-again"))
        await wait_for(lambda: len(changes) == 2, seconds=10)
        assert [t.name for t in (await client.list_tools()).tools].count("late_ticket") == 1
        # A tool the child drops is refused by name, and nothing reaches the child.
        await client.call_tool("drop_tool", {"name": "create_ticket"}, meta=meta("drop"))
        await wait_for(lambda: len(changes) == 3, seconds=10)
        assert "create_ticket" not in [t.name for t in (await client.list_tools()).tools]
        gone = await client.call_tool("create_ticket", {"subject": "gone"}, meta=meta("gone"))
        assert gone.is_error
        error = gone.structured_content["error"]
        assert error["code"] == "unknown_tool", error
        assert "create_ticket" in error["message"] and "no longer offered" in error["message"], error
        # A name that now collides with idemgate's own tool is left out; the rest stays served.
        await client.call_tool("add_tool", {"collide": True}, meta=meta("collide"))
        await wait_for(lambda: len(changes) == 4, seconds=10)
        names = [t.name for t in (await client.list_tools()).tools]
        assert names.count(STATUS) == 1 and "late_ticket" in names
        # idemgate's own status tool still answers, reading the late tool's record.
        status = await client.call_tool(STATUS, {"operation_key": result.structured_content["operation_key"]})
        assert status.structured_content["status"] == "replayed", status.structured_content
        assert status.structured_content["effect_reference"] == "late_ticket#1"
    assert world.effects("late") == ["late\tlate"]
    assert world.effects("create") == []
    assert world.records("late_ticket") == [("late_ticket", "applied")]
    err = stderr.read_text()
    assert err.count("tool `late_ticket` of") == 1, err
    assert re.search(r"tool `idemgate_operation_status` of the child .*idemgate's own tool", err), err


async def test_a_cancelled_call_stops_the_wait_and_its_record_still_settles(world: World):
    step = meta("later")
    arguments = {"subject": "cancelled", "seconds": 1.5}
    async with world.connect(child=EVENTS) as client:
        with anyio.move_on_after(0.5) as scope:
            await client.call_tool("later_ticket", arguments, meta=step)
        assert scope.cancelled_caught
        # The host stopped waiting; the child's call was not cancelled: one effect, and the
        # record settles to the child's answer, which a repeat replays.
        await wait_for(lambda: world.records("later_ticket") == [("later_ticket", "applied")])
        again = await client.call_tool("later_ticket", arguments, meta=step)
        assert again.structured_content["status"] == "replayed", again.structured_content
        assert "opened later: cancelled" in again.content[0].text
    assert world.effects("later") == ["later\tcancelled"]


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_ping_completion_resources_prompts_and_cancellation_pass_through(world: World, mode: str):
    from mcp_types import PromptReference
    async with world.connect(child=EVENTS, mode=mode) as client:
        if mode == "legacy":
            # `ping` exists on the handshake revision only; each hop answers its own.
            await client.send_ping()
        read = await client.read_resource("tickets://count")
        assert read.contents[0].text == "0"
        prompt = await client.get_prompt("triage", {"subject": "scanner"})
        assert "scanner" in prompt.messages[0].content.text
        completed = await client.complete(PromptReference(type="ref/prompt", name="triage"),
                                          {"name": "subject", "value": "pr"})
        assert completed.completion.values == ["printer", "projector"]
        # A cancelled read is cancelled at the child too.
        with anyio.move_on_after(1):
            await client.read_resource("tickets://slow")
        await wait_for(lambda: Path(f"{world.effects_file}.cancelled").exists(), seconds=10)
        # The connection serves on.
        assert (await client.read_resource("tickets://count")).contents[0].text == "0"


async def test_a_host_on_the_stateless_revision_cannot_be_asked_and_the_child_gets_an_error(world: World):
    # A host speaking 2026-07-28 (the SDK's default, `mode="auto"`) takes no server-to-client
    # request; wrap does not turn one into an `input_required` result (docs/mcp.md), so the
    # child's sampling request fails, its tool answers an error, and nothing happened.
    asked: list[str] = []
    async with world.connect(child=EVENTS, sampling_callback=sampled("unused", asked)) as client:
        assert client.protocol_version == "2026-07-28"
        result = await client.call_tool("summarize_ticket", {"subject": "x"}, meta=meta("modern"))
    # The child answered with a JSON-RPC error rather than a tool result: for a black box
    # that proves nothing, so the operation is `unknown`, and the reason names the capability.
    assert result.is_error
    assert result.structured_content["status"] == "unknown", result.structured_content
    assert "`sampling/createMessage` cannot be passed to it" in json.dumps(result.structured_content)
    assert asked == []
    assert world.effects("summary") == []


# ---------------------------------------------------------------------------------------------
# Children whose tools take an idempotency key (`child.py --pay`), and how tools are treated.

def ledger_keys(world: World) -> list[str]:
    ledger = Path(f"{world.effects_file}.keys")
    return [l.split("\t", 1)[0] for l in ledger.read_text().splitlines()] if ledger.exists() else []


@pytest.mark.parametrize("tool,argument", [("pay", "idempotency_key"), ("charge", "idempotencyKey")])
async def test_a_key_argument_is_filled_hidden_and_a_lost_answer_is_resent_under_it(
        world: World, tool: str, argument: str):
    async with world.connect(child=("--pay",)) as client:
        listed = {t.name: t for t in (await client.list_tools()).tools}[tool]
        # Hidden from the model: neither listed nor required; said in the description.
        assert argument not in listed.input_schema.get("properties", {}), listed.input_schema
        assert argument not in listed.input_schema.get("required", []), listed.input_schema
        assert f"idemgate fills `{argument}`" in listed.description, listed.description
        contract = listed.meta["io.idemgate/contract"]
        assert contract["effect_class"] == "key_based"
        assert contract["operation_key_argument"] == argument
        assert contract["deduplicates_by_key"] is True
        # The child commits the effect, records the key and is SIGKILLed before it answers.
        Path(f"{world.effects_file}.lose").write_text("")
        started_pid = world.child_pid()
        step = meta("pay")
        first = await client.call_tool(tool, {"amount": 500}, meta=step)
        outcome = first.structured_content
        # Resent under the same key to the restarted child, which recognises it.
        assert outcome["status"] in ("applied", "replayed"), outcome
        assert not first.is_error
        assert f"{tool} P-1 of 500 done" in first.content[0].text
        assert world.child_pid() != started_pid
        assert not Path(f"{world.effects_file}.lose").exists()
        # A repeat of the operation replays; a value the model sends for the argument anyway
        # changes nothing.
        again = await client.call_tool(tool, {"amount": 500, argument: "fresh-" + uuid.uuid4().hex},
                                       meta=step)
        assert again.structured_content["status"] == "replayed", again.structured_content
        assert again.structured_content["operation_key"] == outcome["operation_key"]
    assert len(world.effects(tool)) == 1
    # The child saw one key, the operation's.
    assert ledger_keys(world) == [outcome["operation_key"]]
    assert world.records(tool) == [(tool, "applied")]


async def test_a_model_that_makes_a_new_key_per_call_still_gets_one_effect(world: World):
    # No _meta (the hosts people use): the session window names the operation from the model's
    # arguments, and the key the server told it to make fresh every time is not among them.
    async with world.connect(child=("--pay",)) as client:
        statuses = []
        for _ in range(3):
            result = await client.call_tool("pay", {"amount": 70, "idempotency_key": uuid.uuid4().hex})
            statuses.append(result.structured_content["status"])
        assert statuses == ["applied", "replayed", "replayed"], statuses
    assert len(world.effects("pay")) == 1
    assert len(ledger_keys(world)) == 1


async def test_an_unannotated_tool_says_it_is_treated_as_key_based_and_reads_mark_reads(world: World):
    async with world.connect(child=("--pay",)) as client:
        listed = {t.name: t for t in (await client.list_tools()).tools}
        text = listed["lookup_payment"].description
        assert text.startswith("Reads a payment.")
        assert "treats this tool as one that changes something (key-based)" in text, text
        assert "does not mark it read-only" in text and "replays the stored answer" in text, text
        # Annotated tools are not told so.
        assert "treats this tool" not in listed["get_ticket"].description
        # As described: the second read inside the window is the first one's answer.
        for _ in range(2):
            await client.call_tool("lookup_payment", {"number": 3})
    assert world.reads() == 1
    # Marked a read: passed straight through every time, no record.
    async with world.connect("--reads", "lookup_payment", child=("--pay",)) as client:
        listed = {t.name: t for t in (await client.list_tools()).tools}
        assert listed["lookup_payment"].meta["io.idemgate/contract"]["effect_class"] == "read"
        assert "treats this tool" not in listed["lookup_payment"].description
        for _ in range(2):
            result = await client.call_tool("lookup_payment", {"number": 3})
            assert result.structured_content["operation_key"] is None
    assert world.reads() == 3
    assert world.records("lookup_payment") == [("lookup_payment", "applied")]


def test_wrap_list_prints_how_each_tool_is_treated_and_serves_nothing(world: World):
    command = (PYTHON, str(CHILD), "--effects", str(world.effects_file), "--pay")
    done = run_wrap(*command, extra=("--list", "--reads", "get_ticket,lookup_payment"),
                    store=world.store, start_timeout="20s")
    assert done.returncode == 0, done
    rows = {line.split()[0]: line for line in done.stdout.splitlines()[1:]}
    assert done.stdout.splitlines()[0].endswith(": 8 tools"), done.stdout
    assert "key_based: one effect per operation, a lost answer ends unknown (no readOnlyHint" \
        in rows["create_ticket"], done.stdout
    assert "read (--reads)" in rows["lookup_payment"], done.stdout
    assert "read (--reads)" in rows["get_ticket"], done.stdout
    assert "irreversible" in rows["purge_tickets"] and "destructiveHint" in rows["purge_tickets"]
    assert "key_based and deduplicating: `idempotency_key` is filled with the operation key" in rows["pay"]
    assert "`idempotencyKey` is filled" in rows["charge"]
    assert not world.store.exists(), "--list opens no store"
    assert world.effects() == []
    # A tool --reads names that the child does not list is an error, naming what it lists.
    done = run_wrap(*command, extra=("--list", "--reads", "lookup"), store=world.store,
                    start_timeout="20s")
    assert done.returncode == 2, done
    assert "--reads names `lookup`" in done.stderr and "lookup_payment" in done.stderr, done.stderr


async def test_a_hyphenated_idempotency_key_header_argument_is_filled_and_a_garbled_answer_resent(
        world: World):
    keyed = HERE / "keyed_child.py"
    params = StdioServerParameters(
        command=str(IDEMGATE),
        args=["wrap", "--store", f"sqlite://{world.store}", "--call-timeout", "5s", "--",
              PYTHON, str(keyed), "--effects", str(world.effects_file)],
        env={"RUST_LOG": "warn", "PATH": os.environ["PATH"]})
    Path(f"{world.effects_file}.garble").write_text("")
    step = meta("refund")
    async with Client(params) as client:
        tool = {t.name: t for t in (await client.list_tools()).tools}["refund"]
        assert "Idempotency-Key" not in tool.input_schema["properties"], tool.input_schema
        assert tool.input_schema["required"] == ["payment_id", "amount"], tool.input_schema
        first = await client.call_tool("refund", {"payment_id": "pay_9", "amount": 300}, meta=step)
        # The child committed, then answered garbage: resent under the same key, it answers
        # what it did.
        assert first.structured_content["status"] in ("applied", "replayed"), first.structured_content
        assert first.content[0].text == "refund R-1 of 300 on pay_9"
        again = await client.call_tool("refund", {"payment_id": "pay_9", "amount": 300}, meta=step)
        assert again.structured_content["status"] == "replayed", again.structured_content
    assert len(world.effects("refund")) == 1
    assert ledger_keys(world) == [first.structured_content["operation_key"]]
    assert not Path(f"{world.effects_file}.garble").exists()
