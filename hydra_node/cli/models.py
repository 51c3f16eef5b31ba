"""Command-line pieces for hosting: ``serve --split/--no-rpc-worker/--tunnel-port/--stall-timeout`` and ``swap``."""

from __future__ import annotations

import sys

from hydra_node.cli.client import NodeClient, NodeClientError
from hydra_node.runtime.hosting.service import DEFAULT_SPLIT_STALL_TIMEOUT_S, SWAP_WAIT_DEFAULT_S

#: Bounds accepted for --stall-timeout.
MIN_STALL_TIMEOUT_S = 1.0
MAX_STALL_TIMEOUT_S = 3600.0


def add_split_serve_args(s) -> None:
    s.add_argument("--split", action="store_true",
                   help="split hosted models over RPC workers of other mesh nodes even when they fit here "
                        "(without it, a model is split only when it does not fit --max-memory / free memory)")
    s.add_argument("--no-rpc-worker", action="store_true",
                   help="run no llama.cpp RPC worker: lend no memory to other nodes' split models")
    s.add_argument("--tunnel-port", type=int, default=0, metavar="PORT",
                   help="data port of this node's RPC tunnels (default 0: any free port; binds --mesh-host). "
                        "Open it next to the mesh port for fast splits; when coordinators cannot reach it, "
                        "tunnel bytes ride the mesh link instead (slower)")
    s.add_argument("--stall-timeout", type=float, default=DEFAULT_SPLIT_STALL_TIMEOUT_S, metavar="S",
                   help="a split model's runner that produces nothing for S seconds during a request is killed "
                        f"and replanned; the request gets an error (default {DEFAULT_SPLIT_STALL_TIMEOUT_S:g})")


def split_config_from_args(args, error) -> dict:
    """NodeConfig fields from the flags above (``error(msg)`` raises the CLI's config error)."""
    if args.command != "serve":
        return {"rpc_worker": False}
    if not MIN_STALL_TIMEOUT_S <= args.stall_timeout <= MAX_STALL_TIMEOUT_S:
        raise error(f"--stall-timeout: must be between {MIN_STALL_TIMEOUT_S:g} and {MAX_STALL_TIMEOUT_S:g} s")
    if not 0 <= args.tunnel_port <= 65535:
        raise error(f"--tunnel-port: must be a TCP port between 0 and 65535, not {args.tunnel_port}")
    return {"force_split": args.split, "rpc_worker": not args.no_rpc_worker,
            "split_stall_timeout_s": float(args.stall_timeout), "tunnel_port": args.tunnel_port}


def add_swap_parser(sub, add_home) -> None:
    sw = sub.add_parser("swap", help="load a model on the running node (and unload the others)",
                        description="Hot swap: the running node (found through --home or --console) loads MODEL "
                                    "(a GGUF path, ID=PATH or the bundled id), waits until it is ready, then "
                                    "unloads its other models unless --keep. RPC workers stay up.")
    sw.add_argument("model", metavar="MODEL")
    sw.add_argument("--keep", action="store_true", help="keep the models already loaded")
    sw.add_argument("--split", action="store_true", help="split MODEL over mesh RPC workers even if it fits")
    sw.add_argument("--timeout", type=float, default=SWAP_WAIT_DEFAULT_S, help="seconds to wait for the load")
    sw.add_argument("--console", type=int, default=None, metavar="PORT", help="management port of the node")
    add_home(sw)


#: Bounds on the swap's other requests (listing the models, one unload).
LIST_TIMEOUT_S = 10.0
UNLOAD_TIMEOUT_S = 30.0


def cmd_swap(args, client: NodeClient) -> int:
    try:
        before = client.get("/api/runtime/models", timeout=LIST_TIMEOUT_S)["models"]
        body = {"model": args.model, "wait": True, "timeout_s": args.timeout}
        if args.split:
            body["split"] = True
        loaded = client.post("/api/runtime/models", body, timeout=args.timeout + 10)
        print(f"loaded {loaded['model']} ({'split' if loaded['split'] else 'local'}, state {loaded['state']})")
        if not args.keep:
            for model_id in before:
                if model_id != loaded["model"]:
                    client.delete(f"/api/runtime/models/{client.quote(model_id)}", timeout=UNLOAD_TIMEOUT_S)
                    print(f"unloaded {model_id}")
    except NodeClientError as exc:
        print(f"hydra-node: {exc}", file=sys.stderr)
        return 1
    return 0
