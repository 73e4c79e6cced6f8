"""The client over every outcome label, against a real gateway and the fake system of record.

Each scenario asserts two things separately: what the client returned, and how many effects
the fake counted on its own side.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import httpx
import pytest

from fake_sor import FakeSystemOfRecord, Fault
from harness import AGENT_TOKEN, Gateway, LosingProxy, operation_key

import idemgate

TICKET = {"subject": "Refund request", "body": "Order 42 arrived broken."}
EMAIL = {"to": "customer@example.com", "subject": "Your refund", "body": "It is on its way."}
# A ticket for the legal queue, which the contract holds for an operator's approval.
LEGAL = dict(TICKET, queue_id="legal")


def awaiting_approval(client: idemgate.Client, run_id: str) -> tuple[idemgate.InFlight, str]:
    """Invokes the legal ticket as step `s` of `run_id`: in flight, with its operation key."""
    pending = client.invoke("tickets.create", LEGAL, workflow_id=run_id, step_id="s")
    assert isinstance(pending, idemgate.InFlight) and pending.operation_key
    return pending, pending.operation_key


def lose_the_email(fake: FakeSystemOfRecord, workflow_id: str) -> None:
    """The email service sends `workflow_id`'s email and drops its answer, with the lookup
    down. It does not deduplicate, so the gateway may not resend: nothing can prove whether the
    email went out."""
    fake.script(workflow_id, Fault.drop())
    fake.set_lookup(workflow_id, False)


def unknown_email(
    client: idemgate.Client, fake: FakeSystemOfRecord, run_id: str
) -> tuple[idemgate.Unknown, str]:
    """Step `notify` of `run_id` sends the email whose answer is lost: unknown, with its key."""
    lose_the_email(fake, run_id)
    unknown = client.invoke("emails.send", EMAIL, workflow_id=run_id, step_id="notify")
    assert isinstance(unknown, idemgate.Unknown) and unknown.operation_key
    return unknown, unknown.operation_key


def test_applied_then_replayed(client: idemgate.Client, fake: FakeSystemOfRecord, run_id: str) -> None:
    first = client.invoke("tickets.create", TICKET, workflow_id=run_id, step_id="record_issue")
    assert isinstance(first, idemgate.Applied)
    assert first.operation_key == operation_key(run_id, "record_issue")
    assert first.done and first.safe_to_repeat is False and first.next_action == "none"
    assert fake.effect_count(run_id) == 1
    assert first.effect_reference == fake.effects(run_id)[0].reference

    again = client.invoke("tickets.create", TICKET, workflow_id=run_id, step_id="record_issue")
    assert isinstance(again, idemgate.Replayed)
    assert again.effect_reference == first.effect_reference
    assert again.result == first.result
    assert again.raw["outcome"] == "replayed"
    assert fake.effect_count(run_id) == 1
    # Only the first delivery reached the ticket service.
    assert len(fake.requests(run_id)) == 1


def test_identity_from_workflow_and_step_scopes(
    client: idemgate.Client, fake: FakeSystemOfRecord, run_id: str
) -> None:
    with client.workflow(run_id):
        first = client.step("record_issue").invoke("tickets.create", TICKET)
        with client.step("record_issue"):
            again = client.invoke("tickets.create", TICKET)
        other = client.step("second_issue").invoke("tickets.create", TICKET)
    assert isinstance(first, idemgate.Applied)
    assert isinstance(again, idemgate.Replayed)
    assert isinstance(other, idemgate.Applied)
    assert first.operation_key == operation_key(run_id, "record_issue")
    assert other.operation_key == operation_key(run_id, "second_issue")
    assert fake.effect_count(run_id) == 2
    assert idemgate.current_workflow_id() is None


def test_async_client_and_scopes_per_task(
    gateway: Gateway, fake: FakeSystemOfRecord, run_id: str
) -> None:
    async def one(client: idemgate.AsyncClient, workflow_id: str) -> idemgate.Outcome:
        async with client.workflow(workflow_id):
            await asyncio.sleep(0)  # Let the other task run inside its own scope.
            return await client.step("record_issue").invoke("tickets.create", TICKET)

    async def main() -> list[idemgate.Outcome]:
        async with idemgate.AsyncClient(gateway.url, AGENT_TOKEN) as client:
            runs = [f"{run_id}-a", f"{run_id}-b", f"{run_id}-a"]
            return list(await asyncio.gather(*(one(client, r) for r in runs)))

    outcomes = asyncio.run(main())
    keys = [o.operation_key for o in outcomes]
    assert keys == [
        operation_key(f"{run_id}-a", "record_issue"),
        operation_key(f"{run_id}-b", "record_issue"),
        operation_key(f"{run_id}-a", "record_issue"),
    ]
    assert sorted(o.label for o in outcomes) in (
        ["applied", "applied", "replayed"],
        ["applied", "applied", "in_flight"],
    )
    assert fake.effect_count(f"{run_id}-a") == 1
    assert fake.effect_count(f"{run_id}-b") == 1


def test_in_flight_while_the_first_delivery_is_held(
    client: idemgate.Client, gateway: Gateway, fake: FakeSystemOfRecord, run_id: str
) -> None:
    release = threading.Event()
    fake.script(run_id, Fault.hold(release))
    first: dict[str, Any] = {}

    def deliver() -> None:
        with idemgate.Client(gateway.url, AGENT_TOKEN) as c:
            first["outcome"] = c.invoke("tickets.create", TICKET, workflow_id=run_id, step_id="s")

    thread = threading.Thread(target=deliver)
    thread.start()
    try:
        assert fake.wait_committed(run_id, 10)
        second = client.invoke("tickets.create", TICKET, workflow_id=run_id, step_id="s")
        assert isinstance(second, idemgate.InFlight)
        assert second.http_status == 409 and second.next_action == "poll"
        assert not second.awaiting_approval and not second.done
        assert second.retry_after is not None and second.retry_after > 0
        with pytest.raises(idemgate.InFlightError) as raised:
            second.raise_for_outcome()
        assert raised.value.outcome is second
    finally:
        release.set()
        thread.join(timeout=20)
    assert isinstance(first["outcome"], idemgate.Applied)
    assert fake.effect_count(run_id) == 1


def test_wait_returns_the_settled_outcome_instead_of_in_flight(
    client: idemgate.Client, gateway: Gateway, fake: FakeSystemOfRecord, run_id: str
) -> None:
    release = threading.Event()
    fake.script(run_id, Fault.hold(release))
    thread = threading.Thread(
        target=lambda: idemgate.Client(gateway.url, AGENT_TOKEN).invoke(
            "tickets.create", TICKET, workflow_id=run_id, step_id="s"
        )
    )
    thread.start()
    timer = threading.Timer(1.0, release.set)
    try:
        assert fake.wait_committed(run_id, 10)
        without = client.invoke("tickets.create", TICKET, workflow_id=run_id, step_id="s")
        assert isinstance(without, idemgate.InFlight)
        timer.start()
        started = time.monotonic()
        waited = client.invoke("tickets.create", TICKET, workflow_id=run_id, step_id="s", wait=20)
        took = time.monotonic() - started
    finally:
        release.set()
        timer.cancel()
        thread.join(timeout=20)
    assert isinstance(waited, (idemgate.Applied, idemgate.Replayed)), waited
    assert waited.effect_reference == fake.effects(run_id)[0].reference
    assert took >= 0.9  # It did wait for the held effect.
    assert fake.effect_count(run_id) == 1


def test_awaiting_approval_then_approved_once(
    client: idemgate.Client, operator: idemgate.Client, fake: FakeSystemOfRecord, run_id: str
) -> None:
    pending, key = awaiting_approval(client, run_id)
    assert pending.http_status == 202 and pending.awaiting_approval
    assert pending.next_action == "ask_for_approval"
    assert fake.effect_count(run_id) == 0

    queue = operator.operations(status="awaiting_approval")
    assert key in [r.operation_key for r in queue.operations]

    approved = operator.approve(key)
    assert isinstance(approved, idemgate.Applied)
    assert fake.effect_count(run_id) == 1

    again = client.invoke("tickets.create", LEGAL, workflow_id=run_id, step_id="s")
    assert isinstance(again, idemgate.Replayed)
    assert again.effect_reference == approved.effect_reference
    assert fake.effect_count(run_id) == 1


def test_denied_approval_has_no_effect(
    client: idemgate.Client, operator: idemgate.Client, fake: FakeSystemOfRecord, run_id: str
) -> None:
    _, key = awaiting_approval(client, run_id)
    denied = operator.deny(key, reason="not for legal")
    assert isinstance(denied, idemgate.Rejected)
    assert denied.code == "approval_denied" and denied.http_status == 403
    later = client.invoke("tickets.create", LEGAL, workflow_id=run_id, step_id="s")
    assert isinstance(later, idemgate.Rejected) and later.code == "approval_denied"
    assert fake.effect_count(run_id) == 0


def test_mismatch_under_the_same_key_is_rejected_and_not_safe_to_repeat(
    client: idemgate.Client, fake: FakeSystemOfRecord, run_id: str
) -> None:
    client.invoke("tickets.create", TICKET, workflow_id=run_id, step_id="s").raise_for_outcome()
    other = dict(TICKET, subject="Something else")
    mismatch = client.invoke("tickets.create", other, workflow_id=run_id, step_id="s")
    assert isinstance(mismatch, idemgate.Rejected)
    assert mismatch.code == "idempotency_key_reused_with_different_request"
    assert mismatch.http_status == 422
    assert mismatch.safe_to_repeat is False
    assert mismatch.problem_type is not None
    assert mismatch.problem_type.endswith("/problems/idempotency_key_reused_with_different_request")
    assert httpx.get(mismatch.problem_type).status_code == 200, "the problem type is a page"
    assert mismatch.raw["status"] == 422 and mismatch.raw["outcome"] == "rejected"
    assert fake.effect_count(run_id) == 1


def test_invalid_arguments_are_rejected_before_any_effect(
    client: idemgate.Client, fake: FakeSystemOfRecord, run_id: str
) -> None:
    bad = client.invoke("tickets.create", {"subject": "no body"}, workflow_id=run_id, step_id="s")
    assert isinstance(bad, idemgate.Rejected)
    assert bad.code == "invalid_arguments" and bad.http_status == 400
    assert bad.safe_to_repeat is True
    assert fake.requests(run_id) == []


def test_unknown_when_the_effect_committed_and_its_answer_was_lost(
    client: idemgate.Client, operator: idemgate.Client, fake: FakeSystemOfRecord, run_id: str
) -> None:
    unknown, key = unknown_email(client, fake, run_id)
    assert unknown.http_status == 202 and unknown.next_action == "reconcile"
    assert unknown.safe_to_repeat is False and unknown.code == "outcome_unknown"
    assert fake.effect_count(run_id) == 1

    # Asking again never sends it again: the answer stays unknown.
    again = client.invoke("emails.send", EMAIL, workflow_id=run_id, step_id="notify")
    assert isinstance(again, idemgate.Unknown)
    assert fake.effect_count(run_id) == 1

    queue = operator.operations(status="unknown", tool="emails.send")
    assert key in [r.operation_key for r in queue.operations]

    # The lookup comes back; the operator asks the gateway to look the receipt up now.
    fake.set_lookup(run_id, True)
    settled = operator.reconcile(key)
    assert settled.done
    assert settled.effect_reference == fake.effects(run_id)[0].reference  # type: ignore[union-attr]
    after = client.invoke("emails.send", EMAIL, workflow_id=run_id, step_id="notify")
    assert isinstance(after, idemgate.Replayed)
    assert fake.effect_count(run_id) == 1


def test_operator_resolves_an_unknown_as_applied(
    client: idemgate.Client, operator: idemgate.Client, fake: FakeSystemOfRecord, run_id: str
) -> None:
    unknown, key = unknown_email(client, fake, run_id)
    with pytest.raises(idemgate.UnknownOutcomeError) as raised:
        unknown.raise_for_outcome()
    assert "reconcile" in str(raised.value)

    sent = fake.effects(run_id)[0].reference
    resolved = operator.resolve_applied(key, sent, {"message_id": sent})
    assert resolved.done
    view = client.operation(key)
    assert view.record_status == "applied"
    assert view.receipt is not None and view.receipt.reference == sent
    assert isinstance(view.outcome, idemgate.Replayed)
    assert [e.kind for e in view.events][:1] == ["proposed"]

    replay = client.invoke("emails.send", EMAIL, workflow_id=run_id, step_id="notify")
    assert isinstance(replay, idemgate.Replayed) and replay.effect_reference == sent
    assert fake.effect_count(run_id) == 1


def test_operator_resolves_an_unknown_as_not_applied_and_it_runs_once(
    client: idemgate.Client, operator: idemgate.Client, fake: FakeSystemOfRecord, run_id: str
) -> None:
    # The service holds the request past the gateway's timeout without sending anything.
    fake.script(run_id, Fault.hang(4.0))
    fake.set_lookup(run_id, False)
    unknown = client.invoke("emails.send", EMAIL, workflow_id=run_id, step_id="notify")
    assert isinstance(unknown, idemgate.Unknown) and unknown.operation_key
    assert fake.effect_count(run_id) == 0

    operator.resolve_not_applied(unknown.operation_key)
    assert fake.effect_count(run_id) == 0
    fake.set_lookup(run_id, True)
    ran = client.invoke("emails.send", EMAIL, workflow_id=run_id, step_id="notify")
    assert isinstance(ran, idemgate.Applied)
    assert fake.effect_count(run_id) == 1


def test_raise_on_turns_outcomes_into_exceptions(
    gateway: Gateway, fake: FakeSystemOfRecord, run_id: str
) -> None:
    with idemgate.Client(gateway.url, AGENT_TOKEN, raise_on="not_done") as strict:
        done = strict.invoke("tickets.create", TICKET, workflow_id=run_id, step_id="s")
        assert isinstance(done, idemgate.Applied)
        with pytest.raises(idemgate.RejectedError) as raised:
            strict.invoke("tickets.create", dict(TICKET, body="x"), workflow_id=run_id, step_id="s")
        error = raised.value
        assert isinstance(error, idemgate.IdemgateError)
        assert error.code == "idempotency_key_reused_with_different_request"
        assert error.outcome.http_status == 422 and error.safe_to_repeat is False
        # A call may choose otherwise.
        returned = strict.invoke(
            "tickets.create", dict(TICKET, body="x"), workflow_id=run_id, step_id="s", raise_on=()
        )
        assert isinstance(returned, idemgate.Rejected)
    with idemgate.Client(gateway.url, AGENT_TOKEN, raise_on=["unknown"]) as some:
        lose_the_email(fake, f"{run_id}-mail")
        with pytest.raises(idemgate.UnknownOutcomeError) as unknown:
            some.invoke("emails.send", EMAIL, workflow_id=f"{run_id}-mail", step_id="s")
        assert unknown.value.outcome.next_action == "reconcile"
    with pytest.raises(ValueError, match="applied"):
        idemgate.Client(gateway.url, AGENT_TOKEN, raise_on=["applied"])
    assert fake.effect_count(run_id) == 1
    assert fake.effect_count(f"{run_id}-mail") == 1


def test_a_lost_answer_is_resent_under_the_same_identity(
    gateway: Gateway, proxy: LosingProxy, fake: FakeSystemOfRecord, run_id: str
) -> None:
    with idemgate.Client(proxy.url, AGENT_TOKEN) as through:
        proxy.lose = 1
        with pytest.raises(idemgate.AnswerLost) as lost:
            through.invoke("tickets.create", TICKET, workflow_id=run_id, step_id="s")
        assert run_id in str(lost.value) and "same workflow_id and step_id" in str(lost.value)
        # The request had happened: the ticket exists once.
        assert fake.effect_count(run_id) == 1

        proxy.lose = 2
        outcome = through.invoke_resending(
            "tickets.create", TICKET, workflow_id=run_id, step_id="s", attempts=3, backoff=0.05
        )
        assert isinstance(outcome, idemgate.Replayed)
        assert proxy.lost == 3
        assert fake.effect_count(run_id) == 1

        proxy.lose = 5
        with pytest.raises(idemgate.AnswerLost):
            through.invoke_resending(
                "tickets.create", TICKET, workflow_id=run_id, step_id="s", attempts=2, backoff=0.05
            )
        assert proxy.lose == 3  # Exactly two attempts were made.
        with pytest.raises(idemgate.MissingIdentityError):
            through.invoke_resending("tickets.get", {"ticket_id": "ticket_1"})
    assert fake.effect_count(run_id) == 1


def test_tools_and_a_read_tool_without_identity(
    client: idemgate.Client, fake: FakeSystemOfRecord, run_id: str
) -> None:
    names = {t.name: t for t in client.tools()}
    assert {"tickets.create", "tickets.get", "emails.send"} <= set(names)
    create = client.tool("tickets.create")
    assert create.effect_class == "key_based" and create.operation_identity == "required"
    assert create.approval == "when_matches" and create.needs_identity
    assert create.input_schema["required"] == ["subject", "body"]
    assert "ticket" in create.description.lower()
    read = names["tickets.get"]
    assert read.effect_class == "read" and not read.needs_identity

    made = client.invoke("tickets.create", TICKET, workflow_id=run_id, step_id="s")
    assert isinstance(made, idemgate.Applied) and made.effect_reference
    got = client.invoke("tickets.get", {"ticket_id": made.effect_reference})
    assert isinstance(got, idemgate.Applied)
    assert got.result["subject"] == TICKET["subject"]
    assert fake.effect_count(run_id) == 1


def test_approval_bound_to_the_reviewed_fingerprint(
    client: idemgate.Client, operator: idemgate.Client, fake: FakeSystemOfRecord, run_id: str
) -> None:
    _, key = awaiting_approval(client, run_id)
    reviewed = operator.operation(key)
    assert reviewed.record_status == "awaiting_approval"
    wrong = "sha256:" + "0" * 64
    refused = operator.approve(key, fingerprint=wrong)
    assert isinstance(refused, idemgate.Rejected)
    assert fake.effect_count(run_id) == 0
    approved = operator.approve(key, fingerprint=reviewed.record.fingerprint)
    assert isinstance(approved, idemgate.Applied)
    assert fake.effect_count(run_id) == 1


def test_async_operator_settles_an_unknown_and_approves(
    gateway: Gateway, fake: FakeSystemOfRecord, run_id: str
) -> None:
    from harness import OPERATOR_TOKEN

    mail, legal = f"{run_id}-mail", f"{run_id}-legal"
    lose_the_email(fake, mail)

    async def main() -> tuple[idemgate.Outcome, ...]:
        async with idemgate.AsyncClient(gateway.url, AGENT_TOKEN) as agent, idemgate.AsyncClient(
            gateway.url, OPERATOR_TOKEN
        ) as op:
            unknown = await agent.invoke("emails.send", EMAIL, workflow_id=mail, step_id="s")
            assert isinstance(unknown, idemgate.Unknown) and unknown.operation_key
            page = await op.operations(status="unknown", tool="emails.send", limit=500)
            assert unknown.operation_key in [r.operation_key for r in page.operations]
            sent = fake.effects(mail)[0].reference
            resolved = await op.resolve_applied(unknown.operation_key, sent, {"message_id": sent})
            pending = await agent.invoke("tickets.create", LEGAL, workflow_id=legal, step_id="s")
            assert isinstance(pending, idemgate.InFlight) and pending.operation_key
            approved = await op.approve(pending.operation_key)
            view = await agent.operation(pending.operation_key)
            assert view.record_status == "applied"
            return resolved, approved

    resolved, approved = asyncio.run(main())
    assert resolved.done and approved.done
    assert fake.effect_count(mail) == 1
    assert fake.effect_count(legal) == 1


def test_operator_reasons_reach_the_audit_log(
    client: idemgate.Client,
    operator: idemgate.Client,
    gateway: Gateway,
    fake: FakeSystemOfRecord,
    run_id: str,
) -> None:
    """Every operator method's `reason` is what the audit log records, and each action still
    has its effect once at the system of record."""
    _, approve_key = awaiting_approval(client, run_id + "-a")
    approved = operator.approve(approve_key, reason="legal queue reviewed by Ana")
    assert isinstance(approved, idemgate.Applied)
    assert fake.effect_count(run_id + "-a") == 1

    _, deny_key = awaiting_approval(client, run_id + "-d")
    operator.deny(deny_key, reason="duplicate of the earlier request")
    assert fake.effect_count(run_id + "-d") == 0

    _, lookup_key = unknown_email(client, fake, run_id + "-l")
    fake.set_lookup(run_id + "-l", True)
    assert operator.reconcile(lookup_key, reason="receipt service back").done

    _, applied_key = unknown_email(client, fake, run_id + "-r")
    reference = fake.effects(run_id + "-r")[0].reference
    operator.resolve_applied(applied_key, reference, {"sent": True}, reason="seen in the outbox")

    _, not_applied_key = unknown_email(client, fake, run_id + "-n")
    operator.resolve_not_applied(not_applied_key, reason="bounced, never delivered")

    reasons = {(e["operation_key"], e["action"]): e["reason"] for e in gateway.audit_log()}
    assert reasons[(approve_key, "approved")] == "legal queue reviewed by Ana"
    assert reasons[(deny_key, "denied")] == "duplicate of the earlier request"
    assert reasons[(lookup_key, "settled_by_lookup")] == "receipt service back"
    assert reasons[(applied_key, "resolved_applied")] == "seen in the outbox"
    assert reasons[(not_applied_key, "resolved_not_applied")] == "bounced, never delivered"
    for suffix in ("-l", "-r", "-n"):
        assert fake.effect_count(run_id + suffix) == 1, "no action sent the email again"


def test_an_operator_action_without_a_reason_is_recorded_as_such(
    client: idemgate.Client, operator: idemgate.Client, gateway: Gateway, run_id: str
) -> None:
    _, key = awaiting_approval(client, run_id)
    with pytest.raises(ValueError, match="reason"):
        operator.approve(key, reason="  ")
    assert isinstance(operator.approve(key), idemgate.Applied)
    entries = [e for e in gateway.audit_log() if e["operation_key"] == key]
    assert [(e["action"], e["reason"]) for e in entries] == [("approved", "no reason given")]
