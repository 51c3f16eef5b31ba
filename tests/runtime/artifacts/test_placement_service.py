"""PlacementService over real POSIX roots in tmp folders, a real HTTP receiver for the VAST trigger."""

from __future__ import annotations

import functools
import json
import shutil
import threading
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import nacl.signing
import pytest
import trio

from hydra_node.config import PlacementSection
from hydra_node.mesh.link.endpoints import LinkListener, open_link
from hydra_node.mesh.link.peer_link import LinkSettings
from hydra_node.mesh.wire.ids import MeshSecret, node_id_from_public_key
from hydra_node.models import ModelNotFound
from hydra_node.runtime.artifacts.errors import ArtifactNotFound, ChecksumMismatch, InvalidRequest
from hydra_node.runtime.artifacts.local_cache import ArtifactHeld, CacheFull, LocalCache
from hydra_node.runtime.artifacts.manifest import ArtifactFile, Manifest, signer
from hydra_node.runtime.artifacts.operations import Operation, OpStore
from hydra_node.runtime.artifacts.peer import ArtifactShare, fetch_from_peer
from hydra_node.runtime.artifacts.placed_model import placed_model, placed_name
from hydra_node.runtime.artifacts.service import PlacementService
from hydra_node.runtime.artifacts.settings import Namespace

KEY = nacl.signing.SigningKey(bytes(range(32)))


def service(home: Path, clock: list[float] | None = None, **settings) -> PlacementService:
    seen = []
    svc = PlacementService(
        PlacementSection(**settings),
        home=home,
        node_id="00" * 32,
        sign=signer(KEY),
        on_materialised=lambda *a: seen.append(a),
        **({"wall": lambda: clock[0]} if clock else {}),
    )
    svc.seen = seen
    return svc


def source(tmp_path: Path, name: str, files: dict[str, bytes]) -> Path:
    folder = tmp_path / "src" / name
    for rel, data in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    return folder


async def publish(svc: PlacementService, kind: str, name: str, src: Path, **kw) -> Operation:
    op = await svc.submit_publish(kind, name, str(src), **kw)
    assert op.state == "queued"
    return await svc.wait(op.id)


async def test_published_on_one_home_materialised_and_cached_on_another(tmp_path, nursery):
    root = tmp_path / "ns"
    root.mkdir()
    a, b = service(tmp_path / "a", posix_root=str(root)), service(tmp_path / "b", posix_root=str(root))
    await nursery.start(a.run)
    await nursery.start(b.run)
    src = source(tmp_path, "stage-0", {"weights.bin": b"w" * 5000, "sub/meta.json": b"{}"})
    done = await publish(a, "layer_package", "stage-0", src, identity={"model": "qwen3"})
    assert done.state == "committed" and done.terminal and done.manifest["size"] == 5002
    assert json.loads((tmp_path / "a/placement/ops" / f"{done.id}.json").read_text())["state"] == "committed"
    manifest, folder = await b.materialise("layer_package", "stage-0")
    assert manifest.manifest_id == done.manifest["manifest_id"] and manifest.identity == {"model": "qwen3"}
    assert (folder / "weights.bin").read_bytes() == b"w" * 5000 and (folder / "sub/meta.json").read_bytes() == b"{}"
    assert [(s, n) for _, _, s, n, _ in b.seen] == [(f"posix:{root}", 5002)]
    await b.materialise("layer_package", "stage-0")  # the second time from the cache: no transfer
    assert len(b.seen) == 1 and b.counters["cache_hits"] == 1
    listing = b.cache_listing()
    assert [x["name"] for x in listing["artifacts"]] == ["stage-0"] and listing["used_bytes"] == 5002
    with pytest.raises(ArtifactNotFound, match="absent"):
        await b.materialise("layer_package", "missing")


