"""GBNF building blocks for JSON (pure): literals, the primitive JSON rules, integer ranges.

Every rule here accepts only text that ``json.loads`` reads (no raw control characters in
strings, no lone surrogate escapes, no NaN) and keeps whitespace bounded (``ws``: nothing, one
space, or one newline and up to 8 spaces of indentation), so a small model cannot run away in
whitespace. A string ``char`` is exactly one code point of the decoded string (``\\u`` escapes
of surrogates are not generated), so ``minLength``/``maxLength`` count what JSON Schema counts.
"""

from __future__ import annotations

import re

__all__ = [
    "PRIMITIVES",
    "FORMATS",
    "INT_FORMATS",
    "NUMBER_FORMATS",
    "MAX_REPEAT",
    "MAX_DIGITS",
    "gbnf_literal",
    "gbnf_char",
    "is_single",
    "repeat",
    "int_range",
]

#: Largest repetition count written into a grammar (llama.cpp expands ``x{m,n}`` into copies):
#: a ``maxLength``/``maxItems`` above it generates at most this many; a minimum above it is refused.
#: A repeated group holds at most two new rules (itself and one item rule), and llama.cpp refuses
#: rules x repetitions >= 2000, so this stays below 1000.
MAX_REPEAT = 999
#: Digits of an integer with no bound on that side (the JSON rule for any integer allows as many).
MAX_DIGITS = 16

#: name -> (body, rules it uses). Added to a grammar on first use, with their dependencies.
PRIMITIVES: dict[str, tuple[str, tuple[str, ...]]] = {
    "ws": (r'( " " | "\n" " "{0,8} )?', ()),
    "hex": (r"[0-9a-fA-F]", ()),
    "char": (
        r'[^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" ( [0-9a-cA-C] hex{3} | [dD] [0-7] hex{2} '
        r'| [eEfF] hex{3} ) )',
        ("hex",),
    ),
    "string": (r'"\"" char* "\""', ("char",)),
    "boolean": (r'"true" | "false"', ()),
    "null": (r'"null"', ()),
    "integral": (r'"0" | [1-9] [0-9]{0,15}', ()),
    "integer": (r'"-"? integral', ("integral",)),
    # finite (exponent below 100); any double's shortest repr fits (17 significant digits)
    "number": (r'"-"? integral ( "." [0-9]{1,20} )? ( [eE] [-+]? [0-9]{1,2} )?', ("integral",)),
    "object": (
        r'"{" ws ( string ws ":" ws value ( ws "," ws string ws ":" ws value )* ws )? "}"',
        ("ws", "string", "value"),
    ),
    "array": (r'"[" ws ( value ( ws "," ws value )* ws )? "]"', ("ws", "value")),
    "value": (
        "object | array | string | number | boolean | null",
        ("object", "array", "string", "number", "boolean", "null"),
    ),
    # string formats (JSON Schema "format"), the text inside the quotes: sound subsets with a
    # bounded length (RFC 3339 date/time, RFC 4122 uuid, RFC 5321 mailbox, RFC 1123 hostname,
    # RFC 3986 URI with an authority, dotted-quad IPv4)
    "date": (r'[0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [12] [0-9] | "3" [01] )', ()),
    "time": (
        r'( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{1,6} )? '
        r'( "Z" | [+-] ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )',
        (),
    ),
    "date-time": (r'date "T" time', ("date", "time")),
    "uuid": (r'hex{8} "-" hex{4} "-" hex{4} "-" hex{4} "-" hex{12}', ("hex",)),
    "label": (r'[a-zA-Z0-9]{1,20} ( "-" [a-zA-Z0-9]{1,20} ){0,2}', ()),
    "hostname": (r'label ( "." label ){0,3}', ("label",)),
    "email": (
        r'[a-zA-Z0-9_%+\x2D]{1,32} ( "." [a-zA-Z0-9_%+\x2D]{1,32} ){0,3} "@" label ( "." label ){0,2} '
        r'"." [a-zA-Z]{2,12}',
        ("label",),
    ),
    "octet": (r'"25" [0-5] | "2" [0-4] [0-9] | "1" [0-9] [0-9] | [1-9] [0-9] | [0-9]', ()),
    "ipv4": (r'octet "." octet "." octet "." octet', ("octet",)),
    "pchar": (r'[a-zA-Z0-9._~!$&\x27()*+,;=:@\x2D] | "%" hex hex', ("hex",)),
    "uri": (
        r'[a-zA-Z] [a-zA-Z0-9+.\x2D]{0,9} "://" hostname ( "/" pchar{0,32} ){0,8} ( "?" ( pchar | [/?] ){0,128} )?',
        ("hostname", "pchar"),
    ),
}

#: JSON Schema string formats: name -> (rule, shortest and longest text the rule generates).
FORMATS = {
    "date": ("date", 10, 10),
    "time": ("time", 9, 21),
    "date-time": ("date-time", 20, 32),
    "uuid": ("uuid", 36, 36),
    "email": ("email", 6, 333),
    "hostname": ("hostname", 1, 251),
    "ipv4": ("ipv4", 7, 15),
    "uri": ("uri", 5, 10 + 3 + 251 + 8 * (1 + 32 * 3) + 1 + 128 * 3),
}
#: Integer formats (OpenAPI) -> bounds; number formats that constrain nothing we generate.
INT_FORMATS = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}
NUMBER_FORMATS = frozenset({"float", "double"})


