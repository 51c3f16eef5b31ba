"""The node side of a runner's KV state export and import (``kv_export`` / ``kv_import`` frames).

:class:`RunnerKv` belongs to one :class:`~hydra_node.runtime.runner.supervisor.RunnerSupervisor`
(``sup.kv``) and uses its channel (request ids, the pending-reply table, ``_send``, availability
and stall handling: a generation's rules).  One KV operation is in the child at a time (the lock:
an import holds the whole state in the child's memory while it waits for a free slot).  The model
file's sha256, part of the identity, is computed here in a worker thread and remembered per
(path, mtime, size) in ``HOME/kv/digests.json`` (:class:`~hydra_node.runtime.artifacts.kv_identity.FileDigests`).

Replies are read strictly: ``kv_exported`` / ``kv_imported`` with their counts, or the child's
``error``: ``identity_mismatch`` (with the differing ``fields``) becomes
:class:`~hydra_node.runtime.artifacts.errors.IdentityMismatch` and is counted per field
(``import_refused``), a corrupt or malformed file :class:`KvStateCorrupt` / :class:`KvStateInvalid`,
a missing one :class:`ArtifactNotFound`; anything else the ``GenerationError`` it reports.
``on_transfer(model_id, direction, bytes, duration_ms)``, when set (the composition root wires it
to routing telemetry's ``observe_kv_transfer``), hears every completed export and import.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import trio

from hydra_node.inference import (
    GenerationError,
    GenerationRequest,
    remote_error_from_wire,
)
from hydra_node.runtime.artifacts.errors import (
    ArtifactError,
    ArtifactNotFound,
    IdentityMismatch,
)
from hydra_node.runtime.artifacts.kv_identity import FileDigests, KvIdentity
from hydra_node.runtime.artifacts.kv_state import KvStateCorrupt, KvStateInvalid
from hydra_node.runtime.child.channel import RunnerProtocolError
from hydra_node.runtime.runner.embed_call import end_call, next_frame

__all__ = ["KvExported", "KvImported", "KvStatistics", "RunnerKv"]

#: Reply messages buffered between the channel reader and the operation (an export's prefill
#: frames are swallowed in the child; a reply is one frame).
REPLY_BUFFER = 4
_FIELDS = frozenset(KvIdentity.field_names())


@dataclass(frozen=True)
class KvExported:
    path: Path
    identity: KvIdentity
    tokens: int
    bytes: int
    duration_ms: float


@dataclass(frozen=True)
class KvImported:
    path: Path
    tokens: int  # prefix tokens the next prompt that starts with them will not evaluate
    bytes: int
    slot: int
    duration_ms: float


@dataclass(frozen=True)
class KvStatistics:
    """``/api/status`` ``kv_cache.models[id]``: this runner's KV transfers since the node started."""

    exports: int = 0
    imports: int = 0
    export_bytes: int = 0
    import_bytes: int = 0
    import_refused: dict[str, int] = field(default_factory=dict)  # identity field -> refusals naming it
    import_refusals: int = 0  # imports refused for their identity (each may name several fields)
    failures: int = 0  # other failed operations (corrupt file, no room, runner errors)


