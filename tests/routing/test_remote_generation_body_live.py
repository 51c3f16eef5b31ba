"""An agent-sized chat (~100 KB of messages, far past a stream header's 16 KiB) sent to a node that
hosts nothing reaches its peer through two real nodes: the request travels as the generate stream's
body (protocol/README.md section 11.3). Before the body form the front node refused it with 413
``request_too_large``.

The conversation is longer than the bundled model's 4096-token context, so the peer's runner answers
with its ``context_length_exceeded`` error naming the prompt's token count: proof that every message
arrived, at the cost of a tokenisation (a prefill that fits the context would take tens of seconds on
a CI machine; tests/routing/test_remote_generation_body.py serves such requests over real links)."""

from __future__ import annotations

import re

import openai
import pytest

from hydra_node.models import BUNDLED_MODEL_ID

SYSTEM = "You are a coding agent. Follow the tool schema exactly; never invent a tool. " * 800
TOOL_OUTPUT = "def f(x):\n    return x + 1\n" * 1500


def test_a_100_kb_chat_to_a_node_that_hosts_nothing_reaches_its_peer(shared_mesh):
    front = openai.OpenAI(base_url=shared_mesh.front.base_url, api_key="unused", max_retries=0, timeout=120)
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Here is the file:\n" + TOOL_OUTPUT},
        {"role": "user", "content": "Say hi."},
    ]
    assert sum(len(m["content"]) for m in messages) > 100_000
    with pytest.raises(openai.APIStatusError) as info:
        front.chat.completions.create(model=BUNDLED_MODEL_ID, messages=messages, max_tokens=2, temperature=0)
    err = info.value
    assert err.status_code != 413, err.message  # before the body form: request_too_large at the front
    assert isinstance(err.body, dict) and err.body.get("code") == "context_length_exceeded", err.body
    # the host's runner counted the whole conversation's tokens
    found = re.search(r"prompt is (\d+) tokens", err.message)
    assert found and int(found.group(1)) > 20_000, err.message
