"""Hosting models on a node: the node's own RPC worker, hosted models, tunnels, leases, hot swap.

``ModelRuntime`` is built by the composition root (``hydra_node/node.py``) from narrow inputs:
:class:`RuntimeSettings`, a ``runner_settings()`` callable, a ``host_memory()`` callable and the
mesh as a :class:`~hydra_node.runtime.peers.PeerView` (or None), and the mapping where hosted models
register their runner supervisors (the root's router source for local targets reads it).  Its parts:

* **The node's RPC worker** (every ``serve`` node unless ``--no-rpc-worker``): an
  ``RpcWorkerSupervisor`` on 127.0.0.1, its capacity announced in gossip
  (:meth:`ModelRuntime.rpc_announcement`: ``Announcement.rpc`` = ``RpcCapacity(free_bytes,
  device)``, ``extra["rpc_proto"]``, ``extra["rpc_lease"]`` = the lease holder), reachable by
  others only through ``tunnel``/``rpc`` streams (``ModelRuntime.tunnel_server.handle``, which the
  root declares as the mesh's ``rpc`` tunnel handler).
* **Hosted models** (:class:`~hydra_node.runtime.hosting.hosted_model.HostedModel`): one
  ``RunnerSupervisor`` each, placed before every spawn by the pure
  :func:`~hydra_node.runtime.hosting.layers.place`: locally when the model fits the host's usable
  memory (``--max-memory`` caps it) and no ``--split`` forces a split; otherwise over remote
  workers, each reached through a ``RemoteWorkerTunnel`` holding its lease.
* **Hot swap**: :meth:`ModelRuntime.load` / :meth:`ModelRuntime.unload` on a running node (the
  management routes in ``hydra_node/admin/runtime.py``, ``hydra-node swap``); RPC workers
  stay up across swaps.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import trio

from hydra_node.eventlog import EmitFn
from hydra_node.listen import ListenError, ListenPurpose, bind_tcp, close_listeners
from hydra_node.mesh.membership.announcement import RpcCapacity
from hydra_node.models import MAX_HOSTED_MODELS, ModelRef
from hydra_node.runtime.hosting.hosted_model import UNLOAD_TIMEOUT_S, HostedModel, HostedModelStatus
from hydra_node.runtime.peers import PeerView, link_rtt_ms
from hydra_node.runtime.hosting.layers import IgnoredWorker, usable_workers
from hydra_node.runtime.rpc import RPC_PROTO
from hydra_node.runtime.rpc.plan import WorkerInfo
from hydra_node.runtime.rpc.supervisor import RpcWorkerSupervisor, WorkerFailed, WorkerState
from hydra_node.runtime.rpc.tunnel import RpcTunnelServer
from hydra_node.runtime.runner.records import RunnerSettings, RunnerState
from hydra_node.runtime.runner.state_events import RunnerEvents
from hydra_node.runtime.runner.supervisor import RunnerSupervisor

__all__ = [
    "DEFAULT_SPLIT_STALL_TIMEOUT_S",
    "SWAP_WAIT_DEFAULT_S",
    "HostMemory",
    "ModelConflict",
    "ModelNotHosted",
    "ModelRuntime",
    "RpcWorkerOff",
    "RpcWorkerStatus",
    "RuntimeSettings",
]

log = logging.getLogger("hydra.hosting")

#: Default bound on silence from a split runner during a generation (tokens, or prompt processing).
DEFAULT_SPLIT_STALL_TIMEOUT_S = 60.0
#: Bound on waiting for a hot-swapped model to become ready when the caller asks to wait.
SWAP_WAIT_DEFAULT_S = 120.0
#: How often the worker's state and capacity are checked.
WORKER_MONITOR_S = 0.5
#: How often :meth:`ModelRuntime.wait_ready` looks at a loading model's state.
READY_POLL_S = 0.1
#: The tunnel data port, as a port-in-use error names it.
TUNNEL_PORT = ListenPurpose("the data port of RPC tunnels", "--tunnel-port")


class ModelConflict(Exception):
    """A model with this id is already hosted here."""


class ModelNotHosted(Exception):
    """No hosted model has this id."""


class TooManyModels(Exception):
    """The node hosts MAX_HOSTED_MODELS models already."""


@dataclass(frozen=True)
class RuntimeSettings:
    """What the runtime needs of the node's configuration."""

    node_id: str
    home: Path
    force_split: bool = False
    stall_timeout_s: float = DEFAULT_SPLIT_STALL_TIMEOUT_S
    rpc_worker: bool = True
    tunnel_port: int = 0
    max_memory_bytes: int | None = None


