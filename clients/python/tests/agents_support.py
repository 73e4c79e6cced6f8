"""What the OpenAI Agents SDK tests share: a scripted model (the SDK's `Model` interface, no
network, no API key, tracing off) and the items it proposes."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Optional

from agents import Agent, ModelSettings, RunConfig, Runner, Usage, set_tracing_disabled
from agents.items import ModelResponse
from agents.models.interface import Model
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

set_tracing_disabled(True)

TICKET = {"subject": "Refund request", "body": "Order 42 arrived broken."}


def call(call_id: str, arguments: dict[str, Any], name: str = "tickets_create") -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        type="function_call",
        id=f"fc_{call_id}",
        call_id=call_id,
        name=name,
        arguments=json.dumps(arguments),
        status="completed",
    )


def say(text: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(
        type="message",
        id="msg_final",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
    )


class ScriptedModel(Model):
    """Answers each turn with the next scripted output, and keeps what it was given."""

    def __init__(self, turns: list[list[Any]]) -> None:
        self.turns = list(turns)
        self.inputs: list[Any] = []

    async def get_response(
        self,
        system_instructions: Optional[str],
        input: Any,
        model_settings: ModelSettings,
        tools: list[Any],
        output_schema: Any,
        handoffs: list[Any],
        tracing: Any,
        *,
        previous_response_id: Optional[str] = None,
        conversation_id: Optional[str] = None,
        prompt: Any = None,
        **rest: Any,
    ) -> ModelResponse:
        self.inputs.append(input)
        if not self.turns:
            raise AssertionError("the model was asked for more turns than were scripted")
        return ModelResponse(output=self.turns.pop(0), usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("the scripted model does not stream")

    def tool_outputs(self) -> dict[str, dict[str, Any]]:
        """What the tool returned to the model, by call id, parsed from the last input."""
        outputs: dict[str, dict[str, Any]] = {}
        for item in self.inputs[-1] if self.inputs and not isinstance(self.inputs[-1], str) else []:
            item = item if isinstance(item, dict) else item.model_dump()
            if item.get("type") == "function_call_output":
                outputs[item["call_id"]] = json.loads(item["output"])
        return outputs


def run(agent: Agent[Any], context: Any) -> Any:
    return asyncio.run(
        Runner.run(
            agent, "Please record the customer's issue.", context=context,
            run_config=RunConfig(tracing_disabled=True),
        )
    )


def agent_with(tool: Any, model: ScriptedModel) -> Agent[Any]:
    return Agent(name="support", instructions="Record issues.", tools=[tool], model=model)
