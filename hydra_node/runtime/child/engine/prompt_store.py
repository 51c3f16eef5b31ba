"""The prompt cache's bookkeeping (pure: no llama.cpp, no files, no clock): which saved prefixes each
tier holds, LRU by bytes, and the longest one a new prompt starts with.

When a slot's cached prefix is about to be lost (the slot is reused for another prompt, evicted for
room, the runner stops) the engine saves that sequence's KV state (docs/prompt-cache.md).  Two
tiers hold the saved states:

* RAM (``ram_bytes``): the state buffers themselves, in this process;
* disk (``disk_bytes``): ``kv_state`` files under the node home (:mod:`~hydra_node.runtime.child.engine.prompt_tiers`),
  written behind every RAM save, so they survive a runner or node restart.

Each tier is an :class:`LruBytes`: least recently used first out when the bytes would exceed the
capacity; an entry larger than the whole tier is not taken (0 disables the tier).  A state is keyed
by the sha256 of its token ids (:func:`~hydra_node.runtime.artifacts.kv_identity.prefix_sha256`); its
tokens are the exact prefix it holds.  :meth:`PromptStore.lookup` finds the entry sharing the longest
common prefix with a prompt (the engine loads it, then drops the cells past that prefix);
:meth:`PromptStore.covered` says a new state is not worth saving because an entry already extends it,
and :meth:`PromptStore.superseded` names the entries a new state makes useless (their tokens are a
prefix of the new one's).
"""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from hydra_node.runtime.artifacts.kv_identity import prefix_sha256
from hydra_node.runtime.child.engine.media import is_media

__all__ = ["LruBytes", "PromptStore", "StoreStatistics", "TierHit", "common_prefix", "prompt_key"]

V = TypeVar("V")


def prompt_key(tokens: Sequence[int]) -> str:
    """A saved state's key and file name stem: the hex sha256 of its packed token ids.

    A prefix holding image positions (placeholder ids, negative: engine/media.py) is packed as
    little-endian int32, which for token ids (``0 <= id < 2**31``) are the very bytes of the uint32
    packing :func:`~hydra_node.runtime.artifacts.kv_identity.prefix_sha256` hashes; such a state lives in
    the RAM tier only (:meth:`PromptTiers.save <hydra_node.runtime.child.engine.prompt_tiers.PromptTiers.save>`)."""
    if any(is_media(t) for t in tokens):
        return hashlib.sha256(struct.pack(f"<{len(tokens)}i", *tokens)).hexdigest()
    return prefix_sha256(tokens)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@dataclass
class _Item(Generic[V]):
    tokens: tuple[int, ...]
    nbytes: int
    value: V


