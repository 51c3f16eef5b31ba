"""Discovery wired into real nodes: Nostr publish / --auto join through a local relay, mDNS on loopback.

Node A hosts the bundled model, publishes its mesh on a LocalRelay (a helper process) and
announces itself with mDNS on a random test port.  Nodes that join run --no-model.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import NodeProcess, request
from hydra_node.models import BUNDLED_MODEL_ID

HERE = Path(__file__).resolve().parent
RELAY_START_S = 15.0
CLI_TIMEOUT_S = 30.0
VIEW_TIMEOUT_S = 20.0


@pytest.fixture(scope="module")
def relay_url():
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "local_relay_process.py")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        line = _readline(proc, RELAY_START_S)
        assert line.startswith("ws://127.0.0.1:"), line
        yield line.strip()
    finally:
        proc.stdin.close()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _readline(proc: subprocess.Popen, timeout: float) -> str:
    import selectors

    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    if not sel.select(timeout):
        raise TimeoutError("the local relay did not start")
    return proc.stdout.readline()


@pytest.fixture(scope="module")
def mdns_args():
    return [
        "--mdns-group",
        "224.0.0.251",
        "--mdns-port",
        str(random.randrange(20000, 60000)),
        "--mdns-interface",
        "127.0.0.1",
    ]


@pytest.fixture(scope="module")
def node_a(tmp_path_factory, relay_url, mdns_args):
    a = NodeProcess(
        tmp_path_factory.mktemp("disc") / "a",
        "--name",
        "alpha",
        "--publish",
        "--mdns",
        "--nostr-relay",
        relay_url,
        *mdns_args,
    )
    try:
        a.start()
        a.wait_status(
            lambda s: (s["discovery"]["nostr"] or {}).get("relays", [{}])[0].get("ok_accepted", 0) >= 1,
            timeout=VIEW_TIMEOUT_S,
            what="listing accepted by the relay",
        )
        yield a
    finally:
        a.kill_all()


def discover(relay_url: str, *extra: str) -> dict:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "hydra_node.cli",
            "discover",
            "--json",
            "--nostr-relay",
            relay_url,
            "--wait",
            "5",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def mesh_id(st: dict) -> str:
    return st["mesh"]["mesh_id"]


def lan_ids(st: dict) -> set[str]:
    return {a["node_id"] for a in (st["discovery"]["mdns"] or {}).get("lan", [])}


def alive(st: dict) -> set[str]:
    return {p["id"] for p in st["peers"] if p["state"] == "alive"}


def publish_decoy(relay_url: str, addr: str) -> str:
    """A listing that ranks above A's (more nodes) whose token is for another mesh, at A's address:
    reachable, so it is tried first, and refused, so --auto must fall back to the next listing."""
    import nacl.signing
    import trio
    from nostr_sdk import Keys

    from hydra_node.discovery.nostr.events import ListingContent, build_listing_event
    from hydra_node.discovery.nostr.relay import publish_once
    from hydra_node.mesh.wire.ids import MeshSecret
    from hydra_node.mesh.wire.token import issue_invite

    mesh = MeshSecret.generate()
    now = time.time()
    token = issue_invite(nacl.signing.SigningKey.generate(), mesh.mesh_id, [addr], 3600, now)
    event = build_listing_event(
        Keys.generate(), ListingContent(mesh_id=mesh.mesh_id, invite_token=token, node_count=10), now=int(now)
    )

    async def send() -> tuple[bool, str]:
        with trio.fail_after(CLI_TIMEOUT_S):
            return await publish_once(relay_url, event)

    assert trio.run(send)[0]
    return mesh.mesh_id


def test_auto_joins_the_published_mesh_then_rejoins_over_mdns(node_a, relay_url, mdns_args, tmp_path):
    a_st = node_a.status()
    decoy = publish_decoy(relay_url, a_st["mesh"]["addresses"][0])
    b = NodeProcess(
        tmp_path / "b",
        "--no-model",
        "--name",
        "beta",
        "--auto",
        "--mesh-discovery-mode",
        "nostr",
        "--nostr-relay",
        relay_url,
    )
    try:
        b.start()
        st = b.wait_status(
            lambda s: BUNDLED_MODEL_ID in s["available_models"],
            timeout=VIEW_TIMEOUT_S,
            what="A's model visible through B",
        )
        auto = st["discovery"]["auto_result"]
        assert auto["outcome"] == "joined" and auto["chosen"]["source"] == "nostr"
        assert [c["mesh_id"] for c in auto["candidates"]][:2] == [decoy, mesh_id(a_st)]
        assert [x["mesh_id"] for x in auto["attempts"]] == [decoy]  # refused: fell back to A's listing
        assert mesh_id(st) == mesh_id(a_st) and a_st["node_id"] in alive(st)
        code, body = request(
            "POST",
            b.api_port,
            "/v1/completions",
            {"model": BUNDLED_MODEL_ID, "prompt": "1, 2, 3,", "max_tokens": 4, "temperature": 0},
        )
        assert code == 200, body
        assert json.loads(body)["choices"][0]["text"]
        b_id = st["node_id"]
        assert b.stop() == 0
        # B restarts with LAN discovery only: it is a member now (mesh key in its home), sees A's
        # advert with a fingerprint it can check, and dials A as a member.
        b = NodeProcess(
            tmp_path / "b", "--no-model", "--name", "beta", "--auto", "--mesh-discovery-mode", "mdns", *mdns_args
        )
        b.start()
        st = b.wait_status(lambda s: a_st["node_id"] in alive(s), timeout=VIEW_TIMEOUT_S, what="B linked to A")
        auto = st["discovery"]["auto_result"]
        assert auto["outcome"] == "joined" and auto["chosen"]["source"] == "lan" and auto["chosen"]["via"] == "member"
        assert mesh_id(st) == mesh_id(a_st)
        # both see each other's adverts
        b.wait_status(lambda s: a_st["node_id"] in lan_ids(s), timeout=VIEW_TIMEOUT_S, what="A's advert at B")
        node_a.wait_status(lambda s: b_id in lan_ids(s), timeout=VIEW_TIMEOUT_S, what="B's advert at A")
    finally:
        b.kill_all()


def test_lan_mesh_without_a_credential_is_not_joined(node_a, mdns_args, tmp_path):
    a_id = node_a.status()["node_id"]
    c = NodeProcess(tmp_path / "c", "--no-model", "--auto", "--mesh-discovery-mode", "mdns", *mdns_args)
    try:
        c.start()
        st = c.wait_status(lambda s: a_id in lan_ids(s), timeout=VIEW_TIMEOUT_S, what="A's advert at C")
        auto = st["discovery"]["auto_result"]
        assert auto["outcome"] == "created" and auto["candidates"] == []
        assert "no_credential" in {x["reason"] for x in auto["skipped"]}
        assert mesh_id(st) != mesh_id(node_a.status())
        assert a_id not in alive(st)
        assert st["node_id"] not in {p["id"] for p in node_a.status()["peers"]}
    finally:
        c.kill_all()


def test_discover_lists_the_listing_and_clean_shutdown_deletes_it(relay_url, tmp_path):
    d = NodeProcess(
        tmp_path / "d", "--no-model", "--publish", "--mesh-name", "delta", "--region", "lab", "--nostr-relay", relay_url
    )
    try:
        d.start()
        d_mesh = mesh_id(d.status())
        d.wait_status(
            lambda s: s["discovery"]["nostr"]["relays"][0]["ok_accepted"] >= 1,
            timeout=VIEW_TIMEOUT_S,
            what="listing accepted",
        )
        report = discover(relay_url, "--mesh-discovery-mode", "nostr")
        mine = [x for x in report["nostr"] if x["mesh_id"] == d_mesh]
        assert len(mine) == 1
        assert mine[0]["name"] == "delta" and mine[0]["region"] == "lab" and mine[0]["invite_token"]
        assert mine[0]["eligible"] is False and mine[0]["reason"] == "named_mesh_needs_mesh_name"
        named = discover(relay_url, "--mesh-discovery-mode", "nostr", "--mesh-name", "delta")
        assert [x["eligible"] for x in named["nostr"] if x["mesh_id"] == d_mesh] == [True]
        assert d.stop() == 0
        report = discover(relay_url, "--mesh-discovery-mode", "nostr")
        assert d_mesh not in {x["mesh_id"] for x in report["nostr"]}
    finally:
        d.kill_all()
