"""Remote generation over real mesh links in one process: targets from announcements, events and
errors across a generate stream, a peer's failure never relayed as success."""

from __future__ import annotations

import time
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from waiting import wait_until

from inproc_mesh import mesh_member
from hydra_node.inference import Finished, GenerationError, GenerationRequest, ModelUnavailable, TextDelta
from hydra_node.mesh.joining import JoinPlan
from hydra_node.mesh.service import MeshService
from hydra_node.routing.remote import RemoteGeneration

JOIN_S = 20.0
REQ = GenerationRequest(model="m1", kind="completion", prompt="hi", max_tokens=4)


@asynccontextmanager
async def fake_model(req: GenerationRequest):
    async def events():
        yield TextDelta("he")
        yield TextDelta("llo")
        yield Finished("stop", 1, 2, served_by="host")

    yield events()


@asynccontextmanager
async def failing_model(req: GenerationRequest):
    raise GenerationError("out of memory", code="oom", status=200)  # a bogus success status
    yield  # pragma: no cover


def node(home: Path, name: str, models: tuple[str, ...], local_open) -> tuple[MeshService, RemoteGeneration]:
    mesh = mesh_member(home, name, models)
    remote = RemoteGeneration(mesh, node_id=mesh.node_id, local_open=local_open)
    mesh.handle_stream("generate", remote.serve)  # as the root does
    return mesh, remote


async def collect(remote: RemoteGeneration, peer_id: str, req: GenerationRequest) -> list:
    async with remote.open_remote(peer_id, req) as events:
        return [ev async for ev in events]


async def test_members_models_become_targets_and_generate_across_the_link(nursery, tmp_path, autojump_clock):
    host, host_remote = node(
        tmp_path / "h", "host", ("m1", "bad"), lambda m: {"m1": fake_model, "bad": failing_model}.get(m)
    )
    user, user_remote = node(tmp_path / "u", "user", (), lambda m: None)
    await nursery.start(host.run, JoinPlan())
    await nursery.start(user.run, JoinPlan.from_tokens([host.invite(600)], time.time()))
    with trio.fail_after(JOIN_S):
        targets = await wait_until(lambda: user_remote.targets())
        await wait_until(lambda: user.node_id in host.members())  # the host serves members only
    assert {(t.model, t.node_id, t.local, t.state) for t in targets} == {
        ("m1", host.node_id, False, "ready"),
        ("bad", host.node_id, False, "ready"),
    }
    with trio.fail_after(JOIN_S):
        events = await collect(user_remote, host.node_id, REQ)
        assert [e.text for e in events[:2]] == ["he", "llo"] and isinstance(events[2], Finished)
        with pytest.raises(GenerationError) as info:  # the host's error, as a remote error: never a 2xx
            await collect(user_remote, host.node_id, GenerationRequest(model="bad", kind="completion", prompt="x"))
        assert info.value.status == 502 and "out of memory" in info.value.message
        with pytest.raises(GenerationError) as info:  # a model the host does not have
            await collect(user_remote, host.node_id, GenerationRequest(model="zz", kind="completion", prompt="x"))
        assert info.value.status == 503
    assert host_remote.statistics().served == 2 and user_remote.statistics().opened == 3
    assert user_remote.statistics().errors == 2


async def test_an_unreachable_peer_is_model_unavailable(nursery, tmp_path, autojump_clock):
    user, user_remote = node(tmp_path / "u", "user", (), lambda m: None)
    await nursery.start(user.run, JoinPlan())
    with trio.fail_after(JOIN_S):
        with pytest.raises(ModelUnavailable):
            await collect(user_remote, "ab" * 32, REQ)
