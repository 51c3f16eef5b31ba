"""The models this node hosts, as route targets (the router's source of local targets)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from hydra_node.routing.handover import ANNOUNCED_STATE, Handover
from hydra_node.routing.target import RouteTarget, TargetState
from hydra_node.runtime.runner.records import RunnerState
from hydra_node.runtime.runner.supervisor import RunnerSupervisor

__all__ = ["LocalRunners"]


class LocalRunners:
    """Target source for the models this node hosts (``runners``: model id → its supervisor,
    filled by the model runtime; ``identity(path)``: a model file's identity, None while unknown —
    :meth:`hydra_node.routing.identity.ModelIdentities.of`; ``handover``: the node's stop, through
    which every generation opens — while it stops, a model that ``hosted_elsewhere(model_id)``
    (a ready peer hosts it) is listed as not ready (``unknown``, what ``stopping`` is as a target
    state), so the router sends new requests there;
    one hosted nowhere else is still served here)."""

    def __init__(
        self,
        node_id: str,
        runners: Mapping[str, RunnerSupervisor],
        identity: Callable[[Path], str | None] | None = None,
        handover: Handover | None = None,
        hosted_elsewhere: Callable[[str], bool] | None = None,
    ):
        self.node_id = node_id
        self.runners = runners
        self.identity = identity
        self.handover = handover
        self.hosted_elsewhere = hosted_elsewhere

    def _state(self, r: RunnerSupervisor) -> TargetState:
        if r.state == RunnerState.RESTARTING:
            return TargetState.LOADING
        if (
            self.handover is not None
            and not self.handover.admitting
            and self.hosted_elsewhere is not None
            and self.hosted_elsewhere(r.model.id)
        ):
            return TargetState.of(ANNOUNCED_STATE)  # STOPPING: listed, not routed to
        return TargetState.of(r.state)

    def targets(self) -> list[RouteTarget]:
        # a restarting runner is listed as loading: it is coming back, the router waits or goes elsewhere
        return [
            RouteTarget(
                model=r.model.id,
                node_id=self.node_id,
                local=True,
                open=r.generate if self.handover is None else self.handover.open(r.generate),
                embed=r.embeddings.embed,
                queue_depth=r.queue_depth + r.in_flight,
                slots=r.slots,
                free_slots=r.free_slots,
                state=self._state(r),
                identity=None if self.identity is None else self.identity(r.model.path),
                caps=r.caps,
                tokenize=r.tokenize,
            )
            for r in self.runners.values()
        ]
