"""One cache (issue 30 item 5): the models fetched by name are ``model_weights`` entries of the
artifact cache. The previous generation's ``<home>/models`` is moved in (a rename, or a copy and a
rename across file systems), and a migration killed midway (a real SIGKILL of a child process,
at every rename it makes) resumes at the next start without losing a file or showing half of one;
a model and a placement artifact compete under the one capacity (keep and pins respected); a
partial download moved with the rest resumes; two processes on the cache see each other's writes.
Small synthetic files, real folders; no model is loaded."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from nacl.signing import SigningKey
from test_models_download_bounds import DATA, DIGEST, Server, ranged

from hydra_node.runtime.artifacts.cache import MODEL_KIND
from hydra_node.runtime.artifacts.local_cache import CacheFull, LocalCache, cache_root
from hydra_node.runtime.artifacts.manifest import ArtifactFile, Manifest, signer
from hydra_node.runtime.fetch import ModelCache
from hydra_node.runtime.fetch.cache import PartialMeta, cache_key
from hydra_node.runtime.fetch.catalogue import resolve_remote, with_sha256
from hydra_node.runtime.fetch.errors import DiskError
from hydra_node.runtime.fetch.fetcher import FetchSettings, open_cache
from hydra_node.runtime.fetch.http_fetch import download_http
from hydra_node.runtime.fetch.migrate import migrate_models

KEY = SigningKey(bytes([0x33]) * 32)
#: The models of the previous layout: id → (bytes, keep, last used).
OLD = {
    "alpha": (b"GGUF-alpha" * 3000, False, 100.0),
    "beta": (b"GGUF-beta" * 5000, True, 200.0),
    "org/gamma": (b"GGUF-gamma" * 2000, False, 300.0),
}


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def old_layout(old: Path, models=OLD) -> None:
    """``<home>/models`` as the previous generation wrote it (its index format, its folders)."""
    old.mkdir(parents=True, exist_ok=True)
    records = {}
    for mid, (data, keep, used) in models.items():
        (old / cache_key(mid)).mkdir(parents=True)
        (old / cache_key(mid) / "model.gguf").write_bytes(data)
        records[mid] = {
            "model_id": mid,
            "file": "model.gguf",
            "sha256": digest(data),
            "size_bytes": len(data),
            "source": f"https://example.org/{mid}.gguf",
            "sha256_origin": "pinned",
            "last_used": used,
            "keep": keep,
        }
    (old / "index.json").write_text(json.dumps({"version": 1, "models": records}))


def assert_all_moved(home: Path) -> None:
    cache = ModelCache(cache_root(home))
    for mid, (data, keep, used) in OLD.items():
        rec = cache.lookup(mid)
        assert rec is not None, mid
        assert rec.path(cache.root).read_bytes() == data and rec.sha256 == digest(data)
        assert (rec.keep, rec.last_used, rec.source) == (keep, used, f"https://example.org/{mid}.gguf")
    assert not (home / "models" / "index.json").exists()


def settings(home: Path) -> FetchSettings:
    return FetchSettings(cache_dir=cache_root(home), old_models_dir=home / "models")


def test_the_old_layout_is_renamed_into_the_one_cache(tmp_path):
    home = tmp_path
    old_layout(home / "models")
    inodes = {mid: (home / "models" / cache_key(mid) / "model.gguf").stat().st_ino for mid in OLD}
    cache = open_cache(settings(home))
    assert_all_moved(home)
    for mid in OLD:  # renamed, not copied
        assert cache.lookup(mid).path(cache.root).stat().st_ino == inodes[mid]
    assert list((home / "models").iterdir()) == []  # the emptied folders are gone too
    # a node start: the cache reconciles its folders with its index and keeps every model
    assert LocalCache(cache_root(home)).load() == []
    assert_all_moved(home)
    assert sorted(open_cache(settings(home)).records()) == sorted(OLD)  # a second open: nothing to do


def test_across_file_systems_it_is_a_copy_then_a_rename(tmp_path):
    shm = Path("/dev/shm")
    if not shm.is_dir() or shm.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("needs /dev/shm on another file system than the test's folder")
    old = shm / f"hydra-test-models-{os.getpid()}"
    try:
        old_layout(old)
        (tmp_path / "models").symlink_to(old)  # an operator's <home>/models on another disk
        open_cache(settings(tmp_path))
        assert_all_moved(tmp_path)
        assert not list(old.rglob("*.gguf")) and not list((cache_root(tmp_path) / ".partial").glob("migrate-*"))
    finally:
        subprocess.run(["rm", "-rf", str(old)], check=False)


CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path

    home, stop_at = Path(sys.argv[1]), int(sys.argv[2])
    real, calls = os.replace, [0]

    def replace(src, dst):  # every rename the migration makes (the index's, the files')
        calls[0] += 1
        if calls[0] == stop_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(src, dst)

    os.replace = replace
    from hydra_node.runtime.artifacts.local_cache import cache_root
    from hydra_node.runtime.fetch.fetcher import FetchSettings, open_cache

    open_cache(FetchSettings(cache_dir=cache_root(home), old_models_dir=home / "models"))
    print(calls[0])
    """
)


