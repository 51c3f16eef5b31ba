"""What a generation is asked to do: :class:`GenerationRequest` and its parts.

The same object crosses the runner channel and peer links (``to_wire``/``from_wire``, CBOR
types only), so every field here is honoured wherever the request is served:

* chat history: :class:`ChatMessage` (role, text, an assistant's :class:`ToolCall` list, a
  tool result's ``tool_call_id``/``name``), rendered into a prompt by the HOST's runner with
  the model's own chat template (``hydra_node.runtime.child.chat_prompt``);
* ``tools`` (:class:`ToolSpec`) and ``tool_choice`` are rendered into the prompt there too. The
  model answers a call as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (the
  format documented in docs/api.md); the API node that received the request parses it back
  into ``tool_calls`` (``hydra_node.grammar.toolcalls``), so no host needs to parse anything;
* ``grammar``: a GBNF grammar (root rule ``root``) built by the API node from a JSON schema,
  a ``response_format`` or forced tools (``hydra_node.grammar.constraints``); the host's sampler
  enforces it. With ``grammar_triggers`` the grammar is lazy: free text until one of those
  words is generated, then the rest (from the word on) must match the grammar;
* sampling: temperature, top_p, seed, presence/frequency penalties, logit bias;
* ``logprobs``/``top_logprobs``: the host reports per-token log-probabilities in its deltas.

A completion's prompt is text (``prompt``) or token ids (``prompt_tokens``), never both.
Every text must be encodable as UTF-8 (a lone surrogate is refused here, naming the field,
before it can reach a runner).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from hydra_node.inference.errors import InvalidRequest
from hydra_node.inference.images import IMAGE_MARK, MAX_IMAGES, MAX_REQUEST_IMAGE_BYTES, ImageBlob, ImageInput

__all__ = [
    "Kind",
    "MAX_TOKENS_LIMIT",
    "MAX_STOP_SEQUENCES",
    "MAX_SESSION_CHARS",
    "MAX_TOOLS",
    "MAX_LOGIT_BIAS",
    "MAX_TOP_LOGPROBS_REQUEST",
    "MAX_GRAMMAR_CHARS",
    "MAX_TOP_K",
    "REASONING_EFFORTS",
    "ToolCall",
    "ChatMessage",
    "ToolSpec",
    "GenerationRequest",
]

Kind = Literal["chat", "completion"]

#: Upper bound on generated tokens a single request may ask for.
MAX_TOKENS_LIMIT = 32768
#: Most characters ``resume_skip`` may name: the text of MAX_TOKENS_LIMIT tokens of 256 bytes each.
MAX_RESUME_CHARS = MAX_TOKENS_LIMIT * 256
#: Upper bound on stop sequences (OpenAI allows 4).
MAX_STOP_SEQUENCES = 4
#: Characters of a session id kept for routing affinity (``X-Session-Id`` header or body ``user``).
MAX_SESSION_CHARS = 256
#: Most tools one request may offer (OpenAI allows 128).
MAX_TOOLS = 128
#: Most ``logit_bias`` entries (OpenAI: 300).
MAX_LOGIT_BIAS = 300
#: Most alternatives per token for ``top_logprobs`` (OpenAI: 20).
MAX_TOP_LOGPROBS_REQUEST = 20
#: Longest GBNF grammar accepted.
MAX_GRAMMAR_CHARS = 256 * 1024
#: Most token ids in a completion prompt given as tokens.
MAX_PROMPT_TOKENS = 1 << 20
#: Largest ``top_k`` and ``repeat_penalty`` accepted.
MAX_TOP_K = 1000
MAX_REPEAT_PENALTY = 10.0
#: OpenAI's reasoning effort names ("" = not given); docs/reasoning.md maps each to a budget.
REASONING_EFFORTS = ("", "none", "minimal", "low", "medium", "high", "xhigh", "max")

TOOL_CHOICES = ("auto", "none", "required", "function")
ROLES = ("system", "user", "assistant", "tool")


def _utf8(text: str, param: str) -> str:
    """``text`` if it can be encoded as UTF-8 (no lone surrogates), else a 400 naming ``param``."""
    if not isinstance(text, str):
        raise InvalidRequest(f"'{param}' must be a string", param)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidRequest(f"'{param}' holds text that is not valid Unicode (a lone surrogate?)", param) from None
    return text


def _s(d: dict[str, Any], key: str, default: str = "") -> str:
    v = d.get(key, default)
    if v is None:
        return default
    if not isinstance(v, str):
        raise InvalidRequest(f"'{key}' must be a string", key)
    return v


@dataclass(frozen=True)
class ToolCall:
    """A function call made by the assistant: ``arguments`` is JSON text (as OpenAI sends it)."""

    id: str
    name: str
    arguments: str = "{}"

    def to_wire(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "arguments": self.arguments}

    @classmethod
    def from_wire(cls, d: Any) -> "ToolCall":
        if not isinstance(d, dict):
            raise InvalidRequest("a tool call must be a map")
        return cls(_s(d, "id"), _s(d, "name"), _s(d, "arguments", "{}"))


@dataclass(frozen=True)
class ChatMessage:
    role: str  # one of ROLES ("developer" is mapped to "system" by the API)
    content: str
    tool_calls: tuple[ToolCall, ...] = ()  # an assistant's calls
    tool_call_id: str = ""  # a tool result: the call it answers
    name: str = ""  # a tool result: the function's name (optional)
    #: An assistant turn's reasoning (OpenAI-compatible ``reasoning_content``, Responses reasoning
    #: items, Anthropic ``thinking`` blocks), rendered as the model's chat template wants.
    reasoning: str = ""

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise InvalidRequest(f"message role must be one of {', '.join(ROLES)}, not {self.role!r:.40}", "messages")
        _utf8(self.content, "messages")
        for c in self.tool_calls:
            for text in (c.id, c.name, c.arguments):
                _utf8(text, "messages")
        _utf8(self.tool_call_id, "messages")
        _utf8(self.name, "messages")
        _utf8(self.reasoning, "messages")
        if self.reasoning and self.role != "assistant":
            raise InvalidRequest("only an assistant message carries reasoning", "messages")

    @property
    def plain(self) -> bool:
        return not (self.tool_calls or self.tool_call_id or self.name or self.reasoning)

    def to_wire(self) -> list[Any] | dict[str, Any]:
        """``[role, content]`` for a plain message (the form older peers read), else a map."""
        if self.plain:
            return [self.role, self.content]
        return {
            "role": self.role,
            "content": self.content,
            "tool_calls": [c.to_wire() for c in self.tool_calls],
            "tool_call_id": self.tool_call_id,
            "name": self.name,
            **({"reasoning": self.reasoning} if self.reasoning else {}),
        }

    @classmethod
    def from_wire(cls, v: Any) -> "ChatMessage":
        if isinstance(v, (list, tuple)) and len(v) == 2:
            return cls(str(v[0]), str(v[1]))
        if isinstance(v, cls):
            return v
        if not isinstance(v, dict):
            raise InvalidRequest("a message must be [role, content] or a map", "messages")
        calls = v.get("tool_calls") or []
        if not isinstance(calls, list):
            raise InvalidRequest("a message's 'tool_calls' must be a list", "messages")
        return cls(
            _s(v, "role"),
            _s(v, "content"),
            tuple(ToolCall.from_wire(c) for c in calls),
            _s(v, "tool_call_id"),
            _s(v, "name"),
            _s(v, "reasoning"),
        )


@dataclass(frozen=True)
class ToolSpec:
    """A function the model may call: ``parameters`` is its JSON Schema as JSON text."""

    name: str
    description: str = ""
    parameters: str = '{"type": "object", "properties": {}}'

    def __post_init__(self) -> None:
        if not self.name or len(self.name) > 64:
            raise InvalidRequest("a tool's function name must be 1 to 64 characters", "tools")
        for text in (self.name, self.description, self.parameters):
            _utf8(text, "tools")

    def to_wire(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "parameters": self.parameters}

    @classmethod
    def from_wire(cls, d: Any) -> "ToolSpec":
        if not isinstance(d, dict):
            raise InvalidRequest("a tool must be a map", "tools")
        return cls(_s(d, "name"), _s(d, "description"), _s(d, "parameters", '{"type": "object", "properties": {}}'))


@dataclass(frozen=True)
class GenerationRequest:
    model: str
    kind: Kind
    messages: tuple[ChatMessage, ...] = ()  # for kind == "chat"; (role, content) pairs are accepted
    prompt: str = ""  # for kind == "completion"
    max_tokens: int | None = None
    temperature: float = 0.8
    top_p: float = 0.95
    stop: tuple[str, ...] = ()
    seed: int | None = None
    request_id: str = ""
    session: str = ""  # routing affinity key (X-Session-Id, or the body's user/session_id); may be empty
    prompt_tokens: tuple[int, ...] = ()  # a completion prompt given as token ids (then prompt == "")
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: str = "auto"  # one of TOOL_CHOICES; "function" forces tool_name
    tool_name: str = ""
    parallel_tool_calls: bool = True
    grammar: str = ""  # GBNF, root rule "root"; "" = unconstrained
    grammar_triggers: tuple[str, ...] = ()  # non-empty: the grammar is lazy, it starts at one of these words
    logprobs: bool = False
    top_logprobs: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias -100..100)
    #: A continuation (docs/scheduler.md "Continuing a stream"): the token ids an earlier target
    #: already generated for this request, in order. The runner prefills them after the prompt,
    #: advances the grammar and the penalties over them, and generates what follows;
    #: ``max_tokens`` is then the budget that is left.
    resume_tokens: tuple[int, ...] = ()
    #: Characters of the text of ``resume_tokens`` already delivered to the client: the runner
    #: does not send them again (what it had held back for a stop sequence or an incomplete UTF-8
    #: character, it sends).
    resume_skip: int = 0
    #: Reasoning models (docs/reasoning.md). ``thinking``: the chat template's thinking switch
    #: (``enable_thinking`` and equivalents); None = the template's default. ``thinking_budget``:
    #: most reasoning tokens; when they are spent the host closes the think block and the answer
    #: begins (None = bounded by ``max_tokens`` only). ``reasoning_effort``: OpenAI's effort name,
    #: passed to templates that read it (gpt-oss); "" = not given. Sent only to hosts whose model
    #: reasons (:class:`hydra_node.inference.capabilities.ModelCaps`).
    thinking: bool | None = None
    thinking_budget: int | None = None
    reasoning_effort: str = ""
    #: llama-server sampling extensions: ``top_k`` None = the host's default (40), 0 = no cut;
    #: ``min_p`` 0 = off; ``repeat_penalty`` 1 = off, over the last ``repeat_last_n`` tokens.
    top_k: int | None = None
    min_p: float = 0.0
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    #: Fill-in-the-middle (completions ``suffix``, ``/infill``): the text after the gap; the host
    #: builds the prompt from the model's FIM tokens (``prompt`` is the text before the gap).
    suffix: str = ""
    #: A chat's images (hydra_node/inference/images.py, docs/vision.md), in the order of the
    #: :data:`IMAGE_MARK` characters in the messages' content. :class:`ImageInput` entries exist only
    #: on the API node before it resolves them; the wire and the runner see :class:`ImageBlob` only.
    images: tuple[ImageBlob | ImageInput, ...] = ()

    def __post_init__(self) -> None:
        def set_(k: str, v: object) -> None:  # normalising a frozen dataclass
            object.__setattr__(self, k, v)

        if len(self.session) > MAX_SESSION_CHARS:
            set_("session", self.session[:MAX_SESSION_CHARS])
        if isinstance(self.seed, int) and not -(2**63) <= self.seed < 2**64:
            # keep the wire inside the CBOR data model; runners use the low 32 bits anyway
            set_("seed", self.seed & (2**64 - 1))
        if self.kind not in ("chat", "completion"):
            raise InvalidRequest(f"unknown request kind {self.kind!r}")
        set_("messages", tuple(ChatMessage.from_wire(m) for m in self.messages))
        if self.kind == "chat" and not self.messages:
            raise InvalidRequest("'messages' must be a non-empty array", "messages")
        _utf8(self.prompt, "prompt")
        for s in self.stop:
            _utf8(s, "stop")
        if self.max_tokens is not None and not (1 <= self.max_tokens <= MAX_TOKENS_LIMIT):
            raise InvalidRequest(f"'max_tokens' must be between 1 and {MAX_TOKENS_LIMIT}", "max_tokens")
        if not (0.0 <= self.temperature <= 2.0) or math.isnan(self.temperature):
            raise InvalidRequest("'temperature' must be between 0 and 2", "temperature")
        if not (0.0 < self.top_p <= 1.0):
            raise InvalidRequest("'top_p' must be greater than 0 and at most 1", "top_p")
        if len(self.stop) > MAX_STOP_SEQUENCES:
            raise InvalidRequest(f"'stop' allows at most {MAX_STOP_SEQUENCES} sequences", "stop")
        self._check_prompt_tokens()
        self._check_resume()
        self._check_tools()
        if len(self.grammar) > MAX_GRAMMAR_CHARS:
            raise InvalidRequest(f"the grammar is longer than {MAX_GRAMMAR_CHARS} characters", "response_format")
        _utf8(self.grammar, "response_format")
        if self.grammar_triggers and not self.grammar:
            raise InvalidRequest("grammar triggers need a grammar")
        for t in self.grammar_triggers:
            if not t:
                raise InvalidRequest("an empty grammar trigger")
            _utf8(t, "tools")
        if not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS_REQUEST:
            raise InvalidRequest(f"'top_logprobs' must be between 0 and {MAX_TOP_LOGPROBS_REQUEST}", "top_logprobs")
        if self.top_logprobs and not self.logprobs:
            raise InvalidRequest("'top_logprobs' needs 'logprobs': true", "top_logprobs")
        for key in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, key)
            if not -2.0 <= v <= 2.0:  # NaN fails too
                raise InvalidRequest(f"'{key}' must be between -2 and 2", key)
        if len(self.logit_bias) > MAX_LOGIT_BIAS:
            raise InvalidRequest(f"'logit_bias' allows at most {MAX_LOGIT_BIAS} entries", "logit_bias")
        for tok, bias in self.logit_bias:
            if type(tok) is not int or not 0 <= tok < 2**31 or not -100.0 <= bias <= 100.0:
                raise InvalidRequest("'logit_bias' maps token ids to biases between -100 and 100", "logit_bias")
        self._check_extensions()
        self._check_images()

    def _check_images(self) -> None:
        if not self.images:
            return
        if self.kind != "chat":
            raise InvalidRequest("images need a chat request (completions take text only)", "prompt")
        if len(self.images) > MAX_IMAGES:
            raise InvalidRequest(f"a request may carry at most {MAX_IMAGES} images, not {len(self.images)}", "messages")
        total = sum(len(im.data) for im in self.images)
        if total > MAX_REQUEST_IMAGE_BYTES:
            raise InvalidRequest(
                f"the request's images are {total} bytes in all, more than {MAX_REQUEST_IMAGE_BYTES}", "messages"
            )
        marks = sum(m.content.count(IMAGE_MARK) for m in self.messages)
        if marks != len(self.images):
            raise InvalidRequest(
                f"the messages place {marks} images and the request carries {len(self.images)}", "messages"
            )

    @property
    def images_resolved(self) -> bool:
        """True when every image is an :class:`ImageBlob` (what may go on the wire)."""
        return all(isinstance(im, ImageBlob) for im in self.images)

    def _check_extensions(self) -> None:
        if self.thinking is not None and type(self.thinking) is not bool:
            raise InvalidRequest("'thinking' must be a boolean or null", "thinking")
        if self.thinking_budget is not None and (
            type(self.thinking_budget) is not int or not 0 <= self.thinking_budget <= MAX_TOKENS_LIMIT
        ):
            raise InvalidRequest(f"the thinking budget must be between 0 and {MAX_TOKENS_LIMIT} tokens", "thinking")
        if self.reasoning_effort not in REASONING_EFFORTS:
            raise InvalidRequest(
                f"'reasoning_effort' must be one of {', '.join(e for e in REASONING_EFFORTS if e)}", "reasoning_effort"
            )
        if self.top_k is not None and (type(self.top_k) is not int or not 0 <= self.top_k <= MAX_TOP_K):
            raise InvalidRequest(f"'top_k' must be an integer between 0 and {MAX_TOP_K}", "top_k")
        if not 0.0 <= self.min_p <= 1.0:  # NaN fails too
            raise InvalidRequest("'min_p' must be between 0 and 1", "min_p")
        if not 0.0 < self.repeat_penalty <= MAX_REPEAT_PENALTY:
            raise InvalidRequest(
                f"'repeat_penalty' must be greater than 0 and at most {MAX_REPEAT_PENALTY}", "repeat_penalty"
            )
        if type(self.repeat_last_n) is not int or not 0 <= self.repeat_last_n <= MAX_TOKENS_LIMIT:
            raise InvalidRequest(f"'repeat_last_n' must be between 0 and {MAX_TOKENS_LIMIT}", "repeat_last_n")
        _utf8(self.suffix, "suffix")
        if self.suffix and self.kind != "completion":
            raise InvalidRequest("'suffix' (fill-in-the-middle) needs a completion request", "suffix")

    def _check_prompt_tokens(self) -> None:
        if not self.prompt_tokens:
            return
        if self.kind != "completion" or self.prompt:
            raise InvalidRequest("a prompt is text or token ids, not both", "prompt")
        if len(self.prompt_tokens) > MAX_PROMPT_TOKENS or any(
            type(t) is not int or not 0 <= t < 2**31 for t in self.prompt_tokens
        ):
            raise InvalidRequest("'prompt' token ids must be integers from 0 to 2^31-1", "prompt")

    def _check_resume(self) -> None:
        if len(self.resume_tokens) > MAX_TOKENS_LIMIT or any(
            type(t) is not int or not 0 <= t < 2**31 for t in self.resume_tokens
        ):
            raise InvalidRequest(
                f"'resume_tokens' must be at most {MAX_TOKENS_LIMIT} token ids from 0 to 2^31-1", "resume_tokens"
            )
        if type(self.resume_skip) is not int or not 0 <= self.resume_skip <= MAX_RESUME_CHARS:
            raise InvalidRequest("'resume_skip' must be a character count", "resume_skip")
        if self.resume_skip and not self.resume_tokens:
            raise InvalidRequest("'resume_skip' needs 'resume_tokens'", "resume_skip")

    def _check_tools(self) -> None:
        if len(self.tools) > MAX_TOOLS:
            raise InvalidRequest(f"'tools' allows at most {MAX_TOOLS} functions", "tools")
        if self.tools and self.kind != "chat":
            raise InvalidRequest("'tools' needs a chat request", "tools")
        if self.tool_choice not in TOOL_CHOICES:
            raise InvalidRequest("'tool_choice' must be one of auto, none, required or a function", "tool_choice")
        if self.tool_choice in ("required", "function") and not self.tools:
            raise InvalidRequest("'tool_choice' requires 'tools'", "tool_choice")
        if (self.tool_choice == "function") != bool(self.tool_name):
            raise InvalidRequest("'tool_choice' names a function exactly when it is a function choice", "tool_choice")
        if self.tool_name and self.tool_name not in {t.name for t in self.tools}:
            raise InvalidRequest(f"'tool_choice' names {self.tool_name!r}, which is not in 'tools'", "tool_choice")

    # ---- wire ---------------------------------------------------------------------------
    def to_wire(self) -> dict[str, Any]:
        """A CBOR-friendly map; the fields added after the first protocol version are sent only
        when they differ from their defaults, so plain requests look as they always did."""
        d: dict[str, Any] = {
            "model": self.model,
            "kind": self.kind,
            "messages": [m.to_wire() for m in self.messages],
            "prompt": self.prompt,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "stop": list(self.stop),
            "seed": self.seed,
            "request_id": self.request_id,
            "session": self.session,
        }
        extra = {
            "prompt_tokens": list(self.prompt_tokens),
            "tools": [t.to_wire() for t in self.tools],
            "tool_choice": self.tool_choice,
            "tool_name": self.tool_name,
            "parallel_tool_calls": self.parallel_tool_calls,
            "grammar": self.grammar,
            "grammar_triggers": list(self.grammar_triggers),
            "logprobs": self.logprobs,
            "top_logprobs": self.top_logprobs,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "logit_bias": [[t, b] for t, b in self.logit_bias],
            "resume_tokens": list(self.resume_tokens),
            "resume_skip": self.resume_skip,
            "thinking": self.thinking,
            "thinking_budget": self.thinking_budget,
            "reasoning_effort": self.reasoning_effort,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "repeat_penalty": self.repeat_penalty,
            "repeat_last_n": self.repeat_last_n,
            "suffix": self.suffix,
        }
        defaults = {
            "prompt_tokens": [],
            "tools": [],
            "tool_choice": "auto",
            "tool_name": "",
            "parallel_tool_calls": True,
            "grammar": "",
            "grammar_triggers": [],
            "logprobs": False,
            "top_logprobs": 0,
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "logit_bias": [],
            "resume_tokens": [],
            "resume_skip": 0,
            "thinking": None,
            "thinking_budget": None,
            "reasoning_effort": "",
            "top_k": None,
            "min_p": 0.0,
            "repeat_penalty": 1.0,
            "repeat_last_n": 64,
            "suffix": "",
        }
        d.update({k: v for k, v in extra.items() if v != defaults[k]})
        if self.images:
            if not self.images_resolved:
                raise InvalidRequest("an image was not resolved before the request left the API node", "messages")
            d["images"] = [im.to_wire() for im in self.images]  # type: ignore[union-attr]
        return d

    @classmethod
    def from_wire(cls, d: Any) -> "GenerationRequest":  # untrusted wire data: checked here
        if not isinstance(d, dict):
            raise InvalidRequest("generation request must be a map")
        for key in ("max_tokens", "seed"):
            v = d.get(key)
            if v is not None and (type(v) is not int or not -(2**63) <= v < 2**64):
                raise InvalidRequest(f"'{key}' must be an integer or null", key)
        for key in (
            "prompt_tokens",
            "tools",
            "grammar_triggers",
            "logit_bias",
            "messages",
            "stop",
            "resume_tokens",
            "images",
        ):
            if not isinstance(d.get(key) or [], list):
                raise InvalidRequest(f"'{key}' must be a list", key)
        for key in ("logprobs", "parallel_tool_calls"):
            if key in d and type(d[key]) is not bool:
                raise InvalidRequest(f"'{key}' must be a boolean", key)
        for key in ("top_logprobs", "resume_skip", "repeat_last_n"):
            if key in d and type(d[key]) is not int:
                raise InvalidRequest(f"'{key}' must be an integer", key)
        for key in ("thinking_budget", "top_k"):
            if d.get(key) is not None and type(d[key]) is not int:
                raise InvalidRequest(f"'{key}' must be an integer or null", key)
        if d.get("thinking") is not None and type(d["thinking"]) is not bool:
            raise InvalidRequest("'thinking' must be a boolean or null", "thinking")
        try:
            return cls(
                model=str(d["model"]),
                kind=d["kind"],
                messages=tuple(ChatMessage.from_wire(m) for m in d.get("messages") or ()),
                prompt=str(d.get("prompt") or ""),
                max_tokens=d.get("max_tokens"),
                temperature=float(d.get("temperature", 0.8)),
                top_p=float(d.get("top_p", 0.95)),
                stop=tuple(str(s) for s in d.get("stop") or ()),
                seed=d.get("seed"),
                request_id=str(d.get("request_id") or ""),
                session=str(d.get("session") or ""),
                prompt_tokens=tuple(d.get("prompt_tokens") or ()),
                tools=tuple(ToolSpec.from_wire(t) for t in d.get("tools") or ()),
                tool_choice=_s(d, "tool_choice", "auto"),
                tool_name=_s(d, "tool_name"),
                parallel_tool_calls=d.get("parallel_tool_calls", True),
                grammar=_s(d, "grammar"),
                grammar_triggers=tuple(str(t) for t in d.get("grammar_triggers") or ()),
                logprobs=d.get("logprobs", False),
                top_logprobs=d.get("top_logprobs", 0),
                presence_penalty=float(d.get("presence_penalty", 0.0)),
                frequency_penalty=float(d.get("frequency_penalty", 0.0)),
                logit_bias=tuple((t, float(b)) for t, b in d.get("logit_bias") or ()),
                resume_tokens=tuple(d.get("resume_tokens") or ()),
                resume_skip=d.get("resume_skip", 0),
                thinking=d.get("thinking"),
                thinking_budget=d.get("thinking_budget"),
                reasoning_effort=_s(d, "reasoning_effort"),
                top_k=d.get("top_k"),
                min_p=float(d.get("min_p", 0.0)),
                repeat_penalty=float(d.get("repeat_penalty", 1.0)),
                repeat_last_n=d.get("repeat_last_n", 64),
                suffix=_s(d, "suffix"),
                images=tuple(ImageBlob.from_wire(im) for im in d.get("images") or ()),
            )
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, InvalidRequest):
                raise
            raise InvalidRequest(f"malformed generation request: {exc}") from None
