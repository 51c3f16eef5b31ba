"""A :class:`ResponsesCall` -> the chat :class:`GenerationRequest` that serves it (pure).

Tools and text formats become grammars exactly as on ``/v1/chat/completions``
(:mod:`hydra_node.openai.chat_parse`): ``tool_choice`` ``auto`` gets the lazy tool-call
grammar (free text until the model writes the trigger, then a call matching a tool's schema),
``required`` or a named function the full grammar (``parallel_tool_calls: false`` allows one
call), ``none`` no grammar (the tools are still shown to the model). ``text.format``
``json_object``/``json_schema`` constrains the text to JSON (matching the schema). With both a
JSON format and ``tool_choice`` ``auto`` (an agent with an output type and tools), the answer is
either calls or the JSON: the two grammars are merged (:func:`either_grammar`) and the grammar
is not lazy. With ``required`` or a named function the answer is a call, so the tools grammar
alone applies.

``reasoning.effort`` becomes the reasoning fields for the model (:func:`hydra_node.api.reasoning.effort_fields`:
a thinking switch and budget; refused, naming the model, on a model that does not reason), except
``none``, which asks for no reasoning and is accepted on any model (it always was here).
"""

from __future__ import annotations

import re

from hydra_node.grammar import constraints as grammar  # built on the API node, enforced by the host's sampler
from hydra_node.grammar.terms import PRIMITIVES
from hydra_node.api.errors import bad
from hydra_node.api.reasoning import effort_fields
from hydra_node.responses.request import ResponsesCall
from hydra_node.inference import NO_CAPS, GenerationRequest, InvalidRequest, ModelCaps

__all__ = ["generation_request", "reasoning_fields"]


def _format_grammar(fmt: dict) -> str:
    if fmt["type"] == "text":
        return ""
    if fmt["type"] == "json_object":
        return grammar.json_object_grammar()
    return grammar.json_schema_grammar(fmt["schema"], param="text.format.schema")


def reasoning_fields(call: ResponsesCall, caps: ModelCaps) -> dict:
    """The request fields of ``reasoning.effort`` for a model that can do ``caps``."""
    if call.reasoning_effort == "none" and not caps.reasons:
        return {}  # no reasoning asked of a model that does none
    return effort_fields(caps, call.model, call.reasoning_effort, param="reasoning.effort")


def generation_request(
    call: ResponsesCall, request_id: str, session: str = "", caps: ModelCaps = NO_CAPS
) -> GenerationRequest:
    """The generation for ``call`` on a model that can do ``caps``. Raises :class:`ApiError` (400)
    naming what cannot be served."""
    fields: dict = reasoning_fields(call, caps)
    may_call = bool(call.tools) and call.tool_choice != "none"
    try:
        fmt_grammar = _format_grammar(call.text_format)
        if may_call:
            fields["grammar"] = grammar.tool_call_grammar(
                call.tools, name=call.tool_name or None, parallel=call.parallel_tool_calls
            )
            if call.tool_choice == "auto" and fmt_grammar:
                fields["grammar"] = either_grammar(fields["grammar"], fmt_grammar)
            elif call.tool_choice == "auto":
                fields["grammar_triggers"] = (grammar.TOOL_CALL_TRIGGER,)
        elif fmt_grammar:
            fields["grammar"] = fmt_grammar
        return GenerationRequest(
            model=call.model,
            kind="chat",
            messages=call.messages,
            images=call.images,
            max_tokens=call.max_output_tokens,
            temperature=call.temperature,
            top_p=call.top_p,
            request_id=request_id,
            session=session,
            tools=call.tools,
            tool_choice=call.tool_choice,
            tool_name=call.tool_name,
            parallel_tool_calls=call.parallel_tool_calls,
            logprobs=call.logprobs,
            top_logprobs=call.top_logprobs,
            **fields,
        )
    except InvalidRequest as exc:
        param = _param(exc.param)
        raise bad(exc.message.replace(exc.param or "\0", param or ""), param) from None


#: A GBNF token: a quoted literal, a character class, a repetition count, a name, or one character.
_GBNF_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]|\{[0-9,]*\}|[A-Za-z0-9_-]+|.', re.DOTALL)


def _rules(text: str) -> dict[str, str]:
    rules = {}
    for line in text.splitlines():
        name, sep, body = line.partition(" ::= ")
        if line.strip() and not sep:
            raise InvalidRequest(f"cannot merge grammars: line {line!r:.60} is not a rule", "text.format")
        if sep:
            rules[name] = body
    return rules


def either_grammar(first: str, second: str) -> str:
    """One GBNF grammar (root ``root``) matching what ``first`` or ``second`` matches. Both are
    grammars of :mod:`hydra_node.grammar.constraints` (one rule per line); the rules of ``second`` that
    are not shared primitives (``ws``, ``string``, ...) are renamed with an ``alt-`` prefix."""
    a, b = _rules(first), _rules(second)
    renamed = {n for n in b if n not in PRIMITIVES}

    def rename(body: str) -> str:
        return "".join("alt-" + t if t in renamed else t for t in _GBNF_TOKEN.findall(body))

    merged = {n: body for n, body in a.items() if n != "root"}
    for n, body in b.items():
        if n == "root":
            continue
        name = "alt-" + n if n in renamed else n
        if merged.get(name, body) != body:
            raise InvalidRequest("the tools and the text format need grammar rules of the same name", "text.format")
        merged[name] = rename(body)
    lines = [f"root ::= ( {a['root']} ) | ( {rename(b['root'])} )"] + [f"{n} ::= {v}" for n, v in merged.items()]
    return "\n".join(lines) + "\n"


_PARAMS = {"max_tokens": "max_output_tokens", "messages": "input", "response_format": "text.format"}


def _param(param: str | None) -> str | None:
    """The Responses name of a field the chat contract names (``max_tokens`` -> ``max_output_tokens``,
    ``tools[0].function.parameters`` -> ``tools[0].parameters``)."""
    if not param:
        return param
    return _PARAMS.get(param, re.sub(r"^(tools\[\d+\])\.function\.", r"\1.", param))
