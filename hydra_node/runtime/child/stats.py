"""The engine's figures (pure: no llama.cpp, no clock, no I/O): what it did per step, and when
the runner child reports them to the node.

:class:`StepCounters` records each engine step (sequences in the batch, prefill and decode
tokens, the step's duration measured by the caller) and keeps the last ``STATS_WINDOW_STEPS``
of them for the rates; :class:`EngineStatistics` is one snapshot, sent to the node as a
``{"op": "stats", ...}`` runner-channel frame (:meth:`EngineStatistics.to_wire`; the node reads
it back with :func:`hydra_node.runtime.child.channel.engine_stats_from_wire`).
:class:`StatsCadence` says when a frame is due: after at least ``every_steps`` steps AND
``every_s`` seconds since the last one (whichever is rarer), and once more when the engine
goes idle, so the node sees the slots free again.

Rates are per second of *engine busy time* (the durations of the window's steps that did that
kind of work; a step mixing prefill and decode counts for both), not of wall time: an idle
runner keeps showing what it does when it works.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass

__all__ = [
    "STATS_EVERY_S",
    "STATS_EVERY_STEPS",
    "STATS_WINDOW_STEPS",
    "EngineStatistics",
    "StatsCadence",
    "StepCounters",
]

#: Steps the rates and the mean batch size are computed over: a few seconds of decoding, enough to
#: smooth one slow step out, short enough to follow a change of load.
STATS_WINDOW_STEPS = 64
#: A stats frame at most every this many steps ...
STATS_EVERY_STEPS = 16
#: ... and at most every this many seconds (the rarer of the two): a few frames a second at most.
STATS_EVERY_S = 0.5


@dataclass(frozen=True)
class EngineStatistics:
    """One snapshot of a continuous-batching engine (``/api/status`` ``models[].engine_stats``)."""

    n_slots: int
    ctx_per_slot: int
    steps: int  # engine steps (one llama_decode each) since the runner started
    batch_last: int  # sequences in the latest step
    batch_mean: float  # mean sequences per step over the last STATS_WINDOW_STEPS steps
    active: int  # sequences holding a slot
    waiting: int  # sequences queued in the child for a free slot
    free_slots: int
    kv_used: int  # KV cells the active sequences occupy
    kv_budget: int  # KV cells the slots may use together
    prefill_tokens_per_s: float  # prompt tokens evaluated per second of busy time (window)
    decode_tokens_per_s: float  # tokens decoded per second of busy time (window)
    prefix_hits: int  # admissions that reused a cached prefix
    prefix_misses: int  # admissions that reused nothing
    prefix_reused_tokens: int  # prompt tokens not evaluated thanks to the prefix cache
    prefix_shared: int = 0  # hits copied from a slot still generating ([defaults.model_fit.prefix_cache])
    # the prompt cache's tiers (docs/prompt-cache.md): saved prefixes restored instead of prefilled
    prompt_cache_hits_ram: int = 0  # admissions restored from the RAM tier
    prompt_cache_hits_disk: int = 0  # admissions restored from the disk tier
    prompt_cache_misses: int = 0  # admissions the tiers held nothing better for than the slots
    prompt_cache_restored_tokens: int = 0  # prompt tokens restored instead of prefilled
    prompt_cache_ram_entries: int = 0
    prompt_cache_ram_bytes: int = 0
    prompt_cache_disk_entries: int = 0
    prompt_cache_disk_bytes: int = 0
    prompt_cache_saves: int = 0  # slot states saved into the tiers
    prompt_cache_failures: int = 0  # states not saved, written or loaded, and disk files removed as invalid

    def to_wire(self) -> dict:
        return {"op": "stats", **asdict(self)}


@dataclass(frozen=True)
class _Step:
    seqs: int
    prefill: int
    decode: int
    seconds: float


class StepCounters:
    """What the engine did, step by step; the caller measures each step's duration."""

    def __init__(self, window: int = STATS_WINDOW_STEPS) -> None:
        if window < 1:
            raise ValueError(f"the stats window must hold at least one step, not {window}")
        self.steps = 0
        self._window: deque[_Step] = deque(maxlen=window)

    def record(self, *, seqs: int, prefill_tokens: int, decode_tokens: int, seconds: float) -> None:
        if min(seqs, prefill_tokens, decode_tokens) < 0 or seconds < 0:
            raise ValueError("step figures must not be negative")
        self.steps += 1
        self._window.append(_Step(seqs, prefill_tokens, decode_tokens, seconds))

    @property
    def batch_last(self) -> int:
        return self._window[-1].seqs if self._window else 0

    @property
    def batch_mean(self) -> float:
        return sum(s.seqs for s in self._window) / len(self._window) if self._window else 0.0

    def rates(self) -> tuple[float, float]:
        """(prefill, decode) tokens per second over the window: each kind's tokens over the time of
        the steps that had any of that kind (a mixed step counts for both); 0 without such steps."""
        return (
            _rate([(s.prefill, s.seconds) for s in self._window if s.prefill]),
            _rate([(s.decode, s.seconds) for s in self._window if s.decode]),
        )


def _rate(steps: list[tuple[int, float]]) -> float:
    busy = sum(sec for _, sec in steps)
    return sum(n for n, _ in steps) / busy if busy > 0 else 0.0


class StatsCadence:
    """When the child sends a stats frame (time injected: ``now`` is any monotonic clock)."""

    def __init__(self, every_steps: int = STATS_EVERY_STEPS, every_s: float = STATS_EVERY_S) -> None:
        if every_steps < 1 or every_s < 0:
            raise ValueError("stats cadence: every_steps must be >= 1 and every_s >= 0")
        self.every_steps = every_steps
        self.every_s = every_s
        self._last_steps = 0
        self._last_at: float | None = None

    def due(self, steps: int, now: float, *, idle: bool) -> bool:
        """True when a frame should go now: enough steps and time since the last, or the engine
        just went idle after stepping.  Call :meth:`sent` after sending."""
        if steps == self._last_steps:
            return False  # nothing new to say
        if idle:
            return True
        return steps - self._last_steps >= self.every_steps and (
            self._last_at is None or now - self._last_at >= self.every_s
        )

    def sent(self, steps: int, now: float) -> None:
        self._last_steps = steps
        self._last_at = now