def run_child(home: Path, stop_at: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", CHILD, str(home), str(stop_at)], capture_output=True, text=True, timeout=120
    )


def test_a_migration_killed_at_any_rename_resumes_and_loses_nothing(tmp_path):
    old_layout(tmp_path / "whole" / "models")
    renames = int(run_child(tmp_path / "whole", 0).stdout)  # a run to the end: how many renames it makes
    assert renames >= 2 * len(OLD)  # at least an index write and a file rename per model
    for stop_at in range(1, renames + 1):
        home = tmp_path / f"kill-{stop_at}"
        old_layout(home / "models")
        killed = run_child(home, stop_at)
        assert killed.returncode == -9, killed.stderr[-2000:]
        # never a half file in the cache, never a model in neither place
        for f in (cache_root(home) / MODEL_KIND).glob("*/*"):
            assert f.name == "model.gguf" and f.parent.name == f"sha256:{digest(f.read_bytes())}"
        for mid, (data, _, _) in OLD.items():
            where = [home / "models" / cache_key(mid) / "model.gguf"]
            where += [cache_root(home) / MODEL_KIND / f"sha256:{digest(data)}" / "model.gguf"]
            assert any(p.is_file() and p.read_bytes() == data for p in where), (stop_at, mid)
        # the next start: the node's cache load (which removes folders its index does not know),
        # then the migration again
        LocalCache(cache_root(home)).load()
        open_cache(settings(home))
        assert_all_moved(home)


def test_a_partial_download_moved_with_the_rest_resumes(tmp_path):
    server = Server({"/m.gguf": ranged(DATA)})
    try:
        url = f"{server.url}/m.gguf"
        remote = with_sha256(resolve_remote(url, {}), DIGEST)
        old = tmp_path / "models"
        old_layout(old, {})
        (old / ".partial").mkdir()
        half = len(DATA) // 2
        (old / ".partial" / f"{cache_key(remote.model_id)}.part").write_bytes(DATA[:half])
        meta = PartialMeta(url=url, resumable=True, total=len(DATA), durable=half)
        (old / ".partial" / f"{cache_key(remote.model_id)}.json").write_text(json.dumps(meta.__dict__))
        cache = open_cache(settings(tmp_path))
        assert cache.partial_bytes(remote.model_id) == half and cache.partial_meta(remote.model_id) == meta
        rec = download_http(remote, cache, token=None, read_timeout_s=10)
        assert server.requests[-1][1].get("Range") == f"bytes={half}-"
        assert rec.sha256 == DIGEST and rec.path(cache.root).read_bytes() == DATA
        assert not (old / "index.json").exists()
    finally:
        server.close()


def placed(store: LocalCache, name: str, size: int, now: float) -> None:
    """A placement artifact of ``size`` bytes materialised in ``store`` at ``now``."""
    data = bytes([len(name)]) * size
    folder = store.folder("layer_package", name)
    folder.mkdir(parents=True)
    (folder / "state.bin").write_bytes(data)
    m = Manifest("layer_package", name, (ArtifactFile("state.bin", size, digest(data)),), {}, "posix:/ns", 0)
    store._wall = lambda: now
    store.add(signer(KEY)(m), "posix:/ns")


