"""A kv_state artifact is materialised only when a trusted node signed it and its state would load
as one sequence of 0..n-1: over a real POSIX namespace, a stranger-signed state and one whose
cells carry negative positions are refused, never kept in the cache, never announced to peers."""

from __future__ import annotations

from pathlib import Path

import nacl.signing
import pytest

from hydra_node.config import PlacementSection
from hydra_node.mesh.wire.ids import node_id_from_public_key
from hydra_node.runtime.artifacts.errors import SignatureInvalid
from hydra_node.runtime.artifacts.kv_state import KV_STATE_FILE, KvStateInvalid, write_kv_state
from hydra_node.runtime.artifacts.manifest import signer
from hydra_node.runtime.artifacts.peer import fetch_from_peer
from hydra_node.runtime.artifacts.service import PlacementService
from tests.runtime.artifacts.test_kv_cells import section, seq, state
from tests.runtime.artifacts.test_kv_identity import BASE

TOKENS = (1, 2, 3, 4)


def node(home: Path, root: Path, key: nacl.signing.SigningKey) -> PlacementService:
    return PlacementService(
        PlacementSection(posix_root=str(root)),
        home=home,
        node_id=node_id_from_public_key(bytes(key.verify_key)),
        sign=signer(key),
        peer_fetch=fetch_from_peer,  # it shares its cache: announce_extra lists what it holds
    )


def kv_source(tmp_path: Path, name: str, cells) -> Path:
    folder = tmp_path / "src" / name
    folder.mkdir(parents=True)
    write_kv_state(folder / KV_STATE_FILE, BASE.with_prefix(TOKENS), TOKENS, state(section(cells)))
    return folder


async def publish(svc: PlacementService, name: str, folder: Path) -> None:
    op = await svc.wait((await svc.submit_publish("kv_state", name, str(folder))).id)
    assert op.state == "committed", op


async def test_a_stranger_signed_or_badly_celled_kv_state_is_never_cached_nor_announced(tmp_path, nursery):
    root = tmp_path / "ns"
    root.mkdir()
    me = node(tmp_path / "me", root, nacl.signing.SigningKey(bytes([1]) * 32))
    stranger = node(tmp_path / "stranger", root, nacl.signing.SigningKey(bytes([2]) * 32))
    await nursery.start(me.run)
    await nursery.start(stranger.run)
    await publish(me, "good", kv_source(tmp_path, "good", seq(range(4))))
    await publish(me, "negative", kv_source(tmp_path, "negative", [(-1000, [0])] + seq(range(1, 4))))
    await publish(stranger, "planted", kv_source(tmp_path, "planted", seq(range(4))))

    with pytest.raises(SignatureInvalid, match="not trusted"):  # a namespace writer is not a member
        await me.materialise("kv_state", "planted")
    with pytest.raises(KvStateInvalid, match="position -1000"):
        await me.materialise("kv_state", "negative")
    assert me.counters["refused_corrupt"] == 1
    _, folder = await me.materialise("kv_state", "good")
    assert (folder / KV_STATE_FILE).is_file()
    assert [x["name"] for x in me.cache_listing()["artifacts"]] == ["good"]
    assert sorted(p.name for p in (tmp_path / "me/placement/cache/kv_state").iterdir()) == ["good"]
    assert [tuple(x[:2]) for x in me.announce_extra()["artifacts_held"]] == [("kv_state", "good")]
    await stranger.materialise("kv_state", "planted")  # its own: trusted there
