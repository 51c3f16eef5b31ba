"""PosixStore against links planted by anyone who can write the namespace (issue 25 item 4): a
link at ``.trash``, ``.staging``, ``KIND``, ``KIND/NAME`` or a version folder is refused with
``namespace_tampered`` (or, for a version, logged and left) and the folder it points at keeps
every file; sweeps remove a planted link, never what it points at."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from nacl.signing import SigningKey

from hydra_node.runtime.artifacts.errors import NamespaceTampered
from hydra_node.runtime.artifacts.manifest import signer
from hydra_node.runtime.artifacts.posix import PosixStore
from hydra_node.runtime.artifacts.store import sweep_stale, sweep_stale_fd

KEY = SigningKey(bytes([0xA1]) * 32)
OLD_V1 = "v000000000000001-deadbeef"
OLD_V2 = "v000000000000002-deadbeef"


@pytest.fixture
def store(tmp_path) -> PosixStore:
    (tmp_path / "root").mkdir()
    return PosixStore(tmp_path / "root", stale_after_s=0.0)


def victim(tmp_path: Path, *names: str) -> Path:
    """A folder outside the namespace with files (old enough for any sweep) and a subfolder."""
    v = tmp_path / "victim"
    for n in names or ("precious.txt", "v-also-precious", "sub/deep.bin"):
        p = v / n
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"keep " + n.encode())
    for p in [v, *v.rglob("*")]:
        os.utime(p, (0, 0), follow_symlinks=False)
    return v


def snapshot(folder: Path) -> dict[str, bytes | str]:
    out: dict[str, bytes | str] = {}
    for p in sorted(folder.rglob("*")):
        rel = str(p.relative_to(folder))
        out[rel] = f"-> {os.readlink(p)}" if p.is_symlink() else p.read_bytes() if p.is_file() else "dir"
    return out


def publish(store: PosixStore, tmp_path: Path, data: bytes = b"weights", name: str = "stage-0"):
    src = tmp_path / "src" / "w.bin"
    src.parent.mkdir(parents=True, exist_ok=True)
    src.write_bytes(data)
    return store.publish("layer_package", name, {"w.bin": src}, identity={}, sign=signer(KEY))


def no_staging_left(store: PosixStore) -> bool:
    staging = store.root / ".staging"
    return staging.is_symlink() or not staging.exists() or not any(staging.iterdir())


@pytest.mark.parametrize("folder", [".trash", ".staging"])
def test_a_link_at_trash_or_staging_is_refused_and_its_target_keeps_every_file(store, tmp_path, folder, caplog) -> None:
    publish(store, tmp_path)  # the namespace is in use
    v = victim(tmp_path)
    before = snapshot(v)
    if (store.root / folder).exists():
        os.rmdir(store.root / folder)
    (store.root / folder).symlink_to(v)
    with caplog.at_level(logging.WARNING, "hydra.placement.posix"):
        with pytest.raises(NamespaceTampered) as err:
            publish(store, tmp_path, b"new weights")
    assert err.value.code == "namespace_tampered" and str(store.root / folder) in err.value.message
    assert "event=namespace_tampered" in caplog.text
    assert snapshot(v) == before
    assert store.fetch("layer_package", "stage-0", tmp_path / "out") is not None
    assert (tmp_path / "out" / "w.bin").read_bytes() == b"weights"  # the committed version is untouched


def test_remove_through_a_link_at_trash_is_refused_and_the_artifact_stays(store, tmp_path) -> None:
    publish(store, tmp_path)
    v = victim(tmp_path)
    before = snapshot(v)
    if (store.root / ".trash").exists():
        os.rmdir(store.root / ".trash")
    (store.root / ".trash").symlink_to(v)
    with pytest.raises(NamespaceTampered):
        store.remove("layer_package", "stage-0")
    assert snapshot(v) == before
    assert store.manifest("layer_package", "stage-0") is not None


def a_foreign_artifact(tmp_path: Path) -> Path:
    """Another namespace's KIND/NAME: two versions, ``current`` -> the newer one."""
    v = victim(tmp_path, f"{OLD_V1}/files/w.bin", f"{OLD_V1}/manifest.cbor", f"{OLD_V2}/files/w.bin")
    (v / "current").symlink_to(OLD_V2)
    return v