async def test_a_tampered_artifact_is_refused_and_never_cached(tmp_path, nursery):
    root = tmp_path / "ns"
    root.mkdir()
    a, b = service(tmp_path / "a", posix_root=str(root)), service(tmp_path / "b", posix_root=str(root))
    await nursery.start(a.run)
    await nursery.start(b.run)
    await publish(a, "model_weights", "m", source(tmp_path, "m", {"m.gguf": b"GGUF" + b"x" * 100}))
    stored = next(root.glob("model_weights/m/v*/files/m.gguf"))
    stored.write_bytes(b"GGUF" + b"y" * 100)  # same size, other bytes
    with pytest.raises(ChecksumMismatch):
        await b.materialise("model_weights", "m")
    assert b.cache_listing()["artifacts"] == [] and not (tmp_path / "b/placement/cache/model_weights/m").exists()
    op = await b.wait((await b.submit_fetch("model_weights", "m")).id)
    assert op.state == "failed" and op.error["code"] == "checksum_mismatch" and "retry" in op.retry_hint


async def test_capacity_evicts_the_least_recently_used_but_never_a_pinned_or_leased_one(tmp_path, nursery):
    root = tmp_path / "ns"
    root.mkdir()
    clock = [1000.0]
    pub = service(tmp_path / "pub", posix_root=str(root))
    cache = service(tmp_path / "c", clock, posix_root=str(root), cache_capacity_gb=2.5e-6)  # 2500 bytes
    await nursery.start(pub.run)
    await nursery.start(cache.run)
    for name in ("one", "two", "three"):
        await publish(pub, "layer_package", name, source(tmp_path, name, {"state.bin": b"k" * 1000}))
    await cache.materialise("layer_package", "one")
    clock[0] += 1
    await cache.materialise("layer_package", "two")
    clock[0] += 1
    await cache.materialise("layer_package", "three")  # 3000 > 2500: "one" goes
    assert sorted(a["name"] for a in cache.cache_listing()["artifacts"]) == ["three", "two"]
    await cache.pin("two", None)
    clock[0] += 1
    async with cache.using("layer_package", "three"):
        with pytest.raises(CacheFull):  # "two" pinned, "three" in use: no room for "one"
            await cache.materialise("layer_package", "one")
        with pytest.raises(ArtifactHeld, match="in use"):
            await cache.evict("three", "layer_package")
    with pytest.raises(ArtifactHeld, match="pinned"):
        await cache.evict("two", None)
    await cache.pin("two", None, on=False)
    gone = await cache.evict("two", "layer_package", Namespace("posix", root=str(root)))
    assert gone["evicted"] == [{"kind": "layer_package", "name": "two"}] and gone["removed_from_namespace"] is True
    assert not (root / "layer_package" / "two").exists()


async def test_the_ttl_expires_unused_artifacts(tmp_path, nursery, autojump_clock):
    root = tmp_path / "ns"
    root.mkdir()
    clock = [1000.0]
    pub = service(tmp_path / "pub", posix_root=str(root))
    cache = service(tmp_path / "c", clock, posix_root=str(root), cache_ttl_secs=100)
    await nursery.start(pub.run)
    await nursery.start(cache.run)
    await publish(pub, "activation_frames", "f", source(tmp_path, "f", {"f.bin": b"a"}))
    await cache.materialise("activation_frames", "f")
    clock[0] += 101
    await trio.sleep(30)  # the sweeper runs every quarter TTL (virtual time)
    assert cache.cache_listing()["artifacts"] == []


