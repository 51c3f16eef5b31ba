"""What a model can do beyond plain text generation, as its host found it at load.

A host's runner reads the model's chat template and vocabulary once it is loaded and reports a
:class:`ModelCaps`; the host announces it per model (gossip ``extra``), so the node that receives
a request knows, without asking, whether the model reasons (and how), and whether it can fill in
the middle. Every node serving one model identity reports the same capabilities (they come from
the file); a node that reports none (an older node) is taken as :data:`NO_CAPS`.

Wire: ``{"reasoning": str, "thinks": bool, "switch": bool, "fim": bool, "vision": bool, "audio": bool}``; each key is sent only
when it differs from its default, and unknown keys are ignored (a newer node may add some).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hydra_node.inference.errors import MalformedRemoteEvent

__all__ = ["REASONING_FORMATS", "ModelCaps", "NO_CAPS"]

#: How a model's reasoning is delimited: "" = it does not reason; "think" = ``<think>…</think>``
#: (Qwen3, DeepSeek-R1 distills, GLM; the block may be opened by the generation prompt);
#: "gpt-oss" = the harmony channels (``<|channel|>analysis<|message|>…<|end|>``).
REASONING_FORMATS = ("", "think", "gpt-oss")


@dataclass(frozen=True)
class ModelCaps:
    reasoning: str = ""  # one of REASONING_FORMATS
    thinks: bool = False  # it reasons unless told not to (the template's default)
    switch: bool = False  # the template honours a thinking switch (enable_thinking or equivalent)
    fim: bool = False  # the vocabulary has fill-in-the-middle tokens (prefix, suffix, middle)
    vision: bool = False  # the host loaded a projector that reads images (--mmproj; docs/vision.md)
    audio: bool = False  # the projector reads audio too (reported; the APIs take images only)

    def __post_init__(self) -> None:
        if self.reasoning not in REASONING_FORMATS:
            raise ValueError(f"unknown reasoning format {self.reasoning!r:.40}")

    @property
    def reasons(self) -> bool:
        return bool(self.reasoning)

    def to_wire(self) -> dict[str, Any]:
        d: dict[str, Any] = {}
        if self.reasoning:
            d["reasoning"] = self.reasoning
        if self.thinks:
            d["thinks"] = True
        if self.switch:
            d["switch"] = True
        if self.fim:
            d["fim"] = True
        if self.vision:
            d["vision"] = True
        if self.audio:
            d["audio"] = True
        return d

    @classmethod
    def from_wire(cls, d: Any) -> "ModelCaps":
        """Strict on the keys it knows (a wrong type is a :class:`MalformedRemoteEvent`), blind
        to the others."""
        if not isinstance(d, dict):
            raise MalformedRemoteEvent("model capabilities must be a map")
        reasoning = d.get("reasoning", "")
        if reasoning not in REASONING_FORMATS:
            raise MalformedRemoteEvent(f"unknown reasoning format {reasoning!r:.40}")
        flags = {}
        for key in ("thinks", "switch", "fim", "vision", "audio"):
            v = d.get(key, False)
            if type(v) is not bool:
                raise MalformedRemoteEvent(f"model capability {key!r} must be a boolean")
            flags[key] = v
        return cls(reasoning, **flags)


NO_CAPS = ModelCaps()
