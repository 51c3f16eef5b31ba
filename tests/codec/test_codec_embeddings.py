"""The embedding contract's wire types: strict requests, strict replies (malformed -> RemoteError, 502),
a peer's error mapped like a generation's, frames bounded whatever the number of inputs."""

from __future__ import annotations

import math

import pytest

from hydra_node.codec import cbor
from hydra_node.inference import (
    MAX_EMBED_FRAME_BYTES,
    MAX_EMBEDDING_INPUTS,
    EmbeddingAssembler,
    EmbeddingRequest,
    EmbeddingResult,
    GenerationError,
    InvalidRequest,
    MalformedRemoteEvent,
    QueueFull,
    RemoteError,
    error_message,
    reply_messages,
    vector_bytes,
    vector_floats,
)


def vec(*xs: float) -> bytes:
    return vector_bytes(xs)


def test_a_request_round_trips_and_keeps_text_and_token_inputs_apart():
    req = EmbeddingRequest("m", ("hello", (1, 2, 3), "é"), "emb-1")
    wire = req.to_wire()
    assert wire == {"model": "m", "inputs": ["hello", [1, 2, 3], "é"], "request_id": "emb-1"}
    assert EmbeddingRequest.from_wire(cbor.decode(cbor.encode(wire))) == req
    assert EmbeddingRequest("m", ["a", [4]]).inputs == ("a", (4,))  # lists are normalised to tuples


@pytest.mark.parametrize(
    "inputs",
    [
        (),
        ("",),
        ((),),
        ("ok", ""),
        ((1, -1),),
        ((2**31,),),
        ((True,),),
        (1.5,),
        ("\ud800",),
        ("x",) * (MAX_EMBEDDING_INPUTS + 1),
    ],
)
def test_bad_inputs_are_refused_naming_input(inputs):
    with pytest.raises(InvalidRequest) as info:
        EmbeddingRequest("m", inputs)
    assert info.value.param == "input"


@pytest.mark.parametrize(
    "wire",
    [
        None,
        [],
        {"model": "m", "inputs": ["a"]},  # a key missing
        {"model": "m", "inputs": ["a"], "request_id": "", "dimensions": 8},  # an unknown key: refused, never ignored
        {"model": 3, "inputs": ["a"], "request_id": ""},
        {"model": "m", "inputs": "a", "request_id": ""},
        {"model": "m", "inputs": [{"a": 1}], "request_id": ""},
        {"model": "m", "inputs": ["a"], "request_id": 7},
        {"model": "", "inputs": ["a"], "request_id": ""},
    ],
)
def test_from_wire_is_strict(wire):
    with pytest.raises(InvalidRequest):
        EmbeddingRequest.from_wire(wire)


def test_vectors_are_little_endian_float32():
    assert vec(1.0, -2.0) == b"\x00\x00\x80\x3f\x00\x00\x00\xc0"
    assert vector_floats(vec(0.5, 0.25)) == [0.5, 0.25]


def test_a_reply_is_split_into_bounded_frames_and_reassembled():
    big = tuple(vec(*([float(i)] * 4096)) for i in range(300))  # 300 x 16 KiB: 4.8 MiB of vectors
    result = EmbeddingResult(big, 1234, "host")
    msgs = reply_messages(result)
    assert msgs[-1] == {"op": "embedded", "prompt_tokens": 1234, "served_by": "host"} and len(msgs) > 5
    assert all(len(cbor.encode(m)) <= MAX_EMBED_FRAME_BYTES for m in msgs)
    asm = EmbeddingAssembler(300)
    got = [asm.feed(cbor.decode(cbor.encode(m), max_size=MAX_EMBED_FRAME_BYTES)) for m in msgs]
    assert got[:-1] == [None] * (len(msgs) - 1) and got[-1] == result
    assert EmbeddingResult.from_wire(result.to_wire(), expected=300) == result
    assert result.dimensions == 4096


def test_served_by_is_ours_for_our_child():
    asm = EmbeddingAssembler(1, relay_status=True, served_by="me")
    asm.feed({"op": "vectors", "id": 3, "v": [vec(1.0)]})
    assert asm.feed({"op": "embedded", "id": 3, "prompt_tokens": 2}).served_by == "me"


@pytest.mark.parametrize(
    "msgs",
    [
        [{"op": "vectors", "v": []}],
        [{"op": "vectors", "v": "abcd"}],
        [{"op": "vectors", "v": [[0.5]]}],  # floats, not bytes
        [{"op": "vectors", "v": [b"abc"]}],  # not a whole float32
        [{"op": "vectors", "v": [b""]}],
        [{"op": "vectors", "v": [b"\x00" * (4 * 65537)]}],  # beyond MAX_EMBEDDING_DIM
        [{"op": "vectors", "v": [vec(1.0), vec(1.0, 0.0)]}],  # ragged
        [{"op": "vectors", "v": [vec(math.nan, 1.0)]}],
        [{"op": "vectors", "v": [vec(math.inf, 1.0)]}],
        [{"op": "vectors", "v": [vec(1.0)] * 3}],  # more vectors than inputs
        [{"op": "vectors", "v": [vec(1.0)]}, {"op": "embedded", "prompt_tokens": 1, "served_by": ""}],  # fewer
        [{"op": "vectors", "v": [vec(1.0)] * 2}, {"op": "embedded", "prompt_tokens": -1, "served_by": ""}],
        [{"op": "vectors", "v": [vec(1.0)] * 2}, {"op": "embedded", "prompt_tokens": 1.0, "served_by": ""}],
        [{"op": "vectors", "v": [vec(1.0)] * 2}, {"op": "embedded", "prompt_tokens": 1, "served_by": "x" * 129}],
        [{"op": "vectors", "v": [vec(1.0)] * 2}, {"op": "embedded", "prompt_tokens": 1, "served_by": 5}],
        [{"op": "delta", "text": "hi"}],
        [None],
        ["vectors"],
        [{"op": "error", "message": "all good", "code": "ok", "status": 200}],  # an error claiming success
        [{"op": "error", "message": "x", "status": "500"}],
    ],
)
def test_a_malformed_reply_is_a_502(msgs):
    asm = EmbeddingAssembler(2)
    with pytest.raises(MalformedRemoteEvent) as info:
        for m in msgs:
            asm.feed(m)
    assert info.value.status == 502 and isinstance(info.value, RemoteError)


def test_nothing_is_accepted_after_the_end():
    asm = EmbeddingAssembler(1)
    asm.feed({"op": "vectors", "v": [vec(1.0)]})
    asm.feed({"op": "embedded", "prompt_tokens": 1, "served_by": ""})
    with pytest.raises(MalformedRemoteEvent):
        asm.feed({"op": "vectors", "v": [vec(1.0)]})


def test_a_peers_error_maps_like_a_generations_and_our_childs_keeps_its_status():
    too_long = error_message(GenerationError("input[0] is 9001 tokens", code="context_length_exceeded", status=400))
    with pytest.raises(RemoteError) as info:
        EmbeddingAssembler(1).feed(too_long)
    assert (info.value.status, info.value.code, info.value.remote_status) == (502, "context_length_exceeded", 400)
    with pytest.raises(RemoteError) as info:
        EmbeddingAssembler(1).feed(error_message(QueueFull("m")))
    assert info.value.status == 503 and info.value.retryable
    with pytest.raises(GenerationError) as info:  # our own runner child: its 400 stays a 400
        EmbeddingAssembler(1, relay_status=True).feed({"id": 4, **too_long})
    assert info.value.status == 400 and info.value.code == "context_length_exceeded"
