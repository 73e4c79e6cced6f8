"""A raw JSON-RPC MCP server over stdio whose one tool answers a malformed result.

It handshakes like any server and lists one tool, `create_ticket`; a call appends its effect to
the effects file (`--effects FILE`), then answers a result that is no tool result (`content`
is not a list). Written without the SDK, which would never send such an answer.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

parser = argparse.ArgumentParser()
parser.add_argument("--effects", required=True)
args = parser.parse_args()

TOOL = {"name": "create_ticket", "description": "Opens a ticket.",
        "inputSchema": {"type": "object", "properties": {"subject": {"type": "string"}}}}


def answer(message_id, result=None, error=None) -> None:
    body = {"jsonrpc": "2.0", "id": message_id}
    body.update({"error": error} if error else {"result": result})
    sys.stdout.write(json.dumps(body) + "\n")
    sys.stdout.flush()


for line in sys.stdin:
    message = json.loads(line)
    method, message_id = message.get("method"), message.get("id")
    if message_id is None:
        continue  # a notification
    if method == "initialize":
        answer(message_id, {"protocolVersion": message["params"]["protocolVersion"],
                            "capabilities": {"tools": {}},
                            "serverInfo": {"name": "malformed", "version": "1"}})
    elif method == "tools/list":
        answer(message_id, {"tools": [TOOL]})
    elif method == "tools/call":
        with open(args.effects, "a") as f:
            f.write(f"create\t{message['params']['arguments'].get('subject')}\n")
            f.flush()
            os.fsync(f.fileno())
        answer(message_id, {"content": "not a list of blocks", "isError": "maybe"})
    else:
        answer(message_id, error={"code": -32601, "message": f"no method {method}"})
