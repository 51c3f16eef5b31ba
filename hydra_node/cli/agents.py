"""``hydra claude|opencode|pi|goose [--model ID] [--node URL] [--dry-run] [-- ARGS...]``: start a
coding agent wired to a node (docs/agents.md).

1. The node: ``--node URL``, else the one running with this home (its pid file and
   ``run/ports.json``), else one answering on the default API port. None: the command says how to
   start one (``hydra-node serve``) and exits 1; it never starts a node behind the user's back.
2. The model: ``--model ID`` (it must be in the node's ``/v1/models``), else the largest ready one
   (:func:`hydra_node.anthropic.models.largest_model`, with the local models' file sizes from
   ``/api/status`` where the management port is known).
3. The tool's configuration (:mod:`agents_config`) is written under ``<home>/agents/<tool>/`` and
   the tool is exec'd with its environment and the remaining arguments. ``--dry-run`` writes the
   files and prints the plan as JSON instead. A missing tool: a one-line install hint, exit 127.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
from pathlib import Path
from urllib.parse import urlsplit

from hydra_node.anthropic.models import largest_model
from hydra_node.cli.agents_config import AGENTS, LaunchPlan, launch_plan
from hydra_node.cli.client import NodeClient, NodeClientError
from hydra_node.config import DEFAULT_API_PORT, env_api_key

__all__ = ["AGENTS", "AgentLaunchError", "add_agent_parsers", "cmd_agent", "find_node", "pick_model"]

EXIT_FAILED = 1
EXIT_USAGE = 2
_CHOICE = re.compile(r"auto|none|required|any|tool:[A-Za-z0-9_-]{1,64}")
EXIT_NOT_INSTALLED = 127


class AgentLaunchError(Exception):
    """What the launcher prints after ``hydra: `` before exiting 1."""


def add_agent_parsers(sub, add_home) -> None:
    for tool in AGENTS:
        p = sub.add_parser(
            tool,
            help=f"start {tool} wired to the running node (docs/agents.md)",
            description=f"Start {tool} against a node: its configuration is written under "
            f"<home>/agents/{tool}/ (never over your own), the model defaults to "
            "the largest ready one. Arguments after -- go to the tool.",
        )
        p.add_argument("--model", metavar="ID", help="the model to use (default: the largest ready one)")
        p.add_argument(
            "--node",
            metavar="URL",
            help=f"the node's API, e.g. http://127.0.0.1:{DEFAULT_API_PORT} (default: the node running "
            "with --home, else the default port)",
        )
        p.add_argument(
            "--tool-choice",
            metavar="CHOICE",
            default="",
            help="force the node's tool_choice for this agent: auto, none, required or tool:NAME "
            "(sent as the x-hydra-tool-choice header; helps small models call tools)",
        )
        p.add_argument(
            "--max-tokens",
            type=int,
            metavar="N",
            default=None,
            help="the most tokens per answer (default: the tool's own)",
        )
        p.add_argument("--dry-run", action="store_true", help="write the configuration, print the plan, run nothing")
        add_home(p)
        p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the tool (after --)")


def _origin(url: str) -> tuple[str, str, int]:
    """``(origin, host, port)`` of a node URL given with or without ``/v1``."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme != "http" or not parts.hostname:
        raise AgentLaunchError(f"--node {url!r}: expected http://HOST:PORT")
    port = parts.port or DEFAULT_API_PORT
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"http://{host}:{port}", host, port


def _running(home: Path) -> tuple[int, int | None] | None:
    """``(api_port, console_port)`` of the node running with ``home``, or None."""
    from hydra_node.pidfile import read_pidfile

    rec = read_pidfile(home / "run" / "node.pid")
    info = home / "run" / "ports.json"
    if rec is None or not rec.alive() or not info.exists():
        return None
    try:
        ports = json.loads(info.read_text())
        return int(ports["api_port"]), ports.get("console_port")
    except (ValueError, KeyError, TypeError, OSError):
        return None


