"""Materialising an artifact into the local cache (docs/placement.md "Fetch and verify").

Where :meth:`Materialiser.get` looks, in order: the local cache; the configured namespaces (POSIX
root, then S3), each asked for its committed manifest first; then the alive peers whose mesh
announcement lists the artifact (``artifacts_held``), lowest RTT first.  Stores and
``fetch_from_peer`` verify every file's size and sha256 and the manifest's signature while
materialising through a staging folder; a peer's artifact must moreover be signed by this node
or a member of its mesh, and so must a ``kv_state`` from a namespace (its cells go into a runner),
whose ``state.hykv`` is also checked (sha256, llama.cpp cell table:
:func:`~hydra_node.runtime.artifacts.kv_cells.check_state_file`) before it enters the cache index
(a refused one's folder is removed at once).  A corrupt or tampered artifact is refused (counted
in ``refused_corrupt``, logged ``event=artifact_refused``) and the next source is tried; nothing
unverified ever reaches the cache index.  Capacity is made before the transfer (after it, for a
peer: its size arrives with its manifest).  ``on_materialised(kind, name, source, nbytes, seconds)`` reports
every transfer (the root feeds the scheduler's telemetry).
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from hydra_node.runtime.artifacts.errors import (
    ArtifactError,
    ArtifactNotFound,
    StoreUnavailable,
)
from hydra_node.runtime.artifacts.kv_cells import check_state_file
from hydra_node.runtime.artifacts.kv_state import KV_STATE_FILE
from hydra_node.runtime.artifacts.local_cache import LocalCache
from hydra_node.runtime.artifacts.manifest import Manifest
from hydra_node.runtime.artifacts.peer_wire import held_artifacts_from_extra
from hydra_node.runtime.artifacts.settings import Namespace
from hydra_node.runtime.artifacts.store import Progress
from hydra_node.runtime.peers import PeerView, link_rtt_ms

__all__ = ["CORRUPT_CODES", "Materialiser", "PeerFetch"]

log = logging.getLogger("hydra.placement")

#: Error codes meaning the bytes or the manifest were not what was signed: refused, never used.
CORRUPT_CODES = ("checksum_mismatch", "signature_invalid", "manifest_invalid")
#: Kinds whose bytes go into a runner (a KV state is attention context): from a namespace too, only
#: when signed by this node or a member of its mesh.
SIGNER_CHECKED_KINDS = frozenset({"kv_state"})

PeerFetch = Callable[..., Awaitable[Manifest]]  # peer.fetch_from_peer with the mesh bound


class Materialiser:
    def __init__(
        self,
        cache: LocalCache,
        namespaces: list[Namespace],
        store: Callable[[Namespace], Any],
        *,
        node_id: str,
        mesh: PeerView | None,
        peer_fetch: PeerFetch | None,
        on_materialised: Callable[[str, str, str, int, float], None] | None,
        counters: dict[str, int],
    ) -> None:
        self.cache = cache
        self.namespaces = namespaces
        self.store = store
        self.node_id = node_id
        self.mesh = mesh
        self.peer_fetch = peer_fetch
        self.on_materialised = on_materialised
        self.counters = counters
        self._locks: dict[tuple[str, str], trio.Lock] = {}  # one transfer of an artifact at a time

    async def get(self, kind: str, name: str, progress: Progress | None = None) -> tuple[Manifest, Path, str]:
        """(manifest, folder, where it came from: ``"cache"``, a namespace's location, ``"peer:ID"``)."""
        async with self._locks.setdefault((kind, name), trio.Lock()):
            hit = await trio.to_thread.run_sync(self.cache.lookup, kind, name)
            if hit is not None:
                self.counters["cache_hits"] += 1
                return hit[0], hit[1], "cache"
            tried: list[str] = []
            trust = self._trusted if kind in SIGNER_CHECKED_KINDS else None
            for ns in self.namespaces:
                store = self.store(ns)
                try:
                    found = await trio.to_thread.run_sync(store.manifest, kind, name)
                    if found is None:
                        tried.append(f"{ns.location}: absent")
                        continue
                    return await self._fill(
                        kind,
                        name,
                        found.size,
                        ns.location,
                        lambda dest, store=store: trio.to_thread.run_sync(
                            lambda: store.fetch(kind, name, dest, progress=progress, trust=trust)
                        ),
                    )
                except StoreUnavailable as exc:
                    tried.append(f"{ns.location}: {exc.message}")
            peer_fetch = self.peer_fetch
            for peer_id in self.holders(kind, name):
                assert peer_fetch is not None  # holders() finds none without it
                try:
                    return await self._fill(
                        kind,
                        name,
                        0,
                        f"peer:{peer_id}",
                        lambda dest, peer_id=peer_id: peer_fetch(
                            peer_id, kind, name, dest, trust=self._trusted, progress=progress
                        ),
                    )
                except ArtifactError as exc:
                    if exc.code in CORRUPT_CODES:
                        self.counters["refused_corrupt"] += 1
                    tried.append(f"peer {peer_id[:12]}: {exc.code}: {exc.message}")
            raise ArtifactNotFound(
                f"{kind}/{name} is not in the local cache"
                + ("; " + "; ".join(tried) if tried else ", no namespace is configured and no peer announces it")
            )

    async def _fill(self, kind: str, name: str, size: int, source: str, fetch) -> tuple[Manifest, Path, str]:
        await trio.to_thread.run_sync(self.cache.make_room, size, (kind, name))
        started = time.perf_counter()
        folder = self.cache.folder(kind, name)
        try:
            manifest = await fetch(folder)
            if kind == "kv_state":  # its cells, before it is kept or offered to peers
                await self._check_kv_state(folder, source)
        except ArtifactError as exc:
            if exc.code in CORRUPT_CODES:
                log.warning("event=artifact_refused kind=%s name=%s source=%s code=%s", kind, name, source, exc.code)
            raise
        elapsed = time.perf_counter() - started
        await trio.to_thread.run_sync(self.cache.add, manifest, source)
        if not size:  # a peer's size is known once its manifest arrived: enforce the capacity now
            self.cache.acquire((kind, name))
            try:
                await trio.to_thread.run_sync(self.cache.make_room, 0, None)
            except ArtifactError:
                self.cache.release((kind, name))
                await trio.to_thread.run_sync(self.cache.evict, (kind, name))
                raise
            self.cache.release((kind, name))
        self.counters["fetched"] += 1
        log.info(
            "event=artifact_materialised kind=%s name=%s source=%s bytes=%d seconds=%.3f",
            kind,
            name,
            source,
            manifest.size,
            elapsed,
        )
        if self.on_materialised is not None:
            self.on_materialised(manifest.kind, manifest.name, source, manifest.size, elapsed)
        return manifest, folder, source

    async def _check_kv_state(self, folder: Path, source: str) -> None:
        """A fetched kv_state artifact's state file (header, sha256, llama.cpp cell table); refused,
        its folder removed (never cached, never announced), when it would not load as one sequence."""
        try:
            await trio.to_thread.run_sync(_check_kv_state, folder)
        except ArtifactError as exc:
            await trio.to_thread.run_sync(lambda: shutil.rmtree(folder, ignore_errors=True))
            if exc.code not in CORRUPT_CODES:  # those are counted (peers) and logged by the callers
                self.counters["refused_corrupt"] += 1
                log.warning(
                    "event=artifact_refused kind=kv_state name=%s source=%s code=%s reason=%s",
                    folder.name,
                    source,
                    exc.code,
                    exc.message,
                )
            raise

    def _trusted(self, node_id: str) -> bool:
        """A peer-sent artifact must be signed by this node or a member of its mesh."""
        return node_id == self.node_id or (self.mesh is not None and node_id in self.mesh.members())

    def holders(self, kind: str, name: str) -> list[str]:
        """Alive peers announcing ``kind``/``name`` (none without a peer fetch), lowest RTT first."""
        if self.mesh is None or self.peer_fetch is None:
            return []
        states = self.mesh.member_states(trio.current_time())
        found = []
        for peer_id, ann in self.mesh.members().items():
            if states.get(peer_id) == "alive" and (kind, name) in held_artifacts_from_extra(dict(ann.extra)):
                rtt = link_rtt_ms(self.mesh, peer_id)
                found.append((float("inf") if rtt is None else rtt, peer_id))
        return [pid for _, pid in sorted(found)]


def _check_kv_state(folder: Path) -> None:
    """A fetched kv_state artifact's ``state.hykv``: header, state sha256, llama.cpp cell table (an
    artifact without one is kept: nothing imports it, ``POST /api/kv/import`` loads only that file)."""
    if (folder / KV_STATE_FILE).exists():
        check_state_file(folder / KV_STATE_FILE, verify_sha256=True)
