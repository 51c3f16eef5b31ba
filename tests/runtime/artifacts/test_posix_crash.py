"""A publishing process killed (SIGKILL) at every stage of a POSIX publish leaves the previous
complete version or the new complete one, never half an artifact; the next publish succeeds and
sweeps what the crash left once it is stale. A child that is not killed commits."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from nacl.signing import SigningKey

from hydra_node.runtime.artifacts.manifest import Manifest, signer
from hydra_node.runtime.artifacts.posix import PUBLISH_STAGES, PosixStore
from hydra_node.runtime.artifacts.store import CRASH_ENV

ROOT = Path(__file__).resolve().parents[3]
PUBLISHER = Path(__file__).with_name("posix_process.py")
SEED = bytes([0xC3]) * 32
#: The stages after which the new version is the visible one.
VISIBLE_FROM = PUBLISH_STAGES.index("pointer_switched")


def publish_in_child(root: Path, files: dict[str, Path], crash_at: str | None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(CRASH_ENV, None)
    if crash_at is not None:
        env[CRASH_ENV] = crash_at
    argv = [
        sys.executable,
        str(PUBLISHER),
        "publish",
        str(root),
        "layer_package",
        "stage-0",
        SEED.hex(),
        *(f"{k}={v}" for k, v in files.items()),
    ]
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_crash_at_every_stage_leaves_the_old_or_the_new_complete_version(tmp_path) -> None:
    key = SigningKey(SEED)
    old_src, new_src = tmp_path / "old", tmp_path / "new"
    old_src.mkdir()
    new_src.mkdir()
    (old_src / "a").write_bytes(b"old-a" * 1000)
    new_files = {"a": new_src / "a", "sub/b": new_src / "b"}
    new_files["a"].write_bytes(b"new-a" * 3000)
    new_files["sub/b"].write_bytes(b"new-b" * 3000)
    now = [time.time()]
    stores, olds, children = {}, {}, {}
    for stage in PUBLISH_STAGES:  # one root per stage, each child killed at its stage, all at once
        root = tmp_path / f"root-{stage}"
        root.mkdir()
        stores[stage] = PosixStore(root, stale_after_s=60, clock=lambda: now[0])
        olds[stage] = stores[stage].publish(
            "layer_package", "stage-0", {"a": old_src / "a"}, identity={}, sign=signer(key)
        )
        children[stage] = publish_in_child(root, new_files, stage)
    (tmp_path / "clean").mkdir()
    clean = publish_in_child(tmp_path / "clean", new_files, "not_a_stage")  # an unknown stage kills nothing
    for stage, child in children.items():
        _, err = child.communicate(timeout=60)
        assert child.returncode == -9, f"{stage}: the child was not killed there: {err[-2000:]}"
    out, err = clean.communicate(timeout=60)
    assert clean.returncode == 0, err
    printed = Manifest.from_json(out)
    printed.verify()
    assert PosixStore(tmp_path / "clean").manifest("layer_package", "stage-0") == printed
    now[0] += 61
    for i, stage in enumerate(PUBLISH_STAGES):
        store, old = stores[stage], olds[stage]
        seen = store.manifest("layer_package", "stage-0")
        dest = tmp_path / f"dest-{stage}"
        fetched = store.fetch("layer_package", "stage-0", dest)
        assert fetched == seen
        if i < VISIBLE_FROM:
            assert seen == old, stage
            assert {p.name: p.read_bytes() for p in dest.rglob("*") if p.is_file()} == {"a": b"old-a" * 1000}
        else:
            assert seen != old and sorted(f.path for f in seen.files) == ["a", "sub/b"], stage
            assert (dest / "a").read_bytes() == b"new-a" * 3000 and (dest / "sub" / "b").read_bytes() == b"new-b" * 3000
        # The next publish works, and once stale, whatever the crash left is swept.
        root = store.root
        for leftover in [*root.joinpath(".staging").iterdir(), *root.joinpath("layer_package", "stage-0").iterdir()]:
            os.utime(leftover, (now[0] - 61, now[0] - 61), follow_symlinks=False)
        third = store.publish("layer_package", "stage-0", {"c": old_src / "a"}, identity={}, sign=signer(key))
        assert store.manifest("layer_package", "stage-0") == third
        assert list(root.joinpath(".staging").iterdir()) == []
        versions = [e for e in os.listdir(root / "layer_package" / "stage-0") if e.startswith("v")]
        assert len(versions) == 2, (stage, versions)  # the new current and the one it replaced