def find_node(node_url: str | None, home: Path, key: str | None) -> tuple[str, NodeClient, NodeClient | None]:
    """``(origin, API client, management client or None)`` of the node to use."""
    if node_url:
        origin, host, port = _origin(node_url)
        return origin, NodeClient(port, key, host), None
    found = _running(home)
    if found is not None:
        api, console = found
        return f"http://127.0.0.1:{api}", NodeClient(api, key), NodeClient(console, key) if console else None
    client = NodeClient(DEFAULT_API_PORT, key)
    try:
        client.get("/health")
    except NodeClientError:
        raise AgentLaunchError(
            f"no node is running with home {home} nor on port {DEFAULT_API_PORT}; start one "
            "with `hydra-node serve` (the bundled model) or `hydra-node serve --join TOKEN`, "
            "or pass --node URL"
        ) from None
    return f"http://127.0.0.1:{DEFAULT_API_PORT}", client, None


def pick_model(api: NodeClient, console: NodeClient | None, wanted: str | None) -> str:
    """``wanted`` if the node lists it, else the largest model with a ready host."""
    try:
        listed = api.get("/v1/models")["data"]
    except NodeClientError as exc:
        raise AgentLaunchError(str(exc)) from None
    ids = [m["id"] for m in listed]
    if wanted:
        if wanted not in ids:
            raise AgentLaunchError(f"model {wanted!r} is not in the mesh (available: {', '.join(ids) or 'none'})")
        return wanted
    ready = [m["id"] for m in listed if "ready" in (m.get("states") or {}).values()] or ids
    sizes: dict[str, int] = {}
    if console is not None:
        try:
            sizes = {m["id"]: m.get("size_bytes") or 0 for m in console.get("/api/status").get("models", [])}
        except NodeClientError:
            pass  # sizes only refine the choice
    model = largest_model(ready, sizes)
    if model is None:
        raise AgentLaunchError("the mesh has no model yet; wait until `hydra-node status` shows one ready")
    return model


def model_reasons(api: NodeClient, model: str) -> bool:
    """True when ``/v1/models`` says ``model`` reasons (its ``caps``; an older node lists none)."""
    try:
        listed = api.get("/v1/models")["data"]
    except NodeClientError:
        return False
    entry = next((m for m in listed if m.get("id") == model), None)
    caps = (entry or {}).get("caps")
    return isinstance(caps, dict) and bool(caps.get("reasoning"))


def _write(plan: LaunchPlan) -> None:
    for path, content in plan.files.items():
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(p.name + ".tmp")
        tmp.write_text(content)
        os.chmod(tmp, 0o600)  # may hold the node's key
        tmp.replace(p)


def cmd_agent(args, home: Path) -> int:
    tool = args.command
    extra = tuple(args.args[1:] if args.args[:1] == ["--"] else args.args)
    key = env_api_key()
    if args.tool_choice and not _CHOICE.fullmatch(args.tool_choice):
        print(f"hydra: --tool-choice {args.tool_choice!r}: expected auto, none, required or tool:NAME", file=sys.stderr)
        return EXIT_USAGE
    if args.max_tokens is not None and args.max_tokens < 1:
        print("hydra: --max-tokens must be at least 1", file=sys.stderr)
        return EXIT_USAGE
    try:
        origin, api, console = find_node(args.node, home, key)
        model = pick_model(api, console, args.model)
    except AgentLaunchError as exc:
        print(f"hydra: {exc}", file=sys.stderr)
        return EXIT_FAILED
    plan = launch_plan(
        tool, origin, model, key, extra, home / "agents", args.tool_choice, args.max_tokens, model_reasons(api, model)
    )
    _write(plan)
    if args.dry_run:
        print(json.dumps(plan.to_json(), indent=2))
        return 0
    exe = shutil.which(plan.argv[0])
    if exe is None:
        print(f"hydra: {tool} is not installed; install it with: {AGENTS[tool].install}", file=sys.stderr)
        return EXIT_NOT_INSTALLED
    print(f"hydra: starting {tool} with model {model} on {origin}", file=sys.stderr)
    sys.stderr.flush()
    os.execve(exe, list(plan.argv), plan.environment(dict(os.environ)))
    return 0  # not reached
