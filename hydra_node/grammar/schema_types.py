"""GBNF for one JSON type of a schema (pure): objects, arrays, strings, integers, numbers.

Called by ``schema.GrammarBuilder`` (passed in as ``b``: ``use``/``add``/``fail``/
``unsupported``/``visit_child``), which has already checked that every keyword is known and
applies to the schema's types. See :mod:`.schema` for the subset and what it generates.
"""

from __future__ import annotations

import json
import math
from typing import Any, Protocol

from hydra_node.grammar.regex import PatternError, pattern_gbnf
from hydra_node.grammar.terms import (
    FORMATS,
    INT_FORMATS,
    MAX_DIGITS,
    MAX_REPEAT,
    NUMBER_FORMATS,
    gbnf_literal,
    int_range,
    repeat,
)
from hydra_node.inference import InvalidRequest

__all__ = ["ANNOTATIONS", "FAMILY", "of_type", "pointer", "typed_rule"]

#: Keywords that constrain nothing (``$defs``/``definitions`` hold subschemas for ``$ref``).
ANNOTATIONS = frozenset(
    {
        "title",
        "description",
        "default",
        "examples",
        "$schema",
        "$id",
        "$comment",
        "strict",
        "deprecated",
        "readOnly",
        "writeOnly",
        "discriminator",
        "$defs",
        "definitions",
    }
)
_OBJECT = frozenset({"properties", "required", "additionalProperties"})
_ARRAY = frozenset({"items", "prefixItems", "minItems", "maxItems"})
_STRING = frozenset({"minLength", "maxLength", "pattern", "format"})
_NUMBER = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "format"})
#: The keywords that apply to each JSON Schema type.
FAMILY = {
    "object": _OBJECT,
    "array": _ARRAY,
    "string": _STRING,
    "number": _NUMBER,
    "integer": _NUMBER,
    "boolean": frozenset(),
    "null": frozenset(),
}
_SEP = 'ws "," ws'
_QUOTE = '"\\""'
#: Bounds beyond this magnitude are looser than what unbounded generation writes anyway.
_BIG = 10**MAX_DIGITS


class RuleBuilder(Protocol):
    """What the rules here use of ``schema.GrammarBuilder`` (``b``)."""

    def use(self, name: str) -> str: ...
    def add(self, hint: str, body: str) -> str: ...
    def fail(self, what: str, ptr: str) -> InvalidRequest: ...
    def unsupported(self, what: str, ptr: str) -> InvalidRequest: ...
    def visit_child(self, s: object, ptr: str, hint: str, depth: int) -> str: ...


def pointer(base: str, *parts: object) -> str:
    """A JSON pointer (``#/a/b``) extended by ``parts`` (escaped as RFC 6901 says)."""
    return base + "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def of_type(v: object, t: str) -> bool:
    """Whether the JSON value ``v`` is of JSON Schema type ``t``."""
    if t == "integer":
        return type(v) is int or (type(v) is float and v.is_integer())
    if t == "number":
        return (type(v) is int or type(v) is float) and math.isfinite(v)
    return {
        "null": v is None,
        "boolean": isinstance(v, bool),
        "string": isinstance(v, str),
        "object": isinstance(v, dict),
        "array": isinstance(v, list),
    }[t]


def typed_rule(b: RuleBuilder, s: dict[str, Any], t: str, ptr: str, hint: str, depth: int) -> str:
    """A GBNF expression for the values of type ``t`` that satisfy ``s``."""
    if t in ("null", "boolean"):
        return b.use(t)
    if t == "string":
        return _string(b, s, ptr, hint)
    if t in ("integer", "number"):
        return _number(b, s, t, ptr, hint)
    if t == "object":
        return _object(b, s, ptr, hint, depth)
    return _array(b, s, ptr, hint, depth)


def _count(b: RuleBuilder, s: dict[str, Any], key: str, ptr: str) -> int | None:
    v = s.get(key)
    if v is None:
        return None
    if type(v) is float and v.is_integer():
        v = int(v)
    if type(v) is not int or v < 0:
        raise b.fail(f"'{key}' must be a non-negative integer", ptr)
    return v


def _bounds(b: RuleBuilder, s: dict[str, Any], lo_key: str, hi_key: str, ptr: str) -> tuple[int, int | None]:
    lo, hi = _count(b, s, lo_key, ptr) or 0, _count(b, s, hi_key, ptr)
    if hi is not None and lo > hi:
        raise b.fail(f"'{lo_key}' is greater than '{hi_key}'", ptr)
    if lo > MAX_REPEAT:
        raise b.unsupported(f"'{lo_key}' above {MAX_REPEAT}", ptr)
    return lo, None if hi is None else min(hi, MAX_REPEAT)


