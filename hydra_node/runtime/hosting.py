"""Hosting models on a node: placement (local or split over mesh RPC workers), the
node's own RPC worker, tunnels, leases, hot swap.

``ModelRuntime`` is created by the node.  Its parts:

* **The node's RPC worker** (every ``serve`` node unless ``--no-rpc-worker``): an
  ``RpcWorkerSupervisor`` on 127.0.0.1, its capacity announced in gossip
  (``Announcement.rpc`` = ``RpcCapacity(free_bytes, device)``, ``extra["rpc_proto"]``,
  ``extra["rpc_lease"]`` = the lease holder), reachable by others only through
  ``tunnel``/``rpc`` streams (:class:`~hydra_node.runtime.rpc.tunnel.RpcTunnelServer`).
* **Hosted models** (:class:`HostedModel`): one ``RunnerSupervisor`` each, whose
  ``prepare`` hook places the model before every spawn: locally when it fits the host's
  usable memory (``--max-memory`` caps it) and no ``--split`` forces a split; otherwise
  over remote workers chosen by ``plan_split`` (RTT of the peer link, free memory from
  gossip), each reached through a :class:`RemoteWorkerTunnel` holding its lease.  A
  runner that dies (llama.cpp aborts when a worker dies) is replanned and restarted;
  split runners get a stall bound so a stalled tunnel cannot hang a request.
* **Hot swap**: :meth:`ModelRuntime.load` / :meth:`ModelRuntime.unload` on a running
  node (``POST /api/runtime/models``, ``DELETE /api/runtime/models/{id}``, ``hydra-node
  swap``); RPC workers stay up across swaps.
"""

from __future__ import annotations

import dataclasses
import logging
from functools import partial
import os
import time

import trio

from hydra_node.models import ModelRef
from hydra_node.runtime.hosting_cli import DEFAULT_SPLIT_STALL_TIMEOUT_S, SWAP_WAIT_DEFAULT_S  # noqa: F401
from hydra_node.runtime.rpc._proto import RPC_PROTO, ProtoVersion
from hydra_node.runtime.rpc.gguf_meta import GgufError, layer_count
from hydra_node.runtime.rpc.plan import Capacity, PlanError, SplitPlan, WorkerInfo, plan_split
from hydra_node.runtime.rpc.supervisor import RpcWorkerSupervisor, WorkerFailed, WorkerState
from hydra_node.runtime.rpc.tunnel import TUNNEL_SERVICE, LeasedWorker, RemoteWorkerTunnel, RpcTunnelServer, TunnelError
from hydra_node.runtime.supervisor import RunnerLoadError, RunnerSettings, RunnerSupervisor

log = logging.getLogger("hydra.hosting")

#: Plans tried per placement before waiting (each failed lease excludes one worker).
MAX_PLACEMENT_ATTEMPTS = 4
#: Waiting between placements when nothing fits (no usable workers yet), doubling up to the max.
PLACEMENT_RETRY_INITIAL_S = 0.5
PLACEMENT_RETRY_MAX_S = 10.0
#: A split model's first load is retried this many times (a worker can vanish during a load).
MAX_SPLIT_LOAD_ATTEMPTS = 3
#: How often the worker's state and capacity are checked.
WORKER_MONITOR_S = 0.5
#: How long a forced split's first placement waits for gossip to show a usable worker.
WORKER_DISCOVERY_WAIT_S = 10.0
#: RTT assumed for a peer whose link has not measured one yet.
UNKNOWN_RTT_MS = 50.0
#: Bound on an unload (runner terminate → grace → kill is ~3 s).
UNLOAD_TIMEOUT_S = 10.0
#: Longest lease tag (a model id).
MAX_TAG_CHARS = 128


class ModelConflict(Exception):
    """A model with this id is already hosted here."""


class UnknownModel(Exception):
    """No hosted model has this id."""


