"""Command-line surface of discovery: ``serve`` flags and ``hydra-node discover`` (wired in by ``cli.py``)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from hydra_node.discovery.mdns.service import MDNS_GROUP, MDNS_PORT
from hydra_node.discovery.node_choice import (
    AUTO_WAIT_S,
    DISCOVERY_MODES,
    DiscoverySettings,
    DiscoverySettingsError,
    load_last_mesh,
)

__all__ = [
    "add_discover_parser",
    "add_serve_args",
    "cmd_discover",
    "exception_leaves",
    "os_errors",
    "settings_from_args",
]

DISCOVER_WAIT_S = 5.0  # `discover --wait` default: returns earlier once relays are synced and the LAN settled
MAX_DISCOVER_WAIT_S = 120.0


def _add_mdns_args(p: argparse._ActionsContainer) -> None:  # a parser or an argument group
    p.add_argument(
        "--mdns-group",
        default=MDNS_GROUP,
        metavar="ADDR",
        help=f"mDNS multicast group (default {MDNS_GROUP}; tests and labs may use another)",
    )
    p.add_argument(
        "--mdns-port",
        type=int,
        default=MDNS_PORT,
        metavar="PORT",
        help=f"mDNS UDP port (default {MDNS_PORT}; tests use a random high port)",
    )
    p.add_argument(
        "--mdns-interface",
        default="0.0.0.0",
        metavar="IPV4",
        help="IPv4 address of the interface to join the group on (default: the system's choice)",
    )


def _add_source_args(p: argparse._ActionsContainer) -> None:  # a parser or an argument group
    p.add_argument(
        "--mesh-discovery-mode",
        choices=DISCOVERY_MODES,
        default="both",
        help="sources: mdns (LAN only), nostr (relays only) or both (default)",
    )
    p.add_argument(
        "--nostr-relay",
        action="append",
        default=[],
        metavar="URL",
        help="ws:// or wss:// Nostr relay (repeatable; default: the public relays in docs/discovery.md)",
    )
    p.add_argument(
        "--mesh-name",
        default=None,
        metavar="NAME",
        help="mesh name: published with --publish; with --auto only a mesh of this name is joined",
    )


def add_serve_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("discovery (docs/discovery.md)")
    g.add_argument(
        "--auto",
        action="store_true",
        help="without --join: find a mesh (LAN meshes we hold a credential for, Nostr listings), "
        "join the best one, falling back to the next; else start a new mesh",
    )
    g.add_argument(
        "--publish",
        action="store_true",
        help="list this mesh on Nostr (republished every 60 s, expires after 120 s, deleted on shutdown)",
    )
    g.add_argument(
        "--mdns",
        dest="mdns",
        action="store_true",
        default=None,
        help="announce this node and browse on the LAN with mDNS (default: on with --auto, else off)",
    )
    g.add_argument("--no-mdns", dest="mdns", action="store_false", help="never use mDNS")
    g.add_argument("--region", default=None, help="free-form region published with --publish")
    g.add_argument(
        "--max-clients",
        type=int,
        default=0,
        metavar="N",
        help="published client limit (0 = unlimited); --auto skips full meshes",
    )
    g.add_argument(
        "--auto-wait",
        type=float,
        default=AUTO_WAIT_S,
        metavar="S",
        help=f"--auto: longest wait for discovery before choosing (default {AUTO_WAIT_S:g}; "
        "returns earlier once relays have sent what they hold)",
    )
    _add_source_args(g)
    _add_mdns_args(g)


def settings_from_args(args) -> DiscoverySettings | None:
    """The discovery settings of ``serve``, or None when nothing is on; ValueError for bad flags."""
    if args.auto and args.join:
        raise DiscoverySettingsError("--auto chooses a mesh; it cannot be combined with --join")
    s = DiscoverySettings(
        mode=args.mesh_discovery_mode,
        mdns=args.mdns,
        mdns_group=args.mdns_group,
        mdns_port=args.mdns_port,
        mdns_interface=args.mdns_interface,
        auto=args.auto,
        publish=args.publish,
        relays=tuple(args.nostr_relay),
        mesh_name=args.mesh_name,
        region=args.region,
        max_clients=args.max_clients,
        auto_wait_s=args.auto_wait,
    )
    s.validate()
    return s if s.active else None


def exception_leaves(exc: BaseException) -> list[BaseException]:
    """Every exception inside ``exc`` (nested groups flattened), in order."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in exception_leaves(inner)]
    return [exc]


def os_errors(exc: BaseException) -> list[OSError] | None:
    """Every OSError in ``exc`` (a bare one, or a group however nested) when that is all it holds;
    None when anything else is in it (a bug, or a cancellation: the caller re-raises it whole)."""
    leaves = exception_leaves(exc)
    return leaves if all(isinstance(e, OSError) for e in leaves) else None  # type: ignore[return-value]


def add_discover_parser(sub) -> None:
    d = sub.add_parser(
        "discover",
        help="list the meshes on the LAN (mDNS) and on Nostr",
        description="Browse mDNS and/or Nostr relays for a few seconds and list what is there, "
        "with the --auto score of each Nostr listing. Needs no running node.",
    )
    d.add_argument("--json", action="store_true", help="print JSON (adverts, listings with score terms, relays)")
    d.add_argument(
        "--wait",
        type=float,
        default=DISCOVER_WAIT_S,
        metavar="S",
        help=f"longest wait (default {DISCOVER_WAIT_S:g}; returns earlier once relays are synced)",
    )
    d.add_argument("--home", metavar="DIR", help="state directory, for the last-mesh bonus (default ~/.hydra)")
    _add_source_args(d)
    _add_mdns_args(d)


def cmd_discover(args, home: Path) -> int:
    import trio

    from hydra_node.discovery.auto import AutoContext
    from hydra_node.discovery.mdns.service import MdnsConfig
    from hydra_node.discovery.nostr.services import DiscovererConfig, relays_or_default
    from hydra_node.discovery.snapshot import discover_once, discovery_sources, format_report, report_to_json

    from hydra_node.config import ConfigError

    s = DiscoverySettings(
        mode=args.mesh_discovery_mode,
        mdns_group=args.mdns_group,
        mdns_port=args.mdns_port,
        mdns_interface=args.mdns_interface,
        relays=tuple(args.nostr_relay),
        mesh_name=args.mesh_name,
    )
    try:
        s.validate()
    except DiscoverySettingsError as exc:
        raise ConfigError(str(exc)) from None
    if not 0 < args.wait <= MAX_DISCOVER_WAIT_S:
        raise ConfigError(f"--wait: 0 < seconds <= {MAX_DISCOVER_WAIT_S:g}")
    lan, nostr = discovery_sources(s.mode)
    last = load_last_mesh(home)
    ctx = AutoContext(now=int(time.time()), last_mesh_id=last.mesh_id if last else None, mesh_name=s.mesh_name)
    try:
        report = trio.run(
            lambda: discover_once(
                wait_s=args.wait,
                mdns=MdnsConfig(group=s.mdns_group, port=s.mdns_port, interface=s.mdns_interface) if lan else None,
                nostr=DiscovererConfig(relays=relays_or_default(s.relays)) if nostr else None,
                context=ctx,
            )
        )
    except (OSError, BaseExceptionGroup) as exc:  # e.g. no multicast route for the mDNS group
        errors = os_errors(exc)
        if errors is None:
            raise
        for err in errors:  # every one: the mDNS and the Nostr side can both fail
            print(f"hydra-node: discover: {err}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(report_to_json(report), indent=2))
    else:
        print(format_report(report))
    sys.stdout.flush()
    return 0
