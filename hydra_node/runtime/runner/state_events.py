"""A hosted model's state changes as the node's live events (``GET /api/events``).

:func:`runner_state_events` is pure: (old state, new state, restarts, last error) → events.
:class:`RunnerEvents` is what the model runtime hangs on each runner supervisor
(``RunnerSupervisor.on_state``) and calls when a model leaves the node:

* → ``ready``: ``model.loaded`` (again after every restart);
* → ``failed``: ``model.failed`` with ``error`` (the first load failed, or a crash loop);
* ``restarting``/``failed`` → ``placing``/``loading``: ``runner.restarted`` with ``restarts``
  (the supervisor's count) and ``reason`` (why the last child ended);
* the model is no longer hosted (unload, shutdown): ``model.unloaded``.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from hydra_node.eventlog import EmitFn
from hydra_node.runtime.runner.records import RunnerState

__all__ = ["RunnerEvents", "runner_state_events"]

log = logging.getLogger("hydra.runner")

_BACK = (RunnerState.RESTARTING, RunnerState.FAILED)
_STARTING_AGAIN = (RunnerState.PLACING, RunnerState.LOADING)


def runner_state_events(
    model: str, node_id: str, old: RunnerState, new: RunnerState, *, restarts: int, last_error: str | None
) -> list[tuple[str, dict[str, Any]]]:
    if new is RunnerState.READY:
        return [("model.loaded", {"model": model, "node_id": node_id})]
    if new is RunnerState.FAILED:
        return [("model.failed", {"model": model, "node_id": node_id, "error": last_error or ""})]
    if old in _BACK and new in _STARTING_AGAIN:
        return [("runner.restarted", {"model": model, "restarts": restarts, "reason": last_error or ""})]
    return []


class _Runner(Protocol):
    """What :meth:`RunnerEvents.on_state` reads of a runner (``RunnerSupervisor``)."""

    @property
    def model(self) -> Any: ...

    @property
    def state(self) -> RunnerState: ...

    @property
    def restarts(self) -> int: ...

    @property
    def last_error(self) -> str | None: ...


class RunnerEvents:
    """Reports the hosted models of node ``node_id`` through ``emit`` (None: reports nothing)."""

    def __init__(self, node_id: str, emit: EmitFn | None) -> None:
        self.node_id = node_id
        self.emit = emit

    def on_state(self, runner: _Runner, old: RunnerState) -> None:
        """Called by the runner's state setter: never raises (a failure is logged)."""
        if self.emit is None:
            return
        try:
            for kind, fields in runner_state_events(
                runner.model.id, self.node_id, old, runner.state, restarts=runner.restarts, last_error=runner.last_error
            ):
                self.emit(kind, fields)
        except Exception as exc:  # noqa: BLE001 -- reporting must never fail the supervisor
            log.warning("event=runner_event_failed error=%r", exc)

    def unloaded(self, model_id: str) -> None:
        if self.emit is not None:
            self.emit("model.unloaded", {"model": model_id, "node_id": self.node_id})
