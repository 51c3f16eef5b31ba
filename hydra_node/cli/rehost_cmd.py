"""``hydra-node models min-hosts [MODEL N]``: how many hosts the mesh keeps of a model
(docs/models.md "Growing back").

With ``MODEL N`` it sets ``[rehost].min_hosts`` on the running node (``POST
/api/rehost/min-hosts``) and writes it into the node's config file (the last file the node read,
which wins over the others; kept with a backup, other keys and comments untouched); a node
without a config file keeps it for this run only, and the command says so. Without arguments it
lists the wanted set with the live hosts of each model (``GET /api/rehost``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from hydra_node.cli.client import NodeClient, NodeClientError
from hydra_node.config import ConfigError, parse_config_text

__all__ = ["add_min_hosts_parser", "cmd_min_hosts", "set_min_hosts_text"]

EXIT_FAILED = 1


def add_min_hosts_parser(msub, common) -> None:
    p = msub.add_parser(
        "min-hosts",
        parents=[common],
        help="how many hosts the mesh keeps of a model (re-hosting); no arguments: list them",
        description="Set [rehost].min_hosts MODEL = N on the running node and in its config file "
        "(N 0 … 16; 0: never re-host it). When the mesh has fewer live hosts of MODEL, a node with "
        "room (a --standby one first) hosts it again. Without arguments: the wanted models and "
        "their live hosts.",
    )
    p.add_argument("model", nargs="?", metavar="MODEL", help="a model id as the mesh serves it")
    p.add_argument("n", nargs="?", type=int, metavar="N", help="the hosts to keep (0: never re-host it)")


def set_min_hosts_text(text: str, model: str, n: int) -> str:
    """``text`` (a config file) with ``[rehost].min_hosts`` of ``model`` set to ``n`` (tomlkit keeps
    every comment and other key); ``ConfigError`` when the result is a config ``serve`` would refuse."""
    import tomlkit

    try:
        doc = tomlkit.parse(text)
    except Exception as exc:  # tomlkit's ParseError
        raise ConfigError(f"not valid TOML: {exc}") from None
    rehost = doc.setdefault("rehost", tomlkit.table())
    table = rehost.setdefault("min_hosts", tomlkit.inline_table())
    if not hasattr(table, "__setitem__"):
        raise ConfigError("[rehost].min_hosts is not a table")
    table[model] = n
    new = tomlkit.dumps(doc)
    parse_config_text(new)  # never write a file serve would refuse
    return new


def _print_rows(st: dict[str, Any]) -> None:
    rows = st.get("wanted", [])
    if not rows:
        print("no model is wanted kept hosted (set one: hydra-node models min-hosts MODEL N)")
    for w in rows:
        short = f"  short for {w['short_for_s']} s" if w.get("short_for_s") is not None else ""
        print(f"{w['model']}: min_hosts {w['min_hosts']}  live hosts {w['live_hosts']}  ({w['reason']}){short}")
    if st.get("claims"):
        print(f"this node re-hosts: {', '.join(st['claims'])}")
    for model, at in sorted(st.get("backoff", {}).items()):
        print(f"back-off: {model} until {at:.0f} (unix s)")


def cmd_min_hosts(args, client: NodeClient) -> int:
    model, n = args.model, args.n
    if (model is None) != (n is None):
        print("hydra-node: models min-hosts takes MODEL and N together (or neither, to list)", file=sys.stderr)
        return 2
    try:
        if model is None:
            st = client.get("/api/rehost")
        else:
            st = client.post("/api/rehost/min-hosts", {"model": model, "min_hosts": n})
    except NodeClientError as exc:
        print(f"hydra-node: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if model is not None:
        files = client.get("/api/status").get("config", {}).get("files", [])
        if files:
            path = Path(files[-1])
            try:
                new = set_min_hosts_text(path.read_text(encoding="utf-8"), model, n)
                from hydra_node.cli.config_backup import replace_with_backup

                backup = replace_with_backup(path, new)
            except (OSError, ConfigError) as exc:
                print(f"hydra-node: set on the running node, but not written to {path}: {exc}", file=sys.stderr)
                return EXIT_FAILED
            print(
                f"min_hosts {model} = {n}: set on the node and written to {path}"
                + (f" (backup {backup})" if backup else "")
            )
        else:
            print(
                f"min_hosts {model} = {n}: set on the node for this run (it read no config file; "
                f'add [rehost] min_hosts = {{"{model}" = {n}}} to <home>/config.toml to keep it)'
            )
    if getattr(args, "json", False):
        print(json.dumps(st, indent=2))
    else:
        _print_rows(st)
    return 0
