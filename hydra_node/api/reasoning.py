"""What a request's reasoning controls mean for one model (pure): shared by every API dialect.

OpenAI's ``reasoning_effort`` (chat) and ``reasoning.effort`` (Responses), and Anthropic's
``thinking`` (Messages), become the three :class:`GenerationRequest` fields the host honours:
``thinking`` (the chat template's switch), ``thinking_budget`` (most reasoning tokens, after
which the host closes the think block) and ``reasoning_effort`` (the name, for templates that
read it, such as gpt-oss's). A model that does not reason refuses them all with a 400 naming the
model and the parameter, as OpenAI refuses reasoning parameters for its non-reasoning models.

Effort → budget (docs/reasoning.md): ``none`` turns thinking off; ``minimal`` 256 tokens;
``low`` 1024; ``medium`` 4096; ``high``, ``xhigh`` and ``max`` only ``max_tokens`` bounds it.
"""

from __future__ import annotations

from typing import Any

from hydra_node.api.errors import bad
from hydra_node.inference import REASONING_EFFORTS, ModelCaps

__all__ = ["EFFORT_BUDGETS", "effort_fields", "thinking_fields", "refuse_unless_reasons"]

#: Reasoning tokens allowed per effort (None: only ``max_tokens`` bounds them; 0: thinking off).
EFFORT_BUDGETS: dict[str, int | None] = {
    "none": 0,
    "minimal": 256,
    "low": 1024,
    "medium": 4096,
    "high": None,
    "xhigh": None,
    "max": None,
}


def refuse_unless_reasons(caps: ModelCaps, model: str, param: str) -> None:
    """A 400 naming ``model`` and ``param`` when the model does not reason."""
    if not caps.reasons:
        raise bad(
            f"'{param}' is only supported by reasoning models, and {model!r} is not one "
            "(its chat template opens no reasoning block: docs/reasoning.md)",
            param,
            "unsupported_parameter",
        )


def effort_fields(caps: ModelCaps, model: str, effort: Any, *, param: str = "reasoning_effort") -> dict[str, Any]:
    """The request fields for an OpenAI effort (None = not given: ``{}``)."""
    if effort is None:
        return {}
    if not isinstance(effort, str) or effort not in EFFORT_BUDGETS:
        raise bad(f"'{param}' must be one of {', '.join(e for e in REASONING_EFFORTS if e)}", param)
    refuse_unless_reasons(caps, model, param)
    budget = EFFORT_BUDGETS[effort]
    if budget == 0:
        return _off(caps, model, param) | {"reasoning_effort": effort}
    return {"thinking": True, "thinking_budget": budget, "reasoning_effort": effort}


def thinking_fields(
    caps: ModelCaps, model: str, *, enabled: bool, budget_tokens: int | None, param: str = "thinking"
) -> dict[str, Any]:
    """The request fields for an explicit switch and budget (Anthropic's ``thinking``)."""
    refuse_unless_reasons(caps, model, param)
    if not enabled:
        return _off(caps, model, param)
    return {"thinking": True, "thinking_budget": budget_tokens}


def _off(caps: ModelCaps, model: str, param: str) -> dict[str, Any]:
    """Thinking off: through the template's switch, or — for a template without one — a zero
    budget (the host closes the block at once, so the answer starts straight away)."""
    if caps.switch:
        return {"thinking": False}
    return {"thinking_budget": 0}
