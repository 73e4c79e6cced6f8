"""A fake system of record over real loopback HTTP: a ticket service that deduplicates on the
`Idempotency-Key` header, an email service that does not, both with a receipt lookup by key,
and both counting their own effects.

It counts on its side, by the key each request carried, so a green answer at the client can
never hide a second ticket. Faults are scripted per workflow id (the third part of the operation
key the gateway sends), so tests sharing one gateway and one fake never take each other's.

Routes (the shapes of `contracts/tickets.create.yaml` and `tickets.get.yaml`):

| route | what it does |
|---|---|
| `POST /tickets` | creates a ticket once per key: `201 {"ticket_id", "key"}` (`200` for a key seen before) |
| `GET /tickets/by-key/{key}` | receipt lookup: `200` as above, `404`, or `503` while the workflow's lookup is down |
| `GET /tickets/{id}` | reads a ticket: `200 {"ticket_id", "subject", "status"}` or `404` |
| `POST /emails` | sends an email — every request is a new one, key or not: `200 {"message_id", "key"}` |
| `GET /emails/by-key/{key}` | the first email sent under the key: `200`, `404`, or `503` as above |

Scripted faults apply to the next `POST` of the workflow on either route.
"""

from __future__ import annotations

import json
import socket
import threading
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Optional
from urllib.parse import unquote

# The longest any scripted hold may last: a forgotten release cannot hang a run.
MAX_HOLD_SECONDS = 60.0


@dataclass
class Fault:
    """What the fake does with the next `POST` of one workflow."""

    kind: str  # drop | hold | hang | refuse
    release: Optional[threading.Event] = None
    seconds: float = 0.0

    @staticmethod
    def drop() -> "Fault":
        """Commit the effect, then close the connection without a byte of answer."""
        return Fault("drop")

    @staticmethod
    def hold(release: threading.Event) -> "Fault":
        """Commit the effect, then hold the answer until `release` is set (bounded)."""
        return Fault("hold", release=release)

    @staticmethod
    def hang(seconds: float) -> "Fault":
        """Commit nothing, hold the request `seconds`, then answer 503."""
        return Fault("hang", seconds=seconds)

    @staticmethod
    def refuse() -> "Fault":
        """Commit nothing: a deterministic 422 refusal."""
        return Fault("refuse")


@dataclass
class Effect:
    """One ticket created or one email sent."""

    kind: str  # ticket | email
    key: str
    reference: str
    body: Any


@dataclass
class Seen:
    method: str
    path: str
    key: Optional[str]


def workflow_of(key: Optional[str]) -> Optional[str]:
    parts = (key or "").split(":")
    return parts[2] if len(parts) == 4 else None


@dataclass
class _State:
    lock: threading.Lock = field(default_factory=threading.Lock)
    effects: list[Effect] = field(default_factory=list)
    by_key: dict[tuple[str, str], Effect] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)
    faults: dict[str, deque[Fault]] = field(default_factory=dict)
    lookup_down: set[str] = field(default_factory=set)
    committed: dict[str, threading.Event] = field(default_factory=dict)
    listeners: list[Callable[[Effect], None]] = field(default_factory=list)


class FakeSystemOfRecord:
    """The running fake. `start()` binds 127.0.0.1:0; `stop()` shuts it down."""

    def __init__(self) -> None:
        self._state = _State()
        state = self._state

        class Handler(_Handler):
            pass

        Handler.state = state
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self) -> "FakeSystemOfRecord":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    # -- scripting -----------------------------------------------------------------------------

    def script(self, workflow_id: str, *faults: Fault) -> None:
        """Queues faults for the workflow's next `POST /tickets` requests, in order."""
        with self._state.lock:
            self._state.faults.setdefault(workflow_id, deque()).extend(faults)

    def set_lookup(self, workflow_id: str, up: bool) -> None:
        """Switches the receipt lookup for keys of this workflow: down answers 503."""
        with self._state.lock:
            if up:
                self._state.lookup_down.discard(workflow_id)
            else:
                self._state.lookup_down.add(workflow_id)

    def on_commit(self, listener: Callable[[Effect], None]) -> None:
        """Calls `listener` (from the request's thread) after each new ticket is committed."""
        with self._state.lock:
            self._state.listeners.append(listener)

    def wait_committed(self, workflow_id: str, timeout: float) -> bool:
        """Waits until a ticket of this workflow exists; False after `timeout` seconds."""
        return self._committed_event(workflow_id).wait(timeout)

    def _committed_event(self, workflow_id: str) -> threading.Event:
        with self._state.lock:
            return self._state.committed.setdefault(workflow_id, threading.Event())

    # -- counting ------------------------------------------------------------------------------

    def effects(self, workflow_id: str, kind: Optional[str] = None) -> list[Effect]:
        """Every effect (of `kind`, when given) under keys of this workflow."""
        with self._state.lock:
            return [
                e
                for e in self._state.effects
                if workflow_of(e.key) == workflow_id and kind in (None, e.kind)
            ]

    def effect_count(self, workflow_id: str, kind: Optional[str] = None) -> int:
        return len(self.effects(workflow_id, kind))

    def requests(self, workflow_id: Optional[str] = None) -> list[Seen]:
        """Requests received on any route; with a workflow, those carrying its keys."""
        with self._state.lock:
            seen = list(self._state.seen)
        if workflow_id is None:
            return seen
        return [s for s in seen if workflow_of(s.key) == workflow_id]

    def total_requests(self) -> int:
        with self._state.lock:
            return len(self._state.seen)


