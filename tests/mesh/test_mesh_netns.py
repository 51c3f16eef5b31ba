"""Three hosts in network namespaces on one bridge: join, a request across hosts, a partition and its healing."""

from __future__ import annotations

import json
import sys
import time

import pytest

import os
from hydra_node.models import BUNDLED_MODEL_ID
from netlab import NetLab, node_status, serve_node as serve, wait_for

import shutil

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root"),
    pytest.mark.skipif(not shutil.which("ip") or not shutil.which("curl"), reason="needs iproute2 and curl"),
]

PY = sys.executable


def alive(st) -> set:
    return {p["id"] for p in (st or {}).get("peers", []) if p["state"] == "alive"}


def test_three_hosts_partition_and_heal(tmp_path):
    homes = {i: tmp_path / f"h{i}" / "home" for i in (1, 2, 3)}
    for h in homes.values():
        h.parent.mkdir(parents=True)
    with NetLab(3) as lab:
        serve(lab, 1, homes[1])
        st1 = wait_for(lambda: node_status(lab, 1, homes[1]), 90, "host 1 up")
        r = lab.run(1, [PY, "-m", "hydra_node.cli", "invite", "--home", str(homes[1])])
        assert r.returncode == 0, r.stderr
        token = r.stdout.strip()
        serve(lab, 2, homes[2], "--no-model", "--join", token)
        # host 3 waits 3 s for a target of a model that just left (the default is 60 s:
        # [scheduler].target_wait_s, docs/scheduler.md "Waiting for a target")
        (tmp_path / "h3" / "hydra.toml").write_text("[scheduler]\ntarget_wait_s = 3\n")
        serve(lab, 3, homes[3], "--no-model", "--join", token, "--config", str(tmp_path / "h3" / "hydra.toml"))
        ids = {1: st1["node_id"]}
        for i in (2, 3):
            ids[i] = wait_for(lambda i=i: node_status(lab, i, homes[i]), 90, f"host {i} up")["node_id"]
        for i in (1, 2, 3):
            want = {ids[j] for j in (1, 2, 3) if j != i}
            wait_for(
                lambda i=i, want=want: alive(node_status(lab, i, homes[i])) >= want, 30, f"host {i} sees the others"
            )
        # a request on host 3 runs on host 1, across the bridge
        body = json.dumps({"model": BUNDLED_MODEL_ID, "prompt": "def add(a, b):", "max_tokens": 8, "temperature": 0})
        r = lab.run(3, ["curl", "-s", "-m", "60", "localhost:9337/v1/completions", "-d", body], timeout=70)
        assert json.loads(r.stdout)["choices"][0]["text"], r.stdout
        # partition: host 3 loses its cable
        t0 = time.monotonic()
        lab.set_link(3, False)
        wait_for(lambda: ids[3] not in alive(node_status(lab, 1, homes[1])), 20, "host 1 drops host 3")
        wait_for(lambda: not alive(node_status(lab, 3, homes[3])), 20, "host 3 drops the others")
        detect_s = time.monotonic() - t0
        r = lab.run(3, ["curl", "-s", "-m", "30", "localhost:9337/v1/completions", "-d", body], timeout=40)
        err = json.loads(r.stdout)["error"]
        assert err["code"] == "model_unavailable" and "[scheduler].target_wait_s" in err["message"], err
        # heal: everyone alive again
        lab.set_link(3, True)
        for i in (1, 2, 3):
            want = {ids[j] for j in (1, 2, 3) if j != i}
            wait_for(lambda i=i, want=want: alive(node_status(lab, i, homes[i])) >= want, 40, f"host {i} healed")
        r = lab.run(3, ["curl", "-s", "-m", "60", "localhost:9337/v1/completions", "-d", body], timeout=70)
        assert json.loads(r.stdout)["choices"][0]["text"], r.stdout
        print(f"partition noticed on both sides in {detect_s:.1f} s")
