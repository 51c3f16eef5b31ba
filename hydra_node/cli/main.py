"""`hydra-node` (also `hydra`): the command line."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
import time
from pathlib import Path

from hydra_node import __version__
from hydra_node.cli.discovery import add_discover_parser, add_serve_args as add_discovery_serve_args, cmd_discover
from hydra_node.cli.discovery import exception_leaves, settings_from_args as discovery_settings_from_args
from hydra_node.cli.models import add_split_serve_args, add_swap_parser, cmd_swap, split_config_from_args
from hydra_node.cli.models import add_models_parser, cmd_models, fetch_settings, pair_projectors, prepare_models
from hydra_node.cli.setup_cmd import add_setup_parser, cmd_setup
from hydra_node.cli.client import NodeClient, NodeClientError
from hydra_node.cli.agents import AGENTS, add_agent_parsers, cmd_agent
from hydra_node.cli.invite import add_invite_parser, cmd_invite
from hydra_node.cli.config_cmd import add_config_parser, cmd_config
from hydra_node.cli.config_sources import load_layered
from hydra_node.cli.tune import add_tune_parser, cmd_benchmark
from hydra_node.cli.banner import print_start_banner, reap_home
from hydra_node.cli.speculative import add_speculative_serve_args, apply_speculative_args
from hydra_node.cli.placement import add_placement_parser, add_placement_serve_args, apply_placement_args, cmd_placement
from hydra_node.config import (
    DEFAULT_API_PORT,
    DEFAULT_CONSOLE_PORT,
    DEFAULT_MESH_PORT,
    ConfigError,
    NodeConfig,
    default_home,
    env_api_key,
    env_join,
)

EXIT_USAGE = 2
EXIT_FAILED = 1


def _home(args) -> Path:
    return Path(args.home).expanduser() if getattr(args, "home", None) else default_home()


def _add_home(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--home",
        metavar="DIR",
        help="state directory: identity, pid files, logs (default: $HYDRA_HOME or ~/.hydra). "
        "Nodes with different homes never share state.",
    )


def _add_node_args(s: argparse.ArgumentParser, join_required: bool = False) -> None:
    s.add_argument(
        "--join",
        action="append",
        default=[],
        metavar="TOKEN",
        help="join the mesh of this invite token (repeatable: more seeds; also $HYDRA_JOIN)"
        + ("; required (or --join-file, $HYDRA_JOIN, or --auto)" if join_required else ""),
    )
    s.add_argument(
        "--join-file",
        metavar="PATH",
        help="read invite tokens (whitespace-separated) from this file, so they do not show in ps",
    )
    s.add_argument("--port", type=int, default=None, help=f"OpenAI API port (default {DEFAULT_API_PORT}; 0 = any)")
    s.add_argument(
        "--console",
        type=int,
        default=None,
        metavar="PORT",
        help=f"management API and console port (default {DEFAULT_CONSOLE_PORT}; 0 = any)",
    )
    s.add_argument(
        "--mesh-port",
        type=int,
        default=None,
        metavar="PORT",
        help=f"peer link port (default {DEFAULT_MESH_PORT}; 0 = any)",
    )
    s.add_argument(
        "--mesh-host",
        default="0.0.0.0",
        metavar="HOST",
        help="address the peer link listener binds (default 0.0.0.0; links are authenticated and encrypted)",
    )
    s.add_argument(
        "--advertise",
        action="append",
        default=[],
        metavar="HOST[:PORT]",
        help="address peers should dial (default: this machine's addresses); repeatable",
    )
    s.add_argument(
        "--relay",
        choices=("auto", "on", "off"),
        default=None,
        help="relay links for peers that cannot be dialled: auto (when we can be dialled and are not "
        "a client), on, off (default: [relay] mode, else auto; docs/relays.md)",
    )
    s.add_argument(
        "--relay-rate",
        type=float,
        default=None,
        metavar="MB/S",
        help="cap on the bytes per second we relay for others, all circuits together "
        "(default: [relay] rate_mb_s, else 4)",
    )
    s.add_argument(
        "--hole-punch",
        choices=("on", "off"),
        default=None,
        help="move relayed links to a direct path (TCP hole punching; default: [relay] hole_punch, "
        "else on; docs/relays.md)",
    )
    s.add_argument(
        "--join-timeout",
        type=float,
        default=30.0,
        metavar="S",
        help="give up joining after this many seconds (default 30)",
    )
    s.add_argument("--headless", action="store_true", help="no web console (the management API stays up)")
    s.add_argument("--config", metavar="FILE", help="TOML config file (see docs/config.md)")
    s.add_argument("--name", help="a human-readable name for this node")
    _add_home(s)
    s.add_argument(
        "--listen-all",
        action="store_true",
        help="bind the APIs on 0.0.0.0 instead of 127.0.0.1; requires --api-key or HYDRA_API_KEY",
    )
    s.add_argument("--api-key", metavar="KEY", help="require 'Authorization: Bearer KEY' (env HYDRA_API_KEY)")
    s.add_argument("--api-key-file", metavar="PATH", help="read the API key from this file (so it does not show in ps)")
    s.add_argument(
        "--cors-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="let browser pages from ORIGIN (scheme://host[:port], or *) call the OpenAI API; "
        "repeatable; adds to [api].cors_origins (default: none)",
    )
    s.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="accept this Host header (NAME or NAME:PORT) besides 127.0.0.1, localhost and [::1], "
        "e.g. behind a reverse proxy; repeatable; adds to [api].allow_hosts",
    )
    s.add_argument("--log-format", choices=("kv", "json"), default="kv", help="log line format (default kv)")
    s.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hydra-node",
        description="Hydra: a peer-to-peer LLM inference mesh. Every machine runs one node; any node answers "
        "OpenAI-style requests for any model in the mesh.",
        epilog="Quick start: `hydra-node serve` (bundled model), then "
        "`curl localhost:9337/v1/chat/completions -d '{\"model\":\"SmolLM2-135M-Instruct-Q4_1\","
        "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}'`",
    )
    p.add_argument("--version", action="version", version=f"hydra-node {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    s = sub.add_parser(
        "serve",
        help="run a node (OpenAI API on :9337, management API on :3131)",
        description="Run a node in the foreground until SIGINT/SIGTERM. With no --model, serves the "
        "bundled SmolLM2-135M-Instruct (id SmolLM2-135M-Instruct-Q4_1). Without --join "
        "it starts a new one-node mesh; `hydra-node invite` prints a token others join with.",
    )
    s.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="MODEL",
        help="what to host, repeatable: a GGUF file (/models/x.gguf, or ID=PATH), the bundled id "
        "(SmolLM2-135M-Instruct-Q4_1), a catalogue name (Qwen3-8B-Q4_K_M; `hydra-node models list`), "
        "hf://OWNER/REPO[@REV]/FILE.gguf or https://.../x.gguf (optionally ID=URL; downloaded "
        "first, or fetched from a peer with --join; docs/models.md), or placement:NAME (a "
        "model_weights artifact from the placement cache or namespaces; docs/placement.md)",
    )
    s.add_argument(
        "--mmproj",
        action="append",
        default=[],
        metavar="[ID=]PROJECTOR",
        help="serve a --model with its multimodal projector, so its chats take images (docs/vision.md): "
        "a projector GGUF file (general.architecture 'clip', e.g. mmproj-*.gguf), "
        "hf://OWNER/REPO[@REV]/FILE.gguf, an https:// URL or a catalogue name (that entry's projector); "
        "fetched and verified like a model. With one --model a bare PROJECTOR pairs with it; with "
        "several, name the model by its id: --mmproj ID=PROJECTOR (repeatable, one per model). A "
        "catalogue model that lists a projector gets it without this flag",
    )
    s.add_argument(
        "--no-model", action="store_true", help="host no model: join the mesh, answer the API and offer capacity"
    )
    s.add_argument(
        "--standby",
        action="store_true",
        help="host nothing (not even the bundled model) but offer this node's room to the mesh: when a "
        "model loses its last host (or has fewer than its [rehost] min_hosts), a standby node is the "
        "first chosen to host it again (docs/models.md \"Growing back\"); excludes --model and --no-model",
    )
    s.add_argument("--max-memory", type=float, metavar="GB", help="cap the memory this node advertises and uses (GB)")
    _add_node_args(s)
    add_discovery_serve_args(s)
    add_split_serve_args(s)
    add_speculative_serve_args(s)
    add_placement_serve_args(s)  # --posix-root, --s3-bucket, --vast-* (hydra_node/cli/placement.py)
    add_config_parser(sub, s, _add_home)
    add_tune_parser(sub, _add_home)

    c = sub.add_parser(
        "client",
        help="API-only member of a mesh: no model, no capacity",
        description="Join a mesh as an API-only client: the OpenAI API on this machine answers for "
        "every model in the mesh, but this node hosts nothing.",
    )
    _add_node_args(c, join_required=True)
    add_discovery_serve_args(c)  # client --auto: find the mesh by discovery, as serve --auto does

    add_invite_parser(sub, _add_home)  # invite [create|list|revoke] (cli/invite.py)

    st = sub.add_parser(
        "status",
        help="show the status of a running node",
        description="Query a running node's management API (/api/status).",
    )
    st.add_argument(
        "--console",
        type=int,
        default=None,
        metavar="PORT",
        help=f"management port of the node (default: from the node's pid file in --home, else {DEFAULT_CONSOLE_PORT})",
    )
    st.add_argument("--json", action="store_true", help="print the raw JSON")
    _add_home(st)

    sp = sub.add_parser(
        "stop",
        help="stop the node running with this home",
        description="Send SIGTERM to the node whose pid file is in --home and wait for it to exit.",
    )
    _add_home(sp)
    sp.add_argument(
        "--timeout",
        type=float,
        default=40.0,
        help="seconds to wait before giving up (default 40: a stop first hands streams over to other hosts, "
        "[node] handover_grace_s and up to 12 s more, then drains the APIs and leaves the mesh)",
    )

    add_discover_parser(sub)
    add_swap_parser(sub, _add_home)
    add_agent_parsers(sub, _add_home)  # claude, opencode, pi, goose (hydra_node/cli/agents.py)

    add_models_parser(sub, _add_home)  # models [list|pull|rm] (hydra_node/cli/models.py)
    add_setup_parser(sub, _add_home)  # setup [--json] (hydra_node/cli/setup_cmd.py)
    add_placement_parser(sub, _add_home)  # placement prefetch|fetch|status|retry|cache|pin|evict (docs/placement.md)
    return p


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        return {
            "serve": cmd_serve,
            "client": cmd_serve,
            "status": cmd_status,
            "stop": cmd_stop,
            "models": lambda a: cmd_models(a, _home(a), load_layered(_home(a), None).file, _client(a), os.environ),
            "setup": cmd_setup,
            "invite": lambda a: cmd_invite(a, _client(a)),
            "benchmark": lambda a: cmd_benchmark(a, os.environ),
            "config": lambda a: cmd_config(a, node_config_from_args),
            "swap": lambda a: cmd_swap(
                a, _client(a), fetch_settings(_home(a), load_layered(_home(a), None).file, os.environ)
            ),
            "discover": lambda a: cmd_discover(a, _home(a)),
            "placement": lambda a: cmd_placement(a, _client(a)),
            **{tool: lambda a: cmd_agent(a, _home(a)) for tool in AGENTS},
        }[args.command](args)
    except ConfigError as exc:
        print(f"hydra-node: configuration error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130


def read_secret_file(flag: str, path: str) -> str:
    """The contents of a secret file (``--api-key-file``, ``--join-file``), stripped; a clear error otherwise."""
    p = Path(path).expanduser()
    try:
        text = p.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{flag} {p}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    if not text:
        raise ConfigError(f"{flag} {p}: the file is empty")
    return text


def relay_settings_from_args(args, section):
    """``--relay``/``--relay-rate``/``--hole-punch`` over the file's ``[relay]`` (``section``)."""
    from hydra_node.mesh.relay import RelayLimits, RelaySettings

    mb_s = section.rate_mb_s if args.relay_rate is None else args.relay_rate
    if not 0.001 <= mb_s <= 10_000:
        raise ConfigError(f"--relay-rate: must be between 0.001 and 10000 MB/s, not {mb_s}")
    rate = int(mb_s * 1_000_000)
    flag = getattr(args, "hole_punch", None)
    hole_punch = section.hole_punch if flag is None else flag == "on"
    return RelaySettings(
        mode=args.relay or section.mode,
        use_relays=section.use_relays,
        hole_punch=hole_punch,
        limits=RelayLimits(bytes_per_s=rate, burst_bytes=max(64 * 1024, rate // 4)),
    )


def node_config_from_args(args) -> NodeConfig:
    from hydra_node.mesh.service import MeshSettings

    layered = load_layered(_home(args), args.config)  # <home>/config.toml < --config (docs/config.md)
    file_cfg = apply_placement_args(args, apply_speculative_args(args, layered.file))
    flag_origins = tuple(o if o == "*" else o.strip().lower().rstrip("/") for o in args.cors_origin)
    api = dataclasses.replace(
        file_cfg.api,
        cors_origins=file_cfg.api.cors_origins + flag_origins,
        allow_hosts=file_cfg.api.allow_hosts + tuple(args.allow_host),
    )
    try:
        api.validate("api")
    except ConfigError as exc:
        raise ConfigError(
            str(exc)
            .replace("[api].cors_origins", "--cors-origin / [api].cors_origins")
            .replace("[api].allow_hosts", "--allow-host / [api].allow_hosts")
        ) from None
    file_cfg = dataclasses.replace(file_cfg, api=api)
    if args.api_key and args.api_key_file:
        raise ConfigError("--api-key and --api-key-file exclude each other")
    api_key = args.api_key or (
        read_secret_file("--api-key-file", args.api_key_file) if args.api_key_file else env_api_key()
    )
    joins = (
        tuple(args.join)
        + (tuple(read_secret_file("--join-file", args.join_file).split()) if args.join_file else ())
        + env_join()
    )
    args.join = list(joins)  # what the discovery options see too (--auto excludes every way of joining)
    client = args.command == "client"
    models = () if client else tuple(args.model)
    no_model = client or args.no_model
    if not client and args.no_model and args.model:
        raise ConfigError("--no-model and --model exclude each other")
    standby = not client and getattr(args, "standby", False)
    if standby and (args.model or args.no_model):
        raise ConfigError(
            "--standby hosts nothing until the mesh needs a model hosted again: drop "
            + ("--model" if args.model else "--no-model (a --no-model node lends its memory to splits only)")
        )
    if standby and not file_cfg.rehost.enabled:
        raise ConfigError("--standby offers this node for re-hosting, but [rehost].enabled is false in the config")
    role = "client" if client else ("worker" if no_model else "host")
    if client and not joins and not args.auto:
        raise ConfigError("client: needs an invite token: --join TOKEN, --join-file PATH or $HYDRA_JOIN, or --auto")
    if client and args.publish:
        raise ConfigError("client: --publish lists a mesh this node hosts for; a client hosts nothing")
    mesh = MeshSettings(
        listen_host=args.mesh_host,
        listen_port=DEFAULT_MESH_PORT if args.mesh_port is None else args.mesh_port,
        advertise=tuple(args.advertise),
        join=joins,
        role=role,
        join_timeout_s=args.join_timeout,
        relay=relay_settings_from_args(args, file_cfg.relay),
        fault=file_cfg.testing.link_faults(),  # [testing]: testing only (docs/config.md)
    )
    mmproj = pair_projectors(models, list(getattr(args, "mmproj", ()) or ()), ConfigError)
    max_mem = getattr(args, "max_memory", None)
    if max_mem is not None and max_mem <= 0:
        raise ConfigError("--max-memory: must be > 0 GB")
    cfg = NodeConfig(
        home=_home(args),
        models=models,
        mmproj=mmproj,
        no_model=no_model,
        standby=standby,
        name=args.name or "",
        api_host="0.0.0.0" if args.listen_all else "127.0.0.1",
        api_port=DEFAULT_API_PORT if args.port is None else args.port,
        console_port=DEFAULT_CONSOLE_PORT if args.console is None else args.console,
        headless=args.headless,
        listen_all=args.listen_all,
        api_key=api_key,
        file=file_cfg,
        config_files=layered.files,
        log_format=args.log_format,
        role=role,
        mesh=mesh,
        max_memory_bytes=int(max_mem * 1e9) if max_mem else None,
        **split_config_from_args(args, ConfigError),
    )
    if args.command in ("serve", "client"):
        try:
            cfg = cfg.replace(discovery=discovery_settings_from_args(args))
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    cfg.validate()
    if not (0 <= mesh.listen_port <= 65535):
        raise ConfigError(f"--mesh-port: must be a TCP port, not {mesh.listen_port}")
    return cfg


def cmd_serve(args) -> int:
    import trio

    from hydra_node.mesh.identity import IdentityError
    from hydra_node.listen import ListenError
    from hydra_node.logging_setup import setup_logging
    from hydra_node.models import InvalidModelId, ModelNotFound
    from hydra_node.node import serve
    from hydra_node.pidfile import NodeAlreadyRunning
    from hydra_node.runtime.rpc.ggml import check_rpc_support
    from hydra_node.mesh.wire.errors import MeshError
    from hydra_node.mesh.service import JoinFailed
    from hydra_node.runtime.runner.records import RunnerLoadError

    from hydra_node.cli.home import check_home

    cfg = node_config_from_args(args)
    check_home(cfg.home)  # a read-only or unusable home: one clear line, exit 2
    if (cfg := prepare_models(cfg, os.environ)) is None:  # --model NAME|URL: downloaded first (docs/models.md)
        return EXIT_FAILED
    setup_logging(cfg.log_format, args.log_level, cfg.home / "logs" / "node.log")
    # what a start can fail with that is the operator's to fix: one line each, exit 1
    start_failures = (ListenError, ModelNotFound, InvalidModelId, NodeAlreadyRunning, IdentityError, RunnerLoadError)
    try:
        check_rpc_support()
        trio.run(serve, cfg, print_start_banner)
    except (MeshError, JoinFailed) as exc:
        print(f"hydra-node: {_mesh_failure(exc)}", file=sys.stderr)
        return EXIT_FAILED
    except (*start_failures, RuntimeError) as exc:
        print(f"hydra-node: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except OSError as exc:
        print(f"hydra-node: cannot listen: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except BaseExceptionGroup as eg:
        # Report the group whole: every failure of the start-up, not only the first one.
        leaves = exception_leaves(eg)
        if any(isinstance(leaf, KeyboardInterrupt) for leaf in leaves):
            return 130
        expected = (MeshError, JoinFailed, *start_failures, OSError)
        if not all(isinstance(leaf, expected) for leaf in leaves):
            raise
        for leaf in leaves:
            text = _mesh_failure(leaf) if isinstance(leaf, (MeshError, JoinFailed)) else str(leaf)
            print(f"hydra-node: {text}", file=sys.stderr)
        return EXIT_FAILED
    return 0


def _mesh_failure(exc: BaseException) -> str:
    from hydra_node.mesh.wire.errors import TokenError
    from hydra_node.mesh.service import JoinFailed

    if isinstance(exc, (JoinFailed, TokenError)):
        return f"cannot join: {exc}"
    return f"mesh error: {exc}"


def _console_port(args) -> int:
    if args.console:
        return args.console
    from hydra_node.pidfile import read_pidfile

    rec = read_pidfile(_home(args) / "run" / "node.pid")
    info = _home(args) / "run" / "ports.json"
    if rec is not None and info.exists():
        try:
            return int(json.loads(info.read_text())["console_port"])
        except (ValueError, KeyError):
            pass
    return DEFAULT_CONSOLE_PORT


def _client(args) -> NodeClient:
    """The client of the node found through --console or --home, with $HYDRA_API_KEY if set."""
    return NodeClient(_console_port(args), env_api_key())


def cmd_status(args) -> int:
    reap_home(_home(args))  # stale pid files of a node or children that died without stopping
    try:
        st = _client(args).get("/api/status")
    except NodeClientError as exc:
        print(f"hydra-node: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if args.json:
        print(json.dumps(st, indent=2))
        return 0
    print(
        f"node {st['node_id']} ({st.get('name')})  version {st['version']}  state {st['node_state']}  "
        f"uptime {st['uptime_s']:.0f}s"
    )
    print(
        f"API http://127.0.0.1:{st.get('api_port')}/v1   in-flight {st['inflight_requests']}   "
        f"queued {st['queue_depth']}   runner restarts {st['runner_restarts']}"
    )
    for m in st.get("models", []):
        r = m.get("requests", {})
        print(
            f"  model {m['id']}: {m['state']}  pid {m.get('pid')}  restarts {m['restarts']}  "
            f"done {r.get('completed', 0)}  ttft {r.get('ttft_ms', 0)} ms  {r.get('tokens_per_s', 0)} tok/s"
            + (f"  projector {m['mmproj']}" if m.get("mmproj") else "")
        )
    peers = st.get("peers", [])
    print(f"peers: {len(peers)}")
    for p in peers:
        print(f"  {p.get('id')} {p.get('state')} rtt {p.get('rtt_ms')} ms models {','.join(p.get('models', []))}")
    return 0


def cmd_stop(args) -> int:
    from hydra_node.pidfile import read_pidfile, signal_recorded

    home = _home(args)
    path = home / "run" / "node.pid"
    rec = read_pidfile(path)
    # only the very process that wrote the file (pid and start time) is ever signalled
    if rec is None or not signal_recorded(rec, signal.SIGTERM):
        reap_home(home)  # what a node that died without stopping left behind
        print(f"hydra-node: no node is running with home {home}", file=sys.stderr)
        return EXIT_FAILED
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        if not rec.alive():
            print(f"stopped node pid {rec.pid}")
            return 0
        time.sleep(0.1)
    print(f"hydra-node: node pid {rec.pid} did not stop within {args.timeout:.0f} s", file=sys.stderr)
    return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
