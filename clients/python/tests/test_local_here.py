"""A function without a timeout, called by a caller alone on a thread other than the main one,
runs on the caller's own thread (`crates/py/src/here.rs`). Every rule of DESIGN §14 holds there
as on a runner thread, counted in the ledger the function writes; the lease is still renewed
while the function runs; and on the main thread, or with a timeout, the function runs
elsewhere."""

from __future__ import annotations

import contextvars
import threading
import time
from typing import Any, Callable, Optional, TypeVar

import pytest

from local_support import Ledger

import idemgate

T = TypeVar("T")

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="none")


def on_a_thread(work: Callable[[], T], seconds: float = 60) -> T:
    """`work()` on a new thread (not the main one), its answer or its exception handed back."""
    answer: list[Any] = []

    def run() -> None:
        try:
            answer.append(("ok", work()))
        except BaseException as e:  # noqa: BLE001 - handed back to the test
            answer.append(("raised", e))

    worker = threading.Thread(target=run)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), "the call never came back"
    kind, value = answer[0]
    if kind == "raised":
        raise value
    return value  # type: ignore[no-any-return]


def refunds(local: idemgate.Local, ledger: Ledger, threads: list[int], **options: Any) -> idemgate.LocalTool:
    released: set[str] = set()

    @local.tool("refunds.issue", fingerprint=["order_id", "amount"], timeout=None, **options)
    def issue_refund(order_id: str, amount: int, *, idempotency_key: str) -> idemgate.Receipt:
        threads.append(threading.get_ident())
        ledger.call(idempotency_key)
        if order_id == "not-sent" and idempotency_key not in released:
            released.add(idempotency_key)
            raise idemgate.NotSent("the card network was down before anything was sent")
        if order_id == "refused":
            raise idemgate.Refused("card_declined", "the card was declined")
        if order_id == "broken-before":
            raise ConnectionResetError("reset before any answer")
        reference = ledger.effect(idempotency_key, {"order_id": order_id, "amount": amount})
        if order_id == "broken-after":
            raise TimeoutError("the answer was lost after the refund was made")
        return idemgate.Receipt(reference=reference, result={"status": "succeeded", "request": request_id.get()})

    assert isinstance(issue_refund, idemgate.LocalTool)
    return issue_refund


def test_each_rule_holds_for_a_function_run_on_its_callers_thread(local: idemgate.Local, ledger: Ledger) -> None:
    threads: list[int] = []
    looked: list[int] = []

    def find(idempotency_key: str) -> Optional[idemgate.Receipt]:
        looked.append(threading.get_ident())
        reference = ledger.find(idempotency_key)
        return idemgate.Receipt(reference, {"found": True}) if reference else None

    issue_refund = refunds(local, ledger, threads, lookup=find)

    def calls() -> dict[str, Any]:
        request_id.set("req-7")
        seen: dict[str, Any] = {"caller": threading.get_ident()}
        with idemgate.workflow("run-here"):
            with idemgate.step("refund"):
                seen["first"] = issue_refund(order_id="pi_1", amount=5)
                seen["again"] = issue_refund(order_id="pi_1", amount=5)
                seen["changed"] = issue_refund(order_id="pi_1", amount=6)
            with idemgate.step("not-sent"):
                seen["not_sent"] = issue_refund(order_id="not-sent", amount=1)
            with idemgate.step("refused"):
                seen["refused"] = issue_refund(order_id="refused", amount=1)
                seen["refused_again"] = issue_refund(order_id="refused", amount=1)
            with idemgate.step("broken-before"):
                seen["broken_before"] = issue_refund(order_id="broken-before", amount=1)
                seen["broken_before_again"] = issue_refund(order_id="broken-before", amount=1)
            with idemgate.step("broken-after"):
                seen["broken_after"] = issue_refund(order_id="broken-after", amount=1)
        return seen

    seen = on_a_thread(calls)
    first, again, changed = seen["first"], seen["again"], seen["changed"]
    assert isinstance(first, idemgate.Applied), first
    assert first.result == {"status": "succeeded", "request": "req-7"}, first.result  # the caller's context
    assert isinstance(again, idemgate.Replayed) and again.effect_reference == first.effect_reference, again
    assert isinstance(changed, idemgate.Rejected) and not changed.safe_to_repeat, changed
    assert isinstance(seen["not_sent"], idemgate.Rejected) and seen["not_sent"].safe_to_repeat, seen["not_sent"]
    assert isinstance(seen["refused"], idemgate.Rejected), seen["refused"]
    assert isinstance(seen["refused_again"], idemgate.Rejected), seen["refused_again"]
    assert "card_declined: the card was declined" in (seen["refused_again"].message or "")
    # The lookup finds nothing for the reset before the effect, and the effect for the loss after.
    assert isinstance(seen["broken_before"], idemgate.Unknown), seen["broken_before"]
    assert isinstance(seen["broken_before_again"], idemgate.Unknown), seen["broken_before_again"]
    assert isinstance(seen["broken_after"], idemgate.Applied), seen["broken_after"]
    # On the effect's side: one refund for pi_1, one for broken-after; each function called once
    # per step (never again for the replay, the refusal or the unknown).
    assert ledger.count() == 2
    assert sorted(ledger.calls) == sorted(
        f"{local.tenant}:{local.environment}:run-here:{step}"
        for step in ("refund", "not-sent", "refused", "broken-before", "broken-after")
    )
    # Every call of the function and of the lookup ran on the caller's own thread.
    assert set(threads) == {seen["caller"]}, (threads, seen["caller"])
    assert looked and set(looked) == {seen["caller"]}, (looked, seen["caller"])

    # The step released by NotSent runs when delivered again.
    def again_not_sent() -> idemgate.Outcome:
        return issue_refund.invoke({"order_id": "not-sent", "amount": 1}, workflow_id="run-here", step_id="not-sent")

    assert isinstance(on_a_thread(again_not_sent), idemgate.Applied)
    assert ledger.count() == 3


