"""A deterministic LangGraph run in its own process, for the crash test: no model.

    python langgraph_child.py GATEWAY_URL TOKEN CHECKPOINT_DB THREAD_ID OUT_JSON start|resume

The graph is `prepare -> record_issue -> finish`. `record_issue` invokes the gateway's
`tickets.create` through `idemgate.langchain.as_langchain_tool`, so its identity is the thread
id and the node's name. Checkpoints go to a SQLite file with `durability="sync"`: the
checkpoint after a node is written before the next node starts. `start` runs from the input;
`resume` continues the thread from its last checkpoint. The final state goes to OUT_JSON.
"""

from __future__ import annotations

import json
import operator
import sqlite3
import sys
from typing import Annotated, Any, Optional, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph

import idemgate
from idemgate.langchain import as_langchain_tool


class State(TypedDict):
    subject: str
    body: str
    outcome: Optional[str]
    ticket: Optional[str]
    trail: Annotated[list[str], operator.add]


def build(client: Optional[idemgate.Client], checkpointer: Any) -> Any:
    tool = as_langchain_tool(client, "tickets.create", wait=10) if client else None

    def prepare(state: State) -> dict[str, Any]:
        return {"trail": ["prepare"]}

    def record_issue(state: State, config: RunnableConfig) -> dict[str, Any]:
        assert tool is not None
        text = tool.invoke({"subject": state["subject"], "body": state["body"]}, config)
        said = json.loads(text)
        return {"outcome": said["outcome"], "ticket": said.get("effect_reference"), "trail": ["record_issue"]}

    def finish(state: State) -> dict[str, Any]:
        return {"trail": ["finish"]}

    graph = StateGraph(State)
    graph.add_node("prepare", prepare)
    graph.add_node("record_issue", record_issue)
    graph.add_node("finish", finish)
    graph.add_edge(START, "prepare")
    graph.add_edge("prepare", "record_issue")
    graph.add_edge("record_issue", "finish")
    graph.add_edge("finish", END)
    return graph.compile(checkpointer=checkpointer)


def saver(path: str) -> SqliteSaver:
    return SqliteSaver(sqlite3.connect(path, check_same_thread=False))


def main(argv: list[str]) -> int:
    url, token, db, thread, out, mode = argv
    config: RunnableConfig = {"configurable": {"thread_id": thread}}
    with idemgate.Client(url, token) as client:
        graph = build(client, saver(db))
        if mode == "start":
            start: State = {
                "subject": "Refund request",
                "body": "Order 42 arrived broken.",
                "outcome": None,
                "ticket": None,
                "trail": [],
            }
            result = graph.invoke(start, config, durability="sync")
        else:
            result = graph.invoke(None, config, durability="sync")
    with open(out, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
