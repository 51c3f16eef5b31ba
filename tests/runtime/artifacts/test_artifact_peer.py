"""``artifact_fetch`` streams over a real encrypted link in this process: a holder's PosixStore
artifact arrives whole and verified; a holder whose bytes or manifest lie is caught, an untrusted
signer is refused before any file byte, and nothing is left at the destination; refusals are typed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio
from nacl.signing import SigningKey

from hydra_node.codec.framing import MessageDecoder
from hydra_node.mesh.link.endpoints import LinkListener, open_link
from hydra_node.mesh.link.peer_link import LinkSettings
from hydra_node.mesh.wire.ids import MeshSecret
from hydra_node.runtime.artifacts.errors import (
    ArtifactNotFound,
    ChecksumMismatch,
    ManifestInvalid,
    SignatureInvalid,
    StoreUnavailable,
)
from hydra_node.runtime.artifacts.manifest import Manifest, signer
from hydra_node.runtime.artifacts.peer import ArtifactShare, fetch_from_peer
from hydra_node.runtime.artifacts.peer_wire import (
    MAX_ARTIFACT_FRAME_BYTES,
    ArtifactRequest,
)
from hydra_node.runtime.artifacts.posix import PosixStore

KEY = SigningKey(bytes([0xA1]) * 32)
BIG = 3 * 1024 * 1024 + 5  # more than one disk chunk: the window fills before the holder is done


class OneLink:
    """The runtime's view of the mesh (``runtime/peers.PeerView``) reduced to the one link we hold."""

    def __init__(self, link) -> None:
        self._link = link

    async def link_to(self, peer_id):
        assert peer_id == self._link.peer_id
        return self._link


class LyingStore:
    """A holder whose store hands out a manifest it did not verify (what a malicious peer sends)."""

    def __init__(self, manifest: Manifest, folder: Path) -> None:
        self.found = (manifest, folder)

    def open_artifact(self, kind, name):
        return self.found


@pytest.fixture
async def holder(tmp_path, nursery):
    """(holder's PosixStore, its share, the requester's mesh view, the holder's peer id, a publish helper)."""
    (tmp_path / "holder").mkdir()
    store = PosixStore(tmp_path / "holder")
    shares = {"share": ArtifactShare(store)}

    async def serve(link, header, stream):
        await shares["share"].serve(link, header, stream)

    mesh = MeshSecret(bytes([0x42]) * 32)
    listener = LinkListener(LinkSettings(identity=SigningKey.generate(), mesh=mesh, on_stream=serve), None)
    port = await nursery.start(listener.serve, "127.0.0.1", 0)
    async with open_link(f"ws://127.0.0.1:{port}", LinkSettings(identity=SigningKey.generate(), mesh=mesh)) as link:
        yield store, shares, OneLink(link), link.peer_id


def publish(store: PosixStore, tmp_path: Path, **files: bytes) -> Manifest:
    src = {}
    for name, data in files.items():
        p = tmp_path / "src" / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        src[name.replace("__", "/")] = p
    return store.publish("layer_package", "stage-0", src, identity={"layers": [0, 3]}, sign=signer(KEY))


def nothing_at(dest: Path) -> bool:
    return not dest.exists() and not [e for e in os.listdir(dest.parent) if e.startswith(f".{dest.name}")]


async def test_an_artifact_arrives_whole_and_verified(holder, tmp_path) -> None:
    store, shares, view, peer = holder
    files = {"w__big.bin": os.urandom(BIG), "empty": b"", "tok.json": b'{"a": 1}'}
    m = publish(store, tmp_path, **files)
    dest = tmp_path / "cache" / "stage-0"
    seen = []
    with trio.fail_after(30):
        got = await fetch_from_peer(
            view, peer, "layer_package", "stage-0", dest, trust=lambda n: n == m.node_id, progress=seen.append
        )
    assert got == m
    assert {str(p.relative_to(dest)): p.read_bytes() for p in dest.rglob("*") if p.is_file()} == {
        k.replace("__", "/"): v for k, v in files.items()
    }
    assert seen[-1] == m.size and seen == sorted(seen)
    stats = shares["share"].statistics()
    assert (stats.sent_artifacts, stats.sent_bytes, stats.refused, stats.uploading) == (1, m.size, 0, 0)


async def test_a_holder_whose_bytes_changed_is_caught_and_nothing_is_left(holder, tmp_path) -> None:
    store, _, view, peer = holder
    m = publish(store, tmp_path, a=b"A" * 100_000, b=b"B" * 10)
    stored = store.root / "layer_package" / "stage-0" / "current" / "files" / "a"
    data = bytearray(stored.read_bytes())
    data[50_000] ^= 1
    stored.write_bytes(bytes(data))  # same size, one bit flipped: the manifest still says the old sha256
    dest = tmp_path / "dest"
    with trio.fail_after(30), pytest.raises(ChecksumMismatch, match="sha256"):
        await fetch_from_peer(view, peer, "layer_package", "stage-0", dest, trust=None)
    assert nothing_at(dest)
    stored.write_bytes(b"A" * 99_999)  # shorter: the holder itself reports that it changed
    with trio.fail_after(30), pytest.raises(StoreUnavailable, match="read_failed"):
        await fetch_from_peer(view, peer, "layer_package", "stage-0", dest, trust=None)
    assert nothing_at(dest) and m.size == 100_010


