"""``hydra placement ...``: artifact placement through the running node's API (docs/placement.md).

``prefetch KIND NAME SOURCE`` publishes a local file or folder into a namespace (``--posix-root``,
``--s3-bucket``, or the node's ``[placement]`` one) and triggers VAST when configured; ``fetch``
materialises an artifact into the node's cache; ``status``, ``retry``, ``cache``, ``pin``, ``evict``.
Every command goes through the one HTTP client (``cli/client.py``) to ``/api/placement/...``.

``serve`` takes ``--posix-root``, ``--s3-bucket`` and the ``--vast-*`` flags too: they override the
file's ``[placement]`` keys (:func:`apply_placement_args`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from hydra_node.cli.client import NodeClient, NodeClientError, NodeUnreachable
from hydra_node.config import ConfigError

__all__ = ["add_placement_parser", "add_placement_serve_args", "apply_placement_args", "cmd_placement"]

EXIT_FAILED = 1
#: Seconds between two status polls of ``--wait``.
POLL_S = 0.5
_KINDS = ("model_weights", "layer_package", "kv_state", "recurrent_state", "activation_frames")
#: ``--vast-*`` flag → ``[placement]`` key and the API's ``vast`` field.
_VAST_FLAGS = (
    ("vast_trigger_endpoint", "endpoint"),
    ("vast_tenant", "tenant"),
    ("vast_dataspace", "dataspace"),
    ("vast_source_namespace", "source_namespace"),
    ("vast_destination_namespace", "destination_namespace"),
    ("vast_target_site", "target_site"),
)


def _add_namespace_args(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--posix-root", metavar="DIR", help="a POSIX namespace root (an NFS or VAST DataSpace mount)")
    g.add_argument(
        "--s3-bucket",
        metavar="BUCKET",
        help="an S3 bucket (endpoint, region and prefix: the node's [placement] s3_* keys)",
    )


def _add_vast_args(p: argparse._ActionsContainer) -> None:  # a parser or an argument group
    for key, _ in _VAST_FLAGS:
        flag = "--" + key.replace("_", "-")
        p.add_argument(
            flag,
            dest=key,
            metavar="URL" if key.endswith("endpoint") else "TEXT",
            help="the VAST trigger endpoint (POSTed after the commit)"
            if key.endswith("endpoint")
            else f"VAST trigger: {key[len('vast_') :].replace('_', ' ')}",
        )


def add_placement_serve_args(s: argparse.ArgumentParser) -> None:
    g = s.add_argument_group("placement (docs/placement.md; override [placement])")
    g.add_argument(
        "--posix-root", metavar="DIR", help="POSIX namespace root artifacts are published to and fetched from"
    )
    g.add_argument("--s3-bucket", metavar="BUCKET", help="S3 bucket artifacts are published to and fetched from")
    _add_vast_args(g)


def apply_placement_args(args: argparse.Namespace, file_cfg: Any) -> Any:
    """``file_cfg`` with the serve flags' ``[placement]`` overrides, re-validated."""
    changes = {
        key: getattr(args, key)
        for key in ("posix_root", "s3_bucket", *(k for k, _ in _VAST_FLAGS))
        if getattr(args, key, None) is not None
    }
    if not changes:
        return file_cfg
    placement = dataclasses.replace(file_cfg.placement, **changes)
    try:
        placement.validate("placement")
    except ConfigError as exc:
        flag = str(exc).split(":", 1)[0].replace("[placement].", "--").replace("_", "-")
        raise ConfigError(f"{flag} / {exc}") from None
    return dataclasses.replace(file_cfg, placement=placement)


