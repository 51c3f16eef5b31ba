"""One model hosted on this node: its runner supervisor and, for a split, its plan and tunnels.

Before every spawn the runner supervisor calls :meth:`HostedModel._prepare`: drop the old plan's
tunnels, place the model again (:func:`~hydra_node.runtime.hosting.layers.place` over the workers
:func:`~hydra_node.runtime.hosting.layers.usable_workers` finds), lease the planned workers through
:class:`~hydra_node.runtime.rpc.tunnel.RemoteWorkerTunnel`s, and hand the runner its settings.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import trio

from hydra_node.backoff import Backoff
from hydra_node.models import ModelRef
from hydra_node.runtime.peers import PeerView
from hydra_node.runtime.hosting.layers import WORKER_DISCOVERY_WAIT_S, IgnoredWorker, fits_locally, place
from hydra_node.runtime.rpc.gguf_meta import GgufError, layer_count
from hydra_node.runtime.rpc.heal import HealReport, replan_kind
from hydra_node.runtime.rpc.plan import Capacity, PlanError, SplitPlan, WorkerInfo
from hydra_node.runtime.rpc.tunnel import MAX_TAG_CHARS, LeasedWorker, RemoteWorkerTunnel, TunnelError
from hydra_node.runtime.runner.records import RunnerLoadError, RunnerSettings, RunnerState, WorkerLoss
from hydra_node.runtime.runner.state_events import RunnerEvents
from hydra_node.runtime.runner.supervisor import RunnerSupervisor

__all__ = ["HostedModel", "HostedModelStatus", "Hosting", "HostingSettings"]

log = logging.getLogger("hydra.hosting")

#: Plans tried per placement before waiting (each failed lease excludes one worker).
MAX_PLACEMENT_ATTEMPTS = 4
#: Waiting between placements when nothing fits (no usable workers yet), doubling up to the max.
PLACEMENT_RETRY_INITIAL_S = 0.5
PLACEMENT_RETRY_MAX_S = 10.0
PLACEMENT_BACKOFF = Backoff(initial_s=PLACEMENT_RETRY_INITIAL_S, factor=2.0, max_s=PLACEMENT_RETRY_MAX_S, jitter=0.0)
#: A split model's first load is retried this many times (a worker can vanish during a load).
MAX_SPLIT_LOAD_ATTEMPTS = 3
#: Bound on dropping a plan's tunnels (and on an unload: runner terminate → grace → kill is ~3 s).
UNLOAD_TIMEOUT_S = 10.0
#: Ignored workers listed in a hosted model's status.
MAX_IGNORED_LISTED = 8
#: A split runner that died (or stalled) with every worker's lease still held waits this long for one
#: to end before its requests get ``runner_crashed`` (the lease stream and llama.cpp's own connection
#: close together when a worker node dies; either may be seen first).
WORKER_LOSS_GRACE_S = 1.0


class HostingSettings(Protocol):
    """The settings a hosted model reads (``RuntimeSettings`` satisfies it)."""

    @property
    def node_id(self) -> str: ...

    @property
    def home(self) -> Path: ...

    @property
    def stall_timeout_s(self) -> float: ...


class Hosting(Protocol):
    """What a hosted model needs of the runtime that hosts it (``ModelRuntime`` satisfies it)."""

    # read-only members (properties), so that a runtime with narrower types still satisfies it
    @property
    def settings(self) -> HostingSettings: ...
    @property
    def mesh(self) -> PeerView | None: ...
    @property
    def runners(self) -> MutableMapping[str, RunnerSupervisor]: ...
    @property
    def runner_settings(self) -> Callable[[], RunnerSettings]: ...
    @property
    def runner_events(self) -> RunnerEvents: ...
    #: ``(model, direction, bytes, ms)`` of every KV export/import of a hosted runner
    @property
    def on_kv_transfer(self) -> Callable[[str, str, int, float], None] | None: ...

    def host_free_bytes(self, exclude: str | None = None) -> int: ...

    def remote_workers(self, excluded: set[str], tag: str) -> tuple[list[WorkerInfo], list[IgnoredWorker]]: ...


@dataclass(frozen=True)
class HostedModelStatus:
    """A hosted model's placement, as ``/api/status`` ``splits.<id>`` and ``/api/runtime/models`` show it."""

    model: str
    state: RunnerState
    force_split: bool
    split: bool
    fallback_local: bool
    placements: int
    placement_error: str | None
    size_bytes: int
    n_layers: int | None
    ignored_workers: tuple[IgnoredWorker, ...]
    #: The plan (``SplitPlan.to_status()`` with each device's peer and tunnel); absent without a plan.
    plan: Mapping[str, Any] | None = field(default=None, metadata={"omit_none": True})
    #: The last heal after a lost worker (docs/splits.md "When a worker dies"); absent before one.
    last_heal: HealReport | None = field(default=None, metadata={"omit_none": True})


