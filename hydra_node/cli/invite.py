"""``hydra-node invite [create|list|revoke]``: mint, list and revoke the running node's invites
(through its management API: ``POST /api/invite``, ``GET /api/invites``, ``POST /api/invite/revoke``)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Callable

from hydra_node.cli.client import NodeClient, NodeClientError
from hydra_node.config import ConfigError

__all__ = ["add_invite_parser", "cmd_invite", "parse_duration"]

EXIT_FAILED = 1


def parse_duration(text: str) -> float:
    """``3600``, ``90m``, ``24h``, ``7d`` → seconds (ConfigError otherwise)."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    t = text.strip().lower()
    try:
        return float(t[:-1]) * units[t[-1]] if t and t[-1] in units else float(t)
    except ValueError:
        raise ConfigError(f"--ttl: not a duration: {text!r} (examples: 3600, 90m, 24h, 7d)") from None


def add_invite_parser(sub, add_home: Callable[[argparse.ArgumentParser], None]) -> None:
    inv = sub.add_parser(
        "invite",
        help="mint, list or revoke invite tokens of the running node's mesh",
        description="Ask the running node (found through --home or --console) for a new invite token "
        "(`invite` or `invite create`; POST /api/invite, /api/status shows none), list the "
        "unexpired invites it issued (`invite list`) or revoke one (`invite revoke TOKEN_OR_ID`: "
        "every member then refuses it). Whoever holds a token can join the mesh until it expires, "
        "is revoked, or (with --uses N) has admitted N nodes; a --uses token is redeemed only by "
        "the node that issued it.",
        epilog="examples: hydra-node invite --uses 1 --ttl 1h | hydra-node invite list | "
        "hydra-node invite revoke 3f2a9c01",
    )
    inv.add_argument(
        "action",
        nargs="?",
        choices=("create", "list", "revoke"),
        default="create",
        help="create (default), list, or revoke",
    )
    inv.add_argument(
        "target",
        nargs="?",
        metavar="TOKEN_OR_ID",
        help="revoke: the token, or its id (or 8+ leading hex characters of it) from `invite list`",
    )
    inv.add_argument("--ttl", default="24h", help="lifetime: seconds, or with a unit s/m/h/d (default 24h)")
    inv.add_argument(
        "--uses",
        type=int,
        default=None,
        metavar="N",
        help="admit at most N joining nodes (1..1000; default: any number until it expires)",
    )
    inv.add_argument("--console", type=int, default=None, metavar="PORT", help="management port of the node")
    inv.add_argument("--json", action="store_true", help="print JSON (the expiry, addresses, id ...)")
    add_home(inv)


def _print_list(invites: list[dict]) -> None:
    if not invites:
        print("no unexpired invites issued by this node")
        return
    print(f"{'id':32}  {'state':8}  {'used':>9}  expires (UTC)")
    for inv in invites:
        used = f"{inv['used']}/{inv['uses']}" if inv["uses"] is not None else f"{inv['used']}/-"
        expires = time.strftime("%Y-%m-%d %H:%M", time.gmtime(inv["expires_at"]))
        print(f"{inv['id']:32}  {inv['state']:8}  {used:>9}  {expires}")


def cmd_invite(args, client: NodeClient) -> int:
    if args.action != "revoke" and args.target is not None:
        raise ConfigError(f"invite {args.action}: unexpected argument {args.target!r}")
    if args.action == "revoke" and not args.target:
        raise ConfigError("invite revoke: give the token or its id (see `hydra-node invite list`)")
    if args.action != "create" and args.uses is not None:
        raise ConfigError("--uses applies to `invite create` only")
    try:
        if args.action == "list":
            d = client.get("/api/invites", timeout=10)
            print(json.dumps(d, indent=2)) if args.json else _print_list(d["invites"])
        elif args.action == "revoke":
            d = client.post("/api/invite/revoke", {"token": args.target}, timeout=10)
            print(
                json.dumps(d, indent=2)
                if args.json
                else f"revoked invite {d['revoked']['id']}; "
                "members refuse it once the signed revocation list reaches them"
            )
        else:
            body: dict = {"ttl_s": parse_duration(args.ttl)}
            if args.uses is not None:
                body["uses"] = args.uses
            d = client.post("/api/invite", body, timeout=10)
            print(json.dumps(d, indent=2) if args.json else d["token"])
    except NodeClientError as exc:
        print(f"hydra-node: {exc}", file=sys.stderr)
        return EXIT_FAILED
    return 0
