"""What a tool adapter hands back to a model: the outcome as JSON text, with a `meaning` member
that says in one or two sentences what the label means for the model's next move."""

from __future__ import annotations

import json
from typing import Any

from ._outcomes import (
    AnswerLost,
    Applied,
    GatewayUnavailable,
    InFlight,
    Outcome,
    Rejected,
    Replayed,
    TransportError,
    Unknown,
)


def meaning(outcome: Outcome) -> str:
    """One or two sentences for a model about what this outcome means."""
    ref = ""
    if isinstance(outcome, (Applied, Replayed)) and outcome.effect_reference:
        ref = f" (reference {outcome.effect_reference})"
    if isinstance(outcome, Applied):
        return (
            f"Done: the action was carried out exactly once{ref}. Do not call this tool again "
            "for this step."
        )
    if isinstance(outcome, Replayed):
        return (
            f"Done already: this step had been carried out before{ref}; nothing new happened. "
            "Do not repeat it."
        )
    if isinstance(outcome, InFlight):
        if outcome.awaiting_approval:
            return (
                "Waiting for a person's approval; nothing has happened yet. Tell the user it "
                "awaits approval; do not call this tool again with other arguments to get around it."
            )
        wait = f" about {outcome.retry_after} seconds" if outcome.retry_after else ""
        return (
            "Still in progress; nothing new was started. If you need the result, wait"
            f"{wait} and call again with the same arguments: it is the same operation."
        )
    if isinstance(outcome, Rejected):
        if outcome.code in ("approval_denied", "approval_expired"):
            return (
                f"Rejected ({outcome.code}): {outcome.message}. Nothing happened. A person "
                "decided against it; do not try again or another way. Tell the user."
            )
        if outcome.safe_to_repeat:
            return (
                f"Rejected ({outcome.code}): {outcome.message}. Nothing happened; you may "
                "correct the request and try again."
            )
        return (
            f"Rejected ({outcome.code}): {outcome.message}. Do not repeat this call; an earlier "
            "request under this step stands. Ask a person if this looks wrong."
        )
    if isinstance(outcome, Unknown):
        return (
            "Outcome unknown: the action may or may not have happened and this cannot be "
            "proved yet. Do not retry it and do not try another way; an operator will "
            "reconcile this operation. Tell the user it is being checked."
        )
    raise TypeError(f"not an outcome: {outcome!r}")


def outcome_text(outcome: Outcome) -> str:
    """The outcome as JSON text for a model: label, key, reference, result, and meaning."""
    body: dict[str, Any] = {
        "outcome": outcome.label,
        "operation_key": outcome.operation_key,
        "safe_to_repeat": outcome.safe_to_repeat,
        "next_action": outcome.next_action,
    }
    if isinstance(outcome, (Applied, Replayed)):
        body["effect_reference"] = outcome.effect_reference
        body["result"] = outcome.result
    elif isinstance(outcome, InFlight):
        body["retry_after_seconds"] = outcome.retry_after
    elif isinstance(outcome, Rejected):
        body["error"] = {"code": outcome.code, "message": outcome.message}
    body["meaning"] = meaning(outcome)
    return json.dumps(body, ensure_ascii=False, sort_keys=False, default=str)


def transport_text(error: TransportError) -> str:
    """What a model is told when the gateway's answer did not arrive."""
    if isinstance(error, GatewayUnavailable):
        body = {
            "outcome": None,
            "error": {"code": "gateway_unavailable", "message": str(error)},
            "meaning": (
                "The tool service could not be reached; nothing was sent and nothing happened. "
                "You may call this tool again later with the same arguments."
            ),
        }
    elif isinstance(error, AnswerLost):
        body = {
            "outcome": None,
            "error": {"code": "answer_lost", "message": str(error)},
            "meaning": (
                "The answer was lost, so it is not known yet whether the action happened. "
                "Calling this tool again with exactly the same arguments is safe: it is the same "
                "operation and cannot happen twice."
            ),
        }
    else:
        body = {"outcome": None, "error": {"code": "transport", "message": str(error)}}
    return json.dumps(body, ensure_ascii=False)
