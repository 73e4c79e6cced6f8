"""What an in-process tool's function tells the engine, besides returning a `Receipt`.

- `NotSent(reason)` — raised when the function provably sent nothing (it checked first and
  stopped, the connection was refused): the claim is released and the operation is safe to
  repeat; the next delivery runs the function again.
- `Refused(code, message)` — raised for a deterministic refusal by the system of record (a
  declined card, an unknown account): recorded as `failed_permanent`, and every later delivery
  of the same operation is answered with this refusal without calling the function again.
- `Job(job_id)` — returned when the system of record accepted an asynchronous job; the tool's
  `poll=` function is asked about it later, and raises `JobGone` when the job is no longer
  known.
- `AuthRequest` — what a tool's `authorize=` callable is asked about.

Any other exception, and a function that does not return within its timeout, is ambiguous:
the effect may have happened. The engine then looks the receipt up (`lookup=`) or answers
`unknown`, never a refusal and never a second call (unless the tool says its downstream
deduplicates on the key).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional


class NotSent(Exception):
    """The function provably sent nothing: the operation is released and safe to repeat.

    `retry_after` (seconds) is the system of record's advice on when to try again, if any.
    """

    def __init__(self, reason: str = "nothing was sent", *, retry_after: Optional[int] = None) -> None:
        if not isinstance(reason, str):
            raise TypeError(f"NotSent: reason is a str, not {type(reason).__name__}")
        if retry_after is not None and (
            isinstance(retry_after, bool) or not isinstance(retry_after, int) or retry_after < 0
        ):
            raise ValueError("NotSent: retry_after is a whole number of seconds >= 0")
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


class Refused(Exception):
    """A deterministic refusal by the system of record: nothing happened, and nothing will if
    the same request is sent again. Replayed as this refusal (`rejected`,
    `downstream_rejected`, with `code: message` as its message) to every later delivery."""

    def __init__(self, code: str, message: str = "") -> None:
        if not isinstance(code, str) or not code:
            raise ValueError("Refused: code is a non-empty str, such as 'card_declined'")
        if not isinstance(message, str):
            raise TypeError(f"Refused: message is a str, not {type(message).__name__}")
        super().__init__(f"{code}: {message}" if message else code)
        self.code = code
        self.message = message


class JobGone(Exception):
    """Raised by a `poll=` function when the system of record no longer knows the job: its
    outcome cannot be proved, so the operation ends `unknown` for an operator."""

    def __init__(self, reason: str = "the job is no longer known") -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Job:
    """Returned by a tool's function when the system of record accepted an asynchronous job:
    the operation stays in flight, and the tool's `poll=` function finishes it."""

    job_id: str


@dataclass(frozen=True)
class AuthRequest:
    """What a tool's `authorize=` callable decides on, before every effect and every replay
    (an idempotency hit is no bypass). Never the arguments: their fingerprint only.

    Answer `True` to allow, `False` to deny, or a `str` to deny with that reason; an exception
    fails closed (nothing runs, the caller may ask again).
    """

    tenant: str
    actor: str
    role: str
    tool: str
    operation_key: Optional[str]
    fingerprint: str
    stage: Literal["before_effect", "before_replay"]
