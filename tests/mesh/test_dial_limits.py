"""The dial limiter (hydra_node/mesh/dial_limits.py): per-peer back-off and a budget for never-linked peers."""

from __future__ import annotations

from hydra_node.mesh.dial_limits import DialLimiter, DialLimits


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
