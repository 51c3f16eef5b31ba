"""The tuner's pure policy: the candidate grid, the early-stop rule, the recommendation, the ETA.

No I/O and no clock: figures and times come in as arguments, so every rule is tested with
injected numbers (tests/runtime/tuning/test_tune_plan.py).

* **Grid** (:func:`candidate_grid`): the product of the axes, the baseline (the profile the node
  runs today) first; a ``ubatch`` above ``batch`` is skipped (llama.cpp caps it: the same run
  twice), and so is flash attention off with a quantized V cache (llama.cpp refuses it).
* **Early stop** (:func:`cannot_win`): after a round, a candidate whose generation throughput,
  even ``noise_pct`` better, is still below the best finished candidate's less the tolerance
  can no longer be recommended; its remaining rounds are skipped.
* **Recommendation** (:func:`recommend`): only fully measured candidates whose TTFT is at most
  the baseline's plus the tolerance are eligible (more throughput bought with slower first
  tokens, e.g. ``parallel = 1`` queueing requests, is no improvement); among those within
  ``tolerance_pct`` of the fastest eligible (generation tok/s), the one using the least memory
  (peak RSS; figures within :data:`MEMORY_TIE_FRACTION` count as equal), then the fastest.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Iterable

__all__ = [
    "Candidate",
    "Figures",
    "MAX_CANDIDATES",
    "MEMORY_TIE_FRACTION",
    "Outcome",
    "TuneAxes",
    "best_measured",
    "cannot_win",
    "candidate_grid",
    "eta_s",
    "progress_line",
    "recommend",
]

#: Largest grid a sweep accepts (each candidate is a model load and a few generations).
MAX_CANDIDATES = 512
#: Peak-RSS figures within this fraction of the smallest count as the same memory (page-fault noise).
MEMORY_TIE_FRACTION = 0.02
#: Statuses of a candidate after the sweep.
STATUSES = ("measured", "stopped_early", "failed", "skipped_budget")
_QUANTIZED_V = frozenset({"q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"})


@dataclass(frozen=True)
class Candidate:
    """One runtime profile: the keys the tuner varies (everything else is the node's config)."""

    ctx_size: int
    batch: int
    ubatch: int
    mmap: str  # auto | on | off
    mlock: bool
    flash_attention: str  # auto | on | off
    threads: int  # 0 = llama.cpp's default
    parallel: int
    draft_max_tokens: int | None = None  # only with a configured draft model

    def __post_init__(self) -> None:
        if self.mmap not in ("auto", "on", "off") or self.flash_attention not in ("auto", "on", "off"):
            raise ValueError(f"mmap and flash_attention must be auto, on or off: {self!r}")
        if min(self.ctx_size, self.batch, self.ubatch, self.parallel) < 1 or self.threads < 0:
            raise ValueError(f"sizes must be positive and threads >= 0: {self!r}")

    def label(self) -> str:
        parts = [
            f"ctx={self.ctx_size}",
            f"batch={self.batch}",
            f"ubatch={self.ubatch}",
            f"mmap={self.mmap}",
            f"mlock={'on' if self.mlock else 'off'}",
            f"fa={self.flash_attention}",
            f"threads={self.threads or 'auto'}",
            f"parallel={self.parallel}",
        ]
        if self.draft_max_tokens is not None:
            parts.append(f"draft_max={self.draft_max_tokens}")
        return " ".join(parts)

    def config_keys(self) -> dict[str, Any]:
        """The config file keys (dotted) that select this profile, as TOML values."""
        keys: dict[str, Any] = {
            "defaults.model_fit.ctx_size": self.ctx_size,
            "defaults.model_fit.batch": self.batch,
            "defaults.model_fit.ubatch": self.ubatch,
            "defaults.model_fit.flash_attention": self.flash_attention,
            "defaults.hardware.mmap": {"on": True, "off": False}.get(self.mmap, self.mmap),
            "defaults.hardware.mlock": self.mlock,
            "defaults.throughput.threads": self.threads,
            "defaults.throughput.parallel": self.parallel,
        }
        if self.draft_max_tokens is not None:
            keys["defaults.speculative.draft_max_tokens"] = self.draft_max_tokens
        return keys


@dataclass(frozen=True)
class TuneAxes:
    """The values to try per key; an axis with one value is not varied."""

    ctx_sizes: tuple[int, ...]
    batch_sizes: tuple[int, ...]
    ubatch_sizes: tuple[int, ...]
    mmap_values: tuple[str, ...]
    mlock_values: tuple[bool, ...]
    flash_attention: tuple[str, ...]
    threads: tuple[int, ...]
    parallel: tuple[int, ...]
    draft_max_tokens: tuple[int | None, ...] = (None,)
    type_v: str = "f16"  # the configured V cache type (a quantized one rules flash attention off out)


def _allowed(c: Candidate, type_v: str) -> bool:
    return c.ubatch <= c.batch and not (c.flash_attention == "off" and type_v in _QUANTIZED_V)


def candidate_grid(axes: TuneAxes, baseline: Candidate) -> tuple[Candidate, ...]:
    """The baseline, then every allowed combination of the axes (no duplicates), in axis order."""
    combos = itertools.product(
        axes.ctx_sizes,
        axes.batch_sizes,
        axes.ubatch_sizes,
        axes.mmap_values,
        axes.mlock_values,
        axes.flash_attention,
        axes.threads,
        axes.parallel,
        axes.draft_max_tokens,
    )
    out: dict[Candidate, None] = {baseline: None}
    for combo in combos:
        c = Candidate(*combo)
        if _allowed(c, axes.type_v):
            out.setdefault(c, None)
            if len(out) > MAX_CANDIDATES:
                raise ValueError(f"the grid has more than {MAX_CANDIDATES} candidates; pin fewer values per axis")
    return tuple(out)


@dataclass(frozen=True)
class Figures:
    """What one candidate measured (means over its rounds)."""

    pp_tok_s: float  # prompt tokens per second of prefill (prompt tokens / time to first token)
    gen_tok_s: float  # completion tokens per second of wall clock over a round (all prompts together)
    ttft_ms: float  # mean time to first token a client sees (queue wait included)
    peak_rss_bytes: int | None  # the runner process's peak resident memory (None: not measurable here)
    rounds: int = 1

    def to_json(self) -> dict[str, Any]:
        return {
            "pp_tok_s": round(self.pp_tok_s, 1),
            "gen_tok_s": round(self.gen_tok_s, 1),
            "ttft_ms": round(self.ttft_ms, 1),
            "peak_rss_bytes": self.peak_rss_bytes,
            "rounds": self.rounds,
        }


@dataclass(frozen=True)
class Outcome:
    candidate: Candidate
    status: str  # one of STATUSES
    figures: Figures | None = None
    error: str = ""
    seconds: float = 0.0
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown outcome status {self.status!r}")
        if (self.figures is None) != (self.status in ("failed", "skipped_budget")):
            raise ValueError(f"a {self.status} outcome {'has' if self.figures else 'needs'} figures")


def cannot_win(partial: Figures, best: Figures | None, tolerance_pct: float, noise_pct: float) -> bool:
    """True when ``partial``, even ``noise_pct`` faster, is below ``best`` less the tolerance."""
    if best is None or not math.isfinite(partial.gen_tok_s):
        return False
    return partial.gen_tok_s * (1 + noise_pct / 100) < best.gen_tok_s * (1 - tolerance_pct / 100)


def best_measured(outcomes: Iterable[Outcome]) -> Figures | None:
    measured = [o.figures for o in outcomes if o.status == "measured" and o.figures is not None]
    return max(measured, key=lambda f: f.gen_tok_s, default=None)


def recommend(outcomes: Iterable[Outcome], tolerance_pct: float, baseline: Candidate | None = None) -> Outcome | None:
    """The candidate to run (see the module docstring); None when nothing was measured.
    ``baseline``: the current profile, whose TTFT (when measured) bounds the others'."""
    # (outcome, its figures) pairs
    measured = [(o, o.figures) for o in outcomes if o.status == "measured" and o.figures is not None]
    base = next((f for o, f in measured if o.candidate == baseline), None) if baseline is not None else None
    if base is not None:
        measured = [
            (o, f)
            for o, f in measured
            if o.candidate == baseline or f.ttft_ms <= base.ttft_ms * (1 + tolerance_pct / 100)
        ]
    if not measured:
        return None
    fastest = max(f.gen_tok_s for _, f in measured)
    near = [(o, f) for o, f in measured if f.gen_tok_s >= fastest * (1 - tolerance_pct / 100)]
    rss = [f.peak_rss_bytes for _, f in near]
    known = [r for r in rss if r is not None]
    if len(known) == len(rss):  # every peak RSS is known
        least = min(known)
        near = [p for p, r in zip(near, known) if r <= least * (1 + MEMORY_TIE_FRACTION)]
    return max(near, key=lambda p: p[1].gen_tok_s)[0]


def eta_s(done: int, total: int, elapsed_s: float, budget_left_s: float) -> float | None:
    """Seconds left: the mean time per finished candidate times those left, at most the budget left."""
    if done <= 0:
        return None
    return max(0.0, min(elapsed_s / done * (total - done), budget_left_s))


def progress_line(done: int, total: int, elapsed_s: float, eta: float | None, label: str = "", width: int = 24) -> str:
    """``[#####-------]  3/12  0:42 elapsed  ETA 1:05  ctx=...`` (for a terminal, rewritten with ``\\r``)."""
    filled = int(width * done / total) if total else width

    def clock(s: float) -> str:
        return f"{int(s) // 60}:{int(s) % 60:02d}"

    eta_text = "ETA --:--" if eta is None else f"ETA {clock(eta)}"
    return (
        f"[{'#' * filled}{'-' * (width - filled)}] {done:>3}/{total}  {clock(elapsed_s)} elapsed  {eta_text}  {label}"
    )[:160]