class _Handler(BaseHTTPRequestHandler):
    state: _State
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        pass

    def _answer(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _drop(self) -> None:
        """Closes the connection with nothing written."""
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            return None

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self._body()
        key = self.headers.get("Idempotency-Key")
        state = self.state
        with state.lock:
            state.seen.append(Seen("POST", self.path, key))
        kinds = {"/tickets": "ticket", "/emails": "email"}
        kind = kinds.get(self.path)
        if kind is None:
            return self._answer(404, {"error": "no such route"})
        if not key:
            return self._answer(400, {"error": "Idempotency-Key is required"})
        workflow = workflow_of(key) or ""
        with state.lock:
            queue = state.faults.get(workflow)
            fault = queue.popleft() if queue else None
        if fault is not None and fault.kind == "refuse":
            return self._answer(422, {"error": "the service refuses this request"})
        if fault is not None and fault.kind == "hang":
            threading.Event().wait(min(fault.seconds, MAX_HOLD_SECONDS))
            try:
                return self._answer(503, {"error": "held, not processed"})
            except OSError:
                return None  # The gateway gave up first.
        effect, created = self._commit(kind, key, body)
        if fault is not None and fault.kind == "drop":
            return self._drop()
        if fault is not None and fault.kind == "hold" and fault.release is not None:
            fault.release.wait(MAX_HOLD_SECONDS)
        if kind == "ticket":
            answer = {"ticket_id": effect.reference, "key": key}
            return self._answer(201 if created else 200, answer)
        self._answer(200, {"message_id": effect.reference, "key": key})

    def _commit(self, kind: str, key: str, body: Any) -> tuple[Effect, bool]:
        """Tickets: one per key. Emails: one per request — the service does not deduplicate,
        which is why the gateway must never send one twice."""
        state = self.state
        with state.lock:
            existing = state.by_key.get((kind, key))
            if kind == "ticket" and existing is not None:
                return existing, False
            number = sum(1 for e in state.effects if e.kind == kind) + 1
            prefix = "ticket" if kind == "ticket" else "message"
            effect = Effect(kind, key, f"{prefix}_{number}", body)
            state.effects.append(effect)
            state.by_key.setdefault((kind, key), effect)
            listeners = list(state.listeners)
            event = state.committed.setdefault(workflow_of(key) or "", threading.Event())
        event.set()
        for listener in listeners:
            listener(effect)
        return effect, True

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        state = self.state
        path = self.path
        for prefix, kind, name in (
            ("/tickets/by-key/", "ticket", "ticket_id"),
            ("/emails/by-key/", "email", "message_id"),
        ):
            if path.startswith(prefix):
                key = unquote(path[len(prefix) :])
                with state.lock:
                    state.seen.append(Seen("GET", path, key))
                    down = workflow_of(key) in state.lookup_down
                    effect = state.by_key.get((kind, key))
                if down:
                    return self._answer(503, {"error": "lookups are down"})
                if effect is None:
                    return self._answer(404, {"error": "nothing under this key"})
                return self._answer(200, {name: effect.reference, "key": key})
        if path.startswith("/tickets/"):
            ticket_id = path[len("/tickets/") :]
            with state.lock:
                state.seen.append(Seen("GET", path, None))
                found = next(
                    (e for e in state.effects if e.kind == "ticket" and e.reference == ticket_id),
                    None,
                )
            if found is None:
                return self._answer(404, {"error": "no such ticket"})
            subject = found.body.get("subject") if isinstance(found.body, dict) else None
            return self._answer(
                200, {"ticket_id": ticket_id, "subject": subject, "status": "open"}
            )
        self._answer(404, {"error": "no such route"})
