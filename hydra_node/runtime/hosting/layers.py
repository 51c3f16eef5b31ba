"""Where a hosted model runs: pure placement over plain data (no trio, no mesh, no clock).

* :func:`usable_workers` picks, from the announcements of the mesh's members, the RPC workers a
  split may use, and says why the others were left out (dead peer, leased to someone else, a
  protocol version it cannot parse);
* :func:`place` turns the model's size and layer count, the host's free memory and those workers
  into a :class:`Placement`: local, split (``plan.split``), or local as a fallback of a forced
  split that found no worker; or raises :class:`~hydra_node.runtime.rpc.plan.PlanError`.

:class:`~hydra_node.runtime.hosting.hosted_model.HostedModel` calls both before every spawn of a runner
and then does the I/O (leasing the planned workers through tunnels).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hydra_node.runtime.rpc import ProtoVersion
from hydra_node.runtime.rpc.plan import Capacity, PlanError, SplitPlan, WorkerInfo, plan_split

__all__ = [
    "UNKNOWN_RTT_MS",
    "WORKER_DISCOVERY_WAIT_S",
    "IgnoredWorker",
    "Placement",
    "fits_locally",
    "place",
    "usable_workers",
]

#: RTT assumed for a peer whose link has not measured one yet.
UNKNOWN_RTT_MS = 50.0
#: How long a forced split's first placement waits for gossip to show a usable worker.
WORKER_DISCOVERY_WAIT_S = 10.0


@dataclass(frozen=True)
class IgnoredWorker:
    """A peer's RPC worker that a placement did not use, and why."""

    peer: str
    reason: str


@dataclass(frozen=True)
class Placement:
    """The outcome of :func:`place`.

    ``plan`` is None when the model's layer count is unknown (it is then never split: local);
    ``fallback`` is True when a forced split found no usable worker and the model runs locally.
    """

    plan: SplitPlan | None
    fallback: bool = False

    @property
    def split(self) -> bool:
        return self.plan is not None and self.plan.split


def place(
    size_bytes: int,
    n_layers: int | None,
    host: Capacity,
    workers: list[WorkerInfo],
    *,
    force_split: bool,
    waiting_for_workers: bool = False,
) -> Placement:
    """Place a model of ``size_bytes`` with ``n_layers`` on ``host`` plus ``workers``.

    Without ``force_split`` a model is split only when it does not fit the host
    (``plan_split`` decides); :class:`PlanError` when it fits nowhere.  With ``force_split`` and no
    usable worker: while ``waiting_for_workers`` (a node that just joined learns the workers from
    gossip in a moment) :class:`PlanError` says so; afterwards the model falls back to the host
    when it fits there (``fallback``), else :class:`PlanError`.
    """
    if n_layers is None:
        return Placement(None)
    try:
        return Placement(plan_split(size_bytes, n_layers, host, workers, force_split=force_split))
    except PlanError as exc:
        if not force_split:
            raise
        if waiting_for_workers:
            raise PlanError(
                f"no usable RPC worker known yet ({exc}); waiting up to "
                f"{WORKER_DISCOVERY_WAIT_S:.0f} s before hosting it unsplit"
            ) from None
    return Placement(plan_split(size_bytes, n_layers, host, []), fallback=True)


def fits_locally(size_bytes: int, n_layers: int | None, host: Capacity, *, force_split: bool) -> bool:
    """True when the model can start before the mesh is up (no split wanted or needed)."""
    if force_split or n_layers is None:
        return not force_split
    try:
        return not plan_split(size_bytes, n_layers, host, []).split
    except PlanError:
        return False


def usable_workers(
    announcements: Mapping[str, Any],
    states: Mapping[str, str],
    rtt_ms: Callable[[str], float | None],
    *,
    own_node_id: str,
    lease_holder: str,
    excluded: set[str] | frozenset[str] = frozenset(),
) -> tuple[list[WorkerInfo], list[IgnoredWorker]]:
    """The RPC workers announced by alive peers (``endpoint`` = ``peer:<id>``), and those ignored.

    ``announcements``: peer id → announcement (``rpc`` capacity, ``extra["rpc_proto"]``,
    ``extra["rpc_lease"]``); ``states``: peer id → membership state; ``rtt_ms``: the measured RTT
    of the link to a peer (None: not measured, :data:`UNKNOWN_RTT_MS` is assumed);
    ``lease_holder``: how our leases are tagged (``<node id>/<model>``): a worker leased to us
    stays usable; ``excluded``: peers that failed this placement already.
    """
    out: list[WorkerInfo] = []
    ignored: list[IgnoredWorker] = []
    for peer_id, ann in announcements.items():
        if peer_id == own_node_id or ann is None or ann.rpc is None or peer_id in excluded:
            continue
        state = states.get(peer_id)
        if state != "alive":
            ignored.append(IgnoredWorker(peer_id, f"peer is {state}"))
            continue
        holder = ann.extra.get("rpc_lease") or ""
        if holder and holder != lease_holder:
            ignored.append(IgnoredWorker(peer_id, f"leased to {str(holder)[:16]}"))
            continue
        try:
            proto = ProtoVersion.parse(ann.extra.get("rpc_proto"))
        except ValueError as exc:
            ignored.append(IgnoredWorker(peer_id, f"bad RPC protocol version: {exc}"))
            continue
        rtt = rtt_ms(peer_id)
        out.append(
            WorkerInfo(
                peer_id,
                f"peer:{peer_id}",
                proto,
                ann.rpc.free_bytes,
                float(UNKNOWN_RTT_MS if rtt is None else rtt),
                ann.rpc.device or "CPU",
            )
        )
    return out, ignored
