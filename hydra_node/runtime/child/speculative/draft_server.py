"""A draft model served over TCP on 127.0.0.1 (the protocol is in :mod:`.wire`).

    python -m hydra_node.runtime.child.speculative.draft_server --model PATH [--host 127.0.0.1] [--port P]

One :class:`DraftSession` per connection, one connection drafting at a time (they share
the model's KV cache): a second connection waits up to ``BUSY_WAIT_S`` and is then answered
``{"op": "error", "code": "busy"}``.  With ``--port 0`` the chosen port is printed on stdout as
``{"event": "ready", "port": P, ...}`` once the model is loaded (the node's supervisor reads it).
The node exposes this server to its mesh as tunnel service ``draft``
(:mod:`.mesh`); it never listens on anything but loopback.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
import threading
import time

from hydra_node.runtime.child.process import die_with_parent

from hydra_node.runtime.child.speculative.draft import DraftSession
from hydra_node.runtime.child.speculative.llama_engine import LlamaEngine
from hydra_node.runtime.speculative.errors import SpeculationError
from hydra_node.runtime.speculative.wire import (
    DRAFT_PROTO,
    MAX_EXTEND_TOKENS,
    MAX_K,
    BoundedFrameDecoder,
    WireError,
    frame,
    int_field,
    parse_start,
    token_list,
    vocab_fingerprint,
)

log = logging.getLogger("hydra.draft_server")

#: How long a new connection waits for the one drafting now to end.
BUSY_WAIT_S = 2.0
#: A connection silent this long (no request from its target) is closed.
IDLE_TIMEOUT_S = 120.0
#: Connections queued in the accept backlog, and served (or waiting to) at once.
BACKLOG = 8
MAX_CONNECTIONS = 8
LOOPBACK = ("127.0.0.1", "::1", "localhost")


class DraftServer:
    def __init__(self, engine: LlamaEngine, model_id: str) -> None:
        self.engine = engine
        self.model_id = model_id
        self.vocab = vocab_fingerprint(engine.llm)
        self.lock = threading.Lock()
        self.sessions = 0

    def hello(self) -> dict:
        return {
            "op": "hello",
            "proto": DRAFT_PROTO,
            "model": self.model_id,
            "n_vocab": self.engine.n_vocab,
            "vocab": self.vocab,
            "n_ctx": self.engine.n_ctx,
            "max_k": MAX_K,
        }

    def serve_connection(self, conn: socket.socket) -> None:
        conn.settimeout(IDLE_TIMEOUT_S)
        try:
            if not self.lock.acquire(timeout=BUSY_WAIT_S):
                conn.sendall(
                    frame(
                        {
                            "op": "error",
                            "code": "busy",
                            "message": "the draft model is drafting for another target; try again later",
                        }
                    )
                )
                return
            try:
                self.sessions += 1
                self._session(conn)
            finally:
                self.lock.release()
        except OSError:
            pass
        finally:
            conn.close()

    def _session(self, conn: socket.socket) -> None:
        conn.sendall(frame(self.hello()))
        session = DraftSession(self.engine)
        decoder = BoundedFrameDecoder()
        n_vocab, started = self.engine.n_vocab, False
        # Compute spent on pipelined requests (start, commit, extend) since the last proposal, and
        # the prompt tokens start evaluated: reported with the next proposal so that the target
        # counts neither as network time nor as per-token draft cost.
        queued_s, queued_tokens = 0.0, 0
        while True:
            try:
                msg = decoder.next_message()
            except WireError as exc:
                conn.sendall(frame({"op": "error", "code": exc.code, "message": str(exc)}))
                return
            if msg is None:
                data = conn.recv(65536)
                if not data:
                    return
                decoder.receive_data(data)
                continue
            t0 = time.perf_counter()
            try:
                op = msg["op"]
                if op == "start":
                    tokens, sampling, seed = parse_start(msg, n_vocab, self.engine.n_ctx)
                    session.start(tokens, sampling, seed)
                    started, queued_tokens = True, len(tokens) - 1
                elif not started:
                    raise WireError(f"{op!r:.20} before start", "out_of_order")
                elif op == "propose":
                    prop = session.propose(int_field(msg, "k", 1, MAX_K))
                    dists = None if prop.dists is None else [[d.ids.tolist(), d.probs.tolist()] for d in prop.dists]
                    conn.sendall(
                        frame(
                            {
                                "op": "proposal",
                                "tokens": list(prop.tokens),
                                "dists": dists,
                                "seconds": prop.seconds + queued_s,
                                "catchup": prop.catchup_tokens + queued_tokens,
                            }
                        )
                    )
                    queued_s, queued_tokens = 0.0, 0
                    continue
                elif op == "commit":
                    session.commit(int_field(msg, "accepted", 0, MAX_K), int_field(msg, "next", 0, n_vocab - 1))
                elif op == "extend":
                    session.extend(token_list(msg, "tokens", n_vocab, MAX_EXTEND_TOKENS))
                    session.catch_up()  # while the target computes; not on the next round's path
                    continue
                else:
                    raise WireError(f"unknown op {op!r:.20}", "unknown_op")
                queued_s += time.perf_counter() - t0
            except WireError as exc:
                conn.sendall(frame({"op": "error", "code": exc.code, "message": str(exc)}))
                return
            except (SpeculationError, ValueError) as exc:  # out of order, context full, bad values
                conn.sendall(frame({"op": "error", "code": "draft_failed", "message": f"{type(exc).__name__}: {exc}"}))
                return


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="hydra-draft-server", description="Serve a draft model to speculative targets")
    p.add_argument("--model", required=True, help="GGUF file of the draft model")
    p.add_argument("--model-id", default="", help="id announced to targets (default: the file's stem)")
    p.add_argument("--host", default="127.0.0.1", help="loopback only")
    p.add_argument("--port", type=int, default=0, help="0: any free port (printed on stdout)")
    p.add_argument("--n-ctx", type=int, default=4096)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--die-with-parent", action="store_true", help="exit when the parent process goes away")
    args = p.parse_args(argv)
    if args.host not in LOOPBACK:
        p.error("--host must be a loopback address: the mesh reaches this server through a tunnel")
    if args.die_with_parent:
        die_with_parent()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    engine = LlamaEngine(args.model, n_ctx=args.n_ctx, n_threads=max(1, args.threads))
    server = DraftServer(engine, args.model_id or os.path.splitext(os.path.basename(args.model))[0])
    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    lsock = socket.socket(family, socket.SOCK_STREAM)
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind((args.host, args.port))
    lsock.listen(BACKLOG)
    port = lsock.getsockname()[1]
    print(
        json.dumps(
            {"event": "ready", "port": port, "model": server.model_id, "n_vocab": engine.n_vocab, "vocab": server.vocab}
        ),
        flush=True,
    )
    slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def serve(conn: socket.socket) -> None:
        try:
            server.serve_connection(conn)
        finally:
            slots.release()

    while True:
        conn, _ = lsock.accept()
        if not slots.acquire(blocking=False):
            conn.close()  # more connections than any honest set of targets opens
            continue
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


if __name__ == "__main__":
    sys.exit(main())
