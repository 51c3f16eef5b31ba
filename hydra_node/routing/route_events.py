"""The router's live events (``GET /api/events``): ``route.decision`` and ``request.finished``
(``request.continued``, a generation continued on another host, and ``request.waiting``, a request
waiting for a target of a model expected back, are emitted by the router itself).

Pure: :func:`decision_fields` shapes a scheduling decision (or the fixed rule's order) for the
console; :class:`RequestReport` follows one routed generation from ``Router.generate`` to its
end and says how it ended (``ok``: its ``Finished`` arrived; ``error``: a failure; ``cancelled``:
the caller left first), its target, TTFT and tokens per second as the router measured them.
Times are passed in (monotonic seconds).
"""

from __future__ import annotations

from dataclasses import fields as dc_fields
from typing import Any

from hydra_node.inference import Finished

__all__ = ["DECISION_INTERVAL_S", "MAX_DECISION_CANDIDATES", "RequestReport", "decision_fields"]

#: ``route.decision`` is sampled: at most one every this many seconds (the contract: ~2/s).
DECISION_INTERVAL_S = 0.5
#: Candidates listed in one ``route.decision`` (best first).
MAX_DECISION_CANDIDATES = 8
_NOT_TERMS = {"target", "total_ms"}


def _node(target: Any, node_id: str) -> str | None:
    """A telemetry ``Target`` (node ``"local"`` for us) → the host's node id."""
    if target is None:
        return None
    return node_id if target.node == "local" else target.node


def decision_fields(model: str, node_id: str, ordered: list, decision: Any | None) -> dict[str, Any]:
    """``{"model", "target", "mode", "candidates": [{"target", "score", "terms"}], ...}``.

    ``ordered``: the router's targets in the order they will be tried; ``decision``: the scheduler's
    ``Decision`` (None: the fixed rule decided, and candidates carry no score).  Never raises:
    a decision it cannot read is reported with ``mode`` ``"unknown"`` and no candidates."""
    try:
        return _decision_fields(model, node_id, ordered, decision)
    except Exception as exc:  # noqa: BLE001 -- reporting must never fail a request
        return {"model": model, "target": None, "mode": "unknown", "candidates": [], "error": repr(exc)[:200]}


def _decision_fields(model: str, node_id: str, ordered: list, decision: Any | None) -> dict[str, Any]:
    if decision is None:
        return {
            "model": model,
            "target": ordered[0].node_id if ordered else None,
            "mode": "fixed",
            "candidates": [
                {"target": t.node_id, "score": None, "terms": {}} for t in ordered[:MAX_DECISION_CANDIDATES]
            ],
        }
    candidates = []
    for s in decision.scores[:MAX_DECISION_CANDIDATES]:
        terms = {
            f.name: round(getattr(s, f.name), 3)
            for f in dc_fields(s)
            if f.name not in _NOT_TERMS and isinstance(getattr(s, f.name), (int, float))
        }
        candidates.append({"target": _node(s.target, node_id), "score": round(s.total_ms, 3), "terms": terms})
    return {
        "model": model,
        "target": ordered[0].node_id if ordered else None,
        "mode": decision.mode.value,
        "candidates": candidates,
        "scheduled": _node(decision.scheduled, node_id),
        "baseline": _node(decision.baseline, node_id),
        "disagreement": decision.disagreement,
        "reason": decision.reason,
    }


class RequestReport:
    """One routed generation, from ``Router.generate`` entered (``started``) to its end."""

    def __init__(self, model: str, started: float) -> None:
        self.model = model
        self.started = started
        self.target: str | None = None
        self.first_at: float | None = None
        self.finished: Finished | None = None
        self.failed = False

    def served_by(self, node_id: str) -> None:
        self.target = node_id

    def saw(self, ev: Any, now: float) -> None:
        if self.first_at is None:
            self.first_at = now
        if isinstance(ev, Finished):
            self.finished = ev

    @property
    def status(self) -> str:
        if self.finished is not None:
            return "ok"
        return "error" if self.failed else "cancelled"

    def fields(self, now: float) -> dict[str, Any]:
        duration_ms = max(0.0, (now - self.started) * 1000.0)
        ttft_ms = None if self.first_at is None else round(max(0.0, (self.first_at - self.started) * 1000.0), 1)
        tokens = self.finished.completion_tokens if self.finished is not None else 0
        tok_s = None
        if self.finished is not None and tokens > 1 and self.first_at is not None:
            decode_s = now - self.first_at
            if decode_s > 0:
                tok_s = round((tokens - 1) / decode_s, 2)
            elif self.finished.itl_ms > 0:
                tok_s = round(1000.0 / self.finished.itl_ms, 2)
        return {
            "model": self.model,
            "target": self.target,
            "status": self.status,
            "ttft_ms": ttft_ms,
            "tok_s": tok_s,
            "completion_tokens": tokens,
            "duration_ms": round(duration_ms, 1),
        }
