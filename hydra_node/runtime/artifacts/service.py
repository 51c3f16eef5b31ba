"""PlacementService: the trio driver of artifact placement (docs/placement.md).

* **Operations** (:mod:`.operations`): ``submit_publish`` (``hydra placement prefetch``: a local
  source into a namespace, then the VAST trigger when one is configured) and ``submit_fetch``
  return a queued :class:`Operation` at once; :data:`WORKERS` tasks run them, each state change
  persisted under ``HOME/placement/ops``.  ``retry`` re-runs a failed one.
* **Materialising** (``materialise(kind, name) -> (Manifest, folder)``): the local cache, then the
  configured namespaces (POSIX root, S3), then the alive peers announcing it, lowest RTT first;
  every file's sha256 and the signature are verified on the way in; nothing unverified is used.
  ``on_materialised(kind, name, source, nbytes, duration_s)`` reports each transfer (the root feeds telemetry).
* **The local cache** (:mod:`.local_cache`, :mod:`.cache`): LRU within ``cache_capacity_gb``, TTL
  ``cache_ttl_secs``, pins, leases (``using``); ``announce_extra`` lists what we hold for peers.

Blocking store calls run in worker threads.  The service gets narrow inputs from the root: the
settings, a signer, the mesh view, the peer fetch function and the trigger sender.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import trio

from hydra_node.runtime.artifacts.errors import ArtifactError, InvalidRequest, SourceInvalid
from hydra_node.runtime.artifacts.local_cache import (
    ArtifactHeld,
    LocalCache,
    cache_root,
    manifest_of,
)
from hydra_node.runtime.artifacts.manifest import ArtifactFile, Manifest, signer
from hydra_node.runtime.artifacts.materialise import (
    CORRUPT_CODES,
    Materialiser,
    PeerFetch,
)
from hydra_node.runtime.artifacts.operations import (
    NotRetryable,
    Operation,
    OpStore,
    PlacementBusy,
    UnknownOperation,
)
from hydra_node.runtime.artifacts.peer import fetch_from_peer
from hydra_node.runtime.artifacts.peer_wire import (
    MAX_ANNOUNCED_ARTIFACTS,
    held_artifacts_extra,
    model_digest_of,
)
from hydra_node.runtime.artifacts.settings import Namespace, namespaces_of
from hydra_node.runtime.artifacts.sources import collect_files, open_store
from hydra_node.runtime.artifacts.store import check_request
from hydra_node.runtime.artifacts.vast import TriggerResult, send_trigger
from hydra_node.runtime.artifacts.vast_payload import VastSettings, build_payload
from hydra_node.runtime.peers import PeerView

__all__ = ["MAX_QUEUED", "WORKERS", "PlacementService", "PlacementStatus"]

log = logging.getLogger("hydra.placement")

#: Operations running at once (each holds a worker thread while it copies).
WORKERS = 2
#: Operations waiting for a worker; past it a submission is refused (429) rather than queued unbounded.
MAX_QUEUED = 64
#: Operations kept in memory and reported in ``/api/status`` ``placement.operations`` (the newest).
STATUS_OPERATIONS = 20
#: How often expired artifacts are swept (at most; a short TTL sweeps every quarter TTL).
SWEEP_INTERVAL_S = 60.0

TriggerFn = Callable[[VastSettings, Mapping[str, Any]], Awaitable[TriggerResult]]  # vast.send_trigger


@dataclass(frozen=True)
class PlacementStatus:
    """``/api/status`` ``placement``."""

    namespaces: list
    vast_trigger: str | None
    cache: Mapping[str, Any]
    operations: list
    counters: Mapping[str, int]


class PlacementService:
    def __init__(
        self,
        settings: Any,
        *,
        home: Path,
        node_id: str,
        sign: Callable[[Manifest], Manifest],
        mesh: PeerView | None = None,
        peer_fetch: PeerFetch | None = None,
        trigger: TriggerFn = send_trigger,
        on_materialised: Callable[[str, str, str, int, float], None] | None = None,
        store_factory: Callable[[Namespace], Any] | None = None,
        wall: Callable[[], float] = time.time,
        new_id: Callable[[float], str] | None = None,
    ) -> None:
        self.settings = settings
        self.node_id = node_id
        self.sign = sign
        self.peer_fetch = peer_fetch
        self.trigger = trigger
        self.store_factory = store_factory or functools.partial(open_store, settings=settings)
        self._stores: dict[Namespace, Any] = {}  # one client per namespace (an S3 client is costly to build)
        self._wall = wall
        self._new_id = new_id or (lambda now: f"op-{int(now * 1000):x}-{secrets.token_hex(4)}")
        self.namespaces = namespaces_of(settings)
        self.cache = LocalCache(
            cache_root(home),
            capacity_bytes=int(settings.cache_capacity_gb * 1e9),
            ttl_s=float(settings.cache_ttl_secs),
            wall=wall,
        )
        self.ops_store = OpStore(home / "placement" / "ops")
        self.ops: dict[str, Operation] = {}
        self._done: dict[str, trio.Event] = {}
        self._progress: dict[str, int] = {}
        self._send, self._receive = trio.open_memory_channel[str](MAX_QUEUED)
        self._queued = 0  # operations saved or being saved, not yet taken by a worker (<= MAX_QUEUED)
        self._held: tuple[int, dict] | None = None
        self.counters = {
            "published": 0,
            "fetched": 0,
            "cache_hits": 0,
            "failed": 0,
            "triggered": 0,
            "refused_corrupt": 0,
        }
        self.ready = False
        self.materialiser = Materialiser(
            self.cache,
            self.namespaces,
            self._store,
            node_id=node_id,
            mesh=mesh,
            # a peer's artifact is admitted at its manifest: room for its declared size, or refused unwritten
            peer_fetch=None if peer_fetch is None else functools.partial(peer_fetch, admit=self._admit),
            on_materialised=on_materialised,
            counters=self.counters,
        )

    @classmethod
    def for_node(
        cls,
        settings: Any,
        *,
        home: Path,
        signing_key: Any,
        node_id: str,
        mesh: Any,
        on_materialised: Callable[[str, str, str, int, float], None] | None = None,
    ) -> PlacementService:
        """The service of a node: its key signs, peers are asked through ``mesh`` (when there is one)."""
        peer_fetch = functools.partial(fetch_from_peer, mesh) if mesh is not None else None
        return cls(
            settings,
            home=home,
            node_id=node_id,
            sign=signer(signing_key),
            mesh=mesh,
            peer_fetch=peer_fetch,
            on_materialised=on_materialised,
        )

    # ---- life -----------------------------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Load the cache and the operations (interrupted ones marked failed), then run the workers."""
        for note in await trio.to_thread.run_sync(self.cache.load):
            log.warning("event=placement_cache_repaired note=%r", note)
        await trio.to_thread.run_sync(self._load_ops)
        self.ready = True
        async with trio.open_nursery() as nursery:
            for _ in range(WORKERS):
                nursery.start_soon(self._worker)
            nursery.start_soon(self._sweeper)
            task_status.started()

    def _load_ops(self) -> None:
        ops, notes = self.ops_store.recover(self._wall())
        for line in notes:
            log.warning("event=placement_ops_recovered %s", line)
        self.ops = {op.id: op for op in ops}

    async def _sweeper(self) -> None:
        ttl = self.cache.index.ttl_s
        interval = min(SWEEP_INTERVAL_S, ttl / 4) if ttl else SWEEP_INTERVAL_S
        while True:
            try:
                await trio.to_thread.run_sync(self.cache.sweep)
            except OSError as exc:  # a full or read-only disk: the next sweep tries again
                log.warning("event=placement_sweep_failed error=%r", str(exc))
            await trio.sleep(interval)

    async def _worker(self) -> None:
        async for op_id in self._receive:
            self._queued -= 1
            op = self.ops[op_id]
            try:
                if op.action == "publish":
                    await self._run_publish(op)
                else:
                    await self._run_fetch(op)
            except ArtifactError as exc:
                await self._fail(op_id, exc.code, exc.message)
            except OSError as exc:
                await self._fail(op_id, "io_error", f"{exc.strerror or exc}: {exc.filename or ''}")
            except Exception as exc:  # our bug: this operation fails, the node and other operations go on
                log.exception("event=placement_op_crashed op=%s", op_id)
                await self._fail(op_id, "internal_error", f"{type(exc).__name__}: {exc}")
            finally:
                self._progress.pop(op_id, None)
                if self.ops[op_id].terminal:
                    self._done.pop(op_id, trio.Event()).set()

    # ---- operations -------------------------------------------------------------------------
    def _save(self, op: Operation) -> Operation:
        self.ops[op.id] = op
        self.ops_store.save(op)
        return op

    async def _fail(self, op_id: str, code: str, message: str) -> None:
        op = self.ops[op_id]
        if op.state == "failed":
            return
        self.counters["failed"] += 1
        if code in CORRUPT_CODES:
            self.counters["refused_corrupt"] += 1
        log.warning("event=placement_op_failed op=%s code=%s message=%r", op_id, code, message)
        failed = op.fail(code, message, self._wall())
        try:
            await trio.to_thread.run_sync(self._save, failed)
        except OSError as exc:  # the record stays failed in memory; the file keeps its last state
            self.ops[op_id] = failed
            log.error("event=placement_op_unsaved op=%s error=%r", op_id, str(exc))

    def _admit(self, manifest: Manifest) -> None:
        """Blocking: room in the cache and on its disk for a peer's artifact, at its manifest."""
        self.cache.make_room(manifest.size, (manifest.kind, manifest.name))

    def _store(self, ns: Namespace) -> Any:
        store = self._stores.get(ns)
        if store is None:
            if len(self._stores) >= 16:
                self._stores.clear()
            store = self._stores[ns] = self.store_factory(ns)
        return store

    def _namespace(self, namespace: Namespace | None) -> Namespace:
        if namespace is not None:
            return namespace
        if not self.namespaces:
            raise SourceInvalid(
                "no namespace: give posix_root or s3_bucket, or set [placement] posix_root or s3_bucket"
            )
        return self.namespaces[0]

    async def submit_publish(
        self,
        kind: str,
        name: str,
        source: str,
        *,
        namespace: Namespace | None = None,
        identity: Mapping[str, Any] | None = None,
        trigger: bool = True,
        vast: Mapping[str, Any] | None = None,
    ) -> Operation:
        """Queue publishing the file or folder ``source`` as ``kind``/``name``; the queued operation."""
        check_request(kind, name)
        if model_digest_of(kind, name) is not None:
            raise InvalidRequest(
                f"{kind}/{name}: a model_weights name sha256:HEX is the model cache's content-addressed "
                "file, offered through artifact_fetch by the nodes that hold it (docs/models.md); "
                "publish under another name"
            )
        if not source.startswith("/"):
            raise SourceInvalid(f"the source must be an absolute path, not {source!r}")
        _check_identity(kind, name, identity or {})
        ns = self._namespace(namespace)
        vast = self.vast_settings(vast) if trigger else None
        return await self._submit(
            Operation(
                id="",
                action="publish",
                kind=kind,
                name=name,
                state="queued",
                created_at=0,
                updated_at=0,
                source=source,
                namespace=ns.to_json(),
                identity=dict(identity or {}),
                vast=vast,
            )
        )

    async def submit_fetch(self, kind: str, name: str) -> Operation:
        check_request(kind, name)
        return await self._submit(
            Operation(id="", action="fetch", kind=kind, name=name, state="queued", created_at=0, updated_at=0)
        )

    async def _submit(self, draft: Operation) -> Operation:
        now = self._wall()
        op = Operation(
            **{
                **draft.__dict__,
                "id": self._new_id(now),
                "created_at": now,
                "updated_at": now,
                "history": (("queued", now),),
            }
        )
        return await self._enqueue(op)

    async def _enqueue(self, op: Operation) -> Operation:
        """Persist ``op`` (queued, or committed for a trigger retry), then hand it to a worker."""
        if self._queued >= MAX_QUEUED:
            raise PlacementBusy(f"{MAX_QUEUED} operations are waiting already; try again later")
        self._queued += 1  # a slot of the channel reserved: the send below cannot block
        try:
            op = await trio.to_thread.run_sync(self._save, op)
        except BaseException:
            self._queued -= 1
            raise
        self._done[op.id] = trio.Event()
        self._send.send_nowait(op.id)
        return op

    async def retry(self, op_id: str) -> Operation:
        """Run a failed operation again: from its trigger when the artifact is committed, else whole."""
        op = self.get(op_id)
        if op.state != "failed":
            raise NotRetryable(f"operation {op_id} is {op.state}; only a failed operation is retried")
        now = self._wall()
        return await self._enqueue(
            op.move("committed" if op.manifest is not None and op.action == "publish" else "queued", now)
        )

    async def _run_publish(self, op: Operation) -> None:
        if op.state == "committed":  # a retry of the trigger: the artifact is there
            await self._send_trigger(op, Manifest.from_json(_dumps(op.manifest)))
            return
        op = await trio.to_thread.run_sync(self._save, op.move("staging", self._wall()))
        files = await trio.to_thread.run_sync(collect_files, Path(op.source))
        total = sum(p.stat().st_size for p in files.values())
        op = await trio.to_thread.run_sync(self._save, _with(op, bytes_total=total))
        store = self._store(Namespace.from_json(op.namespace or {}))
        manifest = await trio.to_thread.run_sync(
            lambda: store.publish(
                op.kind,
                op.name,
                files,
                identity=op.identity,
                sign=self.sign,
                progress=lambda n: self._progress.__setitem__(op.id, n),
            )
        )
        self.counters["published"] += 1
        op = await trio.to_thread.run_sync(
            self._save, op.move("committed", self._wall(), manifest=_loads(manifest), bytes_done=manifest.size)
        )
        log.info(
            "event=artifact_published op=%s kind=%s name=%s bytes=%d location=%s",
            op.id,
            op.kind,
            op.name,
            manifest.size,
            manifest.location,
        )
        if op.vast is not None:
            await self._send_trigger(op, manifest)

    async def _send_trigger(self, op: Operation, manifest: Manifest) -> None:
        settings = VastSettings.from_mapping(op.vast or {})
        result = await self.trigger(settings, build_payload(manifest, op_id=op.id, settings=settings))
        outcome = result.to_mapping()
        if outcome.get("delivered"):
            self.counters["triggered"] += 1
            await trio.to_thread.run_sync(self._save, op.move("triggered", self._wall(), trigger=outcome))
            return
        await trio.to_thread.run_sync(self._save, _with(op, trigger=outcome))
        await self._fail(
            op.id,
            "trigger_failed",
            "artifact published but the VAST trigger failed after "
            f"{outcome.get('attempts', '?')} attempts: {outcome.get('last_error') or 'no reason given'}",
        )

    async def _run_fetch(self, op: Operation) -> None:
        op = await trio.to_thread.run_sync(self._save, op.move("staging", self._wall()))
        manifest, folder, source = await self.materialiser.get(
            op.kind, op.name, progress=lambda n: self._progress.__setitem__(op.id, n)
        )
        await trio.to_thread.run_sync(
            self._save,
            op.move(
                "committed",
                self._wall(),
                manifest=_loads(manifest),
                path=str(folder),
                bytes_done=manifest.size,
                bytes_total=manifest.size,
                namespace={"location": source},
            ),
        )

    def get(self, op_id: str) -> Operation:
        op = self.ops.get(op_id)
        if op is None:
            raise UnknownOperation(f"no placement operation {op_id!r} on this node")
        progress = self._progress.get(op_id)
        return op if progress is None else _with(op, bytes_done=progress)

    async def wait(self, op_id: str) -> Operation:
        """The operation once it rests (triggered, failed, or committed with nothing more due)."""
        self.get(op_id)
        event = self._done.get(op_id)
        if event is not None and not self.ops[op_id].terminal:
            await event.wait()
        return self.get(op_id)

    async def publish(
        self,
        kind: str,
        name: str,
        source: str,
        *,
        identity: Mapping[str, Any] | None = None,
        namespace: Namespace | None = None,
    ) -> Operation:
        """Publish and wait (for callers such as KV export): the finished operation."""
        op = await self.submit_publish(kind, name, source, identity=identity, namespace=namespace)
        return await self.wait(op.id)

    # ---- materialising ------------------------------------------------------------------------
    async def materialise(self, kind: str, name: str) -> tuple[Manifest, Path]:
        """``kind``/``name`` in the local cache, verified: (its manifest, its folder)."""
        check_request(kind, name)
        manifest, folder, _ = await self.materialiser.get(kind, name)
        return manifest, folder

    @contextlib.asynccontextmanager
    async def using(self, kind: str, name: str):
        """Materialise and hold a lease: never evicted nor expired until the block ends."""
        manifest, folder = await self.materialise(kind, name)
        self.cache.acquire((kind, name))
        try:
            yield manifest, folder
        finally:
            self.cache.release((kind, name))

    # ---- the cache, for the API -----------------------------------------------------------------
    async def pin(self, name: str, kind: str | None, on: bool = True) -> list[dict]:
        """Pin (or unpin) ``name`` (of ``kind``, or of every kind); the cached entries it covers."""
        return await trio.to_thread.run_sync(self.cache.pin, name, kind, on)

    def cache_listing(self) -> dict:
        return self.cache.listing()

    async def evict(self, name: str, kind: str | None, namespace: Namespace | None = None) -> dict:
        """Remove ``name`` (of ``kind``, or every kind) from the local cache, and from ``namespace``
        when given (then ``kind`` is required); :class:`ArtifactHeld` for a pinned or used one."""
        keys = [e.key for e in self.cache.index.matching(name, kind)]
        for key in keys:
            if self.cache.index.in_use(key) or self.cache.index.pinned(key):
                why = (
                    "in use (a hosted model or an import)"
                    if self.cache.index.in_use(key)
                    else f"pinned: `hydra placement pin {name} --off` first"
                )
                raise ArtifactHeld(f"{key[0]}/{name} is {why}")
        for key in keys:
            await trio.to_thread.run_sync(self.cache.evict, key)
        removed = None
        if namespace is not None:
            if kind is None:
                raise SourceInvalid("evicting from a namespace needs the kind")
            store = self._store(namespace)
            removed = await trio.to_thread.run_sync(store.remove, kind, name)
        log.info(
            "event=artifact_evict name=%s local=%d namespace=%s removed=%s",
            name,
            len(keys),
            namespace.location if namespace else "-",
            removed,
        )
        return {
            "name": name,
            "kind": kind,
            "evicted": [{"kind": k, "name": n} for k, n in keys],
            "namespace": namespace.location if namespace else None,
            "removed_from_namespace": removed,
        }

    def vast_settings(self, override: Mapping[str, Any] | None = None) -> dict | None:
        """The trigger settings a publish uses: ``override`` (a request's own), else ``[placement]``'s."""
        try:
            vast = VastSettings.from_mapping(override) if override else VastSettings.from_placement(self.settings)
        except (TypeError, ValueError) as exc:
            raise SourceInvalid(f"VAST trigger: {exc}") from None
        return None if vast is None else vast.to_mapping()

    def announce_extra(self) -> dict:
        """``{"artifacts_held": [[kind, name, manifest_id], ...]}``: the most recently used artifacts
        (at most :data:`MAX_ANNOUNCED_ARTIFACTS`, by kind and name), or {}."""
        if self.peer_fetch is None or not self.ready:
            return {}
        if self._held is None or self._held[0] != self.cache.version:
            with self.cache.lock:  # the models fetched by name: announced by ModelShare, signed
                models = self.cache.index.model_keys()
                own = (e for e in self.cache.index.entries.values() if e.key not in models)
                recent = sorted(own, key=lambda e: -e.last_used)[:MAX_ANNOUNCED_ARTIFACTS]
            recent.sort(key=lambda e: e.key)  # a use that does not change the set does not change the announcement
            self._held = (self.cache.version, held_artifacts_extra([manifest_of(e) for e in recent]))
        return self._held[1]

    def status(self) -> PlacementStatus:
        ops = sorted(self.ops.values(), key=lambda o: -o.updated_at)[:STATUS_OPERATIONS]
        idx = self.cache.index
        return PlacementStatus(
            namespaces=[ns.to_json() for ns in self.namespaces],
            vast_trigger=self.settings.vast_trigger_endpoint or None,
            cache={
                "artifacts": len(idx.entries),
                "used_bytes": idx.used_bytes(),
                "capacity_bytes": idx.capacity_bytes,
                "ttl_s": idx.ttl_s,
                "pins": len(idx.pins),
            },
            operations=[_summary(self.get(o.id)) for o in ops],
            counters=dict(self.counters),
        )


def _summary(op: Operation) -> dict:
    return {
        "id": op.id,
        "action": op.action,
        "kind": op.kind,
        "name": op.name,
        "state": op.state,
        "updated_at": op.updated_at,
        "error": op.error,
    }


def _check_identity(kind: str, name: str, identity: Mapping[str, Any]) -> None:
    """The identity a manifest can carry (its bounds) and an operation file can hold (JSON): else 400."""
    try:
        json.dumps(identity)
        Manifest(kind, name, (ArtifactFile("probe", 0, "0" * 64),), identity, "posix:/probe", 0)
    except (TypeError, ValueError) as exc:
        raise SourceInvalid(f"the compatibility identity must be a JSON object of plain values: {exc}") from None
    except ArtifactError as exc:
        raise SourceInvalid(exc.message) from None


def _with(op: Operation, **changes: Any) -> Operation:
    return replace(op, **changes)


def _loads(manifest: Manifest) -> dict:
    return json.loads(manifest.to_json())


def _dumps(doc: Mapping[str, Any] | None) -> str:
    return json.dumps(dict(doc or {}))
