"""The engine in process on shared stores: several processes on one SQLite file or one
PostgreSQL database, a process killed between its effect and its record, and the gateway
reading the records written in process. Effects are counted in a ledger file the guarded
functions append to (local_worker.py), never read from the outcomes."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Iterator
from urllib.parse import urlsplit, urlunsplit

import pytest

import local_worker
from harness import OPERATOR_TOKEN, Gateway, gateway_binary
from local_support import FileLedger

import idemgate

WORKER = Path(__file__).parent / "local_worker.py"
PROCESSES = 4
KEYS = 200


def _psql(url: str, sql: str) -> None:
    subprocess.run(
        ["psql", url, "-v", "ON_ERROR_STOP=1", "-q", "-c", sql],
        check=True,
        capture_output=True,
        timeout=60,
    )


def _postgres(tmp_path: Path) -> Iterator[str]:
    """A fresh database on the server `DATABASE_URL` names, dropped after the test."""
    base = os.environ.get("DATABASE_URL")
    missing = None if base else "DATABASE_URL is not set"
    if base and subprocess.run(["which", "psql"], capture_output=True).returncode != 0:
        missing = "psql is not installed"
    if missing:
        if os.environ.get("IDEMGATE_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"IDEMGATE_REQUIRE_POSTGRES=1, but {missing}")
        print(f"SKIPPED (PostgreSQL): {missing}")
        pytest.skip(f"SKIPPED (PostgreSQL): {missing}")
    assert base is not None
    name = f"idemgate_py_{uuid.uuid4().hex[:12]}"
    _psql(base, f"CREATE DATABASE {name}")
    parts = urlsplit(base)
    try:
        yield urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))
    finally:
        _psql(base, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite://{tmp_path / 'shared.sqlite'}"
    else:
        yield from _postgres(tmp_path)


def _worker(*args: str) -> "subprocess.Popen[str]":
    return subprocess.Popen(
        [sys.executable, str(WORKER), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _read_line(process: "subprocess.Popen[str]", seconds: float) -> str:
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], seconds)
    if not ready:
        process.kill()
        raise AssertionError(f"the worker said nothing within {seconds} s")
    return process.stdout.readline().strip()


def test_four_processes_on_one_store_make_exactly_one_effect_per_key(store: str, tmp_path: Path) -> None:
    """4 processes × 200 keys × 3 deliveries each, in a shuffled order per process."""
    ledger = FileLedger(tmp_path / "ledger")
    keys_file = tmp_path / "keys"
    keys = [f"k-{i}" for i in range(KEYS)]
    keys_file.write_text("\n".join(keys))
    workers = [_worker("deliver", store, str(ledger.path), str(keys_file), str(seed)) for seed in range(PROCESSES)]
    labels: dict[str, int] = {}
    for worker in workers:
        out, err = worker.communicate(timeout=300)
        assert worker.returncode == 0, err[-3000:]
        for label, n in json.loads(out.strip().splitlines()[-1]).items():
            labels[label] = labels.get(label, 0) + n
    counts = ledger.counts()
    assert sorted(counts) == sorted(f"acme:multi:{k}:insert" for k in keys)
    assert set(counts.values()) == {1}, {k: n for k, n in counts.items() if n != 1}
    assert labels.get("applied") == KEYS, labels
    assert set(labels) <= {"applied", "replayed", "in_flight"}, labels
    assert sum(labels.values()) == PROCESSES * KEYS * 3
    with local_worker.local(store, recover=False) as engine:
        page = engine.operations(status="applied", limit=500)
        assert len(page.operations) == KEYS


def _killed_after_the_effect(store: str, ledger: FileLedger, workflow: str) -> str:
    """A worker whose function wrote its ledger line and was SIGKILLed before its record."""
    worker = _worker("hang", store, str(ledger.path), workflow)
    try:
        assert _read_line(worker, 60) == "SENT"
    finally:
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(30)
    key = f"acme:multi:{workflow}:insert"
    assert ledger.counts()[key] == 1
    return key


def _deliver_until_settled(tool: idemgate.LocalTool, workflow: str) -> idemgate.Outcome:
    """Delivers again while the dead worker's lease holds (in flight), for at most 20 s."""
    deadline = time.monotonic() + 20
    while True:
        outcome = tool.invoke({"n": 1}, workflow_id=workflow, step_id="insert")
        if outcome.label != "in_flight" or time.monotonic() > deadline:
            return outcome
        time.sleep(0.3)


