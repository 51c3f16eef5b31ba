"""A chat request as prompt text, rendered with the model's own chat template (pure).

The runner child turns ``GenerationRequest.to_wire()`` into prompt tokens; this module does
the text part, with no llama.cpp: :class:`ChatTemplate` compiles the GGUF
``tokenizer.chat_template`` once (Jinja2, sandboxed, with the same environment and variables
as llama-cpp-python's ``Jinja2ChatFormatter``, which follows llama.cpp and Transformers) and
probes what the template can do; :meth:`ChatTemplate.render` gives a :class:`RenderedPrompt`.

* A plain chat (no tools offered, no tool calls or results in the history) renders exactly as
  ``Jinja2ChatFormatter`` renders it, so prompts and prefix caches stay byte-identical.
* A template that supports tools (it uses ``tools`` and renders a tool offered to it) gets
  ``tools`` and the history in OpenAI's shapes; assistant call arguments as a dict or as JSON
  text, whichever the template renders as JSON. When the template's own tools prompt asks for
  another answer format (Llama 3.1's JSON, ...), the ``<tool_call>`` format is stated after it.
* Any other template gets the generic format (:mod:`hydra_node.runtime.child.tool_format`):
  the tools in a system message, calls as ``<tool_call>`` blocks in the assistant's text,
  results as ``<tool_response>`` blocks in a user message.
* Without a template at all: ChatML, as the runner always did.
* Reasoning models (docs/reasoning.md): ``thinking`` becomes the template variable
  ``enable_thinking`` and ``reasoning_effort`` the variable of that name (as llama-server's
  ``chat_template_kwargs``), each passed only when the request sets it; an assistant turn's
  ``reasoning`` is given to the template as ``reasoning_content`` (Qwen3 renders it, templates
  that do not read it drop it). :attr:`ChatTemplate.reasoning` is what :func:`detect` finds in
  the template; for such a template the rendered prompt also says where its output starts
  (:attr:`RenderedPrompt.reasoning`: after the generation prompt, which may open a think block).
* A final assistant message is continued (prefill, as llama-server does): the conversation is
  rendered without the generation prompt and cut right after that message's text, so that the
  model goes on from it and the answer is only the new text. A final message with tool calls
  is not continued (a new assistant turn follows it, as before); one whose text the template does
  not render as it is, or one without text, is refused (400).

The answer format is the same everywhere (docs/tool-calling.md):
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterable

import jinja2
import jinja2.ext
from jinja2 import meta
from jinja2.sandbox import ImmutableSandboxedEnvironment

from hydra_node.inference.capabilities import NO_CAPS, ModelCaps
from hydra_node.inference.errors import InvalidRequest
from hydra_node.inference.reasoning import detect
from hydra_node.inference.request import ChatMessage, ToolSpec
from hydra_node.runtime.child import tool_format

__all__ = ["InvalidPrompt", "ReasoningStart", "RenderedPrompt", "ChatTemplate", "render_chat", "completion_token_ids"]

_PROBE_TOOL = "hydra_probe_tool"
_PROBE_KEY = "hydra_probe_argument"
_PROBE_SYSTEM = "hydra_probe_system_text"


class InvalidPrompt(InvalidRequest):
    """The request cannot become a prompt (a token id outside the vocabulary, a history the
    template refuses, a tool whose parameters are not a JSON object): 400 ``invalid_prompt``."""

    code = "invalid_prompt"
    status = 400


@dataclass(frozen=True)
class ReasoningStart:
    """Where a reasoning chat's output starts: what the engine's splitter begins from
    (engine/reasoning_track.py; the runner puts it on the request map as ``_reasoning``)."""

    fmt: str  # "think" | "gpt-oss"
    #: the end of the prompt the output follows: the generation prompt (it may open a think
    #: block), or the continued final assistant message as rendered
    opening: str
    continuing: bool = False  # the prompt continues a final assistant message


@dataclass(frozen=True)
class RenderedPrompt:
    text: str
    #: the template wrote the special tokens (BOS) itself: tokenise without adding BOS
    added_special: bool
    #: a reasoning template's: where the output starts (None for other templates)
    reasoning: ReasoningStart | None = None
    #: the prompt continues a final assistant message (prefill)
    continuing: bool = False


class _IgnoreGenerationTags(jinja2.ext.Extension):
    """Pass-through for HuggingFace's ``{% generation %}`` tag (as llama-cpp-python does)."""

    tags = {"generation"}

    def parse(self, parser):
        parser.stream.skip(1)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """Transformers' ``tojson`` (non-ASCII kept, keys in order)."""
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str):
    raise InvalidPrompt(f"the model's chat template refused the conversation: {message}", "messages")


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class ChatTemplate:
    """A model's chat template, compiled once; ``source`` None means "the model has none" (ChatML)."""

    def __init__(self, source: str | None, *, bos_token: str = "", eos_token: str = "", reasoning_format: str = "auto"):
        """``reasoning_format``: "auto" (from the template) or a format that overrides it
        (:data:`hydra_node.inference.reasoning.REASONING_OVERRIDES`; "" = not a reasoning model)."""
        self.source = source or None
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._template = None
        self.supports_tools = False  # renders `tools` itself
        self.object_arguments = True  # wants an assistant call's arguments as a dict
        self.supports_system = True  # renders a system message's text
        self.native_format = False  # its tools prompt asks for <tool_call> blocks itself
        #: how the model reasons, as far as its template says (:func:`hydra_node.inference.reasoning.detect`)
        self.reasoning: ModelCaps = NO_CAPS
        if self.source is None:
            if reasoning_format not in ("auto", ""):
                self.reasoning = detect(None, override=reasoning_format)
            return
        env = ImmutableSandboxedEnvironment(
            loader=jinja2.BaseLoader(),
            trim_blocks=True,
            lstrip_blocks=True,
            extensions=[_IgnoreGenerationTags, jinja2.ext.loopcontrols],
        )
        env.filters["tojson"] = _tojson
        self._template = env.from_string(self.source)
        self._probe(env)
        self.reasoning = detect(self.source, render=self.generation_prompt, override=reasoning_format)

    # ---- what the template can do ------------------------------------------------------
    def _probe(self, env) -> None:
        user = {"role": "user", "content": "hello"}
        out = self._try_render([{"role": "system", "content": _PROBE_SYSTEM}, user])
        self.supports_system = out is not None and _PROBE_SYSTEM in out
        uses_tools = "tools" in meta.find_undeclared_variables(env.parse(self.source))
        if uses_tools:
            out = self._try_render(
                [user],
                tools=[tool_format.openai_tool(ToolSpec(_PROBE_TOOL, "probe", '{"type": "object", "properties": {}}'))],
            )
            self.supports_tools = out is not None and _PROBE_TOOL in out
            self.native_format = out is not None and self.supports_tools and "<tool_call>" in out
        if self.supports_tools:

            def with_arguments(arguments: Any) -> str | None:
                call = {"id": "call_0", "type": "function", "function": {"name": _PROBE_TOOL, "arguments": arguments}}
                return self._try_render(
                    [
                        user,
                        {"role": "assistant", "content": "", "tool_calls": [call]},
                        {"role": "tool", "tool_call_id": "call_0", "content": "1"},
                    ]
                )

            needle = f'"{_PROBE_KEY}":'
            as_text = with_arguments(json.dumps({_PROBE_KEY: 1}))
            as_dict = with_arguments({_PROBE_KEY: 1})
            text_ok, dict_ok = as_text is not None and needle in as_text, as_dict is not None and needle in as_dict
            # JSON text as the client sent it when the template prints it as JSON; else a dict
            self.object_arguments = dict_ok or not text_ok

    def _try_render(
        self, messages: list[dict], tools: list[dict] | None = None, extra: dict | None = None
    ) -> str | None:
        try:
            return self._render(messages, tools, None, extra=extra)
        except Exception:  # the template refused the probe: the capability is absent
            return None

    def generation_prompt(self, thinking: bool | None) -> str | None:
        """A one-message chat rendered with ``enable_thinking`` = ``thinking`` (None: not given),
        or None when the template refuses it: what :func:`detect` probes."""
        if self._template is None:
            return None
        extra = {} if thinking is None else {"enable_thinking": thinking}
        return self._try_render([{"role": "user", "content": "hello"}], extra=extra)

    def _render(
        self,
        messages: list[dict],
        tools: list[dict] | None,
        tool_choice: Any,
        *,
        generation: bool = True,
        extra: dict | None = None,
    ) -> str:
        assert self._template is not None  # only a source with a template renders
        return self._template.render(
            messages=messages,
            eos_token=self.eos_token,
            bos_token=self.bos_token,
            raise_exception=_raise_exception,
            add_generation_prompt=generation,
            functions=None,
            function_call=None,
            tools=tools,
            tool_choice=tool_choice,
            strftime_now=_strftime_now,
            **(extra or {}),
        )

    # ---- rendering ----------------------------------------------------------------------
    def render(self, req: dict) -> RenderedPrompt:
        """The prompt for a chat request given as ``GenerationRequest.to_wire()``; a request that
        cannot become one raises :class:`InvalidPrompt`."""
        try:
            return self._render_request(req)
        except InvalidPrompt:
            raise
        except InvalidRequest as exc:
            raise InvalidPrompt(str(exc), exc.param) from None

    def _render_request(self, req: dict) -> RenderedPrompt:
        messages = [ChatMessage.from_wire(m) for m in req.get("messages") or ()]
        tools = [ToolSpec.from_wire(t) for t in req.get("tools") or ()]
        if not messages:
            raise InvalidPrompt("a chat needs at least one message", "messages")
        choice = req.get("tool_choice", "auto")
        offered = tools if choice != "none" else []
        note = (
            tool_format.choice_note(choice, str(req.get("tool_name", "")), bool(req.get("parallel_tool_calls", True)))
            if offered
            else ""
        )
        prefill = _prefill(messages)
        if self._template is None:
            shaped = tool_format.generic_messages(messages, offered, note)
            text = _chatml(shaped)
            if prefill is not None:  # the final message without its end of turn, no new turn
                text = text[: -len("<|im_end|>\n<|im_start|>assistant\n")]
            return self._with_opening(RenderedPrompt(text, added_special=False), text, prefill is not None)
        tools_arg, choice_arg = None, None
        if self.supports_tools:
            if offered and not self.native_format:  # e.g. Llama 3.1's JSON: steered to <tool_call> blocks
                note = f"{tool_format.ANSWER_FORMAT}\n\n{note}" if note else tool_format.ANSWER_FORMAT
            shaped = [tool_format.openai_message(m, self.object_arguments) for m in messages]
            shaped = tool_format.add_instruction(shaped, note, self.supports_system)
            tools_arg = [tool_format.openai_tool(t) for t in offered] or None
            choice_arg = tool_format.openai_tool_choice(choice, str(req.get("tool_name", ""))) if offered else None
        else:
            shaped = tool_format.generic_messages(messages, offered, note, system_role=self.supports_system)
        _add_reasoning(shaped, messages)
        extra = _template_kwargs(req)
        if prefill is None:
            text = self._render(shaped, tools_arg, choice_arg, extra=extra)
            rendered = RenderedPrompt(text, added_special=True)
            if not self.reasoning.reasons:
                return rendered
            before = self._render(shaped, tools_arg, choice_arg, generation=False, extra=extra)
            return self._with_opening(rendered, text[len(_common_prefix(text, before)) :], False)
        full = self._render(shaped, tools_arg, choice_arg, generation=False, extra=extra)
        at = full.rfind(prefill)
        if at < 0:
            raise InvalidPrompt(
                "the model's chat template does not render the final assistant message's text as it is, "
                "so it cannot be continued (send it without the final assistant message)",
                "messages",
            )
        text = full[: at + len(prefill)]
        rendered = RenderedPrompt(text, added_special=True, continuing=True)
        if not self.reasoning.reasons:
            return rendered
        try:
            before = self._render(shaped[:-1], tools_arg, choice_arg, generation=False, extra=extra)
        except InvalidPrompt:  # a template that wants the conversation to end with a user turn
            before = ""
        return self._with_opening(rendered, text[len(_common_prefix(text, before)) :], True)

    def _with_opening(self, rendered: RenderedPrompt, opening: str, continuing: bool) -> RenderedPrompt:
        if not self.reasoning.reasons:
            return RenderedPrompt(rendered.text, rendered.added_special, continuing=continuing)
        start = ReasoningStart(self.reasoning.reasoning, opening, continuing)
        return RenderedPrompt(rendered.text, rendered.added_special, start, continuing)


