"""Invites in a real mesh, in one process over loopback (real MeshServices, links and handshakes):
a ``uses``-limited token admits its quota and no more, a revocation list reaches the other members,
which then refuse the token, and forged or replayed lists are rejected and counted."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio
from nacl.signing import SigningKey

from waiting import wait_until

from hydra_node.mesh.announcer import AnnouncementContent
from hydra_node.mesh.joining import JoinFailed, JoinPlan
from hydra_node.mesh.link.endpoints import open_link
from hydra_node.mesh.link.peer_link import LinkSettings
from hydra_node.mesh.service import MeshService, MeshSettings
from hydra_node.mesh.wire.errors import RejectedByPeer
from hydra_node.mesh.wire.revocations import seal_revocations
from hydra_node.mesh.wire.token import parse_invite

JOIN_S = 20.0


def make_service(home: Path, name: str) -> MeshService:
    return MeshService(
        signing_key=SigningKey.generate(),
        state_dir=home / "mesh",
        settings=MeshSettings(listen_host="127.0.0.1", listen_port=0),
        announcement=lambda: AnnouncementContent(),
        name=name,
    )


def plan(token: str, timeout_s: float | None = None) -> JoinPlan:
    return JoinPlan.from_tokens([token], time.time(), admission_timeout_s=timeout_s)


async def present(service: MeshService, token: str) -> str:
    """Present ``token`` to ``service``'s listener as a stranger would: "admitted" or the reject code."""
    stranger = LinkSettings(identity=SigningKey.generate())
    codes = []
    try:
        async with open_link(f"ws://127.0.0.1:{service.port}", stranger, invite=parse_invite(token, time.time())):
            codes.append("admitted")
    except* RejectedByPeer as group:  # open_link's nursery wraps it
        codes += [exc.code for exc in group.exceptions]
    [code] = codes
    return code


async def test_a_single_use_token_admits_one_node_and_refuses_the_next(nursery, tmp_path, autojump_clock):
    a = await nursery.start(make_service(tmp_path / "a", "alpha").run, JoinPlan())
    token = a.invite(600, uses=1)
    b = await nursery.start(make_service(tmp_path / "b", "beta").run, plan(token))
    assert b.mesh_id == a.mesh_id
    c = await nursery.start(make_service(tmp_path / "c", "gamma").run)
    with trio.fail_after(JOIN_S):
        with pytest.raises(JoinFailed, match="token_used_up") as info:
            await c.join(plan(token, timeout_s=5.0))
    assert "1 of 1 uses" in str(info.value) and not c.joined
    [rec] = a.invites.records()
    assert (rec.used, rec.uses, rec.state(time.time())) == (1, 1, "used_up")
    assert a.invites.statistics().admissions_refused == {"token_used_up": 1}


async def test_revocations_reach_other_members_and_bad_lists_are_counted(nursery, tmp_path, autojump_clock):
    a = await nursery.start(make_service(tmp_path / "a", "alpha").run, JoinPlan())
    b = await nursery.start(make_service(tmp_path / "b", "beta").run, plan(a.invite(600)))
    with trio.fail_after(JOIN_S):
        await wait_until(lambda: a.node_id in b.members() and b.node_id in a.members())
    revoked, limited, fresh = a.invite(600), a.invite(600, uses=2), a.invite(600)
    with trio.fail_after(JOIN_S):
        assert await present(b, revoked) == "admitted"  # an unlimited token of a member is honoured anywhere
    a.invites.revoke(parse_invite(revoked, time.time()).token_id[:10])
    with trio.fail_after(JOIN_S):
        await wait_until(lambda: b.invites.statistics().lists_held == 1)
        assert await present(b, revoked) == "token_revoked"
        assert await present(a, revoked) == "token_revoked"
        assert await present(b, limited) == "token_issuer_only"
        assert await present(b, fresh) == "admitted"
    assert b.invites.statistics().admissions_refused == {"token_revoked": 1, "token_issuer_only": 1}
    # A member sending B a forged list, an old version of A's list (a replay), a non-member's list and
    # junk: each rejected and counted.
    v1 = a.invites.book.revocation_list(a.mesh_id, time.time())
    a.invites.revoke(a.invite(600))
    with trio.fail_after(JOIN_S):
        await wait_until(lambda: b.invites.statistics().lists_accepted == 2)
    link = a.link(b.node_id)
    forged = v1[:-1] + bytes([v1[-1] ^ 1])
    stranger = seal_revocations(SigningKey.generate(), a.mesh_id, 1, [])
    for body in (
        {"t": "revocations", "l": forged},
        {"t": "revocations", "l": v1},
        {"t": "revocations", "l": stranger},
        {"t": "revocations", "l": "text"},
    ):
        await link.send_message(body)
    with trio.fail_after(JOIN_S):
        await wait_until(lambda: sum(b.invites.statistics().lists_rejected.values()) == 4)
    assert b.invites.statistics().lists_rejected == {"forged": 1, "stale": 1, "not_member": 1, "malformed": 1}
    assert b.link(a.node_id) is not None  # the link stays up
