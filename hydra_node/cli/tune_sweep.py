"""The sweep of ``benchmark tune``: candidates one after another, each in its own runner child,
under a time budget, with the planner's early stop (``hydra_node/runtime/tuning/plan.py``).

The baseline (the profile ``serve`` runs today) is measured first and always to the end; every
later candidate gets what is left of the budget (one that would not fit in it by the mean time
per candidate so far is skipped, one still running when it ends is abandoned as skipped).
"""

from __future__ import annotations

import dataclasses
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import trio

from hydra_node.cli.discovery import exception_leaves
from hydra_node.inference import GenerationError
from hydra_node.models import ModelRef
from hydra_node.runtime.runner.records import RunnerLoadError, RunnerSettings
from hydra_node.runtime.tuning.plan import Candidate, Outcome, best_measured, cannot_win
from hydra_node.runtime.tuning.trial import TrialSettings, run_trial

__all__ = ["EARLY_STOP_NOISE_PCT", "Draft", "SweepSettings", "candidate_settings", "run_sweep"]

#: The early-stop rule gives a candidate this much benefit of the doubt (run-to-run noise).
EARLY_STOP_NOISE_PCT = 10.0
#: A candidate's runner gets at most this long to load (a profile that cannot load fails fast).
TRIAL_LOAD_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Draft:
    """A local draft model for speculative candidates (``argv`` builds the runner's draft flags)."""

    model: str
    argv: Callable[[int], tuple[str, ...]]  # draft_max_tokens -> runner arguments


@dataclass(frozen=True)
class SweepSettings:
    budget_s: float
    tolerance_pct: float
    trial: TrialSettings
    noise_pct: float = EARLY_STOP_NOISE_PCT


def candidate_settings(base: RunnerSettings, c: Candidate, draft: Draft | None) -> RunnerSettings:
    """The runner settings of ``base`` (the node's config) with the candidate's keys."""
    extra = draft.argv(c.draft_max_tokens) if (draft is not None and c.draft_max_tokens is not None) else ()
    return dataclasses.replace(
        base,
        n_ctx=c.ctx_size,
        n_batch=c.batch,
        n_ubatch=c.ubatch,
        mmap=c.mmap,
        mlock=c.mlock,
        flash_attention=c.flash_attention,
        threads=c.threads,
        parallel=c.parallel,
        extra_argv=tuple(extra),
        crash_loop_restarts=1,
        load_timeout_s=min(base.load_timeout_s, TRIAL_LOAD_TIMEOUT_S),
    )


async def run_sweep(
    model: ModelRef,
    base: RunnerSettings,
    grid: tuple[Candidate, ...],
    s: SweepSettings,
    draft: Draft | None = None,
    progress: Callable[[int, int, float, list[Outcome], str], None] = lambda *_: None,
) -> list[Outcome]:
    """Measure ``grid`` (its first entry is the baseline); ``progress(done, total, elapsed_s, outcomes, label)``
    is called before each candidate and at the end."""
    outcomes: list[Outcome] = []
    t0 = trio.current_time()
    with tempfile.TemporaryDirectory(prefix="hydra-tune-") as tmp:
        home = Path(tmp)
        for sub in ("run", "logs"):
            (home / sub).mkdir()
        for i, cand in enumerate(grid):
            elapsed = trio.current_time() - t0
            progress(i, len(grid), elapsed, outcomes, cand.label())
            left = s.budget_s - elapsed
            mean = elapsed / i if i else 0.0
            if i > 0 and left < mean:
                outcomes += [Outcome(c, "skipped_budget") for c in grid[i:]]
                break
            outcomes.append(await _measure(model, base, cand, s, draft, home, outcomes, None if i == 0 else left))
        progress(len(grid), len(grid), trio.current_time() - t0, outcomes, "")
    return outcomes


async def _measure(
    model: ModelRef,
    base: RunnerSettings,
    cand: Candidate,
    s: SweepSettings,
    draft: Draft | None,
    home: Path,
    done: list[Outcome],
    limit_s: float | None,
) -> Outcome:
    best = best_measured(done)
    t = trio.current_time()
    settings = candidate_settings(base, cand, draft)
    try:
        with trio.move_on_after(limit_s if limit_s is not None else float("inf")):
            result = await run_trial(
                model, settings, home, s.trial, lambda partial: cannot_win(partial, best, s.tolerance_pct, s.noise_pct)
            )
            status = "stopped_early" if result.stopped_early else "measured"
            return Outcome(cand, status, result.figures, seconds=trio.current_time() - t)
        return Outcome(
            cand, "skipped_budget", error="the budget ran out during this candidate", seconds=trio.current_time() - t
        )
    except (RunnerLoadError, GenerationError) as exc:
        return Outcome(cand, "failed", error=str(exc)[:500], seconds=trio.current_time() - t)
    except BaseExceptionGroup as group:  # a generation failed inside the trial's nurseries
        leaves = exception_leaves(group)
        if not all(isinstance(leaf, (RunnerLoadError, GenerationError)) for leaf in leaves):
            raise
        return Outcome(cand, "failed", error=str(leaves[0])[:500], seconds=trio.current_time() - t)
