"""JSON Schema -> GBNF (pure): every generated value validates against the schema.

The converter honours a documented subset of JSON Schema and refuses everything else (an
:class:`InvalidRequest` naming the keyword and its JSON pointer): no keyword is ever silently
ignored, no ``$ref`` is ever fetched. It is sound, not complete: it may generate fewer values
than the schema allows (no undeclared object properties; a string ``pattern`` is matched whole;
``maxLength``/``maxItems`` above :data:`MAX_REPEAT` are capped there), never more.

Supported keywords (:data:`KEYWORDS`):

* ``type`` (a name or a list), ``enum``, ``const``;
* ``anyOf``; ``oneOf`` (generated as ``anyOf``: the alternatives of a ``oneOf`` are expected to be
  disjoint, e.g. by a discriminating ``const``); ``allOf`` (one subschema, or several object
  subschemas whose ``properties``/``required`` are merged);
* ``$ref`` to a local ``#...`` JSON pointer (``#/$defs/X``, ``#/definitions/X``, ``#``), recursion
  included; ``$defs``/``definitions`` as their containers;
* objects: ``properties``, ``required``, ``additionalProperties`` (false, true or a schema: the
  latter two generate extra properties only when there are no ``properties``);
* arrays: ``items`` (a schema, ``false``, or a list as draft-4 tuples), ``prefixItems``,
  ``minItems``, ``maxItems``;
* strings: ``minLength``, ``maxLength``, ``pattern`` (see :mod:`.regex`; not with the others),
  ``format`` (date, time, date-time, uuid, email, hostname, ipv4, uri: sound subsets of bounded
  length, see ``gbnf_terms.FORMATS``; with ``minLength``/``maxLength`` only when every value the
  format rule makes fits them, e.g. pydantic's ``HttpUrl``);
* numbers: ``minimum``, ``maximum``, ``exclusiveMinimum``, ``exclusiveMaximum`` (numbers); on
  ``number`` the generated values are integers in range, or ``k.ddd`` with ``k >= 0`` where
  ``[k, k+1)`` lies in range (or ``k`` is an exclusive minimum and the fraction is not zero);
  ``format`` int32/int64 on ``integer`` (their ranges), float/double (nothing to constrain);
* annotations (no constraint): :data:`ANNOTATIONS`.
"""

from __future__ import annotations

import json
from typing import Any

from hydra_node.grammar.terms import PRIMITIVES, gbnf_literal
from hydra_node.grammar.schema_types import ANNOTATIONS, FAMILY, of_type, pointer, typed_rule
from hydra_node.inference import MAX_GRAMMAR_CHARS, InvalidRequest

__all__ = ["KEYWORDS", "MAX_DEPTH", "GrammarBuilder"]

#: Every keyword the converter honours (any other is refused).
KEYWORDS = ANNOTATIONS.union(*FAMILY.values(), {"type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref"})
#: Deepest schema nesting followed.
MAX_DEPTH = 64


