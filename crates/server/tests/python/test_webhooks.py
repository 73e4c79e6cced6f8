"""Webhook intake against a real `idemgate serve`: events signed by the `standardwebhooks`
library (as a Standard Webhooks sender signs them), a report job at a fake system of record
that counts its own effects, and the same event delivered 20 times at once.

The gateway binary comes from IDEMGATE_BIN. Every server binds 127.0.0.1 only; every wait is
bounded.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import json
import os
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
from standardwebhooks.webhooks import Webhook

TOKEN = "ci-webhooks-agent-token"
SECRET = "whsec_" + base64.b64encode(b"ci-webhooks-secret-of-32-bytes!!").decode()
# A value that appears only in event bodies.
BODY_ONLY = "only-in-the-body-7f3a"
NEXT_SECRET = "whsec_" + base64.b64encode(b"the-next-secret-in-a-rotation-..").decode()


class Reports:
    """The fake report service: accepts a job per idempotency key (deduplicating), counts an
    effect only when a job finishes, and answers every poll "running", so that only the
    webhook can finish a job at the gateway."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.jobs: dict[str, dict[str, Any]] = {}
        self.by_key: dict[str, str] = {}
        self.effects: dict[str, int] = {}
        self.submissions = 0
        self.polls = 0

    def submit(self, key: str) -> str:
        with self.lock:
            self.submissions += 1
            if key in self.by_key:
                return self.by_key[key]
            job_id = f"job-{len(self.jobs) + 1}"
            self.jobs[job_id] = {"key": key, "state": "running"}
            self.by_key[key] = job_id
            return job_id

    def finish(self, job_id: str) -> str:
        """The job's effect happens here, once; its report id."""
        with self.lock:
            job = self.jobs[job_id]
            assert job["state"] == "running"
            job["state"] = "done"
            self.effects[job["key"]] = self.effects.get(job["key"], 0) + 1
            return f"report-{job_id}"

    def total_effects(self) -> int:
        with self.lock:
            return sum(self.effects.values())


def serve_reports(reports: Reports) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def answer(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length", "0"))
            self.rfile.read(length)
            key = self.headers.get("idempotency-key", "")
            if self.path != "/reports" or not key:
                self.answer(400, {"error": "POST /reports with an Idempotency-Key"})
                return
            self.answer(202, {"job_id": reports.submit(key)})

        def do_GET(self) -> None:
            with reports.lock:
                reports.polls += 1
                known = self.path.removeprefix("/jobs/") in reports.jobs
            self.answer(200 if known else 404, {"status": "running"})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


CONTRACT = """
name: reports.generate
version: "1"
purpose: Generate one usage report for a period as a background job.
effect_class: key_based
input_schema:
  type: object
  properties:
    report_type: {{type: string, enum: [usage, billing]}}
    period: {{type: string}}
  required: [report_type, period]
  additionalProperties: false
request_fingerprint:
  fields: [report_type, period]
downstream:
  deduplicates_by_key: true
  async_jobs: true
  receipt: report job id, then the report id
  http:
    url: http://127.0.0.1:{port}/reports
    reference: /report_id
    job:
      id: /job_id
      poll_url: http://127.0.0.1:{port}/jobs/{{job_id}}
      state: /status
      done: [done]
      failed: [failed]
      reference: /report_id
    timeouts:
      total: 5s
retention:
  record_ttl: 3d
  tombstone_ttl: 30d
  late_arrival: tombstone
  max_retry_window: 1d
lease_seconds: 60
"""

CONFIG = """
listen = "127.0.0.1:{port}"
environment = "ci"
store = "sqlite://{dir}/idemgate.sqlite"
contracts = ["reports.yaml"]

[[tenants]]
name = "acme"
[[tenants.tokens]]
name = "report-bot"
sha256 = "{sha}"
role = "agent"

[webhooks.reports]
tenant = "acme"
tools = ["reports.generate"]
secret_envs = ["REPORTS_WEBHOOK_SECRET", "REPORTS_WEBHOOK_SECRET_NEXT"]
tolerance = "5m"
retention = "3d"
job_id_pointer = "/data/job_id"
outcome_pointer = "/type"
success = ["job.succeeded"]
failure = ["job.failed"]
reference_pointer = "/data/report_id"
result_pointer = "/data"
"""


@pytest.fixture()
def world(tmp_path: Path) -> Iterator[tuple[httpx.Client, Reports]]:
    binary = os.environ.get("IDEMGATE_BIN")
    if not binary:
        pytest.fail("IDEMGATE_BIN names the idemgate binary")
    reports = Reports()
    fake = serve_reports(reports)
    port = free_port()
    (tmp_path / "reports.yaml").write_text(CONTRACT.format(port=fake.server_address[1]))
    sha = hashlib.sha256(TOKEN.encode()).hexdigest()
    config = tmp_path / "idemgate.toml"
    config.write_text(CONFIG.format(port=port, dir=tmp_path, sha=sha))
    env = dict(os.environ, REPORTS_WEBHOOK_SECRET=SECRET, REPORTS_WEBHOOK_SECRET_NEXT=NEXT_SECRET)
    log = open(tmp_path / "gateway.log", "wb")
    gateway = subprocess.Popen(
        [binary, "serve", "--config", str(config)], stdout=log, stderr=subprocess.STDOUT, env=env
    )
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10.0)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if client.get("/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if gateway.poll() is not None or time.monotonic() > deadline:
                log.flush()
                pytest.fail("the gateway did not start:\n" + (tmp_path / "gateway.log").read_text())
            time.sleep(0.05)
        yield client, reports
    finally:
        client.close()
        gateway.terminate()
        try:
            gateway.wait(timeout=10)
        except subprocess.TimeoutExpired:
            gateway.kill()
        fake.shutdown()
        log.close()
        # The body of an event is never written to the log (its reference is: it is the
        # effect's, in the operation's trace).
        assert BODY_ONLY not in (tmp_path / "gateway.log").read_text()


def invoke(client: httpx.Client, workflow: str) -> httpx.Response:
    return client.post(
        "/v1/tools/reports.generate/invoke",
        headers={"authorization": f"Bearer {TOKEN}"},
        json={
            "workflow_id": workflow,
            "step_id": "s",
            "arguments": {"report_type": "usage", "period": "2026-11"},
        },
    )


def delivery(secret: str, msg_id: str, payload: str, at: datetime.datetime) -> dict[str, str]:
    signature = Webhook(secret).sign(msg_id, at, payload)
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": signature,
        "content-type": "application/json",
    }