@dataclass(frozen=True)
class HostMemory:
    """The host's memory: total RAM and what this node may use (safety margin and ``--max-memory`` applied)."""

    ram_bytes: int
    usable_bytes: int

    @classmethod
    def budget(
        cls, ram_bytes: int, available_bytes: int, *, safety_margin_bytes: int = 0, max_memory_bytes: int | None = None
    ) -> HostMemory:
        """What placement may fill: the available memory less ``[defaults.hardware].safety_margin_gb``,
        capped by ``--max-memory`` (which alone counts when the available memory is unknown, 0)."""
        if safety_margin_bytes < 0:
            raise ValueError("safety_margin_bytes must be >= 0")
        usable = max(0, available_bytes - safety_margin_bytes) if available_bytes else 0
        if max_memory_bytes:
            usable = min(usable, max_memory_bytes) if available_bytes else max_memory_bytes
        return cls(ram_bytes=ram_bytes, usable_bytes=usable)


@dataclass(frozen=True)
class RpcWorkerOff:
    """``/api/status`` ``rpc_worker`` of a node that runs no RPC worker (``--no-rpc-worker``, clients)."""

    enabled: bool = False


@dataclass(frozen=True, kw_only=True)
class RpcWorkerStatus:
    """The node's RPC worker, as ``/api/status`` ``rpc_worker`` shows it."""

    enabled: bool = True
    state: str
    endpoint: str | None
    proto: str | None
    ours: str
    free_bytes: int
    lendable_bytes: int
    device: str | None
    restarts: int
    pid: int | None
    last_error: str | None
    lease: Mapping[str, Any]
    checked_at: float
    leases: tuple[Any, ...] = ()  # rpc/lease.py LeaseRow: coordinator node id, model, since, bytes


