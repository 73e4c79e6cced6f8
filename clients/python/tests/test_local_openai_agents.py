"""The OpenAI Agents SDK's own runner with a function guarded in process as its function tool,
and a scripted model (no network): a call proposed twice, and an answer lost after the effect,
are each one effect in the ledger the function writes."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Optional

from agents import RunConfig, Runner

from agents_support import TICKET, ScriptedModel, agent_with, call, run, say
from local_support import Ledger

import idemgate
from idemgate.openai_agents import RunIdentity, function_tool


def _create_ticket(local: idemgate.Local, ledger: Ledger, lose_answer: bool = False, lookup: bool = True) -> idemgate.LocalTool:
    def find(idempotency_key: str) -> Optional[idemgate.Receipt]:
        reference = ledger.find(idempotency_key)
        return idemgate.Receipt(reference, {"found": True}) if reference else None

    @local.tool("tickets.create", fingerprint=["subject", "body"], lookup=find if lookup else None)
    def create_ticket(subject: str, body: str, *, idempotency_key: str) -> idemgate.Receipt:
        """Opens a support ticket."""
        ledger.call(idempotency_key)
        reference = ledger.effect(idempotency_key, {"subject": subject, "body": body})
        if lose_answer and len(ledger.calls) == 1:
            # The ticket exists; its system's answer never arrives.
            raise TimeoutError("the ticket service did not answer in time")
        return idemgate.Receipt(reference, {"subject": subject})

    assert isinstance(create_ticket, idemgate.LocalTool)
    return create_ticket


def test_a_call_proposed_twice_is_one_effect(local: idemgate.Local, ledger: Ledger, run_id: str) -> None:
    different = dict(TICKET, subject="Another issue")
    model = ScriptedModel(
        [[call("call_1", TICKET)], [call("call_2", TICKET)], [call("call_3", different)], [say("Recorded.")]]
    )
    tool = function_tool(_create_ticket(local, ledger))
    assert tool.name == "tickets_create"
    assert tool.description == "Opens a support ticket."
    assert tool.params_json_schema["required"] == ["subject", "body"]
    result = run(agent_with(tool, model), RunIdentity(run_id))
    assert result.final_output == "Recorded."
    outputs = model.tool_outputs()
    key = f"acme:test:{run_id}:tickets.create"
    assert outputs["call_1"]["outcome"] == "applied"
    assert outputs["call_1"]["operation_key"] == key
    assert outputs["call_2"]["outcome"] == "replayed"
    assert outputs["call_2"]["effect_reference"] == outputs["call_1"]["effect_reference"] == "eff_1"
    assert outputs["call_3"]["outcome"] == "rejected"
    assert outputs["call_3"]["error"]["code"] == "idempotency_key_reused_with_different_request"
    assert outputs["call_3"]["safe_to_repeat"] is False
    assert ledger.count() == 1 and ledger.calls == [key]


def test_a_lost_answer_is_settled_by_the_lookup_and_the_second_proposal_replays(
    local: idemgate.Local, ledger: Ledger, run_id: str
) -> None:
    model = ScriptedModel([[call("call_1", TICKET)], [call("call_2", TICKET)], [say("Recorded.")]])
    tool = function_tool(_create_ticket(local, ledger, lose_answer=True))
    run(agent_with(tool, model), RunIdentity(run_id))
    outputs = model.tool_outputs()
    # The function raised after its effect: ambiguous, so the engine asked the lookup, which
    # found the ticket; the model's second proposal is answered from the record.
    assert outputs["call_1"]["outcome"] == "applied", outputs["call_1"]
    assert outputs["call_1"]["effect_reference"] == "eff_1"
    assert outputs["call_2"]["outcome"] == "replayed"
    assert ledger.count() == 1 and len(ledger.calls) == 1


def test_a_lost_answer_without_a_lookup_is_unknown_and_never_sent_again(
    local: idemgate.Local, ledger: Ledger, run_id: str
) -> None:
    model = ScriptedModel([[call("call_1", TICKET)], [call("call_2", TICKET)], [say("Noted.")]])
    tool = function_tool(_create_ticket(local, ledger, lose_answer=True, lookup=False))
    run(agent_with(tool, model), RunIdentity(run_id))
    outputs = model.tool_outputs()
    assert outputs["call_1"]["outcome"] == "unknown"
    assert outputs["call_1"]["safe_to_repeat"] is False
    assert "Do not retry it" in outputs["call_1"]["meaning"]
    assert outputs["call_2"]["outcome"] == "unknown"
    assert ledger.count() == 1 and len(ledger.calls) == 1


def test_an_async_tool_proposed_twice_in_one_turn_is_one_effect(tmp_path: Path, ledger: Ledger, run_id: str) -> None:
    async def main(model: ScriptedModel) -> None:
        async with idemgate.AsyncLocal(f"sqlite://{tmp_path / 'ops.sqlite'}", tenant="acme", environment="test") as local:

            @local.tool("tickets.create", fingerprint=["subject", "body"])
            async def create_ticket(subject: str, body: str, *, idempotency_key: str) -> idemgate.Receipt:
                """Opens a support ticket."""
                ledger.call(idempotency_key)
                await asyncio.sleep(0.2)  # both proposals are in flight at once
                return idemgate.Receipt(ledger.effect(idempotency_key, {"subject": subject}))

            tool = function_tool(create_ticket, wait=10)
            await Runner.run(
                agent_with(tool, model), "Please record it.", context={"workflow_id": run_id},
                run_config=RunConfig(tracing_disabled=True),
            )

    model = ScriptedModel([[call("call_1", TICKET), call("call_2", TICKET)], [say("Recorded.")]])
    asyncio.run(main(model))
    outputs = model.tool_outputs()
    assert sorted(o["outcome"] for o in outputs.values()) == ["applied", "replayed"]
    assert ledger.count() == 1 and len(ledger.calls) == 1
