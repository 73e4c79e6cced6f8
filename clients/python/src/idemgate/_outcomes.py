"""The five outcome labels as five result classes, and the exceptions that carry them.

The gateway labels every answer with the member `outcome`; HTTP status codes are not the
labels (202 is `unknown`, or `in_flight` awaiting approval), so nothing here reads success from
a status code. `parse_outcome` is the one place that turns an answer's body into a class.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Mapping, NoReturn, Sequence, Union

Label = Literal["applied", "replayed", "in_flight", "rejected", "unknown"]
NextAction = Literal["none", "poll", "reconcile", "ask_for_approval", "inspect_operation"]

LABELS: tuple[Label, ...] = ("applied", "replayed", "in_flight", "rejected", "unknown")
_NEXT_ACTIONS: tuple[NextAction, ...] = (
    "none",
    "poll",
    "reconcile",
    "ask_for_approval",
    "inspect_operation",
)

# ---------------------------------------------------------------------------------------------
# Exceptions.


class IdemgateError(Exception):
    """Everything this package raises."""


class OutcomeError(IdemgateError):
    """An outcome raised as an exception (see `raise_on` and `raise_for_outcome`)."""

    outcome: "Outcome"

    def __init__(self, message: str, outcome: "Outcome") -> None:
        super().__init__(message)
        self.outcome = outcome

    @property
    def operation_key(self) -> str | None:
        return self.outcome.operation_key

    @property
    def safe_to_repeat(self) -> bool:
        return self.outcome.safe_to_repeat


class InFlightError(OutcomeError):
    """The operation is still running, or awaits an operator's approval."""

    outcome: "InFlight"


class RejectedError(OutcomeError):
    """The gateway refused the request; `outcome.code` says why."""

    outcome: "Rejected"

    @property
    def code(self) -> str:
        return self.outcome.code


class UnknownOutcomeError(OutcomeError):
    """The effect may have happened and cannot be proved: never resend, an operator reconciles."""

    outcome: "Unknown"


class UnknownToolError(RejectedError):
    """The gateway has no tool of that name loaded (or, in process, the `Local` has no tool of
    that name registered: then `base_url` is None)."""

    def __init__(
        self,
        tool: str,
        outcome: "Rejected",
        base_url: str | None,
        registered: "Sequence[str]" = (),
    ) -> None:
        if base_url is None:
            known = ", ".join(sorted(registered)) or "none yet"
            message = (
                f"no tool named {tool!r} is registered on this Local (registered: {known}); "
                "register one with @local.tool"
            )
        else:
            message = (
                f"the gateway at {base_url} has no tool named {tool!r} "
                f"(GET /v1/tools lists the loaded tools): {outcome.message}"
            )
        super().__init__(message, outcome)
        self.tool = tool


class AuthenticationError(RejectedError):
    """401: the bearer token is missing or not accepted by the gateway."""


class NotFoundError(RejectedError):
    """404: no such operation for this token's tenant (or no such resource)."""


class MissingIdentityError(IdemgateError, ValueError):
    """A tool that needs an operation identity was invoked without one.

    Raised before anything is sent when the client knows the tool needs one, and also when the
    gateway answers `missing_operation_key` (then `outcome` is that answer).
    """

    def __init__(self, tool: str, detail: str, outcome: "Rejected | None" = None) -> None:
        super().__init__(
            f"invoking {tool!r} needs an operation identity (workflow_id and step_id) and "
            f"{detail}. Give one with `client.invoke({tool!r}, arguments, workflow_id=..., "
            f"step_id=...)`, or `with idemgate.workflow(run_id): client.step(name).invoke(...)`; "
            "take both from your workflow's own state (its run id and the step's name), never "
            "from time or randomness."
        )
        self.tool = tool
        self.outcome = outcome


class InvalidIdentityError(IdemgateError, ValueError):
    """A workflow_id or step_id that cannot be part of an operation key."""


class TransportError(IdemgateError):
    """The gateway could not be reached, or its answer did not arrive."""

    def __init__(self, message: str, url: str) -> None:
        super().__init__(message)
        self.url = url


class GatewayUnavailable(TransportError):
    """No connection to the gateway: the request was not delivered, so nothing happened."""


class AnswerLost(TransportError):
    """The request may have reached the gateway but no outcome came back (a timeout, a closed
    connection, a proxy's error page). The effect may have happened. Resending under the *same*
    operation identity is safe — the gateway answers from its record — and is what
    `invoke_resending` does; inventing a new identity is not.
    """

    def __init__(self, message: str, url: str, operation_key: str | None) -> None:
        super().__init__(message, url)
        self.operation_key = operation_key


class ProtocolError(IdemgateError):
    """The gateway answered something that is not an API v1 answer."""


# ---------------------------------------------------------------------------------------------
# Outcomes.


@dataclass(frozen=True, kw_only=True)
class _Outcome:
    """What every outcome has. `raw` is the body as the gateway sent it."""

    label: ClassVar[Label]
    operation_key: str | None
    safe_to_repeat: bool
    next_action: NextAction
    http_status: int
    raw: Mapping[str, Any] = field(repr=False, compare=False)

    @property
    def done(self) -> bool:
        """True for applied and replayed: the effect exists exactly once."""
        return self.label in ("applied", "replayed")


@dataclass(frozen=True, kw_only=True)
class Applied(_Outcome):
    """This delivery performed the effect, and the gateway recorded its receipt."""

    label: ClassVar[Label] = "applied"
    effect_reference: str | None
    result: Any

    def raise_for_outcome(self) -> "Applied":
        return self


