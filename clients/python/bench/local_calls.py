"""Calls per second of a guarded no-op function in process, on SQLite: unique keys (each call
claims, performs and records) and replays (each call answered from the record), at 1 and 8
threads. A first measure for the binding's cost, not the side-by-side benchmark (issue 30,
part 5). Build the extension in release mode first (`pip install ./clients/python`, or
`maturin develop --release` in clients/python).

    python bench/local_calls.py [--calls N] [--threads 1,8] [--unique-only]

`--unique-only` skips the replays, for a whole-process A/B of the unique path (two builds of the
package, each first on PYTHONPATH, timed in turns). `--native` calls the extension's own
`invoke` instead of the guarded function's (the same engine call, without the package's Python
around it: the checks of the identity, the arguments and `raise_on`): what that Python costs a
call, measured A/B. `--pin-callers CPU` binds each calling thread (the application's, not the
extension's) to that processor: what the interpreter lock's hand-offs across processors cost.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

import idemgate


def run(
    tool: idemgate.LocalTool, threads: int, calls: int, prefix: str, native: bool, pin: Optional[int]
) -> float:
    per = calls // threads
    start = threading.Barrier(threads + 1)
    engine = tool.local._native  # noqa: SLF001 - `--native` measures the package's own Python

    def worker(t: int) -> None:
        if pin is not None:
            os.sched_setaffinity(0, {pin})  # this thread only
        start.wait()
        for i in range(per):
            if native:
                answer = engine.invoke(tool.name, {"n": i}, f"{prefix}-{t}", str(i), None, False)
                assert answer.label in ("applied", "replayed"), answer
                continue
            outcome = tool.invoke({"n": i}, workflow_id=f"{prefix}-{t}", step_id=str(i))
            assert outcome.label in ("applied", "replayed"), outcome

    pool = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for p in pool:
        p.start()
    start.wait()
    began = time.perf_counter()
    for p in pool:
        p.join()
    return per * threads / (time.perf_counter() - began)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=4000)
    parser.add_argument("--threads", default="1,8", help="thread counts, comma-separated (default 1,8)")
    parser.add_argument("--unique-only", action="store_true", help="no replay phase")
    parser.add_argument("--native", action="store_true", help="call the extension's invoke directly")
    parser.add_argument("--pin-callers", type=int, default=None, metavar="CPU", help="bind the calling threads to CPU")
    parser.add_argument(
        "--timeout", default="60", help="the tool's timeout in seconds, or `none` (default 60, the decorator's default)"
    )
    args = parser.parse_args()
    counts = [int(t) for t in args.threads.split(",")]
    with tempfile.TemporaryDirectory() as d, idemgate.Local(f"sqlite://{Path(d) / 'bench.sqlite'}") as local:
        effects = 0

        timeout = None if args.timeout == "none" else float(args.timeout)

        @local.tool("bench.noop", fingerprint=["n"], timeout=timeout)
        def noop(n: int) -> dict[str, int]:
            nonlocal effects
            effects += 1
            return {"n": n}

        for threads in counts:
            unique = run(noop, threads, args.calls, f"u{threads}", args.native, args.pin_callers)
            if args.unique_only:
                print(f"{threads} thread(s): unique {unique:8.0f} calls/s")
                continue
            replay = run(noop, threads, args.calls, f"u{threads}", args.native, args.pin_callers)
            print(f"{threads} thread(s): unique {unique:8.0f} calls/s   replay {replay:8.0f} calls/s")
        print(f"effects: {effects}")
        made = sum((args.calls // t) * t for t in counts)
        if effects != made:
            raise SystemExit(f"{effects} effects for {made} unique calls")


if __name__ == "__main__":
    main()