def _prefill(messages: list[ChatMessage]) -> str | None:
    """The text a final assistant message is continued from (None: the conversation does not end
    with one): its content, or its reasoning when it has no content yet."""
    last = messages[-1]
    if last.role != "assistant" or last.tool_calls:  # calls: a new turn follows them, as before
        return None
    text = last.content or last.reasoning
    if not text:
        raise InvalidPrompt("a final assistant message to continue needs some text", "messages")
    return text


def _add_reasoning(shaped: list[dict], messages: list[ChatMessage]) -> None:
    """An assistant turn's reasoning as ``reasoning_content`` (shaped and given messages hold the
    assistant turns in the same order, one for one)."""
    if not any(m.reasoning for m in messages):
        return
    given = iter(m for m in messages if m.role == "assistant")
    for i, d in enumerate(shaped):
        if d.get("role") == "assistant":
            m = next(given)
            if m.reasoning:
                shaped[i] = {**d, "reasoning_content": m.reasoning}


def _template_kwargs(req: dict) -> dict:
    """The request's template switches, each only when given (as llama-server's ``chat_template_kwargs``)."""
    extra: dict = {}
    thinking = req.get("thinking")
    if thinking is not None:
        if type(thinking) is not bool:
            raise InvalidPrompt("'thinking' must be a boolean or null", "thinking")
        extra["enable_thinking"] = thinking
    effort = req.get("reasoning_effort") or ""
    if effort:
        if not isinstance(effort, str):
            raise InvalidPrompt("'reasoning_effort' must be text", "reasoning_effort")
        extra["reasoning_effort"] = effort
    return extra


def _common_prefix(a: str, b: str) -> str:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return a[:i]


def _chatml(messages: Iterable[dict]) -> str:
    """The runner's format for a model without a chat template."""
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return text + "<|im_start|>assistant\n"


def render_chat(source: str | None, bos_token: str, eos_token: str, req: dict) -> RenderedPrompt:
    """One-shot form of :class:`ChatTemplate` (the runner compiles its template once instead)."""
    return ChatTemplate(source, bos_token=bos_token, eos_token=eos_token).render(req)


def completion_token_ids(ids: Iterable[Any], n_vocab: int) -> list[int]:
    """A completion prompt given as token ids, used as it is (no BOS added); an id outside
    the vocabulary (``0 <= id < n_vocab``) is an :class:`InvalidPrompt`."""
    out = list(ids)
    for i, t in enumerate(out):
        if type(t) is not int or not 0 <= t < n_vocab:
            raise InvalidPrompt(
                f"prompt token {i} is {t!r:.20}, outside this model's vocabulary (0 to {n_vocab - 1})", "prompt"
            )
    if not out:
        raise InvalidPrompt("the prompt has no tokens", "prompt")
    return out
