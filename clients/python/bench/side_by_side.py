"""The same no-op effect, guarded three ways, side by side in one run (issue 30, part 5):

- `idemgate-local`: a function guarded in process by this package (`@local.tool`), its store a
  SQLite file (WAL, `synchronous=FULL`: every recorded call is fsynced), without a timeout as
  Powertools' function has none (`--local-timeout 60` for the decorator's default);
- `powertools-redis`: AWS Lambda Powertools' `@idempotent_function` with its Redis persistence
  layer, on the Redis at `--redis` (127.0.0.1:6379; Redis does not fsync by default);
- `rust-library`: the same application and contract driven from Rust
  (`cargo bench -p idemgate-app --bench in_process`), no Python in the path;
- `rust-hand-off` (with `--rust-hand-off`): the same, each effect performed on another thread
  and answered through a channel (the bench's `--hand-off`): the one hand-off between threads a
  Python function cannot avoid, without Python. Its ratios are printed beside the targets.

Each runs in a process of its own: unique keys (each call claims, performs, records) and then
replays of the keys it made, round and round to `--replays` calls (each answered from the
record), at 1 and 8 threads, every phase
bounded by `--seconds`; the three take turns, `--rounds` times, and the ratios are taken within
each round (the machine's load moves between rounds). Every answer is checked and every effect
counted on the function's side (one per unique key, none for a replay); a wrong count fails the
run. Then the ratios are printed against the issue's targets. `--memory N` adds one in-process
run of N calls on 8 threads (`--memory-unique` new keys, then replays of them round and round),
its RSS sampled every half second.

    python bench/side_by_side.py --rust-bench PATH [--calls 4000] [--replays 20000] [--seconds 10] [--rounds 3]
        [--memory 1000000 --memory-unique 20000] [--local-timeout none|SECONDS] [--rust-hand-off]

`bench/run` builds what this needs (the extension in release mode, the Rust bench binary) and
runs it; see BENCHMARKS.md, "In process (Python)".
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any, Callable

THREADS = (1, 8)


def phase(name: str, call: Callable[[str], None], keys: list[str], threads: int, seconds: float) -> list[str]:
    """Calls `call` once per key, `threads` callers sharing them, until done or the deadline;
    prints `name,ops,secs,ops_per_s` and answers the keys called."""
    deadline = time.perf_counter() + seconds
    parts: list[list[str]] = [[] for _ in range(threads)]
    start = threading.Barrier(threads + 1)

    def worker(t: int) -> None:
        start.wait()
        for key in keys[t::threads]:
            if time.perf_counter() > deadline:
                break
            call(key)
            parts[t].append(key)

    pool = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for p in pool:
        p.start()
    start.wait()
    began = time.perf_counter()
    for p in pool:
        p.join()
    secs = time.perf_counter() - began
    done = [k for part in parts for k in part]
    print(f"{name},{len(done)},{secs:.3f},{len(done) / secs:.0f}", flush=True)
    return done


def calls_without_lists(
    name: str, call: Callable[[int], None], first: int, calls: int, threads: int, seconds: float
) -> int:
    """`call(i)` for i in first .. first+calls on `threads` threads (thread t takes every T-th),
    until done or the deadline, keeping nothing per call; prints the phase's line and answers
    how many calls were made. A phase cut by the deadline leaves holes, so a unique phase is
    only followed by replays when it finished."""
    deadline = time.perf_counter() + seconds
    counts = [0] * threads

    def worker(t: int) -> None:
        for i in range(first + t, first + calls, threads):
            if counts[t] % 256 == 0 and time.perf_counter() > deadline:
                break
            call(i)
            counts[t] += 1

    began = time.perf_counter()
    pool = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for p in pool:
        p.start()
    for p in pool:
        p.join()
    secs = time.perf_counter() - began
    print(f"{name},{sum(counts)},{secs:.3f},{sum(counts) / secs:.0f}", flush=True)
    return sum(counts)


def cycled(keys: list[str], calls: int) -> list[str]:
    """The keys round and round, to at least `calls` of them."""
    return [keys[i % len(keys)] for i in range(max(calls, len(keys)))] if keys else []


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


# ---------------------------------------------------------------------------------------------
# The systems, each in its own process (`--only NAME`).


def run_local(calls: int, replays: int, seconds: float, memory: int, memory_unique: int, timeout: float | None) -> None:
    import idemgate

    effects: Counter[str] = Counter()
    lock = threading.Lock()
    with tempfile.TemporaryDirectory() as d, idemgate.Local(f"sqlite://{Path(d) / 'bench.sqlite'}") as local:

        # No timeout by default, as Powertools' function has none: a lone caller then runs the
        # function on its own thread, as Powertools does. With one (`--local-timeout 60`, the
        # decorator's default) it runs on a runner thread, so that the caller can be answered
        # when the timeout passes.
        @local.tool("bench.noop", fingerprint=["n"], timeout=timeout)
        def noop(n: int, *, idempotency_key: str) -> dict[str, int]:
            with lock:  # the effect
                effects[idempotency_key] += 1
            return {"n": n}

        def call(expect: str) -> Callable[[str], None]:
            def one(key: str) -> None:
                workflow, step = key.split("/")
                outcome = noop.invoke({"n": int(step)}, workflow_id=workflow, step_id=step)
                if outcome.label != expect:
                    raise SystemExit(f"{key}: {outcome!r}, not {expect}")

            return one

        run = uuid.uuid4().hex[:8]
        made: list[str] = []
        for threads in THREADS:
            keys = [f"{run}-t{threads}/{i}" for i in range(calls)]
            unique = phase(f"unique/{threads}", call("applied"), keys, threads, seconds)
            phase(f"replay/{threads}", call("replayed"), cycled(unique, replays), threads, seconds)
            made += unique
        wrong = sum(1 for k in made if effects[f"default:development:{k.replace('/', ':')}"] != 1)
        unique_calls = len(made)
        print(f"# effects check: unique_calls={unique_calls} effects={sum(effects.values())} wrong={wrong}")
        if wrong or sum(effects.values()) != unique_calls:
            raise SystemExit("idemgate-local: not exactly one effect per unique call")

        if memory:
            # `memory` calls on 8 threads: `memory_unique` new keys, then replays of them round
            # and round; the RSS sampled every half second by a thread of its own. Nothing here
            # keeps an entry per call or per key beyond one byte (the effects, counted by the
            # argument `n`), so what the RSS shows is the engine's and the interpreter's.
            ledger = bytearray(memory_unique)

            @local.tool("bench.memory", fingerprint=["n"])
            def counted(n: int) -> dict[str, int]:
                with lock:  # the effect
                    ledger[n] += 1
                return {"n": n}

            def call_n(expect: str) -> Callable[[int], None]:
                def one(i: int) -> None:
                    n = i % memory_unique
                    outcome = counted.invoke({"n": n}, workflow_id=f"{run}-mem", step_id=str(n))
                    if outcome.label != expect:
                        raise SystemExit(f"memory call {n}: {outcome!r}, not {expect}")

                return one

            samples: list[tuple[float, float]] = []
            stop = threading.Event()
            began = time.perf_counter()

            def sample() -> None:
                while not stop.wait(0.5):
                    samples.append((time.perf_counter() - began, rss_mb()))

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            samples.append((0.0, rss_mb()))
            made = calls_without_lists("memory-unique/8", call_n("applied"), 0, memory_unique, 8, 20 * seconds)
            unique_rss = rss_mb()
            done = calls_without_lists(
                "memory-replay/8", call_n("replayed"), 0, memory - made, 8, 30 * seconds
            ) if made == memory_unique else 0
            stop.set()
            sampler.join()
            samples.append((time.perf_counter() - began, rss_mb()))
            tenth = max(1, len(samples) // 10)
            print("# memory: seconds:rss_mb " + " ".join(f"{t:.0f}:{mb:.1f}" for t, mb in samples[::tenth] + samples[-1:]))
            rss = [mb for _, mb in samples]
            print(
                f"# memory: {made + done} calls ({made} unique) in {samples[-1][0]:.0f} s; RSS first "
                f"{rss[0]:.1f} MB, after the unique keys {unique_rss:.1f} MB, max {max(rss):.1f} MB, "
                f"last {rss[-1]:.1f} MB; effects={sum(ledger)}"
            )
            if any(count != 1 for count in ledger[:made]) or sum(ledger) != made:
                raise SystemExit("idemgate-local: not exactly one effect per unique call in the memory run")


def run_powertools(calls: int, replays: int, seconds: float, redis_url: str) -> None:
    import warnings

    warnings.filterwarnings("ignore")  # Powertools warns that no Lambda context is set
    import redis
    from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig, idempotent_function
    from aws_lambda_powertools.utilities.idempotency.persistence.cache import CachePersistenceLayer

    host, port = redis_url.rsplit(":", 1)
    client = redis.Redis(host=host, port=int(port), decode_responses=True, max_connections=32)
    config = IdempotencyConfig(event_key_jmespath="key", expires_after_seconds=3600)
    layer = CachePersistenceLayer(client=client)
    effects: Counter[str] = Counter()
    lock = threading.Lock()

    @idempotent_function(data_keyword_argument="request", persistence_store=layer, config=config)
    def noop(request: dict[str, Any]) -> dict[str, Any]:
        with lock:  # the effect
            effects[request["key"]] += 1
        return {"n": request["n"]}

    def call(key: str) -> None:
        n = int(key.rsplit("/", 1)[1])
        if noop(request={"key": key, "n": n}) != {"n": n}:
            raise SystemExit(f"{key}: a wrong answer")

    run = uuid.uuid4().hex[:8]
    made: list[str] = []
    for threads in THREADS:
        keys = [f"pt-{run}-t{threads}/{i}" for i in range(calls)]
        unique = phase(f"unique/{threads}", call, keys, threads, seconds)
        phase(f"replay/{threads}", call, cycled(unique, replays), threads, seconds)
        made += unique
    wrong = sum(1 for k in made if effects[k] != 1)
    print(f"# effects check: unique_calls={len(made)} effects={sum(effects.values())} wrong={wrong}")
    if wrong or sum(effects.values()) != len(made):
        raise SystemExit("powertools-redis: not exactly one effect per unique call")


# ---------------------------------------------------------------------------------------------
# The run.

TARGETS = (
    # (what, numerator, denominator, at least)
    ("unique, 8 threads: idemgate-local / powertools-redis", ("idemgate-local", "unique/8"), ("powertools-redis", "unique/8"), 2.5),
    ("unique, 8 threads: idemgate-local / rust-library", ("idemgate-local", "unique/8"), ("rust-library", "unique/8"), 0.8),
    ("replay, 1 thread: idemgate-local / powertools-redis", ("idemgate-local", "replay/1"), ("powertools-redis", "replay/1"), 10.0),
    ("replay, 8 threads: idemgate-local / powertools-redis", ("idemgate-local", "replay/8"), ("powertools-redis", "replay/8"), 10.0),
    ("unique, 1 thread: idemgate-local / powertools-redis", ("idemgate-local", "unique/1"), ("powertools-redis", "unique/1"), 0.8),
)

# Beside the targets, with `--rust-hand-off`: what the one unavoidable hand-off costs the Rust path,
# and how the binding compares with the Rust path that has it too.
BESIDE = (
    ("unique, 8 threads: rust-hand-off / rust-library", ("rust-hand-off", "unique/8"), ("rust-library", "unique/8")),
    ("unique, 8 threads: idemgate-local / rust-hand-off", ("idemgate-local", "unique/8"), ("rust-hand-off", "unique/8")),
)


def collect(name: str, command: list[str], timeout: float) -> dict[str, float]:
    print(f"== {name}: {' '.join(command)}", flush=True)
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    sys.stdout.write(done.stdout)
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"{name} failed (exit {done.returncode})")
    rates: dict[str, float] = {}
    for line in done.stdout.splitlines():
        parts = line.split(",")
        if len(parts) == 4 and "/" in parts[0]:
            rates[parts[0]] = float(parts[3])
    return rates


def median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=4000, help="keys per unique phase (default 4000)")
    parser.add_argument("--replays", type=int, default=20000, help="calls per replay phase (default 20000)")
    parser.add_argument("--seconds", type=float, default=10.0, help="the bound of each phase (default 10)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the three (default 3)")
    parser.add_argument("--memory", type=int, default=0, help="in-process calls for the RSS samples (default none)")
    parser.add_argument("--memory-unique", type=int, default=20000, help="of which new keys (default 20000)")
    parser.add_argument(
        "--local-timeout", default="none", help="the in-process tool's timeout in seconds, or `none` (the default, as Powertools')"
    )
    parser.add_argument("--redis", default="127.0.0.1:6379", help="Powertools' Redis, HOST:PORT")
    parser.add_argument("--rust-bench", help="the built `in_process` bench binary of idemgate-app")
    parser.add_argument("--rust-hand-off", action="store_true", help="also the Rust path with each effect on another thread")
    parser.add_argument("--only", choices=["idemgate-local", "powertools-redis"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.only == "idemgate-local":
        timeout = None if args.local_timeout == "none" else float(args.local_timeout)
        return run_local(args.calls, args.replays, args.seconds, args.memory, args.memory_unique, timeout)
    if args.only == "powertools-redis":
        return run_powertools(args.calls, args.replays, args.seconds, args.redis)

    budget = args.seconds * 4 * 2 + 120
    me = [sys.executable, __file__, "--calls", str(args.calls), "--replays", str(args.replays), "--seconds", str(args.seconds),
          "--local-timeout", args.local_timeout]
    rounds: list[dict[str, dict[str, float]]] = []
    for r in range(1, args.rounds + 1):
        print(f"\n######## round {r} of {args.rounds}", flush=True)
        rates: dict[str, dict[str, float]] = {}
        rates["idemgate-local"] = collect("idemgate-local", me + ["--only", "idemgate-local", "--memory", "0"], budget)
        rates["powertools-redis"] = collect("powertools-redis", me + ["--only", "powertools-redis", "--redis", args.redis], budget)
        rust: list[tuple[str, list[str]]] = []
        if args.rust_bench:
            rust.append(("rust-library", []))
            if args.rust_hand_off:
                rust.append(("rust-hand-off", ["--hand-off"]))
        for name, extra in rust:
            with tempfile.TemporaryDirectory() as d:
                rates[name] = collect(
                    name,
                    [args.rust_bench, "--store", str(Path(d) / "rust.sqlite"), "--calls", str(args.calls), "--replays", str(args.replays),
                     "--seconds", str(args.seconds), "--threads", ",".join(map(str, THREADS)), *extra],
                    budget,
                )
        rounds.append(rates)
    systems = list(rounds[0])
    print(f"\n== calls per second, median (min-max) of {len(rounds)} rounds")
    print("phase      " + "".join(f"{s:>26}" for s in systems))
    for p in [f"{m}/{t}" for t in THREADS for m in ("unique", "replay")]:
        cells = []
        for system in systems:
            values = [r[system][p] for r in rounds if p in r.get(system, {})]
            cells.append(f"{median(values):.0f} ({min(values):.0f}-{max(values):.0f})" if values else "-")
        print(f"{p:<10} " + "".join(f"{c:>26}" for c in cells))
    print("\n== against the targets (issue 30): the ratio in each round, median (min-max)")
    verdicts = []
    for what, (a, pa), (b, pb), least in TARGETS:
        ratios = [r[a][pa] / r[b][pb] for r in rounds if a in r and b in r]
        if not ratios:
            print(f"{what}: not measured")
            continue
        met = median(ratios) >= least
        verdicts.append({"target": what, "median": round(median(ratios), 2), "min": round(min(ratios), 2),
                         "max": round(max(ratios), 2), "at_least": least, "met": met})
        print(f"{what}: {median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) "
              f"(target >= {least}x) {'met' if met else 'NOT met'}")
    beside = []
    for what, (a, pa), (b, pb) in BESIDE:
        ratios = [r[a][pa] / r[b][pb] for r in rounds if a in r and b in r]
        if ratios:
            if not beside:
                print("\n== beside the targets: the ratio in each round, median (min-max)")
            beside.append({"ratio": what, "median": round(median(ratios), 2), "min": round(min(ratios), 2), "max": round(max(ratios), 2)})
            print(f"{what}: {median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})")
    print("# json " + json.dumps({"rounds": rounds, "targets": verdicts, "beside": beside}))
    if args.memory:
        print("\n== memory")
        collect("idemgate-local", me + ["--only", "idemgate-local", "--memory", str(args.memory),
                                        "--memory-unique", str(args.memory_unique)], budget + 40 * args.seconds)


if __name__ == "__main__":
    main()
