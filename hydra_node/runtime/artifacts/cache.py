"""The local artifact cache index: pure, no I/O, time injected (docs/placement.md "The local cache").

Every artifact this node materialised (from a namespace or a peer) has a :class:`CacheEntry`:
its key ``(kind, name)``, byte size, the manifest (JSON form), when it was materialised and last
used, and where it came from.  The rules:

* **Capacity** (``capacity_bytes``, 0: no limit): making room for ``needed`` bytes evicts the least
  recently used entries first (:meth:`CacheIndex.plan_room`); when even that is not enough the
  plan is ``None`` and nothing is evicted.
* **TTL** (``ttl_s``, 0: none): an entry unused for longer than the TTL is expired
  (:meth:`CacheIndex.expired`).
* **Pins** and **leases**: an entry that is pinned, or leased (in use: a hosted model, an import
  in progress), is never evicted nor expired.  A pin names ``(kind, name)`` or ``(None, name)``
  (every kind) and may precede the artifact: it applies when the artifact arrives.
* **Models fetched by name** (``runtime/fetch/cache.py``): a verified model file is the
  ``model_weights`` entry ``sha256:HEX`` (:func:`model_entry_name`) and :attr:`CacheIndex.models`
  maps each model id to it (:class:`ModelAlias`). Such an entry competes for the capacity like any
  other (``pull --keep`` is its pin), but never expires: a model is evicted only to make room.

:class:`CacheIndex` round-trips through :meth:`to_json` / :meth:`from_json` (the I/O layer writes it
atomically); a malformed index raises :class:`IndexCorrupt`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

__all__ = [
    "INDEX_VERSION",
    "MAX_ENTRIES",
    "MAX_PINS",
    "MODEL_KIND",
    "CacheEntry",
    "CacheIndex",
    "CacheKey",
    "IndexCorrupt",
    "ModelAlias",
    "model_entry_name",
]

INDEX_VERSION = 1
#: Most entries the index holds (it is read and written whole); past it the least recently used
#: evictable entry makes room, and with none evictable the new artifact is refused.
MAX_ENTRIES = 4096
#: Most pins kept (a pin may name an artifact not yet here).
MAX_PINS = 1024

CacheKey = tuple[str, str]  # (kind, name)

#: The kind of a model file fetched by name (and of placement's model artifacts).
MODEL_KIND = "model_weights"


def model_entry_name(sha256: str) -> str:
    """The entry name of the model file whose sha256 is ``sha256`` (the name ``artifact_fetch`` offers it by)."""
    return "sha256:" + sha256


@dataclass(frozen=True)
class ModelAlias:
    """A model id of the model cache: the ``model_weights`` entry holding its file, who vouches for
    the file's sha256 and where this id's bytes came from (``runtime/fetch/cache.py`` ``CachedModel``)."""

    name: str
    sha256_origin: str
    source: str

    @property
    def key(self) -> CacheKey:
        return (MODEL_KIND, self.name)


class IndexCorrupt(ValueError):
    """The persisted index is not one this code wrote."""


@dataclass(frozen=True)
class CacheEntry:
    kind: str
    name: str
    size: int
    manifest: Mapping[str, Any]  # the signed manifest's JSON form (Manifest.to_json parsed)
    manifest_id: str
    source: str  # "posix:/root", "s3://bucket/prefix", "peer:<node id>"
    materialised_at: float
    last_used: float

    @property
    def key(self) -> CacheKey:
        return (self.kind, self.name)


class CacheIndex:
    """What the local cache holds, its pins and leases; the decisions, never the files."""

    def __init__(self, *, capacity_bytes: int = 0, ttl_s: float = 0.0) -> None:
        if capacity_bytes < 0 or ttl_s < 0:
            raise ValueError("capacity_bytes and ttl_s must be >= 0")
        self.capacity_bytes = capacity_bytes
        self.ttl_s = ttl_s
        self.entries: dict[CacheKey, CacheEntry] = {}
        self.pins: set[tuple[str | None, str]] = set()
        self.leases: dict[CacheKey, int] = {}
        #: model id → the entry holding its file (several ids may share one file).
        self.models: dict[str, ModelAlias] = {}

    # ---- reading -----------------------------------------------------------------------------
    def get(self, kind: str, name: str) -> CacheEntry | None:
        return self.entries.get((kind, name))

    def used_bytes(self) -> int:
        return sum(e.size for e in self.entries.values())

    def pinned(self, key: CacheKey) -> bool:
        return (key[0], key[1]) in self.pins or (None, key[1]) in self.pins

    def in_use(self, key: CacheKey) -> bool:
        return self.leases.get(key, 0) > 0

    def model_keys(self) -> set[CacheKey]:
        """The entries that hold a model fetched by name (some model id points at them)."""
        return {a.key for a in self.models.values()}

    def protected(self, key: CacheKey) -> bool:
        """Pinned or in use: never evicted, never expired."""
        return self.pinned(key) or self.in_use(key)

    def expires_at(self, entry: CacheEntry) -> float | None:
        """When ``entry`` expires if nobody uses it (None: never: no TTL, pinned, or a model fetched by name)."""
        if not self.ttl_s or self.pinned(entry.key) or (entry.kind == MODEL_KIND and entry.key in self.model_keys()):
            return None
        return entry.last_used + self.ttl_s

    def expired(self, now: float) -> list[CacheKey]:
        """Keys unused for longer than the TTL, neither pinned nor in use nor a model fetched by
        name, oldest first."""
        if not self.ttl_s:
            return []
        models = self.model_keys()
        old = [
            e
            for e in self.entries.values()
            if now - e.last_used > self.ttl_s and not self.protected(e.key) and e.key not in models
        ]
        return [e.key for e in sorted(old, key=lambda e: e.last_used)]

    def plan_room(
        self, needed: int, *, replacing: CacheKey | None = None, protect: frozenset[CacheKey] = frozenset()
    ) -> list[CacheKey] | None:
        """Keys to evict (least recently used first, whatever their kind) so that ``needed`` more
        bytes fit under the capacity and one more entry fits under :data:`MAX_ENTRIES`;
        ``replacing``: the key the new bytes replace (its old size is freed); ``protect``: keys not
        evicted this time (models in use by the caller).  None when that is impossible."""
        entries = [e for e in self.entries.values() if e.key != replacing]
        used = sum(e.size for e in entries)
        if self.capacity_bytes and needed > self.capacity_bytes:
            return None
        out: list[CacheKey] = []
        candidates = sorted(
            (e for e in entries if not self.protected(e.key) and e.key not in protect), key=lambda e: e.last_used
        )
        count = len(entries)
        for e in candidates:
            fits = (not self.capacity_bytes or used + needed <= self.capacity_bytes) and count < MAX_ENTRIES
            if fits:
                break
            out.append(e.key)
            used -= e.size
            count -= 1
        if (self.capacity_bytes and used + needed > self.capacity_bytes) or count >= MAX_ENTRIES:
            return None
        return out

    # ---- changing ----------------------------------------------------------------------------
    def add(self, entry: CacheEntry) -> None:
        self.entries[entry.key] = entry

    def remove(self, key: CacheKey) -> CacheEntry | None:
        """Forget ``key`` and the model ids pointing at it (the caller checks :meth:`protected`
        first where that matters)."""
        self.models = {mid: a for mid, a in self.models.items() if a.key != key}
        return self.entries.pop(key, None)

    def touch(self, key: CacheKey, now: float) -> None:
        e = self.entries.get(key)
        if e is not None and now > e.last_used:
            self.entries[key] = replace(e, last_used=now)

    def pin(self, kind: str | None, name: str) -> None:
        if (kind, name) not in self.pins and len(self.pins) >= MAX_PINS:
            raise ValueError(f"at most {MAX_PINS} pins; unpin one first")
        self.pins.add((kind, name))

    def unpin(self, kind: str | None, name: str) -> bool:
        """Drop the pin ``(kind, name)``; with ``kind`` None, every pin of ``name``."""
        before = len(self.pins)
        self.pins = {p for p in self.pins if not (p[1] == name and (kind is None or p[0] == kind))}
        return len(self.pins) != before

    def acquire(self, key: CacheKey) -> None:
        if key not in self.entries:
            raise KeyError(key)
        self.leases[key] = self.leases.get(key, 0) + 1

    def release(self, key: CacheKey) -> None:
        n = self.leases.get(key, 0) - 1
        if n > 0:
            self.leases[key] = n
        else:
            self.leases.pop(key, None)

    def matching(self, name: str, kind: str | None = None) -> list[CacheEntry]:
        return [e for e in self.entries.values() if e.name == name and (kind is None or e.kind == kind)]

    # ---- persistence (leases are live state: never persisted) --------------------------------
    def to_json(self) -> dict:
        return {
            "version": INDEX_VERSION,
            "entries": [asdict(e) | {"manifest": dict(e.manifest)} for e in self.entries.values()],
            "pins": sorted([[k, n] for k, n in self.pins], key=lambda p: (p[1], p[0] or "")),
            # a key a reader of the previous generation ignores (its save drops it, never a file)
            "models": {mid: [a.name, a.sha256_origin, a.source] for mid, a in sorted(self.models.items())},
        }

    def load_json(self, data: Any) -> None:
        """Replace entries and pins with ``data`` (from :meth:`to_json`); :class:`IndexCorrupt` otherwise."""
        if not isinstance(data, dict) or data.get("version") != INDEX_VERSION:
            raise IndexCorrupt("not a version-1 placement cache index")
        entries, pins = data.get("entries"), data.get("pins")
        if (
            not isinstance(entries, list)
            or not isinstance(pins, list)
            or len(entries) > MAX_ENTRIES
            or len(pins) > MAX_PINS
        ):
            raise IndexCorrupt("entries and pins must be bounded lists")
        loaded: dict[CacheKey, CacheEntry] = {}
        for raw in entries:
            try:
                e = CacheEntry(**raw)
            except TypeError as exc:
                raise IndexCorrupt(f"bad entry: {exc}") from None
            ok = (
                isinstance(e.kind, str)
                and isinstance(e.name, str)
                and isinstance(e.size, int)
                and e.size >= 0
                and isinstance(e.manifest, dict)
                and isinstance(e.manifest_id, str)
                and isinstance(e.source, str)
                and all(isinstance(t, (int, float)) for t in (e.materialised_at, e.last_used))
            )
            if not ok:
                raise IndexCorrupt(f"bad entry for {raw.get('kind')!r}/{raw.get('name')!r}")
            loaded[e.key] = e
        parsed: set[tuple[str | None, str]] = set()
        for p in pins:
            if not (
                isinstance(p, list)
                and len(p) == 2
                and (p[0] is None or isinstance(p[0], str))
                and isinstance(p[1], str)
            ):
                raise IndexCorrupt(f"bad pin {p!r}")
            parsed.add((p[0], p[1]))
        models = data.get("models", {})
        if not isinstance(models, dict) or len(models) > MAX_ENTRIES:
            raise IndexCorrupt("models must be a bounded table")
        aliases: dict[str, ModelAlias] = {}
        for mid, a in models.items():
            if not (isinstance(a, list) and len(a) == 3 and all(isinstance(x, str) for x in a)):
                raise IndexCorrupt(f"bad model record {mid!r:.80}")
            if (MODEL_KIND, a[0]) in loaded:  # one whose entry is gone is forgotten with it
                aliases[mid] = ModelAlias(a[0], a[1], a[2])
        self.entries, self.pins, self.models = loaded, parsed, aliases

    def keys(self) -> Iterable[CacheKey]:
        return list(self.entries)
