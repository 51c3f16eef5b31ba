"""Who sits in a ``mesh`` mixture: at most one member per hosting node (one node's many model ids
take one seat), and ``mesh`` itself is never a model — refused as a hosted id at start, ignored
(logged, counted) in a peer's announcement — so it always means the mixture of agents."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from hydra_node.mesh.membership import Announcement
from hydra_node.mesh.membership.announcement import ModelEntry
from hydra_node.models import RESERVED_MODEL_IDS, InvalidModelId, ModelNotFound, check_model_id, resolve_model
from hydra_node.moa.answers import MoaApi
from hydra_node.moa.config import MESH_MODEL, MoaSettings
from hydra_node.moa.mixture import MixtureOfAgents, one_per_node
from hydra_node.routing.remote import RemoteGeneration
from hydra_node.routing.router import RouteTarget, Router, UnknownModel

EVIL, HONEST, OTHER = "e" * 64, "a" * 64, "b" * 64


class Hosts:
    def __init__(self, *entries: tuple[str, str, str]) -> None:
        self.entries = entries

    def targets(self) -> list[RouteTarget]:
        return [RouteTarget(model=m, node_id=n, local=n == "self", open=None, state=s) for m, n, s in self.entries]


def moa(*entries: tuple[str, str, str], **settings) -> MixtureOfAgents:
    router = Router("self")
    router.add_source(Hosts(*entries))
    return MixtureOfAgents(router, MoaSettings(**settings), own_node="self")


def test_one_per_node_seats_each_node_once_and_moves_earlier_models_when_it_can() -> None:
    sybils = {f"0-sybil-{i}": [EVIL] for i in range(50)}
    assert one_per_node({**sybils, "a": [HONEST], "b": [OTHER]}, 4) == ["0-sybil-0", "a", "b"]
    # "x" could sit on HONEST or OTHER; "y" only on HONEST: "x" moves to OTHER so that both get in
    assert one_per_node({"x": [HONEST, OTHER], "y": [HONEST]}, 4) == ["x", "y"]
    assert one_per_node({"x": [HONEST], "y": [HONEST], "z": [OTHER]}, 4) == ["x", "z"]
    assert one_per_node({"a": [HONEST], "b": [OTHER], "c": [EVIL]}, 2) == ["a", "b"]
    assert one_per_node({}, 4) == []


def test_sybil_model_ids_from_one_node_take_one_member_seat() -> None:
    sybils = [(f"0-sybil-{i}", EVIL, "ready") for i in range(8)]
    m = moa(*sybils, ("a", HONEST, "ready"), ("b", "self", "ready"), ("c", OTHER, "loading"), max_members=4)
    assert m.members() == ["0-sybil-0", "a", "b"] and m.listed()
    # this node's own models are the operator's choice: each is a member (one node hosting two models)
    assert moa(("q4", "self", "ready"), ("f16", "self", "ready"), *sybils).members() == ["0-sybil-0", "f16", "q4"]
    alone = moa(*sybils)  # one node, however many ids: not a mixture
    assert alone.members() == ["0-sybil-0"] and not alone.listed()
    # the operator's own list is asked as written
    assert moa(*sybils, members=("0-sybil-1", "0-sybil-2")).members() == ["0-sybil-1", "0-sybil-2"]


@dataclass
class Members:
    """The mesh as remote generation sees it: real announcements, every member alive, no links."""

    announcements: dict[str, Announcement]

    def members(self) -> dict[str, Announcement]:
        return self.announcements

    def member_states(self, now: float) -> dict[str, str]:
        return {peer: "alive" for peer in self.announcements}

    def link(self, peer_id: str) -> None:
        return None

    async def link_to(self, peer_id: str):  # pragma: no cover - nothing is dialled here
        raise AssertionError


def _announce(node: str, *models: str, seq: int = 1) -> Announcement:
    return Announcement(node_id=node, seq=seq, models=tuple(ModelEntry(m, "ready") for m in models))


async def test_a_peer_announcing_mesh_gets_no_mesh_request_and_one_seat_for_its_sybils(autojump_clock) -> None:
    mesh = Members(
        {
            EVIL: _announce(EVIL, MESH_MODEL, *(f"0-sybil-{i}" for i in range(6))),
            HONEST: _announce(HONEST, "a"),
            OTHER: _announce(OTHER, "b"),
        }
    )
    remote = RemoteGeneration(mesh, node_id="self", local_open=lambda m: None)
    router = Router("self")
    router.add_source(remote)
    mixture = MixtureOfAgents(router, MoaSettings(max_members=4), own_node="self")
    api = MoaApi(mixture)
    assert MESH_MODEL not in [m.id for m in router.models()]
    with pytest.raises(UnknownModel):  # no target answers to "mesh": it is never routed to the peer
        router.candidates(MESH_MODEL)
    assert api.handles(MESH_MODEL) and mixture.listed()
    assert mixture.check() == ["0-sybil-0", "a", "b"]
    remote.targets()
    assert remote.statistics().counters()["reserved_models_ignored"] == 1  # once per announcement
    mesh.announcements[EVIL] = _announce(EVIL, MESH_MODEL, seq=2)
    remote.targets()
    assert remote.statistics().counters()["reserved_models_ignored"] == 2


def test_a_node_cannot_host_a_model_called_mesh(tmp_path: Path) -> None:
    assert MESH_MODEL in RESERVED_MODEL_IDS
    with pytest.raises(InvalidModelId, match="'mesh' is reserved"):
        check_model_id(MESH_MODEL)
    gguf = tmp_path / "mesh.gguf"
    gguf.write_bytes(b"GGUF" + bytes(16))
    for ref in (f"mesh={gguf}", str(gguf)):  # by explicit id, or by the file's name
        with pytest.raises(ModelNotFound, match="serve the model under another id") as err:
            resolve_model(ref)  # a ModelNotFound: `serve` ends with this one line at start
        assert "--model my-mesh=" in str(err.value)
    assert resolve_model(f"my-mesh={gguf}").id == "my-mesh"
