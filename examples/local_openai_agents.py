"""A function guarded in process, as an OpenAI Agents SDK function tool: the run's context names
the workflow, so a model that proposes the same call twice gets one effect — the second answer
is `replayed` — even when the first call's answer from the system was lost.

    pip install './clients/python[openai-agents]'
    python examples/local_openai_agents.py

So that it runs as written (no network, no API key), the model here is scripted: it proposes
`tickets_create` twice with the same arguments, then answers. Use a real model in your agent
(`Agent(model="...")`); nothing else changes. The ticket system is a list in memory whose
first answer is lost after the ticket is created; its lookup finds tickets by operation key.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any, Optional

from agents import Agent, ModelSettings, RunConfig, Runner, Usage
from agents.items import ModelResponse
from agents.models.interface import Model
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

import idemgate
from idemgate.openai_agents import RunIdentity, function_tool

TICKET = {"subject": "Refund request", "body": "Order 42 arrived broken."}


class ScriptedModel(Model):
    """Stands in for a model: proposes the same tool call twice, then says it is done."""

    def __init__(self) -> None:
        self.turns: list[list[Any]] = [
            [self.call("call_1")],
            [self.call("call_2")],
            [ResponseOutputMessage(type="message", id="msg_1", role="assistant", status="completed",
                                   content=[ResponseOutputText(type="output_text", text="Recorded.", annotations=[])])],
        ]

    @staticmethod
    def call(call_id: str) -> ResponseFunctionToolCall:
        return ResponseFunctionToolCall(type="function_call", id=f"fc_{call_id}", call_id=call_id,
                                        name="tickets_create", arguments=json.dumps(TICKET), status="completed")

    async def get_response(self, system_instructions: Optional[str], input: Any, model_settings: ModelSettings,
                           tools: list[Any], output_schema: Any, handoffs: list[Any], tracing: Any,
                           **rest: Any) -> ModelResponse:
        if isinstance(input, list) and input:
            last = input[-1] if isinstance(input[-1], dict) else input[-1].model_dump()
            if last.get("type") == "function_call_output":
                print(f"  the tool answered {last['call_id']}: {json.loads(last['output'])['outcome']}")
        return ModelResponse(output=self.turns.pop(0), usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


async def main(directory: Path) -> None:
    tickets: list[tuple[str, str]] = []  # (operation key, ticket id): the ticket system

    async with idemgate.AsyncLocal(f"sqlite://{directory / 'ops.sqlite'}", tenant="acme", environment="demo") as local:

        def find_ticket(idempotency_key: str) -> Optional[idemgate.Receipt]:
            found = [t for k, t in tickets if k == idempotency_key]
            return idemgate.Receipt(reference=found[0]) if found else None

        @local.tool("tickets.create", lookup=find_ticket)
        async def create_ticket(subject: str, body: str, *, idempotency_key: str) -> idemgate.Receipt:
            """Opens a support ticket."""
            ticket = f"T-{len(tickets) + 1}"
            tickets.append((idempotency_key, ticket))  # the effect
            if len(tickets) == 1:
                raise TimeoutError("the ticket system did not answer")  # ... and its answer is lost
            return idemgate.Receipt(reference=ticket)

        agent = Agent(name="support", instructions="Record the customer's issue.",
                      tools=[function_tool(create_ticket)], model=ScriptedModel())
        result = await Runner.run(agent, "My order arrived broken.", context=RunIdentity("conversation-9"),
                                  run_config=RunConfig(tracing_disabled=True))
        print("agent:", result.final_output)
    print(f"tickets created: {len(tickets)}")
    assert len(tickets) == 1


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as d:
        asyncio.run(main(Path(d)))