def test_a_killed_process_is_settled_by_the_next_delivery_through_the_lookup(store: str, tmp_path: Path) -> None:
    ledger = FileLedger(tmp_path / "ledger")
    key = _killed_after_the_effect(store, ledger, "killed-1")
    with local_worker.local(store, recover=False) as engine:
        insert = local_worker.register(engine, ledger, with_lookup=True)
        outcome = _deliver_until_settled(insert, "killed-1")
        assert isinstance(outcome, (idemgate.Applied, idemgate.Replayed)), outcome
        assert outcome.effect_reference == f"row:{key}"
        again = insert.invoke({"n": 1}, workflow_id="killed-1", step_id="insert")
        assert isinstance(again, idemgate.Replayed)
    assert ledger.counts()[key] == 1


def test_a_killed_process_without_a_lookup_ends_unknown_never_a_second_effect(store: str, tmp_path: Path) -> None:
    ledger = FileLedger(tmp_path / "ledger")
    key = _killed_after_the_effect(store, ledger, "killed-2")
    with local_worker.local(store, recover=False) as engine:
        insert = local_worker.register(engine, ledger, with_lookup=False)
        outcome = _deliver_until_settled(insert, "killed-2")
        assert isinstance(outcome, idemgate.Unknown), outcome
        assert engine.operations(status="unknown").operations[0].operation_key == key
    assert ledger.counts()[key] == 1


def test_a_killed_process_is_settled_by_the_recoverer_of_another_process(store: str, tmp_path: Path) -> None:
    ledger = FileLedger(tmp_path / "ledger")
    key = _killed_after_the_effect(store, ledger, "killed-3")
    recoverer = _worker("recover", store, str(ledger.path), "60")
    try:
        assert _read_line(recoverer, 60) == "READY"
        with local_worker.local(store, recover=False) as engine:
            deadline = time.monotonic() + 30
            while engine.operation(key).record_status != "applied":
                assert time.monotonic() < deadline, engine.operation(key)
                time.sleep(0.2)
            assert engine.operation(key).receipt == idemgate.Receipt(f"row:{key}", {"found": True})
    finally:
        recoverer.terminate()
        recoverer.wait(30)
    assert ledger.counts()[key] == 1


def test_records_written_in_process_are_the_gateways_records(tmp_path: Path) -> None:
    """`idemgate serve` over the same SQLite file lists and reads them through API v1."""
    directory = tmp_path / "gate"
    directory.mkdir()
    url = f"sqlite://{directory / 'gate.sqlite'}"
    ledger = FileLedger(tmp_path / "ledger")
    with idemgate.Local(url, tenant="ci", environment="ci") as engine:

        @engine.tool("rows.insert", fingerprint=["n"])
        def insert(n: int, *, idempotency_key: str) -> idemgate.Receipt:
            ledger.effect(idempotency_key)
            return idemgate.Receipt(f"row-{n}", {"n": n})

        @engine.tool("rows.delete")
        def delete(n: int) -> dict[str, int]:
            raise ConnectionResetError("lost after the delete")

        applied = insert.invoke({"n": 1}, workflow_id="w1", step_id="insert")
        unknown = delete.invoke({"n": 1}, workflow_id="w1", step_id="delete")
        assert isinstance(applied, idemgate.Applied) and isinstance(unknown, idemgate.Unknown)

        gateway = Gateway(directory, "http://127.0.0.1:9")
        try:
            with idemgate.Client(gateway.url, OPERATOR_TOKEN) as client:
                listed = {r.operation_key: r for r in client.operations().operations}
                assert set(listed) == {applied.operation_key, unknown.operation_key}
                assert listed[applied.operation_key or ""].effect_reference == "row-1"
                assert listed[applied.operation_key or ""].tool == "rows.insert"
                queue = client.operations(status="unknown").operations
                assert [r.operation_key for r in queue] == [unknown.operation_key]
                read = client.operation(applied.operation_key or "")
                assert read.record_status == "applied" and read.receipt == idemgate.Receipt("row-1", {"n": 1})
                assert [e.kind for e in read.events][:3] == ["proposed", "validated", "claimed"]
        finally:
            gateway.stop()
    assert ledger.counts()["ci:ci:w1:insert"] == 1


