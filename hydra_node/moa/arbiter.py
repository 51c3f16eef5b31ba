"""The mixture-of-agents arbiter (pure: no IO, no clock): member answers in, one verdict out.

``model: "mesh"`` asks every member model the same chat (:mod:`hydra_node.moa.mixture`); this module
decides which answer wins. The rules (docs/moa.md is the user-facing copy):

1. **Normalise** each answer to a key (:func:`answer_key`):

   * an answer with tool calls is keyed by its calls only (any text beside them is ignored): each
     call as its function name and its arguments in canonical JSON, the calls as a sorted list
     (the order in which a model lists independent calls does not matter);
   * text that is a JSON object or array (optionally inside a Markdown code fence) is keyed by its
     canonical form (keys sorted, no whitespace, integral numbers written as integers: ``4.0`` is
     ``4``); strings inside stay exact;
   * other text is compared after Unicode NFKC, case folding, numbers rewritten canonically
     (``4``, ``4.0``, ``+4`` and ``04`` are ``4``; ``1,000`` is ``1000``; the words ``zero`` to
     ``twenty``, the tens, ``hundred`` and ``thousand`` are digits), apostrophes dropped, other
     punctuation and symbols turned into spaces, and whitespace collapsed.

2. **Group** answers with equal keys.

3. **Majority**: a group holding more than half of the answers that came back wins. Members that
   failed or missed the deadline do not vote.

4. **Ranking and ties**: groups are ranked by size (larger first), then by the best *quality* of a
   member in them (the scheduler's success rate for the target that served it; higher first),
   then by that member's *latency* in this request (lower first), then by the smallest model id.
   Within a group the members are ordered the same way; the first member of the first group is
   the pick, and its own answer (not a normalised form) is returned. Model ids are unique, so the
   order is total and the verdict never depends on the order in which answers arrived.

Without a majority the caller asks the reducer model when one is configured, and otherwise returns
the pick.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from dataclasses import dataclass
from decimal import Context, Decimal, InvalidOperation
from typing import Iterable, Sequence

__all__ = [
    "MemberAnswer",
    "AnswerGroup",
    "Verdict",
    "answer_key",
    "normalise_text",
    "canonical_json",
    "canonical_number",
    "arbitrate",
]

#: Largest text the arbiter normalises; the rest of a longer answer is compared as is (bounded work).
MAX_NORMALISED_CHARS = 64 * 1024
#: Exponents at or beyond this are left as written (no exact normal form is worth computing).
MAX_EXPONENT = 10**6
#: Longer integers stay strings in a canonical JSON form (Python's int/str conversion limit is 4300).
MAX_INT_DIGITS = 4000
#: Numbers with an exponent beyond this are kept in scientific form (``1e999999`` must not expand).
MAX_PLAIN_EXPONENT = 64

#: A number stands alone between non-alphanumerics; "_" counts as the punctuation it is stripped as,
#: so "00_" reads as a number at once rather than after the strip (normalising twice changes nothing).
_NUMBER = re.compile(r"(?<![^\W_]|\.)[-+]?\d+(?:,\d{3})*(?:\.\d+)?(?:[eE][-+]?\d+)?(?![^\W_])")
_FENCE = re.compile(r"^```[A-Za-z0-9_-]*\s*\n(.*)\n\s*```$", re.S)
_APOSTROPHES = frozenset("'\u2019`")
_ONES = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen twenty"
).split()
_TENS = {
    "thirty": 30,
    "forty": 40,
    "fifty": 50,
    "sixty": 60,
    "seventy": 70,
    "eighty": 80,
    "ninety": 90,
    "hundred": 100,
    "thousand": 1000,
}
_WORDS = {**{w: str(i) for i, w in enumerate(_ONES)}, **{w: str(v) for w, v in _TENS.items()}}


@dataclass(frozen=True)
class MemberAnswer:
    """One member's answer: its text (``""`` when none) and its tool calls as ``(name, arguments)``."""

    model: str
    content: str = ""
    tool_calls: tuple[tuple[str, str], ...] = ()
    quality: float = 1.0  # the scheduler's success rate for the target that answered (1.0: unknown)
    latency_ms: float = 0.0  # how long this member took in this request

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise ValueError("MemberAnswer.model must be a non-empty model id")
        for name in ("quality", "latency_ms"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"MemberAnswer.{name} must be finite")


@dataclass(frozen=True)
class AnswerGroup:
    """Equivalent answers: the normalised key and the members that gave it, best first."""

    key: str
    members: tuple[str, ...]


@dataclass(frozen=True)
class Verdict:
    """``groups`` ranked (the winner's first); ``chosen``: the model whose answer is returned."""

    groups: tuple[AnswerGroup, ...]
    chosen: str
    majority: bool

    def group_of(self, model: str) -> int | None:
        return next((i for i, g in enumerate(self.groups) if model in g.members), None)


