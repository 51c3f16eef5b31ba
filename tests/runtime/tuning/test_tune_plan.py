"""The tuner's pure policy (hydra_node/runtime/tuning/plan.py) with injected figures."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from hydra_node.runtime.tuning.plan import (
    MAX_CANDIDATES,
    Candidate,
    Figures,
    Outcome,
    TuneAxes,
    cannot_win,
    candidate_grid,
    eta_s,
    progress_line,
    recommend,
)

BASE = Candidate(
    ctx_size=4096, batch=512, ubatch=512, mmap="auto", mlock=False, flash_attention="auto", threads=0, parallel=4
)


def axes(**kw) -> TuneAxes:
    d = dict(
        ctx_sizes=(4096,),
        batch_sizes=(512,),
        ubatch_sizes=(512,),
        mmap_values=("auto",),
        mlock_values=(False,),
        flash_attention=("auto",),
        threads=(0,),
        parallel=(4,),
    )
    d.update(kw)
    return TuneAxes(**d)


def measured(c: Candidate, gen: float, rss: int | None = 100 << 20, ttft: float = 50.0) -> Outcome:
    return Outcome(c, "measured", Figures(pp_tok_s=500.0, gen_tok_s=gen, ttft_ms=ttft, peak_rss_bytes=rss))


def test_grid_puts_the_baseline_first_and_skips_ubatch_above_batch() -> None:
    grid = candidate_grid(axes(batch_sizes=(256, 512), ubatch_sizes=(128, 512), flash_attention=("on", "off")), BASE)
    assert grid[0] == BASE
    assert all(c.ubatch <= c.batch for c in grid[1:])
    # 2 batches x 2 ubatches - (256, 512) x 2 flash modes; the baseline itself is not repeated
    assert len(grid) == 1 + (2 * 2 - 1) * 2
    assert len(set(grid)) == len(grid)


def test_grid_skips_flash_off_with_a_quantized_v_cache() -> None:
    grid = candidate_grid(axes(flash_attention=("on", "off"), type_v="q8_0"), BASE)
    assert [c.flash_attention for c in grid[1:]] == ["on"]


def test_grid_has_a_bound() -> None:
    with pytest.raises(ValueError, match="more than"):
        candidate_grid(axes(ctx_sizes=tuple(range(128, 128 + MAX_CANDIDATES + 1))), BASE)


def test_candidate_keys_are_config_file_values() -> None:
    keys = Candidate(8192, 1024, 256, "off", True, "on", 8, 4, draft_max_tokens=6).config_keys()
    assert keys["defaults.hardware.mmap"] is False and keys["defaults.hardware.mlock"] is True
    assert keys["defaults.model_fit.ubatch"] == 256 and keys["defaults.throughput.threads"] == 8
    assert keys["defaults.speculative.draft_max_tokens"] == 6
    assert keys["defaults.throughput.parallel"] == 4
    assert "defaults.speculative.draft_max_tokens" not in BASE.config_keys()
    with pytest.raises(ValueError):
        Candidate(4096, 512, 512, "maybe", False, "on", 0, 1)


def test_early_stop_only_when_even_the_noise_cannot_save_it() -> None:
    best = Figures(1, 100.0, 10, None)
    assert not cannot_win(Figures(1, 50.0, 10, None), None, 5, 10)  # nothing to beat yet
    assert cannot_win(Figures(1, 50.0, 10, None), best, 5, 10)  # 55 < 95
    assert not cannot_win(Figures(1, 87.0, 10, None), best, 5, 10)  # 95.7 >= 95


def test_recommends_the_fastest() -> None:
    a, b = BASE, Candidate(4096, 512, 256, "auto", False, "auto", 0, 4)
    rec = recommend([measured(a, 100.0), measured(b, 150.0)], 5.0)
    assert rec is not None and rec.candidate == b


def test_prefers_lower_memory_within_the_tolerance() -> None:
    small = Candidate(2048, 512, 512, "auto", False, "auto", 0, 4)
    rec = recommend([measured(BASE, 100.0, rss=300 << 20), measured(small, 97.0, rss=200 << 20)], 5.0)
    assert rec is not None and rec.candidate == small
    rec = recommend([measured(BASE, 100.0, rss=300 << 20), measured(small, 90.0, rss=200 << 20)], 5.0)
    assert rec is not None and rec.candidate == BASE  # 90 is outside 5 % of 100


def test_no_faster_throughput_bought_with_a_slower_first_token() -> None:
    serial = Candidate(4096, 512, 512, "auto", False, "auto", 0, 1)
    outcomes = [measured(BASE, 100.0, ttft=50.0), measured(serial, 180.0, ttft=90.0)]
    assert recommend(outcomes, 5.0).candidate == serial  # no baseline given: throughput alone
    assert recommend(outcomes, 5.0, BASE).candidate == BASE
    outcomes[1] = measured(serial, 180.0, ttft=52.0)  # within the tolerance of the baseline's TTFT
    assert recommend(outcomes, 5.0, BASE).candidate == serial


def test_ignores_early_stopped_and_failed_candidates() -> None:
    other = Candidate(4096, 512, 256, "auto", False, "auto", 0, 4)
    outcomes = [
        measured(BASE, 100.0),
        Outcome(other, "stopped_early", Figures(1, 500.0, 1, None)),
        Outcome(other, "failed", error="no memory"),
        Outcome(other, "skipped_budget"),
    ]
    rec = recommend(outcomes, 5.0)
    assert rec is not None and rec.candidate == BASE
    assert recommend([Outcome(BASE, "failed", error="x")], 5.0) is None
    with pytest.raises(ValueError):
        Outcome(BASE, "measured")  # measured needs figures


figures = st.builds(
    Figures,
    pp_tok_s=st.floats(1, 1e4),
    gen_tok_s=st.floats(0.1, 1e4),
    ttft_ms=st.floats(1, 1e5),
    peak_rss_bytes=st.one_of(st.none(), st.integers(1 << 20, 1 << 40)),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(figures, min_size=1, max_size=12), st.floats(0, 50))
def test_recommendation_is_within_the_tolerance_of_the_fastest(figs: list[Figures], tol: float) -> None:
    outcomes = [
        Outcome(Candidate(128 + i, 512, 512, "auto", False, "auto", 0, 1), "measured", f) for i, f in enumerate(figs)
    ]
    rec = recommend(outcomes, tol)
    fastest = max(f.gen_tok_s for f in figs)
    assert rec is not None and rec.figures.gen_tok_s >= fastest * (1 - tol / 100)
    if tol == 0 or len({f.gen_tok_s for f in figs}) == 1:
        assert rec.figures.gen_tok_s == fastest
    # with the first as the baseline: never a slower first token than it, beyond the tolerance
    base = outcomes[0]
    rec = recommend(outcomes, tol, base.candidate)
    assert rec is not None and (rec is base or rec.figures.ttft_ms <= base.figures.ttft_ms * (1 + tol / 100))
    eligible = [
        o.figures.gen_tok_s
        for o in outcomes
        if o is base or o.figures.ttft_ms <= base.figures.ttft_ms * (1 + tol / 100)
    ]
    assert rec.figures.gen_tok_s >= max(eligible) * (1 - tol / 100)


@given(st.integers(0, 50), st.integers(1, 50), st.floats(0, 1e4), st.floats(0, 1e4))
def test_eta_is_bounded_by_the_budget(done: int, total: int, elapsed: float, left: float) -> None:
    done = min(done, total)
    eta = eta_s(done, total, elapsed, left)
    assert eta is None if done == 0 else 0 <= eta <= left
    line = progress_line(done, total, elapsed, eta, "ctx=4096")
    assert f"{done:>3}/{total}" in line and ("ETA" in line)