# ---- strings ------------------------------------------------------------------------------
def _string(b: RuleBuilder, s: dict[str, Any], ptr: str, hint: str) -> str:
    lengths = {"minLength", "maxLength"} & s.keys()
    if "pattern" in s and ("format" in s or lengths):
        raise b.unsupported(f"'pattern' together with '{'format' if 'format' in s else sorted(lengths)[0]}'", ptr)
    if "pattern" in s:
        if not isinstance(s["pattern"], str):
            raise b.fail("'pattern' must be a string", ptr)
        try:
            inner = pattern_gbnf(s["pattern"])
        except PatternError as exc:
            raise b.unsupported(str(exc), pointer(ptr, "pattern")) from None
        return b.add(hint, f"{_QUOTE} {inner} {_QUOTE}")
    if "format" in s:
        fmt = s["format"]
        if fmt not in FORMATS:
            raise b.unsupported(f"'format' {fmt!r:.40} (supported: {', '.join(FORMATS)})", ptr)
        rule, shortest, longest = FORMATS[fmt]
        lo, hi = _count(b, s, "minLength", ptr) or 0, _count(b, s, "maxLength", ptr)
        if lo > shortest or (hi is not None and hi < longest):  # else every value the rule makes fits
            raise b.unsupported(
                f"'format' {fmt!r} with 'minLength' above {shortest} or 'maxLength' below {longest}", ptr
            )
        return b.add(hint, f"{_QUOTE} {b.use(rule)} {_QUOTE}")
    if lengths:
        lo, hi = _bounds(b, s, "minLength", "maxLength", ptr)
        return b.add(hint, f"{_QUOTE} {repeat(b.use('char'), lo, hi)} {_QUOTE}")
    return b.use("string")


# ---- numbers ------------------------------------------------------------------------------
def _bound(b: RuleBuilder, s: dict[str, Any], key: str, ptr: str) -> float | int | None:
    v: object = s.get(key)
    if v is None:
        return None
    if type(v) is bool and key.startswith("exclusive"):
        raise b.unsupported(f"a boolean '{key}' (draft 4; use a number)", ptr)
    if not (type(v) is int or type(v) is float) or not math.isfinite(v):
        raise b.fail(f"'{key}' must be a number", ptr)  # a bool too
    return v


def _number(b: RuleBuilder, s: dict[str, Any], t: str, ptr: str, hint: str) -> str:
    mn, mx = _bound(b, s, "minimum", ptr), _bound(b, s, "maximum", ptr)
    xmn, xmx = _bound(b, s, "exclusiveMinimum", ptr), _bound(b, s, "exclusiveMaximum", ptr)
    fmt = s.get("format")
    if fmt is not None and not (t == "integer" and fmt in INT_FORMATS or fmt in NUMBER_FORMATS):
        raise b.unsupported(f"'format' {fmt!r:.40} on type {t}", ptr)
    if fmt in INT_FORMATS:  # the format's range, as bounds
        int_lo, int_hi = INT_FORMATS[fmt]
        mn, mx = max(int_lo, mn if mn is not None else int_lo), min(int_hi, mx if mx is not None else int_hi)
    if mn is None and mx is None and xmn is None and xmx is None:
        return b.use(t)
    # the integers k with every bound satisfied
    los = [math.ceil(mn)] if mn is not None else []
    los += [math.floor(xmn) + 1] if xmn is not None else []
    his = [math.floor(mx)] if mx is not None else []
    his += [math.ceil(xmx) - 1] if xmx is not None else []
    lo, hi = (max(los) if los else None), (min(his) if his else None)
    # a bound beyond what unbounded generation writes (16 digits) is clamped to it: sound, and the
    # grammar stays small for bounds like 1e300
    if lo is not None and lo < -_BIG and (hi is None or hi > -_BIG):
        lo = -_BIG + 1
    if hi is not None and hi > _BIG and (lo is None or lo < _BIG):
        hi = _BIG - 1
    alts = []
    if lo is None or hi is None or lo <= hi:
        alts.append(int_range(lo, hi))
    if t == "number":
        # k.ddd lies in [k, k+1): k >= every lower bound (k > an exclusive one), k+1 <= every upper
        flo = max(lo if lo is not None else 0, 0)
        fhis = [math.floor(x) - 1 for x in (mx, xmx) if x is not None]
        fhi = min(fhis) if fhis else None
        fhi = None if fhi is not None and fhi > _BIG else fhi
        if fhi is None or flo <= fhi:
            alts.append(f'( {int_range(flo, fhi)} ) "." [0-9]{{1,{MAX_DIGITS}}}')
        # an integral exclusive minimum k (e.g. 0): k.ddd with a non-zero fraction is above it
        if xmn is not None and float(xmn).is_integer() and 0 <= xmn < _BIG and (mn is None or mn <= xmn):
            k = int(xmn)
            if fhi is None or k <= fhi:
                alts.append(f'"{k}" "." [0-9]{{0,{MAX_DIGITS - 1}}} [1-9]')
    if not alts:
        raise b.unsupported(f"a '{t}' range with no integer in it", ptr)
    return b.add(hint, " | ".join(f"( {a} )" for a in alts) if len(alts) > 1 else alts[0])


