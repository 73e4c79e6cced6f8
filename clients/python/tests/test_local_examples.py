"""The in-process examples in examples/ run as written, and what they print is what happened:
each asserts the effects it counted in its own ledger (one), and this test reads the lines."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def _run(name: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name)], capture_output=True, text=True, timeout=90
    )
    assert done.returncode == 0, f"{name} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout.splitlines()


def test_the_langgraph_example() -> None:
    assert _run("local_langgraph.py") == [
        "first run: applied",
        "run again from the checkpoint: replayed",
        "refunds in the ledger: 1",
    ]


def test_the_openai_agents_example() -> None:
    assert _run("local_openai_agents.py") == [
        "  the tool answered call_1: applied",
        "  the tool answered call_2: replayed",
        "agent: Recorded.",
        "tickets created: 1",
    ]


def test_the_mcp_server_example() -> None:
    assert _run("local_mcp_server.py") == [
        "session 1: applied T-1",
        "session 1: replayed T-1",
        "session 2: replayed T-1",
        "session 2: replayed T-1",
        "tickets in the ledger: 1",
    ]
