"""Real clients against a reasoning model, through a node that does not host it: the openai SDK
(``reasoning_content`` is not in its types, so it is read from the message's extra fields, as
DeepSeek's and llama-server's users do) and litellm (its own ``reasoning_content``).

The model is the thinking fixture (tests/fixtures/models.py: the bundled SmolLM2 with a
Qwen3-style template whose generation prompt opens ``<think>``); the session's two-node mesh
(``thinking_mesh``, tests/conftest.py): ``host`` serves it, ``front`` hosts nothing and joined it.
The 135M model thinks poorly, so the tests assert on where the text goes: thoughts in
``reasoning_content``, never in ``content``, counted in
``usage.completion_tokens_details.reasoning_tokens``, and ``reasoning_effort`` honoured (``none``: no
thoughts) on the model that reasons while the bundled-model tests refuse it."""

from __future__ import annotations

import litellm
import openai
import pytest

pytestmark = pytest.mark.live

MODEL = "thinking"  # the id the session's thinking_mesh serves the fixture under
ASK = [{"role": "user", "content": "What is 2 + 2? Answer briefly."}]
#: enough tokens that the budget of "minimal" ends the thoughts and the answer begins
GREEDY = dict(model=MODEL, messages=ASK, temperature=0, max_tokens=300)


@pytest.fixture(scope="module")
def front(thinking_mesh):
    """The session's thinking mesh (tests/conftest.py): its front node, which hosts nothing."""
    return thinking_mesh.front


@pytest.fixture(scope="module")
def client(front):
    with openai.OpenAI(base_url=front.base_url, api_key="unused", max_retries=0, timeout=180) as c:
        yield c


def test_openai_sdk_reads_reasoning_content_apart_from_the_answer(client):
    r = client.chat.completions.create(**GREEDY, reasoning_effort="minimal")
    message = r.choices[0].message
    thoughts = (message.model_extra or {}).get("reasoning_content")
    assert thoughts and "<think>" not in thoughts and "</think>" not in thoughts
    assert "<think>" not in (message.content or "") and "</think>" not in (message.content or "")
    details = r.usage.completion_tokens_details
    assert 0 < details.reasoning_tokens <= r.usage.completion_tokens

    chunks = list(client.chat.completions.create(**GREEDY, reasoning_effort="minimal", stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    streamed = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas)
    content = "".join(d.content or "" for d in deltas)
    assert streamed == thoughts and content == (message.content or "")  # greedy: the same answer
    first_content = next((i for i, d in enumerate(deltas) if d.content), len(deltas))
    assert all(not (d.model_extra or {}).get("reasoning_content") for d in deltas[first_content:])


def test_reasoning_effort_none_and_reasoning_format_none(client):
    off = client.chat.completions.create(**GREEDY, reasoning_effort="none")
    assert not (off.choices[0].message.model_extra or {}).get("reasoning_content")
    assert off.usage.completion_tokens_details.reasoning_tokens == 0
    inline = (
        client.chat.completions.create(**GREEDY, reasoning_effort="minimal", extra_body={"reasoning_format": "none"})
        .choices[0]
        .message
    )
    assert not (inline.model_extra or {}).get("reasoning_content")
    assert inline.content.startswith("<think>") and "</think>" in inline.content


def test_litellm_reasoning_content(front):
    litellm.telemetry = False
    r = litellm.completion(
        model=f"openai/{MODEL}",
        api_base=front.base_url,
        api_key="x",
        messages=ASK,
        temperature=0,
        max_tokens=300,
        num_retries=0,
        timeout=180,
        extra_body={"reasoning_effort": "minimal"},
    )
    message = r.choices[0].message
    assert message.reasoning_content and "</think>" not in (message.content or "")
