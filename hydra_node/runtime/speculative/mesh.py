"""Speculative decoding across the mesh: the node's side (``[defaults.speculative]``).

Draft side (``serve --draft-server MODEL`` / ``serve_draft = "MODEL"``): the node runs
``python -m hydra_node.runtime.speculative.draft_server`` on 127.0.0.1, restarts it when it
dies, serves it as tunnel service ``draft`` and announces ``{"draft": model_id}`` in its
announcement's ``extra`` while it is ready.

Target side (``strategy = "mesh"``, or ``"auto"`` without a local draft file): the node
listens on 127.0.0.1:Q (bound at construction, before any runner starts) and passes
``--draft-endpoint 127.0.0.1:Q`` to its runners.  Each connection to Q is spliced to the
``draft`` service of the alive peer that announces the wanted draft (``draft_model``; any
when empty), lowest link RTT first — or to this node's own draft server when it runs one.
Without a draft peer the connection is closed at once and the runner generates alone.

``strategy = "local"`` (``serve --draft MODEL``): runners load the draft in-process
(``--draft-model PATH``); no tunnel.
"""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
from pathlib import Path

import trio

from hydra_node.mesh.errors import LinkClosed, MeshError, StreamReset
from hydra_node.models import ModelNotFound, ModelRef, resolve_model
from hydra_node.runtime.rpc.tunnel import splice

from .runner_glue import argv_for

log = logging.getLogger("hydra.speculative")

DRAFT_SERVICE = "draft"
#: Bound on the draft server's load (it prints its port when ready).
DRAFT_READY_TIMEOUT_S = 120.0
#: Longest ready line the draft server may print.
MAX_READY_LINE_BYTES = 4096
#: Restart delay after the draft server died (doubles up to the max while it keeps dying early).
RESTART_BACKOFF_INITIAL_S = 1.0
RESTART_BACKOFF_MAX_S = 30.0
#: A draft server that ran this long before dying restarts after the initial delay again.
HEALTHY_AFTER_S = 30.0
#: Bound on opening a TCP connection to our own draft server, and on reaching a draft peer.
LOCAL_CONNECT_TIMEOUT_S = 3.0
PEER_OPEN_TIMEOUT_S = 3.0
#: Concurrent tunnelled draft connections, each way (a runner opens one per request).
MAX_DRAFT_CONNECTIONS = 8
#: Context of the served draft (a target's prompt plus its output must fit).
DRAFT_N_CTX = 4096

_TCP_ERRORS = (OSError, trio.BrokenResourceError, trio.ClosedResourceError)


def _resolve(ref: str, what: str) -> ModelRef:
    try:
        return resolve_model(ref)
    except ModelNotFound as exc:
        raise ModelNotFound(f"{what}: {exc}") from None


class DraftServerProcess:
    """The draft server child: started, watched, restarted with backoff; ``endpoint`` while ready."""

    def __init__(self, model: ModelRef, logfile: Path, threads: int = 1, n_ctx: int = DRAFT_N_CTX) -> None:
        self.model = model
        self.logfile = logfile
        self.threads, self.n_ctx = threads, n_ctx
        self.endpoint: str | None = None
        self.state = "starting"
        self.pid: int | None = None
        self.restarts = 0
        self.last_error: str | None = None

    async def run(self) -> None:
        delay = RESTART_BACKOFF_INITIAL_S
        while True:
            t0 = trio.current_time()
            try:
                await self._run_once()
                self.last_error = "draft server exited"
            except (OSError, ValueError, KeyError, trio.TooSlowError) as exc:
                self.last_error = f"{type(exc).__name__}: {exc}"
            if trio.current_time() - t0 > HEALTHY_AFTER_S:
                delay = RESTART_BACKOFF_INITIAL_S
            self.state = "restarting"
            log.warning("event=draft_server_restart model=%s in_s=%.1f error=%r", self.model.id, delay, self.last_error)
            await trio.sleep(delay)
            delay = min(delay * 2, RESTART_BACKOFF_MAX_S)
            self.restarts += 1

    async def _run_once(self) -> None:
        argv = [sys.executable, "-m", "hydra_node.runtime.speculative.draft_server", "--model", str(self.model.path),
                "--model-id", self.model.id, "--host", "127.0.0.1", "--port", "0", "--n-ctx", str(self.n_ctx),
                "--threads", str(self.threads), "--die-with-parent"]
        self.logfile.parent.mkdir(parents=True, exist_ok=True)
        with open(self.logfile, "ab") as err:
            proc = await trio.lowlevel.open_process(argv, stdout=subprocess.PIPE, stderr=err)
        self.pid = proc.pid
        try:
            with trio.fail_after(DRAFT_READY_TIMEOUT_S):
                line = b""
                while b"\n" not in line:
                    chunk = await proc.stdout.receive_some(MAX_READY_LINE_BYTES)
                    if not chunk:
                        raise OSError(f"draft server exited while loading (see {self.logfile})")
                    line += chunk
                    if len(line) > MAX_READY_LINE_BYTES:
                        raise ValueError("draft server's ready line is too long")
            ready = json.loads(line.split(b"\n", 1)[0])
            self.endpoint = f"127.0.0.1:{int(ready['port'])}"
            self.state = "ready"
            log.info("event=draft_server_ready model=%s endpoint=%s pid=%d", self.model.id, self.endpoint, proc.pid)
            await proc.wait()
        finally:
            self.endpoint = None
            self.pid = None
            with trio.CancelScope(shield=True):
                if proc.returncode is None:
                    proc.kill()
                await proc.wait()

    def status(self) -> dict:
        return {"model": self.model.id, "state": self.state, "endpoint": self.endpoint, "pid": self.pid,
                "restarts": self.restarts, "last_error": self.last_error}


