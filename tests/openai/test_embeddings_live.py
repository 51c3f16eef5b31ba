"""/v1/embeddings on live nodes with the real bundled model, driven by the official openai client:
a host (A) and a node that hosts nothing (C, joined to A's mesh) whose answers come through the mesh."""

from __future__ import annotations

import base64
import json
import math
import struct
import threading

import llama_cpp
import openai
import pytest
from harness import NodeProcess, request

from hydra_node.models import BUNDLED_MODEL_ID

MODEL = BUNDLED_MODEL_ID
DIM = 576  # SmolLM2-135M's embedding size
CAT, KITTEN = "The cat sat on the mat.", "A kitten was sitting on the rug."
MONEY, STOCKS = "Quarterly revenue grew by twelve percent.", "Stock prices fell sharply today."


@pytest.fixture(scope="module")
def mesh(shared_mesh):
    """The session's shared mesh (tests/conftest.py): A hosts the model, C hosts nothing."""
    return {"a": shared_mesh.host, "c": shared_mesh.front, "a_id": shared_mesh.host_id}


def client_for(node: NodeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=node.base_url, api_key="unused", max_retries=0, timeout=120)


def cos(u, v) -> float:
    return sum(x * y for x, y in zip(u, v)) / math.sqrt(sum(x * x for x in u) * sum(y * y for y in v))


def post(node: NodeProcess, body: dict) -> tuple[int, dict]:
    code, raw = request("POST", node.api_port, "/v1/embeddings", body)
    return code, json.loads(raw)


def test_float_embeddings_are_unit_vectors_in_input_order(mesh):
    res = client_for(mesh["a"]).embeddings.create(model=MODEL, input=[CAT, KITTEN, MONEY], encoding_format="float")
    assert res.object == "list" and res.model == MODEL
    assert [d.index for d in res.data] == [0, 1, 2] and all(d.object == "embedding" for d in res.data)
    for d in res.data:
        assert len(d.embedding) == DIM
        assert abs(math.sqrt(sum(x * x for x in d.embedding)) - 1.0) < 1e-4
    assert res.usage.prompt_tokens > 3 and res.usage.total_tokens == res.usage.prompt_tokens
    single = client_for(mesh["a"]).embeddings.create(model=MODEL, input=KITTEN, encoding_format="float")
    assert len(single.data) == 1 and cos(single.data[0].embedding, res.data[1].embedding) > 0.9999


def test_similar_texts_are_closer_than_unrelated_ones(mesh):
    res = client_for(mesh["a"]).embeddings.create(model=MODEL, input=[CAT, KITTEN, MONEY, STOCKS])
    cat, kitten, money, stocks = (d.embedding for d in res.data)
    assert cos(cat, kitten) > cos(cat, money) and cos(cat, kitten) > cos(kitten, stocks)
    assert cos(money, stocks) > cos(money, cat)


def test_base64_is_little_endian_float32_of_the_same_vector(mesh):
    code, body = post(mesh["a"], {"model": MODEL, "input": [CAT], "encoding_format": "base64"})
    assert code == 200, body
    raw = base64.b64decode(body["data"][0]["embedding"])
    as_b64 = struct.unpack(f"<{DIM}f", raw)
    as_float = client_for(mesh["a"]).embeddings.create(model=MODEL, input=[CAT], encoding_format="float")
    assert max(abs(x - y) for x, y in zip(as_b64, as_float.data[0].embedding)) < 1e-6
    # the SDK's default asks for base64 and decodes it itself
    sdk = client_for(mesh["a"]).embeddings.create(model=MODEL, input=[CAT])
    assert max(abs(x - y) for x, y in zip(sdk.data[0].embedding, as_b64)) < 1e-6


