"""A real `idemgate serve` for the tests, its contracts pointing at the fake system of record,
and a proxy that can lose the gateway's answers on their way to the client."""

from __future__ import annotations

import hashlib
import http.client
import os
import socket
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

AGENT_TOKEN = "agent-token-for-tests"
OPERATOR_TOKEN = "operator-token-for-tests"
TENANT = "ci"
ENVIRONMENT = "ci"
STARTUP_SECONDS = 20.0


def gateway_binary() -> Path:
    """`IDEMGATE_BIN`, else `$CARGO_TARGET_DIR/debug/idemgate` (the target dir defaulting to
    `$HOME/.cache/idemgate-target`)."""
    explicit = os.environ.get("IDEMGATE_BIN")
    if explicit:
        return Path(explicit)
    target = os.environ.get("CARGO_TARGET_DIR") or str(Path.home() / ".cache" / "idemgate-target")
    return Path(target) / "debug" / "idemgate"


def operation_key(workflow_id: str, step_id: str) -> str:
    return f"{TENANT}:{ENVIRONMENT}:{workflow_id}:{step_id}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def contracts(fake_url: str) -> dict[str, str]:
    """The tools the tests use: the ticket service, with approval for the `legal` queue and
    short downstream timeouts so a held request settles within a test."""
    create = f"""
name: tickets.create
version: "1"
purpose: Create one support ticket for one workflow step.
use_when:
  - The workflow has a new issue to record.
do_not_use_when:
  - The agent only wants to know whether a ticket exists.
effect_class: key_based
operation_key:
  supplied_by: application
  scope: [tenant, environment, workflow_id, step_id]
  reused_for_retry: true
input_schema:
  type: object
  properties:
    queue_id:
      type: string
      minLength: 1
      maxLength: 64
    subject:
      type: string
      minLength: 1
      maxLength: 200
    body:
      type: string
      maxLength: 20000
  required: [subject, body]
  additionalProperties: false
request_fingerprint:
  fields: [queue_id, subject, body]
  defaults:
    queue_id: support
  mismatch: rejected
downstream:
  deduplicates_by_key: true
  receipt_lookup: true
  receipt: ticket_id
  http:
    method: POST
    url: {fake_url}/tickets
    idempotency_header: Idempotency-Key
    reference: /ticket_id
    error_message: /error
    lookup:
      url: {fake_url}/tickets/by-key/{{operation_key}}
    timeouts:
      connect: 2s
      total: 3s
security:
  approval: when_matches
  approval_when:
    queue_id: [legal]
retention:
  record_ttl: 1d
  tombstone_ttl: 7d
  late_arrival: reject
  max_retry_window: 1d
owner:
  reconciliation: tests
  next_review: "2027-01-01"
"""
    get = f"""
name: tickets.get
version: "1"
purpose: Read one ticket. No effect.
use_when:
  - The agent needs a ticket's state.
do_not_use_when:
  - The agent wants to change the ticket.
effect_class: read
input_schema:
  type: object
  properties:
    ticket_id:
      type: string
      pattern: "^ticket_[0-9]+$"
  required: [ticket_id]
  additionalProperties: false
downstream:
  http:
    method: GET
    url: {fake_url}/tickets/{{ticket_id}}
    reference: /ticket_id
owner:
  reconciliation: tests
  next_review: "2027-01-01"
"""
    email = f"""
name: emails.send
version: "1"
purpose: Send one email to one recipient.
use_when:
  - The workflow decided a customer must be told something.
do_not_use_when:
  - The agent wants to check whether a message went out.
effect_class: irreversible
operation_key:
  supplied_by: application
  scope: [tenant, environment, workflow_id, step_id]
  reused_for_retry: true
input_schema:
  type: object
  properties:
    to:
      type: string
      minLength: 3
    subject:
      type: string
      minLength: 1
    body:
      type: string
  required: [to, subject, body]
  additionalProperties: false
request_fingerprint:
  fields: [to, subject, body]
  mismatch: rejected
downstream:
  deduplicates_by_key: false
  receipt_lookup: true
  receipt: message id
  http:
    url: {fake_url}/emails
    reference: /message_id
    error_message: /error
    lookup:
      url: {fake_url}/emails/by-key/{{operation_key}}
    timeouts:
      connect: 2s
      total: 3s
security:
  approval: never
retention:
  record_ttl: 1d
  tombstone_ttl: 7d
  late_arrival: tombstone
  max_retry_window: 1d
owner:
  reconciliation: tests
  next_review: "2027-01-01"
"""
    return {"tickets.create.yaml": create, "tickets.get.yaml": get, "emails.send.yaml": email}


class Gateway:
    """`idemgate serve --config` on a free loopback port over a fresh SQLite file."""

    def __init__(self, directory: Path, fake_url: str) -> None:
        binary = gateway_binary()
        if not binary.is_file() or not os.access(binary, os.X_OK):
            raise RuntimeError(
                f"the idemgate binary is missing at {binary}: set IDEMGATE_BIN or build it"
            )
        self.directory = directory
        (directory / "contracts").mkdir(parents=True, exist_ok=True)
        for name, text in contracts(fake_url).items():
            (directory / "contracts" / name).write_text(text)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = directory / "gate.toml"
        config.write_text(
            f"""listen = "127.0.0.1:{self.port}"
environment = "{ENVIRONMENT}"
store = "sqlite://{directory}/gate.sqlite"
contracts = ["{directory}/contracts/*.yaml"]
sandbox = false

# Recovery would settle unknown operations by itself; the tests settle them by hand.
[recovery]
interval_seconds = 3600

[[tenants]]
name = "{TENANT}"
[[tenants.tokens]]
name = "agent"
sha256 = "{_sha256(AGENT_TOKEN)}"
role = "agent"
[[tenants.tokens]]
name = "operator"
sha256 = "{_sha256(OPERATOR_TOKEN)}"
role = "operator"
"""
        )
        self.log_path = directory / "serve.log"
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen(
            [str(binary), "serve", "--config", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self._wait_healthy()

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + STARTUP_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"idemgate serve did not become healthy; its log:\n{self.log()}")

    def audit_log(self) -> list[dict[str, Any]]:
        """The store's audit log of operator actions, through `idemgate audit export`."""
        import json

        out = subprocess.run(
            [str(gateway_binary()), "audit", "export", "--store", f"sqlite://{self.directory}/gate.sqlite"],
            capture_output=True,
            check=True,
            timeout=30,
        ).stdout.decode()
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self._log.close()


class LosingProxy:
    """An HTTP proxy on 127.0.0.1:0 in front of the gateway. Each request is forwarded whole;
    while `lose` is above zero, the gateway's answer is read and then thrown away, and the
    client's connection closed without a byte: the request happened, its answer was lost."""

    def __init__(self, upstream_port: int) -> None:
        self.lose = 0
        self.forwarded = 0
        self.lost = 0
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {
                    k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")
                }
                upstream = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=60)
                try:
                    upstream.request(self.command, self.path, body=body, headers=headers)
                    answer = upstream.getresponse()
                    data = answer.read()
                finally:
                    upstream.close()
                with proxy._lock:
                    proxy.forwarded += 1
                    losing = proxy.lose > 0
                    if losing:
                        proxy.lose -= 1
                        proxy.lost += 1
                self.close_connection = True
                if losing:
                    try:
                        self.connection.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                    return
                self.send_response(answer.status)
                for name, value in answer.getheaders():
                    if name.lower() not in ("connection", "content-length", "transfer-encoding"):
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(data)

            do_GET = _forward
            do_POST = _forward

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)
