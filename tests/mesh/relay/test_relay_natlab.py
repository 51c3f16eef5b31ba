"""Relays across real NAT (network namespaces, iptables MASQUERADE; root only, skipped otherwise).

Two public relay hosts R1, R2 and two hosts A, B each behind its own NAT router (tests/natlab.py):
A hosts the bundled model, B is an API-only client. Neither can dial the other; both learn by
dial-back that they cannot be dialled, reserve at the relays and announce them. B's router maps
ports at random at first, so hole punching fails and the link stays relayed: a request on B is
served by A's model through a relay; when that relay is killed (-9) the link moves to the other.
Then B's router keeps ports again (Linux MASQUERADE's default) and the link moves to a punched
direct path: the relay's circuit ends and requests still work.
(A relay that alters bytes is rejected by the end-to-end secure channel: tests/mesh/relay/test_relay.py.)
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from hydra_node.mesh.identity import load_or_create_identity
from hydra_node.mesh.keyfile import save_mesh_key
from hydra_node.mesh.wire.ids import MeshSecret
from hydra_node.mesh.wire.token import issue_invite
from hydra_node.models import BUNDLED_MODEL_ID
from natlab import NatLab, ensure_iptables, serve_argv
from waiting import poll_until

PY = sys.executable
BODY = json.dumps({"model": BUNDLED_MODEL_ID, "prompt": "def add(a, b):", "max_tokens": 8, "temperature": 0})


def status(lab: NatLab, name: str) -> dict | None:
    return lab.status(name)


def wait_for(pred, timeout: float, what: str):
    return poll_until(pred, timeout_s=timeout, what=what, interval_s=0.5)


def peer(st: dict | None, node_id: str) -> dict:
    return next((p for p in (st or {}).get("peers", []) if p["id"] == node_id), {})


_LAB: list[NatLab] = []


def punch_counter(name: str) -> int:
    """A hole-punch counter summed over A and B (either end may drive the upgrade)."""
    return sum(
        (status(_LAB[0], n) or {}).get("mesh", {}).get("relays", {}).get("counters", {}).get(name, 0)
        for n in ("A", "B")
    )


def complete(lab: NatLab, name: str) -> dict:
    r = lab.run(name, ["curl", "-s", "-m", "60", "localhost:9337/v1/completions", "-d", BODY], timeout=70)
    try:
        return json.loads(r.stdout)
    except ValueError:
        return {"error": r.stdout or r.stderr}


@pytest.fixture(scope="module")
def nat_mesh(tmp_path_factory):
    why = ensure_iptables()
    if why:
        pytest.skip(why)
    root = tmp_path_factory.mktemp("natlab")
    homes = {n: root / n / "home" for n in ("R1", "R2", "A", "B")}
    for h in homes.values():
        h.parent.mkdir(parents=True)
    # Every node holds the mesh key and R1's invite (made here, offline): holding the key, a node
    # enters by dialling R1 (no admission round). R1 must be listening before the others dial it.
    mesh = MeshSecret.generate()
    for h in homes.values():
        save_mesh_key(h / "mesh" / "mesh.key", mesh)
    lab = NatLab()
    try:
        lab.__enter__()  # cleans up after itself when it fails
    except subprocess.CalledProcessError as exc:  # no CAP_NET_ADMIN, no veth/bridge/nat support ...
        pytest.skip(f"the NAT lab cannot be built here: {' '.join(exc.cmd)}: {exc.stderr.strip()}")
    try:
        lab.set_port_preserving("B", False)  # until test_link_moves_to_a_punched_direct_path
        issuer = load_or_create_identity(homes["R1"]).signing_key
        token = issue_invite(issuer, mesh.mesh_id, [f"{lab.addr('R1')}:9338"], 3600, time.time())
        lab.spawn("R1", serve_argv(lab, "R1", homes["R1"], "--no-model"), root / "R1.log")
        ids = {"R1": wait_for(lambda: status(lab, "R1"), 90, "R1 up")["node_id"]}
        lab.spawn("R2", serve_argv(lab, "R2", homes["R2"], "--no-model", "--join", token), root / "R2.log")
        lab.spawn("A", serve_argv(lab, "A", homes["A"], "--join", token), root / "A.log")
        lab.spawn("B", serve_argv(lab, "B", homes["B"], "--join", token, command="client"), root / "B.log")
        for n in ("R2", "A", "B"):
            ids[n] = wait_for(lambda n=n: status(lab, n), 90, f"{n} up")["node_id"]
        _LAB[:] = [lab]
        yield lab, ids, root
    finally:
        lab.__exit__(None, None, None)


def test_natted_client_uses_natted_host_through_a_relay(nat_mesh) -> None:
    lab, ids, _ = nat_mesh
    for n in ("A", "B"):  # each learns by dial-back that it cannot be dialled, and reserves at a relay
        # (the verdict is "unknown" for a moment whenever a new link raises the number of checkers wanted)
        st = wait_for(
            lambda n=n: (
                (s := status(lab, n))
                and s["mesh"]["relays"]["reserved_at"]
                and s["mesh"]["reachability"]["reachable"] is False
                and s
            ),
            30,
            f"{n} reserved",
        )
        assert st["mesh"]["reachability"]["method"] == "dialback"
    r1 = status(lab, "R1")["mesh"]
    assert r1["reachability"]["reachable"] is True and r1["relays"]["offering"] is True
    wait_for(lambda: BUNDLED_MODEL_ID in peer(status(lab, "B"), ids["A"]).get("models", ()), 30, "B sees A's model")
    out = wait_for(lambda: (c := complete(lab, "B")).get("choices") and c, 60, "B's request served by A")
    assert out["choices"][0]["text"]
    row = peer(status(lab, "B"), ids["A"])
    assert row["linked"] and row["relay"] in (ids["R1"], ids["R2"])  # no direct path: through a relay
    # Hole punching is tried (by the end that accepted the relayed link) and fails: B's NAT maps
    # ports at random. The link stays relayed and keeps working.
    wait_for(lambda: punch_counter("hole_punch_failed") >= 1, 30, "a failed hole punch")
    assert punch_counter("hole_punch_ok") == 0
    assert peer(status(lab, "B"), ids["A"])["path"] == "relayed"
    assert complete(lab, "B")["choices"][0]["text"]
    relays = status(lab, "R1")["mesh"]["relays"]["server"]
    relays2 = status(lab, "R2")["mesh"]["relays"]["server"]
    assert relays["circuits_opened"] + relays2["circuits_opened"] >= 1


def test_relay_killed_link_moves_to_the_other(nat_mesh) -> None:
    """The relay in use dies: the link moves to the other relay (punching still cannot pass B's NAT)."""
    lab, ids, _ = nat_mesh
    used = peer(status(lab, "B"), ids["A"]).get("relay")
    assert used in (ids["R1"], ids["R2"])
    other = "R2" if used == ids["R1"] else "R1"
    lab.kill("R1" if used == ids["R1"] else "R2")
    out = wait_for(lambda: (c := complete(lab, "B")).get("choices") and c, 60, "B's request after the relay died")
    assert out["choices"][0]["text"]
    row = peer(status(lab, "B"), ids["A"])
    assert row["relay"] == ids[other] and row["path"] == "relayed"


def test_link_moves_to_a_punched_direct_path(nat_mesh) -> None:
    """B's NAT keeps source ports again: the next hole-punch attempt opens one TCP connection between
    the two NATs; the link moves to it and the relay's circuit ends."""
    lab, ids, _ = nat_mesh
    relay = next(n for n in ("R1", "R2") if n in lab.procs)  # the one still running
    lab.set_port_preserving("B", True)
    row = wait_for(
        lambda: (r := peer(status(lab, "B"), ids["A"])).get("path") == "punched" and r, 45, "B's link to A punched"
    )
    assert row["relay"] is None and peer(status(lab, "A"), ids["B"])["path"] == "punched"
    assert punch_counter("hole_punch_ok") >= 1
    server = wait_for(
        lambda: (s := status(lab, relay)["mesh"]["relays"]["server"])["circuits"] == 0 and s,
        15,
        "the relay's circuit gone",
    )
    out = complete(lab, "B")
    assert out["choices"][0]["text"]
    assert status(lab, relay)["mesh"]["relays"]["server"]["bytes_relayed"] == server["bytes_relayed"]
    for n in ("A", "B"):  # a punched link is no proof that we can be dialled: reservations are kept
        st = wait_for(
            lambda n=n: (
                (s := status(lab, n)["mesh"])["reachability"]["reachable"] is False and s["relays"]["reserved_at"] and s
            ),
            15,
            f"{n} still unreachable",
        )
        assert st["relays"]["punched_links"] == 1 and st["relays"]["reserved_at"] == [ids[relay]]
        assert st["reachability"]["method"] == "dialback"