class HostedModel:
    """One model on this node: its runner supervisor and, for splits, its tunnels and plan."""

    def __init__(self, runtime: "ModelRuntime", model: ModelRef, *, force_split: bool):
        self.runtime = runtime
        self.model = model
        self.force_split = force_split
        self.size_bytes = model.size_bytes
        try:
            self.n_layers: int | None = layer_count(model.path)
        except GgufError as exc:
            log.warning("event=gguf_unreadable model=%s error=%r action=never_split", model.id, exc)
            self.n_layers = None
        node = runtime.node
        self.sup = RunnerSupervisor(model, node.home, node.runner_settings(), node_id=node.node_id,
                                    prepare=self._prepare, on_failed=self._drop_tunnels)
        self.scope = trio.CancelScope()
        self.done = trio.Event()
        self.plan: SplitPlan | None = None
        self.fallback = False
        self.placement_error: str | None = None
        self.placements = 0
        self.tunnels: list[tuple[RemoteWorkerTunnel, LeasedWorker]] = []
        self.ignored: list[tuple[str, str]] = []
        self._nursery: trio.Nursery | None = None
        self._tunnel_scope: trio.CancelScope | None = None
        self._tunnels_done: trio.Event | None = None
        self._discovery_deadline: float | None = None

    @property
    def lease_tag(self) -> str:
        return self.model.id[:MAX_TAG_CHARS]

    def fits_locally(self) -> bool:
        """True when the model can start before the mesh is up (no split wanted or needed)."""
        if self.force_split or self.n_layers is None:
            return not self.force_split
        try:
            return not plan_split(self.size_bytes, self.n_layers, self._host(), []).split
        except PlanError:
            return False

    # ---- lifecycle -------------------------------------------------------------
    async def run(self, *, strict: bool = False, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Host the model until cancelled (``self.scope``).  ``strict``: a failed first load
        raises :class:`RunnerLoadError` (start-up); otherwise the model stays listed as failed."""
        node = self.runtime.node
        node.local.runners[self.model.id] = self.sup
        try:
            with self.scope:
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    if not strict:
                        task_status.started(self)
                    attempts = 0
                    while True:
                        try:
                            await self.sup.run(task_status=task_status if strict else trio.TASK_STATUS_IGNORED)
                        except RunnerLoadError as exc:
                            attempts += 1
                            split = self.plan is not None and self.plan.split
                            if strict and not split:
                                raise
                            if split and attempts < MAX_SPLIT_LOAD_ATTEMPTS:
                                log.warning("event=split_load_retry model=%s attempt=%d error=%r",
                                            self.model.id, attempts, str(exc))
                                continue
                            self.sup.last_error = str(exc)
                            log.error("event=model_failed model=%s error=%r", self.model.id, str(exc))
                        break
                    await self._drop_tunnels()
                    self.sup.state = "failed"
                    await trio.sleep_forever()
        finally:
            if node.local.runners.get(self.model.id) is self.sup:
                del node.local.runners[self.model.id]
            self.done.set()

    async def _prepare(self) -> RunnerSettings:
        """Before every spawn: drop the old plan's tunnels, place again, open new tunnels."""
        await self._drop_tunnels()
        delay = PLACEMENT_RETRY_INITIAL_S
        while True:
            try:
                return await self._place()
            except PlanError as exc:
                if self.runtime.node.mesh is None:
                    raise RunnerLoadError(f"model {self.model.id!r} does not fit this node and there is no mesh "
                                          f"to split it over: {exc}") from None
                self.sup.state = "placing"
                self.placement_error = str(exc)
                self.sup.last_error = f"no placement: {exc}"
                log.warning("event=placement_failed model=%s retry_in_s=%.1f error=%r", self.model.id, delay, str(exc))
                await trio.sleep(delay)
                delay = min(delay * 2, PLACEMENT_RETRY_MAX_S)

    def _waiting_for_workers(self) -> bool:
        """A node that just joined learns the mesh's workers from gossip in a moment: a forced
        split waits for them (bounded) before its first load falls back to unsplit."""
        if self.sup.restarts or self.plan is not None:
            return False
        if self._discovery_deadline is None:
            self._discovery_deadline = trio.current_time() + WORKER_DISCOVERY_WAIT_S
        return trio.current_time() < self._discovery_deadline

    def _host(self) -> Capacity:
        return Capacity(self.runtime.host_free_bytes(exclude=self.model.id))

    async def _place(self) -> RunnerSettings:
        base = self.runtime.node.runner_settings()
        self.placements += 1
        if self.n_layers is None:
            self.plan, self.fallback, self.placement_error = None, False, None
            return base
        excluded: set[str] = set()
        failures: list[tuple[str, str]] = []
        for _ in range(MAX_PLACEMENT_ATTEMPTS):
            workers, ignored = self.runtime.remote_workers(excluded, self.lease_tag)
            self.ignored = ignored + failures
            host = self._host()
            fallback = False
            try:
                plan = plan_split(self.size_bytes, self.n_layers, host, workers, force_split=self.force_split)
            except PlanError as exc:
                if not self.force_split:
                    raise
                if self._waiting_for_workers():
                    raise PlanError(f"no usable RPC worker known yet ({exc}); waiting up to "
                                    f"{WORKER_DISCOVERY_WAIT_S:.0f} s before hosting it unsplit") from None
                plan = plan_split(self.size_bytes, self.n_layers, host, [])  # fall back to local when it fits
                fallback = True
            if not plan.split:
                self.plan, self.fallback, self.placement_error = plan, fallback, None
                log.info("event=placement model=%s split=false fallback=%s", self.model.id, fallback)
                return base
            peers = [ep.removeprefix("peer:") for ep in plan.rpc_endpoints]
            try:
                leased = await self._nursery.start(self._hold_tunnels, peers)
            except TunnelError as exc:
                excluded.add(exc.peer_id)
                failures.append((exc.peer_id, str(exc)))
                self.ignored.append((exc.peer_id, str(exc)))
                log.warning("event=tunnel_failed model=%s peer=%s code=%s error=%r", self.model.id,
                            exc.peer_id[:16], exc.code, str(exc))
                continue
            self.plan, self.fallback, self.placement_error = plan, False, None
            log.info("event=placement model=%s split=true layers=%s", self.model.id,
                     ",".join(f"{d.worker_id[:8] if d.worker_id else 'host'}:{d.first_block}-{d.stop_block}"
                              for d in plan.devices))
            return dataclasses.replace(base, rpc_endpoints=tuple(w.endpoint for w in leased),
                                       tensor_split=plan.tensor_split, n_gpu_layers=plan.n_gpu_layers,
                                       output_on_host=plan.output_on_host,
                                       stall_timeout_s=self.runtime.stall_timeout_s)
        raise PlanError(f"no usable workers after {MAX_PLACEMENT_ATTEMPTS} attempts "
                        f"({'; '.join(why for _, why in self.ignored[-MAX_PLACEMENT_ATTEMPTS:])})")

    async def _hold_tunnels(self, peers: list[str], *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Lease every worker of a plan (in plan order) and keep the tunnels until cancelled."""
        failure: TunnelError | None = None
        done = self._tunnels_done = trio.Event()
        try:
            with trio.CancelScope() as scope:
                self._tunnel_scope = scope
                async with trio.open_nursery() as nursery:
                    opened: list[tuple[RemoteWorkerTunnel, LeasedWorker]] = []
                    for peer in peers:
                        tunnel = RemoteWorkerTunnel(self.runtime.node.mesh, peer, tag=self.lease_tag)
                        try:
                            opened.append((tunnel, await nursery.start(tunnel.run)))
                        except TunnelError as exc:
                            failure = exc
                            nursery.cancel_scope.cancel()
                            break
                    if failure is None:
                        self.tunnels = opened
                        task_status.started([w for _, w in opened])
                        await trio.sleep_forever()
        finally:
            self.tunnels = []
            done.set()
        if failure is not None:
            raise failure

    async def _drop_tunnels(self) -> None:
        if self._tunnel_scope is not None:
            self._tunnel_scope.cancel()
            with trio.CancelScope(shield=True), trio.move_on_after(UNLOAD_TIMEOUT_S):
                await self._tunnels_done.wait()
            self._tunnel_scope = None

    # ---- status ----------------------------------------------------------------
    def status(self) -> dict:
        plan = self.plan
        out = {"model": self.model.id, "state": self.sup.state, "force_split": self.force_split,
               "split": bool(plan and plan.split), "fallback_local": self.fallback,
               "placements": self.placements, "placement_error": self.placement_error,
               "size_bytes": self.size_bytes, "n_layers": self.n_layers,
               "ignored_workers": [{"peer": p, "reason": r} for p, r in self.ignored[-8:]]}
        if plan is not None:
            p = plan.to_status()
            tunnels = {w.peer_id: (t, w) for t, w in self.tunnels}
            for d in p["devices"]:
                peer = d["worker_id"]
                d["peer"] = peer if peer else self.runtime.node.node_id
                if peer in tunnels:
                    t, w = tunnels[peer]
                    d["endpoint"] = w.endpoint
                    d["tunnel"] = {"connections": t.connections, "data_connections": t.data_connections,
                                   "data_fallback": t.data_fallback,
                                   "bytes_up": t.bytes_up, "bytes_down": t.bytes_down,
                                   "worker_proto": str(w.proto), "worker_free_bytes": w.free_bytes}
            out["plan"] = p
        return out


class ModelRuntime:
    """The node's hosted models and RPC worker (see the module docstring)."""

    def __init__(self, node):
        self.node = node
        cfg = node.config
        self.force_split = bool(getattr(cfg, "force_split", False))
        self.stall_timeout_s = float(getattr(cfg, "split_stall_timeout_s", DEFAULT_SPLIT_STALL_TIMEOUT_S))
        self.want_worker = bool(getattr(cfg, "rpc_worker", True)) and cfg.role != "client"
        self.hosted: dict[str, HostedModel] = {}
        self.worker: RpcWorkerSupervisor | None = None
        self.worker_error: str | None = None
        self.tunnel_server = RpcTunnelServer(f"{node.node_id[:16]}/rpc", self._worker_info)
        self._deferred: list[ModelRef] = []
        self._nursery: trio.Nursery | None = None
        self._seen_restarts = 0
        from hydra_node.runtime.hosting_api import install_routes
        install_routes(node, self)
        node.add_status_section("splits", self.splits_status)
        node.add_status_section("rpc_worker", self.worker_status)
        if node.mesh is not None:
            node.mesh.tunnel_handlers[TUNNEL_SERVICE] = self.tunnel_server.handle
            node.mesh.extra_sources.append(lambda: self.rpc_announcement()[1])

    # ---- start-up ----------------------------------------------------------------
    async def start_model(self, nursery: trio.Nursery, model: ModelRef) -> None:
        """At start-up: host ``model`` now if it fits here, else after the mesh is up (:meth:`run`).
        A local model that fails its first load raises :class:`RunnerLoadError`."""
        hosted = HostedModel(self, model, force_split=self.force_split)
        if hosted.fits_locally() or self.node.mesh is None:
            self.hosted[model.id] = hosted
            await nursery.start(partial(hosted.run, strict=True))
        else:
            log.info("event=model_deferred model=%s reason=%s", model.id,
                     "split forced" if self.force_split else "does not fit this host")
            self._deferred.append(model)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Start the RPC worker (in the background) and the models that wait for the mesh."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            if self.want_worker:
                nursery.start_soon(self._run_worker)
                if self.node.mesh is not None:
                    await nursery.start(self._serve_tunnel_data)
            task_status.started(self)
            for model in self._deferred:
                await self.load(model, force_split=self.force_split)
            self._deferred.clear()
            await trio.sleep_forever()

    async def _serve_tunnel_data(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """The data port of this node's tunnels; without it coordinators use the link stream."""
        host, port = self.node.mesh.settings.listen_host, int(getattr(self.node.config, "tunnel_port", 0) or 0)
        try:
            await self.tunnel_server.serve_data(host, port, task_status=task_status)
        except OSError as exc:
            log.warning("event=tunnel_data_port_failed host=%s error=%r (tunnels use the mesh link)", host, exc)
            task_status.started()

    # ---- the node's own worker ---------------------------------------------------------
    def _worker_cap(self) -> int:
        hw = self.node.hardware()
        return int(self.node.config.max_memory_bytes or hw["usable_bytes"] or hw["ram_bytes"])

    async def _run_worker(self) -> None:
        threads = self.node.runner_settings().threads or max(1, (os.cpu_count() or 2) // 2)
        self.worker = RpcWorkerSupervisor(threads=threads, max_memory_bytes=self._worker_cap() or None)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._monitor_worker)
            try:
                await self.worker.run()
            except WorkerFailed as exc:
                self.worker_error = str(exc)
                log.error("event=rpc_worker_failed error=%r", str(exc))
            nursery.cancel_scope.cancel()

    async def _monitor_worker(self) -> None:
        while True:
            st = self.worker.statistics()
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

    def rpc_announcement(self):
        """``(RpcCapacity | None, extra)`` for this node's gossip announcement."""
        from hydra_node.mesh.membership_announcement import RpcCapacity

        info = self._worker_info()
        if info is None:
            return None, {}
        _, proto, free, device = info
        return RpcCapacity(free, device[:64]), {"rpc_proto": proto, "rpc_lease": self.tunnel_server.holder() or ""}

    # ---- what placement sees -------------------------------------------------------------
    def host_free_bytes(self, exclude: str | None = None) -> int:
        usable = int(self.node.hardware()["usable_bytes"])
        others = sum(h.size_bytes for mid, h in self.hosted.items() if mid != exclude)
        return max(0, usable - others)

    def remote_workers(self, excluded: set[str], tag: str) -> tuple[list[WorkerInfo], list[tuple[str, str]]]:
        """Workers announced by alive peers (``endpoint`` = ``peer:<id>``), and those ignored, why."""
        mesh = self.node.mesh
        if mesh is None or mesh.membership is None:
            return [], []
        me = f"{self.node.node_id}/{tag}"
        states = {p.peer_id: p.state for p in mesh.membership.statistics(trio.current_time()).peers}
        out, ignored = [], []
        for peer_id, ann in mesh.membership.members().items():
            if peer_id == self.node.node_id or ann is None or ann.rpc is None or peer_id in excluded:
                continue
            if states.get(peer_id) != "alive":
                ignored.append((peer_id, f"peer is {states.get(peer_id)}"))
                continue
            holder = ann.extra.get("rpc_lease") or ""
            if holder and holder != me:
                ignored.append((peer_id, f"leased to {str(holder)[:16]}"))
                continue
            try:
                proto = ProtoVersion.parse(ann.extra.get("rpc_proto"))
            except ValueError as exc:
                ignored.append((peer_id, f"bad RPC protocol version: {exc}"))
                continue
            link = mesh.links.get(peer_id)
            rtt = link.rtt_ms if link is not None and link.rtt_ms is not None else UNKNOWN_RTT_MS
            out.append(WorkerInfo(peer_id, f"peer:{peer_id}", proto, ann.rpc.free_bytes, float(rtt),
                                  ann.rpc.device or "CPU"))
        return out, ignored

    # ---- hot swap ------------------------------------------------------------------------
    async def load(self, model: ModelRef, *, force_split: bool | None = None) -> HostedModel:
        """Host ``model`` on the running node; returns at once (the model loads in the background)."""
        if model.id in self.node.local.runners:
            raise ModelConflict(f"model {model.id!r} is already hosted on this node")
        if self._nursery is None:
            raise RuntimeError("the model runtime is not running yet")
        hosted = HostedModel(self, model, force_split=self.force_split if force_split is None else force_split)
        self.hosted[model.id] = hosted
        log.info("event=model_load model=%s path=%s", model.id, model.path)
        await self._nursery.start(hosted.run)
        return hosted

    async def unload(self, model_id: str) -> None:
        hosted = self.hosted.get(model_id)
        if hosted is None:
            raise UnknownModel(f"model {model_id!r} is not hosted on this node")
        log.info("event=model_unload model=%s", model_id)
        hosted.scope.cancel()
        with trio.move_on_after(UNLOAD_TIMEOUT_S):
            await hosted.done.wait()
        if self.hosted.get(model_id) is hosted:
            del self.hosted[model_id]

    async def wait_ready(self, model_id: str, timeout_s: float) -> str:
        """Wait (bounded) until the model is ready or failed; return its state."""
        hosted = self.hosted.get(model_id)
        if hosted is None:
            raise UnknownModel(f"model {model_id!r} is not hosted on this node")
        with trio.move_on_after(timeout_s):
            while hosted.sup.state not in ("ready", "failed") and not hosted.done.is_set():
                await trio.sleep(0.1)
        return hosted.sup.state

    # ---- status --------------------------------------------------------------------------
    def splits_status(self) -> dict:
        return {mid: h.status() for mid, h in self.hosted.items()}

    def worker_status(self) -> dict | None:
        if not self.want_worker:
            return {"enabled": False}
        st = self.worker.statistics() if self.worker is not None else None
        lendable = self._worker_info()
        return {"enabled": True, "state": st.state.value if st else "starting", "endpoint": st.endpoint if st else None,
                "proto": st.proto if st else None, "ours": str(RPC_PROTO),
                "free_bytes": st.free_bytes if st else 0, "lendable_bytes": lendable[2] if lendable else 0,
                "device": st.device if st else None, "restarts": st.restarts if st else 0,
                "pid": st.pid if st else None, "last_error": self.worker_error or (st.last_error if st else None),
                "lease": self.tunnel_server.status(), "checked_at": round(time.time(), 1)}
