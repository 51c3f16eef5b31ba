"""``model_fetch`` streams over a real encrypted link in this process: a holder that lies about its
bytes is caught by the sha256, files it does not hold are refused, one transfer per peer, and a
malformed header is refused; over ``artifact_fetch``, a transfer cut mid-way resumes at its durable
length. (Two live nodes: test_models_peer.py.)"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field

import pytest
import trio
from nacl.signing import SigningKey

from hydra_node.codec.framing import MessageDecoder
from hydra_node.mesh.link.endpoints import LinkListener, open_link
from hydra_node.mesh.link.peer_link import LinkSettings
from hydra_node.mesh.wire.errors import StreamReset
from hydra_node.mesh.wire.ids import MeshSecret
from hydra_node.runtime.artifacts.manifest import signer
from hydra_node.runtime.artifacts.peer_wire import ARTIFACT_FETCH_KIND
from hydra_node.runtime.fetch import ModelCache, ModelShare, RemoteModel
from hydra_node.runtime.fetch.errors import PeerFetchError
from hydra_node.runtime.fetch.peer_wire import MAX_FETCH_FRAME_BYTES, FetchRequest

SIZE = 3 * 1024 * 1024  # three disk chunks: the window fills before the holder is done


@dataclass
class Announcement:
    extra: dict = field(default_factory=dict)


class OneHolder:
    """The runtime's view of the mesh (``runtime/peers.PeerView``) with one alive member: the holder."""

    listen_host = "127.0.0.1"

    def __init__(self, link, held: dict[str, str]) -> None:
        self._link, self.peer_id = link, link.peer_id
        self.held = held

    def members(self):
        return {self.peer_id: Announcement({"models_held": [[m, d] for m, d in self.held.items()]})}

    def member_states(self, now):
        return {self.peer_id: "alive"}

    def link(self, peer_id):
        return self._link

    async def link_to(self, peer_id):
        return self._link


def cached(cache: ModelCache, model_id: str, data: bytes) -> str:
    cache.partial_dir.mkdir(parents=True, exist_ok=True)
    cache.partial_path(model_id).write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    cache.commit(model_id, f"{model_id}.gguf", digest, len(data), "test", "pinned", 1.0)
    return digest


@pytest.fixture
async def holder_and_requester(tmp_path, nursery):
    """(holder ModelShare, requester ModelShare, the requester's link) over a real listener and link."""
    mesh = MeshSecret(bytes([0x42]) * 32)
    holder = ModelShare(ModelCache(tmp_path / "a"), None, share=True, stall_timeout_s=10)
    listener = LinkListener(LinkSettings(identity=SigningKey.generate(), mesh=mesh, on_stream=holder.serve), None)
    port = await nursery.start(listener.serve, "127.0.0.1", 0)
    async with open_link(f"ws://127.0.0.1:{port}", LinkSettings(identity=SigningKey.generate(), mesh=mesh)) as link:
        requester = ModelShare(ModelCache(tmp_path / "b"), OneHolder(link, {}), share=True, stall_timeout_s=10)
        yield holder, requester, link


