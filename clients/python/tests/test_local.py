"""The engine in process (DESIGN §14): each rule of what a guarded function's call means,
counted in a ledger the function itself writes — never read from the outcome alone."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import types
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest

from local_support import Ledger

import idemgate

STEP = ("run-1", "refund")


def key_of(local: idemgate.Local, workflow_id: str = STEP[0], step_id: str = STEP[1]) -> str:
    return f"{local.tenant}:{local.environment}:{workflow_id}:{step_id}"


def refunds(local: idemgate.Local, ledger: Ledger, **options: Any) -> idemgate.LocalTool:
    """The tool most tests use: one refund per step, its receipt the ledger's entry."""

    @local.tool("refunds.issue", fingerprint=["order_id", "amount"], **options)
    def issue_refund(order_id: str, amount: int, *, idempotency_key: str) -> idemgate.Receipt:
        ledger.call(idempotency_key)
        reference = ledger.effect(idempotency_key, {"order_id": order_id, "amount": amount})
        return idemgate.Receipt(reference=reference, result={"status": "succeeded"})

    assert isinstance(issue_refund, idemgate.LocalTool)
    return issue_refund


def test_the_same_step_twice_is_applied_then_replayed_with_one_effect(local: idemgate.Local, ledger: Ledger) -> None:
    issue_refund = refunds(local, ledger)
    with idemgate.workflow(STEP[0]), idemgate.step(STEP[1]):
        first = issue_refund(order_id="pi_42", amount=1200)
        again = issue_refund(order_id="pi_42", amount=1200)
    assert isinstance(first, idemgate.Applied) and isinstance(again, idemgate.Replayed)
    assert first.effect_reference == again.effect_reference == "eff_1"
    assert again.result == {"status": "succeeded"}
    assert first.operation_key == key_of(local)
    assert ledger.count() == 1 and len(ledger.calls) == 1
    # The same call through invoke, as for the gateway client, is the same operation.
    third = local.invoke("refunds.issue", {"order_id": "pi_42", "amount": 1200}, workflow_id=STEP[0], step_id=STEP[1])
    assert isinstance(third, idemgate.Replayed)
    assert ledger.count() == 1


def test_changed_arguments_under_the_same_step_are_rejected_and_not_safe_to_repeat(
    local: idemgate.Local, ledger: Ledger
) -> None:
    issue_refund = refunds(local, ledger)
    with idemgate.workflow(STEP[0]), idemgate.step(STEP[1]):
        issue_refund(order_id="pi_42", amount=1200)
        changed = issue_refund(order_id="pi_42", amount=9900)
    assert isinstance(changed, idemgate.Rejected)
    assert changed.code == "idempotency_key_reused_with_different_request"
    assert changed.safe_to_repeat is False
    assert ledger.count() == 1


def test_not_sent_releases_the_claim_and_the_next_call_runs_it(local: idemgate.Local, ledger: Ledger) -> None:
    down = {"now": True}

    @local.tool("messages.send")
    def send(text: str, *, idempotency_key: str) -> idemgate.Receipt:
        ledger.call(idempotency_key)
        if down["now"]:
            raise idemgate.NotSent("the chat service refused the connection")
        return idemgate.Receipt(ledger.effect(idempotency_key, {"text": text}))

    with idemgate.workflow("run-2"), idemgate.step("notify"):
        released = send(text="hello")
        down["now"] = False
        sent = send(text="hello")
        again = send(text="hello")
    assert isinstance(released, idemgate.Rejected) and released.safe_to_repeat is True
    assert isinstance(sent, idemgate.Applied) and isinstance(again, idemgate.Replayed)
    assert len(ledger.calls) == 2 and ledger.count() == 1


def test_a_refusal_is_replayed_without_calling_the_function_again(local: idemgate.Local, ledger: Ledger) -> None:
    @local.tool("cards.charge")
    def charge(card: str, *, idempotency_key: str) -> idemgate.Receipt:
        ledger.call(idempotency_key)
        raise idemgate.Refused("card_declined", "insufficient funds")

    with idemgate.workflow("run-3"), idemgate.step("charge"):
        first = charge(card="c_1")
        again = charge(card="c_1")
    for outcome in (first, again):
        assert isinstance(outcome, idemgate.Rejected)
        assert outcome.code == "downstream_rejected"
        assert "card_declined: insufficient funds" in outcome.message
    assert len(ledger.calls) == 1