def canonical_number(text: str) -> str:
    """``"4.0"``, ``"+4"``, ``"04"`` → ``"4"``; ``"1,000.50"`` → ``"1000.5"``; ``"-0"`` → ``"0"``; exact
    (no rounding); beyond :data:`MAX_PLAIN_EXPONENT` in scientific form (``1e+100``)."""
    try:
        d = Decimal(text.replace(",", ""))
    except InvalidOperation:
        return text
    if not d.is_finite():
        return text
    if d.is_zero():
        return "0"
    digits = d.as_tuple().digits
    exact = Context(prec=max(1, len(digits)), Emax=MAX_EXPONENT, Emin=-MAX_EXPONENT)
    if abs(d.adjusted()) >= MAX_EXPONENT:
        return text
    d = d.normalize(exact)
    if abs(d.adjusted()) > MAX_PLAIN_EXPONENT:
        return f"{d:e}".lower()
    return format(d, "f")


def canonical_json(text: str) -> str | None:
    """The canonical form of ``text`` when it is a JSON object or array, else None."""
    s = text.strip()
    fenced = _FENCE.match(s)
    if fenced:
        s = fenced.group(1).strip()
    if not s or s[0] not in "{[":
        return None
    try:
        value = _load_json(s)
    except (ValueError, RecursionError):
        return None
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _load_json(s: str):
    """JSON with every number in canonical form (parsed exactly, as Decimal, never rounded through float)."""
    return _decimals(json.loads(s, parse_float=Decimal, parse_int=Decimal))


def _decimals(v):
    """JSON numbers parsed as Decimal → int or float in canonical form (no float rounding of ints)."""
    if isinstance(v, Decimal):
        c = canonical_number(str(v))
        if re.fullmatch(r"-?\d+", c):
            return int(c) if len(c) <= MAX_INT_DIGITS else c
        return float(c) if math.isfinite(float(c)) else c
    if isinstance(v, list):
        return [_decimals(x) for x in v]
    if isinstance(v, dict):
        return {k: _decimals(x) for k, x in v.items()}
    return v


def _strip_punctuation(s: str) -> str:
    """Apostrophes go (``it's`` is ``its``); other punctuation and symbols separate words."""
    return "".join("" if c in _APOSTROPHES else " " if unicodedata.category(c)[0] in "PS" else c for c in s)


def normalise_text(text: str) -> str:
    """Free text as compared: NFKC, case-folded, numbers canonical, no punctuation, single spaces."""
    head, tail = text[:MAX_NORMALISED_CHARS], text[MAX_NORMALISED_CHARS:]
    # NFKC again after case folding: folding can leave a composable pair (``ß`` + accent → ``ss`` + accent)
    s = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", head).casefold())
    return " ".join(_tokens(s)) + tail


def _split_numbers(s: str) -> list[tuple[bool, str]]:
    """``s`` cut into ``(is_number, piece)`` in order."""
    pieces: list[tuple[bool, str]] = []
    at = 0
    for m in _NUMBER.finditer(s):
        pieces += [(False, s[at : m.start()]), (True, m.group())]
        at = m.end()
    return pieces + [(False, s[at:])]


def _tokens(s: str) -> list[str]:
    """Canonical numbers and punctuation-free words. Removing punctuation can free digits the number
    pattern could not take in place (``.00``; ``.0`` before a control character), so each word is cut at
    numbers once more and every number is its own token: a second pass over the joined tokens then
    changes nothing."""
    out: list[str] = []
    for is_number, piece in _split_numbers(s):
        if is_number:
            out.append(canonical_number(piece))
            continue
        # NFKC again: dropping an apostrophe can bring a letter and a combining accent together
        for word in unicodedata.normalize("NFKC", _strip_punctuation(piece)).split():
            for inner_number, inner in _split_numbers(word):
                if inner_number:
                    out.append(canonical_number(inner))
                elif inner:
                    out.append(_WORDS.get(inner, inner))
    return out


def _arguments_key(arguments: str):
    try:
        return _load_json(arguments)
    except (ValueError, RecursionError):
        return arguments.strip()


def answer_key(answer: MemberAnswer) -> str:
    """The normalised form two answers share exactly when they count as the same answer."""
    if answer.tool_calls:
        calls = sorted(
            json.dumps([name, _arguments_key(args)], sort_keys=True, separators=(",", ":"), ensure_ascii=False)
            for name, args in answer.tool_calls
        )
        return "calls:[" + ",".join(calls) + "]"
    as_json = canonical_json(answer.content)
    if as_json is not None:
        return "json:" + as_json
    return "text:" + normalise_text(answer.content)


def _member_rank(a: MemberAnswer) -> tuple:
    return (-a.quality, a.latency_ms, a.model)


def arbitrate(answers: Sequence[MemberAnswer] | Iterable[MemberAnswer]) -> Verdict:
    """Group ``answers``, rank the groups (module doc), and say whether the first is a majority."""
    answers = list(answers)
    if not answers:
        raise ValueError("arbitrate needs at least one answer")
    if len({a.model for a in answers}) != len(answers):
        raise ValueError("each member model answers once")
    by_key: dict[str, list[MemberAnswer]] = {}
    for a in answers:
        by_key.setdefault(answer_key(a), []).append(a)
    ranked = []
    for key, members in by_key.items():
        members.sort(key=_member_rank)
        ranked.append(((-len(members), *_member_rank(members[0])), key, members))
    ranked.sort(key=lambda r: r[0])
    groups = tuple(AnswerGroup(key, tuple(m.model for m in members)) for _, key, members in ranked)
    return Verdict(groups=groups, chosen=groups[0].members[0], majority=2 * len(groups[0].members) > len(answers))
