"""The VAST trigger's pure part: settings, payload, idempotency key, retry rules."""

from __future__ import annotations

import json

import nacl.signing
import pytest

from hydra_node.backoff import Backoff
from hydra_node.config import PlacementSection
from hydra_node.runtime.artifacts.errors import SignatureInvalid
from hydra_node.runtime.artifacts.manifest import ArtifactFile, Manifest
from hydra_node.runtime.artifacts.vast_payload import (
    EVENT_TYPE,
    MAX_RETRY_AFTER_S,
    VastSettings,
    build_payload,
    encode_payload,
    idempotency_key,
    retry_delay,
    verdict,
)

KEY = nacl.signing.SigningKey(bytes(range(32)))
SETTINGS = VastSettings(
    "https://vast.example/trigger",
    tenant="t1",
    dataspace="ds",
    source_namespace="/hydra",
    destination_namespace="/replica",
    target_site="site-b",
)


def _manifest(**identity) -> Manifest:
    files = (ArtifactFile("a.bin", 10, "0" * 64), ArtifactFile("d/b.bin", 5, "1" * 64))
    return Manifest(
        "kv_state",
        "prefix-7",
        files,
        identity or {"n_ctx": 4096, "tokens": b"\x01\x02"},
        "s3://bucket/p/kv_state/prefix-7/v/00000000000000000001-0a0b0c0d",
        1_700_000_000,
    ).sign(KEY)


def test_payload_carries_the_committed_manifest_and_the_target():
    m = _manifest()
    p = build_payload(m, op_id="op-00112233-aabbccdd", settings=SETTINGS)
    assert p["type"] == EVENT_TYPE and p["version"] == 1 and p["op_id"] == "op-00112233-aabbccdd"
    assert (p["kind"], p["name"], p["byte_size"], p["file_count"]) == ("kv_state", "prefix-7", 15, 2)
    assert p["checksum"] == {"algorithm": "sha256", "manifest_id": m.manifest_id}
    assert p["identity"] == {"n_ctx": 4096, "tokens": {"bytes": "0102"}}
    assert p["location"] == m.location and p["node_id"] == m.node_id and p["created_at"] == m.created_at
    assert p["target"] == {
        "tenant": "t1",
        "dataspace": "ds",
        "source_namespace": "/hydra",
        "destination_namespace": "/replica",
        "target_site": "site-b",
    }
    assert p["idempotency_key"] == idempotency_key("op-00112233-aabbccdd", m.manifest_id)
    # The receiver can rebuild and verify the signed manifest from the body alone.
    body = json.loads(encode_payload(p))
    again = Manifest.from_json(json.dumps(body["manifest"]))
    again.verify()
    assert again == m
    assert encode_payload(p) == encode_payload(json.loads(encode_payload(p)))  # the same bytes every try


def test_idempotency_key_is_per_operation_and_manifest():
    a, b = _manifest(), _manifest(n_ctx=8192)
    k = idempotency_key("op-1", a.manifest_id)
    assert k == idempotency_key("op-1", a.manifest_id) and len(k) == 64
    assert k != idempotency_key("op-2", a.manifest_id)
    assert k != idempotency_key("op-1", b.manifest_id)
    with pytest.raises(ValueError):
        idempotency_key("", a.manifest_id)


def test_an_unsigned_manifest_is_never_triggered():
    unsigned = Manifest("kv_state", "x", (ArtifactFile("a", 1, "0" * 64),), {}, "posix:/r", 1)
    with pytest.raises(SignatureInvalid):
        build_payload(unsigned, op_id="op-1", settings=SETTINGS)


@pytest.mark.parametrize(
    ("status", "want"),
    [
        (None, "retry"),
        (200, "delivered"),
        (202, "delivered"),
        (204, "delivered"),
        (408, "retry"),
        (429, "retry"),
        (500, "retry"),
        (503, "retry"),
        (302, "refused"),
        (400, "refused"),
        (401, "refused"),
        (404, "refused"),
        (409, "refused"),
        (422, "refused"),
    ],
)
def test_verdict(status, want):
    assert verdict(status) == want


def test_retry_delay_is_jittered_backoff_at_least_retry_after():
    policy = Backoff(initial_s=1.0, factor=2.0, max_s=8.0, jitter=0.25)
    assert retry_delay(policy, 0, 0.0, None) == 0.75 and retry_delay(policy, 0, 0.999, None) < 1.25
    assert retry_delay(policy, 10, 0.5, None) == 8.0
    assert retry_delay(policy, 0, 0.5, 5.0) == 5.0
    assert retry_delay(policy, 0, 0.5, 1e9) == MAX_RETRY_AFTER_S


def test_settings_are_validated_and_round_trip():
    assert VastSettings.from_mapping(SETTINGS.to_mapping()) == SETTINGS
    for bad in (
        {"endpoint": "ftp://x"},
        {"endpoint": "http://"},
        {"endpoint": "http://a b"},
        {"endpoint": "http://x", "max_attempts": 0},
        {"endpoint": "http://x", "request_timeout_s": 0},
        {"endpoint": "http://x", "backoff_initial_s": 5, "backoff_max_s": 1},
    ):
        with pytest.raises(ValueError):
            VastSettings.from_mapping(bad)
    with pytest.raises(ValueError, match="unknown"):
        VastSettings.from_mapping({"endpoint": "http://x", "secret": "y"})
    assert VastSettings.from_placement(PlacementSection()) is None
    section = PlacementSection(
        vast_trigger_endpoint="http://v/t",
        vast_tenant="t",
        vast_dataspace="d",
        vast_source_namespace="s",
        vast_destination_namespace="n",
        vast_target_site="x",
    )
    assert VastSettings.from_placement(section).target() == {
        "tenant": "t",
        "dataspace": "d",
        "source_namespace": "s",
        "destination_namespace": "n",
        "target_site": "x",
    }
