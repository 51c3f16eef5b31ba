"""A publishing process killed (SIGKILL) at every stage of an S3 publish leaves readers the previous
complete artifact or the new one, never half; the next publish collects what the crash left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import nacl.signing

from hydra_node.runtime.artifacts.manifest import signer
from hydra_node.runtime.artifacts.s3 import POINTER, S3_STAGES, S3Store
from hydra_node.runtime.artifacts.store import CRASH_ENV

SEED = bytes(range(32))

PUBLISH = """
import sys
from pathlib import Path
import nacl.signing
from hydra_node.runtime.artifacts.manifest import signer
from hydra_node.runtime.artifacts.s3 import S3Store
endpoint, bucket, src = sys.argv[1:4]
store = S3Store(bucket, endpoint=endpoint, region="us-east-1")
files = {p.name: p for p in Path(src).iterdir()}
store.publish("layer_package", "pkg", files, identity={"v": src}, sign=signer(nacl.signing.SigningKey(bytes(range(32)))))
"""


def _version(tmp_path: Path, tag: str) -> Path:
    src = tmp_path / tag
    src.mkdir()
    for i in range(2):
        (src / f"part{i}.bin").write_bytes(f"{tag}-{i}-".encode() * 5000)
    return src


def _read(store: S3Store, dest: Path) -> dict[str, bytes]:
    store.fetch("layer_package", "pkg", dest)
    return {p.name: p.read_bytes() for p in dest.iterdir()}


def test_kill_at_every_publish_stage_leaves_old_or_new(s3_server, tmp_path):
    bucket = s3_server.new_bucket("crash")
    store = S3Store(bucket, endpoint=s3_server.endpoint, region="us-east-1")
    old_src = _version(tmp_path, "old")
    store.publish(
        "layer_package",
        "pkg",
        {p.name: p for p in old_src.iterdir()},
        identity={"v": str(old_src)},
        sign=signer(nacl.signing.SigningKey(SEED)),
    )
    old = {p.name: p.read_bytes() for p in old_src.iterdir()}
    committed = False
    for i, stage in enumerate(S3_STAGES):
        new_src = _version(tmp_path, f"new{i}")
        run = subprocess.run(
            [sys.executable, "-c", PUBLISH, s3_server.endpoint, bucket, str(new_src)],
            env={**os.environ, CRASH_ENV: stage},
            capture_output=True,
            timeout=120,
            check=False,
        )
        assert run.returncode == -signal.SIGKILL, (stage, run.stderr.decode()[-2000:])
        committed = committed or stage == "s3.pointer_written"
        seen = _read(store, tmp_path / f"read{i}")
        want = {p.name: p.read_bytes() for p in new_src.iterdir()} if committed else old
        assert seen == want, stage
        if committed:
            old = want
    # What the crashes left (uncommitted versions, uncollected old ones) goes with the next publish.
    final_src = _version(tmp_path, "final")
    m = store.publish(
        "layer_package",
        "pkg",
        {p.name: p for p in final_src.iterdir()},
        identity={},
        sign=signer(nacl.signing.SigningKey(SEED)),
    )
    pages = s3_server.client().get_paginator("list_objects_v2").paginate(Bucket=bucket)
    keys = sorted(item["Key"] for page in pages for item in page.get("Contents", ()))
    base = m.location[len(f"s3://{bucket}/") :]
    assert keys == sorted([f"layer_package/pkg/{POINTER}", f"{base}/part0.bin", f"{base}/part1.bin"])
