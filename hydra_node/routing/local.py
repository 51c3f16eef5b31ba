"""The models this node hosts, as route targets (the router's source of local targets)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from hydra_node.routing.target import RouteTarget, TargetState
from hydra_node.runtime.runner.records import RunnerState
from hydra_node.runtime.runner.supervisor import RunnerSupervisor

__all__ = ["LocalRunners"]


class LocalRunners:
    """Target source for the models this node hosts (``runners``: model id → its supervisor,
    filled by the model runtime; ``identity(path)``: a model file's identity, None while unknown —
    :meth:`hydra_node.routing.identity.ModelIdentities.of`)."""

    def __init__(
        self,
        node_id: str,
        runners: Mapping[str, RunnerSupervisor],
        identity: Callable[[Path], str | None] | None = None,
    ):
        self.node_id = node_id
        self.runners = runners
        self.identity = identity

    def targets(self) -> list[RouteTarget]:
        # a restarting runner is listed as loading: it is coming back, the router waits or goes elsewhere
        return [
            RouteTarget(
                model=r.model.id,
                node_id=self.node_id,
                local=True,
                open=r.generate,
                embed=r.embeddings.embed,
                queue_depth=r.queue_depth + r.in_flight,
                slots=r.slots,
                free_slots=r.free_slots,
                state=TargetState.LOADING if r.state == RunnerState.RESTARTING else TargetState.of(r.state),
                identity=None if self.identity is None else self.identity(r.model.path),
            )
            for r in self.runners.values()
        ]
