"""A small agent runtime that keeps its workflow state and names every operation for idemgate.

The model proposes *what* to do; the runtime decides *which operation* it is. This runtime
keeps a state file with the workflow id (made once, when the workflow starts) and the steps
already finished. Every tool call carries the operation identity in `_meta`:

    {"io.idemgate/operation": {"workflow_id": "<workflow id>", "step_id": "<step name>"}}

A workflow that crashes after a call but before it saved the step as done is resumed from the
state file and repeats that step under the same identity: idemgate answers `replayed` with the
stored result, and the system of record sees one effect.

    python3 -m venv .venv && .venv/bin/pip install mcp
    cargo build -p idemgate-cli
    .venv/bin/python examples/agent_runtime.py --state /tmp/wf.json --crash-after record_issue
    .venv/bin/python examples/agent_runtime.py --state /tmp/wf.json      # resumes: replayed

The model is stubbed out here (each step's arguments are fixed), so the example runs without
one; in a real runtime the arguments come from the model's proposed tool call, and the
identity still comes from the runtime.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any

from mcp import Client
from mcp.client.stdio import StdioServerParameters

OPERATION = "io.idemgate/operation"
STATUS_TOOL = "idemgate_operation_status"

# The workflow: step name (the step_id), tool, and the arguments the model proposed.
STEPS: list[tuple[str, str, dict[str, Any]]] = [
    ("record_issue", "tickets_create",
     {"subject": "Refund request", "body": "Order 42 arrived broken; the customer asks for a refund."}),
    ("usage_report", "reports_generate",
     {"report_type": "usage", "period_start": "2026-10-01", "period_end": "2026-10-31"}),
]


def load_state(path: Path) -> dict[str, Any]:
    if path.exists():
        return json.loads(path.read_text())
    # The workflow id is made once, when the workflow starts, and kept: never a timestamp per
    # attempt, never the model's tool-call id.
    return {"workflow_id": f"wf_{uuid.uuid4().hex[:12]}", "done": {}}


def save_state(path: Path, state: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    os.replace(tmp, path)  # atomic: a crash leaves the old state or the new, never half


async def run_step(client: Client, state: dict[str, Any], step: str, tool: str,
                   arguments: dict[str, Any]) -> dict[str, Any]:
    meta = {OPERATION: {"workflow_id": state["workflow_id"], "step_id": step}}
    result = await client.call_tool(tool, arguments, meta=meta)
    outcome = result.structured_content
    print(f"  {step}: {result.content[0].text}")
    # in_flight: poll the operation instead of calling the tool again (bounded).
    for _ in range(30):
        if outcome["status"] != "in_flight" or outcome["next_action"] != "poll":
            break
        await asyncio.sleep(min(outcome["retry_after_seconds"] or 1, 2))
        result = await client.call_tool(STATUS_TOOL, {"operation_key": outcome["operation_key"]})
        outcome = result.structured_content
        print(f"  {step}: {result.content[0].text}")
    return outcome


async def main() -> int:
    here = Path(__file__).resolve().parent.parent
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state", type=Path, required=True, help="workflow state file")
    parser.add_argument("--store", default=None, help="idemgate store URL (default: beside the state)")
    parser.add_argument("--idemgate", default=os.environ.get("IDEMGATE_BIN", str(here / "target/debug/idemgate")))
    parser.add_argument("--contracts", default=str(here / "contracts" / "*.yaml"))
    parser.add_argument("--crash-after", default=None, help="die after calling this step, before saving it")
    args = parser.parse_args()

    state = load_state(args.state)
    save_state(args.state, state)
    store = args.store or f"sqlite://{args.state.with_suffix('.sqlite')}"
    server = StdioServerParameters(
        command=args.idemgate,
        # --fake-downstream: every effect goes to an in-process fake system of record.
        args=["mcp", "--fake-downstream", "--store", store, "--contracts", args.contracts,
              "--tenant", "acme", "--environment", "demo", "--actor", "agent-runtime"],
    )
    print(f"workflow {state['workflow_id']}")
    async with Client(server) as client:
        for step, tool, arguments in STEPS:
            if step in state["done"]:
                print(f"  {step}: done earlier ({state['done'][step]['effect_reference']})")
                continue
            outcome = await run_step(client, state, step, tool, arguments)
            if args.crash_after == step:
                # The process dies here: the effect happened, the state file does not know.
                print(f"  crashed after {step}, before saving it")
                sys.stdout.flush()
                os._exit(3)
            if outcome["status"] in ("applied", "replayed"):
                state["done"][step] = {"status": outcome["status"],
                                       "effect_reference": outcome["effect_reference"]}
                save_state(args.state, state)
                continue
            # rejected: nothing happened, a person or a new intent is needed; unknown: an
            # operator reconciles; in_flight still: resume later. Never call blindly again.
            print(f"  stopping at {step}: {outcome['status']} / next_action {outcome['next_action']}")
            return 1
    print("workflow finished")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
