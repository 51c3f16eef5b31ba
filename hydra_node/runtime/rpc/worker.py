"""ggml RPC worker process: ``python -m hydra_node.runtime.rpc.worker --port P``.

Binds **127.0.0.1 only** (the ggml RPC protocol has no authentication and a long record
of memory-safety bugs; remote coordinators reach a worker only through the node's
encrypted mesh tunnels).  Stdout carries exactly one JSON line:

* ready:  ``{"ready": true, "endpoint": "127.0.0.1:P", "proto": "7.0.0", "free_bytes": ...,
  "total_bytes": ..., "device": "CPU", "description": ..., "pid": ...}``, printed after the
  server answered our own RPC handshake (so ``proto`` is what the server really speaks);
* failure: ``{"ready": false, "error": "...", "permanent": bool}``.

Everything llama.cpp prints goes to stderr.  SIGTERM/SIGINT exit with status 0.
Exit status: 0 stopped by signal, 1 server failed (retry may help), 2 bad arguments
or RPC unavailable (retry will not help).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import socket
import sys
import threading
import time
from typing import TextIO

#: The only address a worker may bind.
LOOPBACK = "127.0.0.1"
#: Bound on how long the server may take to answer its first handshake.
READY_TIMEOUT_S = 30.0
_POLL_INTERVAL_S = 0.05
EXIT_STOPPED, EXIT_FAILED, EXIT_PERMANENT = 0, 1, 2
#: Environment for processes that host ggml RPC code: on abort, ggml would otherwise
#: try to attach gdb for a backtrace, which can take seconds.
CHILD_ENV = {"GGML_NO_BACKTRACE": "1"}


class WorkerArgs(argparse.Namespace):
    host: str
    port: int
    threads: int
    cache_dir: str | None
    max_memory_bytes: int | None
    device: str | None


def parse_args(argv: list[str] | None = None) -> WorkerArgs:
    p = argparse.ArgumentParser(
        prog="python -m hydra_node.runtime.rpc.worker", description="Hydra ggml RPC worker (loopback only)"
    )
    p.add_argument("--host", default=LOOPBACK, help="must be 127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--cache-dir", default=None, help="ggml RPC weight cache folder")
    p.add_argument(
        "--max-memory-bytes", type=int, default=None, help="cap on the memory this worker advertises to planners"
    )
    p.add_argument("--device", default=None, help="ggml device name (default: first GPU, else CPU)")
    return p.parse_args(argv, namespace=WorkerArgs())


def validate(args: WorkerArgs) -> str | None:
    """Return an error message for arguments we refuse, else None."""
    if args.host != LOOPBACK:
        return (
            f"refusing to bind {args.host!r}: RPC workers bind {LOOPBACK} only; remote "
            f"coordinators reach them through the encrypted mesh tunnel"
        )
    if not 0 < args.port < 65536:
        return f"--port must be 1..65535, got {args.port}"
    if not 1 <= args.threads <= 1024:
        return f"--threads must be 1..1024, got {args.threads}"
    if args.max_memory_bytes is not None and args.max_memory_bytes <= 0:
        return "--max-memory-bytes must be positive"
    return None


def _emit(out: TextIO, obj: dict) -> None:
    out.write(json.dumps(obj, separators=(",", ":")) + "\n")
    out.flush()


def _pick_device(ggml, wanted: str | None) -> int:
    from hydra_node.runtime.rpc.ggml import GGML_BACKEND_DEVICE_TYPE_GPU

    devs = [ggml.dev_get(i) for i in range(ggml.dev_count())]
    if wanted is not None:
        for d in devs:
            if ggml.device_info(d).name == wanted:
                return d
        raise ValueError(f"no ggml device named {wanted!r}; have {[ggml.device_info(d).name for d in devs]}")
    for d in devs:
        if ggml.dev_type(d) == GGML_BACKEND_DEVICE_TYPE_GPU and ggml.device_info(d).backend != "RPC":
            return d
    return ggml.cpu_device()


def _port_taken(port: int) -> str | None:
    """Bind-test the port first, so a server already there is never mistaken for ours."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as ggml does
        try:
            s.bind((LOOPBACK, port))
        except OSError as exc:
            return f"cannot bind {LOOPBACK}:{port}: {exc.strerror or exc}"
    return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Our JSON goes to the real stdout; llama.cpp's printf output is sent to stderr.
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    if (err := validate(args)) is not None:
        print(f"hydra rpc worker: {err}", file=sys.stderr)
        _emit(out, {"ready": False, "error": err, "permanent": True})
        return EXIT_PERMANENT

    os.environ.update(CHILD_ENV)  # read by ggml_abort: no gdb attach on a crash
    from hydra_node.runtime.rpc import ggml as _ggml
    from hydra_node.runtime.rpc.proto import RpcProtocolError
    from hydra_node.runtime.rpc.probe import WorkerUnreachable, probe_worker

    try:
        ggml = _ggml.load()
        device = _pick_device(ggml, args.device)
    except (_ggml.RpcUnavailable, ValueError) as exc:
        _emit(out, {"ready": False, "error": str(exc), "permanent": True})
        return EXIT_PERMANENT
    info = ggml.device_info(device)

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())

    endpoint = f"{LOOPBACK}:{args.port}"
    if (err := _port_taken(args.port)) is not None:
        _emit(out, {"ready": False, "permanent": False, "error": err})
        return EXIT_FAILED
    devices = (ctypes.c_void_p * 1)(device)
    cache = args.cache_dir.encode() if args.cache_dir else None
    # ggml_backend_rpc_start_server blocks forever in C (ctypes drops the GIL); it only
    # returns on failure.  It runs in a daemon thread so the main thread stays free for
    # signals; at exit we leave with os._exit, never joining it.
    server = threading.Thread(
        target=ggml.rpc_start_server,
        name="ggml-rpc-server",
        daemon=True,
        args=(endpoint.encode(), cache, args.threads, 1, devices),
    )
    server.start()

    deadline = time.monotonic() + READY_TIMEOUT_S
    hello = None
    while hello is None and not stop.is_set():
        if not server.is_alive():
            _emit(
                out,
                {"ready": False, "permanent": False, "error": f"ggml RPC server on {endpoint} exited (port in use?)"},
            )
            return EXIT_FAILED
        if time.monotonic() > deadline:
            _emit(
                out,
                {
                    "ready": False,
                    "permanent": False,
                    "error": f"ggml RPC server on {endpoint} not answering after {READY_TIMEOUT_S} s",
                },
            )
            return EXIT_FAILED
        try:
            hello = probe_worker(endpoint, timeout=1.0)
        except WorkerUnreachable:
            stop.wait(_POLL_INTERVAL_S)
        except RpcProtocolError as exc:
            _emit(out, {"ready": False, "permanent": False, "error": f"bad handshake on {endpoint}: {exc}"})
            return EXIT_FAILED
    if hello is not None and (hello.proto != _ggml.RPC_PROTO or not server.is_alive()):
        _emit(
            out,
            {
                "ready": False,
                "permanent": False,
                "error": f"another server answers on {endpoint} (protocol {hello.proto})",
            },
        )
        return EXIT_FAILED
    if hello is not None:
        cap = args.max_memory_bytes
        _emit(
            out,
            {
                "ready": True,
                "endpoint": endpoint,
                "proto": str(hello.proto),
                "free_bytes": min(hello.free_bytes, cap) if cap else hello.free_bytes,
                "total_bytes": min(hello.total_bytes, cap) if cap else hello.total_bytes,
                "device": info.name,
                "description": info.description,
                "pid": os.getpid(),
            },
        )
    while not stop.is_set():
        if not server.is_alive():
            print(f"hydra rpc worker: ggml RPC server on {endpoint} exited", file=sys.stderr)
            return EXIT_FAILED
        stop.wait(0.5)
    return EXIT_STOPPED


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