def test_on_the_main_thread_or_with_a_timeout_the_function_runs_on_another_thread(
    local: idemgate.Local, ledger: Ledger
) -> None:
    """On the main thread Python runs its signal handlers, and a timeout must answer the caller
    while the function still runs: both keep the function off the caller's thread."""
    threads: list[int] = []
    issue_refund = refunds(local, ledger, threads)
    assert threading.current_thread() is threading.main_thread()
    outcome = issue_refund.invoke({"order_id": "pi_1", "amount": 1}, workflow_id="run-main", step_id="refund")
    assert isinstance(outcome, idemgate.Applied), outcome
    assert threads[-1] != threading.get_ident()

    timed: list[int] = []

    @local.tool("pings.send", fingerprint=["to"], timeout=30)
    def ping(to: str, *, idempotency_key: str) -> dict[str, Any]:
        timed.append(threading.get_ident())
        return {"sent": ledger.effect(idempotency_key, {"to": to})}

    caller = on_a_thread(lambda: (threading.get_ident(), ping.invoke({"to": "ops"}, workflow_id="run-main", step_id="ping")))
    assert isinstance(caller[1], idemgate.Applied), caller[1]
    assert timed == [timed[0]] and timed[0] != caller[0]
    assert ledger.count() == 2


def test_the_lease_is_renewed_while_a_function_runs_on_its_callers_thread(local: idemgate.Local, ledger: Ledger) -> None:
    """A 3-second lease and a function that takes 4.5 seconds: the renewals (every second) are
    made by another thread while the caller's own runs the function, so a second delivery after
    the first lease would have run out finds the call in flight, not abandoned; one effect."""
    running = threading.Event()

    @local.tool("reports.render", fingerprint=["name"], timeout=None, lease_seconds=3)
    def render(name: str, *, idempotency_key: str) -> dict[str, Any]:
        ledger.call(idempotency_key)
        running.set()
        time.sleep(4.5)
        ledger.effect(idempotency_key, {"name": name})
        return {"pages": 3}

    first: list[idemgate.Outcome] = []
    caller = threading.Thread(target=lambda: first.append(render.invoke({"name": "q3"}, workflow_id="run-lease", step_id="render")))
    caller.start()
    assert running.wait(20)
    time.sleep(3.8)
    during = render.invoke({"name": "q3"}, workflow_id="run-lease", step_id="render")
    caller.join(30)
    assert not caller.is_alive()
    assert isinstance(during, idemgate.InFlight), during
    assert first and isinstance(first[0], idemgate.Applied), first
    assert ledger.count() == 1 and len(ledger.calls) == 1


def test_a_function_on_its_callers_thread_may_call_another_guarded_tool(local: idemgate.Local, ledger: Ledger) -> None:
    threads: list[int] = []

    @local.tool("tickets.create", fingerprint=["subject"], timeout=None)
    def create(subject: str, *, idempotency_key: str) -> dict[str, Any]:
        threads.append(threading.get_ident())
        return {"ticket": ledger.effect(idempotency_key, {"subject": subject})}

    @local.tool("incidents.open", fingerprint=["title"], timeout=None)
    def open_incident(title: str, *, idempotency_key: str) -> dict[str, Any]:
        threads.append(threading.get_ident())
        ticket = create.invoke({"subject": title}, workflow_id="run-nested", step_id="ticket")
        assert isinstance(ticket, (idemgate.Applied, idemgate.Replayed)), ticket
        return {"incident": ledger.effect(idempotency_key, {"title": title}), "ticket": ticket.result}

    def twice() -> tuple[idemgate.Outcome, idemgate.Outcome]:
        a = open_incident.invoke({"title": "db down"}, workflow_id="run-nested", step_id="incident")
        b = open_incident.invoke({"title": "db down"}, workflow_id="run-nested", step_id="incident")
        return a, b

    a, b = on_a_thread(twice, seconds=30)
    assert isinstance(a, idemgate.Applied) and isinstance(b, idemgate.Replayed), (a, b)
    assert a.result == {"incident": "eff_2", "ticket": {"ticket": "eff_1"}}, a.result
    assert ledger.count() == 2


def test_a_panic_after_a_call_on_its_callers_thread_is_unknown_and_the_interpreter_lives_on(
    local: idemgate.Local, ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[int] = []
    issue_refund = refunds(local, ledger, threads)

    def calls() -> tuple[idemgate.Outcome, idemgate.Outcome]:
        with idemgate.workflow("run-panic"), idemgate.step("refund"):
            monkeypatch.setenv("IDEMGATE_PY_TEST_PANIC", "after_call")
            try:
                first = issue_refund(order_id="pi", amount=1)
            finally:
                monkeypatch.delenv("IDEMGATE_PY_TEST_PANIC")
            return first, issue_refund(order_id="pi", amount=1)

    first, again = on_a_thread(calls)
    assert isinstance(first, idemgate.Unknown), first
    assert isinstance(again, idemgate.Unknown), again
    assert ledger.count() == 1 and len(ledger.calls) == 1
