"""What the read endpoints answer: tools, operations, pages of operations."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Optional

from ._outcomes import Outcome, ProtocolError, parse_outcome

EffectClass = Literal["read", "natural_idempotent", "key_based", "irreversible"]
OperationIdentity = Literal["required", "optional", "ignored"]
Approval = Literal["never", "always", "when_matches"]


def _need(body: Mapping[str, Any], name: str, kind: type, what: str) -> Any:
    value = body.get(name)
    if not isinstance(value, kind):
        raise ProtocolError(f"{what}: member {name!r} is missing or not a {kind.__name__}")
    return value


def _optional_int(value: Any) -> Optional[int]:
    return None if value is None else int(value)


@dataclass(frozen=True)
class ToolInfo:
    """One loaded tool as `GET /v1/tools` describes it. `description` is written for a model."""

    name: str
    version: str
    description: str
    effect_class: str
    operation_identity: str
    approval: str
    input_schema: Mapping[str, Any]
    raw: Mapping[str, Any] = field(repr=False, compare=False)

    @property
    def needs_identity(self) -> bool:
        return self.operation_identity == "required"

    @classmethod
    def from_json(cls, body: Any) -> "ToolInfo":
        if not isinstance(body, Mapping):
            raise ProtocolError("a tool description is not a JSON object")
        what = "a tool description"
        schema = body.get("input_schema")
        return cls(
            name=_need(body, "name", str, what),
            version=str(body.get("version", "")),
            description=str(body.get("description", "")),
            effect_class=str(body.get("effect_class", "")),
            operation_identity=str(body.get("operation_identity", "required")),
            approval=str(body.get("approval", "never")),
            input_schema=schema if isinstance(schema, Mapping) else {"type": "object"},
            raw=body,
        )


@dataclass(frozen=True)
class Receipt:
    """The downstream's reference for the effect and the replay-safe result kept with it.

    In process, a tool's function returns one (`Receipt(reference=r.id, result={...})`) to
    tell the engine the effect happened, and its `lookup=` returns one for an effect it finds.
    """

    reference: str
    result: Any = None


@dataclass(frozen=True)
class Event:
    """One entry of an operation's append-only trace."""

    kind: str
    at: int
    attempt: int
    worker: str
    detail: Optional[str]


@dataclass(frozen=True)
class OperationRecord:
    """The stored state of an operation (one row of `GET /v1/operations`)."""

    operation_key: str
    tool: str
    tool_version: str
    record_status: str
    fingerprint: str
    attempt: int
    effect_reference: Optional[str]
    job_id: Optional[str]
    approved_by: Optional[str]
    created_at: int
    updated_at: int
    # None while the operation has not settled: its retention counts from settlement.
    expires_at: Optional[int]
    raw: Mapping[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, body: Any) -> "OperationRecord":
        if not isinstance(body, Mapping):
            raise ProtocolError("an operation record is not a JSON object")
        what = "an operation record"
        return cls(
            operation_key=_need(body, "operation_key", str, what),
            tool=_need(body, "tool", str, what),
            tool_version=str(body.get("tool_version", "")),
            record_status=_need(body, "record_status", str, what),
            fingerprint=str(body.get("fingerprint", "")),
            attempt=int(body.get("attempt", 0)),
            effect_reference=body.get("effect_reference"),
            job_id=body.get("job_id"),
            approved_by=body.get("approved_by"),
            created_at=int(body.get("created_at", 0)),
            updated_at=int(body.get("updated_at", 0)),
            expires_at=_optional_int(body.get("expires_at")),
            raw=body,
        )


@dataclass(frozen=True)
class Operation:
    """`GET /v1/operations/{key}`: the record, its receipt, the outcome a delivery would get
    now, and the events that led there."""

    record: OperationRecord
    receipt: Optional[Receipt]
    outcome: Outcome
    events: tuple[Event, ...]
    raw: Mapping[str, Any] = field(repr=False, compare=False)

    @property
    def operation_key(self) -> str:
        return self.record.operation_key

    @property
    def record_status(self) -> str:
        return self.record.record_status

    @classmethod
    def from_json(cls, body: Any, http_status: int) -> "Operation":
        record = OperationRecord.from_json(body)
        receipt_body = body.get("receipt")
        receipt = (
            Receipt(str(receipt_body.get("reference", "")), receipt_body.get("result"))
            if isinstance(receipt_body, Mapping)
            else None
        )
        events = tuple(
            Event(
                kind=str(e.get("kind", "")),
                at=int(e.get("at", 0)),
                attempt=int(e.get("attempt", 0)),
                worker=str(e.get("worker", "")),
                detail=e.get("detail"),
            )
            for e in body.get("events") or []
            if isinstance(e, Mapping)
        )
        return cls(
            record=record,
            receipt=receipt,
            outcome=parse_outcome(body.get("outcome"), http_status),
            events=events,
            raw=body,
        )


@dataclass(frozen=True)
class OperationPage:
    """A page of `GET /v1/operations`, ordered by key. Pass `next_after` as `after` for the
    next page; it is None on the last one."""

    operations: tuple[OperationRecord, ...]
    next_after: Optional[str]
