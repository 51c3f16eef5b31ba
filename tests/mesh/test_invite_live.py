"""Invites end to end with real ``hydra-node`` processes and the ``invite`` CLI: a ``--uses 1`` token
admits one node and refuses the next with a clear error; a revoked token is refused by a member that
did not issue it once the signed list reached it; the issuer's records survive its restart."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import trio
from nacl.signing import SigningKey

from harness import NodeProcess
from hydra_node.mesh.link.endpoints import open_link
from hydra_node.mesh.link.peer_link import LinkSettings
from hydra_node.mesh.wire.errors import RejectedByPeer
from hydra_node.mesh.wire.token import parse_invite


def invite_cli(node: NodeProcess, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hydra_node.cli", "invite", *args, "--home", str(node.home)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def present(mesh_port: int, token: str) -> str:
    """Present ``token`` to the node listening on ``mesh_port`` as a stranger: "admitted" or the reject code."""

    async def attempt() -> str:
        codes = []
        with trio.fail_after(20):
            try:
                async with open_link(
                    f"ws://127.0.0.1:{mesh_port}",
                    LinkSettings(identity=SigningKey.generate()),
                    invite=parse_invite(token, time.time()),
                ):
                    codes.append("admitted")
            except* RejectedByPeer as group:
                codes += [exc.code for exc in group.exceptions]
        [code] = codes
        return code

    return trio.run(attempt)


def test_invite_cli_help_names_uses_list_and_revoke():
    out = subprocess.run(
        [sys.executable, "-m", "hydra_node.cli", "invite", "--help"], capture_output=True, text=True, timeout=60
    ).stdout
    assert "--uses N" in out and "list" in out and "revoke" in out and "TOKEN_OR_ID" in out


def test_single_use_and_revoked_invites_across_members_and_a_restart(tmp_path):
    a = NodeProcess(tmp_path / "a", "--no-model", "--name", "a").start()
    nodes = [a]
    try:
        made = invite_cli(a, "--uses", "1", "--ttl", "1h", "--json")
        assert made.returncode == 0, made.stderr
        once = json.loads(made.stdout)
        assert once["uses"] == 1 and len(once["id"]) == 32
        b = NodeProcess(tmp_path / "b", "--no-model", "--name", "b", "--join", once["token"])
        nodes.append(b.start())
        c = NodeProcess(tmp_path / "c", "--no-model", "--name", "c", "--join", once["token"])
        nodes.append(c.start(wait=False))
        assert c.proc.wait(60) != 0
        assert "token_used_up" in c.log() and "1 of 1 uses" in c.log()

        token = a.invite()  # unlimited: any member honours it until it is revoked
        token_id = parse_invite(token, time.time()).token_id
        b_port = b.status()["mesh"]["port"]
        assert present(b_port, token) == "admitted"
        revoked = invite_cli(a, "revoke", token_id[:12])
        assert revoked.returncode == 0 and token_id in revoked.stdout, revoked.stderr
        b.wait_status(lambda st: st["invites"]["lists_held"] == 1, timeout=30, what="B holds A's revocation list")
        assert present(b_port, token) == "token_revoked"
        assert b.status()["invites"]["admissions_refused"] == {"token_revoked": 1}
        bad = invite_cli(a, "revoke", "00000000deadbeef")
        assert bad.returncode == 1 and "matches no unexpired invite" in bad.stderr

        a.stop()
        a.start()  # same home: the records (used count, revocation) are still there
        listed = json.loads(invite_cli(a, "list", "--json").stdout)["invites"]
        states = {inv["id"]: (inv["state"], inv["used"]) for inv in listed}
        assert states[once["id"]] == ("used_up", 1) and states[token_id][0] == "revoked"
        a_port = a.status()["mesh"]["port"]
        assert present(a_port, once["token"]) == "token_used_up"
        assert present(a_port, token) == "token_revoked"
        issued = a.status()["invites"]["issued"]  # (besides the standing invite discovery publishes)
        assert issued["used_up"] == 1 and issued["revoked"] == 1
    finally:
        for n in nodes:
            n.kill_all()
