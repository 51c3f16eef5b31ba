"""Parsing a /v1/embeddings body: every key honoured or refused with a 400 naming it; the response shape."""

from __future__ import annotations

import base64
import json
import struct

import pytest

from hydra_node.openai.embeddings import parse_embedding_request, response_body
from hydra_node.api.errors import ApiError
from hydra_node.inference import EmbeddingRequest, EmbeddingResult, vector_bytes


def parse(**body):
    return parse_embedding_request(json.dumps(body).encode())


def test_every_input_shape():
    assert parse(model="m", input="hi")[0].inputs == ("hi",)
    assert parse(model="m", input=["a", "b"])[0].inputs == ("a", "b")
    assert parse(model="m", input=[1, 2, 3])[0].inputs == ((1, 2, 3),)  # one token array
    assert parse(model="m", input=[[1, 2], [3]])[0].inputs == ((1, 2), (3,))
    req, fmt = parse(model="m", input="hi", encoding_format="base64", user="u", dimensions=None)
    assert fmt == "base64" and req.request_id.startswith("emb-")
    assert parse(model="m", input="hi")[1] == "float"


@pytest.mark.parametrize(
    "body, param, code",
    [
        ({"input": "x"}, "model", "missing_required_parameter"),
        ({"model": "m"}, "input", "missing_required_parameter"),
        ({"model": "m", "input": ""}, "input", "invalid_value"),
        ({"model": "m", "input": []}, "input", "invalid_type"),
        ({"model": "m", "input": ["a", ""]}, "input", "invalid_value"),
        ({"model": "m", "input": [[]]}, "input", "invalid_value"),
        ({"model": "m", "input": ["a", 1]}, "input", "invalid_type"),
        ({"model": "m", "input": [[1], "a"]}, "input", "invalid_type"),
        ({"model": "m", "input": [1.5]}, "input", "invalid_type"),
        ({"model": "m", "input": [[-1]]}, "input", "invalid_value"),
        ({"model": "m", "input": ["a"] * 2049}, "input", "invalid_value"),
        ({"model": "m", "input": "a", "encoding_format": "int8"}, "encoding_format", "invalid_value"),
        ({"model": "m", "input": "a", "dimensions": 256}, "dimensions", "unsupported_parameter"),
        ({"model": "m", "input": "a", "user": 5}, "user", "invalid_type"),
        ({"model": "m", "input": "a", "input_type": "query"}, "input_type", "unknown_parameter"),
    ],
)
def test_refusals_name_the_parameter(body, param, code):
    with pytest.raises(ApiError) as info:
        parse_embedding_request(json.dumps(body).encode())
    assert (info.value.status, info.value.param, info.value.code) == (400, param, code)
    if param == "dimensions":
        assert "dimensions is not supported" in info.value.message


def test_bad_json_is_a_400():
    for raw in (b"{", b"[1]", b"[" * 100 + b"]" * 100):
        with pytest.raises(ApiError) as info:
            parse_embedding_request(raw)
        assert info.value.status == 400


def test_response_shape_float_and_base64():
    req = EmbeddingRequest("m", ("a", "b"))
    v0, v1 = vector_bytes([0.6, 0.8]), vector_bytes([1.0, 0.0])
    result = EmbeddingResult((v0, v1), 5, "host")
    body = json.loads(response_body(req, result, "float"))
    assert body["object"] == "list" and body["model"] == "m"
    assert body["usage"] == {"prompt_tokens": 5, "total_tokens": 5}
    assert [d["index"] for d in body["data"]] == [0, 1] and body["data"][0]["object"] == "embedding"
    # each float is the float32 value itself, in at most 9 significant digits (float32 round-trips)
    assert struct.pack("<2f", *body["data"][0]["embedding"]) == v0 and body["data"][1]["embedding"] == [1.0, 0.0]
    assert all(len(repr(x).lstrip("0.").replace(".", "")) <= 9 for x in body["data"][0]["embedding"])
    b64 = json.loads(response_body(req, result, "base64"))["data"][0]["embedding"]
    assert struct.unpack("<2f", base64.b64decode(b64)) == struct.unpack("<2f", v0)
