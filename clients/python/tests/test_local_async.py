"""`AsyncLocal` and `async def` tools: the event loop is never blocked, a coroutine runs on the
loop of the call waiting for it (with its context variables), and the rules are the same as
for sync tools — counted in a ledger the function writes."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from pathlib import Path
from typing import Any, Optional

import pytest

from local_support import Ledger

import idemgate

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="none")


def url(tmp_path: Path) -> str:
    return f"sqlite://{tmp_path / 'ops.sqlite'}"


def test_an_async_tool_runs_on_the_callers_loop_once_per_step(tmp_path: Path, ledger: Ledger) -> None:
    async def main() -> None:
        seen: list[tuple[Any, str]] = []
        async with idemgate.AsyncLocal(url(tmp_path), tenant="acme") as local:

            @local.tool("messages.send")
            async def send(text: str, *, idempotency_key: str) -> idemgate.Receipt:
                seen.append((asyncio.get_running_loop(), request_id.get()))
                await asyncio.sleep(0.01)
                return idemgate.Receipt(ledger.effect(idempotency_key, {"text": text}), {"sent": True})

            request_id.set("req-7")
            async with idemgate.workflow("run-1"):
                with idemgate.step("notify"):
                    first = await send(text="hi")
                    again = await send(text="hi")
            assert isinstance(first, idemgate.Applied) and isinstance(again, idemgate.Replayed)
            assert again.result == {"sent": True}
            assert seen == [(asyncio.get_running_loop(), "req-7")]
            operation = await local.operation(first.operation_key or "")
            assert operation.record_status == "applied"
            page = await local.operations(status="applied")
            assert [r.operation_key for r in page.operations] == [first.operation_key]
        assert ledger.count() == 1

    asyncio.run(main())


def test_sixteen_tasks_on_one_step_make_one_effect(tmp_path: Path, ledger: Ledger) -> None:
    async def main() -> list[str]:
        async with idemgate.AsyncLocal(url(tmp_path)) as local:

            @local.tool("refunds.issue")
            async def issue(order_id: str, *, idempotency_key: str) -> idemgate.Receipt:
                ledger.call(idempotency_key)
                await asyncio.sleep(0.2)
                return idemgate.Receipt(ledger.effect(idempotency_key, {"order_id": order_id}))

            async def deliver() -> str:
                outcome = await issue.invoke({"order_id": "pi"}, workflow_id="run-2", step_id="refund")
                return str(outcome.label)

            return list(await asyncio.gather(*(deliver() for _ in range(16))))

    labels = sorted(asyncio.run(main()))
    assert labels.count("applied") == 1, labels
    assert set(labels) <= {"applied", "replayed", "in_flight"}
    assert ledger.count() == 1 and len(ledger.calls) == 1


def test_an_unknown_raise_on_label_is_refused_before_anything_is_sent(tmp_path: Path, ledger: Ledger) -> None:
    async def main() -> None:
        async with idemgate.AsyncLocal(url(tmp_path)) as local:

            @local.tool("refunds.issue")
            async def issue(order_id: str, *, idempotency_key: str) -> idemgate.Receipt:
                ledger.call(idempotency_key)
                return idemgate.Receipt(ledger.effect(idempotency_key, {"order_id": order_id}))

            with pytest.raises(ValueError, match="raise_on"):
                await issue.invoke({"order_id": "pi"}, workflow_id="run-3", step_id="refund", raise_on="applied")
            assert (await local.operations()).operations == ()

    asyncio.run(main())
    assert ledger.calls == []


def test_a_sync_tool_does_not_block_the_event_loop(tmp_path: Path, ledger: Ledger) -> None:
    async def main() -> int:
        ticks = 0
        async with idemgate.AsyncLocal(url(tmp_path)) as local:

            @local.tool("slow.effect")
            def slow(n: int, *, idempotency_key: str) -> dict[str, Any]:
                time.sleep(0.5)
                ledger.effect(idempotency_key, {"n": n})
                return {"n": n}

            async def tick() -> None:
                nonlocal ticks
                while True:
                    ticks += 1
                    await asyncio.sleep(0.01)

            ticker = asyncio.create_task(tick())
            outcome = await slow.invoke({"n": 1}, workflow_id="run-3", step_id="s")
            ticker.cancel()
            assert isinstance(outcome, idemgate.Applied)
        return ticks

    assert asyncio.run(main()) >= 10
    assert ledger.count() == 1


def test_an_async_tool_of_a_sync_local_runs_on_the_background_loop(tmp_path: Path, ledger: Ledger) -> None:
    threads: list[str] = []
    with idemgate.Local(url(tmp_path)) as local:

        @local.tool("messages.send")
        async def send(text: str, *, idempotency_key: str) -> idemgate.Receipt:
            threads.append(threading.current_thread().name)
            await asyncio.sleep(0.01)
            return idemgate.Receipt(ledger.effect(idempotency_key, {"text": text}))

        with idemgate.workflow("run-4"), idemgate.step("notify"):
            first = send(text="hi")
            again = send(text="hi")
    assert isinstance(first, idemgate.Applied) and isinstance(again, idemgate.Replayed)
    assert threads == ["idemgate-asyncio"]
    assert ledger.count() == 1


def test_async_tools_follow_the_same_rules(tmp_path: Path, ledger: Ledger) -> None:
    async def main() -> None:
        async with idemgate.AsyncLocal(url(tmp_path)) as local:

            async def find(idempotency_key: str) -> Optional[idemgate.Receipt]:
                reference = ledger.find(idempotency_key)
                return idemgate.Receipt(reference) if reference else None

            @local.tool("refunds.issue", lookup=find)
            async def issue(order_id: str, *, idempotency_key: str) -> idemgate.Receipt:
                ledger.call(idempotency_key)
                if order_id == "down":
                    raise idemgate.NotSent("refused the connection")
                ledger.effect(idempotency_key, {"order_id": order_id})
                raise asyncio.TimeoutError("the answer was lost")

            @local.tool("rows.insert", timeout=0.2)
            async def insert(n: int, *, idempotency_key: str) -> dict[str, Any]:
                ledger.call(idempotency_key)
                await asyncio.sleep(5)
                return {}

            released = await issue.invoke({"order_id": "down"}, workflow_id="run-5", step_id="a")
            assert isinstance(released, idemgate.Rejected) and released.safe_to_repeat
            recovered = await issue.invoke({"order_id": "pi"}, workflow_id="run-5", step_id="b")
            assert isinstance(recovered, idemgate.Applied), recovered
            late = await insert.invoke({"n": 1}, workflow_id="run-5", step_id="c")
            again = await insert.invoke({"n": 1}, workflow_id="run-5", step_id="c")
            assert isinstance(late, idemgate.Unknown) and isinstance(again, idemgate.Unknown)
            with pytest.raises(idemgate.MissingIdentityError, match="rows.insert"):
                await insert.invoke({"n": 1})
            with pytest.raises(TypeError, match="`n` is of type bytes"):
                await insert.invoke({"n": b"x"}, workflow_id="run-5", step_id="d")

    asyncio.run(main())
    assert ledger.count() == 1
    assert ledger.calls.count("default:development:run-5:c") == 1


def _os_threads() -> int:
    return len(list(Path("/proc/self/task").iterdir()))


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads through /proc")
def test_threads_that_end_after_idling_give_back_their_thread_states(tmp_path: Path, ledger: Ledger) -> None:
    """The runners and the runtime's threads keep a Python thread state while they live; the
    ones that end after idling (10 s) give it back, and the threads made after them work —
    counted on the functions' side, before and after."""

    async def main() -> None:
        async with idemgate.AsyncLocal(url(tmp_path)) as local:

            @local.tool("notes.add", fingerprint=["n"])
            async def add(n: int, *, idempotency_key: str) -> idemgate.Receipt:
                return idemgate.Receipt(ledger.effect(idempotency_key, {"n": n}))

            @local.tool("notes.sync_add", fingerprint=["n"])
            def sync_add(n: int, *, idempotency_key: str) -> idemgate.Receipt:
                return idemgate.Receipt(ledger.effect(idempotency_key, {"n": n}))

            async def wave(run: str) -> None:
                outcomes = await asyncio.gather(
                    *(add.invoke({"n": i}, workflow_id=run, step_id=str(i)) for i in range(40)),
                    *(sync_add.invoke({"n": i}, workflow_id=f"{run}-sync", step_id=str(i)) for i in range(40)),
                )
                assert [o.label for o in outcomes] == ["applied"] * 80

            await wave("before-idle")
            busy = _os_threads()
            deadline = time.monotonic() + 25
            while _os_threads() >= busy and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
            assert _os_threads() < busy, "no thread ended after idling"
            await wave("after-idle")
        assert ledger.count() == 160

    asyncio.run(main())
