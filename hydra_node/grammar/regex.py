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
"""

from __future__ import annotations

import json

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
        return expr

    def _peek(self) -> str:
        return self.src[self.i] if self.i < self.end else ""

    def _alternation(self) -> str:
        seqs = [self._sequence()]
        while self._peek() == "|":
            self.i += 1
            seqs.append(self._sequence())
        if len(seqs) == 1:
            return seqs[0]
        alts = [s for s in seqs if s]
        if not alts:
            return ""
        self.made += 1 + (len(alts) < len(seqs))
        return "( " + " | ".join(alts) + (" )?" if len(alts) < len(seqs) else " )")

    def _sequence(self) -> str:
        items = []
        while self.i < self.end and self._peek() not in "|)":
            before = self.made
            atom = self._atom()
            items.append(self._quantified(atom, max(1, self.made - before)))
        return " ".join(i for i in items if i)

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
            inner = self._alternation()
            if self._peek() != ")":
                raise self.fail("unbalanced '('")
            self.i += 1
            if not inner or is_single(inner):
                return inner
            self.made += 1
            return f"( {inner} )"
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

    def _quantified(self, atom: str, n_prev: int) -> str:
        """``atom`` with the quantifier that follows it, if any; ``n_prev``: the rules it holds."""
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
            return ""
        total = hi if hi else (lo or 1)
        if n_prev * total >= LLAMA_REPETITION_THRESHOLD:
            raise self.fail(
                f"repetitions nested too deep for llama.cpp's grammar engine ({n_prev} rules repeated {total} times)"
            )
        self.made += 1 if hi is None else hi - lo
        return repeat(atom, lo, hi)
