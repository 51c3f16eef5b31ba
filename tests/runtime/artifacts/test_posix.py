"""PosixStore on real files: publish, fetch, list, remove; corruption and tampering refused with
nothing left at the destination; versions, stale staging and the copy paths (kernel and buffered)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from nacl.signing import SigningKey

from hydra_node.runtime.artifacts import filecopy
from hydra_node.runtime.artifacts.errors import (
    ArtifactNotFound,
    ChecksumMismatch,
    InvalidRequest,
    ManifestInvalid,
    SignatureInvalid,
    SourceInvalid,
    StoreUnavailable,
)
from hydra_node.runtime.artifacts.filecopy import copy_hashed
from hydra_node.runtime.artifacts.manifest import Manifest, hash_file, signer
from hydra_node.runtime.artifacts.posix import PosixStore

KEY = SigningKey(bytes([0xA1]) * 32)
OTHER = SigningKey(bytes([0xB2]) * 32)


def sources(tmp_path: Path, **files: bytes) -> dict[str, Path]:
    out = {}
    for i, (name, data) in enumerate(files.items()):
        p = tmp_path / "src" / f"{i}-{name}"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        out[name.replace("__", "/")] = p
    return out


@pytest.fixture
def store(tmp_path) -> PosixStore:
    (tmp_path / "root").mkdir()
    return PosixStore(tmp_path / "root")


def files_of(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_publish_then_fetch_materialises_every_file_verified(store, tmp_path) -> None:
    src = sources(tmp_path, **{"weights__a.bin": os.urandom(300_000), "tok.json": b"{}", "empty": b""})
    seen = []
    m = store.publish(
        "layer_package", "stage-0", src, identity={"layers": [0, 11]}, sign=signer(KEY), progress=seen.append
    )
    assert m.location == f"posix:{store.root}" and m.node_id == bytes(KEY.verify_key).hex()
    assert {f.path: (f.size, f.sha256) for f in m.files} == {k: hash_file(v) for k, v in src.items()}
    assert seen[-1] == m.size == 300_002
    assert store.manifest("layer_package", "stage-0") == m
    assert store.list() == [m] and store.list("kv_state") == []
    dest = tmp_path / "out" / "stage-0"
    got = store.fetch("layer_package", "stage-0", dest, trust=lambda node: node == m.node_id)
    assert got == m
    assert files_of(dest) == {k: v.read_bytes() for k, v in src.items()}
    assert sorted(os.listdir(dest.parent)) == ["stage-0"]  # no staging sibling left
    manifest_json = store.root / "layer_package" / "stage-0" / "current" / "manifest.json"
    assert Manifest.from_json(manifest_json.read_text()) == m  # readers without CBOR have the same manifest


def test_a_new_version_replaces_the_old_and_older_ones_are_removed(store, tmp_path) -> None:
    versions = []
    for i in range(4):
        versions.append(
            store.publish(
                "model_weights", "m", sources(tmp_path / str(i), w=bytes([i]) * 10), identity={}, sign=signer(KEY)
            )
        )
    assert store.manifest("model_weights", "m") == versions[-1]
    name_dir = store.root / "model_weights" / "m"
    kept = sorted(e for e in os.listdir(name_dir) if e.startswith("v"))
    assert len(kept) == 2 and os.readlink(name_dir / "current") == kept[-1]  # current + the one it replaced
    dest = tmp_path / "dest"
    store.fetch("model_weights", "m", dest)
    assert (dest / "w").read_bytes() == bytes([3]) * 10
    (dest / "stale-extra").write_text("x")
    store.publish("model_weights", "m", sources(tmp_path / "5", w=b"five"), identity={}, sign=signer(KEY))
    store.fetch("model_weights", "m", dest)  # an existing destination is replaced whole
    assert files_of(dest) == {"w": b"five"}


def test_a_corrupted_byte_is_refused_and_nothing_is_left_at_dest(store, tmp_path) -> None:
    m = store.publish("kv_state", "p", sources(tmp_path, a=b"A" * 5000, b=b"B" * 7), identity={}, sign=signer(KEY))
    stored = store.root / "kv_state" / "p" / "current" / "files" / "a"
    data = bytearray(stored.read_bytes())
    data[2500] ^= 1
    stored.write_bytes(bytes(data))
    dest = tmp_path / "dest"
    with pytest.raises(ChecksumMismatch, match="sha256"):
        store.fetch("kv_state", "p", dest)
    assert not dest.exists() and sorted(os.listdir(tmp_path)) == ["root", "src"]  # no staging sibling either
    stored.write_bytes(b"A" * 5001)  # longer
    with pytest.raises(ChecksumMismatch, match="more than 5000"):
        store.fetch("kv_state", "p", dest)
    stored.unlink()
    with pytest.raises(ChecksumMismatch, match="missing"):
        store.fetch("kv_state", "p", dest)
    assert not dest.exists() and m.size == 5007


def test_a_tampered_or_untrusted_manifest_is_refused(store, tmp_path) -> None:
    m = store.publish("model_weights", "m", sources(tmp_path, w=b"weights"), identity={"q": "q4"}, sign=signer(KEY))
    dest = tmp_path / "dest"
    with pytest.raises(SignatureInvalid, match="not trusted"):
        store.fetch("model_weights", "m", dest, trust=lambda node: False)
    cbor_path = store.root / "model_weights" / "m" / "current" / "manifest.cbor"
    forged = Manifest(m.kind, m.name, m.files, {"q": "f16"}, m.location, m.created_at, m.node_id, m.signature)
    cbor_path.write_bytes(forged.to_cbor())
    with pytest.raises(SignatureInvalid):
        store.fetch("model_weights", "m", dest)
    with pytest.raises(SignatureInvalid):
        store.manifest("model_weights", "m")
    assert store.list() == []  # unreadable artifacts are skipped (and logged)
    cbor_path.write_bytes(b"\xff garbage")
    with pytest.raises(ManifestInvalid):
        store.fetch("model_weights", "m", dest)
    renamed = Manifest(m.kind, "other", m.files, m.identity, m.location, m.created_at).sign(KEY)
    cbor_path.write_bytes(renamed.to_cbor())
    with pytest.raises(ManifestInvalid, match="describes"):
        store.fetch("model_weights", "m", dest)
    assert not dest.exists()


def test_missing_things_and_bad_requests_have_typed_errors(store, tmp_path) -> None:
    with pytest.raises(ArtifactNotFound):
        store.fetch("model_weights", "nope", tmp_path / "d")
    assert store.manifest("model_weights", "nope") is None and store.remove("model_weights", "nope") is False
    with pytest.raises(InvalidRequest):
        store.fetch("weights", "x", tmp_path / "d")
    with pytest.raises(InvalidRequest):
        store.publish("model_weights", "../x", {"a": tmp_path}, identity={}, sign=signer(KEY))
    with pytest.raises(InvalidRequest):
        store.publish("model_weights", "x", {"../a": tmp_path / "f"}, identity={}, sign=signer(KEY))
    with pytest.raises(SourceInvalid):
        store.publish("model_weights", "x", {"a": tmp_path / "missing"}, identity={}, sign=signer(KEY))
    with pytest.raises(SourceInvalid):
        store.publish("model_weights", "x", {"a": tmp_path}, identity={}, sign=signer(KEY))  # a folder
    with pytest.raises(SourceInvalid):
        store.publish("model_weights", "x", {}, identity={}, sign=signer(KEY))
    with pytest.raises(InvalidRequest):
        store.publish("model_weights", "x", sources(tmp_path, a=b"1"), identity={"bytes": "x"}, sign=signer(KEY))
    with pytest.raises(SignatureInvalid):  # a signer that does not sign is refused before the commit
        store.publish("model_weights", "x", sources(tmp_path, a=b"1"), identity={}, sign=lambda m: m)
    assert store.manifest("model_weights", "x") is None
    assert os.listdir(store.root / ".staging") == []
    with pytest.raises(StoreUnavailable, match="mounted"):
        PosixStore(tmp_path / "unmounted").list()
    pointer = store.root / "model_weights" / "evil"
    pointer.mkdir(parents=True)
    os.symlink("../../../etc", pointer / "current")
    with pytest.raises(ManifestInvalid, match="not a version"):
        store.fetch("model_weights", "evil", tmp_path / "d")


def test_remove_makes_the_artifact_disappear_whole(store, tmp_path) -> None:
    store.publish("kv_state", "p", sources(tmp_path, a=b"x"), identity={}, sign=signer(KEY))
    assert store.remove("kv_state", "p") is True
    assert store.manifest("kv_state", "p") is None and store.list() == []
    assert os.listdir(store.root / ".trash") == []


def test_stale_staging_and_abandoned_versions_are_swept_by_age(tmp_path) -> None:
    (tmp_path / "root").mkdir()
    now = [time.time()]
    store = PosixStore(tmp_path / "root", stale_after_s=600, clock=lambda: now[0])
    store.publish("kv_state", "p", sources(tmp_path / "1", a=b"1"), identity={}, sign=signer(KEY))
    name_dir = store.root / "kv_state" / "p"
    left = [store.root / ".staging" / "v000000000000001-00000000", name_dir / "v999999999999999-00000000"]
    for p in left:  # a crashed publisher's staging folder, and a version moved in but never made current
        p.mkdir()
    store.publish("kv_state", "p", sources(tmp_path / "2", a=b"2"), identity={}, sign=signer(KEY))
    assert all(p.exists() for p in left)  # young: perhaps another node's publish in progress
    now[0] += 601
    for p in left:
        os.utime(p, (now[0] - 601, now[0] - 601))
    store.publish("kv_state", "p", sources(tmp_path / "3", a=b"3"), identity={}, sign=signer(KEY))
    assert not any(p.exists() for p in left)
    store.fetch("kv_state", "p", tmp_path / "d")
    assert (tmp_path / "d" / "a").read_bytes() == b"3"


def test_adopt_installs_a_foreign_artifact_unchanged_and_checks_its_files(store, tmp_path) -> None:
    other = PosixStore((tmp_path / "other").resolve())
    other.root.mkdir()
    m = other.publish("model_weights", "m", sources(tmp_path, w=b"abc"), identity={}, sign=signer(OTHER))
    other.fetch("model_weights", "m", tmp_path / "got")
    assert store.adopt(m, tmp_path / "got") == m
    assert store.manifest("model_weights", "m") == m and m.location == other.location
    (tmp_path / "got" / "w").write_bytes(b"abd")
    with pytest.raises(ChecksumMismatch):
        store.adopt(m, tmp_path / "got")
    with pytest.raises(SignatureInvalid):
        store.adopt(m, tmp_path / "got", trust=lambda node: node == bytes(KEY.verify_key).hex())


@pytest.mark.parametrize("size", [0, 1, 65_536 * 2 + 7, 65_536 * 5 + 3])
def test_copy_hashed_kernel_path_with_the_threaded_read_back(tmp_path, monkeypatch, size) -> None:
    monkeypatch.setattr(filecopy, "COPY_CHUNK_BYTES", 65_536)  # so that small files take the threaded path
    src = tmp_path / "src"
    src.write_bytes(os.urandom(size))
    done = []
    assert copy_hashed(src, tmp_path / "dst", progress=done.append) == hash_file(src)
    assert (tmp_path / "dst").read_bytes() == src.read_bytes() and (done[-1] if done else 0) == size
    assert copy_hashed(src, tmp_path / "cut", limit=max(size - 2, 0))[0] == min(size, max(size - 2, 0) + 1)
    with pytest.raises(FileExistsError):
        copy_hashed(src, tmp_path / "dst")


def test_copy_hashed_hashes_short_kernel_copies_and_files_it_cannot_map(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(filecopy, "COPY_CHUNK_BYTES", 65_536)
    real = os.copy_file_range
    # Short copies (as the kernel may return) leave chunk offsets that are not page-aligned.
    monkeypatch.setattr(filecopy.os, "copy_file_range", lambda i, o, n: real(i, o, min(n, 10_007)))
    src = tmp_path / "src"
    src.write_bytes(os.urandom(300_001))
    assert copy_hashed(src, tmp_path / "short") == hash_file(src)

    def refuse(*args, **kwargs):
        raise OSError(19, "No such device")  # what mmap says on a file system that cannot map

    monkeypatch.setattr(filecopy.mmap, "mmap", refuse)
    assert copy_hashed(src, tmp_path / "unmapped") == hash_file(src)
    assert (tmp_path / "unmapped").read_bytes() == src.read_bytes()


def test_copy_hashed_across_file_systems_falls_back_to_buffered_copies(tmp_path) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no second file system here")
    src = shm / f"hydra-test-{os.getpid()}"
    src.write_bytes(os.urandom(100_000))
    try:
        assert copy_hashed(src, tmp_path / "dst") == hash_file(src)
    finally:
        src.unlink()