class LruBytes(Generic[V]):
    """Entries (key -> tokens, size, value) bounded by total bytes; the least recently used go first."""

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"a tier's capacity must not be negative, not {capacity}")
        self.capacity = capacity
        self.bytes = 0
        self._items: OrderedDict[str, _Item[V]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def fits(self, nbytes: int) -> bool:
        return 0 < nbytes <= self.capacity

    def put(self, key: str, tokens: tuple[int, ...], nbytes: int, value: V) -> list[tuple[str, V]]:
        """Add (or replace) ``key`` as the most recently used; returns the entries evicted for room,
        least recently used first.  An entry that cannot fit the whole tier is not added (returned)."""
        if not self.fits(nbytes):
            return [(key, value)]
        out = []
        old = self._items.pop(key, None)
        if old is not None:
            self.bytes -= old.nbytes
        while self._items and self.bytes + nbytes > self.capacity:
            k, item = self._items.popitem(last=False)
            self.bytes -= item.nbytes
            out.append((k, item.value))
        self._items[key] = _Item(tuple(tokens), nbytes, value)
        self.bytes += nbytes
        return out

    def get(self, key: str) -> V | None:
        item = self._items.get(key)
        return None if item is None else item.value

    def tokens(self, key: str) -> tuple[int, ...]:
        return self._items[key].tokens

    def touch(self, key: str) -> None:
        self._items.move_to_end(key)

    def pop(self, key: str) -> V | None:
        item = self._items.pop(key, None)
        if item is None:
            return None
        self.bytes -= item.nbytes
        return item.value

    def keys(self) -> list[str]:
        """Least recently used first."""
        return list(self._items)

    def entries(self) -> Iterator[tuple[str, tuple[int, ...]]]:
        for k, item in self._items.items():
            yield k, item.tokens


@dataclass(frozen=True)
class TierHit:
    """A saved state whose first ``common`` tokens are the prompt's: ``tier`` is ``"ram"`` or ``"disk"``,
    ``n_tokens`` how many cells it holds (all are loaded, then the ones past ``common`` dropped)."""

    key: str
    tier: str
    common: int
    n_tokens: int


@dataclass(frozen=True)
class StoreStatistics:
    hits_ram: int
    hits_disk: int
    misses: int  # lookups (admissions) that found no saved prefix worth restoring
    restored_tokens: int
    ram_entries: int
    ram_bytes: int
    disk_entries: int
    disk_bytes: int


class PromptStore(Generic[V]):
    """The RAM tier (values: the engine's state buffers) and the disk tier (values: file sizes) with the
    longest-prefix lookup.  ``min_tokens``: the shortest state worth saving, and the least a restore
    must gain over what a slot already holds."""

    def __init__(self, ram_bytes: int, disk_bytes: int, min_tokens: int) -> None:
        if min_tokens < 1:
            raise ValueError(f"min_tokens must be at least 1, not {min_tokens}")
        self.ram: LruBytes[V] = LruBytes(ram_bytes)
        self.disk: LruBytes[int] = LruBytes(disk_bytes)
        self.min_tokens = min_tokens
        self._counts = [0, 0, 0, 0]  # ram hits, disk hits, misses, restored tokens

    @property
    def enabled(self) -> bool:
        return self.ram.capacity > 0 or self.disk.capacity > 0

    def worth_saving(self, tokens: Sequence[int], kept: int) -> bool:
        """A slot losing ``tokens`` (it keeps the first ``kept``): long enough, losing enough, and not
        already held by an entry that starts with them."""
        n = len(tokens)
        return self.enabled and n >= self.min_tokens and n - kept >= self.min_tokens and not self.covered(tokens)

    def covered(self, tokens: Sequence[int]) -> bool:
        """True when an entry of either tier starts with all of ``tokens`` (saving them adds nothing);
        that entry counts as used now."""
        n = len(tokens)
        for tier in (self.ram, self.disk):
            for k, held in tier.entries():
                if len(held) >= n and held[0] == tokens[0] and common_prefix(held, tokens) == n:
                    tier.touch(k)
                    return True
        return False

    def superseded(self, tokens: Sequence[int], tier: str) -> list[str]:
        """Keys of ``tier`` whose tokens are a proper prefix of ``tokens``: a state of ``tokens`` serves
        every prompt they serve (drop them when it is saved)."""
        lru = self.ram if tier == "ram" else self.disk
        n = len(tokens)
        return [
            k
            for k, held in lru.entries()
            if len(held) < n and held and held[0] == tokens[0] and common_prefix(held, tokens) == len(held)
        ]

    def lookup(self, prompt: Sequence[int], limit: int, better_than: int) -> TierHit | None:
        """The entry sharing the longest prefix with ``prompt`` (at most ``limit`` tokens of it are
        used), when that beats ``better_than`` (what a slot already offers) by ``min_tokens``; RAM wins
        a tie.  Counts a hit (the caller restores it) or a miss."""
        best: TierHit | None = None
        if min(limit, len(prompt)) < max(better_than + self.min_tokens, self.min_tokens):
            self._counts[2] += 1  # no entry could share enough: the scan is skipped
            return None
        if prompt and self.enabled:
            for name, tier in (("ram", self.ram), ("disk", self.disk)):
                for k, held in tier.entries():
                    if not held or held[0] != prompt[0]:
                        continue
                    n = min(common_prefix(held, prompt), limit)
                    if best is None or n > best.common:
                        best = TierHit(k, name, n, len(held))
        if best is None or best.common < better_than + self.min_tokens or best.common < self.min_tokens:
            self._counts[2] += 1
            return None
        return best

    def restored(self, hit: TierHit, ok: bool) -> None:
        """The engine loaded ``hit`` (``ok``) or could not (the entry is then dropped by the caller)."""
        if ok:
            self._counts[0 if hit.tier == "ram" else 1] += 1
            self._counts[3] += hit.common
            (self.ram if hit.tier == "ram" else self.disk).touch(hit.key)
        else:
            self._counts[2] += 1

    def statistics(self) -> StoreStatistics:
        return StoreStatistics(
            hits_ram=self._counts[0],
            hits_disk=self._counts[1],
            misses=self._counts[2],
            restored_tokens=self._counts[3],
            ram_entries=len(self.ram),
            ram_bytes=self.ram.bytes,
            disk_entries=len(self.disk),
            disk_bytes=self.disk.bytes,
        )