class Receiver:
    """A real HTTP receiver on loopback: answers every POST with ``self.status``, records bodies."""

    def __init__(self) -> None:
        self.status, self.bodies = 503, []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                outer.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(outer.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/ship"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()


async def test_a_failed_trigger_leaves_the_manifest_and_a_retry_delivers_it_idempotently(
    tmp_path, nursery, autojump_clock
):
    root = tmp_path / "ns"
    root.mkdir()
    rx = Receiver()
    try:
        svc = service(
            tmp_path / "a",
            posix_root=str(root),
            vast_trigger_endpoint=rx.url,
            vast_tenant="acme",
            vast_target_site="site-b",
        )
        await nursery.start(svc.run)
        op = await publish(svc, "layer_package", "s0", source(tmp_path, "s0", {"x": b"1"}))
        assert op.state == "failed" and op.error["code"] == "trigger_failed" and op.manifest is not None
        assert op.trigger["attempts"] == len(rx.bodies) > 1 and "retry" in op.retry_hint
        rx.status = 202
        again = await svc.wait((await svc.retry(op.id)).id)
        assert again.state == "triggered" and again.trigger["delivered"] and again.error is None
        keys = {b["idempotency_key"] for b in rx.bodies}
        assert len(keys) == 1 and rx.bodies[-1]["target"]["tenant"] == "acme"
        assert rx.bodies[-1]["checksum"]["manifest_id"] == op.manifest["manifest_id"]
    finally:
        rx.server.shutdown()


async def test_an_operation_interrupted_by_a_stop_is_failed_at_the_next_start(tmp_path, nursery):
    home = tmp_path / "a"
    stuck = Operation(
        id="op-0000000001-00000001",
        action="publish",
        kind="model_weights",
        name="m",
        state="staging",
        created_at=1.0,
        updated_at=1.0,
        source="/x",
        namespace=Namespace("posix", root="/ns").to_json(),
    )
    OpStore(home / "placement" / "ops").save(stuck)
    svc = service(home)
    await nursery.start(svc.run)
    got = svc.get(stuck.id)
    assert got.state == "failed" and got.error["code"] == "interrupted" and "retry" in got.retry_hint
    assert svc.status().operations[0]["state"] == "failed"


async def test_bad_publish_requests_are_refused_before_queueing(tmp_path, nursery):
    svc = service(tmp_path / "a")
    await nursery.start(svc.run)
    with pytest.raises(Exception, match="no namespace"):
        await svc.submit_publish("model_weights", "m", "/x")
    with pytest.raises(Exception, match="absolute"):
        await svc.submit_publish("model_weights", "m", "rel/path", namespace=Namespace("posix", root="/r"))
    with pytest.raises(InvalidRequest, match="content-addressed"):  # the model cache's names (docs/models.md)
        await svc.submit_publish("model_weights", "sha256:" + "ab" * 32, "/x", namespace=Namespace("posix", root="/r"))
    op = await publish(
        svc, "model_weights", "m", tmp_path / "nothing", namespace=Namespace("posix", root=str(tmp_path))
    )
    assert op.state == "failed" and op.error["code"] == "source_invalid"


class OnePeer:
    """The mesh as the requester sees it (``runtime/peers.PeerView``): one alive member, reached
    over the one real encrypted link we hold, announcing ``extra``."""

    def __init__(self, link, extra: dict) -> None:
        self._link, self.extra = link, extra

    def members(self):
        return {self._link.peer_id: types.SimpleNamespace(extra=self.extra)}

    def member_states(self, now):
        return {self._link.peer_id: "alive"}

    def link(self, peer_id):
        return self._link

    async def link_to(self, peer_id):
        return self._link


async def test_an_artifact_a_peer_announces_is_fetched_over_the_link_and_an_untrusted_one_refused(tmp_path, nursery):
    holder_key, stranger = nacl.signing.SigningKey.generate(), nacl.signing.SigningKey(bytes([7]) * 32)
    holder_id = node_id_from_public_key(bytes(holder_key.verify_key))
    root = tmp_path / "ns"
    root.mkdir()
    a = PlacementService(
        PlacementSection(posix_root=str(root)),
        home=tmp_path / "a",
        node_id=holder_id,
        sign=signer(holder_key),
        peer_fetch=fetch_from_peer,
    )  # (a's own mesh is not used here)
    await nursery.start(a.run)
    await publish(a, "layer_package", "prefix", source(tmp_path, "p", {"state.bin": b"s" * 70_000}))
    await a.materialise("layer_package", "prefix")  # now in a's local cache, which a shares
    foreign = PlacementService(
        PlacementSection(posix_root=str(root)), home=tmp_path / "f", node_id="11" * 32, sign=signer(stranger)
    )
    await nursery.start(foreign.run)
    await publish(foreign, "layer_package", "forged", source(tmp_path, "f", {"state.bin": b"f"}))
    await a.materialise("layer_package", "forged")
    assert {tuple(x[:2]) for x in a.announce_extra()["artifacts_held"]} == {
        ("layer_package", "prefix"),
        ("layer_package", "forged"),
    }

    secret = MeshSecret(bytes([0x42]) * 32)
    listener = LinkListener(
        LinkSettings(identity=holder_key, mesh=secret, on_stream=ArtifactShare(a.cache).serve), None
    )
    port = await nursery.start(listener.serve, "127.0.0.1", 0)
    async with open_link(
        f"ws://127.0.0.1:{port}", LinkSettings(identity=nacl.signing.SigningKey.generate(), mesh=secret)
    ) as link:
        view = OnePeer(link, a.announce_extra())
        seen = []
        b = PlacementService(
            PlacementSection(),
            home=tmp_path / "b",
            node_id="22" * 32,
            sign=signer(stranger),
            mesh=view,
            peer_fetch=functools.partial(fetch_from_peer, view),
            on_materialised=lambda *x: seen.append(x),
        )
        await nursery.start(b.run)
        manifest, folder = await b.materialise("layer_package", "prefix")
        assert manifest.node_id == holder_id and (folder / "state.bin").read_bytes() == b"s" * 70_000
        assert [(s, n) for _, _, s, n, _ in seen] == [(f"peer:{holder_id}", 70_000)]
        with pytest.raises(ArtifactNotFound, match="signature_invalid"):  # signed by a node not in the mesh
            await b.materialise("layer_package", "forged")
        assert b.counters["refused_corrupt"] == 1 and not (tmp_path / "b/placement/cache/layer_package/forged").exists()


class AlsoClaims:
    """A holder sharing its cache and one more validly signed manifest, over another artifact's folder."""

    def __init__(self, cache: LocalCache, claim: Manifest, folder: Path) -> None:
        self.cache, self.claim, self.folder = cache, claim, folder

    def open_artifact(self, kind, name):
        if (kind, name) == (self.claim.kind, self.claim.name):
            return self.claim, self.folder
        return self.cache.open_artifact(kind, name)


def untouched(home: Path) -> bool:
    """No artifact folder nor staging folder in ``home``'s cache."""
    kv = home / "placement/cache/layer_package"
    return not kv.exists() or list(kv.iterdir()) == []


BIG = 12_000_000  # three times the stream window: the holder cannot finish unless the bytes are taken


async def test_a_peer_artifact_over_the_cache_or_the_disk_is_refused_at_its_manifest(tmp_path, nursery):
    """Issue 25 item 7: a peer's artifact is admitted when its manifest arrives; one larger than
    the requester's cache capacity, or declaring more than its disk holds (1 TiB), is refused
    (typed, naming it, its size, the limit) before any byte is written, over a real link."""
    holder_key = nacl.signing.SigningKey.generate()
    holder_id = node_id_from_public_key(bytes(holder_key.verify_key))
    root = tmp_path / "ns"
    root.mkdir()
    a = PlacementService(
        PlacementSection(posix_root=str(root)),
        home=tmp_path / "a",
        node_id=holder_id,
        sign=signer(holder_key),
        peer_fetch=fetch_from_peer,
    )
    await nursery.start(a.run)
    await publish(
        a, "layer_package", "big", source(tmp_path, "big", {"state.bin": b"s" * BIG}), identity={"model": "m"}
    )
    m, folder = await a.materialise("layer_package", "big")
    tib = Manifest("layer_package", "tib", (ArtifactFile("state.bin", 2**40, "0" * 64),), m.identity, m.location, 0)
    tib = tib.sign(holder_key)  # validly signed by a member: only its size is a lie
    share = ArtifactShare(AlsoClaims(a.cache, tib, folder))
    extra = {"artifacts_held": [*a.announce_extra()["artifacts_held"], ["layer_package", "tib", tib.manifest_id]]}

    secret = MeshSecret(bytes([0x42]) * 32)
    listener = LinkListener(LinkSettings(identity=holder_key, mesh=secret, on_stream=share.serve), None)
    port = await nursery.start(listener.serve, "127.0.0.1", 0)
    async with open_link(
        f"ws://127.0.0.1:{port}", LinkSettings(identity=nacl.signing.SigningKey.generate(), mesh=secret)
    ) as link:
        view = OnePeer(link, extra)
        homes = {}
        for name, gb in (("small", 0.001), ("unbounded", 0.0)):  # 1 MB cap; no cap (the disk is the limit)
            homes[name] = PlacementService(
                PlacementSection(cache_capacity_gb=gb),
                home=tmp_path / name,
                node_id="22" * 32,
                sign=signer(nacl.signing.SigningKey.generate()),
                mesh=view,
                peer_fetch=functools.partial(fetch_from_peer, view),
            )
            await nursery.start(homes[name].run)
        written: list[int] = []
        big = (
            r"cache_full: layer_package/big \(12000000 bytes\).*\(1000000 bytes.*raise \[placement\] cache_capacity_gb"
        )
        with pytest.raises(ArtifactNotFound, match=big):
            await homes["small"].materialiser.get("layer_package", "big", progress=written.append)
        assert written == [] and untouched(tmp_path / "small")  # not one byte taken, no staging folder
        with pytest.raises(ArtifactNotFound, match=rf"disk_full: layer_package/tib \({2**40} bytes\).*bytes free"):
            await homes["unbounded"].materialiser.get("layer_package", "tib", progress=written.append)
        assert written == [] and untouched(tmp_path / "unbounded")
    assert share.statistics().sent_artifacts == 0  # the holder never got to send either whole


async def test_a_placed_model_needs_one_gguf_and_is_leased_while_served(tmp_path, nursery):
    root = tmp_path / "ns"
    root.mkdir()
    svc = service(tmp_path / "a", posix_root=str(root))
    await nursery.start(svc.run)
    with pytest.raises(ModelNotFound, match="placement:absent: .*absent"):
        await placed_model(svc, "absent")
    await publish(svc, "model_weights", "two", source(tmp_path, "two", {"a.gguf": b"GGUF", "b.gguf": b"GGUF"}))
    with pytest.raises(ModelNotFound, match="2 .gguf files"):
        await placed_model(svc, "two")
    await publish(svc, "model_weights", "one", source(tmp_path, "one", {"m.gguf": b"GGUF1", "README": b"r"}))
    ref = await placed_model(svc, "one")
    assert ref.id == "one" and ref.path.read_bytes() == b"GGUF1"
    assert placed_name("placement:one") == "one" and placed_name("one.gguf") is None and placed_name(None) is None
    with pytest.raises(ArtifactHeld, match="in use"):
        await svc.evict("one", "model_weights")


async def test_the_cache_index_is_reconciled_with_its_folders_at_start(tmp_path, nursery):
    root = tmp_path / "ns"
    root.mkdir()
    svc = service(tmp_path / "a", posix_root=str(root))
    await nursery.start(svc.run)
    for name in ("kept", "lost"):
        await publish(svc, "layer_package", name, source(tmp_path, name, {"f": name.encode()}))
        await svc.materialise("layer_package", name)
    await svc.pin("later", "kv_state")
    cache_root = tmp_path / "a/placement/cache"
    shutil.rmtree(cache_root / "layer_package/lost")  # gone behind the node's back
    (cache_root / "layer_package/orphan").mkdir()  # a crash between the rename and the index write
    (cache_root / ".trash-layer_package-x-0").mkdir()
    again = LocalCache(cache_root)
    notes = again.load()
    assert sorted(again.index.entries) == [("layer_package", "kept")] and again.index.pins == {("kv_state", "later")}
    assert not (cache_root / "layer_package/orphan").exists() and not (cache_root / ".trash-layer_package-x-0").exists()
    assert any("lost" in n for n in notes) and any("orphan" in n for n in notes)
    (cache_root / "index.json").write_text("{not json")
    assert "unreadable" in LocalCache(cache_root).load()[0]
