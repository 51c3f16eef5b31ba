"""MeshService in one process over loopback: joining by plan, failed joins, declared stream handlers.

Every node and link lives in this trio run and loopback delivers within the send call, so the
tests run on the autojump clock: joins, back-off and shutdown bounds pass in virtual time, and
every wait is bounded by ``fail_after``.
"""

from __future__ import annotations

import stat
import time
from pathlib import Path

import pytest
import trio
from nacl.signing import SigningKey

from waiting import wait_until

from hydra_node.mesh.announcer import ANNOUNCE_CHECK_S, AnnouncementContent
from hydra_node.mesh.wire.errors import MeshError, StreamReset
from hydra_node.mesh.wire.ids import MeshSecret
from hydra_node.mesh.joining import DialCandidate, JoinFailed, JoinPlan
from hydra_node.mesh.keyfile import load_mesh_key, mesh_key_path, save_mesh_key
from hydra_node.mesh.membership import ModelEntry
from hydra_node.mesh.service import MeshService, MeshSettings
from hydra_node.mesh.wire.token import issue_invite

JOIN_S = 20.0  # bound on getting into a mesh and seeing each other (loaded 2-core machine)


def make_service(home: Path, name: str, content: AnnouncementContent | None = None, **settings) -> MeshService:
    return MeshService(
        signing_key=SigningKey.generate(),
        state_dir=home / "mesh",
        settings=MeshSettings(listen_host="127.0.0.1", listen_port=0, **settings),
        announcement=lambda: content or AnnouncementContent(),
        name=name,
    )


def plan_from(inviter: MeshService) -> JoinPlan:
    return JoinPlan.from_tokens([inviter.invite(600)], time.time())


async def test_second_node_joins_by_invite_and_both_see_each_other(nursery, tmp_path, autojump_clock):
    content = AnnouncementContent(models=(ModelEntry("m1", "ready"),), queue_depth=2, extra={"x": 1})
    a = await nursery.start(make_service(tmp_path / "a", "alpha", content).run, JoinPlan())
    assert a.joined and a.port and a.mesh_id
    b = await nursery.start(make_service(tmp_path / "b", "beta").run, plan_from(a))
    assert b.mesh_id == a.mesh_id
    key = mesh_key_path(tmp_path / "b")
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and load_mesh_key(key).mesh_id == a.mesh_id
    with trio.fail_after(JOIN_S):
        await wait_until(lambda: a.node_id in b.members() and b.node_id in a.members())
    ann = b.members()[a.node_id]
    assert ann.models == (ModelEntry("m1", "ready"),) and ann.queue_depth == 2
    assert ann.extra["x"] == 1 and ann.extra["name"] == "alpha"  # (and the signature)
    assert b.member_states(trio.current_time())[a.node_id] == "alive"
    assert b.link(a.node_id) is not None and b.link(a.node_id) in b.open_links()
    assert [p.id for p in b.peers()] == [a.node_id]
    assert b.status().mesh_id == a.mesh_id and b.gossip_statistics() is not None
    with trio.fail_after(JOIN_S):  # B remembers A for a restart without --join
        await wait_until(lambda: (tmp_path / "b" / "mesh" / "peers.json").exists())


async def test_a_failed_join_leaves_the_service_out_and_the_next_plan_works(nursery, tmp_path, autojump_clock):
    a = await nursery.start(make_service(tmp_path / "a", "alpha").run, JoinPlan())
    c = await nursery.start(make_service(tmp_path / "c", "gamma").run)  # no plan: discovery joins later
    assert not c.joined and c.mesh_id is None and c.token() is None and c.peers() == []
    dead = issue_invite(SigningKey.generate(), a.mesh_id, ["127.0.0.1:1"], 600, time.time())
    with trio.fail_after(JOIN_S):
        with pytest.raises(JoinFailed):
            await c.join(JoinPlan.from_tokens([dead], time.time(), admission_timeout_s=0.3))
    assert not c.joined and c.port is None and not mesh_key_path(tmp_path / "c").exists()
    with pytest.raises(MeshError):
        c.invite(60)
    with trio.fail_after(JOIN_S):
        seeds = await c.join(plan_from(a))
    assert c.mesh_id == a.mesh_id and seeds == (a.node_id,)
    assert c.token() and c.port


async def test_plans_once_in_a_mesh(nursery, tmp_path, autojump_clock):
    a = await nursery.start(make_service(tmp_path / "a", "alpha").run, JoinPlan())
    b = await nursery.start(make_service(tmp_path / "b", "beta").run, plan_from(a))
    other = await nursery.start(make_service(tmp_path / "o", "other").run, JoinPlan())
    with pytest.raises(JoinFailed, match="already in mesh"):
        await b.join(plan_from(other))
    assert b.mesh_id == a.mesh_id
    # A member candidate of our own mesh is just a dial; an unreachable one seeds nothing.
    with trio.fail_after(JOIN_S):
        assert await b.join(JoinPlan(members=(DialCandidate((f"ws://127.0.0.1:{a.port}",), a.node_id),))) == (
            a.node_id,
        )
        assert await b.join(JoinPlan(members=(DialCandidate(("ws://127.0.0.1:1",)),))) == ()


