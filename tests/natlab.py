"""A NAT lab (root only): two hosts behind their own iptables MASQUERADE routers, public hosts on a bridge.

    R1 10.77.0.11 ─┐                      ┌─ NAT1 10.77.0.21 │ 192.168.1.1 ── A 192.168.1.2
    R2 10.77.0.12 ─┼─ br0 (10.77.0.0/24) ─┤
                   │                      └─ NAT2 10.77.0.22 │ 192.168.2.1 ── B 192.168.2.2

A and B reach the public hosts through their router (source NAT to the router's public address);
nothing on the public side can open a connection to A or B (no route, and each router drops new
inbound connections, to A or B and to itself, silently as home routers do). Each router keeps
source ports when it can (Linux MASQUERADE), so TCP hole punching passes;
``set_port_preserving(host, False)`` makes one map them at random, so it cannot. Each lab has
unique namespace and interface names. ``ensure_iptables()`` installs Debian's iptables when missing
(as root) the way tests/admin/conftest.py installs Chromium.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

__all__ = ["NatLab", "ensure_iptables", "serve_argv"]

PUBLIC = "10.77.0"
PUBLIC_HOSTS = {"R1": 11, "R2": 12}
NATED = {"A": 1, "B": 2}


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True)


def ensure_iptables() -> str | None:
    """None when iptables is usable, else why not (the caller skips)."""
    if not (hasattr(os, "geteuid") and os.geteuid() == 0):
        return "the NAT lab needs root (network namespaces, iptables)"
    if not shutil.which("ip"):
        return "the NAT lab needs iproute2 (ip)"
    if shutil.which("iptables"):
        return None
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        r = subprocess.run(
            ["apt-get", "install", "-y", "-q", "iptables"], capture_output=True, text=True, timeout=600, env=env
        )
        if r.returncode != 0:  # an empty or stale package list: refresh it once
            subprocess.run(["apt-get", "update", "-q"], capture_output=True, timeout=600, env=env)
            r = subprocess.run(
                ["apt-get", "install", "-y", "-q", "iptables"], capture_output=True, text=True, timeout=600, env=env
            )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"iptables could not be installed: {exc}"
    return None if shutil.which("iptables") else f"iptables could not be installed: {r.stderr[-300:]}"


class NatLab:
    def __init__(self) -> None:
        tag = f"{os.getpid() % 10000}"
        self.hub = f"nhub{tag}"
        self.ns = {name: f"n{tag}{name}" for name in [*PUBLIC_HOSTS, *NATED, "NAT1", "NAT2"]}
        self.procs: dict[str, list[subprocess.Popen]] = {}

    def addr(self, name: str) -> str:
        if name in PUBLIC_HOSTS:
            return f"{PUBLIC}.{PUBLIC_HOSTS[name]}"
        return f"192.168.{NATED[name]}.2"

    def _bridge_port(self, ns: str, index: int, addr: str) -> None:
        _run("ip", "link", "add", f"v{ns}", "netns", ns, "type", "veth", "peer", "name", f"b{index}", "netns", self.hub)
        _run("ip", "-n", ns, "link", "set", f"v{ns}", "name", "pub0")
        _run("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "pub0")
        _run("ip", "-n", ns, "link", "set", "pub0", "up")
        _run("ip", "-n", self.hub, "link", "set", f"b{index}", "master", "br0")
        _run("ip", "-n", self.hub, "link", "set", f"b{index}", "up")

    def __enter__(self) -> "NatLab":
        try:
            _run("ip", "netns", "add", self.hub)
            _run("ip", "-n", self.hub, "link", "add", "br0", "type", "bridge")
            _run("ip", "-n", self.hub, "link", "set", "br0", "up")
            for ns in self.ns.values():
                _run("ip", "netns", "add", ns)
                _run("ip", "-n", ns, "link", "set", "lo", "up")
            for name, last in PUBLIC_HOSTS.items():
                self._bridge_port(self.ns[name], last, f"{PUBLIC}.{last}")
            for host, k in NATED.items():
                router, inner = self.ns[f"NAT{k}"], self.ns[host]
                self._bridge_port(router, 20 + k, f"{PUBLIC}.{20 + k}")
                _run(
                    "ip",
                    "link",
                    "add",
                    f"p{inner}",
                    "netns",
                    router,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    f"q{inner}",
                    "netns",
                    inner,
                )
                _run("ip", "-n", router, "link", "set", f"p{inner}", "name", "lan0")
                _run("ip", "-n", inner, "link", "set", f"q{inner}", "name", "eth0")
                _run("ip", "-n", router, "addr", "add", f"192.168.{k}.1/24", "dev", "lan0")
                _run("ip", "-n", inner, "addr", "add", f"192.168.{k}.2/24", "dev", "eth0")
                _run("ip", "-n", router, "link", "set", "lan0", "up")
                _run("ip", "-n", inner, "link", "set", "eth0", "up")
                _run("ip", "-n", inner, "route", "add", "default", "via", f"192.168.{k}.1")
                _run("ip", "netns", "exec", router, "sysctl", "-qw", "net.ipv4.ip_forward=1")
                nat = ["ip", "netns", "exec", router, "iptables"]
                _run(*nat, "-t", "nat", "-A", "POSTROUTING", "-o", "pub0", "-j", "MASQUERADE")
                _run(*nat, "-A", "FORWARD", "-i", "pub0", "-m", "conntrack", "--ctstate", "NEW", "-j", "DROP")
                # like a home router, answer nothing unsolicited itself (no RST to a stray SYN)
                _run(*nat, "-A", "INPUT", "-i", "pub0", "-m", "conntrack", "--ctstate", "NEW", "-j", "DROP")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def set_port_preserving(self, host: str, preserving: bool) -> None:
        """Make ``host``'s router map source ports as MASQUERADE does by default (kept when free:
        TCP hole punching can pass) or at random (``--random``: a NAT hole punching cannot pass).
        Connections already mapped keep their mapping."""
        router = self.ns[f"NAT{NATED[host]}"]
        _run(
            "ip",
            "netns",
            "exec",
            router,
            "iptables",
            "-t",
            "nat",
            "-R",
            "POSTROUTING",
            "1",
            "-o",
            "pub0",
            "-j",
            "MASQUERADE",
            *(() if preserving else ("--random",)),
        )

    def spawn(self, name: str, argv: list[str], log: Path) -> subprocess.Popen:
        with open(log, "ab") as f:
            p = subprocess.Popen(
                ["ip", "netns", "exec", self.ns[name], *argv],
                stdout=f,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs.setdefault(name, []).append(p)
        return p

    def run(self, name: str, argv: list[str], timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["ip", "netns", "exec", self.ns[name], *argv], capture_output=True, text=True, timeout=timeout
        )

    def status(self, name: str) -> dict | None:
        """``/api/status`` of the node on host ``name`` (its console on :3131), None if it does not answer."""
        r = self.run(name, ["curl", "-s", "-m", "3", "localhost:3131/api/status"], timeout=10)
        try:
            return json.loads(r.stdout) if r.returncode == 0 else None
        except ValueError:
            return None

    def kill(self, name: str) -> None:
        """kill -9 everything started on host ``name``."""
        for p in self.procs.pop(name, []):
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()

    def __exit__(self, *exc) -> None:
        for name in list(self.procs):
            self.kill(name)
        for ns in [*self.ns.values(), self.hub]:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def serve_argv(lab: NatLab, name: str, home: Path, *extra: str, command: str = "serve") -> list[str]:
    """``hydra-node serve`` (or ``client``) on host ``name``, links advertised on its own address."""
    return [
        sys.executable,
        "-m",
        "hydra_node.cli",
        command,
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
        lab.addr(name),
        "--name",
        name,
        *extra,
    ]
