"""The kv_state file: it round-trips, and a truncated, extended, corrupted or inconsistent file is refused
with a typed error before any byte would reach llama.cpp."""

from __future__ import annotations

import dataclasses
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hydra_node.codec import cbor
from hydra_node.runtime.artifacts.errors import ArtifactError, ChecksumMismatch
from hydra_node.runtime.artifacts.kv_state import (
    MAGIC,
    KvStateHeader,
    KvStateInvalid,
    decode_header,
    encode_header,
    header_length,
    open_kv_state,
    write_kv_state,
)
from tests.runtime.artifacts.test_kv_identity import BASE, TOKENS

STATE = bytes(range(256)) * 40


def _read(path) -> tuple[KvStateHeader, bytes]:
    with open_kv_state(path) as r:
        buf = bytearray(r.header.state_bytes)
        r.read_state_into(buf)
        return r.header, bytes(buf)


def test_a_state_file_round_trips(tmp_path):
    path = tmp_path / "s.hykv"
    written = write_kv_state(path, BASE, TOKENS, STATE)
    header, state = _read(path)
    assert header == written and state == STATE and header.identity == BASE and header.tokens == TOKENS
    assert path.stat().st_size == header.file_bytes
    assert [p.name for p in tmp_path.iterdir()] == ["s.hykv"]  # no temporary file left behind


def test_a_corrupted_state_is_refused(tmp_path):
    path = tmp_path / "s.hykv"
    write_kv_state(path, BASE, TOKENS, STATE)
    data = bytearray(path.read_bytes())
    data[-100] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(ChecksumMismatch):
        _read(path)


@pytest.mark.parametrize("how", ["truncated", "trailing", "magic", "version", "huge_header", "header_only"])
def test_a_malformed_file_is_refused(tmp_path, how):
    path = tmp_path / "s.hykv"
    write_kv_state(path, BASE, TOKENS, STATE)
    data = path.read_bytes()
    data = {
        "truncated": data[:-1],
        "trailing": data + b"\0",
        "magic": b"GGUF" + data[4:],
        "version": MAGIC[:4] + b"\x02" + data[5:],
        "huge_header": MAGIC + struct.pack(">I", 2**31) + data[9:],
        "header_only": data[:40],
    }[how]
    path.write_bytes(data)
    with pytest.raises(KvStateInvalid):
        _read(path)


def test_a_header_whose_tokens_are_not_its_identitys_prefix_is_refused():
    good = KvStateHeader(BASE, TOKENS, len(STATE), b"\0" * 32)
    body = encode_header(good)[9:]
    assert decode_header(body) == good
    m = cbor.decode(body)
    for bad in (
        {**m, "identity": {**m["identity"], "n_tokens": 3}},
        {**m, "tokens": m["tokens"][:-4]},
        {**m, "state_sha256": b"\0" * 31},
        {**m, "state_bytes": 0},
        {**m, "extra": 1},
        {k: v for k, v in m.items() if k != "tokens"},
        {**m, "identity": {**m["identity"], "type_k": 1}},
    ):
        with pytest.raises(KvStateInvalid):
            decode_header(cbor.encode(bad))
    with pytest.raises(KvStateInvalid):
        encode_header(dataclasses.replace(good, tokens=TOKENS[:-1]))


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_give_a_header_or_a_typed_error(data):
    try:
        header_length(data[:9])
        decode_header(data[9:])
    except ArtifactError:
        pass
