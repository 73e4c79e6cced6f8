"""Bad input raises a clear error naming what is wrong, and nothing reaches the fake."""

from __future__ import annotations

import asyncio
from typing import Iterator

import pytest

from fake_sor import FakeSystemOfRecord
from harness import AGENT_TOKEN, Gateway, free_port, operation_key

import idemgate

TICKET = {"subject": "Refund request", "body": "Order 42 arrived broken."}


@pytest.fixture
def untouched(fake: FakeSystemOfRecord) -> Iterator[None]:
    """Asserts that the test sent nothing to the system of record."""
    before = fake.total_requests()
    yield
    assert fake.total_requests() == before


@pytest.mark.usefixtures("untouched")
def test_unknown_tool_names_the_tool(client: idemgate.Client, run_id: str) -> None:
    with pytest.raises(idemgate.UnknownToolError) as raised:
        client.invoke("tickets.nope", TICKET, workflow_id=run_id, step_id="s")
    assert raised.value.tool == "tickets.nope"
    assert "'tickets.nope'" in str(raised.value) and client.base_url in str(raised.value)
    assert raised.value.outcome.http_status == 404
    # Without an identity the client asks about the tool first, with the same answer.
    with pytest.raises(idemgate.UnknownToolError, match="tickets.nope"):
        client.invoke("tickets.nope", TICKET)
    with pytest.raises(idemgate.UnknownToolError, match="'nope'"):
        client.tool("nope")


@pytest.mark.usefixtures("untouched")
def test_missing_identity_names_the_tool_and_how_to_give_one(
    client: idemgate.Client, operator: idemgate.Client, run_id: str
) -> None:
    with pytest.raises(idemgate.MissingIdentityError) as raised:
        client.invoke("tickets.create", TICKET)
    text = str(raised.value)
    assert "'tickets.create'" in text and "key_based" in text
    assert "workflow_id" in text and "idemgate.workflow(" in text
    assert raised.value.tool == "tickets.create"

    with pytest.raises(idemgate.MissingIdentityError, match="names no step_id"):
        client.invoke("tickets.create", TICKET, workflow_id=run_id)
    with pytest.raises(idemgate.MissingIdentityError, match="step 'record_issue' has no workflow_id"):
        client.step("record_issue").invoke("tickets.create", TICKET)
    with client.workflow(run_id), pytest.raises(idemgate.MissingIdentityError):
        client.invoke("tickets.create", TICKET)
    with pytest.raises(idemgate.InvalidIdentityError, match="':'"):
        client.invoke("tickets.create", TICKET, workflow_id=run_id, step_id="a:b")
    with pytest.raises(idemgate.InvalidIdentityError, match="empty"):
        idemgate.workflow("")
    # Nothing was recorded under the run either.
    page = operator.operations(after=operation_key(run_id, ""), limit=10)
    assert not [r for r in page.operations if r.operation_key.startswith(operation_key(run_id, ""))]


@pytest.mark.usefixtures("untouched")
def test_gateway_down_names_the_url() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with idemgate.Client(url, AGENT_TOKEN) as down:
        with pytest.raises(idemgate.GatewayUnavailable) as raised:
            down.invoke("tickets.create", TICKET, workflow_id="w", step_id="s")
        assert url in str(raised.value) and "nothing was sent" in str(raised.value)
        assert isinstance(raised.value, idemgate.TransportError)
        with pytest.raises(idemgate.GatewayUnavailable):
            down.tools()

    async def async_down() -> None:
        async with idemgate.AsyncClient(url, AGENT_TOKEN) as client:
            await client.invoke("tickets.create", TICKET, workflow_id="w", step_id="s")

    with pytest.raises(idemgate.GatewayUnavailable, match=url):
        asyncio.run(async_down())


@pytest.mark.usefixtures("untouched")
def test_a_refused_token_says_so(gateway: Gateway, run_id: str) -> None:
    with idemgate.Client(gateway.url, "not-a-token") as wrong:
        with pytest.raises(idemgate.AuthenticationError) as raised:
            wrong.invoke("tickets.create", TICKET, workflow_id=run_id, step_id="s")
    assert "bearer token" in str(raised.value) and "not accepted" in str(raised.value)
    assert raised.value.outcome.http_status == 401
    with pytest.raises(ValueError, match="token is empty"):
        idemgate.Client(gateway.url, " ")
    with pytest.raises(ValueError, match="base_url"):
        idemgate.Client("127.0.0.1:8080", AGENT_TOKEN)


@pytest.mark.usefixtures("untouched")
def test_operator_actions_need_an_operator_token(client: idemgate.Client) -> None:
    with pytest.raises(idemgate.RejectedError) as raised:
        client.operations(status="unknown")
    assert raised.value.code == "forbidden" and raised.value.outcome.http_status == 403
    refused = client.approve(operation_key("nobody", "s"))
    assert isinstance(refused, idemgate.Rejected) and refused.code == "forbidden"


@pytest.mark.usefixtures("untouched")
def test_a_missing_operation_is_not_found(client: idemgate.Client, operator: idemgate.Client) -> None:
    with pytest.raises(idemgate.NotFoundError, match="no such operation"):
        client.operation(operation_key("never-ran", "s"))
    with pytest.raises(idemgate.NotFoundError):
        operator.reconcile(operation_key("never-ran", "s"))


def test_something_that_is_not_a_gateway(fake: FakeSystemOfRecord) -> None:
    with idemgate.Client(fake.url, AGENT_TOKEN) as lost:
        with pytest.raises(idemgate.ProtocolError, match="no outcome label"):
            lost.invoke("tickets.create", TICKET, workflow_id="w", step_id="s")
