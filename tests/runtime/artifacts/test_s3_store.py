"""S3Store against a real S3-compatible server (moto's standalone server, a child process)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import nacl.signing
import pytest

from hydra_node.runtime.artifacts.errors import (
    ArtifactNotFound,
    ChecksumMismatch,
    ManifestInvalid,
    SignatureInvalid,
    StoreUnavailable,
)
from hydra_node.runtime.artifacts.manifest import Manifest, hash_file, signer
from hydra_node.runtime.artifacts.s3 import POINTER, S3Store
from hydra_node.runtime.artifacts.store import ArtifactStore

pytestmark = pytest.mark.live  # a moto server process

MiB = 1024 * 1024
KEY = nacl.signing.SigningKey(bytes(range(32)))


def _store(s3_server, bucket: str, **kw) -> S3Store:
    return S3Store(
        bucket,
        endpoint=s3_server.endpoint,
        region=s3_server.region,
        multipart_threshold=1 * MiB,
        part_size=5 * MiB,
        **kw,
    )


def _files(tmp_path: Path, tag: bytes, big: int = 6 * MiB) -> dict[str, Path]:
    src = tmp_path / f"src-{tag.decode()}"
    (src / "blocks").mkdir(parents=True)
    (src / "weights.bin").write_bytes(os.urandom(big))
    (src / "blocks" / "meta.json").write_bytes(b'{"tag": "' + tag + b'"}')
    return {"weights.bin": src / "weights.bin", "blocks/meta.json": src / "blocks" / "meta.json"}


def _keys(s3_server, bucket: str, prefix: str = "") -> list[str]:
    pages = s3_server.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return sorted(item["Key"] for page in pages for item in page.get("Contents", ()))


def test_publish_fetch_round_trip_multipart(s3_server, tmp_path):
    bucket = s3_server.new_bucket("rt")
    store = _store(s3_server, bucket, prefix="team/a")
    assert isinstance(store, ArtifactStore)
    files = _files(tmp_path, b"one")
    seen: list[int] = []
    m = store.publish(
        "layer_package", "smol-0-15", files, identity={"n_layer": 30}, sign=signer(KEY), progress=seen.append
    )
    m.verify()
    assert m.node_id == bytes(KEY.verify_key).hex()
    assert {f.path: (f.size, f.sha256) for f in m.files} == {p: hash_file(s) for p, s in files.items()}
    assert seen[-1] == m.size == 6 * MiB + len(files["blocks/meta.json"].read_bytes())
    assert m.location.startswith(f"s3://{bucket}/team/a/layer_package/smol-0-15/v/")
    version_key = m.location[len(f"s3://{bucket}/") :] + "/weights.bin"
    assert s3_server.client().head_object(Bucket=bucket, Key=version_key)["ETag"].endswith('-2"')  # 2 parts
    assert store.manifest("layer_package", "smol-0-15") == m
    assert store.list() == [m] and store.list("layer_package") == [m] and store.list("kv_state") == []

    got: list[int] = []
    dest = tmp_path / "out" / "smol"
    fetched = store.fetch("layer_package", "smol-0-15", dest, progress=got.append, trust=lambda n: n == m.node_id)
    assert fetched == m and got[-1] == m.size
    for path, src in files.items():
        assert (dest / path).read_bytes() == src.read_bytes()
    assert sorted(p.name for p in dest.parent.iterdir()) == ["smol"]


def test_republish_switches_pointer_and_collects_old_version(s3_server, tmp_path):
    bucket = s3_server.new_bucket("gc")
    store = _store(s3_server, bucket)
    first = store.publish("model_weights", "m", _files(tmp_path, b"a", big=1000), identity={}, sign=signer(KEY))
    second = store.publish("model_weights", "m", _files(tmp_path, b"b", big=2000), identity={}, sign=signer(KEY))
    assert first.location != second.location
    assert store.manifest("model_weights", "m") == second
    base = second.location[len(f"s3://{bucket}/") :]
    assert _keys(s3_server, bucket) == sorted(
        ["model_weights/m/" + POINTER, base + "/weights.bin", base + "/blocks/meta.json"]
    )
    dest = tmp_path / "dest"
    store.fetch("model_weights", "m", dest)
    assert (dest / "weights.bin").stat().st_size == 2000

    assert store.remove("model_weights", "m") is True
    assert store.manifest("model_weights", "m") is None and _keys(s3_server, bucket) == []
    assert store.remove("model_weights", "m") is False
    with pytest.raises(ArtifactNotFound):
        store.fetch("model_weights", "m", tmp_path / "again")


class _Racing(S3Store):
    """A store whose first read of the pointer is followed at once by a rival's publish (the race
    between reading the pointer and writing it, which the conditional PUT closes)."""

    rival: S3Store
    rival_files: dict

    def _committed_state(self, kind, name):
        state = super()._committed_state(kind, name)
        rival, self.rival = getattr(self, "rival", None), None
        if rival is not None:
            self.rival_manifest = rival.publish(kind, name, self.rival_files, identity={}, sign=signer(KEY))
        return state


@pytest.mark.parametrize("rival_is_newer", [True, False])
def test_racing_publishers_never_let_an_older_version_replace_a_newer(s3_server, tmp_path, rival_is_newer):
    bucket = s3_server.new_bucket("race")
    _store(s3_server, bucket).publish(
        "model_weights", "m", _files(tmp_path, b"a", big=1000), identity={}, sign=signer(KEY)
    )
    now = 2_000_000_000.0
    ours = _Racing(bucket, endpoint=s3_server.endpoint, region=s3_server.region, clock=lambda: now)
    ours.rival = S3Store(
        bucket,
        endpoint=s3_server.endpoint,
        region=s3_server.region,
        clock=lambda: now + (10 if rival_is_newer else -10),
    )
    ours.rival_files = _files(tmp_path, b"r", big=1500)
    if rival_is_newer:  # its newer version stays committed; ours is dropped and its objects deleted
        with pytest.raises(StoreUnavailable, match="a newer version"):
            ours.publish("model_weights", "m", _files(tmp_path, b"o", big=2000), identity={}, sign=signer(KEY))
        assert ours.manifest("model_weights", "m") == ours.rival_manifest
        winner = ours.rival_manifest
    else:  # the rival's older version committed in between: ours replaces it (it read a newer pointer)
        winner = ours.publish("model_weights", "m", _files(tmp_path, b"o", big=2000), identity={}, sign=signer(KEY))
        assert ours.manifest("model_weights", "m") == winner and winner != ours.rival_manifest
    ours_prefix = f"model_weights/m/v/{int(now * 1e9):020d}-"
    versions = {k.split("/")[3] for k in _keys(s3_server, bucket) if "/v/" in k}
    assert versions == {winner.location.rsplit("/", 1)[1]}  # the dropped or replaced versions are gone
    assert rival_is_newer != winner.location.split(f"s3://{bucket}/", 1)[1].startswith(ours_prefix)


def test_corrupt_object_is_refused_and_nothing_is_left(s3_server, tmp_path):
    bucket = s3_server.new_bucket("bad")
    store = _store(s3_server, bucket)
    m = store.publish(
        "kv_state", "prefix-1", _files(tmp_path, b"k", big=3000), identity={"tokens": [1, 2]}, sign=signer(KEY)
    )
    key = m.location[len(f"s3://{bucket}/") :] + "/weights.bin"
    client = s3_server.client()
    data = bytearray(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    data[1234] ^= 0x01  # one byte
    client.put_object(Bucket=bucket, Key=key, Body=bytes(data))
    dest = tmp_path / "out" / "kv"
    with pytest.raises(ChecksumMismatch, match="weights.bin"):
        store.fetch("kv_state", "prefix-1", dest)
    assert list((tmp_path / "out").iterdir()) == []


def test_tampered_or_untrusted_manifest_is_refused(s3_server, tmp_path):
    bucket = s3_server.new_bucket("sig")
    store = _store(s3_server, bucket)
    m = store.publish("kv_state", "p", _files(tmp_path, b"s", big=100), identity={}, sign=signer(KEY))
    with pytest.raises(SignatureInvalid, match="not trusted"):
        store.fetch("kv_state", "p", tmp_path / "a", trust=lambda node: False)
    forged = Manifest(m.kind, m.name, m.files, {"n_ctx": 9}, m.location, m.created_at, m.node_id, m.signature)
    s3_server.client().put_object(Bucket=bucket, Key="kv_state/p/" + POINTER, Body=forged.to_cbor())
    with pytest.raises(SignatureInvalid):
        store.fetch("kv_state", "p", tmp_path / "b")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_missing_bucket_unreachable_endpoint_and_no_credentials_are_clear(s3_server, tmp_path, monkeypatch):
    files = _files(tmp_path, b"e", big=10)
    with pytest.raises(StoreUnavailable, match="does not exist"):
        _store(s3_server, "hydra-no-such-bucket").publish("kv_state", "x", files, identity={}, sign=signer(KEY))
    with pytest.raises(StoreUnavailable, match="does not exist"):
        _store(s3_server, "hydra-no-such-bucket").fetch("kv_state", "x", tmp_path / "d")
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    down = S3Store("b1", endpoint=closed, region="us-east-1", max_attempts=1, connect_timeout_s=2)
    with pytest.raises(StoreUnavailable, match="cannot reach the S3 endpoint"):
        down.publish("kv_state", "x", files, identity={}, sign=signer(KEY))
    with pytest.raises(StoreUnavailable, match="cannot reach the S3 endpoint"):
        down.manifest("kv_state", "x")
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    with pytest.raises(StoreUnavailable, match="no usable S3 credentials"):
        _store(s3_server, "b2").manifest("kv_state", "x")


def test_a_bad_artifact_is_refused_before_any_upload(s3_server, tmp_path):
    bucket = s3_server.new_bucket("val")
    store = _store(s3_server, bucket)
    src = _files(tmp_path, b"v", big=10)
    with pytest.raises(ManifestInvalid, match="lies under"):
        store.publish(
            "kv_state", "x", {"a": src["weights.bin"], "a/b": src["weights.bin"]}, identity={}, sign=signer(KEY)
        )
    with pytest.raises(ManifestInvalid, match="relative"):
        store.publish("kv_state", "x", {"../up": src["weights.bin"]}, identity={}, sign=signer(KEY))
    with pytest.raises(ManifestInvalid, match="kind"):
        store.publish("weights", "x", src, identity={}, sign=signer(KEY))
    with pytest.raises(ArtifactNotFound, match="not a file"):
        store.publish("kv_state", "x", {"a": tmp_path / "missing"}, identity={}, sign=signer(KEY))
    assert _keys(s3_server, bucket) == []