def gbnf_char(cp: int) -> str:
    """One code point as written inside a GBNF literal or character class."""
    ch = chr(cp)
    if ch.isalnum() or ch in " !#$%&'()*+,./:;<=>?@_`{|}~" and cp < 0x80:
        return ch
    if cp < 0x100:
        return f"\\x{cp:02X}"
    if cp < 0x10000:
        return f"\\u{cp:04X}"
    return f"\\U{cp:08X}"


def gbnf_literal(text: str) -> str:
    """``text`` as a GBNF string literal (every character that needs it escaped)."""
    return '"' + "".join(gbnf_char(ord(c)) for c in text) + '"'


_TOKEN = re.compile(r'[A-Za-z0-9-]+|"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]')


def is_single(item: str) -> bool:
    """Whether ``item`` is one GBNF element (a name, a literal, a class or one group)."""
    if _TOKEN.fullmatch(item):
        return True
    if not item.startswith("("):
        return False
    depth, i = 0, 0
    while i < len(item):
        m = _TOKEN.match(item, i) if item[i] in '"[' else None
        if m:
            i = m.end()
            continue
        depth += {"(": 1, ")": -1}.get(item[i], 0)
        if depth == 0:
            return i == len(item) - 1
        i += 1
    return False


def repeat(item: str, lo: int, hi: int | None) -> str:
    """``item`` repeated lo..hi times (hi None: unbounded) as a GBNF expression ('' for none)."""
    if hi is not None and hi <= 0:
        return ""
    if is_single(item):
        if hi is None:
            return f"{item}*" if lo == 0 else f"{item}+" if lo == 1 else f"{item}{{{lo},}}"
        if lo == hi:
            return item if lo == 1 else f"{item}{{{lo}}}"
        return f"{item}?" if (lo, hi) == (0, 1) else f"{item}{{{lo},{hi}}}"
    if hi is None:
        return f"( {item} )*" if lo == 0 else f"( {item} )+" if lo == 1 else f"( {item} ){{{lo},}}"
    if lo == hi:
        return f"( {item} )" if lo == 1 else f"( {item} ){{{lo}}}"
    return f"( {item} )?" if (lo, hi) == (0, 1) else f"( {item} ){{{lo},{hi}}}"


# ---- integer ranges -----------------------------------------------------------------------
def _digit_class(lo: int, hi: int) -> str:
    return str(lo) if lo == hi else f"[{lo}-{hi}]"


def _same_length(lo: str, hi: str) -> list[str]:
    """Alternatives matching the digit strings from ``lo`` to ``hi`` (same length, leading zeros
    allowed: this is a suffix)."""
    if not lo:
        return [""]
    a, b = int(lo[0]), int(hi[0])
    rest = len(lo) - 1
    if lo[1:] == "0" * rest and hi[1:] == "9" * rest:
        return [f"{_digit_class(a, b)} [0-9]{{{rest}}}" if rest else _digit_class(a, b)]
    if a == b:
        return [f"{a} {alt}".strip() for alt in _same_length(lo[1:], hi[1:])]
    out = [f"{a} {alt}".strip() for alt in _same_length(lo[1:], "9" * rest)]
    if b - a > 1:
        out.append(f"{_digit_class(a + 1, b - 1)} " + (f"[0-9]{{{rest}}}" if rest else "").strip())
    out += [f"{b} {alt}".strip() for alt in _same_length("0" * rest, hi[1:])]
    return [o.strip() for o in out]


def _natural_range(lo: int, hi: int | None) -> list[str]:
    """Alternatives for the decimal numbers lo..hi (lo >= 0; hi None: up to MAX_DIGITS digits,
    or the digits of lo if it has more), with no leading zeros."""
    max_len = max(MAX_DIGITS, len(str(lo))) if hi is None else len(str(hi))
    out: list[str] = []
    for n in range(len(str(lo)), max_len + 1):
        first = 0 if n == 1 else 10 ** (n - 1)
        last = 10**n - 1
        a, b = max(lo, first), last if hi is None else min(hi, last)
        if a > b:
            continue
        if (a, b) == (first, last) and n > 1:
            out.append(f"[1-9] [0-9]{{{n - 1}}}")
            continue
        out += _same_length(str(a), str(b))
    return [_quote_digits(alt) for alt in out]


def _quote_digits(alt: str) -> str:
    """Bare digits in an alternative as GBNF literals ('1 [0-9]' -> '"1" [0-9]')."""
    return " ".join(f'"{t}"' if t.isdigit() else t for t in alt.split(" "))


def int_range(lo: int | None, hi: int | None) -> str:
    """A GBNF expression for the JSON integers from ``lo`` to ``hi`` (None: unbounded on that side,
    up to MAX_DIGITS digits). Raises ValueError for an empty range."""
    if lo is not None and hi is not None and lo > hi:
        raise ValueError("empty range")
    alts: list[str] = []
    if lo is None or lo < 0:  # negatives: "-" then the magnitudes |hi'|..|lo|
        top = -1 if hi is None or hi >= 0 else hi
        mags = _natural_range(-top, None if lo is None else -lo)
        alts += [f'"-" ( {" | ".join(mags)} )' if len(mags) > 1 else f'"-" {mags[0]}']
    if hi is None or hi >= 0:
        alts += _natural_range(max(lo or 0, 0), hi)
    return " | ".join(alts)