def test_records_written_in_process_are_resolved_by_hand_by_ops_store_and_by_the_gateway(tmp_path: Path) -> None:
    """A tool only this process has: `idemgate ops --store` and `idemgate serve` over the same
    file resolve its `unknown` records by hand (never a lookup), and the process replays them."""
    directory = tmp_path / "gate"
    directory.mkdir()
    url = f"sqlite://{directory / 'gate.sqlite'}"
    ledger = FileLedger(tmp_path / "ledger")
    lost = [True]
    with idemgate.Local(url, tenant="ci", environment="ci") as engine:

        @engine.tool("refunds.issue", fingerprint=["n"])
        def refund(n: int, *, idempotency_key: str) -> idemgate.Receipt:
            ledger.effect(idempotency_key)
            if lost[0]:
                raise ConnectionResetError("lost after the refund")
            return idemgate.Receipt(f"refund-{n}", {"n": n})

        first = refund.invoke({"n": 1}, workflow_id="w1", step_id="refund")
        second = refund.invoke({"n": 2}, workflow_id="w2", step_id="refund")
        assert isinstance(first, idemgate.Unknown) and isinstance(second, idemgate.Unknown)
        key1, key2 = first.operation_key or "", second.operation_key or ""

        def ops(*args: str) -> "subprocess.CompletedProcess[str]":
            env = {**os.environ, "IDEMGATE_ACTOR": "alice"}
            return subprocess.run(
                [str(gateway_binary()), "ops", "--store", url, *args],
                capture_output=True, text=True, timeout=60, env=env, stdin=subprocess.DEVNULL,
            )

        listed = ops("list")
        assert listed.returncode == 0 and key1 in listed.stdout and key2 in listed.stdout, listed
        lookup = ops("reconcile", key1)
        assert lookup.returncode == 2 and "not loaded" in lookup.stderr, lookup
        resolved = ops("reconcile", key1, "--applied", "--reference", "refund-1", "--result", '{"n": 1}',
                       "--reason", "seen in the payments ledger")
        assert resolved.returncode == 0, resolved
        assert "unknown -> applied" in resolved.stdout, resolved.stdout
        assert "by alice; reason: seen in the payments ledger" in resolved.stdout, resolved.stdout

        gateway = Gateway(directory, "http://127.0.0.1:9")
        try:
            with idemgate.Client(gateway.url, OPERATOR_TOKEN) as client:
                by_hand = client.resolve_applied(key2, "refund-2", {"n": 2}, reason="seen in the ledger too")
                assert isinstance(by_hand, idemgate.Replayed), by_hand
                read = client.operation(key2)
                assert read.record_status == "applied"
                assert any("reason: seen in the ledger too" in (e.detail or "") for e in read.events), read.events
        finally:
            gateway.stop()

        lost[0] = False
        again1 = refund.invoke({"n": 1}, workflow_id="w1", step_id="refund")
        again2 = refund.invoke({"n": 2}, workflow_id="w2", step_id="refund")
        assert isinstance(again1, idemgate.Replayed) and again1.effect_reference == "refund-1", again1
        assert isinstance(again2, idemgate.Replayed) and again2.effect_reference == "refund-2", again2
    assert ledger.counts()[key1] == 1 and ledger.counts()[key2] == 1
