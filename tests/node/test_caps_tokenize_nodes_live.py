"""The root's wiring of capabilities and the tokenizer, on the session's shared mesh (tests/conftest.py):
the host announces its model's ``model_caps``, the front (hosting nothing) lists them in
``/api/status`` and answers ``/tokenize`` and ``/detokenize`` on the host over a ``tokenize`` stream."""

from __future__ import annotations

import json

import pytest
from harness import request

from hydra_node.models import BUNDLED_MODEL_ID

pytestmark = pytest.mark.live

CAPS = {
    "reasoning": "",
    "thinks": False,
    "switch": False,
    "fim": False,
    "vision": False,
    "audio": False,
}  # SmolLM2: none


def test_the_front_knows_the_hosts_caps_and_tokenizes_there(shared_mesh):
    host, front = shared_mesh.host, shared_mesh.front
    assert host.status()["models"][0]["caps"] == CAPS  # the runner's ready message
    assert front.status()["model_caps"][BUNDLED_MODEL_ID] == CAPS
    text = "Hello <|im_start|> world"
    code, body = request("POST", front.api_port, "/tokenize", {"model": BUNDLED_MODEL_ID, "content": text})
    assert code == 200, body
    tokens = json.loads(body)["tokens"]
    assert 1 in tokens  # <|im_start|>, read as its special token (parse_special defaults to true)
    code, body = request("POST", front.api_port, "/detokenize", {"model": BUNDLED_MODEL_ID, "tokens": tokens})
    assert code == 200 and json.loads(body)["content"] == text, body
