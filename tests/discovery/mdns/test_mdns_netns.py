"""mDNS across network namespaces on a bridge: three lan_probe processes each see the other two.

Needs root (``ip netns``); skipped otherwise.  Namespace names are random so parallel runs never clash,
and everything is deleted in a finally.
"""

from __future__ import annotations

import json
import random
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from tests.conftest import requires_root

ROOT = Path(__file__).resolve().parents[3]
N_HOSTS = 3

pytestmark = [
    requires_root,
    pytest.mark.netns,
    pytest.mark.skipif(shutil.which("ip") is None, reason="iproute2 not installed"),
]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


class Lab:
    """A bridge namespace and N host namespaces with eth0 = 10.79.0.i/24."""

    def __init__(self, n: int) -> None:
        tag = secrets.token_hex(3)
        self.bridge = f"hdb{tag}"
        self.hosts = [f"hdh{tag}{i}" for i in range(1, n + 1)]
        self.made: list[str] = []

    def up(self) -> None:
        _ip("netns", "add", self.bridge)
        self.made.append(self.bridge)
        _ip("-n", self.bridge, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.bridge, "link", "set", "br0", "up")
        for i, ns in enumerate(self.hosts, start=1):
            _ip("netns", "add", ns)
            self.made.append(ns)
            _ip("-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", f"p{i}", "netns", self.bridge)
            _ip("-n", ns, "addr", "add", f"10.79.0.{i}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", self.bridge, "link", "set", f"p{i}", "master", "br0")
            _ip("-n", self.bridge, "link", "set", f"p{i}", "up")

    def down(self) -> None:
        for ns in reversed(self.made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)


def _probe_cmd(ns: str, i: int, port: int) -> list[str]:
    return [
        "ip",
        "netns",
        "exec",
        ns,
        sys.executable,
        "-m",
        "hydra_node.discovery.mdns.probe",
        "--interface",
        f"10.79.0.{i}",
        "--port",
        str(port),
        "--name",
        f"host{i}",
        "--expect",
        str(N_HOSTS - 1),
        "--timeout",
        "15",
        "--linger",
        "3",
    ]


async def test_three_namespaces_discover_each_other():
    lab = Lab(N_HOSTS)
    port = random.randrange(20000, 60000)
    results: dict[str, dict] = {}
    try:
        lab.up()

        async def run_one(i: int, ns: str) -> None:
            proc = await trio.run_process(
                _probe_cmd(ns, i, port), capture_stdout=True, capture_stderr=True, check=False, cwd=str(ROOT)
            )
            line = proc.stdout.decode().strip().splitlines()[-1] if proc.stdout.strip() else "{}"
            results[ns] = {"rc": proc.returncode, **json.loads(line), "stderr": proc.stderr.decode()[-500:]}

        with trio.fail_after(40):
            async with trio.open_nursery() as nursery:
                for i, ns in enumerate(lab.hosts, start=1):
                    nursery.start_soon(run_one, i, ns)
    finally:
        lab.down()
    for i, ns in enumerate(lab.hosts, start=1):
        r = results[ns]
        assert r["rc"] == 0, r
        seen = sorted(s["name"] for s in r["seen"])
        assert seen == sorted(f"host{j}" for j in range(1, N_HOSTS + 1) if j != i)
        for s in r["seen"]:
            assert s["addresses"] == [f"10.79.0.{s['name'][4:]}"]
