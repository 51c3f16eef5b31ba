"""Placement operations: the record, its state table, and their files under ``HOME/placement/ops/``.

An :class:`Operation` is one ``publish`` (``hydra placement prefetch``: a local source into a
namespace, then the VAST trigger when one is configured) or one ``fetch`` (materialise an
artifact into the local cache).  Its states, as a table (:data:`TRANSITIONS`)::

    queued → staging → committed → triggered          (publish with a VAST trigger)
    queued → staging → committed                      (publish without one; every fetch)
    any of queued, staging, committed → failed
    failed → queued      (retry of an operation that failed before its commit: run again)
    failed → committed   (retry of one whose trigger failed: the manifest is attached; re-send)

Each operation is one JSON file ``<op id>.json``, rewritten atomically (temporary file, fsync,
rename, fsync of the directory) at every change, so a crash leaves the previous state or the new
one.  **Restarts**: an operation found ``queued`` or ``staging`` (or ``committed`` with its trigger
not yet delivered) when the node starts was interrupted; :func:`interrupted` marks it ``failed``
with the reason and a ``retry_hint`` (publishing is atomic, so nothing half-written is visible and
``hydra placement retry OP_ID`` runs it again; a trigger retry reuses its idempotency key).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from hydra_node.runtime.artifacts.errors import ArtifactError
from hydra_node.statemachine import InvalidTransition, StateTable

__all__ = [
    "ACTIONS",
    "MAX_OPERATIONS",
    "STATES",
    "TERMINAL",
    "TRANSITIONS",
    "BadTransition",
    "NotRetryable",
    "OpStore",
    "Operation",
    "PlacementBusy",
    "UnknownOperation",
    "interrupted",
    "prune_plan",
    "retry_hint",
]

ACTIONS = ("publish", "fetch")
STATES = ("queued", "staging", "committed", "triggered", "failed")
#: The legal moves; anything else raises :class:`BadTransition` naming the state.
TRANSITIONS: Mapping[str, frozenset[str]] = {
    "queued": frozenset({"staging", "failed"}),
    "staging": frozenset({"committed", "failed"}),
    "committed": frozenset({"triggered", "failed"}),
    "triggered": frozenset(),
    "failed": frozenset({"queued", "committed"}),
}
OP_MACHINE = StateTable.between("placement operation", TRANSITIONS)
#: States an operation rests in (``committed`` only when no trigger is due).
TERMINAL = frozenset({"triggered", "failed"})
#: Operation files kept; past it the oldest finished ones are deleted (the directory is read whole at start).
MAX_OPERATIONS = 1000
#: Largest operation file read back (a manifest of a few thousand files fits easily).
MAX_OP_FILE_BYTES = 4 * 1024 * 1024

_OP_ID = re.compile(r"op-[0-9a-f]{8,16}-[0-9a-f]{8}")


class BadTransition(ValueError):
    """A move the state table does not allow (our bug, never the caller's)."""


class UnknownOperation(ArtifactError):
    code = "operation_not_found"
    status = 404


class NotRetryable(ArtifactError):
    """Only a failed operation is retried."""

    code = "operation_not_failed"
    status = 409


class PlacementBusy(ArtifactError):
    """Too many operations wait already (:data:`service.MAX_QUEUED`)."""

    code = "placement_busy"
    status = 429


@dataclass(frozen=True)
class Operation:
    id: str
    action: str  # publish | fetch
    kind: str
    name: str
    state: str
    created_at: float
    updated_at: float
    source: str = ""  # publish: the local path published
    namespace: Mapping[str, Any] | None = None  # Namespace.to_json() of the target (publish) or the source (fetch)
    identity: Mapping[str, Any] = field(default_factory=dict)  # the compatibility identity published with
    vast: Mapping[str, Any] | None = None  # the trigger settings this publish uses (None: no trigger)
    manifest: Mapping[str, Any] | None = None  # the committed manifest (JSON form)
    trigger: Mapping[str, Any] | None = None  # the trigger's outcome: delivered, attempts, last_error, ...
    error: Mapping[str, str] | None = None  # {"code", "message"} when failed
    retry_hint: str | None = None
    path: str = ""  # fetch: where the artifact lies in the local cache
    bytes_done: int = 0
    bytes_total: int = 0
    history: tuple = ()  # ((state, at), ...)

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL or (self.state == "committed" and not self.trigger_due)

    @property
    def trigger_due(self) -> bool:
        """A committed publish whose VAST trigger has not been delivered yet."""
        return self.action == "publish" and self.vast is not None and not (self.trigger or {}).get("delivered")

    def move(self, state: str, now: float, **changes: Any) -> Operation:
        try:
            OP_MACHINE.next(self.state, state)
        except InvalidTransition as exc:
            raise BadTransition(f"operation {self.id}: no move from {self.state!r} to {state!r}") from exc
        if state == "committed" and self.state == "failed" and self.manifest is None:
            raise BadTransition(f"operation {self.id}: failed before its commit; retry runs it from queued")
        hist = (self.history + ((state, now),))[-32:]
        if state != "failed":
            changes = {"error": None, "retry_hint": None, **changes}
        return replace(self, state=state, updated_at=now, history=hist, **changes)

    def fail(self, code: str, message: str, now: float) -> Operation:
        failed = self.move("failed", now, error={"code": code, "message": message[:2000]})
        return replace(failed, retry_hint=retry_hint(failed))

    def to_json(self) -> dict:
        d = asdict(self)
        d["history"] = [list(h) for h in self.history]
        return d

    @classmethod
    def from_json(cls, data: Any) -> Operation:
        if not isinstance(data, dict):
            raise ValueError("an operation must be a JSON object")
        try:
            op = cls(**{**data, "history": tuple(tuple(h) for h in data.get("history", ()))})
        except TypeError as exc:
            raise ValueError(f"bad operation: {exc}") from None
        if not (
            isinstance(op.id, str)
            and _OP_ID.fullmatch(op.id)
            and op.action in ACTIONS
            and op.state in STATES
            and isinstance(op.kind, str)
            and isinstance(op.name, str)
        ):
            raise ValueError(f"bad operation {data.get('id')!r}")
        return op


def retry_hint(op: Operation) -> str:
    """What ``placement status`` tells the operator to do about a failed ``op``."""
    if op.manifest is not None and op.action == "publish":
        where = (op.namespace or {}).get("location", "the namespace")
        return (
            f"the artifact is committed at {where} (manifest {op.manifest.get('manifest_id', '?')}); "
            f"`hydra placement retry {op.id}` re-sends the VAST trigger with the same idempotency key"
        )
    verb = "publishes again (atomic: readers never see a half artifact)" if op.action == "publish" else "fetches again"
    return f"fix the cause above, then `hydra placement retry {op.id}` {verb}"


def interrupted(op: Operation, now: float) -> Operation | None:
    """``op`` as found at start: the failed form of an operation a stop interrupted, or None."""
    if op.state in ("queued", "staging"):
        return op.fail(
            "interrupted", f"the node stopped while this operation was {op.state}; nothing half-written is visible", now
        )
    if op.state == "committed" and op.trigger_due:
        return op.fail("interrupted", "the node stopped after the commit, before the VAST trigger was delivered", now)
    return None


class OpStore:
    """One JSON file per operation under ``root`` (``HOME/placement/ops``), written atomically."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, op_id: str) -> Path:
        if not _OP_ID.fullmatch(op_id):
            raise KeyError(op_id)
        return self.root / f"{op_id}.json"

    def save(self, op: Operation) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.path(op.id)
        tmp = final.with_name(f".{op.id}.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(op.to_json(), f, separators=(",", ":"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
        _fsync_dir(self.root)

    def load_all(self) -> tuple[list[Operation], list[str]]:
        """Every operation file (oldest first) and a line for each unreadable one (left in place)."""
        ops, problems = [], []
        try:
            names = sorted(p for p in os.listdir(self.root) if p.endswith(".json"))
        except FileNotFoundError:
            return [], []
        for name in names:
            p = self.root / name
            try:
                if p.stat().st_size > MAX_OP_FILE_BYTES:
                    raise ValueError("file too large")
                ops.append(Operation.from_json(json.loads(p.read_text(encoding="utf-8"))))
            except (OSError, ValueError) as exc:
                problems.append(f"{name}: {exc}")
        ops.sort(key=lambda o: o.created_at)
        return ops, problems

    def recover(self, now: float) -> tuple[list[Operation], list[str]]:
        """Every operation at start, the interrupted ones marked failed (and saved), the oldest
        finished ones beyond :data:`MAX_OPERATIONS` deleted; lines saying what was done."""
        ops, notes = self.load_all()
        out = []
        for op in ops:
            failed = interrupted(op, now)
            if failed is not None:
                self.save(failed)
                notes.append(f"op={op.id} state={op.state} marked failed (interrupted)")
                op = failed
            out.append(op)
        gone = set(prune_plan(out))
        for op_id in gone:
            self.delete(op_id)
        return [op for op in out if op.id not in gone], notes

    def delete(self, op_id: str) -> None:
        try:
            self.path(op_id).unlink()
        except FileNotFoundError:
            pass


def prune_plan(ops: list[Operation], keep: int = MAX_OPERATIONS) -> list[str]:
    """Ids of the oldest finished operations to delete so that at most ``keep`` remain."""
    excess = len(ops) - keep
    if excess <= 0:
        return []
    done = sorted((o for o in ops if o.terminal), key=lambda o: o.updated_at)
    return [o.id for o in done[:excess]]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