@dataclass(frozen=True)
class _Healing:
    """A worker was lost and the split is replanning: the loss, when (trio time), the lost plan's
    workers, the generations in flight then."""

    loss: WorkerLoss
    t0: float
    old_workers: tuple[str, ...]
    in_flight: int


class HostedModel:
    """One model on this node (see the module docstring)."""

    def __init__(self, runtime: Hosting, model: ModelRef, *, force_split: bool):
        self.runtime = runtime
        self.model = model
        self.force_split = force_split
        self.size_bytes = model.size_bytes
        try:
            self.n_layers: int | None = layer_count(model.path)
        except GgufError as exc:
            log.warning("event=gguf_unreadable model=%s error=%r action=never_split", model.id, exc)
            self.n_layers = None
        self.sup = RunnerSupervisor(
            model,
            runtime.settings.home,
            runtime.runner_settings(),
            node_id=runtime.settings.node_id,
            prepare=self._prepare,
            on_failed=self._drop_tunnels,
            lost_worker=self._lost_worker,
        )
        self.sup.on_state = self._on_state
        self.sup.kv.on_transfer = runtime.on_kv_transfer  # KV exports/imports -> the scheduler's telemetry
        self.scope = trio.CancelScope()
        self.done = trio.Event()
        self.plan: SplitPlan | None = None
        self.fallback = False
        self.placement_error: str | None = None
        self.placements = 0
        self.tunnels: list[tuple[RemoteWorkerTunnel, LeasedWorker]] = []
        self.ignored: list[IgnoredWorker] = []
        self._nursery: trio.Nursery | None = None
        self._tunnel_scope: trio.CancelScope | None = None
        self._tunnels_done: trio.Event | None = None
        self._discovery_deadline: float | None = None
        self._loss: WorkerLoss | None = None  # a worker of the current plan was lost
        self._lost = trio.Event()  # set with _loss
        self._healing: _Healing | None = None  # lost a worker, not ready again yet
        self.last_heal: HealReport | None = None
        self._resumed_at_heal = 0  # sup.resumed when the last heal was done

    @property
    def lease_tag(self) -> str:
        return self.model.id[:MAX_TAG_CHARS]

    @property
    def state(self) -> RunnerState:
        return self.sup.state

    @property
    def last_error(self) -> str | None:
        return self.sup.last_error

    def fits_locally(self) -> bool:
        """True when the model can start before the mesh is up (no split wanted or needed)."""
        return fits_locally(self.size_bytes, self.n_layers, self._host(), force_split=self.force_split)

    # ---- lifecycle -------------------------------------------------------------
    async def run(
        self, *, strict: bool = False, task_status: trio.TaskStatus[HostedModel | None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Host the model until cancelled (``self.scope``).  ``strict``: a failed first load
        raises :class:`RunnerLoadError` (start-up); otherwise the model stays listed as failed."""
        runners = self.runtime.runners
        runners[self.model.id] = self.sup
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
                                log.warning(
                                    "event=split_load_retry model=%s attempt=%d error=%r",
                                    self.model.id,
                                    attempts,
                                    str(exc),
                                )
                                continue
                            self.sup.last_error = str(exc)
                            log.error("event=model_failed model=%s error=%r", self.model.id, str(exc))
                        break
                    await self._drop_tunnels()
                    self.sup.state = RunnerState.FAILED
                    await trio.sleep_forever()
        finally:
            if runners.get(self.model.id) is self.sup:
                del runners[self.model.id]
                self.runtime.runner_events.unloaded(self.model.id)
            self.done.set()

    async def _prepare(self) -> RunnerSettings:
        """Before every spawn: drop the old plan's tunnels, place again, open new tunnels."""
        await self._drop_tunnels()
        self._loss, self._lost = None, trio.Event()
        attempt = 0
        while True:
            try:
                return await self._place()
            except PlanError as exc:
                if self.runtime.mesh is None:
                    raise RunnerLoadError(
                        f"model {self.model.id!r} does not fit this node and there is no mesh to split it over: {exc}"
                    ) from None
                self.sup.state = RunnerState.PLACING
                self.placement_error = str(exc)
                self.sup.last_error = f"no placement: {exc}"
                delay = PLACEMENT_BACKOFF.delay(attempt, 0.0)
                log.warning("event=placement_failed model=%s retry_in_s=%.1f error=%r", self.model.id, delay, str(exc))
                await trio.sleep(delay)
                attempt += 1

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
        base = self.runtime.runner_settings()
        self.placements += 1
        if self.n_layers is None:
            self.plan, self.fallback, self.placement_error = None, False, None
            return base
        excluded: set[str] = set()
        failures: list[IgnoredWorker] = []
        for _ in range(MAX_PLACEMENT_ATTEMPTS):
            workers, ignored = self.runtime.remote_workers(excluded, self.lease_tag)
            self.ignored = ignored + failures
            waiting = self.force_split and self._waiting_for_workers()
            placement = place(
                self.size_bytes,
                self.n_layers,
                self._host(),
                workers,
                force_split=self.force_split,
                waiting_for_workers=waiting,
            )
            plan = placement.plan
            if not placement.split:
                self.plan, self.fallback, self.placement_error = plan, placement.fallback, None
                log.info("event=placement model=%s split=false fallback=%s", self.model.id, placement.fallback)
                return base
            assert plan is not None and self._nursery is not None  # a split has a plan; run() set the nursery
            peers = [ep.removeprefix("peer:") for ep in plan.rpc_endpoints]
            try:
                leased = await self._nursery.start(self._hold_tunnels, peers)
            except TunnelError as exc:
                excluded.add(exc.peer_id)
                failures.append(IgnoredWorker(exc.peer_id, str(exc)))
                self.ignored.append(IgnoredWorker(exc.peer_id, str(exc)))
                log.warning(
                    "event=tunnel_failed model=%s peer=%s code=%s error=%r",
                    self.model.id,
                    exc.peer_id[:16],
                    exc.code,
                    str(exc),
                )
                continue
            self.plan, self.fallback, self.placement_error = plan, False, None
            log.info(
                "event=placement model=%s split=true layers=%s",
                self.model.id,
                ",".join(
                    f"{d.worker_id[:8] if d.worker_id else 'host'}:{d.first_block}-{d.stop_block}" for d in plan.devices
                ),
            )
            return dataclasses.replace(
                base,
                rpc_endpoints=tuple(w.endpoint for w in leased),
                tensor_split=plan.tensor_split,
                n_gpu_layers=plan.n_gpu_layers,
                output_on_host=plan.output_on_host,
                stall_timeout_s=self.runtime.settings.stall_timeout_s,
            )
        raise PlanError(
            f"no usable workers after {MAX_PLACEMENT_ATTEMPTS} attempts "
            f"({'; '.join(w.reason for w in self.ignored[-MAX_PLACEMENT_ATTEMPTS:])})"
        )

    async def _hold_tunnels(
        self, peers: list[str], *, task_status: trio.TaskStatus[list[LeasedWorker]] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Lease every worker of a plan (in plan order) and keep the tunnels until cancelled."""
        failure: TunnelError | None = None
        done = self._tunnels_done = trio.Event()
        try:
            mesh = self.runtime.mesh
            assert mesh is not None  # remote workers (a split) are known only through the mesh
            with trio.CancelScope() as scope:
                self._tunnel_scope = scope
                async with trio.open_nursery() as nursery:
                    opened: list[tuple[RemoteWorkerTunnel, LeasedWorker]] = []
                    for peer in peers:
                        tunnel = RemoteWorkerTunnel(mesh, peer, tag=self.lease_tag)
                        try:
                            opened.append((tunnel, await nursery.start(self._run_tunnel, tunnel)))
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

    async def _run_tunnel(
        self, tunnel: RemoteWorkerTunnel, *, task_status: trio.TaskStatus[LeasedWorker] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Hold one worker's tunnel; it returning (not cancelled: the plan dropped) is the worker lost."""
        await tunnel.run(task_status=task_status)
        if any(t is tunnel for t, _ in self.tunnels):
            self._worker_lost(tunnel.peer_id, f"its lease ended: {tunnel.ended or 'dropped'}")

    # ---- a lost worker and the heal (docs/splits.md "When a worker dies or stalls") ----
    def _plan_workers(self) -> tuple[str, ...]:
        plan = self.plan
        if plan is None or not plan.split:
            return ()
        return tuple(d.worker_id for d in plan.devices if d.worker_id)

    def _worker_lost(self, peer: str, reason: str) -> None:
        """A worker of the live plan is lost: record it, report ``split.worker_lost``, and restart the
        runner now (llama.cpp cannot go on without it; an idle runner would only notice on its next
        request), so the heal starts at once."""
        if self._loss is not None or peer not in self._plan_workers():
            return
        loss = self._loss = WorkerLoss(peer, reason, time.time())
        self._lost.set()
        in_flight = self.sup.in_flight
        if self._healing is None:  # a second loss before the heal is done keeps the first one's clock
            self._healing = _Healing(loss, trio.current_time(), self._plan_workers(), in_flight)
        log.warning(
            "event=split_worker_lost model=%s peer=%s in_flight=%d reason=%r",
            self.model.id,
            peer[:16],
            in_flight,
            reason,
        )
        self._emit(
            "split.worker_lost",
            {
                "model": self.model.id,
                "node_id": self.runtime.settings.node_id,
                "peer": peer,
                "reason": reason,
                "requests_in_flight": in_flight,
            },
        )
        self.sup.restart(f"the split lost its RPC worker on peer {peer[:16]}: {reason}")

    def _check_members(self) -> None:
        """A planned worker whose peer is no longer alive in the membership is lost."""
        mesh = self.runtime.mesh
        if mesh is None:
            return
        states = mesh.member_states(trio.current_time())
        for peer in self._plan_workers():
            state = states.get(peer)
            if state != "alive":
                self._worker_lost(peer, f"its peer is {state or 'gone'} in the membership")
                return

    async def _lost_worker(self) -> WorkerLoss | None:
        """The runner died or stalled: the worker of the plan that was lost, if any (the supervisor's
        ``lost_worker``).  Its lease ended, or its peer is not alive; with every lease held, waits up
        to :data:`WORKER_LOSS_GRACE_S` for one to end (None after that: the runner's own failure)."""
        if not self._plan_workers():
            return None
        if self._loss is None:
            self._check_members()
        if self._loss is None:
            with trio.move_on_after(WORKER_LOSS_GRACE_S):
                await self._lost.wait()
        return self._loss

    def _on_state(self, runner: RunnerSupervisor, old: RunnerState) -> None:
        """The runner's state changed: the runtime's events, and a heal done once it is ready again."""
        self.runtime.runner_events.on_state(runner, old)
        healing = self._healing
        if runner.state is not RunnerState.READY or healing is None:
            return
        self._healing = None
        new_workers = self._plan_workers()
        report = HealReport(
            worker_lost=healing.loss.peer,
            reason=healing.loss.reason,
            at=round(healing.loss.at, 3),
            replan=replan_kind(healing.old_workers, healing.loss.peer, new_workers),
            workers=new_workers,
            reload_s=round(trio.current_time() - healing.t0, 3),
            requests_interrupted=healing.in_flight,
            requests_continued=0,
        )
        self.last_heal, self._resumed_at_heal = report, self.sup.resumed
        log.info(
            "event=split_healed model=%s lost=%s replan=%s reload_s=%.2f interrupted=%d",
            self.model.id,
            report.worker_lost[:16],
            report.replan,
            report.reload_s,
            report.requests_interrupted,
        )
        self._emit(
            "split.healed",
            {
                "model": self.model.id,
                "node_id": self.runtime.settings.node_id,
                "worker_lost": report.worker_lost,
                "replan": str(report.replan),
                "workers": list(new_workers),
                "reload_s": report.reload_s,
                "requests_interrupted": report.requests_interrupted,
            },
        )

    def _emit(self, kind: str, fields: dict[str, Any]) -> None:
        emit = self.runtime.runner_events.emit
        if emit is None:
            return
        try:
            emit(kind, fields)
        except Exception as exc:  # noqa: BLE001 -- reporting must never fail the hosted model
            log.warning("event=split_event_failed kind=%s error=%r", kind, exc)

    async def _drop_tunnels(self) -> None:
        if self._tunnel_scope is not None:
            self._tunnel_scope.cancel()
            assert self._tunnels_done is not None  # set with the scope (_hold_tunnels)
            with trio.CancelScope(shield=True), trio.move_on_after(UNLOAD_TIMEOUT_S):
                await self._tunnels_done.wait()
            self._tunnel_scope = None

    # ---- status ----------------------------------------------------------------
    def status(self) -> HostedModelStatus:
        plan = self.plan
        plan_status = None
        if plan is not None:
            plan_status = plan.to_status()
            tunnels = {w.peer_id: (t, w) for t, w in self.tunnels}
            for d in plan_status["devices"]:
                peer = d["worker_id"]
                d["peer"] = peer if peer else self.runtime.settings.node_id
                if peer in tunnels:
                    t, w = tunnels[peer]
                    d["endpoint"] = w.endpoint
                    d["tunnel"] = {
                        "connections": t.connections,
                        "data_connections": t.data_connections,
                        "data_fallback": t.data_fallback,
                        "bytes_up": t.bytes_up,
                        "bytes_down": t.bytes_down,
                        "worker_proto": str(w.proto),
                        "worker_free_bytes": w.free_bytes,
                    }
        return HostedModelStatus(
            model=self.model.id,
            state=self.sup.state,
            force_split=self.force_split,
            split=bool(plan and plan.split),
            fallback_local=self.fallback,
            placements=self.placements,
            placement_error=self.placement_error,
            size_bytes=self.size_bytes,
            n_layers=self.n_layers,
            ignored_workers=tuple(self.ignored[-MAX_IGNORED_LISTED:]),
            plan=plan_status,
            last_heal=None
            if self.last_heal is None
            else dataclasses.replace(self.last_heal, requests_continued=self.sup.resumed - self._resumed_at_heal),
        )