def add_placement_parser(sub, add_home: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser(
        "placement",
        help="publish, fetch, pin and evict artifacts (docs/placement.md)",
        description="Artifact placement through the running node (found through --home or --console): "
        "publish a local source into a POSIX or S3 namespace, materialise artifacts into "
        "the node's cache, and manage that cache.",
        epilog="example: hydra placement prefetch layer_package qwen3-stage-0 /local/cache/stage-0 "
        "--posix-root /vast/global/hydra",
    )
    ps = p.add_subparsers(dest="placement_command", metavar="ACTION", required=True)

    def action(name: str, help_text: str) -> argparse.ArgumentParser:
        a = ps.add_parser(name, help=help_text, description=help_text)
        a.add_argument("--console", type=int, default=None, metavar="PORT", help="management port of the node")
        a.add_argument("--json", action="store_true", help="print the node's JSON answer")
        add_home(a)
        return a

    a = action("prefetch", "publish the local file or folder SOURCE as KIND/NAME (then the VAST trigger, if any)")
    a.add_argument("kind", choices=_KINDS, metavar="KIND", help=f"one of {', '.join(_KINDS)}")
    a.add_argument("name", metavar="NAME")
    a.add_argument("source", metavar="SOURCE", help="a file or folder on the node's machine")
    _add_namespace_args(a)
    _add_vast_args(a)
    a.add_argument("--no-trigger", action="store_true", help="publish without the configured VAST trigger")
    a.add_argument("--identity", metavar="JSON", help="the compatibility identity (a JSON object)")
    a.add_argument("--wait", action="store_true", help="wait until the operation ends and print it")
    a = action("fetch", "materialise KIND/NAME into the node's cache (cache, namespaces, then peers)")
    a.add_argument("kind", choices=_KINDS, metavar="KIND")
    a.add_argument("name", metavar="NAME")
    a.add_argument("--wait", action="store_true", help="wait until it is there (or failed)")
    action("cache", "what the node's local artifact cache holds: sizes, TTL, pins, use")
    a = action("status", "one operation's state, manifest and, when it failed, how to retry")
    a.add_argument("op_id", metavar="OP_ID")
    a = action("retry", "run a failed operation again (a committed one re-sends only its VAST trigger)")
    a.add_argument("op_id", metavar="OP_ID")
    a.add_argument("--wait", action="store_true")
    a = action("pin", "keep NAME in the cache: never evicted nor expired (also before it arrives)")
    a.add_argument("name", metavar="NAME")
    a.add_argument("--kind", choices=_KINDS, help="only this kind (default: every kind)")
    a.add_argument("--off", action="store_true", help="unpin")
    a = action("evict", "remove NAME from the cache, and from a namespace with --posix-root/--s3-bucket")
    a.add_argument("name", metavar="NAME")
    a.add_argument("--kind", choices=_KINDS, help="only this kind (required with a namespace)")
    _add_namespace_args(a)


def _vast_body(args) -> dict | None:
    given = {field: getattr(args, key) for key, field in _VAST_FLAGS if getattr(args, key, None)}
    if given and "endpoint" not in given:
        raise ConfigError("the --vast-* flags need --vast-trigger-endpoint")
    return given or None


def _request(args, client: NodeClient) -> tuple[str, Any]:
    """(what to print, the node's answer) for ``args``."""
    cmd = args.placement_command
    if cmd == "prefetch":
        body: dict[str, Any] = {"kind": args.kind, "name": args.name, "source": os.path.abspath(args.source)}
        for key in ("posix_root", "s3_bucket"):
            if getattr(args, key):
                body[key] = os.path.abspath(args.posix_root) if key == "posix_root" else args.s3_bucket
        if args.identity:
            try:
                body["identity"] = json.loads(args.identity)
            except ValueError as exc:
                raise ConfigError(f"--identity: not JSON: {exc}") from None
        vast = _vast_body(args)
        if vast is not None and args.no_trigger:
            raise ConfigError("--no-trigger and --vast-trigger-endpoint exclude each other")
        if vast is not None:
            body["vast"] = vast
        if args.no_trigger:
            body["trigger"] = False
        return "op", client.post("/api/placement/prefetch", body, timeout=30)
    if cmd == "fetch":
        return "op", client.post("/api/placement/fetch", {"kind": args.kind, "name": args.name}, timeout=30)
    if cmd == "status":
        return "op", client.get(f"/api/placement/status/{client.quote(args.op_id)}")
    if cmd == "retry":
        return "op", client.post("/api/placement/retry", {"id": args.op_id}, timeout=30)
    if cmd == "cache":
        return "cache", client.get("/api/placement/cache")
    if cmd == "pin":
        body = {"name": args.name, "pinned": not args.off, **({"kind": args.kind} if args.kind else {})}
        return "pin", client.post("/api/placement/pin", body)
    if (args.posix_root or args.s3_bucket) and not args.kind:
        raise ConfigError("evict: --kind is required with --posix-root or --s3-bucket")
    body = {"name": args.name, **({"kind": args.kind} if args.kind else {})}
    if args.posix_root:
        body["posix_root"] = os.path.abspath(args.posix_root)
    if args.s3_bucket:
        body["s3_bucket"] = args.s3_bucket
    return "evict", client.post("/api/placement/evict", body, timeout=120)


def _wait(client: NodeClient, op: dict) -> dict:
    while not op.get("done"):
        time.sleep(POLL_S)
        op = client.get(f"/api/placement/status/{client.quote(op['id'])}")
    return op


def cmd_placement(args, client: NodeClient) -> int:
    try:
        shape, answer = _request(args, client)
        if shape == "op" and getattr(args, "wait", False):
            answer = _wait(client, answer)
    except NodeUnreachable as exc:
        print(f"hydra-node: {exc}; is a node running? start one with `hydra-node serve`", file=sys.stderr)
        return EXIT_FAILED
    except NodeClientError as exc:
        print(f"hydra-node: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if args.json:
        print(json.dumps(answer, indent=2))
    else:
        {"op": _print_op, "cache": _print_cache, "pin": _print_pin, "evict": _print_evict}[shape](answer)
    return EXIT_FAILED if shape == "op" and answer.get("state") == "failed" else 0


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n} B"


def _print_op(op: dict) -> None:
    print(
        f"operation {op['id']}: {op['action']} {op['kind']}/{op['name']}  state {op['state']}"
        + ("" if op.get("done") else "  (in progress)")
    )
    if op.get("source"):
        print(f"  source      {op['source']}")
    if op.get("namespace"):
        print(f"  namespace   {op['namespace'].get('location')}")
    if op.get("bytes_total") or op.get("bytes_done"):
        print(f"  bytes       {_size(op.get('bytes_done', 0))} of {_size(op.get('bytes_total') or 0)}")
    if op.get("manifest"):
        m = op["manifest"]
        print(f"  manifest    {m.get('manifest_id')}  {len(m.get('files', []))} files  {_size(m.get('size', 0))}")
    if op.get("path"):
        print(f"  path        {op['path']}")
    if op.get("trigger"):
        t = op["trigger"]
        print(f"  vast        delivered={t.get('delivered')} attempts={t.get('attempts')} status={t.get('status')}")
    if op.get("error"):
        print(f"  error       {op['error'].get('code')}: {op['error'].get('message')}")
    if op.get("retry_hint"):
        print(f"  retry       {op['retry_hint']}")


def _print_cache(c: dict) -> None:
    cap = _size(c["capacity_bytes"]) if c["capacity_bytes"] else "no limit"
    ttl = f"{c['ttl_s']:.0f} s" if c["ttl_s"] else "none"
    print(f"cache {c['root']}: {len(c['artifacts'])} artifacts, {_size(c['used_bytes'])} used of {cap}, TTL {ttl}")
    now = time.time()
    for a in c["artifacts"]:
        flags = ",".join(f for f, on in (("pinned", a["pinned"]), ("in-use", a["in_use"])) if on) or "-"
        left = "never" if a["expires_at"] is None else f"{max(0, a['expires_at'] - now):.0f} s"
        named = f"  model {','.join(a['models'])}" if a.get("models") else ""
        print(
            f"  {a['kind']:17} {a['name']:32} {_size(a['size']):>9}  expires {left:>8}  {flags}  from {a['source']}{named}"
        )
    for p in c["pins"]:
        print(f"  pin {p['kind'] or '*'}/{p['name']}")


def _print_pin(p: dict) -> None:
    what = f"{p['kind'] or 'every kind'}/{p['name']}"
    print(f"{'pinned' if p['pinned'] else 'unpinned'} {what}; cached now: {len(p['artifacts'])}")


def _print_evict(e: dict) -> None:
    gone = ", ".join(f"{x['kind']}/{x['name']}" for x in e["evicted"]) or "nothing cached"
    print(f"evicted from the local cache: {gone}")
    if e.get("namespace"):
        print(f"{'removed from' if e['removed_from_namespace'] else 'not found in'} {e['namespace']}")
