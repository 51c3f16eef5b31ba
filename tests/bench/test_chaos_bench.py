"""The pure parts of bench/chaos.py: the text diff that counts characters duplicated or lost
against the reference output, and the stall measured across a kill."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

CHAOS_PATH = Path(__file__).resolve().parents[2] / "bench" / "chaos.py"


def _load_chaos():
    if "chaos" in sys.modules:
        return sys.modules["chaos"]
    sys.path.insert(0, str(CHAOS_PATH.parent))  # its `from _common import ...`
    spec = importlib.util.spec_from_file_location("chaos", CHAOS_PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["chaos"] = module  # dataclasses look their module up while executing it
    spec.loader.exec_module(module)
    return module


REF = "Once upon a time, a robot painted."


def test_equal_texts_have_nothing_duplicated_or_lost() -> None:
    assert _load_chaos().text_diff(REF, REF) == (0, 0)
    assert _load_chaos().text_diff("", "") == (0, 0)


def test_a_repeated_piece_counts_as_duplicated() -> None:
    got = REF[:17] + REF[10:17] + REF[17:]  # " a time," sent twice across a continuation
    assert _load_chaos().text_diff(REF, got) == (7, 0)


def test_a_missing_piece_counts_as_lost() -> None:
    got = REF[:10] + REF[17:]
    assert _load_chaos().text_diff(REF, got) == (0, 7)
    assert _load_chaos().text_diff(REF, "") == (0, len(REF))


def test_a_replaced_piece_counts_both_ways() -> None:
    got = REF.replace("robot", "fish")
    assert _load_chaos().text_diff(REF, got) == (4, 5)


def test_the_stall_is_the_gap_across_the_kill() -> None:
    chaos = _load_chaos()
    times = [1.0, 1.1, 1.2, 2.0, 2.1]
    assert chaos.stall_across(times, 1.25) == 2.0 - 1.2
    assert chaos.stall_across(times, 0.5) is None  # nothing before the kill
    assert chaos.stall_across(times, 3.0) is None  # nothing after it


def test_the_first_difference_locates_where_a_text_parts_from_its_reference() -> None:
    chaos = _load_chaos()
    assert chaos.first_difference(REF, REF) is None
    assert chaos.first_difference(REF, REF.replace("robot", "fish")) == REF.index("robot")
    assert chaos.first_difference(REF, REF[:5]) == 5  # cut short
    assert chaos.first_difference(REF[:5], REF) == 5  # ran on
