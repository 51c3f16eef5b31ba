"""The node's speculation service (runtime/speculative/mesh.py) over a fake mesh view: mode, draft peers."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import pytest

from hydra_node.admin.status_json import to_json
from hydra_node.config import SpeculativeSection
from hydra_node.models import BUNDLED_MODEL_ID
from hydra_node.runtime.speculative.service import SpeculationMode, SpeculationService

A, B, C, D = ("a" * 64, "b" * 64, "c" * 64, "d" * 64)


@dataclass(frozen=True)
class Ann:
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Link:
    peer_id: str
    rtt_ms: float | None

    def open_stream(self, header: dict):
        raise AssertionError("not used here")


class FakeMesh:
    listen_host = "127.0.0.1"

    def __init__(self, anns: dict, states: dict, rtts: dict):
        self.anns, self.states, self.rtts = anns, states, rtts

    def members(self):
        return self.anns

    def member_states(self, now: float):
        return self.states

    def link(self, peer_id: str):
        return Link(peer_id, self.rtts[peer_id]) if peer_id in self.rtts else None

    async def link_to(self, peer_id: str):
        raise AssertionError("not used here")


def service(tmp_path, mesh=None, **kw) -> SpeculationService:
    svc = SpeculationService(SpeculativeSection(**kw), log_dir=tmp_path, threads=1, mesh=mesh)
    if svc._listen_sock is not None:  # bound at construction; nothing runs the accept loop here
        svc._listen_sock.close()
    return svc


@pytest.mark.parametrize(
    "strategy,draft,has_mesh,mode",
    [
        ("off", "", True, SpeculationMode.OFF),
        ("mesh", "", False, SpeculationMode.OFF),  # no mesh to find a draft in
        ("mesh", "", True, SpeculationMode.MESH),
        ("auto", "", True, SpeculationMode.MESH),
        ("auto", "", False, SpeculationMode.OFF),
        ("auto", "/no/such/draft.gguf", True, SpeculationMode.MESH),  # an unresolvable local draft: the mesh's
        ("auto", BUNDLED_MODEL_ID, False, SpeculationMode.LOCAL),
        ("local", BUNDLED_MODEL_ID, True, SpeculationMode.LOCAL),
    ],
)
async def test_the_strategy_becomes_a_mode(tmp_path, strategy, draft, has_mesh, mode):
    svc = service(tmp_path, FakeMesh({}, {}, {}) if has_mesh else None, strategy=strategy, draft_model=draft)
    assert svc.mode is mode
    argv = svc.runner_argv()
    assert (mode is SpeculationMode.OFF) == (argv == ())
    if mode is SpeculationMode.MESH:
        assert argv[:2] == ("--draft-endpoint", svc.endpoint) and svc.endpoint.startswith("127.0.0.1:")
    if mode is SpeculationMode.LOCAL:
        assert argv[0] == "--draft-model"


async def test_draft_peers_are_alive_announcers_of_the_wanted_draft_lowest_rtt_first(tmp_path):
    anns = {
        A: Ann({"draft": "small"}),
        B: Ann({"draft": "small"}),
        C: Ann({"draft": "other"}),
        D: Ann({"draft": "small"}),
        "e" * 64: Ann(),
    }
    states = {A: "alive", B: "alive", C: "alive", D: "suspect", "e" * 64: "alive"}
    mesh = FakeMesh(anns, states, {A: 9.0, B: 2.0, C: 1.0})
    svc = service(tmp_path, mesh, strategy="mesh", draft_model="small")
    assert svc.draft_peers() == [(B, "small"), (A, "small")]
    anyone = service(tmp_path, mesh, strategy="mesh")
    assert anyone.draft_peers() == [(C, "other"), (B, "small"), (A, "small")]
    st = to_json(svc.status())
    assert st["mode"] == "mesh" and st["wanted_draft"] == "small" and st["serving_draft"] is None
    assert st["draft_peers"] == [{"peer": B[:16], "draft": "small"}, {"peer": A[:16], "draft": "small"}]
    assert list(st) == [f.name for f in dataclasses.fields(type(svc.status()))]
    assert svc.announce_extra() == {}  # serves no draft itself