def model(cache: ModelCache, mid: str, size: int, now: float) -> None:
    data = mid.encode() * (size // len(mid))
    cache.partial_dir.mkdir(parents=True, exist_ok=True)
    cache.partial_path(mid).write_bytes(data)
    cache.commit(mid, f"{mid}.gguf", digest(data), len(data), "test", "pinned", now)


def test_models_and_placement_artifacts_compete_under_one_capacity(tmp_path):
    store = LocalCache(tmp_path / "cache", capacity_bytes=3000, ttl_s=60.0)
    store.load()
    cache = ModelCache(store)
    placed(store, "old-layers", 1000, now=1.0)
    model(cache, "m1", 1000, now=2.0)
    placed(store, "pinned-layers", 1000, now=3.0)
    store.pin("pinned-layers", None, True)
    # a model needs room: the least recently used entry goes, whatever its kind
    assert cache.make_room(1000, frozenset()) == ["layer_package/old-layers"]
    model(cache, "m2", 1000, now=4.0)
    cache.set_keep("m2", True)
    # placement needs room: the unkept model goes, never the pinned artifact nor the kept model
    assert store.make_room(1000) == [(MODEL_KIND, f"sha256:{digest(b'm1' * 500)}")]
    assert cache.lookup("m1") is None and cache.lookup("m2").keep
    placed(store, "new-layers", 1000, now=5.0)
    store.acquire(("layer_package", "new-layers"))  # in use: with the pin and the keep, nothing can go
    with pytest.raises(CacheFull):
        store.make_room(1000)
    store.release(("layer_package", "new-layers"))
    cache.set_keep("m2", False)
    with pytest.raises(DiskError, match=r"\[placement\] cache_capacity_gb"):  # m2 is in use by the caller
        cache.make_room(2000, frozenset({"m2"}))
    assert sorted(cache.records()) == ["m2"] and store.index.used_bytes() == 3000  # a refusal evicts nothing
    # the TTL ages placement's artifacts; a model fetched by name is evicted only to make room
    store._wall = lambda: 1000.0
    assert store.sweep() == [("layer_package", "new-layers")]
    assert cache.lookup("m2") is not None and store.listing()["used_bytes"] == 2000


def test_making_room_never_evicts_a_file_the_node_serves(tmp_path):
    store = LocalCache(tmp_path / "cache", capacity_bytes=2000)
    store.load()
    cache = ModelCache(store)
    model(cache, "served", 1000, now=1.0)  # the least recently used, but a hosted model runs from it
    model(cache, "idle", 1000, now=2.0)
    served = cache.lookup("served").path(cache.root)
    cache.serving_paths = lambda: [served]
    assert cache.make_room(1000, frozenset()) == [f"{MODEL_KIND}/sha256:{digest(b'idle' * 250)}"]
    assert cache.lookup("served") is not None and served.is_file()


def test_a_write_by_another_process_is_never_lost_by_an_open_cache(tmp_path):
    """The node holds the cache open while ``hydra-node models pull`` commits in another process:
    the node's next write keeps the pulled model (it re-reads the index under the lock)."""
    node = LocalCache(tmp_path / "cache")
    node.load()
    placed(node, "layers", 100, now=time.time())
    cli = ModelCache(tmp_path / "cache")  # another open of the same folder, as another process has
    model(cli, "pulled", 200, now=time.time())
    node.pin("layers", None, True)  # the node writes its index
    assert ModelCache(tmp_path / "cache").lookup("pulled") is not None
    assert ModelCache(node).lookup("pulled") is not None
    assert LocalCache(tmp_path / "cache").load() == []  # the model's folder is in the index


def test_migrate_leaves_an_index_it_does_not_know(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "index.json").write_text('{"version": 7}')
    notes = migrate_models(tmp_path / "models", ModelCache(cache_root(tmp_path)))
    assert "left in place" in notes[0] and (tmp_path / "models" / "index.json").exists()


def test_placement_announces_and_lists_its_artifacts_and_the_models_once(tmp_path):
    """The models are announced by the model share (signed manifests, ``models_held``), never by
    placement with the cache's unsigned record; ``hydra-node placement`` lists them with their ids,
    never expiring."""
    from hydra_node.config import PlacementSection
    from hydra_node.runtime.artifacts.peer_wire import held_artifacts_from_extra
    from hydra_node.runtime.artifacts.service import PlacementService

    svc = PlacementService(
        PlacementSection(cache_ttl_secs=60),
        home=tmp_path,
        node_id="00" * 32,
        sign=signer(KEY),
        peer_fetch=lambda *a, **k: None,
    )
    svc.cache.load()
    svc.ready = True
    placed(svc.cache, "layers", 100, now=time.time())
    model(ModelCache(svc.cache), "m", 200, now=time.time())
    assert list(held_artifacts_from_extra(svc.announce_extra())) == [("layer_package", "layers")]
    listed = {a["name"]: a for a in svc.cache_listing()["artifacts"]}
    m = listed[f"sha256:{digest(b'm' * 200)}"]
    assert (m["kind"], m["models"], m["expires_at"]) == (MODEL_KIND, ["m"], None)
    assert listed["layers"]["models"] == [] and listed["layers"]["expires_at"] is not None
    assert svc.status().cache["used_bytes"] == 300  # one figure for the one cache
