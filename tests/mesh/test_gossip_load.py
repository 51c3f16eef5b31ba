"""GossipLoad (hydra_node/mesh/gossip_load.py): dissemination is shed in proportion to loop lag."""

from __future__ import annotations

import random

import pytest

from hydra_node.mesh.gossip_load import GossipLoad


def share_shed(load: GossipLoad, message_type: str = "gossip", n: int = 10_000) -> float:
    rng = random.Random(7)
    return sum(load.shed(message_type, rng.random()) for _ in range(n)) / n


def test_a_calm_loop_sheds_nothing_and_one_late_wake_little():
    load = GossipLoad()
    for _ in range(50):
        load.note_wake(0.0)
    assert load.fraction == 0.0 and share_shed(load) == 0.0
    load.note_wake(0.3)  # one hiccup: the average moves by alpha only
    assert 0.0 < load.fraction < 0.5


def test_a_loop_that_stays_late_sheds_gossip_but_never_probes_or_syncs():
    load = GossipLoad(half_lag_s=0.2, max_fraction=0.8)
    for _ in range(100):
        load.note_wake(0.2)
    assert load.lag_avg_s == pytest.approx(0.2, rel=1e-3) and load.fraction == pytest.approx(0.5, rel=1e-3)
    assert 0.47 < share_shed(load) < 0.53
    for kind in ("ping", "ack", "ping_req", "nack", "suspect", "sync", "dsync", "pull", "leave"):
        assert share_shed(load, kind, 200) == 0.0
    for _ in range(100):
        load.note_wake(30.0)
    assert load.fraction == 0.8  # some dissemination always flows
    for _ in range(100):
        load.note_wake(0.0)
    assert load.fraction < 0.01  # and it recovers when the loop is on time again


def test_bad_settings_and_nan_lag():
    with pytest.raises(ValueError):
        GossipLoad(max_fraction=1.0)
    with pytest.raises(ValueError):
        GossipLoad(half_lag_s=0.0)
    load = GossipLoad()
    load.note_wake(float("nan"))
    assert load.lag_avg_s == 0.0