class ModelRuntime:
    """The node's hosted models and RPC worker (see the module docstring)."""

    def __init__(
        self,
        settings: RuntimeSettings,
        *,
        runners: MutableMapping[str, RunnerSupervisor],
        runner_settings: Callable[[], RunnerSettings],
        host_memory: Callable[[], HostMemory],
        mesh: PeerView | None,
        on_event: EmitFn | None = None,
    ):
        """``runners``: where each hosted model's runner supervisor is registered (by model id) while
        it is hosted; the root's local router targets read it.  ``on_event``: the live events of the
        hosted models (runner/state_events.py)."""
        self.settings = settings
        self.runner_settings = runner_settings
        self.host_memory = host_memory
        self.mesh = mesh
        self.want_worker = settings.rpc_worker
        self.hosted: dict[str, HostedModel] = {}
        self.runners = runners
        self.runner_events = RunnerEvents(settings.node_id, on_event)
        #: ``(model, direction, bytes, ms)`` of every KV export/import of a hosted runner (set by the root).
        self.on_kv_transfer: Callable[[str, str, int, float], None] | None = None
        self.worker: RpcWorkerSupervisor | None = None
        self.worker_error: str | None = None
        self.tunnel_server = RpcTunnelServer(f"{settings.node_id[:16]}/rpc", self._worker_info)
        self._deferred: list[ModelRef] = []
        #: The tunnel data port :meth:`bind` bound (served by run); ``_tunnel_off``: bind() could not bind it.
        self._tunnel_listeners: list[trio.SocketListener] | None = None
        self._tunnel_off = False
        self._nursery: trio.Nursery | None = None
        self._seen_restarts = 0

    # ---- start-up ----------------------------------------------------------------
    async def start_model(self, nursery: trio.Nursery, model: ModelRef) -> None:
        """At start-up: host ``model`` now if it fits here, else after the mesh is up (:meth:`run`).
        A local model that fails its first load raises :class:`RunnerLoadError`."""
        hosted = HostedModel(self, model, force_split=self.settings.force_split)
        if hosted.fits_locally() or self.mesh is None:
            self.hosted[model.id] = hosted
            await nursery.start(partial(hosted.run, strict=True))
        else:
            log.info(
                "event=model_deferred model=%s reason=%s",
                model.id,
                "split forced" if self.settings.force_split else "does not fit this host",
            )
            self._deferred.append(model)

    async def bind(self) -> None:
        """Bind the tunnel data port now (served by :meth:`run`), before the node joins a mesh: an explicit
        ``--tunnel-port`` that cannot be bound fails the start (:class:`~hydra_node.listen.PortInUse`);
        any free port (0) that cannot be bound leaves the tunnels on the mesh link, as before."""
        if not (self.want_worker and self.mesh is not None):
            return
        try:
            self._tunnel_listeners = await bind_tcp(self.mesh.listen_host, self.settings.tunnel_port, TUNNEL_PORT)
        except ListenError as exc:
            if self.settings.tunnel_port:
                raise
            log.warning(
                "event=tunnel_data_port_failed host=%s error=%r (tunnels use the mesh link)",
                self.mesh.listen_host,
                str(exc),
            )
            self._tunnel_off = True

    def close_unserved(self) -> None:
        """Close the tunnel data port :meth:`bind` bound if :meth:`run` never served it."""
        close_listeners(self._tunnel_listeners)
        self._tunnel_listeners = None

    async def run(self, *, task_status: trio.TaskStatus[ModelRuntime] = trio.TASK_STATUS_IGNORED) -> None:
        """Start the RPC worker (in the background) and the models that wait for the mesh."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            if self.want_worker:
                nursery.start_soon(self._run_worker)
                if self.mesh is not None:
                    await nursery.start(self._serve_tunnel_data)
            task_status.started(self)
            for model in self._deferred:
                await self.load(model, force_split=self.settings.force_split)
            self._deferred.clear()
            await trio.sleep_forever()

    async def _serve_tunnel_data(self, *, task_status: trio.TaskStatus[int | None] = trio.TASK_STATUS_IGNORED) -> None:
        """The data port of this node's tunnels (bound by :meth:`bind`, else here); without it
        coordinators use the link stream."""
        assert self.mesh is not None  # run() starts this only in a mesh
        host, port = self.mesh.listen_host, self.settings.tunnel_port
        if self._tunnel_off:  # bind() could not bind it, and said so
            task_status.started()
            return
        listeners, self._tunnel_listeners = self._tunnel_listeners, None
        try:
            await self.tunnel_server.serve_data(host, port, listeners=listeners, task_status=task_status)
        except OSError as exc:
            log.warning("event=tunnel_data_port_failed host=%s error=%r (tunnels use the mesh link)", host, exc)
            task_status.started()

    # ---- the node's own worker ---------------------------------------------------------
    def _worker_cap(self) -> int:
        mem = self.host_memory()
        return int(self.settings.max_memory_bytes or mem.usable_bytes or mem.ram_bytes)

    async def _run_worker(self) -> None:
        threads = self.runner_settings().threads or max(1, (os.cpu_count() or 2) // 2)
        self.worker = RpcWorkerSupervisor(
            threads=threads,
            max_memory_bytes=self._worker_cap() or None,
            pidfile=self.settings.home / "run" / "rpc-worker.pid",
        )
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._monitor_worker)
            try:
                await self.worker.run()
            except WorkerFailed as exc:
                self.worker_error = str(exc)
                log.error("event=rpc_worker_failed error=%r", str(exc))
            nursery.cancel_scope.cancel()

    async def _monitor_worker(self) -> None:
        worker = self.worker
        assert worker is not None  # started by _run_worker once the worker exists
        while True:
            st = worker.statistics()
            if st.restarts != self._seen_restarts:
                self._seen_restarts = st.restarts
                await self.tunnel_server.revoke("the RPC worker restarted; its tensors are gone")
            await trio.sleep(WORKER_MONITOR_S)

    def _worker_info(self) -> tuple[str, str, int, str] | None:
        if self.worker is None:
            return None
        st = self.worker.statistics()
        if st.state is not WorkerState.READY or st.proto is None:
            return None
        return st.endpoint, st.proto, self._lendable(st.free_bytes), st.device or "CPU"

    def _lendable(self, worker_free: int) -> int:
        local = sum(h.size_bytes for h in self.hosted.values())
        return max(0, worker_free - local)

    def vram_bytes(self) -> int:
        """GPU memory of this machine as ggml's device API reports it (the RPC worker computes on
        the first GPU device when there is one); 0 without a GPU or a running worker."""
        if self.worker is None:
            return 0
        st = self.worker.statistics()
        return st.total_bytes if st.device and not st.device.upper().startswith("CPU") else 0

    def rpc_announcement(self) -> tuple[RpcCapacity | None, dict]:
        """``(RpcCapacity | None, extra)`` for this node's gossip announcement."""
        info = self._worker_info()
        if info is None:
            return None, {}
        _, proto, free, device = info
        return RpcCapacity(free, device[:64]), {"rpc_proto": proto, "rpc_lease": self.tunnel_server.holder() or ""}

    # ---- what placement sees -------------------------------------------------------------
    def host_free_bytes(self, exclude: str | None = None) -> int:
        usable = int(self.host_memory().usable_bytes)
        others = sum(h.size_bytes for mid, h in self.hosted.items() if mid != exclude)
        return max(0, usable - others)

    def remote_workers(self, excluded: set[str], tag: str) -> tuple[list[WorkerInfo], list[IgnoredWorker]]:
        """Workers announced by alive peers (``endpoint`` = ``peer:<id>``), and those ignored, why."""
        mesh = self.mesh
        if mesh is None:
            return [], []
        return usable_workers(
            mesh.members(),
            mesh.member_states(trio.current_time()),
            partial(link_rtt_ms, mesh),
            own_node_id=self.settings.node_id,
            lease_holder=f"{self.settings.node_id}/{tag}",
            excluded=excluded,
        )

    # ---- hot swap ------------------------------------------------------------------------
    async def load(self, model: ModelRef, *, force_split: bool | None = None) -> HostedModel:
        """Host ``model`` on the running node; returns at once (the model loads in the background)."""
        if model.id in self.runners:
            raise ModelConflict(f"model {model.id!r} is already hosted on this node")
        if len(self.hosted) >= MAX_HOSTED_MODELS:
            raise TooManyModels(f"this node hosts {len(self.hosted)} models already; the most is {MAX_HOSTED_MODELS}")
        if self._nursery is None:
            raise RuntimeError("the model runtime is not running yet")
        split = self.settings.force_split if force_split is None else force_split
        hosted = HostedModel(self, model, force_split=split)
        self.hosted[model.id] = hosted
        log.info("event=model_load model=%s path=%s", model.id, model.path)
        await self._nursery.start(hosted.run)
        return hosted

    async def unload(self, model_id: str) -> None:
        hosted = self.hosted.get(model_id)
        if hosted is None:
            raise ModelNotHosted(f"model {model_id!r} is not hosted on this node")
        log.info("event=model_unload model=%s", model_id)
        hosted.scope.cancel()
        with trio.move_on_after(UNLOAD_TIMEOUT_S):
            await hosted.done.wait()
        if self.hosted.get(model_id) is hosted:
            del self.hosted[model_id]

    async def wait_ready(self, model_id: str, timeout_s: float) -> RunnerState:
        """Wait (bounded) until the model is ready or failed; return its state."""
        hosted = self.hosted.get(model_id)
        if hosted is None:
            raise ModelNotHosted(f"model {model_id!r} is not hosted on this node")
        with trio.move_on_after(timeout_s):
            while hosted.sup.state not in (RunnerState.READY, RunnerState.FAILED) and not hosted.done.is_set():
                await trio.sleep(READY_POLL_S)
        return hosted.sup.state

    # ---- status --------------------------------------------------------------------------
    def splits_status(self) -> dict[str, HostedModelStatus]:
        return {mid: h.status() for mid, h in self.hosted.items()}

    def worker_status(self) -> RpcWorkerStatus | RpcWorkerOff:
        if not self.want_worker:
            return RpcWorkerOff()
        st = self.worker.statistics() if self.worker is not None else None
        lendable = self._worker_info()
        return RpcWorkerStatus(
            state=st.state.value if st else "starting",
            endpoint=st.endpoint if st else None,
            proto=st.proto if st else None,
            ours=str(RPC_PROTO),
            free_bytes=st.free_bytes if st else 0,
            lendable_bytes=lendable[2] if lendable else 0,
            device=st.device if st else None,
            restarts=st.restarts if st else 0,
            pid=st.pid if st else None,
            last_error=self.worker_error or (st.last_error if st else None),
            lease=self.tunnel_server.status(),
            checked_at=round(time.time(), 1),
            leases=tuple(self.tunnel_server.leases()),
        )
