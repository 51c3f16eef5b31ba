"""What ``serve`` prints on stdout once the node serves (the seed quick start: the API, the console
and an invite token), and the clean-up of stale pid files that ``status`` and ``stop`` do."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from hydra_node.pidfile import read_pidfile, reap_stale, remove_pidfile

if TYPE_CHECKING:
    from hydra_node.node import Node

__all__ = ["print_start_banner", "reap_home", "start_banner"]


def start_banner(api_url: str, console_url: str, headless: bool, invite: str | None, role: str) -> str:
    """The lines ``serve`` prints when ready (pure)."""
    lines = [
        "hydra-node is serving",
        f"  OpenAI API   {api_url}",
        f"  {'management' if headless else 'console   '}   {console_url}"
        + (" (headless: API only)" if headless else ""),
    ]
    if invite:
        lines += [
            f"  invite       {invite}",
            "  (whoever holds it can join this mesh until it expires: hydra-node serve --join TOKEN; "
            "revoke with hydra-node invite revoke)",
        ]
    elif role != "client":
        lines.append("  invite       (none: this node is in no mesh)")
    return "\n".join(lines)


def _host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "") else host


def print_start_banner(node: "Node", out: TextIO | None = None) -> None:
    """``serve``'s on-ready callback: the URLs from the bound ports, the mesh's standing invite."""
    c = node.config
    assert node.api_server is not None and node.console_server is not None  # called once the node serves
    token = node.mesh.token() if node.mesh is not None else None
    text = start_banner(
        f"http://{_host(c.api_host)}:{node.api_server.port}/v1",
        f"http://{_host(c.api_host)}:{node.console_server.port}",
        c.headless,
        token,
        c.role,
    )
    try:
        print(text, file=out or sys.stdout, flush=True)
    except (OSError, ValueError):  # stdout closed or a broken pipe: the node serves on regardless
        pass


def reap_home(home: Path, err: TextIO | None = None) -> list[str]:
    """Remove the pid files in ``home/run`` whose process is gone (and kill children whose node is gone,
    the same rule a starting node applies: ``pidfile.reap_stale``); a dead node's ``ports.json`` goes too.
    Each action is reported on ``err`` (stderr)."""
    run = home / "run"
    actions = reap_stale(run)
    ports = run / "ports.json"
    if ports.exists() and read_pidfile(run / "node.pid") is None:
        remove_pidfile(ports)
        actions.append("removed ports.json of a node that is gone")
    for action in actions:
        print(f"hydra-node: cleaned up {home}: {action}", file=err or sys.stderr)
    return actions
