"""A process of its own running the engine in process, for the store tests: several of these
share one store, get killed mid-effect, or recover what a killed one left.

    python local_worker.py deliver URL LEDGER KEYS_FILE SEED
        delivers every key of KEYS_FILE (one per line) three times, in an order shuffled by
        SEED, and prints one JSON line: the count of each label it heard.
    python local_worker.py hang URL LEDGER WORKFLOW
        delivers one call whose function writes its ledger line, prints SENT, and then blocks
        until it is killed: the kill lands after the effect and before its record.
    python local_worker.py recover URL LEDGER SECONDS
        registers the tool with its lookup and lets the background recoverer run for SECONDS.

Each function appends a line with its operation key to LEDGER (fsynced): the effects, counted
on the effect's own side.
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).parent))

from local_support import FileLedger  # noqa: E402

import idemgate  # noqa: E402

TENANT = "acme"
ENVIRONMENT = "multi"
# Short, so that a killed worker's claim is recoverable within a test.
LEASE_SECONDS = 3


def local(url: str, recover: bool) -> idemgate.Local:
    return idemgate.Local(
        url, tenant=TENANT, environment=ENVIRONMENT, recover=recover, recovery_interval=0.2
    )


def register(engine: idemgate.Local, ledger: FileLedger, with_lookup: bool, hang: bool = False) -> idemgate.LocalTool:
    def find(idempotency_key: str) -> Optional[idemgate.Receipt]:
        if ledger.has(idempotency_key):
            return idemgate.Receipt(f"row:{idempotency_key}", {"found": True})
        return None

    @engine.tool(
        "rows.insert",
        fingerprint=["n"],
        lease_seconds=LEASE_SECONDS,
        lookup=find if with_lookup else None,
    )
    def insert(n: int, *, idempotency_key: str) -> idemgate.Receipt:
        ledger.effect(idempotency_key)
        if hang:
            print("SENT", flush=True)
            time.sleep(600)
        return idemgate.Receipt(f"row:{idempotency_key}", {"n": n})

    assert isinstance(insert, idemgate.LocalTool)
    return insert


def main() -> None:
    mode, url, ledger_path = sys.argv[1:4]
    ledger = FileLedger(Path(ledger_path))
    if mode == "deliver":
        keys = Path(sys.argv[4]).read_text().split()
        order = [k for k in keys for _ in range(3)]
        random.Random(int(sys.argv[5])).shuffle(order)
        labels: Counter[str] = Counter()
        with local(url, recover=False) as engine:
            insert = register(engine, ledger, with_lookup=False)
            for key in order:
                outcome = insert.invoke({"n": int(key.split("-")[1])}, workflow_id=key, step_id="insert")
                labels[outcome.label] += 1
        print(json.dumps(labels), flush=True)
    elif mode == "hang":
        engine = local(url, recover=False)
        insert = register(engine, ledger, with_lookup=False, hang=True)
        insert.invoke({"n": 1}, workflow_id=sys.argv[4], step_id="insert")
    elif mode == "recover":
        with local(url, recover=True) as engine:
            register(engine, ledger, with_lookup=True)
            print("READY", flush=True)
            time.sleep(float(sys.argv[4]))
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
