"""LangGraph with a function guarded in process: a real SIGKILL of the graph's process between
the effect and the checkpoint after it, then the thread resumed from LangGraph's SQLite
checkpointer in a new process. Effects are counted in the ledger the function writes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

import langgraph_local_child as child_module
from local_support import FileLedger

import idemgate
from idemgate.langchain import as_langchain_tool

CHILD = Path(__file__).with_name("langgraph_local_child.py")
CHILD_SECONDS = 60


def _child(url: str, ledger: Path, db: Path, thread: str, out: Path, mode: str, log: IO[bytes]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, str(CHILD), url, str(ledger), str(db), thread, str(out), mode],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=log,
    )


def _kill_after(child: subprocess.Popen[bytes], marker: bytes, log: Path) -> bytes:
    """Waits for the child to print `marker` (bounded), then SIGKILLs it."""
    assert child.stdout is not None
    deadline = time.monotonic() + CHILD_SECONDS
    line = b""
    try:
        while time.monotonic() < deadline:
            line = child.stdout.readline()
            if line.startswith(marker) or not line:
                break
        assert line.startswith(marker), f"the child never printed {marker!r}; its log:\n{log.read_text()}"
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=10)
    assert child.returncode == -signal.SIGKILL
    return line


def _crash_and_resume(tmp_path: Path, thread: str, mode: str, marker: bytes) -> tuple[dict[str, object], FileLedger, str]:
    url = f"sqlite://{tmp_path / 'ops.sqlite'}"
    ledger_path, db = tmp_path / "ledger.txt", tmp_path / "checkpoints.sqlite"
    first_out, resumed_out, log_path = tmp_path / "first.json", tmp_path / "resumed.json", tmp_path / "child.log"
    ledger = FileLedger(ledger_path)
    with open(log_path, "ab") as log:
        _kill_after(_child(url, ledger_path, db, thread, first_out, mode, log), marker, log_path)
        assert not first_out.exists()
        key = f"{child_module.TENANT}:{child_module.ENVIRONMENT}:{thread}:record_issue"
        assert ledger.counts() == {key: 1}

        # LangGraph's last checkpoint of the thread is the one after `prepare`.
        graph = child_module.build(None, child_module.saver(str(db)), False)
        snapshot = graph.get_state({"configurable": {"thread_id": thread}})
        assert snapshot.next == ("record_issue",)
        assert snapshot.values["trail"] == ["prepare"]

        resumed = _child(url, ledger_path, db, thread, resumed_out, "resume", log)
        assert resumed.wait(timeout=CHILD_SECONDS) == 0, log_path.read_text()
    result = json.loads(resumed_out.read_text())
    assert result["trail"] == ["prepare", "record_issue", "finish"]
    return result, ledger, key


def test_killed_after_the_record_resumes_to_a_replay_and_one_effect(tmp_path: Path, run_id: str) -> None:
    result, ledger, key = _crash_and_resume(tmp_path, run_id, "start-hold-after-record", b"RECORDED")
    # The record was written before the kill: the resumed node's call is answered from it.
    assert result["outcome"] == "replayed"
    assert result["ticket"] == f"ticket:{key}"
    assert ledger.counts() == {key: 1}
    with idemgate.Local(f"sqlite://{tmp_path / 'ops.sqlite'}", tenant="acme", environment="langgraph", recover=False) as local:
        assert local.operation(key).record_status == "applied"


def test_killed_inside_the_effect_resumes_through_the_lookup_and_one_effect(tmp_path: Path, run_id: str) -> None:
    result, ledger, key = _crash_and_resume(tmp_path, run_id, "start-hold-in-effect", b"SENT")
    # The kill left a claim and no record: the resumed call waits out the dead process's lease,
    # and the engine settles the operation through the function's lookup, never running it again.
    assert result["outcome"] in ("applied", "replayed"), result
    assert result["ticket"] == f"ticket:{key}"
    assert ledger.counts() == {key: 1}


def test_a_tool_node_replays_its_checkpointed_calls_in_process(tmp_path: Path, run_id: str) -> None:
    from langchain_core.messages import AIMessage, ToolMessage
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode

    effects: list[str] = []
    with idemgate.Local(f"sqlite://{tmp_path / 'ops.sqlite'}", tenant="acme", environment="test") as local:

        @local.tool("notes.add", fingerprint=["text"])
        def add_note(text: str, *, idempotency_key: str) -> idemgate.Receipt:
            """Adds a note to the customer's file."""
            effects.append(idempotency_key)
            return idemgate.Receipt(f"note_{len(effects)}", {"text": text})

        tool = as_langchain_tool(add_note)
        assert tool.name == "notes_add"
        assert tool.description == "Adds a note to the customer's file."
        calls = [
            {"name": "notes_add", "args": {"text": "first"}, "id": "call_a"},
            {"name": "notes_add", "args": {"text": "second"}, "id": "call_b"},
        ]

        def model(state: MessagesState) -> dict[str, object]:
            return {"messages": [AIMessage(content="", tool_calls=calls)]}

        graph = StateGraph(MessagesState)
        graph.add_node("model", model)
        graph.add_node("tools", ToolNode([tool]))
        graph.add_edge(START, "model")
        graph.add_edge("model", "tools")
        graph.add_edge("tools", END)
        compiled = graph.compile(checkpointer=InMemorySaver())
        config = {"configurable": {"thread_id": run_id}}
        result = compiled.invoke({"messages": []}, config)
        answers = [m for m in result["messages"] if isinstance(m, ToolMessage)]
        assert [json.loads(str(m.content))["outcome"] for m in answers] == ["applied", "applied"]
        assert [m.artifact["operation_key"] for m in answers] == [
            f"acme:test:{run_id}:tools.call_a",
            f"acme:test:{run_id}:tools.call_b",
        ]
        assert len(effects) == 2

        # Replaying from the checkpoint before the tools ran: the same calls, from the records.
        before_tools = next(s for s in compiled.get_state_history(config) if s.next == ("tools",))
        again = compiled.invoke(None, before_tools.config)
        replays = [m for m in again["messages"] if isinstance(m, ToolMessage)][-2:]
        assert [json.loads(str(m.content))["outcome"] for m in replays] == ["replayed", "replayed"]
        assert sorted(effects) == [f"acme:test:{run_id}:tools.call_a", f"acme:test:{run_id}:tools.call_b"]
