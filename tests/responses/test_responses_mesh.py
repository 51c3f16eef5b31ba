"""/v1/responses through the mesh: a node that hosts nothing answers with a peer's model, with tools,
grammar, logprobs and previous_response_id (its own store)."""

from __future__ import annotations

import json

import openai
import pytest

from hydra_node.models import BUNDLED_MODEL_ID

MODEL = BUNDLED_MODEL_ID
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}


@pytest.fixture(scope="module")
def mesh(shared_mesh):
    """The session's shared mesh (tests/conftest.py): a host with the model, a front with none."""
    return shared_mesh.host, shared_mesh.front


def test_a_peer_serves_a_forced_call_with_logprobs(mesh):
    host, front = mesh
    client = openai.OpenAI(base_url=front.base_url, api_key="unused", max_retries=0, timeout=120)
    raw = client.responses.with_raw_response.create(
        model=MODEL,
        input="What is the weather in Paris?",
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
        max_output_tokens=80,
    )
    assert raw.headers["x-hydra-served-by"] == host.status()["node_id"]
    r = raw.parse()
    assert [o.type for o in r.output] == ["function_call"]
    assert isinstance(json.loads(r.output[0].arguments)["city"], str)

    follow = list(
        client.responses.create(
            model=MODEL,
            previous_response_id=r.id,
            tools=[WEATHER],
            tool_choice="none",
            temperature=0,
            max_output_tokens=12,
            include=["message.output_text.logprobs"],
            top_logprobs=1,
            stream=True,
            input=[{"type": "function_call_output", "call_id": r.output[0].call_id, "output": "Sunny."}],
        )
    )
    final = follow[-1].response
    assert follow[-1].type == "response.completed" and final.previous_response_id == r.id
    assert final.output_text and final.output[0].content[0].logprobs
    bare = client.responses.create(
        model=MODEL, input="What is the weather in Paris?", tools=[WEATHER], tool_choice="none", max_output_tokens=1
    )
    assert final.usage.input_tokens > bare.usage.input_tokens  # the stored exchange is in the prompt
