"""A deterministic LangGraph run in its own process whose tool is a function guarded in process
(`@local.tool`, through `idemgate.langchain.as_langchain_tool`), for the crash tests: no model,
no gateway.

    python langgraph_local_child.py STORE_URL LEDGER CHECKPOINT_DB THREAD_ID OUT_JSON MODE

The graph is `prepare -> record_issue -> finish`; `record_issue` calls the guarded function
`tickets.create`, whose effect is a line in LEDGER (fsynced; `local_support.FileLedger`), and
whose lookup finds that line. Checkpoints go to a SQLite file with `durability="sync"`. MODE:

- `start-hold-after-record`: the tool answers (its record is written), the node prints
  RECORDED and blocks: a kill lands after the effect and its record, before the checkpoint.
- `start-hold-in-effect`: the function writes its ledger line, prints SENT and blocks: a kill
  lands after the effect, before its record and the checkpoint.
- `resume`: continues the thread from its last checkpoint; the final state goes to OUT_JSON.
"""

from __future__ import annotations

import json
import operator
import sqlite3
import sys
import time
from pathlib import Path
from typing import Annotated, Any, Optional, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph

sys.path.insert(0, str(Path(__file__).parent))

from local_support import FileLedger  # noqa: E402

import idemgate  # noqa: E402
from idemgate.langchain import as_langchain_tool  # noqa: E402

TENANT = "acme"
ENVIRONMENT = "langgraph"
LEASE_SECONDS = 3


class State(TypedDict):
    subject: str
    outcome: Optional[str]
    ticket: Optional[str]
    trail: Annotated[list[str], operator.add]


def guarded(local: idemgate.Local, ledger: FileLedger, hold_in_effect: bool) -> idemgate.LocalTool:
    def find(idempotency_key: str) -> Optional[idemgate.Receipt]:
        return idemgate.Receipt(f"ticket:{idempotency_key}") if ledger.has(idempotency_key) else None

    @local.tool("tickets.create", lookup=find, lease_seconds=LEASE_SECONDS)
    def create_ticket(subject: str, *, idempotency_key: str) -> idemgate.Receipt:
        """Opens a support ticket."""
        ledger.effect(idempotency_key)
        if hold_in_effect:
            print("SENT", flush=True)
            time.sleep(600)
        return idemgate.Receipt(f"ticket:{idempotency_key}", {"subject": subject})

    assert isinstance(create_ticket, idemgate.LocalTool)
    return create_ticket


def build(tool: Any, checkpointer: Any, hold_after_record: bool) -> Any:
    def prepare(state: State) -> dict[str, Any]:
        return {"trail": ["prepare"]}

    def record_issue(state: State, config: RunnableConfig) -> dict[str, Any]:
        said = json.loads(tool.invoke({"subject": state["subject"]}, config))
        if hold_after_record:
            print("RECORDED", json.dumps(said), flush=True)
            time.sleep(600)
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
    url, ledger, db, thread, out, mode = argv
    config: RunnableConfig = {"configurable": {"thread_id": thread}}
    with idemgate.Local(url, tenant=TENANT, environment=ENVIRONMENT, recover=False) as local:
        create_ticket = guarded(local, FileLedger(Path(ledger)), mode == "start-hold-in-effect")
        # wait: a resumed call that finds its operation still claimed by the killed process
        # waits for the claim's lease to end and the engine to settle it.
        tool = as_langchain_tool(create_ticket, wait=15)
        graph = build(tool, saver(db), mode == "start-hold-after-record")
        if mode.startswith("start"):
            start: State = {"subject": "Order 42 arrived broken.", "outcome": None, "ticket": None, "trail": []}
            result = graph.invoke(start, config, durability="sync")
        elif mode == "resume":
            result = graph.invoke(None, config, durability="sync")
        else:
            raise SystemExit(f"unknown mode {mode!r}")
    with open(out, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
