"""One fake system of record and one gateway for the whole session; every test names its own
workflow ids (after the test), so counts at the fake are per test."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator

import pytest

from fake_sor import FakeSystemOfRecord
from harness import AGENT_TOKEN, OPERATOR_TOKEN, Gateway, LosingProxy
from local_support import Ledger

import idemgate


@pytest.fixture(scope="session")
def fake() -> Iterator[FakeSystemOfRecord]:
    server = FakeSystemOfRecord().start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def gateway(fake: FakeSystemOfRecord, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    gate = Gateway(tmp_path_factory.mktemp("gateway"), fake.url)
    yield gate
    gate.stop()


@pytest.fixture
def client(gateway: Gateway) -> Iterator[idemgate.Client]:
    with idemgate.Client(gateway.url, AGENT_TOKEN) as c:
        yield c


@pytest.fixture
def operator(gateway: Gateway) -> Iterator[idemgate.Client]:
    with idemgate.Client(gateway.url, OPERATOR_TOKEN) as c:
        yield c


@pytest.fixture
def proxy(gateway: Gateway) -> Iterator[LosingProxy]:
    p = LosingProxy(gateway.port)
    yield p
    p.stop()


@pytest.fixture
def local(tmp_path: Path) -> Iterator[idemgate.Local]:
    """A fresh in-process engine over its own SQLite file; its recoverer is stopped after."""
    with idemgate.Local(f"sqlite://{tmp_path / 'ops.sqlite'}", tenant="acme", environment="test") as engine:
        yield engine


@pytest.fixture
def ledger() -> Ledger:
    return Ledger()


@pytest.fixture
def run_id(request: pytest.FixtureRequest) -> str:
    """A workflow id named after the test: unique within the session, the same every run."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", request.node.name)[:100]


def pytest_report_header(config: pytest.Config) -> str:
    from harness import gateway_binary

    return f"idemgate binary: {gateway_binary()}"