def now() -> datetime.datetime:
    return datetime.datetime.now(tz=datetime.timezone.utc)


def test_the_same_event_delivered_20_times_at_once_is_one_transition_and_one_effect(
    world: tuple[httpx.Client, Reports],
) -> None:
    client, reports = world
    accepted = invoke(client, "wf-1")
    assert accepted.status_code == 409, accepted.text
    assert accepted.headers["idempotency-outcome"] == "in_flight"
    (job_id,) = reports.jobs
    reference = reports.finish(job_id)

    payload = json.dumps(
        {
            "type": "job.succeeded",
            "data": {"job_id": job_id, "report_id": reference, "rows": 7, "note": BODY_ONLY},
        }
    )
    headers = delivery(SECRET, "msg_2qJ1", payload, now())
    barrier = threading.Barrier(20, timeout=10)

    def deliver(_: int) -> httpx.Response:
        with httpx.Client(base_url=client.base_url, timeout=10.0) as own:
            barrier.wait()
            return own.post("/v1/webhooks/reports", content=payload, headers=headers)

    with ThreadPoolExecutor(max_workers=20) as pool:
        answers = list(pool.map(deliver, range(20)))
    assert [a.status_code for a in answers] == [200] * 20, [a.text for a in answers]
    bodies = [a.json() for a in answers]
    assert {b["disposition"] for b in bodies} == {"applied"}
    assert sorted(b["redelivery"] for b in bodies) == [False] + [True] * 19
    assert {b["operation_key"] for b in bodies} == {"acme:ci:wf-1:s"}

    operation = client.get(
        "/v1/operations/acme:ci:wf-1:s", headers={"authorization": f"Bearer {TOKEN}"}
    ).json()
    assert operation["record_status"] == "applied", operation
    assert operation["effect_reference"] == reference
    finishes = [e for e in operation["events"] if e["kind"] == "acknowledged"]
    assert len(finishes) == 1, operation["events"]

    # A second event id for the same job (the provider's own duplicate) changes nothing.
    other = delivery(NEXT_SECRET, "msg_2qJ2", payload, now())
    second = client.post("/v1/webhooks/reports", content=payload, headers=other)
    assert second.status_code == 200, second.text
    assert second.json()["disposition"] == "already_settled"

    replay = invoke(client, "wf-1")
    assert replay.status_code == 200, replay.text
    assert replay.headers["idempotency-outcome"] == "replayed"
    assert replay.json()["result"]["rows"] == 7
    # One effect at the system of record, and one job ever accepted for the key.
    assert reports.total_effects() == 1
    assert len(reports.jobs) == 1


def test_bad_signatures_and_stale_timestamps_are_refused_and_change_nothing(
    world: tuple[httpx.Client, Reports],
) -> None:
    client, reports = world
    assert invoke(client, "wf-2").status_code == 409
    (job_id,) = reports.jobs
    payload = json.dumps(
        {"type": "job.succeeded", "data": {"job_id": job_id, "report_id": "r", "note": BODY_ONLY}}
    )
    stranger = "whsec_" + base64.b64encode(b"not-this-gateway-secret-at-all!!").decode()
    refusals = {
        "bad signature": delivery(stranger, "msg_bad", payload, now()),
        "stale": delivery(SECRET, "msg_old", payload, now() - datetime.timedelta(minutes=6)),
        "future": delivery(SECRET, "msg_new", payload, now() + datetime.timedelta(minutes=6)),
    }
    for why, headers in refusals.items():
        answer = client.post("/v1/webhooks/reports", content=payload, headers=headers)
        assert answer.status_code == 401, (why, answer.text)
        assert answer.headers["content-type"] == "application/problem+json"
        assert answer.json()["error"]["code"] == "webhook_signature_invalid", why
    unknown = client.post(
        "/v1/webhooks/nobody", content=payload, headers=delivery(SECRET, "m", payload, now())
    )
    assert unknown.status_code == 404
    operation = client.get(
        "/v1/operations/acme:ci:wf-2:s", headers={"authorization": f"Bearer {TOKEN}"}
    ).json()
    assert operation["record_status"] == "pending"
    # The refused events were never recorded: the real one, later, is the first.
    real = client.post(
        "/v1/webhooks/reports", content=payload, headers=delivery(SECRET, "msg_bad", payload, now())
    )
    assert real.json() == {
        "disposition": "applied",
        "operation_key": "acme:ci:wf-2:s",
        "redelivery": False,
    }
    assert reports.total_effects() == 0
