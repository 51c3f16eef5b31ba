"""Artifact manifests: canonical CBOR and JSON forms, the Ed25519 signature, the bounds, and
untrusted bytes that only ever produce a manifest or ManifestInvalid."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nacl.signing import SigningKey

from hydra_node.codec import cbor
from hydra_node.mesh.wire.envelope import signing_input
from hydra_node.runtime.artifacts.errors import ManifestInvalid, SignatureInvalid
from hydra_node.runtime.artifacts.manifest import (
    MANIFEST_CONTEXT,
    MAX_FILES,
    MAX_IDENTITY_BYTES,
    MAX_IDENTITY_KEYS,
    ArtifactFile,
    Manifest,
    hash_file,
    signer,
    validate_name,
)

KEY = SigningKey(bytes([0xA1]) * 32)
OTHER = SigningKey(bytes([0xB2]) * 32)
SHA = "ab" * 32


def manifest(**changes) -> Manifest:
    base = {
        "kind": "kv_state",
        "name": "prefix-1",
        "files": (ArtifactFile("state.bin", 10, SHA), ArtifactFile("meta/a.json", 0, "cd" * 32)),
        "identity": {"model_sha256": "ef" * 32, "tokens": [1, 2, 3], "raw": b"\x00\x01", "n_ctx": 4096},
        "location": "posix:/vast/hydra",
        "created_at": 1_790_000_000,
    }
    base.update(changes)
    return Manifest(**base)


def test_signed_manifest_round_trips_through_cbor_and_json_and_verifies() -> None:
    m = manifest().sign(KEY)
    m.verify()
    assert m.node_id == bytes(KEY.verify_key).hex() and len(m.signature) == 64
    assert [f.path for f in m.files] == ["meta/a.json", "state.bin"]  # kept sorted by path
    assert m.size == 10
    assert Manifest.from_cbor(m.to_cbor()) == m
    assert Manifest.from_json(m.to_json()) == m
    assert len({m, Manifest.from_cbor(m.to_cbor())}) == 1  # hashable despite its identity map
    doc = json.loads(m.to_json())
    assert doc["identity"]["raw"] == {"bytes": "0001"} and doc["manifest_id"] == m.manifest_id
    assert doc["sig"] == {"bytes": m.signature.hex()}


def test_the_signature_covers_the_domain_separated_canonical_body() -> None:
    m = manifest().sign(KEY)
    body = m.body_bytes()
    assert cbor.decode(body)["node"] == m.node_id and "sig" not in cbor.decode(body)
    KEY.verify_key.verify(signing_input(MANIFEST_CONTEXT, body), m.signature)
    assert signing_input(MANIFEST_CONTEXT, body).startswith(b"hydra/1/artifact-manifest\x00")
    assert m.manifest_id == __import__("hashlib").sha256(body).hexdigest()
    assert signer(KEY)(manifest()) == m  # Ed25519 is deterministic


@pytest.mark.parametrize(
    "change",
    [
        {"name": "prefix-2"},
        {"kind": "recurrent_state"},
        {"created_at": 1_790_000_001},
        {"location": "posix:/vast/other"},
        {"identity": {"n_ctx": 2048}},
        {"files": (ArtifactFile("state.bin", 11, SHA),)},
        {"files": (ArtifactFile("state.bin", 10, "00" * 32),)},
    ],
)
def test_any_changed_field_breaks_the_signature(change) -> None:
    m = manifest().sign(KEY)
    with pytest.raises(SignatureInvalid):
        replace(m, **change).verify()


def test_unsigned_forged_or_re_attributed_manifests_do_not_verify() -> None:
    with pytest.raises(SignatureInvalid, match="not signed"):
        manifest().verify()
    m = manifest().sign(KEY)
    with pytest.raises(SignatureInvalid):
        replace(m, node_id=bytes(OTHER.verify_key).hex()).verify()
    with pytest.raises(SignatureInvalid):
        replace(m, signature=bytes(64)).verify()
    with pytest.raises(SignatureInvalid, match="sign it first"):
        manifest().to_cbor()


@pytest.mark.parametrize("name", ["a", "qwen3-stage-0", "m@sha256:abc", "x.y_z+1", "A" * 128])
def test_valid_names(name) -> None:
    assert validate_name(name) == name


@pytest.mark.parametrize("name", ["", ".hidden", "-x", "a/b", "a b", "A" * 129, "é", None, 7])
def test_invalid_names(name) -> None:
    with pytest.raises(ManifestInvalid):
        validate_name(name)


@pytest.mark.parametrize(
    "path", ["", "/abs", "a//b", "a/./b", "../x", "a/..", "a\\b", "a\x00b", "x" * 513, "a/" + "y" * 256]
)
def test_invalid_file_paths(path) -> None:
    with pytest.raises(ManifestInvalid):
        ArtifactFile(path, 1, SHA)


@pytest.mark.parametrize(
    "changes",
    [
        {"kind": "weights"},
        {"files": ()},
        {"files": (ArtifactFile("a", 1, SHA), ArtifactFile("a", 2, SHA))},
        {"files": (ArtifactFile("a", 1, SHA), ArtifactFile("a/b", 2, SHA))},  # a file cannot also be a folder
        {"files": tuple(ArtifactFile(f"f{i}", 0, SHA) for i in range(MAX_FILES + 1))},
        {"identity": {f"k{i}": i for i in range(MAX_IDENTITY_KEYS + 1)}},
        {"identity": {"blob": b"x" * (MAX_IDENTITY_BYTES + 1)}},
        {"identity": {"bytes": "ab"}},
        {"identity": {"nan": float("nan")}},
        {"identity": {1: "int key"}},
        {"location": "/no/scheme"},
        {"location": "posix:relative"},
        {"location": "s3://"},
        {"created_at": -1},
        {"created_at": True},
        {"node_id": "zz"},
    ],
)
def test_bounds_and_fields_are_checked_when_built(changes) -> None:
    with pytest.raises(ManifestInvalid):
        manifest(**changes)


def test_file_fields() -> None:
    for size, sha in ((-1, SHA), (True, SHA), (1 << 41, SHA), (1, "AB" * 32), (1, "ab")):
        with pytest.raises(ManifestInvalid):
            ArtifactFile("f", size, sha)


def test_decoding_refuses_what_the_format_forbids() -> None:
    wire = manifest().sign(KEY).to_wire()
    for mutate in (
        lambda w: w.pop("sig"),
        lambda w: w.update(extra=1),
        lambda w: w.update(v=2),
        lambda w: w.update(sig=b"short"),
        lambda w: w.update(node="x"),
        lambda w: w["files"].append({"path": "z", "size": 1}),
        lambda w: w.update(files="nope"),
    ):
        w = {**wire, "files": list(wire["files"])}
        mutate(w)
        with pytest.raises(ManifestInvalid):
            Manifest.from_cbor(cbor.encode(w))
    with pytest.raises(ManifestInvalid, match="canonical"):
        Manifest.from_cbor(b"\xa1\x61a\x18\x01")  # non-shortest integer
    with pytest.raises(ManifestInvalid):
        Manifest.from_json("[1]")
    with pytest.raises(ManifestInvalid):
        Manifest.from_json("{not json")
    doc = json.loads(manifest().sign(KEY).to_json())
    doc["size"] = 1
    with pytest.raises(ManifestInvalid, match="does not match"):
        Manifest.from_json(json.dumps(doc))


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_untrusted_cbor_bytes_give_a_manifest_or_manifest_invalid(data) -> None:
    try:
        Manifest.from_cbor(data)
    except ManifestInvalid:
        pass


@settings(max_examples=50, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=8) | st.floats(),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
        max_leaves=20,
    )
)
def test_untrusted_json_gives_a_manifest_or_manifest_invalid(value) -> None:
    doc = json.loads(manifest().sign(KEY).to_json())
    doc["identity"] = {"x": value}
    try:
        m = Manifest.from_json(json.dumps(doc))
    except (ManifestInvalid, ValueError) as exc:
        assert isinstance(exc, ManifestInvalid), exc
        return
    with pytest.raises(SignatureInvalid):  # a changed identity never verifies
        m.verify()


def test_the_whole_encoding_is_byte_stable_and_every_prefix_is_refused() -> None:
    data = manifest().sign(KEY).to_cbor()
    assert manifest().sign(KEY).to_cbor() == data
    for cut in (1, len(data) // 2, len(data) - 1):
        with pytest.raises(ManifestInvalid):
            Manifest.from_cbor(data[:cut])
    with pytest.raises(ManifestInvalid):
        Manifest.from_cbor(data + b"\x00")


def test_hash_file(tmp_path) -> None:
    p = tmp_path / "f"
    p.write_bytes(b"hello")
    assert hash_file(p) == (5, "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824")
