"""Calls per second of a guarded no-op function through `idemgate.AsyncLocal` on SQLite, new
keys only: N tasks at once on one event loop, each awaiting `tool.invoke(...)` in turn. The
function is an `async def` one (or, with `--sync-function`, a plain one, run on a runner
thread). For a whole-process A/B of the awaitable path (two builds of the package, each first
on PYTHONPATH, timed in turns); not one of issue 30's side-by-side points.

    python bench/async_calls.py [--calls 8000] [--tasks 8] [--sync-function]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import idemgate


async def main(calls: int, tasks: int, sync_function: bool) -> None:
    with tempfile.TemporaryDirectory() as d:
        async with idemgate.AsyncLocal(f"sqlite://{Path(d) / 'bench.sqlite'}") as local:
            effects = 0

            if sync_function:

                @local.tool("bench.noop", fingerprint=["n"])
                def noop(n: int) -> dict[str, Any]:
                    nonlocal effects
                    effects += 1
                    return {"n": n}

            else:

                @local.tool("bench.noop", fingerprint=["n"])
                async def noop(n: int) -> dict[str, Any]:
                    nonlocal effects
                    effects += 1
                    return {"n": n}

            per = calls // tasks

            async def caller(t: int) -> None:
                for i in range(per):
                    outcome = await noop.invoke({"n": i}, workflow_id=f"bench-{t}", step_id=str(i))
                    assert outcome.label == "applied", outcome

            began = time.perf_counter()
            await asyncio.gather(*(caller(t) for t in range(tasks)))
            elapsed = time.perf_counter() - began
            kind = "sync" if sync_function else "async def"
            print(f"{tasks} task(s), {kind} function: unique {per * tasks / elapsed:8.0f} calls/s")
            if effects != per * tasks:
                raise SystemExit(f"{effects} effects for {per * tasks} unique calls")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=8000)
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--sync-function", action="store_true")
    args = parser.parse_args()
    asyncio.run(main(args.calls, args.tasks, args.sync_function))
