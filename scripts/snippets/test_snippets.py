"""The README's and docs' snippets, run as written against a fresh `idemgate serve`.

Each snippet is marked in its Markdown file with an HTML comment, `<!-- snippet: NAME -->`, on
the line before its code block. The only edits a test makes are the ones a reader makes: the
tokens `serve` printed in place of `idg_…`, and this gateway's address in place of
127.0.0.1:8080 (the test's gateway listens on a free port). Outcomes are read from what the
snippets print and from the gateway's own records, so a snippet that stops working, or stops
saying what the page says it does, fails here.

Needs: IDEMGATE_BIN (the binary; its directory goes first on PATH so host snippets that run
`idemgate` find it), a Python with the `idemgate` package importable (its extension built) and
the `mcp` SDK. `scripts/ci-snippets` provides them.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

ROOT = Path(__file__).resolve().parents[2]
IDEMGATE = Path(os.environ["IDEMGATE_BIN"]).resolve()
PLACEHOLDER = "idg_…"

pytestmark = pytest.mark.timeout(120)


def snippet(page: str, name: str) -> str:
    """The code block after `<!-- snippet: name -->` in `page`."""
    text = (ROOT / page).read_text()
    marker = f"<!-- snippet: {name} -->"
    assert marker in text, f"{page} has no snippet {name!r}"
    after = text.split(marker, 1)[1]
    match = re.match(r"\s*```[a-z]*\n(.*?)\n```", after, re.S)
    assert match, f"{page}: the snippet {name!r} is not followed by a code block"
    return match.group(1)


class Gateway:
    def __init__(self, directory: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        # From a directory without contracts/: the built-in examples, as a newcomer's first run.
        self.log = (directory / "serve.log").open("w")
        self.process = subprocess.Popen(
            [str(IDEMGATE), "serve", "--listen", self.address],
            cwd=directory, stdout=subprocess.PIPE, stderr=self.log, text=True)
        self.tokens: dict[str, str] = {}
        banner: list[str] = []
        deadline = time.monotonic() + 60
        assert self.process.stdout is not None
        while len(self.tokens) < 2 and time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if not line:
                break
            banner.append(line)
            found = re.search(r"development (agent|operator) token for tenant dev: (idg_\w+)", line)
            if found:
                self.tokens[found.group(1)] = found.group(2)
        self.banner = "".join(banner)
        assert len(self.tokens) == 2, f"serve printed no tokens:\n{self.banner}"
        assert f"http://{self.address}/console" in self.banner, self.banner

    def edit(self, code: str, token: str = "agent") -> str:
        """What a reader does: this gateway's address and a printed token."""
        return code.replace("127.0.0.1:8080", self.address).replace(PLACEHOLDER, self.tokens[token])

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)
        self.log.close()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    gate = Gateway(tmp_path_factory.mktemp("serve"))
    yield gate
    gate.stop()


def run_python(code: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
                          timeout=90, env={**os.environ, **(env or {})})
    assert done.returncode == 0, f"the snippet failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_the_readme_curl_walkthrough(gateway: Gateway, tmp_path: Path) -> None:
    code = snippet("README.md", "curl")
    first = code.splitlines()[0]
    assert first.startswith("G=http://127.0.0.1:8080; AGENT=idg_…; OPERATOR=idg_…"), first
    line = (f"G=http://{gateway.address}; AGENT={gateway.tokens['agent']}; "
            f"OPERATOR={gateway.tokens['operator']}")
    code = "\n".join([line, *code.splitlines()[1:]])
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", code], cwd=tmp_path,
                          capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    # curl prints no newline after a body: a status line may follow one on the same line.
    statuses = [int(s) for s in re.findall(r"HTTP/1\.1 (\d{3})", out)]
    # applied, replayed, rejected (a changed request), unknown (a timeout), reconciled, and the
    # operation read by its caller (the plain GETs print bodies only).
    assert statuses == [200, 200, 422, 202, 200], out
    outcomes = re.findall(r"^idempotency-outcome: (\w+)", out, re.M | re.I)
    # The reconciliation answers what a caller gets from then on: the operator's reference,
    # replayed.
    assert outcomes == ["applied", "replayed", "rejected", "unknown", "replayed"], out
    assert re.search(r"^idempotent-replayed: true", out, re.M | re.I), out
    decoder = json.JSONDecoder()
    listed, _ = decoder.raw_decode(out[out.index('{"operations":'):])
    keys = [o["operation_key"] for o in listed["operations"]]
    assert keys == ["dev:development:sandbox-timeout-1:close"], listed
    final, _ = decoder.raw_decode(out[out.rindex('{"operation_key":'):])
    assert final["record_status"] == "applied", final
    assert final["receipt"]["reference"] == "ticket_1@v2", final