async def test_held_key_is_resumed_and_an_empty_plan_creates_a_mesh_once(nursery, tmp_path, autojump_clock):
    held = MeshSecret.generate()
    save_mesh_key(mesh_key_path(tmp_path / "a"), held)
    a = await nursery.start(make_service(tmp_path / "a", "alpha").run, JoinPlan())
    assert a.mesh_id == held.mesh_id
    fresh = await nursery.start(make_service(tmp_path / "f", "fresh").run, JoinPlan())
    assert fresh.mesh_id != held.mesh_id and load_mesh_key(mesh_key_path(tmp_path / "f")).mesh_id == fresh.mesh_id


async def test_streams_go_to_the_handlers_the_root_declared(nursery, tmp_path, autojump_clock):
    a_service = make_service(tmp_path / "a", "alpha")

    async def echo(link, header, stream) -> None:
        await stream.send(b"echo:" + await stream.receive_all(1024))
        await stream.send_eof()

    async def tunnel(link, header, stream) -> None:
        await stream.send(f"tunnel:{header['service']}".encode())
        await stream.send_eof()

    a_service.handle_stream("echo", echo)
    a_service.handle_tunnel("draft", tunnel)
    with pytest.raises(ValueError):
        a_service.handle_stream("tunnel", tunnel)
    a = await nursery.start(a_service.run, JoinPlan())
    b = await nursery.start(make_service(tmp_path / "b", "beta").run, plan_from(a))
    with trio.fail_after(JOIN_S):
        await wait_until(lambda: b.node_id in a.members())  # quarantine ends with B's announcement
        link = await b.link_to(a.node_id)
        async with link.open_stream({"kind": "echo"}) as stream:
            await stream.send(b"hi")
            await stream.send_eof()
            assert await stream.receive_all(1024) == b"echo:hi"
        async with link.open_stream({"kind": "tunnel", "service": "draft"}) as stream:
            await stream.send_eof()
            assert await stream.receive_all(1024) == b"tunnel:draft"
        for header in ({"kind": "nope"}, {"kind": "tunnel", "service": "rpc"}):
            async with link.open_stream(header) as stream:
                with pytest.raises(StreamReset) as info:
                    await stream.receive()
                assert info.value.code == "refused"
    assert a.status().counters["bad_stream_headers"] == 2


async def test_join_needs_a_running_service(tmp_path, autojump_clock):
    with pytest.raises(MeshError):
        await make_service(tmp_path, "idle").join(JoinPlan())


async def test_after_leaving_announcement_changes_are_not_published(nursery, tmp_path, autojump_clock):
    content = {"now": AnnouncementContent(queue_depth=0)}
    service = MeshService(
        signing_key=SigningKey.generate(),
        state_dir=tmp_path / "mesh",
        settings=MeshSettings(listen_host="127.0.0.1", listen_port=0),
        announcement=lambda: content["now"],
        name="leaver",
    )
    await nursery.start(service.run, JoinPlan())
    await service.leave()
    content["now"] = AnnouncementContent(queue_depth=5)  # e.g. the telemetry summary moving at shutdown
    await trio.sleep(10 * ANNOUNCE_CHECK_S)  # virtual time: the announce loop ran many times
    assert service.joined and service.gossip_statistics().membership.left


async def test_content_the_announcement_cannot_hold_is_counted_and_the_node_carries_on(
    nursery, tmp_path, autojump_clock
):
    """The announce loop never ends the node over the root's data: it keeps the last good announcement."""
    good = AnnouncementContent(models=(ModelEntry("m1", "ready"),))
    too_many = AnnouncementContent(models=tuple(ModelEntry(f"m{i}", "ready") for i in range(65)))
    content = {"now": good}
    a = await nursery.start(
        MeshService(
            signing_key=SigningKey.generate(),
            state_dir=tmp_path / "a" / "mesh",
            settings=MeshSettings(listen_host="127.0.0.1", listen_port=0),
            announcement=lambda: content["now"],
            name="alpha",
        ).run,
        JoinPlan(),
    )
    b = await nursery.start(make_service(tmp_path / "b", "beta").run, plan_from(a))
    with trio.fail_after(JOIN_S):
        await wait_until(lambda: a.node_id in b.members())
    content["now"] = too_many  # 65 model entries: the announcement refuses them
    await trio.sleep(10 * ANNOUNCE_CHECK_S)
    assert a.status().counters["announce_errors"] >= 10
    content["now"] = AnnouncementContent(models=(ModelEntry("m2", "ready"),))  # good again: published
    with trio.fail_after(JOIN_S):
        await wait_until(lambda: b.members()[a.node_id].models == (ModelEntry("m2", "ready"),))
