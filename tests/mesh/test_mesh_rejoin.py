"""A node remembers its mesh: after a restart without --join it finds the members it knew."""

from __future__ import annotations

import json
import stat

from harness import NodeProcess


def test_restart_without_join_rejoins_known_peers(tmp_path):
    a = NodeProcess(tmp_path / "a", "--no-model").start()
    b = NodeProcess(tmp_path / "b", "--no-model", "--join", a.invite()).start()
    try:
        a_id = a.status()["node_id"]
        b.wait_status(lambda s: [p["state"] for p in s["peers"]] == ["alive"], timeout=20, what="joined")
        key = b.home / "mesh" / "mesh.key"
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
        assert (b.home / "mesh" / "mesh.key").read_text() == (a.home / "mesh" / "mesh.key").read_text()
        b.wait_status(lambda s: (b.home / "mesh" / "peers.json").exists(), timeout=10, what="peers remembered")
        assert a_id in json.loads((b.home / "mesh" / "peers.json").read_text())["peers"]
        assert b.stop() == 0
        b2 = NodeProcess(b.home, "--no-model").start()
        b = b2
        st = b2.wait_status(
            lambda s: any(p["id"] == a_id and p["state"] == "alive" for p in s["peers"]),
            timeout=20,
            what="rejoined without a token",
        )
        assert st["mesh"]["mesh_id"] == a.status()["mesh"]["mesh_id"]
    finally:
        a.kill_all()
        b.kill_all()
