"""The slot scheduler's vocabulary: its configuration, the plan of a step and its figures (pure data)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from hydra_node.runtime.child.engine.prompt_store import TierHit

__all__ = [
    "MAX_SLOTS",
    "Admission",
    "DecodeToken",
    "Finish",
    "PrefillChunk",
    "Rejected",
    "SlotConfig",
    "SlotStatistics",
    "StepPlan",
]

#: Most parallel sequences one runner may hold (llama.cpp's LLAMA_MAX_SEQ is 256; 64 keeps
#: per-step bookkeeping small and matches the config bound).
MAX_SLOTS = 64


class Finish(enum.StrEnum):
    STOP = "stop"
    LENGTH = "length"
    CANCELLED = "cancelled"


class Rejected(Exception):
    """A request the scheduler cannot take: ``code`` and ``status`` say why (the runner's error frame)."""

    def __init__(self, message: str, *, code: str, status: int):
        super().__init__(message)
        self.code = code
        self.status = status


@dataclass(frozen=True)
class SlotConfig:
    n_slots: int
    n_batch: int
    n_ctx: int  # KV cells of the unified cache, shared by every sequence
    max_waiting: int = 16  # requests waiting for a free slot inside the child (the node admits n_slots)
    prompt_cache: bool = True
    #: decode cells reserved per admitted sequence on top of its prompt; None: a quarter of
    #: ``n_ctx / n_slots`` (256 at 4096 / 4), at least 1
    decode_reserve: int | None = None
    #: reuse prefixes held by slots still generating ([defaults.model_fit.prefix_cache] enabled)
    share_prefixes: bool = True
    #: shortest prefix worth copying from another slot ([defaults.model_fit.prefix_cache] min_tokens)
    min_shared_tokens: int = 64
    #: most free slots that keep their cached prefix; None: all ([defaults.model_fit.prefix_cache] max_entries)
    max_cached: int | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.n_slots <= MAX_SLOTS:
            raise ValueError(f"n_slots must be between 1 and {MAX_SLOTS}, not {self.n_slots}")
        if self.n_batch < self.n_slots:
            raise ValueError(
                f"n_batch ({self.n_batch}) must be at least n_slots ({self.n_slots}): "
                "every decoding sequence needs one batch row per step"
            )
        if self.n_ctx < 2:
            raise ValueError(f"n_ctx must be at least 2, not {self.n_ctx}")
        if self.decode_reserve is not None and self.decode_reserve < 0:
            raise ValueError(f"decode_reserve must not be negative, not {self.decode_reserve}")
        if self.max_waiting < 0:
            raise ValueError("max_waiting must not be negative")
        if self.min_shared_tokens < 1:
            raise ValueError("min_shared_tokens must be at least 1")
        if self.max_cached is not None and self.max_cached < 0:
            raise ValueError("max_cached must not be negative")

    @property
    def decode_room(self) -> int:
        if self.decode_reserve is not None:
            return self.decode_reserve
        return max(1, self.n_ctx // (4 * self.n_slots))


@dataclass(frozen=True)
class Admission:
    """``rid`` took ``slot``; its first ``reused`` prompt tokens are already in the slot's KV, or,
    with ``copy_from >= 0``, are to be copied from that (active) slot's cells ``[0, reused)``, or, with
    ``restore``, are to be loaded from the prompt cache's tiers (docs/prompt-cache.md)."""

    rid: int
    slot: int
    reused: int
    copy_from: int = -1
    restore: TierHit | None = None


@dataclass(frozen=True)
class PrefillChunk:
    """Prompt tokens ``[start, start + length)`` of ``rid``, at positions ``start...``; ``last``
    means the chunk ends the prompt, so its final row needs logits (the first sample)."""

    rid: int
    slot: int
    start: int
    length: int
    last: bool


@dataclass(frozen=True)
class DecodeToken:
    """Feed ``rid``'s latest sampled token at position ``pos``; its row needs logits."""

    rid: int
    slot: int
    pos: int


@dataclass(frozen=True)
class StepPlan:
    admitted: tuple[Admission, ...] = ()
    finished: tuple[tuple[int, Finish], ...] = ()  # left before this step: cancelled, or "length" (KV full)
    decode: tuple[DecodeToken, ...] = ()
    prefill: tuple[PrefillChunk, ...] = ()
    evicted: tuple[int, ...] = ()  # free slots whose cached cells must be dropped before this step
    #: sequences admitted earlier that now take a prefix another slot has computed (their ``slot``
    #: gets cells ``[0, reused)`` of ``copy_from``), after the admissions, before the batch
    copies: tuple[Admission, ...] = ()

    @property
    def n_tokens(self) -> int:
        return len(self.decode) + sum(c.length for c in self.prefill)

    @property
    def empty(self) -> bool:
        return self.n_tokens == 0


@dataclass(frozen=True)
class SlotStatistics:
    active: int
    waiting: int
    kv_used: int
    kv_total: int
    steps: int
    kv_reserved: int = 0  # cells reserved by active sequences plus cached by free slots (<= kv_total)
    prefix_hits: int = 0  # admissions that reused a free slot's cached prefix
    prefix_misses: int = 0  # admissions that reused nothing
    prefix_reused_tokens: int = 0  # prompt tokens those hits did not evaluate again
    prefix_shared: int = 0  # hits whose prefix was copied from a slot still generating