async def test_a_holder_whose_bytes_changed_is_caught_by_the_sha256(holder_and_requester):
    holder, requester, _ = holder_and_requester
    data = b"GGUF" + os.urandom(SIZE - 4)
    digest = cached(holder.cache, "m", data)
    requester.mesh.held = {"m": digest}
    rec = holder.cache.lookup("m")
    tampered = bytearray(data)
    tampered[SIZE // 2] ^= 1
    rec.path(holder.cache.root).write_bytes(bytes(tampered))  # same size, another byte: the index still says `digest`
    with trio.fail_after(20):
        with pytest.raises(PeerFetchError, match="does not match"):
            await requester.fetch(RemoteModel("m", ("https://unused/m.gguf",), "m.gguf"))
    assert requester.cache.lookup("m") is None and requester.cache.partial_bytes("m") == 0
    rec.path(holder.cache.root).write_bytes(data)
    with trio.fail_after(20):
        got = await requester.fetch(RemoteModel("m", ("https://unused/m.gguf",), "m.gguf"))
    assert got.sha256 == digest and got.path(requester.cache.root).read_bytes() == data


async def test_a_peer_transfer_makes_room_under_the_one_capacity(holder_and_requester):
    """A model from a peer is held to the one cache's capacity like a download: a placement-free
    cache of one file's room evicts the least recently used model first, and refuses a file that
    cannot fit before a byte of it is written."""
    holder, requester, _ = holder_and_requester
    requester.cache = ModelCache(requester.cache.root, capacity_bytes=SIZE + SIZE // 2)
    old = cached(requester.cache, "old", b"GGUF" + os.urandom(SIZE - 4))
    data = b"GGUF" + os.urandom(SIZE - 4)
    requester.mesh.held = {"m": cached(holder.cache, "m", data)}
    with trio.fail_after(20):
        got = await requester.fetch(RemoteModel("m", ("https://unused/m.gguf",), "m.gguf"))
    assert got.path(requester.cache.root).read_bytes() == data and requester.cache.by_sha256(old) is None
    requester.cache.set_keep("m", True)
    requester.mesh.held = {"big": cached(holder.cache, "big", b"GGUF" + os.urandom(SIZE - 4))}
    with trio.fail_after(20):
        with pytest.raises(PeerFetchError, match="cache_capacity_gb"):
            await requester.fetch(RemoteModel("big", ("https://unused/big.gguf",), "big.gguf"))
    assert requester.cache.partial_bytes("big") == 0 and requester.cache.lookup("m") is not None


async def reply_to(link, header: dict) -> tuple[dict, object]:
    """The first message the holder answers a raw ``header`` with (and the open stream)."""
    cm = link.open_stream(header)
    stream = await cm.__aenter__()
    decoder = MessageDecoder(MAX_FETCH_FRAME_BYTES)
    while (msg := decoder.next_message()) is None:
        decoder.receive_data(await stream.receive())
    return msg, cm


async def test_refusals_not_held_busy_and_bad_headers(holder_and_requester):
    holder, _, link = holder_and_requester
    digest = cached(holder.cache, "big", b"GGUF" + os.urandom(SIZE - 4))
    with trio.fail_after(20):
        msg, _ = await reply_to(link, FetchRequest("cd" * 32, 0).header())
        assert msg["op"] == "error" and msg["code"] == "not_held"
        msg, _ = await reply_to(link, {"kind": "model_fetch", "sha256": digest, "offset": -5})
        assert msg["op"] == "error" and msg["code"] == "bad_request"
        first, held_open = await reply_to(link, FetchRequest(digest, 0).header())  # read no further: it stays busy
        assert first == {"op": "file", "size": SIZE}
        msg, _ = await reply_to(link, FetchRequest(digest, 0).header())
        assert msg["op"] == "error" and msg["code"] == "busy"
        await held_open.__aexit__(None, None, None)
    assert holder.status().refused == 3


class NoPlacement:
    def open_artifact(self, kind, name):
        return None


class Announcing(OneHolder):
    """The holder as the requester sees it, announcing exactly ``extra`` (its own announce_extra())."""

    def __init__(self, link, extra: dict) -> None:
        super().__init__(link, {})
        self.extra = extra

    def members(self):
        return {self.peer_id: Announcement(self.extra)}


class CutStream:
    """The holder's stream, reset after ``frames`` frames: the link broke mid-transfer."""

    def __init__(self, stream, frames: int) -> None:
        self._stream, self.left = stream, frames

    async def send(self, data: bytes) -> None:
        if self.left == 0:
            await self._stream.reset("cancel", "test: cut mid-transfer")
            raise StreamReset("cut mid-transfer")
        self.left -= 1
        await self._stream.send(data)

    def __getattr__(self, name):
        return getattr(self._stream, name)


async def test_a_transfer_cut_mid_way_resumes_over_artifact_fetch_at_its_durable_length(tmp_path, nursery):
    """The one stream for model files: the holder offers its cache through ``artifact_fetch``; a
    transfer reset after ~2.5 MiB leaves the requester's partial file with a recorded durable length,
    and the next attempt asks from that ``offset``: the holder sends only the rest."""
    key, mesh = SigningKey.generate(), MeshSecret(bytes([0x42]) * 32)
    holder = ModelShare(ModelCache(tmp_path / "a"), None, share=True, stall_timeout_s=10)
    offered = holder.artifact_share(NoPlacement(), signer(key))
    cut = {"frames": 40}  # the manifest and 39 data frames of 64 KiB

    async def on_stream(link, header, stream):
        if header.get("kind") == ARTIFACT_FETCH_KIND:
            frames, cut["frames"] = cut["frames"], None
            await offered.serve(link, header, CutStream(stream, frames) if frames else stream)
        else:
            await holder.serve(link, header, stream)

    listener = LinkListener(LinkSettings(identity=key, mesh=mesh, on_stream=on_stream), None)
    port = await nursery.start(listener.serve, "127.0.0.1", 0)
    data = b"GGUF" + os.urandom(SIZE - 4)
    digest = cached(holder.cache, "m", data)
    async with open_link(f"ws://127.0.0.1:{port}", LinkSettings(identity=SigningKey.generate(), mesh=mesh)) as link:
        requester = ModelShare(
            ModelCache(tmp_path / "b"), Announcing(link, holder.announce_extra()), share=True, stall_timeout_s=10
        )
        remote = RemoteModel("m", ("https://unused/m.gguf",), "m.gguf")
        with trio.fail_after(20), pytest.raises(PeerFetchError, match="transfer broke"):
            await requester.fetch(remote)
        meta = requester.cache.partial_meta("m")
        assert meta is not None and meta.url == f"peer-sha256:{digest}" and meta.total == SIZE
        assert 0 < meta.durable < SIZE and requester.cache.partial_bytes("m") >= meta.durable
        assert requester.cache.partial_path("m").read_bytes()[: meta.durable] == data[: meta.durable]
        sent_before = offered.statistics().sent_bytes
        with trio.fail_after(20):
            got = await requester.fetch(remote)
    assert got.sha256 == digest and got.path(requester.cache.root).read_bytes() == data
    stats = offered.statistics()
    assert stats.resumed == 1 and stats.sent_bytes - sent_before == SIZE - meta.durable  # not one byte again
    assert holder.status().sent_files == 0 and requester.status().fetched_over_artifact_fetch == 1
