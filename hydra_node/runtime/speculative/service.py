"""Speculative decoding across the mesh: the node's side (``[defaults.speculative]``).

Draft side (``serve --draft-server MODEL`` / ``serve_draft = "MODEL"``): the node runs
``python -m hydra_node.runtime.child.speculative.draft_server`` on 127.0.0.1, restarts it when it
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

import enum
import logging
import socket
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import trio

from hydra_node.backoff import Backoff
from hydra_node.mesh.wire.errors import LinkClosed, MeshError, StreamReset
from hydra_node.models import ModelNotFound, ModelRef, resolve_model
from hydra_node.runtime.peers import PeerView, link_rtt_ms
from hydra_node.runtime.rpc.tunnel_splice import TCP_ERRORS, splice
from hydra_node.runtime.supervise import ChildFailed, ChildNotReady, ChildOutput, ChildSpec, ChildState, ChildSupervisor

from hydra_node.runtime.speculative.runner_args import argv_for
from hydra_node.runtime.speculative.wire import MAX_READY_LINE_BYTES, DraftReady, WireError, parse_ready_line


class SpeculationSettings(Protocol):
    """What the service reads of ``[defaults.speculative]`` (the config's ``SpeculativeSection``): read-only."""

    @property
    def strategy(self) -> str: ...
    @property
    def draft_model(self) -> str: ...
    @property
    def draft_max_tokens(self) -> int: ...
    @property
    def draft_min_tokens(self) -> int: ...
    @property
    def min_acceptance(self) -> float: ...
    @property
    def min_predicted_speedup(self) -> float: ...
    @property
    def serve_draft(self) -> str: ...


log = logging.getLogger("hydra.speculative")

DRAFT_SERVICE = "draft"
#: Bound on the draft server's load (it prints its port when ready).
DRAFT_READY_TIMEOUT_S = 120.0
#: Restart delay after the draft server died: 1 s doubling up to 30 s while it keeps dying
#: early; one that was up 30 s restarts after 1 s again.
RESTART_BACKOFF = Backoff(initial_s=1.0, factor=2.0, max_s=30.0, jitter=0.1, reset_after_s=30.0)
#: Bound on opening a TCP connection to our own draft server, and on reaching a draft peer.
LOCAL_CONNECT_TIMEOUT_S = 3.0
PEER_OPEN_TIMEOUT_S = 3.0
#: Concurrent tunnelled draft connections, each way (a runner opens one per request).
MAX_DRAFT_CONNECTIONS = 8
#: Context of the served draft (a target's prompt plus its output must fit).
DRAFT_N_CTX = 4096


def _resolve(ref: str, what: str) -> ModelRef:
    try:
        return resolve_model(ref)
    except ModelNotFound as exc:
        raise ModelNotFound(f"{what}: {exc}") from None


class DraftServerProcess:
    """The draft server child, kept alive by the node's child supervisor; ``endpoint`` while ready."""

    def __init__(
        self, model: ModelRef, logfile: Path, threads: int = 1, n_ctx: int = DRAFT_N_CTX, pidfile: Path | None = None
    ) -> None:
        self.model = model
        self.logfile = logfile
        self.threads, self.n_ctx = threads, n_ctx
        self.endpoint: str | None = None
        argv = [
            sys.executable,
            "-m",
            "hydra_node.runtime.child.speculative.draft_server",
            "--model",
            str(self.model.path),
            "--model-id",
            self.model.id,
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--n-ctx",
            str(self.n_ctx),
            "--threads",
            str(self.threads),
            "--die-with-parent",
        ]
        spec = ChildSpec(
            argv,
            ready=self._read_ready,
            kind="draft-server",
            stdout=subprocess.PIPE,
            output=ChildOutput(logfile),
            pidfile=pidfile,
            on_exit=self._gone,
        )
        self._child = ChildSupervisor(
            f"draft server {model.id!r}", spec, backoff=RESTART_BACKOFF, on_ready=self._on_ready
        )

    @property
    def state(self) -> ChildState:
        return self._child.state

    @property
    def pid(self) -> int | None:
        return self._child.pid

    @property
    def restarts(self) -> int:
        return self._child.restarts

    @property
    def last_error(self) -> str | None:
        return self._child.last_error

    async def run(self) -> None:
        """Keep the draft server up until cancelled; one that cannot be spawned stays ``failed``."""
        try:
            await self._child.run()
        except ChildFailed:
            await trio.sleep_forever()  # the node serves on without a draft; status shows why

    async def _read_ready(self, proc: trio.Process) -> DraftReady:
        line = b""
        assert proc.stdout is not None  # spawned with its stdout piped to us
        with trio.move_on_after(DRAFT_READY_TIMEOUT_S):
            while b"\n" not in line:
                chunk = await proc.stdout.receive_some(MAX_READY_LINE_BYTES)
                if not chunk:
                    raise ChildNotReady(f"draft server exited while loading (see {self.logfile})")
                line += chunk
                if len(line) > MAX_READY_LINE_BYTES:
                    raise ChildNotReady("draft server's ready line is too long")
            try:
                return parse_ready_line(line.split(b"\n", 1)[0])
            except WireError as exc:
                raise ChildNotReady(str(exc)) from None
        raise ChildNotReady(f"draft server not ready after {DRAFT_READY_TIMEOUT_S:.0f} s (see {self.logfile})")

    def _on_ready(self, ready: DraftReady) -> None:
        self.endpoint = f"127.0.0.1:{ready.port}"
        log.info("event=draft_server_ready model=%s endpoint=%s pid=%s", self.model.id, self.endpoint, self.pid)

    def _gone(self) -> None:
        self.endpoint = None

    def status(self) -> dict:
        return {
            "model": self.model.id,
            "state": self.state.value,
            "endpoint": self.endpoint,
            "pid": self.pid,
            "restarts": self.restarts,
            "last_error": self.last_error,
        }


class SpeculationMode(str, enum.Enum):
    """How this node's runners speculate: not at all, with an in-process draft, or over the mesh."""

    OFF = "off"
    LOCAL = "local"
    MESH = "mesh"


@dataclass(frozen=True)
class DraftPeer:
    """An alive peer that serves a draft model the runners may use."""

    peer: str
    draft: str


@dataclass(frozen=True)
class SpeculationStatus:
    """``/api/status`` ``speculation``."""

    strategy: str
    mode: SpeculationMode
    wanted_draft: str | None
    draft_endpoint: str | None
    local_draft: str | None
    draft_peers: tuple[DraftPeer, ...]
    serving_draft: Mapping[str, Any] | None
    counters: Mapping[str, int]


class SpeculationService:
    """``[defaults.speculative]`` on a node (see the module docstring).

    Built by the composition root from the section, where logs go, the runner thread count and
    the mesh (None without one); the root declares :meth:`handle_stream` as the mesh's ``draft``
    tunnel handler, merges :meth:`announce_extra` into our announcement and shows :meth:`status`.
    """

    def __init__(
        self,
        section: SpeculationSettings,
        *,
        log_dir: Path,
        threads: int,
        mesh: PeerView | None,
        run_dir: Path | None = None,
    ) -> None:
        sec = self.section = section
        self.mesh = mesh
        self.strategy = sec.strategy
        self.server: DraftServerProcess | None = None
        self.local_draft: ModelRef | None = None
        self.wanted = ""  # the draft model id a mesh target looks for ("" = any)
        self.counters = {
            "tunnels_served": 0,
            "tunnels_refused": 0,
            "tunnels_opened": 0,
            "no_draft_peer": 0,
            "tunnel_failures": 0,
        }
        if sec.serve_draft:
            self.server = DraftServerProcess(
                _resolve(sec.serve_draft, "serve_draft"),
                log_dir / "draft-server.log",
                threads=threads or 1,
                pidfile=run_dir / "draft-server.pid" if run_dir is not None else None,
            )
        self.mode = self._choose_mode(sec, has_mesh=mesh is not None)
        if self.mode is SpeculationMode.MESH:
            self.wanted = sec.draft_model
        self._listen_sock: socket.socket | None = None
        self.endpoint = ""
        if self.mode is SpeculationMode.MESH:
            self._listen_sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self._listen_sock.bind(("127.0.0.1", 0))
            self._listen_sock.listen(MAX_DRAFT_CONNECTIONS)
            self.endpoint = f"127.0.0.1:{self._listen_sock.getsockname()[1]}"

    def _choose_mode(self, sec: SpeculationSettings, *, has_mesh: bool) -> SpeculationMode:
        """The strategy made concrete; sets ``local_draft`` for an in-process draft."""
        if sec.strategy == "auto":
            if sec.draft_model:
                try:
                    self.local_draft = resolve_model(sec.draft_model)
                    return SpeculationMode.LOCAL
                except ModelNotFound:
                    pass
            return SpeculationMode.MESH if has_mesh else SpeculationMode.OFF
        if sec.strategy == "local":
            self.local_draft = _resolve(sec.draft_model, "draft_model")
            return SpeculationMode.LOCAL
        if sec.strategy == "mesh":
            if has_mesh:
                return SpeculationMode.MESH
            log.warning("event=speculation_off reason=no_mesh strategy=mesh")
        return SpeculationMode.OFF

    # ---- what runners get ---------------------------------------------------------------
    def runner_argv(self) -> tuple[str, ...]:
        s = self.section
        kw: dict[str, Any] = dict(
            min_tokens=s.draft_min_tokens,
            max_tokens=s.draft_max_tokens,
            min_acceptance=s.min_acceptance,
            min_speedup=s.min_predicted_speedup,
        )
        if self.mode is SpeculationMode.MESH:
            return tuple(argv_for(endpoint=self.endpoint, **kw))
        if self.mode is SpeculationMode.LOCAL:
            assert self.local_draft is not None  # resolved with the mode
            return tuple(argv_for(model=str(self.local_draft.path), **kw))
        return ()

    # ---- lifecycle ----------------------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[SpeculationService] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            if self.server is not None:
                nursery.start_soon(self.server.run)
            if self._listen_sock is not None:
                listener = trio.SocketListener(trio.socket.from_stdlib_socket(self._listen_sock))
                nursery.start_soon(self._accept_loop, listener)
            task_status.started(self)
            await trio.sleep_forever()

    def announce_extra(self) -> dict:
        """``{"draft": model id}`` for our announcement while our draft server is ready, else ``{}``."""
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
        mesh = self.mesh
        if mesh is None:
            return []
        states = mesh.member_states(trio.current_time())
        found = []
        for peer_id, ann in mesh.members().items():
            draft = dict(ann.extra).get("draft") if ann is not None else None
            if states.get(peer_id) != "alive" or not isinstance(draft, str) or (self.wanted and draft != self.wanted):
                continue
            rtt = link_rtt_ms(mesh, peer_id)
            rtt = float("inf") if rtt is None else rtt
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
            server = self.server
            own = server.endpoint if server is not None else None
            if server is not None and own is not None and (not self.wanted or self.wanted == server.model.id):
                local = await self._connect_local(own)
                if local is not None:
                    await _splice_tcp(tcp, local)
                    return
            for peer_id, _draft in self.draft_peers():
                assert self.mesh is not None  # draft peers come from the mesh
                try:
                    with trio.fail_after(PEER_OPEN_TIMEOUT_S):
                        link = await self.mesh.link_to(peer_id)
                    async with link.open_stream({"kind": "tunnel", "service": DRAFT_SERVICE}) as stream:
                        self.counters["tunnels_opened"] += 1
                        await splice(tcp, stream)
                    return
                except (MeshError, StreamReset, LinkClosed, trio.TooSlowError) + TCP_ERRORS as exc:
                    self.counters["tunnel_failures"] += 1
                    log.info("event=draft_tunnel_failed peer=%s error=%r", peer_id[:16], exc)
                    break  # the runner finishes this request alone; the next one tries again
            else:
                self.counters["no_draft_peer"] += 1
            with trio.CancelScope(shield=True):
                await tcp.aclose()

    def status(self) -> SpeculationStatus:
        return SpeculationStatus(
            strategy=self.strategy,
            mode=self.mode,
            wanted_draft=self.wanted or None,
            draft_endpoint=self.endpoint or None,
            local_draft=str(self.local_draft.path) if self.local_draft is not None else None,
            draft_peers=tuple(DraftPeer(pid[:16], d) for pid, d in self.draft_peers()),
            serving_draft=self.server.status() if self.server is not None else None,
            counters=dict(self.counters),
        )


async def _splice_tcp(a: trio.SocketStream, b: trio.SocketStream) -> None:
    """Pump bytes both ways between two local TCP connections until either side ends."""
    async with trio.open_nursery() as nursery:

        async def pump(src, dst) -> None:
            try:
                while data := await src.receive_some(65536):
                    await dst.send_all(data)
            except TCP_ERRORS:
                pass
            nursery.cancel_scope.cancel()

        nursery.start_soon(pump, a, b)
        nursery.start_soon(pump, b, a)
    with trio.CancelScope(shield=True):
        await a.aclose()
        await b.aclose()