class SpeculationService:
    """Wires ``[defaults.speculative]`` into a node (see the module docstring)."""

    def __init__(self, node) -> None:
        self.node = node
        sec = node.config.file.defaults.speculative
        self.section = sec
        self.strategy = sec.strategy
        self.server: DraftServerProcess | None = None
        self.local_draft: ModelRef | None = None
        self.wanted = ""  # the draft model id a mesh target looks for ("" = any)
        self.counters = {"tunnels_served": 0, "tunnels_refused": 0, "tunnels_opened": 0, "no_draft_peer": 0,
                         "tunnel_failures": 0}
        if sec.serve_draft:
            threads = node.config.file.defaults.throughput.threads or 1
            self.server = DraftServerProcess(_resolve(sec.serve_draft, "serve_draft"),
                                             node.home / "logs" / "draft-server.log", threads=threads)
        mode = self.strategy
        if mode == "auto":
            mode = "off"
            if sec.draft_model:
                try:
                    self.local_draft = resolve_model(sec.draft_model)
                    mode = "local"
                except ModelNotFound:
                    mode = "mesh" if node.mesh is not None else "off"
            elif node.mesh is not None:
                mode = "mesh"
        elif mode == "local":
            self.local_draft = _resolve(sec.draft_model, "draft_model")
        elif mode == "mesh" and node.mesh is None:
            mode = "off"
            log.warning("event=speculation_off reason=no_mesh strategy=mesh")
        if mode == "mesh":
            self.wanted = sec.draft_model
        self.mode = mode
        self._listen_sock: socket.socket | None = None
        self.endpoint = ""
        if mode == "mesh":
            self._listen_sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self._listen_sock.bind(("127.0.0.1", 0))
            self._listen_sock.listen(MAX_DRAFT_CONNECTIONS)
            self.endpoint = f"127.0.0.1:{self._listen_sock.getsockname()[1]}"
        if node.mesh is not None:
            node.mesh.tunnel_handlers[DRAFT_SERVICE] = self.handle_stream
            node.mesh.extra_sources.append(self._announce)
        node.add_status_section("speculation", self.status)

    # ---- what runners get ---------------------------------------------------------------
    def runner_argv(self) -> tuple[str, ...]:
        s = self.section
        kw = dict(min_tokens=s.draft_min_tokens, max_tokens=s.draft_max_tokens, min_acceptance=s.min_acceptance,
                  min_speedup=s.min_predicted_speedup)
        if self.mode == "mesh":
            return tuple(argv_for(endpoint=self.endpoint, **kw))
        if self.mode == "local":
            return tuple(argv_for(model=str(self.local_draft.path), **kw))
        return ()

    # ---- lifecycle ----------------------------------------------------------------------
    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            if self.server is not None:
                nursery.start_soon(self.server.run)
            if self._listen_sock is not None:
                listener = trio.SocketListener(trio.socket.from_stdlib_socket(self._listen_sock))
                nursery.start_soon(self._accept_loop, listener)
            task_status.started(self)
            await trio.sleep_forever()

    def _announce(self) -> dict:
        if self.server is not None and self.server.endpoint is not None:
            return {"draft": self.server.model.id}
        return {}

    # ---- draft side: serve the tunnel service ---------------------------------------------
    async def handle_stream(self, link, header: dict, stream) -> None:
        try:
            endpoint = self.server.endpoint if self.server is not None else None
            if endpoint is None:
                self.counters["tunnels_refused"] += 1
                await stream.reset("draft_unavailable", "this node serves no draft model right now")
                return
            tcp = await self._connect_local(endpoint)
            if tcp is None:
                self.counters["tunnels_refused"] += 1
                await stream.reset("draft_unavailable", "the draft server does not answer")
                return
            self.counters["tunnels_served"] += 1
            await splice(tcp, stream)
        finally:
            with trio.CancelScope(shield=True):  # never leave it half-closed (see rpc/tunnel.py)
                await stream.reset("closed", "draft tunnel ended")

    @staticmethod
    async def _connect_local(endpoint: str) -> trio.SocketStream | None:
        host, _, port = endpoint.rpartition(":")
        try:
            with trio.fail_after(LOCAL_CONNECT_TIMEOUT_S):
                return await trio.open_tcp_stream(host, int(port))
        except (OSError, trio.TooSlowError):
            return None

    # ---- target side: the local tunnel port --------------------------------------------
    def draft_peers(self) -> list[tuple[str, str]]:
        """(peer id, draft model id) of alive peers announcing the wanted draft, lowest RTT first."""
        mesh = self.node.mesh
        if mesh is None or mesh.membership is None:
            return []
        states = {p.peer_id: p.state for p in mesh.membership.statistics(trio.current_time()).peers}
        found = []
        for peer_id, ann in mesh.membership.members().items():
            draft = dict(ann.extra).get("draft") if ann is not None else None
            if states.get(peer_id) != "alive" or not isinstance(draft, str) or (self.wanted and draft != self.wanted):
                continue
            link = mesh.links.get(peer_id)
            rtt = link.rtt_ms if link is not None and link.rtt_ms is not None else float("inf")
            found.append((rtt, peer_id, draft))
        return [(pid, draft) for _, pid, draft in sorted(found)]

    async def _accept_loop(self, listener: trio.SocketListener) -> None:
        limit = trio.CapacityLimiter(MAX_DRAFT_CONNECTIONS)
        async with listener, trio.open_nursery() as nursery:
            while True:
                tcp = await listener.accept()
                if limit.borrowed_tokens >= MAX_DRAFT_CONNECTIONS:
                    await tcp.aclose()
                    continue
                nursery.start_soon(self._forward, tcp, limit)

    async def _forward(self, tcp: trio.SocketStream, limit: trio.CapacityLimiter) -> None:
        async with limit:
            own = self.server.endpoint if self.server is not None else None
            if own is not None and (not self.wanted or self.wanted == self.server.model.id):
                local = await self._connect_local(own)
                if local is not None:
                    await _splice_tcp(tcp, local)
                    return
            for peer_id, _draft in self.draft_peers():
                try:
                    with trio.fail_after(PEER_OPEN_TIMEOUT_S):
                        link = await self.node.mesh.link_to(peer_id)
                    async with link.open_stream({"kind": "tunnel", "service": DRAFT_SERVICE}) as stream:
                        self.counters["tunnels_opened"] += 1
                        await splice(tcp, stream)
                    return
                except (MeshError, StreamReset, LinkClosed, trio.TooSlowError) + _TCP_ERRORS as exc:
                    self.counters["tunnel_failures"] += 1
                    log.info("event=draft_tunnel_failed peer=%s error=%r", peer_id[:16], exc)
                    break  # the runner finishes this request alone; the next one tries again
            else:
                self.counters["no_draft_peer"] += 1
            with trio.CancelScope(shield=True):
                await tcp.aclose()

    def status(self) -> dict:
        return {"strategy": self.strategy, "mode": self.mode, "wanted_draft": self.wanted or None,
                "draft_endpoint": self.endpoint or None,
                "local_draft": str(self.local_draft.path) if self.local_draft is not None else None,
                "draft_peers": [{"peer": pid[:16], "draft": d} for pid, d in self.draft_peers()],
                "serving_draft": self.server.status() if self.server is not None else None,
                "counters": dict(self.counters)}


async def _splice_tcp(a: trio.SocketStream, b: trio.SocketStream) -> None:
    """Pump bytes both ways between two local TCP connections until either side ends."""
    async with trio.open_nursery() as nursery:
        async def pump(src, dst) -> None:
            try:
                while data := await src.receive_some(65536):
                    await dst.send_all(data)
            except _TCP_ERRORS:
                pass
            nursery.cancel_scope.cancel()

        nursery.start_soon(pump, a, b)
        nursery.start_soon(pump, b, a)
    with trio.CancelScope(shield=True):
        await a.aclose()
        await b.aclose()