class GrammarBuilder:
    """Accumulates GBNF rules; :meth:`schema` adds the rules of one schema and returns its rule."""

    def __init__(self, param: str):
        self.param = param
        self.rules: dict[str, str] = {}
        self._refs: dict[tuple[int, str], str] = {}  # (which root, pointer) -> rule name
        self._root: object = None
        self._roots = 0
        self._size = 0
        self._ws = self.use("ws")

    # ---- rules -----------------------------------------------------------------------------
    def use(self, name: str) -> str:
        """A primitive rule by name (added with its dependencies on first use)."""
        if name not in self.rules:
            body, deps = PRIMITIVES[name]
            self.rules[name] = body
            for d in deps:
                self.use(d)
        return name

    def add(self, hint: str, body: str) -> str:
        """A new rule named after ``hint`` (made unique) with ``body``."""
        base = "".join(c if c.isascii() and c.isalnum() else "-" for c in hint)[:40].strip("-").lower() or "r"
        name, n = base, 1
        while name in self.rules or name in PRIMITIVES or name == "root":
            name, n = f"{base}-{n}", n + 1
        self._grow(len(name) + len(body))
        self.rules[name] = body
        return name

    def _grow(self, chars: int) -> None:
        """Count grammar text as it is built, so a schema cannot make us build a huge one."""
        self._size += chars + 6
        if self._size > MAX_GRAMMAR_CHARS:
            raise InvalidRequest(
                f"{self.param}: the schema needs a grammar larger than {MAX_GRAMMAR_CHARS} characters", self.param
            )

    def text(self, root_body: str) -> str:
        """The grammar: ``root ::= root_body`` then every rule."""
        lines = [f"root ::= {root_body}"] + [f"{k} ::= {v}" for k, v in self.rules.items()]
        return "\n".join(lines) + "\n"

    def fail(self, what: str, ptr: str) -> InvalidRequest:
        return InvalidRequest(f"{self.param}: {what} at {ptr}", self.param)

    def unsupported(self, what: str, ptr: str) -> InvalidRequest:
        return InvalidRequest(f"{self.param}: {what} at {ptr} is not supported", self.param)

    # ---- schemas ---------------------------------------------------------------------------
    def schema(self, schema: object, hint: str = "root") -> str:
        """A GBNF expression for values of ``schema`` (its own root for ``$ref``)."""
        self._root = schema
        self._roots += 1
        return self._visit(schema, "#", hint, frozenset(), 0)

    def _visit(self, s: object, ptr: str, hint: str, guard: frozenset[str], depth: int) -> str:
        """``guard``: the ``$ref`` targets entered since the last character a rule consumes (a
        reference back to one of them would be left recursion, which llama.cpp refuses)."""
        if depth > MAX_DEPTH:
            raise self.unsupported(f"nesting deeper than {MAX_DEPTH}", ptr)
        if s is True:
            return self.use("value")
        if s is False:
            raise self.fail("the schema 'false' can never be satisfied", ptr)
        if not isinstance(s, dict):
            raise self.fail("a schema must be an object or a boolean", ptr)
        for key in s:
            if key not in KEYWORDS:
                raise self.unsupported(f"'{key:.60}'", ptr)
        constraints = {k for k in s if k not in ANNOTATIONS}
        if "$ref" in s:
            others = sorted(constraints - {"$ref"})
            if others:
                raise self.unsupported(f"'$ref' next to '{others[0]}'", ptr)
            return self._ref(s["$ref"], ptr, guard, depth)
        if "allOf" in s:
            return self._all_of(s, ptr, hint, guard, depth)
        for key in ("anyOf", "oneOf"):
            if key in s:
                others = sorted(constraints - {key})
                if others:
                    raise self.unsupported(f"'{key}' next to '{others[0]}'", ptr)
                alts = s[key]
                if not isinstance(alts, list) or not alts:
                    raise self.fail(f"'{key}' must be a non-empty array", ptr)
                exprs = [
                    self._visit(a, pointer(ptr, key, i), f"{hint}-{i}", guard, depth + 1) for i, a in enumerate(alts)
                ]
                return self.add(hint, " | ".join(exprs))
        types = self._types(s, ptr)
        if "const" in s or "enum" in s:
            return self._literals(s, ptr, hint, types)
        if types is None:
            return self.use("value")
        exprs = [self._typed(s, t, ptr, hint, depth) for t in types]
        return exprs[0] if len(exprs) == 1 else self.add(hint, " | ".join(exprs))

    def _types(self, s: dict[str, Any], ptr: str) -> list[str] | None:
        """The types to generate (None: any JSON value); keywords that apply to none of the
        declared types are refused (they would be silently meaningless)."""
        t = s.get("type")
        if t is None:
            # ("format" says "string" here: a number format is honoured only with its "type")
            fams = [
                name
                for name in ("object", "array", "string", "number")
                if (FAMILY[name] - ({"format"} if name == "number" else set())) & s.keys()
            ]
            return fams or None
        types = [t] if isinstance(t, str) else t
        if not isinstance(types, list) or not types or any(x not in FAMILY for x in types):
            raise self.fail(f"'type' must be one of {', '.join(FAMILY)} or a list of them, not {t!r:.60}", ptr)
        for key in s.keys() - ANNOTATIONS - {"type", "enum", "const"}:
            if not any(key in FAMILY[x] for x in types):
                raise self.unsupported(f"'{key}' on type {'/'.join(types)}", ptr)
        return list(dict.fromkeys(types))

    def _ref(self, ref: object, ptr: str, guard: frozenset[str], depth: int) -> str:
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise self.unsupported(f"'$ref' to {ref!r:.80} (only local '#/...' references)", ptr)
        key = (self._roots, ref)
        if ref in guard:
            raise self.unsupported(f"'$ref' {ref!r:.80} that refers back to itself before any JSON text", ptr)
        if key in self._refs:
            return self._refs[key]
        target = self._resolve(ref, ptr)
        name = self.add(ref.rsplit("/", 1)[-1] or "ref", "")
        self._refs[key] = name
        body = self._visit(target, ref, name, guard | {ref}, depth + 1)
        self._grow(len(body))
        self.rules[name] = body
        return name

    def _resolve(self, ref: str, ptr: str) -> object:
        node = self._root
        for raw in ref[1:].split("/")[1:] if ref != "#" else []:
            part = raw.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                raise self.fail(f"'$ref' {ref!r:.80} points to nothing", ptr)
        if ref != "#" and not ref.startswith("#/"):
            raise self.unsupported(f"'$ref' {ref!r:.80} (anchors; use a '#/...' pointer)", ptr)
        return node

    def _all_of(self, s: dict[str, Any], ptr: str, hint: str, guard: frozenset[str], depth: int) -> str:
        subs = s["allOf"]
        if not isinstance(subs, list) or not subs:
            raise self.fail("'allOf' must be a non-empty array", ptr)
        others = {k for k in s if k not in ANNOTATIONS} - {"allOf"}
        if len(subs) == 1 and not others:
            return self._visit(subs[0], pointer(ptr, "allOf", 0), hint, guard, depth + 1)
        merged: dict[str, Any] = {"type": "object", "properties": {}, "required": []}
        parts = [(ptr, {k: s[k] for k in others})] + [(pointer(ptr, "allOf", i), x) for i, x in enumerate(subs)]
        for where, part in parts:
            seen: set[str] = set()
            while isinstance(part, dict) and "$ref" in part and set(part) - ANNOTATIONS == {"$ref"}:
                if part["$ref"] in seen or not isinstance(part["$ref"], str) or not part["$ref"].startswith("#"):
                    raise self.unsupported("this 'allOf' (a cyclic or non-local '$ref')", where)
                seen.add(part["$ref"])
                where, part = part["$ref"], self._resolve(part["$ref"], where)
            if not isinstance(part, dict):
                raise self.unsupported("'allOf' of a boolean schema", where)
            bad = sorted(set(part) - ANNOTATIONS - {"type", "properties", "required"})
            if bad or part.get("type", "object") != "object":
                raise self.unsupported(
                    f"'allOf' merging '{(bad or ['type'])[0]}' (only object properties merge)", where
                )
            for name, sub in (part.get("properties") or {}).items():
                if name in merged["properties"] and merged["properties"][name] != sub:
                    raise self.unsupported(f"'allOf' defining property {name!r:.60} twice", where)
                merged["properties"][name] = sub
            merged["required"] += [r for r in part.get("required") or [] if r not in merged["required"]]
        return self._visit(merged, ptr, hint, guard, depth + 1)

    def _literals(self, s: dict[str, Any], ptr: str, hint: str, types: list[str] | None) -> str:
        others = sorted(set(s) - ANNOTATIONS - {"type", "enum", "const"})
        if others or ("enum" in s and "const" in s):
            raise self.unsupported(f"'{'const' if 'const' in s else 'enum'}' next to '{(others or ['enum'])[0]}'", ptr)
        values = [s["const"]] if "const" in s else s["enum"]
        if not isinstance(values, list) or not values:
            raise self.fail("'enum' must be a non-empty array", ptr)
        if types is not None:
            values = [v for v in values if any(of_type(v, t) for t in types)]
            if not values:
                raise self.fail("no value of 'enum'/'const' has the schema's 'type'", ptr)
        alts = []
        for v in values:
            try:
                alts.append(gbnf_literal(json.dumps(v, ensure_ascii=False, allow_nan=False)))
            except (ValueError, TypeError):
                raise self.fail(f"'enum'/'const' value {v!r:.40} is not JSON", ptr) from None
        return self.add(hint, " | ".join(dict.fromkeys(alts)))

    def _typed(self, s: dict[str, Any], t: str, ptr: str, hint: str, depth: int) -> str:
        return typed_rule(self, s, t, ptr, hint, depth)

    def visit_child(self, s: object, ptr: str, hint: str, depth: int) -> str:
        """A subschema reached after consuming text (inside an object or array): no left recursion."""
        return self._visit(s, ptr, hint, frozenset(), depth + 1)
