"""The adaptive draft-length policy, with injected timings (no clock, no model)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from hydra_node.runtime.child.speculative.controller import (
    ControllerConfig,
    SpeculationController,
    expected_tokens,
    leviathan_speedup,
)

MS = 1e-3


def test_expected_tokens_and_speedup_match_the_paper_tables():
    assert expected_tokens(0.8, 4) == pytest.approx(3.36, abs=0.005)
    assert expected_tokens(0.6, 8) == pytest.approx(2.47, abs=0.005)
    assert expected_tokens(1.0, 5) == 6.0
    assert expected_tokens(0.0, 5) == 1.0
    assert leviathan_speedup(0.8, 4, 0.1) == pytest.approx(2.40, abs=0.005)
    assert leviathan_speedup(0.9, 8, 0.1) == pytest.approx(3.40, abs=0.005)


def feed(
    ctl: SpeculationController, accept_rate: float, rounds: int, t_target=10 * MS, t_draft=1 * MS, slope=1 * MS, rtt=0.0
) -> list[int]:
    """Drive the controller as a decoder would; acceptance is deterministic at accept_rate."""
    ks = []
    credit = 0.0
    for _ in range(rounds):
        k = ctl.choose_k()
        ks.append(k)
        if k == 0:
            ctl.record_target_step(t_target)
            continue
        accepted = 0
        while accepted < k:
            credit += accept_rate
            if credit < 1.0:
                break
            credit -= 1.0
            accepted += 1
        ctl.record_round(k, accepted, k * t_draft, t_target + slope * k, rtt)
    return ks


def test_first_steps_measure_target_then_draft():
    ctl = SpeculationController()
    assert ctl.choose_k() == 0
    ctl.record_target_step(10 * MS)
    assert ctl.choose_k() == 4
    ctl.record_round(4, 4, 4 * MS, 14 * MS)
    assert ctl.choose_k() >= 1


def test_high_acceptance_and_cheap_draft_choose_long_drafts():
    ctl = SpeculationController(ControllerConfig(draft_max_tokens=12))
    ks = feed(ctl, 1.0, 60)
    assert ks[-1] >= 8
    s = ctl.statistics()
    assert s.acceptance_rate > 0.9 and s.speculating
    assert s.predicted_speedup > 2.0
    assert s.measured_speedup > 2.0
    assert s.tokens_per_round > 5


def test_moderate_acceptance_prefers_shorter_drafts_than_perfect():
    hi = SpeculationController(ControllerConfig(draft_max_tokens=12))
    lo = SpeculationController(ControllerConfig(draft_max_tokens=12))
    feed(hi, 1.0, 80)
    feed(lo, 0.6, 80)
    assert 1 <= lo.best_k()[0] < hi.best_k()[0]


def test_rtt_pushes_k_up():
    near = SpeculationController(ControllerConfig(draft_max_tokens=16))
    far = SpeculationController(ControllerConfig(draft_max_tokens=16))
    feed(near, 0.8, 80, rtt=0.0)
    feed(far, 0.8, 80, rtt=30 * MS)
    assert far.best_k()[0] > near.best_k()[0]


def test_zero_acceptance_falls_back_then_reprobes_and_returns():
    cfg = ControllerConfig(reprobe_after_tokens=8, reprobe_max_tokens=32)
    ctl = SpeculationController(cfg)
    ks = feed(ctl, 0.0, 200, t_draft=5 * MS)
    assert not ctl.statistics().speculating
    tail = ks[-100:]
    assert tail.count(0) > 90  # mostly plain decoding
    assert any(k > 0 for k in tail)  # but it keeps probing
    back = feed(ctl, 1.0, 400, t_draft=1 * MS)  # acceptance comes back
    assert ctl.statistics().speculating
    assert back[-50:].count(0) <= 3  # only the periodic t_target refresh


def test_reprobe_interval_backs_off():
    ctl = SpeculationController(ControllerConfig(reprobe_after_tokens=4, reprobe_max_tokens=16))
    ks = feed(ctl, 0.0, 150, t_draft=5 * MS)
    probes = [i for i, k in enumerate(ks) if k > 0 and (i == 0 or ks[i - 1] == 0)]  # each probe's first round
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert gaps[-1] > gaps[1]
    assert max(gaps) <= 16 + ControllerConfig().probe_rounds


def test_a_slow_draft_is_not_worth_it_even_when_accepted():
    ctl = SpeculationController()
    feed(ctl, 0.9, 100, t_target=10 * MS, t_draft=12 * MS)
    assert not ctl.statistics().speculating


def test_config_and_round_validation():
    with pytest.raises(ValueError):
        ControllerConfig(draft_min_tokens=0)
    with pytest.raises(ValueError):
        ControllerConfig(draft_min_tokens=5, draft_max_tokens=4)
    ctl = SpeculationController()
    with pytest.raises(ValueError):
        ctl.record_round(2, 3, 1.0, 1.0)
    with pytest.raises(ValueError):
        ctl.record_round(0, 0, 1.0, 1.0)


def test_verify_cost_is_learned_per_k_and_extrapolated_linearly():
    ctl = SpeculationController()
    ctl.record_target_step(10 * MS)
    assert ctl.t_verify(4) == pytest.approx(10 * MS * (1 + 4 * ControllerConfig().verify_slope_prior))
    ctl.record_round(3, 3, 3 * MS, 40 * MS)
    assert ctl.t_verify(3) == pytest.approx(40 * MS)  # measured
    assert ctl.t_verify(6) == pytest.approx(10 * MS + 6 * 10 * MS)  # slope (40 - 10) / 3 per token


def test_a_costly_first_batch_step_favours_long_drafts():
    """CPU-like verify cost: a batch of 2 costs twice a step, more tokens little more."""
    ctl = SpeculationController(ControllerConfig(draft_max_tokens=8))
    t = 10 * MS
    ctl.record_target_step(t)
    for _ in range(30):
        for k in range(1, 9):
            ctl.record_round(k, k, k * 0.3 * t, 2 * t + 0.2 * t * (k - 1))
    assert ctl.best_k()[0] == 8
    assert ctl.predicted_speedup(1) < 1.0 < ctl.predicted_speedup(8)


def test_hopeless_pair_falls_back_after_one_round():
    """Draft as slow as the target: even full acceptance cannot pay, so no waiting for evidence."""
    ctl = SpeculationController()
    assert ctl.choose_k() == 0
    ctl.record_target_step(10 * MS)
    k = ctl.choose_k()
    ctl.record_round(k, k, k * 10 * MS, 30 * MS)
    assert ctl.choose_k() == 0
    assert not ctl.statistics().speculating


# ---- the measured switch-off (speculation inside the engine: engine/speculation.py) -------------


def test_measured_rate_switches_off_what_the_model_predicts_would_pay():
    """The model (t_draft from representative rounds only) says S > 1, but every round costs more
    per emitted token than a plain step (a draft that always catches up): measured wins."""
    ctl = SpeculationController()
    assert ctl.choose_k() == 0
    ctl.record_target_step(10 * MS)
    k = ctl.choose_k()
    ctl.record_round(k, k, k * 1 * MS, 14 * MS)  # one cheap, representative round
    for _ in range(8):
        k = ctl.choose_k()
        if k == 0:
            ctl.record_target_step(10 * MS)
            continue
        # slow catch-up rounds: 150 ms of draft work, kept out of t_draft (not representative)
        ctl.record_round(k, k, 150 * MS, 14 * MS, draft_cost_representative=False)
    assert ctl.best_k()[1] > 1.0  # the model still predicts a gain
    assert ctl.recent_speedup() < 1.0
    assert not ctl.statistics().speculating


def test_resuming_needs_the_measured_speedup_above_the_hysteresis_band():
    cfg = ControllerConfig(reprobe_after_tokens=4, reprobe_max_tokens=4, cost_weight=1.0)
    ctl = SpeculationController(cfg)
    feed(ctl, 0.0, 60, t_draft=5 * MS)  # useless: off
    assert not ctl.statistics().speculating
    # probes that measure 1.02x (between min_speedup 1.0 and resume_speedup 1.05): stays off
    for _ in range(200):
        k = ctl.choose_k()
        if k == 0:
            ctl.record_target_step(10 * MS)
        else:
            ctl.record_round(k, k, 0.0, (k + 1) * 10 * MS / 1.02)
    assert not ctl.statistics().speculating
    for _ in range(40):  # probes that measure 1.5x: back on
        k = ctl.choose_k()
        if k == 0:
            ctl.record_target_step(10 * MS)
        else:
            ctl.record_round(k, k, 0.0, (k + 1) * 10 * MS / 1.5)
    assert ctl.statistics().speculating


@settings(max_examples=12, deadline=None)
@given(alpha=st.floats(0.0, 1.0), c=st.floats(0.05, 1.5), verify_slope=st.floats(0.3, 2.0), rtt=st.floats(0.0, 0.02))
def test_a_draft_that_never_pays_costs_at_most_five_percent(alpha, c, verify_slope, rtt):
    """Whatever the acceptance and costs, when no round can beat a plain step per token, the
    controller's total time over 2000 tokens stays within 5 % of plain decoding."""
    t = 10 * MS
    ctl = SpeculationController()
    spent = 0.0
    tokens = 0
    credit = 0.0
    while tokens < 2000:
        k = ctl.choose_k()
        if k == 0:
            ctl.record_target_step(t)
            spent += t
            tokens += 1
            continue
        accepted = 0
        while accepted < k:
            credit += alpha
            if credit < 1.0:
                break
            credit -= 1.0
            accepted += 1
        cost = k * c * t + t + verify_slope * t * k + rtt
        cost = max(cost, (accepted + 1) * t * 1.01)  # never pays: more than a plain step per token
        draft_s = k * c * t
        ctl.record_round(k, accepted, draft_s, cost - draft_s - rtt, rtt)
        spent += cost
        tokens += accepted + 1
    assert spent <= 1.05 * tokens * t
    assert not ctl.statistics().speculating


def test_the_drafts_start_counts_in_the_measured_rate_only():
    ctl = SpeculationController()
    ctl.record_target_step(10 * MS)
    ctl.record_round(4, 4, 4 * MS, 14 * MS, setup_seconds=500 * MS)  # a cold prompt evaluation
    assert ctl.t_draft == pytest.approx(1 * MS) and ctl.rtt == 0.0  # the per-token model is untouched
    assert ctl.recent_speedup() == pytest.approx(10 / ((4 + 14 + 500) / 5))
    assert ctl.statistics().measured_speedup == pytest.approx(ctl.recent_speedup())
