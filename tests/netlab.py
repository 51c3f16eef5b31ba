"""A tiny network lab: N hosts in network namespaces on one bridge (root only).

Each lab gets unique namespace and interface names, so concurrent tests never collide.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from waiting import poll_until


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


class NetLab:
    def __init__(self, n: int, subnet: str = "10.88.0"):
        self.n = n
        self.subnet = subnet
        tag = f"{os.getpid() % 10000}"
        self.hub = f"hub{tag}"
        self.hosts = [f"h{tag}x{i}" for i in range(1, n + 1)]
        self.procs: list[subprocess.Popen] = []

    def addr(self, i: int) -> str:
        return f"{self.subnet}.{i}"

    def __enter__(self) -> "NetLab":
        try:
            _ip("netns", "add", self.hub)
            _ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.hub, "link", "set", "br0", "up")
            for i, ns in enumerate(self.hosts, 1):
                _ip("netns", "add", ns)
                _ip("-n", ns, "link", "set", "lo", "up")
                _ip("link", "add", f"v{ns}", "netns", ns, "type", "veth", "peer", "name", f"b{i}", "netns", self.hub)
                _ip("-n", ns, "link", "set", f"v{ns}", "name", "eth0")
                _ip("-n", ns, "addr", "add", f"{self.addr(i)}/24", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
                _ip("-n", self.hub, "link", "set", f"b{i}", "master", "br0")
                _ip("-n", self.hub, "link", "set", f"b{i}", "up")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def set_link(self, i: int, up: bool) -> None:
        """Cut (or heal) host i's cable to the bridge: a partition."""
        _ip("-n", self.hub, "link", "set", f"b{i}", "up" if up else "down")

    def spawn(self, i: int, argv: list[str], log: Path) -> subprocess.Popen:
        f = open(log, "ab")
        p = subprocess.Popen(
            ["ip", "netns", "exec", self.hosts[i - 1], *argv],
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs.append(p)
        return p

    def run(self, i: int, argv: list[str], timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["ip", "netns", "exec", self.hosts[i - 1], *argv], capture_output=True, text=True, timeout=timeout
        )

    def __exit__(self, *exc) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, 9)
                except ProcessLookupError:
                    pass
                p.wait()
        for ns in self.hosts + [self.hub]:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def serve_node(lab: NetLab, i: int, home: Path, *extra: str) -> subprocess.Popen:
    """`hydra-node serve` on host i: standard ports inside its namespace, links advertised on its address."""
    return lab.spawn(
        i,
        [
            sys.executable,
            "-m",
            "hydra_node.cli",
            "serve",
            "--home",
            str(home),
            "--port",
            "9337",
            "--console",
            "3131",
            "--mesh-host",
            "0.0.0.0",
            "--mesh-port",
            "9338",
            "--advertise",
            lab.addr(i),
            "--name",
            f"h{i}",
            *extra,
        ],
        home.parent / f"h{i}.log",
    )


def node_status(lab: NetLab, i: int, home: Path) -> dict | None:
    r = lab.run(i, [sys.executable, "-m", "hydra_node.cli", "status", "--home", str(home), "--json"])
    if r.returncode != 0:
        return None
    return json.loads(r.stdout)


def wait_for(pred, timeout: float, what: str, interval: float = 0.5):
    """The first truthy ``pred()`` within ``timeout`` s (each poll runs a process in a namespace: 0.5 s apart)."""
    return poll_until(pred, timeout_s=timeout, what=what, interval_s=interval)
