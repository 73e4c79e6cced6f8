"""A function guarded in process, as a LangGraph tool, resumed from LangGraph's SQLite
checkpointer: the graph's thread id and node name are the operation's identity, so running the
node again — after a crash, or replaying the thread — answers from the record instead of
repeating the effect.

    pip install './clients/python[langgraph]' langgraph-checkpoint-sqlite
    python examples/local_langgraph.py [DIRECTORY]

The "refund" is a line in a ledger file (a stand-in for your payment provider's SDK call); its
lookup reads the ledger by the operation key, as you would search your provider by the key
you gave it. DIRECTORY (a new temporary one by default) keeps the idemgate store, the
checkpoints and the ledger. The script prints each run's outcome and the effects counted in
the ledger: one.
"""

from __future__ import annotations

import json
import sqlite3
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph

import idemgate
from idemgate.langchain import as_langchain_tool


class State(TypedDict):
    order_id: str
    amount: int
    outcome: Optional[str]


def main(directory: Path) -> None:
    ledger = directory / "refunds.ledger"
    ledger.touch()

    with idemgate.Local(f"sqlite://{directory / 'ops.sqlite'}", tenant="acme", environment="demo") as local:

        def find_refund(idempotency_key: str) -> Optional[idemgate.Receipt]:
            for line in ledger.read_text().splitlines():
                if line.split(" ")[0] == idempotency_key:
                    return idemgate.Receipt(reference=line.split(" ")[1])
            return None

        @local.tool("refunds.issue", fingerprint=["order_id", "amount"], lookup=find_refund)
        def issue_refund(order_id: str, amount: int, *, idempotency_key: str) -> idemgate.Receipt:
            """Refunds an amount (in cents) of an order to the customer."""
            reference = f"re_{sum(1 for _ in ledger.open()) + 1}"
            with ledger.open("a") as f:  # the effect
                f.write(f"{idempotency_key} {reference} {order_id} {amount}\n")
            return idemgate.Receipt(reference=reference, result={"status": "succeeded"})

        refund = as_langchain_tool(issue_refund, wait=15)

        def refund_node(state: State, config: RunnableConfig) -> dict[str, Any]:
            said = json.loads(refund.invoke({"order_id": state["order_id"], "amount": state["amount"]}, config))
            return {"outcome": said["outcome"]}

        graph = StateGraph(State)
        graph.add_node("refund", refund_node)
        graph.add_edge(START, "refund")
        graph.add_edge("refund", END)
        checkpoints = sqlite3.connect(directory / "checkpoints.sqlite", check_same_thread=False)
        app = graph.compile(checkpointer=SqliteSaver(checkpoints))

        config: RunnableConfig = {"configurable": {"thread_id": "ticket-4711"}}
        first = app.invoke({"order_id": "pi_42", "amount": 1200, "outcome": None}, config, durability="sync")
        print("first run:", first["outcome"])
        # Run the thread again from the checkpoint before the refund node, as a resumed or
        # retried run does: the same thread and node, so the same operation.
        before = next(s for s in app.get_state_history(config) if s.next == ("refund",))
        again = app.invoke(None, before.config, durability="sync")
        print("run again from the checkpoint:", again["outcome"])
    effects = len(ledger.read_text().splitlines())
    print(f"refunds in the ledger: {effects}")
    assert (first["outcome"], again["outcome"], effects) == ("applied", "replayed", 1)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as d:
            main(Path(d))