@dataclass(frozen=True, kw_only=True)
class Replayed(_Outcome):
    """The effect had already happened; this is its stored receipt and result, no new effect."""

    label: ClassVar[Label] = "replayed"
    effect_reference: str | None
    result: Any

    def raise_for_outcome(self) -> "Replayed":
        return self


@dataclass(frozen=True, kw_only=True)
class InFlight(_Outcome):
    """Another delivery owns the operation, a job is running, or it awaits approval.

    `next_action` is `poll` (ask again after `retry_after` seconds, or pass `wait=`) or
    `ask_for_approval` (an operator must approve it; nothing has happened yet).
    """

    label: ClassVar[Label] = "in_flight"
    retry_after: int | None

    @property
    def awaiting_approval(self) -> bool:
        return self.next_action == "ask_for_approval"

    def raise_for_outcome(self) -> NoReturn:
        raise error_for(self)


@dataclass(frozen=True, kw_only=True)
class Rejected(_Outcome):
    """Refused with no new effect. `code` is the stable error code, `http_status` the HTTP one.

    `safe_to_repeat` is true only when the key never had an effect (an invalid argument, say);
    after a mismatch under a key that has one, it is false.
    """

    label: ClassVar[Label] = "rejected"
    code: str
    message: str
    problem_type: str | None
    effect_reference: str | None
    retry_after: int | None

    def raise_for_outcome(self) -> NoReturn:
        raise error_for(self)


@dataclass(frozen=True, kw_only=True)
class Unknown(_Outcome):
    """The effect may have happened and cannot be proved. Never resend it as a new operation:
    an operator reconciles it (`reconcile`, `resolve_applied`, `resolve_not_applied`)."""

    label: ClassVar[Label] = "unknown"
    code: str | None
    message: str | None

    def raise_for_outcome(self) -> NoReturn:
        raise error_for(self)


Outcome = Union[Applied, Replayed, InFlight, Rejected, Unknown]


def error_for(outcome: Outcome) -> OutcomeError:
    """The exception that carries a not-done outcome (applied and replayed have none)."""
    key = outcome.operation_key or "(no operation key)"
    if isinstance(outcome, InFlight):
        if outcome.awaiting_approval:
            return InFlightError(f"operation {key} awaits an operator's approval", outcome)
        after = f"; ask again after {outcome.retry_after} s" if outcome.retry_after else ""
        return InFlightError(f"operation {key} is still in flight{after}", outcome)
    if isinstance(outcome, Rejected):
        # An in-process outcome has no HTTP status (0).
        http = f", HTTP {outcome.http_status}" if outcome.http_status else ""
        return RejectedError(
            f"operation {key} was rejected ({outcome.code}{http}): {outcome.message}",
            outcome,
        )
    if isinstance(outcome, Unknown):
        return UnknownOutcomeError(
            f"the outcome of operation {key} is unknown: the effect may have happened; do not "
            "resend it, an operator must reconcile it",
            outcome,
        )
    raise TypeError(f"{outcome.label} is not an error")


def _text(body: Mapping[str, Any], name: str) -> str | None:
    value = body.get(name)
    return value if isinstance(value, str) else None


def _int(body: Mapping[str, Any], name: str) -> int | None:
    value = body.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def parse_outcome(
    body: Any, http_status: int, retry_after_header: str | None = None
) -> Outcome:
    """The outcome an API v1 body states, by its `outcome` member.

    Older gateways sent only `status` with the label in outcome bodies; that is accepted when
    it is a label. A body that names no label is a `ProtocolError`.
    """
    if not isinstance(body, Mapping):
        raise ProtocolError(f"the gateway answered HTTP {http_status} without a JSON object")
    label = body.get("outcome")
    if label is None and isinstance(body.get("status"), str):
        label = body["status"]
    if label not in LABELS:
        raise ProtocolError(
            f"the gateway answered HTTP {http_status} with no outcome label "
            f"(outcome={body.get('outcome')!r})"
        )
    next_action = body.get("next_action")
    if next_action not in _NEXT_ACTIONS:
        next_action = "none"
    retry_after = _int(body, "retry_after_seconds")
    if retry_after is None and retry_after_header is not None and retry_after_header.isdigit():
        retry_after = int(retry_after_header)
    common: dict[str, Any] = {
        "operation_key": _text(body, "operation_key"),
        "safe_to_repeat": body.get("safe_to_repeat") is True,
        "next_action": next_action,
        "http_status": http_status,
        "raw": body,
    }
    error = body.get("error") if isinstance(body.get("error"), Mapping) else None
    code = _text(error, "code") if error else None
    message = _text(error, "message") if error else None
    if label == "applied":
        return Applied(
            effect_reference=_text(body, "effect_reference"), result=body.get("result"), **common
        )
    if label == "replayed":
        return Replayed(
            effect_reference=_text(body, "effect_reference"), result=body.get("result"), **common
        )
    if label == "in_flight":
        return InFlight(retry_after=retry_after, **common)
    if label == "unknown":
        return Unknown(code=code, message=message, **common)
    return Rejected(
        code=code or "internal_error",
        message=message or _text(body, "detail") or "",
        problem_type=_text(body, "type"),
        effect_reference=_text(body, "effect_reference"),
        retry_after=retry_after,
        **common,
    )
