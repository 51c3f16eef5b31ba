"""The acceptance rules, pure: greedy prefix rule and the distribution-preserving rejection rule."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, strategies as st

from hydra_node.runtime.child.speculative.acceptance import (
    Verdict,
    check_draft_tokens,
    residual,
    verify_greedy,
    verify_sampled,
)
from hydra_node.runtime.speculative.errors import DraftProtocolError
from hydra_node.runtime.child.speculative.sampling import SparseDist, sample

V = 4  # synthetic vocabulary
N_SAMPLES = 6000


# -- greedy ----------------------------------------------------------------------------


def test_greedy_accepts_matching_prefix_then_target_token():
    assert verify_greedy([5, 6, 7], [5, 6, 9, 1]) == Verdict(2, 9)
    assert verify_greedy([5, 6, 7], [4, 6, 7, 1]) == Verdict(0, 4)
    assert verify_greedy([5, 6, 7], [5, 6, 7, 1]) == Verdict(3, 1)  # bonus token
    assert verify_greedy([], [3]) == Verdict(0, 3)  # a plain target step


def test_greedy_needs_k_plus_one_predictions():
    with pytest.raises(ValueError):
        verify_greedy([1, 2], [1, 2])


@given(st.lists(st.integers(0, 3), max_size=8), st.data())
def test_greedy_property_longest_prefix(draft, data):
    target = data.draw(st.lists(st.integers(0, 3), min_size=len(draft) + 1, max_size=len(draft) + 1))
    v = verify_greedy(draft, target)
    assert draft[: v.accepted] == target[: v.accepted]
    assert v.next_token == target[v.accepted]
    assert v.accepted == len(draft) or draft[v.accepted] != target[v.accepted]


def test_untrusted_draft_tokens_are_typed_errors():
    assert check_draft_tokens([0, 3, np.int64(2)], 4) == [0, 3, 2]
    for bad in ([4], [-1], ["1"], [1.0], [True]):
        with pytest.raises(DraftProtocolError):
            check_draft_tokens(bad, 4)


def test_sparse_dist_rejects_malformed_input():
    assert SparseDist.checked([1, 2], [0.25, 0.75], 4).prob_of(2) == 0.75
    for ids, probs in (
        ([1, 1], [0.5, 0.5]),
        ([9], [1.0]),
        ([1], [0.5]),
        ([1, 2], [1.5, -0.5]),
        ([1], [float("nan")]),
        ([], []),
        ([1, 2], [1.0]),
    ):
        with pytest.raises(ValueError):
            SparseDist.checked(ids, probs, 4)


def test_zero_draft_probability_is_the_drafts_fault():
    p = np.full((2, V), 1 / V)
    q = SparseDist(np.array([0]), np.array([1.0]))
    with pytest.raises(DraftProtocolError):
        verify_sampled([1], [q], p, np.random.default_rng(0))


def test_residual_is_positive_part_of_p_minus_q():
    p = np.array([0.5, 0.3, 0.2, 0.0])
    q = SparseDist(np.array([0, 2]), np.array([0.7, 0.3]))
    np.testing.assert_allclose(residual(p, q), [0.0, 1.0, 0.0, 0.0])
    same = SparseDist(np.arange(4), p.copy())
    np.testing.assert_allclose(residual(p, same), p)


# -- the distribution test ---------------------------------------------------------------


def chi2_critical(df: int, z: float = 3.090) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile (z = 3.09: p = 0.001)."""
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + z * math.sqrt(a)) ** 3


def chi2(counts: np.ndarray, expected_probs: np.ndarray) -> float:
    expected = expected_probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def random_dists(rng, rows: int) -> np.ndarray:
    """Random distributions with every entry at least 0.05 (so chi-square cells are full)."""
    return 0.8 * rng.dirichlet(np.ones(V), size=rows) + 0.2 / V


def emitted_tokens(rule, P, Q, k, rng, n_tokens=2):
    """Run speculative rounds over a context-free synthetic model until n_tokens came out."""
    out: list[int] = []
    while len(out) < n_tokens:
        pos = len(out)
        drafts = [sample(Q[pos + i], rng) for i in range(k)]
        dists = [SparseDist(np.arange(V), Q[pos + i]) for i in range(k)]
        v = rule(drafts, dists, P[pos : pos + k + 1], rng)
        out += drafts[: v.accepted] + [v.next_token]
    return out[:n_tokens]


def always_accept(drafts, dists, rows, rng):
    return Verdict(len(drafts), sample(rows[-1], rng))


def accept_if_q_above_p(drafts, dists, rows, rng):
    for i, x in enumerate(drafts):
        if dists[i].prob_of(x) <= rows[i][x]:
            return Verdict(i, sample(residual(rows[i], dists[i]), rng))
    return Verdict(len(drafts), sample(rows[-1], rng))


def resample_from_p(drafts, dists, rows, rng):
    for i, x in enumerate(drafts):
        if rng.random() * dists[i].prob_of(x) >= rows[i][x]:
            return Verdict(i, sample(rows[i], rng))
    return Verdict(len(drafts), sample(rows[-1], rng))


def distribution_statistics(rule, k, seed=1234):
    """chi-square of the first token vs p0, and of the first two tokens vs p0 x p1."""
    rng = np.random.default_rng(seed)
    P = random_dists(rng, k + 3)
    Q = random_dists(rng, k + 3)
    first = np.zeros(V)
    pairs = np.zeros(V * V)
    for _ in range(N_SAMPLES):
        a, b = emitted_tokens(rule, P, Q, k, rng)
        first[a] += 1
        pairs[a * V + b] += 1
    return chi2(first, P[0]), chi2(pairs, np.outer(P[0], P[1]).reshape(-1))


@pytest.mark.parametrize("k", [1, 3])
def test_rejection_rule_reproduces_target_distribution(k):
    first, pairs = distribution_statistics(verify_sampled, k)
    assert first < chi2_critical(V - 1)
    assert pairs < chi2_critical(V * V - 1)


@pytest.mark.parametrize("wrong_rule", [always_accept, accept_if_q_above_p, resample_from_p])
def test_the_same_test_detects_wrong_rules(wrong_rule):
    first, pairs = distribution_statistics(wrong_rule, 1)
    assert first > chi2_critical(V - 1) or pairs > chi2_critical(V * V - 1)
