"""The dial limiter (hydra_node/mesh/dial_limits.py): per-peer back-off and a budget for never-linked peers."""

from __future__ import annotations

import pytest

from hydra_node.mesh.dial_limits import DialLimiter, DialLimits, inbound_wait, predial_delay


def test_a_flood_of_introduced_peers_costs_at_most_the_budget():
    lim = DialLimiter(DialLimits(new_peer_burst=10, new_peer_rate_per_s=2.0))
    allowed = sum(lim.allow(f"fake{i}", 0.0) for i in range(200))
    assert allowed == 10 and lim.deferred == 190
    # a minute later: burst refilled, but never more than the rate allows over that minute
    allowed = sum(lim.allow(f"fake{i}", 60.0) for i in range(200, 400))
    assert allowed == 10
    assert sum(lim.allow(f"more{i}", 60.5) for i in range(5)) == 1  # 0.5 s at 2/s


def test_failures_back_off_per_peer_and_a_link_resets_it():
    lim2 = DialLimiter(DialLimits(base_backoff_s=1.0, max_backoff_s=8.0))
    for n, expect in enumerate([1.0, 2.0, 4.0, 8.0, 8.0]):
        lim2.failed("q", 0.0)
        assert not lim2.allow("q", expect - 0.01) and lim2.allow("q", expect)
    lim2.linked("q")
    assert lim2.allow("q", 0.0)


def test_linked_peers_do_not_draw_from_the_new_peer_budget():
    lim = DialLimiter(DialLimits(new_peer_burst=1, new_peer_rate_per_s=0.0))
    lim.linked("known")
    assert lim.allow("stranger", 0.0) and not lim.allow("stranger2", 0.0)
    assert all(lim.allow("known", 0.0) for _ in range(10))


def test_tables_stay_bounded():
    lim = DialLimiter(DialLimits(max_tracked=100))
    for i in range(1000):
        lim.failed(f"p{i}", 0.0)
        lim.linked(f"l{i}")
    assert len(lim._failures) <= 100 and len(lim._next_ok) <= 100 and len(lim._linked) <= 100


def test_backoff_is_jittered_so_peers_that_failed_together_retry_apart():
    lim = DialLimiter(DialLimits(base_backoff_s=1.0, max_backoff_s=8.0, backoff_jitter=0.25))
    low, high = lim.failed("a", 0.0, u=0.0), lim.failed("b", 0.0, u=0.999)
    assert low == 0.75 and 1.24 < high < 1.25
    assert lim.allow("a", 0.8) and not lim.allow("b", 0.8)
    # the cap holds with jitter too: never more than max * (1 + jitter)
    for _ in range(10):
        delay = lim.failed("c", 0.0, u=0.999)
    assert 8.0 < delay < 10.0


def test_exactly_one_side_of_each_pair_dials_ahead_of_need():
    ids = [f"{i:02x}" * 32 for i in range(0, 200, 7)]
    limits = DialLimits(predial_spread_s=2.0)
    for a in ids:
        assert predial_delay(a, a, 0.5, limits) is None
        for b in ids:
            if a != b:
                mine, theirs = predial_delay(a, b, 0.5, limits), predial_delay(b, a, 0.5, limits)
                assert (mine is None) != (theirs is None)
    assert predial_delay("aa", "bb", 0.0, limits) == 0.0 and predial_delay("aa", "bb", 0.75, limits) == 1.5


def test_the_larger_id_gives_the_smaller_a_grace_to_dial_in_first():
    limits = DialLimits(inbound_grace_s=2.0)
    assert inbound_wait("aa", "bb", 0.5, limits) == 0.0  # we are the side to dial
    assert inbound_wait("bb", "aa", 0.0, limits) == 2.0 and inbound_wait("bb", "aa", 0.5, limits) == 3.0
    lim = DialLimiter(limits)
    assert not lim.was_linked("aa")
    lim.linked("aa")
    assert lim.was_linked("aa")  # the link table redials such a peer at once


def test_limits_are_validated():
    with pytest.raises(ValueError, match="max_concurrent"):
        DialLimits(max_concurrent=0)
    with pytest.raises(ValueError, match="predial_spread_s"):
        DialLimits(predial_spread_s=-1.0)
