"""Sans-IO pieces: the ggml RPC handshake codec, readiness lines, versions."""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hydra_node.runtime.rpc import (
    RPC_PROTO,
    BadReadiness,
    IncompatibleWorker,
    ProtoVersion,
    Readiness,
    RpcProtocolError,
    StartFailure,
    check_worker_proto,
    parse_readiness,
)
from hydra_node.runtime.rpc import proto as _proto


def test_proto_constant_matches_vendored_header():
    # ggml/include/ggml-rpc.h in llama-cpp-python 0.3.36's vendored llama.cpp
    assert (RPC_PROTO.major, RPC_PROTO.minor, RPC_PROTO.patch) == (7, 0, 0)
    assert _proto.GGML_RPC_MAX_SERVERS == 16 and _proto.CMD_HELLO == 14


def test_hello_request_bytes():
    assert _proto.encode_hello() == bytes([14]) + struct.pack("<Q", 24) + bytes(24)
    assert _proto.encode_device_count() == bytes([15]) + bytes(8)
    assert _proto.encode_device_memory(2) == bytes([11]) + struct.pack("<QI", 4, 2)


def _reply(payload: bytes) -> bytes:
    return struct.pack("<Q", len(payload)) + payload


@pytest.mark.parametrize("split", ["whole", "bytewise"])
def test_response_reader_whole_and_byte_by_byte(split):
    wire = _reply(bytes([7, 1, 2, 0]) + bytes(24))
    r = _proto.ResponseReader(_proto.HELLO_REPLY_SIZE)
    chunks = [wire] if split == "whole" else [wire[i : i + 1] for i in range(len(wire))]
    for c in chunks[:-1]:
        r.receive_data(c)
        assert r.next_payload() is None
    r.receive_data(chunks[-1])
    assert _proto.decode_hello(r.next_payload()) == ProtoVersion(7, 1, 2)


def test_response_reader_rejects_wrong_size_and_trailing_junk():
    r = _proto.ResponseReader(_proto.DEVICE_COUNT_REPLY_SIZE)
    with pytest.raises(RpcProtocolError, match="replied with 8 bytes"):
        r.receive_data(_reply(bytes(8)))
    r = _proto.ResponseReader(_proto.DEVICE_COUNT_REPLY_SIZE)
    with pytest.raises(RpcProtocolError, match="more bytes"):
        r.receive_data(_reply(struct.pack("<I", 1)) + b"junk")


def test_decoders_reject_nonsense():
    with pytest.raises(RpcProtocolError):
        _proto.decode_device_count(struct.pack("<I", 0))
    with pytest.raises(RpcProtocolError):
        _proto.decode_device_memory(struct.pack("<QQ", 10, 5))
    assert _proto.decode_device_memory(struct.pack("<QQ", 5, 10)) == (5, 10)


@given(
    st.binary(max_size=80),
    st.sampled_from([_proto.HELLO_REPLY_SIZE, _proto.DEVICE_COUNT_REPLY_SIZE, _proto.DEVICE_MEMORY_REPLY_SIZE]),
)
def test_reader_and_decoders_on_arbitrary_bytes(data, size):
    decode = {
        _proto.HELLO_REPLY_SIZE: _proto.decode_hello,
        _proto.DEVICE_COUNT_REPLY_SIZE: _proto.decode_device_count,
        _proto.DEVICE_MEMORY_REPLY_SIZE: _proto.decode_device_memory,
    }[size]
    r = _proto.ResponseReader(size)
    try:
        r.receive_data(data)
        payload = r.next_payload()
        if payload is not None:
            decode(payload)
    except RpcProtocolError:
        pass


def test_version_compatibility_rule():
    assert RPC_PROTO.accepts_worker(ProtoVersion(7, 0, 9))
    assert not RPC_PROTO.accepts_worker(ProtoVersion(7, 1, 0))  # newer minor: we may lack its commands
    assert not RPC_PROTO.accepts_worker(ProtoVersion(6, 0, 0))
    with pytest.raises(IncompatibleWorker, match="6.5.0.*7.0.0"):
        check_worker_proto(ProtoVersion(6, 5, 0))
    assert ProtoVersion.parse("7.0.0") == RPC_PROTO
    for bad in ["7.0", "7.0.0.0", "a.b.c", 7, "7.0.-1", "7.0.1000"]:
        with pytest.raises(ValueError):
            ProtoVersion.parse(bad)


READY = {
    "ready": True,
    "endpoint": "127.0.0.1:5",
    "proto": "7.0.0",
    "free_bytes": 10,
    "total_bytes": 20,
    "device": "CPU",
    "description": "x",
    "pid": 3,
}


def test_readiness_round_trip_and_failure_lines():
    r = parse_readiness(json.dumps(READY).encode() + b"\n")
    assert isinstance(r, Readiness) and r.proto == RPC_PROTO and r.to_wire() == READY
    f = parse_readiness(b'{"ready": false, "error": "boom", "permanent": true}')
    assert f == StartFailure("boom", True)


@pytest.mark.parametrize(
    "line",
    [
        b"Starting RPC server v7.0.0",
        b"[]",
        b'{"ready": 1}',
        b"\xff\xfe",
        json.dumps({**READY, "proto": "seven"}).encode(),
        json.dumps({**READY, "free_bytes": 30}).encode(),
        json.dumps({**READY, "free_bytes": -1}).encode(),
        json.dumps({**READY, "device": None}).encode(),
        b"{" + b" " * 5000 + b"}",
    ],
)
def test_bad_readiness_lines(line):
    with pytest.raises(BadReadiness):
        parse_readiness(line)


@given(st.binary(max_size=300))
def test_readiness_on_arbitrary_bytes(data):
    try:
        assert isinstance(parse_readiness(data), (Readiness, StartFailure))
    except BadReadiness:
        pass


@given(
    st.dictionaries(
        st.sampled_from(list(READY) + ["permanent", "error"]),
        st.none() | st.booleans() | st.integers(-5, 2**70) | st.text(max_size=10),
    )
)
def test_readiness_on_arbitrary_json(d):
    try:
        assert isinstance(parse_readiness(json.dumps(d).encode()), (Readiness, StartFailure))
    except BadReadiness:
        pass
