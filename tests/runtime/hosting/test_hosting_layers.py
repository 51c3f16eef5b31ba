"""Placement (hydra_node/runtime/hosting/layers.py): pure, so every case is plain data in, a decision out."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from hydra_node.runtime.hosting.layers import (
    UNKNOWN_RTT_MS,
    IgnoredWorker,
    Placement,
    fits_locally,
    place,
    usable_workers,
)
from hydra_node.runtime.rpc import RPC_PROTO, Capacity, PlanError, WorkerInfo

GB = 1_000_000_000
ME = "a" * 64
PEER = "b" * 64
OTHER = "c" * 64


def worker(peer: str = PEER, free: int = 8 * GB, rtt: float = 1.0) -> WorkerInfo:
    return WorkerInfo(peer, f"peer:{peer}", RPC_PROTO, free, rtt)


# ---- place ----------------------------------------------------------------------------------
def test_a_model_that_fits_runs_locally_without_workers():
    p = place(1 * GB, 30, Capacity(8 * GB), [worker()], force_split=False)
    assert isinstance(p, Placement) and not p.split and not p.fallback
    assert p.plan is not None and p.plan.reason == "fits_locally"


def test_a_model_too_large_for_the_host_is_split_over_a_worker():
    p = place(6 * GB, 30, Capacity(2 * GB), [worker()], force_split=False)
    assert p.split and not p.fallback and p.plan.reason == "too_large_for_host"
    assert p.plan.rpc_endpoints == (f"peer:{PEER}",)


def test_a_model_that_fits_nowhere_raises_plan_error():
    with pytest.raises(PlanError):
        place(60 * GB, 30, Capacity(2 * GB), [worker(free=2 * GB)], force_split=False)


def test_forced_split_uses_a_worker_even_when_the_model_fits():
    p = place(1 * GB, 30, Capacity(8 * GB), [worker()], force_split=True)
    assert p.split and p.plan.reason == "forced"


def test_forced_split_without_workers_waits_then_falls_back_to_the_host():
    with pytest.raises(PlanError, match="waiting up to"):
        place(1 * GB, 30, Capacity(8 * GB), [], force_split=True, waiting_for_workers=True)
    p = place(1 * GB, 30, Capacity(8 * GB), [], force_split=True, waiting_for_workers=False)
    assert p.fallback and not p.split and p.plan is not None


def test_forced_split_without_workers_of_a_model_too_large_raises():
    with pytest.raises(PlanError):
        place(60 * GB, 30, Capacity(2 * GB), [], force_split=True)


def test_an_unknown_layer_count_is_never_split():
    p = place(60 * GB, None, Capacity(1 * GB), [worker()], force_split=True)
    assert p == Placement(None) and not p.split


def test_fits_locally():
    assert fits_locally(1 * GB, 30, Capacity(8 * GB), force_split=False)
    assert not fits_locally(1 * GB, 30, Capacity(8 * GB), force_split=True)
    assert not fits_locally(6 * GB, 30, Capacity(2 * GB), force_split=False)
    assert fits_locally(60 * GB, None, Capacity(1 * GB), force_split=False)  # unknown layers: local


# ---- usable_workers ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Rpc:
    free_bytes: int
    device: str = "CPU"


@dataclass(frozen=True)
class Ann:
    rpc: Rpc | None
    extra: dict = field(default_factory=dict)


def ann(free: int = 4 * GB, *, proto: object = str(RPC_PROTO), lease: str = "") -> Ann:
    return Ann(Rpc(free), {"rpc_proto": proto, "rpc_lease": lease})


def test_usable_workers_keeps_alive_free_peers_and_says_why_others_are_left_out():
    anns = {
        ME: ann(),
        PEER: ann(),
        OTHER: ann(lease="someone/else"),
        "d" * 64: ann(proto="garbage"),
        "e" * 64: ann(),
        "f" * 64: Ann(None),
    }
    states = {PEER: "alive", OTHER: "alive", "d" * 64: "alive", "e" * 64: "suspect", "f" * 64: "alive"}
    rtts = {PEER: 2.5}
    out, ignored = usable_workers(anns, states, rtts.get, own_node_id=ME, lease_holder=f"{ME}/m")
    assert [w.worker_id for w in out] == [PEER]
    assert out[0].endpoint == f"peer:{PEER}" and out[0].rtt_ms == 2.5 and out[0].free_bytes == 4 * GB
    reasons = {i.peer: i.reason for i in ignored}
    assert all(isinstance(i, IgnoredWorker) for i in ignored)
    assert reasons[OTHER].startswith("leased to someone/else")
    assert reasons["d" * 64].startswith("bad RPC protocol version")
    assert reasons["e" * 64] == "peer is suspect"
    assert ME not in reasons and "f" * 64 not in reasons  # ourselves, and a peer without a worker


def test_a_worker_leased_to_us_stays_usable_and_excluded_peers_are_skipped():
    anns = {PEER: ann(lease=f"{ME}/m"), OTHER: ann()}
    states = {PEER: "alive", OTHER: "alive"}
    out, ignored = usable_workers(
        anns, states, lambda _: None, own_node_id=ME, lease_holder=f"{ME}/m", excluded={OTHER}
    )
    assert [w.worker_id for w in out] == [PEER] and not ignored
    assert out[0].rtt_ms == UNKNOWN_RTT_MS  # no measured RTT yet


def test_usable_workers_feed_place():
    anns = {PEER: ann(free=8 * GB)}
    workers, _ = usable_workers(anns, {PEER: "alive"}, lambda _: 1.0, own_node_id=ME, lease_holder=f"{ME}/m")
    assert place(6 * GB, 30, Capacity(2 * GB), workers, force_split=False).split
