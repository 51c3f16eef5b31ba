"""What a llama-server user expects, through a node that hosts nothing (the shared mesh's front):
the OpenAI routes without ``/v1``, ``model`` left out (the mesh serves one model), ``/tokenize``
and ``/detokenize`` answered by the host's vocabulary, and the API on ``[::1]`` too."""

from __future__ import annotations

import http.client
import json
import socket

import pytest

from harness import request
from hydra_node.models import BUNDLED_MODEL_ID

MODEL = BUNDLED_MODEL_ID


@pytest.fixture(scope="module")
def mesh(shared_mesh):
    assert not shared_mesh.front.status()["models"]  # the front hosts nothing
    return shared_mesh


def post(node, path: str, body: dict) -> tuple[int, dict, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", node.api_port, timeout=120)
    conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    data = json.loads(r.read() or b"null")
    headers = {k.lower(): v for k, v in r.getheaders()}
    conn.close()
    return r.status, headers, data


def test_openai_routes_without_v1_are_served_through_the_mesh(mesh):
    front, host_id = mesh.front, mesh.host_id
    code, body = request("GET", front.api_port, "/models")
    listed = {m["id"]: m for m in json.loads(body)["data"]}
    assert code == 200 and listed[MODEL]["caps"] == {}  # the bundled model neither reasons nor fills in
    ask = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "temperature": 0}
    code, headers, chat = post(front, "/chat/completions", ask)
    assert code == 200 and chat["object"] == "chat.completion" and headers["x-hydra-served-by"] == host_id
    assert chat == {**chat, "system_fingerprint": host_id}
    assert chat["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0
    code, headers, cmpl = post(front, "/completions", {"model": MODEL, "prompt": "1, 2, 3,", "max_tokens": 3})
    assert code == 200 and cmpl["object"] == "text_completion" and cmpl["system_fingerprint"] == host_id
    code, _, emb = post(front, "/embeddings", {"model": MODEL, "input": "hello"})
    assert code == 200 and len(emb["data"][0]["embedding"]) > 0


def test_a_body_without_model_is_the_meshs_one_model(mesh):
    code, _, chat = post(
        mesh.front, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    )
    assert code == 200 and chat["model"] == MODEL
    code, _, cmpl = post(mesh.front, "/completions", {"prompt": "Once upon a time", "max_tokens": 2, "top_k": 1})
    assert code == 200 and cmpl["model"] == MODEL


def test_a_completion_without_prompt_starts_a_new_document(mesh):
    """OpenAI: ``prompt`` absent or null generates after ``<|endoftext|>``; the bundled model's
    tokenizer adds no BOS, so an empty prompt must not be refused as empty."""
    for body in ({"model": MODEL, "prompt": None, "max_tokens": 2}, {"model": MODEL, "max_tokens": 2}):
        code, _, cmpl = post(mesh.front, "/v1/completions", body)
        assert code == 200 and cmpl["usage"]["prompt_tokens"] == 1, cmpl


def test_tokenize_and_detokenize_through_a_node_that_does_not_host_the_model(mesh):
    text = "Hello world, hello mesh"
    code, headers, tok = post(mesh.front, "/tokenize", {"content": text})
    assert code == 200 and headers["x-hydra-served-by"] == mesh.host_id
    ids = tok["tokens"]
    assert ids and all(type(t) is int for t in ids)
    code, _, pieces = post(mesh.front, "/tokenize", {"model": MODEL, "content": text, "with_pieces": True})
    assert code == 200 and [p["id"] for p in pieces["tokens"]] == ids
    assert "".join(p["piece"] for p in pieces["tokens"]) == text
    code, _, de = post(mesh.front, "/detokenize", {"model": MODEL, "tokens": ids})
    assert code == 200 and de == {"content": text}
    code, _, err = post(mesh.front, "/tokenize", {"model": "no-such-model", "content": "x"})
    assert code == 404 and err["error"]["code"] == "model_not_found"


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="this machine has no IPv6 loopback (::1)")
def test_the_api_answers_on_ipv6_loopback(mesh):
    conn = http.client.HTTPConnection("::1", mesh.front.api_port, timeout=30)
    conn.request("GET", "/v1/models")
    r = conn.getresponse()
    assert r.status == 200 and MODEL in [m["id"] for m in json.loads(r.read())["data"]]
    conn.close()


def test_fill_in_the_middle_is_refused_naming_a_model_without_fim_tokens(mesh):
    """The bundled SmolLM2's vocabulary has no FIM tokens (llama.cpp finds none): ``/infill`` and
    completions ``suffix`` are 400s naming it, decided on the front from the host's capabilities."""
    body = {"input_prefix": "def add(a, b):\n", "input_suffix": "\nprint(add(1, 2))\n", "n_predict": 8}
    code, _, err = post(mesh.front, "/infill", body)
    assert code == 400 and err["error"]["param"] == "model" and MODEL in err["error"]["message"]
    code, _, err = post(mesh.front, "/v1/completions", {"prompt": "def f(", "suffix": "\n", "max_tokens": 4})
    assert code == 400 and err["error"]["param"] == "suffix" and MODEL in err["error"]["message"]
