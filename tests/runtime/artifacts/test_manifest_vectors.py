"""protocol/vectors/manifests.json holds against the code (its freshness against the generator is
checked with every other vector file by tests/mesh/wire/test_vectors.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from nacl.signing import SigningKey

from hydra_node.mesh.wire.envelope import signing_input
from hydra_node.runtime.artifacts.errors import ArtifactError
from hydra_node.codec import cbor
from hydra_node.runtime.artifacts.manifest import MANIFEST_CONTEXT, Manifest
from hydra_node.runtime.artifacts.peer_wire import ArtifactRequest, WireError
from vector_json import from_json

DOC = json.loads((Path(__file__).resolve().parents[3] / "protocol" / "vectors" / "manifests.json").read_text())


@pytest.mark.parametrize("vector", DOC["valid"], ids=lambda v: v["name"])
def test_valid_manifests(vector: dict[str, Any]) -> None:
    assert DOC["context"] == MANIFEST_CONTEXT
    m = Manifest.from_cbor(bytes.fromhex(vector["hex"]))
    m.verify()
    assert m.node_id == bytes(SigningKey(bytes.fromhex(DOC["signer_seed"])).verify_key).hex()
    assert m.to_wire() == from_json(vector["decoded"])
    assert m.to_cbor().hex() == vector["hex"]
    assert m.body_bytes().hex() == vector["body_hex"]
    assert signing_input(MANIFEST_CONTEXT, m.body_bytes()).hex() == vector["signing_input_hex"]
    assert (m.manifest_id, m.size) == (vector["manifest_id"], vector["size"])
    assert Manifest.from_json(vector["json"]) == m and m.to_json() == vector["json"]


@pytest.mark.parametrize("vector", DOC["invalid"], ids=lambda v: v["name"])
def test_invalid_manifests(vector: dict[str, Any]) -> None:
    with pytest.raises(ArtifactError) as caught:
        Manifest.from_cbor(bytes.fromhex(vector["hex"])).verify()
    assert caught.value.code == vector["error"]


@pytest.mark.parametrize("vector", DOC["fetch_headers"]["valid"], ids=lambda v: v["name"])
def test_valid_fetch_headers(vector: dict[str, Any]) -> None:
    header = cbor.decode(bytes.fromhex(vector["hex"]), max_size=4096)
    assert header == vector["header"]
    req = ArtifactRequest.from_header(header)
    assert req.offset == vector["offset"] and req.header() == header
    assert cbor.encode(req.header()).hex() == vector["hex"]


@pytest.mark.parametrize("vector", DOC["fetch_headers"]["invalid"], ids=lambda v: v["name"])
def test_invalid_fetch_headers(vector: dict[str, Any]) -> None:
    assert vector["error"] == "bad_request"  # what the holder answers
    with pytest.raises(WireError):
        ArtifactRequest.from_header(cbor.decode(bytes.fromhex(vector["hex"]), max_size=4096))
