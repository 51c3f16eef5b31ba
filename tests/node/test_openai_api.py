"""A live node with the real bundled model, driven by the official openai client and raw HTTP."""

from __future__ import annotations

import json
import socket

import openai
import pytest

from harness import request
from hydra_node.models import BUNDLED_MODEL_ID

MODEL = BUNDLED_MODEL_ID


@pytest.fixture(scope="module")
def node(shared_node):
    """The session's shared node (tests/conftest.py): prompt cache off, as these tests compare outputs."""
    return shared_node


@pytest.fixture(scope="module")
def client(node):
    return openai.OpenAI(base_url=node.base_url, api_key="unused", max_retries=0, timeout=60)


def test_models_lists_bundled_model(client, node):
    models = client.models.list()
    ids = [m.id for m in models.data]
    assert ids == [MODEL]
    assert node.status()["node_id"] in models.data[0].model_extra["hosts"]


def test_chat_completion(client):
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hello."}], max_tokens=12, temperature=0
    )
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens <= 12 and r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_completion_greedy_is_deterministic_and_respects_stop(client):
    kw = dict(model=MODEL, prompt="def add(a, b):\n", max_tokens=30, temperature=0)
    a = client.completions.create(**kw)
    b = client.completions.create(**kw)
    assert a.choices[0].text == b.choices[0].text and a.choices[0].text
    stopped = client.completions.create(**kw, stop=["return"])
    assert "return" not in stopped.choices[0].text
    assert a.choices[0].text.startswith(stopped.choices[0].text)


def test_streaming_chat_matches_non_streaming(client):
    kw = dict(
        model=MODEL, messages=[{"role": "user", "content": "Name three colours."}], max_tokens=16, temperature=0, seed=7
    )
    full = client.chat.completions.create(**kw).choices[0].message.content
    chunks = list(client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes and finishes[-1] in ("stop", "length")


def test_streaming_completion_ends_with_done(node):
    code, body = request(
        "POST",
        node.api_port,
        "/v1/completions",
        {"model": MODEL, "prompt": "1, 2, 3,", "max_tokens": 5, "temperature": 0, "stream": True},
    )
    assert code == 200
    events = [e for e in body.split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    payloads = [json.loads(e[6:]) for e in events[:-1]]
    assert all(p["object"] == "text_completion" for p in payloads)
    assert payloads[-1]["choices"][0]["finish_reason"] in ("stop", "length")


def test_sampling_with_seed_is_reproducible(client):
    kw = dict(model=MODEL, prompt="Once upon a time", max_tokens=16, temperature=0.9, top_p=0.9, seed=1234)
    assert client.completions.create(**kw).choices[0].text == client.completions.create(**kw).choices[0].text


# ---- errors ----------------------------------------------------------------------------


def _error(code_body):
    code, body = code_body
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return code, err


def test_malformed_json_is_400(node):
    code, err = _error(request("POST", node.api_port, "/v1/chat/completions", "{not json"))
    assert code == 400 and err["code"] == "invalid_json"


@pytest.mark.parametrize(
    "body,param",
    [
        ({"model": 5, "messages": [{"role": "user", "content": "x"}]}, "model"),
        ({"model": MODEL}, "messages"),
        ({"model": MODEL, "messages": []}, "messages"),
        ({"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, "temperature"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "temperature": 3}, "temperature"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 1.5}, "max_tokens"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "stop": [1]}, "stop"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "stream": "yes"}, "stream"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "n": 1.0}, "n"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "n": True}, "n"),
        (
            {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0},
            "max_completion_tokens",
        ),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "audio": {"voice": "x"}}, "audio"),
        (
            {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "reasoning_effort": "low"},
            "reasoning_effort",
        ),
    ],
)
def test_bad_fields_are_400_naming_the_param(node, body, param):
    path = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
    code, err = _error(request("POST", node.api_port, path, body))
    assert code == 400 and err["param"] == param and err["type"] == "invalid_request_error"


def test_json_that_is_not_an_object_is_400(node):
    code, err = _error(request("POST", node.api_port, "/v1/completions", "[1,2]"))
    assert code == 400


def test_unknown_model_is_404(node):
    code, err = _error(
        request(
            "POST",
            node.api_port,
            "/v1/chat/completions",
            {"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]},
        )
    )
    assert code == 404 and err["code"] == "model_not_found" and MODEL in err["message"]


def test_body_over_8_mib_is_413(node):
    body = b'{"model":"x","prompt":"' + b"a" * (8 * 1024 * 1024 + 10) + b'"}'
    code, err = _error(request("POST", node.api_port, "/v1/completions", body))
    assert code == 413


def test_oversized_headers_are_431(node):
    code, err = _error(request("GET", node.api_port, "/v1/models", headers={"X-Big": "a" * 70000}))
    assert code == 431


def test_unknown_route_404_and_wrong_method_405(node):
    assert _error(request("GET", node.api_port, "/v1/nothing"))[0] == 404
    code, err = _error(request("GET", node.api_port, "/v1/chat/completions"))
    assert code == 405 and err["type"] == "invalid_request_error"


def test_deeply_nested_json_is_400_and_node_survives(node):
    code, err = _error(request("POST", node.api_port, "/v1/chat/completions", b"[" * 100000 + b"]" * 100000))
    assert code == 400 and err["code"] == "invalid_json"
    assert request("GET", node.api_port, "/v1/models")[0] == 200


def test_keep_alive_serves_two_requests_on_one_socket(node):
    with socket.create_connection(("127.0.0.1", node.api_port), timeout=30) as s:
        req = b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        s.sendall(req + req)
        data = b""
        while data.count(b"HTTP/1.1 200") < 2:
            chunk = s.recv(65536)
            assert chunk, data
            data += chunk


def test_garbage_request_line_gets_400_and_node_survives(node):
    with socket.create_connection(("127.0.0.1", node.api_port), timeout=10) as s:
        s.sendall(b"\x00\x01\x02 garbage\r\n\r\n")
        assert s.recv(65536).startswith(b"HTTP/1.1 400")
    assert request("GET", node.api_port, "/v1/models")[0] == 200


def test_management_api(node):
    st = node.status()
    for key in (
        "node_id",
        "version",
        "node_state",
        "models",
        "peers",
        "inflight_requests",
        "queue_depth",
        "runner_restarts",
        "uptime_s",
    ):
        assert key in st
    assert st["node_state"] == "serving" and st["peers"] == []
    assert st["models"][0]["state"] == "ready"
    assert request("GET", node.console_port, "/health")[0] == 200
    code, body = request("GET", node.console_port, "/")
    assert code == 200 and "Hydra" in body


@pytest.mark.parametrize("path", ["/v1/responses", "/v1/embeddings"])
def test_deeply_nested_json_is_400_on_every_post_route(node, path):
    code, err = _error(request("POST", node.api_port, path, b"[" * 100000 + b"]" * 100000))
    assert code == 400 and err["code"] == "invalid_json"
