"""Backoff and CrashLoop: pure restart policies, stepped through with injected time."""

from __future__ import annotations

import math

import pytest

from hydra_node.backoff import Backoff, CrashLoop


def test_delay_grows_by_factor_caps_and_jitters_both_ways():
    b = Backoff(initial_s=0.5, factor=2.0, max_s=4.0, jitter=0.25)
    assert [b.delay(n, 0.5) for n in range(6)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert b.delay(0, 0.0) == pytest.approx(0.375)
    assert b.delay(0, 0.999999) == pytest.approx(0.625, abs=1e-5)
    assert b.delay(10_000, 0.5) == 4.0  # no float overflow on a long outage
    assert Backoff(initial_s=5.0, max_s=1.0, jitter=0.0).delay(0, 0.0) == 1.0  # the cap wins


def test_schedule_doubles_while_it_keeps_failing_and_resets_after_a_healthy_run():
    s = Backoff(initial_s=1.0, factor=2.0, max_s=8.0, jitter=0.0, reset_after_s=30.0).schedule()
    now = 100.0
    assert [s.next_delay(now + i, 0.3) for i in range(5)] == [1.0, 2.0, 4.0, 8.0, 8.0]
    s.healthy(200.0)
    assert s.next_delay(229.0, 0.3) == 8.0  # up 29 s: not healthy long enough, still capped
    s.healthy(300.0)
    assert s.next_delay(330.0, 0.3) == 1.0  # up 30 s: starts over
    assert s.next_delay(331.0, 0.3) == 2.0
    assert s.next_delay(10_000.0, 0.3) == 4.0  # a long pause while down is not a healthy run


def test_schedule_reset():
    s = Backoff(initial_s=1.0, jitter=0.0).schedule()
    s.next_delay(0.0, 0.0)
    s.next_delay(1.0, 0.0)
    s.reset()
    assert s.next_delay(2.0, 0.0) == 1.0


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(max_s=-1.0),
        dict(factor=0.5),
        dict(jitter=1.0),
        dict(jitter=-0.1),
        dict(initial_s=-1.0),
        dict(reset_after_s=-1.0),
    ],
)
def test_backoff_rejects_nonsense(kwargs):
    with pytest.raises(ValueError):
        Backoff(**kwargs)


def test_crash_loop_gives_up_on_n_crashes_within_the_window():
    loop = CrashLoop(max_crashes=3, window_s=60.0)
    assert not loop.record(0.0)
    assert not loop.record(10.0)
    assert not loop.record(61.0)  # the crash at 0 is outside the window ending at 61
    assert loop.count(61.0) == 2
    assert loop.record(65.0)  # 10, 61, 65: three within 60 s
    assert loop.count(65.0) == 3


def test_crash_loop_spread_out_crashes_never_give_up():
    loop = CrashLoop(max_crashes=2, window_s=10.0)
    assert not any(loop.record(t * 11.0) for t in range(100))


def test_crash_loop_without_window_counts_in_a_row_until_reset():
    loop = CrashLoop(max_crashes=2, window_s=math.inf)
    assert not loop.record(0.0)
    loop.reset()
    assert not loop.record(1_000.0)
    assert loop.record(1_000_000.0)


@pytest.mark.parametrize("args", [(0, 1.0), (3, 0.0)])
def test_crash_loop_rejects_nonsense(args):
    with pytest.raises(ValueError):
        CrashLoop(*args)
