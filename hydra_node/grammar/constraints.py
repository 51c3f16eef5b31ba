"""GBNF grammars the API node builds for a request (pure): ``response_format`` and tool calls.

The grammar travels in ``GenerationRequest.grammar`` (root rule ``root``), with
``grammar_triggers`` for a lazy grammar that starts at a trigger word; the host's sampler
enforces it (``hydra_node.runtime.child.engine.sampler``). Nothing here loads llama.cpp.

* :func:`json_schema_grammar`: one JSON value that validates against a schema
  (``response_format: {"type": "json_schema", ...}``). The subset of JSON Schema that is
  honoured is documented in ``hydra_node.grammar.schema``; anything else is an
  :class:`InvalidRequest` (400) naming the construct and its JSON pointer, e.g.
  ``response_format.json_schema.schema: 'not' at #/properties/x is not supported``.
* :func:`json_object_grammar`: any JSON object (``response_format: {"type": "json_object"}``).
* :func:`tool_call_grammar`: ``<tool_call>{"name": "NAME", "arguments": {...}}</tool_call>``
  blocks (one, or one or more back to back when parallel), the arguments matching that function's
  ``parameters`` schema; with ``tool_choice`` ``auto`` the API node makes it lazy with
  :data:`TOOL_CALL_TRIGGER`, so the model may answer in prose or start a call.

Whitespace between JSON tokens is bounded everywhere (one space, or one newline and a little
indentation): a small model cannot loop on whitespace.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from hydra_node.grammar.terms import gbnf_literal
from hydra_node.grammar.schema import GrammarBuilder
from hydra_node.grammar.toolcalls import CLOSE_TAG, OPEN_TAG
from hydra_node.inference import MAX_GRAMMAR_CHARS, InvalidRequest, ToolSpec

__all__ = ["TOOL_CALL_TRIGGER", "json_schema_grammar", "json_object_grammar", "tool_call_grammar"]

#: The lazy trigger word for tool_choice "auto": the grammar applies from this word on.
TOOL_CALL_TRIGGER = OPEN_TAG

#: Keywords whose presence at a function's top level means the schema is not a plain object
#: description (no ``"type": "object"`` is implied next to them).
_COMBINATORS = ("$ref", "anyOf", "oneOf", "allOf", "enum", "const")
_NAME_KEY, _ARGS_KEY = gbnf_literal('"name"'), gbnf_literal('"arguments"')


def _finish(b: GrammarBuilder, root: str, param: str) -> str:
    text = b.text(root)
    if len(text) > MAX_GRAMMAR_CHARS:
        raise InvalidRequest(f"{param}: the schema needs a grammar larger than {MAX_GRAMMAR_CHARS} characters", param)
    return text


def json_schema_grammar(schema: dict[str, Any], *, param: str) -> str:
    """GBNF (root rule ``root``) for one JSON value that validates against ``schema``.

    ``param`` names where the schema came from (e.g. ``response_format.json_schema.schema``);
    it starts every error message and is the error's ``param``."""
    if not isinstance(schema, (dict, bool)):
        raise InvalidRequest(f"{param}: must be a JSON schema (an object or a boolean)", param)
    b = GrammarBuilder(param)
    return _finish(b, b.schema(schema, "value"), param)


def json_object_grammar() -> str:
    """GBNF for any JSON object."""
    b = GrammarBuilder("response_format")
    return _finish(b, b.use("object"), "response_format")


def _arguments_schema(tool: ToolSpec, param: str) -> dict[str, Any]:
    try:
        schema = json.loads(tool.parameters)
    except ValueError:
        raise InvalidRequest(f"{param}: not valid JSON", param) from None
    if schema is None:
        schema = {}
    if not isinstance(schema, dict):
        raise InvalidRequest(f"{param}: must be a JSON schema object", param)
    if not any(k in schema for k in _COMBINATORS):
        t = schema.get("type", "object")
        if t != "object":
            raise InvalidRequest(
                f"{param}: a function's parameters must be an object schema, not type {t!r:.40}", param
            )
        schema = {**schema, "type": "object"}
    return schema


def tool_call_grammar(tools: Sequence[ToolSpec], *, name: str | None, parallel: bool) -> str:
    """GBNF (root rule ``root``): one, or if ``parallel`` one or more,
    ``<tool_call>{"name": "<n>", "arguments": <args>}</tool_call>`` blocks, where ``<args>``
    matches that function's ``parameters`` schema; with ``name`` exactly one call of that function
    (OpenAI: a named ``tool_choice`` forces one call), whatever ``parallel`` says."""
    if not tools:
        raise InvalidRequest("'tools' must name at least one function", "tools")
    if name is not None and name not in {t.name for t in tools}:
        raise InvalidRequest(f"'tool_choice' names {name!r:.80}, which is not in 'tools'", "tool_choice")
    b = GrammarBuilder("tools")
    calls = []
    for i, tool in enumerate(tools):
        if name is not None and tool.name != name:
            continue
        param = f"tools[{i}].function.parameters"
        b.param = param
        args = b.schema(_arguments_schema(tool, param), f"{tool.name}-arguments")
        name_lit = gbnf_literal(json.dumps(tool.name, ensure_ascii=False))
        calls.append(
            b.add(
                f"{tool.name}-call",
                f'"{{" ws {_NAME_KEY} ws ":" ws {name_lit} ws "," ws {_ARGS_KEY} ws ":" ws {args} ws "}}"',
            )
        )
    call = b.add("tool-call", f'{gbnf_literal(OPEN_TAG)} ws ( {" | ".join(calls)} ) ws {gbnf_literal(CLOSE_TAG)}')
    # parallel blocks follow each other directly: with a newline allowed between them, the bundled
    # model (greedy) writes one call after another until max_tokens; without, it stops
    return _finish(b, f"{call}+" if parallel and name is None else call, "tools")