def test_any_other_exception_is_unknown_never_rejected_and_never_called_again(
    local: idemgate.Local, ledger: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    @local.tool("rows.insert")
    def insert(row: dict[str, Any], *, idempotency_key: str) -> idemgate.Receipt:
        ledger.call(idempotency_key)
        ledger.effect(idempotency_key, row)
        raise ConnectionResetError("connection reset by peer after COMMIT")

    with caplog.at_level(logging.WARNING, logger="idemgate"):
        with idemgate.workflow("run-4"), idemgate.step("insert"):
            first = insert(row={"id": 7})
            again = insert(row={"id": 7})
    for outcome in (first, again):
        assert isinstance(outcome, idemgate.Unknown), outcome
        assert outcome.safe_to_repeat is False and outcome.next_action == "reconcile"
    assert len(ledger.calls) == 1 and ledger.count() == 1
    # The exception's type and message are kept as evidence on the record.
    operation = local.operation(key_of(local, "run-4", "insert"))
    assert operation.record_status == "unknown"
    evidence = " ".join(e.detail or "" for e in operation.events)
    assert "ConnectionResetError: connection reset by peer after COMMIT" in evidence
    assert "ConnectionResetError" in caplog.text
    # An operator settles it; from then on it replays.
    settled = local.resolve_applied(key_of(local, "run-4", "insert"), "row-7", {"id": 7}, reason="found the row")
    assert isinstance(settled, idemgate.Replayed)
    with idemgate.workflow("run-4"), idemgate.step("insert"):
        replayed = insert(row={"id": 7})
    assert isinstance(replayed, idemgate.Replayed) and replayed.effect_reference == "row-7"
    assert len(ledger.calls) == 1


def test_an_exception_after_the_effect_is_applied_through_the_lookup(local: idemgate.Local, ledger: Ledger) -> None:
    def find(idempotency_key: str) -> Optional[idemgate.Receipt]:
        reference = ledger.find(idempotency_key)
        return idemgate.Receipt(reference, {"found": True}) if reference else None

    @local.tool("refunds.issue", fingerprint=["order_id"], lookup=find)
    def issue_refund(order_id: str, *, idempotency_key: str) -> idemgate.Receipt:
        ledger.call(idempotency_key)
        ledger.effect(idempotency_key, {"order_id": order_id})
        raise TimeoutError("the provider's answer was lost")

    with idemgate.workflow("run-5"), idemgate.step("refund"):
        first = issue_refund(order_id="pi_1")
        again = issue_refund(order_id="pi_1")
    assert isinstance(first, idemgate.Applied), first
    assert first.effect_reference == "eff_1" and first.result == {"found": True}
    assert isinstance(again, idemgate.Replayed)
    assert len(ledger.calls) == 1 and ledger.count() == 1


def test_an_exception_before_the_effect_with_a_lookup_that_finds_nothing_is_unknown(
    local: idemgate.Local, ledger: Ledger
) -> None:
    @local.tool("refunds.issue", fingerprint=["order_id"], lookup=lambda key: None)
    def issue_refund(order_id: str) -> idemgate.Receipt:
        ledger.call(order_id)
        raise RuntimeError("crashed before sending")

    with idemgate.workflow("run-6"), idemgate.step("refund"):
        first = issue_refund(order_id="pi_1")
        again = issue_refund(order_id="pi_1")
    assert isinstance(first, idemgate.Unknown) and isinstance(again, idemgate.Unknown)
    assert len(ledger.calls) == 1


def test_a_function_past_its_timeout_is_unknown_and_not_called_again(local: idemgate.Local, ledger: Ledger) -> None:
    release = threading.Event()

    @local.tool("reports.render", timeout=0.3)
    def render(name: str, *, idempotency_key: str) -> dict[str, Any]:
        ledger.call(idempotency_key)
        release.wait(10)
        ledger.effect(idempotency_key, {"name": name})
        return {"pages": 3}

    try:
        with idemgate.workflow("run-7"), idemgate.step("render"):
            first = render(name="q3")
            again = render(name="q3")
    finally:
        release.set()
    assert isinstance(first, idemgate.Unknown) and isinstance(again, idemgate.Unknown)
    assert len(ledger.calls) == 1


def test_a_downstream_that_deduplicates_on_the_key_is_resent_with_the_same_key(
    local: idemgate.Local, ledger: Ledger
) -> None:
    """The function's system of record keeps one effect per key; the first answer is lost after
    the commit, and the engine's bounded resend (same key) hears it."""
    committed: dict[str, str] = {}
    lost = {"next": True}

    @local.tool("tickets.create", deduplicates_by_key=True)
    def create(subject: str, *, idempotency_key: str) -> idemgate.Receipt:
        ledger.call(idempotency_key)
        if idempotency_key not in committed:
            committed[idempotency_key] = ledger.effect(idempotency_key, {"subject": subject})
        if lost["next"]:
            lost["next"] = False
            raise ConnectionResetError("answer lost after the commit")
        return idemgate.Receipt(committed[idempotency_key])

    with idemgate.workflow("run-8"), idemgate.step("ticket"):
        outcome = create(subject="broken")
    assert isinstance(outcome, idemgate.Applied), outcome
    assert outcome.effect_reference == "eff_1"
    assert len(ledger.calls) == 2 and ledger.count() == 1


def test_a_key_based_tool_without_identity_is_an_error_naming_it_and_stores_nothing(
    local: idemgate.Local, ledger: Ledger
) -> None:
    issue_refund = refunds(local, ledger)
    with pytest.raises(idemgate.MissingIdentityError, match="refunds.issue"):
        issue_refund(order_id="pi_42", amount=1200)
    with idemgate.workflow("run-9"):
        with pytest.raises(idemgate.MissingIdentityError, match="refunds.issue"):
            issue_refund(order_id="pi_42", amount=1200)
    assert ledger.calls == [] and local.operations().operations == ()


def test_every_shape_of_a_call_names_the_same_operation(local: idemgate.Local, ledger: Ledger) -> None:
    """The usual call (a dict, plain identity parts, no wait) is checked and delivered by the
    extension; any other shape by the package first. Both are one operation."""
    issue_refund = refunds(local, ledger)
    arguments = {"order_id": "pi_42", "amount": 1200}
    with idemgate.workflow(STEP[0]):
        with idemgate.step(STEP[1]):
            first = issue_refund(**arguments)
            scoped = local.invoke("refunds.issue", arguments)
        half = local.invoke("refunds.issue", arguments, step_id=STEP[1])
    explicit = local.invoke("refunds.issue", arguments, workflow_id=STEP[0], step_id=STEP[1])
    mapping = issue_refund.invoke(types.MappingProxyType(arguments), workflow_id=STEP[0], step_id=STEP[1])
    waited = issue_refund.invoke(arguments, workflow_id=STEP[0], step_id=STEP[1], wait=1)
    assert isinstance(first, idemgate.Applied)
    for again in (scoped, half, explicit, mapping, waited):
        assert isinstance(again, idemgate.Replayed), again
        assert again.effect_reference == first.effect_reference and again.operation_key == key_of(local)
    assert ledger.count() == 1 and len(ledger.calls) == 1


def test_a_done_outcome_in_process_is_the_one_a_gateways_body_makes(local: idemgate.Local, ledger: Ledger) -> None:
    # The extension makes applied and replayed outcomes itself: field for field, `raw`
    # included, they must be what `parse_outcome` makes of the same body.
    issue_refund = refunds(local, ledger)
    first = issue_refund.invoke({"order_id": "pi_42", "amount": 1200}, workflow_id=STEP[0], step_id=STEP[1])
    again = issue_refund.invoke({"order_id": "pi_42", "amount": 1200}, workflow_id=STEP[0], step_id=STEP[1])
    for made in (first, again):
        parsed = idemgate.parse_outcome(dict(made.raw), 0)
        assert type(made) is type(parsed) and made == parsed and vars(made) == vars(parsed)
        assert made.raw == {
            "outcome": made.label,
            "status": made.label,
            "operation_key": key_of(local),
            "effect_reference": "eff_1",
            "safe_to_repeat": False,
            "next_action": "none",
            "retry_after_seconds": None,
            "result": {"status": "succeeded"},
            "error": None,
        }
        assert made.done and made.raise_for_outcome() is made and made.http_status == 0
        with pytest.raises(AttributeError):
            made.result = None  # type: ignore[misc]
    assert (type(first), type(again)) == (idemgate.Applied, idemgate.Replayed)
    # Any other label's outcome is made by the package from the extension's tuple: its body has
    # the same members as a done one's.
    changed = issue_refund.invoke({"order_id": "pi_42", "amount": 1}, workflow_id=STEP[0], step_id=STEP[1])
    assert isinstance(changed, idemgate.Rejected) and list(changed.raw) == list(first.raw)
    assert ledger.count() == 1 and len(ledger.calls) == 1


@pytest.mark.parametrize(
    "call, error, says",
    [
        (lambda tool: tool.local.invoke("", {}, workflow_id="w", step_id="s"), ValueError, "tool"),
        (lambda tool: tool.local.invoke(7, {}, workflow_id="w", step_id="s"), ValueError, "tool"),
        (lambda tool: tool.invoke([("order_id", "x")], workflow_id="w", step_id="s"), TypeError, "mapping"),
        (lambda tool: tool.invoke({}, workflow_id="w"), idemgate.MissingIdentityError, "no step_id"),
        (lambda tool: tool.invoke({}, step_id="s"), idemgate.MissingIdentityError, "no workflow_id"),
        (lambda tool: tool.invoke({}, workflow_id="w:1", step_id="s"), idemgate.InvalidIdentityError, "':'"),
        (lambda tool: tool.invoke({}, workflow_id="w", step_id=""), idemgate.InvalidIdentityError, "empty"),
        (lambda tool: tool.invoke({}, workflow_id="w", step_id=3), idemgate.InvalidIdentityError, "not int"),
        (lambda tool: tool.invoke({}, workflow_id="é" * 65, step_id="s"), idemgate.InvalidIdentityError, "128"),
        (
            lambda tool: tool.invoke({"order_id": "pi", "amount": 1}, workflow_id="w", step_id="s", raise_on="applied"),
            ValueError,
            "raise_on",
        ),
        (lambda tool: tool.invoke({}, workflow_id="w", step_id="s", wait=-1), ValueError, "wait"),
    ],
)
def test_a_call_of_another_shape_is_checked_before_anything_is_sent(
    local: idemgate.Local, ledger: Ledger, call: Any, error: type[Exception], says: str
) -> None:
    issue_refund = refunds(local, ledger)
    with pytest.raises(error, match=says):
        call(issue_refund)
    assert ledger.calls == [] and local.operations().operations == ()


def test_arguments_that_are_not_json_are_refused_naming_the_argument_and_nothing_is_stored(
    local: idemgate.Local, ledger: Ledger
) -> None:
    @local.tool("orders.place")
    def place(items: list[Any], note: Any = None) -> dict[str, Any]:
        ledger.call("x")
        return {}

    secret = object()
    with idemgate.workflow("run-10"), idemgate.step("place"):
        with pytest.raises(TypeError, match=r"`note` is of type object, which is not JSON") as e:
            place(items=[], note=secret)
        assert repr(secret) not in str(e.value)
        with pytest.raises(TypeError, match=r"`items\[1\]\.sku` is of type set"):
            place(items=[{"sku": "a"}, {"sku": {1, 2}}])
        with pytest.raises(TypeError, match=r"`items\[0\]` is an integer beyond ±2\^53"):
            place(items=[2**60])
        with pytest.raises(TypeError, match=r"`note` is a float that is not finite"):
            place(items=[], note=float("nan"))
    assert ledger.calls == [] and local.operations().operations == ()


def test_arguments_that_break_the_schema_are_rejected_safe_to_repeat_before_anything_runs(
    local: idemgate.Local, ledger: Ledger
) -> None:
    issue_refund = refunds(local, ledger)
    outcome = issue_refund.invoke({"order_id": "pi", "amount": "twelve"}, workflow_id="run-11", step_id="s")
    assert isinstance(outcome, idemgate.Rejected)
    assert outcome.code == "invalid_arguments" and outcome.safe_to_repeat is True
    assert "/amount" in outcome.message and "twelve" not in outcome.message
    assert ledger.calls == [] and local.operations().operations == ()


def test_a_result_that_is_neither_a_receipt_nor_json_is_unknown_and_the_effect_is_not_repeated(
    local: idemgate.Local, ledger: Ledger
) -> None:
    @local.tool("rows.insert")
    def insert(n: int, *, idempotency_key: str) -> Any:
        ledger.call(idempotency_key)
        ledger.effect(idempotency_key, {"n": n})
        return {"ids": {1, 2}}

    with idemgate.workflow("run-12"), idemgate.step("insert"):
        first = insert(n=1)
        again = insert(n=1)
    assert isinstance(first, idemgate.Unknown), first
    assert isinstance(again, idemgate.Unknown)
    assert len(ledger.calls) == 1
    operation = local.operation(key_of(local, "run-12", "insert"))
    evidence = " ".join(e.detail or "" for e in operation.events)
    assert "neither a Receipt nor JSON" in evidence and "`result.ids` is of type set" in evidence


def test_a_plain_json_result_is_kept_with_the_operation_key_as_its_reference(
    local: idemgate.Local, ledger: Ledger
) -> None:
    @local.tool("rows.insert")
    def insert(n: int, *, idempotency_key: str) -> dict[str, Any]:
        ledger.effect(idempotency_key, {"n": n})
        return {"id": n}

    outcome = insert.invoke({"n": 5}, workflow_id="run-13", step_id="insert")
    assert isinstance(outcome, idemgate.Applied)
    assert outcome.result == {"id": 5} and outcome.effect_reference == outcome.operation_key


def test_a_lookup_that_raises_leaves_the_operation_unknown_and_nothing_is_lost(
    local: idemgate.Local, ledger: Ledger
) -> None:
    def broken_lookup(idempotency_key: str) -> Optional[idemgate.Receipt]:
        raise KeyError("the provider's search is down")

    @local.tool("refunds.issue", fingerprint=["order_id"], lookup=broken_lookup, lease_seconds=3)
    def issue_refund(order_id: str, *, idempotency_key: str) -> idemgate.Receipt:
        ledger.call(idempotency_key)
        ledger.effect(idempotency_key, {"order_id": order_id})
        raise ConnectionError("lost")

    with idemgate.workflow("run-14"), idemgate.step("refund"):
        first = issue_refund(order_id="pi")
        again = issue_refund(order_id="pi")
    assert isinstance(first, idemgate.Unknown) and isinstance(again, idemgate.Unknown)
    assert first.message == "builtins.ConnectionError: lost" or "ConnectionError: lost" in (first.message or "")
    assert len(ledger.calls) == 1 and ledger.count() == 1
    assert local.operation(key_of(local, "run-14", "refund")).record_status == "unknown"


def test_a_panic_in_the_binding_after_the_call_is_unknown_and_the_interpreter_lives_on(
    local: idemgate.Local, ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    issue_refund = refunds(local, ledger)
    monkeypatch.setenv("IDEMGATE_PY_TEST_PANIC", "after_call")
    with idemgate.workflow("run-15"), idemgate.step("refund"):
        first = issue_refund(order_id="pi", amount=1)
        monkeypatch.delenv("IDEMGATE_PY_TEST_PANIC")
        again = issue_refund(order_id="pi", amount=1)
    assert isinstance(first, idemgate.Unknown), first
    assert isinstance(again, idemgate.Unknown), again
    assert ledger.count() == 1 and len(ledger.calls) == 1


def test_a_panic_after_the_call_while_another_caller_waits_is_unknown_and_calls_go_on(
    local: idemgate.Local, ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With another caller blocked in the engine, a call's future is polled on the extension's
    poller thread: a panic there answers that call (unknown, one effect), and the calls after it
    are still polled and answered."""
    issue_refund = refunds(local, ledger)
    running, release = threading.Event(), threading.Event()

    @local.tool("slow.hold", fingerprint=["n"])
    def hold(n: int) -> dict[str, int]:
        running.set()
        release.wait(20)
        return {"n": n}

    held: list[idemgate.Outcome] = []
    holder = threading.Thread(target=lambda: held.append(hold.invoke({"n": 1}, workflow_id="run-15p", step_id="hold")))
    holder.start()
    assert running.wait(20), "the holding call never ran its function"
    answers: list[idemgate.Outcome] = []

    def calls() -> None:
        with idemgate.workflow("run-15p"):
            with idemgate.step("refund"):
                monkeypatch.setenv("IDEMGATE_PY_TEST_PANIC", "after_call")
                try:
                    answers.append(issue_refund(order_id="pi", amount=1))
                finally:
                    monkeypatch.delenv("IDEMGATE_PY_TEST_PANIC")
                answers.append(issue_refund(order_id="pi", amount=1))
            with idemgate.step("refund-2"):
                answers.append(issue_refund(order_id="pj", amount=2))

    caller = threading.Thread(target=calls)
    caller.start()
    caller.join(30)
    alive = caller.is_alive()
    release.set()
    holder.join(30)
    assert not alive, "a call polled beside another caller's never came back"
    first, again, other = answers
    assert isinstance(first, idemgate.Unknown), first
    assert isinstance(again, idemgate.Unknown), again
    assert isinstance(other, idemgate.Applied), other
    assert held and isinstance(held[0], idemgate.Applied), held
    assert ledger.count() == 2 and len(ledger.calls) == 2


def test_a_panic_on_the_memory_only_replay_path_is_an_exception_and_the_interpreter_lives_on(
    local: idemgate.Local, ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    issue_refund = refunds(local, ledger)
    with idemgate.workflow("run-15m"), idemgate.step("refund"):
        first = issue_refund(order_id="pi", amount=1)
        monkeypatch.setenv("IDEMGATE_PY_TEST_PANIC", "replay_from_memory")
        with pytest.raises(RuntimeError, match="failed internally"):
            issue_refund(order_id="pi", amount=1)
        monkeypatch.delenv("IDEMGATE_PY_TEST_PANIC")
        again = issue_refund(order_id="pi", amount=1)
    assert isinstance(first, idemgate.Applied), first
    assert isinstance(again, idemgate.Replayed), again
    assert ledger.count() == 1 and len(ledger.calls) == 1


def test_sixteen_threads_on_one_step_make_one_effect(local: idemgate.Local, ledger: Ledger) -> None:
    @local.tool("refunds.issue", fingerprint=["order_id"])
    def issue_refund(order_id: str, *, idempotency_key: str) -> idemgate.Receipt:
        ledger.call(idempotency_key)
        time.sleep(0.2)
        return idemgate.Receipt(ledger.effect(idempotency_key, {"order_id": order_id}))

    start = threading.Barrier(16)
    outcomes: list[idemgate.Outcome] = []
    lock = threading.Lock()

    def deliver() -> None:
        start.wait()
        with idemgate.workflow("run-16"), idemgate.step("refund"):
            outcome = issue_refund(order_id="pi")
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=deliver) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(outcomes) == 16
    labels = sorted(o.label for o in outcomes)
    assert labels.count("applied") == 1, labels
    assert set(labels) <= {"applied", "replayed", "in_flight"}, labels
    assert ledger.count() == 1 and len(ledger.calls) == 1


@contextlib.contextmanager
def a_runner_held(local: idemgate.Local, ledger: Ledger) -> Iterator[list[idemgate.Outcome]]:
    """A call of tool `reports.render` blocked inside its function (so holding the runner that
    runs it) for the length of the block, then let go; yields where its outcome lands."""
    release = threading.Event()
    entered = threading.Event()

    @local.tool("reports.render", fingerprint=["name"])
    def render(name: str, *, idempotency_key: str) -> dict[str, Any]:
        entered.set()
        release.wait(20)
        ledger.effect(idempotency_key, {"name": name})
        return {"pages": 1}

    outcome: list[idemgate.Outcome] = []
    worker = threading.Thread(target=lambda: outcome.append(render.invoke({"name": "q3"}, workflow_id="run-s", step_id="render")))
    worker.start()
    try:
        assert entered.wait(10)
        yield outcome
        assert not release.is_set()
    finally:
        release.set()
        worker.join(20)


def test_a_slow_function_does_not_hold_up_another_tools_calls(local: idemgate.Local, ledger: Ledger) -> None:
    """Synchronous functions share runner threads; one blocked in its downstream must not keep
    another tool's calls from running meanwhile."""
    refund = refunds(local, ledger)
    with a_runner_held(local, ledger) as slow:
        began = time.monotonic()
        fast = [refund.invoke({"order_id": f"pi_{i}", "amount": 1}, workflow_id="run-f", step_id=f"s{i}") for i in range(5)]
        took = time.monotonic() - began
    assert [o.label for o in fast] == ["applied"] * 5
    assert took < 5, took
    assert isinstance(slow[0], idemgate.Applied)
    assert ledger.count() == 6 and len(ledger.calls) == 5


def test_a_function_that_could_not_start_within_its_timeout_was_not_called_and_is_safe_to_repeat(
    local: idemgate.Local, ledger: Ledger
) -> None:
    """A call queued behind a function that holds its runner, with a timeout shorter than the
    wait for another: it never started, so nothing was done, and the next delivery runs it."""

    @local.tool("pings.send", fingerprint=["to"], timeout=0.001)
    def ping(to: str, *, idempotency_key: str) -> dict[str, Any]:
        ledger.call(idempotency_key)
        return {"sent": ledger.effect(idempotency_key, {"to": to})}

    with a_runner_held(local, ledger):
        first = ping.invoke({"to": "ops"}, workflow_id="run-p", step_id="ping")
    # Which one happens is a race of a millisecond: it never started (then it was not called:
    # released, safe to repeat, and the next delivery runs it), or another runner took it up
    # (then it was called: applied, or `unknown` past its timeout — never a second call).
    if isinstance(first, idemgate.Rejected):
        assert first.safe_to_repeat, first
        assert len(ledger.calls) == 0
        # A later delivery calls it. On a loaded machine a runner may take longer than the
        # 1 ms timeout to start a call: that delivery is released unstarted as the first was
        # (nothing called), or its call ends `unknown` past the timeout — called all the same.
        for _ in range(50):
            again = ping.invoke({"to": "ops"}, workflow_id="run-p", step_id="ping")
            if not (isinstance(again, idemgate.Rejected) and again.safe_to_repeat):
                break
            assert len(ledger.calls) == 0, again
        if isinstance(again, idemgate.Unknown):
            assert "did not return within its timeout" in (again.message or ""), again
        else:
            assert isinstance(again, idemgate.Applied), again
    else:
        assert isinstance(first, (idemgate.Applied, idemgate.Unknown)), first
        again = ping.invoke({"to": "ops"}, workflow_id="run-p", step_id="ping")
        assert again.label in ("replayed", "unknown"), again
    deadline = time.monotonic() + 5
    while not ledger.count(key_of(local, "run-p", "ping")) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ledger.count(key_of(local, "run-p", "ping")) == 1 and len(ledger.calls) == 1


def test_the_interpreter_lock_is_released_while_the_engine_waits(local: idemgate.Local, ledger: Ledger) -> None:
    """The function waits until another Python thread has made progress: if the calling thread
    held the lock while the engine waited, neither the function nor the other thread could
    run, and this would time out instead."""
    progressed = threading.Event()
    counter = {"n": 0}

    @local.tool("slow.effect")
    def slow(n: int, *, idempotency_key: str) -> dict[str, Any]:
        assert progressed.wait(10), "no other thread ran while the call waited"
        ledger.effect(idempotency_key, {"n": n})
        return {"seen": counter["n"]}

    def other() -> None:
        while counter["n"] < 100_000:
            counter["n"] += 1
        progressed.set()

    result: list[idemgate.Outcome] = []
    caller = threading.Thread(target=lambda: result.append(slow.invoke({"n": 1}, workflow_id="run-17", step_id="s")))
    caller.start()
    time.sleep(0.05)
    threading.Thread(target=other).start()
    caller.join(20)
    assert result and isinstance(result[0], idemgate.Applied), result
    assert result[0].result == {"seen": 100_000}
    assert ledger.count() == 1


def test_approval_holds_the_call_until_an_operator_approves_or_denies(local: idemgate.Local, ledger: Ledger) -> None:
    @local.tool("payouts.send", approval={"amount": [10_000]})
    def payout(amount: int, *, idempotency_key: str) -> idemgate.Receipt:
        return idemgate.Receipt(ledger.effect(idempotency_key, {"amount": amount}))

    held = payout.invoke({"amount": 10_000}, workflow_id="run-18", step_id="a")
    other = payout.invoke({"amount": 10_000}, workflow_id="run-18", step_id="b")
    small = payout.invoke({"amount": 5}, workflow_id="run-18", step_id="c")
    assert isinstance(held, idemgate.InFlight) and held.awaiting_approval
    assert isinstance(small, idemgate.Applied)
    assert ledger.count() == 1
    queue = local.operations(status="awaiting_approval").operations
    assert sorted(r.operation_key for r in queue) == [held.operation_key, other.operation_key]
    assert held.operation_key and other.operation_key
    approved = local.approve(held.operation_key, reason="checked the invoice")
    assert isinstance(approved, idemgate.Applied)
    denied = local.deny(other.operation_key, reason="duplicate")
    assert isinstance(denied, idemgate.Rejected) and denied.code == "approval_denied"
    assert ledger.count() == 2
    again = payout.invoke({"amount": 10_000}, workflow_id="run-18", step_id="b")
    assert isinstance(again, idemgate.Rejected) and again.code == "approval_denied"
    assert ledger.count() == 2
    with pytest.raises(idemgate.NotFoundError):
        local.approve("acme:test:nope:nope")


def test_the_authorize_hook_is_asked_before_the_effect_and_before_a_replay(
    local: idemgate.Local, ledger: Ledger
) -> None:
    allowed = {"now": True}
    asked: list[idemgate.AuthRequest] = []

    def authorize(request: idemgate.AuthRequest) -> Any:
        asked.append(request)
        return True if allowed["now"] else "the refund permission was revoked"

    issue_refund = refunds(local, ledger, authorize=authorize)
    with idemgate.workflow("run-19"), idemgate.step("refund"):
        assert isinstance(issue_refund(order_id="pi", amount=1), idemgate.Applied)
        allowed["now"] = False
        replay = issue_refund(order_id="pi", amount=1)
    assert isinstance(replay, idemgate.Rejected) and replay.code == "forbidden", replay
    assert "revoked" in replay.message
    assert asked[0].tenant == "acme" and asked[0].actor == "local" and asked[0].tool == "refunds.issue"
    assert asked[0].stage == "before_effect" and asked[-1].stage == "before_replay"
    assert asked[0].fingerprint.startswith("sha256:")
    assert ledger.count() == 1

    def broken(request: idemgate.AuthRequest) -> bool:
        raise RuntimeError("the permission service is down")

    @local.tool("refunds.void", authorize=broken)
    def void(order_id: str, *, idempotency_key: str) -> idemgate.Receipt:
        return idemgate.Receipt(ledger.effect(idempotency_key, {"order_id": order_id}))

    refused = void.invoke({"order_id": "pi"}, workflow_id="run-19", step_id="void")
    assert isinstance(refused, idemgate.Rejected) and refused.safe_to_repeat is True
    assert ledger.count() == 1


def test_a_job_stays_in_flight_until_its_poller_finds_it_done(local: idemgate.Local, ledger: Ledger) -> None:
    done = {"now": False}

    def poll(job_id: str) -> Optional[idemgate.Receipt]:
        return idemgate.Receipt(f"report-{job_id}", {"pages": 2}) if done["now"] else None

    @local.tool("reports.generate", poll=poll)
    def generate(period: str, *, idempotency_key: str) -> idemgate.Job:
        ledger.effect(idempotency_key, {"period": period})
        return idemgate.Job("j-1")

    accepted = generate.invoke({"period": "2026-11"}, workflow_id="run-20", step_id="report")
    assert isinstance(accepted, idemgate.InFlight) and accepted.next_action == "poll"
    assert accepted.operation_key
    assert local.operation(accepted.operation_key).record.job_id == "j-1"
    done["now"] = True
    finished = local.operation(accepted.operation_key)
    assert finished.record_status == "applied" and finished.receipt == idemgate.Receipt("report-j-1", {"pages": 2})
    assert ledger.count() == 1


def test_reading_and_listing_are_scoped_to_the_locals_tenant_and_environment(
    tmp_path: Path, ledger: Ledger
) -> None:
    url = f"sqlite://{tmp_path / 'shared.sqlite'}"
    with idemgate.Local(url, tenant="acme", environment="test") as acme, idemgate.Local(
        url, tenant="globex", environment="test"
    ) as globex:
        issue_refund = refunds(acme, ledger)
        outcome = issue_refund.invoke({"order_id": "pi", "amount": 1}, workflow_id="w", step_id="s")
        assert outcome.operation_key
        with pytest.raises(idemgate.NotFoundError):
            globex.operation(outcome.operation_key)
        assert globex.operations().operations == ()
        assert [r.operation_key for r in acme.operations().operations] == [outcome.operation_key]
        with pytest.raises(idemgate.NotFoundError):
            globex.resolve_not_applied(outcome.operation_key)


def test_registration_errors_name_the_argument(local: idemgate.Local, tmp_path: Path) -> None:
    def f(order_id: str) -> None: ...

    with pytest.raises(ValueError, match=r"fingerprint: .*`nope` is not a property"):
        local.tool("a.b", fingerprint=["order_id", "nope"])(f)
    with pytest.raises(ValueError, match=r"effect_class is one of"):
        local.tool("a.b", effect_class="non_idempotent")(f)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"retention: .*shorter than the retry window"):
        local.tool("a.b", retention={"record_ttl": "1h", "tombstone_ttl": "1h", "max_retry_window": "1d"})(f)
    with pytest.raises(TypeError, match="cannot be passed by name"):
        local.tool("a.b")(lambda x, /: None)
    local.tool("a.b")(f)
    with pytest.raises(ValueError, match="already registered"):
        local.tool("a.b")(f)
    with pytest.raises(idemgate.UnknownToolError, match="no tool named 'c.d' is registered"):
        local.invoke("c.d", {}, workflow_id="w", step_id="s")


CONTRACT = """
name: refunds.issue
version: "2026-12-01"
purpose: Refund one order once.
do_not_use_when: [The order was already refunded in another step.]
effect_class: key_based
operation_key:
  supplied_by: application
  scope: [tenant, environment, workflow_id, step_id]
input_schema:
  type: object
  properties:
    order_id: {type: string}
    amount: {type: integer, minimum: 1}
  required: [order_id, amount]
  additionalProperties: false
request_fingerprint:
  fields: [order_id, amount]
downstream:
  receipt_lookup: true
retention:
  record_ttl: 7d
  tombstone_ttl: 30d
  max_retry_window: 1d
owner:
  reconciliation: payments-oncall
  next_review: "2027-06-01"
"""


def test_a_contract_file_is_read_as_the_gateway_reads_it(local: idemgate.Local, ledger: Ledger, tmp_path: Path) -> None:
    path = tmp_path / "refunds.issue.yaml"
    path.write_text(CONTRACT)

    def find(idempotency_key: str) -> Optional[idemgate.Receipt]:
        reference = ledger.find(idempotency_key)
        return idemgate.Receipt(reference) if reference else None

    @local.tool("refunds.issue", contract=str(path), lookup=find)
    def issue_refund(order_id: str, amount: int, *, idempotency_key: str) -> idemgate.Receipt:
        return idemgate.Receipt(ledger.effect(idempotency_key, {"order_id": order_id}))

    bad = issue_refund.invoke({"order_id": "pi", "amount": 0}, workflow_id="w", step_id="s")
    assert isinstance(bad, idemgate.Rejected) and bad.code == "invalid_arguments"
    good = issue_refund.invoke({"order_id": "pi", "amount": 5}, workflow_id="w", step_id="s2")
    assert isinstance(good, idemgate.Applied)
    assert local.operation(good.operation_key or "").record.tool_version == "2026-12-01"

    http = tmp_path / "http.yaml"
    http.write_text(CONTRACT.replace("name: refunds.issue", "name: refunds.http").replace(
        "  receipt_lookup: true", "  receipt_lookup: true\n  http:\n    method: POST\n    url: http://127.0.0.1:9/x"
    ))
    with pytest.raises(ValueError, match=r"http.yaml: field `downstream.http`"):
        local.tool("refunds.http", contract=str(http), lookup=find)(lambda order_id, amount: None)
    second = tmp_path / "refunds.issue2.yaml"
    second.write_text(CONTRACT.replace("name: refunds.issue", "name: refunds.issue2"))
    with pytest.raises(ValueError, match=r"declares downstream.receipt_lookup, so give lookup="):
        local.tool("refunds.issue2", contract=str(second))(lambda order_id, amount: None)
    with pytest.raises(ValueError, match=r'the contract names the tool "refunds.issue2", not "other"'):
        local.tool("other", contract=str(second), lookup=find)(lambda order_id, amount: None)
    with pytest.raises(ValueError, match=r"fingerprint is the contract file's to say"):
        local.tool("refunds.issue3", contract=str(path), fingerprint=["order_id"], lookup=find)(lambda: None)


def test_a_closed_local_takes_no_calls(tmp_path: Path, ledger: Ledger) -> None:
    local = idemgate.Local(f"sqlite://{tmp_path / 'ops.sqlite'}")
    issue_refund = refunds(local, ledger)
    local.close()
    local.close()
    assert local.closed
    with pytest.raises(RuntimeError, match="closed"):
        issue_refund.invoke({"order_id": "pi", "amount": 1}, workflow_id="w", step_id="s")
    with pytest.raises(ValueError, match="url is sqlite://PATH or postgres://"):
        idemgate.Local("mysql://x")
    with pytest.raises(TypeError, match="tenant is a non-empty str"):
        idemgate.Local(f"sqlite://{tmp_path / 'x.sqlite'}", tenant="")
    with pytest.raises(ValueError, match="tenant: "):
        idemgate.Local(f"sqlite://{tmp_path / 'x.sqlite'}", tenant="a:b")


def test_wait_answers_the_settled_outcome_instead_of_in_flight(local: idemgate.Local, ledger: Ledger) -> None:
    started = threading.Event()

    @local.tool("reports.render")
    def render(name: str, *, idempotency_key: str) -> dict[str, Any]:
        started.set()
        time.sleep(0.5)
        ledger.effect(idempotency_key, {"name": name})
        return {"pages": 3}

    first: list[idemgate.Outcome] = []
    runner = threading.Thread(target=lambda: first.append(render.invoke({"name": "q3"}, workflow_id="w", step_id="s")))
    runner.start()
    assert started.wait(10)
    busy = render.invoke({"name": "q3"}, workflow_id="w", step_id="s")
    waited = render.invoke({"name": "q3"}, workflow_id="w", step_id="s", wait=10)
    runner.join(10)
    assert isinstance(busy, idemgate.InFlight) and busy.next_action == "poll"
    assert isinstance(waited, idemgate.Replayed) and waited.result == {"pages": 3}
    assert isinstance(first[0], idemgate.Applied)
    assert ledger.count() == 1


def test_an_operator_settles_an_unknown_by_lookup_or_as_not_applied(local: idemgate.Local, ledger: Ledger) -> None:
    searchable = {"now": False}

    def find(idempotency_key: str) -> Optional[idemgate.Receipt]:
        if not searchable["now"]:
            raise ConnectionError("search is down")
        reference = ledger.find(idempotency_key)
        return idemgate.Receipt(reference) if reference else None

    @local.tool("refunds.issue", lookup=find)
    def issue_refund(order_id: str, *, idempotency_key: str) -> idemgate.Receipt:
        ledger.call(idempotency_key)
        if order_id == "committed":
            ledger.effect(idempotency_key, {"order_id": order_id})
        raise TimeoutError("no answer")

    committed = issue_refund.invoke({"order_id": "committed"}, workflow_id="w", step_id="a")
    never = issue_refund.invoke({"order_id": "never"}, workflow_id="w", step_id="b")
    assert isinstance(committed, idemgate.Unknown) and isinstance(never, idemgate.Unknown)
    assert committed.operation_key and never.operation_key
    queue = [r.operation_key for r in local.operations(status="unknown").operations]
    assert queue == [committed.operation_key, never.operation_key]

    searchable["now"] = True
    found = local.reconcile(committed.operation_key, reason="search is back")
    assert isinstance(found, idemgate.Replayed) and found.effect_reference == "eff_1"
    still = local.reconcile(never.operation_key)
    assert isinstance(still, idemgate.Unknown)
    released = local.resolve_not_applied(never.operation_key, reason="checked the provider")
    # Released, as the engine answers it (API v1: 409): the key may run again.
    assert isinstance(released, idemgate.InFlight)
    assert local.operation(never.operation_key).record_status == "pending"
    assert len(ledger.calls) == 2
    # Only a new delivery runs a released key again (and this time it is heard).
    assert isinstance(issue_refund.invoke({"order_id": "never"}, workflow_id="w", step_id="b"), idemgate.Unknown)
    assert len(ledger.calls) == 3 and ledger.count() == 1


def test_a_forked_child_is_told_to_make_its_own_local(local: idemgate.Local, ledger: Ledger) -> None:
    """The engine's threads do not survive fork: the child gets a clear error, never a hang."""
    import os

    issue_refund = refunds(local, ledger)
    assert isinstance(issue_refund.invoke({"order_id": "pi", "amount": 1}, workflow_id="w", step_id="s"), idemgate.Applied)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(read)
        try:
            issue_refund.invoke({"order_id": "pi", "amount": 1}, workflow_id="w", step_id="s2")
            message = "no error"
        except RuntimeError as e:
            message = str(e)
        os.write(write, message.encode())
        os._exit(0)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    message = os.read(read, 4096).decode()
    os.close(read)
    assert status == 0
    assert "forked" in message and "Create each Local in the process" in message, message
    assert ledger.count() == 1


_EXIT_WHILE_A_FUNCTION_RUNS = """
import sys, time, idemgate
local = idemgate.Local("sqlite://" + sys.argv[1])

@local.tool("slow.spin", fingerprint=["n"], timeout=0.1)
def spin(n: int, *, idempotency_key: str) -> dict:
    end = time.monotonic() + 1.0
    while time.monotonic() < end:  # holds and gives back the interpreter lock, again and again
        pass
    with open(sys.argv[2], "a") as ledger:
        ledger.write(idempotency_key + "\\n")
    return {"n": n}

print(spin.invoke({"n": 1}, workflow_id="run-exit", step_id="spin").label, flush=True)
"""


def test_the_interpreter_exits_cleanly_while_a_function_runs_past_its_timeout(tmp_path: Path) -> None:
    """The call answers `unknown` at its timeout and the program ends while the function still
    runs on a runner thread: the exit waits for it (as Python waits for its own threads) instead
    of the interpreter ending that thread mid-call, which aborted the process."""
    import subprocess
    import sys

    ledger = tmp_path / "effects.txt"
    done = subprocess.run(
        [sys.executable, "-c", _EXIT_WHILE_A_FUNCTION_RUNS, str(tmp_path / "exit.sqlite"), str(ledger)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.strip() == "unknown", done.stdout
    assert ledger.read_text().splitlines() == ["default:development:run-exit:spin"]