# ---- objects ------------------------------------------------------------------------------
def _object(b: RuleBuilder, s: dict[str, Any], ptr: str, hint: str, depth: int) -> str:
    props = s.get("properties", {})
    if not isinstance(props, dict):
        raise b.fail("'properties' must be an object", ptr)
    required = s.get("required", [])
    if not isinstance(required, list) or any(not isinstance(r, str) for r in required):
        raise b.fail("'required' must be an array of strings", ptr)
    addl = s.get("additionalProperties")
    if addl is not None and not isinstance(addl, (bool, dict)):
        raise b.fail("'additionalProperties' must be a boolean or a schema", ptr)
    ws = b.use("ws")
    if not props and not required:
        if addl is False:
            return b.add(hint, f'"{{" {ws} "}}"')
        if addl is None or addl is True:
            return b.use("object")
        value = b.visit_child(addl, pointer(ptr, "additionalProperties"), f"{hint}-value", depth)
        kv = f'{b.use("string")} ws ":" ws {value}'
        return b.add(hint, f'"{{" ws ( {kv} ( {_SEP} {kv} )* ws )? "}}"')
    entries = [(name, sub, pointer(ptr, "properties", name)) for name, sub in props.items()]
    for r in dict.fromkeys(required):
        if r not in props:
            if addl is False:
                raise b.fail(
                    f"required property {r!r:.60} is not in 'properties' and 'additionalProperties' is false", ptr
                )
            entries.append((r, addl if isinstance(addl, dict) else True, pointer(ptr, "additionalProperties")))
    members = []
    for name, sub, where in entries:
        value = b.visit_child(sub, where, f"{hint}-{name}", depth)
        key = gbnf_literal(json.dumps(name, ensure_ascii=False))
        members.append((b.add(f"{hint}-{name}-kv", f'{key} ws ":" ws {value}'), name in required))
    if all(req for _, req in members):
        return b.add(hint, f'"{{" ws {f" {_SEP} ".join(kv for kv, _ in members)} ws "}}"')
    # first[i]: members i.. with at least one present, the first present one without a comma
    first: list[str] = [""] * len(members)
    for i in reversed(range(len(members))):
        kv, req = members[i]
        rest = " ".join(f"( {_SEP} {k} )" + ("" if r else "?") for k, r in members[i + 1 :])
        body = f"{kv} {rest}".strip()
        if not req and i + 1 < len(members):
            body = f"{body} | {first[i + 1]}"
        first[i] = b.add(f"{hint}-from-{i}", body)
    if any(req for _, req in members):
        return b.add(hint, f'"{{" ws {first[0]} ws "}}"')
    return b.add(hint, f'"{{" ws ( {first[0]} ws )? "}}"')


# ---- arrays -------------------------------------------------------------------------------
def _array(b: RuleBuilder, s: dict[str, Any], ptr: str, hint: str, depth: int) -> str:
    items, prefix, prefix_key = s.get("items"), s.get("prefixItems"), "prefixItems"
    if isinstance(items, list):  # draft-4 tuple form
        if prefix is not None:
            raise b.unsupported("'items' as an array next to 'prefixItems'", ptr)
        prefix, items, prefix_key = items, None, "items"
    if prefix is not None and not isinstance(prefix, list):
        raise b.fail("'prefixItems' must be an array of schemas", ptr)
    if items is not None and not isinstance(items, (bool, dict)):
        raise b.fail("'items' must be a schema", ptr)
    lo_total, hi_total = _bounds(b, s, "minItems", "maxItems", ptr)
    prefix = prefix or []
    n_prefix = len(prefix) if hi_total is None else min(len(prefix), hi_total)
    lo = max(0, lo_total - n_prefix)
    hi = None if hi_total is None else hi_total - n_prefix
    if prefix and items is None:
        hi = lo  # a tuple: extra items only as many as minItems needs
    if items is False:
        if lo > 0:
            raise b.fail("'minItems' needs more items than 'prefixItems' with 'items': false allow", ptr)
        hi = 0
    if not prefix and items in (None, True) and (lo, hi) == (0, None):
        return b.use("array")
    elems = [
        b.visit_child(p, pointer(ptr, prefix_key, i), f"{hint}-{i}", depth) for i, p in enumerate(prefix[:n_prefix])
    ]
    x = None
    if hi is None or hi > 0:
        x = b.visit_child(True if items is None else items, pointer(ptr, "items"), f"{hint}-item", depth)
    if elems:
        tail = repeat(f"{_SEP} {x}", lo, hi) if x else ""
        return b.add(hint, f'"[" ws {f" {_SEP} ".join(elems)} {tail} ws "]"')
    if x is None:
        return b.add(hint, '"[" ws "]"')
    more = repeat(f"{_SEP} {x}", max(lo - 1, 0), None if hi is None else hi - 1)
    if lo >= 1:
        return b.add(hint, f'"[" ws {x} {more} ws "]"')
    return b.add(hint, f'"[" ws ( {x} {more} ws )? "]"')
