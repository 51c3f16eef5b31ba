"""Three hosts in network namespaces: a model split over another host's RPC worker, across the bridge.

Each host has its own loopback, so the worker port (127.0.0.1 only) is unreachable from the
coordinator's namespace: the split can only work through the mesh tunnel.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from netlab import NetLab, node_status, serve_node as serve, wait_for  # noqa: E402

from hydra_node.models import BUNDLED_MODEL_ID  # noqa: E402

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root"),
    pytest.mark.skipif(not shutil.which("ip") or not shutil.which("curl"), reason="needs iproute2 and curl"),
]

PY = sys.executable


def test_split_across_namespaces(tmp_path):
    homes = {i: tmp_path / f"h{i}" / "home" for i in (1, 2, 3)}
    for h in homes.values():
        h.parent.mkdir(parents=True)
    with NetLab(3, subnet="10.89.0") as lab:
        serve(lab, 2, homes[2], "--no-model", "--max-memory", "0.2")
        wait_for(lambda: node_status(lab, 2, homes[2]), 90, "host 2 up")
        r = lab.run(2, [PY, "-m", "hydra_node.cli", "invite", "--home", str(homes[2])])
        assert r.returncode == 0, r.stderr
        token = r.stdout.strip()
        serve(lab, 3, homes[3], "--no-model", "--max-memory", "0.2", "--join", token)
        serve(lab, 1, homes[1], "--max-memory", "0.06", "--no-rpc-worker", "--join", token)
        workers = {wait_for(lambda i=i: node_status(lab, i, homes[i]), 90, f"host {i} up")["node_id"] for i in (2, 3)}

        def split_ready():
            st = node_status(lab, 1, homes[1])
            s = (st or {}).get("splits", {}).get(BUNDLED_MODEL_ID)
            return st if s and s["state"] == "ready" and s["split"] else None

        st = wait_for(split_ready, 90, "split ready on host 1")
        rpc = [d for d in st["splits"][BUNDLED_MODEL_ID]["plan"]["devices"] if d["kind"] == "rpc"]
        assert len(rpc) == 1 and rpc[0]["peer"] in workers
        body = json.dumps({"model": BUNDLED_MODEL_ID, "prompt": "def add(a, b):", "max_tokens": 8, "temperature": 0})
        r = lab.run(1, ["curl", "-s", "-m", "60", "localhost:9337/v1/completions", "-d", body], timeout=70)
        assert json.loads(r.stdout)["choices"][0]["text"], r.stdout
        st = node_status(lab, 1, homes[1])
        assert st["splits"][BUNDLED_MODEL_ID]["plan"]["devices"][1]["tunnel"]["connections"] >= 1
