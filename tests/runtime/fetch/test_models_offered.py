"""The model cache offered through ``artifact_fetch`` (sans-IO and on a real cache folder): each
verified file is the ``model_weights`` artifact ``sha256:HEX`` with a manifest this node signs,
announced after placement's; the requester's check of a holder's reply refuses a manifest another
node signed or one that is not the file asked for."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from nacl.signing import SigningKey

from hydra_node.mesh.wire.ids import node_id_from_public_key
from hydra_node.runtime.artifacts.errors import SignatureInvalid
from hydra_node.runtime.artifacts.manifest import ArtifactFile, Manifest, signer
from hydra_node.runtime.artifacts.peer_wire import held_artifacts_from_extra, model_artifact_name
from hydra_node.runtime.fetch.cache import ModelCache
from hydra_node.runtime.fetch.peer import ModelShare, _ArtifactReply
from hydra_node.runtime.fetch.peer_wire import WireError

KEY = SigningKey(bytes([0x5A]) * 32)
NODE = node_id_from_public_key(bytes(KEY.verify_key))
DATA = b"GGUF" + bytes(range(256)) * 40
DIGEST = hashlib.sha256(DATA).hexdigest()


class Placement:
    def __init__(self) -> None:
        self.asked: list[tuple[str, str]] = []

    def open_artifact(self, kind: str, name: str):
        self.asked.append((kind, name))
        return None


def share_with_model(tmp_path: Path, *, offer: bool = True) -> tuple[ModelShare, Placement]:
    cache = ModelCache(tmp_path / "models")
    cache.partial_dir.mkdir(parents=True)
    cache.partial_path("m").write_bytes(DATA)
    cache.commit("m", "m.gguf", DIGEST, len(DATA), "https://x/m.gguf", "given", 1.0)
    share = ModelShare(cache, None, share=True, stall_timeout_s=5, offer_artifacts=offer)
    placement = Placement()
    share.artifact_share(placement, signer(KEY))
    return share, placement


def test_a_cached_model_is_a_signed_one_file_artifact_named_by_its_digest(tmp_path) -> None:
    share, placement = share_with_model(tmp_path)
    assert share._artifact_share is not None
    store = share._artifact_share.store
    manifest, folder = store.open_artifact("model_weights", model_artifact_name(DIGEST))
    manifest.verify()
    assert (manifest.node_id, manifest.files) == (NODE, (ArtifactFile("m.gguf", len(DATA), DIGEST),))
    assert manifest.location == "posix:/model-cache"  # not our home folder
    assert (folder / "m.gguf").read_bytes() == DATA and placement.asked == []
    assert store.open_artifact("model_weights", model_artifact_name("00" * 32)) is None
    assert store.open_artifact("model_weights", "smollm") is None and placement.asked == [("model_weights", "smollm")]
    held = held_artifacts_from_extra(share.announce_extra())
    assert held == {("model_weights", model_artifact_name(DIGEST)): manifest.manifest_id}
    assert share.announce_extra()["models_held"] == [["m", DIGEST]]
    (folder / "m.gguf").write_bytes(DATA[:-1])  # not the file recorded: not offered
    assert store.open_artifact("model_weights", model_artifact_name(DIGEST)) is None


def test_offer_artifacts_false_offers_over_model_fetch_only(tmp_path) -> None:
    share, _ = share_with_model(tmp_path, offer=False)
    assert share._artifact_share is not None
    assert share._artifact_share.store.open_artifact("model_weights", model_artifact_name(DIGEST)) is None
    assert share.announce_extra() == {"models_held": [["m", DIGEST]]}
    assert share.status().offer_artifacts is False


def reply_to(manifest: Manifest, *, holder: str = NODE, expected: int | None = None) -> _ArtifactReply:
    reply = _ArtifactReply(holder, DIGEST, 0, expected)
    reply.feed({"op": "manifest", "m": manifest.to_cbor()})
    return reply


def test_the_requester_takes_only_the_holders_manifest_of_that_one_file() -> None:
    def made(name: str = model_artifact_name(DIGEST), *files: ArtifactFile, key: SigningKey = KEY) -> Manifest:
        files = files or (ArtifactFile("m.gguf", len(DATA), DIGEST),)
        return Manifest("model_weights", name, files, {}, "posix:/r", 1).sign(key)

    reply = reply_to(made())
    assert reply.size == len(DATA)
    assert reply.feed({"op": "data", "b": DATA[:100]}) == DATA[:100]
    with pytest.raises(SignatureInvalid, match="not trusted"):  # validly signed, by another node
        reply_to(made(key=SigningKey(bytes([0x5B]) * 32)))
    with pytest.raises(WireError, match="sha256 asked for"):
        reply_to(made(model_artifact_name(DIGEST), ArtifactFile("m.gguf", len(DATA), "ee" * 32)))
    with pytest.raises(WireError, match="sha256 asked for"):
        reply_to(made(model_artifact_name(DIGEST), ArtifactFile("a", 1, DIGEST), ArtifactFile("b", 1, DIGEST)))
    with pytest.raises(WireError, match="were expected"):
        reply_to(made(), expected=len(DATA) + 1)
