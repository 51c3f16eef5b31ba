"""``hydra-node config show`` (the effective configuration, each value with its source) and ``config path``.

``config show`` takes the same flags as ``serve``, so it shows what ``serve`` with those flags
would run with: every key of the file sections (``[scheduler]``, ``[defaults.*]``, ``[runner]``,
``[api]``, ``[placement]``) with ``default``, the file that set it, or ``flag``; then the node's
own settings (ports, home, models) with ``default``, ``flag`` or ``env``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable

from hydra_node.cli.config_sources import ValueSource, default_config_path, load_layered, value_sources
from hydra_node.config import NodeConfig, default_home

__all__ = ["add_config_parser", "cmd_config", "format_sources", "node_sources"]


def add_config_parser(
    sub, serve_parser: argparse.ArgumentParser, add_home: Callable[[argparse.ArgumentParser], None]
) -> None:
    """``config show`` takes every flag of ``serve_parser`` (argparse ``parents``)."""
    c = sub.add_parser(
        "config",
        help="show the effective configuration and where each value comes from",
        description="The configuration is layered: built-in defaults < <home>/config.toml "
        "(when present) < --config FILE < command-line flags (docs/config.md).",
    )
    csub = c.add_subparsers(dest="config_command", metavar="SUBCOMMAND", required=True)
    show = csub.add_parser(
        "show",
        parents=[serve_parser],
        conflict_handler="resolve",
        help="print the effective configuration with the source of each value",
        description="Takes the flags of `serve` and prints what `serve` with them would run "
        "with; each value is marked default, the file that set it, flag or env.",
    )
    show.add_argument("--json", action="store_true", help="print JSON: files, values with sources, reserved keys")
    path = csub.add_parser("path", help="print the path of the default config file (<home>/config.toml)")
    add_home(path)


def node_sources(args, cfg: NodeConfig) -> list[ValueSource]:
    """The node's own settings (not file keys): flag when given, env for what the environment set."""

    def src(flag_value: Any) -> str:
        return "flag" if flag_value not in (None, False, [], "") else "default"

    mesh_port = cfg.mesh.listen_port if cfg.mesh is not None else None
    home_src = "flag" if args.home else ("env" if default_home() != Path("~/.hydra").expanduser() else "default")
    key_src = "flag" if (args.api_key or args.api_key_file) else ("env" if cfg.api_key else "default")
    return [
        ValueSource("node.home", str(cfg.home), home_src),
        ValueSource("node.models", list(cfg.models), src(args.model)),
        ValueSource("node.role", cfg.role, src(args.no_model)),
        ValueSource("node.name", cfg.name, src(args.name)),
        ValueSource("node.api_host", cfg.api_host, src(args.listen_all)),
        ValueSource("node.api_port", cfg.api_port, src(args.port)),
        ValueSource("node.console_port", cfg.console_port, src(args.console)),
        ValueSource("node.mesh_port", mesh_port, src(args.mesh_port)),
        ValueSource("node.headless", cfg.headless, src(args.headless)),
        ValueSource("node.api_key", "(set)" if cfg.api_key else "(none)", key_src),
        ValueSource("node.log_format", cfg.log_format, "flag" if args.log_format != "kv" else "default"),
    ]


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if value is None:
        return '""'
    return json.dumps(value)


def format_sources(values: list[ValueSource], files: tuple[str, ...]) -> str:
    """TOML-looking text, one table per section, each value followed by ``# source``."""
    lines = [f"# layering: defaults < {' < '.join(files) if files else '(no config file)'} < flags"]
    section = None
    width = max((len(v.key.rsplit('.', 1)[1]) + len(_toml_value(v.value)) for v in values), default=0) + 4
    for v in values:
        table, _, name = v.key.rpartition(".")
        if table != section:
            lines += ["", f"[{table}]"]
            section = table
        text = f"{name} = {_toml_value(v.value)}"
        lines.append(f"{text:<{min(width, 60)}} # {v.source}")
    return "\n".join(lines)


def cmd_config(args, build: Callable[[Any], NodeConfig]) -> int:
    """``build`` is the CLI's flags → :class:`NodeConfig` (the one ``serve`` uses)."""
    home = Path(args.home).expanduser() if args.home else default_home()
    if args.config_command == "path":
        print(default_config_path(home))
        return 0
    cfg = build(args)
    layered = load_layered(cfg.home, args.config)
    values = value_sources(cfg.file, layered) + node_sources(args, cfg)
    if args.json:
        print(
            json.dumps(
                {
                    "files": list(layered.files),
                    "default_file": str(default_config_path(cfg.home)),
                    "values": {v.key: {"value": v.value, "source": v.source} for v in values},
                    "reserved_keys": list(cfg.file.reserved_keys),
                },
                indent=2,
            )
        )
    else:
        print(format_sources(values, layered.files))
        if cfg.file.reserved_keys:
            print(f"\n# reserved (accepted, not acted on yet): {', '.join(cfg.file.reserved_keys)}")
    sys.stdout.flush()
    return 0