class RunnerKv:
    def __init__(self, sup) -> None:
        self._sup = sup
        self._lock = trio.Lock()
        self.on_transfer: Callable[[str, str, int, float], None] | None = None
        self._stats = {
            "exports": 0,
            "imports": 0,
            "export_bytes": 0,
            "import_bytes": 0,
            "import_refusals": 0,
            "failures": 0,
        }
        self._refused: dict[str, int] = {}
        self._digests: FileDigests | None = None  # the model file's, once hashed

    def statistics(self) -> KvStatistics:
        return KvStatistics(**self._stats, import_refused=dict(self._refused))

    async def model_sha256(self) -> str:
        """The hosted model file's sha256 (hashed once per file version, in a worker thread)."""
        from hydra_node.runtime.artifacts.kv_identity import FileDigests

        if self._digests is None:
            self._digests = FileDigests(self._sup.home / "kv" / "digests.json")
        return await trio.to_thread.run_sync(self._digests.sha256, Path(self._sup.model.path))

    async def export(self, req: GenerationRequest, dest: Path) -> KvExported:
        """Write the KV state of ``req``'s prompt (its exact tokens) to ``dest`` (prefilled if no slot holds it)."""
        t0 = time.monotonic()
        sha = await self.model_sha256()
        msg = await self._exchange(
            {"op": "kv_export", "req": req.to_wire(), "path": str(dest), "model_sha256": sha}, "kv_exported"
        )
        try:
            out = KvExported(
                Path(dest),
                KvIdentity.from_mapping(msg.get("identity")),
                _count(msg, "tokens"),
                _count(msg, "bytes"),
                (time.monotonic() - t0) * 1000,
            )
        except ValueError as exc:
            raise RunnerProtocolError(f"runner kv_exported: {exc}") from None
        self._stats["exports"] += 1
        self._stats["export_bytes"] += out.bytes
        self._observe("export", out.bytes, out.duration_ms)
        return out

    async def import_state(self, path: Path) -> KvImported:
        """Load the kv_state file at ``path`` into a free slot, if its identity matches this runner's exactly."""
        t0 = time.monotonic()
        sha = await self.model_sha256()
        msg = await self._exchange({"op": "kv_import", "path": str(path), "model_sha256": sha}, "kv_imported")
        out = KvImported(
            Path(path), _count(msg, "tokens"), _count(msg, "bytes"), _count(msg, "slot"), (time.monotonic() - t0) * 1000
        )
        self._stats["imports"] += 1
        self._stats["import_bytes"] += out.bytes
        self._observe("import", out.bytes, out.duration_ms)
        return out

    def _observe(self, direction: str, nbytes: int, ms: float) -> None:
        if self.on_transfer is not None:
            self.on_transfer(self._sup.model.id, direction, nbytes, ms)

    # ---- the exchange -------------------------------------------------------------------
    async def _exchange(self, frame: dict, answer: str) -> dict:
        sup = self._sup
        async with self._lock:
            sup._check_available()
            rid = next(sup._ids)
            send_ch, recv_ch = trio.open_memory_channel(REPLY_BUFFER)
            sup._pending[rid] = send_ch
            ended = False
            try:
                await sup._send({**frame, "id": rid})
                while True:
                    msg = await self._next(recv_ch)
                    if msg["op"] == answer:
                        ended = True
                        return msg
                    if msg["op"] == "error":
                        ended = True
                        self._raise(msg)
                    # anything else for this id (none is expected) is ignored
            except (GenerationError, ArtifactError) as exc:
                ended = True
                if not isinstance(exc, IdentityMismatch):
                    self._stats["failures"] += 1
                raise
            finally:
                await end_call(sup, rid, send_ch, ended)

    def _raise(self, msg: dict) -> None:
        code, text = msg.get("code"), str(msg.get("message", ""))[:1000]
        if code == "identity_mismatch":
            fields = msg.get("fields")
            if not isinstance(fields, list) or not fields or not all(f in _FIELDS for f in fields):
                raise RunnerProtocolError(f"runner identity_mismatch: bad 'fields' {fields!r:.80}")
            self._stats["import_refusals"] += 1
            for f in fields:
                self._refused[f] = self._refused.get(f, 0) + 1
            raise IdentityMismatch(fields)
        if code == "checksum_mismatch":
            raise KvStateCorrupt(text)
        if code == "kv_state_invalid":
            raise KvStateInvalid(text)
        if code == "kv_state_not_found":
            raise ArtifactNotFound(text)
        raise remote_error_from_wire(msg, relay_status=True)

    async def _next(self, recv_ch: trio.MemoryReceiveChannel) -> dict:
        return await next_frame(self._sup, recv_ch)


def _count(msg: dict, key: str) -> int:
    v = msg.get(key)
    if type(v) is not int or not 0 <= v < 2**63:
        raise RunnerProtocolError(f"runner {msg.get('op')}: {key!r} must be a count, not {v!r:.40}")
    return v
