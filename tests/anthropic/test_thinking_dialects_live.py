"""The Responses and Messages APIs with a reasoning model, through a node that does not host it, read
by the real SDKs: the openai SDK's ``client.responses.stream`` (reasoning item and
``response.reasoning_text`` events) and the anthropic SDK with thinking (thinking blocks, whole and
streamed, ``thinking_delta``s and the ``signature_delta``).

The model is the thinking fixture (tests/fixtures/models.py: the bundled SmolLM2 with a Qwen3-style
template whose generation prompt opens ``<think>``); the session's two-node mesh (``thinking_mesh``,
tests/conftest.py): ``host`` serves it, ``front`` hosts nothing and joined it. The 135M model thinks
poorly, so the tests assert on where the text goes (thoughts apart from the answer, never a tag in
either), not on what it says. Answers are kept short: Anthropic's smallest thinking budget is 1024
tokens, so the Messages tests let the model think with its default (``adaptive``) and cut it at
``max_tokens``."""

from __future__ import annotations

import anthropic
import openai
import pytest

from hydra_node.anthropic.format import THINKING_SIGNATURE

pytestmark = pytest.mark.live

MODEL = "thinking"  # the id the session's thinking_mesh serves the fixture under
QUESTION = "What is 2 + 2? Answer briefly."
TAGS = ("<think>", "</think>")


@pytest.fixture(scope="module")
def front(thinking_mesh):
    """The session's thinking mesh (tests/conftest.py): its front node, which hosts nothing."""
    return thinking_mesh.front


def untagged(*texts: str) -> bool:
    return not any(tag in t for t in texts for tag in TAGS)


def test_the_openai_sdk_streams_a_reasoning_item_through_a_peer(front):
    client = openai.OpenAI(base_url=front.base_url, api_key="unused", max_retries=0, timeout=180)
    ask = dict(model=MODEL, input=QUESTION, temperature=0, max_output_tokens=300)
    with client.responses.stream(**ask, reasoning={"effort": "minimal"}) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert final.output[0].type == "reasoning" and final.reasoning.effort == "minimal"
    thoughts = final.output[0].content[0].text
    deltas = [e.delta for e in events if e.type == "response.reasoning_text.delta"]
    assert thoughts and "".join(deltas) == thoughts and untagged(thoughts, final.output_text)
    assert [e.item_id for e in events if e.type == "response.reasoning_text.done"] == [final.output[0].id]
    assert 0 < final.usage.output_tokens_details.reasoning_tokens <= final.usage.output_tokens
    off = client.responses.create(**dict(ask, max_output_tokens=16), reasoning={"effort": "none"})
    assert [o.type for o in off.output] == ["message"] and off.usage.output_tokens_details.reasoning_tokens == 0


def test_the_anthropic_sdk_reads_thinking_blocks_through_a_peer(front):
    client = anthropic.Anthropic(base_url=front.base_url.removesuffix("/v1"), api_key="x", max_retries=0, timeout=180)
    ask = dict(model=MODEL, max_tokens=40, messages=[{"role": "user", "content": QUESTION}])
    greedy = {"temperature": 0}  # (the SDK's stream() takes no temperature argument)
    with client.messages.stream(**ask, thinking={"type": "adaptive"}, extra_body=greedy) as stream:
        events = list(stream)
        streamed = stream.get_final_message()
    whole = client.messages.create(**ask, thinking={"type": "adaptive"}, extra_body=greedy)
    for msg in (streamed, whole):
        block = msg.content[0]
        assert block.type == "thinking" and block.thinking and block.signature == THINKING_SIGNATURE
        assert untagged(block.thinking, *(b.text for b in msg.content if b.type == "text"))
    assert "".join(e.thinking for e in events if e.type == "thinking") == streamed.content[0].thinking
    assert [e.signature for e in events if e.type == "signature"] == [THINKING_SIGNATURE]
    off = client.messages.create(**dict(ask, max_tokens=16), thinking={"type": "disabled"}, extra_body=greedy)
    assert [b.type for b in off.content] == ["text"] and untagged(off.content[0].text)
