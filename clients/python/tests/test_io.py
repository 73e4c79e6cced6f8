"""`Client` and `AsyncClient` run the same flows: each scripted exchange below is run by both,
over `httpx.MockTransport`, and must send the same requests and end the same way."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Callable, Union

import httpx
import pytest

import idemgate

URL = "http://gateway.test"
TICKET = {"subject": "Refund request", "body": "Order 42 arrived broken."}
APPLIED = {
    "outcome": "applied",
    "operation_key": "t:e:w:s",
    "effect_reference": "ticket_1",
    "safe_to_repeat": True,
    "next_action": "none",
    "retry_after_seconds": None,
    "result": {"ticket_id": "ticket_1"},
    "error": None,
}

Answer = Union[dict[str, Any], Exception]


class Script:
    """A transport handler giving the scripted answers in order (an exception is raised as the
    transport's), keeping every request it saw."""

    def __init__(self, *answers: Answer) -> None:
        self.answers = list(answers)
        self.seen: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(request)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return httpx.Response(200, json=answer)

    def paths(self) -> list[str]:
        return [f"{r.method} {r.url.raw_path.decode()}" for r in self.seen]


@pytest.fixture(params=["sync", "async"])
def run(request: pytest.FixtureRequest) -> Callable[[Script, Callable[[Any], Any]], Any]:
    """`run(script, call)`: `call(client)` on a `Client`, or awaited on an `AsyncClient`."""

    def sync(script: Script, call: Callable[[Any], Any]) -> Any:
        with idemgate.Client(URL, "token", transport=httpx.MockTransport(script)) as client:
            return call(client)

    def asynchronous(script: Script, call: Callable[[Any], Any]) -> Any:
        async def main() -> Any:
            transport = httpx.MockTransport(script)
            async with idemgate.AsyncClient(URL, "token", transport=transport) as client:
                return await call(client)

        return asyncio.run(main())

    return sync if request.param == "sync" else asynchronous


def closed() -> Exception:
    return httpx.RemoteProtocolError("Server disconnected without sending a response.")


def test_a_read_is_sent_once_more_when_its_connection_closes(run: Any) -> None:
    script = Script(closed(), {"tools": [{"name": "tickets.get", "effect_class": "read"}]})
    tools = run(script, lambda c: c.tools())
    assert [t.name for t in tools] == ["tickets.get"]
    assert script.paths() == ["GET /v1/tools", "GET /v1/tools"]


def test_an_invocation_is_never_sent_again_by_itself(run: Any) -> None:
    script = Script(closed())
    with pytest.raises(idemgate.AnswerLost, match="for workflow 'w' step 's'"):
        run(script, lambda c: c.invoke("tickets.create", TICKET, workflow_id="w", step_id="s"))
    assert script.paths() == ["POST /v1/tools/tickets.create/invoke"]


def test_resending_keeps_the_identity_and_the_arguments(run: Any) -> None:
    script = Script(httpx.ReadError("reset"), httpx.ReadError("reset"), APPLIED)
    outcome = run(
        script,
        lambda c: c.invoke_resending(
            "tickets.create", TICKET, workflow_id="w", step_id="s", wait=2, backoff=0
        ),
    )
    assert isinstance(outcome, idemgate.Applied) and outcome.effect_reference == "ticket_1"
    bodies = [json.loads(r.content) for r in script.seen]
    assert bodies == [{"arguments": TICKET, "workflow_id": "w", "step_id": "s"}] * 3
    assert {r.headers["prefer"] for r in script.seen} == {"wait=2"}


def test_resending_stops_after_its_attempts(run: Any) -> None:
    script = Script(httpx.ReadError("reset"), httpx.ReadError("reset"))
    with pytest.raises(idemgate.AnswerLost):
        run(
            script,
            lambda c: c.invoke_resending(
                "tickets.create", TICKET, workflow_id="w", step_id="s", attempts=2, backoff=0
            ),
        )
    assert len(script.seen) == 2


def test_without_identity_the_tool_is_asked_about_once(run: Any) -> None:
    info = {"name": "tickets.create", "effect_class": "key_based", "operation_identity": "required"}
    script = Script(info)

    def twice(client: Any) -> Any:
        if isinstance(client, idemgate.AsyncClient):

            async def both() -> None:
                for _ in range(2):
                    with pytest.raises(idemgate.MissingIdentityError, match="key_based"):
                        await client.invoke("tickets.create", TICKET)

            return both()
        for _ in range(2):
            with pytest.raises(idemgate.MissingIdentityError, match="key_based"):
                client.invoke("tickets.create", TICKET)

    run(script, twice)
    assert script.paths() == ["GET /v1/tools/tickets.create"]


def test_operator_requests(run: Any) -> None:
    script = Script(APPLIED, APPLIED, APPLIED, APPLIED)

    async def gather(*outcomes: Any) -> list[Any]:
        return [await o for o in outcomes]

    def calls(client: Any) -> Any:
        outcomes = (
            client.approve("t:e:w:s", fingerprint="sha256:ab"),
            client.deny("t:e:w:s"),
            client.resolve_applied("t:e:w:s", "ticket_1", {"ticket_id": "ticket_1"}),
            client.resolve_not_applied("t:e:w:s"),
        )
        return gather(*outcomes) if isinstance(client, idemgate.AsyncClient) else list(outcomes)

    assert all(isinstance(o, idemgate.Applied) for o in run(script, calls))
    assert script.paths() == [
        "POST /v1/operations/t%3Ae%3Aw%3As/approve",
        "POST /v1/operations/t%3Ae%3Aw%3As/deny",
        "POST /v1/operations/t%3Ae%3Aw%3As/reconcile",
        "POST /v1/operations/t%3Ae%3Aw%3As/reconcile",
    ]
    assert [json.loads(r.content) for r in script.seen] == [
        {"fingerprint": "sha256:ab"},
        {},
        {"resolution": "applied", "effect_reference": "ticket_1", "result": {"ticket_id": "ticket_1"}},
        {"resolution": "not_applied"},
    ]
