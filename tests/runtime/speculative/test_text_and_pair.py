"""Text assembly (UTF-8 boundaries, stop sequences), sampling helpers and the test-pair conversion."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, strategies as st

from hydra_node.runtime.child.speculative.sampling import (
    DRAFT_CANDIDATES_MAX,
    SamplingParams,
    draft_distribution,
    target_distribution,
)
from spec_pair import ensure_converted_target
from hydra_node.runtime.child.textstream import TextAssembler


def test_utf8_character_split_across_tokens_is_held_until_complete():
    t = TextAssembler()
    data = "é€".encode()
    assert t.feed(data[:1]) == ""
    assert t.feed(data[1:3]) == "é"
    assert t.feed(data[3:]) == "€"
    assert t.flush() == ""


def test_stop_sequence_across_tokens_is_cut_and_never_leaks():
    t = TextAssembler(stop=("END",))
    assert t.feed(b"abc E") == "abc "
    assert t.feed(b"N") == ""
    assert t.feed(b"Dxyz") == ""
    assert t.stopped and t.flush() == ""


def test_false_stop_prefix_is_released():
    t = TextAssembler(stop=("END",))
    assert t.feed(b"E") == ""
    assert t.feed(b"x") == "Ex"
    assert t.flush() == ""


@given(st.text(max_size=40), st.lists(st.integers(1, 5), max_size=20))
def test_chunking_never_changes_the_text(text, cuts):
    data = text.encode()
    t = TextAssembler(stop=("zz",))
    out, i = "", 0
    for c in cuts + [len(data)]:
        out += t.feed(data[i : i + c])
        i += c
    out += t.flush()
    expected = text[: text.index("zz")] if "zz" in text else text
    assert out == expected


def test_distributions_respect_temperature_top_k_top_p():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    g = target_distribution(logits, SamplingParams())
    assert g.tolist() == [1.0, 0.0, 0.0, 0.0]
    p = target_distribution(logits, SamplingParams(temperature=1.0, top_p=0.8))
    np.testing.assert_allclose(p, [0.625, 0.375, 0, 0])
    p = target_distribution(logits, SamplingParams(temperature=1.0, top_k=3))
    np.testing.assert_allclose(p, np.array([0.5, 0.3, 0.15, 0]) / 0.95)
    big = np.random.default_rng(0).normal(size=1000)
    q = draft_distribution(big, SamplingParams(temperature=1.0))
    assert len(q.ids) == DRAFT_CANDIDATES_MAX and abs(q.probs.sum() - 1) < 1e-9
    with pytest.raises(ValueError):
        SamplingParams(temperature=-1)


def test_f16_conversion_is_made_once_atomically(model_path, tmp_path):
    out = ensure_converted_target(model_path, tmp_path, "f16")
    assert out.read_bytes()[:4] == b"GGUF"
    assert out.stat().st_size > 2 * model_path.stat().st_size
    mtime = out.stat().st_mtime_ns
    assert ensure_converted_target(model_path, tmp_path, "f16") == out
    assert out.stat().st_mtime_ns == mtime
    assert [p.name for p in tmp_path.iterdir()] == [out.name]  # no temp file left
    with pytest.raises(ValueError):
        ensure_converted_target(model_path, tmp_path, "q2")
