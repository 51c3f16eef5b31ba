"""What a request's sampling asks for, without numpy: the node process (the draft wire codec, the
engine's planning) imports this, and numpy costs every node about 11 MB and 60-130 ms at start."""

from __future__ import annotations

from dataclasses import dataclass

#: Most candidate tokens a draft proposal carries per position when sampling.  The
#: draft samples from its distribution truncated to these candidates and reports
#: exactly that truncated distribution, so exactness holds and a proposal stays small
#: enough to cross the network (k positions x 64 (id, prob) pairs).
DRAFT_CANDIDATES_MAX = 64


@dataclass(frozen=True)
class SamplingParams:
    """How tokens are chosen.  ``temperature == 0`` is greedy (argmax)."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k cut

    def __post_init__(self) -> None:
        if not (0.0 <= self.temperature <= 2.0) or self.temperature != self.temperature:
            raise ValueError("temperature must be between 0 and 2")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError("top_p must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
