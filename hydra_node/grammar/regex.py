"""A JSON Schema ``pattern`` (ECMAScript regex subset) as GBNF for the inside of a JSON string (pure).

The grammar generates strings that match the WHOLE pattern (a leading ``^`` and trailing ``$``
are optional and implied), which also satisfies JSON Schema's search semantics. What is
generated is JSON text: a character that JSON must escape (``"``, ``\\``, control characters) is
written as its escape where the pattern names it literally (``\\n``, ``\\"``), and is left out
of character classes and ``.`` (they only generate characters that can stand unescaped).

Supported: literals, ``.``, classes ``[a-z]`` ``[^...]``, ``\\d \\w \\s \\D \\W \\S``, escapes
(``\\n \\t \\r \\f \\v \\0 \\xHH \\uHHHH``, escaped punctuation), groups ``(...)`` ``(?:...)``
``(?<name>...)``, alternation ``|``, quantifiers ``* + ? {n} {n,} {n,m}`` (lazy ``?`` suffix
accepted: it changes no match). Refused with :class:`PatternError`: lookarounds, backreferences,
word boundaries, ``^``/``$`` anywhere but the ends, Unicode property escapes.

Patterns that would make llama.cpp's grammar engine explode (it keeps every way a prefix can be
parsed) are rewritten or refused: a repetition of a sub-pattern that is itself ``X{0,k}`` (``x?``,
``x*``, ``(|x)``) is rewritten to the equivalent ``X{0,k*n}`` (``(x?){n}`` -> ``x{0,n}``, ``(a*)*``
-> ``a*``, ``(|a)+`` -> ``a*``); any other repetition (more than once) of a sub-pattern that can
match the empty string is refused, and so are more than :data:`MAX_ADJACENT_UNBOUNDED` unbounded
repetitions side by side (``.*.*.*.*.*``), repetitions of an alternation of more than
:data:`MAX_REPEATED_ALTERNATIVES` alternatives (``([a-z]|[a-z]|...)*``: every alternative is a parse
stack, re-entered at every character, and one token's grammar work grows with their cube), and
patterns needing more than :data:`MAX_PATTERN_RULES` rules or :data:`MAX_PATTERN_SIZE` elements once
expanded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from hydra_node.grammar.terms import MAX_REPEAT, gbnf_char, gbnf_literal, is_single, repeat

__all__ = ["PatternError", "pattern_gbnf"]

#: Code points JSON cannot hold unescaped in a string: controls, '"' and '\'.
_FORBIDDEN = [(0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C)]
_FORBIDDEN_GBNF = r'"\\\x00-\x1F'
#: ECMAScript \s beyond ASCII controls (which are forbidden anyway).
_UNICODE_SPACES = [
    (0x20, 0x20),
    (0xA0, 0xA0),
    (0x1680, 0x1680),
    (0x2000, 0x200A),
    (0x2028, 0x2029),
    (0x202F, 0x202F),
    (0x205F, 0x205F),
    (0x3000, 0x3000),
    (0xFEFF, 0xFEFF),
]
_SHORTHAND = {"d": [(0x30, 0x39)], "w": [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)], "s": _UNICODE_SPACES}
_CONTROL_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "0": "\0"}
#: llama.cpp refuses a repetition when (rules inside the repeated group) x (repetitions) reaches
#: this (MAX_REPETITION_THRESHOLD in llama-grammar.cpp): nested repetitions are checked against it.
LLAMA_REPETITION_THRESHOLD = 2000
#: Unbounded repetitions allowed side by side (with only nullable items between them): each pair
#: is ambiguous, and llama.cpp's parse stacks multiply with them.
MAX_ADJACENT_UNBOUNDED = 4
#: Alternatives a repeated group may hold (nested alternations counted together): llama.cpp keeps a
#: parse stack per alternative and re-enters them all at each character.  Measured with the bundled
#: model on a 2-core CPU, ``^([a-z]|...)*$`` with 150 alternatives: 6.6 s for one 3-character token.
MAX_REPEATED_ALTERNATIVES = 64
#: Rules llama.cpp may synthesise for one pattern (groups, alternations, expanded repetitions).
MAX_PATTERN_RULES = 5000
#: Grammar elements one pattern may expand to (``(a{999}){999}`` is a million copies of ``a``).
MAX_PATTERN_SIZE = 20000


@dataclass(frozen=True)
class _Shape:
    """What the parser knows about the expression it just parsed."""

    nullable: bool = False  # it matches the empty string
    unbounded: int = 0  # unbounded repetitions inside it (the most of any alternative)
    base: str | None = None  # it is exactly ``base{0,hi}`` (so repeating it is ``base{0,hi*n}``)
    base_made: int = 0  # the rules ``base`` holds
    hi: int | None = None  # with ``base``: the most repetitions (None: unbounded)
    size: int = 1  # grammar elements once llama.cpp has expanded every bounded repetition
    base_size: int = 0  # the elements of ``base``
    width: int = 1  # alternatives one character may enter at once (nested alternations flattened)


_SOLID = _Shape()


class PatternError(ValueError):
    """The pattern uses something this converter cannot honour; the message says what."""


def pattern_gbnf(pattern: str) -> str:
    """GBNF for the JSON-encoded text of the strings that fully match ``pattern``."""
    return _Parser(pattern).parse()


def _subtract(ranges: list[tuple[int, int]], minus: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out = []
    for lo, hi in ranges:
        pieces = [(lo, hi)]
        for mlo, mhi in minus:
            nxt = []
            for a, b in pieces:
                if mhi < a or mlo > b:
                    nxt.append((a, b))
                    continue
                if a < mlo:
                    nxt.append((a, mlo - 1))
                if mhi < b:
                    nxt.append((mhi + 1, b))
            pieces = nxt
        out += pieces
    return out


def _class(ranges: list[tuple[int, int]], negate: bool) -> str:
    body = "".join(gbnf_char(a) if a == b else f"{gbnf_char(a)}-{gbnf_char(b)}" for a, b in ranges)
    return f"[^{body}{_FORBIDDEN_GBNF}]" if negate else f"[{body}]"


def _literal(ch: str) -> str:
    """One decoded character as GBNF for its JSON encoding."""
    return gbnf_literal(json.dumps(ch, ensure_ascii=False)[1:-1])


class _Parser:
    def __init__(self, src: str):
        self.src = src
        self.i = 0
        self.end = len(src)
        self.made = 0  # rules llama.cpp will synthesise for what is parsed so far (groups, repetitions)
        self.shape = _SOLID  # of what was parsed last (an atom, a sequence, an alternation)

    def fail(self, what: str) -> PatternError:
        return PatternError(f"pattern {self.src!r:.80}: {what} (at offset {self.i})")

    def parse(self) -> str:
        if self.src.startswith("^"):
            self.i = 1
        if self.src.endswith("$") and self.end > self.i:
            backslashes = len(self.src[:-1]) - len(self.src[:-1].rstrip("\\"))
            if backslashes % 2 == 0:
                self.end -= 1
        expr = self._alternation()
        if self.i != self.end:
            raise self.fail("unbalanced ')'")
        self._check_size(self.shape.size)
        return expr

    def _check_size(self, size: int) -> None:
        if size > MAX_PATTERN_SIZE:
            raise self.fail(
                f"a pattern larger than {MAX_PATTERN_SIZE} grammar elements once its repetitions are expanded"
            )

    def _peek(self) -> str:
        return self.src[self.i] if self.i < self.end else ""

    def _alternation(self) -> str:
        seqs, shapes, made = [], [], []
        while True:
            before = self.made
            seqs.append(self._sequence())
            shapes.append(self.shape)
            made.append(self.made - before)
            if self._peek() != "|":
                break
            self.i += 1
        if len(seqs) == 1:
            return seqs[0]
        alts = [s for s in seqs if s]
        if not alts:
            self.shape = _Shape(nullable=True, size=0)
            return ""
        some_empty = len(alts) < len(seqs)
        full = [(sh, m) for s, sh, m in zip(seqs, shapes, made, strict=True) if s]
        self.shape = _Shape(
            nullable=some_empty or any(sh.nullable for sh, _ in full),
            unbounded=max(sh.unbounded for sh, _ in full),
            size=sum(sh.size for sh, _ in full),
            width=sum(sh.width for sh, _ in full),
        )
        if some_empty and len(alts) == 1:  # (|X): X{0,1}, or X{0,k} if X is that already
            sh, m = full[0]
            if sh.base is not None:
                self.shape = sh
            elif not sh.nullable:
                self.shape = _Shape(
                    True, sh.unbounded, alts[0], m + (not is_single(alts[0])), 1, sh.size, sh.size, sh.width
                )
        self.made += 1 + some_empty
        return "( " + " | ".join(alts) + (" )?" if some_empty else " )")

    def _sequence(self) -> str:
        items: list[str] = []
        shapes: list[_Shape] = []
        run = 0  # unbounded repetitions side by side, with only nullable items between them
        while self.i < self.end and self._peek() not in "|)":
            before = self.made
            atom = self._atom()
            item = self._quantified(atom, max(1, self.made - before), before)
            if not item:
                continue
            items.append(item)
            shapes.append(self.shape)
            if self.shape.unbounded:
                run += self.shape.unbounded
                if run > MAX_ADJACENT_UNBOUNDED:
                    raise self.fail(
                        f"more than {MAX_ADJACENT_UNBOUNDED} unbounded repetitions side by side "
                        "(too ambiguous for llama.cpp's grammar engine)"
                    )
            elif not self.shape.nullable:
                run = 0
        if len(shapes) == 1:
            self.shape = shapes[0]
        else:
            self.shape = _Shape(
                nullable=all(sh.nullable for sh in shapes),
                unbounded=sum(sh.unbounded for sh in shapes),
                size=sum(sh.size for sh in shapes),
                width=max((sh.width for sh in shapes), default=1),
            )
            self._check_size(self.shape.size)
        return " ".join(items)

    def _atom(self) -> str:
        c = self._peek()
        self.i += 1
        if c == "(":
            if self.src.startswith("?:", self.i):
                self.i += 2
            elif self.src.startswith("?<", self.i) and self.src[self.i + 2 : self.i + 3] not in ("=", "!"):
                self.i = self.src.index(">", self.i) + 1 if ">" in self.src[self.i : self.end] else self.end
            elif self.src.startswith("?P<", self.i):
                self.i = self.src.index(">", self.i) + 1 if ">" in self.src[self.i : self.end] else self.end
            elif self._peek() == "?":
                raise self.fail("lookarounds and other '(?' groups are not supported")
            inner = self._alternation()  # sets self.shape: the group's
            if self._peek() != ")":
                raise self.fail("unbalanced '('")
            self.i += 1
            if not inner or is_single(inner):
                return inner
            self.made += 1
            return f"( {inner} )"
        self.shape = _SOLID
        if c == "[":
            return self._char_class()
        if c == ".":
            return _class([], True)
        if c == "\\":
            return self._escape()
        if c in "^$":
            raise self.fail(f"'{c}' is only supported at the start/end of the pattern")
        if c in "*+?{":
            raise self.fail(f"quantifier '{c}' with nothing to repeat")
        return _literal(c)

    def _escape(self) -> str:
        c = self._peek()
        if not c:
            raise self.fail("a trailing backslash")
        self.i += 1
        if c.lower() in _SHORTHAND:
            ranges = _SHORTHAND[c.lower()]
            if c.islower():
                allowed = _subtract(ranges, _FORBIDDEN)
                return _class(allowed, False)
            return _class(ranges, True)
        return _literal(chr(self._escaped_cp(c)))

    def _escaped_cp(self, c: str) -> int:
        """The code point of an escape ``\\c...`` (self.i is past ``c``)."""
        if c in _CONTROL_ESCAPES:
            return ord(_CONTROL_ESCAPES[c])
        if c in "xu":
            n = 2 if c == "x" else 4
            digits = self.src[self.i : self.i + n]
            if len(digits) != n or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise self.fail(f"'\\{c}' needs {n} hex digits")
            self.i += n
            return int(digits, 16)
        if c.isalnum():
            raise self.fail(f"'\\{c}' is not supported")
        return ord(c)

    def _char_class(self) -> str:
        negate = self._peek() == "^"
        if negate:
            self.i += 1
        ranges: list[tuple[int, int]] = []
        while self._peek() != "]":
            if not self._peek():
                raise self.fail("unbalanced '['")
            lo = self._class_char(ranges)
            if lo is None:
                continue
            if self._peek() == "-" and self.src[self.i + 1 : self.i + 2] not in ("]", ""):
                self.i += 1
                hi = self._class_char(ranges)
                if hi is None or hi < lo:
                    raise self.fail("a bad range in a character class")
                ranges.append((lo, hi))
            else:
                ranges.append((lo, lo))
        self.i += 1
        if negate:
            return _class(ranges, True)
        allowed = _subtract(ranges, _FORBIDDEN)
        if not allowed:
            raise self.fail("a character class with no character that JSON holds unescaped")
        return _class(allowed, False)

    def _class_char(self, ranges: list[tuple[int, int]]) -> int | None:
        """The next class member's code point, or None after adding a shorthand's ranges."""
        c = self._peek()
        self.i += 1
        if c != "\\":
            return ord(c)
        c = self._peek()
        if not c:
            raise self.fail("a trailing backslash")
        self.i += 1
        if c in _SHORTHAND:
            ranges.extend(_SHORTHAND[c])
            return None
        if c == "b":
            return 0x08
        if c.lower() in _SHORTHAND:
            raise self.fail(f"'\\{c}' inside a character class is not supported")
        return self._escaped_cp(c)

    def _quantified(self, atom: str, n_prev: int, before: int) -> str:
        """``atom`` with the quantifier that follows it, if any; ``n_prev``: the rules it holds,
        ``before``: ``self.made`` before it was parsed. ``self.shape`` is the atom's, then the result's."""
        c = self._peek()
        if c not in ("*", "+", "?", "{"):
            return atom
        start = self.i
        self.i += 1
        if c == "{":
            close = self.src.find("}", self.i, self.end)
            spec = self.src[self.i : close] if close >= 0 else ""
            parts = spec.split(",")
            if (
                close < 0
                or len(parts) > 2
                or not parts[0].isdigit()
                or (len(parts) == 2 and parts[1] and not parts[1].isdigit())
            ):
                self.i = start
                raise self.fail("'{' that is not a quantifier {n}, {n,} or {n,m}")
            self.i = close + 1
            lo = int(parts[0])
            hi = lo if len(parts) == 1 else (int(parts[1]) if parts[1] else None)
            if hi is not None and hi < lo:
                raise self.fail("a quantifier {n,m} with m < n")
        else:
            lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
        if self._peek() == "?":
            self.i += 1  # lazy: the same set of full matches
        if self._peek() in ("*", "+", "?", "{") and self._peek():
            raise self.fail("a quantifier after a quantifier")
        if lo > MAX_REPEAT:
            raise self.fail(f"a repetition of more than {MAX_REPEAT}")
        if hi is not None:
            hi = min(hi, MAX_REPEAT)
        if not atom:
            self.shape = _Shape(nullable=True, size=0)
            return ""
        shape = self.shape
        if shape.base is not None:  # (X{0,k}){lo,hi} is X{0,k*hi}: no copy of X nested in another
            atom, lo = shape.base, 0
            hi = 0 if hi == 0 else None if hi is None or shape.hi is None else min(shape.hi * hi, MAX_REPEAT)
            self.made = before + shape.base_made
            n_prev = max(1, shape.base_made)
            shape = _Shape(unbounded=shape.unbounded - (shape.hi is None), size=shape.base_size, width=shape.width)
        elif shape.nullable and (hi is None or hi > 1):
            raise self.fail(
                "a repetition of a sub-pattern that can match the empty string "
                "(too ambiguous for llama.cpp's grammar engine: make the sub-pattern non-empty)"
            )
        if (hi is None or hi > 1) and shape.width > MAX_REPEATED_ALTERNATIVES:
            raise self.fail(
                f"a repetition of {shape.width} alternatives (more than {MAX_REPEATED_ALTERNATIVES}: too slow for "
                "llama.cpp's grammar engine, which follows every alternative at every character; use a "
                "character class such as [a-z] or fewer alternatives)"
            )
        total = hi if hi else (lo or 1)
        if n_prev * total >= LLAMA_REPETITION_THRESHOLD:
            raise self.fail(
                f"repetitions nested too deep for llama.cpp's grammar engine ({n_prev} rules repeated {total} times)"
            )
        made = self.made - before
        self.made += 1 if hi is None else hi - lo
        if self.made > MAX_PATTERN_RULES:
            raise self.fail(f"a pattern larger than {MAX_PATTERN_RULES} grammar rules")
        unbounded = shape.unbounded + (hi is None)
        size = shape.size * max(1, lo if hi is None else hi)
        self._check_size(size)
        if lo == 0 and hi != 0 and not shape.nullable:
            self.shape = _Shape(True, unbounded, atom, made, hi, size, shape.size, shape.width)
        else:
            self.shape = _Shape(shape.nullable or lo == 0, unbounded, size=size, width=shape.width)
        return repeat(atom, lo, hi)
