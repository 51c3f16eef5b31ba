"""Pure acceptance rules of speculative decoding (Leviathan et al., 2023).

Inputs are plain token ids and probability arrays; randomness comes from an injected
``numpy.random.Generator``.  Row ``i`` of the target's probabilities is the target's
next-token distribution after the committed text plus the first ``i`` draft tokens,
so ``k`` draft tokens come with ``k + 1`` target rows (one batched forward pass).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from hydra_node.runtime.speculative.errors import DraftProtocolError
from hydra_node.runtime.child.speculative.sampling import SparseDist, sample


@dataclass(frozen=True)
class Verdict:
    """Outcome of one verification: the first ``accepted`` draft tokens stand, then ``next_token``."""

    accepted: int
    next_token: int

    def __post_init__(self) -> None:
        if self.accepted < 0 or self.next_token < 0:
            raise ValueError("accepted and next_token must be non-negative")


def check_draft_tokens(draft_tokens: Sequence[int], n_vocab: int) -> list[int]:
    """Validate untrusted draft token ids; raises :class:`DraftProtocolError`."""
    out = []
    for t in draft_tokens:
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 0 <= int(t) < n_vocab:
            raise DraftProtocolError(f"draft token {t!r} is not a token id below {n_vocab}")
        out.append(int(t))
    return out


def verify_greedy(draft_tokens: Sequence[int], target_argmax: Sequence[int]) -> Verdict:
    """Accept the longest prefix where the target's argmax equals the draft token.

    ``target_argmax`` has ``len(draft_tokens) + 1`` entries; the emitted next token is the
    target's argmax at the first mismatch (or the bonus token when all match).
    """
    k = len(draft_tokens)
    if len(target_argmax) != k + 1:
        raise ValueError(f"need {k + 1} target predictions for {k} draft tokens, got {len(target_argmax)}")
    for i, tok in enumerate(draft_tokens):
        if int(target_argmax[i]) != int(tok):
            return Verdict(i, int(target_argmax[i]))
    return Verdict(k, int(target_argmax[k]))


def verify_sampled(
    draft_tokens: Sequence[int], draft_dists: Sequence[SparseDist], target_probs: np.ndarray, rng: np.random.Generator
) -> Verdict:
    """The rejection rule that keeps the output distributed exactly as the target's.

    Draft token ``x`` (drawn from ``q``) is accepted with probability ``min(1, p(x)/q(x))``;
    on the first rejection the next token is drawn from ``normalise(max(0, p - q))``; when
    all ``k`` are accepted the bonus token is drawn from the last target row.
    """
    k = len(draft_tokens)
    target_probs = np.asarray(target_probs, dtype=np.float64)
    if target_probs.ndim != 2 or target_probs.shape[0] != k + 1:
        raise ValueError(f"need {k + 1} target rows for {k} draft tokens, got shape {target_probs.shape}")
    if len(draft_dists) != k:
        raise DraftProtocolError(f"{k} draft tokens came with {len(draft_dists)} distributions")
    for i, (x, q) in enumerate(zip(draft_tokens, draft_dists)):
        p = target_probs[i]
        qx = q.prob_of(int(x))
        if qx <= 0.0:
            raise DraftProtocolError(f"draft token {x} at position {i} has zero draft probability")
        if rng.random() * qx < p[int(x)]:
            continue
        return Verdict(i, sample(residual(p, q), rng))
    return Verdict(k, sample(target_probs[k], rng))


def residual(p: np.ndarray, q: SparseDist) -> np.ndarray:
    """``normalise(max(0, p - q))``; falls back to ``p`` when the residual has no mass
    (only possible when ``p == q``, where rejection has probability zero)."""
    r = np.array(p, dtype=np.float64, copy=True)
    r[q.ids] = np.maximum(r[q.ids] - q.probs, 0.0)
    mass = r.sum()
    if mass <= 1e-12:
        return np.asarray(p, dtype=np.float64)
    return r / mass