def test_the_readme_python_client_runs_twice_as_one_operation(gateway: Gateway,
                                                               tmp_path: Path) -> None:
    code = gateway.edit(snippet("README.md", "python-client"))
    first = run_python(code, tmp_path)
    again = run_python(code, tmp_path)
    assert first.startswith("applied dev:development:run_py_1:record_issue"), first
    assert again.startswith("replayed dev:development:run_py_1:record_issue"), again
    # The same ticket both times.
    assert first.splitlines()[1] == again.splitlines()[1] and first.splitlines()[1].startswith("ticket ")


def test_the_readme_in_process_snippet_runs_once_then_replays(tmp_path: Path) -> None:
    code = snippet("README.md", "python-local")
    first = run_python(code, tmp_path)
    again = run_python(code, tmp_path)
    assert first.splitlines() == [
        "refunding pi_42 once, under acme:development:run_827:refund", "applied"], first
    # The function is not called again: its line is printed once in all.
    assert again.splitlines() == ["replayed"], again


def mcp_call(code_env: dict[str, str], server_args: list[str], tool: str,
             arguments: dict[str, object], cwd: Path) -> dict[str, object]:
    """Launches a stdio server as a host would and makes one call; its outcome."""
    script = f"""
import asyncio, json
from mcp import Client
from mcp.client.stdio import StdioServerParameters

async def main():
    server = StdioServerParameters(command="idemgate", args={server_args!r})
    async with Client(server) as client:
        result = await client.call_tool({tool!r}, {arguments!r})
        print(json.dumps(result.structured_content))

asyncio.run(main())
"""
    return json.loads(run_python(script, cwd, code_env).strip().splitlines()[-1])


def test_the_readme_mcp_host_configuration(gateway: Gateway, tmp_path: Path) -> None:
    hosts = json.loads(gateway.edit(snippet("README.md", "mcp-hosts"), token="agent")
                       .replace("<agent token>", gateway.tokens["agent"]))["mcpServers"]
    # The local server, started twice as a host restarts it, from a directory of its own: the
    # same call is one operation (session_window over stdio), its store in the data directory.
    local = hosts["idemgate-local"]
    assert local["command"] == "idemgate"
    env = {"PATH": f"{IDEMGATE.parent}:{os.environ['PATH']}", "HOME": str(tmp_path)}
    ticket = {"subject": "Desk lamp", "body": "Flickers."}
    first = mcp_call(env, local["args"], "tickets_create", ticket, tmp_path)
    again = mcp_call(env, local["args"], "tickets_create", ticket, tmp_path)
    assert (first["status"], again["status"]) == ("applied", "replayed"), (first, again)
    assert first["operation_key"] == again["operation_key"]
    # The HTTP entry names the gateway's /mcp with the agent's token.
    remote = hosts["idemgate-http"]
    assert remote["url"] == f"http://{gateway.address}/mcp"
    assert remote["headers"]["Authorization"] == f"Bearer {gateway.tokens['agent']}"


@pytest.mark.parametrize("page,name", [("README.md", "mcp-python"), ("docs/mcp.md", "mcp-http")])
def test_the_mcp_python_snippets_over_http(gateway: Gateway, tmp_path: Path, page: str,
                                           name: str) -> None:
    code = gateway.edit(snippet(page, name))
    first = run_python(code, tmp_path)
    again = run_python(code, tmp_path)
    assert first.startswith("applied "), first
    assert again.startswith("replayed "), again


def test_the_mcp_stdio_snippet(tmp_path: Path) -> None:
    env = {"PATH": f"{IDEMGATE.parent}:{os.environ['PATH']}", "HOME": str(tmp_path)}
    code = snippet("docs/mcp.md", "mcp-stdio")
    first = run_python(code, tmp_path, env)
    again = run_python(code, tmp_path, env)
    assert first.startswith("applied "), first
    assert again.startswith("replayed "), again