def test_a_link_at_an_artifact_folder_is_refused_and_its_target_keeps_every_version(store, tmp_path) -> None:
    v = a_foreign_artifact(tmp_path)
    before = snapshot(v)
    (store.root / "layer_package").mkdir()
    (store.root / "layer_package" / "stage-0").symlink_to(v)
    with pytest.raises(NamespaceTampered) as err:
        publish(store, tmp_path)
    assert str(store.root / "layer_package" / "stage-0") in err.value.message
    assert snapshot(v) == before and no_staging_left(store)


def test_a_link_at_a_kind_folder_is_refused_for_publish_and_remove(store, tmp_path) -> None:
    v = tmp_path / "victim"
    a_foreign_artifact(tmp_path / "other")
    v.mkdir()
    os.rename(tmp_path / "other" / "victim", v / "stage-0")
    before = snapshot(v)
    (store.root / "layer_package").symlink_to(v)
    with pytest.raises(NamespaceTampered):
        publish(store, tmp_path)
    with pytest.raises(NamespaceTampered):
        store.remove("layer_package", "stage-0")
    assert snapshot(v) == before and no_staging_left(store)


def test_a_link_planted_as_a_version_is_logged_and_left_and_its_target_kept(store, tmp_path, caplog) -> None:
    publish(store, tmp_path)
    v = victim(tmp_path)
    before = snapshot(v)
    planted = store.root / "layer_package" / "stage-0" / OLD_V1
    planted.symlink_to(v)
    with caplog.at_level(logging.WARNING, "hydra.placement.posix"):
        publish(store, tmp_path, b"v2")
        publish(store, tmp_path, b"v3")  # the first real version is now old and removed
    assert "event=namespace_tampered" in caplog.text and str(planted) in caplog.text
    assert planted.is_symlink() and snapshot(v) == before
    versions = [p for p in planted.parent.iterdir() if p.name.startswith("v") and not p.is_symlink()]
    assert len(versions) == 2


def test_a_link_inside_trash_or_staging_is_unlinked_never_followed(store, tmp_path) -> None:
    publish(store, tmp_path)
    v = victim(tmp_path)
    before = snapshot(v)
    (store.root / ".trash").mkdir(exist_ok=True)
    (store.root / ".trash" / "gone").symlink_to(v)
    (store.root / ".staging" / "v-stale").symlink_to(v)
    (store.root / ".trash" / "dir").mkdir()
    (store.root / ".trash" / "dir" / "inner").symlink_to(v)
    for link in ("gone", "dir/inner"):
        os.utime(store.root / ".trash" / link, (0, 0), follow_symlinks=False)
    os.utime(store.root / ".staging" / "v-stale", (0, 0), follow_symlinks=False)
    publish(store, tmp_path, b"v2")
    assert list((store.root / ".trash").iterdir()) == []
    assert not (store.root / ".staging" / "v-stale").is_symlink()
    assert snapshot(v) == before


def test_sweep_stale_removes_links_and_subtrees_through_the_descriptor(tmp_path) -> None:
    v = victim(tmp_path)
    before = snapshot(v)
    d = tmp_path / "d"
    (d / "x-tree" / "sub").mkdir(parents=True)
    (d / "x-tree" / "sub" / "link").symlink_to(v)
    (d / "x-link").symlink_to(v)
    (d / "keep").symlink_to(v)
    for p in [*d.rglob("*")]:
        os.utime(p, (0, 0), follow_symlinks=False)
    assert sweep_stale(d, "x-", 100.0, 1.0) == 2
    assert sorted(p.name for p in d.iterdir()) == ["keep"] and snapshot(v) == before
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert sweep_stale_fd(fd, "", 100.0, 1.0) == 1
    finally:
        os.close(fd)
    assert list(d.iterdir()) == [] and snapshot(v) == before
