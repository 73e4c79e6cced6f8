"""LangGraph: identity from the graph's run state, and a real process kill between the effect
and the checkpoint after it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode

import langgraph_child
from fake_sor import FakeSystemOfRecord, Fault
from harness import AGENT_TOKEN, Gateway, operation_key

import idemgate
from idemgate.langchain import as_langchain_tool

CHILD = Path(__file__).with_name("langgraph_child.py")
CHILD_SECONDS = 120


def _child(gateway: Gateway, db: Path, thread: str, out: Path, mode: str, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, str(CHILD), gateway.url, AGENT_TOKEN, str(db), thread, str(out), mode],
        stdin=subprocess.DEVNULL,
        stdout=open(log, "ab"),
        stderr=subprocess.STDOUT,
    )


def test_killed_after_the_effect_resumes_to_one_ticket_and_a_replay(
    gateway: Gateway, fake: FakeSystemOfRecord, tmp_path: Path, run_id: str
) -> None:
    thread = run_id
    db, log = tmp_path / "checkpoints.sqlite", tmp_path / "child.log"
    first_out, resumed_out = tmp_path / "first.json", tmp_path / "resumed.json"
    # The ticket service commits, tells the test, and holds its answer: the node cannot finish,
    # so the checkpoint after it cannot be written before the kill.
    release = threading.Event()
    fake.script(thread, Fault.hold(release))
    child = _child(gateway, db, thread, first_out, "start", log)
    try:
        committed = fake.wait_committed(thread, CHILD_SECONDS)
        assert committed, f"the effect never reached the fake; child log:\n{log.read_text()}"
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=10)
        release.set()
    assert child.returncode == -signal.SIGKILL
    assert not first_out.exists()
    assert fake.effect_count(thread) == 1

    # The thread's last checkpoint is the one after `prepare`: `record_issue` is still next.
    graph = langgraph_child.build(None, langgraph_child.saver(str(db)))
    snapshot = graph.get_state({"configurable": {"thread_id": thread}})
    assert snapshot.next == ("record_issue",)
    assert snapshot.values["trail"] == ["prepare"]

    resumed = _child(gateway, db, thread, resumed_out, "resume", log)
    assert resumed.wait(timeout=CHILD_SECONDS) == 0, log.read_text()
    result = json.loads(resumed_out.read_text())
    assert result["outcome"] == "replayed"
    assert result["trail"] == ["prepare", "record_issue", "finish"]
    assert result["ticket"] == fake.effects(thread)[0].reference
    # Exactly one ticket, and exactly one request to create it ever reached the service.
    assert fake.effect_count(thread) == 1
    assert [s.method for s in fake.requests(thread)].count("POST") == 1
    with idemgate.Client(gateway.url, AGENT_TOKEN) as client:
        view = client.operation(operation_key(thread, "record_issue"))
    assert view.record_status == "applied"


def _tool_graph(tool: Any, calls: list[dict[str, Any]]) -> Any:
    """`model -> tools`: a scripted model node that proposes `calls`, then LangGraph's ToolNode."""

    def model(state: MessagesState) -> dict[str, Any]:
        return {"messages": [AIMessage(content="", tool_calls=calls)]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", model)
    graph.add_node("tools", ToolNode([tool]))
    graph.add_edge(START, "model")
    graph.add_edge("model", "tools")
    graph.add_edge("tools", END)
    return graph.compile(checkpointer=InMemorySaver())


def test_tool_node_steps_are_the_node_and_the_tool_call_id(
    client: idemgate.Client, fake: FakeSystemOfRecord, run_id: str
) -> None:
    tool = as_langchain_tool(client, "tickets.create")
    assert tool.name == "tickets_create"
    assert tool.description == client.tool("tickets.create").description
    assert tool.tool_call_schema is not None
    calls = [
        {"name": "tickets_create", "args": {"subject": "First", "body": "a"}, "id": "call_a"},
        {"name": "tickets_create", "args": {"subject": "Second", "body": "b"}, "id": "call_b"},
    ]
    graph = _tool_graph(tool, calls)
    config = {"configurable": {"thread_id": run_id}}
    result = graph.invoke({"messages": []}, config)
    answers = [m for m in result["messages"] if isinstance(m, ToolMessage)]
    assert [m.artifact["operation_key"] for m in answers] == [
        operation_key(run_id, "tools.call_a"),
        operation_key(run_id, "tools.call_b"),
    ]
    assert [json.loads(str(m.content))["outcome"] for m in answers] == ["applied", "applied"]
    assert "Do not call this tool again" in json.loads(str(answers[0].content))["meaning"]
    assert fake.effect_count(run_id) == 2

    # Replaying the thread from the checkpoint before the tools ran: the same checkpointed
    # tool calls, so the same operations, answered from their records.
    before_tools = next(
        s for s in graph.get_state_history(config) if s.next == ("tools",)
    )
    again = graph.invoke(None, before_tools.config)
    replays = [m for m in again["messages"] if isinstance(m, ToolMessage)][-2:]
    assert [json.loads(str(m.content))["outcome"] for m in replays] == ["replayed", "replayed"]
    assert fake.effect_count(run_id) == 2


def test_an_explicit_scope_wins_and_a_step_suffix_names_each_call(
    client: idemgate.Client, fake: FakeSystemOfRecord, run_id: str
) -> None:
    first = as_langchain_tool(client, "tickets.create", step="first")
    second = as_langchain_tool(client, "tickets.create", step=lambda args: args["subject"].lower())

    def node(state: MessagesState) -> dict[str, Any]:
        one = json.loads(first.invoke({"subject": "Alpha", "body": "a"}))
        two = json.loads(second.invoke({"subject": "Beta", "body": "b"}))
        return {"messages": [AIMessage(content=json.dumps([one, two]))]}

    graph = StateGraph(MessagesState)
    graph.add_node("triage", node)
    graph.add_edge(START, "triage")
    graph.add_edge("triage", END)
    compiled = graph.compile()
    said = json.loads(compiled.invoke({"messages": []}, {"configurable": {"thread_id": "ignored"}})["messages"][-1].content)
    assert [s["operation_key"] for s in said] == [
        operation_key("ignored", "triage.first"),
        operation_key("ignored", "triage.beta"),
    ]
    with idemgate.workflow(run_id):
        said = json.loads(compiled.invoke({"messages": []}, {"configurable": {"thread_id": "ignored"}})["messages"][-1].content)
    assert [s["operation_key"] for s in said] == [
        operation_key(run_id, "triage.first"),
        operation_key(run_id, "triage.beta"),
    ]
    assert [s["outcome"] for s in said] == ["applied", "applied"]
    assert fake.effect_count(run_id) == 2


def test_outside_langgraph_without_identity_the_tool_raises(
    client: idemgate.Client, fake: FakeSystemOfRecord
) -> None:
    before = fake.total_requests()
    tool = as_langchain_tool(client, "tickets.create")
    try:
        tool.invoke({"subject": "Alpha", "body": "a"})
    except idemgate.MissingIdentityError as e:
        assert "tickets.create" in str(e)
    else:
        raise AssertionError("a key-based tool ran without identity")
    try:
        as_langchain_tool(client, "tickets.nope")
    except idemgate.UnknownToolError as e:
        assert "tickets.nope" in str(e)
    else:
        raise AssertionError("an unknown tool became a LangChain tool")
    assert fake.total_requests() == before
