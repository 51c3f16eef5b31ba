"""Test helpers: llama.cpp's own grammar engine as an oracle, and a validator for the JSON Schema
subset that ``hydra_node.grammar.schema`` honours (written from the spec, independent of it)."""

from __future__ import annotations

import ctypes
import math
import re
from pathlib import Path

import llama_cpp


class GrammarOracle:
    """Whether llama.cpp parses a GBNF grammar, and whether it accepts a whole text (token by
    token through the real grammar sampler, then end of generation)."""

    def __init__(self, model_path: Path):
        llama_cpp.llama_backend_init()
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        self._model = llama_cpp.llama_model_load_from_file(str(model_path).encode(), params)
        assert self._model, "could not load the model's vocabulary"
        self.vocab = llama_cpp.llama_model_get_vocab(self._model)
        self._eos = llama_cpp.llama_vocab_eos(self.vocab)

    def close(self) -> None:
        llama_cpp.llama_model_free(self._model)

    def parses(self, gbnf: str) -> bool:
        smpl = llama_cpp.llama_sampler_init_grammar(self.vocab, gbnf.encode(), b"root")
        if not smpl:
            return False
        llama_cpp.llama_sampler_free(smpl)
        return True

    def tokenize(self, text: str) -> list[int]:
        data = text.encode()
        buf = (llama_cpp.llama_token * (len(data) + 8))()
        n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, len(buf), False, False)
        assert n >= 0
        return list(buf[:n])

    def _allowed(self, smpl, token: int) -> bool:
        cand = (llama_cpp.llama_token_data * 1)(llama_cpp.llama_token_data(token, 0.0, 0.0))
        arr = llama_cpp.llama_token_data_array(cand, 1, -1, False)
        llama_cpp.llama_sampler_apply(smpl, ctypes.byref(arr))
        return math.isfinite(cand[0].logit)

    def accepts(self, gbnf: str, text: str) -> bool:
        smpl = llama_cpp.llama_sampler_init_grammar(self.vocab, gbnf.encode(), b"root")
        assert smpl, "llama.cpp refused the grammar"
        try:
            for tok in self.tokenize(text):
                if not self._allowed(smpl, tok):
                    return False
                llama_cpp.llama_sampler_accept(smpl, tok)
            return self._allowed(smpl, self._eos)
        finally:
            llama_cpp.llama_sampler_free(smpl)


_FORMATS = {
    "date": r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])",
    "time": r"([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d+)?(Z|[+-]([01]\d|2[0-3]):[0-5]\d)",
    "uuid": r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
}
_FORMATS["date-time"] = _FORMATS["date"] + "T" + _FORMATS["time"]
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_FORMATS["hostname"] = rf"{_LABEL}(\.{_LABEL})*"
_FORMATS["email"] = rf"[A-Za-z0-9!#$%&'*+/=?^_`{{|}}~-]+(\.[A-Za-z0-9!#$%&'*+/=?^_`{{|}}~-]+)*@{_LABEL}(\.{_LABEL})+"
_FORMATS["ipv4"] = r"((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_FORMATS["uri"] = r"[A-Za-z][A-Za-z0-9+.-]*:[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=%]*"
_INT_FORMATS = {"int32": 2**31, "int64": 2**63}


def _is_type(v: object, t: str) -> bool:
    if t == "integer":
        return type(v) is int or (type(v) is float and v.is_integer())
    if t == "number":
        return type(v) in (int, float)
    return {
        "null": v is None,
        "boolean": type(v) is bool,
        "string": type(v) is str,
        "object": type(v) is dict,
        "array": type(v) is list,
    }[t]


def _same(a: object, b: object) -> bool:
    return (type(a) is bool) == (type(b) is bool) and a == b


def validate(v: object, s: object, root: object = None) -> bool:
    """``v`` satisfies ``s`` (the supported subset; JSON Schema 2020-12 semantics)."""
    root = s if root is None else root
    if s is True or s is False:
        return s
    if "$ref" in s:
        node = root
        for part in s["$ref"][2:].split("/") if s["$ref"] != "#" else []:
            node = node[part.replace("~1", "/").replace("~0", "~")]
        if not validate(v, node, root):
            return False
    checks = [
        ("type", lambda t: any(_is_type(v, x) for x in ([t] if isinstance(t, str) else t))),
        ("enum", lambda e: any(_same(v, x) for x in e)),
        ("const", lambda c: _same(v, c)),
        ("anyOf", lambda alts: any(validate(v, a, root) for a in alts)),
        ("oneOf", lambda alts: sum(validate(v, a, root) for a in alts) == 1),
        ("allOf", lambda alts: all(validate(v, a, root) for a in alts)),
    ]
    if not all(fn(s[k]) for k, fn in checks if k in s):
        return False
    if type(v) is dict:
        props = s.get("properties", {})
        if any(r not in v for r in s.get("required", [])):
            return False
        for k, x in v.items():
            if k in props:
                ok = validate(x, props[k], root)
            else:
                ok = validate(x, s.get("additionalProperties", True), root)
            if not ok:
                return False
    if type(v) is list:
        items = s.get("items")
        prefix = s.get("prefixItems") or (items if isinstance(items, list) else [])
        rest = None if isinstance(items, list) else items
        if not s.get("minItems", 0) <= len(v) <= s.get("maxItems", math.inf):
            return False
        for i, x in enumerate(v):
            sub = prefix[i] if i < len(prefix) else (True if rest is None else rest)
            if not validate(x, sub, root):
                return False
    if type(v) is str:
        if not s.get("minLength", 0) <= len(v) <= s.get("maxLength", math.inf):
            return False
        if "pattern" in s and not re.search(re.sub(r"\(\?<(?![=!])", "(?P<", s["pattern"]), v):
            return False
        if "format" in s and not re.fullmatch(_FORMATS[s["format"]], v):
            return False
    if type(v) in (int, float) and s.get("format") in _INT_FORMATS:
        if not -_INT_FORMATS[s["format"]] <= v < _INT_FORMATS[s["format"]]:
            return False
    if type(v) in (int, float):
        if "minimum" in s and v < s["minimum"] or "maximum" in s and v > s["maximum"]:
            return False
        if "exclusiveMinimum" in s and v <= s["exclusiveMinimum"]:
            return False
        if "exclusiveMaximum" in s and v >= s["exclusiveMaximum"]:
            return False
    return True