async def test_a_forged_manifest_or_an_untrusted_signer_is_refused_before_any_file(holder, tmp_path) -> None:
    store, shares, view, peer = holder
    m = publish(store, tmp_path, a=b"weights")
    dest = tmp_path / "dest"
    with trio.fail_after(30), pytest.raises(SignatureInvalid, match="not trusted"):
        await fetch_from_peer(view, peer, "layer_package", "stage-0", dest, trust=lambda n: False)
    assert nothing_at(dest)
    folder = store.root / "layer_package" / "stage-0" / "current" / "files"
    forged = Manifest(m.kind, m.name, m.files, {"layers": [0, 30]}, m.location, m.created_at, m.node_id, m.signature)
    shares["share"] = ArtifactShare(LyingStore(forged, folder))
    with trio.fail_after(30), pytest.raises(SignatureInvalid):
        await fetch_from_peer(view, peer, "layer_package", "stage-0", dest, trust=None)
    assert nothing_at(dest)
    other = Manifest(m.kind, "stage-1", m.files, m.identity, m.location, m.created_at).sign(KEY)
    shares["share"] = ArtifactShare(LyingStore(other, folder))  # validly signed, but another artifact
    with trio.fail_after(30), pytest.raises(ManifestInvalid, match="describes"):
        await fetch_from_peer(view, peer, "layer_package", "stage-0", dest, trust=None)
    assert nothing_at(dest)


async def reply_to(link, header: dict):
    cm = link.open_stream(header)
    stream = await cm.__aenter__()
    decoder = MessageDecoder(MAX_ARTIFACT_FRAME_BYTES)
    while (msg := decoder.next_message()) is None:
        decoder.receive_data(await stream.receive())
    return msg, cm


async def test_refusals_not_held_busy_and_bad_headers(holder, tmp_path) -> None:
    store, shares, view, peer = holder
    with trio.fail_after(30):
        with pytest.raises(ArtifactNotFound, match="not_held"):
            await fetch_from_peer(view, peer, "kv_state", "absent", tmp_path / "d", trust=None)
        link = await view.link_to(peer)
        msg, _ = await reply_to(link, {"kind": "artifact_fetch", "artifact": "kv_state", "name": "/etc/passwd"})
        assert msg["op"] == "error" and msg["code"] == "bad_request"
        publish(store, tmp_path, big=os.urandom(BIG))
        first, held_open = await reply_to(link, ArtifactRequest("layer_package", "stage-0").header())
        assert first["op"] == "manifest"  # read no further: this peer's one transfer stays open
        with pytest.raises(StoreUnavailable, match="busy"):
            await fetch_from_peer(view, peer, "layer_package", "stage-0", tmp_path / "d", trust=None)
        await held_open.__aexit__(None, None, None)
    assert shares["share"].statistics().refused == 3
    assert nothing_at(tmp_path / "d")


async def read_reply(link, header: dict) -> list[dict]:
    """Every frame of the holder's answer to ``header``, to its end."""
    async with link.open_stream(header) as stream:
        await stream.send_eof()
        decoder, msgs = MessageDecoder(MAX_ARTIFACT_FRAME_BYTES), []
        while data := await stream.receive():
            decoder.receive_data(data)
            while (msg := decoder.next_message()) is not None:
                msgs.append(msg)
    return msgs


async def test_a_single_file_resumes_at_an_offset_and_bad_offsets_are_refused(holder, tmp_path) -> None:
    store, shares, view, peer = holder
    data = os.urandom(BIG)
    m = publish(store, tmp_path, w=data)
    link = await view.link_to(peer)
    with trio.fail_after(30):
        msgs = await read_reply(link, ArtifactRequest("layer_package", "stage-0", 1_000_000).header())
        assert msgs[0] == {"op": "manifest", "m": m.to_cbor()} and msgs[-1] == {"op": "end"}
        assert b"".join(x["b"] for x in msgs[1:-1]) == data[1_000_000:]
        stats = shares["share"].statistics()
        assert (stats.sent_bytes, stats.resumed, stats.refused) == (BIG - 1_000_000, 1, 0)  # the first MB not sent
        refusals = [
            {**ArtifactRequest("layer_package", "stage-0").header(), "offset": -1},
            ArtifactRequest("layer_package", "stage-0", BIG + 1).header(),  # past the end
        ]
        for header in refusals:
            (msg,) = await read_reply(link, header)
            assert (msg["op"], msg["code"]) == ("error", "bad_request") and "offset" in msg["message"]
        publish(store, tmp_path, a=b"A" * 10, b=b"B")
        (msg,) = await read_reply(link, ArtifactRequest("layer_package", "stage-0", 1).header())
        assert msg["code"] == "bad_request" and "2 files" in msg["message"]
    stats = shares["share"].statistics()
    assert (stats.refused, stats.refused_offset, stats.sent_bytes) == (3, 3, BIG - 1_000_000)
