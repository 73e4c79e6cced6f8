"""The OpenAI Agents SDK with a scripted model (the SDK's `Model` interface, no network, no API
key, tracing off): a call proposed twice and a lost answer are each one effect at the fake."""

from __future__ import annotations

import asyncio

import pytest
from agents import Runner, RunConfig

from agents_support import TICKET, ScriptedModel, agent_with, call, run, say
from fake_sor import FakeSystemOfRecord, Fault
from harness import AGENT_TOKEN, Gateway, LosingProxy, operation_key

import idemgate
from idemgate.openai_agents import RunIdentity, function_tool, function_tool_async


def test_a_call_proposed_twice_is_one_operation(
    client: idemgate.Client, fake: FakeSystemOfRecord, run_id: str
) -> None:
    different = dict(TICKET, subject="Another issue")
    model = ScriptedModel(
        [
            [call("call_1", TICKET)],
            [call("call_2", TICKET)],
            [call("call_3", different)],
            [say("Recorded.")],
        ]
    )
    tool = function_tool(client, "tickets.create")
    assert tool.name == "tickets_create"
    result = run(agent_with(tool, model), RunIdentity(run_id))
    assert result.final_output == "Recorded."
    outputs = model.tool_outputs()
    assert outputs["call_1"]["outcome"] == "applied"
    assert outputs["call_2"]["outcome"] == "replayed"
    assert outputs["call_2"]["effect_reference"] == outputs["call_1"]["effect_reference"]
    assert "Do not repeat" in outputs["call_2"]["meaning"]
    # Other arguments under the same step: a mismatch, not a second ticket.
    assert outputs["call_3"]["outcome"] == "rejected"
    assert outputs["call_3"]["error"]["code"] == "idempotency_key_reused_with_different_request"
    assert outputs["call_3"]["safe_to_repeat"] is False
    assert outputs["call_1"]["operation_key"] == operation_key(run_id, "tickets.create")
    assert fake.effect_count(run_id) == 1
    assert outputs["call_1"]["effect_reference"] == fake.effects(run_id)[0].reference


def test_the_same_call_twice_in_one_turn_is_one_effect(
    client: idemgate.Client, fake: FakeSystemOfRecord, run_id: str
) -> None:
    model = ScriptedModel([[call("call_1", TICKET), call("call_2", TICKET)], [say("Recorded.")]])
    tool = function_tool(client, "tickets.create", wait=10)
    run(agent_with(tool, model), {"workflow_id": run_id})
    outputs = model.tool_outputs()
    assert sorted(o["outcome"] for o in outputs.values()) == ["applied", "replayed"]
    assert fake.effect_count(run_id) == 1


def test_a_dropped_answer_is_recovered_by_the_gateway(
    client: idemgate.Client, fake: FakeSystemOfRecord, run_id: str
) -> None:
    # The ticket service commits and drops the connection: the gateway settles it by the
    # receipt lookup (or a resend under the same key), and the tool reports one ticket.
    fake.script(run_id, Fault.drop())
    model = ScriptedModel([[call("call_1", TICKET)], [call("call_2", TICKET)], [say("Recorded.")]])
    run(agent_with(function_tool(client, "tickets.create"), model), RunIdentity(run_id))
    outputs = model.tool_outputs()
    assert outputs["call_1"]["outcome"] == "applied"
    assert outputs["call_2"]["outcome"] == "replayed"
    assert fake.effect_count(run_id) == 1


def test_a_lost_gateway_answer_then_the_model_calls_again(
    gateway: Gateway, proxy: LosingProxy, fake: FakeSystemOfRecord, run_id: str
) -> None:
    async def main(model: ScriptedModel) -> None:
        async with idemgate.AsyncClient(proxy.url, AGENT_TOKEN) as client:
            tool = await function_tool_async(client, "tickets.create")
            proxy.lose = 1
            await Runner.run(
                agent_with(tool, model), "Please record it.", context=RunIdentity(run_id),
                run_config=RunConfig(tracing_disabled=True),
            )

    model = ScriptedModel([[call("call_1", TICKET)], [call("call_2", TICKET)], [say("Recorded.")]])
    asyncio.run(main(model))
    outputs = model.tool_outputs()
    assert outputs["call_1"]["error"]["code"] == "answer_lost"
    assert "same operation" in outputs["call_1"]["meaning"]
    assert outputs["call_2"]["outcome"] == "replayed"
    assert proxy.lost == 1
    assert fake.effect_count(run_id) == 1


def test_the_resend_option_recovers_a_lost_answer_inside_the_tool(
    gateway: Gateway, proxy: LosingProxy, fake: FakeSystemOfRecord, run_id: str
) -> None:
    model = ScriptedModel([[call("call_1", TICKET)], [say("Recorded.")]])
    with idemgate.Client(proxy.url, AGENT_TOKEN) as client:
        tool = function_tool(client, "tickets.create", resend_attempts=3)
        proxy.lose = 1
        run(agent_with(tool, model), RunIdentity(run_id))
    assert model.tool_outputs()["call_1"]["outcome"] == "replayed"
    assert proxy.lost == 1 and proxy.forwarded == 3  # the description, the lost one, the resend
    assert fake.effect_count(run_id) == 1


def test_an_explicit_scope_names_the_workflow_and_step(
    client: idemgate.Client, fake: FakeSystemOfRecord, run_id: str
) -> None:
    model = ScriptedModel([[call("call_1", TICKET)], [say("Recorded.")]])
    tool = function_tool(client, "tickets.create", step=lambda args: "never-used")
    with idemgate.workflow(run_id), idemgate.step("record_issue"):
        run(agent_with(tool, model), RunIdentity("ignored"))
    assert model.tool_outputs()["call_1"]["operation_key"] == operation_key(run_id, "record_issue")
    assert fake.effect_count(run_id) == 1


def test_a_run_without_identity_fails_naming_the_tool(
    client: idemgate.Client, fake: FakeSystemOfRecord
) -> None:
    before = fake.total_requests()
    model = ScriptedModel([[call("call_1", TICKET)], [say("Recorded.")]])
    with pytest.raises(Exception) as raised:
        run(agent_with(function_tool(client, "tickets.create"), model), None)
    chain = [raised.value, raised.value.__cause__, raised.value.__context__]
    assert any(isinstance(e, idemgate.MissingIdentityError) for e in chain), chain
    assert "tickets.create" in str(next(e for e in chain if isinstance(e, idemgate.MissingIdentityError)))
    with pytest.raises(idemgate.UnknownToolError, match="tickets.nope"):
        function_tool(client, "tickets.nope")
    assert fake.total_requests() == before
