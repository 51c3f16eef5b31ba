"""The runner's ``--reasoning-format`` setting on the chat template (pure): "none" makes a thinking
template not reasoning (no split: its thoughts stay in the answer), "think" / "gpt-oss" force the
format on a template detection misses (docs/reasoning.md "Override")."""

from __future__ import annotations

import pytest

from hydra_node.inference import ChatMessage, GenerationRequest
from hydra_node.runtime.child.chat_prompt import ChatTemplate
from hydra_node.runtime.child.main import reasoning_override
from tests.fixtures.models import THINKING_TEMPLATE

#: ChatML that knows nothing of reasoning (SmolLM2's, reduced).
PLAIN = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def template(source: str | None, setting: str) -> ChatTemplate:
    return ChatTemplate(source, reasoning_format=reasoning_override(setting))


def chat() -> dict:
    return GenerationRequest(model="m", kind="chat", messages=(ChatMessage("user", "hi"),)).to_wire()


def test_none_makes_the_thinking_template_not_reasoning():
    assert template(THINKING_TEMPLATE, "auto").reasoning.reasoning == "think"
    t = template(THINKING_TEMPLATE, "none")
    assert (t.reasoning.reasoning, t.reasoning.thinks, t.reasoning.switch) == ("", False, False)
    res = t.render(chat())
    assert res.reasoning is None  # no splitter: what the model writes, <think> included, is answer text
    assert res.text.endswith("<|im_start|>assistant\n<think>\n")  # the template still renders as it does


@pytest.mark.parametrize("source", [PLAIN, None])
def test_think_forces_the_format_on_a_plain_chatml_template(source):
    assert not template(source, "auto").reasoning.reasons
    t = template(source, "think")
    assert (t.reasoning.reasoning, t.reasoning.thinks, t.reasoning.switch) == ("think", True, False)
    res = t.render(chat())
    # the splitter runs; the prompt opened no block, so it waits to see whether the model opens one
    assert res.reasoning is not None and res.reasoning.fmt == "think" and not res.reasoning.continuing
    assert res.reasoning.opening.endswith("<|im_start|>assistant\n")


def test_gpt_oss_forces_that_format():
    assert template(PLAIN, "gpt-oss").reasoning.reasoning == "gpt-oss"


def test_an_unknown_setting_is_refused():
    with pytest.raises(ValueError, match="auto, none, think, gpt-oss"):
        reasoning_override("deepseek")
    assert reasoning_override("none") == "" and reasoning_override("auto") == "auto"
