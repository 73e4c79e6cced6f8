"""A raw JSON-RPC MCP server over stdio whose one tool takes its idempotency key as a header
would: an argument named `Idempotency-Key` (no Python function can take that name, so this
server is written without the SDK).

`refund(payment_id, amount, Idempotency-Key)` deduplicates on the key: the ledger
`<effects>.keys` holds one line per key ever seen (`key<TAB>answer`), and a call under a key
already there answers the stored answer and performs nothing. A new key appends one effect line
(`refund<TAB>payment<TAB>amount<TAB>key`) to the effects file before answering. While
`<effects>.garble` exists, the first call deletes it, performs its effect, records its key, and
answers something that is no tool result: the lost answer, with the effect committed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--effects", required=True)
args = parser.parse_args()
EFFECTS = Path(args.effects)
LEDGER = Path(f"{EFFECTS}.keys")
GARBLE = Path(f"{EFFECTS}.garble")

TOOL = {"name": "refund", "description": "Refunds a payment. Send a new Idempotency-Key with every request.",
        "inputSchema": {"type": "object", "additionalProperties": False,
                        "properties": {"payment_id": {"type": "string"}, "amount": {"type": "integer"},
                                       "Idempotency-Key": {"type": "string"}},
                        "required": ["payment_id", "amount", "Idempotency-Key"]}}


def answer(message_id, result=None, error=None) -> None:
    body = {"jsonrpc": "2.0", "id": message_id}
    body.update({"error": error} if error else {"result": result})
    sys.stdout.write(json.dumps(body) + "\n")
    sys.stdout.flush()


def append(path: Path, line: str) -> None:
    with path.open("a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def refund(arguments: dict) -> str:
    key = arguments["Idempotency-Key"]
    seen = dict(l.split("\t", 1) for l in LEDGER.read_text().splitlines()) if LEDGER.exists() else {}
    if key in seen:
        return seen[key]
    append(EFFECTS, f"refund\t{arguments['payment_id']}\t{arguments['amount']}\t{key}")
    n = len(EFFECTS.read_text().splitlines())
    text = f"refund R-{n} of {arguments['amount']} on {arguments['payment_id']}"
    append(LEDGER, f"{key}\t{text}")
    return text


for line in sys.stdin:
    message = json.loads(line)
    method, message_id = message.get("method"), message.get("id")
    if message_id is None:
        continue  # a notification
    if method == "initialize":
        answer(message_id, {"protocolVersion": message["params"]["protocolVersion"],
                            "capabilities": {"tools": {}},
                            "serverInfo": {"name": "keyed", "version": "1"}})
    elif method == "tools/list":
        answer(message_id, {"tools": [TOOL]})
    elif method == "tools/call":
        arguments = message["params"].get("arguments") or {}
        if "Idempotency-Key" not in arguments:
            answer(message_id, {"content": [{"type": "text", "text": "Idempotency-Key is required"}],
                                "isError": True})
            continue
        text = refund(arguments)
        if GARBLE.exists():
            GARBLE.unlink()
            answer(message_id, {"content": "not a list of blocks", "isError": "maybe"})
            continue
        answer(message_id, {"content": [{"type": "text", "text": text}]})
    else:
        answer(message_id, error={"code": -32601, "message": f"no method {method}"})
