"""The local cache's policy (runtime/artifacts/cache.py): LRU within the capacity, TTL, pins, leases."""

from __future__ import annotations

import pytest

from hydra_node.runtime.artifacts.cache import (
    MAX_ENTRIES,
    CacheEntry,
    CacheIndex,
    IndexCorrupt,
)


def entry(name: str, size: int, last_used: float, kind: str = "layer_package") -> CacheEntry:
    return CacheEntry(
        kind=kind,
        name=name,
        size=size,
        manifest={"name": name},
        manifest_id="f" * 64,
        source="posix:/r",
        materialised_at=0.0,
        last_used=last_used,
    )


def index(*entries: CacheEntry, capacity: int = 0, ttl: float = 0.0) -> CacheIndex:
    idx = CacheIndex(capacity_bytes=capacity, ttl_s=ttl)
    for e in entries:
        idx.add(e)
    return idx


def test_room_is_made_least_recently_used_first():
    idx = index(entry("a", 40, 3.0), entry("b", 40, 1.0), entry("c", 20, 2.0), capacity=100)
    assert idx.plan_room(0) == []
    assert idx.plan_room(10) == [("layer_package", "b")]
    assert idx.plan_room(40) == [("layer_package", "b")]
    assert idx.plan_room(41) == [("layer_package", "b"), ("layer_package", "c")]
    assert idx.plan_room(70) == [("layer_package", "b"), ("layer_package", "c"), ("layer_package", "a")]


def test_pinned_and_in_use_entries_are_never_evicted():
    idx = index(entry("old", 50, 1.0), entry("used", 30, 2.0), entry("new", 20, 3.0), capacity=100)
    idx.pin(None, "old")  # every kind of that name
    idx.acquire(("layer_package", "used"))
    assert idx.plan_room(20) == [("layer_package", "new")]
    assert idx.plan_room(60) is None  # only "new" (20) is evictable: 80 + 60 > 100
    idx.release(("layer_package", "used"))
    assert idx.plan_room(50) == [("layer_package", "used"), ("layer_package", "new")]
    assert idx.unpin(None, "old") and not idx.pinned(("layer_package", "old"))


def test_an_artifact_larger_than_the_whole_cache_never_fits():
    assert index(capacity=100).plan_room(101) is None
    assert index(capacity=0).plan_room(10**15) == []  # 0: no limit


def test_replacing_an_entry_frees_its_own_bytes_first():
    idx = index(entry("a", 80, 1.0), entry("b", 10, 2.0), capacity=100)
    assert idx.plan_room(85, replacing=("layer_package", "a")) == []
    assert idx.plan_room(95, replacing=("layer_package", "a")) == [("layer_package", "b")]


def test_ttl_expires_only_unused_unpinned_entries():
    idx = index(entry("a", 1, 100.0), entry("b", 1, 150.0), entry("c", 1, 10.0), entry("d", 1, 20.0), ttl=60)
    idx.pin("layer_package", "c")
    idx.acquire(("layer_package", "d"))
    assert idx.expired(now=200.0) == [("layer_package", "a")]
    assert idx.expires_at(idx.get("layer_package", "c")) is None
    assert idx.expires_at(idx.get("layer_package", "b")) == 210.0
    idx.touch(("layer_package", "a"), 199.0)
    assert idx.expired(now=200.0) == []
    assert index(entry("a", 1, 0.0), ttl=0).expired(now=1e9) == []  # 0: no TTL


def test_a_pin_of_one_kind_does_not_cover_another():
    idx = index(entry("x", 1, 1.0, kind="kv_state"), entry("x", 1, 1.0, kind="layer_package"))
    idx.pin("kv_state", "x")
    assert idx.pinned(("kv_state", "x")) and not idx.pinned(("layer_package", "x"))
    assert [e.kind for e in idx.matching("x", "kv_state")] == ["kv_state"]


def test_the_entry_count_is_bounded():
    idx = index(*(entry(f"n{i}", 0, float(i)) for i in range(MAX_ENTRIES)))
    assert idx.plan_room(0) == [("layer_package", "n0")]
    for i in range(MAX_ENTRIES):
        idx.pin(None, f"n{i}") if i < 1024 else idx.acquire(("layer_package", f"n{i}"))
    assert idx.plan_room(0) is None


def test_the_index_round_trips_without_leases():
    idx = index(entry("a", 5, 1.0), entry("b", 7, 2.0, kind="kv_state"))
    idx.pin(None, "a")
    idx.pin("kv_state", "later")
    idx.acquire(("layer_package", "a"))
    again = CacheIndex()
    again.load_json(idx.to_json())
    assert again.entries == idx.entries and again.pins == idx.pins and again.leases == {}


@pytest.mark.parametrize(
    "data",
    [
        None,
        {"version": 2, "entries": [], "pins": []},
        {"version": 1, "entries": {}, "pins": []},
        {"version": 1, "entries": [{"kind": "x"}], "pins": []},
        {"version": 1, "entries": [], "pins": [["a"]]},
        {"version": 1, "entries": [dict(vars(entry("a", 1, 1.0)), size=-1)], "pins": []},
    ],
)
def test_a_corrupt_index_is_refused(data):
    with pytest.raises(IndexCorrupt):
        CacheIndex().load_json(data)
