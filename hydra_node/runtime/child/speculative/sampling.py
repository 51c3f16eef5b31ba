"""Pure sampling helpers: logits to the distribution the target or the draft samples from.

The target-alone path and the speculative path both use :func:`target_distribution`,
so "speculative output is distributed exactly as the target's" compares like with like.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hydra_node.runtime.speculative.params import DRAFT_CANDIDATES_MAX, SamplingParams  # noqa: F401 - re-exported

#: Tolerance on the total mass of a reported draft distribution.
_MASS_TOLERANCE = 1e-3


@dataclass(frozen=True, eq=False)
class SparseDist:
    """A probability distribution given by its non-zero entries (ids unique, probs sum to 1)."""

    ids: np.ndarray  # int64
    probs: np.ndarray  # float64

    @classmethod
    def checked(cls, ids, probs, n_vocab: int) -> "SparseDist":
        """Build from untrusted input; raises ``ValueError`` naming what is wrong."""
        ids_a = np.asarray(ids, dtype=np.int64).reshape(-1)
        probs_a = np.asarray(probs, dtype=np.float64).reshape(-1)
        if ids_a.size == 0 or ids_a.size != probs_a.size:
            raise ValueError("ids and probs must be non-empty and of equal length")
        if ids_a.size > max(DRAFT_CANDIDATES_MAX, 1) and ids_a.size > n_vocab:
            raise ValueError("too many candidates")
        if ids_a.min() < 0 or ids_a.max() >= n_vocab:
            raise ValueError("token id out of range")
        if np.unique(ids_a).size != ids_a.size:
            raise ValueError("duplicate token ids")
        if not np.all(np.isfinite(probs_a)) or probs_a.min() < 0.0:
            raise ValueError("probabilities must be finite and non-negative")
        if abs(probs_a.sum() - 1.0) > _MASS_TOLERANCE:
            raise ValueError("probabilities must sum to 1")
        return cls(ids_a, probs_a / probs_a.sum())

    def prob_of(self, token: int) -> float:
        hit = np.nonzero(self.ids == token)[0]
        return float(self.probs[hit[0]]) if hit.size else 0.0

    def dense(self, n_vocab: int) -> np.ndarray:
        out = np.zeros(n_vocab, dtype=np.float64)
        out[self.ids] = self.probs
        return out


def softmax(logits: np.ndarray, temperature: float) -> np.ndarray:
    z = np.asarray(logits, dtype=np.float64) / temperature
    z = z - z.max()
    e = np.exp(z)
    return e / e.sum()


def target_distribution(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The dense distribution plain decoding samples from (temperature, top-k, top-p)."""
    if params.greedy:
        out = np.zeros(len(logits), dtype=np.float64)
        out[int(np.argmax(logits))] = 1.0
        return out
    p = softmax(logits, params.temperature)
    keep = _kept_ids(p, params.top_k, params.top_p, limit=0)
    out = np.zeros_like(p)
    out[keep] = p[keep]
    return out / out.sum()


def draft_distribution(logits: np.ndarray, params: SamplingParams) -> SparseDist:
    """The draft's sparse proposal distribution: tempered, cut to at most DRAFT_CANDIDATES_MAX."""
    if params.greedy:
        return SparseDist(np.array([int(np.argmax(logits))], dtype=np.int64), np.array([1.0]))
    p = softmax(logits, params.temperature)
    keep = _kept_ids(p, params.top_k, params.top_p, limit=DRAFT_CANDIDATES_MAX)
    probs = p[keep]
    return SparseDist(keep.astype(np.int64), probs / probs.sum())


def _kept_ids(p: np.ndarray, top_k: int, top_p: float, limit: int) -> np.ndarray:
    """Ids by falling probability: top-k, then the smallest prefix with mass >= top_p
    (of the top-k mass), then at most ``limit`` of them (0: no limit)."""
    n = len(p)
    k_cut = min(n, top_k) if top_k else n
    m = min(k_cut, limit) if limit else k_cut
    if m == n and top_p >= 1.0:
        return np.arange(n)
    total = 1.0 if k_cut == n else float(-np.partition(-p, k_cut - 1)[:k_cut].sum())
    if m < n:
        order = np.argpartition(-p, m - 1)[:m]
        order = order[np.argsort(-p[order], kind="stable")]
    else:
        order = np.argsort(-p, kind="stable")
    if top_p < 1.0:
        mass = np.cumsum(p[order])
        order = order[: int(np.searchsorted(mass, top_p * total - 1e-9)) + 1]
    return order


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one index from a dense distribution with the injected RNG."""
    cdf = np.cumsum(probs)
    u = rng.random() * cdf[-1]
    return int(min(np.searchsorted(cdf, u, side="right"), len(probs) - 1))


def sample_sparse(dist: SparseDist, rng: np.random.Generator) -> int:
    return int(dist.ids[sample(dist.probs, rng)])
