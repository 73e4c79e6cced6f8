"""How answers become outcomes, as a table: the `outcome` member decides, never the status."""

from __future__ import annotations

from typing import Any, Optional

import pytest

import idemgate
from idemgate import parse_outcome


def body(outcome: Optional[str], **members: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "operation_key": "t:e:w:s",
        "effect_reference": None,
        "safe_to_repeat": False,
        "next_action": "none",
        "retry_after_seconds": None,
        "result": None,
        "error": None,
    }
    if outcome is not None:
        base["outcome"] = outcome
    base.update(members)
    return base


def check(answer: Any, status: int, expect: type, **fields: Any) -> idemgate.Outcome:
    outcome = parse_outcome(answer, status)
    assert type(outcome) is expect
    for name, value in fields.items():
        assert getattr(outcome, name) == value, name
    return outcome


def test_labels() -> None:
    check(body("applied", effect_reference="r1", result={"a": 1}), 200, idemgate.Applied,
          effect_reference="r1", result={"a": 1}, done=True)
    check(body("replayed", effect_reference="r1"), 200, idemgate.Replayed, done=True)
    check(body("in_flight", next_action="poll", retry_after_seconds=3), 409, idemgate.InFlight,
          retry_after=3, awaiting_approval=False, done=False)
    check(body("in_flight", next_action="ask_for_approval"), 202, idemgate.InFlight,
          awaiting_approval=True)
    check(body("unknown", next_action="reconcile",
               error={"code": "outcome_unknown", "message": "lost"}), 202, idemgate.Unknown,
          code="outcome_unknown", done=False)
    check(body("rejected", status=422, type="urn:idemgate:problem:conflict", detail="d",
               error={"code": "conflict", "message": "m"}), 422, idemgate.Rejected,
          code="conflict", message="m", http_status=422, problem_type="urn:idemgate:problem:conflict")


def test_a_202_is_never_success_by_itself() -> None:
    assert not parse_outcome(body("unknown"), 202).done
    assert not parse_outcome(body("in_flight", next_action="ask_for_approval"), 202).done


def test_outcome_wins_over_status_and_old_bodies_still_read() -> None:
    # A problem's `status` is the HTTP number; the label is `outcome`.
    check(body("rejected", status=400, error={"code": "invalid_arguments", "message": "x"}), 400,
          idemgate.Rejected, code="invalid_arguments")
    # An outcome body from before `outcome` existed: `status` was the label.
    check(body(None, status="replayed"), 200, idemgate.Replayed)
    check(body("applied"), 200, idemgate.Applied, next_action="none", safe_to_repeat=False)


def test_retry_after_header_fills_in() -> None:
    outcome = parse_outcome(body("in_flight", next_action="poll"), 409, "7")
    assert isinstance(outcome, idemgate.InFlight) and outcome.retry_after == 7


@pytest.mark.parametrize("answer", [None, [], "applied", body(None), body("done"), body(None, status=404)])
def test_no_label_is_a_protocol_error(answer: Any) -> None:
    with pytest.raises(idemgate.ProtocolError):
        parse_outcome(answer, 200)


def test_raise_for_outcome() -> None:
    applied = parse_outcome(body("applied"), 200)
    assert applied.raise_for_outcome() is applied
    for label, error in (("in_flight", idemgate.InFlightError), ("unknown", idemgate.UnknownOutcomeError),
                         ("rejected", idemgate.RejectedError)):
        outcome = parse_outcome(body(label, error={"code": "conflict", "message": "m"}), 409)
        with pytest.raises(error) as raised:
            outcome.raise_for_outcome()
        assert raised.value.outcome is outcome
        assert isinstance(raised.value, idemgate.IdemgateError)


def test_model_text_says_what_to_do() -> None:
    import json

    said = json.loads(idemgate.outcome_text(parse_outcome(body("unknown", next_action="reconcile"), 202)))
    assert said["outcome"] == "unknown" and "Do not retry" in said["meaning"]
    said = json.loads(idemgate.outcome_text(parse_outcome(body("applied", effect_reference="t1"), 200)))
    assert said["effect_reference"] == "t1" and "exactly once" in said["meaning"]
    denied = body("rejected", safe_to_repeat=True, error={"code": "approval_denied", "message": "no"})
    said = json.loads(idemgate.outcome_text(parse_outcome(denied, 403)))
    assert "do not try again" in said["meaning"]


@pytest.mark.parametrize(
    "part, accepted",
    [
        ("step-1", True),
        ("é" * 32, True),  # 64 bytes
        ("𝄞" * 32, True),  # 128 bytes: the bound itself
        ("𝄞" * 33, False),  # 132 bytes
        ("a" * 128, True),
        ("a" * 129, False),
        ("", False),
        ("a:b", False),
    ],
)
def test_identity_parts_are_bounded_in_bytes_not_characters(part: str, accepted: bool) -> None:
    from idemgate._identity import check_part

    if accepted:
        assert check_part("step_id", part) == part
    else:
        with pytest.raises(idemgate.InvalidIdentityError):
            check_part("step_id", part)
