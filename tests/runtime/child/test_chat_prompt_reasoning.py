"""Reasoning templates and prefill in chat_prompt.py (pure): the thinking switch and effort as
template variables, history reasoning as ``reasoning_content``, where the output starts, and a
final assistant message continued."""

from __future__ import annotations

import pytest

from hydra_node.inference import ChatMessage, GenerationRequest, ToolCall
from hydra_node.runtime.child.chat_prompt import ChatTemplate, InvalidPrompt, ReasoningStart
from tests.fixtures.models import THINKING_TEMPLATE

#: What a template that reads reasoning_effort (gpt-oss's) does with it, reduced.
EFFORT_TEMPLATE = (
    "{%- for m in messages %}<|start|>{{ m.role }}{% if m.role == 'assistant' %}<|channel|>final{% endif %}"
    "<|message|>{{ m.content }}<|end|>{%- endfor %}"
    "{%- if reasoning_effort is defined %}[effort={{ reasoning_effort }}]{%- endif %}"
    "{%- if add_generation_prompt %}<|start|>assistant{%- endif %}"
)
#: ChatML that knows nothing of reasoning (SmolLM2's, reduced).
PLAIN = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def chat(*messages, **kw) -> dict:
    msgs = tuple(m if isinstance(m, ChatMessage) else ChatMessage(*m) for m in messages)
    return GenerationRequest(model="m", kind="chat", messages=msgs, **kw).to_wire()


THINKING = ChatTemplate(THINKING_TEMPLATE)


def test_the_fixture_template_is_detected_as_a_thinking_template_with_a_switch():
    caps = THINKING.reasoning
    assert (caps.reasoning, caps.thinks, caps.switch) == ("think", True, True)
    assert not ChatTemplate(PLAIN).reasoning.reasons and not ChatTemplate(None).reasoning.reasons
    assert ChatTemplate(EFFORT_TEMPLATE).reasoning.reasoning == "gpt-oss"


def test_the_switch_is_the_template_variable_enable_thinking():
    on, off, default = (THINKING.render(chat(("user", "hi"), thinking=t)) for t in (True, False, None))
    assert on.text.endswith("<|im_start|>assistant\n<think>\n") and on.text == default.text
    assert off.text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert on.reasoning == ReasoningStart("think", "<|im_start|>assistant\n<think>\n")
    assert off.reasoning == ReasoningStart("think", "<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_reasoning_effort_reaches_templates_that_read_it():
    text = ChatTemplate(EFFORT_TEMPLATE).render(chat(("user", "hi"), reasoning_effort="low")).text
    assert text.endswith("[effort=low]<|start|>assistant")
    assert "[effort" not in ChatTemplate(EFFORT_TEMPLATE).render(chat(("user", "hi"))).text


def test_history_reasoning_is_given_as_reasoning_content():
    turn = ChatMessage("assistant", "Paris.", reasoning="The user asks about France.")
    text = THINKING.render(chat(("user", "Capital of France?"), turn, ("user", "And Spain?"))).text
    assert "<|im_start|>assistant\n<think>\nThe user asks about France.\n</think>\n\nParis.<|im_end|>" in text
    # a template that does not read it renders the turn as before
    plain = ChatTemplate(PLAIN).render(chat(("user", "q"), turn, ("user", "r"))).text
    assert plain == ChatTemplate(PLAIN).render(chat(("user", "q"), ("assistant", "Paris."), ("user", "r"))).text


def test_plain_chats_stay_byte_identical():
    req = chat(("user", "hi"), ("assistant", "hello"), ("user", "how are you?"))
    res = ChatTemplate(PLAIN).render(req)
    assert res.text == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>\n"
        "<|im_start|>user\nhow are you?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert res.reasoning is None and not res.continuing


def test_a_final_assistant_message_is_continued():
    for source in (PLAIN, None):
        res = ChatTemplate(source).render(chat(("user", "Capital of France?"), ("assistant", "The capital is")))
        assert res.text.endswith(
            "<|im_start|>user\nCapital of France?<|im_end|>\n<|im_start|>assistant\nThe capital is"
        )
        assert res.continuing and res.reasoning is None
    res = THINKING.render(chat(("user", "q"), ("assistant", "The capital is")))
    assert res.text.endswith("<|im_start|>assistant\nThe capital is")
    assert res.reasoning == ReasoningStart("think", "<|im_start|>assistant\nThe capital is", True)
    # only its thoughts so far: they go on
    res = THINKING.render(chat(("user", "q"), ChatMessage("assistant", "", reasoning="First, recall")))
    assert res.text.endswith("<|im_start|>assistant\n<think>\nFirst, recall")
    assert res.reasoning == ReasoningStart("think", "<|im_start|>assistant\n<think>\nFirst, recall", True)


def test_prefill_that_cannot_be_continued_is_refused_and_a_final_call_is_not_continued():
    with pytest.raises(InvalidPrompt, match="needs some text"):
        ChatTemplate(PLAIN).render(chat(("user", "q"), ("assistant", "")))
    upper = PLAIN.replace("m['content']", "m['content'] | upper")
    with pytest.raises(InvalidPrompt, match="cannot be continued"):
        ChatTemplate(upper).render(chat(("user", "q"), ("assistant", "the answer")))
    calls = ChatMessage("assistant", "", (ToolCall("c", "f", "{}"),))
    res = ChatTemplate(PLAIN).render(chat(("user", "q"), calls))
    assert not res.continuing and res.text.endswith("<|im_start|>assistant\n")