def test_token_input_is_used_as_given_and_text_gets_bos(model_path, mesh):
    vocab = llama_cpp.Llama(model_path=str(model_path), vocab_only=True, verbose=False)
    ids = vocab.tokenize(CAT.encode(), add_bos=True, special=False)
    c = client_for(mesh["a"])
    text, tokens, both = (
        c.embeddings.create(model=MODEL, input=x, encoding_format="float") for x in (CAT, ids, [ids, ids[1:]])
    )
    assert tokens.usage.prompt_tokens == len(ids) == text.usage.prompt_tokens
    assert cos(text.data[0].embedding, tokens.data[0].embedding) > 0.9999
    assert both.usage.prompt_tokens == 2 * len(ids) - 1 and len(both.data) == 2
    if ids[0] != ids[1]:  # without the BOS it is another sequence, hence another vector
        assert cos(both.data[0].embedding, both.data[1].embedding) < 0.9999


def test_refusals_are_openai_errors(mesh):
    c = client_for(mesh["a"])
    with pytest.raises(openai.BadRequestError) as info:
        c.embeddings.create(model=MODEL, input=[CAT], dimensions=64)
    assert "dimensions is not supported" in info.value.message and info.value.body["param"] == "dimensions"
    with pytest.raises(openai.NotFoundError) as info:
        c.embeddings.create(model="no-such-model", input=[CAT])
    assert info.value.body["code"] == "model_not_found"
    for body, param in (
        ({"model": MODEL, "input": ""}, "input"),
        ({"model": MODEL, "input": []}, "input"),
        ({"model": MODEL, "input": [CAT, ""]}, "input"),
        ({"model": MODEL, "input": ["x"] * 2049}, "input"),
        ({"model": MODEL, "input": [CAT], "encoding_format": "int8"}, "encoding_format"),
        ({"model": MODEL, "input": [CAT], "truncate": True}, "truncate"),
    ):
        code, err = post(mesh["a"], body)
        assert code == 400 and err["error"]["param"] == param, (body, err)
    code, err = post(mesh["a"], {"model": MODEL, "input": [CAT], "user": "u-1"})
    assert code == 200, err
    code, err = post(mesh["a"], {"model": MODEL, "input": ["hello " * 9000]})
    assert code == 400 and err["error"]["code"] == "context_length_exceeded", err
    code, err = post(mesh["a"], {"model": MODEL, "input": [[10**9]]})
    assert code == 400 and "vocabulary" in err["error"]["message"], err


def test_a_node_without_the_model_answers_through_the_mesh(mesh):
    direct = client_for(mesh["a"]).embeddings.create(model=MODEL, input=[CAT, MONEY], encoding_format="float")
    raw = client_for(mesh["c"]).embeddings.with_raw_response.create(
        model=MODEL, input=[CAT, MONEY], encoding_format="float"
    )
    assert raw.headers["x-hydra-served-by"] == mesh["a_id"]
    via_c = raw.parse()
    assert [d.index for d in via_c.data] == [0, 1] and via_c.usage == direct.usage
    for u, v in zip(via_c.data, direct.data):
        assert cos(u.embedding, v.embedding) > 0.9999
    code, err = post(mesh["c"], {"model": MODEL, "input": ["hello " * 9000]})
    assert code == 502 and err["error"]["code"] == "context_length_exceeded", err  # a peer's failure: 502
    code, err = post(mesh["c"], {"model": MODEL, "input": [CAT], "dimensions": 8})
    assert code == 400 and err["error"]["param"] == "dimensions"


def test_generation_keeps_flowing_while_embedding(mesh):
    """Embeddings are worked between engine steps: a stream and a batch of embeddings both finish."""
    c = client_for(mesh["a"])
    out: dict = {}

    def embed() -> None:
        out["embed"] = c.embeddings.create(model=MODEL, input=[f"{CAT} {i}" for i in range(64)])

    t = threading.Thread(target=embed)
    stream = c.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Count to twenty."}],
        max_tokens=48,
        temperature=0,
        stream=True,
    )
    t.start()
    text = "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
    t.join(120)
    assert text and len(out["embed"].data) == 64
